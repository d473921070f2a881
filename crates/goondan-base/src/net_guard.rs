//! The SSRF guard for URLs a model chooses.
//!
//! A model that can fetch any URL can be talked (by a prompt injection in a
//! page it read) into fetching `http://169.254.169.254/latest/meta-data`, the
//! operator's router, or a database console on `127.0.0.1`. The guard refuses
//! every address that is not public, unless the operator allowed it with
//! `GOONDAN_HTTP_ALLOW`:
//!
//! - [`is_public`] / [`non_public_reason`] classify one address: loopback,
//!   private, link-local (the cloud metadata address included), unique-local,
//!   CGNAT, documentation, benchmarking, multicast, broadcast and reserved
//!   ranges are not public, nor are IPv6 forms that embed one of them
//!   (IPv4-mapped and -compatible, NAT64, 6to4).
//! - [`AllowList`] holds the operator's exceptions: host names (`*.corp` for
//!   a whole domain), IP addresses and CIDR ranges.
//! - [`NetGuard::client_builder`] makes a `reqwest` client whose DNS resolver
//!   hands the connector only the addresses it checked, so there is no window
//!   between the check and the connection for DNS rebinding; and whose
//!   redirect policy checks every hop's scheme and IP literal and stops after
//!   [`MAX_REDIRECTS`].
//! - IP-literal URLs never reach a resolver, so callers check the first URL
//!   with [`NetGuard::check_url`] before sending anything.
//!
//! A refusal is a [`GuardError`]; [`guard_error_in`] finds it inside the error
//! chain of a failed request and [`GuardError::to_failure`] turns it into the
//! tool error the model sees.

use std::error::Error as StdError;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use goondan_core::codes::{E_PROTOCOL_NOT_ALLOWED, E_SSRF_BLOCKED, E_TOO_MANY_REDIRECTS};
use goondan_tools::ToolFailure;
use ipnet::IpNet;
use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::redirect::{Attempt, Policy};

use crate::BaseSettings;
use crate::settings::HTTP_ALLOW_VAR;

/// How many redirects a request follows before giving up.
pub const MAX_REDIRECTS: usize = 10;

/// Why `ip` is not a public address, or `None` if it is.
///
/// IPv6 addresses that embed an IPv4 address (IPv4-mapped `::ffff:a.b.c.d`,
/// IPv4-compatible `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`, 6to4
/// `2002:aabb:ccdd::`) are judged by the IPv4 address, since that is where a
/// connection to them ends up.
pub fn non_public_reason(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_reason(v4),
        IpAddr::V6(v6) => v6_reason(v6),
    }
}

/// True if `ip` is a public (globally routable unicast) address.
pub fn is_public(ip: IpAddr) -> bool {
    non_public_reason(ip).is_none()
}

fn v4_reason(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    let reason = match (a, b, c) {
        (0, _, _) => "the unspecified / \"this network\" range (0.0.0.0/8)",
        (10, _, _) => "a private address (10.0.0.0/8)",
        (100, 64..=127, _) => "a shared (carrier-grade NAT) address (100.64.0.0/10)",
        (127, _, _) => "a loopback address (127.0.0.0/8)",
        (169, 254, _) => "a link-local address (169.254.0.0/16, incl. the cloud metadata service)",
        (172, 16..=31, _) => "a private address (172.16.0.0/12)",
        (192, 0, 0) => "an IETF protocol assignment (192.0.0.0/24)",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "a documentation address (TEST-NET)",
        (192, 88, 99) => "a 6to4 relay anycast address (192.88.99.0/24)",
        (192, 168, _) => "a private address (192.168.0.0/16)",
        (198, 18..=19, _) => "a benchmarking address (198.18.0.0/15)",
        (224..=239, _, _) => "a multicast address (224.0.0.0/4)",
        _ if ip.is_broadcast() => "the broadcast address",
        (240..=255, _, _) => "a reserved address (240.0.0.0/4)",
        _ => return None,
    };
    Some(reason)
}

fn v6_reason(ip: Ipv6Addr) -> Option<&'static str> {
    // Before the embedded forms: `::` and `::1` also read as IPv4-compatible.
    if ip.is_unspecified() {
        return Some("the unspecified address (::)");
    }
    if ip.is_loopback() {
        return Some("the loopback address (::1)");
    }
    if let Some(v4) = embedded_v4(ip) {
        return v4_reason(v4);
    }
    let segments = ip.segments();
    let reason = match segments[0] {
        0xff00..=0xffff => "a multicast address (ff00::/8)",
        0xfe80..=0xfebf => "a link-local address (fe80::/10)",
        0xfec0..=0xfeff => "a site-local address (fec0::/10)",
        0xfc00..=0xfdff => "a unique-local address (fc00::/7)",
        0x0064 if segments[1] == 0xff9b && segments[2] == 0x0001 => "a local-use NAT64 address (64:ff9b:1::/48)",
        0x0100 if segments[1..4] == [0, 0, 0] => "a discard-only address (100::/64)",
        0x2001 if segments[1] == 0x0db8 => "a documentation address (2001:db8::/32)",
        0x2001 if segments[1] < 0x0200 => "an IETF protocol assignment (2001::/23, incl. Teredo)",
        0x3fff if segments[1] < 0x1000 => "a documentation address (3fff::/20)",
        0x5f00 => "a segment-routing address (5f00::/16)",
        // Only 2000::/3 is allocated for global unicast; everything else is
        // reserved by IANA.
        0x2000..=0x3fff => return None,
        _ => "a reserved IPv6 address (outside 2000::/3)",
    };
    Some(reason)
}

/// The IPv4 address a connection to `ip` really reaches, for the IPv6 forms
/// that embed one.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let low = |hi: u16, lo: u16| {
        let [a, b] = hi.to_be_bytes();
        let [c, d] = lo.to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    };
    match s {
        // IPv4-mapped (::ffff:0:0/96) and the deprecated IPv4-compatible
        // (::/96, which also holds :: and ::1: they map to 0.0.0.0/8).
        [0, 0, 0, 0, 0, 0xffff, hi, lo] | [0, 0, 0, 0, 0, 0, hi, lo] => Some(low(hi, lo)),
        // NAT64 well-known prefix (64:ff9b::/96).
        [0x0064, 0xff9b, 0, 0, 0, 0, hi, lo] => Some(low(hi, lo)),
        // 6to4 (2002::/16): the IPv4 address is in bits 16..48.
        [0x2002, hi, lo, ..] => Some(low(hi, lo)),
        _ => None,
    }
}

/// The operator's exceptions to the guard (`GOONDAN_HTTP_ALLOW`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    /// Exact host names, lower-case, without a trailing dot.
    hosts: Vec<String>,
    /// Domain suffixes from `*.example.com` entries, as `.example.com`.
    suffixes: Vec<String>,
    /// Addresses and ranges (a single address is a /32 or /128).
    nets: Vec<IpNet>,
}

impl AllowList {
    /// Parses entries as written in `GOONDAN_HTTP_ALLOW`: host names
    /// (`internal.example`, or `*.corp.example` for every name under it),
    /// IP addresses (`127.0.0.1`, `::1`, `[::1]`) and CIDR ranges
    /// (`10.0.0.0/8`). An entry that is none of these is ignored with a
    /// warning.
    pub fn from_entries<S: AsRef<str>>(entries: &[S]) -> Self {
        let mut list = Self::default();
        for entry in entries {
            let entry = entry.as_ref().trim();
            if entry.is_empty() {
                continue;
            }
            let unbracketed = entry.strip_prefix('[').and_then(|e| e.strip_suffix(']')).unwrap_or(entry);
            if let Ok(ip) = unbracketed.parse::<IpAddr>() {
                list.nets.push(IpNet::from(canonical(ip)));
            } else if entry.contains('/') {
                match entry.parse::<IpNet>() {
                    Ok(net) => list.nets.push(net.trunc()),
                    Err(_) => tracing::warn!("{HTTP_ALLOW_VAR}: ignoring '{entry}', which is not a valid CIDR range"),
                }
            } else if let Some(domain) = entry.strip_prefix("*.") {
                list.suffixes.push(format!(".{}", normalize_host(domain)));
            } else if entry.contains(|c: char| c.is_whitespace() || c == ':' || c == '@') {
                tracing::warn!("{HTTP_ALLOW_VAR}: ignoring '{entry}', which is not a host name, address or range");
            } else {
                list.hosts.push(normalize_host(entry));
            }
        }
        list
    }

    /// True when nothing is allowed beyond public addresses.
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty() && self.suffixes.is_empty() && self.nets.is_empty()
    }

    /// True if the host name `host` is on the list (whatever it resolves to).
    pub fn allows_host(&self, host: &str) -> bool {
        let host = normalize_host(host);
        self.hosts.contains(&host) || self.suffixes.iter().any(|suffix| host.ends_with(suffix.as_str()))
    }

    /// True if the address `ip` is on the list.
    pub fn allows_ip(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.nets.iter().any(|net| net.contains(&ip))
    }
}

/// Lower-case, without the trailing dot of a fully-qualified name.
fn normalize_host(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// IPv4-mapped IPv6 addresses as the IPv4 address they are, so that an
/// allow-list entry `127.0.0.1` also covers `::ffff:127.0.0.1`.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        IpAddr::V4(_) => ip,
    }
}

/// Why the guard refused a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuardError {
    /// The target address is not public and not allowed.
    Blocked {
        /// What was refused: a URL with an IP-literal host, or a host name.
        target: String,
        /// Why: the address and its range, or what the host resolved to.
        detail: String,
    },
    /// The scheme is not http or https.
    Protocol {
        /// The URL with the scheme.
        url: String,
        /// The scheme with its colon, e.g. `file:`.
        protocol: String,
    },
    /// A redirect chain went on for more than [`MAX_REDIRECTS`] hops.
    TooManyRedirects {
        /// The hop that would have exceeded the limit.
        url: String,
    },
}

impl fmt::Display for GuardError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Blocked { target, detail } => {
                write!(f, "refused to connect to {target}: {detail}; non-public addresses are blocked (SSRF guard)")
            }
            Self::Protocol { url, protocol } => {
                write!(f, "Protocol not allowed: {protocol} (in {url}). Only http: and https: are allowed.")
            }
            Self::TooManyRedirects { url } => {
                write!(f, "too many redirects (more than {MAX_REDIRECTS}); stopped before {url}")
            }
        }
    }
}

impl StdError for GuardError {}

impl GuardError {
    /// The error code the model sees.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Blocked { .. } => E_SSRF_BLOCKED,
            Self::Protocol { .. } => E_PROTOCOL_NOT_ALLOWED,
            Self::TooManyRedirects { .. } => E_TOO_MANY_REDIRECTS,
        }
    }

    /// How to recover.
    pub fn suggestion(&self) -> String {
        match self {
            Self::Blocked { .. } => format!(
                "Fetch a public http(s) address instead. If this internal host is meant to be reachable, \
                 the operator can allow it in the {HTTP_ALLOW_VAR} environment variable (comma-separated \
                 host names, IP addresses or CIDR ranges, e.g. 127.0.0.1,10.0.0.0/8,internal.example)."
            ),
            Self::Protocol { .. } => "Use an http:// or https:// URL.".to_owned(),
            Self::TooManyRedirects { .. } => {
                "Check the URL for a redirect loop, or fetch the final URL directly.".to_owned()
            }
        }
    }

    /// The tool failure for this refusal, prefixed with what was being done
    /// (e.g. `GET http://…`).
    pub fn to_failure(&self, context: &str) -> ToolFailure {
        let message = if context.is_empty() { self.to_string() } else { format!("{context}: {self}") };
        ToolFailure::with_code(message, self.code()).suggest(self.suggestion())
    }
}

/// The [`GuardError`] somewhere in `error`'s source chain (a refused DNS
/// answer or redirect surfaces wrapped in `reqwest` and `hyper` errors).
pub fn guard_error_in<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a GuardError> {
    let mut current = Some(error);
    while let Some(err) = current {
        if let Some(found) = err.downcast_ref::<GuardError>() {
            return Some(found);
        }
        current = err.source();
    }
    None
}

/// The SSRF guard: the operator's allow-list and the checks built on it.
#[derive(Debug, Clone, Default)]
pub struct NetGuard {
    allow: Arc<AllowList>,
}

impl NetGuard {
    /// The guard with the operator's `GOONDAN_HTTP_ALLOW` entries.
    pub fn new(settings: &BaseSettings) -> Self {
        Self::with_allow_list(AllowList::from_entries(&settings.http_allow))
    }

    /// The guard with an explicit allow-list.
    pub fn with_allow_list(allow: AllowList) -> Self {
        Self { allow: Arc::new(allow) }
    }

    /// The allow-list.
    pub fn allow_list(&self) -> &AllowList {
        &self.allow
    }

    /// Checks what can be checked before connecting: the scheme, and the
    /// address of an IP-literal host (which no resolver ever sees). Host
    /// names are checked by the client's resolver at connection time.
    pub fn check_url(&self, url: &Url) -> Result<(), GuardError> {
        check_url(&self.allow, url)
    }

    /// True if connecting to `ip` is allowed: it is public or on the list.
    pub fn allows_ip(&self, ip: IpAddr) -> bool {
        is_public(ip) || self.allow.allows_ip(ip)
    }

    /// A `reqwest` client builder (rustls, no proxy) whose resolver returns
    /// only allowed addresses and whose redirect policy checks every hop.
    ///
    /// No proxy is essential: through a proxy the client would connect to the
    /// proxy and the resolver would never see the target.
    pub fn client_builder(&self) -> Result<reqwest::ClientBuilder, rustls::Error> {
        let allow = Arc::clone(&self.allow);
        let policy = Policy::custom(move |attempt: Attempt<'_>| {
            if attempt.previous().len() > MAX_REDIRECTS {
                let url = attempt.url().to_string();
                return attempt.error(GuardError::TooManyRedirects { url });
            }
            match check_url(&allow, attempt.url()) {
                Ok(()) => attempt.follow(),
                Err(GuardError::Blocked { target, detail }) => {
                    let from = attempt.previous().last().map_or_else(String::new, |u| format!(" from {u}"));
                    attempt.error(GuardError::Blocked { target: format!("{target} (redirected{from})"), detail })
                }
                Err(refused) => attempt.error(refused),
            }
        });
        Ok(crate::tls::client_builder()?
            .dns_resolver(GuardedResolver { allow: Arc::clone(&self.allow) })
            .redirect(policy))
    }
}

fn check_url(allow: &AllowList, url: &Url) -> Result<(), GuardError> {
    let scheme = url.scheme();
    if scheme != "http" && scheme != "https" {
        return Err(GuardError::Protocol { url: url.to_string(), protocol: format!("{scheme}:") });
    }
    // The URL parser has already normalized IPv4 literals (`2130706433`,
    // `0x7f.1`, `127.1` all become `127.0.0.1`) and brackets IPv6 ones.
    let host = url.host_str().unwrap_or_default();
    let literal = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let Ok(ip) = literal.parse::<IpAddr>() else {
        // Names are checked by the resolver, after resolution.
        return Ok(());
    };
    match non_public_reason(ip) {
        Some(reason) if !allow.allows_ip(ip) => {
            Err(GuardError::Blocked { target: url.to_string(), detail: format!("{ip} is {reason}") })
        }
        _ => Ok(()),
    }
}

/// Resolves with the system resolver and keeps only the addresses the guard
/// allows; the connector connects to exactly those.
#[derive(Debug)]
struct GuardedResolver {
    allow: Arc<AllowList>,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let allow = Arc::clone(&self.allow);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if allow.allows_host(&host) {
                return Ok(Box::new(addrs.into_iter()) as Addrs);
            }
            let (kept, refused): (Vec<SocketAddr>, Vec<SocketAddr>) =
                addrs.into_iter().partition(|addr| is_public(addr.ip()) || allow.allows_ip(addr.ip()));
            if kept.is_empty() {
                let detail = describe_refused(&refused);
                return Err(Box::new(GuardError::Blocked { target: host, detail }) as Box<dyn StdError + Send + Sync>);
            }
            if !refused.is_empty() {
                tracing::debug!("{host}: dropped non-public addresses {:?}", refused.iter().map(SocketAddr::ip));
            }
            Ok(Box::new(kept.into_iter()) as Addrs)
        })
    }
}

fn describe_refused(refused: &[SocketAddr]) -> String {
    let listed: Vec<String> = refused
        .iter()
        .map(|addr| {
            let ip = addr.ip();
            non_public_reason(ip).map_or_else(|| ip.to_string(), |reason| format!("{ip}, {reason}"))
        })
        .collect();
    if listed.is_empty() {
        "it resolved to no address".to_owned()
    } else {
        format!("it resolved only to non-public addresses ({})", listed.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn public_addresses() {
        for text in [
            "8.8.8.8",
            "1.1.1.1",
            "93.184.216.34",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.167.1.1",
            "192.169.0.1",
            "198.17.255.255",
            "198.20.0.0",
            "223.255.255.255",
            "169.253.1.1",
            "2606:4700:4700::1111",
            "2001:4860:4860::8888",
            "2a00:1450:4001::1",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert!(is_public(ip(text)), "{text} should be public");
            assert_eq!(non_public_reason(ip(text)), None, "{text}");
        }
    }

    #[test]
    fn non_public_addresses() {
        for text in [
            // IPv4
            "0.0.0.0",
            "0.1.2.3",
            "10.0.0.1",
            "10.255.255.255",
            "100.64.0.1",
            "100.127.255.255",
            "127.0.0.1",
            "127.255.255.254",
            "169.254.169.254",
            "169.254.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.0.0.8",
            "192.0.2.1",
            "192.88.99.1",
            "192.168.1.1",
            "198.18.0.1",
            "198.19.255.255",
            "198.51.100.7",
            "203.0.113.9",
            "224.0.0.1",
            "239.255.255.250",
            "240.0.0.1",
            "255.255.255.255",
            // IPv6
            "::",
            "::1",
            "fe80::1",
            "febf::1",
            "fec0::1",
            "fc00::1",
            "fd12:3456::1",
            "ff02::1",
            "2001:db8::1",
            "2001::1",
            "3fff::1",
            "100::1",
            "64:ff9b:1::1",
            "5f00::1",
            "4000::1",
            "1::1",
            // IPv6 forms that embed a non-public IPv4 address
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:0.0.0.0",
            "::127.0.0.1",
            "::10.1.2.3",
            "64:ff9b::7f00:1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "2002:c0a8:101::1",
        ] {
            assert!(!is_public(ip(text)), "{text} should not be public");
        }
    }

    #[test]
    fn reasons_name_the_range() {
        let reason = |text| non_public_reason(ip(text)).unwrap_or("public");
        assert!(reason("127.0.0.1").contains("loopback"));
        assert!(reason("::1").contains("loopback"));
        assert!(reason("::ffff:127.0.0.1").contains("loopback"));
        assert!(reason("10.0.0.1").contains("private"));
        assert!(reason("169.254.169.254").contains("metadata"));
        assert!(reason("fe80::1").contains("link-local"));
        assert!(reason("fd00::1").contains("unique-local"));
        assert!(reason("100.64.0.1").contains("carrier-grade NAT"));
        assert!(reason("255.255.255.255").contains("broadcast"));
        assert!(reason("224.0.0.1").contains("multicast"));
    }

    #[test]
    fn allow_list_entries() {
        let list = AllowList::from_entries(&[
            "127.0.0.1",
            "10.0.0.0/8",
            "[::1]",
            "fd00::/8",
            "Internal.Example.",
            "*.corp.example",
            "10.0.0.0/33",
            "bad entry",
            "",
        ]);
        assert!(!list.is_empty());
        assert!(list.allows_ip(ip("127.0.0.1")));
        assert!(list.allows_ip(ip("::ffff:127.0.0.1")));
        assert!(!list.allows_ip(ip("127.0.0.2")));
        assert!(list.allows_ip(ip("10.20.30.40")));
        assert!(!list.allows_ip(ip("11.0.0.1")));
        assert!(list.allows_ip(ip("::1")));
        assert!(list.allows_ip(ip("fd12::1")));
        assert!(!list.allows_ip(ip("fe80::1")));
        assert!(list.allows_host("internal.example"));
        assert!(list.allows_host("INTERNAL.example."));
        assert!(!list.allows_host("other.example"));
        assert!(list.allows_host("db.corp.example"));
        assert!(list.allows_host("a.b.corp.example"));
        assert!(!list.allows_host("corp.example.evil"));
        assert!(!list.allows_host("evilcorp.example"));
        assert!(AllowList::from_entries::<&str>(&[]).is_empty());
        // A host-less CIDR typo never allows everything.
        let list = AllowList::from_entries(&["0.0.0.0/33"]);
        assert!(list.is_empty());
    }

    #[test]
    fn check_url_refuses_literals_and_schemes() {
        let guard = NetGuard::default();
        let check = |text: &str| {
            let url = Url::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            guard.check_url(&url)
        };
        for text in [
            "http://127.0.0.1/",
            "http://2130706433/",
            "http://0x7f.1/",
            "http://127.1:8080/",
            "http://[::1]:80/",
            "http://[::ffff:127.0.0.1]/",
            "http://10.0.0.1/",
            "http://169.254.169.254/latest/meta-data",
            "https://0.0.0.0/",
        ] {
            let Err(refused) = check(text) else { panic!("{text} allowed") };
            assert_eq!(refused.code(), E_SSRF_BLOCKED, "{text}");
            assert!(refused.suggestion().contains(HTTP_ALLOW_VAR));
        }
        for text in ["file:///etc/passwd", "ftp://example.com/", "data:text/plain,x", "javascript:alert(1)"] {
            let Err(refused) = check(text) else { panic!("{text} allowed") };
            assert_eq!(refused.code(), E_PROTOCOL_NOT_ALLOWED, "{text}");
        }
        // Names pass here: the resolver checks them after resolution.
        assert_eq!(check("http://localhost/"), Ok(()));
        assert_eq!(check("https://8.8.8.8/"), Ok(()));

        let guard = NetGuard::with_allow_list(AllowList::from_entries(&["127.0.0.0/8"]));
        let url = Url::parse("http://127.0.0.5:9/").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(guard.check_url(&url), Ok(()));
        let url = Url::parse("http://10.0.0.1/").unwrap_or_else(|e| panic!("{e}"));
        assert!(guard.check_url(&url).is_err());
    }

    #[tokio::test]
    async fn resolver_keeps_only_allowed_addresses() {
        let name = |text: &str| text.parse::<Name>().unwrap_or_else(|_| panic!("bad name {text}"));
        let resolver = GuardedResolver { allow: Arc::new(AllowList::default()) };
        let Err(error) = resolver.resolve(name("localhost")).await else { panic!("localhost resolved") };
        let Some(refused) = guard_error_in(error.as_ref()) else { panic!("not a guard error: {error}") };
        assert_eq!(refused.code(), E_SSRF_BLOCKED);
        assert!(refused.to_string().contains("resolved only to non-public addresses"), "{refused}");

        let resolver = GuardedResolver { allow: Arc::new(AllowList::from_entries(&["localhost"])) };
        let Ok(addrs) = resolver.resolve(name("localhost")).await else { panic!("allowed name refused") };
        assert!(addrs.into_iter().all(|addr| addr.ip().is_loopback()));

        let resolver = GuardedResolver { allow: Arc::new(AllowList::from_entries(&["127.0.0.0/8"])) };
        let Ok(addrs) = resolver.resolve(name("localhost")).await else { panic!("allowed range refused") };
        let ips: Vec<IpAddr> = addrs.map(|addr| addr.ip()).collect();
        assert!(!ips.is_empty());
        assert!(ips.iter().all(|ip| matches!(ip, IpAddr::V4(v4) if v4.is_loopback())), "{ips:?}");
    }

    #[test]
    fn failures_carry_code_and_suggestion() {
        let refused = GuardError::Blocked { target: "http://10.0.0.1/".into(), detail: "10.0.0.1 is private".into() };
        let failure = refused.to_failure("GET http://10.0.0.1/ failed");
        assert_eq!(failure.code.as_deref(), Some(E_SSRF_BLOCKED));
        assert_eq!(
            failure.message,
            "GET http://10.0.0.1/ failed: refused to connect to http://10.0.0.1/: 10.0.0.1 is private; \
             non-public addresses are blocked (SSRF guard)"
        );
        assert!(failure.suggestion.is_some_and(|s| s.contains(HTTP_ALLOW_VAR)));
    }
}
