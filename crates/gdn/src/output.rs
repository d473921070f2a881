//! Writing to the terminal: colors when it is one (and NO_COLOR is unset),
//! plain text otherwise. Error and warning lines are written here and
//! nowhere else, so they look the same whichever command prints them.

use std::fmt::Display;
use std::io::{self, Write};

use anstream::{AutoStream, ColorChoice};
use anstyle::{AnsiColor, Style};
use goondan_config::{Diagnostic, Severity};

/// Where a command writes: standard output and error, boxed so that
/// [`Output::captured`] can put memory in their place.
type Stream = AutoStream<Box<dyn Write + Send>>;

/// Standard output and error with the chosen color mode.
pub struct Output {
    pub stdout: Stream,
    pub stderr: Stream,
}

impl Output {
    pub fn new(no_color: bool) -> Self {
        // Chosen for the real streams: behind a box anstream sees no terminal.
        let stdout_choice = if no_color { ColorChoice::Never } else { AutoStream::choice(&std::io::stdout()) };
        let stderr_choice = if no_color { ColorChoice::Never } else { AutoStream::choice(&std::io::stderr()) };
        Self {
            stdout: AutoStream::new(Box::new(std::io::stdout()), stdout_choice),
            stderr: AutoStream::new(Box::new(std::io::stderr()), stderr_choice),
        }
    }

    /// An output into memory, without colors, and what was written to it
    /// (standard output's, standard error's): a command run for a caller
    /// that shows its outcome elsewhere (`gdn instance`'s interactive list
    /// shows it in its status line).
    pub fn captured() -> (Self, Captured, Captured) {
        let (stdout, stderr) = (Captured::default(), Captured::default());
        let output = Self {
            stdout: AutoStream::never(Box::new(stdout.clone())),
            stderr: AutoStream::never(Box::new(stderr.clone())),
        };
        (output, stdout, stderr)
    }

    /// Writes `error: MESSAGE` to stderr ([`error_line`]) and gives `code`:
    /// how a command ends on an error it reports.
    pub fn fail(&mut self, code: u8, message: impl Display) -> anyhow::Result<u8> {
        error_line(&mut self.stderr, message)?;
        Ok(code)
    }
}

/// What a [`Output::captured`] stream got (shared with it).
#[derive(Clone, Default)]
pub struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Captured {
    /// The text written so far.
    pub fn text(&self) -> String {
        // A writer that panicked mid-write still left its bytes.
        let bytes = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
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

/// Writes one diagnostic in the human format, with the source lines it
/// points at.
fn write_diagnostic_at(out: &mut impl Write, diagnostic: &Diagnostic, snippet: Option<&str>) -> std::io::Result<()> {
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
    if let Some(snippet) = snippet {
        writeln!(out, "{DIM}{snippet}{DIM:#}")?;
    }
    if let Some(suggestion) = &diagnostic.suggestion {
        writeln!(out, "  {HELP}help:{HELP:#} {suggestion}")?;
    }
    Ok(())
}

/// The largest bundle file read again to show the lines diagnostics point at.
const SNIPPET_SOURCE_LIMIT: u64 = 4 << 20;

/// The line `line` of `source` and a caret under `column`, as compilers
/// show them; `None` when the source has no such line.
fn source_snippet(source: &str, line: u32, column: u32) -> Option<String> {
    let index = usize::try_from(line).ok()?.checked_sub(1)?;
    let text = source.lines().nth(index)?;
    let number = line.to_string();
    let gutter = " ".repeat(number.len());
    let before: String = text.chars().take(usize::try_from(column).unwrap_or(1).saturating_sub(1)).collect();
    let pad: String = before.chars().map(|c| if c == '\t' { '\t' } else { ' ' }).collect();
    Some(format!("  {gutter} |\n  {number} | {text}\n  {gutter} | {pad}^"))
}

/// Writes every diagnostic (with the line it points at, when it is in the
/// file `subject`), then a one-line summary.
pub fn write_report(out: &mut impl Write, diagnostics: &[Diagnostic], subject: &str) -> std::io::Result<()> {
    write_report_with_notes(out, diagnostics, subject, &[])
}

/// [`write_report`], with `notes` (lines about the bundle, e.g. each
/// agent's sandbox) between the diagnostics and the summary.
pub fn write_report_with_notes(
    out: &mut impl Write,
    diagnostics: &[Diagnostic],
    subject: &str,
    notes: &[String],
) -> std::io::Result<()> {
    // Only a regular file of a bundle's size is read for the snippets (the
    // subject may be a device or a FIFO that the loader refused); a read
    // that fails only means no snippets.
    let source = std::fs::metadata(subject)
        .ok()
        .filter(|meta| meta.is_file() && meta.len() <= SNIPPET_SOURCE_LIMIT)
        .and_then(|_| std::fs::read_to_string(subject).ok());
    let label = std::path::Path::new(subject).file_name().map(|name| name.to_string_lossy().into_owned());
    for diagnostic in diagnostics {
        let in_subject = label
            .as_deref()
            .is_some_and(|label| diagnostic.path == label || diagnostic.path.starts_with(&format!("{label}#")));
        let snippet = match (in_subject, source.as_deref(), diagnostic.line, diagnostic.column) {
            (true, Some(source), Some(line), Some(column)) => source_snippet(source, line, column),
            _ => None,
        };
        write_diagnostic_at(out, diagnostic, snippet.as_deref())?;
    }
    let errors = diagnostics.iter().filter(|d| d.is_error()).count();
    let warnings = diagnostics.len() - errors;
    // Once per report: where the codes are explained.
    if let Some(first) = diagnostics.first() {
        writeln!(out, "{HELP}help:{HELP:#} `gdn help {}` explains a code", first.code)?;
    }
    for note in notes {
        writeln!(out, "{note}")?;
    }
    let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
    if errors == 0 {
        let tail = if warnings > 0 { format!(" ({})", plural(warnings, "warning")) } else { String::new() };
        writeln!(out, "{OK}✓{OK:#} {subject} is valid{tail}")
    } else {
        writeln!(out, "{ERROR}✗{ERROR:#} {subject}: {}, {}", plural(errors, "error"), plural(warnings, "warning"))
    }
}

/// A diagnostic as a GitHub Actions workflow command (`::error` or
/// `::warning`, with the file, line and column, the code as its title), so
/// a workflow run annotates the line; the suggestion follows the message.
pub fn github_annotation(diagnostic: &Diagnostic, file: &str) -> String {
    // The documented escapes: data escapes %, CR, LF; properties also : and ,.
    let data = |text: &str| text.replace('%', "%25").replace('\r', "%0D").replace('\n', "%0A");
    let property = |text: &str| data(text).replace(':', "%3A").replace(',', "%2C");
    let level = if diagnostic.is_error() { "error" } else { "warning" };
    let mut properties = format!("file={}", property(file));
    if let Some(line) = diagnostic.line {
        properties.push_str(&format!(",line={line}"));
    }
    if let Some(column) = diagnostic.column {
        properties.push_str(&format!(",col={column}"));
    }
    properties.push_str(&format!(",title={}", property(diagnostic.code.as_str())));
    let mut message = format!("{}: {}", diagnostic.path, diagnostic.message);
    if let Some(suggestion) = &diagnostic.suggestion {
        message.push_str(&format!("\n{suggestion}"));
    }
    format!("::{level} {properties}::{}", data(&message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn github_annotations_escape_as_documented() {
        let mut diagnostic = Diagnostic::error(
            goondan_config::DiagnosticCode::SchemaInvalid,
            "goondan.yaml#0.spec.provider",
            "50% wrong:\nreally",
        );
        diagnostic.line = Some(6);
        diagnostic.column = Some(3);
        diagnostic.suggestion = Some("Fix it, now".to_owned());
        assert_eq!(
            github_annotation(&diagnostic, "a,b:c.yaml"),
            "::error file=a%2Cb%3Ac.yaml,line=6,col=3,title=E_CONFIG_SCHEMA_INVALID::goondan.yaml#0.spec.provider: 50%25 wrong:%0Areally%0AFix it, now"
        );
    }

    #[test]
    fn a_snippet_shows_the_line_and_a_caret_under_the_column() {
        let source = "a: 1\nspec:\n   model: x\n";
        assert_eq!(source_snippet(source, 3, 9).as_deref(), Some("    |\n  3 |    model: x\n    |         ^"));
        assert_eq!(source_snippet(source, 9, 1), None);
        assert_eq!(source_snippet(source, 0, 1), None);
    }
}
