//! HTTP/2 floods: a connection cut for abandoned requests is told
//! GOAWAY(ENHANCE_YOUR_CALM). The client speaks raw frames, as an attacker's tool
//! would.

mod common;

use std::time::Duration;

use common::{Toml, UpstreamOptions, connect, route, upstream_with};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
    let path = format!("/flood/{stream}");
    let mut block = vec![0x82, 0x86, 0x04, path.len() as u8];
    block.extend_from_slice(path.as_bytes());
    block.extend_from_slice(&[0x01, 0x01, b'a']);
    frame(0x1, 0x5, stream, &block)
}

/// RST_STREAM(CANCEL) on `stream`.
fn reset(stream: u32) -> Vec<u8> {
    frame(0x3, 0, stream, &8u32.to_be_bytes())
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
        while buf.len() >= 9 {
            let len =
                (usize::from(buf[0]) << 16) | (usize::from(buf[1]) << 8) | usize::from(buf[2]);
            if buf.len() < 9 + len {
                break;
            }
            let stream = u32::from_be_bytes(buf[5..9].try_into().unwrap()) & 0x7fff_ffff;
            let _ = out.send((buf[3], stream, buf[9..9 + len].to_vec()));
            buf.drain(..9 + len);
        }
    }
}

/// A connection cut for a flood hears GOAWAY(ENHANCE_YOUR_CALM) between whole frames
/// (the reader parses every frame), and a stream the client opens after it is
/// answered 503 without reaching the upstream. The client never answers the
/// gateway's PING, so h2's graceful close stays open until the gateway drops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_opened_on_a_connection_closing_for_a_flood_get_503() {
    let up = upstream_with(UpstreamOptions {
        delay: Duration::from_millis(200),
        ..Default::default()
    })
    .await;
    let toml = Toml::new()
        .upstream("up", &[up.url()])
        .route(route("all", "/").upstream("up"))
        .build();
    let gw = common::live(&toml).await;
    let tcp = connect(gw.addr, Some("127.0.0.4".parse().unwrap())).await;
    let (read, mut write) = tcp.into_split();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(frames(read, tx));
    let mut hello = PREFACE.to_vec();
    hello.extend(frame(0x4, 0, 0, &[]));
    hello.extend(frame(0x8, 0, 0, &(1u32 << 30).to_be_bytes()));
    write.write_all(&hello).await.unwrap();
    // 100 streams in batches of 20, each batch reset once the upstream has them all
    // (so they are abandoned after dispatch, and counted by the gateway, not h2).
    for batch in 0..5u32 {
        let ids: Vec<u32> = (0..20).map(|i| 1 + 2 * (batch * 20 + i)).collect();
        let heads: Vec<u8> = ids.iter().flat_map(|&id| get(id)).collect();
        write.write_all(&heads).await.unwrap();
        let want = 20 * (batch as usize + 1);
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
    assert_eq!(calm, Ok(true), "no GOAWAY(ENHANCE_YOUR_CALM)");
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
