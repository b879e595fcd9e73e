//! HTTP/1 request heads as they arrive on the wire, for the two things hyper accepts
//! without telling the application.
//!
//! - A head with both `Content-Length` and `Transfer-Encoding`: hyper frames the
//!   body by `Transfer-Encoding`, drops the `Content-Length` and closes the
//!   connection after the answer (one of the two treatments RFC 9112 6.1 allows).
//!   sluice takes the other one and refuses the request, but hyper leaves no trace
//!   of the dropped header in the request it hands over.
//! - A line of the head ended by a bare LF instead of CRLF: httparse reads it as a
//!   line end; a front proxy or upstream that does not would read a different head.
//!
//! [`Scanner`] watches the bytes a connection reads, before hyper parses them: it
//! finds each head the way httparse (hyper's parser) delimits it, notes a head
//! that carries one of the two, and follows each body's framing the way hyper's
//! decoder does (`Content-Length` bytes, or chunks with hyper's rules for size
//! lines and trailers) to find the next head. It never changes a byte. The first
//! head found wrong marks its request ([`Marks::take`]); the request is refused
//! by the head checks and the scanner stops, as the connection closes after that
//! answer. Wherever the scanner cannot follow the stream the way hyper does (a head
//! or chunk hyper refuses, the HTTP/2 preface) it stops watching: hyper then ends
//! the connection with its own error, or serves HTTP/2. A `CONNECT`, which hyper
//! hands over and would follow with more requests on the same connection, is
//! marked too ([`Malformed::Connect`]): refused, it ends the connection, so nothing
//! the scanner did not follow is served.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};

/// What is wrong with a head that hyper accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Malformed {
    /// Both `Content-Length` and `Transfer-Encoding`.
    BothLengths,
    /// A line ended by LF alone.
    BareLf,
    /// A `CONNECT`: hyper hands it to the service and keeps the connection for
    /// what follows, which the scanner no longer follows (a tunnel's bytes are not
    /// requests); refused, the connection closes after it.
    Connect,
}

impl Malformed {
    /// Why the request is refused, for the problem's `detail`.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Malformed::BothLengths => "both Content-Length and Transfer-Encoding",
            Malformed::BareLf => "a header line ended by LF without CR",
            Malformed::Connect => "CONNECT is not served: sluice is a reverse proxy",
        }
    }
}

/// The requests of one connection that the scanner found malformed, shared between
/// the scanner (on the read side) and the service (which numbers the requests hyper
/// hands over; hyper hands over every head it parsed, in order).
#[derive(Debug, Default)]
pub(crate) struct Marks {
    /// The number (from 1) of the first malformed head; 0 while there is none.
    head: AtomicU32,
    what: AtomicU8,
    /// Requests handed to the service so far.
    served: AtomicU32,
}

impl Marks {
    /// Numbers the next request and says whether its head was malformed.
    pub(crate) fn take(&self) -> Option<Malformed> {
        let number = self.served.fetch_add(1, Ordering::Relaxed) + 1;
        if self.head.load(Ordering::Acquire) != number {
            return None;
        }
        Some(match self.what.load(Ordering::Relaxed) {
            0 => Malformed::BothLengths,
            1 => Malformed::BareLf,
            _ => Malformed::Connect,
        })
    }

    fn mark(&self, head: u32, what: Malformed) {
        self.what.store(what as u8, Ordering::Relaxed);
        self.head.store(head, Ordering::Release);
    }
}

/// Follows one connection's request stream; see the module documentation.
#[derive(Debug)]
pub(crate) struct Scanner {
    state: State,
    /// The start of a head that did not arrive in one read, and how far it was read.
    partial: Vec<u8>,
    reading: Reading,
    /// A head longer than this is hyper's error, not the scanner's to follow.
    max_head: usize,
    heads: u32,
    marks: Arc<Marks>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Head,
    /// This many body bytes left.
    Length(u64),
    Chunked(Chunk),
    /// Not watching any more.
    Off,
}

/// hyper's chunked decoder's states, with the sizes they carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    Start,
    Size(u64),
    SizeSpace(u64),
    Extension(u64),
    SizeLf(u64),
    Data(u64),
    DataCr,
    DataLf,
    Trailer,
    TrailerLf,
    EndCr,
    EndLf,
}

impl Scanner {
    /// A scanner whose heads are marked in `marks`; heads longer than `max_head`
    /// (hyper's read buffer) are left to hyper.
    pub(crate) fn new(max_head: usize, marks: Arc<Marks>) -> Scanner {
        Scanner {
            state: State::Head,
            partial: Vec::new(),
            reading: Reading::default(),
            max_head,
            heads: 0,
            marks,
        }
    }

    /// Follows `bytes`, the next bytes read from the client.
    pub(crate) fn feed(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let used = match self.state {
                State::Off => return,
                State::Head if self.partial.is_empty() => match self.head(bytes) {
                    Some(used) => used,
                    None => {
                        self.keep_partial(bytes);
                        return;
                    }
                },
                State::Head => {
                    let before = self.partial.len();
                    self.partial.extend_from_slice(bytes);
                    let partial = std::mem::take(&mut self.partial);
                    match self.head(&partial) {
                        Some(used) => used.saturating_sub(before).min(bytes.len()),
                        None => {
                            self.partial = partial;
                            if self.partial.len() > self.max_head {
                                self.stop();
                            }
                            return;
                        }
                    }
                }
                State::Length(left) => {
                    let used = left.min(bytes.len() as u64);
                    self.state = match left - used {
                        0 => State::Head,
                        left => State::Length(left),
                    };
                    used as usize
                }
                State::Chunked(Chunk::Data(left)) => {
                    let used = left.min(bytes.len() as u64);
                    self.state = State::Chunked(match left - used {
                        0 => Chunk::DataCr,
                        left => Chunk::Data(left),
                    });
                    used as usize
                }
                State::Chunked(chunk) => {
                    match step(chunk, bytes[0]) {
                        Step::Next(next) => self.state = State::Chunked(next),
                        Step::End => self.state = State::Head,
                        Step::Refused => self.stop(),
                    }
                    1
                }
            };
            bytes = &bytes[used..];
        }
    }

    /// Whether every byte fed so far belongs to a complete request (head and body):
    /// no head or body is in progress. False once the scanner stopped watching.
    pub(crate) fn between_messages(&self) -> bool {
        self.state == State::Head && self.partial.is_empty()
    }

    fn keep_partial(&mut self, bytes: &[u8]) {
        if bytes.len() > self.max_head {
            self.stop();
        } else {
            self.partial.extend_from_slice(bytes);
        }
    }

    fn stop(&mut self) {
        self.state = State::Off;
        self.partial = Vec::new();
    }

    /// Reads on in the head at the start of `bytes`: the bytes it took, or `None`
    /// if the head is not complete yet. Sets the state for what follows it.
    fn head(&mut self, bytes: &[u8]) -> Option<usize> {
        let (head, length) = self.reading.resume(bytes)?;
        self.reading = Reading::default();
        self.heads += 1;
        self.state = match head.framing {
            Framing::Unknown => State::Off,
            Framing::Chunked => State::Chunked(Chunk::Start),
            Framing::Length(0) => State::Head,
            Framing::Length(n) => State::Length(n),
        };
        if let Some(what) = head.malformed {
            self.marks.mark(self.heads, what);
            self.state = State::Off;
        }
        if self.state == State::Off {
            self.partial = Vec::new();
        }
        Some(length)
    }
}

/// What the scanner needs of one head.
struct Scanned {
    framing: Framing,
    malformed: Option<Malformed>,
}

enum Framing {
    /// A head hyper refuses, or one that is not followed by an HTTP/1 body.
    Unknown,
    Length(u64),
    Chunked,
}

/// A head being read, line by line; resumable, so a head that arrives in many small
/// reads is still read once, not from its start on every read.
///
/// Line by line gives httparse's reading of every head httparse accepts: it skips
/// empty lines before the request line, ends a line at LF (after CR or not), refuses
/// a CR anywhere else and a space before a header's colon, and trims spaces and tabs
/// around values. A head it refuses, hyper refuses, and what the scanner made of it
/// does not matter. The framing is read as hyper's server reads it (its
/// `role::Server::parse`).
#[derive(Debug, Default)]
struct Reading {
    /// Where the request line starts, once a byte other than CR or LF came.
    start: Option<usize>,
    /// Where the first line not read yet starts.
    line: usize,
    http11: bool,
    /// An HTTP/1.x request line, not `CONNECT`.
    known: bool,
    /// A `CONNECT` request line.
    connect: bool,
    length: Option<u64>,
    lengths_differ: bool,
    /// Whether the last `Transfer-Encoding` line ends in `chunked`.
    coding: Option<bool>,
    bare_lf: bool,
}

impl Reading {
    /// Goes on reading the head at the start of `bytes` (which holds at least what
    /// the last call saw): the head and its length, or `None` while incomplete.
    fn resume(&mut self, bytes: &[u8]) -> Option<(Scanned, usize)> {
        let start = match self.start {
            Some(start) => start,
            None => {
                let start = self.line
                    + bytes[self.line..]
                        .iter()
                        .position(|&b| b != b'\r' && b != b'\n')
                        .or_else(|| {
                            self.line = bytes.len();
                            None
                        })?;
                self.start = Some(start);
                self.line = start;
                start
            }
        };
        let from = self.line;
        for end in memchr::memchr_iter(b'\n', &bytes[from..]).map(|at| from + at) {
            let line = self.line;
            self.line = end + 1;
            let crlf = end > line && bytes[end - 1] == b'\r';
            self.bare_lf |= !crlf;
            let content = &bytes[line..end - usize::from(crlf)];
            if line == start {
                // The request line: CONNECT takes the connection elsewhere, and a
                // version other than 1.x (the HTTP/2 preface) is not HTTP/1.
                self.http11 = content.ends_with(b" HTTP/1.1");
                self.connect = content.starts_with(b"CONNECT ");
                self.known = (self.http11 || content.ends_with(b" HTTP/1.0")) && !self.connect;
            } else if content.is_empty() {
                return Some((self.head(), end + 1));
            } else {
                self.header(content);
            }
        }
        None
    }

    fn header(&mut self, line: &[u8]) {
        match line[0] | 0x20 {
            b't' => {
                if let Some(value) = value_of(line, b"transfer-encoding:") {
                    self.coding = Some(ends_in_chunked(value));
                }
            }
            b'c' => {
                if let Some(value) = value_of(line, b"content-length:") {
                    let value = digits(value);
                    self.lengths_differ |=
                        value.is_none() || self.length.is_some_and(|l| Some(l) != value);
                    self.length = self.length.or(value);
                }
            }
            _ => {}
        }
    }

    fn head(&self) -> Scanned {
        let framing = match (self.coding, self.length) {
            _ if !self.known => Framing::Unknown,
            (Some(_), _) if !self.http11 => Framing::Unknown,
            (Some(true), _) => Framing::Chunked,
            (Some(false), _) => Framing::Unknown,
            (None, _) if self.lengths_differ => Framing::Unknown,
            (None, length) => Framing::Length(length.unwrap_or(0)),
        };
        let malformed = match framing {
            Framing::Unknown if self.connect => Some(Malformed::Connect),
            Framing::Unknown => None,
            _ if self.coding.is_some() && (self.length.is_some() || self.lengths_differ) => {
                Some(Malformed::BothLengths)
            }
            _ if self.bare_lf => Some(Malformed::BareLf),
            _ => None,
        };
        Scanned { framing, malformed }
    }
}

/// The value of header line `line` if its name (with the colon) is `name`, any case,
/// without the spaces and tabs around it.
fn value_of<'a>(line: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    if line.len() < name.len() || !line[..name.len()].eq_ignore_ascii_case(name) {
        return None;
    }
    let value = &line[name.len()..];
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let from = value.iter().position(|b| !blank(b)).unwrap_or(value.len());
    let to = value
        .iter()
        .rposition(|b| !blank(b))
        .map_or(from, |at| at + 1);
    Some(&value[from..to])
}

/// hyper's test for a chunked body: the last coding of the line is `chunked`.
fn ends_in_chunked(value: &[u8]) -> bool {
    std::str::from_utf8(value).is_ok_and(|value| {
        value
            .rsplit(',')
            .next()
            .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"))
    })
}

/// A `Content-Length` value as hyper reads it: decimal digits only.
fn digits(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    value.iter().try_fold(0u64, |n, &b| {
        if b.is_ascii_digit() {
            n.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// Where one byte outside chunk data takes hyper's chunked decoder.
enum Step {
    Next(Chunk),
    /// The body ended with this byte.
    End,
    /// hyper refuses the byte and closes the connection.
    Refused,
}

/// One byte through hyper's chunked decoder outside chunk data.
fn step(chunk: Chunk, byte: u8) -> Step {
    let hex = |size: u64| {
        let digit = (byte as char).to_digit(16)?;
        size.checked_mul(16)?.checked_add(u64::from(digit))
    };
    let next = match (chunk, byte) {
        (Chunk::Start, _) => {
            return hex(0).map_or(Step::Refused, |size| Step::Next(Chunk::Size(size)));
        }
        (Chunk::Size(size), b'\t' | b' ') => Chunk::SizeSpace(size),
        (Chunk::Size(size) | Chunk::SizeSpace(size), b';') => Chunk::Extension(size),
        (Chunk::Size(size) | Chunk::SizeSpace(size) | Chunk::Extension(size), b'\r') => {
            Chunk::SizeLf(size)
        }
        (Chunk::Size(size), _) => {
            return hex(size).map_or(Step::Refused, |size| Step::Next(Chunk::Size(size)));
        }
        (Chunk::SizeSpace(size), b'\t' | b' ') => Chunk::SizeSpace(size),
        (Chunk::Extension(_), b'\n') => return Step::Refused,
        (Chunk::Extension(size), _) => Chunk::Extension(size),
        (Chunk::SizeLf(0), b'\n') => Chunk::EndCr,
        (Chunk::SizeLf(size), b'\n') => Chunk::Data(size),
        (Chunk::DataCr, b'\r') => Chunk::DataLf,
        (Chunk::DataLf, b'\n') => Chunk::Start,
        (Chunk::Trailer, b'\r') => Chunk::TrailerLf,
        (Chunk::Trailer, _) => Chunk::Trailer,
        (Chunk::TrailerLf, b'\n') => Chunk::EndCr,
        (Chunk::EndCr, b'\r') => Chunk::EndLf,
        (Chunk::EndCr, _) => Chunk::Trailer,
        (Chunk::EndLf, b'\n') => return Step::End,
        _ => return Step::Refused,
    };
    Step::Next(next)
}

#[cfg(test)]
mod tests;
