//! `webhook`: a generic HTTP endpoint for JSON events. The original ships
//! only the payload reading (`emitWebhookPayload`: `event`/`name`,
//! `instanceKey`, `text`/`message`, scalar `properties`); this makes it an
//! endpoint, signed GitHub-style with HMAC-SHA256.
//!
//! Signature: `X-Signature-256: sha256=<hex>` over the raw body, or, when an
//! `X-Signature-Timestamp` header (decimal seconds) is sent, over
//! `{timestamp}.{body}` with the timestamp within five minutes (a replay
//! window). A body that is a JSON array is several events, each its own turn.

use std::collections::BTreeMap;

use goondan_core::JsonValue;
use serde_json::{Map, json};

use super::http::{self, Endpoint, Incoming, Keys, Listen, Outcome};
use crate::connector::{ConnectorContext, StartFuture};
use crate::event::{ConnectorEvent, Delivery, EventMessage, MAX_KEY_CHARS, digest_key};

pub(crate) const KEYS: Keys =
    Keys { port: "WEBHOOK_PORT", path: "WEBHOOK_PATH", host: "WEBHOOK_HOST", max_body: "WEBHOOK_MAX_BODY_BYTES" };

pub(crate) const DEFAULT_PORT: u16 = 8788;

/// The headers that carry the sender's own delivery id, in order.
const KEY_HEADERS: &[&str] = &["x-delivery-id", "idempotency-key"];

struct Webhook {
    connection: String,
    secret: Option<String>,
}

/// Starts the `webhook` connector: binds `WEBHOOK_PORT`/`PORT`
/// (default 8788) on `WEBHOOK_HOST`/`HOST` (default 127.0.0.1), path
/// `WEBHOOK_PATH` (default `/`); secret `WEBHOOK_SECRET`,
/// `SIGNING_SECRET` or the original's `signingSecret`.
pub fn start(ctx: ConnectorContext) -> StartFuture {
    Box::pin(async move {
        let listen = Listen::from_config(&ctx, &KEYS, DEFAULT_PORT)?;
        let secret = ["WEBHOOK_SECRET", "SIGNING_SECRET", "signingSecret"]
            .iter()
            .find_map(|name| ctx.secrets.get(name))
            .map(str::to_owned);
        if secret.is_none() {
            http::allow_unsigned(&ctx, &listen, "WEBHOOK_SECRET")?;
        }
        let endpoint = Webhook { connection: ctx.connection.clone(), secret };
        http::serve(ctx, listen, endpoint).await
    })
}

impl Endpoint for Webhook {
    fn handle(&self, request: &Incoming) -> Outcome {
        if let Some(secret) = &self.secret
            && let Err(reason) = verify(secret, request, http::now_secs())
        {
            return http::unauthorized(&self.connection, reason);
        }
        let payloads: Vec<Map<String, JsonValue>> = match serde_json::from_slice::<JsonValue>(&request.body) {
            Ok(JsonValue::Object(payload)) => vec![payload],
            Ok(JsonValue::Array(items)) if !items.is_empty() => {
                let mut payloads = Vec::with_capacity(items.len());
                for item in items {
                    let JsonValue::Object(payload) = item else {
                        return http::bad_request("every element of a JSON array body must be an object");
                    };
                    payloads.push(payload);
                }
                payloads
            }
            _ => return http::bad_request("the body must be a JSON object or a non-empty array of objects"),
        };
        let base_key = match KEY_HEADERS.iter().find_map(|name| request.header(name)) {
            // Room for the `#<index>` suffix of an array element.
            Some(id) if id.chars().count() > MAX_KEY_CHARS - 8 => {
                return http::bad_request("the delivery id header is too long");
            }
            Some(id) => id.to_owned(),
            None => digest_key(&request.body),
        };
        let single = payloads.len() == 1;
        let deliveries = payloads
            .iter()
            .enumerate()
            .map(|(index, payload)| {
                let key = if single { base_key.clone() } else { format!("{base_key}#{index}") };
                Delivery::keyed(key, event_of(payload))
            })
            .collect();
        Outcome::Emit { deliveries, ack: http::ok_json(json!({"ok": true})) }
    }
}

fn verify(secret: &str, request: &Incoming, now: i64) -> Result<(), &'static str> {
    let signature = request.header("x-signature-256").ok_or("no X-Signature-256 header")?;
    let hex = signature.strip_prefix("sha256=").unwrap_or(signature);
    let matches = match request.header("x-signature-timestamp") {
        Some(timestamp) => {
            if !http::timestamp_fresh(timestamp, now) {
                return Err("X-Signature-Timestamp is not within five minutes of now");
            }
            http::hmac_sha256_matches(secret.as_bytes(), &[timestamp.as_bytes(), b".", &request.body], hex)
        }
        None => http::hmac_sha256_matches(secret.as_bytes(), &[&request.body], hex),
    };
    if matches { Ok(()) } else { Err("X-Signature-256 does not match the body") }
}

fn str_field<'a>(object: &'a Map<String, JsonValue>, key: &str) -> Option<&'a str> {
    object.get(key).and_then(JsonValue::as_str).filter(|s| !s.is_empty())
}

/// The original's `emitWebhookPayload` reading.
fn event_of(payload: &Map<String, JsonValue>) -> ConnectorEvent {
    let name = str_field(payload, "event").or_else(|| str_field(payload, "name")).unwrap_or("webhook_message");
    let instance_key = str_field(payload, "instanceKey").unwrap_or("webhook:default");
    let text = str_field(payload, "text").or_else(|| str_field(payload, "message")).unwrap_or_default();
    let mut properties = BTreeMap::new();
    if let Some(JsonValue::Object(given)) = payload.get("properties") {
        for (key, value) in given {
            let value = match value {
                JsonValue::String(s) => s.clone(),
                JsonValue::Number(n) => n.to_string(),
                JsonValue::Bool(b) => b.to_string(),
                // As the original: other values are left out.
                _ => continue,
            };
            properties.insert(key.clone(), value);
        }
    }
    ConnectorEvent {
        name: name.to_owned(),
        message: EventMessage::text(text),
        properties,
        instance_key: instance_key.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue};

    use super::*;

    fn object(value: JsonValue) -> Map<String, JsonValue> {
        match value {
            JsonValue::Object(map) => map,
            _ => Map::new(),
        }
    }

    #[test]
    fn payloads_read_as_the_original() {
        let event = event_of(&object(json!({
            "event": "order_paid", "instanceKey": "shop:1", "text": "paid",
            "properties": {"route": "billing", "amount": 12.5, "test": true, "nested": {"x": 1}}
        })));
        assert_eq!(event.name, "order_paid");
        assert_eq!(event.instance_key, "shop:1");
        assert_eq!(event.message.input_text(), "paid");
        assert_eq!(event.properties.len(), 3);
        assert_eq!(event.properties.get("amount").map(String::as_str), Some("12.5"));
        let defaults = event_of(&object(json!({"message": "hello"})));
        assert_eq!(defaults.name, "webhook_message");
        assert_eq!(defaults.instance_key, "webhook:default");
        assert_eq!(defaults.message.input_text(), "hello");
        assert_eq!(event_of(&object(json!({"name": "n"}))).name, "n");
    }

    fn request(headers: &[(&'static str, String)], body: &str) -> Incoming {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            if let Ok(value) = HeaderValue::from_str(value) {
                map.insert(*name, value);
            }
        }
        Incoming { headers: map, body: body.as_bytes().to_vec().into() }
    }

    #[test]
    fn signatures_with_and_without_a_timestamp() {
        let body = r#"{"text":"hi"}"#;
        let plain = http::hmac_sha256_hex(b"s", &[body.as_bytes()]);
        assert_eq!(verify("s", &request(&[("x-signature-256", format!("sha256={plain}"))], body), 0), Ok(()));
        assert_eq!(verify("s", &request(&[("x-signature-256", plain.clone())], body), 0), Ok(()));
        assert!(verify("t", &request(&[("x-signature-256", plain.clone())], body), 0).is_err());
        assert!(verify("s", &request(&[], body), 0).is_err());
        let stamped = http::hmac_sha256_hex(b"s", &[b"1000.", body.as_bytes()]);
        let headers = [("x-signature-256", format!("sha256={stamped}")), ("x-signature-timestamp", "1000".to_owned())];
        assert_eq!(verify("s", &request(&headers, body), 1100), Ok(()));
        assert!(verify("s", &request(&headers, body), 1000 + 301).is_err(), "stale");
        // The body-only signature does not pass once a timestamp is claimed.
        let mixed = [("x-signature-256", format!("sha256={plain}")), ("x-signature-timestamp", "1000".to_owned())];
        assert!(verify("s", &request(&mixed, body), 1000).is_err());
    }
}
