//! `spec.sandbox.network.allow`: the `host:port` pairs a confined command
//! may connect to, and the check made on the address actually connected to.
//!
//! A request names a host and a port. It is allowed when that pair is on the
//! list, written the same way (a name matches a name, an address an
//! address: `localhost:80` does not allow `127.0.0.1:80`, nor the reverse).
//! The proxy then resolves the host itself and connects to an address it
//! checked, never resolving again:
//!
//! - an address (`10.0.0.2:5432`, `[::1]:8080`) is connected to as written,
//!   whatever range it is in: the operator named it;
//! - `localhost` (and `*.localhost`) is the loopback addresses, without
//!   asking any resolver;
//! - any other name may reach public addresses only (the SSRF guard's rule,
//!   `goondan_core::address`): a DNS answer that points a public name at
//!   loopback, a private network or the cloud metadata address (rebinding)
//!   is refused. An internal host is allowed by its address.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};

use goondan_core::address::{canonical, non_public_reason};

/// The host of a [`Target`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A host name, lower case, without a trailing dot.
    Name(String),
    /// An address (IPv4-mapped IPv6 addresses as IPv4).
    Ip(IpAddr),
}

/// A host and a port: one `network.allow` entry, or what a request asks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    /// The host.
    pub host: Host,
    /// The port, 1 to 65535.
    pub port: u16,
}

impl fmt::Display for Target {
    /// `host:port`, an IPv6 address in brackets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Name(name) => write!(f, "{name}:{}", self.port),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            Host::Ip(ip) => write!(f, "{ip}:{}", self.port),
        }
    }
}

/// Why a text is not a `host:port` pair.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{entry}` is not a network.allow entry: {why} (write host:port — a host name, an IPv4 address or an IPv6 \
     address in brackets — e.g. api.example.com:443, 10.0.0.2:5432, [::1]:8080)"
)]
pub struct EntryError {
    entry: String,
    why: &'static str,
}

impl Target {
    /// Parses `host:port` (as `network.allow` entries and `CONNECT` requests
    /// write it). With `default_port`, the port may be left out.
    pub fn parse(text: &str, default_port: Option<u16>) -> Result<Self, EntryError> {
        let error = |why| EntryError { entry: text.chars().filter(|c| !c.is_control()).collect(), why };
        if text.is_empty() {
            return Err(error("it is empty"));
        }
        if text.contains("://") {
            return Err(error("it has a scheme"));
        }
        if text.contains(['/', '?', '#', '@']) || text.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(error("it is not just a host and a port"));
        }
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let (inside, after) = rest.split_once(']').ok_or_else(|| error("its IPv6 address has no closing ]"))?;
            let ip: Ipv6Addr = inside.parse().map_err(|_| error("it has no valid IPv6 address in brackets"))?;
            let port = match after.strip_prefix(':') {
                Some(port) => Some(port),
                None if after.is_empty() => None,
                None => return Err(error("something follows the IPv6 address")),
            };
            (Host::Ip(canonical(IpAddr::V6(ip))), port)
        } else {
            let (host, port) = match text.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (text, None),
            };
            if host.contains(':') {
                return Err(error("an IPv6 address must be written in brackets"));
            }
            (parse_host(host).ok_or_else(|| error("its host is not a host name or an IPv4 address"))?, port)
        };
        let port = match port {
            Some(port) => parse_port(port).ok_or_else(|| error("its port is not a number from 1 to 65535"))?,
            None => default_port.ok_or_else(|| error("it has no port"))?,
        };
        Ok(Self { host, port })
    }
}

fn parse_port(text: &str) -> Option<u16> {
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u16>().ok().filter(|port| *port != 0)
}

/// A host name (labels of letters, digits and `-`, not starting or ending
/// with `-`; the last one not all digits) or an IPv4 address.
fn parse_host(host: &str) -> Option<Host> {
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.is_empty() || host.len() > 253 {
        return None;
    }
    if let Ok(ip) = host.parse::<Ipv4Addr>() {
        return Some(Host::Ip(IpAddr::V4(ip)));
    }
    let labels_ok = host.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    });
    // `127.1`, `10.0.0.300`: what resolvers read as (odd) addresses.
    let last_numeric = host.rsplit('.').next().is_some_and(|label| label.bytes().all(|b| b.is_ascii_digit()));
    (labels_ok && !last_numeric).then(|| Host::Name(host.to_ascii_lowercase()))
}

/// Why a request was not let through, as the one line the client is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The host and port are not on the list.
    NotListed {
        /// What was asked for.
        target: String,
        /// The list, as written.
        allowed: String,
    },
    /// A listed name resolved to addresses a name may not reach.
    NonPublic {
        /// What was asked for.
        target: String,
        /// The addresses and their ranges.
        addresses: String,
    },
    /// The name did not resolve.
    Unresolved {
        /// What was asked for.
        target: String,
        /// The resolver's words.
        error: String,
    },
}

impl Refused {
    /// The HTTP status a proxy answers with: 403 for the policy, 502 when
    /// the name does not resolve.
    pub fn status(&self) -> u16 {
        match self {
            Self::NotListed { .. } | Self::NonPublic { .. } => 403,
            Self::Unresolved { .. } => 502,
        }
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotListed { target, allowed } => write!(
                f,
                "goondan sandbox: {target} is not in the agent's spec.sandbox.network.allow ({allowed}); \
                 connections go only to the hosts listed there"
            ),
            Self::NonPublic { target, addresses } => write!(
                f,
                "goondan sandbox: {target} resolved only to non-public addresses ({addresses}); a host name in \
                 spec.sandbox.network.allow may reach public addresses only — list the address itself to reach it"
            ),
            Self::Unresolved { target, error } => write!(f, "goondan sandbox: cannot resolve {target}: {error}"),
        }
    }
}

/// The parsed `network.allow` entries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    targets: Vec<Target>,
}

impl AllowList {
    /// Parses every entry; the first that is not `host:port` is the error.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, EntryError> {
        let targets = entries.iter().map(|entry| Target::parse(entry.as_ref(), None)).collect::<Result<_, _>>()?;
        Ok(Self { targets })
    }

    /// The entries.
    pub fn targets(&self) -> &[Target] {
        &self.targets
    }

    /// Whether nothing is allowed.
    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }

    /// Whether `target` is on the list, as written.
    pub fn contains(&self, target: &Target) -> bool {
        self.targets.contains(target)
    }

    /// The addresses to connect to for `target`, in order, each one checked:
    /// `target` must be on the list, and a name other than `localhost` may
    /// reach public addresses only. Resolves with the system resolver.
    pub fn resolve(&self, target: &Target) -> Result<Vec<SocketAddr>, Refused> {
        self.resolve_with(target, |name, port| (name, port).to_socket_addrs().map(Iterator::collect))
    }

    /// [`resolve`](Self::resolve) with the resolver given.
    pub fn resolve_with(
        &self,
        target: &Target,
        resolver: impl FnOnce(&str, u16) -> std::io::Result<Vec<SocketAddr>>,
    ) -> Result<Vec<SocketAddr>, Refused> {
        if !self.contains(target) {
            let allowed = self.targets.iter().map(Target::to_string).collect::<Vec<_>>().join(", ");
            return Err(Refused::NotListed { target: target.to_string(), allowed });
        }
        let port = target.port;
        let name = match &target.host {
            Host::Ip(ip) => return Ok(vec![SocketAddr::new(*ip, port)]),
            Host::Name(name) if name == "localhost" || name.ends_with(".localhost") => {
                return Ok(vec![
                    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port),
                    SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), port),
                ]);
            }
            Host::Name(name) => name,
        };
        let resolved = resolver(name, port)
            .map_err(|error| Refused::Unresolved { target: target.to_string(), error: error.to_string() })?;
        let (public, refused): (Vec<SocketAddr>, Vec<SocketAddr>) =
            resolved.into_iter().partition(|addr| non_public_reason(canonical(addr.ip())).is_none());
        if !public.is_empty() {
            if !refused.is_empty() {
                tracing::debug!("{target}: dropped non-public addresses {refused:?}");
            }
            return Ok(public);
        }
        if refused.is_empty() {
            return Err(Refused::Unresolved { target: target.to_string(), error: "no address".to_owned() });
        }
        let addresses = refused
            .iter()
            .map(|addr| {
                let ip = canonical(addr.ip());
                format!("{ip}: {}", non_public_reason(ip).unwrap_or("not public"))
            })
            .collect::<Vec<_>>()
            .join("; ");
        Err(Refused::NonPublic { target: target.to_string(), addresses })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(text: &str) -> Target {
        Target::parse(text, None).unwrap_or_else(|error| panic!("{text}: {error}"))
    }

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap_or_else(|error| panic!("{text}: {error}"))
    }

    #[test]
    fn entries_parse_as_written() {
        assert_eq!(target("API.Example.com:443").host, Host::Name("api.example.com".into()));
        assert_eq!(target("example.com.:443").to_string(), "example.com:443");
        assert_eq!(target("10.0.0.2:5432").host, Host::Ip(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))));
        assert_eq!(target("[::1]:8080").to_string(), "[::1]:8080");
        assert_eq!(target("[::ffff:127.0.0.1]:80").to_string(), "127.0.0.1:80");
        assert_eq!(Target::parse("example.com", Some(80)).map(|t| t.port), Ok(80));
        assert_eq!(Target::parse("[::1]", Some(80)).map(|t| t.to_string()), Ok("[::1]:80".to_owned()));
        for bad in [
            "",
            "example.com",
            "example.com:0",
            "example.com:65536",
            "example.com:+1",
            "http://example.com:80",
            "example.com:80/x",
            "user@example.com:80",
            "::1:80",
            "[::1]x:80",
            "[zz]:80",
            "127.1:80",
            "10.0.0.300:80",
            "-bad.example:80",
            "exa mple.com:80",
            "bad\r\nHost: x:80",
        ] {
            let Err(error) = Target::parse(bad, None) else { panic!("{bad:?} parsed") };
            assert!(error.to_string().contains("host:port"), "{error}");
            assert!(!error.to_string().contains('\n'), "{error}");
        }
    }

    #[test]
    fn only_listed_pairs_pass_and_names_reach_only_public_addresses() {
        let Ok(list) = AllowList::parse(&["api.example.com:443", "127.0.0.1:8080", "localhost:9000", "[::1]:7000"])
        else {
            panic!("the list does not parse")
        };
        let public = |_: &str, port| Ok(vec![SocketAddr::new(IpAddr::V4(Ipv4Addr::new(93, 184, 216, 34)), port)]);
        assert_eq!(list.resolve_with(&target("api.example.com:443"), public), Ok(vec![addr("93.184.216.34:443")]));
        assert_eq!(list.resolve_with(&target("127.0.0.1:8080"), public), Ok(vec![addr("127.0.0.1:8080")]));
        assert_eq!(list.resolve_with(&target("[::1]:7000"), public), Ok(vec![addr("[::1]:7000")]));
        let Ok(local) = list.resolve_with(&target("localhost:9000"), |_, _| panic!("localhost was resolved")) else {
            panic!("localhost refused")
        };
        assert!(local.iter().all(|a| a.ip().is_loopback() && a.port() == 9000));

        for asked in ["api.example.com:80", "127.0.0.1:8081", "localhost:8080", "[::1]:8080"] {
            let Err(refused) = list.resolve_with(&target(asked), public) else { panic!("{asked} allowed") };
            assert_eq!(refused.status(), 403);
            let line = refused.to_string();
            assert!(line.contains(asked) && line.contains("spec.sandbox.network.allow"), "{line}");
        }

        // Rebinding: the listed public name answers with loopback, private
        // and metadata addresses; only its public address is kept.
        let rebinding = |_: &str, port| {
            Ok(["127.0.0.1", "10.1.2.3", "169.254.169.254", "::ffff:192.168.1.1", "93.184.216.34"]
                .into_iter()
                .map(|ip| SocketAddr::new(ip.parse().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), port))
                .collect())
        };
        assert_eq!(list.resolve_with(&target("api.example.com:443"), rebinding), Ok(vec![addr("93.184.216.34:443")]));
        let loopback_only = |_: &str, port| Ok(vec![SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)]);
        let Err(refused) = list.resolve_with(&target("api.example.com:443"), loopback_only) else {
            panic!("rebinding to loopback allowed")
        };
        assert_eq!(refused.status(), 403);
        assert!(refused.to_string().contains("127.0.0.1: a loopback address"), "{refused}");
        let Err(refused) =
            list.resolve_with(&target("api.example.com:443"), |_, _| Err(std::io::ErrorKind::NotFound.into()))
        else {
            panic!("an unresolved name allowed")
        };
        assert_eq!(refused.status(), 502);
    }
}
