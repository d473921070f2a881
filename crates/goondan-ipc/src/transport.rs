//! How messages travel: the [`Link`] trait, and its implementation over a
//! Unix stream socket ([`unix_link`]).
//!
//! An orchestrator holds one link per agent process, an agent process one
//! link to its orchestrator. The trait is all either side uses, so that a
//! broker (NATS: a subject per agent instance, request/reply by correlation
//! id) can replace the socket without changing either side.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite, BufReader, BufWriter};
use tokio::sync::{mpsc, oneshot};

use crate::frame::{self, FrameError};
use crate::message::IpcMessage;

/// A boxed future, as the trait's methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a message could not be sent or received.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The other side is gone (its process exited, the socket closed).
    #[error("the IPC link is closed")]
    Closed,
    /// A frame could not be written or read.
    #[error(transparent)]
    Frame(#[from] FrameError),
}

/// The sending half: cheap to share, usable from any task.
pub trait Link: Send + Sync + fmt::Debug {
    /// Queues `message`; resolves once it is handed to the transport (not
    /// when the peer has read it). A message over the size limit is an
    /// error here, before anything is sent.
    fn send(&self, message: IpcMessage) -> BoxFuture<'_, Result<(), LinkError>>;
    /// Resolves once every message sent before it has been written (or the
    /// link has closed): a process calls it before it exits, so that its
    /// last messages are not lost with it.
    fn flush(&self) -> BoxFuture<'_, ()>;
}

/// The receiving half: one reader.
pub trait LinkReceiver: Send + fmt::Debug {
    /// The next message; `Ok(None)` when the peer closed the link cleanly.
    fn recv(&mut self) -> BoxFuture<'_, Result<Option<IpcMessage>, LinkError>>;
}

/// A shared sending half.
pub type LinkSender = Arc<dyn Link>;

/// How many frames may wait for the writer before `send` waits.
const QUEUE: usize = 1024;

/// What the writer task is handed.
enum Outgoing {
    Frame(Vec<u8>),
    Flush(oneshot::Sender<()>),
}

struct UnixLink {
    frames: mpsc::Sender<Outgoing>,
}

impl fmt::Debug for UnixLink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UnixLink").field("closed", &self.frames.is_closed()).finish()
    }
}

impl Link for UnixLink {
    fn send(&self, message: IpcMessage) -> BoxFuture<'_, Result<(), LinkError>> {
        Box::pin(async move {
            let frame = frame::encode(&message)?;
            self.frames.send(Outgoing::Frame(frame)).await.map_err(|_| LinkError::Closed)
        })
    }

    fn flush(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let (done, written) = oneshot::channel();
            if self.frames.send(Outgoing::Flush(done)).await.is_ok() {
                let _ = written.await;
            }
        })
    }
}

struct UnixReceiver<R> {
    reader: BufReader<R>,
    buffer: Vec<u8>,
}

impl<R> fmt::Debug for UnixReceiver<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UnixReceiver").finish_non_exhaustive()
    }
}

impl<R: AsyncRead + Unpin + Send> LinkReceiver for UnixReceiver<R> {
    fn recv(&mut self) -> BoxFuture<'_, Result<Option<IpcMessage>, LinkError>> {
        Box::pin(async move { Ok(frame::read_frame(&mut self.reader, &mut self.buffer).await?) })
    }
}

/// A link over the two halves of a stream (a `tokio::net::UnixStream`'s
/// `into_split()`). A task of the current runtime writes the frames in
/// order; it ends when every sender is dropped or a write fails.
pub fn unix_link<R, W>(read: R, write: W) -> (LinkSender, Box<dyn LinkReceiver>)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (frames, mut queued) = mpsc::channel::<Outgoing>(QUEUE);
    tokio::spawn(async move {
        let mut writer = BufWriter::new(write);
        while let Some(outgoing) = queued.recv().await {
            match outgoing {
                Outgoing::Frame(frame) => {
                    if let Err(error) = frame::write_frame(&mut writer, &frame).await {
                        tracing::debug!(target: "goondan::ipc", "writing a frame failed: {error}");
                        break;
                    }
                }
                // Frames are flushed as they are written: all before it are out.
                Outgoing::Flush(done) => {
                    let _ = done.send(());
                }
            }
        }
        // Dropping `queued` closes the channel: senders see `Closed`.
    });
    let receiver = UnixReceiver { reader: BufReader::new(read), buffer: Vec::new() };
    (Arc::new(UnixLink { frames }), Box::new(receiver))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{CancelPayload, Routed};

    #[tokio::test]
    async fn messages_cross_a_socket_in_order_and_the_end_is_seen() {
        let (left, right) = match tokio::net::UnixStream::pair() {
            Ok(pair) => pair,
            Err(error) => panic!("socketpair: {error}"),
        };
        let (left_read, left_write) = left.into_split();
        let (right_read, right_write) = right.into_split();
        let (to_right, _from_right) = unix_link(left_read, left_write);
        let (to_left, mut at_right) = unix_link(right_read, right_write);
        for n in 0..100 {
            let message = IpcMessage::Cancel(Routed::new("a", "b", CancelPayload { reason: format!("{n}") }));
            assert!(to_right.send(message).await.is_ok());
        }
        for n in 0..100 {
            match at_right.recv().await {
                Ok(Some(IpcMessage::Cancel(m))) => assert_eq!(m.payload.reason, format!("{n}")),
                other => panic!("{other:?}"),
            }
        }
        drop(to_right);
        drop(_from_right);
        // The left side is gone: the right side reads the end.
        assert!(matches!(at_right.recv().await, Ok(None)));
        drop(to_left);
    }
}
