//! The tasks of one agent instance (`goondan_tools::tasks`), durable
//! beside its conversation.
//!
//! ```text
//! <instance>/tasks.jsonl     one record per line; a change is visible only once its line is synced
//!   {"op":"open","task":{…}}                              a working task (TaskView)
//!   {"op":"end","handle","state","result"?,"reason"?,"at"} it ended: completed, failed or cancelled
//!   {"op":"received","handle","at"}                       the model has its end
//! ```
//!
//! The file is a `goondan_journal` journal: opening the book folds it by
//! the journal's rule (a torn last line is skipped and cut, a corrupt line
//! in the middle skipped, with a warning, and dropped by a rewrite).
//! A task still `working` then belonged to work that ended with an earlier
//! process (the agent process that ran a background command, say): it is
//! ended `failed` with that reason at once, so no task is left working
//! forever; that end is delivered like any other. Ended tasks past their
//! expiry are forgotten when the file is rewritten (at open, once dead
//! lines outnumber live ones).
//!
//! Changes are serialized (one at a time, in the order asked), written on
//! the blocking pool, and applied in memory only after their line is on
//! disk: a write that fails changes nothing (`E_TASK_STORAGE`).
//!
//! Ownership: the book has one lock over its state (`State`: the tasks,
//! the cancel senders of working ones, early ends) and one write turn (the
//! async mutex that owns the journal). No lock is held across an `.await`
//! except the write turn, and the state lock is never taken while waiting
//! for the turn's write; the hooks are fixed at construction.

use goondan_core::sync::LockUnpoisoned;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use goondan_core::ToolResult;
use goondan_core::codes::{E_TASK_STORAGE, E_TASK_WAIT_TIMEOUT};
use goondan_core::message::now_millis;
use goondan_journal::{Journal, JournalError, Replayed};
use goondan_tools::pipeline::BoxFuture;
use goondan_tools::tasks::{TaskEnd, TaskState, TaskTicket, TaskView, ToolTasks, already_finished, unknown_handle};
use goondan_tools::{ToolContext, ToolFailure};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// The book's file in an instance directory.
pub const TASKS_FILE: &str = "tasks.jsonl";
/// The directory of the instance where tasks' work keeps its files.
pub const OUTPUT_DIR: &str = "tasks";
/// How long an ended task is kept (and a working one may run) by default.
pub const DEFAULT_EXPIRY: Duration = Duration::from_secs(7 * 24 * 3600);
/// The longest `wait`.
pub const MAX_WAIT: Duration = Duration::from_secs(600);

/// One line of the book.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
enum Record {
    Open {
        task: TaskView,
    },
    End {
        handle: String,
        state: TaskState,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        result: Option<ToolResult>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        at: u64,
    },
    Received {
        handle: String,
        at: u64,
    },
}

impl Record {
    /// The `end` record of `handle` ending as `end` at `at`.
    fn ended(handle: &str, end: TaskEnd, at: u64) -> Self {
        let state = end.state();
        let (result, reason) = match end {
            TaskEnd::Completed(result) => (Some(result), None),
            TaskEnd::Failed(reason) | TaskEnd::Cancelled(reason) => (None, Some(reason)),
        };
        Record::End { handle: handle.to_owned(), state, result, reason, at }
    }
}

/// Called with each task that ends (after its end is durable).
pub type OnEnd = Box<dyn Fn(&TaskView) + Send + Sync>;

/// What the book calls as tasks end and are received; given at
/// construction ([`TaskBook::with_hooks`]).
#[derive(Default)]
pub struct TaskHooks {
    /// Called with each task that ends from now on.
    pub on_end: Option<OnEnd>,
    /// Called with each task whose end the model receives through `status`
    /// or `wait` (its completion message, if queued, is then not to be
    /// delivered).
    pub on_received: Option<OnEnd>,
}

/// The tasks of one instance.
pub struct TaskBook {
    path: PathBuf,
    /// The write turn: one change at a time, in the order asked. The
    /// journal is written only by the holder of the turn; its own lock is
    /// there only to lend it to the blocking pool's write, so it is never
    /// contended.
    file: tokio::sync::Mutex<Arc<Mutex<Journal>>>,
    /// Everything in memory, under one lock.
    state: Mutex<State>,
    /// Bumped on every change (waiters watch it).
    changed: watch::Sender<u64>,
    hooks: TaskHooks,
    expiry: Duration,
}

/// The book's memory: what the file folds to, and what only this process has.
#[derive(Default)]
struct State {
    tasks: Tasks,
    /// The work of each working task listens here for a cancel.
    cancels: HashMap<String, watch::Sender<bool>>,
    /// Ends delivered (received) before their task was recorded: an
    /// asynchronous agent reply can beat the pending result's recording.
    early: HashMap<String, TaskEnd>,
}

#[derive(Default)]
struct Tasks {
    by_handle: BTreeMap<String, TaskView>,
    /// Handles in the order they were opened.
    order: Vec<String>,
    /// Handles in the order they ended.
    ended: Vec<String>,
}

impl Tasks {
    fn apply(&mut self, record: Record) {
        match record {
            Record::Open { task } => {
                if !self.by_handle.contains_key(&task.handle) {
                    self.order.push(task.handle.clone());
                }
                self.by_handle.insert(task.handle.clone(), task);
            }
            Record::End { handle, state, result, reason, at } => {
                if let Some(task) = self.by_handle.get_mut(&handle)
                    && !task.state.is_final()
                {
                    task.state = state;
                    task.result = result;
                    task.reason = reason;
                    task.updated_at = at;
                    self.ended.push(handle);
                }
            }
            Record::Received { handle, at } => {
                if let Some(task) = self.by_handle.get_mut(&handle) {
                    task.received = true;
                    task.updated_at = task.updated_at.max(at);
                }
            }
        }
    }

    fn list(&self) -> Vec<TaskView> {
        self.order.iter().filter_map(|handle| self.by_handle.get(handle)).cloned().collect()
    }
}

impl std::fmt::Debug for TaskBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskBook").field("path", &self.path).finish_non_exhaustive()
    }
}

fn storage(path: &Path, error: &dyn std::fmt::Display) -> ToolFailure {
    ToolFailure::with_code(
        format!("the task record could not be written to {}: {error}", path.display()),
        E_TASK_STORAGE,
    )
    .suggest("Free disk space or fix the state root's permissions (gdn doctor checks it); nothing was changed.")
}

/// Folds the book at `path` into `tasks` (nothing is written): the
/// journal's rule skips a torn last line and corrupt lines in the middle,
/// each with a warning. Returns what the replay read.
fn fold(path: &Path, tasks: &mut Tasks) -> io::Result<Replayed> {
    let replayed = goondan_journal::replay::<Record>(path, |record| tasks.apply(record)).map_err(io_error)?;
    for corrupt in &replayed.corrupt {
        tracing::warn!("{}: skipping a line that is not a task record ({corrupt})", path.display());
    }
    if let Some(torn) = &replayed.torn {
        tracing::warn!("{}: skipping the torn last line ({torn}), left by an interrupted write", path.display());
    }
    Ok(replayed)
}

/// A journal failure as the `io::Error` the book's openers return (its
/// message names the operation and the file).
fn io_error(error: JournalError) -> io::Error {
    let kind = error.io_source().map_or(io::ErrorKind::InvalidData, io::Error::kind);
    io::Error::new(kind, error.to_string())
}

/// The tasks recorded in the instance directory `dir`, as its book folds
/// them, without opening it (nothing is written: a process may own it).
/// A task shown `working` may belong to work that has ended with an
/// earlier process; its book fails it when the instance next starts.
pub fn read_tasks(dir: &Path) -> io::Result<Vec<TaskView>> {
    let mut tasks = Tasks::default();
    fold(&dir.join(TASKS_FILE), &mut tasks)?;
    Ok(tasks.list())
}

/// Whether the instance directory `dir` has tasks whose end the model has
/// not had yet (or that were working): starting the instance delivers them.
pub fn has_undelivered(dir: &Path) -> bool {
    read_tasks(dir).is_ok_and(|tasks| tasks.iter().any(|task| !task.received))
}

fn line_of(record: &Record) -> io::Result<Vec<u8>> {
    let mut line = serde_json::to_vec(record).map_err(io::Error::other)?;
    line.push(b'\n');
    Ok(line)
}

impl TaskBook {
    /// Opens the book of the instance directory `dir`: folds it, forgets
    /// ended tasks past their expiry, and fails the tasks left working by
    /// an earlier process (see the module docs). Blocking: call it where
    /// the instance is opened.
    pub fn open(dir: &Path) -> io::Result<Self> {
        Self::open_with(dir, DEFAULT_EXPIRY)
    }

    /// As [`open`](Self::open), with the expiry of new tasks.
    pub fn open_with(dir: &Path, expiry: Duration) -> io::Result<Self> {
        let path = dir.join(TASKS_FILE);
        let mut tasks = Tasks::default();
        let replayed = fold(&path, &mut tasks)?;
        let line_count = replayed.records;
        let now = now_millis();
        // What an earlier process left working has no work any more (the
        // work of a remote task goes on elsewhere, and its end comes here).
        let orphaned: Vec<String> =
            tasks.by_handle.values().filter(|t| !t.state.is_final() && !t.remote).map(|t| t.handle.clone()).collect();
        for handle in &orphaned {
            tasks.apply(Record::End {
                handle: handle.clone(),
                state: TaskState::Failed,
                result: None,
                reason: Some(
                    "its work ended with the process that ran it (the agent process stopped, or gdn was restarted)"
                        .to_owned(),
                ),
                at: now,
            });
        }
        let expired: Vec<String> = tasks
            .by_handle
            .values()
            .filter(|t| t.state.is_final() && t.expires_at.is_some_and(|at| at <= now))
            .map(|t| t.handle.clone())
            .collect();
        for handle in &expired {
            tasks.by_handle.remove(handle);
        }
        let Tasks { by_handle, order, ended } = &mut tasks;
        order.retain(|handle| by_handle.contains_key(handle));
        ended.retain(|handle| by_handle.contains_key(handle));
        // A corrupt line is dropped by the rewrite, so it is warned about once.
        let rewrite = !expired.is_empty()
            || !orphaned.is_empty()
            || !replayed.corrupt.is_empty()
            || line_count > 2 * tasks.by_handle.len() + 64;
        let mut journal = Journal::open::<Record>(&path).map_err(io_error)?;
        if rewrite {
            // The folded state, as fresh lines: temp file, synced, renamed over.
            let temp = dir.join(format!(".{TASKS_FILE}.{}.tmp", std::process::id()));
            journal
                .rewrite(&temp, None, |out| {
                    // Opens in the order opened, then ends in the order ended
                    // (the order completions are delivered in), then receipts.
                    for task in tasks.list() {
                        let mut opened = task.clone();
                        opened.state = TaskState::Working;
                        opened.result = None;
                        opened.reason = None;
                        opened.received = false;
                        out.write_all(&line_of(&Record::Open { task: opened })?)?;
                    }
                    for task in tasks.ended.iter().filter_map(|handle| tasks.by_handle.get(handle)) {
                        out.write_all(&line_of(&Record::End {
                            handle: task.handle.clone(),
                            state: task.state,
                            result: task.result.clone(),
                            reason: task.reason.clone(),
                            at: task.updated_at,
                        })?)?;
                    }
                    for task in tasks.list().into_iter().filter(|task| task.received) {
                        out.write_all(&line_of(&Record::Received {
                            handle: task.handle.clone(),
                            at: task.updated_at,
                        })?)?;
                    }
                    Ok(())
                })
                .map_err(io_error)?;
        } else {
            // A torn last line is cut, so new lines never glue onto it.
            journal.cut_torn_tail(&replayed).map_err(io_error)?;
        }
        let (changed, _) = watch::channel(0);
        Ok(Self {
            path,
            file: tokio::sync::Mutex::new(Arc::new(Mutex::new(journal))),
            state: Mutex::new(State { tasks, ..State::default() }),
            changed,
            hooks: TaskHooks::default(),
            expiry,
        })
    }

    /// The book with `hooks` called as its tasks end and are received.
    #[must_use]
    pub fn with_hooks(self, hooks: TaskHooks) -> Self {
        Self { hooks, ..self }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock_unpoisoned()
    }

    /// Whether a task is still working (its work runs in this process).
    pub fn has_working(&self) -> bool {
        self.state().tasks.by_handle.values().any(|t| !t.state.is_final())
    }

    /// Every task, oldest first.
    pub fn tasks(&self) -> Vec<TaskView> {
        self.state().tasks.list()
    }

    /// Ended tasks whose end the model does not have yet, in the order they ended.
    pub fn undelivered(&self) -> Vec<TaskView> {
        let state = self.state();
        let tasks = &state.tasks;
        tasks.ended.iter().filter_map(|handle| tasks.by_handle.get(handle)).filter(|t| !t.received).cloned().collect()
    }

    fn get(&self, handle: &str) -> Option<TaskView> {
        self.state().tasks.by_handle.get(handle).cloned()
    }

    /// Writes `record` durably to `file` (the caller holds the write turn),
    /// then applies it.
    async fn commit(&self, journal: &Arc<Mutex<Journal>>, record: Record) -> Result<(), ToolFailure> {
        let line = line_of(&record).map_err(|e| storage(&self.path, &e))?;
        let journal = Arc::clone(journal);
        // The journal cuts off a write that fails, so the next record
        // never follows half of this one.
        let written = tokio::task::spawn_blocking(move || {
            journal.lock_unpoisoned().append(&line, &[goondan_core::fault::Point::TaskUpdate])
        })
        .await;
        match written {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                let cause: &dyn std::fmt::Display = match error.io_source() {
                    Some(source) => source,
                    None => &error,
                };
                return Err(storage(&self.path, cause));
            }
            Err(error) => return Err(storage(&self.path, &error)),
        }
        self.state().tasks.apply(record);
        self.changed.send_modify(|version| *version += 1);
        Ok(())
    }

    /// Opens a working task for `tool`'s call `call_id` in `turn_id`.
    pub async fn open_task(&self, tool: &str, call_id: &str, turn_id: &str) -> Result<TaskTicket, ToolFailure> {
        let handle = format!("task-{}", goondan_core::ids::new_id());
        self.open_as(&handle, tool, call_id, turn_id).await
    }

    /// Records the task of a pending result whose handler named `handle`
    /// itself; nothing if it is known. An end delivered before (see
    /// [`finish_received`](Self::finish_received)) is applied at once.
    pub async fn adopt_task(&self, tool: &str, call_id: &str, turn_id: &str, handle: &str) -> Result<(), ToolFailure> {
        if self.get(handle).is_some() {
            return Ok(());
        }
        if handle.is_empty() || handle.len() > 200 || handle.chars().any(char::is_control) {
            return Err(ToolFailure::with_code(
                "a pending result's handle must be 1 to 200 printable characters",
                goondan_core::codes::E_TOOL_INVALID_ARGS,
            ));
        }
        self.open_as(handle, tool, call_id, turn_id).await?;
        let early = self.state().early.remove(handle);
        if let Some(end) = early {
            self.finish_received(handle, end).await?;
        }
        Ok(())
    }

    /// Opens the task of work that runs outside this process (an
    /// asynchronous agent request, `handle` its correlation id) before the
    /// work is sent, so that its end always finds it; a restart of this
    /// process leaves it working.
    /// `traceparent` names the calling tool's span.
    pub async fn open_remote(
        &self,
        handle: &str,
        tool: &str,
        call_id: &str,
        turn_id: &str,
        traceparent: Option<&str>,
    ) -> Result<(), ToolFailure> {
        let opening = Opening { remote: true, resume: None, traceparent: traceparent.map(str::to_owned) };
        self.record_open(handle, tool, call_id, turn_id, opening).await.map(|_| ())
    }

    async fn open_as(&self, handle: &str, tool: &str, call_id: &str, turn_id: &str) -> Result<TaskTicket, ToolFailure> {
        self.record_open(handle, tool, call_id, turn_id, Opening::default()).await
    }

    async fn record_open(
        &self,
        handle: &str,
        tool: &str,
        call_id: &str,
        turn_id: &str,
        opening: Opening,
    ) -> Result<TaskTicket, ToolFailure> {
        let Opening { remote, resume, traceparent } = opening;
        let file = self.file.lock().await;
        let now = now_millis();
        let handle = handle.to_owned();
        let task = TaskView {
            handle: handle.clone(),
            tool: tool.to_owned(),
            call_id: call_id.to_owned(),
            turn_id: turn_id.to_owned(),
            state: TaskState::Working,
            result: None,
            reason: None,
            created_at: now,
            updated_at: now,
            expires_at: Some(now.saturating_add(u64::try_from(self.expiry.as_millis()).unwrap_or(u64::MAX))),
            received: false,
            remote,
            resume,
            traceparent,
        };
        self.commit(&file, Record::Open { task }).await?;
        let (cancel, cancelled) = watch::channel(false);
        self.state().cancels.insert(handle.clone(), cancel);
        Ok(TaskTicket { handle, cancelled })
    }

    /// Ends a working task.
    pub async fn finish_task(&self, handle: &str, end: TaskEnd) -> Result<TaskView, ToolFailure> {
        let ended = {
            let file = self.file.lock().await;
            let task = self.get(handle).ok_or_else(|| unknown_handle(handle))?;
            if task.state.is_final() {
                return Err(already_finished(&task));
            }
            self.commit(&file, Record::ended(handle, end, now_millis())).await?;
            let mut state = self.state();
            state.cancels.remove(handle);
            state.tasks.by_handle.get(handle).cloned().ok_or_else(|| unknown_handle(handle))?
        };
        if let Some(on_end) = &self.hooks.on_end {
            on_end(&ended);
        }
        Ok(ended)
    }

    /// Ends a task whose end the conversation gets another way (an
    /// asynchronous agent reply is its own message): recorded ended and
    /// received, with no completion message. A handle not recorded yet is
    /// kept until [`adopt_task`](Self::adopt_task) records it.
    pub async fn finish_received(&self, handle: &str, end: TaskEnd) -> Result<(), ToolFailure> {
        let file = self.file.lock().await;
        let Some(task) = self.get(handle) else {
            self.state().early.insert(handle.to_owned(), end);
            return Ok(());
        };
        if task.state.is_final() {
            return Err(already_finished(&task));
        }
        let at = now_millis();
        self.commit(&file, Record::ended(handle, end, at)).await?;
        self.commit(&file, Record::Received { handle: handle.to_owned(), at }).await?;
        self.state().cancels.remove(handle);
        Ok(())
    }

    /// Records that the model has the end of `handle` (no completion
    /// message follows); nothing for a task not ended or already received.
    pub async fn mark_received(&self, handle: &str) -> Result<(), ToolFailure> {
        let file = self.file.lock().await;
        match self.get(handle) {
            Some(task) if task.state.is_final() && !task.received => {
                self.commit(&file, Record::Received { handle: handle.to_owned(), at: now_millis() }).await
            }
            Some(_) => Ok(()),
            None => Err(unknown_handle(handle)),
        }
    }

    /// The task; an ended one is then received by the model.
    pub async fn status_of(&self, handle: &str) -> Result<TaskView, ToolFailure> {
        let task = self.get(handle).ok_or_else(|| unknown_handle(handle))?;
        if task.state.is_final() && !task.received {
            self.mark_received(handle).await?;
            let received = self.get(handle).ok_or_else(|| unknown_handle(handle))?;
            if let Some(on_received) = &self.hooks.on_received {
                on_received(&received);
            }
            return Ok(received);
        }
        Ok(task)
    }

    /// Waits up to `timeout` (at most [`MAX_WAIT`]) for the task to end.
    pub async fn wait_for(&self, handle: &str, timeout: Duration) -> Result<TaskView, ToolFailure> {
        self.wait_ended(handle, timeout).await?;
        self.status_of(handle).await
    }

    /// Waits up to `timeout` for the task to end; its view, not received.
    async fn wait_ended(&self, handle: &str, timeout: Duration) -> Result<TaskView, ToolFailure> {
        let mut changes = self.changed.subscribe();
        let deadline = tokio::time::Instant::now() + timeout.min(MAX_WAIT);
        loop {
            let task = self.get(handle).ok_or_else(|| unknown_handle(handle))?;
            if task.state.is_final() {
                return Ok(task);
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => {
                    return Err(ToolFailure::with_code(
                        format!(
                            "task '{handle}' is still {} after {} ms",
                            task.state,
                            timeout.min(MAX_WAIT).as_millis()
                        ),
                        E_TASK_WAIT_TIMEOUT,
                    )
                    .suggest("Wait again, or go on: its result enters the conversation when it ends."));
                }
            }
        }
    }

    /// Asks the task's work to stop, for the model (`tasks__cancel`): the
    /// end it returns is the model's (received). Work that listens ends it
    /// `cancelled` itself; a task whose work does not listen (nothing holds
    /// its cancel) is ended `cancelled` here.
    pub async fn cancel_task(&self, handle: &str) -> Result<TaskView, ToolFailure> {
        self.cancel_for_operator(handle).await?;
        self.status_of(handle).await
    }

    /// As [`cancel_task`](Self::cancel_task), for a person (`gdn task
    /// cancel`, Ctrl-C of a waiting run): the model has not seen the end,
    /// so it is delivered as any other.
    pub async fn cancel_for_operator(&self, handle: &str) -> Result<TaskView, ToolFailure> {
        let task = self.get(handle).ok_or_else(|| unknown_handle(handle))?;
        if task.state.is_final() {
            return Err(already_finished(&task));
        }
        let listened = self.state().cancels.get(handle).is_some_and(|cancel| cancel.send(true).is_ok());
        if listened {
            // The work ends it; give it a moment to say how.
            if let Ok(ended) = self.wait_ended(handle, Duration::from_secs(5)).await {
                return Ok(ended);
            }
        }
        match self.finish_task(handle, TaskEnd::Cancelled("cancelled".to_owned())).await {
            Ok(ended) => Ok(ended),
            // It ended meanwhile, on its own.
            Err(_) => self.get(handle).ok_or_else(|| unknown_handle(handle)),
        }
    }
}

/// How a task is opened: remote work, what resumes it, the call's trace context.
#[derive(Default)]
struct Opening {
    remote: bool,
    resume: Option<serde_json::Value>,
    traceparent: Option<String>,
}

impl ToolTasks for TaskBook {
    fn open<'a>(&'a self, ctx: &'a ToolContext) -> BoxFuture<'a, Result<TaskTicket, ToolFailure>> {
        Box::pin(async move {
            let handle = format!("task-{}", goondan_core::ids::new_id());
            let opening = Opening { traceparent: Some(ctx.traceparent()), ..Opening::default() };
            self.record_open(&handle, ctx.tool_name(), ctx.tool_call_id(), ctx.turn_id(), opening).await
        })
    }

    fn finish<'a>(&'a self, handle: &'a str, end: TaskEnd) -> BoxFuture<'a, Result<TaskView, ToolFailure>> {
        Box::pin(self.finish_task(handle, end))
    }

    fn status<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<TaskView, ToolFailure>> {
        Box::pin(self.status_of(handle))
    }

    fn wait<'a>(&'a self, handle: &'a str, timeout: Duration) -> BoxFuture<'a, Result<TaskView, ToolFailure>> {
        Box::pin(self.wait_for(handle, timeout))
    }

    fn cancel<'a>(&'a self, handle: &'a str) -> BoxFuture<'a, Result<TaskView, ToolFailure>> {
        Box::pin(self.cancel_task(handle))
    }

    fn list(&self) -> Vec<TaskView> {
        self.tasks()
    }

    fn adopt<'a>(
        &'a self,
        tool: &'a str,
        call_id: &'a str,
        turn_id: &'a str,
        handle: &'a str,
    ) -> BoxFuture<'a, Result<(), ToolFailure>> {
        Box::pin(self.adopt_task(tool, call_id, turn_id, handle))
    }

    fn open_resumable<'a>(
        &'a self,
        ctx: &'a ToolContext,
        resume: serde_json::Value,
    ) -> BoxFuture<'a, Result<TaskTicket, ToolFailure>> {
        Box::pin(async move {
            let handle = format!("task-{}", goondan_core::ids::new_id());
            let opening = Opening { remote: true, resume: Some(resume), traceparent: Some(ctx.traceparent()) };
            self.record_open(&handle, ctx.tool_name(), ctx.tool_call_id(), ctx.turn_id(), opening).await
        })
    }

    fn reattach(&self, handle: &str) -> Option<TaskTicket> {
        let task = self.get(handle).filter(|task| !task.state.is_final())?;
        let (cancel, cancelled) = watch::channel(false);
        self.state().cancels.insert(task.handle.clone(), cancel);
        Some(TaskTicket { handle: task.handle, cancelled })
    }

    fn output_path(&self, handle: &str) -> Option<PathBuf> {
        // Handles are made here (`task-<uuid>`); anything else names no file.
        let safe = handle.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        let dir = self.path.parent()?.join(OUTPUT_DIR);
        (safe && !handle.is_empty()).then(|| dir.join(format!("{handle}.log")))
    }
}

#[cfg(test)]
mod tests {
    use goondan_core::codes::{E_TASK_FINISHED, E_TASK_NOT_FOUND};
    use serde_json::json;
    use std::io::Write as _;

    use super::*;

    fn code(failure: &ToolFailure) -> Option<&str> {
        failure.code.as_deref()
    }

    #[tokio::test]
    async fn a_task_opens_ends_once_and_its_end_is_received_once() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let ended = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&ended);
        let on_end: OnEnd = Box::new(move |task| seen.lock_unpoisoned().push(task.handle.clone()));
        let book = TaskBook::open(dir.path())?.with_hooks(TaskHooks { on_end: Some(on_end), on_received: None });
        let ticket = book.open_task("bash__exec", "call-1", "turn-1").await.map_err(|f| f.message)?;
        assert_eq!(book.tasks()[0].state, TaskState::Working);
        let result = ToolResult::ok(json!({"exitCode": 0}));
        let done = book.finish_task(&ticket.handle, TaskEnd::Completed(result.clone())).await.map_err(|f| f.message)?;
        assert_eq!((done.state, done.result.as_ref()), (TaskState::Completed, Some(&result)));
        // A second end, and a cancel of an ended task: refused, nothing changed.
        let again = book.finish_task(&ticket.handle, TaskEnd::Failed("late".into())).await;
        assert_eq!(again.as_ref().err().and_then(code), Some(E_TASK_FINISHED));
        let cancel = book.cancel_task(&ticket.handle).await;
        assert_eq!(cancel.as_ref().err().and_then(code), Some(E_TASK_FINISHED));
        assert_eq!(*ended.lock_unpoisoned(), std::slice::from_ref(&ticket.handle));
        assert_eq!(book.undelivered().len(), 1);
        // The model reads it: received, and no longer undelivered.
        assert!(book.status_of(&ticket.handle).await.map_err(|f| f.message)?.received);
        assert!(book.undelivered().is_empty());
        let unknown = book.status_of("task-nope").await;
        assert_eq!(unknown.as_ref().err().and_then(code), Some(E_TASK_NOT_FOUND));
        Ok(())
    }

    #[tokio::test]
    async fn the_book_survives_a_restart_and_fails_what_was_left_working() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let (done, working, unread) = {
            let book = TaskBook::open(dir.path())?;
            let done = book.open_task("t", "c1", "u").await.map_err(|f| f.message)?.handle;
            let working = book.open_task("t", "c2", "u").await.map_err(|f| f.message)?.handle;
            let unread = book.open_task("t", "c3", "u").await.map_err(|f| f.message)?.handle;
            book.finish_task(&done, TaskEnd::Completed(ToolResult::ok(json!(1)))).await.map_err(|f| f.message)?;
            book.status_of(&done).await.map_err(|f| f.message)?;
            book.finish_task(&unread, TaskEnd::Failed("broke".into())).await.map_err(|f| f.message)?;
            (done, working, unread)
        };
        // A torn last line, as a crash mid-write leaves it.
        let path = dir.path().join(TASKS_FILE);
        std::fs::OpenOptions::new().append(true).open(&path)?.write_all(b"{\"op\":\"end\",\"hand")?;
        let book = TaskBook::open(dir.path())?;
        let tasks: BTreeMap<String, TaskView> = book.tasks().into_iter().map(|t| (t.handle.clone(), t)).collect();
        assert_eq!((tasks[&done].state, tasks[&done].received), (TaskState::Completed, true));
        assert_eq!(tasks[&working].state, TaskState::Failed, "left working by the earlier process");
        assert!(tasks[&working].reason.as_deref().is_some_and(|r| r.contains("ended with the process")));
        assert_eq!(tasks[&unread].reason.as_deref(), Some("broke"));
        let undelivered: Vec<String> = book.undelivered().into_iter().map(|t| t.handle).collect();
        assert_eq!(undelivered, [unread.clone(), working.clone()], "in the order they ended");
        // The rewritten book reads the same, and takes new lines.
        drop(book);
        let book = TaskBook::open(dir.path())?;
        assert_eq!(book.tasks().len(), 3);
        book.status_of(&working).await.map_err(|f| f.message)?;
        drop(book);
        let book = TaskBook::open(dir.path())?;
        assert_eq!(book.undelivered().len(), 1);
        Ok(())
    }

    #[tokio::test]
    async fn a_corrupt_line_in_the_middle_is_skipped_and_the_lines_after_it_kept()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let handle = {
            let book = TaskBook::open(dir.path())?;
            let handle = book.open_task("t", "c1", "u").await.map_err(|f| f.message)?.handle;
            book.finish_task(&handle, TaskEnd::Completed(ToolResult::ok(json!(1)))).await.map_err(|f| f.message)?;
            handle
        };
        // A line that is no record, then a good one after it.
        let path = dir.path().join(TASKS_FILE);
        let mut file = std::fs::OpenOptions::new().append(true).open(&path)?;
        file.write_all(b"{\"op\":\"nonsense\"}\n")?;
        file.write_all(&line_of(&Record::Received { handle: handle.clone(), at: 1 })?)?;
        drop(file);
        assert!(read_tasks(dir.path())?[0].received, "read past the corrupt line");
        let book = TaskBook::open(dir.path())?;
        let task = &book.tasks()[0];
        assert_eq!((task.state, task.received), (TaskState::Completed, true));
        // Opening rewrote the book without it.
        let text = std::fs::read_to_string(&path)?;
        assert!(!text.contains("nonsense"), "{text}");
        Ok(())
    }

    #[tokio::test]
    async fn a_pending_result_of_its_own_handle_is_adopted_and_an_early_end_waits_for_it()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let book = TaskBook::open(dir.path())?;
        book.adopt_task("agents__request", "call-1", "turn", "corr-1").await.map_err(|f| f.message)?;
        book.adopt_task("agents__request", "call-1", "turn", "corr-1").await.map_err(|f| f.message)?;
        assert_eq!(book.tasks().len(), 1, "adopting a known handle changes nothing");
        book.finish_received("corr-1", TaskEnd::Completed(ToolResult::ok(json!("pong"))))
            .await
            .map_err(|f| f.message)?;
        let task = &book.tasks()[0];
        assert_eq!((task.state, task.received), (TaskState::Completed, true));
        assert!(book.undelivered().is_empty(), "its end went to the conversation another way");
        // The reply beats the recording: kept, then applied.
        book.finish_received("corr-2", TaskEnd::Failed("timeout".into())).await.map_err(|f| f.message)?;
        assert_eq!(book.tasks().len(), 1);
        book.adopt_task("agents__request", "call-2", "turn", "corr-2").await.map_err(|f| f.message)?;
        let late = book.status_of("corr-2").await.map_err(|f| f.message)?;
        assert_eq!((late.state, late.received), (TaskState::Failed, true));
        // A remote task (another agent's work) survives a restart of the process.
        book.open_remote("corr-3", "agents__request", "call-3", "turn", None).await.map_err(|f| f.message)?;
        drop(book);
        let book = TaskBook::open(dir.path())?;
        let remote = book.status_of("corr-3").await.map_err(|f| f.message)?;
        assert_eq!((remote.state, remote.remote), (TaskState::Working, true));
        let bad = book.adopt_task("t", "c", "u", "").await;
        assert_eq!(bad.as_ref().err().and_then(code), Some(goondan_core::codes::E_TOOL_INVALID_ARGS));
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_ends_with_the_task_or_at_its_timeout_and_a_cancel_reaches_the_work()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let book = Arc::new(TaskBook::open(dir.path())?);
        let ticket = book.open_task("t", "c", "u").await.map_err(|f| f.message)?;
        let timed_out = book.wait_for(&ticket.handle, Duration::from_millis(200)).await;
        assert_eq!(timed_out.as_ref().err().and_then(code), Some(E_TASK_WAIT_TIMEOUT));
        assert_eq!(book.tasks()[0].state, TaskState::Working, "a wait that times out changes nothing");
        // Work that listens for the cancel and ends the task itself.
        let worker = {
            let book = Arc::clone(&book);
            let mut cancelled = ticket.cancelled.clone();
            let handle = ticket.handle.clone();
            tokio::spawn(async move {
                let _ = cancelled.wait_for(|c| *c).await;
                book.finish_task(&handle, TaskEnd::Cancelled("killed by SIGTERM".into())).await
            })
        };
        let cancelled = book.cancel_task(&ticket.handle).await.map_err(|f| f.message)?;
        assert_eq!((cancelled.state, cancelled.reason.as_deref()), (TaskState::Cancelled, Some("killed by SIGTERM")));
        assert!(worker.await?.is_ok());
        // Work that does not listen: ended here.
        let deaf = book.open_task("t", "c2", "u").await.map_err(|f| f.message)?;
        drop(book.state().cancels.remove(&deaf.handle));
        let cancelled = book.cancel_task(&deaf.handle).await.map_err(|f| f.message)?;
        assert_eq!(cancelled.state, TaskState::Cancelled);
        Ok(())
    }
}
