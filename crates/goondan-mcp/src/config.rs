//! The `Extension/mcp` config: `servers`, a map from server name to a stdio
//! server `{command, args?, env?, cwd?, sandbox?}` or a streamable-HTTP
//! server `{url, headers?}`. A stdio server's `sandbox` has the shape of
//! `spec.sandbox` (policy, readable, writable, network.allow): the server
//! then runs confined under it; without one it runs as its command was
//! chosen, by the user, with the user's rights.
//!
//! Every string an operator may want to keep out of the bundle (`env` and
//! `headers` values, and for convenience `command`, `args`, `cwd` and `url`)
//! is either a literal or the bundle's value form: `{value: "..."}` or
//! `{valueFrom: {env: NAME}}`, resolved here through the agent's environment
//! so that a missing variable is reported with the server and field it
//! belongs to rather than surfacing as a failed start.

use std::path::PathBuf;

use goondan_config::ValueSource;
use goondan_core::{JsonObject, JsonValue, json_type_name};
use indexmap::IndexMap;

/// The parsed config of one `Extension/mcp` use.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct McpConfig {
    /// The servers, in the order the config lists them.
    pub servers: IndexMap<String, ServerConfig>,
}

/// How to reach one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerConfig {
    /// A child process speaking MCP over its standard input and output.
    Stdio(StdioServer),
    /// A streamable-HTTP endpoint.
    Http(HttpServer),
}

/// A stdio server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StdioServer {
    /// The program.
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Variables added to the agent's environment for it.
    pub env: Vec<(String, String)>,
    /// Its working directory; the agent's when `None`.
    pub cwd: Option<PathBuf>,
    /// The sandbox it runs in, when its config names one.
    pub sandbox: Option<goondan_config::SandboxConfig>,
}

/// A streamable-HTTP server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpServer {
    /// The endpoint.
    pub url: String,
    /// Headers sent with every request.
    pub headers: Vec<(String, String)>,
}

/// Why the config cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `servers` is missing or not a map.
    #[error("config.servers must be a map from server name to server, got {0}")]
    Servers(String),
    /// A field of one server is wrong.
    #[error("server '{server}': {field}: {message}")]
    Field {
        /// The server's name.
        server: String,
        /// The field, as a path below the server (`env.TOKEN`).
        field: String,
        /// What is wrong with it.
        message: String,
    },
}

fn field_error(server: &str, field: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Field { server: server.to_owned(), field: field.to_owned(), message: message.into() }
}

/// Parses `config` (the extension's merged config), resolving value forms
/// through `env`.
pub fn parse_config(config: &JsonObject, env: &dyn Fn(&str) -> Option<String>) -> Result<McpConfig, ConfigError> {
    let servers = match config.get("servers") {
        // No servers is a valid, if useless, config.
        None | Some(JsonValue::Null) => return Ok(McpConfig::default()),
        Some(JsonValue::Object(map)) => map,
        Some(other) => return Err(ConfigError::Servers(json_type_name(other).to_owned())),
    };
    let mut parsed = IndexMap::with_capacity(servers.len());
    for (name, server) in servers {
        parsed.insert(name.clone(), parse_server(name, server, env)?);
    }
    Ok(McpConfig { servers: parsed })
}

fn parse_server(
    name: &str,
    server: &JsonValue,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ServerConfig, ConfigError> {
    let JsonValue::Object(fields) = server else {
        return Err(field_error(name, "(server)", format!("must be a map, got {}", json_type_name(server))));
    };
    let known: &[&str] = match (fields.contains_key("command"), fields.contains_key("url")) {
        (true, false) => &["command", "args", "env", "cwd", "sandbox"],
        (false, true) => &["url", "headers"],
        (true, true) => return Err(field_error(name, "(server)", "has both 'command' and 'url'; give one")),
        (false, false) => {
            return Err(field_error(name, "(server)", "needs 'command' (stdio) or 'url' (streamable HTTP)"));
        }
    };
    if let Some(unknown) = fields.keys().find(|key| !known.contains(&key.as_str())) {
        return Err(field_error(name, unknown, format!("unknown field; expected one of {}", known.join(", "))));
    }
    if let Some(url) = fields.get("url") {
        let url = resolve(name, "url", url, env)?;
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(field_error(name, "url", format!("'{url}' is not an http(s) URL")));
        }
        let headers = string_map(name, "headers", fields.get("headers"), env)?;
        return Ok(ServerConfig::Http(HttpServer { url, headers }));
    }
    let command = fields.get("command").map_or(Ok(String::new()), |value| resolve(name, "command", value, env))?;
    if command.trim().is_empty() {
        return Err(field_error(name, "command", "is empty"));
    }
    let args = match fields.get("args") {
        None | Some(JsonValue::Null) => Vec::new(),
        Some(JsonValue::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(index, item)| resolve(name, &format!("args[{index}]"), item, env))
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(field_error(name, "args", format!("must be a list of strings, got {}", json_type_name(other))));
        }
    };
    let env_vars = string_map(name, "env", fields.get("env"), env)?;
    let cwd = match fields.get("cwd") {
        None | Some(JsonValue::Null) => None,
        Some(value) => Some(PathBuf::from(resolve(name, "cwd", value, env)?)),
    };
    let sandbox = match fields.get("sandbox") {
        None | Some(JsonValue::Null) => None,
        Some(value) => Some(parse_sandbox(name, value)?),
    };
    Ok(ServerConfig::Stdio(StdioServer { command, args, env: env_vars, cwd, sandbox }))
}

/// A server's `sandbox`, read as `spec.sandbox` is, its paths and hosts
/// checked now so that a mistake fails the agent's start, not the server's.
fn parse_sandbox(name: &str, value: &JsonValue) -> Result<goondan_config::SandboxConfig, ConfigError> {
    let sandbox: goondan_config::SandboxConfig =
        serde_json::from_value(value.clone()).map_err(|error| field_error(name, "sandbox", error.to_string()))?;
    for (field, entries) in [("sandbox.readable", &sandbox.readable), ("sandbox.writable", &sandbox.writable)] {
        for entry in entries {
            goondan_config::sandbox::check_sandbox_path(entry)
                .map_err(|error| field_error(name, field, error.to_string()))?;
        }
    }
    sandbox.network.targets().map_err(|error| field_error(name, "sandbox.network.allow", error.to_string()))?;
    Ok(sandbox)
}

fn string_map(
    server: &str,
    field: &str,
    value: Option<&JsonValue>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, ConfigError> {
    match value {
        None | Some(JsonValue::Null) => Ok(Vec::new()),
        Some(JsonValue::Object(map)) => map
            .iter()
            .map(|(key, value)| Ok((key.clone(), resolve(server, &format!("{field}.{key}"), value, env)?)))
            .collect(),
        Some(other) => {
            Err(field_error(server, field, format!("must be a map of strings, got {}", json_type_name(other))))
        }
    }
}

/// A literal string, `{value: "..."}`, `{valueFrom: {env: NAME}}` or `{valueFrom: {secretRef: …}}`.
fn resolve(
    server: &str,
    field: &str,
    value: &JsonValue,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, ConfigError> {
    match value {
        JsonValue::String(text) => Ok(text.clone()),
        // Numbers and booleans in env maps are common (`PORT: 8080`).
        JsonValue::Number(number) => Ok(number.to_string()),
        JsonValue::Bool(flag) => Ok(flag.to_string()),
        JsonValue::Object(_) => {
            let Some(source) = ValueSource::from_json(value) else {
                return Err(field_error(
                    server,
                    field,
                    "must be a string, {value: \"...\"}, {valueFrom: {env: NAME}} or {valueFrom: {secretRef: {ref: \
                     Secret/NAME, key: KEY}}}",
                ));
            };
            source
                .resolve(field.rsplit('.').next().unwrap_or(field), env)
                .map_err(|error| field_error(server, field, error.to_string()))
        }
        other => Err(field_error(server, field, format!("must be a string, got {}", json_type_name(other)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: JsonValue) -> JsonObject {
        match value {
            JsonValue::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    fn env(name: &str) -> Option<String> {
        (name == "TOKEN").then(|| "secret".to_owned())
    }

    #[test]
    fn parses_stdio_and_http_servers_resolving_value_forms() {
        let config = object(json!({"servers": {
            "files": {"command": "node", "args": ["server.js", 3], "env": {"A": "1", "T": {"valueFrom": {"env": "TOKEN"}}}, "cwd": "/tmp"},
            "remote": {"url": "https://example.com/mcp", "headers": {"Authorization": {"value": "Bearer x"}}},
        }}));
        let parsed = parse_config(&config, &env).unwrap_or_else(|e| panic!("{e}"));
        let names: Vec<&str> = parsed.servers.keys().map(String::as_str).collect();
        assert_eq!(names, ["files", "remote"]);
        assert_eq!(
            parsed.servers["files"],
            ServerConfig::Stdio(StdioServer {
                command: "node".into(),
                args: vec!["server.js".into(), "3".into()],
                env: vec![("A".into(), "1".into()), ("T".into(), "secret".into())],
                cwd: Some(PathBuf::from("/tmp")),
                sandbox: None,
            })
        );
        assert_eq!(
            parsed.servers["remote"],
            ServerConfig::Http(HttpServer {
                url: "https://example.com/mcp".into(),
                headers: vec![("Authorization".into(), "Bearer x".into())],
            })
        );
    }

    #[test]
    fn errors_name_the_server_and_field() {
        let cases = [
            (json!({"servers": []}), "config.servers must be a map from server name to server, got array"),
            (json!({"servers": {"a": {}}}), "server 'a': (server): needs 'command' (stdio) or 'url' (streamable HTTP)"),
            (
                json!({"servers": {"a": {"command": "x", "env": {"K": {"valueFrom": {"env": "NOPE"}}}}}}),
                "server 'a': env.K: the environment variable 'NOPE' (valueFrom.env) is not set",
            ),
            (
                json!({"servers": {"a": {"command": "x", "args": "y"}}}),
                "server 'a': args: must be a list of strings, got string",
            ),
            (
                json!({"servers": {"a": {"command": "x", "port": 1}}}),
                "server 'a': port: unknown field; expected one of command, args, env, cwd, sandbox",
            ),
            (json!({"servers": {"a": {"url": "ftp://x"}}}), "server 'a': url: 'ftp://x' is not an http(s) URL"),
            (json!({"servers": {"a": {"command": " "}}}), "server 'a': command: is empty"),
        ];
        for (config, expected) in cases {
            let error = parse_config(&object(config), &env).err().map(|e| e.to_string());
            assert_eq!(error.as_deref(), Some(expected));
        }
    }

    #[test]
    fn no_servers_is_empty() {
        assert_eq!(parse_config(&JsonObject::new(), &env), Ok(McpConfig::default()));
    }
}
