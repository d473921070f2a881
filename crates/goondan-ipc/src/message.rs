//! The messages: one tagged enum, `type` naming the variant, the rest of the
//! spec's envelope (`from`, `to`, `correlationId`, `payload`) in [`Routed`].
//!
//! ```text
//! agent ─► orchestrator   hello (pid) · ready · delegate · event · delegate_result ·
//!                         call (spawn | list) · cancel · observe · shutdown_ack
//! orchestrator ─► agent   init · delegate · event · delegate_result · call_result · cancel · shutdown
//! ```
//!
//! `from` and `to` name agent instances as `agent@instanceKey`
//! ([`AgentInstance`]), the orchestrator as [`ORCHESTRATOR`] and the person at
//! the terminal as [`CLI`]. A `delegate` names its target agent in `to` and
//! the target's instance in its payload (the spec's `to` is an agent name).

use std::collections::BTreeMap;
use std::fmt;

use goondan_core::{JsonObject, JsonValue};
use serde::{Deserialize, Serialize};

/// The orchestrator's name in `from` / `to`.
pub const ORCHESTRATOR: &str = "orchestrator";
/// The terminal user's name in `from` / `to` (`gdn run`'s input).
pub const CLI: &str = "cli";

/// One message between the orchestrator and an agent process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum IpcMessage {
    /// A new agent process introduces itself (first frame on its connection).
    Hello(Routed<HelloPayload>),
    /// What the agent process is to run (answer to `hello`).
    Init(Routed<InitPayload>),
    /// The agent process is ready for messages (or could not start).
    Ready(Routed<ReadyPayload>),
    /// A request that wants an answer: run a turn with this input, reply with
    /// `delegate_result` under the same correlation id.
    Delegate(Routed<DelegatePayload>),
    /// The answer to a `delegate`.
    DelegateResult(Routed<DelegateResultPayload>),
    /// A message that wants no answer (`agents__send`): run a turn with it.
    Event(Routed<DelegatePayload>),
    /// The caller of the `delegate` with this correlation id gave up on it.
    Cancel(Routed<CancelPayload>),
    /// A question for the orchestrator itself (spawn, list, catalog).
    Call(Routed<CallPayload>),
    /// The answer to a `call`.
    CallResult(Routed<CallResultPayload>),
    /// Progress of a turn, for the terminal: who is acting and what it does.
    Observe(Routed<ObservePayload>),
    /// Stop: finish or cancel the running turn, end tool processes, exit.
    Shutdown(Routed<ShutdownPayload>),
    /// The agent process is about to exit after a `shutdown`.
    ShutdownAck(Routed<ShutdownAckPayload>),
    /// The operator cancels a task of the instance (`gdn task cancel`).
    TaskCancel(Routed<TaskCancelPayload>),
}

impl IpcMessage {
    /// The message's `type`, as on the wire.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Hello(_) => "hello",
            Self::Init(_) => "init",
            Self::Ready(_) => "ready",
            Self::Delegate(_) => "delegate",
            Self::DelegateResult(_) => "delegate_result",
            Self::Event(_) => "event",
            Self::Cancel(_) => "cancel",
            Self::Call(_) => "call",
            Self::CallResult(_) => "call_result",
            Self::Observe(_) => "observe",
            Self::Shutdown(_) => "shutdown",
            Self::ShutdownAck(_) => "shutdown_ack",
            Self::TaskCancel(_) => "task_cancel",
        }
    }
}

/// The spec's envelope around a payload.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Routed<P> {
    /// The sender.
    #[serde(default)]
    pub from: String,
    /// The receiver.
    #[serde(default)]
    pub to: String,
    /// Ties a reply to its request (and a turn to its caller's trace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<String>,
    /// The message itself.
    pub payload: P,
}

impl<P> Routed<P> {
    /// An envelope without a correlation id.
    pub fn new(from: impl Into<String>, to: impl Into<String>, payload: P) -> Self {
        Self { from: from.into(), to: to.into(), correlation_id: None, payload }
    }

    /// The same envelope with `correlation_id`.
    #[must_use]
    pub fn correlated(mut self, correlation_id: impl Into<String>) -> Self {
        self.correlation_id = Some(correlation_id.into());
        self
    }
}

/// An agent instance: `agent@instanceKey`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentInstance {
    /// The Agent resource's name.
    pub agent: String,
    /// The instance key.
    pub instance_key: String,
}

impl AgentInstance {
    /// `agent`'s instance `instance_key`.
    pub fn new(agent: impl Into<String>, instance_key: impl Into<String>) -> Self {
        Self { agent: agent.into(), instance_key: instance_key.into() }
    }

    /// Reads `agent@instanceKey` (the key may itself contain `@`; agent names cannot).
    pub fn parse(node: &str) -> Option<Self> {
        let (agent, key) = node.split_once('@')?;
        (!agent.is_empty()).then(|| Self::new(agent, key))
    }
}

impl fmt::Display for AgentInstance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.agent, self.instance_key)
    }
}

/// `hello`: a started agent process says its pid, once it has made itself
/// safe to receive secrets (its channel is a socket pair only it holds; it
/// is no longer dumpable). `init` answers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HelloPayload {
    /// The process id.
    pub pid: u32,
}

/// `init`: everything an agent process needs to run its instance.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitPayload {
    /// The bundle (directory or goondan.yaml), absolute.
    pub config: String,
    /// The instance to run.
    pub instance: AgentInstance,
    /// The working directory of its tools, absolute; the bundle's directory when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// The state root, absolute.
    pub state_root: String,
    /// Secret variables (API keys, tokens) and `--env-file` entries: they come
    /// over the channel, never through the process environment, so that the
    /// commands tools run cannot read them.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The deadline of one tool call, in milliseconds (none when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_timeout_ms: Option<u64>,
    /// The swarm the instance belongs to.
    pub swarm: SwarmInfo,
}

impl fmt::Debug for InitPayload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Names only: the values are secrets.
        f.debug_struct("InitPayload")
            .field("config", &self.config)
            .field("instance", &self.instance)
            .field("workdir", &self.workdir)
            .field("state_root", &self.state_root)
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("tool_timeout_ms", &self.tool_timeout_ms)
            .field("swarm", &self.swarm)
            .finish()
    }
}

/// The swarm as the `agents` tool's catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SwarmInfo {
    /// The Swarm resource's name.
    pub name: String,
    /// Its entry agent.
    pub entry_agent: String,
    /// Its agents, sorted.
    pub agents: Vec<String>,
}

impl SwarmInfo {
    /// The `agents__catalog` output for `self_agent`: the swarm's agents, and
    /// those it can call (all but itself), as the original shapes it.
    pub fn catalog(&self, self_agent: &str) -> JsonValue {
        let callable: Vec<&String> = self.agents.iter().filter(|agent| *agent != self_agent).collect();
        serde_json::json!({
            "swarmName": self.name,
            "entryAgent": self.entry_agent,
            "selfAgent": self_agent,
            "availableCount": self.agents.len(),
            "callableCount": callable.len(),
            "availableAgents": self.agents,
            "callableAgents": callable,
        })
    }
}

/// `ready`: the instance is loaded and takes messages; or why it could not start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadyPayload {
    /// The process id.
    pub pid: u32,
    /// Why the agent could not start (then the process exits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
}

/// Who a message comes from, as the receiving turn sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageSourceInfo {
    /// `agent` or `cli`.
    pub kind: String,
    /// The sending agent (or `cli`).
    pub name: String,
    /// The sending agent's instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_key: Option<String>,
}

/// `delegate` and `event`: input for a turn of the target instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DelegatePayload {
    /// The event's id.
    pub event_id: String,
    /// The event type (`agent.request`, `agent.send`, or the caller's).
    pub event_type: String,
    /// The target's instance key.
    pub instance_key: String,
    /// The input text.
    pub input: String,
    /// The caller's metadata.
    #[serde(default)]
    pub metadata: JsonObject,
    /// The caller's trace, which the target's turn continues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// The W3C `traceparent` of the span that sent it (the caller's tool
    /// call, a connector's event): the target's turn is its child. The hub
    /// passes it on untouched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The caller does not wait: the reply is delivered into its conversation.
    #[serde(default, rename = "async")]
    pub asynchronous: bool,
    /// How many agent-to-agent hops led here (1 for a request from the
    /// entry agent's turn).
    #[serde(default)]
    pub hops: u32,
    /// Who sent it.
    pub source: MessageSourceInfo,
    /// The caller's tool call id (the correlation of the request, spec 002 §9.3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

/// Whether a `delegate` was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResultStatus {
    /// The target's turn answered.
    Ok,
    /// It did not; see the error.
    Error,
    /// The caller's deadline passed first.
    Timeout,
}

/// `delegate_result`: the target's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DelegateResultPayload {
    /// Answered or not.
    pub status: ResultStatus,
    /// The target turn's final text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<String>,
    /// Why it was not answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
    /// How the target's turn went.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<Box<TurnSummary>>,
    /// The responding instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub responder: Option<AgentInstance>,
    /// For the answer of an asynchronous request: the request, so that a
    /// caller whose process was started again since (and so no longer
    /// remembers it) still puts the answer into its conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<AsyncRequestEcho>,
}

/// What an asynchronous request's answer carries of the request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AsyncRequestEcho {
    /// The agent it went to.
    pub target: String,
    /// Its event id.
    pub event_id: String,
    /// Its event type.
    pub event_type: String,
    /// Its metadata.
    #[serde(default)]
    pub metadata: JsonObject,
    /// The caller's trace.
    #[serde(default)]
    pub trace_id: String,
}

impl DelegateResultPayload {
    /// An error answer.
    pub fn error(code: &str, message: impl Into<String>) -> Self {
        Self::failed(ErrorInfo::new(code, message))
    }

    /// An error answer carrying `error`.
    pub fn failed(error: ErrorInfo) -> Self {
        Self {
            status: ResultStatus::Error,
            response: None,
            error: Some(error),
            turn: None,
            responder: None,
            request: None,
        }
    }
}

/// How a turn ended, for the caller and the terminal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnSummary {
    /// The turn's id.
    pub turn_id: String,
    /// `answered`, `cancelled`, `stepLimit`, …
    pub end: String,
    /// What went wrong, if anything.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Steps taken.
    pub steps: u32,
    /// Token usage.
    #[serde(default)]
    pub usage: JsonValue,
    /// The turn asked for the agent to be restarted.
    #[serde(default)]
    pub restart_requested: bool,
    /// For `modelFailed`: the kind of failure (`network`, `unauthorized`,
    /// `missing_key`, …), which decides `gdn run`'s exit code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_error_kind: Option<String>,
    /// The handles of the instance's tasks still working when the turn
    /// ended (their ends come as turns of their own).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks_working: Vec<String>,
}

/// A structured error on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorInfo {
    /// A stable code (`AGENT_NOT_FOUND`, `CIRCULAR_CALL_DETECTED`, …).
    pub code: String,
    /// What happened.
    pub message: String,
    /// What to do about it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suggestion: Option<String>,
    /// Where the code is explained: its entry in the help catalog
    /// (`docs/ERRORS.md`, `gdn help CODE`). Optional on the wire: a peer
    /// that does not send it is read as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub help_url: Option<String>,
}

impl ErrorInfo {
    /// An error with `code` and `message`, linked to the code's help entry
    /// when the catalog has one.
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_owned(),
            message: message.into(),
            suggestion: None,
            help_url: goondan_core::help::help_url(code),
        }
    }

    /// The same error with a suggestion.
    #[must_use]
    pub fn suggest(mut self, suggestion: impl Into<String>) -> Self {
        self.suggestion = Some(suggestion.into());
        self
    }
}

/// `cancel`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CancelPayload {
    /// Why (`timeout`, `interrupted`, …).
    pub reason: String,
}

/// `task_cancel`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskCancelPayload {
    /// The task's handle.
    pub handle: String,
}

/// `call`: what an agent asks the orchestrator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum CallPayload {
    /// `agents__spawn`.
    #[serde(rename_all = "camelCase")]
    Spawn {
        /// The agent.
        target: String,
        /// Its instance key (generated when absent).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        instance_key: Option<String>,
        /// Its working directory, inside the caller's.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<String>,
        /// The caller's working directory, which `cwd` must stay inside.
        caller_workdir: String,
    },
    /// `agents__list`.
    #[serde(rename_all = "camelCase")]
    List {
        /// Every instance, not only the caller's.
        include_all: bool,
    },
}

/// `call_result`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallResultPayload {
    /// The answer (the tool's output).
    #[serde(default)]
    pub output: JsonValue,
    /// Or why there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorInfo>,
}

/// `observe`: a turn's progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ObservePayload {
    /// A turn began (for whom).
    #[serde(rename_all = "camelCase")]
    TurnStarted {
        /// Who asked.
        source: MessageSourceInfo,
    },
    /// More reply text.
    TextDelta {
        /// The text.
        text: String,
    },
    /// A step's tool calls started running (sent for the terminal's own
    /// turns only, so that it can show what runs).
    #[serde(rename_all = "camelCase")]
    ToolsRunning {
        /// The tools.
        names: Vec<String>,
    },
    /// A tool call finished.
    #[serde(rename_all = "camelCase")]
    ToolFinished {
        /// The tool.
        name: String,
        /// `ok`, `error`, `pending`.
        status: String,
        /// Its error code.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_code: Option<String>,
    },
    /// The turn ended.
    TurnEnded {
        /// How.
        summary: TurnSummary,
    },
    /// The process has nothing to do: no turn runs and none is queued. For
    /// the orchestrator (which stops idle processes), not the terminal.
    Idle {
        /// How many `delegate` and `event` messages it has taken so far: it
        /// is idle only if that is every one the orchestrator has sent it.
        jobs: u64,
        /// How many `delegate_result` messages it has taken in so far: each
        /// is in its conversation (saved) or was not wanted any more, so a
        /// transport that redelivers what it was not told of (NATS) can
        /// acknowledge them. Absent from older processes: 0.
        #[serde(default)]
        answers: u64,
    },
}

/// `shutdown`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownPayload {
    /// How long the orchestrator waits before it kills the process.
    pub grace_period_ms: u64,
    /// Why.
    pub reason: String,
}

/// `shutdown_ack`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownAckPayload {}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_error_carries_the_help_url_of_its_code_and_reads_without_one() {
        let crashed = ErrorInfo::new(crate::codes::AGENT_CRASHED, "gone");
        assert_eq!(
            serde_json::to_value(&crashed).ok(),
            Some(json!({"code": "AGENT_CRASHED", "message": "gone",
                "helpUrl": "https://github.com/goondan/goondan-rs/blob/main/docs/ERRORS.md#agent_crashed"}))
        );
        // A code the catalog does not know gets no link.
        assert_eq!(ErrorInfo::new("SOMETHING_ELSE", "x").help_url, None);
        // A peer that sends no helpUrl is read as before.
        let old: Result<ErrorInfo, _> = serde_json::from_value(json!({"code": "AGENT_CRASHED", "message": "gone"}));
        assert_eq!(old.ok().map(|e| e.help_url), Some(None));
    }

    #[test]
    fn the_envelope_is_the_specs_shape() {
        let message = IpcMessage::Delegate(
            Routed::new(
                "coordinator@default",
                "worker",
                DelegatePayload {
                    event_id: "e1".into(),
                    event_type: "agent.request".into(),
                    instance_key: "default".into(),
                    input: "hi".into(),
                    metadata: JsonObject::new(),
                    trace_id: None,
                    traceparent: None,
                    asynchronous: false,
                    hops: 1,
                    source: MessageSourceInfo {
                        kind: "agent".into(),
                        name: "coordinator".into(),
                        instance_key: Some("default".into()),
                    },
                    tool_call_id: None,
                },
            )
            .correlated("corr-1"),
        );
        let value = serde_json::to_value(&message).unwrap_or_default();
        assert_eq!(value["type"], "delegate");
        assert_eq!(value["from"], "coordinator@default");
        assert_eq!(value["to"], "worker");
        assert_eq!(value["correlationId"], "corr-1");
        assert_eq!(value["payload"]["async"], false);
        let back: IpcMessage = serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, message);
    }

    #[test]
    fn calls_and_observations_are_tagged() {
        let call = IpcMessage::Call(Routed::new("a@k", ORCHESTRATOR, CallPayload::List { include_all: true }));
        let value = serde_json::to_value(&call).unwrap_or_default();
        assert_eq!(value["payload"], json!({"op": "list", "includeAll": true}));
        let unknown = json!({"type": "teleport", "from": "a", "to": "b", "payload": {}});
        assert!(serde_json::from_value::<IpcMessage>(unknown).is_err());
    }

    #[test]
    fn secrets_never_reach_debug_output() {
        let init = InitPayload {
            config: "/b".into(),
            instance: AgentInstance::new("a", "k"),
            workdir: None,
            state_root: "/s".into(),
            env: BTreeMap::from([("OPENAI_API_KEY".to_owned(), "sk-secret".to_owned())]),
            tool_timeout_ms: None,
            swarm: SwarmInfo { name: "s".into(), entry_agent: "a".into(), agents: vec!["a".into()] },
        };
        let shown = format!("{init:?}");
        assert!(shown.contains("OPENAI_API_KEY") && !shown.contains("sk-secret"), "{shown}");
    }

    #[test]
    fn the_catalog_excludes_the_caller_from_callable_agents() {
        let swarm = SwarmInfo { name: "s".into(), entry_agent: "a".into(), agents: vec!["a".into(), "b".into()] };
        let catalog = swarm.catalog("a");
        assert_eq!(catalog["callableAgents"], json!(["b"]));
        assert_eq!(catalog["availableCount"], 2);
    }

    #[test]
    fn instance_names_parse_back() {
        let instance = AgentInstance::new("worker", "user@example");
        assert_eq!(AgentInstance::parse(&instance.to_string()), Some(instance));
        assert_eq!(AgentInstance::parse("@k"), None);
    }
}
