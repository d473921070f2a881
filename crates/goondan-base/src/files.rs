//! File writes shared by `file-system`'s `write` and the `savePath` of the
//! chat tools' downloads, and running such blocking work off the runtime's
//! threads.
//!
//! Paths given here are real paths checked by
//! [`crate::paths::resolve_confined`]; these functions keep them so while
//! they work: new directories are checked for links that appeared on the
//! way, temporary files are created with `O_CREAT | O_EXCL` (an existing
//! file or link of that name is never opened), and files are opened without
//! following a link in their last component.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

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

/// Opens the real path `path` with `options`, refusing (`ELOOP`) to follow a
/// symbolic link that replaced its last component since it was checked.
pub(crate) fn open_no_follow(path: &Path, options: &mut OpenOptions) -> io::Result<File> {
    options.custom_flags(nix::libc::O_NOFOLLOW).open(path)
}

/// Creates `dir` and its missing ancestors. `Ok(false)` when `dir` is no
/// longer a real path afterwards: a symbolic link appeared on the way
/// meanwhile, and the caller must not write there.
pub(crate) fn create_real_dir_all(dir: &Path) -> io::Result<bool> {
    fs::create_dir_all(dir)?;
    Ok(fs::canonicalize(dir).ok().as_deref() == Some(dir))
}

/// Distinguishes the temporary files of concurrent writes in one process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Replaces (or creates) `target` with `bytes` atomically: writes a new
/// temporary file in the same directory, syncs it, gives it `permissions`
/// (those of the file it replaces), and renames it over `target`, so that a
/// crash leaves the old file or the new one, never half of one. The
/// temporary file is removed on any failure.
pub(crate) fn replace_atomically(target: &Path, bytes: &[u8], permissions: Option<fs::Permissions>) -> io::Result<()> {
    let (Some(dir), Some(name)) = (target.parent(), target.file_name()) else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"));
    };
    let (temp_path, mut file) = create_temp(dir, name)?;
    let written = (|| {
        file.write_all(bytes)?;
        if let Some(permissions) = permissions {
            file.set_permissions(permissions)?;
        }
        file.sync_all()?;
        drop(file);
        fs::rename(&temp_path, target)
    })();
    if let Err(error) = written {
        let _ = fs::remove_file(&temp_path);
        return Err(error);
    }
    // Make the rename itself durable; a failure here loses nothing already visible.
    if let Ok(directory) = File::open(dir) {
        let _ = directory.sync_all();
    }
    Ok(())
}

/// A new, uniquely named file in `dir` (`create_new`, so an existing file or
/// link of that name is never opened).
fn create_temp(dir: &Path, name: &OsStr) -> io::Result<(PathBuf, File)> {
    // A short prefix of the target's name helps a person recognize leftovers
    // of a crash without risking a name longer than the file system allows.
    let stem: String = name.to_string_lossy().chars().take(32).collect();
    let candidates = std::iter::repeat_with(|| {
        let sequence = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let mut temp_name = OsString::from(".");
        temp_name.push(&stem);
        temp_name.push(format!(".{}.{sequence}.{nanos:x}.goondan-tmp", std::process::id()));
        temp_name
    });
    create_first_new(dir, candidates.take(16))
}

/// Creates the first of `names` in `dir` that does not exist yet.
fn create_first_new(dir: &Path, names: impl Iterator<Item = OsString>) -> io::Result<(PathBuf, File)> {
    let mut last_error = None;
    for name in names {
        let path = dir.join(name);
        match OpenOptions::new().write(true).create_new(true).open(&path) {
            Ok(file) => return Ok((path, file)),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => last_error = Some(error),
            Err(error) => return Err(error),
        }
    }
    Err(last_error.unwrap_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists)))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;
    use crate::test_support::{names, workdir};

    #[test]
    fn replaces_atomically_and_leaves_no_temporary_file() {
        let dir = workdir();
        let target = dir.path.join("a.txt");
        replace_atomically(&target, b"first", None).unwrap_or_else(|e| panic!("{e}"));
        replace_atomically(&target, b"2nd", None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fs::read(&target).ok(), Some(b"2nd".to_vec()));
        assert_eq!(names(&dir.path), ["a.txt"]);
        // A directory in the way: nothing is left behind.
        fs::create_dir(dir.path.join("d")).unwrap_or_else(|e| panic!("{e}"));
        assert!(replace_atomically(&dir.path.join("d"), b"x", None).is_err());
        assert_eq!(names(&dir.path), ["a.txt", "d"]);
        assert!(replace_atomically(Path::new("/"), b"x", None).is_err());
    }

    #[test]
    fn temporary_files_never_open_an_existing_link() {
        let (dir, outside) = (workdir(), workdir());
        let victim = outside.path.join("victim.txt");
        fs::write(&victim, "untouched").unwrap_or_else(|e| panic!("{e}"));
        symlink(&victim, dir.path.join(".taken")).unwrap_or_else(|e| panic!("{e}"));
        let names = [".taken", ".free"].map(OsString::from).into_iter();
        let (temp, mut file) = create_first_new(&dir.path, names).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(temp, dir.path.join(".free"));
        file.write_all(b"new").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(fs::read_to_string(&victim).ok().as_deref(), Some("untouched"));
        let only_taken = [".taken"].map(OsString::from).into_iter();
        let failed = create_first_new(&dir.path, only_taken).err().map(|e| e.kind());
        assert_eq!(failed, Some(io::ErrorKind::AlreadyExists));
        let (temp, _file) = create_temp(&dir.path, OsStr::new("x.txt")).unwrap_or_else(|e| panic!("{e}"));
        assert!(temp.starts_with(&dir.path) && temp.to_string_lossy().ends_with(".goondan-tmp"), "{temp:?}");
    }

    #[test]
    fn opening_without_following_refuses_a_link() {
        let (dir, outside) = (workdir(), workdir());
        let victim = outside.path.join("victim.txt");
        fs::write(&victim, "untouched").unwrap_or_else(|e| panic!("{e}"));
        let link = dir.path.join("log.txt");
        symlink(&victim, &link).unwrap_or_else(|e| panic!("{e}"));
        let opened = open_no_follow(&link, OpenOptions::new().append(true).create(true));
        assert!(opened.is_err());
        assert!(open_no_follow(&link, OpenOptions::new().read(true)).is_err());
        assert_eq!(fs::read_to_string(&victim).ok().as_deref(), Some("untouched"));
        let plain = dir.path.join("plain.txt");
        assert!(open_no_follow(&plain, OpenOptions::new().append(true).create(true)).is_ok());
    }

    #[test]
    fn new_directories_are_checked_for_links() {
        let (dir, outside) = (workdir(), workdir());
        assert_eq!(create_real_dir_all(&dir.path.join("a/b")).ok(), Some(true));
        symlink(&outside.path, dir.path.join("link")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(create_real_dir_all(&dir.path.join("link/c")).ok(), Some(false));
    }

    #[tokio::test]
    async fn blocking_work_runs_on_the_blocking_pool() {
        assert_eq!(run_blocking(|| 2 + 2).await.ok(), Some(4));
    }
}
