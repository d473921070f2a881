//! The files under the state root: private modes (0700 directories, 0600
//! files), JSON metadata read bounded and replaced atomically, directory syncs.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::LOG_TARGET;
use super::error::StoreError;

/// The mode of every directory under the state root (and of the root): the user's only.
pub const PRIVATE_DIR_MODE: u32 = 0o700;
/// The mode of every file under the state root.
pub const PRIVATE_FILE_MODE: u32 = 0o600;

/// Creates `dir` and whatever parents are missing, each new one with mode
/// [`PRIVATE_DIR_MODE`] (the umask can only narrow it); an existing
/// directory is left as it is. For every directory under the state root.
pub fn create_private_dir_all(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new().recursive(true).mode(PRIVATE_DIR_MODE).create(dir)
}

/// Options whose new file gets mode [`PRIVATE_FILE_MODE`] (nothing is
/// set: read, write, create are the caller's). For every file under the
/// state root.
pub fn private_file() -> OpenOptions {
    let mut options = OpenOptions::new();
    options.mode(PRIVATE_FILE_MODE);
    options
}

/// Whether `path` is a directory itself (not a link to one).
pub(super) fn is_real_dir(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|metadata| metadata.is_dir())
}

/// The directories in `dir` (none if it does not exist).
pub(super) fn sub_dirs(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(StoreError::io("listing", dir)(error)),
    };
    let mut dirs = Vec::new();
    for entry in entries {
        match entry {
            Ok(entry) if entry.file_type().is_ok_and(|kind| kind.is_dir()) => dirs.push(entry.path()),
            Ok(_) => {}
            Err(error) => tracing::warn!(target: LOG_TARGET, "listing {}: {error}", dir.display()),
        }
    }
    dirs.sort();
    Ok(dirs)
}

/// A JSON file, or `None` if it does not exist. Metadata files are small;
/// a bigger one is not ours to read whole.
pub(super) fn read_json<T: serde::de::DeserializeOwned>(
    path: &Path,
    op: &'static str,
) -> Result<Option<T>, StoreError> {
    const MAX_METADATA_BYTES: u64 = 1 << 20;
    let mut bytes = Vec::new();
    match File::open(path).and_then(|file| file.take(MAX_METADATA_BYTES).read_to_end(&mut bytes)) {
        Ok(_) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(StoreError::io(op, path)(error)),
    }
    serde_json::from_slice(&bytes).map(Some).map_err(StoreError::json(op, path))
}

/// Replaces `path` (in `dir`) with `value` as pretty JSON: a temp file
/// beside it, synced, renamed over it.
pub(super) fn write_json_atomically<T: Serialize>(dir: &Path, path: &Path, value: &T) -> Result<(), StoreError> {
    let name = path.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written =
        write_synced(&temp, value).and_then(|()| fs::rename(&temp, path).map_err(StoreError::io("replacing", path)));
    if written.is_err() {
        // Best effort: the temp file is garbage now.
        let _ = fs::remove_file(&temp);
    }
    written
}

/// Writes `value` as pretty JSON to a new file at `path` and syncs it.
pub(super) fn write_synced<T: Serialize>(path: &Path, value: &T) -> Result<(), StoreError> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(StoreError::json("serializing", path))?;
    bytes.push(b'\n');
    private_file()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .and_then(|mut file| {
            file.write_all(&bytes)?;
            file.sync_all()
        })
        .map_err(StoreError::io("writing", path))
}

/// Syncs a directory so that entries created, renamed or removed in it
/// survive a crash. Best effort: not every platform can open a directory.
pub(crate) fn sync_dir(dir: &Path) {
    #[cfg(unix)]
    if let Err(error) = File::open(dir).and_then(|dir| dir.sync_all()) {
        tracing::debug!(target: LOG_TARGET, "syncing the directory {}: {error}", dir.display());
    }
    #[cfg(not(unix))]
    let _ = dir;
}
