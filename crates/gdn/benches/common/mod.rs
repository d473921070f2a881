//! What the whole-process benches share: where they keep their files,
//! spreads of samples, the report they print, the events they read, and
//! the pipe round trip every IPC figure is set against.

#![allow(dead_code)] // Not every bench uses every piece.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The plan of `bundle`'s swarm (entry agent `coordinator`) with its
/// state root and working directory.
pub fn coordinator_plan(bundle: &Path, state: PathBuf, work: PathBuf) -> goondan_orchestrator::SwarmPlan {
    let report = goondan_config::load_bundle(bundle);
    let Some(loaded) = report.valid_bundle() else {
        panic!("{} has errors: {:?}", bundle.display(), report.diagnostics)
    };
    goondan_orchestrator::SwarmPlan::new(
        goondan_orchestrator::plan::swarm_of(loaded, "coordinator"),
        bundle.to_path_buf(),
        state,
        work,
    )
}

pub fn repo() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::canonicalize(&dir).unwrap_or(dir)
}

/// Where state roots, working directories (and a JetStream store) go:
/// tmpfs if there is one.
pub fn scratch_base() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() }
}

pub fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// Median, p10 and p90 (nearest rank) of `samples`.
pub fn spread(samples: &[f64]) -> (f64, f64, f64) {
    if samples.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let rank = (q * sorted.len() as f64).ceil() as usize;
        sorted[rank.clamp(1, sorted.len()) - 1]
    };
    (at(0.5), at(0.1), at(0.9))
}

pub fn median(samples: &[f64]) -> f64 {
    spread(samples).0
}

pub struct Report {
    pub text: String,
}

impl Report {
    pub fn line(&mut self, line: &str) {
        self.text.push_str(line);
        self.text.push('\n');
    }

    /// `label  median  p10  p90  unit`, and the median as a multiple of `floor`.
    pub fn row(&mut self, label: &str, samples: &[f64], unit: &str, floor: Option<f64>) {
        let (med, p10, p90) = spread(samples);
        let times = floor.filter(|f| *f > 0.0).map(|f| format!("  = {:.1}× floor", med / f)).unwrap_or_default();
        self.line(&format!("  {label:<60} {med:>9.3} {p10:>9.3} {p90:>9.3}  {unit}{times}  (n={})", samples.len()));
    }

    /// `label  median  p10  p90  unit`, and the median as a multiple of each floor.
    pub fn row_against(&mut self, label: &str, samples: &[f64], unit: &str, floors: &[(&str, f64)]) {
        let (med, p10, p90) = spread(samples);
        let times: String =
            floors.iter().filter(|(_, f)| *f > 0.0).map(|(name, f)| format!("  = {:.1}× {name}", med / f)).collect();
        self.line(&format!("  {label:<60} {med:>9.3} {p10:>9.3} {p90:>9.3}  {unit}  (n={}){times}", samples.len()));
    }

    pub fn print(&self) {
        let _ = std::io::stdout().write_all(self.text.as_bytes());
    }
}

pub fn events(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

/// The `duration`s (ms) of the `tool.completed` events of `tool`, in order.
pub fn tool_durations(path: &Path, tool: &str) -> Vec<f64> {
    events(path)
        .iter()
        .filter(|e| e["type"] == "tool.completed" && e["toolName"] == tool)
        .filter_map(|e| e["duration"].as_f64())
        .collect()
}

/// The `duration`s (ms) of the `turn.completed` events, in order.
pub fn turn_durations(path: &Path) -> Vec<f64> {
    events(path).iter().filter(|e| e["type"] == "turn.completed").filter_map(|e| e["duration"].as_f64()).collect()
}

/// The round trip (ms) of one short line through `cat` over pipes: the
/// median of `rounds`.
pub fn pipe_round_trip_floor(rounds: usize) -> f64 {
    let mut child =
        Command::new("cat").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("cat: {e}"));
    let Some(mut input) = child.stdin.take() else { panic!("cat's stdin") };
    let Some(output) = child.stdout.take() else { panic!("cat's stdout") };
    let mut output = BufReader::new(output);
    let mut line = String::new();
    let mut times = Vec::with_capacity(rounds);
    for round in 0..rounds + 100 {
        line.clear();
        let started = Instant::now();
        input.write_all(b"{\"type\":\"ping\",\"n\":1}\n").unwrap_or_else(|e| panic!("{e}"));
        output.read_line(&mut line).unwrap_or_else(|e| panic!("{e}"));
        if round >= 100 {
            times.push(ms(started.elapsed()));
        }
    }
    drop(input);
    let _ = child.wait();
    median(&times)
}
