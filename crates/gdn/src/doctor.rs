//! `gdn doctor`: is this machine ready to run this bundle?
//!
//! What the original checks (the runtime, the keys the bundle names, the
//! state folder), and what this runtime needs besides: a JavaScript runtime
//! (Bun, or Node ≥ 22.6) where the bundle has script entries, the commands
//! of its stdio MCP servers, the ports of its HTTP connectors, a writable
//! state root, and one that only its user can read (directories 0700,
//! files 0600: it holds every conversation). Each line is ok, a warning or
//! an error with its fix; any error makes the exit status 1. `--fix`
//! repairs what it can without asking: today, the state root's
//! permissions (see [`make_private`]).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Result;
use goondan_config::{AnyResource, Bundle, PackageScope, resolve_bundle_file};
use serde::Serialize;

use crate::cli::GlobalOptions;
use crate::exit;
use crate::output::{self, Output};

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Level {
    Ok,
    Warning,
    Error,
}

/// One line of the report.
#[derive(Debug, Clone, Serialize)]
struct Check {
    category: &'static str,
    name: String,
    level: Level,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<String>,
}

#[derive(Default)]
struct Report {
    checks: Vec<Check>,
}

impl Report {
    fn push(&mut self, category: &'static str, name: impl Into<String>, level: Level, detail: impl Into<String>) {
        self.checks.push(Check { category, name: name.into(), level, detail: detail.into(), fix: None });
    }

    fn fail(
        &mut self,
        category: &'static str,
        name: impl Into<String>,
        level: Level,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) {
        self.checks.push(Check { category, name: name.into(), level, detail: detail.into(), fix: Some(fix.into()) });
    }

    fn count(&self, level: Level) -> usize {
        self.checks.iter().filter(|c| c.level == level).count()
    }
}

/// `gdn doctor [--fix]`.
pub fn doctor(global: &GlobalOptions, fix: bool, session: &crate::Session, out: &mut Output) -> Result<u8> {
    let mut report = Report::default();
    report.push("System", "gdn", Level::Ok, format!("gdn {}", env!("CARGO_PKG_VERSION")));

    let file = crate::commands::bundle_subject(&global.config);
    let env = |name: &str| (session.env)(name);
    if !goondan_config::bundle_source_files(&global.config).iter().any(|f| f.is_file()) {
        report.fail(
            "Bundle",
            "bundle",
            Level::Error,
            format!("missing: {file}"),
            "Create one with `gdn init`, or name it with -c PATH.",
        );
    } else {
        let loaded = crate::workspace::load_config(global);
        let errors = loaded.diagnostics.iter().filter(|d| d.is_error()).count();
        let warnings = loaded.diagnostics.len() - errors;
        if errors > 0 {
            report.fail(
                "Bundle",
                "validation",
                Level::Error,
                format!("{file}: {errors} error(s), {warnings} warning(s)"),
                "Run `gdn validate` for each problem and its fix.",
            );
        } else {
            report.push("Bundle", "validation", Level::Ok, format!("{file}: valid ({warnings} warning(s))"));
        }
        if let Some(bundle) = loaded.bundle.as_ref() {
            check_script_runtime(bundle, &mut report);
            check_sandbox(bundle, &mut report);
            check_models(bundle, &env, &mut report);
            check_mcp_servers(bundle, &env, &mut report);
            check_connections(global, bundle, &env, &mut report);
        }
    }
    check_state_root(global, fix, &mut report);
    // Grouped by category, in this order; checks keep their order within one.
    const ORDER: [&str; 6] = ["System", "Bundle", "Keys", "MCP servers", "Connections", "State"];
    report.checks.sort_by_key(|check| ORDER.iter().position(|c| *c == check.category).unwrap_or(ORDER.len()));

    if global.json {
        let body = serde_json::json!({
            "checks": report.checks,
            "passed": report.count(Level::Ok),
            "warnings": report.count(Level::Warning),
            "errors": report.count(Level::Error),
        });
        writeln!(out.stdout, "{}", serde_json::to_string_pretty(&body)?)?;
    } else {
        let mut category = "";
        for check in &report.checks {
            if check.category != category {
                category = check.category;
                writeln!(out.stdout, "{}{category}{}", output::BOLD, output::BOLD.render_reset())?;
            }
            let (mark, style) = match check.level {
                Level::Ok => ("✓", output::OK),
                Level::Warning => ("!", output::WARNING),
                Level::Error => ("✗", output::ERROR),
            };
            writeln!(out.stdout, "  {style}{mark}{style:#} {}: {}", check.name, check.detail)?;
            if let Some(fix) = &check.fix {
                writeln!(out.stdout, "    {}fix:{} {fix}", output::DIM, output::DIM.render_reset())?;
            }
        }
        writeln!(
            out.stdout,
            "{} passed, {} warning(s), {} error(s)",
            report.count(Level::Ok),
            report.count(Level::Warning),
            report.count(Level::Error)
        )?;
    }
    Ok(if report.count(Level::Error) > 0 { exit::FAILED } else { exit::OK })
}

/// Bun, or Node ≥ 22.6, where the bundle has its own Tool, Extension or
/// Connector modules.
fn check_script_runtime(bundle: &Bundle, report: &mut Report) {
    let scripts = bundle
        .resources()
        .iter()
        .filter(|r| matches!(r.resource, AnyResource::Tool(_) | AnyResource::Extension(_) | AnyResource::Connector(_)))
        .count();
    if scripts == 0 {
        report.push("System", "JavaScript runtime", Level::Ok, "not needed (no script modules in the bundle)");
        return;
    }
    match goondan_script::JsRuntime::discover(&|name: &str| std::env::var(name).ok()) {
        Ok(runtime) => report.push(
            "System",
            "JavaScript runtime",
            Level::Ok,
            format!("{runtime:?} for the bundle's {scripts} script module(s)"),
        ),
        Err(error) => report.fail(
            "System",
            "JavaScript runtime",
            Level::Error,
            format!("the bundle has {scripts} script module(s): {error}"),
            "Install Bun (https://bun.sh), or set GOONDAN_JS_RUNTIME to a Bun or Node >= 22.6 binary.",
        ),
    }
}

/// Whether the agents' sandbox policies can be enforced here: Landlock and
/// its features, and whether a confined `true` runs (with user namespaces,
/// or in the stricter Landlock-only layout).
fn check_sandbox(bundle: &Bundle, report: &mut Report) {
    let confined: Vec<String> = bundle
        .runnable_agents()
        .into_iter()
        .filter(|agent| bundle.sandbox_for(agent.name(), None).config.policy != goondan_config::SandboxPolicy::Full)
        .map(|agent| agent.name().to_owned())
        .collect();
    if confined.is_empty() {
        report.push("System", "Sandbox", Level::Ok, "not used (every agent has policy: full)");
        return;
    }
    let support = goondan_sandbox::kernel_support();
    if let Some(missing) = support.missing() {
        report.fail(
            "System",
            "Sandbox",
            Level::Error,
            format!("agents {} run confined, but {missing}: their commands will be refused", confined.join(", ")),
            "Use a kernel with Landlock, or set spec.sandbox.policy: full on those agents knowingly (their commands then run with your full rights).",
        );
        return;
    }
    let sandbox = goondan_sandbox::Sandbox::new(goondan_sandbox::SandboxSpec {
        workdir: bundle.root().to_path_buf(),
        ..goondan_sandbox::SandboxSpec::default()
    });
    let mut probe = std::process::Command::new("true");
    let tried = sandbox.confine(&mut probe).map_err(|e| e.to_string()).and_then(|()| {
        probe.status().map_err(|e| e.to_string()).and_then(|s| if s.success() { Ok(()) } else { Err(s.to_string()) })
    });
    let features = [
        (support.landlock_refer, "moves between directories"),
        (support.landlock_tcp, "TCP rules"),
        (support.landlock_scopes, "signal scoping"),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|(_, name)| *name)
    .collect::<Vec<_>>()
    .join(", ");
    match (tried, sandbox.uses_namespaces()) {
        (Ok(()), Some(true)) => report.push(
            "System",
            "Sandbox",
            Level::Ok,
            format!("Landlock ({features}), seccomp, user namespaces: agents {} run confined", confined.join(", ")),
        ),
        (Ok(()), _) => report.fail(
            "System",
            "Sandbox",
            Level::Warning,
            format!(
                "Landlock ({features}) and seccomp, but no user namespaces: agents {} run in the stricter layout (no new files directly in the workdir; network.allow refused)",
                confined.join(", ")
            ),
            "Allow unprivileged user namespaces (e.g. sysctl kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu) for the full workspace-write layout.",
        ),
        (Err(error), _) => report.fail(
            "System",
            "Sandbox",
            Level::Error,
            format!("a confined test command failed: {error}"),
            "Run gdn doctor -v for details; or set spec.sandbox.policy: full on the agents knowingly.",
        ),
    }
}

/// Each Model's key, as the model client will look for it.
fn check_models(bundle: &Bundle, env: &dyn Fn(&str) -> Option<String>, report: &mut Report) {
    for resource in bundle.resources() {
        let AnyResource::Model(model) = &resource.resource else { continue };
        match goondan_llm::config::ModelSettings::from_spec(&model.spec, env, bundle.root()) {
            Ok(_) => report.push("Keys", format!("Model {}", model.name()), Level::Ok, "its key and endpoint resolve"),
            Err(error) => report.fail(
                "Keys",
                format!("Model {}", model.name()),
                Level::Error,
                error.to_string(),
                "Export the variable, or put it in the bundle's .env (gdn reads it; no tool sees it).",
            ),
        }
    }
}

/// The programs of stdio MCP servers.
fn check_mcp_servers(bundle: &Bundle, env: &dyn Fn(&str) -> Option<String>, report: &mut Report) {
    for agent in bundle.runnable_agents() {
        for extension in &agent.resource.spec.extensions {
            if extension.reference.name != goondan_mcp::EXTENSION_NAME
                || !matches!(
                    bundle.resolve_from(agent.scope, &extension.reference).map(|r| r.scope),
                    Ok(PackageScope::Base)
                )
            {
                continue;
            }
            let Some(config) = &extension.config else { continue };
            match goondan_mcp::config::parse_config(config, env) {
                Ok(parsed) => {
                    for (name, server) in &parsed.servers {
                        let goondan_mcp::config::ServerConfig::Stdio(stdio) = server else { continue };
                        let label = format!("{} › {name}", agent.name());
                        match find_program(&stdio.command) {
                            Some(path) => report.push("MCP servers", label, Level::Ok, path.display().to_string()),
                            None => report.fail(
                                "MCP servers",
                                label,
                                Level::Error,
                                format!("'{}' is not a program on PATH", stdio.command),
                                "Install it, or give its full path in the server's command.",
                            ),
                        }
                    }
                }
                Err(error) => report.fail(
                    "MCP servers",
                    agent.name().to_owned(),
                    Level::Error,
                    error.to_string(),
                    "Fix the mcp extension's config (gdn validate shows where).",
                ),
            }
        }
    }
}

/// `command` as the system finds it: a path with a slash as it is, else
/// the first executable of that name on `PATH`.
fn find_program(command: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let executable = |path: &Path| path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if command.contains('/') {
        let path = PathBuf::from(command);
        return executable(&path).then_some(path);
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join(command)).find(|path| executable(path))
}

/// Each Connection's secrets and, for HTTP connectors, whether its port is
/// free (or held by this project's running service).
fn check_connections(
    global: &GlobalOptions,
    bundle: &Bundle,
    env: &dyn Fn(&str) -> Option<String>,
    report: &mut Report,
) {
    let running = crate::workspace::state_root(global).ok().and_then(|root| {
        let dir = root.workspaces_dir();
        std::fs::read_dir(dir).ok()?.flatten().find_map(|entry| {
            goondan_service::status::ServiceStatus::running(&entry.path())
                .filter(|status| Path::new(&status.bundle) == resolve_bundle_file(&global.config).as_path())
        })
    });
    for swarm in bundle.all_swarms() {
        let plans =
            match goondan_service::plan::plan_connections(bundle, swarm.name(), &swarm.spec.entry_agent.name, env) {
                Ok(plans) => plans,
                Err(errors) => {
                    for error in errors {
                        report.fail(
                            "Connections",
                            format!("Swarm {}", swarm.name()),
                            Level::Error,
                            error,
                            "Set the variable (export it, or put it in the bundle's .env).",
                        );
                    }
                    continue;
                }
            };
        for plan in plans {
            let label = format!("{} ({})", plan.name, plan.connector);
            let Some(address) = goondan_ingress::connectors::listen_address(&plan.connector, &plan.name, &plan.config)
            else {
                report.push("Connections", label, Level::Ok, "ready");
                continue;
            };
            match address {
                Err(error) => report.fail(
                    "Connections",
                    label,
                    Level::Error,
                    error.to_string(),
                    "Fix the key in the Connection's config.",
                ),
                Ok((host, port)) => {
                    let shown = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
                    let ours = running.as_ref().is_some_and(|s| s.listening.iter().any(|l| l.ends_with(&shown)));
                    if ours {
                        report.push(
                            "Connections",
                            label,
                            Level::Ok,
                            format!("{shown} (served by the running service)"),
                        );
                    } else if std::net::TcpListener::bind((host.as_str(), port)).is_ok() {
                        report.push("Connections", label, Level::Ok, format!("{shown} is free"));
                    } else {
                        report.fail(
                            "Connections",
                            label,
                            Level::Error,
                            format!("{shown} is in use (or cannot be bound)"),
                            "Stop what listens there, or set another port in the Connection's config.",
                        );
                    }
                }
            }
        }
    }
}

/// The state root exists (or can be made, 0700) and takes a file; and no
/// other user can read it (with `fix`: made so).
fn check_state_root(global: &GlobalOptions, fix: bool, report: &mut Report) {
    let root = match crate::workspace::state_root(global) {
        Ok(root) => root,
        Err(error) => {
            report.fail(
                "State",
                "state root",
                Level::Error,
                error.to_string(),
                "Set GOONDAN_STATE_ROOT or --state-root.",
            );
            return;
        }
    };
    let path = root.path().to_path_buf();
    let probe = path.join(format!(".doctor-{}", std::process::id()));
    let writable = goondan_runtime::store::create_private_dir_all(&path)
        .and_then(|()| goondan_runtime::store::private_file().write(true).create_new(true).open(&probe).map(drop));
    let _ = std::fs::remove_file(&probe);
    match writable {
        Ok(()) => {
            let services: BTreeMap<String, u32> = std::fs::read_dir(root.workspaces_dir())
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|entry| {
                    goondan_service::status::ServiceStatus::running(&entry.path())
                        .map(|s| (entry.file_name().to_string_lossy().into_owned(), s.pid))
                })
                .collect();
            let running = if services.is_empty() {
                String::new()
            } else {
                let list: Vec<String> = services.iter().map(|(w, pid)| format!("{w} (pid {pid})")).collect();
                format!("; services running: {}", list.join(", "))
            };
            report.push("State", "state root", Level::Ok, format!("{} is writable{running}", path.display()));
        }
        Err(error) => {
            report.fail(
                "State",
                "state root",
                Level::Error,
                format!("{}: {error}", path.display()),
                "Make it writable, or point GOONDAN_STATE_ROOT (--state-root) elsewhere.",
            );
            return;
        }
    }
    check_private(&path, fix, report);
}

/// What a walk of the state root found open to other users.
#[derive(Debug, Default)]
struct Loose {
    /// Directories and files with a group or other permission bit.
    entries: Vec<(PathBuf, u32)>,
}

/// Whether `path` is a workspace's default working directory
/// (`<root>/workspaces/<id>/workdir`): the agents' files, which keep the
/// user's umask (the directory itself is private, its content is not
/// looked into).
fn is_workdir(root: &Path, path: &Path) -> bool {
    path.file_name().is_some_and(|name| name == crate::workspace::WORKDIR)
        && path.parent().and_then(Path::parent)
            == Some(root.join(goondan_runtime::store::StateRoot::WORKSPACES_DIR_NAME).as_path())
}

/// The state root's directories (itself included) and files whose mode
/// gives the group or others any access; symbolic links are not followed
/// (nor reported: their own mode means nothing), nor is an entry that
/// cannot be read, nor the content of a workspace's working directory.
fn loose_entries(root: &Path) -> Loose {
    use std::os::unix::fs::PermissionsExt as _;
    let mut loose = Loose::default();
    let mut pending = vec![root.to_path_buf()];
    while let Some(path) = pending.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            loose.entries.push((path.clone(), mode));
        }
        if meta.is_dir() && !is_workdir(root, &path) {
            pending.extend(std::fs::read_dir(&path).into_iter().flatten().flatten().map(|entry| entry.path()));
        }
    }
    loose
}

/// Reports a state root that other users can read, or with `fix` makes
/// it private.
fn check_private(root: &Path, fix: bool, report: &mut Report) {
    let loose = loose_entries(root);
    let shown = root.display();
    if loose.entries.is_empty() {
        report.push("State", "permissions", Level::Ok, format!("{shown}: only its user can read it (0700/0600)"));
        return;
    }
    if fix {
        let made = make_private(root);
        if made.failed.is_empty() {
            report.push(
                "State",
                "permissions",
                Level::Ok,
                format!("{shown}: made private ({} entries changed: directories 0700, files 0600)", made.changed),
            );
        } else {
            let (path, error) = &made.failed[0];
            report.fail(
                "State",
                "permissions",
                Level::Error,
                format!(
                    "{shown}: {} entries could not be made private (first: {}: {error}); {} were",
                    made.failed.len(),
                    path.display(),
                    made.changed
                ),
                format!("Make them yours (chown -R \"$USER\" {shown}), then run gdn doctor --fix again."),
            );
        }
        return;
    }
    let (first, mode) = &loose.entries[0];
    report.fail(
        "State",
        "permissions",
        Level::Warning,
        format!(
            "{shown} holds every conversation, but {} of its entries are open to other users (e.g. {} is {mode:04o})",
            loose.entries.len(),
            first.display()
        ),
        format!("Run gdn doctor --fix (directories 0700, files 0600), or chmod -R go-rwx {shown}."),
    );
}

/// What [`make_private`] did.
#[derive(Debug, Default)]
struct MadePrivate {
    /// How many entries changed mode.
    changed: usize,
    /// The entries that could not be changed, with why.
    failed: Vec<(PathBuf, std::io::Error)>,
}

/// Sets every directory under `root` (and `root`) to 0700 and every
/// other entry (files, sockets) to 0600, without following symbolic
/// links: a link is left alone, and so is whatever it points to. A
/// workspace's working directory is made 0700, its content left as the
/// agents made it (scripts stay executable).
fn make_private(root: &Path) -> MadePrivate {
    use goondan_runtime::store::{PRIVATE_DIR_MODE, PRIVATE_FILE_MODE};
    use std::os::unix::fs::PermissionsExt as _;
    let mut made = MadePrivate::default();
    let mut pending = vec![root.to_path_buf()];
    while let Some(path) = pending.pop() {
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            // Gone since it was listed.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => {
                made.failed.push((path, error));
                continue;
            }
        };
        if meta.file_type().is_symlink() {
            continue;
        }
        let wanted = if meta.is_dir() { PRIVATE_DIR_MODE } else { PRIVATE_FILE_MODE };
        if meta.permissions().mode() & 0o7777 != wanted {
            match chmod_no_follow(&path, wanted) {
                Ok(()) => made.changed += 1,
                Err(error) => made.failed.push((path.clone(), error)),
            }
        }
        if meta.is_dir() && !is_workdir(root, &path) {
            match std::fs::read_dir(&path) {
                Ok(entries) => pending.extend(entries.flatten().map(|entry| entry.path())),
                Err(error) => made.failed.push((path, error)),
            }
        }
    }
    made
}

/// chmod that never follows a symbolic link: one that took the entry's
/// place since it was looked at is refused.
fn chmod_no_follow(path: &Path, mode: u32) -> std::io::Result<()> {
    use nix::sys::stat::{FchmodatFlags, Mode, fchmodat};
    let mode = Mode::from_bits_truncate(mode);
    fchmodat(nix::fcntl::AT_FDCWD, path, mode, FchmodatFlags::NoFollowSymlink).map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).map(|meta| meta.permissions().mode() & 0o7777).unwrap_or(0)
    }

    fn set(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn a_loose_state_root_is_found_and_made_private_without_following_links() -> std::io::Result<()> {
        let temp = tempfile::tempdir()?;
        let root = temp.path().join("state");
        let instance = root.join("workspaces/demo/instances/a@k");
        std::fs::create_dir_all(&instance)?;
        std::fs::write(instance.join("messages.jsonl"), "{}\n")?;
        std::fs::write(root.join("private.json"), "{}")?;
        for dir in ["", "workspaces", "workspaces/demo", "workspaces/demo/instances", "workspaces/demo/instances/a@k"] {
            set(&root.join(dir), 0o755);
        }
        set(&instance.join("messages.jsonl"), 0o644);
        set(&root.join("private.json"), 0o600);
        // A link to something outside: neither it nor its target is touched.
        let outside = temp.path().join("outside.txt");
        std::fs::write(&outside, "x")?;
        set(&outside, 0o644);
        std::os::unix::fs::symlink(&outside, root.join("link"))?;
        // The agents' working directory: made private, its content left alone.
        let workdir = root.join("workspaces/demo/workdir");
        std::fs::create_dir(&workdir)?;
        set(&workdir, 0o755);
        std::fs::write(workdir.join("run.sh"), "#!/bin/sh\n")?;
        set(&workdir.join("run.sh"), 0o755);

        let loose = loose_entries(&root);
        let mut found: Vec<_> = loose.entries.iter().map(|(path, _)| path.clone()).collect();
        found.sort();
        assert_eq!(found.len(), 7, "{found:?}");
        assert!(found.contains(&workdir) && !found.contains(&workdir.join("run.sh")));
        assert!(found.contains(&root) && found.contains(&instance.join("messages.jsonl")));

        let made = make_private(&root);
        assert!(made.failed.is_empty(), "{:?}", made.failed);
        assert_eq!(made.changed, 7);
        assert_eq!(mode(&workdir), 0o700);
        assert_eq!(mode(&workdir.join("run.sh")), 0o755, "a file of the agents' changed");
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(&instance), 0o700);
        assert_eq!(mode(&instance.join("messages.jsonl")), 0o600);
        assert_eq!(mode(&outside), 0o644, "the link's target was changed");
        assert!(loose_entries(&root).entries.is_empty());
        Ok(())
    }

    #[test]
    fn a_private_root_is_ok_and_a_loose_one_warns_with_its_fix() -> std::io::Result<()> {
        let temp = tempfile::tempdir()?;
        let root = temp.path().join("state");
        goondan_runtime::store::create_private_dir_all(&root.join("workspaces"))?;
        let mut report = Report::default();
        check_private(&root, false, &mut report);
        assert_eq!(report.checks[0].level, Level::Ok, "{:?}", report.checks);

        set(&root, 0o755);
        let mut report = Report::default();
        check_private(&root, false, &mut report);
        assert_eq!(report.checks[0].level, Level::Warning);
        assert!(report.checks[0].fix.as_deref().is_some_and(|fix| fix.contains("gdn doctor --fix")));
        assert_eq!(mode(&root), 0o755, "a check without --fix changes nothing");

        let mut report = Report::default();
        check_private(&root, true, &mut report);
        assert_eq!(report.checks[0].level, Level::Ok, "{:?}", report.checks);
        assert_eq!(mode(&root), 0o700);
        Ok(())
    }
}
