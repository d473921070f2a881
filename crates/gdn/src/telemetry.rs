//! OpenTelemetry export in `gdn`: started from the `OTEL_*` variables (the
//! hub's and each agent process's own exporter, one trace across them),
//! flushed before the process exits.
//!
//! ```text
//! gdn run (hub)     connector event ─► `process {connection}` span (root) ─► Inbound.traceparent
//! gdn __agent       events ─► TelemetrySink (goondan-telemetry) ─► invoke_agent / step / chat / execute_tool
//!                   agents__request ─► delegate.traceparent (the tool call's span) ─► the target's turn
//! ```

use std::sync::Arc;
use std::time::Duration;

use goondan_runtime::agent::{AgentOptions, EnvLookup};
use goondan_telemetry::{Exporter, TelemetryConfig, TelemetrySink};
use goondan_tools::{EventSink, FanoutEventSink};

/// How long an exiting process waits for its last spans to be sent.
pub const EXIT_FLUSH: Duration = Duration::from_secs(3);

/// The exporter the variables ask for, if any. A problem is logged and
/// export stays off: telemetry never stops `gdn`.
pub fn start(env: &EnvLookup) -> Option<Exporter> {
    let config = TelemetryConfig::from_lookup_logged(&|name| env(name))?;
    match Exporter::start(config) {
        Ok(exporter) => {
            tracing::debug!("OpenTelemetry: exporting traces to {}", exporter.config().endpoint);
            Some(exporter)
        }
        Err(error) => {
            tracing::warn!("OpenTelemetry export is off: {error}");
            None
        }
    }
}

/// Adds the exporter's sink to an agent's events (its spans are derived
/// from them on the export thread).
pub fn attach(options: &mut AgentOptions, exporter: &Exporter) {
    let sink: Arc<dyn EventSink> = Arc::new(TelemetrySink::new(exporter.clone()));
    options.events = Arc::new(FanoutEventSink::new(vec![Arc::clone(&options.events), sink]));
}

/// Sends what is left before the process exits, within [`EXIT_FLUSH`]
/// (off the async threads: it blocks while the collector answers).
pub async fn flush_at_exit(exporter: Option<Exporter>) {
    let Some(exporter) = exporter else { return };
    let _ = tokio::task::spawn_blocking(move || {
        if !exporter.shutdown(EXIT_FLUSH) {
            tracing::debug!("OpenTelemetry: the last spans were not all sent within {EXIT_FLUSH:?}");
        }
    })
    .await;
}
