//! The environment files of a bundle, loaded as the original loads them
//! (its `packages/cli/src/services/env.ts`): the bundle directory's `.env`,
//! then its `.env.local`, then `gdn run --env-file FILE`, each overriding
//! the ones before, all of them overriding the process environment. The
//! two in the bundle directory are optional; `--env-file` must exist.
//!
//! Parsing is `dotenvy`'s: `export` prefixes, single and double quotes
//! (quotes removed, `# comments` after a quoted value ignored), values
//! spanning lines inside quotes, `${VAR}` substitution in unquoted and
//! double-quoted values.
//!
//! Every value is a secret, whatever its name: `main` adds them to
//! [`crate::secrets::Secrets`], read through the agents' environment lookup
//! and handed to agent processes over their channel. None enters a process
//! environment, so a `bash` command or a JavaScript tool never sees one.
//! Parse errors never quote the line (it may hold a key).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::input::{MAX_ENV_FILE_BYTES, read_text};

/// The optional files of the bundle directory, lowest precedence first.
pub const BUNDLE_FILES: [&str; 2] = [".env", ".env.local"];

/// The values of the bundle directory's `.env` and `.env.local` and of
/// `env_file` (relative to the current directory), the later ones winning.
pub fn load(bundle_dir: &Path, env_file: Option<&Path>) -> Result<BTreeMap<String, String>, String> {
    let mut files: Vec<(PathBuf, bool)> = BUNDLE_FILES.iter().map(|name| (bundle_dir.join(name), false)).collect();
    if let Some(path) = env_file {
        files.push((path.to_path_buf(), true));
    }
    let mut values = BTreeMap::new();
    for (path, required) in files {
        // A bundle without its own `.env` is the usual case; a dangling link
        // counts as none, and so does a directory (a Python virtualenv is
        // often called `.env`).
        if !required && !std::fs::metadata(&path).is_ok_and(|metadata| !metadata.is_dir()) {
            continue;
        }
        let option = if required { "--env-file" } else { "the environment file" };
        let text = read_text(&path, option, MAX_ENV_FILE_BYTES)?;
        let parsed = parse(&text).map_err(|error| format!("{option} {}: {error}", path.display()))?;
        tracing::debug!("read {} variable(s) from {}", parsed.len(), path.display());
        values.extend(parsed);
    }
    Ok(values)
}

/// Parses `.env` text, in order (a name set twice: the last wins).
pub fn parse(text: &str) -> Result<Vec<(String, String)>, String> {
    dotenvy::from_read_iter(text.as_bytes())
        .map(|item| {
            item.map_err(|error| match error {
                dotenvy::Error::LineParse(line, _) => {
                    let number = text.find(line.as_str()).map(|at| text[..at].matches('\n').count() + 1);
                    match number {
                        Some(number) => format!("line {number} is not NAME=VALUE"),
                        None => "a line is not NAME=VALUE".to_owned(),
                    }
                }
                other => other.to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> BTreeMap<String, String> {
        parse(text).unwrap_or_else(|e| panic!("{e}")).into_iter().collect()
    }

    #[test]
    fn parses_as_the_usual_loaders_do() {
        let values = parsed(
            "# keys\nOPENAI_API_KEY=sk-1\nexport A='x y'\nB=\"l1\\nl2\"\nC=plain # note\nD=\"abc\" # a note\n\nEMPTY=\nM=\"first\nsecond\"\nS=${A}!\n",
        );
        assert_eq!(values.get("OPENAI_API_KEY").map(String::as_str), Some("sk-1"));
        assert_eq!(values.get("A").map(String::as_str), Some("x y"));
        assert_eq!(values.get("B").map(String::as_str), Some("l1\nl2"));
        assert_eq!(values.get("C").map(String::as_str), Some("plain"));
        assert_eq!(values.get("D").map(String::as_str), Some("abc"), "quotes and the comment after them go");
        assert_eq!(values.get("EMPTY").map(String::as_str), Some(""));
        assert_eq!(values.get("M").map(String::as_str), Some("first\nsecond"), "a quoted value spans lines");
        assert_eq!(values.get("S").map(String::as_str), Some("x y!"));
    }

    #[test]
    fn errors_name_the_line_but_never_quote_it() {
        let error = parse("A=1\nB=2\nsk-secret-value nonsense\n").err().unwrap_or_default();
        assert_eq!(error, "line 3 is not NAME=VALUE");
        assert!(parse("BAD KEY=1").is_err());
    }

    #[test]
    fn later_files_win_and_the_bundle_files_are_optional() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(load(dir.path(), None), Ok(BTreeMap::new()));
        std::fs::write(dir.path().join(".env"), "A=env\nB=env\nC=env\n").unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.path().join(".env.local"), "B=local\nC=local\n").unwrap_or_else(|e| panic!("{e}"));
        let extra = dir.path().join("extra.env");
        std::fs::write(&extra, "C=flag\n").unwrap_or_else(|e| panic!("{e}"));
        let values = load(dir.path(), Some(&extra)).unwrap_or_else(|e| panic!("{e}"));
        let got: Vec<(&str, &str)> = values.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got, [("A", "env"), ("B", "local"), ("C", "flag")]);
        let missing = load(dir.path(), Some(&dir.path().join("nope.env"))).err().unwrap_or_default();
        assert!(missing.starts_with("cannot read --env-file "), "{missing}");
        // A virtualenv called `.env` is not an environment file.
        let venv = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir(venv.path().join(".env")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(load(venv.path(), None), Ok(BTreeMap::new()));
    }
}
