//! What the original runtime's `bundle-loader.ts` does around the YAML:
//! which files of a bundle directory are read, which installed packages a
//! bundle depends on (its Package's `spec.dependencies`, pinned by
//! `goondan.lock.yaml`), where they are installed, and where an `entry`
//! of a package is.
//!
//! Installed packages live at `<packages dir>/<scope>/<name>/<version>/`
//! (`<packages dir>/<name>/<version>/` without a scope); the packages
//! directory is the state root's `packages/`, given by the caller. A
//! package's manifest is its `dist/goondan.yaml`, else its `goondan.yaml`.
//!
//! Dependencies are found breadth-first from the bundle's own, each at
//! the version the lock file pins, and loaded leaves first: each package
//! is loaded with the ones loaded before it as its dependencies, so an
//! index into that list ([`crate::PackageScope::Dependency`]) names the
//! same package in every package of one load. `@goondan/base` is never
//! loaded from disk: it is compiled in (a lock file entry for it, as the
//! original's samples have, is accepted).

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value as JsonValue;

use crate::bundle::{
    BASE_PACKAGE, BUNDLE_FILE, Bundle, LOCK_FILE, MAX_FILE_BYTES, ParsedFile, assemble, parse_file, read_text,
};
use crate::diagnostic::{Diagnostic, DiagnosticCode};
use crate::files::read_regular_file;

/// The file names (without `.yaml`/`.yml`, compared case-insensitively) the
/// original reads from a bundle directory.
pub const BUNDLE_FILE_NAMES: [&str; 16] = [
    "goondan",
    "model",
    "models",
    "agent",
    "agents",
    "tool",
    "tools",
    "extension",
    "extensions",
    "connector",
    "connectors",
    "connection",
    "connections",
    "swarm",
    "swarms",
    "resources",
];

/// Directories never searched for bundle files.
const SKIPPED_DIRS: [&str; 3] = ["dist", "node_modules", ".git"];

/// How deep the search goes (links are not followed, so there is no loop:
/// this and [`MAX_DIRS`] bound the work in a very large tree).
const MAX_DEPTH: usize = 32;

/// The most directories searched.
pub const MAX_DIRS: usize = 10_000;

/// Whether `name` (a file's name, without its directory) is one of the
/// names a bundle directory's files have ([`BUNDLE_FILE_NAMES`] with
/// `.yaml` or `.yml`, any case).
pub fn is_bundle_file_name(name: &std::ffi::OsStr) -> bool {
    let name = name.to_string_lossy().to_lowercase();
    let stem = name.strip_suffix(".yaml").or_else(|| name.strip_suffix(".yml"));
    stem.is_some_and(|stem| BUNDLE_FILE_NAMES.contains(&stem))
}

/// Whether a directory of this name is searched for bundle files (not
/// `dist`, `node_modules`, `.git`).
pub fn is_searched_dir_name(name: &std::ffi::OsStr) -> bool {
    !SKIPPED_DIRS.contains(&name.to_string_lossy().to_lowercase().as_str())
}

/// What a search of a bundle directory found: its bundle files (see
/// [`collect_bundle_files`]) and every directory it looked in (where a new
/// bundle file would be found: what `gdn run --watch` watches).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BundleSearch {
    /// The bundle files, in load order.
    pub files: Vec<PathBuf>,
    /// The directories searched, `dir` first.
    pub dirs: Vec<PathBuf>,
}

/// The bundle files under `dir`, sorted by path as the original sorts them
/// (`localeCompare`, approximated as case-insensitive then bytewise).
/// Symbolic links are not followed (the original's `readdir` entries of a
/// link are neither files nor directories).
///
/// The search starts only when `dir` itself holds a bundle file (a
/// `goondan.yaml`, usually): `gdn` run in a directory that is no bundle
/// (the home directory) must not walk its whole tree to say so. It visits
/// at most [`MAX_DIRS`] directories.
pub fn collect_bundle_files(dir: &Path) -> Vec<PathBuf> {
    search_bundle_dir(dir).files
}

/// [`collect_bundle_files`] with the directories it searched.
pub fn search_bundle_dir(dir: &Path) -> BundleSearch {
    let mut top = BundleSearch::default();
    let mut budget = 1;
    walk(dir, MAX_DEPTH, &mut budget, &mut top);
    if top.files.is_empty() {
        return BundleSearch::default();
    }
    let mut found = BundleSearch::default();
    let mut budget = MAX_DIRS;
    walk(dir, 0, &mut budget, &mut found);
    found.files.sort_by(|a, b| {
        let (a, b) = (a.to_string_lossy(), b.to_string_lossy());
        a.to_lowercase().cmp(&b.to_lowercase()).then_with(|| a.cmp(&b))
    });
    found
}

fn walk(dir: &Path, depth: usize, budget: &mut usize, found: &mut BundleSearch) {
    if *budget == 0 {
        return;
    }
    *budget -= 1;
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    found.dirs.push(dir.to_path_buf());
    for entry in entries.flatten() {
        let Ok(file_type) = entry.file_type() else { continue };
        let name = entry.file_name();
        if file_type.is_dir() {
            let path = entry.path();
            // A state root kept in the project (its workdirs hold what a
            // model wrote) and installed packages are never the bundle's.
            if depth < MAX_DEPTH
                && is_searched_dir_name(&name)
                && !goondan_core::package_dir::is_state_or_install(&path)
            {
                walk(&path, depth + 1, budget, found);
            }
            continue;
        }
        if file_type.is_file() && is_bundle_file_name(&name) {
            found.files.push(entry.path());
        }
    }
}

/// The files an `entry` may be, in the order they are tried: the entry
/// itself; for `x.ts`, then `dist/src/x.js` when it is under `src/`
/// (a published package's compiled code), then `x.js`.
///
/// The original tries the compiled files first; here the file named
/// comes first, so a bundle whose entry exists loads the same file as
/// before packages were supported.
pub fn entry_candidates(root: &Path, entry: &str) -> Vec<PathBuf> {
    let normalized = entry.strip_prefix("./").unwrap_or(entry);
    let mut candidates = vec![root.join(normalized)];
    if let Some(stem) = normalized.strip_suffix(".ts") {
        if let Some(under_src) = stem.strip_prefix("src/") {
            candidates.push(root.join(format!("dist/src/{under_src}.js")));
        }
        candidates.push(root.join(format!("{stem}.js")));
    }
    candidates
}

/// One dependency as a Package lists it.
#[derive(Debug, Clone)]
struct Dependency {
    name: String,
    version: String,
}

/// The `spec.dependencies` of a Package document (`None`, or not a
/// Package: none). Entries without a name or version are skipped, as the
/// original skips them.
fn dependencies_of(package: Option<&JsonValue>) -> Vec<Dependency> {
    let Some(package) = package.filter(|p| p.get("kind").and_then(JsonValue::as_str) == Some("Package")) else {
        return Vec::new();
    };
    let Some(list) = package.pointer("/spec/dependencies").and_then(JsonValue::as_array) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|item| {
            let name = item.get("name")?.as_str().filter(|n| !n.is_empty())?;
            let version = item.get("version")?.as_str().filter(|v| !v.is_empty())?;
            Some(Dependency { name: name.to_owned(), version: version.to_owned() })
        })
        .collect()
}

/// The versions `goondan.lock.yaml` pins, by package name. A missing file
/// pins nothing; a file that does not read or parse is reported.
fn read_lock_versions(root: &Path, diagnostics: &mut Vec<Diagnostic>) -> HashMap<String, Vec<String>> {
    let mut versions: HashMap<String, Vec<String>> = HashMap::new();
    let path = root.join(LOCK_FILE);
    if !path.exists() {
        return versions;
    }
    let parsed = read_regular_file(&path, MAX_FILE_BYTES)
        .map_err(|e| e.to_string())
        .and_then(|bytes| String::from_utf8(bytes).map_err(|e| e.to_string()))
        .and_then(|text| parse_file(&text, LOCK_FILE).map_err(|d| d.message));
    let documents = match parsed {
        Ok(documents) => documents,
        Err(message) => {
            diagnostics.push(
                Diagnostic::error(DiagnosticCode::ParseError, LOCK_FILE.to_owned(), message)
                    .suggest("Run `gdn package install` to write the lock file again."),
            );
            return versions;
        }
    };
    let packages = documents.first().and_then(|d| d.value.get("packages")).and_then(JsonValue::as_object);
    for key in packages.into_iter().flat_map(|p| p.keys()) {
        if let Some((name, version)) = parse_lock_key(key) {
            versions.entry(name.to_owned()).or_default().push(version.to_owned());
        }
    }
    versions
}

/// `"@scope/name@1.2.3"` → (`@scope/name`, `1.2.3`); `name@1.2.3` likewise.
fn parse_lock_key(key: &str) -> Option<(&str, &str)> {
    let key = key.trim();
    let key = key
        .strip_prefix('"')
        .and_then(|k| k.strip_suffix('"'))
        .or_else(|| key.strip_prefix('\'').and_then(|k| k.strip_suffix('\'')))
        .unwrap_or(key);
    let at = if key.starts_with('@') {
        let slash = key.find('/').filter(|s| *s > 1)?;
        slash + 1 + key.get(slash + 1..)?.find('@')?
    } else {
        key.rfind('@')?
    };
    let (name, version) = (key.get(..at)?, key.get(at + 1..)?);
    (!name.is_empty() && !name.ends_with('/') && !version.is_empty()).then_some((name, version))
}

/// The version of `dependency` to load, as the original picks it: an
/// exact version must be the one locked (or, with nothing locked for the
/// name, is taken as is); a range takes the highest locked version.
fn resolve_version(dependency: &Dependency, locked: &HashMap<String, Vec<String>>) -> Option<String> {
    let exact = parse_semver(&dependency.version).is_some();
    match locked.get(&dependency.name).filter(|v| !v.is_empty()) {
        None => exact.then(|| dependency.version.clone()),
        Some(versions) if exact => versions.iter().find(|v| **v == dependency.version).cloned(),
        Some(versions) => versions.iter().max_by(|a, b| compare_versions(a, b)).cloned(),
    }
}

/// A version's numbers and pre-release identifiers.
type Semver<'a> = ([u64; 3], Vec<&'a str>);

fn parse_semver(version: &str) -> Option<Semver<'_>> {
    let version = version.split_once('+').map_or(version, |(v, _)| v);
    let (core, pre) = match version.split_once('-') {
        Some((core, pre)) => (core, Some(pre)),
        None => (version, None),
    };
    let mut numbers = [0u64; 3];
    let mut parts = core.split('.');
    for number in &mut numbers {
        let part = parts.next()?;
        if part.is_empty() || (part.len() > 1 && part.starts_with('0')) || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *number = part.parse().ok()?;
    }
    if parts.next().is_some() {
        return None;
    }
    let pre: Vec<&str> = match pre {
        Some(pre) => pre.split('.').collect(),
        None => Vec::new(),
    };
    if pre.iter().any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')) {
        return None;
    }
    Some((numbers, pre))
}

fn compare_versions(a: &str, b: &str) -> Ordering {
    let (Some((a_numbers, a_pre)), Some((b_numbers, b_pre))) = (parse_semver(a), parse_semver(b)) else {
        return a.cmp(b);
    };
    a_numbers.cmp(&b_numbers).then_with(|| match (a_pre.is_empty(), b_pre.is_empty()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => {
            for (x, y) in a_pre.iter().zip(&b_pre) {
                let order = match (x.parse::<u64>(), y.parse::<u64>()) {
                    (Ok(x), Ok(y)) => x.cmp(&y),
                    (Ok(_), Err(_)) => Ordering::Less,
                    (Err(_), Ok(_)) => Ordering::Greater,
                    (Err(_), Err(_)) => x.cmp(y),
                };
                if order != Ordering::Equal {
                    return order;
                }
            }
            a_pre.len().cmp(&b_pre.len())
        }
    })
}

/// Where `name`@`version` is installed under `packages_dir` (the layout the
/// installer writes: [`goondan_core::package_dir`]).
pub fn installed_package_root(packages_dir: &Path, name: &str, version: &str) -> PathBuf {
    goondan_core::package_dir::installed_root(packages_dir, name, version)
}

/// A package's manifest: `dist/goondan.yaml`, else `goondan.yaml`.
fn manifest_of(package_root: &Path) -> Option<PathBuf> {
    [package_root.join("dist").join(BUNDLE_FILE), package_root.join(BUNDLE_FILE)].into_iter().find(|p| p.is_file())
}

/// A dependency found on disk, not yet loaded.
struct Found {
    name: String,
    version: String,
    root: PathBuf,
    manifest: PathBuf,
    label: String,
    documents: Vec<crate::yaml::YamlDocument>,
}

/// A diagnostic of an installed package's own documents: a missing
/// `entry` (the package was published without its code) says which
/// package, and that it is fixed by a good copy of the package, not by an
/// edit of the bundle.
fn in_package(mut diagnostic: Diagnostic, name: &str, version: &str) -> Diagnostic {
    if diagnostic.code == DiagnosticCode::EntryNotFound {
        diagnostic.message = format!("{} in the installed package {name}@{version}", diagnostic.message);
        diagnostic.suggestion = Some(format!(
            "The package lacks the file (and its compiled fallback under dist/): reinstall it with `gdn package \
             install`; if it stays missing, {name}@{version} was published without it and needs a fixed version."
        ));
    }
    diagnostic
}

/// Loads the dependencies of the Package document `package` of the bundle
/// at `root` from `packages_dir` (see the module docs), with the
/// diagnostics of what is missing and of the packages' own documents.
pub(crate) fn load_dependencies(
    root: &Path,
    package: Option<&JsonValue>,
    packages_dir: &Path,
    home: Option<&Path>,
) -> (Vec<Arc<Bundle>>, Vec<Diagnostic>) {
    let mut diagnostics = Vec::new();
    let direct: Vec<Dependency> = dependencies_of(package).into_iter().filter(|d| d.name != BASE_PACKAGE).collect();
    if direct.is_empty() {
        return (Vec::new(), diagnostics);
    }
    let locked = read_lock_versions(root, &mut diagnostics);
    let mut queue: VecDeque<Dependency> = direct.into();
    let mut visited = HashSet::new();
    let mut found: Vec<Found> = Vec::new();
    while let Some(dependency) = queue.pop_front() {
        let Some(version) = resolve_version(&dependency, &locked) else {
            diagnostics.push(
                Diagnostic::error(
                    DiagnosticCode::PackageLockMissing,
                    LOCK_FILE.to_owned(),
                    format!("{LOCK_FILE} pins no version of the dependency {}@{}", dependency.name, dependency.version),
                )
                .suggest("Run `gdn package install` to install the dependencies and write the lock file."),
            );
            continue;
        };
        if !visited.insert(format!("{}@{version}", dependency.name)) {
            continue;
        }
        let package_root = installed_package_root(packages_dir, &dependency.name, &version);
        if !package_root.exists() {
            diagnostics.push(
                Diagnostic::error(
                    DiagnosticCode::PackageNotInstalled,
                    package_root.display().to_string(),
                    format!("the package {}@{version} is not installed", dependency.name),
                )
                .suggest("Run `gdn package install` to install the dependencies."),
            );
            continue;
        }
        let Some(manifest) = manifest_of(&package_root) else {
            diagnostics.push(
                Diagnostic::error(
                    DiagnosticCode::PackageManifestMissing,
                    package_root.display().to_string(),
                    format!("the package {}@{version} has no manifest (goondan.yaml)", dependency.name),
                )
                .suggest(
                    "Reinstall it with `gdn package install`; a package's tarball must hold goondan.yaml or \
                     dist/goondan.yaml.",
                ),
            );
            continue;
        };
        let relative = if manifest.starts_with(package_root.join("dist")) { "dist/goondan.yaml" } else { BUNDLE_FILE };
        let label = format!("{}/{relative}", dependency.name);
        let documents = match read_text(&manifest, &label).and_then(|text| parse_file(&text, &label)) {
            Ok(documents) => documents,
            Err(diagnostic) => {
                diagnostics.push(diagnostic);
                continue;
            }
        };
        let children = dependencies_of(documents.first().map(|d| &d.value));
        queue.extend(children.into_iter().filter(|d| d.name != BASE_PACKAGE));
        found.push(Found { name: dependency.name, version, root: package_root, manifest, label, documents });
    }
    // Leaves first: a package is loaded with those loaded before it.
    let mut loaded: Vec<Arc<Bundle>> = Vec::new();
    for package in found.into_iter().rev() {
        let parsed =
            vec![ParsedFile { path: package.manifest.clone(), label: package.label, documents: package.documents }];
        let report = assemble(parsed, Some(&package.root), package.manifest, home, loaded.clone());
        diagnostics.extend(report.diagnostics.into_iter().map(|d| in_package(d, &package.name, &package.version)));
        if let Some(mut bundle) = report.bundle {
            bundle.set_package_name_if_missing(&package.name);
            loaded.push(Arc::new(bundle));
        }
    }
    (loaded, diagnostics)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_keys_split_at_the_version() {
        assert_eq!(parse_lock_key("\"@goondan/base@0.0.3-alpha17\""), Some(("@goondan/base", "0.0.3-alpha17")));
        assert_eq!(parse_lock_key("@acme/tools@1.2.3"), Some(("@acme/tools", "1.2.3")));
        assert_eq!(parse_lock_key("plain@2.0.0"), Some(("plain", "2.0.0")));
        assert_eq!(parse_lock_key("@acme/tools"), None);
        assert_eq!(parse_lock_key("nover@"), None);
    }

    #[test]
    fn versions_resolve_as_the_original_resolves_them() {
        let locked: HashMap<String, Vec<String>> =
            [("a".to_owned(), vec!["1.0.0".to_owned(), "1.2.0-beta.2".to_owned(), "1.2.0".to_owned()])].into();
        let dep = |name: &str, version: &str| Dependency { name: name.to_owned(), version: version.to_owned() };
        assert_eq!(resolve_version(&dep("a", "^1.0.0"), &locked).as_deref(), Some("1.2.0"));
        assert_eq!(resolve_version(&dep("a", "1.0.0"), &locked).as_deref(), Some("1.0.0"));
        assert_eq!(resolve_version(&dep("a", "1.1.0"), &locked), None);
        assert_eq!(resolve_version(&dep("b", "1.1.0"), &locked).as_deref(), Some("1.1.0"));
        assert_eq!(resolve_version(&dep("b", "^1.1.0"), &locked), None);
        assert_eq!(compare_versions("1.2.0-alpha.10", "1.2.0-alpha.9"), Ordering::Greater);
        assert_eq!(compare_versions("0.0.3-alpha17", "0.0.3"), Ordering::Less);
    }

    #[test]
    fn only_a_directory_holding_a_bundle_file_is_searched() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let nested = dir.path().join("project");
        std::fs::create_dir_all(nested.join("node_modules/x")).unwrap_or_else(|e| panic!("{e}"));
        for file in ["goondan.yaml", "Agents.YML", "node_modules/x/tools.yaml", "other.yaml"] {
            std::fs::write(nested.join(file), "").unwrap_or_else(|e| panic!("{e}"));
        }
        // The parent holds no bundle file of its own: not searched.
        assert!(collect_bundle_files(dir.path()).is_empty());
        let found = collect_bundle_files(&nested);
        assert_eq!(found, [nested.join("Agents.YML"), nested.join("goondan.yaml")]);
    }

    #[test]
    fn entries_fall_back_to_compiled_code() {
        let root = Path::new("/p");
        assert_eq!(
            entry_candidates(root, "./src/tool.ts"),
            [PathBuf::from("/p/src/tool.ts"), PathBuf::from("/p/dist/src/tool.js"), PathBuf::from("/p/src/tool.js")]
        );
        assert_eq!(entry_candidates(root, "tool.js"), [PathBuf::from("/p/tool.js")]);
        assert_eq!(installed_package_root(root, "@acme/tools", "1.0.0"), PathBuf::from("/p/acme/tools/1.0.0"));
    }
}
