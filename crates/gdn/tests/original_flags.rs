//! The original `gdn`'s flags that ours once rejected (issue 37, item 1),
//! each through the real binary with the original's meaning: `run
//! BUNDLE_PATH`, `-s`, `--foreground`, `--interactive`, `--no-install`;
//! `validate PATH`, `--fix`; `init -t/-n/-f/--git/--no-git` and the
//! `package` and `minimal` templates; `instance list -a/-n/--all`; `logs
//! -i/-a/-l/-p/--stream`; `restart -a`; `instance delete -f`; `package
//! publish PATH`.

mod common;

use std::path::Path;
use std::process::Output;

use goondan_test_support::{Agent, Bundle, reply_text, stderr, stdout};

/// Two Swarms: `default` entered at `lead`, `other` entered at `solo`.
fn bundle() -> Bundle {
    agents().swarm("default", "lead", &["lead"]).swarm("other", "solo", &["solo"])
}

/// The agents `lead` and `solo`, each answering with its name.
fn agents() -> Bundle {
    Bundle::new()
        .scripted_model_as("lead-model", "lead", serde_json::json!({"replies": [reply_text("lead answered")]}))
        .scripted_model_as("solo-model", "solo", serde_json::json!({"replies": [reply_text("solo answered")]}))
        .agent(Agent::new("lead", "lead-model"))
        .agent(Agent::new("solo", "solo-model"))
}

/// `gdn ARGS` in `cwd`, no -c, state root `state`.
fn gdn_in(cwd: &Path, state: &Path, args: &[&str]) -> Output {
    common::gdn_bin().state(state).command(args).current_dir(cwd).output().unwrap_or_else(|e| panic!("gdn: {e}"))
}

fn ok(output: &Output) -> String {
    assert_eq!(output.status.code(), Some(0), "stdout:\n{}\nstderr:\n{}", stdout(output), stderr(output));
    stdout(output)
}

fn path(path: &Path) -> &str {
    path.to_str().unwrap_or_else(|| panic!("not UTF-8: {}", path.display()))
}

#[test]
fn run_takes_the_bundle_path_short_swarm_and_the_accepted_flags() {
    let dir = common::temp();
    let project = dir.path().join("project");
    let state = dir.path().join("state");
    bundle().write(&project).unwrap_or_else(|e| panic!("{e}"));
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap_or_else(|e| panic!("{e}"));

    // The positional path, from a directory that is no bundle.
    let out = ok(&gdn_in(&elsewhere, &state, &["run", path(&project), "--input", "hi"]));
    assert!(out.contains("lead answered"), "{out}");
    // It wins over -c, as the original's `bundlePath ?? config`.
    let missing = dir.path().join("missing");
    let out = ok(&gdn_in(&elsewhere, &state, &["-c", path(&missing), "run", path(&project), "--input", "hi"]));
    assert!(out.contains("lead answered"), "{out}");
    // Without it, the default ./goondan.yaml of `elsewhere` is not there.
    let none = gdn_in(&elsewhere, &state, &["run", "--input", "hi"]);
    assert_ne!(none.status.code(), Some(0), "{}", stdout(&none));

    // -s is --swarm.
    let out = ok(&gdn_in(&elsewhere, &state, &["run", path(&project), "-s", "other", "--input", "hi"]));
    assert!(out.contains("solo answered") && !out.contains("lead answered"), "{out}");
    let nosuch = gdn_in(&elsewhere, &state, &["run", path(&project), "-s", "nosuch", "--input", "hi"]);
    assert_ne!(nosuch.status.code(), Some(0));
    assert!(stderr(&nosuch).contains("nosuch"), "{}", stderr(&nosuch));

    // --foreground (our default), --interactive and --no-install (no effect
    // in the original either) change nothing.
    let out = ok(&gdn_in(
        &elsewhere,
        &state,
        &["run", path(&project), "--foreground", "--interactive", "--no-install", "--input", "hi"],
    ));
    assert!(out.contains("lead answered"), "{out}");
    // --foreground says the opposite of --detach.
    let both = gdn_in(&elsewhere, &state, &["run", path(&project), "--foreground", "--detach"]);
    assert_eq!(both.status.code(), Some(2), "{}", stderr(&both));
    assert!(stderr(&both).contains("--detach"), "{}", stderr(&both));
}

#[test]
fn validate_takes_a_path_and_fix_adds_the_missing_api_version() {
    let dir = common::temp();
    let good = dir.path().join("good");
    bundle().write(&good).unwrap_or_else(|e| panic!("{e}"));
    let bad = dir.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap_or_else(|e| panic!("{e}"));
    // Comments, quoting, a flow mapping and an indented document: all kept.
    let before = "# my project\nkind: Model   # the model\nmetadata:\n  name: m\nspec:\n  provider: scripted\n  model: \"m\"\n  options: {replies: [{text: hi}]}\n---\napiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {name: a}\nspec:\n  modelConfig:\n    modelRef: Model/m\n  prompt:\n    system: hi\n--- # the swarm\n\n  kind: Swarm\n  metadata:\n    name: s\n  spec:\n    entryAgent: Agent/a\n    agents: [Agent/a]\n";
    common::write(&bad.join("goondan.yaml"), before);
    let state = dir.path().join("state");

    // PATH as -c; it wins over -c.
    ok(&gdn_in(dir.path(), &state, &["validate", path(&good)]));
    let checked = gdn_in(dir.path(), &state, &["-c", path(&good), "validate", path(&bad)]);
    assert_eq!(checked.status.code(), Some(4), "{}", stdout(&checked));
    assert!(stdout(&checked).contains("`gdn validate --fix` adds it"), "{}", stdout(&checked));
    assert_eq!(std::fs::read_to_string(bad.join("goondan.yaml")).unwrap_or_default(), before, "no --fix: unchanged");

    let fixed = gdn_in(dir.path(), &state, &["validate", path(&bad), "--fix"]);
    let out = ok(&fixed);
    let after = std::fs::read_to_string(bad.join("goondan.yaml")).unwrap_or_default();
    let expected = before.replacen("# my project\n", "# my project\napiVersion: goondan.ai/v1\n", 1).replacen(
        "\n  kind: Swarm",
        "\n  apiVersion: goondan.ai/v1\n  kind: Swarm",
        1,
    );
    assert_eq!(after, expected, "exactly two lines added");
    let file = bad.join("goondan.yaml");
    assert!(
        out.contains(&format!("fixed {}:2: added `apiVersion: goondan.ai/v1` to Model/m", file.display())),
        "{out}"
    );
    assert!(
        out.contains(&format!("fixed {}:21: added `apiVersion: goondan.ai/v1` to Swarm/s", file.display())),
        "{out}"
    );
    let lines: Vec<&str> = after.lines().collect();
    assert_eq!((lines[1], lines[20]), ("apiVersion: goondan.ai/v1", "  apiVersion: goondan.ai/v1"));

    // Again: nothing to do, nothing written.
    let again = ok(&gdn_in(dir.path(), &state, &["--json", "validate", path(&bad), "--fix"]));
    let body: serde_json::Value = serde_json::from_str(&again).unwrap_or_else(|e| panic!("{e}: {again}"));
    assert_eq!(body["fix"]["fixed"], serde_json::json!([]), "{body}");
    assert_eq!(body["valid"], true);
    assert_eq!(std::fs::read_to_string(&file).unwrap_or_default(), expected);

    // A flow-style document is named, not changed.
    let flow = dir.path().join("flow.yaml");
    let text = "{kind: Model, metadata: {name: m}, spec: {provider: scripted, model: m}}\n";
    common::write(&flow, text);
    let out = stdout(&gdn_in(dir.path(), &state, &["validate", path(&flow), "--fix"]));
    assert!(out.contains(&format!("not fixed {}:1", flow.display())), "{out}");
    assert_eq!(std::fs::read_to_string(&flow).unwrap_or_default(), text);
}

#[test]
fn init_takes_the_original_templates_name_force_and_git() {
    let dir = common::temp();
    let state = dir.path().join("state");
    let files = |project: &Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(project)
            .unwrap_or_else(|e| panic!("{e}"))
            .filter_map(Result::ok)
            .map(|entry| entry.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };

    // Default: a git repository, as the original.
    let plain = dir.path().join("plain");
    let out = ok(&gdn_in(dir.path(), &state, &["init", path(&plain), "-n", "@me/named"]));
    assert!(out.contains("Git repository initialized"), "{out}");
    assert!(plain.join(".git").is_dir());
    let yaml = std::fs::read_to_string(plain.join("goondan.yaml")).unwrap_or_default();
    assert!(yaml.contains("kind: Package\nmetadata:\n  name: \"@me/named\""), "{yaml}");

    // Inside a repository, no nested one.
    let repository = dir.path().join("repository");
    std::fs::create_dir_all(&repository).unwrap_or_else(|e| panic!("{e}"));
    let git = std::process::Command::new("git").args(["init", "--quiet"]).current_dir(&repository).status();
    assert!(git.is_ok_and(|status| status.success()), "git init");
    let nested = repository.join("sub");
    let out = ok(&gdn_in(dir.path(), &state, &["init", path(&nested), "--git", "-t", "minimal"]));
    assert!(out.contains("already inside a git repository") && !nested.join(".git").exists(), "{out}");
    assert_eq!(files(&nested), ["goondan.yaml"]);

    let package = dir.path().join("package");
    ok(&gdn_in(dir.path(), &state, &["init", path(&package), "-t", "package", "--no-git"]));
    assert_eq!(files(&package), [".env", ".gitignore", "goondan.schema.json", "goondan.yaml"]);
    assert!(std::fs::read_to_string(package.join(".gitignore")).unwrap_or_default().contains("dist/"));
    // `package publish PATH` (the original's form) publishes that bundle; it wins over -c.
    let missing = dir.path().join("missing");
    let registry = "http://127.0.0.1:9";
    let args = ["-c", path(&missing), "package", "publish", path(&package), "--dry-run", "--registry", registry];
    let out = ok(&gdn_in(dir.path(), &state, &args));
    assert!(out.contains("Dry-run publish checked package@0.1.0"), "{out}");
    // --git after --no-git: the last one counts.
    let both = dir.path().join("both");
    ok(&gdn_in(dir.path(), &state, &["init", path(&both), "--no-git", "--git"]));
    assert!(both.join(".git").is_dir());

    // Every template validates.
    for project in [&plain, &nested, &package] {
        ok(&gdn_in(dir.path(), &state, &["validate", path(project)]));
    }

    // -f overwrites; without it nothing changes.
    let again = gdn_in(dir.path(), &state, &["init", path(&package), "-t", "minimal", "--no-git"]);
    assert_eq!(again.status.code(), Some(3), "{}", stderr(&again));
    ok(&gdn_in(dir.path(), &state, &["init", path(&package), "-t", "minimal", "--no-git", "-f", "-n", "renamed"]));
    let yaml = std::fs::read_to_string(package.join("goondan.yaml")).unwrap_or_default();
    assert!(yaml.contains("name: \"renamed\"") && !yaml.contains("file-system"), "{yaml}");

    // A name that cannot be written into the document is refused.
    let quoted = dir.path().join("quoted");
    let refused = gdn_in(dir.path(), &state, &["init", path(&quoted), "-n", "a\"b"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(!quoted.join("goondan.yaml").exists());
}

/// `gdn instance list --json` rows as (agent, key).
fn listed(dir: &Path, state: &Path, args: &[&str]) -> Vec<(String, String)> {
    let mut all = vec!["--json", "instance", "list"];
    all.extend_from_slice(args);
    let out = ok(&common::gdn_bin().project(dir).state(state).run(&all));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    rows.iter()
        .map(|row| {
            (
                row["agentName"].as_str().unwrap_or_default().to_owned(),
                row["instanceKey"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[test]
fn instance_list_logs_restart_and_delete_take_the_original_short_flags() {
    let dir = common::temp();
    let project = dir.path().join("project");
    let state = dir.path().join("state");
    // A Swarm with both agents, so one workspace holds every instance.
    agents().swarm("both", "lead", &["lead", "solo"]).write(&project).unwrap_or_else(|e| panic!("{e}"));
    let gdn = common::gdn_bin().project(&project).state(&state);
    for (agent, key) in [("lead", "k1"), ("solo", "k2"), ("lead", "k3")] {
        ok(&gdn.run(["run", "--agent", agent, "--instance-key", key, "--input", "hi"]));
    }

    let all = listed(&project, &state, &[]);
    assert_eq!(all.len(), 3, "{all:?}");
    assert_eq!(listed(&project, &state, &["--all"]), all);
    let leads = listed(&project, &state, &["-a", "LEAD"]);
    assert_eq!(leads.len(), 2, "{leads:?}");
    assert!(leads.iter().all(|(agent, _)| agent == "lead"), "{leads:?}");
    // -n keeps the most recently used first.
    assert_eq!(listed(&project, &state, &["-n", "2"]), all[..2]);
    assert_eq!(listed(&project, &state, &["--agent", "lead", "--limit", "1"]), leads[..1]);
    // --all wins over -n, as in the original.
    assert_eq!(listed(&project, &state, &["-n", "1", "--all"]), all);
    let zero = gdn.run(["instance", "list", "-n", "0"]);
    assert_eq!(zero.status.code(), Some(2), "{}", stderr(&zero));

    // logs: -i, -a, -l as --instance-key, --agent, --lines; -p an agent's
    // name as --agent, `orchestrator` everything; --stream shows it all.
    let logs = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["--json", "logs"];
        all.extend_from_slice(args);
        ok(&gdn.run(&all)).lines().map(str::to_owned).collect()
    };
    let everything = logs(&[]);
    assert!(everything.len() >= 6, "{everything:?}");
    let by_key = logs(&["-i", "k2"]);
    assert!(!by_key.is_empty() && by_key.iter().all(|l| l.contains("\"k2\"")), "{by_key:?}");
    assert_eq!(logs(&["--instance-key", "k2"]), by_key);
    let by_agent = logs(&["-a", "solo"]);
    assert!(!by_agent.is_empty() && by_agent.iter().all(|l| l.contains("solo")), "{by_agent:?}");
    assert_eq!(logs(&["-p", "solo"]), by_agent);
    assert_eq!(logs(&["--process", "solo", "--stream", "stderr"]), by_agent);
    assert_eq!(logs(&["-p", "orchestrator", "--stream", "stdout"]), everything);
    assert_eq!(logs(&["-l", "2"]), everything[everything.len() - 2..]);
    let bad_stream = gdn.run(["logs", "--stream", "nope"]);
    assert_eq!(bad_stream.status.code(), Some(2));

    // restart -a: accepted; no service runs here, which it says.
    let restart = gdn.run(["restart", "-a", "lead"]);
    assert!(!stderr(&restart).contains("unexpected argument"), "{}", stderr(&restart));
    assert_ne!(restart.status.code(), Some(0));
    // instance delete -f: deleted without asking.
    ok(&gdn.run(["instance", "delete", "k2", "-f"]));
    let left = listed(&project, &state, &[]);
    assert!(left.iter().all(|(_, key)| key != "k2") && left.len() == 2, "{left:?}");
}

/// A row of docs/COMPATIBILITY.md's `## Command-line flags` table: the
/// command's words (none for the global options) and our spelling (`None`:
/// ours has no such flag).
struct Row {
    command: Vec<String>,
    ours: Option<String>,
    line: String,
}

/// The cells of a Markdown table row (`\|` is a `|` inside a cell).
fn cells(line: &str) -> Vec<String> {
    let mut cells = Vec::new();
    let mut cell = String::new();
    let mut chars = line.trim().trim_start_matches('|').chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cell.push('|');
                chars.next();
            }
            '|' => cells.push(std::mem::take(&mut cell).trim().to_owned()),
            _ => cell.push(c),
        }
    }
    cells
}

/// The first `…` span of a cell.
fn code(cell: &str) -> Option<String> {
    let rest = cell.split_once('`')?.1;
    Some(rest.split_once('`')?.0.to_owned())
}

fn flags_table() -> Vec<Row> {
    let doc = std::fs::read_to_string(common::repo_path("docs/COMPATIBILITY.md")).unwrap_or_default();
    let section = doc
        .split("\n## ")
        .find(|section| section.starts_with("Command-line flags"))
        .unwrap_or_else(|| panic!("docs/COMPATIBILITY.md has no `## Command-line flags` section"));
    let mut rows = Vec::new();
    for line in section.lines().filter(|line| line.starts_with("| `")) {
        let cells = cells(line);
        assert_eq!(cells.len(), 4, "four cells: {line}");
        let first = code(&cells[0]).unwrap_or_else(|| panic!("no command: {line}"));
        let command: Vec<String> = first
            .split_whitespace()
            .take_while(|word| !word.starts_with(['-', '(']) && word.chars().any(|c| c.is_ascii_lowercase()))
            .map(str::to_owned)
            .collect();
        let ours = if cells[2].starts_with('—') { None } else { code(&cells[2]) };
        rows.push(Row { command, ours, line: line.to_owned() });
    }
    assert!(rows.len() > 50, "the table's rows: {}", rows.len());
    rows
}

/// The long flags of a `--help` text's option lines (indented at most six
/// spaces: deeper lines continue a description).
fn long_flags(help: &str) -> Vec<String> {
    let options = help.split_once("Options:").map(|(_, rest)| rest).unwrap_or_default();
    options
        .lines()
        .filter(|line| line.len() - line.trim_start().len() <= 6)
        .filter_map(|line| {
            let line = line.trim_start();
            let line = if line.starts_with('-') && line.as_bytes().get(2) == Some(&b',') { &line[3..] } else { line };
            let flag = line.trim_start().strip_prefix("--")?;
            let name: String = flag.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
            (!name.is_empty()).then(|| format!("--{name}"))
        })
        .collect()
}

/// The command names of a `--help` text's Commands section.
fn subcommands(help: &str) -> Vec<String> {
    help.split_once("Commands:")
        .map(|(_, rest)| rest)
        .unwrap_or_default()
        .lines()
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        // Deeper lines continue a description.
        .filter(|line| line.len() - line.trim_start().len() == 2)
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn the_flags_table_matches_our_help() {
    let rows = flags_table();
    let help_of = |command: &[String]| -> String {
        let mut args: Vec<&str> = command.iter().map(String::as_str).collect();
        args.push("--help");
        ok(&common::gdn_bin().run(&args))
    };
    let mut helps: std::collections::BTreeMap<Vec<String>, String> = std::collections::BTreeMap::new();
    // Each spelling the table gives for ours is in that command's help, verbatim.
    for row in &rows {
        let help = helps.entry(row.command.clone()).or_insert_with(|| help_of(&row.command));
        if let Some(ours) = &row.ours {
            assert!(
                help.contains(ours.as_str()),
                "`gdn {} --help` has no `{ours}`: {}",
                row.command.join(" "),
                row.line
            );
        }
    }
    // Each flag of ours is in the table (the global ones once).
    let listed = |command: &[String]| -> Vec<String> {
        rows.iter().filter(|row| row.command == command).filter_map(|row| row.ours.clone()).collect()
    };
    let global: Vec<String> = long_flags(&help_of(&[]));
    for (command, help) in &helps {
        let ours = listed(command);
        for flag in long_flags(help) {
            if flag == "--help" || flag == "--version" || (!command.is_empty() && global.contains(&flag)) {
                continue;
            }
            let found = ours.iter().any(|spelling| spelling.split([' ', ',']).any(|word| word == flag));
            assert!(found, "`gdn {} {flag}` is missing from the table", command.join(" "));
        }
    }
    // Each command of ours is in the table.
    let mut commands = vec![Vec::new()];
    while let Some(command) = commands.pop() {
        let help = help_of(&command);
        for name in subcommands(&help) {
            let mut sub = command.clone();
            sub.push(name);
            let flags =
                long_flags(&help_of(&sub)).into_iter().filter(|flag| !global.contains(flag) && flag != "--help");
            let has_own = flags.count() > 0 || help_of(&sub).contains("Arguments:");
            if has_own {
                assert!(helps.contains_key(&sub), "`gdn {}` is missing from the table", sub.join(" "));
            }
            commands.push(sub);
        }
    }
}
