//! The Connections a swarm's service runs, planned from the bundle: each
//! one's connector (native or a script's), its `config` and `secrets`
//! resolved from the environment, and its routing. Every problem is
//! reported, each naming its Connection; nothing starts here.

use std::collections::{BTreeMap, BTreeSet};

use goondan_config::{AnyResource, Bundle, ValueSource, ValueSourceError};
use goondan_core::{JsonObject, ObjectRef};
use goondan_ingress::routing::Router;
use goondan_ingress::{SecretMap, StartConnector};

/// How a Connection's connector runs.
#[derive(Clone)]
pub enum ConnectorKind {
    /// A `@goondan/base` connector, native.
    Native(StartConnector),
    /// A connector module of the bundle, in a Bun host of its own.
    Script(goondan_script::connector::ScriptConnector),
}

/// One Connection, ready to start.
#[derive(Clone)]
pub struct ConnectionPlan {
    /// The Connection's name.
    pub name: String,
    /// Its Connector's name.
    pub connector: String,
    /// How the connector runs.
    pub kind: ConnectorKind,
    /// `config`, resolved.
    pub config: BTreeMap<String, String>,
    /// `secrets`, resolved.
    pub secrets: SecretMap,
    /// Its routing.
    pub router: Router,
}

/// The environment variables Connections read for their `secrets`: they
/// reach the connectors only.
pub fn connection_secret_variables(bundle: &Bundle) -> BTreeSet<String> {
    bundle
        .resources()
        .iter()
        .filter_map(|r| match &r.resource {
            AnyResource::Connection(connection) => Some(connection),
            _ => None,
        })
        .flat_map(|connection| connection.spec.secrets.iter())
        .flat_map(|(key, value)| ValueSource::env_variables_of(value, key))
        .collect()
}

/// The variables withheld from agent processes: those Connections read
/// for their `secrets`, unless a built-in tool or another resource of the
/// bundle reads them too (`TELEGRAM_BOT_TOKEN` feeds the connector and
/// `telegram__send` alike; a Model's key, an MCP server's `env` or
/// `headers` with `valueFrom.env` are the agent's to read).
pub fn agent_withheld_variables(bundle: &Bundle) -> BTreeSet<String> {
    let mut used_by_agents: BTreeSet<String> =
        goondan_base::settings::ENV_VARS.iter().map(|name| (*name).to_owned()).collect();
    used_by_agents.extend(crate::secrets::names_read_outside_connections(bundle));
    connection_secret_variables(bundle).into_iter().filter(|name| !used_by_agents.contains(name)).collect()
}

/// The Swarm a Connection feeds: its `swarmRef`, else the bundle's first.
fn swarm_of_connection(bundle: &Bundle, swarm_ref: Option<&ObjectRef>) -> Option<String> {
    match swarm_ref {
        Some(reference) => Some(reference.name.clone()),
        None => bundle.all_swarms().first().map(|s| s.name().to_owned()),
    }
}

fn resolve_values(
    connection: &str,
    field: &str,
    values: &JsonObject,
    env: &dyn Fn(&str) -> Option<String>,
    required: bool,
    errors: &mut Vec<String>,
) -> BTreeMap<String, String> {
    let mut resolved = BTreeMap::new();
    for (key, value) in values {
        let source: Option<ValueSource> = serde_json::from_value(value.clone()).ok();
        match source.as_ref().map(|source| source.resolve(key, env)) {
            Some(Ok(value)) => {
                resolved.insert(key.clone(), value);
            }
            Some(Err(ValueSourceError::Unset { variable })) if required => errors.push(format!(
                "Connection '{connection}': spec.{field}.{key} reads the environment variable {variable}, which is not set"
            )),
            Some(Err(error @ ValueSourceError::SecretUnset { .. })) if required => {
                errors.push(format!("Connection '{connection}': spec.{field}.{key}: {error}"))
            }
            Some(Err(error @ (ValueSourceError::Unset { .. } | ValueSourceError::SecretUnset { .. }))) => {
                tracing::info!(connection, "spec.{field}.{key}: {error}; the key is left out")
            }
            Some(Err(error)) => errors.push(format!("Connection '{connection}': spec.{field}.{key}: {error}")),
            // A plain string is taken as the value (the loader's schema has
            // already reported anything else).
            _ => match value.as_str() {
                Some(text) => {
                    resolved.insert(key.clone(), text.to_owned());
                }
                None => errors.push(format!(
                    "Connection '{connection}': spec.{field}.{key} {}",
                    ValueSourceError::Shape
                )),
            },
        }
    }
    resolved
}

/// Plans the Connections that feed `swarm`; every problem is reported,
/// each naming its Connection.
pub fn plan_connections(
    bundle: &Bundle,
    swarm: &str,
    entry_agent: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<ConnectionPlan>, Vec<String>> {
    let mut plans = Vec::new();
    let mut errors = Vec::new();
    for resource in bundle.resources() {
        let AnyResource::Connection(connection) = &resource.resource else { continue };
        let name = connection.name();
        if swarm_of_connection(bundle, connection.spec.swarm_ref.as_ref()).as_deref() != Some(swarm) {
            continue;
        }
        let reference = &connection.spec.connector_ref;
        let connector = match bundle.resolve(reference) {
            Ok(resolved) => match resolved.resource {
                AnyResource::Connector(connector) => Some((resolved.scope, connector)),
                _ => None,
            },
            Err(_) => None,
        };
        let Some((scope, connector)) = connector else {
            errors.push(format!("Connection '{name}': its connectorRef {reference} is not a Connector of the bundle"));
            continue;
        };
        let kind = if matches!(scope, goondan_config::PackageScope::Base) {
            match goondan_ingress::connectors::native(connector.name()) {
                Some(start) => ConnectorKind::Native(start),
                None => {
                    errors.push(format!(
                        "Connection '{name}': the @goondan/base Connector '{}' has no native implementation (native: {})",
                        connector.name(),
                        goondan_ingress::connectors::names().collect::<Vec<_>>().join(", ")
                    ));
                    continue;
                }
            }
        } else {
            // Confined unless the Swarm's agents run unconfined: a bundle that
            // chose `policy: full` for them chose it for its connectors too.
            let unconfined =
                bundle.sandbox_for(entry_agent, Some(swarm)).config.policy == goondan_config::SandboxPolicy::Full;
            ConnectorKind::Script(
                // A dependency's connector lives in its package's directory.
                goondan_script::connector::ScriptConnector::new(
                    bundle.package(scope).map_or(bundle.root(), goondan_config::Bundle::root),
                    &connector.spec.entry,
                )
                .confined(!unconfined),
            )
        };
        let config = resolve_values(name, "config", &connection.spec.config, env, false, &mut errors);
        let secrets = resolve_values(name, "secrets", &connection.spec.secrets, env, true, &mut errors);
        let router = match Router::new(name, &connection.spec.ingress, entry_agent) {
            Ok(router) => router,
            Err(error) => {
                errors.push(error.to_string());
                continue;
            }
        };
        plans.push(ConnectionPlan {
            name: name.to_owned(),
            connector: connector.name().to_owned(),
            kind,
            config,
            secrets: SecretMap::new(secrets),
            router,
        });
    }
    if errors.is_empty() { Ok(plans) } else { Err(errors) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(yaml: &str) -> Result<(tempfile::TempDir, Bundle), String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        std::fs::write(dir.path().join("goondan.yaml"), yaml).map_err(|e| e.to_string())?;
        let report = goondan_config::load_bundle(dir.path());
        match report.valid_bundle() {
            Some(bundle) => Ok((dir, bundle.clone())),
            None => Err(format!("{:?}", report.diagnostics)),
        }
    }

    #[test]
    fn only_variables_that_connections_alone_read_are_withheld_from_agents() -> Result<(), String> {
        let (_dir, bundle) = bundle(
            r#"apiVersion: goondan.ai/v1
kind: Model
metadata: {name: m}
spec:
  provider: openai
  model: x
  apiKey: {valueFrom: {env: MODEL_KEY}}
---
apiVersion: goondan.ai/v1
kind: Agent
metadata: {name: a}
spec:
  modelConfig: {modelRef: Model/m}
  extensions:
    - ref: {kind: Extension, name: mcp, package: "@goondan/base"}
      config:
        servers:
          tracker:
            url: "http://127.0.0.1:9/mcp"
            headers: {Authorization: {valueFrom: {env: SHARED_KEY}}}
---
apiVersion: goondan.ai/v1
kind: Swarm
metadata: {name: s}
spec: {entryAgent: Agent/a, agents: [Agent/a]}
---
apiVersion: goondan.ai/v1
kind: Connection
metadata: {name: c}
spec:
  connectorRef: {kind: Connector, name: cli, package: "@goondan/base"}
  swarmRef: Swarm/s
  secrets:
    ONLY: {valueFrom: {env: CONNECTION_ONLY}}
    SHARED: {valueFrom: {env: SHARED_KEY}}
    MODEL: {valueFrom: {env: MODEL_KEY}}
    BOT: {valueFrom: {env: TELEGRAM_BOT_TOKEN}}
"#,
        )?;
        let all: Vec<String> = connection_secret_variables(&bundle).into_iter().collect();
        assert_eq!(all, ["CONNECTION_ONLY", "MODEL_KEY", "SHARED_KEY", "TELEGRAM_BOT_TOKEN"]);
        let withheld: Vec<String> = agent_withheld_variables(&bundle).into_iter().collect();
        assert_eq!(withheld, ["CONNECTION_ONLY"]);
        Ok(())
    }

    #[test]
    fn connection_secrets_from_a_secret_ref_are_read_and_withheld_like_env_ones() -> Result<(), String> {
        let (_dir, bundle) = bundle(
            r#"apiVersion: goondan.ai/v1
kind: Model
metadata: {name: m}
spec: {provider: openai, model: x, apiKey: {value: k}}
---
apiVersion: goondan.ai/v1
kind: Agent
metadata: {name: a}
spec:
  modelConfig: {modelRef: Model/m}
---
apiVersion: goondan.ai/v1
kind: Swarm
metadata: {name: s}
spec: {entryAgent: Agent/a, agents: [Agent/a]}
---
apiVersion: goondan.ai/v1
kind: Connection
metadata: {name: c}
spec:
  connectorRef: {kind: Connector, name: cli, package: "@goondan/base"}
  swarmRef: Swarm/s
  config:
    MODE: {valueFrom: {secretRef: {ref: Secret/bot, key: mode}}}
  secrets:
    BOT_TOKEN: {valueFrom: {secretRef: {ref: Secret/bot}}}
"#,
        )?;
        let withheld: Vec<String> = agent_withheld_variables(&bundle).into_iter().collect();
        assert_eq!(
            withheld,
            ["GOONDAN_SECRET_BOT", "GOONDAN_SECRET_BOT_BOT_TOKEN", "SECRET_BOT", "SECRET_BOT_BOT_TOKEN"]
        );
        let env = |name: &str| match name {
            "SECRET_BOT_BOT_TOKEN" => Some("t-1".to_owned()),
            "GOONDAN_SECRET_BOT_MODE" => Some("polling".to_owned()),
            _ => None,
        };
        let plans = plan_connections(&bundle, "s", "a", &env).map_err(|e| e.join("; "))?;
        assert_eq!(plans[0].config.get("MODE").map(String::as_str), Some("polling"));
        assert_eq!(plans[0].secrets.get("BOT_TOKEN"), Some("t-1"));
        let errors = plan_connections(&bundle, "s", "a", &|_: &str| None).err().unwrap_or_default();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("Connection 'c': spec.secrets.BOT_TOKEN: the secret Secret/bot (valueFrom.secretRef) is not set: set one of GOONDAN_SECRET_BOT_BOT_TOKEN"),
            "{errors:?}"
        );
        Ok(())
    }
}
