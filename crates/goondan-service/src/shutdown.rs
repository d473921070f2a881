//! SIGTERM and SIGHUP end `gdn` the way Ctrl-C ends a turn: the running
//! turn is cancelled (its tool calls killed, its conversation committed),
//! then the process exits — and no process a tool started is left behind.
//!
//! The two signals are blocked in every thread from the start and received
//! by one thread of their own with `sigwait`, so they are seen even while
//! the main thread blocks (reading a line at the prompt). Child processes
//! start with an empty signal mask (the standard library resets it), so the
//! commands tools run still receive them.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use goondan_core::sync::LockUnpoisoned;

use goondan_base::tool_processes::ToolProcesses;
use nix::sys::signal::{SigSet, Signal};
use tokio::sync::watch;

/// What a termination signal does, and what the run needs to know of it.
pub struct Shutdown {
    /// The signal received (0: none).
    received: AtomicI32,
    /// The command ended as the signal asks, on its own terms (a service
    /// drained): its exit status stands.
    handled: AtomicBool,
    /// Cancels the running turn, if one runs.
    turn: Mutex<Option<watch::Sender<bool>>>,
    processes: Arc<ToolProcesses>,
}

impl std::fmt::Debug for Shutdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shutdown").field("received", &self.received.load(Ordering::Relaxed)).finish_non_exhaustive()
    }
}

impl Shutdown {
    /// Blocks SIGTERM and SIGHUP in this thread — call it before any other
    /// thread exists, so that they all inherit the mask — and starts the
    /// thread that receives them.
    pub fn install(processes: Arc<ToolProcesses>) -> Arc<Self> {
        let shutdown = Arc::new(Self {
            received: AtomicI32::new(0),
            handled: AtomicBool::new(false),
            turn: Mutex::new(None),
            processes,
        });
        let mut signals = SigSet::empty();
        signals.add(Signal::SIGTERM);
        signals.add(Signal::SIGHUP);
        if signals.thread_block().is_err() {
            // The default action (exit) stays; tools' processes are then
            // only ended by their own timeouts.
            return shutdown;
        }
        let receiver = Arc::clone(&shutdown);
        let spawned = std::thread::Builder::new().name("gdn-signals".to_owned()).spawn(move || {
            while let Ok(signal) = signals.wait() {
                receiver.received(signal);
            }
        });
        if spawned.is_err() {
            // Nobody would receive them: let them act as before.
            let _ = signals.thread_unblock();
        }
        shutdown
    }

    fn received(&self, signal: Signal) {
        self.received.store(signal as i32, Ordering::SeqCst);
        let running = self.turn.lock_unpoisoned().clone();
        match running {
            // The turn ends as after Ctrl-C; the run then exits.
            Some(cancel) => {
                tracing::warn!(
                    "{}: stopping (the running turn, the MCP server or the service), then exiting",
                    signal.as_str()
                );
                let _ = cancel.send(true);
            }
            None => {
                self.processes.kill_all();
                goondan_base::tool_processes::kill_descendants();
                std::process::exit(128 + signal as i32);
            }
        }
    }

    /// A turn starts (or `gdn mcp serve` serves); `cancel` cancels it.
    pub fn turn_started(&self, cancel: watch::Sender<bool>) {
        *self.turn.lock_unpoisoned() = Some(cancel);
        // A signal that came just before: cancel at once.
        if self.requested().is_some()
            && let Some(cancel) = self.turn.lock_unpoisoned().as_ref()
        {
            let _ = cancel.send(true);
        }
    }

    /// The turn ended.
    pub fn turn_ended(&self) {
        *self.turn.lock_unpoisoned() = None;
    }

    /// The command stopped as the received signal asked and chose its own
    /// exit status: `gdn run` serving Connections drains and exits 0, as a
    /// service manager expects of a SIGTERM.
    pub fn handled(&self) {
        self.handled.store(true, Ordering::SeqCst);
    }

    /// The exit status the process ends with because of a signal: 128 + its
    /// number, unless the command [handled](Self::handled) it.
    pub fn exit_status(&self) -> Option<u8> {
        if self.handled.load(Ordering::SeqCst) { None } else { self.requested() }
    }

    /// The exit status a received SIGTERM/SIGHUP asks for (128 + its number).
    pub fn requested(&self) -> Option<u8> {
        match self.received.load(Ordering::SeqCst) {
            0 => None,
            signal => u8::try_from(128 + signal).ok(),
        }
    }
}
