//! HTTP/1.1 keep-alive on raw sockets: between two requests a connection holds none
//! of hyper's state, and a fresh one takes over when the client sends again. What a
//! client sees must not change: pipelined requests answered in order, a request that
//! arrives in pieces across a pause, many requests on one socket, no `Connection:
//! close` that the client did not ask for, and a close when it did.

use crate::support;

use std::time::Duration;

use support::{
    Gateway, Toml, Upstream, connect, gateway, read_until_closed, route, upstream, within,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn config(up: &Upstream) -> String {
    Toml::new()
        .upstream("up", &[up.url()])
        .route(route("all", "/").upstream("up"))
        .build()
}

/// One response as it came on the wire.
#[derive(Debug)]
struct Answer {
    head: String,
    body: String,
}

impl Answer {
    fn status(&self) -> &str {
        self.head.split(' ').nth(1).unwrap_or_default()
    }

    /// Whether the head carries `Connection: close`.
    fn closes(&self) -> bool {
        self.head.lines().any(|line| {
            let line = line.to_ascii_lowercase();
            line.starts_with("connection:") && line.contains("close")
        })
    }
}

/// Splits the first complete response off `buf` (Content-Length or chunked body).
fn split_answer(buf: &mut Vec<u8>) -> Option<Answer> {
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8(buf[..end].to_vec()).unwrap();
    let lower = head.to_ascii_lowercase();
    let mut at = end + 4;
    let body = if lower.contains("transfer-encoding: chunked") {
        let mut body = Vec::new();
        loop {
            let line_end = at + buf.get(at..)?.windows(2).position(|w| w == b"\r\n")?;
            let size = std::str::from_utf8(&buf[at..line_end]).unwrap();
            let size = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap();
            at = line_end + 2;
            if size == 0 {
                if buf.get(at..at + 2)? != b"\r\n" {
                    return None;
                }
                at += 2;
                break body;
            }
            body.extend_from_slice(buf.get(at..at + size)?);
            at += size + 2;
            buf.get(..at)?;
        }
    } else {
        let length = lower
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |v| v.trim().parse::<usize>().unwrap());
        let body = buf.get(at..at + length)?.to_vec();
        at += length;
        body
    };
    buf.drain(..at);
    Some(Answer {
        head,
        body: String::from_utf8(body).unwrap(),
    })
}

/// Reads `n` responses from `stream`, keeping what follows them in `buf`.
async fn read_answers(stream: &mut TcpStream, buf: &mut Vec<u8>, n: usize) -> Vec<Answer> {
    within("responses", async {
        let mut answers = Vec::new();
        while answers.len() < n {
            if let Some(answer) = split_answer(buf) {
                answers.push(answer);
                continue;
            }
            let mut chunk = [0u8; 4096];
            let got = stream.read(&mut chunk).await.unwrap();
            assert!(got > 0, "closed after {} of {n} responses", answers.len());
            buf.extend_from_slice(&chunk[..got]);
        }
        answers
    })
    .await
}

/// Longer than a connection stays busy before hyper's state is handed back (1 s).
const IDLE: Duration = Duration::from_millis(1_500);

fn get(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: gw.test\r\n\r\n")
}

/// A gateway in front of a recording upstream, and a connection to it that made one
/// request (`/first`) and was then left idle long enough to be handed back.
async fn idle_after_first() -> (Upstream, Gateway, TcpStream, Vec<u8>) {
    let up = upstream().await;
    let gw = gateway(&config(&up)).await;
    let mut stream = connect(gw.addr, None).await;
    let mut buf = Vec::new();
    stream.write_all(get("/first").as_bytes()).await.unwrap();
    read_answers(&mut stream, &mut buf, 1).await;
    tokio::time::sleep(IDLE).await;
    (up, gw, stream, buf)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_answered_in_order_across_the_handover() {
    let up = upstream().await;
    let gw = gateway(&config(&up)).await;
    let mut stream = connect(gw.addr, None).await;
    let mut buf = Vec::new();
    // Three heads and a body in one write: hyper reads them all at once.
    let post = "POST /b HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 5\r\n\r\nhello";
    let all = format!("{}{post}{}", get("/a"), get("/c"));
    stream.write_all(all.as_bytes()).await.unwrap();
    let answers = read_answers(&mut stream, &mut buf, 3).await;
    let bodies: Vec<_> = answers.iter().map(|a| a.body.as_str()).collect();
    assert_eq!(bodies, ["up saw /a", "up saw /b", "up saw /c"]);
    assert!(answers.iter().all(|a| a.status() == "200" && !a.closes()));
    assert_eq!(up.targets(), ["/a", "/b", "/c"]);
    assert_eq!(&up.seen()[1].body[..], b"hello");
    // The connection is still open for more, after hyper's state was handed back.
    tokio::time::sleep(IDLE).await;
    stream.write_all(get("/d").as_bytes()).await.unwrap();
    let answers = read_answers(&mut stream, &mut buf, 1).await;
    assert_eq!(answers[0].body, "up saw /d");
    assert!(buf.is_empty(), "nothing more was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_split_across_a_pause_is_served_whole() {
    let (up, _gw, mut stream, mut buf) = idle_after_first().await;
    // After an idle connection: a request line cut in two, a head cut before its end,
    // a body that comes after its head, each part after a pause (one of them longer
    // than the wait before an idle connection's state is handed back).
    let post = "POST /third HTTP/1.1\r\nHost: gw.test\r\nContent-Length: 4\r\n\r\nbody";
    let head_end = post.find("\r\n\r\n").unwrap() + 4;
    let pieces: [&[&str]; 3] = [
        &["GET /sec", "ond HTTP/1.1\r\nHost: gw.test\r\n\r\n"],
        &[&post[..20], &post[20..head_end], &post[head_end..]],
        &["GET /fourth HTTP/1.1\r\nHost: gw", ".test\r\n", "\r\n"],
    ];
    for (i, parts) in pieces.into_iter().enumerate() {
        for part in parts {
            stream.write_all(part.as_bytes()).await.unwrap();
            let pause = if i == 1 {
                IDLE
            } else {
                Duration::from_millis(50)
            };
            tokio::time::sleep(pause).await;
        }
        let answer = read_answers(&mut stream, &mut buf, 1).await.remove(0);
        assert_eq!(answer.status(), "200", "{answer:?}");
        assert!(!answer.closes(), "{answer:?}");
    }
    assert_eq!(up.targets(), ["/first", "/second", "/third", "/fourth"]);
    assert_eq!(&up.seen()[2].body[..], b"body");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_woken_by_more_than_its_first_read_passes_every_byte_on() {
    let (up, _gw, mut stream, mut buf) = idle_after_first().await;
    // One write wakes the idle connection: a head of more than 6 000 bytes, its body
    // and a second request, far more than the read that notices the client is back.
    let long = "v".repeat(6_000);
    let all = format!(
        "POST /long HTTP/1.1\r\nHost: gw.test\r\nX-Long: {long}\r\nContent-Length: 5\r\n\r\nhello{}",
        get("/after")
    );
    stream.write_all(all.as_bytes()).await.unwrap();
    let answers = read_answers(&mut stream, &mut buf, 2).await;
    let bodies: Vec<_> = answers.iter().map(|a| a.body.as_str()).collect();
    assert_eq!(bodies, ["up saw /long", "up saw /after"]);
    assert!(answers.iter().all(|a| a.status() == "200" && !a.closes()));
    let seen = up.seen();
    assert_eq!(up.targets(), ["/first", "/long", "/after"]);
    assert_eq!(seen[1].headers["x-long"], long.as_str());
    assert_eq!(&seen[1].body[..], b"hello");
    assert!(seen[2].body.is_empty());
    // And again after a second idle spell, on the same socket.
    tokio::time::sleep(IDLE).await;
    stream.write_all(get("/again").as_bytes()).await.unwrap();
    let answers = read_answers(&mut stream, &mut buf, 1).await;
    assert_eq!(answers[0].body, "up saw /again");
    assert!(buf.is_empty(), "nothing more was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_sequential_requests_share_one_socket_and_reach_the_upstream_intact() {
    let up = upstream().await;
    let gw = gateway(&config(&up)).await;
    let mut stream = connect(gw.addr, None).await;
    let mut buf = Vec::new();
    for i in 0..100 {
        let request = match i % 2 {
            0 => get(&format!("/n/{i}")),
            _ => format!(
                "POST /n/{i} HTTP/1.1\r\nHost: gw.test\r\nContent-Length: {}\r\n\r\nbody {i}",
                format!("body {i}").len()
            ),
        };
        stream.write_all(request.as_bytes()).await.unwrap();
        let answer = read_answers(&mut stream, &mut buf, 1).await.remove(0);
        assert_eq!(answer.status(), "200", "request {i}: {answer:?}");
        assert_eq!(answer.body, format!("up saw /n/{i}"));
        assert!(!answer.closes(), "request {i}: {answer:?}");
    }
    let seen = up.seen();
    assert_eq!(seen.len(), 100);
    for (i, request) in seen.iter().enumerate() {
        assert_eq!(request.target, format!("/n/{i}"));
        let body = if i % 2 == 1 {
            format!("body {i}")
        } else {
            String::new()
        };
        assert_eq!(request.body, body.as_bytes());
    }
    assert_eq!(
        up.connections(),
        1,
        "the upstream connection was reused too"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_asks_to_close_gets_its_close_and_nothing_after_it_is_served() {
    let up = upstream().await;
    let gw = gateway(&config(&up)).await;
    for (what, request) in [
        (
            "Connection: close",
            "GET /last HTTP/1.1\r\nHost: gw.test\r\nConnection: close\r\n\r\n",
        ),
        ("HTTP/1.0", "GET /last HTTP/1.0\r\nHost: gw.test\r\n\r\n"),
    ] {
        let mut stream = connect(gw.addr, None).await;
        let mut buf = Vec::new();
        stream.write_all(get("/before").as_bytes()).await.unwrap();
        read_answers(&mut stream, &mut buf, 1).await;
        // A request pipelined after the last one is not answered.
        let bytes = format!("{request}{}", get("/after"));
        stream.write_all(bytes.as_bytes()).await.unwrap();
        let rest = read_until_closed(&mut stream, Duration::from_secs(5)).await;
        buf.extend_from_slice(&rest);
        let answer = split_answer(&mut buf).expect("an answer");
        assert_eq!(answer.status(), "200", "{what}: {answer:?}");
        assert!(buf.is_empty(), "{what}: one answer only, then the close");
    }
    assert_eq!(up.targets(), ["/before", "/last", "/before", "/last"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_at_shutdown() {
    let up = upstream().await;
    let gw = gateway(&config(&up)).await;
    let mut stream = connect(gw.addr, None).await;
    let mut buf = Vec::new();
    stream.write_all(get("/one").as_bytes()).await.unwrap();
    read_answers(&mut stream, &mut buf, 1).await;
    tokio::time::sleep(IDLE).await;
    let stopping = tokio::spawn(gw.stop());
    let rest = read_until_closed(&mut stream, Duration::from_secs(5)).await;
    assert!(rest.is_empty(), "closed without another byte: {rest:?}");
    stopping.await.unwrap();
}
