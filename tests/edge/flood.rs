//! HTTP/2 flood offenders remembered across connections: a client that resets every
//! stream right after sending it, reconnecting whenever it is cut, gets few of its
//! streams to the upstream, is told GOAWAY(ENHANCE_YOUR_CALM), and its address is
//! refused new connections for a while, while a client on another address is served
//! throughout. The flooder speaks raw frames, as an attacker's tool would.

use crate::support;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use support::{Req, Toml, UpstreamOptions, connect, route, upstream_with};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const GOAWAY: u8 = 0x7;
const ENHANCE_YOUR_CALM: u32 = 0xb;

/// One HTTP/2 frame: length, type, flags, stream id, payload.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// HEADERS (END_STREAM | END_HEADERS) for `GET /flood/N` on `stream`: HPACK static
/// entries and literals without indexing, so every block stands alone.
fn get(stream: u32) -> Vec<u8> {
    get_for(stream, None)
}

/// [`get`], with `X-Forwarded-For: client` when a client is given.
fn get_for(stream: u32, client: Option<&str>) -> Vec<u8> {
    let path = format!("/flood/{stream}");
    let mut block = vec![0x82, 0x86, 0x04, path.len() as u8];
    block.extend_from_slice(path.as_bytes());
    block.extend_from_slice(&[0x01, 0x01, b'a']);
    if let Some(client) = client {
        block.extend_from_slice(&[0x00, 15]);
        block.extend_from_slice(b"x-forwarded-for");
        block.push(client.len() as u8);
        block.extend_from_slice(client.as_bytes());
    }
    frame(0x1, 0x5, stream, &block)
}

/// RST_STREAM(CANCEL) on `stream`.
fn reset(stream: u32) -> Vec<u8> {
    frame(0x3, 0, stream, &8u32.to_be_bytes())
}

/// What the flooder saw.
#[derive(Default)]
struct Flood {
    /// Streams it meant to open: one every `EVERY` for the whole attack.
    planned: AtomicUsize,
    /// HEADERS written on a connection the gateway had answered with its SETTINGS.
    sent: AtomicUsize,
    connections: AtomicUsize,
    /// Connections closed without a byte from the gateway (refused at accept).
    refused: AtomicUsize,
    /// GOAWAY frames received with ENHANCE_YOUR_CALM.
    calm: AtomicUsize,
}

/// A stream every 500 us: 2 000 a second.
const EVERY: Duration = Duration::from_micros(500);
/// How long after its HEADERS each stream is reset.
const RESET_AFTER: Duration = Duration::from_millis(5);

/// An upstream that answers after `delay_ms`, and a gateway with `settings` (TOML
/// lines) routing everything to it.
async fn slow_upstream_behind(delay_ms: u64, settings: &str) -> (support::Upstream, support::Live) {
    let up = upstream_with(UpstreamOptions {
        delay: Duration::from_millis(delay_ms),
        ..Default::default()
    })
    .await;
    let toml = Toml::new()
        .raw(settings)
        .upstream("up", &[up.url()])
        .route(route("all", "/").upstream("up"))
        .build();
    let gw = support::live(&toml).await;
    (up, gw)
}

/// Reads frames until the connection ends: counts GOAWAYs with ENHANCE_YOUR_CALM,
/// asks for SETTINGS acks, and notes in `answered` whether the gateway sent anything
/// at all (a connection refused at accept is closed without a byte).
async fn read_frames(
    mut read: tokio::net::tcp::OwnedReadHalf,
    flood: Arc<Flood>,
    ack: Arc<AtomicBool>,
    answered: Arc<AtomicBool>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        let n = match read.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        answered.store(true, Ordering::Relaxed);
        buf.extend_from_slice(&chunk[..n]);
        whole_frames(&mut buf, |kind, flags, _, payload| {
            if kind == GOAWAY
                && payload.len() >= 8
                && payload[4..8] == ENHANCE_YOUR_CALM.to_be_bytes()
            {
                flood.calm.fetch_add(1, Ordering::Relaxed);
            }
            if kind == 0x4 && flags & 0x1 == 0 {
                ack.store(true, Ordering::Relaxed);
            }
        });
    }
}

/// Takes every whole frame off the front of `buf` and hands it to `each` as kind,
/// flags, stream and payload; a partial frame stays for the next read.
fn whole_frames(buf: &mut Vec<u8>, mut each: impl FnMut(u8, u8, u32, &[u8])) {
    let mut at = 0;
    while buf.len() - at >= 9 {
        let head = &buf[at..at + 9];
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        if buf.len() - at < 9 + len {
            break;
        }
        let stream = u32::from_be_bytes(head[5..9].try_into().unwrap()) & 0x7fff_ffff;
        each(head[3], head[4], stream, &buf[at + 9..at + 9 + len]);
        at += 9 + len;
    }
    buf.drain(..at);
}

/// From `from`, for `length`: connects, opens a stream every [`EVERY`] and resets
/// each [`RESET_AFTER`] after its HEADERS; reconnects whenever the gateway closes
/// the connection.
async fn flooder(addr: SocketAddr, from: IpAddr, length: Duration, flood: Arc<Flood>) {
    let started = Instant::now();
    let end = started + length;
    while Instant::now() < end {
        let tcp = connect(addr, Some(from)).await;
        flood.connections.fetch_add(1, Ordering::Relaxed);
        let (read, mut write) = tcp.into_split();
        let (ack, answered) = (Arc::default(), Arc::new(AtomicBool::new(false)));
        let reader = tokio::spawn(read_frames(
            read,
            flood.clone(),
            Arc::clone(&ack),
            answered.clone(),
        ));
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(0x4, 0, 0, &[]));
        // A large connection window: responses never stall on flow control.
        hello.extend(frame(0x8, 0, 0, &(1u32 << 30).to_be_bytes()));
        let mut open = write.write_all(&hello).await.is_ok();
        let mut pending: std::collections::VecDeque<(u32, Instant)> = Default::default();
        let mut stream = 1u32;
        let mut tick = tokio::time::interval(EVERY);
        while open && !reader.is_finished() && Instant::now() < end {
            tick.tick().await;
            let mut out = Vec::new();
            if ack.swap(false, Ordering::Relaxed) {
                out.extend(frame(0x4, 0x1, 0, &[]));
            }
            let now = Instant::now();
            while pending
                .front()
                .is_some_and(|(_, at)| now >= *at + RESET_AFTER)
            {
                let (id, _) = pending.pop_front().unwrap();
                out.extend(reset(id));
            }
            out.extend(get(stream));
            pending.push_back((stream, now));
            open = write.write_all(&out).await.is_ok();
            if open && answered.load(Ordering::Relaxed) {
                flood.sent.fetch_add(1, Ordering::Relaxed);
            }
            stream += 2;
        }
        // Whatever the gateway answered, the connection is done with.
        drop(write);
        let _ = tokio::time::timeout(Duration::from_secs(2), reader).await;
        if !answered.load(Ordering::Relaxed) {
            flood.refused.fetch_add(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let planned = length.as_micros() / EVERY.as_micros();
    flood.planned.store(planned as usize, Ordering::Relaxed);
}

/// One client resetting each stream 5 ms after its HEADERS for 5 s, from 127.0.0.2,
/// reconnecting whenever it is cut: at most 10 % of the streams it meant to send
/// reach the upstream, it is told GOAWAY(ENHANCE_YOUR_CALM), its reconnections are
/// refused, `sluice_flood_blocked_addresses` counts it, and a client on 127.0.0.3
/// gets 200 throughout. Whichever bound trips first cuts each connection: h2's on
/// streams reset before they were handed over, or sluice's on abandoned requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnecting_rapid_reset_flooder_is_cut_off_and_blocked_others_are_served() {
    // The upstream takes 50 ms: a stream reset 5 ms in is abandoned mid-flight.
    let (up, gw) = slow_upstream_behind(50, "").await;
    let flood = Arc::new(Flood::default());
    let attack = tokio::spawn(flooder(
        gw.addr,
        "127.0.0.2".parse().unwrap(),
        Duration::from_secs(5),
        flood.clone(),
    ));
    // The good client: one request after another on fresh HTTP/2 connections, for as
    // long as the flood lasts (however many that makes on this machine).
    let mut good = Vec::new();
    let mut blocked_seen = 0.0f64;
    while good.is_empty() || !attack.is_finished() {
        let resp = Req::get("/good").h2().from("127.0.0.3").send(gw.addr).await;
        good.push(resp.status.as_u16());
        let metrics = gw.admin(Req::get("/metrics")).await.text();
        let blocked = support::metric(&metrics, "sluice_flood_blocked_addresses").unwrap();
        blocked_seen = blocked_seen.max(blocked);
    }
    attack.await.unwrap();
    // Time for a stream that slipped through to reach the upstream before it is
    // counted: an "at most" has no event to wait for.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let planned = flood.planned.load(Ordering::Relaxed);
    let sent = flood.sent.load(Ordering::Relaxed);
    let reached = up
        .seen()
        .iter()
        .filter(|s| s.target.starts_with("/flood/"))
        .count();
    eprintln!(
        "flooder: {planned} streams planned, {sent} sent on {} connections ({} refused at accept), \
         {} GOAWAY(ENHANCE_YOUR_CALM); {reached} reached the upstream; good client: {} requests",
        flood.connections.load(Ordering::Relaxed),
        flood.refused.load(Ordering::Relaxed),
        flood.calm.load(Ordering::Relaxed),
        good.len(),
    );
    assert!(planned >= 9_000, "{planned}");
    assert!(
        reached * 10 <= planned,
        "{reached} of {planned} streams reached the upstream"
    );
    // Refused at accept, most of them never even reached the gateway's HTTP/2.
    assert!(
        sent * 10 <= planned,
        "{sent} of {planned} streams were taken by the gateway"
    );
    assert!(
        flood.calm.load(Ordering::Relaxed) >= 1,
        "no GOAWAY(ENHANCE_YOUR_CALM)"
    );
    assert!(
        flood.refused.load(Ordering::Relaxed) >= 1,
        "the flooder's reconnections were all served"
    );
    assert_eq!(blocked_seen, 1.0, "sluice_flood_blocked_addresses");
    assert!(good.iter().all(|&s| s == 200), "{good:?}");
    gw.stop().await;
}

/// Reads whole frames from `read` into the channel until the connection ends.
async fn frames(
    mut read: tokio::net::tcp::OwnedReadHalf,
    out: tokio::sync::mpsc::UnboundedSender<(u8, u32, Vec<u8>)>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    while let Ok(n @ 1..) = read.read(&mut chunk).await {
        buf.extend_from_slice(&chunk[..n]);
        whole_frames(&mut buf, |kind, _, stream, payload| {
            let _ = out.send((kind, stream, payload.to_vec()));
        });
    }
}

/// The frames a raw connection receives: kind, stream, payload.
type Frames = tokio::sync::mpsc::UnboundedReceiver<(u8, u32, Vec<u8>)>;

/// From `from` (for `client`, in X-Forwarded-For, if given), opens 100 streams in
/// batches of 20 and resets each batch once the upstream has it all (so they are
/// abandoned after dispatch, and counted by the gateway, not h2); returns once the
/// gateway's own GOAWAY(ENHANCE_YOUR_CALM) came, with the connection's write half and
/// the frames still to read.
async fn flood_until_calm(
    addr: SocketAddr,
    (from, client): (&str, Option<&str>),
    up: &support::Upstream,
) -> (tokio::net::tcp::OwnedWriteHalf, Frames) {
    let tcp = connect(addr, Some(from.parse().unwrap())).await;
    let (read, mut write) = tcp.into_split();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(frames(read, tx));
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(0x4, 0, 0, &[]));
    hello.extend(frame(0x8, 0, 0, &(1u32 << 30).to_be_bytes()));
    write.write_all(&hello).await.unwrap();
    let base = up.count();
    for batch in 0..5u32 {
        let ids: Vec<u32> = (0..20).map(|i| 1 + 2 * (batch * 20 + i)).collect();
        let heads: Vec<u8> = ids.iter().flat_map(|&id| get_for(id, client)).collect();
        write.write_all(&heads).await.unwrap();
        let want = base + 20 * (batch as usize + 1);
        tokio::time::timeout(Duration::from_secs(5), async {
            while up.count() < want {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await
        .expect("the upstream did not get the batch");
        let resets: Vec<u8> = ids.iter().flat_map(|&id| reset(id)).collect();
        write.write_all(&resets).await.unwrap();
    }
    let calm = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some((kind, _, payload)) = rx.recv().await {
            if kind == GOAWAY && payload[4..8] == ENHANCE_YOUR_CALM.to_be_bytes() {
                // The gateway's own: last stream 2^31-1, no debug data.
                return payload == [0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0xb];
            }
        }
        false
    })
    .await;
    assert_eq!(calm, Ok(true), "{from}: no GOAWAY(ENHANCE_YOUR_CALM)");
    (write, rx)
}

/// Whether a new connection from `from` is closed at once without a byte.
async fn refused(addr: SocketAddr, from: &str) -> bool {
    let mut tcp = connect(addr, Some(from.parse().unwrap())).await;
    let _ = tcp.write_all(PREFACE).await;
    let mut first = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(2), tcp.read(&mut first)).await;
    // Served: the gateway's SETTINGS come back.
    matches!(read, Ok(Ok(0) | Err(_)))
}

/// A connection cut for a flood hears GOAWAY(ENHANCE_YOUR_CALM) between whole frames
/// (the reader parses every frame), and a stream the client opens after it is
/// answered 503 without reaching the upstream. The client never answers the
/// gateway's PING, so h2's graceful close stays open until the gateway drops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_opened_on_a_connection_closing_for_a_flood_get_503() {
    let (up, gw) = slow_upstream_behind(200, "").await;
    let (mut write, mut rx) = flood_until_calm(gw.addr, ("127.0.0.4", None), &up).await;
    let late = 1001;
    write.write_all(&get(late)).await.unwrap();
    let body = tokio::time::timeout(Duration::from_secs(5), async {
        let mut body = Vec::new();
        while let Some((kind, stream, payload)) = rx.recv().await {
            if kind == 0x0 && stream == late {
                body.extend_from_slice(&payload);
                if body.ends_with(b"}") {
                    break;
                }
            }
        }
        String::from_utf8_lossy(&body).into_owned()
    })
    .await
    .expect("no answer to the late stream");
    assert!(body.contains("\"status\":503"), "{body}");
    // Time for the late stream to reach the upstream, were it forwarded.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !up.targets().contains(&format!("/flood/{late}")),
        "the late stream reached the upstream"
    );
    // The gateway drops the connection (its graceful close is never acknowledged).
    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        while rx.recv().await.is_some() {}
    })
    .await;
    assert!(closed.is_ok(), "the flooding connection is still open");
    gw.stop().await;
}

/// A flood through a trusted proxy cuts that connection but never blocks the proxy's
/// address (its connections carry many clients): the forwarded client behind it gets
/// 403 for a while, the proxy's other clients 200. An `[access] exempt` address has
/// its flooding connection cut too, but is never refused new connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_the_forwarded_flooder_is_blocked_exempt_addresses_are_not() {
    let settings = "[identity]\ntrusted_proxies = [\"127.0.0.5\"]\n\
                    [access]\nexempt = [\"127.0.0.6\"]";
    let (up, gw) = slow_upstream_behind(200, settings).await;
    let flooder = Some("203.0.113.9");
    let (proxy, _) = flood_until_calm(gw.addr, ("127.0.0.5", flooder), &up).await;
    drop(proxy);
    // At once: the block lasts a second.
    let via_proxy = |path: &str, client: &str| {
        Req::get(path)
            .h2()
            .from("127.0.0.5")
            .header("x-forwarded-for", client)
    };
    let blocked = via_proxy("/blocked", "203.0.113.9").send(gw.addr).await;
    assert_eq!(blocked.status, 403, "{}", blocked.text());
    assert_eq!(blocked.header("retry-after"), Some("1"));
    assert!(blocked.text().contains("abnormal-usage-detected"));
    // Counted and logged like any refusal, under the forwarded client.
    let logged = |gw: &support::Live| {
        let lines = gw.access_log.lines();
        lines
            .into_iter()
            .find(|line| line.contains("\"path\":\"/blocked\""))
    };
    let mut line = logged(&gw);
    for _ in 0..100 {
        if line.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        line = logged(&gw);
    }
    let line = line.expect("no access log line for /blocked");
    let line: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(line["status"], 403, "{line}");
    assert_eq!(line["outcome"], "banned", "{line}");
    assert_eq!(line["client"], "203.0.113.9", "{line}");
    let metrics = gw.admin(Req::get("/metrics")).await.text();
    let banned: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("sluice_requests_total{") && l.contains("outcome=\"banned\""))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert_eq!(banned, 1.0, "{metrics}");
    let metrics = gw.admin(Req::get("/metrics")).await.text();
    let gauge = support::metric(&metrics, "sluice_flood_blocked_addresses");
    assert_eq!(gauge, Some(1.0), "the proxy's flooding client");
    let other = via_proxy("/other", "203.0.113.10").send(gw.addr).await;
    assert_eq!(other.status, 200, "{}", other.text());
    assert!(
        !refused(gw.addr, "127.0.0.5").await,
        "the proxy was blocked"
    );
    assert!(!up.targets().contains(&"/blocked".to_string()));
    let (exempt, _) = flood_until_calm(gw.addr, ("127.0.0.6", None), &up).await;
    drop(exempt);
    assert!(
        !refused(gw.addr, "127.0.0.6").await,
        "the exempt address was refused new connections"
    );
    let metrics = gw.admin(Req::get("/metrics")).await.text();
    let gauge = support::metric(&metrics, "sluice_flood_blocked_addresses");
    assert_eq!(
        gauge,
        Some(1.0),
        "only the proxy's flooding client is blocked"
    );
    gw.stop().await;
}
