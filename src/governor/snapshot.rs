//! What the governor hands over for a snapshot and takes back at start (SPEC §11).
//!
//! Plain data only: held leases with their ids and deadlines, and per pool
//! what was learned, the rate gate's level, the counters and an open
//! re-adoption window. Every instant is in Unix milliseconds, so the process
//! that reads it back (with another monotonic clock) can place it. The file
//! format and its I/O belong to `state::snapshot`; nothing here reads a file
//! or a clock.

use super::idempotency::{Holder, IdemKey, NO_KEY};
use super::learn::Learning;
use super::lease::{Lease, PoolSeal, SlotId};
use super::pool::{Pool, PoolStats};
use super::{Governor, PoolId, Timer};
use crate::time::Ms;

/// When a snapshot was taken, which says how far its leases are the ones
/// held when the process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// At a stop, after the last request: its leases and counters are the
    /// process's last.
    AtStop,
    /// While running (periodically): leases may have been granted, renewed
    /// or released after it. Its leases are held unconfirmed until their
    /// holders renew or release them, one that looks expired is dropped but
    /// not kept dead (its holder may have renewed it since and can be
    /// re-adopted), and its counters, older than the last scrape may be,
    /// start again from zero.
    WhileRunning,
}

/// A governor's state at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub pools: Vec<PoolState>,
    pub leases: Vec<HeldLease>,
    /// The `Idempotency-Key` of each held lease granted under one. Apart
    /// from the leases, which stay small (most have no key), so the copy of
    /// a million of them on the event loop stays cheap.
    pub keys: Vec<HeldKey>,
    /// Ids re-adopted and since released or reclaimed: while a window is
    /// open they must stay dead.
    pub dead_adopted: Vec<SlotId>,
    /// The Unix ms of the instant it describes.
    pub written_at: u64,
}

/// One configured pool.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolState {
    pub name: Box<str>,
    /// Its instants in Unix ms.
    pub learning: Learning,
    /// Rate-gate tokens and the Unix µs of the next one.
    pub gate: Option<(u32, u64)>,
    pub stats: PoolStats,
    /// The end of an open re-adoption window, Unix ms.
    pub recovering_until: Option<u64>,
    /// Retired by a reload, its leases draining: written while it holds
    /// some, and taken back retired, so the reload that names it again
    /// counts them.
    pub retired: bool,
}

/// One held slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldLease {
    /// Its place in the lease table (the id's own index, unless re-adopted).
    pub index: u32,
    /// Index into `Snapshot::pools`.
    pub pool: u32,
    pub id: SlotId,
    pub lease_deadline: u64,
    pub request_deadline: u64,
    pub granted_at: u64,
    pub grant_seq: u64,
    /// The term it was granted with, which its renewals extend it by.
    /// `None` read from a file that does not carry it (format version 2):
    /// its pool's term then.
    pub term_ms: Option<u32>,
    pub epoch: u32,
    pub adopted: bool,
    /// Restored by a snapshot taken while running and not confirmed since
    /// (`Lease::unconfirmed`): a stop in the re-adoption window keeps it so,
    /// or the next start would count it, and refuse the holder of the grant
    /// that took its place.
    pub unconfirmed: bool,
}

/// The `Idempotency-Key` a held lease was granted under, scoped to its
/// caller's pool key as the store holds it: a retry after the restart gets
/// the same slot again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldKey {
    /// The lease's place in the lease table (`HeldLease::index`).
    pub index: u32,
    pub key: IdemKey,
}

/// What `import` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Restored {
    /// Leases held again.
    pub held: usize,
    /// Of them, those of retired pools (their names no longer configured).
    pub retired: usize,
    /// Leases whose deadline passed while no process held them: reclaimed now.
    pub reclaimed: usize,
    /// `Idempotency-Key`s of held leases taken back into their pools' stores.
    pub keys: usize,
}

impl<T: Copy> Governor<T> {
    /// `at` in Unix milliseconds.
    pub fn unix_ms(&self, at: Ms) -> u64 {
        self.epoch.wall(at).0
    }

    /// Everything a successor needs, at `now`. A pool retired by a reload is
    /// in it while its leases drain. Costs one pass over the lease table and
    /// copies it: call it rarely, and write the result elsewhere.
    pub fn export(&self, now: Ms) -> Snapshot {
        self.export_into(now, Vec::new())
    }

    /// `export`, filling `leases` (cleared first): a buffer kept from the
    /// previous snapshot spares the loop the page faults of a fresh one.
    pub fn export_into(&self, now: Ms, mut leases: Vec<HeldLease>) -> Snapshot {
        let mut slot_of = vec![u32::MAX; self.pools.len()];
        let mut pools = Vec::new();
        for (idx, pool) in self.pools.iter().enumerate().filter(|(_, p)| !p.retired || p.held > 0) {
            slot_of[idx] = pools.len() as u32;
            pools.push(PoolState {
                name: pool.name.clone(),
                learning: pool.learning.rebased(|at| self.unix_ms(at)),
                gate: pool.gate.as_ref().map(|g| {
                    let (tokens, next_us) = g.level();
                    (tokens, self.unix_ms(0) * 1000 + next_us)
                }),
                stats: pool.stats,
                recovering_until: pool.recovering_until.filter(|&until| until > now).map(|u| self.unix_ms(u)),
                retired: pool.retired,
            });
        }
        leases.clear();
        leases.reserve(self.leases.len());
        let mut keys = Vec::new();
        for (index, l) in &self.leases {
            let pool = slot_of[l.pool.0 as usize];
            if pool == u32::MAX {
                continue;
            }
            leases.push(HeldLease {
                index: index as u32,
                pool,
                id: l.id,
                lease_deadline: self.unix_ms(l.lease_deadline),
                request_deadline: self.unix_ms(l.request_deadline),
                granted_at: self.unix_ms(l.granted_at),
                grant_seq: l.grant_seq,
                term_ms: Some(l.term_ms),
                epoch: l.epoch,
                adopted: l.adopted,
                unconfirmed: l.unconfirmed,
            });
            if l.idem != NO_KEY {
                keys.push(HeldKey { index: index as u32, key: *self.pools[l.pool.0 as usize].idem.key(l.idem) });
            }
        }
        let dead_adopted = self.adopted.iter().filter(|(_, held)| held.is_none()).map(|(id, _)| *id).collect();
        Snapshot { pools, leases, keys, dead_adopted, written_at: self.unix_ms(now) }
    }

    /// Takes back a snapshot at `now`, before anything was granted: leases
    /// whose deadline passed meanwhile are reclaimed at once, the rest are
    /// held again under their ids. A retired pool this configuration does
    /// not name comes back retired, holding its leases until they end. A
    /// snapshot that does not fit this configuration (a pool unknown, a
    /// lease out of place) is refused whole and changes nothing.
    pub fn import(&mut self, snap: &Snapshot, taken: Taken, now: Ms) -> Result<Restored, String> {
        if !self.leases.is_empty() {
            return Err("slots were granted before the snapshot was loaded".into());
        }
        let mut pids = Vec::with_capacity(snap.pools.len());
        // Retired pools to add, numbered after the configured ones.
        let mut added: Vec<&str> = Vec::new();
        for p in &snap.pools {
            let pid = match self.pool_id(p.name.as_bytes()) {
                Some(pid) => pid,
                None if p.retired && !added.contains(&&*p.name) => {
                    added.push(&p.name);
                    PoolId((self.pools.len() + added.len() - 1) as u32)
                }
                None if p.retired => return Err(format!("pool `{}` appears twice", p.name)),
                None => return Err(format!("pool `{}` is not configured", p.name)),
            };
            if pids.contains(&pid) {
                return Err(format!("pool `{}` appears twice", p.name));
            }
            pids.push(pid);
        }
        let mut indices: Vec<u32> = snap.leases.iter().map(|l| l.index).collect();
        indices.sort_unstable();
        if indices.windows(2).any(|w| w[0] == w[1]) {
            return Err("two leases claim one place in the lease table".into());
        }
        // The file's digest says it is whole, not that its numbers are sane:
        // every id must be one this server signed for its pool, so a lease's
        // place is one the writing process really gave out (and the table
        // built from them no larger than it had).
        let seals: Vec<PoolSeal> = (snap.pools.iter().zip(&pids))
            .map(|(p, pid)| self.pools.get(pid.0 as usize).map_or_else(|| self.key.seal(&p.name), |pool| pool.seal))
            .collect();
        for l in &snap.leases {
            if l.pool as usize >= pids.len() || l.lease_deadline > l.request_deadline {
                return Err("a lease names no pool of the snapshot or outlives its request deadline".into());
            }
            if self.key.verify(seals[l.pool as usize], &l.id).is_none() {
                return Err("a lease's id is not one this server signed for its pool".into());
            }
            if !l.adopted && l.id.index() != l.index {
                return Err("a lease is not at the place its id names".into());
            }
        }
        // A re-adopted lease sat wherever the writing process had room, a
        // place its id does not name: it is given the first place no other
        // lease's id names, and its idempotency key follows it there.
        let mut named: Vec<u32> = snap.leases.iter().filter(|l| !l.adopted).map(|l| l.index).collect();
        named.sort_unstable();
        let mut room = (0..=u32::MAX).filter(|i| named.binary_search(i).is_err());
        let mut moved = std::collections::HashMap::new();
        let mut place = |l: &HeldLease| {
            if !l.adopted {
                return l.index;
            }
            let place = room.next().expect("fewer leases than places");
            moved.insert(l.index, place);
            place
        };
        let places: Vec<u32> = snap.leases.iter().map(&mut place).collect();
        if snap.keys.iter().any(|k| indices.binary_search(&k.index).is_err()) {
            return Err("an idempotency key names no held lease".into());
        }

        // A wall clock that reads before the snapshot was written was set
        // back since: the snapshot is read as if no time had passed since it
        // was written, so no deadline gains the step (a request deadline is
        // never extended). A clock set forward cannot be told from downtime.
        let base = self.unix_ms(0).saturating_add(snap.written_at.saturating_sub(self.unix_ms(now)));
        let monotonic = |unix: u64| unix.saturating_sub(base);
        for name in added {
            self.names.insert(name.as_bytes().into(), PoolId(self.pools.len() as u32));
            self.pools.push(Pool::retired(name, self.key.seal(name)));
        }
        for (p, &pid) in snap.pools.iter().zip(&pids) {
            let pool = &mut self.pools[pid.0 as usize];
            let (concurrency, adaptive) = (pool.settings.concurrency, pool.settings.adaptive);
            pool.learning = p.learning.rebased(|unix| unix.saturating_sub(base)).bounded(now, concurrency, adaptive);
            if let (Some(gate), Some((tokens, next_us))) = (&mut pool.gate, p.gate) {
                gate.restore_level(tokens, next_us.saturating_sub(base.saturating_mul(1000)), now);
            }
            if taken == Taken::AtStop {
                pool.stats = p.stats;
            }
            let until = p.recovering_until.map(|u| u.saturating_sub(base)).filter(|&u| u > now);
            pool.recovering_until = until;
            if let Some(until) = until {
                self.arm_wake(pid, until);
            }
        }
        // A dead re-adopted id's request deadline is not in the file; none is
        // later than the longest request cap from now (the pools are those of
        // the process that wrote it), so it is kept dead until then.
        let dead_until =
            now.saturating_add(self.pools.iter().map(|p| p.settings.request_timeout_ms).max().unwrap_or(0));
        let mut restored = Restored::default();
        let mut table = Vec::with_capacity(snap.leases.len());
        for (l, &place) in snap.leases.iter().zip(&places) {
            let pid = pids[l.pool as usize];
            let (lease_deadline, request_deadline) = (monotonic(l.lease_deadline), monotonic(l.request_deadline));
            let pool = &mut self.pools[pid.0 as usize];
            // Its holder renews on the interval its grant named, whatever the
            // pool's term is now (a reload or a deploy since may have lowered it).
            let term_ms = l.term_ms.unwrap_or(pool.settings.term_ms as u32);
            // A holder that renews has a lease deadline within one term of its
            // last renewal, so this changes nothing for it. A lease the server
            // held to its request deadline (a proxied exchange, SPEC §12) had
            // its holder die with the process: it counts for one term, as the
            // upstream call may still run, and is then reclaimed by its term.
            let lease_deadline = lease_deadline.min(now.saturating_add(term_ms as Ms));
            if lease_deadline <= now {
                restored.reclaimed += 1;
                if lease_deadline >= request_deadline {
                    pool.stats.reclaimed_cap += 1;
                } else {
                    pool.stats.reclaimed_term += 1;
                }
                if l.adopted && taken == Taken::AtStop {
                    self.bury(l.id, dead_until);
                }
                continue;
            }
            pool.held += 1;
            let unconfirmed = taken == Taken::WhileRunning || l.unconfirmed;
            pool.unconfirmed += u32::from(unconfirmed);
            restored.held += 1;
            restored.retired += usize::from(pool.retired);
            let timer = self.wheel.insert(lease_deadline, Timer::Lease(place));
            if l.adopted {
                self.adopted.insert(l.id, Some(place as usize));
            }
            let lease = Lease {
                pool: pid,
                id: l.id,
                text: l.id.encode(),
                lease_deadline,
                request_deadline,
                term_ms,
                epoch: l.epoch,
                granted_at: monotonic(l.granted_at),
                grant_seq: l.grant_seq,
                // Successes before the restart are not known to have run beside it.
                oks_seq: self.pools[pid.0 as usize].learning.oks,
                timer,
                adopted: l.adopted,
                unconfirmed,
                restored: true,
                answers: 1,
                idem: NO_KEY,
            };
            table.push((place as usize, lease));
        }
        self.leases = table.into_iter().collect();
        // A reclaimed lease's key expires with it. Every held lease's key is
        // taken back, past an `idempotencyKeys` lowered since the stop too:
        // new keys wait until the store is under its bound again.
        for k in &snap.keys {
            let place = moved.get(&k.index).copied().unwrap_or(k.index);
            let Some(lease) = self.leases.get_mut(place as usize) else { continue };
            let store = &mut self.pools[lease.pool.0 as usize].idem;
            if store.find(&k.key).is_none() {
                restored.keys += 1;
                lease.idem = store.restore(k.key, Holder::Lease(place));
            }
        }
        for id in &snap.dead_adopted {
            self.bury(*id, dead_until);
        }
        Ok(restored)
    }
}

impl<T: Copy> Governor<T> {
    /// A snapshot under this secret refused because the pools' settings
    /// changed (a deploy): its holders still hold their slots and renew at
    /// the old cadence, by the lease deadlines it holds, which a lowered
    /// `termMs` would put past a window of the new term. Keeps each pool of
    /// the same name in its re-adoption window until the last of those
    /// deadlines (at most its request cap from `now`: a re-adopted slot is
    /// held no longer anyway), and lets re-adoption take back as many slots
    /// as it holds there, past a `concurrency` lowered below them. Returns
    /// how many pools' windows it set.
    pub fn await_refused_holders(&mut self, snap: &Snapshot, now: Ms) -> usize {
        let mut until: Vec<Option<Ms>> = vec![None; self.pools.len()];
        let mut holders = vec![0u32; self.pools.len()];
        for l in &snap.leases {
            let Some(pid) = snap.pools.get(l.pool as usize).and_then(|p| self.pool_id(p.name.as_bytes())) else {
                continue;
            };
            let pool = &self.pools[pid.0 as usize];
            let Some(deadline) = self.epoch.monotonic(crate::time::EpochMs(l.lease_deadline)) else {
                continue;
            };
            let deadline = deadline.min(now.saturating_add(pool.settings.request_timeout_ms));
            let slot = &mut until[pid.0 as usize];
            if deadline > now && slot.is_none_or(|u| u < deadline) {
                *slot = Some(deadline);
            }
            holders[pid.0 as usize] += u32::from(deadline > now);
        }
        let mut pools = 0;
        for (idx, until) in until.into_iter().enumerate() {
            if let Some(until) = until.filter(|_| !self.pools[idx].retired) {
                self.keep_recovering(super::PoolId(idx as u32), until);
                self.pools[idx].expect_holders(holders[idx], until);
                pools += 1;
            }
        }
        pools
    }
}

#[cfg(test)]
mod tests {
    use super::Taken;
    use crate::config::Config;
    use crate::governor::{Admission, DenyReason, Governor, Outcome, RateInfo};

    const BASE: u64 = 1_800_000_000_000;

    fn governor(epoch_base_ms: u64) -> Governor {
        let config = Config::parse(
            br#"{"pools":{"p":{"keys":["k"],"concurrency":4,"termMs":1000,"renewIntervalMs":300,"rpm":600},
                          "q":{"keys":["k"],"concurrency":2,"termMs":5000,"renewIntervalMs":1000}}}"#,
        )
        .unwrap();
        // Each process its own random bytes: the epoch tells them apart.
        let entropy = crate::governor::Entropy::seeded(epoch_base_ms);
        let mut g = Governor::new(&crate::api::pool_settings(&config), entropy);
        g.set_identity(&[7; 32], crate::time::Epoch::at(crate::time::EpochMs(epoch_base_ms)));
        g
    }

    /// Pool `p` of 2 slots with a term of `term` ms, renewed every third of it,
    /// and `q` with the defaults; the process's Unix time starts at `epoch`.
    fn with_term(term: u64, epoch: u64) -> Governor {
        let json = format!(
            r#"{{"pools":{{"p":{{"keys":["k"],"concurrency":2,"termMs":{term},"renewIntervalMs":{}}},"q":{{"keys":["k"]}}}}}}"#,
            term / 3
        );
        let config = Config::parse(json.as_bytes()).unwrap();
        let mut g: Governor =
            Governor::new(&crate::api::pool_settings(&config), crate::governor::Entropy::seeded(term));
        g.set_identity(&[7; 32], crate::time::Epoch::at(crate::time::EpochMs(epoch)));
        g
    }

    /// Pool `p` of `concurrency` slots, static; Unix time starts at `epoch`.
    fn with_limit(concurrency: u32, epoch: u64) -> Governor {
        let json = format!(r#"{{"pools":{{"p":{{"keys":["k"],"concurrency":{concurrency},"adaptive":false}}}}}}"#);
        let config = Config::parse(json.as_bytes()).unwrap();
        let mut g: Governor =
            Governor::new(&crate::api::pool_settings(&config), crate::governor::Entropy::seeded(epoch));
        g.set_identity(&[7; 32], crate::time::Epoch::at(crate::time::EpochMs(epoch)));
        g
    }

    fn grant(g: &mut Governor, pool: &str, now: u64) -> crate::governor::Grant {
        match g.acquire(g.pool_id(pool).unwrap(), 0, 0, now) {
            Admission::Granted(grant) => grant,
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    #[test]
    fn a_successor_holds_the_same_slots_and_knows_what_was_learned() {
        let mut old = governor(BASE);
        let p = old.pool_id("p").unwrap();
        let kept = grant(&mut old, "p", 100);
        let short = grant(&mut old, "p", 100);
        let released = grant(&mut old, "p", 100);
        let other = grant(&mut old, "q", 100);
        // Two refusals with two calls in flight teach a limit of 2, and a cool-down.
        let refusal = Outcome {
            status: Some(429),
            rate: RateInfo { retry_after_ms: Some(20_000), ..RateInfo::default() },
            ..Outcome::default()
        };
        assert!(old.release(p, &released.text, Some(&refusal), 200));
        assert_eq!(old.renew(p, &kept.text, 900), Ok(1900));
        let learned = old.pool(p).learning.clone();
        let snap = old.export(950);

        // The successor starts 1.5 s of Unix time later: `short` (deadline at
        // 1100) expired while nobody held it; `kept` was renewed to 1900.
        let mut new = governor(BASE + 1500);
        let restored = new.import(&snap, Taken::AtStop, 0).unwrap();
        assert_eq!((restored.held, restored.reclaimed), (2, 1));
        let p = new.pool_id("p").unwrap();
        assert_eq!(new.pool(p).held, 1);
        assert_eq!(new.pool(p).effective_limit(), learned.effective);
        assert_eq!(new.pool(p).learning.cooldown_until, learned.cooldown_until.saturating_sub(1500));
        assert_eq!(new.pool(p).stats.reclaimed_term, 1);
        assert_eq!(new.renew(p, &kept.text, 100), Ok(1100));
        assert_eq!(new.renew(p, &short.text, 100), Err(crate::governor::RenewError::NotFound));
        let q = new.pool_id("q").unwrap();
        assert!(new.release(q, &other.text, None, 100));
        // The restored lease is reclaimed at its term as any other.
        new.advance(1100);
        assert_eq!(new.pool(p).held, 0);
        assert_eq!(new.pool(p).stats.reclaimed_term, 2);
    }

    #[test]
    fn what_placed_the_learned_budget_among_reports_is_restored_in_the_successors_time() {
        let mut old = governor(BASE);
        let p = old.pool_id("p").unwrap();
        let _held = grant(&mut old, "p", 100);
        let reported = grant(&mut old, "p", 200);
        let spent = Outcome {
            status: Some(200),
            rate: RateInfo { remaining: Some(5), reset_ms: Some(10_000), ..RateInfo::default() },
            ..Outcome::default()
        };
        assert!(old.release(p, &reported.text, Some(&spent), 300));
        let learned = old.pool(p).learning.clone();
        assert!(learned.budget_not_before > 0 && learned.budget_seq > 0, "{learned:?}");
        let snap = old.export(400);
        let mut new = governor(BASE + 1500);
        new.import(&snap, Taken::AtStop, 0).unwrap();
        let restored = &new.pool(new.pool_id("p").unwrap()).learning;
        assert_eq!(restored.budget_not_before, learned.budget_not_before - 1500);
        assert_eq!(restored.budget_seq, learned.budget_seq);
        assert_eq!(restored.budget.map(|b| b.reset_at), learned.budget.map(|b| b.reset_at - 1500));
    }

    #[test]
    fn a_wall_clock_set_back_between_stop_and_start_extends_no_deadline() {
        let mut old = governor(BASE);
        let p = old.pool_id("p").unwrap();
        let held = grant(&mut old, "p", 100);
        assert_eq!(held.request_deadline, 60_100);
        assert_eq!(old.renew(p, &held.text, 900), Ok(1900));
        let snap = old.export(950);
        // The successor's wall clock reads an hour before the stop: read
        // as it stood, the slot could be held an hour past its request
        // deadline. It is read as of the stop, its 59 150 ms of request
        // time left and its 950 ms of term.
        let mut new = governor(BASE - 3_600_000);
        assert_eq!(new.import(&snap, Taken::AtStop, 0).unwrap().held, 1);
        for at in (900..59_000).step_by(900) {
            assert_eq!(new.renew(p, &held.text, at), Ok((at + 1000).min(59_150)), "at {at}");
        }
        assert_eq!(new.renew(p, &held.text, 59_100), Err(crate::governor::RenewError::Capped));
        new.advance(59_150);
        assert_eq!(new.pool(p).held, 0);
        assert_eq!(new.pool(p).stats.reclaimed_cap, 1);
    }

    #[test]
    fn a_lease_the_server_held_for_a_proxied_exchange_lasts_one_term_after_a_restore() {
        let mut old = governor(BASE);
        let p = old.pool_id("p").unwrap();
        let proxied = grant(&mut old, "p", 100);
        old.hold_to_request_deadline(&proxied.slot);
        assert!(proxied.request_deadline > 100 + 10_000, "a request deadline far beyond the term");
        // A periodic snapshot, then a crash: the successor starts 200 ms later.
        let snap = old.export(150);
        let mut new = governor(BASE + 200);
        assert_eq!(new.import(&snap, Taken::WhileRunning, 0).unwrap().held, 1);
        new.advance(999);
        assert_eq!(new.pool(p).held, 1, "counted for one term: the upstream call may still run");
        new.advance(1000);
        assert_eq!(new.pool(p).held, 0, "its holder died with the process");
        assert_eq!((new.pool(p).stats.reclaimed_term, new.pool(p).stats.reclaimed_cap), (1, 0));
    }

    #[test]
    fn the_rate_gate_and_an_open_window_carry_over() {
        let mut old = governor(BASE);
        old.open_recovery_window(0);
        let p = old.pool_id("p").unwrap();
        let snap = old.export(400);
        let mut new = governor(BASE + 500);
        new.import(&snap, Taken::AtStop, 0).unwrap();
        // 100 ms of the 1 s window are left.
        match new.acquire(p, 0, 0, 0) {
            Admission::Denied(d) => assert_eq!((d.reason, d.retry_after_ms), (DenyReason::Recovering, 500)),
            other => panic!("expected the window, got {other:?}"),
        }
        new.advance(500);
        for _ in 0..3 {
            grant(&mut new, "p", 500);
        }
        let tokens = new.pool(p).rpm_remaining();
        assert_eq!(tokens, Some(7));
        let snap = new.export(500);
        let mut third = governor(BASE + 1000);
        third.import(&snap, Taken::AtStop, 0).unwrap();
        assert_eq!(third.pool(p).rpm_remaining(), tokens);
    }

    #[test]
    fn a_held_leases_idempotency_key_names_it_again_after_the_import() {
        use crate::governor::idempotency::IdemKey;
        let key = |text: &str| IdemKey::new(9, text.as_bytes()).unwrap();
        let mut old = governor(BASE);
        let p = old.pool_id("p").unwrap();
        let Ok(Admission::Granted(kept)) = old.acquire_keyed(p, &key("kept"), 0, 1, 0) else { panic!("granted") };
        let Ok(Admission::Granted(done)) = old.acquire_keyed(p, &key("done"), 0, 2, 0) else { panic!("granted") };
        assert!(old.release(p, &done.text, None, 10));
        let snap = old.export(10);
        assert_eq!(snap.keys.len(), 1, "a released lease's key is gone");

        let mut new = governor(BASE + 100);
        assert_eq!(new.import(&snap, Taken::AtStop, 0).unwrap().keys, 1);
        let Ok(Admission::Granted(again)) = new.acquire_keyed(p, &key("kept"), 0, 3, 0) else { panic!("granted") };
        assert_eq!((again.slot, new.pool(p).held), (kept.slot, 1), "the same slot, no second one");
        let other_caller = IdemKey::new(10, b"kept").unwrap();
        let Ok(Admission::Granted(theirs)) = new.acquire_keyed(p, &other_caller, 0, 4, 0) else { panic!("granted") };
        assert_ne!(theirs.slot, kept.slot, "still scoped to the pool key that presented it");
        // The key expires with its restored lease.
        assert!(new.release(p, &kept.text, None, 10));
        let Ok(Admission::Granted(fresh)) = new.acquire_keyed(p, &key("kept"), 0, 5, 10) else { panic!("granted") };
        assert_ne!(fresh.slot, kept.slot);
    }

    #[test]
    fn a_retired_pools_leases_come_back_retired_and_count_when_it_is_named_again() {
        let settings = |json: &str| crate::api::pool_settings(&Config::parse(json.as_bytes()).unwrap());
        let both = r#"{"pools":{"p":{"keys":["k"],"concurrency":4},"r":{"keys":["k"],"concurrency":2}}}"#;
        let only_p = r#"{"pools":{"p":{"keys":["k"],"concurrency":4}}}"#;
        let mut old: Governor = Governor::new(&settings(both), crate::governor::Entropy::seeded(1));
        old.set_identity(&[7; 32], crate::time::Epoch::at(crate::time::EpochMs(BASE)));
        let (a, b) = (grant(&mut old, "r", 0), grant(&mut old, "r", 0));
        old.reconfigure(&settings(only_p), 0);
        let snap = old.export(10);

        let mut new: Governor = Governor::new(&settings(only_p), crate::governor::Entropy::seeded(2));
        new.set_identity(&[7; 32], crate::time::Epoch::at(crate::time::EpochMs(BASE + 100)));
        let restored = new.import(&snap, Taken::AtStop, 0).unwrap();
        assert_eq!((restored.held, restored.retired), (2, 2));
        let r = new.pool_id("r").expect("brought back");
        assert!(new.pool(r).retired && new.pool(r).held == 2);
        assert!(new.renew(r, &a.text, 10).is_ok(), "it drains as before the stop");
        assert!(matches!(new.acquire(r, 0, 0, 10), Admission::Denied(_)), "a retired pool grants nothing");
        assert_eq!(new.export(10).pools.len(), 2, "written again while it holds leases");

        // Named again: its two leases fill its limit.
        new.reconfigure(&settings(both), 20);
        assert!(matches!(new.acquire(r, 0, 0, 20), Admission::Denied(_)), "held 2 of 2");
        assert!(new.release(r, &b.text, None, 20));
        assert!(matches!(new.acquire(r, 0, 0, 20), Admission::Granted(_)));
    }

    #[test]
    fn every_held_key_comes_back_past_a_bound_lowered_since_the_stop() {
        use crate::governor::idempotency::IdemKey;
        let key = |text: &str| IdemKey::new(9, text.as_bytes()).unwrap();
        let mut old = governor(BASE);
        let p = old.pool_id("p").unwrap();
        let held: Vec<_> = ["a", "b", "c"]
            .iter()
            .enumerate()
            .map(|(i, k)| match old.acquire_keyed(p, &key(k), 0, i as u64, 0) {
                Ok(Admission::Granted(g)) => g,
                _ => panic!("granted"),
            })
            .collect();
        let snap = old.export(10);

        let config = Config::parse(
            br#"{"pools":{"p":{"keys":["k"],"concurrency":4,"termMs":1000,"renewIntervalMs":300,"rpm":600,
                               "idempotencyKeys":1},
                          "q":{"keys":["k"],"concurrency":2,"termMs":5000,"renewIntervalMs":1000}}}"#,
        )
        .unwrap();
        let mut new: Governor =
            Governor::new(&crate::api::pool_settings(&config), crate::governor::Entropy::seeded(BASE + 100));
        new.set_identity(&[7; 32], crate::time::Epoch::at(crate::time::EpochMs(BASE + 100)));
        assert_eq!(new.import(&snap, Taken::AtStop, 0).unwrap().keys, 3, "none dropped for the lower bound");
        assert!(new.release(p, &held[0].text, None, 10));
        // Under the bound again only once two of the three are gone: `b`'s
        // retry still names its slot, and a new key waits for room.
        let Ok(Admission::Granted(again)) = new.acquire_keyed(p, &key("b"), 0, 3, 10) else { panic!("granted") };
        assert_eq!((again.slot, new.pool(p).held), (held[1].slot, 2), "the same slot, no second one");
        assert!(new.acquire_keyed(p, &key("new"), 0, 4, 10).is_err(), "the store is over its bound");
    }

    #[test]
    fn a_dead_readopted_id_carried_over_is_forgotten_after_the_longest_request_cap() {
        let mut crashed = governor(BASE - 1000);
        let mut old = governor(BASE);
        let p = old.pool_id("p").unwrap();
        let (released, dropped) = (grant(&mut crashed, "p", 0), grant(&mut crashed, "p", 0));
        old.open_recovery_window(0);
        assert!(old.release(p, &released.text, None, 10));
        assert!(old.renew(p, &dropped.text, 10).is_ok());
        // `dropped` is written held; its holder is gone by the restart.
        let snap = old.export(20);
        assert_eq!(snap.dead_adopted, [released.slot]);
        let mut new = governor(BASE + 2000);
        assert_eq!(new.import(&snap, Taken::AtStop, 0).unwrap().reclaimed, 1);
        assert_eq!(new.export(0).dead_adopted.len(), 2, "both stay dead");
        // Nothing could adopt them after the longest cap (60 s): they go, and
        // do not ride along in every later snapshot.
        new.advance(60_000);
        assert!(new.export(60_000).dead_adopted.is_empty());
        assert_eq!(new.timers_total(), 0);
    }

    /// A snapshot taken while running, then a crash: what was granted,
    /// renewed or released after it is unknown, so it is not taken for the
    /// last word on who holds what.
    #[test]
    fn a_snapshot_taken_while_running_leaves_room_for_what_happened_after_it() {
        // Pool `q`: 2 slots, a term of 5 s. `a` is released after the
        // snapshot and `c` granted in its place; then the crash.
        let mut old = governor(BASE);
        let q = old.pool_id("q").unwrap();
        let (a, b) = (grant(&mut old, "q", 0), grant(&mut old, "q", 0));
        let snap = old.export(100);
        assert!(old.release(q, &a.text, None, 200));
        let c = grant(&mut old, "q", 300);
        let mut new = governor(BASE + 1000);
        assert_eq!(new.import(&snap, Taken::WhileRunning, 0).unwrap().held, 2);
        new.open_recovery_window(0);
        assert_eq!(new.pool(q).stats.grants, 0, "its counters start again from zero");
        assert!(new.renew(q, &b.text, 10).is_ok());
        // `a`, restored but not renewed, does not keep `c`'s holder out.
        assert!(new.renew(q, &c.text, 20).is_ok(), "a grant the snapshot never saw is re-adopted");
        assert_eq!(new.pool(q).stats.readopted, 1);
        // `a`'s holder is gone: its restored lease ends at its deadline, and
        // the two live holders are what the pool holds.
        new.advance(4_500);
        assert_eq!((new.pool(q).held, new.pool(q).unconfirmed), (2, 0));

        // Had `a`'s holder renewed anyway, after `c`'s was re-adopted: the
        // confirmed leases fill the pool, so `a` is one too many and gone.
        let mut late = governor(BASE + 1000);
        late.import(&snap, Taken::WhileRunning, 0).unwrap();
        late.open_recovery_window(0);
        assert!(late.renew(q, &b.text, 10).is_ok());
        assert!(late.renew(q, &c.text, 20).is_ok());
        assert_eq!(late.renew(q, &a.text, 30), Err(crate::governor::RenewError::NotFound));
        assert_eq!((late.pool(q).held, late.pool(q).unconfirmed), (2, 0), "never over its limit");
        assert_eq!(late.pool(q).stats.reclaimed_term, 1);
        assert_eq!(late.renew(q, &a.text, 40), Err(crate::governor::RenewError::NotFound));
        // Room again (`c` released): `a` is re-adopted as any unknown id is.
        assert!(late.release(q, &c.text, None, 50));
        assert!(late.renew(q, &a.text, 60).is_ok());
        assert_eq!(late.pool(q).held, 2);

        // Taken at a stop, the same file is the last word: no room is left.
        let mut stopped = governor(BASE + 1000);
        stopped.import(&snap, Taken::AtStop, 0).unwrap();
        stopped.open_recovery_window(0);
        assert_eq!(stopped.pool(q).stats.grants, 2, "a stop's counters go on");
        assert!(stopped.renew(q, &c.text, 20).is_err());
    }

    /// A graceful stop in the window that follows a periodic snapshot's
    /// restore keeps its leases unconfirmed: the next start does not count
    /// one whose holder has not shown, so the holder of the grant that took
    /// its place is still re-adopted.
    #[test]
    fn a_stop_in_the_window_keeps_the_periodic_snapshots_leases_unconfirmed() {
        let mut old = governor(BASE);
        let q = old.pool_id("q").unwrap();
        let (a, b) = (grant(&mut old, "q", 0), grant(&mut old, "q", 0));
        let snap = old.export(100);
        assert!(old.release(q, &a.text, None, 200));
        let c = grant(&mut old, "q", 300);
        // The crash, a start from the periodic snapshot, and a stop at once.
        let mut mid = governor(BASE + 1000);
        mid.import(&snap, Taken::WhileRunning, 0).unwrap();
        mid.open_recovery_window(0);
        let stop = mid.export(10);
        assert!(stop.leases.iter().all(|l| l.unconfirmed));
        let mut new = governor(BASE + 1500);
        assert_eq!(new.import(&stop, Taken::AtStop, 0).unwrap().held, 2);
        assert!(new.pool(q).recovering(0), "the window goes on");
        assert_eq!(new.pool(q).unconfirmed, 2);
        assert!(new.renew(q, &b.text, 10).is_ok());
        assert!(new.renew(q, &c.text, 20).is_ok(), "a grant the snapshots never saw is re-adopted");
        assert_eq!(new.pool(q).stats.readopted, 1);
        // A confirmed lease is written so, and restored counting.
        let confirmed = new.export(30);
        let held = |l: &&super::HeldLease| l.id == b.slot;
        assert!(!confirmed.leases.iter().find(held).unwrap().unconfirmed);
    }

    /// A lease a periodic snapshot restored that its holder releases in the
    /// window stays dead as a re-adopted one does: this process saw it end,
    /// so a renewal after that (a holder's stray timer) is `404` and a
    /// second release `false`, not a re-adoption.
    #[test]
    fn a_restored_lease_released_in_the_window_is_never_readopted() {
        use crate::governor::RenewError;
        let mut old = governor(BASE);
        let q = old.pool_id("q").unwrap();
        let a = grant(&mut old, "q", 0);
        let snap = old.export(100);
        let mut new = governor(BASE + 1000);
        new.import(&snap, Taken::WhileRunning, 0).unwrap();
        new.open_recovery_window(0);
        assert!(new.release(q, &a.text, None, 10));
        assert_eq!(new.renew(q, &a.text, 20), Err(RenewError::NotFound), "released");
        assert!(!new.release(q, &a.text, None, 30), "released once");
        assert_eq!((new.pool(q).held, new.pool(q).stats.readopted), (0, 0));
    }

    /// A planned restart restores every held lease and opens no window:
    /// their releases keep no record of each id (nothing is re-adopted to
    /// guard against), so a million restored leases leave no tombstones in
    /// memory and none in every later snapshot.
    #[test]
    fn a_restored_lease_released_outside_a_window_leaves_no_record() {
        let mut old = governor(BASE);
        let q = old.pool_id("q").unwrap();
        let a = grant(&mut old, "q", 0);
        let snap = old.export(100);
        let mut new = governor(BASE + 1000);
        new.import(&snap, Taken::AtStop, 0).unwrap();
        assert!(!new.pool(q).recovering(10));
        assert!(new.release(q, &a.text, None, 10));
        assert!(new.export(20).dead_adopted.is_empty());
        assert_eq!(new.timers_total(), 0);
    }

    /// A lease a periodic snapshot restored ends at the snapshot's deadline,
    /// which its holder renewed past before the crash. Its renewals during
    /// the downtime failed, and the next one comes after that deadline: the
    /// lease was not seen to end, and the renewal re-adopts it in the window.
    #[test]
    fn a_restored_lease_reclaimed_before_its_holder_shows_is_readopted() {
        let mut old = governor(BASE);
        let q = old.pool_id("q").unwrap();
        let b = grant(&mut old, "q", 0);
        let snap = old.export(100);
        // After the snapshot: `b` now ends at the old process's 8 000.
        assert!(old.renew(q, &b.text, 3_000).is_ok());
        // The crash; this process starts at the old one's 4 200, and the
        // snapshot's deadline for `b` (5 000 there) is its 800.
        let mut new = governor(BASE + 4_200);
        new.import(&snap, Taken::WhileRunning, 0).unwrap();
        new.open_recovery_window(0);
        new.advance(800);
        assert_eq!((new.pool(q).held, new.pool(q).stats.reclaimed_term), (0, 1));
        assert!(new.renew(q, &b.text, 1_300).is_ok(), "its holder renews on, a little late after the downtime");
        assert_eq!((new.pool(q).held, new.pool(q).stats.readopted), (1, 1));
    }

    /// After a crash, a retry under the key of a lease the periodic snapshot
    /// held, released since and its place granted again, finds the pool full
    /// of confirmed leases: it is a new acquire, not that lease over the limit.
    #[test]
    fn a_retry_under_a_restored_key_never_takes_the_pool_over_its_limit() {
        use crate::governor::idempotency::IdemKey;
        let key = IdemKey::new(9, b"job").unwrap();
        let mut old = governor(BASE);
        let q = old.pool_id("q").unwrap();
        let Ok(Admission::Granted(a)) = old.acquire_keyed(q, &key, 0, 1, 0) else { panic!("granted") };
        let b = grant(&mut old, "q", 0);
        let snap = old.export(100);
        assert!(old.release(q, &a.text, None, 200));
        let c = grant(&mut old, "q", 300);

        let mut full = governor(BASE + 1000);
        full.import(&snap, Taken::WhileRunning, 0).unwrap();
        full.open_recovery_window(0);
        assert!(full.renew(q, &b.text, 10).is_ok());
        assert!(full.renew(q, &c.text, 20).is_ok(), "re-adopted");
        match full.acquire_keyed(q, &key, 0, 2, 30) {
            Ok(Admission::Denied(d)) => assert_eq!(d.reason, DenyReason::Recovering),
            other => panic!("expected the window, got {other:?}"),
        }
        assert_eq!((full.pool(q).held, full.pool(q).unconfirmed), (2, 0));
        assert_eq!(full.renew(q, &a.text, 40), Err(crate::governor::RenewError::NotFound));

        // With room left, the retry confirms the lease and gets it again.
        let mut roomy = governor(BASE + 1000);
        roomy.import(&snap, Taken::WhileRunning, 0).unwrap();
        roomy.open_recovery_window(0);
        assert!(roomy.renew(q, &b.text, 10).is_ok());
        match roomy.acquire_keyed(q, &key, 0, 2, 30) {
            Ok(Admission::Granted(g)) => assert_eq!(g.text, a.text),
            other => panic!("expected the same grant, got {other:?}"),
        }
        assert_eq!((roomy.pool(q).held, roomy.pool(q).unconfirmed), (2, 0));
        assert_eq!(roomy.renew(q, &c.text, 40), Err(crate::governor::RenewError::NotFound), "the pool is full");
    }

    /// A re-adopted lease renewed after the last periodic snapshot looks
    /// expired in it: it is dropped, not kept dead, so its holder's next
    /// renewal re-adopts it.
    #[test]
    fn a_readopted_lease_renewed_after_the_periodic_snapshot_can_be_readopted_again() {
        let mut crashed = governor(BASE - 1000);
        let x = grant(&mut crashed, "q", 0);
        let mut old = governor(BASE);
        let q = old.pool_id("q").unwrap();
        old.open_recovery_window(0);
        assert_eq!(old.renew(q, &x.text, 10), Ok(5_010));
        let snap = old.export(100);
        assert_eq!(old.renew(q, &x.text, 4_000), Ok(9_000), "unknown to the snapshot");
        // The successor starts 6 s of Unix time later: by the snapshot, `x`
        // ended at 5 010; its holder renewed it to 9 000.
        for (taken, readopted) in [(Taken::WhileRunning, true), (Taken::AtStop, false)] {
            let mut new = governor(BASE + 6_000);
            assert_eq!(new.import(&snap, taken, 0).unwrap().reclaimed, 1, "{taken:?}");
            new.open_recovery_window(0);
            assert_eq!(new.renew(q, &x.text, 10).is_ok(), readopted, "{taken:?}");
        }
    }

    #[test]
    fn a_snapshot_refused_for_a_lowered_term_keeps_the_window_open_until_its_holders_renew() {
        // The old process: a term of 10 s, its holder last renewed at 100.
        let mut old = with_term(10_000, BASE);
        let p = old.pool_id("p").unwrap();
        let held = grant(&mut old, "p", 0);
        assert_eq!(old.renew(p, &held.text, 100), Ok(10_100));
        let snap = old.export(200);
        // The deploy lowers the term to 1 s; the successor starts 800 ms of
        // Unix time later, so the holder renews by 9 300 here.
        let mut new = with_term(1_000, BASE + 800);
        assert_eq!(new.await_refused_holders(&snap, 0), 1);
        new.open_recovery_window(0);
        let d = match new.acquire(p, 0, 0, 5_000) {
            Admission::Denied(d) => d,
            other => panic!("expected the window, got {other:?}"),
        };
        assert_eq!((d.reason, d.retry_after_ms), (DenyReason::Recovering, 4_300));
        assert_eq!(new.renew(p, &held.text, 5_000), Ok(6_000), "re-adopted past the new term");
        let q = new.pool_id("q").unwrap();
        let q_term = new.pool(q).settings.term_ms;
        assert_eq!(new.pool(q).recovering_until, Some(q_term), "a pool with no holder: one term");
        new.advance(9_300);
        assert!(!new.pool(p).recovering(9_300));
    }

    #[test]
    fn a_snapshot_refused_for_a_lowered_limit_revokes_none_of_its_holders() {
        let mut old = with_limit(4, BASE);
        let held: Vec<_> = (0..4).map(|_| grant(&mut old, "p", 0)).collect();
        let snap = old.export(100);
        // The deploy lowers the limit to 2: the file is refused, and all four
        // holders renew in the window.
        let mut new = with_limit(2, BASE + 200);
        let p = new.pool_id("p").unwrap();
        assert_eq!(new.await_refused_holders(&snap, 0), 1);
        new.open_recovery_window(0);
        for (i, lease) in held.iter().enumerate() {
            assert_eq!(new.renew(p, &lease.text, 1_000), Ok(31_000), "holder {i}");
        }
        assert_eq!(new.pool(p).held, 4);
        // None more: an id it does not hold is past the count.
        let stranger = grant(&mut with_limit(4, BASE + 1), "p", 0);
        assert_eq!(new.renew(p, &stranger.text, 1_000), Err(crate::governor::RenewError::NotFound));
        // After the window no grant until `held` falls under the new limit.
        new.advance(30_000);
        assert!(
            matches!(new.acquire(p, 0, 0, 30_000), Admission::Denied(ref d) if d.reason == DenyReason::Concurrency)
        );
        for lease in &held[..3] {
            assert!(new.release(p, &lease.text, None, 30_000));
        }
        grant(&mut new, "p", 30_000);
    }

    #[test]
    fn a_periodic_snapshot_of_more_holders_than_a_lowered_limit_confirms_them_all() {
        // A process whose limit was lowered from 3 to 1 still holds the three
        // slots granted before; its periodic snapshot has them, and it crashes.
        let mut old = with_limit(3, BASE);
        let held: Vec<_> = (0..3).map(|_| grant(&mut old, "p", 0)).collect();
        let snap = old.export(100);
        let mut new = with_limit(1, BASE + 200);
        let p = new.pool_id("p").unwrap();
        assert_eq!(new.import(&snap, Taken::WhileRunning, 0).unwrap().held, 3);
        new.open_recovery_window(0);
        // The record of terms says they were granted under a limit of 3.
        assert!(new.expect_holders("p", 3, 0));
        for (i, lease) in held.iter().enumerate() {
            assert_eq!(new.renew(p, &lease.text, 1_000), Ok(31_000), "holder {i}");
        }
        assert_eq!((new.pool(p).held, new.pool(p).unconfirmed), (3, 0));
    }

    #[test]
    fn a_restored_lease_renews_by_the_term_it_was_granted_with() {
        use crate::governor::idempotency::IdemKey;
        let key = IdemKey::new(9, b"kept").unwrap();
        // The old process: a term of 10 s, renewals every 3 333 ms.
        let mut old = with_term(10_000, BASE);
        let p = old.pool_id("p").unwrap();
        let Ok(Admission::Granted(keyed)) = old.acquire_keyed(p, &key, 0, 1, 0) else { panic!("granted") };
        let plain = grant(&mut old, "p", 0);
        assert_eq!((plain.term_ms, plain.renew_interval_ms), (10_000, 3_333));
        let snap = old.export(100);
        assert!(snap.leases.iter().all(|l| l.term_ms == Some(10_000)));

        // The successor, 200 ms of Unix time later, has a term of 1 s: its
        // holders still renew every 3 333 ms, and each renewal gives them 10 s.
        let mut new = with_term(1_000, BASE + 200);
        assert_eq!(new.import(&snap, Taken::AtStop, 0).unwrap().held, 2);
        for at in [3_000, 6_333, 9_666, 12_999] {
            new.advance(at);
            assert_eq!(new.renew(p, &plain.text, at), Ok(at + 10_000), "at {at}");
            assert_eq!(new.renew(p, &keyed.text, at), Ok(at + 10_000), "at {at}");
        }
        assert_eq!(new.pool(p).held, 2, "neither lapsed between two renewals");
        let full = new.acquire(p, 0, 0, 12_999);
        assert!(matches!(full, Admission::Denied(ref d) if d.reason == DenyReason::Concurrency), "{full:?}");
        // A retry under the key answers the lease's term, and the pool's
        // interval scaled to it, as before the restart.
        let Ok(Admission::Granted(again)) = new.acquire_keyed(p, &key, 0, 2, 12_999) else { panic!("granted") };
        assert_eq!((again.slot, again.term_ms, again.renew_interval_ms), (keyed.slot, 10_000, 3_330));
        // New grants take the new term.
        assert!(new.release(p, &plain.text, None, 13_000));
        assert_eq!(grant(&mut new, "p", 13_000).term_ms, 1_000);

        // A lease read from a file without terms (version 2) renews by the pool's.
        let mut v2 = snap.clone();
        v2.leases.iter_mut().for_each(|l| l.term_ms = None);
        let mut new = with_term(1_000, BASE + 200);
        assert_eq!(new.import(&v2, Taken::AtStop, 0).unwrap().held, 2);
        assert_eq!(new.renew(p, &plain.text, 500), Ok(1_500));
    }

    /// A file passes its digest when whole, sane or not: ids this server
    /// did not sign for their pool are refused whole, and learned numbers
    /// come back within what the pool could have learned.
    #[test]
    fn a_file_restores_nothing_this_server_could_not_have_written() {
        let mut old = governor(BASE);
        let p = old.pool_id("p").unwrap();
        grant(&mut old, "p", 0);
        let mut new = governor(BASE);
        let mut forged = old.export(0);
        forged.leases[0].id.0[20] ^= 1;
        assert!(new.import(&forged, Taken::AtStop, 0).unwrap_err().contains("signed"));
        let mut moved = old.export(0);
        moved.leases[0].pool = 1;
        assert!(new.import(&moved, Taken::AtStop, 0).unwrap_err().contains("signed"), "an id of another pool");
        assert_eq!(new.held_total(), 0);

        let mut wild = old.export(0);
        let learning = &mut wild.pools[0].learning;
        (learning.effective, learning.concurrency, learning.cooldown_until) = (1_000_000, 1_000_000, u64::MAX);
        learning.budget = Some(crate::governor::learn::Budget { remaining: 0, reset_at: u64::MAX });
        wild.pools[0].gate = Some((5, u64::MAX));
        assert_eq!(new.import(&wild, Taken::AtStop, 0).unwrap().held, 1);
        let pool = new.pool(p);
        assert_eq!((pool.effective_limit(), pool.learning.concurrency), (4, 4), "the configured limit bounds it");
        assert_eq!(pool.learning.cooldown_until, 120_000);
        assert_eq!(pool.learning.budget.unwrap().reset_at, 3_600_000);
        assert_eq!(pool.gate.as_ref().unwrap().level(), (5, 100_000), "the next token one interval (100 ms) away");

        // A file written at the end of time (the wall clock there was wrong):
        // every deadline has passed, and nothing overflows.
        let mut late = old.export(0);
        late.written_at = u64::MAX;
        let mut new = governor(BASE);
        assert_eq!(new.import(&late, Taken::AtStop, 0).unwrap().reclaimed, 1);
    }

    #[test]
    fn a_re_adopted_lease_takes_a_free_place_whatever_place_the_file_names() {
        use crate::governor::idempotency::IdemKey;
        let mut old = with_term(10_000, BASE);
        let p = old.pool_id("p").unwrap();
        let held = grant(&mut old, "p", 0);
        let crashed = old.export(0);
        let mut adopter = with_term(10_000, BASE + 100);
        adopter.await_refused_holders(&crashed, 0);
        adopter.open_recovery_window(0);
        assert_eq!(adopter.renew(p, &held.text, 0), Ok(10_000), "re-adopted");
        assert_eq!(adopter.renew(p, &held.text, 9_000), Ok(19_000));
        adopter.advance(10_001);
        let plain = grant(&mut adopter, "p", 10_001);
        let mut snap = adopter.export(10_001);
        let adopted = snap.leases.iter_mut().find(|l| l.adopted).unwrap();
        // A place no table this size had (a file's number, not the id's).
        adopted.index = u32::MAX - 3;
        let key = IdemKey::new(9, b"follows").unwrap();
        snap.keys.push(super::HeldKey { index: u32::MAX - 3, key });

        let mut new = with_term(10_000, BASE + 100 + 10_001);
        assert_eq!(new.import(&snap, Taken::AtStop, 0).unwrap().held, 2);
        assert!(new.leases.capacity() < 1024, "a table of {} places", new.leases.capacity());
        let Ok(Admission::Granted(again)) = new.acquire_keyed(p, &key, 0, 1, 10) else { panic!("the key's lease") };
        assert_eq!(again.slot, held.slot, "the key followed its lease to its new place");
        assert_eq!(new.renew(p, &held.text, 20), Ok(10_020));
        assert_eq!(new.renew(p, &plain.text, 20), Ok(10_020));
        assert!(new.release(p, &held.text, None, 30) && new.release(p, &plain.text, None, 30));
        assert_eq!(new.pool(p).held, 0);
    }

    #[test]
    fn a_snapshot_of_another_pool_set_changes_nothing() {
        let mut old = governor(BASE);
        grant(&mut old, "p", 0);
        let mut snap = old.export(0);
        snap.pools[0].name = "gone".into();
        let mut new = governor(BASE);
        assert!(new.import(&snap, Taken::AtStop, 0).unwrap_err().contains("gone"));
        assert_eq!(new.held_total(), 0);
        let mut snap = old.export(0);
        snap.leases.push(snap.leases[0]);
        assert!(new.import(&snap, Taken::AtStop, 0).is_err());
        assert_eq!(new.held_total(), 0);
    }
}
