//! Where a config problem is and what it is: file, line, key, reason.
//!
//! Compiling collects every diagnostic instead of stopping at the first, so an
//! operator fixes a file in one pass. Warnings (a plain-text key, a shadowed
//! route) never stop the gateway; errors always do.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Error,
    Warning,
}

/// One problem found in a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    pub file: PathBuf,
    /// 1-based line of the offending key or value; 0 when the whole file is meant.
    pub line: usize,
    /// TOML path of the key, e.g. `routes[2].upstream`.
    pub key: String,
    pub reason: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{level}: {}", self.file.display())?;
        if self.line > 0 {
            write!(f, ":{}", self.line)?;
        }
        if !self.key.is_empty() {
            write!(f, ": {}", self.key)?;
        }
        write!(f, ": {}", self.reason)
    }
}

/// Every error of a file that failed to compile (warnings included, for context).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub diagnostics: Vec<Diagnostic>,
}

impl ConfigError {
    pub fn errors(&self) -> impl Iterator<Item = &Diagnostic> {
        self.diagnostics
            .iter()
            .filter(|d| d.severity == Severity::Error)
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for diagnostic in self.errors() {
            if !first {
                writeln!(f)?;
            }
            first = false;
            write!(f, "{diagnostic}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

/// Collects diagnostics for one file, turning byte offsets into line numbers.
pub(crate) struct Diagnostics<'a> {
    file: &'a Path,
    source: &'a str,
    pub(crate) list: Vec<Diagnostic>,
}

impl<'a> Diagnostics<'a> {
    pub(crate) fn new(file: &'a Path, source: &'a str) -> Self {
        Diagnostics {
            file,
            source,
            list: Vec::new(),
        }
    }

    fn line_of(&self, span: Option<Range<usize>>) -> usize {
        match span {
            Some(span) => {
                let end = span.start.min(self.source.len());
                self.source.as_bytes()[..end]
                    .iter()
                    .filter(|&&b| b == b'\n')
                    .count()
                    + 1
            }
            None => 0,
        }
    }

    fn push(&mut self, severity: Severity, span: Option<Range<usize>>, key: &str, reason: String) {
        let line = self.line_of(span);
        self.list.push(Diagnostic {
            severity,
            file: self.file.to_path_buf(),
            line,
            key: key.to_string(),
            reason,
        });
    }

    pub(crate) fn error(
        &mut self,
        span: Option<Range<usize>>,
        key: &str,
        reason: impl Into<String>,
    ) {
        self.push(Severity::Error, span, key, reason.into());
    }

    pub(crate) fn warn(
        &mut self,
        span: Option<Range<usize>>,
        key: &str,
        reason: impl Into<String>,
    ) {
        self.push(Severity::Warning, span, key, reason.into());
    }

    pub(crate) fn has_errors(&self) -> bool {
        self.list.iter().any(|d| d.severity == Severity::Error)
    }

    /// A serde/TOML error from deserialising the section at `key`.
    pub(crate) fn toml(&mut self, key: &str, error: &toml::de::Error) {
        self.error(error.span(), key, error.message().trim().to_string());
    }

    pub(crate) fn finish(mut self) -> Vec<Diagnostic> {
        self.list.sort_by_key(|d| (d.line, d.severity));
        self.list
    }
}
