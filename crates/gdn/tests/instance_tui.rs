//! Bare `gdn instance`: the interactive list on a real pseudo-terminal
//! (the screen read through a terminal emulator, keys typed as a terminal
//! sends them), with and without a running service, and the plain list it
//! prints without a terminal.

mod common;

use std::io::{Read as _, Write as _};
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::service::{TestResult, detach, free_port, until};
use goondan_core::{Message, MessageData, MessageSource};
use goondan_runtime::store::{InstanceStore, StateRoot, Workspace, WorkspaceAccess, open_workspace};
use goondan_test_support::{Agent, Bundle, reply_text, text};
use serde_json::json;

/// How long the screen may take to show what a test waits for.
const WAIT: Duration = Duration::from_secs(60);
const ROWS: u16 = 30;
const COLUMNS: u16 = 220;

const DOWN: &[u8] = b"\x1b[B";
const DELETE: &[u8] = b"\x1b[3~";
const CTRL_C: &[u8] = b"\x03";
/// The alternate screen left, the cursor shown: the terminal given back.
const LEAVE_ALTERNATE_SCREEN: &str = "\x1b[?1049l";
const SHOW_CURSOR: &str = "\x1b[?25h";

/// `gdn ARGS` on a pseudo-terminal of its own (standard input, output and
/// error), in a session of its own (`setsid`: our terminal, if any, is not
/// its controlling one, whose size it would read).
struct Tui {
    child: Child,
    master: std::fs::File,
    /// Everything gdn wrote, and the screen it makes.
    shown: Arc<Mutex<(Vec<u8>, vt100::Parser)>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Tui {
    fn start(state: &Path, project: Option<&Path>, args: &[&str]) -> Result<Self, Box<dyn std::error::Error>> {
        let size = nix::pty::Winsize { ws_row: ROWS, ws_col: COLUMNS, ws_xpixel: 0, ws_ypixel: 0 };
        let pty = nix::pty::openpty(Some(&size), None)?;
        // Not inherited by the processes other tests start meanwhile: the
        // terminal must end with this child.
        for fd in [&pty.master, &pty.slave] {
            nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))?;
        }
        let mut command = Command::new("setsid");
        command.arg(env!("CARGO_BIN_EXE_gdn")).arg("--state-root").arg(state);
        if let Some(project) = project {
            command.arg("-c").arg(project);
        }
        command
            .args(args)
            .env_remove("GOONDAN_STATE_ROOT")
            .env_remove("GOONDAN_LOG")
            .env("TERM", "xterm-256color")
            .stdin(Stdio::from(pty.slave.try_clone()?))
            .stdout(Stdio::from(pty.slave.try_clone()?))
            .stderr(Stdio::from(pty.slave));
        let child = command.spawn()?;
        // Our copies of the terminal's other end went with the command: the
        // terminal ends when the child exits.
        drop(command);
        let master = std::fs::File::from(pty.master);
        let screen_size =
            (std::num::NonZeroU16::new(ROWS).ok_or("rows")?, std::num::NonZeroU16::new(COLUMNS).ok_or("columns")?);
        let shown = Arc::new(Mutex::new((Vec::new(), vt100::Parser::new(screen_size.0, screen_size.1, 0))));
        let mut reading = master.try_clone()?;
        let into = Arc::clone(&shown);
        let reader = std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            // EIO once no process holds the terminal's other end.
            while let Ok(n) = reading.read(&mut buffer) {
                if n == 0 {
                    break;
                }
                let mut shown = into.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                shown.0.extend_from_slice(&buffer[..n]);
                shown.1.process(&buffer[..n]);
            }
        });
        Ok(Self { child, master, shown, reader: Some(reader) })
    }

    /// The screen's text now.
    fn screen(&self) -> String {
        self.shown.lock().unwrap_or_else(std::sync::PoisonError::into_inner).1.screen().contents()
    }

    /// Everything gdn wrote to the terminal.
    fn raw(&self) -> String {
        String::from_utf8_lossy(&self.shown.lock().unwrap_or_else(std::sync::PoisonError::into_inner).0).into_owned()
    }

    /// Waits until the screen satisfies `done`; the screen then.
    fn wait_for(&self, what: &str, done: impl Fn(&str) -> bool) -> Result<String, Box<dyn std::error::Error>> {
        let deadline = Instant::now() + WAIT;
        loop {
            let screen = self.screen();
            if done(&screen) {
                return Ok(screen);
            }
            if Instant::now() > deadline {
                return Err(format!("timed out waiting for {what}; the screen:\n{screen}").into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn press(&mut self, keys: &[u8]) -> std::io::Result<()> {
        self.master.write_all(keys)?;
        self.master.flush()
    }

    /// Waits for gdn to end (and the reader to have read all it wrote).
    fn exit(&mut self) -> Result<ExitStatus, Box<dyn std::error::Error>> {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait()? {
                if let Some(reader) = self.reader.take() {
                    reader.join().map_err(|_| "the reader panicked")?;
                }
                return Ok(status);
            }
            if Instant::now() > deadline {
                return Err(format!("gdn did not exit; the screen:\n{}", self.screen()).into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the terminal is in raw mode now (no line editing, no echo).
    fn raw_mode(&self) -> Result<bool, Box<dyn std::error::Error>> {
        let modes = nix::sys::termios::tcgetattr(self.master.as_fd())?;
        let cooked = nix::sys::termios::LocalFlags::ICANON | nix::sys::termios::LocalFlags::ECHO;
        Ok(!modes.local_flags.intersects(cooked))
    }
}

impl Drop for Tui {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The screen's line of the instance `key`.
fn line_of<'a>(screen: &'a str, key: &str) -> Option<&'a str> {
    screen.lines().find(|line| line.split_whitespace().any(|word| word == key))
}

/// Whether the cursor (`> `) is on the line of the instance `key`.
fn selected(screen: &str, key: &str) -> bool {
    line_of(screen, key).is_some_and(|line| line.starts_with("> "))
}

/// How many instances the footer counts.
fn counted(screen: &str, count: usize) -> bool {
    screen.lines().any(|line| line.trim() == format!("{count} instance(s)"))
}

/// Checks the terminal was given back: the alternate screen left and the
/// cursor shown after gdn last entered it, raw mode off.
fn restored(tui: &Tui) -> TestResult {
    let raw = tui.raw();
    let entered = raw.rfind("\x1b[?1049h").ok_or("the alternate screen was never entered")?;
    let after = &raw[entered..];
    assert!(after.contains(LEAVE_ALTERNATE_SCREEN), "the alternate screen was not left: {after:?}");
    assert!(after.contains(SHOW_CURSOR), "the cursor was not shown again: {after:?}");
    assert!(!tui.raw_mode()?, "the terminal was left in raw mode");
    Ok(())
}

fn user(text: &str) -> Message {
    Message::new(MessageData::User { content: text.to_owned() }, MessageSource::User)
}

/// The instance of `agent` for `key` in the workspace `name`, with a
/// message in it.
fn instance(state: &Path, name: &str, agent: &str, key: &str) -> Result<InstanceStore, Box<dyn std::error::Error>> {
    let workspace: Workspace = open_workspace(&StateRoot::new(state), name, "/projects/app", WorkspaceAccess::Use)?;
    let mut store = InstanceStore::open(&workspace, key, agent, Path::new("/projects/app"))?;
    store.append(&[user("hello")])?;
    Ok(store)
}

fn instance_dir(state: &Path, name: &str, agent: &str, key: &str) -> PathBuf {
    state.join("workspaces").join(name).join("instances").join(format!("{agent}@{key}"))
}

#[test]
fn without_a_service_the_list_moves_refuses_to_delete_a_held_instance_and_deletes_an_idle_one() -> TestResult {
    let state = tempfile::tempdir()?;
    drop(instance(state.path(), "crew", "writer", "alpha")?);
    // beta is used last (listed first), and this test's process holds it.
    std::thread::sleep(Duration::from_millis(5));
    let beta = instance(state.path(), "crew", "writer", "beta")?;
    let held = beta.lock()?;

    let mut tui = Tui::start(state.path(), None, &["instance"])?;
    let screen = tui.wait_for("both instances", |screen| {
        line_of(screen, "alpha").is_some() && line_of(screen, "beta").is_some() && counted(screen, 2)
    })?;
    assert!(screen.contains("Instances") && screen.contains("r restart") && screen.contains("Del delete"), "{screen}");
    assert!(screen.contains("WORKSPACE") && screen.contains("STATUS"), "{screen}");
    assert!(selected(&screen, "beta") && !selected(&screen, "alpha"), "the cursor starts on the first row:\n{screen}");
    let running = format!("running (pid {})", std::process::id());
    assert!(line_of(&screen, "beta").is_some_and(|line| line.contains(&running)), "{screen}");
    assert!(tui.raw_mode()?, "the list reads keys in raw mode");

    // Held by a running process, and no service to stop it: refused, nothing deleted.
    tui.press(DELETE)?;
    tui.wait_for("the question", |screen| screen.contains("delete instance 'beta' of agent 'writer'"))?;
    tui.press(b"y")?;
    let screen = tui.wait_for("the refusal", |screen| screen.contains("is running"))?;
    assert!(screen.contains("nothing was deleted"), "{screen}");
    assert!(instance_dir(state.path(), "crew", "writer", "beta").exists());
    assert!(counted(&screen, 2), "{screen}");

    // Down, then r: no service runs, so none of its processes does; said in the status line.
    tui.press(DOWN)?;
    tui.wait_for("the cursor on alpha", |screen| selected(screen, "alpha"))?;
    tui.press(b"r")?;
    tui.wait_for("the restart's outcome", |screen| {
        screen.contains("no service of this project runs, so no process of instance 'alpha' does")
    })?;

    // Delete, then anything but y: nothing deleted.
    tui.press(DELETE)?;
    tui.wait_for("the question", |screen| screen.contains("delete instance 'alpha' of agent 'writer'"))?;
    tui.press(b"n")?;
    tui.wait_for("the answer", |screen| screen.contains("nothing was deleted") && counted(screen, 2))?;
    assert!(instance_dir(state.path(), "crew", "writer", "alpha").exists());

    // Delete, then y: alpha is gone, from the disk and the list.
    tui.press(DELETE)?;
    tui.wait_for("the question", |screen| screen.contains("delete instance 'alpha' of agent 'writer'"))?;
    tui.press(b"y")?;
    let screen = tui.wait_for("one row left", |screen| counted(screen, 1) && line_of(screen, "alpha").is_none())?;
    assert!(screen.contains("deleted instance 'alpha' of agent 'writer'"), "{screen}");
    assert!(line_of(&screen, "beta").is_some(), "{screen}");
    assert!(!instance_dir(state.path(), "crew", "writer", "alpha").exists());

    tui.press(b"q")?;
    assert_eq!(tui.exit()?.code(), Some(0), "{}", tui.screen());
    restored(&tui)?;
    drop((held, beta));
    Ok(())
}

#[test]
fn the_list_refreshes_on_its_own_and_ends_on_esc_enter_on_quit_and_ctrl_c() -> TestResult {
    let state = tempfile::tempdir()?;
    drop(instance(state.path(), "crew", "writer", "alpha")?);

    let mut tui = Tui::start(state.path(), None, &["instance"])?;
    tui.wait_for("alpha", |screen| line_of(screen, "alpha").is_some() && counted(screen, 1))?;
    // An instance made while the list is open shows up without a key pressed.
    drop(instance(state.path(), "crew", "reader", "gamma")?);
    tui.wait_for("gamma, from the refresh", |screen| line_of(screen, "gamma").is_some() && counted(screen, 2))?;
    // A state root that cannot be read is said in the status line; the list goes on.
    let workspaces = state.path().join("workspaces");
    let aside = state.path().join("aside");
    std::fs::rename(&workspaces, &aside)?;
    std::fs::write(&workspaces, "not a directory")?;
    tui.wait_for("the refresh's error", |screen| screen.contains("cannot read the instances"))?;
    std::fs::remove_file(&workspaces)?;
    std::fs::rename(&aside, &workspaces)?;
    tui.wait_for("the list read again", |screen| counted(screen, 2) && line_of(screen, "alpha").is_some())?;
    // Keys still work: from any row, three times down is the final "quit" row.
    tui.press(b"jjj")?;
    tui.wait_for("the cursor on quit", |screen| screen.lines().any(|line| line.trim_end() == "> quit"))?;
    tui.press(CTRL_C)?;
    assert_eq!(tui.exit()?.code(), Some(130), "{}", tui.screen());
    restored(&tui)?;

    let mut tui = Tui::start(state.path(), None, &["instance"])?;
    tui.wait_for("the list", |screen| counted(screen, 2))?;
    tui.press(b"\x1b")?;
    assert_eq!(tui.exit()?.code(), Some(0), "{}", tui.screen());
    restored(&tui)?;

    // Enter on an instance does nothing; on the final "quit" row it ends the list.
    let mut tui = Tui::start(state.path(), None, &["instance"])?;
    tui.wait_for("the list", |screen| counted(screen, 2))?;
    tui.press(b"\r")?;
    tui.press(b"jj")?;
    tui.wait_for("the cursor on quit", |screen| screen.lines().any(|line| line.trim_end() == "> quit"))?;
    tui.press(b"\r")?;
    assert_eq!(tui.exit()?.code(), Some(0), "{}", tui.screen());
    restored(&tui)?;
    Ok(())
}

#[test]
fn no_instances_on_a_terminal_says_so_without_opening_the_list() -> TestResult {
    let state = tempfile::tempdir()?;
    let mut tui = Tui::start(state.path(), None, &["instance"])?;
    assert_eq!(tui.exit()?.code(), Some(0), "{}", tui.screen());
    assert_eq!(tui.screen().trim(), "No instances.");
    assert!(!tui.raw().contains("\x1b[?1049h"), "{:?}", tui.raw());
    Ok(())
}

#[test]
fn without_a_terminal_or_with_json_bare_instance_lists_the_20_most_recent() -> TestResult {
    let state = tempfile::tempdir()?;
    for n in 0..22 {
        drop(instance(state.path(), "crew", "writer", &format!("key{n:02}"))?);
        // Each one used after the one before.
        std::thread::sleep(Duration::from_millis(2));
    }
    let listed = common::gdn_bin().state_arg(state.path()).run(["instance"]);
    assert_eq!(listed.status.code(), Some(0), "{}", text(&listed.stderr));
    let said = text(&listed.stdout);
    let rows: Vec<&str> = said.lines().filter(|line| line.starts_with("crew")).collect();
    assert!(said.lines().next().is_some_and(|header| header.starts_with("WORKSPACE")), "{said}");
    assert_eq!(rows.len(), 20, "{said}");
    assert!(line_of(&said, "key21").is_some() && line_of(&said, "key00").is_none(), "the most recent: {said}");

    let json = common::gdn_bin().state_arg(state.path()).run(["--json", "instance"]);
    assert_eq!(json.status.code(), Some(0), "{}", text(&json.stderr));
    let value: serde_json::Value = serde_json::from_slice(&json.stdout)?;
    assert_eq!(value.as_array().map(Vec::len), Some(20), "{value}");

    // On a terminal, --json is the list too.
    let mut tui = Tui::start(state.path(), None, &["--json", "instance"])?;
    assert_eq!(tui.exit()?.code(), Some(0), "{}", tui.screen());
    assert!(!tui.raw().contains("\x1b[?1049h") && tui.raw().contains("\"instanceKey\": \"key21\""), "{}", tui.raw());
    Ok(())
}

/// One agent `quick` fed by a webhook on `port`, answering at once.
fn service_bundle(dir: &Path, port: u16) -> std::io::Result<()> {
    Bundle::new()
        .scripted_model("fast", [reply_text("pong")])
        .agent(Agent::new("quick", "fast"))
        .resource("Swarm", "solo", json!({"entryAgent": "Agent/quick", "agents": ["Agent/quick"]}))
        .webhook("hook", port, json!([{"route": {"agentRef": "Agent/quick"}}]))
        .write(dir)
}

#[test]
fn with_a_running_service_r_restarts_and_delete_stops_then_deletes_through_it() -> TestResult {
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let port = free_port()?;
    service_bundle(dir.path(), port)?;
    let _running = detach(dir.path(), &state)?;
    for key in ["one", "two"] {
        let body = json!({"instanceKey": key, "text": "hi"});
        assert!(goondan_test_support::http::post_json(port, &[], &body)?.starts_with("HTTP/1.1 200"));
        until("the turn", || {
            Ok(common::service::turns(dir.path(), &state, "quick", key)? == 1
                && common::service::instance(dir.path(), &state, "quick", key)?
                    .is_some_and(|row| row["running"] == true))
        })?;
    }

    let mut tui = Tui::start(&state, Some(dir.path()), &["instance"])?;
    let screen = tui.wait_for("both instances, running", |screen| {
        counted(screen, 2)
            && line_of(screen, "one").is_some_and(|line| line.contains("running (pid"))
            && line_of(screen, "two").is_some_and(|line| line.contains("running (pid"))
    })?;
    let first = if selected(&screen, "two") { "two" } else { "one" };
    let second = if first == "two" { "one" } else { "two" };
    assert!(selected(&screen, first) && !selected(&screen, second), "{screen}");

    tui.press(DOWN)?;
    tui.wait_for("the cursor on the second row", |screen| selected(screen, second))?;
    tui.press(b"r")?;
    let screen = tui.wait_for("the restart", |screen| screen.contains(&format!("instance '{second}' restarted")))?;
    assert!(screen.contains(&format!("stopped quick@{second} (pid ")), "{screen}");
    tui.wait_for("the restarted instance idle", |screen| {
        line_of(screen, second).is_some_and(|line| line.contains("idle")) && selected(screen, second)
    })?;

    // The other one runs: the service stops it, then deletes it.
    tui.press(b"k")?;
    tui.wait_for("the cursor on the first row", |screen| selected(screen, first))?;
    tui.press(DELETE)?;
    tui.wait_for("the question", |screen| screen.contains(&format!("delete instance '{first}' of agent 'quick'")))?;
    tui.press(b"y")?;
    let screen = tui.wait_for("one row left", |screen| counted(screen, 1) && line_of(screen, first).is_none())?;
    assert!(screen.contains(&format!("deleted instance quick@{first}")), "{screen}");
    assert!(!common::instance_path(&state, &format!("quick@{first}")).exists());
    assert!(common::instance_path(&state, &format!("quick@{second}")).exists());

    tui.press(b"q")?;
    assert_eq!(tui.exit()?.code(), Some(0), "{}", tui.screen());
    restored(&tui)?;
    Ok(())
}
