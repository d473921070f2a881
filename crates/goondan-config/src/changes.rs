//! What a change to a bundle's files changes, for `gdn run --watch`: which
//! files to watch, a snapshot of what each resource is, and — between two
//! snapshots of valid bundles — which agents and connections must restart.
//!
//! Resources are compared as parsed documents (comments, formatting and key
//! order do not count) plus a SHA-256 of the files they load (Tool,
//! Extension and Connector `spec.entry`, Agent `prompt.systemRef`). A change
//! is charged to what uses the resource: a Model, Tool or Extension to the
//! Agents that reference it, a Connector to its Connections. A Swarm, the
//! Package or the lock file restarts everything; a resource nothing uses
//! restarts nothing. An installed dependency is compared whole (its
//! documents and the files it loads): any change to it restarts everything.
//! The compiled-in `@goondan/base` cannot change while the program runs and
//! is not part of a snapshot.
//!
//! What is watched ([`WatchList`]) comes from the loader's own answer to
//! which files make the bundle ([`crate::bundle_source_files`] and
//! [`Bundle::loaded_files`]) plus the directories its search looked in, so
//! that a split file created, removed or renamed there counts as an edit.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use goondan_core::ObjectRef;
use serde_json::Value as JsonValue;
use sha2::{Digest as _, Sha256};

use crate::bundle::{Bundle, LOCK_FILE, PackageScope, Resolved};
use crate::resources::{AnyResource, Kind};

/// The most changed fields listed for one resource in [`BundleChanges::described`].
const MAX_LISTED_FIELDS: usize = 6;

/// The files whose change can change what a bundle runs: every file the
/// bundle loads ([`Bundle::loaded_files`]: the YAML file, its lock file,
/// Agent `prompt.systemRef` files, and the `spec.entry` of its own Tools,
/// Extensions and Connectors — not those of `@goondan/base`), absolute
/// (joined to the current directory when the bundle root is relative),
/// without repeats, in that order.
pub fn watched_files(bundle: &Bundle) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = Vec::new();
    for file in bundle.loaded_files() {
        let file = absolute(file);
        if !files.contains(&file) {
            files.push(file);
        }
    }
    files
}

/// What `gdn run --watch` follows for a bundle: the files it loads
/// ([`watched_files`]) and, for a bundle directory, every directory the
/// search for its YAML files looked in
/// ([`crate::packages::search_bundle_dir`]), where a bundle file (or a
/// directory that may hold one) appearing or going away changes the bundle.
/// Paths are absolute, as a file system watcher reports them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchList {
    files: BTreeSet<PathBuf>,
    searched: BTreeSet<PathBuf>,
}

impl WatchList {
    /// The list for `bundle`, loaded from `config` (the `-c` path).
    pub fn of(config: &Path, bundle: &Bundle) -> Self {
        let files = watched_files(bundle).into_iter().collect();
        let searched = crate::bundle::bundle_dir(config)
            .map(|dir| crate::packages::search_bundle_dir(&dir).dirs)
            .unwrap_or_default()
            .into_iter()
            .map(absolute)
            .collect();
        Self { files, searched }
    }

    /// The directories to watch, each without its subdirectories: those
    /// of the files (that exist) and those searched.
    pub fn dirs(&self) -> BTreeSet<PathBuf> {
        let parents = self.files.iter().filter_map(|file| file.parent()).filter(|dir| dir.is_dir());
        parents.map(Path::to_path_buf).chain(self.searched.iter().cloned()).collect()
    }

    /// Whether a change the watcher reports at `path` can change the
    /// bundle: a file it loads; a searched directory (removed or renamed);
    /// in a searched directory, a file with a bundle file's name or a new
    /// directory that would be searched.
    pub fn counts(&self, path: &Path) -> bool {
        if self.files.contains(path) || self.searched.contains(path) {
            return true;
        }
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else { return false };
        self.searched.contains(parent)
            && (crate::packages::is_bundle_file_name(name)
                || (crate::packages::is_searched_dir_name(name) && path.is_dir()))
    }
}

fn absolute(path: PathBuf) -> PathBuf {
    // `absolute` only fails when the current directory is gone; the
    // relative path is then still the best name for the file.
    std::path::absolute(&path).unwrap_or(path)
}

/// A resource's kind and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceKey {
    /// The kind.
    pub kind: Kind,
    /// `metadata.name`.
    pub name: String,
}

impl ResourceKey {
    fn of(resource: &AnyResource) -> Self {
        Self { kind: resource.kind(), name: resource.name().to_owned() }
    }
}

impl std::fmt::Display for ResourceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.kind.as_str(), self.name)
    }
}

/// What a loaded file held when the snapshot was taken.
#[derive(Debug, Clone, PartialEq, Eq)]
enum FileState {
    /// The SHA-256 of its bytes.
    Sha256([u8; 32]),
    /// It does not exist.
    Missing,
    /// It could not be read (not a regular file, no permission, …).
    Unreadable(String),
}

impl FileState {
    fn of(path: &Path) -> Self {
        match hash_file(path) {
            Ok(digest) => Self::Sha256(digest),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Self::Missing,
            Err(error) => Self::Unreadable(error.to_string()),
        }
    }
}

/// Hashes a regular file in pieces (an entry file may be a large bundled
/// script); anything else is refused before it is opened, as opening a
/// FIFO would block.
fn hash_file(path: &Path) -> io::Result<[u8; 32]> {
    let metadata = std::fs::metadata(path)?;
    if !metadata.is_file() {
        let kind = crate::files::describe_kind(&metadata);
        return Err(io::Error::other(format!("{} is {kind}, not a regular file", path.display())));
    }
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0_u8; 64 * 1024];
    loop {
        let read = match file.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        hasher.update(buffer.get(..read).unwrap_or_default());
    }
    Ok(hasher.finalize().into())
}

/// The file a resource loads: which field names it, the path as written,
/// and its content's state.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LoadedFile {
    /// `entry` or `prompt`.
    role: &'static str,
    /// As written in the document, relative to the bundle root.
    path: String,
    state: FileState,
}

/// One resource in a [`BundleFingerprint`].
#[derive(Debug, Clone, PartialEq)]
struct ResourcePrint {
    /// The document as parsed from the YAML.
    document: JsonValue,
    /// The file it loads, if any.
    file: Option<LoadedFile>,
}

/// An installed dependency, whole.
#[derive(Debug, Clone, PartialEq)]
struct PackagePrint {
    documents: Vec<JsonValue>,
    files: Vec<(PathBuf, FileState)>,
}

impl PackagePrint {
    fn of(package: &Bundle) -> Self {
        let files = package.loaded_files().into_iter().map(|file| {
            let state = FileState::of(&file);
            (file, state)
        });
        Self { documents: package.documents().to_vec(), files: files.collect() }
    }
}

/// A snapshot of what each resource of a bundle is — its parsed document
/// and the hash of the file it loads — and of which resources each Agent and
/// Connection uses. Two snapshots are compared with [`changes`].
#[derive(Debug, Clone, PartialEq)]
pub struct BundleFingerprint {
    resources: BTreeMap<ResourceKey, ResourcePrint>,
    lock: FileState,
    /// Each installed dependency by name: its documents and the state of
    /// every file it loads.
    packages: BTreeMap<String, PackagePrint>,
    /// Agent name → the bundle's own Model, Tools and Extensions it references.
    agent_uses: BTreeMap<String, BTreeSet<ResourceKey>>,
    /// Connection name → the bundle's own Connector it references.
    connection_uses: BTreeMap<String, BTreeSet<ResourceKey>>,
}

impl BundleFingerprint {
    /// Takes the snapshot: reads (and hashes) every file the bundle's
    /// resources load. Files that are missing or unreadable are recorded as
    /// such, so that their appearing counts as a change.
    pub fn of(bundle: &Bundle) -> Self {
        let root = bundle.root();
        let mut resources = BTreeMap::new();
        let mut agent_uses = BTreeMap::new();
        let mut connection_uses = BTreeMap::new();
        let local = |reference: &ObjectRef| match bundle.resolve(reference) {
            Ok(Resolved { scope: PackageScope::Local, resource }) => Some(ResourceKey::of(resource)),
            _ => None,
        };
        for entry in bundle.resources() {
            let resource = &entry.resource;
            let file = match resource {
                AnyResource::Agent(agent) => {
                    agent.spec.prompt.as_ref().and_then(|p| p.system_ref.as_deref()).map(|path| ("prompt", path))
                }
                AnyResource::Tool(tool) => Some(("entry", tool.spec.entry.as_str())),
                AnyResource::Extension(extension) => Some(("entry", extension.spec.entry.as_str())),
                AnyResource::Connector(connector) => Some(("entry", connector.spec.entry.as_str())),
                _ => None,
            };
            let file = file.map(|(role, path)| LoadedFile {
                role,
                path: path.to_owned(),
                state: FileState::of(&root.join(path)),
            });
            // Bundles loaded from YAML keep their documents; should one not,
            // the typed resource still tells whether it changed.
            let document =
                bundle.document(entry.doc_index).cloned().unwrap_or_else(|| JsonValue::String(format!("{resource:?}")));
            // The first definition wins, as in the bundle's index.
            resources.entry(ResourceKey::of(resource)).or_insert(ResourcePrint { document, file });
            match resource {
                AnyResource::Agent(agent) => {
                    let mut uses = BTreeSet::new();
                    uses.extend(local(&agent.spec.model_config.model_ref));
                    uses.extend(
                        bundle
                            .agent_tools(agent)
                            .into_iter()
                            .filter(|(scope, _)| *scope == PackageScope::Local)
                            .map(|(_, tool)| ResourceKey { kind: Kind::Tool, name: tool.name().to_owned() }),
                    );
                    uses.extend(agent.spec.extensions.iter().filter_map(|used| local(&used.reference)));
                    agent_uses.entry(agent.name().to_owned()).or_insert(uses);
                }
                AnyResource::Connection(connection) => {
                    let uses: BTreeSet<_> = local(&connection.spec.connector_ref).into_iter().collect();
                    connection_uses.entry(connection.name().to_owned()).or_insert(uses);
                }
                _ => {}
            }
        }
        let packages = bundle
            .dependencies()
            .iter()
            .map(|package| {
                let name = package.package_name().map_or_else(|| package.root().display().to_string(), str::to_owned);
                (name, PackagePrint::of(package))
            })
            .collect();
        Self { resources, lock: FileState::of(&root.join(LOCK_FILE)), packages, agent_uses, connection_uses }
    }
}

/// What changed between two valid bundles, and what must restart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BundleChanges {
    /// The swarm-level shape changed — a Swarm (its agents, entry agent,
    /// policy), the Package, the lock file or an installed dependency — so
    /// everything restarts.
    /// [`agents`](Self::agents) and [`connections`](Self::connections) still
    /// list what the other changes touch.
    pub everything: bool,
    /// Agents whose processes must restart: the Agent changed, was added or
    /// removed, or a resource it uses did (its Model through
    /// `modelConfig.modelRef`, its Tools and Extensions through
    /// `spec.tools` / `spec.extensions`, including their entry files).
    pub agents: BTreeSet<String>,
    /// Connections whose connector must restart: the Connection changed, was
    /// added or removed, or its Connector did (spec or entry file).
    pub connections: BTreeSet<String>,
    /// One line per changed resource, for the log, e.g.
    /// `Tool/notes changed: entry file ./tools/notes.ts → restarts Agent/coder`.
    pub described: Vec<String>,
}

impl BundleChanges {
    /// True when nothing has to restart (a change may still be described,
    /// e.g. a resource added that nothing uses).
    pub fn restarts_nothing(&self) -> bool {
        !self.everything && self.agents.is_empty() && self.connections.is_empty()
    }
}

/// What changed from `old` to `new`, and what must restart.
pub fn changes(old: &BundleFingerprint, new: &BundleFingerprint) -> BundleChanges {
    let mut out = BundleChanges::default();
    let keys: BTreeSet<&ResourceKey> = old.resources.keys().chain(new.resources.keys()).collect();
    for key in keys {
        let what = match (old.resources.get(key), new.resources.get(key)) {
            (Some(_), None) => "removed".to_owned(),
            (None, Some(_)) => "added".to_owned(),
            (Some(before), Some(after)) => match changed_parts(before, after) {
                Some(parts) => format!("changed: {parts}"),
                None => continue,
            },
            (None, None) => continue,
        };
        let effect = match key.kind {
            Kind::Package | Kind::Swarm => {
                out.everything = true;
                "everything restarts".to_owned()
            }
            Kind::Agent => {
                out.agents.insert(key.name.clone());
                format!("restarts Agent/{}", key.name)
            }
            Kind::Connection => {
                out.connections.insert(key.name.clone());
                format!("restarts Connection/{}", key.name)
            }
            Kind::Model | Kind::Tool | Kind::Extension => {
                let users = users_of(key, &old.agent_uses, &new.agent_uses);
                out.agents.extend(users.iter().cloned());
                effect_on("Agent", &users)
            }
            Kind::Connector => {
                let users = users_of(key, &old.connection_uses, &new.connection_uses);
                out.connections.extend(users.iter().cloned());
                effect_on("Connection", &users)
            }
        };
        out.described.push(format!("{key} {what} → {effect}"));
    }
    if old.lock != new.lock {
        out.everything = true;
        out.described.push(format!("{LOCK_FILE} changed → everything restarts"));
    }
    let packages: BTreeSet<&String> = old.packages.keys().chain(new.packages.keys()).collect();
    for name in packages {
        let what = match (old.packages.get(name), new.packages.get(name)) {
            (Some(_), None) => "removed",
            (None, Some(_)) => "added",
            (Some(before), Some(after)) if before != after => "changed",
            _ => continue,
        };
        out.everything = true;
        out.described.push(format!("package {name} {what} → everything restarts"));
    }
    out
}

/// The names whose uses (before or after the change) include `key`.
fn users_of(
    key: &ResourceKey,
    old: &BTreeMap<String, BTreeSet<ResourceKey>>,
    new: &BTreeMap<String, BTreeSet<ResourceKey>>,
) -> BTreeSet<String> {
    old.iter().chain(new).filter(|(_, uses)| uses.contains(key)).map(|(name, _)| name.clone()).collect()
}

fn effect_on(kind: &str, users: &BTreeSet<String>) -> String {
    if users.is_empty() {
        return "nothing uses it".to_owned();
    }
    let names: Vec<String> = users.iter().map(|name| format!("{kind}/{name}")).collect();
    format!("restarts {}", names.join(", "))
}

/// The changed fields and file of a resource, in words, or `None` when it
/// is the same.
fn changed_parts(before: &ResourcePrint, after: &ResourcePrint) -> Option<String> {
    let mut parts = Vec::new();
    diff_paths(&before.document, &after.document, "", &mut parts);
    if parts.len() > MAX_LISTED_FIELDS {
        let more = parts.len() - MAX_LISTED_FIELDS;
        parts.truncate(MAX_LISTED_FIELDS);
        parts.push(format!("and {more} more"));
    }
    match (&before.file, &after.file) {
        (Some(old), Some(new)) if old.path == new.path && old.state != new.state => {
            let state = match &new.state {
                FileState::Sha256(_) => String::new(),
                FileState::Missing => " (now missing)".to_owned(),
                FileState::Unreadable(error) => format!(" (now unreadable: {error})"),
            };
            parts.push(format!("{} file {}{state}", new.role, new.path));
        }
        // A different path already shows as a changed field.
        _ => {}
    }
    if parts.is_empty() { None } else { Some(parts.join(", ")) }
}

/// The paths (`spec.modelConfig.params.temperature`) at which two documents
/// differ: objects are compared key by key, anything else whole.
fn diff_paths(before: &JsonValue, after: &JsonValue, at: &str, out: &mut Vec<String>) {
    if before == after {
        return;
    }
    let (JsonValue::Object(before), JsonValue::Object(after)) = (before, after) else {
        out.push(if at.is_empty() { "the document".to_owned() } else { at.to_owned() });
        return;
    };
    let keys = before.keys().chain(after.keys().filter(|key| !before.contains_key(*key)));
    for key in keys {
        let path = if at.is_empty() { key.clone() } else { format!("{at}.{key}") };
        match (before.get(key), after.get(key)) {
            (Some(old), Some(new)) => diff_paths(old, new, &path, out),
            _ => out.push(path),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundle::load_bundle;

    const TOOL_JS: &str = "export const handlers = { add: async () => ({}) };\n";

    /// A bundle with two agents sharing a Model, a Tool only `writer` lists,
    /// an Extension only `reviewer` loads, a local Connector with a
    /// Connection, and a Connection to a built-in connector.
    const BUNDLE: &str = "\
# The bundle of the change tests.
apiVersion: goondan.ai/v1
kind: Model
metadata: {name: shared}
spec: {provider: scripted, model: script}
---
apiVersion: goondan.ai/v1
kind: Agent
metadata: {name: writer}
spec:
  modelConfig: {modelRef: Model/shared}
  prompt: {system: You write.}
  tools: [Tool/notes, {kind: Tool, name: bash, package: '@goondan/base'}]
---
apiVersion: goondan.ai/v1
kind: Agent
metadata: {name: reviewer}
spec:
  modelConfig: {modelRef: {kind: Model, name: shared}}
  prompt: {systemRef: ./prompts/reviewer.md}
  extensions: [{kind: Extension, name: audit}]
---
apiVersion: goondan.ai/v1
kind: Swarm
metadata: {name: team}
spec: {entryAgent: Agent/writer, agents: [Agent/writer, Agent/reviewer]}
---
apiVersion: goondan.ai/v1
kind: Tool
metadata: {name: notes}
spec:
  entry: ./tools/notes.js
  exports: [{name: add, description: Adds a note.}]
---
apiVersion: goondan.ai/v1
kind: Extension
metadata: {name: audit}
spec: {entry: ./extensions/audit.js}
---
apiVersion: goondan.ai/v1
kind: Connector
metadata: {name: feed}
spec: {entry: ./connectors/feed.js, events: [{name: item}]}
---
apiVersion: goondan.ai/v1
kind: Connection
metadata: {name: feed-in}
spec:
  connectorRef: Connector/feed
  swarmRef: Swarm/team
  ingress:
    rules:
      - match: {event: item}
        route: {agentRef: Agent/reviewer}
---
apiVersion: goondan.ai/v1
kind: Connection
metadata: {name: terminal}
spec:
  connectorRef: {kind: Connector, name: cli, package: '@goondan/base'}
  swarmRef: Swarm/team
  ingress:
    rules:
      - route: {instanceKey: terminal}
";

    /// A bundle directory holding `BUNDLE` and the files it names.
    fn bundle_dir() -> Result<tempfile::TempDir, Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let root = dir.path();
        for sub in ["tools", "extensions", "connectors", "prompts"] {
            std::fs::create_dir(root.join(sub))?;
        }
        std::fs::write(root.join("goondan.yaml"), BUNDLE)?;
        std::fs::write(root.join("tools/notes.js"), TOOL_JS)?;
        std::fs::write(root.join("extensions/audit.js"), "export function register() {}\n")?;
        std::fs::write(root.join("connectors/feed.js"), "export default async function run() {}\n")?;
        std::fs::write(root.join("prompts/reviewer.md"), "You review.\n")?;
        Ok(dir)
    }

    fn load_valid(root: &Path) -> Result<Bundle, String> {
        let report = load_bundle(root);
        match report.valid_bundle() {
            Some(bundle) => Ok(bundle.clone()),
            None => Err(format!("the bundle is not valid: {:#?}", report.diagnostics)),
        }
    }

    fn fingerprint(root: &Path) -> Result<BundleFingerprint, String> {
        load_valid(root).map(|bundle| BundleFingerprint::of(&bundle))
    }

    /// The changes made by `edit` to the test bundle.
    fn after_edit(
        edit: impl FnOnce(&Path) -> std::io::Result<()>,
    ) -> Result<BundleChanges, Box<dyn std::error::Error>> {
        let dir = bundle_dir()?;
        let before = fingerprint(dir.path())?;
        edit(dir.path())?;
        let after = fingerprint(dir.path())?;
        Ok(changes(&before, &after))
    }

    /// Replaces `from` (which must occur once) in goondan.yaml.
    fn replace_in_yaml(root: &Path, from: &str, to: &str) -> std::io::Result<()> {
        let path = root.join("goondan.yaml");
        let text = std::fs::read_to_string(&path)?;
        assert_eq!(text.matches(from).count(), 1, "{from:?} must occur once");
        std::fs::write(path, text.replacen(from, to, 1))
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|name| (*name).to_owned()).collect()
    }

    /// The changes that restart `agents` and `connections` only, described
    /// by the one line `described`.
    fn restarts(agents: &[&str], connections: &[&str], described: &str) -> BundleChanges {
        BundleChanges {
            everything: false,
            agents: set(agents),
            connections: set(connections),
            described: vec![described.to_owned()],
        }
    }

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    #[test]
    fn unchanged_bundle_changes_nothing() -> TestResult {
        let changed = after_edit(|_| Ok(()))?;
        assert_eq!(changed, BundleChanges::default());
        Ok(())
    }

    #[test]
    fn an_agents_prompt_restarts_only_that_agent() -> TestResult {
        let changed = after_edit(|root| replace_in_yaml(root, "system: You write.", "system: You write tersely."))?;
        assert_eq!(
            changed,
            restarts(&["writer"], &[], "Agent/writer changed: spec.prompt.system → restarts Agent/writer")
        );
        Ok(())
    }

    #[test]
    fn an_agents_prompt_file_restarts_that_agent() -> TestResult {
        let changed = after_edit(|root| std::fs::write(root.join("prompts/reviewer.md"), "You review closely.\n"))?;
        assert_eq!(
            changed,
            restarts(
                &["reviewer"],
                &[],
                "Agent/reviewer changed: prompt file ./prompts/reviewer.md → restarts Agent/reviewer"
            )
        );
        Ok(())
    }

    #[test]
    fn a_model_both_agents_use_restarts_both() -> TestResult {
        let changed = after_edit(|root| replace_in_yaml(root, "model: script}", "model: script-2}"))?;
        assert_eq!(
            changed,
            restarts(
                &["reviewer", "writer"],
                &[],
                "Model/shared changed: spec.model → restarts Agent/reviewer, Agent/writer"
            )
        );
        Ok(())
    }

    #[test]
    fn a_tools_entry_file_restarts_the_agents_that_list_it() -> TestResult {
        let changed =
            after_edit(|root| std::fs::write(root.join("tools/notes.js"), TOOL_JS.replace("({})", "({ ok: true })")))?;
        assert_eq!(
            changed,
            restarts(&["writer"], &[], "Tool/notes changed: entry file ./tools/notes.js → restarts Agent/writer")
        );
        Ok(())
    }

    #[test]
    fn an_extension_restarts_the_agents_that_load_it() -> TestResult {
        let changed = after_edit(|root| std::fs::write(root.join("extensions/audit.js"), "// v2\n"))?;
        assert_eq!(changed.agents, set(&["reviewer"]));
        let changed = after_edit(|root| {
            replace_in_yaml(root, "entry: ./extensions/audit.js}", "entry: ./extensions/audit.js, config: {level: 2}}")
        })?;
        assert_eq!(changed.agents, set(&["reviewer"]));
        assert_eq!(changed.described, ["Extension/audit changed: spec.config → restarts Agent/reviewer"]);
        Ok(())
    }

    #[test]
    fn a_connections_ingress_rules_restart_that_connection_only() -> TestResult {
        let changed = after_edit(|root| {
            replace_in_yaml(root, "route: {agentRef: Agent/reviewer}", "route: {agentRef: Agent/writer}")
        })?;
        assert_eq!(
            changed,
            restarts(&[], &["feed-in"], "Connection/feed-in changed: spec.ingress.rules → restarts Connection/feed-in")
        );
        Ok(())
    }

    #[test]
    fn a_connectors_entry_file_restarts_its_connections() -> TestResult {
        let changed = after_edit(|root| std::fs::write(root.join("connectors/feed.js"), "export default 1;\n"))?;
        assert_eq!(
            changed,
            restarts(
                &[],
                &["feed-in"],
                "Connector/feed changed: entry file ./connectors/feed.js → restarts Connection/feed-in"
            )
        );
        Ok(())
    }

    #[test]
    fn a_swarms_agents_list_restarts_everything() -> TestResult {
        let changed = after_edit(|root| {
            replace_in_yaml(root, "agents: [Agent/writer, Agent/reviewer]}", "agents: [Agent/writer]}")
        })?;
        assert!(changed.everything);
        assert!(!changed.restarts_nothing());
        assert_eq!(changed.described, ["Swarm/team changed: spec.agents → everything restarts"]);
        Ok(())
    }

    #[test]
    fn comments_formatting_and_key_order_change_nothing() -> TestResult {
        let changed = after_edit(|root| {
            let path = root.join("goondan.yaml");
            let text = std::fs::read_to_string(&path)?;
            let text = text
                .replace("# The bundle of the change tests.", "# Edited comment.\n\n# Another.")
                .replace("metadata: {name: shared}", "metadata:\n    name: shared   # the model")
                .replace("spec: {provider: scripted, model: script}", "spec: {model: \"script\", provider: 'scripted'}")
                .replace("prompt: {system: You write.}", "prompt:\n    system: >-\n      You write.");
            std::fs::write(path, text)
        })?;
        assert!(changed.restarts_nothing());
        assert!(changed.described.is_empty(), "{:?}", changed.described);
        Ok(())
    }

    #[test]
    fn an_unused_resource_added_restarts_nothing_but_is_described() -> TestResult {
        let changed = after_edit(|root| {
            let path = root.join("goondan.yaml");
            let mut text = std::fs::read_to_string(&path)?;
            text.push_str(
                "---\napiVersion: goondan.ai/v1\nkind: Tool\nmetadata: {name: spare}\n\
                 spec: {entry: ./tools/notes.js, exports: [{name: add, description: Adds.}]}\n",
            );
            std::fs::write(path, text)
        })?;
        assert!(changed.restarts_nothing());
        assert_eq!(changed.described, ["Tool/spare added → nothing uses it"]);
        Ok(())
    }

    #[test]
    fn an_agent_added_or_removed_restarts_that_agent() -> TestResult {
        let extra = "---\napiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {name: spare}\n\
                     spec: {modelConfig: {modelRef: Model/shared}}\n";
        let dir = bundle_dir()?;
        let before = fingerprint(dir.path())?;
        let path = dir.path().join("goondan.yaml");
        std::fs::write(&path, format!("{BUNDLE}{extra}"))?;
        let after = fingerprint(dir.path())?;
        let added = changes(&before, &after);
        assert!(!added.everything);
        assert_eq!(added.agents, set(&["spare"]));
        assert_eq!(added.described, ["Agent/spare added → restarts Agent/spare"]);
        let removed = changes(&after, &before);
        assert_eq!(removed.agents, set(&["spare"]));
        assert_eq!(removed.described, ["Agent/spare removed → restarts Agent/spare"]);
        Ok(())
    }

    #[test]
    fn a_tool_an_agent_stops_listing_still_restarts_it_once() -> TestResult {
        // The agent's own document changed, and the tool it dropped did too:
        // the agent restarts (once), found through the old uses.
        let changed = after_edit(|root| {
            replace_in_yaml(root, "tools: [Tool/notes, ", "tools: [")?;
            std::fs::write(root.join("tools/notes.js"), "// gone from writer\n")
        })?;
        assert_eq!(changed.agents, set(&["writer"]));
        assert_eq!(changed.described.len(), 2, "{:?}", changed.described);
        Ok(())
    }

    #[test]
    fn split_files_and_directories_appearing_where_the_loader_searches_count() -> TestResult {
        let dir = bundle_dir()?;
        let root = std::path::absolute(dir.path())?;
        std::fs::create_dir_all(root.join("node_modules/x"))?;
        let bundle = load_valid(&root)?;
        for config in [root.clone(), root.join("goondan.yaml")] {
            let list = WatchList::of(&config, &bundle);
            assert!(list.dirs().contains(&root) && list.dirs().contains(&root.join("tools")));
            assert!(!list.dirs().contains(&root.join("node_modules")), "{:?}", list.dirs());
            // Loaded files, and bundle files not there yet, in any searched directory.
            for path in ["goondan.yaml", "tools/notes.js", "agents.yaml", "Tools.YML", "prompts/models.yml"] {
                assert!(list.counts(&root.join(path)), "{path}");
            }
            for path in ["notes.txt", "tools/other.js", "node_modules/x/agents.yaml", "dist"] {
                assert!(!list.counts(&root.join(path)), "{path}");
            }
            // A directory made where the loader searches (its files are found at the reload).
            std::fs::create_dir_all(root.join("more"))?;
            std::fs::create_dir_all(root.join("dist"))?;
            assert!(list.counts(&root.join("more")));
            assert!(!list.counts(&root.join("dist")), "dist is never searched");
            // A searched directory going away.
            assert!(list.counts(&root.join("prompts")));
            std::fs::remove_dir(root.join("more"))?;
        }
        // A YAML file of another name is the bundle alone: nothing else counts.
        std::fs::copy(root.join("goondan.yaml"), root.join("alone.yaml"))?;
        let alone = load_valid(&root.join("alone.yaml"))?;
        let list = WatchList::of(&root.join("alone.yaml"), &alone);
        assert!(list.counts(&root.join("alone.yaml")));
        assert!(!list.counts(&root.join("agents.yaml")));
        Ok(())
    }

    #[test]
    fn an_installed_dependency_changing_restarts_everything() -> TestResult {
        let dir = bundle_dir()?;
        let packages = tempfile::tempdir()?;
        let package = packages.path().join("acme/dep/1.0.0");
        std::fs::create_dir_all(package.join("src"))?;
        std::fs::write(
            package.join("goondan.yaml"),
            "apiVersion: goondan.ai/v1\nkind: Package\nmetadata: {name: '@acme/dep'}\nspec: {version: 1.0.0}\n---\n\
             apiVersion: goondan.ai/v1\nkind: Tool\nmetadata: {name: t}\n\
             spec: {entry: ./src/t.ts, exports: [{name: go, description: Goes.}]}\n",
        )?;
        // Installed compiled, as a published package ships it.
        std::fs::create_dir_all(package.join("dist/src"))?;
        std::fs::write(package.join("dist/src/t.js"), TOOL_JS)?;
        let text = std::fs::read_to_string(dir.path().join("goondan.yaml"))?;
        let package_doc = "apiVersion: goondan.ai/v1\nkind: Package\nmetadata: {name: user}\n\
             spec: {version: 0.1.0, dependencies: [{name: '@acme/dep', version: 1.0.0}]}\n---\n";
        std::fs::write(dir.path().join("goondan.yaml"), format!("{package_doc}{text}"))?;
        let load = |root: &Path| -> Result<BundleFingerprint, String> {
            let report = crate::bundle::load_bundle_with(root, Some(packages.path()));
            report.valid_bundle().map(BundleFingerprint::of).ok_or_else(|| format!("{:#?}", report.diagnostics))
        };
        let before = load(dir.path())?;
        assert!(changes(&before, &load(dir.path())?).restarts_nothing());
        // The file the entry falls back to is the one loaded, and watched.
        let bundle = crate::bundle::load_bundle_with(dir.path(), Some(packages.path())).bundle.ok_or("no bundle")?;
        assert!(watched_files(&bundle).contains(&std::path::absolute(package.join("dist/src/t.js"))?));
        std::fs::write(package.join("dist/src/t.js"), "// changed\n")?;
        let changed = changes(&before, &load(dir.path())?);
        assert!(changed.everything);
        assert_eq!(changed.described, ["package @acme/dep changed → everything restarts"]);
        Ok(())
    }

    #[test]
    fn the_lock_file_restarts_everything() -> TestResult {
        let changed = after_edit(|root| std::fs::write(root.join(LOCK_FILE), "lockfileVersion: 1\n"))?;
        assert!(changed.everything);
        assert_eq!(changed.described, [format!("{LOCK_FILE} changed → everything restarts")]);
        Ok(())
    }

    #[test]
    fn watched_files_are_the_bundles_own_files_absolute() -> TestResult {
        let dir = bundle_dir()?;
        let bundle = load_valid(dir.path())?;
        let files = watched_files(&bundle);
        // tempdir paths are absolute; the bundle root is the directory.
        let root = dir.path();
        let expected: Vec<PathBuf> = [
            "goondan.yaml",
            LOCK_FILE,
            "./prompts/reviewer.md",
            "./tools/notes.js",
            "./extensions/audit.js",
            "./connectors/feed.js",
        ]
        .iter()
        .map(|file| root.join(file))
        .collect();
        assert_eq!(files, expected);
        assert!(files.iter().all(|file| file.is_absolute()));
        // The built-in bash tool and cli connector the bundle uses live in
        // @goondan/base: none of its files is watched.
        let base_entries: Vec<&str> = crate::bundle::base_package()
            .resources()
            .iter()
            .filter_map(|entry| match &entry.resource {
                AnyResource::Tool(tool) => Some(tool.spec.entry.as_str()),
                AnyResource::Connector(connector) => Some(connector.spec.entry.as_str()),
                AnyResource::Extension(extension) => Some(extension.spec.entry.as_str()),
                _ => None,
            })
            .collect();
        assert!(!base_entries.is_empty());
        for entry in base_entries {
            let entry = Path::new(entry);
            assert!(!files.iter().any(|file| file.ends_with(entry)), "{} is watched", entry.display());
        }
        Ok(())
    }

    #[test]
    fn watched_files_of_a_relative_root_are_absolute() -> TestResult {
        let text = "apiVersion: goondan.ai/v1\nkind: Model\nmetadata: {name: m}\nspec: {provider: a, model: b}\n";
        let report = crate::bundle::load_from_str(text, "goondan.yaml", None, PathBuf::from("goondan.yaml"));
        let Some(bundle) = report.bundle else { panic!("{:#?}", report.diagnostics) };
        let cwd = std::env::current_dir()?;
        assert_eq!(watched_files(&bundle), [cwd.join("goondan.yaml"), cwd.join(LOCK_FILE)]);
        Ok(())
    }
}
