//! The `@goondan/base` connectors, native: same names, config keys, event
//! names and properties as the original's (`createBaseConnectorManifests`).

use crate::connector::StartConnector;

pub mod cli;
pub mod discord;
pub mod github;
mod http;
pub mod slack;
pub mod telegram;
pub mod webhook;

/// Each native connector, by its `@goondan/base` Connector name.
const NATIVE: &[(&str, StartConnector)] = &[
    (cli::NAME, cli::start),
    (telegram::NAME, telegram::start),
    ("slack", slack::start),
    ("webhook", webhook::start),
    ("github", github::start),
    ("discord", discord::start),
];

/// The native connector of the `@goondan/base` Connector `name`.
pub fn native(name: &str) -> Option<StartConnector> {
    NATIVE.iter().find(|(known, _)| *known == name).map(|(_, start)| *start)
}

/// The names of the native connectors.
pub fn names() -> impl Iterator<Item = &'static str> {
    NATIVE.iter().map(|(name, _)| *name)
}

/// Where the HTTP connector `name` of `connection` would listen with its
/// resolved `config` (`host:port`), as it reads its keys at start; `None`
/// for a connector that does not listen (`cli`, `telegram-polling`, a
/// connector module). For `gdn doctor`'s port check.
pub fn listen_address(
    name: &str,
    connection: &str,
    config: &std::collections::BTreeMap<String, String>,
) -> Option<Result<(String, u16), crate::connector::ConnectorError>> {
    let (keys, default_port) = match name {
        "slack" => (slack::KEYS, slack::DEFAULT_PORT),
        "webhook" => (webhook::KEYS, webhook::DEFAULT_PORT),
        "github" => (github::KEYS, github::DEFAULT_PORT),
        "discord" => (discord::KEYS, discord::DEFAULT_PORT),
        _ => return None,
    };
    Some(http::Listen::from_values(connection, config, &keys, default_port).map(|listen| (listen.host, listen.port)))
}

/// What the connectors' tests build their inputs with.
#[cfg(test)]
mod test_support {
    use goondan_core::JsonValue;
    use serde_json::Map;

    use super::http::Incoming;

    /// The object `value` is (empty for anything else).
    pub(crate) fn object(value: JsonValue) -> Map<String, JsonValue> {
        match value {
            JsonValue::Object(map) => map,
            _ => Map::new(),
        }
    }

    /// A request with `headers` (those whose value is no header value are
    /// left out) and `body`.
    pub(crate) fn request(headers: &[(&'static str, String)], body: &str) -> Incoming {
        let mut map = axum::http::HeaderMap::new();
        for (name, value) in headers {
            if let Ok(value) = axum::http::HeaderValue::from_str(value) {
                map.insert(*name, value);
            }
        }
        Incoming { headers: map, body: body.as_bytes().to_vec().into() }
    }
}
