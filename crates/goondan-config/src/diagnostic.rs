//! Validation diagnostics: `{code, message, path, severity, suggestion?,
//! line?, column?}`, with the original runtime's config error codes.

use std::fmt;

use serde::Serialize;

/// The config error codes of the original runtime (GOONDAN_FACTS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[allow(missing_docs)]
pub enum DiagnosticCode {
    #[serde(rename = "E_CONFIG_PARSE_ERROR")]
    ParseError,
    #[serde(rename = "E_CONFIG_UNSUPPORTED_API_VERSION")]
    UnsupportedApiVersion,
    #[serde(rename = "E_CONFIG_UNKNOWN_KIND")]
    UnknownKind,
    #[serde(rename = "E_CONFIG_INVALID_NAME")]
    InvalidName,
    #[serde(rename = "E_CONFIG_DUPLICATE_NAME")]
    DuplicateName,
    #[serde(rename = "E_CONFIG_INVALID_REF")]
    InvalidRef,
    #[serde(rename = "E_CONFIG_REF_NOT_FOUND")]
    RefNotFound,
    #[serde(rename = "E_CONFIG_SCHEMA_INVALID")]
    SchemaInvalid,
    #[serde(rename = "E_CONFIG_ENTRY_NOT_FOUND")]
    EntryNotFound,
    #[serde(rename = "E_CONFIG_PACKAGE_DOC_POSITION")]
    PackageDocPosition,
    #[serde(rename = "E_CONFIG_PACKAGE_DOC_DUPLICATED")]
    PackageDocDuplicated,
    #[serde(rename = "E_CONFIG_FILE_TOO_LARGE")]
    FileTooLarge,
    /// A dependency of the bundle's Package whose version
    /// `goondan.lock.yaml` does not pin (or no lock file for a range).
    #[serde(rename = "E_CONFIG_PACKAGE_LOCK_MISSING")]
    PackageLockMissing,
    /// A pinned dependency that is not installed under the state root's
    /// `packages/` directory.
    #[serde(rename = "E_CONFIG_PACKAGE_NOT_INSTALLED")]
    PackageNotInstalled,
    /// An installed package with neither `dist/goondan.yaml` nor
    /// `goondan.yaml`.
    #[serde(rename = "E_CONFIG_PACKAGE_MANIFEST_MISSING")]
    PackageManifestMissing,
    #[serde(rename = "E_CONFIG_TOO_MANY_DOCUMENTS")]
    TooManyDocuments,
    #[serde(rename = "E_CONFIG_FILE_NOT_FOUND")]
    FileNotFound,
    /// The bundle path is neither a regular file nor a directory (a FIFO,
    /// a device, a socket): refused before it is opened.
    #[serde(rename = "E_CONFIG_NOT_A_FILE")]
    NotAFile,
    /// A file reference (`prompt.systemRef`, `spec.entry`) that is absolute,
    /// climbs out with `..`, or leads out through a symbolic link.
    #[serde(rename = "E_CONFIG_PATH_OUTSIDE_BUNDLE")]
    PathOutsideBundle,
    /// A Tool export declared in goondan.yaml that its module's `handlers`
    /// lack (found by `gdn validate` when a JavaScript runtime is usable).
    #[serde(rename = "E_CONFIG_SCRIPT_EXPORT_MISSING")]
    ScriptExportMissing,
    /// A Tool or Extension module (`spec.entry`) that the JavaScript runtime
    /// cannot load.
    #[serde(rename = "E_CONFIG_SCRIPT_MODULE")]
    ScriptModule,
    /// An Extension module that exports no `register` function.
    #[serde(rename = "E_CONFIG_EXTENSION_REGISTER_MISSING")]
    ExtensionRegisterMissing,
    /// A `spec.sandbox.policy` that is not `read-only`, `workspace-write`
    /// or `full`.
    #[serde(rename = "E_CONFIG_SANDBOX_POLICY")]
    SandboxPolicyInvalid,
    /// A `spec.sandbox` that is not as the sandbox reads it: an unknown key,
    /// a value of the wrong type, an empty path, a `~name` path.
    #[serde(rename = "E_CONFIG_SANDBOX_INVALID")]
    SandboxInvalid,
    /// A `spec.sandbox.network.allow` entry that is not `host:port`.
    #[serde(rename = "E_CONFIG_SANDBOX_NETWORK")]
    SandboxNetwork,
    /// An Agent's `spec.placement` that is not as placement reads it: not
    /// a mapping, `hostLabels` not a mapping, a label value that is not a
    /// string, boolean or integer, a label name or value that is empty,
    /// longer than 63 characters or has a character outside
    /// `A-Z a-z 0-9 . _ -`.
    #[serde(rename = "E_CONFIG_PLACEMENT_INVALID")]
    PlacementInvalid,
    /// An Agent needs a capability its Model's `spec.capabilities` does not
    /// declare (the original's spec, resources §7.1: refused at load): an
    /// agent with tools on a Model whose capabilities leave out
    /// `toolCalling: true`.
    #[serde(rename = "E_CONFIG_MODEL_CAPABILITY")]
    ModelCapability,
    /// A warning: the bundle has script tools or extensions and no JavaScript
    /// runtime is usable.
    #[serde(rename = "W_SCRIPT_RUNTIME_MISSING")]
    ScriptRuntimeMissing,
    /// A warning: a Connection's rule matches an event its Connector does
    /// not declare, or routes to an agent outside its Swarm.
    #[serde(rename = "W_CONFIG_INGRESS_MISMATCH")]
    IngressMismatch,
    /// A warning: a key the runtime does not know (a typo, a field of an
    /// older version, a block at the wrong level): it is ignored.
    #[serde(rename = "W_CONFIG_UNKNOWN_KEY")]
    UnknownKey,
    /// A warning: a `spec.sandbox.writable` entry that is `/` or the home
    /// directory (or holds it): the sandbox then keeps little out.
    #[serde(rename = "W_CONFIG_SANDBOX_WIDE")]
    SandboxWide,
    /// A warning: a `spec.sandbox` setting that its policy ignores
    /// (`network.allow`, `readable`, `writable` under `policy: full`).
    #[serde(rename = "W_CONFIG_SANDBOX_IGNORED")]
    SandboxIgnored,
}

impl DiagnosticCode {
    /// Every code, in the order of the enum.
    pub const ALL: [DiagnosticCode; 32] = [
        Self::ParseError,
        Self::UnsupportedApiVersion,
        Self::UnknownKind,
        Self::InvalidName,
        Self::DuplicateName,
        Self::InvalidRef,
        Self::RefNotFound,
        Self::SchemaInvalid,
        Self::EntryNotFound,
        Self::PackageDocPosition,
        Self::PackageDocDuplicated,
        Self::FileTooLarge,
        Self::PackageLockMissing,
        Self::PackageNotInstalled,
        Self::PackageManifestMissing,
        Self::TooManyDocuments,
        Self::FileNotFound,
        Self::NotAFile,
        Self::PathOutsideBundle,
        Self::ScriptExportMissing,
        Self::ScriptModule,
        Self::ExtensionRegisterMissing,
        Self::SandboxPolicyInvalid,
        Self::SandboxInvalid,
        Self::SandboxNetwork,
        Self::PlacementInvalid,
        Self::ModelCapability,
        Self::ScriptRuntimeMissing,
        Self::IngressMismatch,
        Self::UnknownKey,
        Self::SandboxWide,
        Self::SandboxIgnored,
    ];

    /// The code as written in reports, e.g. `E_CONFIG_PARSE_ERROR`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ParseError => "E_CONFIG_PARSE_ERROR",
            Self::UnsupportedApiVersion => "E_CONFIG_UNSUPPORTED_API_VERSION",
            Self::UnknownKind => "E_CONFIG_UNKNOWN_KIND",
            Self::InvalidName => "E_CONFIG_INVALID_NAME",
            Self::DuplicateName => "E_CONFIG_DUPLICATE_NAME",
            Self::InvalidRef => "E_CONFIG_INVALID_REF",
            Self::RefNotFound => "E_CONFIG_REF_NOT_FOUND",
            Self::SchemaInvalid => "E_CONFIG_SCHEMA_INVALID",
            Self::EntryNotFound => "E_CONFIG_ENTRY_NOT_FOUND",
            Self::PackageDocPosition => "E_CONFIG_PACKAGE_DOC_POSITION",
            Self::PackageDocDuplicated => "E_CONFIG_PACKAGE_DOC_DUPLICATED",
            Self::FileTooLarge => "E_CONFIG_FILE_TOO_LARGE",
            Self::PackageLockMissing => "E_CONFIG_PACKAGE_LOCK_MISSING",
            Self::PackageNotInstalled => "E_CONFIG_PACKAGE_NOT_INSTALLED",
            Self::PackageManifestMissing => "E_CONFIG_PACKAGE_MANIFEST_MISSING",
            Self::TooManyDocuments => "E_CONFIG_TOO_MANY_DOCUMENTS",
            Self::FileNotFound => "E_CONFIG_FILE_NOT_FOUND",
            Self::NotAFile => "E_CONFIG_NOT_A_FILE",
            Self::PathOutsideBundle => "E_CONFIG_PATH_OUTSIDE_BUNDLE",
            Self::ScriptExportMissing => "E_CONFIG_SCRIPT_EXPORT_MISSING",
            Self::ScriptModule => "E_CONFIG_SCRIPT_MODULE",
            Self::ExtensionRegisterMissing => "E_CONFIG_EXTENSION_REGISTER_MISSING",
            Self::SandboxPolicyInvalid => "E_CONFIG_SANDBOX_POLICY",
            Self::SandboxInvalid => "E_CONFIG_SANDBOX_INVALID",
            Self::SandboxNetwork => "E_CONFIG_SANDBOX_NETWORK",
            Self::PlacementInvalid => "E_CONFIG_PLACEMENT_INVALID",
            Self::ModelCapability => "E_CONFIG_MODEL_CAPABILITY",
            Self::ScriptRuntimeMissing => "W_SCRIPT_RUNTIME_MISSING",
            Self::IngressMismatch => "W_CONFIG_INGRESS_MISMATCH",
            Self::UnknownKey => "W_CONFIG_UNKNOWN_KEY",
            Self::SandboxWide => "W_CONFIG_SANDBOX_WIDE",
            Self::SandboxIgnored => "W_CONFIG_SANDBOX_IGNORED",
        }
    }
}

impl fmt::Display for DiagnosticCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How bad a diagnostic is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Worth knowing; the bundle still works.
    Warning,
    /// The bundle cannot be used.
    Error,
}

/// One finding about a bundle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    /// A stable code.
    pub code: DiagnosticCode,
    /// What is wrong.
    pub message: String,
    /// Where: `goondan.yaml#<doc index>.spec.…`.
    pub path: String,
    /// Error or warning.
    pub severity: Severity,
    /// How to fix it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub suggestion: Option<String>,
    /// 1-based line in the file, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// 1-based column in the file, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column: Option<u32>,
}

impl Diagnostic {
    /// An error.
    pub fn error(code: DiagnosticCode, path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            path: path.into(),
            severity: Severity::Error,
            suggestion: None,
            line: None,
            column: None,
        }
    }

    /// A warning.
    pub fn warning(code: DiagnosticCode, path: impl Into<String>, message: impl Into<String>) -> Self {
        Self { severity: Severity::Warning, ..Self::error(code, path, message) }
    }

    /// Adds a suggestion.
    #[must_use]
    pub fn suggest(mut self, suggestion: impl Into<String>) -> Self {
        self.suggestion = Some(suggestion.into());
        self
    }

    /// Sets the position.
    #[must_use]
    pub fn at(mut self, line: u32, column: u32) -> Self {
        self.line = Some(line);
        self.column = Some(column);
        self
    }

    /// True for errors.
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.code, self.path)?;
        if let (Some(line), Some(column)) = (self.line, self.column) {
            write!(f, " (line {line}, column {column})")?;
        }
        write!(f, ": {}", self.message)?;
        if let Some(suggestion) = &self.suggestion {
            write!(f, " — {suggestion}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ALL` is complete: every code the enum renames a variant to is the
    /// code of one entry of `ALL`, and each is written the same way
    /// (`as_str` and serde agree).
    #[test]
    fn all_lists_every_code() {
        let source = include_str!("diagnostic.rs");
        let renamed: Vec<&str> = source
            .lines()
            .filter_map(|line| line.trim().strip_prefix("#[serde(rename = \""))
            .filter_map(|rest| rest.split('"').next())
            .collect();
        let listed: Vec<&str> = DiagnosticCode::ALL.iter().map(|code| code.as_str()).collect();
        assert_eq!(renamed, listed);
        for code in DiagnosticCode::ALL {
            assert_eq!(serde_json::to_value(code).ok(), Some(serde_json::Value::from(code.as_str())));
        }
    }
}
