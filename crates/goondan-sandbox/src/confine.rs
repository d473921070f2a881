//! The [`Sandbox`] of one agent, and the setup its commands run between
//! `fork` and `exec`.

use goondan_core::sync::LockUnpoisoned;
use std::ffi::{CStr, CString, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, Scope,
};
use nix::mount::MsFlags;
use nix::sched::CloneFlags;
use seccompiler::BpfProgram;

use crate::allow::AllowList;
use crate::filter::{self, Sockets};
use crate::layout::{self, Cover, Grant, Mode};
use crate::network::{HolderProgram, Namespaces, NetworkHolder};
use crate::policy::{Policy, SandboxSpec};
use crate::root::{NewRoot, View};
use crate::support::kernel_support;

/// The unprivileged user a command runs as inside its user namespace when
/// `gdn` runs as root (its files appear owned by it).
const ROOT_MAPPED_TO: u32 = 1000;

const DEV_NULL: &str = "/dev/null";

/// Why a command could not be confined.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The policy cannot be enforced on this machine; commands are refused.
    #[error(
        "the sandbox policy '{policy}' cannot be enforced on this machine: {reason}. Commands the model chooses are \
         refused rather than run unconfined; to run them with your full rights, set `spec.sandbox.policy: full` on \
         the agent (or its Swarm) in goondan.yaml"
    )]
    Unavailable {
        /// The policy asked for.
        policy: Policy,
        /// What is missing or failed.
        reason: String,
    },
    /// Building the seccomp filter failed.
    #[error("building the seccomp filter failed: {0}")]
    Filter(String),
    /// Duplicating the ruleset for a command failed.
    #[error("preparing the sandbox for a command failed: {0}")]
    Io(#[from] io::Error),
}

impl SandboxError {
    pub(crate) fn filter(message: String) -> Self {
        Self::Filter(message)
    }
}

/// One agent's confinement: built from its [`SandboxSpec`], set up (and
/// tried once) on first use, then applied to each command it is given.
#[derive(Debug)]
pub struct Sandbox {
    spec: SandboxSpec,
    /// The ways to try, in order.
    modes: &'static [Mode],
    ready: OnceLock<Result<Arc<Ready>, String>>,
    /// The sandbox's private directory (its `tmp` is the commands'
    /// temporary directory, its `root` where their root is mounted),
    /// removed with the sandbox.
    private: OnceLock<tempfile::TempDir>,
    /// The program started as the network holder (default: this executable
    /// with `__sandbox-net`).
    holder_program: Option<HolderProgram>,
    /// The network holder under a `network.allow` list, shared with the
    /// sandboxes [`widened`](Sandbox::widened) from this one, killed with
    /// the last of them.
    network: SharedHolder,
}

type SharedHolder = Arc<Mutex<Option<Arc<NetworkHolder>>>>;

/// What every confined command of the agent shares, made once.
#[derive(Debug)]
struct Ready {
    mode: Mode,
    ruleset: RulesetCreated,
    filters: Vec<BpfProgram>,
    user_namespace: Option<UserNamespace>,
    /// Under a `network.allow` list, the port of the proxy on `127.0.0.1`
    /// in the holder's network namespace.
    proxy_port: Option<u16>,
    /// Without a user namespace, whether `gdn` runs as root: the command
    /// must then lose root's capabilities at `exec` (with them it could
    /// read any process's `/proc/<pid>/environ`, Landlock or not).
    drop_root: bool,
    tmp: PathBuf,
    /// The resource bounds of each command (`spec.sandbox.limits`).
    limits: crate::limits::Limiter,
}

/// The id maps and read-only mounts of a command's own namespaces.
#[derive(Debug)]
struct UserNamespace {
    /// Under a `network.allow` list, the holder's namespaces, joined first.
    join: Option<Namespaces>,
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
    /// The command's own root (see [`crate::root`]).
    root: NewRoot,
    mounts: Vec<ReadOnlyMount>,
}

#[derive(Debug)]
struct ReadOnlyMount {
    path: CString,
    cover: Cover,
    /// Flags of the mount the bound path lies on that a user namespace may
    /// not clear.
    locked: MsFlags,
}

impl Sandbox {
    /// A sandbox for `spec`; nothing is set up until the first command.
    /// `.git` and the `.env*` entries of the workdir are added to its
    /// protected paths.
    pub fn new(mut spec: SandboxSpec) -> Self {
        spec.workdir = std::fs::canonicalize(&spec.workdir).unwrap_or(spec.workdir);
        spec.protected.extend(layout::default_protected(&spec.workdir));
        if let Some(bundle) = &mut spec.bundle {
            *bundle = canonical(bundle);
            spec.protected.push(bundle.clone());
            spec.protected.extend(layout::default_protected(bundle));
        }
        spec.protected = spec.protected.iter().map(|path| canonical(path)).collect();
        Self {
            spec,
            modes: &[Mode::Namespaces, Mode::LandlockOnly],
            ready: OnceLock::new(),
            private: OnceLock::new(),
            holder_program: None,
            network: SharedHolder::default(),
        }
    }

    /// Starts `program` with `args` as the network holder under a
    /// `network.allow` list, instead of this executable with
    /// [`NETWORK_HOLDER_ARG`](crate::NETWORK_HOLDER_ARG). The program must
    /// call [`run_network_holder`](crate::run_network_holder) when its
    /// environment has [`NETWORK_HOLDER_ENV`](crate::NETWORK_HOLDER_ENV).
    #[must_use]
    pub fn with_network_holder(
        mut self,
        program: impl Into<std::path::PathBuf>,
        args: impl IntoIterator<Item = impl Into<OsString>>,
    ) -> Self {
        self.holder_program =
            Some(HolderProgram { program: program.into(), args: args.into_iter().map(Into::into).collect() });
        self
    }

    /// Under a `network.allow` list, the proxy URL commands get in
    /// `HTTP_PROXY` and the other proxy variables (`http://127.0.0.1:<port>`,
    /// an address inside their network namespace); `None` otherwise or
    /// before the first command.
    pub fn proxy_url(&self) -> Option<String> {
        self.holder().map(|holder| proxy_url(holder.port))
    }

    /// The requests the network proxy refused (not in `network.allow`, or a
    /// listed name that resolved to non-public addresses) at or after
    /// `since`, oldest first; the latest 32 are kept. A command that failed
    /// after a refused request shows only `response 403` with curl: this
    /// names the host for the model.
    pub fn network_refusals_since(&self, since: std::time::SystemTime) -> Vec<crate::NetworkRefusal> {
        self.holder().map(|holder| holder.refusals_since(since)).unwrap_or_default()
    }

    /// What a failed command's `output` says this sandbox refused (see
    /// [`crate::refusal_in`]); with a root of its own, an absolute path
    /// the command does not see (reported missing) counts too.
    pub fn refusal_in(&self, output: &str) -> Option<crate::Refusal> {
        match self.ready.get() {
            Some(Ok(ready)) => match &ready.user_namespace {
                Some(namespace) => crate::refusal::refusal_in_view(output, |path| namespace.root.sees(path)),
                None => crate::refusal_in(output),
            },
            _ => crate::refusal_in(output),
        }
    }

    /// The process id of the network holder, once started.
    pub fn network_holder_pid(&self) -> Option<u32> {
        self.holder().map(|holder| holder.pid())
    }

    fn holder(&self) -> Option<Arc<NetworkHolder>> {
        self.network.lock_unpoisoned().clone()
    }

    /// The same sandbox without namespaces: Landlock and seccomp only, the
    /// layout used where user namespaces do not work (no new entries
    /// directly in the workdir).
    #[must_use]
    pub fn landlock_only(mut self) -> Self {
        self.modes = &[Mode::LandlockOnly];
        self
    }

    /// A sandbox with the same policy that may also read (and execute)
    /// `readable`: what a runtime the commands need lives in, e.g. the
    /// JavaScript host's binary and modules.
    pub fn widened(&self, readable: impl IntoIterator<Item = PathBuf>) -> Self {
        let mut spec = self.spec.clone();
        spec.readable.extend(readable);
        Self {
            spec,
            modes: self.modes,
            ready: OnceLock::new(),
            private: OnceLock::new(),
            holder_program: self.holder_program.clone(),
            // The same allow-list: the same holder.
            network: Arc::clone(&self.network),
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> Policy {
        self.spec.policy
    }

    /// What it was built from.
    pub fn spec(&self) -> &SandboxSpec {
        &self.spec
    }

    /// The private temporary directory of confined commands (`TMPDIR`);
    /// `None` under `full` or before the first command.
    pub fn temp_dir(&self) -> Option<&Path> {
        match self.ready.get() {
            Some(Ok(ready)) => Some(&ready.tmp),
            _ => None,
        }
    }

    /// Runs `spawn` — the spawn of a command [`Sandbox::confine`] set up —
    /// where the command's process bound costs least: on the sandbox's
    /// spawning thread, which sits in the command's cgroups already (cgroup
    /// v1, see `limits`), so that the child starts in them instead of
    /// moving in (a move waits 5 to 10 ms for the kernel after a pause).
    /// Returns `spawn` when there is no such thread; the caller runs it
    /// then, and the child joins its cgroups itself. The spawn runs on
    /// another thread: one that needs the async runtime enters it.
    pub fn spawn_placed(&self, spawn: crate::limits::SpawnJob) -> Result<(), crate::limits::SpawnJob> {
        match self.ready.get() {
            Some(Ok(ready)) => ready.limits.run_placed(spawn),
            _ => Err(spawn),
        }
    }

    /// Whether the protected files are kept read-only by mounts (`true`) or,
    /// without user namespaces, by granting write entry by entry; `None`
    /// until set up.
    pub fn uses_namespaces(&self) -> Option<bool> {
        match self.ready.get() {
            Some(Ok(ready)) => Some(ready.mode == Mode::Namespaces),
            _ => None,
        }
    }

    /// Sets the sandbox up and tries it now, on a short-lived thread of its
    /// own, so that the first command does not pay for it (it waits only
    /// if the set-up is still running then); nothing under `full` or once
    /// set up. An agent that will run turns calls this at assembly: its
    /// first command comes after a model request, which hides the set-up.
    pub fn warm_up(self: &Arc<Self>) {
        if !self.spec.policy.confines() || self.ready.get().is_some() {
            return;
        }
        let sandbox = Arc::clone(self);
        let started = std::thread::Builder::new().name("goondan-sandbox-warm-up".to_owned()).spawn(move || {
            let _ = sandbox.ready.get_or_init(|| sandbox.set_up().map(Arc::new));
        });
        if let Err(error) = started {
            // The first command sets it up instead.
            tracing::debug!("sandbox {}: no thread to set it up early: {error}", self.spec.policy);
        }
    }

    /// Sets `command` up to run confined (nothing under `full`), in its
    /// workdir unless it has a directory of its own (which must lie in what
    /// the command sees: the workdir, its `TMPDIR`, the extra paths or the
    /// system's trees). The first call sets the sandbox up and tries it on
    /// `true`; when the policy cannot be enforced, every call fails with
    /// [`SandboxError::Unavailable`].
    pub fn confine(&self, command: &mut Command) -> Result<(), SandboxError> {
        self.confine_with(command, Bounds::Command)
    }

    /// As [`Sandbox::confine`], for a command the caller spawns through
    /// [`Sandbox::spawn_placed`]: it gets the cgroups the sandbox's
    /// spawning thread sits in, and starts in them.
    pub fn confine_placed(&self, command: &mut Command) -> Result<(), SandboxError> {
        self.confine_with(command, Bounds::Placed)
    }

    fn confine_with(&self, command: &mut Command, bounds: Bounds) -> Result<(), SandboxError> {
        if !self.spec.policy.confines() {
            return Ok(());
        }
        let ready = match self.ready.get_or_init(|| self.set_up().map(Arc::new)) {
            Ok(ready) => Arc::clone(ready),
            Err(reason) => return Err(SandboxError::Unavailable { policy: self.spec.policy, reason: reason.clone() }),
        };
        if let Some(port) = ready.proxy_port {
            let holder = self.holder();
            if let Some(holder) = &holder {
                // Keeps the holder's report pipe from filling up.
                holder.read_reports();
            }
            if !holder.is_some_and(|holder| holder.is_running()) {
                return Err(SandboxError::Unavailable {
                    policy: self.spec.policy,
                    reason: "the network proxy of spec.sandbox.network.allow has ended".to_owned(),
                });
            }
            let url = proxy_url(port);
            for name in PROXY_VARIABLES {
                command.env(name, &url);
            }
            for name in NO_PROXY_VARIABLES {
                command.env(name, "");
            }
            // Node (22.21+, 24+) reads the variables only when told to.
            command.env("NODE_USE_ENV_PROXY", "1");
        }
        command.env("TMPDIR", &ready.tmp);
        // Where the caller said nothing, the command starts in its workdir:
        // the caller's own directory may not exist in the command's root.
        if command.get_current_dir().is_none() {
            command.current_dir(&self.spec.workdir);
        }
        attach(command, ready, bounds)
    }

    fn set_up(&self) -> Result<Ready, String> {
        self.set_up_on(kernel_support())
    }

    fn set_up_on(&self, support: crate::support::KernelSupport) -> Result<Ready, String> {
        if let Some(missing) = support.missing() {
            return Err(missing);
        }
        let allow = AllowList::parse(&self.spec.network_allow)
            .map_err(|error| format!("a spec.sandbox.network.allow entry is not host:port: {error}"))?;
        let private =
            private_dir().map_err(|error| format!("cannot create its private temporary directory: {error}"))?;
        let (holder, network) = if allow.is_empty() {
            (None, None)
        } else {
            let holder = self.network_holder(&allow)?;
            let namespaces = holder.namespaces().map_err(|error| error.to_string())?;
            let network = NetworkNamespaces { namespaces, port: holder.port };
            (Some(holder), Some(network))
        };
        let mut failures = Vec::new();
        for &mode in self.modes {
            let network = match (&network, mode) {
                (Some(network), Mode::Namespaces) => Some(network.try_clone().map_err(|e| e.to_string())?),
                (Some(_), Mode::LandlockOnly) => continue,
                (None, _) => None,
            };
            match self.prepare(mode, private.path(), network).and_then(|ready| probe(ready).map_err(|e| e.to_string()))
            {
                Ok(ready) => {
                    let _ = self.private.set(private);
                    tracing::debug!(
                        "sandbox {}: set up ({})",
                        self.spec.policy,
                        if mode == Mode::Namespaces { "namespaces" } else { "Landlock only" }
                    );
                    return Ok(ready);
                }
                Err(error) => {
                    tracing::debug!("sandbox {}: {mode:?} does not work here: {error}", self.spec.policy);
                    failures.push(format!("{mode:?}: {error}"));
                }
            }
        }
        let failed = format!("confining a test command failed ({})", failures.join("; "));
        // A holder nothing can use is not kept.
        if let Some(holder) = holder {
            let mut slot = self.network.lock_unpoisoned();
            if slot.as_ref().is_some_and(|kept| Arc::ptr_eq(kept, &holder)) {
                *slot = None;
            }
        }
        match network {
            Some(_) => Err(format!("spec.sandbox.network.allow needs user namespaces: {failed}")),
            None => Err(failed),
        }
    }

    /// The running network holder of this sandbox (or of the one it was
    /// widened from), started now if there is none.
    fn network_holder(&self, allow: &AllowList) -> Result<Arc<NetworkHolder>, String> {
        let mut slot = self.network.lock_unpoisoned();
        if let Some(holder) = slot.as_ref().filter(|holder| holder.is_running()) {
            return Ok(Arc::clone(holder));
        }
        let holder = Arc::new(self.start_network(allow)?);
        *slot = Some(Arc::clone(&holder));
        Ok(holder)
    }

    /// Starts a network holder: `network.allow` needs a network namespace,
    /// which needs user namespaces.
    fn start_network(&self, allow: &AllowList) -> Result<NetworkHolder, String> {
        let needs = || {
            format!(
                "spec.sandbox.network.allow ({}) needs a network namespace of the agent's own, made in a user \
                 namespace",
                self.spec.network_allow.join(", ")
            )
        };
        if !self.modes.contains(&Mode::Namespaces) {
            return Err(format!("{}, and this sandbox is set up without namespaces", needs()));
        }
        let program = match &self.holder_program {
            Some(program) => program.clone(),
            None => HolderProgram::current_exe()
                .map_err(|error| format!("{}: the running executable is unknown: {error}", needs()))?,
        };
        let holder = NetworkHolder::start(&program, allow).map_err(|error| format!("{}: {error}", needs()))?;
        tracing::debug!("sandbox {}: network holder listens on port {}", self.spec.policy, holder.port);
        Ok(holder)
    }

    fn prepare(&self, mode: Mode, private: &Path, network: Option<NetworkNamespaces>) -> Result<Ready, String> {
        let tmp = private.join(PRIVATE_TMP);
        let grants = layout::grants(&self.spec, &tmp, mode);
        let proxy_port = network.as_ref().map(|network| network.port);
        let open_network = self.spec.open_network && proxy_port.is_none();
        let ruleset = ruleset(&grants, proxy_port, open_network)
            .map_err(|error| format!("building the Landlock ruleset failed: {error}"))?;
        let sockets = match (mode, proxy_port) {
            _ if open_network => Sockets::Open { unix: mode == Mode::Namespaces },
            (Mode::Namespaces, Some(_)) => Sockets::Network,
            (Mode::Namespaces, None) => Sockets::Unix,
            // No root of its own to keep the machine's sockets out of sight.
            (Mode::LandlockOnly, _) => Sockets::None,
        };
        let filters = filter::filters(sockets).map_err(|error| error.to_string())?;
        let user_namespace = match mode {
            Mode::Namespaces => {
                let root = NewRoot::plan(&private.join(PRIVATE_ROOT), &tmp, &self.views())
                    .map_err(|error| format!("planning the commands' root failed: {error}"))?;
                Some(self.user_namespace(network.map(|network| network.namespaces), root))
            }
            Mode::LandlockOnly => None,
        };
        let drop_root = user_namespace.is_none() && nix::unistd::geteuid().is_root();
        let limits = crate::limits::Limiter::prepare(self.spec.limits, mode == Mode::Namespaces);
        Ok(Ready { mode, ruleset, filters, user_namespace, proxy_port, drop_root, tmp, limits })
    }

    /// The trees of the spec a command sees in its own root.
    fn views(&self) -> Vec<View> {
        let mut views = vec![View { path: self.spec.workdir.clone(), writable: layout::workdir_writable(&self.spec) }];
        views.extend(self.spec.readable.iter().map(|path| View { path: canonical(path), writable: false }));
        views.extend(self.spec.writable.iter().map(|path| View { path: canonical(path), writable: true }));
        views
    }

    /// The command's own user namespace: the user (or, for root,
    /// [`ROOT_MAPPED_TO`]) as itself. Below the network holder's user
    /// namespace, where the user is root, the map starts from 0.
    fn user_namespace(&self, join: Option<Namespaces>, root: NewRoot) -> UserNamespace {
        let (uid, gid) = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
        let inner = |id: u32| if id == 0 { ROOT_MAPPED_TO } else { id };
        let outer = |id: u32| if join.is_some() { 0 } else { id };
        let mounts = layout::protected_mounts(&self.spec)
            .into_iter()
            .filter_map(|(path, cover)| {
                let locked = match cover {
                    Cover::ReadOnly => locked_flags(&path),
                    Cover::HideFile => locked_flags(Path::new(DEV_NULL)),
                    Cover::HideDir => MsFlags::empty(),
                };
                CString::new(path.as_os_str().as_bytes()).ok().map(|path| ReadOnlyMount { path, cover, locked })
            })
            .collect();
        UserNamespace {
            uid_map: format!("{} {} 1\n", inner(uid), outer(uid)).into_bytes(),
            gid_map: format!("{} {} 1\n", inner(gid), outer(gid)).into_bytes(),
            root,
            mounts,
            join,
        }
    }
}

/// The proxy variables a command gets under a `network.allow` list (upper
/// and lower case: curl reads only `http_proxy` in lower case, other tools
/// only the upper-case names).
const PROXY_VARIABLES: [&str; 6] = ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"];
/// Emptied, so that no host bypasses the proxy (which could only fail).
const NO_PROXY_VARIABLES: [&str; 2] = ["NO_PROXY", "no_proxy"];

fn proxy_url(port: u16) -> String {
    format!("http://127.0.0.1:{port}")
}

/// The holder's namespaces and port, for one way of confining.
#[derive(Debug)]
struct NetworkNamespaces {
    namespaces: Namespaces,
    port: u16,
}

impl NetworkNamespaces {
    fn try_clone(&self) -> io::Result<Self> {
        Ok(Self { namespaces: self.namespaces.try_clone()?, port: self.port })
    }
}

/// The sandbox's directory: `tmp` (the commands' `TMPDIR`) and `root`
/// (where their own root is mounted), private to the user whatever the
/// umask.
fn private_dir() -> io::Result<tempfile::TempDir> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let private = tempfile::Builder::new()
        .prefix("goondan-sandbox-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()?;
    for name in [PRIVATE_TMP, PRIVATE_ROOT] {
        std::fs::DirBuilder::new().mode(0o700).create(private.path().join(name))?;
        // The mode asked for is masked by the umask; set it whole.
        std::fs::set_permissions(private.path().join(name), std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(private)
}

/// The commands' temporary directory, inside the sandbox's own.
const PRIVATE_TMP: &str = "tmp";
/// Where a command's own root is mounted, inside the sandbox's directory.
const PRIVATE_ROOT: &str = "root";

/// Spawns `true` confined, to find out once whether the setup works here.
fn probe(ready: Ready) -> io::Result<Ready> {
    let program = ["/usr/bin/true", "/bin/true"]
        .into_iter()
        .find(|path| Path::new(path).exists())
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no `true` program to try the sandbox on"))?;
    let ready = Arc::new(ready);
    let mut command = Command::new(program);
    // From `/`: the command's root holds the system, not where this runs.
    command.current_dir("/").stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
    attach(&mut command, Arc::clone(&ready), Bounds::None).map_err(io::Error::other)?;
    let status = command.spawn()?.wait()?;
    drop(command);
    let ready = Arc::into_inner(ready).ok_or_else(|| io::Error::other("the probe kept the sandbox"))?;
    if status.success() { Ok(ready) } else { Err(io::Error::other(format!("`true` ended with {status}"))) }
}

/// Which resource bounds a confined command gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bounds {
    /// None: the one-time probe.
    None,
    /// Its own cgroups, which it joins.
    Command,
    /// Those the spawning thread sits in (see `Sandbox::spawn_placed`).
    Placed,
}

fn attach(command: &mut Command, ready: Arc<Ready>, bounds: Bounds) -> Result<(), SandboxError> {
    let mut ruleset = Some(ready.ruleset.try_clone()?);
    let limits = match bounds {
        Bounds::None => ready.limits.unbounded(),
        Bounds::Command => ready.limits.for_command()?,
        Bounds::Placed => ready.limits.for_placed_command()?,
    };
    // SAFETY: the hook runs in the child between fork and exec, where only
    // async-signal-safe work is sound. `enter` makes system calls on data
    // prepared here in the parent (id maps, mount paths, the ruleset's file
    // descriptor, the compiled filters) and allocates nothing on success.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || ready.enter(&mut ruleset, &limits));
    }
    Ok(())
}

impl Ready {
    /// In the child: namespaces and mounts, then Landlock, then seccomp.
    fn enter(&self, ruleset: &mut Option<RulesetCreated>, limits: &crate::limits::CommandLimits) -> io::Result<()> {
        // The fork path of std keeps the forking thread's signal mask (the
        // posix_spawn path it takes for unconfined commands clears it):
        // clear it, or a command spawned from a thread that blocks SIGTERM
        // would never see its cancel.
        nix::sys::signal::sigprocmask(
            nix::sys::signal::SigmaskHow::SIG_SETMASK,
            Some(&nix::sys::signal::SigSet::empty()),
            None,
        )?;
        if let Some(namespace) = &self.user_namespace {
            // Where std put the command (`current_dir`): taken up again
            // once the mounts are made, so that it lies in them.
            let mut cwd = [0u8; libc::PATH_MAX as usize];
            // SAFETY: getcwd writes at most `cwd.len()` bytes into the buffer.
            #[allow(unsafe_code)]
            if unsafe { libc::getcwd(cwd.as_mut_ptr().cast(), cwd.len()) }.is_null() {
                return Err(last_error());
            }
            if let Some(join) = &namespace.join {
                join.join()?;
            }
            nix::sched::unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNS)?;
            write_proc(c"/proc/self/setgroups", b"deny")?;
            write_proc(c"/proc/self/uid_map", &namespace.uid_map)?;
            write_proc(c"/proc/self/gid_map", &namespace.gid_map)?;
            // In its own user namespace (so that `RLIMIT_NPROC` counts only
            // its processes), while `/sys` is still there to join cgroups.
            limits.apply_in_child()?;
            namespace.root.enter()?;
            for mount in &namespace.mounts {
                mount.cover_over()?;
            }
            let cwd = CStr::from_bytes_until_nul(&cwd).map_err(|_| io::Error::from_raw_os_error(libc::ENAMETOOLONG))?;
            nix::unistd::chdir(cwd)?;
        } else {
            limits.apply_in_child()?;
        }
        if self.drop_root {
            no_root_capabilities()?;
        }
        if let Some(ruleset) = ruleset.take() {
            ruleset.restrict_self().map_err(|_| last_error())?;
        }
        for program in &self.filters {
            seccompiler::apply_filter(program).map_err(|error| match error {
                seccompiler::Error::Seccomp(error) | seccompiler::Error::Prctl(error) => error,
                _ => io::Error::from_raw_os_error(libc::EINVAL),
            })?;
        }
        Ok(())
    }
}

impl ReadOnlyMount {
    /// In the child's own mount namespace: binds the path (or `/dev/null`)
    /// read-only over it, or an empty read-only tmpfs over a directory.
    fn cover_over(&self) -> io::Result<()> {
        let none: Option<&CStr> = None;
        let target = self.path.as_c_str();
        let source = match self.cover {
            Cover::HideDir => {
                let flags = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
                nix::mount::mount(Some(c"tmpfs"), target, Some(c"tmpfs"), flags, Some(c"size=4k,mode=0500"))?;
                return Ok(());
            }
            Cover::HideFile => c"/dev/null",
            Cover::ReadOnly => target,
        };
        nix::mount::mount(Some(source), target, none, MsFlags::MS_BIND | MsFlags::MS_REC, none)?;
        let read_only = MsFlags::MS_BIND
            | MsFlags::MS_REMOUNT
            | MsFlags::MS_RDONLY
            | MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | self.locked;
        nix::mount::mount(none, target, none, read_only, none)?;
        Ok(())
    }
}

/// Root keeps no capabilities across `exec` from now on (and cannot undo
/// that): `SECBIT_NOROOT`, locked.
fn no_root_capabilities() -> io::Result<()> {
    let bits = (libc::SECBIT_NOROOT | libc::SECBIT_NOROOT_LOCKED) as libc::c_ulong;
    // SAFETY: prctl with integer arguments only.
    #[allow(unsafe_code)]
    let result = unsafe {
        libc::prctl(libc::PR_SET_SECUREBITS, bits, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong)
    };
    if result == 0 { Ok(()) } else { Err(last_error()) }
}

/// The errno of the call that just failed, never an allocated error: only
/// the number crosses back to the parent.
fn last_error() -> io::Error {
    io::Error::from_raw_os_error(io::Error::last_os_error().raw_os_error().unwrap_or(libc::EPERM))
}

pub(crate) fn write_proc(path: &std::ffi::CStr, content: &[u8]) -> io::Result<()> {
    let fd = nix::fcntl::open(
        path,
        nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    let written = nix::unistd::write(&fd, content)?;
    if written == content.len() { Ok(()) } else { Err(io::Error::from_raw_os_error(libc::EIO)) }
}

/// The ruleset for `grants`: file rights as far as the kernel knows them,
/// no TCP (but a connection to the network proxy's port, when there is
/// one), and signals and abstract sockets scoped to the command's own
/// processes.
fn ruleset(
    grants: &[(PathBuf, Grant)],
    proxy_port: Option<u16>,
    open_network: bool,
) -> Result<RulesetCreated, landlock::RulesetError> {
    let abi = ABI::V6;
    let all = AccessFs::from_all(abi);
    let read = AccessFs::from_read(abi);
    let device = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev;
    let list = AccessFs::ReadDir.into();
    let mut handled = Ruleset::default().set_compatibility(CompatLevel::BestEffort).handle_access(all)?;
    if !open_network {
        handled = handled.handle_access(AccessNet::from_all(abi))?;
    }
    let mut created = handled.scope(Scope::from_all(abi))?.create()?;
    if let Some(port) = proxy_port {
        created = created.add_rule(NetPort::new(port, AccessNet::ConnectTcp))?;
    }
    for (path, grant) in grants {
        let Ok(fd) = PathFd::new(path) else { continue };
        let access = match grant {
            Grant::Read => read,
            Grant::Write => all,
            Grant::Device => device,
            Grant::List => list,
        };
        // A file (not a directory) takes only the file rights.
        let is_dir = std::fs::metadata(path).is_ok_and(|meta| meta.is_dir());
        let access = if is_dir { access } else { access & AccessFs::from_file(abi) };
        created = created.add_rule(PathBeneath::new(fd, access))?;
    }
    Ok(created)
}

/// The real path of `path`, or of its parent joined with its name when it
/// does not exist yet.
fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path)
        .ok()
        .or_else(|| Some(std::fs::canonicalize(path.parent()?).ok()?.join(path.file_name()?)))
        .unwrap_or_else(|| path.to_path_buf())
}

/// The flags of the mount `path` lies on that a remount inside a user
/// namespace must keep (the kernel refuses to clear them there).
pub(crate) fn locked_flags(path: &Path) -> MsFlags {
    use nix::sys::statvfs::FsFlags;
    let Ok(stat) = nix::sys::statvfs::statvfs(path) else { return MsFlags::empty() };
    let flags = stat.flags();
    let mut locked = MsFlags::empty();
    for (from, to) in [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if flags.contains(from) {
            locked |= to;
        }
    }
    locked
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::support::KernelSupport;

    #[test]
    fn without_landlock_commands_are_refused_with_what_is_missing_and_how_to_choose_full() {
        let sandbox = Sandbox::new(SandboxSpec { policy: Policy::WorkspaceWrite, ..SandboxSpec::default() });
        let none =
            KernelSupport { landlock: false, landlock_refer: false, landlock_tcp: false, landlock_scopes: false };
        let Err(reason) = sandbox.set_up_on(none) else { panic!("set up without Landlock") };
        let error = SandboxError::Unavailable { policy: sandbox.policy(), reason };
        let message = error.to_string();
        assert!(message.contains("'workspace-write' cannot be enforced"), "{message}");
        assert!(message.contains("Landlock is not available"), "{message}");
        assert!(message.contains("policy: full"), "{message}");
    }

    #[test]
    fn full_confines_nothing_and_needs_nothing() -> Result<(), SandboxError> {
        let sandbox = Sandbox::new(SandboxSpec { policy: Policy::Full, ..SandboxSpec::default() });
        let mut command = Command::new("true");
        sandbox.confine(&mut command)?;
        assert!(command.get_envs().next().is_none(), "full sets no TMPDIR");
        assert_eq!(sandbox.temp_dir(), None);
        Ok(())
    }
}
