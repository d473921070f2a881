//! `ScriptHost::shutdown` against the real runtime: the running host
//! process ends, and every task of it (its supervisor, which reaps it,
//! among them) has ended when the call returns.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Kit, output, runtime_or_skip};
use goondan_script::ScriptHost;
use serde_json::json;

#[tokio::test]
async fn shutdown_ends_the_host_process_and_waits_for_its_tasks() {
    let Some(runtime) = runtime_or_skip("script host shutdown") else { return };
    let host = ScriptHost::with_runtime(runtime);
    let kit = Kit::new(Arc::clone(&host), None);
    let result = kit.call("c1", "kit__echo", json!({"text": "hi"})).await;
    assert_eq!(output(&result)["text"], "hi");
    let pid = host.running_pid().await.unwrap_or_else(|| panic!("no host runs"));
    tokio::time::timeout(Duration::from_secs(10), host.shutdown())
        .await
        .unwrap_or_else(|_| panic!("shutdown did not return: a task of the host did not end"));
    assert_eq!(host.running_pid().await, None);
    // Its supervisor, waited for, has reaped it: no process, no zombie.
    assert!(std::fs::metadata(format!("/proc/{pid}")).is_err(), "the host {pid} is still there");
}
