//! The `bash` tool: `exec{command, cwd, timeoutMs, env}` runs one command with
//! `/bin/sh -lc`, `script{path, args, shell, timeoutMs, env}` runs a script
//! file with a shell; both in the instance's working directory.
//!
//! Both answer `{command, cwd, durationMs, stdout, stderr, exitCode, signal,
//! timedOut, truncated}`; `script` also has the original's `path` (the
//! resolved script), `shell` and `args`. A non-zero exit is an ordinary
//! result for the model to judge, not a tool error; as in the original,
//! `exitCode` is `-1` when the shell was killed by a signal (on timeout or
//! not), and `signal` then names it (`"SIGKILL"`).
//!
//! Where the original left holes, this one is strict:
//!
//! - `cwd` and the script's `path` must resolve inside the workdir (or an
//!   operator root of `GOONDAN_FS_ALLOW_ROOTS`), symbolic links included.
//! - Every command runs in a process group of its own, its environment
//!   marked for the call ([`crate::tool_processes`]). On timeout the whole
//!   group gets `SIGTERM`, then after [`TERM_GRACE`] `SIGKILL`, and so does
//!   every process carrying the call's marker — also those that left the
//!   group (`setsid`) — so no descendant outlives the call; the same happens
//!   (with `SIGKILL` at once) when the call's future is dropped, which is how
//!   the executor cancels a call at its own deadline. A command that
//!   finishes normally keeps its background jobs (`server > log 2>&1 &`
//!   works as with the original) until the agent's process ends. Once the
//!   shell has exited, its output is read for at most [`AFTER_EXIT_GRACE`]
//!   more: a background job holding the pipes cannot hang the call.
//! - Each output stream is capped (`GOONDAN_BASH_MAX_OUTPUT_BYTES`, 1 MiB by
//!   default): the first half and the last half of the cap are kept, the rest
//!   is counted and dropped while it is read, so memory stays bounded however
//!   much a command prints, and the pipes are drained to the end so the child
//!   never blocks on them.

use std::borrow::Cow;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use goondan_core::codes::{
    E_CWD_NOT_DIRECTORY, E_CWD_NOT_FOUND, E_SANDBOX_UNAVAILABLE, E_SCRIPT_NOT_FOUND, E_SPAWN_FAILED,
};
use goondan_core::{JsonObject, JsonValue, json_type_name};
use goondan_sandbox::Sandbox;
use goondan_tools::{BoxFuture, HandlerResult, ToolContext, ToolFailure, ToolHandler};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::tool_processes::{MARKER_ENV, ToolProcesses};
use crate::utf8::{complete_prefix_len, complete_suffix_start};
use crate::{BaseSettings, args, paths};

/// The shell of `exec`.
pub const EXEC_SHELL: &str = "/bin/sh";
/// The default shell of `script`.
pub const DEFAULT_SCRIPT_SHELL: &str = "/bin/bash";
/// The default timeout of both exports, in milliseconds.
pub const DEFAULT_TIMEOUT_MS: f64 = 30_000.0;
/// How long a timed-out process group has to exit after `SIGTERM` before it
/// gets `SIGKILL`.
pub const TERM_GRACE: Duration = Duration::from_millis(200);
/// How long the output pipes may stay open after the group got `SIGKILL`: a
/// process that left the group (`setsid`) can hold them forever, and the call
/// must still end.
const DRAIN_GRACE: Duration = Duration::from_secs(1);
/// How long the output pipes are still read after the shell exited.
pub const AFTER_EXIT_GRACE: Duration = Duration::from_millis(500);
/// The size of one read from a pipe.
const READ_CHUNK: usize = 64 * 1024;

/// The handler of `export`, or `None` if the tool has no such export.
pub fn handler(export: &str, settings: &Arc<BaseSettings>) -> Option<Arc<dyn ToolHandler>> {
    let settings = Arc::clone(settings);
    match export {
        "exec" => Some(Arc::new(Exec { settings })),
        "script" => Some(Arc::new(Script { settings })),
        _ => None,
    }
}

/// `bash.exec`: `/bin/sh -lc <command>` in the workdir or `cwd`.
struct Exec {
    settings: Arc<BaseSettings>,
}

impl ToolHandler for Exec {
    fn call<'a>(&'a self, ctx: &'a ToolContext, input: &'a JsonObject) -> BoxFuture<'a, HandlerResult> {
        Box::pin(async move {
            let command =
                args::require_non_blank(input, "command", "Provide the shell command to run, e.g. \"ls -la\".")?;
            reject_nul("command", command)?;
            let timeout = read_timeout(input)?;
            let env = read_env(input)?;
            let cwd = resolve_cwd(ctx.workdir(), &self.settings, args::optional_string(input, "cwd")?).await?;
            let argv = vec!["-lc".to_owned(), command.to_owned()];
            let run = Run::new(&self.settings, EXEC_SHELL.to_owned(), argv, command.to_owned(), cwd, timeout, env);
            run.start(input, ctx).await
        })
    }
}

/// `bash.script`: `<shell> <path> <args…>` in the workdir.
struct Script {
    settings: Arc<BaseSettings>,
}

impl ToolHandler for Script {
    fn call<'a>(&'a self, ctx: &'a ToolContext, input: &'a JsonObject) -> BoxFuture<'a, HandlerResult> {
        Box::pin(async move {
            let path = args::require_non_blank(
                input,
                "path",
                "Provide the script's path relative to the working directory, e.g. \"scripts/run.sh\".",
            )?;
            reject_nul("path", path)?;
            let script_args = match input.get("args") {
                None | Some(JsonValue::Null) => Vec::new(),
                Some(_) => args::require_string_array(input, "args")?,
            };
            for arg in &script_args {
                reject_nul("args", arg)?;
            }
            let shell = args::optional_string(input, "shell")?.unwrap_or(DEFAULT_SCRIPT_SHELL);
            let shell = args::non_blank(
                "shell",
                shell,
                &format!("Omit 'shell' to use {DEFAULT_SCRIPT_SHELL}, or give a shell's path."),
            )?;
            reject_nul("shell", shell)?;
            let timeout = read_timeout(input)?;
            let env = read_env(input)?;

            let workdir = ctx.workdir();
            let script = paths::resolve_confined(workdir, &self.settings.extra_fs_roots, path)?;
            check_script(path, &script).await?;
            let cwd = resolve_cwd(workdir, &self.settings, None).await?;

            // The shell gets the checked, resolved path; the model sees the
            // command line as it wrote it.
            let shown = std::iter::once(shell)
                .chain(std::iter::once(path))
                .chain(script_args.iter().copied())
                .map(shell_word)
                .collect::<Vec<_>>()
                .join(" ");
            let mut argv = vec![script.to_string_lossy().into_owned()];
            argv.extend(script_args.iter().map(|arg| (*arg).to_owned()));
            // The original's output fields of `script`, ahead of the rest.
            let mut leading_fields = JsonObject::new();
            leading_fields.insert("path".to_owned(), json!(script.to_string_lossy()));
            leading_fields.insert("shell".to_owned(), json!(shell));
            leading_fields.insert("args".to_owned(), json!(script_args));
            let run = Run::new(&self.settings, shell.to_owned(), argv, shown, cwd, timeout, env);
            Run { leading_fields, ..run }.start(input, ctx).await
        })
    }
}

/// A NUL character cannot be passed to a process; say so instead of failing
/// at spawn time with a vaguer error.
fn reject_nul(key: &str, value: &str) -> Result<(), ToolFailure> {
    if value.contains('\0') {
        return Err(ToolFailure::new(format!("'{key}' must not contain NUL characters"))
            .suggest("Remove the NUL (\\u0000) characters; processes cannot receive them."));
    }
    Ok(())
}

/// `timeoutMs`: absent → 30 s; `<= 0` → no timeout; too large to represent →
/// no timeout either (it would never fire).
fn read_timeout(input: &JsonObject) -> Result<Option<Duration>, ToolFailure> {
    let ms = args::optional_number(input, "timeoutMs")?.unwrap_or(DEFAULT_TIMEOUT_MS);
    if !ms.is_finite() {
        return Err(ToolFailure::new(format!("'timeoutMs' must be a finite number, got {ms}"))
            .suggest("Give the timeout in milliseconds, e.g. 30000; 0 or less disables it."));
    }
    if ms <= 0.0 {
        return Ok(None);
    }
    Ok(Duration::try_from_secs_f64(ms / 1000.0).ok())
}

/// `background`: run on as a task, answering `pending` at once.
fn read_background(input: &JsonObject) -> Result<bool, ToolFailure> {
    match input.get("background") {
        None | Some(JsonValue::Null) => Ok(false),
        Some(JsonValue::Bool(background)) => Ok(*background),
        Some(other) => Err(ToolFailure::with_code(
            format!("'background' must be a boolean, got {}", json_type_name(other)),
            goondan_core::codes::E_TOOL_INVALID_ARGS,
        )),
    }
}

/// A background command's deadline: only the one `timeoutMs` gives (none by default).
fn explicit_timeout(input: &JsonObject) -> Result<Option<Duration>, ToolFailure> {
    if input.get("timeoutMs").is_none_or(JsonValue::is_null) {
        return Ok(None);
    }
    read_timeout(input)
}

/// `env`: an object of string, number or boolean values, as text.
fn read_env(input: &JsonObject) -> Result<Vec<(String, String)>, ToolFailure> {
    let entries = match input.get("env") {
        None | Some(JsonValue::Null) => return Ok(Vec::new()),
        Some(JsonValue::Object(entries)) => entries,
        Some(other) => {
            return Err(ToolFailure::new(format!("'env' must be a JSON object, got {}", json_type_name(other)))
                .suggest("Pass environment variables as an object, e.g. {\"NODE_ENV\": \"test\"}."));
        }
    };
    let mut env = Vec::with_capacity(entries.len());
    for (key, value) in entries {
        if key.is_empty() || key.contains('=') || key.contains('\0') {
            return Err(ToolFailure::new(format!("env key '{key}' is not a valid environment variable name"))
                .suggest("Use names without '=' or NUL characters, e.g. MY_VAR."));
        }
        // Numbers as JavaScript's String(n) writes them (1.0 → "1").
        let Some(text) = args::scalar_text(value) else {
            return Err(ToolFailure::new(format!("env.{key} must be a primitive string/number/boolean value"))
                .suggest(format!("Give env.{key} as text, e.g. \"1\"; objects, arrays and null are not allowed.")));
        };
        if text.contains('\0') {
            return Err(ToolFailure::new(format!("env.{key} must not contain NUL characters"))
                .suggest("Remove the NUL (\\u0000) characters; processes cannot receive them."));
        }
        env.push((key.clone(), text));
    }
    Ok(env)
}

/// The directory a command runs in: `cwd` inside the workdir, or the workdir.
async fn resolve_cwd(workdir: &Path, settings: &BaseSettings, cwd: Option<&str>) -> Result<PathBuf, ToolFailure> {
    let requested = cwd.unwrap_or(".");
    reject_nul("cwd", requested)?;
    // Checked first: with no workdir every path would look "outside" it.
    if !tokio::fs::metadata(workdir).await.is_ok_and(|metadata| metadata.is_dir()) {
        return Err(ToolFailure::with_code(
            format!("the instance's working directory {} does not exist or is not a directory", workdir.display()),
            E_CWD_NOT_FOUND,
        )
        .suggest("Create the instance's working directory, or start the agent with an existing one."));
    }
    let resolved = paths::resolve_confined(workdir, &settings.extra_fs_roots, requested)?;
    let shown = cwd.map_or_else(|| "the instance's working directory".to_owned(), |cwd| format!("cwd '{cwd}'"));
    match tokio::fs::metadata(&resolved).await {
        Ok(metadata) if metadata.is_dir() => Ok(resolved),
        Ok(_) => Err(ToolFailure::with_code(
            format!("{shown} ({}) is not a directory", resolved.display()),
            E_CWD_NOT_DIRECTORY,
        )
        .suggest("Give a directory as 'cwd', relative to the working directory; omit it to run in the workdir.")),
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            Err(ToolFailure::with_code(format!("{shown} ({}) does not exist", resolved.display()), E_CWD_NOT_FOUND)
                .suggest("Create the directory first (e.g. with mkdir), or omit 'cwd' to run in the workdir."))
        }
        Err(error) => Err(ToolFailure::with_code(
            format!("cannot use {shown} ({}): {error}", resolved.display()),
            E_CWD_NOT_DIRECTORY,
        )
        .suggest("Check the directory's permissions, or omit 'cwd' to run in the workdir.")),
    }
}

/// The script must be an existing regular file (after resolving links).
async fn check_script(path: &str, resolved: &Path) -> Result<(), ToolFailure> {
    let problem = match tokio::fs::metadata(resolved).await {
        Ok(metadata) if metadata.is_file() => return Ok(()),
        Ok(_) => "is not a file".to_owned(),
        Err(error) if error.kind() == io::ErrorKind::NotFound => "does not exist".to_owned(),
        Err(error) => format!("cannot be read: {error}"),
    };
    Err(ToolFailure::with_code(format!("script '{path}' ({}) {problem}", resolved.display()), E_SCRIPT_NOT_FOUND)
        .named("ScriptNotFoundError")
        .suggest("Give the path of an existing script file relative to the working directory; list the directory to find it."))
}

/// `word` as a shell would need it to read it back as one word.
fn shell_word(word: &str) -> Cow<'_, str> {
    let plain = !word.is_empty() && word.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
    if plain { Cow::Borrowed(word) } else { Cow::Owned(format!("'{}'", word.replace('\'', "'\\''"))) }
}

/// One process to run.
pub(crate) struct Run {
    pub(crate) program: String,
    pub(crate) args: Vec<String>,
    /// The command line reported as `command`.
    pub(crate) shown: String,
    /// Fields the output starts with (`script`'s `path`, `shell`, `args`).
    pub(crate) leading_fields: JsonObject,
    pub(crate) cwd: PathBuf,
    pub(crate) timeout: Option<Duration>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) max_output_bytes: usize,
    pub(crate) processes: Arc<ToolProcesses>,
    /// Where it runs; `None`: unconfined.
    pub(crate) sandbox: Option<Arc<Sandbox>>,
}

impl Run {
    /// A run of `program` under the settings' output cap, process registry
    /// and sandbox, with no leading output fields.
    fn new(
        settings: &BaseSettings,
        program: String,
        args: Vec<String>,
        shown: String,
        cwd: PathBuf,
        timeout: Option<Duration>,
        env: Vec<(String, String)>,
    ) -> Self {
        Self {
            program,
            args,
            shown,
            leading_fields: JsonObject::new(),
            cwd,
            timeout,
            env,
            max_output_bytes: settings.bash_max_output_bytes,
            processes: Arc::clone(&settings.tool_processes),
            sandbox: settings.sandbox.clone(),
        }
    }

    /// Runs it to its end, or as a task when `input` asks for `background`
    /// (whose timeout is only the one `input` gives).
    async fn start(self, input: &JsonObject, ctx: &ToolContext) -> HandlerResult {
        if read_background(input)? {
            let timeout = explicit_timeout(input)?;
            return crate::bash_background::start(Run { timeout, ..self }, ctx).await;
        }
        self.execute(ctx).await.map(Into::into)
    }

    /// The command to spawn, not yet confined: the program in its cwd with
    /// its environment and `marker`, no stdin, piped output, and a process
    /// group of its own so that one signal reaches every descendant.
    pub(crate) fn command(&self, marker: &str) -> Command {
        let mut command = Command::new(&self.program);
        command
            .args(&self.args)
            .current_dir(&self.cwd)
            .envs(self.env.iter().map(|(key, value)| (key.as_str(), value.as_str())))
            .env(MARKER_ENV, marker)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        command
    }

    /// Confines `command` in the run's sandbox; a policy this machine
    /// cannot enforce refuses the command (never runs it unconfined).
    pub(crate) fn confine(&self, command: &mut Command) -> Result<(), ToolFailure> {
        let Some(sandbox) = &self.sandbox else { return Ok(()) };
        // Spawned by `Run::spawn`, on the sandbox's spawning thread.
        sandbox.confine_placed(command.as_std_mut()).map_err(|error| {
            ToolFailure::with_code(error.to_string(), E_SANDBOX_UNAVAILABLE)
                .named("SandboxError")
                .suggest("Tell the user the command cannot run here; do not retry it.")
        })
    }

    /// Spawns `command` (confined by [`Run::confine`]): on the sandbox's
    /// spawning thread where it has one, so that the command starts in its
    /// cgroups instead of moving in (`Sandbox::spawn_placed`). The command
    /// comes back with its child: its confinement keeps the command's
    /// cgroups until it is dropped.
    pub(crate) async fn spawn(&self, mut command: Command) -> io::Result<(Command, Child)> {
        let (Some(sandbox), Ok(runtime)) = (&self.sandbox, tokio::runtime::Handle::try_current()) else {
            let child = command.spawn()?;
            return Ok((command, child));
        };
        let (sent, spawned) = tokio::sync::oneshot::channel();
        let job: goondan_sandbox::SpawnJob = Box::new(move || {
            let _entered = runtime.enter();
            let child = command.spawn();
            let _ = sent.send(child.map(|child| (command, child)));
        });
        if let Err(job) = sandbox.spawn_placed(job) {
            job();
        }
        spawned.await.unwrap_or_else(|_| Err(io::Error::other("the sandbox's spawning thread has ended")))
    }

    /// The `sandbox` field of a failed command's result: the policy in
    /// force by name and what its output says was refused, so that the
    /// model neither retries blindly nor blames the command.
    pub(crate) fn refusal(
        &self,
        failed: bool,
        started_at: std::time::SystemTime,
        stderr: &str,
        stdout: &str,
    ) -> Option<JsonValue> {
        let sandbox = self.sandbox.as_ref().filter(|sandbox| sandbox.policy().confines())?;
        if !failed {
            return None;
        }
        let refusal = sandbox.refusal_in(stderr).or_else(|| sandbox.refusal_in(stdout))?;
        let policy = sandbox.policy();
        let mut hint = format!(
            "The command ran in the '{policy}' sandbox, which refused it: this is not a bug of the command and \
             retrying will not help."
        );
        if !refusal.paths.is_empty() {
            hint.push_str(
                " Files outside the workdir cannot be read or written (outside it the command sees only the \
                 system's files), nor the bundle's own files, .git and .env*.",
            );
        }
        // The hosts the network proxy refused while it ran (curl shows only
        // `response 403` for a refused tunnel).
        let mut hosts: Vec<String> = Vec::new();
        if refusal.network {
            hint.push_str(" Commands have no network unless the agent's spec.sandbox.network.allow names the host.");
            for refused in sandbox.network_refusals_since(started_at) {
                if !hosts.contains(&refused.target) {
                    hosts.push(refused.target);
                }
            }
        }
        hint.push_str(" Only the user can widen the sandbox, in goondan.yaml (spec.sandbox).");
        let mut field = json!({
            "policy": policy.as_str(),
            "refused": refusal.paths,
            "network": refusal.network,
            "hint": hint,
        });
        if !hosts.is_empty() {
            field["refusedHosts"] = json!(hosts);
        }
        Some(field)
    }
}

impl Run {
    async fn execute(mut self, ctx: &ToolContext) -> Result<JsonValue, ToolFailure> {
        let started = Instant::now();
        let started_at = std::time::SystemTime::now();
        let marker = self.processes.marker();
        let mut command = self.command(&marker);
        self.confine(&mut command)?;
        ctx.logger.debug(format_args!("bash: running {} in {}", self.shown, self.cwd.display()));
        let (_command, mut child) = self.spawn(command).await.map_err(|error| {
            ToolFailure::with_code(format!("cannot start shell '{}': {error}", self.program), E_SPAWN_FAILED)
                .suggest("Check that the shell exists and is executable (script's 'shell', e.g. /bin/bash).")
        })?;
        // Declared after `child`, so dropped before it: the group is killed
        // while its leader is not yet reaped and its id cannot be reused.
        let mut guard = GroupGuard::new(child.id(), marker, Arc::clone(&self.processes));

        let mut stdout = CappedOutput::new(self.max_output_bytes);
        let mut stderr = CappedOutput::new(self.max_output_bytes);
        let stdout_pipe = child.stdout.take();
        let stderr_pipe = child.stderr.take();
        let mut timed_out = false;
        let finished = {
            let mut all = std::pin::pin!(async {
                let mut output = std::pin::pin!(async {
                    tokio::join!(drain(stdout_pipe, &mut stdout), drain(stderr_pipe, &mut stderr));
                });
                let mut exited = std::pin::pin!(child.wait());
                tokio::select! {
                    status = &mut exited => {
                        // The shell is gone; what its output still holds
                        // arrives now, unless a background job keeps the
                        // pipes open.
                        let _ = tokio::time::timeout(AFTER_EXIT_GRACE, &mut output).await;
                        status
                    }
                    () = &mut output => exited.await,
                }
            });
            match self.timeout {
                None => Some(all.await),
                Some(limit) => match tokio::time::timeout(limit, &mut all).await {
                    Ok(status) => Some(status),
                    Err(_) => {
                        timed_out = true;
                        ctx.logger.warn(format_args!(
                            "bash: timed out after {} ms; terminating its process group",
                            limit.as_millis()
                        ));
                        guard.signal(Signal::SIGTERM);
                        let after_term = tokio::time::timeout(TERM_GRACE, &mut all).await.ok();
                        // Also when the shell is gone: a grandchild that
                        // ignored SIGTERM or closed its output is still in
                        // the group.
                        guard.signal(Signal::SIGKILL);
                        guard.kill_marked().await;
                        match after_term {
                            Some(status) => Some(status),
                            None => tokio::time::timeout(DRAIN_GRACE, &mut all).await.ok(),
                        }
                    }
                },
            }
        };
        let status = match finished {
            Some(status) => status,
            None => {
                // The pipes are held by a process outside the group; the
                // shell itself is dead or dies now.
                let _ = child.start_kill();
                child.wait().await
            }
        };
        guard.disarm();
        let status = status.map_err(|error| {
            ToolFailure::new(format!("waiting for '{}' failed: {error}", self.shown))
                .suggest("Run the command again; if this repeats, the system may be out of resources.")
        })?;

        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let (stdout, stdout_cut) = stdout.finish();
        let (stderr, stderr_cut) = stderr.finish();
        let mut output = std::mem::take(&mut self.leading_fields);
        let rest = json!({
            "command": self.shown,
            "cwd": self.cwd.to_string_lossy(),
            "durationMs": duration_ms,
            "stdout": stdout,
            "stderr": stderr,
            // The original's `code === null ? -1 : code`: a shell killed by a
            // signal (timed out or not) reports -1, and `signal` says which.
            "exitCode": status.code().unwrap_or(-1),
            "signal": signal_name(status),
            "timedOut": timed_out,
            "truncated": stdout_cut || stderr_cut,
        });
        if let JsonValue::Object(rest) = rest {
            output.extend(rest);
        }
        let failed = !status.success() || timed_out;
        let stdout_text = output.get("stdout").and_then(JsonValue::as_str).unwrap_or_default();
        let stderr_text = output.get("stderr").and_then(JsonValue::as_str).unwrap_or_default();
        if let Some(refusal) = self.refusal(failed, started_at, stderr_text, stdout_text) {
            ctx.logger.warn(format_args!("bash: the sandbox refused part of '{}': {refusal}", self.shown));
            output.insert("sandbox".to_owned(), refusal);
        }
        Ok(JsonValue::Object(output))
    }
}

/// The name of the signal that killed the process, like Node's (`"SIGTERM"`).
pub(crate) fn signal_name(status: ExitStatus) -> Option<String> {
    use std::os::unix::process::ExitStatusExt;
    let number = status.signal()?;
    Some(Signal::try_from(number).map_or_else(|_| format!("SIG{number}"), |signal| signal.as_str().to_owned()))
}

/// Kills the process group, and every process carrying the call's marker,
/// when dropped while armed: a call whose future is dropped (cancelled)
/// leaves nothing running.
pub(crate) struct GroupGuard {
    pgid: Option<Pid>,
    marker: Option<String>,
    processes: Arc<ToolProcesses>,
}

impl GroupGuard {
    pub(crate) fn new(leader: Option<u32>, marker: String, processes: Arc<ToolProcesses>) -> Self {
        Self {
            pgid: leader.and_then(|id| i32::try_from(id).ok()).filter(|id| *id > 0).map(Pid::from_raw),
            marker: Some(marker),
            processes,
        }
    }

    /// Kills what left the group (scanning `/proc`, off the async threads).
    pub(crate) async fn kill_marked(&mut self) {
        let Some(marker) = self.marker.take() else { return };
        let processes = Arc::clone(&self.processes);
        let _ = tokio::task::spawn_blocking(move || processes.kill_marked(&marker)).await;
    }

    /// Sends `signal` to every process of the group; a group already gone
    /// (`ESRCH`) is what we want anyway.
    pub(crate) fn signal(&self, signal: Signal) {
        if let Some(pgid) = self.pgid {
            let _ = killpg(pgid, signal);
        }
    }

    /// The call ended: background jobs of a command that finished may live
    /// on (until the agent's process ends).
    pub(crate) fn disarm(&mut self) {
        self.pgid = None;
        self.marker = None;
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.signal(Signal::SIGKILL);
        if let Some(marker) = self.marker.take() {
            let processes = Arc::clone(&self.processes);
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn_blocking(move || processes.kill_marked(&marker))),
                Err(_) => drop(processes.kill_marked(&marker)),
            }
        }
    }
}

/// Reads `pipe` to its end into `sink`. A read error ends the stream early;
/// what was read so far is kept.
async fn drain<R: AsyncRead + Unpin>(pipe: Option<R>, sink: &mut CappedOutput) {
    let Some(mut pipe) = pipe else { return };
    let mut chunk = vec![0_u8; READ_CHUNK];
    loop {
        match pipe.read(&mut chunk).await {
            Ok(0) => return,
            Ok(read) => sink.push(chunk.get(..read).unwrap_or_default()),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => {
                tracing::debug!(target: "goondan::tool", "bash: reading output failed: {error}");
                return;
            }
        }
    }
}

/// One output stream, bounded: the first `cap / 2` bytes, the last
/// `cap - cap / 2` bytes in a ring, and a count of the bytes in between.
#[derive(Debug)]
struct CappedOutput {
    head: Vec<u8>,
    head_cap: usize,
    /// Grows to `tail_cap`, then is overwritten in a circle from `tail_start`
    /// (the oldest byte).
    tail: Vec<u8>,
    tail_cap: usize,
    tail_start: usize,
    dropped: u64,
}

impl CappedOutput {
    fn new(cap: usize) -> Self {
        let head_cap = cap / 2;
        Self { head: Vec::new(), head_cap, tail: Vec::new(), tail_cap: cap - head_cap, tail_start: 0, dropped: 0 }
    }

    fn push(&mut self, data: &[u8]) {
        let room = self.head_cap.saturating_sub(self.head.len()).min(data.len());
        let (to_head, rest) = data.split_at(room);
        self.head.extend_from_slice(to_head);
        if !rest.is_empty() {
            self.push_tail(rest);
        }
    }

    fn push_tail(&mut self, data: &[u8]) {
        let cap = self.tail_cap;
        if data.len() >= cap {
            // The new data alone fills the tail: everything older goes.
            self.dropped += (self.tail.len() + data.len() - cap) as u64;
            self.tail.clear();
            self.tail.extend_from_slice(data.get(data.len() - cap..).unwrap_or_default());
            self.tail_start = 0;
            return;
        }
        let room = (cap - self.tail.len()).min(data.len());
        let (fill, data) = data.split_at(room);
        self.tail.extend_from_slice(fill);
        if data.is_empty() {
            return;
        }
        // The ring is full and `data` is shorter than it: overwrite the
        // oldest bytes, wrapping around once at most.
        self.dropped += data.len() as u64;
        let first = (cap - self.tail_start).min(data.len());
        let (front, back) = data.split_at(first);
        if let Some(slot) = self.tail.get_mut(self.tail_start..self.tail_start + first) {
            slot.copy_from_slice(front);
        }
        if let Some(slot) = self.tail.get_mut(..back.len()) {
            slot.copy_from_slice(back);
        }
        self.tail_start = (self.tail_start + data.len()) % cap;
    }

    /// The text to report and whether anything was cut. A cut never splits a
    /// UTF-8 character: partial characters at the edges count as truncated.
    fn finish(self) -> (String, bool) {
        let mut tail = self.tail;
        tail.rotate_left(self.tail_start);
        let mut head = self.head;
        if self.dropped == 0 {
            head.extend_from_slice(&tail);
            return (String::from_utf8_lossy(&head).into_owned(), false);
        }
        let head_end = complete_prefix_len(&head);
        let tail_begin = complete_suffix_start(&tail);
        let omitted = self.dropped + (head.len() - head_end) as u64 + tail_begin as u64;
        let text = format!(
            "{}\n... [{omitted} bytes truncated] ...\n{}",
            String::from_utf8_lossy(head.get(..head_end).unwrap_or_default()),
            String::from_utf8_lossy(tail.get(tail_begin..).unwrap_or_default()),
        );
        (text, true)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use goondan_core::ToolResult;
    use goondan_core::codes::E_PATH_OUTSIDE_WORKDIR;
    use goondan_tools::ExecutorPolicy;

    use super::*;
    use crate::test_support::{Executor, context_in, err, object, ok, run_in, settings, workdir};

    // ---- helpers -------------------------------------------------------

    fn capped_settings(cap: usize) -> Arc<BaseSettings> {
        Arc::new(BaseSettings { bash_max_output_bytes: cap, ..BaseSettings::default() })
    }

    async fn call_with(settings: &Arc<BaseSettings>, export: &str, dir: &Path, input: JsonValue) -> HandlerResult {
        run_in("bash", export, settings, dir, input).await
    }

    async fn exec(dir: &Path, input: JsonValue) -> HandlerResult {
        call_with(&settings(), "exec", dir, input).await
    }

    async fn script(dir: &Path, input: JsonValue) -> HandlerResult {
        call_with(&settings(), "script", dir, input).await
    }

    fn write(path: &Path, text: &str) {
        std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    /// Waits for `file` to hold a process id (written by a test command).
    async fn read_pid(file: &Path) -> Pid {
        for _ in 0..200 {
            if let Ok(text) = std::fs::read_to_string(file)
                && let Ok(pid) = text.trim().parse::<i32>()
            {
                return Pid::from_raw(pid);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("no pid in {}", file.display());
    }

    /// Alive means it exists and is not a zombie waiting for a reaper.
    fn alive(pid: Pid) -> bool {
        if nix::sys::signal::kill(pid, None).is_err() {
            return false;
        }
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            // The state follows the parenthesised command name.
            Ok(stat) => stat.rsplit_once(')').is_none_or(|(_, rest)| !rest.trim_start().starts_with(['Z', 'X'])),
            Err(_) => false,
        }
    }

    async fn assert_gone(pid: Pid) {
        for _ in 0..200 {
            if !alive(pid) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
        panic!("process {pid} outlived the call");
    }

    fn code(failure: &ToolFailure) -> Option<&str> {
        failure.code.as_deref()
    }

    // ---- exec ----------------------------------------------------------

    #[tokio::test]
    async fn exec_reports_stdout_stderr_and_exit_code() {
        let dir = workdir();
        let out = ok(exec(&dir.path, json!({"command": "printf out; printf err >&2; exit 3"})).await);
        assert_eq!(out["command"], json!("printf out; printf err >&2; exit 3"));
        assert_eq!(out["cwd"], json!(dir.path.to_string_lossy()));
        assert_eq!(out["stdout"], json!("out"));
        assert_eq!(out["stderr"], json!("err"));
        assert_eq!(out["exitCode"], json!(3));
        assert_eq!(out["signal"], JsonValue::Null);
        assert_eq!(out["timedOut"], json!(false));
        assert_eq!(out["truncated"], json!(false));
        assert!(out["durationMs"].is_u64(), "{out}");
        let keys: Vec<&str> = out.as_object().map(|o| o.keys().map(String::as_str).collect()).unwrap_or_default();
        assert_eq!(
            keys,
            ["command", "cwd", "durationMs", "stdout", "stderr", "exitCode", "signal", "timedOut", "truncated"]
        );

        let out = ok(exec(&dir.path, json!({"command": "echo hello"})).await);
        assert_eq!(out["stdout"], json!("hello\n"));
        assert_eq!(out["exitCode"], json!(0));
    }

    #[tokio::test]
    async fn exec_killed_by_a_signal_reports_exit_code_minus_one() {
        let dir = workdir();
        let out = ok(exec(&dir.path, json!({"command": "kill -TERM $$"})).await);
        assert_eq!(out["exitCode"], json!(-1));
        assert_eq!(out["signal"], json!("SIGTERM"));
        assert_eq!(out["timedOut"], json!(false));
    }

    #[tokio::test]
    async fn exec_runs_in_the_workdir_or_cwd_inside_it() {
        let dir = workdir();
        let _ = std::fs::create_dir_all(dir.path.join("sub/deeper"));
        let out = ok(exec(&dir.path, json!({"command": "pwd"})).await);
        assert_eq!(out["stdout"], json!(format!("{}\n", dir.path.display())));
        let out = ok(exec(&dir.path, json!({"command": "pwd", "cwd": "sub/deeper"})).await);
        assert_eq!(out["stdout"], json!(format!("{}\n", dir.path.join("sub/deeper").display())));
        assert_eq!(out["cwd"], json!(dir.path.join("sub/deeper").to_string_lossy()));
        let absolute = dir.path.join("sub").to_string_lossy().into_owned();
        let out = ok(exec(&dir.path, json!({"command": "pwd", "cwd": absolute})).await);
        assert_eq!(out["stdout"], json!(format!("{}\n", dir.path.join("sub").display())));
        let out = ok(exec(&dir.path, json!({"command": "pwd", "cwd": "sub/../sub/./deeper/.."})).await);
        assert_eq!(out["cwd"], json!(dir.path.join("sub").to_string_lossy()));
        // A link that stays inside is fine.
        let _ = std::os::unix::fs::symlink(dir.path.join("sub"), dir.path.join("inner"));
        let out = ok(exec(&dir.path, json!({"command": "pwd", "cwd": "inner"})).await);
        assert_eq!(out["cwd"], json!(dir.path.join("sub").to_string_lossy()));
    }

    #[tokio::test]
    async fn exec_refuses_a_cwd_outside_the_workdir() {
        let dir = workdir();
        let outside = workdir();
        let _ = std::os::unix::fs::symlink(&outside.path, dir.path.join("escape"));
        let outside_absolute = outside.path.to_string_lossy().into_owned();
        for cwd in ["..", "../..", "sub/../../", "/", "/etc", outside_absolute.as_str(), "escape", "escape/x"] {
            let failure = err(exec(&dir.path, json!({"command": "touch pwned", "cwd": cwd})).await);
            assert_eq!(code(&failure), Some(E_PATH_OUTSIDE_WORKDIR), "{cwd}: {failure:?}");
            assert!(failure.message.contains(&format!("'{cwd}'")), "{}", failure.message);
            assert!(failure.suggestion.is_some());
        }
        assert!(!outside.path.join("pwned").exists());
        // The operator can widen the roots.
        let widened = Arc::new(BaseSettings { extra_fs_roots: vec![outside.path.clone()], ..BaseSettings::default() });
        let out = ok(call_with(&widened, "exec", &dir.path, json!({"command": "pwd", "cwd": "escape"})).await);
        assert_eq!(out["cwd"], json!(outside_absolute));
    }

    #[tokio::test]
    async fn exec_refuses_a_missing_or_non_directory_cwd() {
        let dir = workdir();
        write(&dir.path.join("file.txt"), "x");
        let failure = err(exec(&dir.path, json!({"command": "pwd", "cwd": "nope"})).await);
        assert_eq!(code(&failure), Some(E_CWD_NOT_FOUND));
        assert!(failure.message.contains("cwd 'nope'") && failure.message.contains("does not exist"), "{failure:?}");
        assert!(failure.suggestion.is_some());
        let failure = err(exec(&dir.path, json!({"command": "pwd", "cwd": "file.txt"})).await);
        assert_eq!(code(&failure), Some(E_CWD_NOT_DIRECTORY));
        assert!(failure.message.contains("is not a directory"), "{failure:?}");
        // The workdir itself must exist.
        let gone = dir.path.join("gone");
        let failure = err(exec(&gone, json!({"command": "pwd"})).await);
        assert_eq!(code(&failure), Some(E_CWD_NOT_FOUND));
        assert!(failure.message.contains(&gone.display().to_string()), "{failure:?}");
    }

    #[tokio::test]
    async fn exec_rejects_empty_or_unusable_commands() {
        let dir = workdir();
        for command in ["", "   \n"] {
            let failure = err(exec(&dir.path, json!({"command": command})).await);
            assert_eq!(failure.message, "'command' must be a non-empty string");
            assert!(failure.suggestion.is_some());
        }
        let failure = err(exec(&dir.path, json!({"command": "echo a\u{0}b"})).await);
        assert_eq!(failure.message, "'command' must not contain NUL characters");
        // The handler's own type checks (the executor's schema check runs first).
        let failure = err(exec(&dir.path, json!({})).await);
        assert_eq!(failure.message, "'command' must be a non-empty string");
        let failure = err(exec(&dir.path, json!({"command": 1})).await);
        assert_eq!(failure.message, "'command' must be a non-empty string");
        let failure = err(exec(&dir.path, json!({"command": "true", "cwd": 1})).await);
        assert_eq!(failure.message, "'cwd' must be a string, got integer");
        let failure = err(exec(&dir.path, json!({"command": "true", "timeoutMs": "5"})).await);
        assert_eq!(failure.message, "'timeoutMs' must be a valid number, got string");
    }

    #[tokio::test]
    async fn env_values_are_merged_over_the_inherited_environment() {
        let dir = workdir();
        let input = json!({
            "command": "printf '%s|%s|%s|%s|%s|%s' \"$GREETING\" \"$N\" \"$F\" \"$W\" \"$B\" \"$HOME\"",
            "env": {"GREETING": "hi there", "N": 42, "F": 1.5, "W": 2.0, "B": true, "HOME": "/custom/home"}
        });
        let out = ok(exec(&dir.path, input).await);
        assert_eq!(out["stdout"], json!("hi there|42|1.5|2|true|/custom/home"));
        // Without overrides the parent's variables are there.
        if let Ok(path) = std::env::var("PATH") {
            let out = ok(exec(&dir.path, json!({"command": "printf %s \"$PATH\"", "env": {}})).await);
            assert!(out["stdout"].as_str().is_some_and(|p| !p.is_empty()), "{out} vs {path}");
        }
        if let Ok(home) = std::env::var("HOME") {
            let out = ok(exec(&dir.path, json!({"command": "printf %s \"$HOME\"", "env": {"X": "1"}})).await);
            assert_eq!(out["stdout"], json!(home));
        }
    }

    #[tokio::test]
    async fn env_values_must_be_string_number_or_boolean() {
        let dir = workdir();
        for (value, shown) in [(json!({"a": 1}), "object"), (json!([1]), "array"), (JsonValue::Null, "null")] {
            let failure = err(exec(&dir.path, json!({"command": "true", "env": {"BAD": value}})).await);
            assert_eq!(failure.message, "env.BAD must be a primitive string/number/boolean value", "{shown}");
            assert!(failure.suggestion.is_some());
        }
        let failure = err(exec(&dir.path, json!({"command": "true", "env": "A=1"})).await);
        assert_eq!(failure.message, "'env' must be a JSON object, got string");
        let failure = err(exec(&dir.path, json!({"command": "true", "env": {"A=B": "1"}})).await);
        assert!(failure.message.contains("not a valid environment variable name"), "{failure:?}");
        let failure = err(exec(&dir.path, json!({"command": "true", "env": {"": "1"}})).await);
        assert!(failure.message.contains("not a valid environment variable name"), "{failure:?}");
        let failure = err(exec(&dir.path, json!({"command": "true", "env": {"A": "x\u{0}y"}})).await);
        assert_eq!(failure.message, "env.A must not contain NUL characters");
        let failure = err(script(&dir.path, json!({"path": "s.sh", "env": {"A": {}}})).await);
        assert_eq!(failure.message, "env.A must be a primitive string/number/boolean value");
    }

    // ---- timeouts and process groups -------------------------------------

    #[tokio::test]
    async fn timeout_kills_the_whole_process_group() {
        let dir = workdir();
        let started = std::time::Instant::now();
        let input = json!({
            "command": "sleep 30 & echo $! > grandchild.pid; echo started; wait",
            "timeoutMs": 300
        });
        let out = ok(exec(&dir.path, input).await);
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        assert_eq!(out["timedOut"], json!(true));
        assert_eq!(out["stdout"], json!("started\n"));
        assert_eq!(out["exitCode"], json!(-1));
        assert_eq!(out["signal"], json!("SIGTERM"));
        let duration = out["durationMs"].as_u64().unwrap_or_default();
        assert!((300..5000).contains(&duration), "{duration}");
        assert_gone(read_pid(&dir.path.join("grandchild.pid")).await).await;
    }

    /// Runs `command`, which writes a pid to `pid_file` and outlives
    /// `timeout_ms`: the call times out and that process is gone.
    async fn assert_the_timeout_kills(command: &str, timeout_ms: u64, pid_file: &str) {
        let dir = workdir();
        let out = ok(exec(&dir.path, json!({"command": command, "timeoutMs": timeout_ms})).await);
        assert_eq!(out["timedOut"], json!(true));
        assert_gone(read_pid(&dir.path.join(pid_file)).await).await;
    }

    #[tokio::test]
    async fn a_grandchild_that_ignores_sigterm_gets_sigkill() {
        // Ignored signals stay ignored across exec, so `sleep` ignores TERM.
        let command = "(trap '' TERM; exec sleep 30) > /dev/null 2>&1 & echo $! > stubborn.pid; wait";
        assert_the_timeout_kills(command, 200, "stubborn.pid").await;
    }

    #[tokio::test]
    async fn zero_or_negative_timeout_means_none() {
        let dir = workdir();
        for timeout in [json!(0), json!(-5), json!(-0.5)] {
            let out = ok(exec(&dir.path, json!({"command": "sleep 0.1; echo done", "timeoutMs": timeout})).await);
            assert_eq!(out["timedOut"], json!(false));
            assert_eq!(out["stdout"], json!("done\n"));
            assert_eq!(out["exitCode"], json!(0));
        }
        // A huge timeout is as good as none.
        let out = ok(exec(&dir.path, json!({"command": "echo ok", "timeoutMs": 1e300})).await);
        assert_eq!(out["timedOut"], json!(false));
        assert_eq!(read_timeout(&object(json!({}))), Ok(Some(Duration::from_secs(30))));
        assert_eq!(read_timeout(&object(json!({"timeoutMs": 1500}))), Ok(Some(Duration::from_millis(1500))));
        assert_eq!(read_timeout(&object(json!({"timeoutMs": null}))), Ok(Some(Duration::from_secs(30))));
    }

    #[tokio::test]
    async fn a_finished_command_keeps_its_redirected_background_jobs() {
        let dir = workdir();
        let out = ok(exec(&dir.path, json!({"command": "sleep 30 > /dev/null 2>&1 & echo $! > bg.pid"})).await);
        assert_eq!(out["timedOut"], json!(false));
        let pid = read_pid(&dir.path.join("bg.pid")).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(alive(pid), "the background job should still run");
        let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
    }

    #[tokio::test]
    async fn a_process_that_left_the_group_dies_at_the_timeout_too() {
        // `setsid` puts sleep in a session and group of its own: killpg misses it.
        let command = "setsid sleep 30 > /dev/null 2>&1 < /dev/null & echo $! > escaped.pid; wait";
        assert_the_timeout_kills(command, 300, "escaped.pid").await;
    }

    #[tokio::test]
    async fn a_background_job_holding_the_output_cannot_hang_a_call_without_timeout() {
        let dir = workdir();
        let started = std::time::Instant::now();
        // No timeout, and a job that keeps stdout open after the shell exits.
        let input = json!({"command": "sleep 30 & echo $! > holder.pid; echo done", "timeoutMs": 0});
        let out = ok(exec(&dir.path, input).await);
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
        assert_eq!(out["stdout"], json!("done\n"));
        assert_eq!(out["exitCode"], json!(0));
        let pid = read_pid(&dir.path.join("holder.pid")).await;
        // A normal finish keeps background jobs, until the agent's process ends.
        assert!(alive(pid));
        let _ = nix::sys::signal::kill(pid, Signal::SIGKILL);
    }

    #[tokio::test]
    async fn background_jobs_end_when_the_agents_process_ends() {
        let dir = workdir();
        let settings = settings();
        let input = json!({"command": "setsid sleep 30 > /dev/null 2>&1 < /dev/null & echo $! > bg.pid"});
        let out = ok(call_with(&settings, "exec", &dir.path, input).await);
        assert_eq!(out["timedOut"], json!(false));
        let pid = read_pid(&dir.path.join("bg.pid")).await;
        assert!(alive(pid));
        // Until `setsid` has exec'd `sleep`, its environment may read as
        // empty (the process is between images): wait for the new image.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(b"sleep")) {
            assert!(std::time::Instant::now() < deadline, "sleep never started");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(settings.tool_processes.kill_all(), 1);
        assert_gone(pid).await;
    }

    /// Starts `command` without a timeout and drops the call once the
    /// process whose pid it writes to `pid_file` runs: that process is gone.
    async fn assert_dropping_the_call_kills(command: &str, pid_file: &str) {
        let dir = workdir();
        let Some(handler) = handler("exec", &settings()) else { panic!("no bash.exec handler") };
        let ctx = context_in("bash__exec", &dir.path);
        let input = object(json!({"command": command, "timeoutMs": 0}));
        let pid_file = dir.path.join(pid_file);
        let mut call = handler.call(&ctx, &input);
        // `select!` drops the futures it owns before running a branch, so it
        // gets the call by reference: the call must still be running here.
        tokio::select! {
            result = &mut call => panic!("the call finished: {result:?}"),
            pid = read_pid(&pid_file) => {
                assert!(alive(pid), "the process should run until the call is dropped");
            }
        }
        drop(call);
        assert_gone(read_pid(&pid_file).await).await;
    }

    #[tokio::test]
    async fn dropping_the_call_kills_the_process_group() {
        assert_dropping_the_call_kills("sleep 30 & echo $! > dropped.pid; wait", "dropped.pid").await;
    }

    #[tokio::test]
    async fn dropping_the_call_kills_what_left_the_group() {
        let command = "setsid sleep 30 > /dev/null 2>&1 < /dev/null & echo $! > left.pid; sleep 30";
        assert_dropping_the_call_kills(command, "left.pid").await;
    }

    // ---- output caps -----------------------------------------------------

    #[tokio::test]
    async fn a_hundred_megabytes_of_output_is_capped() {
        let dir = workdir();
        let started = std::time::Instant::now();
        let input = json!({"command": "head -c 100000000 /dev/zero | tr '\\0' a; echo done >&2", "timeoutMs": 60000});
        let out = ok(exec(&dir.path, input).await);
        let elapsed = started.elapsed();
        assert_eq!(out["truncated"], json!(true));
        assert_eq!(out["timedOut"], json!(false));
        assert_eq!(out["exitCode"], json!(0));
        assert_eq!(out["stderr"], json!("done\n"));
        let stdout = out["stdout"].as_str().unwrap_or_default();
        let cap = crate::settings::DEFAULT_BASH_MAX_OUTPUT_BYTES;
        let marker = format!("\n... [{} bytes truncated] ...\n", 100_000_000 - cap);
        assert_eq!(stdout.len(), cap + marker.len());
        let half = "a".repeat(cap / 2);
        assert_eq!(stdout, format!("{half}{marker}{half}"));
        assert!(elapsed < Duration::from_secs(30), "{elapsed:?}");
    }

    #[tokio::test]
    async fn each_stream_has_its_own_cap_and_keeps_head_and_tail() {
        let dir = workdir();
        let settings = capped_settings(10);
        let input = json!({"command": "printf 0123456789abcdefghij; printf short >&2"});
        let out = ok(call_with(&settings, "exec", &dir.path, input).await);
        assert_eq!(out["stdout"], json!("01234\n... [10 bytes truncated] ...\nfghij"));
        assert_eq!(out["stderr"], json!("short"));
        assert_eq!(out["truncated"], json!(true));
        let input = json!({"command": "printf 0123456789; printf 0123456789abc >&2"});
        let out = ok(call_with(&settings, "exec", &dir.path, input).await);
        assert_eq!(out["stdout"], json!("0123456789"));
        assert_eq!(out["stderr"], json!("01234\n... [3 bytes truncated] ...\n89abc"));
        assert_eq!(out["truncated"], json!(true));
    }

    #[tokio::test]
    async fn cuts_never_split_utf8_characters() {
        let dir = workdir();
        // Each syllable is three bytes: a cap of 8 keeps 4 + 4 of the 30 bytes,
        // and the partial characters at the cut are dropped too.
        let out =
            ok(call_with(&capped_settings(8), "exec", &dir.path, json!({"command": "printf 가나다라마바사아자차"}))
                .await);
        let stdout = out["stdout"].as_str().unwrap_or_default();
        assert!(!stdout.contains('\u{FFFD}'), "{stdout}");
        assert_eq!(stdout, "가\n... [24 bytes truncated] ...\n차");
    }

    #[test]
    fn capped_output_matches_a_naive_model() {
        let data: Vec<u8> = (0..5000_u32).map(|i| (i % 251) as u8).collect();
        for cap in [0, 1, 2, 7, 64, 1000, 4999, 5000, 6000] {
            for chunk in [1, 3, 64, 999, 5000] {
                let mut capped = CappedOutput::new(cap);
                let mut fed = 0;
                for piece in data.chunks(chunk) {
                    capped.push(piece);
                    fed += piece.len();
                    let kept = capped.head.len() + capped.tail.len();
                    assert_eq!(kept as u64 + capped.dropped, fed as u64);
                    assert!(kept <= cap);
                }
                let head = cap / 2;
                let tail = cap - head;
                let mut tail_bytes = capped.tail.clone();
                tail_bytes.rotate_left(capped.tail_start);
                if data.len() <= cap {
                    assert_eq!(capped.dropped, 0);
                    assert_eq!([capped.head.as_slice(), tail_bytes.as_slice()].concat(), data);
                } else {
                    assert_eq!(capped.head.as_slice(), &data[..head], "cap {cap} chunk {chunk}");
                    assert_eq!(tail_bytes.as_slice(), &data[data.len() - tail..], "cap {cap} chunk {chunk}");
                    assert_eq!(capped.dropped, (data.len() - cap) as u64);
                }
            }
        }
    }

    // ---- script ----------------------------------------------------------

    fn make_script(dir: &Path, name: &str, text: &str) {
        let path = dir.join(name);
        write(&path, text);
        let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755));
    }

    #[tokio::test]
    async fn script_runs_with_args_in_the_workdir() {
        let dir = workdir();
        make_script(&dir.path, "run.sh", "printf 'arg:%s|' \"$@\"; pwd; echo \"$0\" >&2; exit 4\n");
        let out = ok(script(&dir.path, json!({"path": "run.sh", "args": ["a", "b c", "it's"]})).await);
        assert_eq!(out["path"], json!(dir.path.join("run.sh").to_string_lossy()));
        assert_eq!(out["shell"], json!("/bin/bash"));
        assert_eq!(out["args"], json!(["a", "b c", "it's"]));
        assert_eq!(out["command"], json!("/bin/bash run.sh a 'b c' 'it'\\''s'"));
        let keys: Vec<&str> = out.as_object().map(|o| o.keys().map(String::as_str).collect()).unwrap_or_default();
        assert_eq!(&keys[..3], ["path", "shell", "args"]);
        assert_eq!(out["stdout"], json!(format!("arg:a|arg:b c|arg:it's|{}\n", dir.path.display())));
        assert_eq!(out["stderr"], json!(format!("{}\n", dir.path.join("run.sh").display())));
        assert_eq!(out["exitCode"], json!(4));
        assert_eq!(out["cwd"], json!(dir.path.to_string_lossy()));
        assert_eq!(out["timedOut"], json!(false));
        assert_eq!(out["truncated"], json!(false));

        // No args, another shell, a script that is not executable.
        let _ = std::fs::create_dir(dir.path.join("scripts"));
        write(&dir.path.join("scripts/plain.sh"), "echo \"plain $# $GREETING\"\n");
        let input = json!({"path": "./scripts/plain.sh", "shell": "/bin/sh", "env": {"GREETING": "hey"}});
        let out = ok(script(&dir.path, input).await);
        assert_eq!(out["command"], json!("/bin/sh ./scripts/plain.sh"));
        assert_eq!(out["path"], json!(dir.path.join("scripts/plain.sh").to_string_lossy()));
        assert_eq!(out["shell"], json!("/bin/sh"));
        assert_eq!(out["args"], json!([]));
        assert_eq!(out["stdout"], json!("plain 0 hey\n"));
        assert_eq!(out["exitCode"], json!(0));
        let out = ok(script(&dir.path, json!({"path": "scripts/plain.sh", "args": null, "shell": "sh"})).await);
        assert_eq!(out["stdout"], json!("plain 0 \n"));
    }

    #[tokio::test]
    async fn script_must_exist_and_be_a_file() {
        let dir = workdir();
        let _ = std::fs::create_dir(dir.path.join("folder"));
        let failure = err(script(&dir.path, json!({"path": "missing.sh", "args": ["x"]})).await);
        assert_eq!(code(&failure), Some(E_SCRIPT_NOT_FOUND));
        assert!(failure.message.contains("'missing.sh'"), "{}", failure.message);
        assert!(failure.message.contains(&dir.path.join("missing.sh").display().to_string()), "{}", failure.message);
        assert!(failure.message.contains("does not exist"), "{}", failure.message);
        assert!(failure.suggestion.is_some());
        let failure = err(script(&dir.path, json!({"path": "folder"})).await);
        assert_eq!(code(&failure), Some(E_SCRIPT_NOT_FOUND));
        assert!(failure.message.contains("is not a file"), "{}", failure.message);
    }

    #[tokio::test]
    async fn script_outside_the_workdir_is_refused() {
        let dir = workdir();
        let outside = workdir();
        make_script(&outside.path, "evil.sh", "touch pwned\n");
        let _ = std::os::unix::fs::symlink(outside.path.join("evil.sh"), dir.path.join("link.sh"));
        let absolute = outside.path.join("evil.sh").to_string_lossy().into_owned();
        let relative =
            format!("../{}/evil.sh", outside.path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default());
        for path in [absolute.as_str(), relative.as_str(), "link.sh", "/etc/passwd"] {
            let failure = err(script(&dir.path, json!({"path": path})).await);
            assert_eq!(code(&failure), Some(E_PATH_OUTSIDE_WORKDIR), "{path}: {failure:?}");
        }
        assert!(!outside.path.join("pwned").exists() && !dir.path.join("pwned").exists());
    }

    #[tokio::test]
    async fn script_rejects_bad_inputs_and_a_missing_shell() {
        let dir = workdir();
        make_script(&dir.path, "ok.sh", "echo ok\n");
        let failure = err(script(&dir.path, json!({"path": "ok.sh", "shell": "/nonexistent/shell"})).await);
        assert_eq!(code(&failure), Some(E_SPAWN_FAILED));
        assert!(failure.message.contains("'/nonexistent/shell'"), "{}", failure.message);
        assert!(failure.suggestion.is_some());
        let failure = err(script(&dir.path, json!({"path": "ok.sh", "shell": " "})).await);
        assert_eq!(failure.message, "'shell' must be a non-empty string");
        let failure = err(script(&dir.path, json!({"path": ""})).await);
        assert_eq!(failure.message, "'path' must be a non-empty string");
        let failure = err(script(&dir.path, json!({"path": "ok.sh", "args": ["a\u{0}"]})).await);
        assert_eq!(failure.message, "'args' must not contain NUL characters");
        let failure = err(script(&dir.path, json!({"path": "ok.sh", "args": ["a", 1]})).await);
        assert_eq!(failure.message, "'args' must contain only strings");
        let failure = err(script(&dir.path, json!({"path": "ok.sh", "args": "a"})).await);
        assert_eq!(failure.message, "'args' must be an array of strings, got string");
        let failure = err(script(&dir.path, json!({"args": []})).await);
        assert_eq!(failure.message, "'path' must be a non-empty string");
        let out = ok(script(&dir.path, json!({"path": "ok.sh", "timeoutMs": 0})).await);
        assert_eq!(out["stdout"], json!("ok\n"));
    }

    #[tokio::test]
    async fn script_times_out_like_exec() {
        let dir = workdir();
        make_script(&dir.path, "slow.sh", "sleep 30 & echo $! > slow.pid\nwait\n");
        let out = ok(script(&dir.path, json!({"path": "slow.sh", "timeoutMs": 200})).await);
        assert_eq!(out["timedOut"], json!(true));
        assert_eq!(out["exitCode"], json!(-1));
        assert_gone(read_pid(&dir.path.join("slow.pid")).await).await;
    }

    #[test]
    fn shell_words() {
        assert_eq!(shell_word("a/b.sh"), "a/b.sh");
        assert_eq!(shell_word(""), "''");
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("$HOME"), "'$HOME'");
        assert_eq!(shell_word("it's"), "'it'\\''s'");
    }

    #[test]
    fn unknown_export() {
        assert!(handler("run", &settings()).is_none());
        assert!(handler("exec", &settings()).is_some());
        assert!(handler("script", &settings()).is_some());
    }

    // ---- through the real executor ---------------------------------------

    async fn execute(policy: ExecutorPolicy, dir: &Path, export: &str, args: JsonValue) -> ToolResult {
        Executor::new("bash", &settings()).with_policy(policy).run_in(dir, export, args).await
    }

    #[tokio::test]
    async fn executor_runs_both_exports() {
        let dir = workdir();
        make_script(&dir.path, "s.sh", "echo \"s:$1\"\n");
        let result = execute(ExecutorPolicy::default(), &dir.path, "exec", json!({"command": "printf hello"})).await;
        assert!(!result.is_error(), "{result:?}");
        assert_eq!(result.output.as_ref().map(|o| o["stdout"].clone()), Some(json!("hello")));
        let args = json!({"path": "s.sh", "args": ["ok"], "shell": "/bin/sh", "timeoutMs": 5000, "env": {"A": 1}});
        let result = execute(ExecutorPolicy::default(), &dir.path, "script", args).await;
        assert_eq!(result.output.as_ref().map(|o| o["stdout"].clone()), Some(json!("s:ok\n")), "{result:?}");
    }

    #[tokio::test]
    async fn executor_rejects_missing_and_wrong_typed_arguments() {
        let dir = workdir();
        let cases = [
            ("exec", json!({}), "args.command: required property is missing"),
            ("exec", json!({"command": 1}), "args.command: expected string"),
            ("exec", json!({"command": "true", "cwd": 5}), "args.cwd: expected string"),
            ("exec", json!({"command": "true", "timeoutMs": "5"}), "args.timeoutMs: expected number"),
            ("exec", json!({"command": "true", "env": "A=1"}), "args.env: expected object"),
            ("exec", json!({"command": "true", "timeout": 5}), "args.timeout: unexpected property"),
            ("script", json!({"args": []}), "args.path: required property is missing"),
            ("script", json!({"path": "s.sh", "args": "x"}), "args.args: expected array"),
            ("script", json!({"path": "s.sh", "args": [1]}), "args.args[0]: expected string"),
            ("script", json!({"path": "s.sh", "shell": false}), "args.shell: expected string"),
            ("script", json!({"path": "s.sh", "cwd": "."}), "args.cwd: unexpected property"),
        ];
        for (export, args, expected) in cases {
            let result = execute(ExecutorPolicy::default(), &dir.path, export, args.clone()).await;
            assert_eq!(result.error_code(), Some("E_TOOL_INVALID_ARGS"), "{export} {args}: {result:?}");
            let message = result.error.map(|e| e.message).unwrap_or_default();
            assert!(message.contains(expected), "{export} {args}: {message}");
        }
        // Handler errors come through with their codes.
        let result =
            execute(ExecutorPolicy::default(), &dir.path, "exec", json!({"command": "true", "cwd": ".."})).await;
        assert_eq!(result.error_code(), Some(E_PATH_OUTSIDE_WORKDIR));
        let result = execute(ExecutorPolicy::default(), &dir.path, "script", json!({"path": "none.sh"})).await;
        assert_eq!(result.error_code(), Some(E_SCRIPT_NOT_FOUND));
        let result =
            execute(ExecutorPolicy::default(), &dir.path, "exec", json!({"command": "true", "env": {"A": []}})).await;
        assert_eq!(
            result.error.map(|e| e.message),
            Some("env.A must be a primitive string/number/boolean value".to_owned())
        );
    }

    #[tokio::test]
    async fn executor_truncates_long_errors_to_the_tool_limit() {
        let dir = workdir();
        let cwd = format!("../{}", "deep/".repeat(400));
        let result =
            execute(ExecutorPolicy::default(), &dir.path, "exec", json!({"command": "true", "cwd": cwd})).await;
        assert_eq!(result.error_code(), Some(E_PATH_OUTSIDE_WORKDIR));
        let message = result.error.map(|e| e.message).unwrap_or_default();
        assert_eq!(message.chars().count(), 1200, "{message}");
        assert!(message.ends_with("... (truncated)"));
    }

    #[tokio::test]
    async fn executor_deadline_kills_the_process_group() {
        let dir = workdir();
        let policy = ExecutorPolicy { call_timeout: Some(Duration::from_millis(1000)), ..ExecutorPolicy::default() };
        let args = json!({"command": "sleep 30 & echo $! > cancelled.pid; wait", "timeoutMs": 0});
        let result = execute(policy, &dir.path, "exec", args).await;
        assert_eq!(result.error_code(), Some("E_TOOL_TIMEOUT"), "{result:?}");
        assert_gone(read_pid(&dir.path.join("cancelled.pid")).await).await;
    }

    /// `exec` and `script` run in the agent's sandbox when one is attached:
    /// a write outside the workdir is refused and the result names the
    /// policy and the path; the same call without a sandbox writes.
    #[tokio::test]
    async fn exec_and_script_run_in_the_attached_sandbox() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let outside = tempfile::tempdir()?;
        let workdir = std::fs::canonicalize(dir.path())?;
        let target = std::fs::canonicalize(outside.path())?.join("pwned");
        std::fs::write(workdir.join("write.sh"), format!("echo x > '{}'\n", target.display()))?;
        let sandbox = Arc::new(goondan_sandbox::Sandbox::new(goondan_sandbox::SandboxSpec {
            workdir: workdir.clone(),
            ..goondan_sandbox::SandboxSpec::default()
        }));
        let confined = Arc::new(BaseSettings { sandbox: Some(sandbox), ..BaseSettings::default() });
        let command = json!({"command": format!("echo x > '{}'", target.display())});
        for (export, input) in [("exec", command.clone()), ("script", json!({"path": "write.sh"}))] {
            let output = ok(run_in("bash", export, &confined, &workdir, input).await);
            assert_ne!(output["exitCode"], 0, "{export}: {output}");
            assert_eq!(output["sandbox"]["policy"], "workspace-write", "{export}: {output}");
            assert_eq!(output["sandbox"]["refused"], json!([target.display().to_string()]), "{export}: {output}");
            assert!(!target.exists());
        }
        let output = ok(run_in("bash", "exec", &settings(), &workdir, command).await);
        assert_eq!(output["exitCode"], 0, "{output}");
        assert!(output.get("sandbox").is_none(), "{output}");
        assert!(target.exists());
        Ok(())
    }
}
