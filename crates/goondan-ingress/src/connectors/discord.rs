//! `discord`: the Discord interactions endpoint. The original ships the
//! reading (`parseDiscordInteraction`) but no server; this is the server:
//! Ed25519 signatures (`X-Signature-Ed25519` over `X-Signature-Timestamp`
//! followed by the body) against the application's public key, PING
//! answered with PONG, slash commands and components stored and answered
//! with a deferred response (the agent follows up through Discord's API with
//! the `interaction_token` property), keyed by the interaction id.

use std::collections::BTreeMap;

use ed25519_dalek::{Signature, Verifier as _, VerifyingKey};
use goondan_core::JsonValue;
use serde_json::{Map, json};

use super::http::{self, Endpoint, Incoming, Keys, Listen, Outcome};
use crate::connector::{ConnectorContext, ConnectorError, StartFuture};
use crate::event::{ConnectorEvent, Delivery, EventMessage};

pub(crate) const KEYS: Keys = Keys {
    port: "DISCORD_WEBHOOK_PORT",
    path: "DISCORD_WEBHOOK_PATH",
    host: "DISCORD_HOST",
    max_body: "DISCORD_MAX_BODY_BYTES",
};

pub(crate) const DEFAULT_PORT: u16 = 8790;

/// Interaction types (Discord's "Interaction Type").
const PING: u64 = 1;
const APPLICATION_COMMAND: u64 = 2;
const MESSAGE_COMPONENT: u64 = 3;
const AUTOCOMPLETE: u64 = 4;
const MODAL_SUBMIT: u64 = 5;

/// Response types (Discord's "Interaction Callback Type").
const PONG: u64 = 1;
const DEFERRED_CHANNEL_MESSAGE: u64 = 5;
const DEFERRED_UPDATE_MESSAGE: u64 = 6;
const AUTOCOMPLETE_RESULT: u64 = 8;

struct Discord {
    connection: String,
    key: Option<VerifyingKey>,
}

/// Starts the `discord` connector: binds `DISCORD_WEBHOOK_PORT`/`PORT`
/// (default 8790) on `DISCORD_HOST`/`HOST` (default 127.0.0.1), path
/// `DISCORD_WEBHOOK_PATH` (default `/`); the application's public key
/// `DISCORD_PUBLIC_KEY` (hex) from secrets or config.
pub fn start(ctx: ConnectorContext) -> StartFuture {
    Box::pin(async move {
        let listen = Listen::from_config(&ctx, &KEYS, DEFAULT_PORT)?;
        let key = match ctx.secrets.get("DISCORD_PUBLIC_KEY").or_else(|| ctx.config_value("DISCORD_PUBLIC_KEY")) {
            Some(hex) => Some(public_key(&ctx, hex)?),
            None => {
                http::allow_unsigned(&ctx, &listen, "DISCORD_PUBLIC_KEY")?;
                None
            }
        };
        let endpoint = Discord { connection: ctx.connection.clone(), key };
        http::serve(ctx, listen, endpoint).await
    })
}

fn public_key(ctx: &ConnectorContext, hex_key: &str) -> Result<VerifyingKey, ConnectorError> {
    let invalid = || ctx.config_error("DISCORD_PUBLIC_KEY", "is not an Ed25519 public key (64 hex digits)");
    let bytes: [u8; 32] = hex::decode(hex_key.trim()).ok().and_then(|b| b.try_into().ok()).ok_or_else(invalid)?;
    VerifyingKey::from_bytes(&bytes).map_err(|_| invalid())
}

impl Endpoint for Discord {
    fn handle(&self, request: &Incoming) -> Outcome {
        if let Some(key) = &self.key
            && let Err(reason) = verify(key, request, http::now_secs())
        {
            return http::unauthorized(&self.connection, reason);
        }
        let Ok(JsonValue::Object(body)) = serde_json::from_slice::<JsonValue>(&request.body) else {
            return http::bad_request("the body must be a JSON object");
        };
        let Some(kind) = body.get("type").and_then(JsonValue::as_u64) else {
            return http::bad_request("an interaction needs a numeric 'type'");
        };
        let response = match kind {
            PING => return Outcome::Reply(http::ok_json(json!({"type": PONG}))),
            // Autocomplete wants choices now, which no turn can give in time.
            AUTOCOMPLETE => {
                return Outcome::Reply(http::ok_json(json!({"type": AUTOCOMPLETE_RESULT, "data": {"choices": []}})));
            }
            APPLICATION_COMMAND | MODAL_SUBMIT => DEFERRED_CHANNEL_MESSAGE,
            MESSAGE_COMPONENT => DEFERRED_UPDATE_MESSAGE,
            _ => return http::bad_request(format!("unknown interaction type {kind}")),
        };
        let Some(id) = str_field(&body, "id") else {
            return http::bad_request("an interaction needs an 'id'");
        };
        Outcome::Emit {
            deliveries: vec![Delivery::keyed(id, parse(kind, &body))],
            ack: http::ok_json(json!({"type": response})),
        }
    }
}

/// Discord's scheme: `X-Signature-Ed25519` (hex) over
/// `X-Signature-Timestamp` then the body. The timestamp must also be within
/// five minutes, so a captured request cannot be replayed later.
fn verify(key: &VerifyingKey, request: &Incoming, now: i64) -> Result<(), &'static str> {
    let signature = request.header("x-signature-ed25519").ok_or("no X-Signature-Ed25519 header")?;
    let timestamp = request.header("x-signature-timestamp").ok_or("no X-Signature-Timestamp header")?;
    if !http::timestamp_fresh(timestamp, now) {
        return Err("X-Signature-Timestamp is not within five minutes of now");
    }
    let bytes: [u8; 64] = hex::decode(signature)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or("X-Signature-Ed25519 is not 128 hex digits")?;
    let mut message = Vec::with_capacity(timestamp.len() + request.body.len());
    message.extend_from_slice(timestamp.as_bytes());
    message.extend_from_slice(&request.body);
    key.verify(&message, &Signature::from_bytes(&bytes)).map_err(|_| "X-Signature-Ed25519 does not match")
}

fn str_field<'a>(object: &'a Map<String, JsonValue>, key: &str) -> Option<&'a str> {
    object.get(key).and_then(JsonValue::as_str).filter(|s| !s.is_empty())
}

/// The original's `parseDiscordInteraction`.
fn parse(kind: u64, body: &Map<String, JsonValue>) -> ConnectorEvent {
    let id = str_field(body, "id");
    let channel = str_field(body, "channel_id");
    let mut properties = BTreeMap::new();
    let mut put = |key: &str, value: Option<&str>| {
        if let Some(value) = value {
            properties.insert(key.to_owned(), value.to_owned());
        }
    };
    put("interaction_id", id);
    put("channel_id", channel);
    put("guild_id", str_field(body, "guild_id"));
    put("interaction_token", str_field(body, "token"));
    let user = body
        .get("user")
        .and_then(JsonValue::as_object)
        .or_else(|| body.get("member").and_then(JsonValue::as_object)?.get("user")?.as_object());
    put("user_id", user.and_then(|u| str_field(u, "id")));
    put("username", user.and_then(|u| str_field(u, "username")));
    let data = body.get("data").and_then(JsonValue::as_object);
    let (name, text) = match kind {
        APPLICATION_COMMAND => {
            let command = data.and_then(|d| str_field(d, "name"));
            put("command_name", command);
            ("slash_command", command.map(|c| format!("/{c}")).unwrap_or_default())
        }
        MESSAGE_COMPONENT => {
            let custom_id = data.and_then(|d| str_field(d, "custom_id"));
            put("custom_id", custom_id);
            ("component_interaction", custom_id.unwrap_or_default().to_owned())
        }
        _ => ("interaction", String::new()),
    };
    ConnectorEvent {
        name: name.to_owned(),
        message: EventMessage::text(text),
        properties,
        instance_key: format!("discord:{}", channel.or(id).unwrap_or("unknown")),
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderValue};
    use ed25519_dalek::{Signer as _, SigningKey};

    use super::*;

    fn bytes<const N: usize>(hex_text: &str) -> [u8; N] {
        hex::decode(hex_text).ok().and_then(|b| b.try_into().ok()).unwrap_or([0; N])
    }

    /// RFC 8032 section 7.1, TEST 1 and TEST 2.
    #[test]
    fn rfc8032_vectors_verify() {
        let vectors = [
            (
                "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
                "",
                "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
            ),
            (
                "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
                "72",
                "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
            ),
        ];
        for (public, message, signature) in vectors {
            let Ok(key) = VerifyingKey::from_bytes(&bytes::<32>(public)) else { panic!("the RFC's key") };
            let message = hex::decode(message).unwrap_or_default();
            let signature = Signature::from_bytes(&bytes::<64>(signature));
            assert!(key.verify(&message, &signature).is_ok());
            assert!(key.verify(b"other", &signature).is_err());
        }
    }

    #[test]
    fn timestamp_and_body_are_signed_together() {
        let signer =
            SigningKey::from_bytes(&bytes::<32>("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"));
        let body = br#"{"type":1}"#;
        let signature = hex::encode(signer.sign(&[b"1000".as_slice(), body].concat()).to_bytes());
        let request = |timestamp: &str, signature: &str| {
            let mut headers = HeaderMap::new();
            for (name, value) in [("x-signature-ed25519", signature), ("x-signature-timestamp", timestamp)] {
                if let Ok(value) = HeaderValue::from_str(value) {
                    headers.insert(name, value);
                }
            }
            Incoming { headers, body: body.to_vec().into() }
        };
        let key = signer.verifying_key();
        assert_eq!(verify(&key, &request("1000", &signature), 1010), Ok(()));
        assert!(verify(&key, &request("1001", &signature), 1010).is_err(), "another timestamp");
        assert!(verify(&key, &request("1000", &signature), 1000 + 301).is_err(), "stale");
        assert!(verify(&key, &request("1000", "abcd"), 1000).is_err(), "short");
    }

    #[test]
    fn interactions_read_as_the_original() {
        let body = |value: JsonValue| match value {
            JsonValue::Object(map) => map,
            _ => Map::new(),
        };
        let command = parse(
            APPLICATION_COMMAND,
            &body(json!({"id": "I1", "token": "tok", "channel_id": "C1", "guild_id": "G1",
                "member": {"user": {"id": "U1", "username": "ann"}}, "data": {"name": "ask"}})),
        );
        assert_eq!(command.name, "slash_command");
        assert_eq!(command.message.input_text(), "/ask");
        assert_eq!(command.instance_key, "discord:C1");
        assert_eq!(command.properties.get("username").map(String::as_str), Some("ann"));
        assert_eq!(command.properties.get("interaction_token").map(String::as_str), Some("tok"));
        let component =
            parse(MESSAGE_COMPONENT, &body(json!({"id": "I2", "user": {"id": "U2"}, "data": {"custom_id": "yes"}})));
        assert_eq!(component.name, "component_interaction");
        assert_eq!(component.message.input_text(), "yes");
        assert_eq!(component.instance_key, "discord:I2");
        assert_eq!(component.properties.get("custom_id").map(String::as_str), Some("yes"));
    }
}
