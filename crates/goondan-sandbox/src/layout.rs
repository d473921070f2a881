//! Which paths a confined command may read, write and execute.
//!
//! Landlock only grants (a right on a directory covers everything beneath
//! it); it cannot take a right back below a granted directory. So the
//! protected files inside a writable workdir are kept read-only one of two
//! ways: with namespaces, by read-only bind mounts over them (the workdir
//! itself stays writable); without, by granting write on each entry of the
//! workdir that neither is nor holds a protected file, and nothing on the
//! directories that hold one — new entries can then only be made inside an
//! unprotected subdirectory.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::policy::{Policy, SandboxSpec};

/// Trees of the system a command may read and execute.
pub(crate) const SYSTEM_READABLE: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/opt",
    "/snap",
    "/proc",
    "/sys/devices/system/cpu",
];

/// Entries of `/etc` a command may not read: password hashes, sudo rules,
/// host keys, Kerberos keys, stored credentials.
const ETC_SECRETS: &[&str] = &[
    "shadow",
    "shadow-",
    "gshadow",
    "gshadow-",
    "sudoers",
    "sudoers.d",
    "ssh",
    "security",
    ".pwd.lock",
    "krb5.keytab",
    "credstore",
    "credstore.encrypted",
    "ssl",
];

/// Device files a command may read and write.
const DEVICES_READ_WRITE: &[&str] = &["/dev/null", "/dev/zero", "/dev/full"];
/// Device files a command may read.
const DEVICES_READ: &[&str] = &["/dev/urandom", "/dev/random"];

/// How a path is granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Grant {
    /// Read files, list directories, execute.
    Read,
    /// Everything: also write, create, remove, rename.
    Write,
    /// Read and write an existing file (devices).
    Device,
    /// List a directory (not read its files).
    List,
}

/// How a protected path inside the workdir is mounted over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Cover {
    /// Bound read-only onto itself.
    ReadOnly,
    /// A `.env*` file: `/dev/null` bound read-only over it.
    HideFile,
    /// A `.env*` directory: an empty read-only tmpfs over it.
    HideDir,
}

/// Which way the protected files are kept read-only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Read-only bind mounts in the command's own mount namespace.
    Namespaces,
    /// Landlock alone: write granted entry by entry.
    LandlockOnly,
}

/// The grants for `spec` (whose `workdir` and `protected` are canonical)
/// with its private temporary directory `tmp`.
pub(crate) fn grants(spec: &SandboxSpec, tmp: &Path, mode: Mode) -> Vec<(PathBuf, Grant)> {
    let mut grants: Vec<(PathBuf, Grant)> =
        SYSTEM_READABLE.iter().map(|path| (PathBuf::from(path), Grant::Read)).collect();
    grants.extend(etc_entries().into_iter().map(|path| (path, Grant::Read)));
    grants.extend(DEVICES_READ_WRITE.iter().map(|path| (PathBuf::from(path), Grant::Device)));
    grants.extend(DEVICES_READ.iter().map(|path| (PathBuf::from(path), Grant::Read)));
    grants.push((tmp.to_path_buf(), Grant::Write));
    let writes = workdir_writable(spec);
    // A bundle inside the workdir: no new entry on the way to it, which
    // mounts cannot keep out (they cover what exists).
    let bundle_below =
        spec.bundle.as_ref().is_some_and(|bundle| *bundle != spec.workdir && bundle.starts_with(&spec.workdir));
    match mode {
        // The mounts keep the protected files read-only and `.env*` hidden.
        Mode::Namespaces if !bundle_below => {
            grants.push((spec.workdir.clone(), if writes { Grant::Write } else { Grant::Read }));
        }
        Mode::Namespaces | Mode::LandlockOnly => {
            grants.push((spec.workdir.clone(), Grant::List));
            let protected: HashSet<&Path> = spec.protected.iter().map(PathBuf::as_path).collect();
            entry_grants(&spec.workdir, &protected, writes, &mut grants);
        }
    }
    grants.extend(spec.readable.iter().map(|path| (path.clone(), Grant::Read)));
    grants.extend(spec.writable.iter().map(|path| (path.clone(), Grant::Write)));
    grants
}

/// Whether commands may write the workdir: under `workspace-write`, unless
/// the workdir is itself protected (it is the bundle's directory). A
/// workdir inside the bundle's directory is writable, and the rest of the
/// bundle is not even seen (only the workdir is bound into a command's
/// root, or granted by Landlock).
pub(crate) fn workdir_writable(spec: &SandboxSpec) -> bool {
    spec.policy == Policy::WorkspaceWrite && !spec.protected.contains(&spec.workdir)
}

/// The protected paths that exist inside the workdir and how each is
/// covered: read-only, or (`.env*`) hidden; under `read-only` only the
/// hidden ones (nothing there is writable anyway).
pub(crate) fn protected_mounts(spec: &SandboxSpec) -> Vec<(PathBuf, Cover)> {
    let mut seen = HashSet::new();
    let mut inside: Vec<&PathBuf> = spec.protected.iter().collect();
    // A protected tree first, then what it holds (its `.env*` hidden over it).
    inside.sort_by_key(|path| path.components().count());
    // Seen by the command: what lies in its workdir or an extra tree.
    let seen_in = |path: &Path| {
        std::iter::once(&spec.workdir).chain(&spec.readable).chain(&spec.writable).any(|tree| path.starts_with(tree))
    };
    inside
        .into_iter()
        .filter(|path| seen_in(path) && path.as_path() != spec.workdir)
        .filter(|path| seen.insert(path.as_path()))
        .filter_map(|path| {
            let meta = std::fs::symlink_metadata(path).ok()?;
            if meta.file_type().is_symlink() {
                return None;
            }
            let cover = match (is_dot_env(path), meta.is_dir()) {
                (true, true) => Cover::HideDir,
                (true, false) => Cover::HideFile,
                (false, _) if spec.policy == Policy::WorkspaceWrite => Cover::ReadOnly,
                (false, _) => return None,
            };
            Some((path.clone(), cover))
        })
        .collect()
}

/// `/etc` but its secrets; `/etc/ssl` but its private keys.
fn etc_entries() -> Vec<PathBuf> {
    let mut entries = Vec::new();
    let Ok(listing) = std::fs::read_dir("/etc") else { return entries };
    for entry in listing.flatten() {
        let name = entry.file_name();
        if name == "ssl" {
            if let Ok(ssl) = std::fs::read_dir(entry.path()) {
                entries.extend(ssl.flatten().filter(|e| e.file_name() != "private").map(|e| e.path()));
            }
            continue;
        }
        if !ETC_SECRETS.iter().any(|secret| name == *secret) {
            entries.push(entry.path());
        }
    }
    entries
}

/// Grants entry by entry below `dir`: an entry that neither is nor holds a
/// protected path is granted whole (written when `writes`); a protected
/// one is read; a `.env*` one gets nothing; a directory holding a protected
/// path is split further. A link is left out (granting it would grant its
/// target; what it points to inside the workdir is granted there).
fn entry_grants(dir: &Path, protected: &HashSet<&Path>, writes: bool, out: &mut Vec<(PathBuf, Grant)>) {
    let Ok(listing) = std::fs::read_dir(dir) else { return };
    for entry in listing.flatten() {
        let path = entry.path();
        let Ok(kind) = entry.file_type() else { continue };
        if kind.is_symlink() || is_dot_env(&path) {
            continue;
        }
        let hides_below = || protected.iter().any(|p| p.starts_with(&path) && *p != path && is_dot_env(p));
        if protected.contains(path.as_path()) {
            if kind.is_dir() && hides_below() {
                // Read-only, but for its `.env*`, which gets nothing.
                out.push((path.clone(), Grant::List));
                entry_grants(&path, protected, false, out);
            } else {
                out.push((path, Grant::Read));
            }
        } else if protected.iter().any(|p| p.starts_with(&path)) {
            if kind.is_dir() {
                out.push((path.clone(), Grant::List));
                entry_grants(&path, protected, writes, out);
            }
        } else {
            out.push((path, if writes { Grant::Write } else { Grant::Read }));
        }
    }
}

fn is_dot_env(path: &Path) -> bool {
    path.file_name().and_then(|name| name.to_str()).is_some_and(|name| name.starts_with(".env"))
}

/// `.git` and the `.env*` entries directly in `workdir`, which stay read-only.
pub(crate) fn default_protected(workdir: &Path) -> Vec<PathBuf> {
    let mut protected = vec![workdir.join(".git")];
    if let Ok(listing) = std::fs::read_dir(workdir) {
        protected.extend(listing.flatten().map(|entry| entry.path()).filter(|path| is_dot_env(path)));
    }
    protected
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> std::io::Result<tempfile::TempDir> {
        let dir = tempfile::tempdir()?;
        let root = dir.path();
        std::fs::create_dir_all(root.join(".git/hooks"))?;
        std::fs::create_dir_all(root.join("tools/lib"))?;
        std::fs::create_dir_all(root.join("src"))?;
        std::fs::write(root.join("goondan.yaml"), "")?;
        std::fs::write(root.join("tools/echo.ts"), "")?;
        std::fs::write(root.join("tools/notes.md"), "")?;
        std::fs::write(root.join(".env"), "")?;
        std::fs::write(root.join("README.md"), "")?;
        std::os::unix::fs::symlink("/etc", root.join("link"))?;
        Ok(dir)
    }

    /// The workspace-write spec of the tree in `dir` (its canonical path,
    /// returned too), protecting the defaults and `protected` in it.
    fn workspace_write(dir: &tempfile::TempDir, protected: &[&str]) -> std::io::Result<(PathBuf, SandboxSpec)> {
        let workdir = std::fs::canonicalize(dir.path())?;
        let mut all = default_protected(&workdir);
        all.extend(protected.iter().map(|path| workdir.join(path)));
        let spec = SandboxSpec {
            policy: Policy::WorkspaceWrite,
            workdir: workdir.clone(),
            protected: all,
            ..SandboxSpec::default()
        };
        Ok((workdir, spec))
    }

    #[test]
    fn without_namespaces_only_unprotected_entries_are_writable() -> std::io::Result<()> {
        let dir = tree()?;
        let (workdir, spec) = workspace_write(&dir, &["goondan.yaml", "tools/echo.ts"])?;
        let tmp = workdir.join("tmp-not-used");
        let all = grants(&spec, &tmp, Mode::LandlockOnly);
        let granted = |wanted: Grant| -> HashSet<PathBuf> {
            all.iter()
                .filter(|(path, grant)| *grant == wanted && path.starts_with(&workdir) && *path != tmp)
                .map(|(path, _)| path.clone())
                .collect()
        };
        let paths = |list: &[&str]| list.iter().map(|p| workdir.join(p)).collect::<HashSet<_>>();
        assert_eq!(granted(Grant::Write), paths(&["src", "README.md", "tools/lib", "tools/notes.md"]));
        assert_eq!(granted(Grant::Read), paths(&[".git", "goondan.yaml", "tools/echo.ts"]));
        // `.env` gets nothing; the workdir and `tools` are only listed.
        assert_eq!(granted(Grant::List), paths(&["", "tools"]));
        Ok(())
    }

    #[test]
    fn with_namespaces_the_workdir_is_writable_and_protected_paths_are_mounted() -> std::io::Result<()> {
        let dir = tree()?;
        let (workdir, spec) = workspace_write(&dir, &["goondan.yaml", "goondan.lock.yaml", "link"])?;
        assert!(grants(&spec, Path::new("/nonexistent"), Mode::Namespaces).contains(&(workdir.clone(), Grant::Write)));
        let mounts: HashSet<(PathBuf, Cover)> = protected_mounts(&spec).into_iter().collect();
        // What does not exist and what is a link is not mounted over.
        let expected: HashSet<(PathBuf, Cover)> = [
            (workdir.join(".git"), Cover::ReadOnly),
            (workdir.join(".env"), Cover::HideFile),
            (workdir.join("goondan.yaml"), Cover::ReadOnly),
        ]
        .into_iter()
        .collect();
        assert_eq!(mounts, expected);
        Ok(())
    }

    #[test]
    fn read_only_grants_no_write_in_the_workdir() {
        let spec = SandboxSpec { policy: Policy::ReadOnly, workdir: PathBuf::from("/w"), ..SandboxSpec::default() };
        let grants = grants(&spec, Path::new("/t"), Mode::Namespaces);
        assert!(!grants.iter().any(|(path, grant)| path.starts_with("/w") && *grant == Grant::Write));
        assert!(grants.contains(&(PathBuf::from("/t"), Grant::Write)));
    }

    #[test]
    fn etc_secrets_are_left_out() {
        let entries = etc_entries();
        assert!(!entries.iter().any(|p| p == Path::new("/etc/shadow") || p.starts_with("/etc/ssl/private")));
        if Path::new("/etc/passwd").exists() {
            assert!(entries.iter().any(|p| p == Path::new("/etc/passwd")));
        }
    }
}
