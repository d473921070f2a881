//! Confining tool paths to the instance's working directory.
//!
//! A path from the model resolves against the workdir (or is taken as is when
//! absolute) and is normalized lexically (`..` is resolved before links are
//! followed: `link/../x` is `x` in the directory that holds `link`, which
//! never reaches further than the text of the path suggests). Then it must lie
//! inside the workdir or one of the operator's extra roots
//! (`GOONDAN_FS_ALLOW_ROOTS`, see [`crate::settings::FS_ALLOW_ROOTS_VAR`]),
//! **as text**, before anything is looked at on disk; inside, its components
//! are walked one by one, and every symbolic link met (a dangling one too,
//! whose target creating a file would follow) is replaced by its target and
//! the result checked again the same way.
//!
//! So the resolution never examines anything outside the allowed roots, and
//! a refusal cannot tell the model what lies outside: every path that leads
//! outside gets the same code and the same message, naming only the path the
//! model sent — whether its outside target exists, is a file or a directory.
//!
//! The resolved path is what tools report and use; [`Confined`] also says
//! which root it lies in and where below it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use goondan_core::codes::{E_PATH_OUTSIDE_WORKDIR, E_PATH_UNRESOLVABLE};
use goondan_tools::ToolFailure;

/// How many symbolic links one resolution may follow by hand, like the
/// kernel's `MAXSYMLINKS`.
const MAX_LINK_HOPS: usize = 40;

/// A path resolved inside one of the allowed roots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confined {
    /// The real path: no symbolic link in its existing part (when it was
    /// resolved), the rest does not exist yet.
    pub real: PathBuf,
    /// The allowed root it lies in (its real path).
    pub root: PathBuf,
    /// `real` relative to `root`; empty for the root itself.
    pub relative: PathBuf,
}

/// Resolves `path` (relative to `workdir`, or absolute) to a real path inside
/// `workdir` or one of `extra_roots`.
pub fn resolve_confined(workdir: &Path, extra_roots: &[PathBuf], path: &str) -> Result<PathBuf, ToolFailure> {
    resolve_beneath(workdir, extra_roots, path).map(|confined| confined.real)
}

/// Resolves `path` like [`resolve_confined`], keeping which root it lies in.
pub fn resolve_beneath(workdir: &Path, extra_roots: &[PathBuf], path: &str) -> Result<Confined, ToolFailure> {
    let requested = Path::new(path);
    let joined = if requested.is_absolute() { requested.to_path_buf() } else { workdir.join(requested) };
    let roots = roots(workdir, extra_roots);
    let mut current = normalize(&joined);
    for _ in 0..=MAX_LINK_HOPS {
        // Checked as text first: nothing outside is ever examined.
        let Some((root, rest)) = locate(&current, &roots) else {
            return Err(outside_failure(path));
        };
        match walk(root, &rest).map_err(|error| unresolvable(path, &error))? {
            Step::Done(relative) => {
                // `join("")` would add a trailing slash to the root itself.
                let real = if relative.as_os_str().is_empty() { root.clone() } else { root.join(&relative) };
                return Ok(Confined { real, root: root.clone(), relative });
            }
            Step::Link(next) => current = next,
        }
    }
    Err(unresolvable(path, &format!("more than {MAX_LINK_HOPS} symbolic links to follow")))
}

/// The refusal of a path that leads outside the allowed roots. It names only
/// `path`, as the model sent it: where it leads, and whether that exists, is
/// none of the model's business.
pub fn outside_failure(path: &str) -> ToolFailure {
    ToolFailure::with_code(format!("path '{path}' is outside the instance's working directory"), E_PATH_OUTSIDE_WORKDIR)
        .named("PathOutsideWorkdirError")
        .suggest(
            "Use a path inside the working directory (relative paths resolve there). The operator can allow more \
         directories with GOONDAN_FS_ALLOW_ROOTS.",
        )
}

fn unresolvable(path: &str, why: &dyn std::fmt::Display) -> ToolFailure {
    ToolFailure::with_code(format!("cannot resolve path '{path}': {why}"), E_PATH_UNRESOLVABLE)
        .suggest("Check that every directory on the way exists and is a directory, and that no symbolic link loops.")
}

/// The workdir and the extra roots, with symbolic links resolved; roots that
/// do not exist are left out (nothing can be inside them).
pub fn allowed_roots(workdir: &Path, extra_roots: &[PathBuf]) -> Vec<PathBuf> {
    roots(workdir, extra_roots).into_iter().map(|root| root.real).collect()
}

/// Whether the real path `real` lies in (or is) one of `roots`.
pub fn is_within(real: &Path, roots: &[PathBuf]) -> bool {
    roots.iter().any(|root| real.starts_with(root))
}

/// An allowed root: its real path, and the (normalized, absolute) path it was
/// given as, which a model may also use.
struct Root {
    real: PathBuf,
    given: PathBuf,
}

fn roots(workdir: &Path, extra_roots: &[PathBuf]) -> Vec<Root> {
    std::iter::once(workdir)
        .chain(extra_roots.iter().map(PathBuf::as_path))
        .filter_map(|root| {
            let real = std::fs::canonicalize(root).ok()?;
            let given = std::path::absolute(root).map_or_else(|_| real.clone(), |given| normalize(&given));
            Some(Root { real, given })
        })
        .collect()
}

/// The root `path` lies in, as text, and the rest of `path` below it.
fn locate<'r>(path: &Path, roots: &'r [Root]) -> Option<(&'r PathBuf, PathBuf)> {
    roots.iter().find_map(|root| {
        let rest = path.strip_prefix(&root.real).or_else(|_| path.strip_prefix(&root.given)).ok()?;
        Some((&root.real, rest.to_path_buf()))
    })
}

/// Removes `.` and resolves `..` lexically (a `..` at the root stays at the root).
pub(crate) use goondan_config::sandbox::normalize;

/// The outcome of walking a path below a root.
enum Step {
    /// The path relative to the root, free of links up to where it stops existing.
    Done(PathBuf),
    /// A link on the way, replaced by its target: the whole path to check again.
    Link(PathBuf),
}

/// Walks `rest` (normalized, no `..`) below the real directory `root`, one
/// component at a time, without following links: the first link met ends
/// the walk with the path it stands for.
fn walk(root: &Path, rest: &Path) -> std::io::Result<Step> {
    let parts: Vec<OsString> = rest.components().map(|part| part.as_os_str().to_os_string()).collect();
    let mut relative = PathBuf::new();
    for (index, name) in parts.iter().enumerate() {
        let here = root.join(&relative);
        let candidate = here.join(name);
        match std::fs::symlink_metadata(&candidate) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = std::fs::read_link(&candidate)?;
                let mut next = if target.is_absolute() { target } else { here.join(target) };
                next.extend(&parts[index + 1..]);
                return Ok(Step::Link(normalize(&next)));
            }
            Ok(meta) => {
                if !meta.is_dir() && index + 1 < parts.len() {
                    return Err(std::io::Error::from(std::io::ErrorKind::NotADirectory));
                }
                relative.push(name);
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                relative.extend(&parts[index..]);
                return Ok(Step::Done(relative));
            }
            Err(error) => return Err(error),
        }
    }
    Ok(Step::Done(relative))
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

    /// The message of a refusal with the path the model sent replaced, to
    /// compare the shapes of two refusals.
    fn shape(result: Result<PathBuf, ToolFailure>, sent: &str) -> (Option<String>, String) {
        match result {
            Ok(real) => panic!("{sent} resolved to {}", real.display()),
            Err(failure) => (failure.code, failure.message.replace(sent, "<path>")),
        }
    }

    #[test]
    fn refusals_do_not_tell_what_lies_outside() {
        let (dir, outside) = (workdir(), workdir());
        let root = dir.path.clone();
        std::fs::write(outside.path.join("secret.txt"), "secret").unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir(outside.path.join("dir")).unwrap_or_else(|e| panic!("{e}"));
        let _ = std::os::unix::fs::symlink(&outside.path, root.join("escape"));
        let _ = std::os::unix::fs::symlink(outside.path.join("secret.txt"), root.join("file-link"));
        let _ = std::os::unix::fs::symlink(outside.path.join("missing.txt"), root.join("missing-link"));
        let name = outside.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let absolute = |rest: &str| format!("{}/{rest}", outside.path.display());
        let up = |rest: &str| format!("../{name}/{rest}");
        // Pairs (or groups) that differ only in what exists outside.
        let groups = [
            vec![absolute("secret.txt"), absolute("missing.txt"), absolute("dir"), absolute("secret.txt/x")],
            vec![up("secret.txt"), up("missing.txt"), up("dir"), up("secret.txt/x"), up("missing/x")],
            vec!["escape/secret.txt".to_owned(), "escape/missing.txt".to_owned(), "escape/secret.txt/x".to_owned()],
            vec!["file-link".to_owned(), "missing-link".to_owned()],
            vec!["/etc/passwd".to_owned(), "/etc/passwd/x".to_owned(), "/no-such-dir/x".to_owned()],
        ];
        let outside_text = outside.path.to_string_lossy().into_owned();
        for group in groups {
            let shapes: Vec<_> = group.iter().map(|sent| shape(resolve_confined(&root, &[], sent), sent)).collect();
            for (sent, (code, message)) in group.iter().zip(&shapes) {
                assert_eq!(code.as_deref(), Some(E_PATH_OUTSIDE_WORKDIR), "{sent}: {message}");
                assert_eq!(message, "path '<path>' is outside the instance's working directory", "{sent}");
                // The resolved outside location never appears unless the model sent it.
                if !sent.contains(&outside_text) {
                    assert!(!message.contains(&outside_text), "{sent}: {message}");
                }
            }
            assert!(shapes.windows(2).all(|pair| pair[0] == pair[1]), "{group:?}: {shapes:?}");
        }
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
