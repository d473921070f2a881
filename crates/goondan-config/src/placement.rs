//! `spec.placement` of an Agent (an addition of this runtime, for swarms
//! spread over several hosts): the labels a host must carry for the agent's
//! instances to be placed on it ([`crate::Bundle::placement_for`]).
//!
//! A label's name and value are each 1 to [`MAX_LABEL_LEN`] characters of
//! `A-Z a-z 0-9 . _ -`. Validation (`crate::validate`) and a host's own
//! labels (`gdn host --label K=V`, read with [`parse_host_label`]) follow the
//! same rules ([`check_label_name`], [`check_label_value`]), so a label
//! `gdn validate` accepts can be written on a host's command line.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

/// Label name → value, sorted by name.
pub type HostLabels = BTreeMap<String, String>;

/// The longest label name or value, in characters.
pub const MAX_LABEL_LEN: usize = 63;

/// `Agent.spec.placement`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentPlacement {
    /// `spec.placement.hostLabels`: the labels a host must carry, every
    /// one with the same value, for the agent to be placed on it. Values
    /// written unquoted as booleans or integers (`gpu: true`, `cores: 8`)
    /// are held in their plain form (`"true"`, `"8"`).
    #[serde(default, deserialize_with = "de_host_labels")]
    pub host_labels: HostLabels,
}

/// Why a label name or value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    /// An empty name or value.
    #[error("an empty host label {0}")]
    Empty(&'static str),
    /// Longer than [`MAX_LABEL_LEN`].
    #[error("host label {what} '{text}' is {len} characters long, more than {MAX_LABEL_LEN}")]
    TooLong {
        /// `name` or `value`.
        what: &'static str,
        /// The text.
        text: String,
        /// Its length in characters.
        len: usize,
    },
    /// A character outside `A-Z a-z 0-9 . _ -`.
    #[error("host label {what} '{text}' has {found:?}; only letters, digits, '.', '_' and '-' may be used")]
    Character {
        /// `name` or `value`.
        what: &'static str,
        /// The text.
        text: String,
        /// The first character refused.
        found: char,
    },
    /// `K=V` without the `=`.
    #[error("host label '{0}' is not NAME=VALUE")]
    NoEquals(String),
}

fn check_label(what: &'static str, text: &str) -> Result<(), LabelError> {
    if text.is_empty() {
        return Err(LabelError::Empty(what));
    }
    if let Some(found) = text.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
        return Err(LabelError::Character { what, text: text.to_owned(), found });
    }
    // All ASCII from here on: bytes are characters.
    if text.len() > MAX_LABEL_LEN {
        return Err(LabelError::TooLong { what, text: text.to_owned(), len: text.len() });
    }
    Ok(())
}

/// A label name: 1 to 63 characters of `A-Z a-z 0-9 . _ -`.
pub fn check_label_name(name: &str) -> Result<(), LabelError> {
    check_label("name", name)
}

/// A label value: 1 to 63 characters of `A-Z a-z 0-9 . _ -`.
pub fn check_label_value(value: &str) -> Result<(), LabelError> {
    check_label("value", value)
}

/// A host's label written `NAME=VALUE` (`gdn host --label gpu=true`), both
/// parts checked as `spec.placement.hostLabels` entries are.
pub fn parse_host_label(text: &str) -> Result<(String, String), LabelError> {
    let Some((name, value)) = text.split_once('=') else {
        return Err(LabelError::NoEquals(text.to_owned()));
    };
    check_label_name(name)?;
    check_label_value(value)?;
    Ok((name.to_owned(), value.to_owned()))
}

/// Whether a host carrying `host` satisfies `required`: every required
/// label present with the same value (the host may carry more).
pub fn labels_match(required: &HostLabels, host: &HostLabels) -> bool {
    required.iter().all(|(name, value)| host.get(name) == Some(value))
}

/// A `hostLabels` value as a string: a string as is, a boolean or an
/// integer in its plain form; `None` for anything else (validation refuses
/// those: a fractional number, whose written form YAML does not keep, null,
/// a list, a mapping).
pub fn label_value_text(value: &goondan_core::JsonValue) -> Option<String> {
    use goondan_core::JsonValue;
    match value {
        JsonValue::String(text) => Some(text.clone()),
        JsonValue::Bool(flag) => Some(flag.to_string()),
        JsonValue::Number(number) if number.is_i64() || number.is_u64() => Some(number.to_string()),
        _ => None,
    }
}

/// Reads `hostLabels` with its values as [`label_value_text`] makes them.
fn de_host_labels<'de, D: Deserializer<'de>>(deserializer: D) -> Result<HostLabels, D::Error> {
    struct Labels;

    impl<'de> Visitor<'de> for Labels {
        type Value = HostLabels;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a mapping of label names to strings, booleans or integers")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut labels = HostLabels::new();
            while let Some((name, value)) = map.next_entry::<String, goondan_core::JsonValue>()? {
                let Some(text) = label_value_text(&value) else {
                    return Err(de::Error::custom(format!(
                        "host label '{name}' must be a string, a boolean or an integer, got {}",
                        goondan_core::json_type_name(&value)
                    )));
                };
                labels.insert(name, text);
            }
            Ok(labels)
        }
    }

    deserializer.deserialize_map(Labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_values_are_letters_digits_dot_underscore_dash_up_to_63() {
        for good in ["gpu", "zone", "eu-west-1", "k8s.io_node", "A", &"x".repeat(63)] {
            assert_eq!(check_label_name(good), Ok(()), "{good}");
            assert_eq!(check_label_value(good), Ok(()), "{good}");
        }
        assert_eq!(check_label_name(""), Err(LabelError::Empty("name")));
        assert_eq!(check_label_value(""), Err(LabelError::Empty("value")));
        let long = "x".repeat(64);
        assert_eq!(check_label_name(&long), Err(LabelError::TooLong { what: "name", text: long.clone(), len: 64 }));
        for (bad, found) in [("gp u", ' '), ("zone/a", '/'), ("ü", 'ü'), ("a=b", '='), ("tab\t", '\t'), ("a:b", ':')]
        {
            assert_eq!(
                check_label_value(bad),
                Err(LabelError::Character { what: "value", text: bad.to_owned(), found }),
                "{bad}"
            );
        }
        // 63 two-byte characters: refused for the character, not the length.
        assert!(matches!(check_label_name(&"é".repeat(63)), Err(LabelError::Character { found: 'é', .. })));
    }

    #[test]
    fn a_host_label_on_the_command_line_is_name_equals_value() {
        assert_eq!(parse_host_label("gpu=true"), Ok(("gpu".to_owned(), "true".to_owned())));
        assert_eq!(parse_host_label("zone=eu-west-1"), Ok(("zone".to_owned(), "eu-west-1".to_owned())));
        assert_eq!(parse_host_label("gpu"), Err(LabelError::NoEquals("gpu".to_owned())));
        assert_eq!(parse_host_label("=x"), Err(LabelError::Empty("name")));
        assert_eq!(parse_host_label("gpu="), Err(LabelError::Empty("value")));
        assert!(matches!(parse_host_label("a=b=c"), Err(LabelError::Character { what: "value", found: '=', .. })));
    }

    #[test]
    fn a_host_matches_when_it_carries_every_required_label_with_its_value() {
        let labels = |pairs: &[(&str, &str)]| -> HostLabels {
            pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
        };
        let required = labels(&[("gpu", "true"), ("zone", "eu")]);
        assert!(labels_match(&required, &labels(&[("gpu", "true"), ("zone", "eu"), ("extra", "1")])));
        assert!(!labels_match(&required, &labels(&[("gpu", "true")])));
        assert!(!labels_match(&required, &labels(&[("gpu", "false"), ("zone", "eu")])));
        assert!(labels_match(&HostLabels::new(), &HostLabels::new()));
    }

    #[test]
    fn unquoted_booleans_and_integers_are_read_as_their_plain_text() {
        use goondan_core::JsonValue;
        let read = |json: &str| -> Result<AgentPlacement, serde_json::Error> { serde_json::from_str(json) };
        let Ok(placement) =
            read(r#"{"hostLabels": {"gpu": true, "cores": 8, "zone": "eu", "big": 18446744073709551615}}"#)
        else {
            panic!("not read")
        };
        let expected: HostLabels = [("big", "18446744073709551615"), ("cores", "8"), ("gpu", "true"), ("zone", "eu")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        assert_eq!(placement.host_labels, expected);
        assert_eq!(label_value_text(&JsonValue::from(-3)), Some("-3".to_owned()));
        assert_eq!(label_value_text(&JsonValue::from(1.5)), None);
        assert_eq!(label_value_text(&JsonValue::Null), None);
        assert!(read(r#"{"hostLabels": {"v": 1.10}}"#).is_err());
        assert!(read(r#"{"hostLabels": {"v": [1]}}"#).is_err());
        assert_eq!(read("{}").map(|p| p.host_labels.is_empty()).ok(), Some(true));
    }
}
