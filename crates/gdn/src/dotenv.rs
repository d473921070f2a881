//! `--env-file`: `KEY=VALUE` lines, as `.env` files write them.
//!
//! Blank lines and `#` comments are skipped, `export ` prefixes allowed,
//! values may be single- or double-quoted (double quotes understand `\n`,
//! `\"` and `\\`). Variables already set in the process environment win,
//! as with the usual dotenv loaders.

use std::collections::BTreeMap;
use std::path::Path;

/// Parses `.env` text; errors name the line.
pub fn parse(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut values = BTreeMap::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((key, value)) = line.split_once('=') else {
            return Err(format!("line {}: expected KEY=VALUE", number + 1));
        };
        let key = key.trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(format!("line {}: '{key}' is not a variable name", number + 1));
        }
        values.insert(key.to_owned(), unquote(value.trim()));
    }
    Ok(values)
}

fn unquote(value: &str) -> String {
    if let Some(inner) = value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) {
        return inner.to_owned();
    }
    if let Some(inner) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        let mut out = String::with_capacity(inner.len());
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            match (c, chars.clone().next()) {
                ('\\', Some('n')) => {
                    out.push('\n');
                    chars.next();
                }
                ('\\', Some(escaped @ ('"' | '\\'))) => {
                    out.push(escaped);
                    chars.next();
                }
                _ => out.push(c),
            }
        }
        return out;
    }
    // Unquoted: a ` #` starts a comment.
    value.split(" #").next().unwrap_or(value).trim_end().to_owned()
}

/// Reads and parses a `.env` file.
pub fn load(path: &Path) -> Result<BTreeMap<String, String>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read --env-file {}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("--env-file {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_usual_forms() {
        let text = "# keys\nOPENAI_API_KEY=sk-1\nexport A='x y'\nB=\"l1\\nl2 \\\"q\\\"\"\nC=plain # note\n\nEMPTY=\n";
        let values = parse(text).unwrap_or_default();
        assert_eq!(values.get("OPENAI_API_KEY").map(String::as_str), Some("sk-1"));
        assert_eq!(values.get("A").map(String::as_str), Some("x y"));
        assert_eq!(values.get("B").map(String::as_str), Some("l1\nl2 \"q\""));
        assert_eq!(values.get("C").map(String::as_str), Some("plain"));
        assert_eq!(values.get("EMPTY").map(String::as_str), Some(""));
        assert!(parse("nonsense").is_err());
        assert!(parse("BAD KEY=1").is_err());
    }
}
