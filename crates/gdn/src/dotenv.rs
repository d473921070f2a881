//! The environment files of a bundle, loaded as the original loads them
//! (its `packages/cli/src/services/env.ts`): the bundle directory's `.env`,
//! then its `.env.local`, then `gdn run --env-file FILE`, each overriding
//! the ones before, all of them overriding the process environment. The
//! two in the bundle directory are optional; `--env-file` must exist.
//!
//! Parsing is `dotenvy`'s: `export` prefixes, single and double quotes
//! (quotes removed, `# comments` after a quoted value ignored), values
//! spanning lines inside quotes, `${VAR}` substitution in unquoted and
//! double-quoted values.
//!
//! Every value is a secret, whatever its name: `main` adds them to
//! [`goondan_service::secrets::Secrets`], read through the agents' environment lookup
//! and handed to agent processes over their channel. None enters a process
//! environment, so a `bash` command or a JavaScript tool never sees one.
//! Parse errors never quote the line (it may hold a key).
//!
//! The bundle directory's two files hold keys and values the bundle reads;
//! they may not set `gdn`'s own settings nor where its requests go (see
//! [`refusal`]): a file in the bundle directory is easier to write than the
//! operator's environment or command line (a tool, a checked-out repository,
//! a command that ran before the sandbox kept it out), and one line such as
//! `OPENAI_BASE_URL=…` would send the model key elsewhere, one such as
//! `GOONDAN_FS_ALLOW_ROOTS=/` open the whole disk to `file-system`. Such a
//! line stops the command with an error naming the file, the line and the
//! variable — never the value. `--env-file`, which the operator names on the
//! command line, is trusted like the process environment and may set them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::input::{MAX_ENV_FILE_BYTES, read_text};

/// The optional files of the bundle directory, lowest precedence first.
pub const BUNDLE_FILES: [&str; 2] = [".env", ".env.local"];

/// The values of the bundle directory's `.env` and `.env.local` and of
/// `env_file` (relative to the current directory), the later ones winning.
pub fn load(bundle_dir: &Path, env_file: Option<&Path>) -> Result<BTreeMap<String, String>, String> {
    let mut files: Vec<(PathBuf, bool)> = BUNDLE_FILES.iter().map(|name| (bundle_dir.join(name), false)).collect();
    if let Some(path) = env_file {
        files.push((path.to_path_buf(), true));
    }
    let mut values = BTreeMap::new();
    // Every refused line of both bundle files, reported together.
    let mut refused = Vec::new();
    for (path, required) in files {
        // A bundle without its own `.env` is the usual case; a dangling link
        // counts as none, and so does a directory (a Python virtualenv is
        // often called `.env`).
        if !required && !std::fs::metadata(&path).is_ok_and(|metadata| !metadata.is_dir()) {
            continue;
        }
        let option = if required { "--env-file" } else { "the environment file" };
        let text = read_text(&path, option, MAX_ENV_FILE_BYTES)?;
        let parsed = parse(&text).map_err(|error| format!("{option} {}: {error}", path.display()))?;
        if !required {
            refused.extend(refuse_settings(&path, &text, &parsed));
        }
        tracing::debug!("read {} variable(s) from {}", parsed.len(), path.display());
        values.extend(parsed);
    }
    if refused.is_empty() { Ok(values) } else { Err(refused.join("\n")) }
}

/// What a name the bundle directory's files may not set is, and where it
/// belongs instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `GOONDAN_*`: `gdn`'s own settings.
    GdnSetting,
    /// `*_BASE_URL`, `*_API_BASE`: where a provider's key or token is sent.
    BaseUrl,
    /// `OTEL_*` but the header variables: where traces, with their content, are sent.
    Telemetry,
    /// `PATH`: which programs `gdn` itself starts (the JavaScript runtime).
    Path,
    /// `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`, `NO_PROXY`, any case: where HTTP traffic goes.
    Proxy,
    /// `NATS_URL`: the NATS server of `--nats`.
    NatsUrl,
    /// `SSL_CERT_FILE`, `SSL_CERT_DIR`: which TLS certificates are trusted.
    TlsTrust,
}

impl Refusal {
    /// Why the name is refused, and where to set it instead.
    pub fn explain(self) -> &'static str {
        match self {
            Self::GdnSetting => {
                "it is a gdn setting, and a file in the bundle directory must not change gdn's own limits; \
                 set it in the process environment or in a file given with --env-file"
            }
            Self::BaseUrl => {
                "a base URL decides where the API key or token is sent; write a Model's URL in goondan.yaml \
                 (its spec.endpoint), or set the variable in the process environment or in a file given with --env-file"
            }
            Self::Telemetry => {
                "it decides where traces (and the content they carry) are sent; \
                 set it in the process environment or in a file given with --env-file"
            }
            Self::Path => {
                "it decides which programs gdn itself runs (the JavaScript runtime); \
                 set PATH in the process environment, or GOONDAN_JS_RUNTIME there or in a file given with --env-file"
            }
            Self::Proxy => {
                "it would route requests through another server; gdn takes proxy settings from the process \
                 environment only (the model providers' and connectors' clients), so set it there"
            }
            Self::NatsUrl => {
                "gdn reads it from the process environment only (the default of --nats); \
                 set it there, or pass --nats URL"
            }
            Self::TlsTrust => {
                "it decides which TLS certificates are trusted; gdn trusts its built-in Mozilla roots \
                 and reads neither variable"
            }
        }
    }
}

/// Why the bundle directory's `.env` files may not set `name` (compared
/// without regard to case), or `None` for an ordinary variable.
///
/// The rule covers every name `gdn` reads as its own setting or as a
/// destination: every `GOONDAN_*`; every provider base URL (`*_BASE_URL`,
/// `*_API_BASE`: `OPENAI_BASE_URL`, `ANTHROPIC_BASE_URL`,
/// `GOOGLE_GENERATIVE_AI_BASE_URL`, `TELEGRAM_API_BASE_URL`,
/// `SLACK_API_BASE_URL`, and the spellings other tools use); the `OTEL_*`
/// telemetry settings but their `*_HEADERS` (credentials, like a key);
/// `PATH`, which the JavaScript runtime is looked up in; the proxy variables;
/// `NATS_URL`; `SSL_CERT_FILE` and `SSL_CERT_DIR`. Credentials — model keys,
/// bot tokens, `NATS_CREDS`/`NATS_TOKEN`/`NATS_USER`/`NATS_PASSWORD` — and
/// every other name stay allowed.
pub fn refusal(name: &str) -> Option<Refusal> {
    let upper = name.to_ascii_uppercase();
    if upper.starts_with("GOONDAN_") {
        Some(Refusal::GdnSetting)
    } else if upper.ends_with("_BASE_URL") || upper.ends_with("_API_BASE") {
        Some(Refusal::BaseUrl)
    } else if upper.starts_with("OTEL_") && !upper.ends_with("_HEADERS") {
        Some(Refusal::Telemetry)
    } else {
        match upper.as_str() {
            "PATH" => Some(Refusal::Path),
            "HTTP_PROXY" | "HTTPS_PROXY" | "ALL_PROXY" | "NO_PROXY" => Some(Refusal::Proxy),
            "NATS_URL" => Some(Refusal::NatsUrl),
            "SSL_CERT_FILE" | "SSL_CERT_DIR" => Some(Refusal::TlsTrust),
            _ => None,
        }
    }
}

/// A message for each line of `path` (a bundle directory's file) that sets
/// a refused name, naming the file, the line and the name; the values are
/// never quoted.
fn refuse_settings(path: &Path, text: &str, parsed: &[(String, String)]) -> Vec<String> {
    let assignments = assignment_lines(text);
    // The parsed names come in file order, one for each assignment; each is
    // looked for from the one after the previous name's.
    let mut from = 0;
    let mut refused = Vec::new();
    for (name, _) in parsed {
        let line = assignments.iter().skip(from).position(|(_, candidate)| candidate == name).map(|at| from + at);
        if let Some(at) = line {
            from = at + 1;
        }
        if let Some(why) = refusal(name) {
            let place = match line.and_then(|at| assignments.get(at)) {
                Some((number, _)) => format!("{}, line {number}", path.display()),
                None => path.display().to_string(),
            };
            refused
                .push(format!("{place}: {name} cannot be set in the bundle directory's .env files: {}", why.explain()));
        }
    }
    refused
}

/// The assignments of `text` as `dotenvy` splits it — a quoted value may
/// span lines, a line starting with `#` is a comment — each with the number
/// (from 1) of the line it starts on and its name (`NAME=…`,
/// `export NAME=…`), in order.
fn assignment_lines(text: &str) -> Vec<(usize, String)> {
    let name_of = |line: &str| -> Option<String> {
        let line = line.trim_start();
        let line = match line.strip_prefix("export") {
            Some(rest) if rest.starts_with(char::is_whitespace) => rest.trim_start(),
            _ => line,
        };
        let end = line.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.')).unwrap_or(line.len());
        let (name, rest) = line.split_at(end);
        let starts_well = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_');
        (starts_well && rest.trim_start().starts_with('=')).then(|| name.to_owned())
    };
    let mut found = Vec::new();
    // The first physical line of the assignment being read, while a quote is open.
    let mut open: Option<(usize, &str)> = None;
    let mut state = Quoting::Complete;
    for (index, line) in text.split_inclusive('\n').enumerate() {
        let (number, first) = match open {
            Some(started) => started,
            None if line.trim_start().starts_with('#') => continue,
            None => (index + 1, line),
        };
        state = state.after(line);
        if state == Quoting::Complete {
            open = None;
            found.extend(name_of(first).map(|name| (number, name)));
        } else {
            open = Some((number, first));
        }
    }
    found
}

/// Where `dotenvy` is at the end of a line: whether the value goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quoting {
    Complete,
    Escape,
    Single,
    SingleEscape,
    Double,
    DoubleEscape,
    Whitespace,
}

impl Quoting {
    /// The state after `line` (`dotenvy`'s `eval_end_state`; a `#` after
    /// whitespace outside quotes ends the line).
    fn after(self, line: &str) -> Self {
        let mut state = self;
        for c in line.chars() {
            state = match state {
                Self::Whitespace if c == '#' => return Self::Complete,
                Self::Whitespace | Self::Complete if c == '\\' => Self::Escape,
                Self::Whitespace | Self::Complete if c == '"' => Self::Double,
                Self::Whitespace | Self::Complete if c == '\'' => Self::Single,
                Self::Complete if c.is_whitespace() && c != '\n' && c != '\r' => Self::Whitespace,
                Self::Whitespace | Self::Complete | Self::Escape => Self::Complete,
                Self::Double if c == '\\' => Self::DoubleEscape,
                Self::Double if c == '"' => Self::Complete,
                Self::Double | Self::DoubleEscape => Self::Double,
                Self::Single if c == '\\' => Self::SingleEscape,
                Self::Single if c == '\'' => Self::Complete,
                Self::Single | Self::SingleEscape => Self::Single,
            };
        }
        state
    }
}

/// Parses `.env` text, in order (a name set twice: the last wins).
pub fn parse(text: &str) -> Result<Vec<(String, String)>, String> {
    dotenvy::from_read_iter(text.as_bytes())
        .map(|item| {
            item.map_err(|error| match error {
                dotenvy::Error::LineParse(line, _) => {
                    let number = text.find(line.as_str()).map(|at| text[..at].matches('\n').count() + 1);
                    match number {
                        Some(number) => format!("line {number} is not NAME=VALUE"),
                        None => "a line is not NAME=VALUE".to_owned(),
                    }
                }
                other => other.to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> BTreeMap<String, String> {
        parse(text).unwrap_or_else(|e| panic!("{e}")).into_iter().collect()
    }

    #[test]
    fn parses_as_the_usual_loaders_do() {
        let values = parsed(
            "# keys\nOPENAI_API_KEY=sk-1\nexport A='x y'\nB=\"l1\\nl2\"\nC=plain # note\nD=\"abc\" # a note\n\nEMPTY=\nM=\"first\nsecond\"\nS=${A}!\n",
        );
        assert_eq!(values.get("OPENAI_API_KEY").map(String::as_str), Some("sk-1"));
        assert_eq!(values.get("A").map(String::as_str), Some("x y"));
        assert_eq!(values.get("B").map(String::as_str), Some("l1\nl2"));
        assert_eq!(values.get("C").map(String::as_str), Some("plain"));
        assert_eq!(values.get("D").map(String::as_str), Some("abc"), "quotes and the comment after them go");
        assert_eq!(values.get("EMPTY").map(String::as_str), Some(""));
        assert_eq!(values.get("M").map(String::as_str), Some("first\nsecond"), "a quoted value spans lines");
        assert_eq!(values.get("S").map(String::as_str), Some("x y!"));
    }

    #[test]
    fn errors_name_the_line_but_never_quote_it() {
        let error = parse("A=1\nB=2\nsk-secret-value nonsense\n").err().unwrap_or_default();
        assert_eq!(error, "line 3 is not NAME=VALUE");
        assert!(parse("BAD KEY=1").is_err());
    }

    #[test]
    fn later_files_win_and_the_bundle_files_are_optional() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(load(dir.path(), None), Ok(BTreeMap::new()));
        std::fs::write(dir.path().join(".env"), "A=env\nB=env\nC=env\n").unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.path().join(".env.local"), "B=local\nC=local\n").unwrap_or_else(|e| panic!("{e}"));
        let extra = dir.path().join("extra.env");
        std::fs::write(&extra, "C=flag\n").unwrap_or_else(|e| panic!("{e}"));
        let values = load(dir.path(), Some(&extra)).unwrap_or_else(|e| panic!("{e}"));
        let got: Vec<(&str, &str)> = values.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got, [("A", "env"), ("B", "local"), ("C", "flag")]);
        let missing = load(dir.path(), Some(&dir.path().join("nope.env"))).err().unwrap_or_default();
        assert!(missing.starts_with("cannot read --env-file "), "{missing}");
        // A virtualenv called `.env` is not an environment file.
        let venv = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        std::fs::create_dir(venv.path().join(".env")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(load(venv.path(), None), Ok(BTreeMap::new()));
    }

    #[test]
    fn settings_and_destinations_are_refused_credentials_are_not() {
        let refused = [
            ("GOONDAN_FS_ALLOW_ROOTS", Refusal::GdnSetting),
            ("GOONDAN_HTTP_ALLOW", Refusal::GdnSetting),
            ("GOONDAN_JS_RUNTIME", Refusal::GdnSetting),
            ("GOONDAN_STATE_ROOT", Refusal::GdnSetting),
            ("GOONDAN_STEP_RESULT_BUDGET", Refusal::GdnSetting),
            ("goondan_env_passthrough", Refusal::GdnSetting),
            ("OPENAI_BASE_URL", Refusal::BaseUrl),
            ("ANTHROPIC_BASE_URL", Refusal::BaseUrl),
            ("GOOGLE_GENERATIVE_AI_BASE_URL", Refusal::BaseUrl),
            ("GEMINI_BASE_URL", Refusal::BaseUrl),
            ("OPENAI_API_BASE", Refusal::BaseUrl),
            ("TELEGRAM_API_BASE_URL", Refusal::BaseUrl),
            ("SLACK_API_BASE_URL", Refusal::BaseUrl),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", Refusal::Telemetry),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", Refusal::Telemetry),
            ("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", Refusal::Telemetry),
            ("PATH", Refusal::Path),
            ("HTTPS_PROXY", Refusal::Proxy),
            ("https_proxy", Refusal::Proxy),
            ("ALL_PROXY", Refusal::Proxy),
            ("no_proxy", Refusal::Proxy),
            ("HTTP_PROXY", Refusal::Proxy),
            ("NATS_URL", Refusal::NatsUrl),
            ("SSL_CERT_FILE", Refusal::TlsTrust),
            ("SSL_CERT_DIR", Refusal::TlsTrust),
        ];
        for (name, expected) in refused {
            assert_eq!(refusal(name), Some(expected), "{name}");
        }
        for name in [
            "OPENAI_API_KEY",
            "ANTHROPIC_API_KEY",
            "GEMINI_API_KEY",
            "TELEGRAM_BOT_TOKEN",
            "SLACK_BOT_TOKEN",
            "NATS_CREDS",
            "NATS_TOKEN",
            "NATS_USER",
            "NATS_PASSWORD",
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "MODEL_CRED",
            "BASE_URL_NOTE",
            "GOONDAN",
            "DATABASE_URL",
        ] {
            assert_eq!(refusal(name), None, "{name}");
        }
    }

    #[test]
    fn a_bundle_file_setting_a_refused_name_is_an_error_naming_file_line_and_name_but_not_the_value() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.path().join(".env"), "OPENAI_API_KEY=sk-fine\n").unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(
            dir.path().join(".env.local"),
            "# local\nCERT=\"a\nOPENAI_BASE_URL=inside-a-quoted-value\"\nexport  OPENAI_BASE_URL = http://attacker-77.example/v1\nB=1\nGOONDAN_FS_ALLOW_ROOTS=/\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let error = load(dir.path(), None).err().unwrap_or_default();
        let lines: Vec<&str> = error.lines().collect();
        assert_eq!(lines.len(), 2, "{error}");
        let local = dir.path().join(".env.local").display().to_string();
        assert!(lines[0].starts_with(&format!("{local}, line 4: OPENAI_BASE_URL cannot be set")), "{error}");
        assert!(lines[0].contains("spec.endpoint") && lines[0].contains("--env-file"), "{error}");
        assert!(lines[1].starts_with(&format!("{local}, line 6: GOONDAN_FS_ALLOW_ROOTS cannot be set")), "{error}");
        assert!(!error.contains("attacker-77") && !error.contains("inside-a-quoted"), "{error}");

        // Both files' refused lines are reported at once.
        std::fs::write(dir.path().join(".env"), "OPENAI_API_KEY=sk-fine\nhttps_proxy=http://attacker-77.example\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let error = load(dir.path(), None).err().unwrap_or_default();
        let env = dir.path().join(".env").display().to_string();
        let places: Vec<&str> = error.lines().filter_map(|line| line.split(": ").next()).collect();
        assert_eq!(
            places,
            [format!("{env}, line 2"), format!("{local}, line 4"), format!("{local}, line 6")],
            "{error}"
        );
        assert!(!error.contains("attacker-77"), "{error}");
        std::fs::write(dir.path().join(".env"), "OPENAI_API_KEY=sk-fine\n").unwrap_or_else(|e| panic!("{e}"));

        // The same names through --env-file are the operator's: read.
        std::fs::remove_file(dir.path().join(".env.local")).unwrap_or_else(|e| panic!("{e}"));
        let flag = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let file = flag.path().join("ops.env");
        std::fs::write(&file, "OPENAI_BASE_URL=http://127.0.0.1:9/v1\nGOONDAN_FS_ALLOW_ROOTS=/srv\n")
            .unwrap_or_else(|e| panic!("{e}"));
        let values = load(dir.path(), Some(&file)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(values.get("OPENAI_BASE_URL").map(String::as_str), Some("http://127.0.0.1:9/v1"));
        assert_eq!(values.get("GOONDAN_FS_ALLOW_ROOTS").map(String::as_str), Some("/srv"));
        assert_eq!(values.get("OPENAI_API_KEY").map(String::as_str), Some("sk-fine"));
    }

    #[test]
    fn assignment_lines_are_found_as_dotenvy_reads_them() {
        let text = concat!(
            "A=1\n  export B=2\nexport=3\n# C=4\n_E.f = 5\n",
            r#"M="x
N=y\" # z"
O='p"'
Q=r # '
S=t\'u
V=w
"#
        );
        let found = assignment_lines(text);
        let got: Vec<(usize, &str)> = found.iter().map(|(line, name)| (*line, name.as_str())).collect();
        assert_eq!(
            got,
            [(1, "A"), (2, "B"), (3, "export"), (5, "_E.f"), (6, "M"), (8, "O"), (9, "Q"), (10, "S"), (11, "V")]
        );
        let parsed: Vec<String> = parse(text).unwrap_or_else(|e| panic!("{e}")).into_iter().map(|(k, _)| k).collect();
        let names: Vec<&str> = got.iter().map(|(_, name)| *name).collect();
        assert_eq!(parsed, names, "one assignment for each parsed name");
    }
}
