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
//! ## `network.allow`
//!
//! With a `network.allow` list (`host:port` entries: a host name, an IPv4
//! address or an IPv6 address in brackets), the sandbox starts one *network
//! holder* per agent on first use: the running executable again with
//! [`NETWORK_HOLDER_ARG`] (a binary that confines commands under an
//! allow-list calls [`run_network_holder`] first thing in `main` when it
//! sees it; [`Sandbox::with_network_holder`] names another program). It runs
//! in a user namespace of its own, owns a network namespace with nothing but
//! loopback, and listens there as an HTTP proxy (`CONNECT` and absolute-form
//! `http://` requests). Commands join its user and network namespaces before
//! making their own (step 2), so the proxy is the only thing they can reach:
//! Landlock lets them connect to its port only, seccomp lets them make inet
//! sockets. They get `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` and the same in
//! lower case set to `http://127.0.0.1:<port>`, `NO_PROXY`/`no_proxy`
//! emptied, and `NODE_USE_ENV_PROXY=1` (Node reads the others only then).
//!
//! The proxy lets a request through only when its host and port are on the
//! list as written ([`AllowList`]); it resolves the host itself and connects
//! to an address it checked, never resolving again, so neither a DNS answer
//! nor a parser difference can send it elsewhere. A listed host *name* may
//! reach public addresses only (the SSRF guard's rule, shared through
//! `goondan_core::address`): a name answering with loopback, a private
//! network or the metadata address is refused. A listed address, and
//! `localhost`, reach exactly themselves. Anything else is answered `403`
//! with one line naming the target and `spec.sandbox.network.allow` (in the
//! status line and the body). A program that ignores the proxy variables
//! cannot connect anywhere (its `connect` fails with `EACCES`).
//!
//! The holder has an empty environment (it holds no secret), confines itself
//! with Landlock (read the system's files; connect to the listed ports and
//! DNS only), ends when its input from the agent closes or the thread that
//! started it ends (`PR_SET_PDEATHSIG`), and is killed with its [`Sandbox`].
//! Without user namespaces an allow-list cannot be enforced, and every
//! command is refused ([`SandboxError::Unavailable`]).
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
mod limits;
mod network;
mod policy;
mod refusal;
mod root;
mod support;

pub use allow::{AllowList, Refused};
pub use confine::{Sandbox, SandboxError};
pub use holder::{NETWORK_HOLDER_ARG, NETWORK_HOLDER_ENV, run_network_holder};
pub use limits::{
    CommandLimits, DEFAULT_FILE_SIZE, DEFAULT_PROCESSES, Enforcement, Limiter, Limits, MAX_PROCESSES, MIN_MEMORY,
    SpawnJob, default_memory, format_size,
};
pub use network::NetworkRefusal;
pub use policy::{Policy, SandboxSpec};
pub use refusal::{Refusal, refusal_in};
pub use support::{KernelSupport, kernel_support};
