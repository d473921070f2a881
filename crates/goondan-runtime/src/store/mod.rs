//! Durable conversations: the state root, one workspace per project, and
//! one directory per agent instance.
//!
//! ```text
//! <state root>/                     --state-root, else GOONDAN_STATE_ROOT, else ~/.goondan
//!   workspaces/
//!     <workspace id>/               one project: the slug of its Swarm's instance key (the original's)
//!       workspace.json              whose state it is: the canonical path of the bundle file
//!       instances/
//!         <agent>@<key>/            one agent instance: agent name and instance key, each
//!                                   percent-encoded (see below), e.g. assistant@default
//!           instance.json           metadata; replaced atomically (temp file + fsync + rename)
//!           messages.jsonl          the conversation as a log of message events, one commit per line
//!           events.jsonl            the event log: one runtime event per line, append-only
//!           lock                    locked by the process running the instance; holds its pid
//!           messages/               exports for the original's tools, never read back (see `original`):
//!             base.jsonl            the conversation in the original's message shape, at each turn end
//!             runtime-events.jsonl  the original's runtime-event records, beside events.jsonl
//!           extensions/<name>.json  each extension's state (see crate::extension_state)
//!   instances/                      the old layouts (<agent>@<key>, and before that <key>): moved on use
//! ```
//!
//! A workspace is the original's namespace (`workspaces/<workspaceId>/`,
//! the id a slug of the Swarm's `instanceKey`, else its name). Two bundles
//! whose Swarms share a name would share it, and the second would continue
//! the first one's conversations; so a workspace keeps its bundle's
//! identity in workspace.json, and [`open_workspace`] refuses another
//! bundle ([`StoreError::ForeignWorkspace`]) unless asked to take it over.
//!
//! An agent instance is a pair (agent name, instance key). In a swarm every
//! agent keeps its own conversation and event log for a key, and is run by
//! its own process, so agents that share a key (`assistant` and `planner`
//! on `default`) get a directory each.
//!
//! The message log is the conversation's [`MessageEvent`]s, folded on load
//! ([`InstanceStore::load`]). Each line is one commit: a plain
//! `goondan_core::Message` when the commit appended exactly one message
//! (and in logs written before message events existed, where every line is
//! one), otherwise `{"events": [MessageEvent, ...]}`. Why a log of events
//! and not a file rewritten per change: a step costs one append of its own
//! lines and one fsync, whatever the conversation's length; edits by
//! extensions (`replace`, `remove`, `truncate`) are recorded the same way;
//! and when dead records pile up the runtime rewrites the file from the
//! folded state ([`InstanceStore::rewrite`]: temp file, fsync, rename), so
//! the log never grows without bound.
//!
//! Durability:
//! - [`InstanceStore::append_events`] writes one commit as one line with a
//!   single `write_all`, then syncs the file before returning. The runtime
//!   commits at step boundaries, so a step whose commit returned survives a
//!   crash, and a commit is all or nothing: a crash leaves the log at a
//!   state the process had.
//! - A crash in the middle of a write can leave a torn last line (the
//!   journal's rule, `goondan_journal`: a last line without its newline,
//!   or that does not parse). Loading skips it with a warning and reports
//!   it in [`LoadedConversation`]; it is never fatal. Before the first
//!   append of a store, and when an event writer is opened, the torn tail
//!   is cut off so new lines never glue onto garbage.
//! - A skipped line, a log of an earlier version or a hand edit can leave a
//!   tool call without its result, or a result without its call, anywhere
//!   in the history. Loading keeps every readable line, then repairs the
//!   folded conversation by the rule of `goondan_core::conversation`
//!   (orphan results removed, calls unanswered at the end answered with
//!   `E_TOOL_INTERRUPTED`, calls unanswered elsewhere dropped) with a
//!   warning saying what was repaired ([`LoadedConversation::repairs`]). The
//!   repairs are uncommitted events of the loaded state; the runtime saves
//!   them before its next turn.
//!
//! Agent names and instance keys are user-chosen strings (`user:42/chat`).
//! Each is encoded alike: `[A-Za-z0-9._-]` kept, every other byte of its
//! UTF-8 percent-encoded (`user%3A42%2Fchat`), so neither holds a path
//! separator or an `@`; the directory name is the two joined with `@`,
//! which splits back at its only `@` ([`parse_instance_dir_name`]). Empty
//! names, `.` and `..` are refused for both, and so is a pair whose
//! directory name would exceed 255 bytes. instance.json holds the real
//! pair, checked on open and delete so that two instances can never share a
//! directory (say, on a case-insensitive file system).
//!
//! Earlier versions kept every bundle's instances directly under
//! `<root>/instances/` (`<agent>@<key>`, and before that `<encoded key>`
//! whatever the agent). When a bundle opens its workspace, the instances
//! whose instance.json names that bundle are moved in, each by one rename
//! ([`migrate_legacy_instances`]), so nothing is copied or lost; the others
//! stay for their own bundles, and [`list_instances`] shows them. A
//! directory is never deleted or overwritten to migrate: if the new one
//! exists already, the old one is left alone with a warning.
//!
//! One process at a time runs an instance: [`InstanceStore::lock`] takes an
//! advisory lock on its `lock` file and writes the process id into it.
//! [`lock_status`] tells whether a process holds it now (and which), and
//! [`delete_instances`] refuses to delete a held instance.
//!
//! The state root holds every conversation, so it is the user's alone,
//! whatever the umask: every directory the store makes is created 0700
//! ([`create_private_dir_all`], missing parents included, the root itself
//! among them) and every file 0600 ([`private_file`]), and a file replaced
//! through a temp file takes the temp file's 0600. What a caller of this
//! crate writes under the root should go through the same two functions.
//! A root made looser by hand or by an earlier version is not changed here
//! (`gdn doctor` reports it and `gdn doctor --fix` tightens it).
//!
//! One job per module, every public item re-exported here (`store::X`):
//! `root` (the [`StateRoot`]), `workspace` (workspaces, the old layouts'
//! migration), `names` (instance directory names), `instance` (the
//! [`InstanceStore`] and its instance.json), `lock` (one process per
//! instance), `messages` (the conversation log), `event_log` (the event-log
//! writer), `original` (the exports the original's tools read), `manage`
//! (list, delete, reset), `files` (private modes, atomic JSON files) and
//! `error` ([`StoreError`]). The two logs are
//! `goondan_journal` journals; this module adds what they hold.

mod error;
mod event_log;
mod files;
mod instance;
mod lock;
mod manage;
mod messages;
mod names;
mod original;
mod root;
mod workspace;

pub use error::StoreError;
pub use event_log::EventLogWriter;
pub(crate) use files::sync_dir;
pub use files::{PRIVATE_DIR_MODE, PRIVATE_FILE_MODE, create_private_dir_all, private_file};
pub use instance::{Expiry, InstanceInfo, InstanceStore, mark_expired, read_instance_info};
pub use lock::{InstanceLock, LockStatus, lock_status};
pub use manage::{
    DeletedInstance, ListedInstance, ResetInstance, delete_instance, delete_instances, delete_instances_if,
    list_instances, reset_conversations,
};
pub use messages::{LoadedConversation, LoadedMessages, read_message_log};
pub(crate) use names::{NameRefusal, encode_name};
pub use names::{instance_dir_name, parse_instance_dir_name};
pub use original::base_export_lines;
pub use root::StateRoot;
pub use workspace::{
    Workspace, WorkspaceAccess, WorkspaceInfo, find_workspace, migrate_legacy_instances, old_layout_instances,
    open_workspace, workspace_id,
};

/// The `tracing` target of the store's warnings.
const LOG_TARGET: &str = "goondan::store";

#[cfg(test)]
mod tests {
    use std::fs;
    use std::io::Write as _;
    use std::os::unix::fs::PermissionsExt as _;
    use std::path::Path;

    use goondan_core::Message;

    use super::*;

    fn user(text: &str) -> Message {
        Message::new(goondan_core::MessageData::User { content: text.to_owned() }, goondan_core::MessageSource::User)
    }

    /// Every directory and file under `dir` (links not followed) whose mode
    /// is not the private one, with its mode.
    fn loose(dir: &Path, found: &mut Vec<String>) {
        for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
            let path = entry.path();
            let meta = fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let mode = meta.permissions().mode() & 0o7777;
            if meta.is_dir() {
                if mode != PRIVATE_DIR_MODE {
                    found.push(format!("{} {mode:o}", path.display()));
                }
                loose(&path, found);
            } else if meta.is_file() && mode != PRIVATE_FILE_MODE {
                found.push(format!("{} {mode:o}", path.display()));
            }
        }
    }

    #[test]
    fn everything_the_store_writes_is_the_users_only() -> Result<(), Box<dyn std::error::Error>> {
        let temp = tempfile::tempdir()?;
        // The root and its parent do not exist yet: both are made here.
        let root = StateRoot::new(temp.path().join("parent").join("state"));
        let workspace = open_workspace(&root, "demo", "/p/goondan.yaml", WorkspaceAccess::Use)?;
        let mut store = InstanceStore::open(&workspace, "user:1", "assistant", Path::new("/p/goondan.yaml"))?;
        let _lock = store.lock()?;
        store.append(&[user("hi")])?;
        store.rewrite(&[user("hi again")])?;
        store.record_turn()?;
        let mut events = store.event_writer()?;
        events.write_all(b"{}\n")?;
        events.flush()?;
        store.runtime_events_export()?.write_all(b"{}\n")?;
        store.write_base_export(b"{}\n", false)?;
        store.write_base_export(b"{}\n", true)?;
        crate::tasks::TaskBook::open(store.dir())?;
        let runtime = tokio::runtime::Builder::new_current_thread().build()?;
        let extensions = crate::extension_state::ExtensionStateStore::at(
            store.dir().join(crate::extension_state::ExtensionStateStore::DIR_NAME),
        );
        runtime.block_on(extensions.set("memo", serde_json::json!({"a": 1})))?;

        let root_mode = fs::metadata(root.path())?.permissions().mode() & 0o7777;
        assert_eq!(root_mode, PRIVATE_DIR_MODE, "the state root");
        let mut found = Vec::new();
        loose(temp.path(), &mut found);
        assert!(found.is_empty(), "not private: {found:?}");
        // Each kind of file was written.
        for file in [InstanceStore::INFO_FILE, InstanceStore::MESSAGES_FILE, InstanceStore::EVENTS_FILE, "lock"] {
            assert!(store.dir().join(file).is_file(), "{file}");
        }
        for file in [InstanceStore::BASE_EXPORT_FILE, InstanceStore::RUNTIME_EVENTS_FILE] {
            assert!(store.dir().join(InstanceStore::EXPORT_DIR).join(file).is_file(), "{file}");
        }
        assert!(workspace.dir().join(Workspace::INFO_FILE).is_file());
        Ok(())
    }

    #[test]
    fn an_idle_instance_is_marked_expired_under_its_lock_and_its_next_process_takes_it_back()
    -> Result<(), Box<dyn std::error::Error>> {
        let temp = tempfile::tempdir()?;
        let root = StateRoot::new(temp.path().join("state"));
        let workspace = open_workspace(&root, "demo", "/p/goondan.yaml", WorkspaceAccess::Use)?;
        let bundle = Path::new("/p/goondan.yaml");
        let mut store = InstanceStore::open(&workspace, "user:1", "assistant", bundle)?;
        store.append(&[user("hi")])?;
        let dir = store.dir().to_path_buf();
        let idle_since = store.info().updated_at;
        let expire = |now| mark_expired(&dir, "assistant", "user:1", 10_000, 5_000, now);

        assert_eq!(expire(idle_since + 9_999)?, Expiry::Kept, "not idle for the ttl yet");
        {
            // A process runs it: never marked under it.
            let _running = store.lock()?;
            assert!(matches!(expire(idle_since + 10_000), Err(StoreError::Busy { .. })));
        }
        assert_eq!(expire(idle_since + 10_000)?, Expiry::Expired { collect_at: idle_since + 15_000 });
        let info = read_instance_info(&dir)?.ok_or("no instance.json")?;
        assert_eq!((info.expired_at, info.collect_at), (Some(idle_since + 10_000), Some(idle_since + 15_000)));
        assert_eq!((info.turns, info.messages), (0, 1), "the rest of instance.json is kept");
        assert_eq!(expire(idle_since + 20_000)?, Expiry::Kept, "expired once");

        // The collector's condition is asked under the locks: refused, nothing goes.
        let kept = delete_instances_if(&root, &workspace, "user:1", Some("assistant"), |info| {
            info.is_some_and(|info| info.expired_at.is_none())
        })?;
        assert!(kept.is_empty() && dir.is_dir());

        // The next process of the instance takes it back before its first turn.
        let mut next = InstanceStore::open(&workspace, "user:1", "assistant", bundle)?;
        let _lock = next.lock()?;
        assert_eq!(next.revive()?, Some(idle_since + 10_000));
        assert_eq!(next.revive()?, None);
        let info = read_instance_info(&dir)?.ok_or("no instance.json")?;
        assert_eq!((info.expired_at, info.collect_at), (None, None));
        assert_eq!(next.load()?.state.messages().len(), 1, "the conversation is untouched");
        let events = fs::read_to_string(dir.join(InstanceStore::EVENTS_FILE))?;
        let kinds: Vec<String> = events
            .lines()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).map(|v| v["type"].to_string()))
            .collect::<Result<_, _>>()?;
        assert_eq!(kinds, ["\"instance.expired\"", "\"instance.revived\""]);
        Ok(())
    }

    #[test]
    fn an_existing_directory_keeps_its_mode() -> Result<(), Box<dyn std::error::Error>> {
        let temp = tempfile::tempdir()?;
        let shared = temp.path().join("shared");
        fs::create_dir(&shared)?;
        fs::set_permissions(&shared, fs::Permissions::from_mode(0o750))?;
        create_private_dir_all(&shared.join("a/b"))?;
        assert_eq!(fs::metadata(&shared)?.permissions().mode() & 0o7777, 0o750);
        assert_eq!(fs::metadata(shared.join("a"))?.permissions().mode() & 0o7777, PRIVATE_DIR_MODE);
        assert_eq!(fs::metadata(shared.join("a/b"))?.permissions().mode() & 0o7777, PRIVATE_DIR_MODE);
        Ok(())
    }
}
