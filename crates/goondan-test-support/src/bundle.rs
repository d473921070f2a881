//! A bundle written from typed calls: each resource is a JSON value (kind,
//! name, spec) emitted as block YAML into `goondan.yaml`, and any other
//! file (a tool's script, a prompt) written beside it.
//!
//! What is deliberately absent: parsing, validation, defaults. The builder
//! writes what it is told; `gdn` judges it, as it judges a user's bundle.
//! Bundles that a test reads as a fixture stay under `tests/fixtures`.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

/// The `apiVersion` of every resource written.
pub const API_VERSION: &str = "goondan.ai/v1";

/// A bundle: its resources, in order, and files beside `goondan.yaml`.
#[derive(Debug, Clone, Default)]
pub struct Bundle {
    resources: Vec<Value>,
    files: Vec<(PathBuf, String)>,
}

/// A scripted model's reply that answers `text`.
pub fn reply_text(text: &str) -> Value {
    json!({"text": text})
}

/// A scripted model's reply that calls tools: (name, arguments) each.
pub fn reply_tools<'a>(calls: impl IntoIterator<Item = (&'a str, Value)>) -> Value {
    let calls: Vec<Value> = calls.into_iter().map(|(name, args)| json!({"name": name, "args": args})).collect();
    json!({"toolCalls": calls})
}

/// A case of a scripted model's `when`: on an input containing `input`,
/// answer `replies` in turn.
pub fn when_input(input: &str, replies: impl IntoIterator<Item = Value>) -> Value {
    let replies: Vec<Value> = replies.into_iter().collect();
    json!({"inputContains": input, "replies": replies})
}

impl Bundle {
    /// An empty bundle.
    pub fn new() -> Self {
        Self::default()
    }

    /// Any resource: `kind`, `metadata.name` and `spec` (a JSON object).
    #[must_use]
    pub fn resource(mut self, kind: &str, name: &str, spec: Value) -> Self {
        self.resources.push(json!({
            "apiVersion": API_VERSION,
            "kind": kind,
            "metadata": {"name": name},
            "spec": spec,
        }));
        self
    }

    /// A resource given whole (for the fields beside `spec`, such as labels).
    #[must_use]
    pub fn raw(mut self, resource: Value) -> Self {
        self.resources.push(resource);
        self
    }

    /// A `provider: scripted` Model whose model is `name` too, answering
    /// `replies` (see [`reply_text`], [`reply_tools`]) in turn.
    #[must_use]
    pub fn scripted_model(self, name: &str, replies: impl IntoIterator<Item = Value>) -> Self {
        let replies: Vec<Value> = replies.into_iter().collect();
        self.resource("Model", name, json!({"provider": "scripted", "model": name, "options": {"replies": replies}}))
    }

    /// A `provider: scripted` Model `name` whose `model` and `options`
    /// (`replies`, `when`, …) are given whole.
    #[must_use]
    pub fn scripted_model_as(self, name: &str, model: &str, options: Value) -> Self {
        self.resource("Model", name, json!({"provider": "scripted", "model": model, "options": options}))
    }

    /// A `provider: openai` Model at `endpoint` whose key is read from the
    /// environment variable `key_env`.
    #[must_use]
    pub fn openai_model(self, name: &str, model: &str, endpoint: &str, key_env: &str) -> Self {
        self.resource(
            "Model",
            name,
            json!({
                "provider": "openai",
                "model": model,
                "endpoint": endpoint,
                "apiKey": {"valueFrom": {"env": key_env}},
            }),
        )
    }

    /// An Agent.
    #[must_use]
    pub fn agent(self, agent: Agent) -> Self {
        let Agent { name, spec } = agent;
        self.resource("Agent", &name, Value::Object(spec))
    }

    /// `agent` alone in the Swarm `swarm` (its entry): the shape of most
    /// service tests.
    #[must_use]
    pub fn one_agent(self, swarm: &str, agent: Agent) -> Self {
        let name = agent.name.clone();
        self.agent(agent).swarm(swarm, &name, &[&name])
    }

    /// A Swarm of `agents`, entered at `entry` (names of Agents).
    #[must_use]
    pub fn swarm(self, name: &str, entry: &str, agents: &[&str]) -> Self {
        let agents: Vec<String> = agents.iter().map(|agent| format!("Agent/{agent}")).collect();
        self.resource("Swarm", name, json!({"entryAgent": format!("Agent/{entry}"), "agents": agents}))
    }

    /// A Connection of the `@goondan/base` connector `connector`, with
    /// `config` (name → value, each written as `{value: …}`) and the rest of
    /// its spec (`ingress`, `secrets`, `swarmRef`) in `more`.
    #[must_use]
    pub fn connection(self, name: &str, connector: &str, config: &[(&str, &str)], more: Value) -> Self {
        let mut spec = Map::new();
        spec.insert("connectorRef".into(), json!({"kind": "Connector", "name": connector, "package": "@goondan/base"}));
        if !config.is_empty() {
            let config: Map<String, Value> =
                config.iter().map(|(key, value)| ((*key).to_owned(), json!({"value": value}))).collect();
            spec.insert("config".into(), Value::Object(config));
        }
        if let Value::Object(more) = more {
            spec.extend(more);
        }
        self.resource("Connection", name, Value::Object(spec))
    }

    /// A webhook Connection on `port`, with `ingress.rules` (empty: none).
    #[must_use]
    pub fn webhook(self, name: &str, port: u16, rules: Value) -> Self {
        let port = port.to_string();
        let more = if rules.as_array().is_some_and(Vec::is_empty) || rules.is_null() {
            json!({})
        } else {
            json!({"ingress": {"rules": rules}})
        };
        self.connection(name, "webhook", &[("WEBHOOK_PORT", &port)], more)
    }

    /// A file beside `goondan.yaml` (`path` relative to the bundle).
    #[must_use]
    pub fn file(mut self, path: impl Into<PathBuf>, text: impl Into<String>) -> Self {
        self.files.push((path.into(), text.into()));
        self
    }

    /// The text of `goondan.yaml`.
    pub fn yaml(&self) -> String {
        let mut text = String::new();
        for (index, resource) in self.resources.iter().enumerate() {
            if index > 0 {
                text.push_str("---\n");
            }
            emit(&mut text, resource, 0);
        }
        text
    }

    /// Writes `goondan.yaml` and the files into `dir` (created if missing).
    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("goondan.yaml"), self.yaml())?;
        for (path, text) in &self.files {
            let path = dir.join(path);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(path, text)?;
        }
        Ok(())
    }

    /// Writes the bundle into a new temporary directory.
    pub fn write_temp(&self) -> std::io::Result<tempfile::TempDir> {
        let dir = tempfile::tempdir()?;
        self.write(dir.path())?;
        Ok(dir)
    }
}

/// Copies the directory `from` (a fixture bundle) into `to`, recursively.
pub fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// An Agent's spec, built up.
#[derive(Debug, Clone)]
pub struct Agent {
    name: String,
    spec: Map<String, Value>,
}

impl Agent {
    /// An agent `name` on the Model `model`.
    pub fn new(name: &str, model: &str) -> Self {
        let mut spec = Map::new();
        spec.insert("modelConfig".into(), json!({"modelRef": format!("Model/{model}")}));
        Self { name: name.to_owned(), spec }
    }

    /// Adds a tool of `@goondan/base` (`bash`, `agents`, …).
    #[must_use]
    pub fn base_tool(self, name: &str) -> Self {
        self.tool(json!({"kind": "Tool", "name": name, "package": "@goondan/base"}))
    }

    /// Adds a tool reference as written (`"Tool/peek"`, or an object).
    #[must_use]
    pub fn tool(mut self, tool: impl Into<Value>) -> Self {
        push(&mut self.spec, "tools", tool.into());
        self
    }

    /// Adds an extension reference as written.
    #[must_use]
    pub fn extension(mut self, extension: impl Into<Value>) -> Self {
        push(&mut self.spec, "extensions", extension.into());
        self
    }

    /// Sets any other field of the spec (`requiredTools`, `sandbox`, …).
    #[must_use]
    pub fn with(mut self, key: &str, value: Value) -> Self {
        self.spec.insert(key.to_owned(), value);
        self
    }
}

fn push(spec: &mut Map<String, Value>, key: &str, value: Value) {
    match spec.get_mut(key) {
        Some(Value::Array(list)) => list.push(value),
        _ => {
            spec.insert(key.to_owned(), Value::Array(vec![value]));
        }
    }
}

/// Block YAML for `value` at `indent`; scalars as JSON (a YAML subset:
/// strings double-quoted with JSON's escapes, which YAML reads the same).
fn emit(out: &mut String, value: &Value, indent: usize) {
    let pad = " ".repeat(indent);
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (key, value) in map {
                out.push_str(&pad);
                out.push_str(&plain_or_quoted(key));
                out.push(':');
                value_after_key(out, value, indent);
            }
        }
        Value::Array(list) if !list.is_empty() => {
            for item in list {
                out.push_str(&pad);
                out.push('-');
                match item {
                    Value::Object(map) if !map.is_empty() => {
                        // The first key on the dash's line, the rest below it.
                        let mut nested = String::new();
                        emit(&mut nested, item, indent + 2);
                        out.push(' ');
                        out.push_str(nested.trim_start());
                    }
                    _ => value_after_key(out, item, indent),
                }
            }
        }
        _ => {
            out.push_str(&pad);
            out.push_str(&scalar(value));
            out.push('\n');
        }
    }
}

/// A string bare where YAML cannot read it as anything but that string
/// (a key, a name, a reference); JSON-quoted otherwise.
fn plain_or_quoted(text: &str) -> String {
    let plain = text.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && text.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
        && !matches!(
            text.to_ascii_lowercase().as_str(),
            "true" | "false" | "null" | "yes" | "no" | "on" | "off" | "y" | "n"
        );
    if plain { text.to_owned() } else { Value::from(text).to_string() }
}

/// A scalar: a string as [`plain_or_quoted`], anything else as JSON.
fn scalar(value: &Value) -> String {
    match value {
        Value::String(text) => plain_or_quoted(text),
        other => other.to_string(),
    }
}

/// What follows a key's colon or a list item's dash: a nested block on the
/// lines below, or a scalar on this line.
fn value_after_key(out: &mut String, value: &Value, indent: usize) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            out.push('\n');
            emit(out, value, indent + 2);
        }
        Value::Array(list) if !list.is_empty() => {
            out.push('\n');
            emit(out, value, indent + 2);
        }
        _ => {
            out.push(' ');
            out.push_str(&scalar(value));
            out.push('\n');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_values_are_block_yaml_with_json_scalars() {
        let yaml = Bundle::new()
            .scripted_model("m", [reply_tools([("bash__exec", json!({"command": "echo 'a\"b'"}))]), reply_text("ok")])
            .agent(Agent::new("a", "m").base_tool("bash").with("requiredTools", json!([])))
            .yaml();
        let expected = r#"apiVersion: goondan.ai/v1
kind: Model
metadata:
  name: m
spec:
  provider: scripted
  model: m
  options:
    replies:
      - toolCalls:
          - name: bash__exec
            args:
              command: "echo 'a\"b'"
      - text: ok
---
apiVersion: goondan.ai/v1
kind: Agent
metadata:
  name: a
spec:
  modelConfig:
    modelRef: Model/m
  tools:
    - kind: Tool
      name: bash
      package: "@goondan/base"
  requiredTools: []
"#;
        assert_eq!(yaml, expected);
    }
}
