//! The agent runtime: agents assembled from bundles, the turn/step loop and
//! durable conversations.
//!
//! - [`agent`]: the one place an agent is assembled (tooling, then model).
//! - [`context`]: what turn and step middleware see; how turns and steps end.
//! - [`turn`]: a turn — steps of model call and tool calls — ending with an answer.
//! - [`conversation`]: a conversation and the store its commits go to.
//! - [`extension`]: an agent's extensions, resolved, and the hook through
//!   which a build installs their layers and tools.
//! - [`extension_state`]: each extension's durable state (`api.state`), one
//!   JSON object per extension per instance.
//! - [`inbox`]: messages (asynchronous replies) that enter the conversation
//!   before the next model request.
//! - [`result_budget`]: how much tool output one step may put into the
//!   conversation; the rest is saved to files and previewed.
//! - [`store`]: the state root, one directory per instance with its message
//!   log (message events) and event log.
//! - [`tasks`]: the instance's tasks (pending results that complete later),
//!   durable beside its conversation.
//!
//! Architecture invariant: this crate implements no tool and no extension.
//! Handlers and extensions come in through [`extension::AgentPlugin`]s;
//! `gdn` plugs in the built-ins.

pub mod agent;
pub mod context;
pub mod conversation;
pub mod extension;
pub mod extension_state;
pub mod inbox;
pub mod result_budget;
pub mod sandbox;
pub mod store;
pub mod tasks;
pub mod turn;

pub use agent::{AgentBuildError, AgentOptions, AgentTooling, ScopeIds, assemble_tooling, build_agent, identity};
pub use context::{
    EventEmitter, EventNameError, LayerFailure, Pipeline, StepContext, StepFailure, StepOutcome, TurnContext, TurnEnd,
    TurnOutcome,
};
pub use conversation::{Conversation, ConversationStore, InstanceLog};
pub use extension_state::{ExtensionStateError, ExtensionStateStore};
pub use inbox::Inbox;
pub use turn::{Agent, ModelIdentity, NoObserver, TurnInput, TurnObserver};
