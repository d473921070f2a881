//! What a test's `tracing` subscriber wrote, kept in memory: a writer to
//! give `tracing_subscriber::fmt().with_writer(...)` (one clone per write)
//! and the text so far, for the test to read back.

use std::sync::{Arc, Mutex};

use goondan_core::sync::LockUnpoisoned;

/// Bytes written, shared by every clone.
#[derive(Debug, Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
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
