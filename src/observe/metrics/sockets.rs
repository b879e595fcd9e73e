//! The WebSocket series: sockets open per route, and client messages by what became
//! of them (forwarded upstream, refused by a message limit, passed over a shadow
//! policy's limit, refused for a limit store that cannot be reached), counted as
//! they pass.
//!
//! A socket resolves its route's series once when it opens, so counting a message
//! is an atomic add, never a label lookup.

use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};

use super::table::{Desc, counter_vec, register};

/// The WebSocket series.
#[derive(Debug, Clone)]
pub(crate) struct SocketMetrics {
    /// `sluice_ws_connections{route}`.
    connections: IntGaugeVec,
    /// `sluice_ws_messages_total{route,outcome}`.
    messages: IntCounterVec,
}

const CONNECTIONS: Desc = ("sluice_ws_connections", "Open WebSockets, by route.");
const MESSAGES: Desc = (
    "sluice_ws_messages_total",
    "WebSocket messages clients sent, by route and outcome (forwarded, limited, would_limit, unavailable).",
);

/// One route's series, for a socket of it.
#[derive(Debug, Clone)]
pub(crate) struct RouteSockets {
    /// Open sockets of the route.
    pub open: IntGauge,
    /// Client messages sent upstream.
    pub forwarded: IntCounter,
    /// Client messages refused by a message limit.
    pub limited: IntCounter,
    /// Client messages over a shadow policy's message limit, sent upstream all the
    /// same (each message has one outcome: these are not in `forwarded`).
    pub would_limit: IntCounter,
    /// Client messages refused as their limit's store cannot be reached.
    pub unavailable: IntCounter,
}

impl SocketMetrics {
    /// The series, registered in `registry`.
    pub(crate) fn register(registry: &Registry) -> SocketMetrics {
        let (name, help) = CONNECTIONS;
        let opts = prometheus::Opts::new(name, help);
        let connections = IntGaugeVec::new(opts, &["route"]).expect("valid metric");
        SocketMetrics {
            connections: register(registry, connections),
            messages: counter_vec(registry, MESSAGES, &["route", "outcome"]),
        }
    }

    /// Sockets open now, over every route.
    pub(crate) fn open(&self) -> u64 {
        use prometheus::core::Collector;
        let families = self.connections.collect();
        let open: f64 = families
            .iter()
            .flat_map(|family| family.get_metric())
            .map(|metric| metric.get_gauge().get_value())
            .sum();
        open.max(0.0) as u64
    }

    /// The series of `route`'s sockets.
    pub(crate) fn route(&self, route: &str) -> RouteSockets {
        RouteSockets {
            open: self.connections.with_label_values(&[route]),
            forwarded: self.messages.with_label_values(&[route, "forwarded"]),
            limited: self.messages.with_label_values(&[route, "limited"]),
            would_limit: self.messages.with_label_values(&[route, "would_limit"]),
            unavailable: self.messages.with_label_values(&[route, "unavailable"]),
        }
    }
}
