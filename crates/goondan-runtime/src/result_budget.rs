//! The step's result budget: how much tool output one step may put into the
//! conversation.
//!
//! Each tool bounds its own result, but a step runs many calls at once (eight
//! `http-fetch` calls of 50 MB each would put 400 MB into a conversation that
//! every later turn reloads and sends). After the calls of a step, when their
//! results together exceed [`StepResultBudget::bytes`], the largest `ok`
//! outputs are saved, whole, to files in the instance's working directory
//! (`.goondan/tool-results/`), and the model gets in their place a preview
//! and the file's path, which it can read in pieces with its file tools.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use goondan_core::{JsonValue, ToolCall, ToolResult, ToolStatus};

/// Where spilled outputs go, under the working directory.
pub const SPILL_DIR: &str = ".goondan/tool-results";
/// The default budget: 1 MiB of results per step.
pub const DEFAULT_STEP_RESULT_BUDGET: usize = 1024 * 1024;
/// How much of a spilled output the model still sees.
pub const PREVIEW_BYTES: usize = 4 * 1024;

/// The limit on one step's tool results, in bytes of their JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepResultBudget {
    /// The total; `usize::MAX` for none.
    pub bytes: usize,
}

impl Default for StepResultBudget {
    fn default() -> Self {
        Self { bytes: DEFAULT_STEP_RESULT_BUDGET }
    }
}

/// Counts the bytes of a JSON serialization without building it.
struct Counter(usize);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 = self.0.saturating_add(buf.len());
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn json_len(value: &impl serde::Serialize) -> usize {
    let mut counter = Counter(0);
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

impl StepResultBudget {
    /// The environment variable that sets it (bytes; `0` for no budget).
    pub const ENV_VAR: &'static str = "GOONDAN_STEP_RESULT_BUDGET";

    /// The budget `value` (of [`Self::ENV_VAR`]) asks for; the default when
    /// it is absent or unreadable.
    pub fn from_setting(value: Option<&str>) -> Self {
        match value.map(str::trim).and_then(|v| v.parse::<usize>().ok()) {
            Some(0) => Self { bytes: usize::MAX },
            Some(bytes) => Self { bytes },
            None => Self::default(),
        }
    }

    /// Whether `results` together exceed the budget (counted without
    /// building their JSON).
    pub fn exceeded_by(&self, results: &[ToolResult]) -> bool {
        if self.bytes == usize::MAX {
            return false;
        }
        // Stops counting once over: a step of large results is not serialized twice here.
        let mut total = 0_usize;
        results.iter().any(|result| {
            total = total.saturating_add(json_len(result));
            total > self.bytes
        })
    }

    /// Keeps `results` (one per call) within the budget, spilling the largest
    /// `ok` outputs to files under `workdir`. Runs file I/O: call it off the
    /// async threads. Returns how many were spilled.
    pub fn apply(&self, workdir: &Path, step_id: &str, calls: &[ToolCall], results: &mut [ToolResult]) -> usize {
        let sizes: Vec<usize> = results.iter().map(json_len).collect();
        let mut total: usize = sizes.iter().fold(0, |sum, size| sum.saturating_add(*size));
        if total <= self.bytes {
            return 0;
        }
        // Previews share what the budget leaves; never more than PREVIEW_BYTES.
        let preview_bytes = (self.bytes / results.len().max(1) / 2).clamp(256, PREVIEW_BYTES);
        let mut order: Vec<usize> = (0..results.len()).collect();
        order.sort_by(|a, b| sizes[*b].cmp(&sizes[*a]));
        let mut spilled = 0;
        for index in order {
            if total <= self.bytes {
                break;
            }
            let result = &mut results[index];
            let Some(output) = result.output.as_ref().filter(|_| result.status == ToolStatus::Ok) else { continue };
            // A result hardly larger than its preview would only grow.
            if sizes[index] <= preview_bytes.saturating_mul(2) {
                continue;
            }
            let call = &calls[index];
            let replacement = spill(workdir, step_id, call, output, sizes[index], self.bytes, preview_bytes);
            let new_size = json_len(&replacement);
            total = total.saturating_sub(sizes[index]).saturating_add(new_size);
            result.output = Some(replacement);
            spilled += 1;
        }
        spilled
    }
}

/// Saves `output` and returns what the model gets instead.
fn spill(
    workdir: &Path,
    step_id: &str,
    call: &ToolCall,
    output: &JsonValue,
    size: usize,
    budget: usize,
    preview_bytes: usize,
) -> JsonValue {
    let text = serde_json::to_string_pretty(output).unwrap_or_default();
    let preview = preview(&text, preview_bytes);
    let relative = PathBuf::from(SPILL_DIR).join(format!("{}-{}.json", safe(step_id), safe(&call.id)));
    let saved = write_new(&workdir.join(&relative), text.as_bytes());
    let mut replacement = serde_json::json!({
        "truncated": true,
        "reason": format!(
            "this step's tool results came to more than its budget of {budget} bytes; this result ({size} bytes) was left out"
        ),
        "bytes": size,
        "preview": preview,
    });
    match saved {
        Ok(()) => {
            replacement["savedTo"] = JsonValue::String(relative.to_string_lossy().into_owned());
            replacement["hint"] = JsonValue::String(
                "The whole result is in the file savedTo (relative to the working directory); read the parts you need."
                    .to_owned(),
            );
        }
        Err(error) => {
            tracing::warn!("cannot save the output of tool call {} to {}: {error}", call.id, relative.display());
            replacement["hint"] =
                JsonValue::String("The whole result could not be saved; ask for a smaller one.".to_owned());
        }
    }
    replacement
}

/// The first `bytes` of `text`, cut at a character boundary.
fn preview(text: &str, bytes: usize) -> String {
    if text.len() <= bytes {
        return text.to_owned();
    }
    let mut end = bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// A file-name-safe form of an id.
fn safe(id: &str) -> String {
    id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).take(80).collect()
}

/// Writes a new file (never through an existing one, never a link).
fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(id: &str) -> ToolCall {
        ToolCall::new(id, "http-fetch__get", goondan_core::JsonObject::new())
    }

    #[test]
    fn results_within_the_budget_are_left_alone() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let mut results = vec![ToolResult::ok(json!({"body": "small"}))];
        let budget = StepResultBudget { bytes: 1000 };
        assert_eq!(budget.apply(dir.path(), "s", &[call("c1")], &mut results), 0);
        assert_eq!(results[0].output, Some(json!({"body": "small"})));
    }

    #[test]
    fn the_largest_outputs_are_saved_and_previewed_until_the_step_fits() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let big = "a".repeat(20_000);
        let medium = "b".repeat(6_000);
        let calls = [call("c1"), call("c2"), call("c3"), call("c4")];
        let mut results = vec![
            ToolResult::ok(json!({"body": medium})),
            ToolResult::ok(json!({"body": big})),
            ToolResult::ok(json!({"body": "tiny"})),
            ToolResult::error(goondan_core::ToolError::new("E_X", "Error", "x".repeat(900))),
        ];
        let budget = StepResultBudget { bytes: 8_000 };
        assert_eq!(budget.apply(dir.path(), "step-1", &calls, &mut results), 2);
        // Largest first: c2, then c1, until the rest fits; small and error results stay.
        let spilled = results[1].output.clone().unwrap_or_default();
        assert_eq!(spilled["truncated"], json!(true));
        assert_eq!(spilled["savedTo"], json!(".goondan/tool-results/step-1-c2.json"));
        assert!(spilled["preview"].as_str().is_some_and(|p| p.len() <= PREVIEW_BYTES + 3), "{spilled}");
        let saved: JsonValue = serde_json::from_slice(
            &std::fs::read(dir.path().join(".goondan/tool-results/step-1-c2.json")).unwrap_or_default(),
        )
        .unwrap_or_default();
        assert_eq!(saved["body"].as_str().map(str::len), Some(20_000));
        assert_eq!(results[0].output.as_ref().map(|o| o["truncated"].clone()), Some(json!(true)));
        assert_eq!(results[2].output, Some(json!({"body": "tiny"})));
        assert!(results[3].is_error());
        let total: usize = results.iter().map(json_len).sum();
        assert!(total <= 8_000, "{total}");
    }
}
