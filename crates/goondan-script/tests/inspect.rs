//! `ScriptHost::inspect` with a real JavaScript runtime over the fixture
//! bundle `tests/fixtures/script-missing-export` (and `script-tools` for the
//! default-export shape). Each test skips with a printed reason when no
//! runtime is found, unless `GOONDAN_REQUIRE_JS=1`.

mod common;

use std::path::{Path, PathBuf};

use common::runtime_or_skip;
use goondan_core::codes::{E_SCRIPT_MODULE, E_SCRIPT_RUNTIME_MISSING};
use goondan_script::ScriptHost;

fn module(fixture: &str, file: &str) -> PathBuf {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures").join(fixture).join("tools").join(file);
    std::path::absolute(&path).unwrap_or_else(|e| panic!("absolute {}: {e}", path.display()))
}

#[tokio::test]
async fn inspect_lists_the_handler_functions_of_both_module_shapes() {
    let Some(runtime) = runtime_or_skip("inspect") else { return };
    let host = ScriptHost::with_runtime(runtime);
    let names = host.inspect(&module("script-missing-export", "partial.ts")).await.unwrap_or_else(|e| panic!("{e:?}"));
    // `notes` is not a function, so it is no handler.
    assert_eq!(names, ["present"]);
    let names = host.inspect(&module("script-tools", "shaped.ts")).await.unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(names, ["ping"]);
}

#[tokio::test]
async fn inspect_reports_a_module_that_does_not_load() {
    let Some(runtime) = runtime_or_skip("inspect broken") else { return };
    let host = ScriptHost::with_runtime(runtime);
    let broken = module("script-missing-export", "broken.ts");
    let failure = host.inspect(&broken).await.err().unwrap_or_else(|| panic!("broken.ts loaded"));
    assert_eq!(failure.code.as_deref(), Some(E_SCRIPT_MODULE), "{failure:?}");
    assert!(failure.message.contains("broken.ts"), "{}", failure.message);

    let missing = module("script-missing-export", "nowhere.ts");
    let failure = host.inspect(&missing).await.err().unwrap_or_else(|| panic!("nowhere.ts loaded"));
    assert_eq!(failure.code.as_deref(), Some(E_SCRIPT_MODULE), "{failure:?}");
    assert!(failure.message.contains("nowhere.ts"), "{}", failure.message);

    // The host survives both: a good module still inspects.
    let names = host.inspect(&module("script-missing-export", "partial.ts")).await.unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(names, ["present"]);
}

#[tokio::test]
async fn inspect_without_a_runtime_says_so() {
    let host = ScriptHost::new(std::sync::Arc::new(|name: &str| match name {
        "GOONDAN_JS_RUNTIME" => Some("/nonexistent/js-runtime".to_owned()),
        "PATH" => Some("/nonexistent".to_owned()),
        _ => None,
    }));
    let failure = host
        .inspect(&module("script-missing-export", "partial.ts"))
        .await
        .err()
        .unwrap_or_else(|| panic!("inspected without a runtime"));
    assert_eq!(failure.code.as_deref(), Some(E_SCRIPT_RUNTIME_MISSING), "{failure:?}");
}
