//! Connecting to the NATS server. Credentials come from the environment
//! only, under the names the `nats` command-line tools use — never from a
//! `goondan.yaml` value — and are read here, once, where they are used.
//! The client reconnects by itself for as long as the process runs.

use std::time::Duration;

/// Why the broker could not be used.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    /// The server could not be reached or refused us.
    #[error("cannot connect to the NATS server at {url}: {reason}")]
    Connect { url: String, reason: String },
    /// `NATS_CREDS` names a file that cannot be read.
    #[error("NATS_CREDS ({path}): {reason}")]
    Credentials { path: String, reason: String },
    /// A JetStream request failed.
    #[error("JetStream: {0}")]
    JetStream(String),
}

impl NatsError {
    pub(crate) fn js(error: impl std::fmt::Display) -> Self {
        Self::JetStream(error.to_string())
    }
}

/// The variables the credentials are read from.
pub const CREDENTIAL_VARIABLES: [&str; 4] = ["NATS_CREDS", "NATS_TOKEN", "NATS_USER", "NATS_PASSWORD"];

/// Connects to `url` as `name` (shown in the server's connection list),
/// with the credentials `env` has (the process environment, or where
/// `gdn` keeps the secrets it took out of it). Waits up to `first_try` for
/// the first connection; after that the client reconnects on its own.
pub async fn connect(
    url: &str,
    name: &str,
    first_try: Duration,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<async_nats::Client, NatsError> {
    let mut options = async_nats::ConnectOptions::new()
        .name(name)
        .max_reconnects(None::<usize>)
        .ping_interval(Duration::from_secs(2))
        .connection_timeout(first_try)
        .reconnect_delay_callback(|attempts| Duration::from_millis((50 * attempts as u64).min(1_000)))
        .event_callback(|event| async move {
            match event {
                async_nats::Event::Disconnected => tracing::warn!(target: "goondan::nats", "disconnected from NATS"),
                async_nats::Event::Connected => tracing::info!(target: "goondan::nats", "connected to NATS"),
                other => tracing::debug!(target: "goondan::nats", "NATS: {other}"),
            }
        });
    let var = |name: &str| env(name).filter(|value| !value.is_empty());
    if let Some(path) = var("NATS_CREDS") {
        options = options
            .credentials_file(&path)
            .await
            .map_err(|error| NatsError::Credentials { path: path.clone(), reason: error.to_string() })?;
    } else if let Some(token) = var("NATS_TOKEN") {
        options = options.token(token);
    } else if let Some(user) = var("NATS_USER") {
        options = options.user_and_password(user, var("NATS_PASSWORD").unwrap_or_default());
    }
    options.connect(url).await.map_err(|error| NatsError::Connect { url: url.to_owned(), reason: error.to_string() })
}
