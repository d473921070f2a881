//! OpenTelemetry trace export (OTLP over HTTP, protobuf), following the
//! GenAI semantic conventions.
//!
//! ```text
//! OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT set ─► TelemetryConfig::from_env
//! turn/step/tool events ─► TelemetrySink::emit   (an owned record into a bounded queue; never waits)
//!                          background thread:    pairs started/ended events into spans
//!                                                (invoke_agent, step, chat, execute_tool),
//!                                                batches, encodes OTLP protobuf, POSTs
//! ```
//!
//! Nothing here runs on a turn's path but the copy into the queue: a full
//! queue or a collector that is down loses spans, never a turn. Unset, no
//! sink is installed at all.

pub mod config;
pub mod exporter;
pub mod otlp;
pub mod sink;
pub mod span;

pub use config::{ConfigError, TelemetryConfig};
pub use exporter::{Exporter, ExporterStats};
pub use sink::TelemetrySink;
pub use span::{AttrValue, SpanKind, SpanRecord, SpanStatus};
