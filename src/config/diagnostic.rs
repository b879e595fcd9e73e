//! Where a config problem is and what it is: file, line, key, reason.
//!
//! Compiling collects every diagnostic instead of stopping at the first, so an
//! operator fixes a file in one pass. Warnings (a plain-text key, a shadowed
//! route) never stop the gateway; errors always do.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// Whether a config problem stops the file from being used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// The file is refused: `sluice check` exits 1, start-up fails, a reload keeps
    /// the running config.
    Error,
    /// Reported and logged, but the config is used.
    Warning,
}

/// One problem found in a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// Whether the problem stops the file from being used.
    pub severity: Severity,
    /// The config file the problem was found in.
    pub file: PathBuf,
    /// 1-based line of the offending key or value; 0 when the whole file is meant.
    pub line: usize,
    /// TOML path of the key, e.g. `routes[2].upstream`.
    pub key: String,
    /// What is wrong, e.g. "must not be empty".
    pub reason: String,
    /// A hint on how to fix it ("did you mean `idle_timeout`?").
    pub help: Option<String>,
    /// The offending source line and the byte range within it, for a caret.
    pub source: Option<(String, Range<usize>)>,
}

impl Diagnostic {
    /// A diagnostic about the whole file (no line).
    pub fn whole_file(file: &Path, key: &str, reason: String) -> Diagnostic {
        Diagnostic {
            severity: Severity::Error,
            file: file.to_path_buf(),
            line: 0,
            key: key.to_string(),
            reason,
            help: None,
            source: None,
        }
    }

    /// The diagnostic as a compiler would show it: the headline, then the source line
    /// with a caret under the offending key or value and the help beside it.
    pub fn render(&self, color: bool) -> String {
        use annotate_snippets::{AnnotationKind, Group, Level, Renderer, Snippet};
        let level = match self.severity {
            Severity::Error => Level::ERROR,
            Severity::Warning => Level::WARNING,
        };
        let title = match self.key.is_empty() {
            true => self.reason.clone(),
            false => format!("{}: {}", self.key, self.reason),
        };
        let path = self.file.display().to_string();
        let mut group = Group::with_title(level.primary_title(title.as_str()));
        if let Some((text, range)) = &self.source {
            let label = self.help.as_deref().unwrap_or("");
            group = group.element(
                Snippet::source(text.as_str())
                    .line_start(self.line)
                    .path(path.as_str())
                    .annotation(AnnotationKind::Primary.span(range.clone()).label(label)),
            );
        } else if let Some(help) = &self.help {
            group = group.element(Level::HELP.message(help.as_str()));
        }
        let renderer = match color {
            true => Renderer::styled(),
            false => Renderer::plain(),
        };
        let mut out = renderer.render(&[group]);
        if self.source.is_none() {
            out.push_str(&format!("\n  --> {path}"));
        }
        out
    }
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
        write!(f, ": {}", self.reason)?;
        if let Some(help) = &self.help {
            write!(f, " ({help})")?;
        }
        Ok(())
    }
}

/// Every error of a file that failed to compile (warnings included, for context).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Errors and warnings, in line order (whole-file ones, line 0, first).
    pub diagnostics: Vec<Diagnostic>,
}

impl ConfigError {
    /// The diagnostics that are errors, in line order.
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

    /// The whole line that holds `span`, and `span` within it (cut at the line's end).
    fn source_of(&self, span: &Range<usize>) -> (String, Range<usize>) {
        let start = span.start.min(self.source.len());
        let line_start = self.source[..start].rfind('\n').map_or(0, |i| i + 1);
        let line_end = self.source[start..]
            .find('\n')
            .map_or(self.source.len(), |i| start + i);
        let text = self.source[line_start..line_end].trim_end_matches('\r');
        let from = start - line_start;
        let to = span.end.min(line_start + text.len()).max(start + 1) - line_start;
        (text.to_string(), from..to.min(text.len().max(from + 1)))
    }

    fn push(
        &mut self,
        severity: Severity,
        span: Option<Range<usize>>,
        key: &str,
        reason: String,
        help: Option<String>,
    ) {
        let line = self.line_of(span.clone());
        let source = span.map(|span| self.source_of(&span));
        self.list.push(Diagnostic {
            severity,
            file: self.file.to_path_buf(),
            line,
            key: key.to_string(),
            reason,
            help,
            source,
        });
    }

    /// An error with a hint on how to fix it.
    pub(crate) fn error_with_help(
        &mut self,
        span: Option<Range<usize>>,
        key: &str,
        reason: impl Into<String>,
        help: Option<String>,
    ) {
        self.push(Severity::Error, span, key, reason.into(), help);
    }

    pub(crate) fn error(
        &mut self,
        span: Option<Range<usize>>,
        key: &str,
        reason: impl Into<String>,
    ) {
        self.push(Severity::Error, span, key, reason.into(), None);
    }

    pub(crate) fn warn(
        &mut self,
        span: Option<Range<usize>>,
        key: &str,
        reason: impl Into<String>,
    ) {
        self.push(Severity::Warning, span, key, reason.into(), None);
    }

    pub(crate) fn has_errors(&self) -> bool {
        self.list.iter().any(|d| d.severity == Severity::Error)
    }

    /// How many errors were reported so far.
    pub(crate) fn error_count(&self) -> usize {
        self.list
            .iter()
            .filter(|d| d.severity == Severity::Error)
            .count()
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
