//! Plain data shared by every goondan-rs crate.
//!
//! Nothing here performs I/O. The types mirror the wire shapes of the Goondan
//! specification (spec 002 §6–§8, §11 and appendix A) so they serialize to
//! exactly the JSON the original TypeScript runtime produces.

pub mod address;
pub mod codes;
pub mod conversation;
pub mod fault;
pub mod help;
pub mod host_port;
pub mod ids;
pub mod js_message;
pub mod message;
pub mod naming;
pub mod object_ref;
pub mod package_dir;
pub mod path_io;
pub mod secret;
pub mod sync;
#[cfg(feature = "tls")]
pub mod tls;
pub mod tool;

pub use conversation::{ConversationState, MessageEvent, MessageEventError, RepairReport};
pub use js_message::{JsMessageError, message_event_from_js, message_from_js};
pub use message::{Message, MessageData, MessageSource};
pub use object_ref::{ObjectRef, ObjectRefError, json_type_name};
pub use path_io::PathIoError;
pub use tool::{ToolCall, ToolError, ToolResult, ToolStatus, truncate_error_message};

/// Any JSON value.
pub type JsonValue = serde_json::Value;
/// A JSON object with insertion order preserved.
pub type JsonObject = serde_json::Map<String, serde_json::Value>;

/// The `apiVersion` every resource of this generation of Goondan carries.
pub const API_VERSION: &str = "goondan.ai/v1";

/// Default `Tool.spec.errorMessageLimit` (spec 002 §8.3 rule 2).
pub const DEFAULT_ERROR_MESSAGE_LIMIT: usize = 1000;
