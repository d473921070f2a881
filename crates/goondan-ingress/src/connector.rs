//! What a connector is given and what a started one is.
//!
//! A connector starts in two parts: [`StartConnector`] does what can fail
//! at start-up (reading its config, binding its port), so that `gdn run`
//! stops with a message naming the Connection; the returned
//! [`RunningConnector`]'s task then receives until [`ConnectorContext::stop`]
//! is cancelled, when it stops accepting and returns.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use tokio::io::AsyncRead;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::sink::EventSink;

/// A Connection's resolved secrets. They reach this connector only, and
/// never print (`Debug` shows the names).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretMap(BTreeMap<String, String>);

impl SecretMap {
    /// The secrets, by name.
    pub fn new(values: BTreeMap<String, String>) -> Self {
        Self(values)
    }

    /// A secret, if set and not empty.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str).filter(|v| !v.is_empty())
    }

    /// The names of the secrets.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }

    /// The values, for handing on to a script connector's host.
    pub fn expose(&self) -> &BTreeMap<String, String> {
        &self.0
    }
}

impl fmt::Debug for SecretMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// Standard input, for the `cli` connector.
pub type InputStream = Box<dyn AsyncRead + Send + Unpin>;

/// What a connector gets (the original's `ConnectorContext`, with the
/// service's stop signal).
pub struct ConnectorContext {
    /// The Connection's name.
    pub connection: String,
    /// The Connector's name.
    pub connector: String,
    /// The Connection's `config`, resolved.
    pub config: BTreeMap<String, String>,
    /// The Connection's `secrets`, resolved.
    pub secrets: SecretMap,
    /// Where its events go.
    pub sink: Arc<dyn EventSink>,
    /// Cancelled when the service stops: stop accepting, then return.
    pub stop: CancellationToken,
    /// Standard input, when this connector may read it (only one
    /// Connection of a run gets it).
    pub input: Option<InputStream>,
}

impl fmt::Debug for ConnectorContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectorContext")
            .field("connection", &self.connection)
            .field("connector", &self.connector)
            .field("config", &self.config)
            .field("secrets", &self.secrets)
            .finish_non_exhaustive()
    }
}

impl ConnectorContext {
    /// A config value, if set and not empty.
    pub fn config_value(&self, key: &str) -> Option<&str> {
        self.config.get(key).map(String::as_str).filter(|v| !v.trim().is_empty())
    }

    /// The first of `keys` that is set.
    pub fn first_config<'k>(&self, keys: &[&'k str]) -> Option<(&'k str, String)> {
        keys.iter().find_map(move |key| self.config_value(key).map(|value| (*key, value.to_owned())))
    }

    /// A config error of this Connection.
    pub fn config_error(&self, key: &str, message: impl Into<String>) -> ConnectorError {
        ConnectorError::Config { connection: self.connection.clone(), key: key.to_owned(), message: message.into() }
    }

    /// A failure of this Connection.
    pub fn failed(&self, message: impl Into<String>) -> ConnectorError {
        ConnectorError::Failed { connection: self.connection.clone(), message: message.into() }
    }
}

/// Why a connector could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ConnectorError {
    /// Its port is taken (or not allowed).
    #[error("Connection '{connection}': cannot listen on {addr}: {source}")]
    Bind {
        /// The Connection.
        connection: String,
        /// The address it tried.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// A config key is missing or wrong.
    #[error("Connection '{connection}': config '{key}': {message}")]
    Config {
        /// The Connection.
        connection: String,
        /// The key.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// Anything else.
    #[error("Connection '{connection}': {message}")]
    Failed {
        /// The Connection.
        connection: String,
        /// What happened.
        message: String,
    },
}

/// A started connector.
#[derive(Debug)]
pub struct RunningConnector {
    /// The addresses it listens on (HTTP connectors), as bound.
    pub listening: Vec<SocketAddr>,
    /// Receives until the stop signal; its error, if it fails.
    pub task: JoinHandle<Result<(), ConnectorError>>,
}

/// The future of a connector's start.
pub type StartFuture = Pin<Box<dyn Future<Output = Result<RunningConnector, ConnectorError>> + Send>>;

/// Starts a native connector.
pub type StartConnector = fn(ConnectorContext) -> StartFuture;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let secrets = SecretMap::new(BTreeMap::from([("BOT_TOKEN".to_owned(), "s3cr3t".to_owned())]));
        let shown = format!("{secrets:?}");
        assert!(shown.contains("BOT_TOKEN") && !shown.contains("s3cr3t"), "{shown}");
        assert_eq!(secrets.get("BOT_TOKEN"), Some("s3cr3t"));
    }
}
