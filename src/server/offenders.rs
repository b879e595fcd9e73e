//! Flood offenders: addresses whose connections were cut for a flood (rapid reset,
//! CONTINUATION, header or data abuse), refused new connections for a while.
//!
//! An address's first flood blocks it for [`FIRST_BLOCK`]; each repeat once it was
//! let back in doubles the block, up to [`LONGEST_BLOCK`]. A flood on a connection
//! accepted before the block (a second connection of the same attack) keeps the
//! block as it is: the repeat that doubles it is one made after serving the last.
//! An address is forgotten [`LONGEST_BLOCK`] after its block ends; the next flood
//! then starts at [`FIRST_BLOCK`] again. The table holds at most its capacity:
//! when full, forgotten addresses go first, then the one forgotten soonest.
//!
//! IPv6 addresses are keyed per prefix ([`key`]), as anonymous callers are: an
//! attacker holding a /64 has billions of addresses. Behind a trusted proxy the key
//! is the forwarded client's (the proxy's address is never refused: its connections
//! carry many clients); `[access] exempt` addresses are never recorded. This module
//! only keeps the table: the accept loop and the requests of a trusted proxy's
//! connections ask it, the connection supervisor tells it. Time is passed in.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How long an address's first flood blocks it.
pub(crate) const FIRST_BLOCK: Duration = Duration::from_secs(1);
/// The longest block: repeats double the block up to this.
pub(crate) const LONGEST_BLOCK: Duration = Duration::from_secs(600);
/// Addresses remembered at most.
pub(crate) const CAPACITY: usize = 4096;

/// One address's record.
#[derive(Debug, Clone, Copy)]
struct Offence {
    /// New connections are refused until then.
    until: Instant,
    /// The block last given.
    block: Duration,
}

impl Offence {
    /// When the address is forgotten: its next flood starts at [`FIRST_BLOCK`].
    fn forgotten_at(&self) -> Instant {
        self.until + LONGEST_BLOCK
    }
}

/// The addresses refused new connections after floods.
#[derive(Debug)]
pub(crate) struct Offenders {
    table: Mutex<HashMap<IpAddr, Offence>>,
    capacity: usize,
    /// Entries in `table`, read without the lock: an empty table costs an accept
    /// nothing.
    held: AtomicUsize,
}

impl Default for Offenders {
    fn default() -> Offenders {
        Offenders::with_capacity(CAPACITY)
    }
}

/// The table key of `peer`: IPv4 (also IPv4-mapped IPv6) as it is, IPv6 cut to its
/// first `ipv6_prefix` bits.
pub(crate) fn key(peer: IpAddr, ipv6_prefix: u8) -> IpAddr {
    match peer.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => {
            let bits = u32::from(ipv6_prefix.min(128));
            let mask = u128::MAX.checked_shl(128 - bits).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
        }
    }
}

impl Offenders {
    /// A table remembering at most `capacity` addresses.
    pub(crate) fn with_capacity(capacity: usize) -> Offenders {
        Offenders {
            table: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
            held: AtomicUsize::new(0),
        }
    }

    /// Whether a new connection from `key` is refused at `now`.
    pub(crate) fn blocked(&self, key: IpAddr, now: Instant) -> bool {
        if self.held.load(Ordering::Relaxed) == 0 {
            return false;
        }
        self.table.lock().get(&key).is_some_and(|o| now < o.until)
    }

    /// How long `key` is still blocked at `now`, if it is.
    pub(crate) fn blocked_for(&self, key: IpAddr, now: Instant) -> Option<Duration> {
        if self.held.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let until = self.table.lock().get(&key)?.until;
        until
            .checked_duration_since(now)
            .filter(|left| !left.is_zero())
    }

    /// A connection from `key` was cut for a flood at `now`: blocks it, twice as long
    /// as last time if it flooded again after its last block ended. Returns the block.
    pub(crate) fn flooded(&self, key: IpAddr, now: Instant) -> Duration {
        let mut table = self.table.lock();
        let offence = match table.get(&key).copied() {
            // A connection opened before the block: the block stands.
            Some(last) if now < last.until => last,
            Some(last) if now < last.forgotten_at() => Offence {
                until: now + (last.block * 2).min(LONGEST_BLOCK),
                block: (last.block * 2).min(LONGEST_BLOCK),
            },
            _ => Offence {
                until: now + FIRST_BLOCK,
                block: FIRST_BLOCK,
            },
        };
        if !table.contains_key(&key) && table.len() >= self.capacity {
            make_room(&mut table, self.capacity, now);
        }
        table.insert(key, offence);
        self.held.store(table.len(), Ordering::Relaxed);
        offence.block
    }

    /// How many addresses are refused new connections at `now`
    /// (`sluice_flood_blocked_addresses`).
    pub(crate) fn blocked_count(&self, now: Instant) -> usize {
        if self.held.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        self.table.lock().values().filter(|o| now < o.until).count()
    }
}

/// Frees a place in `table`, full at `capacity`: every forgotten address goes, and
/// if none was, the one that would be forgotten soonest (the shortest, oldest block).
fn make_room(table: &mut HashMap<IpAddr, Offence>, capacity: usize, now: Instant) {
    table.retain(|_, o| now < o.forgotten_at());
    if table.len() < capacity {
        return;
    }
    if let Some(soonest) = (table.iter())
        .min_by_key(|(_, o)| o.forgotten_at())
        .map(|(key, _)| *key)
    {
        table.remove(&soonest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn a_first_flood_blocks_for_a_second() {
        let offenders = Offenders::default();
        let t0 = Instant::now();
        let a = ip("192.0.2.1");
        assert!(!offenders.blocked(a, t0));
        assert_eq!(offenders.flooded(a, t0), FIRST_BLOCK);
        assert!(offenders.blocked(a, t0));
        assert!(offenders.blocked(a, t0 + Duration::from_millis(999)));
        assert!(!offenders.blocked(a, t0 + secs(1)));
        assert!(!offenders.blocked(ip("192.0.2.2"), t0), "only that address");
    }

    #[test]
    fn each_repeat_after_the_block_doubles_it_up_to_ten_minutes() {
        let offenders = Offenders::default();
        let a = ip("192.0.2.1");
        let mut now = Instant::now();
        let mut blocks = Vec::new();
        for _ in 0..12 {
            let block = offenders.flooded(a, now);
            blocks.push(block.as_secs());
            // Let back in when the block ends, and floods again at once.
            now += block;
        }
        assert_eq!(
            blocks,
            [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 600, 600],
            "seconds"
        );
    }

    #[test]
    fn a_flood_on_a_connection_opened_before_the_block_does_not_double_it() {
        let offenders = Offenders::default();
        let a = ip("192.0.2.1");
        let t0 = Instant::now();
        offenders.flooded(a, t0);
        // Nine more connections of the same attack are cut within the second.
        for ms in 1..10 {
            assert_eq!(
                offenders.flooded(a, t0 + Duration::from_millis(ms * 10)),
                FIRST_BLOCK
            );
        }
        assert!(!offenders.blocked(a, t0 + secs(1)));
        assert_eq!(offenders.flooded(a, t0 + secs(1)), secs(2));
    }

    #[test]
    fn an_address_is_forgotten_ten_minutes_after_its_block_ends() {
        let offenders = Offenders::default();
        let a = ip("192.0.2.1");
        let t0 = Instant::now();
        offenders.flooded(a, t0);
        assert_eq!(
            offenders.flooded(a, t0 + FIRST_BLOCK + LONGEST_BLOCK - secs(1)),
            secs(2)
        );
        let later = t0 + secs(2) + FIRST_BLOCK + LONGEST_BLOCK * 2;
        assert_eq!(offenders.flooded(a, later), FIRST_BLOCK);
    }

    #[test]
    fn ipv6_is_keyed_per_prefix_and_ipv4_mapped_as_ipv4() {
        assert_eq!(
            key(ip("2001:db8:1:2:aaaa::1"), 64),
            ip("2001:db8:1:2::"),
            "/64"
        );
        assert_eq!(key(ip("2001:db8:1:2:aaaa::1"), 48), ip("2001:db8:1::"));
        assert_eq!(
            key(ip("2001:db8:1:2:aaaa::1"), 128),
            ip("2001:db8:1:2:aaaa::1")
        );
        assert_eq!(key(ip("::ffff:192.0.2.7"), 64), ip("192.0.2.7"));
        assert_eq!(key(ip("192.0.2.7"), 1), ip("192.0.2.7"));
        let offenders = Offenders::default();
        let t0 = Instant::now();
        offenders.flooded(key(ip("2001:db8::1"), 64), t0);
        assert!(offenders.blocked(key(ip("2001:db8::ffff:2"), 64), t0));
        assert!(!offenders.blocked(key(ip("2001:db8:0:1::1"), 64), t0));
    }

    #[test]
    fn a_full_table_drops_the_soonest_forgotten_address_first() {
        let offenders = Offenders::with_capacity(3);
        let t0 = Instant::now();
        let (a, b, c, d) = (
            ip("192.0.2.1"),
            ip("192.0.2.2"),
            ip("192.0.2.3"),
            ip("192.0.2.4"),
        );
        // `a` has a long block (a repeat), `b` and `c` first ones, `b` the oldest.
        offenders.flooded(a, t0);
        offenders.flooded(a, t0 + Duration::from_millis(1500));
        offenders.flooded(b, t0 + secs(2));
        offenders.flooded(c, t0 + secs(2) + Duration::from_millis(100));
        let now = t0 + secs(2) + Duration::from_millis(200);
        offenders.flooded(d, now);
        assert!(offenders.blocked(a, now), "the longer block is kept");
        assert!(!offenders.blocked(b, now), "the soonest forgotten went");
        assert!(offenders.blocked(c, now));
        assert!(offenders.blocked(d, now));
        assert_eq!(offenders.blocked_count(now), 3);
        assert_eq!(offenders.table.lock().len(), 3);
    }

    #[test]
    fn forgotten_addresses_make_room_before_any_other() {
        let offenders = Offenders::with_capacity(2);
        let t0 = Instant::now();
        offenders.flooded(ip("192.0.2.1"), t0);
        let later = t0 + LONGEST_BLOCK * 2;
        offenders.flooded(ip("192.0.2.2"), later);
        offenders.flooded(ip("192.0.2.3"), later);
        assert!(offenders.blocked(ip("192.0.2.2"), later));
        assert!(offenders.blocked(ip("192.0.2.3"), later));
        assert_eq!(offenders.table.lock().len(), 2);
    }

    #[test]
    fn the_gauge_counts_addresses_blocked_now() {
        let offenders = Offenders::default();
        let t0 = Instant::now();
        assert_eq!(offenders.blocked_count(t0), 0);
        offenders.flooded(ip("192.0.2.1"), t0);
        offenders.flooded(ip("192.0.2.2"), t0 + Duration::from_millis(500));
        assert_eq!(offenders.blocked_count(t0 + Duration::from_millis(600)), 2);
        assert_eq!(offenders.blocked_count(t0 + Duration::from_millis(1200)), 1);
        assert_eq!(offenders.blocked_count(t0 + secs(2)), 0);
    }
}
