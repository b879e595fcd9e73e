//! The cost field in a `text/event-stream` answer: the last event whose `data` is a
//! JSON document carrying it, as OpenAI- and Anthropic-style streams send usage.
//!
//! Lines are split as they stream by, without buffering them: the `data:` lines of
//! an event are fed straight into a [`JsonField`] (joined by newlines, as the event's
//! data is), and a blank line ends the event. Other fields (`event:`, `id:`,
//! comments) are skipped; an event whose data is not JSON (`[DONE]`) finds nothing.

use super::json::JsonField;

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
pub struct EventStream {
    event: JsonField,
    line: Line,
    /// Data lines fed to the current event.
    data_lines: usize,
    found: Option<u64>,
}

impl EventStream {
    /// A scanner for the field at `path` of the stream's events.
    pub fn new(path: std::sync::Arc<[String]>) -> EventStream {
        EventStream {
            event: JsonField::new(path),
            line: Line::Start,
            data_lines: 0,
            found: None,
        }
    }

    /// The value of the last complete event that carried the field.
    pub fn value(&self) -> Option<u64> {
        self.found
    }

    /// Reads `bytes`, the next piece of the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        let mut i = 0;
        while i < bytes.len() {
            // A data value or a skipped line runs to the line's end: the run goes to
            // the JSON scanner in one piece, or is passed over, at once.
            if matches!(self.line, Line::Data | Line::Skip) {
                let rest = &bytes[i..];
                let run = memchr::memchr2(b'\r', b'\n', rest).unwrap_or(rest.len());
                if self.line == Line::Data {
                    self.event.feed(&rest[..run]);
                }
                i += run;
                if i == bytes.len() {
                    return;
                }
            }
            self.byte(bytes[i]);
            i += 1;
        }
    }

    /// The stream ended: an event not closed by a blank line still counts.
    pub fn finish(&mut self) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(stream: &str, piece: usize) -> Option<u64> {
        let path = std::sync::Arc::from(["usage".to_string(), "total_tokens".to_string()]);
        let mut events = EventStream::new(path);
        for chunk in stream.as_bytes().chunks(piece) {
            events.feed(chunk);
        }
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

    proptest::proptest! {
        /// Lines of every kind, ended by `\n`, `\r\n` or `\r`, cut anywhere: the
        /// same answer as the state machine handed one byte at a time.
        #[test]
        fn the_pieces_never_change_the_answer(
            parts in proptest::collection::vec(proptest::sample::select(vec![
                "data: {\"usage\":{\"total_tokens\":5}}", "data: {\"usage\":",
                "data:{\"total_tokens\": 17}}", "data: {\"a\":\"x\\\"y\",\"b\":[1,{}]}",
                "data: [DONE]", ": keep-alive", "event: delta", "dat", "id: 3", "",
                "\n", "\r\n", "\r",
            ]), 0..40),
            piece in 1usize..17,
        ) {
            let stream = parts.concat();
            let path = std::sync::Arc::from(["usage".to_string(), "total_tokens".to_string()]);
            let mut bytewise = EventStream::new(path);
            stream.bytes().for_each(|b| bytewise.byte(b));
            bytewise.finish();
            proptest::prop_assert_eq!(scan(&stream, piece), bytewise.value());
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
