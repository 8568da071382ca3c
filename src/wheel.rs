//! The one hierarchical timer wheel behind every deadline in the server.
//!
//! Lease terms, queue deadlines, rate refills, cool-down ends and connection
//! timeouts all live here. The wheel only sees `u64` ticks of one millisecond;
//! converting from the monotonic clock happens at the edge (`clock.rs`).
//!
//! Layout (after tokio's `runtime/time/wheel`): six levels of 64 slots. Level
//! `L` slots span `64^L` ticks, so the wheel covers 64^6 ms (about 2.2 years);
//! later deadlines are clamped to just short of it. An entry's level is picked from
//! the highest bit in which its deadline differs from the wheel's current time,
//! and each level keeps an `occupied` bitmap, so finding the next expiry is a
//! `trailing_zeros` per level. Entries live in a `slab` and are threaded into
//! their slot through intrusive `prev`/`next` indices, which makes insert and
//! cancel O(1) without `unsafe`.
//!
//! The wheel never reads a clock: `poll(now)` is told the time.

use slab::Slab;

const LEVELS: usize = 6;
const SLOT_BITS: u32 = 6;
const SLOTS: usize = 1 << SLOT_BITS;
const SLOT_MASK: u64 = (SLOTS as u64) - 1;
/// The span of the whole wheel, less one tick.
const HORIZON: u64 = (1 << (SLOT_BITS as usize * LEVELS)) - 1;
/// The furthest a deadline may lie ahead of the wheel's time: one top-level
/// slot short of the horizon, so an entry past the top level's wrap never
/// shares the slot the wheel's time is in (that slot would be due at once,
/// hand the entry back to itself, and `poll` would never return).
const REACH: u64 = HORIZON - (1 << (SLOT_BITS as usize * (LEVELS - 1)));
const NIL: u32 = u32::MAX;

/// Handle to a scheduled entry: its place in the slab and the serial of
/// the insert that made it. Once the entry has fired or been cancelled the
/// key cancels nothing, even after its place holds another entry: an owner
/// hears of a firing only later (a connection's timer comes out of `poll`
/// as a notice the reactor handles after the turn's events), and meanwhile
/// may cancel what it still takes for its own timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimerKey {
    idx: u32,
    serial: u32,
}

struct Entry<T> {
    deadline: u64,
    /// The insert that made it (`TimerKey::serial`).
    serial: u32,
    prev: u32,
    next: u32,
    /// Level and slot the entry is linked into; unused while pending, when
    /// `prev`/`next` thread it into the pending list instead.
    level: u8,
    slot: u8,
    pending: bool,
    payload: T,
}

#[derive(Clone, Copy)]
struct Level {
    occupied: u64,
    heads: [u32; SLOTS],
}

pub struct Wheel<T> {
    /// The time up to which every slot has been processed.
    elapsed: u64,
    levels: [Level; LEVELS],
    entries: Slab<Entry<T>>,
    /// Entries whose deadline has passed, waiting to be handed out by `poll`:
    /// an intrusive list in deadline order, first out at `pending_head`, so
    /// cancelling one (a reclaim that grants a waiter whose own deadline is
    /// in the same tick) is O(1) however many fired together.
    pending_head: u32,
    pending_tail: u32,
    /// The entries of the slot being processed, sorted before they join
    /// `pending` (kept, so a burst allocates once).
    fired: Vec<u32>,
    /// Never later than the earliest slot expiry (`u64::MAX`: no entry).
    /// Exact after a `poll` that found nothing due; an insert can only
    /// lower it; a cancel leaves it, early. A poll before it has nothing to
    /// do, so most polls and `next_deadline` skip the scan of the levels.
    next_at: u64,
    /// The serial of the last insert.
    serial: u32,
}

impl<T> Default for Wheel<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Wheel<T> {
    pub fn new() -> Self {
        Wheel {
            elapsed: 0,
            levels: [Level { occupied: 0, heads: [NIL; SLOTS] }; LEVELS],
            entries: Slab::new(),
            pending_head: NIL,
            pending_tail: NIL,
            fired: Vec::new(),
            next_at: u64::MAX,
            serial: 0,
        }
    }

    /// Number of scheduled entries (fired-but-unpolled ones included).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Schedules `payload` to come out of `poll` once `now >= deadline`.
    /// A deadline already in the past fires on the next `poll`.
    pub fn insert(&mut self, deadline: u64, payload: T) -> TimerKey {
        self.serial = self.serial.wrapping_add(1);
        let serial = self.serial;
        let entry = Entry { deadline, serial, prev: NIL, next: NIL, level: 0, slot: 0, pending: false, payload };
        let idx = u32::try_from(self.entries.insert(entry)).expect("timer wheel holds fewer than 2^32 entries");
        self.link(idx);
        TimerKey { idx, serial }
    }

    /// Removes an entry that has not fired yet and returns its payload;
    /// `None` for a key whose entry fired or was cancelled already.
    pub fn cancel(&mut self, key: TimerKey) -> Option<T> {
        let idx = key.idx;
        let entry = self.entries.get(idx as usize).filter(|e| e.serial == key.serial)?;
        if entry.pending {
            // Fired in this poll round but not handed out yet.
            self.unlink_pending(idx);
        } else {
            self.unlink(idx);
        }
        Some(self.entries.remove(idx as usize).payload)
    }

    /// The deadline of the earliest entry, or `None` when the wheel is empty.
    /// Exact for level 0; for higher levels it is the start of the slot, which
    /// is never later than the entry itself, so a poll at that time is safe.
    /// After a cancel it may be earlier still (the cancelled entry's time)
    /// until the next `poll` that finds nothing due: early, never late.
    pub fn next_deadline(&self) -> Option<u64> {
        if self.pending_head != NIL {
            return Some(self.elapsed);
        }
        match self.next_at {
            _ if self.entries.is_empty() => None,
            u64::MAX => None,
            at => Some(at.max(self.elapsed)),
        }
    }

    /// The deadline of the earliest entry, exactly (`next_deadline` may be
    /// early): the earliest slot's entries are walked, so this costs that
    /// slot's length; for rare answers such as a retry hint, not for polling.
    pub fn earliest_deadline(&self) -> Option<u64> {
        if self.pending_head != NIL {
            return Some(self.entries[self.pending_head as usize].deadline);
        }
        let (level, slot, _) = self.next_expiration()?;
        let mut idx = self.levels[level].heads[slot];
        let mut earliest = u64::MAX;
        while idx != NIL {
            let entry = &self.entries[idx as usize];
            earliest = earliest.min(entry.deadline);
            idx = entry.next;
        }
        Some(earliest)
    }

    /// Hands out one payload whose deadline is `<= now`, or `None` once no
    /// more are due. Call repeatedly until `None`.
    pub fn poll(&mut self, now: u64) -> Option<T> {
        self.due_at(now)?;
        let idx = self.pending_head;
        self.unlink_pending(idx);
        Some(self.entries.remove(idx as usize).payload)
    }

    /// The deadline of the entry `poll(now)` would hand out next, left in
    /// the wheel (a cancel still removes it); `None` once no more are due.
    /// Entries come out in deadline order, so a caller can tell where the
    /// entries of one tick end.
    ///
    /// Every event-loop turn asks it, and almost always nothing is due: that
    /// answer is the few instructions inlined here, the search the call below.
    #[inline]
    pub fn due_at(&mut self, now: u64) -> Option<u64> {
        if self.pending_head == NIL && now < self.next_at {
            self.elapsed = self.elapsed.max(now);
            return None;
        }
        self.find_due(now)
    }

    /// `due_at` past its quick answer: cascades the slots that came due.
    fn find_due(&mut self, now: u64) -> Option<u64> {
        loop {
            if self.pending_head != NIL {
                return Some(self.entries[self.pending_head as usize].deadline);
            }
            if now < self.next_at {
                self.elapsed = self.elapsed.max(now);
                return None;
            }
            match self.next_expiration() {
                Some((level, slot, at)) if at <= now => {
                    self.elapsed = self.elapsed.max(at);
                    self.process_slot(level, slot, now);
                }
                next => {
                    self.next_at = next.map_or(u64::MAX, |(_, _, at)| at);
                    self.elapsed = self.elapsed.max(now);
                    return None;
                }
            }
        }
    }

    /// Moves the slot's entries due at its start (`elapsed`) to `pending`
    /// and cascades the others to a lower level. A higher-level slot's later
    /// deadlines are not handed out with its first, even when `now` has
    /// passed them: an entry inserted meanwhile (a renewed lease's timer
    /// armed again, due already) would come out after them, out of order.
    /// Only an entry beyond the wheel's reach (clamped when linked), which
    /// cascading would bring one reach nearer at a time, fires once `now`
    /// has passed it.
    fn process_slot(&mut self, level: usize, slot: usize, now: u64) {
        let mut idx = self.levels[level].heads[slot];
        self.levels[level].heads[slot] = NIL;
        self.levels[level].occupied &= !(1u64 << slot);
        let mut fired = std::mem::take(&mut self.fired);
        while idx != NIL {
            let entry = &mut self.entries[idx as usize];
            let next = entry.next;
            entry.prev = NIL;
            entry.next = NIL;
            if entry.deadline <= self.elapsed || entry.deadline <= now && entry.deadline - self.elapsed > REACH {
                fired.push(idx);
            } else {
                // Cascades to a lower level relative to the new `elapsed`.
                self.link(idx);
            }
            idx = next;
        }
        // Entries inserted with a deadline already past share the slot of
        // `elapsed` with its own: hand them out in deadline order. Slots are
        // processed in time order, so this keeps the order across slots too.
        let entries = &self.entries;
        fired.sort_unstable_by_key(|&i| entries[i as usize].deadline);
        for &i in &fired {
            self.push_pending(i);
        }
        fired.clear();
        self.fired = fired;
    }

    fn push_pending(&mut self, idx: u32) {
        let tail = self.pending_tail;
        let entry = &mut self.entries[idx as usize];
        entry.pending = true;
        entry.prev = tail;
        entry.next = NIL;
        if tail == NIL {
            self.pending_head = idx;
        } else {
            self.entries[tail as usize].next = idx;
        }
        self.pending_tail = idx;
    }

    fn unlink_pending(&mut self, idx: u32) {
        let (prev, next) = {
            let e = &self.entries[idx as usize];
            (e.prev, e.next)
        };
        if prev == NIL {
            self.pending_head = next;
        } else {
            self.entries[prev as usize].next = next;
        }
        if next == NIL {
            self.pending_tail = prev;
        } else {
            self.entries[next as usize].prev = prev;
        }
    }

    fn next_expiration(&self) -> Option<(usize, usize, u64)> {
        for level in 0..LEVELS {
            let occupied = self.levels[level].occupied;
            if occupied == 0 {
                continue;
            }
            let shift = SLOT_BITS as usize * level;
            let slot_range = 1u64 << shift;
            let level_range = slot_range << SLOT_BITS;
            let now_slot = ((self.elapsed >> shift) & SLOT_MASK) as u32;
            let slot = (occupied.rotate_right(now_slot).trailing_zeros() + now_slot) as usize % SLOTS;
            let level_start = self.elapsed & !(level_range - 1);
            let mut at = level_start + slot as u64 * slot_range;
            if at + slot_range <= self.elapsed {
                // Only the top level wraps: its slots act as a ring beyond the horizon.
                at += level_range;
            }
            return Some((level, slot, at.max(self.elapsed)));
        }
        None
    }

    fn link(&mut self, idx: u32) {
        let elapsed = self.elapsed;
        let entry = &mut self.entries[idx as usize];
        let when = entry.deadline.clamp(elapsed, elapsed.saturating_add(REACH));
        let level = level_for(elapsed, when);
        let slot = ((when >> (SLOT_BITS as usize * level)) & SLOT_MASK) as usize;
        let head = self.levels[level].heads[slot];
        entry.level = level as u8;
        entry.slot = slot as u8;
        entry.prev = NIL;
        entry.next = head;
        if head != NIL {
            self.entries[head as usize].prev = idx;
        }
        self.levels[level].heads[slot] = idx;
        self.levels[level].occupied |= 1u64 << slot;
        // The start of the entry's slot: never later than the slot's expiry.
        let slot_start = when & !((1u64 << (SLOT_BITS as usize * level)) - 1);
        self.next_at = self.next_at.min(slot_start);
    }

    fn unlink(&mut self, idx: u32) {
        let (prev, next, level, slot) = {
            let e = &self.entries[idx as usize];
            (e.prev, e.next, e.level as usize, e.slot as usize)
        };
        if prev == NIL {
            self.levels[level].heads[slot] = next;
            if next == NIL {
                self.levels[level].occupied &= !(1u64 << slot);
            }
        } else {
            self.entries[prev as usize].next = next;
        }
        if next != NIL {
            self.entries[next as usize].prev = prev;
        }
    }
}

/// The level whose slot width matches the highest differing bit between the
/// wheel's time and the deadline.
fn level_for(elapsed: u64, when: u64) -> usize {
    let masked = ((elapsed ^ when) | SLOT_MASK).min(HORIZON);
    let significant = 63 - masked.leading_zeros() as usize;
    significant / SLOT_BITS as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(w: &mut Wheel<u32>, now: u64) -> Vec<u32> {
        let mut out = Vec::new();
        while let Some(p) = w.poll(now) {
            out.push(p);
        }
        out.sort_unstable();
        out
    }

    #[test]
    fn fires_at_deadline_not_before() {
        let mut w = Wheel::new();
        w.insert(5, 1);
        w.insert(70, 2);
        w.insert(5000, 3);
        assert_eq!(drain(&mut w, 4), Vec::<u32>::new());
        assert_eq!(w.next_deadline(), Some(5));
        assert_eq!(drain(&mut w, 5), vec![1]);
        assert_eq!(drain(&mut w, 69), Vec::<u32>::new());
        assert_eq!(drain(&mut w, 70), vec![2]);
        assert_eq!(drain(&mut w, 4999), Vec::<u32>::new());
        assert_eq!(drain(&mut w, 5000), vec![3]);
        assert!(w.is_empty());
    }

    #[test]
    fn next_deadline_never_later_than_entry() {
        for d in [1u64, 63, 64, 65, 4095, 4096, 300_000, 1 << 30] {
            let mut w = Wheel::new();
            w.insert(d, 0u32);
            let nd = w.next_deadline().unwrap();
            assert!(nd <= d, "next {nd} after {d}");
        }
    }

    #[test]
    fn earliest_deadline_is_exact_at_every_level() {
        let mut w = Wheel::new();
        assert_eq!(w.earliest_deadline(), None);
        for d in [300_000u64, 4_100, 70, 1 << 30, 4_097] {
            w.insert(d, d);
        }
        assert_eq!(w.earliest_deadline(), Some(70));
        assert_eq!(w.poll(70), Some(70));
        // Level 1 now: the slot of 4096..8191 holds 4097 and 4100.
        assert_eq!(w.earliest_deadline(), Some(4_097));
        assert!(w.next_deadline().unwrap() <= 4_097);
        assert_eq!(w.poll(4_098), Some(4_097));
        assert_eq!(w.earliest_deadline(), Some(4_100));
    }

    #[test]
    fn every_entry_fires_exactly_at_its_tick_when_stepping() {
        // Step the wheel a millisecond at a time over a range that crosses
        // level boundaries and check each entry fires on its own tick.
        let mut w = Wheel::new();
        let deadlines: Vec<u64> = (0..400).map(|i| (i * 7919 % 20_000) + 1).collect();
        for (i, &d) in deadlines.iter().enumerate() {
            w.insert(d, i as u32);
        }
        let mut fired = vec![None; deadlines.len()];
        for now in 0..=20_001u64 {
            while let Some(i) = w.poll(now) {
                assert!(fired[i as usize].is_none());
                fired[i as usize] = Some(now);
            }
        }
        for (i, &d) in deadlines.iter().enumerate() {
            assert_eq!(fired[i], Some(d), "entry {i}");
        }
    }

    #[test]
    fn jumping_ahead_fires_everything_due() {
        let mut w = Wheel::new();
        for d in [3u64, 100, 10_000, 1_000_000, 90_000_000] {
            w.insert(d, d as u32);
        }
        assert_eq!(drain(&mut w, 10_000), vec![3, 100, 10_000]);
        assert_eq!(drain(&mut w, 999_999), Vec::<u32>::new());
        assert_eq!(drain(&mut w, 100_000_000), vec![1_000_000, 90_000_000]);
    }

    #[test]
    fn cancel_removes_and_returns_payload() {
        let mut w = Wheel::new();
        let a = w.insert(10, 1);
        let b = w.insert(10, 2);
        let c = w.insert(10, 3);
        assert_eq!(w.cancel(b), Some(2));
        assert_eq!(w.cancel(a), Some(1));
        assert_eq!(drain(&mut w, 10), vec![3]);
        assert_eq!(w.cancel(c), None);
        assert!(w.is_empty());
    }

    #[test]
    fn a_key_whose_entry_fired_cancels_nothing_once_its_place_is_reused() {
        let (connection, lease, cancelled, waiter) = (1u32, 2, 3, 4);
        let mut w = Wheel::new();
        let fired = w.insert(10, connection);
        assert_eq!(w.poll(10), Some(connection));
        // The next insert takes the place the fired entry left.
        let lease_key = w.insert(20, lease);
        assert_eq!(w.cancel(fired), None, "a stale key cancelled another entry");
        let cancelled_key = w.insert(30, cancelled);
        assert_eq!(w.cancel(cancelled_key), Some(cancelled));
        let waiter_key = w.insert(40, waiter);
        assert_eq!(w.cancel(cancelled_key), None, "a key cancelled twice cancelled another entry");
        assert_eq!(drain(&mut w, 40), vec![lease, waiter]);
        assert_eq!((w.cancel(lease_key), w.cancel(waiter_key)), (None, None));
    }

    #[test]
    fn cancelling_entries_that_fired_together_is_not_quadratic() {
        // A tick where many leases are reclaimed and each grants a waiter
        // whose own deadline is in the same tick: every grant cancels an
        // entry that fired but was not handed out yet. 200 000 of them took
        // 200 000 scans of the pending entries (minutes in a debug build).
        let n = 200_000u32;
        let mut w = Wheel::new();
        let keys: Vec<TimerKey> = (0..n).map(|i| w.insert(5_000, i)).collect();
        let started = std::time::Instant::now();
        let first = w.poll(5_000).expect("due");
        let mut cancelled = 0;
        for (i, &key) in keys.iter().enumerate().rev() {
            if i as u32 != first {
                assert_eq!(w.cancel(key), Some(i as u32));
                cancelled += 1;
            }
        }
        assert_eq!(cancelled, n - 1);
        assert_eq!(w.poll(5_000), None);
        assert!(w.is_empty());
        assert_eq!(w.next_deadline(), None);
        // Linear takes well under a second even unoptimised; quadratic, minutes.
        assert!(started.elapsed() < std::time::Duration::from_secs(30), "took {:?}", started.elapsed());
    }

    #[test]
    fn cancelling_a_fired_entry_keeps_the_others_in_order() {
        let mut w = Wheel::new();
        // One slot of level 2 (4096..8191) when inserted at 0.
        let keys: Vec<TimerKey> = [140u64, 130, 120, 110, 100].iter().map(|&d| w.insert(d + 4000, d as u32)).collect();
        assert_eq!(w.poll(5_000), Some(100));
        // 110 to 140 came due with it and wait, cascaded, for their tick.
        assert_eq!(w.cancel(keys[2]), Some(120));
        assert_eq!(w.cancel(keys[0]), Some(140));
        assert!(w.next_deadline().is_some_and(|at| at <= 5_000));
        // Already past: it comes out in its place, first.
        let k = w.insert(4_000, 7);
        assert_eq!((w.poll(5_000), w.poll(5_000), w.poll(5_000), w.poll(5_000)), (Some(7), Some(110), Some(130), None));
        assert_eq!(w.cancel(k), None);
        assert!(w.is_empty());
    }

    #[test]
    fn due_at_names_the_next_deadline_and_leaves_the_entry_to_poll_or_cancel() {
        let mut w = Wheel::new();
        let a = w.insert(300, 1);
        w.insert(300, 2);
        let c = w.insert(550, 3);
        w.insert(5_000, 4);
        assert_eq!(w.due_at(299), None);
        assert_eq!(w.due_at(1_000), Some(300));
        assert_eq!(w.due_at(1_000), Some(300), "looking hands nothing out");
        assert_eq!(w.cancel(a), Some(1));
        assert_eq!((w.due_at(1_000), w.poll(1_000)), (Some(300), Some(2)));
        assert_eq!(w.due_at(1_000), Some(550));
        assert_eq!(w.cancel(c), Some(3), "a due entry looked at is still cancelled");
        assert_eq!((w.due_at(1_000), w.poll(1_000)), (None, None));
        assert_eq!(drain(&mut w, 5_000), vec![4]);
    }

    /// An entry inserted while due ones are being handed out (a renewed
    /// lease's timer armed again at its new deadline) comes out in its
    /// place among them: a late poll that covers a whole higher-level slot
    /// does not hand out that slot's later deadlines first.
    #[test]
    fn an_entry_inserted_between_due_ones_comes_out_in_deadline_order() {
        let mut w = Wheel::new();
        w.insert(300, 1);
        w.insert(315, 2);
        w.insert(5_000, 4);
        assert_eq!(w.poll(1_000), Some(1));
        w.insert(310, 3);
        let mut order = Vec::new();
        while let Some(at) = w.due_at(1_000) {
            order.push((at, w.poll(1_000).unwrap()));
        }
        assert_eq!(order, [(310, 3), (315, 2)]);
    }

    #[test]
    fn past_deadline_fires_on_next_poll() {
        let mut w = Wheel::new();
        assert_eq!(drain(&mut w, 1000), Vec::<u32>::new());
        w.insert(10, 7);
        assert_eq!(w.next_deadline(), Some(1000));
        assert_eq!(drain(&mut w, 1000), vec![7]);
    }

    #[test]
    fn insert_while_advancing_keeps_order() {
        // Entries inserted relative to a late `elapsed` still fire on time.
        let mut w = Wheel::new();
        let mut now = 0;
        let mut expected = Vec::new();
        for round in 0..200u64 {
            now += 37;
            w.insert(now + 1000 + round, round as u32);
            expected.push((now + 1000 + round, round as u32));
            while let Some(p) = w.poll(now) {
                let (d, _) = expected.iter().find(|(_, q)| *q == p).copied().unwrap();
                assert!(d <= now);
            }
        }
        let mut last = 0;
        while !w.is_empty() {
            let nd = w.next_deadline().unwrap();
            assert!(nd >= last);
            last = nd;
            while let Some(p) = w.poll(nd) {
                let (d, _) = expected.iter().find(|(_, q)| *q == p).copied().unwrap();
                assert_eq!(d, nd, "fired late or early");
            }
        }
    }

    #[test]
    fn one_poll_over_many_deadlines_fires_them_in_order() {
        let mut w = Wheel::new();
        // Both land in one level-1 slot when inserted at 0.
        w.insert(329, 329u32);
        w.insert(320, 320);
        w.insert(70, 70);
        w.insert(5000, 5000);
        let mut fired = Vec::new();
        while let Some(p) = w.poll(6000) {
            fired.push(p);
        }
        assert_eq!(fired, vec![70, 320, 329, 5000]);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64),
        Cancel(usize),
        Poll(u64),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0u64..300_000).prop_map(Op::Insert),
            2 => any::<usize>().prop_map(Op::Cancel),
            3 => (0u64..20_000).prop_map(Op::Poll),
        ]
    }

    proptest::proptest! {
        /// Against a plain list of deadlines, with inserts relative to the
        /// time of the last poll, cancels of live entries and polls that move
        /// time on: every poll hands out exactly the entries due (by then),
        /// in deadline order, and `next_deadline` is never later than the
        /// earliest live deadline (the reactor sleeps until it).
        #[test]
        fn polls_match_a_plain_list_and_next_deadline_is_never_late(
            ops in proptest::collection::vec(op(), 1..200),
        ) {
            let mut w = Wheel::new();
            let mut live: Vec<(u64, u32, TimerKey)> = Vec::new();
            let (mut now, mut next_payload) = (0u64, 0u32);
            for op in ops {
                match op {
                    Op::Insert(ahead) => {
                        let key = w.insert(now + ahead, next_payload);
                        live.push((now + ahead, next_payload, key));
                        next_payload += 1;
                    }
                    Op::Cancel(pick) if !live.is_empty() => {
                        let (_, payload, key) = live.remove(pick % live.len());
                        proptest::prop_assert_eq!(w.cancel(key), Some(payload));
                    }
                    Op::Cancel(_) => {}
                    Op::Poll(step) => {
                        now += step;
                        let mut fired = Vec::new();
                        while let Some(p) = w.poll(now) {
                            fired.push(p);
                        }
                        let mut due: Vec<(u64, u32)> =
                            live.iter().filter(|e| e.0 <= now).map(|e| (e.0, e.1)).collect();
                        due.sort_unstable();
                        live.retain(|e| e.0 > now);
                        let fired_deadlines: Vec<u64> = fired.iter()
                            .map(|p| due.iter().find(|d| d.1 == *p).map_or(u64::MAX, |d| d.0)).collect();
                        let mut sorted = fired.clone();
                        sorted.sort_unstable();
                        let mut want: Vec<u32> = due.iter().map(|d| d.1).collect();
                        want.sort_unstable();
                        proptest::prop_assert_eq!(sorted, want, "at {}", now);
                        proptest::prop_assert!(fired_deadlines.windows(2).all(|p| p[0] <= p[1]), "in order");
                    }
                }
                let earliest = live.iter().map(|e| e.0).min();
                match (w.next_deadline(), earliest) {
                    (None, None) => {}
                    (Some(at), Some(e)) => proptest::prop_assert!(at <= e.max(now), "next {} after {}", at, e),
                    (got, want) => proptest::prop_assert!(false, "next_deadline {:?}, earliest {:?}", got, want),
                }
                proptest::prop_assert_eq!(w.len(), live.len());
            }
        }
    }

    #[test]
    fn a_deadline_past_the_horizon_never_stalls_a_wheel_that_has_run() {
        // Inserted when the wheel's time is not at the start of a top-level
        // slot, the clamped entry landed in that very slot one lap later:
        // the slot was due at once, gave the entry back to itself, and the
        // poll spun for ever. Run in a thread so a regression fails, not hangs.
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for start in [(1u64 << 35) + 5, (1 << 36) - 3, 12_345_678_901, (1 << 36) + (1 << 30) + 77] {
                let mut w = Wheel::new();
                assert_eq!(w.poll(start), None);
                w.insert(u64::MAX, 1u32);
                let week = start + 7 * 24 * 3_600_000;
                w.insert(week, 2);
                for step in 1..2000u64 {
                    assert_eq!(w.poll(start + step * 1000), None);
                }
                assert_eq!((w.poll(week), w.poll(week)), (Some(2), None));
                assert!(w.next_deadline().is_some_and(|at| at > week));
            }
            done.send(()).unwrap();
        });
        finished.recv_timeout(std::time::Duration::from_secs(20)).expect("every poll returned");
    }

    #[test]
    fn deadline_beyond_horizon_is_clamped() {
        let mut w = Wheel::new();
        w.insert(u64::MAX, 1);
        assert_eq!(drain(&mut w, HORIZON - 1), Vec::<u32>::new());
        assert_eq!(drain(&mut w, u64::MAX), vec![1]);
    }
}
