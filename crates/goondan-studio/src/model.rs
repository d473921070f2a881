//! What `gdn studio` knows of a state root: every workspace's durable logs
//! read into one index per project (entries in time order, per instance
//! key, per trace; edges with counts), kept up to date by reading what the
//! files gain ([`Store::refresh`]). It only reads: nothing under the state
//! root is created, locked or written.
//!
//! Sources, per workspace (`<state>/workspaces/<id>/`):
//! - `ingress/inbox.jsonl`: a connector's event accepted (`connector.accepted`,
//!   an edge connector → agent), dropped, and its turn's outcome;
//! - `instances/<agent>@<key>/messages.jsonl`: the inputs (a person's, a
//!   connector's, another agent's) and the agent's text answers;
//! - `instances/<agent>@<key>/events.jsonl`: turns, steps, tool calls
//!   (edges agent → tool, with errors), handoffs (`agent.request.sent`: an
//!   edge agent → agent; `agent.response.sent`: back);
//! - `instances/<agent>@<key>/tasks.jsonl`: pending results (opened, ended);
//! - `instances/<agent>@<key>/instance.json` and its `lock` (running or idle).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use goondan_core::JsonValue;
use serde_json::{Map, json};

/// How many entries of an edge's history are kept (the newest).
pub const EDGE_HISTORY: usize = 50;
/// The longest text kept of a message.
const DETAIL_CHARS: usize = 600;

/// What an entry is, as the original names its timeline entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A message of a conversation.
    Message,
    /// A runtime event of an agent instance.
    RuntimeEvent,
    /// A connector's event in the service's inbox.
    ConnectorLog,
    /// A pending result's task.
    Task,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Message => "message",
            Self::RuntimeEvent => "runtime-event",
            Self::ConnectorLog => "connector-log",
            Self::Task => "task",
        }
    }
}

/// Token counts of a turn.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
    pub total: u64,
}

/// One line of the timeline.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its number in the project (stable while the project is not re-read).
    pub seq: u32,
    /// Milliseconds since the Unix epoch.
    pub at: u64,
    pub kind: Kind,
    /// The instance key.
    pub key: Arc<str>,
    /// The agent whose log it comes from (none for the inbox).
    pub agent: Option<Arc<str>>,
    pub subtype: String,
    /// A participant id: `agent:NAME`, `connector:CONNECTION`, `tool:NAME`, `user:cli`, `task:HANDLE`.
    pub source: String,
    pub target: Option<String>,
    pub detail: String,
    pub trace_id: Option<Arc<str>>,
    pub span_id: Option<String>,
    pub parent_span_id: Option<String>,
    /// Milliseconds.
    pub duration: Option<f64>,
    pub tokens: Option<Tokens>,
    pub status: Option<String>,
    pub error_code: Option<String>,
    pub tool_call_id: Option<String>,
    pub turn_id: Option<String>,
    pub step_id: Option<String>,
    pub correlation_id: Option<String>,
}

impl Entry {
    /// Within one millisecond, a message's receipt after its sending.
    pub fn order(&self) -> (u64, bool, u32) {
        (self.at, self.subtype.ends_with(".received"), self.seq)
    }

    /// Whether it reports a failure.
    pub fn failed(&self) -> bool {
        self.subtype.ends_with(".failed") || self.status.as_deref() == Some("error")
    }

    /// The original's `TimelineEntry`, with this implementation's extra fields.
    pub fn to_json(&self) -> JsonValue {
        let mut map = Map::new();
        map.insert("seq".into(), json!(self.seq));
        map.insert("at".into(), json!(iso(self.at)));
        map.insert("atMs".into(), json!(self.at));
        map.insert("kind".into(), json!(self.kind.as_str()));
        map.insert("source".into(), json!(self.source));
        if let Some(target) = &self.target {
            map.insert("target".into(), json!(target));
        }
        map.insert("subtype".into(), json!(self.subtype));
        map.insert("detail".into(), json!(self.detail));
        map.insert("instanceKey".into(), json!(&*self.key));
        let optional = [
            ("agent", self.agent.as_deref()),
            ("traceId", self.trace_id.as_deref()),
            ("spanId", self.span_id.as_deref()),
            ("parentSpanId", self.parent_span_id.as_deref()),
            ("status", self.status.as_deref()),
            ("errorCode", self.error_code.as_deref()),
            ("toolCallId", self.tool_call_id.as_deref()),
            ("turnId", self.turn_id.as_deref()),
            ("correlationId", self.correlation_id.as_deref()),
        ];
        for (name, value) in optional {
            if let Some(value) = value.filter(|v| !v.is_empty()) {
                map.insert(name.into(), json!(value));
            }
        }
        if let Some(duration) = self.duration {
            map.insert("duration".into(), json!(duration));
        }
        if let Some(tokens) = self.tokens {
            map.insert("tokenUsage".into(), tokens_json(tokens));
        }
        JsonValue::Object(map)
    }
}

fn tokens_json(tokens: Tokens) -> JsonValue {
    json!({"promptTokens": tokens.input, "completionTokens": tokens.output, "totalTokens": tokens.total})
}

/// `2026-11-26T21:39:45.123Z`.
pub fn iso(ms: u64) -> String {
    goondan_core::js_message::format_rfc3339_millis(ms)
}

/// A participant of the graph.
#[derive(Debug, Clone)]
pub struct Participant {
    pub id: String,
    pub label: String,
    pub kind: &'static str,
    pub last_seen: u64,
    pub order: usize,
}

/// An edge between two participants, counted.
#[derive(Debug, Clone, Default)]
pub struct Edge {
    pub a: String,
    pub b: String,
    pub forward: u64,
    pub backward: u64,
    pub errors: u64,
    pub last_seen: u64,
    /// The newest entries (seq), at most [`EDGE_HISTORY`].
    pub history: VecDeque<u32>,
}

/// The graph of a scope (a project or one instance key).
#[derive(Debug, Clone)]
pub struct Graph {
    pub participants: HashMap<String, Participant>,
    pub edges: HashMap<String, Edge>,
    /// While a project is first read (file after file, not in time order)
    /// every entry is kept; then the newest [`EDGE_HISTORY`] by time.
    history_cap: usize,
}

impl Graph {
    /// Keeps the newest [`EDGE_HISTORY`] entries of each edge by time, from now on.
    fn trim(&mut self, entries: &[Entry]) {
        for edge in self.edges.values_mut() {
            let mut list: Vec<u32> = edge.history.drain(..).collect();
            list.sort_by_key(|s| entries[*s as usize].order());
            let skip = list.len().saturating_sub(EDGE_HISTORY);
            edge.history = list.into_iter().skip(skip).collect();
        }
        self.history_cap = EDGE_HISTORY;
    }
}

impl Default for Graph {
    fn default() -> Self {
        Self { participants: HashMap::new(), edges: HashMap::new(), history_cap: usize::MAX }
    }
}

impl Graph {
    fn participant(&mut self, id: &str, at: u64) {
        let order = self.participants.len();
        let entry = self.participants.entry(id.to_owned()).or_insert_with(|| {
            let (kind, label) = id.split_once(':').unwrap_or(("unknown", id));
            let kind = match kind {
                "agent" => "agent",
                "connector" => "connector",
                "tool" => "tool",
                "user" => "user",
                "task" => "task",
                "system" => "system",
                _ => "unknown",
            };
            Participant { id: id.to_owned(), label: label.to_owned(), kind, last_seen: at, order }
        });
        entry.last_seen = entry.last_seen.max(at);
    }

    fn edge(&mut self, from: &str, to: &str, entry: &Entry) {
        self.participant(from, entry.at);
        self.participant(to, entry.at);
        let forward = from <= to;
        let (a, b) = if forward { (from, to) } else { (to, from) };
        let key = format!("{a}|{b}");
        let edge =
            self.edges.entry(key).or_insert_with(|| Edge { a: a.to_owned(), b: b.to_owned(), ..Edge::default() });
        if forward {
            edge.forward += 1;
        } else {
            edge.backward += 1;
        }
        edge.last_seen = edge.last_seen.max(entry.at);
        edge.history.push_back(entry.seq);
        if edge.history.len() > self.history_cap {
            edge.history.pop_front();
        }
    }

    fn error(&mut self, from: &str, to: &str) {
        let (a, b) = if from <= to { (from, to) } else { (to, from) };
        if let Some(edge) = self.edges.get_mut(&format!("{a}|{b}")) {
            edge.errors += 1;
        }
    }
}

/// A trace, summed up as it grows.
#[derive(Debug, Clone, Default)]
pub struct TraceSummary {
    pub started: u64,
    pub ended: u64,
    pub agents: Vec<Arc<str>>,
    pub keys: Vec<Arc<str>>,
    pub turns: u32,
    pub tool_calls: u32,
    pub errors: u32,
    /// Turns started and not ended.
    pub open_turns: i32,
    /// Entries (seq) of the trace.
    pub entries: Vec<u32>,
}

/// A pending result's task (from `tasks.jsonl`).
#[derive(Debug, Clone)]
pub struct Task {
    pub handle: String,
    pub agent: Arc<str>,
    pub key: Arc<str>,
    pub tool: String,
    pub call_id: String,
    pub turn_id: String,
    pub created: u64,
    pub ended: Option<(u64, String)>,
}

/// A log file read so far.
#[derive(Debug)]
struct Tail {
    path: PathBuf,
    source: Source,
    /// How far it was read (the journal's incremental reader).
    reader: goondan_journal::Tail,
}

#[derive(Debug, Clone)]
enum Source {
    Inbox,
    Messages { agent: Arc<str>, key: Arc<str> },
    Events { agent: Arc<str>, key: Arc<str> },
    Tasks { agent: Arc<str>, key: Arc<str> },
}

/// An agent instance, from its `instance.json`.
#[derive(Debug, Clone)]
pub struct Instance {
    pub agent: Arc<str>,
    pub key: Arc<str>,
    pub dir: PathBuf,
    pub created: u64,
    pub updated: u64,
    pub turns: u64,
}

/// One workspace, read.
#[derive(Debug, Default)]
pub struct Project {
    pub id: String,
    pub name: String,
    pub bundle: String,
    pub dir: PathBuf,
    tails: Vec<Tail>,
    /// Each tail's index, by path.
    tail_index: HashMap<PathBuf, usize>,
    /// Every entry, by seq.
    pub entries: Vec<Entry>,
    /// Every entry's seq in time order.
    pub order: Vec<u32>,
    /// Per instance key, in time order.
    pub by_key: HashMap<Arc<str>, Vec<u32>>,
    pub graph: Graph,
    pub key_graphs: HashMap<Arc<str>, Graph>,
    pub traces: HashMap<Arc<str>, TraceSummary>,
    pub instances: BTreeMap<(Arc<str>, Arc<str>), Instance>,
    pub tasks: HashMap<String, Task>,
    /// A handoff's correlation id → the turn it started (trace id, turn span id).
    pub turn_of_request: HashMap<String, (Arc<str>, String)>,
    /// A handoff's correlation id → the tool call that sent it (trace, tool call id, agent).
    pub request_call: HashMap<String, (Arc<str>, String)>,
    /// A connector delivery's correlation id → the inbox accept entry (seq).
    pub delivery_of_request: HashMap<String, u32>,
    /// The inbox's accepted events: delivery key → accept entry (seq).
    inbox_by_key: HashMap<String, u32>,
    /// The inbox's seq → its accept entry (seq).
    inbox_by_seq: HashMap<u64, u32>,
    /// Per events file: the correlation id of the last request received and not yet turned into a turn.
    awaiting_turn: HashMap<PathBuf, String>,
    /// Per messages file: the last inbound source (for the target of answers).
    last_inbound: HashMap<PathBuf, String>,
    /// A connector delivery's correlation id → its connection (for answers sent back).
    connection_of_request: HashMap<String, String>,
    /// Set when a file was rewritten (compacted): the project is read again.
    pub stale: bool,
    /// Set once the first read is done.
    loaded: bool,
}

impl Project {
    fn open(dir: &Path) -> Option<Self> {
        let text = std::fs::read_to_string(dir.join("workspace.json")).ok()?;
        let info: JsonValue = serde_json::from_str(&text).ok()?;
        let id = dir.file_name()?.to_string_lossy().into_owned();
        let s = |name: &str| info.get(name).and_then(JsonValue::as_str).unwrap_or("").to_owned();
        let mut project = Self { name: s("name"), bundle: s("bundle"), id, dir: dir.to_path_buf(), ..Self::default() };
        project.discover();
        let mut fresh = Vec::new();
        for index in 0..project.tails.len() {
            project.read_tail(index, &mut fresh);
        }
        project.sort_all();
        project.loaded = true;
        Some(project)
    }

    /// Finds files not followed yet (new instances).
    fn discover(&mut self) -> bool {
        let mut found = false;
        let mut new_instances = Vec::new();
        let index = &mut self.tail_index;
        let mut add = |tails: &mut Vec<Tail>, path: PathBuf, source: Source| {
            if !index.contains_key(&path) {
                index.insert(path.clone(), tails.len());
                tails.push(Tail { reader: goondan_journal::Tail::new(&path), path, source });
                found = true;
            }
        };
        add(&mut self.tails, self.dir.join(goondan_ingress::inbox::INBOX_FILE), Source::Inbox);
        let workspace = goondan_runtime::store::Workspace::at(&self.dir);
        for (agent, key, dir) in workspace.instance_dirs() {
            let agent: Arc<str> = Arc::from(agent);
            let key: Arc<str> = Arc::from(key);
            // Messages before events: an answer's connector is known from its input.
            add(
                &mut self.tails,
                dir.join("messages.jsonl"),
                Source::Messages { agent: Arc::clone(&agent), key: Arc::clone(&key) },
            );
            add(
                &mut self.tails,
                dir.join("events.jsonl"),
                Source::Events { agent: Arc::clone(&agent), key: Arc::clone(&key) },
            );
            add(
                &mut self.tails,
                dir.join("tasks.jsonl"),
                Source::Tasks { agent: Arc::clone(&agent), key: Arc::clone(&key) },
            );
            if !self.instances.contains_key(&(Arc::clone(&agent), Arc::clone(&key))) {
                new_instances.push((agent, key, dir));
            }
        }
        for (agent, key, dir) in new_instances {
            self.read_instance(&agent, &key, &dir);
        }
        found
    }

    fn read_instance(&mut self, agent: &Arc<str>, key: &Arc<str>, dir: &Path) {
        let info: JsonValue = std::fs::read_to_string(dir.join("instance.json"))
            .ok()
            .and_then(|text| serde_json::from_str(&text).ok())
            .unwrap_or(JsonValue::Null);
        let n = |name: &str| info.get(name).and_then(JsonValue::as_u64).unwrap_or(0);
        self.instances.insert(
            (Arc::clone(agent), Arc::clone(key)),
            Instance {
                agent: Arc::clone(agent),
                key: Arc::clone(key),
                dir: dir.to_path_buf(),
                created: n("createdAt"),
                updated: n("updatedAt"),
                turns: n("turns"),
            },
        );
    }

    /// Reads what the files named by change notifications gained; `None`
    /// when a path is not one this project follows or can ignore (a new
    /// instance, a file being renamed into place): then a whole
    /// [`Project::refresh`] is needed. `Some(false)`: a file was rewritten.
    fn refresh_files(&mut self, paths: &[PathBuf], fresh: &mut Vec<u32>) -> Option<bool> {
        let mut changed = Vec::new();
        for path in paths {
            if let Some(&index) = self.tail_index.get(path) {
                let before = self.tails[index].reader.offset();
                self.read_tail(index, fresh);
                if self.stale {
                    return Some(false);
                }
                if self.tails[index].reader.offset() != before
                    && let Source::Events { agent, key } | Source::Messages { agent, key } = &self.tails[index].source
                {
                    changed.push((Arc::clone(agent), Arc::clone(key)));
                }
                continue;
            }
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let parent = path.parent().and_then(Path::file_name).map(|n| n.to_string_lossy().into_owned());
            let ignored = matches!(name.as_str(), "lock" | "service.json" | "service.sock" | "instance.json")
                || name.ends_with(".lock")
                || name.ends_with(".log")
                || matches!(parent.as_deref(), Some("extensions" | "logs" | "tasks"));
            if name == "instance.json"
                && let Some(dir) = path.parent()
                && let Some((agent, key)) = parent.as_deref().and_then(goondan_runtime::store::parse_instance_dir_name)
                && self.instances.contains_key(&(Arc::from(agent.as_str()), Arc::from(key.as_str())))
            {
                self.read_instance(&Arc::from(agent.as_str()), &Arc::from(key.as_str()), dir);
                continue;
            }
            if !ignored {
                return None;
            }
        }
        changed.dedup();
        for (agent, key) in changed {
            if let Some(dir) = self.instances.get(&(Arc::clone(&agent), Arc::clone(&key))).map(|i| i.dir.clone()) {
                self.read_instance(&agent, &key, &dir);
            }
        }
        Some(true)
    }

    /// Reads what the files gained; the new entries' seqs go to `fresh`.
    /// Returns false when a file was rewritten (the project must be read again).
    fn refresh(&mut self, fresh: &mut Vec<u32>) -> bool {
        self.discover();
        let mut changed = Vec::new();
        for index in 0..self.tails.len() {
            let before = self.tails[index].reader.offset();
            self.read_tail(index, fresh);
            if self.stale {
                return false;
            }
            if self.tails[index].reader.offset() != before
                && let Source::Events { agent, key } | Source::Messages { agent, key } = &self.tails[index].source
            {
                changed.push((Arc::clone(agent), Arc::clone(key)));
            }
        }
        // The counters of instances whose logs grew (a turn ran).
        changed.dedup();
        for (agent, key) in changed {
            if let Some(dir) = self.instances.get(&(Arc::clone(&agent), Arc::clone(&key))).map(|i| i.dir.clone()) {
                self.read_instance(&agent, &key, &dir);
            }
        }
        true
    }

    fn read_tail(&mut self, index: usize, fresh: &mut Vec<u32>) {
        let (path, source, mut reader) = {
            let tail = &self.tails[index];
            (tail.path.clone(), tail.source.clone(), tail.reader.clone())
        };
        let read = reader.read_new(|line| {
            if let Ok(record) = serde_json::from_slice::<JsonValue>(line) {
                self.ingest(&path, &source, record, fresh);
            }
        });
        if read == goondan_journal::TailRead::Rewritten {
            // Rewritten (compaction): what was read may be gone.
            self.stale = true;
            return;
        }
        self.tails[index].reader = reader;
    }

    fn ingest(&mut self, path: &Path, source: &Source, record: JsonValue, fresh: &mut Vec<u32>) {
        match source {
            Source::Inbox => self.ingest_inbox(&record, fresh),
            Source::Messages { agent, key } => match record.get("events").and_then(JsonValue::as_array) {
                Some(events) => {
                    for event in events {
                        if event.get("type").and_then(JsonValue::as_str) == Some("append")
                            && let Some(message) = event.get("message")
                        {
                            self.ingest_message(path, agent, key, message, fresh);
                        }
                    }
                }
                None => self.ingest_message(path, agent, key, &record, fresh),
            },
            Source::Events { agent, key } => self.ingest_event(path, agent, key, &record, fresh),
            Source::Tasks { agent, key } => self.ingest_task(agent, key, &record, fresh),
        }
    }

    fn blank(
        &self,
        at: u64,
        kind: Kind,
        key: Arc<str>,
        agent: Option<Arc<str>>,
        subtype: &str,
        source: String,
    ) -> Entry {
        Entry {
            seq: u32::try_from(self.entries.len()).unwrap_or(u32::MAX),
            at,
            kind,
            key,
            agent,
            subtype: subtype.to_owned(),
            source,
            target: None,
            detail: String::new(),
            trace_id: None,
            span_id: None,
            parent_span_id: None,
            duration: None,
            tokens: None,
            status: None,
            error_code: None,
            tool_call_id: None,
            turn_id: None,
            step_id: None,
            correlation_id: None,
        }
    }

    fn ingest_inbox(&mut self, r: &JsonValue, fresh: &mut Vec<u32>) {
        let s = |name: &str| r.get(name).and_then(JsonValue::as_str).unwrap_or("");
        let at = r.get("at").and_then(JsonValue::as_u64).unwrap_or(0);
        let seq = r.get("seq").and_then(JsonValue::as_u64);
        match s("op") {
            "accept" => {
                let event = r.get("event").unwrap_or(&JsonValue::Null);
                let name = event.get("name").and_then(JsonValue::as_str).unwrap_or("");
                let text = event.pointer("/message/text").and_then(JsonValue::as_str).unwrap_or("");
                let connection = s("connection");
                let mut entry = self.blank(
                    at,
                    Kind::ConnectorLog,
                    Arc::from(s("instance")),
                    None,
                    "connector.accepted",
                    format!("connector:{connection}"),
                );
                entry.target = Some(format!("agent:{}", s("agent")));
                entry.detail = if text.is_empty() { name.to_owned() } else { format!("{name}: {}", clip(text)) };
                entry.correlation_id = Some(s("key").to_owned());
                let seq_of_entry = entry.seq;
                let (from, to) = (entry.source.clone(), entry.target.clone().unwrap_or_default());
                self.graph.edge(&from, &to, &entry);
                self.key_graph(&Arc::clone(&entry.key)).edge(&from, &to, &entry);
                if let Some(seq) = seq {
                    self.inbox_by_seq.insert(seq, seq_of_entry);
                }
                self.inbox_by_key.insert(s("key").to_owned(), seq_of_entry);
                self.push(entry, fresh);
            }
            "dropped" => {
                let mut entry = self.blank(
                    at,
                    Kind::ConnectorLog,
                    Arc::from(s("instanceKey")),
                    None,
                    "connector.dropped",
                    format!("connector:{}", s("connection")),
                );
                entry.detail = format!("{}: no ingress rule matches", s("event"));
                entry.status = Some("error".to_owned());
                self.push(entry, fresh);
            }
            "done" => {
                let Some(accepted) = seq.and_then(|seq| self.inbox_by_seq.get(&seq)).copied() else { return };
                let Some(accept) = self.entries.get(accepted as usize) else { return };
                let (key, source, target, started) =
                    (Arc::clone(&accept.key), accept.source.clone(), accept.target.clone(), accept.at);
                let mut entry = self.blank(at, Kind::ConnectorLog, key, None, "connector.done", source);
                entry.target = target;
                let outcome = s("outcome");
                entry.detail = outcome.replace('_', " ");
                entry.duration = Some(at.saturating_sub(started) as f64);
                entry.status = Some(if outcome == "answered" { "ok" } else { "error" }.to_owned());
                entry.correlation_id = Some(accepted.to_string());
                self.push(entry, fresh);
            }
            _ => {}
        }
    }

    fn ingest_message(&mut self, path: &Path, agent: &Arc<str>, key: &Arc<str>, m: &JsonValue, fresh: &mut Vec<u32>) {
        let data = m.get("data").unwrap_or(&JsonValue::Null);
        let role = data.get("role").and_then(JsonValue::as_str).unwrap_or("");
        let at = m.get("createdAt").and_then(JsonValue::as_u64).unwrap_or(0);
        let mut content = match data.get("content") {
            Some(JsonValue::String(text)) => text.clone(),
            Some(JsonValue::Array(parts)) => {
                parts.iter().filter_map(|p| p.get("text").and_then(JsonValue::as_str)).collect::<Vec<_>>().join(" ")
            }
            _ => String::new(),
        };
        let me = format!("agent:{agent}");
        match role {
            "user" => {
                let metadata = m.get("metadata");
                let inbound = metadata.and_then(|m| m.get("__goondanInbound"));
                let task = metadata
                    .and_then(|m| m.get("toolTask"))
                    .or_else(|| inbound.and_then(|i| i.pointer("/eventMetadata/toolTask")))
                    .and_then(|t| t.get("handle"))
                    .and_then(JsonValue::as_str);
                let (source, subtype) = match (inbound, task) {
                    (_, Some(handle)) => {
                        content = format!("the end of task {handle}");
                        (format!("task:{handle}"), "message.task")
                    }
                    (Some(inbound), None) => {
                        let kind = inbound.get("sourceKind").and_then(JsonValue::as_str).unwrap_or("user");
                        let name = inbound.get("sourceName").and_then(JsonValue::as_str).unwrap_or("");
                        let correlation = inbound.get("correlationId").and_then(JsonValue::as_str).unwrap_or("");
                        if kind == "connector" {
                            if let Some(delivery) =
                                inbound.pointer("/eventMetadata/deliveryKey").and_then(JsonValue::as_str)
                                && let Some(accepted) = self.inbox_by_key.get(delivery)
                            {
                                self.delivery_of_request.insert(correlation.to_owned(), *accepted);
                            }
                            self.connection_of_request.insert(correlation.to_owned(), name.to_owned());
                            (format!("connector:{name}"), "message.connector")
                        } else if kind == "agent" {
                            (format!("agent:{name}"), "message.agent")
                        } else {
                            ("user:cli".to_owned(), "message.user")
                        }
                    }
                    (None, None) => ("user:cli".to_owned(), "message.user"),
                };
                let mut entry =
                    self.blank(at, Kind::Message, Arc::clone(key), Some(Arc::clone(agent)), subtype, source.clone());
                entry.target = Some(me.clone());
                entry.detail = clip(&content);
                if subtype == "message.user" {
                    self.graph.edge(&source, &me, &entry);
                    self.key_graph(key).edge(&source, &me, &entry);
                }
                self.last_inbound.insert(path.to_path_buf(), source);
                self.push(entry, fresh);
            }
            "assistant" if !content.trim().is_empty() => {
                let mut entry =
                    self.blank(at, Kind::Message, Arc::clone(key), Some(Arc::clone(agent)), "message.assistant", me);
                entry.target = self.last_inbound.get(path).cloned();
                entry.detail = clip(&content);
                entry.step_id = m.pointer("/source/stepId").and_then(JsonValue::as_str).map(str::to_owned);
                self.push(entry, fresh);
            }
            _ => {}
        }
    }

    fn key_graph(&mut self, key: &Arc<str>) -> &mut Graph {
        let loaded = self.loaded;
        self.key_graphs.entry(Arc::clone(key)).or_insert_with(|| {
            let mut graph = Graph::default();
            if loaded {
                graph.history_cap = EDGE_HISTORY;
            }
            graph
        })
    }

    fn ingest_event(&mut self, path: &Path, agent: &Arc<str>, key: &Arc<str>, r: &JsonValue, fresh: &mut Vec<u32>) {
        let s = |name: &str| r.get(name).and_then(JsonValue::as_str).map(str::to_owned);
        let Some(kind) = s("type") else { return };
        let at = r.get("timestamp").and_then(JsonValue::as_u64).unwrap_or(0);
        let me = format!("agent:{agent}");
        let mut entry = self.blank(at, Kind::RuntimeEvent, Arc::clone(key), Some(Arc::clone(agent)), &kind, me.clone());
        entry.trace_id = s("traceId").filter(|t| !t.is_empty()).map(Arc::from);
        entry.span_id = s("spanId");
        entry.parent_span_id = s("parentSpanId");
        entry.duration = r.get("duration").and_then(JsonValue::as_f64);
        entry.status = s("status");
        entry.error_code = s("errorCode");
        entry.tool_call_id = s("toolCallId");
        entry.turn_id = s("turnId").filter(|t| !t.is_empty());
        entry.step_id = s("stepId");
        entry.correlation_id = s("correlationId");
        if let Some(usage) = r.get("tokenUsage") {
            let n = |name: &str| usage.get(name).and_then(JsonValue::as_u64).unwrap_or(0);
            entry.tokens = Some(Tokens {
                input: n("inputTokens").max(n("promptTokens")),
                output: n("outputTokens").max(n("completionTokens")),
                total: n("totalTokens"),
            });
        }
        let correlation = entry.correlation_id.clone().unwrap_or_default();
        match kind.as_str() {
            "tool.called" => {
                let tool = format!("tool:{}", s("toolName").unwrap_or_default());
                entry.target = Some(tool.clone());
                entry.detail = s("toolName").unwrap_or_default();
                self.graph.edge(&me, &tool, &entry);
                self.key_graph(key).edge(&me, &tool, &entry);
            }
            "tool.completed" | "tool.failed" => {
                let name = s("toolName").unwrap_or_default();
                let tool = format!("tool:{name}");
                entry.source = tool.clone();
                entry.target = Some(me.clone());
                entry.detail = match (&entry.status, &entry.error_code) {
                    (_, Some(code)) => format!("{name} → error {code}"),
                    (Some(status), None) => format!("{name} → {status}"),
                    (None, None) => name,
                };
                if kind == "tool.failed" {
                    entry.status = Some("error".to_owned());
                    self.graph.error(&me, &tool);
                    self.key_graph(key).error(&me, &tool);
                }
            }
            "agent.request.sent" => {
                let target = s("target").unwrap_or_default();
                entry.target = Some(format!("agent:{target}"));
                entry.detail = format!("request to {target}{}", peer_key(r.get("targetInstanceKey"), key));
                if let (Some(trace), Some(call)) = (&entry.trace_id, &entry.tool_call_id) {
                    self.request_call.insert(correlation.clone(), (Arc::clone(trace), call.clone()));
                }
                let to = entry.target.clone().unwrap_or_default();
                self.graph.edge(&me, &to, &entry);
                self.key_graph(key).edge(&me, &to, &entry);
            }
            "agent.send.sent" => {
                let target = s("target").unwrap_or_default();
                entry.target = Some(format!("agent:{target}"));
                entry.detail = format!("message to {target}");
                let to = entry.target.clone().unwrap_or_default();
                self.graph.edge(&me, &to, &entry);
                self.key_graph(key).edge(&me, &to, &entry);
            }
            "agent.request.received" => {
                let from = s("from").unwrap_or_default();
                entry.source = match self.connection_of_request.get(&correlation) {
                    Some(connection) => format!("connector:{connection}"),
                    None => participant_of(&from),
                };
                entry.target = Some(me.clone());
                entry.detail =
                    format!("{} from {}", s("eventType").unwrap_or_default(), peer_name(&entry.source, &from));
                self.awaiting_turn.insert(path.to_path_buf(), correlation);
            }
            "agent.response.sent" => {
                let to = s("to").unwrap_or_default();
                let target = match self.connection_of_request.get(&correlation) {
                    Some(connection) => format!("connector:{connection}"),
                    None => participant_of(&to),
                };
                entry.detail =
                    format!("answer to {} ({})", peer_name(&target, &to), entry.status.clone().unwrap_or_default());
                entry.target = Some(target.clone());
                if target.starts_with("agent:") {
                    self.graph.edge(&me, &target, &entry);
                    self.key_graph(key).edge(&me, &target, &entry);
                }
            }
            "agent.response.received" => {
                let from = s("from").unwrap_or_default();
                entry.source = participant_of(&from);
                entry.target = Some(me.clone());
                entry.detail = format!("answer from {from} ({})", entry.status.clone().unwrap_or_default());
            }
            "turn.started" => {
                if let Some(correlation) = self.awaiting_turn.remove(path)
                    && let (Some(trace), Some(span)) = (&entry.trace_id, &entry.span_id)
                {
                    entry.correlation_id = Some(correlation.clone());
                    self.turn_of_request.insert(correlation, (Arc::clone(trace), span.clone()));
                }
                entry.detail = "turn started".to_owned();
            }
            "turn.completed" | "turn.failed" => {
                let end = s("end").unwrap_or_default();
                let error = s("error").unwrap_or_default();
                entry.detail =
                    if error.is_empty() { format!("turn {end}") } else { format!("turn {end}: {}", clip(&error)) };
                if kind == "turn.failed" {
                    entry.status = Some("error".to_owned());
                }
            }
            "step.started" => entry.detail = "step started".to_owned(),
            "step.completed" => {
                let calls = r.get("toolCalls").and_then(JsonValue::as_u64).unwrap_or(0);
                let index = r.get("stepIndex").and_then(JsonValue::as_u64).unwrap_or(0) + 1;
                entry.detail = format!("step {index}: {calls} tool call{}", if calls == 1 { "" } else { "s" });
            }
            other => entry.detail = other.to_owned(),
        }
        self.push(entry, fresh);
    }

    fn ingest_task(&mut self, agent: &Arc<str>, key: &Arc<str>, r: &JsonValue, fresh: &mut Vec<u32>) {
        let s = |value: &JsonValue, name: &str| value.get(name).and_then(JsonValue::as_str).unwrap_or("").to_owned();
        let me = format!("agent:{agent}");
        // A task's entries are its instance's, between the agent and the task.
        let task_entry = |model: &Self, at: u64, subtype: &str, source: String, target: String| {
            let mut entry = model.blank(at, Kind::Task, Arc::clone(key), Some(Arc::clone(agent)), subtype, source);
            entry.target = Some(target);
            entry
        };
        match r.get("op").and_then(JsonValue::as_str) {
            Some("open") => {
                let task = r.get("task").unwrap_or(&JsonValue::Null);
                let handle = s(task, "handle");
                let created = task.get("createdAt").and_then(JsonValue::as_u64).unwrap_or(0);
                let mut entry = task_entry(self, created, "task.opened", me.clone(), format!("task:{handle}"));
                entry.detail = format!("{} pending ({handle})", s(task, "tool"));
                entry.tool_call_id = Some(s(task, "callId"));
                entry.turn_id = Some(s(task, "turnId"));
                entry.correlation_id = Some(handle.clone());
                entry.status = Some("working".to_owned());
                self.tasks.insert(
                    handle.clone(),
                    Task {
                        handle,
                        agent: Arc::clone(agent),
                        key: Arc::clone(key),
                        tool: s(task, "tool"),
                        call_id: s(task, "callId"),
                        turn_id: s(task, "turnId"),
                        created,
                        ended: None,
                    },
                );
                self.push(entry, fresh);
            }
            Some("end") => {
                let handle = s(r, "handle");
                let state = s(r, "state");
                let at = r.get("at").and_then(JsonValue::as_u64).unwrap_or(0);
                let mut entry = task_entry(self, at, &format!("task.{state}"), format!("task:{handle}"), me);
                entry.correlation_id = Some(handle.clone());
                entry.status = Some(if state == "completed" { "ok" } else { "error" }.to_owned());
                if let Some(task) = self.tasks.get_mut(&handle) {
                    task.ended = Some((at, state.clone()));
                    entry.duration = Some(at.saturating_sub(task.created) as f64);
                    entry.detail = format!("{} {state}", task.tool);
                    entry.tool_call_id = Some(task.call_id.clone());
                }
                self.push(entry, fresh);
            }
            _ => {}
        }
    }

    /// Adds an entry to the indexes (in time order) and the trace summaries.
    fn push(&mut self, entry: Entry, fresh: &mut Vec<u32>) {
        let seq = entry.seq;
        if let Some(trace) = &entry.trace_id {
            let summary = self.traces.entry(Arc::clone(trace)).or_insert_with(|| TraceSummary {
                started: entry.at,
                ended: entry.at,
                ..TraceSummary::default()
            });
            summary.started = summary.started.min(entry.at);
            summary.ended = summary.ended.max(entry.at);
            if let Some(agent) = &entry.agent
                && !summary.agents.contains(agent)
            {
                summary.agents.push(Arc::clone(agent));
            }
            if !summary.keys.contains(&entry.key) {
                summary.keys.push(Arc::clone(&entry.key));
            }
            match entry.subtype.as_str() {
                "turn.started" => {
                    summary.turns += 1;
                    summary.open_turns += 1;
                }
                "turn.completed" | "turn.failed" => summary.open_turns -= 1,
                "tool.called" => summary.tool_calls += 1,
                _ => {}
            }
            if entry.failed() {
                summary.errors += 1;
            }
            summary.entries.push(seq);
        }
        let key = Arc::clone(&entry.key);
        let order = entry.order();
        self.entries.push(entry);
        let entries = &self.entries;
        let position = |list: &Vec<u32>| list.partition_point(|s| entries[*s as usize].order() <= order);
        let at = position(&self.order);
        self.order.insert(at, seq);
        let list = self.by_key.entry(key).or_default();
        let at = position(list);
        list.insert(at, seq);
        fresh.push(seq);
    }

    /// After the first read: every index in time order at once.
    fn sort_all(&mut self) {
        let entries = &self.entries;
        self.graph.trim(entries);
        for graph in self.key_graphs.values_mut() {
            graph.trim(entries);
        }
        self.order.sort_by_key(|s| entries[*s as usize].order());
        for list in self.by_key.values_mut() {
            list.sort_by_key(|s| entries[*s as usize].order());
        }
    }

    /// The entries of a scope in time order: the project's, or one key's.
    pub fn scope(&self, key: Option<&str>) -> &[u32] {
        match key {
            None => &self.order,
            Some(key) => self.by_key.get(key).map_or(&[], Vec::as_slice),
        }
    }

    /// The graph of a scope.
    pub fn graph_of(&self, key: Option<&str>) -> Option<&Graph> {
        match key {
            None => Some(&self.graph),
            Some(key) => self.key_graphs.get(key),
        }
    }
}

fn peer_key(value: Option<&JsonValue>, mine: &str) -> String {
    match value.and_then(JsonValue::as_str) {
        Some(key) if key != mine => format!(" (instance {key})"),
        _ => String::new(),
    }
}

/// How a peer is named in a detail: a connector by its Connection, an
/// agent as the log names it (`desk@t-1`).
fn peer_name(participant: &str, raw: &str) -> String {
    match participant.strip_prefix("connector:") {
        Some(connection) => connection.to_owned(),
        None => raw.to_owned(),
    }
}

/// `desk@t-1` → `agent:desk`; `cli` → `user:cli`.
fn participant_of(peer: &str) -> String {
    match peer.split_once('@') {
        Some((agent, _)) => format!("agent:{agent}"),
        None if peer == "cli" || peer.is_empty() => "user:cli".to_owned(),
        None => format!("agent:{peer}"),
    }
}

fn clip(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(DETAIL_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

/// Every project of a state root.
#[derive(Debug)]
pub struct Store {
    root: PathBuf,
    only: Option<String>,
    pub projects: BTreeMap<String, Project>,
    /// Bumped by every change.
    pub revision: u64,
}

/// What a refresh found.
#[derive(Debug, Default)]
pub struct Changes {
    /// New entries per project (seq).
    pub fresh: Vec<(String, Vec<u32>)>,
    /// Projects read again from the start (rewritten files) or new.
    pub reset: Vec<String>,
}

impl Store {
    /// Reads the state root `root` (only the workspace `only`, if given).
    pub fn open(root: &Path, only: Option<String>) -> Self {
        let mut store = Self { root: root.to_path_buf(), only, projects: BTreeMap::new(), revision: 0 };
        store.refresh();
        store
    }

    /// The workspaces directory.
    pub fn workspaces_dir(&self) -> PathBuf {
        self.root.join("workspaces")
    }

    /// Reads what the files at `paths` (from change notifications) gained;
    /// falls back to [`Store::refresh`] for a path it does not follow.
    pub fn refresh_paths(&mut self, paths: &[PathBuf]) -> Changes {
        let workspaces = self.workspaces_dir();
        let mut by_project: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
        for path in paths {
            let id = path.strip_prefix(&workspaces).ok().and_then(|rest| rest.components().next());
            match id.map(|c| c.as_os_str().to_string_lossy().into_owned()) {
                Some(id) if self.projects.contains_key(&id) => by_project.entry(id).or_default().push(path.clone()),
                _ => return self.refresh(),
            }
        }
        let mut changes = Changes::default();
        for (id, paths) in by_project {
            let Some(project) = self.projects.get_mut(&id) else { continue };
            let mut fresh = Vec::new();
            match project.refresh_files(&paths, &mut fresh) {
                Some(true) => {}
                Some(false) | None => {
                    if !project.refresh(&mut fresh) {
                        let dir = project.dir.clone();
                        if let Some(project) = Project::open(&dir) {
                            self.projects.insert(id.clone(), project);
                        }
                        changes.reset.push(id);
                        continue;
                    }
                }
            }
            if !fresh.is_empty() {
                changes.fresh.push((id, fresh));
            }
        }
        if !changes.fresh.is_empty() || !changes.reset.is_empty() {
            self.revision += 1;
        }
        changes
    }

    /// Reads what changed.
    pub fn refresh(&mut self) -> Changes {
        let mut changes = Changes::default();
        let dirs: Vec<PathBuf> = std::fs::read_dir(self.workspaces_dir())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.join("workspace.json").is_file())
            .filter(|p| {
                self.only.as_ref().is_none_or(|only| p.file_name().is_some_and(|n| n.to_string_lossy() == **only))
            })
            .collect();
        for dir in dirs {
            let id = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            match self.projects.get_mut(&id) {
                Some(project) => {
                    let mut fresh = Vec::new();
                    if project.refresh(&mut fresh) {
                        if !fresh.is_empty() {
                            changes.fresh.push((id, fresh));
                        }
                    } else if let Some(project) = Project::open(&dir) {
                        self.projects.insert(id.clone(), project);
                        changes.reset.push(id);
                    }
                }
                None => {
                    if let Some(project) = Project::open(&dir) {
                        self.projects.insert(id.clone(), project);
                        changes.reset.push(id);
                    }
                }
            }
        }
        if !changes.fresh.is_empty() || !changes.reset.is_empty() {
            self.revision += 1;
        }
        changes
    }
}
