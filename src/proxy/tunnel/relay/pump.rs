//! One direction of a joined socket ([`Pump`]): it reads into a buffer kept from
//! message to message and shed when the socket is idle, hands frame headers to [`Frames`], asks the message
//! [`Gate`] before a client message's first frame goes on, counts control frames,
//! and writes headers and payloads on, never more than one buffer ahead of the
//! writer.
//!
//! It does not decide when the socket ends or send close frames: the relay does.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::time::Instant;

use super::{Admit, Gate, Verdict};
use crate::http::upgrade::Stream;
use crate::proxy::tunnel::frames::{Event, Frames, Sender, Violation};

/// Bytes one direction reads at a time.
const BUFFER: usize = 8 * 1024;
/// Control frames one client may send in a second; more close its socket (1008).
const MAX_CONTROL_PER_SECOND: u32 = 100;

/// Why a direction cannot go on.
pub(super) enum Broke {
    Violation(Violation),
    /// A message refused by the limit; retry after this many seconds.
    Limited(u64),
    /// A message the limit could not decide.
    Undecided,
    ControlFlood,
    /// Reading or writing failed.
    Failed,
}

/// Where a direction is.
pub(super) enum Flow {
    /// Its reader ended and everything read went on; its writer is shut down.
    Done,
    Broke(Broke),
}

/// One direction of the socket.
pub(super) struct Pump {
    pub(super) frames: Frames,
    /// The buffer, zeroed when taken; no allocation before the first bytes or
    /// after [`Pump::shed`].
    buf: Vec<u8>,
    /// Bytes of `buf` read, and not yet handled from `at`.
    filled: usize,
    at: usize,
    /// What is being written.
    out: Out,
    /// Decides on each message's first frame (the client's direction, with a
    /// message limit).
    pub(super) gate: Option<Box<dyn Gate>>,
    /// The first frame of a message waiting for the gate.
    asking: Option<Pin<Box<dyn Future<Output = Verdict> + Send>>>,
    /// The frame last announced has not been written (it waits for the gate, or
    /// was refused): the writer is still between frames.
    held: bool,
    /// The header announced last came whole in the buffer, just before `at`: it
    /// goes out from there, with the payload after it, in one write.
    head_in_buf: bool,
    /// Bytes read so far (activity).
    pub(super) read: u64,
    /// Bytes written on.
    pub(super) bytes: u64,
    pub(super) messages: u64,
    /// Control frames in the current second, and when it began.
    controls: (u32, Option<Instant>),
    /// The reader ended.
    eof: bool,
}

/// What a pump writes next.
enum Out {
    Nothing,
    /// The header [`Frames`] announced, from this byte of it.
    Header(usize),
    /// The buffer's bytes up to this index.
    Payload(usize),
    /// Shutting the writer down after the reader ended.
    Shutdown,
    Done,
}

impl Pump {
    pub(super) fn new(frames: Frames) -> Pump {
        Pump {
            frames,
            buf: Vec::new(),
            filled: 0,
            at: 0,
            out: Out::Nothing,
            gate: None,
            asking: None,
            held: false,
            head_in_buf: false,
            read: 0,
            bytes: 0,
            messages: 0,
            controls: (0, None),
            eof: false,
        }
    }

    /// Bytes read before the relay began, handled first.
    pub(super) fn preload(&mut self, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.buf = bytes.to_vec();
            self.filled = bytes.len();
        }
    }

    /// Whether the pump holds a buffer.
    pub(super) fn holds(&self) -> bool {
        self.buf.capacity() > 0
    }

    /// Gives the buffer back if none of its bytes are still to be handled or
    /// written: an idle socket holds none.
    pub(super) fn shed(&mut self) {
        if self.filled == 0 {
            self.buf = Vec::new();
        }
    }

    /// Whether the writer is between two frames.
    pub(super) fn at_boundary(&self) -> bool {
        // A header read only in part has not been written either.
        matches!(self.out, Out::Nothing) && (self.held || !self.frames.in_payload())
    }

    /// Passes the rest of the frame being written, if one is; ready with whether
    /// the writer is between frames now (false: a side ended or failed first).
    pub(super) fn poll_finish_frame(
        &mut self,
        cx: &mut Context<'_>,
        from: &mut dyn Stream,
        to: &mut dyn Stream,
    ) -> Poll<bool> {
        loop {
            match ready!(self.poll_write(cx, to)) {
                Ok(false) => {}
                Ok(true) | Err(_) => return Poll::Ready(false),
            }
            if self.at_boundary() {
                return Poll::Ready(true);
            }
            if self.at < self.filled {
                // Inside a payload: only payload comes next.
                if self.handle().is_err() {
                    return Poll::Ready(false);
                }
                continue;
            }
            if self.eof || ready!(self.poll_read(cx, from)).is_err() {
                return Poll::Ready(false);
            }
        }
    }

    /// Writes the frame header announced last.
    ///
    /// A header that came whole in the buffer is written from there together with
    /// the payload that follows it in the buffer: one write a frame, not two.
    fn write_header(&mut self) {
        self.held = false;
        if !self.head_in_buf {
            self.out = Out::Header(0);
            return;
        }
        let mut end = self.at;
        // (Only the payload: with none left, `next` would read the next header.)
        if self.at < self.filled
            && self.frames.in_payload()
            && let Ok(Event::Payload(n)) = self.frames.next(&self.buf[self.at..self.filled])
        {
            end += n;
        }
        self.at -= self.frames.header().len();
        self.out = Out::Payload(end);
    }

    /// Moves bytes from `from` to `to` as far as they go.
    pub(super) fn poll(
        &mut self,
        cx: &mut Context<'_>,
        from: &mut dyn Stream,
        to: &mut dyn Stream,
    ) -> Poll<Flow> {
        loop {
            match ready!(self.poll_write(cx, to)) {
                Ok(true) => return Poll::Ready(Flow::Done),
                Ok(false) => {}
                Err(_) => return Poll::Ready(Flow::Broke(Broke::Failed)),
            }
            if let Some(asking) = &mut self.asking {
                let verdict = ready!(asking.as_mut().poll(cx));
                self.asking = None;
                if let Err(broke) = self.decided(verdict) {
                    return Poll::Ready(Flow::Broke(broke));
                }
                continue;
            }
            if self.at < self.filled {
                if let Err(broke) = self.handle() {
                    return Poll::Ready(Flow::Broke(broke));
                }
                continue;
            }
            if self.eof {
                self.out = Out::Shutdown;
                continue;
            }
            match self.poll_read(cx, from) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(_)) => return Poll::Ready(Flow::Broke(Broke::Failed)),
                // The buffer stays for the next message; the relay sheds it
                // once the socket is idle ([`Pump::shed`]).
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// Reads into the buffer, whose bytes were all handled; ready with `eof` set at
    /// the end.
    ///
    /// The buffer is zeroed once, when taken, not for each read (zeroing 8 KiB for
    /// each read of a 38-byte message was 80 % of the relay's instructions), and
    /// read into with the stream's own `poll_read` (tokio's `read_buf` future, into
    /// spare capacity, is a layer more, and inlined or not as code lands in codegen
    /// units).
    fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
        from: &mut dyn Stream,
    ) -> Poll<std::io::Result<()>> {
        self.filled = 0;
        self.at = 0;
        if self.buf.len() < BUFFER {
            self.buf = vec![0; BUFFER];
        }
        let mut read = tokio::io::ReadBuf::new(&mut self.buf);
        ready!(Pin::new(&mut *from).poll_read(cx, &mut read))?;
        let n = read.filled().len();
        self.filled = n;
        self.read += n as u64;
        self.eof = n == 0;
        Poll::Ready(Ok(()))
    }

    /// Hands the unhandled bytes to the frame reader: payload to write, or a header
    /// to decide on.
    fn handle(&mut self) -> Result<(), Broke> {
        let event = (self.frames)
            .next(&self.buf[self.at..self.filled])
            .map_err(Broke::Violation)?;
        match event {
            Event::Payload(n) => self.out = Out::Payload(self.at + n),
            Event::Partial => self.at = self.filled,
            Event::Frame { consumed, frame } => {
                self.at += consumed;
                self.held = true;
                self.head_in_buf = consumed == self.frames.header().len();
                if frame.opcode.is_control() {
                    self.count_control()?;
                }
                match frame.starts_message {
                    true => self.ask_gate()?,
                    false => self.write_header(),
                }
            }
        }
        Ok(())
    }

    /// Asks the gate about the message whose first frame is held: its verdict at
    /// once, or an answer to wait for.
    fn ask_gate(&mut self) -> Result<(), Broke> {
        match self.gate.as_mut().map(|gate| gate.admit()) {
            Some(Admit::Later(answer)) => self.asking = Some(answer),
            Some(Admit::Now(verdict)) => self.decided(verdict)?,
            None => self.decided(Verdict::Pass)?,
        }
        Ok(())
    }

    /// Acts on the gate's verdict on the message whose first frame is held.
    fn decided(&mut self, verdict: Verdict) -> Result<(), Broke> {
        match verdict {
            Verdict::Pass => {
                self.messages += 1;
                self.write_header();
                Ok(())
            }
            Verdict::Limited(retry_after) => Err(Broke::Limited(retry_after)),
            Verdict::Unavailable => Err(Broke::Undecided),
        }
    }

    /// Counts a client's control frame; more than [`MAX_CONTROL_PER_SECOND`] in a
    /// second is a flood. (Only the client's pump has a gate or a limit to keep; an
    /// upstream's control frames are counted the same way, harmlessly.)
    fn count_control(&mut self) -> Result<(), Broke> {
        let now = Instant::now();
        let (count, since) = &mut self.controls;
        match since {
            Some(start) if now.duration_since(*start) < Duration::from_secs(1) => *count += 1,
            _ => (*count, *since) = (1, Some(now)),
        }
        match *count > MAX_CONTROL_PER_SECOND && self.frames.sender() == Sender::Client {
            true => Err(Broke::ControlFlood),
            false => Ok(()),
        }
    }

    /// Writes what is due; ready with `true` once the writer is shut down after the
    /// reader's end, `false` when nothing is left to write.
    fn poll_write(
        &mut self,
        cx: &mut Context<'_>,
        to: &mut dyn Stream,
    ) -> Poll<std::io::Result<bool>> {
        loop {
            match self.out {
                Out::Nothing => return Poll::Ready(Ok(false)),
                Out::Done => return Poll::Ready(Ok(true)),
                Out::Header(from) => {
                    let header = &self.frames.header()[from..];
                    let n = ready!(Pin::new(&mut *to).poll_write(cx, header))?;
                    if n == 0 {
                        return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                    }
                    self.bytes += n as u64;
                    self.out = match from + n == self.frames.header().len() {
                        true => Out::Nothing,
                        false => Out::Header(from + n),
                    };
                }
                Out::Payload(end) => {
                    let n = ready!(Pin::new(&mut *to).poll_write(cx, &self.buf[self.at..end]))?;
                    if n == 0 {
                        return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                    }
                    self.bytes += n as u64;
                    self.at += n;
                    if self.at == end {
                        self.out = Out::Nothing;
                    }
                }
                Out::Shutdown => {
                    ready!(Pin::new(&mut *to).poll_shutdown(cx))?;
                    self.out = Out::Done;
                }
            }
        }
    }
}
