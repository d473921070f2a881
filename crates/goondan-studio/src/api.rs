//! The studio's data API, computed from the [`Store`]: the original's
//! shapes (`InstanceSummary`, `Visualization`, `TimelineEntry`, `Trace`,
//! `TraceSpan`), bounded so that a project of any size answers quickly: a
//! timeline is a window of the newest entries (`limit`, older ones by
//! `before`), an edge's history its newest [`model::EDGE_HISTORY`]
//! entries, and a trace's spans are built when it is asked for.

use std::collections::HashMap;
use std::sync::Arc;

use goondan_core::JsonValue;
use serde_json::json;

use crate::model::{self, Entry, Graph, Project, Store, iso};

/// The newest entries a timeline holds unless asked otherwise.
pub const DEFAULT_LIMIT: usize = 400;
/// The most a timeline holds.
pub const MAX_LIMIT: usize = 5000;
/// How many traces are listed.
pub const TRACE_LIST: usize = 200;

/// `GET /api/projects`.
pub fn projects(store: &Store) -> JsonValue {
    let items: Vec<JsonValue> = store
        .projects
        .values()
        .map(|p| {
            let running = goondan_ingress::inbox::is_held(&p.dir.join(goondan_ingress::inbox::INBOX_FILE));
            let updated = p.instances.values().map(|i| i.updated).max().unwrap_or(0);
            json!({
                "id": p.id, "name": p.name, "bundle": p.bundle,
                "instances": p.by_key.len(), "agentInstances": p.instances.len(),
                "events": p.entries.len(), "traces": p.traces.len(),
                "serviceRunning": running, "updatedAt": iso(updated), "updatedAtMs": updated,
            })
        })
        .collect();
    json!({"items": items, "revision": store.revision})
}

/// `GET /api/instances`: one item per (project, instance key), the
/// original's `InstanceSummary` with the agents of the key.
pub fn instances(store: &Store, only: Option<&str>) -> JsonValue {
    let mut items = Vec::new();
    for project in store.projects.values().filter(|p| only.is_none_or(|o| o == p.id)) {
        let mut keys: HashMap<&str, Vec<&model::Instance>> = HashMap::new();
        for instance in project.instances.values() {
            keys.entry(&instance.key).or_default().push(instance);
        }
        for (key, mut agents) in keys {
            agents.sort_by_key(|i| i.created);
            let running = agents.iter().any(|i| goondan_runtime::store::lock_status(&i.dir).is_ok_and(|s| s.running));
            let created = agents.iter().map(|i| i.created).min().unwrap_or(0);
            let updated = agents.iter().map(|i| i.updated).max().unwrap_or(0);
            let names: Vec<&str> = agents.iter().map(|i| &*i.agent).collect();
            items.push(json!({
                "key": key,
                "status": if running { "running" } else { "idle" },
                "agent": names.first().copied().unwrap_or(""),
                "agents": names,
                "createdAt": iso(created),
                "updatedAt": iso(updated),
                "updatedAtMs": updated,
                "turns": agents.iter().map(|i| i.turns).sum::<u64>(),
                "events": project.by_key.get(key).map_or(0, Vec::len),
                "workspace": project.id,
            }));
        }
    }
    items.sort_by(|a, b| b["updatedAtMs"].as_u64().cmp(&a["updatedAtMs"].as_u64()));
    json!({"items": items, "polledAt": iso(now_ms()), "revision": store.revision})
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// What a visualization asks for.
#[derive(Debug, Default, Clone, Copy)]
pub struct Window {
    pub recent: usize,
    pub limit: usize,
    /// Entries before this seq only.
    pub before: Option<u32>,
}

/// `GET /api/instances/:key/visualization` (`key: Some`) or
/// `GET /api/projects/:id/visualization` (`key: None`).
pub fn visualization(project: &Project, key: Option<&str>, window: Window) -> JsonValue {
    let scope = project.scope(key);
    let end = match window.before.and_then(|seq| project.entries.get(seq as usize)) {
        Some(before) => {
            let order = before.order();
            scope.partition_point(|s| project.entries[*s as usize].order() < order)
        }
        None => scope.len(),
    };
    let start = end.saturating_sub(window.limit);
    let timeline: Vec<JsonValue> = scope[start..end].iter().map(|s| project.entries[*s as usize].to_json()).collect();
    let recent_from = scope.len().saturating_sub(window.recent);
    let recent: Vec<JsonValue> = scope[recent_from..].iter().map(|s| project.entries[*s as usize].to_json()).collect();
    let empty = Graph::default();
    let graph = project.graph_of(key).unwrap_or(&empty);
    json!({
        "instanceKey": key,
        "workspace": project.id,
        "participants": participants(graph),
        "interactions": interactions(project, graph),
        "timeline": timeline,
        "timelineTotal": scope.len(),
        "timelineStart": start,
        "recentEvents": recent,
        "traces": trace_list(project, key),
        "tracesTotal": project.traces.len(),
    })
}

fn participants(graph: &Graph) -> Vec<JsonValue> {
    let mut list: Vec<&model::Participant> = graph.participants.values().collect();
    list.sort_by(|a, b| b.last_seen.cmp(&a.last_seen).then(a.order.cmp(&b.order)));
    list.iter().map(|p| json!({"id": p.id, "label": p.label, "kind": p.kind, "lastSeenAt": iso(p.last_seen)})).collect()
}

fn interactions(project: &Project, graph: &Graph) -> Vec<JsonValue> {
    let mut list: Vec<(&String, &model::Edge)> = graph.edges.iter().collect();
    list.sort_by(|a, b| b.1.last_seen.cmp(&a.1.last_seen).then(a.0.cmp(b.0)));
    list.iter()
        .map(|(key, edge)| {
            let direction = match (edge.forward > 0, edge.backward > 0) {
                (true, true) => "undirected",
                (false, true) => "b->a",
                _ => "a->b",
            };
            let mut history: Vec<&Entry> =
                edge.history.iter().filter_map(|seq| project.entries.get(*seq as usize)).collect();
            history.sort_by_key(|e| (e.at, e.seq));
            let history: Vec<JsonValue> = history
                .into_iter()
                .map(|e| {
                    let from = e.source.clone();
                    let forward = from == edge.a;
                    json!({
                        "at": iso(e.at), "from": from, "to": e.target.clone().unwrap_or_default(),
                        "direction": if forward { "a->b" } else { "b->a" },
                        "kind": e.subtype, "detail": e.detail, "seq": e.seq,
                    })
                })
                .collect();
            json!({
                "key": key, "a": edge.a, "b": edge.b,
                "total": edge.forward + edge.backward,
                "counts": {"a->b": edge.forward, "b->a": edge.backward},
                "errors": edge.errors,
                "lastSeenAt": iso(edge.last_seen), "direction": direction, "history": history,
            })
        })
        .collect()
}

/// The newest traces of a scope, summed up (their spans: [`trace`]).
fn trace_list(project: &Project, key: Option<&str>) -> Vec<JsonValue> {
    let mut list: Vec<(&Arc<str>, &model::TraceSummary)> =
        project.traces.iter().filter(|(_, t)| key.is_none_or(|k| t.keys.iter().any(|tk| &**tk == k))).collect();
    list.sort_by(|a, b| b.1.started.cmp(&a.1.started).then(a.0.cmp(b.0)));
    list.truncate(TRACE_LIST);
    list.iter()
        .map(|(id, t)| {
            let title = t
                .entries
                .iter()
                .filter_map(|s| project.entries.get(*s as usize))
                .filter(|e| e.subtype == "turn.started")
                .min_by_key(|e| (e.at, e.seq))
                .map(|e| format!("{} turn", e.agent.as_deref().unwrap_or("?")))
                .unwrap_or_default();
            json!({
                "traceId": id, "title": title,
                "agentNames": agents_in_order(project, t),
                "instanceKeys": t.keys.iter().map(|a| &**a).collect::<Vec<_>>(),
                "startedAt": iso(t.started), "startedAtMs": t.started,
                "completedAt": if t.open_turns > 0 { JsonValue::Null } else { json!(iso(t.ended)) },
                "totalDuration": t.ended - t.started,
                "turns": t.turns, "toolCalls": t.tool_calls, "errors": t.errors,
                "rootSpans": [],
            })
        })
        .collect()
}

/// The agents of a trace, in the order they first took part.
fn agents_in_order(project: &Project, trace: &model::TraceSummary) -> Vec<String> {
    let mut first: HashMap<&str, (u64, u32)> = HashMap::new();
    for e in trace.entries.iter().filter_map(|s| project.entries.get(*s as usize)) {
        if let Some(agent) = e.agent.as_deref() {
            let at = first.entry(agent).or_insert((e.at, e.seq));
            *at = (*at).min((e.at, e.seq));
        }
    }
    let mut list: Vec<(&str, (u64, u32))> = first.into_iter().collect();
    list.sort_by_key(|(_, at)| *at);
    list.into_iter().map(|(agent, _)| agent.to_owned()).collect()
}

/// A span being built.
#[derive(Debug, Clone)]
struct Span {
    id: String,
    parent: Option<String>,
    trace: String,
    kind: String,
    agent: String,
    key: String,
    start: u64,
    end: Option<u64>,
    duration: Option<f64>,
    status: &'static str,
    detail: String,
    tokens: Option<model::Tokens>,
    error_code: Option<String>,
    link: Option<String>,
    tool_call_id: Option<String>,
    turn: Option<String>,
    events: Vec<JsonValue>,
}

impl Span {
    fn new(e: &Entry, kind: &str) -> Self {
        Self {
            id: e.span_id.clone().unwrap_or_default(),
            parent: e.parent_span_id.clone(),
            trace: e.trace_id.as_deref().unwrap_or("").to_owned(),
            kind: kind.to_owned(),
            agent: e.agent.as_deref().unwrap_or("").to_owned(),
            key: e.key.to_string(),
            start: e.at,
            end: None,
            duration: None,
            status: "started",
            detail: e.detail.clone(),
            tokens: None,
            error_code: None,
            link: None,
            tool_call_id: e.tool_call_id.clone(),
            turn: e.turn_id.clone(),
            events: Vec::new(),
        }
    }
}

/// `GET /api/traces/:id`: the trace's spans, nested — a connector's event,
/// turns, steps, the model call of each step, tool calls, the turns other
/// agents ran for a handoff (under the call that sent it), and pending
/// results' tasks until they end (with the trace their end started).
pub fn trace(project: &Project, trace_id: &str) -> Option<JsonValue> {
    let summary = project.traces.get(trace_id)?;
    let entries: Vec<&Entry> = summary.entries.iter().filter_map(|s| project.entries.get(*s as usize)).collect();
    let mut built = TraceSpans::default();
    for e in &entries {
        built.record(e);
    }
    built.add_model_calls();
    let roots_extra = built.link_handoffs(project, &entries, trace_id);
    built.add_tasks(project);
    let mut spans = built.spans;
    spans.extend(roots_extra);
    let (roots, children) = nest(&spans);
    let started = spans.iter().map(|s| s.start).min().unwrap_or(summary.started);
    let ended = spans.iter().filter_map(|s| s.end).max().unwrap_or(summary.ended).max(summary.ended);
    let root_json: Vec<JsonValue> = roots.iter().map(|i| span_json(&spans, &children, *i, 0)).collect();
    Some(json!({
        "traceId": trace_id,
        "rootSpans": root_json,
        "agentNames": agents_in_order(project, summary),
        "instanceKeys": summary.keys.iter().map(|a| &**a).collect::<Vec<_>>(),
        "startedAt": iso(started), "startedAtMs": started,
        "completedAt": if summary.open_turns > 0 { JsonValue::Null } else { json!(iso(ended)) },
        "completedAtMs": ended,
        "totalDuration": ended - started,
        "nowMs": now_ms(),
    }))
}

/// A trace's spans as they are built, and what finds them again.
#[derive(Default)]
struct TraceSpans {
    spans: Vec<Span>,
    /// Each span's place in `spans`, by id.
    index: HashMap<String, usize>,
    /// When each step's first tool call started, by the step's span id.
    first_tool_of_step: HashMap<String, u64>,
    /// The span of each tool call, by (agent, call id).
    call_span: HashMap<(String, String), String>,
}

impl TraceSpans {
    /// A turn's, step's or tool call's start opens its span; its end closes it.
    fn record(&mut self, e: &Entry) {
        let Some(span_id) = &e.span_id else { return };
        match e.subtype.as_str() {
            "turn.started" | "step.started" | "tool.called" => {
                let kind = match e.subtype.as_str() {
                    "turn.started" => "turn",
                    "step.started" => "step",
                    _ => "tool",
                };
                let mut span = Span::new(e, kind);
                if kind == "turn" {
                    span.detail = format!("{} turn", span.agent);
                }
                if kind == "tool"
                    && let (Some(parent), Some(call)) = (&e.parent_span_id, &e.tool_call_id)
                {
                    self.first_tool_of_step.entry(parent.clone()).or_insert(e.at);
                    self.call_span.insert((span.agent.clone(), call.clone()), span_id.clone());
                }
                self.index.insert(span_id.clone(), self.spans.len());
                self.spans.push(span);
            }
            "turn.completed" | "turn.failed" | "step.completed" | "tool.completed" | "tool.failed" => {
                let Some(&at) = self.index.get(span_id) else { return };
                let span = &mut self.spans[at];
                span.end = Some(e.at);
                span.duration = e.duration.or(Some(e.at.saturating_sub(span.start) as f64));
                span.status = if e.failed() {
                    "failed"
                } else if e.status.as_deref() == Some("pending") {
                    "pending"
                } else {
                    "completed"
                };
                span.error_code.clone_from(&e.error_code);
                if e.tokens.is_some() {
                    span.tokens = e.tokens;
                }
                if span.kind != "model" {
                    span.detail.clone_from(&e.detail);
                    if span.kind == "turn" {
                        span.detail = format!("{} {}", span.agent, e.detail);
                    }
                }
            }
            _ => {}
        }
    }

    /// The model call of each step: from the step's start to its first tool
    /// call (the step core asks the model, then runs the calls), or to the
    /// step's end when it made none.
    fn add_model_calls(&mut self) {
        let steps: Vec<Span> = self.spans.iter().filter(|s| s.kind == "step").cloned().collect();
        for step in steps {
            let end = self.first_tool_of_step.get(&step.id).copied().or(step.end);
            let mut model = step.clone();
            model.id = format!("{}-model", step.id);
            model.parent = Some(step.id.clone());
            model.kind = "model".to_owned();
            model.end = end;
            model.duration = end.map(|end| end.saturating_sub(step.start) as f64);
            model.status = if end.is_some() { "completed" } else { "started" };
            model.detail = format!("{} model call", step.agent);
            model.tool_call_id = None;
            self.index.insert(model.id.clone(), self.spans.len());
            self.spans.push(model);
        }
    }

    /// Handoffs: another agent's turn goes under the call that asked for it;
    /// a connector's event becomes the root of the turn it started (those
    /// roots are returned, to be added last).
    fn link_handoffs(&mut self, project: &Project, entries: &[&Entry], trace_id: &str) -> Vec<Span> {
        let mut roots_extra: Vec<Span> = Vec::new();
        for e in entries {
            match e.subtype.as_str() {
                "agent.request.sent" | "agent.response.received" | "agent.send.sent" => {
                    let agent = e.agent.as_deref().unwrap_or("").to_owned();
                    let call = e.tool_call_id.clone().or_else(|| {
                        let correlation = e.correlation_id.as_ref()?;
                        project.request_call.get(correlation).map(|(_, call)| call.clone())
                    });
                    if let Some(call) = call
                        && let Some(span_id) = self.call_span.get(&(agent, call))
                        && let Some(&at) = self.index.get(span_id)
                    {
                        self.spans[at].events.push(json!({"at": iso(e.at), "name": e.subtype, "detail": e.detail}));
                    }
                }
                "turn.started" => {
                    let Some(correlation) = &e.correlation_id else { continue };
                    let Some(&at) = e.span_id.as_ref().and_then(|s| self.index.get(s)) else { continue };
                    if let Some((_, call)) = project.request_call.get(correlation) {
                        let caller = entries.iter().find(|x| {
                            x.subtype == "agent.request.sent" && x.correlation_id.as_deref() == Some(correlation)
                        });
                        if let Some(caller) = caller
                            && let Some(span_id) =
                                self.call_span.get(&(caller.agent.as_deref().unwrap_or("").to_owned(), call.clone()))
                        {
                            self.spans[at].parent = Some(span_id.clone());
                        }
                    } else if let Some(accepted) = project.delivery_of_request.get(correlation)
                        && let Some(accept) = project.entries.get(*accepted as usize)
                    {
                        let root = connector_root(project, accept, trace_id);
                        self.spans[at].parent = Some(root.id.clone());
                        roots_extra.push(root);
                    }
                }
                _ => {}
            }
        }
        roots_extra
    }

    /// Pending results: the task under its call, until it ends.
    fn add_tasks(&mut self, project: &Project) {
        let tasks: Vec<&model::Task> = project.tasks.values().collect();
        for span in self.spans.clone() {
            if span.kind != "tool" || span.status != "pending" {
                continue;
            }
            let Some(call) = &span.tool_call_id else { continue };
            let Some(task) = tasks.iter().find(|t| {
                &t.call_id == call
                    && *t.agent == *span.agent
                    && *t.key == *span.key
                    && span.turn.as_deref().is_none_or(|turn| turn == t.turn_id)
            }) else {
                continue;
            };
            self.spans.push(task_span(project, &span, task));
        }
    }
}

/// The span of a connector's event (`accept`, its `connector.accepted`
/// entry): the root of the turn it started, ended by its `connector.done`.
fn connector_root(project: &Project, accept: &Entry, trace_id: &str) -> Span {
    let mut root = Span::new(accept, "connector");
    root.id = format!("connector-{}", accept.seq);
    root.parent = None;
    root.trace = trace_id.to_owned();
    root.agent = accept.source.trim_start_matches("connector:").to_owned();
    root.detail = format!("{} event {}", root.agent, accept.detail);
    let done = project
        .scope(Some(&accept.key))
        .iter()
        .filter_map(|s| project.entries.get(*s as usize))
        .find(|d| d.subtype == "connector.done" && d.correlation_id.as_deref() == Some(&accept.seq.to_string()));
    if let Some(done) = done {
        root.end = Some(done.at);
        root.duration = done.duration;
        root.status = if done.failed() { "failed" } else { "completed" };
    }
    root
}

/// The span of the task a pending tool call (`call`) started, until it ends.
fn task_span(project: &Project, call: &Span, task: &model::Task) -> Span {
    let mut child = call.clone();
    child.id = format!("task-{}", task.handle);
    child.parent = Some(call.id.clone());
    child.kind = "task".to_owned();
    child.start = task.created;
    child.detail = format!("{} task {}", task.tool, task.handle);
    child.events.clear();
    match &task.ended {
        Some((at, state)) => {
            child.end = Some(*at);
            child.duration = Some(at.saturating_sub(task.created) as f64);
            child.status = if state == "completed" { "completed" } else { "failed" };
            child.detail = format!("{} task {state}", task.tool);
        }
        None => {
            child.end = None;
            child.duration = None;
            child.status = "working";
        }
    }
    child.link = project.turn_of_request.get(&format!("task:{}", task.handle)).map(|(trace, _)| trace.to_string());
    child
}

/// The spans' tree: the roots, and each span's children, in order of start.
fn nest(spans: &[Span]) -> (Vec<usize>, HashMap<usize, Vec<usize>>) {
    let ids: HashMap<String, usize> = spans.iter().enumerate().map(|(i, s)| (s.id.clone(), i)).collect();
    let mut children: HashMap<usize, Vec<usize>> = HashMap::new();
    let mut roots = Vec::new();
    for (i, span) in spans.iter().enumerate() {
        match span.parent.as_ref().and_then(|p| ids.get(p)) {
            Some(&parent) if parent != i => children.entry(parent).or_default().push(i),
            _ => roots.push(i),
        }
    }
    let by_start = |list: &mut Vec<usize>| list.sort_by_key(|i| (spans[*i].start, rank(&spans[*i].kind)));
    by_start(&mut roots);
    for list in children.values_mut() {
        by_start(list);
    }
    (roots, children)
}

fn rank(kind: &str) -> u8 {
    match kind {
        "connector" => 0,
        "turn" => 1,
        "step" => 2,
        "model" => 3,
        "tool" => 4,
        _ => 5,
    }
}

fn span_json(spans: &[Span], children: &HashMap<usize, Vec<usize>>, i: usize, depth: usize) -> JsonValue {
    let span = &spans[i];
    let kids: Vec<JsonValue> = if depth > 64 {
        Vec::new()
    } else {
        children
            .get(&i)
            .map_or_else(Vec::new, |list| list.iter().map(|c| span_json(spans, children, *c, depth + 1)).collect())
    };
    let mut value = json!({
        "spanId": span.id, "traceId": span.trace, "type": span.kind,
        "agentName": span.agent, "instanceKey": span.key,
        "startedAt": iso(span.start), "startedAtMs": span.start,
        "status": span.status, "detail": span.detail, "children": kids,
    });
    if let Some(parent) = &span.parent {
        value["parentSpanId"] = json!(parent);
    }
    if let Some(end) = span.end {
        value["completedAt"] = json!(iso(end));
        value["completedAtMs"] = json!(end);
    }
    if let Some(duration) = span.duration {
        value["duration"] = json!(duration);
    }
    if let Some(tokens) = span.tokens {
        value["tokenUsage"] =
            json!({"promptTokens": tokens.input, "completionTokens": tokens.output, "totalTokens": tokens.total});
    }
    if let Some(code) = &span.error_code {
        value["errorCode"] = json!(code);
    }
    if let Some(link) = &span.link {
        value["linkedTraceId"] = json!(link);
    }
    if let Some(call) = &span.tool_call_id {
        value["toolCallId"] = json!(call);
    }
    if !span.events.is_empty() {
        value["events"] = json!(span.events);
    }
    value
}
