//! Command-line interface definition.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// gdn: run Goondan agent swarms.
#[derive(Debug, Parser)]
// `gdn help` is ours (error codes); `gdn help COMMAND` still shows a
// command's help, and `--help` works everywhere.
#[command(name = "gdn", version, about, propagate_version = true, disable_help_subcommand = true)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalOptions,
    #[command(subcommand)]
    pub command: Command,
}

impl Cli {
    /// `gdn run BUNDLE_PATH`, `gdn validate PATH` and `gdn package publish
    /// PATH` (the original's forms)
    /// name the bundle as -c does, and win over it as in the original: every
    /// command reads the bundle from `global.config` alone.
    pub fn take_positional_bundle(&mut self) {
        let positional = match &mut self.command {
            Command::Run(args) => args.bundle_path.take(),
            Command::Validate(args) => args.path.take(),
            Command::Package(PackageCommand::Publish(args)) => args.path.take(),
            _ => None,
        };
        if let Some(path) = positional {
            self.global.config = path;
        }
    }
}

/// Options every command takes.
#[derive(Debug, Clone, Args)]
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
    /// Where instances keep their conversations and event logs
    /// (default: GOONDAN_STATE_ROOT, else ~/.goondan).
    #[arg(long, global = true, value_name = "DIR")]
    pub state_root: Option<PathBuf>,
    /// The workspace of the state root to use (default: made from the
    /// Swarm's instanceKey, else its name, or, when that one is another
    /// bundle's, `<name>-<hash of the bundle's path>`); each workspace
    /// belongs to one bundle.
    #[arg(long, global = true, value_name = "NAME")]
    pub workspace: Option<String>,
    /// Take over a workspace another bundle wrote (a project that moved):
    /// its conversations continue with this bundle.
    #[arg(long, global = true)]
    pub adopt_workspace: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a turn of the entry agent (or an interactive session without input).
    Run(RunArgs),
    /// Check a bundle and report every problem.
    Validate(ValidateArgs),
    /// Manage agent instances (their conversations and event logs).
    ///
    /// Without a subcommand, on a terminal: an interactive list (↑/↓ or k/j move, r restarts,
    /// Del deletes after asking, q or Esc quits); elsewhere, or with --json, the 20 most
    /// recently used instances, as `gdn instance list -n 20`.
    Instance(InstanceArgs),
    /// Show what the project's agents and service did: turns, steps, tool calls, handoffs, connector events.
    Logs(LogsArgs),
    /// Tokens and cost of the project's model calls: every kind of token, priced by each Model's spec.pricing or the default table.
    Usage(UsageArgs),
    /// Open a read-only web page over the state root: instances, the agent graph, the flow of messages and tool calls, traces.
    Studio(StudioArgs),
    /// Check that this machine can run the bundle: runtimes, keys, MCP server programs, connector ports, state.
    Doctor(DoctorArgs),
    /// Stop the project's running service (`gdn run` with Connections): it drains, then exits.
    Stop(StopArgs),
    /// Restart the project's running service, or one agent's processes (--agent), at turn boundaries.
    Restart(RestartArgs),
    /// The project's tasks: pending tool results that complete later (background commands, …).
    #[command(subcommand)]
    Task(TaskCommand),
    /// Write a starter project.
    Init(InitArgs),
    /// Inspect and call tools.
    #[command(subcommand)]
    Tool(ToolCommand),
    /// Offer an agent's tools to MCP clients.
    #[command(subcommand)]
    Mcp(McpCommand),
    /// Explain an error code (E_TOOL_NOT_IN_CATALOG, AGENT_CRASHED, E_CONFIG_…), or list every code.
    Help(HelpArgs),
    /// Print the JSON Schema of a bundle's documents, for editors
    /// (`# yaml-language-server: $schema=…`), or of one kind's spec.
    Schema(SchemaArgs),
    /// Goondan's package registry.
    #[command(subcommand)]
    Registry(RegistryCommand),
    /// The bundle's packages: add, install, update, publish (goondan.yaml's
    /// Package document and goondan.lock.yaml).
    #[command(subcommand)]
    Package(PackageCommand),
    /// Run this machine's share of a swarm spread over NATS: agent processes the hub (`gdn run --nats`) places here.
    Host(HostArgs),
    /// An agent process of a running swarm (started by `gdn run`, not by hand).
    #[command(name = "__agent", hide = true)]
    Agent(AgentProcessArgs),
}

/// `gdn host`.
#[derive(Debug, Args)]
pub struct HostArgs {
    /// The NATS server (with JetStream) the hub and the hosts meet on; credentials come from
    /// NATS_CREDS, NATS_TOKEN or NATS_USER/NATS_PASSWORD in the environment.
    #[arg(long, value_name = "URL", env = "NATS_URL")]
    pub nats: String,
    /// A label of this host (repeatable): agents whose spec.placement.hostLabels ask for it run here.
    #[arg(long = "label", value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// This host's id among the swarm's hosts (default: hostname-pid).
    #[arg(long, value_name = "ID")]
    pub host_id: Option<String>,
    /// The working directory the agents' tools see here (default: the bundle directory).
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<PathBuf>,
    /// Read API keys and settings from this file too (as `gdn run --env-file`).
    #[arg(long, value_name = "FILE")]
    pub env_file: Option<PathBuf>,
    /// How long the broker waits for an acknowledgement before it delivers a message again
    /// (default 60 000; the tests shorten it to see redeliveries).
    #[arg(long, value_name = "MS", hide = true)]
    pub ack_wait_ms: Option<u64>,
}

#[derive(Debug, Subcommand)]
pub enum RegistryCommand {
    /// Serve a package registry over a storage directory (the original
    /// registry's protocol: packuments, tarballs, publish, deprecate,
    /// unpublish). Publishing needs a token of GOONDAN_REGISTRY_TOKENS
    /// (comma-separated); without any the registry is read-only.
    Serve(RegistryServeArgs),
}

#[derive(Debug, Subcommand)]
pub enum PackageCommand {
    /// Add a dependency to the Package document (the range given, else
    /// `^<latest>`), then install everything and write goondan.lock.yaml.
    Add(PackageAddArgs),
    /// Install the Package document's dependencies under the state root
    /// (`packages/<scope>/<name>/<version>/`) and write goondan.lock.yaml.
    Install(PackageInstallArgs),
    /// Move dependencies (all, or those named) to the registry's latest
    /// version, keeping `^`/`~`, then install.
    Update(PackageUpdateArgs),
    /// Validate the bundle, pack it and publish it to the registry (with
    /// GOONDAN_REGISTRY_TOKEN or the config file's token).
    Publish(PackagePublishArgs),
}

/// The registry of every `gdn package` command.
#[derive(Debug, Args)]
pub struct RegistryOption {
    /// The registry (default: GOONDAN_REGISTRY, the scope's registry of
    /// <state root>/config.json, its `registry`, else the original's).
    #[arg(long, value_name = "URL")]
    pub registry: Option<String>,
}

/// `gdn package add`.
#[derive(Debug, Args)]
pub struct PackageAddArgs {
    /// The package, with a version range or dist-tag: `@scope/name@^1.2.0`.
    #[arg(value_name = "NAME[@VERSION]")]
    pub reference: String,
    /// Accepted as the original does; Package documents have one
    /// dependency list.
    #[arg(short = 'D', long)]
    pub dev: bool,
    /// Write the exact version picked rather than `^<version>`.
    #[arg(short = 'E', long)]
    pub exact: bool,
    #[command(flatten)]
    pub registry: RegistryOption,
}

/// `gdn package install`.
#[derive(Debug, Args)]
pub struct PackageInstallArgs {
    /// Install exactly goondan.lock.yaml, and fail (changing nothing) when
    /// it does not match the Package document.
    #[arg(long)]
    pub frozen_lockfile: bool,
    #[command(flatten)]
    pub registry: RegistryOption,
}

/// `gdn package update`.
#[derive(Debug, Args)]
pub struct PackageUpdateArgs {
    /// The dependencies to update (default: all).
    #[arg(value_name = "NAME")]
    pub names: Vec<String>,
    /// Write exact versions rather than ranges.
    #[arg(short = 'E', long)]
    pub exact: bool,
    #[command(flatten)]
    pub registry: RegistryOption,
}

/// `gdn package publish`.
#[derive(Debug, Args)]
pub struct PackagePublishArgs {
    /// The bundle directory or YAML file to publish (the original's positional form; wins over -c).
    #[arg(value_name = "PATH")]
    pub path: Option<PathBuf>,
    /// The dist-tag pointed at the version.
    #[arg(long, default_value = "latest", value_name = "TAG")]
    pub tag: String,
    /// Who may read the package (default: spec.access, else public).
    #[arg(long, value_parser = ["public", "restricted"])]
    pub access: Option<String>,
    /// Pack and print what would be sent; send nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub registry: RegistryOption,
}

/// `gdn registry serve`.
#[derive(Debug, Args)]
pub struct RegistryServeArgs {
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1", value_name = "HOST")]
    pub host: String,
    /// The port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value_t = 4873, value_name = "N")]
    pub port: u16,
    /// Where packuments and tarballs are kept (made if missing).
    #[arg(long, value_name = "DIR")]
    pub storage: PathBuf,
    /// The base of the tarball URLs written at publish (default: the
    /// request's Host), for a registry behind a proxy.
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
}

/// `gdn help`.
#[derive(Debug, Args)]
pub struct HelpArgs {
    /// The code, in any case (without it: every code with its meaning).
    #[arg(value_name = "CODE")]
    pub code: Option<String>,
}

/// `gdn schema`.
#[derive(Debug, Args)]
pub struct SchemaArgs {
    /// Only this kind's `spec` (Package, Model, Agent, Swarm, Tool,
    /// Extension, Connector, Connection).
    #[arg(long, value_name = "KIND")]
    pub kind: Option<String>,
}

#[derive(Debug, Args)]
pub struct AgentProcessArgs {
    /// The instance it runs (`agent@key`), shown by `ps`; the orchestrator's
    /// `init` message is what counts.
    pub instance: Option<String>,
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

#[derive(Debug, Subcommand)]
pub enum McpCommand {
    /// Serve the agent's Tool Catalog as an MCP server, over stdio (default)
    /// or streamable HTTP; every call runs through the agent's pipeline.
    Serve(McpServeArgs),
}

#[derive(Debug, Args)]
pub struct McpServeArgs {
    /// The agent whose tools are served (default: the entry agent).
    #[arg(long)]
    pub agent: Option<String>,
    /// Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio
    /// (port 0 picks a free port; the URL is printed on standard output).
    #[arg(long, value_name = "HOST:PORT")]
    pub http: Option<String>,
    /// Allow a non-loopback --http address (needs --auth-token-env: anyone
    /// who reaches the address and holds the token can run the agent's tools).
    #[arg(long, requires = "http")]
    pub allow_remote: bool,
    /// Over --http, require `Authorization: Bearer <token>` on every request,
    /// the token read from this environment variable (or the .env file),
    /// never from the command line.
    #[arg(long, value_name = "NAME", requires = "http")]
    pub auth_token_env: Option<String>,
    /// The working directory the tools see (default: the bundle directory).
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<PathBuf>,
    /// Cancel a tool call after this many milliseconds (default 600000, ten
    /// minutes; 0 for no deadline).
    #[arg(long, value_name = "MS")]
    pub tool_timeout_ms: Option<u64>,
}

#[derive(Debug, Args)]
pub struct ToolCallArgs {
    /// The full tool name, e.g. json-query__query.
    pub name: String,
    /// The arguments as a JSON object.
    #[arg(long, value_name = "JSON", conflicts_with = "args_file")]
    pub args: Option<String>,
    /// Read the arguments (a JSON object) from a file; `-` reads standard
    /// input (at most 16 MiB).
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

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The bundle directory or YAML file (the original's positional form of -c; wins over -c).
    #[arg(value_name = "BUNDLE_PATH")]
    pub bundle_path: Option<PathBuf>,
    /// The input of one turn; without it (and without --input-file) gdn starts an interactive session.
    #[arg(long, value_name = "TEXT", conflicts_with = "input_file")]
    pub input: Option<String>,
    /// Read the input from a file (`-` for standard input; at most 8 MiB).
    #[arg(long, value_name = "FILE")]
    pub input_file: Option<PathBuf>,
    /// The agent (default: the entry agent of the bundle's Swarm).
    #[arg(long)]
    pub agent: Option<String>,
    /// The instance whose conversation continues (default: the Swarm's instanceKey, else `default`).
    #[arg(long, value_name = "KEY")]
    pub instance_key: Option<String>,
    /// The working directory the agent's tools see (default: the bundle directory).
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<PathBuf>,
    /// Read API keys and settings from this file too, over the bundle
    /// directory's .env and .env.local (which are read without it) and the
    /// process environment.
    #[arg(long, value_name = "FILE")]
    pub env_file: Option<PathBuf>,
    /// Cancel a tool call after this many milliseconds (default 600000, ten
    /// minutes; 0 for no deadline).
    #[arg(long, value_name = "MS")]
    pub tool_timeout_ms: Option<u64>,
    /// The most agent processes alive at once (default: available memory / 64 MiB, 4 to 128).
    #[arg(long, value_name = "N", env = "GOONDAN_MAX_AGENT_PROCESSES", value_parser = clap::value_parser!(u64).range(1..))]
    pub max_agent_processes: Option<u64>,
    /// Stop an agent process that has been idle this many seconds; the next message starts it again (default 300; 0: never).
    #[arg(long, value_name = "SECONDS", env = "GOONDAN_AGENT_IDLE_SECS")]
    pub agent_idle_secs: Option<u64>,
    /// Run this Swarm (default: the Swarm of --agent, else the bundle's first); its Connections start.
    #[arg(long, short = 's')]
    pub swarm: Option<String>,
    /// With Connections: how long running turns may take to finish when the service stops (default: the
    /// Swarm's policy.shutdown.gracePeriodSeconds, else 30).
    #[arg(long, value_name = "SECONDS")]
    pub drain_secs: Option<u64>,
    /// Spread the swarm over NATS (JetStream): agent processes run on agent hosts (`gdn host
    /// --nats URL`) instead of here; credentials from NATS_CREDS, NATS_TOKEN or NATS_USER/NATS_PASSWORD.
    #[arg(long, value_name = "URL")]
    pub nats: Option<String>,
    /// With --nats: wait until this many agent hosts have joined before the first turn.
    #[arg(long, value_name = "N", requires = "nats")]
    pub wait_hosts: Option<usize>,
    /// How long --wait-hosts waits before giving up (default 60).
    #[arg(long, value_name = "SECONDS", requires = "wait_hosts", default_value_t = 60)]
    pub wait_hosts_secs: u64,
    /// Watch the bundle and the entry files of its Tools, Extensions and Connectors: an edit
    /// restarts only what it changes, at turn boundaries; a bundle that no longer validates is
    /// reported and the running one kept.
    #[arg(long, short = 'w', conflicts_with_all = ["input", "input_file"])]
    pub watch: bool,
    /// With Connections: run the service in the background (logs to the workspace's logs/service.log);
    /// returns once it serves, or with its start-up error.
    #[arg(long, conflicts_with = "foreground")]
    pub detach: bool,
    /// Run attached to the terminal (the default; accepted as the original's tutorial writes it).
    #[arg(long)]
    pub foreground: bool,
    /// Accepted as the original does (where it had no effect either): without --input gdn is interactive.
    #[arg(long)]
    pub interactive: bool,
    /// Accepted as the original does (where it had no effect either): `gdn run` installs nothing;
    /// `gdn package install` does.
    #[arg(long)]
    pub no_install: bool,
}

/// `gdn instance [COMMAND]`: a subcommand, or none (crate::instance_tui).
#[derive(Debug, Args)]
pub struct InstanceArgs {
    #[command(subcommand)]
    pub command: Option<InstanceCommand>,
}

#[derive(Debug, Subcommand)]
pub enum InstanceCommand {
    /// List agent instances, most recently used first, and whether a process runs them.
    List {
        /// Only this agent's instances (any case).
        #[arg(long, short = 'a', value_name = "NAME")]
        agent: Option<String>,
        /// At most this many rows, most recently used first (default: all).
        #[arg(long, short = 'n', value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        limit: Option<u64>,
        /// Every instance, whatever --limit says (the default without --limit; the original's was 20).
        #[arg(long)]
        all: bool,
        /// A swarm spread over agent hosts: list its instances as the NATS server's state
        /// stream has them, with the host each one is on (credentials from NATS_CREDS,
        /// NATS_TOKEN or NATS_USER/NATS_PASSWORD).
        #[arg(long, value_name = "URL")]
        nats: Option<String>,
    },
    /// Restart every agent's process of an instance key in the running
    /// service: each finishes its running turn first; the next message
    /// starts it with the bundle as it is now.
    Restart {
        /// The instance key (as `gdn instance list` shows it).
        key: String,
        /// Clear the instances' conversations (messages and event logs) too.
        #[arg(long)]
        fresh: bool,
    },
    /// Delete the conversations and event logs of an instance key in the
    /// bundle's workspace (or --workspace's): every agent's, or only
    /// --agent's. Asks first (on a terminal); --force does not ask, and
    /// stops the instances in the running service first.
    Delete {
        /// The instance key.
        key: String,
        /// Only this agent's instance of the key.
        #[arg(long, value_name = "NAME")]
        agent: Option<String>,
        /// Delete without asking; instances the service runs are stopped (after their running turns) first.
        #[arg(long, short = 'f')]
        force: bool,
    },
}

/// `gdn task`.
#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// Every task of the project's instances, most recent first.
    List {
        /// A swarm spread over agent hosts: the tasks of its instances as the NATS server's
        /// state stream has them (credentials as for `gdn host`).
        #[arg(long, value_name = "URL")]
        nats: Option<String>,
    },
    /// One task: where it stands, its result or why it failed.
    Show {
        /// The task's handle (as the pending result and `gdn task list` show it).
        handle: String,
        /// A swarm spread over agent hosts: read the task from the NATS server's state stream.
        #[arg(long, value_name = "URL")]
        nats: Option<String>,
    },
    /// Cancel a working task (its background command is ended) through the running service.
    Cancel {
        /// The task's handle.
        handle: String,
        /// How long to wait for the task to end.
        #[arg(long, value_name = "SECONDS", default_value_t = 15)]
        wait_secs: u64,
        /// A swarm spread over agent hosts: find the task (and see it end) in the NATS
        /// server's state stream; the cancel goes through the running service (the hub).
        #[arg(long, value_name = "URL")]
        nats: Option<String>,
    },
}

/// `gdn restart`.
#[derive(Debug, Args)]
pub struct RestartArgs {
    /// Only this agent's processes (each after its running turn); other agents and the connectors go on.
    #[arg(long, short = 'a', value_name = "NAME")]
    pub agent: Option<String>,
    /// Clear the conversations (messages and event logs) of what restarts.
    #[arg(long)]
    pub fresh: bool,
    /// How long to wait for running turns to finish and the service to serve again.
    #[arg(long, value_name = "SECONDS", default_value_t = 600)]
    pub wait_secs: u64,
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// The directory to create the project in (default: the current directory).
    pub path: Option<PathBuf>,
    /// The template.
    #[arg(long, short = 't', value_enum, default_value = "default")]
    pub template: Template,
    /// The Package document's name (default: the directory's name).
    #[arg(long, short = 'n', value_name = "NAME")]
    pub name: Option<String>,
    /// Make the directory a git repository (the default, as the original; not inside one already).
    #[arg(long, overrides_with = "no_git")]
    pub git: bool,
    /// Do not run `git init`.
    #[arg(long, overrides_with = "git")]
    pub no_git: bool,
    /// Overwrite files that exist.
    #[arg(long, short = 'f')]
    pub force: bool,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Template {
    /// One agent with the built-in tools.
    Default,
    /// A planner, a coder and a reviewer agent.
    MultiAgent,
    /// One agent, laid out to be published as a package (`gdn package publish`).
    Package,
    /// goondan.yaml alone: one agent, no tools, no other files.
    Minimal,
}

/// `gdn validate`.
#[derive(Debug, Args, Default)]
pub struct ValidateArgs {
    /// The bundle directory or YAML file (the original's positional form of -c; wins over -c).
    #[arg(value_name = "PATH")]
    pub path: Option<PathBuf>,
    /// Add `apiVersion: goondan.ai/v1` to documents with a kind and no apiVersion (a line
    /// inserted, nothing else changed), say what changed, then check.
    #[arg(long)]
    pub fix: bool,
    /// Warnings fail the check too (exit 1).
    #[arg(long)]
    pub strict: bool,
    /// How to print the report (default: text, or json with --json).
    #[arg(long, value_enum)]
    pub format: Option<ValidateFormat>,
}

/// `gdn validate --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ValidateFormat {
    /// For people: each problem with its line and a suggestion.
    Text,
    /// `{"valid", "strict", "diagnostics"}`.
    Json,
    /// GitHub Actions workflow commands (`::error file=…,line=…,col=…::…`), one per problem.
    Github,
}

/// `gdn stop`.
#[derive(Debug, Args)]
pub struct StopArgs {
    /// How long to wait for the service to finish its running turns and exit (default: as long as its
    /// stop may take, the Swarm's policy.shutdown.gracePeriodSeconds included; at least 60).
    #[arg(long, value_name = "SECONDS")]
    pub wait_secs: Option<u64>,
}

/// `gdn logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Only this instance key.
    #[arg(long, short = 'i', value_name = "KEY")]
    pub instance_key: Option<String>,
    /// Only this agent.
    #[arg(long, short = 'a', value_name = "NAME")]
    pub agent: Option<String>,
    /// Only this trace (a turn and the turns it led to).
    #[arg(long)]
    pub trace: Option<String>,
    /// How many of the latest lines to show first.
    #[arg(long, short = 'l', default_value_t = 200)]
    pub lines: usize,
    /// The original's process log to read: `orchestrator` (the default) is every process
    /// here; an agent's name is the same as --agent.
    #[arg(long, short = 'p', value_name = "NAME")]
    pub process: Option<String>,
    /// Accepted as the original's (stdout, stderr, both): our log is one stream of
    /// records, not a process's output, so every choice shows it all.
    #[arg(long, value_parser = ["stdout", "stderr", "both"], default_value = "both")]
    pub stream: String,
    /// Keep printing new lines as they are written (Ctrl-C ends).
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// A swarm spread over agent hosts: read its instances' event logs from the NATS
    /// server's state stream (credentials as for `gdn host`).
    #[arg(long, value_name = "URL")]
    pub nats: Option<String>,
}

/// `gdn usage`.
#[derive(Debug, Args)]
pub struct UsageArgs {
    /// Only steps of the last DURATION: a whole number of s, m, h or d (90m, 24h, 7d).
    #[arg(long, value_name = "DURATION", value_parser = crate::usage::parse_since)]
    pub since: Option<std::time::Duration>,
    /// One row per agent, instance, model or UTC day (and the total).
    #[arg(long, value_enum)]
    pub by: Option<UsageBy>,
}

/// `gdn usage --by`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum UsageBy {
    Agent,
    Instance,
    Model,
    Day,
}

impl UsageBy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Instance => "instance",
            Self::Model => "model",
            Self::Day => "day",
        }
    }
}

/// `gdn doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Repair what can be repaired: make the state root private (directories 0700, files 0600).
    #[arg(long)]
    pub fix: bool,
}

/// `gdn studio`.
#[derive(Debug, Args)]
pub struct StudioArgs {
    /// The address to listen on (beyond loopback only with --auth-token-env).
    #[arg(long, default_value = "127.0.0.1", value_name = "HOST")]
    pub host: String,
    /// Require a token on every request, read from this environment variable
    /// (or the .env file), never from the command line: `Authorization:
    /// Bearer <token>`, or the cookie that the printed URL's `?token=` sets.
    #[arg(long, value_name = "NAME")]
    pub auth_token_env: Option<String>,
    /// The port to listen on (0: any free port).
    #[arg(long, default_value_t = 4317, value_name = "N")]
    pub port: u16,
    /// Open a browser on the page (the default).
    #[arg(long)]
    pub open: bool,
    /// Do not open a browser.
    #[arg(long)]
    pub no_open: bool,
    /// A swarm spread over agent hosts: show its instances as the NATS server's state stream
    /// has them, kept up to date (credentials as for `gdn host`).
    #[arg(long, value_name = "URL")]
    pub nats: Option<String>,
}
