//! Reading the files a bundle names, within bounds.
//!
//! Two rules, shared by the loader, validation and the runtime (which reads
//! `prompt.systemRef` when it builds an agent):
//!
//! - [`read_regular_file`] reads only regular files, and at most a cap. The
//!   file type is checked with `metadata` *before* opening, because opening
//!   a FIFO for reading blocks until a writer appears (`-c` on a named pipe
//!   would hang), and a character device such as `/dev/zero` never ends (a
//!   plain `read` would grow without bound). The open file is checked again
//!   (`fstat`) and read through `take(cap + 1)`, so even a file that changes
//!   under us cannot make the read exceed the cap.
//! - [`resolve_inside`] keeps a reference (`systemRef`, `spec.entry`) inside
//!   the bundle directory: it must be relative, must not climb out with
//!   `..`, and must still be inside once symbolic links are followed.
//!   `systemRef: ../../../etc/passwd` would otherwise be read and sent to a
//!   model provider as the system prompt.

use std::fs::{File, Metadata};
use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};

/// Why a file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FileReadError {
    /// The file does not exist (or a parent is not a directory).
    #[error("cannot read {}: {source}", path.display())]
    NotFound {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Not a regular file: a directory, FIFO, device or socket.
    #[error("{} is {kind}, not a regular file", path.display())]
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What it is instead, e.g. `a FIFO (named pipe)`.
        kind: &'static str,
    },
    /// Longer than the cap.
    #[error("{} is larger than the limit of {limit} bytes", path.display())]
    TooLarge {
        /// The path.
        path: PathBuf,
        /// The cap, in bytes.
        limit: u64,
    },
    /// Any other I/O failure.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// Reads the regular file at `path` (symbolic links followed), refusing
/// anything else and anything longer than `cap` bytes; see the module docs.
pub fn read_regular_file(path: &Path, cap: u64) -> Result<Vec<u8>, FileReadError> {
    let io_error = |source: io::Error| {
        if source.kind() == io::ErrorKind::NotFound {
            FileReadError::NotFound { path: path.to_path_buf(), source }
        } else {
            FileReadError::Io { path: path.to_path_buf(), source }
        }
    };
    // Before opening: opening a FIFO blocks.
    let metadata = std::fs::metadata(path).map_err(io_error)?;
    check_regular(path, &metadata, cap)?;
    let file = File::open(path).map_err(io_error)?;
    // The path may have been replaced between the check and the open.
    let metadata = file.metadata().map_err(io_error)?;
    check_regular(path, &metadata, cap)?;
    let mut bytes = Vec::with_capacity(usize::try_from(metadata.len().min(cap)).unwrap_or(0));
    file.take(cap.saturating_add(1)).read_to_end(&mut bytes).map_err(io_error)?;
    if u64::try_from(bytes.len()).unwrap_or(u64::MAX) > cap {
        return Err(FileReadError::TooLarge { path: path.to_path_buf(), limit: cap });
    }
    Ok(bytes)
}

fn check_regular(path: &Path, metadata: &Metadata, cap: u64) -> Result<(), FileReadError> {
    if !metadata.is_file() {
        return Err(FileReadError::NotRegular { path: path.to_path_buf(), kind: describe_kind(metadata) });
    }
    if metadata.len() > cap {
        return Err(FileReadError::TooLarge { path: path.to_path_buf(), limit: cap });
    }
    Ok(())
}

/// What a non-regular file is, in words for a diagnostic.
pub fn describe_kind(metadata: &Metadata) -> &'static str {
    let kind = metadata.file_type();
    if kind.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if kind.is_char_device() {
            return "a character device";
        }
        if kind.is_block_device() {
            return "a block device";
        }
        if kind.is_socket() {
            return "a socket";
        }
    }
    "not a regular file"
}

/// Why a reference does not name a file inside the bundle.
#[derive(Debug, thiserror::Error)]
pub enum BundlePathError {
    /// An absolute path.
    #[error("'{reference}' is an absolute path; bundle files are named relative to the bundle directory")]
    Absolute {
        /// The reference as written.
        reference: String,
    },
    /// `..` climbs out of the bundle directory.
    #[error("'{reference}' leads outside the bundle directory")]
    Escapes {
        /// The reference as written.
        reference: String,
    },
    /// Inside lexically, but a symbolic link leads outside.
    #[error("'{reference}' resolves to {}, outside the bundle directory {}", resolved.display(), root.display())]
    LinkOutside {
        /// The reference as written.
        reference: String,
        /// Where the links lead.
        resolved: PathBuf,
        /// The bundle directory, links followed.
        root: PathBuf,
    },
    /// The file does not exist (looked for `path`).
    #[error("'{reference}' does not exist (looked for {})", path.display())]
    NotFound {
        /// The reference as written.
        reference: String,
        /// Where it was looked for.
        path: PathBuf,
    },
    /// The bundle directory or the file cannot be inspected.
    #[error("cannot resolve '{reference}': {source}")]
    Io {
        /// The reference as written.
        reference: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

impl BundlePathError {
    /// Whether the reference is refused for leaving the bundle (as opposed
    /// to naming a file that is missing or unreadable).
    pub fn is_outside(&self) -> bool {
        matches!(self, Self::Absolute { .. } | Self::Escapes { .. } | Self::LinkOutside { .. })
    }
}

/// The file `reference` names under `root`, with symbolic links followed,
/// if it stays inside `root` (see the module docs).
pub fn resolve_inside(root: &Path, reference: &str) -> Result<PathBuf, BundlePathError> {
    let relative = Path::new(reference);
    let mut depth = 0_usize;
    for component in relative.components() {
        match component {
            Component::Prefix(_) | Component::RootDir => {
                return Err(BundlePathError::Absolute { reference: reference.to_owned() });
            }
            Component::CurDir => {}
            Component::ParentDir => {
                depth =
                    depth.checked_sub(1).ok_or_else(|| BundlePathError::Escapes { reference: reference.to_owned() })?;
            }
            Component::Normal(_) => depth += 1,
        }
    }
    let full = root.join(relative);
    let io = |source: io::Error| BundlePathError::Io { reference: reference.to_owned(), source };
    let canonical_root = root.canonicalize().map_err(io)?;
    let resolved = match full.canonicalize() {
        Ok(resolved) => resolved,
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            return Err(BundlePathError::NotFound { reference: reference.to_owned(), path: full });
        }
        Err(error) => return Err(io(error)),
    };
    if !resolved.starts_with(&canonical_root) {
        return Err(BundlePathError::LinkOutside { reference: reference.to_owned(), resolved, root: canonical_root });
    }
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_stay_inside_the_bundle() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let root = dir.path().join("bundle");
        std::fs::create_dir_all(root.join("prompts")).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(root.join("prompts/a.md"), "hi").unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.path().join("secret"), "s").unwrap_or_else(|e| panic!("{e}"));
        assert!(resolve_inside(&root, "prompts/a.md").is_ok());
        assert!(resolve_inside(&root, "./prompts/../prompts/a.md").is_ok());
        assert!(matches!(resolve_inside(&root, "../secret"), Err(BundlePathError::Escapes { .. })));
        assert!(matches!(resolve_inside(&root, "prompts/../../secret"), Err(BundlePathError::Escapes { .. })));
        let absolute = dir.path().join("secret").to_string_lossy().into_owned();
        assert!(matches!(resolve_inside(&root, &absolute), Err(BundlePathError::Absolute { .. })));
        assert!(matches!(resolve_inside(&root, "nope.md"), Err(BundlePathError::NotFound { .. })));
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(dir.path().join("secret"), root.join("link")).unwrap_or_else(|e| panic!("{e}"));
            let refused = resolve_inside(&root, "link");
            assert!(matches!(&refused, Err(BundlePathError::LinkOutside { .. })), "{refused:?}");
            assert!(refused.err().is_some_and(|e| e.is_outside()));
        }
    }

    #[test]
    fn reads_are_capped_and_only_of_regular_files() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let file = dir.path().join("f");
        std::fs::write(&file, "12345").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(read_regular_file(&file, 5).ok(), Some(b"12345".to_vec()));
        assert!(matches!(read_regular_file(&file, 4), Err(FileReadError::TooLarge { limit: 4, .. })));
        assert!(matches!(read_regular_file(dir.path(), 4), Err(FileReadError::NotRegular { kind: "a directory", .. })));
        assert!(matches!(read_regular_file(&dir.path().join("none"), 4), Err(FileReadError::NotFound { .. })));
        #[cfg(unix)]
        {
            let zero = read_regular_file(Path::new("/dev/zero"), 4);
            assert!(matches!(zero, Err(FileReadError::NotRegular { kind: "a character device", .. })), "{zero:?}");
        }
    }
}
