//! The structural schema of each kind's `spec`, checked with JSON Schema so
//! every problem comes with the exact path of the offending field.
//!
//! Rules that a schema cannot express (names, references, files) live in
//! `validate`.

use std::sync::OnceLock;

use goondan_core::{JsonValue, json_type_name};
use jsonschema::error::ValidationErrorKind;
use jsonschema::paths::LocationSegment;
use serde_json::json;

use crate::resources::Kind;

/// One structural problem: a path relative to the document root and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaProblem {
    /// E.g. `spec.exports[0].name`.
    pub path: String,
    /// E.g. `spec.exports[0].name must be a string, got integer`.
    pub message: String,
}

fn object_ref() -> JsonValue {
    json!({"type": ["string", "object"]})
}

fn value_source() -> JsonValue {
    json!({
        "type": "object",
        "properties": {
            "value": {"type": "string"},
            "valueFrom": {
                "type": "object",
                "required": ["env"],
                "properties": {"env": {"type": "string", "minLength": 1}}
            }
        },
        "oneOf": [{"required": ["value"]}, {"required": ["valueFrom"]}]
    })
}

fn spec_schema(kind: Kind) -> JsonValue {
    match kind {
        Kind::Package => json!({
            "type": "object",
            "required": ["version"],
            "properties": {
                "version": {"type": "string", "minLength": 1},
                "description": {"type": "string"},
                "dependencies": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name", "version"],
                        "properties": {"name": {"type": "string", "minLength": 1}, "version": {"type": "string"}}
                    }
                }
            }
        }),
        Kind::Model => json!({
            "type": "object",
            "required": ["provider", "model"],
            "properties": {
                "provider": {"type": "string", "minLength": 1},
                "model": {"type": "string", "minLength": 1},
                "apiKey": value_source(),
                "endpoint": {"type": "string", "minLength": 1},
                "options": {"type": "object"},
                "capabilities": {"type": "object"}
            }
        }),
        Kind::Agent => json!({
            "type": "object",
            "required": ["modelConfig"],
            "properties": {
                "modelConfig": {
                    "type": "object",
                    "required": ["modelRef"],
                    "properties": {"modelRef": object_ref(), "params": {"type": "object"}}
                },
                "prompt": {
                    "type": "object",
                    "properties": {"system": {"type": "string"}, "systemRef": {"type": "string", "minLength": 1}}
                },
                "tools": {
                    "type": "array",
                    "items": {"type": ["string", "object"], "properties": {"config": {"type": "object"}}}
                },
                "extensions": {
                    "type": "array",
                    "items": {"type": ["string", "object"], "properties": {"config": {"type": "object"}}}
                },
                "requiredTools": {"type": "array", "items": {"type": "string", "minLength": 1}}
            }
        }),
        Kind::Swarm => json!({
            "type": "object",
            "required": ["entryAgent", "agents"],
            "properties": {
                "entryAgent": object_ref(),
                "agents": {"type": "array", "minItems": 1, "items": object_ref()},
                "instanceKey": {"type": "string", "minLength": 1},
                "policy": {
                    "type": "object",
                    "properties": {
                        "maxStepsPerTurn": {"type": "integer", "minimum": 1, "maximum": 4294967295_u64},
                        "lifecycle": {
                            "type": "object",
                            "properties": {
                                "ttlSeconds": {"type": "integer", "minimum": 0},
                                "gcGraceSeconds": {"type": "integer", "minimum": 0}
                            }
                        },
                        "shutdown": {
                            "type": "object",
                            "properties": {"gracePeriodSeconds": {"type": "integer", "minimum": 0}}
                        }
                    }
                }
            }
        }),
        Kind::Tool => json!({
            "type": "object",
            "required": ["entry", "exports"],
            "properties": {
                "entry": {"type": "string", "minLength": 1},
                "errorMessageLimit": {"type": "integer", "minimum": 1},
                "exports": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "description": {"type": "string"},
                            "parameters": {"type": "object"}
                        }
                    }
                }
            }
        }),
        Kind::Extension => json!({
            "type": "object",
            "required": ["entry"],
            "properties": {"entry": {"type": "string", "minLength": 1}, "config": {"type": "object"}}
        }),
        Kind::Connector => json!({
            "type": "object",
            "required": ["entry"],
            "properties": {
                "entry": {"type": "string", "minLength": 1},
                "events": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {"name": {"type": "string", "minLength": 1}, "properties": {"type": "object"}}
                    }
                }
            }
        }),
        Kind::Connection => json!({
            "type": "object",
            "required": ["connectorRef"],
            "properties": {
                "connectorRef": object_ref(),
                "swarmRef": object_ref(),
                "config": {"type": "object"},
                "secrets": {"type": "object"},
                "ingress": {"type": "object"}
            }
        }),
    }
}

/// The compiled schema of `kind`'s spec. Each kind's is compiled the first
/// time a document of that kind is checked, not all eight at once: an agent
/// process loads one bundle, which rarely has every kind, and compiling a
/// schema costs far more than checking a spec with it.
fn validator(kind: Kind) -> Option<&'static jsonschema::Validator> {
    static VALIDATORS: [OnceLock<Option<jsonschema::Validator>>; Kind::ALL.len()] =
        [const { OnceLock::new() }; Kind::ALL.len()];
    let index = Kind::ALL.iter().position(|k| *k == kind)?;
    VALIDATORS.get(index)?.get_or_init(|| jsonschema::validator_for(&spec_schema(kind)).ok()).as_ref()
}

/// Checks a document's `spec` against its kind's schema.
pub fn check_spec(kind: Kind, spec: &JsonValue) -> Vec<SchemaProblem> {
    let Some(validator) = validator(kind) else {
        return Vec::new();
    };
    if validator.is_valid(spec) {
        return Vec::new();
    }
    let mut problems = Vec::new();
    for error in validator.iter_errors(spec) {
        let mut path = String::from("spec");
        for segment in error.instance_path().segments() {
            match segment {
                LocationSegment::Property(name) => {
                    path.push('.');
                    path.push_str(&name);
                }
                LocationSegment::Index(index) => path.push_str(&format!("[{index}]")),
            }
        }
        let (path, message) = match error.kind() {
            ValidationErrorKind::Required { property } => {
                let property = property.as_str().map_or_else(|| property.to_string(), str::to_owned);
                let path = format!("{path}.{property}");
                let message = format!("{path} is required");
                (path, message)
            }
            ValidationErrorKind::Type { .. } => {
                let expected = type_names(&spec_schema(kind), error.schema_path().as_str())
                    .unwrap_or_else(|| "of another type".to_owned());
                let message = format!("{path} must be {expected}, got {}", json_type_name(error.instance()));
                (path, message)
            }
            ValidationErrorKind::MinItems { limit } => {
                let message = format!("{path} must have at least {limit} item{}", if *limit == 1 { "" } else { "s" });
                (path, message)
            }
            ValidationErrorKind::MinLength { .. } => {
                let message = format!("{path} must not be empty");
                (path, message)
            }
            ValidationErrorKind::Minimum { limit } => {
                let message = format!("{path} must be at least {limit}");
                (path, message)
            }
            ValidationErrorKind::OneOfNotValid { .. } | ValidationErrorKind::OneOfMultipleValid { .. } => {
                let message = format!("{path} must have exactly one of 'value' or 'valueFrom'");
                (path, message)
            }
            _ => {
                let message = format!("{path}: {error}");
                (path, message)
            }
        };
        problems.push(SchemaProblem { path, message });
    }
    problems
}

fn type_names(schema: &JsonValue, pointer: &str) -> Option<String> {
    let article = |name: &str| {
        if name.starts_with(['a', 'e', 'i', 'o', 'u']) { format!("an {name}") } else { format!("a {name}") }
    };
    match schema.pointer(pointer)? {
        JsonValue::String(name) => Some(article(name)),
        JsonValue::Array(names) => {
            let names: Vec<String> = names.iter().filter_map(JsonValue::as_str).map(article).collect();
            Some(names.join(" or "))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(kind: Kind, spec: JsonValue) -> Vec<String> {
        check_spec(kind, &spec).into_iter().map(|p| format!("{} | {}", p.path, p.message)).collect()
    }

    #[test]
    fn every_kind_schema_compiles() {
        for kind in Kind::ALL {
            assert!(validator(kind).is_some(), "{kind:?}");
        }
    }

    #[test]
    fn tool_schema_problems_have_paths() {
        assert_eq!(
            messages(Kind::Tool, json!({"exports": []})),
            ["spec.entry | spec.entry is required", "spec.exports | spec.exports must have at least 1 item",]
        );
        assert_eq!(
            messages(Kind::Tool, json!({"entry": "./x.ts", "exports": [{"name": 3}], "errorMessageLimit": 0})),
            [
                "spec.exports[0].name | spec.exports[0].name must be a string, got integer",
                "spec.errorMessageLimit | spec.errorMessageLimit must be at least 1",
            ]
        );
        assert!(messages(Kind::Tool, json!({"entry": "./x.ts", "exports": [{"name": "run"}]})).is_empty());
    }

    #[test]
    fn value_sources_need_exactly_one_form() {
        let base = |key: JsonValue| json!({"provider": "openai", "model": "gpt", "apiKey": key});
        assert!(messages(Kind::Model, base(json!({"value": "k"}))).is_empty());
        assert!(messages(Kind::Model, base(json!({"valueFrom": {"env": "OPENAI_API_KEY"}}))).is_empty());
        assert_eq!(
            messages(Kind::Model, base(json!({}))),
            ["spec.apiKey | spec.apiKey must have exactly one of 'value' or 'valueFrom'"]
        );
    }

    #[test]
    fn refs_accept_strings_and_objects() {
        assert_eq!(
            messages(Kind::Swarm, json!({"entryAgent": 5, "agents": ["Agent/a"]})),
            ["spec.entryAgent | spec.entryAgent must be a string or an object, got integer"]
        );
    }
}
