//! The standard `OTEL_*` variables, read once into a [`TelemetryConfig`].
//!
//! | variable | meaning here |
//! |---|---|
//! | `OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER=none` | no export |
//! | `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` | the URL spans are POSTed to, as written |
//! | `OTEL_EXPORTER_OTLP_ENDPOINT` | a base URL: `/v1/traces` is appended |
//! | `OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL` | `http/protobuf` (default); `grpc` and `http/json` are refused with a warning |
//! | `OTEL_EXPORTER_OTLP_[TRACES_]HEADERS` | `key=value,…`, values percent-decoded |
//! | `OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT` | milliseconds per export (default 10 000) |
//! | `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES` | the resource (`service.name` default `gdn`) |
//! | `OTEL_BSP_SCHEDULE_DELAY`, `OTEL_BSP_MAX_QUEUE_SIZE`, `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` | batching |
//! | `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true` | tool-call arguments and model text on spans |
//!
//! Without an endpoint nothing is exported (the SDKs' default of
//! `localhost:4318` is not assumed: an unset variable must cost nothing).

use std::fmt;
use std::time::Duration;

/// Why the variables cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// A protocol other than `http/protobuf`.
    #[error(
        "OTEL_EXPORTER_OTLP_PROTOCOL={0} is not supported: gdn exports OTLP over HTTP with protobuf (use http/protobuf and the collector's HTTP port, usually 4318)"
    )]
    Protocol(String),
    /// The endpoint is not an http(s) URL.
    #[error("the OTLP endpoint {0:?} is not an http:// or https:// URL")]
    Endpoint(String),
}

/// Where and how spans are exported.
#[derive(Clone, PartialEq, Eq)]
pub struct TelemetryConfig {
    /// The full URL of the traces endpoint (`…/v1/traces`).
    pub endpoint: String,
    /// Extra request headers (authentication, tenant).
    pub headers: Vec<(String, String)>,
    /// `service.name` of the resource.
    pub service_name: String,
    /// Other resource attributes (`OTEL_RESOURCE_ATTRIBUTES`).
    pub resource_attributes: Vec<(String, String)>,
    /// Export tool-call arguments and model output text.
    pub capture_content: bool,
    /// How long one export may take.
    pub timeout: Duration,
    /// How long spans wait before a batch is sent.
    pub schedule_delay: Duration,
    /// Spans kept waiting at most; more are dropped (and counted).
    pub max_queue: usize,
    /// Spans per request at most.
    pub max_batch: usize,
}

impl fmt::Debug for TelemetryConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Header values are credentials: only their names are shown.
        f.debug_struct("TelemetryConfig")
            .field("endpoint", &self.endpoint)
            .field("headers", &self.headers.iter().map(|(name, _)| name).collect::<Vec<_>>())
            .field("service_name", &self.service_name)
            .field("capture_content", &self.capture_content)
            .finish_non_exhaustive()
    }
}

impl TelemetryConfig {
    /// The default `service.name`.
    pub const DEFAULT_SERVICE_NAME: &'static str = "gdn";

    /// Reads the variables through `lookup` (the process environment, or an
    /// agent's secrets then its environment). `Ok(None)`: export is off.
    pub fn from_env(lookup: &dyn Fn(&str) -> Option<String>) -> Result<Option<Self>, ConfigError> {
        let get = |name: &str| lookup(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        if get("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        if get("OTEL_TRACES_EXPORTER").is_some_and(|v| v.split(',').all(|e| e.trim().eq_ignore_ascii_case("none"))) {
            return Ok(None);
        }
        let endpoint = match (get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), get("OTEL_EXPORTER_OTLP_ENDPOINT")) {
            (Some(traces), _) => traces,
            (None, Some(base)) => format!("{}/v1/traces", base.trim_end_matches('/')),
            (None, None) => return Ok(None),
        };
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(ConfigError::Endpoint(endpoint));
        }
        let protocol = get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or_else(|| get("OTEL_EXPORTER_OTLP_PROTOCOL"));
        if let Some(protocol) = protocol
            && protocol != "http/protobuf"
        {
            return Err(ConfigError::Protocol(protocol));
        }
        let mut headers = parse_pairs(&get("OTEL_EXPORTER_OTLP_HEADERS").unwrap_or_default());
        for (name, value) in parse_pairs(&get("OTEL_EXPORTER_OTLP_TRACES_HEADERS").unwrap_or_default()) {
            headers.retain(|(n, _)| !n.eq_ignore_ascii_case(&name));
            headers.push((name, value));
        }
        let mut resource_attributes = parse_pairs(&get("OTEL_RESOURCE_ATTRIBUTES").unwrap_or_default());
        let from_resource = resource_attributes.iter().position(|(k, _)| k == "service.name");
        let service_name = match (get("OTEL_SERVICE_NAME"), from_resource) {
            (Some(name), _) => name,
            (None, Some(index)) => resource_attributes[index].1.clone(),
            (None, None) => Self::DEFAULT_SERVICE_NAME.to_owned(),
        };
        resource_attributes.retain(|(k, _)| k != "service.name");
        let millis =
            |name: &str, default: u64| Duration::from_millis(get(name).and_then(|v| v.parse().ok()).unwrap_or(default));
        let timeout = get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
            .or_else(|| get("OTEL_EXPORTER_OTLP_TIMEOUT"))
            .and_then(|v| v.parse().ok())
            .map_or(Duration::from_secs(10), Duration::from_millis);
        let count =
            |name: &str, default: usize| get(name).and_then(|v| v.parse().ok()).filter(|n| *n > 0).unwrap_or(default);
        Ok(Some(Self {
            endpoint,
            headers,
            service_name,
            resource_attributes,
            capture_content: get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
                .is_some_and(|v| v.eq_ignore_ascii_case("true")),
            timeout,
            schedule_delay: millis("OTEL_BSP_SCHEDULE_DELAY", 5000),
            max_queue: count("OTEL_BSP_MAX_QUEUE_SIZE", 2048),
            max_batch: count("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512),
        }))
    }

    /// The process environment's configuration; a problem is logged and
    /// turns export off (a misconfigured collector never stops `gdn`).
    pub fn from_process_env() -> Option<Self> {
        Self::from_lookup_logged(&|name| std::env::var(name).ok())
    }

    /// [`Self::from_env`], a problem logged as a warning and read as "off".
    pub fn from_lookup_logged(lookup: &dyn Fn(&str) -> Option<String>) -> Option<Self> {
        match Self::from_env(lookup) {
            Ok(config) => config,
            Err(error) => {
                tracing::warn!("OpenTelemetry export is off: {error}");
                None
            }
        }
    }
}

/// `a=b,c=d` with percent-encoded values (the W3C baggage format the
/// specification uses for headers and resource attributes).
fn parse_pairs(text: &str) -> Vec<(String, String)> {
    text.split(',')
        .filter_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            let key = percent_decode(key.trim());
            (!key.is_empty()).then(|| (key, percent_decode(value.trim())))
        })
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let byte = bytes[index];
        if byte == b'%'
            && let Some(hex) = bytes.get(index + 1..index + 3)
            && let Ok(hex) = std::str::from_utf8(hex)
            && let Ok(value) = u8::from_str_radix(hex, 16)
        {
            out.push(value);
            index += 3;
            continue;
        }
        out.push(byte);
        index += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(vars: &[(&str, &str)]) -> Result<Option<TelemetryConfig>, ConfigError> {
        let vars: Vec<(String, String)> = vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        TelemetryConfig::from_env(&move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    #[test]
    fn nothing_set_means_no_export() {
        assert_eq!(read(&[]), Ok(None));
        assert_eq!(read(&[("OTEL_SERVICE_NAME", "x")]), Ok(None));
    }

    #[test]
    fn the_base_endpoint_gets_the_traces_path_and_the_traces_endpoint_is_taken_as_written() {
        let Ok(Some(c)) = read(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318/")]) else { panic!() };
        assert_eq!(c.endpoint, "http://127.0.0.1:4318/v1/traces");
        assert_eq!(c.service_name, "gdn");
        assert!(!c.capture_content);
        let Ok(Some(c)) = read(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://b/custom"),
        ]) else {
            panic!()
        };
        assert_eq!(c.endpoint, "https://b/custom");
    }

    #[test]
    fn disabled_wins_and_other_protocols_are_refused() {
        assert_eq!(read(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a"), ("OTEL_SDK_DISABLED", "TRUE")]), Ok(None));
        assert_eq!(read(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a"), ("OTEL_TRACES_EXPORTER", "none")]), Ok(None));
        assert_eq!(
            read(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]),
            Err(ConfigError::Protocol("grpc".to_owned()))
        );
        assert!(matches!(read(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "a:4318")]), Err(ConfigError::Endpoint(_))));
    }

    #[test]
    fn headers_resource_and_content_capture_are_read() {
        let Ok(Some(c)) = read(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20abc, x-tenant=t1"),
            ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-tenant=t2"),
            ("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-resource,deployment.environment=dev"),
            ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ]) else {
            panic!()
        };
        assert_eq!(
            c.headers,
            vec![("Authorization".to_owned(), "Bearer abc".to_owned()), ("x-tenant".to_owned(), "t2".to_owned())]
        );
        assert_eq!(c.service_name, "from-resource");
        assert_eq!(c.resource_attributes, vec![("deployment.environment".to_owned(), "dev".to_owned())]);
        assert!(c.capture_content);
        assert_eq!(c.schedule_delay, Duration::from_millis(100));
        assert!(!format!("{c:?}").contains("abc"), "header values stay out of Debug");
    }
}
