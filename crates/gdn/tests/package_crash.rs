//! `gdn registry serve` and `gdn package` killed (SIGKILL, from the fault
//! points of goondan-core's `fault-injection` feature, `GOONDAN_FAULT`)
//! right after each write a publish or an install makes, and a packument
//! write failing on a full disk: the registry restarts with each version
//! whole or absent (never a packument naming a tarball it cannot serve),
//! and the next `gdn package install` repairs what an install left.
//!
//! `cargo test -p gdn --features fault-injection --test package_crash`.

use std::os::unix::process::ExitStatusExt as _;
use std::time::Duration;

mod common;
mod package_support;

use package_support::{APP, Registry, TestResult, installed, leftovers, package, publish};

#[test]
fn a_registry_killed_at_each_write_of_a_publish_restarts_with_the_version_whole_or_absent() -> TestResult {
    // (point, whether the version is there after the restart)
    for (point, landed) in [("registry.tarball", false), ("registry.metadata", true)] {
        let storage = common::temp();
        // The second write at the point is 1.1.0's (1.0.0 made the first).
        let fault = format!("{point}:crash:2");
        let mut registry = Registry::start(storage.path(), &[("GOONDAN_FAULT", &fault)])?;
        let (status, json) = publish(&registry.url, "@acme/lib", "1.0.0", &[], 0);
        assert_eq!(status, Some(0), "{point}: {json}");
        let (status, json) = publish(&registry.url, "@acme/lib", "1.1.0", &[], 200_000);
        assert_eq!(status, Some(5), "{point}: the publish got no answer (a network error): {json}");
        let killed = registry.server.wait_exit(Duration::from_secs(10))?;
        assert_eq!(killed.signal(), Some(9), "{point}: {killed:?}");

        let registry = Registry::start(storage.path(), &[])?;
        let expected: &[&str] = if landed { &["1.0.0", "1.1.0"] } else { &["1.0.0"] };
        assert_eq!(registry.consistent_versions("@acme/lib")?, expected, "{point}");
        if !landed {
            assert_eq!(registry.get("/@acme/lib/-/lib-1.1.0.tgz")?.0, 404, "{point}");
        }
        // What the crash left (temporary files, the unnamed tarball) is gone.
        assert_eq!(leftovers(storage.path()), Vec::<std::path::PathBuf>::new(), "{point}");
        let tarballs = storage.path().join("packages/%40acme/lib/tarballs");
        assert_eq!(std::fs::read_dir(&tarballs)?.count(), expected.len(), "{point}");
        // The publish again: taken when it was lost, refused as a duplicate when it landed.
        let (status, json) = publish(&registry.url, "@acme/lib", "1.1.0", &[], 200_000);
        if landed {
            assert_eq!(json["error"]["message"].as_str().map(|m| m.contains("409")), Some(true), "{point}: {json}");
        } else {
            assert_eq!(status, Some(0), "{point}: {json}");
        }
        assert_eq!(registry.consistent_versions("@acme/lib")?, ["1.0.0", "1.1.0"], "{point}");
    }
    Ok(())
}

#[test]
fn a_packument_that_does_not_fit_takes_its_tarball_back() -> TestResult {
    let storage = common::temp();
    let registry = Registry::start(storage.path(), &[("GOONDAN_FAULT", "registry.metadata:enospc:2")])?;
    let (status, json) = publish(&registry.url, "@acme/lib", "1.0.0", &[], 0);
    assert_eq!(status, Some(0), "{json}");
    let (status, json) = publish(&registry.url, "@acme/lib", "1.1.0", &[], 0);
    assert_eq!(status, Some(5), "{json}");
    let message = json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("507"), "{message}");
    assert_eq!(registry.consistent_versions("@acme/lib")?, ["1.0.0"]);
    assert_eq!(registry.get("/@acme/lib/-/lib-1.1.0.tgz")?.0, 404);
    assert_eq!(std::fs::read_dir(storage.path().join("packages/%40acme/lib/tarballs"))?.count(), 1);
    // The disk has room again (the fault was the second write only).
    let (status, json) = publish(&registry.url, "@acme/lib", "1.1.0", &[], 0);
    assert_eq!(status, Some(0), "{json}");
    assert_eq!(registry.consistent_versions("@acme/lib")?, ["1.0.0", "1.1.0"]);
    Ok(())
}

/// The app bundle depending on `@acme/lib` (which depends on `@acme/util`).
const APP_WITH_LIB: &str = "apiVersion: goondan.ai/v1\nkind: Package\nmetadata:\n  name: \"@acme/app\"\nspec:\n  version: \"0.1.0\"\n  dependencies:\n    - name: \"@acme/lib\"\n      version: \"^1.0.0\"\n";

/// Every installed package either absent or whole: its marker recording
/// `integrity_of(name)`, its goondan.yaml there.
fn whole_or_absent(state: &std::path::Path, point: &str) {
    for name in ["@acme/lib", "@acme/util"] {
        let dir = installed(state, name, "1.0.0");
        if dir.exists() {
            let marker = std::fs::read_to_string(dir.join(".goondan-integrity")).unwrap_or_default();
            assert!(marker.starts_with("sha512-"), "{point}: {name} is in place without its marker");
            assert!(dir.join("goondan.yaml").is_file() && dir.join("data.bin").is_file(), "{point}: {name}");
        }
    }
}

#[test]
fn an_install_killed_at_each_write_is_repaired_by_the_next_install() -> TestResult {
    let storage = common::temp();
    let registry = Registry::start(storage.path(), &[])?;
    let (status, json) = publish(&registry.url, "@acme/util", "1.0.0", &[], 100_000);
    assert_eq!(status, Some(0), "{json}");
    let (status, json) = publish(&registry.url, "@acme/lib", "1.0.0", &[("@acme/util", "^1.0.0")], 100_000);
    assert_eq!(status, Some(0), "{json}");
    for point in ["package.unpack", "package.install", "package.lockfile"] {
        let app = common::temp();
        common::write(&app.path().join("goondan.yaml"), APP_WITH_LIB);
        let state = common::temp();
        let install = ["install", "--registry", &registry.url];
        let fault = format!("{point}:crash");
        let (status, json, output) = package(app.path(), state.path(), &[("GOONDAN_FAULT", &fault)], &install);
        assert_eq!(output.status.signal(), Some(9), "{point}: not killed: {status:?} {json}");
        whole_or_absent(state.path(), point);
        if point == "package.unpack" {
            assert!(!leftovers(state.path()).is_empty(), "{point}: the crash left nothing to repair");
        }

        let (status, json, _) = package(app.path(), state.path(), &[], &install);
        assert_eq!(status, Some(0), "{point}: {json}");
        whole_or_absent(state.path(), point);
        let lock = std::fs::read_to_string(app.path().join("goondan.lock.yaml"))?;
        for name in ["@acme/lib", "@acme/util"] {
            let marker = std::fs::read_to_string(installed(state.path(), name, "1.0.0").join(".goondan-integrity"))?;
            assert!(lock.contains(&format!("integrity: \"{marker}\"")), "{point}: {name}");
        }
        assert_eq!(leftovers(state.path()), Vec::<std::path::PathBuf>::new(), "{point}");
        assert_eq!(leftovers(app.path()), Vec::<std::path::PathBuf>::new(), "{point}");
        // --frozen-lockfile agrees: the repaired lockfile is the manifest's.
        let (status, json, _) =
            package(app.path(), state.path(), &[], &["install", "--frozen-lockfile", "--registry", &registry.url]);
        assert_eq!(status, Some(0), "{point}: {json}");
    }
    Ok(())
}

#[test]
fn an_add_killed_between_the_lockfile_and_the_manifest_is_finished_by_the_next_add() -> TestResult {
    let storage = common::temp();
    let registry = Registry::start(storage.path(), &[])?;
    let (status, json) = publish(&registry.url, "@acme/util", "1.0.0", &[], 0);
    assert_eq!(status, Some(0), "{json}");
    let app = common::temp();
    common::write(&app.path().join("goondan.yaml"), APP);
    let state = common::temp();
    let add = ["add", "@acme/util", "--registry", &registry.url];
    let (_, _, output) = package(app.path(), state.path(), &[("GOONDAN_FAULT", "package.lockfile:crash")], &add);
    assert_eq!(output.status.signal(), Some(9));
    // The manifest is as it was: the lockfile alone changed.
    assert_eq!(std::fs::read_to_string(app.path().join("goondan.yaml"))?, APP);
    assert!(app.path().join("goondan.lock.yaml").is_file());
    let (status, json, _) = package(app.path(), state.path(), &[], &add);
    assert_eq!(status, Some(0), "{json}");
    assert!(std::fs::read_to_string(app.path().join("goondan.yaml"))?.contains("@acme/util"));
    let (status, json, _) =
        package(app.path(), state.path(), &[], &["install", "--frozen-lockfile", "--registry", &registry.url]);
    assert_eq!(status, Some(0), "{json}");
    Ok(())
}
