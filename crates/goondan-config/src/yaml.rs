//! YAML text → JSON values plus the line and column of every node.
//!
//! Documents are parsed with `serde-saphyr` (safe: alias and size budgets,
//! no panics on malformed input) into a small node tree whose every node
//! carries its position, then flattened into a `serde_json::Value` and a map
//! from diagnostic paths (`spec.exports[0].name`) to positions, so a
//! diagnostic found on the JSON value can still point at the YAML line.
//!
//! Plain scalars resolve by the YAML 1.2 core schema, as the original's
//! loader does: only `true`/`false` (three spellings each) are booleans, so
//! `n`, `y`, `yes`, `no`, `on` and `off` stay strings (`required: [n]` names
//! a parameter `n`); `1_000` is a string, not the YAML 1.1 integer 1000.

use std::collections::HashMap;
use std::fmt;

use goondan_core::JsonValue;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

/// A 1-based line and column in the YAML text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Position {
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub column: u32,
}

/// One parsed YAML document.
#[derive(Debug, Clone)]
pub struct YamlDocument {
    /// The document as JSON.
    pub value: JsonValue,
    /// Positions of the document's nodes by path (`""` is the root).
    pub positions: HashMap<String, Position>,
}

impl YamlDocument {
    /// The position of the node at `path`, or of its nearest ancestor.
    pub fn position_of(&self, path: &str) -> Option<Position> {
        let mut path = path;
        loop {
            if let Some(position) = self.positions.get(path) {
                return Some(*position);
            }
            if path.is_empty() {
                return None;
            }
            path = parent_path(path);
        }
    }
}

fn parent_path(path: &str) -> &str {
    let cut = path.rfind(['.', '[']).unwrap_or(0);
    &path[..cut]
}

/// Why YAML text could not be parsed.
#[derive(Debug, Clone)]
pub struct YamlError {
    /// The parser's message.
    pub message: String,
    /// Where, when known.
    pub position: Option<Position>,
}

/// Parses every document of a multi-document YAML text. Empty documents are
/// skipped, as the original loader does.
pub fn parse_documents(text: &str) -> Result<Vec<YamlDocument>, YamlError> {
    let options = serde_saphyr::options! {
        strict_booleans: true,
        underscored_numbers_as_strings: true,
        legacy_octal_numbers: false,
        budget: serde_saphyr::budget! {
            max_documents: 1000,
        },
    };
    let nodes: Vec<Spanned<Node>> = serde_saphyr::from_multiple_with_options(text, options).map_err(|error| {
        let position = error.location().and_then(|loc| {
            (loc.line() > 0).then(|| Position {
                line: u32::try_from(loc.line()).unwrap_or(u32::MAX),
                column: u32::try_from(loc.column()).unwrap_or(u32::MAX),
            })
        });
        YamlError { message: first_line(&error.to_string()), position }
    })?;
    Ok(nodes
        .into_iter()
        .map(|node| {
            let mut positions = HashMap::new();
            let value = flatten(node, String::new(), &mut positions);
            YamlDocument { value, positions }
        })
        .collect())
}

/// The parser's first line, without the `error: line N column M: ` it
/// starts with (the position is reported on its own).
fn first_line(message: &str) -> String {
    let line = message.lines().next().unwrap_or(message).trim();
    let line = line.strip_prefix("error:").map(str::trim_start).unwrap_or(line);
    let without_position = line
        .strip_prefix("line ")
        .and_then(|rest| rest.split_once(": "))
        .filter(|(position, _)| position.split(' ').all(|word| word == "column" || word.parse::<u64>().is_ok()))
        .map(|(_, message)| message);
    without_position.unwrap_or(line).to_owned()
}

fn position_of<T>(spanned: &Spanned<T>) -> Option<Position> {
    let loc = spanned.referenced;
    (loc.line() > 0).then(|| Position {
        line: u32::try_from(loc.line()).unwrap_or(u32::MAX),
        column: u32::try_from(loc.column()).unwrap_or(u32::MAX),
    })
}

fn flatten(node: Spanned<Node>, path: String, positions: &mut HashMap<String, Position>) -> JsonValue {
    if let Some(position) = position_of(&node) {
        positions.insert(path.clone(), position);
    }
    match node.value {
        Node::Null => JsonValue::Null,
        Node::Bool(b) => JsonValue::Bool(b),
        Node::Int(i) => JsonValue::from(i),
        Node::UInt(u) => JsonValue::from(u),
        Node::Float(f) => serde_json::Number::from_f64(f).map_or(JsonValue::Null, JsonValue::Number),
        Node::String(s) => JsonValue::String(s),
        Node::Seq(items) => JsonValue::Array(
            items
                .into_iter()
                .enumerate()
                .map(|(index, item)| flatten(item, format!("{path}[{index}]"), positions))
                .collect(),
        ),
        Node::Map(entries) => {
            let mut map = serde_json::Map::with_capacity(entries.len());
            for (key, value) in entries {
                let child = if path.is_empty() { key.clone() } else { format!("{path}.{key}") };
                let value = flatten(value, child, positions);
                map.insert(key, value);
            }
            JsonValue::Object(map)
        }
    }
}

/// A YAML node whose children carry their positions.
enum Node {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    String(String),
    Seq(Vec<Spanned<Node>>),
    Map(Vec<(String, Spanned<Node>)>),
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Node, E> {
        Ok(Node::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Node, D::Error> {
        Node::deserialize(deserializer)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Int(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Node, E> {
        Ok(Node::UInt(v))
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Node, E> {
        i64::try_from(v).map(Node::Int).or_else(|_| {
            u64::try_from(v).map(Node::UInt).map_err(|_| E::custom(format!("integer {v} is out of range")))
        })
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Node, E> {
        u64::try_from(v).map(Node::UInt).map_err(|_| E::custom(format!("integer {v} is out of range")))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Float(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Node, E> {
        Ok(Node::String(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Node, E> {
        Ok(Node::String(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element::<Spanned<Node>>()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some(key) = map.next_key::<Node>()? {
            let key = match key {
                Node::String(s) => s,
                Node::Int(i) => i.to_string(),
                Node::UInt(u) => u.to_string(),
                Node::Bool(b) => b.to_string(),
                Node::Float(f) => f.to_string(),
                Node::Null => "null".to_owned(),
                Node::Seq(_) | Node::Map(_) => {
                    return Err(de::Error::custom("mapping keys must be scalars"));
                }
            };
            let value = map.next_value::<Spanned<Node>>()?;
            entries.push((key, value));
        }
        Ok(Node::Map(entries))
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_syntax_error_says_what_without_repeating_where() {
        assert_eq!(
            first_line("error: line 7 column 9: mapping values are not allowed in this context\nmore"),
            "mapping values are not allowed in this context"
        );
        assert_eq!(first_line("invalid type: found x"), "invalid type: found x");
        assert_eq!(first_line("line of text: kept as it is"), "line of text: kept as it is");
        let Err(error) = parse_documents("a:\n  b: 1\n   c: 2\n") else { panic!("parsed") };
        assert!(!error.message.contains("line") && !error.message.starts_with("error"), "{}", error.message);
        assert_eq!(error.position.map(|p| p.line), Some(3));
    }

    use super::*;
    use serde_json::json;

    #[test]
    fn parses_documents_with_positions() {
        let text = "apiVersion: goondan.ai/v1\nkind: Tool\nspec:\n  exports:\n    - name: exec\n      count: 3\n---\nkind: Agent\n";
        let docs = parse_documents(text).unwrap_or_default();
        assert_eq!(docs.len(), 2);
        assert_eq!(
            docs[0].value,
            json!({"apiVersion": "goondan.ai/v1", "kind": "Tool", "spec": {"exports": [{"name": "exec", "count": 3}]}})
        );
        assert_eq!(docs[0].position_of("kind"), Some(Position { line: 2, column: 7 }));
        assert_eq!(docs[0].position_of("spec.exports[0].name"), Some(Position { line: 5, column: 13 }));
        // Unknown paths fall back to the nearest ancestor.
        assert_eq!(docs[0].position_of("spec.exports[0].missing"), docs[0].position_of("spec.exports[0]"));
        assert_eq!(docs[1].value, json!({"kind": "Agent"}));
    }

    #[test]
    fn scalars_resolve_like_yaml_1_2() {
        let docs = parse_documents("a: true\nb: ~\nc: 1.5\nd: '7'\ne: -3\nf: 7\n").unwrap_or_default();
        assert_eq!(docs[0].value, json!({"a": true, "b": null, "c": 1.5, "d": "7", "e": -3, "f": 7}));
    }

    /// Plain scalars, each as a value and as a key, and what the YAML 1.2 core
    /// schema makes of them.
    #[test]
    fn plain_scalars_follow_the_yaml_1_2_core_schema_in_keys_and_values() {
        let table: &[(&str, JsonValue)] = &[
            ("n", json!("n")),
            ("N", json!("N")),
            ("y", json!("y")),
            ("Y", json!("Y")),
            ("yes", json!("yes")),
            ("Yes", json!("Yes")),
            ("YES", json!("YES")),
            ("no", json!("no")),
            ("No", json!("No")),
            ("NO", json!("NO")),
            ("on", json!("on")),
            ("On", json!("On")),
            ("ON", json!("ON")),
            ("off", json!("off")),
            ("Off", json!("Off")),
            ("OFF", json!("OFF")),
            ("1_000", json!("1_000")),
            ("true", json!(true)),
            ("True", json!(true)),
            ("TRUE", json!(true)),
            ("false", json!(false)),
            ("False", json!(false)),
            ("FALSE", json!(false)),
            ("null", json!(null)),
            ("Null", json!(null)),
            ("NULL", json!(null)),
            ("~", json!(null)),
            ("0", json!(0)),
            ("42", json!(42)),
            ("-17", json!(-17)),
            ("+5", json!(5)),
            ("0o17", json!(15)),
            ("0x1F", json!(31)),
            ("1.5", json!(1.5)),
            ("-0.25", json!(-0.25)),
            ("1e3", json!(1000.0)),
            (".5", json!(0.5)),
        ];
        for (scalar, expected) in table {
            let docs = parse_documents(&format!("value: {scalar}\nlist: [{scalar}]\n")).unwrap_or_default();
            assert_eq!(docs.len(), 1, "{scalar}");
            assert_eq!(docs[0].value["value"], *expected, "value {scalar}");
            assert_eq!(docs[0].value["list"][0], *expected, "list item {scalar}");

            // As a key, a scalar's text is what names the property, except
            // where the core schema types it (`~` is null, `0x1F` is 31).
            let docs = parse_documents(&format!("{scalar}: 1\n")).unwrap_or_default();
            let key = match expected {
                JsonValue::String(s) => s.clone(),
                JsonValue::Null => "null".to_owned(),
                JsonValue::Number(n) if n.is_f64() => n.as_f64().map(|f| f.to_string()).unwrap_or_default(),
                other => other.to_string(),
            };
            assert_eq!(docs[0].value, json!({ key: 1 }), "key {scalar}");
        }
    }

    #[test]
    fn a_required_list_of_one_letter_names_stays_names() {
        let text = "parameters:\n  type: object\n  properties:\n    n: {type: number}\n    y: {type: string}\n  required: [n, y, on]\n";
        let docs = parse_documents(text).unwrap_or_default();
        assert_eq!(docs[0].value["parameters"]["required"], json!(["n", "y", "on"]));
        assert_eq!(docs[0].value["parameters"]["properties"]["n"], json!({"type": "number"}));
    }

    #[test]
    fn malformed_yaml_reports_a_position() {
        let error = parse_documents("a: [1, 2\nb: c\n").err();
        let Some(error) = error else { panic!("expected an error") };
        assert!(error.position.is_some(), "{error:?}");
        assert!(!error.message.is_empty());
    }

    #[test]
    fn empty_documents_are_skipped() {
        let docs = parse_documents("---\n---\na: 1\n").unwrap_or_default();
        assert_eq!(docs.len(), 1);
    }

    #[test]
    fn alias_bombs_are_refused_not_expanded() {
        let mut text = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let prev = i - 1;
            text.push_str(&format!(
                "a{i}: &a{i} [*a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}, *a{prev}]\n"
            ));
        }
        assert!(parse_documents(&text).is_err());
    }
}
