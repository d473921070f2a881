//! `gdn package add / install / update / publish`: the arguments, the
//! output (text as the original prints it, or `--json`) and exit codes.
//! The work is goondan-registry's `client`. A failure prints
//! `error: <message> [<code>]` (`--json`: `{"error": {code, message}}`)
//! and exits 1, 2 for a bad name or version.

use std::io::Write as _;

use anyhow::Result;
use goondan_registry::client::install::{self, Outcome};
use goondan_registry::client::publish::{self, PublishOptions};
use goondan_registry::client::{CliConfig, PackageError, Settings};

use crate::cli::{GlobalOptions, PackageCommand, RegistryOption};
use crate::exit;
use crate::output::{self, Output};

/// `gdn package …`.
pub async fn package(
    global: &GlobalOptions,
    command: &PackageCommand,
    session: &crate::Session,
    out: &mut Output,
) -> Result<u8> {
    let manifest = goondan_config::resolve_bundle_file(&global.config);
    let state_root = crate::workspace::state_root(global)?.path().to_path_buf();
    let settings = |registry: &RegistryOption| Settings {
        registry_flag: registry.registry.clone(),
        env: &*session.env,
        config: CliConfig::read(&state_root),
        state_root: state_root.clone(),
    };
    match command {
        PackageCommand::Add(args) => {
            let done = install::add(&settings(&args.registry), &manifest, &args.reference, args.exact).await;
            report(global, out, done, |out, done| {
                let dependency =
                    done.dependency.as_ref().map(|d| format!("{}@{}", d.name, d.range)).unwrap_or_default();
                let verb = if done.added == Some(true) { "added" } else { "updated" };
                let version = done.resolved_version.as_deref().unwrap_or_default();
                writeln!(out, "Dependency {verb}: {dependency} ({version})")?;
                installed_lines(out, done)
            })
        }
        PackageCommand::Install(args) => {
            let done = install::install(&settings(&args.registry), &manifest, args.frozen_lockfile).await;
            report(global, out, done, installed_lines)
        }
        PackageCommand::Update(args) => {
            let done = install::update(&settings(&args.registry), &manifest, &args.names, args.exact).await;
            report(global, out, done, |out, done| {
                writeln!(out, "Updated dependencies: {}", done.changes.len())?;
                for (name, (before, after)) in &done.changes {
                    writeln!(out, "- {name}: {before} -> {after}")?;
                }
                installed_lines(out, done)
            })
        }
        PackageCommand::Publish(args) => {
            // As the original: a bundle `gdn validate` refuses is not published.
            let report_ = goondan_config::load_bundle(&global.config);
            if report_.has_errors() {
                // On standard error: with --json, standard output is the one JSON answer.
                output::write_report(&mut out.stderr, &report_.diagnostics, &manifest.display().to_string())?;
                let error = PackageError::Manifest {
                    path: manifest.clone(),
                    message: "the bundle does not validate (gdn validate shows why); nothing was published".to_owned(),
                };
                return report(global, out, Err::<(), _>(error), |_, ()| Ok(()));
            }
            let options = PublishOptions { tag: args.tag.clone(), access: args.access.clone(), dry_run: args.dry_run };
            let done = publish::publish(&settings(&args.registry), &manifest, &options).await;
            report(global, out, done, |out, done| {
                let what = if done.dry_run { "Dry-run publish checked" } else { "Published" };
                writeln!(
                    out,
                    "{what} {}@{} tag={} access={} registry={}",
                    done.name, done.version, done.tag, done.access, done.registry
                )?;
                writeln!(out, "Tarball: {} bytes, {}", done.size, done.integrity)?;
                if done.dry_run {
                    for file in &done.files {
                        writeln!(out, "  {file}")?;
                    }
                    writeln!(out, "Payload: {}", serde_json::to_string_pretty(&done.payload)?)?;
                }
                Ok(())
            })
        }
    }
}

fn installed_lines(out: &mut dyn std::io::Write, done: &Outcome) -> Result<()> {
    writeln!(out, "Manifest: {}", done.manifest.display())?;
    let reused = done.installed.iter().filter(|i| i.reused).count();
    writeln!(out, "Installed dependencies: {} ({reused} already in place)", done.installed.len())?;
    for one in &done.installed {
        writeln!(out, "- {}@{} {}", one.name, one.version, one.path.display())?;
    }
    writeln!(out, "Lockfile: {}", done.lockfile.display())?;
    Ok(())
}

/// Prints a result (text through `text`, or JSON) or its error; the exit code.
fn report<T: serde::Serialize>(
    global: &GlobalOptions,
    out: &mut Output,
    result: Result<T, PackageError>,
    text: impl FnOnce(&mut dyn std::io::Write, &T) -> Result<()>,
) -> Result<u8> {
    match result {
        Ok(done) if global.json => {
            writeln!(out.stdout, "{}", serde_json::to_string_pretty(&done)?)?;
            Ok(exit::OK)
        }
        Ok(done) => {
            text(&mut out.stdout, &done)?;
            Ok(exit::OK)
        }
        Err(error) => {
            if global.json {
                let body = serde_json::json!({"error": {"code": error.code(), "message": error.to_string()}});
                writeln!(out.stdout, "{}", serde_json::to_string_pretty(&body)?)?;
            } else {
                output::error_line(&mut out.stderr, format_args!("{error} [{}]", error.code()))?;
            }
            Ok(if error.is_usage() { exit::USAGE } else { exit::FAILED })
        }
    }
}
