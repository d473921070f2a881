//! Tool names exposed to models: `{resource}__{export}` (spec 002 §3).

/// The separator between a Tool resource's name and an export name.
pub const TOOL_NAME_SEPARATOR: &str = "__";

/// A full tool name split into its parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolNameParts<'a> {
    /// The Tool resource's `metadata.name`.
    pub resource: &'a str,
    /// The export's `name`.
    pub export: &'a str,
}

/// Joins a resource name and an export name: `bash` + `exec` → `bash__exec`.
pub fn build_tool_name(resource: &str, export: &str) -> String {
    let mut name = String::with_capacity(resource.len() + 2 + export.len());
    name.push_str(resource);
    name.push_str(TOOL_NAME_SEPARATOR);
    name.push_str(export);
    name
}

/// Splits a full tool name at its first `__`.
///
/// Returns `None` when there is no separator, when either side is empty
/// (`__x`, `x__`), or when the export part holds another `__` (`a__b__c`),
/// because neither part may contain the separator (spec 002 §3.2 rule 3).
pub fn parse_tool_name(full_name: &str) -> Option<ToolNameParts<'_>> {
    let index = full_name.find(TOOL_NAME_SEPARATOR)?;
    let resource = &full_name[..index];
    let export = &full_name[index + TOOL_NAME_SEPARATOR.len()..];
    if resource.is_empty() || export.is_empty() || export.contains(TOOL_NAME_SEPARATOR) {
        return None;
    }
    Some(ToolNameParts { resource, export })
}

/// How an export name measures up to spec 002 §4.2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExportNameCheck {
    /// Lowercase letters, digits, `_` and `-` only.
    Valid,
    /// Valid but for uppercase letters; the original's own built-ins
    /// (`setChatAction`) do this, so it is a warning, not an error.
    MixedCase,
    /// Empty.
    Empty,
    /// Holds the `__` separator.
    ContainsSeparator,
    /// Holds a character outside letters, digits, `_` and `-`.
    InvalidCharacter(char),
}

/// Checks an export name against spec 002 §4.2.
pub fn check_export_name(name: &str) -> ExportNameCheck {
    if name.is_empty() {
        return ExportNameCheck::Empty;
    }
    if name.contains(TOOL_NAME_SEPARATOR) {
        return ExportNameCheck::ContainsSeparator;
    }
    let mut mixed_case = false;
    for c in name.chars() {
        match c {
            'a'..='z' | '0'..='9' | '_' | '-' => {}
            'A'..='Z' => mixed_case = true,
            other => return ExportNameCheck::InvalidCharacter(other),
        }
    }
    if mixed_case { ExportNameCheck::MixedCase } else { ExportNameCheck::Valid }
}

/// Why a resource name is not acceptable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceNameProblem {
    /// Empty.
    Empty,
    /// Longer than [`MAX_RESOURCE_NAME_LEN`].
    TooLong,
    /// Does not start and end with a letter or digit.
    BadEdge,
    /// Holds a character outside letters, digits, `-`, `_` and `.`.
    InvalidCharacter(char),
    /// Holds the `__` separator.
    ContainsSeparator,
}

/// The longest resource name accepted.
pub const MAX_RESOURCE_NAME_LEN: usize = 63;

/// Checks a resource `metadata.name` (all kinds but Package).
///
/// Names are 1–63 characters of ASCII letters, digits, `-`, `_` and `.`,
/// starting and ending with a letter or digit. Tool names additionally may not
/// contain `.` or `__`, because they become part of the function names models
/// see, which providers restrict to `[A-Za-z0-9_-]`.
pub fn check_resource_name(name: &str, is_tool: bool) -> Result<(), ResourceNameProblem> {
    if name.is_empty() {
        return Err(ResourceNameProblem::Empty);
    }
    if name.len() > MAX_RESOURCE_NAME_LEN {
        return Err(ResourceNameProblem::TooLong);
    }
    for c in name.chars() {
        let allowed = c.is_ascii_alphanumeric() || c == '-' || c == '_' || (c == '.' && !is_tool);
        if !allowed {
            return Err(ResourceNameProblem::InvalidCharacter(c));
        }
    }
    let first_ok = name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
    let last_ok = name.chars().last().is_some_and(|c| c.is_ascii_alphanumeric());
    if !first_ok || !last_ok {
        return Err(ResourceNameProblem::BadEdge);
    }
    if is_tool && name.contains(TOOL_NAME_SEPARATOR) {
        return Err(ResourceNameProblem::ContainsSeparator);
    }
    Ok(())
}

/// Checks a Package name: an npm-style name, optionally scoped (`@goondan/base`).
pub fn is_valid_package_name(name: &str) -> bool {
    fn part_ok(part: &str) -> bool {
        !part.is_empty()
            && part.len() <= 214
            && part.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '_' | '.'))
            && !part.starts_with('.')
            && !part.starts_with('_')
    }
    match name.strip_prefix('@') {
        Some(scoped) => match scoped.split_once('/') {
            Some((scope, rest)) => part_ok(scope) && part_ok(rest),
            None => false,
        },
        None => part_ok(name),
    }
}

/// The candidate closest to `text` (a typo's likely intent), compared
/// without case, if close enough: at most a third of the longer one's
/// length apart (at least one edit).
pub fn closest<'a>(text: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let lower = text.to_ascii_lowercase();
    candidates
        .into_iter()
        .map(|candidate| (edit_distance(&lower, &candidate.to_ascii_lowercase()), candidate))
        .filter(|(distance, candidate)| *distance <= (candidate.len().max(text.len()) / 3).max(1))
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// Edit distance over chars, a swap of two neighbours counting as one
/// edit (optimal string alignment): `modle` is one edit from `model`.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let width = b.len() + 1;
    let mut d = vec![0usize; (a.len() + 1) * width];
    for i in 0..=a.len() {
        d[i * width] = i;
    }
    for (j, cell) in d.iter_mut().enumerate().take(width) {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best =
                (d[(i - 1) * width + j] + 1).min(d[i * width + j - 1] + 1).min(d[(i - 1) * width + j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[(i - 2) * width + j - 2] + 1);
            }
            d[i * width + j] = best;
        }
    }
    d[a.len() * width + b.len()]
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_closest_name_is_suggested_only_when_close() {
        let known = ["provider", "model", "apiKey", "endpoint"];
        assert_eq!(closest("provder", known), Some("provider"));
        assert_eq!(closest("apikey", known), Some("apiKey"));
        assert_eq!(closest("temperature", known), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("modle", "model"), 1);
        assert_eq!(closest("modle", known), Some("model"));
    }

    use super::*;

    #[test]
    fn builds_and_parses_round_trip() {
        assert_eq!(build_tool_name("bash", "exec"), "bash__exec");
        assert_eq!(
            parse_tool_name("file-system__read"),
            Some(ToolNameParts { resource: "file-system", export: "read" })
        );
        assert_eq!(parse_tool_name("http-fetch__post"), Some(ToolNameParts { resource: "http-fetch", export: "post" }));
        assert_eq!(
            parse_tool_name("telegram__setChatAction"),
            Some(ToolNameParts { resource: "telegram", export: "setChatAction" })
        );
    }

    #[test]
    fn parse_rejects_malformed_names() {
        assert_eq!(parse_tool_name("bash"), None);
        assert_eq!(parse_tool_name("bash_exec"), None);
        assert_eq!(parse_tool_name("__x"), None);
        assert_eq!(parse_tool_name("x__"), None);
        assert_eq!(parse_tool_name("__"), None);
        assert_eq!(parse_tool_name("a__b__c"), None);
        assert_eq!(parse_tool_name(""), None);
    }

    #[test]
    fn parse_splits_at_first_separator_with_single_underscores_inside() {
        assert_eq!(
            parse_tool_name("my_tool__post_message"),
            Some(ToolNameParts { resource: "my_tool", export: "post_message" })
        );
        // Three underscores: the first `__` wins, the export keeps one `_`.
        assert_eq!(parse_tool_name("a___b"), Some(ToolNameParts { resource: "a", export: "_b" }));
    }

    #[test]
    fn export_name_rules() {
        assert_eq!(check_export_name("exec"), ExportNameCheck::Valid);
        assert_eq!(check_export_name("list-channels"), ExportNameCheck::Valid);
        assert_eq!(check_export_name("post_message"), ExportNameCheck::Valid);
        assert_eq!(check_export_name("setChatAction"), ExportNameCheck::MixedCase);
        assert_eq!(check_export_name(""), ExportNameCheck::Empty);
        assert_eq!(check_export_name("a__b"), ExportNameCheck::ContainsSeparator);
        assert_eq!(check_export_name("a.b"), ExportNameCheck::InvalidCharacter('.'));
        assert_eq!(check_export_name("a b"), ExportNameCheck::InvalidCharacter(' '));
    }

    #[test]
    fn resource_name_rules() {
        assert_eq!(check_resource_name("bash", true), Ok(()));
        assert_eq!(check_resource_name("file-system", true), Ok(()));
        assert_eq!(check_resource_name("myAgent", false), Ok(()));
        assert_eq!(check_resource_name("v1.2", false), Ok(()));
        assert_eq!(check_resource_name("v1.2", true), Err(ResourceNameProblem::InvalidCharacter('.')));
        assert_eq!(check_resource_name("a__b", true), Err(ResourceNameProblem::ContainsSeparator));
        assert_eq!(check_resource_name("a__b", false), Ok(()));
        assert_eq!(check_resource_name("", false), Err(ResourceNameProblem::Empty));
        assert_eq!(check_resource_name("-a", false), Err(ResourceNameProblem::BadEdge));
        assert_eq!(check_resource_name("a_", true), Err(ResourceNameProblem::BadEdge));
        assert_eq!(check_resource_name("a b", false), Err(ResourceNameProblem::InvalidCharacter(' ')));
        assert_eq!(check_resource_name(&"a".repeat(64), false), Err(ResourceNameProblem::TooLong));
    }

    #[test]
    fn package_names() {
        assert!(is_valid_package_name("@goondan/base"));
        assert!(is_valid_package_name("my-swarm"));
        assert!(!is_valid_package_name("@goondan"));
        assert!(!is_valid_package_name("My Swarm"));
        assert!(!is_valid_package_name(""));
    }
}
