//! `gdn package add / install / update`: resolution, downloads, installs.
//!
//! Resolution walks `spec.dependencies` and each picked version's
//! `dependencies` breadth first, taking the highest published version a
//! range allows; a package is picked once, and a later range the pick does
//! not satisfy is a conflict naming both requesters. A cycle among the
//! picks is refused. Tarballs download in parallel (at most
//! [`PARALLEL_DOWNLOADS`]); each one's integrity is checked, and its
//! entries looked over (a `goondan.yaml` must be there), before anything is
//! unpacked, atomically, into `<state root>/packages/<scope>/<name>/<version>/`.
//! An install already there whose recorded integrity (its
//! [`INTEGRITY_MARKER`]) is the locked one is reused; any other is replaced.
//!
//! `@goondan/base` ([`BUILT_IN`]) is part of gdn: a dependency on it is
//! met without the registry.
//!
//! Every step that can fail runs before `goondan.yaml` and the lockfile
//! are written: a failed command leaves the bundle as it was.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::lockfile::{FILE_NAME, Locked, Lockfile};
use super::manifest::{Dependency, Manifest};
use super::{Http, PackageError, Packument, Requirement, Settings, check_name, parse_ref};
use crate::version;

/// How many tarballs download at once.
pub const PARALLEL_DOWNLOADS: usize = 4;

/// The file in an install recording the integrity it was made from.
pub use crate::tarball::INTEGRITY_MARKER;

/// The requester of the bundle's own dependencies.
const ROOT: &str = "goondan.yaml";

/// Packages built into gdn (the original's samples depend on
/// `@goondan/base`): never fetched, locked or installed; the loader uses
/// its own copy.
pub const BUILT_IN: &[&str] = &["@goondan/base"];

fn built_in(name: &str) -> bool {
    BUILT_IN.contains(&name)
}

/// One package in place.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Installed {
    pub name: String,
    pub version: String,
    pub path: PathBuf,
    /// Already there with the same integrity: not downloaded again.
    pub reused: bool,
}

/// What `add`, `install` and `update` did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Outcome {
    pub manifest: PathBuf,
    pub lockfile: PathBuf,
    pub installed: Vec<Installed>,
    /// `add`: whether the dependency was new (else its version was set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub added: Option<bool>,
    /// `add`: the range written and the version it picked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dependency: Option<Dependency>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolved_version: Option<String>,
    /// `update`: the ranges changed (`name` → `[before, after]`).
    pub changes: BTreeMap<String, (String, String)>,
}

/// Where `name@version` is installed under the state root.
pub fn install_path(state_root: &Path, name: &str, version: &str) -> PathBuf {
    // One layout for the installer and the loader (goondan-config).
    goondan_core::package_dir::installed_root(&state_root.join("packages"), name, version)
}

/// Caches packuments for one command.
struct Registry<'a> {
    http: Http,
    settings: &'a Settings<'a>,
    packuments: HashMap<String, Arc<Packument>>,
}

impl<'a> Registry<'a> {
    fn new(settings: &'a Settings<'a>) -> Result<Self, PackageError> {
        Ok(Self { http: Http::new(settings)?, settings, packuments: HashMap::new() })
    }

    async fn packument(&mut self, name: &str) -> Result<Arc<Packument>, PackageError> {
        if let Some(found) = self.packuments.get(name) {
            return Ok(found.clone());
        }
        let registry = self.settings.registry_url(name);
        let token = self.settings.token(&registry);
        let found = Arc::new(self.http.packument(&registry, name, token.as_deref()).await?);
        self.packuments.insert(name.to_owned(), found.clone());
        Ok(found)
    }

    /// The version of `name` that `range` picks.
    async fn pick(&mut self, name: &str, range: &str) -> Result<(String, Arc<Packument>), PackageError> {
        let packument = self.packument(name).await?;
        let tags: BTreeMap<String, String> = packument.dist_tags.clone();
        let picked = version::resolve(packument.versions.keys().map(String::as_str), &tags, range)
            .map_err(|source| PackageError::NoVersion { name: name.to_owned(), source })?;
        Ok((picked.to_string(), packument))
    }

    /// Resolves `dependencies` transitively into a lockfile.
    async fn resolve(&mut self, dependencies: &[Dependency]) -> Result<Lockfile, PackageError> {
        let mut queue: VecDeque<(String, Requirement)> = dependencies
            .iter()
            .map(|d| (d.name.clone(), Requirement { requester: ROOT.to_owned(), range: d.range.clone() }))
            .collect();
        let mut picked: BTreeMap<String, (String, Requirement)> = BTreeMap::new();
        let mut lock = Lockfile::default();
        while let Some((name, wanted)) = queue.pop_front() {
            check_name(&name)?;
            if built_in(&name) {
                continue;
            }
            if let Some((version, first)) = picked.get(&name) {
                let packument = self.packument(&name).await?;
                if version::resolve([version.as_str()], &packument.dist_tags, &wanted.range).is_err() {
                    return Err(PackageError::Conflict {
                        name,
                        first: Box::new(first.clone()),
                        picked: version.clone(),
                        second: Box::new(wanted),
                    });
                }
                continue;
            }
            let (version, packument) = self.pick(&name, &wanted.range).await?;
            let Some(info) = packument.versions.get(&version) else {
                return Err(PackageError::BadAnswer {
                    url: self.settings.registry_url(&name),
                    detail: format!("{name}: picked {version}, which the packument does not list"),
                });
            };
            for (child, range) in &info.dependencies {
                queue.push_back((
                    child.clone(),
                    Requirement { requester: format!("{name}@{version}"), range: range.clone() },
                ));
            }
            lock.packages.insert(
                format!("{name}@{version}"),
                Locked {
                    version: version.clone(),
                    resolved: info.tarball.clone(),
                    integrity: info.integrity.clone(),
                    dependencies: info.dependencies.clone(),
                },
            );
            picked.insert(name, (version, wanted));
        }
        check_cycles(&lock)?;
        Ok(lock)
    }
}

fn name_of<'k>(key: &'k str, entry: &Locked) -> &'k str {
    key.strip_suffix(&format!("@{}", entry.version)).unwrap_or(key)
}

/// Refuses a cycle among the locked packages, naming it.
fn check_cycles(lock: &Lockfile) -> Result<(), PackageError> {
    let graph: BTreeMap<&str, Vec<&str>> = lock
        .packages
        .iter()
        .map(|(key, entry)| (name_of(key, entry), entry.dependencies.keys().map(String::as_str).collect()))
        .collect();
    let mut done: BTreeSet<&str> = BTreeSet::new();
    for start in graph.keys() {
        let mut path: Vec<&str> = Vec::new();
        // (node, index of its next child)
        let mut stack: Vec<(&str, usize)> = vec![(start, 0)];
        while let Some((node, next)) = stack.last_mut() {
            let node = *node;
            if *next == 0 {
                if done.contains(node) {
                    stack.pop();
                    continue;
                }
                path.push(node);
            }
            let children = graph.get(node).map(Vec::as_slice).unwrap_or_default();
            if let Some(child) = children.get(*next) {
                *next += 1;
                if let Some(at) = path.iter().position(|p| p == child) {
                    let mut cycle: Vec<String> = path[at..].iter().map(|s| (*s).to_owned()).collect();
                    cycle.push((*child).to_owned());
                    return Err(PackageError::Cycle { path: cycle });
                }
                if !done.contains(child) {
                    stack.push((child, 0));
                }
            } else {
                done.insert(node);
                path.pop();
                stack.pop();
            }
        }
    }
    Ok(())
}

/// Whether `lock` is exactly what `dependencies` need: every range met by
/// its locked version, transitively, and nothing else locked.
pub fn check_lock(lock: &Lockfile, dependencies: &[Dependency], path: &Path) -> Result<(), PackageError> {
    let mismatch = |detail: String| PackageError::FrozenMismatch { path: path.to_path_buf(), detail };
    let mut queue: VecDeque<(String, String, String)> =
        dependencies.iter().map(|d| (d.name.clone(), d.range.clone(), ROOT.to_owned())).collect();
    let mut reached: BTreeSet<String> = BTreeSet::new();
    while let Some((name, range, requester)) = queue.pop_front() {
        if built_in(&name) {
            continue;
        }
        let Some((key, entry)) = lock.find(&name) else {
            return Err(mismatch(format!("{requester} needs {name} {range:?}, which is not locked")));
        };
        if version::resolve([entry.version.as_str()], &BTreeMap::new(), &range).is_err() {
            return Err(mismatch(format!("{requester} needs {name} {range:?}, but {} is locked", entry.version)));
        }
        if reached.insert(key.clone()) {
            for (child, child_range) in &entry.dependencies {
                queue.push_back((child.clone(), child_range.clone(), key.clone()));
            }
        }
    }
    // A lock entry for a built-in package (the original's samples have one) is no extra.
    let extra = lock.packages.iter().find(|(key, entry)| !reached.contains(*key) && !built_in(name_of(key, entry)));
    if let Some((extra, _)) = extra {
        return Err(mismatch(format!("{extra} is locked but nothing needs it")));
    }
    Ok(())
}

/// What an install reports as it goes, for a progress display (the
/// caller's [`Settings::progress`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// `received` bytes of `name@version`'s tarball are in, of `total`
    /// when the registry said.
    Downloading { name: String, version: String, received: u64, total: Option<u64> },
    /// `name@version` is in place: downloaded (`bytes`) or `reused`.
    Installed { name: String, version: String, bytes: u64, reused: bool },
}

/// Where [`Progress`] goes.
pub type ProgressSink = Arc<dyn Fn(&Progress) + Send + Sync>;

/// Downloads and installs what `lock` names (in parallel, bounded).
pub async fn install_locked(settings: &Settings<'_>, lock: &Lockfile) -> Result<Vec<Installed>, PackageError> {
    let http = Http::new(settings)?;
    // A state root kept in a project must never be searched for the
    // bundle's files (the packages under it are their own).
    if lock.packages.iter().any(|(key, entry)| !built_in(name_of(key, entry))) {
        let packages = settings.state_root.join("packages");
        std::fs::create_dir_all(&packages).map_err(|source| io_error(&packages, source))?;
        goondan_core::package_dir::mark_state_root(&settings.state_root)
            .map_err(|source| io_error(&settings.state_root, source))?;
    }
    let limit = Arc::new(tokio::sync::Semaphore::new(PARALLEL_DOWNLOADS));
    let mut tasks = tokio::task::JoinSet::new();
    for (key, entry) in lock.packages.iter().filter(|(key, entry)| !built_in(name_of(key, entry))) {
        let name = name_of(key, entry).to_owned();
        let registry = settings.registry_url(&name);
        let token = settings.token(&registry);
        let dest = install_path(&settings.state_root, &name, &entry.version);
        let (http, limit, entry, progress) = (http.clone(), limit.clone(), entry.clone(), settings.progress.clone());
        tasks.spawn(async move {
            let _permit = limit.acquire_owned().await;
            let one = One { http: &http, registry: &registry, token: token.as_deref(), name: &name, entry: &entry };
            one.install(dest, progress.as_ref()).await
        });
    }
    let mut installed = Vec::new();
    let mut first_error = None;
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(one)) => installed.push(one),
            Ok(Err(error)) => {
                first_error.get_or_insert(error);
            }
            Err(error) => {
                first_error.get_or_insert(PackageError::Client(format!("an install task failed: {error}")));
            }
        }
    }
    if let Some(error) = first_error {
        return Err(error);
    }
    installed.sort_by(|a, b| (&a.name, &a.version).cmp(&(&b.name, &b.version)));
    Ok(installed)
}

/// One locked package to put in place.
struct One<'a> {
    http: &'a Http,
    registry: &'a str,
    token: Option<&'a str>,
    name: &'a str,
    entry: &'a Locked,
}

impl One<'_> {
    /// Installs the package at `dest` unless it is there with the locked
    /// integrity. One installer per version at a time, across processes
    /// (a lock file beside it, `.<version>.lock`): a second one waits, then
    /// finds the first one's install and reuses it. Under the lock, what
    /// an installer killed midway left is removed first.
    async fn install(&self, dest: PathBuf, progress: Option<&ProgressSink>) -> Result<Installed, PackageError> {
        let (name, version) = (self.name, self.entry.version.clone());
        let done = |reused| Installed { name: name.to_owned(), version: version.clone(), path: dest.clone(), reused };
        let tarball_error = |source| tarball_failed(name, &version, source);
        let _lock = lock_install(&dest).await?;
        let leftovers = dest.clone();
        tokio::task::spawn_blocking(move || crate::tarball::remove_leftovers(&leftovers))
            .await
            .map_err(|e| PackageError::Client(format!("an install task failed: {e}")))?
            .map_err(tarball_error)?;
        let report = |event: Progress| {
            if let Some(sink) = progress {
                sink(&event);
            }
        };
        if crate::tarball::recorded_integrity(&dest).is_some_and(|recorded| recorded == self.entry.integrity.trim()) {
            report(Progress::Installed { name: name.to_owned(), version: version.clone(), bytes: 0, reused: true });
            return Ok(done(true));
        }
        let mut on_chunk = |received, total| {
            report(Progress::Downloading { name: name.to_owned(), version: version.clone(), received, total });
        };
        let bytes = self.http.download_with(self.registry, &self.entry.resolved, self.token, &mut on_chunk).await?;
        crate::tarball::verify_integrity(&bytes, &self.entry.integrity).map_err(tarball_error)?;
        let paths = crate::tarball::entry_paths(&bytes).map_err(tarball_error)?;
        if !paths.contains("goondan.yaml") && !paths.contains("dist/goondan.yaml") {
            return Err(PackageError::NoManifestInTarball { name: name.to_owned(), version });
        }
        let size = bytes.len() as u64;
        let (integrity, target) = (self.entry.integrity.clone(), dest.clone());
        let unpacked = tokio::task::spawn_blocking(move || crate::tarball::unpack(&bytes, &integrity, &target))
            .await
            .map_err(|e| PackageError::Client(format!("unpacking failed: {e}")))?
            .map_err(tarball_error)?;
        if unpacked == crate::tarball::Unpacked::Replaced {
            tracing::info!(package = name, version, "replaced an install of another integrity");
        }
        report(Progress::Installed { name: name.to_owned(), version: version.clone(), bytes: size, reused: false });
        Ok(done(false))
    }
}

/// A tarball step failed: a full disk is told apart from a bad tarball.
fn tarball_failed(name: &str, version: &str, source: crate::tarball::TarballError) -> PackageError {
    match source {
        crate::tarball::TarballError::Io { path, source } if crate::is_disk_full(&source) => {
            PackageError::DiskFull { path, source }
        }
        source => PackageError::Tarball { name: name.to_owned(), version: version.to_owned(), source },
    }
}

/// Takes the lock of the install at `dest` (waiting for another process
/// holding it); released when the file is dropped.
async fn lock_install(dest: &Path) -> Result<std::fs::File, PackageError> {
    let parent = dest.parent().unwrap_or(Path::new(".")).to_path_buf();
    let version = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    tokio::task::spawn_blocking(move || {
        std::fs::create_dir_all(&parent).map_err(|source| io_error(&parent, source))?;
        let path = parent.join(format!(".{version}.lock"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|source| io_error(&path, source))?;
        file.lock().map_err(|source| io_error(&path, source))?;
        Ok(file)
    })
    .await
    .map_err(|e| PackageError::Client(format!("an install task failed: {e}")))?
}

/// An I/O error at `path`; a full disk says so.
fn io_error(path: &Path, source: std::io::Error) -> PackageError {
    if crate::is_disk_full(&source) {
        PackageError::DiskFull { path: path.to_path_buf(), source }
    } else {
        PackageError::Io { path: path.to_path_buf(), source }
    }
}

/// A file's new text, written and synced beside it but not yet in place
/// ([`Staged::commit`] renames it in). Every file a command changes is
/// staged before any is renamed: a full disk fails the staging and
/// changes nothing.
struct Staged {
    file: tempfile::NamedTempFile,
    path: PathBuf,
}

/// The start of a staged file's name: `.<file>.<pid>.writing-…`.
fn staged_prefix(path: &Path, pid: u32) -> String {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    format!(".{name}.{pid}.writing-")
}

impl Staged {
    fn new(path: &Path, text: &str) -> Result<Self, PackageError> {
        use std::io::Write as _;
        let parent = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        remove_dead_staged(parent, path);
        let mut file = tempfile::Builder::new()
            .prefix(&staged_prefix(path, std::process::id()))
            .tempfile_in(parent)
            .map_err(|source| io_error(parent, source))?;
        // The file keeps its mode (a new one gets the usual 0644, not the temporary file's 0600).
        let permissions = std::fs::metadata(path).map(|m| m.permissions()).unwrap_or_else(|_| {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::Permissions::from_mode(0o644)
        });
        let written = file
            .write_all(text.as_bytes())
            .and_then(|()| file.as_file().set_permissions(permissions))
            .and_then(|()| file.as_file().sync_all());
        written.map_err(|source| io_error(path, source))?;
        Ok(Self { file, path: path.to_path_buf() })
    }

    fn commit(self) -> Result<(), PackageError> {
        let Self { file, path } = self;
        file.persist(&path).map_err(|persist| io_error(&path, persist.error))?;
        crate::tarball::sync_dir(path.parent().unwrap_or(Path::new(".")));
        Ok(())
    }
}

/// Removes the staged copies of `path` whose process is gone (killed
/// between staging and renaming): a live one's are left to it.
fn remove_dead_staged(dir: &Path, path: &Path) {
    let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else { return };
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let start = format!(".{name}.");
    for entry in entries.flatten() {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = file_name
            .strip_prefix(&start)
            .and_then(|rest| rest.split_once(".writing-"))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

fn lockfile_path(manifest: &Path) -> PathBuf {
    manifest.parent().unwrap_or(Path::new(".")).join(FILE_NAME)
}

/// Installs `dependencies` (re-resolved unless `keep` is a lockfile that
/// still matches them), then writes the lockfile and, when given, the new
/// manifest text.
async fn settle(
    settings: &Settings<'_>,
    manifest: &Manifest,
    new_text: Option<&str>,
    dependencies: &[Dependency],
    keep: Option<Lockfile>,
) -> Result<(Vec<Installed>, PathBuf), PackageError> {
    let lock_path = lockfile_path(&manifest.path);
    let lock = match keep {
        Some(lock) if check_lock(&lock, dependencies, &lock_path).is_ok() => lock,
        _ => Registry::new(settings)?.resolve(dependencies).await?,
    };
    // Installed first: the lockfile and the manifest name only what is
    // in place.
    let installed = install_locked(settings, &lock).await?;
    let rendered = lock.render();
    let current = std::fs::read_to_string(&lock_path).ok();
    // As the original: a bundle without dependencies gets no lockfile.
    let nothing_to_lock = lock.packages.is_empty() && current.is_none();
    let lock_changes = !nothing_to_lock && current.as_deref() != Some(rendered.as_str());
    // Both staged before either is renamed in. The lockfile goes first: a
    // crash between the two leaves a lockfile the manifest does not
    // match, which the next `install` resolves again (`--frozen-lockfile`
    // refuses it), never a manifest naming a package nothing locked.
    let staged_lock = lock_changes.then(|| Staged::new(&lock_path, &rendered)).transpose()?;
    let staged_manifest = new_text.map(|text| Staged::new(&manifest.path, text)).transpose()?;
    if let Some(staged) = staged_lock {
        staged.commit()?;
        goondan_core::fault::after_write(goondan_core::fault::Point::PackageLockfile);
    }
    if let Some(staged) = staged_manifest {
        staged.commit()?;
    }
    Ok((installed, lock_path))
}

fn outcome(manifest: &Manifest, lockfile: PathBuf, installed: Vec<Installed>) -> Outcome {
    Outcome {
        manifest: manifest.path.clone(),
        lockfile,
        installed,
        added: None,
        dependency: None,
        resolved_version: None,
        changes: BTreeMap::new(),
    }
}

/// `gdn package install [--frozen-lockfile]`.
pub async fn install(settings: &Settings<'_>, manifest_path: &Path, frozen: bool) -> Result<Outcome, PackageError> {
    let manifest = Manifest::read(manifest_path)?;
    let dependencies = manifest.package()?.dependencies;
    let lock_path = lockfile_path(manifest_path);
    let existing = Lockfile::read(&lock_path)?;
    if frozen {
        let Some(lock) = existing else {
            return Err(PackageError::FrozenMismatch { path: lock_path, detail: "there is no lockfile".to_owned() });
        };
        check_lock(&lock, &dependencies, &lock_path)?;
        let installed = install_locked(settings, &lock).await?;
        return Ok(outcome(&manifest, lock_path, installed));
    }
    let (installed, lockfile) = settle(settings, &manifest, None, &dependencies, existing).await?;
    Ok(outcome(&manifest, lockfile, installed))
}

/// `gdn package add NAME[@VERSION] [-E]`: the range written is the one
/// given, else `^<picked>` (`<picked>` with `exact`).
pub async fn add(
    settings: &Settings<'_>,
    manifest_path: &Path,
    reference: &str,
    exact: bool,
) -> Result<Outcome, PackageError> {
    let (name, spec) = parse_ref(reference)?;
    let manifest = Manifest::read(manifest_path)?;
    // A bundle whose Package document is broken is refused before asking.
    if !manifest.text.trim().is_empty()
        && let Err(error @ (PackageError::InvalidName { .. } | PackageError::InvalidVersion { .. })) =
            manifest.package()
    {
        return Err(error);
    }
    let mut registry = Registry::new(settings)?;
    let (picked, _) = registry.pick(&name, spec.as_deref().unwrap_or("latest")).await?;
    let range = match spec {
        Some(spec) if version::is_range(&spec) => spec,
        _ if exact => picked.clone(),
        _ => format!("^{picked}"),
    };
    let (text, added) = manifest.with_dependency(&name, &range);
    let edited = Manifest { path: manifest.path.clone(), text: text.clone() };
    let dependencies = edited.package()?.dependencies;
    let existing = Lockfile::read(&lockfile_path(manifest_path))?;
    let (installed, lockfile) = settle(settings, &manifest, Some(&text), &dependencies, existing).await?;
    let mut done = outcome(&manifest, lockfile, installed);
    done.added = Some(added);
    done.dependency = Some(Dependency { name, range });
    done.resolved_version = Some(picked);
    Ok(done)
}

/// `gdn package update [NAME…]`: each named dependency (all without names)
/// moves to the registry's `latest`, keeping its `^`/`~` (the original's
/// rule), and everything is resolved afresh.
pub async fn update(
    settings: &Settings<'_>,
    manifest_path: &Path,
    names: &[String],
    exact: bool,
) -> Result<Outcome, PackageError> {
    let manifest = Manifest::read(manifest_path)?;
    let dependencies = manifest.package()?.dependencies;
    for name in names {
        check_name(name)?;
        if !dependencies.iter().any(|d| &d.name == name) {
            return Err(PackageError::Manifest {
                path: manifest.path.clone(),
                message: format!("{name} is not among spec.dependencies"),
            });
        }
    }
    let mut registry = Registry::new(settings)?;
    let mut next = BTreeMap::new();
    let mut changes = BTreeMap::new();
    for dependency in dependencies.iter().filter(|d| names.is_empty() || names.contains(&d.name)) {
        let (latest, _) = registry.pick(&dependency.name, "latest").await?;
        let current = dependency.range.trim();
        let range = if exact {
            latest.clone()
        } else if current.starts_with('~') {
            format!("~{latest}")
        } else if current.starts_with('^') || current.is_empty() {
            format!("^{latest}")
        } else {
            latest.clone()
        };
        if range != dependency.range {
            next.insert(dependency.name.clone(), range.clone());
            changes.insert(dependency.name.clone(), (dependency.range.clone(), range));
        }
    }
    let (text, _) = manifest.with_versions(&next);
    let edited = Manifest { path: manifest.path.clone(), text: text.clone() };
    let dependencies = edited.package()?.dependencies;
    let new_text = (!next.is_empty()).then_some(text.as_str());
    let (installed, lockfile) = settle(settings, &manifest, new_text, &dependencies, None).await?;
    let mut done = outcome(&manifest, lockfile, installed);
    done.changes = changes;
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(entries: &[(&str, &[(&str, &str)])]) -> Lockfile {
        let mut lock = Lockfile::default();
        for (name, deps) in entries {
            lock.packages.insert(
                format!("{name}@1.0.0"),
                Locked {
                    version: "1.0.0".into(),
                    resolved: String::new(),
                    integrity: String::new(),
                    dependencies: deps.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
                },
            );
        }
        lock
    }

    #[test]
    fn cycles_are_named() {
        let cyclic = lock(&[("@s/a", &[("@s/b", "^1")]), ("@s/b", &[("@s/c", "^1")]), ("@s/c", &[("@s/a", "^1")])]);
        match check_cycles(&cyclic) {
            Err(PackageError::Cycle { path }) => assert_eq!(path, ["@s/a", "@s/b", "@s/c", "@s/a"]),
            other => panic!("{other:?}"),
        }
        let diamond = lock(&[("@s/a", &[("@s/b", "^1"), ("@s/c", "^1")]), ("@s/b", &[("@s/c", "^1")]), ("@s/c", &[])]);
        assert!(check_cycles(&diamond).is_ok());
    }

    #[test]
    fn a_lock_must_match_exactly() {
        let locked = lock(&[("@s/a", &[("@s/b", "^1.0.0")]), ("@s/b", &[])]);
        let wants = |range: &str| vec![Dependency { name: "@s/a".into(), range: range.into() }];
        assert!(check_lock(&locked, &wants("^1.0.0"), Path::new("l")).is_ok());
        assert!(matches!(
            check_lock(&locked, &wants("^2.0.0"), Path::new("l")),
            Err(PackageError::FrozenMismatch { .. })
        ));
        let with_base =
            lock(&[("@s/a", &[("@s/b", "^1.0.0"), ("@goondan/base", "^1")]), ("@s/b", &[]), ("@goondan/base", &[])]);
        assert!(check_lock(&with_base, &wants("^1.0.0"), Path::new("l")).is_ok());
        let extra = lock(&[("@s/a", &[("@s/b", "^1.0.0")]), ("@s/b", &[]), ("@s/z", &[])]);
        assert!(matches!(
            check_lock(&extra, &wants("^1.0.0"), Path::new("l")),
            Err(PackageError::FrozenMismatch { .. })
        ));
        let missing = lock(&[("@s/a", &[("@s/b", "^1.0.0")])]);
        assert!(matches!(
            check_lock(&missing, &wants("^1.0.0"), Path::new("l")),
            Err(PackageError::FrozenMismatch { .. })
        ));
    }

    #[test]
    fn installs_go_under_the_scope() {
        assert_eq!(install_path(Path::new("/s"), "@a/b", "1.0.0"), Path::new("/s/packages/a/b/1.0.0"));
        assert_eq!(install_path(Path::new("/s"), "b", "1.0.0"), Path::new("/s/packages/b/1.0.0"));
    }
}
