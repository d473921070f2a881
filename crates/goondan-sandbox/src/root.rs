//! The file system a confined command sees when it has namespaces: a root
//! of its own with nothing but what it may use.
//!
//! Landlock decides what a command may read and write, but not which named
//! Unix sockets it may `connect` to (Landlock ABI 7 has no right for that),
//! and file permissions let a process reach every socket its user owns —
//! the service's control socket among them, and as root any socket at all.
//! So a command in its own mount namespace gets a fresh root: an empty
//! tmpfs holding bind mounts of the system's trees (`/usr`, `/etc`,
//! `/proc`, …), a few device files, the workdir, its private temporary
//! directory and the extra `readable`/`writable` paths,
//! each at its own path. `/run`, `/var`, `/tmp`, the home directories and
//! the state root are not there, so neither is any socket in them; sockets
//! the command makes in its workdir or temporary directory work as usual.
//!
//! Everything is worked out in the parent ([`NewRoot::plan`]); the child
//! ([`NewRoot::enter`]) only makes the system calls, allocating nothing.

use std::collections::HashSet;
use std::ffi::{CStr, CString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};
use nix::sys::stat::Mode;

use crate::layout::SYSTEM_READABLE;

/// Device files a command may use, bound into its `/dev`.
const DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full", "/dev/urandom", "/dev/random"];

/// The links every `/dev` has, to the process's own descriptors.
const DEVICE_LINKS: &[(&str, &str)] = &[
    ("/dev/fd", "/proc/self/fd"),
    ("/dev/stdin", "/proc/self/fd/0"),
    ("/dev/stdout", "/proc/self/fd/1"),
    ("/dev/stderr", "/proc/self/fd/2"),
];

/// A tree of the machine the command sees at its own path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct View {
    pub path: PathBuf,
    /// Mounted `nosuid,nodev` (the command may write there).
    pub writable: bool,
}

/// One step of building the root, on paths prepared in the parent.
#[derive(Debug)]
enum Step {
    Dir(CString),
    File(CString),
    Link { target: CString, link: CString },
    Bind { source: CString, target: CString, writable: Option<MsFlags> },
}

/// The root of a command's own mount namespace, planned.
#[derive(Debug)]
pub(crate) struct NewRoot {
    /// An empty directory of the sandbox's, where the tmpfs is mounted.
    mount_point: CString,
    steps: Vec<Step>,
    /// What the command sees (bound trees and links), by their paths.
    seen: Vec<PathBuf>,
}

impl NewRoot {
    /// The root over `mount_point` (an empty directory) that shows the
    /// system, `/dev`'s usual files, `views` and `tmp`.
    pub(crate) fn plan(mount_point: &Path, tmp: &Path, views: &[View]) -> io::Result<Self> {
        let mut all: Vec<View> = SYSTEM_READABLE
            .iter()
            .chain(["/etc"].iter())
            .map(|path| View { path: PathBuf::from(path), writable: false })
            .collect();
        all.extend(views.iter().cloned());
        all.push(View { path: tmp.to_path_buf(), writable: true });
        let mut plan = Planner {
            root: mount_point.to_path_buf(),
            made: HashSet::new(),
            bound: Vec::new(),
            links: Vec::new(),
            steps: Vec::new(),
        };
        // Shallow first, so that what lies inside a tree already bound is
        // seen through it (and no mount point is made in a real directory).
        all.sort_by_key(|view| view.path.components().count());
        for view in &all {
            plan.view(view)?;
        }
        plan.dir(Path::new("/dev"))?;
        for device in DEVICES.iter().map(Path::new).filter(|path| path.exists()) {
            plan.bind(device, device, None)?;
        }
        for (link, target) in DEVICE_LINKS {
            plan.link(Path::new(link), Path::new(target))?;
        }
        let mut seen = plan.bound;
        seen.extend(plan.links);
        Ok(Self { mount_point: c_path(mount_point)?, steps: plan.steps, seen })
    }

    /// Whether `path` (absolute) lies in what the command sees.
    pub(crate) fn sees(&self, path: &Path) -> bool {
        self.seen.iter().any(|tree| path.starts_with(tree))
    }

    /// In the child, in its own user and mount namespaces: builds the root,
    /// makes it the root, and lets the old one go. The working directory
    /// is left at `/`; the caller changes to the command's own afterwards.
    pub(crate) fn enter(&self) -> io::Result<()> {
        let none: Option<&CStr> = None;
        nix::mount::mount(none, c"/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none)?;
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        nix::mount::mount(Some(c"tmpfs"), self.mount_point.as_c_str(), Some(c"tmpfs"), flags, Some(c"mode=0755"))?;
        for step in &self.steps {
            match step {
                Step::Dir(path) => match nix::unistd::mkdir(path.as_c_str(), Mode::from_bits_truncate(0o755)) {
                    Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                    Err(error) => return Err(error.into()),
                },
                Step::File(path) => {
                    let flags = nix::fcntl::OFlag::O_CREAT | nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC;
                    drop(nix::fcntl::open(path.as_c_str(), flags, Mode::from_bits_truncate(0o644))?);
                }
                Step::Link { target, link } => {
                    // SAFETY: two NUL-terminated paths prepared in the parent.
                    #[allow(unsafe_code)]
                    if unsafe { libc::symlink(target.as_ptr(), link.as_ptr()) } != 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
                Step::Bind { source, target, writable } => {
                    let bind = MsFlags::MS_BIND | MsFlags::MS_REC;
                    nix::mount::mount(Some(source.as_c_str()), target.as_c_str(), none, bind, none)?;
                    if let Some(locked) = writable {
                        let remount =
                            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | *locked;
                        nix::mount::mount(none, target.as_c_str(), none, remount, none)?;
                    }
                }
            }
        }
        nix::unistd::chdir(self.mount_point.as_c_str())?;
        nix::unistd::pivot_root(c".", c".")?;
        // The old root now lies over the new one: detach it, and with it
        // every path of the machine not bound above.
        nix::mount::umount2(c".", MntFlags::MNT_DETACH)?;
        nix::unistd::chdir(c"/")?;
        Ok(())
    }
}

struct Planner {
    root: PathBuf,
    /// Directories made in the tmpfs (by their path in the command's view).
    made: HashSet<PathBuf>,
    /// Trees bound so far.
    bound: Vec<PathBuf>,
    /// Links made.
    links: Vec<PathBuf>,
    steps: Vec<Step>,
}

impl Planner {
    fn view(&mut self, view: &View) -> io::Result<()> {
        let Ok(meta) = std::fs::symlink_metadata(&view.path) else { return Ok(()) };
        if meta.file_type().is_symlink() {
            // `/bin` → `usr/bin` on merged systems: the same link.
            if self.covered(&view.path) {
                return Ok(());
            }
            let target = std::fs::read_link(&view.path)?;
            if let Some(parent) = view.path.parent() {
                self.dir(parent)?;
            }
            return self.link(&view.path, &target);
        }
        let writable = view.writable.then(|| crate::confine::locked_flags(&view.path));
        self.bind(&view.path, &view.path, writable)
    }

    /// Makes `link` (in the command's view) point to `target`.
    fn link(&mut self, link: &Path, target: &Path) -> io::Result<()> {
        self.steps.push(Step::Link { target: c_path(target)?, link: self.inside(link)? });
        self.links.push(link.to_path_buf());
        Ok(())
    }

    /// Whether `path` is seen through a tree bound before.
    fn covered(&self, path: &Path) -> bool {
        self.bound.iter().any(|tree| path.starts_with(tree))
    }

    /// Binds `source` at `target` (in the command's view); `writable`
    /// carries the flags a remount `nosuid,nodev` must keep.
    fn bind(&mut self, source: &Path, target: &Path, writable: Option<MsFlags>) -> io::Result<()> {
        if self.covered(target) {
            return Ok(());
        }
        let is_dir = std::fs::metadata(source)?.is_dir();
        if let Some(parent) = target.parent() {
            self.dir(parent)?;
        }
        if is_dir {
            self.dir(target)?;
        } else {
            self.steps.push(Step::File(self.inside(target)?));
        }
        self.steps.push(Step::Bind { source: c_path(source)?, target: self.inside(target)?, writable });
        self.bound.push(target.to_path_buf());
        Ok(())
    }

    /// Makes `dir` and its parents in the tmpfs.
    fn dir(&mut self, dir: &Path) -> io::Result<()> {
        let mut path = PathBuf::from("/");
        for part in dir.components().filter(|part| matches!(part, Component::Normal(_))) {
            path.push(part);
            if self.made.insert(path.clone()) {
                self.steps.push(Step::Dir(self.inside(&path)?));
            }
        }
        Ok(())
    }

    /// `path` (absolute, in the command's view) below the mount point.
    fn inside(&self, path: &Path) -> io::Result<CString> {
        c_path(&self.root.join(path.strip_prefix("/").unwrap_or(path)))
    }
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(root: &NewRoot) -> Vec<String> {
        root.steps
            .iter()
            .map(|step| match step {
                Step::Dir(path) => format!("dir {}", path.to_string_lossy()),
                Step::File(path) => format!("file {}", path.to_string_lossy()),
                Step::Link { target, link } => {
                    format!("link {} -> {}", link.to_string_lossy(), target.to_string_lossy())
                }
                Step::Bind { source, target, writable } => format!(
                    "bind {} {} {}",
                    source.to_string_lossy(),
                    target.to_string_lossy(),
                    if writable.is_some() { "rw" } else { "ro" }
                ),
            })
            .collect()
    }

    #[test]
    fn views_inside_a_bound_tree_are_seen_through_it_and_nothing_is_made_in_it() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let base = std::fs::canonicalize(dir.path())?;
        let (mount_point, tmp, work) = (base.join("root"), base.join("tmp"), base.join("work"));
        for path in [&mount_point, &tmp, &work.join("sub")] {
            std::fs::create_dir_all(path)?;
        }
        let views = [
            View { path: work.join("sub"), writable: false },
            View { path: work.clone(), writable: true },
            View { path: base.join("missing"), writable: false },
        ];
        let root = NewRoot::plan(&mount_point, &tmp, &views)?;
        let steps = steps(&root);
        let inside =
            |path: &Path| mount_point.join(path.strip_prefix("/").unwrap_or(path)).to_string_lossy().into_owned();
        assert!(steps.contains(&format!("bind {} {} rw", work.display(), inside(&work))), "{steps:#?}");
        assert!(steps.contains(&format!("bind {} {} rw", tmp.display(), inside(&tmp))), "{steps:#?}");
        // The subdirectory is seen through the workdir: no mount, no mount point.
        assert!(!steps.iter().any(|step| step.contains(&inside(&work.join("sub")))), "{steps:#?}");
        assert!(!steps.iter().any(|step| step.contains("missing")), "{steps:#?}");
        // What it sees: its trees and what lies in them, nothing else.
        for seen in [work.join("sub/x"), tmp.join("t"), PathBuf::from("/dev/null"), PathBuf::from("/dev/fd/0")] {
            assert!(root.sees(&seen), "{}", seen.display());
        }
        for unseen in [base.join("other"), PathBuf::from("/run/x.sock"), PathBuf::from("/dev/log")] {
            assert!(!root.sees(&unseen), "{}", unseen.display());
        }
        assert!(steps.contains(&format!("bind /dev/null {} ro", inside(Path::new("/dev/null")))), "{steps:#?}");
        assert!(steps.contains(&format!("file {}", inside(Path::new("/dev/null")))), "{steps:#?}");
        // Every directory is made before what is made in it.
        for (at, step) in steps.iter().enumerate() {
            if let Some(path) = step.strip_prefix("dir ") {
                let parent = Path::new(path).parent().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
                if parent.len() > mount_point.as_os_str().len() {
                    assert!(steps[..at].contains(&format!("dir {parent}")), "{path} before its parent: {steps:#?}");
                }
            }
        }
        Ok(())
    }
}
