//! `webhook`: a generic HTTP endpoint for JSON events. The original ships
//! only the payload reading (`emitWebhookPayload`: `event`/`name`,
//! `instanceKey`, `text`/`message`, scalar `properties`); this makes it an
//! endpoint, signed in one of two forms:
//!
//! - [Standard Webhooks](https://www.standardwebhooks.com/): `webhook-id`,
//!   `webhook-timestamp` (unix seconds, within five minutes of now, past or
//!   future) and `webhook-signature`, a space-separated list of
//!   `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">` of which any one
//!   must match. A `whsec_<base64>` secret's key is the decoded bytes, any
//!   other secret's its own bytes. The id is signed, so it is the delivery
//!   key: a retry (same id, new timestamp) runs no second turn, and a
//!   replay cannot change it.
//! - GitHub's: `X-Signature-256: sha256=<hex>` over the raw body, or, when an
//!   `X-Signature-Timestamp` header (decimal seconds) is sent, over
//!   `{timestamp}.{body}` with the timestamp within five minutes. Nothing
//!   of the sender's id is signed here, so the delivery key is what is:
//!   `body-sha256:<hex>` of the body (`@<timestamp>` added when timestamped),
//!   whatever `X-Delivery-Id` comes with it. `WEBHOOK_REQUIRE_TIMESTAMP=true`
//!   refuses the body-only form, which has no time limit (its replays are
//!   recognized only as long as the inbox remembers the key).
//!
//! Without a secret (loopback only) the sender's `webhook-id`,
//! `X-Delivery-Id` or `Idempotency-Key` is the key, else the body's digest.
//! A body that is a JSON array is several events, each its own turn.

use goondan_core::JsonValue;
use serde_json::{Map, json};

use super::http::{self, Endpoint, Incoming, Keys, Listen, Outcome};
use crate::connector::{ConnectorContext, ConnectorError, StartFuture};
use crate::event::{ConnectorEvent, Delivery, EventMessage, MAX_KEY_CHARS, digest_key, lenient_properties};

pub(crate) const KEYS: Keys =
    Keys { port: "WEBHOOK_PORT", path: "WEBHOOK_PATH", host: "WEBHOOK_HOST", max_body: "WEBHOOK_MAX_BODY_BYTES" };

pub(crate) const DEFAULT_PORT: u16 = 8788;

/// The headers that carry an unsigned sender's own delivery id, in order.
const KEY_HEADERS: &[&str] = &["webhook-id", "x-delivery-id", "idempotency-key"];

/// The config key that refuses `X-Signature-256` without a timestamp.
const REQUIRE_TIMESTAMP: &str = "WEBHOOK_REQUIRE_TIMESTAMP";

/// A Standard Webhooks secret's prefix: the rest is the key, in base64.
const WHSEC_PREFIX: &str = "whsec_";

/// The signing secret, as each form uses it.
struct Secret {
    /// `X-Signature-256`'s key: the secret's bytes, as given.
    raw: Vec<u8>,
    /// Standard Webhooks' key: a `whsec_` secret decoded, else `raw`.
    standard: Vec<u8>,
}

impl Secret {
    /// `None` for a `whsec_` secret whose rest is not base64.
    fn new(secret: &str) -> Option<Self> {
        let standard = match secret.strip_prefix(WHSEC_PREFIX) {
            Some(encoded) => http::base64_decode(encoded).filter(|key| !key.is_empty())?,
            None => secret.as_bytes().to_vec(),
        };
        Some(Self { raw: secret.as_bytes().to_vec(), standard })
    }
}

struct Webhook {
    connection: String,
    secret: Option<Secret>,
    /// Refuse `X-Signature-256` without `X-Signature-Timestamp`.
    require_timestamp: bool,
}

/// What a valid signature covers: it makes the delivery key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signed<'r> {
    /// Standard Webhooks: the signed `webhook-id`.
    Id(&'r str),
    /// `X-Signature-256` over `{timestamp}.{body}` (the timestamp's value).
    TimestampAndBody(i64),
    /// `X-Signature-256` over the body alone.
    Body,
}

/// Starts the `webhook` connector: binds `WEBHOOK_PORT`/`PORT`
/// (default 8788) on `WEBHOOK_HOST`/`HOST` (default 127.0.0.1), path
/// `WEBHOOK_PATH` (default `/`); secret `WEBHOOK_SECRET`,
/// `SIGNING_SECRET` or the original's `signingSecret`;
/// `WEBHOOK_REQUIRE_TIMESTAMP` (`true`/`false`, default `false`).
pub fn start(ctx: ConnectorContext) -> StartFuture {
    Box::pin(async move {
        let listen = Listen::from_config(&ctx, &KEYS, DEFAULT_PORT)?;
        let secret = match ["WEBHOOK_SECRET", "SIGNING_SECRET", "signingSecret"]
            .iter()
            .find_map(|name| ctx.secrets.get(name).map(|secret| (*name, secret)))
        {
            Some((name, secret)) => Some(Secret::new(secret).ok_or_else(|| {
                // Never the secret itself in the message.
                ctx.config_error(
                    name,
                    format!("starts with '{WHSEC_PREFIX}' but what follows is not a base64-encoded key"),
                )
            })?),
            None => {
                http::allow_unsigned(&ctx, &listen, "WEBHOOK_SECRET")?;
                None
            }
        };
        let require_timestamp = require_timestamp(&ctx)?;
        if require_timestamp && secret.is_none() {
            tracing::warn!(
                connection = %ctx.connection,
                "{REQUIRE_TIMESTAMP} has no effect without WEBHOOK_SECRET: unsigned requests are accepted"
            );
        }
        let endpoint = Webhook { connection: ctx.connection.clone(), secret, require_timestamp };
        http::serve(ctx, listen, endpoint).await
    })
}

fn require_timestamp(ctx: &ConnectorContext) -> Result<bool, ConnectorError> {
    match ctx.config_value(REQUIRE_TIMESTAMP).map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("" | "false" | "0" | "no") => Ok(false),
        Some("true" | "1" | "yes") => Ok(true),
        Some(other) => Err(ctx.config_error(REQUIRE_TIMESTAMP, format!("'{other}' is not true or false"))),
    }
}

impl Endpoint for Webhook {
    fn handle(&self, request: &Incoming) -> Outcome {
        let signed = match &self.secret {
            None => None,
            Some(secret) => match verify(secret, self.require_timestamp, request, http::now_secs()) {
                Ok(signed) => Some(signed),
                Err(reason) => return http::unauthorized(&self.connection, reason),
            },
        };
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
        let sender_id = match signed {
            Some(Signed::Id(id)) => Some(id),
            Some(_) => None,
            None => KEY_HEADERS.iter().find_map(|name| request.header(name)),
        };
        let base_key = match (sender_id, signed) {
            // Room for the `#<index>` suffix of an array element.
            (Some(id), _) if id.chars().count() > MAX_KEY_CHARS - 8 => {
                return http::bad_request("the delivery id header is too long");
            }
            (Some(id), _) => id.to_owned(),
            (None, Some(Signed::TimestampAndBody(timestamp))) => {
                format!("{}@{timestamp}", http::body_digest_key(&request.body))
            }
            (None, Some(_)) => http::body_digest_key(&request.body),
            (None, None) => digest_key(&request.body),
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

/// Checks the request's signature: Standard Webhooks when it has a
/// `webhook-signature` header, else `X-Signature-256`. The error is a
/// reason for the log.
fn verify<'r>(
    secret: &Secret,
    require_timestamp: bool,
    request: &'r Incoming,
    now: i64,
) -> Result<Signed<'r>, &'static str> {
    if request.header("webhook-signature").is_some() {
        return verify_standard(&secret.standard, request, now).map(Signed::Id);
    }
    let signature = request.header("x-signature-256").ok_or("no X-Signature-256 or webhook-signature header")?;
    let hex = signature.strip_prefix("sha256=").unwrap_or(signature);
    let (matches, signed) = match request.header("x-signature-timestamp") {
        Some(timestamp) => {
            let Some(value) = fresh_timestamp(timestamp, now) else {
                return Err("X-Signature-Timestamp is not within five minutes of now");
            };
            let parts: [&[u8]; 3] = [timestamp.as_bytes(), b".", &request.body];
            (http::hmac_sha256_matches(&secret.raw, &parts, hex), Signed::TimestampAndBody(value))
        }
        None if require_timestamp => {
            return Err("X-Signature-256 without X-Signature-Timestamp (WEBHOOK_REQUIRE_TIMESTAMP is set)");
        }
        None => (http::hmac_sha256_matches(&secret.raw, &[&request.body], hex), Signed::Body),
    };
    if matches { Ok(signed) } else { Err("X-Signature-256 does not match the body") }
}

/// The Standard Webhooks check; the signed `webhook-id` on success.
fn verify_standard<'r>(key: &[u8], request: &'r Incoming, now: i64) -> Result<&'r str, &'static str> {
    let id = request.header("webhook-id").ok_or("no webhook-id header")?;
    let timestamp = request.header("webhook-timestamp").ok_or("no webhook-timestamp header")?;
    let signatures = request.header("webhook-signature").ok_or("no webhook-signature header")?;
    if fresh_timestamp(timestamp, now).is_none() {
        return Err("webhook-timestamp is not within five minutes of now");
    }
    let candidates = signatures
        .split_ascii_whitespace()
        .filter_map(|signature| signature.strip_prefix("v1,"))
        .filter_map(http::base64_decode);
    let parts: [&[u8]; 5] = [id.as_bytes(), b".", timestamp.as_bytes(), b".", &request.body];
    if http::hmac_sha256_matches_any(key, &parts, candidates) {
        Ok(id)
    } else {
        Err("no v1 signature of webhook-signature matches")
    }
}

/// The value of a timestamp within five minutes of `now`.
fn fresh_timestamp(timestamp: &str, now: i64) -> Option<i64> {
    if http::timestamp_fresh(timestamp, now) { timestamp.parse().ok() } else { None }
}

fn str_field<'a>(object: &'a Map<String, JsonValue>, key: &str) -> Option<&'a str> {
    object.get(key).and_then(JsonValue::as_str).filter(|s| !s.is_empty())
}

/// The original's `emitWebhookPayload` reading.
fn event_of(payload: &Map<String, JsonValue>) -> ConnectorEvent {
    let name = str_field(payload, "event").or_else(|| str_field(payload, "name")).unwrap_or("webhook_message");
    let instance_key = str_field(payload, "instanceKey").unwrap_or("webhook:default");
    let text = str_field(payload, "text").or_else(|| str_field(payload, "message")).unwrap_or_default();
    ConnectorEvent {
        name: name.to_owned(),
        message: EventMessage::text(text),
        properties: lenient_properties(payload.get("properties")),
        instance_key: instance_key.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::test_support::{object, request};

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

    fn secret(text: &str) -> Secret {
        Secret::new(text).unwrap_or(Secret { raw: Vec::new(), standard: Vec::new() })
    }

    #[test]
    fn signatures_with_and_without_a_timestamp() {
        let s = secret("s");
        let body = r#"{"text":"hi"}"#;
        let plain = http::hmac_sha256_hex(b"s", &[body.as_bytes()]);
        // What was signed, owned (the request is a temporary).
        let signed = |headers: &[(&'static str, String)], now| {
            verify(&s, false, &request(headers, body), now).map(|signed| format!("{signed:?}"))
        };
        assert_eq!(signed(&[("x-signature-256", format!("sha256={plain}"))], 0).as_deref(), Ok("Body"));
        assert_eq!(signed(&[("x-signature-256", plain.clone())], 0).as_deref(), Ok("Body"));
        assert!(verify(&secret("t"), false, &request(&[("x-signature-256", plain.clone())], body), 0).is_err());
        assert!(signed(&[], 0).is_err());
        let stamped = http::hmac_sha256_hex(b"s", &[b"1000.", body.as_bytes()]);
        let headers = [("x-signature-256", format!("sha256={stamped}")), ("x-signature-timestamp", "1000".to_owned())];
        assert_eq!(signed(&headers, 1100).as_deref(), Ok("TimestampAndBody(1000)"));
        assert!(signed(&headers, 1000 + 301).is_err(), "stale");
        assert!(signed(&headers, 1000 - 301).is_err(), "future");
        // The body-only signature does not pass once a timestamp is claimed.
        let mixed = [("x-signature-256", format!("sha256={plain}")), ("x-signature-timestamp", "1000".to_owned())];
        assert!(signed(&mixed, 1000).is_err());
        // WEBHOOK_REQUIRE_TIMESTAMP refuses the body-only form only.
        let body_only = request(&[("x-signature-256", plain.clone())], body);
        assert!(verify(&s, true, &body_only, 0).is_err());
        assert_eq!(verify(&s, true, &request(&headers, body), 1000), Ok(Signed::TimestampAndBody(1000)));
    }

    /// The published Standard Webhooks example (the reference libraries'
    /// `sign` test): secret, id, timestamp, body and the signature they give.
    const VECTOR_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const VECTOR_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
    const VECTOR_TIMESTAMP: i64 = 1_614_265_330;
    const VECTOR_BODY: &str = r#"{"test": 2432232314}"#;
    const VECTOR_SIGNATURE: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

    fn standard(signature: &str, id: &str, timestamp: &str, body: &str) -> Incoming {
        request(
            &[
                ("webhook-id", id.to_owned()),
                ("webhook-timestamp", timestamp.to_owned()),
                ("webhook-signature", signature.to_owned()),
            ],
            body,
        )
    }

    #[test]
    fn the_standard_webhooks_example_verifies() {
        let s = secret(VECTOR_SECRET);
        let at = VECTOR_TIMESTAMP.to_string();
        fn check<'r>(s: &Secret, request: &'r Incoming, now: i64) -> Result<Signed<'r>, &'static str> {
            verify(s, false, request, now)
        }
        let good = standard(VECTOR_SIGNATURE, VECTOR_ID, &at, VECTOR_BODY);
        assert_eq!(check(&s, &good, VECTOR_TIMESTAMP), Ok(Signed::Id(VECTOR_ID)));
        assert_eq!(check(&s, &good, VECTOR_TIMESTAMP + 300), Ok(Signed::Id(VECTOR_ID)));
        assert_eq!(check(&s, &good, VECTOR_TIMESTAMP - 300), Ok(Signed::Id(VECTOR_ID)));
        assert!(check(&s, &good, VECTOR_TIMESTAMP + 301).is_err(), "stale");
        assert!(check(&s, &good, VECTOR_TIMESTAMP - 301).is_err(), "future");
        // Any one of several signatures; other versions are skipped.
        let listed = format!("v1a,abc v1,AAAA {VECTOR_SIGNATURE} v1,notbase64!");
        assert_eq!(
            check(&s, &standard(&listed, VECTOR_ID, &at, VECTOR_BODY), VECTOR_TIMESTAMP),
            Ok(Signed::Id(VECTOR_ID))
        );
        let refused = [
            standard(VECTOR_SIGNATURE, "msg_other", &at, VECTOR_BODY),
            standard(VECTOR_SIGNATURE, VECTOR_ID, &(VECTOR_TIMESTAMP + 1).to_string(), VECTOR_BODY),
            standard(VECTOR_SIGNATURE, VECTOR_ID, &at, r#"{"test": 2432232315}"#),
            standard(&VECTOR_SIGNATURE.replacen("v1,", "v2,", 1), VECTOR_ID, &at, VECTOR_BODY),
            standard("v1,", VECTOR_ID, &at, VECTOR_BODY),
            request(&[("webhook-signature", VECTOR_SIGNATURE.to_owned())], VECTOR_BODY),
        ];
        for request in &refused {
            assert!(check(&s, request, VECTOR_TIMESTAMP).is_err(), "{request:?}");
        }
        // The same signature under the secret's text as the key does not pass.
        let raw = Secret { standard: VECTOR_SECRET.as_bytes().to_vec(), raw: Vec::new() };
        assert!(verify(&raw, false, &good, VECTOR_TIMESTAMP).is_err());
    }

    #[test]
    fn secrets_are_whsec_base64_or_their_own_bytes() {
        let whsec = secret("whsec_AAEC");
        assert_eq!(
            (whsec.raw.as_slice(), whsec.standard.as_slice()),
            (b"whsec_AAEC".as_slice(), [0u8, 1, 2].as_slice())
        );
        let plain = secret("plain");
        assert_eq!((plain.raw.as_slice(), plain.standard.as_slice()), (b"plain".as_slice(), b"plain".as_slice()));
        assert!(Secret::new("whsec_").is_none(), "an empty key");
        assert!(Secret::new("whsec_a*b").is_none());
    }

    fn keys_of(outcome: Outcome) -> Vec<Option<String>> {
        match outcome {
            Outcome::Emit { deliveries, .. } => deliveries.into_iter().map(|d| d.key).collect(),
            Outcome::Reply(response) => vec![Some(format!("reply {}", response.status()))],
        }
    }

    #[test]
    fn only_what_is_signed_makes_the_key() {
        let endpoint = Webhook { connection: "c".into(), secret: Some(secret("s")), require_timestamp: false };
        let body = r#"[{"text":"a"},{"text":"b"}]"#;
        let signature = format!("sha256={}", http::hmac_sha256_hex(b"s", &[body.as_bytes()]));
        let with_id =
            |id: &str| request(&[("x-signature-256", signature.clone()), ("x-delivery-id", id.to_owned())], body);
        let digest = http::body_digest_key(body.as_bytes());
        let expected = vec![Some(format!("{digest}#0")), Some(format!("{digest}#1"))];
        assert_eq!(keys_of(endpoint.handle(&with_id("one"))), expected);
        assert_eq!(keys_of(endpoint.handle(&with_id("two"))), expected);
        // Unsigned (a loopback endpoint without a secret): the sender's id.
        let unsigned = Webhook { connection: "c".into(), secret: None, require_timestamp: false };
        assert_eq!(keys_of(unsigned.handle(&with_id("one"))), [Some("one#0".to_owned()), Some("one#1".to_owned())]);
        let standard_id = request(&[("webhook-id", "msg_1".to_owned())], r#"{"text":"a"}"#);
        assert_eq!(keys_of(unsigned.handle(&standard_id)), [Some("msg_1".to_owned())]);
        // A signed id too long to be a key is refused.
        let long = "m".repeat(MAX_KEY_CHARS);
        let at = http::now_secs().to_string();
        let v1 = |key: &[u8], id: &str| {
            let hex = http::hmac_sha256_hex(key, &[id.as_bytes(), b".", at.as_bytes(), b".", br#"{"text":"a"}"#]);
            let bytes = hex::decode(hex).unwrap_or_default();
            format!("v1,{}", goondan_test_support::base64(&bytes))
        };
        let too_long = standard(&v1(b"s", &long), &long, &at, r#"{"text":"a"}"#);
        assert_eq!(keys_of(endpoint.handle(&too_long)), [Some("reply 400 Bad Request".to_owned())]);
        let fine = standard(&v1(b"s", "msg_1"), "msg_1", &at, r#"{"text":"a"}"#);
        assert_eq!(keys_of(endpoint.handle(&fine)), [Some("msg_1".to_owned())]);
    }
}
