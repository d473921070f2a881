//! The help catalog of error codes: one short entry per code the runtime
//! emits, and the `helpUrl` that points at it (spec 002 §8.3 rule 4).
//!
//! The catalog's one source is `docs/ERRORS.md`, compiled into the binary
//! and read here: each `### CODE` heading starts an entry (its anchor on
//! GitHub is the lowercased code), the first paragraph under it is the
//! one-line meaning, the rest (causes, what to do) follows; a `## ` heading names the
//! group the entries under it belong to. `gdn help CODE` prints an entry,
//! and error results get [`help_url`] of their code. Tests (here and in
//! `crates/gdn/tests/help.rs`) keep the file and the code lists in step.

use std::sync::LazyLock;

/// Where the catalog is published: an entry's URL is this plus
/// `#<code lowercased>`.
pub const ERRORS_URL: &str = "https://github.com/goondan/goondan-rs/blob/main/docs/ERRORS.md";

/// The catalog's text, `docs/ERRORS.md`.
pub const ERRORS_MD: &str = include_str!("../../../docs/ERRORS.md");

/// One code's entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    /// The code, as written in its heading (`E_TOOL_NOT_IN_CATALOG`).
    pub code: &'a str,
    /// The `## ` heading above it (`Tool calls`); empty when there is none.
    pub group: &'a str,
    /// The one-line meaning: the first paragraph under the heading, its
    /// lines joined.
    pub summary: String,
    /// Everything under the heading up to the next one, trimmed.
    pub body: &'a str,
}

impl Entry<'_> {
    /// The entry's address: [`ERRORS_URL`]`#<code lowercased>`.
    pub fn url(&self) -> String {
        url(self.code)
    }
}

/// The address of `code`'s entry, whether or not the catalog has one.
pub fn url(code: &str) -> String {
    format!("{ERRORS_URL}#{}", code.to_ascii_lowercase())
}

/// Reads the entries of a catalog text in the format described above.
/// Headings inside fenced code blocks are text, not headings.
pub fn parse(text: &str) -> Vec<Entry<'_>> {
    let mut entries = Vec::new();
    let mut group = "";
    // The open entry: its code, its group and where its body starts.
    let mut open: Option<(&str, &str, usize)> = None;
    let mut fenced = false;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        let trimmed = line.trim_end();
        if trimmed.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        if let Some(heading) = trimmed.strip_prefix("### ") {
            close(text, open.take(), start, &mut entries);
            open = Some((heading.trim(), group, offset));
        } else if let Some(heading) = trimmed.strip_prefix("## ").or_else(|| trimmed.strip_prefix("# ")) {
            close(text, open.take(), start, &mut entries);
            group = if trimmed.starts_with("## ") { heading.trim() } else { "" };
        }
    }
    close(text, open, text.len(), &mut entries);
    entries
}

/// Ends the open entry (if any) at byte `end` of `text`.
fn close<'a>(text: &'a str, open: Option<(&'a str, &'a str, usize)>, end: usize, entries: &mut Vec<Entry<'a>>) {
    if let Some((code, group, start)) = open {
        let body = text.get(start..end).unwrap_or("").trim();
        let summary: Vec<&str> = body.lines().map(str::trim).take_while(|line| !line.is_empty()).collect();
        let summary = summary.join(" ");
        entries.push(Entry { code, group, summary, body });
    }
}

static ENTRIES: LazyLock<Vec<Entry<'static>>> = LazyLock::new(|| parse(ERRORS_MD));

/// Every entry of the compiled-in catalog, in the order of the file.
pub fn entries() -> &'static [Entry<'static>] {
    &ENTRIES
}

/// The entry of `code` (case-insensitive, surrounding blanks ignored).
pub fn lookup(code: &str) -> Option<&'static Entry<'static>> {
    let code = code.trim();
    entries().iter().find(|entry| entry.code.eq_ignore_ascii_case(code))
}

/// The `helpUrl` of `code`: its entry's address, or `None` for a code the
/// catalog does not have (a tool's own code), which no link would explain.
pub fn help_url(code: &str) -> Option<String> {
    lookup(code).map(Entry::url)
}

/// Whether `code` is written like a code (`E_TOOL`, `AGENT_CRASHED`):
/// an upper-case letter, then upper-case letters, digits and `_`.
pub fn is_code_like(code: &str) -> bool {
    code.starts_with(|c: char| c.is_ascii_uppercase())
        && code.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::codes;

    const SAMPLE: &str = "# Error codes\n\nIntro text.\n\n## Tool calls\n\n### E_ONE\n\nThe first.\n\n- **Causes:** a.\n\
        - **What to do:** b.\n\n### E_TWO\nThe second.\n\n```text\n### NOT_A_HEADING\n```\n## Agents\n\n### AGENT_X\n\nThe third.\n";

    #[test]
    fn entries_are_read_with_group_summary_and_body() {
        let entries = parse(SAMPLE);
        let codes: Vec<&str> = entries.iter().map(|e| e.code).collect();
        assert_eq!(codes, ["E_ONE", "E_TWO", "AGENT_X"]);
        assert_eq!(entries[0].group, "Tool calls");
        assert_eq!(entries[0].summary, "The first.");
        // A meaning wrapped over lines is one line.
        let wrapped = parse("## G\n### E_W\nA meaning\n  wrapped.\n\n- **Causes:** c.\n");
        assert_eq!(wrapped[0].summary, "A meaning wrapped.");
        assert_eq!(entries[0].body, "The first.\n\n- **Causes:** a.\n- **What to do:** b.");
        // A fenced block's `###` line is text of the entry, not an entry.
        assert_eq!(entries[1].summary, "The second.");
        assert!(entries[1].body.contains("### NOT_A_HEADING"), "{:?}", entries[1].body);
        assert_eq!(entries[2].group, "Agents");
        assert_eq!(entries[2].body, "The third.");
    }

    #[test]
    fn text_before_the_first_entry_and_top_headings_belong_to_none() {
        let entries = parse("# Title\n\nsome text\n\n### E_A\nA.\n# Other\n\nnot part of E_A\n");
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].group, "");
        assert_eq!(entries[0].body, "A.");
    }

    #[test]
    fn lookup_ignores_case_and_blanks() {
        let Some(entry) = lookup(" e_tool_not_in_catalog ") else { panic!("no entry for E_TOOL_NOT_IN_CATALOG") };
        assert_eq!(entry.code, codes::E_TOOL_NOT_IN_CATALOG);
        assert!(lookup("E_NO_SUCH_CODE").is_none());
        assert!(lookup("").is_none());
    }

    #[test]
    fn urls_point_at_the_lowercased_anchor() {
        assert_eq!(
            help_url("E_TOOL_TIMEOUT").as_deref(),
            Some("https://github.com/goondan/goondan-rs/blob/main/docs/ERRORS.md#e_tool_timeout")
        );
        assert_eq!(help_url("e_tool_timeout"), help_url("E_TOOL_TIMEOUT"));
        assert_eq!(help_url("E_MY_OWN_TOOL_CODE"), None);
    }

    /// Every tool error code of [`codes::ALL`] has an entry (the other
    /// crates' lists are checked in `crates/gdn/tests/help.rs`).
    #[test]
    fn every_tool_error_code_has_an_entry() {
        let missing: Vec<&str> = codes::ALL.iter().copied().filter(|code| lookup(code).is_none()).collect();
        assert!(missing.is_empty(), "docs/ERRORS.md has no entry for {missing:?}");
    }

    #[test]
    fn the_catalog_is_well_formed() {
        let entries = entries();
        assert!(entries.len() >= codes::ALL.len(), "only {} entries", entries.len());
        let mut seen = HashSet::new();
        for entry in entries {
            assert!(is_code_like(entry.code), "heading '{}' is not a code", entry.code);
            assert!(seen.insert(entry.code), "{} has two entries", entry.code);
            assert!(!entry.group.is_empty(), "{} is under no group", entry.code);
            assert!(
                !entry.summary.is_empty() && !entry.summary.starts_with('-'),
                "{}: no one-line meaning",
                entry.code
            );
            assert!(entry.body.contains("**Causes:**"), "{}: no causes", entry.code);
            assert!(entry.body.contains("**What to do:**"), "{}: nothing to do", entry.code);
        }
    }

    #[test]
    fn code_like_is_upper_snake_case() {
        assert!(is_code_like("E_TOOL"));
        assert!(is_code_like("AGENT_HOP_LIMIT_EXCEEDED"));
        assert!(!is_code_like("e_tool"));
        assert!(!is_code_like("_E"));
        assert!(!is_code_like("Tool calls"));
    }
}
