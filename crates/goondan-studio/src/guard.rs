//! Who may read the studio: every request passes [`check`] before any
//! route (the page, its assets, the data API and the event stream).
//!
//! Without a token the studio listens on loopback only, and that alone does
//! not keep other sites out: a page the user visits can rebind its own name
//! to 127.0.0.1 (DNS rebinding) and read the answers as its own. So a
//! request is answered only when its `Host` names the studio — a loopback
//! address, `localhost` or the `--host` value, on the studio's port (no
//! port: only when that is 80) — and 421 Misdirected Request otherwise.
//!
//! With a token (`--auth-token-env NAME`, required beyond loopback) any
//! `Host` is accepted, because the token is the authentication: a request
//! carries it as `Authorization: Bearer <token>`, as the session cookie
//! that `?token=<token>` on any URL sets (HttpOnly, SameSite=Strict; its
//! value is a random secret of this process, not the token), or it gets 401.
//!
//! In both modes a request whose `Origin` is present and is not the
//! studio's own (`http://` and the authority the request names) gets 403: a
//! page of another site cannot use the studio even with the user's cookie.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Query, Request, State};
use axum::http::uri::Authority;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use goondan_core::secret::secrets_match;
use serde_json::json;

/// What a request is checked against.
pub struct Guard {
    /// The port the studio listens on.
    port: u16,
    /// The `--host` value, lowercase and without brackets.
    host: String,
    token: Option<Token>,
}

/// The token, and the session its `?token=` URL opens.
struct Token {
    token: String,
    /// The cookie's name: one per port, as cookies do not tell ports apart.
    cookie: String,
    /// The cookie's value: random, made when the studio starts.
    session: String,
}

/// Why a request is refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// 421: the `Host` (or the request target's authority) does not name the studio.
    Misdirected,
    /// 403: a page of another site.
    ForeignOrigin,
    /// 401: no valid token.
    Unauthorized,
}

impl Guard {
    /// The guard of a studio on `port`, started with `--host host` and the
    /// token of `--auth-token-env`, if any.
    pub fn new(port: u16, host: &str, token: Option<String>) -> Self {
        let token = token.map(|token| Token {
            // As `.env` files and `export` leave it, a newline at its end is no part of it.
            token: token.trim().to_owned(),
            cookie: format!("gdn-studio-{port}"),
            session: format!("{}{}", goondan_core::ids::new_trace_id(), goondan_core::ids::new_trace_id()),
        });
        Self { port, host: host.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase(), token }
    }

    /// The query that opens the page with the token (`token=…`), if any.
    pub fn token_query(&self) -> Option<String> {
        self.token.as_ref().map(|token| format!("token={}", query_value(&token.token)))
    }

    /// Whether the request may be answered; `Ok(Some(cookie))` when the
    /// answer must set the session cookie (a valid `?token=`).
    pub fn admit(&self, headers: &HeaderMap, uri: &Uri) -> Result<Option<HeaderValue>, Refusal> {
        // The authority the request names: its Host, and the target's
        // (absolute form) when it has one. Both must agree with the checks.
        let hosts: Vec<&HeaderValue> = headers.get_all(header::HOST).iter().collect();
        let host = match hosts.as_slice() {
            [] => None,
            [one] => Some(one.to_str().map_err(|_| Refusal::Misdirected)?),
            _ => return Err(Refusal::Misdirected),
        };
        let target = uri.authority().map(Authority::as_str);
        let named = host.or(target);
        // Without a token the name is what keeps other sites out.
        let names_the_studio = |name: Option<&str>| name.is_none_or(|name| self.names_the_studio(name));
        if self.token.is_none() && (named.is_none() || !names_the_studio(host) || !names_the_studio(target)) {
            return Err(Refusal::Misdirected);
        }
        if !own_origin(headers, named) {
            return Err(Refusal::ForeignOrigin);
        }
        let Some(token) = &self.token else { return Ok(None) };
        let from_query = Query::<Vec<(String, String)>>::try_from_uri(uri).ok().is_some_and(|Query(pairs)| {
            pairs.iter().any(|(name, value)| name == "token" && secrets_match(value.as_bytes(), token.token.as_bytes()))
        });
        if from_query {
            let cookie = format!("{}={}; Path=/; HttpOnly; SameSite=Strict", token.cookie, token.session);
            return HeaderValue::from_str(&cookie).map(Some).map_err(|_| Refusal::Unauthorized);
        }
        if bearer(headers).is_some_and(|sent| secrets_match(sent, token.token.as_bytes()))
            || cookies(headers, &token.cookie).any(|sent| secrets_match(sent.as_bytes(), token.session.as_bytes()))
        {
            return Ok(None);
        }
        Err(Refusal::Unauthorized)
    }

    /// Whether `authority` (a `Host` value) names this studio: a loopback
    /// address, `localhost` or the `--host` value, with the studio's port.
    fn names_the_studio(&self, authority: &str) -> bool {
        let Ok(parsed) = authority.parse::<Authority>() else { return false };
        if authority.contains('@') {
            return false;
        }
        let port_matches = match parsed.port_u16() {
            Some(port) => port == self.port,
            None => self.port == 80 && !authority.ends_with(':'),
        };
        let host = parsed.host().trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
        port_matches
            && (host == "localhost" || host == self.host || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback()))
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (status, error, message) = match self {
            Refusal::Misdirected => (
                StatusCode::MISDIRECTED_REQUEST,
                "misdirected_request",
                "the Host header does not name this studio: open the address `gdn studio` printed \
                 (pages of other sites cannot read the studio through DNS rebinding)",
            ),
            Refusal::ForeignOrigin => (
                StatusCode::FORBIDDEN,
                "forbidden_origin",
                "the Origin header names another site: only the studio's own page may use it",
            ),
            Refusal::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this studio asks for its token: open the URL `gdn studio` printed (…/?token=…) \
                 or send Authorization: Bearer <token>",
            ),
        };
        let mut response = crate::server::json_response(status, json!({"error": error, "message": message}));
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// The middleware: refuses what [`Guard::admit`] refuses, and sets the
/// session cookie when a request brought the token in its URL.
pub async fn check(State(guard): State<Arc<Guard>>, request: Request, next: Next) -> Response {
    let cookie = match guard.admit(request.headers(), request.uri()) {
        Ok(cookie) => cookie,
        Err(refusal) => {
            tracing::debug!("gdn studio refused {} {}: {refusal:?}", request.method(), request.uri().path());
            return refusal.into_response();
        }
    };
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    // A URL with the token is not sent on as a referrer.
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    if let Some(cookie) = cookie {
        headers.append(header::SET_COOKIE, cookie);
    }
    response
}

/// Whether the request's `Origin`, if it has one, is the studio's own:
/// `http://` and the authority the request names (`named`).
fn own_origin(headers: &HeaderMap, named: Option<&str>) -> bool {
    let mut origins = headers.get_all(header::ORIGIN).iter();
    let Some(origin) = origins.next() else { return true };
    if origins.next().is_some() {
        return false;
    }
    let (Ok(origin), Some(named)) = (origin.to_str(), named) else { return false };
    let Ok(origin) = origin.parse::<Uri>() else { return false };
    let (Some("http"), Some(from), Ok(named)) = (origin.scheme_str(), origin.authority(), named.parse::<Authority>())
    else {
        return false;
    };
    from.host().eq_ignore_ascii_case(named.host()) && from.port_u16().unwrap_or(80) == named.port_u16().unwrap_or(80)
}

/// The token of `Authorization: Bearer <token>` (the scheme in any case;
/// the token as bytes, which need not be ASCII).
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let (scheme, token) = value.split_at_checked(b"bearer ".len())?;
    scheme.eq_ignore_ascii_case(b"bearer ").then(|| token.trim_ascii())
}

/// The values of the cookie `name` in the request's `Cookie` headers.
fn cookies<'a>(headers: &'a HeaderMap, name: &'a str) -> impl Iterator<Item = &'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(move |pair| pair.trim().split_once('=').filter(|(n, _)| *n == name).map(|(_, v)| v))
}

/// `value` for a URL's query (everything but the unreserved characters
/// percent-encoded).
fn query_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(headers: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            let name = axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
            map.append(name, HeaderValue::from_str(value).unwrap_or_else(|e| panic!("{e}")));
        }
        map
    }

    fn admit(guard: &Guard, path: &str, headers: &[(&str, &str)]) -> Result<Option<HeaderValue>, Refusal> {
        guard.admit(&request(headers), &path.parse().unwrap_or_else(|e| panic!("{e}")))
    }

    #[test]
    fn without_a_token_only_the_studios_own_names_are_answered() {
        let guard = Guard::new(4317, "127.0.0.1", None);
        for host in ["127.0.0.1:4317", "localhost:4317", "LOCALHOST:4317", "127.9.9.9:4317", "[::1]:4317"] {
            assert_eq!(admit(&guard, "/api/instances", &[("host", host)]), Ok(None), "{host}");
        }
        for host in [
            "attacker.example:4317",
            "attacker.example",
            "localhost",
            "127.0.0.1",
            "127.0.0.1:80",
            "localhost:4318",
            "localhost.attacker.example:4317",
            "127.0.0.1.nip.io:4317",
            "[::ffff:127.0.0.1]:4317",
            "user@localhost:4317",
            "localhost:",
            "",
        ] {
            assert_eq!(admit(&guard, "/", &[("host", host)]), Err(Refusal::Misdirected), "{host}");
        }
        assert_eq!(admit(&guard, "/", &[]), Err(Refusal::Misdirected), "no Host");
        let two = [("host", "localhost:4317"), ("host", "attacker.example:4317")];
        assert_eq!(admit(&guard, "/", &two), Err(Refusal::Misdirected));
        // An absolute target names the server too.
        let absolute = "http://attacker.example:4317/api/instances";
        assert_eq!(admit(&guard, absolute, &[("host", "localhost:4317")]), Err(Refusal::Misdirected));
        assert_eq!(admit(&guard, "http://localhost:4317/", &[("host", "localhost:4317")]), Ok(None));
    }

    #[test]
    fn the_host_value_and_port_80_are_names_too() {
        let guard = Guard::new(80, "Studio.Internal", None);
        for host in ["studio.internal", "studio.internal:80", "localhost", "127.0.0.1:80", "[::1]"] {
            assert_eq!(admit(&guard, "/", &[("host", host)]), Ok(None), "{host}");
        }
        assert_eq!(admit(&guard, "/", &[("host", "studio.internal:81")]), Err(Refusal::Misdirected));
        let v6 = Guard::new(9000, "[::1]", None);
        assert_eq!(admit(&v6, "/", &[("host", "[::1]:9000")]), Ok(None));
    }

    #[test]
    fn another_sites_origin_is_refused_and_the_studios_own_passes() {
        let guard = Guard::new(4317, "127.0.0.1", None);
        let host = ("host", "localhost:4317");
        for origin in ["http://localhost:4317", "http://LocalHost:4317"] {
            assert_eq!(admit(&guard, "/api/stream", &[host, ("origin", origin)]), Ok(None), "{origin}");
        }
        for origin in [
            "http://attacker.example",
            "http://attacker.example:4317",
            "http://127.0.0.1:4317",
            "http://localhost:4318",
            "https://localhost:4317",
            "null",
            "file://",
            "",
        ] {
            assert_eq!(
                admit(&guard, "/api/stream", &[host, ("origin", origin)]),
                Err(Refusal::ForeignOrigin),
                "{origin}"
            );
        }
        let two = [host, ("origin", "http://localhost:4317"), ("origin", "http://attacker.example")];
        assert_eq!(admit(&guard, "/", &two), Err(Refusal::ForeignOrigin));
        let default_port = Guard::new(80, "127.0.0.1", None);
        assert_eq!(admit(&default_port, "/", &[("host", "localhost"), ("origin", "http://localhost:80")]), Ok(None));
    }

    #[test]
    fn with_a_token_any_host_but_only_the_token_or_its_cookie() {
        let guard = Guard::new(4317, "0.0.0.0", Some("tok-123".to_owned()));
        let session = guard.token.as_ref().map(|t| t.session.clone()).unwrap_or_default();
        assert_eq!(session.len(), 64);
        let host = ("host", "studio.lan:4317");
        assert_eq!(admit(&guard, "/", &[host]), Err(Refusal::Unauthorized));
        for good in ["Bearer tok-123", "bearer tok-123"] {
            assert_eq!(admit(&guard, "/", &[host, ("authorization", good)]), Ok(None), "{good}");
        }
        for wrong in ["Bearer tok-12", "Bearer tok-1234", "Bearer TOK-123", "Basic tok-123", "tok-123", "Bearer "] {
            assert_eq!(admit(&guard, "/", &[host, ("authorization", wrong)]), Err(Refusal::Unauthorized), "{wrong}");
        }
        // The page's URL sets the cookie; the cookie (not the token) then admits.
        let cookie = admit(&guard, "/?token=tok-123", &[host]).unwrap_or_else(|e| panic!("{e:?}"));
        let cookie = cookie.as_ref().and_then(|c| c.to_str().ok()).unwrap_or_default().to_owned();
        assert_eq!(cookie, format!("gdn-studio-4317={session}; Path=/; HttpOnly; SameSite=Strict"));
        let pair = format!("a=b; gdn-studio-4317={session}; c=d");
        assert_eq!(admit(&guard, "/api/stream", &[host, ("cookie", &pair)]), Ok(None));
        for wrong in ["gdn-studio-4317=tok-123", "gdn-studio-4318=x", "gdn-studio-4317="] {
            assert_eq!(admit(&guard, "/", &[host, ("cookie", wrong)]), Err(Refusal::Unauthorized), "{wrong}");
        }
        assert_eq!(admit(&guard, "/?token=tok-12", &[host]), Err(Refusal::Unauthorized));
        assert_eq!(admit(&guard, "/?tokens=tok-123", &[host]), Err(Refusal::Unauthorized));
        // Another site's page, even with the token.
        let foreign = [host, ("authorization", "Bearer tok-123"), ("origin", "http://attacker.example")];
        assert_eq!(admit(&guard, "/", &foreign), Err(Refusal::ForeignOrigin));
        let own = [host, ("cookie", pair.as_str()), ("origin", "http://studio.lan:4317")];
        assert_eq!(admit(&guard, "/", &own), Ok(None));
    }

    #[test]
    fn a_token_in_a_url_is_encoded_and_decoded_whole() {
        let token = "s3cret token/+;=\"é&x";
        let encoded = query_value(token);
        assert_eq!(encoded, "s3cret%20token%2F%2B%3B%3D%22%C3%A9%26x");
        let guard = Guard::new(1, "127.0.0.1", Some(token.to_owned()));
        assert!(matches!(admit(&guard, &format!("/?token={encoded}"), &[("host", "x")]), Ok(Some(_))));
        assert_eq!(guard.token_query(), Some(format!("token={encoded}")));
        // Not ASCII, in a header: compared as bytes.
        let mut headers = request(&[("host", "x")]);
        let value = format!("Bearer {token}");
        headers
            .insert(header::AUTHORIZATION, HeaderValue::from_bytes(value.as_bytes()).unwrap_or_else(|e| panic!("{e}")));
        assert_eq!(guard.admit(&headers, &Uri::from_static("/")), Ok(None));
        // A newline at the end of the variable is no part of the token.
        let trimmed = Guard::new(1, "127.0.0.1", Some("tok\n".to_owned()));
        assert_eq!(trimmed.token_query().as_deref(), Some("token=tok"));
    }
}
