//! The WebSocket series: sockets open per route, and client messages by what became
//! of them (forwarded upstream, or refused by a message limit).
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
    "WebSocket messages clients sent, by route and outcome (forwarded, limited).",
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
        }
    }
}
