//! The in-process fake model: a script of replies (`goondan-llm`'s
//! scripted provider) that records every request it is sent, for tests
//! that run turns without a process or a socket.
//!
//! What is deliberately absent: any answer logic of its own; the script
//! decides, this only watches.

use goondan_core::sync::LockUnpoisoned;
use std::sync::Mutex;

use goondan_llm::provider::{BoxFuture, StreamSink};
use goondan_llm::scripted::{ScriptedProvider, ScriptedReply};
use goondan_llm::{ModelError, ModelProvider, ModelRequest, ModelResponse};

/// Plays a script and records every request.
#[derive(Debug)]
pub struct RecordingModel {
    inner: ScriptedProvider,
    requests: Mutex<Vec<ModelRequest>>,
}

impl RecordingModel {
    /// A model playing `replies`.
    pub fn new(replies: Vec<ScriptedReply>) -> Self {
        Self { inner: ScriptedProvider::from_replies(replies), requests: Mutex::new(Vec::new()) }
    }

    /// A model playing the replies written as JSON (a test failure if they
    /// are not a script).
    pub fn from_json(replies: serde_json::Value) -> Self {
        let replies = serde_json::from_value(replies).unwrap_or_else(|e| panic!("script: {e}"));
        Self::new(replies)
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<ModelRequest> {
        self.requests.lock_unpoisoned().clone()
    }
}

impl ModelProvider for RecordingModel {
    fn complete<'a>(
        &'a self,
        request: &'a ModelRequest,
        on_event: StreamSink<'a>,
    ) -> BoxFuture<'a, Result<ModelResponse, ModelError>> {
        self.requests.lock_unpoisoned().push(request.clone());
        self.inner.complete(request, on_event)
    }

    fn name(&self) -> &str {
        "recording"
    }
}
