//! Redis topologies: gateways sharing their limits through one Redis server
//! (`fleet`) and their WebSocket message budgets (`messages`), a Redis Cluster and a
//! Sentinel-managed master, with faults injected into servers each test starts itself.

#![allow(clippy::unwrap_used)] // a test fails by panicking

#[path = "../support/mod.rs"]
pub mod support;

mod cluster;
mod decisions;
mod fleet;
mod health;
mod late;
mod messages;
mod resets;
mod sentinel;
// The WebSocket peers of tests/protocols, which uses all of them; this crate a few.
#[allow(dead_code)]
#[path = "../protocols/sockets.rs"]
mod sockets;

/// One test at a time, across the three modules: each starts its own Redis servers
/// and gateways, and the latency bounds and failover gaps they check must not depend
/// on a neighbour's thousand-request burst or six-node cluster.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
