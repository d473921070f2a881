//! One process at a time runs an instance: its `lock` file, and whether
//! (and by which process) it is held.

use std::fs::{self, File};
use std::io::{self, Read, Seek, Write};
use std::path::Path;

use serde::Serialize;

use super::LOG_TARGET;
use super::error::StoreError;
use super::files::private_file;
use super::instance::{InstanceStore, remove_stale_temps};

/// How often [`InstanceStore::lock`] tries again when the lock is taken,
/// and how long it waits before each try: long enough to outlast an
/// inspector's test of the lock, short enough not to be noticed.
pub(super) const LOCK_RETRIES: u32 = 3;
pub(super) const LOCK_RETRY_DELAY: std::time::Duration = std::time::Duration::from_millis(10);

/// Holds an instance for this process; dropping it releases the lock.
#[derive(Debug)]
pub struct InstanceLock {
    file: File,
}

impl Drop for InstanceLock {
    fn drop(&mut self) {
        // Take our pid out while still holding the lock (it is released when
        // the file closes, right after): a later holder that writes none (a
        // process of an earlier version, `flock`) is then not reported
        // under ours. Best effort; a crash leaves it, and it is only shown
        // while someone holds the lock.
        let _ = self.file.set_len(0);
    }
}

impl InstanceStore {
    /// Takes the instance for this process: an exclusive advisory lock on
    /// `<instance>/lock`, held until the returned guard is dropped (or the
    /// process ends), then writes this process's id into the file for
    /// [`lock_status`]. A second process asking for the same instance gets
    /// [`StoreError::Busy`], naming the holder's pid, instead of
    /// interleaving its writes.
    pub fn lock(&self) -> Result<InstanceLock, StoreError> {
        let path = self.dir.join(Self::LOCK_FILE);
        // Not truncated on open: until we hold the lock, the pid in it is the holder's.
        let file = private_file()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(StoreError::io("opening the lock file", &path))?;
        let mut retries = LOCK_RETRIES;
        loop {
            match file.try_lock() {
                Ok(()) => break,
                // An inspector (`lock_status`) holds the lock for an instant
                // to test it; that is not a process running the instance.
                Err(fs::TryLockError::WouldBlock) if retries > 0 => {
                    retries -= 1;
                    std::thread::sleep(LOCK_RETRY_DELAY);
                }
                Err(fs::TryLockError::WouldBlock) => {
                    return Err(StoreError::Busy {
                        agent: self.info.agent_name.clone(),
                        key: self.info.instance_key.clone(),
                        pid: read_pid(&file),
                        path,
                    });
                }
                Err(fs::TryLockError::Error(error)) => return Err(StoreError::io("locking", &path)(error)),
            }
        }
        // Truncate first: a shorter pid must not leave digits of a longer
        // one. The pid only informs (`gdn instance list`), so failing to
        // write it does not stop the run; nor is it synced, as it means
        // nothing after a crash (the lock is gone with the process).
        let pid = format!("{}\n", std::process::id());
        if let Err(error) =
            file.set_len(0).and_then(|()| (&file).rewind()).and_then(|()| (&file).write_all(pid.as_bytes()))
        {
            tracing::warn!(target: LOG_TARGET, "writing the pid into {}: {error}", path.display());
        }
        remove_stale_temps(&self.dir);
        // The exports' rewrite (`messages/base.jsonl`) leaves its temp file
        // there when killed mid-write.
        remove_stale_temps(&self.dir.join(InstanceStore::EXPORT_DIR));
        Ok(InstanceLock { file })
    }
}

/// Whether a process runs an instance right now: it holds the instance's
/// lock ([`InstanceStore::lock`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LockStatus {
    /// A process holds the lock.
    pub running: bool,
    /// That process's id, as it wrote it in the lock file; `None` when idle,
    /// or when the holder has not written it (yet, or ever: earlier versions
    /// did not).
    pub pid: Option<u32>,
}

/// Tells whether a process holds the lock of the instance directory `dir`
/// now, by trying to take it (shared, and released at once); the lock
/// file is not created. A pid left in the file by a process that is gone
/// is ignored: its lock went with it.
///
/// The answer can be stale as soon as it is given; [`delete_instances`]
/// takes the locks itself rather than trusting it. While it tests, the
/// lock is taken for an instant, which [`InstanceStore::lock`] rides out.
pub fn lock_status(dir: &Path) -> Result<LockStatus, StoreError> {
    let path = dir.join(InstanceStore::LOCK_FILE);
    let file = match File::open(&path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(LockStatus::default()),
        Err(error) => return Err(StoreError::io("opening the lock file", &path)(error)),
    };
    // Shared, so that two inspectors do not see each other as the runner,
    // and so that a read-only descriptor is enough everywhere.
    match file.try_lock_shared() {
        Ok(()) => Ok(LockStatus::default()),
        Err(fs::TryLockError::WouldBlock) => Ok(LockStatus { running: true, pid: read_pid(&file) }),
        Err(fs::TryLockError::Error(error)) => Err(StoreError::io("testing the lock", &path)(error)),
    }
}

/// The pid a lock holder wrote into its lock file, if it is one.
pub(super) fn read_pid(file: &File) -> Option<u32> {
    let mut text = String::new();
    let mut reader = file;
    reader.rewind().ok()?;
    // A pid is a few digits; a bigger file is not ours to read whole.
    reader.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

/// Takes the lock of the instance directory `dir` (for `agent` and `key`)
/// exclusively without creating the file: `Ok(None)` if there is no lock
/// file (no process ever ran the instance), [`StoreError::Busy`] if a
/// process holds it.
pub(super) fn hold_lock(dir: &Path, agent: &str, key: &str) -> Result<Option<File>, StoreError> {
    let path = dir.join(InstanceStore::LOCK_FILE);
    let file = match File::options().read(true).write(true).open(&path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(StoreError::io("opening the lock file", &path)(error)),
    };
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(fs::TryLockError::WouldBlock) => {
            Err(StoreError::Busy { agent: agent.to_owned(), key: key.to_owned(), pid: read_pid(&file), path })
        }
        Err(fs::TryLockError::Error(error)) => Err(StoreError::io("locking", &path)(error)),
    }
}
