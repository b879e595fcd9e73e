//! WebSocket peers for the tests: an echo upstream that records what it was sent
//! (its handshake's headers, how each socket closed), a client through sluice, and
//! raw frames for what no well-behaved client sends.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::{SinkExt, StreamExt};
use http::HeaderMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{ClientRequestBuilder, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::support::within;

/// What the echo upstream saw.
#[derive(Debug, Default)]
pub(crate) struct Record {
    /// Every handshake's request headers.
    pub handshakes: Vec<HeaderMap>,
    /// The close code each socket ended with (`None`: no close frame came).
    pub closes: Vec<Option<u16>>,
    /// Messages received over all sockets.
    pub messages: usize,
    /// Their payloads, in the order they came.
    pub received: Vec<Vec<u8>>,
}

/// A WebSocket echo server on 127.0.0.1:0: every text or binary message comes back.
pub(crate) struct Echo {
    pub addr: SocketAddr,
    pub record: Arc<Mutex<Record>>,
    task: JoinHandle<()>,
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Echo {
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits until `n` sockets have ended; returns their close codes.
    pub(crate) async fn closes(&self, n: usize) -> Vec<Option<u16>> {
        within("the upstream's sockets to close", async {
            loop {
                let closes = self.record.lock().unwrap().closes.clone();
                if closes.len() >= n {
                    return closes;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        })
        .await
    }

    pub(crate) fn handshakes(&self) -> usize {
        self.record.lock().unwrap().handshakes.len()
    }

    /// The payloads of the messages received so far, as text.
    pub(crate) fn received(&self) -> Vec<String> {
        let record = self.record.lock().unwrap();
        let text = |payload: &Vec<u8>| String::from_utf8_lossy(payload).to_string();
        record.received.iter().map(text).collect()
    }
}

pub(crate) async fn echo() -> Echo {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let record: Arc<Mutex<Record>> = Arc::default();
    let shared = record.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(serve(stream, shared.clone()));
        }
    });
    Echo { addr, record, task }
}

async fn serve(stream: TcpStream, record: Arc<Mutex<Record>>) {
    let seen = record.clone();
    #[allow(clippy::result_large_err)] // tungstenite's callback type
    let callback = move |request: &Request, response: Response| {
        seen.lock()
            .unwrap()
            .handshakes
            .push(request.headers().clone());
        Ok(response)
    };
    let Ok(mut socket) = tokio_tungstenite::accept_hdr_async(stream, callback).await else {
        return;
    };
    let mut code = None;
    while let Some(Ok(message)) = socket.next().await {
        match message {
            Message::Text(_) | Message::Binary(_) => {
                {
                    let mut record = record.lock().unwrap();
                    record.messages += 1;
                    record.received.push(message.clone().into_data().to_vec());
                }
                if socket.send(message).await.is_err() {
                    break;
                }
            }
            Message::Close(frame) => {
                // Answered by tungstenite as the loop reads on, until the end.
                code = Some(frame.map_or(1005, |f: CloseFrame| f.code.into()));
            }
            _ => {}
        }
    }
    record.lock().unwrap().closes.push(code);
}

pub(crate) type Client = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// A WebSocket client through sluice at `addr` to `path`, with `headers`; the
/// handshake's error (the refusal's status) if it was refused.
pub(crate) async fn connect(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<(Client, http::Response<Option<Vec<u8>>>), tokio_tungstenite::tungstenite::Error> {
    let uri = format!("ws://{addr}{path}").parse().unwrap();
    let mut request = ClientRequestBuilder::new(uri);
    for (name, value) in headers {
        request = request.with_header(*name, *value);
    }
    within(
        "a WebSocket handshake",
        tokio_tungstenite::connect_async(request),
    )
    .await
}

/// The status a refused handshake got.
pub(crate) fn refused_status(err: &tokio_tungstenite::tungstenite::Error) -> u16 {
    match err {
        tokio_tungstenite::tungstenite::Error::Http(response) => response.status().as_u16(),
        other => panic!("expected an HTTP refusal, got {other:?}"),
    }
}

/// Reads messages until the socket closes: the messages, and the close frame's code.
pub(crate) async fn until_closed(client: &mut Client) -> (Vec<Message>, Option<(u16, String)>) {
    within("the socket to close", async {
        let mut messages = Vec::new();
        while let Some(message) = client.next().await {
            match message {
                Ok(Message::Close(frame)) => {
                    return (
                        messages,
                        frame.map(|f| (f.code.into(), f.reason.to_string())),
                    );
                }
                Ok(message) => messages.push(message),
                Err(_) => return (messages, None),
            }
        }
        (messages, None)
    })
    .await
}

/// An upstream that answers every request head with `answer` (written at once),
/// then reads until its client is gone; it counts the heads it read.
pub(crate) async fn scripted(answer: &'static [u8]) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heads = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&heads);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let counted = Arc::clone(&counted);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                counted.fetch_add(1, Ordering::SeqCst);
                let _ = stream.write_all(answer).await;
                while stream.read(&mut [0; 512]).await.unwrap_or(0) > 0 {}
            });
        }
    });
    (addr, heads)
}

// ---- the binary --------------------------------------------------------------------

/// `sluice run` (the binary, the system clock) serving a config file; killed when
/// dropped.
pub(crate) struct Binary {
    pub addr: SocketAddr,
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Binary {
    /// Runs the binary on `toml`, whose `[server]` section comes first and gets the
    /// `listen` address (and an `[admin]` listener of its own); returns once it
    /// accepts connections.
    pub(crate) async fn start(toml: &str) -> Binary {
        let (port, admin) = (crate::support::closed_port(), crate::support::closed_port());
        let toml = toml.replacen(
            "[server]\n",
            &format!("[server]\nlisten = \"127.0.0.1:{port}\"\n"),
            1,
        ) + &format!("\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n");
        assert!(toml.contains("listen = \"127.0.0.1:"), "{toml}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, toml).unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["run", "-c", path.to_str().unwrap()])
            .env_remove("SLUICE_LOG")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("sluice runs");
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        within("sluice listening", async {
            while TcpStream::connect(addr).await.is_err() {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        })
        .await;
        Binary {
            addr,
            child,
            _dir: dir,
        }
    }
}

// ---- raw sockets -------------------------------------------------------------------

/// A raw connection after a successful upgrade through sluice: frames are written
/// and read by hand.
pub(crate) struct Raw {
    pub stream: TcpStream,
    /// Bytes read past the 101's head.
    pub read: Vec<u8>,
}

/// Upgrades a raw connection to `path` at `addr`; panics unless the answer is 101.
pub(crate) async fn raw_upgrade(addr: SocketAddr, path: &str) -> Raw {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: gw.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut read = Vec::new();
    let head_end = within("the 101", async {
        loop {
            if let Some(i) = read.windows(4).position(|w| w == b"\r\n\r\n") {
                return i + 4;
            }
            let mut chunk = [0; 4096];
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(
                n > 0,
                "closed before the 101: {:?}",
                String::from_utf8_lossy(&read)
            );
            read.extend_from_slice(&chunk[..n]);
        }
    })
    .await;
    let head = String::from_utf8_lossy(&read[..head_end]).to_string();
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let read = read[head_end..].to_vec();
    Raw { stream, read }
}

/// A client frame (masked) with the first byte `b0` (FIN, RSV, opcode).
pub(crate) fn client_frame(b0: u8, payload: &[u8]) -> Vec<u8> {
    masked_frame(b0, payload, true)
}

/// A frame with `b0`, masked or not.
pub(crate) fn masked_frame(b0: u8, payload: &[u8], masked: bool) -> Vec<u8> {
    let mut frame = vec![b0];
    let bit = if masked { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => frame.push(bit | n as u8),
        n if n < 65_536 => {
            frame.push(bit | 126);
            frame.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            frame.push(bit | 127);
            frame.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    if masked {
        let key = [0x37, 0xfa, 0x21, 0x3d];
        frame.extend_from_slice(&key);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    } else {
        frame.extend_from_slice(payload);
    }
    frame
}

impl Raw {
    /// Reads server frames until a close frame: its code (`None` if the connection
    /// ended without one).
    pub(crate) async fn close_code(&mut self) -> Option<u16> {
        self.close().await.map(|(code, _)| code)
    }

    /// Reads server frames until a text frame with `text` came (the echo of a
    /// message sent), consuming them.
    pub(crate) async fn until_text(&mut self, text: &str) {
        within("the echo", async {
            loop {
                if let Some(end) = find_text(&self.read, text.as_bytes()) {
                    self.read.drain(..end);
                    return;
                }
                let mut chunk = [0; 4096];
                let n = self.stream.read(&mut chunk).await.unwrap();
                assert!(n > 0, "closed before the echo of {text:?}");
                self.read.extend_from_slice(&chunk[..n]);
            }
        })
        .await
    }

    /// Reads server frames until a close frame: its code and reason (`None` if the
    /// connection ended without one, or it had no code).
    pub(crate) async fn close(&mut self) -> Option<(u16, String)> {
        within("a close frame", async {
            loop {
                if let Some(close) = find_close(&self.read) {
                    return close;
                }
                let mut chunk = [0; 4096];
                match self.stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return find_close(&self.read).flatten(),
                    Ok(n) => self.read.extend_from_slice(&chunk[..n]),
                }
            }
        })
        .await
    }
}

/// Walks unmasked server frames in `bytes`: the end of the first text frame whose
/// payload is `text`, if one came whole.
fn find_text(bytes: &[u8], text: &[u8]) -> Option<usize> {
    let mut at = 0;
    while at + 2 <= bytes.len() {
        let len = match bytes[at + 1] & 0x7f {
            n @ 0..126 => usize::from(n),
            _ => panic!("a long server frame: {bytes:?}"),
        };
        let end = at + 2 + len;
        if end > bytes.len() {
            return None;
        }
        if bytes[at] & 0x0f == 1 && &bytes[at + 2..end] == text {
            return Some(end);
        }
        at = end;
    }
    None
}

/// Walks unmasked server frames in `bytes`: `Some(close)` at the first close frame
/// (`Some(None)` if it has no code), `None` if there is none yet.
fn find_close(bytes: &[u8]) -> Option<Option<(u16, String)>> {
    let mut at = 0;
    while at + 2 <= bytes.len() {
        let opcode = bytes[at] & 0x0f;
        let (len, header) = match bytes[at + 1] & 0x7f {
            126 if at + 4 <= bytes.len() => (
                u16::from_be_bytes([bytes[at + 2], bytes[at + 3]]) as usize,
                4,
            ),
            126 | 127 => return None,
            n => (n as usize, 2),
        };
        if at + header + len > bytes.len() {
            return None;
        }
        if opcode == 8 {
            let payload = &bytes[at + header..at + header + len];
            return Some((len >= 2).then(|| {
                let code = u16::from_be_bytes([payload[0], payload[1]]);
                (code, String::from_utf8_lossy(&payload[2..]).to_string())
            }));
        }
        at += header + len;
    }
    None
}
