//! The joined socket: bytes pass both ways as they come, frame headers read on the
//! way ([`Frames`]), until either side closes, a rule closes it, no byte moves for
//! `tunnel_idle_timeout`, or the gateway stops.
//!
//! Each direction is a [`Pump`]: it reads into a buffer it holds only while bytes
//! are in flight (an idle socket holds none), hands headers to [`Frames`] and writes
//! headers and payloads on as they are read, never more than one buffer ahead of the
//! writer. A client message's first frame waits for the message [`Gate`] before any
//! of its bytes go on. When sluice closes a socket itself, each side gets a close
//! frame if its stream is between two frames (else its connection just ends).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadBuf};
use tokio::time::Instant;

use super::frames::{Event, Extensions, Frames, Sender, Violation, close_frame, code};
use crate::http::upgrade::Stream;

/// Bytes one direction reads at a time.
const BUFFER: usize = 8 * 1024;
/// Control frames one client may send in a second; more close its socket (1008).
const MAX_CONTROL_PER_SECOND: u32 = 100;
/// How long a close frame sluice sends may take to go out.
const CLOSE_WRITE: Duration = Duration::from_secs(1);

/// What a message limit answers for a client's next message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The message goes upstream.
    Pass,
    /// Over the limit: the socket closes (1008); one would be admitted after this
    /// many seconds.
    Limited(u64),
    /// The limit cannot be decided (its shared store is down and `on_error =
    /// "deny"`): the socket closes (1013, try again later).
    Unavailable,
}

/// The answer a [`Gate`] has to wait for.
pub(crate) type Admit = Pin<Box<dyn Future<Output = Verdict> + Send>>;

/// Sees each message a client sends, on its first frame, before any of its bytes go
/// upstream: a message limit decides there, and every socket counts there.
pub(crate) trait Gate: Send {
    /// The answer for one more message now: `None` passes it at once (nothing
    /// limits it), else the answer to wait for.
    fn admit(&mut self) -> Option<Admit>;
}

/// What a socket's relay is set up with.
pub(crate) struct Settings {
    /// `tunnel_idle_timeout`: no byte either way for this long closes the socket.
    pub idle: Duration,
    /// `max_body_bytes`: the largest frame or fragmented message (0: any).
    pub max_message: u64,
    /// What the upstream's `101` negotiated.
    pub extensions: Extensions,
}

/// How a socket ended, for its log line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Summary {
    /// Bytes the client sent on (frames as they came).
    pub bytes_up: u64,
    /// Bytes the upstream sent on.
    pub bytes_down: u64,
    /// Messages the client sent on (a fragmented one counts once).
    pub messages_up: u64,
    /// Messages the upstream sent on.
    pub messages_down: u64,
    /// The close code: the first close frame either side sent, or sluice's own;
    /// 1006 when the socket ended without one.
    pub close_code: u16,
    /// Messages refused by the message limit (at most one: it closes the socket).
    pub limited: u64,
}

/// Relays between `client` and `upstream` until the socket ends, or `stop`
/// completes (the gateway stopping: 1001 to both sides); `read_ahead` are bytes the
/// client sent before the relay began. Client messages pass `gate` first, if any:
/// one it refuses is not forwarded, and the client's socket is closed with 1008
/// (`rate limited; retry after N s`) or 1013, the upstream's with 1001.
pub(crate) async fn relay(
    mut client: Box<dyn Stream>,
    read_ahead: bytes::Bytes,
    mut upstream: Box<dyn Stream>,
    settings: Settings,
    gate: Option<Box<dyn Gate>>,
    stop: impl Future<Output = ()>,
) -> Summary {
    let mut up = Pump::new(Frames::new(
        Sender::Client,
        settings.extensions,
        settings.max_message,
    ));
    up.preload(&read_ahead);
    up.gate = gate;
    let mut down = Pump::new(Frames::new(Sender::Server, settings.extensions, 0));
    let mut last = Instant::now();
    let timer = tokio::time::sleep(settings.idle);
    tokio::pin!(timer, stop);
    let ending = std::future::poll_fn(|cx| {
        let (up_read, down_read) = (up.read, down.read);
        let upward = up.poll(cx, &mut *client, &mut *upstream);
        let downward = down.poll(cx, &mut *upstream, &mut *client);
        if up.read > up_read || down.read > down_read {
            last = Instant::now();
        }
        match (upward, downward) {
            (Poll::Ready(Flow::Broke(why)), _) => return Poll::Ready(Ending::Client(why)),
            (_, Poll::Ready(Flow::Broke(why))) => return Poll::Ready(Ending::Upstream(why)),
            // One side closed its connection (after the close handshake, or
            // without one): nothing the other sends can reach it any more.
            (Poll::Ready(Flow::Done), _) | (_, Poll::Ready(Flow::Done)) => {
                return Poll::Ready(Ending::Closed);
            }
            _ => {}
        }
        if stop.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Ending::Stopped);
        }
        while timer.as_mut().poll(cx).is_ready() {
            let due = last + settings.idle;
            if Instant::now() >= due {
                return Poll::Ready(Ending::Idle);
            }
            timer.as_mut().reset(due);
        }
        Poll::Pending
    })
    .await;
    let own = match ending {
        Ending::Closed => None,
        Ending::Client(Broke::Violation(v)) => {
            Some((v.code, v.reason.to_string(), Some(code::GOING_AWAY)))
        }
        Ending::Client(Broke::Limited(retry_after)) => {
            let reason = format!("rate limited; retry after {retry_after} s");
            Some((code::POLICY_VIOLATION, reason, Some(code::GOING_AWAY)))
        }
        Ending::Client(Broke::Undecided) => {
            let reason = "limit store unavailable".to_string();
            Some((code::TRY_AGAIN_LATER, reason, Some(code::GOING_AWAY)))
        }
        Ending::Client(Broke::ControlFlood) => {
            let reason = "too many control frames".to_string();
            Some((code::POLICY_VIOLATION, reason, Some(code::GOING_AWAY)))
        }
        // The upstream broke the protocol: its connection just ends.
        Ending::Upstream(Broke::Violation(_)) => Some((
            code::BAD_GATEWAY,
            "upstream protocol error".to_string(),
            None,
        )),
        Ending::Idle => Some((code::GOING_AWAY, "idle".to_string(), Some(code::GOING_AWAY))),
        Ending::Stopped => Some((
            code::GOING_AWAY,
            "gateway stopping".to_string(),
            Some(code::GOING_AWAY),
        )),
        Ending::Client(_) | Ending::Upstream(_) => None,
    };
    let mut summary = Summary {
        bytes_up: up.bytes,
        bytes_down: down.bytes,
        messages_up: up.messages,
        messages_down: down.messages,
        close_code: code::ABNORMAL,
        limited: u64::from(matches!(
            ending,
            Ending::Client(Broke::Limited(_) | Broke::Undecided)
        )),
    };
    let seen = up.frames.close_code().or(down.frames.close_code());
    if let Some((to_client, reason, to_upstream)) = own {
        summary.close_code = seen.unwrap_or(to_client);
        // A frame half sent is finished first (for a moment at most): a close frame
        // can only go between two.
        let finishing = std::future::poll_fn(|cx| {
            let down_done = down.poll_finish_frame(cx, &mut *upstream, &mut *client);
            let up_done = match to_upstream {
                Some(_) => up.poll_finish_frame(cx, &mut *client, &mut *upstream),
                None => Poll::Ready(true),
            };
            match (down_done, up_done) {
                (Poll::Ready(_), Poll::Ready(_)) => Poll::Ready(()),
                _ => Poll::Pending,
            }
        });
        let _ = tokio::time::timeout(CLOSE_WRITE, finishing).await;
        if down.at_boundary() {
            let frame = close_frame(to_client, &reason, None);
            send_close(&mut *client, &frame).await;
        }
        if let Some(to_upstream) = to_upstream.filter(|_| up.at_boundary()) {
            let frame = close_frame(to_upstream, "", Some(fastrand::u32(..).to_be_bytes()));
            send_close(&mut *upstream, &frame).await;
        }
    } else if let Some(seen) = seen {
        summary.close_code = seen;
    }
    summary
}

/// Writes a close frame sluice makes and ends the stream, then reads what the peer
/// still sends (its own close) until it closes too, all within [`CLOSE_WRITE`]: a
/// stream dropped with unread bytes would be reset, and the peer might lose the
/// close frame.
async fn send_close(stream: &mut dyn Stream, frame: &[u8]) {
    let _ = tokio::time::timeout(CLOSE_WRITE, async {
        stream.write_all(frame).await?;
        stream.shutdown().await?;
        let mut rest = [0; 512];
        while stream.read(&mut rest).await? > 0 {}
        Ok::<(), std::io::Error>(())
    })
    .await;
}

/// Why the relay loop ended.
enum Ending {
    /// A side closed its connection.
    Closed,
    /// The client's stream broke a rule, or failed.
    Client(Broke),
    /// The upstream's stream broke the protocol, or failed.
    Upstream(Broke),
    /// No byte moved for the idle timeout.
    Idle,
    /// The gateway stopped.
    Stopped,
}

/// Why a direction cannot go on.
enum Broke {
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
enum Flow {
    /// Its reader ended and everything read went on; its writer is shut down.
    Done,
    Broke(Broke),
}

/// One direction of the socket.
struct Pump {
    frames: Frames,
    /// Bytes read and not yet handled; empty (no allocation) while nothing is.
    buf: Vec<u8>,
    filled: usize,
    at: usize,
    /// What is being written.
    out: Out,
    /// Decides on each message's first frame (the client's direction, with a
    /// message limit).
    gate: Option<Box<dyn Gate>>,
    /// The first frame of a message waiting for the gate.
    asking: Option<Admit>,
    /// The frame last announced has not been written (it waits for the gate, or
    /// was refused): the writer is still between frames.
    held: bool,
    /// The header announced last came whole in the buffer, just before `at`: it
    /// goes out from there, with the payload after it, in one write.
    head_in_buf: bool,
    /// Bytes read so far (activity).
    read: u64,
    /// Bytes written on.
    bytes: u64,
    messages: u64,
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
    fn new(frames: Frames) -> Pump {
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
    fn preload(&mut self, bytes: &[u8]) {
        if !bytes.is_empty() {
            self.buf = bytes.to_vec();
            self.filled = bytes.len();
        }
    }

    /// Whether the writer is between two frames.
    fn at_boundary(&self) -> bool {
        // A header read only in part has not been written either.
        matches!(self.out, Out::Nothing) && (self.held || !self.frames.in_payload())
    }

    /// Passes the rest of the frame being written, if one is; ready with whether
    /// the writer is between frames now (false: a side ended or failed first).
    fn poll_finish_frame(
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
    fn poll(
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
                Poll::Pending => {
                    // Idle: the buffer goes until bytes come again.
                    self.buf = Vec::new();
                    return Poll::Pending;
                }
            }
        }
    }

    /// Reads into the buffer, which is empty; ready with `eof` set at the end.
    fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
        from: &mut dyn Stream,
    ) -> Poll<std::io::Result<()>> {
        if self.buf.len() < BUFFER {
            self.buf = vec![0; BUFFER];
        }
        let mut read = ReadBuf::new(&mut self.buf);
        ready!(Pin::new(&mut *from).poll_read(cx, &mut read))?;
        let n = read.filled().len();
        (self.at, self.filled) = (0, n);
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
                if !frame.starts_message {
                    self.write_header();
                } else if let Some(asking) = self.gate.as_mut().and_then(|g| g.admit()) {
                    self.asking = Some(asking);
                } else {
                    self.decided(Verdict::Pass)?;
                }
            }
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
