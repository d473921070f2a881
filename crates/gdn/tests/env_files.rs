//! The bundle's `.env` files as the original loads them — `--env-file` >
//! `.env.local` > `.env` > the process environment — parsed as dotenv files
//! are (quotes, comments, multi-line values), their values secrets that
//! only the model and the built-ins see; and every file the command line
//! reads (`--input-file`, `--args-file`, `--env-file`, `-`) read within a
//! bound.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod common;
use common::js_runtime_usable;
use common::{temp, write};
use goondan_test_support::text;

fn gdn(bundle: &Path, state: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let gdn = common::gdn_bin().state_arg(state).project(bundle).env_remove("MODEL_CRED");
    env.iter().fold(gdn, |gdn, (key, value)| gdn.env(key, value)).run(args)
}

/// A bundle whose model key is `valueFrom: {env: MODEL_CRED}`, with `bash`
/// and a JavaScript tool that shows its own environment.
fn write_bundle(dir: &Path, endpoint: &str) {
    let peek = "export const handlers = { env: () => ({ env: JSON.stringify(process.env) }) };\n";
    common::peek_bundle(endpoint, "MODEL_CRED", peek, Value::Null).write(dir).unwrap_or_else(|e| panic!("{e}"));
}

/// Which file's value reaches the model, for each combination of files.
#[test]
fn env_file_beats_env_local_beats_env_beats_the_process_environment() {
    let model = must_serve();
    let endpoint = model.url();
    let bundle = temp();
    write_bundle(bundle.path(), &endpoint);
    let flag_dir = temp();
    let flag_file = flag_dir.path().join("flag.env");
    write(&flag_file, "MODEL_CRED=from-flag\n");
    let flag = flag_file.to_string_lossy().into_owned();
    // (in .env, in .env.local, --env-file, expected key)
    let table: [(bool, bool, bool, &str); 5] = [
        (false, false, false, "from-process"),
        (true, false, false, "from-env"),
        (true, true, false, "from-local"),
        (false, true, false, "from-local"),
        (true, true, true, "from-flag"),
    ];
    for (env, local, with_flag, expected) in table {
        let state = temp();
        let set = |name: &str, present: bool, value: &str| {
            let path = bundle.path().join(name);
            if present {
                write(&path, &format!("# {name}\nMODEL_CRED={value}\n"));
            } else {
                let _ = std::fs::remove_file(&path);
            }
        };
        set(".env", env, "from-env");
        set(".env.local", local, "from-local");
        let mut args = vec!["run", "--input", "hi"];
        if with_flag {
            args.extend(["--env-file", &flag]);
        }
        model.take_requests();
        let output = gdn(bundle.path(), state.path(), &[("MODEL_CRED", "from-process")], &args);
        assert_eq!(output.status.code(), Some(0), "{expected}: {}", text(&output.stderr));
        let headers = model.headers("authorization");
        assert_eq!(headers, [format!("Bearer {expected}")], "(.env {env}, .env.local {local}, flag {with_flag})");
    }
}

/// `K="abc" # note` is `abc`, and a quoted value may span lines (the old
/// parser kept the quotes of the first and failed on the second); no value
/// reaches the log or the state root.
#[test]
fn quoted_values_with_comments_and_several_lines_are_read_as_dotenv_files_are() {
    let model = must_serve();
    let endpoint = model.url();
    let bundle = temp();
    let state = temp();
    write_bundle(bundle.path(), &endpoint);
    write(
        &bundle.path().join(".env"),
        "CERT=\"-----BEGIN-----\nline-two-of-the-cert\n-----END-----\"\nMODEL_CRED=\"sk-quoted-41\" # the team key\n",
    );
    let output = gdn(bundle.path(), state.path(), &[], &["-vv", "run", "--input", "hi"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(model.headers("authorization"), ["Bearer sk-quoted-41"]);
    for secret in ["sk-quoted-41", "line-two-of-the-cert"] {
        assert!(!stderr.contains(secret), "the log holds {secret}: {stderr}");
        for file in walk(state.path()) {
            let content = String::from_utf8_lossy(&std::fs::read(&file).unwrap_or_default()).into_owned();
            assert!(!content.contains(secret), "{} holds {secret}", file.display());
        }
    }
    // A broken line is an error naming the file and the line, not the value.
    write(&bundle.path().join(".env.local"), "OK=1\nsk-broken-77 not an assignment\n");
    let output = gdn(bundle.path(), state.path(), &[], &["run", "--input", "hi"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains(".env.local: line 2 is not NAME=VALUE"), "{stderr}");
    assert!(!stderr.contains("sk-broken-77"), "{stderr}");
}

#[test]
fn values_from_env_files_are_not_in_bash_nor_in_the_script_host() {
    let bundle = temp();
    let state = temp();
    write_bundle(bundle.path(), "http://127.0.0.1:9/v1");
    // Names that do not look like secrets: they are secrets all the same.
    write(&bundle.path().join(".env"), "PLAIN_FROM_FILE=dotenv-value-5c2\n");
    write(&bundle.path().join(".env.local"), "LOCAL_SETTING=local-value-8d1\n");
    let command = r#"env; echo ---; tr '\0' '\n' < /proc/$PPID/environ"#;
    let args = json!({ "command": command }).to_string();
    let output = gdn(bundle.path(), state.path(), &[], &["--json", "tool", "call", "bash__exec", "--args", &args]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let result: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}"));
    let stdout = result["output"]["stdout"].as_str().unwrap_or_default();
    assert!(stdout.contains("---"), "{result}");
    for value in ["dotenv-value-5c2", "local-value-8d1"] {
        assert!(!stdout.contains(value), "bash sees {value}:\n{stdout}");
    }
    if !js_runtime_usable() {
        return;
    }
    let output = gdn(bundle.path(), state.path(), &[], &["--json", "tool", "call", "peek__env"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let result: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}"));
    let env = result["output"]["env"].as_str().unwrap_or_default();
    assert!(env.contains("PATH"), "{result}");
    for value in ["dotenv-value-5c2", "local-value-8d1", "PLAIN_FROM_FILE"] {
        assert!(!env.contains(value), "the script host sees {value}:\n{env}");
    }
}

/// Through `gdn run`: the agent process gets the files' values over its
/// channel, and a `bash` command the model chose still sees none of them,
/// in its environment or in its parent's.
#[test]
fn values_from_env_files_are_not_in_bash_run_by_an_agent_process() {
    let bundle = temp();
    let state = temp();
    let yaml = r#"apiVersion: goondan.ai/v1
kind: Model
metadata: {name: script}
spec:
  provider: scripted
  model: s
  options:
    replies:
      - {toolCalls: [{name: bash__exec, args: {command: "env; echo ---; cat -v /proc/$PPID/environ"}}]}
      - {text: done}
---
apiVersion: goondan.ai/v1
kind: Agent
metadata: {name: runner}
spec:
  modelConfig: {modelRef: Model/script}
  tools:
    - {ref: {kind: Tool, name: bash, package: "@goondan/base"}}
"#;
    write(&bundle.path().join("goondan.yaml"), yaml);
    write(
        &bundle.path().join(".env"),
        "PLAIN_FROM_FILE=dotenv-value-5c2
",
    );
    write(
        &bundle.path().join(".env.local"),
        "SOME_API_KEY=local-value-8d1
",
    );
    let output = gdn(bundle.path(), state.path(), &[], &["run", "--input", "go"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let log = common::instance_path(state.path(), "runner@default").join("messages.jsonl");
    let conversation = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    assert!(conversation.contains("PATH=") && conversation.contains("---"), "the command ran: {conversation}");
    for value in ["dotenv-value-5c2", "local-value-8d1"] {
        assert!(!conversation.contains(value), "bash saw {value}: {conversation}");
    }
}

/// `/dev/zero` used to be read until memory ran out (6 GiB in 6 s): every
/// file option refuses a device at once, and a file or standard input over
/// the limit is an error naming it.
#[test]
fn input_args_and_env_files_are_bounded() {
    let state = temp();
    let bundle = temp();
    write_bundle(bundle.path(), "http://127.0.0.1:9/v1");
    // An input or arguments file is usage (2); an environment file is
    // configuration (3), as the original's unreadable --env-file.
    let cases: [(&[&str], &str, i32); 3] = [
        (&["run", "--input-file", "/dev/zero"], "--input-file /dev/zero is a character device, not a file", 2),
        (&["tool", "call", "bash__exec", "--args-file", "/dev/zero"], "--args-file /dev/zero is a character device", 2),
        (&["run", "--input", "hi", "--env-file", "/dev/zero"], "--env-file /dev/zero is a character device", 3),
    ];
    for (args, expected, code) in cases {
        let started = Instant::now();
        let output = gdn(bundle.path(), state.path(), &[], args);
        assert_eq!(output.status.code(), Some(code), "{args:?}: {}", text(&output.stderr));
        assert!(text(&output.stderr).contains(expected), "{args:?}: {}", text(&output.stderr));
        assert!(started.elapsed() < Duration::from_secs(10), "{args:?} took {:?}", started.elapsed());
    }
    let big = temp();
    let oversized = |name: &str, bytes: usize| {
        let path = big.path().join(name);
        write(&path, &"x".repeat(bytes));
        path.to_string_lossy().into_owned()
    };
    let input = oversized("input.txt", (8 << 20) + 1);
    let args_file = oversized("args.json", (16 << 20) + 1);
    let env_file = oversized("big.env", (1 << 20) + 1);
    let cases: [(Vec<&str>, &str, i32); 3] = [
        (vec!["run", "--input-file", &input], "is larger than 8 MiB (the limit)", 2),
        (vec!["tool", "call", "bash__exec", "--args-file", &args_file], "is larger than 16 MiB (the limit)", 2),
        (vec!["run", "--input", "hi", "--env-file", &env_file], "is larger than 1 MiB (the limit)", 3),
    ];
    for (args, expected, code) in cases {
        let output = gdn(bundle.path(), state.path(), &[], &args);
        assert_eq!(output.status.code(), Some(code), "{args:?}: {}", text(&output.stderr));
        assert!(text(&output.stderr).contains(expected), "{args:?}: {}", text(&output.stderr));
    }
    // A file just under the limit is read (and then refused as JSON, not for its size).
    let fits = oversized("fits.json", 1 << 20);
    let output = gdn(bundle.path(), state.path(), &[], &["tool", "call", "bash__exec", "--args-file", &fits]);
    assert!(text(&output.stderr).contains("the arguments are not valid JSON"), "{}", text(&output.stderr));
}

/// `-` reads standard input within the same bound, however much is sent.
#[test]
fn standard_input_is_bounded_too() {
    let state = temp();
    let bundle = temp();
    write_bundle(bundle.path(), "http://127.0.0.1:9/v1");
    for (args, expected) in [
        (vec!["run", "--input-file", "-"], "standard input (--input-file -) holds more than 8 MiB (the limit)"),
        (
            vec!["tool", "call", "bash__exec", "--args-file", "-"],
            "standard input (--args-file -) holds more than 16 MiB (the limit)",
        ),
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gdn"))
            .arg("--state-root")
            .arg(state.path())
            .arg("-c")
            .arg(bundle.path())
            .args(&args)
            .env("NO_COLOR", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn gdn: {e}"));
        let mut stdin = child.stdin.take().unwrap_or_else(|| panic!("no stdin"));
        // An endless writer: gdn stops reading at the limit, and the write fails.
        let writer = std::thread::spawn(move || {
            let block = vec![b'x'; 1 << 16];
            while stdin.write_all(&block).is_ok() {}
        });
        let output = child.wait_with_output().unwrap_or_else(|e| panic!("{e}"));
        let _ = writer.join();
        assert_eq!(output.status.code(), Some(2), "{args:?}: {}", text(&output.stderr));
        assert!(text(&output.stderr).contains(expected), "{args:?}: {}", text(&output.stderr));
    }
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    common::files_under(dir)
}

/// The fake model server, answering "hello".
fn must_serve() -> goondan_test_support::FakeModel {
    goondan_test_support::FakeModel::text("hello").unwrap_or_else(|e| panic!("model server: {e}"))
}
