//! The inbox and the dispatcher through their public surface, on real
//! files: deliveries stored once by key, recovered after a reopen, a torn
//! tail cut off, the log compacted; turns one at a time per instance, in
//! order, retried, given up, and left pending by a drain.

use goondan_core::sync::LockUnpoisoned;
use std::collections::{BTreeMap, HashMap};
use std::error::Error;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use goondan_ingress::dispatch::{DispatchOptions, Dispatcher, TurnEnd, TurnRunner};
use goondan_ingress::inbox::{Entry, INBOX_FILE, Inbox, InboxOptions, StoreResult, Stored};
use goondan_ingress::routing::{Route, Router};
use goondan_ingress::service::ConnectionSink;
use goondan_ingress::{Accepted, ConnectorEvent, Delivery, EventMessage, EventSink};
use serde_json::json;
use tokio::sync::{mpsc, watch};

type TestResult = Result<(), Box<dyn Error>>;
type Opened = (Inbox, Vec<Stored>, mpsc::UnboundedReceiver<Stored>);

fn event(text: &str, instance: &str) -> ConnectorEvent {
    ConnectorEvent {
        name: "message".into(),
        message: EventMessage::text(text),
        properties: BTreeMap::from([("chat_id".to_owned(), instance.to_owned())]),
        instance_key: instance.into(),
    }
}

fn entry(text: &str, instance: &str) -> Entry {
    Entry::new("conn", "cli", Route { agent: "a".into(), instance_key: instance.into() }, event(text, instance))
}

fn open(dir: &std::path::Path, options: InboxOptions) -> Result<Opened, Box<dyn Error>> {
    let (tx, rx) = mpsc::unbounded_channel();
    let (inbox, recovered) = Inbox::open(&dir.join(INBOX_FILE), options, tx)?;
    Ok((inbox, recovered, rx))
}

fn texts(stored: &[Stored]) -> Vec<String> {
    stored.iter().map(|s| s.entry.event.message.input_text()).collect()
}

#[tokio::test]
async fn keys_are_stored_once_and_pending_events_survive_a_reopen() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (inbox, recovered, mut stored_rx) = open(dir.path(), InboxOptions::default())?;
    assert!(recovered.is_empty());
    let results = inbox
        .store(
            "conn",
            vec![
                (Some("1".into()), entry("one", "x")),
                (Some("1".into()), entry("one again", "x")),
                (None, entry("two", "x")),
            ],
        )
        .await?;
    assert!(matches!(results[0], StoreResult::Stored(_)));
    assert_eq!(results[1], StoreResult::Duplicate);
    let StoreResult::Stored(second) = &results[2] else { panic!("unkeyed not stored") };
    assert!(second.key.starts_with("conn/~"), "{}", second.key);
    // Durable events are handed on, in order.
    let handed: Vec<_> = [stored_rx.recv().await, stored_rx.recv().await].into_iter().flatten().collect();
    assert_eq!(texts(&handed), ["one", "two"]);
    // Another connection's key 1 is another key.
    assert!(matches!(
        inbox.store("other", vec![(Some("1".into()), entry("o", "y"))]).await?[0],
        StoreResult::Stored(_)
    ));
    inbox.done(handed[0].seq, goondan_ingress::inbox::Outcome::Answered).await?;
    inbox.started(handed[1].seq);
    inbox.sync().await?;
    drop(inbox);

    let (inbox, recovered, _rx) = open(dir.path(), InboxOptions::default())?;
    assert_eq!(texts(&recovered), ["two", "o"]);
    assert_eq!(recovered[0].attempts, 1, "the started turn counts");
    // The key of the finished event is still remembered.
    assert_eq!(inbox.store("conn", vec![(Some("1".into()), entry("late", "x"))]).await?, [StoreResult::Duplicate]);
    assert_eq!(inbox.status().pending.get("a@x"), Some(&1));
    assert_eq!(Inbox::read_pending(&dir.path().join(INBOX_FILE))?.len(), 2);
    Ok(())
}

#[tokio::test]
async fn a_torn_last_record_is_cut_off_and_writing_goes_on() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join(INBOX_FILE);
    {
        let (inbox, _, _rx) = open(dir.path(), InboxOptions::default())?;
        inbox.store("conn", vec![(Some("k".into()), entry("kept", "x"))]).await?;
    }
    let good = std::fs::metadata(&path)?.len();
    let mut file = std::fs::OpenOptions::new().append(true).open(&path)?;
    std::io::Write::write_all(&mut file, br#"{"op":"accept","seq":2,"key":"conn/t"#)?;
    drop(file);
    let (inbox, recovered, _rx) = open(dir.path(), InboxOptions::default())?;
    assert_eq!(texts(&recovered), ["kept"]);
    assert_eq!(std::fs::metadata(&path)?.len(), good);
    inbox.store("conn", vec![(Some("t".into()), entry("after", "x"))]).await?;
    drop(inbox);
    let (_inbox, recovered, _rx) = open(dir.path(), InboxOptions::default())?;
    assert_eq!(texts(&recovered), ["kept", "after"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_redeliveries_store_each_key_once() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (inbox, _, _rx) = open(dir.path(), InboxOptions::default())?;
    let mut tasks = tokio::task::JoinSet::new();
    for copy in 0..4 {
        for key in 0..50 {
            let inbox = inbox.clone();
            tasks.spawn(async move {
                inbox.store("conn", vec![(Some(format!("{key}")), entry(&format!("{key}/{copy}"), "x"))]).await
            });
        }
    }
    let mut stored = 0;
    while let Some(result) = tasks.join_next().await {
        if matches!(result??[0], StoreResult::Stored(_)) {
            stored += 1;
        }
    }
    assert_eq!(stored, 50);
    assert_eq!(inbox.status().keys, 50);
    Ok(())
}

#[tokio::test]
async fn the_log_is_compacted_and_keeps_its_keys() -> TestResult {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join(INBOX_FILE);
    let options = InboxOptions { compact_min_records: 200, ..InboxOptions::default() };
    let (inbox, _, _rx) = open(dir.path(), options)?;
    for n in 0..300 {
        let results = inbox.store("conn", vec![(Some(format!("{n}")), entry("x", "i"))]).await?;
        let StoreResult::Stored(stored) = &results[0] else { panic!("not stored") };
        if n != 7 {
            inbox.done(stored.seq, goondan_ingress::inbox::Outcome::Answered).await?;
        }
    }
    drop(inbox);
    let lines = std::fs::read_to_string(&path)?.lines().count();
    assert!(lines < 450, "{lines} lines: the log was not compacted");
    let (inbox, recovered, _rx) = open(dir.path(), options)?;
    assert_eq!(recovered.len(), 1);
    assert_eq!(recovered[0].key, "conn/7");
    assert_eq!(inbox.store("conn", vec![(Some("150".into()), entry("x", "i"))]).await?, [StoreResult::Duplicate]);
    // Seqs go on where they were, even after a rewrite with nothing pending.
    inbox.done(recovered[0].seq, goondan_ingress::inbox::Outcome::Answered).await?;
    drop(inbox);
    // Every key out of its window: the rewrite at open keeps no record of them.
    let forgetting = InboxOptions { dedupe_window: Duration::ZERO, ..options };
    let (inbox, recovered, _rx) = open(dir.path(), forgetting)?;
    assert!(recovered.is_empty());
    assert!(std::fs::read_to_string(&path)?.lines().count() <= 1, "rewritten to nothing but its next seq");
    drop(inbox);
    let (inbox, _, _rx) = open(dir.path(), options)?;
    let first_new = inbox.store("conn", vec![(Some("new".into()), entry("x", "i"))]).await?;
    let StoreResult::Stored(stored) = &first_new[0] else { panic!("not stored") };
    assert!(stored.seq > 300, "seq {} restarted", stored.seq);
    Ok(())
}

#[tokio::test]
async fn the_connection_sink_routes_drops_unmatched_and_deduplicates() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (inbox, _, mut stored_rx) = open(dir.path(), InboxOptions::default())?;
    let router = Router::new(
        "tg",
        &json!({"rules": [{"match": {"event": "message"}, "route": {"instanceKey": "shared"}}]}),
        "entry",
    )?;
    let sink = ConnectionSink::new("telegram-polling", router, inbox);
    let mut other = event("ignored", "9");
    other.name = "edited".into();
    let accepted = sink
        .accept(vec![
            Delivery::keyed("1", event("hi", "9")),
            Delivery::keyed("2", other),
            Delivery::keyed("1", event("hi", "9")),
        ])
        .await?;
    assert_eq!(accepted, [Accepted::Stored, Accepted::Stored, Accepted::Duplicate]);
    let Some(stored) = stored_rx.recv().await else { panic!("nothing stored") };
    assert_eq!(
        (stored.entry.agent.as_str(), stored.entry.instance.as_str(), stored.key.as_str()),
        ("entry", "shared", "tg/1")
    );
    assert!(
        stored.turn_input().starts_with("hi\n\n[message via tg] properties: {\"chat_id\":\"9\"}"),
        "{}",
        stored.turn_input()
    );
    assert_eq!(stored.turn_metadata()["deliveryKey"], "tg/1");
    assert!(
        tokio::time::timeout(Duration::from_millis(100), stored_rx.recv()).await.is_err(),
        "the unmatched event was stored"
    );
    // The drop is noted in the inbox (for gdn logs), and is no pending event.
    let text = std::fs::read_to_string(dir.path().join(INBOX_FILE))?;
    assert!(text.contains(r#""op":"dropped""#) && text.contains(r#""event":"edited""#), "{text}");
    Ok(())
}

/// Records turns; checks no two turns of one instance overlap.
#[derive(Default)]
struct Recorder {
    log: Mutex<Vec<String>>,
    running: Mutex<HashMap<String, bool>>,
    concurrent: Mutex<(usize, usize)>,
    plan: Mutex<HashMap<String, Vec<TurnEnd>>>,
    delay: Duration,
}

#[async_trait]
impl TurnRunner for Recorder {
    async fn run(&self, turn: &Stored, mut cancel: watch::Receiver<bool>) -> TurnEnd {
        let instance = turn.entry.instance.clone();
        {
            let mut running = self.running.lock_unpoisoned();
            assert!(!running.get(&instance).copied().unwrap_or(false), "two turns of {instance} at once");
            running.insert(instance.clone(), true);
            let mut c = self.concurrent.lock_unpoisoned();
            c.0 += 1;
            c.1 = c.1.max(c.0);
        }
        let text = turn.entry.event.message.input_text();
        let end = tokio::select! {
            () = tokio::time::sleep(self.delay) => {
                let mut plan = self.plan.lock_unpoisoned();
                plan.get_mut(&text).and_then(|ends| (!ends.is_empty()).then(|| ends.remove(0))).unwrap_or(TurnEnd::Answered)
            }
            _ = cancel.wait_for(|c| *c) => TurnEnd::Interrupted,
        };
        self.log.lock_unpoisoned().push(format!("{text}:{}", turn.attempts));
        self.running.lock_unpoisoned().insert(instance, false);
        self.concurrent.lock_unpoisoned().0 -= 1;
        end
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn turns_run_in_order_per_instance_and_concurrently_across() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (inbox, recovered, stored_rx) = open(dir.path(), InboxOptions::default())?;
    let recorder = Arc::new(Recorder { delay: Duration::from_millis(30), ..Recorder::default() });
    recorder.plan.lock_unpoisoned().insert("b1".into(), vec![TurnEnd::Retry("crashed".into())]);
    recorder
        .plan
        .lock_unpoisoned()
        .insert("c1".into(), vec![TurnEnd::Retry("1".into()), TurnEnd::Retry("2".into()), TurnEnd::Retry("3".into())]);
    let options = DispatchOptions { max_concurrent: 8, max_attempts: 3, retry_pause: Duration::from_millis(10) };
    let dispatcher = Dispatcher::start(inbox.clone(), recorder.clone(), recovered, stored_rx, options);
    for n in 1..=4 {
        for instance in ["a", "b", "c"] {
            inbox.store("conn", vec![(None, entry(&format!("{instance}{n}"), instance))]).await?;
        }
    }
    tokio::time::timeout(Duration::from_secs(20), dispatcher.idle()).await?;
    let log = recorder.log.lock_unpoisoned().clone();
    for instance in ["a", "b", "c"] {
        let mine: Vec<_> = log.iter().filter(|l| l.starts_with(instance)).cloned().collect();
        let expected: Vec<String> = match instance {
            "b" => vec!["b1:1".into(), "b1:2".into(), "b2:1".into(), "b3:1".into(), "b4:1".into()],
            "c" => vec!["c1:1".into(), "c1:2".into(), "c1:3".into(), "c2:1".into(), "c3:1".into(), "c4:1".into()],
            _ => (1..=4).map(|n| format!("a{n}:1")).collect(),
        };
        assert_eq!(mine, expected);
    }
    assert!(recorder.concurrent.lock_unpoisoned().1 >= 2, "instances never ran concurrently");
    // Everything is done (c1 given up after three starts).
    drop(dispatcher);
    drop(inbox);
    let (_inbox, recovered, _rx) = open(dir.path(), InboxOptions::default())?;
    assert!(recovered.is_empty(), "{:?}", texts(&recovered));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_leaves_unfinished_events_for_the_next_start() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (inbox, recovered, stored_rx) = open(dir.path(), InboxOptions::default())?;
    let recorder = Arc::new(Recorder { delay: Duration::from_secs(30), ..Recorder::default() });
    let dispatcher =
        Dispatcher::start(inbox.clone(), recorder.clone(), recovered, stored_rx, DispatchOptions::default());
    for n in 0..3 {
        inbox.store("conn", vec![(None, entry(&format!("slow{n}"), "x"))]).await?;
    }
    // The barrier: slow0's turn is running (the recorder saw it start).
    let running = || recorder.running.lock_unpoisoned().get("x").copied() == Some(true);
    tokio::time::timeout(Duration::from_secs(10), async {
        while !running() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await?;
    let left = tokio::time::timeout(Duration::from_secs(10), dispatcher.drain(Duration::from_millis(200))).await?;
    assert_eq!(left, 2, "two queued behind the running one");
    inbox.close();
    assert!(inbox.store("conn", vec![(None, entry("late", "x"))]).await.is_err());
    drop(inbox);
    let (_inbox, recovered, _rx) = open(dir.path(), InboxOptions::default())?;
    assert_eq!(texts(&recovered), ["slow0", "slow1", "slow2"]);
    assert_eq!(recovered[0].attempts, 1);
    Ok(())
}

#[tokio::test]
async fn keys_are_forgotten_after_the_window_but_never_while_pending() -> TestResult {
    let dir = tempfile::tempdir()?;
    let short = InboxOptions { dedupe_window: Duration::ZERO, ..InboxOptions::default() };
    let (inbox, _, _rx) = open(dir.path(), InboxOptions::default())?;
    let results = inbox
        .store("conn", vec![(Some("done".into()), entry("a", "x")), (Some("waiting".into()), entry("b", "x"))])
        .await?;
    let StoreResult::Stored(first) = &results[0] else { panic!("not stored") };
    inbox.done(first.seq, goondan_ingress::inbox::Outcome::Answered).await?;
    drop(inbox);
    tokio::time::sleep(Duration::from_millis(5)).await;
    // Reopened with a window already over: the finished event's key is
    // forgotten, the pending one's is not.
    let (inbox, recovered, _rx) = open(dir.path(), short)?;
    assert_eq!(texts(&recovered), ["b"]);
    assert_eq!(
        inbox.store("conn", vec![(Some("waiting".into()), entry("b again", "x"))]).await?,
        [StoreResult::Duplicate]
    );
    assert!(matches!(
        inbox.store("conn", vec![(Some("done".into()), entry("a again", "x"))]).await?[0],
        StoreResult::Stored(_)
    ));
    drop(inbox);
    // At most max_keys keys are kept, the oldest forgotten first.
    let bounded = InboxOptions { max_keys: 1, ..InboxOptions::default() };
    let (inbox, recovered, _rx) = open(dir.path(), bounded)?;
    assert_eq!(inbox.status().keys, 2, "both keys are pending, so both stay");
    for stored in &recovered {
        inbox.done(stored.seq, goondan_ingress::inbox::Outcome::Answered).await?;
    }
    drop(inbox);
    let (inbox, _, _rx) = open(dir.path(), bounded)?;
    assert_eq!(inbox.status().keys, 1, "the older finished key is forgotten");
    Ok(())
}

#[tokio::test]
async fn keys_over_the_bound_are_forgotten_and_the_status_counts_per_instance() -> TestResult {
    let dir = tempfile::tempdir()?;
    let options = InboxOptions { max_keys: 100, compact_min_records: 50, ..InboxOptions::default() };
    let (inbox, _, _rx) = open(dir.path(), options)?;
    for n in 0..300 {
        let instance = if n % 3 == 0 { "x" } else { "y" };
        let results = inbox.store("conn", vec![(Some(format!("{n}")), entry("e", instance))]).await?;
        let StoreResult::Stored(stored) = &results[0] else { panic!("{n} not stored") };
        // Every 50th stays pending: 0 and 150 on x, 50, 100, 200 and 250 on y.
        if n % 50 != 0 {
            inbox.done(stored.seq, goondan_ingress::inbox::Outcome::Answered).await?;
        }
    }
    // A pending key is never forgotten, an old finished one is, a recent one is not.
    assert_eq!(inbox.store("conn", vec![(Some("0".into()), entry("e", "x"))]).await?, [StoreResult::Duplicate]);
    assert!(matches!(inbox.store("conn", vec![(Some("1".into()), entry("e", "z"))]).await?[0], StoreResult::Stored(_)));
    assert_eq!(inbox.store("conn", vec![(Some("299".into()), entry("e", "y"))]).await?, [StoreResult::Duplicate]);
    // The status is published after each commit (the answer comes first).
    let expected = BTreeMap::from([("a@x".to_owned(), 2), ("a@y".to_owned(), 4), ("a@z".to_owned(), 1)]);
    let mut status = inbox.status();
    for _ in 0..100 {
        if status.pending == expected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        status = inbox.status();
    }
    assert_eq!(status.pending, expected);
    assert!(status.keys <= 100 + 7, "{} keys remembered over a bound of 100", status.keys);
    Ok(())
}

/// Answers `Retry` the first time, then `Answered`; keeps the `attempt` each turn's metadata says.
#[derive(Default)]
struct Attempts {
    seen: Mutex<Vec<serde_json::Value>>,
}

#[async_trait]
impl TurnRunner for Attempts {
    async fn run(&self, turn: &Stored, _cancel: watch::Receiver<bool>) -> TurnEnd {
        let attempt = turn.turn_metadata().get("attempt").cloned().unwrap_or_default();
        let mut seen = self.seen.lock_unpoisoned();
        seen.push(attempt);
        if seen.len() == 1 { TurnEnd::Retry("the agent process died".into()) } else { TurnEnd::Answered }
    }
}

#[tokio::test]
async fn a_turn_s_metadata_counts_its_attempts_from_one() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (inbox, recovered, stored_rx) = open(dir.path(), InboxOptions::default())?;
    let runner = Arc::new(Attempts::default());
    let options = DispatchOptions { retry_pause: Duration::from_millis(1), ..DispatchOptions::default() };
    let dispatcher = Dispatcher::start(inbox.clone(), runner.clone(), recovered, stored_rx, options);
    inbox.store("conn", vec![(Some("k".into()), entry("once", "x"))]).await?;
    tokio::time::sleep(Duration::from_millis(20)).await;
    tokio::time::timeout(Duration::from_secs(10), dispatcher.idle()).await?;
    assert_eq!(*runner.seen.lock_unpoisoned(), [json!(1), json!(2)]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_turn_keeps_its_instances_events_for_the_next_start() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (inbox, recovered, stored_rx) = open(dir.path(), InboxOptions::default())?;
    let recorder = Arc::new(Recorder { delay: Duration::from_millis(5), ..Recorder::default() });
    recorder.plan.lock_unpoisoned().insert("h1".into(), vec![TurnEnd::Hold("no key".into())]);
    let dispatcher =
        Dispatcher::start(inbox.clone(), recorder.clone(), recovered, stored_rx, DispatchOptions::default());
    for (text, instance) in [("h1", "h"), ("h2", "h"), ("o1", "o")] {
        inbox.store("conn", vec![(None, entry(text, instance))]).await?;
    }
    // Idle counts what was stored before it was asked, held events aside.
    tokio::time::timeout(Duration::from_secs(10), dispatcher.idle()).await?;
    let log = recorder.log.lock_unpoisoned().clone();
    assert!(log.contains(&"o1:1".to_owned()) && log.contains(&"h1:1".to_owned()), "{log:?}");
    assert!(!log.iter().any(|l| l.starts_with("h2")), "a held instance took another turn: {log:?}");
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(10), dispatcher.drain(Duration::ZERO)).await?,
        1,
        "h2 never started"
    );
    inbox.sync().await?;
    drop(inbox);
    let (_inbox, recovered, _rx) = open(dir.path(), InboxOptions::default())?;
    assert_eq!(texts(&recovered), ["h1", "h2"]);
    // A held turn is no attempt: a still-broken bundle never uses up the event.
    assert_eq!(recovered[0].attempts, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_instance_runs_again_from_its_held_event_once_released() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (inbox, recovered, stored_rx) = open(dir.path(), InboxOptions::default())?;
    let recorder = Arc::new(Recorder { delay: Duration::from_millis(5), ..Recorder::default() });
    recorder.plan.lock_unpoisoned().insert("h1".into(), vec![TurnEnd::Hold("the bundle is broken".into())]);
    let dispatcher =
        Dispatcher::start(inbox.clone(), recorder.clone(), recovered, stored_rx, DispatchOptions::default());
    for text in ["h1", "h2"] {
        inbox.store("conn", vec![(None, entry(text, "h"))]).await?;
    }
    tokio::time::timeout(Duration::from_secs(10), dispatcher.idle()).await?;
    assert_eq!(*recorder.log.lock_unpoisoned(), ["h1:1"]);
    // Fixed: the held event runs first, then the one behind it, each once.
    dispatcher.release_held();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while recorder.log.lock_unpoisoned().len() < 3 {
        assert!(tokio::time::Instant::now() < deadline, "the released instance did not run");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::timeout(Duration::from_secs(10), dispatcher.idle()).await?;
    assert_eq!(*recorder.log.lock_unpoisoned(), ["h1:1", "h1:1", "h2:1"]);
    assert_eq!(tokio::time::timeout(Duration::from_secs(10), dispatcher.drain(Duration::ZERO)).await?, 0);
    inbox.sync().await?;
    assert!(inbox.status().pending.is_empty(), "{:?}", inbox.status().pending);
    Ok(())
}

#[tokio::test]
async fn one_inbox_has_one_writer() -> TestResult {
    let dir = tempfile::tempdir()?;
    let (inbox, _, _rx) = open(dir.path(), InboxOptions::default())?;
    let Err(error) = open(dir.path(), InboxOptions::default()) else { panic!("a second writer opened the inbox") };
    let message = error.to_string();
    assert!(
        message.contains("another process serves") && message.contains(&format!("pid {}", std::process::id())),
        "{message}"
    );
    drop(inbox);
    // Once the first is gone, the inbox opens again.
    let (_inbox, _, _rx) = open(dir.path(), InboxOptions::default())?;
    Ok(())
}
