//! File I/O beneath the allowed roots, shared by `file-system` and the
//! `savePath` of the chat tools' downloads, and running such blocking work
//! off the runtime's threads.
//!
//! A path checked by [`crate::paths::resolve_beneath`] is used through a
//! directory capability of its root ([`cap_std::fs::Dir`], opened once per
//! root and call): every open, create, rename and listing names the path
//! relative to that directory, and the kernel resolves it beneath it
//! (`openat2` with `RESOLVE_BENEATH` on Linux, or cap-std's own careful
//! walk). So a directory swapped for a symbolic link to elsewhere after the
//! check cannot lead the I/O outside: it fails instead ([`is_escape`]).
//! Besides, the last component is opened without following a link (the
//! checked path had none there), temporary files are created with
//! `O_CREAT | O_EXCL` (an existing file or link of that name is never
//! opened), and a write's parent directory is opened once and the temporary
//! file created and renamed inside it.

use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::path::Path;

use cap_fs_ext::DirExt;
use cap_std::fs::{Dir, File, OpenOptions, Permissions};

/// Runs `work` on Tokio's blocking pool, or inline outside a runtime.
pub(crate) async fn run_blocking<T, F>(work: F) -> Result<T, tokio::task::JoinError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => runtime.spawn_blocking(work).await,
        Err(_) => Ok(work()),
    }
}

/// Opens the allowed root `root` (a real path the operator chose) as a
/// directory capability.
pub(crate) fn open_root(root: &Path) -> io::Result<Dir> {
    Dir::open_ambient_dir(root, cap_std::ambient_authority())
}

/// Whether `error` is cap-std's refusal of a path that led outside its
/// directory: a link swapped in after the check. cap-std reports it (and
/// the kernel's `EXDEV` from `RESOLVE_BENEATH`) as permission denied with
/// this message; nothing else it returns says so.
pub(crate) fn is_escape(error: &io::Error) -> bool {
    error.kind() == io::ErrorKind::PermissionDenied
        && error.raw_os_error().is_none()
        && error.to_string().contains("outside of the filesystem")
}

/// Whether `error` says a symbolic link was met where none may be: the
/// last component, opened without following links, became one after the
/// check.
pub(crate) fn is_link_in_the_way(error: &io::Error) -> bool {
    error.raw_os_error() == Some(nix::libc::ELOOP)
}

/// `relative` for cap-std: the root itself is `.`.
pub(crate) fn dot_if_empty(relative: &Path) -> &Path {
    if relative.as_os_str().is_empty() { Path::new(".") } else { relative }
}

/// The directory that holds `relative` (below `root`), opened without
/// following a link in its last component, and the name of the entry in it;
/// missing directories are created first when `create` is set. `None` when
/// `relative` names the root itself.
pub(crate) fn open_parent(root: &Dir, relative: &Path, create: bool) -> io::Result<Option<(Dir, OsString)>> {
    let (Some(parent), Some(name)) = (relative.parent(), relative.file_name()) else {
        return Ok(None);
    };
    if create && !parent.as_os_str().is_empty() {
        root.create_dir_all(parent)?;
    }
    Ok(Some((root.open_dir_nofollow(dot_if_empty(parent))?, name.to_os_string())))
}

/// Opens `name` in `dir` with `options`, refusing (`ELOOP`) to follow a
/// symbolic link that replaced it since it was checked.
pub(crate) fn open_no_follow(dir: &Dir, name: &Path, options: &mut OpenOptions) -> io::Result<File> {
    use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
    dir.open_with(name, options.follow(FollowSymlinks::No))
}

/// Replaces (or creates) `name` in `dir` with `bytes` atomically: writes a
/// new temporary file in `dir`, syncs it, gives it `permissions` (those of
/// the file it replaces), and renames it over `name`, so that a crash leaves
/// the old file or the new one, never half of one. The temporary file is
/// removed on any failure.
pub(crate) fn replace_atomically(
    dir: &Dir,
    name: &OsStr,
    bytes: &[u8],
    permissions: Option<Permissions>,
) -> io::Result<()> {
    let (temp_name, mut file) = create_temp(dir, name)?;
    let written = (|| {
        file.write_all(bytes)?;
        if let Some(permissions) = permissions {
            file.set_permissions(permissions)?;
        }
        file.sync_all()?;
        drop(file);
        dir.rename(&temp_name, dir, name)
    })();
    if let Err(error) = written {
        let _ = dir.remove_file(&temp_name);
        return Err(error);
    }
    // Make the rename itself durable; a failure here loses nothing already visible.
    if let Ok(directory) = dir.try_clone() {
        let _ = directory.into_std_file().sync_all();
    }
    Ok(())
}

/// A new, uniquely named file in `dir` (`create_new`, so an existing file or
/// link of that name is never opened).
fn create_temp(dir: &Dir, name: &OsStr) -> io::Result<(OsString, File)> {
    // A short prefix of the target's name helps a person recognize leftovers
    // of a crash without risking a name longer than the file system allows.
    let stem: String = name.to_string_lossy().chars().take(32).collect();
    // A random part (122 bits) keeps concurrent writes apart without any
    // process-wide counter; `create_new` settles the unlikely collision.
    let candidates = std::iter::repeat_with(|| {
        let mut temp_name = OsString::from(".");
        temp_name.push(&stem);
        temp_name.push(format!(".{}.{}.goondan-tmp", std::process::id(), goondan_core::ids::new_trace_id()));
        temp_name
    });
    create_first_new(dir, candidates.take(16))
}

/// Creates the first of `names` in `dir` that does not exist yet.
fn create_first_new(dir: &Dir, names: impl Iterator<Item = OsString>) -> io::Result<(OsString, File)> {
    let mut last_error = None;
    for name in names {
        match dir.open_with(&name, OpenOptions::new().write(true).create_new(true)) {
            Ok(file) => return Ok((name, file)),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => last_error = Some(error),
            Err(error) => return Err(error),
        }
    }
    Err(last_error.unwrap_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists)))
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::symlink;

    use super::*;
    use crate::test_support::{names, workdir};

    fn root(path: &Path) -> Dir {
        open_root(path).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn replaces_atomically_and_leaves_no_temporary_file() {
        let dir = workdir();
        let cap = root(&dir.path);
        replace_atomically(&cap, OsStr::new("a.txt"), b"first", None).unwrap_or_else(|e| panic!("{e}"));
        replace_atomically(&cap, OsStr::new("a.txt"), b"2nd", None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fs::read(dir.path.join("a.txt")).ok(), Some(b"2nd".to_vec()));
        assert_eq!(names(&dir.path), ["a.txt"]);
        // A directory in the way: nothing is left behind.
        fs::create_dir(dir.path.join("d")).unwrap_or_else(|e| panic!("{e}"));
        fs::write(dir.path.join("d/x"), "x").unwrap_or_else(|e| panic!("{e}"));
        assert!(replace_atomically(&cap, OsStr::new("d"), b"x", None).is_err());
        assert_eq!(names(&dir.path), ["a.txt", "d"]);
    }

    #[test]
    fn temporary_files_never_open_an_existing_link() {
        let (dir, outside) = (workdir(), workdir());
        let cap = root(&dir.path);
        let victim = outside.path.join("victim.txt");
        fs::write(&victim, "untouched").unwrap_or_else(|e| panic!("{e}"));
        symlink(&victim, dir.path.join(".taken")).unwrap_or_else(|e| panic!("{e}"));
        let names = [".taken", ".free"].map(OsString::from).into_iter();
        let (temp, mut file) = create_first_new(&cap, names).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(temp, OsString::from(".free"));
        file.write_all(b"new").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fs::read_to_string(&victim).ok().as_deref(), Some("untouched"));
        let only_taken = [".taken"].map(OsString::from).into_iter();
        let failed = create_first_new(&cap, only_taken).err().map(|e| e.kind());
        assert_eq!(failed, Some(io::ErrorKind::AlreadyExists));
        let (temp, _file) = create_temp(&cap, OsStr::new("x.txt")).unwrap_or_else(|e| panic!("{e}"));
        assert!(temp.to_string_lossy().ends_with(".goondan-tmp"), "{temp:?}");
    }

    #[test]
    fn opening_without_following_refuses_a_link() {
        let (dir, outside) = (workdir(), workdir());
        let cap = root(&dir.path);
        let victim = outside.path.join("victim.txt");
        fs::write(&victim, "untouched").unwrap_or_else(|e| panic!("{e}"));
        symlink(&victim, dir.path.join("log.txt")).unwrap_or_else(|e| panic!("{e}"));
        let opened = open_no_follow(&cap, Path::new("log.txt"), OpenOptions::new().append(true).create(true));
        assert!(opened.is_err());
        assert!(open_no_follow(&cap, Path::new("log.txt"), OpenOptions::new().read(true)).is_err());
        assert_eq!(fs::read_to_string(&victim).ok().as_deref(), Some("untouched"));
        let plain = open_no_follow(&cap, Path::new("plain.txt"), OpenOptions::new().append(true).create(true));
        assert!(plain.is_ok());
    }

    #[test]
    fn nothing_leads_outside_the_root() {
        let (dir, outside) = (workdir(), workdir());
        let cap = root(&dir.path);
        fs::write(outside.path.join("secret.txt"), "secret").unwrap_or_else(|e| panic!("{e}"));
        symlink(&outside.path, dir.path.join("link")).unwrap_or_else(|e| panic!("{e}"));
        let read = cap.open(Path::new("link/secret.txt")).err();
        assert!(read.as_ref().is_some_and(is_escape), "{read:?}");
        let created = open_parent(&cap, Path::new("link/c/new.txt"), true).err();
        assert!(created.as_ref().is_some_and(is_escape), "{created:?}");
        assert_eq!(names(&outside.path), ["secret.txt"]);
        // Inside, parents are created and opened.
        let opened = open_parent(&cap, Path::new("a/b/new.txt"), true).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(opened.map(|(_, name)| name), Some(OsString::from("new.txt")));
        assert!(open_parent(&cap, Path::new(""), true).is_ok_and(|parent| parent.is_none()));
        // A real permission error is not an escape.
        assert!(!is_escape(&io::Error::from(io::ErrorKind::PermissionDenied)));
    }

    #[tokio::test]
    async fn blocking_work_runs_on_the_blocking_pool() {
        assert_eq!(run_blocking(|| 2 + 2).await.ok(), Some(4));
    }
}
