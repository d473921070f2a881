//! `gdn package install` as a user runs it, whole processes against a real
//! `gdn registry serve` on 127.0.0.1 (storage and state roots on tmpfs):
//!
//! - one package of 50 files (2 kB each, incompressible), cold (an empty
//!   state root every sample) and warm (already installed: reused);
//! - a bundle whose one dependency has 20 dependencies of 10 files each:
//!   21 downloads, at most `PARALLEL_DOWNLOADS` at once, cold and warm;
//!
//! each from a project with its lockfile (resolution is one packument
//! request per package either way, the lockfile saves only the picks), set
//! against floors measured in the same run: `gdn --version` (starting the
//! process), and curl fetching the same tarballs from the same registry
//! (one process, `--parallel --parallel-max 4` for the 21).
//!
//! `cargo bench -p gdn --bench package_install` (`-- --runs N`, default 20).

#![allow(clippy::print_stdout, clippy::print_stderr, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

mod common;

use common::{Report, ms};

const GDN: &str = env!("CARGO_BIN_EXE_gdn");
const TOKEN: &str = "bench-token";

/// `n` bytes no compressor shrinks (xorshift, seeded).
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

fn manifest(name: &str, deps: &[String]) -> String {
    let mut text = format!(
        "apiVersion: goondan.ai/v1\nkind: Package\nmetadata:\n  name: \"{name}\"\nspec:\n  version: \"1.0.0\"\n"
    );
    if !deps.is_empty() {
        text.push_str("  dependencies:\n");
        for dep in deps {
            text.push_str(&format!("    - name: \"{dep}\"\n      version: \"^1.0.0\"\n"));
        }
    }
    text
}

fn gdn(project: &Path, state: &Path) -> Command {
    let mut command = Command::new(GDN);
    command
        .arg("-c")
        .arg(project)
        .env("GOONDAN_STATE_ROOT", state)
        .env("NO_PROXY", "127.0.0.1")
        .env("GOONDAN_REGISTRY_TOKEN", TOKEN)
        .env_remove("GOONDAN_REGISTRY")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

fn must(mut command: Command, what: &str) {
    let output = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(output.status.success(), "{what}: {}", String::from_utf8_lossy(&output.stderr));
}

/// Publishes `name` with `files` files of `size` bytes and `deps`.
fn publish(scratch: &Path, url: &str, name: &str, files: usize, size: usize, deps: &[String]) {
    let dir = scratch.join("src").join(name.replace('/', "_"));
    std::fs::create_dir_all(dir.join("prompts")).unwrap();
    std::fs::write(dir.join("goondan.yaml"), manifest(name, deps)).unwrap();
    for n in 0..files {
        std::fs::write(dir.join(format!("prompts/{n:02}.bin")), noise(size, (n as u64 + 1) * 7919)).unwrap();
    }
    let mut command = gdn(&dir, &scratch.join("publisher"));
    command.args(["package", "publish", "--registry", url]);
    must(command, &format!("publish {name}"));
}

/// A project depending on `dep`, its lockfile made by a first install.
fn project(scratch: &Path, label: &str, dep: &str, url: &str) -> PathBuf {
    let dir = scratch.join("projects").join(label);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("goondan.yaml"), manifest("@bench/app", &[dep.to_owned()])).unwrap();
    let mut command = gdn(&dir, &scratch.join("state-first"));
    command.args(["package", "install", "--registry", url]);
    must(command, "first install");
    dir
}

fn time(mut command: Command) -> f64 {
    let started = Instant::now();
    let output = command.output().unwrap();
    let took = ms(started.elapsed());
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    took
}

fn install(project: &Path, state: &Path, url: &str) -> Command {
    let mut command = gdn(project, state);
    command.args(["package", "install", "--registry", url]);
    command
}

/// The tarball URLs a project's lockfile names.
fn tarballs(project: &Path) -> Vec<String> {
    std::fs::read_to_string(project.join("goondan.lock.yaml"))
        .unwrap()
        .lines()
        .filter_map(|line| line.trim().strip_prefix("resolved: "))
        .map(|url| url.trim_matches('"').to_owned())
        .collect()
}

fn curl(urls: &[String]) -> Command {
    let mut command = Command::new("curl");
    command.args(["-sf", "--parallel", "--parallel-max", "4"]);
    for url in urls {
        command.args(["-o", "/dev/null", url]);
    }
    command.stdout(Stdio::null());
    command
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let runs: usize = args
        .iter()
        .position(|a| a == "--runs")
        .and_then(|at| args.get(at + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or(20);
    let scratch_dir = tempfile::tempdir_in(common::scratch_base()).unwrap();
    let scratch = scratch_dir.path();

    let mut server = Command::new(GDN)
        .args(["registry", "serve", "--port", "0", "--storage"])
        .arg(scratch.join("storage"))
        .env("GOONDAN_REGISTRY_TOKENS", TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let line = lines.next().unwrap().unwrap();
    let url = format!("http://{}", line.trim().rsplit("http://").next().unwrap());

    publish(scratch, &url, "@bench/fifty", 50, 2_000, &[]);
    let deps: Vec<String> = (0..20).map(|n| format!("@bench/dep-{n:02}")).collect();
    for dep in &deps {
        publish(scratch, &url, dep, 10, 5_000, &[]);
    }
    publish(scratch, &url, "@bench/bundle", 0, 0, &deps);
    let fifty = project(scratch, "fifty", "@bench/fifty", &url);
    let bundle = project(scratch, "bundle", "@bench/bundle", &url);
    let fifty_urls = tarballs(&fifty);
    let bundle_urls = tarballs(&bundle);
    assert_eq!((fifty_urls.len(), bundle_urls.len()), (1, 21));

    let mut samples: [Vec<f64>; 7] = Default::default();
    let warm_fifty = scratch.join("warm-fifty");
    let warm_bundle = scratch.join("warm-bundle");
    must(install(&fifty, &warm_fifty, &url), "warm-up");
    must(install(&bundle, &warm_bundle, &url), "warm-up");
    for run in 0..runs {
        let mut version = Command::new(GDN);
        version.arg("--version").stdout(Stdio::null());
        samples[0].push(time(version));
        samples[1].push(time(curl(&fifty_urls)));
        samples[2].push(time(curl(&bundle_urls)));
        let cold = scratch.join(format!("cold-fifty-{run}"));
        samples[3].push(time(install(&fifty, &cold, &url)));
        samples[4].push(time(install(&fifty, &warm_fifty, &url)));
        let cold = scratch.join(format!("cold-bundle-{run}"));
        samples[5].push(time(install(&bundle, &cold, &url)));
        samples[6].push(time(install(&bundle, &warm_bundle, &url)));
        for label in ["fifty", "bundle"] {
            let _ = std::fs::remove_dir_all(scratch.join(format!("cold-{label}-{run}")));
        }
    }
    let _ = server.kill();
    let _ = server.wait();

    let floor = common::median(&samples[0]);
    let curl_one = common::median(&samples[1]);
    let curl_all = common::median(&samples[2]);
    let mut report = Report { text: String::new() };
    report.line(&format!("gdn package install, {runs} runs (median, p10, p90)"));
    report.row("gdn --version (the process floor)", &samples[0], "ms", None);
    report.row("curl: the 50-file package's tarball", &samples[1], "ms", None);
    report.row("curl: the bundle's 21 tarballs, 4 at once", &samples[2], "ms", None);
    let against_one = [("gdn --version", floor), ("curl", curl_one)];
    let against_all = [("gdn --version", floor), ("curl", curl_all)];
    report.row_against("install, 50 files, cold", &samples[3], "ms", &against_one);
    report.row_against("install, 50 files, warm (reused)", &samples[4], "ms", &against_one);
    report.row_against("install, 21 packages (20 deps), cold", &samples[5], "ms", &against_all);
    report.row_against("install, 21 packages (20 deps), warm", &samples[6], "ms", &against_all);
    report.print();
}
