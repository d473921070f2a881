//! `gdn help [CODE]`: what an error code means, from the help catalog
//! (`docs/ERRORS.md`, compiled in as [`goondan_core::help`]).
//!
//! With a code (any case) it prints the code's entry; without one, every
//! code with its one-line meaning. `gdn help COMMAND` still shows a
//! command's help, as clap's own `help` subcommand did.

use std::io::Write;

use anyhow::Result;
use clap::CommandFactory;
use goondan_core::help::{self, ERRORS_URL, Entry};
use serde_json::json;

use crate::cli::{Cli, GlobalOptions, HelpArgs};
use crate::exit;
use crate::output::{self, BOLD, DIM, HELP, Output};

/// How many codes an unknown code's suggestion names at most.
const MAX_SUGGESTIONS: usize = 5;

/// `gdn help`.
pub fn help(global: &GlobalOptions, args: &HelpArgs, out: &mut Output) -> Result<u8> {
    let Some(asked) = args.code.as_deref().map(str::trim) else {
        list(global, out)?;
        return Ok(exit::OK);
    };
    if let Some(entry) = help::lookup(asked) {
        show(global, entry, out)?;
        return Ok(exit::OK);
    }
    // `gdn help run`: the command's help, as before this subcommand existed.
    let mut command = Cli::command();
    command.build();
    if let Some(sub) = command.find_subcommand_mut(asked).filter(|sub| !sub.is_hide_set()) {
        write!(out.stdout, "{}", sub.render_long_help())?;
        return Ok(exit::OK);
    }
    let suggestions = suggestions(asked);
    let message = format!("unknown error code '{asked}'");
    if global.json {
        let body = json!({"error": message, "suggestions": suggestions, "helpUrl": ERRORS_URL});
        writeln!(out.stdout, "{body}")?;
    }
    output::error_line(&mut out.stderr, &message)?;
    let hint = match suggestions.as_slice() {
        [] => "`gdn help` lists every code".to_owned(),
        [one] => format!("did you mean {one}?"),
        many => format!("did you mean one of: {}?", many.join(", ")),
    };
    writeln!(out.stderr, "  {HELP}help:{HELP:#} {hint}")?;
    Ok(exit::USAGE)
}

/// The known codes closest to `asked`: the nearest by spelling
/// ([`goondan_core::naming::closest`]), then those that contain it
/// (`TIMEOUT` → `E_TOOL_TIMEOUT`, `E_HTTP_TIMEOUT`, …).
pub fn suggestions(asked: &str) -> Vec<&'static str> {
    let codes = || help::entries().iter().map(|entry| entry.code);
    let mut found: Vec<&'static str> = goondan_core::naming::closest(asked, codes()).into_iter().collect();
    let upper = asked.to_ascii_uppercase();
    if upper.len() >= 3 {
        for code in codes().filter(|code| code.contains(upper.as_str())) {
            if found.len() >= MAX_SUGGESTIONS {
                break;
            }
            if !found.contains(&code) {
                found.push(code);
            }
        }
    }
    found
}

fn show(global: &GlobalOptions, entry: &Entry<'static>, out: &mut Output) -> Result<()> {
    if global.json {
        let body = json!({
            "code": entry.code,
            "group": entry.group,
            "summary": entry.summary,
            "body": entry.body,
            "helpUrl": entry.url(),
        });
        writeln!(out.stdout, "{}", serde_json::to_string_pretty(&body)?)?;
        return Ok(());
    }
    writeln!(out.stdout, "{BOLD}{}{BOLD:#} {DIM}({}){DIM:#}", entry.code, entry.group)?;
    writeln!(out.stdout)?;
    // The Markdown as written, without the emphasis marks.
    writeln!(out.stdout, "{}", entry.body.replace("**", ""))?;
    writeln!(out.stdout)?;
    writeln!(out.stdout, "{DIM}{}{DIM:#}", entry.url())?;
    Ok(())
}

fn list(global: &GlobalOptions, out: &mut Output) -> Result<()> {
    let entries = help::entries();
    if global.json {
        let codes: Vec<_> = entries
            .iter()
            .map(|entry| json!({"code": entry.code, "group": entry.group, "summary": entry.summary, "helpUrl": entry.url()}))
            .collect();
        writeln!(out.stdout, "{}", serde_json::to_string_pretty(&json!({"codes": codes}))?)?;
        return Ok(());
    }
    writeln!(out.stdout, "The error codes of goondan-rs; `gdn help CODE` explains one (`gdn --help`: the commands).")?;
    let width = entries.iter().map(|entry| entry.code.len()).max().unwrap_or(0);
    let mut group = None;
    for entry in entries {
        if group != Some(entry.group) {
            group = Some(entry.group);
            writeln!(out.stdout)?;
            writeln!(out.stdout, "{BOLD}{}{BOLD:#}", entry.group)?;
        }
        writeln!(out.stdout, "  {:<width$}  {}", entry.code, entry.summary)?;
    }
    writeln!(out.stdout)?;
    writeln!(out.stdout, "{DIM}{ERRORS_URL}{DIM:#}")?;
    Ok(())
}

/// The line that points at `gdn help CODE`, for an error that shows a code
/// the catalog explains; `None` for another code.
pub fn hint(code: &str) -> Option<String> {
    help::lookup(code).map(|entry| format!("{HELP}help:{HELP:#} `gdn help {}` explains this code", entry.code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_misspelt_code_suggests_the_nearest_first() {
        assert_eq!(suggestions("E_TOOL_NOT_IN_CATALG").first(), Some(&"E_TOOL_NOT_IN_CATALOG"));
        assert_eq!(suggestions("e_tool_timeot").first(), Some(&"E_TOOL_TIMEOUT"));
    }

    #[test]
    fn a_part_of_a_code_suggests_the_codes_that_contain_it() {
        let found = suggestions("timeout");
        for code in ["E_TOOL_TIMEOUT", "E_HTTP_TIMEOUT", "AGENT_REQUEST_TIMEOUT"] {
            assert!(found.contains(&code), "{found:?}");
        }
        assert!(found.len() <= MAX_SUGGESTIONS);
        assert!(suggestions("QQQQQQQQQQ").is_empty());
    }

    #[test]
    fn the_hint_names_the_code_as_the_catalog_writes_it() {
        let Some(line) = hint("e_tool_timeout") else { panic!("no hint for a known code") };
        assert!(line.contains("`gdn help E_TOOL_TIMEOUT`"), "{line}");
        assert_eq!(hint("E_SOMETHING_OF_MY_OWN"), None);
    }
}
