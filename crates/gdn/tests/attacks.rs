//! A hostile model under the default sandbox, through the CLI as a
//! deployment runs it: a scripted model (anyone who writes to the bot can
//! steer a real one) runs each way out of the sandbox the security issue
//! found, and none of them leaves a trace gdn, Bun, Node or git would later
//! read, run or obey: nothing planted in the bundle (`.env.local`, `.git`,
//! an imported module, `bunfig.toml`, `package.json`, `node_modules`), no
//! setuid file, no connection to a Unix socket outside, and a running
//! service's control socket out of reach of the turns it runs.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::Path;

use common::service::{TestResult, detach, free_port, gdn, until};
use goondan_test_support::{Agent, Bundle, reply_text, reply_tools};
use serde_json::json;

/// A bundle whose scripted model runs `command` with `bash__exec`, then
/// writes `written` with `file-system__write`, then answers.
fn bundle(dir: &Path, command: &str, written: &str, connection: Option<u16>) -> std::io::Result<()> {
    let args = serde_json::json!({ "command": command });
    let write = serde_json::json!({ "path": written, "content": "OPENAI_BASE_URL=http://127.0.0.1:1/\n" });
    let replies =
        [reply_tools([("bash__exec", args)]), reply_tools([("file-system__write", write)]), reply_text("done")];
    let mut bundle = Bundle::new()
        .scripted_model_as("scripted", "s", json!({ "replies": replies }))
        .one_agent("hostile", Agent::new("bot", "scripted").base_tool("bash").base_tool("file-system"));
    if let Some(port) = connection {
        bundle = bundle.webhook("hook", port, json!([{"route": {"agentRef": "Agent/bot"}}]));
    }
    bundle.write(dir)?;
    // A module an entry would import, which the model must not rewrite.
    std::fs::create_dir_all(dir.join("tools/lib"))?;
    std::fs::write(dir.join("tools/lib/helper.ts"), "export const helper = 1;\n")
}

/// What the model tries, each step on its own (`|| true`): every write a
/// later start would read or run, a setuid file, a Unix socket outside.
fn attempts(bundle: &Path, socket: &Path) -> String {
    let b = bundle.display();
    let s = socket.display();
    format!(
        r#"echo OPENAI_BASE_URL=http://127.0.0.1:1/ > "{b}/.env.local" || true
mkdir -p "{b}/.git" && printf '[core]\n\tfsmonitor = touch /tmp/pwned\n' > "{b}/.git/config" || true
echo 'throw new Error("pwned")' >> "{b}/tools/lib/helper.ts" || true
printf '[test]\npreload = "./evil.ts"\n' > "{b}/bunfig.toml" || true
echo '{{"type": "module"}}' > "{b}/package.json" || true
mkdir -p "{b}/node_modules/evil" || true
cp /bin/true suid && chmod 4755 suid || true
mkdir sgid && chmod 2755 sgid || true
/usr/bin/python3 -c 'import socket; socket.socket(socket.AF_UNIX).connect("{s}")' || true
echo notes > notes.txt
"#
    )
}

/// Nothing of `attempts` took: checked on the real files after the run.
fn nothing_took(bundle: &Path, workdir: &Path, listener: &UnixListener) {
    for planted in [".env.local", ".git", "bunfig.toml", "package.json", "node_modules"] {
        assert!(!bundle.join(planted).exists(), "{planted} was planted in the bundle");
    }
    let helper = std::fs::read_to_string(bundle.join("tools/lib/helper.ts")).unwrap_or_default();
    assert_eq!(helper, "export const helper = 1;\n", "the imported module was rewritten");
    for made in ["suid", "sgid"] {
        if let Ok(meta) = std::fs::metadata(workdir.join(made)) {
            assert_eq!(meta.permissions().mode() & 0o6000, 0, "{made} has a set-id bit");
        }
    }
    listener.set_nonblocking(true).unwrap_or_else(|e| panic!("{e}"));
    assert!(listener.accept().is_err(), "a confined command connected to a Unix socket outside");
}

/// A 0700 directory holding a listening socket, as the state root holds
/// the service's.
fn outside_socket(dir: &Path) -> std::io::Result<(UnixListener, std::path::PathBuf)> {
    let private = dir.join("private");
    std::fs::create_dir_all(&private)?;
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700))?;
    let path = private.join("other.sock");
    Ok((UnixListener::bind(&path)?, path))
}

#[test]
fn a_hostile_turn_plants_nothing_and_reaches_nothing() -> TestResult {
    let dir = tempfile::tempdir()?;
    let bundle_dir = dir.path().join("bot");
    std::fs::create_dir_all(&bundle_dir)?;
    let state = dir.path().join("state");
    let (listener, socket) = outside_socket(dir.path())?;
    // file-system aims at the bundle too, by its absolute path.
    bundle(&bundle_dir, &attempts(&bundle_dir, &socket), &bundle_dir.join(".env.local").to_string_lossy(), None)?;
    let output = gdn(&bundle_dir, &state, &["run", "--input", "go", "--json"])?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    // The turn worked in the project's own workdir, where new files work.
    let workdir = state.join("workspaces/hostile/workdir");
    assert_eq!(std::fs::read_to_string(workdir.join("notes.txt"))?, "notes\n");
    nothing_took(&bundle_dir, &workdir, &listener);
    Ok(())
}

/// With `--workdir` at the bundle's directory (the original's default),
/// the bundle is still read-only to the turn: to `bash` (no new file at
/// all) and to `file-system` (`package.json` refused).
#[test]
fn a_workdir_at_the_bundle_keeps_the_bundle_read_only() -> TestResult {
    let dir = tempfile::tempdir()?;
    let bundle_dir = dir.path().join("bot");
    std::fs::create_dir_all(&bundle_dir)?;
    let state = dir.path().join("state");
    let (listener, socket) = outside_socket(dir.path())?;
    bundle(&bundle_dir, &attempts(&bundle_dir, &socket), "package.json", None)?;
    let workdir = bundle_dir.to_string_lossy().into_owned();
    let output = gdn(&bundle_dir, &state, &["run", "--input", "go", "--workdir", &workdir, "--json"])?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    assert!(!bundle_dir.join("notes.txt").exists(), "bash wrote into the bundle");
    nothing_took(&bundle_dir, &bundle_dir, &listener);
    // file-system was refused with its code.
    let log = std::fs::read_to_string(common::instance_path(&state, "bot@default").join("messages.jsonl"))?;
    assert!(log.contains("E_PATH_PROTECTED"), "{log}");
    Ok(())
}

/// A service's turn cannot reach its control socket: it cannot stop the
/// service, delete a conversation or restart anything.
#[test]
fn a_turn_cannot_reach_its_service_control_socket() -> TestResult {
    let dir = tempfile::tempdir()?;
    let bundle_dir = dir.path().join("bot");
    std::fs::create_dir_all(&bundle_dir)?;
    let state = dir.path().join("state");
    let port = free_port()?;
    let control = state.join("workspaces/hostile/service.sock");
    let command = format!(
        r#"/usr/bin/python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect("{}")
s.sendall(b"{{\"op\":\"stop\"}}\n")
print(s.recv(1000))
' > reached.txt 2>&1; cat reached.txt"#,
        control.display()
    );
    bundle(&bundle_dir, &command, "notes.md", Some(port))?;
    let _running = detach(&bundle_dir, &state)?;
    assert!(control.exists(), "no control socket at {}", control.display());
    let event = serde_json::json!({"event": "chat", "instanceKey": "k1", "text": "go"});
    assert!(common::service::post(port, &event)?.starts_with("HTTP/1.1 200"));
    let reached = state.join("workspaces/hostile/workdir/reached.txt");
    until("the turn's command", || Ok(std::fs::metadata(&reached).is_ok_and(|m| m.len() > 0)))?;
    until("the turn's end", || Ok(state.join("workspaces/hostile/workdir/notes.md").exists()))?;
    let said = std::fs::read_to_string(&reached)?;
    assert!(said.contains("Error"), "the command reached the control socket: {said}");
    // The service still runs, and still answers its operator.
    let status: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("workspaces/hostile/service.json"))?)?;
    let pid = status["pid"].as_i64().ok_or("no pid in service.json")?;
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(Path::new(&format!("/proc/{pid}")).exists(), "the service stopped");
    let stopped = gdn(&bundle_dir, &state, &["stop"])?;
    assert_eq!(stopped.status.code(), Some(0), "{}", String::from_utf8_lossy(&stopped.stderr));
    Ok(())
}

/// One command cannot take the machine: a fork bomb stops at the process
/// bound, `yes > file` ends at the file bound, each as a failed command's
/// result, the turn (and gdn) goes on to its answer, and nothing of them
/// outlives gdn. Bounds lower than the defaults keep the test light.
#[test]
fn a_fork_bomb_and_a_disk_filler_end_as_error_results() -> TestResult {
    let dir = tempfile::tempdir()?;
    let bundle_dir = dir.path().join("bot");
    std::fs::create_dir_all(&bundle_dir)?;
    let state = dir.path().join("state");
    let bomb = serde_json::json!({"command": "bomb() { bomb | bomb & }; bomb", "timeoutMs": 3000});
    let filler = serde_json::json!({"command": "yes > big"});
    let replies =
        [reply_tools([("bash__exec", bomb)]), reply_tools([("bash__exec", filler)]), reply_text("still here")];
    let limits = json!({"limits": {"processes": 64, "fileSize": "8MiB"}});
    Bundle::new()
        .scripted_model_as("scripted", "s", json!({ "replies": replies }))
        .agent(Agent::new("bot", "scripted").base_tool("bash").with("sandbox", limits))
        .write(&bundle_dir)?;
    let output = gdn(&bundle_dir, &state, &["run", "--input", "go", "--json"])?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}{}", String::from_utf8_lossy(&output.stderr));
    let answer: serde_json::Value = serde_json::from_str(stdout.trim())?;
    assert_eq!(answer["text"], "still here", "{answer}");
    let log = std::fs::read_to_string(common::instance_path(&state, "bot@default").join("messages.jsonl"))?;
    // The bomb met its bound (its shells could not fork); the filler ended
    // by SIGXFSZ (its shell's 153), its file stopped at the bound.
    assert!(log.contains("Cannot fork"), "{log}");
    assert!(log.contains("SIGXFSZ") || log.contains(r#""exitCode":153"#), "{log}");
    let workdir = state.join("workspaces/bot/workdir");
    assert_eq!(std::fs::metadata(workdir.join("big"))?.len(), 8 << 20);
    // Nothing of the bomb outlives gdn.
    let workdir = std::fs::canonicalize(&workdir)?;
    until("the bomb's processes to end", || {
        let left = std::fs::read_dir("/proc")?
            .flatten()
            .filter(|entry| entry.file_name().to_str().is_some_and(|name| name.bytes().all(|b| b.is_ascii_digit())))
            .filter(|entry| std::fs::read_link(entry.path().join("cwd")).is_ok_and(|cwd| cwd == workdir))
            .count();
        Ok(left == 0)
    })?;
    Ok(())
}
