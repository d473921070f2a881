//! Why a model call failed. Messages never contain API keys: every API
//! provider passes its errors through [`ModelError::redact`] before
//! returning them.

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

/// What replaces a secret in a message.
const REDACTED: &str = "<redacted>";

/// Keys shorter than this are not looked for: local servers often take any
/// key (`none`, `x`), which is no secret, and replacing it would blank out
/// ordinary words.
const MIN_SECRET_LEN: usize = 8;

impl ModelError {
    /// A short name of the kind of failure (telemetry's `error.type`).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::MissingKey { .. } => "missing_key",
            Self::Unauthorized { .. } => "unauthorized",
            Self::Api { .. } => "api_error",
            Self::Network { .. } => "network",
            Self::Protocol { .. } => "protocol",
            Self::Config(_) => "config",
            Self::Script(_) => "script",
            Self::Cancelled => "cancelled",
        }
    }

    /// A [`ModelError::Protocol`] of `provider`.
    pub(crate) fn protocol(provider: &str, message: impl Into<String>) -> Self {
        Self::Protocol { provider: provider.to_owned(), message: message.into() }
    }

    /// This error with `secret` scrubbed from its message: the key itself
    /// (when it is at least 8 characters long) and any masked key an API
    /// echoes (a word with `***` in it, as in OpenAI's `sk-abc***…wxyz`)
    /// become `<redacted>`. API messages should never quote a key; this is
    /// defence in depth, applied the same way by every API provider.
    pub fn redact(self, secret: &str) -> Self {
        let clean = |message: String| redact_message(&message, secret);
        match self {
            Self::Unauthorized { provider, status, message } => {
                Self::Unauthorized { provider, status, message: clean(message) }
            }
            Self::Api { provider, status, message } => Self::Api { provider, status, message: clean(message) },
            Self::Network { provider, endpoint, message } => {
                Self::Network { provider, endpoint: clean(endpoint), message: clean(message) }
            }
            Self::Protocol { provider, message } => Self::Protocol { provider, message: clean(message) },
            Self::Config(message) => Self::Config(clean(message)),
            Self::Script(message) => Self::Script(clean(message)),
            other @ (Self::MissingKey { .. } | Self::Cancelled) => other,
        }
    }

    /// True for failures worth retrying (rate limits, server errors, network).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Api { status, .. } => *status == 429 || *status >= 500,
            Self::Network { .. } => true,
            _ => false,
        }
    }
}

fn redact_message(message: &str, secret: &str) -> String {
    let message = if secret.len() >= MIN_SECRET_LEN { message.replace(secret, REDACTED) } else { message.to_owned() };
    if !message.contains("***") {
        return message;
    }
    message
        .split(' ')
        .map(|word| {
            if word.contains("***") {
                // Keep the punctuation that ends the sentence.
                let kept = word.trim_end_matches(['.', ',', ';', ':', ')']);
                format!("{REDACTED}{}", &word[kept.len()..])
            } else {
                word.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "sk-test-0123456789SECRET";

    #[test]
    fn keys_and_masked_keys_are_redacted_from_every_message() {
        let api = ModelError::Api {
            provider: "x".into(),
            status: 401,
            message: format!("Incorrect API key provided: sk-tes***********CRET. Bearer {KEY}, again {KEY}."),
        };
        assert_eq!(
            api.redact(KEY).to_string(),
            "the x API answered HTTP 401: Incorrect API key provided: <redacted>. Bearer <redacted>, again <redacted>."
        );
        let network = ModelError::Network {
            provider: "x".into(),
            endpoint: format!("http://proxy/{KEY}"),
            message: format!("error sending request for url (http://proxy/{KEY}/chat)"),
        };
        let shown = network.redact(KEY).to_string();
        assert!(!shown.contains(KEY) && shown.contains("<redacted>"), "{shown}");
        for error in [ModelError::protocol("x", KEY), ModelError::Config(KEY.into()), ModelError::Script(KEY.into())] {
            assert!(!error.redact(KEY).to_string().contains(KEY));
        }
    }

    #[test]
    fn short_keys_are_left_alone() {
        let error = ModelError::protocol("x", "none of this is secret");
        assert_eq!(error.clone().redact("none"), error);
        assert_eq!(error.clone().redact(""), error);
    }
}
