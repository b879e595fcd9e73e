//! A streaming scanner that finds one numeric field of a JSON document, such as
//! `usage.total_tokens`, in a fixed amount of memory whatever the document's size.
//!
//! Bytes are pushed in as they arrive ([`JsonField::feed`]); nothing is buffered. The
//! scanner keeps the nesting (up to [`MAX_DEPTH`] levels), how many leading levels of
//! the path the current position matches, and the key being read, compared with the
//! path as it streams by. A number at the path is read as a non-negative integer (a
//! fraction is cut, an exponent or a sign makes it unknown); the last one wins. Keys
//! with escapes never match. It is a scanner, not a validator: it checks the
//! structure it needs (brackets, strings, separators) and reports a document that
//! breaks it as not JSON. An array, or an object under a key off the path, cannot hold
//! the field: it is passed over following only its strings and brackets, at the speed
//! of a byte search.
//!
//! A [`JsonPath`] also knows the bytes its last key is written as (`"total_tokens"`): a
//! document without them cannot hold the field (keys with escapes never match), which
//! lets an event stream pass over its events without reading their structure
//! ([`super::sse`]).

use std::sync::Arc;

use smallvec::SmallVec;

use crate::config::route::JsonPath;

/// Nesting levels tracked; a deeper document is not JSON as far as costs go.
pub(crate) const MAX_DEPTH: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before a value (the document's, an array element's, or after a key's colon).
    Value,
    /// In an object, before a key or `}`.
    Key,
    /// After a key, before `:`.
    Colon,
    /// After a value, before `,`, `}` or `]` (or the end of the document).
    After,
    /// Inside a string; `key` when it is an object key.
    Str { key: bool, escape: bool },
    /// Inside a number or a literal (`true`, `false`, `null`).
    Bare,
    /// Inside a container the path cannot lead through, opened at `skip_from`
    /// levels: only strings and brackets are followed, to its end.
    Skip { string: bool, escape: bool },
    /// Not JSON.
    Broken,
}

/// Finds the numeric value at one path of a JSON document, fed in pieces.
#[derive(Debug, Clone)]
pub(crate) struct JsonField {
    /// Shared with the route's config: a response copies nothing of it.
    path: Arc<JsonPath>,
    /// Containers open: true for an object (inline up to 16 levels).
    stack: SmallVec<[bool; 16]>,
    /// Leading levels of `path` the current position matches.
    matched: usize,
    /// Levels open outside the container being skipped.
    skip_from: usize,
    state: State,
    /// While reading a key: bytes of it seen, and whether they match so far.
    key_at: usize,
    key_ok: bool,
    /// Whether the value being read sits at the path.
    at_target: bool,
    /// The number being read at the path, while it is a plain integer, and the
    /// part of it being read.
    number: Option<u64>,
    digits: Digits,
    found: Option<u64>,
    /// Whether a top-level value ended.
    done: bool,
}

impl JsonField {
    /// A scanner for `path`.
    pub(crate) fn new(path: Arc<JsonPath>) -> JsonField {
        JsonField {
            path,
            stack: SmallVec::new(),
            matched: 0,
            skip_from: 0,
            state: State::Value,
            key_at: 0,
            key_ok: false,
            at_target: false,
            number: None,
            digits: Digits::Whole,
            found: None,
            done: false,
        }
    }

    /// Starts over for a new document (the next event of a stream).
    pub(crate) fn reset(&mut self) {
        // In place: the path stays (no reference count touched), the stack keeps
        // its room.
        self.stack.clear();
        self.matched = 0;
        self.skip_from = 0;
        self.state = State::Value;
        self.key_at = 0;
        self.key_ok = false;
        self.at_target = false;
        self.number = None;
        self.digits = Digits::Whole;
        self.found = None;
        self.done = false;
    }

    /// The path this scanner looks for.
    pub(crate) fn path(&self) -> &Arc<JsonPath> {
        &self.path
    }

    /// The value found at the path, once the document is complete.
    pub(crate) fn value(&self) -> Option<u64> {
        let complete = self.done && self.state == State::After && self.stack.is_empty();
        self.found.filter(|_| complete)
    }

    /// Bytes this scanner holds, inline and on the heap: fixed by the path and
    /// [`MAX_DEPTH`], whatever the document's size.
    #[cfg(test)]
    pub(crate) fn memory(&self) -> usize {
        // The path is the route's, shared; only a stack deeper than 16 spills.
        let spilled = if self.stack.spilled() {
            self.stack.capacity()
        } else {
            0
        };
        size_of::<Self>() + spilled
    }

    /// Whether the bytes so far cannot be JSON.
    #[cfg(test)]
    pub(crate) fn broken(&self) -> bool {
        self.state == State::Broken
    }

    /// Reads `bytes`, the next piece of the document.
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        let mut i = 0;
        while i < bytes.len() {
            match self.state {
                State::Broken => return,
                // In a value string only `"` and `\` matter: skip the rest at once
                // (the text of an answer is most of its bytes).
                // So it does in a key that can no longer match the path.
                State::Str { key, escape: false } if !key || !self.key_ok => {
                    match memchr::memchr2(b'"', b'\\', &bytes[i..]) {
                        Some(at) => i += at,
                        None => return,
                    }
                }
                State::Skip {
                    string: true,
                    escape: false,
                } => match memchr::memchr2(b'"', b'\\', &bytes[i..]) {
                    Some(at) => i += at,
                    None => return,
                },
                State::Skip { string: false, .. } => {
                    let structure = |b: &u8| matches!(b, b'"' | b'{' | b'[' | b'}' | b']');
                    match bytes[i..].iter().position(structure) {
                        Some(at) => i += at,
                        None => return,
                    }
                }
                _ => {}
            }
            self.byte(bytes[i]);
            i += 1;
        }
    }

    /// Ends the document: a number at its very end is complete.
    pub(crate) fn finish(&mut self) {
        if self.state == State::Bare {
            self.end_bare();
        }
    }

    fn byte(&mut self, b: u8) {
        match self.state {
            State::Str { key, escape } => self.string_byte(key, escape, b),
            State::Skip { string, escape } => self.skip_byte(string, escape, b),
            State::Bare => {
                if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'+') {
                    self.bare_byte(b);
                } else {
                    self.end_bare();
                    self.byte(b);
                }
            }
            _ if b.is_ascii_whitespace() => {}
            State::Value => self.start_value(b),
            State::Key => match b {
                b'"' => {
                    self.matched = self.matched.min(self.stack.len() - 1);
                    self.key_at = 0;
                    self.key_ok = self.matched == self.stack.len() - 1;
                    self.state = State::Str {
                        key: true,
                        escape: false,
                    };
                }
                b'}' => self.close(true),
                _ => self.state = State::Broken,
            },
            State::Colon => match b {
                b':' => self.state = State::Value,
                _ => self.state = State::Broken,
            },
            State::After => match (b, self.stack.last()) {
                (b',', Some(true)) => self.state = State::Key,
                (b',', Some(false)) => {
                    self.matched = self.matched.min(self.stack.len() - 1);
                    self.state = State::Value;
                }
                (b'}', Some(true)) => self.close(true),
                (b']', Some(false)) => self.close(false),
                _ => self.state = State::Broken,
            },
            State::Broken => {}
        }
    }

    fn start_value(&mut self, b: u8) {
        if self.done {
            // A second top-level value: not one JSON document.
            self.state = State::Broken;
            return;
        }
        let depth = self.stack.len();
        // A value at `depth` sits at the path when every level above it matched
        // (an array element matches nothing: paths name keys).
        let in_object = self.stack.last() == Some(&true);
        self.at_target = in_object && self.matched == depth && depth == self.path.keys().len();
        match b {
            b'{' | b'[' => {
                if depth == MAX_DEPTH {
                    self.state = State::Broken;
                    return;
                }
                if !in_object && depth > 0 {
                    self.matched = self.matched.min(depth - 1);
                }
                // Paths name keys: the path leads only through an object whose
                // levels above all matched, never through an array.
                let live = b == b'{' && self.matched == depth && depth < self.path.keys().len();
                self.stack.push(b == b'{');
                self.state = match live {
                    true => State::Key,
                    false => {
                        self.skip_from = depth;
                        State::Skip {
                            string: false,
                            escape: false,
                        }
                    }
                };
            }
            b']' if self.stack.last() == Some(&false) => self.close(false),
            b'"' => {
                self.state = State::Str {
                    key: false,
                    escape: false,
                }
            }
            b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
                self.number = (self.at_target && b.is_ascii_digit()).then(|| u64::from(b - b'0'));
                self.digits = match b {
                    b'0' => Digits::Zero,
                    _ => Digits::Whole,
                };
                self.state = State::Bare;
            }
            _ => self.state = State::Broken,
        }
    }

    fn string_byte(&mut self, key: bool, escape: bool, b: u8) {
        if escape {
            self.key_ok = false;
            self.state = State::Str { key, escape: false };
            return;
        }
        match b {
            b'\\' => self.state = State::Str { key, escape: true },
            b'"' if key => {
                let depth = self.stack.len();
                let whole = self
                    .path
                    .keys()
                    .get(depth - 1)
                    .is_some_and(|p| p.len() == self.key_at);
                if self.key_ok && whole {
                    self.matched = depth;
                }
                self.state = State::Colon;
            }
            b'"' => self.end_value(),
            _ if key => {
                let depth = self.stack.len();
                let expected = self
                    .path
                    .keys()
                    .get(depth - 1)
                    .and_then(|p| p.as_bytes().get(self.key_at));
                self.key_ok &= expected == Some(&b);
                self.key_at += 1;
            }
            _ => {}
        }
    }

    fn skip_byte(&mut self, string: bool, escape: bool, b: u8) {
        self.state = match (string, escape, b) {
            (true, true, _) => State::Skip {
                string: true,
                escape: false,
            },
            (true, false, b'\\') => State::Skip {
                string: true,
                escape: true,
            },
            (_, false, b'"') => State::Skip {
                string: !string,
                escape: false,
            },
            (false, _, b'{' | b'[') if self.stack.len() == MAX_DEPTH => State::Broken,
            (false, _, b'{' | b'[') => {
                self.stack.push(b == b'{');
                return;
            }
            (false, _, b'}' | b']') => {
                if self.stack.pop() != Some(b == b'}') {
                    self.state = State::Broken;
                } else if self.stack.len() == self.skip_from {
                    self.matched = self.matched.min(self.stack.len());
                    self.end_value();
                }
                return;
            }
            _ => return,
        };
    }

    /// A byte of a number or literal, read as JSON's grammar has it: `042`, `12.`
    /// and `1.2.3` are not numbers.
    fn bare_byte(&mut self, b: u8) {
        match (b, self.digits) {
            (b'0'..=b'9', Digits::Whole) => {
                self.number = self
                    .number
                    .and_then(|n| n.checked_mul(10)?.checked_add(u64::from(b - b'0')));
            }
            (b'0'..=b'9', Digits::Point | Digits::Fraction) => self.digits = Digits::Fraction,
            (b'.', Digits::Zero | Digits::Whole) => self.digits = Digits::Point,
            _ => self.number = None,
        }
    }

    fn end_bare(&mut self) {
        if self.at_target
            && self.digits != Digits::Point
            && let Some(n) = self.number
        {
            self.found = Some(n);
        }
        self.number = None;
        self.end_value();
    }

    fn end_value(&mut self) {
        self.at_target = false;
        self.state = State::After;
        if self.stack.is_empty() {
            self.done = true;
        }
    }

    fn close(&mut self, object: bool) {
        if self.stack.pop() != Some(object) {
            self.state = State::Broken;
            return;
        }
        self.matched = self.matched.min(self.stack.len());
        self.end_value();
    }
}

/// Where a number at the path is: after a leading `0` (which only a `.` may
/// follow), in the whole part, just after the `.`, or in the fraction.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Digits {
    Zero,
    Whole,
    Point,
    Fraction,
}

#[cfg(test)]
mod tests;
