//! What the integration tests share, one module declared by every area crate
//! (`tests/<area>/main.rs`) as `pub mod support;`:
//!
//! - this file: a recording upstream, a gateway started in-process with a manual
//!   clock (`gateway`, or `live` with a config file and an admin listener), HTTP
//!   clients (hyper-util, HTTP/2 prior knowledge, and raw TCP for requests that normal
//!   clients would rewrite), free ports and bounded waits;
//! - [`toml`]: `gateway.toml` built in code, so a test states only what differs;
//! - [`redis_server`]: a private `redis-server` (one server, a Cluster, Sentinels);
//! - [`gateways`]: the replicas of a fleet on a shared Redis and the load put on them;
//! - [`rls`]: Envoy's generated rate limit client, run as a child process.
//!
//! Its items are `pub` and the module is `pub` in every crate, so an area that uses
//! only part of it gets no dead-code warning and needs no `allow`. Every network
//! wait is bounded by [`within`], so no test can hang.

pub mod gateways;
pub mod redis_server;
pub mod rls;
pub mod toml;

pub use toml::{Route, Toml, route};

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use sluice::app::Running;
use sluice::clock::Clock;
use sluice::config::Config;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinHandle;

/// sha256 of "demo-key-acme", the key the tests' consumer `acme` sends.
pub const ACME_SHA256: &str = "8649cdebee753898fd50e01408a9e438aa5090249bc3e51b65f33dce973b0873";

/// Upper bound for any single network exchange in a test.
pub const WAIT: Duration = Duration::from_secs(10);

/// Runs `future`, panicking with `what` if it takes longer than [`WAIT`].
pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    within_for(what, WAIT, future).await
}

/// Runs `future`, panicking with `what` if it takes longer than `limit`: a bound
/// against hanging, for work that takes long on a loaded machine (thousands of
/// requests), never a measure of speed.
pub async fn within_for<T>(what: &str, limit: Duration, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, future).await {
        Ok(value) => value,
        Err(_) => panic!("timed out after {limit:?}: {what}"),
    }
}

/// Milliseconds since the epoch of an RFC 3339 timestamp, e.g. `2026-01-15T10:00:00Z`.
pub fn ms(timestamp: &str) -> u64 {
    timestamp
        .parse::<jiff::Timestamp>()
        .unwrap_or_else(|e| panic!("bad timestamp {timestamp}: {e}"))
        .as_millisecond() as u64
}

/// The instant every gateway's manual clock starts at (a whole second).
pub fn t0() -> u64 {
    ms("2026-01-15T10:00:00Z")
}

// ---- the upstream -------------------------------------------------------------

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The request method.
    pub method: Method,
    /// Path and query exactly as they arrived in the request line.
    pub target: String,
    /// The HTTP version it arrived in.
    pub version: Version,
    /// Its headers as received.
    pub headers: HeaderMap,
    /// Its whole body.
    pub body: Bytes,
}

impl Seen {
    /// The value of header `name`, if it was sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ascii header"))
    }
}

/// How the upstream answers.
#[derive(Debug, Clone)]
pub struct UpstreamOptions {
    /// Sent back in `x-upstream` and in the default body.
    pub name: &'static str,
    /// The status of every answer.
    pub status: u16,
    /// The response body; `None` answers `"<name> saw <target>"`.
    pub body: Option<Bytes>,
    /// Wait this long (real time) before answering.
    pub delay: Duration,
    /// Stream a [`pattern`] body of this many bytes (chunked) instead of `body`.
    pub stream_bytes: Option<usize>,
    /// Add hop-by-hop headers to the response (`Connection: x-up-hop`, `x-up-hop`, `Keep-Alive`).
    pub hop_headers: bool,
    /// Close every connection after one response (`Connection: close`).
    pub close_each: bool,
}

impl Default for UpstreamOptions {
    fn default() -> Self {
        UpstreamOptions {
            name: "up",
            status: 200,
            body: None,
            delay: Duration::ZERO,
            stream_bytes: None,
            hop_headers: false,
            close_each: false,
        }
    }
}

/// A real HTTP/1.1 server on 127.0.0.1:0 that records every request it receives.
pub struct Upstream {
    /// Where it listens.
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    accepted: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Upstream {
    /// `http://127.0.0.1:PORT`, for `targets`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received so far, in arrival order.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// How many requests it received so far.
    pub fn count(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    /// The last request received; panics if there was none.
    pub fn last(&self) -> Seen {
        self.seen
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("the upstream received no request")
    }

    /// The request targets received so far.
    pub fn targets(&self) -> Vec<String> {
        self.seen().into_iter().map(|s| s.target).collect()
    }
}

/// An upstream answering 200 `"up saw <target>"`.
pub async fn upstream() -> Upstream {
    upstream_with(UpstreamOptions::default()).await
}

/// An upstream answering as `options` say.
pub async fn upstream_with(options: UpstreamOptions) -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let accepted: Arc<AtomicUsize> = Arc::default();
    let options = Arc::new(options);
    let task = {
        let (seen, accepted) = (seen.clone(), accepted.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                accepted.fetch_add(1, Ordering::SeqCst);
                let keep_alive = !options.close_each;
                let seen = seen.clone();
                let options = options.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        let seen = seen.clone();
                        let options = options.clone();
                        async move { Ok::<_, Infallible>(answer(request, &seen, &options).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .keep_alive(keep_alive)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        })
    };
    Upstream {
        addr,
        seen,
        accepted,
        task,
    }
}

async fn answer(
    request: Request<Incoming>,
    seen: &Mutex<Vec<Seen>>,
    options: &UpstreamOptions,
) -> Response<BoxBody<Bytes, Infallible>> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let target = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.to_string(), |pq| pq.as_str().to_string());
    seen.lock().unwrap().push(Seen {
        method: parts.method,
        target: target.clone(),
        version: parts.version,
        headers: parts.headers,
        body,
    });
    if !options.delay.is_zero() {
        tokio::time::sleep(options.delay).await;
    }
    let body = match (options.stream_bytes, &options.body) {
        (Some(len), _) => BoxBody::new(PatternBody {
            offset: 0,
            remaining: len,
        }),
        (None, Some(body)) => BoxBody::new(Full::new(body.clone())),
        (None, None) => BoxBody::new(Full::new(Bytes::from(format!(
            "{} saw {target}",
            options.name
        )))),
    };
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::from_u16(options.status).unwrap();
    let headers = response.headers_mut();
    headers.insert("x-upstream", HeaderValue::from_static(options.name));
    headers.insert("content-type", HeaderValue::from_static("text/plain"));
    if options.hop_headers {
        headers.insert("connection", HeaderValue::from_static("x-up-hop"));
        headers.insert("x-up-hop", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
    }
    response
}

/// `len` bytes of a recognisable, non-repeating-at-powers-of-two pattern.
pub fn pattern(len: usize) -> Vec<u8> {
    pattern_at(0, len)
}

fn pattern_at(offset: usize, len: usize) -> Vec<u8> {
    (offset..offset + len).map(|i| (i % 251) as u8).collect()
}

/// A streamed response body of [`pattern`] bytes in 64 KiB chunks (no length known).
struct PatternBody {
    offset: usize,
    remaining: usize,
}

impl hyper::body::Body for PatternBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if this.remaining == 0 {
            return Poll::Ready(None);
        }
        let len = this.remaining.min(64 * 1024);
        let chunk = pattern_at(this.offset, len);
        this.offset += len;
        this.remaining -= len;
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(chunk)))))
    }
}

/// `METHOD path` on 127.0.0.1:`port` over a fresh connection, without a runtime
/// (for tests that drive a `sluice` process); the status and body.
pub fn blocking_request(port: u16, method: &str, path: &str) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: sluice\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    Ok((status, body))
}

/// A loopback port that nothing listens on (bound, then released).
pub fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

// ---- the gateway ----------------------------------------------------------------

/// A gateway serving in-process on 127.0.0.1:0 with a manual clock.
pub struct Gateway {
    /// Its listener.
    pub addr: SocketAddr,
    /// Its manual clock, in ms since the epoch.
    pub clock: Arc<AtomicU64>,
    running: Option<Running>,
}

/// Starts sluice from `toml` with the clock at [`t0`].
pub async fn gateway(toml: &str) -> Gateway {
    gateway_at(toml, t0()).await
}

/// Starts sluice from `toml` with the clock at `start_ms`.
pub async fn gateway_at(toml: &str, start_ms: u64) -> Gateway {
    let config = match Config::parse(Path::new("test.toml"), toml) {
        Ok(config) => config,
        Err(err) => panic!("test config does not compile:\n{err}\n---\n{toml}"),
    };
    let (clock, handle) = Clock::manual(start_ms);
    let running = sluice::app::start_local(config, clock).await.unwrap();
    Gateway {
        addr: running.addr(),
        clock: handle,
        running: Some(running),
    }
}

impl Gateway {
    /// Moves the manual clock forward.
    pub fn advance(&self, by: Duration) {
        self.clock
            .fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }

    /// Moves the manual clock forward by `secs` seconds.
    pub fn advance_secs(&self, secs: u64) {
        self.advance(Duration::from_secs(secs));
    }

    /// Sets the manual clock to `ms` since the epoch.
    pub fn set_ms(&self, ms: u64) {
        self.clock.store(ms, Ordering::SeqCst);
    }

    /// The manual clock, in ms since the epoch.
    pub fn now_ms(&self) -> u64 {
        self.clock.load(Ordering::SeqCst)
    }

    /// GET `path` over HTTP/1.1 from 127.0.0.1.
    pub async fn get(&self, path: &str) -> Resp {
        Req::get(path).send(self.addr).await
    }

    /// Sends `request` verbatim over a fresh TCP connection and reads one response.
    pub async fn raw(&self, request: &str) -> Resp {
        raw(self.addr, request.as_bytes()).await
    }

    /// `GET <target> HTTP/1.1` verbatim, with `Connection: close`.
    pub async fn raw_get(&self, target: &str) -> Resp {
        self.raw(&format!(
            "GET {target} HTTP/1.1\r\nHost: gw.test\r\nConnection: close\r\n\r\n"
        ))
        .await
    }

    /// The TLS listener's address (with `[server.tls]`).
    pub fn tls_addr(&self) -> SocketAddr {
        self.running.as_ref().expect("running").tls_addrs[0]
    }

    /// Serves `config` from now on, as a reload would.
    pub fn install(&self, config: Config) {
        self.running
            .as_ref()
            .expect("running")
            .gateway
            .install(config);
    }

    /// What `GET /metrics` would answer (Prometheus text).
    pub fn metrics(&self) -> String {
        self.running
            .as_ref()
            .expect("running")
            .gateway
            .metrics()
            .render()
    }

    /// The gateway's store, to read what it tracks.
    pub fn store(&self) -> &sluice::store::Store {
        self.running.as_ref().expect("running").gateway.store()
    }

    /// Stops it as SIGTERM would: drains, then returns.
    pub async fn stop(mut self) {
        if let Some(running) = self.running.take() {
            within("gateway stop", running.stop()).await;
        }
    }
}

// ---- clients ---------------------------------------------------------------------

/// A response as the client saw it.
#[derive(Debug, Clone)]
pub struct Resp {
    /// The status code.
    pub status: StatusCode,
    /// The HTTP version it came in.
    pub version: Version,
    /// Its headers.
    pub headers: HeaderMap,
    /// Its whole body.
    pub body: Bytes,
}

impl Resp {
    /// The value of header `name`, if there is one.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ascii header value"))
    }

    /// The body as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; panics if it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.text()))
    }

    /// Asserts an RFC 9457 problem response with `status` and returns its JSON body.
    #[track_caller]
    pub fn problem(&self, status: u16) -> serde_json::Value {
        assert_eq!(
            self.status.as_u16(),
            status,
            "status; body: {}",
            self.text()
        );
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "content-type of a {status}"
        );
        let json = self.json();
        assert_eq!(json["status"], status, "status in the problem body: {json}");
        assert!(json["title"].is_string(), "problem without title: {json}");
        assert!(json["detail"].is_string(), "problem without detail: {json}");
        json
    }

    /// `Retry-After` as whole seconds; panics if absent or not an integer.
    #[track_caller]
    pub fn retry_after(&self) -> u64 {
        let value = self.header("retry-after").expect("Retry-After header");
        value
            .parse()
            .unwrap_or_else(|_| panic!("Retry-After is not delta-seconds: {value:?}"))
    }

    /// Parameter `param` of item `item` in the structured-field list header `name`,
    /// e.g. `resp.sf_param("ratelimit", "minute", "r")`.
    #[track_caller]
    pub fn sf_param(&self, name: &str, item: &str, param: &str) -> Option<i64> {
        let value = self.header(name)?;
        sf_param(value, item, param)
    }
}

/// Parameter `param` of item `"item"` in an RFC 8941 list such as
/// `"minute";r=4;t=60, "day";r=9;t=86400`.
pub fn sf_param(list: &str, item: &str, param: &str) -> Option<i64> {
    let quoted = format!("\"{item}\"");
    for member in list.split(',') {
        let mut parts = member.trim().split(';');
        if parts.next() != Some(quoted.as_str()) {
            continue;
        }
        for pair in parts {
            if let Some((key, value)) = pair.trim().split_once('=')
                && key == param
            {
                return value.parse().ok();
            }
        }
    }
    None
}

/// A request for [`Req::send`].
#[derive(Debug, Clone)]
pub struct Req {
    method: Method,
    path: String,
    headers: Vec<(String, String)>,
    body: Bytes,
    from: Option<IpAddr>,
    h2: bool,
    /// How long the exchange may take before the test gives up ([`WAIT`]).
    give_up: Duration,
}

impl Req {
    /// `method` on `path`, with no headers and an empty body.
    pub fn new(method: Method, path: &str) -> Req {
        Req {
            method,
            path: path.to_string(),
            headers: Vec::new(),
            body: Bytes::new(),
            from: None,
            h2: false,
            give_up: WAIT,
        }
    }

    /// `GET path`.
    pub fn get(path: &str) -> Req {
        Req::new(Method::GET, path)
    }

    /// `POST path` with `body`.
    pub fn post(path: &str, body: impl Into<Bytes>) -> Req {
        let mut req = Req::new(Method::POST, path);
        req.body = body.into();
        req
    }

    /// Adds a header (repeatable).
    pub fn header(mut self, name: &str, value: &str) -> Req {
        self.headers.push((name.to_string(), value.to_string()));
        self
    }

    /// Connects from this local address (e.g. `127.0.0.2`) instead of 127.0.0.1.
    pub fn from(mut self, ip: &str) -> Req {
        self.from = Some(ip.parse().expect("an IP address"));
        self
    }

    /// HTTP/2 with prior knowledge instead of HTTP/1.1.
    pub fn h2(mut self) -> Req {
        self.h2 = true;
        self
    }

    /// Gives up on the exchange after `limit` instead of [`WAIT`]: for a request the
    /// test keeps waiting on purpose, or one of thousands sent at once.
    pub fn give_up_after(mut self, limit: Duration) -> Req {
        self.give_up = limit;
        self
    }

    /// Sends the request with hyper-util's client on a fresh connection.
    pub async fn send(self, addr: SocketAddr) -> Resp {
        let what = format!("{} {} {:?}", self.method, self.path, self.headers);
        match self.try_send(addr).await {
            Ok(resp) => resp,
            Err(err) => panic!("{what}: {err}"),
        }
    }

    /// Like [`Req::send`], but a client error (refused, reset) is returned.
    pub async fn try_send(self, addr: SocketAddr) -> Result<Resp, String> {
        let mut connector = HttpConnector::new();
        connector.set_local_address(self.from);
        let client: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
            .http2_only(self.h2)
            .pool_max_idle_per_host(0)
            .build(connector);
        let mut builder = Request::builder()
            .method(self.method.clone())
            .uri(format!("http://{addr}{}", self.path));
        for (name, value) in &self.headers {
            builder = builder.header(name.as_str(), value.as_str());
        }
        let request = builder.body(Full::new(self.body.clone())).unwrap();
        let what = format!("{} {} {:?}", self.method, self.path, self.headers);
        within_for(&what, self.give_up, async {
            let response = client
                .request(request)
                .await
                .map_err(|e| format!("{e:?}"))?;
            let (parts, body) = response.into_parts();
            let body = body
                .collect()
                .await
                .map_err(|e| format!("reading the body: {e:?}"))?
                .to_bytes();
            Ok(Resp {
                status: parts.status,
                version: parts.version,
                headers: parts.headers,
                body,
            })
        })
        .await
    }
}

/// Connects to `addr` from `from` (any loopback address) or the default address.
pub async fn connect(addr: SocketAddr, from: Option<IpAddr>) -> TcpStream {
    within("connect", async {
        match from {
            None => TcpStream::connect(addr).await.unwrap(),
            Some(ip) => {
                let socket = TcpSocket::new_v4().unwrap();
                socket.bind(SocketAddr::new(ip, 0)).unwrap();
                socket.connect(addr).await.unwrap()
            }
        }
    })
    .await
}

/// Writes `request` verbatim on a fresh connection and reads one HTTP/1.1 response.
pub async fn raw(addr: SocketAddr, request: &[u8]) -> Resp {
    raw_from(None, addr, request).await
}

/// Like [`raw`], connecting from `from` (any loopback address).
pub async fn raw_from(from: Option<IpAddr>, addr: SocketAddr, request: &[u8]) -> Resp {
    let mut stream = connect(addr, from).await;
    let what = format!("raw request {:?}", String::from_utf8_lossy(request));
    within(&what, async {
        stream.write_all(request).await.unwrap();
        read_response(&mut stream)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e}"))
    })
    .await
}

/// Reads one HTTP/1.1 response (Content-Length, chunked or until EOF).
pub async fn read_response(stream: &mut TcpStream) -> Result<Resp, String> {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i;
        }
        let mut chunk = vec![0u8; 8192];
        let n = stream.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err(format!(
                "connection closed before a complete response head ({:?})",
                String::from_utf8_lossy(&buf)
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8(buf[..head_end].to_vec()).map_err(|e| e.to_string())?;
    let mut rest = buf[head_end + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut words = status_line.splitn(3, ' ');
    let version = match words.next() {
        Some("HTTP/1.1") => Version::HTTP_11,
        Some("HTTP/1.0") => Version::HTTP_10,
        other => return Err(format!("bad status line {status_line:?} ({other:?})")),
    };
    let status = words
        .next()
        .and_then(|s| s.parse::<u16>().ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut headers = HeaderMap::new();
    for line in lines {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| format!("bad header line {line:?}"))?;
        headers.append(
            HeaderName::try_from(name.trim()).map_err(|e| e.to_string())?,
            HeaderValue::try_from(value.trim()).map_err(|e| e.to_string())?,
        );
    }
    let chunked = headers
        .get("transfer-encoding")
        .is_some_and(|v| v.to_str().unwrap_or("").contains("chunked"));
    let length = headers
        .get("content-length")
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    let body = if chunked {
        loop {
            if let Some(body) = dechunk(&rest)? {
                break body;
            }
            read_more(stream, &mut rest).await?;
        }
    } else if let Some(length) = length {
        while rest.len() < length {
            read_more(stream, &mut rest).await?;
        }
        rest.truncate(length);
        rest
    } else {
        loop {
            let mut chunk = vec![0u8; 8192];
            let n = stream.read(&mut chunk).await.map_err(|e| e.to_string())?;
            if n == 0 {
                break rest;
            }
            rest.extend_from_slice(&chunk[..n]);
        }
    };
    Ok(Resp {
        status,
        version,
        headers,
        body: Bytes::from(body),
    })
}

async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<(), String> {
    let mut chunk = vec![0u8; 65536];
    let n = stream.read(&mut chunk).await.map_err(|e| e.to_string())?;
    if n == 0 {
        return Err("connection closed in the middle of the body".to_string());
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// The decoded body if `data` holds a complete chunked body, `None` if more is needed.
fn dechunk(data: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let mut out = Vec::new();
    let mut at = 0;
    loop {
        let Some(line_end) = find(&data[at..], b"\r\n") else {
            return Ok(None);
        };
        let line = std::str::from_utf8(&data[at..at + line_end]).map_err(|e| e.to_string())?;
        let size_text = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("bad chunk size line {line:?}"))?;
        at += line_end + 2;
        if size == 0 {
            // Trailers (none expected) end with an empty line.
            return Ok(find(&data[at..], b"\r\n").map(|_| out));
        }
        if data.len() < at + size + 2 {
            return Ok(None);
        }
        out.extend_from_slice(&data[at..at + size]);
        at += size + 2;
    }
}

/// Reads from `stream` until the peer closes it; returns what was read.
/// Panics if the connection is still open after `limit`.
pub async fn read_until_closed(
    stream: &mut (impl tokio::io::AsyncRead + Unpin),
    limit: Duration,
) -> Vec<u8> {
    let mut received = Vec::new();
    let outcome = tokio::time::timeout(limit, async {
        let mut chunk = vec![0u8; 4096];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => received.extend_from_slice(&chunk[..n]),
            }
        }
    })
    .await;
    assert!(
        outcome.is_ok(),
        "the connection was still open after {limit:?} (received {:?})",
        String::from_utf8_lossy(&received)
    );
    received
}

/// A port for the binary to listen on, free right now on 127.0.0.1 and 0.0.0.0.
///
/// Picked below the kernel's ephemeral range: a port from `bind(0)` can be taken by
/// any client socket of a concurrently running test before the binary binds it, and
/// a loopback connect to an ephemeral port nobody listens on can connect to itself.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(32_768)
        .clamp(12_000, 65_535);
    let seed = random_seed();
    for _ in 0..1_000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let mixed =
            (seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let port = (10_000 + (mixed >> 33) % (low - 10_000)) as u16;
        let loopback = std::net::TcpListener::bind(("127.0.0.1", port)).is_ok();
        let any = std::net::TcpListener::bind(("0.0.0.0", port)).is_ok();
        let free = loopback && any;
        if free {
            return port;
        }
    }
    panic!("no free port below {low}");
}

// ---- an in-process gateway with a config file and an admin listener -------------

/// A gateway started from a file in a tempdir, with `config_path` set (so the
/// watcher, SIGHUP and `POST /admin/reload` reload it), an admin listener and a manual
/// clock.
pub struct Live {
    /// The tempdir holding the config (removed on drop).
    pub dir: tempfile::TempDir,
    /// The path the gateway was started with (may be a symlink).
    pub path: std::path::PathBuf,
    /// The proxy listener.
    pub addr: SocketAddr,
    /// The admin listener.
    pub admin: SocketAddr,
    /// Its manual clock, in ms since the epoch.
    pub clock: Arc<AtomicU64>,
    /// The running gateway (`None` once stopped).
    pub running: Option<Running>,
    /// What the gateway wrote to its access log.
    pub access_log: SharedLog,
}

/// An access log kept in memory, for tests to read.
#[derive(Clone, Default)]
pub struct SharedLog(Arc<std::sync::Mutex<Vec<u8>>>);

impl SharedLog {
    /// The lines written so far.
    pub fn lines(&self) -> Vec<String> {
        let bytes = self.0.lock().unwrap().clone();
        String::from_utf8(bytes)
            .expect("the access log is UTF-8")
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Waits (up to 5 s) until at least `n` lines were written; returns them.
    pub async fn wait_lines(&self, n: usize) -> Vec<String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let lines = self.lines();
            if lines.len() >= n || std::time::Instant::now() > deadline {
                return lines;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl std::io::Write for SharedLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes `toml` to `gateway.toml` in a fresh tempdir and serves it.
pub async fn live(toml: &str) -> Live {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, toml).unwrap();
    live_at(dir, path).await
}

/// Serves the config at `path` (inside `dir`).
pub async fn live_at(dir: tempfile::TempDir, path: std::path::PathBuf) -> Live {
    let access_log = SharedLog::default();
    let writer = Box::new(access_log.clone());
    let mut live = live_writing(dir, path, writer).await;
    live.access_log = access_log;
    live
}

/// Writes `toml` to a fresh tempdir and serves it, the access log going to `writer`
/// (`Live::access_log` then stays empty).
pub async fn live_logging_to(toml: &str, writer: Box<dyn std::io::Write + Send>) -> Live {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, toml).unwrap();
    live_writing(dir, path, writer).await
}

async fn live_writing(
    dir: tempfile::TempDir,
    path: std::path::PathBuf,
    access_log: Box<dyn std::io::Write + Send>,
) -> Live {
    let config = Config::load(&path).unwrap_or_else(|err| {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        panic!("test config does not compile:\n{err}\n---\n{text}")
    });
    let (clock, handle) = Clock::manual(t0());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = sluice::app::start(
        config,
        sluice::app::Options {
            listeners: vec![listener],
            tls_listeners: Vec::new(),
            workers: Vec::new(),
            admin: Some(admin),
            clock,
            config_path: Some(path.clone()),
            hangups: None,
            access_log,
        },
    )
    .expect("the gateway starts");
    Live {
        access_log: SharedLog::default(),
        addr: running.addr(),
        admin: running.admin_addr.expect("an admin address"),
        dir,
        path,
        clock: handle,
        running: Some(running),
    }
}

impl Live {
    /// GET `path` over HTTP/1.1 from 127.0.0.1.
    pub async fn get(&self, path: &str) -> Resp {
        Req::get(path).send(self.addr).await
    }

    /// Sends `req` to the admin listener.
    pub async fn admin(&self, req: Req) -> Resp {
        req.send(self.admin).await
    }

    /// Moves the manual clock forward by `secs` seconds.
    pub fn advance_secs(&self, secs: u64) {
        self.clock.fetch_add(secs * 1_000, Ordering::SeqCst);
    }

    /// Stops it as SIGTERM would: drains, then returns.
    pub async fn stop(mut self) {
        if let Some(running) = self.running.take() {
            within("gateway stop", running.stop()).await;
        }
    }
}

/// A seed that differs from run to run (std's hasher keys are random per process).
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::hash::RandomState::new().build_hasher().finish()
}

/// The value of the sample `series` (name and labels exactly as rendered) in a
/// Prometheus text exposition.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok()).flatten()
    })
}
