//! The protocols sluice carries besides plain HTTP: WebSockets (upgrades, the
//! joined socket, its limits and its edges) and browsers' CORS.

#![allow(clippy::unwrap_used)] // a test fails by panicking

#[path = "../support/mod.rs"]
pub mod support;

mod cors;
mod sockets;
mod websocket;
mod websocket_edges;
