//! Comparing a secret a client sent with the one expected, so that the
//! answer's timing does not tell how much of a guess was right: every
//! bearer token and session check (`gdn mcp serve`, `gdn studio`) uses this
//! one function.

/// `sent == expected`, in constant time over the expected length.
pub fn secrets_match(sent: &[u8], expected: &[u8]) -> bool {
    let mut differ = u8::from(sent.len() != expected.len());
    for (index, byte) in expected.iter().enumerate() {
        differ |= byte ^ sent.get(index).copied().unwrap_or(0);
    }
    differ == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_whole_secret_matches() {
        assert!(secrets_match(b"s3cr3t", b"s3cr3t"));
        for sent in [&b"s3cr3"[..], b"s3cr3tt", b"S3cr3t", b"", b"s3cr3t\0"] {
            assert!(!secrets_match(sent, b"s3cr3t"), "{sent:?}");
        }
        assert!(secrets_match(b"", b""));
    }
}
