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

use crate::resources::{Kind, SandboxPolicy};

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
                "properties": {
                    "env": {"type": "string", "minLength": 1},
                    "secretRef": {
                        "type": "object",
                        "required": ["ref"],
                        "properties": {
                            "ref": {"type": "string", "pattern": "^\\s*Secret/[^/]*[^/\\s][^/]*$"},
                            "key": {"type": "string", "minLength": 1}
                        }
                    }
                },
                "oneOf": [{"required": ["env"]}, {"required": ["secretRef"]}]
            }
        },
        "oneOf": [{"required": ["value"]}, {"required": ["valueFrom"]}]
    })
}

/// `spec.sandbox` of an Agent or a Swarm. Its problems are reported by
/// `validate::check_sandbox` with codes of their own (E_CONFIG_SANDBOX_*),
/// not as schema problems; the schema says what a valid one is.
fn sandbox() -> JsonValue {
    let policies: Vec<&str> = SandboxPolicy::ALL.iter().map(|policy| policy.as_str()).collect();
    let paths = json!({"type": "array", "items": {"type": "string", "minLength": 1}});
    json!({
        "type": "object",
        "properties": {
            "policy": {"type": "string", "enum": policies},
            "readable": paths,
            "writable": paths,
            "network": {
                "type": "object",
                "properties": {"allow": {"type": "array", "items": {"type": "string", "minLength": 1}}}
            },
            "limits": {
                "type": "object",
                "properties": {
                    "processes": {"type": ["integer", "string"]},
                    "fileSize": {"type": ["integer", "string"]},
                    "memory": {"type": ["integer", "string"]}
                }
            }
        }
    })
}

/// `spec.placement` of an Agent. Its problems are reported by
/// `validate::check_placement` as E_CONFIG_PLACEMENT_INVALID, not as schema
/// problems; an unknown key under it is a W_CONFIG_UNKNOWN_KEY warning, as
/// elsewhere. `hostLabels` is a free-form mapping here (its names are the
/// user's): validate checks its names and values.
fn placement() -> JsonValue {
    json!({
        "type": "object",
        "properties": {"hostLabels": {"type": "object"}}
    })
}

/// `spec.pricing` of a Model: USD per million tokens of each kind.
fn pricing() -> JsonValue {
    let price = json!({"type": "number", "minimum": 0});
    json!({
        "type": "object",
        "required": ["input", "output"],
        "properties": {
            "input": price,
            "output": price,
            "cacheRead": price,
            "cacheWrite": price,
            "reasoning": price
        }
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
                "capabilities": {"type": "object"},
                "pricing": pricing()
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
                "requiredTools": {"type": "array", "items": {"type": "string", "minLength": 1}},
                "policy": {
                    "type": "object",
                    "properties": {"toolCallScope": {"type": "string", "enum": ["catalog", "registry"]}}
                },
                "sandbox": sandbox(),
                "placement": placement()
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
                                // Positive, as the original's spec says: 0 would
                                // expire every instance the moment it idles.
                                "ttlSeconds": {"type": "integer", "minimum": 1},
                                "gcGraceSeconds": {"type": "integer", "minimum": 0}
                            }
                        },
                        "shutdown": {
                            "type": "object",
                            "properties": {"gracePeriodSeconds": {"type": "integer", "minimum": 0}}
                        }
                    }
                },
                "sandbox": sandbox()
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

/// The JSON Schema of `kind`'s `spec`, as the loader checks it.
pub fn kind_spec_schema(kind: Kind) -> JsonValue {
    spec_schema(kind)
}

/// The JSON Schema (draft 7) of one document of a bundle, every kind's
/// `spec` checked by its `kind`: what `gdn schema` prints for editors
/// (`# yaml-language-server: $schema=…`, which applies it to each document
/// of a file). Names and references are checked further by the loader.
pub fn document_schema() -> JsonValue {
    let kinds: Vec<&str> = Kind::ALL.iter().map(|kind| kind.as_str()).collect();
    let by_kind: Vec<JsonValue> = Kind::ALL
        .iter()
        .map(|kind| {
            json!({
                "if": {"properties": {"kind": {"const": kind.as_str()}}, "required": ["kind"]},
                "then": {"properties": {"spec": spec_schema(*kind)}}
            })
        })
        .collect();
    json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": "https://goondan.ai/schemas/v1/resource.json",
        "title": "A Goondan resource (goondan.yaml)",
        "type": "object",
        "required": ["apiVersion", "kind", "metadata"],
        "properties": {
            "apiVersion": {"const": goondan_core::API_VERSION, "description": "The resource API version."},
            "kind": {"enum": kinds, "description": "The resource's kind."},
            "metadata": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "annotations": {"type": "object"}
                }
            },
            "spec": {"type": "object"}
        },
        "allOf": by_kind
    })
}

/// Compiles `kind`'s spec schema under draft 7.
///
/// `jsonschema` checks every schema against its draft's meta-schema before
/// compiling it, and the first such check in a process builds a validator
/// for that meta-schema: ~6 million instructions (~1 ms) for draft 2020-12
/// (seven vocabulary documents, dynamic references), ~1.7 million for
/// draft 7. These schemas are ours and use only `type`, `required`,
/// `properties`, `items`, `minLength`, `minItems`, `minimum`, `maximum`,
/// `enum`, `oneOf` and `pattern`, which mean the same in both drafts and report the same errors
/// (`spec_errors_are_the_same_under_draft_2020_12` checks). Tool parameter
/// schemas, which are the user's, are still checked under 2020-12.
///
/// `draft7::new` rather than `options().with_draft(..).build(..)`: the
/// builder is generic, and calling it from this crate would compile a
/// second copy of jsonschema's compiler into the binary (~1.2 MB).
fn compile(kind: Kind) -> Option<jsonschema::Validator> {
    jsonschema::draft7::new(cached_spec_schema(kind)?).ok()
}

/// The compiled schema of `kind`'s spec. Each kind's is compiled the first
/// time a document of that kind is checked, not all eight at once: an agent
/// process loads one bundle, which rarely has every kind, and compiling a
/// schema costs far more than checking a spec with it.
fn validator(kind: Kind) -> Option<&'static jsonschema::Validator> {
    static VALIDATORS: [OnceLock<Option<jsonschema::Validator>>; Kind::ALL.len()] =
        [const { OnceLock::new() }; Kind::ALL.len()];
    let index = Kind::ALL.iter().position(|k| *k == kind)?;
    VALIDATORS.get(index)?.get_or_init(|| compile(kind)).as_ref()
}

/// `kind`'s spec schema as JSON, built once.
fn cached_spec_schema(kind: Kind) -> Option<&'static JsonValue> {
    static SCHEMAS: [OnceLock<JsonValue>; Kind::ALL.len()] = [const { OnceLock::new() }; Kind::ALL.len()];
    let index = Kind::ALL.iter().position(|k| *k == kind)?;
    Some(SCHEMAS.get(index)?.get_or_init(|| spec_schema(kind)))
}

/// Whether `instance` satisfies `schema`, reading the schema's keywords
/// directly: `Some(answer)` when the answer is certain, `None` when it is
/// not (a keyword this does not evaluate, a fractional number where an
/// integer or a bound is involved).
///
/// Why: a valid spec produces no diagnostic, and proving that with
/// `jsonschema` means compiling the kind's schema first, ~40 % of the
/// first load of a small bundle in a fresh process (meta-schema validator
/// included). These schemas use a handful of keywords, evaluated here
/// exactly as JSON Schema defines them; only a spec this does not find
/// certainly valid goes to `jsonschema`, which reports every problem with
/// its path as before. `spec_verdicts_agree_with_jsonschema` checks the
/// answers against `jsonschema` on generated specs.
fn evaluate(schema: &JsonValue, instance: &JsonValue) -> Option<bool> {
    let JsonValue::Object(schema) = schema else { return None };
    let mut verdict = Some(true);
    for (keyword, value) in schema {
        let this = match keyword.as_str() {
            "type" => match value {
                JsonValue::String(name) => has_type(instance, name),
                JsonValue::Array(names) => {
                    let mut any = Some(false);
                    for name in names {
                        match name.as_str().and_then(|name| has_type(instance, name)) {
                            Some(true) => {
                                any = Some(true);
                                break;
                            }
                            Some(false) => {}
                            None => any = None,
                        }
                    }
                    any
                }
                _ => None,
            },
            "required" => match instance {
                JsonValue::Object(map) => value.as_array().and_then(|names| {
                    names.iter().try_fold(true, |all, name| name.as_str().map(|name| all && map.contains_key(name)))
                }),
                _ => Some(true),
            },
            "properties" => match (instance, value) {
                (JsonValue::Object(map), JsonValue::Object(properties)) => {
                    all(properties.iter().filter_map(|(name, sub)| map.get(name).map(|v| evaluate(sub, v))))
                }
                (_, JsonValue::Object(_)) => Some(true),
                _ => None,
            },
            "items" => match instance {
                JsonValue::Array(items) => all(items.iter().map(|item| evaluate(value, item))),
                _ => Some(true),
            },
            "minItems" => match instance {
                JsonValue::Array(items) => value.as_u64().map(|min| items.len() as u64 >= min),
                _ => Some(true),
            },
            "minLength" => match instance {
                // JSON Schema counts characters (code points), not bytes.
                JsonValue::String(text) => value.as_u64().map(|min| text.chars().count() as u64 >= min),
                _ => Some(true),
            },
            // Numbers compare by value in JSON Schema (1 == 1.0), not as
            // serde_json compares them: left to jsonschema unless equal.
            "enum" => value.as_array().and_then(|allowed| match allowed.contains(instance) {
                true => Some(true),
                false if instance.is_number() => None,
                false => Some(false),
            }),
            "minimum" => compare(instance, value, |n, limit| n >= limit),
            "maximum" => compare(instance, value, |n, limit| n <= limit),
            "oneOf" => value.as_array().and_then(|branches| {
                let mut valid = 0;
                for branch in branches {
                    valid += usize::from(evaluate(branch, instance)?);
                }
                Some(valid == 1)
            }),
            _ => None,
        };
        match this {
            Some(true) => {}
            Some(false) => return Some(false),
            None => verdict = None,
        }
    }
    verdict
}

/// Every verdict true: `Some(true)`; any false: `Some(false)`; else `None`.
fn all(verdicts: impl Iterator<Item = Option<bool>>) -> Option<bool> {
    let mut all = Some(true);
    for verdict in verdicts {
        match verdict {
            Some(true) => {}
            Some(false) => return Some(false),
            None => all = None,
        }
    }
    all
}

fn has_type(instance: &JsonValue, name: &str) -> Option<bool> {
    Some(match name {
        "object" => instance.is_object(),
        "array" => instance.is_array(),
        "string" => instance.is_string(),
        "boolean" => instance.is_boolean(),
        "null" => instance.is_null(),
        "number" => instance.is_number(),
        // 1.0 is an integer to JSON Schema; fractional-looking numbers are
        // left to jsonschema rather than judged here.
        "integer" => match instance {
            JsonValue::Number(n) if n.is_f64() => return None,
            JsonValue::Number(_) => true,
            _ => false,
        },
        _ => return None,
    })
}

/// `holds(instance, limit)` for integers; numbers only (other types pass
/// `minimum`/`maximum`). A float (a price) is decided against an integer
/// limit that a float holds exactly (|limit| ≤ 2^53), where comparing as
/// floats is exact; other floats are left undecided.
fn compare(instance: &JsonValue, limit: &JsonValue, holds: fn(i128, i128) -> bool) -> Option<bool> {
    let as_int = |n: &serde_json::Number| n.as_i64().map(i128::from).or_else(|| n.as_u64().map(i128::from));
    match (instance, limit) {
        (JsonValue::Number(n), JsonValue::Number(limit)) => match (as_int(n), as_int(limit)) {
            (Some(n), Some(limit)) => Some(holds(n, limit)),
            (None, Some(limit)) if limit.unsigned_abs() <= 1 << 53 => {
                let n = n.as_f64()?;
                // The float's side of the limit, as the integers' `holds` sees it.
                let ordering = n.partial_cmp(&(limit as f64))?;
                Some(holds(ordering as i128, 0))
            }
            _ => None,
        },
        (JsonValue::Number(_), _) => None,
        _ => Some(true),
    }
}

/// A key the schema does not know: ignored by the runtime, so reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownKey {
    /// E.g. `spec.provder`.
    pub path: String,
    /// The key.
    pub key: String,
    /// The keys known at that place.
    pub known: Vec<String>,
}

/// The keys of `spec` (at any depth where the schema lists every field of
/// an object) that its kind's schema does not know. Free-form objects
/// (`options`, `config`, `parameters`, …) and references are not looked
/// into.
pub fn unknown_keys(kind: Kind, spec: &JsonValue) -> Vec<UnknownKey> {
    let mut found = Vec::new();
    if let Some(schema) = cached_spec_schema(kind) {
        walk_keys(schema, spec, "spec", &mut found);
    }
    found
}

fn walk_keys(schema: &JsonValue, instance: &JsonValue, path: &str, found: &mut Vec<UnknownKey>) {
    let closed_object = schema.get("type").and_then(JsonValue::as_str) == Some("object");
    match instance {
        JsonValue::Object(map) if closed_object => {
            let Some(properties) = schema.get("properties").and_then(JsonValue::as_object) else { return };
            for (key, value) in map {
                match properties.get(key) {
                    Some(inner) => walk_keys(inner, value, &format!("{path}.{key}"), found),
                    None => found.push(UnknownKey {
                        path: format!("{path}.{key}"),
                        key: key.clone(),
                        known: properties.keys().cloned().collect(),
                    }),
                }
            }
        }
        JsonValue::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (index, item) in items.iter().enumerate() {
                    walk_keys(item_schema, item, &format!("{path}[{index}]"), found);
                }
            }
        }
        _ => {}
    }
}

/// The known key closest to `key` (a typo's likely intent), if close enough.
pub use goondan_core::naming::closest;

/// Checks a document's `spec` against its kind's schema.
pub fn check_spec(kind: Kind, spec: &JsonValue) -> Vec<SchemaProblem> {
    if cached_spec_schema(kind).and_then(|schema| evaluate(schema, spec)) == Some(true) {
        return Vec::new();
    }
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
            ValidationErrorKind::Enum { options } => {
                let allowed: Vec<String> = options.as_array().into_iter().flatten().map(JsonValue::to_string).collect();
                let message = format!("{path} must be one of {}, got {}", allowed.join(", "), error.instance());
                (path, message)
            }
            ValidationErrorKind::Pattern { .. } if path.ends_with("secretRef.ref") => {
                let message = format!("{path} must be Secret/<name>, got {}", error.instance());
                (path, message)
            }
            ValidationErrorKind::OneOfNotValid { .. } | ValidationErrorKind::OneOfMultipleValid { .. } => {
                let (one, other) =
                    if path.ends_with("valueFrom") { ("env", "secretRef") } else { ("value", "valueFrom") };
                let message = format!("{path} must have exactly one of '{one}' or '{other}'");
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

    #[test]
    fn unknown_keys_are_found_where_the_schema_lists_every_field() {
        let spec = json!({
            "provder": "openai", "model": "m", "options": {"anything": 1},
            "apiKey": {"valueFrom": {"env": "K", "default": "x"}}
        });
        let found: Vec<String> = unknown_keys(Kind::Model, &spec).into_iter().map(|u| u.path).collect();
        assert_eq!(found, ["spec.provder", "spec.apiKey.valueFrom.default"]);
        let agent = json!({"modelConfig": {"modelRef": "Model/m", "tools": ["Tool/bash"]},
                           "tools": [{"kind": "Tool", "name": "bash", "package": "@goondan/base", "config": {}}]});
        let found: Vec<String> = unknown_keys(Kind::Agent, &agent).into_iter().map(|u| u.path).collect();
        assert_eq!(found, ["spec.modelConfig.tools"], "a misplaced block is found; references are not looked into");
    }

    use super::*;

    fn messages(kind: Kind, spec: JsonValue) -> Vec<String> {
        check_spec(kind, &spec).into_iter().map(|p| format!("{} | {}", p.path, p.message)).collect()
    }

    /// Every error of `spec` under `validator`: instance path, schema path,
    /// and message.
    fn rendered(validator: &jsonschema::Validator, spec: &JsonValue) -> Vec<String> {
        validator
            .iter_errors(spec)
            .map(|e| format!("{} | {} | {e}", e.instance_path().as_str(), e.schema_path().as_str()))
            .collect()
    }

    /// A small deterministic generator (xorshift64*), so the test needs no
    /// extra crate and fails the same way every run.
    struct Rng(u64);

    impl Rng {
        fn below(&mut self, n: usize) -> usize {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
        }

        fn chance(&mut self, percent: usize) -> bool {
            self.below(100) < percent
        }

        fn pick(&mut self, values: &[JsonValue]) -> JsonValue {
            values[self.below(values.len())].clone()
        }
    }

    /// Near misses of every rule the schemas have: empty strings, zero and
    /// negative numbers, 1.0 (an integer since draft 6), 1.5, 2^32.
    fn leaf(rng: &mut Rng) -> JsonValue {
        rng.pick(&[
            json!(null),
            json!(true),
            json!(-1),
            json!(0),
            json!(1),
            json!(1.0),
            json!(1.5),
            json!(4_294_967_295_u64),
            json!(4_294_967_296_u64),
            json!(""),
            json!("x"),
            json!([]),
            json!({}),
        ])
    }

    /// A value shaped by `schema`, with a wrong value here and there.
    fn instance(schema: &JsonValue, rng: &mut Rng, depth: usize) -> JsonValue {
        if depth > 6 || rng.chance(8) {
            return leaf(rng);
        }
        let types: Vec<&str> = match schema.get("type") {
            Some(JsonValue::String(t)) => vec![t.as_str()],
            Some(JsonValue::Array(ts)) => ts.iter().filter_map(JsonValue::as_str).collect(),
            _ => vec!["object"],
        };
        match types[rng.below(types.len())] {
            "object" => {
                let mut map = serde_json::Map::new();
                for (key, sub) in schema.get("properties").and_then(JsonValue::as_object).into_iter().flatten() {
                    if rng.chance(75) {
                        map.insert(key.clone(), instance(sub, rng, depth + 1));
                    }
                }
                if rng.chance(10) {
                    map.insert("extra".to_owned(), leaf(rng));
                }
                JsonValue::Object(map)
            }
            "array" => {
                let items = schema.get("items").cloned().unwrap_or(json!({}));
                JsonValue::Array((0..rng.below(4)).map(|_| instance(&items, rng, depth + 1)).collect())
            }
            "string" => match schema.get("enum").and_then(JsonValue::as_array) {
                Some(allowed) if rng.chance(70) => rng.pick(allowed),
                _ => rng.pick(&[json!(""), json!("x"), json!("Agent/a")]),
            },
            _ => rng.pick(&[json!(-1), json!(0), json!(1), json!(1.0), json!(2), json!(1.5), json!(4_294_967_296_u64)]),
        }
    }

    #[test]
    fn spec_errors_are_the_same_under_draft_2020_12() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for kind in Kind::ALL {
            let Some(ours) = validator(kind) else { panic!("{kind:?} does not compile") };
            let reference = jsonschema::validator_for(&spec_schema(kind)).unwrap_or_else(|e| panic!("{e}"));
            let (mut valid, mut invalid) = (0, 0);
            for _ in 0..5_000 {
                let spec = instance(&spec_schema(kind), &mut rng, 0);
                assert_eq!(rendered(ours, &spec), rendered(&reference, &spec), "{kind:?}: {spec}");
                if reference.is_valid(&spec) { valid += 1 } else { invalid += 1 }
            }
            // Both outcomes were exercised.
            assert!(valid > 100 && invalid > 100, "{kind:?}: {valid} valid, {invalid} invalid");
        }
    }

    #[test]
    fn spec_verdicts_agree_with_jsonschema() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for kind in Kind::ALL {
            let schema = spec_schema(kind);
            let reference = jsonschema::validator_for(&schema).unwrap_or_else(|e| panic!("{e}"));
            // How many specs jsonschema finds valid, and how many of those
            // this decides, so the test shows the shortcut is taken.
            let (mut valid, mut decided_valid, mut decided_invalid) = (0, 0, 0);
            for _ in 0..20_000 {
                let spec = instance(&schema, &mut rng, 0);
                let expected = reference.is_valid(&spec);
                valid += usize::from(expected);
                if let Some(verdict) = evaluate(&schema, &spec) {
                    assert_eq!(verdict, expected, "{kind:?}: {spec}");
                    if verdict { decided_valid += 1 } else { decided_invalid += 1 }
                }
            }
            assert!(decided_valid > 300 && decided_valid * 10 >= valid * 7, "{kind:?}: {decided_valid} of {valid}");
            assert!(decided_invalid > 1_000, "{kind:?}: {decided_invalid}");
        }
    }

    #[test]
    fn the_examples_specs_are_decided_valid() {
        let text = include_str!("../../../examples/quickstart/goondan.yaml");
        for document in crate::yaml::parse_documents(text).unwrap_or_else(|e| panic!("{e:?}")) {
            let kind = document.value.get("kind").and_then(JsonValue::as_str).and_then(Kind::parse);
            let (Some(kind), Some(spec)) = (kind, document.value.get("spec")) else { panic!("{:?}", document.value) };
            assert_eq!(cached_spec_schema(kind).and_then(|schema| evaluate(schema, spec)), Some(true), "{kind:?}");
        }
    }

    #[test]
    fn every_kind_schema_compiles() {
        for kind in Kind::ALL {
            assert!(validator(kind).is_some(), "{kind:?}");
            // Valid under the draft bundles' parameter schemas use too.
            assert!(jsonschema::validator_for(&spec_schema(kind)).is_ok(), "{kind:?}");
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
        let secret = |reference: &str| json!({"valueFrom": {"secretRef": {"ref": reference, "key": "api_key"}}});
        assert!(messages(Kind::Model, base(secret("Secret/openai"))).is_empty());
        assert_eq!(
            messages(Kind::Model, base(json!({}))),
            ["spec.apiKey | spec.apiKey must have exactly one of 'value' or 'valueFrom'"]
        );
        assert_eq!(
            messages(Kind::Model, base(json!({"valueFrom": {"env": "K", "secretRef": {"ref": "Secret/s"}}}))),
            ["spec.apiKey.valueFrom | spec.apiKey.valueFrom must have exactly one of 'env' or 'secretRef'"]
        );
        for bad in ["openai", "Secret/", "Secret/a/b", "Secret/ "] {
            let found = messages(Kind::Model, base(secret(bad)));
            assert_eq!(found.len(), 1, "{bad}: {found:?}");
            assert!(found[0].starts_with("spec.apiKey.valueFrom.secretRef.ref |"), "{bad}: {found:?}");
        }
    }

    #[test]
    fn prices_are_non_negative_numbers_with_input_and_output() {
        let model = |pricing: JsonValue| json!({"provider": "openai", "model": "gpt", "pricing": pricing});
        assert!(messages(Kind::Model, model(json!({"input": 2, "output": 8.5, "cacheRead": 0.5}))).is_empty());
        assert_eq!(
            messages(Kind::Model, model(json!({"input": "2$", "output": -1}))),
            [
                "spec.pricing.input | spec.pricing.input must be a number, got string",
                "spec.pricing.output | spec.pricing.output must be at least 0",
            ]
        );
        assert_eq!(
            messages(Kind::Model, model(json!({"output": 1}))),
            ["spec.pricing.input | spec.pricing.input is required"]
        );
        let found: Vec<String> = unknown_keys(Kind::Model, &model(json!({"input": 1, "output": 1, "cached": 1})))
            .into_iter()
            .map(|u| u.path)
            .collect();
        assert_eq!(found, ["spec.pricing.cached"]);
    }

    #[test]
    fn refs_accept_strings_and_objects() {
        assert_eq!(
            messages(Kind::Swarm, json!({"entryAgent": 5, "agents": ["Agent/a"]})),
            ["spec.entryAgent | spec.entryAgent must be a string or an object, got integer"]
        );
    }

    #[test]
    fn the_document_schema_accepts_the_examples_and_refuses_what_the_loader_refuses() {
        let schema = document_schema();
        let validator = jsonschema::draft7::new(&schema).unwrap_or_else(|e| panic!("{e}"));
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");
        let mut checked = 0;
        for example in std::fs::read_dir(root).unwrap_or_else(|e| panic!("{e}")).flatten() {
            let Ok(text) = std::fs::read_to_string(example.path().join("goondan.yaml")) else { continue };
            let documents = crate::yaml::parse_documents(&text).unwrap_or_else(|e| panic!("{e:?}"));
            for document in documents {
                let errors: Vec<String> = validator.iter_errors(&document.value).map(|e| e.to_string()).collect();
                assert!(errors.is_empty(), "{}: {errors:?}", example.path().display());
                checked += 1;
            }
        }
        assert!(checked > 5, "the examples were read: {checked}");
        let model = |spec: JsonValue| json!({"apiVersion": "goondan.ai/v1", "kind": "Model", "metadata": {"name": "m"}, "spec": spec});
        assert!(validator.is_valid(&model(json!({"provider": "openai", "model": "gpt"}))));
        for bad in [
            model(json!({"model": "gpt"})),
            model(json!({"provider": "openai", "model": "gpt", "apiKey": {}})),
            json!({"apiVersion": "goondan.ai/v2", "kind": "Model", "metadata": {"name": "m"}}),
            json!({"apiVersion": "goondan.ai/v1", "kind": "Robot", "metadata": {"name": "m"}}),
            json!({"apiVersion": "goondan.ai/v1", "kind": "Tool", "metadata": {}}),
        ] {
            assert!(!validator.is_valid(&bad), "{bad}");
        }
    }
}
