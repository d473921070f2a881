//! `gdn usage`: tokens and cost of the project's workspace, summed from the
//! durable per-step records.
//!
//! Every step that called the model writes a `step.completed` event to its
//! instance's `events.jsonl` with the model (`model.provider`,
//! `model.name`) and the step's `tokenUsage`; the event is synced before
//! the next step begins, so after a crash (kill -9) the steps that
//! completed are there exactly once and the one cut short is not. This
//! command reads those records — nothing else keeps a running sum that
//! could disagree with them — and prices each step with its Model's
//! `spec.pricing`, else the default table (`goondan_llm::pricing`), else
//! not at all (its cost is unknown, never 0).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::time::Duration;

use anyhow::Result;
use goondan_core::JsonValue;
use goondan_llm::TokenUsage;
use goondan_llm::pricing::{self, Prices};
use serde_json::json;

use crate::cli::{GlobalOptions, UsageArgs, UsageBy};
use crate::output::Output;

/// One step's record, as read from an event log.
#[derive(Debug, Clone)]
struct StepUsage {
    timestamp_ms: u64,
    agent: String,
    instance: String,
    turn: String,
    provider: String,
    model: String,
    usage: TokenUsage,
}

/// The sums of one row (or of everything).
#[derive(Debug, Default)]
struct Sum {
    usage: TokenUsage,
    steps: u64,
    turns: BTreeSet<String>,
    /// The cost of the priced steps.
    known_cost: f64,
    /// Steps whose model has no price.
    unpriced_steps: u64,
}

impl Sum {
    fn add(&mut self, step: &StepUsage, prices: Option<Prices>) {
        self.usage.add(step.usage);
        self.steps += 1;
        self.turns.insert(format!("{}@{}/{}", step.agent, step.instance, step.turn));
        match prices {
            Some(prices) => self.known_cost += prices.cost(&step.usage),
            None => self.unpriced_steps += 1,
        }
    }

    /// The cost when every step is priced.
    fn cost(&self) -> Option<f64> {
        (self.unpriced_steps == 0).then_some(self.known_cost)
    }

    fn to_json(&self) -> JsonValue {
        let mut value = self.usage.to_record();
        if let Some(map) = value.as_object_mut() {
            map.insert("steps".into(), json!(self.steps));
            map.insert("turns".into(), json!(self.turns.len()));
            map.insert("costUsd".into(), self.cost().map_or(JsonValue::Null, |cost| json!(cost)));
            map.insert("knownCostUsd".into(), json!(self.known_cost));
            map.insert("unpricedSteps".into(), json!(self.unpriced_steps));
        }
        value
    }

    fn cost_text(&self) -> String {
        match self.cost() {
            Some(cost) => format!("${cost:.4}"),
            None if self.unpriced_steps == self.steps => "unknown".to_owned(),
            None => format!(">= ${:.4} ({} step(s) unpriced)", self.known_cost, self.unpriced_steps),
        }
    }
}

/// `--since`: `90m`, `24h`, `7d`, `30s` (a whole number and a unit).
pub fn parse_since(text: &str) -> std::result::Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().map_err(|_| {
        format!("'{text}' is not a duration: a whole number and a unit (s, m, h, d), such as 90m, 24h or 7d")
    })?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3_600,
        "d" => 86_400,
        _ => return Err(format!("'{text}' has no unit of s, m, h or d (such as 90m, 24h or 7d)")),
    };
    number.checked_mul(seconds).map(Duration::from_secs).ok_or_else(|| format!("'{text}' is too long a duration"))
}

/// Every step record of the workspace's event logs.
fn read_steps(workspace: &goondan_runtime::store::Workspace) -> Vec<StepUsage> {
    let mut steps = Vec::new();
    for (agent, key, dir) in workspace.instance_dirs() {
        let mut tail = goondan_journal::Tail::new(dir.join(goondan_runtime::store::InstanceStore::EVENTS_FILE));
        // A torn last line (a crash mid-write) is not a complete line: not read.
        tail.read_new(|line| {
            let Ok(record) = serde_json::from_slice::<JsonValue>(line) else { return };
            if record.get("type").and_then(JsonValue::as_str) != Some("step.completed") {
                return;
            }
            let Some(usage) = record.get("tokenUsage") else { return };
            let text = |value: Option<&JsonValue>| value.and_then(JsonValue::as_str).unwrap_or_default().to_owned();
            let model = record.get("model");
            steps.push(StepUsage {
                timestamp_ms: record.get("timestamp").and_then(JsonValue::as_u64).unwrap_or(0),
                agent: agent.clone(),
                instance: key.clone(),
                turn: text(record.get("turnId")),
                provider: text(model.and_then(|m| m.get("provider"))),
                model: text(model.and_then(|m| m.get("name"))),
                usage: TokenUsage::from_record(usage),
            });
        });
    }
    steps
}

/// The prices of (provider, model): the bundle's Model with that provider
/// and model id and a `spec.pricing`, else the default table.
struct PriceBook {
    configured: BTreeMap<(String, String), Prices>,
}

impl PriceBook {
    fn of(bundle: Option<&goondan_config::Bundle>) -> Self {
        let mut configured = BTreeMap::new();
        for resource in bundle.map(goondan_config::Bundle::resources).unwrap_or_default() {
            if let goondan_config::AnyResource::Model(model) = &resource.resource
                && let Some(pricing) = &model.spec.pricing
            {
                configured.insert((model.spec.provider.clone(), model.spec.model.clone()), Prices::from(pricing));
            }
        }
        Self { configured }
    }

    fn prices(&self, provider: &str, model: &str) -> Option<Prices> {
        self.configured
            .get(&(provider.to_owned(), model.to_owned()))
            .copied()
            .or_else(|| pricing::default_prices(model))
    }
}

/// UTC `YYYY-MM-DD` of a time in ms (the day `gdn instance list` shows).
fn day(ms: u64) -> String {
    crate::instance::iso_date(ms)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// `gdn usage`.
pub fn usage(global: &GlobalOptions, args: &UsageArgs, out: &mut Output) -> Result<u8> {
    let workspace = match crate::workspace::workspace_or_exit_saying(
        global,
        out,
        "no such workspace (gdn instance list shows the workspaces)",
    )? {
        Ok(workspace) => workspace,
        Err(code) => return Ok(code),
    };
    // Prices from the bundle's Models when it loads (with --workspace alone
    // there may be none): the default table otherwise.
    let report = crate::workspace::load_config(global);
    let book = PriceBook::of(report.valid_bundle());
    let since_ms =
        args.since.map(|since| now_ms().saturating_sub(u64::try_from(since.as_millis()).unwrap_or(u64::MAX)));
    let mut total = Sum::default();
    let mut rows: BTreeMap<String, Sum> = BTreeMap::new();
    for step in read_steps(&workspace) {
        if since_ms.is_some_and(|since| step.timestamp_ms < since) {
            continue;
        }
        let prices = book.prices(&step.provider, &step.model);
        total.add(&step, prices);
        if let Some(by) = args.by {
            let key = match by {
                UsageBy::Agent => step.agent.clone(),
                UsageBy::Instance => format!("{}@{}", step.agent, step.instance),
                UsageBy::Model => format!("{}/{}", step.provider, step.model),
                UsageBy::Day => day(step.timestamp_ms),
            };
            rows.entry(key).or_default().add(&step, prices);
        }
    }
    if global.json {
        let rows: Vec<JsonValue> = rows
            .iter()
            .map(|(key, sum)| {
                let mut row = sum.to_json();
                if let Some(map) = row.as_object_mut() {
                    map.insert("key".into(), json!(key));
                }
                row
            })
            .collect();
        let report = json!({
            "workspace": workspace.id(),
            "since": since_ms,
            "by": args.by.map(UsageBy::as_str),
            "defaultPricesAsOf": pricing::DEFAULT_PRICES_AS_OF,
            "total": total.to_json(),
            "rows": rows,
        });
        writeln!(out.stdout, "{report}")?;
    } else {
        let header = args.by.map_or("", UsageBy::as_str);
        writeln!(
            out.stdout,
            "{header:<32} {:>6} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10}  cost (USD)",
            "turns", "steps", "input", "output", "cache rd", "cache wr", "reasoning"
        )?;
        let line = |name: &str, sum: &Sum| {
            format!(
                "{name:<32} {:>6} {:>6} {:>10} {:>10} {:>10} {:>10} {:>10}  {}",
                sum.turns.len(),
                sum.steps,
                sum.usage.input_tokens,
                sum.usage.output_tokens,
                sum.usage.cache_read_tokens,
                sum.usage.cache_write_tokens,
                sum.usage.reasoning_tokens,
                sum.cost_text()
            )
        };
        for (key, sum) in &rows {
            writeln!(out.stdout, "{}", line(key, sum))?;
        }
        writeln!(out.stdout, "{}", line("total", &total))?;
        writeln!(
            out.stdout,
            "(prices: each Model's spec.pricing, else list prices as of {}; a model with neither has no cost)",
            pricing::DEFAULT_PRICES_AS_OF
        )?;
    }
    out.stdout.flush()?;
    Ok(crate::exit::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_need_a_number_and_a_unit() {
        assert_eq!(parse_since("90m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse_since("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_since("7d"), Ok(Duration::from_secs(604_800)));
        for bad in ["", "h", "7", "7w", "-1h", "1.5h", "99999999999999999999d"] {
            assert!(parse_since(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn days_are_utc_dates() {
        assert_eq!(day(0), "1970-01-01");
        assert_eq!(day(1_796_169_600_000), "2026-12-02");
        assert_eq!(day(951_782_400_000), "2000-02-29");
    }
}
