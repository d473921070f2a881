//! What `file-system` leaves alone by default, inside the workdir too.
//!
//! When the workdir is (or holds) the bundle's directory, without this an
//! agent with only `file-system` could rewrite `goondan.yaml` (and give
//! itself `bash`), plant a `package.json` or `.env.local` that the runtime
//! reads at the next start, or read the operator's `.env`. By default it
//! may therefore not write (nor create, nor make a directory at) anything
//! in the bundle's directory, nor the files the runtime loads as
//! configuration or code wherever they are — the bundle file, its lock
//! file, every prompt file, every Tool, Extension and Connector module
//! ([`goondan_config::Bundle::loaded_files`]) — and may neither read nor
//! write a file whose name, or the name of a directory it lies in below its
//! root, starts with `.env` (`.env`, `.env.local`, `.envrc`, `.envs/…`).
//!
//! Protected files are compared by identity, not by text: the real path
//! (links resolved, so `./x/../goondan.yaml` or a link to it is the same
//! file) and the device and inode of files that exist (so a hard link is
//! too). The agent's `spec.tools` item for `file-system` lifts either rule
//! with `config: {allowConfigWrites: true}` or `config: {allowDotEnv: true}`;
//! that config lives in `goondan.yaml`, which the rule protects.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use goondan_core::JsonObject;

/// `config` key of the `file-system` tool item that allows writing the
/// bundle's own files.
pub const ALLOW_CONFIG_WRITES: &str = "allowConfigWrites";
/// `config` key of the `file-system` tool item that allows `.env*` files.
pub const ALLOW_DOT_ENV: &str = "allowDotEnv";

/// The files the runtime loads, by real path and by (device, inode).
#[derive(Debug, Clone, Default)]
pub struct ProtectedFiles {
    paths: HashSet<PathBuf>,
    ids: HashSet<(u64, u64)>,
}

impl ProtectedFiles {
    /// The identities of `files` as they are now. A missing file (a lock
    /// file not written yet) is kept by the real path it would have.
    pub fn new(files: &[PathBuf]) -> Self {
        let mut protected = Self::default();
        for file in files {
            // `..` folded as the tools fold it, before links are resolved.
            let file = &crate::paths::normalize(file);
            if let Ok(meta) = std::fs::metadata(file) {
                protected.ids.insert((meta.dev(), meta.ino()));
            }
            let real = std::fs::canonicalize(file).ok().or_else(|| {
                let (parent, name) = (file.parent()?, file.file_name()?);
                Some(std::fs::canonicalize(parent).ok()?.join(name))
            });
            protected.paths.extend(real);
        }
        protected
    }

    /// Whether the real path `real`, or the existing file `id`, is protected.
    pub fn contains(&self, real: &Path, id: Option<(u64, u64)>) -> bool {
        self.paths.contains(real) || id.is_some_and(|id| self.ids.contains(&id))
    }
}

/// What `file-system` refuses, for one agent's use of it.
#[derive(Debug, Clone, Default)]
pub struct FsGuard {
    /// The bundle's own files.
    pub config_files: ProtectedFiles,
    /// `allowConfigWrites: true`: the bundle's files may be written.
    pub allow_config_writes: bool,
    /// `allowDotEnv: true`: `.env*` files may be read and written.
    pub allow_dot_env: bool,
    /// The bundle's directory (real path): nothing in it may be written or
    /// made, since a new file there can be configuration or code the
    /// runtime or the JavaScript runtime reads later (a `.env.local`, a
    /// `package.json`, a module's new import, a split bundle file).
    pub bundle_tree: Option<PathBuf>,
}

impl FsGuard {
    /// The guard of an agent whose bundle loads `files`, with the `config`
    /// of its `file-system` item (only a literal `true` lifts a rule).
    pub fn new(files: &[PathBuf], config: Option<&JsonObject>) -> Self {
        let flag = |key: &str| config.and_then(|c| c.get(key)).and_then(serde_json::Value::as_bool) == Some(true);
        Self {
            config_files: ProtectedFiles::new(files),
            allow_config_writes: flag(ALLOW_CONFIG_WRITES),
            allow_dot_env: flag(ALLOW_DOT_ENV),
            bundle_tree: None,
        }
    }

    /// The same guard, also refusing writes anywhere under `root` (the
    /// bundle's directory).
    #[must_use]
    pub fn with_bundle_tree(mut self, root: &Path) -> Self {
        self.bundle_tree = Some(std::fs::canonicalize(root).unwrap_or_else(|_| crate::paths::normalize(root)));
        self
    }

    /// Whether writing the real path `real` (an existing file `id`) is
    /// refused, for a call whose workdir is `workdir` (real path): a
    /// workdir inside the bundle's directory (not the directory itself)
    /// stays writable, the rest of the tree does not.
    pub fn refuses_write(&self, real: &Path, id: Option<(u64, u64)>, workdir: &Path) -> bool {
        let in_bundle_tree = self.bundle_tree.as_ref().is_some_and(|tree| {
            real.starts_with(tree)
                && !(workdir != tree.as_path() && workdir.starts_with(tree) && real.starts_with(workdir))
        });
        !self.allow_config_writes && (self.config_files.contains(real, id) || in_bundle_tree)
    }

    /// Whether a path is a refused `.env*` file: `relative` (below its root)
    /// or the path as sent has a component starting with `.env`.
    pub fn refuses_dot_env(&self, relative: &Path, sent: &str) -> bool {
        !self.allow_dot_env && (has_dot_env(relative) || has_dot_env(Path::new(sent)))
    }
}

fn has_dot_env(path: &Path) -> bool {
    path.components().any(|part| part.as_os_str().to_string_lossy().starts_with(".env"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::test_support::workdir;

    #[test]
    fn files_are_known_by_real_path_and_identity() {
        let dir = workdir();
        let yaml = dir.path.join("goondan.yaml");
        std::fs::write(&yaml, "x").unwrap_or_else(|e| panic!("{e}"));
        let meta = std::fs::metadata(&yaml).unwrap_or_else(|e| panic!("{e}"));
        let files = ProtectedFiles::new(&[dir.path.join("./sub/../goondan.yaml"), dir.path.join("goondan.lock.yaml")]);
        assert!(files.contains(&yaml, None));
        assert!(files.contains(&dir.path.join("goondan.lock.yaml"), None));
        assert!(files.contains(&dir.path.join("other"), Some((meta.dev(), meta.ino()))));
        assert!(!files.contains(&dir.path.join("other"), None));
    }

    #[test]
    fn config_lifts_each_rule_with_a_literal_true() {
        let config = |value: serde_json::Value| value.as_object().cloned();
        let guard = FsGuard::new(&[], config(json!({"allowConfigWrites": true, "allowDotEnv": "yes"})).as_ref());
        assert!(guard.allow_config_writes && !guard.allow_dot_env);
        let guard = FsGuard::new(&[], None);
        assert!(guard.refuses_dot_env(Path::new(".envs/prod/db"), "x"));
        assert!(guard.refuses_dot_env(Path::new("notes.txt"), ".env"));
        assert!(!guard.refuses_dot_env(Path::new("env/x"), "env/x"));
    }

    #[test]
    fn nothing_in_the_bundle_tree_is_writable_unless_config_writes_are_allowed() {
        let dir = workdir();
        let guard = FsGuard::new(&[], None).with_bundle_tree(&dir.path);
        let elsewhere = Path::new("/elsewhere");
        for name in ["package.json", ".env.local", "tools/lib/helper.ts", "node_modules/x/index.js", "notes.md"] {
            assert!(guard.refuses_write(&dir.path.join(name), None, elsewhere), "{name}");
            // The bundle's directory as the workdir is no exception.
            assert!(guard.refuses_write(&dir.path.join(name), None, &dir.path), "{name}");
        }
        assert!(!guard.refuses_write(&elsewhere.join("notes.md"), None, elsewhere));
        // A workdir inside the bundle's directory is writable, and only it.
        let inside = dir.path.join("state/workdir");
        assert!(!guard.refuses_write(&inside.join("notes.md"), None, &inside));
        assert!(guard.refuses_write(&dir.path.join("state/notes.md"), None, &inside));
        let allowed = FsGuard::new(&[], json!({"allowConfigWrites": true}).as_object()).with_bundle_tree(&dir.path);
        assert!(!allowed.refuses_write(&dir.path.join("package.json"), None, elsewhere));
    }
}
