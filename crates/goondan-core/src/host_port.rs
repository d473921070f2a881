//! `host:port`: the one grammar of goondan-rs for a host and a port.
//!
//! `spec.sandbox.network.allow` entries are written in it, `gdn validate`
//! checks them with it, and the sandbox's network proxy reads both the list
//! and each `CONNECT`/`http://` request with it — one reading, so a bundle
//! that validates is enforced as it was validated.
//!
//! The host is a host name (labels of letters, digits and `-`, not starting
//! or ending with `-`, at most 63 characters each and 253 in all, the last
//! not all digits; lower-cased, a trailing dot dropped), an IPv4 address, or
//! an IPv6 address in brackets (an IPv4-mapped one read as the IPv4
//! address); the port is 1 to 65535 in at most five digits. No scheme, no
//! path, no user, no wildcard.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::address::canonical;

/// The host of a [`HostPort`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A host name, in lower case, without a trailing dot.
    Name(String),
    /// An address (an IPv4-mapped IPv6 address as IPv4).
    Ip(IpAddr),
}

/// A host and a port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    /// The host.
    pub host: Host,
    /// The port, 1 to 65535.
    pub port: u16,
}

impl fmt::Display for HostPort {
    /// `host:port`, an IPv6 address in brackets: text [`HostPort::parse`]
    /// reads back as the same value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Name(name) => write!(f, "{name}:{}", self.port),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            Host::Ip(ip) => write!(f, "{ip}:{}", self.port),
        }
    }
}

impl std::str::FromStr for HostPort {
    type Err = HostPortError;

    /// [`HostPort::parse`] with the port required.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text, None)
    }
}

/// Why a text is not `host:port`. The text is quoted without its control
/// characters, so an error is always one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostPortError {
    /// An empty text.
    #[error("an empty entry; write host:port")]
    Empty,
    /// White space in the text.
    #[error("'{0}' contains white space; write only host:port")]
    WhiteSpace(String),
    /// `https://…`.
    #[error("'{0}' has a scheme; write only host:port")]
    Scheme(String),
    /// `host:port/path`, `?query`, `#fragment`.
    #[error("'{0}' has a path; write only host:port")]
    Path(String),
    /// No `:port` (and no default port).
    #[error("'{0}' has no port; write host:port, e.g. {0}:443")]
    NoPort(String),
    /// A port that is not 1 to 65535.
    #[error("'{entry}': port '{port}' is not a number from 1 to 65535")]
    Port {
        /// The text.
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
    /// Digits and dots that are not an IPv4 address (`300.1.1.1`, `127.1`).
    #[error("'{0}': the host is not a valid IPv4 address")]
    Ipv4(String),
    /// A host name that is not one (`*.example.com`, `a_b`, `-x`, `user@x`).
    #[error(
        "'{0}': the host is not a host name (letters, digits and '-' in dot-separated labels), an IPv4 address or a bracketed IPv6 address"
    )]
    Host(String),
}

impl HostPort {
    /// Parses `host:port`. With `default_port`, the port may be left out
    /// (an `http://` request's authority); without, it is required.
    pub fn parse(text: &str, default_port: Option<u16>) -> Result<Self, HostPortError> {
        let quoted = || text.chars().filter(|c| !c.is_control()).collect::<String>();
        if text.is_empty() {
            return Err(HostPortError::Empty);
        }
        if text.chars().any(char::is_whitespace) {
            return Err(HostPortError::WhiteSpace(quoted()));
        }
        if text.contains("://") {
            return Err(HostPortError::Scheme(quoted()));
        }
        if text.contains(['/', '?', '#']) {
            return Err(HostPortError::Path(quoted()));
        }
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let Some((inside, after)) = rest.split_once(']') else {
                return Err(HostPortError::Ipv6(quoted()));
            };
            let ip: Ipv6Addr = inside.parse().map_err(|_| HostPortError::Ipv6(quoted()))?;
            let port = match after.strip_prefix(':') {
                Some(port) => Some(port),
                None if after.is_empty() => None,
                None => return Err(HostPortError::Host(quoted())),
            };
            (Host::Ip(canonical(IpAddr::V6(ip))), port)
        } else {
            let (host, port) = match text.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (text, None),
            };
            if host.contains(':') {
                // `::1:9000`, `fe80::1:443`: the port cannot be told from the address.
                return Err(if host.parse::<Ipv6Addr>().is_ok() || text.parse::<Ipv6Addr>().is_ok() {
                    HostPortError::UnbracketedIpv6(quoted())
                } else {
                    HostPortError::Host(quoted())
                });
            }
            (parse_host(host).ok_or_else(|| host_error(host, quoted()))?, port)
        };
        let port = match port {
            Some(port) => parse_port(port).ok_or_else(|| HostPortError::Port {
                entry: quoted(),
                port: port.chars().filter(|c| !c.is_control()).collect(),
            })?,
            None => default_port.ok_or_else(|| HostPortError::NoPort(quoted()))?,
        };
        Ok(Self { host, port })
    }
}

/// A port as written: 1 to 65535, digits only (no sign), at most five.
fn parse_port(port: &str) -> Option<u16> {
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    port.parse::<u16>().ok().filter(|port| *port != 0)
}

/// A host name or an IPv4 address.
fn parse_host(host: &str) -> Option<Host> {
    // A fully qualified name's trailing dot (`example.com.`) is the same host.
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.is_empty() || host.len() > 253 {
        return None;
    }
    if host.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        // All digits and dots: an IPv4 address or nothing (a host name's
        // last label is never all digits, and `127.1` is what resolvers
        // read as an odd address).
        return host.parse::<Ipv4Addr>().ok().map(|ip| Host::Ip(IpAddr::V4(ip)));
    }
    let labels_ok = host.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    });
    let last_numeric = host.rsplit('.').next().is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()));
    (labels_ok && !last_numeric).then(|| Host::Name(host.to_ascii_lowercase()))
}

fn host_error(host: &str, quoted: String) -> HostPortError {
    if !host.is_empty() && host.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        HostPortError::Ipv4(quoted)
    } else {
        HostPortError::Host(quoted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rendered(text: &str) -> Result<String, HostPortError> {
        HostPort::parse(text, None).map(|target| target.to_string())
    }

    #[test]
    fn every_host_form_parses_and_renders_as_it_reads_back() {
        for (text, expected) in [
            ("api.example.com:443", "api.example.com:443"),
            ("API.Example.COM:443", "api.example.com:443"),
            ("example.com.:80", "example.com:80"),
            ("localhost:8080", "localhost:8080"),
            ("127.0.0.1:8080", "127.0.0.1:8080"),
            ("[::1]:9000", "[::1]:9000"),
            ("[2001:db8::1]:65535", "[2001:db8::1]:65535"),
            ("[::ffff:127.0.0.1]:80", "127.0.0.1:80"),
            ("x-1.b2:1", "x-1.b2:1"),
            ("example.com:00080", "example.com:80"),
        ] {
            assert_eq!(rendered(text), Ok(expected.to_owned()), "{text}");
            assert_eq!(rendered(expected), Ok(expected.to_owned()), "{expected} reads back");
        }
        assert_eq!(
            HostPort::parse("10.0.0.2:22", None),
            Ok(HostPort { host: Host::Ip(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2))), port: 22 })
        );
        assert_eq!("a.b:1".parse::<HostPort>().map(|t| t.port), Ok(1));
    }

    #[test]
    fn a_default_port_fills_in_only_a_missing_one() {
        assert_eq!(HostPort::parse("example.com", Some(80)).map(|t| t.to_string()), Ok("example.com:80".to_owned()));
        assert_eq!(HostPort::parse("[::1]", Some(80)).map(|t| t.to_string()), Ok("[::1]:80".to_owned()));
        assert_eq!(HostPort::parse("example.com:8080", Some(80)).map(|t| t.port), Ok(8080));
        assert!(matches!(HostPort::parse("example.com:", Some(80)), Err(HostPortError::Port { .. })));
    }

    #[test]
    fn what_is_not_host_port_is_refused_saying_why_on_one_line() {
        type Expected = fn(&HostPortError) -> bool;
        let cases: [(&str, Expected); 27] = [
            ("", |e| matches!(e, HostPortError::Empty)),
            ("api.example.com", |e| matches!(e, HostPortError::NoPort(_))),
            ("https://api.example.com:443", |e| matches!(e, HostPortError::Scheme(_))),
            ("api.example.com:443/v1", |e| matches!(e, HostPortError::Path(_))),
            ("api.example.com:443?x", |e| matches!(e, HostPortError::Path(_))),
            ("api.example.com:0", |e| matches!(e, HostPortError::Port { .. })),
            ("api.example.com:65536", |e| matches!(e, HostPortError::Port { .. })),
            ("api.example.com:+443", |e| matches!(e, HostPortError::Port { .. })),
            ("api.example.com:000080", |e| matches!(e, HostPortError::Port { .. })),
            ("api.example.com:", |e| matches!(e, HostPortError::Port { .. })),
            ("api.example.com:https", |e| matches!(e, HostPortError::Port { .. })),
            ("::1:9000", |e| matches!(e, HostPortError::UnbracketedIpv6(_))),
            ("[::1]", |e| matches!(e, HostPortError::NoPort(_))),
            ("[::1:9000", |e| matches!(e, HostPortError::Ipv6(_))),
            ("[not-v6]:9000", |e| matches!(e, HostPortError::Ipv6(_))),
            ("[::1]x:80", |e| matches!(e, HostPortError::Host(_))),
            ("300.1.1.1:80", |e| matches!(e, HostPortError::Ipv4(_))),
            ("127.1:80", |e| matches!(e, HostPortError::Ipv4(_))),
            ("*.example.com:443", |e| matches!(e, HostPortError::Host(_))),
            ("a_b.example.com:443", |e| matches!(e, HostPortError::Host(_))),
            ("-x.example.com:443", |e| matches!(e, HostPortError::Host(_))),
            ("a..b:80", |e| matches!(e, HostPortError::Host(_))),
            ("example.123:443", |e| matches!(e, HostPortError::Host(_))),
            ("user@example.com:80", |e| matches!(e, HostPortError::Host(_))),
            (":443", |e| matches!(e, HostPortError::Host(_))),
            ("api .example.com:443", |e| matches!(e, HostPortError::WhiteSpace(_))),
            ("bad\r\nHost: x:80", |e| matches!(e, HostPortError::WhiteSpace(_))),
        ];
        for (text, expected) in cases {
            match HostPort::parse(text, None) {
                Err(error) => {
                    assert!(expected(&error), "{text:?}: {error:?}");
                    assert!(!error.to_string().contains(['\r', '\n']), "{error}");
                }
                Ok(target) => panic!("{text:?} was accepted as {target}"),
            }
        }
        let long_label = format!("{}.com:443", "a".repeat(64));
        assert!(matches!(HostPort::parse(&long_label, None), Err(HostPortError::Host(_))));
        assert!(matches!(HostPort::parse("a.b:\u{1}1", None), Err(HostPortError::Port { .. })));
    }
}
