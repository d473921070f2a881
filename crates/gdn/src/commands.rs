//! The commands: `validate`, `tool list`, `tool call`.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Result;
use goondan_config::{Bundle, LoadReport, load_bundle, resolve_bundle_file};
use goondan_core::{JsonObject, JsonValue, Message, ToolCall, ToolStatus, ids};
use goondan_runtime::agent::{AgentBuildError, AgentOptions, AgentToolSet, tool_set};
use goondan_tools::step::{StepContext, prepare_step_catalog};
use goondan_tools::{CallScope, ExecutorPolicy, MiddlewareChain, ToolCatalog, ToolExecutor, TracingEventSink};

use crate::cli::{GlobalOptions, ToolCallArgs};
use crate::exit;
use crate::output::{self, Output};

/// `gdn validate`.
pub fn validate(global: &GlobalOptions, out: &mut Output) -> Result<u8> {
    let report = load_bundle(&global.config);
    let valid = !report.has_errors();
    if global.json {
        let body = serde_json::json!({"valid": valid, "diagnostics": report.diagnostics});
        writeln!(out.stdout, "{}", serde_json::to_string_pretty(&body)?)?;
    } else {
        let subject = resolve_bundle_file(&global.config).display().to_string();
        output::write_report(&mut out.stdout, &report.diagnostics, &subject)?;
    }
    Ok(if valid { exit::OK } else { exit::FAILED })
}

/// A bundle, the agent a command works on, and the agent's tools.
struct AgentSetup {
    bundle: Bundle,
    tools: AgentToolSet,
}

/// Loads the bundle and picks the agent, or reports why not (exit 2).
fn setup(global: &GlobalOptions, agent: Option<&str>, out: &mut Output) -> Result<std::result::Result<AgentSetup, u8>> {
    let report = load_bundle(&global.config);
    if report.has_errors() {
        report_config_errors(global, &report, out)?;
        return Ok(Err(exit::USAGE));
    }
    let Some(bundle) = report.bundle else {
        return Ok(Err(exit::USAGE));
    };
    for warning in &report.diagnostics {
        tracing::warn!("{warning}");
    }
    let options = AgentOptions {
        agent: agent.map(str::to_owned),
        instance_key: None,
        workdir: None,
        env: Arc::new(|name: &str| std::env::var(name).ok()),
        events: Arc::new(TracingEventSink),
        call_timeout: None,
    };
    match tool_set(&bundle, &options) {
        Ok(tools) => Ok(Ok(AgentSetup { bundle, tools })),
        Err(AgentBuildError::Agent(message)) => {
            writeln!(out.stderr, "{}error:{} {message}", output::ERROR, output::ERROR.render_reset())?;
            Ok(Err(exit::USAGE))
        }
        Err(error) => Err(anyhow::Error::new(error).context("registering built-in tools")),
    }
}

pub fn report_config_errors(global: &GlobalOptions, report: &LoadReport, out: &mut Output) -> Result<()> {
    if global.json {
        let body = serde_json::json!({"valid": false, "diagnostics": report.diagnostics});
        writeln!(out.stderr, "{}", serde_json::to_string_pretty(&body)?)?;
    } else {
        let subject = resolve_bundle_file(&global.config).display().to_string();
        output::write_report(&mut out.stderr, &report.diagnostics, &subject)?;
    }
    Ok(())
}

/// The catalog of the agent's first step, after step middleware.
async fn first_step_catalog(setup: &AgentSetup, turn_id: &Arc<str>) -> ToolCatalog {
    // Extensions are not loaded by this build, so the step chain is empty;
    // the catalog still goes through it exactly as a step's would.
    let chain: MiddlewareChain<StepContext, ToolCatalog> = MiddlewareChain::new();
    let ctx = StepContext {
        agent_name: Arc::from(setup.tools.agent_name.as_str()),
        instance_key: Arc::from(setup.tools.instance_key.as_str()),
        turn_id: Arc::clone(turn_id),
        step_index: 0,
        tool_catalog: setup.tools.tools.step_catalog(&setup.tools.registry),
        metadata: JsonObject::new(),
    };
    prepare_step_catalog(&chain, ctx).await
}

/// `gdn tool list`.
pub async fn tool_list(global: &GlobalOptions, agent: Option<&str>, out: &mut Output) -> Result<u8> {
    let setup = match setup(global, agent, out)? {
        Ok(setup) => setup,
        Err(code) => return Ok(code),
    };
    let catalog = first_step_catalog(&setup, &Arc::from(ids::new_ordered_id())).await;
    if global.json {
        writeln!(out.stdout, "{}", serde_json::to_string_pretty(&catalog)?)?;
        return Ok(exit::OK);
    }
    let width = catalog.names().map(str::len).max().unwrap_or(4).max(4);
    writeln!(
        out.stdout,
        "{}{:width$}  {:<10}  DESCRIPTION{}",
        output::BOLD,
        "NAME",
        "SOURCE",
        output::BOLD.render_reset()
    )?;
    for item in catalog.iter() {
        let source = item.source().kind.as_str();
        let runnable = if setup.tools.registry.contains(item.name()) { "" } else { "  (no handler in this build)" };
        writeln!(
            out.stdout,
            "{:width$}  {:<10}  {}{}{runnable}{}",
            item.name(),
            source,
            item.description().unwrap_or(""),
            output::DIM,
            output::DIM.render_reset()
        )?;
    }
    writeln!(
        out.stdout,
        "{}{} tools for agent '{}'{}",
        output::DIM,
        catalog.len(),
        setup.tools.agent_name,
        output::DIM.render_reset()
    )?;
    Ok(exit::OK)
}

/// Reads `--args` / `--args-file` into a JSON object.
fn read_args(args: &ToolCallArgs) -> std::result::Result<JsonObject, String> {
    let text = match (&args.args, &args.args_file) {
        (Some(text), _) => text.clone(),
        (None, Some(path)) if path == Path::new("-") => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|e| format!("cannot read arguments from standard input: {e}"))?;
            text
        }
        (None, Some(path)) => {
            std::fs::read_to_string(path).map_err(|e| format!("cannot read --args-file {}: {e}", path.display()))?
        }
        (None, None) => return Ok(JsonObject::new()),
    };
    match serde_json::from_str::<JsonValue>(&text) {
        Ok(JsonValue::Object(map)) => Ok(map),
        Ok(other) => Err(format!("the arguments must be a JSON object, got {}", goondan_core::json_type_name(&other))),
        Err(error) => Err(format!("the arguments are not valid JSON: {error}")),
    }
}

fn absolute(path: &Path) -> PathBuf {
    std::fs::canonicalize(path)
        .unwrap_or_else(|_| std::env::current_dir().map(|cwd| cwd.join(path)).unwrap_or_else(|_| path.to_path_buf()))
}

/// `gdn tool call`.
pub async fn tool_call(global: &GlobalOptions, args: &ToolCallArgs, out: &mut Output) -> Result<u8> {
    let call_args = match read_args(args) {
        Ok(map) => map,
        Err(message) => {
            writeln!(out.stderr, "{}error:{} {message}", output::ERROR, output::ERROR.render_reset())?;
            return Ok(exit::USAGE);
        }
    };
    if let Some(dir) = args.workdir.as_ref().filter(|dir| !dir.is_dir()) {
        writeln!(
            out.stderr,
            "{}error:{} --workdir {} is not a directory",
            output::ERROR,
            output::ERROR.render_reset(),
            dir.display()
        )?;
        return Ok(exit::USAGE);
    }
    let setup = match setup(global, args.agent.as_deref(), out)? {
        Ok(setup) => setup,
        Err(code) => return Ok(code),
    };
    let workdir = absolute(args.workdir.as_deref().unwrap_or(setup.bundle.root()));

    let turn_id: Arc<str> = Arc::from(ids::new_ordered_id());
    let catalog = Arc::new(first_step_catalog(&setup, &turn_id).await);
    let step_id = ids::new_ordered_id();
    let call = ToolCall::new(format!("call_{}", ids::new_id().replace('-', "")), args.name.as_str(), call_args);
    let message = Message::assistant_tool_calls(step_id.clone(), vec![call.clone()]);
    let span_ids = goondan_core::ids::SpanIdGenerator::new();
    let scope = Arc::new(CallScope {
        agent_name: Arc::from(setup.tools.agent_name.as_str()),
        instance_key: Arc::from(setup.tools.instance_key.as_str()),
        turn_id,
        step_id: Arc::from(step_id),
        message: Arc::new(message),
        workdir: Arc::from(workdir.as_path()),
        trace_id: Arc::from(ids::new_trace_id()),
        step_span_id: Arc::from(span_ids.next_hex()),
        runtime: None,
    });
    let policy = ExecutorPolicy {
        allow_registry_calls: false,
        call_timeout: args.timeout_ms.map(std::time::Duration::from_millis),
    };
    let executor =
        ToolExecutor::new(Arc::new(setup.tools.registry)).with_policy(policy).with_events(Arc::new(TracingEventSink));
    let result = executor.execute(call, &scope, &catalog).await;
    // The ToolResult is the output either way; --json keeps it on one line.
    let rendered = if global.json { serde_json::to_string(&result)? } else { serde_json::to_string_pretty(&result)? };
    writeln!(out.stdout, "{rendered}")?;
    Ok(match result.status {
        ToolStatus::Ok | ToolStatus::Pending => exit::OK,
        ToolStatus::Error => exit::FAILED,
    })
}

/// Writes an unexpected failure (not a config or tool error) to stderr.
pub fn write_fatal(out: &mut impl Write, error: &anyhow::Error) -> std::io::Result<()> {
    writeln!(out, "error: {error:#}")
}
