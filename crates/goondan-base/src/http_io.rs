//! Reading replies, shared by the tools that speak HTTP (`http-fetch`,
//! `telegram`, `slack`): a body read with a byte cap, so that memory stays
//! bounded however much a server sends, and a request error described
//! without the URL it quotes.

/// A body read up to a cap.
#[derive(Debug)]
pub(crate) struct CappedBody {
    /// At most the cap's worth of the body.
    pub(crate) bytes: Vec<u8>,
    /// The server sent more than the cap (the rest was not read).
    pub(crate) truncated: bool,
}

/// Reads `response`'s body chunk by chunk, keeping at most `cap` bytes; as
/// soon as more arrives it stops reading (the connection is dropped with the
/// response) and reports the body as `truncated`.
pub(crate) async fn read_capped(response: &mut reqwest::Response, cap: usize) -> Result<CappedBody, reqwest::Error> {
    let expected = response.content_length();
    let initial = expected.map_or(64 * 1024, |len| usize::try_from(len).unwrap_or(usize::MAX));
    let mut bytes: Vec<u8> = Vec::with_capacity(initial.min(cap).min(1024 * 1024));
    while let Some(chunk) = response.chunk().await? {
        let room = cap - bytes.len();
        if chunk.len() > room {
            bytes.extend_from_slice(&chunk[..room]);
            return Ok(CappedBody { bytes, truncated: true });
        }
        bytes.extend_from_slice(&chunk);
        // A full buffer with nothing more announced needs no further read.
        if bytes.len() == cap && expected == Some(cap as u64) {
            break;
        }
    }
    Ok(CappedBody { bytes, truncated: false })
}

/// `error` as text with its causes, which say what actually went wrong, but
/// without the URL `reqwest` quotes (it may hold a token, and callers name
/// the request themselves).
pub(crate) fn describe_error(error: reqwest::Error) -> String {
    let error = error.without_url();
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_http::closed_base;

    #[tokio::test]
    async fn errors_are_described_without_their_url() {
        let url = format!("{}/bot123:secret/getMe", closed_base().await);
        let Ok(Ok(client)) = goondan_core::tls::client_builder(goondan_core::tls::SystemProxy::Ignored)
            .map(reqwest::ClientBuilder::build)
        else {
            panic!("client")
        };
        let Err(error) = client.get(&url).send().await else { panic!("a closed port answered") };
        assert!(error.to_string().contains("secret"), "{error}");
        let text = describe_error(error);
        assert!(!text.contains("secret"), "{text}");
        assert!(text.starts_with("error sending request"), "{text}");
        assert!(text.contains("onnect"), "{text}");
    }
}
