//! Bundles of several files and bundles with installed dependencies, with
//! the fixtures of `tests/fixtures/packages` and the original runtime's
//! samples (`samples/` of goondan/goondan: smoke-test here, brain-persona in
//! the repository's `tests/fixtures`).

use std::fs;
use std::path::{Path, PathBuf};

use goondan_config::{Diagnostic, Kind, LoadReport, PackageScope, load_bundle, load_bundle_with};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap_or_else(|e| panic!("{}: {e}", to.display()));
    for entry in fs::read_dir(from).unwrap_or_else(|e| panic!("{}: {e}", from.display())).flatten() {
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target).unwrap_or_else(|e| panic!("{}: {e}", target.display()));
        }
    }
}

/// A state root's `packages/` directory with @acme/greeter 1.0.0 installed
/// by hand, as `gdn package install` lays it out.
fn packages_with_greeter() -> (tempfile::TempDir, PathBuf) {
    let state = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let packages = state.path().join("packages");
    copy_dir(&fixture("packages/greeter-1.0.0"), &packages.join("acme/greeter/1.0.0"));
    (state, packages)
}

fn codes(report: &LoadReport) -> Vec<(&'static str, String)> {
    report.diagnostics.iter().map(|d| (d.code.as_str(), d.path.clone())).collect()
}

fn errors(report: &LoadReport) -> Vec<&Diagnostic> {
    report.diagnostics.iter().filter(|d| d.is_error()).collect()
}

#[test]
fn a_split_bundle_loads_every_file_the_original_reads_in_its_order() {
    let report = load_bundle(&fixture("packages/split-quickstart"));
    assert!(report.diagnostics.is_empty(), "{:#?}", report.diagnostics);
    let Some(bundle) = report.bundle else { panic!("no bundle") };
    let labels: Vec<&str> = bundle.files().iter().map(|f| f.label.as_str()).collect();
    // Sorted by path; dist/ is skipped and config/notes.yaml is not a bundle file name.
    assert_eq!(labels, ["agents.yaml", "config/swarm.yml", "goondan.yaml", "models.yaml", "tools/tools.yaml"]);
    assert_eq!(bundle.package_name(), Some("quickstart"));
    assert!(bundle.agent("assistant").is_some());
    assert!(bundle.agent("ignored").is_none());
    assert_eq!(bundle.default_agent().map(|a| a.name().to_owned()), Ok("assistant".to_owned()));
    let tool = bundle.tools().next().map(|t| t.name().to_owned());
    assert_eq!(tool.as_deref(), Some("word-count"));
    let Some(entry) = bundle.resources().iter().find(|r| r.resource.kind() == Kind::Tool) else { panic!() };
    assert_eq!(bundle.document_label(entry.doc_index), "tools/tools.yaml#0");
    assert!(bundle.loaded_files().iter().any(|f| f.ends_with("tools/tools.yaml")));
}

#[test]
fn diagnostics_of_a_split_bundle_name_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    copy_dir(&fixture("packages/split-quickstart"), dir.path());
    let tools = dir.path().join("tools/tools.yaml");
    let text = fs::read_to_string(&tools).unwrap_or_else(|e| panic!("{e}")).replace("word-count.ts", "missing.ts");
    fs::write(&tools, text).unwrap_or_else(|e| panic!("{e}"));
    let report = load_bundle(dir.path());
    let found = errors(&report);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].code.as_str(), "E_CONFIG_ENTRY_NOT_FOUND");
    assert_eq!(found[0].path, "tools/tools.yaml#0.spec.entry");
    assert_eq!(found[0].line, Some(6));
}

#[test]
fn a_name_defined_in_two_files_is_reported_naming_both() {
    let report = load_bundle(&fixture("packages/duplicate-across-files"));
    assert_eq!(codes(&report), [("E_CONFIG_DUPLICATE_NAME", "more/models.yaml#0.metadata.name".to_owned())]);
    let suggestion = report.diagnostics[0].suggestion.clone().unwrap_or_default();
    assert!(suggestion.contains("goondan.yaml#1"), "{suggestion}");
}

#[test]
fn the_original_samples_load_with_their_lock_file_for_the_built_in_package() {
    let (_state, packages) = packages_with_greeter();
    // brain-persona is the repository's copy (tests/fixtures), smoke-test this crate's.
    let brain_persona = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/brain-persona");
    for sample in [fixture("samples/smoke-test"), brain_persona] {
        let report = load_bundle_with(&sample, Some(&packages));
        assert!(report.diagnostics.is_empty(), "{}: {:#?}", sample.display(), report.diagnostics);
        assert!(report.bundle.is_some_and(|b| b.agents().count() > 0), "{}", sample.display());
    }
}

#[test]
fn a_dependency_is_loaded_from_the_lock_file_and_its_tool_resolved() {
    let (_state, packages) = packages_with_greeter();
    let report = load_bundle_with(&fixture("packages/with-dependency"), Some(&packages));
    assert!(report.diagnostics.is_empty(), "{:#?}", report.diagnostics);
    let Some(bundle) = report.bundle else { panic!("no bundle") };
    assert_eq!(bundle.dependencies().len(), 1);
    let Some(agent) = bundle.agent("assistant") else { panic!("no agent") };
    let tools: Vec<(PackageScope, &str)> = bundle.agent_tools(agent).iter().map(|(s, t)| (*s, t.name())).collect();
    assert_eq!(tools, [(PackageScope::Dependency(0), "greet"), (PackageScope::Base, "json-query")]);
    // The entry is the package's own file.
    let entry = bundle.entry_file(PackageScope::Dependency(0), "./src/greet.ts");
    assert_eq!(entry, Some(packages.join("acme/greeter/1.0.0/./src/greet.ts")));
    // The package's resources are its own: not the bundle's.
    assert!(bundle.agent("greeter").is_none());
    assert!(bundle.dependencies()[0].agent("greeter").is_some());
    assert!(bundle.loaded_files().iter().any(|f| f.ends_with("acme/greeter/1.0.0/goondan.yaml")));
}

#[test]
fn a_dependency_entry_falls_back_to_compiled_code() {
    let (_state, packages) = packages_with_greeter();
    let installed = packages.join("acme/greeter/1.0.0");
    fs::create_dir_all(installed.join("dist/src")).unwrap_or_else(|e| panic!("{e}"));
    fs::rename(installed.join("src/greet.ts"), installed.join("dist/src/greet.js")).unwrap_or_else(|e| panic!("{e}"));
    let report = load_bundle_with(&fixture("packages/with-dependency"), Some(&packages));
    assert!(report.diagnostics.is_empty(), "{:#?}", report.diagnostics);
    let Some(bundle) = report.bundle else { panic!("no bundle") };
    assert_eq!(
        bundle.entry_file(PackageScope::Dependency(0), "./src/greet.ts"),
        Some(installed.join("dist/src/greet.js"))
    );
}

#[test]
fn without_a_packages_directory_a_dependency_ref_is_not_available() {
    let report = load_bundle(&fixture("packages/with-dependency"));
    let found = errors(&report);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].code.as_str(), "E_CONFIG_REF_NOT_FOUND");
    assert!(found[0].suggestion.as_deref().unwrap_or("").contains("gdn package install"));
}

/// The with-dependency bundle copied to a temp directory, edited by `edit`.
fn edited_bundle(edit: impl FnOnce(&Path)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    copy_dir(&fixture("packages/with-dependency"), dir.path());
    edit(dir.path());
    dir
}

#[test]
fn a_dependency_without_a_locked_version_is_e_config_package_lock_missing() {
    let (_state, packages) = packages_with_greeter();
    let bundle = edited_bundle(|dir| {
        fs::remove_file(dir.join("goondan.lock.yaml")).unwrap_or_else(|e| panic!("{e}"));
    });
    let report = load_bundle_with(bundle.path(), Some(&packages));
    let first = &report.diagnostics[0];
    assert_eq!((first.code.as_str(), first.path.as_str()), ("E_CONFIG_PACKAGE_LOCK_MISSING", "goondan.lock.yaml"));
    assert!(first.message.contains("@acme/greeter@^1.0.0"), "{}", first.message);
    assert!(first.suggestion.as_deref().unwrap_or("").contains("gdn package install"));
}

#[test]
fn a_locked_package_not_installed_is_e_config_package_not_installed() {
    let state = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let report = load_bundle_with(&fixture("packages/with-dependency"), Some(&state.path().join("packages")));
    let first = &report.diagnostics[0];
    assert_eq!(first.code.as_str(), "E_CONFIG_PACKAGE_NOT_INSTALLED");
    assert!(first.path.ends_with("packages/acme/greeter/1.0.0"), "{}", first.path);
    assert!(first.suggestion.as_deref().unwrap_or("").contains("gdn package install"));
    // The ref to it is then reported too.
    assert!(report.diagnostics.iter().any(|d| d.code.as_str() == "E_CONFIG_REF_NOT_FOUND"));
}

#[test]
fn an_installed_package_without_goondan_yaml_is_e_config_package_manifest_missing() {
    let (_state, packages) = packages_with_greeter();
    fs::remove_file(packages.join("acme/greeter/1.0.0/goondan.yaml")).unwrap_or_else(|e| panic!("{e}"));
    let report = load_bundle_with(&fixture("packages/with-dependency"), Some(&packages));
    assert_eq!(report.diagnostics[0].code.as_str(), "E_CONFIG_PACKAGE_MANIFEST_MISSING");
}

#[test]
fn a_package_s_own_errors_name_its_manifest() {
    let (_state, packages) = packages_with_greeter();
    fs::remove_file(packages.join("acme/greeter/1.0.0/src/greet.ts")).unwrap_or_else(|e| panic!("{e}"));
    let report = load_bundle_with(&fixture("packages/with-dependency"), Some(&packages));
    assert_eq!(codes(&report), [("E_CONFIG_ENTRY_NOT_FOUND", "@acme/greeter/goondan.yaml#1.spec.entry".to_owned())]);
}

#[test]
fn an_exact_version_the_lock_file_does_not_hold_is_lock_missing() {
    let (_state, packages) = packages_with_greeter();
    let bundle = edited_bundle(|dir| {
        let path = dir.join("goondan.yaml");
        let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}")).replace("\"^1.0.0\"", "\"1.0.1\"");
        fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
    });
    let report = load_bundle_with(bundle.path(), Some(&packages));
    assert_eq!(report.diagnostics[0].code.as_str(), "E_CONFIG_PACKAGE_LOCK_MISSING");
}

#[test]
fn a_ref_into_a_dependency_by_a_wrong_name_suggests_its_names() {
    let (_state, packages) = packages_with_greeter();
    let bundle = edited_bundle(|dir| {
        let path = dir.join("goondan.yaml");
        let text = fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{e}"))
            .replace("name: greet, package", "name: greeet, package");
        fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
    });
    let report = load_bundle_with(bundle.path(), Some(&packages));
    let found = errors(&report);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].code.as_str(), "E_CONFIG_REF_NOT_FOUND");
    assert!(found[0].suggestion.as_deref().unwrap_or("").contains("'greet'"), "{:?}", found[0].suggestion);
}

/// A state root's `packages/` with @acme/crew 1.0.0 installed by hand.
fn packages_with_crew() -> (tempfile::TempDir, PathBuf) {
    let state = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let packages = state.path().join("packages");
    copy_dir(&fixture("packages/crew-1.0.0"), &packages.join("acme/crew/1.0.0"));
    (state, packages)
}

/// The with-crew bundle copied to a temp directory, its goondan.yaml
/// edited by `edit`.
fn edited_crew(edit: impl FnOnce(String) -> String) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    copy_dir(&fixture("packages/with-crew"), dir.path());
    let path = dir.path().join("goondan.yaml");
    let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{e}"));
    fs::write(&path, edit(text)).unwrap_or_else(|e| panic!("{e}"));
    dir
}

#[test]
fn a_swarm_runs_a_dependency_s_agent_resolved_in_its_own_package() {
    let (_state, packages) = packages_with_crew();
    let report = load_bundle_with(&fixture("packages/with-crew"), Some(&packages));
    assert!(report.diagnostics.is_empty(), "{:#?}", report.diagnostics);
    let Some(bundle) = report.bundle else { panic!("no bundle") };
    let crew = PackageScope::Dependency(0);

    // The default Swarm is the bundle's; its agents come from two packages.
    let Ok(Some(swarm)) = bundle.default_swarm() else { panic!("no default swarm") };
    assert_eq!((swarm.scope, swarm.name()), (PackageScope::Local, "default"));
    let agents = bundle.swarm_agents(swarm).unwrap_or_else(|e| panic!("{e}"));
    let found: Vec<(PackageScope, &str)> = agents.iter().map(|a| (a.scope, a.name())).collect();
    assert_eq!(found, [(PackageScope::Local, "lead"), (crew, "helper")]);

    // The one lookup by name finds it, in the Swarm and without one.
    let Some(helper) = bundle.find_agent("helper", Some("default")) else { panic!("helper not found") };
    assert_eq!(helper.scope, crew);
    assert_eq!(bundle.find_agent("helper", None).map(|a| a.scope), Some(crew));
    assert!(bundle.agent("helper").is_none(), "the bundle's own index holds only its own");
    // Run alone, it runs in the Swarm whose entry it is: the package's.
    assert_eq!(bundle.swarm_of_agent("helper").map(|s| s.resource.name()), Some("crew"));
    assert_eq!(bundle.swarm_of_agent("lead").map(|s| s.resource.name()), Some("default"));

    // Its references resolve in its package: Tool and Model, scoped in the
    // bundle's terms, the entry the package's file.
    let tools: Vec<(PackageScope, &str)> =
        bundle.agent_tools_in(helper.scope, helper.resource).iter().map(|(s, t)| (*s, t.name())).collect();
    assert_eq!(tools, [(crew, "shout")]);
    let model = bundle.resolve_from(helper.scope, &helper.spec.model_config.model_ref).map(|r| r.scope);
    assert_eq!(model, Ok(crew));
    // Resolved from the bundle itself, the same reference names nothing.
    assert!(bundle.resolve(&helper.spec.model_config.model_ref).is_err());
    assert_eq!(bundle.entry_file(crew, "./src/shout.ts"), Some(packages.join("acme/crew/1.0.0/./src/shout.ts")));
    let home = bundle.package(crew).map(|p| p.root().to_path_buf());
    assert_eq!(home, Some(packages.join("acme/crew/1.0.0")), "where its prompt file is read");
    // Scopes inside the package map onto the bundle's.
    assert_eq!(PackageScope::Local.seen_from(crew), crew);
    assert_eq!(PackageScope::Base.seen_from(crew), PackageScope::Base);
    assert_eq!(PackageScope::Dependency(3).seen_from(crew), PackageScope::Dependency(3));
}

#[test]
fn a_dependency_s_swarm_is_selectable_and_the_default_when_the_bundle_has_none() {
    let (_state, packages) = packages_with_crew();
    let report = load_bundle_with(&fixture("packages/with-crew"), Some(&packages));
    let Some(bundle) = report.valid_bundle() else { panic!("{:#?}", report.diagnostics) };
    let Some(crew) = bundle.swarm("crew") else { panic!("the package's swarm") };
    assert_eq!(crew.scope, PackageScope::Dependency(0));
    assert_eq!(bundle.find_agent("helper", Some("crew")).map(|a| a.scope), Some(PackageScope::Dependency(0)));
    let names: Vec<&str> = bundle.all_swarms().iter().map(|s| s.resource.name()).collect();
    assert_eq!(names, ["default", "crew"], "the bundle's own first");
    // The bundle's own Swarm is still the default.
    assert_eq!(bundle.default_agent().map(|a| a.name().to_owned()), Ok("lead".to_owned()));

    // Without a Swarm (and an Agent) of its own, the package's only one runs.
    let bare = edited_crew(|text| text.split("\n---\n").next().unwrap_or_default().to_owned());
    let report = load_bundle_with(bare.path(), Some(&packages));
    let Some(bundle) = report.valid_bundle() else { panic!("{:#?}", report.diagnostics) };
    let Ok(Some(swarm)) = bundle.default_swarm() else { panic!("no default swarm") };
    assert_eq!((swarm.scope, swarm.name()), (PackageScope::Dependency(0), "crew"));
    let agent = bundle.default_agent().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((agent.scope, agent.name()), (PackageScope::Dependency(0), "helper"));

    // A bundle with an Agent of its own but no Swarm still runs its Agent:
    // adding a dependency does not change what runs.
    let own_agent = edited_crew(|text| text.split("\n---\n").take(3).collect::<Vec<_>>().join("\n---\n"));
    let report = load_bundle_with(own_agent.path(), Some(&packages));
    let Some(bundle) = report.valid_bundle() else { panic!("{:#?}", report.diagnostics) };
    assert_eq!(bundle.default_swarm().map(|s| s.is_none()), Ok(true));
    let agent = bundle.default_agent().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((agent.scope, agent.name()), (PackageScope::Local, "lead"));
    assert_eq!(bundle.swarm("crew").map(|s| s.scope), Some(PackageScope::Dependency(0)), "still selectable");
}

#[test]
fn two_agents_of_one_name_in_one_swarm_are_refused_naming_both_packages() {
    let (_state, packages) = packages_with_crew();
    let dir = edited_crew(|text| {
        text.replace("    - Agent/lead\n", "    - Agent/lead\n    - Agent/helper\n")
            + "---\napiVersion: goondan.ai/v1\nkind: Agent\nmetadata:\n  name: helper\nspec:\n  modelConfig:\n    modelRef: Model/lead-model\n"
    });
    let report = load_bundle_with(dir.path(), Some(&packages));
    let found = errors(&report);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(
        (found[0].code.as_str(), found[0].path.as_str()),
        ("E_CONFIG_DUPLICATE_NAME", "goondan.yaml#3.spec.agents[2]")
    );
    let message = &found[0].message;
    assert!(
        message.contains("'helper'") && message.contains("@test/with-crew") && message.contains("@acme/crew"),
        "{message}"
    );
}

#[test]
fn a_dependency_agent_s_missing_prompt_file_names_its_package() {
    let (_state, packages) = packages_with_crew();
    fs::remove_file(packages.join("acme/crew/1.0.0/prompts/helper.md")).unwrap_or_else(|e| panic!("{e}"));
    let report = load_bundle_with(&fixture("packages/with-crew"), Some(&packages));
    let found = errors(&report);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].path.starts_with("@acme/crew/goondan.yaml#3"), "{}", found[0].path);
}
