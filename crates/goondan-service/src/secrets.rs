//! Keeping the operator's secrets out of reach of the commands the model
//! chooses.
//!
//! Every process `gdn` starts — a `bash__exec` shell, the JavaScript host,
//! whatever they start — inherits `gdn`'s environment, and can read `gdn`'s
//! initial environment block through `/proc/<pid>/environ`. Removing a
//! variable from a running process does not change that block, so `gdn`
//! takes the secrets out by replacing its own image: first thing in `main`,
//! before any thread exists, it copies the secret variables into an
//! anonymous in-memory file (`memfd`, never on disk), and re-executes itself
//! with an environment without them and the file's descriptor in
//! [`SECRETS_FD_ENV`]. The new image reads the values back, closes the
//! descriptor, and hands them only to the code that needs them (model keys,
//! bot tokens, `valueFrom.env`) through its environment lookup. A service's
//! restart (`gdn restart`) replaces the image again, any number of times:
//! each time the values go into a new in-memory file ([`exec_carrying`]),
//! as the first time, never into the environment or the arguments.
//!
//! A secret is a variable whose name looks like one (`*_API_KEY`,
//! `*_TOKEN`, `*SECRET*`, `*PASSWORD*`, …; see [`is_secret_name`]) or that
//! the bundle reads with `valueFrom: {env: NAME}`. The operator lets named
//! variables through on purpose with `GOONDAN_ENV_PASSTHROUGH=NAME,NAME`.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::{Read as _, Write as _};
use std::os::fd::AsRawFd as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;

use goondan_config::{Bundle, ValueSource};
use goondan_core::JsonValue;

/// Names the inherited descriptor (`<pid>:<fd>`) in the re-executed image.
pub const SECRETS_FD_ENV: &str = "GOONDAN_SECRETS_FD";
/// Variables the operator lets through to tool processes although they look
/// like secrets (comma-separated names).
pub const PASSTHROUGH_ENV: &str = "GOONDAN_ENV_PASSTHROUGH";
/// The most secret bytes carried across the re-execution.
const MAX_BYTES: u64 = 4 << 20;

/// The secret variables taken out of this process's environment.
#[derive(Default)]
pub struct Secrets {
    values: BTreeMap<String, String>,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Names only: the values never reach a log.
        f.debug_struct("Secrets").field("names", &self.values.keys().collect::<Vec<_>>()).finish()
    }
}

impl Secrets {
    /// The value of the secret `name`, if it was one.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// Every secret, by name (handed to agent processes over their channel).
    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.values.clone()
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Adds values read from environment files; they replace those of the
    /// same name (the files win over the process environment).
    pub fn extend(&mut self, values: impl IntoIterator<Item = (String, String)>) {
        self.values.extend(values);
    }
}

/// Whether a variable's name says it holds a secret. Case-insensitive.
pub fn is_secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    // The NATS connection's credentials (`--nats`): read by it alone.
    goondan_nats::connect::CREDENTIAL_VARIABLES.contains(&upper.as_str())
        || upper.ends_with("API_KEY")
        || upper.ends_with("APIKEY")
        || upper.ends_with("_TOKEN")
        // A list of tokens (`GOONDAN_REGISTRY_TOKENS`) is as secret as one.
        || upper.ends_with("_TOKENS")
        || upper == "TOKEN"
        || upper.ends_with("_KEY")
            && (upper.contains("PRIVATE") || upper.contains("ACCESS") || upper.contains("SECRET"))
        || upper.contains("SECRET")
        || upper.contains("PASSWORD")
        || upper.contains("PASSWD")
        || upper.ends_with("_CREDENTIALS")
        // OTLP headers carry the collector's credentials.
        || upper.starts_with("OTEL_") && upper.ends_with("_HEADERS")
}

/// Takes the secrets out of the process environment, or reads back the ones
/// a previous image took out. Call it first in `main`, before any thread
/// exists. On success in the first image it does not return: the process
/// continues as the re-executed image. `bundle` is the `-c` path, and
/// `packages_dir` where its installed dependencies are (the variables
/// their documents read are secrets too).
pub fn isolate(bundle: &Path, packages_dir: Option<&Path>) -> Result<Secrets, String> {
    if let Some(carried) = std::env::var_os(SECRETS_FD_ENV) {
        // A variable that names another process's descriptor (a `gdn` run
        // by a tool of this one inherits it) is not ours: ignore it.
        if let Some(fd) = own_descriptor(&carried) {
            return read_carried(fd);
        }
    }
    let passthrough: BTreeSet<String> = std::env::var(PASSTHROUGH_ENV)
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect();
    let from_bundle = bundle_secret_names(bundle, packages_dir);
    let mut taken = BTreeMap::new();
    let mut kept: Vec<(OsString, OsString)> = Vec::new();
    for (name, value) in std::env::vars_os() {
        let secret = match (name.to_str(), value.to_str()) {
            (Some(n), Some(_)) if passthrough.contains(n) || n == SECRETS_FD_ENV => false,
            (Some(n), Some(_)) => is_secret_name(n) || from_bundle.contains(n),
            // A name or value that is not UTF-8 cannot be read as a key.
            _ => false,
        };
        match (secret, name.into_string(), value.into_string()) {
            (true, Ok(name), Ok(value)) => {
                taken.insert(name, value);
            }
            (_, name, value) => {
                let name = name.map_or_else(|n| n, OsString::from);
                if name != SECRETS_FD_ENV {
                    kept.push((name, value.map_or_else(|v| v, OsString::from)));
                }
            }
        }
    }
    if taken.is_empty() {
        return Ok(Secrets::default());
    }
    reexec_without(&taken, kept)
}

/// The descriptor of `<pid>:<fd>` when `pid` is this process.
fn own_descriptor(carried: &std::ffi::OsStr) -> Option<i32> {
    let (pid, fd) = carried.to_str()?.split_once(':')?;
    (pid.parse::<u32>().ok()? == std::process::id()).then_some(())?;
    fd.parse().ok().filter(|fd| *fd > 2)
}

fn read_carried(fd: i32) -> Result<Secrets, String> {
    // Through /proc: a fresh open of the same in-memory file, from its start.
    let path = format!("/proc/self/fd/{fd}");
    let read = std::fs::File::open(&path).and_then(|file| {
        let mut text = String::new();
        file.take(MAX_BYTES + 1).read_to_string(&mut text).map(|_| text)
    });
    // Closed whatever happened: no tool process may inherit it.
    let _ = nix::unistd::close(fd);
    let text = read.map_err(|e| format!("cannot read the secrets carried across the restart: {e}"))?;
    let values: BTreeMap<String, String> = serde_json::from_str(&text)
        .map_err(|e| format!("the secrets carried across the restart are unreadable: {e}"))?;
    Ok(Secrets { values })
}

fn reexec_without(taken: &BTreeMap<String, String>, kept: Vec<(OsString, OsString)>) -> Result<Secrets, String> {
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot keep secrets away from tool processes: cannot find the gdn binary: {e}"))?;
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| exe.clone().into_os_string());
    let mut command = std::process::Command::new(&exe);
    command.arg0(arg0).args(args).env_clear().envs(kept);
    Err(format!("cannot keep secrets away from tool processes: {}", exec_carrying(command, taken)))
}

/// Replaces this process with `command`, the `secrets` carried across in a
/// fresh in-memory file whose descriptor [`SECRETS_FD_ENV`] names (read
/// back by [`isolate`] in the new image): never in its arguments or
/// environment. A service's restart runs it (same pid), long after the
/// first image's file was read and closed. Returns only on failure, why.
pub fn exec_carrying(mut command: std::process::Command, secrets: &BTreeMap<String, String>) -> String {
    if secrets.is_empty() {
        // Nothing to carry; a variable left from an earlier image of this
        // process names a descriptor closed since.
        let error = command.env_remove(SECRETS_FD_ENV).exec();
        return format!("re-executing {}: {error}", Path::new(command.get_program()).display());
    }
    let encoded = match serde_json::to_vec(secrets) {
        Ok(encoded) if encoded.len() as u64 <= MAX_BYTES => encoded,
        Ok(_) => return format!("the secret variables hold more than {MAX_BYTES} bytes"),
        Err(error) => return error.to_string(),
    };
    // Not close-on-exec: the next image inherits it.
    let memfd = match nix::sys::memfd::memfd_create("goondan-secrets", nix::sys::memfd::MFdFlags::empty()) {
        Ok(memfd) => memfd,
        Err(error) => return format!("memfd_create: {error}"),
    };
    let mut file = std::fs::File::from(memfd);
    if let Err(error) = file.write_all(&encoded) {
        return format!("writing the in-memory file: {error}");
    }
    command.env(SECRETS_FD_ENV, format!("{}:{}", std::process::id(), file.as_raw_fd()));
    // On success the file stays open in the new image; on failure it closes here.
    let error = command.exec();
    format!("re-executing {}: {error}", Path::new(command.get_program()).display())
}

/// The names the bundle reads with `valueFrom: {env: NAME}`, anywhere in
/// any of its files or its dependencies' (a bundle that does not load
/// names none: no command runs it).
fn bundle_secret_names(bundle: &Path, packages_dir: Option<&Path>) -> BTreeSet<String> {
    match goondan_config::load_bundle_with(bundle, packages_dir).bundle {
        Some(bundle) => env_refs(&bundle, |_| true),
        None => BTreeSet::new(),
    }
}

/// The names the bundle's resources other than Connections read with
/// `valueFrom: {env: NAME}`: what agents need (Model keys, MCP servers'
/// `env` and `headers`, tool and extension config), in its own files and
/// its dependencies'.
pub fn names_read_outside_connections(bundle: &Bundle) -> BTreeSet<String> {
    env_refs(bundle, |document| document.get("kind").and_then(JsonValue::as_str) != Some("Connection"))
}

/// Every document as written (those that did not validate too), of the
/// bundle and of its dependencies (all of them: see
/// `goondan_config::packages`).
fn env_refs(bundle: &Bundle, wanted: impl Fn(&JsonValue) -> bool) -> BTreeSet<String> {
    let documents = bundle.documents().iter().chain(bundle.dependencies().iter().flat_map(|d| d.documents()));
    documents.filter(|document| wanted(document)).flat_map(ValueSource::env_variables_within).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_look_like_secrets() {
        for name in [
            "OPENAI_API_KEY",
            "anthropic_api_key",
            "TELEGRAM_BOT_TOKEN",
            "BRAIN_SLACK_BOT_TOKEN",
            "GITHUB_TOKEN",
            "AWS_SECRET_ACCESS_KEY",
            "DB_PASSWORD",
            "CLIENT_SECRET",
            "SSH_PRIVATE_KEY",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "GOONDAN_REGISTRY_TOKENS",
        ] {
            assert!(is_secret_name(name), "{name}");
        }
        for name in ["PATH", "HOME", "TOKENIZERS_PARALLELISM", "GOONDAN_HTTP_ALLOW", "KEYBOARD", "LANG"] {
            assert!(!is_secret_name(name), "{name}");
        }
    }

    #[test]
    fn value_from_env_names_are_found_anywhere_in_the_bundle() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(
            dir.path().join(goondan_config::bundle::BUNDLE_FILE),
            "kind: Model\nspec:\n  apiKey:\n    valueFrom:\n      env: MY_MODEL_CRED\n---\nkind: Connection\nspec:\n  secrets:\n    X:\n      valueFrom: {env: BOT_THING}\n---\nkind: Tool\nspec:\n  list:\n    - valueFrom: {env: THIRD}\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let all = bundle_secret_names(dir.path(), None);
        assert_eq!(all.into_iter().collect::<Vec<_>>(), ["BOT_THING", "MY_MODEL_CRED", "THIRD"]);
        let bundle = goondan_config::load_bundle(dir.path()).bundle.unwrap_or_else(|| panic!("no bundle"));
        let outside = names_read_outside_connections(&bundle);
        assert_eq!(outside.into_iter().collect::<Vec<_>>(), ["MY_MODEL_CRED", "THIRD"]);
    }

    #[test]
    fn a_descriptor_variable_of_another_process_is_ignored() {
        let own = format!("{}:7", std::process::id());
        assert_eq!(own_descriptor(std::ffi::OsStr::new(&own)), Some(7));
        assert_eq!(own_descriptor(std::ffi::OsStr::new("1:7")), None);
        assert_eq!(own_descriptor(std::ffi::OsStr::new(&format!("{}:1", std::process::id()))), None);
        assert_eq!(own_descriptor(std::ffi::OsStr::new("garbage")), None);
    }
}
