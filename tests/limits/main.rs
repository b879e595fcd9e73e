//! Limits and identity, end to end through a gateway: who the caller is (API keys,
//! JWTs and JWKS, identity headers, consumers and the consumers file), which budget a
//! request spends (limits, limit keys, cost and cost after the response, shadow
//! mode), concurrency caps, bans and bounded memory (eviction).

#![allow(clippy::unwrap_used)] // a test fails by panicking

#[path = "../support/mod.rs"]
pub mod support;

mod bans;
mod concurrency;
mod consumers;
mod consumers_file;
mod cost;
mod cost_after;
mod cost_bounds;
mod cost_cancel;
mod eviction;
mod identity;
mod jwks;
mod jwks_ready;
mod jwt;
mod limit_keys;
mod limits;
mod shadow;
