//! The state root is the user's alone, and so is the service's control
//! socket, through real `gdn` processes run with umask 022 (as this user,
//! and as uid 65534 through `setpriv` where the tests run as root):
//! - a one-turn `gdn run --input` of examples/quickstart leaves every
//!   directory of the state root 0700 and every file 0600, while the file
//!   the model wrote in the workdir keeps the user's umask (0644);
//! - a service's files (service.json, logs, the inbox, the socket) too;
//! - `gdn doctor` warns about a looser root and `gdn doctor --fix` makes it
//!   private;
//! - the control socket refuses a client with no_new_privs (as sandboxed
//!   commands run) and a client of another uid, answering why, while the
//!   service goes on and `gdn restart --agent` from the user still works.

use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use goondan_test_support::bundle::copy_dir;
use goondan_test_support::{Agent, Bundle, reply_text};
use serde_json::json;

mod common;
use common::service::{TestResult, free_port, until};
use goondan_test_support::text;

/// The unprivileged user the tests switch to.
const NOBODY: u32 = 65534;

/// Whether processes can be run as [`NOBODY`] here (root, and setpriv).
fn can_switch_user() -> bool {
    let root = nix::unistd::geteuid().is_root();
    let setpriv = Path::new("/usr/bin/setpriv").exists();
    if !(root && setpriv) {
        common::record_skip("the uid-65534 part needs root and /usr/bin/setpriv");
    }
    root && setpriv
}

/// How a `gdn` runs: as whom, and with which prefix.
#[derive(Clone, Copy, PartialEq, Eq)]
enum As {
    /// This process's user.
    Me,
    /// This user, with no_new_privs set (as a sandboxed command).
    MeNoNewPrivs,
    /// uid and gid 65534.
    Nobody,
    /// uid 65534 with no_new_privs.
    NobodyNoNewPrivs,
}

/// `PROGRAM ARGS` run with umask 022, as `who`, with `HOME` at `home`.
fn command(who: As, home: &Path, program: &Path, args: &[&str]) -> Command {
    let mut command = Command::new("/bin/sh");
    command.args(["-c", "umask 022; exec \"$@\"", "sh"]);
    let nobody = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"];
    match who {
        As::Me => {}
        As::MeNoNewPrivs => {
            command.args(["/usr/bin/setpriv", "--no-new-privs"]);
        }
        As::Nobody => {
            command.args(nobody);
        }
        As::NobodyNoNewPrivs => {
            command.args(nobody).arg("--no-new-privs");
        }
    }
    command.arg(program).args(args).env("HOME", home).env("NO_COLOR", "1").stdin(Stdio::null());
    command
}

/// `gdn -c DIR --state-root STATE ARGS`, as `who`.
fn gdn(who: As, dir: &Path, state: &Path, args: &[&str]) -> std::io::Result<Output> {
    let mut all = vec!["-c", dir.to_str().unwrap_or_default(), "--state-root", state.to_str().unwrap_or_default()];
    all.extend_from_slice(args);
    let home = dir.parent().unwrap_or(dir);
    command(who, home, Path::new(env!("CARGO_BIN_EXE_gdn")), &all).env_remove("GOONDAN_STATE_ROOT").output()
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).map(|meta| meta.permissions().mode() & 0o7777).unwrap_or(0)
}

/// A workspace's default working directory (`workspaces/<id>/workdir`):
/// the agents' files, made with the user's umask in a 0700 directory.
fn is_workdir(root: &Path, path: &Path) -> bool {
    path.file_name().is_some_and(|name| name == "workdir")
        && path.parent().and_then(Path::parent) == Some(root.join("workspaces").as_path())
}

/// Every entry under `root` (itself included) that is not private: a
/// directory not 0700, a file not 0600, a socket neither 0600 nor in a
/// 0700 directory. Links are not followed, nor is the content of a
/// workspace's working directory looked at.
fn not_private(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(path) = pending.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&path) else { continue };
        let mode = meta.permissions().mode() & 0o7777;
        let kind = meta.file_type();
        if kind.is_symlink() {
            continue;
        }
        if kind.is_dir() {
            if mode != 0o700 {
                found.push(format!("{} (directory {mode:04o})", path.display()));
            }
            if is_workdir(root, &path) {
                continue;
            }
            pending.extend(std::fs::read_dir(&path).into_iter().flatten().flatten().map(|entry| entry.path()));
        } else if std::os::unix::fs::FileTypeExt::is_socket(&kind) {
            let parent_private = path.parent().is_some_and(|parent| self::mode(parent) == 0o700);
            if mode != 0o600 && !parent_private {
                found.push(format!("{} (socket {mode:04o})", path.display()));
            }
        } else if mode != 0o600 {
            found.push(format!("{} (file {mode:04o})", path.display()));
        }
    }
    found.sort();
    found
}

fn count_files(root: &Path) -> usize {
    let mut count = 0;
    let mut pending = vec![root.to_path_buf()];
    while let Some(path) = pending.pop() {
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => {
                pending.extend(std::fs::read_dir(&path).into_iter().flatten().flatten().map(|entry| entry.path()))
            }
            Ok(_) => count += 1,
            Err(_) => {}
        }
    }
    count
}

fn chown_all(path: &Path, uid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid))?;
    if std::fs::symlink_metadata(path)?.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_all(&entry?.path(), uid)?;
        }
    }
    Ok(())
}

/// A place for a project: a temp dir others may pass through, and in it
/// `home`, owned by `uid` (when switching users) and 0755 as a home often is.
struct Place {
    _temp: tempfile::TempDir,
    home: PathBuf,
}

fn place(who: As) -> std::io::Result<Place> {
    let temp = tempfile::tempdir()?;
    std::fs::set_permissions(temp.path(), std::fs::Permissions::from_mode(0o755))?;
    let home = temp.path().join("home");
    std::fs::create_dir(&home)?;
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755))?;
    if matches!(who, As::Nobody | As::NobodyNoNewPrivs) {
        chown_all(&home, NOBODY)?;
    }
    Ok(Place { _temp: temp, home })
}

fn one_turn_of_the_quickstart(who: As) -> TestResult {
    let place = place(who)?;
    let project = place.home.join("quickstart");
    copy_dir(&common::repo_path("examples/quickstart"), &project)?;
    // Nothing of the state root exists: gdn makes all of it.
    let state = place.home.join("state");
    if who == As::Nobody {
        chown_all(&project, NOBODY)?;
    }
    let run = gdn(who, &project, &state, &["run", "--input", "Take some notes"])?;
    assert_eq!(run.status.code(), Some(0), "{}{}", text(&run.stdout), text(&run.stderr));
    assert!(text(&run.stdout).contains("DONE"), "{}", text(&run.stdout));

    let loose = not_private(&state);
    assert!(loose.is_empty(), "not private:\n{}", loose.join("\n"));
    assert!(count_files(&state) >= 4, "the turn wrote little: {} files", count_files(&state));
    // What the model wrote in the workdir (the project's, or the
    // workspace's default one) is the user's as usual (umask 022).
    let in_workspace = std::fs::read_dir(state.join("workspaces"))?
        .flatten()
        .map(|workspace| workspace.path().join("workdir/workspace/notes.md"))
        .find(|notes| notes.exists());
    let notes = in_workspace.unwrap_or_else(|| project.join("workspace/notes.md"));
    assert_eq!(mode(&notes), 0o644, "{}", notes.display());
    Ok(())
}

#[test]
fn a_turn_leaves_every_directory_0700_and_every_file_0600_whatever_the_umask() -> TestResult {
    one_turn_of_the_quickstart(As::Me)
}

#[test]
fn so_it_does_for_an_unprivileged_user() -> TestResult {
    if !can_switch_user() {
        return Ok(());
    }
    one_turn_of_the_quickstart(As::Nobody)
}

/// One agent answering `pong`, fed by a webhook on `port`.
fn service_bundle(dir: &Path, port: u16) -> std::io::Result<()> {
    Bundle::new()
        .scripted_model("fast", [reply_text("pong")])
        .one_agent("guarded", Agent::new("quick", "fast"))
        .webhook("hook", port, json!([{"route": {"agentRef": "Agent/quick"}}]))
        .write(dir)
}

/// A running service of a project, stopped when dropped.
struct Service {
    who: As,
    dir: PathBuf,
    state: PathBuf,
    port: u16,
}

impl Service {
    fn start(who: As, place: &Place) -> Result<Self, Box<dyn std::error::Error>> {
        let dir = place.home.join("project");
        std::fs::create_dir(&dir)?;
        let port = free_port()?;
        service_bundle(&dir, port)?;
        if who == As::Nobody {
            chown_all(&dir, NOBODY)?;
        }
        let service = Self { who, state: place.home.join("state"), dir, port };
        let started = gdn(who, &service.dir, &service.state, &["run", "--detach"])?;
        assert_eq!(started.status.code(), Some(0), "{}", text(&started.stderr));
        Ok(service)
    }

    fn workspace(&self) -> PathBuf {
        self.state.join("workspaces/guarded")
    }

    fn turns(&self) -> u64 {
        let info = self.workspace().join("instances/quick@k/instance.json");
        let info: serde_json::Value =
            std::fs::read_to_string(info).ok().and_then(|text| serde_json::from_str(&text).ok()).unwrap_or_default();
        info["turns"].as_u64().unwrap_or(0)
    }

    /// Posts a message and waits for its turn.
    fn one_turn(&self) -> TestResult {
        let before = self.turns();
        // Each its own text: the webhook takes a repeated body for a redelivery.
        let body = serde_json::json!({"instanceKey": "k", "text": format!("ping {before}")});
        let response = common::service::post(self.port, &body)?;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        until("a turn", || Ok(self.turns() > before))
            .map_err(|error| format!("{error}; the service's log:\n{}", self.log()).into())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.workspace().join("logs/service.log")).unwrap_or_default()
    }

    fn pid(&self) -> Option<u64> {
        let status = std::fs::read_to_string(self.workspace().join("service.json")).ok()?;
        serde_json::from_str::<serde_json::Value>(&status).ok()?["pid"].as_u64()
    }

    fn restart_agent(&self, who: As) -> std::io::Result<Output> {
        gdn(who, &self.dir, &self.state, &["restart", "--agent", "quick"])
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = gdn(self.who, &self.dir, &self.state, &["stop"]);
    }
}

#[test]
fn a_services_files_are_private_and_doctor_fixes_a_loose_root() -> TestResult {
    let place = place(As::Me)?;
    let service = Service::start(As::Me, &place)?;
    service.one_turn()?;
    assert!(service.workspace().join("service.sock").exists());
    assert!(service.workspace().join("logs/service.log").exists());
    let loose = not_private(&service.state);
    assert!(loose.is_empty(), "not private while the service runs:\n{}", loose.join("\n"));
    let stopped = gdn(As::Me, &service.dir, &service.state, &["stop"])?;
    assert_eq!(stopped.status.code(), Some(0), "{}", text(&stopped.stderr));

    let (dir, state) = (service.dir.clone(), service.state.clone());
    // (Other checks may fail on this machine: only the state's lines are looked at.)
    let doctor = gdn(As::Me, &dir, &state, &["doctor"])?;
    let said = text(&doctor.stdout);
    assert!(said.contains("✓ permissions"), "{said}{}", text(&doctor.stderr));

    // A root an earlier version left, or a hand made loose.
    let messages = service.workspace().join("instances/quick@k/messages.jsonl");
    for dir in [&state, &service.workspace()] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    }
    std::fs::set_permissions(&messages, std::fs::Permissions::from_mode(0o644))?;
    let doctor = gdn(As::Me, &dir, &state, &["doctor"])?;
    let said = text(&doctor.stdout);
    assert!(said.contains("! permissions") && said.contains("3 of its entries are open to other users"), "{said}");
    assert!(said.contains("fix: Run gdn doctor --fix"), "{said}");
    assert_eq!(mode(&state), 0o755, "doctor without --fix changed the root");

    let fixed = gdn(As::Me, &dir, &state, &["doctor", "--fix"])?;
    let said = text(&fixed.stdout);
    assert!(said.contains("✓ permissions"), "{said}");
    assert!(said.contains("made private (3 entries changed"), "{said}");
    let loose = not_private(&state);
    assert!(loose.is_empty(), "not private after --fix:\n{}", loose.join("\n"));
    Ok(())
}

/// Sends one raw request to `socket` as `who` (a Python client); its reply line.
fn raw_request(who: As, home: &Path, socket: &Path, request: &str) -> Result<String, Box<dyn std::error::Error>> {
    let script = "import socket, sys\n\
                  s = socket.socket(socket.AF_UNIX)\n\
                  s.connect(sys.argv[1])\n\
                  s.sendall(sys.argv[2].encode() + b'\\n')\n\
                  print(s.makefile().readline().strip())\n";
    let socket = socket.to_str().unwrap_or_default();
    let output = command(who, home, Path::new("/usr/bin/python3"), &["-c", script, socket, request]).output()?;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    Ok(text(&output.stdout))
}

#[test]
fn the_control_socket_refuses_a_confined_client_and_another_user() -> TestResult {
    let place = place(As::Me)?;
    let service = Service::start(As::Me, &place)?;
    service.one_turn()?;
    let pid = service.pid();

    // `gdn restart` from a process with no_new_privs, as a sandboxed command would run it.
    let confined = service.restart_agent(As::MeNoNewPrivs)?;
    let said = text(&confined.stderr);
    assert_eq!(confined.status.code(), Some(1), "{}{said}", text(&confined.stdout));
    assert!(said.contains("refused: it runs with no_new_privs"), "{said}");
    assert!(service.log().contains("the control socket refused a client (pid "), "{}", service.log());

    // Another uid, given a way to the socket: refused by the service itself.
    if can_switch_user() && Path::new("/usr/bin/python3").exists() {
        for dir in [&place.home, &service.state, &service.state.join("workspaces"), &service.workspace()] {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
        }
        let socket = service.workspace().join("service.sock");
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))?;
        let request = r#"{"op":"deleteInstance","key":"k","agent":"quick"}"#;
        let reply = raw_request(As::Nobody, &place.home, &socket, request)?;
        let reply: serde_json::Value = serde_json::from_str(&reply)?;
        assert_eq!(reply["ok"], false, "{reply}");
        assert!(reply["error"].as_str().is_some_and(|error| error.contains("uid 65534")), "{reply}");
        assert!(service.log().contains(", uid 65534)"), "{}", service.log());
        assert!(service.workspace().join("instances/quick@k").is_dir(), "the instance was deleted");
    }

    // The service goes on, and its user's own gdn is served.
    assert_eq!(service.pid(), pid);
    service.one_turn()?;
    let restarted = service.restart_agent(As::Me)?;
    assert_eq!(restarted.status.code(), Some(0), "{}", text(&restarted.stderr));
    assert!(text(&restarted.stdout).contains("stopped quick@k"), "{}", text(&restarted.stdout));
    service.one_turn()?;
    Ok(())
}

/// A raw client of this user on the socket: served (a reply that is not a refusal).
fn request_as_me(socket: &Path) -> Result<String, Box<dyn std::error::Error>> {
    let mut stream = std::os::unix::net::UnixStream::connect(socket)?;
    stream.write_all(b"{\"op\":\"restart\",\"agent\":\"nobody-here\",\"fresh\":false}\n")?;
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply)?;
    Ok(reply)
}

#[test]
fn an_unprivileged_service_serves_its_own_gdn_and_refuses_it_confined() -> TestResult {
    if !can_switch_user() {
        return Ok(());
    }
    let place = place(As::Nobody)?;
    let service = Service::start(As::Nobody, &place)?;
    service.one_turn()?;
    let loose = not_private(&service.state);
    assert!(loose.is_empty(), "not private:\n{}", loose.join("\n"));

    // gdn makes itself undumpable, which hides its ns/user link from a
    // service without CAP_SYS_PTRACE: still served.
    let restarted = service.restart_agent(As::Nobody)?;
    assert_eq!(restarted.status.code(), Some(0), "{}", text(&restarted.stderr));
    assert!(text(&restarted.stdout).contains("stopped quick@k"), "{}", text(&restarted.stdout));

    let confined = service.restart_agent(As::NobodyNoNewPrivs)?;
    let said = text(&confined.stderr);
    assert_eq!(confined.status.code(), Some(1), "{said}");
    assert!(said.contains("refused: it runs with no_new_privs"), "{said}");

    // Root reaches the socket through the file modes, but is another uid.
    let reply = request_as_me(&service.workspace().join("service.sock"))?;
    assert!(reply.contains("refused: it runs as uid 0, the service as uid 65534"), "{reply}");
    service.one_turn()?;
    Ok(())
}
