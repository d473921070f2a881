//! `goondan.lock.yaml` in the original's format:
//!
//! ```yaml
//! lockfileVersion: 1
//! packages:
//!   "@scope/name@1.2.3":
//!     version: "1.2.3"
//!     resolved: "http://…/name-1.2.3.tgz"
//!     integrity: "sha512-…"
//!     dependencies: {}
//! ```
//!
//! Written with keys sorted (byte order), every string quoted, so the same
//! resolution always gives the same bytes; read back with the line of any
//! error.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::{PackageError, io_at};

/// The file's name, beside `goondan.yaml`.
pub const FILE_NAME: &str = "goondan.lock.yaml";

/// One locked package.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Locked {
    pub version: String,
    pub resolved: String,
    pub integrity: String,
    #[serde(default)]
    pub dependencies: BTreeMap<String, String>,
}

/// The lockfile: `name@version` → what was locked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lockfile {
    pub packages: BTreeMap<String, Locked>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    lockfile_version: u32,
    #[serde(default)]
    packages: BTreeMap<String, Locked>,
}

fn quote(value: &str) -> String {
    format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
}

impl Lockfile {
    /// The text, sorted and byte-stable.
    pub fn render(&self) -> String {
        let mut out = String::from("lockfileVersion: 1\npackages:");
        if self.packages.is_empty() {
            out.push_str(" {}");
        }
        out.push('\n');
        for (key, entry) in &self.packages {
            out.push_str(&format!("  {}:\n", quote(key)));
            out.push_str(&format!("    version: {}\n", quote(&entry.version)));
            out.push_str(&format!("    resolved: {}\n", quote(&entry.resolved)));
            out.push_str(&format!("    integrity: {}\n", quote(&entry.integrity)));
            if entry.dependencies.is_empty() {
                out.push_str("    dependencies: {}\n");
            } else {
                out.push_str("    dependencies:\n");
                for (name, range) in &entry.dependencies {
                    out.push_str(&format!("      {}: {}\n", quote(name), quote(range)));
                }
            }
        }
        out
    }

    /// Reads the lockfile at `path`; `None` when there is none.
    pub fn read(path: &Path) -> Result<Option<Self>, PackageError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(io_at(path)(error)),
        };
        Self::parse(&text, path).map(Some)
    }

    /// Parses lockfile text (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self, PackageError> {
        let invalid = |line: usize, message: String| PackageError::Lockfile { path: path.to_path_buf(), line, message };
        let raw: Raw = serde_saphyr::from_str(text).map_err(|error| {
            let message = error.to_string();
            invalid(line_of(&message).unwrap_or(1), message)
        })?;
        if raw.lockfile_version != 1 {
            return Err(invalid(1, format!("lockfileVersion {} is not 1", raw.lockfile_version)));
        }
        for (key, entry) in &raw.packages {
            let line = text.lines().position(|l| l.contains(key.as_str())).map_or(1, |i| i + 1);
            let expected = format!("@{}", entry.version);
            let name = key.strip_suffix(&expected).filter(|name| !name.is_empty());
            let Some(name) = name else {
                return Err(invalid(line, format!("key {key:?} is not <name>@{}", entry.version)));
            };
            super::check_name(name).map_err(|e| invalid(line, e.to_string()))?;
            if semver::Version::parse(&entry.version).is_err() {
                return Err(invalid(line, format!("version {:?} is not a semver version", entry.version)));
            }
        }
        Ok(Self { packages: raw.packages })
    }

    /// The locked entry of `name` (one version per package).
    pub fn find(&self, name: &str) -> Option<(&String, &Locked)> {
        self.packages.iter().find(|(key, entry)| key.strip_suffix(&format!("@{}", entry.version)) == Some(name))
    }
}

/// The line number a YAML error message names (`line N`).
fn line_of(message: &str) -> Option<usize> {
    let at = message.find("line ")?;
    message[at + 5..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Lockfile {
        let mut lock = Lockfile::default();
        for (name, deps) in [("@b/two", vec![]), ("@a/one", vec![("@b/two", "^2.0.0")])] {
            lock.packages.insert(
                format!("{name}@1.0.0"),
                Locked {
                    version: "1.0.0".into(),
                    resolved: format!("http://r/{name}/-/x-1.0.0.tgz"),
                    integrity: "sha512-abc".into(),
                    dependencies: deps.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect(),
                },
            );
        }
        lock
    }

    #[test]
    fn renders_sorted_and_reads_back() {
        let text = sample().render();
        assert!(text.starts_with("lockfileVersion: 1\npackages:\n  \"@a/one@1.0.0\":\n    version: \"1.0.0\"\n"));
        assert!(text.contains("    dependencies:\n      \"@b/two\": \"^2.0.0\"\n"));
        assert!(text.contains("    dependencies: {}\n"));
        let back = Lockfile::parse(&text, Path::new("l.yaml")).ok();
        assert_eq!(back, Some(sample()));
        assert_eq!(Lockfile::default().render(), "lockfileVersion: 1\npackages: {}\n");
        assert_eq!(Lockfile::parse(&Lockfile::default().render(), Path::new("l")).ok(), Some(Lockfile::default()));
    }

    #[test]
    fn errors_name_the_line() {
        let text = "lockfileVersion: 1\npackages:\n  \"@a/one@1.0.0\":\n    version: [oops\n";
        match Lockfile::parse(text, Path::new("l.yaml")) {
            Err(PackageError::Lockfile { line, .. }) => assert!(line >= 4, "line {line}"),
            other => panic!("{other:?}"),
        }
        let text = "lockfileVersion: 1\npackages:\n  \"bad@2.0.0\":\n    version: \"1.0.0\"\n    resolved: \"x\"\n    integrity: \"y\"\n";
        match Lockfile::parse(text, Path::new("l.yaml")) {
            Err(PackageError::Lockfile { line, .. }) => assert_eq!(line, 3),
            other => panic!("{other:?}"),
        }
    }
}
