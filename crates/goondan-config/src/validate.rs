//! Per-document checks: apiVersion, kind, metadata.name, the kind's schema,
//! and the rules of spec 002 §2.3 / §13 for Tools.

use std::collections::HashSet;
use std::path::Path;

use goondan_core::naming::{
    ExportNameCheck, ResourceNameProblem, build_tool_name, check_export_name, check_resource_name,
    is_valid_package_name,
};
use goondan_core::{API_VERSION, JsonObject, JsonValue, ObjectRef};

use crate::diagnostic::{Diagnostic, DiagnosticCode};
use crate::resources::{AnyResource, Kind, SandboxPolicy};
use crate::schema::check_spec;
use crate::yaml::YamlDocument;

/// The longest function name model providers accept.
pub const MAX_TOOL_NAME_LEN: usize = 64;

/// Collects the diagnostics of one file, turning document-relative paths
/// into `file#index.path` and attaching YAML positions.
pub(crate) struct DocReporter<'a> {
    pub file_label: &'a str,
    pub index: usize,
    pub document: &'a YamlDocument,
    pub diagnostics: &'a mut Vec<Diagnostic>,
}

impl DocReporter<'_> {
    pub fn full_path(&self, path: &str) -> String {
        if path.is_empty() {
            format!("{}#{}", self.file_label, self.index)
        } else {
            format!("{}#{}.{}", self.file_label, self.index, path)
        }
    }

    pub fn push(&mut self, mut diagnostic: Diagnostic, path: &str) {
        if let Some(position) = self.document.position_of(path) {
            diagnostic = diagnostic.at(position.line, position.column);
        }
        self.diagnostics.push(diagnostic);
    }

    pub fn error(&mut self, code: DiagnosticCode, path: &str, message: impl Into<String>, suggestion: Option<String>) {
        let mut diagnostic = Diagnostic::error(code, self.full_path(path), message);
        diagnostic.suggestion = suggestion;
        self.push(diagnostic, path);
    }

    pub fn warning(
        &mut self,
        code: DiagnosticCode,
        path: &str,
        message: impl Into<String>,
        suggestion: Option<String>,
    ) {
        let mut diagnostic = Diagnostic::warning(code, self.full_path(path), message);
        diagnostic.suggestion = suggestion;
        self.push(diagnostic, path);
    }
}

/// Checks one document and, when it has no errors, returns its typed resource.
///
/// `bundle_root` is where `entry` files are looked up; `None` skips that
/// check (the compiled-in package has no files).
/// `home` is the home directory a `spec.sandbox.writable` entry is
/// compared with (`None`: only `~` itself counts as the home directory).
pub(crate) fn validate_document(
    reporter: &mut DocReporter<'_>,
    bundle_root: Option<&Path>,
    home: Option<&Path>,
) -> Option<AnyResource> {
    let errors_before = reporter.diagnostics.iter().filter(|d| d.is_error()).count();
    let value = &reporter.document.value;
    let Some(map) = value.as_object() else {
        reporter.error(
            DiagnosticCode::SchemaInvalid,
            "",
            format!(
                "a document must be a mapping with apiVersion, kind, metadata and spec, got {}",
                goondan_core::json_type_name(value)
            ),
            None,
        );
        return None;
    };

    match map.get("apiVersion") {
        Some(JsonValue::String(version)) if version == API_VERSION => {}
        Some(other) => reporter.error(
            DiagnosticCode::UnsupportedApiVersion,
            "apiVersion",
            format!("apiVersion {} is not supported", render(other)),
            Some(format!("Use apiVersion: {API_VERSION}.")),
        ),
        None => reporter.error(
            DiagnosticCode::UnsupportedApiVersion,
            "",
            "apiVersion is required",
            Some(format!("Add apiVersion: {API_VERSION} (`gdn validate --fix` adds it).")),
        ),
    }

    let kind = match map.get("kind") {
        Some(JsonValue::String(name)) => match Kind::parse(name) {
            Some(kind) => Some(kind),
            None => {
                let near = Kind::ALL.into_iter().find(|k| k.as_str().eq_ignore_ascii_case(name));
                let suggestion = match near {
                    Some(k) => format!("Did you mean '{}'? Kinds are case-sensitive.", k.as_str()),
                    None => format!("Use one of: {}.", kind_list()),
                };
                reporter.error(DiagnosticCode::UnknownKind, "kind", format!("unknown kind '{name}'"), Some(suggestion));
                None
            }
        },
        Some(other) => {
            reporter.error(
                DiagnosticCode::UnknownKind,
                "kind",
                format!("kind must be a string, got {}", render(other)),
                Some(format!("Use one of: {}.", kind_list())),
            );
            None
        }
        None => {
            reporter.error(
                DiagnosticCode::UnknownKind,
                "",
                "kind is required",
                Some(format!("Add kind: one of {}.", kind_list())),
            );
            None
        }
    };

    let name = check_metadata(reporter, kind);

    let kind = kind?;
    match map.get("spec") {
        Some(spec) => {
            // `spec.sandbox` is checked by check_sandbox and `spec.placement`
            // by check_placement, with codes of their own.
            let own_code = |path: &str| is_sandbox_path(path) || is_under(path, "spec.placement");
            for problem in check_spec(kind, spec).into_iter().filter(|p| !own_code(&p.path)) {
                reporter.error(DiagnosticCode::SchemaInvalid, &problem.path, problem.message, None);
            }
            check_unknown_keys(reporter, kind, spec);
        }
        None => reporter.error(
            DiagnosticCode::SchemaInvalid,
            "",
            format!("spec is required for kind {}", kind.as_str()),
            None,
        ),
    }
    // The rules below read fields defensively, so they run even when the
    // schema found problems: one pass reports everything.
    check_ref_forms(reporter, kind);
    match kind {
        Kind::Tool => check_tool(reporter, name.as_deref().unwrap_or_default(), bundle_root),
        Kind::Extension | Kind::Connector => check_entry_file(reporter, bundle_root),
        Kind::Agent => {
            check_agent_prompt(reporter, bundle_root);
            check_sandbox(reporter, bundle_root, home);
            check_placement(reporter);
        }
        Kind::Swarm => check_sandbox(reporter, bundle_root, home),
        Kind::Connection => check_ingress(reporter),
        _ => {}
    }

    let valid = reporter.diagnostics.iter().filter(|d| d.is_error()).count() == errors_before;
    if !valid {
        return None;
    }
    match AnyResource::from_value(kind, value.clone()) {
        Ok(resource) => Some(resource),
        Err(error) => {
            reporter.error(DiagnosticCode::SchemaInvalid, "spec", format!("spec is not valid: {error}"), None);
            None
        }
    }
}

/// The reference fields of a kind's spec: single fields, list fields, and
/// the kind each must point at.
const REF_FIELDS: &[(Kind, &str, bool, Kind)] = &[
    (Kind::Agent, "modelConfig.modelRef", false, Kind::Model),
    (Kind::Agent, "tools", true, Kind::Tool),
    (Kind::Agent, "extensions", true, Kind::Extension),
    (Kind::Swarm, "entryAgent", false, Kind::Agent),
    (Kind::Swarm, "agents", true, Kind::Agent),
    (Kind::Connection, "connectorRef", false, Kind::Connector),
    (Kind::Connection, "swarmRef", false, Kind::Swarm),
];

/// One reference found in a document.
pub(crate) struct FoundRef {
    /// Its path, e.g. `spec.tools[2]`.
    pub path: String,
    /// The kind it must point at.
    pub expected: Kind,
    /// The parsed reference, or why it does not parse.
    pub parsed: Result<ObjectRef, goondan_core::ObjectRefError>,
}

/// Every reference field of a document of `kind`.
pub(crate) fn document_refs(kind: Kind, document: &JsonValue) -> Vec<FoundRef> {
    let Some(spec) = document.get("spec") else { return Vec::new() };
    let mut found = Vec::new();
    for (owner, field, is_list, expected) in REF_FIELDS {
        if *owner != kind {
            continue;
        }
        let pointer = format!("/{}", field.replace('.', "/"));
        let Some(value) = spec.pointer(&pointer) else { continue };
        if *is_list {
            for (index, item) in value.as_array().into_iter().flatten().enumerate() {
                found.push(FoundRef {
                    path: format!("spec.{field}[{index}]"),
                    expected: *expected,
                    parsed: ObjectRef::parse(item),
                });
            }
        } else {
            found.push(FoundRef {
                path: format!("spec.{field}"),
                expected: *expected,
                parsed: ObjectRef::parse(value),
            });
        }
    }
    if kind == Kind::Connection {
        let rules = spec.pointer("/ingress/rules").and_then(JsonValue::as_array);
        for (index, rule) in rules.into_iter().flatten().enumerate() {
            if let Some(agent) = rule.pointer("/route/agentRef") {
                found.push(FoundRef {
                    path: format!("spec.ingress.rules[{index}].route.agentRef"),
                    expected: Kind::Agent,
                    parsed: ObjectRef::parse(agent),
                });
            }
        }
    }
    found
}

/// A Connection's `ingress.rules`: a list of `{match?, route}` where `match`
/// holds an event name and properties to compare, and `route` at most one
/// way of choosing the instance key (a fixed `instanceKey`, or the event's
/// `instanceKeyProperty` with an optional `instanceKeyPrefix`). Checked here
/// so that a rule that could never be followed as written is refused at
/// load, not discovered when an event arrives.
fn check_ingress(reporter: &mut DocReporter<'_>) {
    let Some(ingress) = reporter.document.value.pointer("/spec/ingress").cloned() else { return };
    let Some(rules) = ingress.get("rules") else { return };
    let Some(rules) = rules.as_array() else {
        reporter.error(
            DiagnosticCode::SchemaInvalid,
            "spec.ingress.rules",
            "spec.ingress.rules must be a list of rules",
            Some("Write rules as a list: `rules: [{match: {event: NAME}, route: {}}]`.".to_owned()),
        );
        return;
    };
    for (index, rule) in rules.iter().enumerate() {
        let path = format!("spec.ingress.rules[{index}]");
        let Some(rule) = rule.as_object() else {
            reporter.error(DiagnosticCode::SchemaInvalid, &path, format!("{path} must be an object"), None);
            continue;
        };
        if let Some(matcher) = rule.get("match") {
            check_ingress_match(reporter, &format!("{path}.match"), matcher);
        }
        match rule.get("route") {
            Some(JsonValue::Object(route)) => check_ingress_route(reporter, &format!("{path}.route"), route),
            Some(_) => {
                reporter.error(
                    DiagnosticCode::SchemaInvalid,
                    &format!("{path}.route"),
                    format!("{path}.route must be an object"),
                    None,
                );
            }
            None => reporter.error(
                DiagnosticCode::SchemaInvalid,
                &path,
                format!("{path} has no route"),
                Some("Give every rule a route; `route: {}` sends the event to the Swarm's entry agent.".to_owned()),
            ),
        }
    }
}

fn check_ingress_match(reporter: &mut DocReporter<'_>, path: &str, matcher: &JsonValue) {
    let Some(matcher) = matcher.as_object() else {
        reporter.error(DiagnosticCode::SchemaInvalid, path, format!("{path} must be an object"), None);
        return;
    };
    if matcher.get("event").is_some_and(|event| !event.is_string()) {
        reporter.error(
            DiagnosticCode::SchemaInvalid,
            &format!("{path}.event"),
            format!("{path}.event must be a string"),
            None,
        );
    }
    match matcher.get("properties") {
        None => {}
        Some(JsonValue::Object(properties)) => {
            for (key, value) in properties {
                if !(value.is_string() || value.is_number() || value.is_boolean()) {
                    reporter.error(
                        DiagnosticCode::SchemaInvalid,
                        &format!("{path}.properties.{key}"),
                        format!("{path}.properties.{key} must be a string, a number or a boolean"),
                        None,
                    );
                }
            }
        }
        Some(_) => {
            reporter.error(
                DiagnosticCode::SchemaInvalid,
                &format!("{path}.properties"),
                format!("{path}.properties must be an object"),
                None,
            );
        }
    }
}

fn check_ingress_route(reporter: &mut DocReporter<'_>, path: &str, route: &JsonObject) {
    for field in ["instanceKey", "instanceKeyProperty", "instanceKeyPrefix"] {
        let value = route.get(field);
        let empty_allowed = field == "instanceKeyPrefix";
        if value.is_some_and(|v| v.as_str().is_none_or(|s| s.is_empty() && !empty_allowed)) {
            reporter.error(
                DiagnosticCode::SchemaInvalid,
                &format!("{path}.{field}"),
                format!("{path}.{field} must be a non-empty string"),
                None,
            );
        }
    }
    if route.contains_key("instanceKey") && route.contains_key("instanceKeyProperty") {
        reporter.error(
            DiagnosticCode::SchemaInvalid,
            path,
            format!("{path} sets both instanceKey and instanceKeyProperty; a route chooses its instance one way"),
            Some(
                "Keep instanceKey for one fixed instance, or instanceKeyProperty to take it from the event.".to_owned(),
            ),
        );
    }
    if route.contains_key("instanceKeyPrefix") && !route.contains_key("instanceKeyProperty") {
        reporter.error(
            DiagnosticCode::SchemaInvalid,
            &format!("{path}.instanceKeyPrefix"),
            format!("{path}.instanceKeyPrefix has no instanceKeyProperty to prefix"),
            Some(
                "Add instanceKeyProperty (the event property that names the instance) or remove the prefix.".to_owned(),
            ),
        );
    }
}

/// Every reference field must be one of the four ObjectRef forms.
/// Fields of older v1 documents that this runtime ignores, and why.
const LEGACY_FIELDS: &[(Kind, &str, &str)] = &[
    (Kind::Tool, "spec.runtime", "tools always run in Bun (or Node ≥ 22.6), whatever `runtime` says"),
    (Kind::Tool, "spec.auth", "a tool reads its credentials from the environment or its config"),
    (Kind::Connector, "spec.auth", "a Connection's `secrets` carry the connector's credentials"),
    (Kind::Connector, "spec.runtime", "connectors always run natively or in Bun"),
    (Kind::Connector, "spec.triggers", "a connector receives on its own (HTTP, polling); see its `events`"),
    (Kind::Extension, "spec.runtime", "extensions always run natively or in Bun"),
];

/// A key the runtime ignores gets a warning naming it: the closest known
/// key when it looks like a typo, why it is ignored when it is a field of
/// an older version.
fn check_unknown_keys(reporter: &mut DocReporter<'_>, kind: Kind, spec: &JsonValue) {
    // An unknown key under `spec.sandbox` is an error (check_sandbox).
    for unknown in crate::schema::unknown_keys(kind, spec).into_iter().filter(|u| !is_sandbox_path(&u.path)) {
        let legacy = LEGACY_FIELDS.iter().find(|(k, path, _)| *k == kind && *path == unknown.path);
        let (message, suggestion) = match legacy {
            Some((_, _, why)) => (
                format!("{} is a field of older versions that this runtime ignores", unknown.path),
                Some(format!("Remove it: {why}.")),
            ),
            None => {
                let place = unknown.path.rsplit_once('.').map_or("spec", |(place, _)| place);
                let hint = match crate::schema::closest(&unknown.key, unknown.known.iter().map(String::as_str)) {
                    Some(close) => format!("Did you mean `{close}`?"),
                    None => format!("Known keys of {place}: {}.", unknown.known.join(", ")),
                };
                (format!("{} is not a field of a {} (it is ignored)", unknown.path, kind.as_str()), Some(hint))
            }
        };
        reporter.warning(DiagnosticCode::UnknownKey, &unknown.path, message, suggestion);
    }
}

fn check_ref_forms(reporter: &mut DocReporter<'_>, kind: Kind) {
    for found in document_refs(kind, &reporter.document.value) {
        if let Err(error) = found.parsed {
            let path = found.path;
            reporter.error(
                DiagnosticCode::InvalidRef,
                &path,
                format!("{path} is not a valid reference: {error}"),
                Some(
                    "Write 'Kind/name', {kind, name, package?}, {ref: 'Kind/name'} or {ref: {kind, name, package?}}."
                        .to_owned(),
                ),
            );
        }
    }
}

fn kind_list() -> String {
    Kind::ALL.iter().map(|k| k.as_str()).collect::<Vec<_>>().join(", ")
}

fn render(value: &JsonValue) -> String {
    match value {
        JsonValue::String(s) => format!("'{s}'"),
        other => other.to_string(),
    }
}

fn check_metadata(reporter: &mut DocReporter<'_>, kind: Option<Kind>) -> Option<String> {
    let metadata = reporter.document.value.get("metadata");
    let Some(metadata) = metadata.and_then(JsonValue::as_object) else {
        let path = if metadata.is_some() { "metadata" } else { "" };
        reporter.error(
            DiagnosticCode::InvalidName,
            path,
            "metadata with a name is required",
            Some("Add metadata: {name: <name>}.".to_owned()),
        );
        return None;
    };
    let name = match metadata.get("name") {
        Some(JsonValue::String(name)) => name.clone(),
        Some(other) => {
            reporter.error(
                DiagnosticCode::InvalidName,
                "metadata.name",
                format!("metadata.name must be a string, got {}", goondan_core::json_type_name(other)),
                None,
            );
            return None;
        }
        None => {
            reporter.error(DiagnosticCode::InvalidName, "metadata", "metadata.name is required", None);
            return None;
        }
    };
    if kind == Some(Kind::Package) {
        if !is_valid_package_name(&name) {
            reporter.error(
                DiagnosticCode::InvalidName,
                "metadata.name",
                format!("package name '{name}' is not a valid package name"),
                Some("Use lowercase letters, digits, '-', '_' and '.', optionally scoped: '@scope/name'.".to_owned()),
            );
        }
        return Some(name);
    }
    let is_tool = kind == Some(Kind::Tool);
    match check_resource_name(&name, is_tool) {
        Ok(()) => {}
        Err(ResourceNameProblem::ContainsSeparator) => reporter.error(
            DiagnosticCode::SchemaInvalid,
            "metadata.name",
            format!("Tool name '{name}' must not contain '__', the separator of tool names"),
            Some(format!("Rename it, e.g. '{}'.", name.replace("__", "-"))),
        ),
        Err(problem) => {
            let detail = match problem {
                ResourceNameProblem::Empty => "must not be empty".to_owned(),
                ResourceNameProblem::TooLong => {
                    format!("is longer than {} characters", goondan_core::naming::MAX_RESOURCE_NAME_LEN)
                }
                ResourceNameProblem::BadEdge => "must start and end with a letter or digit".to_owned(),
                ResourceNameProblem::InvalidCharacter(c) => format!("contains '{c}'"),
                ResourceNameProblem::ContainsSeparator => "contains '__'".to_owned(),
            };
            let allowed = if is_tool { "letters, digits, '-' and '_'" } else { "letters, digits, '-', '_' and '.'" };
            reporter.error(
                DiagnosticCode::InvalidName,
                "metadata.name",
                format!("name '{name}' {detail}"),
                Some(format!("Use 1 to 63 characters of {allowed}, starting and ending with a letter or digit.")),
            );
        }
    }
    Some(name)
}

fn check_tool(reporter: &mut DocReporter<'_>, tool_name: &str, bundle_root: Option<&Path>) {
    check_entry_file(reporter, bundle_root);
    let exports =
        reporter.document.value.pointer("/spec/exports").and_then(JsonValue::as_array).cloned().unwrap_or_default();
    let mut seen = HashSet::new();
    for (index, export) in exports.iter().enumerate() {
        let base = format!("spec.exports[{index}]");
        let name = export.get("name").and_then(JsonValue::as_str).unwrap_or_default();
        let name_path = format!("{base}.name");
        match check_export_name(name) {
            ExportNameCheck::Valid => {}
            ExportNameCheck::MixedCase => reporter.warning(
                DiagnosticCode::SchemaInvalid,
                &name_path,
                format!("export name '{name}' has uppercase letters; export names should use lowercase letters, digits, '_' and '-'"),
                Some(format!("Consider '{}'.", to_kebab(name))),
            ),
            ExportNameCheck::Empty => {}
            ExportNameCheck::ContainsSeparator => reporter.error(
                DiagnosticCode::SchemaInvalid,
                &name_path,
                format!("export name '{name}' must not contain '__', the separator of tool names"),
                Some(format!("Rename it, e.g. '{}'.", name.replace("__", "_"))),
            ),
            ExportNameCheck::InvalidCharacter(c) => reporter.error(
                DiagnosticCode::SchemaInvalid,
                &name_path,
                format!("export name '{name}' contains '{c}'; use lowercase letters, digits, '_' and '-'"),
                None,
            ),
        }
        if !name.is_empty() && !seen.insert(name.to_owned()) {
            reporter.error(
                DiagnosticCode::SchemaInvalid,
                &name_path,
                format!("duplicate export name '{name}' in Tool '{tool_name}'"),
                Some("Each export of a Tool needs its own name.".to_owned()),
            );
        }
        let full = build_tool_name(tool_name, name);
        if full.len() > MAX_TOOL_NAME_LEN {
            reporter.warning(
                DiagnosticCode::SchemaInvalid,
                &name_path,
                format!(
                    "tool name '{full}' is {} characters; model providers accept at most {MAX_TOOL_NAME_LEN}",
                    full.len()
                ),
                Some("Shorten the Tool or export name.".to_owned()),
            );
        }
        if export.get("description").is_none() {
            reporter.warning(
                DiagnosticCode::SchemaInvalid,
                &base,
                format!("export '{name}' has no description; the model decides when to call a tool from it"),
                Some("Add a description.".to_owned()),
            );
        }
        if let Some(parameters) = export.get("parameters") {
            check_parameters(reporter, &format!("{base}.parameters"), parameters);
        }
    }
}

fn check_parameters(reporter: &mut DocReporter<'_>, path: &str, parameters: &JsonValue) {
    if !parameters.is_object() {
        // The kind schema already reports a non-object.
        return;
    }
    if parameters.get("type").and_then(JsonValue::as_str) != Some("object") {
        reporter.error(
            DiagnosticCode::SchemaInvalid,
            path,
            "parameters must be an object schema (type: object)",
            Some("Write parameters as {type: object, properties: {...}, required: [...]}.".to_owned()),
        );
        return;
    }
    // Plain schemas are known to pass the check below; skipping it spares
    // the process building jsonschema's meta-schema validator (see
    // crate::plain_schema).
    if crate::plain_schema::is_plain(parameters) {
        return;
    }
    if let Err(error) = jsonschema::validator_for(parameters) {
        let at = error.schema_path().as_str().trim_start_matches('/').replace('/', ".");
        let where_ = if at.is_empty() { String::new() } else { format!(" at {at}") };
        reporter.error(
            DiagnosticCode::SchemaInvalid,
            path,
            format!("parameters is not a valid JSON Schema{where_}: {error}"),
            None,
        );
    }
}

fn check_entry_file(reporter: &mut DocReporter<'_>, bundle_root: Option<&Path>) {
    let Some(root) = bundle_root else { return };
    let Some(entry) = reporter.document.value.pointer("/spec/entry").and_then(JsonValue::as_str) else {
        return;
    };
    let entry = entry.to_owned();
    // A published package ships compiled code: `src/x.ts` may be there as
    // `dist/src/x.js` or `src/x.js` (see crate::packages::entry_candidates).
    let compiled = crate::packages::entry_candidates(root, &entry).into_iter().skip(1).any(|candidate| {
        candidate
            .strip_prefix(root)
            .ok()
            .and_then(|relative| relative.to_str())
            .is_some_and(|relative| crate::files::resolve_inside(root, relative).is_ok_and(|full| full.is_file()))
    });
    if compiled && !root.join(&entry).is_file() {
        return;
    }
    check_bundle_file(reporter, root, &entry, "spec.entry", "entry file", DiagnosticCode::EntryNotFound);
}

/// Reports a file reference that leaves the bundle (absolute, `..`, or a
/// link out: E_CONFIG_PATH_OUTSIDE_BUNDLE) or names no regular file
/// (`missing`): such files are never read, here or by the runtime.
fn check_bundle_file(
    reporter: &mut DocReporter<'_>,
    root: &Path,
    reference: &str,
    path: &str,
    what: &str,
    missing: DiagnosticCode,
) {
    let hint = || Some("Paths are relative to the directory holding goondan.yaml.".to_owned());
    match crate::files::resolve_inside(root, reference) {
        Ok(full) if full.is_file() => {}
        Ok(full) => reporter.error(
            missing,
            path,
            format!("{what} '{reference}' is not a regular file ({})", full.display()),
            hint(),
        ),
        Err(error) if error.is_outside() => reporter.error(
            DiagnosticCode::PathOutsideBundle,
            path,
            format!("{what} {error}"),
            Some("Keep the file inside the bundle directory and name it relative to goondan.yaml.".to_owned()),
        ),
        Err(crate::files::BundlePathError::NotFound { path: looked, .. }) => reporter.error(
            missing,
            path,
            format!("{what} '{reference}' does not exist (looked for {})", looked.display()),
            hint(),
        ),
        Err(error) => reporter.error(missing, path, format!("{what} {error}"), hint()),
    }
}

fn check_agent_prompt(reporter: &mut DocReporter<'_>, bundle_root: Option<&Path>) {
    let Some(prompt) = reporter.document.value.pointer("/spec/prompt").and_then(JsonValue::as_object) else {
        return;
    };
    let system_ref = prompt.get("systemRef").and_then(JsonValue::as_str).map(str::to_owned);
    if prompt.contains_key("system") && system_ref.is_some() {
        reporter.error(
            DiagnosticCode::SchemaInvalid,
            "spec.prompt",
            "spec.prompt must have either system or systemRef, not both",
            Some("Keep one of them.".to_owned()),
        );
        return;
    }
    if let (Some(root), Some(system_ref)) = (bundle_root, system_ref) {
        check_bundle_file(
            reporter,
            root,
            &system_ref,
            "spec.prompt.systemRef",
            "prompt file",
            DiagnosticCode::RefNotFound,
        );
    }
}

/// Whether a document path is `spec.sandbox` or inside it.
fn is_sandbox_path(path: &str) -> bool {
    is_under(path, "spec.sandbox")
}

/// Whether a document path is `place` or inside it.
fn is_under(path: &str, place: &str) -> bool {
    path.strip_prefix(place).is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
}

/// `spec.placement` of an Agent: a mapping whose `hostLabels` is a mapping
/// of label names to values, each name and value 1 to 63 characters of
/// `A-Z a-z 0-9 . _ -` (the rules of `crate::placement`, which a host's
/// `--label` follows too); a value written as a boolean or an integer is
/// taken as its plain text, anything else is refused. Every problem is an
/// E_CONFIG_PLACEMENT_INVALID error: an agent placed where its author did
/// not mean is worse than one refused. (An unknown key under `placement`
/// is a W_CONFIG_UNKNOWN_KEY warning, from check_unknown_keys.)
fn check_placement(reporter: &mut DocReporter<'_>) {
    let Some(placement) = reporter.document.value.pointer("/spec/placement").cloned() else { return };
    let Some(map) = placement.as_object() else {
        reporter.error(
            DiagnosticCode::PlacementInvalid,
            "spec.placement",
            format!("spec.placement must be a mapping, got {}", goondan_core::json_type_name(&placement)),
            Some(
                "Write e.g. `placement: {hostLabels: {gpu: \"true\"}}`, or leave placement out to run on any host."
                    .to_owned(),
            ),
        );
        return;
    };
    let Some(labels) = map.get("hostLabels") else { return };
    let Some(labels) = labels.as_object() else {
        reporter.error(
            DiagnosticCode::PlacementInvalid,
            "spec.placement.hostLabels",
            format!(
                "spec.placement.hostLabels must be a mapping of label names to values, got {}",
                goondan_core::json_type_name(labels)
            ),
            Some("Write e.g. `hostLabels: {gpu: \"true\", zone: eu}`.".to_owned()),
        );
        return;
    };
    const RULE: &str = "A label name and value are each 1 to 63 characters of letters, digits, '.', '_' and '-'.";
    for (name, value) in labels {
        let path = format!("spec.placement.hostLabels.{name}");
        if let Err(error) = crate::placement::check_label_name(name) {
            reporter.error(DiagnosticCode::PlacementInvalid, &path, error.to_string(), Some(RULE.to_owned()));
        }
        let Some(text) = crate::placement::label_value_text(value) else {
            let suggestion = match value {
                JsonValue::Number(number) => format!(
                    "Quote it with the digits you mean, e.g. `{name}: \"{number}\"`: YAML reads an unquoted fractional number as a number and does not keep how it was written (1.10 becomes 1.1)."
                ),
                JsonValue::Null => format!("Write a value, e.g. `{name}: \"true\"`."),
                _ => format!("Write one value as a string, e.g. `{name}: \"true\"`."),
            };
            reporter.error(
                DiagnosticCode::PlacementInvalid,
                &path,
                format!(
                    "host label '{name}' must be a string, a boolean or an integer, got {}",
                    render_label_value(value)
                ),
                Some(suggestion),
            );
            continue;
        };
        if let Err(error) = crate::placement::check_label_value(&text) {
            reporter.error(
                DiagnosticCode::PlacementInvalid,
                &path,
                format!("{error} (label {name})"),
                Some(RULE.to_owned()),
            );
        }
    }
}

/// A refused label value in a message: its type, and the number itself for
/// a fractional one.
fn render_label_value(value: &JsonValue) -> String {
    match value {
        JsonValue::Number(number) => format!("the fractional number {number}"),
        other => goondan_core::json_type_name(other).to_owned(),
    }
}

/// The keys of `spec.sandbox`, of `spec.sandbox.network` and of
/// `spec.sandbox.limits`.
const SANDBOX_KEYS: [&str; 5] = ["policy", "readable", "writable", "network", "limits"];
const SANDBOX_NETWORK_KEYS: [&str; 1] = ["allow"];
const SANDBOX_LIMITS_KEYS: [&str; 3] = ["processes", "fileSize", "memory"];

/// Where a path entry is written (the hint of the path errors).
const SANDBOX_PATH_FORMS: &str =
    "an absolute path, ~/… (your home directory), or a path relative to goondan.yaml's directory";

/// `spec.sandbox` of an Agent or a Swarm: every problem is an error with a
/// code of its own (a sandbox that is not what its author meant must not
/// run as something else: no unknown key ignored, no policy guessed), and
/// two warnings: a `writable` entry that is `/` or the home directory (or
/// holds it), and settings `policy: full` ignores.
fn check_sandbox(reporter: &mut DocReporter<'_>, bundle_root: Option<&Path>, home: Option<&Path>) {
    let Some(sandbox) = reporter.document.value.pointer("/spec/sandbox").cloned() else { return };
    let Some(map) = sandbox.as_object() else {
        let suggestion = match sandbox.as_str().and_then(SandboxPolicy::parse) {
            Some(policy) => format!("Write `sandbox: {{policy: {policy}}}`."),
            None => "Write a mapping, e.g. `sandbox: {policy: workspace-write}`, or leave sandbox out for the Swarm's or the default."
                .to_owned(),
        };
        reporter.error(
            DiagnosticCode::SandboxInvalid,
            "spec.sandbox",
            format!("spec.sandbox must be a mapping, got {}", goondan_core::json_type_name(&sandbox)),
            Some(suggestion),
        );
        return;
    };
    check_closed_keys(reporter, map, "spec.sandbox", &SANDBOX_KEYS);
    let policy = match map.get("policy") {
        None => Some(SandboxPolicy::default()),
        Some(JsonValue::String(text)) => {
            let policy = SandboxPolicy::parse(text);
            if policy.is_none() {
                reporter.error(
                    DiagnosticCode::SandboxPolicyInvalid,
                    "spec.sandbox.policy",
                    format!("sandbox policy '{text}' is not one of {}", sandbox_policy_list()),
                    Some(policy_suggestion(text)),
                );
            }
            policy
        }
        Some(other) => {
            reporter.error(
                DiagnosticCode::SandboxPolicyInvalid,
                "spec.sandbox.policy",
                format!(
                    "spec.sandbox.policy must be one of {}, got {}",
                    sandbox_policy_list(),
                    goondan_core::json_type_name(other)
                ),
                Some("Write the policy as a string, e.g. `policy: workspace-write`.".to_owned()),
            );
            None
        }
    };
    let readable = check_sandbox_paths(reporter, map, "readable");
    let writable = check_sandbox_paths(reporter, map, "writable");
    let allow = check_sandbox_network(reporter, map);
    let limits = check_sandbox_limits(reporter, map);
    let Some(policy) = policy else { return };
    if policy == SandboxPolicy::Full {
        let ignored = [
            ("network.allow", allow, "full has no network limit: commands may connect anywhere"),
            ("limits", limits, "full sets no resource bounds: commands may use what the user can"),
            ("readable", readable.len(), "full has no sandbox: commands may read anything the user can"),
            ("writable", writable.len(), "full has no sandbox: commands may write anything the user can"),
        ];
        for (field, _, why) in ignored.into_iter().filter(|(_, count, _)| *count > 0) {
            let path = format!("spec.sandbox.{field}");
            reporter.warning(
                DiagnosticCode::SandboxIgnored,
                &path,
                format!("{path} is ignored under policy full ({why})"),
                Some(format!("Remove {field}, or choose workspace-write or read-only to have it apply.")),
            );
        }
        return;
    }
    for (index, entry) in writable {
        if let Some(what) = wide_writable(&entry, bundle_root, home) {
            reporter.warning(
                DiagnosticCode::SandboxWide,
                &format!("spec.sandbox.writable[{index}]"),
                format!("writable path '{entry}' is {what}: commands may write anywhere in it, which the sandbox is there to prevent"),
                Some("Name only the directories commands need to write; `policy: full` turns the sandbox off if that is what you mean.".to_owned()),
            );
        }
    }
}

/// Reports every key of `map` (at `path`) that is not one of `known`.
fn check_closed_keys(reporter: &mut DocReporter<'_>, map: &JsonObject, path: &str, known: &[&str]) {
    for key in map.keys().filter(|key| !known.contains(&key.as_str())) {
        let hint = match crate::schema::closest(key, known.iter().copied()) {
            Some(close) => format!("Did you mean `{close}`?"),
            None => format!("The keys of {path}: {}.", known.join(", ")),
        };
        reporter.error(
            DiagnosticCode::SandboxInvalid,
            &format!("{path}.{key}"),
            format!("{path}.{key} is not a sandbox setting; an unknown key is refused, not ignored"),
            Some(hint),
        );
    }
}

/// `read-only, workspace-write, full`.
fn sandbox_policy_list() -> String {
    SandboxPolicy::ALL.iter().map(|policy| policy.as_str()).collect::<Vec<_>>().join(", ")
}

/// What a misspelt policy probably means.
fn policy_suggestion(text: &str) -> String {
    let squashed = |s: &str| s.to_ascii_lowercase().replace(['-', '_', ' '], "");
    let same_letters = SandboxPolicy::ALL.into_iter().find(|policy| squashed(policy.as_str()) == squashed(text));
    let close = same_letters
        .map(SandboxPolicy::as_str)
        .or_else(|| crate::schema::closest(text, SandboxPolicy::ALL.iter().map(|policy| policy.as_str())));
    let off = ["none", "off", "disabled", "disable", "no", "false", "unrestricted", "unconfined", "danger-full-access"];
    match close {
        Some(close) => format!("Did you mean `{close}`? The policies: {}.", sandbox_policy_list()),
        None if off.contains(&text.to_ascii_lowercase().as_str()) => {
            "For no sandbox write `policy: full` (commands then run with the user's full rights).".to_owned()
        }
        None => format!("Write one of {}.", sandbox_policy_list()),
    }
}

/// `spec.sandbox.readable` or `writable`: a list of non-empty strings, none
/// `~name`. Returns the entries that pass, with their index.
fn check_sandbox_paths(reporter: &mut DocReporter<'_>, map: &JsonObject, field: &str) -> Vec<(usize, String)> {
    let path = format!("spec.sandbox.{field}");
    let Some(value) = map.get(field) else { return Vec::new() };
    let Some(items) = value.as_array() else {
        let suggestion = match value.as_str() {
            Some(one) => format!("Write a list: `{field}: [{one}]`."),
            None => format!("Write a list of paths: {SANDBOX_PATH_FORMS}."),
        };
        reporter.error(
            DiagnosticCode::SandboxInvalid,
            &path,
            format!("{path} must be a list of paths, got {}", goondan_core::json_type_name(value)),
            Some(suggestion),
        );
        return Vec::new();
    };
    let mut good = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let item_path = format!("{path}[{index}]");
        let Some(entry) = item.as_str() else {
            // A bare `~` is YAML's null, not the home directory.
            let suggestion = if item.is_null() {
                "A bare ~ is null in YAML: quote it, \"~\", for the home directory.".to_owned()
            } else {
                format!("Write {SANDBOX_PATH_FORMS}.")
            };
            reporter.error(
                DiagnosticCode::SandboxInvalid,
                &item_path,
                format!("{item_path} must be a path (a string), got {}", goondan_core::json_type_name(item)),
                Some(suggestion),
            );
            continue;
        };
        match crate::sandbox::check_sandbox_path(entry) {
            Ok(()) => good.push((index, entry.to_owned())),
            Err(error) => reporter.error(
                DiagnosticCode::SandboxInvalid,
                &item_path,
                format!("{item_path} is not a usable path: {error}"),
                Some(format!("Write {SANDBOX_PATH_FORMS}, or remove the entry.")),
            ),
        }
    }
    good
}

/// `spec.sandbox.<key>` if it is there: a mapping, its keys other than
/// `known` reported; one that is not a mapping is reported (with
/// `suggestion`) and gives `None`, like an absent one.
fn sandbox_section<'m>(
    reporter: &mut DocReporter<'_>,
    map: &'m JsonObject,
    key: &str,
    known: &[&str],
    suggestion: &str,
) -> Option<&'m JsonObject> {
    let value = map.get(key)?;
    let path = format!("spec.sandbox.{key}");
    let Some(section) = value.as_object() else {
        reporter.error(
            DiagnosticCode::SandboxInvalid,
            &path,
            format!("{path} must be a mapping, got {}", goondan_core::json_type_name(value)),
            Some(suggestion.to_owned()),
        );
        return None;
    };
    check_closed_keys(reporter, section, &path, known);
    Some(section)
}

/// `spec.sandbox.network`: a mapping with only `allow`, a list of
/// `host:port` entries. Returns how many entries it has.
fn check_sandbox_network(reporter: &mut DocReporter<'_>, map: &JsonObject) -> usize {
    let Some(network) = sandbox_section(
        reporter,
        map,
        "network",
        &SANDBOX_NETWORK_KEYS,
        "Write `network: {allow: [\"host:port\", …]}`.",
    ) else {
        return 0;
    };
    let Some(allow) = network.get("allow") else { return 0 };
    let Some(entries) = allow.as_array() else {
        let suggestion = match allow.as_str() {
            Some(one) => format!("Write a list: `allow: [\"{one}\"]`."),
            None => "Write a list of host:port entries, e.g. `allow: [\"api.example.com:443\"]`.".to_owned(),
        };
        reporter.error(
            DiagnosticCode::SandboxInvalid,
            "spec.sandbox.network.allow",
            format!("spec.sandbox.network.allow must be a list, got {}", goondan_core::json_type_name(allow)),
            Some(suggestion),
        );
        return 0;
    };
    for (index, entry) in entries.iter().enumerate() {
        let path = format!("spec.sandbox.network.allow[{index}]");
        let problem = match entry.as_str() {
            Some(text) => goondan_core::host_port::HostPort::parse(text, None).err().map(|error| error.to_string()),
            None => Some(format!("must be a string, got {}", goondan_core::json_type_name(entry))),
        };
        if let Some(problem) = problem {
            reporter.error(
                DiagnosticCode::SandboxNetwork,
                &path,
                format!("{path} is not host:port: {problem}"),
                Some(
                    "Write host:port: a host name, an IPv4 address or a bracketed IPv6 address, and a port from 1 to 65535, e.g. api.example.com:443, 127.0.0.1:8080, [::1]:9000."
                        .to_owned(),
                ),
            );
        }
    }
    entries.len()
}

/// `spec.sandbox.limits`: a mapping of `processes` (a whole number or
/// `unlimited`), `fileSize` and `memory` (bytes, a size with a unit, or
/// `unlimited`), each checked by the parser the sandbox is built with.
/// Returns how many bounds it sets.
fn check_sandbox_limits(reporter: &mut DocReporter<'_>, map: &JsonObject) -> usize {
    let Some(limits) = sandbox_section(
        reporter,
        map,
        "limits",
        &SANDBOX_LIMITS_KEYS,
        "Write e.g. `limits: {processes: 512, fileSize: 1GiB, memory: 8GiB}`.",
    ) else {
        return 0;
    };
    type Parse = fn(&JsonValue) -> Result<crate::sandbox::LimitBound, crate::sandbox::LimitError>;
    let fields: [(&str, Parse, &str); 3] = [
        (
            "processes",
            crate::sandbox::parse_processes,
            "Write how many processes (and threads) a command may run at once, e.g. `processes: 512`, or `unlimited`.",
        ),
        (
            "fileSize",
            crate::sandbox::parse_file_size,
            "Write the largest file a command may write, e.g. `fileSize: 1GiB` or a number of bytes, or `unlimited`.",
        ),
        (
            "memory",
            crate::sandbox::parse_memory,
            "Write the memory a command may take, e.g. `memory: 8GiB` (at least 16MiB), or `unlimited`.",
        ),
    ];
    let mut set = 0;
    for (field, parse, hint) in fields {
        let Some(value) = limits.get(field) else { continue };
        set += 1;
        if let Err(error) = parse(value) {
            let path = format!("spec.sandbox.limits.{field}");
            reporter.error(
                DiagnosticCode::SandboxInvalid,
                &path,
                format!("{path} is not a bound: {error}"),
                Some(hint.to_owned()),
            );
        }
    }
    set
}

/// What a `writable` entry opens too widely, if it does: `/` itself, the
/// home directory, or a directory holding it. `~` entries are judged
/// without a home directory too; relative ones only with the bundle's
/// directory.
fn wide_writable(entry: &str, bundle_root: Option<&Path>, home: Option<&Path>) -> Option<String> {
    let home_entry = entry == "~" || entry.starts_with("~/");
    let resolved = match (home_entry, home) {
        (true, None) => {
            let rest =
                crate::sandbox::normalize(&Path::new("/").join(entry.trim_start_matches('~').trim_start_matches('/')));
            return (rest == Path::new("/")).then(|| "your home directory".to_owned());
        }
        (true, Some(home)) => crate::sandbox::resolve_sandbox_path(entry, Path::new("/"), Some(home)).ok()?,
        (false, _) if Path::new(entry).is_absolute() => crate::sandbox::normalize(Path::new(entry)),
        (false, _) => crate::sandbox::resolve_sandbox_path(entry, bundle_root?, home).ok()?,
    };
    if resolved == Path::new("/") {
        return Some("the whole file system".to_owned());
    }
    let home = crate::sandbox::normalize(home?);
    if resolved == home {
        Some("your home directory".to_owned())
    } else if home.starts_with(&resolved) {
        Some(format!("a directory holding your home directory ({})", home.display()))
    } else {
        None
    }
}

fn to_kebab(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('-');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}
