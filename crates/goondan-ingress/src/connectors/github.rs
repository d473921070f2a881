//! `github`: GitHub webhook deliveries. The original ships the reading
//! (`parseGithubWebhook`) but no server; this is the server, with
//! `X-Hub-Signature-256` required whenever a secret is configured (the
//! original let a request without the header through). The delivery key
//! is `body-sha256:<hex>` of the body: `X-GitHub-Delivery` is outside the
//! signature, so a captured delivery re-posted with a new one must not be a
//! new event. A redelivery from GitHub's settings page (the same body) runs
//! no second turn either; distinct events have distinct bodies (they carry
//! their own ids and times).

use std::collections::BTreeMap;

use goondan_core::JsonValue;
use serde_json::Map;

use super::http::{self, Endpoint, Incoming, Keys, Listen, Outcome};
use crate::connector::{ConnectorContext, StartFuture};
use crate::event::{ConnectorEvent, Delivery, EventMessage};

pub(crate) const KEYS: Keys = Keys {
    port: "GITHUB_WEBHOOK_PORT",
    path: "GITHUB_WEBHOOK_PATH",
    host: "GITHUB_HOST",
    max_body: "GITHUB_MAX_BODY_BYTES",
};

pub(crate) const DEFAULT_PORT: u16 = 8789;

struct Github {
    connection: String,
    secret: Option<String>,
}

/// Starts the `github` connector: binds `GITHUB_WEBHOOK_PORT`/`PORT`
/// (default 8789) on `GITHUB_HOST`/`HOST` (default 127.0.0.1), path
/// `GITHUB_WEBHOOK_PATH` (default `/`); secret `GITHUB_WEBHOOK_SECRET` or
/// the original's `signingSecret`.
pub fn start(ctx: ConnectorContext) -> StartFuture {
    Box::pin(async move {
        let listen = Listen::from_config(&ctx, &KEYS, DEFAULT_PORT)?;
        let secret =
            ["GITHUB_WEBHOOK_SECRET", "signingSecret"].iter().find_map(|name| ctx.secrets.get(name)).map(str::to_owned);
        if secret.is_none() {
            http::allow_unsigned(&ctx, &listen, "GITHUB_WEBHOOK_SECRET")?;
        }
        let endpoint = Github { connection: ctx.connection.clone(), secret };
        http::serve(ctx, listen, endpoint).await
    })
}

impl Endpoint for Github {
    fn handle(&self, request: &Incoming) -> Outcome {
        if let Some(secret) = &self.secret {
            let Some(signature) = request.header("x-hub-signature-256") else {
                return http::unauthorized(&self.connection, "no X-Hub-Signature-256 header");
            };
            let matches = signature
                .strip_prefix("sha256=")
                .is_some_and(|hex| http::hmac_sha256_matches(secret.as_bytes(), &[&request.body], hex));
            if !matches {
                return http::unauthorized(&self.connection, "X-Hub-Signature-256 does not match the body");
            }
        }
        let Some(kind) = request.header("x-github-event") else {
            return http::bad_request("no X-GitHub-Event header");
        };
        let Ok(JsonValue::Object(body)) = serde_json::from_slice::<JsonValue>(&request.body) else {
            return http::bad_request("the body must be a JSON object (content type application/json)");
        };
        if kind == "ping" {
            return Outcome::Reply(http::ok_text("pong"));
        }
        let key = http::body_digest_key(&request.body);
        if let Some(delivery) = request.header("x-github-delivery") {
            tracing::debug!(connection = %self.connection, delivery, %key, "a GitHub delivery");
        }
        Outcome::Emit { deliveries: vec![Delivery::keyed(key, parse(kind, &body))], ack: http::ok_text("OK") }
    }
}

fn str_field<'a>(object: &'a Map<String, JsonValue>, key: &str) -> Option<&'a str> {
    object.get(key).and_then(JsonValue::as_str).filter(|s| !s.is_empty())
}

fn object<'a>(object: &'a Map<String, JsonValue>, key: &str) -> Option<&'a Map<String, JsonValue>> {
    object.get(key).and_then(JsonValue::as_object)
}

fn number(object: Option<&Map<String, JsonValue>>) -> Option<String> {
    object.and_then(|o| o.get("number")).filter(|n| n.is_number()).map(JsonValue::to_string)
}

/// The original's `parseGithubWebhook`: the four events of the manifest by
/// their names; any other event type as `github_<type>`.
fn parse(kind: &str, body: &Map<String, JsonValue>) -> ConnectorEvent {
    let action = str_field(body, "action");
    let repo = object(body, "repository").and_then(|r| str_field(r, "full_name"));
    let mut properties = BTreeMap::from([("event".to_owned(), kind.to_owned())]);
    let mut put = |key: &str, value: Option<String>| {
        if let Some(value) = value {
            properties.insert(key.to_owned(), value);
        }
    };
    put("action", action.map(str::to_owned));
    put("repo", repo.map(str::to_owned));
    put("sender", object(body, "sender").and_then(|s| str_field(s, "login")).map(str::to_owned));
    let action_text = action.unwrap_or_default();
    let (name, text) = match kind {
        "push" => {
            let reference = str_field(body, "ref");
            put("ref", reference.map(str::to_owned));
            let fallback = format!("push to {}", reference.unwrap_or("unknown"));
            let message = object(body, "head_commit").and_then(|c| str_field(c, "message"));
            ("github_push".to_owned(), message.map_or(fallback, str::to_owned))
        }
        "pull_request" => {
            let pr = object(body, "pull_request");
            put("number", number(pr));
            let title = pr.and_then(|p| str_field(p, "title"));
            ("github_pull_request".to_owned(), title.map_or_else(|| format!("PR {action_text}"), str::to_owned))
        }
        "issues" => {
            let issue = object(body, "issue");
            put("number", number(issue));
            let title = issue.and_then(|i| str_field(i, "title"));
            ("github_issue".to_owned(), title.map_or_else(|| format!("Issue {action_text}"), str::to_owned))
        }
        "issue_comment" => {
            put("number", number(object(body, "issue")));
            let comment = object(body, "comment").and_then(|c| str_field(c, "body"));
            ("github_issue_comment".to_owned(), comment.unwrap_or("comment").to_owned())
        }
        other => {
            let text = if action_text.is_empty() { other.to_owned() } else { format!("{other} {action_text}") };
            (format!("github_{other}"), text)
        }
    };
    let instance_key = repo.map_or_else(|| format!("github:{kind}"), |repo| format!("github:{repo}"));
    ConnectorEvent { name, message: EventMessage::text(text), properties, instance_key }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::connectors::test_support::object as body;

    #[test]
    fn the_four_events_read_as_the_original() {
        let repo = json!({"full_name": "o/r"});
        let sender = json!({"login": "octocat"});
        let push = parse(
            "push",
            &body(
                json!({"ref": "refs/heads/main", "head_commit": {"message": "fix"}, "repository": repo, "sender": sender}),
            ),
        );
        assert_eq!((push.name.as_str(), push.message.input_text().as_str()), ("github_push", "fix"));
        assert_eq!(push.properties.get("ref").map(String::as_str), Some("refs/heads/main"));
        assert_eq!(push.properties.get("sender").map(String::as_str), Some("octocat"));
        assert_eq!(push.instance_key, "github:o/r");

        let pr = parse(
            "pull_request",
            &body(json!({"action": "opened", "pull_request": {"number": 7, "title": "T"}, "repository": repo})),
        );
        assert_eq!((pr.name.as_str(), pr.message.input_text().as_str()), ("github_pull_request", "T"));
        assert_eq!(pr.properties.get("number").map(String::as_str), Some("7"));
        assert_eq!(pr.properties.get("action").map(String::as_str), Some("opened"));

        let issue = parse("issues", &body(json!({"action": "closed", "issue": {"number": 3}})));
        assert_eq!((issue.name.as_str(), issue.message.input_text().as_str()), ("github_issue", "Issue closed"));
        assert_eq!(issue.instance_key, "github:issues");

        let comment = parse("issue_comment", &body(json!({"issue": {"number": 3}, "comment": {"body": "LGTM"}})));
        assert_eq!((comment.name.as_str(), comment.message.input_text().as_str()), ("github_issue_comment", "LGTM"));
        assert_eq!(comment.properties.get("event").map(String::as_str), Some("issue_comment"));

        let star = parse("star", &body(json!({"action": "created"})));
        assert_eq!((star.name.as_str(), star.message.input_text().as_str()), ("github_star", "star created"));
        let bare_push = parse("push", &body(json!({})));
        assert_eq!(bare_push.message.input_text(), "push to unknown");
    }
}
