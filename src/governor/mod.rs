//! The governor: pools, leases, wait queues, rate gates and what reports teach.
//!
//! It is pure: it never reads a clock (every entry point takes `now`, in
//! monotonic milliseconds), never touches a socket or a file, takes its
//! random bytes from the `Entropy` it is given, and never logs on the hot
//! path. `api` owns it and turns its answers into bytes; the reactor reaches
//! it only through `api`. Things that happen later — a queued acquire granted
//! by a release, a queue deadline, a lease reclaimed, a timer of the caller's
//! (`Notice::Timer(T)`, typed by the caller) — come out as `Notice`s that
//! `api` drains after every call, so nobody has to ask about a particular
//! waiter.
//!
//! Every operation on the request path is O(1) in the number of pools,
//! leases, waiters and connections: leases and waiters are slab-indexed,
//! queues are intrusive lists, and every deadline is one entry in the
//! shared timer wheel. (What reports on all pools, such as `recovering`
//! for `/healthz`, walks them.)

pub mod entropy;
pub mod gate;
pub mod history;
pub mod id;
pub mod idempotency;
pub mod learn;
#[cfg(test)]
mod learn_sim;
pub mod lease;
mod pattern;
pub mod pool;
pub mod queue;
mod shard;
pub mod snapshot;

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use slab::Slab;

use crate::wheel::{TimerKey, Wheel};
pub use entropy::Entropy;
pub use id::PoolId;
use idempotency::{Holder, IdemKey, NO_KEY};
pub use learn::{Outcome, RateInfo};
use lease::{secret_eq, text_index, Lease, SlotFields, SlotId, SlotKey, SlotText};
pub use pool::{DenyReason, Pool, PoolSettings, PoolStats};
pub use queue::WaiterKey;
use queue::Waiters;

pub use crate::time::Ms;
use crate::time::{Epoch, EpochMs};

/// What a wheel entry stands for.
#[derive(Clone, Copy, Debug)]
enum Timer<T> {
    /// A lease may have reached its deadline (renewals move the deadline, not the entry).
    Lease(u32),
    /// A waiter's queue deadline.
    Waiter(u32),
    /// A pool's pause or rate wait may have ended: try its queue again.
    Wake(PoolId),
    /// A deadline of the caller's (connection timeouts), handed back as a notice.
    External(T),
    /// A released re-adopted id (its `tombstones` index) reached its request
    /// deadline: it can no longer be adopted, so its entry in `adopted` goes.
    Tombstone(u32),
}

/// The governor headers of SPEC §5, as numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Signals {
    pub remaining_slots: u32,
    pub effective_limit: u32,
    pub limit: u32,
    pub queue_depth: u32,
    /// As wide as a learned budget's `remaining` (a report's whole number):
    /// the header shows it exactly, not cut to `u32::MAX`.
    pub rpm_remaining: Option<u64>,
}

#[derive(Debug, Clone, Copy)]
pub struct Grant {
    pub slot: SlotId,
    /// `slot` as text.
    pub text: SlotText,
    pub lease_deadline: Ms,
    pub request_deadline: Ms,
    pub term_ms: u64,
    pub renew_interval_ms: u64,
    pub queued_ms: u64,
    pub signals: Signals,
}

/// What is left of a lease taken off the table (see `remove_lease`).
struct Removed {
    pool: PoolId,
    timer: TimerKey,
    capped: bool,
    /// Its congestion epoch, grant time, grant count and success count at
    /// grant, for a report.
    epoch: u32,
    granted_at: Ms,
    grant_seq: u64,
    oks_seq: u32,
}

#[derive(Debug, Clone, Copy)]
pub struct Denial {
    pub reason: DenyReason,
    pub retry_after_ms: u64,
    pub queued_ms: u64,
    pub signals: Signals,
}

/// Why a waiter leaves its queue other than by a grant or its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leaving {
    /// Its client went away, or half-closed: `PoolStats::waiters_gone`.
    ClientGone,
    /// The server answers it: a stop, a reload that no longer admits it, a
    /// pipeline deeper than its connection buffers. Counted by that answer.
    Answered,
}

#[derive(Debug)]
pub enum Admission {
    Granted(Grant),
    Queued(WaiterKey),
    Denied(Denial),
}

/// The pool's `Idempotency-Key` store is full of live keys, `capacity` of
/// them (SPEC §11: refused, never evicted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyStoreFull {
    pub capacity: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewError {
    NotFound,
    Capped,
}

/// Something that happened inside the governor that a caller must hear about.
#[derive(Debug)]
pub enum Notice<T = u64> {
    /// A queued acquire got its slot. If its owner is gone, release it.
    Granted { owner: u64, grant: Grant },
    /// A queued acquire reached its deadline (or its pool was removed).
    TimedOut { owner: u64, denial: Denial },
    /// A retry under the same `Idempotency-Key` took this queued acquire's
    /// place: its owner is answered `409 superseded`.
    Superseded { owner: u64 },
    /// A timer of the caller's fired, with what it was scheduled with.
    Timer(T),
}

/// FNV-1a: pool names are short and the map only ever holds configured
/// names (requests look up, never insert), so SipHash's flood resistance
/// buys nothing here and costs a few hundred instructions per request.
#[derive(Default)]
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0 = fnv1a(if self.0 == 0 { FNV_OFFSET } else { self.0 }, bytes);
    }
}

/// FNV-1a's starting state.
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a of `bytes` from state `h` (`FNV_OFFSET` for a fresh hash).
pub fn fnv1a(h: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(h, |h, &b| (h ^ b as u64).wrapping_mul(0x0100_0000_01b3))
}

/// The governor, with `T` the payload of the caller's own timers (what the
/// reactor schedules on the one wheel and gets back as `Notice::Timer`).
pub struct Governor<T = u64> {
    pools: Vec<Pool>,
    names: HashMap<Box<[u8]>, PoolId, BuildHasherDefault<Fnv>>,
    /// The pool `pool_id` found last.
    last_pool: Cell<PoolId>,
    leases: Slab<Lease>,
    waiters: Waiters,
    wheel: Wheel<Timer<T>>,
    notices: VecDeque<Notice<T>>,
    /// Pools a slot came free in (a reclaim, a wake-up) in the millisecond
    /// `advance` is firing: pumped once everything due in it has fired
    /// (kept for its room).
    woken: Vec<PoolId>,
    entropy: Entropy,
    /// The `now` of the last `advance`: what the metrics read the learned
    /// instants against.
    advanced_to: Ms,
    /// Signs slot ids and checks the ids of slots this process never granted.
    key: SlotKey,
    /// Unix time at monotonic 0: slot ids carry Unix deadlines so another
    /// process can read them.
    epoch: Epoch,
    /// Every id re-adopted by this process: its slab index while held, `None`
    /// once released or reclaimed, so a dead id is never adopted twice (a
    /// lease a snapshot restored is entered dead when it is seen to end in
    /// a window, for the same reason). A dead entry lasts until the id's
    /// request deadline, after which `readopt` refuses the id anyway: so the
    /// map holds at most the slots re-adopted, or restored and ended in a
    /// window, within one request cap, however many windows run.
    adopted: HashMap<SlotId, Option<usize>>,
    /// The dead entries of `adopted`, each with a wheel entry at its request deadline.
    tombstones: Slab<SlotId>,
}

impl<T: Copy> Governor<T> {
    /// A governor for `pools`, drawing slot ids' random bytes from `entropy`.
    pub fn new(pools: &BTreeMap<String, PoolSettings>, entropy: Entropy) -> Governor<T> {
        let mut g = Governor {
            pools: Vec::new(),
            names: HashMap::default(),
            last_pool: Cell::new(PoolId(0)),
            leases: Slab::new(),
            waiters: Waiters::default(),
            wheel: Wheel::new(),
            notices: VecDeque::new(),
            woken: Vec::new(),
            entropy,
            advanced_to: 0,
            key: SlotKey::new(&[0; 32]),
            epoch: Epoch::default(),
            adopted: HashMap::new(),
            tombstones: Slab::new(),
        };
        // Until the server hands over its slot secret, ids are signed under a
        // random one: nothing outside this process can vouch for them.
        g.key = SlotKey::new(&g.entropy.take::<32>());
        g.reconfigure(pools, 0);
        g
    }

    /// Applies a (re)loaded pool set: existing pools keep held slots, queues
    /// and learned state; new pools appear; pools no longer configured are
    /// retired — they grant nothing more, their waiters are answered now and
    /// their leases drain (renew and release keep working). It grants
    /// nothing: a limit it raises waits for `grant_after_reload`, so the
    /// caller first answers the waiters the new configuration refuses, and
    /// none of them takes a slot or a rate token on its way out.
    pub fn reconfigure(&mut self, configs: &BTreeMap<String, PoolSettings>, now: Ms) {
        for (name, &settings) in configs {
            match self.names.get(name.as_bytes()) {
                Some(&pid) => self.pools[pid.0 as usize].reconfigure(settings, now),
                None => {
                    let pid = PoolId(self.pools.len() as u32);
                    self.pools.push(Pool::new(name, settings, self.key.seal(name)));
                    self.names.insert(name.as_bytes().into(), pid);
                }
            }
        }
        for idx in 0..self.pools.len() {
            let pid = PoolId(idx as u32);
            if !configs.contains_key(&*self.pools[idx].name) && !self.pools[idx].retired {
                self.pools[idx].retired = true;
                while let Some(head) = self.pools[idx].queue.head() {
                    self.time_out(head, pid, now, true);
                }
            }
        }
    }

    /// After `reconfigure`: every queue is granted what the new settings
    /// free (a raised limit, a larger burst, a gate taken away).
    pub fn grant_after_reload(&mut self, now: Ms) {
        for idx in 0..self.pools.len() {
            self.pump(PoolId(idx as u32), now);
        }
    }

    /// Sets the slot secret and the Unix time of monotonic 0. Call before the
    /// first grant: ids granted earlier stay valid here but no other process
    /// could re-adopt them.
    pub fn set_identity(&mut self, secret: &[u8; 32], epoch: Epoch) {
        self.key = SlotKey::new(secret);
        self.epoch = epoch;
        for pool in &mut self.pools {
            pool.seal = self.key.seal(&pool.name);
        }
    }

    /// The wall clock was stepped (`server::clock`): the Unix time of
    /// monotonic 0 is now `epoch`. Ids granted from now on, a snapshot and
    /// the re-adoption of another process's ids read Unix time on it; no
    /// deadline moves.
    pub fn set_epoch(&mut self, epoch: Epoch) {
        self.epoch = epoch;
    }

    /// Opens the re-adoption window of every pool for one `termMs` from
    /// `now` (SPEC §11): a start without a usable snapshot and no record of
    /// longer terms (`state::terms` gives those: `open_recovery_window_for`).
    #[cfg(test)]
    pub fn open_recovery_window(&mut self, now: Ms) {
        self.open_recovery_window_for(now, |_| None);
    }

    /// The same, each pool's window as long as the longest term its
    /// leases may still have (`longer`, by name, when longer than its
    /// `termMs`: granted before a reload lowered it).
    pub fn open_recovery_window_for(&mut self, now: Ms, longer: impl Fn(&str) -> Option<u64>) {
        for idx in 0..self.pools.len() {
            let pool = &self.pools[idx];
            let term = longer(&pool.name).map_or(pool.settings.term_ms, |t| t.max(pool.settings.term_ms));
            self.keep_recovering(PoolId(idx as u32), now.saturating_add(term));
        }
    }

    /// Opens the re-adoption window of the pool named `name` for `window_ms`
    /// from `now` (a pool a reload names that this process never had, whose
    /// leases a process before it may have left alive). Whether it is a pool.
    pub fn open_recovery_window_of(&mut self, name: &str, window_ms: u64, now: Ms) -> bool {
        let Some(pid) = self.pool_id(name) else {
            return false;
        };
        self.keep_recovering(pid, now.saturating_add(window_ms));
        true
    }

    /// The process before this one may have held up to `holders` slots of
    /// the pool named `name` (the limit it granted under): while the pool's
    /// window open at `now` lasts, re-adoption takes that many back, past a
    /// `concurrency` lowered since. Whether a window was open.
    pub fn expect_holders(&mut self, name: &str, holders: u32, now: Ms) -> bool {
        let Some(pid) = self.pool_id(name) else {
            return false;
        };
        let pool = &mut self.pools[pid.0 as usize];
        let Some(until) = pool.recovering_until.filter(|&until| now < until) else {
            return false;
        };
        pool.expect_holders(holders, until);
        true
    }

    /// Per pool with held leases, by name: their longest term and their
    /// latest request deadline (what a start records of restored leases).
    pub fn held_terms(&self) -> BTreeMap<String, (u64, Ms)> {
        let mut terms: BTreeMap<String, (u64, Ms)> = BTreeMap::new();
        for (_, lease) in &self.leases {
            let name = &self.pools[lease.pool.0 as usize].name;
            let entry = terms.entry(name.to_string()).or_default();
            entry.0 = entry.0.max(lease.term_ms as u64);
            entry.1 = entry.1.max(lease.request_deadline);
        }
        terms
    }

    /// Opens `pid`'s re-adoption window until `until`, or keeps a longer one open.
    fn keep_recovering(&mut self, pid: PoolId, until: Ms) {
        let pool = &mut self.pools[pid.0 as usize];
        let until = pool.recovering_until.filter(|&open| open > until).unwrap_or(until);
        pool.recovering_until = Some(until);
        self.arm_wake(pid, until);
    }

    /// Whether any pool is in its re-adoption window.
    pub fn recovering(&self, now: Ms) -> bool {
        self.pools.iter().any(|p| p.recovering(now))
    }

    /// The pool named `name` (text, or the bytes of a request target).
    pub fn pool_id(&self, name: impl AsRef<[u8]>) -> Option<PoolId> {
        let name = name.as_ref();
        // Most requests name the pool the one before named. A name, once
        // known, names the same pool for good (pools are retired, never
        // removed), so the last answer is right whenever the name is equal.
        let last = self.last_pool.get();
        if self.pools.get(last.0 as usize).is_some_and(|p| p.name.as_bytes() == name) {
            return Some(last);
        }
        let pid = self.names.get(name).copied()?;
        self.last_pool.set(pid);
        Some(pid)
    }

    pub fn pool(&self, pid: PoolId) -> &Pool {
        &self.pools[pid.0 as usize]
    }

    /// Pools a reload removed that hold and queue nothing any more give
    /// back what only their traffic needed (their `Idempotency-Key` room).
    pub fn shed_drained(&mut self) {
        for pool in self.pools.iter_mut().filter(|p| p.drained_away()) {
            pool.idem.shed();
        }
    }

    pub fn pools(&self) -> impl Iterator<Item = (PoolId, &Pool)> {
        self.pools.iter().enumerate().map(|(i, p)| (PoolId(i as u32), p))
    }

    pub fn held_total(&self) -> usize {
        self.leases.len()
    }

    pub fn queued_total(&self) -> usize {
        self.waiters.len()
    }

    pub fn timers_total(&self) -> usize {
        self.wheel.len()
    }

    /// The governor headers of `pid` at `now`. `rpm_remaining` is the
    /// smaller of what its rate gates (the configured bucket, the learned
    /// budget, a spent token window) still allow; `None` when none holds.
    pub fn signals(&self, pid: PoolId, now: Ms) -> Signals {
        let p = self.pool(pid);
        let effective = p.effective_limit_at(now);
        let mut rpm_remaining = p.rpm_remaining().map(u64::from);
        if let Some(left) = p.learning.budget_remaining(now) {
            rpm_remaining = Some(rpm_remaining.map_or(left, |tokens| tokens.min(left)));
        }
        // A spent token window lets no grant through before it resets.
        if p.learning.token_block_until > now {
            rpm_remaining = Some(0);
        }
        Signals {
            remaining_slots: effective.saturating_sub(p.held),
            effective_limit: effective,
            limit: p.settings.concurrency,
            queue_depth: p.queue.len(),
            rpm_remaining,
        }
    }

    /// Asks for a slot. `wait_ms` is the caller's wait budget (0 = fail fast);
    /// it is clamped to the pool's queue timeout. `owner` identifies the
    /// caller in the notice that later answers a queued acquire.
    pub fn acquire(&mut self, pid: PoolId, wait_ms: u64, owner: u64, now: Ms) -> Admission {
        self.acquire_read_at(pid, wait_ms, owner, now, now)
    }

    /// `acquire` of a request read at `read` (at most `now`): its wait
    /// budget runs from then. A request that waited in its connection's
    /// input behind a queued acquire comes with part of its budget spent;
    /// with all of it spent it is answered as any wait that ran out (`504`,
    /// by the next turn), unless a slot is free now.
    pub fn acquire_read_at(&mut self, pid: PoolId, wait_ms: u64, owner: u64, read: Ms, now: Ms) -> Admission {
        debug_assert!(read <= now);
        let pool = &mut self.pools[pid.0 as usize];
        pool.refill_gate(now);
        let ramp = pool.learning.rises_at(now);
        let blocked = pool.blocked(now);
        if pool.queue.is_empty() && blocked.is_none() {
            return Admission::Granted(self.grant(pid, now, 0));
        }
        // A non-empty queue means no slot is free (the queue is pumped after
        // every change), so a newcomer never overtakes a waiter.
        let (reason, wait) = blocked.unwrap_or((DenyReason::Concurrency, pool::UNKNOWN_WAIT_MS));
        let budget = wait_ms.min(pool.settings.queue_timeout_ms);
        if budget == 0 {
            return Admission::Denied(self.deny(pid, reason, wait, now));
        }
        if pool.queue.len() >= pool.settings.queue_size {
            return Admission::Denied(self.deny(pid, DenyReason::QueueFull, wait, now));
        }
        // `read` is whole milliseconds, rounded down: the acquire came up to a
        // millisecond after it, and a deadline at `read + budget` could answer
        // 504 before the caller's budget had passed. One more never does. A
        // budget spent before its turn came (it waited in its connection's
        // input) is due now, answered by the next turn without sleeping: not
        // a tick later, which a pipeline of such acquires would pay once each.
        let deadline = (read + budget + 1).max(now);
        let timer = self.wheel.insert(deadline, Timer::Waiter(self.waiters.vacant_key()));
        let pool = &mut self.pools[pid.0 as usize];
        let key = self.waiters.push_back(&mut pool.queue, pid, owner, read, timer);
        if reason != DenyReason::Concurrency {
            self.arm_wake(pid, now + wait);
        } else if let Some(at) = ramp {
            // The start's limit (or a blind probe's) grows by the clock, not by releases.
            self.arm_wake(pid, at);
        }
        Admission::Queued(key)
    }

    /// `acquire` under an `Idempotency-Key` (SPEC §11). While the key's
    /// grant is held, the same grant is answered again (same slot, current
    /// deadlines); while its acquire is queued, this one takes its place
    /// (same position and deadline) and the earlier owner hears
    /// `Notice::Superseded`, unless this one fails fast (no wait budget,
    /// once clamped to the pool's queue timeout): then
    /// it is refused as any fail-fast acquire behind a queue is, and the
    /// queued one keeps its place. A new key in a full store is refused.
    pub fn acquire_keyed(
        &mut self,
        pid: PoolId,
        key: &IdemKey,
        wait_ms: u64,
        owner: u64,
        now: Ms,
    ) -> Result<Admission, KeyStoreFull> {
        self.acquire_keyed_read_at(pid, key, wait_ms, owner, now, now)
    }

    /// `acquire_keyed` of a request read at `read` (see `acquire_read_at`).
    pub fn acquire_keyed_read_at(
        &mut self,
        pid: PoolId,
        key: &IdemKey,
        wait_ms: u64,
        owner: u64,
        read: Ms,
        now: Ms,
    ) -> Result<Admission, KeyStoreFull> {
        let fails_fast = wait_ms.min(self.pools[pid.0 as usize].settings.queue_timeout_ms) == 0;
        match self.pools[pid.0 as usize].idem.find(key) {
            Some((_, Holder::Lease(idx))) => {
                let lease = &self.leases[idx as usize];
                if lease.lease_deadline <= now {
                    // Past its deadline, its wheel entry not run yet:
                    // reclaimed now, and the key with it.
                    let timer = lease.timer;
                    self.wheel.cancel(timer);
                    self.reclaim(idx as usize, now);
                } else if self.confirm(idx as usize, now) {
                    let lease = &mut self.leases[idx as usize];
                    lease.answers = lease.answers.saturating_add(1);
                    let pool = &mut self.pools[pid.0 as usize];
                    pool.stats.idempotent_replays += 1;
                    pool.refill_gate(now);
                    return Ok(Admission::Granted(self.grant_of(idx as usize, now)));
                }
                // Gone (a restored lease that could not be confirmed is
                // reclaimed, its key with it): the retry is a new acquire.
            }
            // A queued acquire means no slot is free: this one is denied.
            Some((_, Holder::Waiter(_))) if fails_fast => return Ok(self.acquire(pid, 0, owner, now)),
            Some((_, Holder::Waiter(waiter))) => {
                let w = self.waiters.get_mut(waiter).expect("a key names a live waiter");
                let previous = std::mem::replace(&mut w.owner, owner);
                self.pools[pid.0 as usize].stats.superseded += 1;
                self.notices.push_back(Notice::Superseded { owner: previous });
                return Ok(Admission::Queued(waiter));
            }
            None => {}
        }
        let pool = &self.pools[pid.0 as usize];
        if pool.idem.is_full() {
            return Err(KeyStoreFull { capacity: pool.settings.idempotency_keys });
        }
        let admission = self.acquire_read_at(pid, wait_ms, owner, read, now);
        let store = &mut self.pools[pid.0 as usize].idem;
        match &admission {
            Admission::Granted(grant) => {
                let idx = grant.slot.index();
                self.leases[idx as usize].idem = store.insert(*key, Holder::Lease(idx));
            }
            Admission::Queued(waiter) => {
                let entry = store.insert(*key, Holder::Waiter(*waiter));
                self.waiters.get_mut(*waiter).expect("just queued").idem = entry;
            }
            Admission::Denied(_) => {}
        }
        Ok(admission)
    }

    /// The grant a held lease stands for, as it is now.
    fn grant_of(&self, idx: usize, now: Ms) -> Grant {
        let lease = &self.leases[idx];
        let s = self.pools[lease.pool.0 as usize].settings;
        let term_ms = lease.term_ms as u64;
        // A reload since the grant may have changed the pool's term: the
        // lease keeps its own, and the interval asked for now is scaled to it.
        let renew_interval_ms = match term_ms == s.term_ms {
            true => s.renew_interval_ms,
            false => (s.renew_interval_ms * term_ms / s.term_ms).clamp(1, term_ms - 1),
        };
        Grant {
            slot: lease.id,
            text: lease.text,
            lease_deadline: lease.lease_deadline,
            request_deadline: lease.request_deadline,
            term_ms,
            renew_interval_ms,
            queued_ms: 0,
            signals: self.signals(lease.pool, now),
        }
    }

    /// Extends a lease by one term, never past its request deadline. `slot`
    /// is the id's text as the caller sent it (anything but an id is not
    /// found, like any other unknown slot).
    pub fn renew(&mut self, pid: PoolId, slot: &[u8], now: Ms) -> Result<Ms, RenewError> {
        let Some((idx, readopted)) = self.find(pid, slot, now) else {
            self.pools[pid.0 as usize].stats.renew_not_found += 1;
            return Err(RenewError::NotFound);
        };
        if !self.confirm(idx, now) {
            self.pools[pid.0 as usize].stats.renew_not_found += 1;
            return Err(RenewError::NotFound);
        }
        let pool = &mut self.pools[pid.0 as usize];
        let lease = &mut self.leases[idx];
        // A renew that re-adopted the lease is its first renewal here: it
        // extends it to its cap, as it would have before the restart.
        if lease.is_capped() && !readopted {
            pool.stats.renew_capped += 1;
            return Err(RenewError::Capped);
        }
        lease.lease_deadline = lease.renewed_deadline(now);
        pool.stats.renewed += 1;
        Ok(lease.lease_deadline)
    }

    /// Confirms a lease that a snapshot taken while running restored, now
    /// that its holder shows (renews it, or retries its acquire under its
    /// key). The crashed process may have seen it released after the
    /// snapshot and granted its place again, and that grant's holder may be
    /// re-adopted already: while the confirmed leases fill what the pool may
    /// re-adopt (`Pool::readopt_limit`), as `readopt` counts them, it would
    /// be one too many. It is reclaimed then, and `false` returned; its
    /// holder hears it is gone. Any other lease is confirmed already.
    fn confirm(&mut self, idx: usize, now: Ms) -> bool {
        let lease = &mut self.leases[idx];
        if !lease.unconfirmed {
            return true;
        }
        let pool = &mut self.pools[lease.pool.0 as usize];
        if pool.held - pool.unconfirmed < pool.readopt_limit(now) {
            lease.unconfirmed = false;
            pool.unconfirmed -= 1;
            return true;
        }
        // One too many, but not seen to end: its holder may be the live one
        // (a re-adopted holder may have been released after the snapshot),
        // so it is not kept dead (`take_back`) and is re-adopted once there
        // is room.
        let timer = lease.timer;
        self.wheel.cancel(timer);
        self.reclaim(idx, now);
        false
    }

    /// Releases a lease of `pid` for its holder; `true` only the first time.
    /// The outcome report is applied only when the release was real; a
    /// holder's release without one says its call was not refused
    /// (`Learning::on_unreported`). `slot` as for `renew`.
    pub fn release(&mut self, pid: PoolId, slot: &[u8], outcome: Option<&Outcome>, now: Ms) -> bool {
        self.release_as(pid, slot, outcome, true, now)
    }

    /// `release`; `holder` when the lease's holder released it (not the
    /// server for a grant that never reached it, or for a proxied exchange
    /// that ended with no answer from the upstream: those say nothing of it).
    fn release_as(&mut self, pid: PoolId, slot: &[u8], outcome: Option<&Outcome>, holder: bool, now: Ms) -> bool {
        let Some((idx, _)) = self.find(pid, slot, now) else {
            self.pools[pid.0 as usize].stats.release_gone += 1;
            return false;
        };
        let lease = self.remove_lease(idx, now);
        self.wheel.cancel(lease.timer);
        let pool = &mut self.pools[pid.0 as usize];
        pool.held -= 1;
        pool.stats.released += 1;
        let reported = learn::Reported {
            epoch: lease.epoch,
            granted_at: lease.granted_at,
            grant_seq: lease.grant_seq,
            in_flight: pool.held,
            oks_beside: pool.learning.oks.wrapping_sub(lease.oks_seq),
        };
        if let Some(o) = outcome {
            if o.is_throttled() {
                pool.stats.reports_throttled += 1;
            }
            let wake = pool.learning.on_report(o, reported, now);
            if wake.cooldown_until.is_some() {
                pool.stats.cooldowns += 1;
            }
        } else if holder {
            pool.learning.on_unreported(reported, now);
        }
        self.pump(pid, now);
        true
    }

    /// Makes a held lease last to its request deadline: the server itself
    /// holds it (a proxied exchange), so no renewal will come.
    pub fn hold_to_request_deadline(&mut self, slot: &SlotId) {
        if let Some(idx) = self.held(slot) {
            let lease = &mut self.leases[idx];
            // The reclaim entry fires at the old deadline, sees this one and re-arms.
            lease.lease_deadline = lease.request_deadline;
        }
    }

    /// `release` for a holder that has the id's bytes rather than its text
    /// (a proxied exchange): the held lease's own text is used, so nothing is
    /// encoded unless the lease is no longer held under that index.
    pub fn release_id(&mut self, pid: PoolId, slot: &SlotId, outcome: Option<&Outcome>, now: Ms) -> bool {
        let text = self.held(slot).map_or_else(|| slot.encode(), |idx| self.leases[idx].text);
        self.release_as(pid, &text, outcome, false, now)
    }

    /// Releases a grant whose answer could not be delivered, unless another
    /// answer carried it too (an idempotent retry's, or the first one a
    /// retry's lost answer repeated): that one may have reached its holder,
    /// who renews and releases it. The last answer lost releases it.
    pub fn release_undelivered(&mut self, slot: &SlotId, now: Ms) {
        let Some(idx) = self.held(slot) else {
            return;
        };
        let lease = &mut self.leases[idx];
        // Past the count's top, answers are no longer counted: such a
        // lease is left to its term.
        if lease.answers == u16::MAX {
            return;
        }
        lease.answers -= 1;
        if lease.answers == 0 {
            let (pid, text) = (self.leases[idx].pool, self.leases[idx].text);
            self.release_as(pid, &text, None, false, now);
        }
    }

    /// The table index of the lease held under exactly this id (by its
    /// bytes, compared in constant time), for holders that keep the bytes.
    fn held(&self, slot: &SlotId) -> Option<usize> {
        let idx = slot.index() as usize;
        self.leases.get(idx).filter(|lease| secret_eq(&lease.id.0, &slot.0)).map(|_| idx)
    }

    /// Drops a queued acquire, for `why`; only a client that went away is
    /// counted as gone. Checking the owner makes a stale key harmless.
    pub fn cancel_waiter(&mut self, key: WaiterKey, owner: u64, why: Leaving) {
        let Some(w) = self.waiters.get(key) else {
            return;
        };
        if w.owner != owner {
            return;
        }
        let pid = w.pool;
        let pool = &mut self.pools[pid.0 as usize];
        let w = self.waiters.remove(&mut pool.queue, key);
        self.wheel.cancel(w.timer);
        if w.idem != NO_KEY {
            pool.idem.remove(w.idem);
        }
        if why == Leaving::ClientGone {
            pool.stats.waiters_gone += 1;
        }
    }

    /// Takes a queued acquire out of the queue, for `why`, before it is
    /// answered: its client will send nothing more (a half-close, answered
    /// `504` with the returned denial, so the requests pipelined behind it
    /// can be answered in order), or the server refuses it.
    pub fn withdraw_waiter(&mut self, key: WaiterKey, owner: u64, now: Ms, why: Leaving) -> Option<Denial> {
        let w = self.waiters.get(key).filter(|w| w.owner == owner)?;
        let (pid, enqueued_at) = (w.pool, w.enqueued_at);
        self.cancel_waiter(key, owner, why);
        Some(self.left_queue(pid, now - enqueued_at, now))
    }

    /// The answer of a waiter of `pid` that left at `now` after `queued_ms`
    /// without a slot: why no slot is free now, and for how long.
    pub fn left_queue(&mut self, pid: PoolId, queued_ms: u64, now: Ms) -> Denial {
        let (reason, wait) = self.pools[pid.0 as usize].refusal(now);
        Denial { reason, retry_after_ms: wait, queued_ms, signals: self.signals(pid, now) }
    }

    /// Schedules a timer of the caller's; it comes back as `Notice::Timer(payload)`.
    pub fn schedule(&mut self, at: Ms, payload: T) -> TimerKey {
        self.wheel.insert(at, Timer::External(payload))
    }

    pub fn cancel_timer(&mut self, key: TimerKey) {
        self.wheel.cancel(key);
    }

    /// The latest `now` the governor was advanced to.
    pub fn advanced_to(&self) -> Ms {
        self.advanced_to
    }

    /// When `advance` next has work to do.
    pub fn next_deadline(&self) -> Option<Ms> {
        self.wheel.next_deadline()
    }

    /// Fires everything due by `now`: reclaims, queue deadlines, wake-ups,
    /// in deadline order. The queues of the pools a reclaim or a wake-up
    /// freed are pumped once everything due in that millisecond has fired:
    /// a lease whose deadline falls in it is reclaimed first, so a grant it
    /// wakes neither counts that lease nor waits behind it, and a waiter
    /// whose deadline it is has timed out, whichever of them the wheel hands
    /// out first. They are pumped before a later millisecond's deadlines
    /// fire, as they stand in the millisecond before it, so an advance that
    /// comes late (a long turn) grants a waiter the slot that came free
    /// before its deadline, and no token, end of a cool-down or free slot
    /// that came after it, as it would have on time.
    pub fn advance(&mut self, now: Ms) {
        self.advanced_to = self.advanced_to.max(now);
        loop {
            let mut tick = None;
            while let Some(at) = self.wheel.due_at(now) {
                if tick != Some(at) {
                    tick = Some(at);
                    if !self.woken.is_empty() {
                        // The earlier tick's: a waiter it grants takes its
                        // timer off the wheel, due or not.
                        self.pump_woken(at.saturating_sub(1), now);
                        continue;
                    }
                }
                let timer = self.wheel.poll(now).expect("an entry is due");
                self.fire(timer, at, now);
            }
            if self.woken.is_empty() {
                return;
            }
            self.pump_woken(now, now);
        }
    }

    /// Pumps the queues of the pools on `woken` as they stood at `at`
    /// (`pump_queue`).
    fn pump_woken(&mut self, at: Ms, now: Ms) {
        if self.woken.is_empty() {
            return;
        }
        let mut woken = std::mem::take(&mut self.woken);
        for &pid in &woken {
            self.pools[pid.0 as usize].woken = false;
            if self.pools[pid.0 as usize].queue.head().is_some() {
                self.pump_queue(pid, at, now);
            }
        }
        woken.clear();
        self.woken = woken;
    }

    /// Fires one timer that came due at `at`; a pool a slot came free in
    /// goes on `woken`, pumped when that millisecond's timers have all fired.
    fn fire(&mut self, timer: Timer<T>, at: Ms, now: Ms) {
        match timer {
            Timer::Lease(idx) => {
                let deadline = self.leases[idx as usize].lease_deadline;
                if deadline > at {
                    // Renewed since: it fires again at its deadline, in this
                    // advance if that has come too.
                    self.leases[idx as usize].timer = self.wheel.insert(deadline, Timer::Lease(idx));
                } else {
                    let pid = self.take_back(idx as usize, at);
                    self.wake_up(pid);
                }
            }
            Timer::Waiter(idx) => {
                let key = WaiterKey(idx);
                let pid = self.waiters.get(key).expect("a waiter owns its timer").pool;
                self.time_out(key, pid, now, false);
            }
            Timer::Wake(pid) => {
                self.pools[pid.0 as usize].wake = None;
                self.wake_up(pid);
            }
            Timer::External(payload) => self.notices.push_back(Notice::Timer(payload)),
            Timer::Tombstone(idx) => {
                let id = self.tombstones.remove(idx as usize);
                self.adopted.remove(&id);
            }
        }
    }

    /// Puts `pid` on `woken`, once.
    fn wake_up(&mut self, pid: PoolId) {
        let pool = &mut self.pools[pid.0 as usize];
        if !std::mem::replace(&mut pool.woken, true) {
            self.woken.push(pid);
        }
    }

    pub fn pop_notice(&mut self) -> Option<Notice<T>> {
        self.notices.pop_front()
    }

    fn grant(&mut self, pid: PoolId, now: Ms, queued_ms: u64) -> Grant {
        let idx = self.leases.vacant_key();
        let pool = &mut self.pools[pid.0 as usize];
        if let Some(gate) = &mut pool.gate {
            gate.take(now);
        }
        pool.learning.on_grant(now);
        pool.held += 1;
        pool.stats.grants += 1;
        debug_assert!(pool.held <= pool.effective_limit_at(now));
        let s = pool.settings;
        let request_deadline = now + s.request_timeout_ms;
        let lease_deadline = lease::lease_deadline(now, s.term_ms, request_deadline);
        let id = self.key.sign(
            pool.seal,
            &SlotFields {
                index: idx as u32,
                lease_deadline_unix: self.epoch.wall(lease_deadline).0,
                request_deadline_unix: self.epoch.wall(request_deadline).0,
                random: self.entropy.take(),
            },
        );
        let text = id.encode();
        let timer = self.wheel.insert(lease_deadline, Timer::Lease(idx as u32));
        let epoch = pool.learning.epoch();
        let (grant_seq, oks_seq) = (pool.learning.grants, pool.learning.oks);
        let inserted = self.leases.insert(Lease {
            pool: pid,
            id,
            text,
            lease_deadline,
            request_deadline,
            term_ms: s.term_ms as u32,
            epoch,
            granted_at: now,
            grant_seq,
            oks_seq,
            timer,
            adopted: false,
            unconfirmed: false,
            restored: false,
            answers: 1,
            idem: NO_KEY,
        });
        debug_assert_eq!(inserted, idx);
        Grant {
            slot: id,
            text,
            lease_deadline,
            request_deadline,
            term_ms: s.term_ms,
            renew_interval_ms: s.renew_interval_ms,
            queued_ms,
            signals: self.signals(pid, now),
        }
    }

    fn deny(&mut self, pid: PoolId, reason: DenyReason, wait: u64, now: Ms) -> Denial {
        self.pools[pid.0 as usize].stats.denied[reason as usize] += 1;
        Denial { reason, retry_after_ms: wait, queued_ms: 0, signals: self.signals(pid, now) }
    }

    /// The live lease `slot` names in `pid`, and whether it was re-adopted
    /// just now. A lease past its deadline whose wheel entry has not run yet
    /// is reclaimed here, so "renew after expiry fails" holds to the
    /// millisecond.
    fn find(&mut self, pid: PoolId, slot: &[u8], now: Ms) -> Option<(usize, bool)> {
        let text: &SlotText = slot.try_into().ok()?;
        let direct = text_index(text).map(|i| i as usize);
        let idx = match direct.and_then(|i| self.leases.get(i).map(|lease| (i, lease))) {
            Some((i, lease)) if secret_eq(&lease.text, text) => i,
            _ => {
                let id = SlotId::decode(text)?;
                match self.adopted.get(&id) {
                    Some(&Some(idx)) => idx,
                    Some(None) => return None,
                    None => return self.readopt(pid, id, now).map(|idx| (idx, true)),
                }
            }
        };
        let lease = &self.leases[idx];
        if lease.pool != pid {
            return None;
        }
        if lease.lease_deadline <= now {
            let timer = lease.timer;
            self.wheel.cancel(timer);
            self.reclaim(idx, now);
            return None;
        }
        Some((idx, false))
    }

    /// Adopts a slot this process does not know, if `pid` is in its
    /// re-adoption window and the id is one of its own under the slot secret
    /// with a request deadline still ahead. It is held from now on, for one
    /// more term at most (the id's lease deadline may predate renewals).
    fn readopt(&mut self, pid: PoolId, id: SlotId, now: Ms) -> Option<usize> {
        let pool = &self.pools[pid.0 as usize];
        if !pool.recovering(now) {
            return None;
        }
        // The crashed process held no more than its limit, so neither does
        // this one: an id it had seen released, or reclaimed by its term,
        // whose holder renews anyway, is otherwise indistinguishable from a
        // live one. Past the limit, renewals are refused as unknown (the
        // limit holds even if the one refused is a live holder). A lease a
        // running process's snapshot restored counts once its holder shows:
        // it may have been released after the snapshot, its place taken by
        // a grant the snapshot never saw, whose holder is renewing now.
        if pool.held - pool.unconfirmed >= pool.readopt_limit(now) {
            return None;
        }
        let fields = self.key.verify(pool.seal, &id)?;
        // No request has more than its cap left: a wall clock behind the
        // granting process's (set back since, or another host's) would
        // otherwise lengthen the id's request deadline by the difference.
        let request_deadline = self
            .epoch
            .monotonic(EpochMs(fields.request_deadline_unix))?
            .min(now.saturating_add(pool.settings.request_timeout_ms));
        if request_deadline <= now {
            return None;
        }
        let lease_deadline = lease::lease_deadline(now, pool.settings.term_ms, request_deadline);
        let idx = self.leases.vacant_key();
        let timer = self.wheel.insert(lease_deadline, Timer::Lease(idx as u32));
        let pool = &mut self.pools[pid.0 as usize];
        pool.held += 1;
        pool.stats.readopted += 1;
        let epoch = pool.learning.epoch();
        // Its real grant instant is unknown: counting it as granted now keeps
        // its report from vouching for a budget window it may predate.
        let (grant_seq, oks_seq) = (pool.learning.grants, pool.learning.oks);
        self.leases.insert(Lease {
            pool: pid,
            id,
            text: id.encode(),
            lease_deadline,
            request_deadline,
            // The term it was granted with is not in the id: the pool's is.
            term_ms: pool.settings.term_ms as u32,
            epoch,
            granted_at: now,
            grant_seq,
            oks_seq,
            timer,
            adopted: true,
            unconfirmed: false,
            restored: false,
            answers: 1,
            idem: NO_KEY,
        });
        self.adopted.insert(id, Some(idx));
        Some(idx)
    }

    /// Removes a lease from the table at `now` (a re-adopted one stays dead
    /// in the map until its request deadline, and so does a restored one
    /// that ends while its pool's window is open; its `Idempotency-Key`
    /// expires with it). Outside a window nothing is re-adopted, and a
    /// restored lease is no more at risk than any this process granted: a
    /// restart that restored a million leases keeps no record of each.
    /// Returns what release and reclaim go on with: the lease itself is
    /// dropped where it lies, not moved out whole.
    fn remove_lease(&mut self, idx: usize, now: Ms) -> Removed {
        let lease = &self.leases[idx];
        let removed = Removed {
            pool: lease.pool,
            timer: lease.timer,
            capped: lease.is_capped(),
            epoch: lease.epoch,
            granted_at: lease.granted_at,
            grant_seq: lease.grant_seq,
            oks_seq: lease.oks_seq,
        };
        let pool = &mut self.pools[lease.pool.0 as usize];
        pool.learning.on_lease_left(lease.granted_at, now);
        if lease.idem != NO_KEY {
            pool.idem.remove(lease.idem);
        }
        pool.unconfirmed -= u32::from(lease.unconfirmed);
        if lease.adopted || lease.restored && pool.recovering(now) {
            let (id, request_deadline) = (lease.id, lease.request_deadline);
            self.bury(id, request_deadline);
        }
        self.leases.remove(idx);
        removed
    }

    /// Keeps a re-adopted id that was released or reclaimed dead until `until`,
    /// or until the id itself says its request ends if that is later: from
    /// a host whose clock is ahead of this one's, an id reads as alive longer
    /// than the capped deadline it was re-adopted with, and a later window
    /// would take it back once its tombstone were gone. After that,
    /// `readopt` refuses it anyway.
    fn bury(&mut self, id: SlotId, until: Ms) {
        let written = self.epoch.monotonic(EpochMs(id.fields().request_deadline_unix)).unwrap_or(0);
        let until = until.max(written);
        self.adopted.insert(id, None);
        let tombstone = self.tombstones.insert(id) as u32;
        self.wheel.insert(until, Timer::Tombstone(tombstone));
    }

    /// Takes back a lease whose holder stopped renewing (or hit the cap),
    /// and grants its slot to the head waiter.
    fn reclaim(&mut self, idx: usize, now: Ms) {
        let pid = self.take_back(idx, now);
        self.pump(pid, now);
    }

    /// `reclaim` but for the grant: its pool, whose queue the caller pumps.
    fn take_back(&mut self, idx: usize, now: Ms) -> PoolId {
        // A restored lease its holder has not shown for ends at the
        // snapshot's deadline, which the holder may have renewed past before
        // the crash (renewals during the downtime failed): not seen to end,
        // it is not kept dead, and its holder's next renewal re-adopts it.
        let lease = &mut self.leases[idx];
        lease.restored &= !lease.unconfirmed;
        let lease = self.remove_lease(idx, now);
        let pool = &mut self.pools[lease.pool.0 as usize];
        pool.held -= 1;
        if lease.capped {
            pool.stats.reclaimed_cap += 1;
        } else {
            pool.stats.reclaimed_term += 1;
        }
        lease.pool
    }

    /// Answers a waiter with `504` (its timer fired, or `cancel_timer` is set
    /// when the pool went away and the timer is still armed).
    fn time_out(&mut self, key: WaiterKey, pid: PoolId, now: Ms, cancel_timer: bool) {
        let pool = &mut self.pools[pid.0 as usize];
        let w = self.waiters.remove(&mut pool.queue, key);
        if cancel_timer {
            self.wheel.cancel(w.timer);
        }
        if w.idem != NO_KEY {
            pool.idem.remove(w.idem);
        }
        pool.stats.queue_timeouts += 1;
        let denial = self.left_queue(pid, now - w.enqueued_at, now);
        self.notices.push_back(Notice::TimedOut { owner: w.owner, denial });
    }

    /// Grants queued acquires, in order, while slots are free. Nobody
    /// waits, usually: that case is this one look, inlined into every
    /// caller (a release pays for no call setting up the loop).
    fn pump(&mut self, pid: PoolId, now: Ms) {
        if self.pools[pid.0 as usize].queue.head().is_some() {
            self.pump_queue(pid, now, now);
        }
    }

    /// `pump` for a pool whose queue holds someone, its gates read at `at`
    /// and its grants made at `now`: a late `advance` pumps at the
    /// millisecond before the next deadline it fires, so no waiter whose
    /// deadline that is gets a token or a slot that came after it. Kept out
    /// of line (its callers would take it in, and grow too large to be
    /// inlined).
    #[inline(never)]
    fn pump_queue(&mut self, pid: PoolId, at: Ms, now: Ms) {
        loop {
            let pool = &mut self.pools[pid.0 as usize];
            let Some(head) = pool.queue.head() else {
                return;
            };
            pool.refill_gate(at);
            let ramp = pool.learning.rises_at(at);
            match pool.blocked(at) {
                None => {
                    let w = self.waiters.remove(&mut pool.queue, head);
                    self.wheel.cancel(w.timer);
                    let grant = self.grant(pid, now, now - w.enqueued_at);
                    if w.idem != NO_KEY {
                        let idx = grant.slot.index();
                        self.pools[pid.0 as usize].idem.hold(w.idem, idx);
                        self.leases[idx as usize].idem = w.idem;
                    }
                    self.notices.push_back(Notice::Granted { owner: w.owner, grant });
                }
                Some((DenyReason::Concurrency, _)) => {
                    if let Some(rise) = ramp {
                        self.arm_wake(pid, rise);
                    }
                    return;
                }
                Some((_, wait)) => {
                    self.arm_wake(pid, at + wait);
                    return;
                }
            }
        }
    }

    /// Makes sure the pool is woken no later than `at`; one entry per pool.
    fn arm_wake(&mut self, pid: PoolId, at: Ms) {
        let pool = &mut self.pools[pid.0 as usize];
        match pool.wake {
            Some((armed, _)) if armed <= at => {}
            Some((_, key)) => {
                self.wheel.cancel(key);
                pool.wake = Some((at, self.wheel.insert(at, Timer::Wake(pid))));
            }
            None => pool.wake = Some((at, self.wheel.insert(at, Timer::Wake(pid)))),
        }
    }
}

#[cfg(test)]
mod tests;
