//! What the dashboard charts: one sample per second for the last 15 minutes,
//! and the latest acquire attempts, per pool, in fixed memory.
//!
//! Nothing here is on the request path except `Attempts::push` (a copy into a
//! fixed ring). Samples are taken from the pool's existing counters once per
//! elapsed second by whoever owns the clock; seconds in which the reactor
//! slept are filled with the gauges it slept on and no events.

use super::pool::{DenyReason, Pool, PoolStats};
use crate::time::Ms;

/// Seconds kept: 15 minutes at 1-s resolution.
pub const SECONDS: usize = 900;
/// Acquire attempts kept per pool.
pub const ATTEMPTS: usize = 20;

/// One second of one pool: counts of what happened in it, gauges at its end.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub grants: u32,
    /// Denials by reason, indexed by `DenyReason`.
    pub denied: [u32; DenyReason::ALL.len()],
    pub throttled: u32,
    pub effective: u32,
    pub limit: u32,
    pub held: u32,
    pub queue: u32,
}

#[derive(Default)]
pub struct History {
    /// A ring of at most `SECONDS` samples, allocated whole at the first one
    /// and freed by `forget`, so a pool a reload removed costs none of it.
    samples: Vec<Sample>,
    /// Where the next sample goes once the ring is full.
    next: usize,
    /// The second (of monotonic time) the last sample stands for.
    second: Option<u64>,
    seen: PoolStats,
}

fn delta(now: u64, then: u64) -> u32 {
    now.saturating_sub(then).min(u32::MAX as u64) as u32
}

impl History {
    /// Records every second completed before `now`. The first call only
    /// remembers where the counters stand.
    pub fn sample(&mut self, pool: &Pool, now: Ms) {
        let second = now / 1000;
        let Some(last) = self.second else {
            self.second = Some(second);
            self.seen = pool.stats;
            return;
        };
        if second <= last {
            return;
        }
        let s = &pool.stats;
        let mut first = Sample {
            grants: delta(s.grants, self.seen.grants),
            denied: DenyReason::ALL.map(|r| delta(s.denied[r as usize], self.seen.denied[r as usize])),
            throttled: delta(s.reports_throttled, self.seen.reports_throttled),
            effective: pool.effective_limit_at(now),
            limit: pool.settings.concurrency,
            held: pool.held,
            queue: pool.queue.len(),
        };
        self.seen = *s;
        // Events are booked to the first elapsed second; the rest were quiet.
        for _ in 0..(second - last).min(SECONDS as u64) {
            self.push(first);
            first = Sample { grants: 0, denied: [0; DenyReason::ALL.len()], throttled: 0, ..first };
        }
        self.second = Some(second);
    }

    /// Takes the starting point of a pool that appears at `now` (a reload
    /// adds it, or names it again), unless it has one: the events from then
    /// on are its first second's, not taken as the start by the next
    /// `sample`, which may come after the pool's first grants.
    pub fn begin(&mut self, pool: &Pool, now: Ms) {
        if self.second.is_none() {
            self.sample(pool, now);
        }
    }

    fn push(&mut self, sample: Sample) {
        if self.samples.len() < SECONDS {
            // Room for the rest of the ring: a no-op once it is allocated
            // (reserving `SECONDS` more would move the ring, copied whole,
            // at every sample until it is full).
            self.samples.reserve_exact(SECONDS - self.samples.len());
            self.samples.push(sample);
        } else {
            self.samples[self.next] = sample;
        }
        self.next = (self.next + 1) % SECONDS;
    }

    /// The samples, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = &Sample> {
        // Until the ring is full its samples lie in order from the start.
        let split = if self.samples.len() == SECONDS { self.next } else { 0 };
        let (newer, older) = self.samples.split_at(split);
        older.iter().chain(newer)
    }

    /// The second of monotonic time the newest sample stands for.
    pub fn last_second(&self) -> Option<u64> {
        self.second.filter(|_| !self.samples.is_empty())
    }

    /// Drops every sample and the memory that held them: the next `sample`
    /// starts over, as for a new pool.
    pub fn forget(&mut self) {
        *self = History::default();
    }
}

/// One answered acquire, as the dashboard shows it: no key, no slot id
/// (only its short log reference).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    pub epoch_ms: u64,
    pub status: u16,
    pub error: Option<&'static str>,
    pub reason: Option<DenyReason>,
    /// The wait budget as the client asked it (what the access log says).
    pub wait_ms: u64,
    pub queued_ms: u64,
    pub server_us: u64,
    pub slot_ref: Option<u32>,
}

#[derive(Default)]
pub struct Attempts {
    ring: [Attempt; ATTEMPTS],
    next: usize,
    len: usize,
}

impl Attempts {
    pub fn push(&mut self, a: Attempt) {
        self.ring[self.next] = a;
        // Wrapped by a comparison: `%` by 20 costs every acquire a
        // multiplication and shifts.
        self.next = if self.next + 1 == ATTEMPTS { 0 } else { self.next + 1 };
        self.len = (self.len + 1).min(ATTEMPTS);
    }

    /// The attempts, newest first.
    pub fn iter(&self) -> impl Iterator<Item = &Attempt> {
        (1..=self.len).map(move |i| &self.ring[(self.next + ATTEMPTS - i) % ATTEMPTS])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::governor::PoolSettings;

    fn pool() -> Pool {
        Pool::new(
            "p",
            PoolSettings {
                concurrency: 4,
                queue_size: 0,
                queue_timeout_ms: 0,
                rpm: None,
                term_ms: 1000,
                renew_interval_ms: 500,
                request_timeout_ms: 10_000,
                adaptive: true,
                idempotency_keys: 16,
            },
            crate::governor::lease::SlotKey::new(&[0; 32]).seal("p"),
        )
    }

    #[test]
    fn counts_go_to_their_second_and_quiet_seconds_repeat_gauges() {
        let mut p = pool();
        let mut h = History::default();
        h.sample(&p, 500);
        assert_eq!(h.iter().count(), 0);
        p.stats.grants = 3;
        p.stats.denied[DenyReason::Rate as usize] = 2;
        p.stats.denied[DenyReason::Recovering as usize] = 5;
        p.held = 3;
        h.sample(&p, 999);
        assert_eq!(h.iter().count(), 0, "the second is not over");
        h.sample(&p, 4_100);
        let got: Vec<_> = h.iter().copied().collect();
        assert_eq!(got.len(), 4);
        assert_eq!((got[0].grants, got[0].denied, got[0].held), (3, [0, 2, 0, 0, 5], 3));
        assert!(got[1..].iter().all(|s| s.grants == 0 && s.held == 3 && s.limit == 4));
        assert_eq!(h.last_second(), Some(4));
    }

    #[test]
    fn the_ring_is_allocated_once_at_its_first_sample() {
        let p = pool();
        let mut h = History::default();
        h.sample(&p, 0);
        h.sample(&p, 1_000);
        let ring = h.samples.as_ptr();
        for second in 2..=10 {
            h.sample(&p, second * 1000);
        }
        assert_eq!((h.samples.capacity(), h.samples.as_ptr()), (SECONDS, ring));
    }

    #[test]
    fn memory_is_fixed_after_a_long_sleep() {
        let p = pool();
        let mut h = History::default();
        h.sample(&p, 0);
        h.sample(&p, 10_000_000);
        assert_eq!(h.iter().count(), SECONDS);
        h.sample(&p, 10_001_000);
        assert_eq!(h.iter().count(), SECONDS);
    }

    #[test]
    fn a_full_ring_keeps_the_newest_seconds_in_order_and_forget_frees_it() {
        let mut p = pool();
        let mut h = History::default();
        h.sample(&p, 0);
        let total = SECONDS as u32 + 7;
        for second in 1..=total {
            p.held = second;
            h.sample(&p, u64::from(second) * 1000);
        }
        let held: Vec<u32> = h.iter().map(|s| s.held).collect();
        assert_eq!(held, (8..=total).collect::<Vec<_>>());
        assert_eq!(h.last_second(), Some(u64::from(total)));
        h.forget();
        assert_eq!((h.iter().count(), h.samples.capacity(), h.last_second()), (0, 0, None));
        h.sample(&p, 2_000_000);
        h.sample(&p, 2_001_000);
        assert_eq!(h.iter().map(|s| s.held).collect::<Vec<_>>(), vec![total], "it starts over");
    }

    #[test]
    fn attempts_ring_keeps_the_newest_first() {
        let mut a = Attempts::default();
        for i in 0..(ATTEMPTS as u64 + 5) {
            a.push(Attempt { epoch_ms: i, ..Attempt::default() });
        }
        let got: Vec<u64> = a.iter().map(|x| x.epoch_ms).collect();
        assert_eq!(got.len(), ATTEMPTS);
        assert_eq!(got[0], ATTEMPTS as u64 + 4);
        assert_eq!(*got.last().unwrap(), 5);
    }
}
