//! A conversation and where it is saved.
//!
//! [`Conversation`] pairs the in-memory [`ConversationState`] with a
//! [`ConversationStore`]. The runtime commits the state's events at step
//! boundaries and hands each batch to the store; the front end (a terminal,
//! an agent process, `gdn mcp serve`) never saves anything itself.
//!
//! Stores do their file I/O off the async executor: [`InstanceLog`] runs
//! every write and fsync on tokio's blocking pool, so a task reading IPC or
//! JS-host frames on the same runtime never waits behind a save.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use goondan_core::sync::LockUnpoisoned as _;
use goondan_core::{ConversationState, Message, MessageEvent};
use goondan_tools::BoxFuture;

use crate::store::{InstanceStore, StoreError, base_export_lines};

/// Where committed message events go.
pub trait ConversationStore: Send + Sync {
    /// Makes `batch` durable. `state` is the conversation after the batch,
    /// for stores that choose to rewrite instead of append.
    fn commit(&self, batch: Vec<MessageEvent>, state: &ConversationState)
    -> BoxFuture<'static, Result<(), StoreError>>;

    /// Records that a turn ended (counters, timestamps); `state` is the
    /// conversation at the end, for stores that export it.
    fn turn_ended(&self, _state: &ConversationState) -> BoxFuture<'static, Result<(), StoreError>> {
        Box::pin(std::future::ready(Ok(())))
    }

    /// The conversation as last committed, for recovering the in-memory
    /// state after a turn was abandoned; `None` if the store cannot tell.
    fn reload(&self) -> BoxFuture<'static, Result<Option<ConversationState>, StoreError>> {
        Box::pin(std::future::ready(Ok(None)))
    }
}

/// A conversation and its store (none for one kept only in memory).
pub struct Conversation {
    pub(crate) state: ConversationState,
    pub(crate) store: Option<Arc<dyn ConversationStore>>,
    /// The state was lost with an abandoned turn and must be reloaded.
    pub(crate) needs_reload: bool,
}

impl std::fmt::Debug for Conversation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conversation").field("messages", &self.state.messages().len()).finish_non_exhaustive()
    }
}

impl Conversation {
    /// A conversation of `messages` kept only in memory.
    pub fn in_memory(messages: Vec<Message>) -> Self {
        Self::unsaved(ConversationState::new(messages))
    }

    /// A conversation kept only in memory, starting from `state`.
    pub fn unsaved(state: ConversationState) -> Self {
        Self { state, store: None, needs_reload: false }
    }

    /// A conversation saved to `store`, starting from `state` (as loaded from it).
    pub fn new(state: ConversationState, store: Arc<dyn ConversationStore>) -> Self {
        Self { state, store: Some(store), needs_reload: false }
    }

    /// The messages as they stand.
    pub fn messages(&self) -> &[Message] {
        self.state.messages()
    }

    /// The state (messages, the current turn's base and events).
    pub fn state(&self) -> &ConversationState {
        &self.state
    }

    /// Appends `messages` outside a turn (replies that arrived between
    /// turns) and saves them at once.
    pub async fn append_and_commit(&mut self, messages: Vec<Message>) -> Result<(), StoreError> {
        if self.needs_reload {
            crate::turn::reload(self).await;
        }
        self.state.append_new(messages);
        self.commit_or_reload_later().await
    }

    /// Removes the messages `ids` outside a turn (what a turn cut off by a
    /// crash left, before that turn runs again) and saves that at once.
    pub async fn remove_and_commit(&mut self, ids: &[String]) -> Result<(), StoreError> {
        if self.needs_reload {
            crate::turn::reload(self).await;
        }
        for id in ids {
            // A message already gone needs no removing.
            let _ = self.state.emit(goondan_core::conversation::MessageEvent::Remove { target_id: id.clone() });
        }
        self.commit_or_reload_later().await
    }

    /// Commits; when saving fails, memory holds what the store does not,
    /// so the next use starts again from what was saved.
    async fn commit_or_reload_later(&mut self) -> Result<(), StoreError> {
        let committed = self.commit().await;
        if committed.is_err() {
            self.needs_reload = true;
        }
        committed
    }

    /// Whether memory holds what the store holds: after a commit that
    /// failed, the conversation is read from its store again first. False
    /// when that read fails too (storage is failing: what is in memory
    /// cannot be trusted to be saved).
    pub async fn agrees_with_store(&mut self) -> bool {
        if self.needs_reload {
            crate::turn::reload(self).await;
        }
        !self.needs_reload
    }

    /// Commits the state's uncommitted events (with the repairs that keep
    /// the conversation valid) and saves them.
    pub async fn commit(&mut self) -> Result<(), StoreError> {
        commit(&mut self.state, self.store.as_deref()).await
    }
}

/// Commits `state`'s uncommitted events and saves them to `store`, if any;
/// nothing to do is free.
pub(crate) async fn commit(
    state: &mut ConversationState,
    store: Option<&dyn ConversationStore>,
) -> Result<(), StoreError> {
    match store {
        Some(store) if state.commit() => store.commit(state.last_batch(), state).await,
        Some(_) => Ok(()),
        None => {
            state.commit();
            Ok(())
        }
    }
}

/// An instance's message log as a [`ConversationStore`].
///
/// Every batch is appended as one line (one write, then fsync) on the
/// blocking pool. When the events on disk outnumber the live messages by
/// more than a slack ([`InstanceLog::COMPACT_SLACK`]) plus their own count — edits by
/// extensions (windows, compaction) leave dead records behind — the log is
/// rewritten from the state instead, atomically (temp file, fsync, rename).
///
/// At the end of each turn it also exports the conversation for the
/// original's tools (`messages/base.jsonl`, see `store::original`), as the
/// original folds its base: the messages added since the last export
/// appended when the conversation only grew, the whole of it rewritten
/// otherwise (the first turn of a process, an edit, a reload).
pub struct InstanceLog {
    store: Arc<Mutex<InstanceStore>>,
    /// Events recorded in the file (appends, edits, folded or not).
    events_on_disk: AtomicUsize,
    slack: usize,
    base_export: Arc<Mutex<BaseExport>>,
}

/// What `messages/base.jsonl` holds, as far as this process knows.
#[derive(Debug, Default)]
struct BaseExport {
    /// The file holds the first `exported` messages of the conversation as
    /// they still are (`false` until the first export of the process: the
    /// file may be another process's, or gone).
    in_sync: bool,
    exported: usize,
}

impl std::fmt::Debug for InstanceLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstanceLog").field("events_on_disk", &self.events_on_disk).finish_non_exhaustive()
    }
}

impl InstanceLog {
    /// Dead records tolerated before a rewrite, beyond one per live message.
    pub const COMPACT_SLACK: usize = 64;

    /// Wraps an open instance store whose log held `events_on_disk` events when loaded.
    pub fn new(store: InstanceStore, events_on_disk: usize) -> Self {
        Self {
            store: Arc::new(Mutex::new(store)),
            events_on_disk: AtomicUsize::new(events_on_disk),
            slack: Self::COMPACT_SLACK,
            base_export: Arc::default(),
        }
    }

    /// Sets how many dead records are tolerated before a rewrite (tests use 0).
    #[must_use]
    pub fn with_compaction_slack(mut self, slack: usize) -> Self {
        self.slack = slack;
        self
    }

    /// Runs `work` on the store on the blocking pool.
    fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut InstanceStore) -> Result<T, StoreError> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        let store = Arc::clone(&self.store);
        Box::pin(async move {
            let task = tokio::task::spawn_blocking(move || {
                let mut store = store.lock().map_err(|_| StoreError::Poisoned)?;
                work(&mut store)
            });
            match task.await {
                Ok(result) => result,
                Err(error) => Err(StoreError::Background(error.to_string())),
            }
        })
    }
}

impl ConversationStore for InstanceLog {
    fn commit(
        &self,
        batch: Vec<MessageEvent>,
        state: &ConversationState,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let live = state.messages().len();
        let on_disk = self.events_on_disk.load(Ordering::Relaxed) + batch.len();
        let edits = batch.iter().any(|event| !matches!(event, MessageEvent::Append { .. }));
        if edits {
            // A message the export holds may have changed or gone.
            self.base_export.lock_unpoisoned().in_sync = false;
        }
        if edits && on_disk > 2 * live + self.slack || matches!(batch.last(), Some(MessageEvent::Truncate)) {
            self.events_on_disk.store(live, Ordering::Relaxed);
            let messages = state.messages().to_vec();
            self.blocking(move |store| store.rewrite(&messages))
        } else {
            self.events_on_disk.store(on_disk, Ordering::Relaxed);
            // Serialized and written on the blocking pool.
            self.blocking(move |store| store.append_events(&batch))
        }
    }

    fn turn_ended(&self, state: &ConversationState) -> BoxFuture<'static, Result<(), StoreError>> {
        let messages = state.messages();
        // Serialized here, from the state, so that nothing is copied; written
        // on the blocking pool with the turn's count.
        let (lines, append) = {
            let mut export = self.base_export.lock_unpoisoned();
            // Events not committed yet were seen by no commit: they may edit
            // what the file holds.
            let append = export.in_sync && !state.has_uncommitted() && export.exported <= messages.len();
            let mut lines = Vec::new();
            base_export_lines(&messages[if append { export.exported } else { 0 }..], &mut lines);
            *export = BaseExport { in_sync: true, exported: messages.len() };
            (lines, append)
        };
        let export = Arc::clone(&self.base_export);
        self.blocking(move |store| {
            let recorded = store.record_turn();
            if (!append || !lines.is_empty())
                && let Err(error) = store.write_base_export(&lines, append)
            {
                // An export only: the turn and its journal are unaffected.
                tracing::warn!("the conversation export (messages/base.jsonl) was not written: {error}");
                export.lock_unpoisoned().in_sync = false;
            }
            recorded
        })
    }

    fn reload(&self) -> BoxFuture<'static, Result<Option<ConversationState>, StoreError>> {
        // The state is replaced by the store's (an abandoned turn, a failed
        // commit): the next export starts over.
        self.base_export.lock_unpoisoned().in_sync = false;
        self.blocking(|store| store.load().map(|loaded| Some(loaded.state)))
    }
}
