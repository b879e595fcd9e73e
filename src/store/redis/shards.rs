//! Which Redis Cluster node serves a key: the slot map as this engine last read it, so
//! that a batch's requests can go to each node as one script call.
//!
//! The cluster connection keeps a slot map of its own for routing, but does not lend
//! it; this one is read with `CLUSTER SLOTS` when the link opens and again whenever a
//! call finds it stale (a key the node does not serve fails the call before it
//! writes anything, and the batch is then sent again split by hash tag, routed by
//! the client). A stale map therefore costs a few smaller calls, never a wrong count.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::RwLock;
use redis::Value;

/// The slots of a Redis Cluster.
pub const SLOTS: usize = 16_384;

/// A node not known to serve the slot (the map is not read yet, or lacks it).
pub const UNKNOWN: u16 = u16::MAX;

/// The slot map: per slot, the index of its master among the addresses seen.
pub struct Shards {
    map: RwLock<Map>,
    /// True while `CLUSTER SLOTS` is being asked.
    pub(super) reading: AtomicBool,
}

struct Map {
    node_of: Vec<u16>,
}

impl Default for Shards {
    fn default() -> Shards {
        Shards {
            map: RwLock::new(Map {
                node_of: vec![UNKNOWN; SLOTS],
            }),
            reading: AtomicBool::new(false),
        }
    }
}

impl Shards {
    /// The node serving `key`'s slot, as last read ([`UNKNOWN`] if none).
    pub fn node_of(&self, key: &str) -> u16 {
        self.map.read().node_of[usize::from(slot(key))]
    }

    /// Replaces the map with a `CLUSTER SLOTS` answer; false if it is not one.
    pub fn update(&self, answer: &Value) -> bool {
        let Value::Array(ranges) = answer else {
            return false;
        };
        let mut node_of = vec![UNKNOWN; SLOTS];
        let mut addresses: Vec<String> = Vec::new();
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
            let Some(port) = number(master.get(1)) else {
                return false;
            };
            let address = format!("{host}:{port}");
            let index = match addresses.iter().position(|a| *a == address) {
                Some(index) => index,
                None => {
                    addresses.push(address);
                    addresses.len() - 1
                }
            };
            let slots =
                usize::try_from(first).unwrap_or(SLOTS)..=usize::try_from(last).unwrap_or(0);
            for slot in slots.filter(|&s| s < SLOTS) {
                node_of[slot] = index as u16;
            }
        }
        *self.map.write() = Map { node_of };
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
        let shards = Shards::default();
        assert_eq!(shards.node_of("foo"), UNKNOWN);
        assert!(shards.update(&answer));
        assert_eq!(shards.node_of("foo"), 1, "slot 12182");
        assert_eq!(shards.node_of("{user1000}"), shards.node_of("user1000"));
        let low = (0..)
            .map(|i| format!("k{i}"))
            .find(|k| slot(k) <= 8_000)
            .unwrap();
        assert_eq!(shards.node_of(&low), 0);
        assert!(!shards.update(&Value::Int(1)));
        assert_eq!(shards.node_of("foo"), 1, "a bad answer keeps the map");
    }
}
