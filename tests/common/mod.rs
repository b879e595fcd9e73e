//! The old name of `tests/support`, kept only so that a crate not yet moved onto it
//! still builds (`tests/quotas`). Move a crate by declaring
//! `#[path = "../support/mod.rs"] pub mod support;` in its `main.rs`; then this
//! file, `tests/gateways` and `tests/redis_server` go.

// Declared privately here, support's `pub` items are dead code (and unreachable)
// to the crate for whatever part of it the crate does not use.
#![allow(dead_code, unused_imports, unreachable_pub)]

#[path = "../support/mod.rs"]
mod support;

pub(crate) use support::*;
