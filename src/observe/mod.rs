//! What sluice tells its operators: the Prometheus metrics (`metrics`), the access
//! log (`access_log`), the callers refused most and nearest a limit for the status
//! page (`hitters`: bounded summaries, never a caller in a metric label), the
//! listener's open connections by protocol (`connections`), and the
//! build it runs ([`VERSION`], `COMMIT`: `sluice --version` and `sluice_build_info`).
//!
//! Nothing here decides anything: it is told what happened.

pub(crate) mod access_log;
pub(crate) mod connections;
pub(crate) mod hitters;
pub(crate) mod metrics;

/// The version and the commit it was built from, as `sluice --version` prints them.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("SLUICE_COMMIT"), ")");
/// The commit the binary was built from ("unknown" outside a git checkout).
pub(crate) const COMMIT: &str = env!("SLUICE_COMMIT");
