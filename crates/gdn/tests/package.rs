//! `gdn package` against a real `gdn registry serve` on 127.0.0.1:
//! publish from one bundle, add into another (goondan.yaml edited in
//! place, goondan.lock.yaml written, files installed under the state
//! root), `install --frozen-lockfile` on a fresh state root, `update`, and
//! every refusal leaving the bundle as it was.

use std::io::{Read as _, Write as _};
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use goondan_test_support::process::{Running, Stream};
use serde_json::{Value, json};

mod common;
mod package_support;
use package_support::{code, installed};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const TOKEN: &str = "package-test-token";

/// A registry process and its URL.
struct Registry {
    _server: Running,
    _storage: tempfile::TempDir,
    url: String,
}

fn registry() -> Result<Registry, Box<dyn std::error::Error>> {
    let storage = common::temp();
    let gdn = common::gdn_bin().env("GOONDAN_REGISTRY_TOKENS", TOKEN);
    let mut command = gdn.command(["registry", "serve", "--port", "0", "--storage"]);
    command.arg(storage.path());
    let mut server = Running::spawn(command)?;
    let line = server.wait_for_line(Stream::Stdout, "Registry listening on http://", Duration::from_secs(30))?;
    let url = format!("http://{}", line.trim().rsplit("http://").next().ok_or("no address")?);
    Ok(Registry { _server: server, _storage: storage, url })
}

/// `gdn -c DIR package ARGS --json` with the state root `state`; the exit
/// code and the JSON printed.
fn package(dir: &Path, state: &Path, token: Option<&str>, args: &[&str]) -> (i32, Value, Output) {
    let mut gdn = common::gdn_bin()
        .project(dir)
        .state(state)
        .env("NO_PROXY", "127.0.0.1")
        .env_remove("GOONDAN_REGISTRY")
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy");
    gdn = match token {
        Some(token) => gdn.env("GOONDAN_REGISTRY_TOKEN", token),
        None => gdn.env_remove("GOONDAN_REGISTRY_TOKEN"),
    };
    let mut full = vec!["package"];
    full.extend_from_slice(args);
    full.push("--json");
    let output = gdn.run(full);
    let json = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
    (output.status.code().unwrap_or(-1), json, output)
}

/// A bundle that is one Package document.
fn bundle(dir: &Path, name: &str, version: &str, deps: &[(&str, &str)]) {
    package_support::bundle(dir, name, version, deps, 0);
}

fn publish(registry: &Registry, name: &str, version: &str, deps: &[(&str, &str)]) -> TestResult {
    let dir = common::temp();
    let state = common::temp();
    bundle(dir.path(), name, version, deps);
    let (status, json, output) =
        package(dir.path(), state.path(), Some(TOKEN), &["publish", "--registry", &registry.url]);
    assert_eq!(status, 0, "{json} {}", String::from_utf8_lossy(&output.stderr));
    Ok(())
}

const APP: &str = "# the app\napiVersion: goondan.ai/v1\nkind: Package\nmetadata:\n  name: \"@acme/app\"\nspec:\n  version: \"0.1.0\"   # ours\n---\n# another document, kept as it is\nkind: Model\nmetadata:\n  name: m\nspec:\n  provider: openai\n  model: gpt-x\n";

#[test]
fn publish_add_frozen_install_and_update() -> TestResult {
    let registry = registry()?;

    // A dry run sends nothing and never packs `.env`.
    let lib = common::temp();
    bundle(lib.path(), "@acme/lib", "1.0.0", &[]);
    std::fs::create_dir_all(lib.path().join("prompts"))?;
    common::write(&lib.path().join("prompts/system.md"), "hello\n");
    common::write(&lib.path().join(".env"), "SECRET=1\n");
    let state = common::temp();
    let (status, dry, _) =
        package(lib.path(), state.path(), Some(TOKEN), &["publish", "--dry-run", "--registry", &registry.url]);
    assert_eq!(status, 0, "{dry}");
    assert_eq!(dry["files"], json!(["goondan.yaml", "prompts/system.md"]));
    assert_eq!(dry["payload"]["dist-tags"], json!({"latest": "1.0.0"}));
    assert_eq!(dry["payload"]["access"], "public");
    assert!(dry["payload"]["_attachments"]["lib-1.0.0.tgz"]["length"].as_u64().unwrap_or(0) > 0, "{dry}");
    let app = common::temp();
    common::write(&app.path().join("goondan.yaml"), APP);
    let (status, json, _) = package(app.path(), state.path(), None, &["add", "@acme/lib", "--registry", &registry.url]);
    assert_eq!((status, code(&json)), (3, "PKG_NOT_FOUND"), "a dry run published nothing: {json}");

    let (status, json, _) = package(lib.path(), state.path(), Some(TOKEN), &["publish", "--registry", &registry.url]);
    assert_eq!(status, 0, "{json}");
    publish(&registry, "@acme/util", "1.0.0", &[])?;
    publish(&registry, "@acme/util", "2.0.0", &[])?;
    publish(&registry, "@acme/lib", "1.1.0", &[("@acme/util", "^1.0.0")])?;

    // add: the highest 1.x of lib, util transitively at 1.x (2.0.0 exists).
    let (status, json, output) =
        package(app.path(), state.path(), None, &["add", "@acme/lib", "--registry", &registry.url]);
    assert_eq!(status, 0, "{json} {}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(json["added"], true);
    assert_eq!(json["resolved_version"], "1.1.0");
    let manifest = std::fs::read_to_string(app.path().join("goondan.yaml"))?;
    let expected = APP.replace(
        "  version: \"0.1.0\"   # ours\n",
        "  version: \"0.1.0\"   # ours\n  dependencies:\n    - name: \"@acme/lib\"\n      version: \"^1.1.0\"\n",
    );
    assert_eq!(manifest, expected);
    let lock_path = app.path().join("goondan.lock.yaml");
    let lock = std::fs::read_to_string(&lock_path)?;
    assert!(
        lock.starts_with("lockfileVersion: 1\npackages:\n  \"@acme/lib@1.1.0\":\n    version: \"1.1.0\"\n"),
        "{lock}"
    );
    assert!(lock.contains("    dependencies:\n      \"@acme/util\": \"^1.0.0\"\n  \"@acme/util@1.0.0\":\n"), "{lock}");
    assert!(lock.contains("    integrity: \"sha512-"), "{lock}");
    let lib_dir = installed(state.path(), "@acme/lib", "1.1.0");
    assert!(lib_dir.join("goondan.yaml").is_file());
    assert!(installed(state.path(), "@acme/util", "1.0.0").join("goondan.yaml").is_file());
    assert!(!installed(state.path(), "@acme/util", "2.0.0").exists());

    // install again: everything reused, the lockfile byte for byte the same.
    let (status, json, _) = package(app.path(), state.path(), None, &["install", "--registry", &registry.url]);
    assert_eq!(status, 0, "{json}");
    assert!(
        json["installed"].as_array().is_some_and(|all| all.len() == 2 && all.iter().all(|i| i["reused"] == true)),
        "{json}"
    );
    assert_eq!(std::fs::read_to_string(&lock_path)?, lock);

    // The text output, as the original prints it.
    let text = common::gdn_bin().project(app.path()).state(state.path()).run([
        "package",
        "install",
        "--registry",
        &registry.url,
    ]);
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert!(stdout.contains("Installed dependencies: 2 (2 already in place)\n"), "{stdout}");
    assert!(stdout.contains("Lockfile: "), "{stdout}");
    let text = common::gdn_bin().project(app.path()).state(state.path()).run([
        "package",
        "add",
        "@acme/nope",
        "--registry",
        &registry.url,
    ]);
    let stderr = String::from_utf8_lossy(&text.stderr);
    assert!(
        stderr.contains("package @acme/nope is not in the registry") && stderr.contains("[PKG_NOT_FOUND]"),
        "{stderr}"
    );

    // A fresh state root reproduces the install from the lockfile alone.
    let fresh = common::temp();
    let (status, json, _) =
        package(app.path(), fresh.path(), None, &["install", "--frozen-lockfile", "--registry", &registry.url]);
    assert_eq!(status, 0, "{json}");
    for (name, version) in [("@acme/lib", "1.1.0"), ("@acme/util", "1.0.0")] {
        let a = std::fs::read(installed(state.path(), name, version).join("goondan.yaml"))?;
        let b = std::fs::read(installed(fresh.path(), name, version).join("goondan.yaml"))?;
        assert_eq!(a, b);
    }
    assert_eq!(std::fs::read_to_string(&lock_path)?, lock);

    // --frozen-lockfile refuses a manifest the lockfile does not match, changing nothing.
    let edited = manifest.replace("\"^1.1.0\"", "\"^1.2.0\"");
    common::write(&app.path().join("goondan.yaml"), &edited);
    let empty = common::temp();
    let (status, json, _) =
        package(app.path(), empty.path(), None, &["install", "--frozen-lockfile", "--registry", &registry.url]);
    assert_eq!((status, code(&json)), (4, "PKG_LOCKFILE_MISMATCH"), "{json}");
    assert!(json["error"]["message"].as_str().unwrap_or_default().contains("goondan.yaml needs @acme/lib"), "{json}");
    assert!(!empty.path().join("packages").exists());
    assert_eq!(std::fs::read_to_string(&lock_path)?, lock);
    common::write(&app.path().join("goondan.yaml"), &manifest);

    // update: lib moves to its new latest, the range keeps its caret.
    publish(&registry, "@acme/lib", "1.2.0", &[("@acme/util", "^1.0.0")])?;
    let (status, json, _) = package(app.path(), state.path(), None, &["update", "--registry", &registry.url]);
    assert_eq!(status, 0, "{json}");
    assert_eq!(json["changes"]["@acme/lib"], json!(["^1.1.0", "^1.2.0"]));
    assert_eq!(std::fs::read_to_string(app.path().join("goondan.yaml"))?, manifest.replace("\"^1.1.0\"", "\"^1.2.0\""));
    let lock = std::fs::read_to_string(&lock_path)?;
    assert!(lock.contains("\"@acme/lib@1.2.0\""), "{lock}");
    assert!(!lock.contains("\"@acme/lib@1.1.0\""), "{lock}");
    assert!(installed(state.path(), "@acme/lib", "1.2.0").join("goondan.yaml").is_file());

    // update NAME: only a dependency of the bundle.
    let before = std::fs::read_to_string(app.path().join("goondan.yaml"))?;
    let (status, json, _) =
        package(app.path(), state.path(), None, &["update", "@acme/util", "--registry", &registry.url]);
    assert_eq!((status, code(&json)), (3, "PKG_MANIFEST_INVALID"), "{json}");
    assert_eq!(std::fs::read_to_string(app.path().join("goondan.yaml"))?, before);

    // add -E writes the exact version picked.
    publish(&registry, "@acme/solo", "1.0.0", &[])?;
    let (status, json, _) =
        package(app.path(), state.path(), None, &["add", "-E", "@acme/solo", "--registry", &registry.url]);
    assert_eq!(status, 0, "{json}");
    assert_eq!(json["dependency"], json!({"name": "@acme/solo", "range": "1.0.0"}));
    assert!(
        std::fs::read_to_string(app.path().join("goondan.yaml"))?
            .contains("    - name: \"@acme/solo\"\n      version: \"1.0.0\"\n---\n")
    );
    Ok(())
}

/// A server answering every request with `answer`.
fn garbage_server(answer: &'static str) -> Result<String, std::io::Error> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let url = format!("http://{}", listener.local_addr()?);
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            let mut buffer = [0u8; 4096];
            let _ = stream.read(&mut buffer);
            let _ = stream.write_all(answer.as_bytes());
        }
    });
    Ok(url)
}

/// Publishes a tarball with no goondan.yaml (as another client could).
fn publish_raw_without_manifest(registry: &Registry) -> TestResult {
    let dir = common::temp();
    common::write(&dir.path().join("README.md"), "no manifest here\n");
    let bytes = goondan_registry::tarball::pack(dir.path(), &Default::default())?;
    use base64::Engine as _;
    let payload = json!({
        "name": "@acme/empty", "version": "1.0.0", "dependencies": {},
        "_attachments": {"empty-1.0.0.tgz": {"data": base64::engine::general_purpose::STANDARD.encode(&bytes), "length": bytes.len()}},
    });
    let address = registry.url.trim_start_matches("http://");
    let body = serde_json::to_vec(&payload)?;
    let mut stream = std::net::TcpStream::connect(address)?;
    write!(
        stream,
        "PUT /@acme/empty HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )?;
    stream.write_all(&body)?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    assert!(answer.starts_with("HTTP/1.1 201"), "{answer}");
    Ok(())
}

#[test]
fn every_refusal_is_structured_and_changes_nothing() -> TestResult {
    let registry = registry()?;
    let url = registry.url.as_str();
    publish(&registry, "@acme/lib", "1.0.0", &[])?;
    publish(&registry, "@acme/lib", "1.1.0", &[])?;
    publish(&registry, "@acme/pinned", "1.0.0", &[("@acme/lib", "1.0.0")])?;
    publish(&registry, "@acme/c1", "1.0.0", &[("@acme/c2", "^1.0.0")])?;
    publish(&registry, "@acme/c2", "1.0.0", &[("@acme/c1", "^1.0.0")])?;
    publish_raw_without_manifest(&registry)?;

    let app = common::temp();
    let state = common::temp();
    let manifest = app.path().join("goondan.yaml");
    common::write(&manifest, APP);
    let unchanged = || {
        assert_eq!(std::fs::read_to_string(&manifest).ok().as_deref(), Some(APP));
        assert!(!app.path().join("goondan.lock.yaml").exists());
    };

    let cases: Vec<(Vec<&str>, i32, &str, &str)> = vec![
        (vec!["add", "@acme/nothing"], 3, "PKG_NOT_FOUND", "@acme/nothing"),
        (vec!["add", "@acme/lib@^9.0.0"], 3, "PKG_VERSION_NOT_FOUND", "published: 1.0.0, 1.1.0"),
        (vec!["add", "Bad Name"], 2, "PKG_INVALID_NAME", "Bad Name"),
        (vec!["add", "@acme/lib@not a range!"], 2, "PKG_INVALID_VERSION", "not a range!"),
        (vec!["add", "@acme/empty"], 4, "PKG_NO_MANIFEST", "goondan.yaml"),
        (vec!["add", "@acme/c1"], 3, "PKG_DEPENDENCY_CYCLE", "-> "),
    ];
    for (args, status, expected, needle) in cases {
        let mut full = args.clone();
        full.extend(["--registry", url]);
        let (got, json, _) = package(app.path(), state.path(), None, &full);
        assert_eq!((got, code(&json)), (status, expected), "{args:?}: {json}");
        let message = json["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(needle), "{args:?}: {message}");
        unchanged();
    }

    // The registry down, and something that is no registry.
    let down = format!("http://127.0.0.1:{}", goondan_test_support::process::free_port()?);
    let (status, json, _) = package(app.path(), state.path(), None, &["add", "@acme/lib", "--registry", &down]);
    assert_eq!((status, code(&json)), (5, "PKG_REGISTRY_UNREACHABLE"), "{json}");
    let garbage = garbage_server("HTTP/1.1 200 OK\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot json!")?;
    let (status, json, _) = package(app.path(), state.path(), None, &["add", "@acme/lib", "--registry", &garbage]);
    assert_eq!((status, code(&json)), (5, "PKG_REGISTRY_BAD_ANSWER"), "{json}");
    unchanged();

    // pinned alone installs (lib 1.0.0); lib ^1.1.0 beside it conflicts.
    let (got, json, output) = package(app.path(), state.path(), None, &["add", "@acme/pinned", "--registry", url]);
    assert_eq!(got, 0, "{json} {}", String::from_utf8_lossy(&output.stderr));
    let with_pinned = std::fs::read_to_string(&manifest)?;
    let lock = std::fs::read_to_string(app.path().join("goondan.lock.yaml"))?;
    let (got, json, _) = package(app.path(), state.path(), None, &["add", "@acme/lib@^1.1.0", "--registry", url]);
    assert_eq!((got, code(&json)), (3, "PKG_VERSION_CONFLICT"), "{json}");
    let message = json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("@acme/pinned@1.0.0 wants \"1.0.0\""), "{message}");
    assert!(message.contains("goondan.yaml wants \"^1.1.0\""), "{message}");
    assert_eq!(std::fs::read_to_string(&manifest)?, with_pinned);
    assert_eq!(std::fs::read_to_string(app.path().join("goondan.lock.yaml"))?, lock);

    // Publishing without a token: 401, naming the variable.
    let lib = common::temp();
    bundle(lib.path(), "@acme/lib", "3.0.0", &[]);
    let (status, json, _) = package(lib.path(), state.path(), None, &["publish", "--registry", url]);
    assert_eq!((status, code(&json)), (6, "PKG_UNAUTHORIZED"), "{json}");
    assert!(json["error"]["message"].as_str().unwrap_or_default().contains("GOONDAN_REGISTRY_TOKEN"), "{json}");
    assert_eq!(registry_versions(&registry, "@acme/lib")?, ["1.0.0", "1.1.0"]);
    // The token of <state root>/config.json's registries[url] (`${VAR}` read from the environment).
    let config = json!({"registries": {url: {"token": "${MY_REGISTRY_TOKEN}"}}});
    common::write(&state.path().join("config.json"), &config.to_string());
    let with_var = common::gdn_bin()
        .project(lib.path())
        .state(state.path())
        .env_remove("GOONDAN_REGISTRY_TOKEN")
        .env("MY_REGISTRY_TOKEN", TOKEN)
        .run(["package", "publish", "--registry", url, "--json"]);
    assert!(with_var.status.success(), "{}", String::from_utf8_lossy(&with_var.stdout));
    assert_eq!(registry_versions(&registry, "@acme/lib")?, ["1.0.0", "1.1.0", "3.0.0"]);

    // A bundle that does not validate is not published.
    let broken = common::temp();
    bundle(broken.path(), "@acme/broken", "1.0.0", &[]);
    let text = std::fs::read_to_string(broken.path().join("goondan.yaml"))?;
    common::write(
        &broken.path().join("goondan.yaml"),
        &format!(
            "{text}---
kind: Agent
metadata:
  name: a
spec: 42
"
        ),
    );
    let (status, json, output) = package(broken.path(), state.path(), Some(TOKEN), &["publish", "--registry", url]);
    assert_eq!((status, code(&json)), (4, "PKG_MANIFEST_INVALID"), "{json}");
    assert!(!String::from_utf8_lossy(&output.stderr).is_empty());
    assert!(registry_versions(&registry, "@acme/broken").is_err());

    // A lockfile that does not parse: its line; one whose integrity lies: refused before unpacking.
    let other = common::temp();
    // `@goondan/base` is built in: never asked of the registry (which has none), locked or installed.
    bundle(other.path(), "@acme/other", "0.1.0", &[("@goondan/base", "^0.0.3-alpha17"), ("@acme/lib", "^1.0.0")]);
    let lock_path = other.path().join("goondan.lock.yaml");
    common::write(&lock_path, "lockfileVersion: 1\npackages:\n  \"@acme/lib@1.1.0\": [unclosed\n");
    let (status, json, _) = package(other.path(), state.path(), None, &["install", "--registry", url]);
    assert_eq!((status, code(&json)), (3, "PKG_LOCKFILE_INVALID"), "{json}");
    assert!(json["error"]["message"].as_str().unwrap_or_default().contains("goondan.lock.yaml:"), "{json}");
    std::fs::remove_file(&lock_path)?;
    let (status, json, _) = package(other.path(), state.path(), None, &["install", "--registry", url]);
    assert_eq!(status, 0, "{json}");
    let lock = std::fs::read_to_string(&lock_path)?;
    assert!(!lock.contains("@goondan/base"), "{lock}");
    assert!(!state.path().join("packages/goondan").exists());
    assert!(!state.path().join("packages/@goondan").exists());
    let start = lock.find("sha512-").ok_or("no integrity")? + "sha512-".len();
    let mut lying = lock.clone();
    lying.replace_range(start..start + 4, if &lock[start..start + 4] == "AAAA" { "BBBB" } else { "AAAA" });
    common::write(&lock_path, &lying);
    let empty = common::temp();
    let (status, json, _) =
        package(other.path(), empty.path(), None, &["install", "--frozen-lockfile", "--registry", url]);
    assert_eq!((status, code(&json)), (4, "PKG_INTEGRITY_MISMATCH"), "{json}");
    assert!(!installed(empty.path(), "@acme/lib", "1.1.0").exists());
    assert_eq!(std::fs::read_to_string(&lock_path)?, lying);

    // An install whose recorded integrity is not the locked one is replaced.
    let dir = installed(state.path(), "@acme/lib", "1.1.0");
    common::write(&dir.join(".goondan-integrity"), "sha512-other");
    common::write(&dir.join("goondan.yaml"), "tampered\n");
    common::write(&lock_path, &lock);
    let (status, json, _) =
        package(other.path(), state.path(), None, &["install", "--frozen-lockfile", "--registry", url]);
    assert_eq!(status, 0, "{json}");
    assert_eq!(json["installed"][0]["reused"], false, "{json}");
    assert_ne!(std::fs::read_to_string(dir.join("goondan.yaml"))?, "tampered\n");
    Ok(())
}

/// The versions the registry lists for `name` (an error when it has none).
fn registry_versions(registry: &Registry, name: &str) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let address = registry.url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address)?;
    write!(stream, "GET /{name} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let (head, body) = answer.split_once("\r\n\r\n").ok_or("no end of headers")?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(head.to_owned().into());
    }
    let packument: Value = serde_json::from_str(body)?;
    Ok(packument["versions"].as_object().map(|v| v.keys().cloned().collect()).unwrap_or_default())
}

/// The Tool module of `@acme/shouter`, published as TypeScript.
const SHOUTER_TOOL: &str = "export const handlers = {\n  it: async (_ctx: unknown, input: { text: string }) => ({ shouted: `${input.text.toUpperCase()}!` }),\n};\n";

/// The documents of `@acme/shouter` after its Package: a Tool whose entry
/// is `src/tool.ts`.
const SHOUTER_TOOL_DOC: &str = "---\napiVersion: goondan.ai/v1\nkind: Tool\nmetadata:\n  name: shout\nspec:\n  entry: ./src/tool.ts\n  exports:\n    - name: it\n      parameters:\n        type: object\n        properties:\n          text: {type: string}\n        required: [text]\n";

/// What the app adds once the package is in: a scripted model that calls
/// the package's tool, and an agent that declares it.
const APP_AGENT_DOCS: &str = "---\napiVersion: goondan.ai/v1\nkind: Model\nmetadata:\n  name: m\nspec:\n  provider: scripted\n  model: app\n  options:\n    replies:\n      - toolCalls:\n          - name: shout__it\n            args: {text: through the registry}\n      - text: app done\n---\napiVersion: goondan.ai/v1\nkind: Agent\nmetadata:\n  name: app\nspec:\n  modelConfig:\n    modelRef: Model/m\n  tools:\n    - {kind: Tool, name: shout, package: \"@acme/shouter\"}\n";

#[test]
fn a_published_package_s_ts_tool_runs_in_the_bundle_that_added_it() -> TestResult {
    if !common::js_runtime_usable() {
        return Ok(());
    }
    let registry = registry()?;
    let shouter = common::temp();
    bundle(shouter.path(), "@acme/shouter", "1.0.0", &[]);
    let manifest = std::fs::read_to_string(shouter.path().join("goondan.yaml"))? + SHOUTER_TOOL_DOC;
    common::write(&shouter.path().join("goondan.yaml"), &manifest);
    std::fs::create_dir_all(shouter.path().join("src"))?;
    common::write(&shouter.path().join("src/tool.ts"), SHOUTER_TOOL);
    let publisher_state = common::temp();
    let (status, json, output) =
        package(shouter.path(), publisher_state.path(), Some(TOKEN), &["publish", "--registry", &registry.url]);
    assert_eq!(status, 0, "{json} {}", String::from_utf8_lossy(&output.stderr));

    let app = common::temp();
    let state = common::temp();
    bundle(app.path(), "@acme/app", "0.1.0", &[]);
    let (status, json, output) =
        package(app.path(), state.path(), None, &["add", "@acme/shouter", "--registry", &registry.url]);
    assert_eq!(status, 0, "{json} {}", String::from_utf8_lossy(&output.stderr));
    assert!(installed(state.path(), "@acme/shouter", "1.0.0").join("src/tool.ts").is_file());
    let manifest = std::fs::read_to_string(app.path().join("goondan.yaml"))? + APP_AGENT_DOCS;
    common::write(&app.path().join("goondan.yaml"), &manifest);

    let run = common::gdn_bin().project(app.path()).state(state.path()).run(["run", "--input", "go"]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert_eq!(run.status.code(), Some(0), "{}\n{stdout}", String::from_utf8_lossy(&run.stderr));
    assert!(stdout.contains("app done"), "{stdout}");
    // The installed tool's result is in the conversation.
    let conversation = common::files_under(state.path())
        .into_iter()
        .filter(|f| f.ends_with("messages.jsonl"))
        .map(|f| std::fs::read_to_string(f).unwrap_or_default())
        .collect::<String>();
    assert!(
        conversation.contains("THROUGH THE REGISTRY!"),
        "the tool's result is not in the conversation: {conversation}"
    );
    Ok(())
}
