//! `gdn init`: a starter project, from the original's templates `default`
//! (one assistant), `multi-agent` (planner, coder, reviewer), `package` and
//! `minimal` (goondan.yaml alone), made a git repository as the original
//! does (unless --no-git), with the
//! JSON Schema of its documents beside it for editors; and `gdn schema`,
//! which prints that schema.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use clap::ValueEnum as _;

use crate::cli::{GlobalOptions, InitArgs, SchemaArgs, Template};
use crate::exit;
use crate::output::{self, Output};

/// The files of a template: relative path → content.
fn files(template: Template, name: &str) -> Vec<(&'static str, String)> {
    let model = "apiVersion: goondan.ai/v1\nkind: Model\nmetadata:\n  name: claude\nspec:\n  provider: anthropic\n  model: claude-sonnet-4-20250514\n  apiKey:\n    valueFrom:\n      env: ANTHROPIC_API_KEY\n";
    let package = format!(
        "apiVersion: goondan.ai/v1\nkind: Package\nmetadata:\n  name: \"{name}\"\nspec:\n  version: \"0.1.0\"\n"
    );
    let agent = |agent: &str, prompt_file: &str, tools: &[&str]| {
        let mut text = format!(
            "apiVersion: goondan.ai/v1\nkind: Agent\nmetadata:\n  name: {agent}\nspec:\n  modelConfig:\n    modelRef: \"Model/claude\"\n  prompt:\n    systemRef: ./prompts/{prompt_file}\n"
        );
        if !tools.is_empty() {
            text.push_str("  tools:\n");
            for tool in tools {
                text.push_str(&format!("    - ref: {{kind: Tool, name: {tool}, package: \"@goondan/base\"}}\n"));
            }
        }
        text
    };
    let swarm = |agents: &[&str], entry: &str| {
        let mut text = format!(
            "apiVersion: goondan.ai/v1\nkind: Swarm\nmetadata:\n  name: default\nspec:\n  entryAgent: \"Agent/{entry}\"\n  agents:\n"
        );
        for agent in agents {
            text.push_str(&format!("    - ref: \"Agent/{agent}\"\n"));
        }
        text.push_str("  policy:\n    maxStepsPerTurn: 32\n");
        text
    };
    let env =
        "# API keys and settings, read by `gdn run` (.env.local, then this file, win over the environment).\n# ANTHROPIC_API_KEY=sk-ant-...\n"
            .to_owned();
    let gitignore = ".env\n.env.local\n".to_owned();
    let documents = |documents: Vec<String>| format!("{SCHEMA_LINE}\n{}", documents.join("---\n"));
    let schema = document_schema_text();
    match template {
        Template::Default => vec![
            (
                "goondan.yaml",
                documents(vec![
                    package,
                    model.to_owned(),
                    agent("assistant", "default.system.md", &["file-system", "bash", "http-fetch"]),
                    swarm(&["assistant"], "assistant"),
                ]),
            ),
            (SCHEMA_FILE, schema),
            ("prompts/default.system.md", "You are a helpful assistant.\n".to_owned()),
            (".env", env),
            (".gitignore", gitignore),
        ],
        Template::MultiAgent => vec![
            (
                "goondan.yaml",
                documents(vec![
                    package,
                    model.to_owned(),
                    agent("planner", "planner.system.md", &["agents"]),
                    agent("coder", "coder.system.md", &["file-system", "bash"]),
                    agent("reviewer", "reviewer.system.md", &["file-system"]),
                    swarm(&["planner", "coder", "reviewer"], "planner"),
                ]),
            ),
            (SCHEMA_FILE, schema),
            ("prompts/planner.system.md", "You are a planning agent. Break tasks into steps.\n".to_owned()),
            ("prompts/coder.system.md", "You are a coding agent. Implement the plan.\n".to_owned()),
            ("prompts/reviewer.system.md", "You are a code reviewer. Review code for correctness.\n".to_owned()),
            (".env", env),
            (".gitignore", gitignore),
        ],
        // The original's `package`: the default's documents, no prompts
        // directory (the prompt inline), and dist/ ignored.
        Template::Package => vec![
            (
                "goondan.yaml",
                documents(vec![
                    package,
                    model.to_owned(),
                    inline_agent("assistant", &["file-system", "bash", "http-fetch"]),
                    swarm(&["assistant"], "assistant"),
                ]),
            ),
            (SCHEMA_FILE, schema),
            (".env", env),
            (".gitignore", format!("{gitignore}dist/\n")),
        ],
        // The original's `minimal`: goondan.yaml and nothing else (so no
        // schema line naming a file that is not there).
        Template::Minimal => vec![(
            "goondan.yaml",
            [package, model.to_owned(), inline_agent("assistant", &[]), swarm(&["assistant"], "assistant")]
                .join("---\n"),
        )],
    }
}

/// An Agent whose system prompt is in the document (templates without a prompts directory).
fn inline_agent(agent: &str, tools: &[&str]) -> String {
    let mut text = format!(
        "apiVersion: goondan.ai/v1\nkind: Agent\nmetadata:\n  name: {agent}\nspec:\n  modelConfig:\n    modelRef: \"Model/claude\"\n  prompt:\n    system: |\n      You are a helpful assistant.\n"
    );
    if !tools.is_empty() {
        text.push_str("  tools:\n");
        for tool in tools {
            text.push_str(&format!("    - ref: {{kind: Tool, name: {tool}, package: \"@goondan/base\"}}\n"));
        }
    }
    text
}

/// The schema file `gdn init` writes beside goondan.yaml.
const SCHEMA_FILE: &str = "goondan.schema.json";

/// goondan.yaml's first line: editors with the YAML language server check
/// and complete every document against [`SCHEMA_FILE`].
const SCHEMA_LINE: &str = "# yaml-language-server: $schema=./goondan.schema.json";

fn document_schema_text() -> String {
    let schema = goondan_config::schema::document_schema();
    let mut text = serde_json::to_string_pretty(&schema).unwrap_or_else(|_| schema.to_string());
    text.push('\n');
    text
}

/// `gdn schema [--kind KIND]`.
pub fn schema(args: &SchemaArgs, out: &mut Output) -> Result<u8> {
    let text = match &args.kind {
        None => document_schema_text(),
        Some(name) => {
            let Some(kind) = goondan_config::Kind::ALL.iter().find(|kind| kind.as_str().eq_ignore_ascii_case(name))
            else {
                let kinds: Vec<&str> = goondan_config::Kind::ALL.iter().map(|kind| kind.as_str()).collect();
                return out.fail(exit::USAGE, format_args!("no kind '{name}': one of {}", kinds.join(", ")));
            };
            let schema = goondan_config::schema::kind_spec_schema(*kind);
            let mut text = serde_json::to_string_pretty(&schema)?;
            text.push('\n');
            text
        }
    };
    out.stdout.write_all(text.as_bytes())?;
    Ok(exit::OK)
}

/// `gdn init [PATH]`.
pub fn init(global: &GlobalOptions, args: &InitArgs, out: &mut Output) -> Result<u8> {
    let dir: PathBuf = args.path.clone().unwrap_or_else(|| PathBuf::from("."));
    let name = match &args.name {
        Some(name) if !name.trim().is_empty() && !name.contains(['"', '\\', '\n', '\r']) => name.clone(),
        Some(name) => {
            return out.fail(
                exit::USAGE,
                format_args!("--name {name:?}: a package name, without quotes, backslashes or line breaks"),
            );
        }
        None => project_name(&dir),
    };
    let files = files(args.template, &name);
    if !args.force {
        let mut existing: Vec<String> =
            files.iter().map(|(path, _)| *path).filter(|path| dir.join(path).exists()).map(str::to_owned).collect();
        // A bundle split over files (agents.yaml, …) is a bundle already:
        // a new goondan.yaml would join it.
        for found in goondan_config::packages::collect_bundle_files(&dir) {
            let relative = found.strip_prefix(&dir).unwrap_or(&found).display().to_string();
            if !existing.contains(&relative) {
                existing.push(relative);
            }
        }
        if !existing.is_empty() {
            return out.fail(
                exit::CONFIG,
                format_args!("{} already has {}; use --force to overwrite", dir.display(), existing.join(", ")),
            );
        }
    }
    for (path, content) in &files {
        let full = dir.join(path);
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&full, content).with_context(|| format!("writing {}", full.display()))?;
    }
    // As the original: `git init` unless --no-git, and a missing git is no
    // failure. Not inside a repository already: a nested one would hide the
    // project from it.
    let git = if args.no_git { GitInit::NotAsked } else { git_init(&dir) };
    if global.json {
        let created: Vec<&str> = files.iter().map(|(path, _)| *path).collect();
        let template = args.template.to_possible_value().map(|value| value.get_name().to_owned()).unwrap_or_default();
        let body = serde_json::json!({"projectDir": dir, "template": template, "filesCreated": created, "gitInitialized": git == GitInit::Done});
        writeln!(out.stdout, "{body}")?;
    } else {
        writeln!(
            out.stdout,
            "{}✓{} created {} in {}",
            output::OK,
            output::OK.render_reset(),
            files.len(),
            dir.display()
        )?;
        for (path, _) in &files {
            writeln!(out.stdout, "  {path}")?;
        }
        match git {
            GitInit::Done => writeln!(out.stdout, "Git repository initialized")?,
            GitInit::InsideRepository => writeln!(out.stdout, "git init skipped: already inside a git repository")?,
            GitInit::Failed(why) => writeln!(out.stdout, "git init skipped: {why}")?,
            GitInit::NotAsked => {}
        }
        writeln!(out.stdout, "Next: set ANTHROPIC_API_KEY (or edit the Model), then `gdn -c {} run`.", dir.display())?;
    }
    Ok(exit::OK)
}

/// What became of `git init`.
#[derive(Debug, PartialEq, Eq)]
enum GitInit {
    Done,
    NotAsked,
    InsideRepository,
    /// git is missing or failed: why.
    Failed(String),
}

fn git_init(dir: &Path) -> GitInit {
    let inside = std::process::Command::new("git")
        .args(["rev-parse", "--is-inside-work-tree"])
        .current_dir(dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    match inside {
        Err(error) => return GitInit::Failed(format!("git: {error}")),
        Ok(status) if status.success() => return GitInit::InsideRepository,
        Ok(_) => {}
    }
    match std::process::Command::new("git").arg("init").arg("--quiet").current_dir(dir).output() {
        Ok(output) if output.status.success() => GitInit::Done,
        Ok(output) => GitInit::Failed(String::from_utf8_lossy(&output.stderr).trim().to_owned()),
        Err(error) => GitInit::Failed(format!("git: {error}")),
    }
}

/// A package name from the directory's name (lowercase, npm-safe).
fn project_name(dir: &Path) -> String {
    let base = std::fs::canonicalize(dir)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .or_else(|| dir.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "my-swarm".to_owned());
    let cleaned: String = base
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' })
        .collect();
    let cleaned = cleaned.trim_matches(|c| c == '-' || c == '_').to_owned();
    if cleaned.is_empty() { "my-swarm".to_owned() } else { cleaned }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_is_a_valid_bundle() {
        for template in [Template::Default, Template::MultiAgent, Template::Package, Template::Minimal] {
            let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
            for (path, content) in files(template, "demo") {
                let full = dir.path().join(path);
                if let Some(parent) = full.parent() {
                    std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("{e}"));
                }
                std::fs::write(full, content).unwrap_or_else(|e| panic!("{e}"));
            }
            let report = goondan_config::load_bundle(dir.path());
            assert!(!report.has_errors(), "{template:?}: {:#?}", report.diagnostics);
        }
    }

    #[test]
    fn names_are_package_safe() {
        assert_eq!(project_name(Path::new("/tmp/My Project!")), "my-project");
        assert_eq!(project_name(Path::new("")), "my-swarm");
    }
}
