//! The provider trait.

use std::future::Future;
use std::pin::Pin;

use crate::error::ModelError;
use crate::types::{ModelRequest, ModelResponse, StreamEvent};

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The future of one completion: the whole reply, or why there is none.
pub type Completion<'a> = BoxFuture<'a, Result<ModelResponse, ModelError>>;

/// Receives streaming events while a reply arrives.
pub type StreamSink<'a> = &'a (dyn Fn(StreamEvent) + Send + Sync);

/// A model behind an API (or a script).
pub trait ModelProvider: Send + Sync + std::fmt::Debug {
    /// Sends `request`, reporting text and tool-call starts to `on_event` as
    /// they arrive, and returns the whole reply.
    fn complete<'a>(&'a self, request: &'a ModelRequest, on_event: StreamSink<'a>) -> Completion<'a>;

    /// The provider's name for messages (`openai`, `anthropic`, …).
    fn name(&self) -> &str;
}
