//! docs/ARCHITECTURE.md stays true: every crate of the workspace has a row
//! in its module table, and every module a crate declares in its `lib.rs`
//! (test-only modules aside) is named in that row.

mod common;

/// The `mod` names a `lib.rs` declares, without `test_*` helpers.
fn declared_modules(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let rest = line.strip_prefix("pub mod ").or_else(|| line.strip_prefix("mod "))?;
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            (!name.is_empty() && !name.starts_with("test")).then_some(name)
        })
        .collect()
}

#[test]
fn every_crate_and_module_is_on_the_map() {
    let map = std::fs::read_to_string(common::repo_path("docs/ARCHITECTURE.md")).unwrap_or_else(|e| panic!("{e}"));
    let mut missing = Vec::new();
    let crates = std::fs::read_dir(common::repo_path("crates")).unwrap_or_else(|e| panic!("{e}"));
    for entry in crates.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let prefix = format!("| `{name}` |");
        let Some(row) = map.lines().find(|line| line.starts_with(&prefix)) else {
            missing.push(format!("{name}: no row in the module table"));
            continue;
        };
        let Ok(lib) = std::fs::read_to_string(entry.path().join("src/lib.rs")) else { continue };
        for module in declared_modules(&lib) {
            if !row.contains(&format!("`{module}`")) {
                missing.push(format!("{name}: module `{module}` is not in its row"));
            }
        }
    }
    assert!(missing.is_empty(), "docs/ARCHITECTURE.md's module table is out of date:\n{}", missing.join("\n"));
}

#[test]
fn declared_modules_are_read_from_lib_rs() {
    let lib = "//! doc\npub mod agent;\nmod inbox;\n#[cfg(test)]\nmod test_support;\npub use agent::Agent;\n";
    assert_eq!(declared_modules(lib), ["agent", "inbox"]);
}
