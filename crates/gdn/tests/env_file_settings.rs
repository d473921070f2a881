//! The bundle directory's `.env` and `.env.local` hold keys, not gdn's own
//! settings nor where its requests go: a line setting `GOONDAN_*`, a
//! provider's base URL and the like stops `run`, `validate` and `doctor`
//! with an error naming the file, the line and the variable (never the
//! value), before anything is sent. The process environment and
//! `--env-file`, which the operator chooses, still set them.

use std::net::TcpListener;
use std::path::Path;
use std::process::Output;

mod common;
use common::{temp, write};
use goondan_test_support::{Agent, Bundle, reply_text, reply_tools, text};
use serde_json::json;

/// Variables of the test's own environment that would change what is tested.
const CLEARED: [&str; 6] = [
    "GOONDAN_STATE_ROOT",
    "GOONDAN_LOG",
    "GOONDAN_FS_ALLOW_ROOTS",
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// The variables and the arguments of one run.
type Way<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str]);

fn gdn(bundle: &Path, state: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let gdn = CLEARED.iter().fold(common::gdn_bin().state_arg(state).project(bundle), |gdn, name| gdn.env_remove(name));
    env.iter().fold(gdn, |gdn, (key, value)| gdn.env(key, value)).run(args)
}

/// An OpenAI model without `spec.endpoint` (so `OPENAI_BASE_URL` decides
/// where its key goes) and an agent without tools.
fn write_openai_bundle(dir: &Path) {
    let model = json!({"provider": "openai", "model": "gpt-test"});
    must(Bundle::new().resource("Model", "gpt", model).agent(Agent::new("a", "gpt")).write(dir));
}

/// `OPENAI_BASE_URL` in `.env.local` would send the key of `.env` to
/// whoever listens there: every command that reads the files refuses, and
/// the listener is never connected to.
#[test]
fn a_base_url_in_env_local_is_refused_and_nothing_is_sent() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("bind: {e}"));
    listener.set_nonblocking(true).unwrap_or_else(|e| panic!("{e}"));
    let port = listener.local_addr().unwrap_or_else(|e| panic!("{e}")).port();
    let bundle = temp();
    write_openai_bundle(bundle.path());
    write(&bundle.path().join(".env"), "OPENAI_API_KEY=sk-from-dotenv-31\n");
    let url = format!("http://127.0.0.1:{port}/v1");
    write(&bundle.path().join(".env.local"), &format!("# written by a tool\nOPENAI_BASE_URL={url}\n"));
    let local = bundle.path().join(".env.local").display().to_string();
    for args in [&["run", "--input", "hi"][..], &["validate"], &["doctor"], &["tool", "list"]] {
        let state = temp();
        let output = gdn(bundle.path(), state.path(), &[], args);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(3), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "{local}, line 2: OPENAI_BASE_URL cannot be set in the bundle directory's .env files"
            )),
            "{args:?}: {stderr}"
        );
        assert!(stderr.contains("spec.endpoint") && stderr.contains("process environment"), "{args:?}: {stderr}");
        for value in [url.as_str(), "sk-from-dotenv-31"] {
            assert!(!stderr.contains(value), "{args:?} prints {value}: {stderr}");
            assert!(!text(&output.stdout).contains(value), "{args:?} prints {value}");
        }
    }
    match listener.accept() {
        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the listener was connected to: {other:?}"),
    }
}

/// A scripted agent with `file-system` that reads `path`.
fn write_reader_bundle(dir: &Path, path: &Path) {
    let read = reply_tools([("file-system__read", json!({"path": path}))]);
    let tool = json!({"ref": {"kind": "Tool", "name": "file-system", "package": "@goondan/base"}});
    let bundle = Bundle::new()
        .scripted_model_as("script", "s", json!({"replies": [read, reply_text("done")]}))
        .agent(Agent::new("reader", "script").tool(tool));
    must(bundle.write(dir));
}

/// `result`'s value; a test failure with its error otherwise.
fn must<T, E: std::fmt::Display>(result: Result<T, E>) -> T {
    result.unwrap_or_else(|e| panic!("{e}"))
}

/// What the agent's conversation holds after a run.
fn conversation(state: &Path) -> String {
    let log = common::instance_path(state, "reader@default").join("messages.jsonl");
    std::fs::read_to_string(&log).unwrap_or_default()
}

/// `GOONDAN_FS_ALLOW_ROOTS=/` in `.env` would open the whole disk to
/// `file-system`: refused, the tool never runs. From the process
/// environment or `--env-file` the same setting opens the directory named.
#[test]
fn a_gdn_setting_in_env_is_refused_but_read_from_the_environment_and_env_file() {
    let outside = temp();
    let marker = outside.path().join("marker.txt");
    write(&marker, "outside-marker-64\n");
    let bundle = temp();
    write_reader_bundle(bundle.path(), &marker);

    // Nothing set: the file is outside the roots (the control).
    let state = temp();
    let output = gdn(bundle.path(), state.path(), &[], &["run", "--input", "go"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let log = conversation(state.path());
    assert!(log.contains("E_PATH_OUTSIDE_WORKDIR") && !log.contains("outside-marker-64"), "{log}");

    // In the bundle's .env: refused before any agent starts.
    write(&bundle.path().join(".env"), "SOME_API_KEY=fine\nGOONDAN_FS_ALLOW_ROOTS=/\n");
    let state = temp();
    let output = gdn(bundle.path(), state.path(), &[], &["run", "--input", "go"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    let env = bundle.path().join(".env").display().to_string();
    assert!(
        stderr.contains(&format!(
            "{env}, line 2: GOONDAN_FS_ALLOW_ROOTS cannot be set in the bundle directory's .env files"
        )),
        "{stderr}"
    );
    assert!(conversation(state.path()).is_empty(), "an agent ran");
    std::fs::remove_file(bundle.path().join(".env")).unwrap_or_else(|e| panic!("{e}"));

    // From the process environment, and from --env-file (a file outside the bundle).
    let root = outside.path().display().to_string();
    let flags = temp();
    let flag_file = flags.path().join("ops.env");
    write(&flag_file, &format!("GOONDAN_FS_ALLOW_ROOTS={root}\n"));
    let flag = flag_file.display().to_string();
    let ways: [Way; 2] = [
        (&[("GOONDAN_FS_ALLOW_ROOTS", &root)], &["run", "--input", "go"]),
        (&[], &["run", "--input", "go", "--env-file", &flag]),
    ];
    for (env, args) in ways {
        let state = temp();
        let output = gdn(bundle.path(), state.path(), env, args);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {}", text(&output.stderr));
        let log = conversation(state.path());
        assert!(log.contains("outside-marker-64"), "{args:?}: {log}");
    }
}

/// The provider's base URL from the process environment or `--env-file`
/// still decides the endpoint, and the key in `.env` (an ordinary secret)
/// is still the one sent.
#[test]
fn a_base_url_from_the_environment_or_env_file_is_read_and_the_key_in_env_still_is() {
    let model = must_serve();
    let endpoint = model.url();
    let bundle = temp();
    write_openai_bundle(bundle.path());
    write(&bundle.path().join(".env"), "OPENAI_API_KEY=sk-from-dotenv-31\n");
    let flags = temp();
    let flag_file = flags.path().join("ops.env");
    write(&flag_file, &format!("OPENAI_BASE_URL={endpoint}\n"));
    let flag = flag_file.display().to_string();
    let ways: [Way; 2] = [
        (&[("OPENAI_BASE_URL", &endpoint)], &["run", "--input", "hi"]),
        (&[], &["run", "--input", "hi", "--env-file", &flag]),
    ];
    for (env, args) in ways {
        model.take_requests();
        let state = temp();
        let output = gdn(bundle.path(), state.path(), env, args);
        assert_eq!(output.status.code(), Some(0), "{args:?}: {}", text(&output.stderr));
        assert_eq!(model.headers("authorization"), ["Bearer sk-from-dotenv-31"], "{args:?}");
    }
    // validate and doctor accept a .env holding only keys.
    for args in [&["validate"][..], &["doctor"]] {
        let state = temp();
        let output = gdn(bundle.path(), state.path(), &[("OPENAI_BASE_URL", &endpoint)], args);
        assert!(!text(&output.stderr).contains("cannot be set"), "{args:?}: {}", text(&output.stderr));
    }
}

/// The fake model server, answering "hello".
fn must_serve() -> goondan_test_support::FakeModel {
    goondan_test_support::FakeModel::text("hello").unwrap_or_else(|e| panic!("model server: {e}"))
}
