//! Which published version a dependency's range picks: the highest one it
//! allows, with npm's reading of ranges (not Cargo's: a bare `1.2.3` is
//! exactly that version, `>=1 <2` is two comparators, `a || b` either, `1.0.0
//! - 2.0.0` inclusive), and dist-tags (`latest`, `beta`) by name.
//!
//! The original CLI took `latest` for any range; here `^1.0.0` never picks
//! a `2.x`, and a range nothing matches is an error listing the versions
//! that exist.

use std::collections::BTreeMap;

use semver::{Version, VersionReq};

/// No version could be picked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("{spec:?} is neither a version range nor a dist-tag{}", tags_hint(.tags))]
    InvalidRange { spec: String, tags: Vec<String> },
    #[error("no published version matches {spec:?}; published: {}", list(.available))]
    NoMatch { spec: String, available: Vec<String> },
    #[error("dist-tag {tag:?} names {version:?}, which is not published; published: {}", list(.available))]
    TagNotPublished { tag: String, version: String, available: Vec<String> },
}

fn list(versions: &[String]) -> String {
    if versions.is_empty() { "none".to_owned() } else { versions.join(", ") }
}

fn tags_hint(tags: &[String]) -> String {
    if tags.is_empty() { String::new() } else { format!(" (dist-tags: {})", tags.join(", ")) }
}

/// The highest of `published` that `spec` allows: a range, an exact
/// version, `*`/empty (the `latest` tag, else the highest release), or a
/// dist-tag name. Versions that do not parse are ignored.
pub fn resolve<'a>(
    published: impl IntoIterator<Item = &'a str>,
    dist_tags: &BTreeMap<String, String>,
    spec: &str,
) -> Result<Version, ResolveError> {
    let mut versions: Vec<Version> = published.into_iter().filter_map(|v| Version::parse(v).ok()).collect();
    versions.sort();
    let available = || versions.iter().map(Version::to_string).collect::<Vec<_>>();
    let spec = spec.trim();
    let tag = match spec {
        "" | "*" | "x" | "X" | "latest" => Some("latest"),
        other if dist_tags.contains_key(other) => Some(other),
        _ => None,
    };
    if let Some(tag) = tag {
        match dist_tags.get(tag) {
            Some(named) => {
                return Version::parse(named).ok().filter(|v| versions.contains(v)).ok_or_else(|| {
                    ResolveError::TagNotPublished {
                        tag: tag.to_owned(),
                        version: named.clone(),
                        available: available(),
                    }
                });
            }
            // No `latest` tag: the highest release.
            None => {
                return versions
                    .iter()
                    .rev()
                    .find(|v| v.pre.is_empty())
                    .cloned()
                    .ok_or_else(|| ResolveError::NoMatch { spec: spec.to_owned(), available: available() });
            }
        }
    }
    let alternatives = parse_range(spec).ok_or_else(|| ResolveError::InvalidRange {
        spec: spec.to_owned(),
        tags: dist_tags.keys().cloned().collect(),
    })?;
    versions
        .iter()
        .rev()
        .find(|v| alternatives.iter().any(|req| req.matches(v)))
        .cloned()
        .ok_or_else(|| ResolveError::NoMatch { spec: spec.to_owned(), available: available() })
}

/// Whether `spec` reads as a version range (or exact version).
pub fn is_range(spec: &str) -> bool {
    parse_range(spec.trim()).is_some()
}

/// npm's range syntax as `semver` requirements, one per `||` alternative.
fn parse_range(spec: &str) -> Option<Vec<VersionReq>> {
    spec.split("||").map(|alternative| parse_alternative(alternative.trim())).collect()
}

fn parse_alternative(alternative: &str) -> Option<VersionReq> {
    if alternative.is_empty() || alternative == "*" {
        return Some(VersionReq::STAR);
    }
    // `1.0.0 - 2.0.0`: both ends included.
    if let Some((low, high)) = alternative.split_once(" - ") {
        return VersionReq::parse(&format!(">={}, <={}", low.trim(), high.trim())).ok();
    }
    // Comparators are space-separated in npm, comma-separated in `semver`;
    // an operator may stand apart from its version (`>= 1.0.0`).
    let mut comparators: Vec<String> = Vec::new();
    let mut pending_operator = String::new();
    for token in alternative.split_whitespace() {
        if token.chars().all(|c| matches!(c, '<' | '>' | '=' | '^' | '~')) {
            pending_operator.push_str(token);
            continue;
        }
        let token = format!("{}{}", std::mem::take(&mut pending_operator), token);
        comparators.push(exact_if_bare(&token));
    }
    if !pending_operator.is_empty() {
        return None;
    }
    VersionReq::parse(&comparators.join(", ")).ok()
}

/// A bare full version is exact in npm (in `semver` it would be `^`); a
/// leading `v` or `=` is dropped.
fn exact_if_bare(token: &str) -> String {
    let bare = token.trim_start_matches('=').trim_start_matches('v');
    if token.starts_with(|c: char| c.is_ascii_digit() || c == 'v' || c == '=') && Version::parse(bare).is_ok() {
        format!("={bare}")
    } else {
        token.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pick(published: &[&str], tags: &[(&str, &str)], spec: &str) -> Result<String, ResolveError> {
        let tags = tags.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        resolve(published.iter().copied(), &tags, spec).map(|v| v.to_string())
    }

    const PUBLISHED: &[&str] =
        &["1.0.0", "1.2.0", "1.2.5", "1.10.0", "2.0.0", "2.1.0-beta.1", "0.3.1", "0.3.9", "0.4.0"];

    #[test]
    fn caret_stays_within_the_major_never_latest() {
        // The original took `latest` (here 2.0.0) for any range.
        assert_eq!(pick(PUBLISHED, &[("latest", "2.0.0")], "^1.0.0"), Ok("1.10.0".to_owned()));
        assert_eq!(pick(PUBLISHED, &[], "^0.3.1"), Ok("0.3.9".to_owned()));
        assert_eq!(pick(PUBLISHED, &[], "^2.0.0"), Ok("2.0.0".to_owned()), "no prerelease for a release range");
    }

    #[test]
    fn tilde_exact_and_comparators() {
        assert_eq!(pick(PUBLISHED, &[], "~1.2.0"), Ok("1.2.5".to_owned()));
        assert_eq!(pick(PUBLISHED, &[], "~1.2"), Ok("1.2.5".to_owned()));
        assert_eq!(pick(PUBLISHED, &[], "1.2.0"), Ok("1.2.0".to_owned()), "a bare version is exact, as in npm");
        assert_eq!(pick(PUBLISHED, &[], "=1.0.0"), Ok("1.0.0".to_owned()));
        assert_eq!(pick(PUBLISHED, &[], "v1.0.0"), Ok("1.0.0".to_owned()));
        assert_eq!(pick(PUBLISHED, &[], ">=1.0.0"), Ok("2.0.0".to_owned()));
        assert_eq!(pick(PUBLISHED, &[], ">=1.0.0 <1.10.0"), Ok("1.2.5".to_owned()));
        assert_eq!(pick(PUBLISHED, &[], ">= 1.0.0 < 1.10.0"), Ok("1.2.5".to_owned()));
        assert_eq!(pick(PUBLISHED, &[], "1.0.0 - 1.2.0"), Ok("1.2.0".to_owned()));
        assert_eq!(pick(PUBLISHED, &[], "^0.3.0 || ^1.0.0"), Ok("1.10.0".to_owned()));
        assert_eq!(pick(PUBLISHED, &[], "1.x"), Ok("1.10.0".to_owned()));
        assert_eq!(pick(PUBLISHED, &[], "1"), Ok("1.10.0".to_owned()));
        assert_eq!(pick(PUBLISHED, &[], "2.1.0-beta.1"), Ok("2.1.0-beta.1".to_owned()));
    }

    #[test]
    fn tags_and_latest() {
        let tags = [("latest", "1.10.0"), ("beta", "2.1.0-beta.1")];
        assert_eq!(pick(PUBLISHED, &tags, "latest"), Ok("1.10.0".to_owned()));
        assert_eq!(pick(PUBLISHED, &tags, "beta"), Ok("2.1.0-beta.1".to_owned()));
        assert_eq!(pick(PUBLISHED, &tags, "*"), Ok("1.10.0".to_owned()));
        // No `latest` tag: the highest release, never a prerelease.
        assert_eq!(pick(PUBLISHED, &[], "latest"), Ok("2.0.0".to_owned()));
        assert!(matches!(pick(PUBLISHED, &[("latest", "9.9.9")], "latest"), Err(ResolveError::TagNotPublished { .. })));
    }

    #[test]
    fn errors_list_what_exists() {
        let error = pick(PUBLISHED, &[], "^3.0.0").err();
        let Some(ResolveError::NoMatch { available, .. }) = &error else { panic!("{error:?}") };
        assert_eq!(available.first().map(String::as_str), Some("0.3.1"));
        assert_eq!(available.len(), PUBLISHED.len());
        let message = error.map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("1.10.0") && message.contains("^3.0.0"), "{message}");
        assert!(matches!(pick(PUBLISHED, &[("latest", "1.0.0")], "nightly"), Err(ResolveError::InvalidRange { .. })));
        assert!(matches!(pick(&[], &[], "^1.0.0"), Err(ResolveError::NoMatch { .. })));
        assert!(matches!(pick(PUBLISHED, &[], ">="), Err(ResolveError::InvalidRange { .. })));
        assert!(is_range("^1 || ~2.0") && !is_range("beta"));
    }
}
