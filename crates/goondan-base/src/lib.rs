//! Native handlers for the built-in tools of the `@goondan/base` package.
//!
//! The manifests (names, exports, parameter schemas) live in
//! `goondan-config`'s built-in package, identical to the original's so that
//! existing bundles work; this crate supplies the code behind them.
//! [`native_handler`] maps `(tool, export)` to a handler.

use std::sync::Arc;

use goondan_tools::ToolHandler;

pub mod args;
pub mod json_query;
pub mod self_restart;
pub mod text_transform;
pub mod wait;

/// The package name under which these tools are referenced.
pub const BASE_PACKAGE: &str = "@goondan/base";

/// The native handler of `tool`'s `export`, if this build has one.
pub fn native_handler(tool: &str, export: &str) -> Option<Arc<dyn ToolHandler>> {
    match tool {
        "json-query" => json_query::handler(export),
        "text-transform" => text_transform::handler(export),
        "wait" => wait::handler(export),
        "self-restart" => self_restart::handler(export),
        _ => None,
    }
}
