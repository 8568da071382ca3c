//! Idempotent acquire (SPEC §11): one pool's store from an `Idempotency-Key`
//! to the grant or the queued acquire it produced.
//!
//! A key lives exactly as long as what it names: it is removed when its
//! lease is released or reclaimed, or when its waiter leaves the queue
//! without a slot. The store is bounded by the pool's `idempotencyKeys`; a
//! new key beyond it is refused, never made room for by evicting a live one
//! (that would hand the evicted caller's retry a second slot). Both tables
//! are allocated once, at the pool's first keyed acquire, with room for the
//! whole bound, so a keyed acquire allocates nothing after that; lookup,
//! insert and removal are O(1).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use slab::Slab;

use super::queue::WaiterKey;
pub use super::queue::NO_KEY;

/// The longest key accepted, in bytes.
pub const MAX_KEY_BYTES: usize = 128;

/// A key as the store holds it, inline: the caller's credential (a hash of
/// the pool key it presented, so one caller cannot pick up another's grant)
/// and the key's bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct IdemKey {
    credential: u64,
    len: u8,
    bytes: [u8; MAX_KEY_BYTES],
}

impl Hash for IdemKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.credential);
        state.write(&self.bytes[..self.len as usize]);
    }
}

impl std::fmt::Debug for IdemKey {
    /// Only the length: keys may be secrets of the caller's.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IdemKey({} bytes)", self.len)
    }
}

impl IdemKey {
    /// The key, if it is 1–128 printable ASCII characters (space included).
    pub fn new(credential: u64, key: &[u8]) -> Option<IdemKey> {
        if key.is_empty() || key.len() > MAX_KEY_BYTES || !key.iter().all(|b| (0x20..0x7f).contains(b)) {
            return None;
        }
        let mut bytes = [0u8; MAX_KEY_BYTES];
        bytes[..key.len()].copy_from_slice(key);
        Some(IdemKey { credential, len: key.len() as u8, bytes })
    }

    /// The hash of the pool key that presented it.
    pub fn credential(&self) -> u64 {
        self.credential
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

/// What a live key names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// A held lease, by its place in the lease table.
    Lease(u32),
    /// An acquire still in the queue.
    Waiter(WaiterKey),
}

/// The most live keys a store makes room for at its first key: the
/// default bound, so a pool of default settings allocates once.
const RESERVED: usize = 1024;

/// One pool's keys.
#[derive(Default)]
pub struct Store {
    capacity: usize,
    entries: Slab<(IdemKey, Holder)>,
    index: HashMap<IdemKey, u32>,
}

impl Store {
    pub fn new(capacity: u32) -> Store {
        Store { capacity: capacity as usize, ..Store::default() }
    }

    /// A reload's new bound; keys above it stay until they expire.
    pub fn set_capacity(&mut self, capacity: u32) {
        self.capacity = capacity as usize;
    }

    /// Gives back the room made at the first key when no key is live (a
    /// pool a reload removed, drained): made again at the next key, if any.
    pub fn shed(&mut self) {
        if self.entries.is_empty() && self.entries.capacity() > 0 {
            self.entries = Slab::new();
            self.index = HashMap::default();
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn is_full(&self) -> bool {
        self.entries.len() >= self.capacity
    }

    /// The entry of `key` and what it names.
    pub fn find(&self, key: &IdemKey) -> Option<(u32, Holder)> {
        let &entry = self.index.get(key)?;
        Some((entry, self.entries[entry as usize].1))
    }

    /// Adds a key the caller found absent, the store not full; returns its entry.
    pub fn insert(&mut self, key: IdemKey, holder: Holder) -> u32 {
        debug_assert!(!self.is_full());
        self.put(key, holder)
    }

    /// Takes back the key of a lease a snapshot holds: past a bound lowered
    /// since, too, as a reload keeps it. A live key is never dropped, since
    /// its caller's retry would take a second slot; new keys wait for room.
    pub fn restore(&mut self, key: IdemKey, holder: Holder) -> u32 {
        self.put(key, holder)
    }

    fn put(&mut self, key: IdemKey, holder: Holder) -> u32 {
        debug_assert!(!self.index.contains_key(&key));
        if self.entries.capacity() == 0 {
            // Once, with room for the bound up to `RESERVED`: twice that in
            // the map keeps removals from ever making it grow (tombstones are
            // cleared in place). A larger bound is grown into as keys are
            // used: reserved whole, 10 000 000 keys took 6.5 GB at the first
            // keyed acquire, which a smaller machine refuses (the process aborts).
            let room = self.capacity.min(RESERVED);
            self.entries.reserve_exact(room);
            self.index.reserve(2 * room);
        }
        let entry = self.entries.insert((key, holder)) as u32;
        self.index.insert(key, entry);
        entry
    }

    /// Whether the store holds room for keys (made at its first key).
    pub fn has_room(&self) -> bool {
        self.entries.capacity() > 0
    }

    /// The key of a live entry.
    pub fn key(&self, entry: u32) -> &IdemKey {
        &self.entries[entry as usize].0
    }

    /// The waiter of `entry` was granted lease `lease`.
    pub fn hold(&mut self, entry: u32, lease: u32) {
        self.entries[entry as usize].1 = Holder::Lease(lease);
    }

    /// What `entry` named ended: the key expires with it.
    pub fn remove(&mut self, entry: u32) {
        let (key, _) = self.entries.remove(entry as usize);
        self.index.remove(&key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::governor::Leaving;

    #[test]
    fn keys_are_bounded_printable_and_scoped_by_credential() {
        assert!(IdemKey::new(1, b"").is_none());
        assert!(IdemKey::new(1, &[b'a'; 129]).is_none());
        assert!(IdemKey::new(1, b"tab\there").is_none());
        assert!(IdemKey::new(1, "caf\u{e9}".as_bytes()).is_none());
        assert!(IdemKey::new(1, &[b'a'; 128]).is_some());
        assert!(IdemKey::new(1, b"order 42 / retry").is_some());
        assert_ne!(IdemKey::new(1, b"k"), IdemKey::new(2, b"k"));
    }

    #[test]
    fn a_full_store_keeps_its_keys_until_they_expire() {
        let mut s = Store::new(2);
        let (a, b, c) =
            (IdemKey::new(0, b"a").unwrap(), IdemKey::new(0, b"b").unwrap(), IdemKey::new(0, b"c").unwrap());
        let ea = s.insert(a, Holder::Waiter(WaiterKey(4)));
        s.insert(b, Holder::Lease(9));
        assert!(s.is_full());
        assert_eq!(s.find(&c), None);
        s.hold(ea, 3);
        assert_eq!(s.find(&a), Some((ea, Holder::Lease(3))));
        s.remove(ea);
        assert_eq!(s.find(&a), None);
        assert!(!s.is_full());
        s.insert(c, Holder::Lease(1));
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn a_large_bound_is_grown_into_not_allocated_at_the_first_key() {
        let mut s = Store::new(10_000_000);
        s.insert(IdemKey::new(0, b"first").unwrap(), Holder::Lease(0));
        assert!(s.entries.capacity() <= RESERVED, "{} entries reserved", s.entries.capacity());
        assert!(s.index.capacity() <= 4 * RESERVED, "{} map entries reserved", s.index.capacity());
        for i in 1..5000u32 {
            s.insert(IdemKey::new(0, format!("k{i}").as_bytes()).unwrap(), Holder::Lease(i));
        }
        assert_eq!(s.len(), 5000);
        assert!(!s.is_full());
        // The default bound is reserved whole at once, as before.
        let mut d = Store::new(1024);
        d.insert(IdemKey::new(0, b"first").unwrap(), Holder::Lease(0));
        assert!(d.entries.capacity() >= 1024 && d.index.capacity() >= 2048);
    }

    use crate::config::Config;
    use crate::governor::{Admission, Governor, KeyStoreFull, Notice, PoolId};

    fn governor(pool: &str) -> (Governor, PoolId) {
        let json = format!(r#"{{"pools":{{"p":{{"keys":["k"],"termMs":1000,"renewIntervalMs":300,{pool}}}}}}}"#);
        let settings = crate::api::pool_settings(&Config::parse(json.as_bytes()).unwrap());
        let g = Governor::new(&settings, crate::governor::Entropy::seeded(1));
        let p = g.pool_id("p").unwrap();
        (g, p)
    }

    fn key(text: &str) -> IdemKey {
        IdemKey::new(7, text.as_bytes()).unwrap()
    }

    fn slot(a: Result<Admission, KeyStoreFull>) -> crate::governor::lease::SlotId {
        match a {
            Ok(Admission::Granted(g)) => g.slot,
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    #[test]
    fn the_same_key_is_the_same_grant_until_its_lease_ends() {
        let (mut g, p) = governor(r#""concurrency":2"#);
        let first = slot(g.acquire_keyed(p, &key("a"), 0, 1, 0));
        assert_eq!(slot(g.acquire_keyed(p, &key("a"), 0, 2, 10)), first);
        assert_eq!(g.pool(p).held, 1);
        assert_eq!(g.pool(p).stats.idempotent_replays, 1);
        assert_ne!(slot(g.acquire_keyed(p, &key("b"), 0, 3, 10)), first);
        assert!(g.release(p, &first.encode(), None, 20));
        assert_eq!(g.pool(p).idem.len(), 1, "the key expired with its lease");
        let again = slot(g.acquire_keyed(p, &key("a"), 0, 4, 20));
        assert_ne!(again, first);
        // Reclaimed at its term: the key goes with it, even before the wheel runs.
        let next = slot(g.acquire_keyed(p, &key("a"), 0, 5, 2000));
        assert_ne!(next, again);
        g.advance(5000);
        assert!(g.pool(p).idem.is_empty());
    }

    #[test]
    fn a_retry_while_queued_takes_the_first_attempts_place() {
        let (mut g, p) = governor(r#""concurrency":1"#);
        let holder = slot(g.acquire_keyed(p, &key("h"), 0, 1, 0));
        let Ok(Admission::Queued(w)) = g.acquire_keyed(p, &key("q"), 5000, 2, 0) else { panic!("queued") };
        let Admission::Queued(_) = g.acquire(p, 5000, 3, 0) else { panic!("queued") };
        let Ok(Admission::Queued(again)) = g.acquire_keyed(p, &key("q"), 5000, 4, 10) else { panic!("queued") };
        assert_eq!(again, w, "the same place in the queue");
        assert!(matches!(g.pop_notice(), Some(Notice::Superseded { owner: 2 })));
        assert_eq!(g.pool(p).queue.len(), 2);
        // The earlier owner can no longer cancel it.
        g.cancel_waiter(w, 2, Leaving::ClientGone);
        assert_eq!(g.pool(p).queue.len(), 2);
        assert!(g.release(p, &holder.encode(), None, 20));
        let Some(Notice::Granted { owner: 4, grant }) = g.pop_notice() else { panic!("the retry is granted first") };
        assert_eq!(slot(g.acquire_keyed(p, &key("q"), 0, 5, 30)), grant.slot, "the key now names the grant");
    }

    #[test]
    fn a_waiter_that_leaves_frees_its_key_and_a_full_store_refuses_new_keys() {
        let (mut g, p) = governor(r#""concurrency":1,"idempotencyKeys":2"#);
        slot(g.acquire_keyed(p, &key("h"), 0, 1, 0));
        let Ok(Admission::Queued(w)) = g.acquire_keyed(p, &key("q"), 100, 2, 0) else { panic!("queued") };
        assert_eq!(g.acquire_keyed(p, &key("new"), 0, 3, 0).unwrap_err(), KeyStoreFull { capacity: 2 });
        g.advance(101);
        assert!(matches!(g.pop_notice(), Some(Notice::TimedOut { owner: 2, .. })));
        assert_eq!(g.pool(p).idem.len(), 1, "a timed-out waiter's key expires");
        let Ok(Admission::Queued(w2)) = g.acquire_keyed(p, &key("q"), 100, 4, 100) else { panic!("queued") };
        g.cancel_waiter(w2, 4, Leaving::ClientGone);
        assert_eq!(g.pool(p).idem.len(), 1, "a cancelled waiter's key expires");
        let _ = w;
        assert!(matches!(g.acquire_keyed(p, &key("new"), 0, 5, 100), Ok(Admission::Denied(_))));
        assert_eq!(g.pool(p).idem.len(), 1, "a denied acquire keeps no key");
    }
}
