//! Loads a bundle the way an agent process does, for timing and profiling
//! (see "Loading a bundle" in `docs/BENCHMARKS.md`).
//!
//! ```text
//! load <path> [loads]          # `loads` loads in this process (default 1)
//! load <path> --cold <runs>    # `runs` fresh processes, one load each
//! ```
//!
//! The first load in a process is what an agent pays at spawn: it also
//! builds everything the loader keeps for the life of the process (the
//! built-in package, compiled schemas). Later loads show the steady state,
//! which the divan bench (`benches/load.rs`) measures more precisely.
//!
//! Under callgrind, `loads = 0` is the process floor: the instructions of
//! `loads = 1` minus those of `loads = 0` are the cost of a first load, and
//! `(loads = 11) - (loads = 1)` is ten warm loads.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

/// Set in the children of `--cold`: print only the first load's time.
const CHILD_ENV: &str = "GOONDAN_LOAD_EXAMPLE_CHILD";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.as_slice() {
        [path, flag, runs] if flag == "--cold" => {
            runs.parse().map_err(|e| format!("runs: {e}")).and_then(|runs| cold(path, runs))
        }
        [path] => warm(Path::new(path), 1),
        [path, loads] => {
            loads.parse().map_err(|e| format!("loads: {e}")).and_then(|loads| warm(Path::new(path), loads))
        }
        _ => Err("usage: load <path> [loads] | load <path> --cold <runs>".to_owned()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let _ = writeln!(std::io::stderr(), "load: {error}");
            ExitCode::FAILURE
        }
    }
}

fn warm(path: &Path, loads: usize) -> Result<(), String> {
    let mut times = Vec::with_capacity(loads);
    let mut diagnostics = 0;
    for _ in 0..loads {
        let start = Instant::now();
        let report = goondan_config::load_bundle(path);
        times.push(start.elapsed());
        diagnostics = report.diagnostics.len();
        if report.bundle.is_none() {
            return Err(format!("{} did not load: {:?}", path.display(), report.diagnostics));
        }
    }
    let mut out = std::io::stdout().lock();
    if std::env::var_os(CHILD_ENV).is_some() {
        let first = times.first().ok_or("no load")?;
        return writeln!(out, "{}", first.as_nanos()).map_err(|e| e.to_string());
    }
    let Some((first, rest)) = times.split_first() else { return Ok(()) };
    let mut line = format!("{}: {diagnostics} diagnostics; first load {}", path.display(), micros(*first));
    if !rest.is_empty() {
        line.push_str(&format!(", later loads median {} ({} loads)", micros(median(rest.to_vec())), rest.len()));
    }
    writeln!(out, "{line}").map_err(|e| e.to_string())
}

/// Runs this program `runs` times with one load each and reports the
/// distribution of the first-load times the children measured themselves
/// (so process start-up is not counted).
fn cold(path: &str, runs: usize) -> Result<(), String> {
    let me: PathBuf = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let output = Command::new(&me).arg(path).env(CHILD_ENV, "1").output().map_err(|e| e.to_string())?;
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).into_owned());
        }
        let nanos: u64 = String::from_utf8_lossy(&output.stdout).trim().parse().map_err(|e| format!("child: {e}"))?;
        times.push(Duration::from_nanos(nanos));
    }
    times.sort();
    let at = |q: f64| times.get(((times.len().saturating_sub(1)) as f64 * q).round() as usize).copied();
    let (Some(min), Some(p50), Some(p90)) = (at(0.0), at(0.5), at(0.9)) else { return Ok(()) };
    writeln!(
        std::io::stdout(),
        "{path}: first load in a fresh process, {runs} processes: median {}, fastest {}, p90 {}",
        micros(p50),
        micros(min),
        micros(p90)
    )
    .map_err(|e| e.to_string())
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times.get(times.len() / 2).copied().unwrap_or_default()
}

fn micros(duration: Duration) -> String {
    format!("{:.1} µs", duration.as_secs_f64() * 1e6)
}
