//! A Connection's `ingress.rules`: which agent instance an event's turn
//! runs on.
//!
//! Rules are tried in order and the first match wins; `match.event` and
//! every `match.properties` entry must all hold; a rule without `match`
//! matches everything. The route's agent defaults to the Swarm's entry
//! agent; the instance is the event's `instanceKey` unless the route fixes
//! one (`instanceKey`) or takes it from a property (`instanceKeyProperty`,
//! with `instanceKeyPrefix`). A Connection without any rules sends
//! everything to the entry agent; with rules, an event none of them
//! matches is dropped (the caller logs it), never sent anywhere by accident.

use std::collections::BTreeMap;

use goondan_core::{JsonValue, ObjectRef};

use crate::event::{ConnectorEvent, property_text};

/// Where an event's turn runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The agent.
    pub agent: String,
    /// Its instance key.
    pub instance_key: String,
}

/// One rule, read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IngressRule {
    event: Option<String>,
    properties: BTreeMap<String, String>,
    agent: Option<String>,
    instance_key: Option<String>,
    instance_key_property: Option<String>,
    instance_key_prefix: Option<String>,
}

/// Why a Connection's `ingress` cannot be used (the loader's validation
/// reports the same problems earlier, with more context).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Connection '{connection}': spec.ingress{path}: {message}")]
pub struct RouteConfigError {
    connection: String,
    path: String,
    message: String,
}

/// The routing of one Connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Router {
    connection: String,
    entry_agent: String,
    /// `None`: the Connection has no rules (everything to the entry agent).
    rules: Option<Vec<IngressRule>>,
}

fn text(value: Option<&JsonValue>) -> Option<String> {
    value.and_then(JsonValue::as_str).map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned)
}

impl Router {
    /// Reads `spec.ingress` of `connection`, whose Swarm's entry agent is
    /// `entry_agent`.
    pub fn new(connection: &str, ingress: &JsonValue, entry_agent: &str) -> Result<Self, RouteConfigError> {
        let error = |path: String, message: &str| RouteConfigError {
            connection: connection.to_owned(),
            path,
            message: message.to_owned(),
        };
        let rules = match ingress.get("rules") {
            None | Some(JsonValue::Null) => None,
            Some(JsonValue::Array(rules)) => {
                let mut read = Vec::with_capacity(rules.len());
                for (index, rule) in rules.iter().enumerate() {
                    let at = |field: &str| format!(".rules[{index}]{field}");
                    let mut out = IngressRule::default();
                    if let Some(matcher) = rule.get("match").filter(|m| !m.is_null()) {
                        out.event = text(matcher.get("event"));
                        if let Some(properties) = matcher.get("properties").and_then(JsonValue::as_object) {
                            for (key, value) in properties {
                                let value = property_text(value).ok_or_else(|| {
                                    error(
                                        at(&format!(".match.properties.{key}")),
                                        "must be a string, number or boolean",
                                    )
                                })?;
                                out.properties.insert(key.clone(), value);
                            }
                        }
                    }
                    let route = rule.get("route").and_then(JsonValue::as_object).ok_or_else(|| {
                        error(at(".route"), "every rule needs a route (`route: {}` is the entry agent)")
                    })?;
                    if let Some(agent) = route.get("agentRef").filter(|v| !v.is_null()) {
                        let parsed =
                            ObjectRef::parse(agent).map_err(|e| error(at(".route.agentRef"), &e.to_string()))?;
                        out.agent = Some(parsed.name);
                    }
                    out.instance_key = text(route.get("instanceKey"));
                    out.instance_key_property = text(route.get("instanceKeyProperty"));
                    out.instance_key_prefix = text(route.get("instanceKeyPrefix"));
                    if out.instance_key.is_some() && out.instance_key_property.is_some() {
                        return Err(error(at(".route"), "instanceKey and instanceKeyProperty exclude each other"));
                    }
                    read.push(out);
                }
                Some(read)
            }
            Some(_) => return Err(error(".rules".to_owned(), "must be a list of rules")),
        };
        Ok(Self { connection: connection.to_owned(), entry_agent: entry_agent.to_owned(), rules })
    }

    /// The Connection's name.
    pub fn connection(&self) -> &str {
        &self.connection
    }

    /// The agents its rules name (the entry agent when a rule names none).
    pub fn agents(&self) -> Vec<String> {
        match &self.rules {
            None => vec![self.entry_agent.clone()],
            Some(rules) => {
                rules.iter().map(|rule| rule.agent.clone().unwrap_or_else(|| self.entry_agent.clone())).collect()
            }
        }
    }

    /// The event names its rules match on.
    pub fn matched_events(&self) -> impl Iterator<Item = &str> {
        self.rules.iter().flatten().filter_map(|rule| rule.event.as_deref())
    }

    /// Where `event`'s turn runs; `None` when no rule matches.
    pub fn route(&self, event: &ConnectorEvent) -> Option<Route> {
        let Some(rules) = &self.rules else {
            return Some(Route { agent: self.entry_agent.clone(), instance_key: event.instance_key.clone() });
        };
        let rule = rules.iter().find(|rule| {
            rule.event.as_ref().is_none_or(|name| *name == event.name)
                && rule.properties.iter().all(|(key, value)| event.properties.get(key) == Some(value))
        })?;
        let agent = rule.agent.clone().unwrap_or_else(|| self.entry_agent.clone());
        let from_property = rule.instance_key_property.as_ref().and_then(|property| {
            let value = event.properties.get(property).map(|v| v.trim()).filter(|v| !v.is_empty())?;
            Some(format!("{}{value}", rule.instance_key_prefix.as_deref().unwrap_or("")))
        });
        let instance_key = rule.instance_key.clone().or(from_property).unwrap_or_else(|| event.instance_key.clone());
        Some(Route { agent, instance_key })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventMessage;
    use serde_json::json;

    fn event(name: &str, properties: &[(&str, &str)]) -> ConnectorEvent {
        ConnectorEvent {
            name: name.into(),
            message: EventMessage::text("hi"),
            properties: properties.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            instance_key: "telegram:42".into(),
        }
    }

    fn route(agent: &str, key: &str) -> Option<Route> {
        Some(Route { agent: agent.into(), instance_key: key.into() })
    }

    #[test]
    fn the_first_matching_rule_wins_and_matches_are_anded() -> Result<(), RouteConfigError> {
        let router = Router::new(
            "c",
            &json!({"rules": [
                {"match": {"event": "message", "properties": {"chat_id": 7}}, "route": {"agentRef": "Agent/seven"}},
                {"match": {"event": "message"}, "route": {"instanceKeyProperty": "user", "instanceKeyPrefix": "u:"}},
                {"match": {"properties": {"kind": "cmd"}}, "route": {"agentRef": {"kind": "Agent", "name": "cmd"}, "instanceKey": "shared"}},
            ]}),
            "entry",
        )?;
        assert_eq!(router.route(&event("message", &[("chat_id", "7")])), route("seven", "telegram:42"));
        assert_eq!(router.route(&event("message", &[("chat_id", "8"), ("user", "ann")])), route("entry", "u:ann"));
        // The property is missing: the event's own key.
        assert_eq!(router.route(&event("message", &[])), route("entry", "telegram:42"));
        assert_eq!(router.route(&event("other", &[("kind", "cmd")])), route("cmd", "shared"));
        // No rule matches: dropped.
        assert_eq!(router.route(&event("other", &[])), None);
        Ok(())
    }

    #[test]
    fn a_catch_all_and_no_rules_reach_the_entry_agent() -> Result<(), RouteConfigError> {
        let catch_all = Router::new("c", &json!({"rules": [{"route": {}}]}), "entry")?;
        assert_eq!(catch_all.route(&event("x", &[])), route("entry", "telegram:42"));
        let none = Router::new("c", &json!(null), "entry")?;
        assert_eq!(none.route(&event("x", &[])), route("entry", "telegram:42"));
        Ok(())
    }

    #[test]
    fn bad_rules_are_refused_with_the_connection_and_path() {
        let both =
            Router::new("tg", &json!({"rules": [{"route": {"instanceKey": "a", "instanceKeyProperty": "b"}}]}), "e");
        let Err(error) = both else { panic!("accepted both keys") };
        assert_eq!(
            error.to_string(),
            "Connection 'tg': spec.ingress.rules[0].route: instanceKey and instanceKeyProperty exclude each other"
        );
        assert!(Router::new("tg", &json!({"rules": [{"match": {}}]}), "e").is_err());
        assert!(Router::new("tg", &json!({"rules": {}}), "e").is_err());
    }
}
