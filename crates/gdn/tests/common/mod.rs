//! Helpers shared by the `gdn` integration tests.

/// Whether a JavaScript runtime is usable here; with `GOONDAN_REQUIRE_JS=1`
/// (CI) its absence fails the test instead of skipping the script part.
#[allow(clippy::print_stderr)]
pub fn js_runtime_usable() -> bool {
    match goondan_script::JsRuntime::discover(&|name: &str| std::env::var(name).ok()) {
        Ok(_) => true,
        Err(error) if std::env::var("GOONDAN_REQUIRE_JS").as_deref() == Ok("1") => {
            panic!("GOONDAN_REQUIRE_JS=1 but no JavaScript runtime is usable: {error}")
        }
        Err(error) => {
            eprintln!("skipping the script-tool part: no JavaScript runtime ({error})");
            false
        }
    }
}
