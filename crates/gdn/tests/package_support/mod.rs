//! What the package storage and crash tests share: a `gdn registry serve`
//! process, `gdn package … --json`, bundles with incompressible payloads,
//! raw HTTP reads of the registry, a real tmpfs that can be filled and
//! grown, and the leftovers a crash may leave.

#![allow(dead_code)] // Not every test file uses every piece.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use goondan_test_support::process::{Running, Stream};
use serde_json::Value;

use super::common;

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

pub const TOKEN: &str = "package-storage-token";

/// A `gdn registry serve` process over `storage`.
pub struct Registry {
    pub server: Running,
    pub url: String,
    pub address: String,
}

impl Registry {
    /// Starts a registry over `storage` with the extra environment `env`.
    pub fn start(storage: &Path, env: &[(&str, &str)]) -> Result<Self, Box<dyn std::error::Error>> {
        let mut gdn = common::gdn_bin()
            .env("GOONDAN_REGISTRY_TOKENS", TOKEN)
            .env_remove("GOONDAN_FAULT")
            .env_remove("GOONDAN_ORCHESTRATOR_PID");
        for (name, value) in env {
            gdn = gdn.env(*name, *value);
        }
        let mut command = gdn.command(["registry", "serve", "--port", "0", "--storage"]);
        command.arg(storage);
        let mut server = Running::spawn(command)?;
        let line = server.wait_for_line(Stream::Stdout, "Registry listening on http://", Duration::from_secs(30))?;
        let address = line.trim().rsplit("http://").next().ok_or("no address")?.to_owned();
        Ok(Self { server, url: format!("http://{address}"), address })
    }

    /// `GET path`: the status and the body's bytes.
    pub fn get(&self, path: &str) -> Result<(u16, Vec<u8>), Box<dyn std::error::Error>> {
        let mut stream = std::net::TcpStream::connect(&self.address)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(stream, "GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", self.address)?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer)?;
        let end = answer.windows(4).position(|w| w == b"\r\n\r\n").ok_or("no end of headers")?;
        let head = String::from_utf8_lossy(&answer[..end]).into_owned();
        let status = head.split_whitespace().nth(1).ok_or("no status")?.parse()?;
        // The registry answers with a length, never chunked.
        Ok((status, answer[end + 4..].to_vec()))
    }

    /// The packument of `name` (`None`: 404).
    pub fn packument(&self, name: &str) -> Result<Option<Value>, Box<dyn std::error::Error>> {
        let (status, body) = self.get(&format!("/{name}"))?;
        match status {
            404 => Ok(None),
            200 => Ok(Some(serde_json::from_slice(&body)?)),
            other => Err(format!("GET /{name}: {other} {}", String::from_utf8_lossy(&body)).into()),
        }
    }

    /// Every version the packument of `name` lists has its tarball, with
    /// the integrity listed; the versions, sorted.
    pub fn consistent_versions(&self, name: &str) -> Result<Vec<String>, Box<dyn std::error::Error>> {
        let Some(packument) = self.packument(name)? else { return Ok(Vec::new()) };
        let versions = packument["versions"].as_object().ok_or("no versions")?;
        let bare = name.rsplit('/').next().unwrap_or(name);
        let mut found = Vec::new();
        for (version, meta) in versions {
            let (status, bytes) = self.get(&format!("/{name}/-/{bare}-{version}.tgz"))?;
            assert_eq!(status, 200, "{name}@{version} is listed but its tarball is not served");
            assert_eq!(
                meta["dist"]["integrity"].as_str(),
                Some(goondan_registry::tarball::integrity(&bytes).as_str()),
                "{name}@{version}: the tarball served is not the one listed"
            );
            found.push(version.clone());
        }
        found.sort();
        Ok(found)
    }
}

/// `gdn -c DIR package ARGS --json` with the state root `state` (and the
/// extra environment `env`): the exit status, the JSON printed, the output.
pub fn package(dir: &Path, state: &Path, env: &[(&str, &str)], args: &[&str]) -> (Option<i32>, Value, Output) {
    let mut gdn = common::gdn_bin()
        .project(dir)
        .state(state)
        .env("NO_PROXY", "127.0.0.1")
        .env("GOONDAN_REGISTRY_TOKEN", TOKEN)
        .env_remove("GOONDAN_REGISTRY")
        .env_remove("GOONDAN_FAULT")
        .env_remove("GOONDAN_ORCHESTRATOR_PID")
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy");
    for (name, value) in env {
        gdn = gdn.env(*name, *value);
    }
    let mut full = vec!["package"];
    full.extend_from_slice(args);
    full.push("--json");
    let output = gdn.run(full);
    let json = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    (output.status.code(), json, output)
}

pub fn code(json: &Value) -> &str {
    json["error"]["code"].as_str().unwrap_or("<no error code>")
}

/// `n` bytes no compressor shrinks (xorshift, seeded).
pub fn noise(n: usize, seed: u64) -> Vec<u8> {
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

/// A bundle that is one Package document, with `payload` bytes of noise
/// in `data.bin` when not 0.
pub fn bundle(dir: &Path, name: &str, version: &str, deps: &[(&str, &str)], payload: usize) {
    let mut text = format!(
        "apiVersion: goondan.ai/v1\nkind: Package\nmetadata:\n  name: \"{name}\"\nspec:\n  version: \"{version}\"\n"
    );
    if !deps.is_empty() {
        text.push_str("  dependencies:\n");
        for (dep, range) in deps {
            text.push_str(&format!("    - name: \"{dep}\"\n      version: \"{range}\"\n"));
        }
    }
    common::write(&dir.join("goondan.yaml"), &text);
    if payload > 0 {
        std::fs::write(dir.join("data.bin"), noise(payload, payload as u64 ^ version.len() as u64))
            .unwrap_or_else(|e| panic!("data.bin: {e}"));
    }
}

/// `gdn package publish` of a fresh bundle: the status and the JSON.
pub fn publish(url: &str, name: &str, version: &str, deps: &[(&str, &str)], payload: usize) -> (Option<i32>, Value) {
    let dir = common::temp();
    let state = common::temp();
    bundle(dir.path(), name, version, deps, payload);
    let (status, json, _) = package(dir.path(), state.path(), &[], &["publish", "--registry", url]);
    (status, json)
}

/// The app bundle packages are added to (no dependencies yet).
pub const APP: &str =
    "apiVersion: goondan.ai/v1\nkind: Package\nmetadata:\n  name: \"@acme/app\"\nspec:\n  version: \"0.1.0\"\n";

/// Where `name@version` is installed under `state`.
pub fn installed(state: &Path, name: &str, version: &str) -> PathBuf {
    let (scope, bare) = name.split_once('/').unwrap_or(("", name));
    state.join("packages").join(scope.trim_start_matches('@')).join(bare).join(version)
}

/// What a crash or a failed write may leave under `dir`: temporary files
/// and directories of the registry, the installer and the staged
/// manifest/lockfile.
pub fn leftovers(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&at) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if [".writing-", ".unpacking-", ".stale-", ".removing-", ".tmp"].iter().any(|mark| name.contains(mark)) {
                found.push(entry.path());
            } else if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(entry.path());
            }
        }
    }
    found
}

/// A real tmpfs mounted on a directory (root only), unmounted on drop.
pub struct Tmpfs {
    pub path: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `size` (`"1m"`) on `path`; `None` (the skip
    /// recorded) when not root or no tmpfs can be mounted here.
    pub fn mount(path: &Path, size: &str) -> Option<Self> {
        if !nix::unistd::Uid::effective().is_root() {
            // Shown by cargo's runner (scripts/cargo-runner) with the run's other skips.
            common::record_skip("mounting a tmpfs needs root");
            return None;
        }
        std::fs::create_dir_all(path).ok()?;
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .status()
            .is_ok_and(|status| status.success());
        if !mounted {
            common::record_skip("no tmpfs could be mounted here");
            return None;
        }
        Some(Self { path: path.to_path_buf() })
    }

    /// Grows (or shrinks) the tmpfs to `size`: space freed.
    pub fn resize(&self, size: &str) {
        let resized = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.path)
            .status()
            .is_ok_and(|status| status.success());
        assert!(resized, "remount {} size={size}", self.path.display());
    }

    /// Fills what is left with a file (`filler`), until the disk says no.
    pub fn fill(&self) {
        let mut file = std::fs::File::create(self.path.join("filler")).unwrap_or_else(|e| panic!("filler: {e}"));
        let block = vec![0u8; 4096];
        while file.write_all(&block).is_ok() {}
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}
