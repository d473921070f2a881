//! The bundle's `Package` document (the first document of `goondan.yaml`):
//! `metadata.name`, `spec.version`, `spec.access` and `spec.dependencies`
//! (a list of `{name, version}`), read and edited line by line as the
//! original does, so comments, order and every other document keep their
//! text. Only the lines of the dependency touched change.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{PackageError, io_at};

/// One `spec.dependencies` entry.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Dependency {
    pub name: String,
    pub range: String,
}

/// What the `Package` document says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackageMeta {
    pub name: Option<String>,
    pub version: Option<String>,
    pub access: Option<String>,
    pub dependencies: Vec<Dependency>,
}

/// `goondan.yaml`'s text (line ends normalised to `\n`).
#[derive(Debug, Clone)]
pub struct Manifest {
    pub path: PathBuf,
    pub text: String,
}

fn unquote(value: &str) -> String {
    let value = value.trim();
    // A trailing comment is no part of the value.
    let value = if value.starts_with(['"', '\'']) { value } else { value.split(" #").next().unwrap_or(value).trim() };
    value.trim_matches(|c| c == '"' || c == '\'').to_owned()
}

fn quote(value: &str) -> String {
    format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

fn is_blank(line: &str) -> bool {
    let trimmed = line.trim();
    trimmed.is_empty() || trimmed.starts_with('#')
}

/// The first document's line range.
fn first_document(lines: &[&str]) -> (usize, usize) {
    let mut start = 0;
    while start < lines.len() && (is_blank(lines[start]) || lines[start].trim_end() == "---") {
        start += 1;
    }
    let end = (start..lines.len()).find(|&i| lines[i].trim_end() == "---").unwrap_or(lines.len());
    (start, end)
}

#[derive(Debug, Default)]
struct Entry {
    name: String,
    name_line: usize,
    version_line: Option<usize>,
    range: Option<String>,
}

/// Where things are in the document's lines.
#[derive(Debug, Default)]
struct Layout {
    is_package: bool,
    spec: Option<usize>,
    /// The line after the spec block's last content line.
    spec_end: usize,
    deps: Option<usize>,
    /// The line after the dependencies block's last content line.
    deps_end: usize,
    item_indent: Option<usize>,
    entries: Vec<Entry>,
    meta: PackageMeta,
}

fn layout(lines: &[&str], (start, end): (usize, usize)) -> Layout {
    let mut out = Layout { spec_end: end, ..Layout::default() };
    let mut section = "";
    let mut deps_indent = 0;
    let mut deps_open = false;
    for (i, line) in lines.iter().enumerate().take(end).skip(start) {
        if is_blank(line) {
            continue;
        }
        let trimmed = line.trim();
        let depth = indent(line);
        if depth == 0 {
            deps_open = false;
            section = trimmed.strip_suffix(':').unwrap_or("");
            if trimmed.starts_with("kind:") && unquote(&trimmed["kind:".len()..]) == "Package" {
                out.is_package = true;
            }
            if section == "spec" {
                out.spec = Some(i);
                out.spec_end = i + 1;
            }
            continue;
        }
        if section == "spec" {
            out.spec_end = i + 1;
        }
        let in_deps = deps_open
            && section == "spec"
            && (depth > deps_indent || (depth == deps_indent && trimmed.starts_with("- ")));
        if in_deps {
            out.deps_end = i + 1;
            let item = trimmed.strip_prefix("- ");
            if item.is_some() {
                out.item_indent.get_or_insert(depth);
            }
            let field = item.unwrap_or(trimmed);
            if let Some(name) = field.strip_prefix("name:") {
                if item.is_some() || out.entries.is_empty() {
                    out.entries.push(Entry { name: unquote(name), name_line: i, ..Entry::default() });
                } else if let Some(last) = out.entries.last_mut() {
                    last.name = unquote(name);
                    last.name_line = i;
                }
            } else if let Some(range) = field.strip_prefix("version:") {
                if item.is_some() {
                    out.entries.push(Entry::default());
                }
                if let Some(last) = out.entries.last_mut() {
                    last.version_line = Some(i);
                    last.range = Some(unquote(range));
                }
            }
            continue;
        }
        // The block ended: later keys of spec are not dependencies.
        deps_open = false;
        match section {
            "metadata" if depth == 2 => {
                if let Some(name) = trimmed.strip_prefix("name:") {
                    out.meta.name = Some(unquote(name));
                }
            }
            "spec" if depth == 2 => {
                if let Some(version) = trimmed.strip_prefix("version:") {
                    out.meta.version = Some(unquote(version));
                } else if let Some(access) = trimmed.strip_prefix("access:") {
                    out.meta.access = Some(unquote(access));
                } else if trimmed.starts_with("dependencies:") {
                    out.deps = Some(i);
                    out.deps_end = i + 1;
                    deps_indent = depth;
                    deps_open = true;
                }
            }
            _ => {}
        }
    }
    out.meta.dependencies = out
        .entries
        .iter()
        .filter(|e| !e.name.is_empty())
        .map(|e| Dependency { name: e.name.clone(), range: e.range.clone().unwrap_or_default() })
        .collect();
    out
}

impl Manifest {
    /// Reads `path`; a file that is not there reads as empty.
    pub fn read(path: &Path) -> Result<Self, PackageError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text.replace("\r\n", "\n"),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(error) => return Err(io_at(path)(error)),
        };
        Ok(Self { path: path.to_path_buf(), text })
    }

    fn lines(&self) -> Vec<&str> {
        self.text.split('\n').collect()
    }

    /// The `Package` document's content; an error when the first document
    /// is none.
    pub fn package(&self) -> Result<PackageMeta, PackageError> {
        let lines = self.lines();
        let found = layout(&lines, first_document(&lines));
        if !found.is_package {
            return Err(PackageError::Manifest {
                path: self.path.clone(),
                message: "no Package document: declare `kind: Package` in the first document".to_owned(),
            });
        }
        for dependency in &found.meta.dependencies {
            super::check_name(&dependency.name)?;
            if !crate::version::is_range(&dependency.range) {
                return Err(PackageError::InvalidVersion {
                    name: dependency.name.clone(),
                    version: dependency.range.clone(),
                    reason: "spec.dependencies wants a semver range".to_owned(),
                });
            }
        }
        Ok(found.meta)
    }

    /// The text with `name: range` among the dependencies (its version
    /// replaced when it is there already), and whether it was added. A
    /// file without a Package document gets one first, named after its
    /// directory (as the original does).
    pub fn with_dependency(&self, name: &str, range: &str) -> (String, bool) {
        let mut lines: Vec<String> = self.lines().into_iter().map(str::to_owned).collect();
        let borrowed: Vec<&str> = lines.iter().map(String::as_str).collect();
        let found = layout(&borrowed, first_document(&borrowed));
        if !found.is_package {
            let doc = format!(
                "apiVersion: goondan.ai/v1\nkind: Package\nmetadata:\n  name: {}\nspec:\n  version: \"0.1.0\"\n",
                quote(&self.default_name())
            );
            let prefixed = Self {
                path: self.path.clone(),
                text: if self.text.trim().is_empty() { doc } else { format!("{doc}---\n{}", self.text) },
            };
            let (text, _) = prefixed.with_dependency(name, range);
            return (text, true);
        }
        if let Some(entry) = found.entries.iter().find(|e| e.name == name) {
            let line = match entry.version_line {
                Some(at) => {
                    let depth = indent(&lines[at]);
                    let dash = if lines[at].trim_start().starts_with("- ") { "- " } else { "" };
                    lines[at] = format!("{}{dash}version: {}", " ".repeat(depth), quote(range));
                    return (lines.join("\n"), false);
                }
                None => entry.name_line + 1,
            };
            let depth = indent(&lines[entry.name_line]) + 2;
            lines.insert(line, format!("{}version: {}", " ".repeat(depth), quote(range)));
            return (lines.join("\n"), false);
        }
        let entry = |item: usize| {
            [
                format!("{}- name: {}", " ".repeat(item), quote(name)),
                format!("{}  version: {}", " ".repeat(item), quote(range)),
            ]
        };
        match (found.spec, found.deps) {
            (_, Some(deps)) => {
                let item = found.item_indent.unwrap_or(4);
                // `dependencies: []` (or `{}`) becomes a block.
                if lines[deps].trim() != "dependencies:" {
                    lines[deps] = "  dependencies:".to_owned();
                }
                let at = found.deps_end.max(deps + 1);
                lines.splice(at..at, entry(item));
            }
            (Some(_), None) => {
                let mut block = vec!["  dependencies:".to_owned()];
                block.extend(entry(4));
                lines.splice(found.spec_end..found.spec_end, block);
            }
            (None, None) => {
                let (_, end) = first_document(&borrowed);
                let mut at = end;
                while at > 0 && lines[at - 1].trim().is_empty() {
                    at -= 1;
                }
                let mut block = vec!["spec:".to_owned(), "  dependencies:".to_owned()];
                block.extend(entry(4));
                lines.splice(at..at, block);
            }
        }
        (lines.join("\n"), true)
    }

    /// The text with the given dependencies' versions replaced; the names
    /// actually changed.
    pub fn with_versions(&self, next: &BTreeMap<String, String>) -> (String, Vec<String>) {
        let mut lines: Vec<String> = self.lines().into_iter().map(str::to_owned).collect();
        let borrowed: Vec<&str> = lines.iter().map(String::as_str).collect();
        let found = layout(&borrowed, first_document(&borrowed));
        let mut changed = Vec::new();
        for entry in &found.entries {
            if let (Some(at), Some(range)) = (entry.version_line, next.get(&entry.name)) {
                let depth = indent(&lines[at]);
                let dash = if lines[at].trim_start().starts_with("- ") { "- " } else { "" };
                lines[at] = format!("{}{dash}version: {}", " ".repeat(depth), quote(range));
                changed.push(entry.name.clone());
            }
        }
        (lines.join("\n"), changed)
    }

    /// The original's default package name: the directory's name, lower
    /// case, other characters as `-`.
    fn default_name(&self) -> String {
        let dir = self.path.parent().and_then(Path::file_name).and_then(|n| n.to_str()).unwrap_or("");
        let mut name = String::new();
        for c in dir.to_lowercase().chars() {
            let c = if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' { c } else { '-' };
            if !(c == '-' && name.ends_with('-')) {
                name.push(c);
            }
        }
        let name = name.trim_matches('-');
        if name.is_empty() { "goondan-package".to_owned() } else { name.to_owned() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(text: &str) -> Manifest {
        Manifest { path: PathBuf::from("/p/my bundle/goondan.yaml"), text: text.to_owned() }
    }

    const DOC: &str = "apiVersion: goondan.ai/v1\nkind: Package\n# keep me\nmetadata:\n  name: \"@me/app\"\nspec:\n  version: \"1.0.0\"\n  dependencies:\n    - name: \"@a/one\"\n      version: \"^1.0.0\"\n  access: public\n---\nkind: Agent\nmetadata:\n  name: x\n";

    #[test]
    fn reads_the_package_document() {
        let meta = manifest(DOC).package().ok();
        let meta = meta.unwrap_or_default();
        assert_eq!(meta.name.as_deref(), Some("@me/app"));
        assert_eq!(meta.version.as_deref(), Some("1.0.0"));
        assert_eq!(meta.access.as_deref(), Some("public"));
        assert_eq!(meta.dependencies, vec![Dependency { name: "@a/one".into(), range: "^1.0.0".into() }]);
    }

    #[test]
    fn adding_touches_only_the_dependency_lines() {
        let (text, added) = manifest(DOC).with_dependency("@b/two", "^2.0.0");
        assert!(added);
        assert_eq!(
            text,
            DOC.replace(
                "      version: \"^1.0.0\"\n",
                "      version: \"^1.0.0\"\n    - name: \"@b/two\"\n      version: \"^2.0.0\"\n"
            )
        );
        let (again, added) = manifest(&text).with_dependency("@b/two", "2.1.0");
        assert!(!added);
        assert_eq!(again, text.replace("\"^2.0.0\"", "\"2.1.0\""));
        let (fresh, _) = manifest("kind: Package\nmetadata:\n  name: a\nspec:\n  version: \"1.0.0\"\n")
            .with_dependency("@b/two", "^2.0.0");
        assert_eq!(
            fresh,
            "kind: Package\nmetadata:\n  name: a\nspec:\n  version: \"1.0.0\"\n  dependencies:\n    - name: \"@b/two\"\n      version: \"^2.0.0\"\n"
        );
        let meta = manifest(&fresh).package().unwrap_or_default();
        assert_eq!(meta.dependencies.len(), 1);
    }

    #[test]
    fn a_bundle_without_package_gets_one() {
        let (text, added) = manifest("kind: Agent\nmetadata:\n  name: x\n").with_dependency("@b/two", "^2.0.0");
        assert!(added);
        assert!(
            text.starts_with("apiVersion: goondan.ai/v1\nkind: Package\nmetadata:\n  name: \"my-bundle\""),
            "{text}"
        );
        assert!(text.ends_with("---\nkind: Agent\nmetadata:\n  name: x\n"), "{text}");
        assert_eq!(manifest(&text).package().unwrap_or_default().dependencies.len(), 1);
    }

    #[test]
    fn versions_are_replaced_in_place() {
        let next = BTreeMap::from([("@a/one".to_owned(), "^1.5.0".to_owned())]);
        let (text, changed) = manifest(DOC).with_versions(&next);
        assert_eq!(changed, vec!["@a/one".to_owned()]);
        assert_eq!(text, DOC.replace("\"^1.0.0\"", "\"^1.5.0\""));
    }
}
