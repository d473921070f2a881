//! The commands: `validate`, `tool list`, `tool call`.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use anyhow::Result;
use goondan_config::{
    Bundle, Diagnostic, DiagnosticCode, EffectiveSandbox, LoadReport, PackageScope, SandboxSource, resolve_bundle_file,
};
use goondan_core::{ConversationState, JsonObject, JsonValue, ToolStatus};
use goondan_runtime::agent::{AgentBuildError, AgentOptions, AgentTooling, assemble_tooling, identity};
use goondan_runtime::store::WorkspaceAccess;
use goondan_tools::TracingEventSink;

use crate::cli::{GlobalOptions, ToolCallArgs, ValidateFormat};
use crate::exit;
use crate::output::{self, Output};

/// `gdn validate`.
pub async fn validate(global: &GlobalOptions, args: &crate::cli::ValidateArgs, out: &mut Output) -> Result<u8> {
    let fixes = if args.fix { Some(crate::fix::fix_bundle(&global.config)?) } else { None };
    let mut report = crate::workspace::load_config(global);
    // Only a bundle with Tools or Extensions needs a runtime (discovery runs `--version`).
    if let Some(bundle) = report.bundle.as_ref().filter(|bundle| has_scripts(bundle)) {
        match goondan_script::JsRuntime::discover(&|name: &str| std::env::var(name).ok()) {
            Ok(runtime) => {
                let found = check_script_modules(bundle, runtime).await;
                report.diagnostics.extend(found);
            }
            Err(error) => report.diagnostics.extend(script_runtime_warning(bundle, &error)),
        }
    }
    let warnings = report.diagnostics.iter().filter(|d| !d.is_error()).count();
    let valid = !(report.has_errors() || (args.strict && warnings > 0));
    let subject = bundle_subject(&global.config);
    let format = args.format.unwrap_or(if global.json { ValidateFormat::Json } else { ValidateFormat::Text });
    // What each agent's commands run in, once the bundle has no errors (a
    // document with errors is left out of the bundle, so what is left
    // would be misread).
    let sandboxes = report.bundle.as_ref().filter(|_| !report.has_errors()).map(agent_sandboxes).unwrap_or_default();
    match format {
        ValidateFormat::Json => {
            let mut body =
                serde_json::json!({"valid": valid, "strict": args.strict, "diagnostics": report.diagnostics});
            if let (Some(fixes), Some(body)) = (&fixes, body.as_object_mut()) {
                body.insert("fix".to_owned(), serde_json::to_value(fixes)?);
            }
            if !report.has_errors()
                && let Some(body) = body.as_object_mut()
            {
                let agents = sandboxes.iter().map(|agent| (agent.name.clone(), agent.to_json())).collect();
                body.insert("agents".to_owned(), JsonValue::Object(agents));
            }
            writeln!(out.stdout, "{}", serde_json::to_string_pretty(&body)?)?;
        }
        ValidateFormat::Github => {
            if let Some(fixes) = &fixes {
                write_fixes(fixes, &mut out.stderr)?;
            }
            for diagnostic in &report.diagnostics {
                let file =
                    report.bundle.as_ref().and_then(|b| file_of(b, diagnostic)).unwrap_or_else(|| subject.clone());
                writeln!(out.stdout, "{}", output::github_annotation(diagnostic, &file))?;
            }
        }
        ValidateFormat::Text => {
            if let Some(fixes) = &fixes {
                write_fixes(fixes, &mut out.stdout)?;
            }
            let notes: Vec<String> = sandboxes.iter().map(AgentSandbox::line).collect();
            output::write_report_with_notes(&mut out.stdout, &report.diagnostics, &subject, &notes)?;
            if args.strict && warnings > 0 && !report.has_errors() {
                output::error_line(&mut out.stderr, "--strict: warnings fail the check; fix them or drop --strict")?;
            }
        }
    }
    Ok(if valid { exit::OK } else { exit::VALIDATION })
}

/// What `validate --fix` changed, a line each, and what it could not.
fn write_fixes(fixes: &crate::fix::FixReport, to: &mut dyn std::io::Write) -> Result<()> {
    for fixed in &fixes.fixed {
        let name = fixed.name.as_deref().map(|name| format!("/{name}")).unwrap_or_default();
        writeln!(
            to,
            "fixed {}:{}: added `apiVersion: goondan.ai/v1` to {}{name}",
            fixed.file.display(),
            fixed.line,
            fixed.kind
        )?;
    }
    for unfixable in &fixes.unfixable {
        writeln!(to, "not fixed {}:{}: {}", unfixable.file.display(), unfixable.line, unfixable.reason)?;
    }
    if fixes.fixed.is_empty() && fixes.unfixable.is_empty() {
        writeln!(to, "--fix: nothing to fix")?;
    }
    Ok(())
}

/// The sandbox an agent of the bundle gets, and the labels a host must
/// carry to run it, for `gdn validate`.
struct AgentSandbox {
    name: String,
    /// `spec.placement.hostLabels` (see [`Bundle::placement_for`]); `None`:
    /// any host.
    host_labels: Option<goondan_config::HostLabels>,
    /// When no Swarm is named: what `gdn run --agent NAME` runs it in.
    sandbox: EffectiveSandbox,
    /// The other Swarms listing it whose sandbox differs, with theirs.
    elsewhere: Vec<(String, EffectiveSandbox)>,
}

impl AgentSandbox {
    /// `agent coder: sandbox workspace-write (from Swarm crew)`, where
    /// another Swarm listing it would give it another policy, and the
    /// labels a host needs to run it (`; hosts with gpu=true, zone=eu`).
    fn line(&self) -> String {
        let source = match &self.sandbox.source {
            SandboxSource::Default => "default".to_owned(),
            source => format!("from {source}"),
        };
        let mut line = format!("agent {}: sandbox {} ({source})", self.name, self.sandbox.config.policy);
        for (swarm, sandbox) in &self.elsewhere {
            line.push_str(&format!("; run in Swarm {swarm}: {}", sandbox.config.policy));
        }
        if let Some(labels) = &self.host_labels {
            let labels: Vec<String> = labels.iter().map(|(name, value)| format!("{name}={value}")).collect();
            line.push_str(&format!("; hosts with {}", labels.join(", ")));
        }
        line
    }

    /// `{"sandbox": {policy, readable, writable, network, source, swarm?}}`
    /// with each other Swarm's under `sandboxInSwarms`, and
    /// `"hostLabels": {name: value}` when the Agent sets placement labels.
    fn to_json(&self) -> JsonValue {
        let describe = |sandbox: &EffectiveSandbox| {
            let mut value = serde_json::to_value(&sandbox.config).unwrap_or(JsonValue::Null);
            if let Some(map) = value.as_object_mut() {
                let (source, swarm) = match &sandbox.source {
                    SandboxSource::Agent => ("agent", None),
                    SandboxSource::Swarm(name) => ("swarm", Some(name.clone())),
                    SandboxSource::Default => ("default", None),
                };
                map.insert("source".to_owned(), JsonValue::from(source));
                if let Some(swarm) = swarm {
                    map.insert("swarm".to_owned(), JsonValue::from(swarm));
                }
            }
            value
        };
        let mut agent = serde_json::json!({"sandbox": describe(&self.sandbox)});
        if !self.elsewhere.is_empty()
            && let Some(map) = agent.as_object_mut()
        {
            let others = self.elsewhere.iter().map(|(swarm, sandbox)| (swarm.clone(), describe(sandbox))).collect();
            map.insert("sandboxInSwarms".to_owned(), JsonValue::Object(others));
        }
        if let (Some(labels), Some(map)) = (&self.host_labels, agent.as_object_mut()) {
            let labels = labels.iter().map(|(name, value)| (name.clone(), JsonValue::from(value.as_str()))).collect();
            map.insert("hostLabels".to_owned(), JsonValue::Object(labels));
        }
        agent
    }
}

/// Every Agent a run of the bundle may start (its own, and the installed
/// packages' its Swarms list: [`Bundle::runnable_agents`]) with its sandbox
/// (see [`Bundle::sandbox_for`]) and its placement labels.
fn agent_sandboxes(bundle: &Bundle) -> Vec<AgentSandbox> {
    bundle
        .runnable_agents()
        .into_iter()
        .map(|agent| {
            let name = agent.name();
            let sandbox = bundle.sandbox_for(name, None);
            let elsewhere = bundle
                .swarms_listing(name)
                .into_iter()
                .map(|swarm| (swarm.name().to_owned(), bundle.sandbox_for(name, Some(swarm.name()))))
                .filter(|(_, other)| other.config != sandbox.config)
                .collect();
            let host_labels = bundle.placement_for(name).cloned();
            AgentSandbox { name: name.to_owned(), host_labels, sandbox, elsewhere }
        })
        .collect()
}

fn is_script(resource: &goondan_config::AnyResource) -> bool {
    matches!(resource, goondan_config::AnyResource::Tool(_) | goondan_config::AnyResource::Extension(_))
}

/// Whether the bundle or one of its installed packages has Tool or
/// Extension modules.
fn has_scripts(bundle: &goondan_config::Bundle) -> bool {
    script_packages(bundle).any(|(_, package)| package.resources().iter().any(|r| is_script(&r.resource)))
}

/// The file a diagnostic names (`tools/tools.yaml#0.spec.entry`): one of
/// the bundle's files or of its installed packages'; `None` for a path
/// that names none (a diagnostic about the bundle as a whole).
/// How reports name the bundle `-c` gives: its one YAML file, or the
/// directory of a bundle split over several.
pub(crate) fn bundle_subject(config: &std::path::Path) -> String {
    match (goondan_config::bundle_source_files(config).as_slice(), goondan_config::bundle_dir(config)) {
        ([one], _) => one.display().to_string(),
        (_, Some(dir)) => dir.display().to_string(),
        (_, None) => resolve_bundle_file(config).display().to_string(),
    }
}

fn file_of(bundle: &Bundle, diagnostic: &Diagnostic) -> Option<String> {
    let label = diagnostic.path.split('#').next()?;
    let packages = std::iter::once(bundle).chain(bundle.dependencies().iter().map(|d| &**d));
    packages.flat_map(Bundle::files).find(|f| f.label == label).map(|f| f.path.display().to_string())
}

/// A warning when the bundle has script tools or extensions and no
/// JavaScript runtime is usable.
fn script_runtime_warning(
    bundle: &goondan_config::Bundle,
    error: &goondan_script::DiscoverError,
) -> Option<Diagnostic> {
    let (package, doc) = script_packages(bundle).find_map(|(_, package)| {
        package.resources().iter().find(|r| is_script(&r.resource)).map(|doc| (package, doc))
    })?;
    let mut warning = Diagnostic::warning(
        DiagnosticCode::ScriptRuntimeMissing,
        format!("{}.spec.entry", package.document_label(doc.doc_index)),
        format!("the bundle's script tools and extensions cannot run: no usable JavaScript runtime ({error})"),
    );
    warning.suggestion =
        Some("Install Bun (https://bun.sh), or set GOONDAN_JS_RUNTIME to a Bun or Node >= 22.6 binary.".to_owned());
    Some(warning)
}

/// Every package of the bundle whose modules `gdn validate` loads: the
/// bundle itself, then its installed dependencies.
fn script_packages(bundle: &Bundle) -> impl Iterator<Item = (PackageScope, &Bundle)> {
    let dependencies = bundle.dependencies().iter().enumerate().map(|(i, d)| (PackageScope::Dependency(i), &**d));
    std::iter::once((PackageScope::Local, bundle)).chain(dependencies)
}

/// Loads each Tool and Extension module (`spec.entry`) of the bundle and of
/// its installed packages once in one script host and reports a module
/// that does not load, a declared export its `handlers` lack, or an
/// Extension without `register` (a package's naming the package). Starts
/// no host when there are none.
async fn check_script_modules(bundle: &goondan_config::Bundle, runtime: goondan_script::JsRuntime) -> Vec<Diagnostic> {
    let mut diagnostics = Vec::new();
    let mut host = None;
    let mut inspected: HashMap<Arc<Path>, Result<Vec<String>, String>> = HashMap::new();
    for (scope, package, doc) in script_packages(bundle)
        .flat_map(|(scope, package)| package.resources().iter().map(move |doc| (scope, package, doc)))
    {
        // A package's entry is against its own root (with its compiled-code fallback).
        let module_of = |entry: &str| match scope {
            PackageScope::Local => Some(goondan_tools::assembly::entry_path(bundle.root(), entry)),
            _ => goondan_tools::assembly::package_entry(bundle, scope, entry),
        };
        let of = match scope {
            PackageScope::Local => String::new(),
            _ => format!(" of the installed package {}", bundle.package_label(scope)),
        };
        if let goondan_config::AnyResource::Extension(extension) = &doc.resource {
            let Some(module) = module_of(&extension.spec.entry) else { continue };
            if !module.is_file() {
                continue;
            }
            let host = host.get_or_insert_with(|| goondan_script::ScriptHost::with_runtime(runtime.clone()));
            let file = &extension.spec.entry;
            let at = format!("{}.spec.entry", package.document_label(doc.doc_index));
            match host.inspect_extension(&module).await {
                Ok(true) => {}
                Ok(false) => {
                    let mut error = Diagnostic::error(
                        DiagnosticCode::ExtensionRegisterMissing,
                        at,
                        format!(
                            "Extension '{}'{of}: its module '{file}' exports no register function",
                            extension.name()
                        ),
                    );
                    error.suggestion = Some("export function register(api, config) { ... } from the module".to_owned());
                    diagnostics.push(error);
                }
                Err(failure) => {
                    let mut error = Diagnostic::error(
                        DiagnosticCode::ScriptModule,
                        at,
                        format!(
                            "Extension '{}'{of}: the JavaScript runtime cannot load its module '{file}': {}",
                            extension.name(),
                            failure.message
                        ),
                    );
                    error.suggestion = Some(format!("Fix {} so that it loads.", module.display()));
                    diagnostics.push(error);
                }
            }
            continue;
        }
        let goondan_config::AnyResource::Tool(tool) = &doc.resource else { continue };
        let Some(module) = module_of(&tool.spec.entry) else { continue };
        if !module.is_file() {
            continue; // The loader reports a missing entry (E_CONFIG_ENTRY_NOT_FOUND).
        }
        let host = host.get_or_insert_with(|| goondan_script::ScriptHost::with_runtime(runtime.clone()));
        let names = match inspected.get(&module) {
            Some(names) => names.clone(),
            None => {
                let names = host.inspect(&module).await.map_err(|failure| failure.message);
                inspected.insert(Arc::clone(&module), names.clone());
                names
            }
        };
        let file = &tool.spec.entry;
        match names {
            Err(why) => {
                let mut error = Diagnostic::error(
                    DiagnosticCode::ScriptModule,
                    format!("{}.spec.entry", package.document_label(doc.doc_index)),
                    format!(
                        "Tool '{}'{of}: the JavaScript runtime cannot load its module '{file}': {why}",
                        tool.name()
                    ),
                );
                error.suggestion = Some(format!("Fix {} so that it loads.", module.display()));
                diagnostics.push(error);
            }
            Ok(names) => {
                for (i, export) in tool.spec.exports.iter().enumerate() {
                    if names.contains(&export.name) {
                        continue;
                    }
                    let offered = if names.is_empty() { "none".to_owned() } else { names.join(", ") };
                    let mut error = Diagnostic::error(
                        DiagnosticCode::ScriptExportMissing,
                        format!("{}.spec.exports[{i}].name", package.document_label(doc.doc_index)),
                        format!(
                            "Tool '{}'{of} declares export '{}', but its module '{file}' has no handler for it (its handlers are: {offered})",
                            tool.name(),
                            export.name
                        ),
                    );
                    error.suggestion = Some(format!("add `{}` to the module's `handlers`", export.name));
                    diagnostics.push(error);
                }
            }
        }
    }
    if let Some(host) = host {
        // Its process stopped and its tasks done before the check reports.
        host.shutdown().await;
    }
    diagnostics
}

/// Loads the bundle and assembles the agent's tooling exactly as `gdn run`
/// does (same tools, registry, executor and middleware), or reports why not
/// (exit 2). `gdn mcp serve` assembles through it too.
pub(crate) async fn setup(
    global: &GlobalOptions,
    session: &crate::Session,
    configure: impl FnOnce(&mut AgentOptions),
    out: &mut Output,
) -> Result<std::result::Result<AgentTooling, u8>> {
    setup_in(global, session, configure, WorkspaceAccess::Use, out).await
}

/// [`setup`], with what it may do to the bundle's workspace (`tool list`
/// only looks).
async fn setup_in(
    global: &GlobalOptions,
    session: &crate::Session,
    configure: impl FnOnce(&mut AgentOptions),
    access: WorkspaceAccess,
    out: &mut Output,
) -> Result<std::result::Result<AgentTooling, u8>> {
    let (bundle, warnings) = match valid_bundle_or_exit(global, out)? {
        Ok(loaded) => loaded,
        Err(code) => return Ok(Err(code)),
    };
    for warning in &warnings {
        tracing::warn!("{warning}");
    }
    let mut options = AgentOptions::new(Arc::new(TracingEventSink));
    options.env = Arc::clone(&session.env);
    crate::wiring::install(&mut options, &session.tool_processes);
    configure(&mut options);
    // Extensions keep their state in the instance's directory, as `gdn run` does.
    let (agent_name, instance_key) = match identity(&bundle, &options) {
        Ok(identity) => identity,
        Err(error) => {
            output::error_line(&mut out.stderr, error)?;
            return Ok(Err(exit::CONFIG));
        }
    };
    let root = crate::workspace::state_root(global)?;
    // The instance's own directory in the bundle's workspace (refused if
    // another bundle's), so its extensions see the state `gdn run` left them.
    let dir = crate::workspace::open(global, &root, &bundle, &agent_name, access)
        .and_then(|workspace| workspace.instance_dir(&agent_name, &instance_key).map_err(|e| e.to_string()));
    match dir {
        Ok(dir) => options.extension_state = Some(dir.join(goondan_runtime::ExtensionStateStore::DIR_NAME)),
        Err(message) => {
            output::error_line(&mut out.stderr, message)?;
            return Ok(Err(exit::USAGE));
        }
    }
    match assemble_tooling(&bundle, &options).await {
        Ok(tooling) => Ok(Ok(tooling)),
        Err(AgentBuildError::Agent(message)) => {
            output::error_line(&mut out.stderr, message)?;
            Ok(Err(exit::CONFIG))
        }
        // An extension that cannot be installed (its module does not load, no
        // JavaScript runtime) is the bundle's or the machine's setup: a
        // configuration error, as the README's exit codes say.
        Err(error @ AgentBuildError::Extension { .. }) => {
            output::error_line(&mut out.stderr, error)?;
            Ok(Err(exit::CONFIG))
        }
        Err(error) => Err(anyhow::Error::new(error).context("registering built-in tools")),
    }
}

/// What stops a server (`gdn mcp serve`, `gdn registry serve`):
/// SIGTERM/SIGHUP, through `session.shutdown` as they cancel a running
/// turn, or Ctrl-C. The future completes at either; the flag tells whether
/// Ctrl-C came. The caller ends with `session.shutdown.turn_ended()` once
/// the server stopped.
pub fn stop_on_signals(
    session: &crate::Session,
) -> (impl std::future::Future<Output = ()> + Send + 'static, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (cancel, mut cancelled) = tokio::sync::watch::channel(false);
    session.shutdown.turn_started(cancel);
    let interrupted = std::sync::Arc::new(AtomicBool::new(false));
    let on_interrupt = std::sync::Arc::clone(&interrupted);
    let stop = async move {
        tokio::select! {
            _ = cancelled.wait_for(|cancelled| *cancelled) => {}
            Ok(()) = tokio::signal::ctrl_c() => on_interrupt.store(true, Ordering::SeqCst),
        }
    };
    (stop, interrupted)
}

/// The token named by `--auth-token-env NAME` (`gdn mcp serve`, `gdn
/// studio`), read once from the session's environment; `Err` is the line to
/// print (exit 2) when the variable is unset or blank.
pub fn auth_token(name: Option<&str>, session: &crate::Session) -> std::result::Result<Option<String>, String> {
    let Some(name) = name else { return Ok(None) };
    match (session.env)(name).filter(|token| !token.trim().is_empty()) {
        Some(token) => Ok(Some(token)),
        None => Err(format!("--auth-token-env {name}: the variable is not set or empty")),
    }
}

/// The bundle of `-c` and its warnings, or (its errors reported) the exit
/// code when it does not load.
pub fn valid_bundle_or_exit(
    global: &GlobalOptions,
    out: &mut Output,
) -> Result<std::result::Result<(Bundle, Vec<Diagnostic>), u8>> {
    let report = crate::workspace::load_config(global);
    if report.has_errors() {
        report_config_errors(global, &report, out)?;
        return Ok(Err(exit::CONFIG));
    }
    Ok(report.bundle.map(|bundle| (bundle, report.diagnostics)).ok_or(exit::CONFIG))
}

pub fn report_config_errors(global: &GlobalOptions, report: &LoadReport, out: &mut Output) -> Result<()> {
    if global.json {
        let body = serde_json::json!({"valid": false, "diagnostics": report.diagnostics});
        writeln!(out.stderr, "{}", serde_json::to_string_pretty(&body)?)?;
    } else {
        let subject = bundle_subject(&global.config);
        output::write_report(&mut out.stderr, &report.diagnostics, &subject)?;
    }
    Ok(())
}

/// `gdn tool list`.
pub async fn tool_list(
    global: &GlobalOptions,
    agent: Option<&str>,
    session: &crate::Session,
    out: &mut Output,
) -> Result<u8> {
    let configure = |options: &mut AgentOptions| options.agent = agent.map(str::to_owned);
    let tooling = match setup_in(global, session, configure, WorkspaceAccess::Inspect, out).await? {
        Ok(tooling) => tooling,
        Err(code) => return Ok(code),
    };
    // The first step of a turn on a new conversation, through the agent's step middleware.
    let catalog = tooling.preview_catalog(ConversationState::default()).await;
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
        let runnable = if tooling.registry().contains(item.name()) { "" } else { "  (no handler in this build)" };
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
        tooling.agent_name,
        output::DIM.render_reset()
    )?;
    Ok(exit::OK)
}

/// Reads `--args` / `--args-file` into a JSON object.
fn read_args(args: &ToolCallArgs) -> std::result::Result<JsonObject, String> {
    let text = match (&args.args, &args.args_file) {
        (Some(text), _) => text.clone(),
        (None, Some(path)) => crate::input::read_text(path, "--args-file", crate::input::MAX_ARGS_BYTES)?,
        (None, None) => return Ok(JsonObject::new()),
    };
    match serde_json::from_str::<JsonValue>(&text) {
        Ok(JsonValue::Object(map)) => Ok(map),
        Ok(other) => Err(format!("the arguments must be a JSON object, got {}", goondan_core::json_type_name(&other))),
        Err(error) => Err(format!("the arguments are not valid JSON: {error}")),
    }
}

/// Why `--workdir` cannot be used, if it cannot: it is no directory, or it
/// lies inside the bundle `config` names (neither the bundle's directory
/// itself, which commands see read-only, nor a place in a state root kept
/// there): commands may write their workdir, and what a model writes there
/// would be found among the bundle's files and read as configuration.
pub(crate) fn workdir_error(workdir: Option<&Path>, config: &Path) -> Option<String> {
    let dir = workdir?;
    if !dir.is_dir() {
        return Some(format!("--workdir {} is not a directory", dir.display()));
    }
    let bundle = goondan_config::bundle_dir(config).and_then(|bundle| std::fs::canonicalize(bundle).ok())?;
    let work = std::fs::canonicalize(dir).ok()?;
    let in_state_root = work
        .ancestors()
        .take_while(|place| *place != bundle)
        .any(|place| place.join(goondan_core::package_dir::STATE_ROOT_MARKER).exists());
    (work != bundle && work.starts_with(&bundle) && !in_state_root).then(|| {
        format!(
            "--workdir {} is inside the bundle {}: what the model writes there could be read as the bundle's \
             files; choose a directory outside it (the default is the workspace's own), or the bundle's directory \
             itself, which commands see read-only",
            dir.display(),
            bundle.display()
        )
    })
}

/// `gdn tool call`.
pub async fn tool_call(
    global: &GlobalOptions,
    args: &ToolCallArgs,
    session: &crate::Session,
    out: &mut Output,
) -> Result<u8> {
    let call_args = match read_args(args) {
        Ok(map) => map,
        Err(message) => return out.fail(exit::USAGE, message),
    };
    if let Some(message) = crate::commands::workdir_error(args.workdir.as_deref(), &global.config) {
        return out.fail(exit::USAGE, message);
    }
    let configure = |options: &mut AgentOptions| {
        options.agent.clone_from(&args.agent);
        options.workdir.clone_from(&args.workdir);
        options.call_timeout = args.timeout_ms.map(std::time::Duration::from_millis);
    };
    let tooling = match setup(global, session, configure, out).await? {
        Ok(tooling) => tooling,
        Err(code) => return Ok(code),
    };
    let result = tooling.call_tool(&args.name, call_args).await;
    // The ToolResult is the output either way; --json keeps it on one line.
    let rendered = if global.json { serde_json::to_string(&result)? } else { serde_json::to_string_pretty(&result)? };
    writeln!(out.stdout, "{rendered}")?;
    // For people: where the code is explained (the JSON has its helpUrl).
    if let Some(hint) = result.error_code().filter(|_| !global.json).and_then(crate::help::hint) {
        writeln!(out.stderr, "{hint}")?;
    }
    Ok(match result.status {
        ToolStatus::Ok | ToolStatus::Pending => exit::OK,
        ToolStatus::Error => exit::FAILED,
    })
}
