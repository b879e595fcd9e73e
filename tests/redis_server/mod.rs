//! The old name of `tests/support/redis_server`, kept only for crates not yet moved
//! onto `tests/support` (see `tests/common/mod.rs`).

pub(crate) use crate::common::redis_server::*;
