//! Writing to the terminal: colors when it is one (and NO_COLOR is unset),
//! plain text otherwise. Error and warning lines are written here and
//! nowhere else, so they look the same whichever command prints them.

use std::fmt::Display;
use std::io::{self, Write};

use anstream::{AutoStream, ColorChoice};
use anstyle::{AnsiColor, Style};
use goondan_config::{Diagnostic, Severity};

/// Standard output and error with the chosen color mode.
pub struct Output {
    pub stdout: AutoStream<std::io::Stdout>,
    pub stderr: AutoStream<std::io::Stderr>,
}

impl Output {
    pub fn new(no_color: bool) -> Self {
        let choice = if no_color { ColorChoice::Never } else { ColorChoice::Auto };
        Self { stdout: AutoStream::new(std::io::stdout(), choice), stderr: AutoStream::new(std::io::stderr(), choice) }
    }
}

pub const ERROR: Style = AnsiColor::Red.on_default().bold();
pub const WARNING: Style = AnsiColor::Yellow.on_default().bold();
pub const OK: Style = AnsiColor::Green.on_default().bold();
pub const DIM: Style = Style::new().dimmed();
pub const BOLD: Style = Style::new().bold();
pub const HELP: Style = AnsiColor::Cyan.on_default();

/// Writes `error: MESSAGE` (the label in red on a terminal).
pub fn error_line(out: &mut impl Write, message: impl Display) -> io::Result<()> {
    writeln!(out, "{ERROR}error:{ERROR:#} {message}")
}

/// Writes a note in the warning color, without a label.
pub fn note_line(out: &mut impl Write, message: impl Display) -> io::Result<()> {
    writeln!(out, "{WARNING}{message}{WARNING:#}")
}

/// True when `error` is, or was caused by, writing to a closed pipe
/// (`gdn … | head`): the reader has what it wanted, and gdn ends quietly.
pub fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| cause.downcast_ref::<io::Error>().is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe))
}

/// Writes one diagnostic in the human format.
pub fn write_diagnostic(out: &mut impl Write, diagnostic: &Diagnostic) -> std::io::Result<()> {
    let (style, label) = match diagnostic.severity {
        Severity::Error => (ERROR, "error"),
        Severity::Warning => (WARNING, "warning"),
    };
    write!(out, "{style}{label}[{}]{style:#} {BOLD}{}{BOLD:#}", diagnostic.code, diagnostic.path)?;
    if let (Some(line), Some(column)) = (diagnostic.line, diagnostic.column) {
        write!(out, " {DIM}(line {line}, column {column}){DIM:#}")?;
    }
    writeln!(out)?;
    writeln!(out, "  {}", diagnostic.message)?;
    if let Some(suggestion) = &diagnostic.suggestion {
        writeln!(out, "  {HELP}help:{HELP:#} {suggestion}")?;
    }
    Ok(())
}

/// Writes every diagnostic, then a one-line summary.
pub fn write_report(out: &mut impl Write, diagnostics: &[Diagnostic], subject: &str) -> std::io::Result<()> {
    for diagnostic in diagnostics {
        write_diagnostic(out, diagnostic)?;
    }
    let errors = diagnostics.iter().filter(|d| d.is_error()).count();
    let warnings = diagnostics.len() - errors;
    let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
    if errors == 0 {
        let tail = if warnings > 0 { format!(" ({})", plural(warnings, "warning")) } else { String::new() };
        writeln!(out, "{OK}✓{OK:#} {subject} is valid{tail}")
    } else {
        writeln!(out, "{ERROR}✗{ERROR:#} {subject}: {}, {}", plural(errors, "error"), plural(warnings, "warning"))
    }
}
