//! `gdn package add / install / update / publish`: the arguments, the
//! output (text as the original prints it, or `--json`) and exit codes.
//! The work is goondan-registry's `client`. A failure prints
//! `error: <message> [<code>]` (`--json`: `{"error": {code, message}}`)
//! and exits 1, 2 for a bad name or version.
//!
//! On a terminal (standard error, without `--json`) downloads show as they
//! go: a line per package once it is in (`Downloaded @acme/lib@1.0.0
//! (12.3 kB)`), and meanwhile one status line redrawn in place
//! (`Downloading 3 packages: 1.2 MB / 4.5 MB`). Anywhere else nothing of
//! it is written.

use std::io::Write as _;

use anyhow::Result;
use goondan_registry::client::install::{self, Outcome, ProgressSink};
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
    // Progress only for a person watching: a terminal, and not --json.
    let display = (!global.json && std::io::IsTerminal::is_terminal(&std::io::stderr())).then(Progress::new);
    let settings = |registry: &RegistryOption| Settings {
        registry_flag: registry.registry.clone(),
        env: &*session.env,
        config: CliConfig::read(&state_root),
        state_root: state_root.clone(),
        progress: display.clone().map(Progress::sink),
    };
    match command {
        PackageCommand::Add(args) => {
            let done = install::add(&settings(&args.registry), &manifest, &args.reference, args.exact).await;
            Progress::finish(display.as_ref());
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
            Progress::finish(display.as_ref());
            report(global, out, done, installed_lines)
        }
        PackageCommand::Update(args) => {
            let done = install::update(&settings(&args.registry), &manifest, &args.names, args.exact).await;
            Progress::finish(display.as_ref());
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
                report(global, out, Err::<(), _>(error), |_, ()| Ok(()))?;
                return Ok(exit::VALIDATION);
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
            Ok(exit_code(&error))
        }
    }
}

/// The exit code of a package command's error, by the original's classes:
/// what the user typed (2), the bundle's dependencies (3), a check that
/// failed — integrity, the tarball's contents, a frozen lockfile (4) —,
/// the registry unreachable or answering an error (5), refused
/// credentials (6), the machine (1).
fn exit_code(error: &PackageError) -> u8 {
    match error {
        PackageError::InvalidName { .. } | PackageError::InvalidVersion { .. } => exit::USAGE,
        // A package or version the registry does not have is the manifest's
        // to fix; retrying (what a script does on 5) would not help.
        PackageError::NotFound { .. }
        | PackageError::NoVersion { .. }
        | PackageError::Cycle { .. }
        | PackageError::Conflict { .. }
        | PackageError::Lockfile { .. }
        | PackageError::Manifest { .. } => exit::CONFIG,
        PackageError::Tarball { .. }
        | PackageError::NoManifestInTarball { .. }
        | PackageError::FrozenMismatch { .. } => exit::VALIDATION,
        PackageError::Unreachable { .. } | PackageError::BadAnswer { .. } | PackageError::Refused { .. } => {
            exit::NETWORK
        }
        PackageError::Unauthorized { .. } => exit::AUTH,
        PackageError::Io { .. } | PackageError::DiskFull { .. } | PackageError::Client(_) => exit::FAILED,
    }
}

/// The download display on a terminal's standard error (see the module docs).
#[derive(Clone)]
struct Progress(std::sync::Arc<std::sync::Mutex<Shown>>);

#[derive(Default)]
struct Shown {
    /// The downloads under way: bytes in, and of how many.
    under_way: std::collections::BTreeMap<String, (u64, Option<u64>)>,
    /// When the status line was last drawn (redrawn at most every 100 ms).
    drawn_at: Option<std::time::Instant>,
    /// A status line is on the screen.
    status_shown: bool,
}

/// `12.3 kB`, `4.5 MB`.
fn size(bytes: u64) -> String {
    match bytes {
        0..1_000 => format!("{bytes} B"),
        1_000..1_000_000 => format!("{:.1} kB", bytes as f64 / 1e3),
        _ => format!("{:.1} MB", bytes as f64 / 1e6),
    }
}

impl Progress {
    fn new() -> Self {
        Self(std::sync::Arc::default())
    }

    fn sink(self) -> ProgressSink {
        std::sync::Arc::new(move |event: &install::Progress| self.show(event))
    }

    fn show(&self, event: &install::Progress) {
        use goondan_core::sync::LockUnpoisoned as _;
        let mut shown = self.0.lock_unpoisoned();
        let mut stderr = std::io::stderr().lock();
        // What the terminal does not take is not worth failing an install for.
        let _ = match event {
            install::Progress::Downloading { name, version, received, total } => {
                shown.under_way.insert(format!("{name}@{version}"), (*received, *total));
                let due = shown.drawn_at.is_none_or(|at| at.elapsed() >= std::time::Duration::from_millis(100));
                if due { shown.draw(&mut stderr) } else { Ok(()) }
            }
            install::Progress::Installed { reused: true, .. } => Ok(()),
            install::Progress::Installed { name, version, bytes, reused: false } => {
                shown.under_way.remove(&format!("{name}@{version}"));
                shown.clear(&mut stderr).and_then(|()| {
                    writeln!(stderr, "Downloaded {name}@{version} ({})", size(*bytes))?;
                    if shown.under_way.is_empty() { Ok(()) } else { shown.draw(&mut stderr) }
                })
            }
        };
        let _ = stderr.flush();
    }

    /// Takes the status line off the screen before the command's output.
    fn finish(display: Option<&Self>) {
        use goondan_core::sync::LockUnpoisoned as _;
        if let Some(display) = display {
            let mut shown = display.0.lock_unpoisoned();
            shown.under_way.clear();
            let mut stderr = std::io::stderr().lock();
            let _ = shown.clear(&mut stderr).and_then(|()| stderr.flush());
        }
    }
}

impl Shown {
    fn clear(&mut self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        if std::mem::take(&mut self.status_shown) {
            write!(out, "\r\x1b[2K")?;
        }
        Ok(())
    }

    fn draw(&mut self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        self.clear(out)?;
        let received: u64 = self.under_way.values().map(|(received, _)| received).sum();
        let totals: Option<u64> = self.under_way.values().map(|(_, total)| *total).sum();
        let of = totals.map(|total| format!(" / {}", size(total))).unwrap_or_default();
        match (self.under_way.len(), self.under_way.keys().next()) {
            (0, _) | (_, None) => return Ok(()),
            (1, Some(one)) => write!(out, "Downloading {one}: {}{of}", size(received))?,
            (many, _) => write!(out, "Downloading {many} packages: {}{of}", size(received))?,
        }
        self.status_shown = true;
        self.drawn_at = Some(std::time::Instant::now());
        Ok(())
    }
}
