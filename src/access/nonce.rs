//! The bounded store of recently seen request-signing nonces (SPEC §8 `hmac`).
//!
//! One store per pool. It owns replay detection and its memory bound, and never
//! evicts a nonce before it expires: dropping one early would let its request be
//! replayed, so a full store refuses new nonces (`503` with `Retry-After`) instead.
//!
//! How long to remember: the caller passes each nonce's expiry, which should be
//! `hmac::Verified::nonce_expires_ms` = timestamp + tolerance + 1, the first
//! instant at which the signed timestamp is outside the tolerance window and a
//! replay would be refused by the timestamp check anyway. That expiry follows
//! the client's timestamp, not the arrival order, so expiries are kept on a
//! hierarchical timer wheel (the server's own `Wheel`): insert and expiry are
//! O(1), and nothing is remembered longer than needed.
//!
//! Nonces are stored as 128-bit keyed hashes (SipHash under two random keys),
//! so an entry is a fixed 24 bytes and inserting allocates nothing once the
//! table has grown; a collision would need 2^64 stored nonces to become likely.
//!
//! Expired entries are purged incrementally: each insert takes at most
//! [`PURGE_PER_INSERT`] expired entries off the wheel, and more only when the
//! store is full and room is needed, so no request pays for a mass expiry it
//! did not need. An expired entry still present answers as absent. Only
//! MAC-verified nonces may be inserted, or an unauthenticated client could fill
//! the store.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};

use crate::wheel::Wheel;

/// Expired entries taken off per insert when there is room: more than one, so
/// the purge outruns the at most one entry each insert adds.
pub const PURGE_PER_INSERT: usize = 2;

/// Why a nonce was not accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NonceError {
    /// Seen before and not yet expired: the request is a replay (`401`).
    Replay,
    /// Every slot holds an unexpired nonce (`503`); the first frees in
    /// `retry_after_ms` (at least 1): the earliest expiry, so a client that
    /// waits that long finds room.
    Full { retry_after_ms: u64 },
}

/// A nonce's 128-bit keyed hash.
type Key = u128;

/// Keys are already uniform hashes: the table uses their low bits as they are.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ b as u64;
        }
    }

    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

/// Remembers up to `capacity` unexpired nonces.
pub struct NonceStore {
    capacity: usize,
    /// Key → expiry (exclusive, epoch ms). May hold expired entries not yet purged.
    expiries: HashMap<Key, u64, BuildHasherDefault<KeyHasher>>,
    /// (key, expiry) at each expiry. An entry whose expiry no longer matches
    /// `expiries` is stale: its nonce expired and was inserted again since.
    wheel: Wheel<(Key, u64)>,
    /// The latest time the store was asked at: a time before it means the
    /// wall clock was set back (see `rewind`).
    latest_ms: u64,
    hashers: (RandomState, RandomState),
}

impl std::fmt::Debug for NonceStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NonceStore").field("capacity", &self.capacity).field("len", &self.len()).finish()
    }
}

impl NonceStore {
    /// A store holding at most `capacity` nonces; a capacity of 0 is taken as 1.
    pub fn new(capacity: usize) -> NonceStore {
        NonceStore {
            capacity: capacity.max(1),
            expiries: HashMap::default(),
            wheel: Wheel::new(),
            latest_ms: 0,
            hashers: (RandomState::new(), RandomState::new()),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Entries held, expired ones not yet purged included.
    pub fn len(&self) -> usize {
        self.expiries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.expiries.is_empty()
    }

    fn key(&self, nonce: &[u8]) -> Key {
        let (a, b) = (self.hashers.0.hash_one(nonce), self.hashers.1.hash_one(nonce));
        (a as u128) << 64 | b as u128
    }

    /// Records `nonce` as used until `expires_ms` (exclusive).
    ///
    /// A nonce whose expiry is not after `now_ms` is accepted without being
    /// stored: its timestamp already rules out any replay.
    pub fn insert(&mut self, nonce: &[u8], now_ms: u64, expires_ms: u64) -> Result<(), NonceError> {
        self.purge(now_ms, PURGE_PER_INSERT);
        let key = self.key(nonce);
        let known = match self.expiries.get(&key) {
            Some(&expiry) if expiry > now_ms => return Err(NonceError::Replay),
            Some(_) => true,
            None => false,
        };
        if expires_ms <= now_ms {
            return Ok(());
        }
        if !known && self.expiries.len() >= self.capacity {
            self.purge(now_ms, usize::MAX);
            if self.expiries.len() >= self.capacity {
                // Every entry left is live (the purge took the expired ones).
                let next = self.wheel.earliest_deadline().unwrap_or(now_ms + 1);
                return Err(NonceError::Full { retry_after_ms: next.saturating_sub(now_ms).max(1) });
            }
        }
        // Replacing an expired, unpurged entry leaves its wheel entry stale; the
        // purge recognises it by the mismatched expiry.
        self.expiries.insert(key, expires_ms);
        self.wheel.insert(expires_ms, (key, expires_ms));
        debug_assert!(known || self.expiries.len() <= self.capacity);
        Ok(())
    }

    /// A new capacity (a reload). Entries beyond a smaller capacity are kept
    /// until they expire — dropping one would reopen its replay — and new
    /// nonces are refused meanwhile.
    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity.max(1);
    }

    /// The wall clock was set back to `now_ms`: the wheel, which has passed
    /// the time before the step, would hold every expiry back until the
    /// clock came there again, so nonces expiring meanwhile would stay and
    /// fill the store (`503` with a `Retry-After` that never comes true).
    /// The unexpired entries are laid out again from `now_ms` and the
    /// expired ones dropped. O(n), once per backward step.
    fn rewind(&mut self, now_ms: u64) {
        self.expiries.retain(|_, &mut expiry| expiry > now_ms);
        self.wheel = Wheel::new();
        // An empty wheel polled at `now_ms` starts from there.
        let nothing = self.wheel.poll(now_ms);
        debug_assert!(nothing.is_none());
        for (&key, &expiry) in &self.expiries {
            self.wheel.insert(expiry, (key, expiry));
        }
    }

    /// Makes every remembered nonce live `delta_ms` longer: a reload widened
    /// the tolerance window, so a replay stays acceptable for longer. O(n),
    /// once per reload.
    pub fn extend_expiries(&mut self, delta_ms: u64) {
        self.wheel = Wheel::new();
        for (&key, expiry) in self.expiries.iter_mut() {
            *expiry = expiry.saturating_add(delta_ms);
            self.wheel.insert(*expiry, (key, *expiry));
        }
    }

    /// Takes up to `limit` expired entries off the wheel.
    fn purge(&mut self, now_ms: u64, limit: usize) {
        if now_ms < self.latest_ms {
            self.rewind(now_ms);
        }
        self.latest_ms = now_ms;
        for _ in 0..limit {
            let Some((key, expiry)) = self.wheel.poll(now_ms) else {
                return;
            };
            if self.expiries.get(&key) == Some(&expiry) {
                self.expiries.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn resizing_and_extending_keep_what_was_remembered() {
        let mut s = NonceStore::new(3);
        for n in [b"a", b"b", b"c"] {
            s.insert(n, 0, 100).unwrap();
        }
        s.set_capacity(1);
        assert_eq!(s.insert(b"a", 10, 110), Err(NonceError::Replay));
        assert!(matches!(s.insert(b"d", 10, 110), Err(NonceError::Full { .. })));
        s.extend_expiries(50);
        assert_eq!(s.insert(b"b", 120, 220), Err(NonceError::Replay), "lives until 150 now");
        assert_eq!(s.insert(b"b", 150, 250), Ok(()));
    }

    #[test]
    fn a_clock_set_back_frees_what_expires_after_the_step_and_keeps_what_lives() {
        let t0 = 1_710_000_000_000;
        let mut s = NonceStore::new(3);
        assert_eq!(s.insert(b"old", t0, t0 + 200_001), Ok(()));
        // The wall clock is set back two minutes.
        let back = t0 - 120_000;
        assert_eq!(s.insert(b"a", back, back + 60_001), Ok(()));
        assert_eq!(s.insert(b"b", back, back + 60_001), Ok(()));
        assert!(matches!(s.insert(b"c", back + 1, back + 60_002), Err(NonceError::Full { .. })));
        // a and b expired a second ago, before the clock is back where it was.
        let later = back + 61_001;
        assert_eq!(s.insert(b"c", later, later + 60_001), Ok(()));
        assert_eq!(s.insert(b"a", later, later + 60_001), Ok(()), "a expired");
        // What was remembered before the step lives on.
        assert_eq!(s.insert(b"old", later, later + 60_001), Err(NonceError::Replay));
        assert_eq!(s.insert(b"c", later + 1, later + 60_002), Err(NonceError::Replay));
    }

    #[test]
    fn replay_is_refused_until_expiry() {
        let mut s = NonceStore::new(10);
        assert_eq!(s.insert(b"a", 0, 100), Ok(()));
        assert_eq!(s.insert(b"a", 50, 150), Err(NonceError::Replay));
        assert_eq!(s.insert(b"a", 99, 199), Err(NonceError::Replay));
        assert_eq!(s.insert(b"b", 99, 199), Ok(()));
        // Expired: the same nonce may be used again.
        assert_eq!(s.insert(b"a", 100, 200), Ok(()));
        assert_eq!(s.insert(b"a", 150, 250), Err(NonceError::Replay));
    }

    #[test]
    fn full_store_refuses_with_retry_after() {
        let mut s = NonceStore::new(2);
        assert_eq!(s.insert(b"a", 0, 300), Ok(()));
        assert_eq!(s.insert(b"b", 10, 200), Ok(()));
        // The earliest expiry is b's at 200, not a's, though a came first:
        // the hint is exactly the wait until it.
        assert_eq!(s.insert(b"c", 50, 400), Err(NonceError::Full { retry_after_ms: 150 }));
        // A replay is still reported as a replay when full.
        assert_eq!(s.insert(b"a", 50, 400), Err(NonceError::Replay));
        assert_eq!(s.insert(b"c", 199, 400), Err(NonceError::Full { retry_after_ms: 1 }));
        // Once b expires there is room; a is never evicted.
        assert_eq!(s.insert(b"c", 200, 400), Ok(()));
        assert_eq!(s.insert(b"a", 250, 500), Err(NonceError::Replay));
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn already_expired_nonce_is_not_stored() {
        let mut s = NonceStore::new(1);
        assert_eq!(s.insert(b"a", 100, 100), Ok(()));
        assert!(s.is_empty());
        assert_eq!(s.insert(b"b", 100, 101), Ok(()));
    }

    #[test]
    fn zero_capacity_means_one() {
        let mut s = NonceStore::new(0);
        assert_eq!(s.capacity(), 1);
        assert_eq!(s.insert(b"a", 0, 10), Ok(()));
        assert!(matches!(s.insert(b"b", 0, 10), Err(NonceError::Full { retry_after_ms: 1..=10 })));
    }

    #[test]
    fn reinserted_nonce_leaves_a_stale_entry_that_is_ignored() {
        let mut s = NonceStore::new(10);
        for (i, exp) in [(b"x1", 1), (b"x2", 2), (b"x3", 3)] {
            assert_eq!(s.insert(i, 0, exp), Ok(()));
        }
        assert_eq!(s.insert(b"a", 0, 4), Ok(()));
        // At 10 only x1 and x2 are purged; a is expired but still held, and is
        // replaced in place, leaving (4, a) stale in the heap.
        assert_eq!(s.insert(b"a", 10, 1000), Ok(()));
        assert_eq!(s.len(), 2);
        // This purge takes x3 and the stale (4, a), which must not remove the live a.
        assert_eq!(s.insert(b"b", 11, 20), Ok(()));
        assert_eq!(s.len(), 2);
        assert_eq!(s.insert(b"a", 500, 2000), Err(NonceError::Replay));
    }

    #[test]
    fn purge_work_per_insert_is_bounded_when_not_full() {
        let mut s = NonceStore::new(1000);
        for i in 0..100u32 {
            s.insert(&i.to_be_bytes(), 0, 10).unwrap();
        }
        s.insert(b"x", 10, 20).unwrap();
        // Only PURGE_PER_INSERT of the 100 expired entries were popped.
        assert_eq!(s.len(), 101 - PURGE_PER_INSERT);
    }

    /// Reference model: a plain list scanned on every call.
    #[derive(Default)]
    struct Model {
        entries: Vec<(Vec<u8>, u64)>,
    }

    impl Model {
        fn insert(&mut self, cap: usize, nonce: &[u8], now: u64, exp: u64) -> Result<(), NonceError> {
            self.entries.retain(|(_, e)| *e > now);
            if self.entries.iter().any(|(n, _)| n == nonce) {
                return Err(NonceError::Replay);
            }
            if exp <= now {
                return Ok(());
            }
            if self.entries.len() >= cap {
                let oldest = self.entries.iter().map(|(_, e)| *e).min().unwrap();
                return Err(NonceError::Full { retry_after_ms: oldest - now });
            }
            self.entries.push((nonce.to_vec(), exp));
            Ok(())
        }
    }

    proptest! {
        #[test]
        fn matches_reference_model(
            cap in 1usize..6,
            ops in prop::collection::vec((0u8..8, 0u64..20, 0u64..40), 1..200),
        ) {
            let mut store = NonceStore::new(cap);
            let mut model = Model::default();
            let mut now = 0;
            for (nonce, step, life) in ops {
                now += step;
                let key = [nonce];
                prop_assert_eq!(store.insert(&key, now, now + life), model.insert(cap, &key, now, now + life));
            }
        }
    }
}
