//! Extension state (`api.state`) on real files: what one store writes,
//! another store over the same instance (another process) reads.

use std::fs;
use std::path::Path;

use goondan_core::{JsonObject, JsonValue};
use goondan_runtime::store::Workspace;
use goondan_runtime::{ExtensionStateError, ExtensionStateStore};
use serde_json::json;

fn must<T, E: std::fmt::Display>(result: Result<T, E>) -> T {
    result.unwrap_or_else(|error| panic!("{error}"))
}

fn object(value: JsonValue) -> JsonObject {
    match value {
        JsonValue::Object(object) => object,
        other => panic!("not an object: {other}"),
    }
}

/// Every file and directory under `dir`, relative, sorted.
fn tree(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(read) = fs::read_dir(dir) else { return };
        for entry in read.filter_map(Result::ok) {
            let path = entry.path();
            out.push(path.strip_prefix(base).map(|p| p.display().to_string()).unwrap_or_default());
            if path.is_dir() {
                walk(base, &path, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

fn instance_store(root: &Workspace, key: &str) -> ExtensionStateStore {
    ExtensionStateStore::at(must(root.instance_dir("assistant", key)).join(ExtensionStateStore::DIR_NAME))
}

#[tokio::test]
async fn a_second_store_over_the_same_instance_sees_the_first_ones_state() {
    let temp = must(tempfile::tempdir());
    let root = Workspace::at(temp.path().join("state"));
    let first = instance_store(&root, "user:42/chat");
    must(first.set("idle-monitor", json!({"lastSeen": 1_700_000_000_000_u64, "tags": ["a"]})).await);
    must(first.set("counter", json!({"n": 1})).await);

    let second = instance_store(&root, "user:42/chat");
    assert_eq!(
        must(second.get("idle-monitor").await),
        Some(object(json!({"lastSeen": 1_700_000_000_000_u64, "tags": ["a"]})))
    );
    assert_eq!(must(second.get("counter").await), Some(object(json!({"n": 1}))));
    assert_eq!(must(second.get("never-set").await), None);

    // Another instance has its own state.
    assert_eq!(must(instance_store(&root, "other").get("counter").await), None);

    assert_eq!(
        tree(&root.instances_dir()),
        vec![
            "assistant@user%3A42%2Fchat",
            "assistant@user%3A42%2Fchat/extensions",
            "assistant@user%3A42%2Fchat/extensions/counter.json",
            "assistant@user%3A42%2Fchat/extensions/idle-monitor.json",
        ]
    );
}

#[tokio::test]
async fn a_store_caches_what_it_read() {
    let temp = must(tempfile::tempdir());
    let dir = temp.path().join("extensions");
    let writer = ExtensionStateStore::at(dir.clone());
    let reader = ExtensionStateStore::at(dir.clone());
    must(writer.set("ext", json!({"v": 1})).await);
    assert_eq!(must(reader.get("ext").await), Some(object(json!({"v": 1}))));
    // The file is read once per store: one process owns an instance at a time.
    must(writer.set("ext", json!({"v": 2})).await);
    assert_eq!(must(reader.get("ext").await), Some(object(json!({"v": 1}))));
    assert_eq!(must(ExtensionStateStore::at(dir).get("ext").await), Some(object(json!({"v": 2}))));
}

#[tokio::test]
async fn refusals_are_typed_and_say_why() {
    let temp = must(tempfile::tempdir());
    let dir = temp.path().join("extensions");
    let store = ExtensionStateStore::at(dir.clone());

    let error = store.set("ext", json!([1, 2, 3])).await.err();
    assert!(matches!(error, Some(ExtensionStateError::NotAnObject { got: "array", .. })), "{error:?}");
    let message = error.map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("must be a JSON object") && message.contains("array"), "{message}");

    let error = store.set("", json!({})).await.err();
    assert!(matches!(error, Some(ExtensionStateError::InvalidName { .. })), "{error:?}");

    assert!(!dir.exists(), "refused sets write nothing");
}

#[tokio::test]
async fn hostile_names_stay_inside_the_directory() {
    let temp = must(tempfile::tempdir());
    let dir = temp.path().join("instance").join("extensions");
    let store = ExtensionStateStore::at(dir.clone());
    for name in ["../evil", "../../evil", "a/b", "/etc/passwd"] {
        must(store.set(name, json!({"name": name})).await);
        assert_eq!(must(store.get(name).await), Some(object(json!({"name": name}))));
    }
    for name in ["..", ".", ""] {
        let error = store.set(name, json!({})).await.err();
        assert!(matches!(error, Some(ExtensionStateError::InvalidName { .. })), "{name:?}: {error:?}");
    }
    assert_eq!(
        tree(temp.path()),
        vec![
            "instance",
            "instance/extensions",
            "instance/extensions/%2Fetc%2Fpasswd.json",
            "instance/extensions/..%2F..%2Fevil.json",
            "instance/extensions/..%2Fevil.json",
            "instance/extensions/a%2Fb.json",
        ]
    );
}

#[tokio::test]
async fn a_corrupt_file_is_kept_aside_and_the_extension_starts_over() {
    let temp = must(tempfile::tempdir());
    let dir = temp.path().to_path_buf();
    must(fs::write(dir.join("ext.json"), "{\"truncated\": "));
    let store = ExtensionStateStore::at(dir.clone());
    assert_eq!(must(store.get("ext").await), None);
    must(store.set("ext", json!({"fresh": true})).await);
    let files = tree(&dir);
    assert_eq!(files.len(), 2, "{files:?}");
    assert_eq!(files[0], "ext.json");
    assert!(files[1].starts_with("ext.json.corrupt-"), "{files:?}");
    assert_eq!(must(fs::read_to_string(dir.join(&files[1]))), "{\"truncated\": ");
}

#[tokio::test]
async fn an_in_memory_store_writes_nothing() {
    let temp = must(tempfile::tempdir());
    let store = ExtensionStateStore::in_memory();
    must(store.set("ext", json!({"a": 1})).await);
    assert_eq!(must(store.get("ext").await), Some(object(json!({"a": 1}))));
    assert!(tree(temp.path()).is_empty());
}
