//! The decision listener (`[decision]`): forward auth as Traefik, Caddy and nginx
//! call it, Envoy's rate limit service as Envoy's own generated client calls it,
//! and the same callers decided alike through every door.
//!
//! Tools the tests run that a fresh machine lacks (nginx, Caddy, a Python with
//! `grpcio` and `xds-protos`) are installed by `scripts/test`; a missing one fails
//! the test with what to install.

#![allow(clippy::unwrap_used)] // a test fails by panicking

#[path = "../support/mod.rs"]
pub mod support;

mod caddy;
mod doors;
mod forward_auth;
mod nginx;
mod rls;
mod rls_log;

use std::net::SocketAddr;

/// The decision listener's address of a live gateway.
fn decision_addr(live: &support::Live) -> SocketAddr {
    (live.running.as_ref())
        .and_then(|r| r.decision_addr)
        .expect("a decision listener")
}

/// A forward-auth request as a proxy sends it for `method uri` on `host` from
/// client `client` (in `X-Forwarded-For`).
fn forwarded(method: &str, uri: &str, client: &str) -> support::Req {
    support::Req::get("/v1/forward-auth")
        .header("x-forwarded-method", method)
        .header("x-forwarded-proto", "https")
        .header("x-forwarded-host", "shop.example")
        .header("x-forwarded-uri", uri)
        .header("x-forwarded-for", client)
}

/// Waits until something accepts connections on `addr` (a proxy the test started).
async fn wait_listening(addr: SocketAddr, what: &str) {
    support::within(what, async {
        while tokio::net::TcpStream::connect(addr).await.is_err() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await;
}
