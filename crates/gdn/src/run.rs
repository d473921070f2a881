//! `gdn run`: one turn (`--input`), or an interactive session, of an agent
//! whose conversation lives in the state root.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, anyhow};
use goondan_config::{load_bundle, resolve_bundle_file};
use goondan_core::{ToolCall, ToolResult, ToolStatus};
use goondan_runtime::agent::{AgentOptions, EnvLookup, build_agent, identity};
use goondan_runtime::conversation::{Conversation, InstanceLog};
use goondan_runtime::store::{InstanceStore, StateRoot};
use goondan_runtime::turn::{Agent, TurnObserver};
use goondan_runtime::{TurnEnd, TurnOutcome};
use goondan_tools::{EventSink, FanoutEventSink, JsonLinesEventSink, TracingEventSink};
use tokio::sync::watch;

use crate::cli::{GlobalOptions, RunArgs};
use crate::exit;
use crate::output::{self, Output};

/// The state root from `--state-root`, `GOONDAN_STATE_ROOT` or `~/.goondan`.
pub(crate) fn state_root(global: &GlobalOptions) -> Result<StateRoot> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    StateRoot::resolve(global.state_root.clone(), std::env::var("GOONDAN_STATE_ROOT").ok(), home)
        .map_err(|e| anyhow!("{e}"))
}

/// `env` (the process environment and its secrets), then the `--env-file`.
fn env_lookup(env: &EnvLookup, env_file: Option<&Path>) -> Result<EnvLookup, String> {
    let Some(path) = env_file else { return Ok(Arc::clone(env)) };
    let file: BTreeMap<String, String> = crate::dotenv::load(path)?;
    let env = Arc::clone(env);
    Ok(Arc::new(move |name: &str| env(name).or_else(|| file.get(name).cloned())))
}

fn usage_error(out: &mut Output, message: &str) -> Result<u8> {
    output::error_line(&mut out.stderr, message)?;
    Ok(exit::USAGE)
}

/// Prints the turn as it happens (the runtime saves it).
struct Console {
    json: bool,
    /// Text was streamed in this turn.
    streamed: Mutex<bool>,
    /// Tool lines were printed since the last text: the next text starts a new paragraph.
    after_tools: Mutex<bool>,
    color: bool,
}

impl TurnObserver for Console {
    fn text_delta(&self, text: &str) {
        if self.json {
            return;
        }
        let mut stdout = anstream::stdout();
        let paragraph = self.after_tools.lock().map(|mut after| std::mem::take(&mut *after)).unwrap_or(false);
        let streamed = self.streamed.lock().map(|s| *s).unwrap_or(false);
        if paragraph && streamed {
            let _ = writeln!(stdout);
        }
        let _ = write!(stdout, "{text}");
        let _ = stdout.flush();
        if let Ok(mut streamed) = self.streamed.lock() {
            *streamed = true;
        }
    }

    fn tool_call_finished(&self, call: &ToolCall, result: &ToolResult) {
        let (style, status) = match result.status {
            ToolStatus::Ok => (output::OK, "ok".to_owned()),
            ToolStatus::Pending => (output::WARNING, "pending".to_owned()),
            ToolStatus::Error => (output::ERROR, result.error_code().unwrap_or("error").to_owned()),
        };
        let mut stderr = if self.color { anstream::stderr() } else { anstream::AutoStream::never(std::io::stderr()) };
        let streamed = self.streamed.lock().map(|s| *s).unwrap_or(false);
        let after = self.after_tools.lock().map(|a| *a).unwrap_or(false);
        if streamed && !after && !self.json {
            // End the streamed line before the tool lines.
            let mut stdout = anstream::stdout();
            let _ = writeln!(stdout);
            let _ = stdout.flush();
        }
        let _ = writeln!(
            stderr,
            "{}  ⚙ {} → {style}{status}{style:#}{}",
            output::DIM,
            call.name,
            output::DIM.render_reset()
        );
        if let Ok(mut after) = self.after_tools.lock() {
            *after = true;
        }
    }
}

/// `gdn run`.
pub async fn run(global: &GlobalOptions, args: &RunArgs, session: &crate::Session, out: &mut Output) -> Result<u8> {
    let report = load_bundle(&global.config);
    if report.has_errors() {
        crate::commands::report_config_errors(global, &report, out)?;
        return Ok(exit::USAGE);
    }
    let Some(bundle) = report.bundle else { return Ok(exit::USAGE) };
    let env = match env_lookup(&session.env, args.env_file.as_deref()) {
        Ok(env) => env,
        Err(message) => return usage_error(out, &message),
    };
    if let Some(dir) = args.workdir.as_ref().filter(|dir| !dir.is_dir()) {
        return usage_error(out, &format!("--workdir {} is not a directory", dir.display()));
    }
    let root = state_root(global)?;
    let mut options = AgentOptions::new(Arc::new(TracingEventSink));
    options.agent.clone_from(&args.agent);
    options.instance_key.clone_from(&args.instance_key);
    options.workdir.clone_from(&args.workdir);
    options.env = env;
    // A deadline per call by default; 0 turns it off.
    options.call_timeout = match args.tool_timeout_ms.unwrap_or(DEFAULT_TOOL_TIMEOUT_MS) {
        0 => None,
        ms => Some(std::time::Duration::from_millis(ms)),
    };
    crate::wiring::install(&mut options, &session.tool_processes);
    let (agent_name, instance_key) = match identity(&bundle, &options) {
        Ok(identity) => identity,
        Err(error) => return usage_error(out, &error.to_string()),
    };
    let bundle_file = std::fs::canonicalize(resolve_bundle_file(&global.config))
        .unwrap_or_else(|_| resolve_bundle_file(&global.config));
    let store = InstanceStore::open(&root, &instance_key, &agent_name, &bundle_file)
        .with_context(|| format!("opening instance '{instance_key}' in {}", root.path().display()))?;
    // One process per instance: a second `gdn run` on it is refused, not interleaved.
    let _held = match store.lock() {
        Ok(lock) => lock,
        Err(error) => return usage_error(out, &error.to_string()),
    };
    let loaded = store.load().with_context(|| format!("reading the conversation of '{instance_key}'"))?;
    if loaded.skipped_torn_tail || loaded.skipped_corrupt_lines > 0 {
        tracing::warn!(
            "instance '{instance_key}': skipped {} unreadable line(s) of its conversation log",
            loaded.skipped_corrupt_lines + usize::from(loaded.skipped_torn_tail)
        );
    }
    let event_log = Arc::new(
        JsonLinesEventSink::new(store.event_writer().with_context(|| "opening the event log")?)
            .with_context(|| "starting the event writer")?,
    );
    options.events =
        Arc::new(FanoutEventSink::new(vec![Arc::clone(&event_log) as Arc<dyn EventSink>, Arc::new(TracingEventSink)]));
    options.extension_state = Some(store.dir().join(goondan_runtime::ExtensionStateStore::DIR_NAME));
    let mut agent = match build_agent(&bundle, &options).await {
        Ok(agent) => agent,
        // The bundle is fine; its extension failed when it ran.
        Err(error @ goondan_runtime::AgentBuildError::Extension { .. }) => {
            output::error_line(&mut out.stderr, error)?;
            return Ok(exit::FAILED);
        }
        Err(error) => return usage_error(out, &error.to_string()),
    };

    let console = Console {
        json: global.json,
        streamed: Mutex::new(false),
        after_tools: Mutex::new(false),
        color: !global.no_color,
    };
    let mut conversation = Conversation::new(loaded.state, Arc::new(InstanceLog::new(store, loaded.events_on_disk)));

    let single_input = match (&args.input, &args.input_file) {
        (Some(text), _) => Some(text.clone()),
        (None, Some(path)) if path == Path::new("-") => {
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text).context("reading the input from standard input")?;
            Some(text)
        }
        (None, Some(path)) => match std::fs::read_to_string(path) {
            Ok(text) => Some(text),
            Err(error) => return usage_error(out, &format!("cannot read --input-file {}: {error}", path.display())),
        },
        (None, None) => None,
    };

    let code = match single_input {
        Some(input) => {
            let outcome = one_turn(&agent, &console, &mut conversation, input, &session.shutdown).await;
            report_outcome(global, &console, &outcome, out)?;
            if outcome.restart_requested {
                reload(global, &options, &mut agent, out).await?;
            }
            session.shutdown.requested().unwrap_or_else(|| outcome_code(&outcome.end))
        }
        None => {
            let chat = Chat { global, options: &options, console: &console, root: &root, shutdown: &session.shutdown };
            interactive(&chat, &mut agent, &mut conversation, out).await?
        }
    };
    event_log.flush_and_wait();
    Ok(code)
}

/// The default deadline of one tool call in `gdn run` (`--tool-timeout-ms`).
pub const DEFAULT_TOOL_TIMEOUT_MS: u64 = 600_000;

/// Runs one turn, cancelling it on Ctrl-C (and on SIGTERM or SIGHUP, after
/// which the run ends).
async fn one_turn(
    agent: &Agent,
    console: &Console,
    conversation: &mut Conversation,
    input: String,
    shutdown: &crate::shutdown::Shutdown,
) -> TurnOutcome {
    let (cancel, cancelled) = watch::channel(false);
    shutdown.turn_started(cancel.clone());
    let interrupt = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            let _ = cancel.send(true);
        }
    });
    if let Ok(mut streamed) = console.streamed.lock() {
        *streamed = false;
    }
    if let Ok(mut after) = console.after_tools.lock() {
        *after = false;
    }
    let outcome = agent.run_turn(conversation, input, console, cancelled).await;
    interrupt.abort();
    shutdown.turn_ended();
    outcome
}

fn outcome_code(end: &TurnEnd) -> u8 {
    match end {
        TurnEnd::Answered => exit::OK,
        TurnEnd::Cancelled => 130,
        TurnEnd::StepLimit { .. } => exit::OK,
        TurnEnd::MalformedReplies { .. }
        | TurnEnd::ModelFailed { .. }
        | TurnEnd::CommitFailed { .. }
        | TurnEnd::LayerFailed(_) => exit::FAILED,
    }
}

fn report_outcome(global: &GlobalOptions, console: &Console, outcome: &TurnOutcome, out: &mut Output) -> Result<()> {
    if global.json {
        let body = serde_json::json!({
            "text": outcome.text,
            "steps": outcome.steps,
            "end": outcome.end.as_str(),
            "note": outcome.end.note(),
            "usage": outcome.usage,
            "restartRequested": outcome.restart_requested,
        });
        writeln!(out.stdout, "{body}")?;
        return Ok(());
    }
    let streamed = console.streamed.lock().map(|s| *s).unwrap_or(false);
    match &outcome.end {
        TurnEnd::Answered if streamed => writeln!(out.stdout)?,
        TurnEnd::Answered => writeln!(out.stdout, "{}", outcome.text)?,
        TurnEnd::StepLimit { .. } | TurnEnd::MalformedReplies { .. } => {
            if streamed {
                writeln!(out.stdout)?;
            } else if !outcome.text.is_empty() {
                writeln!(out.stdout, "{}", outcome.text)?;
            }
            if let Some(note) = outcome.end.note() {
                output::note_line(&mut out.stderr, format_args!("[{note}]"))?;
            }
        }
        TurnEnd::Cancelled => {
            writeln!(out.stderr)?;
            output::note_line(&mut out.stderr, "cancelled")?;
        }
        TurnEnd::ModelFailed { .. } | TurnEnd::CommitFailed { .. } | TurnEnd::LayerFailed(_) => {
            if let Some(note) = outcome.end.note() {
                output::error_line(&mut out.stderr, note)?;
            }
        }
    }
    Ok(())
}

/// Reloads the bundle and rebuilds the agent after a self-restart request.
async fn reload(global: &GlobalOptions, options: &AgentOptions, agent: &mut Agent, out: &mut Output) -> Result<()> {
    let report = load_bundle(&global.config);
    let rebuilt = match report.valid_bundle() {
        Some(bundle) => build_agent(bundle, options).await.map_err(|e| e.to_string()),
        None => Err("the bundle has errors".to_owned()),
    };
    match rebuilt {
        Ok(new_agent) => {
            *agent = new_agent;
            writeln!(out.stderr, "{}↻ restarted: the bundle was reloaded{}", output::DIM, output::DIM.render_reset())?;
        }
        Err(error) => output::warning_line(
            &mut out.stderr,
            format_args!("restart requested, but the bundle could not be reloaded: {error}; keeping the running agent"),
        )?,
    }
    Ok(())
}

/// What an interactive session keeps besides the agent and conversation.
struct Chat<'a> {
    global: &'a GlobalOptions,
    options: &'a AgentOptions,
    console: &'a Console,
    root: &'a StateRoot,
    shutdown: &'a crate::shutdown::Shutdown,
}

/// The interactive session: line editing and history, answers streamed.
async fn interactive(
    chat: &Chat<'_>,
    agent: &mut Agent,
    conversation: &mut Conversation,
    out: &mut Output,
) -> Result<u8> {
    let Chat { global, options, console, root, shutdown } = *chat;
    let mut editor = rustyline::DefaultEditor::new().context("starting the line editor")?;
    let history_file = root.path().join("repl_history");
    let _ = editor.load_history(&history_file);
    writeln!(
        out.stderr,
        "{}agent '{}' (instance '{}') — Ctrl-D to quit, Ctrl-C cancels a turn{}",
        output::DIM,
        agent.tooling.agent_name,
        agent.tooling.instance_key,
        output::DIM.render_reset()
    )?;
    loop {
        let line = match editor.readline("› ") {
            Ok(line) => line,
            Err(rustyline::error::ReadlineError::Interrupted) => continue,
            Err(rustyline::error::ReadlineError::Eof) => break,
            Err(error) => return Err(anyhow!("reading input: {error}")),
        };
        let input = line.trim();
        if input.is_empty() {
            continue;
        }
        if matches!(input, "/exit" | "/quit") {
            break;
        }
        let _ = editor.add_history_entry(input);
        let outcome = one_turn(agent, console, conversation, input.to_owned(), shutdown).await;
        report_outcome(global, console, &outcome, out)?;
        if let Some(code) = shutdown.requested() {
            let _ = editor.save_history(&history_file);
            return Ok(code);
        }
        if outcome.restart_requested {
            reload(global, options, agent, out).await?;
        }
    }
    if let Some(parent) = history_file.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let _ = editor.save_history(&history_file);
    Ok(exit::OK)
}
