//! Confining tool paths to the instance's working directory.
//!
//! A path from the model resolves against the workdir (or is taken as is when
//! absolute), is normalized, and has every symbolic link in its existing part
//! resolved — including a dangling link, whose target is followed by hand so
//! that creating a file "through" it cannot land outside; the result must lie
//! inside the workdir or one of the operator's extra roots
//! (`GOONDAN_FS_ALLOW_ROOTS`, see [`crate::settings::FS_ALLOW_ROOTS_VAR`]).
//! Tools then work on the resolved path, so what was checked is what is used:
//! its existing prefix holds no symbolic link, and the rest does not exist yet.
//!
//! `..` is resolved lexically before links are followed (`link/../x` is `x`
//! in the directory that holds `link`), which is stricter than the kernel's
//! reading and never reaches further than the text of the path suggests.

use std::path::{Component, Path, PathBuf};

use goondan_core::codes::{E_PATH_OUTSIDE_WORKDIR, E_PATH_UNRESOLVABLE};
use goondan_tools::ToolFailure;

/// How many symbolic links one resolution may follow by hand, like the
/// kernel's `MAXSYMLINKS`.
const MAX_LINK_HOPS: usize = 40;

/// Resolves `path` (relative to `workdir`, or absolute) to a real path inside
/// `workdir` or one of `extra_roots`.
pub fn resolve_confined(workdir: &Path, extra_roots: &[PathBuf], path: &str) -> Result<PathBuf, ToolFailure> {
    let requested = Path::new(path);
    let joined = if requested.is_absolute() { requested.to_path_buf() } else { workdir.join(requested) };
    let real = real_path(&normalize(&joined)).map_err(|error| {
        ToolFailure::with_code(format!("cannot resolve path '{path}': {error}"), E_PATH_UNRESOLVABLE).suggest(
            "Check that every directory on the way exists and is a directory, and that no symbolic link loops.",
        )
    })?;
    let roots = allowed_roots(workdir, extra_roots);
    if is_within(&real, &roots) {
        return Ok(real);
    }
    Err(ToolFailure::with_code(
        format!(
            "path '{path}' resolves to {}, which is outside the instance's working directory {}",
            real.display(),
            roots.first().map_or_else(|| workdir.display().to_string(), |root| root.display().to_string())
        ),
        E_PATH_OUTSIDE_WORKDIR,
    )
    .named("PathOutsideWorkdirError")
    .suggest(
        "Use a path inside the working directory (relative paths resolve there). The operator can allow more \
         directories with GOONDAN_FS_ALLOW_ROOTS.",
    ))
}

/// The workdir and the extra roots, with symbolic links resolved; roots that
/// do not exist are left out (nothing can be inside them).
pub fn allowed_roots(workdir: &Path, extra_roots: &[PathBuf]) -> Vec<PathBuf> {
    std::iter::once(workdir)
        .chain(extra_roots.iter().map(PathBuf::as_path))
        .filter_map(|root| std::fs::canonicalize(root).ok())
        .collect()
}

/// Whether the real path `real` lies in (or is) one of `roots`.
pub fn is_within(real: &Path, roots: &[PathBuf]) -> bool {
    roots.iter().any(|root| real.starts_with(root))
}

/// Removes `.` and resolves `..` lexically (a `..` at the root stays at the root).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// Resolves symbolic links in the longest existing prefix of `path` and
/// appends the rest, which does not exist yet.
///
/// `canonicalize` reports a dangling link as missing; such a link is followed
/// by hand (its target may lie elsewhere, and creating the file would follow
/// it), up to [`MAX_LINK_HOPS`] times.
fn real_path(path: &Path) -> std::io::Result<PathBuf> {
    let mut current = path.to_path_buf();
    for _ in 0..=MAX_LINK_HOPS {
        match resolve_once(&current)? {
            Resolution::Done(real) => return Ok(real),
            Resolution::Retry(next) => current = next,
        }
    }
    Err(std::io::Error::other(format!("more than {MAX_LINK_HOPS} symbolic links to follow")))
}

enum Resolution {
    /// The real path.
    Done(PathBuf),
    /// A dangling link was replaced by its target: resolve this path again.
    Retry(PathBuf),
}

fn resolve_once(path: &Path) -> std::io::Result<Resolution> {
    let mut existing = path;
    let mut rest = Vec::new();
    loop {
        match std::fs::canonicalize(existing) {
            Ok(mut real) => {
                for part in rest.iter().rev() {
                    real.push(part);
                }
                return Ok(Resolution::Done(real));
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                let (Some(parent), Some(name)) = (existing.parent(), existing.file_name()) else {
                    return Err(error);
                };
                let is_link = std::fs::symlink_metadata(existing).is_ok_and(|meta| meta.file_type().is_symlink());
                if is_link {
                    // The entry exists but leads nowhere: continue from where it points.
                    let target = std::fs::read_link(existing)?;
                    let mut next = if target.is_absolute() { target } else { parent.join(target) };
                    for part in rest.iter().rev() {
                        next.push(part);
                    }
                    return Ok(Resolution::Retry(normalize(&next)));
                }
                rest.push(name.to_os_string());
                existing = parent;
            }
            Err(error) => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::workdir;

    fn code(result: Result<PathBuf, ToolFailure>) -> Option<String> {
        result.err().and_then(|f| f.code)
    }

    #[test]
    fn relative_paths_stay_inside_and_escapes_are_refused() {
        let dir = workdir();
        let root = dir.path.clone();
        let _ = std::fs::create_dir(root.join("sub"));
        assert_eq!(resolve_confined(&root, &[], "sub/new.txt").ok(), Some(root.join("sub/new.txt")));
        assert_eq!(resolve_confined(&root, &[], "./sub/../a.txt").ok(), Some(root.join("a.txt")));
        assert_eq!(resolve_confined(&root, &[], "").ok(), Some(root.clone()));
        assert_eq!(code(resolve_confined(&root, &[], "../outside.txt")).as_deref(), Some(E_PATH_OUTSIDE_WORKDIR));
        assert_eq!(code(resolve_confined(&root, &[], "/etc/passwd")).as_deref(), Some(E_PATH_OUTSIDE_WORKDIR));
        assert_eq!(code(resolve_confined(&root, &[], "sub/../../x")).as_deref(), Some(E_PATH_OUTSIDE_WORKDIR));
        let inside_absolute = root.join("sub").to_string_lossy().into_owned();
        assert!(resolve_confined(&root, &[], &inside_absolute).is_ok());
    }

    #[test]
    fn symlinks_that_lead_outside_are_refused() {
        let (dir, outside) = (workdir(), workdir());
        let root = dir.path.clone();
        let _ = std::os::unix::fs::symlink(&outside.path, root.join("escape"));
        let _ = std::os::unix::fs::symlink(root.join("sub"), root.join("inner"));
        let _ = std::fs::create_dir(root.join("sub"));
        assert_eq!(code(resolve_confined(&root, &[], "escape/secret.txt")).as_deref(), Some(E_PATH_OUTSIDE_WORKDIR));
        assert_eq!(code(resolve_confined(&root, &[], "escape")).as_deref(), Some(E_PATH_OUTSIDE_WORKDIR));
        assert_eq!(resolve_confined(&root, &[], "inner/f").ok(), Some(root.join("sub/f")));
        // The operator can widen the roots.
        assert!(resolve_confined(&root, std::slice::from_ref(&outside.path), "escape/secret.txt").is_ok());
    }

    #[test]
    fn dangling_links_are_followed_by_hand() {
        let (dir, outside) = (workdir(), workdir());
        let root = dir.path.clone();
        // Creating `dangling` would create a file outside.
        let _ = std::os::unix::fs::symlink(outside.path.join("new.txt"), root.join("dangling"));
        assert_eq!(code(resolve_confined(&root, &[], "dangling")).as_deref(), Some(E_PATH_OUTSIDE_WORKDIR));
        // A dangling directory link on the way.
        let _ = std::os::unix::fs::symlink(outside.path.join("missing-dir"), root.join("gone"));
        assert_eq!(code(resolve_confined(&root, &[], "gone/a/b.txt")).as_deref(), Some(E_PATH_OUTSIDE_WORKDIR));
        // A dangling link inside resolves to its (future) target, relative links included.
        let _ = std::os::unix::fs::symlink("later.txt", root.join("soon"));
        assert_eq!(resolve_confined(&root, &[], "soon").ok(), Some(root.join("later.txt")));
        // A chain of links, and a loop.
        let _ = std::os::unix::fs::symlink("soon", root.join("chain"));
        assert_eq!(resolve_confined(&root, &[], "chain").ok(), Some(root.join("later.txt")));
        let _ = std::os::unix::fs::symlink("loop-b", root.join("loop-a"));
        let _ = std::os::unix::fs::symlink("loop-a", root.join("loop-b"));
        assert_eq!(code(resolve_confined(&root, &[], "loop-a/x")).as_deref(), Some(E_PATH_UNRESOLVABLE));
    }
}
