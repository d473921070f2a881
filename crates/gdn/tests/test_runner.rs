//! `scripts/cargo-runner`, cargo's runner for this workspace: a test binary
//! that records skipped tests makes the runner print the running total and
//! the reasons; other binaries (`cargo run`) run unchanged.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

fn runner() -> PathBuf {
    common::repo_path("scripts/cargo-runner")
}

/// A shell script at `path` that records `skips` skipped tests (when the
/// runner gave it a log) and prints whether it saw the log variable.
fn fake_binary(path: &Path, skips: usize) {
    let mut script = String::from("#!/bin/sh\necho \"log=${GOONDAN_TEST_SKIP_LOG:-none}\"\n");
    for n in 0..skips {
        script.push_str(&format!(
            "[ -n \"$GOONDAN_TEST_SKIP_LOG\" ] && printf 't{n}\\tno peer here\\n' >> \"$GOONDAN_TEST_SKIP_LOG\"\n"
        ));
    }
    script.push_str("exit 3\n");
    std::fs::write(path, script).unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_test_binary_s_skips_are_totalled_across_the_run_and_its_status_kept() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let deps = dir.path().join("debug/deps");
    std::fs::create_dir_all(&deps).unwrap_or_else(|e| panic!("{e}"));
    fake_binary(&deps.join("first-0123"), 2);
    fake_binary(&deps.join("second-4567"), 1);
    // One shell stands in for cargo: both binaries share its pid's log.
    let script =
        format!("{r} {d}/first-0123; echo status=$?; {r} {d}/second-4567", r = runner().display(), d = deps.display());
    let output = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .env_remove("GOONDAN_TEST_SKIP_LOG")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stdout.contains("status=3"), "the binary's exit status is the runner's: {stdout}");
    assert_eq!(output.status.code(), Some(3));
    assert!(stderr.contains("2 test(s) of this cargo run skipped so far"), "{stderr}");
    assert!(stderr.contains("3 test(s) of this cargo run skipped so far"), "{stderr}");
    assert!(stderr.contains("3 no peer here"), "the reasons are counted: {stderr}");
}

#[test]
fn other_binaries_run_unchanged() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let release = dir.path().join("release");
    std::fs::create_dir_all(&release).unwrap_or_else(|e| panic!("{e}"));
    fake_binary(&release.join("gdn"), 1);
    let output = Command::new(runner())
        .arg(release.join("gdn"))
        .env_remove("GOONDAN_TEST_SKIP_LOG")
        .output()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(output.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "log=none");
    assert!(output.stderr.is_empty(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(!release.join("test-skips").exists());
}
