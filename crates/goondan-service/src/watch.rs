//! `gdn run --watch`: the bundle's files (its YAML files, lock file, prompt
//! files, the entry files of its Tools, Extensions and Connectors, and the
//! files of its installed dependencies) are watched, and so are the
//! directories the loader searches for YAML files, where a split file may
//! appear or go away (`goondan_config::WatchList`). After an edit settles
//! (300 ms without another), the bundle is loaded again:
//!
//! ```text
//! does not validate   its diagnostics are printed; what runs is kept
//! valid               goondan_config::changes(before, after):
//!   nothing           (a comment, a resource nothing uses) nothing restarts
//!   agents            each changed agent restarts in the hub (its running turns finish first)
//!   connections       (a service) each changed Connection's connector restarts
//!   everything        (a Swarm, the Package, the lock file, a dependency) a service restarts whole, in its process;
//!                     an interactive run restarts every agent
//! ```
//!
//! The directories holding the files are watched (not the files: an editor
//! that saves by writing a new file and renaming it over the old one would
//! end a watch on the file), and events for other files in them are ignored.
//! A directory made in a searched one counts as an edit: the reload that
//! follows searches it (and watches it from then on).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use goondan_config::{Bundle, BundleChanges, BundleFingerprint, WatchList};
use notify::Watcher as _;
use tokio::sync::mpsc;

/// How long an edit must be quiet before the bundle is loaded again.
const SETTLE: Duration = Duration::from_millis(300);
/// The paths of edits not yet taken in, at most.
const TOUCHED_QUEUED: usize = 256;

/// What a settled edit turned out to be.
pub enum Reload {
    /// The bundle no longer validates: its errors, one per line.
    Invalid(Vec<String>),
    /// Valid, and what must restart (possibly nothing).
    Changed { bundle: Box<Bundle>, changes: BundleChanges },
}

/// Watches a bundle's files and tells what an edit changes.
pub struct BundleWatcher {
    config: PathBuf,
    /// Where the bundle's installed packages are (see
    /// [`goondan_config::load_bundle_with`]).
    packages_dir: Option<PathBuf>,
    watcher: notify::RecommendedWatcher,
    /// What counts (shared with the watcher's thread).
    files: Arc<Mutex<WatchList>>,
    dirs: BTreeSet<PathBuf>,
    touched: mpsc::Receiver<PathBuf>,
    /// The last valid bundle's snapshot.
    fingerprint: BundleFingerprint,
}

impl BundleWatcher {
    /// Starts watching the files of `bundle` (loaded from `config`).
    pub fn start(config: &Path, bundle: &Bundle) -> notify::Result<Self> {
        let files = Arc::new(Mutex::new(WatchList::default()));
        // Bounded: the file system can say more than is read. What does not
        // fit is dropped: a reload reads the whole bundle again, and the
        // paths only name the edit in the log.
        let (sender, touched) = mpsc::channel(TOUCHED_QUEUED);
        let watched = Arc::clone(&files);
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let Ok(event) = event else { return };
            if matches!(event.kind, notify::EventKind::Access(_)) {
                return;
            }
            let Ok(files) = watched.lock() else { return };
            for path in event.paths {
                if files.counts(&path) {
                    let _ = sender.try_send(path);
                }
            }
        })?;
        let mut this = Self {
            config: config.to_path_buf(),
            packages_dir: None,
            watcher,
            files,
            dirs: BTreeSet::new(),
            touched,
            fingerprint: BundleFingerprint::of(bundle),
        };
        this.follow(bundle)?;
        Ok(this)
    }

    /// Watches what `bundle` loads (an edit may add an entry file, a split
    /// file, a directory). Every directory is tried; the first failure is
    /// returned.
    fn follow(&mut self, bundle: &Bundle) -> notify::Result<()> {
        let list = WatchList::of(&self.config, bundle);
        let wanted = list.dirs();
        // A directory no longer searched (removed, or its files moved) is
        // let go, so that one made again under its name is watched anew.
        for gone in self.dirs.difference(&wanted).cloned().collect::<Vec<_>>() {
            let _ = self.watcher.unwatch(&gone);
            self.dirs.remove(&gone);
        }
        let mut failed = None;
        // A directory that does not exist yet (an entry file to be written)
        // is not among them: it is watched from the reload after it appears.
        for dir in wanted {
            if self.dirs.contains(&dir) {
                continue;
            }
            match self.watcher.watch(&dir, notify::RecursiveMode::NonRecursive) {
                Ok(()) => {
                    self.dirs.insert(dir);
                }
                Err(error) => {
                    failed.get_or_insert(error);
                }
            }
        }
        if let Ok(mut watched) = self.files.lock() {
            *watched = list;
        }
        failed.map_or(Ok(()), Err)
    }

    /// Reloads the bundle with its installed packages from `packages_dir`
    /// (the state root's `packages/`), as it was loaded at the start.
    pub fn with_packages_dir(mut self, packages_dir: Option<PathBuf>) -> Self {
        self.packages_dir = packages_dir;
        self
    }

    /// Waits for the next settled edit and says what it changes; `None`
    /// once the watcher has stopped.
    pub async fn next(&mut self) -> Option<Reload> {
        let first = self.touched.recv().await?;
        let mut touched = BTreeSet::from([first]);
        loop {
            match tokio::time::timeout(SETTLE, self.touched.recv()).await {
                Ok(Some(path)) => {
                    touched.insert(path);
                }
                Ok(None) => return None,
                Err(_) => break,
            }
        }
        tracing::info!(
            "watch: {} changed",
            touched.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        );
        let report = goondan_config::load_bundle_with(&self.config, self.packages_dir.as_deref());
        let Some(bundle) = report.valid_bundle() else {
            let errors = report.diagnostics.iter().filter(|d| d.is_error()).map(ToString::to_string).collect();
            return Some(Reload::Invalid(errors));
        };
        let fingerprint = BundleFingerprint::of(bundle);
        let changes = goondan_config::changes(&self.fingerprint, &fingerprint);
        self.fingerprint = fingerprint;
        if let Err(error) = self.follow(bundle) {
            tracing::warn!("watch: the bundle's new files are not all watched: {error}");
        }
        Some(Reload::Changed { bundle: Box::new(bundle.clone()), changes })
    }
}

/// Restarts the changed agents of `changes` (all with `everything`) in
/// the background; each is logged when through.
pub fn restart_agents(orchestrator: &goondan_orchestrator::Orchestrator, changes: &BundleChanges) {
    use goondan_orchestrator::InstanceSelector;
    let selectors: Vec<InstanceSelector> = if changes.everything {
        vec![InstanceSelector::All]
    } else {
        changes
            .agents
            .iter()
            .filter(|agent| orchestrator.plan().has_agent(agent))
            .map(|agent| InstanceSelector::Agent(agent.clone()))
            .collect()
    };
    for selector in selectors {
        let orchestrator = orchestrator.clone();
        // Fire and forget: a restart runs to its end (the orchestrator's shutdown ends it).
        tokio::spawn(async move {
            let report = orchestrator.restart(selector.clone(), None).await;
            match report.error {
                None => tracing::info!(
                    "watch: {selector:?} restarted ({} process(es) stopped after their turns)",
                    report.stopped.len()
                ),
                Some(error) => tracing::warn!("watch: restarting {selector:?}: {error}"),
            }
        });
    }
}
