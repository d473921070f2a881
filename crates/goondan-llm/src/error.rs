//! Why a model call failed. Messages never contain API keys.

/// A failed model call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// No API key: names the variable to set.
    #[error("no API key for the {provider} model: set {variable} (or apiKey in the Model resource)")]
    MissingKey {
        /// The provider.
        provider: String,
        /// The environment variable to set.
        variable: String,
    },
    /// The API refused the key (401/403).
    #[error("the {provider} API refused the credentials (HTTP {status}): {message}")]
    Unauthorized {
        /// The provider.
        provider: String,
        /// 401 or 403.
        status: u16,
        /// The API's message.
        message: String,
    },
    /// The API answered with an error status (after retries for 429/5xx).
    #[error("the {provider} API answered HTTP {status}: {message}")]
    Api {
        /// The provider.
        provider: String,
        /// The HTTP status.
        status: u16,
        /// The API's message.
        message: String,
    },
    /// The API could not be reached (after retries).
    #[error("cannot reach the {provider} API at {endpoint}: {message}")]
    Network {
        /// The provider.
        provider: String,
        /// The base URL.
        endpoint: String,
        /// What went wrong.
        message: String,
    },
    /// The API answered something this client cannot read.
    #[error("unexpected reply from the {provider} API: {message}")]
    Protocol {
        /// The provider.
        provider: String,
        /// What was wrong with it.
        message: String,
    },
    /// The Model resource cannot be used.
    #[error("model configuration: {0}")]
    Config(String),
    /// The scripted provider has no reply for this step.
    #[error("scripted model: {0}")]
    Script(String),
    /// The call was cancelled.
    #[error("the model call was cancelled")]
    Cancelled,
}

impl ModelError {
    /// True for failures worth retrying (rate limits, server errors, network).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Api { status, .. } => *status == 429 || *status >= 500,
            Self::Network { .. } => true,
            _ => false,
        }
    }
}
