//! Arbitrary bytes as an instance's `messages.jsonl`: loading never panics,
//! the loaded conversation always keeps the tool call rule (loading
//! repairs what the lines broke), and once the repairs are committed a
//! reload gives the same conversation.
//!
//! The log lives in a state root under the temp directory named after the
//! process, reused by every input of the run.

#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use goondan_runtime::store::{InstanceStore, Workspace, read_message_log};
use libfuzzer_sys::fuzz_target;

const INSTANCE: &str = "fuzz";

fn state_root() -> &'static Workspace {
    static ROOT: OnceLock<Workspace> = OnceLock::new();
    ROOT.get_or_init(|| {
        Workspace::at(std::env::temp_dir().join(format!("goondan-fuzz-conversation-{}", std::process::id())))
    })
}

/// The instance's message log path (the store is opened once to learn it).
fn messages_path() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| match InstanceStore::open(state_root(), INSTANCE, "agent", Path::new("/bundle")) {
        Ok(store) => store.messages_path().to_path_buf(),
        Err(error) => panic!("cannot open the fuzz instance: {error}"),
    })
}

fuzz_target!(|data: &[u8]| {
    let path = messages_path();
    if let Err(error) = std::fs::write(path, data) {
        panic!("cannot write {}: {error}", path.display());
    }

    // Only I/O failures are errors; whatever the bytes, a conversation comes back.
    let loaded = match read_message_log(path) {
        Ok(loaded) => loaded,
        Err(error) => panic!("loading failed: {error}"),
    };
    assert!(loaded.state.is_consistent(), "the loaded conversation breaks the rule: {:?}", loaded.state.messages());

    // The runtime's first commit saves the load's repairs (and cuts a torn
    // tail first); from then on a reload reaches the same conversation.
    // Only when there was something to repair: the commit fsyncs, which is
    // slow, and without repairs there is nothing to save.
    if loaded.repairs.is_empty() {
        return;
    }
    let mut state = loaded.state;
    let mut store = match InstanceStore::open(state_root(), INSTANCE, "agent", Path::new("/bundle")) {
        Ok(store) => store,
        Err(error) => panic!("cannot open the fuzz instance: {error}"),
    };
    if state.commit()
        && let Err(error) = store.append_events(&state.last_batch())
    {
        panic!("committing the repairs failed: {error}");
    }
    let reloaded = match store.load() {
        Ok(reloaded) => reloaded,
        Err(error) => panic!("reloading failed: {error}"),
    };
    assert!(reloaded.repairs.is_empty(), "a reload after the repairs were saved repaired again: {}", reloaded.repairs);
    assert_eq!(reloaded.state.messages(), state.messages(), "a reload after saving the repairs differs");
});
