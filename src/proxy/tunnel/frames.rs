//! WebSocket frame headers (RFC 6455, section 5), read as they stream past, in a
//! fixed amount of memory: [`Frames`] gathers one header (at most 14 bytes) at a
//! time, checks it, and then only counts the payload's bytes going by. Payloads are
//! never copied or unmasked; the one exception is a close frame's status code, two
//! bytes read as they pass.
//!
//! What a header says ([`Frame`]) is for the relay to act on: a new message, a
//! control frame, a close. What breaks the protocol is a [`Violation`], with the
//! close code RFC 6455 gives it. This module does no I/O.

/// The close codes sluice sends (RFC 6455, 7.4.1).
pub(crate) mod code {
    /// The endpoint is going away: a gateway stopping, the other side of a socket
    /// that sluice closed.
    pub(crate) const GOING_AWAY: u16 = 1001;
    /// A frame that breaks the protocol.
    pub(crate) const PROTOCOL_ERROR: u16 = 1002;
    /// A message the policy does not allow now (a limit), or a control frame flood.
    pub(crate) const POLICY_VIOLATION: u16 = 1008;
    /// The limit a message was held to cannot be decided now (its store is down).
    pub(crate) const TRY_AGAIN_LATER: u16 = 1013;
    /// A frame or message over the size limit.
    pub(crate) const TOO_BIG: u16 = 1009;
    /// No close frame was seen: the connection just ended (never sent).
    pub(crate) const ABNORMAL: u16 = 1006;
    /// The upstream broke the protocol (1014, "bad gateway").
    pub(crate) const BAD_GATEWAY: u16 = 1014;
}

/// Who sends the frames read: a client masks every frame, a server none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sender {
    Client,
    Server,
}

/// A frame's opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opcode {
    Continuation,
    Text,
    Binary,
    Close,
    Ping,
    Pong,
}

impl Opcode {
    fn of(bits: u8) -> Option<Opcode> {
        Some(match bits {
            0x0 => Opcode::Continuation,
            0x1 => Opcode::Text,
            0x2 => Opcode::Binary,
            0x8 => Opcode::Close,
            0x9 => Opcode::Ping,
            0xA => Opcode::Pong,
            _ => return None,
        })
    }

    /// Close, ping and pong: not messages.
    pub(crate) fn is_control(self) -> bool {
        matches!(self, Opcode::Close | Opcode::Ping | Opcode::Pong)
    }
}

/// A frame header that was read whole and checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Frame {
    pub opcode: Opcode,
    /// The payload's length.
    pub len: u64,
    /// The first frame of a message (text or binary): the one a message limit counts.
    pub starts_message: bool,
}

/// A frame that breaks the protocol or a limit: the socket is closed with `code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Violation {
    /// 1002 (protocol) or 1009 (too big).
    pub code: u16,
    /// Why, for the close frame's reason and the log.
    pub reason: &'static str,
}

impl Violation {
    const fn protocol(reason: &'static str) -> Violation {
        Violation {
            code: code::PROTOCOL_ERROR,
            reason,
        }
    }
}

/// What the next bytes of the stream are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// The first `n` bytes are payload: pass them on as they are.
    Payload(usize),
    /// A header is complete after the first `consumed` bytes (its bytes are
    /// [`Frames::header`]): decide, then pass the header on.
    Frame { consumed: usize, frame: Frame },
    /// Every byte went into a header not complete yet.
    Partial,
}

/// The reserved bits a negotiated extension allows (RFC 6455, 5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Extensions {
    /// None negotiated: every RSV bit must be 0.
    None,
    /// `permessage-deflate` (RFC 7692): RSV1 on a message's first frame.
    Deflate,
    /// An extension sluice does not know: it may use any bit.
    Unknown,
}

impl Extensions {
    /// What a `Sec-WebSocket-Extensions` answer (the upstream's 101) negotiated.
    pub(crate) fn negotiated<'v>(values: impl Iterator<Item = &'v [u8]>) -> Extensions {
        let mut found = Extensions::None;
        for value in values {
            for extension in value.split(|&b| b == b',') {
                let name = extension.split(|&b| b == b';').next().unwrap_or_default();
                match name.trim_ascii() {
                    b"" => {}
                    name if name.eq_ignore_ascii_case(b"permessage-deflate") => {
                        if found == Extensions::None {
                            found = Extensions::Deflate;
                        }
                    }
                    _ => found = Extensions::Unknown,
                }
            }
        }
        found
    }

    /// The RSV bits (as in the header's first byte) a frame may set.
    fn allowed(self, opcode: Opcode) -> u8 {
        match (self, opcode) {
            (Extensions::Unknown, _) => 0x70,
            (Extensions::Deflate, Opcode::Text | Opcode::Binary) => 0x40,
            _ => 0,
        }
    }
}

/// One direction of a socket, frame by frame.
#[derive(Debug)]
pub(crate) struct Frames {
    sender: Sender,
    extensions: Extensions,
    /// The largest frame or fragmented message (`max_body_bytes`); 0 = no limit.
    max_message: u64,
    /// The header being gathered, or the last one announced.
    head: [u8; 14],
    /// Bytes of the header being gathered.
    have: u8,
    /// Length of the last header announced.
    announced: u8,
    /// Payload bytes of the current frame still to come.
    left: u64,
    /// Payload bytes of the current frame already gone by.
    passed: u64,
    /// The current frame is the first close: its status code is read as it passes.
    close: Option<[u8; 2]>,
    /// A fragmented message is open (its last frame is still to come).
    in_message: bool,
    /// The open message's bytes so far.
    message_bytes: u64,
    /// The status code of the first close frame seen.
    close_code: Option<u16>,
}

impl Frames {
    /// The frames `sender` sends, with `extensions` negotiated and messages of at most
    /// `max_message` bytes (0: any size).
    pub(crate) fn new(sender: Sender, extensions: Extensions, max_message: u64) -> Frames {
        Frames {
            sender,
            extensions,
            max_message,
            head: [0; 14],
            have: 0,
            announced: 0,
            left: 0,
            passed: 0,
            close: None,
            in_message: false,
            message_bytes: 0,
            close_code: None,
        }
    }

    /// Who sends these frames.
    pub(crate) fn sender(&self) -> Sender {
        self.sender
    }

    /// Whether payload bytes of the current frame are still to come.
    pub(crate) fn in_payload(&self) -> bool {
        self.left > 0
    }

    /// The bytes of the header [`Event::Frame`] announced.
    pub(crate) fn header(&self) -> &[u8] {
        &self.head[..usize::from(self.announced)]
    }

    /// The status code of the first close frame that went by (1005 for a close
    /// frame without one).
    pub(crate) fn close_code(&self) -> Option<u16> {
        self.close_code
    }

    /// Reads the front of `input`: payload to pass on, a header now complete, or a
    /// header still partial.
    pub(crate) fn next(&mut self, input: &[u8]) -> Result<Event, Violation> {
        if self.left > 0 {
            let n = usize::try_from(self.left)
                .unwrap_or(usize::MAX)
                .min(input.len());
            if self.close.is_some() {
                self.read_code(&input[..n]);
            }
            self.left -= n as u64;
            self.passed += n as u64;
            return Ok(Event::Payload(n));
        }
        if self.have == 0
            && let Some(&[_, b1]) = input.first_chunk::<2>()
            && input.len() >= header_len(b1)
        {
            // The whole header is in `input`: copied at once, not byte by byte.
            let consumed = header_len(b1);
            self.head[..consumed].copy_from_slice(&input[..consumed]);
            self.have = consumed as u8;
            return self.announce(consumed);
        }
        let mut consumed = 0;
        while consumed < input.len() {
            self.head[usize::from(self.have)] = input[consumed];
            self.have += 1;
            consumed += 1;
            if self.complete() {
                return self.announce(consumed);
            }
        }
        Ok(Event::Partial)
    }

    /// Checks the header now complete in `head`, the last of it at `input`'s
    /// `consumed`th byte, and announces it.
    fn announce(&mut self, consumed: usize) -> Result<Event, Violation> {
        // A frame that breaks a rule is not passed on: the stream stays between
        // frames.
        let frame = self.check().inspect_err(|_| self.have = 0)?;
        (self.announced, self.have) = (self.have, 0);
        Ok(Event::Frame { consumed, frame })
    }

    /// How long the header being gathered is, once its first two bytes are known.
    fn needed(&self) -> usize {
        match self.have {
            0 | 1 => 2,
            _ => header_len(self.head[1]),
        }
    }

    fn complete(&self) -> bool {
        self.have >= 2 && usize::from(self.have) == self.needed()
    }

    /// Checks the complete header and starts its payload.
    fn check(&mut self) -> Result<Frame, Violation> {
        let [b0, b1, ..] = self.head;
        let opcode = Opcode::of(b0 & 0x0f).ok_or(Violation::protocol("unknown opcode"))?;
        let fin = b0 & 0x80 != 0;
        let masked = b1 & 0x80 != 0;
        match (self.sender, masked) {
            (Sender::Client, false) => return Err(Violation::protocol("unmasked client frame")),
            (Sender::Server, true) => return Err(Violation::protocol("masked server frame")),
            _ => {}
        }
        if b0 & 0x70 & !self.extensions.allowed(opcode) != 0 {
            return Err(Violation::protocol("reserved bits set"));
        }
        let len = match b1 & 0x7f {
            126 => u64::from(u16::from_be_bytes([self.head[2], self.head[3]])),
            127 => {
                let bytes: [u8; 8] = self.head[2..10].try_into().expect("eight bytes");
                let len = u64::from_be_bytes(bytes);
                if len >> 63 != 0 {
                    return Err(Violation::protocol("frame length with its top bit set"));
                }
                len
            }
            len => u64::from(len),
        };
        if opcode.is_control() {
            if !fin || len > 125 {
                return Err(Violation::protocol("fragmented or long control frame"));
            }
            if opcode == Opcode::Close && len == 1 {
                return Err(Violation::protocol("close frame of one byte"));
            }
        }
        let starts_message = matches!(opcode, Opcode::Text | Opcode::Binary);
        match (opcode, self.in_message) {
            (Opcode::Continuation, false) => {
                return Err(Violation::protocol("continuation outside a message"));
            }
            (Opcode::Text | Opcode::Binary, true) => {
                return Err(Violation::protocol("new message inside a fragmented one"));
            }
            _ => {}
        }
        if !opcode.is_control() {
            self.message_bytes = if starts_message {
                0
            } else {
                self.message_bytes
            };
            self.message_bytes = self.message_bytes.saturating_add(len);
            if self.max_message > 0 && self.message_bytes > self.max_message {
                return Err(Violation {
                    code: code::TOO_BIG,
                    reason: "message too big",
                });
            }
            self.in_message = !fin;
        }
        let first_close = opcode == Opcode::Close && self.close_code.is_none();
        self.close = first_close.then_some([0; 2]);
        if first_close && len == 0 {
            self.close_code = Some(1005);
        }
        self.left = len;
        self.passed = 0;
        Ok(Frame {
            opcode,
            len,
            starts_message,
        })
    }

    /// Reads the close frame's status code from `bytes`, the next of its payload.
    fn read_code(&mut self, bytes: &[u8]) {
        let Some(code) = &mut self.close else {
            return;
        };
        let end = usize::from(self.announced);
        for (i, &byte) in bytes.iter().enumerate() {
            let at = self.passed as usize + i;
            if at >= 2 {
                break;
            }
            code[at] = match self.sender {
                // A client's key is the header's last four bytes.
                Sender::Client => byte ^ self.head[end - 4 + at],
                Sender::Server => byte,
            };
            if at == 1 {
                self.close_code = Some(u16::from_be_bytes(*code));
            }
        }
    }
}

/// How long a header is whose second byte is `b1` (mask bit and length).
fn header_len(b1: u8) -> usize {
    let extended = match b1 & 0x7f {
        126 => 2,
        127 => 8,
        _ => 0,
    };
    2 + extended + if b1 & 0x80 != 0 { 4 } else { 0 }
}

/// A close frame with `code` and `reason` as sluice sends it: to a client
/// unmasked, to an upstream (sluice is its client) masked with `mask`.
pub(crate) fn close_frame(code: u16, reason: &str, mask: Option<[u8; 4]>) -> Vec<u8> {
    let reason = &reason.as_bytes()[..reason.len().min(123)];
    let mut payload = Vec::with_capacity(2 + reason.len());
    payload.extend_from_slice(&code.to_be_bytes());
    payload.extend_from_slice(reason);
    let mut frame = vec![0x88, payload.len() as u8];
    if let Some(mask) = mask {
        frame[1] |= 0x80;
        frame.extend_from_slice(&mask);
        for (i, byte) in payload.iter_mut().enumerate() {
            *byte ^= mask[i % 4];
        }
    }
    frame.extend_from_slice(&payload);
    frame
}

#[cfg(test)]
mod tests;
