//! The event a connector emits, as the original defines it
//! (`ConnectorEvent {name, message, properties, instanceKey}`), and the
//! [`Delivery`] that carries it into the inbox with its delivery key.

use std::collections::BTreeMap;

use goondan_core::JsonValue;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// The content of an event: one of the original's three message types.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum EventMessage {
    /// `{type: "text", text}`.
    Text {
        /// The text.
        text: String,
    },
    /// `{type: "image", url}`.
    Image {
        /// Where the image is.
        url: String,
    },
    /// `{type: "file", url, name}`.
    File {
        /// Where the file is.
        url: String,
        /// Its name.
        name: String,
    },
}

impl EventMessage {
    /// A text message.
    pub fn text(text: impl Into<String>) -> Self {
        Self::Text { text: text.into() }
    }

    /// The turn's input text, by the original's rules: the text itself,
    /// `[image] <url>`, or `[file:<name>] <url>`.
    pub fn input_text(&self) -> String {
        match self {
            Self::Text { text } => text.clone(),
            Self::Image { url } => format!("[image] {url}"),
            Self::File { url, name } => format!("[file:{name}] {url}"),
        }
    }
}

/// A normalized event from a connector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConnectorEvent {
    /// The event name (one of the Connector's declared `events[].name`).
    pub name: String,
    /// What was said.
    pub message: EventMessage,
    /// The event's properties (string values, as in the original).
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// The instance the event belongs to, unless a route replaces it.
    pub instance_key: String,
}

/// Why an emitted value is not a [`ConnectorEvent`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    /// The value is not an object.
    #[error("a connector event must be an object {{name, message, properties, instanceKey}}")]
    NotAnObject,
    /// A required string field is missing or empty.
    #[error("a connector event needs a non-empty string '{0}'")]
    MissingField(&'static str),
    /// `message` is not one of the three types.
    #[error(
        "a connector event's 'message' must be {{type: \"text\", text}}, {{type: \"image\", url}} or {{type: \"file\", url, name}}"
    )]
    BadMessage,
    /// A property value is not a string, number or boolean.
    #[error("property '{0}' of a connector event must be a string, number or boolean")]
    BadProperty(String),
    /// The delivery key is not usable.
    #[error("a delivery key must be 1 to 512 characters")]
    BadKey,
}

impl ConnectorEvent {
    /// Reads an event a connector emitted as JSON (a script connector's
    /// `ctx.emit(...)`). Numbers and booleans among the properties become
    /// strings (the original dropped them silently); anything else is an
    /// error, so a connector author learns of it at once.
    pub fn from_json(value: &JsonValue) -> Result<Self, EventError> {
        let object = value.as_object().ok_or(EventError::NotAnObject)?;
        let string = |field: &'static str| {
            object
                .get(field)
                .and_then(JsonValue::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .ok_or(EventError::MissingField(field))
        };
        let name = string("name")?;
        let instance_key = string("instanceKey")?;
        let message = object
            .get("message")
            .cloned()
            .and_then(|message| serde_json::from_value::<EventMessage>(message).ok())
            .ok_or(EventError::BadMessage)?;
        let mut properties = BTreeMap::new();
        match object.get("properties") {
            None | Some(JsonValue::Null) => {}
            Some(JsonValue::Object(map)) => {
                for (key, value) in map {
                    let value = property_text(value).ok_or_else(|| EventError::BadProperty(key.clone()))?;
                    properties.insert(key.clone(), value);
                }
            }
            Some(_) => return Err(EventError::BadProperty("properties".to_owned())),
        }
        Ok(Self { name, message, properties, instance_key })
    }
}

/// A property's value as events carry it (and routes match it): a string
/// as it is, a number or a boolean written out; `None` for anything else.
pub(crate) fn property_text(value: &JsonValue) -> Option<String> {
    match value {
        JsonValue::String(s) => Some(s.clone()),
        JsonValue::Number(n) => Some(n.to_string()),
        JsonValue::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The string, number and boolean entries of `properties` (a payload's
/// `properties`, if it is an object) as an event's properties. As the
/// original's connectors: other values, and a `properties` that is no
/// object, are left out.
pub(crate) fn lenient_properties(properties: Option<&JsonValue>) -> BTreeMap<String, String> {
    let Some(JsonValue::Object(map)) = properties else { return BTreeMap::new() };
    map.iter().filter_map(|(key, value)| Some((key.clone(), property_text(value)?))).collect()
}

/// An event on its way into the inbox, with the key that tells a
/// redelivery apart from a new event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    /// The delivery key the outside gave (`update_id`, Slack `event_id`,
    /// `X-GitHub-Delivery`, …) or a digest of what arrived; `None`: every
    /// emit is a new event (the inbox gives it a unique key).
    pub key: Option<String>,
    /// The event.
    pub event: ConnectorEvent,
}

/// The longest delivery key.
pub const MAX_KEY_CHARS: usize = 512;

impl Delivery {
    /// A delivery with the outside's key.
    pub fn keyed(key: impl Into<String>, event: ConnectorEvent) -> Self {
        Self { key: Some(key.into()), event }
    }

    /// A delivery with no key of its own: never deduplicated.
    pub fn unkeyed(event: ConnectorEvent) -> Self {
        Self { key: None, event }
    }

    /// Checks the key's length.
    pub fn check(&self) -> Result<(), EventError> {
        match &self.key {
            Some(key) if key.is_empty() || key.chars().count() > MAX_KEY_CHARS => Err(EventError::BadKey),
            _ => Ok(()),
        }
    }
}

/// A delivery key made from the bytes that arrived (`sha256:<hex>`), for
/// sources that resend the same bytes and give no id of their own.
pub fn digest_key(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut key = String::with_capacity(7 + 64);
    key.push_str("sha256:");
    for byte in digest {
        key.push_str(&format!("{byte:02x}"));
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_emitted_event_is_read_with_its_properties_as_strings() -> Result<(), EventError> {
        let event = ConnectorEvent::from_json(&json!({
            "name": "telegram_message",
            "message": {"type": "text", "text": "hi"},
            "properties": {"chat_id": "42", "update_id": 7, "bot": false},
            "instanceKey": "telegram:42"
        }))?;
        assert_eq!(event.properties["update_id"], "7");
        assert_eq!(event.properties["bot"], "false");
        assert_eq!(event.message.input_text(), "hi");
        Ok(())
    }

    #[test]
    fn bad_events_say_what_is_wrong() {
        let bad = [
            (json!("x"), EventError::NotAnObject),
            (json!({"message": {"type": "text", "text": ""}, "instanceKey": "k"}), EventError::MissingField("name")),
            (json!({"name": "n", "message": {"type": "text", "text": ""}}), EventError::MissingField("instanceKey")),
            (json!({"name": "n", "message": {"type": "audio"}, "instanceKey": "k"}), EventError::BadMessage),
            (
                json!({"name": "n", "message": {"type": "text", "text": "t"}, "instanceKey": "k", "properties": {"a": [1]}}),
                EventError::BadProperty("a".into()),
            ),
        ];
        for (value, error) in bad {
            assert_eq!(ConnectorEvent::from_json(&value), Err(error), "{value}");
        }
    }

    #[test]
    fn input_text_follows_the_original() {
        assert_eq!(EventMessage::Image { url: "u".into() }.input_text(), "[image] u");
        assert_eq!(EventMessage::File { url: "u".into(), name: "a.pdf".into() }.input_text(), "[file:a.pdf] u");
    }

    #[test]
    fn digests_are_stable_and_distinct() {
        assert_eq!(digest_key(b"a"), digest_key(b"a"));
        assert_ne!(digest_key(b"a"), digest_key(b"b"));
        assert!(digest_key(b"").starts_with("sha256:e3b0c442"));
    }
}
