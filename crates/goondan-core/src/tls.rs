//! The one HTTPS client setup of goondan-rs (behind the `tls` feature).
//!
//! TLS is rustls with the *ring* provider and the Mozilla root certificates
//! (`webpki-roots`), set on each client rather than through a process-wide
//! default provider, so nothing global has to be installed first. Every
//! crate that speaks HTTP — model providers, tools, connectors, MCP,
//! telemetry — starts from [`client_builder`] and adds what is its own
//! (timeouts, a guarded resolver, a redirect policy). Building a client
//! reads no file and opens no connection.

use std::sync::Arc;

/// Whether a client goes through the proxy the environment names
/// (`HTTPS_PROXY`, `ALL_PROXY`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SystemProxy {
    /// The proxy is used: an operator behind one still reaches the model
    /// APIs and Telegram.
    Honoured,
    /// Connections go straight to their target. Required wherever the
    /// address connected to is checked (the SSRF guard's resolver never sees
    /// the target through a proxy), and chosen for local services (MCP
    /// servers, an OpenTelemetry collector).
    Ignored,
}

/// Why no client configuration could be made.
#[derive(Debug, thiserror::Error)]
#[error("TLS setup failed: {0}")]
pub struct TlsError(#[from] rustls::Error);

/// A rustls client configuration: the ring provider, its safe default
/// protocol versions, the Mozilla roots, no client certificate.
pub fn client_config() -> Result<rustls::ClientConfig, TlsError> {
    let roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// A `reqwest` client builder using [`client_config`], with or without the
/// environment's proxy.
pub fn client_builder(proxy: SystemProxy) -> Result<reqwest::ClientBuilder, TlsError> {
    let builder = reqwest::Client::builder().tls_backend_preconfigured(client_config()?);
    Ok(match proxy {
        SystemProxy::Honoured => builder,
        SystemProxy::Ignored => builder.no_proxy(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_builds_without_a_process_wide_provider() {
        for proxy in [SystemProxy::Honoured, SystemProxy::Ignored] {
            let client = client_builder(proxy).map(reqwest::ClientBuilder::build);
            assert!(matches!(client, Ok(Ok(_))), "{proxy:?}: {client:?}");
        }
    }
}
