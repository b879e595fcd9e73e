//! The joined socket: bytes pass both ways as they come, frame headers read on the
//! way ([`Frames`]), until either side closes, a rule closes it, no byte moves for
//! `tunnel_idle_timeout`, or the gateway stops.
//!
//! Each direction is a [`Pump`]: it reads into a buffer it keeps while the socket
//! is busy (an idle one sheds it after [`SHED`], so an idle socket holds none), hands headers to [`Frames`] and writes
//! headers and payloads on as they are read, never more than one buffer ahead of the
//! writer. A client message's first frame waits for the message [`Gate`] before any
//! of its bytes go on. A turn of the relay polls only the directions (and ends:
//! the stop signal, the idle timer) that woke it ([`Wakes`]). When sluice closes a
//! socket itself, each side gets a close frame if its stream is between two frames
//! (else its connection just ends).

mod pump;
mod wakes;

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use super::frames::{Extensions, Frames, Sender, close_frame, code};
use crate::http::upgrade::Stream;
use pump::{Broke, Flow, Pump};
use wakes::{Part, Wakes};

/// How long a socket without a byte either way keeps its buffers: they are kept
/// from message to message (taking and giving back 8 KiB a message was about 700
/// instructions), and shed by the idle timer's next turn after this.
const SHED: Duration = Duration::from_secs(1);
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

/// A [`Gate`]'s answer for one more message.
pub(crate) enum Admit {
    /// Decided at once: nothing limits it, or its limit's store answers without
    /// waiting (the memory store).
    Now(Verdict),
    /// The answer to wait for (a shared store's).
    Later(Pin<Box<dyn Future<Output = Verdict> + Send>>),
}

/// Sees each message a client sends, on its first frame, before any of its bytes go
/// upstream: a message limit decides there, and every socket counts there.
pub(crate) trait Gate: Send {
    /// The answer for one more message now.
    fn admit(&mut self) -> Admit;
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
/// client and the upstream sent before the relay began. Client messages pass `gate` first, if any:
/// one it refuses is not forwarded, and the client's socket is closed with 1008
/// (`rate limited; retry after N s`) or 1013, the upstream's with 1001.
pub(crate) async fn relay(
    mut client: Box<dyn Stream>,
    mut upstream: Box<dyn Stream>,
    read_ahead: (bytes::Bytes, bytes::Bytes),
    settings: Settings,
    gate: Option<Box<dyn Gate>>,
    stop: impl Future<Output = ()>,
) -> Summary {
    let mut up = Pump::new(Frames::new(
        Sender::Client,
        settings.extensions,
        settings.max_message,
    ));
    up.preload(&read_ahead.0);
    up.gate = gate;
    let mut down = Pump::new(Frames::new(Sender::Server, settings.extensions, 0));
    down.preload(&read_ahead.1);
    let ending = run(
        (&mut up, &mut down),
        (&mut *client, &mut *upstream),
        settings.idle,
        stop,
    )
    .await;
    let own = own_close(&ending);
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
        close(
            &mut up,
            &mut down,
            &mut *client,
            &mut *upstream,
            (to_client, &reason, to_upstream),
        )
        .await;
    } else if let Some(seen) = seen {
        summary.close_code = seen;
    }
    summary
}

/// Passes bytes both ways until the socket ends: a side closes or breaks a rule, no
/// byte moves for `idle`, or `stop` completes. A turn polls only the parts that woke
/// the task ([`Wakes`]): a message one way wakes one direction.
async fn run(
    (up, down): (&mut Pump, &mut Pump),
    (client, upstream): (&mut dyn Stream, &mut dyn Stream),
    idle: Duration,
    stop: impl Future<Output = ()>,
) -> Ending {
    let mut last = Instant::now();
    let timer = tokio::time::sleep(SHED.min(idle));
    let wakes = Wakes::new();
    tokio::pin!(timer, stop);
    std::future::poll_fn(|cx| {
        let woken = wakes.turn(cx);
        let (up_read, down_read) = (up.read, down.read);
        let upward = match woken.has(Part::Up) {
            true => up.poll(&mut wakes.context(Part::Up), &mut *client, &mut *upstream),
            false => Poll::Pending,
        };
        let downward = match woken.has(Part::Down) {
            true => down.poll(&mut wakes.context(Part::Down), &mut *upstream, &mut *client),
            false => Poll::Pending,
        };
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
        if !woken.has(Part::Ends) {
            return Poll::Pending;
        }
        let cx = &mut wakes.context(Part::Ends);
        if stop.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Ending::Stopped);
        }
        while timer.as_mut().poll(cx).is_ready() {
            match idle_turn(up, down, last, idle) {
                Some(due) => timer.as_mut().reset(due),
                None => return Poll::Ready(Ending::Idle),
            }
        }
        Poll::Pending
    })
    .await
}

/// A turn of the idle timer, `last` being when a byte last moved: `None` once none
/// has for `idle`, else when the timer turns next. The pumps' buffers are shed once
/// none has for [`SHED`] (one still holding bytes to write is kept until they go).
fn idle_turn(up: &mut Pump, down: &mut Pump, last: Instant, idle: Duration) -> Option<Instant> {
    let now = Instant::now();
    if now >= last + idle {
        return None;
    }
    if now >= last + SHED {
        up.shed();
        down.shed();
    }
    Some(match (up.holds() || down.holds()) && now < last + SHED {
        true => last + SHED,
        false => last + idle,
    })
}

/// The close sluice itself sends when the relay ends as `ending`: the code and reason
/// for the client, and the code for the upstream (`None`: its connection just ends).
/// `None` when the socket ended by itself.
fn own_close(ending: &Ending) -> Option<(u16, String, Option<u16>)> {
    match ending {
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
    }
}

/// Closes both sides with sluice's own close frames: each waits for a frame half
/// sent on its stream to finish (for a moment at most), as a close frame can only go
/// between two. `to_upstream` is `None` when the upstream's connection just ends.
async fn close(
    up: &mut Pump,
    down: &mut Pump,
    client: &mut dyn Stream,
    upstream: &mut dyn Stream,
    (to_client, reason, to_upstream): (u16, &str, Option<u16>),
) {
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
        let frame = close_frame(to_client, reason, None);
        send_close(&mut *client, &frame).await;
    }
    if let Some(to_upstream) = to_upstream.filter(|_| up.at_boundary()) {
        let frame = close_frame(to_upstream, "", Some(fastrand::u32(..).to_be_bytes()));
        send_close(&mut *upstream, &frame).await;
    }
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
