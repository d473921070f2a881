//! Validation rules through the public loading API.

use std::path::{Path, PathBuf};

use goondan_config::{Diagnostic, DiagnosticCode, Severity, base_package, load_bundle, load_from_str};

fn load(text: &str) -> Vec<Diagnostic> {
    load_from_str(text, "goondan.yaml", None, PathBuf::from("goondan.yaml")).diagnostics
}

fn codes(diagnostics: &[Diagnostic]) -> Vec<(&'static str, String, Severity)> {
    diagnostics.iter().map(|d| (d.code.as_str(), d.path.clone(), d.severity)).collect()
}

fn errors(text: &str) -> Vec<(&'static str, String)> {
    load(text).into_iter().filter(Diagnostic::is_error).map(|d| (d.code.as_str(), d.path)).collect()
}

const MODEL: &str =
    "apiVersion: goondan.ai/v1\nkind: Model\nmetadata: {name: m}\nspec: {provider: openai, model: gpt-4o}\n";

fn tool(name: &str, exports: &str) -> String {
    format!(
        "apiVersion: goondan.ai/v1\nkind: Tool\nmetadata:\n  name: {name}\nspec:\n  entry: ./t.ts\n  exports:\n{exports}"
    )
}

#[test]
fn base_package_loads_without_diagnostics() {
    let base = base_package();
    assert_eq!(base.package_name(), Some("@goondan/base"));
    let tools: Vec<&str> = base.tools().map(|t| t.name()).collect();
    assert_eq!(
        tools,
        [
            "bash",
            "wait",
            "tasks",
            "file-system",
            "agents",
            "self-restart",
            "telegram",
            "slack",
            "http-fetch",
            "json-query",
            "text-transform"
        ]
    );
    let report = load_from_str(include_str!("../src/base/goondan.yaml"), "base", None, PathBuf::from("base"));
    // Only the mixed-case warnings of the original's own export names.
    let problems: Vec<_> = report.diagnostics.iter().filter(|d| !d.message.contains("uppercase")).collect();
    assert!(problems.is_empty(), "{problems:#?}");
    assert!(report.diagnostics.iter().all(|d| d.severity == Severity::Warning));
}

#[test]
fn a_valid_bundle_has_no_errors() {
    let text = format!(
        "apiVersion: goondan.ai/v1\nkind: Package\nmetadata: {{name: demo}}\nspec: {{version: 0.1.0}}\n---\n{MODEL}---\n\
apiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {{name: helper}}\nspec:\n  modelConfig: {{modelRef: Model/m}}\n  prompt: {{system: hi}}\n  tools:\n    - ref: {{kind: Tool, name: json-query, package: \"@goondan/base\"}}\n    - Tool/local\n---\n\
apiVersion: goondan.ai/v1\nkind: Swarm\nmetadata: {{name: default}}\nspec:\n  entryAgent: Agent/helper\n  agents: [{{ref: Agent/helper}}]\n---\n{}",
        tool(
            "local",
            "    - name: run\n      description: Run it\n      parameters: {type: object, properties: {x: {type: string}}}\n"
        )
    );
    let report = load_from_str(&text, "goondan.yaml", None, PathBuf::from("goondan.yaml"));
    assert!(!report.has_errors(), "{:#?}", report.diagnostics);
    let bundle = report.bundle.unwrap_or_else(|| panic!("bundle"));
    let agent = bundle.default_agent().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(agent.name(), "helper");
    let tools: Vec<&str> = bundle.agent_tools(agent.resource).iter().map(|(_, t)| t.name()).collect();
    assert_eq!(tools, ["json-query", "local"]);
}

#[test]
fn parse_errors_carry_a_position_and_never_panic() {
    let diagnostics = load("apiVersion: goondan.ai/v1\nkind: [Tool\nmetadata: x\n");
    assert_eq!(diagnostics.len(), 1);
    assert_eq!(diagnostics[0].code, DiagnosticCode::ParseError);
    assert!(diagnostics[0].line.is_some());
    for garbage in ["\u{0}\u{1}:", "a: b: c", "- [", "{{{", "key: 'unterminated", "\t- x"] {
        let _ = load(garbage);
    }
}

#[test]
fn api_version_kind_and_name() {
    assert_eq!(
        errors("apiVersion: goondan.ai/v2\nkind: Model\nmetadata: {name: m}\nspec: {provider: a, model: b}\n"),
        [("E_CONFIG_UNSUPPORTED_API_VERSION", "goondan.yaml#0.apiVersion".to_owned())]
    );
    let diagnostics = load("apiVersion: goondan.ai/v1\nkind: tool\nmetadata: {name: m}\nspec: {}\n");
    assert_eq!(codes(&diagnostics)[0].0, "E_CONFIG_UNKNOWN_KIND");
    assert_eq!(diagnostics[0].suggestion.as_deref(), Some("Did you mean 'Tool'? Kinds are case-sensitive."));
    assert_eq!(diagnostics[0].line, Some(2));
    assert_eq!(
        errors("apiVersion: goondan.ai/v1\nkind: Model\nmetadata: {name: 'bad name'}\nspec: {provider: a, model: b}\n"),
        [("E_CONFIG_INVALID_NAME", "goondan.yaml#0.metadata.name".to_owned())]
    );
    assert_eq!(
        errors("apiVersion: goondan.ai/v1\nkind: Model\nmetadata: {}\nspec: {provider: a, model: b}\n"),
        [("E_CONFIG_INVALID_NAME", "goondan.yaml#0.metadata".to_owned())]
    );
}

#[test]
fn tool_rules_of_spec_002() {
    // entry required, at least one export
    let e = errors("apiVersion: goondan.ai/v1\nkind: Tool\nmetadata: {name: t}\nspec: {exports: []}\n");
    assert_eq!(
        e,
        [
            ("E_CONFIG_SCHEMA_INVALID", "goondan.yaml#0.spec.entry".to_owned()),
            ("E_CONFIG_SCHEMA_INVALID", "goondan.yaml#0.spec.exports".to_owned()),
        ]
    );
    // __ in the resource name
    assert_eq!(
        errors(&tool("a__b", "    - {name: x, description: d}\n")),
        [("E_CONFIG_SCHEMA_INVALID", "goondan.yaml#0.metadata.name".to_owned())]
    );
    // __ in an export name, duplicates, bad characters
    assert_eq!(
        errors(&tool(
            "t",
            "    - {name: a__b, description: d}\n    - {name: x, description: d}\n    - {name: x, description: d}\n    - {name: 'a.b', description: d}\n"
        )),
        [
            ("E_CONFIG_SCHEMA_INVALID", "goondan.yaml#0.spec.exports[0].name".to_owned()),
            ("E_CONFIG_SCHEMA_INVALID", "goondan.yaml#0.spec.exports[2].name".to_owned()),
            ("E_CONFIG_SCHEMA_INVALID", "goondan.yaml#0.spec.exports[3].name".to_owned()),
        ]
    );
    // mixed case and missing description warn
    let diagnostics = load(&tool("t", "    - {name: setChatAction}\n"));
    assert!(diagnostics.iter().all(|d| d.severity == Severity::Warning), "{diagnostics:#?}");
    assert_eq!(diagnostics.len(), 2);
    // errorMessageLimit a positive integer
    let text = "apiVersion: goondan.ai/v1\nkind: Tool\nmetadata: {name: t}\nspec:\n  entry: ./t.ts\n  errorMessageLimit: LIMIT\n  exports: [{name: x, description: d}]\n";
    for bad in ["0", "-5", "1.5", "'100'"] {
        assert_eq!(
            errors(&text.replace("LIMIT", bad)),
            [("E_CONFIG_SCHEMA_INVALID", "goondan.yaml#0.spec.errorMessageLimit".to_owned())],
            "{bad}"
        );
    }
    assert!(errors(&text.replace("LIMIT", "1200")).is_empty());
    // parameters must be a valid object schema
    assert_eq!(
        errors(&tool("t", "    - {name: x, description: d, parameters: {type: string}}\n")),
        [("E_CONFIG_SCHEMA_INVALID", "goondan.yaml#0.spec.exports[0].parameters".to_owned())]
    );
    assert_eq!(
        errors(&tool(
            "t",
            "    - {name: x, description: d, parameters: {type: object, properties: {a: {type: nope}}}}\n"
        )),
        [("E_CONFIG_SCHEMA_INVALID", "goondan.yaml#0.spec.exports[0].parameters".to_owned())]
    );
    assert_eq!(
        errors(&tool("t", "    - {name: x, description: d, parameters: [1]}\n")),
        [("E_CONFIG_SCHEMA_INVALID", "goondan.yaml#0.spec.exports[0].parameters".to_owned())]
    );
}

#[test]
fn entry_files_must_exist() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let text = tool("t", "    - {name: x, description: d}\n");
    std::fs::write(dir.path().join("goondan.yaml"), &text).unwrap_or_else(|e| panic!("{e}"));
    let report = load_bundle(dir.path());
    assert_eq!(codes(&report.diagnostics)[0].0, "E_CONFIG_ENTRY_NOT_FOUND");
    std::fs::write(dir.path().join("t.ts"), "export const handlers = {};").unwrap_or_else(|e| panic!("{e}"));
    assert!(!load_bundle(dir.path()).has_errors());
    // The YAML file itself can also be named directly.
    assert!(!load_bundle(&dir.path().join("goondan.yaml")).has_errors());
}

#[test]
fn package_document_rules() {
    let package = "apiVersion: goondan.ai/v1\nkind: Package\nmetadata: {name: p}\nspec: {version: 1.0.0}\n";
    assert_eq!(
        errors(&format!("{MODEL}---\n{package}")),
        [("E_CONFIG_PACKAGE_DOC_POSITION", "goondan.yaml#1.kind".to_owned())]
    );
    assert_eq!(
        errors(&format!("{package}---\n{package}")),
        [("E_CONFIG_PACKAGE_DOC_DUPLICATED", "goondan.yaml#1.kind".to_owned())]
    );
}

#[test]
fn duplicate_names() {
    assert_eq!(
        errors(&format!("{MODEL}---\n{MODEL}")),
        [("E_CONFIG_DUPLICATE_NAME", "goondan.yaml#1.metadata.name".to_owned())]
    );
    // Same name, different kinds: fine.
    assert!(errors(&format!("{MODEL}---\n{}", tool("m", "    - {name: x, description: d}\n"))).is_empty());
}

#[test]
fn references() {
    let agent = |tools: &str| {
        format!(
            "{MODEL}---\napiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  modelConfig: {{modelRef: Model/m}}\n  tools: {tools}\n"
        )
    };
    assert!(errors(&agent("[{kind: Tool, name: bash, package: '@goondan/base'}]")).is_empty());
    assert!(errors(&agent("[{ref: {kind: Tool, name: wait, package: '@goondan/base'}}]")).is_empty());
    assert_eq!(errors(&agent("['Tool']")), [("E_CONFIG_INVALID_REF", "goondan.yaml#1.spec.tools[0]".to_owned())]);
    assert_eq!(errors(&agent("[Model/m]")), [("E_CONFIG_INVALID_REF", "goondan.yaml#1.spec.tools[0]".to_owned())]);
    let diagnostics = load(&agent("[Tool/bash]"));
    assert_eq!(codes(&diagnostics)[0].0, "E_CONFIG_REF_NOT_FOUND");
    let suggestion = diagnostics[0].suggestion.clone().unwrap_or_default();
    assert!(suggestion.contains("package: \"@goondan/base\""), "{suggestion}");
    assert_eq!(
        errors(&agent("[{kind: Tool, name: x, package: '@acme/tools'}]")),
        [("E_CONFIG_REF_NOT_FOUND", "goondan.yaml#1.spec.tools[0]".to_owned())]
    );
    assert_eq!(
        errors(&agent("[{kind: Tool, name: nope, package: '@goondan/base'}]")),
        [("E_CONFIG_REF_NOT_FOUND", "goondan.yaml#1.spec.tools[0]".to_owned())]
    );
    // Swarm: entryAgent must be one of agents.
    let swarm = format!(
        "{}---\napiVersion: goondan.ai/v1\nkind: Swarm\nmetadata: {{name: s}}\nspec: {{entryAgent: Agent/a, agents: [Agent/b]}}\n",
        agent("[]")
    );
    assert_eq!(
        errors(&swarm),
        [
            ("E_CONFIG_REF_NOT_FOUND", "goondan.yaml#2.spec.agents[0]".to_owned()),
            ("E_CONFIG_INVALID_REF", "goondan.yaml#2.spec.entryAgent".to_owned()),
        ]
    );
}

#[test]
fn agent_prompt_rules() {
    let text = format!(
        "{MODEL}---\napiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  modelConfig: {{modelRef: Model/m}}\n  prompt: {{system: x, systemRef: ./p.md}}\n"
    );
    assert_eq!(errors(&text), [("E_CONFIG_SCHEMA_INVALID", "goondan.yaml#1.spec.prompt".to_owned())]);
}

#[test]
fn file_and_document_limits() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let big = format!("# {}\n{MODEL}", "x".repeat(1024 * 1024));
    std::fs::write(dir.path().join("goondan.yaml"), big).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(codes(&load_bundle(dir.path()).diagnostics)[0].0, "E_CONFIG_FILE_TOO_LARGE");

    let many: Vec<String> = (0..101)
        .map(|i| {
            format!(
                "apiVersion: goondan.ai/v1\nkind: Model\nmetadata: {{name: m{i}}}\nspec: {{provider: a, model: b}}\n"
            )
        })
        .collect();
    assert_eq!(codes(&load(&many.join("---\n")))[0].0, "E_CONFIG_TOO_MANY_DOCUMENTS");
    assert!(errors(&many[..100].join("---\n")).is_empty());

    assert_eq!(codes(&load_bundle(Path::new("/no/such/dir")).diagnostics)[0].0, "E_CONFIG_FILE_NOT_FOUND");
}

#[test]
fn all_eight_kinds_parse() {
    let text = "\
apiVersion: goondan.ai/v1\nkind: Package\nmetadata: {name: '@me/pkg'}\nspec: {version: 0.1.0, dependencies: [{name: '@goondan/base', version: '^0.0.3'}]}\n---\n\
apiVersion: goondan.ai/v1\nkind: Model\nmetadata: {name: m}\nspec: {provider: anthropic, model: claude, apiKey: {valueFrom: {env: ANTHROPIC_API_KEY}}, endpoint: 'http://127.0.0.1:1'}\n---\n\
apiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {name: a}\nspec:\n  modelConfig: {modelRef: {kind: Model, name: m}, params: {temperature: 0.2, maxTokens: 100}}\n  extensions: [{kind: Extension, name: logging, package: '@goondan/base', config: {level: debug}}]\n---\n\
apiVersion: goondan.ai/v1\nkind: Swarm\nmetadata: {name: default}\nspec: {entryAgent: Agent/a, agents: [Agent/a], policy: {maxStepsPerTurn: 8, lifecycle: {ttlSeconds: 60}, shutdown: {gracePeriodSeconds: 5}}}\n---\n\
apiVersion: goondan.ai/v1\nkind: Extension\nmetadata: {name: e}\nspec: {entry: ./e.ts, config: {a: 1}}\n---\n\
apiVersion: goondan.ai/v1\nkind: Connector\nmetadata: {name: c}\nspec: {entry: ./c.ts, events: [{name: msg, properties: {text: {type: string}}}]}\n---\n\
apiVersion: goondan.ai/v1\nkind: Connection\nmetadata: {name: cx}\nspec: {connectorRef: Connector/c, swarmRef: Swarm/default, config: {PORT: {valueFrom: {env: PORT}}}, ingress: {rules: []}}\n";
    let report = load_from_str(text, "goondan.yaml", None, PathBuf::from("goondan.yaml"));
    assert!(!report.has_errors(), "{:#?}", report.diagnostics);
    let bundle = report.bundle.unwrap_or_else(|| panic!("bundle"));
    assert_eq!(bundle.resources().len(), 7);
    assert_eq!(bundle.package_name(), Some("@me/pkg"));
    let swarm = bundle.swarms().next().unwrap_or_else(|| panic!("swarm"));
    assert_eq!(swarm.spec.policy.max_steps_per_turn, Some(8));
    let agent = bundle.agent("a").unwrap_or_else(|| panic!("agent"));
    assert_eq!(agent.spec.extensions[0].config.as_ref().map(|c| c.len()), Some(1));
}

/// A bundle whose files sit in `dir/bundle`, beside a secret outside it.
fn bundle_with(dir: &Path, yaml: &str) -> PathBuf {
    let root = dir.join("bundle");
    std::fs::create_dir_all(&root).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(dir.join("secret.txt"), "outside").unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(root.join("inside.md"), "inside").unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(root.join("goondan.yaml"), yaml).unwrap_or_else(|e| panic!("{e}"));
    root
}

fn agent_with_system_ref(system_ref: &str) -> String {
    format!(
        "{MODEL}---\napiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  modelConfig: {{modelRef: Model/m}}\n  prompt: {{systemRef: '{system_ref}'}}\n"
    )
}

#[test]
fn file_references_must_stay_inside_the_bundle() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let outside = dir.path().join("secret.txt").to_string_lossy().into_owned();
    for reference in ["../secret.txt", "./x/../../secret.txt", outside.as_str()] {
        let root = bundle_with(dir.path(), &agent_with_system_ref(reference));
        let report = load_bundle(&root);
        let found: Vec<_> = report.diagnostics.iter().filter(|d| d.is_error()).collect();
        assert_eq!(found.len(), 1, "{reference}: {found:?}");
        assert_eq!(found[0].code, DiagnosticCode::PathOutsideBundle, "{reference}");
        assert_eq!(found[0].path, "goondan.yaml#1.spec.prompt.systemRef");
        assert!(found[0].message.contains(reference), "{}", found[0].message);
    }
    let root = bundle_with(dir.path(), &agent_with_system_ref("./inside.md"));
    assert!(!load_bundle(&root).has_errors());

    #[cfg(unix)]
    {
        // Inside by name, outside through a link: refused too, for entries as for prompts.
        let root = bundle_with(dir.path(), &agent_with_system_ref("link.md"));
        let _ = std::fs::remove_file(root.join("link.md"));
        std::os::unix::fs::symlink(dir.path().join("secret.txt"), root.join("link.md"))
            .unwrap_or_else(|e| panic!("{e}"));
        let codes: Vec<_> = load_bundle(&root).diagnostics.iter().map(|d| d.code).collect();
        assert_eq!(codes, [DiagnosticCode::PathOutsideBundle]);
        let tool = "apiVersion: goondan.ai/v1\nkind: Tool\nmetadata: {name: t}\nspec:\n  entry: ./link.md\n  exports: [{name: go, description: d, parameters: {type: object}}]\n";
        let root = bundle_with(dir.path(), tool);
        let found: Vec<_> = load_bundle(&root).diagnostics.into_iter().filter(Diagnostic::is_error).collect();
        assert_eq!(
            found.iter().map(|d| (d.code, d.path.as_str())).collect::<Vec<_>>(),
            [(DiagnosticCode::PathOutsideBundle, "goondan.yaml#0.spec.entry")],
            "{found:?}"
        );
    }
}

#[cfg(unix)]
#[test]
fn a_bundle_path_that_is_no_regular_file_is_refused_without_reading_it() {
    // /dev/zero never ends; reading it whole would grow without bound.
    let report = load_bundle(Path::new("/dev/zero"));
    assert_eq!(codes(&report.diagnostics)[0].0, "E_CONFIG_NOT_A_FILE");
    assert!(report.diagnostics[0].message.contains("a character device"), "{}", report.diagnostics[0].message);
    // Opening a FIFO for reading blocks until a writer comes: it must not be opened.
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let fifo = dir.path().join("goondan.yaml");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap_or_else(|e| panic!("mkfifo: {e}"));
    assert!(made.success());
    for path in [fifo.as_path(), dir.path()] {
        let report = load_bundle(path);
        assert_eq!(codes(&report.diagnostics)[0].0, "E_CONFIG_NOT_A_FILE", "{}", path.display());
        assert!(report.diagnostics[0].message.contains("FIFO"), "{}", report.diagnostics[0].message);
    }
}

/// A bundle with one Connection whose `ingress` is `ingress` (YAML, indented
/// under `spec:`), and the agent, swarm and connector it names.
fn connection_bundle(ingress: &str) -> String {
    format!(
        "{MODEL}---\napiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {{name: a}}\nspec: {{modelConfig: {{modelRef: Model/m}}}}\n---\n\
         apiVersion: goondan.ai/v1\nkind: Swarm\nmetadata: {{name: s}}\nspec: {{entryAgent: Agent/a, agents: [Agent/a]}}\n---\n\
         apiVersion: goondan.ai/v1\nkind: Connection\nmetadata: {{name: c}}\nspec:\n  connectorRef: {{kind: Connector, name: cli, package: \"@goondan/base\"}}\n  swarmRef: Swarm/s\n  ingress:\n{ingress}"
    )
}

/// Ingress rules the runtime could not follow as written are refused at
/// load, each naming its rule; good rules (the forms of the original's
/// samples and of this runtime's instance-key routes) load clean.
#[test]
fn ingress_rules_are_checked_at_load() {
    let table: &[(&str, &[&str])] = &[
        (
            "    rules:\n      - match: {event: stdin_message}\n        route: {agentRef: Agent/a, instanceKey: cli}\n",
            &[],
        ),
        ("    rules:\n      - route: {}\n", &[]),
        (
            "    rules:\n      - match: {event: m, properties: {chat: 42, dm: true, room: x}}\n        route: {instanceKeyProperty: chat, instanceKeyPrefix: \"tg:\"}\n",
            &[],
        ),
        ("    rules: {match: {event: x}}\n", &["spec.ingress.rules"]),
        ("    rules:\n      - match: {event: x}\n", &["spec.ingress.rules[0]"]),
        ("    rules:\n      - route: {instanceKey: k, instanceKeyProperty: p}\n", &["spec.ingress.rules[0].route"]),
        (
            "    rules:\n      - route: {instanceKeyPrefix: \"x:\"}\n",
            &["spec.ingress.rules[0].route.instanceKeyPrefix"],
        ),
        ("    rules:\n      - route: {instanceKey: \"\"}\n", &["spec.ingress.rules[0].route.instanceKey"]),
        ("    rules:\n      - match: {event: 7}\n        route: {}\n", &["spec.ingress.rules[0].match.event"]),
        (
            "    rules:\n      - match: {properties: {chat: [1]}}\n        route: {}\n",
            &["spec.ingress.rules[0].match.properties.chat"],
        ),
        (
            "    rules:\n      - route: {}\n      - route: {agentRef: Agent/missing}\n",
            &["spec.ingress.rules[1].route.agentRef"],
        ),
        ("    rules:\n      - route: {agentRef: 12}\n", &["spec.ingress.rules[0].route.agentRef"]),
    ];
    for (ingress, expected) in table {
        let found = errors(&connection_bundle(ingress));
        let paths: Vec<String> =
            found.iter().map(|(_, path)| path.trim_start_matches("goondan.yaml#3.").to_owned()).collect();
        assert_eq!(paths, *expected, "{ingress}\n{found:?}");
    }
}

/// `gdn validate` warns about a rule that matches an event the Connector
/// does not declare (`cli` emits only `stdin_message`), and about a route
/// to an agent outside the Connection's Swarm; the bundle still loads.
#[test]
fn ingress_mismatches_are_warnings() {
    let warnings = |ingress: &str| -> Vec<(String, String)> {
        load(ingress)
            .into_iter()
            .filter(|d| !d.is_error())
            .map(|d| (d.code.as_str().to_owned(), d.path.trim_start_matches("goondan.yaml#3.").to_owned()))
            .collect()
    };
    let clean = connection_bundle("    rules:\n      - match: {event: stdin_message}\n        route: {}\n");
    assert_eq!(warnings(&clean), []);
    assert!(errors(&clean).is_empty());
    let typo = connection_bundle("    rules:\n      - match: {event: stdin_mesage}\n        route: {}\n");
    assert_eq!(
        warnings(&typo),
        [("W_CONFIG_INGRESS_MISMATCH".to_owned(), "spec.ingress.rules[0].match.event".to_owned())]
    );
    assert!(errors(&typo).is_empty(), "a warning, not an error");
    let outside = format!(
        "{}---\napiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {{name: b}}\nspec: {{modelConfig: {{modelRef: Model/m}}}}\n",
        connection_bundle("    rules:\n      - route: {agentRef: Agent/b}\n")
    );
    assert_eq!(
        warnings(&outside),
        [("W_CONFIG_INGRESS_MISMATCH".to_owned(), "spec.ingress.rules[0].route.agentRef".to_owned())]
    );
}

/// A key the runtime does not know is never silent: a typo gets the
/// closest known key, a block at the wrong level is named, a field of an
/// older version says it is ignored; valid bundles get none.
#[test]
fn unknown_keys_are_warnings_with_a_hint() {
    let warnings = |text: &str| -> Vec<(String, String, String)> {
        load(text)
            .into_iter()
            .filter(|d| d.code.as_str() == "W_CONFIG_UNKNOWN_KEY")
            .map(|d| (d.path, d.message, d.suggestion.unwrap_or_default()))
            .collect()
    };
    let typo = "apiVersion: goondan.ai/v1\nkind: Model\nmetadata: {name: m}\nspec: {provder: openai, provider: openai, model: x}\n";
    assert_eq!(
        warnings(typo),
        [(
            "goondan.yaml#0.spec.provder".to_owned(),
            "spec.provder is not a field of a Model (it is ignored)".to_owned(),
            "Did you mean `provider`?".to_owned()
        )]
    );
    let misplaced = format!(
        "{MODEL}---\napiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  modelConfig:\n    modelRef: Model/m\n    tools: [Tool/bash]\n"
    );
    let found = warnings(&misplaced);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, "goondan.yaml#1.spec.modelConfig.tools");
    assert!(found[0].2.contains("modelRef") && found[0].2.contains("params"), "{found:?}");
    let legacy = tool("t", "    - name: x\n      description: d\n")
        .replace("  entry: ./t.ts\n", "  entry: ./t.ts\n  runtime: node\n");
    let found = warnings(&legacy);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].1.contains("older versions") && found[0].2.starts_with("Remove it"), "{found:?}");
    assert_eq!(warnings(&connection_bundle("    rules:\n      - route: {}\n")), []);
}

/// A reference into a package that names nothing there suggests the
/// closest of the package's resources and lists them, instead of advising
/// to define it in the bundle.
#[test]
fn a_package_reference_typo_suggests_the_packages_tools() {
    let text = format!(
        "{MODEL}---\napiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  modelConfig: {{modelRef: Model/m}}\n  tools:\n    - {{kind: Tool, name: bsh, package: \"@goondan/base\"}}\n"
    );
    let found: Vec<_> = load(&text).into_iter().filter(|d| d.code.as_str() == "E_CONFIG_REF_NOT_FOUND").collect();
    assert_eq!(found.len(), 1, "{found:?}");
    let help = found[0].suggestion.clone().unwrap_or_default();
    assert!(help.starts_with("Did you mean 'bash'? Tools of @goondan/base: "), "{help}");
    assert!(help.contains("file-system") && !help.contains("Define"), "{help}");
}

/// `Agent.spec.policy.toolCallScope` (spec 002 §7.1's explicit policy):
/// `catalog` when left out, `registry` when said, a known key (no unknown-key
/// warning), and any other value an error naming the allowed ones.
#[test]
fn agent_tool_call_scope_policy() {
    use goondan_config::ToolCallScope;
    let agent = |policy: &str| {
        format!(
            "{MODEL}---\napiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  modelConfig: {{modelRef: Model/m}}\n{policy}"
        )
    };
    let scope = |text: &str| {
        let report = load_from_str(text, "goondan.yaml", None, PathBuf::from("goondan.yaml"));
        assert!(report.diagnostics.is_empty(), "{:?}", report.diagnostics);
        report.bundle.and_then(|bundle| bundle.agent("a").map(|a| a.spec.policy.tool_call_scope))
    };
    assert_eq!(scope(&agent("")), Some(ToolCallScope::Catalog));
    assert_eq!(scope(&agent("  policy: {}\n")), Some(ToolCallScope::Catalog));
    assert_eq!(scope(&agent("  policy: {toolCallScope: catalog}\n")), Some(ToolCallScope::Catalog));
    assert_eq!(scope(&agent("  policy: {toolCallScope: registry}\n")), Some(ToolCallScope::Registry));

    let refused = load(&agent("  policy: {toolCallScope: everything}\n"));
    let found: Vec<(&str, &str, &str)> =
        refused.iter().map(|d| (d.code.as_str(), d.path.as_str(), d.message.as_str())).collect();
    assert_eq!(
        found,
        [(
            "E_CONFIG_SCHEMA_INVALID",
            "goondan.yaml#1.spec.policy.toolCallScope",
            "spec.policy.toolCallScope must be one of \"catalog\", \"registry\", got \"everything\""
        )]
    );
    let typo = load(&agent("  policy: {toolCallScop: registry}\n"));
    assert_eq!(
        codes(&typo),
        [("W_CONFIG_UNKNOWN_KEY", "goondan.yaml#1.spec.policy.toolCallScop".to_owned(), Severity::Warning)]
    );
}

/// The original's spec (resources §7.1): an Agent that needs a capability
/// its Model does not declare is refused at load.
#[test]
fn a_tool_using_agent_on_a_model_that_declares_no_tool_calling_is_refused() {
    let bundle = |capabilities: &str, tools: &str| {
        format!(
            "apiVersion: goondan.ai/v1\nkind: Model\nmetadata: {{name: m}}\nspec: {{provider: openai, model: x{capabilities}}}\n---\n\
             apiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  modelConfig: {{modelRef: Model/m}}\n{tools}"
        )
    };
    let tools = "  tools:\n    - {kind: Tool, name: bash, package: \"@goondan/base\"}\n";
    let refused = load(&bundle(", capabilities: {streaming: true}", tools));
    let found: Vec<_> = refused.iter().filter(|d| d.code == DiagnosticCode::ModelCapability).collect();
    assert_eq!(found.len(), 1, "{refused:?}");
    assert_eq!(found[0].path, "goondan.yaml#1.spec.tools");
    assert!(found[0].message.contains("Model 'm' does not declare toolCalling: true"), "{}", found[0].message);
    assert!(found[0].is_error());
    let refused = load(&bundle(", capabilities: {toolCalling: false}", tools));
    assert!(refused.iter().any(|d| d.code == DiagnosticCode::ModelCapability), "{refused:?}");
    // Declared, no capabilities at all (the original's samples), or no tools: accepted.
    for accepted in [
        bundle(", capabilities: {toolCalling: true, streaming: true}", tools),
        bundle("", tools),
        bundle(", capabilities: {streaming: true}", ""),
    ] {
        let diagnostics = load(&accepted);
        assert!(!diagnostics.iter().any(|d| d.code == DiagnosticCode::ModelCapability), "{accepted}: {diagnostics:?}");
    }
}

#[test]
fn a_swarm_lifecycle_ttl_is_a_positive_number_of_seconds_and_its_grace_any() {
    let swarm = |policy: &str| {
        format!(
            "apiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {{name: a}}\nspec: {{modelConfig: {{modelRef: Model/m}}}}\n---\n\
             apiVersion: goondan.ai/v1\nkind: Swarm\nmetadata: {{name: s}}\nspec: {{entryAgent: Agent/a, agents: [Agent/a], policy: {policy}}}\n---\n{MODEL}"
        )
    };
    // 0 would expire every instance the moment its turn ends: never meant.
    let refused = load(&swarm("{lifecycle: {ttlSeconds: 0}}"));
    let refused: Vec<_> = refused.iter().filter(|d| d.is_error()).collect();
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert_eq!(refused[0].code.as_str(), "E_CONFIG_SCHEMA_INVALID");
    assert_eq!(refused[0].path, "goondan.yaml#1.spec.policy.lifecycle.ttlSeconds");
    assert!(refused[0].message.contains('1'), "{}", refused[0].message);
    for bad in ["-1", "1.5", "'60'"] {
        let errors = errors(&swarm(&format!("{{lifecycle: {{ttlSeconds: {bad}}}}}")));
        assert_eq!(errors.len(), 1, "{bad}: {errors:?}");
    }
    assert!(
        errors(&swarm("{lifecycle: {ttlSeconds: 1, gcGraceSeconds: 0}, shutdown: {gracePeriodSeconds: 0}}")).is_empty()
    );
    assert_eq!(errors(&swarm("{lifecycle: {gcGraceSeconds: -1}}")).len(), 1);
}
