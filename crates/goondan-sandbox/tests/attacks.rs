//! A confined command tried as an attacker would: every escape is refused
//! under `workspace-write`, allowed under `full` (so each test can fail),
//! and ordinary work still runs. Real processes, a real loopback server.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use goondan_sandbox::{NETWORK_HOLDER_ENV, Policy, Sandbox, SandboxSpec, run_network_holder};

/// Not a test: the entry point when a sandbox starts this binary as its
/// network holder (see `network.rs`).
#[test]
#[ignore = "the network holder's entry point, run when a sandbox starts this binary as one"]
fn network_holder() {
    if std::env::var_os(NETWORK_HOLDER_ENV).is_some() {
        run_network_holder()
    }
}

/// A fake home with a private key, a project (the workdir) with the files
/// the sandbox protects, and another project beside it.
struct Scene {
    _root: tempfile::TempDir,
    home: PathBuf,
    workdir: PathBuf,
    /// A listening Unix socket outside the workdir, in a 0700 directory
    /// (as a service's control socket is).
    socket: PathBuf,
    _listener: std::os::unix::net::UnixListener,
}

fn scene() -> std::io::Result<Scene> {
    let root = tempfile::tempdir()?;
    let base = std::fs::canonicalize(root.path())?;
    let home = base.join("home");
    std::fs::create_dir_all(home.join(".ssh"))?;
    std::fs::write(home.join(".ssh/id_rsa"), "-----BEGIN PRIVATE KEY-----\n")?;
    let workdir = base.join("projects/app");
    std::fs::create_dir_all(workdir.join(".git/hooks"))?;
    std::fs::create_dir_all(workdir.join("src"))?;
    std::fs::write(workdir.join(".git/config"), "[core]\n")?;
    std::fs::write(workdir.join("goondan.yaml"), "kind: Agent\n")?;
    std::fs::write(workdir.join(".env"), "API_KEY=sekrit\n")?;
    std::fs::create_dir_all(base.join("projects/other"))?;
    std::fs::write(base.join("projects/other/secret.txt"), "theirs\n")?;
    let private = base.join("state");
    std::fs::create_dir_all(&private)?;
    std::fs::set_permissions(&private, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    let socket = private.join("service.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket)?;
    std::fs::set_permissions(&socket, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    Ok(Scene { _root: root, home, workdir, socket, _listener: listener })
}

impl Scene {
    fn sandbox(&self, policy: Policy) -> Sandbox {
        Sandbox::new(SandboxSpec {
            policy,
            workdir: self.workdir.clone(),
            protected: vec![self.workdir.join("goondan.yaml")],
            ..SandboxSpec::default()
        })
    }

    /// Under `policy` with a `network.allow` list naming `allowed` (so
    /// that commands join the network holder's namespaces).
    fn sandbox_with_network(&self, policy: Policy, allowed: &str) -> std::io::Result<Sandbox> {
        Ok(Sandbox::new(SandboxSpec {
            policy,
            workdir: self.workdir.clone(),
            protected: vec![self.workdir.join("goondan.yaml")],
            network_allow: vec![allowed.to_owned()],
            ..SandboxSpec::default()
        })
        .with_network_holder(
            std::env::current_exe()?,
            ["network_holder", "--exact", "--ignored", "--nocapture", "--quiet"],
        ))
    }

    fn run(&self, sandbox: &Sandbox, script: &str) -> Output {
        let mut command = Command::new("/bin/bash");
        command.arg("-c").arg(script).current_dir(&self.workdir).env("HOME", &self.home).stdin(Stdio::null());
        if let Err(error) = sandbox.confine(&mut command) {
            panic!("confining failed: {error}");
        }
        match command.output() {
            Ok(output) => output,
            Err(error) => panic!("running {script}: {error}"),
        }
    }
}

/// A process outside the sandbox, killed when dropped.
struct Victim(Child);

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn victim() -> Victim {
    match Command::new("sleep").arg("60").env("VICTIM_SECRET", "s3cr3t").spawn() {
        Ok(child) => Victim(child),
        Err(error) => panic!("sleep: {error}"),
    }
}

fn attacks(port: u16, victim: u32, socket: &Path) -> Vec<(&'static str, String)> {
    let me = std::process::id();
    let socket = socket.display();
    vec![
        (
            "connect to a Unix socket outside the workdir",
            format!("/usr/bin/python3 -c 'import socket; socket.socket(socket.AF_UNIX).connect(\"{socket}\")'"),
        ),
        ("make a setuid file", "cp /bin/true t && chmod 4755 t && test -u t".to_owned()),
        ("make a setgid file", "cp /bin/true t && chmod g+s t && test -g t".to_owned()),
        ("make a setgid directory", "mkdir d && chmod 2755 d && test -g d".to_owned()),
        ("make a setuid file with install", "install -m 4755 /bin/true t && test -u t".to_owned()),
        (
            "create a file setuid from the start",
            "/usr/bin/python3 -c \"import os; os.close(os.open('t', os.O_CREAT | os.O_WRONLY, 0o4755))\" && test -u t"
                .to_owned(),
        ),
        (
            "make a setuid fifo",
            "/usr/bin/python3 -c \"import os, stat; os.mknod('t', stat.S_IFIFO | 0o4644)\" && test -u t".to_owned(),
        ),
        ("read a private key in the home", r#"cat "$HOME/.ssh/id_rsa""#.to_owned()),
        ("read gdn's environment", format!("cat /proc/{me}/environ")),
        ("read another process's environment", format!("grep -q s3cr3t /proc/{victim}/environ")),
        ("read gdn's memory map", format!("cat /proc/{me}/maps")),
        ("open gdn's memory", format!("exec 3</proc/{me}/mem")),
        ("read another project", "cat ../other/secret.txt".to_owned()),
        ("write outside the workdir", r#"echo x > "$HOME/pwned""#.to_owned()),
        ("write /tmp", "echo x > /tmp/goondan-sandbox-attack-$$ && rm /tmp/goondan-sandbox-attack-$$".to_owned()),
        ("write .git/config", "echo x >> .git/config".to_owned()),
        ("create a git hook", "echo x > .git/hooks/pre-commit".to_owned()),
        ("write goondan.yaml", "echo x >> goondan.yaml".to_owned()),
        ("replace goondan.yaml", "echo x > new.yaml && mv new.yaml goondan.yaml".to_owned()),
        ("read .env", "grep -q sekrit .env".to_owned()),
        ("escape through a symlink", r#"ln -s "$HOME/.ssh/id_rsa" link && cat link"#.to_owned()),
        ("escape through a hard link", r#"ln "$HOME/.ssh/id_rsa" hard && cat hard"#.to_owned()),
        ("escape through ..", r#"cat "$PWD/../../home/.ssh/id_rsa""#.to_owned()),
        ("escape through /proc/self/root", r#"cat "/proc/self/root$HOME/.ssh/id_rsa""#.to_owned()),
        ("connect to a loopback server", format!("exec 3<>/dev/tcp/127.0.0.1/{port}")),
        ("unshare", "unshare -U true".to_owned()),
        ("setsid", "setsid true".to_owned()),
        ("signal gdn", format!("kill -0 {me}")),
        (
            "ptrace another process",
            format!(
                "/usr/bin/python3 -c 'import ctypes,sys; libc=ctypes.CDLL(None); sys.exit(0 if libc.ptrace(16, {victim}, 0, 0) == 0 else 1)'"
            ),
        ),
    ]
}

fn undo(scene: &Scene) {
    // What an allowed attack left behind, so that the next one starts clean.
    for leftover in ["link", "hard", "new.yaml", "t"] {
        let _ = std::fs::remove_file(scene.workdir.join(leftover));
    }
    let _ = std::fs::remove_dir(scene.workdir.join("d"));
    let _ = std::fs::remove_file(scene.home.join("pwned"));
    let _ = std::fs::remove_file(scene.workdir.join(".git/hooks/pre-commit"));
}

fn check_attacks(sandbox: &Sandbox, scene: &Scene, refused: bool) {
    let listener = match TcpListener::bind("127.0.0.1:0") {
        Ok(listener) => listener,
        Err(error) => panic!("bind: {error}"),
    };
    let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
    let victim = victim();
    let mut wrong = Vec::new();
    for (name, script) in attacks(port, victim.0.id(), &scene.socket) {
        let output = scene.run(sandbox, &script);
        if output.status.success() == refused {
            wrong.push(format!(
                "{name}: exit {:?}, stderr {}",
                output.status.code(),
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        undo(scene);
    }
    assert!(
        wrong.is_empty(),
        "under {}, {} attacks were {}:\n{}",
        sandbox.policy(),
        wrong.len(),
        if refused { "allowed" } else { "refused" },
        wrong.join("\n")
    );
}

fn check_ordinary_work(sandbox: &Sandbox, scene: &Scene) {
    let script = r#"set -e
        echo hi > notes.txt && mkdir -p out/deep && echo y > out/deep/z && rm notes.txt
        echo t > "$TMPDIR/scratch" && cat "$TMPDIR/scratch" >/dev/null
        cat .git/config goondan.yaml /etc/passwd > /dev/null
        ls /usr/bin > /dev/null
        /usr/bin/python3 -c 'print(1)' > /dev/null
        /usr/bin/python3 -c 'import socket; a, b = socket.socketpair(); a.send(b"x"); assert b.recv(1) == b"x"'
        cp /bin/true mine && chmod 755 mine && ./mine && chmod u+x,g-s mine && rm mine
        echo ok"#;
    let output = scene.run(sandbox, script);
    assert!(
        output.status.success(),
        "ordinary work failed under {}: {}",
        sandbox.policy(),
        String::from_utf8_lossy(&output.stderr)
    );
    let _ = std::fs::remove_dir_all(scene.workdir.join("out"));
}

#[test]
fn workspace_write_refuses_every_attack_and_allows_ordinary_work() -> std::io::Result<()> {
    let scene = scene()?;
    let sandbox = scene.sandbox(Policy::WorkspaceWrite);
    check_attacks(&sandbox, &scene, true);
    check_ordinary_work(&sandbox, &scene);
    assert_eq!(sandbox.uses_namespaces(), Some(true));
    Ok(())
}

#[test]
fn with_a_network_allow_list_every_attack_is_still_refused() -> std::io::Result<()> {
    let scene = scene()?;
    // Another port than the attacked server's: that one stays unlisted.
    let listed = TcpListener::bind("127.0.0.1:0")?;
    let sandbox = scene.sandbox_with_network(Policy::WorkspaceWrite, &listed.local_addr()?.to_string())?;
    check_attacks(&sandbox, &scene, true);
    check_ordinary_work(&sandbox, &scene);
    assert_eq!(sandbox.uses_namespaces(), Some(true));
    let Some(holder) = sandbox.network_holder_pid() else { panic!("no network holder") };
    for attack in [format!("kill -0 {holder}"), format!("cat /proc/{holder}/environ"), "unshare -n true".to_owned()] {
        assert!(!scene.run(&sandbox, &attack).status.success(), "{attack} was allowed");
    }
    let sandbox = scene.sandbox_with_network(Policy::ReadOnly, &listed.local_addr()?.to_string())?;
    assert!(!scene.run(&sandbox, "echo x > notes.txt").status.success());
    assert!(scene.run(&sandbox, "cat goondan.yaml > /dev/null").status.success());
    Ok(())
}

/// A Unix socket the command makes itself, in its workdir or temporary
/// directory, works as usual where it has a root of its own.
#[test]
fn a_command_uses_the_unix_sockets_it_makes() -> std::io::Result<()> {
    let scene = scene()?;
    let sandbox = scene.sandbox(Policy::WorkspaceWrite);
    let script = r#"/usr/bin/python3 -c '
import os, socket
for place in (".", os.environ["TMPDIR"]):
    path = os.path.join(place, "own.sock")
    server = socket.socket(socket.AF_UNIX); server.bind(path); server.listen(1)
    client = socket.socket(socket.AF_UNIX); client.connect(path)
    peer, _ = server.accept(); client.send(b"x"); assert peer.recv(1) == b"x"
    os.unlink(path)
'"#;
    let output = scene.run(&sandbox, script);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(sandbox.uses_namespaces(), Some(true));
    Ok(())
}

/// A workdir that is the bundle's directory takes no write at all, not
/// even a new file, in either layout.
#[test]
fn a_protected_workdir_takes_no_new_file() -> std::io::Result<()> {
    let scene = scene()?;
    for landlock_only in [false, true] {
        let sandbox = Sandbox::new(SandboxSpec {
            policy: Policy::WorkspaceWrite,
            workdir: scene.workdir.clone(),
            bundle: Some(scene.workdir.clone()),
            ..SandboxSpec::default()
        });
        let sandbox = if landlock_only { sandbox.landlock_only() } else { sandbox };
        for attack in ["echo x > .env.local", "mkdir .git2", "echo x > src/helper.ts", "echo '{}' > package.json"] {
            let output = scene.run(&sandbox, attack);
            assert!(!output.status.success(), "{attack} was allowed (Landlock only: {landlock_only})");
        }
        let output = scene.run(&sandbox, "cat goondan.yaml > /dev/null && echo t > \"$TMPDIR/t\"");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        for made in [".env.local", "src/helper.ts", "package.json"] {
            assert!(!scene.workdir.join(made).exists(), "{made} was made");
        }
    }
    Ok(())
}

#[test]
fn full_allows_every_attack() -> std::io::Result<()> {
    let scene = scene()?;
    check_attacks(&scene.sandbox(Policy::Full), &scene, false);
    Ok(())
}

#[test]
fn without_namespaces_the_same_attacks_are_refused() -> std::io::Result<()> {
    let scene = scene()?;
    let sandbox = scene.sandbox(Policy::WorkspaceWrite).landlock_only();
    check_attacks(&sandbox, &scene, true);
    assert_eq!(sandbox.uses_namespaces(), Some(false));
    // Inside an existing directory work goes on; directly in the workdir
    // nothing new can be made there.
    let output = scene.run(&sandbox, "echo y > src/z && rm src/z && echo t > \"$TMPDIR/t\"");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(!scene.run(&sandbox, "echo x > top.txt").status.success());
    // No root of its own here: no Unix socket can be made at all (a
    // socketpair still works).
    let output = scene.run(&sandbox, "/usr/bin/python3 -c 'import socket; socket.socket(socket.AF_UNIX)'");
    assert!(!output.status.success());
    let output = scene.run(&sandbox, "/usr/bin/python3 -c 'import socket; socket.socketpair()'");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    Ok(())
}

#[test]
fn read_only_refuses_writes_in_the_workdir_but_not_in_its_temp_dir() -> std::io::Result<()> {
    let scene = scene()?;
    let sandbox = scene.sandbox(Policy::ReadOnly);
    assert!(!scene.run(&sandbox, "echo x > notes.txt").status.success());
    assert!(!scene.workdir.join("notes.txt").exists());
    let output = scene.run(&sandbox, "cat goondan.yaml > /dev/null && echo t > \"$TMPDIR/t\"");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(!scene.run(&sandbox, "grep -q sekrit .env").status.success());
    Ok(())
}

#[test]
fn the_private_temp_dir_is_removed_with_the_sandbox() -> std::io::Result<()> {
    let scene = scene()?;
    let sandbox = scene.sandbox(Policy::WorkspaceWrite);
    assert!(scene.run(&sandbox, "true").status.success());
    let Some(tmp) = sandbox.temp_dir().map(Path::to_path_buf) else { panic!("no temp dir") };
    assert!(tmp.is_dir());
    drop(sandbox);
    assert!(!tmp.exists());
    Ok(())
}

/// A command confined from a thread that blocks SIGTERM (as a service's
/// threads do) still gets the signal: the child starts with no signal
/// blocked, as an unconfined spawn does.
#[test]
fn a_confined_command_starts_with_no_signal_blocked() -> std::io::Result<()> {
    use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};
    let scene = scene()?;
    let sandbox = scene.sandbox(Policy::WorkspaceWrite);
    let mut blocked = SigSet::empty();
    blocked.add(Signal::SIGTERM);
    blocked.add(Signal::SIGHUP);
    let output = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&blocked), None).map_err(std::io::Error::from)?;
                Ok::<_, std::io::Error>(scene.run(&sandbox, "grep SigBlk /proc/self/status"))
            })
            .join()
            .unwrap_or_else(|_| panic!("the spawning thread panicked"))
    })?;
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "SigBlk:\t0000000000000000");
    Ok(())
}

/// The tests above again, as an unprivileged user (this binary run again
/// under `setpriv`) when they ran as root: the sandbox maps root to an
/// unprivileged user in its namespace, a user keeps its own id, and both
/// must hold.
#[test]
fn the_same_holds_for_an_unprivileged_user() -> std::io::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    let tests = [
        "workspace_write_refuses_every_attack_and_allows_ordinary_work",
        "without_namespaces_the_same_attacks_are_refused",
        "a_protected_workdir_takes_no_new_file",
        "a_command_uses_the_unix_sockets_it_makes",
        "with_a_network_allow_list_every_attack_is_still_refused",
        "full_allows_every_attack",
    ];
    let output = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"])
        .arg(std::env::current_exe()?)
        .args(tests)
        .args(["--exact", "--test-threads=1"])
        .env("TMPDIR", "/tmp")
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "as uid 65534:\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains(&format!("{} passed", tests.len())), "{stdout}");
    Ok(())
}

/// `open_network` (a Connector's host): TCP reaches the machine's network,
/// and everything else stays confined — no Unix socket outside, no write
/// outside, no setuid file.
#[test]
fn an_open_network_opens_only_the_network() -> std::io::Result<()> {
    let scene = scene()?;
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    for landlock_only in [false, true] {
        let sandbox = Sandbox::new(SandboxSpec {
            policy: Policy::WorkspaceWrite,
            workdir: scene.workdir.clone(),
            open_network: true,
            ..SandboxSpec::default()
        });
        let sandbox = if landlock_only { sandbox.landlock_only() } else { sandbox };
        let output = scene.run(&sandbox, &format!("exec 3<>/dev/tcp/127.0.0.1/{port}"));
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let socket = scene.socket.display();
        for attack in [
            format!("/usr/bin/python3 -c 'import socket; socket.socket(socket.AF_UNIX).connect(\"{socket}\")'"),
            r#"echo x > "$HOME/pwned""#.to_owned(),
            "cp /bin/true t && chmod 4755 t && test -u t".to_owned(),
        ] {
            let output = scene.run(&sandbox, &attack);
            assert!(!output.status.success(), "{attack} was allowed (Landlock only: {landlock_only})");
            undo(&scene);
        }
    }
    Ok(())
}

/// A bundle inside the workdir: nothing in it can be written, and nothing
/// made on the way to it (a `node_modules` or `package.json` there would be
/// read when its modules load); elsewhere in the workdir work goes on. A
/// bundle outside the workdir is not even seen.
#[test]
fn a_bundle_inside_the_workdir_is_read_only_and_nothing_is_planted_above_it() -> std::io::Result<()> {
    let scene = scene()?;
    let bundle = scene.workdir.join("bot");
    std::fs::create_dir_all(bundle.join("tools"))?;
    std::fs::write(bundle.join("goondan.yaml"), "kind: Agent\n")?;
    std::fs::write(bundle.join("tools/echo.ts"), "export {}\n")?;
    std::fs::write(bundle.join(".env"), "KEY=bundle-secret\n")?;
    for landlock_only in [false, true] {
        let sandbox = Sandbox::new(SandboxSpec {
            policy: Policy::WorkspaceWrite,
            workdir: scene.workdir.clone(),
            bundle: Some(bundle.clone()),
            ..SandboxSpec::default()
        });
        let sandbox = if landlock_only { sandbox.landlock_only() } else { sandbox };
        for attack in [
            "mkdir node_modules",
            "echo '{}' > package.json",
            "echo x > bot/tools/helper.ts",
            "echo x >> bot/tools/echo.ts",
            "echo x > bot/.env.local",
            "echo x > bot/bunfig.toml",
            "grep -q bundle-secret bot/.env",
        ] {
            let output = scene.run(&sandbox, attack);
            assert!(!output.status.success(), "{attack} was allowed (Landlock only: {landlock_only})");
        }
        let output = scene.run(&sandbox, "cat bot/goondan.yaml > /dev/null && echo y > src/z && rm src/z");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        // Elsewhere: not seen at all.
        let elsewhere = Sandbox::new(SandboxSpec {
            policy: Policy::WorkspaceWrite,
            workdir: scene.workdir.join("src"),
            bundle: Some(bundle.clone()),
            ..SandboxSpec::default()
        });
        let elsewhere = if landlock_only { elsewhere.landlock_only() } else { elsewhere };
        let output = scene.run(&elsewhere, &format!("cat {}/goondan.yaml", bundle.display()));
        assert!(!output.status.success(), "the bundle was read from outside the workdir");
    }
    for made in ["node_modules", "package.json", "bot/tools/helper.ts", "bot/.env.local", "bot/bunfig.toml"] {
        assert!(!scene.workdir.join(made).exists(), "{made} was made");
    }
    Ok(())
}

/// A workdir inside the bundle's directory (a state root kept in the
/// project): it is writable, and the rest of the bundle is not touched.
#[test]
fn a_workdir_inside_the_bundle_is_writable_and_only_it() -> std::io::Result<()> {
    let scene = scene()?;
    let inner = scene.workdir.join("state/work");
    for landlock_only in [false, true] {
        // (Without namespaces nothing new is made directly in a workdir.)
        std::fs::create_dir_all(inner.join("out"))?;
        let sandbox = Sandbox::new(SandboxSpec {
            policy: Policy::WorkspaceWrite,
            workdir: inner.clone(),
            bundle: Some(scene.workdir.clone()),
            ..SandboxSpec::default()
        });
        let sandbox = if landlock_only { sandbox.landlock_only() } else { sandbox };
        let mut command = Command::new("/bin/bash");
        let script = format!(
            "echo y > out/notes && ! echo x > '{0}/package.json' && ! echo x >> '{0}/goondan.yaml'",
            scene.workdir.display()
        );
        command.arg("-c").arg(script).current_dir(&inner).stdin(Stdio::null());
        sandbox.confine(&mut command).map_err(std::io::Error::other)?;
        let output = command.output()?;
        assert!(output.status.success(), "Landlock only: {landlock_only}: {}", String::from_utf8_lossy(&output.stderr));
        assert!(!scene.workdir.join("package.json").exists());
        assert_eq!(std::fs::read_to_string(scene.workdir.join("goondan.yaml"))?, "kind: Agent\n");
        std::fs::remove_dir_all(inner.join("out"))?;
    }
    Ok(())
}

/// A sandbox warmed up at assembly is set up on its own thread; the first
/// command then finds it ready (and is confined as any).
#[test]
fn a_warmed_up_sandbox_is_ready_before_its_first_command() -> std::io::Result<()> {
    let scene = scene()?;
    let sandbox = std::sync::Arc::new(scene.sandbox(Policy::WorkspaceWrite));
    sandbox.warm_up();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while sandbox.uses_namespaces().is_none() {
        assert!(std::time::Instant::now() < deadline, "not set up");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(!scene.run(&sandbox, "cat \"$HOME/.ssh/id_rsa\"").status.success());
    assert!(scene.run(&sandbox, "echo hi > notes.txt && rm notes.txt").status.success());
    Ok(())
}
