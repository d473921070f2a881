//! What a test's `tracing` subscriber wrote, kept in memory: a writer to
//! give `tracing_subscriber::fmt().with_writer(...)` (one clone per write),
//! a plain-text subscriber writing into it, and the text so far, for the
//! test to read back.

use std::sync::{Arc, Mutex};

use goondan_core::sync::LockUnpoisoned;

/// Bytes written, shared by every clone.
#[derive(Debug, Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// A `tracing` subscriber writing plain lines (no colours) into this,
    /// of the events `filter` (`RUST_LOG` syntax) lets through.
    pub fn subscriber(&self, filter: &str) -> impl tracing::Subscriber + Send + Sync + 'static {
        let writer = self.clone();
        tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).with_env_filter(filter).finish()
    }

    /// Everything written so far, as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock_unpoisoned()).into_owned()
    }
}

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock_unpoisoned().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
