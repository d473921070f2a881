//! `goondan.yaml` loading: typed resources, `ObjectRef` resolution, the
//! compiled-in `@goondan/base` package, and validation diagnostics.
//!
//! - [`yaml`]: YAML text → JSON values with positions.
//! - [`schema`]: the structural schema of each kind's `spec`.
//! - [`validate`]: per-document rules (names, Tool exports, files).
//! - [`bundle`]: loading, cross-document rules, reference resolution.
//! - [`packages`]: which files of a bundle directory are read; installed dependencies.
//! - [`changes`]: what an edit to a bundle's files changes (`gdn run --watch`).
//! - [`resources`]: the typed resources.
//! - [`sandbox`]: `spec.sandbox` resolved: an agent's sandbox, its paths, its `network.allow` entries, its `limits`.
//! - [`placement`]: `spec.placement` of an Agent: the labels a host must carry to run it.
//! - [`diagnostic`]: what a finding looks like.

mod base_snapshot;
pub mod bundle;
pub mod changes;
pub mod diagnostic;
pub mod files;
pub mod packages;
pub mod placement;
mod plain_schema;
pub mod resources;
pub mod sandbox;
pub mod schema;
pub mod validate;
pub mod yaml;

pub use bundle::{
    AgentNameClash, BASE_PACKAGE, Bundle, BundleResource, LOCK_FILE, LoadReport, PackageScope, ResolveError, Resolved,
    Scoped, SourceFile, base_package, bundle_dir, bundle_source_files, load_bundle, load_bundle_with, load_from_str,
    resolve_bundle_file,
};
pub use changes::{BundleChanges, BundleFingerprint, ResourceKey, WatchList, changes, watched_files};
pub use diagnostic::{Diagnostic, DiagnosticCode, Severity};
pub use placement::{
    AgentPlacement, HostLabels, LabelError, MAX_LABEL_LEN, check_label_name, check_label_value, labels_match,
    parse_host_label,
};
pub use resources::{
    AgentPolicy, AgentSpec, AnyResource, ExtensionSpec, Kind, ModelPricing, ModelSpec, Resource, SandboxConfig,
    SandboxNetwork, SandboxPolicy, SwarmSpec, ToolCallScope, ToolExport, ToolSpec, ValueSource, ValueSourceError,
};
pub use sandbox::{
    EffectiveSandbox, LimitBound, LimitError, SandboxLimits, SandboxPathError, SandboxSource, resolve_sandbox_path,
};
