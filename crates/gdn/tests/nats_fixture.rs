//! The NATS server fixture of the multi-host tests (`common::nats`): a real
//! `nats-server` with JetStream on 127.0.0.1, spoken to over a raw socket in
//! the NATS client protocol: its greeting, JetStream data kept over a
//! restart (clean and after SIGKILL) on the same port, and auth refusing a
//! client without the right credentials.

mod common;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

use common::nats::{NatsOptions, NatsServer};

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// One client connection in the NATS text protocol.
struct Client {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    /// The server's `INFO {…}` greeting.
    info: String,
    next_sid: u32,
}

impl Client {
    /// Connects and reads the greeting (nothing sent yet).
    fn open(port: u16) -> Result<Self, Box<dyn std::error::Error>> {
        let writer = TcpStream::connect(("127.0.0.1", port))?;
        writer.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut client = Self { reader: BufReader::new(writer.try_clone()?), writer, info: String::new(), next_sid: 1 };
        client.info = client.line()?;
        if !client.info.starts_with("INFO {") {
            return Err(format!("no INFO greeting: {:?}", client.info).into());
        }
        Ok(client)
    }

    /// Sends `CONNECT {fields}` (verbose off) and a PING; the server's
    /// first answer: `PONG` when accepted, `-ERR '…'` when not.
    fn connect(&mut self, fields: &serde_json::Value) -> Result<String, Box<dyn std::error::Error>> {
        let mut connect = serde_json::json!({"verbose": false, "pedantic": false, "lang": "rust-test", "version": "0"});
        if let (Some(connect), Some(fields)) = (connect.as_object_mut(), fields.as_object()) {
            connect.extend(fields.clone());
        }
        self.send(&format!("CONNECT {connect}\r\nPING\r\n"))?;
        self.line()
    }

    fn send(&mut self, text: &str) -> Result<(), std::io::Error> {
        self.writer.write_all(text.as_bytes())
    }

    /// The next protocol line, without its CRLF.
    fn line(&mut self) -> Result<String, Box<dyn std::error::Error>> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err("the server closed the connection".into());
        }
        Ok(line.trim_end().to_owned())
    }

    /// Publishes `payload` to `subject` with a fresh inbox as reply subject
    /// and returns the one reply's payload (answering the server's PINGs).
    fn request(&mut self, subject: &str, payload: &str) -> Result<String, Box<dyn std::error::Error>> {
        let sid = self.next_sid;
        self.next_sid += 1;
        let inbox = format!("_INBOX.fixture.{sid}");
        self.send(&format!(
            "SUB {inbox} {sid}\r\nUNSUB {sid} 1\r\nPUB {subject} {inbox} {}\r\n{payload}\r\n",
            payload.len()
        ))?;
        loop {
            let line = self.line()?;
            if line == "PING" {
                self.send("PONG\r\n")?;
                continue;
            }
            if line.starts_with("-ERR") {
                return Err(format!("{subject}: {line}").into());
            }
            let Some(header) = line.strip_prefix("MSG ") else { continue };
            let fields: Vec<&str> = header.split(' ').collect();
            let Some(size) = fields.last().and_then(|n| n.parse::<usize>().ok()) else {
                return Err(format!("a MSG line without a size: {line}").into());
            };
            let mut body = vec![0; size + 2];
            self.reader.read_exact(&mut body)?;
            body.truncate(size);
            return Ok(String::from_utf8(body)?);
        }
    }
}

fn json(text: &str) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    Ok(serde_json::from_str(text)?)
}

/// A file-backed stream `ORDERS` on `orders.>` with one message in it.
fn create_stream_with_one_message(client: &mut Client) -> TestResult {
    let created = json(
        &client
            .request("$JS.API.STREAM.CREATE.ORDERS", r#"{"name":"ORDERS","subjects":["orders.>"],"storage":"file"}"#)?,
    )?;
    if created.get("error").is_some() || created["config"]["name"] != "ORDERS" {
        return Err(format!("stream not created: {created}").into());
    }
    let ack = json(&client.request("orders.1", "one")?)?;
    if ack["stream"] != "ORDERS" || ack["seq"] != 1 {
        return Err(format!("publish not acknowledged by the stream: {ack}").into());
    }
    Ok(())
}

/// How many messages the stream `ORDERS` holds, asked of a new connection.
fn orders_messages(port: u16) -> Result<u64, Box<dyn std::error::Error>> {
    let mut client = Client::open(port)?;
    let accepted = client.connect(&serde_json::json!({}))?;
    if accepted != "PONG" {
        return Err(format!("CONNECT refused: {accepted}").into());
    }
    let info = json(&client.request("$JS.API.STREAM.INFO.ORDERS", "")?)?;
    info["state"]["messages"].as_u64().ok_or_else(|| format!("no stream ORDERS: {info}").into())
}

#[test]
fn the_server_greets_with_jetstream_on_and_keeps_its_streams_over_restarts() -> TestResult {
    let Some(mut server) = NatsServer::start(NatsOptions::default())? else { return Ok(()) };
    let port = server.port();
    if server.url() != format!("nats://127.0.0.1:{port}") {
        return Err(format!("url {} does not name port {port}", server.url()).into());
    }
    if !server.client_env().is_empty() {
        return Err("credentials for a server without auth".into());
    }

    let mut client = Client::open(port)?;
    let info = json(client.info.trim_start_matches("INFO "))?;
    if info["jetstream"] != true || info["port"] != port || info["auth_required"] == true {
        return Err(format!("unexpected INFO: {info}").into());
    }
    let accepted = client.connect(&serde_json::json!({}))?;
    if accepted != "PONG" {
        return Err(format!("CONNECT without auth refused: {accepted}").into());
    }
    create_stream_with_one_message(&mut client)?;
    drop(client);
    let first_pid = server.pid();

    // SIGTERM, then the same port and store.
    server.restart()?;
    if server.port() != port || server.pid() == first_pid || !server.is_running() {
        return Err("restart did not start a new process on the same port".into());
    }
    let greeting = common::nats::info_line(port)?;
    if !greeting.contains("\"jetstream\":true") {
        return Err(format!("no JetStream after the restart: {greeting}").into());
    }
    let kept = orders_messages(port)?;
    if kept != 1 {
        return Err(format!("the stream holds {kept} messages after a clean restart, not 1").into());
    }

    // A crash: the stream survives it too.
    server.kill();
    if TcpStream::connect(("127.0.0.1", port)).is_ok() {
        return Err("the port still accepts connections after kill".into());
    }
    server.restart()?;
    orders_messages(port)?;

    server.stop()?;
    if server.is_running() || TcpStream::connect(("127.0.0.1", port)).is_ok() {
        return Err("the server still answers after stop".into());
    }
    if !server.log().contains("Server Exiting") {
        return Err(format!("no clean shutdown in the log:\n{}", server.log()).into());
    }
    Ok(())
}

#[test]
fn a_client_without_the_user_and_password_is_refused() -> TestResult {
    let Some(server) = NatsServer::start(NatsOptions::user_password("hub", "s3cret pass"))? else { return Ok(()) };
    let env = server.client_env();
    if env != [("NATS_USER", "hub".to_owned()), ("NATS_PASSWORD", "s3cret pass".to_owned())] {
        return Err(format!("client_env: {env:?}").into());
    }

    let mut anonymous = Client::open(server.port())?;
    if !anonymous.info.contains("\"auth_required\":true") {
        return Err(format!("INFO does not ask for auth: {}", anonymous.info).into());
    }
    let refused = anonymous.connect(&serde_json::json!({}))?;
    if refused != "-ERR 'Authorization Violation'" {
        return Err(format!("CONNECT without credentials answered {refused:?}").into());
    }

    let mut wrong = Client::open(server.port())?;
    let refused = wrong.connect(&serde_json::json!({"user": "hub", "pass": "wrong"}))?;
    if refused != "-ERR 'Authorization Violation'" {
        return Err(format!("CONNECT with a wrong password answered {refused:?}").into());
    }

    let mut hub = Client::open(server.port())?;
    let accepted = hub.connect(&serde_json::json!({"user": "hub", "pass": "s3cret pass"}))?;
    if accepted != "PONG" {
        return Err(format!("CONNECT with the right credentials answered {accepted:?}").into());
    }
    // JetStream works for the authenticated client.
    let account = json(&hub.request("$JS.API.INFO", "")?)?;
    if account.get("error").is_some() || account.get("limits").is_none() {
        return Err(format!("no JetStream account info: {account}").into());
    }
    Ok(())
}

#[test]
fn a_client_without_the_token_is_refused_and_auth_survives_a_restart() -> TestResult {
    let Some(mut server) = NatsServer::start(NatsOptions::token("t0ken-1"))? else { return Ok(()) };
    if server.client_env() != [("NATS_TOKEN", "t0ken-1".to_owned())] {
        return Err(format!("client_env: {:?}", server.client_env()).into());
    }
    server.restart()?;

    let mut anonymous = Client::open(server.port())?;
    let refused = anonymous.connect(&serde_json::json!({}))?;
    if refused != "-ERR 'Authorization Violation'" {
        return Err(format!("CONNECT without the token answered {refused:?}").into());
    }
    let mut holder = Client::open(server.port())?;
    let accepted = holder.connect(&serde_json::json!({"auth_token": "t0ken-1"}))?;
    if accepted != "PONG" {
        return Err(format!("CONNECT with the token answered {accepted:?}").into());
    }
    Ok(())
}
