//! The old name of `tests/support/gateways.rs`, kept only for crates not yet moved
//! onto `tests/support` (see `tests/common/mod.rs`).

pub(crate) use crate::common::gateways::*;
