//! Loading a bundle: file limits, parsing, per-document validation, and the
//! checks across documents (Package position, duplicate names, references).
//!
//! A bundle directory may split its documents over several files (see
//! [`crate::packages::collect_bundle_files`]); diagnostics name each
//! document as `<file>#<index in that file>`.
//!
//! References without `package` resolve in the referring resource's own
//! package; `package: "@goondan/base"` reaches the compiled-in package, and
//! the name of an installed dependency that package (see
//! [`crate::packages`]). Names are unique within a package.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use goondan_core::ObjectRef;

use crate::diagnostic::{Diagnostic, DiagnosticCode, Severity};
use crate::files::{FileReadError, read_regular_file};
use crate::placement::HostLabels;
use crate::resources::{AgentSpec, AnyResource, ConnectionSpec, Kind, Resource, SandboxConfig, SwarmSpec, ToolSpec};
use crate::sandbox::{EffectiveSandbox, SandboxSource};
use crate::validate::{DocReporter, document_refs, validate_document};
use crate::yaml::{YamlDocument, parse_documents};

/// Largest accepted `goondan.yaml`.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;
/// Most documents accepted in one file.
pub const MAX_DOCUMENTS: usize = 100;
/// The name of the compiled-in package.
pub const BASE_PACKAGE: &str = "@goondan/base";
/// The file looked for in a bundle directory.
pub const BUNDLE_FILE: &str = "goondan.yaml";
/// The package lock file next to the bundle file.
pub const LOCK_FILE: &str = "goondan.lock.yaml";

/// Which package a resolved resource lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PackageScope {
    /// The bundle itself.
    Local,
    /// The compiled-in `@goondan/base`.
    Base,
    /// An installed dependency: the index in [`Bundle::dependencies`] of
    /// the bundle the reference was resolved from (the same index names the
    /// same package in every package of one load: see [`crate::packages`]).
    Dependency(usize),
}

impl PackageScope {
    /// This scope, as the package `within` (given in the root bundle's
    /// terms) resolved it, in the root bundle's terms: the package's own
    /// resources are `within`; the built-in package and its dependencies
    /// are named alike in every package of one load (see
    /// [`crate::packages`]).
    pub fn seen_from(self, within: PackageScope) -> PackageScope {
        match self {
            PackageScope::Local => within,
            other => other,
        }
    }
}

/// A resource with the package it lives in, in the root bundle's terms;
/// it derefs to the resource.
#[derive(Debug)]
pub struct Scoped<'a, T> {
    /// Where it lives.
    pub scope: PackageScope,
    /// The resource.
    pub resource: &'a Resource<T>,
}

impl<T> Clone for Scoped<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Scoped<'_, T> {}

impl<T> std::ops::Deref for Scoped<'_, T> {
    type Target = Resource<T>;
    fn deref(&self) -> &Self::Target {
        self.resource
    }
}

/// Two agents of one name, from different packages, in one Swarm: refused,
/// as the runtime addresses the agents of a swarm by name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "Swarm '{swarm}' has two agents named '{agent}': one of {first}, one of {second}; agents of one swarm are \
     addressed by name"
)]
pub struct AgentNameClash {
    /// The Swarm's name.
    pub swarm: String,
    /// The name both agents have.
    pub agent: String,
    /// The package of the one listed first ([`Bundle::package_label`]).
    pub first: String,
    /// The package of the other.
    pub second: String,
    /// Where the Swarm names the other: `spec.agents[i]` or `spec.entryAgent`.
    pub path: String,
}

/// A resource of a bundle with the index of its document.
#[derive(Debug, Clone, PartialEq)]
pub struct BundleResource {
    /// 0-based index among the bundle's non-empty documents, counted across
    /// its files in load order ([`Bundle::source_of`] gives the file).
    pub doc_index: usize,
    /// The resource.
    pub resource: AnyResource,
}

/// One YAML file of a bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    /// Where it is.
    pub path: PathBuf,
    /// How diagnostics name it: its path relative to the bundle directory
    /// (`goondan.yaml`, `tools/tools.yaml`), or `<package>/goondan.yaml`
    /// for an installed package.
    pub label: String,
    /// The bundle-wide index of its first document.
    pub first_doc: usize,
}

/// A loaded bundle.
#[derive(Debug, Clone)]
pub struct Bundle {
    root: PathBuf,
    file: PathBuf,
    package_name: Option<String>,
    resources: Vec<BundleResource>,
    index: HashMap<(Kind, String), usize>,
    /// The JSON of every non-empty document by index (empty for the
    /// compiled-in package, which is built from its snapshot).
    documents: Vec<serde_json::Value>,
    /// The YAML files, in load order (one for a single-file bundle).
    files: Vec<SourceFile>,
    /// The installed packages this one can refer to with `package:`.
    dependencies: Vec<Arc<Bundle>>,
}

/// The outcome of loading: the bundle (unless it could not be read or
/// parsed) and every diagnostic found.
#[derive(Debug, Clone)]
pub struct LoadReport {
    /// The bundle with every document that validated.
    pub bundle: Option<Bundle>,
    /// Errors and warnings, in file order.
    pub diagnostics: Vec<Diagnostic>,
}

impl LoadReport {
    /// True when any diagnostic is an error.
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }

    /// The bundle, when there are no errors.
    pub fn valid_bundle(&self) -> Option<&Bundle> {
        if self.has_errors() { None } else { self.bundle.as_ref() }
    }

    fn failed(diagnostics: Vec<Diagnostic>) -> LoadReport {
        LoadReport { bundle: None, diagnostics }
    }
}

/// Finds the YAML file for `path`: the file itself, or `goondan.yaml` in a directory.
pub fn resolve_bundle_file(path: &Path) -> PathBuf {
    if path.is_dir() { path.join(BUNDLE_FILE) } else { path.to_path_buf() }
}

/// The directory whose files make the bundle `path` names: `path` when it
/// is a directory, the directory of a file named `goondan.yaml` (as the
/// original loads the directory of its manifest: `-c dir/goondan.yaml`,
/// and the default `-c ./goondan.yaml`, are the whole bundle); `None` for
/// a YAML file of another name, which is loaded alone.
pub fn bundle_dir(path: &Path) -> Option<PathBuf> {
    if path.is_dir() {
        return Some(path.to_path_buf());
    }
    let named_bundle_file = path.file_name().is_some_and(|name| name.eq_ignore_ascii_case(BUNDLE_FILE));
    if !named_bundle_file {
        return None;
    }
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => Some(parent.to_path_buf()),
        _ => Some(PathBuf::from(".")),
    }
}

/// The YAML files a bundle is loaded from — the one answer to "which files
/// make this bundle", for the loader and everything that watches or scans
/// them: the bundle files of [`bundle_dir`] (see
/// [`crate::packages::collect_bundle_files`]) when there are any, else
/// [`resolve_bundle_file`] alone (which may not exist: loading it says so).
pub fn bundle_source_files(path: &Path) -> Vec<PathBuf> {
    let file = resolve_bundle_file(path);
    let found = bundle_dir(path).map(|dir| crate::packages::collect_bundle_files(&dir)).unwrap_or_default();
    if found.is_empty() { vec![file] } else { found }
}

/// Loads a bundle from a directory or from a YAML file, without installed
/// packages: a `package:` reference to anything but `@goondan/base` is
/// reported as not available. See [`load_bundle_with`].
pub fn load_bundle(path: &Path) -> LoadReport {
    load_bundle_with(path, None)
}

/// Loads a bundle from a directory or from a YAML file.
///
/// A directory is read as the original runtime reads it: every
/// `goondan|model(s)|agent(s)|tool(s)|extension(s)|connector(s)|connection(s)|swarm(s)|resources`
/// `.yaml`/`.yml` file under it, recursively, skipping `dist`,
/// `node_modules` and `.git` (see [`crate::packages::collect_bundle_files`]).
/// A file named `goondan.yaml` stands for its directory; a file of another
/// name is loaded alone ([`bundle_source_files`]).
///
/// `packages_dir` is the state root's `packages/` directory: the
/// dependencies of the bundle's Package (other than the built-in
/// `@goondan/base`) are loaded from it at the versions `goondan.lock.yaml`
/// pins. `None` loads no dependencies.
pub fn load_bundle_with(path: &Path, packages_dir: Option<&Path>) -> LoadReport {
    let file = resolve_bundle_file(path);
    let root = file.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let root = if root.as_os_str().is_empty() { PathBuf::from(".") } else { root };
    let found = bundle_source_files(path);
    let split = found.iter().any(|f| !same_path(f, &file));
    let mut parsed = Vec::new();
    if split {
        let mut diagnostics = Vec::new();
        for path_of_file in found {
            let label = relative_label(&root, &path_of_file);
            match read_text(&path_of_file, &label).and_then(|text| parse_file(&text, &label)) {
                Ok(documents) => parsed.push(ParsedFile { path: path_of_file, label, documents }),
                Err(diagnostic) => diagnostics.push(diagnostic),
            }
        }
        if !diagnostics.is_empty() {
            return LoadReport::failed(diagnostics);
        }
    } else {
        let label = file.file_name().map_or_else(|| BUNDLE_FILE.to_owned(), |n| n.to_string_lossy().into_owned());
        match read_text(&file, &label).and_then(|text| parse_file(&text, &label)) {
            Ok(documents) => parsed.push(ParsedFile { path: file.clone(), label, documents }),
            Err(diagnostic) => return LoadReport::failed(vec![diagnostic]),
        }
    }
    let home = crate::sandbox::home_dir();
    let (dependencies, mut diagnostics) = match packages_dir {
        Some(packages_dir) => {
            // The Package document is the first document of goondan.yaml
            // (or of the one file given).
            let package = parsed.iter().find(|f| same_path(&f.path, &file)).and_then(|f| f.documents.first());
            crate::packages::load_dependencies(&root, package.map(|d| &d.value), packages_dir, home.as_deref())
        }
        None => (Vec::new(), Vec::new()),
    };
    let report = assemble(parsed, Some(&root), file, home.as_deref(), dependencies);
    diagnostics.extend(report.diagnostics);
    LoadReport { bundle: report.bundle, diagnostics }
}

/// Whether two paths name the same file as written (`./goondan.yaml` and
/// `goondan.yaml` do: a search of `.` finds the one, `-c` names the other).
fn same_path(a: &Path, b: &Path) -> bool {
    let written = |p| Path::components(p).filter(|c| !matches!(c, std::path::Component::CurDir));
    written(a).eq(written(b))
}

/// `file` relative to `root` with `/` separators, else its full path.
fn relative_label(root: &Path, file: &Path) -> String {
    match file.strip_prefix(root) {
        Ok(relative) => relative.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/"),
        Err(_) => file.display().to_string(),
    }
}

/// Reads a bundle file as UTF-8 text, or the diagnostic that says why not.
pub(crate) fn read_text(file: &Path, label: &str) -> Result<String, Diagnostic> {
    let fail = |code: DiagnosticCode, message: String, suggestion: &str| {
        Err(Diagnostic::error(code, label.to_owned(), message).suggest(suggestion))
    };
    // Bounded and type-checked: `-c /dev/zero` must not read forever and
    // `-c` on a FIFO must not block (see crate::files).
    let bytes = match read_regular_file(file, MAX_FILE_BYTES) {
        Ok(bytes) => bytes,
        Err(error @ (FileReadError::NotFound { .. } | FileReadError::Io { .. })) => {
            return fail(
                DiagnosticCode::FileNotFound,
                error.to_string(),
                "Pass a bundle directory or YAML file with -c/--config, or run in a directory holding goondan.yaml.",
            );
        }
        Err(error @ FileReadError::NotRegular { .. }) => {
            return fail(
                DiagnosticCode::NotAFile,
                format!("{error}; a bundle is a directory holding goondan.yaml or a YAML file"),
                "Pass a bundle directory or a regular YAML file with -c/--config.",
            );
        }
        Err(FileReadError::TooLarge { .. }) => {
            return fail(
                DiagnosticCode::FileTooLarge,
                format!("{} is larger than the limit of {MAX_FILE_BYTES} bytes (1 MiB)", file.display()),
                "Split the bundle or move large text (prompts) into files referenced with systemRef.",
            );
        }
    };
    match String::from_utf8(bytes) {
        Ok(text) => Ok(text),
        Err(error) => fail(
            DiagnosticCode::ParseError,
            format!("{} is not UTF-8 text: {error}", file.display()),
            "Save the file as UTF-8.",
        ),
    }
}

/// Loads a bundle from YAML text. `root` is where entry files are looked up
/// (`None` skips file checks).
///
/// A `spec.sandbox.writable` entry that is the home directory is judged
/// against `HOME` ([`crate::sandbox::home_dir`]).
pub fn load_from_str(text: &str, label: &str, root: Option<&Path>, file: PathBuf) -> LoadReport {
    load_text(text, label, root, file, crate::sandbox::home_dir().as_deref())
}

/// [`load_from_str`] with the home directory given.
pub(crate) fn load_text(
    text: &str,
    label: &str,
    root: Option<&Path>,
    file: PathBuf,
    home: Option<&Path>,
) -> LoadReport {
    match parse_file(text, label) {
        Ok(documents) => {
            let parsed = vec![ParsedFile { path: file.clone(), label: label.to_owned(), documents }];
            assemble(parsed, root, file, home, Vec::new())
        }
        Err(diagnostic) => LoadReport::failed(vec![diagnostic]),
    }
}

/// One file's documents, parsed.
pub(crate) struct ParsedFile {
    pub path: PathBuf,
    pub label: String,
    pub documents: Vec<YamlDocument>,
}

/// Parses one file's text into documents, within [`MAX_DOCUMENTS`].
pub(crate) fn parse_file(text: &str, label: &str) -> Result<Vec<YamlDocument>, Diagnostic> {
    let documents = match parse_documents(text) {
        Ok(documents) => documents,
        Err(error) => {
            let mut diagnostic = Diagnostic::error(
                DiagnosticCode::ParseError,
                label.to_owned(),
                format!("YAML syntax error: {}", error.message),
            )
            .suggest("Fix the YAML syntax at the position shown.");
            if let Some(position) = error.position {
                diagnostic = diagnostic.at(position.line, position.column);
            }
            return Err(diagnostic);
        }
    };
    if documents.len() > MAX_DOCUMENTS {
        return Err(Diagnostic::error(
            DiagnosticCode::TooManyDocuments,
            label.to_owned(),
            format!("the file has {} documents; the limit is {MAX_DOCUMENTS}", documents.len()),
        )
        .suggest("Split the bundle into packages."));
    }
    Ok(documents)
}

/// Validates the documents of `parsed` (in order) as one package and runs
/// the checks across them. `dependencies` are the packages reachable with
/// `package:`.
pub(crate) fn assemble(
    parsed: Vec<ParsedFile>,
    root: Option<&Path>,
    file: PathBuf,
    home: Option<&Path>,
    dependencies: Vec<Arc<Bundle>>,
) -> LoadReport {
    let mut diagnostics = Vec::new();
    let mut resources = Vec::new();
    let mut files = Vec::new();
    let mut docs = Vec::new();
    for source in &parsed {
        files.push(SourceFile { path: source.path.clone(), label: source.label.clone(), first_doc: docs.len() });
        for (local, document) in source.documents.iter().enumerate() {
            let doc_index = docs.len();
            let mut reporter =
                DocReporter { file_label: &source.label, index: local, document, diagnostics: &mut diagnostics };
            if let Some(resource) = validate_document(&mut reporter, root, home) {
                resources.push(BundleResource { doc_index, resource });
            }
            docs.push(DocAt { label: &source.label, local, document });
        }
    }
    let mut bundle = Bundle {
        root: root.map_or_else(|| PathBuf::from("."), Path::to_path_buf),
        file,
        package_name: None,
        resources,
        index: HashMap::new(),
        documents: docs.iter().map(|doc| doc.document.value.clone()).collect(),
        files,
        dependencies,
    };
    CrossChecks { docs: &docs, diagnostics: &mut diagnostics }.run(&mut bundle);
    LoadReport { bundle: Some(bundle), diagnostics }
}

/// A document with the file it is in and its index there.
struct DocAt<'a> {
    label: &'a str,
    local: usize,
    document: &'a YamlDocument,
}

impl DocAt<'_> {
    /// How a suggestion names this document from `other`: `document #N`
    /// in the same file, `<file>#N` in another.
    fn named_from(&self, other: &DocAt<'_>) -> String {
        if self.label == other.label {
            format!("document #{}", self.local)
        } else {
            format!("{}#{}", self.label, self.local)
        }
    }
}

/// The compiled-in `@goondan/base` package.
pub fn base_package() -> &'static Bundle {
    static BASE: OnceLock<Bundle> = OnceLock::new();
    // The snapshot is the loader's own result for the compiled-in YAML (see
    // crate::base_snapshot); the YAML is loaded only if it is stale.
    BASE.get_or_init(|| crate::base_snapshot::load().unwrap_or_else(load_base_yaml))
}

/// The compiled-in package loaded from its YAML with the loader.
pub(crate) fn load_base_yaml() -> Bundle {
    use crate::base_snapshot::{BASE_LABEL, BASE_YAML, base_file};
    let report = load_from_str(BASE_YAML, BASE_LABEL, None, base_file());
    // The package is checked by a unit test; if it ever failed to load,
    // an empty package keeps the program working and references to it
    // are reported as not found.
    report.bundle.unwrap_or_else(|| Bundle {
        root: PathBuf::new(),
        file: PathBuf::new(),
        package_name: Some(BASE_PACKAGE.to_owned()),
        resources: Vec::new(),
        index: HashMap::new(),
        documents: Vec::new(),
        files: Vec::new(),
        dependencies: Vec::new(),
    })
}

/// A resource found through a reference.
#[derive(Debug, Clone, Copy)]
pub struct Resolved<'a> {
    /// Where it lives.
    pub scope: PackageScope,
    /// The resource.
    pub resource: &'a AnyResource,
}

/// Why a reference does not resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolveError {
    /// No such resource in the package.
    NotFound,
    /// The reference names a package this build cannot reach.
    UnknownPackage(String),
}

impl Bundle {
    /// A bundle of resources that were validated together before (the
    /// built-in package's snapshot): the package name and the index are
    /// derived as [`CrossChecks`] derives them, first definition winning.
    pub(crate) fn from_resources(root: &Path, file: PathBuf, resources: Vec<BundleResource>) -> Bundle {
        let package_name = resources.iter().find_map(|r| match &r.resource {
            AnyResource::Package(p) => Some(p.metadata.name.clone()),
            _ => None,
        });
        let mut index = HashMap::new();
        for (position, entry) in resources.iter().enumerate() {
            index.entry((entry.resource.kind(), entry.resource.name().to_owned())).or_insert(position);
        }
        Bundle {
            root: root.to_path_buf(),
            files: vec![SourceFile {
                path: file.clone(),
                label: crate::base_snapshot::BASE_LABEL.to_owned(),
                first_doc: 0,
            }],
            file,
            package_name,
            resources,
            index,
            documents: Vec::new(),
            dependencies: Vec::new(),
        }
    }

    /// Names an installed package whose manifest has no Package document
    /// after the name it is installed under.
    pub(crate) fn set_package_name_if_missing(&mut self, name: &str) {
        if self.package_name.is_none() {
            self.package_name = Some(name.to_owned());
        }
    }

    /// The directory that holds the bundle's files.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The YAML file: `goondan.yaml` of a directory (whether or not it
    /// exists: a split bundle may have none), or the file loaded.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Every YAML file the bundle was loaded from, in load order.
    pub fn files(&self) -> &[SourceFile] {
        &self.files
    }

    /// The file of the document at `doc_index` and its index in that file.
    pub fn source_of(&self, doc_index: usize) -> Option<(&SourceFile, usize)> {
        let file = self.files.iter().rev().find(|f| f.first_doc <= doc_index)?;
        Some((file, doc_index - file.first_doc))
    }

    /// Where `doc_index` is, as diagnostics write it: `<file>#<index>`.
    pub fn document_label(&self, doc_index: usize) -> String {
        match self.source_of(doc_index) {
            Some((file, local)) => format!("{}#{local}", file.label),
            None => format!("{BUNDLE_FILE}#{doc_index}"),
        }
    }

    /// The installed packages this bundle was loaded with, in the order
    /// [`PackageScope::Dependency`] indexes.
    pub fn dependencies(&self) -> &[Arc<Bundle>] {
        &self.dependencies
    }

    /// The package a resolved resource's scope names: this bundle, the
    /// built-in package, or a dependency.
    pub fn package(&self, scope: PackageScope) -> Option<&Bundle> {
        match scope {
            PackageScope::Local => Some(self),
            PackageScope::Base => Some(base_package()),
            PackageScope::Dependency(index) => self.dependencies.get(index).map(|d| &**d),
        }
    }

    /// The file a Tool, Extension or Connector `entry` of the package
    /// `scope` names: relative to that package's root, with the original's
    /// fallback for an entry `src/x.ts` that is not there: `dist/src/x.js`,
    /// then `src/x.js` (a published package ships compiled code). `None`
    /// for the built-in package, whose code is compiled in.
    pub fn entry_file(&self, scope: PackageScope, entry: &str) -> Option<PathBuf> {
        if scope == PackageScope::Base {
            return None;
        }
        let root = self.package(scope)?.root();
        Some(
            crate::packages::entry_candidates(root, entry)
                .into_iter()
                .find(|p| p.is_file())
                .unwrap_or_else(|| root.join(entry)),
        )
    }

    /// The bundle's own package name (from its Package document).
    pub fn package_name(&self) -> Option<&str> {
        self.package_name.as_deref()
    }

    /// Every valid resource, in file order.
    pub fn resources(&self) -> &[BundleResource] {
        &self.resources
    }

    /// The document at `doc_index` ([`BundleResource::doc_index`]) as parsed
    /// from the YAML, before validation; `None` for the compiled-in package.
    pub fn document(&self, doc_index: usize) -> Option<&serde_json::Value> {
        self.documents.get(doc_index)
    }

    /// The resource of `kind` named `name` in this bundle.
    pub fn get(&self, kind: Kind, name: &str) -> Option<&AnyResource> {
        self.index.get(&(kind, name.to_owned())).and_then(|i| self.resources.get(*i)).map(|r| &r.resource)
    }

    /// Resolves a reference made from inside this bundle.
    pub fn resolve(&self, reference: &ObjectRef) -> Result<Resolved<'_>, ResolveError> {
        let kind = Kind::parse(&reference.kind).ok_or(ResolveError::NotFound)?;
        let (scope, package): (PackageScope, &Bundle) = match reference.package.as_deref() {
            None => (PackageScope::Local, self),
            Some(name) if Some(name) == self.package_name.as_deref() => (PackageScope::Local, self),
            Some(BASE_PACKAGE) => (PackageScope::Base, base_package()),
            Some(other) => match self.dependencies.iter().position(|d| d.package_name.as_deref() == Some(other)) {
                Some(index) => (PackageScope::Dependency(index), &*self.dependencies[index]),
                None => return Err(ResolveError::UnknownPackage(other.to_owned())),
            },
        };
        // Inside the base package itself, "local" is the base package.
        let scope = if std::ptr::eq(package, base_package()) { PackageScope::Base } else { scope };
        package.get(kind, &reference.name).map(|resource| Resolved { scope, resource }).ok_or(ResolveError::NotFound)
    }

    /// All Agents.
    pub fn agents(&self) -> impl Iterator<Item = &Resource<AgentSpec>> {
        self.resources.iter().filter_map(|r| match &r.resource {
            AnyResource::Agent(agent) => Some(agent),
            _ => None,
        })
    }

    /// All Swarms.
    pub fn swarms(&self) -> impl Iterator<Item = &Resource<SwarmSpec>> {
        self.resources.iter().filter_map(|r| match &r.resource {
            AnyResource::Swarm(swarm) => Some(swarm),
            _ => None,
        })
    }

    /// All Tools declared in the bundle.
    pub fn tools(&self) -> impl Iterator<Item = &Resource<ToolSpec>> {
        self.resources.iter().filter_map(|r| match &r.resource {
            AnyResource::Tool(tool) => Some(tool),
            _ => None,
        })
    }

    /// The Agent named `name`.
    pub fn agent(&self, name: &str) -> Option<&Resource<AgentSpec>> {
        match self.get(Kind::Agent, name) {
            Some(AnyResource::Agent(agent)) => Some(agent),
            _ => None,
        }
    }

    /// Resolves a reference made from inside the package `within` (given
    /// in this bundle's terms, e.g. the scope an Agent was found in), with
    /// the result's scope in this bundle's terms as well: the one lookup by
    /// which a dependency's resource refers to its own package, the
    /// built-in one and its dependencies.
    pub fn resolve_from(&self, within: PackageScope, reference: &ObjectRef) -> Result<Resolved<'_>, ResolveError> {
        let package = self.package(within).ok_or(ResolveError::NotFound)?;
        let resolved = package.resolve(reference)?;
        Ok(Resolved { scope: resolved.scope.seen_from(within), resource: resolved.resource })
    }

    /// How messages name the package `scope`: `the bundle`, or the
    /// package's name.
    pub fn package_label(&self, scope: PackageScope) -> String {
        match scope {
            PackageScope::Local => match &self.package_name {
                Some(name) => format!("the bundle ({name})"),
                None => "the bundle".to_owned(),
            },
            PackageScope::Base => BASE_PACKAGE.to_owned(),
            PackageScope::Dependency(index) => self
                .dependencies
                .get(index)
                .and_then(|d| d.package_name.clone())
                .unwrap_or_else(|| format!("dependency #{index}")),
        }
    }

    /// Every Swarm a run may select: the bundle's own, then those of its
    /// installed dependencies in load order (the original loads a
    /// dependency's resources beside the bundle's).
    pub fn all_swarms(&self) -> Vec<Scoped<'_, SwarmSpec>> {
        let local = self.swarms().map(|resource| Scoped { scope: PackageScope::Local, resource });
        let dependencies = self.dependencies.iter().enumerate().flat_map(|(index, dependency)| {
            dependency.swarms().map(move |resource| Scoped { scope: PackageScope::Dependency(index), resource })
        });
        local.chain(dependencies).collect()
    }

    /// The Swarm named `name` (`gdn run --swarm`): the bundle's own, else
    /// the first of its dependencies' (see [`Bundle::all_swarms`]).
    pub fn swarm(&self, name: &str) -> Option<Scoped<'_, SwarmSpec>> {
        self.all_swarms().into_iter().find(|swarm| swarm.name() == name)
    }

    /// The Swarm run when none is named: the bundle's Swarm named
    /// `default`, else its only one; when it has no Swarm and no Agent of
    /// its own (a bundle that only depends on a package), its
    /// dependencies' Swarm named `default`, else their only one.
    /// `Ok(None)`: no Swarm is the default (a bundle without Swarms runs
    /// its only Agent). The error lists the candidates.
    ///
    /// A dependency's Swarm never becomes the default of a bundle that has
    /// Swarms or Agents of its own: adding a dependency does not change
    /// what `gdn run` runs.
    pub fn default_swarm(&self) -> Result<Option<Scoped<'_, SwarmSpec>>, String> {
        let all = self.all_swarms();
        let local: Vec<_> = all.iter().filter(|s| s.scope == PackageScope::Local).collect();
        let candidates: Vec<_> = match (local.is_empty(), self.agents().next().is_none()) {
            (false, _) => local,
            (true, true) => all.iter().collect(),
            (true, false) => return Ok(None),
        };
        if let Some(default) = candidates.iter().find(|s| s.resource.name() == "default") {
            return Ok(Some(**default));
        }
        match candidates.as_slice() {
            [] => Ok(None),
            [only] => Ok(Some(**only)),
            many => Err(format!(
                "the bundle has {} Swarms and none is named 'default'; name one with --swarm ({})",
                many.len(),
                many.iter().map(|s| s.resource.name()).collect::<Vec<_>>().join(", ")
            )),
        }
    }

    /// The Agents of `swarm` (its `spec.agents`, then its `entryAgent` if
    /// not listed), each resolved in the Swarm's own package, without
    /// repeats; references that do not resolve are skipped (validation
    /// reports them). Two agents of one name from different packages are
    /// refused: the runtime addresses agents by name.
    pub fn swarm_agents<'a>(
        &'a self,
        swarm: Scoped<'a, SwarmSpec>,
    ) -> Result<Vec<Scoped<'a, AgentSpec>>, AgentNameClash> {
        let mut agents: Vec<Scoped<'a, AgentSpec>> = Vec::new();
        let listed = swarm.spec.agents.iter().enumerate().map(|(i, r)| (format!("spec.agents[{i}]"), r));
        let refs = listed.chain(std::iter::once(("spec.entryAgent".to_owned(), &swarm.spec.entry_agent)));
        for (path, reference) in refs.filter(|(_, r)| r.kind == "Agent") {
            let Ok(Resolved { scope, resource: AnyResource::Agent(agent) }) = self.resolve_from(swarm.scope, reference)
            else {
                continue;
            };
            match agents.iter().find(|a| a.name() == agent.name()) {
                Some(known) if known.scope == scope && std::ptr::eq(known.resource, agent) => {}
                Some(known) => {
                    return Err(AgentNameClash {
                        swarm: swarm.resource.name().to_owned(),
                        agent: agent.name().to_owned(),
                        first: self.package_label(known.scope),
                        second: self.package_label(scope),
                        path,
                    });
                }
                None => agents.push(Scoped { scope, resource: agent }),
            }
        }
        Ok(agents)
    }

    /// The Agent named `name` as a run finds it: among the agents of the
    /// Swarm named `swarm` when given (an agent process knows its Swarm),
    /// else the bundle's own Agent of that name, else the first agent of
    /// that name any Swarm (see [`Bundle::all_swarms`]) lists. The one
    /// lookup by name of every command and process that runs agents.
    pub fn find_agent<'a>(&'a self, name: &str, swarm: Option<&str>) -> Option<Scoped<'a, AgentSpec>> {
        let among = |swarm: Scoped<'a, SwarmSpec>| -> Option<Scoped<'a, AgentSpec>> {
            let agents = self.swarm_agents(swarm).unwrap_or_default();
            agents.into_iter().find(|agent| agent.name() == name)
        };
        if let Some(found) = swarm.and_then(|swarm| self.swarm(swarm)).and_then(among) {
            return Some(found);
        }
        if let Some(resource) = self.agent(name) {
            return Some(Scoped { scope: PackageScope::Local, resource });
        }
        self.all_swarms().into_iter().find_map(among)
    }

    /// Every Agent a run of this bundle may start: the bundle's own, then
    /// the dependencies' agents any Swarm ([`Bundle::all_swarms`]) lists,
    /// each once.
    pub fn runnable_agents(&self) -> Vec<Scoped<'_, AgentSpec>> {
        let mut agents: Vec<Scoped<'_, AgentSpec>> =
            self.agents().map(|resource| Scoped { scope: PackageScope::Local, resource }).collect();
        for swarm in self.all_swarms() {
            for agent in self.swarm_agents(swarm).unwrap_or_default() {
                if !agents.iter().any(|a| a.scope == agent.scope && std::ptr::eq(a.resource, agent.resource)) {
                    agents.push(agent);
                }
            }
        }
        agents
    }

    /// The Swarm `agent` runs in when no Swarm is named: the first Swarm
    /// (the bundle's own, then its dependencies': [`Bundle::all_swarms`])
    /// whose `entryAgent` it is, else the first that lists it in
    /// `spec.agents`; `None` when no Swarm lists it (it runs alone).
    ///
    /// The rule of `gdn run --agent` (`goondan_orchestrator::plan::swarm_of`,
    /// whose Swarm's name every agent process of the run is given) and of
    /// the workspace's name (`gdn::workspace::swarm_key`).
    pub fn swarm_of_agent(&self, agent: &str) -> Option<Scoped<'_, SwarmSpec>> {
        let all = self.all_swarms();
        let lists =
            |swarm: &Scoped<'_, SwarmSpec>| swarm.spec.agents.iter().any(|a| a.kind == "Agent" && a.name == agent);
        all.iter().find(|swarm| swarm.spec.entry_agent.name == agent).or_else(|| all.iter().find(|s| lists(s))).copied()
    }

    /// Every Swarm that lists `agent` in `spec.agents`, in the order of
    /// [`Bundle::all_swarms`].
    pub fn swarms_listing(&self, agent: &str) -> Vec<Scoped<'_, SwarmSpec>> {
        self.all_swarms()
            .into_iter()
            .filter(|swarm| swarm.spec.agents.iter().any(|a| a.kind == "Agent" && a.name == agent))
            .collect()
    }

    /// The sandbox the commands of `agent`'s model run in: the Agent's own
    /// `spec.sandbox` if it has one (replacing the Swarm's whole, never
    /// merged with it); else the `spec.sandbox` of the Swarm it runs in —
    /// `swarm` when given and the bundle has a Swarm of that name (an
    /// agent process knows its Swarm's name), else
    /// [`Bundle::swarm_of_agent`]; else the default,
    /// [`SandboxConfig::default`] (`workspace-write`). The Agent is found
    /// with [`Bundle::find_agent`] (it may be a dependency's).
    ///
    /// A `swarm` the bundle has no Swarm of (an agent that runs alone is
    /// given its own name as its Swarm's) counts as none named. An agent
    /// the bundle does not define gets its Swarm's or the default.
    pub fn sandbox_for(&self, agent: &str, swarm: Option<&str>) -> EffectiveSandbox {
        if let Some(config) = self.find_agent(agent, swarm).and_then(|a| a.resource.spec.sandbox.as_ref()) {
            return EffectiveSandbox { config: config.clone(), source: SandboxSource::Agent };
        }
        let named = swarm.and_then(|name| self.swarm(name));
        let swarm = named.or_else(|| self.swarm_of_agent(agent));
        match swarm.and_then(|s| s.resource.spec.sandbox.as_ref().map(|config| (s.resource.name(), config))) {
            Some((name, config)) => {
                EffectiveSandbox { config: config.clone(), source: SandboxSource::Swarm(name.to_owned()) }
            }
            None => EffectiveSandbox { config: SandboxConfig::default(), source: SandboxSource::Default },
        }
    }

    /// The labels a host must carry for `agent`'s instances to be placed
    /// on it: the Agent's `spec.placement.hostLabels` (values as strings:
    /// `gpu: true` is `"true"`). `None` when the Agent sets none (or an
    /// empty mapping) or the bundle has no Agent of that name
    /// ([`Bundle::find_agent`]): any host.
    /// Match a host's labels with [`crate::placement::labels_match`].
    pub fn placement_for(&self, agent: &str) -> Option<&HostLabels> {
        let placement = self.find_agent(agent, None)?.resource.spec.placement.as_ref()?;
        (!placement.host_labels.is_empty()).then_some(&placement.host_labels)
    }

    /// The agent a command uses when none is named: the entry agent of the
    /// Swarm [`Bundle::default_swarm`] picks (resolved in the Swarm's
    /// package), else the bundle's only Agent.
    pub fn default_agent(&self) -> Result<Scoped<'_, AgentSpec>, String> {
        let swarm = match self.default_swarm() {
            Ok(swarm) => swarm,
            // Several Swarms and none the default: the only Agent still is.
            Err(message) => match self.agents().collect::<Vec<_>>().as_slice() {
                [only] => return Ok(Scoped { scope: PackageScope::Local, resource: only }),
                _ => return Err(message),
            },
        };
        if let Some(swarm) = swarm {
            let entry = &swarm.spec.entry_agent;
            return match self.resolve_from(swarm.scope, entry) {
                Ok(Resolved { scope, resource: AnyResource::Agent(agent) }) => Ok(Scoped { scope, resource: agent }),
                _ => Err(format!("the entry agent {entry} of Swarm '{}' is not defined", swarm.name())),
            };
        }
        let agents: Vec<_> = self.agents().collect();
        match agents.as_slice() {
            [only] => Ok(Scoped { scope: PackageScope::Local, resource: only }),
            [] => Err("the bundle defines no Agent".to_owned()),
            many => Err(format!(
                "the bundle has {} Agents and no Swarm; name one with --agent ({})",
                many.len(),
                many.iter().map(|a| a.name()).collect::<Vec<_>>().join(", ")
            )),
        }
    }

    /// The files the runtime loads from this bundle as configuration or code
    /// (whether they exist or not): the bundle file, its lock file
    /// ([`LOCK_FILE`]), its other YAML files, those of its dependencies,
    /// every Agent's `prompt.systemRef`, and every Tool, Extension and
    /// Connector `spec.entry` (the file it falls back to when the one named
    /// is not there: [`Bundle::entry_file`]). Relative paths are joined to
    /// the bundle's root.
    pub fn loaded_files(&self) -> Vec<PathBuf> {
        let mut files = vec![self.file.clone(), self.root.join(LOCK_FILE)];
        files.extend(self.files.iter().filter(|f| f.path != self.file).map(|f| f.path.clone()));
        for dependency in &self.dependencies {
            files.extend(dependency.loaded_files().into_iter().filter(|f| !f.ends_with(LOCK_FILE)));
        }
        for BundleResource { resource, .. } in &self.resources {
            let entry = match resource {
                AnyResource::Agent(agent) => {
                    files.extend(
                        agent.spec.prompt.as_ref().and_then(|p| p.system_ref.as_deref()).map(|f| self.root.join(f)),
                    );
                    continue;
                }
                AnyResource::Tool(tool) => &tool.spec.entry,
                AnyResource::Extension(extension) => &extension.spec.entry,
                AnyResource::Connector(connector) => &connector.spec.entry,
                _ => continue,
            };
            // The file an entry loads (an installed package's `dist/src/x.js`
            // for `src/x.ts`: see `entry_file`), else the one it names.
            let candidates = crate::packages::entry_candidates(&self.root, entry);
            files.push(candidates.iter().find(|p| p.is_file()).cloned().unwrap_or_else(|| self.root.join(entry)));
        }
        files
    }

    /// The JSON of every document of the bundle's own files, by
    /// [`BundleResource::doc_index`] (those that did not validate too);
    /// empty for the compiled-in package.
    pub fn documents(&self) -> &[serde_json::Value] {
        &self.documents
    }

    /// The Tools a bundle's own agent's `spec.tools` names, resolved, in
    /// order, without repeats ([`Bundle::agent_tools_in`] for an agent of
    /// the bundle's own package).
    pub fn agent_tools<'a>(&'a self, agent: &'a Resource<AgentSpec>) -> Vec<(PackageScope, &'a Resource<ToolSpec>)> {
        self.agent_tools_in(PackageScope::Local, agent)
    }

    /// The Tools an agent of the package `within` names in `spec.tools`,
    /// resolved in that package ([`Bundle::resolve_from`]), in order,
    /// without repeats. References that do not resolve are skipped
    /// (validation reports them).
    pub fn agent_tools_in<'a>(
        &'a self,
        within: PackageScope,
        agent: &'a Resource<AgentSpec>,
    ) -> Vec<(PackageScope, &'a Resource<ToolSpec>)> {
        let mut tools: Vec<(PackageScope, &Resource<ToolSpec>)> = Vec::new();
        for reference in &agent.spec.tools {
            if let Ok(Resolved { scope, resource: AnyResource::Tool(tool) }) = self.resolve_from(within, reference)
                && !tools.iter().any(|(s, t)| *s == scope && std::ptr::eq(*t, tool))
            {
                tools.push((scope, tool));
            }
        }
        tools
    }
}

struct CrossChecks<'a> {
    docs: &'a [DocAt<'a>],
    diagnostics: &'a mut Vec<Diagnostic>,
}

impl CrossChecks<'_> {
    fn report(
        &mut self,
        severity: Severity,
        code: DiagnosticCode,
        doc: usize,
        path: &str,
        message: String,
        suggestion: Option<String>,
    ) {
        let Some(at) = self.docs.get(doc) else { return };
        let mut reporter = DocReporter {
            file_label: at.label,
            index: at.local,
            document: at.document,
            diagnostics: &mut *self.diagnostics,
        };
        match severity {
            Severity::Error => reporter.error(code, path, message, suggestion),
            Severity::Warning => reporter.warning(code, path, message, suggestion),
        }
    }

    fn error(&mut self, code: DiagnosticCode, doc: usize, path: &str, message: String, suggestion: Option<String>) {
        self.report(Severity::Error, code, doc, path, message, suggestion);
    }

    fn run(mut self, bundle: &mut Bundle) {
        self.check_packages(bundle);
        self.index(bundle);
        self.check_references(bundle);
    }

    fn check_packages(&mut self, bundle: &mut Bundle) {
        // Package position is judged on the raw documents so that a Package
        // with other errors still counts.
        let package_docs: Vec<usize> = self
            .docs
            .iter()
            .enumerate()
            .filter(|(_, d)| d.document.value.get("kind").and_then(|k| k.as_str()) == Some("Package"))
            .map(|(i, _)| i)
            .collect();
        for (nth, doc) in package_docs.iter().enumerate() {
            let local = self.docs.get(*doc).map_or(*doc, |at| at.local);
            if nth > 0 {
                let first = match (self.docs.get(package_docs[0]), self.docs.get(*doc)) {
                    (Some(first), Some(this)) => first.named_from(this),
                    _ => format!("document #{}", package_docs[0]),
                };
                self.error(
                    DiagnosticCode::PackageDocDuplicated,
                    *doc,
                    "kind",
                    "a bundle may hold at most one Package document".to_owned(),
                    Some(format!("Remove this Package; the first one is {first}.")),
                );
            } else if local != 0 {
                self.error(
                    DiagnosticCode::PackageDocPosition,
                    *doc,
                    "kind",
                    "the Package document must be the first document of the file".to_owned(),
                    Some("Move it to the top of goondan.yaml.".to_owned()),
                );
            }
        }
        bundle.package_name = bundle.resources.iter().find_map(|r| match &r.resource {
            AnyResource::Package(p) => Some(p.metadata.name.clone()),
            _ => None,
        });
    }

    fn index(&mut self, bundle: &mut Bundle) {
        let mut first_seen: HashMap<(Kind, String), usize> = HashMap::new();
        for (position, entry) in bundle.resources.iter().enumerate() {
            let key = (entry.resource.kind(), entry.resource.name().to_owned());
            if let Some(first) = first_seen.get(&key) {
                if key.0 == Kind::Package {
                    // Already reported as E_CONFIG_PACKAGE_DOC_DUPLICATED.
                    continue;
                }
                let first_doc = bundle.resources[*first].doc_index;
                let first = match (self.docs.get(first_doc), self.docs.get(entry.doc_index)) {
                    (Some(first), Some(this)) => first.named_from(this),
                    _ => format!("document #{first_doc}"),
                };
                self.error(
                    DiagnosticCode::DuplicateName,
                    entry.doc_index,
                    "metadata.name",
                    format!("{} '{}' is defined more than once", key.0.as_str(), key.1),
                    Some(format!("Rename it or remove it; it is first defined in {first}.")),
                );
            } else {
                first_seen.insert(key, position);
            }
        }
        bundle.index = first_seen;
    }

    fn check_references(&mut self, bundle: &Bundle) {
        // Names declared by any document, valid or not: a reference to a
        // resource that exists but has its own errors is not reported again.
        let declared: HashSet<(Kind, String)> =
            self.docs.iter().map(|d| d.document).filter_map(declared_name).collect();
        for (doc, document) in self.docs.iter().map(|d| d.document).enumerate() {
            let Some((kind, _)) = declared_name(document) else { continue };
            for found in document_refs(kind, &document.value) {
                if let Ok(reference) = &found.parsed {
                    self.check_ref(bundle, &declared, doc, &found.path, reference, found.expected);
                }
            }
            if kind == Kind::Swarm {
                self.check_entry_agent_listed(doc, &document.value);
            }
        }
        for entry in &bundle.resources {
            match &entry.resource {
                AnyResource::Agent(agent) => {
                    self.check_required_tools(bundle, entry.doc_index, agent);
                    self.check_model_capabilities(bundle, entry.doc_index, agent);
                }
                AnyResource::Connection(connection) => self.check_connection(bundle, entry.doc_index, connection),
                AnyResource::Swarm(swarm) => {
                    if let Err(clash) = bundle.swarm_agents(Scoped { scope: PackageScope::Local, resource: swarm }) {
                        self.error(
                            DiagnosticCode::DuplicateName,
                            entry.doc_index,
                            &clash.path,
                            clash.to_string(),
                            Some("Run one of them in another Swarm, or rename one of the agents.".to_owned()),
                        );
                    }
                }
                _ => {}
            }
        }
    }

    /// `gdn validate`'s warnings about a Connection's rules: an event its
    /// Connector does not declare (the rule can never match what the
    /// connector emits), an agent outside the Connection's Swarm.
    fn check_connection(&mut self, bundle: &Bundle, doc: usize, connection: &Resource<ConnectionSpec>) {
        let Some(rules) = connection.spec.ingress.get("rules").and_then(serde_json::Value::as_array) else { return };
        let connector = match bundle.resolve(&connection.spec.connector_ref) {
            Ok(Resolved { resource: AnyResource::Connector(connector), .. }) => Some(connector),
            _ => None,
        };
        let swarm = match &connection.spec.swarm_ref {
            Some(reference) => bundle.swarm(&reference.name),
            None => bundle.all_swarms().into_iter().next(),
        };
        for (index, rule) in rules.iter().enumerate() {
            if let (Some(connector), Some(event)) =
                (connector, rule.pointer("/match/event").and_then(serde_json::Value::as_str))
                && !connector.spec.events.is_empty()
                && !connector.spec.events.iter().any(|declared| declared.name == event)
            {
                let declared: Vec<&str> = connector.spec.events.iter().map(|e| e.name.as_str()).collect();
                self.report(
                    Severity::Warning,
                    DiagnosticCode::IngressMismatch,
                    doc,
                    &format!("spec.ingress.rules[{index}].match.event"),
                    format!(
                        "Connector '{}' does not declare an event '{event}'; the rule matches only if the connector \
                         emits it anyway (a typo?)",
                        connector.name()
                    ),
                    Some(format!("Its events: {}.", declared.join(", "))),
                );
            }
            if let (Some(swarm), Some(agent)) = (swarm, rule.pointer("/route/agentRef"))
                && let Ok(agent) = ObjectRef::parse(agent)
                && !swarm.spec.agents.iter().any(|a| a.name == agent.name)
                && swarm.spec.entry_agent.name != agent.name
            {
                self.report(
                    Severity::Warning,
                    DiagnosticCode::IngressMismatch,
                    doc,
                    &format!("spec.ingress.rules[{index}].route.agentRef"),
                    format!("agent '{}' is not one of Swarm '{}''s agents", agent.name, swarm.name()),
                    Some("Add it to the Swarm's spec.agents, or route to one of them.".to_owned()),
                );
            }
        }
    }

    fn check_entry_agent_listed(&mut self, doc: usize, document: &serde_json::Value) {
        let refs = document_refs(Kind::Swarm, document);
        let Some(Ok(entry)) = refs.iter().find(|r| r.path == "spec.entryAgent").map(|r| r.parsed.as_ref()) else {
            return;
        };
        let listed = refs
            .iter()
            .filter(|r| r.path.starts_with("spec.agents["))
            .filter_map(|r| r.parsed.as_ref().ok())
            .any(|agent| agent.kind == entry.kind && agent.name == entry.name);
        if !listed {
            self.error(
                DiagnosticCode::InvalidRef,
                doc,
                "spec.entryAgent",
                format!("entryAgent {entry} is not one of the swarm's agents"),
                Some("Add it to spec.agents or pick an agent from that list.".to_owned()),
            );
        }
    }

    fn check_ref(
        &mut self,
        bundle: &Bundle,
        declared: &HashSet<(Kind, String)>,
        doc: usize,
        path: &str,
        reference: &ObjectRef,
        expected: Kind,
    ) {
        if reference.kind != expected.as_str() {
            self.error(
                DiagnosticCode::InvalidRef,
                doc,
                path,
                format!("{path} must refer to a {}, got {reference}", expected.as_str()),
                Some(format!("Write it as '{}/<name>'.", expected.as_str())),
            );
            return;
        }
        match bundle.resolve(reference) {
            Ok(_) => {}
            Err(ResolveError::NotFound)
                if reference.package.is_none() && declared.contains(&(expected, reference.name.clone())) => {}
            // Declared in the dependency but with errors of its own, which
            // are reported under the package's manifest.
            Err(ResolveError::NotFound) if dependency_declares(bundle, reference, expected) => {}
            Err(ResolveError::NotFound) => {
                let in_base = reference.package.is_none() && base_package().get(expected, &reference.name).is_some();
                let suggestion = if in_base {
                    format!(
                        "{} '{}' is a built-in; refer to it with package: \"{BASE_PACKAGE}\", e.g. {{kind: {}, name: {}, package: \"{BASE_PACKAGE}\"}}.",
                        expected.as_str(),
                        reference.name,
                        expected.as_str(),
                        reference.name
                    )
                } else {
                    // Where the reference looks: the package it names, else the bundle.
                    let package = match reference.package.as_deref() {
                        Some(BASE_PACKAGE) => base_package(),
                        Some(other) => bundle
                            .dependencies
                            .iter()
                            .find(|d| d.package_name.as_deref() == Some(other))
                            .map_or(bundle, |d| &**d),
                        None => bundle,
                    };
                    let known: Vec<&str> = package
                        .resources
                        .iter()
                        .filter(|r| r.resource.kind() == expected)
                        .map(|r| r.resource.name())
                        .collect();
                    let closest = crate::schema::closest(&reference.name, known.iter().copied());
                    match (closest, reference.package.as_deref()) {
                        (Some(close), _) => format!(
                            "Did you mean '{close}'? {}s{}: {}.",
                            expected.as_str(),
                            reference.package.as_deref().map(|p| format!(" of {p}")).unwrap_or_default(),
                            known.join(", ")
                        ),
                        (None, Some(package)) if !known.is_empty() => {
                            format!("The {}s of {package}: {}.", expected.as_str(), known.join(", "))
                        }
                        (None, _) if known.is_empty() => {
                            format!("Define {} named '{}' in the bundle.", with_article(expected), reference.name)
                        }
                        (None, _) => format!("Defined {}s: {}.", expected.as_str(), known.join(", ")),
                    }
                };
                self.error(
                    DiagnosticCode::RefNotFound,
                    doc,
                    path,
                    format!("{reference} is not defined"),
                    Some(suggestion),
                );
            }
            Err(ResolveError::UnknownPackage(package)) => {
                self.error(
                    DiagnosticCode::RefNotFound,
                    doc,
                    path,
                    format!("{reference}: package '{package}' is not available"),
                    Some(format!(
                        "Add \"{package}\" to the dependencies of the bundle's Package and run `gdn package install`; \
                         only the bundle's own resources, the built-in package \"{BASE_PACKAGE}\" and installed dependencies can be referenced."
                    )),
                );
            }
        }
    }

    fn check_required_tools(&mut self, bundle: &Bundle, doc: usize, agent: &Resource<AgentSpec>) {
        if agent.spec.required_tools.is_empty() {
            return;
        }
        let offered: Vec<String> = bundle
            .agent_tools(agent)
            .iter()
            .flat_map(|(_, tool)| {
                tool.spec.exports.iter().map(|e| goondan_core::naming::build_tool_name(tool.name(), &e.name))
            })
            .collect();
        for (i, required) in agent.spec.required_tools.iter().enumerate() {
            if !offered.iter().any(|name| name == required) {
                self.report(
                    Severity::Warning,
                    DiagnosticCode::RefNotFound,
                    doc,
                    &format!("spec.requiredTools[{i}]"),
                    format!("required tool '{required}' is not offered by the agent's spec.tools"),
                    Some("Add its Tool to spec.tools, or expect an extension to register it.".to_owned()),
                );
            }
        }
    }
}

impl CrossChecks<'_> {
    /// The original's spec (resources §7.1): an Agent that needs a
    /// capability its Model does not declare is refused at load. A Model
    /// that declares no `capabilities` at all is taken to have what its
    /// provider offers (the original's samples declare none); one that
    /// declares some has exactly those.
    fn check_model_capabilities(&mut self, bundle: &Bundle, doc: usize, agent: &Resource<AgentSpec>) {
        if agent.spec.tools.is_empty() {
            return;
        }
        let Ok(Resolved { resource: AnyResource::Model(model), .. }) =
            bundle.resolve(&agent.spec.model_config.model_ref)
        else {
            return;
        };
        let declared = &model.spec.capabilities;
        if declared.is_empty() || declared.get("toolCalling").and_then(serde_json::Value::as_bool) == Some(true) {
            return;
        }
        self.error(
            DiagnosticCode::ModelCapability,
            doc,
            "spec.tools",
            format!(
                "the agent has tools, and its Model '{}' does not declare toolCalling: true in spec.capabilities",
                model.name()
            ),
            Some(format!(
                "Set capabilities.toolCalling: true on Model '{}' if it calls tools, or use a Model that does.",
                model.name()
            )),
        );
    }
}

fn dependency_declares(bundle: &Bundle, reference: &ObjectRef, expected: Kind) -> bool {
    let Some(package) = reference.package.as_deref() else { return false };
    let Some(dependency) = bundle.dependencies.iter().find(|d| d.package_name.as_deref() == Some(package)) else {
        return false;
    };
    dependency.documents.iter().any(|document| {
        document.get("kind").and_then(serde_json::Value::as_str) == Some(expected.as_str())
            && document.pointer("/metadata/name").and_then(serde_json::Value::as_str) == Some(reference.name.as_str())
    })
}

fn declared_name(document: &YamlDocument) -> Option<(Kind, String)> {
    let kind = Kind::parse(document.value.get("kind")?.as_str()?)?;
    let name = document.value.get("metadata")?.get("name")?.as_str()?;
    Some((kind, name.to_owned()))
}

fn with_article(kind: Kind) -> String {
    let name = kind.as_str();
    if name.starts_with(['A', 'E', 'I', 'O', 'U']) { format!("an {name}") } else { format!("a {name}") }
}
