//! `gdn logs`: one time-ordered stream over every process of a project,
//! read from the durable logs — each agent instance's event log
//! (`instances/*/events.jsonl`: turns, steps, tool calls with duration and
//! status, handoffs from both ends) and the service's inbox
//! (`ingress/inbox.jsonl`: events accepted, turns started and ended). It
//! works while the service runs (`--follow` keeps reading) and after it
//! stopped.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use goondan_core::JsonValue;

use crate::cli::{GlobalOptions, LogsArgs};
use crate::exit;
use crate::output::{self, Output};

/// One line of the stream.
#[derive(Debug, Clone)]
struct Entry {
    timestamp: u64,
    /// `agent@key`, or `inbox`.
    source: String,
    record: JsonValue,
}

/// A log file read so far.
struct Tail {
    path: PathBuf,
    /// `Some(agent@key)` for an instance's event log; `None` for the inbox.
    instance: Option<String>,
    /// How far it was read (the journal's incremental reader).
    reader: goondan_journal::Tail,
    /// The inbox's events by seq (agent, instance), to name them in their
    /// later records.
    routes: std::collections::HashMap<u64, (JsonValue, JsonValue)>,
}

impl Tail {
    /// The complete lines added since the last read.
    fn read_new(&mut self) -> Vec<Entry> {
        let mut records = Vec::new();
        let mut parse = |line: &[u8]| {
            if let Ok(record) = serde_json::from_slice::<JsonValue>(line) {
                records.push(record);
            }
        };
        if self.reader.read_new(&mut parse) == goondan_journal::TailRead::Rewritten {
            // Rewritten (compacted): read it again from the start.
            self.reader.restart();
            self.reader.read_new(&mut parse);
        }
        records.into_iter().map(|record| self.entry(record)).collect()
    }

    fn entry(&mut self, mut record: JsonValue) -> Entry {
        if self.instance.is_none()
            && let Some(seq) = record.get("seq").and_then(JsonValue::as_u64)
            && let Some(object) = record.as_object_mut()
        {
            match object.get("op").and_then(JsonValue::as_str) {
                Some("accept") => {
                    let agent = object.get("agent").cloned().unwrap_or(JsonValue::Null);
                    let instance = object.get("instance").cloned().unwrap_or(JsonValue::Null);
                    self.routes.insert(seq, (agent, instance));
                }
                _ => {
                    if let Some((agent, instance)) = self.routes.get(&seq) {
                        object.insert("agent".to_owned(), agent.clone());
                        object.insert("instance".to_owned(), instance.clone());
                    }
                }
            }
        }
        let timestamp = record.get("timestamp").or_else(|| record.get("at")).and_then(JsonValue::as_u64).unwrap_or(0);
        let source = match &self.instance {
            Some(instance) => instance.clone(),
            None => "inbox".to_owned(),
        };
        Entry { timestamp, source, record }
    }
}

/// The log files of a workspace.
fn tails(workspace: &Path) -> Vec<Tail> {
    let mut found = Vec::new();
    let inbox = workspace.join(goondan_ingress::inbox::INBOX_FILE);
    found.push(Tail {
        reader: goondan_journal::Tail::new(&inbox),
        path: inbox,
        instance: None,
        routes: Default::default(),
    });
    if let Ok(entries) = std::fs::read_dir(workspace.join("instances")) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            // Only instance directories (`<agent>@<key>`, encoded as the store encodes them).
            let Some((agent, key)) = goondan_runtime::store::parse_instance_dir_name(&name) else { continue };
            let path = entry.path().join("events.jsonl");
            found.push(Tail {
                reader: goondan_journal::Tail::new(&path),
                path,
                instance: Some(format!("{agent}@{key}")),
                routes: Default::default(),
            });
        }
    }
    found
}

/// Time order; within one millisecond a message's sending comes before its
/// receipt (the two ends write different files, read in no causal order).
fn order(entry: &Entry) -> (u64, bool) {
    let kind = entry.record.get("type").and_then(JsonValue::as_str).unwrap_or("");
    (entry.timestamp, kind.ends_with(".received"))
}

/// The original's name of the orchestrator's process (`gdn logs --process`).
const ORCHESTRATOR: &str = "orchestrator";

fn matches(entry: &Entry, args: &LogsArgs) -> bool {
    let field = |name: &str| entry.record.get(name).and_then(JsonValue::as_str);
    let (agent, key) = match field("agentName") {
        Some(agent) => (Some(agent.to_owned()), field("instanceKey").map(str::to_owned)),
        None => (field("agent").map(str::to_owned), field("instance").map(str::to_owned)),
    };
    // The original's `--process NAME` read one process's output: here an
    // agent's records, or (`orchestrator`, its default) everything.
    let process_agent = args.process.as_ref().filter(|name| name.as_str() != ORCHESTRATOR);
    args.agent.as_ref().is_none_or(|want| agent.as_deref() == Some(want.as_str()))
        && process_agent.is_none_or(|want| agent.as_deref() == Some(want.as_str()))
        && args.instance_key.as_ref().is_none_or(|want| key.as_deref() == Some(want.as_str()))
        && args.trace.as_ref().is_none_or(|want| field("traceId") == Some(want.as_str()))
}

/// `HH:MM:SS.mmm` (UTC) of a timestamp in ms.
fn clock(ms: u64) -> String {
    let seconds = ms / 1000;
    format!("{:02}:{:02}:{:02}.{:03}", (seconds / 3600) % 24, (seconds / 60) % 60, seconds % 60, ms % 1000)
}

/// One line for people.
fn render(entry: &Entry) -> String {
    let r = &entry.record;
    let s = |name: &str| r.get(name).and_then(JsonValue::as_str).unwrap_or("");
    let what = match (s("type"), s("op")) {
        ("turn.started", _) => "turn started".to_owned(),
        ("turn.completed", _) => format!("turn completed{}", duration(r)),
        ("turn.failed", _) => format!("turn failed: {}", s("error")),
        ("step.started", _) => "step started".to_owned(),
        ("step.completed", _) => format!("step completed{}", duration(r)),
        ("tool.called", _) => format!("⚙ {} called", s("toolName")),
        ("tool.completed", _) => format!("⚙ {} → {}{}", s("toolName"), s("status"), duration(r)),
        ("tool.failed", _) => format!("⚙ {} → error {}{}", s("toolName"), s("errorCode"), duration(r)),
        ("agent.request.sent", _)
        | ("agent.request.received", _)
        | ("agent.response.sent", _)
        | ("agent.response.received", _) => {
            let data = r.get("data").unwrap_or(r);
            let get = |name: &str| data.get(name).and_then(JsonValue::as_str).unwrap_or("");
            let peer = [get("to"), get("from"), get("target")].into_iter().find(|p| !p.is_empty()).unwrap_or("");
            format!("↔ {} {peer}", s("type"))
        }
        (_, "accept") => {
            let event = r.get("event").unwrap_or(&JsonValue::Null);
            let name = event.get("name").and_then(JsonValue::as_str).unwrap_or("");
            format!(
                "event #{} {name} accepted via {} ({}) → {}@{}",
                r.get("seq").and_then(JsonValue::as_u64).unwrap_or(0),
                s("connection"),
                s("key"),
                s("agent"),
                s("instance")
            )
        }
        (_, "dropped") => format!(
            "event {} via {} (instance {}) dropped: no ingress rule matches",
            s("event"),
            s("connection"),
            s("instanceKey")
        ),
        (_, "start") => {
            format!(
                "event #{} → {}@{}: turn started",
                r.get("seq").and_then(JsonValue::as_u64).unwrap_or(0),
                s("agent"),
                s("instance")
            )
        }
        (_, "done") => format!(
            "event #{} → {}@{}: {}",
            r.get("seq").and_then(JsonValue::as_u64).unwrap_or(0),
            s("agent"),
            s("instance"),
            s("outcome").replace('_', " ")
        ),
        (_, "retry") => format!(
            "event #{} → {}@{}: its turn could not be saved ({} time(s)): {}; it stays stored and runs again",
            r.get("seq").and_then(JsonValue::as_u64).unwrap_or(0),
            s("agent"),
            s("instance"),
            r.get("failures").and_then(JsonValue::as_u64).unwrap_or(0),
            s("reason")
        ),
        (kind, _) if !kind.is_empty() => kind.to_owned(),
        _ => r.to_string(),
    };
    let trace = s("traceId");
    let trace = if trace.is_empty() {
        String::new()
    } else {
        format!("  {}trace {}{}", output::DIM, &trace[..trace.len().min(8)], output::DIM.render_reset())
    };
    format!(
        "{}{}{}  {:<24} {what}{trace}",
        output::DIM,
        clock(entry.timestamp),
        output::DIM.render_reset(),
        entry.source
    )
}

fn duration(record: &JsonValue) -> String {
    record.get("duration").and_then(JsonValue::as_f64).map_or_else(String::new, |ms| format!(" in {ms:.0} ms"))
}

fn print(entries: &[Entry], json: bool, out: &mut Output) -> Result<()> {
    for entry in entries {
        if json {
            let mut record = entry.record.clone();
            if let Some(object) = record.as_object_mut() {
                object.insert("source".to_owned(), JsonValue::String(entry.source.clone()));
            }
            writeln!(out.stdout, "{record}")?;
        } else {
            writeln!(out.stdout, "{}", render(entry))?;
        }
    }
    out.stdout.flush()?;
    Ok(())
}

/// `gdn logs`.
pub fn logs(global: &GlobalOptions, args: &LogsArgs, session: &crate::Session, out: &mut Output) -> Result<u8> {
    let workspace = match crate::workspace::workspace_or_exit_saying(global, out, "no such workspace")? {
        Ok(workspace) => workspace,
        Err(code) => return Ok(code),
    };
    if args.nats.is_some() {
        return logs_from_broker(global, args, session, &workspace, out);
    }
    stream(workspace.dir(), args, global.json, out, &mut || Ok(()))
}

/// The stream over `workspace`'s logs; with `--follow`, `refresh` runs
/// before each read (a copy from the broker is taken again).
fn stream(
    workspace: &Path,
    args: &LogsArgs,
    json: bool,
    out: &mut Output,
    refresh: &mut dyn FnMut() -> std::result::Result<(), String>,
) -> Result<u8> {
    let mut tails = tails(workspace);
    let mut entries: Vec<Entry> =
        tails.iter_mut().flat_map(Tail::read_new).filter(|entry| matches(entry, args)).collect();
    entries.sort_by_key(order);
    let skip = entries.len().saturating_sub(args.lines);
    print(&entries[skip..], json, out)?;
    if !args.follow {
        return Ok(exit::OK);
    }
    // Follow: new lines of every file (and of instances that appear), in
    // time order within each read, until interrupted.
    let mut known: BTreeMap<PathBuf, ()> = tails.iter().map(|t| (t.path.clone(), ())).collect();
    loop {
        std::thread::sleep(Duration::from_millis(200));
        if let Err(message) = refresh() {
            tracing::warn!("reading the swarm's state: {message}");
        }
        for tail in tails_of_new_instances(workspace, &mut known) {
            tails.push(tail);
        }
        let mut fresh: Vec<Entry> =
            tails.iter_mut().flat_map(Tail::read_new).filter(|entry| matches(entry, args)).collect();
        fresh.sort_by_key(order);
        print(&fresh, json, out)?;
    }
}

/// `gdn logs --nats URL`: the instances' event logs from the broker's
/// state stream (they live in the agent hosts' state roots), the inbox
/// from this machine's workspace (the hub's).
fn logs_from_broker(
    global: &GlobalOptions,
    args: &LogsArgs,
    session: &crate::Session,
    workspace: &goondan_runtime::store::Workspace,
    out: &mut Output,
) -> Result<u8> {
    let url = args.nats.as_deref().unwrap_or_default();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut copy = match crate::nats::take_copy_or_exit(&runtime, url, session, workspace, out)? {
        Ok(copy) => copy,
        Err(code) => return Ok(code),
    };
    let dir = copy.workspace.clone();
    // Taken again at most once a second while following.
    stream(&dir, args, global.json, out, &mut || {
        copy.refresh_every(&runtime, Duration::from_secs(1)).map_err(|e| e.to_string())
    })
}

fn tails_of_new_instances(workspace: &Path, known: &mut BTreeMap<PathBuf, ()>) -> Vec<Tail> {
    tails(workspace).into_iter().filter(|tail| known.insert(tail.path.clone(), ()).is_none()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc_clock_times() {
        assert_eq!(clock(3_723_004), "01:02:03.004");
    }
}
