//! The inbox's accept path: how long one `Inbox::store` takes to be
//! acknowledged (one append and one fsync), and how long 64 concurrent
//! stores take together (group commit: one append and one fsync for as many
//! as wait). The state lives in a temp directory on the file system
//! `TMPDIR` names: on a disk the figures are its `fdatasync`'s; on tmpfs
//! (`TMPDIR=/dev/shm`) they are the inbox's own work.

use std::collections::BTreeMap;

use divan::Bencher;
use goondan_ingress::event::{ConnectorEvent, EventMessage};
use goondan_ingress::inbox::{Entry, Inbox, InboxOptions, Outcome, StoreResult};
use goondan_ingress::routing::Route;

fn main() {
    divan::Divan::default().sample_count(30).config_with_args().main();
}

fn entry(n: usize) -> Entry {
    let event = ConnectorEvent {
        name: "message".into(),
        message: EventMessage::text(format!("event {n}: a short message like a chat line")),
        properties: BTreeMap::new(),
        instance_key: format!("chan-{}", n % 16),
    };
    Entry::new(
        "slack-main",
        "slack",
        Route { agent: "assistant".into(), instance_key: format!("chan-{}", n % 16) },
        event,
    )
}

struct Open {
    _dir: tempfile::TempDir,
    runtime: tokio::runtime::Runtime,
    inbox: Inbox,
}

fn open() -> Open {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("runtime: {e}"));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    // Drained, as the dispatcher drains it.
    runtime.spawn(async move { while rx.recv().await.is_some() {} });
    let path = dir.path().join(goondan_ingress::inbox::INBOX_FILE);
    let (inbox, _) = Inbox::open(&path, InboxOptions::default(), tx).unwrap_or_else(|e| panic!("open: {e}"));
    Open { _dir: dir, runtime, inbox }
}

/// One keyed event stored and acknowledged, then its turn recorded done.
#[divan::bench]
fn store_one(bencher: Bencher) {
    let open = open();
    let mut n = 0usize;
    bencher.bench_local(|| {
        n += 1;
        let key = format!("Ev{n}");
        open.runtime.block_on(async {
            let stored = open.inbox.store("slack-main", vec![(Some(key), entry(n))]).await;
            match stored.as_deref() {
                Ok([StoreResult::Stored(stored)]) => {
                    let _ = open.inbox.done(stored.seq, Outcome::Answered).await;
                }
                other => panic!("store: {other:?}"),
            }
        });
    });
}

/// 64 stores at once, each waiting for its own acknowledgement.
#[divan::bench]
fn store_64_concurrent(bencher: Bencher) {
    let open = open();
    let mut round = 0usize;
    bencher.bench_local(|| {
        round += 1;
        open.runtime.block_on(async {
            let mut waits = Vec::with_capacity(64);
            for i in 0..64 {
                let inbox = open.inbox.clone();
                let n = round * 64 + i;
                waits.push(tokio::spawn(async move {
                    inbox.store("slack-main", vec![(Some(format!("Ev{n}")), entry(n))]).await
                }));
            }
            for wait in waits {
                match wait.await {
                    Ok(Ok(_)) => {}
                    other => panic!("store: {other:?}"),
                }
            }
        });
    });
}
