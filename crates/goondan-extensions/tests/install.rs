//! Installing the base extensions through the runtime's assembly, as `gdn`
//! does: which chains get which layers, in which order, and what a bad
//! config does to the agent.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use goondan_config::PackageScope;
use goondan_runtime::agent::{AgentBuildError, AgentOptions, AgentTooling, EnvLookup, assemble_tooling};
use goondan_runtime::extension::{ExtensionSetup, agent_extensions};
use goondan_runtime::extension_state::ExtensionStateStore;
use goondan_tools::assembly::AgentTools;
use goondan_tools::events::NoopEventSink;
use goondan_tools::{ToolExecutor, ToolRegistry};

mod common;
use common::plugins;

fn bundle(extensions: &str) -> goondan_config::Bundle {
    let text = format!(
        "apiVersion: goondan.ai/v1\nkind: Model\nmetadata: {{name: m}}\nspec: {{provider: openai, model: x}}\n---\n\
         apiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {{name: a}}\nspec:\n  modelConfig: {{modelRef: Model/m}}\n  \
         prompt: {{system: 'Be brief.'}}\n  extensions:\n{extensions}"
    );
    let report = goondan_config::load_from_str(&text, "goondan.yaml", None, PathBuf::from("goondan.yaml"));
    report.bundle.unwrap_or_else(|| panic!("{:?}", report.diagnostics))
}

fn base(name: &str, config: &str) -> String {
    format!("    - ref: {{kind: Extension, name: {name}, package: '@goondan/base'}}\n      config: {config}\n")
}

/// Assembles agent `a` with every extension installed by this crate (one it
/// does not take fails the assembly, so a silent skip cannot pass).
async fn assemble(bundle: &goondan_config::Bundle) -> Result<AgentTooling, AgentBuildError> {
    let mut options = AgentOptions::new(Arc::new(NoopEventSink));
    options.plugins = plugins();
    assemble_tooling(bundle, &options).await
}

#[tokio::test]
async fn layers_go_on_the_runtimes_chains_in_the_agents_order_and_integrity_innermost() {
    let extensions = [
        base("message-integrity", "{}"),
        base("message-window", "{maxMessages: 10}"),
        base("message-compaction", "{}"),
        base("context-message", "{includeSwarmCatalog: true}"),
    ]
    .concat();
    let tooling = assemble(&bundle(&extensions)).await.unwrap_or_else(|e| panic!("{e}"));
    let turn: Vec<&str> = tooling.turn_middleware.names().collect();
    assert_eq!(turn, ["message-window", "message-compaction", "context-message"]);
    let step: Vec<&str> = tooling.step_middleware.names().collect();
    assert_eq!(step, ["message-integrity"]);
    // context-message sends the prompt now, so the request will not.
    assert_eq!(tooling.system_prompt.as_deref(), Some("Be brief."));
    assert_eq!(tooling.prompt_in_conversation.as_deref(), Some("context-message"));

    let plain = assemble(&bundle(&base("message-window", "{}"))).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plain.prompt_in_conversation, None, "without context-message the request carries the prompt");
}

#[tokio::test]
async fn a_bad_config_fails_the_agent_with_e_ext_init_naming_the_field() {
    let refused = assemble(&bundle(&base("message-compaction", "{mode: squash}"))).await.err();
    let Some(AgentBuildError::Extension { agent, source }) = refused else { panic!("{refused:?}") };
    assert_eq!(agent, "a");
    assert_eq!(source.extension, "message-compaction");
    assert_eq!(source.code, "E_EXT_INIT");
    assert!(source.message.starts_with("config.mode must be one of 'remove', 'truncate'"), "{source}");
}

#[tokio::test]
async fn extensions_it_does_not_implement_are_left_to_the_caller() {
    let bundle = bundle(&base("message-window", "{}"));
    let agent = bundle.agents().next().cloned().unwrap_or_else(|| panic!("no agent"));
    let found = agent_extensions(&bundle, &agent);
    let mut other = found.clone();
    // `mcp` is goondan-mcp's, not this crate's.
    other[0].name = "mcp".into();
    let mut local = found.clone();
    local[0].scope = PackageScope::Local;
    let executor = ToolExecutor::new(Arc::new(ToolRegistry::new()));
    let mut tooling = AgentTooling::new(
        "a",
        "default",
        Path::new("/"),
        AgentTools::for_agent(&bundle, &agent),
        executor,
        Arc::new(NoopEventSink),
    );
    let env: EnvLookup = Arc::new(|_: &str| None);
    for extensions in [&other, &local] {
        let mut setup = ExtensionSetup {
            tooling: &mut tooling,
            extensions,
            state: Arc::new(ExtensionStateStore::in_memory()),
            env: &env,
        };
        assert_eq!(goondan_extensions::install(&mut setup, &extensions[0]).await, Ok(false), "{extensions:?}");
    }
    assert!(tooling.turn_middleware.is_empty() && tooling.step_middleware.is_empty());
}
