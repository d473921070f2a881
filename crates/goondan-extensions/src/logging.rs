//! `logging`: turns, steps and tool calls of the agent, logged through
//! `tracing` (target `goondan::extension::logging`; `gdn -v` shows info,
//! `-vv` debug).
//!
//! The original's messages and fields: `[logging.turn] start` (with
//! `turnId`, `traceId` when `includeTurnMetadata`, default true; else the
//! turn id in the text) and `complete` (`durationMs`, `finishReason`) at
//! info; `[logging.step] start` (`stepIndex`, `catalogSize`) and `complete`
//! (`durationMs`, `shouldContinue`) at info; `[logging.toolCall] start`
//! (`toolCallId`, `toolName`, `stepIndex`, and `args` when
//! `includeToolArgs`, default false) and `complete` (`durationMs`, `status`)
//! at debug. A turn or step that fails is logged at error (`failed`, with the
//! error). `level` (`debug`, `info` — the default —, `warn`, `error`) is the
//! least level the extension logs.
//!
//! The toolCall layer is only installed when `level` is `debug`: at any
//! other level it would log nothing, so tool calls pay nothing for it.

use std::sync::Arc;
use std::time::Instant;

use goondan_core::ToolResult;
use goondan_runtime::context::{StepContext, StepOutcome, TurnContext, TurnOutcome};
use goondan_runtime::extension::{AgentExtension, ExtensionError, ExtensionSetup};
use goondan_tools::{AsyncMiddleware, Next, ToolCallContext, async_layer};

use crate::fields::{self, Fields};

/// The Extension's name.
pub(crate) const NAME: &str = "logging";

/// The `tracing` target of every line.
pub const LOG_TARGET: &str = "goondan::extension::logging";

/// The original's levels, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Debug,
    Info,
    Warn,
    Error,
}

/// Logs at a level chosen at run time (`tracing`'s macros take constants).
macro_rules! log_at {
    ($level:expr, $($rest:tt)+) => {
        match $level {
            Level::Debug => tracing::debug!(target: LOG_TARGET, $($rest)+),
            Level::Info => tracing::info!(target: LOG_TARGET, $($rest)+),
            Level::Warn => tracing::warn!(target: LOG_TARGET, $($rest)+),
            Level::Error => tracing::error!(target: LOG_TARGET, $($rest)+),
        }
    };
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Settings {
    level: Level,
    include_tool_args: bool,
    include_turn_metadata: bool,
}

impl Settings {
    fn from_config(extension: &AgentExtension) -> Result<Self, ExtensionError> {
        let fields = Fields::new(&extension.name, &extension.config);
        let level = match fields.string("level")? {
            None | Some("info") => Level::Info,
            Some("debug") => Level::Debug,
            Some("warn") => Level::Warn,
            Some("error") => Level::Error,
            Some(other) => {
                return Err(fields::init_error(
                    extension,
                    "level",
                    format!("'{other}' is not one of debug, info, warn, error"),
                ));
            }
        };
        Ok(Self {
            level,
            include_tool_args: fields.boolean("includeToolArgs", false)?,
            include_turn_metadata: fields.boolean("includeTurnMetadata", true)?,
        })
    }

    fn logs(&self, level: Level) -> bool {
        level >= self.level
    }
}

/// Installs the turn and step layers, and the toolCall layer at `debug`.
pub(crate) fn install(setup: &mut ExtensionSetup<'_>, extension: &AgentExtension) -> Result<(), ExtensionError> {
    let settings = Settings::from_config(extension)?;
    let name = extension.name.as_str();
    setup.tooling.turn_middleware.register(name, 0, async_layer(Logger(settings)));
    setup.tooling.step_middleware.register(name, 0, async_layer(Logger(settings)));
    if settings.logs(Level::Debug)
        && !setup.tooling.register_tool_call_middleware(name, 0, async_layer(Logger(settings)))
    {
        return Err(ExtensionError::new(name, fields::E_EXT_INIT, "the agent's executor is already shared"));
    }
    Ok(())
}

/// The layer, in each of the three pipelines.
struct Logger(Settings);

impl AsyncMiddleware<TurnContext, TurnOutcome> for Logger {
    async fn handle<'a>(&'a self, ctx: &'a mut TurnContext, next: Next<'a, TurnContext, TurnOutcome>) -> TurnOutcome {
        let started = Instant::now();
        if self.0.logs(Level::Info) {
            if self.0.include_turn_metadata {
                log_at!(
                    Level::Info,
                    turnId = %ctx.turn_id,
                    traceId = %ctx.trace_id,
                    agent = %ctx.agent_name,
                    instanceKey = %ctx.instance_key,
                    "[logging.turn] start"
                );
            } else {
                log_at!(Level::Info, "[logging.turn] start turnId={}", ctx.turn_id);
            }
        }
        let outcome = next.run(ctx).await;
        let duration_ms = started.elapsed().as_millis();
        if outcome.end.is_failure() {
            if self.0.logs(Level::Error) {
                let error = outcome.end.note().unwrap_or_default();
                log_at!(Level::Error, turnId = %ctx.turn_id, durationMs = duration_ms, error = %error, "[logging.turn] failed");
            }
        } else if self.0.logs(Level::Info) {
            log_at!(
                Level::Info,
                turnId = %ctx.turn_id,
                durationMs = duration_ms,
                finishReason = outcome.end.as_str(),
                "[logging.turn] complete"
            );
        }
        outcome
    }
}

impl AsyncMiddleware<StepContext, StepOutcome> for Logger {
    async fn handle<'a>(&'a self, ctx: &'a mut StepContext, next: Next<'a, StepContext, StepOutcome>) -> StepOutcome {
        let started = Instant::now();
        if self.0.logs(Level::Info) {
            log_at!(
                Level::Info,
                turnId = %ctx.turn_id,
                stepIndex = ctx.step_index,
                catalogSize = ctx.tool_catalog.len(),
                "[logging.step] start"
            );
        }
        let outcome = next.run(ctx).await;
        let duration_ms = started.elapsed().as_millis();
        match &outcome.failure {
            Some(failure) if self.0.logs(Level::Error) => log_at!(
                Level::Error,
                turnId = %ctx.turn_id,
                stepIndex = ctx.step_index,
                durationMs = duration_ms,
                error = ?failure,
                "[logging.step] failed"
            ),
            Some(_) => {}
            None if self.0.logs(Level::Info) => log_at!(
                Level::Info,
                turnId = %ctx.turn_id,
                stepIndex = ctx.step_index,
                durationMs = duration_ms,
                shouldContinue = outcome.should_continue,
                "[logging.step] complete"
            ),
            None => {}
        }
        outcome
    }
}

impl AsyncMiddleware<ToolCallContext, ToolResult> for Logger {
    async fn handle<'a>(
        &'a self,
        ctx: &'a mut ToolCallContext,
        next: Next<'a, ToolCallContext, ToolResult>,
    ) -> ToolResult {
        let started = Instant::now();
        let scope = Arc::clone(ctx.scope());
        // A `None` field is not recorded: the arguments appear only when asked for.
        let args =
            self.0.include_tool_args.then(|| tracing::field::display(serde_json::Value::Object(ctx.args.clone())));
        log_at!(
            Level::Debug,
            turnId = %scope.turn_id,
            traceId = %scope.trace_id,
            stepIndex = scope.step_index,
            toolCallId = ctx.tool_call_id(),
            toolName = ctx.tool_name(),
            args = args,
            "[logging.toolCall] start"
        );
        let result = next.run(ctx).await;
        log_at!(
            Level::Debug,
            turnId = %scope.turn_id,
            stepIndex = scope.step_index,
            toolCallId = ctx.tool_call_id(),
            toolName = ctx.tool_name(),
            durationMs = started.elapsed().as_millis(),
            status = result.status.as_str(),
            "[logging.toolCall] complete"
        );
        result
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::fields::tests::extension;

    #[test]
    fn levels_and_config() {
        let settings = Settings::from_config(&extension(NAME, json!({"level": "info", "includeToolArgs": false})))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(settings, Settings { level: Level::Info, include_tool_args: false, include_turn_metadata: true });
        assert!(settings.logs(Level::Info) && settings.logs(Level::Error) && !settings.logs(Level::Debug));
        let settings =
            Settings::from_config(&extension(NAME, json!({"level": "error"}))).unwrap_or_else(|e| panic!("{e}"));
        assert!(!settings.logs(Level::Warn) && settings.logs(Level::Error));
        let error = Settings::from_config(&extension(NAME, json!({"level": "verbose"})))
            .err()
            .unwrap_or_else(|| panic!("accepted"));
        assert_eq!(error.code, "E_EXT_INIT");
        assert_eq!(error.message, "config.level: 'verbose' is not one of debug, info, warn, error");
        assert!(Settings::from_config(&extension(NAME, json!({"includeTurnMetadata": 1}))).is_err());
    }
}
