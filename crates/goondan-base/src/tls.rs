//! The HTTPS client setup shared by the tools that speak HTTP.
//!
//! TLS is rustls with the *ring* provider and the Mozilla root certificates
//! (`webpki-roots`), configured per client rather than through a process-wide
//! default provider, so nothing global has to be installed first.

use std::sync::Arc;

/// A rustls client configuration with the ring provider and Mozilla roots.
pub fn client_config() -> Result<rustls::ClientConfig, rustls::Error> {
    let roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// A `reqwest` client builder using [`client_config`] and no system proxy
/// (a proxy would hide the address actually connected to).
pub fn client_builder() -> Result<reqwest::ClientBuilder, rustls::Error> {
    Ok(reqwest::Client::builder().tls_backend_preconfigured(client_config()?).no_proxy())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_builds_without_a_process_wide_provider() {
        let client = client_builder().map(reqwest::ClientBuilder::build);
        assert!(matches!(client, Ok(Ok(_))), "{client:?}");
    }
}
