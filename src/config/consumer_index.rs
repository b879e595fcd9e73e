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
use hashbrown::hash_table::Entry;
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
        ConsumerIndex::build(consumers).0
    }

    /// Both tables over `consumers`, and the duplicates they found, in the order of
    /// the consumers: a consumer whose name an earlier one has is left out of both
    /// tables; one whose key an earlier one has, out of the key table.
    ///
    /// Each table is filled in the order of the slots its entries hash to, so a
    /// million inserts walk it once from one end to the other; inserted in the
    /// list's order, each of them missed the cache at a random slot (the index was
    /// 42 % of the compile of a million-line consumers file).
    pub(crate) fn build(consumers: &[ConsumerConfig]) -> (ConsumerIndex, Vec<Duplicate>) {
        let mut index = ConsumerIndex::with_capacity(consumers.len());
        let hasher = &index.hasher;
        let name_of = |i: u32| consumers[i as usize].name.as_str();
        let everyone = vec![true; consumers.len()];
        let (named, mut duplicates) =
            fill(&mut index.by_name, hasher, name_of, &everyone, Field::Name);
        let key_of = |i: u32| &consumers[i as usize].key_sha256;
        let (_, keys) = fill(&mut index.by_key, hasher, key_of, &named, Field::Key);
        duplicates.extend(keys);
        duplicates.sort_unstable_by_key(|duplicate| duplicate.at);
        (index, duplicates)
    }

    /// Empty tables sized for `capacity` consumers.
    fn with_capacity(capacity: usize) -> ConsumerIndex {
        ConsumerIndex {
            hasher: foldhash::fast::RandomState::default(),
            by_key: HashTable::with_capacity(capacity),
            by_name: HashTable::with_capacity(capacity),
        }
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
}

/// Which field of a consumer an earlier one already has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Field {
    Name,
    Key,
}

/// Consumer `at` repeats `field` of the earlier consumer `of`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Duplicate {
    pub(crate) at: usize,
    pub(crate) of: usize,
    pub(crate) field: Field,
}

impl Duplicate {
    fn new(at: u32, of: u32, field: Field) -> Duplicate {
        let (at, of) = (at as usize, of as usize);
        Duplicate { at, of, field }
    }
}

/// Fills `table` with the positions `i` where `among[i]`, each found by `field(i)`
/// (`kind` names it),
/// in the order of the slots they hash to (equal slots in the order of their
/// positions, so the first of two equal values is inserted first). Returns which
/// positions went in, and the others as duplicates of the one that did.
fn fill<'a, T>(
    table: &mut HashTable<u32>,
    hasher: &foldhash::fast::RandomState,
    field: impl Fn(u32) -> &'a T,
    among: &[bool],
    kind: Field,
) -> (Vec<bool>, Vec<Duplicate>)
where
    T: std::hash::Hash + Eq + ?Sized + 'a,
{
    let mask = table.num_buckets().saturating_sub(1) as u64;
    let mut order: Vec<(u64, u32)> = (0..among.len())
        .filter(|&i| among[i])
        .map(|i| (hasher.hash_one(field(slot(i))), slot(i)))
        .collect();
    order.sort_unstable_by_key(|&(hash, i)| (hash & mask, i));
    let mut inserted = vec![false; among.len()];
    let mut duplicates = Vec::new();
    for (hash, i) in order {
        let same = |&j: &u32| field(j) == field(i);
        match table.entry(hash, same, |&j| hasher.hash_one(field(j))) {
            Entry::Occupied(first) => duplicates.push(Duplicate::new(i, *first.get(), kind)),
            Entry::Vacant(free) => {
                free.insert(i);
                inserted[i as usize] = true;
            }
        }
    }
    (inserted, duplicates)
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
            anchor: None,
        }
    }

    #[test]
    fn finds_every_consumer_by_key_and_name_and_nothing_else() {
        let consumers: Vec<ConsumerConfig> = (0..5000).map(consumer).collect();
        let (index, duplicates) = ConsumerIndex::build(&consumers);
        assert_eq!(duplicates, []);
        let empty = ConsumerIndex::new(&[]);
        assert_eq!(empty.by_key(&consumers, &consumers[0].key_sha256), None);
        for (i, c) in consumers.iter().enumerate() {
            assert_eq!(index.by_key(&consumers, &c.key_sha256), Some(i));
            assert_eq!(index.by_name(&consumers, &c.name), Some(i));
        }
        assert_eq!(index.by_key(&consumers, &consumer(5000).key_sha256), None);
        assert_eq!(index.by_name(&consumers, "c5000"), None);
        assert_eq!(index.by_name(&consumers, ""), None);
    }

    #[test]
    fn a_later_duplicate_is_left_out_and_the_first_is_found() {
        let mut consumers: Vec<ConsumerConfig> = (0..3).map(consumer).collect();
        consumers.push(ConsumerConfig {
            name: "c1".into(),
            ..consumer(7)
        });
        consumers.push(ConsumerConfig {
            name: "other".into(),
            ..consumer(2)
        });
        let (index, duplicates) = ConsumerIndex::build(&consumers);
        let found: Vec<_> = duplicates.iter().map(|d| (d.at, d.of, d.field)).collect();
        // Consumer 3 repeats 1's name (so its key is not looked at), 4 repeats 2's key.
        assert_eq!(found, [(3, 1, Field::Name), (4, 2, Field::Key)]);
        assert_eq!(index.by_name(&consumers, "c1"), Some(1));
        assert_eq!(index.by_key(&consumers, &consumer(2).key_sha256), Some(2));
        assert_eq!(index.by_key(&consumers, &consumer(7).key_sha256), None);
    }
}
