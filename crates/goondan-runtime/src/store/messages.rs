//! The conversation log (messages.jsonl): commits of message events on the
//! journal, folded (and repaired) on load, rewritten when dead records pile up.

use std::path::Path;

use goondan_core::message::now_millis;
use goondan_core::{ConversationState, Message, MessageEvent, RepairReport};
use serde::{Deserialize, Serialize};

use super::LOG_TARGET;
use super::error::StoreError;
use super::instance::InstanceStore;

/// The messages read from an instance's log, and what was skipped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadedMessages {
    /// Every message of a complete, parsable line, in order.
    pub messages: Vec<Message>,
    /// The last line was torn (no trailing newline, or not a message) and was skipped.
    pub skipped_torn_tail: bool,
    /// Complete lines before the last that were not messages, skipped.
    pub skipped_corrupt_lines: usize,
}

/// A conversation folded from an instance's message log, and what was skipped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadedConversation {
    /// The conversation: every readable commit applied in order.
    pub state: ConversationState,
    /// Events read from the log (appends included); the runtime compares it
    /// with the live messages to decide when to rewrite the log.
    pub events_on_disk: usize,
    /// The last line was torn (no trailing newline, or unreadable) and was skipped.
    pub skipped_torn_tail: bool,
    /// Complete lines before the last that could not be read, skipped.
    pub skipped_corrupt_lines: usize,
    /// Events skipped on replay: `replace`/`remove` whose target was not in
    /// the conversation, or one that would have put a second message with an
    /// id into it (see [`ConversationState::replay`]).
    pub skipped_events: usize,
    /// What folding left breaking the conversation rule (a skipped line can
    /// take a call's result or an edit with it) and was repaired. The repairs
    /// are the state's uncommitted events: the runtime's first commit saves
    /// them, so a reload then reaches the same state.
    pub repairs: RepairReport,
}

/// One line of the message log.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum LogLine {
    Commit { events: Vec<MessageEvent> },
    Message(Message),
}

/// One line of the message log, borrowed for writing.
#[derive(Serialize)]
pub(super) struct CommitLine<'a> {
    events: &'a [MessageEvent],
}

impl InstanceStore {
    /// Reads the conversation: every commit of the log applied in order.
    ///
    /// A torn last line — no trailing newline, or unreadable — is skipped
    /// with a warning and reported in
    /// [`LoadedConversation::skipped_torn_tail`]. A line in the middle that
    /// cannot be read is skipped with a warning and counted in
    /// [`LoadedConversation::skipped_corrupt_lines`]: we keep going rather
    /// than lose the rest of the conversation. Blank lines are ignored. Only
    /// I/O failures are errors.
    pub fn load(&self) -> Result<LoadedConversation, StoreError> {
        read_message_log(&self.messages_path)
    }

    /// The messages the log holds, folded but not repaired (what was
    /// written, for inspection); [`InstanceStore::load`] gives the
    /// conversation the runtime uses.
    pub fn messages(&self) -> Result<LoadedMessages, StoreError> {
        let loaded = fold_message_log(&self.messages_path)?;
        Ok(LoadedMessages {
            messages: loaded.state.messages().to_vec(),
            skipped_torn_tail: loaded.skipped_torn_tail,
            skipped_corrupt_lines: loaded.skipped_corrupt_lines,
        })
    }

    /// Appends `messages` as one commit (see [`InstanceStore::append_events`]).
    pub fn append(&mut self, messages: &[Message]) -> Result<(), StoreError> {
        let events: Vec<MessageEvent> =
            messages.iter().map(|message| MessageEvent::Append { message: message.clone() }).collect();
        self.append_events(&events)
    }

    /// Appends one commit — `events` as one line, with one write — then
    /// syncs the log; on return the commit is durable. Then updates
    /// `updatedAt` and `messages` in instance.json.
    ///
    /// The first append cuts a torn tail left by a crash (the journal's
    /// rule: a last line without its newline, or that is not a commit). If
    /// the write or the sync fails, the log is cut back to where it was and
    /// the error returned.
    pub fn append_events(&mut self, events: &[MessageEvent]) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        let mut line = Vec::with_capacity(512 * events.len());
        let serialized = match events {
            [MessageEvent::Append { message }] => serde_json::to_writer(&mut line, message),
            _ => serde_json::to_writer(&mut line, &CommitLine { events }),
        };
        serialized.map_err(StoreError::json("serializing a commit for", &self.messages_path))?;
        line.push(b'\n');
        self.messages
            .append(&line, &[goondan_core::fault::Point::ConversationCommit])
            .map_err(|error| StoreError::from_journal(error, None))?;
        let appended = events.iter().filter(|event| matches!(event, MessageEvent::Append { .. })).count();
        self.info.messages += u64::try_from(appended).unwrap_or(u64::MAX);
        self.info.updated_at = now_millis();
        // The commit is durable: instance.json's counters are a summary,
        // and one that cannot be written now is written with the next.
        self.write_info_or_warn();
        Ok(())
    }

    /// Replaces the log with `messages`, one per line: a temp file beside
    /// it, synced, renamed over it, the directory synced. A crash leaves
    /// either the old log or the new one, which fold to the same conversation.
    pub fn rewrite(&mut self, messages: &[Message]) -> Result<(), StoreError> {
        let path = self.messages_path.clone();
        let mut lines = Vec::with_capacity(512 * messages.len());
        for message in messages {
            serde_json::to_writer(&mut lines, message).map_err(StoreError::json("serializing a message for", &path))?;
            lines.push(b'\n');
        }
        let temp = self.dir.join(format!(".{}.{}.tmp", Self::MESSAGES_FILE, std::process::id()));
        self.messages
            .rewrite(&temp, Some(goondan_core::fault::Point::ConversationCommit), |out| out.write_all(&lines))
            .map_err(|error| StoreError::from_journal(error, None))?;
        self.info.updated_at = now_millis();
        self.write_info_or_warn();
        Ok(())
    }
}

/// Folds the message log at `path` and repairs the result (see
/// [`InstanceStore::load`]) without opening the instance, for readers such
/// as tests and inspection tools.
pub fn read_message_log(path: &Path) -> Result<LoadedConversation, StoreError> {
    let mut loaded = fold_message_log(path)?;
    // Whatever the lines held, the conversation handed out keeps the rule:
    // a provider refuses a call without its result (or a result without its
    // call) on every later request, so one bad line would break the
    // instance for good.
    loaded.repairs = loaded.state.repair();
    if !loaded.repairs.is_empty() {
        tracing::warn!(
            target: LOG_TARGET,
            "{}: the conversation broke the tool call rule and was repaired: {}",
            path.display(),
            loaded.repairs
        );
    }
    Ok(loaded)
}

/// Folds the message log at `path`, skipping unreadable lines, without
/// repairing what the fold gives.
pub(super) fn fold_message_log(path: &Path) -> Result<LoadedConversation, StoreError> {
    let mut loaded = LoadedConversation::default();
    let mut events = Vec::new();
    let replayed = goondan_journal::replay::<LogLine>(path, |line| match line {
        LogLine::Message(message) => events.push(MessageEvent::Append { message }),
        LogLine::Commit { events: commit } => events.extend(commit),
    })
    .map_err(|error| StoreError::from_journal(error, Some("reading the message log")))?;
    for corrupt in &replayed.corrupt {
        tracing::warn!(target: LOG_TARGET, "{}: skipping a line that cannot be read ({corrupt})", path.display());
    }
    loaded.skipped_corrupt_lines = replayed.corrupt.len();
    if let Some(torn) = &replayed.torn {
        loaded.skipped_torn_tail = true;
        tracing::warn!(
            target: LOG_TARGET,
            "{}: skipping the torn last line ({torn}), left by an interrupted write",
            path.display()
        );
    }
    loaded.events_on_disk = events.len();
    loaded.skipped_events = loaded.state.replay(events);
    if loaded.skipped_events > 0 {
        tracing::warn!(
            target: LOG_TARGET,
            "{}: skipped {} edit(s) whose target message is not in the conversation",
            path.display(),
            loaded.skipped_events
        );
    }
    Ok(loaded)
}
