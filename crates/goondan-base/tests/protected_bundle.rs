//! `file-system` installed for an agent of a real bundle protects that
//! bundle's directory and its own files (bundle file, lock file, prompt
//! files, Tool and Extension modules) and `.env*` files, unless the agent's
//! `spec.tools` item for it lifts a rule with `config`.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use goondan_base::BaseSettings;
use goondan_core::JsonValue;
use goondan_test_support::{call_scope, tool_context};
use goondan_tools::assembly::AgentTools;
use goondan_tools::{HandlerResult, ToolRegistry};
use serde_json::json;

const BUNDLE: &str = r#"
apiVersion: goondan.ai/v1
kind: Model
metadata: {name: m}
spec: {provider: openai, model: gpt-4o-mini}
---
apiVersion: goondan.ai/v1
kind: Tool
metadata: {name: local}
spec:
  entry: ./tools/local.ts
  exports: [{name: run, description: Runs.}]
---
apiVersion: goondan.ai/v1
kind: Extension
metadata: {name: ext}
spec: {entry: ./extensions/ext.ts}
---
apiVersion: goondan.ai/v1
kind: Agent
metadata: {name: guarded}
spec:
  modelConfig: {modelRef: Model/m}
  prompt: {systemRef: ./prompts/system.md}
  tools:
    - {kind: Tool, name: file-system, package: "@goondan/base"}
---
apiVersion: goondan.ai/v1
kind: Agent
metadata: {name: trusted}
spec:
  modelConfig: {modelRef: Model/m}
  tools:
    - {kind: Tool, name: file-system, package: "@goondan/base", config: {allowConfigWrites: true, allowDotEnv: true}}
"#;

/// Calls `export` of `agent`'s file-system, installed as `gdn` installs it.
async fn call(root: &Path, agent: &str, export: &str, input: JsonValue) -> HandlerResult {
    let report = goondan_config::load_bundle(root);
    let Some(bundle) = report.valid_bundle() else { panic!("invalid bundle: {:?}", report.diagnostics) };
    let Some(agent) = bundle.agent(agent) else { panic!("no agent {agent}") };
    let tools = AgentTools::for_agent(bundle, agent);
    let registry = ToolRegistry::new();
    goondan_base::register_native_tools(&registry, &tools, &Arc::new(BaseSettings::default()))
        .unwrap_or_else(|e| panic!("{e}"));
    let name = format!("file-system__{export}");
    let Some(tool) = registry.get(&name) else { panic!("{name} not registered") };
    let ctx = tool_context(call_scope("guarded", "i", root), &name);
    let JsonValue::Object(input) = input else { panic!("input must be an object") };
    tool.handler.call(&ctx, &input).await
}

fn code(result: &HandlerResult) -> Option<&str> {
    result.as_ref().err().and_then(|failure| failure.code.as_deref())
}

#[tokio::test]
async fn the_bundle_being_run_is_protected_unless_its_tool_config_allows() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let root = fs::canonicalize(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    for (file, text) in [
        ("goondan.yaml", BUNDLE),
        ("tools/local.ts", "export const handlers = {};"),
        ("extensions/ext.ts", "export function register() {}"),
        ("prompts/system.md", "Be careful."),
        (".env", "OPENAI_API_KEY=sk-secret"),
    ] {
        fs::create_dir_all(root.join(file).parent().unwrap_or(&root)).unwrap_or_else(|e| panic!("{e}"));
        fs::write(root.join(file), text).unwrap_or_else(|e| panic!("{e}"));
    }
    for path in ["goondan.yaml", "./tools/../goondan.yaml", "goondan.lock.yaml", "prompts/system.md", "tools/local.ts"]
    {
        let result = call(&root, "guarded", "write", json!({"path": path, "content": "pwned"})).await;
        assert_eq!(code(&result), Some("E_PATH_PROTECTED"), "{path}: {result:?}");
    }
    let result =
        call(&root, "guarded", "write", json!({"path": "extensions/ext.ts", "content": "x", "append": true})).await;
    assert_eq!(code(&result), Some("E_PATH_PROTECTED"), "{result:?}");
    let result = call(&root, "guarded", "read", json!({"path": ".env"})).await;
    assert_eq!(code(&result), Some("E_PATH_PROTECTED"), "{result:?}");
    assert_eq!(fs::read_to_string(root.join("goondan.yaml")).ok().as_deref(), Some(BUNDLE));
    assert!(!root.join("goondan.lock.yaml").exists());
    // Reading the bundle works; a new file anywhere in its directory is
    // refused too (a package.json, a .env.local or a new import there is
    // read at the next start).
    assert!(call(&root, "guarded", "read", json!({"path": "goondan.yaml"})).await.is_ok());
    for path in ["notes.md", "package.json", "bunfig.toml", "tools/lib/helper.ts", "node_modules/x/index.js"] {
        let result = call(&root, "guarded", "write", json!({"path": path, "content": "n"})).await;
        assert_eq!(code(&result), Some("E_PATH_PROTECTED"), "{path}: {result:?}");
        assert!(!root.join(path).exists(), "{path} was written");
    }
    let result = call(&root, "guarded", "mkdir", json!({"path": "node_modules"})).await;
    assert_eq!(code(&result), Some("E_PATH_PROTECTED"), "{result:?}");
    // The agent whose spec.tools item allows it may.
    let result = call(&root, "trusted", "read", json!({"path": ".env"})).await;
    assert!(result.is_ok(), "{result:?}");
    let result = call(&root, "trusted", "write", json!({"path": "prompts/system.md", "content": "new"})).await;
    assert!(result.is_ok(), "{result:?}");
}
