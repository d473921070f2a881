//! Where an installed package lives, shared by the installer
//! (`gdn package`, goondan-registry's client) and the loader
//! (goondan-config): `<packages>/<scope without @>/<name>/<version>/`, the
//! original's layout, or `<packages>/<name>/<version>/` for an unscoped name.

use std::path::{Path, PathBuf};

/// The directory of `name@version` under `packages_dir` (the state root's
/// `packages/`).
pub fn installed_root(packages_dir: &Path, name: &str, version: &str) -> PathBuf {
    if let Some((scope, bare)) = name.strip_prefix('@').and_then(|n| n.split_once('/'))
        && !scope.is_empty()
        && !bare.is_empty()
    {
        return packages_dir.join(scope).join(bare).join(version);
    }
    packages_dir.join(name).join(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_loses_its_at_and_a_bare_name_has_no_scope_directory() {
        let root = Path::new("/p");
        assert_eq!(installed_root(root, "@acme/tools", "1.0.0"), PathBuf::from("/p/acme/tools/1.0.0"));
        assert_eq!(installed_root(root, "tools", "2.0.0"), PathBuf::from("/p/tools/2.0.0"));
    }
}
