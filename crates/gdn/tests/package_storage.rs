//! Packages on a full disk, from two installers at once, and on a
//! terminal: `gdn registry serve` whose storage is a real tmpfs that fills
//! (507, nothing partial visible, what was there still served, the same
//! publish taken once there is room); `gdn package add` whose state root,
//! or whose project directory, is full (a clear error, goondan.yaml and
//! goondan.lock.yaml unchanged, no half install); two `gdn package add`
//! processes installing one package into one state root at once; and the
//! download progress shown on a pseudo-terminal only.

use std::io::Read as _;
use std::process::Stdio;

use serde_json::json;

mod common;
mod package_support;

use package_support::{APP, Registry, TestResult, Tmpfs, bundle, code, installed, leftovers, package, publish};

#[test]
fn a_full_registry_answers_507_keeps_serving_and_takes_the_publish_once_there_is_room() -> TestResult {
    let base = common::temp();
    let storage = base.path().join("storage");
    let Some(disk) = Tmpfs::mount(&storage, "1m") else { return Ok(()) };
    let registry = Registry::start(&storage, &[])?;
    let small = |version: &str, payload: usize| publish(&registry.url, "@acme/lib", version, &[], payload);
    let (status, json) = small("1.0.0", 0);
    assert_eq!(status, Some(0), "{json}");
    let before = registry.packument("@acme/lib")?.ok_or("no packument")?;

    // 1.1.0 carries 2 MB of noise: the tarball does not fit.
    let (status, json) = small("1.1.0", 2 << 20);
    assert_eq!(status, Some(5), "{json}");
    assert_eq!(code(&json), "PKG_REGISTRY_REFUSED", "{json}");
    let message = json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("507") && message.contains("storage is full"), "{message}");
    // Nothing of it visible; what was there served as before.
    assert_eq!(registry.packument("@acme/lib")?, Some(before.clone()));
    assert_eq!(registry.get("/@acme/lib/-/lib-1.1.0.tgz")?.0, 404);
    assert_eq!(registry.consistent_versions("@acme/lib")?, ["1.0.0"]);
    // A new package that does not fit leaves no packument either.
    let (status, json) = publish(&registry.url, "@acme/big", "1.0.0", &[], 2 << 20);
    assert_eq!((status, code(&json)), (Some(5), "PKG_REGISTRY_REFUSED"), "{json}");
    assert_eq!(registry.packument("@acme/big")?, None);
    assert_eq!(registry.get("/@acme/big/-/big-1.0.0.tgz")?.0, 404);
    assert_eq!(leftovers(&storage), Vec::<std::path::PathBuf>::new());
    // The raw answer: 507 and the original's error shape.
    let (status, body) = raw_publish(&registry, "@acme/raw", 2 << 20)?;
    assert_eq!(status, 507);
    let body: serde_json::Value = serde_json::from_slice(&body)?;
    assert_eq!(body["error"], "PKG_STORAGE_FULL", "{body}");

    // Room again: the same publish is taken, whole.
    disk.resize("16m");
    let (status, json) = small("1.1.0", 2 << 20);
    assert_eq!(status, Some(0), "{json}");
    assert_eq!(registry.consistent_versions("@acme/lib")?, ["1.0.0", "1.1.0"]);
    Ok(())
}

/// A publish as any client sends it (base64 tarball in `_attachments`).
fn raw_publish(registry: &Registry, name: &str, payload: usize) -> Result<(u16, Vec<u8>), Box<dyn std::error::Error>> {
    use base64::Engine as _;
    use std::io::Write as _;
    let dir = common::temp();
    bundle(dir.path(), name, "1.0.0", &[], payload);
    let tarball = goondan_registry::tarball::pack(dir.path(), &Default::default())?;
    let bare = name.rsplit('/').next().unwrap_or(name);
    let body = serde_json::to_vec(&json!({
        "name": name, "versions": {"1.0.0": {"name": name, "version": "1.0.0"}},
        "_attachments": {format!("{bare}-1.0.0.tgz"): {"data": base64::engine::general_purpose::STANDARD.encode(&tarball)}},
    }))?;
    let mut stream = std::net::TcpStream::connect(&registry.address)?;
    write!(
        stream,
        "PUT /{name} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        registry.address,
        package_support::TOKEN,
        body.len()
    )?;
    stream.write_all(&body)?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    let end = answer.windows(4).position(|w| w == b"\r\n\r\n").ok_or("no end of headers")?;
    let status = String::from_utf8_lossy(&answer[..end]).split_whitespace().nth(1).ok_or("no status")?.parse()?;
    Ok((status, answer[end + 4..].to_vec()))
}

#[test]
fn an_add_on_a_full_state_root_changes_nothing_and_succeeds_once_there_is_room() -> TestResult {
    let storage = common::temp();
    let registry = Registry::start(storage.path(), &[])?;
    let (status, json) = publish(&registry.url, "@acme/util", "1.0.0", &[], 0);
    assert_eq!(status, Some(0), "{json}");
    let (status, json) = publish(&registry.url, "@acme/big", "1.0.0", &[("@acme/util", "^1.0.0")], 3 << 20);
    assert_eq!(status, Some(0), "{json}");

    let base = common::temp();
    let state = base.path().join("state");
    let Some(disk) = Tmpfs::mount(&state, "1m") else { return Ok(()) };
    let app = common::temp();
    common::write(&app.path().join("goondan.yaml"), APP);
    let (status, json, output) = package(app.path(), &state, &[], &["add", "@acme/big", "--registry", &registry.url]);
    assert_eq!(status, Some(1), "{json} {}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(code(&json), "PKG_DISK_FULL", "{json}");
    let message = json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("No space left on device") && message.contains("left as they were"), "{message}");
    // Nothing changed in the bundle, and no half install a load would take.
    assert_eq!(std::fs::read_to_string(app.path().join("goondan.yaml"))?, APP);
    assert!(!app.path().join("goondan.lock.yaml").exists());
    assert!(!installed(&state, "@acme/big", "1.0.0").exists());
    assert_eq!(leftovers(&state), Vec::<std::path::PathBuf>::new());
    assert_eq!(leftovers(app.path()), Vec::<std::path::PathBuf>::new());

    disk.resize("32m");
    let (status, json, _) = package(app.path(), &state, &[], &["add", "@acme/big", "--registry", &registry.url]);
    assert_eq!(status, Some(0), "{json}");
    let lock = std::fs::read_to_string(app.path().join("goondan.lock.yaml"))?;
    for (name, version) in [("@acme/big", "1.0.0"), ("@acme/util", "1.0.0")] {
        let dir = installed(&state, name, version);
        assert!(dir.join("goondan.yaml").is_file(), "{name}");
        let marker = std::fs::read_to_string(dir.join(".goondan-integrity"))?;
        assert!(lock.contains(&format!("integrity: \"{marker}\"")), "{name}: {marker} not in {lock}");
    }
    assert!(std::fs::read_to_string(app.path().join("goondan.yaml"))?.contains("@acme/big"));
    Ok(())
}

#[test]
fn an_add_whose_project_directory_is_full_changes_neither_file() -> TestResult {
    let storage = common::temp();
    let registry = Registry::start(storage.path(), &[])?;
    let (status, json) = publish(&registry.url, "@acme/lib", "1.0.0", &[], 0);
    assert_eq!(status, Some(0), "{json}");
    let base = common::temp();
    let project = base.path().join("project");
    let Some(disk) = Tmpfs::mount(&project, "256k") else { return Ok(()) };
    common::write(&project.join("goondan.yaml"), APP);
    disk.fill();
    let state = common::temp();
    let (status, json, _) = package(&project, state.path(), &[], &["add", "@acme/lib", "--registry", &registry.url]);
    assert_eq!((status, code(&json)), (Some(1), "PKG_DISK_FULL"), "{json}");
    assert_eq!(std::fs::read_to_string(project.join("goondan.yaml"))?, APP);
    assert!(!project.join("goondan.lock.yaml").exists());
    assert_eq!(leftovers(&project), Vec::<std::path::PathBuf>::new());
    // Room again: the add lands (the package already in place is reused).
    std::fs::remove_file(project.join("filler"))?;
    let (status, json, _) = package(&project, state.path(), &[], &["add", "@acme/lib", "--registry", &registry.url]);
    assert_eq!(status, Some(0), "{json}");
    assert_eq!(json["installed"][0]["reused"], true, "{json}");
    assert!(project.join("goondan.lock.yaml").is_file());
    Ok(())
}

#[test]
fn installs_of_one_package_from_several_processes_at_once_all_succeed() -> TestResult {
    let storage = common::temp();
    let registry = Registry::start(storage.path(), &[])?;
    let (status, json) = publish(&registry.url, "@acme/lib", "1.0.0", &[], 1 << 20);
    assert_eq!(status, Some(0), "{json}");
    for round in 0..3 {
        let state = common::temp();
        let apps: Vec<tempfile::TempDir> = (0..4).map(|_| common::temp()).collect();
        let children: Vec<std::process::Child> = apps
            .iter()
            .map(|app| {
                common::write(&app.path().join("goondan.yaml"), APP);
                common::gdn_bin()
                    .project(app.path())
                    .state(state.path())
                    .env("NO_PROXY", "127.0.0.1")
                    .env_remove("GOONDAN_REGISTRY")
                    .env_remove("GOONDAN_FAULT")
                    .command(["package", "add", "@acme/lib", "--registry", &registry.url, "--json"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
            })
            .collect::<Result<_, _>>()?;
        let mut fresh = 0;
        for child in children {
            let output = child.wait_with_output()?;
            let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
            assert!(output.status.success(), "round {round}: {json} {}", String::from_utf8_lossy(&output.stderr));
            if json["installed"][0]["reused"] == false {
                fresh += 1;
            }
        }
        // One downloads and unpacks; the others wait for it and reuse its install.
        assert_eq!(fresh, 1, "round {round}");
        let dir = installed(state.path(), "@acme/lib", "1.0.0");
        let marker = std::fs::read_to_string(dir.join(".goondan-integrity"))?;
        let lock = std::fs::read_to_string(apps[0].path().join("goondan.lock.yaml"))?;
        assert!(lock.contains(&marker), "{marker}");
        assert_eq!(std::fs::metadata(dir.join("data.bin"))?.len(), 1 << 20);
        assert_eq!(leftovers(state.path()), Vec::<std::path::PathBuf>::new());
    }
    Ok(())
}

/// `gdn package add` with standard error on a pseudo-terminal: what the
/// terminal shows and what standard output got.
fn add_on_a_terminal(
    app: &std::path::Path,
    state: &std::path::Path,
    url: &str,
    json: bool,
) -> Result<(String, String), Box<dyn std::error::Error>> {
    let pty = nix::pty::openpty(None, None)?;
    // Not inherited by the processes other tests start meanwhile: the
    // terminal must end with this child.
    for fd in [&pty.master, &pty.slave] {
        nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))?;
    }
    let mut args = vec!["package", "add", "@acme/lib", "--registry", url];
    if json {
        args.push("--json");
    }
    let mut command = common::gdn_bin()
        .project(app)
        .state(state)
        .env("NO_PROXY", "127.0.0.1")
        .env_remove("GOONDAN_REGISTRY")
        .env_remove("GOONDAN_FAULT")
        .command(args);
    let child = command.stdout(Stdio::piped()).stderr(Stdio::from(pty.slave)).spawn()?;
    // Our copy of the terminal's other end went with the command: the
    // terminal ends when the child exits.
    drop(command);
    let mut master = std::fs::File::from(pty.master);
    let reader = std::thread::spawn(move || {
        let mut shown = Vec::new();
        let mut buffer = [0u8; 4096];
        // EIO once no process holds the terminal's other end.
        while let Ok(n) = master.read(&mut buffer) {
            if n == 0 {
                break;
            }
            shown.extend_from_slice(&buffer[..n]);
        }
        String::from_utf8_lossy(&shown).into_owned()
    });
    let output = child.wait_with_output()?;
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stdout));
    let shown = reader.join().map_err(|_| "reader panicked")?;
    Ok((shown, String::from_utf8_lossy(&output.stdout).into_owned()))
}

#[test]
fn downloads_show_progress_on_a_terminal_and_nowhere_else() -> TestResult {
    let storage = common::temp();
    let registry = Registry::start(storage.path(), &[])?;
    let (status, json) = publish(&registry.url, "@acme/lib", "1.0.0", &[], 300_000);
    assert_eq!(status, Some(0), "{json}");
    let app = common::temp();
    common::write(&app.path().join("goondan.yaml"), APP);

    let state = common::temp();
    let (shown, stdout) = add_on_a_terminal(app.path(), state.path(), &registry.url, false)?;
    assert!(shown.contains("Downloaded @acme/lib@1.0.0 (30"), "{shown:?}");
    assert!(!stdout.contains("Downloaded") && stdout.contains("Dependency added: @acme/lib@^1.0.0"), "{stdout}");
    // Reused: nothing to show.
    let (shown, _) = add_on_a_terminal(app.path(), state.path(), &registry.url, false)?;
    assert!(!shown.contains("Download"), "{shown:?}");
    // --json on a terminal: none either.
    let fresh = common::temp();
    let (shown, stdout) = add_on_a_terminal(app.path(), fresh.path(), &registry.url, true)?;
    assert!(!shown.contains("Download"), "{shown:?}");
    assert!(serde_json::from_str::<serde_json::Value>(&stdout).is_ok(), "{stdout}");
    // Not a terminal: none.
    let other = common::temp();
    let output = common::gdn_bin()
        .project(app.path())
        .state(other.path())
        .env("NO_PROXY", "127.0.0.1")
        .env_remove("GOONDAN_REGISTRY")
        .run(["package", "add", "@acme/lib", "--registry", &registry.url]);
    assert!(output.status.success());
    assert_eq!(String::from_utf8_lossy(&output.stderr), "");
    assert!(installed(other.path(), "@acme/lib", "1.0.0").join("data.bin").is_file());
    Ok(())
}

#[test]
fn a_second_registry_on_one_storage_is_refused_before_it_listens() -> TestResult {
    let storage = common::temp();
    let first = Registry::start(storage.path(), &[])?;
    let mut command = common::gdn_bin().command(["registry", "serve", "--port", "0", "--storage"]);
    command.arg(storage.path());
    let output = command.stdin(Stdio::null()).output()?;
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "", "it announced an address");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("is in use by another registry process"), "{stderr}");
    // The first one goes on serving.
    let (status, json) = publish(&first.url, "@acme/lib", "1.0.0", &[], 0);
    assert_eq!(status, Some(0), "{json}");
    Ok(())
}
