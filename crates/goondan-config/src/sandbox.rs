//! `spec.sandbox` beyond its YAML shape ([`crate::resources::SandboxConfig`]):
//! which sandbox an agent gets ([`crate::Bundle::sandbox_for`]), its paths
//! made absolute, and its `network.allow` entries parsed.
//!
//! Validation (`crate::validate`) and the runtime read the paths and the
//! entries through the same functions here, so what `gdn validate` accepts
//! is what the sandbox is built from.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Component, Path, PathBuf};

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

/// `.` and `..` folded out of an absolute path, without looking at the disk.
pub(crate) fn normalize(path: &Path) -> PathBuf {
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
    /// The `allow` entries parsed ([`parse_network_allow`]).
    pub fn targets(&self) -> Result<Vec<NetworkTarget>, NetworkAllowError> {
        self.allow.iter().map(|entry| parse_network_allow(entry)).collect()
    }
}

/// One `network.allow` entry: a host and a port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NetworkTarget {
    /// The host.
    pub host: NetworkHost,
    /// The port, 1 to 65535.
    pub port: u16,
}

/// The host of a [`NetworkTarget`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NetworkHost {
    /// A host name, in lower case (`api.example.com`, `localhost`).
    Name(String),
    /// An IPv4 or IPv6 address.
    Ip(IpAddr),
}

impl fmt::Display for NetworkTarget {
    /// `host:port`, an IPv6 address in brackets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            NetworkHost::Name(name) => write!(f, "{name}:{}", self.port),
            NetworkHost::Ip(IpAddr::V4(ip)) => write!(f, "{ip}:{}", self.port),
            NetworkHost::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
        }
    }
}

impl std::str::FromStr for NetworkTarget {
    type Err = NetworkAllowError;

    fn from_str(entry: &str) -> Result<Self, Self::Err> {
        parse_network_allow(entry)
    }
}

/// Why a `network.allow` entry is not `host:port`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetworkAllowError {
    /// An empty entry.
    #[error("an empty entry")]
    Empty,
    /// White space in the entry.
    #[error("'{0}' contains white space")]
    WhiteSpace(String),
    /// `https://…`.
    #[error("'{0}' has a scheme; write only host:port")]
    Scheme(String),
    /// `host:port/path`.
    #[error("'{0}' has a path; write only host:port")]
    Path(String),
    /// No `:port`.
    #[error("'{0}' has no port; write host:port, e.g. {0}:443")]
    NoPort(String),
    /// A port that is not 1 to 65535.
    #[error("'{entry}': port '{port}' is not a number from 1 to 65535")]
    Port {
        /// The entry.
        entry: String,
        /// The port as written.
        port: String,
    },
    /// An IPv6 address without brackets (`::1:9000`).
    #[error("'{0}': an IPv6 address must be in brackets, e.g. [::1]:9000")]
    UnbracketedIpv6(String),
    /// Something in brackets that is not an IPv6 address.
    #[error("'{0}': the part in brackets is not an IPv6 address")]
    Ipv6(String),
    /// Digits and dots that are not an IPv4 address (`300.1.1.1`).
    #[error("'{0}': the host is not a valid IPv4 address")]
    Ipv4(String),
    /// A host name that is not one (`*.example.com`, `a_b`, `-x`).
    #[error(
        "'{0}': the host is not a host name (letters, digits and '-' in dot-separated labels), an IPv4 address or a bracketed IPv6 address"
    )]
    Host(String),
}

/// Parses a `network.allow` entry: `host:port` where the host is a host
/// name (labels of letters, digits and `-`, not starting or ending with
/// `-`, at most 63 characters each and 253 in all), an IPv4 address, or an
/// IPv6 address in brackets; the port is 1 to 65535. No scheme, no path, no
/// wildcard.
pub fn parse_network_allow(entry: &str) -> Result<NetworkTarget, NetworkAllowError> {
    let owned = || entry.to_owned();
    if entry.is_empty() {
        return Err(NetworkAllowError::Empty);
    }
    if entry.chars().any(char::is_whitespace) {
        return Err(NetworkAllowError::WhiteSpace(owned()));
    }
    if entry.contains("://") {
        return Err(NetworkAllowError::Scheme(owned()));
    }
    if entry.contains(['/', '?', '#']) {
        return Err(NetworkAllowError::Path(owned()));
    }
    let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
        let Some((inside, after)) = rest.split_once(']') else {
            return Err(NetworkAllowError::Ipv6(owned()));
        };
        let ip: Ipv6Addr = inside.parse().map_err(|_| NetworkAllowError::Ipv6(owned()))?;
        let Some(port) = after.strip_prefix(':') else {
            return Err(if after.is_empty() {
                NetworkAllowError::NoPort(owned())
            } else {
                NetworkAllowError::Host(owned())
            });
        };
        (NetworkHost::Ip(IpAddr::V6(ip)), port)
    } else {
        let Some((host, port)) = entry.rsplit_once(':') else {
            return Err(NetworkAllowError::NoPort(owned()));
        };
        if host.contains(':') {
            // `::1:9000`, `fe80::1:443`: the port cannot be told from the address.
            return Err(if host.parse::<Ipv6Addr>().is_ok() || entry.parse::<Ipv6Addr>().is_ok() {
                NetworkAllowError::UnbracketedIpv6(owned())
            } else {
                NetworkAllowError::Host(owned())
            });
        }
        (parse_host(host).ok_or_else(|| host_error(entry, host))?, port)
    };
    let port = parse_port(port).ok_or_else(|| NetworkAllowError::Port { entry: owned(), port: port.to_owned() })?;
    Ok(NetworkTarget { host, port })
}

/// A port as written in an entry: 1 to 65535, digits only (no sign, no
/// leading `+`).
fn parse_port(port: &str) -> Option<u16> {
    // At most five digits, as the sandbox's proxy reads a port.
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    port.parse::<u16>().ok().filter(|port| *port != 0)
}

/// A host name or an IPv4 address.
fn parse_host(host: &str) -> Option<NetworkHost> {
    // A fully qualified name's trailing dot (`example.com.`) is the same
    // host, as the sandbox's proxy reads it.
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.is_empty() || host.len() > 253 {
        return None;
    }
    if host.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        // All digits and dots: an IPv4 address or nothing (a host name's
        // last label is never all digits).
        return host.parse::<Ipv4Addr>().ok().map(|ip| NetworkHost::Ip(IpAddr::V4(ip)));
    }
    let labels_ok = host.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    });
    let last_numeric = host.rsplit('.').next().is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()));
    (labels_ok && !last_numeric).then(|| NetworkHost::Name(host.to_ascii_lowercase()))
}

fn host_error(entry: &str, host: &str) -> NetworkAllowError {
    if !host.is_empty() && host.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        NetworkAllowError::Ipv4(entry.to_owned())
    } else {
        NetworkAllowError::Host(entry.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(entry: &str) -> Result<String, NetworkAllowError> {
        parse_network_allow(entry).map(|target| target.to_string())
    }

    #[test]
    fn allow_entries_of_every_host_form_parse() {
        assert_eq!(target("api.example.com:443"), Ok("api.example.com:443".to_owned()));
        assert_eq!(target("API.Example.COM:443"), Ok("api.example.com:443".to_owned()), "names in lower case");
        assert_eq!(target("localhost:8080"), Ok("localhost:8080".to_owned()));
        assert_eq!(target("127.0.0.1:8080"), Ok("127.0.0.1:8080".to_owned()));
        assert_eq!(target("[::1]:9000"), Ok("[::1]:9000".to_owned()));
        assert_eq!(target("[2001:db8::1]:65535"), Ok("[2001:db8::1]:65535".to_owned()));
        assert_eq!(target("x-1.b2:1"), Ok("x-1.b2:1".to_owned()));
        let Ok(parsed) = parse_network_allow("10.0.0.2:22") else { panic!("10.0.0.2:22") };
        assert_eq!(parsed, NetworkTarget { host: NetworkHost::Ip(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))), port: 22 });
    }

    #[test]
    fn allow_entries_that_are_not_host_port_are_refused_saying_why() {
        type Expected = fn(&NetworkAllowError) -> bool;
        let cases: [(&str, Expected); 20] = [
            ("", |e| matches!(e, NetworkAllowError::Empty)),
            ("api.example.com", |e| matches!(e, NetworkAllowError::NoPort(_))),
            ("https://api.example.com:443", |e| matches!(e, NetworkAllowError::Scheme(_))),
            ("api.example.com:443/v1", |e| matches!(e, NetworkAllowError::Path(_))),
            ("api.example.com:443?x", |e| matches!(e, NetworkAllowError::Path(_))),
            ("api.example.com:0", |e| matches!(e, NetworkAllowError::Port { .. })),
            ("api.example.com:65536", |e| matches!(e, NetworkAllowError::Port { .. })),
            ("api.example.com:+443", |e| matches!(e, NetworkAllowError::Port { .. })),
            ("api.example.com:", |e| matches!(e, NetworkAllowError::Port { .. })),
            ("api.example.com:https", |e| matches!(e, NetworkAllowError::Port { .. })),
            ("::1:9000", |e| matches!(e, NetworkAllowError::UnbracketedIpv6(_))),
            ("[::1]", |e| matches!(e, NetworkAllowError::NoPort(_))),
            ("[::1:9000", |e| matches!(e, NetworkAllowError::Ipv6(_))),
            ("[not-v6]:9000", |e| matches!(e, NetworkAllowError::Ipv6(_))),
            ("300.1.1.1:80", |e| matches!(e, NetworkAllowError::Ipv4(_))),
            ("*.example.com:443", |e| matches!(e, NetworkAllowError::Host(_))),
            ("a_b.example.com:443", |e| matches!(e, NetworkAllowError::Host(_))),
            ("-x.example.com:443", |e| matches!(e, NetworkAllowError::Host(_))),
            (":443", |e| matches!(e, NetworkAllowError::Host(_))),
            ("api .example.com:443", |e| matches!(e, NetworkAllowError::WhiteSpace(_))),
        ];
        for (entry, expected) in cases {
            match parse_network_allow(entry) {
                Err(error) => assert!(expected(&error), "{entry:?}: {error:?}"),
                Ok(target) => panic!("{entry:?} was accepted as {target}"),
            }
        }
        let long_label = format!("{}.com:443", "a".repeat(64));
        assert!(matches!(parse_network_allow(&long_label), Err(NetworkAllowError::Host(_))));
        assert!(matches!(parse_network_allow("example.123:443"), Err(NetworkAllowError::Host(_))));
    }

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
}
