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
