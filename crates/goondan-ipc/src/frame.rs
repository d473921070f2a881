//! One message on a byte stream: a 4-byte big-endian length, then that many
//! bytes of JSON.
//!
//! A length prefix (not newline-delimited JSON) so that a message's size is
//! known before it is read: an oversized frame is refused without reading
//! it into memory, and a reader never scans for a delimiter.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::message::IpcMessage;

/// The largest frame either side sends or accepts (16 MiB): far above a
/// step's tool output budget (1 MiB) and a reply, well below memory trouble.
pub const MAX_FRAME_BYTES: usize = 16 << 20;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The stream failed.
    #[error("IPC stream: {0}")]
    Io(#[from] std::io::Error),
    /// A frame above [`MAX_FRAME_BYTES`].
    #[error("IPC frame of {size} bytes is over the {MAX_FRAME_BYTES}-byte limit")]
    TooLarge {
        /// Its size.
        size: usize,
    },
    /// The bytes were not a message.
    #[error("IPC frame is not a valid message: {0}")]
    Invalid(#[from] serde_json::Error),
}

/// Serializes `message` into one frame (length prefix included).
pub fn encode(message: &IpcMessage) -> Result<Vec<u8>, FrameError> {
    let mut bytes = vec![0; 4];
    serde_json::to_writer(&mut bytes, message)?;
    let size = bytes.len() - 4;
    if size > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge { size });
    }
    let prefix = u32::try_from(size).map_err(|_| FrameError::TooLarge { size })?.to_be_bytes();
    bytes[..4].copy_from_slice(&prefix);
    Ok(bytes)
}

/// Writes one encoded frame.
pub async fn write_frame<W: AsyncWrite + Unpin>(writer: &mut W, frame: &[u8]) -> Result<(), FrameError> {
    writer.write_all(frame).await?;
    writer.flush().await?;
    Ok(())
}

/// Reads one message; `Ok(None)` at a clean end of the stream (between frames).
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    buffer: &mut Vec<u8>,
) -> Result<Option<IpcMessage>, FrameError> {
    let mut prefix = [0u8; 4];
    match reader.read_exact(&mut prefix).await {
        Ok(_) => {}
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(error) => return Err(error.into()),
    }
    let size = u32::from_be_bytes(prefix) as usize;
    if size > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge { size });
    }
    buffer.clear();
    buffer.resize(size, 0);
    reader.read_exact(buffer).await?;
    Ok(Some(serde_json::from_slice(buffer)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Routed, ShutdownPayload};

    #[tokio::test]
    async fn a_frame_round_trips_and_the_end_is_clean() {
        let message = IpcMessage::Shutdown(Routed::new(
            "orchestrator",
            "a@k",
            ShutdownPayload { grace_period_ms: 5000, reason: "done".into() },
        ));
        let mut bytes = encode(&message).unwrap_or_default();
        bytes.extend(encode(&message).unwrap_or_default());
        let mut reader = bytes.as_slice();
        let mut buffer = Vec::new();
        for _ in 0..2 {
            let read = read_frame(&mut reader, &mut buffer).await.ok().flatten();
            assert_eq!(read.as_ref(), Some(&message));
        }
        assert!(matches!(read_frame(&mut reader, &mut buffer).await, Ok(None)));
    }

    #[tokio::test]
    async fn an_oversized_or_garbled_frame_is_an_error_not_a_panic() {
        let mut huge = (u32::MAX).to_be_bytes().to_vec();
        huge.extend(b"{}");
        let mut buffer = Vec::new();
        assert!(matches!(read_frame(&mut huge.as_slice(), &mut buffer).await, Err(FrameError::TooLarge { .. })));
        let mut garbled = 3u32.to_be_bytes().to_vec();
        garbled.extend(b"{x}");
        assert!(matches!(read_frame(&mut garbled.as_slice(), &mut buffer).await, Err(FrameError::Invalid(_))));
        let mut torn = 10u32.to_be_bytes().to_vec();
        torn.extend(b"{}");
        assert!(matches!(read_frame(&mut torn.as_slice(), &mut buffer).await, Err(FrameError::Io(_))));
    }
}
