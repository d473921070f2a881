//! Finding a JavaScript runtime that can run TypeScript Tool modules.
//!
//! The order is the issue's: `GOONDAN_JS_RUNTIME` (a path, or a name looked
//! up on `PATH`) when set, else `bun` on `PATH`, else `node` on `PATH` when
//! it is at least 22.6 — the first Node that strips TypeScript types. An
//! explicitly named runtime that is unusable is an error, not a reason to
//! fall back: the operator chose it, and silently running another binary
//! would hide the mistake.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The environment variable that names the runtime binary.
pub const RUNTIME_ENV: &str = "GOONDAN_JS_RUNTIME";

/// Which runtime a binary is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeKind {
    /// Bun: runs TypeScript natively.
    Bun,
    /// Node ≥ 22.6: runs TypeScript by stripping types.
    Node,
}

impl RuntimeKind {
    /// `bun` or `node`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bun => "bun",
            Self::Node => "node",
        }
    }
}

impl fmt::Display for RuntimeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A usable runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsRuntime {
    /// Bun or Node.
    pub kind: RuntimeKind,
    /// The binary.
    pub path: PathBuf,
    /// Its version, without a leading `v` (e.g. `1.1.30`, `22.6.0`).
    pub version: String,
    /// Flags passed before the script (Node's type stripping and quiet warnings).
    pub args: Vec<String>,
}

impl fmt::Display for JsRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} ({})", self.kind, self.version, self.path.display())
    }
}

/// No usable runtime; the message lists what was tried.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no usable JavaScript runtime: {}", tried.join("; "))]
pub struct DiscoverError {
    /// One line per candidate: what it was and why it was not used.
    pub tried: Vec<String>,
}

/// The lowest Node version that runs TypeScript (with `--experimental-strip-types`).
const NODE_MIN: (u32, u32) = (22, 6);
/// From this Node version on, type stripping is on by default.
const NODE_STRIP_DEFAULT: (u32, u32) = (23, 6);

impl JsRuntime {
    /// Finds a runtime. `env` reads an environment variable (`PATH` and
    /// [`RUNTIME_ENV`]); tests pass their own. Runs `<binary> --version`,
    /// so call it off the async threads.
    pub fn discover(env: &dyn Fn(&str) -> Option<String>) -> Result<Self, DiscoverError> {
        let path_var = env("PATH").map(OsString::from);
        let mut tried = Vec::new();
        if let Some(named) = env(RUNTIME_ENV).filter(|value| !value.trim().is_empty()) {
            let Some(binary) = locate(&named, path_var.as_deref()) else {
                tried.push(format!("{RUNTIME_ENV}={named}: not found (not a file, and not a program on PATH)"));
                return Err(DiscoverError { tried });
            };
            return probe(&binary, None).map_err(|why| {
                tried.push(format!("{RUNTIME_ENV}={named} ({}): {why}", binary.display()));
                DiscoverError { tried }
            });
        }
        match locate("bun", path_var.as_deref()) {
            Some(binary) => match probe(&binary, Some(RuntimeKind::Bun)) {
                Ok(runtime) => return Ok(runtime),
                Err(why) => tried.push(format!("bun ({}): {why}", binary.display())),
            },
            None => tried.push("bun: not on PATH".to_owned()),
        }
        match locate("node", path_var.as_deref()) {
            Some(binary) => match probe(&binary, Some(RuntimeKind::Node)) {
                Ok(runtime) => return Ok(runtime),
                Err(why) => tried.push(format!("node ({}): {why}", binary.display())),
            },
            None => tried.push("node: not on PATH".to_owned()),
        }
        Err(DiscoverError { tried })
    }
}

/// A path (anything with a separator) as is, else the first executable
/// file of that name in `PATH`.
fn locate(name: &str, path_var: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    if name.contains(std::path::MAIN_SEPARATOR) || name.contains('/') {
        let path = PathBuf::from(name);
        return is_executable(&path).then_some(path);
    }
    std::env::split_paths(path_var?).map(|dir| dir.join(name)).find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    }
    #[cfg(not(unix))]
    {
        path.is_file()
    }
}

/// Runs `--version` and decides whether the binary is usable. `expected`
/// is the kind its name promised; a binary named by [`RUNTIME_ENV`] is
/// recognised by its output (Node prints `v22.6.0`, Bun `1.1.30`).
fn probe(binary: &Path, expected: Option<RuntimeKind>) -> Result<JsRuntime, String> {
    let output = Command::new(binary)
        .arg("--version")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run it: {e}"))?;
    if !output.status.success() {
        return Err(format!("`--version` failed ({})", output.status));
    }
    let printed = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let kind = expected.unwrap_or_else(|| {
        let file = binary.file_name().map(|n| n.to_string_lossy().to_lowercase()).unwrap_or_default();
        if file.contains("node") || (printed.starts_with('v') && !file.contains("bun")) {
            RuntimeKind::Node
        } else {
            RuntimeKind::Bun
        }
    });
    let version = printed.trim_start_matches('v').to_owned();
    let args = match kind {
        RuntimeKind::Bun => Vec::new(),
        RuntimeKind::Node => {
            let Some((major, minor)) = major_minor(&version) else {
                return Err(format!("cannot read the Node version from `{printed}`"));
            };
            if (major, minor) < NODE_MIN {
                return Err(format!(
                    "Node {version} is too old; TypeScript tools need Node {}.{} or later (or Bun)",
                    NODE_MIN.0, NODE_MIN.1
                ));
            }
            let mut args = Vec::new();
            if (major, minor) < NODE_STRIP_DEFAULT {
                args.push("--experimental-strip-types".to_owned());
            }
            // The type-stripping warning would otherwise go to the log on every start.
            args.push("--no-warnings".to_owned());
            args
        }
    };
    Ok(JsRuntime { kind, path: binary.to_path_buf(), version, args })
}

fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse() {
        assert_eq!(major_minor("22.6.0"), Some((22, 6)));
        assert_eq!(major_minor("1.1"), Some((1, 1)));
        assert_eq!(major_minor("x"), None);
    }

    #[test]
    fn nothing_found_says_what_was_tried() {
        let env = |name: &str| (name == "PATH").then(|| "/nonexistent-goondan-dir".to_owned());
        let error = JsRuntime::discover(&env).err().unwrap_or_else(|| panic!("found a runtime in an empty PATH"));
        assert_eq!(error.tried, ["bun: not on PATH", "node: not on PATH"]);
        let named = |name: &str| (name == RUNTIME_ENV).then(|| "/nonexistent-goondan-dir/js".to_owned());
        let error = JsRuntime::discover(&named).err().unwrap_or_else(|| panic!("found a missing runtime"));
        assert!(error.to_string().contains("GOONDAN_JS_RUNTIME=/nonexistent-goondan-dir/js: not found"), "{error}");
    }
}
