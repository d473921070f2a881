//! The network holder: the process that owns the network namespace of an
//! agent's confined commands and is the only way out of it.
//!
//! The parent ([`crate::network`]) starts it in a user namespace of its own
//! where it is root (so it keeps its capabilities over that namespace across
//! `exec`; it has none outside). Here, one thread enters a new network
//! namespace, brings its loopback interface up and listens on `127.0.0.1`
//! there, then parks forever so that the parent can open the namespace
//! through `/proc/<pid>/task/<tid>/ns/net`; every other thread stays in the
//! original network namespace and makes the outbound connections. Commands
//! join the namespace, where loopback is all there is: this proxy is the one
//! thing they can reach.
//!
//! The proxy speaks HTTP: `CONNECT host:port` (HTTPS, and any other protocol
//! tunnelled) and absolute-form requests (`GET http://host:port/path`). Each
//! target is checked against the allow-list and resolved here, and the
//! connection goes to an address that was checked ([`AllowList::resolve`]);
//! anything else is answered `403` with a one-line reason, in the status
//! line (which clients print for a refused tunnel) and in the body.
//!
//! It holds no secret: its environment is cleared, it reads its allow-list
//! from standard input, and Landlock lets it read only the system's files
//! (what the resolver needs) and connect only to the listed ports (and DNS).
//! It ends when its standard input closes (the parent ended or dropped the
//! sandbox), and by `PR_SET_PDEATHSIG` when the thread that started it ends.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use goondan_core::host_port::HostPort;
use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, Scope,
};
use nix::sched::CloneFlags;

use crate::allow::AllowList;

/// The first argument that makes a binary run [`run_network_holder`]: the
/// default holder is the running executable with this argument, so a binary
/// that confines commands with a `network.allow` list calls
/// [`run_network_holder`] first thing in `main` when it sees it.
pub const NETWORK_HOLDER_ARG: &str = "__sandbox-net";

/// Set (to `1`) in the holder's otherwise empty environment.
pub const NETWORK_HOLDER_ENV: &str = "GOONDAN_SANDBOX_NETWORK_HOLDER";

/// The first word of every line of the holder's protocol, so that its lines
/// can be told from anything else the program prints.
pub(crate) const MAGIC: &str = "goondan-sandbox-net";

/// How long a client has to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest request head read.
const MAX_HEAD: usize = 64 * 1024;
/// How long one outbound connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);
/// Connections handled at once; more are answered `503`.
const MAX_CONNECTIONS: usize = 512;
/// Trees the holder may read: the resolver's configuration and libraries.
const READABLE: &[&str] = &["/etc", "/usr", "/lib", "/lib32", "/lib64", "/libx32", "/run", "/var/run", "/proc"];
/// DNS over TCP, which the resolver falls back to for large answers.
const DNS_PORT: u16 = 53;

/// Runs the network holder: reads the allow-list from standard input, sets
/// the namespace up, reports `goondan-sandbox-net ready <port> <tid>` on
/// standard output and serves until standard input closes. Never returns.
///
/// Only meaningful as the program [`Sandbox`](crate::Sandbox) starts, in the
/// user namespace it made for it.
pub fn run_network_holder() -> ! {
    let code = match serve() {
        Ok(()) => 0,
        Err(reason) => {
            let line = reason.replace(['\r', '\n'], " ");
            let mut out = io::stdout().lock();
            let _ = writeln!(out, "{MAGIC} failed {line}");
            let _ = out.flush();
            1
        }
    };
    std::process::exit(code)
}

fn serve() -> Result<(), String> {
    // Nothing here is secret, but nothing else of the same user should
    // read or trace the process either.
    let _ = nix::sys::prctl::set_dumpable(false);
    let mut input = BufReader::new(io::stdin());
    let allow = read_allow_list(&mut input)?;
    let (listener, tid) = listen_in_new_namespace()?;
    let port = listener.local_addr().map_err(|error| format!("the proxy has no address: {error}"))?.port();
    confine_self(&allow).map_err(|error| format!("confining the proxy failed: {error}"))?;
    {
        let mut out = io::stdout().lock();
        writeln!(out, "{MAGIC} ready {port} {tid}")
            .and_then(|()| out.flush())
            .map_err(|error| format!("reporting to the parent failed: {error}"))?;
    }
    // Refusals are reported on it from now on, never waiting for the parent.
    nix::fcntl::fcntl(io::stdout(), nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))
        .map_err(|error| format!("the output pipe: {error}"))?;
    std::thread::Builder::new()
        .name("lifeline".into())
        .spawn(move || {
            // The parent never writes again: end of input is its end.
            let _ = io::copy(&mut input, &mut io::sink());
            std::process::exit(0);
        })
        .map_err(|error| format!("starting a thread failed: {error}"))?;
    let allow = Arc::new(allow);
    let active = Arc::new(AtomicUsize::new(0));
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else {
            // Out of file descriptors, say: not a busy loop.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::AcqRel);
            let _ = stream.write_all(&answer(503, "goondan sandbox: too many connections through the proxy at once"));
            continue;
        }
        let (allow, done) = (Arc::clone(&allow), Arc::clone(&active));
        let spawned = std::thread::Builder::new().name("proxy".into()).spawn(move || {
            if let Err(error) = handle(stream, &allow) {
                tracing::debug!("sandbox proxy: {error}");
            }
            done.fetch_sub(1, Ordering::AcqRel);
        });
        if spawned.is_err() {
            active.fetch_sub(1, Ordering::AcqRel);
        }
    }
    Ok(())
}

/// `goondan-sandbox-net 1`, one entry a line, an empty line.
fn read_allow_list(input: &mut impl BufRead) -> Result<AllowList, String> {
    let mut line = String::new();
    input.read_line(&mut line).map_err(|error| format!("reading the allow-list failed: {error}"))?;
    if line.trim_end() != format!("{MAGIC} 1") {
        return Err(format!(
            "this is the sandbox's network holder; it is started by the sandbox, not by hand ({NETWORK_HOLDER_ENV})"
        ));
    }
    let mut entries = Vec::new();
    loop {
        line.clear();
        let read = input.read_line(&mut line).map_err(|error| format!("reading the allow-list failed: {error}"))?;
        let entry = line.trim_end();
        if read == 0 || entry.is_empty() {
            break;
        }
        entries.push(entry.to_owned());
    }
    let allow = AllowList::parse(&entries).map_err(|error| error.to_string())?;
    if allow.is_empty() { Err("the allow-list is empty".to_owned()) } else { Ok(allow) }
}

/// A thread that enters a new network namespace, brings `lo` up there and
/// listens on `127.0.0.1`; it hands the listener back and parks, keeping
/// its thread id for the parent. The listener stays in that namespace.
fn listen_in_new_namespace() -> Result<(TcpListener, i32), String> {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("netns".into())
        .spawn(move || {
            let made = (|| {
                nix::sched::unshare(CloneFlags::CLONE_NEWNET)
                    .map_err(|error| format!("a new network namespace: {error}"))?;
                loopback_up().map_err(|error| format!("bringing the loopback interface up: {error}"))?;
                let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                    .map_err(|error| format!("listening on 127.0.0.1: {error}"))?;
                Ok((listener, nix::unistd::gettid().as_raw()))
            })();
            let failed = made.is_err();
            let _ = sender.send(made);
            if failed {
                return;
            }
            loop {
                std::thread::park();
            }
        })
        .map_err(|error| format!("starting a thread failed: {error}"))?;
    receiver.recv().map_err(|_| "the namespace thread ended".to_owned())?
}

/// `ip link set lo up`, over rtnetlink.
fn loopback_up() -> io::Result<()> {
    use nix::sys::socket::{
        AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, recv, sendto, socket,
    };
    let index = nix::net::if_::if_nametoindex("lo")?;
    let fd = socket(AddressFamily::Netlink, SockType::Raw, SockFlag::SOCK_CLOEXEC, SockProtocol::NetlinkRoute)?;
    let up = libc::IFF_UP as u32;
    let mut message = Vec::with_capacity(32);
    // struct nlmsghdr
    message.extend(32_u32.to_ne_bytes());
    message.extend(libc::RTM_NEWLINK.to_ne_bytes());
    message.extend(((libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16).to_ne_bytes());
    message.extend(1_u32.to_ne_bytes());
    message.extend(0_u32.to_ne_bytes());
    // struct ifinfomsg
    message.extend([libc::AF_UNSPEC as u8, 0]);
    message.extend(0_u16.to_ne_bytes());
    message.extend(i32::try_from(index).unwrap_or(i32::MAX).to_ne_bytes());
    message.extend(up.to_ne_bytes());
    message.extend(up.to_ne_bytes());
    sendto(fd.as_raw_fd(), &message, &NetlinkAddr::new(0, 0), MsgFlags::empty())?;
    let mut answer = [0_u8; 512];
    let read = recv(fd.as_raw_fd(), &mut answer, MsgFlags::empty())?;
    // struct nlmsgerr: the header, then the error number (0: done).
    let kind = answer.get(4..6).map(|b| u16::from_ne_bytes([b[0], b[1]]));
    let error = answer.get(16..20).map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
    match (read >= 20, kind, error) {
        (true, Some(kind), Some(0)) if kind == libc::NLMSG_ERROR as u16 => Ok(()),
        (true, Some(kind), Some(error)) if kind == libc::NLMSG_ERROR as u16 => {
            Err(io::Error::from_raw_os_error(-error))
        }
        _ => Err(io::Error::other("an unexpected rtnetlink answer")),
    }
}

/// Landlock on the serving threads (the namespace thread, parked, was
/// started before): read the system's trees only, write nothing, connect
/// only to the listed ports and DNS, bind nothing more, signal nothing
/// outside.
fn confine_self(allow: &AllowList) -> Result<(), landlock::RulesetError> {
    let abi = ABI::V6;
    let mut ports: Vec<u16> = allow.targets().iter().map(|target| target.port).collect();
    ports.push(DNS_PORT);
    ports.sort_unstable();
    ports.dedup();
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))?
        .handle_access(AccessNet::from_all(abi))?
        .scope(Scope::from_all(abi))?
        .create()?;
    for path in READABLE {
        if let Ok(fd) = PathFd::new(path) {
            ruleset = ruleset.add_rule(PathBeneath::new(fd, AccessFs::from_read(abi)))?;
        }
    }
    for port in ports {
        ruleset = ruleset.add_rule(NetPort::new(port, AccessNet::ConnectTcp))?;
    }
    ruleset.restrict_self()?;
    Ok(())
}

/// One client connection: its request, the check, the connection, then
/// bytes both ways.
fn handle(client: TcpStream, allow: &AllowList) -> io::Result<()> {
    client.set_read_timeout(Some(HEAD_TIMEOUT))?;
    let (head, rest) = match read_head(&client)? {
        Some(read) => read,
        None => return respond(&client, 400, "goondan sandbox: the request head is too long or incomplete"),
    };
    client.set_read_timeout(None)?;
    let request = match Request::parse(&head) {
        Ok(request) => request,
        Err(reason) => return respond(&client, 400, &format!("goondan sandbox: {reason}")),
    };
    let addresses = match allow.resolve(&request.target) {
        Ok(addresses) => addresses,
        Err(refused) => {
            if refused.status() == 403 {
                report_refusal(&request.target, &refused.to_string());
            }
            return respond(&client, refused.status(), &refused.to_string());
        }
    };
    let upstream = match connect(&addresses) {
        Ok(upstream) => upstream,
        Err(error) => {
            let reason = format!("goondan sandbox: connecting to {} failed: {error}", request.target);
            return respond(&client, 502, &reason);
        }
    };
    // Bytes are passed on as they come: no delay for coalescing.
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    match &request.forward {
        None => (&client).write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")?,
        Some(head) => (&upstream).write_all(head)?,
    }
    (&upstream).write_all(&rest)?;
    relay(client, upstream)
}

/// Tells the parent (on standard output) what was refused, so that the
/// runtime can name the host to the model even when the client does not
/// show the proxy's answer (curl prints only `response 403` for a refused
/// tunnel).
/// Written straight to the (non-blocking) pipe, whole or not at all: a full
/// pipe drops the report rather than hold the client.
fn report_refusal(target: &HostPort, reason: &str) {
    let reason: String = reason.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let millis = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_millis());
    let mut line = format!("{MAGIC} refused {millis} {target} {reason}");
    // At most PIPE_BUF bytes, so that the write is atomic.
    let mut cut = line.len().min(4000);
    while !line.is_char_boundary(cut) {
        cut -= 1;
    }
    line.truncate(cut);
    line.push('\n');
    let _ = nix::unistd::write(io::stdout(), line.as_bytes());
}

/// The request head (without its blank line) and what came after it; `None`
/// when the client stopped or it grew past [`MAX_HEAD`].
fn read_head(mut client: &TcpStream) -> io::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let mut buffer = Vec::with_capacity(1024);
    let mut chunk = [0_u8; 4096];
    loop {
        let read = client.read(&mut chunk)?;
        if read == 0 {
            return Ok(None);
        }
        let searched_from = buffer.len().saturating_sub(3);
        buffer.extend_from_slice(&chunk[..read]);
        if let Some(at) = buffer[searched_from..].windows(4).position(|w| w == b"\r\n\r\n") {
            let end = searched_from + at;
            let rest = buffer.split_off(end + 4);
            buffer.truncate(end);
            return Ok(Some((buffer, rest)));
        }
        if buffer.len() > MAX_HEAD {
            return Ok(None);
        }
    }
}

/// What a client asked the proxy for.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    target: HostPort,
    /// For an absolute-form request, the head to send upstream (origin-form
    /// request line, hop-by-hop headers dropped, `Connection: close`);
    /// `None` for `CONNECT`.
    forward: Option<Vec<u8>>,
}

/// Headers that concern the hop to the proxy, not the server.
const HOP_BY_HOP: &[&str] = &["proxy-connection", "proxy-authorization", "connection", "keep-alive", "te", "upgrade"];

impl Request {
    fn parse(head: &[u8]) -> Result<Self, String> {
        let line_end = head.windows(2).position(|w| w == b"\r\n").unwrap_or(head.len());
        let line = std::str::from_utf8(&head[..line_end]).map_err(|_| "the request line is not text".to_owned())?;
        let mut words = line.split(' ');
        let (Some(method), Some(uri), Some(version), None) = (words.next(), words.next(), words.next(), words.next())
        else {
            return Err("the request line is not `METHOD target HTTP/1.x`".to_owned());
        };
        if !version.starts_with("HTTP/1.") || method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err("the request line is not `METHOD target HTTP/1.x`".to_owned());
        }
        if method == "CONNECT" {
            let target = HostPort::parse(uri, None).map_err(|error| error.to_string())?;
            return Ok(Self { target, forward: None });
        }
        let (scheme, rest) = uri.split_once("://").unwrap_or(("", uri));
        if !scheme.eq_ignore_ascii_case("http") {
            return Err(if scheme.eq_ignore_ascii_case("https") {
                "an https:// URL goes through CONNECT (set HTTPS_PROXY)".to_owned()
            } else {
                "this is the sandbox's HTTP proxy: send `CONNECT host:port` or an absolute http:// URL".to_owned()
            });
        }
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(authority_end);
        let target = HostPort::parse(authority, Some(80)).map_err(|error| error.to_string())?;
        let path = path.split('#').next().unwrap_or_default();
        let path = match path.chars().next() {
            Some('/') => path.to_owned(),
            _ => format!("/{path}"),
        };
        let mut forward = format!("{method} {path} {version}\r\n").into_bytes();
        let mut has_host = false;
        for header in head[line_end..].split(|&b| b == b'\n').skip(1) {
            let header = header.strip_suffix(b"\r").unwrap_or(header);
            if header.is_empty() {
                continue;
            }
            let name = header.split(|&b| b == b':').next().unwrap_or_default();
            let name = String::from_utf8_lossy(name).trim().to_ascii_lowercase();
            if HOP_BY_HOP.contains(&name.as_str()) {
                continue;
            }
            has_host |= name == "host";
            forward.extend_from_slice(header);
            forward.extend_from_slice(b"\r\n");
        }
        if !has_host {
            forward.extend_from_slice(format!("Host: {authority}\r\n").as_bytes());
        }
        forward.extend_from_slice(b"Connection: close\r\n\r\n");
        Ok(Self { target, forward: Some(forward) })
    }
}

/// The first of `addresses` that answers.
fn connect(addresses: &[SocketAddr]) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    for address in addresses {
        match TcpStream::connect_timeout(address, CONNECT_TIMEOUT) {
            Ok(stream) => return Ok(stream),
            Err(error) => last = io::Error::new(error.kind(), format!("{address}: {error}")),
        }
    }
    Err(last)
}

/// Bytes both ways until both sides are done.
fn relay(client: TcpStream, upstream: TcpStream) -> io::Result<()> {
    let (client_in, upstream_out) = (client.try_clone()?, upstream.try_clone()?);
    let up = std::thread::Builder::new().name("proxy-up".into()).spawn(move || {
        let _ = io::copy(&mut &client_in, &mut &upstream_out);
        let _ = upstream_out.shutdown(Shutdown::Write);
    })?;
    let _ = io::copy(&mut &upstream, &mut &client);
    let _ = client.shutdown(Shutdown::Write);
    let _ = up.join();
    Ok(())
}

/// A short answer from the proxy itself: the reason is the status line's
/// text and the body.
fn answer(status: u16, reason: &str) -> Vec<u8> {
    let reason: String = reason.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let body = format!("{reason}\n");
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Answers the client (see [`answer`]) and lets it read the answer before
/// the connection closes.
fn respond(mut client: &TcpStream, status: u16, reason: &str) -> io::Result<()> {
    client.write_all(&answer(status, reason))?;
    client.flush()?;
    let _ = client.shutdown(Shutdown::Write);
    // Let the client read the answer before the connection closes.
    let _ = client.set_read_timeout(Some(Duration::from_secs(1)));
    let _ = io::copy(&mut client.take(MAX_HEAD as u64), &mut io::sink());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(head: &str) -> Result<Request, String> {
        Request::parse(head.as_bytes())
    }

    #[test]
    fn connect_requests_name_their_target() {
        let Ok(request) = parse("CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443") else {
            panic!("CONNECT refused")
        };
        assert_eq!(request.target.to_string(), "api.example.com:443");
        assert_eq!(request.forward, None);
        assert!(parse("CONNECT [::1]:8080 HTTP/1.1").is_ok());
        assert!(parse("CONNECT api.example.com HTTP/1.1").is_err());
        assert!(parse("CONNECT a.example:1@b.example:2 HTTP/1.1").is_err());
    }

    #[test]
    fn absolute_requests_are_forwarded_in_origin_form() {
        let head = "GET http://127.0.0.1:8080/a/b?c=d#frag HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\
                    Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\nConnection: keep-alive\r\n\
                    Accept: */*";
        let Ok(request) = parse(head) else { panic!("refused") };
        assert_eq!(request.target.to_string(), "127.0.0.1:8080");
        let forward = String::from_utf8_lossy(request.forward.as_deref().unwrap_or_default()).into_owned();
        assert_eq!(
            forward,
            "GET /a/b?c=d HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        let Ok(request) = parse("POST HTTP://Example.com?x HTTP/1.0") else { panic!("refused") };
        assert_eq!(request.target.to_string(), "example.com:80");
        let forward = String::from_utf8_lossy(request.forward.as_deref().unwrap_or_default()).into_owned();
        assert_eq!(forward, "POST /?x HTTP/1.0\r\nHost: Example.com\r\nConnection: close\r\n\r\n");
    }

    #[test]
    fn other_requests_are_refused() {
        for head in [
            "GET / HTTP/1.1",
            "GET https://example.com/ HTTP/1.1",
            "GET ftp://example.com/ HTTP/1.1",
            "GET http://user:pw@example.com/ HTTP/1.1",
            "GET http://example.com/ HTTP/2",
            "get http://example.com/ HTTP/1.1",
            "GET  http://example.com/ HTTP/1.1",
            "GET http://example.com:99999/ HTTP/1.1",
        ] {
            assert!(parse(head).is_err(), "{head}");
        }
    }

    #[test]
    fn the_allow_list_is_read_up_to_a_blank_line() {
        let mut input = io::Cursor::new(format!("{MAGIC} 1\n127.0.0.1:80\nexample.com:443\n\nmore"));
        let Ok(list) = read_allow_list(&mut input) else { panic!("refused") };
        assert_eq!(list.targets().len(), 2);
        assert!(read_allow_list(&mut io::Cursor::new("127.0.0.1:80\n\n")).is_err());
        assert!(read_allow_list(&mut io::Cursor::new(format!("{MAGIC} 1\n\n"))).is_err());
        assert!(read_allow_list(&mut io::Cursor::new(format!("{MAGIC} 1\nnot an entry\n\n"))).is_err());
    }
}
