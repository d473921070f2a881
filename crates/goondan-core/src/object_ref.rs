//! References between resources (`ObjectRef`) in the four accepted forms.

use std::fmt;

use serde::{Serialize, Serializer};

use crate::JsonValue;

/// A reference to a resource: kind, name, and optionally the package and
/// apiVersion it lives in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectRef {
    /// The resource kind, e.g. `Tool`.
    pub kind: String,
    /// The resource name, e.g. `bash`.
    pub name: String,
    /// The package that holds the resource; `None` means the referrer's own.
    pub package: Option<String>,
    /// An explicit apiVersion, when the reference names one.
    pub api_version: Option<String>,
}

/// Why a value is not a usable reference.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectRefError {
    /// A string reference is not `Kind/name` with exactly one `/` inside.
    #[error(
        "reference string '{0}' must have the form 'Kind/name' with exactly one '/' that is neither first nor last"
    )]
    BadString(String),
    /// A field is missing or not a non-empty string.
    #[error("reference field '{0}' must be a non-empty string")]
    BadField(&'static str),
    /// The value is neither a string nor an object.
    #[error("a reference must be a string like 'Tool/bash' or an object with 'kind' and 'name', got {0}")]
    BadShape(&'static str),
}

impl ObjectRef {
    /// A reference to `kind/name` in the referrer's own package.
    pub fn new(kind: impl Into<String>, name: impl Into<String>) -> Self {
        Self { kind: kind.into(), name: name.into(), package: None, api_version: None }
    }

    /// Sets the package.
    #[must_use]
    pub fn in_package(mut self, package: impl Into<String>) -> Self {
        self.package = Some(package.into());
        self
    }

    /// Parses `Kind/name`.
    pub fn parse_str(text: &str) -> Result<Self, ObjectRefError> {
        let mut parts = text.split('/');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(kind), Some(name), None) if !kind.is_empty() && !name.is_empty() => Ok(Self::new(kind, name)),
            _ => Err(ObjectRefError::BadString(text.to_owned())),
        }
    }

    /// Parses any of the four forms: `"Tool/bash"`, `{kind, name, package?,
    /// apiVersion?}`, `{ref: "Tool/bash"}`, `{ref: {kind, name, package?}}`.
    pub fn parse(value: &JsonValue) -> Result<Self, ObjectRefError> {
        match value {
            JsonValue::String(text) => Self::parse_str(text),
            JsonValue::Object(map) => {
                if let Some(inner) = map.get("ref") {
                    return match inner {
                        JsonValue::String(text) => Self::parse_str(text),
                        JsonValue::Object(_) => Self::parse(inner),
                        other => Err(ObjectRefError::BadShape(json_type_name(other))),
                    };
                }
                let kind = required_string(map.get("kind"), "kind")?;
                let name = required_string(map.get("name"), "name")?;
                let package = optional_string(map.get("package"), "package")?;
                let api_version = optional_string(map.get("apiVersion"), "apiVersion")?;
                Ok(Self { kind, name, package, api_version })
            }
            other => Err(ObjectRefError::BadShape(json_type_name(other))),
        }
    }
}

fn required_string(value: Option<&JsonValue>, field: &'static str) -> Result<String, ObjectRefError> {
    match value {
        Some(JsonValue::String(text)) if !text.is_empty() => Ok(text.clone()),
        _ => Err(ObjectRefError::BadField(field)),
    }
}

fn optional_string(value: Option<&JsonValue>, field: &'static str) -> Result<Option<String>, ObjectRefError> {
    match value {
        None | Some(JsonValue::Null) => Ok(None),
        Some(JsonValue::String(text)) if !text.is_empty() => Ok(Some(text.clone())),
        Some(_) => Err(ObjectRefError::BadField(field)),
    }
}

/// The JSON type of a value, as JSON Schema names it (`integer` for whole numbers).
pub fn json_type_name(value: &JsonValue) -> &'static str {
    match value {
        JsonValue::Null => "null",
        JsonValue::Bool(_) => "boolean",
        JsonValue::Number(n) if n.is_i64() || n.is_u64() => "integer",
        JsonValue::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0 && f.is_finite()) => "integer",
        JsonValue::Number(_) => "number",
        JsonValue::String(_) => "string",
        JsonValue::Array(_) => "array",
        JsonValue::Object(_) => "object",
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind, self.name)?;
        if let Some(package) = &self.package {
            write!(f, " (package {package})")?;
        }
        Ok(())
    }
}

impl Serialize for ObjectRef {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let len = 2 + usize::from(self.package.is_some()) + usize::from(self.api_version.is_some());
        let mut map = serializer.serialize_map(Some(len))?;
        if let Some(api_version) = &self.api_version {
            map.serialize_entry("apiVersion", api_version)?;
        }
        map.serialize_entry("kind", &self.kind)?;
        map.serialize_entry("name", &self.name)?;
        if let Some(package) = &self.package {
            map.serialize_entry("package", package)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn parses_all_four_forms() {
        let expected = ObjectRef::new("Tool", "bash");
        assert_eq!(ObjectRef::parse(&json!("Tool/bash")), Ok(expected.clone()));
        assert_eq!(ObjectRef::parse(&json!({"kind": "Tool", "name": "bash"})), Ok(expected.clone()));
        assert_eq!(ObjectRef::parse(&json!({"ref": "Tool/bash"})), Ok(expected.clone()));
        assert_eq!(
            ObjectRef::parse(&json!({"ref": {"kind": "Tool", "name": "bash", "package": "@goondan/base"}})),
            Ok(expected.clone().in_package("@goondan/base"))
        );
        let with_version = ObjectRef::parse(&json!({"kind": "Tool", "name": "bash", "apiVersion": "goondan.ai/v1"}));
        assert_eq!(with_version.map(|r| r.api_version), Ok(Some("goondan.ai/v1".to_owned())));
    }

    #[test]
    fn rejects_bad_strings() {
        for bad in ["Tool", "/bash", "Tool/", "Tool/bash/x", "", "/"] {
            assert_eq!(ObjectRef::parse(&json!(bad)), Err(ObjectRefError::BadString(bad.to_owned())), "{bad}");
        }
    }

    #[test]
    fn rejects_bad_objects() {
        assert_eq!(ObjectRef::parse(&json!({"name": "bash"})), Err(ObjectRefError::BadField("kind")));
        assert_eq!(ObjectRef::parse(&json!({"kind": "Tool", "name": ""})), Err(ObjectRefError::BadField("name")));
        assert_eq!(
            ObjectRef::parse(&json!({"kind": "Tool", "name": "x", "package": 3})),
            Err(ObjectRefError::BadField("package"))
        );
        assert_eq!(ObjectRef::parse(&json!(42)), Err(ObjectRefError::BadShape("integer")));
        assert_eq!(ObjectRef::parse(&json!({"ref": 1.5})), Err(ObjectRefError::BadShape("number")));
    }

    #[test]
    fn displays_and_serializes() {
        let r = ObjectRef::new("Tool", "bash").in_package("@goondan/base");
        assert_eq!(r.to_string(), "Tool/bash (package @goondan/base)");
        assert_eq!(
            serde_json::to_value(&r).ok(),
            Some(json!({"kind": "Tool", "name": "bash", "package": "@goondan/base"}))
        );
    }
}
