//! Where an installed package lives, shared by the installer
//! (`gdn package`, goondan-registry's client) and the loader
//! (goondan-config): `<packages>/<scope without @>/<name>/<version>/`, the
//! original's layout, or `<packages>/<name>/<version>/` for an unscoped name.
//!
//! Also the two marker files that tell the loader's search of a bundle
//! directory for split files what is never part of a bundle, when a state
//! root is kept inside a project: an installed package (its
//! [`INSTALL_MARKER`]) and a state root (its [`STATE_ROOT_MARKER`]), whose
//! workdirs hold what a model wrote — never to be read as configuration.

use std::path::{Path, PathBuf};

/// The file in an install recording the integrity it was made from.
pub const INSTALL_MARKER: &str = ".goondan-integrity";

/// The file that marks a state root.
pub const STATE_ROOT_MARKER: &str = ".goondan-state-root";

/// Marks `root` (an existing state root) with [`STATE_ROOT_MARKER`] if it
/// is not yet.
pub fn mark_state_root(root: &Path) -> std::io::Result<()> {
    let marker = root.join(STATE_ROOT_MARKER);
    // Private like every file of the state root (0600).
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(&marker) {
        Ok(mut file) => {
            use std::io::Write as _;
            file.write_all(b"A goondan state root: no bundle file under it is part of a bundle.\n")
        }
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err(error),
    }
}

/// Whether `dir` is a state root or an installed package (holds either
/// marker): never searched for a bundle's files.
pub fn is_state_or_install(dir: &Path) -> bool {
    [STATE_ROOT_MARKER, INSTALL_MARKER].iter().any(|marker| dir.join(marker).symlink_metadata().is_ok())
}

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

    #[test]
    fn a_marked_state_root_and_an_install_are_recognised() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        assert!(!is_state_or_install(dir.path()));
        mark_state_root(dir.path())?;
        mark_state_root(dir.path())?;
        assert!(is_state_or_install(dir.path()));
        let install = dir.path().join("pkg");
        std::fs::create_dir(&install)?;
        std::fs::write(install.join(INSTALL_MARKER), "sha512-x")?;
        assert!(is_state_or_install(&install));
        Ok(())
    }
}
