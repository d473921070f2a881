//! Command-line interface definition.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// gdn: run Goondan agent swarms.
#[derive(Debug, Parser)]
#[command(name = "gdn", version, about, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalOptions,
    #[command(subcommand)]
    pub command: Command,
}

/// Options every command takes.
#[derive(Debug, Args)]
pub struct GlobalOptions {
    /// Bundle directory or YAML file.
    #[arg(short = 'c', long = "config", global = true, value_name = "PATH", default_value = "./goondan.yaml")]
    pub config: PathBuf,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    pub json: bool,
    /// More log output (-v info, -vv debug, -vvv trace).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Only errors.
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,
    /// Never use colors.
    #[arg(long, global = true)]
    pub no_color: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check a bundle and report every problem.
    Validate,
    /// Inspect and call tools.
    #[command(subcommand)]
    Tool(ToolCommand),
}

#[derive(Debug, Subcommand)]
pub enum ToolCommand {
    /// Show the Tool Catalog an agent's first step would get.
    List {
        /// The agent (default: the entry agent of the bundle's Swarm).
        #[arg(long)]
        agent: Option<String>,
    },
    /// Run one tool call through the full pipeline and print its ToolResult.
    Call(ToolCallArgs),
}

#[derive(Debug, Args)]
pub struct ToolCallArgs {
    /// The full tool name, e.g. json-query__query.
    pub name: String,
    /// The arguments as a JSON object.
    #[arg(long, value_name = "JSON", conflicts_with = "args_file")]
    pub args: Option<String>,
    /// Read the arguments (a JSON object) from a file; `-` reads standard input.
    #[arg(long, value_name = "FILE")]
    pub args_file: Option<PathBuf>,
    /// The agent whose catalog is used (default: the entry agent).
    #[arg(long)]
    pub agent: Option<String>,
    /// The working directory the tool sees (default: the bundle directory).
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<PathBuf>,
    /// Cancel the handler after this many milliseconds.
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,
}
