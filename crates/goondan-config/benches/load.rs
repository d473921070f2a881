//! Loading a bundle (see "Loading a bundle" in `docs/BENCHMARKS.md`).
//!
//! Run with `cargo bench -p goondan-config --bench load`.
//!
//! These are steady-state figures: divan calls the loader many times in one
//! process, so whatever the loader keeps for the life of the process (the
//! built-in package, compiled schemas) is built once, before the samples.
//! What a fresh agent process pays for its first load is measured with the
//! `load` example (`--cold`) and callgrind; see the docs.

use std::hint::black_box;
use std::path::{Path, PathBuf};

fn main() {
    divan::main();
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `examples/quickstart`: five documents, one local Tool, references into
/// the built-in package.
#[divan::bench]
fn quickstart(bencher: divan::Bencher) {
    let path = workspace().join("examples/quickstart");
    bencher.bench(|| goondan_config::load_bundle(black_box(&path)));
}

/// `tests/fixtures/brain-persona`: the largest test bundle (~350 lines).
#[divan::bench]
fn brain_persona(bencher: divan::Bencher) {
    let path = workspace().join("tests/fixtures/brain-persona");
    bencher.bench(|| goondan_config::load_bundle(black_box(&path)));
}

/// The built-in package's own YAML (23 documents, 37 parameter schemas)
/// through the same loader, as a large bundle without files to check.
#[divan::bench]
fn base_package_text(bencher: divan::Bencher) {
    let text = include_str!("../src/base/goondan.yaml");
    bencher.bench(|| {
        goondan_config::load_from_str(
            black_box(text),
            "@goondan/base",
            None,
            PathBuf::from("@goondan/base/goondan.yaml"),
        )
    });
}
