//! A client's GOAWAY on HTTP/2, in raw frames: the streams it already opened are
//! still answered in full, each counted, logged and charged once, and their
//! concurrency slots come back; after a GOAWAY with an error and the connection
//! closed, each stream is logged once (499) and its slot comes back.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{self, Req, Toml, live, metric, route, within};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut frame = vec![len[1], len[2], len[3], kind, flags];
    frame.extend_from_slice(&stream.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// A GET of `path` as one HEADERS frame (END_STREAM, END_HEADERS), in HPACK
/// literals that index nothing.
fn get(stream: u32, path: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x86]; // :method GET, :scheme http
    for (index, value) in [(4u8, path), (1, "gw.test")] {
        // A literal without indexing, the name from the static table (:path,
        // :authority).
        block.push(index);
        block.push(value.len() as u8);
        block.extend_from_slice(value.as_bytes());
    }
    frame(HEADERS, END_STREAM | 0x4, stream, &block)
}

/// What came back on each stream.
#[derive(Debug, Default, Clone)]
struct Answer {
    /// The first byte of the HEADERS block (0x88: `:status 200` from the static table).
    status: Option<u8>,
    body: Vec<u8>,
    ended: bool,
}

/// Reads frames until every stream of `streams` ended (or the connection closed),
/// acknowledging the server's SETTINGS and PINGs; what each stream got.
async fn answers(tcp: &mut TcpStream, streams: &[u32]) -> Vec<Answer> {
    let mut answers = vec![Answer::default(); streams.len()];
    let mut buf = Vec::new();
    within("the answers", async {
        loop {
            while buf.len() >= 9 {
                let len = u32::from_be_bytes([0, buf[0], buf[1], buf[2]]) as usize;
                if buf.len() < 9 + len {
                    break;
                }
                let (kind, flags) = (buf[3], buf[4]);
                let id = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & 0x7fff_ffff;
                let payload = buf[9..9 + len].to_vec();
                buf.drain(..9 + len);
                let at = streams.iter().position(|&s| s == id);
                match (kind, at) {
                    (SETTINGS, _) if flags & ACK == 0 => {
                        tcp.write_all(&frame(SETTINGS, ACK, 0, &[])).await.unwrap();
                    }
                    (PING, _) if flags & ACK == 0 => {
                        tcp.write_all(&frame(PING, ACK, 0, &payload)).await.unwrap();
                    }
                    (HEADERS, Some(i)) => {
                        answers[i].status.get_or_insert(payload[0]);
                        answers[i].ended |= flags & END_STREAM != 0;
                    }
                    (DATA, Some(i)) => {
                        answers[i].body.extend_from_slice(&payload);
                        answers[i].ended |= flags & END_STREAM != 0;
                    }
                    _ => {}
                }
            }
            if answers.iter().all(|a| a.ended) {
                return;
            }
            let mut chunk = [0; 16_384];
            match tcp.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_open_before_a_clients_goaway_are_answered_counted_and_charged_once() {
    let up = support::upstream_with(support::UpstreamOptions {
        delay: Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    let toml = Toml::new()
        .upstream("up", &[up.url()])
        .raw(
            "[policies.p]\nanonymous = { per_minute = 10 }\n\
             concurrency = { max = 3 }",
        )
        .route(route("api", "/").upstream("up").policy("p"))
        .build();
    let gw = live(&toml).await;
    let mut tcp = TcpStream::connect(gw.addr).await.unwrap();
    let mut opening = PREFACE.to_vec();
    opening.extend(frame(SETTINGS, 0, 0, &[]));
    for (stream, path) in [(1, "/a"), (3, "/b"), (5, "/c")] {
        opening.extend(get(stream, path));
    }
    // GOAWAY(last stream 0, NO_ERROR): the client is going away, and takes no
    // stream the server would start; the three it started go on.
    opening.extend(frame(GOAWAY, 0, 0, &[0; 8]));
    tcp.write_all(&opening).await.unwrap();
    let answers = answers(&mut tcp, &[1, 3, 5]).await;
    for (answer, path) in answers.iter().zip(["/a", "/b", "/c"]) {
        assert!(answer.ended, "{path}: {answer:?}");
        assert_eq!(
            answer.status,
            Some(0x88),
            "{path}: 200 from the static table"
        );
        let body = String::from_utf8_lossy(&answer.body);
        assert_eq!(body, format!("up saw {path}"), "{path}");
    }
    drop(tcp);
    let mut seen: Vec<_> = up.seen().iter().map(|r| r.target.clone()).collect();
    seen.sort();
    assert_eq!(seen, ["/a", "/b", "/c"]);
    let lines = gw.access_log.wait_lines(3).await;
    assert_eq!(lines.len(), 3, "{lines:?}");
    for line in &lines {
        let line: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(line["status"], 200, "{line}");
    }
    let metrics = gw.admin(Req::get("/metrics")).await.text();
    let allowed = "sluice_requests_total{outcome=\"allowed\",plan=\"anonymous\",route=\"api\"}";
    assert_eq!(metric(&metrics, allowed), Some(3.0), "{metrics}");
    let inflight = "sluice_inflight_requests{route=\"api\"}";
    assert_eq!(metric(&metrics, inflight), Some(0.0));
    // Each was charged once, and the three slots of the cap are free again.
    let next = Req::get("/d").h2().send(gw.addr).await;
    assert_eq!(next.status, 200, "{}", next.text());
    let ratelimit = next.header("ratelimit").unwrap();
    assert!(ratelimit.contains("r=6"), "{ratelimit}");
    let addr = gw.addr;
    let answers = futures_util::future::join_all(
        (0..3).map(|i| async move { Req::get(&format!("/e{i}")).send(addr).await.status }),
    );
    let statuses: Vec<_> = answers.await.into_iter().map(|s| s.as_u16()).collect();
    assert_eq!(
        statuses,
        [200, 200, 200],
        "max = 3 at once: every slot came back"
    );
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_goaway_with_an_error_and_a_closed_connection_leave_no_slot_or_line_behind() {
    let up = support::upstream_with(support::UpstreamOptions {
        delay: Duration::from_millis(300),
        ..Default::default()
    })
    .await;
    let toml = Toml::new()
        .upstream("up", &[up.url()])
        .raw(
            "[policies.p]\nanonymous = { per_minute = 10 }\n\
             concurrency = { max = 3 }",
        )
        .route(route("api", "/").upstream("up").policy("p"))
        .build();
    let gw = live(&toml).await;
    let mut tcp = TcpStream::connect(gw.addr).await.unwrap();
    let mut opening = PREFACE.to_vec();
    opening.extend(frame(SETTINGS, 0, 0, &[]));
    for (stream, path) in [(1, "/a"), (3, "/b"), (5, "/c")] {
        opening.extend(get(stream, path));
    }
    tcp.write_all(&opening).await.unwrap();
    // Once the upstream has all three: GOAWAY(INTERNAL_ERROR), and the connection
    // closed under them.
    within("the three at the upstream", async {
        while up.seen().len() < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let mut goaway = vec![0; 4];
    goaway.extend_from_slice(&2u32.to_be_bytes());
    tcp.write_all(&frame(GOAWAY, 0, 0, &goaway)).await.unwrap();
    drop(tcp);
    let lines = gw.access_log.wait_lines(3).await;
    assert_eq!(lines.len(), 3, "{lines:?}");
    for line in &lines {
        let line: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(line["status"], 499, "{line}");
    }
    // The slots come back once the upstream has answered the three (it still
    // works on them: the cap counts what the upstream has in the works).
    let addr = gw.addr;
    within("the slots to come back", async {
        loop {
            let answers = futures_util::future::join_all(
                (0..3).map(|i| async move { Req::get(&format!("/e{i}")).send(addr).await.status }),
            );
            let statuses: Vec<_> = answers.await.into_iter().map(|s| s.as_u16()).collect();
            if statuses == [200, 200, 200] {
                return;
            }
            assert!(
                statuses.iter().all(|&s| s == 200 || s == 503),
                "{statuses:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let metrics = gw.admin(Req::get("/metrics")).await.text();
    assert_eq!(
        metric(&metrics, "sluice_inflight_requests{route=\"api\"}"),
        Some(0.0)
    );
    gw.stop().await;
}
