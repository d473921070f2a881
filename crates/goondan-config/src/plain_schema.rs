//! Recognizing parameter schemas that are valid without asking `jsonschema`.
//!
//! A Tool export's `parameters` must be a valid JSON Schema, and the loader
//! checks that with `jsonschema::validator_for`. The first call in a process
//! builds jsonschema's validator for the draft 2020-12 meta-schema: ~6
//! million instructions (~1 ms), more than the rest of loading a small
//! bundle, paid by every agent process at start. `jsonschema` 0.60 has no
//! public way to skip or prebuild that step.
//!
//! Most parameter schemas are plain: `type`, `properties`, `required`,
//! `items`, `description`, `enum`… with values of the shapes the meta-schema
//! asks for. [`is_plain`] recognizes exactly those, and for them the answer
//! of `validator_for` is known: valid, and it compiles (none of these
//! keywords can fail to compile; the property test below checks both against
//! `validator_for` itself). So the loader asks `jsonschema` only about the
//! others, and every diagnostic stays what `validator_for` says.
//!
//! `false` means "not known to be valid", never "invalid".

use goondan_core::JsonValue;

/// Deeper schemas are left to `jsonschema`; parameter schemas are shallow.
const MAX_DEPTH: usize = 32;

/// Whether `schema` is certainly a valid draft 2020-12 JSON Schema that
/// `jsonschema` compiles (see the module docs).
pub(crate) fn is_plain(schema: &JsonValue) -> bool {
    // A `$` key anywhere (`$schema`, `$ref`, `$id`, `$defs`, also inside
    // `enum` values or as a property name) can change the draft, resolve
    // references or start an embedded resource: all left to jsonschema.
    !has_dollar_key(schema, 0) && plain_subschema(schema, 0)
}

fn has_dollar_key(value: &JsonValue, depth: usize) -> bool {
    if depth > MAX_DEPTH {
        return true;
    }
    match value {
        JsonValue::Object(map) => {
            map.iter().any(|(key, value)| key.starts_with('$') || has_dollar_key(value, depth + 1))
        }
        JsonValue::Array(items) => items.iter().any(|item| has_dollar_key(item, depth + 1)),
        _ => false,
    }
}

fn plain_subschema(schema: &JsonValue, depth: usize) -> bool {
    let map = match schema {
        JsonValue::Bool(_) => return true,
        JsonValue::Object(map) if depth <= MAX_DEPTH => map,
        _ => return false,
    };
    map.iter().all(|(keyword, value)| match keyword.as_str() {
        "type" => match value {
            JsonValue::String(name) => is_type_name(name),
            JsonValue::Array(names) => {
                !names.is_empty()
                    && names.iter().all(|name| name.as_str().is_some_and(is_type_name))
                    && all_distinct(names)
            }
            _ => false,
        },
        "title" | "description" => value.is_string(),
        "default" | "const" => true,
        "enum" | "examples" => value.is_array(),
        "deprecated" | "readOnly" | "writeOnly" | "uniqueItems" => value.is_boolean(),
        "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum" => value.is_number(),
        "minLength" | "maxLength" | "minItems" | "maxItems" | "minProperties" | "maxProperties" => value.is_u64(),
        "required" => {
            value.as_array().is_some_and(|names| names.iter().all(JsonValue::is_string) && all_distinct(names))
        }
        "properties" => {
            value.as_object().is_some_and(|properties| properties.values().all(|s| plain_subschema(s, depth + 1)))
        }
        "items" | "additionalProperties" => plain_subschema(value, depth + 1),
        _ => false,
    })
}

fn is_type_name(name: &str) -> bool {
    matches!(name, "array" | "boolean" | "integer" | "null" | "number" | "object" | "string")
}

fn all_distinct(values: &[JsonValue]) -> bool {
    values.iter().enumerate().all(|(i, value)| !values[..i].contains(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn plain_schemas_are_recognized() {
        for schema in [
            json!({"type": "object"}),
            json!({"type": "object", "properties": {"text": {"type": "string", "description": "d"}}, "required": ["text"], "additionalProperties": false}),
            json!({"type": "object", "properties": {"to": {"enum": ["upper", "lower"], "default": "upper"}, "n": {"type": ["integer", "null"], "minimum": 0, "maximum": 10}}}),
            json!({"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "string"}, "minItems": 1, "uniqueItems": true}}}),
            json!({"type": "object", "properties": {"a": true, "b": false}, "additionalProperties": {"type": "integer", "exclusiveMinimum": 0}}),
        ] {
            assert!(is_plain(&schema), "{schema}");
            assert!(jsonschema::validator_for(&schema).is_ok(), "{schema}");
        }
    }

    #[test]
    fn anything_else_is_left_to_jsonschema() {
        for schema in [
            json!({"type": "object", "properties": {"a": {"type": 7}}}),
            json!({"type": "object", "properties": {"a": {"type": "strin"}}}),
            json!({"type": "object", "properties": {"a": {"type": []}}}),
            json!({"type": "object", "properties": {"a": {"type": ["string", "string"]}}}),
            json!({"type": "object", "required": "a"}),
            json!({"type": "object", "required": ["a", "a"]}),
            json!({"type": "object", "required": [1]}),
            json!({"type": "object", "properties": {"a": {"minLength": -1}}}),
            json!({"type": "object", "properties": {"a": {"minLength": 1.5}}}),
            json!({"type": "object", "properties": {"a": {"minLength": 1.0}}}),
            json!({"type": "object", "properties": {"a": {"pattern": "["}}}),
            json!({"type": "object", "properties": {"a": {"format": "email"}}}),
            json!({"type": "object", "properties": {"a": {"$ref": "#/nope"}}}),
            json!({"$schema": "http://json-schema.org/draft-04/schema#", "type": "object"}),
            json!({"type": "object", "properties": {"$id": {"type": "string"}}}),
            json!({"type": "object", "properties": {"a": {"enum": [{"$ref": "#"}]}}}),
            json!({"type": "object", "additionalProperties": 5}),
            json!({"type": "object", "properties": 5}),
            json!({"type": "object", "items": [true]}),
            json!({"type": "object", "nullable": true}),
        ] {
            assert!(!is_plain(&schema), "{schema}");
        }
    }

    #[test]
    fn deep_schemas_are_left_to_jsonschema() {
        let mut schema = json!({"type": "string"});
        for _ in 0..(MAX_DEPTH + 2) {
            schema = json!({"type": "array", "items": schema});
        }
        assert!(!is_plain(&schema));
    }

    /// Values of every JSON type, including the near misses of each
    /// keyword's shape (negative, fractional, duplicate, `$` keys).
    fn any_value() -> impl Strategy<Value = JsonValue> {
        let leaf = prop_oneof![
            Just(json!(null)),
            any::<bool>().prop_map(JsonValue::Bool),
            (-3_i64..5).prop_map(|n| json!(n)),
            Just(json!(1.5)),
            Just(json!(2.0)),
            Just(json!(-0.5)),
            Just(json!(u64::MAX)),
            prop::sample::select(vec!["string", "object", "array", "integer", "strin", "", "$ref", "a", "["])
                .prop_map(|s| json!(s)),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(JsonValue::Array),
                prop::collection::vec((key(), inner), 0..4)
                    .prop_map(|entries| JsonValue::Object(entries.into_iter().collect())),
            ]
        })
    }

    fn key() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            "type",
            "title",
            "description",
            "default",
            "const",
            "enum",
            "examples",
            "deprecated",
            "readOnly",
            "writeOnly",
            "uniqueItems",
            "minimum",
            "maximum",
            "exclusiveMinimum",
            "exclusiveMaximum",
            "minLength",
            "maxLength",
            "minItems",
            "maxItems",
            "minProperties",
            "maxProperties",
            "required",
            "properties",
            "items",
            "additionalProperties",
            "a",
            "b",
            "$ref",
            "$schema",
            "pattern",
            "format",
        ])
        .prop_map(str::to_owned)
    }

    /// Schemas built from the recognized keywords with well-formed values,
    /// so that many of the generated cases are plain.
    fn plain_like() -> impl Strategy<Value = JsonValue> {
        let leaf =
            prop_oneof![any::<bool>().prop_map(JsonValue::Bool), Just(json!({})), Just(json!({"type": "string"}))];
        leaf.prop_recursive(4, 32, 6, |inner| {
            let keyword = prop_oneof![
                prop::sample::select(vec!["string", "integer", "number", "object", "array", "boolean", "null"])
                    .prop_map(|t| ("type".to_owned(), json!(t))),
                Just(("type".to_owned(), json!(["string", "null"]))),
                Just(("description".to_owned(), json!("d"))),
                Just(("enum".to_owned(), json!(["x", 1, null, {"k": [1]}]))),
                Just(("enum".to_owned(), json!([]))),
                Just(("default".to_owned(), json!({"any": "thing"}))),
                (0_u64..4).prop_map(|n| ("minLength".to_owned(), json!(n))),
                (0_u64..4).prop_map(|n| ("maxItems".to_owned(), json!(n))),
                Just(("minimum".to_owned(), json!(-1.5))),
                Just(("exclusiveMaximum".to_owned(), json!(10))),
                Just(("required".to_owned(), json!(["a", "b"]))),
                Just(("uniqueItems".to_owned(), json!(true))),
                inner.clone().prop_map(|s| ("items".to_owned(), s)),
                inner.clone().prop_map(|s| ("additionalProperties".to_owned(), s)),
                prop::collection::vec((prop::sample::select(vec!["a", "b", "c d", "é"]), inner), 0..3).prop_map(
                    |props| {
                        let props: serde_json::Map<String, JsonValue> =
                            props.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
                        ("properties".to_owned(), JsonValue::Object(props))
                    }
                ),
                any_value().prop_map(|v| ("minItems".to_owned(), v)),
            ];
            prop::collection::vec(keyword, 0..5).prop_map(|entries| JsonValue::Object(entries.into_iter().collect()))
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        #[test]
        fn plain_means_jsonschema_accepts_it(schema in prop_oneof![any_value(), plain_like()]) {
            if is_plain(&schema) {
                let verdict = jsonschema::validator_for(&schema).map(|_| ()).map_err(|e| e.to_string());
                prop_assert!(verdict.is_ok(), "{} was taken as plain but jsonschema says {:?}", schema, verdict);
            }
        }
    }
}
