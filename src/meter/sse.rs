//! The cost field in a `text/event-stream` answer: the last event whose `data` is a
//! JSON document carrying it, as OpenAI- and Anthropic-style streams send usage.
//!
//! Lines are split as they stream by, without buffering them: the `data:` lines of
//! an event are fed straight into a [`JsonField`] (joined by newlines, as the event's
//! data is), and a blank line ends the event. Other fields (`event:`, `id:`,
//! comments) are skipped; an event whose data is not JSON (`[DONE]`) finds nothing.
//!
//! Most events of a stream (the deltas of an answer) cannot carry the field: their
//! bytes do not hold its last key as a document holding it must spell it
//! (`"total_tokens"`, [`JsonPath::last_key`]). Between events, the scanner searches the
//! piece for that key once, and passes over every whole event before the first
//! place it occurs (or before the piece's end) without reading their lines or their
//! JSON: only the event the key is in, and one cut by the piece's end, are read.

use std::sync::Arc;

use memchr::memmem::Finder;

use super::json::JsonField;
use crate::config::route::JsonPath;

/// Where in a line the scanner is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// At the start of a line.
    Start,
    /// Reading the field name; how many bytes of `data:` matched so far.
    Name(usize),
    /// After `data:`, before the value (one leading space is dropped).
    DataStart,
    /// In a `data` value.
    Data,
    /// In a line of any other field, or a comment.
    Skip,
    /// After `\r`: a `\n` now belongs to the same line end.
    Cr,
}

const DATA: &[u8] = b"data:";

/// Finds the cost field in an event stream, fed in pieces.
#[derive(Debug, Clone)]
pub(crate) struct EventStream {
    event: JsonField,
    line: Line,
    /// Data lines fed to the current event.
    data_lines: usize,
    found: Option<u64>,
}

impl EventStream {
    /// A scanner for the field at `path` of the stream's events.
    pub(crate) fn new(path: Arc<JsonPath>) -> EventStream {
        EventStream {
            event: JsonField::new(path),
            line: Line::Start,
            data_lines: 0,
            found: None,
        }
    }

    /// The value of the last complete event that carried the field.
    pub(crate) fn value(&self) -> Option<u64> {
        self.found
    }

    /// Reads `bytes`, the next piece of the stream.
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        let path = Arc::clone(self.event.path());
        match path.last_key() {
            Some(last_key) => self.feed_between(bytes, last_key),
            None => self.feed_lines(bytes),
        }
    }

    /// [`EventStream::feed`], passing over the events that cannot carry the field.
    fn feed_between(&mut self, bytes: &[u8], last_key: &Finder<'_>) {
        let mut i = 0;
        while i < bytes.len() {
            if self.data_lines == 0 && matches!(self.line, Line::Start | Line::Cr) {
                // Between events (or in one with no data yet).
                if self.line == Line::Cr {
                    // A `\n` right after a `\r` ends the same line.
                    self.line = Line::Start;
                    if bytes[i] == b'\n' {
                        i += 1;
                        continue;
                    }
                }
                let rest = &bytes[i..];
                let before = last_key.find(rest).unwrap_or(rest.len());
                if let Some(end) = last_event_end(&rest[..before]) {
                    i += end;
                    // A `\r` last may be the first half of a `\r\n`.
                    if rest[end - 1] == b'\r' {
                        self.line = Line::Cr;
                    }
                    continue;
                }
            }
            i = self.line_step(bytes, i);
        }
    }

    /// [`EventStream::feed`], reading every line.
    fn feed_lines(&mut self, bytes: &[u8]) {
        let mut i = 0;
        while i < bytes.len() {
            i = self.line_step(bytes, i);
        }
    }

    /// Reads from `bytes[i]` on: a data value or a skipped line to its end (the run
    /// goes to the JSON scanner in one piece, or is passed over, at once), or one
    /// byte; returns where it stopped.
    #[inline]
    fn line_step(&mut self, bytes: &[u8], i: usize) -> usize {
        if matches!(self.line, Line::Data | Line::Skip) {
            let rest = &bytes[i..];
            let run = memchr::memchr2(b'\r', b'\n', rest).unwrap_or(rest.len());
            if self.line == Line::Data {
                self.event.feed(&rest[..run]);
            }
            if run == rest.len() {
                return bytes.len();
            }
            self.byte(rest[run]);
            return i + run + 1;
        }
        self.byte(bytes[i]);
        i + 1
    }

    /// The stream ended: an event not closed by a blank line still counts.
    pub(crate) fn finish(&mut self) {
        self.end_event();
    }

    fn byte(&mut self, b: u8) {
        if self.line == Line::Cr {
            self.line = Line::Start;
            if b == b'\n' {
                return;
            }
        }
        if b == b'\r' || b == b'\n' {
            let blank = self.line == Line::Start;
            self.line = if b == b'\r' { Line::Cr } else { Line::Start };
            if blank {
                self.end_event();
            }
            return;
        }
        self.line = match self.line {
            Line::Start | Line::Cr => self.name(0, b),
            Line::Name(at) => self.name(at, b),
            Line::DataStart if b == b' ' => Line::Data,
            Line::DataStart | Line::Data => {
                self.event.feed(&[b]);
                Line::Data
            }
            Line::Skip => Line::Skip,
        };
    }

    fn name(&mut self, at: usize, b: u8) -> Line {
        if DATA.get(at) != Some(&b) {
            return Line::Skip;
        }
        if at + 1 < DATA.len() {
            return Line::Name(at + 1);
        }
        if self.data_lines > 0 {
            self.event.feed(b"\n");
        }
        self.data_lines += 1;
        Line::DataStart
    }

    fn end_event(&mut self) {
        if self.data_lines > 0 {
            self.event.finish();
            if let Some(value) = self.event.value() {
                self.found = Some(value);
            }
        }
        self.event.reset();
        self.data_lines = 0;
    }
}

/// Where the last event ending in `bytes` ends, when `bytes` start a line between
/// events: just after the last run of line ends that holds a blank line (two line
/// ends in a row; `\r\n` is one). Every event before that point is whole in `bytes`.
fn last_event_end(bytes: &[u8]) -> Option<usize> {
    let mut end = bytes.len();
    while let Some(last) = memchr::memrchr2(b'\r', b'\n', &bytes[..end]) {
        let mut first = last;
        while first > 0 && matches!(bytes[first - 1], b'\r' | b'\n') {
            first -= 1;
        }
        let run = &bytes[first..=last];
        if run.len() > 1 && run != b"\r\n" {
            return Some(last + 1);
        }
        end = first;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(keys: &[&str]) -> Arc<JsonPath> {
        Arc::new(JsonPath::new(keys.iter().map(|k| k.to_string()).collect()))
    }

    /// The stream cut into pieces of the given lengths, in turn.
    fn scan_cut(stream: &str, keys: &[&str], pieces: &[usize]) -> Option<u64> {
        let mut events = EventStream::new(path(keys));
        let mut rest = stream.as_bytes();
        for &piece in pieces.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (now, later) = rest.split_at(piece.min(rest.len()));
            events.feed(now);
            rest = later;
        }
        events.finish();
        events.value()
    }

    fn scan(stream: &str, piece: usize) -> Option<u64> {
        scan_cut(stream, &["usage", "total_tokens"], &[piece])
    }

    /// The state machine handed one byte at a time: every line read.
    fn bytewise(stream: &str, keys: &[&str]) -> Option<u64> {
        let mut events = EventStream::new(path(keys));
        stream.bytes().for_each(|b| events.byte(b));
        events.finish();
        events.value()
    }

    #[test]
    fn the_last_event_carrying_usage_wins_whatever_the_pieces() {
        let stream = "event: start\ndata: {\"delta\":\"Hel\"}\n\n: keep-alive\n\n\
                      data: {\"delta\":\"lo\",\"usage\":{\"total_tokens\":3}}\n\n\
                      data: {\"usage\":\r\ndata: {\"total_tokens\": 57}}\r\n\r\n\
                      data: {\"delta\":\"!\"}\n\ndata: [DONE]\n\n";
        for piece in [1, 2, 5, 64, 4096] {
            assert_eq!(scan(stream, piece), Some(57), "piece {piece}");
        }
    }

    #[test]
    fn the_key_anywhere_but_at_the_path_counts_for_nothing() {
        // Escaped spellings of a key never match (as in a JSON body), so an event
        // passed over for not holding `"total_tokens"` could not have counted.
        let escaped = "data: {\"usage\":{\"total\\u005ftokens\":8}}\n\n";
        let in_a_string = "data: {\"text\":\"{\\\"usage\\\":{\\\"total_tokens\\\":9}}\"}\n\n";
        let elsewhere = ": \"total_tokens\"\nevent: \"total_tokens\"\n\
                         data: {\"x\":{\"total_tokens\":6}}\n\n";
        let usage = "data: {\"usage\":{\"total_tokens\":5}}\n\n";
        for piece in [1, 7, 4096] {
            for other in [escaped, in_a_string, elsewhere] {
                assert_eq!(scan(other, piece), None, "{other:?}");
                assert_eq!(scan(&format!("{usage}{other}"), piece), Some(5));
                assert_eq!(scan(&format!("{other}{usage}{other}"), piece), Some(5));
            }
        }
    }

    #[test]
    fn a_key_holding_a_line_end_is_read_across_data_lines() {
        // Joined data lines can form such a key: no event is passed over unread.
        let stream = "data: {\"a\ndata: b\": 4}\n\n";
        assert_eq!(scan_cut(stream, &["a\nb"], &[4096]), Some(4));
        assert!(path(&["a\nb"]).last_key().is_none());
    }

    #[test]
    fn events_end_at_blank_lines_whatever_the_line_ends() {
        assert_eq!(last_event_end(b"data: x\n\ndata: y"), Some(9));
        assert_eq!(last_event_end(b"data: x\r\n\r\ndata: y\r\n"), Some(11));
        assert_eq!(last_event_end(b"a\n\nb\r\rc\r\n"), Some(6));
        assert_eq!(last_event_end(b"a\n\r\nb\nc\r\n"), Some(4));
        assert_eq!(last_event_end(b"a\r\nb\nc\r"), None);
        assert_eq!(last_event_end(b"a\n\n\n"), Some(4));
        assert_eq!(last_event_end(b""), None);
    }

    proptest::proptest! {
        /// Lines of every kind, ended by `\n`, `\r\n` or `\r`, cut anywhere: the
        /// same answer as the state machine handed one byte at a time, which reads
        /// every line of every event.
        #[test]
        fn the_pieces_never_change_the_answer(
            parts in proptest::collection::vec(proptest::sample::select(vec![
                "data: {\"usage\":{\"total_tokens\":5}}", "data: {\"usage\":",
                "data:{\"total_tokens\": 17}}", "data: {\"a\":\"x\\\"y\",\"b\":[1,{}]}",
                "data: {\"usage\":{\"total\\u005ftokens\":8}}", "\"total_tokens\":",
                "data: {\"s\":\"\\\"total_tokens\\\":\",\"usage\":{\"total_tokens\":2}}",
                "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}", "3}}",
                "data: [DONE]", ": keep-alive", "event: delta", "dat", "id: 3", "",
                "\n", "\n", "\n\n", "\r\n", "\r",
            ]), 0..60),
            pieces in proptest::collection::vec(1usize..300, 1..6),
        ) {
            let stream = parts.concat();
            let keys = ["usage", "total_tokens"];
            proptest::prop_assert_eq!(scan_cut(&stream, &keys, &pieces), bytewise(&stream, &keys));
            proptest::prop_assert_eq!(scan_cut(&stream, &keys, &[1]), bytewise(&stream, &keys));
        }
    }

    #[test]
    fn a_stream_without_usage_or_cut_inside_the_event_finds_nothing() {
        assert_eq!(scan("data: {\"delta\":\"x\"}\n\ndata: [DONE]\n\n", 3), None);
        assert_eq!(scan("data: {\"usage\":{\"total_tokens\":5", 3), None);
        assert_eq!(
            scan("data: {\"usage\":{\"total_tokens\":5}}", 3),
            Some(5),
            "no blank line at the end"
        );
        assert_eq!(scan("dat: {\"usage\":{\"total_tokens\":5}}\n\n", 3), None);
    }
}
