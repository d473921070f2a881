//! Reading an extension's merged config: typed fields with defaults, and a
//! structured `E_EXT_INIT` error naming the field for anything else.
//!
//! A field set to `null` counts as absent, as the original's `config.x ??
//! default` treats it.

use goondan_core::{JsonValue, json_type_name};
use goondan_runtime::extension::{AgentExtension, ExtensionError};

/// The code of a config an extension cannot start with.
pub(crate) const E_EXT_INIT: &str = "E_EXT_INIT";

/// A config error naming `field` (`config.<field>: <problem>`).
pub(crate) fn init_error(extension: &AgentExtension, field: &str, problem: impl std::fmt::Display) -> ExtensionError {
    ExtensionError::new(&extension.name, E_EXT_INIT, format!("config.{field}: {problem}"))
}

fn field<'a>(extension: &'a AgentExtension, name: &str) -> Option<&'a JsonValue> {
    extension.config.get(name).filter(|value| !value.is_null())
}

/// A boolean field.
pub(crate) fn bool_or(extension: &AgentExtension, name: &str, default: bool) -> Result<bool, ExtensionError> {
    match field(extension, name) {
        None => Ok(default),
        Some(JsonValue::Bool(value)) => Ok(*value),
        Some(other) => {
            Err(init_error(extension, name, format!("must be true or false, got {}", json_type_name(other))))
        }
    }
}

/// A string field.
pub(crate) fn string<'a>(extension: &'a AgentExtension, name: &str) -> Result<Option<&'a str>, ExtensionError> {
    match field(extension, name) {
        None => Ok(None),
        Some(JsonValue::String(value)) => Ok(Some(value)),
        Some(other) => Err(init_error(extension, name, format!("must be a string, got {}", json_type_name(other)))),
    }
}

/// A whole-number field of at least `min` (a float with no fraction counts).
pub(crate) fn count_or(extension: &AgentExtension, name: &str, default: u64, min: u64) -> Result<u64, ExtensionError> {
    let Some(value) = field(extension, name) else { return Ok(default) };
    let number = value.as_u64().or_else(|| value.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0).map(|f| f as u64));
    match number {
        Some(number) if number >= min => Ok(number),
        _ => Err(init_error(extension, name, format!("must be a whole number of at least {min}, got {value}"))),
    }
}

/// A list of non-empty strings (trimmed).
pub(crate) fn string_list(extension: &AgentExtension, name: &str) -> Result<Vec<String>, ExtensionError> {
    let Some(value) = field(extension, name) else { return Ok(Vec::new()) };
    let JsonValue::Array(items) = value else {
        return Err(init_error(extension, name, format!("must be a list of strings, got {}", json_type_name(value))));
    };
    let mut names = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        match item.as_str().map(str::trim) {
            Some(text) if !text.is_empty() => {
                if !names.iter().any(|known| known == text) {
                    names.push(text.to_owned());
                }
            }
            _ => return Err(init_error(extension, &format!("{name}[{index}]"), "must be a non-empty string")),
        }
    }
    Ok(names)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use goondan_config::PackageScope;
    use goondan_core::JsonObject;

    use super::*;

    /// A base extension named `name` with `config`.
    pub(crate) fn extension(name: &str, config: JsonValue) -> AgentExtension {
        let config = match config {
            JsonValue::Object(map) => map,
            _ => JsonObject::new(),
        };
        AgentExtension { name: name.to_owned(), scope: PackageScope::Base, entry: Arc::from(Path::new("x.ts")), config }
    }

    #[test]
    fn fields_read_with_defaults_and_refuse_wrong_types_naming_the_field() {
        let ext = extension(
            "x",
            serde_json::json!({"b": true, "n": 3.0, "s": "hi", "l": [" a ", "b", "a"], "nul": null, "bad": "3"}),
        );
        assert_eq!(bool_or(&ext, "b", false), Ok(true));
        assert_eq!(bool_or(&ext, "nul", true), Ok(true));
        assert_eq!(count_or(&ext, "n", 1, 1), Ok(3));
        assert_eq!(count_or(&ext, "missing", 7, 1), Ok(7));
        assert_eq!(string(&ext, "s"), Ok(Some("hi")));
        assert_eq!(string_list(&ext, "l"), Ok(vec!["a".to_owned(), "b".to_owned()]));
        let error = count_or(&ext, "bad", 1, 1).err().unwrap_or_else(|| panic!("accepted"));
        assert_eq!(error.code, E_EXT_INIT);
        assert!(error.message.starts_with("config.bad:"), "{}", error.message);
        let error = bool_or(&ext, "s", false).err().unwrap_or_else(|| panic!("accepted"));
        assert!(error.message.contains("config.s: must be true or false, got string"), "{}", error.message);
        let ext = extension("x", serde_json::json!({"l": ["ok", ""], "z": 0}));
        let error = string_list(&ext, "l").err().unwrap_or_else(|| panic!("accepted"));
        assert_eq!(error.message, "config.l[1]: must be a non-empty string");
        assert!(count_or(&ext, "z", 1, 1).is_err());
    }
}
