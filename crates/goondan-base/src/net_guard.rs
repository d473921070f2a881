//! The SSRF guard for URLs a model chooses.
//!
//! A model that can fetch any URL can be talked (by a prompt injection in a
//! page it read) into fetching `http://169.254.169.254/latest/meta-data`, the
//! operator's router, or a database console on `127.0.0.1`. The guard refuses
//! every address that is not public, unless the operator allowed it with
//! `GOONDAN_HTTP_ALLOW`:
//!
//! - [`is_public`] / [`non_public_reason`] (from `goondan_core::address`,
//!   shared with the sandbox's network proxy) classify one address: loopback,
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
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use goondan_core::address::canonical;
pub use goondan_core::address::{is_public, non_public_reason};
use goondan_core::codes::{E_PROTOCOL_NOT_ALLOWED, E_SSRF_BLOCKED, E_TOO_MANY_REDIRECTS};
use goondan_core::tls::{SystemProxy, TlsError};
use goondan_tools::ToolFailure;
use ipnet::IpNet;
use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::redirect::{Attempt, Policy};

use crate::BaseSettings;
use crate::settings::HTTP_ALLOW_VAR;

/// How many redirects a request follows before giving up.
pub const MAX_REDIRECTS: usize = 10;

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
                // `canonical`: an entry `127.0.0.1` also covers `::ffff:127.0.0.1`.
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
    pub fn client_builder(&self) -> Result<reqwest::ClientBuilder, TlsError> {
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
        Ok(goondan_core::tls::client_builder(SystemProxy::Ignored)?
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
