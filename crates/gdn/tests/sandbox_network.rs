//! `gdn __sandbox-net`: the `gdn` binary is the network holder a sandbox
//! with `network.allow` starts (goondan-sandbox's own tests use their test
//! binary instead). A confined command reaches the listed server through
//! it, and is refused another.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::Duration;

use goondan_sandbox::{NETWORK_HOLDER_ARG, Policy, Sandbox, SandboxSpec};

fn serve(listener: TcpListener) {
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let mut head = Vec::new();
            let mut byte = [0_u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
                head.push(byte[0]);
            }
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nhello\n");
        }
    });
}

#[test]
fn gdn_is_the_network_holder() -> std::io::Result<()> {
    let workdir = tempfile::tempdir()?;
    let listed = TcpListener::bind("127.0.0.1:0")?;
    let unlisted = TcpListener::bind("127.0.0.1:0")?;
    let (listed_port, unlisted_port) = (listed.local_addr()?.port(), unlisted.local_addr()?.port());
    serve(listed);
    serve(unlisted);
    let sandbox = Sandbox::new(SandboxSpec {
        policy: Policy::WorkspaceWrite,
        workdir: workdir.path().to_path_buf(),
        network_allow: vec![format!("127.0.0.1:{listed_port}")],
        ..SandboxSpec::default()
    })
    .with_network_holder(env!("CARGO_BIN_EXE_gdn"), [NETWORK_HOLDER_ARG]);
    let run = |url: String| {
        let mut command = Command::new("curl");
        command.args(["-sS", "--max-time", "10", &url]).current_dir(workdir.path()).stdin(Stdio::null());
        if let Err(error) = sandbox.confine(&mut command) {
            panic!("confining failed: {error}");
        }
        match command.output() {
            Ok(output) => String::from_utf8_lossy(&output.stdout).into_owned(),
            Err(error) => panic!("curl: {error}"),
        }
    };
    assert_eq!(run(format!("http://127.0.0.1:{listed_port}/")), "hello\n");
    let refused = run(format!("http://127.0.0.1:{unlisted_port}/"));
    assert!(refused.contains("is not in the agent's spec.sandbox.network.allow"), "{refused}");
    let Some(holder) = sandbox.network_holder_pid() else { panic!("no holder") };
    let exe = std::fs::read_link(format!("/proc/{holder}/exe"))?;
    assert_eq!(exe.file_name(), std::path::Path::new(env!("CARGO_BIN_EXE_gdn")).file_name());
    Ok(())
}
