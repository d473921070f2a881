//! `network.allow` entries are read twice: by the bundle's side
//! (`SandboxNetwork::targets`, which `gdn validate`, the runtime and MCP
//! use) and by the sandbox that enforces them (`goondan_sandbox::AllowList`).
//! Both read them with `goondan_core::host_port`; they must agree, or a
//! bundle that validates would have its commands refused at run time (or
//! the reverse). The runtime hands the sandbox the bundle side's rendering
//! of each entry, so that must parse to the same target too.

use goondan_config::SandboxNetwork;
use goondan_sandbox::AllowList;
use proptest::prelude::*;

fn check(entry: &str) -> Result<(), TestCaseError> {
    let validated = SandboxNetwork { allow: vec![entry.to_owned()] }.targets();
    let enforced = AllowList::parse(&[entry]);
    prop_assert_eq!(
        validated.is_ok(),
        enforced.is_ok(),
        "{:?}: validate says {:?}, the sandbox says {:?}",
        entry,
        validated,
        enforced
    );
    if let (Ok(validated), Ok(enforced)) = (validated, enforced) {
        let rendered: Vec<String> = validated.iter().map(ToString::to_string).collect();
        let reparsed = AllowList::parse(&rendered);
        prop_assert_eq!(reparsed.as_ref().ok(), Some(&enforced), "{:?}", entry);
    }
    Ok(())
}

#[test]
fn the_validator_and_the_sandbox_read_these_entries_alike() -> Result<(), TestCaseError> {
    for entry in [
        "api.example.com:443",
        "API.Example.COM:443",
        "example.com.:80",
        "localhost:8080",
        "127.0.0.1:80",
        "127.1:80",
        "10.0.0.300:80",
        "[::1]:9000",
        "[::ffff:127.0.0.1]:80",
        "::1:9000",
        "[fe80::1]",
        "example.com",
        "example.com:0",
        "example.com:65535",
        "example.com:65536",
        "example.com:+80",
        "example.com:080",
        "example.com:000080",
        "0a:000001",
        "http://example.com:80",
        "example.com:80/path",
        "user@example.com:80",
        "-bad.example.com:80",
        "bad-.example.com:80",
        "a..b:80",
        ":80",
        "",
        " example.com:80",
        "*.example.com:443",
        "xn--bcher-kva.example:443",
        "a_b.example:80",
        "123:80",
    ] {
        check(entry)?;
    }
    Ok(())
}

proptest! {
    // GRAMMAR_CASES=N runs more cases (a search for differences, not CI's job).
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("GRAMMAR_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(4000)
    ))]

    #[test]
    fn the_validator_and_the_sandbox_agree_on_any_entry(entry in "[a-zA-Z0-9.:\\[\\]_@/ -]{0,24}") {
        check(&entry)?;
    }

    #[test]
    fn and_on_entries_shaped_like_host_port(
        host in "[a-z0-9-]{0,8}(\\.[a-z0-9-]{0,8}){0,3}\\.?",
        port in "[0-9+]{0,6}",
    ) {
        check(&format!("{host}:{port}"))?;
    }
}
