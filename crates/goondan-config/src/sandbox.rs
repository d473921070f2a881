//! `spec.sandbox` beyond its YAML shape ([`crate::resources::SandboxConfig`]):
//! which sandbox an agent gets ([`crate::Bundle::sandbox_for`]), its paths
//! made absolute, its `network.allow` entries parsed, and its `limits`
//! ([`SandboxLimits`]) read.
//!
//! Validation (`crate::validate`) and the runtime read the paths and the
//! entries through the same functions here, so what `gdn validate` accepts
//! is what the sandbox is built from.

use std::fmt;
use std::path::{Component, Path, PathBuf};

use goondan_core::host_port::{HostPort, HostPortError};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value as JsonValue;

use crate::resources::{SandboxConfig, SandboxNetwork};

/// The sandbox an agent's commands run in, and where it was set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectiveSandbox {
    /// The settings.
    pub config: SandboxConfig,
    /// Where they come from.
    pub source: SandboxSource,
}

/// Where an agent's [`EffectiveSandbox`] was set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxSource {
    /// The Agent's own `spec.sandbox`.
    Agent,
    /// The `spec.sandbox` of the Swarm named, which the agent runs in and
    /// which the Agent does not override.
    Swarm(String),
    /// Neither sets one: [`SandboxConfig::default`] (`workspace-write`).
    Default,
}

impl fmt::Display for SandboxSource {
    /// `its own spec.sandbox`, `Swarm <name>`, `default`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Agent => f.write_str("its own spec.sandbox"),
            Self::Swarm(name) => write!(f, "Swarm {name}"),
            Self::Default => f.write_str("default"),
        }
    }
}

/// Why a `readable` or `writable` entry cannot be made absolute.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SandboxPathError {
    /// An empty (or all white space) entry.
    #[error("an empty path")]
    Empty,
    /// `~name/…`: another user's home is not looked up.
    #[error("'{0}': only ~ and ~/… (your own home directory) are understood, not ~name")]
    OtherUsersHome(String),
    /// `~` or `~/…` with no home directory known.
    #[error("'{0}' is under the home directory, and HOME is not set to an absolute path")]
    NoHome(String),
    /// A relative entry and a bundle directory that cannot be made absolute
    /// (the current directory is gone).
    #[error("'{entry}' is relative to the bundle directory {}, which cannot be made absolute: {reason}", .root.display())]
    Root {
        /// The entry.
        entry: String,
        /// The bundle directory.
        root: PathBuf,
        /// Why.
        reason: String,
    },
}

/// The home directory `~` stands for: `HOME`, when it is an absolute path.
pub fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME").map(PathBuf::from).filter(|home| home.is_absolute())
}

/// Whether `entry` is written relative to the home directory (`~`, `~/…`).
fn home_relative(entry: &str) -> Option<&str> {
    match entry.strip_prefix('~')? {
        "" => Some(""),
        rest => rest.strip_prefix('/'),
    }
}

/// Checks the form of a `readable` / `writable` entry alone (no home
/// directory or bundle directory needed): not empty, not `~name`.
pub fn check_sandbox_path(entry: &str) -> Result<(), SandboxPathError> {
    if entry.trim().is_empty() {
        return Err(SandboxPathError::Empty);
    }
    if entry.starts_with('~') && home_relative(entry).is_none() {
        return Err(SandboxPathError::OtherUsersHome(entry.to_owned()));
    }
    Ok(())
}

/// A `readable` / `writable` entry as an absolute path: an absolute entry
/// as is, `~` and `~/…` under `home`, anything else under the bundle's
/// directory `root` (made absolute against the current directory if it is
/// relative). `.` and `..` are folded lexically (`..` at `/` stays at `/`);
/// nothing is looked up on disk, so the path need not exist and links are
/// not followed.
pub fn resolve_sandbox_path(entry: &str, root: &Path, home: Option<&Path>) -> Result<PathBuf, SandboxPathError> {
    check_sandbox_path(entry)?;
    let joined = if let Some(rest) = home_relative(entry) {
        let Some(home) = home.filter(|home| home.is_absolute()) else {
            return Err(SandboxPathError::NoHome(entry.to_owned()));
        };
        home.join(rest)
    } else if Path::new(entry).is_absolute() {
        PathBuf::from(entry)
    } else {
        let root = std::path::absolute(root).map_err(|error| SandboxPathError::Root {
            entry: entry.to_owned(),
            root: root.to_path_buf(),
            reason: error.to_string(),
        })?;
        root.join(entry)
    };
    Ok(normalize(&joined))
}

/// `.` and `..` folded out of an absolute path, without looking at the disk
/// (the built-in tools confine paths with it too).
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                // `pop` refuses to remove the root: `/..` is `/`.
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

impl SandboxConfig {
    /// The `readable` entries as absolute paths ([`resolve_sandbox_path`]).
    pub fn readable_paths(&self, root: &Path, home: Option<&Path>) -> Result<Vec<PathBuf>, SandboxPathError> {
        self.readable.iter().map(|entry| resolve_sandbox_path(entry, root, home)).collect()
    }

    /// The `writable` entries as absolute paths ([`resolve_sandbox_path`]).
    pub fn writable_paths(&self, root: &Path, home: Option<&Path>) -> Result<Vec<PathBuf>, SandboxPathError> {
        self.writable.iter().map(|entry| resolve_sandbox_path(entry, root, home)).collect()
    }
}

impl SandboxNetwork {
    /// The `allow` entries parsed (`goondan_core::host_port`, the grammar
    /// the sandbox's proxy reads them with).
    pub fn targets(&self) -> Result<Vec<HostPort>, HostPortError> {
        self.allow.iter().map(|entry| HostPort::parse(entry, None)).collect()
    }
}

/// `spec.sandbox.limits`: the resource bounds of each command. A field
/// left out is the sandbox's default (processes 4096, fileSize 4 GiB,
/// memory 3/4 of the machine's memory); `unlimited` removes the bound.
///
/// ```yaml
/// sandbox:
///   limits:
///     processes: 256          # processes and threads at once; or unlimited
///     fileSize: 1GiB          # bytes, or a size: KiB MiB GiB TiB / KB MB GB TB
///     memory: 8GiB            # all the command's processes together
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxLimits {
    /// The most processes (and threads) a command may run at once.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "de_processes")]
    pub processes: Option<LimitBound>,
    /// The largest file a command may write, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "de_file_size")]
    pub file_size: Option<LimitBound>,
    /// The most memory a command may take, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "de_memory")]
    pub memory: Option<LimitBound>,
}

impl SandboxLimits {
    /// Whether it sets nothing (every bound the default).
    pub fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// One bound of [`SandboxLimits`] as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitBound {
    /// `unlimited`: no bound.
    Unlimited,
    /// A number (of processes, or of bytes).
    At(u64),
}

impl Serialize for LimitBound {
    /// A number, or `"unlimited"`.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Unlimited => serializer.serialize_str(UNLIMITED),
            Self::At(value) => serializer.serialize_u64(*value),
        }
    }
}

/// The word for no bound.
pub const UNLIMITED: &str = "unlimited";

/// The largest `processes` (the kernel's `PID_MAX_LIMIT`).
pub const MAX_PROCESSES: u64 = 4 << 20;

/// The smallest `memory` a command can start under: 16 MiB.
pub const MIN_MEMORY: u64 = 16 << 20;

/// Why a `limits` value cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// Neither a number nor a string.
    #[error("must be a number or a string, got {0}")]
    Type(String),
    /// A number of processes that is not a whole number from 1.
    #[error("'{0}' is not a whole number of processes")]
    Processes(String),
    /// A size that does not read as one.
    #[error(
        "'{0}' is not a size: write a number of bytes, or a number and a unit (KiB, MiB, GiB, TiB, or KB, MB, GB, TB)"
    )]
    Size(String),
    /// `1G`, `512m`: binary or decimal is not said.
    #[error("'{value}': the unit '{unit}' is ambiguous; write {unit}iB (powers of 1024) or {unit}B (powers of 1000)")]
    AmbiguousUnit {
        /// The value.
        value: String,
        /// The unit, in upper case.
        unit: String,
    },
    /// Zero, or less than the smallest workable bound.
    #[error("'{value}' is less than the smallest bound, {min}")]
    TooSmall {
        /// The value.
        value: String,
        /// The smallest.
        min: String,
    },
    /// More than any kernel takes, or than 2^64 bytes.
    #[error("'{value}' is more than the largest bound, {max}; write unlimited for no bound")]
    TooLarge {
        /// The value.
        value: String,
        /// The largest.
        max: String,
    },
}

fn shown(value: &JsonValue) -> String {
    match value {
        JsonValue::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// `limits.processes`: a whole number from 1 to [`MAX_PROCESSES`], or
/// `unlimited`.
pub fn parse_processes(value: &JsonValue) -> Result<LimitBound, LimitError> {
    let number = match value {
        JsonValue::String(text) if text.trim() == UNLIMITED => return Ok(LimitBound::Unlimited),
        JsonValue::String(text) => text.trim().parse::<u64>().ok(),
        JsonValue::Number(number) => number.as_u64(),
        other => return Err(LimitError::Type(goondan_core::json_type_name(other).to_owned())),
    };
    let Some(number) = number else { return Err(LimitError::Processes(shown(value))) };
    if number == 0 {
        return Err(LimitError::TooSmall { value: shown(value), min: "1".to_owned() });
    }
    if number > MAX_PROCESSES {
        return Err(LimitError::TooLarge { value: shown(value), max: MAX_PROCESSES.to_string() });
    }
    Ok(LimitBound::At(number))
}

/// `limits.fileSize`: a size ([`parse_size`]) of at least 1 byte.
pub fn parse_file_size(value: &JsonValue) -> Result<LimitBound, LimitError> {
    parse_size_at_least(value, 1)
}

/// `limits.memory`: a size ([`parse_size`]) of at least [`MIN_MEMORY`].
pub fn parse_memory(value: &JsonValue) -> Result<LimitBound, LimitError> {
    parse_size_at_least(value, MIN_MEMORY)
}

fn parse_size_at_least(value: &JsonValue, min: u64) -> Result<LimitBound, LimitError> {
    let bound = parse_size(value)?;
    match bound {
        LimitBound::At(bytes) if bytes < min => Err(LimitError::TooSmall {
            value: shown(value),
            min: if min == 1 { "1 byte".to_owned() } else { format!("{} MiB", min >> 20) },
        }),
        bound => Ok(bound),
    }
}

/// A size: a whole number of bytes, or a string — `unlimited`, or a number
/// (fractions allowed: `1.5GiB`) and a unit: `B`, `KiB` `MiB` `GiB` `TiB`
/// (powers of 1024) or `KB` `MB` `GB` `TB` (powers of 1000), any case, a
/// space between allowed. `K`, `M`, `G`, `T` alone are refused as
/// ambiguous. Rounded down to whole bytes.
pub fn parse_size(value: &JsonValue) -> Result<LimitBound, LimitError> {
    let text = match value {
        JsonValue::Number(number) => {
            return number.as_u64().map(LimitBound::At).ok_or_else(|| LimitError::Size(shown(value)));
        }
        JsonValue::String(text) => text.trim(),
        other => return Err(LimitError::Type(goondan_core::json_type_name(other).to_owned())),
    };
    if text == UNLIMITED {
        return Ok(LimitBound::Unlimited);
    }
    let bad = || LimitError::Size(text.to_owned());
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
    let (number, unit) = (&text[..split], text[split..].trim_start());
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty()
        || !fraction.bytes().all(|b| b.is_ascii_digit())
        || (number.contains('.') && fraction.is_empty())
    {
        return Err(bad());
    }
    let multiplier: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "k" | "m" | "g" | "t" => {
            return Err(LimitError::AmbiguousUnit { value: text.to_owned(), unit: unit.to_ascii_uppercase() });
        }
        _ => return Err(bad()),
    };
    let too_large = || LimitError::TooLarge { value: text.to_owned(), max: "16 EiB".to_owned() };
    let whole: u128 = whole.parse().map_err(|_| too_large())?;
    // At most 18 digits of fraction count; more cannot change whole bytes
    // of any unit here.
    let fraction = &fraction[..fraction.len().min(18)];
    let scale = 10u128.pow(fraction.len() as u32);
    let fraction: u128 = if fraction.is_empty() { 0 } else { fraction.parse().map_err(|_| bad())? };
    if multiplier == 1 && fraction != 0 {
        return Err(LimitError::Size(text.to_owned()));
    }
    let bytes = whole
        .checked_mul(u128::from(multiplier))
        .and_then(|bytes| bytes.checked_add(fraction * u128::from(multiplier) / scale))
        .ok_or_else(too_large)?;
    u64::try_from(bytes).map(LimitBound::At).map_err(|_| too_large())
}

fn de_with<'de, D: Deserializer<'de>>(
    deserializer: D,
    parse: fn(&JsonValue) -> Result<LimitBound, LimitError>,
) -> Result<Option<LimitBound>, D::Error> {
    let value = JsonValue::deserialize(deserializer)?;
    parse(&value).map(Some).map_err(serde::de::Error::custom)
}

fn de_processes<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<LimitBound>, D::Error> {
    de_with(deserializer, parse_processes)
}

fn de_file_size<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<LimitBound>, D::Error> {
    de_with(deserializer, parse_file_size)
}

fn de_memory<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<LimitBound>, D::Error> {
    de_with(deserializer, parse_memory)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_made_absolute_against_the_bundle_and_the_home_directory() {
        let root = Path::new("/work/project");
        let home = Some(Path::new("/home/ada"));
        let resolve = |entry: &str| resolve_sandbox_path(entry, root, home);
        assert_eq!(resolve("/opt/data"), Ok(PathBuf::from("/opt/data")));
        assert_eq!(resolve("~/datasets"), Ok(PathBuf::from("/home/ada/datasets")));
        assert_eq!(resolve("~"), Ok(PathBuf::from("/home/ada")));
        assert_eq!(resolve("./vendor"), Ok(PathBuf::from("/work/project/vendor")));
        assert_eq!(resolve("vendor/../out/."), Ok(PathBuf::from("/work/project/out")));
        assert_eq!(resolve("../shared"), Ok(PathBuf::from("/work/shared")), "leaving the bundle is allowed");
        assert_eq!(resolve("../../../../.."), Ok(PathBuf::from("/")));
        assert_eq!(resolve(""), Err(SandboxPathError::Empty));
        assert_eq!(resolve("  "), Err(SandboxPathError::Empty));
        assert_eq!(resolve("~bob/x"), Err(SandboxPathError::OtherUsersHome("~bob/x".to_owned())));
        assert_eq!(
            resolve_sandbox_path("~/x", root, None),
            Err(SandboxPathError::NoHome("~/x".to_owned())),
            "no home: an error, never a guess"
        );
        assert_eq!(
            resolve_sandbox_path("~/x", root, Some(Path::new("relative"))),
            Err(SandboxPathError::NoHome("~/x".to_owned()))
        );
        let Ok(relative_root) = resolve_sandbox_path("out", Path::new("."), home) else { panic!("relative root") };
        assert!(relative_root.is_absolute() && relative_root.ends_with("out"), "{}", relative_root.display());
    }

    /// The home directory is judged as `HOME` says (given here, as the
    /// loader's callers read it from the environment).
    #[test]
    fn writable_paths_at_or_above_the_home_directory_are_wide() {
        let text = "apiVersion: goondan.ai/v1\nkind: Model\nmetadata: {name: m}\nspec: {provider: openai, model: x}\n---\napiVersion: goondan.ai/v1\nkind: Agent\nmetadata: {name: a}\nspec: {modelConfig: {modelRef: Model/m}}\n---\napiVersion: goondan.ai/v1\nkind: Swarm\nmetadata: {name: s}\nspec:\n  entryAgent: Agent/a\n  agents: [Agent/a]\n  sandbox:\n    writable: [/home/ada, /home, /home/ada/out, \"~\", /home/adam, ../..]\n";
        let home = Some(Path::new("/home/ada"));
        let report = crate::bundle::load_text(
            text,
            "goondan.yaml",
            Some(Path::new("/home/ada/work/b")),
            PathBuf::from("goondan.yaml"),
            home,
        );
        let found: Vec<(&str, &str, &str)> = report
            .diagnostics
            .iter()
            .map(|d| (d.code.as_str(), d.path.as_str(), d.message.split(": ").next().unwrap_or_default()))
            .collect();
        assert_eq!(
            found,
            [
                (
                    "W_CONFIG_SANDBOX_WIDE",
                    "goondan.yaml#2.spec.sandbox.writable[0]",
                    "writable path '/home/ada' is your home directory"
                ),
                (
                    "W_CONFIG_SANDBOX_WIDE",
                    "goondan.yaml#2.spec.sandbox.writable[1]",
                    "writable path '/home' is a directory holding your home directory (/home/ada)"
                ),
                (
                    "W_CONFIG_SANDBOX_WIDE",
                    "goondan.yaml#2.spec.sandbox.writable[3]",
                    "writable path '~' is your home directory"
                ),
                (
                    "W_CONFIG_SANDBOX_WIDE",
                    "goondan.yaml#2.spec.sandbox.writable[5]",
                    "writable path '../..' is your home directory"
                ),
            ],
            "{:#?}",
            report.diagnostics
        );
    }

    #[test]
    fn a_config_resolves_all_its_paths_or_says_which_fails() {
        let config = SandboxConfig {
            readable: vec!["/opt/data".to_owned(), "~/datasets".to_owned(), "./vendor".to_owned()],
            writable: vec!["/srv/out".to_owned()],
            ..SandboxConfig::default()
        };
        let root = Path::new("/b");
        assert_eq!(
            config.readable_paths(root, Some(Path::new("/h"))),
            Ok(vec![PathBuf::from("/opt/data"), PathBuf::from("/h/datasets"), PathBuf::from("/b/vendor")])
        );
        assert_eq!(config.writable_paths(root, None), Ok(vec![PathBuf::from("/srv/out")]));
        assert_eq!(config.readable_paths(root, None), Err(SandboxPathError::NoHome("~/datasets".to_owned())));
    }

    #[test]
    fn sizes_read_in_binary_and_decimal_units_and_ambiguous_ones_are_refused() {
        use serde_json::json;
        let at = |n: u64| Ok(LimitBound::At(n));
        assert_eq!(parse_size(&json!(1048576)), at(1 << 20));
        assert_eq!(parse_size(&json!("1GiB")), at(1 << 30));
        assert_eq!(parse_size(&json!("1 GiB")), at(1 << 30));
        assert_eq!(parse_size(&json!("1gib")), at(1 << 30));
        assert_eq!(parse_size(&json!("1.5GiB")), at(3 << 29));
        assert_eq!(parse_size(&json!("10MiB")), at(10 << 20));
        assert_eq!(parse_size(&json!("4GB")), at(4_000_000_000));
        assert_eq!(parse_size(&json!("512KB")), at(512_000));
        assert_eq!(parse_size(&json!("2TiB")), at(2 << 40));
        assert_eq!(parse_size(&json!("100")), at(100));
        assert_eq!(parse_size(&json!("100B")), at(100));
        assert_eq!(parse_size(&json!("unlimited")), Ok(LimitBound::Unlimited));
        assert!(matches!(parse_size(&json!("1G")), Err(LimitError::AmbiguousUnit { unit, .. }) if unit == "G"));
        assert!(matches!(parse_size(&json!("512m")), Err(LimitError::AmbiguousUnit { unit, .. }) if unit == "M"));
        for bad in ["", "GiB", "1 2GiB", "-1GiB", "1.GiB", ".5GiB", "1.5", "one", "1PiB", "1e9"] {
            assert!(
                matches!(parse_size(&json!(bad)), Err(LimitError::Size(_))),
                "{bad:?}: {:?}",
                parse_size(&json!(bad))
            );
        }
        assert!(matches!(parse_size(&json!(-1)), Err(LimitError::Size(_))));
        assert!(matches!(parse_size(&json!(1.5)), Err(LimitError::Size(_))));
        assert!(matches!(parse_size(&json!(true)), Err(LimitError::Type(_))));
        assert!(matches!(parse_size(&json!("17000000TiB")), Err(LimitError::TooLarge { .. })));
        assert!(matches!(parse_memory(&json!("1MiB")), Err(LimitError::TooSmall { .. })));
        assert_eq!(parse_memory(&json!("16MiB")), at(16 << 20));
        assert!(matches!(parse_file_size(&json!(0)), Err(LimitError::TooSmall { .. })));
    }

    #[test]
    fn processes_are_a_whole_number_or_unlimited() {
        use serde_json::json;
        assert_eq!(parse_processes(&json!(64)), Ok(LimitBound::At(64)));
        assert_eq!(parse_processes(&json!("64")), Ok(LimitBound::At(64)));
        assert_eq!(parse_processes(&json!("unlimited")), Ok(LimitBound::Unlimited));
        assert!(matches!(parse_processes(&json!(0)), Err(LimitError::TooSmall { .. })));
        assert!(matches!(parse_processes(&json!(5_000_000)), Err(LimitError::TooLarge { .. })));
        assert!(matches!(parse_processes(&json!(1.5)), Err(LimitError::Processes(_))));
        assert!(matches!(parse_processes(&json!("lots")), Err(LimitError::Processes(_))));
        assert!(matches!(parse_processes(&json!([1])), Err(LimitError::Type(_))));
        let limits =
            SandboxLimits { processes: Some(LimitBound::At(64)), file_size: Some(LimitBound::Unlimited), memory: None };
        assert_eq!(serde_json::to_value(limits).ok(), Some(json!({"processes": 64, "fileSize": "unlimited"})));
    }
}
