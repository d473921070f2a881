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

/// Declares a table of error codes: a `pub const` for each, whose value is
/// its name unless `= "VALUE"` gives another, and `pub const ALL: &[&str]`
/// listing every one in order, so the list cannot miss a code. Other crates
/// with codes of their own (`goondan_ipc::codes`) declare them with it too.
///
/// ```
/// mod codes {
///     goondan_core::error_codes! {
///         /// The tool is not in the catalog.
///         E_TOOL_NOT_FOUND;
///         /// Named apart from its wire value.
///         HOP_LIMIT = "HOP_LIMIT_EXCEEDED";
///     }
/// }
/// assert_eq!(codes::E_TOOL_NOT_FOUND, "E_TOOL_NOT_FOUND");
/// assert_eq!(codes::ALL, ["E_TOOL_NOT_FOUND", "HOP_LIMIT_EXCEEDED"]);
/// ```
#[macro_export]
macro_rules! error_codes {
    (@value $name:ident) => {
        stringify!($name)
    };
    (@value $name:ident $value:literal) => {
        $value
    };
    ($($(#[$attr:meta])* $name:ident $(= $value:literal)?;)*) => {
        $($(#[$attr])* pub const $name: &str = $crate::error_codes!(@value $name $($value)?);)*

        /// Every code above, in the order of its declaration.
        pub const ALL: &[&str] = &[$($name),*];
    };
}

error_codes! {
    // --- The tool pipeline (goondan-tools: executor, validation, handler) -------

    /// The default: a handler failure without a specific code, or a panic in the call chain.
    E_TOOL;
    /// Arguments that are unreadable, fail the parameter schema, or make no sense to the tool.
    E_TOOL_INVALID_ARGS;
    /// A tool whose parameters schema does not compile.
    E_TOOL_SCHEMA_INVALID;
    /// A call to a tool that is not in the step's catalog.
    E_TOOL_NOT_IN_CATALOG;
    /// A call to a catalog tool that has no registered handler.
    E_TOOL_NOT_FOUND;
    /// A call that did not finish before its deadline and was cancelled.
    E_TOOL_TIMEOUT;

    // --- The runtime (goondan-runtime: the turn loop) ----------------------------

    /// A call the turn's cancellation (Ctrl-C) cut short.
    E_TOOL_CANCELLED;
    /// A call whose result a stopped process lost; answered when the next turn starts.
    E_TOOL_INTERRUPTED;

    // --- Built-ins: workdir confinement (file-system, bash, telegram, slack) -----

    /// A path that leaves the workdir and the operator's allowed roots.
    E_PATH_OUTSIDE_WORKDIR;
    /// A path that cannot be resolved (a symbolic-link loop, a file used as a directory).
    E_PATH_UNRESOLVABLE;
    /// A path inside the workdir that the tool may not touch by default: a file
    /// the runtime loads as configuration or code (the bundle, its lock file,
    /// prompt files, Tool and Extension modules), or a `.env*` file; a Tool
    /// config can lift this.
    E_PATH_PROTECTED;
    /// A write or append through a file that has more than one hard link (another
    /// name, perhaps outside the workdir, would change too).
    E_HARD_LINKED_FILE;

    // --- Built-ins: the network guard (http-fetch, telegram, slack) ---------------

    /// A request refused because its target is not a public address.
    E_SSRF_BLOCKED;
    /// A URL (or redirect target) whose scheme is not http or https.
    E_PROTOCOL_NOT_ALLOWED;
    /// A redirect chain longer than the guard follows.
    E_TOO_MANY_REDIRECTS;

    // --- Built-in: bash --------------------------------------------------------

    /// A `script` path that is not an existing file.
    E_SCRIPT_NOT_FOUND;
    /// A `cwd` that does not exist.
    E_CWD_NOT_FOUND;
    /// A `cwd` that is not a directory.
    E_CWD_NOT_DIRECTORY;
    /// A shell that could not be started.
    E_SPAWN_FAILED;
    /// The agent's sandbox policy cannot be enforced on this machine: the
    /// command was refused, not run unconfined.
    E_SANDBOX_UNAVAILABLE;

    // --- Built-in: file-system -------------------------------------------------

    /// No file or directory at the path (ENOENT), or a missing parent.
    E_FILE_NOT_FOUND;
    /// A directory where a file was expected.
    E_IS_DIRECTORY;
    /// A file where a directory was expected.
    E_NOT_DIRECTORY;
    /// Something other than a regular file or directory (FIFO, socket, device).
    E_NOT_REGULAR_FILE;
    /// A file that is not UTF-8 text.
    E_BINARY_FILE;
    /// The operating system refused access.
    E_PERMISSION_DENIED;
    /// `mkdir` on a path that exists and is not a directory.
    E_ALREADY_EXISTS;
    /// Any other failure of the file system (disk full, read-only, I/O error).
    E_FS_ERROR;

    // --- Built-in: http-fetch --------------------------------------------------

    /// An unusable `url` (empty, unparsable, or without a host).
    E_INVALID_URL;
    /// A request that did not finish within `timeoutMs`.
    E_HTTP_TIMEOUT;
    /// A request that failed for another reason (connection, TLS, …).
    E_HTTP_REQUEST;

    // --- Built-ins: telegram and slack (shared bot API code) ---------------------

    /// No bot token in the call or the environment.
    E_TOKEN_MISSING;
    /// A bot token that cannot be put in a request.
    E_TOKEN_INVALID;
    /// The bot token would go somewhere the operator did not choose.
    E_TOKEN_DESTINATION_REFUSED;
    /// A download larger than `maxBytes`.
    E_FILE_TOO_LARGE;
    /// A download that could not be saved.
    E_FILE_WRITE;
    /// An operator setting (an API base URL) that cannot be used.
    E_TOOL_CONFIG;

    // --- Built-in: telegram ----------------------------------------------------

    /// A failure the Bot API reported (`{ok: false}`, non-2xx, an oversized reply).
    E_TELEGRAM_API;
    /// The Bot API could not be reached or did not answer (connection, timeout).
    E_TELEGRAM_REQUEST;

    // --- Built-in: slack -------------------------------------------------------

    /// A failure the Web API reported (`{ok: false}`, non-2xx, an oversized reply).
    E_SLACK_API;
    /// The Web API could not be reached or did not answer (connection, timeout).
    E_SLACK_REQUEST;

    // --- Script tools (goondan-script: the JavaScript host) ---------------------

    /// No usable JavaScript runtime (Bun, or Node >= 22.6) for a script tool.
    E_SCRIPT_RUNTIME_MISSING;
    /// The JavaScript host could not be started or did not report ready.
    E_SCRIPT_HOST_START;
    /// The JavaScript host exited, crashed, closed its socket or was killed while a call ran.
    E_SCRIPT_HOST_EXITED;
    /// A tool module that has no handler for a declared export.
    E_SCRIPT_EXPORT_MISSING;
    /// A tool module that failed to load (missing file, syntax error, a throw at import).
    E_SCRIPT_MODULE;
    /// The `agents` tool was called by an agent that runs without the swarm's
    /// orchestrator, so there is no other agent to reach.
    E_AGENTS_UNAVAILABLE;
    /// A request to another agent (the `agents` tool, `ctx.runtime` of a
    /// JavaScript tool, `ctx.agents` of a JavaScript layer) whose arguments break
    /// the agent-to-agent contract: no target, a bad timeout, metadata that is
    /// not an object, ….
    E_AGENTS_INVALID_REQUEST;

    // --- Tasks (pending results that complete later) ----------------------------

    /// A task handle the instance does not know (never created here, or forgotten after its expiry).
    E_TASK_NOT_FOUND;
    /// A task that has ended was asked to end again (cancelled, or completed twice).
    E_TASK_FINISHED;
    /// `tasks__wait`'s time ran out before the task ended (the task keeps working).
    E_TASK_WAIT_TIMEOUT;
    /// Tasks were used where no agent instance keeps them (`gdn tool call`, a tool host without a store).
    E_TASK_UNAVAILABLE;
    /// The task record could not be written durably; nothing was changed.
    E_TASK_STORAGE;
}

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
}
