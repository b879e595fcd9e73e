//! HTTP/2 upstreams (`protocol = "h2"`) and the edges of gRPC over them: trailers
//! both ways, a target's GOAWAY (drained, unprocessed requests sent again), resets
//! mid-stream on either side (the other side told, the permit released), `te`,
//! `grpc-timeout`, `grpc-web`, and a cost read from a trailer. Upstreams are
//! hyper's HTTP/2 server, or raw frames where the test needs a frame exactly placed.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::{Req, live, upstream, within};

type Answer = Response<BoxBody<Bytes, std::io::Error>>;

/// What an h2 upstream saw of one request: path, headers, body and trailers.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: HeaderMap,
    body: Bytes,
    trailers: Option<HeaderMap>,
}

/// hyper's HTTP/2 server on 127.0.0.1:0, answering with `answer`, recording what it
/// saw (a request is recorded once its body has been read).
struct H2Upstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    connections: Arc<AtomicUsize>,
}

impl H2Upstream {
    async fn start<F, Fut>(answer: F) -> H2Upstream
    where
        F: Fn(Seen) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Answer> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let connections: Arc<AtomicUsize> = Arc::default();
        let (record, count) = (seen.clone(), connections.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let (record, answer) = (record.clone(), answer.clone());
                let service = service_fn(move |request: Request<Incoming>| {
                    let (record, answer) = (record.clone(), answer.clone());
                    async move {
                        let path = request.uri().path().to_string();
                        let (parts, body) = request.into_parts();
                        let collected = body.collect().await.unwrap();
                        let seen = Seen {
                            path,
                            headers: parts.headers,
                            trailers: collected.trailers().cloned(),
                            body: collected.to_bytes(),
                        };
                        record.lock().unwrap().push(seen.clone());
                        Ok::<_, Infallible>(answer(seen).await)
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        H2Upstream {
            addr,
            seen,
            connections,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn full(body: &'static str) -> BoxBody<Bytes, std::io::Error> {
    Full::new(Bytes::from_static(body.as_bytes()))
        .map_err(|never| match never {})
        .boxed()
}

/// A body of `frames`, then its end.
fn frames(frames: Vec<Frame<Bytes>>) -> BoxBody<Bytes, std::io::Error> {
    let stream = futures_util::stream::iter(frames.into_iter().map(Ok::<_, std::io::Error>));
    BodyExt::boxed(StreamBody::new(stream))
}

fn trailers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    pairs
        .iter()
        .map(|(name, value)| {
            (
                http::HeaderName::from_static(name),
                HeaderValue::from_static(value),
            )
        })
        .collect()
}

/// A gateway config: upstream `up` at `url` speaking HTTP/2, route `api` on `/`.
fn config(url: &str, route_extra: &str, extra: &str) -> String {
    format!(
        r#"
[upstreams.up]
targets = ["{url}"]
protocol = "h2"

[[routes]]
name = "api"
path_prefix = "/"
upstream = "up"
{route_extra}

{extra}
"#
    )
}

/// An HTTP/2 (prior knowledge) connection to `addr` with hyper's client.
async fn h2_client(
    addr: SocketAddr,
) -> hyper::client::conn::http2::SendRequest<BoxBody<Bytes, std::io::Error>> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    sender
}

#[tokio::test]
async fn trailers_pass_both_ways() {
    let up = H2Upstream::start(|seen: Seen| async move {
        let checksum = seen
            .trailers
            .as_ref()
            .and_then(|t| t.get("x-checksum").cloned());
        let mut end = trailers(&[("grpc-status", "0")]);
        end.insert(
            "x-echo",
            checksum.unwrap_or(HeaderValue::from_static("none")),
        );
        let mut response = Response::new(frames(vec![
            Frame::data(Bytes::from_static(b"reply")),
            Frame::trailers(end),
        ]));
        response
            .headers_mut()
            .insert("content-type", HeaderValue::from_static("application/grpc"));
        response
    })
    .await;
    let gateway = live(&config(&up.url(), "", "")).await;
    let mut client = h2_client(gateway.addr).await;
    let body = frames(vec![
        Frame::data(Bytes::from_static(b"hello")),
        Frame::trailers(trailers(&[("x-checksum", "c0ffee")])),
    ]);
    let request = Request::post(format!("http://{}/svc.S/M", gateway.addr))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(body)
        .unwrap();
    let response = within("the call", client.send_request(request))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let collected = within("the answer", response.into_body().collect())
        .await
        .unwrap();
    let end = collected
        .trailers()
        .cloned()
        .expect("trailers reach the client");
    assert_eq!(
        end["x-echo"], "c0ffee",
        "the client's trailer reached the upstream"
    );
    assert_eq!(end["grpc-status"], "0");
    assert_eq!(collected.to_bytes(), "reply");

    let seen = &up.seen()[0];
    assert_eq!(seen.body, "hello");
    assert_eq!(
        seen.headers["te"], "trailers",
        "a gRPC call keeps te: trailers"
    );
    assert_eq!(seen.path, "/svc.S/M");
    assert!(seen.headers.contains_key("x-request-id"));
    gateway.stop().await;
}

#[tokio::test]
async fn requests_share_one_connection_per_target() {
    let up = H2Upstream::start(|_| async { Response::new(full("ok")) }).await;
    let gateway = live(&config(&up.url(), "", "")).await;
    let calls = (0..20).map(|i| Req::get(&format!("/n/{i}")).send(gateway.addr));
    let answers = within("20 requests", futures_util::future::join_all(calls)).await;
    assert!(answers.iter().all(|r| r.status == 200 && r.body == "ok"));
    assert_eq!(up.seen().len(), 20);
    assert_eq!(
        up.connections.load(Ordering::SeqCst),
        1,
        "multiplexed on one connection, not one per request"
    );
    gateway.stop().await;
}

// ---- raw HTTP/2 frames ------------------------------------------------------------

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len();
    let mut bytes = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    bytes.extend(stream.to_be_bytes());
    bytes.extend(payload);
    bytes
}

/// A frame read off `stream`: type, flags, stream id, payload; None at EOF.
async fn read_frame(stream: &mut TcpStream) -> Option<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    stream.read_exact(&mut head).await.ok()?;
    let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
    let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0; len];
    stream.read_exact(&mut payload).await.ok()?;
    Some((head[3], head[4], id, payload))
}

/// An HPACK field as a literal without indexing, new name, no Huffman coding.
fn literal(name: &str, value: &str) -> Vec<u8> {
    let mut bytes = vec![0x00, name.len() as u8];
    bytes.extend(name.as_bytes());
    bytes.push(value.len() as u8);
    bytes.extend(value.as_bytes());
    bytes
}

/// `:status: 200` (HPACK static table, index 8).
const STATUS_200: &[u8] = &[0x88];

/// A raw HTTP/2 upstream for the GOAWAY test. On its first connection it waits for
/// two requests (streams 1 and 3), sends GOAWAY naming stream 1 as the last it
/// processes, then answers stream 1 with `first`; every later connection answers
/// each request with `again-ID`. It records (connection, stream) of every request.
struct GoawayUpstream {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<(usize, u32)>>>,
}

impl GoawayUpstream {
    async fn start() -> GoawayUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests: Arc<Mutex<Vec<(usize, u32)>>> = Arc::default();
        let record = requests.clone();
        tokio::spawn(async move {
            for conn in 0.. {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(Self::serve(conn, stream, record.clone()));
            }
        });
        GoawayUpstream { addr, requests }
    }

    async fn serve(conn: usize, mut stream: TcpStream, record: Arc<Mutex<Vec<(usize, u32)>>>) {
        let mut preface = [0u8; 24];
        if stream.read_exact(&mut preface).await.is_err() {
            return;
        }
        assert_eq!(preface, PREFACE);
        stream.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
        let mut streams = Vec::new();
        while let Some((kind, flags, id, _)) = read_frame(&mut stream).await {
            let mut out = Vec::new();
            match kind {
                SETTINGS if flags & 0x1 == 0 => out.extend(frame(SETTINGS, 0x1, 0, &[])),
                HEADERS => {
                    record.lock().unwrap().push((conn, id));
                    streams.push(id);
                    if conn > 0 {
                        out.extend(frame(HEADERS, END_HEADERS, id, STATUS_200));
                        let body = format!("again-{id}");
                        out.extend(frame(DATA, END_STREAM, id, body.as_bytes()));
                    } else if streams.len() == 2 {
                        let mut goaway = 1u32.to_be_bytes().to_vec();
                        goaway.extend(0u32.to_be_bytes()); // NO_ERROR
                        out.extend(frame(GOAWAY, 0, 0, &goaway));
                        out.extend(frame(HEADERS, END_HEADERS, 1, STATUS_200));
                        out.extend(frame(DATA, END_STREAM, 1, b"first"));
                    }
                }
                _ => {}
            }
            if !out.is_empty() && stream.write_all(&out).await.is_err() {
                return;
            }
        }
    }

    fn requests(&self) -> Vec<(usize, u32)> {
        self.requests.lock().unwrap().clone()
    }

    async fn wait_requests(&self, n: usize) {
        within("the upstream's requests", async {
            while self.requests().len() < n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
    }
}

/// One worker thread (a current-thread runtime, as each of the binary's workers is):
/// its requests to the target share one connection.
#[tokio::test]
async fn a_goaway_drains_the_connection_and_requests_it_did_not_process_go_again() {
    let up = GoawayUpstream::start().await;
    let gateway = live(&config(&format!("http://{}", up.addr), "", "")).await;
    let addr = gateway.addr;
    let first = tokio::spawn(Req::get("/a").send(addr));
    up.wait_requests(1).await;
    let second = tokio::spawn(Req::get("/b").send(addr));
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!(
        (first.status.as_u16(), first.text()),
        (200, "first".to_string()),
        "the request the GOAWAY covers finishes on the draining connection"
    );
    assert_eq!(
        (second.status.as_u16(), second.text()),
        (200, "again-1".to_string()),
        "the request above the GOAWAY's last stream goes again, on a new connection"
    );
    let third = Req::get("/c").send(addr).await;
    assert_eq!(
        third.text(),
        "again-3",
        "later requests use the new connection"
    );
    assert_eq!(up.requests(), [(0, 1), (0, 3), (1, 1), (1, 3)]);
    gateway.stop().await;
}

#[tokio::test]
async fn a_te_other_than_trailers_resets_the_stream_and_nothing_is_forwarded() {
    let up = upstream().await;
    let gateway = live(&config(&up.url(), "", "").replace("protocol = \"h2\"", "")).await;
    let mut client = TcpStream::connect(gateway.addr).await.unwrap();
    let mut block = Vec::new();
    for (name, value) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/svc.S/M"),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "gzip"),
    ] {
        block.extend(literal(name, value));
    }
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    out.extend(frame(HEADERS, END_STREAM | END_HEADERS, 1, &block));
    client.write_all(&out).await.unwrap();
    let reset = within("RST_STREAM", async {
        loop {
            match read_frame(&mut client).await {
                Some((RST_STREAM, _, 1, code)) => return Some(code),
                Some((HEADERS, _, 1, _)) => panic!("the malformed request was answered"),
                Some(_) => {}
                None => return None,
            }
        }
    })
    .await;
    assert_eq!(
        reset,
        Some(vec![0, 0, 0, 1]),
        "reset with PROTOCOL_ERROR (RFC 9113 section 8.2.2)"
    );
    assert_eq!(up.count(), 0, "nothing reached the upstream");
    drop(client);
    gateway.stop().await;
}

/// What a test sends down a [`Channel`] body: a chunk, or an error that resets it.
type Chunks = tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>;

/// A body that sends what comes down a channel, and says when it was dropped.
struct Channel {
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
    dropped: Arc<AtomicUsize>,
}

impl hyper::body::Body for Channel {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.rx
            .poll_recv(cx)
            .map(|item| item.map(|chunk| chunk.map(Frame::data)))
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.dropped.fetch_add(1, Ordering::SeqCst);
    }
}

/// An upstream whose answers stream a first chunk and then whatever its test sends
/// (an error resets the stream); `dropped` counts the answers whose stream ended
/// (hyper drops an answer's body when its stream is reset).
struct Streaming {
    up: H2Upstream,
    senders: Arc<Mutex<Vec<Chunks>>>,
    dropped: Arc<AtomicUsize>,
}

impl Streaming {
    async fn start() -> Streaming {
        let senders: Arc<Mutex<Vec<_>>> = Arc::default();
        let dropped: Arc<AtomicUsize> = Arc::default();
        let (keep, count) = (senders.clone(), dropped.clone());
        let up = H2Upstream::start(move |_| {
            let (keep, count) = (keep.clone(), count.clone());
            async move {
                let (tx, rx) = tokio::sync::mpsc::channel(4);
                tx.send(Ok(Bytes::from_static(b"chunk"))).await.unwrap();
                keep.lock().unwrap().push(tx);
                let body = Channel { rx, dropped: count };
                Response::new(BodyExt::boxed(body))
            }
        })
        .await;
        Streaming {
            up,
            senders,
            dropped,
        }
    }
}

/// The route allows one request at a time; a second is refused (503) while one is
/// held.
const ONE_AT_A_TIME: &str = r#"
[policies.one]
anonymous = {}
concurrency = { max = 1, queue = 0 }
"#;

/// An h2 client's call on `addr`: the head, and the body after its first chunk.
async fn started_call(addr: SocketAddr) -> (h2::client::SendRequest<Bytes>, h2::RecvStream) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (mut client, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let request = Request::get(format!("http://{addr}/stream"))
        .body(())
        .unwrap();
    let (response, _) = client.send_request(request, true).unwrap();
    let response = within("the head", response).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let chunk = within("the first chunk", body.data())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(chunk, "chunk");
    (client, body)
}

#[tokio::test]
async fn a_client_reset_mid_stream_resets_the_upstream_stream_and_frees_the_permit() {
    let streaming = Streaming::start().await;
    let toml = config(&streaming.up.url(), "policy = \"one\"", ONE_AT_A_TIME);
    let gateway = live(&toml).await;
    let (_client, body) = started_call(gateway.addr).await;
    let busy = Req::get("/stream").send(gateway.addr).await;
    assert_eq!(busy.status, 503, "the call holds the route's one permit");
    drop(body); // RST_STREAM(CANCEL) from the client
    within("the upstream's stream is reset", async {
        while streaming.dropped.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let again = started_call(gateway.addr).await; // the permit is free again
    drop((again, _client));
    gateway.stop().await;
}

#[tokio::test]
async fn an_upstream_reset_mid_stream_resets_the_client_stream_and_frees_the_permit() {
    let streaming = Streaming::start().await;
    let toml = config(&streaming.up.url(), "policy = \"one\"", ONE_AT_A_TIME);
    let gateway = live(&toml).await;
    let (_client, mut body) = started_call(gateway.addr).await;
    let sender = streaming.senders.lock().unwrap().pop().unwrap();
    sender
        .send(Err(std::io::Error::other("upstream broke")))
        .await
        .unwrap();
    let next = within("the client's stream", body.data()).await;
    let err = next
        .expect("not a clean end")
        .expect_err("the stream is reset");
    assert!(err.is_reset(), "{err:?}");
    let again = started_call(gateway.addr).await; // the permit is free again
    drop((again, _client));
    gateway.stop().await;
}

/// A gRPC call's head on an h2 client: `content-type: application/grpc` and `extra`.
fn grpc_call(path: &str, extra: &[(&str, &str)]) -> Req {
    let mut req = Req::post(path, Bytes::from_static(b"\0\0\0\0\x03abc"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .h2();
    for (name, value) in extra {
        req = req.header(name, value);
    }
    req
}

#[tokio::test]
async fn grpc_timeout_shortens_the_upstream_timeout_and_a_malformed_one_is_refused() {
    let up = H2Upstream::start(|seen: Seen| async move {
        if seen.path.ends_with("Slow") {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        Response::new(full(""))
    })
    .await;
    let gateway = live(&config(&up.url(), "", "")).await;
    let late = grpc_call("/svc.S/Slow", &[("grpc-timeout", "200m")])
        .send(gateway.addr)
        .await;
    assert_eq!(late.status, 200);
    assert_eq!(late.header("grpc-status"), Some("4"), "DEADLINE_EXCEEDED");
    assert_eq!(
        late.header("grpc-message"),
        Some("upstream up did not answer in time")
    );
    for bad in ["abc", "123456789S", "10"] {
        let refused = grpc_call("/svc.S/Fast", &[("grpc-timeout", bad)])
            .send(gateway.addr)
            .await;
        assert_eq!(
            refused.header("grpc-status"),
            Some("3"),
            "{bad}: INVALID_ARGUMENT"
        );
        assert_eq!(
            refused.header("grpc-message"),
            Some("grpc-timeout must be 1 to 8 digits and a unit (H, M, S, m, u, n)")
        );
    }
    let fine = grpc_call("/svc.S/Fast", &[("grpc-timeout", "5S")])
        .send(gateway.addr)
        .await;
    assert_eq!(fine.status, 200);
    assert_eq!(
        fine.header("grpc-status"),
        None,
        "the upstream's own answer"
    );
    let paths: Vec<_> = up.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(
        paths,
        ["/svc.S/Slow", "/svc.S/Fast"],
        "no malformed call reached the upstream"
    );
    gateway.stop().await;
}

#[tokio::test]
async fn grpc_web_is_plain_http_and_its_refusals_problem_json() {
    let up = H2Upstream::start(|_| async { Response::new(full("ok")) }).await;
    let toml = config(
        &up.url(),
        "policy = \"tight\"",
        "[policies.tight]\nanonymous = { per_minute = 1 }\n",
    );
    let gateway = live(&toml).await;
    let call = || {
        Req::post("/svc.S/M", "AAAA")
            .header("content-type", "application/grpc-web+proto")
            .h2()
    };
    assert_eq!(call().send(gateway.addr).await.status, 200);
    let refused = call().send(gateway.addr).await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(refused.header("grpc-status"), None);
    gateway.stop().await;
}

#[tokio::test]
async fn cost_after_reads_a_trailer() {
    let up = H2Upstream::start(|_| async {
        let mut response = Response::new(frames(vec![
            Frame::data(Bytes::from_static(b"\0\0\0\0\0")),
            Frame::trailers(trailers(&[("grpc-status", "0"), ("x-tokens", "7")])),
        ]));
        response
            .headers_mut()
            .insert("content-type", HeaderValue::from_static("application/grpc"));
        response
    })
    .await;
    let toml = config(
        &up.url(),
        "policy = \"tokens\"\ncost_after = \"header:x-tokens\"",
        "[policies.tokens]\nanonymous = { per_minute = 10 }\n",
    );
    let gateway = live(&toml).await;
    let first = grpc_call("/svc.S/M", &[]).send(gateway.addr).await;
    assert_eq!(first.header("ratelimit"), Some("\"minute\";r=9;t=60"));
    let second = grpc_call("/svc.S/M", &[]).send(gateway.addr).await;
    assert_eq!(
        second.header("ratelimit"),
        Some("\"minute\";r=2;t=60"),
        "the first call was charged the 7 its trailer said"
    );
    gateway.stop().await;
}
