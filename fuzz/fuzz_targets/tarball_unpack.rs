//! Arbitrary bytes as the tar stream of a package tarball (gzipped here, so
//! the fuzzer works on the tar format rather than on gzip's checksums) →
//! `goondan_registry::tarball::unpack` with its own integrity: never
//! panics, and whatever the entries (absolute paths, `..`, links, devices),
//! nothing is written outside the destination. A refused tarball leaves no
//! destination and no temporary directory behind.

#![no_main]

use std::io::Write as _;
use std::path::Path;

use goondan_registry::tarball::{Unpacked, integrity, unpack};
use libfuzzer_sys::fuzz_target;

/// Every path under `dir`, without following links.
fn walk(dir: &Path, found: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        found.push(path.clone());
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&path, found);
        }
    }
}

fuzz_target!(|tar: &[u8]| {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    if encoder.write_all(tar).is_err() {
        return;
    }
    let Ok(gzipped) = encoder.finish() else { return };
    let sandbox = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(error) => panic!("no temp dir: {error}"),
    };
    // Deep in the sandbox, so that an entry climbing out with `..` still
    // lands where the walk below sees it.
    let dest = sandbox.path().join("a/b/c/d/e/f/g/h/packages/pkg/1.0.0");
    let outcome = unpack(&gzipped, &integrity(&gzipped), &dest);

    let mut found = Vec::new();
    walk(sandbox.path(), &mut found);
    match outcome {
        Ok(Unpacked::Created) => {
            for path in &found {
                assert!(
                    path.starts_with(&dest) || dest.starts_with(path),
                    "{} was written outside the destination",
                    path.display()
                );
                // A link that was kept leads inside the package.
                if path.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink())
                    && let Ok(target) = std::fs::canonicalize(path)
                    && let Ok(root) = std::fs::canonicalize(&dest)
                {
                    assert!(target.starts_with(&root), "{} leads outside: {}", path.display(), target.display());
                }
            }
        }
        Ok(Unpacked::AlreadyPresent) => panic!("a fresh destination was found present"),
        Err(_) => {
            // Only the parents made for it may remain: no destination, no temporary copy.
            for path in &found {
                assert!(dest.starts_with(path), "a refused tarball left {}", path.display());
            }
        }
    }
});
