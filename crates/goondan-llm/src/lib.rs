//! Model providers: one trait, [`ModelProvider`], and its implementations
//! for the OpenAI-compatible APIs (Chat Completions, and Responses when a
//! Model's options select it), Anthropic's Messages API, Google's Gemini
//! `generateContent`, and a deterministic [`scripted`] provider for offline
//! examples and tests.
//!
//! A provider receives the conversation as provider-neutral
//! [`goondan_core::MessageData`] plus the step's tool definitions, streams
//! text as it arrives, and returns the reply with its raw tool calls (the
//! arguments as the text the model produced, which may not be valid JSON —
//! the turn loop decides what to do with that).

pub mod config;
pub mod error;
pub mod http;
pub mod pricing;
pub mod provider;
pub mod scripted;
pub mod types;
mod wire;

pub mod anthropic;
pub mod google;
pub mod openai;

pub use config::{ModelSettings, ProviderKind, Secret, build_provider};
pub use error::ModelError;
pub use provider::{Completion, ModelProvider};
pub use types::{
    ModelParams, ModelRequest, ModelResponse, RawToolCall, StopReason, StreamEvent, TokenUsage, ToolDefinition,
};

// The mock servers and helpers the integration tests use, shared with the
// unit tests; they name this crate as the integration tests do.
#[cfg(test)]
extern crate self as goondan_llm;
#[cfg(test)]
#[path = "../tests/common/mod.rs"]
mod test_support;
