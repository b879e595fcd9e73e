//! Consumers looked up by the SHA-256 of their key and by their name, without a
//! second copy of either: each table holds only the consumer's index (4 bytes a
//! slot) and compares against the list it indexes. For a million consumers that is
//! about 10 MB a table, where a map keyed by the hash (or by a boxed name) to an
//! index took 50–90 MB.
//!
//! The same tables check a consumers file for duplicate keys and names while it is
//! read, and find callers for the identifier.

use std::hash::BuildHasher;

use hashbrown::HashTable;
use subtle::ConstantTimeEq;

use super::ConsumerConfig;

/// The two lookups over one list of consumers (passed to each call, never kept).
#[derive(Debug, Default)]
pub(crate) struct ConsumerIndex {
    hasher: foldhash::fast::RandomState,
    by_key: HashTable<u32>,
    by_name: HashTable<u32>,
}

impl ConsumerIndex {
    /// The index of every consumer of `consumers`; a later duplicate key or name is
    /// left out of its table (the config refuses duplicates before this is built).
    pub(crate) fn new(consumers: &[ConsumerConfig]) -> ConsumerIndex {
        let mut index = ConsumerIndex::with_capacity(consumers.len());
        for i in 0..consumers.len() {
            if index.by_key(consumers, &consumers[i].key_sha256).is_none() {
                index.insert_key(consumers, i);
            }
            if index.by_name(consumers, &consumers[i].name).is_none() {
                index.insert_name(consumers, i);
            }
        }
        index
    }

    /// Empty tables sized for `capacity` consumers.
    pub(crate) fn with_capacity(capacity: usize) -> ConsumerIndex {
        ConsumerIndex {
            hasher: foldhash::fast::RandomState::default(),
            by_key: HashTable::with_capacity(capacity),
            by_name: HashTable::with_capacity(capacity),
        }
    }

    /// Room for `more` consumers in both tables, if it can be had (`consumers` is
    /// the list the tables index).
    pub(crate) fn reserve(&mut self, consumers: &[ConsumerConfig], more: usize) {
        let hasher = &self.hasher;
        let key = |&j: &u32| hasher.hash_one(consumers[j as usize].key_sha256);
        let _ = self.by_key.try_reserve(more, key);
        let name = |&j: &u32| hasher.hash_one(consumers[j as usize].name.as_str());
        let _ = self.by_name.try_reserve(more, name);
    }

    /// The consumer of `consumers` whose key hashes to `hash`.
    pub(crate) fn by_key(&self, consumers: &[ConsumerConfig], hash: &[u8; 32]) -> Option<usize> {
        let found = self.by_key.find(self.hasher.hash_one(hash), |&i| {
            // Compared in constant time, as keys are.
            (consumers.get(i as usize)).is_some_and(|c| bool::from(c.key_sha256.ct_eq(hash)))
        });
        found.map(|&i| i as usize)
    }

    /// The consumer of `consumers` called `name`.
    pub(crate) fn by_name(&self, consumers: &[ConsumerConfig], name: &str) -> Option<usize> {
        let found = self.by_name.find(self.hasher.hash_one(name), |&i| {
            consumers.get(i as usize).is_some_and(|c| c.name == name)
        });
        found.map(|&i| i as usize)
    }

    /// Adds consumer `i` of `consumers` to the table by key (its key must not be
    /// there yet: see [`Self::by_key`]).
    pub(crate) fn insert_key(&mut self, consumers: &[ConsumerConfig], i: usize) {
        let hasher = &self.hasher;
        let rehash = |&j: &u32| hasher.hash_one(consumers[j as usize].key_sha256);
        let hash = hasher.hash_one(consumers[i].key_sha256);
        self.by_key.insert_unique(hash, slot(i), rehash);
    }

    /// Adds consumer `i` of `consumers` to the table by name (its name must not be
    /// there yet: see [`Self::by_name`]).
    pub(crate) fn insert_name(&mut self, consumers: &[ConsumerConfig], i: usize) {
        let hasher = &self.hasher;
        let rehash = |&j: &u32| hasher.hash_one(consumers[j as usize].name.as_str());
        let hash = hasher.hash_one(consumers[i].name.as_str());
        self.by_name.insert_unique(hash, slot(i), rehash);
    }
}

/// A consumer's index as stored: a config holds far fewer than 2^32 consumers
/// (the file's reader stops before that).
fn slot(i: usize) -> u32 {
    u32::try_from(i).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PlanId;

    fn consumer(i: usize) -> ConsumerConfig {
        let mut key_sha256 = [0u8; 32];
        key_sha256[..8].copy_from_slice(&(i as u64).to_le_bytes());
        ConsumerConfig {
            name: format!("c{i}"),
            plan: PlanId::ANONYMOUS,
            key_sha256,
            limits: Vec::new(),
            disabled: false,
        }
    }

    #[test]
    fn finds_every_consumer_by_key_and_name_and_nothing_else() {
        // Grown from empty, as a consumers file's index is.
        let consumers: Vec<ConsumerConfig> = (0..5000).map(consumer).collect();
        let mut index = ConsumerIndex::with_capacity(0);
        for i in 0..consumers.len() {
            index.insert_key(&consumers, i);
            index.insert_name(&consumers, i);
        }
        let built = ConsumerIndex::new(&consumers);
        for index in [&index, &built] {
            for (i, c) in consumers.iter().enumerate() {
                assert_eq!(index.by_key(&consumers, &c.key_sha256), Some(i));
                assert_eq!(index.by_name(&consumers, &c.name), Some(i));
            }
            assert_eq!(index.by_key(&consumers, &consumer(5000).key_sha256), None);
            assert_eq!(index.by_name(&consumers, "c5000"), None);
            assert_eq!(index.by_name(&consumers, ""), None);
        }
    }

    #[test]
    fn a_later_duplicate_is_left_out_and_the_first_is_found() {
        let mut consumers: Vec<ConsumerConfig> = (0..3).map(consumer).collect();
        consumers.push(ConsumerConfig {
            name: "c1".into(),
            ..consumer(7)
        });
        consumers.push(consumer(2));
        let index = ConsumerIndex::new(&consumers);
        assert_eq!(index.by_name(&consumers, "c1"), Some(1));
        assert_eq!(index.by_key(&consumers, &consumer(2).key_sha256), Some(2));
        assert_eq!(index.by_key(&consumers, &consumer(7).key_sha256), Some(3));
    }
}
