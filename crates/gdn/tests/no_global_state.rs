//! Invariant 8 of docs/ARCHITECTURE.md: no global mutable state. The only
//! statics in the library and binary sources are lazily built immutable
//! data (`OnceLock`, `LazyLock`) or constants; a `static` holding an atomic,
//! a lock, a cell or declared `mut` fails this test, naming where it is.

use std::path::Path;

mod common;

fn rust_files(dir: &Path, found: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

/// Whether `line` declares a static whose value can change after start-up.
fn mutable_static(line: &str) -> bool {
    let code = line.split("//").next().unwrap_or("").trim_start();
    let declaration = ["static ", "pub static ", "pub(crate) static ", "pub(super) static "]
        .iter()
        .any(|prefix| code.starts_with(prefix));
    const MUTABLE: [&str; 8] =
        ["Atomic", "Mutex", "RwLock", "Cell<", "RefCell", "static mut ", "UnsafeCell", "thread_local"];
    declaration && MUTABLE.iter().any(|word| code.contains(word))
}

#[test]
fn library_and_binary_sources_hold_no_mutable_statics() {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(common::repo_path("crates")).unwrap_or_else(|e| panic!("{e}")).flatten() {
        rust_files(&entry.path().join("src"), &mut files);
    }
    assert!(files.len() > 50, "found only {} source files", files.len());
    let mut offenders = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        // Unit tests may keep counters of their own.
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for (number, line) in code.lines().enumerate() {
            if mutable_static(line) || line.trim_start().starts_with("thread_local!") {
                offenders.push(format!("{}:{}: {}", file.display(), number + 1, line.trim()));
            }
        }
    }
    assert!(offenders.is_empty(), "mutable statics:\n{}", offenders.join("\n"));
}

#[test]
fn the_check_sees_what_it_must_refuse() {
    assert!(mutable_static("static COUNTER: AtomicU64 = AtomicU64::new(0);"));
    assert!(mutable_static("pub(crate) static LOCK: Mutex<Vec<u8>> = Mutex::new(Vec::new());"));
    assert!(!mutable_static("static BASE: OnceLock<Bundle> = OnceLock::new();"));
    assert!(!mutable_static("let reply = HeaderValue::from_static(\"x\");"));
}
