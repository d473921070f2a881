//! `spec.sandbox` of Agents and Swarms through the public loading API:
//! parsing, defaults, which one an agent gets, and every validation rule.

use std::path::{Path, PathBuf};

use goondan_config::{
    Diagnostic, DiagnosticCode, LimitBound, SandboxConfig, SandboxLimits, SandboxNetwork, SandboxPolicy, SandboxSource,
    Severity, load_bundle,
};

mod common;
use common::{load, summary, valid};

const MODEL: &str =
    "apiVersion: goondan.ai/v1\nkind: Model\nmetadata: {name: m}\nspec: {provider: openai, model: gpt-4o}\n";

fn agent(name: &str, sandbox: &str) -> String {
    format!(
        "---\napiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {{name: {name}}}\nspec:\n  modelConfig: {{modelRef: Model/m}}\n{}",
        indent(sandbox)
    )
}

fn swarm(name: &str, entry: &str, agents: &[&str], sandbox: &str) -> String {
    let agents: Vec<String> = agents.iter().map(|a| format!("Agent/{a}")).collect();
    format!(
        "---\napiVersion: goondan.ai/v1\nkind: Swarm\nmetadata: {{name: {name}}}\nspec:\n  entryAgent: Agent/{entry}\n  agents: [{}]\n{}",
        agents.join(", "),
        indent(sandbox)
    )
}

/// `sandbox` (YAML under `spec`), indented by two spaces.
fn indent(sandbox: &str) -> String {
    sandbox.lines().map(|line| format!("  {line}\n")).collect()
}

/// The diagnostics of a bundle holding one Agent with `sandbox`.
fn agent_diagnostics(sandbox: &str) -> Vec<Diagnostic> {
    load(&format!("{MODEL}{}", agent("a", sandbox))).diagnostics
}

fn one(sandbox: &str) -> Diagnostic {
    let diagnostics = agent_diagnostics(sandbox);
    let [only] = diagnostics.as_slice() else { panic!("{sandbox}: {diagnostics:#?}") };
    only.clone()
}

#[test]
fn bundles_without_a_sandbox_load_as_before_and_get_the_default() {
    let bundle = valid(&format!("{MODEL}{}{}", agent("a", ""), swarm("s", "a", &["a"], "")));
    let Some(a) = bundle.agent("a") else { panic!("agent a") };
    assert_eq!(a.spec.sandbox, None);
    let effective = bundle.sandbox_for("a", None);
    assert_eq!(effective.source, SandboxSource::Default);
    assert_eq!(effective.config, SandboxConfig::default());
    assert_eq!(effective.config.policy, SandboxPolicy::WorkspaceWrite);
    assert_eq!(effective.config.policy.as_str(), "workspace-write");
    assert!(effective.config.readable.is_empty() && effective.config.writable.is_empty());
    assert!(effective.config.network.allow.is_empty());
}

#[test]
fn every_field_parses() {
    let bundle = valid(&format!(
        "{MODEL}{}",
        agent(
            "a",
            "sandbox:\n  policy: read-only\n  readable: [/opt/data, ~/datasets, ./vendor]\n  writable: [/srv/out]\n  network:\n    allow: [\"api.example.com:443\", \"127.0.0.1:8080\", \"[::1]:9000\"]"
        )
    ));
    let Some(a) = bundle.agent("a") else { panic!("agent a") };
    assert_eq!(
        a.spec.sandbox,
        Some(SandboxConfig {
            policy: SandboxPolicy::ReadOnly,
            readable: vec!["/opt/data".into(), "~/datasets".into(), "./vendor".into()],
            writable: vec!["/srv/out".into()],
            network: SandboxNetwork {
                allow: vec!["api.example.com:443".into(), "127.0.0.1:8080".into(), "[::1]:9000".into()]
            },
            limits: SandboxLimits::default(),
        })
    );
    let Ok(targets) = bundle.sandbox_for("a", None).config.network.targets() else { panic!("targets") };
    let shown: Vec<String> = targets.iter().map(ToString::to_string).collect();
    assert_eq!(shown, ["api.example.com:443", "127.0.0.1:8080", "[::1]:9000"]);
}

#[test]
fn each_policy_parses_and_an_empty_mapping_is_the_default() {
    for policy in SandboxPolicy::ALL {
        let bundle = valid(&format!("{MODEL}{}", agent("a", &format!("sandbox: {{policy: {policy}}}"))));
        assert_eq!(bundle.sandbox_for("a", None).config.policy, policy);
        assert_eq!(SandboxPolicy::parse(policy.as_str()), Some(policy));
    }
    let bundle = valid(&format!("{MODEL}{}", agent("a", "sandbox: {}")));
    let effective = bundle.sandbox_for("a", None);
    assert_eq!((effective.config, effective.source), (SandboxConfig::default(), SandboxSource::Agent));
    assert_eq!(
        SandboxPolicy::ALL.map(SandboxPolicy::as_str),
        ["read-only", "workspace-write", "full"],
        "the YAML spellings"
    );
}

#[test]
fn the_swarm_sets_the_default_and_an_agent_replaces_it_whole() {
    let bundle = valid(&format!(
        "{MODEL}{}{}{}",
        agent("lead", ""),
        agent("coder", "sandbox:\n  policy: full"),
        swarm(
            "crew",
            "lead",
            &["lead", "coder"],
            "sandbox:\n  policy: read-only\n  writable: [/srv/out]\n  network: {allow: [\"api.example.com:443\"]}"
        )
    ));
    let lead = bundle.sandbox_for("lead", None);
    assert_eq!(lead.source, SandboxSource::Swarm("crew".to_owned()));
    assert_eq!(lead.config.policy, SandboxPolicy::ReadOnly);
    assert_eq!(lead.config.writable, ["/srv/out"]);
    // The agent's own replaces the Swarm's whole: no writable, no network
    // carried over from the Swarm.
    let coder = bundle.sandbox_for("coder", Some("crew"));
    assert_eq!(coder.source, SandboxSource::Agent);
    assert_eq!(coder.config, SandboxConfig { policy: SandboxPolicy::Full, ..SandboxConfig::default() });
    assert_eq!(lead.source.to_string(), "Swarm crew");
    assert_eq!(coder.source.to_string(), "its own spec.sandbox");
}

#[test]
fn an_agent_in_several_swarms_gets_the_one_named_else_the_one_it_would_run_in() {
    // `helper` is listed by `first` and by `second`, and is the entry of
    // `second`: `gdn run --agent helper` runs `second`.
    let bundle = valid(&format!(
        "{MODEL}{}{}{}{}{}",
        agent("lead", ""),
        agent("helper", ""),
        agent("loner", ""),
        swarm("first", "lead", &["lead", "helper"], "sandbox: {policy: read-only}"),
        swarm("second", "helper", &["helper"], "sandbox: {policy: full}")
    ));
    let Some(runs_in) = bundle.swarm_of_agent("helper") else { panic!("helper's swarm") };
    assert_eq!(runs_in.name(), "second", "the Swarm whose entry it is comes first");
    assert_eq!(bundle.sandbox_for("helper", None).source, SandboxSource::Swarm("second".to_owned()));
    assert_eq!(bundle.sandbox_for("helper", None).config.policy, SandboxPolicy::Full);
    // Named, the Swarm of the run wins.
    let in_first = bundle.sandbox_for("helper", Some("first"));
    assert_eq!(
        (in_first.source, in_first.config.policy),
        (SandboxSource::Swarm("first".to_owned()), SandboxPolicy::ReadOnly)
    );
    // An agent that is nobody's entry: the first Swarm listing it.
    assert_eq!(bundle.sandbox_for("lead", None).source, SandboxSource::Swarm("first".to_owned()));
    let listing: Vec<&str> = bundle.swarms_listing("helper").iter().map(|s| s.resource.name()).collect();
    assert_eq!(listing, ["first", "second"]);
    // A Swarm name the bundle lacks (an agent running alone is given its
    // own name) counts as none named; an agent in no Swarm: the default.
    assert_eq!(bundle.sandbox_for("loner", Some("loner")).source, SandboxSource::Default);
    assert_eq!(bundle.sandbox_for("helper", Some("nope")).source, SandboxSource::Swarm("second".to_owned()));
}

#[test]
fn a_swarm_without_a_sandbox_leaves_the_default() {
    let bundle = valid(&format!("{MODEL}{}{}", agent("a", ""), swarm("s", "a", &["a"], "")));
    assert_eq!(bundle.sandbox_for("a", Some("s")).source, SandboxSource::Default);
}

#[test]
fn a_misspelt_policy_is_an_error_naming_the_allowed_values() {
    for (written, suggested) in [
        ("workspace_write", "Did you mean `workspace-write`?"),
        ("readonly", "Did you mean `read-only`?"),
        ("Full", "Did you mean `full`?"),
        ("none", "write `policy: full`"),
        ("sandboxed", "Write one of read-only, workspace-write, full."),
    ] {
        let diagnostic = one(&format!("sandbox: {{policy: {written}}}"));
        assert_eq!(diagnostic.code, DiagnosticCode::SandboxPolicyInvalid, "{written}");
        assert_eq!(diagnostic.code.as_str(), "E_CONFIG_SANDBOX_POLICY");
        assert_eq!(diagnostic.severity, Severity::Error);
        assert_eq!(diagnostic.path, "goondan.yaml#1.spec.sandbox.policy");
        assert_eq!(
            diagnostic.message,
            format!("sandbox policy '{written}' is not one of read-only, workspace-write, full")
        );
        let suggestion = diagnostic.suggestion.unwrap_or_default();
        assert!(suggestion.contains(suggested), "{written}: {suggestion}");
        assert!(diagnostic.line.is_some(), "a position");
    }
    let diagnostic = one("sandbox: {policy: 3}");
    assert_eq!(diagnostic.code, DiagnosticCode::SandboxPolicyInvalid);
    assert!(diagnostic.message.contains("got integer"), "{}", diagnostic.message);
    // The Swarm's is checked alike, and the bundle keeps no Swarm that failed.
    let report = load(&format!("{MODEL}{}{}", agent("a", ""), swarm("s", "a", &["a"], "sandbox:\n  policy: none")));
    assert_eq!(
        summary(&report.diagnostics),
        [("E_CONFIG_SANDBOX_POLICY", "goondan.yaml#2.spec.sandbox.policy".to_owned(), Severity::Error)]
    );
}

#[test]
fn unknown_keys_under_sandbox_and_network_are_errors() {
    let diagnostics = agent_diagnostics("sandbox:\n  polcy: full\n  network:\n    allow: []\n    deny: [\"x:1\"]");
    assert_eq!(
        summary(&diagnostics),
        [
            ("E_CONFIG_SANDBOX_INVALID", "goondan.yaml#1.spec.sandbox.polcy".to_owned(), Severity::Error),
            ("E_CONFIG_SANDBOX_INVALID", "goondan.yaml#1.spec.sandbox.network.deny".to_owned(), Severity::Error),
        ],
        "errors, and no W_CONFIG_UNKNOWN_KEY besides"
    );
    assert_eq!(diagnostics[0].suggestion.as_deref(), Some("Did you mean `policy`?"));
    assert_eq!(diagnostics[1].suggestion.as_deref(), Some("The keys of spec.sandbox.network: allow."));
}

#[test]
fn values_of_the_wrong_shape_are_errors() {
    for (sandbox, path, words) in [
        ("sandbox: full", "spec.sandbox", "Write `sandbox: {policy: full}`."),
        ("sandbox:", "spec.sandbox", "must be a mapping, got null"),
        ("sandbox: {readable: /opt/data}", "spec.sandbox.readable", "Write a list: `readable: [/opt/data]`."),
        ("sandbox: {writable: [3]}", "spec.sandbox.writable[0]", "must be a path (a string), got integer"),
        ("sandbox: {writable: [~]}", "spec.sandbox.writable[0]", "A bare ~ is null in YAML: quote it, \"~\""),
        ("sandbox: {network: [\"a:1\"]}", "spec.sandbox.network", "must be a mapping, got array"),
        (
            "sandbox: {network: {allow: \"a.com:443\"}}",
            "spec.sandbox.network.allow",
            "Write a list: `allow: [\"a.com:443\"]`.",
        ),
    ] {
        let diagnostic = one(sandbox);
        assert_eq!(diagnostic.code, DiagnosticCode::SandboxInvalid, "{sandbox}");
        assert_eq!(diagnostic.path, format!("goondan.yaml#1.{path}"), "{sandbox}");
        let text = format!("{} — {}", diagnostic.message, diagnostic.suggestion.unwrap_or_default());
        assert!(text.contains(words), "{sandbox}: {text}");
    }
}

#[test]
fn empty_paths_and_other_users_homes_are_errors() {
    let diagnostics = agent_diagnostics("sandbox:\n  readable: [\"\", ok, \"  \"]\n  writable: [\"~bob/out\"]");
    assert_eq!(
        summary(&diagnostics),
        [
            ("E_CONFIG_SANDBOX_INVALID", "goondan.yaml#1.spec.sandbox.readable[0]".to_owned(), Severity::Error),
            ("E_CONFIG_SANDBOX_INVALID", "goondan.yaml#1.spec.sandbox.readable[2]".to_owned(), Severity::Error),
            ("E_CONFIG_SANDBOX_INVALID", "goondan.yaml#1.spec.sandbox.writable[0]".to_owned(), Severity::Error),
        ]
    );
    assert!(diagnostics[0].message.contains("an empty path"), "{}", diagnostics[0].message);
    assert!(diagnostics[2].message.contains("not ~name"), "{}", diagnostics[2].message);
}

#[test]
fn allow_entries_must_be_host_port() {
    let diagnostics = agent_diagnostics(
        "sandbox:\n  network:\n    allow:\n      - api.example.com:443\n      - https://api.example.com\n      - api.example.com\n      - api.example.com:443/v1\n      - 127.0.0.1:70000\n      - \"::1:9000\"\n      - \"[::1]:9000\"\n      - 8080",
    );
    let paths: Vec<(&str, String)> = diagnostics.iter().map(|d| (d.code.as_str(), d.path.clone())).collect();
    let expected: Vec<(&str, String)> = [1, 2, 3, 4, 5, 7]
        .iter()
        .map(|i| ("E_CONFIG_SANDBOX_NETWORK", format!("goondan.yaml#1.spec.sandbox.network.allow[{i}]")))
        .collect();
    assert_eq!(paths, expected, "{diagnostics:#?}");
    let messages: Vec<&str> = diagnostics.iter().map(|d| d.message.as_str()).collect();
    assert!(messages[0].contains("has a scheme"), "{}", messages[0]);
    assert!(messages[1].contains("has no port"), "{}", messages[1]);
    assert!(messages[2].contains("has a path"), "{}", messages[2]);
    assert!(messages[3].contains("port '70000' is not a number from 1 to 65535"), "{}", messages[3]);
    assert!(messages[4].contains("must be in brackets"), "{}", messages[4]);
    assert!(messages[5].contains("must be a string, got integer"), "{}", messages[5]);
}

#[test]
fn settings_full_ignores_are_warnings() {
    let diagnostics = agent_diagnostics(
        "sandbox:\n  policy: full\n  readable: [/opt]\n  writable: [/]\n  network: {allow: [\"api.example.com:443\"]}",
    );
    assert_eq!(
        summary(&diagnostics),
        [
            ("W_CONFIG_SANDBOX_IGNORED", "goondan.yaml#1.spec.sandbox.network.allow".to_owned(), Severity::Warning),
            ("W_CONFIG_SANDBOX_IGNORED", "goondan.yaml#1.spec.sandbox.readable".to_owned(), Severity::Warning),
            ("W_CONFIG_SANDBOX_IGNORED", "goondan.yaml#1.spec.sandbox.writable".to_owned(), Severity::Warning),
        ],
        "and no W_CONFIG_SANDBOX_WIDE: under full nothing is confined anyway"
    );
    assert!(diagnostics[0].message.contains("full has no network limit"), "{}", diagnostics[0].message);
    assert!(agent_diagnostics("sandbox: {policy: full}").is_empty());
    assert!(
        agent_diagnostics("sandbox: {policy: full, network: {allow: []}}").is_empty(),
        "an empty list asks nothing"
    );
}

#[test]
fn writable_slash_or_home_is_a_warning_and_leaving_the_bundle_is_fine() {
    let diagnostics =
        agent_diagnostics("sandbox:\n  writable: [/, \"~\", \"~/\", /srv/.., ~/out, /srv/out, ../shared]");
    assert_eq!(
        summary(&diagnostics),
        [
            ("W_CONFIG_SANDBOX_WIDE", "goondan.yaml#1.spec.sandbox.writable[0]".to_owned(), Severity::Warning),
            ("W_CONFIG_SANDBOX_WIDE", "goondan.yaml#1.spec.sandbox.writable[1]".to_owned(), Severity::Warning),
            ("W_CONFIG_SANDBOX_WIDE", "goondan.yaml#1.spec.sandbox.writable[2]".to_owned(), Severity::Warning),
            ("W_CONFIG_SANDBOX_WIDE", "goondan.yaml#1.spec.sandbox.writable[3]".to_owned(), Severity::Warning),
        ]
    );
    assert!(diagnostics[0].message.contains("is the whole file system"), "{}", diagnostics[0].message);
    assert!(diagnostics[1].message.contains("is your home directory"), "{}", diagnostics[1].message);
    // `readable` may be anything: it only reads.
    assert!(agent_diagnostics("sandbox:\n  readable: [/, \"~\"]").is_empty());
}

#[test]
fn relative_writable_paths_are_judged_from_the_bundle_directory() -> std::io::Result<()> {
    let dir = tempfile::tempdir()?;
    let depth = dir.path().components().count();
    let up = vec![".."; depth + 2].join("/");
    let text = format!("{MODEL}{}", agent("a", &format!("sandbox:\n  writable: [\"{up}\", ../out, ./out]")));
    std::fs::write(dir.path().join("goondan.yaml"), text)?;
    let report = load_bundle(dir.path());
    assert_eq!(
        summary(&report.diagnostics),
        [("W_CONFIG_SANDBOX_WIDE", "goondan.yaml#1.spec.sandbox.writable[0]".to_owned(), Severity::Warning)],
        "climbing to / is wide; ../out, outside the bundle, is fine"
    );
    let Some(bundle) = report.bundle else { panic!("bundle") };
    let config = bundle.sandbox_for("a", None).config;
    let Ok(paths) = config.writable_paths(bundle.root(), Some(Path::new("/home/ada"))) else { panic!("paths") };
    assert_eq!(paths[0], PathBuf::from("/"));
    let Some(parent) = dir.path().parent() else { panic!("parent") };
    assert_eq!(paths[1], parent.join("out"));
    assert_eq!(paths[2], dir.path().join("out"));
    Ok(())
}

#[test]
fn problems_of_every_kind_are_reported_in_one_pass_and_the_agent_is_not_kept() {
    let report = load(&format!(
        "{MODEL}{}",
        agent("a", "sandbox:\n  policy: workspace_write\n  extra: 1\n  readable: [\"\"]\n  network: {allow: [nope]}")
    ));
    let codes: Vec<&str> = report.diagnostics.iter().map(|d| d.code.as_str()).collect();
    assert_eq!(
        codes,
        ["E_CONFIG_SANDBOX_INVALID", "E_CONFIG_SANDBOX_POLICY", "E_CONFIG_SANDBOX_INVALID", "E_CONFIG_SANDBOX_NETWORK"]
    );
    let Some(bundle) = report.bundle else { panic!("bundle") };
    assert!(bundle.agent("a").is_none(), "a document with errors becomes no resource");
}

#[test]
fn limits_parse_with_units_and_unlimited() {
    let bundle = valid(&format!(
        "{MODEL}{}",
        agent("a", "sandbox:\n  limits: {processes: 256, fileSize: 1GiB, memory: unlimited}")
    ));
    let Some(a) = bundle.agent("a") else { panic!("agent a") };
    let Some(sandbox) = &a.spec.sandbox else { panic!("no sandbox") };
    assert_eq!(
        sandbox.limits,
        SandboxLimits {
            processes: Some(LimitBound::At(256)),
            file_size: Some(LimitBound::At(1 << 30)),
            memory: Some(LimitBound::Unlimited),
        }
    );
    let report = load(&format!("{MODEL}{}", agent("b", "sandbox:\n  limits: {fileSize: 10485760}")));
    assert!(report.diagnostics.is_empty(), "{:#?}", report.diagnostics);
}

#[test]
fn bad_limits_are_errors_saying_what_to_write() {
    let cases = [
        ("sandbox:\n  limits: 512", "spec.sandbox.limits", "must be a mapping"),
        ("sandbox:\n  limits: {procs: 5}", "spec.sandbox.limits.procs", "not a sandbox setting"),
        ("sandbox:\n  limits: {processes: 0}", "spec.sandbox.limits.processes", "less than the smallest bound"),
        ("sandbox:\n  limits: {processes: many}", "spec.sandbox.limits.processes", "not a whole number"),
        ("sandbox:\n  limits: {fileSize: 1G}", "spec.sandbox.limits.fileSize", "ambiguous"),
        ("sandbox:\n  limits: {fileSize: 1 gigabyte}", "spec.sandbox.limits.fileSize", "is not a size"),
        ("sandbox:\n  limits: {memory: 100}", "spec.sandbox.limits.memory", "less than the smallest bound, 16 MiB"),
        ("sandbox:\n  limits: {memory: [1]}", "spec.sandbox.limits.memory", "must be a number or a string"),
    ];
    for (sandbox, path, words) in cases {
        let diagnostic = one(sandbox);
        let path = format!("goondan.yaml#1.{path}");
        assert_eq!(
            (diagnostic.code, diagnostic.path.as_str()),
            (DiagnosticCode::SandboxInvalid, path.as_str()),
            "{sandbox}"
        );
        assert!(diagnostic.message.contains(words), "{sandbox}: {}", diagnostic.message);
        assert!(diagnostic.suggestion.is_some(), "{sandbox}");
    }
}

#[test]
fn limits_under_policy_full_are_a_warning() {
    let diagnostic = one("sandbox:\n  policy: full\n  limits: {processes: 64}");
    assert_eq!((diagnostic.code, diagnostic.severity), (DiagnosticCode::SandboxIgnored, Severity::Warning));
    assert_eq!(diagnostic.path, "goondan.yaml#1.spec.sandbox.limits");
}
