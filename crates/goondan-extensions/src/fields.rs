//! Reading an extension's merged `config` (the Extension's `spec.config`
//! with the agent's per-reference `config` over it): typed fields with the
//! original's defaults, and a structured `E_EXT_INIT` error naming the field
//! when a value has the wrong type or range. The original's extensions mostly
//! fall back to their defaults silently; a native one refuses instead, so a
//! typo in a bundle is found at start, not guessed around.

use goondan_core::{JsonObject, JsonValue};
use goondan_runtime::extension::{AgentExtension, ExtensionError};

/// The code of an extension whose config is refused.
pub(crate) const E_EXT_INIT: &str = "E_EXT_INIT";

/// The config of one extension.
pub(crate) struct Fields<'a> {
    extension: &'a str,
    config: &'a JsonObject,
}

impl<'a> Fields<'a> {
    /// The fields of `extension`'s `config`.
    pub(crate) fn new(extension: &'a str, config: &'a JsonObject) -> Self {
        Self { extension, config }
    }

    /// A field's value; `null` counts as absent (YAML `key: ~`).
    fn get(&self, key: &str) -> Option<&'a JsonValue> {
        self.config.get(key).filter(|value| !value.is_null())
    }

    /// The `E_EXT_INIT` error for `key`.
    pub(crate) fn refuse(&self, key: &str, expected: &str, value: &JsonValue) -> ExtensionError {
        let mut shown = value.to_string();
        if shown.len() > 80 {
            let cut = (0..=80).rev().find(|&at| shown.is_char_boundary(at)).unwrap_or(0);
            shown.truncate(cut);
            shown.push('…');
        }
        ExtensionError::new(self.extension, E_EXT_INIT, format!("config.{key} must be {expected}, got {shown}"))
    }

    /// A boolean, `default` when absent.
    pub(crate) fn boolean(&self, key: &str, default: bool) -> Result<bool, ExtensionError> {
        match self.get(key) {
            None => Ok(default),
            Some(JsonValue::Bool(value)) => Ok(*value),
            Some(other) => Err(self.refuse(key, "true or false", other)),
        }
    }

    /// A whole number of at least `min`, `default` when absent.
    pub(crate) fn integer(&self, key: &str, min: u64, default: usize) -> Result<usize, ExtensionError> {
        let Some(value) = self.get(key) else { return Ok(default) };
        value
            .as_u64()
            .filter(|n| *n >= min)
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
            .ok_or_else(|| self.refuse(key, &format!("a whole number of at least {min}"), value))
    }

    /// A string, `None` when absent.
    pub(crate) fn string(&self, key: &str) -> Result<Option<&'a str>, ExtensionError> {
        match self.get(key) {
            None => Ok(None),
            Some(JsonValue::String(text)) => Ok(Some(text)),
            Some(other) => Err(self.refuse(key, "a string", other)),
        }
    }

    /// One of `choices`, `default` when absent.
    pub(crate) fn choice(
        &self,
        key: &str,
        choices: &[&'static str],
        default: &'static str,
    ) -> Result<&'static str, ExtensionError> {
        let Some(value) = self.get(key) else { return Ok(default) };
        let found = value.as_str().and_then(|text| choices.iter().find(|choice| **choice == text));
        found.copied().ok_or_else(|| {
            let expected: Vec<String> = choices.iter().map(|choice| format!("'{choice}'")).collect();
            self.refuse(key, &format!("one of {}", expected.join(", ")), value)
        })
    }

    /// A list of non-empty strings (trimmed, duplicates dropped); empty when
    /// absent.
    pub(crate) fn string_list(&self, key: &str) -> Result<Vec<String>, ExtensionError> {
        let Some(value) = self.get(key) else { return Ok(Vec::new()) };
        let JsonValue::Array(items) = value else { return Err(self.refuse(key, "a list of strings", value)) };
        let mut names: Vec<String> = Vec::with_capacity(items.len());
        for (index, item) in items.iter().enumerate() {
            match item.as_str().map(str::trim) {
                Some(text) if !text.is_empty() => {
                    if !names.iter().any(|known| known == text) {
                        names.push(text.to_owned());
                    }
                }
                _ => return Err(self.refuse(&format!("{key}[{index}]"), "a non-empty string", item)),
            }
        }
        Ok(names)
    }
}

/// A config error naming `field` (`config.<field>: <problem>`), for checks
/// beyond one field's type.
pub(crate) fn init_error(extension: &AgentExtension, field: &str, problem: impl std::fmt::Display) -> ExtensionError {
    ExtensionError::new(&extension.name, E_EXT_INIT, format!("config.{field}: {problem}"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    /// A base extension named `name` with `config`.
    pub(crate) fn extension(name: &str, config: JsonValue) -> AgentExtension {
        AgentExtension {
            name: name.to_owned(),
            scope: goondan_config::PackageScope::Base,
            entry: std::sync::Arc::from(std::path::Path::new("x.ts")),
            config: config.as_object().cloned().unwrap_or_default(),
        }
    }

    #[test]
    fn lists_are_trimmed_and_deduplicated_and_an_empty_entry_is_refused_by_index() {
        let ext = extension("x", json!({"l": [" a ", "b", "a"], "bad": ["ok", ""]}));
        let fields = Fields::new(&ext.name, &ext.config);
        assert_eq!(fields.string_list("l"), Ok(vec!["a".to_owned(), "b".to_owned()]));
        assert_eq!(fields.string_list("missing"), Ok(Vec::new()));
        let refused = fields.string_list("bad").err().map(|e| e.message);
        assert_eq!(refused.as_deref(), Some("config.bad[1] must be a non-empty string, got \"\""));
    }

    fn config(value: JsonValue) -> JsonObject {
        value.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn fields_read_their_type_or_refuse_naming_the_field() {
        let config = config(json!({"flag": true, "n": 3, "text": "hi", "mode": "a", "none": null, "bad": "3"}));
        let fields = Fields::new("x", &config);
        assert_eq!(fields.boolean("flag", false), Ok(true));
        assert_eq!(fields.boolean("missing", true), Ok(true));
        assert_eq!(fields.integer("n", 1, 9), Ok(3));
        assert_eq!(fields.integer("none", 1, 9), Ok(9));
        assert_eq!(fields.string("text"), Ok(Some("hi")));
        assert_eq!(fields.choice("mode", &["a", "b"], "b"), Ok("a"));

        let refused = fields.integer("bad", 1, 9).err().unwrap_or_else(|| panic!("\"3\" is no number"));
        assert_eq!(refused.code, E_EXT_INIT);
        assert_eq!(refused.extension, "x");
        assert_eq!(refused.message, "config.bad must be a whole number of at least 1, got \"3\"");
        let refused = fields.integer("n", 4, 9).err().map(|e| e.message);
        assert_eq!(refused.as_deref(), Some("config.n must be a whole number of at least 4, got 3"));
        let refused = fields.choice("text", &["a", "b"], "a").err().map(|e| e.message);
        assert_eq!(refused.as_deref(), Some("config.text must be one of 'a', 'b', got \"hi\""));
        assert!(fields.boolean("n", false).is_err());
        assert!(fields.string("n").is_err());
    }
}
