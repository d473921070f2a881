//! Confinement for the commands a model chooses (`bash`, background
//! commands, the JavaScript host and what it spawns, stdio MCP servers that
//! ask for it).
//!
//! A [`Sandbox`] is built once per agent from its [`SandboxSpec`] (policy,
//! workdir, extra paths, the files that stay read-only) and confines any
//! `std::process::Command` given to [`Sandbox::confine`]. Nothing external
//! runs: between `fork` and `exec` the child
//!
//! 1. starts its own session (no controlling terminal to push keystrokes
//!    into; its process group is its pid, as the tools kill it);
//! 2. when user namespaces work, enters a new user and mount namespace, maps
//!    itself to an unprivileged user (no capabilities survive `exec`, also
//!    when `gdn` runs as root) and bind-mounts the protected files inside
//!    the workdir (the bundle's files, `.git`, `.env*`) read-only;
//! 3. restricts itself with a Landlock ruleset built once in the parent
//!    (files: the system read-only, the workdir and a private temporary
//!    directory writable; TCP: nothing; signals and abstract sockets: only
//!    its own processes), which also forbids `ptrace` and
//!    `/proc/<pid>/{environ,mem}` of every process outside it;
//! 4. loads a seccomp filter (no `ptrace`, namespaces, mounts, `setsid`,
//!    keyrings, BPF, `io_uring`, `TIOCSTI`, and no socket but `AF_UNIX` while
//!    the network is off).
//!
//! The whole setup is tried once on first use (a probe spawns `true`); when
//! user namespaces do not work it falls back to a stricter Landlock-only
//! layout (no new entries directly in the workdir), and when Landlock does
//! not work every confined command is refused with [`SandboxError::Unavailable`]
//! naming what is missing — never run unconfined behind the user's back.

mod allow;
mod confine;
mod filter;
mod holder;
mod layout;
mod network;
mod policy;
mod refusal;
mod support;

pub use allow::{AllowList, EntryError, Host, Refused, Target};
pub use confine::{Sandbox, SandboxError};
pub use holder::{NETWORK_HOLDER_ARG, NETWORK_HOLDER_ENV, run_network_holder};
pub use policy::{Policy, SandboxSpec};
pub use refusal::{Refusal, refusal_in};
pub use support::{KernelSupport, kernel_support};
