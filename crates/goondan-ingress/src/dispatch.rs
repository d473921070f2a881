//! Turns for stored events: one at a time per agent instance, in the order
//! they were stored; different instances concurrently, up to a bound.
//!
//! ```text
//! inbox (recovered, then each durable store) ─► queue of agent@instance
//!   an instance with work and no turn running takes a slot (at most max_concurrent)
//!   start record ─► TurnRunner::run ─► Answered / Failed: done record, next of that instance
//!                                   └► Retry (the agent process died, …): again after a pause;
//!                                      after max_attempts starts: done (gave up), logged
//!                                   └► Unsaved (the turn could not be saved: storage failed): retry
//!                                      record, again after a pause (doubling, at most 30 s) until
//!                                      writes work, not counted as a start; never done meanwhile
//!                                   └► Waiting (nothing can run it now: no agent host carries its
//!                                      labels): as Unsaved, until something can
//!                                   └► Interrupted (the service stops): no record, it runs next start
//! drain: no new turns; running ones get the grace period, then are cancelled
//! ```

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinSet;
use tokio_util::task::TaskTracker;

use crate::inbox::{Inbox, Outcome, Stored};

/// How a turn for a stored event ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnEnd {
    /// The turn ran and answered.
    Answered,
    /// The turn ran and failed (the agent's own error); not retried.
    Failed(String),
    /// The turn could not run or was cut off (its process died): try again.
    Retry(String),
    /// The turn ran (or was answered from the conversation) but what it
    /// did could not be saved (the disk is full, …): it is not done. The
    /// event stays stored and its turn runs again, with backoff, until
    /// writes work; this does not count as one of its starts.
    Unsaved(String),
    /// The turn could not start because nothing can run it now (across
    /// hosts: no agent host carries the labels its agent asks for): as
    /// [`TurnEnd::Unsaved`], the event stays stored and its turn is tried
    /// again with backoff until something can, not counting as a start.
    Waiting(String),
    /// The service is stopping: leave it for the next start.
    Interrupted,
    /// The turn cannot run until the operator fixes something (the agent
    /// cannot be built): the event stays stored, and the instance takes no
    /// more turns in this run; they all run at the next start.
    Hold(String),
}

/// Runs the turn of a stored event.
#[async_trait]
pub trait TurnRunner: Send + Sync + 'static {
    /// Runs `turn`; `cancel` turns true when the service stops waiting.
    async fn run(&self, turn: &Stored, cancel: watch::Receiver<bool>) -> TurnEnd;
}

/// How turns are dispatched.
#[derive(Debug, Clone, Copy)]
pub struct DispatchOptions {
    /// The most instances with a turn running at once.
    pub max_concurrent: usize,
    /// Turns of one event started before it is given up.
    pub max_attempts: u32,
    /// The pause before the first retry (doubling, at most a minute).
    pub retry_pause: Duration,
}

impl Default for DispatchOptions {
    fn default() -> Self {
        Self { max_concurrent: 64, max_attempts: 3, retry_pause: Duration::from_millis(500) }
    }
}

/// The longest pause between turns of an event that could not be saved.
const MAX_UNSAVED_PAUSE: Duration = Duration::from_secs(30);

/// Waits `pause` unless the service stops meanwhile; true if it stops.
async fn pause_or_cancel(pause: Duration, cancel: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        () = tokio::time::sleep(pause) => false,
        _ = cancel.wait_for(|c| *c) => true,
    }
}

enum Command {
    Drain { grace: Duration, done: oneshot::Sender<usize> },
    WhenIdle { reply: oneshot::Sender<()> },
    ReleaseHeld,
}

/// The dispatcher of a running service.
#[derive(Clone)]
pub struct Dispatcher {
    commands: mpsc::UnboundedSender<Command>,
    waiting: watch::Receiver<usize>,
    /// Holds the dispatching task (closed at once: it is the only one);
    /// its wait ends when the task has ended (after a drain, once every
    /// handle is dropped, or a panic) and dropped its turns.
    task: TaskTracker,
}

impl std::fmt::Debug for Dispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dispatcher").field("waiting", &*self.waiting.borrow()).finish()
    }
}

impl Dispatcher {
    /// Starts dispatching `recovered` events, then each one `stored` sends.
    pub fn start(
        inbox: Inbox,
        runner: Arc<dyn TurnRunner>,
        recovered: Vec<Stored>,
        stored: mpsc::UnboundedReceiver<Stored>,
        options: DispatchOptions,
    ) -> Self {
        // Unbounded: the commands are the service's own (a drain, an idle
        // wait, a release), a few at a time, never input from outside.
        let (commands, command_rx) = mpsc::unbounded_channel();
        let (waiting_tx, waiting) = watch::channel(0);
        let (cancel, _) = watch::channel(false);
        let mut state = State {
            inbox,
            runner,
            options,
            queues: HashMap::new(),
            busy: HashSet::new(),
            ready: VecDeque::new(),
            running: JoinSet::new(),
            cancel,
            waiting: waiting_tx,
            draining: false,
            held: HashSet::new(),
            idle_waiters: Vec::new(),
        };
        for event in recovered {
            state.push(event);
        }
        let task = TaskTracker::new();
        task.spawn(state.run(stored, command_rx));
        task.close();
        Self { commands, waiting, task }
    }

    /// Returns when the dispatching task has ended (a panic's unwinding
    /// included): no more turns run. Before a drain only a panic ends it,
    /// so a service takes this as fatal.
    pub async fn ended(&self) {
        self.task.wait().await;
    }

    /// Events queued or in a turn.
    pub fn waiting(&self) -> usize {
        *self.waiting.borrow()
    }

    /// Waits until nothing is queued or running (held events aside),
    /// counting every event the inbox stored before the call.
    pub async fn idle(&self) {
        let (reply, idle) = oneshot::channel();
        if self.commands.send(Command::WhenIdle { reply }).is_ok() {
            let _ = idle.await;
        }
    }

    /// Runs the held instances' turns again (the bundle that made them
    /// fail to start was fixed): each from the event that was held.
    pub fn release_held(&self) {
        let _ = self.commands.send(Command::ReleaseHeld);
    }

    /// Starts no more turns; lets running ones finish within `grace`, then
    /// cancels them. Returns how many queued events were never started (they
    /// stay stored for the next start, as do cut-off and held ones), once
    /// the dispatching task has ended.
    pub async fn drain(&self, grace: Duration) -> usize {
        let (done, left) = oneshot::channel();
        let left = if self.commands.send(Command::Drain { grace, done }).is_ok() { left.await.unwrap_or(0) } else { 0 };
        self.ended().await;
        left
    }
}

/// How long turns may take to end after their cancellation, at a drain's
/// end, before they are dropped (their events stay stored): a stop is bounded.
pub const AFTER_CANCEL: Duration = Duration::from_secs(10);

struct State {
    inbox: Inbox,
    runner: Arc<dyn TurnRunner>,
    options: DispatchOptions,
    queues: HashMap<String, VecDeque<Stored>>,
    busy: HashSet<String>,
    ready: VecDeque<String>,
    running: JoinSet<(String, Option<Stored>)>,
    cancel: watch::Sender<bool>,
    waiting: watch::Sender<usize>,
    draining: bool,
    /// Instances whose turns are held until the next start.
    held: HashSet<String>,
    /// Who waits for nothing to be queued or running.
    idle_waiters: Vec<oneshot::Sender<()>>,
}

fn instance_of(event: &Stored) -> String {
    format!("{}@{}", event.entry.agent, event.entry.instance)
}

impl State {
    fn push(&mut self, event: Stored) {
        let instance = instance_of(&event);
        let queue = self.queues.entry(instance.clone()).or_default();
        queue.push_back(event);
        if queue.len() == 1 && !self.busy.contains(&instance) && !self.held.contains(&instance) {
            self.ready.push_back(instance);
        }
    }

    /// Events queued or running, held ones aside.
    fn count(&self) -> usize {
        let queued: usize =
            self.queues.iter().filter(|(instance, _)| !self.held.contains(*instance)).map(|(_, q)| q.len()).sum();
        queued + self.running.len()
    }

    fn start_turns(&mut self) {
        while !self.draining && self.running.len() < self.options.max_concurrent.max(1) {
            let Some(instance) = self.ready.pop_front() else { break };
            let Some(event) = self.queues.get_mut(&instance).and_then(VecDeque::pop_front) else { continue };
            self.busy.insert(instance.clone());
            let inbox = self.inbox.clone();
            let runner = Arc::clone(&self.runner);
            let cancel = self.cancel.subscribe();
            let options = self.options;
            self.running.spawn(async move {
                let held = run_event(inbox, runner, event, cancel, options).await;
                (instance, held)
            });
        }
        let count = self.count();
        self.waiting.send_replace(count);
        if count == 0 {
            for waiter in self.idle_waiters.drain(..) {
                let _ = waiter.send(());
            }
        }
    }

    fn finished(&mut self, instance: String, held: Option<Stored>) {
        self.busy.remove(&instance);
        if let Some(event) = held {
            let queue = self.queues.entry(instance.clone()).or_default();
            let queued = queue.len();
            // First again when the instance is released.
            queue.push_front(event);
            tracing::error!(
                instance = %instance, queued,
                "ingress: the instance's turns are held (with {queued} more event(s)) until the bundle is fixed \
                 (a watched edit, a restart) or the next start"
            );
            self.held.insert(instance);
            return;
        }
        match self.queues.get(&instance) {
            Some(queue) if !queue.is_empty() => self.ready.push_back(instance),
            Some(_) => {
                self.queues.remove(&instance);
            }
            None => {}
        }
    }

    async fn run(
        mut self,
        mut stored: mpsc::UnboundedReceiver<Stored>,
        mut commands: mpsc::UnboundedReceiver<Command>,
    ) {
        let mut drain: Option<(tokio::time::Instant, oneshot::Sender<usize>)> = None;
        // Set when running turns were cancelled: past it they are dropped.
        let mut abandon: Option<tokio::time::Instant> = None;
        let mut stored_open = true;
        self.start_turns();
        loop {
            let deadline = drain.as_ref().map(|(at, _)| *at);
            tokio::select! {
                event = stored.recv(), if stored_open => match event {
                    Some(event) => self.push(event),
                    None => stored_open = false,
                },
                Some(finished) = self.running.join_next(), if !self.running.is_empty() => {
                    if let Ok((instance, held)) = finished {
                        self.finished(instance, held);
                    }
                }
                command = commands.recv(), if drain.is_none() => match command {
                    Some(Command::Drain { grace, done }) => {
                        self.draining = true;
                        drain = Some((tokio::time::Instant::now() + grace, done));
                    }
                    Some(Command::ReleaseHeld) => {
                        for instance in std::mem::take(&mut self.held) {
                            if !self.busy.contains(&instance)
                                && self.queues.get(&instance).is_some_and(|queue| !queue.is_empty())
                            {
                                self.ready.push_back(instance);
                            }
                        }
                    }
                    Some(Command::WhenIdle { reply }) => {
                        // What the inbox stored before the call is in the
                        // channel already: take it in first.
                        while let Ok(event) = stored.try_recv() {
                            self.push(event);
                        }
                        self.idle_waiters.push(reply);
                    }
                    None => return,
                },
                () = async {
                    match deadline {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                }, if !self.cancel.borrow().to_owned() => {
                    tracing::warn!(running = self.running.len(), "ingress: the grace period is over; running turns are cancelled and run again at the next start");
                    self.cancel.send_replace(true);
                    abandon = Some(tokio::time::Instant::now() + AFTER_CANCEL);
                }
                () = async {
                    match abandon {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                }, if abandon.is_some() && !self.running.is_empty() => {
                    tracing::error!(running = self.running.len(), "ingress: turns did not end {AFTER_CANCEL:?} after their cancellation; they are dropped (their events stay stored)");
                    self.running.abort_all();
                    while self.running.join_next().await.is_some() {}
                    self.busy.clear();
                }
            }
            self.start_turns();
            if self.draining && self.running.is_empty() {
                // A held instance's first event did start (and is kept).
                let held = self.held.iter().filter(|i| self.queues.get(*i).is_some_and(|q| !q.is_empty())).count();
                let left = self.queues.values().map(VecDeque::len).sum::<usize>() - held;
                if let Some((_, done)) = drain.take() {
                    let _ = done.send(left);
                }
                return;
            }
        }
    }
}

/// Runs an event's turn to its end; the event back when it is held.
async fn run_event(
    inbox: Inbox,
    runner: Arc<dyn TurnRunner>,
    mut event: Stored,
    mut cancel: watch::Receiver<bool>,
    options: DispatchOptions,
) -> Option<Stored> {
    let mut pause = options.retry_pause;
    let mut unsaved_pause = options.retry_pause;
    let mut unsaved: u32 = 0;
    loop {
        if event.attempts >= options.max_attempts {
            tracing::error!(
                key = %event.key, connection = %event.entry.connection, attempts = event.attempts,
                "ingress: the event's turn was cut off {} times; given up", event.attempts
            );
            record(&inbox, &event, Outcome::GaveUp, &mut cancel, options).await;
            return None;
        }
        inbox.started(event.seq);
        event.attempts += 1;
        let end = runner.run(&event, cancel.clone()).await;
        let what = if matches!(end, TurnEnd::Waiting(_)) { "could not start" } else { "could not be saved" };
        match end {
            TurnEnd::Answered => {
                record(&inbox, &event, Outcome::Answered, &mut cancel, options).await;
                return None;
            }
            TurnEnd::Failed(message) => {
                tracing::warn!(key = %event.key, connection = %event.entry.connection, %message, "ingress: the event's turn failed");
                record(&inbox, &event, Outcome::Failed, &mut cancel, options).await;
                return None;
            }
            TurnEnd::Unsaved(message) | TurnEnd::Waiting(message) => {
                unsaved += 1;
                // Not a start that counts: storage, or where it runs, not
                // the turn, failed.
                event.attempts = event.attempts.saturating_sub(1);
                tracing::error!(
                    key = %event.key, connection = %event.entry.connection, instance = %instance_of(&event),
                    failures = unsaved, %message,
                    "ingress: the event's turn {what}; it stays stored and runs again in {:?}",
                    unsaved_pause
                );
                inbox.retrying(event.seq, unsaved, &message);
                if *cancel.borrow() || pause_or_cancel(unsaved_pause, &mut cancel).await {
                    return None;
                }
                unsaved_pause = (unsaved_pause * 2).min(MAX_UNSAVED_PAUSE);
            }
            TurnEnd::Interrupted => return None,
            TurnEnd::Hold(message) => {
                tracing::error!(
                    key = %event.key, connection = %event.entry.connection, %message,
                    "ingress: the event's turn cannot run until the bundle is fixed; it stays stored for the next start"
                );
                inbox.held(event.seq);
                // The next attempt is a new start: the cut-off count is not spent on it.
                event.attempts = event.attempts.saturating_sub(1);
                return Some(event);
            }
            TurnEnd::Retry(message) => {
                if *cancel.borrow() {
                    return None;
                }
                tracing::warn!(key = %event.key, connection = %event.entry.connection, %message, "ingress: the event's turn did not finish; it runs again");
                if pause_or_cancel(pause, &mut cancel).await {
                    return None;
                }
                pause = (pause * 2).min(Duration::from_secs(60));
            }
        }
    }
}

/// Records how the event's turn ended, trying again with backoff while the
/// inbox cannot be written; until then the event stays pending (a next
/// start delivers it again, and its conversation answers it without a turn).
async fn record(
    inbox: &Inbox,
    event: &Stored,
    outcome: Outcome,
    cancel: &mut watch::Receiver<bool>,
    options: DispatchOptions,
) {
    let mut pause = options.retry_pause;
    loop {
        match inbox.done(event.seq, outcome).await {
            Ok(()) => return,
            Err(crate::sink::SinkError::Closed) => {
                tracing::error!(key = %event.key, "ingress: the inbox is closed; the end of the turn is recorded at the next start");
                return;
            }
            Err(error) => tracing::error!(
                key = %event.key, %error,
                "ingress: the end of a turn could not be recorded; tried again in {pause:?} (the event stays pending meanwhile)"
            ),
        }
        if *cancel.borrow() || pause_or_cancel(pause, cancel).await {
            return;
        }
        pause = (pause * 2).min(MAX_UNSAVED_PAUSE);
    }
}
