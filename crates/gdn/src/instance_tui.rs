//! Bare `gdn instance`: on a terminal, the original's interactive list of
//! the state root's agent instances (ratatui on crossterm, in the
//! alternate screen); elsewhere, or with `--json`, `gdn instance list -n 20`
//! as the original falls back to.
//!
//! The rows are `gdn instance list`'s ([`crate::instance::table_rows`]),
//! read again after each action and every [`REFRESH`] (a status changes
//! while the list is open). The actions are the commands' own code run on
//! a captured [`Output`]: `r` is `gdn instance restart KEY`, Delete (after a
//! y/n question in the list) is `gdn instance delete KEY --agent AGENT
//! --force`, each in the row's workspace; what they print, or the error
//! they report, goes to the status line, so a refusal never ends the list.
//!
//! The terminal is given back (raw mode off, the main screen, the cursor
//! shown) on every way out: [`Screen`]'s `Drop` on a return or an error,
//! and a panic hook it installs for the time the list is open.

use std::io::{IsTerminal as _, Write as _};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Row, Table, TableState};
use ratatui::{DefaultTerminal, Frame, Terminal};

use crate::Session;
use crate::cli::{GlobalOptions, InstanceCommand};
use crate::exit;
use crate::instance::{HEADERS, OLD_LAYOUT, table_rows};
use crate::output::{Captured, Output};

/// How often the list is read again while nothing is pressed.
const REFRESH: Duration = Duration::from_secs(2);

/// The rows the original's fallback lists (its default `--limit`).
const FALLBACK_LIMIT: u64 = 20;

/// The header's line of keys.
const KEYS: &str = "↑/↓ or k/j move · r restart · Del delete · q/Esc quit";

/// Bare `gdn instance`.
pub fn bare(global: &GlobalOptions, session: &Session, out: &mut Output) -> Result<u8> {
    if global.json || !std::io::stdin().is_terminal() || !std::io::stdout().is_terminal() {
        let list = InstanceCommand::List { agent: None, limit: Some(FALLBACK_LIMIT), all: false, nats: None };
        return crate::instance::instance(global, &list, session, out);
    }
    let root = crate::workspace::state_root(global)?;
    let rows = table_rows(&root)?;
    if rows.is_empty() {
        writeln!(out.stdout, "No instances.")?;
        return Ok(exit::OK);
    }
    // As the rest of gdn: --no-color or NO_COLOR keeps bold, dim and the
    // cursor's reverse video, and leaves out colors.
    let color = !global.no_color && std::env::var_os("NO_COLOR").is_none();
    let mut list = List { global, session, root, rows, cursor: 0, question: None, status: None, color };
    let ending = {
        let screen = Screen::enter()?;
        let ending = new_terminal().map_err(anyhow::Error::from).and_then(|mut terminal| list.run(&mut terminal));
        drop(screen);
        ending?
    };
    if let Some(message) = ending.message {
        writeln!(out.stdout, "{message}")?;
    }
    Ok(ending.code)
}

/// The alternate screen in raw mode, for as long as this lives.
struct Screen {
    /// The panic hook before ours, set again when the list closes.
    previous_hook: Option<Arc<PanicHook>>,
}

type PanicHook = Box<dyn Fn(&std::panic::PanicHookInfo<'_>) + Sync + Send + 'static>;

impl Screen {
    fn enter() -> std::io::Result<Self> {
        let previous: Arc<PanicHook> = Arc::new(std::panic::take_hook());
        let chained = Arc::clone(&previous);
        // The panic's message is printed after the terminal is given back,
        // where it can be read.
        std::panic::set_hook(Box::new(move |info| {
            leave();
            chained(info);
        }));
        // Made before the terminal is changed: a failure below gives it back.
        let screen = Self { previous_hook: Some(previous) };
        crossterm::terminal::enable_raw_mode()?;
        crossterm::execute!(std::io::stdout(), crossterm::terminal::EnterAlternateScreen, crossterm::cursor::Hide)?;
        Ok(screen)
    }
}

/// A ratatui terminal on standard output (in the [`Screen`]).
fn new_terminal() -> std::io::Result<DefaultTerminal> {
    Terminal::new(ratatui::backend::CrosstermBackend::new(std::io::stdout()))
}

impl Drop for Screen {
    fn drop(&mut self) {
        leave();
        // A panicking thread may not change the hook (that would abort):
        // ours stays, and only restores a terminal already restored.
        if std::thread::panicking() {
            return;
        }
        drop(std::panic::take_hook());
        // Ours is gone, and with it the other reference to the previous hook.
        if let Some(previous) = self.previous_hook.take().and_then(|hook| Arc::try_unwrap(hook).ok()) {
            std::panic::set_hook(previous);
        }
    }
}

/// Gives the terminal back: raw mode off, the main screen, the cursor shown.
/// Each step is tried whatever the others did (on a panic there is no one
/// to report an error to).
fn leave() {
    let _ = crossterm::terminal::disable_raw_mode();
    let mut stdout = std::io::stdout();
    let _ = crossterm::execute!(stdout, crossterm::terminal::LeaveAlternateScreen, crossterm::cursor::Show);
    let _ = stdout.flush();
}

/// An instance of the list: its workspace (`None` for the old layouts,
/// which the project's own workspace takes in), agent and key.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    workspace: Option<String>,
    agent: String,
    key: String,
}

impl Target {
    fn of(row: &[String; 9]) -> Self {
        Self { workspace: (row[0] != OLD_LAYOUT).then(|| row[0].clone()), agent: row[1].clone(), key: row[2].clone() }
    }

    fn describe(&self) -> String {
        let workspace = self.workspace.as_deref().map(|w| format!(" in workspace '{w}'")).unwrap_or_default();
        format!("instance '{}' of agent '{}'{workspace}", self.key, self.agent)
    }
}

/// The status line: what the last action did, or why it failed.
struct Status {
    text: String,
    error: bool,
}

/// How the list ended: the exit code, and a line to print after it closed.
struct Ending {
    code: u8,
    message: Option<String>,
}

/// What a key asks for.
enum Action {
    Nothing,
    End(u8),
    Restart(Target),
    Delete(Target),
}

struct List<'a> {
    global: &'a GlobalOptions,
    session: &'a Session,
    root: goondan_runtime::store::StateRoot,
    rows: Vec<[String; 9]>,
    /// The selected row; `rows.len()` is the final "quit" row.
    cursor: usize,
    /// The instance Delete asks about (y deletes it).
    question: Option<Target>,
    status: Option<Status>,
    /// Whether to color the status cells and the status line.
    color: bool,
}

impl List<'_> {
    fn run(&mut self, terminal: &mut DefaultTerminal) -> Result<Ending> {
        let mut next_refresh = Instant::now() + REFRESH;
        loop {
            terminal.draw(|frame| self.draw(frame))?;
            let wait = next_refresh.saturating_duration_since(Instant::now());
            if !event::poll(wait)? {
                self.refresh();
                next_refresh = Instant::now() + REFRESH;
                continue;
            }
            let Event::Key(key) = event::read()? else { continue };
            if key.kind != KeyEventKind::Press {
                continue;
            }
            let (target, restart) = match self.key(key) {
                Action::Nothing => continue,
                Action::End(code) => return Ok(Ending { code, message: None }),
                Action::Restart(target) => (target, true),
                Action::Delete(target) => (target, false),
            };
            let doing = if restart { "restarting" } else { "deleting" };
            self.status = Some(Status { text: format!("{doing} {} …", target.describe()), error: false });
            terminal.draw(|frame| self.draw(frame))?;
            let status = if restart { self.restart(&target) } else { self.delete(&target) };
            let deleted = !restart && !status.error;
            self.status = Some(status);
            // Whatever the action let through to the terminal (a log line)
            // is wiped: the screen cleared, and a new terminal (whose last
            // frame is that blank screen) draws the next frame whole.
            // (`Terminal::clear` would ask the terminal where its cursor is,
            // which not every terminal answers.)
            crossterm::execute!(std::io::stdout(), crossterm::terminal::Clear(crossterm::terminal::ClearType::All))?;
            *terminal = new_terminal()?;
            self.refresh();
            next_refresh = Instant::now() + REFRESH;
            if deleted && self.rows.is_empty() {
                return Ok(Ending { code: exit::OK, message: Some("All instances were deleted.".to_owned()) });
            }
        }
    }

    fn key(&mut self, key: KeyEvent) -> Action {
        let control_c = key.modifiers.contains(KeyModifiers::CONTROL) && key.code == KeyCode::Char('c');
        if control_c {
            return Action::End(exit::INTERRUPTED);
        }
        if let Some(target) = self.question.take() {
            if matches!(key.code, KeyCode::Char('y' | 'Y')) {
                return Action::Delete(target);
            }
            self.status = Some(Status { text: "nothing was deleted".to_owned(), error: false });
            return Action::Nothing;
        }
        let selected = self.rows.get(self.cursor).map(Target::of);
        match key.code {
            KeyCode::Char('q') | KeyCode::Esc => Action::End(exit::OK),
            KeyCode::Enter if selected.is_none() => Action::End(exit::OK),
            KeyCode::Up | KeyCode::Char('k') => {
                self.cursor = self.cursor.saturating_sub(1);
                Action::Nothing
            }
            KeyCode::Down | KeyCode::Char('j') => {
                self.cursor = (self.cursor + 1).min(self.rows.len());
                Action::Nothing
            }
            KeyCode::Char('r' | 'R') => selected.map_or(Action::Nothing, Action::Restart),
            KeyCode::Delete => {
                if let Some(target) = selected {
                    self.status = Some(Status {
                        text: format!("delete {} (its conversation and event logs)? [y/n]", target.describe()),
                        error: false,
                    });
                    self.question = Some(target);
                }
                Action::Nothing
            }
            _ => Action::Nothing,
        }
    }

    /// Reads the rows again; the cursor stays on its instance while it is
    /// listed (the order is by last use, which an action changes).
    fn refresh(&mut self) {
        let selected = self.rows.get(self.cursor).map(Target::of);
        let was_empty = self.rows.is_empty();
        match table_rows(&self.root) {
            Ok(rows) => {
                self.rows = rows;
                self.cursor = match selected {
                    Some(selected) => self
                        .rows
                        .iter()
                        .position(|row| Target::of(row) == selected)
                        .unwrap_or_else(|| self.cursor.min(self.rows.len().saturating_sub(1))),
                    // Rows again after none: the first one, as on opening.
                    None if was_empty => 0,
                    None => self.rows.len(),
                };
            }
            Err(error) => {
                self.status = Some(Status { text: format!("cannot read the instances: {error:#}"), error: true });
            }
        }
    }

    /// The options of the command run on `target`: its workspace's.
    fn options(&self, target: &Target) -> GlobalOptions {
        let mut global = self.global.clone();
        if let Some(workspace) = &target.workspace {
            global.workspace = Some(workspace.clone());
        }
        global.json = false;
        global.no_color = true;
        global
    }

    /// `gdn instance restart KEY`.
    fn restart(&self, target: &Target) -> Status {
        let (mut out, stdout, stderr) = Output::captured();
        let result = crate::restart::instance_restart(&self.options(target), &target.key, false, &mut out);
        outcome(result, &stdout, &stderr)
    }

    /// `gdn instance delete KEY --agent AGENT --force`.
    fn delete(&self, target: &Target) -> Status {
        let (mut out, stdout, stderr) = Output::captured();
        let command =
            InstanceCommand::Delete { key: target.key.clone(), agent: Some(target.agent.clone()), force: true };
        let result = crate::instance::instance(&self.options(target), &command, self.session, &mut out);
        outcome(result, &stdout, &stderr)
    }

    /// `color` as the foreground, if colors are on.
    fn colored(&self, color: Color) -> Style {
        if self.color { Style::new().fg(color) } else { Style::new() }
    }

    fn draw(&self, frame: &mut Frame<'_>) {
        let [header, _, table, status, footer] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Length(1),
            Constraint::Fill(1),
            Constraint::Length(1),
            Constraint::Length(1),
        ])
        .areas(frame.area());
        let dim = Style::new().add_modifier(Modifier::DIM);
        frame.render_widget(
            Line::from(vec![
                Span::styled("Instances", Style::new().add_modifier(Modifier::BOLD)),
                Span::styled(format!("  ({KEYS})"), dim),
            ]),
            header,
        );
        let mut widths = HEADERS.map(|header| header.chars().count());
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let constraints = widths.map(|width| Constraint::Length(u16::try_from(width).unwrap_or(u16::MAX)));
        let mut rows: Vec<Row<'_>> = self
            .rows
            .iter()
            .map(|cells| {
                let status = match cells[3].as_str() {
                    running if running.starts_with("running") => self.colored(Color::Green),
                    "idle" => self.colored(Color::Yellow),
                    _ => Style::new(),
                };
                Row::new(cells.iter().enumerate().map(|(index, cell)| {
                    let text = Span::from(cell.as_str());
                    if index == 3 { text.style(status) } else { text }
                }))
            })
            .collect();
        rows.push(Row::new(["quit"]));
        let mut state = TableState::default().with_selected(Some(self.cursor));
        frame.render_stateful_widget(
            Table::new(rows, constraints)
                .header(Row::new(HEADERS).style(Style::new().add_modifier(Modifier::BOLD)))
                .column_spacing(2)
                .highlight_symbol("> ")
                .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED)),
            table,
            &mut state,
        );
        if let Some(line) = &self.status {
            let style = match (self.question.is_some(), line.error) {
                (true, _) => self.colored(Color::Yellow),
                (false, true) => self.colored(Color::Red),
                (false, false) => self.colored(Color::Green),
            };
            frame.render_widget(Line::styled(line.text.as_str(), style), status);
        }
        frame.render_widget(Line::styled(format!("{} instance(s)", self.rows.len()), dim), footer);
    }
}

/// The status line of a command's outcome: what it printed, or the error
/// it reported (its `error:` label left out).
fn outcome(result: Result<u8>, stdout: &Captured, stderr: &Captured) -> Status {
    let lines = |text: String| {
        text.lines()
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .map(|line| line.strip_prefix("error: ").unwrap_or(line).to_owned())
            .collect::<Vec<_>>()
            .join("; ")
    };
    match result {
        Ok(exit::OK) => Status { text: lines(stdout.text()), error: false },
        Ok(code) => {
            let said = lines(stderr.text());
            let text = if said.is_empty() { format!("failed (exit code {code})") } else { said };
            Status { text, error: true }
        }
        Err(error) => Status { text: format!("{error:#}"), error: true },
    }
}
