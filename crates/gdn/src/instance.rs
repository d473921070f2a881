//! `gdn instance list|delete`: the agent instances in the state root, one
//! per (agent, instance key) in each project's workspace, and whether a
//! process runs them.

use goondan_core::message::now_millis;
use std::collections::BTreeMap;
use std::io::Write;

use anyhow::{Result, anyhow};
use goondan_runtime::store::{ListedInstance, StateRoot, StoreError, Workspace, delete_instances, list_instances};

use crate::Session;
use crate::cli::{GlobalOptions, InstanceCommand};
use crate::exit;
use crate::output::{self, Output};

/// `gdn instance list|delete`.
pub fn instance(global: &GlobalOptions, command: &InstanceCommand, session: &Session, out: &mut Output) -> Result<u8> {
    let root = crate::workspace::state_root(global)?;
    match command {
        InstanceCommand::List { nats: None, agent, limit, all } => {
            list(global, &root, None, &Selection { agent: agent.as_deref(), limit: limit.filter(|_| !all) }, out)
        }
        InstanceCommand::List { nats: Some(url), agent, limit, all } => {
            let selection = Selection { agent: agent.as_deref(), limit: limit.filter(|_| !all) };
            let workspace = match crate::workspace::workspace_or_exit(global, out)? {
                Ok(workspace) => workspace,
                Err(code) => return Ok(code),
            };
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            match crate::nats::take_copy_or_exit(&runtime, url, session, &workspace, out)? {
                Ok(copy) => list(global, &copy.root, Some(&copy.holders), &selection, out),
                Err(code) => Ok(code),
            }
        }
        InstanceCommand::Restart { key, fresh } => crate::restart::instance_restart(global, key, *fresh, out),
        InstanceCommand::Delete { key, agent, force } => {
            let workspace = match crate::workspace::project_workspace(global, &root) {
                Ok(workspace) => workspace,
                Err(message) => return out.fail(exit::USAGE, message),
            };
            match workspace {
                Some(workspace) => {
                    if !*force && !confirmed(&workspace, key, agent.as_deref(), out)? {
                        return Ok(exit::USAGE);
                    }
                    if *force && let Some(service) = goondan_service::status::ServiceStatus::running(workspace.dir()) {
                        // The service stops them (after their running turns), then deletes them.
                        let request = goondan_service::control::ControlRequest::DeleteInstance {
                            key: key.clone(),
                            agent: agent.clone(),
                        };
                        let reply =
                            match crate::restart::ask(&service, &request, std::time::Duration::from_secs(600), out)? {
                                Ok(reply) => reply,
                                Err(code) => return Ok(code),
                            };
                        if reply.ok && reply.deleted.is_empty() {
                            return out.fail(
                                exit::USAGE,
                                format_args!(
                                    "no instance {} in workspace '{}' ({})",
                                    describe(key, agent.as_deref()),
                                    workspace.id(),
                                    workspace.dir().display()
                                ),
                            );
                        }
                        return crate::restart::report(global, &reply, out);
                    }
                    delete(global, &root, &workspace, key, agent.as_deref(), out)
                }
                None => out.fail(
                    exit::USAGE,
                    format_args!(
                        "no workspace {:?} in {}",
                        global.workspace.as_deref().unwrap_or_default(),
                        root.path().display()
                    ),
                ),
            }
        }
    }
}

/// Asks on the terminal before a delete without `--force`; without a
/// terminal to ask on, refuses (a script says `--force`).
fn confirmed(workspace: &Workspace, key: &str, agent: Option<&str>, out: &mut Output) -> Result<bool> {
    use std::io::IsTerminal as _;
    if !std::io::stdin().is_terminal() || !std::io::stderr().is_terminal() {
        output::error_line(
            &mut out.stderr,
            format_args!(
                "gdn instance delete asks before it deletes, and there is no terminal to ask on: pass --force to delete instance {} without asking",
                describe(key, agent)
            ),
        )?;
        return Ok(false);
    }
    write!(
        out.stderr,
        "delete instance {} of workspace '{}' (its conversations and event logs)? [y/N] ",
        describe(key, agent),
        workspace.id()
    )?;
    out.stderr.flush()?;
    let mut answer = String::new();
    std::io::stdin().read_line(&mut answer)?;
    if matches!(answer.trim(), "y" | "Y" | "yes" | "Yes") {
        return Ok(true);
    }
    writeln!(out.stderr, "nothing was deleted")?;
    Ok(false)
}

/// `'key'`, or `'key' of agent 'agent'`.
fn describe(key: &str, agent: Option<&str>) -> String {
    match agent {
        Some(agent) => format!("'{key}' of agent '{agent}'"),
        None => format!("'{key}'"),
    }
}

pub(crate) const HEADERS: [&str; 9] =
    ["WORKSPACE", "AGENT", "INSTANCE", "STATUS", "TURNS", "MESSAGES", "PENDING", "UPDATED", "BUNDLE"];
/// The columns printed flush right (numbers).
const RIGHT_ALIGNED: [bool; 9] = [false, false, false, false, true, true, true, false, false];
/// The WORKSPACE of an instance of the old layouts (not in a workspace yet).
pub(crate) const OLD_LAYOUT: &str = "(old layout)";

/// Events stored by a service whose turns have not run: by workspace, then `agent@key`.
type PendingByWorkspace = BTreeMap<String, BTreeMap<String, goondan_service::serve::Waiting>>;

/// An instance with events waiting and no conversation yet: its workspace,
/// agent, key, and what waits.
type WaitingOnly = (String, String, String, goondan_service::serve::Waiting);

/// `gdn instance list --agent/--limit` (the original's `-a`, `-n`).
struct Selection<'a> {
    /// Only this agent's rows (any case, as the original).
    agent: Option<&'a str>,
    /// At most this many rows (none: all).
    limit: Option<u64>,
}

/// What `gdn instance list` shows of a state root: its instances, the
/// events waiting for each, the instances with events waiting and no
/// conversation yet, and the services running on its workspaces.
struct Listing {
    instances: Vec<ListedInstance>,
    counts: Vec<goondan_service::serve::Waiting>,
    waiting_only: Vec<WaitingOnly>,
    services: BTreeMap<String, goondan_service::status::ServiceStatus>,
}

/// The [`Listing`] of `root`, as `selection` narrows it.
fn listing(root: &StateRoot, selection: &Selection<'_>) -> Result<Listing> {
    // The store's errors already name their cause; anyhow's chain would repeat it.
    let mut instances = list_instances(root).map_err(|e| anyhow!("{e}"))?;
    let wanted = |agent: &str| selection.agent.is_none_or(|want| want.eq_ignore_ascii_case(agent));
    instances.retain(|instance| wanted(&instance.info.agent_name));
    let limit = selection.limit.map_or(usize::MAX, |limit| usize::try_from(limit).unwrap_or(usize::MAX));
    instances.truncate(limit);
    let (mut pending, services) = workspace_services(root);
    let mut pending_of = |workspace: Option<&String>, agent: &str, key: &str| {
        workspace
            .and_then(|workspace| pending.get_mut(workspace))
            .and_then(|waiting| waiting.remove(&format!("{agent}@{key}")))
            .unwrap_or_default()
    };
    let counts: Vec<goondan_service::serve::Waiting> = instances
        .iter()
        .map(|instance| pending_of(instance.workspace.as_ref(), &instance.info.agent_name, &instance.info.instance_key))
        .collect();
    // Instances with events waiting that have no conversation yet.
    let mut waiting_only: Vec<WaitingOnly> = Vec::new();
    for (workspace, waiting) in &pending {
        for (instance, count) in waiting {
            let (agent, key) = instance.split_once('@').unwrap_or((instance.as_str(), ""));
            if wanted(agent) {
                waiting_only.push((workspace.clone(), agent.to_owned(), key.to_owned(), count.clone()));
            }
        }
    }
    waiting_only.truncate(limit.saturating_sub(instances.len()));
    Ok(Listing { instances, counts, waiting_only, services })
}

/// The rows `gdn instance list` prints for every instance of `root`
/// (cells as [`HEADERS`] names them), for the interactive list.
pub(crate) fn table_rows(root: &StateRoot) -> Result<Vec<[String; 9]>> {
    let listing = listing(root, &Selection { agent: None, limit: None })?;
    Ok(rows(&listing.instances, &listing.counts, listing.waiting_only, None))
}

/// The instances of `root`; `holders` (`agent@key` → host) for a swarm's
/// copy from the broker, where the host an instance is on is its status.
fn list(
    global: &GlobalOptions,
    root: &StateRoot,
    holders: Option<&BTreeMap<String, String>>,
    selection: &Selection<'_>,
    out: &mut Output,
) -> Result<u8> {
    let Listing { instances, counts, waiting_only, services } = listing(root, selection)?;
    if global.json {
        return list_json(&instances, &counts, &waiting_only, holders, &services, out);
    }
    for (workspace, service) in &services {
        service_line(workspace, service, out)?;
    }
    if instances.is_empty() && waiting_only.is_empty() {
        match holders {
            // A copy from the broker lives in a temporary root: not a place to name.
            Some(_) => writeln!(out.stdout, "no instances of this swarm in the NATS server's state stream")?,
            None => writeln!(out.stdout, "no instances in {}", root.path().display())?,
        }
        return Ok(exit::OK);
    }
    table(&instances, &counts, waiting_only, holders, out)?;
    Ok(exit::OK)
}

/// The events waiting in each workspace's inbox, and the services running
/// on a workspace (their status file, trusted while they hold the inbox).
fn workspace_services(
    root: &StateRoot,
) -> (PendingByWorkspace, BTreeMap<String, goondan_service::status::ServiceStatus>) {
    let mut pending = PendingByWorkspace::new();
    let mut services = BTreeMap::new();
    if let Ok(entries) = std::fs::read_dir(root.workspaces_dir()) {
        for entry in entries.flatten() {
            let workspace = entry.file_name().to_string_lossy().into_owned();
            let waiting = goondan_service::serve::pending_by_instance(&entry.path());
            if !waiting.is_empty() {
                pending.insert(workspace.clone(), waiting);
            }
            if let Some(service) = goondan_service::status::ServiceStatus::running(&entry.path()) {
                services.insert(workspace, service);
            }
        }
    }
    (pending, services)
}

/// `gdn instance list --json`.
fn list_json(
    instances: &[ListedInstance],
    counts: &[goondan_service::serve::Waiting],
    waiting_only: &[WaitingOnly],
    holders: Option<&BTreeMap<String, String>>,
    services: &BTreeMap<String, goondan_service::status::ServiceStatus>,
    out: &mut Output,
) -> Result<u8> {
    let mut listed = Vec::new();
    for (instance, count) in instances.iter().zip(counts) {
        let mut value = serde_json::to_value(instance)?;
        value["pendingEvents"] = serde_json::json!(count.count);
        if let Some(retrying) = &count.retrying {
            value["retrying"] = serde_json::to_value(retrying)?;
        }
        if let Some(host) = holder_of(holders, instance) {
            value["host"] = serde_json::json!(host);
        }
        if let Some(service) = instance.workspace.as_ref().and_then(|w| services.get(w)) {
            value["service"] = serde_json::to_value(service)?;
        }
        listed.push(value);
    }
    for (workspace, agent, key, count) in waiting_only {
        let mut value = serde_json::json!({
            "workspace": workspace, "agentName": agent, "instanceKey": key,
            "running": false, "pendingEvents": count.count,
        });
        if let Some(retrying) = &count.retrying {
            value["retrying"] = serde_json::to_value(retrying)?;
        }
        listed.push(value);
    }
    writeln!(out.stdout, "{}", serde_json::to_string_pretty(&listed)?)?;
    Ok(exit::OK)
}

/// The line of a service running on `workspace`.
fn service_line(workspace: &str, service: &goondan_service::status::ServiceStatus, out: &mut Output) -> Result<()> {
    let since = updated(service.started_at, now_millis());
    let listening =
        if service.listening.is_empty() { String::new() } else { format!(", {}", service.listening.join(", ")) };
    writeln!(
        out.stdout,
        "{}service{} {workspace}: pid {}, started {since}, Swarm {}, Connections {}{listening}; logs: {}; bundle {}",
        output::BOLD,
        output::BOLD.render_reset(),
        service.pid,
        service.swarm,
        service.connections.join(", "),
        service.log.as_deref().unwrap_or("its standard error"),
        service.bundle
    )?;
    Ok(())
}

/// The instances' table, columns as wide as their widest cell.
fn table(
    instances: &[ListedInstance],
    counts: &[goondan_service::serve::Waiting],
    waiting_only: Vec<WaitingOnly>,
    holders: Option<&BTreeMap<String, String>>,
    out: &mut Output,
) -> Result<()> {
    let rows = rows(instances, counts, waiting_only, holders);
    let mut widths = HEADERS.map(|header| header.chars().count());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let header = HEADERS.map(str::to_owned);
    writeln!(out.stdout, "{}{}{}", output::BOLD, line(&header, &widths), output::BOLD.render_reset())?;
    for row in &rows {
        writeln!(out.stdout, "{}", line(row, &widths))?;
    }
    Ok(())
}

/// The table's rows: the instances', then those with events waiting and no conversation yet.
fn rows(
    instances: &[ListedInstance],
    counts: &[goondan_service::serve::Waiting],
    waiting_only: Vec<WaitingOnly>,
    holders: Option<&BTreeMap<String, String>>,
) -> Vec<[String; 9]> {
    let now = now_millis();
    let mut rows: Vec<[String; 9]> = instances
        .iter()
        .zip(counts)
        .map(|(instance, count)| {
            let mut cells = row(instance, count, now);
            if let Some(host) = holder_of(holders, instance) {
                cells[3] = format!("on host {host}");
            }
            cells
        })
        .collect();
    for (workspace, agent, key, count) in waiting_only {
        rows.push([
            workspace,
            agent,
            key,
            "waiting".to_owned(),
            "0".to_owned(),
            "0".to_owned(),
            pending_cell(&count, now),
            "-".to_owned(),
            String::new(),
        ]);
    }
    rows
}

/// The host `instance` is on (or was last), in a copy from the broker.
fn holder_of<'a>(holders: Option<&'a BTreeMap<String, String>>, instance: &ListedInstance) -> Option<&'a str> {
    let name = format!("{}@{}", instance.info.agent_name, instance.info.instance_key);
    holders?.get(&name).map(String::as_str)
}

fn row(instance: &ListedInstance, pending: &goondan_service::serve::Waiting, now: u64) -> [String; 9] {
    let info = &instance.info;
    let status = match (instance.status.running, instance.status.pid) {
        (true, Some(pid)) => format!("running (pid {pid})"),
        (true, None) => "running".to_owned(),
        (false, _) => match (info.expired_at, info.collect_at) {
            // Its service expired it (Swarm policy.lifecycle): what goes, and when.
            (Some(_), Some(at)) if at > now => format!("expired (collected in {}s)", (at - now).div_ceil(1000)),
            (Some(_), _) => "expired (collected at the service's next sweep)".to_owned(),
            (None, _) => "idle".to_owned(),
        },
    };
    [
        instance.workspace.clone().unwrap_or_else(|| OLD_LAYOUT.to_owned()),
        info.agent_name.clone(),
        info.instance_key.clone(),
        status,
        info.turns.to_string(),
        info.messages.to_string(),
        pending_cell(pending, now),
        updated(info.updated_at, now),
        // The project's identity where its workspace says it, else the last opener's.
        instance.workspace_bundle.clone().unwrap_or_else(|| info.bundle.clone()),
    ]
}

/// The PENDING cell: the count, and whether a turn waits to be saved
/// (`2 (retrying: not saved 3×, 4s ago)`) or for an agent host that can
/// run it (`1 (retrying: no agent host 2×, now)`).
fn pending_cell(pending: &goondan_service::serve::Waiting, now: u64) -> String {
    match &pending.retrying {
        Some(retrying) => {
            let why = if retrying.reason.starts_with(goondan_ipc::codes::AGENT_NO_HOST) {
                "no agent host"
            } else {
                "not saved"
            };
            format!("{} (retrying: {why} {}×, {})", pending.count, retrying.failures, updated(retrying.at, now))
        }
        None => pending.count.to_string(),
    }
}

/// The cells padded to their column's width, two spaces apart; the last
/// column is not padded (no trailing blanks).
fn line(cells: &[String; 9], widths: &[usize; 9]) -> String {
    let mut text = String::new();
    let last = cells.len() - 1;
    for (index, cell) in cells.iter().enumerate() {
        if index > 0 {
            text.push_str("  ");
        }
        let padding = " ".repeat(widths[index].saturating_sub(cell.chars().count()));
        if RIGHT_ALIGNED[index] {
            text.push_str(&padding);
            text.push_str(cell);
        } else {
            text.push_str(cell);
            if index < last {
                text.push_str(&padding);
            }
        }
    }
    text
}

/// When an instance was last updated, for people: relative while recent
/// (`just now`, `42s ago`, `5m ago`, `3h ago`, `6d ago`), else the UTC date.
pub(crate) fn updated(updated_at: u64, now: u64) -> String {
    const MINUTE: u64 = 60;
    const HOUR: u64 = 60 * MINUTE;
    const DAY: u64 = 24 * HOUR;
    // A time in the future (another machine's clock) counts as now.
    let seconds = now.saturating_sub(updated_at) / 1000;
    match seconds {
        0..5 => "just now".to_owned(),
        5..MINUTE => format!("{seconds}s ago"),
        MINUTE..HOUR => format!("{}m ago", seconds / MINUTE),
        HOUR..DAY => format!("{}h ago", seconds / HOUR),
        _ if seconds < 7 * DAY => format!("{}d ago", seconds / DAY),
        _ => iso_date(updated_at),
    }
}

/// `YYYY-MM-DD` (UTC) of a time in milliseconds since the Unix epoch.
pub(crate) fn iso_date(millis: u64) -> String {
    let mut date = goondan_core::js_message::format_rfc3339_millis(millis);
    date.truncate(10);
    date
}

/// `gdn instance delete KEY [--agent NAME]`: every agent's instance of the
/// key, or only that agent's. All or nothing: if one of them runs, nothing
/// is deleted (the store takes every lock before it deletes).
fn delete(
    global: &GlobalOptions,
    root: &StateRoot,
    workspace: &Workspace,
    key: &str,
    agent: Option<&str>,
    out: &mut Output,
) -> Result<u8> {
    let deleted = match delete_instances(root, workspace, key, agent) {
        Ok(deleted) => deleted,
        Err(StoreError::Busy { agent, pid, .. }) => {
            let pid = pid.map(|pid| format!(" (pid {pid})")).unwrap_or_default();
            return out.fail(
                exit::USAGE,
                format_args!(
                    "instance {} is running{pid}; stop it first, or with a service running pass --force (nothing was deleted)",
                    describe(key, Some(&agent))
                ),
            );
        }
        Err(error @ (StoreError::InvalidKey { .. } | StoreError::KeyMismatch { .. })) => {
            return out.fail(exit::USAGE, format_args!("{error} (nothing was deleted)"));
        }
        Err(error) => return Err(anyhow!("{error}")),
    };
    if deleted.is_empty() {
        return out.fail(
            exit::USAGE,
            format_args!(
                "no instance {} in workspace '{}' ({})",
                describe(key, agent),
                workspace.id(),
                workspace.dir().display()
            ),
        );
    }
    if global.json {
        let body: Vec<serde_json::Value> = deleted
            .iter()
            .map(|gone| {
                serde_json::json!({
                    "workspace": workspace.id(),
                    "agentName": gone.agent_name,
                    "instanceKey": key,
                    "dir": gone.dir.to_string_lossy(),
                })
            })
            .collect();
        writeln!(out.stdout, "{}", serde_json::to_string_pretty(&body)?)?;
        return Ok(exit::OK);
    }
    for gone in &deleted {
        writeln!(
            out.stdout,
            "{}✓{} deleted instance {}",
            output::OK,
            output::OK.render_reset(),
            describe(key, Some(&gone.agent_name))
        )?;
    }
    Ok(exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recent_times_are_relative_and_older_ones_dates() {
        let now = 1_700_000_000_000;
        assert_eq!(updated(now, now), "just now");
        assert_eq!(updated(now + 60_000, now), "just now", "a clock ahead of ours");
        assert_eq!(updated(now - 42_000, now), "42s ago");
        assert_eq!(updated(now - 5 * 60_000 - 1, now), "5m ago");
        assert_eq!(updated(now - 3 * 3_600_000, now), "3h ago");
        assert_eq!(updated(now - 6 * 86_400_000, now), "6d ago");
        assert_eq!(updated(now - 8 * 86_400_000, now), "2023-11-06");
    }

    #[test]
    fn dates_are_utc_calendar_dates() {
        assert_eq!(iso_date(0), "1970-01-01");
        assert_eq!(iso_date(951_782_400_000), "2000-02-29");
        assert_eq!(iso_date(951_868_799_999), "2000-02-29");
        assert_eq!(iso_date(1_700_000_000_000), "2023-11-14");
        assert_eq!(iso_date(4_102_444_800_000), "2100-01-01");
    }

    #[test]
    fn columns_are_padded_and_numbers_flush_right() {
        let widths = [9, 5, 8, 6, 5, 8, 7, 7, 6];
        let cells = ["crew", "a", "default", "idle", "3", "12", "2", "now", "/b"].map(str::to_owned);
        assert_eq!(line(&cells, &widths), "crew       a      default   idle        3        12        2  now      /b");
    }
}
