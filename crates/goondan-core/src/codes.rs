//! The error codes of tool results (`ToolResult.error.code`), in one place.
//!
//! The executor, the runtime's turn loop and the built-in tools all report
//! failures with these codes, and later hosts (script modules, the MCP bridge)
//! share them, so a code means the same thing wherever a result comes from.
//! Each constant's name is its wire value. [`ALL`] lists every one.
//!
//! The `E_CONFIG_*` codes are not here: they are bundle diagnostics, not tool
//! results, and live with the loader in `goondan-config` (`diagnostic.rs`,
//! `validate.rs`, `bundle.rs`).

// --- The tool pipeline (goondan-tools: executor, validation, handler) -------

/// The default: a handler failure without a specific code, or a panic in the call chain.
pub const E_TOOL: &str = "E_TOOL";
/// Arguments that are unreadable, fail the parameter schema, or make no sense to the tool.
pub const E_TOOL_INVALID_ARGS: &str = "E_TOOL_INVALID_ARGS";
/// A tool whose parameters schema does not compile.
pub const E_TOOL_SCHEMA_INVALID: &str = "E_TOOL_SCHEMA_INVALID";
/// A call to a tool that is not in the step's catalog.
pub const E_TOOL_NOT_IN_CATALOG: &str = "E_TOOL_NOT_IN_CATALOG";
/// A call to a catalog tool that has no registered handler.
pub const E_TOOL_NOT_FOUND: &str = "E_TOOL_NOT_FOUND";
/// A call that did not finish before its deadline and was cancelled.
pub const E_TOOL_TIMEOUT: &str = "E_TOOL_TIMEOUT";

// --- The runtime (goondan-runtime: the turn loop) ----------------------------

/// A call the turn's cancellation (Ctrl-C) cut short.
pub const E_TOOL_CANCELLED: &str = "E_TOOL_CANCELLED";
/// A call whose result a stopped process lost; answered when the next turn starts.
pub const E_TOOL_INTERRUPTED: &str = "E_TOOL_INTERRUPTED";

// --- Built-ins: workdir confinement (file-system, bash, telegram, slack) -----

/// A path that leaves the workdir and the operator's allowed roots.
pub const E_PATH_OUTSIDE_WORKDIR: &str = "E_PATH_OUTSIDE_WORKDIR";
/// A path that cannot be resolved (a symbolic-link loop, a file used as a directory).
pub const E_PATH_UNRESOLVABLE: &str = "E_PATH_UNRESOLVABLE";
/// A path inside the workdir that the tool may not touch by default: a file
/// the runtime loads as configuration or code (the bundle, its lock file,
/// prompt files, Tool and Extension modules), or a `.env*` file; a Tool
/// config can lift this.
pub const E_PATH_PROTECTED: &str = "E_PATH_PROTECTED";
/// A write or append through a file that has more than one hard link (another
/// name, perhaps outside the workdir, would change too).
pub const E_HARD_LINKED_FILE: &str = "E_HARD_LINKED_FILE";

// --- Built-ins: the network guard (http-fetch, telegram, slack) ---------------

/// A request refused because its target is not a public address.
pub const E_SSRF_BLOCKED: &str = "E_SSRF_BLOCKED";
/// A URL (or redirect target) whose scheme is not http or https.
pub const E_PROTOCOL_NOT_ALLOWED: &str = "E_PROTOCOL_NOT_ALLOWED";
/// A redirect chain longer than the guard follows.
pub const E_TOO_MANY_REDIRECTS: &str = "E_TOO_MANY_REDIRECTS";

// --- Built-in: bash --------------------------------------------------------

/// A `script` path that is not an existing file.
pub const E_SCRIPT_NOT_FOUND: &str = "E_SCRIPT_NOT_FOUND";
/// A `cwd` that does not exist.
pub const E_CWD_NOT_FOUND: &str = "E_CWD_NOT_FOUND";
/// A `cwd` that is not a directory.
pub const E_CWD_NOT_DIRECTORY: &str = "E_CWD_NOT_DIRECTORY";
/// A shell that could not be started.
pub const E_SPAWN_FAILED: &str = "E_SPAWN_FAILED";
/// The agent's sandbox policy cannot be enforced on this machine: the
/// command was refused, not run unconfined.
pub const E_SANDBOX_UNAVAILABLE: &str = "E_SANDBOX_UNAVAILABLE";

// --- Built-in: file-system -------------------------------------------------

/// No file or directory at the path (ENOENT), or a missing parent.
pub const E_FILE_NOT_FOUND: &str = "E_FILE_NOT_FOUND";
/// A directory where a file was expected.
pub const E_IS_DIRECTORY: &str = "E_IS_DIRECTORY";
/// A file where a directory was expected.
pub const E_NOT_DIRECTORY: &str = "E_NOT_DIRECTORY";
/// Something other than a regular file or directory (FIFO, socket, device).
pub const E_NOT_REGULAR_FILE: &str = "E_NOT_REGULAR_FILE";
/// A file that is not UTF-8 text.
pub const E_BINARY_FILE: &str = "E_BINARY_FILE";
/// The operating system refused access.
pub const E_PERMISSION_DENIED: &str = "E_PERMISSION_DENIED";
/// `mkdir` on a path that exists and is not a directory.
pub const E_ALREADY_EXISTS: &str = "E_ALREADY_EXISTS";
/// Any other failure of the file system (disk full, read-only, I/O error).
pub const E_FS_ERROR: &str = "E_FS_ERROR";

// --- Built-in: http-fetch --------------------------------------------------

/// An unusable `url` (empty, unparsable, or without a host).
pub const E_INVALID_URL: &str = "E_INVALID_URL";
/// A request that did not finish within `timeoutMs`.
pub const E_HTTP_TIMEOUT: &str = "E_HTTP_TIMEOUT";
/// A request that failed for another reason (connection, TLS, …).
pub const E_HTTP_REQUEST: &str = "E_HTTP_REQUEST";

// --- Built-ins: telegram and slack (shared bot API code) ---------------------

/// No bot token in the call or the environment.
pub const E_TOKEN_MISSING: &str = "E_TOKEN_MISSING";
/// A bot token that cannot be put in a request.
pub const E_TOKEN_INVALID: &str = "E_TOKEN_INVALID";
/// The bot token would go somewhere the operator did not choose.
pub const E_TOKEN_DESTINATION_REFUSED: &str = "E_TOKEN_DESTINATION_REFUSED";
/// A download larger than `maxBytes`.
pub const E_FILE_TOO_LARGE: &str = "E_FILE_TOO_LARGE";
/// A download that could not be saved.
pub const E_FILE_WRITE: &str = "E_FILE_WRITE";
/// An operator setting (an API base URL) that cannot be used.
pub const E_TOOL_CONFIG: &str = "E_TOOL_CONFIG";

// --- Built-in: telegram ----------------------------------------------------

/// A failure the Bot API reported (`{ok: false}`, non-2xx, an oversized reply).
pub const E_TELEGRAM_API: &str = "E_TELEGRAM_API";
/// The Bot API could not be reached or did not answer (connection, timeout).
pub const E_TELEGRAM_REQUEST: &str = "E_TELEGRAM_REQUEST";

// --- Built-in: slack -------------------------------------------------------

/// A failure the Web API reported (`{ok: false}`, non-2xx, an oversized reply).
pub const E_SLACK_API: &str = "E_SLACK_API";
/// The Web API could not be reached or did not answer (connection, timeout).
pub const E_SLACK_REQUEST: &str = "E_SLACK_REQUEST";

// --- Script tools (goondan-script: the JavaScript host) ---------------------

/// No usable JavaScript runtime (Bun, or Node >= 22.6) for a script tool.
pub const E_SCRIPT_RUNTIME_MISSING: &str = "E_SCRIPT_RUNTIME_MISSING";
/// The JavaScript host could not be started or did not report ready.
pub const E_SCRIPT_HOST_START: &str = "E_SCRIPT_HOST_START";
/// The JavaScript host exited, crashed, closed its socket or was killed while a call ran.
pub const E_SCRIPT_HOST_EXITED: &str = "E_SCRIPT_HOST_EXITED";
/// A tool module that has no handler for a declared export.
pub const E_SCRIPT_EXPORT_MISSING: &str = "E_SCRIPT_EXPORT_MISSING";
/// A tool module that failed to load (missing file, syntax error, a throw at import).
pub const E_SCRIPT_MODULE: &str = "E_SCRIPT_MODULE";
/// The `agents` tool was called by an agent that runs without the swarm's
/// orchestrator, so there is no other agent to reach.
pub const E_AGENTS_UNAVAILABLE: &str = "E_AGENTS_UNAVAILABLE";
/// A request to another agent (the `agents` tool, `ctx.runtime` of a
/// JavaScript tool, `ctx.agents` of a JavaScript layer) whose arguments break
/// the agent-to-agent contract: no target, a bad timeout, metadata that is
/// not an object, ….
pub const E_AGENTS_INVALID_REQUEST: &str = "E_AGENTS_INVALID_REQUEST";

// --- Tasks (pending results that complete later) ----------------------------

/// A task handle the instance does not know (never created here, or forgotten after its expiry).
pub const E_TASK_NOT_FOUND: &str = "E_TASK_NOT_FOUND";
/// A task that has ended was asked to end again (cancelled, or completed twice).
pub const E_TASK_FINISHED: &str = "E_TASK_FINISHED";
/// `tasks__wait`'s time ran out before the task ended (the task keeps working).
pub const E_TASK_WAIT_TIMEOUT: &str = "E_TASK_WAIT_TIMEOUT";
/// Tasks were used where no agent instance keeps them (`gdn tool call`, a tool host without a store).
pub const E_TASK_UNAVAILABLE: &str = "E_TASK_UNAVAILABLE";
/// The task record could not be written durably; nothing was changed.
pub const E_TASK_STORAGE: &str = "E_TASK_STORAGE";

/// Every code above, in the order of this module.
pub const ALL: &[&str] = &[
    E_TOOL,
    E_TOOL_INVALID_ARGS,
    E_TOOL_SCHEMA_INVALID,
    E_TOOL_NOT_IN_CATALOG,
    E_TOOL_NOT_FOUND,
    E_TOOL_TIMEOUT,
    E_TOOL_CANCELLED,
    E_TOOL_INTERRUPTED,
    E_PATH_OUTSIDE_WORKDIR,
    E_PATH_UNRESOLVABLE,
    E_PATH_PROTECTED,
    E_HARD_LINKED_FILE,
    E_SSRF_BLOCKED,
    E_PROTOCOL_NOT_ALLOWED,
    E_TOO_MANY_REDIRECTS,
    E_SCRIPT_NOT_FOUND,
    E_CWD_NOT_FOUND,
    E_CWD_NOT_DIRECTORY,
    E_SPAWN_FAILED,
    E_SANDBOX_UNAVAILABLE,
    E_FILE_NOT_FOUND,
    E_IS_DIRECTORY,
    E_NOT_DIRECTORY,
    E_NOT_REGULAR_FILE,
    E_BINARY_FILE,
    E_PERMISSION_DENIED,
    E_ALREADY_EXISTS,
    E_FS_ERROR,
    E_INVALID_URL,
    E_HTTP_TIMEOUT,
    E_HTTP_REQUEST,
    E_TOKEN_MISSING,
    E_TOKEN_INVALID,
    E_TOKEN_DESTINATION_REFUSED,
    E_FILE_TOO_LARGE,
    E_FILE_WRITE,
    E_TOOL_CONFIG,
    E_TELEGRAM_API,
    E_TELEGRAM_REQUEST,
    E_SLACK_API,
    E_SLACK_REQUEST,
    E_SCRIPT_RUNTIME_MISSING,
    E_SCRIPT_HOST_START,
    E_SCRIPT_HOST_EXITED,
    E_SCRIPT_EXPORT_MISSING,
    E_SCRIPT_MODULE,
    E_AGENTS_UNAVAILABLE,
    E_AGENTS_INVALID_REQUEST,
    E_TASK_NOT_FOUND,
    E_TASK_FINISHED,
    E_TASK_WAIT_TIMEOUT,
    E_TASK_UNAVAILABLE,
    E_TASK_STORAGE,
];

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn every_code_is_an_e_code() {
        for code in ALL {
            assert!(code.starts_with("E_"), "{code}");
            assert!(code.len() > 2 && code.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'), "{code}");
            assert!(!code.starts_with("E_CONFIG_"), "{code} is a config diagnostic, not a tool error code");
        }
    }

    #[test]
    fn no_two_codes_share_a_value() {
        let mut seen = HashSet::new();
        for code in ALL {
            assert!(seen.insert(*code), "duplicate code {code}");
        }
    }

    /// `ALL` is complete: every `pub const` of this file (other than `ALL`
    /// itself) is listed in it.
    #[test]
    fn all_lists_every_constant() {
        let source = include_str!("codes.rs");
        let declared: Vec<&str> = source
            .lines()
            .filter_map(|line| line.strip_prefix("pub const "))
            .filter_map(|rest| rest.split(':').next())
            .filter(|name| *name != "ALL")
            .collect();
        assert_eq!(declared.len(), ALL.len(), "declared {declared:?}");
        for name in declared {
            assert!(ALL.contains(&name), "{name} is declared but missing from ALL");
        }
    }
}
