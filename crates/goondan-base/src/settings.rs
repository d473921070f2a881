//! Operator settings of the built-in tools.
//!
//! Everything a tool may read from the operator's environment is gathered
//! here once, at start-up, and handed to the handlers: tokens, API base URLs,
//! the SSRF allow-list, extra file-system roots, output caps. Tests build a
//! [`BaseSettings`] directly instead of changing the process environment.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::tool_processes::ToolProcesses;

/// Environment variables the built-in tools read.
pub const ENV_VARS: &[&str] = &[
    "TELEGRAM_BOT_TOKEN",
    "BOT_TOKEN",
    "TELEGRAM_TOKEN",
    // The original's last fallbacks, read after the others.
    "BRAIN_TELEGRAM_BOT_TOKEN",
    "TELEGRAM_API_BASE_URL",
    "SLACK_BOT_TOKEN",
    "SLACK_TOKEN",
    "BRAIN_SLACK_BOT_TOKEN",
    "SLACK_API_BASE_URL",
];

/// `GOONDAN_HTTP_ALLOW`: comma-separated host names, IP addresses or CIDR
/// ranges that `http-fetch` may reach although they are not public.
pub const HTTP_ALLOW_VAR: &str = "GOONDAN_HTTP_ALLOW";
/// `GOONDAN_FS_ALLOW_ROOTS`: extra directories (separated like `PATH`) that
/// `file-system` may read and write besides the instance's workdir.
pub const FS_ALLOW_ROOTS_VAR: &str = "GOONDAN_FS_ALLOW_ROOTS";
/// `GOONDAN_BASH_MAX_OUTPUT_BYTES`: the cap on each of `bash`'s output streams.
pub const BASH_MAX_OUTPUT_VAR: &str = "GOONDAN_BASH_MAX_OUTPUT_BYTES";

/// The default cap on each of `bash`'s output streams: 1 MiB.
pub const DEFAULT_BASH_MAX_OUTPUT_BYTES: usize = 1024 * 1024;

/// Operator settings of the built-in tools.
///
/// Its `Debug` form names the environment values that are set but never
/// shows them: they are tokens.
#[derive(Clone)]
pub struct BaseSettings {
    /// Values of [`ENV_VARS`] that are set (tokens, base URLs).
    pub env: BTreeMap<String, String>,
    /// Entries of `GOONDAN_HTTP_ALLOW`, as written.
    pub http_allow: Vec<String>,
    /// Directories of `GOONDAN_FS_ALLOW_ROOTS`.
    pub extra_fs_roots: Vec<PathBuf>,
    /// The cap on each of `bash`'s output streams, in bytes.
    pub bash_max_output_bytes: usize,
    /// The processes tool calls started (shared with whoever ends them when
    /// the agent's process ends).
    pub tool_processes: Arc<ToolProcesses>,
    /// What `file-system` refuses inside the roots: not from the
    /// environment, but built at install time from the agent's bundle and
    /// its `file-system` config ([`crate::register_native_tools`]). The
    /// default refuses `.env*` files and protects no bundle file.
    pub fs_guard: crate::protect::FsGuard,
    /// The agent's sandbox, which `bash` runs its commands in (attached at
    /// install time from [`goondan_tools::assembly::AgentTools::sandbox`];
    /// `None` runs them unconfined).
    pub sandbox: Option<Arc<goondan_sandbox::Sandbox>>,
}

impl Default for BaseSettings {
    fn default() -> Self {
        Self {
            env: BTreeMap::new(),
            http_allow: Vec::new(),
            extra_fs_roots: Vec::new(),
            bash_max_output_bytes: DEFAULT_BASH_MAX_OUTPUT_BYTES,
            tool_processes: Arc::default(),
            fs_guard: crate::protect::FsGuard::default(),
            sandbox: None,
        }
    }
}

impl std::fmt::Debug for BaseSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let env: BTreeMap<&str, &str> = self.env.keys().map(|name| (name.as_str(), "<redacted>")).collect();
        f.debug_struct("BaseSettings")
            .field("env", &env)
            .field("http_allow", &self.http_allow)
            .field("extra_fs_roots", &self.extra_fs_roots)
            .field("bash_max_output_bytes", &self.bash_max_output_bytes)
            .field("fs_guard", &self.fs_guard)
            .finish()
    }
}

impl BaseSettings {
    /// Reads the settings from the process environment.
    pub fn from_env() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the settings through `lookup` (the environment, or a map in tests).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let env = ENV_VARS
            .iter()
            .filter_map(|name| lookup(name).filter(|v| !v.trim().is_empty()).map(|v| ((*name).to_owned(), v)))
            .collect();
        let http_allow = lookup(HTTP_ALLOW_VAR)
            .map(|v| v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect())
            .unwrap_or_default();
        let extra_fs_roots = lookup(FS_ALLOW_ROOTS_VAR)
            .map(|v| std::env::split_paths(&v).filter(|p| !p.as_os_str().is_empty()).collect())
            .unwrap_or_default();
        let bash_max_output_bytes = lookup(BASH_MAX_OUTPUT_VAR)
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|n| *n > 0)
            .unwrap_or(DEFAULT_BASH_MAX_OUTPUT_BYTES);
        Self {
            env,
            http_allow,
            extra_fs_roots,
            bash_max_output_bytes,
            tool_processes: Arc::default(),
            fs_guard: crate::protect::FsGuard::default(),
            sandbox: None,
        }
    }

    /// The first of `names` that is set, with its name.
    pub fn first_env<'a>(&'a self, names: &[&'a str]) -> Option<(&'a str, &'a str)> {
        names.iter().find_map(|name| self.env.get(*name).map(|value| (*name, value.as_str())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_setting_through_a_lookup() {
        let settings = BaseSettings::from_lookup(|name| match name {
            "SLACK_BOT_TOKEN" => Some("xoxb-1".to_owned()),
            "BRAIN_SLACK_BOT_TOKEN" => Some("xoxb-brain".to_owned()),
            "BRAIN_TELEGRAM_BOT_TOKEN" => Some("1:brain".to_owned()),
            "TELEGRAM_TOKEN" => Some("  ".to_owned()),
            "GOONDAN_HTTP_ALLOW" => Some("127.0.0.1, 10.0.0.0/8,,internal.example".to_owned()),
            "GOONDAN_FS_ALLOW_ROOTS" => Some("/srv/data:/tmp/x".to_owned()),
            "GOONDAN_BASH_MAX_OUTPUT_BYTES" => Some("4096".to_owned()),
            _ => None,
        });
        assert_eq!(settings.first_env(&["SLACK_BOT_TOKEN", "SLACK_TOKEN"]), Some(("SLACK_BOT_TOKEN", "xoxb-1")));
        assert_eq!(settings.first_env(&["TELEGRAM_BOT_TOKEN", "TELEGRAM_TOKEN"]), None);
        // The original's fallbacks are read too.
        assert_eq!(settings.env.get("BRAIN_SLACK_BOT_TOKEN").map(String::as_str), Some("xoxb-brain"));
        assert_eq!(settings.env.get("BRAIN_TELEGRAM_BOT_TOKEN").map(String::as_str), Some("1:brain"));
        assert_eq!(settings.http_allow, ["127.0.0.1", "10.0.0.0/8", "internal.example"]);
        assert_eq!(settings.extra_fs_roots, [PathBuf::from("/srv/data"), PathBuf::from("/tmp/x")]);
        assert_eq!(settings.bash_max_output_bytes, 4096);
        assert_eq!(BaseSettings::from_lookup(|_| None).bash_max_output_bytes, DEFAULT_BASH_MAX_OUTPUT_BYTES);
    }

    #[test]
    fn debug_output_never_shows_tokens() {
        let settings = BaseSettings::from_lookup(|name| (name == "SLACK_BOT_TOKEN").then(|| "xoxb-secret".to_owned()));
        let shown = format!("{settings:?}");
        assert!(shown.contains("SLACK_BOT_TOKEN"), "{shown}");
        assert!(!shown.contains("xoxb-secret"), "{shown}");
    }
}
