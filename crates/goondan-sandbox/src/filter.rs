//! The seccomp filters every confined command gets.
//!
//! Two programs, because seccomp gives one action per filter: the main one
//! answers `EPERM` to what a command never needs and could use to get out
//! (another process's memory, new namespaces, mounts, a new session,
//! keyrings, BPF, `io_uring` — whose operations bypass this filter — and
//! any socket but `AF_UNIX`: with a `network.allow` list also `AF_INET`,
//! `AF_INET6` (which reach only the loopback of the holder's network
//! namespace) and `AF_NETLINK` (the C library's resolver asks it which
//! address families are configured); never `AF_PACKET`, `AF_VSOCK` (not
//! confined by network namespaces) or the kernel's other families; and no
//! `AF_UNIX` socket either where the command has no root of its own to keep
//! other sockets out of its sight (the Landlock-only layout), `socketpair`
//! staying allowed) and a mode with the setuid or setgid bit in every call
//! that sets a mode (`chmod`, `fchmod`, `fchmodat`, `fchmodat2`, `mknod*`,
//! and `open*`/`creat` creating a file): a file a command leaves behind is
//! never a way for another user to gain its owner's rights, which are
//! root's when `gdn` runs as root. The second answers `ENOSYS` to `clone3`
//! and `openat2`, whose flags and mode live in memory seccomp cannot read,
//! so the C library falls back to `clone` and `openat`, which the first
//! filter checks.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter, SeccompRule, TargetArch,
};

use crate::confine::SandboxError;

/// Namespace flags a confined `clone` may not use.
const NEW_NAMESPACES: [u64; 7] = [
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
];

/// Syscalls refused outright.
const REFUSED: &[i64] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_getfd,
    libc::SYS_kcmp,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_setsid,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_name_to_handle_at,
    libc::SYS_open_by_handle_at,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_syslog,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_sethostname,
    libc::SYS_setdomainname,
    libc::SYS_lookup_dcookie,
];

/// Which sockets a confined command may make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sockets {
    /// None at all (`socketpair` still works): the Landlock-only layout,
    /// where a named Unix socket anywhere on the machine could be reached.
    None,
    /// `AF_UNIX` only: the command sees no file system but its own root.
    Unix,
    /// Also inet and netlink, under a `network.allow` list (the holder's
    /// network namespace has nothing but loopback).
    Network,
    /// Inet and netlink without a network namespace (the machine's
    /// network: a Connector's host), and `AF_UNIX` when `unix`.
    Open {
        /// Whether `AF_UNIX` sockets may be made (not in the Landlock-only
        /// layout).
        unix: bool,
    },
}

/// The bits of a mode that give a file its owner's (or group's) rights.
const SET_ID_BITS: [u64; 2] = [libc::S_ISUID as u64, libc::S_ISGID as u64];

/// The filters for a command making `sockets`.
pub(crate) fn filters(sockets: Sockets) -> Result<Vec<BpfProgram>, SandboxError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|_| SandboxError::filter(format!("no seccomp support for {}", std::env::consts::ARCH)))?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = REFUSED.iter().map(|&call| (call, Vec::new())).collect();
    let flag_rules = NEW_NAMESPACES
        .iter()
        .map(|&flag| rule(vec![condition(0, SeccompCmpArgLen::Qword, SeccompCmpOp::MaskedEq(flag), flag)?]))
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_clone, flag_rules);
    // Pushing input into the terminal of the user's shell, and the console.
    let ioctls = [libc::TIOCSTI, libc::TIOCLINUX]
        .into_iter()
        .map(|request| rule(vec![condition(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, request)?]))
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_ioctl, ioctls);
    let families: &[i32] = match sockets {
        Sockets::None => &[],
        Sockets::Unix => &[libc::AF_UNIX],
        Sockets::Network | Sockets::Open { unix: true } => {
            &[libc::AF_UNIX, libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK]
        }
        Sockets::Open { unix: false } => &[libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK],
    };
    // No condition at all refuses every family.
    let socket_rules = if families.is_empty() {
        Vec::new()
    } else {
        let other_family = families
            .iter()
            .map(|&family| condition(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, family as u64))
            .collect::<Result<Vec<_>, _>>()?;
        vec![rule(other_family)?]
    };
    rules.insert(libc::SYS_socket, socket_rules);
    for (call, mode) in mode_arguments() {
        rules.insert(call, set_id_mode(mode)?);
    }
    for (call, flags, mode) in creating_calls() {
        rules.insert(call, set_id_creation(flags, mode)?);
    }
    let main = compile(rules, SeccompAction::Errno(libc::EPERM as u32), arch)?;
    let unreadable = BTreeMap::from([(libc::SYS_clone3, Vec::new()), (libc::SYS_openat2, Vec::new())]);
    let fallback = compile(unreadable, SeccompAction::Errno(libc::ENOSYS as u32), arch)?;
    Ok(vec![main, fallback])
}

/// `fchmodat2` (Linux 6.6), the same number on every architecture.
const SYS_FCHMODAT2: i64 = 452;

/// Calls that set a mode, and the argument that holds it.
fn mode_arguments() -> Vec<(i64, u8)> {
    let mut calls = vec![(libc::SYS_fchmod, 1), (libc::SYS_fchmodat, 2), (SYS_FCHMODAT2, 2), (libc::SYS_mknodat, 2)];
    #[cfg(target_arch = "x86_64")]
    calls.extend([(libc::SYS_chmod, 1), (libc::SYS_mknod, 1), (libc::SYS_creat, 1)]);
    calls
}

/// Calls that set a mode only when they create a file: the call, the
/// argument with its flags, the argument with the mode.
fn creating_calls() -> Vec<(i64, u8, u8)> {
    #[allow(unused_mut)]
    let mut calls = vec![(libc::SYS_openat, 2, 3)];
    #[cfg(target_arch = "x86_64")]
    calls.push((libc::SYS_open, 1, 2));
    calls
}

/// Refused when the mode in argument `mode` has a set-id bit.
fn set_id_mode(mode: u8) -> Result<Vec<SeccompRule>, SandboxError> {
    SET_ID_BITS
        .iter()
        .map(|&bit| rule(vec![condition(mode, SeccompCmpArgLen::Dword, SeccompCmpOp::MaskedEq(bit), bit)?]))
        .collect()
}

/// Refused when the call creates a file (`O_CREAT`, or `O_TMPFILE` then
/// linked) whose mode has a set-id bit.
fn set_id_creation(flags: u8, mode: u8) -> Result<Vec<SeccompRule>, SandboxError> {
    let tmpfile = (libc::O_TMPFILE & !libc::O_DIRECTORY) as u64;
    let mut rules = Vec::new();
    for creates in [libc::O_CREAT as u64, tmpfile] {
        for bit in SET_ID_BITS {
            rules.push(rule(vec![
                condition(flags, SeccompCmpArgLen::Dword, SeccompCmpOp::MaskedEq(creates), creates)?,
                condition(mode, SeccompCmpArgLen::Dword, SeccompCmpOp::MaskedEq(bit), bit)?,
            ])?);
        }
    }
    Ok(rules)
}

fn condition(arg: u8, len: SeccompCmpArgLen, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, SandboxError> {
    SeccompCondition::new(arg, len, op, value).map_err(|error| SandboxError::filter(error.to_string()))
}

fn rule(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, SandboxError> {
    SeccompRule::new(conditions).map_err(|error| SandboxError::filter(error.to_string()))
}

fn compile(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
    on_match: SeccompAction,
    arch: TargetArch,
) -> Result<BpfProgram, SandboxError> {
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, on_match, arch)
        .map_err(|error| SandboxError::filter(error.to_string()))?;
    filter.try_into().map_err(|error: seccompiler::BackendError| SandboxError::filter(error.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filters_compile_for_every_kind_of_sockets() -> Result<(), SandboxError> {
        let none = filters(Sockets::None)?;
        let closed = filters(Sockets::Unix)?;
        let open = filters(Sockets::Network)?;
        assert_eq!(closed.len(), 2);
        // The socket rule is the only difference: more families allowed.
        assert!(none[0].len() < closed[0].len(), "{} vs {}", none[0].len(), closed[0].len());
        assert!(closed[0].len() < open[0].len(), "{} vs {}", closed[0].len(), open[0].len());
        Ok(())
    }
}
