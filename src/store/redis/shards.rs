//! Which Redis Cluster node serves a key: the slot map as this engine last read it,
//! with a connection of the engine's own to each master, so that a batch's requests
//! go to each node as one script call, as to one server.
//!
//! The cluster connection keeps a slot map of its own for routing, but does not lend
//! it; this one is read with `CLUSTER SLOTS` when the link opens and again whenever a
//! call finds it stale (a key the node does not serve fails the call before it
//! writes anything, and the batch is then sent again split by hash tag, routed by
//! the client). A stale map therefore costs a few smaller calls, never a wrong count.
//! Each master keeps what the engine knows of it (for the engine: its connection and
//! its health) for as long as it stays a master at the same address; a replica that
//! a failover promotes is a new master, healthy until its own calls fail.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;
use redis::Value;

/// The slots of a Redis Cluster.
pub const SLOTS: usize = 16_384;

/// A node not known to serve the slot (the map is not read yet, or lacks it).
pub const UNKNOWN: u16 = u16::MAX;

/// The slot map, and per master what the engine reaches it with (`N`: a connection).
pub struct Shards<N> {
    map: ArcSwap<Map<N>>,
    /// True while `CLUSTER SLOTS` is being asked.
    reading: AtomicBool,
}

/// The slot map as read at one moment.
pub struct Map<N> {
    /// Per slot, the index of its master in `nodes`.
    node_of: Vec<u16>,
    /// The masters: address (`host:port`) and connection.
    nodes: Vec<(String, N)>,
}

impl<N> Map<N> {
    /// The node serving `key`'s slot, as read ([`UNKNOWN`] if none).
    pub fn node_of(&self, key: &str) -> u16 {
        self.node_of[usize::from(slot(key))]
    }

    /// The connection to node `index` (an index [`Map::node_of`] gave).
    pub fn node(&self, index: u16) -> &N {
        &self.nodes[usize::from(index)].1
    }

    /// The master serving `slot`, as read (`None` if none).
    pub fn at_slot(&self, slot: u16) -> Option<&N> {
        let index = *self.node_of.get(usize::from(slot))?;
        self.nodes.get(usize::from(index)).map(|(_, node)| node)
    }

    /// Every master, as read.
    pub fn masters(&self) -> impl Iterator<Item = &N> {
        self.nodes.iter().map(|(_, node)| node)
    }

    /// Every master that serves a slot, with its address and the lowest slot it
    /// serves, as read.
    pub fn first_slots(&self) -> Vec<(u16, &str, &N)> {
        let mut first = vec![UNKNOWN; self.nodes.len()];
        for (slot, &index) in self.node_of.iter().enumerate().rev() {
            if let Some(at) = first.get_mut(usize::from(index)) {
                *at = slot as u16;
            }
        }
        (first.into_iter().zip(&self.nodes))
            .filter(|(slot, _)| *slot != UNKNOWN)
            .map(|(slot, (address, node))| (slot, address.as_str(), node))
            .collect()
    }
}

/// A key of the hash tag `{n}` for the lowest `n` whose slot is `slot`: a key a
/// given master serves.
pub fn key_in_slot(prefix: &str, slot: u16) -> String {
    let tag = (0u32..)
        .map(|n| n.to_string())
        .find(|tag| self::slot(tag) == slot)
        .unwrap_or_default();
    format!("{prefix}{{{tag}}}")
}

impl<N> Default for Shards<N> {
    fn default() -> Shards<N> {
        Shards {
            map: ArcSwap::from_pointee(Map {
                node_of: vec![UNKNOWN; SLOTS],
                nodes: Vec::new(),
            }),
            reading: AtomicBool::new(false),
        }
    }
}

impl<N: Clone> Shards<N> {
    /// The map as last read.
    pub fn map(&self) -> Arc<Map<N>> {
        self.map.load_full()
    }

    /// The node serving `key`'s slot, as last read ([`UNKNOWN`] if none).
    pub fn node_of(&self, key: &str) -> u16 {
        self.map.load().node_of(key)
    }

    /// Replaces the map with a `CLUSTER SLOTS` answer; false if it is not one. A
    /// master already known keeps its connection; `connect(host, port)` makes one
    /// for each new master (`None`: the answer is not used).
    pub fn update(&self, answer: &Value, mut connect: impl FnMut(&str, u16) -> Option<N>) -> bool {
        let Value::Array(ranges) = answer else {
            return false;
        };
        let known = self.map.load();
        let mut node_of = vec![UNKNOWN; SLOTS];
        let mut nodes: Vec<(String, N)> = Vec::new();
        for range in ranges {
            let Value::Array(fields) = range else {
                return false;
            };
            let (Some(first), Some(last), Some(Value::Array(master))) =
                (number(fields.first()), number(fields.get(1)), fields.get(2))
            else {
                return false;
            };
            let host = match master.first() {
                Some(Value::BulkString(host)) => String::from_utf8_lossy(host).into_owned(),
                Some(Value::SimpleString(host)) => host.clone(),
                _ => return false,
            };
            let Some(port) = number(master.get(1)).and_then(|p| u16::try_from(p).ok()) else {
                return false;
            };
            let address = format!("{host}:{port}");
            let index = match nodes.iter().position(|(a, _)| *a == address) {
                Some(index) => index,
                None => {
                    let reused = known.nodes.iter().find(|(a, _)| *a == address);
                    let node = match reused {
                        Some((_, node)) => node.clone(),
                        None => match connect(&host, port) {
                            Some(node) => node,
                            None => return false,
                        },
                    };
                    nodes.push((address, node));
                    nodes.len() - 1
                }
            };
            let slots =
                usize::try_from(first).unwrap_or(SLOTS)..=usize::try_from(last).unwrap_or(0);
            for slot in slots.filter(|&s| s < SLOTS) {
                node_of[slot] = index as u16;
            }
        }
        self.map.store(Arc::new(Map { node_of, nodes }));
        true
    }

    /// Whether a read of the map may start now (one at a time).
    pub fn start_reading(&self) -> bool {
        !self.reading.swap(true, Ordering::AcqRel)
    }

    /// A read of the map ended.
    pub fn done_reading(&self) {
        self.reading.store(false, Ordering::Release);
    }
}

fn number(value: Option<&Value>) -> Option<i64> {
    match value {
        Some(Value::Int(n)) => Some(*n),
        _ => None,
    }
}

/// The Redis Cluster slot of `key`: CRC16 of its hash tag (the text between the first
/// `{` and the next `}` when not empty), else of the whole key.
pub fn slot(key: &str) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(hash_tag(key).as_bytes()) % SLOTS as u16
}

/// What Redis Cluster hashes of `key`.
pub fn hash_tag(key: &str) -> &str {
    key.split_once('{')
        .and_then(|(_, rest)| rest.split_once('}'))
        .map(|(tag, _)| tag)
        .filter(|tag| !tag.is_empty())
        .unwrap_or(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_is_found_for_every_slot() {
        for wanted in [0, 1, 5_461, 10_923, 16_383] {
            let key = key_in_slot("sluice:epoch:", wanted);
            assert!(key.starts_with("sluice:epoch:{"), "{key}");
            assert_eq!(slot(&key), wanted, "{key}");
        }
    }

    #[test]
    fn slots_are_those_redis_computes() {
        // CLUSTER KEYSLOT answers, from the Redis Cluster specification's examples.
        assert_eq!(slot("foo"), 12_182);
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
        assert_eq!(hash_tag("foo{}{bar}"), "foo{}{bar}");
        assert_eq!(hash_tag("foo{{bar}}zap"), "{bar");
        assert_eq!(hash_tag("sluice:{p}:total"), "p");
    }

    #[test]
    fn a_cluster_slots_answer_maps_each_slot_to_its_master() {
        let node = |host: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let answer = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(8_000),
                node("10.0.0.1", 7000),
                node("10.0.0.4", 7000),
            ]),
            Value::Array(vec![
                Value::Int(8_001),
                Value::Int(16_383),
                node("10.0.0.2", 7000),
            ]),
        ]);
        let shards: Shards<String> = Shards::default();
        let connect = |host: &str, port: u16| Some(format!("connection to {host}:{port}"));
        assert_eq!(shards.node_of("foo"), UNKNOWN);
        assert!(shards.update(&answer, connect));
        assert_eq!(shards.node_of("foo"), 1, "slot 12182");
        assert_eq!(shards.map().node(1), "connection to 10.0.0.2:7000");
        assert_eq!(shards.node_of("{user1000}"), shards.node_of("user1000"));
        let low = (0..)
            .map(|i| format!("k{i}"))
            .find(|k| slot(k) <= 8_000)
            .unwrap();
        assert_eq!(shards.node_of(&low), 0);
        assert!(!shards.update(&Value::Int(1), connect));
        assert_eq!(shards.node_of("foo"), 1, "a bad answer keeps the map");
        // A master already known keeps its connection.
        let moved = Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(16_383),
            node("10.0.0.2", 7000),
        ])]);
        assert!(shards.update(&moved, |_, _| Some("a new connection".to_string())));
        assert_eq!(shards.node_of(&low), 0);
        assert_eq!(shards.map().node(0), "connection to 10.0.0.2:7000");
    }
}
