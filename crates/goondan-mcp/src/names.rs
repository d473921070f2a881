//! Catalog names for MCP tools: `SERVER__TOOL`, held to the tool-name rules
//! of [`goondan_core::naming`].
//!
//! MCP allows tool names the catalog does not (dots, slashes, `__`), and
//! server names are whatever the config's keys are, so both parts are
//! sanitized deterministically: characters outside `[A-Za-z0-9_-]` become
//! `_`, runs of `_` collapse to one (a part may not hold the `__`
//! separator), and the server part is trimmed to start and end with a letter
//! or digit and to the resource-name length limit. Two tools that land on
//! the same name keep the first one's name and give the next ones a numeric
//! suffix, and every rename and collision is reported so the operator sees
//! what the model will see.

use std::collections::HashSet;

use goondan_core::naming::{self, ExportNameCheck, MAX_RESOURCE_NAME_LEN};

/// A name change worth telling the operator about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameNotice {
    /// The name had characters the catalog does not allow.
    Sanitized {
        /// The tool as the server names it.
        original: String,
        /// The catalog name it got.
        name: String,
    },
    /// The (sanitized) name was taken; the tool got a suffix.
    Collision {
        /// The tool as the server names it.
        original: String,
        /// The name it would have had.
        wanted: String,
        /// The catalog name it got.
        name: String,
    },
}

impl std::fmt::Display for NameNotice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Sanitized { original, name } => {
                write!(f, "tool '{original}' is offered as '{name}' (tool names allow only A-Z, a-z, 0-9, '_' and '-')")
            }
            Self::Collision { original, wanted, name } => {
                write!(f, "tool '{original}' would be '{wanted}', which another tool has; it is offered as '{name}'")
            }
        }
    }
}

/// Replaces disallowed characters with `_` and collapses `_` runs.
fn clean(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for c in raw.chars() {
        let c = if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' };
        if c == '_' && out.ends_with('_') {
            continue;
        }
        out.push(c);
    }
    out
}

/// The resource part for a server name: valid under
/// [`naming::check_resource_name`] for tools.
pub fn server_part(server: &str) -> String {
    let cleaned = clean(server);
    let mut part: String = cleaned.trim_matches(|c: char| !c.is_ascii_alphanumeric()).to_owned();
    if part.len() > MAX_RESOURCE_NAME_LEN {
        part.truncate(MAX_RESOURCE_NAME_LEN);
        part = part.trim_end_matches(|c: char| !c.is_ascii_alphanumeric()).to_owned();
    }
    if part.is_empty() { "mcp".to_owned() } else { part }
}

/// The export part for a tool name: accepted by [`naming::check_export_name`]
/// (uppercase letters are kept: the naming rules only warn about them, and
/// the model should see the name the server documents).
pub fn tool_part(tool: &str) -> String {
    // A leading or trailing `_` would run into the separator (`s___x`).
    let cleaned = clean(tool);
    let part = cleaned.trim_matches('_');
    if part.is_empty() { "tool".to_owned() } else { part.to_owned() }
}

/// Assigns catalog names to one server's tools, avoiding `taken` (names
/// already in the registry or given to earlier servers) and adding what it
/// assigns to it. Returns the names in the order of `tools` and what to
/// report.
pub fn assign_names(server: &str, tools: &[&str], taken: &mut HashSet<String>) -> (Vec<String>, Vec<NameNotice>) {
    let resource = server_part(server);
    let mut names = Vec::with_capacity(tools.len());
    let mut notices = Vec::new();
    for &original in tools {
        let wanted = naming::build_tool_name(&resource, &tool_part(original));
        let mut name = wanted.clone();
        let mut suffix = 2_u32;
        while taken.contains(&name) {
            name = format!("{wanted}_{suffix}");
            suffix += 1;
        }
        if name != wanted {
            notices.push(NameNotice::Collision { original: original.to_owned(), wanted, name: name.clone() });
        } else if tool_part(original) != original {
            notices.push(NameNotice::Sanitized { original: original.to_owned(), name: name.clone() });
        }
        debug_assert!(naming::parse_tool_name(&name).is_some());
        debug_assert!(matches!(
            naming::parse_tool_name(&name).map(|parts| naming::check_export_name(parts.export)),
            Some(ExportNameCheck::Valid | ExportNameCheck::MixedCase)
        ));
        taken.insert(name.clone());
        names.push(name);
    }
    (names, notices)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_names_pass_through() {
        let mut taken = HashSet::new();
        let (names, notices) = assign_names("everything", &["echo", "get-sum", "getTinyImage"], &mut taken);
        assert_eq!(names, ["everything__echo", "everything__get-sum", "everything__getTinyImage"]);
        assert!(notices.is_empty());
    }

    #[test]
    fn invalid_characters_are_mapped_and_reported() {
        let mut taken = HashSet::new();
        let (names, notices) = assign_names("my.server", &["files/read", "a__b", "__", "ünï"], &mut taken);
        assert_eq!(names, ["my_server__files_read", "my_server__a_b", "my_server__tool", "my_server__n"]);
        assert_eq!(notices.len(), 4);
        assert_eq!(
            notices[0].to_string(),
            "tool 'files/read' is offered as 'my_server__files_read' (tool names allow only A-Z, a-z, 0-9, '_' and '-')"
        );
        for name in &names {
            let parts = naming::parse_tool_name(name).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(naming::check_resource_name(parts.resource, true), Ok(()));
            assert_eq!(naming::check_export_name(parts.export), ExportNameCheck::Valid);
        }
    }

    #[test]
    fn collisions_get_a_deterministic_suffix() {
        let mut taken = HashSet::from(["s__a".to_owned()]);
        let (names, notices) = assign_names("s", &["a", "a.b", "a/b", "a"], &mut taken);
        assert_eq!(names, ["s__a_2", "s__a_b", "s__a_b_2", "s__a_3"]);
        assert_eq!(
            notices[0],
            NameNotice::Collision { original: "a".into(), wanted: "s__a".into(), name: "s__a_2".into() }
        );
        assert_eq!(notices.len(), 4);
    }

    #[test]
    fn server_parts_are_valid_resource_names() {
        for raw in ["-x-", "", "...", "a__b", &"y".repeat(80), "x.y"] {
            let part = server_part(raw);
            assert_eq!(naming::check_resource_name(&part, true), Ok(()), "{raw:?} -> {part:?}");
        }
        assert_eq!(server_part("-x-"), "x");
        assert_eq!(server_part("..."), "mcp");
    }
}
