//! Package tarballs as npm writes them: a gzip tar archive whose entries
//! sit under `package/`.
//!
//! [`pack`] is deterministic — entries sorted by path, mtime, owner and
//! permissions normalised, no directory entries — so the same tree always
//! gives the same bytes (and the same [`integrity`]). What goes in is the
//! `files` list when there is one, else everything the ignore file
//! (`.goondanignore`, else `.npmignore`) leaves; `.env*` files, `.git`,
//! `node_modules` and the paths the caller excludes (a state root) never go
//! in, whatever the lists say.
//!
//! [`unpack`] checks the `sha512-…` integrity before reading anything,
//! refuses absolute paths, `..`, links leading out of the package (followed
//! through the archive's other links, once all are there), writes through
//! links, and device files (naming the entry), strips the first
//! path component (`package/`, as `tar --strip-components=1` in the
//! original), and unpacks into a temporary directory beside the
//! destination that is renamed into place with its [`INTEGRITY_MARKER`]
//! already inside: a destination that exists is a whole install, and two
//! installs of one package at once never see each other's half-written
//! files.

use std::collections::BTreeSet;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

use base64::Engine as _;
use sha2::Digest as _;

/// The mtime of every entry: npm's fixed date (1985-10-26T08:15:00Z), so a
/// tarball does not change with the files' times.
const FIXED_MTIME: u64 = 499_162_500;

/// What an archive may unpack to at most: a gzip bomb stops here.
const MAX_UNPACKED_BYTES: u64 = 1 << 30;

/// Names never packed, at any depth (a directory's whole tree with it).
const NEVER_PACKED_DIRS: &[&str] = &[".git", "node_modules"];

/// Files npm leaves out by default, kept out here too.
const DEFAULT_IGNORED: &[&str] = &[".npmrc", ".npmignore", ".goondanignore", ".gitignore", ".DS_Store"];

/// What [`pack`] takes from a package directory.
#[derive(Debug, Clone, Default)]
pub struct PackOptions {
    /// The `files` list (paths or globs, `dir` meaning everything under
    /// it, `!pattern` taking out again); `None` packs everything the
    /// ignore file leaves. `goondan.yaml`, `package.json`, `README*` and
    /// `LICENSE*` at the root are always packed, as npm does.
    pub files: Option<Vec<String>>,
    /// Paths never packed (a state root inside the package, say); absolute
    /// or relative to the package directory.
    pub exclude: Vec<PathBuf>,
}

/// How [`unpack`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unpacked {
    /// The destination was made from this tarball.
    Created,
    /// The destination already recorded this integrity (an earlier
    /// install, or another one that got there first): left as it was.
    AlreadyPresent,
    /// The destination held something else (another integrity, or no
    /// marker): replaced by this tarball's files.
    Replaced,
}

/// Why an entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnsafeReason {
    #[error("an absolute path")]
    Absolute,
    #[error("a `..` component")]
    ParentDir,
    #[error("a backslash in the path")]
    Backslash,
    #[error("a link to {target:?}, outside the package")]
    LinkOutside { target: String },
    #[error("a link to {target:?}, which is no file unpacked before it")]
    MissingLinkTarget { target: String },
    #[error("a device file or FIFO")]
    Device,
    #[error("an entry of a kind not unpacked ({kind})")]
    Unsupported { kind: String },
    #[error("a path through a symbolic link of the archive")]
    ThroughLink,
    #[error("a link over a path the archive already holds")]
    Duplicate,
}

/// Packing or unpacking failed.
#[derive(Debug, thiserror::Error)]
pub enum TarballError {
    #[error("integrity mismatch: expected {expected}, the tarball has {actual}")]
    IntegrityMismatch { expected: String, actual: String },
    #[error("integrity {0:?} is not of the form sha512-<base64>")]
    UnsupportedIntegrity(String),
    #[error("tarball entry {entry:?} refused: {reason}")]
    UnsafeEntry { entry: String, reason: UnsafeReason },
    #[error("not a gzip tar archive: {0}")]
    Corrupt(std::io::Error),
    #[error("the tarball unpacks to more than {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("{}: a file name that is not UTF-8", .0.display())]
    NonUtf8Path(PathBuf),
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
}

fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> TarballError + '_ {
    move |source| TarballError::Io { path: path.to_path_buf(), source }
}

/// npm's integrity of `bytes`: `sha512-<base64 of the SHA-512>`.
pub fn integrity(bytes: &[u8]) -> String {
    format!("sha512-{}", base64::engine::general_purpose::STANDARD.encode(sha2::Sha512::digest(bytes)))
}

/// Checks `bytes` against an integrity string (SRI: space-separated
/// `algo-digest` entries; the `sha512` ones count, at least one must be
/// there, and one must match).
pub fn verify_integrity(bytes: &[u8], expected: &str) -> Result<(), TarballError> {
    let actual = integrity(bytes);
    let sha512: Vec<&str> = expected
        .split_whitespace()
        .filter(|entry| entry.starts_with("sha512-"))
        // `?options` may follow a digest in SRI.
        .map(|entry| entry.split('?').next().unwrap_or(entry))
        .collect();
    if sha512.is_empty() {
        return Err(TarballError::UnsupportedIntegrity(expected.to_owned()));
    }
    if sha512.contains(&actual.as_str()) {
        Ok(())
    } else {
        Err(TarballError::IntegrityMismatch { expected: expected.to_owned(), actual })
    }
}

/// The paths [`pack`] would put in the tarball (relative, `/`-separated,
/// sorted), without `package/`.
pub fn packed_paths(dir: &Path, options: &PackOptions) -> Result<Vec<String>, TarballError> {
    let excluded: Vec<PathBuf> =
        options.exclude.iter().map(|path| if path.is_absolute() { path.clone() } else { dir.join(path) }).collect();
    let mut all = Vec::new();
    walk(dir, dir, &excluded, &mut all)?;
    let select = Selection::new(dir, options)?;
    let mut chosen: Vec<String> = all.into_iter().filter(|path| select.includes(path)).collect();
    chosen.sort();
    Ok(chosen)
}

/// Packs `dir` into a gzip tarball with entries under `package/`; the same
/// tree gives the same bytes.
pub fn pack(dir: &Path, options: &PackOptions) -> Result<Vec<u8>, TarballError> {
    let paths = packed_paths(dir, options)?;
    let encoder = flate2::GzBuilder::new().write(Vec::new(), flate2::Compression::default());
    let mut builder = tar::Builder::new(encoder);
    for relative in &paths {
        let path = dir.join(relative);
        let file = std::fs::File::open(&path).map_err(io_at(&path))?;
        let metadata = file.metadata().map_err(io_at(&path))?;
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_size(metadata.len());
        header.set_mode(if is_executable(&metadata) { 0o755 } else { 0o644 });
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(FIXED_MTIME);
        builder.append_data(&mut header, format!("package/{relative}"), file).map_err(io_at(&path))?;
    }
    let encoder = builder.into_inner().map_err(io_at(dir))?;
    encoder.finish().map_err(io_at(dir))
}

#[cfg(unix)]
fn is_executable(metadata: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    metadata.permissions().mode() & 0o111 != 0
}

#[cfg(not(unix))]
fn is_executable(_: &std::fs::Metadata) -> bool {
    false
}

/// Every regular file under `dir` (not following links), relative to
/// `root`, but what is never packed.
fn walk(root: &Path, dir: &Path, excluded: &[PathBuf], out: &mut Vec<String>) -> Result<(), TarballError> {
    let mut entries: Vec<std::fs::DirEntry> =
        std::fs::read_dir(dir).map_err(io_at(dir))?.collect::<Result<_, _>>().map_err(io_at(dir))?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for entry in entries {
        let path = entry.path();
        let name = entry.file_name();
        let Some(name) = name.to_str() else { return Err(TarballError::NonUtf8Path(path)) };
        let kind = entry.file_type().map_err(io_at(&path))?;
        if excluded.contains(&path) || name.starts_with(".env") {
            continue;
        }
        if kind.is_dir() {
            if !NEVER_PACKED_DIRS.contains(&name) {
                walk(root, &path, excluded, out)?;
            }
        } else if kind.is_file() {
            let relative = path.strip_prefix(root).unwrap_or(&path);
            let Some(relative) = relative.to_str() else { return Err(TarballError::NonUtf8Path(path)) };
            out.push(relative.replace(std::path::MAIN_SEPARATOR, "/"));
        } else {
            // Symbolic links and special files stay out: a package is its files.
            tracing::debug!("not packing {}: not a regular file", path.display());
        }
    }
    Ok(())
}

/// Which walked files go in: the `files` list, or the ignore file's rules.
enum Selection {
    Files(Vec<Rule>),
    Ignore(Vec<Rule>),
}

/// One line of an ignore file or of `files`.
#[derive(Debug)]
struct Rule {
    negated: bool,
    dir_only: bool,
    /// Matched against the whole path from the root (else: against each name).
    anchored: bool,
    segments: Vec<String>,
}

impl Rule {
    fn parse(line: &str, always_anchored: bool) -> Option<Self> {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let (negated, line) = match line.strip_prefix('!') {
            Some(rest) => (true, rest),
            None => (false, line),
        };
        let line = line.strip_prefix("./").unwrap_or(line);
        let dir_only = line.ends_with('/');
        let line = line.trim_end_matches('/');
        let anchored = always_anchored || line.trim_start_matches('/').contains('/') || line.starts_with('/');
        let line = line.trim_start_matches('/');
        if line.is_empty() {
            return None;
        }
        Some(Self { negated, dir_only, anchored, segments: line.split('/').map(str::to_owned).collect() })
    }

    /// Whether the rule names `path` or one of the directories above it.
    fn matches(&self, path: &[&str]) -> bool {
        let last = path.len();
        (1..=last).any(|end| {
            if self.dir_only && end == last {
                return false;
            }
            if self.anchored {
                glob_segments(&self.segments, &path[..end])
            } else {
                self.segments.len() == 1 && glob_segment(&self.segments[0], path[end - 1])
            }
        })
    }
}

impl Selection {
    fn new(dir: &Path, options: &PackOptions) -> Result<Self, TarballError> {
        if let Some(files) = &options.files {
            return Ok(Self::Files(files.iter().filter_map(|line| Rule::parse(line, true)).collect()));
        }
        for name in [".goondanignore", ".npmignore"] {
            let path = dir.join(name);
            match std::fs::read_to_string(&path) {
                Ok(text) => {
                    return Ok(Self::Ignore(text.lines().filter_map(|line| Rule::parse(line, false)).collect()));
                }
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(TarballError::Io { path, source: error }),
            }
        }
        Ok(Self::Ignore(Vec::new()))
    }

    fn includes(&self, path: &str) -> bool {
        let segments: Vec<&str> = path.split('/').collect();
        if segments.len() == 1 && DEFAULT_IGNORED.contains(&path) {
            return false;
        }
        // The last rule that names the path decides, as in .gitignore.
        let decided = |rules: &[Rule]| rules.iter().rev().find(|rule| rule.matches(&segments)).map(|rule| rule.negated);
        match self {
            Self::Files(rules) => always_packed(path) || decided(rules) == Some(false),
            Self::Ignore(rules) => decided(rules) != Some(false),
        }
    }
}

/// Root files npm packs whatever `files` says.
fn always_packed(path: &str) -> bool {
    let upper = path.to_ascii_uppercase();
    path == "goondan.yaml"
        || path == "package.json"
        || (!path.contains('/') && ["README", "LICENSE", "LICENCE"].iter().any(|p| upper.starts_with(p)))
}

/// A glob of `/`-separated segments (`**` any number of them) against a path.
fn glob_segments(pattern: &[String], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((first, rest)) if first == "**" => (0..=path.len()).any(|skip| glob_segments(rest, &path[skip..])),
        Some((first, rest)) => {
            path.split_first().is_some_and(|(name, tail)| glob_segment(first, name) && glob_segments(rest, tail))
        }
    }
}

/// One segment's glob: `*` any run of characters, `?` one.
fn glob_segment(pattern: &str, name: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let name: Vec<char> = name.chars().collect();
    let (mut p, mut n) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while n < name.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, n));
                p += 1;
            }
            Some(c) if *c == '?' || *c == name[n] => {
                p += 1;
                n += 1;
            }
            _ => match star {
                Some((star_p, star_n)) => {
                    p = star_p + 1;
                    n = star_n + 1;
                    star = Some((star_p, star_n + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|c| *c == '*')
}

/// The file in an unpacked package recording the integrity it was made
/// from: written inside the tree before the tree is renamed into place, so
/// a destination that exists is a whole install, marker included.
pub const INTEGRITY_MARKER: &str = goondan_core::package_dir::INSTALL_MARKER;

/// The integrity an unpacked package at `dest` records (`None`: no
/// package there, or not one [`unpack`] made).
pub fn recorded_integrity(dest: &Path) -> Option<String> {
    std::fs::read_to_string(dest.join(INTEGRITY_MARKER)).ok().map(|text| text.trim().to_owned())
}

/// Checks `bytes` against `expected_integrity`, then makes `dest` hold
/// exactly this tarball's files and an [`INTEGRITY_MARKER`]. The contract:
///
/// - `dest` already recording this integrity is left as it is
///   ([`Unpacked::AlreadyPresent`]);
/// - anything else at `dest` (another integrity, no marker) is replaced
///   ([`Unpacked::Replaced`]): the new tree is made first, then the old
///   one moved aside and the new one renamed in;
/// - the tree is unpacked into a temporary directory beside `dest`
///   (`.<name>.unpacking-*`), synced with its marker, and renamed into
///   place in one step: `dest` is never seen half made, and a failure
///   (a full disk) or a crash leaves `dest` as it was.
///
/// Two unpacks of one tarball at once both end with it in place. What a
/// crash leaves beside `dest` is removed by [`remove_leftovers`].
pub fn unpack(bytes: &[u8], expected_integrity: &str, dest: &Path) -> Result<Unpacked, TarballError> {
    verify_integrity(bytes, expected_integrity)?;
    let expected = expected_integrity.trim();
    let already = |dest: &Path| recorded_integrity(dest).is_some_and(|recorded| recorded == expected);
    if already(dest) {
        return Ok(Unpacked::AlreadyPresent);
    }
    let parent = match dest.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(parent).map_err(io_at(parent))?;
    let name = dest.file_name().and_then(|name| name.to_str()).unwrap_or("package");
    let temp =
        tempfile::Builder::new().prefix(&format!(".{name}.unpacking-")).tempdir_in(parent).map_err(io_at(parent))?;
    unpack_into(bytes, temp.path())?;
    let marker = temp.path().join(INTEGRITY_MARKER);
    // The archive may hold a file of that name: the marker is ours.
    let _ = std::fs::remove_file(&marker);
    let mut file = create_file(&marker, false)?;
    file.write_all(expected.as_bytes()).map_err(io_at(&marker))?;
    file.sync_all().map_err(io_at(&marker))?;
    drop(file);
    sync_dir(temp.path());
    goondan_core::fault::after_write(goondan_core::fault::Point::PackageUnpack);
    let replaced = match std::fs::symlink_metadata(dest) {
        Ok(_) => {
            let aside = tempfile::Builder::new()
                .prefix(&format!(".{name}.stale-"))
                .tempdir_in(parent)
                .map_err(io_at(parent))?;
            match std::fs::rename(dest, aside.path().join("old")) {
                // Dropping `aside` (below, once the new tree is in) removes the old one.
                Ok(()) => Some(aside),
                // Another unpack moved it first.
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
                Err(source) => return Err(TarballError::Io { path: dest.to_path_buf(), source }),
            }
        }
        Err(_) => None,
    };
    match std::fs::rename(temp.path(), dest) {
        Ok(()) => {
            // The directory is the destination now: nothing to remove.
            let _ = temp.keep();
            sync_dir(parent);
            goondan_core::fault::after_write(goondan_core::fault::Point::PackageInstall);
            Ok(if replaced.is_some() { Unpacked::Replaced } else { Unpacked::Created })
        }
        // Another unpack of the same tarball renamed its copy first: kept.
        Err(_) if already(dest) => Ok(Unpacked::AlreadyPresent),
        Err(source) => {
            // The old tree goes back where it was rather than with `aside`.
            if let Some(aside) = &replaced {
                let _ = std::fs::rename(aside.path().join("old"), dest);
            }
            Err(TarballError::Io { path: dest.to_path_buf(), source })
        }
    }
}

/// Removes what unpacks into `dest` killed midway left beside it
/// (`.<name>.unpacking-*`, `.<name>.stale-*`). Only for a caller that
/// knows no other unpack into `dest` is running (it holds a lock): one
/// running would lose its temporary directory.
pub fn remove_leftovers(dest: &Path) -> Result<usize, TarballError> {
    let (Some(parent), Some(name)) = (dest.parent(), dest.file_name().and_then(|n| n.to_str())) else {
        return Ok(0);
    };
    let entries = match std::fs::read_dir(parent) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(source) => return Err(TarballError::Io { path: parent.to_path_buf(), source }),
    };
    let (unpacking, stale) = (format!(".{name}.unpacking-"), format!(".{name}.stale-"));
    let mut removed = 0;
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let file_name = file_name.to_string_lossy();
        if file_name.starts_with(&unpacking) || file_name.starts_with(&stale) {
            let path = entry.path();
            std::fs::remove_dir_all(&path).map_err(io_at(&path))?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// Makes a rename in `dir` durable (best effort: not every file system
/// syncs a directory).
pub(crate) fn sync_dir(dir: &Path) {
    if let Ok(handle) = std::fs::File::open(dir) {
        let _ = handle.sync_all();
    }
}

/// Unpacks every entry into `root` (a fresh directory), checking each.
fn unpack_into(bytes: &[u8], root: &Path) -> Result<(), TarballError> {
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bytes));
    let mut written: u64 = 0;
    // Each symbolic link made (entry name, path, target), checked again at
    // the end: a later link can change where an earlier one leads.
    let mut links: Vec<(String, Vec<String>, String)> = Vec::new();
    for entry in archive.entries().map_err(TarballError::Corrupt)? {
        let mut entry = entry.map_err(TarballError::Corrupt)?;
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let refuse = |reason| TarballError::UnsafeEntry { entry: name.clone(), reason };
        let kind = entry.header().entry_type();
        if kind.is_pax_global_extensions() || kind.is_pax_local_extensions() {
            continue;
        }
        let Some(relative) = inside_path(&name).map_err(&refuse)? else { continue };
        let dest = root.join(relative.join("/"));
        if through_link(root, &relative) {
            return Err(refuse(UnsafeReason::ThroughLink));
        }
        match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                if dest.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink()) {
                    return Err(refuse(UnsafeReason::ThroughLink));
                }
                make_parent(&dest)?;
                let executable = entry.header().mode().is_ok_and(|mode| mode & 0o111 != 0);
                let mut file = create_file(&dest, executable)?;
                let budget = MAX_UNPACKED_BYTES - written;
                let copied = std::io::copy(&mut (&mut entry).take(budget + 1), &mut file).map_err(|error| {
                    // The disk filling is the writer's failure, not the archive's.
                    if crate::is_disk_full(&error) {
                        TarballError::Io { path: dest.clone(), source: error }
                    } else {
                        TarballError::Corrupt(error)
                    }
                })?;
                if copied > budget {
                    return Err(TarballError::TooLarge { limit: MAX_UNPACKED_BYTES });
                }
                written += copied;
                file.flush().map_err(io_at(&dest))?;
                file.sync_all().map_err(io_at(&dest))?;
            }
            tar::EntryType::Directory => std::fs::create_dir_all(&dest).map_err(io_at(&dest))?,
            tar::EntryType::Symlink => {
                let target = link_name(&entry);
                let inside = !target.starts_with('/') && resolve_link(&relative, &target).is_some();
                if !inside {
                    return Err(refuse(UnsafeReason::LinkOutside { target }));
                }
                if dest.symlink_metadata().is_ok() {
                    return Err(refuse(UnsafeReason::Duplicate));
                }
                make_parent(&dest)?;
                make_symlink(&target, &dest)?;
                links.push((name.clone(), relative, target));
            }
            tar::EntryType::Link => {
                // A hard link's name is an archive path (`package/…`).
                let target = link_name(&entry);
                let source = match inside_path(&target) {
                    Ok(Some(source)) => source,
                    _ => return Err(refuse(UnsafeReason::LinkOutside { target })),
                };
                let source_path = root.join(source.join("/"));
                let is_file = source_path.symlink_metadata().is_ok_and(|m| m.file_type().is_file());
                if through_link(root, &source) || !is_file {
                    return Err(refuse(UnsafeReason::MissingLinkTarget { target }));
                }
                if dest.symlink_metadata().is_ok() {
                    return Err(refuse(UnsafeReason::Duplicate));
                }
                make_parent(&dest)?;
                // A copy, not a link: the unpacked files stay independent.
                std::fs::copy(&source_path, &dest).map_err(io_at(&dest))?;
            }
            tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo => {
                return Err(refuse(UnsafeReason::Device));
            }
            other => return Err(refuse(UnsafeReason::Unsupported { kind: format!("{other:?}") })),
        }
    }
    for (entry, relative, target) in links {
        let dir = relative[..relative.len().saturating_sub(1)].to_vec();
        if follow_link(root, dir, &target, 0).is_none() {
            return Err(TarballError::UnsafeEntry { entry, reason: UnsafeReason::LinkOutside { target } });
        }
    }
    Ok(())
}

/// Where `target`, a link's target in directory `dir`, leads through the
/// unpacked tree, following the links on its way (as the kernel would);
/// `None` when it leaves the package or loops.
fn follow_link(root: &Path, dir: Vec<String>, target: &str, depth: usize) -> Option<Vec<String>> {
    const MAX_LINKS: usize = 40;
    if depth > MAX_LINKS || target.starts_with('/') {
        return None;
    }
    let mut current = dir;
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                current.pop()?;
            }
            part => {
                current.push(part.to_owned());
                if let Ok(next) = std::fs::read_link(root.join(current.join("/"))) {
                    current.pop();
                    current = follow_link(root, current, next.to_str()?, depth + 1)?;
                }
            }
        }
    }
    Some(current)
}

/// The entry's path below the first component (`package/`), as names;
/// `None` for the first component itself.
fn inside_path(name: &str) -> Result<Option<Vec<String>>, UnsafeReason> {
    if name.starts_with('/') {
        return Err(UnsafeReason::Absolute);
    }
    if name.contains('\\') {
        return Err(UnsafeReason::Backslash);
    }
    let mut parts = Vec::new();
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(UnsafeReason::ParentDir),
            part => parts.push(part.to_owned()),
        }
    }
    // `C:…` would be absolute on Windows.
    if parts.first().is_some_and(|first| first.len() == 2 && first.ends_with(':')) {
        return Err(UnsafeReason::Absolute);
    }
    Ok((parts.len() > 1).then(|| parts.split_off(1)))
}

/// Where a symbolic link at `at` pointing to `target` leads, lexically,
/// from the package root; `None` when it leaves the package.
fn resolve_link(at: &[String], target: &str) -> Option<Vec<String>> {
    let mut resolved: Vec<String> = at[..at.len().saturating_sub(1)].to_vec();
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                resolved.pop()?;
            }
            part => resolved.push(part.to_owned()),
        }
    }
    Some(resolved)
}

/// Whether a directory above `relative` is a symbolic link unpacked
/// earlier: writing through it could land anywhere.
fn through_link(root: &Path, relative: &[String]) -> bool {
    let mut path = root.to_path_buf();
    relative[..relative.len().saturating_sub(1)].iter().any(|part| {
        path.push(part);
        path.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink())
    })
}

fn link_name<R: std::io::Read>(entry: &tar::Entry<'_, R>) -> String {
    entry.link_name_bytes().map(|bytes| String::from_utf8_lossy(&bytes).into_owned()).unwrap_or_default()
}

fn make_parent(path: &Path) -> Result<(), TarballError> {
    match path.parent() {
        Some(parent) => std::fs::create_dir_all(parent).map_err(io_at(parent)),
        None => Ok(()),
    }
}

#[cfg(unix)]
fn create_file(path: &Path, executable: bool) -> Result<std::fs::File, TarballError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(if executable { 0o755 } else { 0o644 })
        .open(path)
        .map_err(io_at(path))
}

#[cfg(not(unix))]
fn create_file(path: &Path, _executable: bool) -> Result<std::fs::File, TarballError> {
    std::fs::File::create(path).map_err(io_at(path))
}

#[cfg(unix)]
fn make_symlink(target: &str, at: &Path) -> Result<(), TarballError> {
    std::os::unix::fs::symlink(target, at).map_err(io_at(at))
}

#[cfg(not(unix))]
fn make_symlink(target: &str, _at: &Path) -> Result<(), TarballError> {
    Err(TarballError::UnsafeEntry {
        entry: target.to_owned(),
        reason: UnsafeReason::Unsupported { kind: "symbolic link".to_owned() },
    })
}

/// The set of paths a tarball holds (without `package/`), for checks
/// before unpacking (a manifest present, say).
pub fn entry_paths(bytes: &[u8]) -> Result<BTreeSet<String>, TarballError> {
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bytes));
    let mut paths = BTreeSet::new();
    for entry in archive.entries().map_err(TarballError::Corrupt)? {
        let entry = entry.map_err(TarballError::Corrupt)?;
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        match inside_path(&name) {
            Ok(Some(parts)) => {
                paths.insert(parts.join("/"));
            }
            Ok(None) => {}
            Err(reason) => return Err(TarballError::UnsafeEntry { entry: name, reason }),
        }
    }
    Ok(paths)
}

#[cfg(test)]
mod tests;
