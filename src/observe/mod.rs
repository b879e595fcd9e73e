//! What sluice tells its operators: the Prometheus metrics (`metrics`) and the access
//! log (`access_log`).
//!
//! Neither decides anything: they are told what happened.

pub(crate) mod access_log;
pub(crate) mod metrics;

/// The version and the commit it was built from, as `sluice --version` prints them.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("SLUICE_COMMIT"), ")");
/// The commit the binary was built from ("unknown" outside a git checkout).
pub(crate) const COMMIT: &str = env!("SLUICE_COMMIT");
