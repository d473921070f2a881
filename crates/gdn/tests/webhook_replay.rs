//! A captured webhook request posted again runs no second turn, through a
//! real `gdn run --detach` service, its durable inbox, and real HTTP on
//! 127.0.0.1 — also after the service restarted.
//!
//! - `X-Signature-256` over the body alone: the `X-Delivery-Id` that comes
//!   with it is not signed, so a replay with a new one is the same delivery
//!   (keyed by the body's digest).
//! - Standard Webhooks (`webhook-id`/`webhook-timestamp`/`webhook-signature`,
//!   a `whsec_` secret): keyed by the signed id, so a retry with a new
//!   timestamp runs once; a stale timestamp is refused.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use goondan_test_support::{Agent, Bundle, base64, http, reply_text};
use hmac::{Hmac, KeyInit as _, Mac as _};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

mod common;
use common::service::{Stopped, TestResult, free_port, gdn, until};
use goondan_test_support::text;

/// The legacy form's secret.
const LEGACY_SECRET: &str = "replay-test-legacy-secret-5c1e";
/// The Standard Webhooks key (its secret is `whsec_` + base64 of it).
const STANDARD_KEY: &[u8] = b"replay-test-standard-key-\x00\x01\xfe";

/// Two webhook Connections, one per signing form, each to its own agent.
fn bundle(dir: &Path, legacy_port: u16, standard_port: u16) -> std::io::Result<()> {
    let signed = |port: u16, secret: &str| {
        let more = json!({"swarmRef": "Swarm/bank", "secrets": {"WEBHOOK_SECRET": {"valueFrom": {"env": secret}}}});
        (port.to_string(), more)
    };
    let (legacy, legacy_more) = signed(legacy_port, "LEGACY_HOOK_SECRET");
    let (standard, standard_more) = signed(standard_port, "STANDARD_HOOK_SECRET");
    Bundle::new()
        .scripted_model("echo", [reply_text("done")])
        .one_agent("bank", Agent::new("teller", "echo"))
        .connection("legacy", "webhook", &[("WEBHOOK_PORT", &legacy)], legacy_more)
        .connection("standard", "webhook", &[("WEBHOOK_PORT", &standard)], standard_more)
        .write(dir)?;
    std::fs::write(
        dir.join(".env"),
        format!("LEGACY_HOOK_SECRET={LEGACY_SECRET}\nSTANDARD_HOOK_SECRET=whsec_{}\n", base64(STANDARD_KEY)),
    )
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key)?;
    for part in parts {
        mac.update(part);
    }
    Ok(mac.finalize().into_bytes().to_vec())
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// One POST on its own connection: the status line's code.
fn post(port: u16, headers: &[(&str, String)], body: &[u8]) -> Result<u16, std::io::Error> {
    let mut all = vec![("content-type", "application/json")];
    all.extend(headers.iter().map(|(name, value)| (*name, value.as_str())));
    Ok(http::status(&http::post(port, &all, body)?))
}

fn legacy_headers(body: &[u8], delivery_id: &str) -> Result<Vec<(&'static str, String)>, Box<dyn std::error::Error>> {
    Ok(vec![
        ("X-Signature-256", format!("sha256={}", hex::encode(hmac(LEGACY_SECRET.as_bytes(), &[body])?))),
        ("X-Delivery-Id", delivery_id.to_owned()),
    ])
}

fn standard_headers(id: &str, at: u64, body: &[u8]) -> Result<Vec<(&'static str, String)>, Box<dyn std::error::Error>> {
    let at = at.to_string();
    let signature = base64(&hmac(STANDARD_KEY, &[id.as_bytes(), b".", at.as_bytes(), b".", body])?);
    Ok(vec![("webhook-id", id.to_owned()), ("webhook-timestamp", at), ("webhook-signature", format!("v1,{signature}"))])
}

fn inbox_path(state: &Path) -> PathBuf {
    state.join("workspaces").join("bank").join("ingress").join("inbox.jsonl")
}

/// How often each key was accepted into the inbox (a stored event).
fn accepted(state: &Path) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for line in std::fs::read_to_string(inbox_path(state)).unwrap_or_default().lines() {
        let Ok(record) = serde_json::from_str::<Value>(line) else { continue };
        if record["op"] == "accept" {
            *counts.entry(record["key"].as_str().unwrap_or_default().to_owned()).or_default() += 1;
        }
    }
    counts
}

fn turns(dir: &Path, state: &Path, key: &str) -> Result<u64, std::io::Error> {
    common::service::turns(dir, state, "teller", key)
}

fn start(dir: &Path, state: &Path) -> TestResult {
    let started = gdn(dir, state, &["run", "--detach"])?;
    assert_eq!(started.status.code(), Some(0), "{}{}", text(&started.stdout), text(&started.stderr));
    Ok(())
}

#[test]
fn a_replayed_webhook_runs_no_second_turn_before_or_after_a_restart() -> TestResult {
    let dir = tempfile::tempdir()?;
    let state = dir.path().join("state");
    let (legacy, standard) = (free_port()?, free_port()?);
    bundle(dir.path(), legacy, standard)?;
    start(dir.path(), &state)?;
    let _running = Stopped { dir: dir.path().to_path_buf(), state: state.clone() };

    // The sender's request, and an attacker's copy of it with a delivery id of its own.
    let transfer = br#"{"event":"transfer","text":"pay 100 to mallory","instanceKey":"pay-1"}"#;
    assert_eq!(post(legacy, &legacy_headers(transfer, "d-1")?, transfer)?, 200);
    until("the transfer's turn", || Ok(turns(dir.path(), &state, "pay-1")? == 1))?;
    assert_eq!(post(legacy, &legacy_headers(transfer, "d-2-replayed")?, transfer)?, 200, "answered as a duplicate");

    // Standard Webhooks: the message, then the sender's retry (same id, new timestamp).
    let invoice = br#"{"event":"invoice","text":"invoice paid","instanceKey":"std-1"}"#;
    assert_eq!(post(standard, &standard_headers("msg_1", now(), invoice)?, invoice)?, 200);
    until("the invoice's turn", || Ok(turns(dir.path(), &state, "std-1")? == 1))?;
    assert_eq!(post(standard, &standard_headers("msg_1", now() + 1, invoice)?, invoice)?, 200);
    // A captured one, six minutes later, is refused outright.
    assert_eq!(post(standard, &standard_headers("msg_1", now() - 6 * 60, invoice)?, invoice)?, 401);
    // Its signature under another id (a replay that would dodge the key) too.
    let mut moved = standard_headers("msg_1", now(), invoice)?;
    moved[0].1 = "msg_2".to_owned();
    assert_eq!(post(standard, &moved, invoice)?, 401);

    // The dedupe memory is the durable inbox: it survives a restart.
    let stopped = gdn(dir.path(), &state, &["stop"])?;
    assert_eq!(stopped.status.code(), Some(0), "{}", text(&stopped.stderr));
    start(dir.path(), &state)?;
    assert_eq!(post(legacy, &legacy_headers(transfer, "d-3-after-restart")?, transfer)?, 200);
    assert_eq!(post(standard, &standard_headers("msg_1", now(), invoice)?, invoice)?, 200);

    // A new event after the replays: once its turn ran, a stored replay would have had its own.
    let marker = br#"{"event":"transfer","text":"a real second transfer","instanceKey":"pay-2"}"#;
    assert_eq!(post(legacy, &legacy_headers(marker, "d-4")?, marker)?, 200);
    until("the second transfer's turn", || Ok(turns(dir.path(), &state, "pay-2")? == 1))?;
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(turns(dir.path(), &state, "pay-1")?, 1, "a replay of the transfer ran a turn");
    assert_eq!(turns(dir.path(), &state, "std-1")?, 1, "a retry of the invoice ran a turn");
    let digest = |body: &[u8]| format!("body-sha256:{}", hex::encode(Sha256::digest(body)));
    let expected = BTreeMap::from([
        (format!("legacy/{}", digest(transfer)), 1),
        (format!("legacy/{}", digest(marker)), 1),
        ("standard/msg_1".to_owned(), 1),
    ]);
    assert_eq!(accepted(&state), expected, "each delivery stored once, under its signed key");
    Ok(())
}
