//! The `cli` connector: each line of standard input is an event, by the
//! original's `normalizeCliLine` rules (plain text, or a JSON object naming
//! its event, text, instance and properties).
//!
//! A line has no delivery key of its own: the same line typed twice is two
//! events. Input ends → the connector ends.

use std::collections::BTreeMap;

use backon::{BackoffBuilder as _, ExponentialBuilder};
use goondan_core::JsonValue;
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio_util::sync::CancellationToken;

use crate::connector::{ConnectorContext, InputStream, RunningConnector, StartFuture};
use crate::event::{ConnectorEvent, Delivery, EventMessage, lenient_properties};
use crate::sink::{EventSink, SinkError};

/// The Connector's name.
pub const NAME: &str = "cli";
/// The event of a line that names none.
pub const EVENT: &str = "stdin_message";
/// The instance of a line that names none is `cli:<line index>`.
const INSTANCE_PREFIX: &str = "cli";

/// Starts reading the Connection's standard input.
pub fn start(mut ctx: ConnectorContext) -> StartFuture {
    Box::pin(async move {
        let input = ctx.input.take();
        let task = tokio::spawn(async move {
            match input {
                Some(input) => read_lines(input, &ctx.connection, ctx.sink.as_ref(), &ctx.stop).await,
                None => tracing::warn!(
                    connection = %ctx.connection,
                    "cli: this Connection was given no standard input (another Connection reads it, or there is \
                     none); it receives nothing"
                ),
            }
            Ok(())
        });
        Ok(RunningConnector { listening: Vec::new(), task })
    })
}

async fn read_lines(input: InputStream, connection: &str, sink: &dyn EventSink, stop: &CancellationToken) {
    let mut reader = BufReader::new(input);
    let mut buffer = Vec::new();
    let mut index: u64 = 0;
    loop {
        buffer.clear();
        let read = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            read = reader.read_until(b'\n', &mut buffer) => read,
        };
        match read {
            Ok(0) => {
                tracing::info!(connection = %connection, lines = index, "cli: end of standard input");
                return;
            }
            Ok(_) => {}
            Err(error) => {
                tracing::warn!(connection = %connection, "cli: cannot read standard input: {error}");
                return;
            }
        }
        let line = String::from_utf8_lossy(strip_line_end(&buffer));
        let normalized = normalize_cli_line(&line, index);
        // Blank lines count too: the original numbers every line it reads.
        index += 1;
        if let Some(event) = normalized
            && !deliver(sink, event, connection, stop).await
        {
            return;
        }
    }
}

/// Stores one event, retrying while the inbox fails; `false` once the
/// service stops.
async fn deliver(sink: &dyn EventSink, event: ConnectorEvent, connection: &str, stop: &CancellationToken) -> bool {
    let mut backoff = ExponentialBuilder::new()
        .with_min_delay(std::time::Duration::from_millis(100))
        .with_max_delay(std::time::Duration::from_secs(10))
        .with_jitter()
        .without_max_times()
        .build();
    loop {
        match sink.accept_one(Delivery::unkeyed(event.clone())).await {
            Ok(_) => return true,
            Err(SinkError::Closed) => {
                tracing::info!(connection = %connection, "cli: the inbox is closed; no more lines are read");
                return false;
            }
            Err(error) => {
                let delay = backoff.next().unwrap_or(std::time::Duration::from_secs(10));
                tracing::warn!(
                    connection = %connection,
                    retry_in_ms = delay.as_millis(),
                    "cli: could not store a line: {error}"
                );
                tokio::select! {
                    biased;
                    () = stop.cancelled() => return false,
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// `\n` or `\r\n`, as readline ends a line.
fn strip_line_end(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// The original's `normalizeCliLine` with its defaults: blank lines are
/// skipped; a JSON object line gives its event (`name`/`event`), text
/// (`text`/`message`, else the line itself), `instanceKey` and string,
/// number or boolean `properties`; any other line is `stdin_message` with
/// the line as its text. The instance defaults to `cli:<index>`.
pub fn normalize_cli_line(line: &str, index: u64) -> Option<ConnectorEvent> {
    let trimmed = line.trim();
    if trimmed.is_empty() {
        return None;
    }
    let fallback_instance = || format!("{INSTANCE_PREFIX}:{index}");
    let parsed = serde_json::from_str::<JsonValue>(trimmed).ok();
    let Some(object) = parsed.as_ref().and_then(JsonValue::as_object) else {
        return Some(ConnectorEvent {
            name: EVENT.to_owned(),
            message: EventMessage::text(line),
            properties: BTreeMap::new(),
            instance_key: fallback_instance(),
        });
    };
    let pick = |keys: &[&str]| {
        keys.iter().find_map(|key| object.get(*key).and_then(JsonValue::as_str).filter(|s| !s.is_empty()))
    };
    Some(ConnectorEvent {
        name: pick(&["name", "event"]).unwrap_or(EVENT).to_owned(),
        message: EventMessage::text(pick(&["text", "message"]).unwrap_or(line)),
        properties: lenient_properties(object.get("properties")),
        instance_key: pick(&["instanceKey"]).map_or_else(fallback_instance, str::to_owned),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn normalized(line: &str, index: u64) -> ConnectorEvent {
        match normalize_cli_line(line, index) {
            Some(event) => event,
            None => panic!("no event for {line:?}"),
        }
    }

    #[test]
    fn plain_lines_are_stdin_messages_of_their_own_instance() {
        let event = normalized("  hello there ", 3);
        assert_eq!(event.name, "stdin_message");
        assert_eq!(event.message, EventMessage::text("  hello there "), "the line as typed, as the original");
        assert_eq!(event.instance_key, "cli:3");
        assert!(event.properties.is_empty());
    }

    #[test]
    fn blank_lines_are_skipped() {
        for line in ["", "   ", "\t"] {
            assert_eq!(normalize_cli_line(line, 0), None, "{line:?}");
        }
    }

    #[test]
    fn json_objects_name_their_event_text_instance_and_properties() {
        let event = normalized(
            r#"{"event":"user_message","text":"hi","instanceKey":"user-1","properties":{"room":"dev","n":2,"ok":true,"x":null,"l":[1]}}"#,
            1,
        );
        assert_eq!(event.name, "user_message");
        assert_eq!(event.message, EventMessage::text("hi"));
        assert_eq!(event.instance_key, "user-1");
        let properties: Vec<(&str, &str)> = event.properties.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(properties, [("n", "2"), ("ok", "true"), ("room", "dev")]);

        let event = normalized(r#"{"name":"a","event":"b","message":"from message"}"#, 2);
        assert_eq!((event.name.as_str(), event.instance_key.as_str()), ("a", "cli:2"));
        assert_eq!(event.message, EventMessage::text("from message"));
    }

    #[test]
    fn a_json_object_without_text_is_its_own_text_and_other_json_is_plain() {
        let line = r#" {"name":"","instanceKey":"","text":""} "#;
        let event = normalized(line, 0);
        assert_eq!(event.name, "stdin_message");
        assert_eq!(event.instance_key, "cli:0");
        assert_eq!(event.message, EventMessage::text(line));
        for line in ["[1,2]", "42", "\"text\"", "{not json"] {
            let event = normalized(line, 5);
            assert_eq!((event.name.as_str(), event.instance_key.as_str()), ("stdin_message", "cli:5"));
            assert_eq!(event.message, EventMessage::text(line));
        }
    }

    #[test]
    fn line_ends_are_stripped_like_readline() {
        assert_eq!(strip_line_end(b"a\r\n"), b"a");
        assert_eq!(strip_line_end(b"a\n"), b"a");
        assert_eq!(strip_line_end(b"a"), b"a");
        assert_eq!(strip_line_end(b"a\r"), b"a");
    }
}
