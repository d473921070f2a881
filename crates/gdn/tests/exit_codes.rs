//! The original's exit-code classes (issue 37): 1 internal, 2 usage, 3
//! configuration, 4 validation, 5 network, 6 authentication, and ours for
//! what it has none of (130 cancelled). Each class through the real binary;
//! the registry's (5, 6, 3, 4) are in package.rs, against a real registry.

use std::io::Write as _;
use std::net::TcpListener;
use std::path::Path;
use std::process::Output;

mod common;
use common::temp;
use goondan_test_support::model::read_http_request;
use goondan_test_support::{Agent, Bundle as BundleBuilder, FakeModel, text};
use serde_json::json;

fn gdn(bundle: &Path, state: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let gdn = common::gdn_bin().state_arg(state).project(bundle);
    env.iter().fold(gdn, |gdn, (key, value)| gdn.env(key, value)).run(args)
}

/// A one-agent bundle whose OpenAI-compatible Model is at `endpoint`, its
/// key in `GDN_TEST_EXIT_KEY`.
fn bundle_at(endpoint: &str) -> tempfile::TempDir {
    BundleBuilder::new()
        .openai_model("m", "gpt-test", endpoint, "GDN_TEST_EXIT_KEY")
        .one_agent("s", Agent::new("a", "m"))
        .write_temp()
        .unwrap_or_else(|e| panic!("{e}"))
}

const KEY: [(&str, &str); 1] = [("GDN_TEST_EXIT_KEY", "sk-test-exit-codes")];

#[test]
fn an_answered_turn_exits_0_and_a_bad_flag_2() {
    let model = FakeModel::text("fine").unwrap_or_else(|e| panic!("model server: {e}"));
    let bundle = bundle_at(&model.url());
    let state = temp();
    let answered = gdn(bundle.path(), state.path(), &KEY, &["run", "--input", "hi"]);
    assert_eq!(answered.status.code(), Some(0), "{}", text(&answered.stderr));
    let usage = gdn(bundle.path(), state.path(), &KEY, &["run", "--no-such-flag"]);
    assert_eq!(usage.status.code(), Some(2), "{}", text(&usage.stderr));
}

#[test]
fn a_model_api_that_cannot_be_reached_is_a_network_error_5() {
    // A port nothing listens on: bound, then closed.
    let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(9);
    let bundle = bundle_at(&format!("http://127.0.0.1:{port}/v1"));
    let state = temp();
    let output = gdn(bundle.path(), state.path(), &KEY, &["run", "--input", "hi"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(5), "{stderr}");
    assert!(stderr.contains("cannot reach"), "{stderr}");
}

#[test]
fn a_model_api_that_refuses_the_key_is_an_auth_error_6() {
    // A server answering as OpenAI does to a wrong key.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
    let server = std::thread::spawn(move || {
        // Refusals are not retried: one request is all.
        if let Ok((stream, _)) = listener.accept() {
            let _ = read_http_request(&stream);
            let body = json!({"error": {"message": "Incorrect API key provided: sk-te***odes.", "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}}).to_string();
            let mut stream = stream;
            let _ = write!(
                stream,
                "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let bundle = bundle_at(&format!("http://127.0.0.1:{port}/v1"));
    let state = temp();
    let output = gdn(bundle.path(), state.path(), &KEY, &["run", "--input", "hi"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(6), "{stderr}");
    assert!(stderr.contains("refused the credentials"), "{stderr}");
    assert!(!stderr.contains("sk-test-exit-codes"), "the key is never printed: {stderr}");
    let _ = server.join();
}

#[test]
fn a_missing_key_or_swarm_or_a_bundle_that_does_not_load_is_a_config_error_3() {
    let model = FakeModel::text("never").unwrap_or_else(|e| panic!("model server: {e}"));
    let bundle = bundle_at(&model.url());
    let state = temp();
    // The key's variable is not set.
    let unset = gdn(bundle.path(), state.path(), &[], &["run", "--input", "hi"]);
    assert_eq!(unset.status.code(), Some(3), "{}", text(&unset.stderr));
    assert!(text(&unset.stderr).contains("GDN_TEST_EXIT_KEY"), "{}", text(&unset.stderr));
    // No such Swarm.
    let swarm = gdn(bundle.path(), state.path(), &KEY, &["run", "-s", "nope", "--input", "hi"]);
    assert_eq!(swarm.status.code(), Some(3), "{}", text(&swarm.stderr));
    assert!(text(&swarm.stderr).contains("no Swarm named 'nope'"), "{}", text(&swarm.stderr));
    // A bundle that does not load: run and tool list refuse with 3, validate reports 4.
    common::write(
        &bundle.path().join("goondan.yaml"),
        "apiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {name: a}\nspec: {}\n",
    );
    for args in [&["run", "--input", "hi"][..], &["tool", "list"]] {
        let broken = gdn(bundle.path(), state.path(), &KEY, args);
        assert_eq!(broken.status.code(), Some(3), "{args:?}: {}", text(&broken.stderr));
    }
    assert!(model.requests().is_empty(), "no model call was made");
}

#[test]
fn validation_failures_are_4_and_strict_warnings_too() {
    let state = temp();
    let dir = temp();
    common::write(
        &dir.path().join("goondan.yaml"),
        "apiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {name: a}\nspec: {}\n",
    );
    let invalid = gdn(dir.path(), state.path(), &[], &["validate"]);
    assert_eq!(invalid.status.code(), Some(4), "{}", text(&invalid.stdout));
    let model = FakeModel::text("x").unwrap_or_else(|e| panic!("model server: {e}"));
    let bundle = bundle_at(&model.url());
    let yaml = std::fs::read_to_string(bundle.path().join("goondan.yaml")).unwrap_or_default();
    // An unknown key is a warning: valid, but not under --strict.
    common::write(&bundle.path().join("goondan.yaml"), &yaml.replacen("spec:", "spec:\n  colour: blue", 1));
    let warned = gdn(bundle.path(), state.path(), &[], &["validate"]);
    assert_eq!(warned.status.code(), Some(0), "{}", text(&warned.stdout));
    assert!(text(&warned.stdout).contains("W_CONFIG_UNKNOWN_KEY"), "{}", text(&warned.stdout));
    let strict = gdn(bundle.path(), state.path(), &[], &["validate", "--strict"]);
    assert_eq!(strict.status.code(), Some(4), "{}", text(&strict.stdout));
}
