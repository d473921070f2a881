//! `gdn validate --fix`: the original's repair of documents that have a
//! `kind` and no `apiVersion`. It edits the text, not a re-serialized
//! tree: one `apiVersion: goondan.ai/v1` line goes in before the
//! document's first key, so comments, quoting and layout stay as they were;
//! the edited document is parsed again and kept only if it reads as the old
//! one plus that key. Every file of the bundle is repaired (the original
//! repaired goondan.yaml alone).

use std::path::{Path, PathBuf};

use goondan_core::JsonValue;

/// The apiVersion of every Goondan document.
const API_VERSION: &str = "goondan.ai/v1";

/// A line `--fix` added.
#[derive(Debug, serde::Serialize)]
pub struct Fixed {
    pub file: PathBuf,
    /// 1-based line of the added line in the file as written.
    pub line: usize,
    pub kind: String,
    pub name: Option<String>,
}

/// A document `--fix` should have repaired and left alone, and why.
#[derive(Debug, serde::Serialize)]
pub struct Unfixable {
    pub file: PathBuf,
    /// 1-based line where the document starts.
    pub line: usize,
    pub reason: &'static str,
}

/// What `--fix` did.
#[derive(Debug, Default, serde::Serialize)]
pub struct FixReport {
    pub fixed: Vec<Fixed>,
    pub unfixable: Vec<Unfixable>,
}

/// Repairs the bundle `config` names; files it cannot read or parse are
/// left to the check that follows, which reports them.
pub fn fix_bundle(config: &Path) -> std::io::Result<FixReport> {
    let mut report = FixReport::default();
    for file in goondan_config::bundle_source_files(config) {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        let (fixed, found) = fix_text(&text, &file);
        if !found.fixed.is_empty() {
            std::fs::write(&file, fixed)?;
        }
        report.fixed.extend(found.fixed);
        report.unfixable.extend(found.unfixable);
    }
    Ok(report)
}

/// Whether `line` separates documents (`---`, maybe with a comment).
fn is_separator(line: &str) -> bool {
    let line = line.trim_end();
    line == "---"
        || line
            .strip_prefix("---")
            .is_some_and(|rest| rest.starts_with([' ', '\t']) && rest.trim_start().starts_with('#'))
}

/// `text` with its documents repaired, and what was done.
fn fix_text(text: &str, file: &Path) -> (String, FixReport) {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let newline = if text.contains("\r\n") { "\r\n" } else { "\n" };
    let mut report = FixReport::default();
    let mut out = String::with_capacity(text.len() + 64);
    let mut added = 0;
    let mut start = 0;
    while start <= lines.len() {
        let end = (start..lines.len()).find(|&i| is_separator(lines[i])).unwrap_or(lines.len());
        let segment = &lines[start..end];
        match fix_document(segment, newline) {
            Outcome::Unchanged => out.extend(segment.iter().copied()),
            Outcome::Fixed { insert_at, line, kind, name } => {
                out.extend(segment[..insert_at].iter().copied());
                out.push_str(&line);
                out.extend(segment[insert_at..].iter().copied());
                added += 1;
                report.fixed.push(Fixed { file: file.to_path_buf(), line: start + insert_at + added, kind, name });
            }
            Outcome::Unfixable(reason) => {
                out.extend(segment.iter().copied());
                report.unfixable.push(Unfixable { file: file.to_path_buf(), line: start + 1 + added, reason });
            }
        }
        if end < lines.len() {
            out.push_str(lines[end]);
        }
        start = end + 1;
    }
    (out, report)
}

enum Outcome {
    Unchanged,
    Fixed { insert_at: usize, line: String, kind: String, name: Option<String> },
    Unfixable(&'static str),
}

/// One document's repair: where the apiVersion line goes, if it needs one.
fn fix_document(segment: &[&str], newline: &str) -> Outcome {
    let text: String = segment.concat();
    let Some(value) = parse_one(&text) else { return Outcome::Unchanged };
    let Some(object) = value.as_object() else { return Outcome::Unchanged };
    let Some(kind) = object.get("kind").and_then(JsonValue::as_str).filter(|kind| !kind.trim().is_empty()) else {
        return Outcome::Unchanged;
    };
    if object.contains_key("apiVersion") {
        return Outcome::Unchanged;
    }
    let Some(insert_at) = segment.iter().position(|line| {
        let trimmed = line.trim_start();
        !(trimmed.is_empty() || trimmed.starts_with('#') || trimmed.starts_with('%'))
    }) else {
        return Outcome::Unchanged;
    };
    let first = segment[insert_at];
    let indent = &first[..first.len() - first.trim_start().len()];
    if first.trim_start().starts_with(['{', '[', '-', '&', '!', '?']) {
        return Outcome::Unfixable(
            "the document is not a plain block mapping; add `apiVersion: goondan.ai/v1` by hand",
        );
    }
    let line = format!("{indent}apiVersion: {API_VERSION}{newline}");
    let mut edited = segment[..insert_at].concat();
    edited.push_str(&line);
    edited.push_str(&segment[insert_at..].concat());
    let mut expected = object.clone();
    expected.insert("apiVersion".to_owned(), JsonValue::String(API_VERSION.to_owned()));
    if parse_one(&edited).as_ref().and_then(JsonValue::as_object) != Some(&expected) {
        return Outcome::Unfixable("an added line would change the document; add `apiVersion: goondan.ai/v1` by hand");
    }
    let name =
        object.get("metadata").and_then(|metadata| metadata.get("name")).and_then(JsonValue::as_str).map(str::to_owned);
    Outcome::Fixed { insert_at, line, kind: kind.to_owned(), name }
}

/// The single document of `text`, if it parses as one.
fn parse_one(text: &str) -> Option<JsonValue> {
    let mut documents = goondan_config::yaml::parse_documents(text).ok()?;
    if documents.len() != 1 {
        return None;
    }
    documents.pop().map(|document| document.value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_the_line_and_keeps_everything_else() {
        let text = "# top\napiVersion: goondan.ai/v1\nkind: Model\nmetadata: {name: a}\n---\n# agent\nkind: Agent   # keep\nmetadata:\n  name: b\n--- # x\n  kind: Swarm\n  metadata:\n    name: s\n";
        let (fixed, report) = fix_text(text, Path::new("g.yaml"));
        assert_eq!(
            fixed,
            "# top\napiVersion: goondan.ai/v1\nkind: Model\nmetadata: {name: a}\n---\n# agent\napiVersion: goondan.ai/v1\nkind: Agent   # keep\nmetadata:\n  name: b\n--- # x\n  apiVersion: goondan.ai/v1\n  kind: Swarm\n  metadata:\n    name: s\n"
        );
        let lines: Vec<usize> = report.fixed.iter().map(|f| f.line).collect();
        assert_eq!(lines, [7, 12]);
        let fixed_lines: Vec<&str> = fixed.lines().collect();
        assert!(lines.iter().all(|&l| fixed_lines[l - 1].trim() == "apiVersion: goondan.ai/v1"));
    }

    #[test]
    fn flow_documents_are_reported_not_changed() {
        let text = "{kind: Agent, metadata: {name: a}}\n";
        let (fixed, report) = fix_text(text, Path::new("g.yaml"));
        assert_eq!(fixed, text);
        assert_eq!(report.unfixable.len(), 1);
    }
}
