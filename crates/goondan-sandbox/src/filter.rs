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
//! confined by network namespaces) or the kernel's other families); the second answers
//! `ENOSYS` to `clone3`, whose flags live in memory seccomp cannot read, so
//! the C library falls back to `clone`, whose flags the first filter checks.

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

/// The filters for a command; `network` keeps inet (and netlink) sockets
/// available.
pub(crate) fn filters(network: bool) -> Result<Vec<BpfProgram>, SandboxError> {
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
    let families: &[i32] =
        if network { &[libc::AF_UNIX, libc::AF_INET, libc::AF_INET6, libc::AF_NETLINK] } else { &[libc::AF_UNIX] };
    let other_family = families
        .iter()
        .map(|&family| condition(0, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, family as u64))
        .collect::<Result<Vec<_>, _>>()?;
    rules.insert(libc::SYS_socket, vec![rule(other_family)?]);
    let main = compile(rules, SeccompAction::Errno(libc::EPERM as u32), arch)?;
    let clone3 =
        compile(BTreeMap::from([(libc::SYS_clone3, Vec::new())]), SeccompAction::Errno(libc::ENOSYS as u32), arch)?;
    Ok(vec![main, clone3])
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
    fn both_filters_compile_with_and_without_network() -> Result<(), SandboxError> {
        let closed = filters(false)?;
        let open = filters(true)?;
        assert_eq!(closed.len(), 2);
        // The socket rule is the only difference: more families allowed.
        assert!(closed[0].len() < open[0].len(), "{} vs {}", closed[0].len(), open[0].len());
        Ok(())
    }
}
