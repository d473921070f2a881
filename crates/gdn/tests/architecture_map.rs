//! docs/ARCHITECTURE.md stays true, in both directions:
//!
//! - code → map: every crate of the workspace has a section (`### \`name\``
//!   under "## Crates"), and every module its `lib.rs` (for `gdn`, its
//!   `main.rs`) declares is on that section's "Modules:" line;
//! - map → code: every module on a "Modules:" line exists, every crate
//!   section names a crate, every `crates/…` path the map names exists, and
//!   every Rust path it names (`goondan_x::module…`, `gdn::module`) starts
//!   with a crate and a module (or a name its root defines) that exist;
//! - each section's "Depends on:" line is exactly that crate's rule in
//!   `crate_rules.rs` (the rule `cargo metadata` is checked against).

mod common;

use std::collections::{BTreeMap, BTreeSet};

/// The `mod` names a `lib.rs`/`main.rs` declares, without `test_*` helpers.
fn declared_modules(source: &str) -> Vec<String> {
    source
        .lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let rest = line
                .strip_prefix("pub mod ")
                .or_else(|| line.strip_prefix("pub(crate) mod "))
                .or_else(|| line.strip_prefix("mod "))?;
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            (!name.is_empty() && !name.starts_with("test")).then_some(name)
        })
        .collect()
}

/// The names between backticks on one line.
fn quoted(line: &str) -> Vec<String> {
    line.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

/// One crate's section of the map.
#[derive(Debug, Default)]
struct Section {
    depends_on: Option<BTreeSet<String>>,
    modules: Option<BTreeSet<String>>,
}

/// The sections under "## Crates", by crate name.
fn sections(map: &str) -> BTreeMap<String, Section> {
    let mut sections = BTreeMap::new();
    let mut in_crates = false;
    let mut current: Option<String> = None;
    for line in map.lines() {
        if line.starts_with("## ") {
            in_crates = line.trim() == "## Crates";
            current = None;
            continue;
        }
        if !in_crates {
            continue;
        }
        if let Some(rest) = line.strip_prefix("### ") {
            let name = quoted(rest).into_iter().next().unwrap_or_else(|| rest.trim().to_owned());
            sections.insert(name.clone(), Section::default());
            current = Some(name);
            continue;
        }
        let Some(section) = current.as_ref().and_then(|name| sections.get_mut(name)) else { continue };
        if let Some(rest) = line.strip_prefix("- Depends on:") {
            section.depends_on = Some(quoted(rest).into_iter().collect());
        } else if let Some(rest) = line.strip_prefix("- Modules:") {
            section.modules = Some(quoted(rest).into_iter().collect());
        }
    }
    sections
}

/// Each crate's rule, read from `crate_rules.rs`'s `RULES` table.
fn rules() -> BTreeMap<String, BTreeSet<String>> {
    let source =
        std::fs::read_to_string(common::repo_path("crates/gdn/tests/crate_rules.rs")).unwrap_or_else(|e| panic!("{e}"));
    let table_start = source.find("const RULES").unwrap_or_else(|| panic!("no RULES in crate_rules.rs"));
    let table_end = table_start + source[table_start..].find("];").unwrap_or_else(|| panic!("RULES not closed"));
    let table = &source[table_start..table_end];
    // Past the type (`&[(&str, &[&str])]`), to the entries.
    let table = table.split_once("= &[").map_or(table, |(_, entries)| entries);
    let mut rules = BTreeMap::new();
    // Each entry is `("name", &[ "dep", … ])`, on one line or several: the
    // name is the last string before a `&[`, the rule the strings up to its `]`.
    let mut before = &table[..0];
    for (index, chunk) in table.split("&[").enumerate() {
        if index > 0 {
            let name = before.rsplit('"').nth(1).unwrap_or_default().to_owned();
            let list = chunk.split(']').next().unwrap_or_default();
            let deps = list.split('"').skip(1).step_by(2).map(str::to_owned).collect();
            rules.insert(name, deps);
        }
        before = chunk.split_once(']').map_or(chunk, |(_, rest)| rest);
    }
    rules
}

fn crate_dirs() -> BTreeMap<String, std::path::PathBuf> {
    std::fs::read_dir(common::repo_path("crates"))
        .unwrap_or_else(|e| panic!("{e}"))
        .flatten()
        .map(|entry| (entry.file_name().to_string_lossy().into_owned(), entry.path()))
        .collect()
}

/// The crate root's source: `lib.rs`, else `main.rs`.
fn root_source(dir: &std::path::Path) -> String {
    std::fs::read_to_string(dir.join("src/lib.rs"))
        .or_else(|_| std::fs::read_to_string(dir.join("src/main.rs")))
        .unwrap_or_default()
}

fn map() -> String {
    std::fs::read_to_string(common::repo_path("docs/ARCHITECTURE.md")).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn every_crate_and_module_is_on_the_map() {
    let sections = sections(&map());
    let mut missing = Vec::new();
    for (name, dir) in crate_dirs() {
        let Some(section) = sections.get(&name) else {
            missing.push(format!("{name}: no section under \"## Crates\""));
            continue;
        };
        let Some(listed) = &section.modules else {
            missing.push(format!("{name}: no \"- Modules:\" line"));
            continue;
        };
        for module in declared_modules(&root_source(&dir)) {
            if !listed.contains(&module) {
                missing.push(format!("{name}: module `{module}` is not on its Modules line"));
            }
        }
    }
    assert!(missing.is_empty(), "docs/ARCHITECTURE.md misses parts of the code:\n{}", missing.join("\n"));
}

#[test]
fn everything_the_map_names_exists() {
    let map = map();
    let dirs = crate_dirs();
    let mut wrong = Vec::new();
    for (name, section) in sections(&map) {
        let Some(dir) = dirs.get(&name) else {
            wrong.push(format!("section `{name}`: no such crate"));
            continue;
        };
        let declared: BTreeSet<String> = declared_modules(&root_source(dir)).into_iter().collect();
        for module in section.modules.iter().flatten() {
            if !declared.contains(module) {
                wrong.push(format!("{name}: module `{module}` on its Modules line is not declared"));
            }
        }
    }
    for name in map.lines().flat_map(quoted) {
        // Files: `crates/…` as written (a trailing `/` for a folder).
        if name.starts_with("crates/") && !name.contains(' ') && !name.contains('*') {
            let path = name.split(':').next().unwrap_or(&name).trim_end_matches('/');
            if !common::repo_path(path).exists() {
                wrong.push(format!("`{name}`: no such file"));
            }
        }
        // Rust paths: a crate and its first segment.
        let mut parts = name.splitn(2, "::");
        let (Some(krate), Some(rest)) = (parts.next(), parts.next()) else { continue };
        let dir_name = krate.replace('_', "-");
        if !(krate.starts_with("goondan_") || krate == "gdn") || name.contains(' ') && !name.contains('{') {
            continue;
        }
        let Some(dir) = dirs.get(&dir_name) else {
            wrong.push(format!("`{name}`: no crate {dir_name}"));
            continue;
        };
        let root = root_source(dir);
        let declared: BTreeSet<String> = declared_modules(&root).into_iter().collect();
        let firsts: Vec<String> = match rest.strip_prefix('{') {
            Some(group) => group.trim_end_matches('}').split(',').map(|s| s.trim().to_owned()).collect(),
            None => vec![rest.split("::").next().unwrap_or(rest).to_owned()],
        };
        for first in firsts {
            let first: String = first.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if first.is_empty() || declared.contains(&first) {
                continue;
            }
            // A name the crate root defines or re-exports.
            if !root.contains(&first) {
                wrong.push(format!("`{name}`: {dir_name} has no module or root item `{first}`"));
            }
        }
    }
    assert!(wrong.is_empty(), "docs/ARCHITECTURE.md names what the code does not have:\n{}", wrong.join("\n"));
}

#[test]
fn each_crates_depends_on_line_is_its_rule() {
    let sections = sections(&map());
    let rules = rules();
    assert!(rules.len() >= 10, "crate_rules.rs's RULES table was not read: {rules:?}");
    let mut wrong = Vec::new();
    for (name, rule) in &rules {
        let Some(section) = sections.get(name) else {
            wrong.push(format!("{name}: has a rule but no section"));
            continue;
        };
        match &section.depends_on {
            None => wrong.push(format!("{name}: no \"- Depends on:\" line")),
            Some(listed) if listed != rule => {
                wrong.push(format!("{name}: the map says {listed:?}, its rule says {rule:?}"));
            }
            Some(_) => {}
        }
    }
    for name in sections.keys() {
        if !rules.contains_key(name) {
            wrong.push(format!("{name}: a section but no rule in crate_rules.rs"));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/ARCHITECTURE.md's dependency lines differ from crate_rules.rs:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_map_is_read_as_written() {
    let lib = "//! doc\npub mod agent;\nmod inbox;\n#[cfg(test)]\nmod test_support;\npub use agent::Agent;\n";
    assert_eq!(declared_modules(lib), ["agent", "inbox"]);
    let map = "## Crates\n\n### `a-b`\n\ntext\n\n- Depends on: `c`, `d`.\n- Modules: `x`, `y`\n\n## Other\n### `z`\n";
    let sections = sections(map);
    assert_eq!(sections.len(), 1);
    let section = &sections["a-b"];
    assert_eq!(section.depends_on.as_ref().map(|s| s.len()), Some(2));
    assert_eq!(
        section.modules.as_ref().map(|s| s.iter().cloned().collect::<Vec<_>>()),
        Some(vec!["x".to_owned(), "y".to_owned()])
    );
}
