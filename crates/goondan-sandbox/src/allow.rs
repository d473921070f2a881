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
use goondan_core::host_port::{Host, HostPort, HostPortError};

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
    targets: Vec<HostPort>,
}

impl AllowList {
    /// Parses every entry (`goondan_core::host_port`, the grammar `gdn
    /// validate` checks them with); the first that is not `host:port` is
    /// the error.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, HostPortError> {
        let targets = entries.iter().map(|entry| HostPort::parse(entry.as_ref(), None)).collect::<Result<_, _>>()?;
        Ok(Self { targets })
    }

    /// The entries.
    pub fn targets(&self) -> &[HostPort] {
        &self.targets
    }

    /// Whether nothing is allowed.
    pub fn is_empty(&self) -> bool {
        self.targets.is_empty()
    }

    /// Whether `target` is on the list, as written.
    pub fn contains(&self, target: &HostPort) -> bool {
        self.targets.contains(target)
    }

    /// The addresses to connect to for `target`, in order, each one checked:
    /// `target` must be on the list, and a name other than `localhost` may
    /// reach public addresses only. Resolves with the system resolver.
    pub fn resolve(&self, target: &HostPort) -> Result<Vec<SocketAddr>, Refused> {
        self.resolve_with(target, |name, port| (name, port).to_socket_addrs().map(Iterator::collect))
    }

    /// [`resolve`](Self::resolve) with the resolver given.
    pub fn resolve_with(
        &self,
        target: &HostPort,
        resolver: impl FnOnce(&str, u16) -> std::io::Result<Vec<SocketAddr>>,
    ) -> Result<Vec<SocketAddr>, Refused> {
        if !self.contains(target) {
            let allowed = self.targets.iter().map(HostPort::to_string).collect::<Vec<_>>().join(", ");
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

    fn target(text: &str) -> HostPort {
        HostPort::parse(text, None).unwrap_or_else(|error| panic!("{text}: {error}"))
    }

    fn addr(text: &str) -> SocketAddr {
        text.parse().unwrap_or_else(|error| panic!("{text}: {error}"))
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
