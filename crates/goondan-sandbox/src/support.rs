//! What this kernel offers for confinement, found out once per process.

use std::sync::OnceLock;

use landlock::{ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr, Scope};

/// The confinement features of the running kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelSupport {
    /// Landlock file-system rules (Linux 5.13+, `landlock` in the LSM list).
    pub landlock: bool,
    /// Moving and linking files between directories under rules (ABI 2).
    pub landlock_refer: bool,
    /// TCP bind/connect rules (ABI 4).
    pub landlock_tcp: bool,
    /// Signal and abstract-socket scoping (ABI 6): a command cannot signal
    /// `gdn`.
    pub landlock_scopes: bool,
}

impl KernelSupport {
    /// What is missing for the confined policies, in words; `None` when
    /// they can run.
    pub fn missing(&self) -> Option<String> {
        (!self.landlock).then(|| {
            "Landlock is not available (it needs Linux 5.13 or newer with `landlock` in the kernel's LSM list, \
             e.g. lsm=landlock,... on the kernel command line)"
                .to_owned()
        })
    }
}

/// The running kernel's features (probed once: a few `landlock_create_ruleset`
/// calls).
pub fn kernel_support() -> KernelSupport {
    static SUPPORT: OnceLock<KernelSupport> = OnceLock::new();
    *SUPPORT.get_or_init(probe)
}

fn probe() -> KernelSupport {
    let fs = |abi| {
        Ruleset::default()
            .set_compatibility(CompatLevel::HardRequirement)
            .handle_access(AccessFs::from_all(abi))
            .and_then(|ruleset| ruleset.create())
            .is_ok()
    };
    let tcp = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessNet::from_all(ABI::V4))
        .and_then(|ruleset| ruleset.create())
        .is_ok();
    let scopes = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .scope(Scope::from_all(ABI::V6))
        .and_then(|ruleset| ruleset.create())
        .is_ok();
    KernelSupport { landlock: fs(ABI::V1), landlock_refer: fs(ABI::V2), landlock_tcp: tcp, landlock_scopes: scopes }
}
