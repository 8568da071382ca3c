//! The requests-per-minute gate: a token bucket, refilled lazily.
//!
//! The bucket holds `burst` tokens and gains one every `60000 / rpm` ms.
//! Each token's instant is counted from the start of the refill schedule
//! as an exact fraction of a minute (in µs, rounded up), not by adding a
//! rounded interval token after token: a minute gives exactly `rpm` tokens
//! at any rate, 7 or 45 000 000. It never scans or sleeps and has no timer
//! of its own: the governor calls `refill(now)` whenever it is about to ask
//! for a token (an acquire, a pump of the queue), and when waiters are held
//! back by the rate it arms the pool's one wake-up entry on the wheel at
//! `now + wait_ms(now)`, the next token.

use crate::time::Ms;

/// A minute, in µs: `rpm` tokens come in each.
const MINUTE_US: u64 = 60_000_000;

#[derive(Debug, Clone)]
pub struct TokenBucket {
    tokens: u32,
    burst: u32,
    rpm: u32,
    /// Where the refill schedule starts, in µs: its token `k` (from 0)
    /// comes at `from_us + ceil(k * MINUTE_US / rpm)`.
    from_us: u64,
    /// The schedule's tokens added so far (kept under `rpm`: every `rpm`
    /// tokens, `from_us` moves on by a minute).
    added: u64,
    /// When the next token arrives, in µs (the schedule's token `added`);
    /// meaningful only while not full.
    next_refill_us: u64,
}

impl TokenBucket {
    pub fn new(rpm: u32, burst: u32) -> TokenBucket {
        debug_assert!(rpm > 0 && burst > 0);
        TokenBucket { tokens: burst, burst, rpm, from_us: 0, added: 0, next_refill_us: 0 }
    }

    /// Sets the refill schedule: from `from_us`, `added` of its tokens
    /// added. Every `rpm` tokens are one whole minute: the start moves on by
    /// them, so `added * MINUTE_US` stays well inside 64 bits.
    fn schedule(&mut self, from_us: u64, added: u64) {
        let rpm = u64::from(self.rpm);
        self.from_us = from_us + added / rpm * MINUTE_US;
        self.added = added % rpm;
        self.next_refill_us = self.from_us + (self.added * MINUTE_US).div_ceil(rpm);
    }

    /// Starts the schedule over at `now_us`, as if a token had just come:
    /// the next is one interval away.
    fn restart(&mut self, now_us: u64) {
        self.schedule(now_us, 1);
    }

    /// Starts the schedule over with its next token at `next_us`, or one
    /// interval after `now_us` if that is sooner.
    fn next_no_later_than_an_interval(&mut self, next_us: u64, now_us: u64) {
        self.restart(now_us);
        if next_us < self.next_refill_us {
            self.schedule(next_us, 0);
        }
    }

    /// Changes rate and size (a reload), at once: tokens due at the old rate
    /// are added first, tokens above the new size are dropped, and the next
    /// token comes no later than one new interval from now (a raised rate
    /// does not wait out the old rate's interval). A full bucket a raised
    /// size leaves room in starts refilling now; one still full keeps its
    /// schedule as well, so a reload that leaves the rate alone (a key
    /// rotated) brings no token early: the next grant from a bucket full
    /// for long restarts the refills from that grant, as without the reload.
    pub fn reconfigure(&mut self, rpm: u32, burst: u32, now: Ms) {
        self.refill(now);
        let was_full = self.is_full();
        self.rpm = rpm;
        self.burst = burst;
        self.tokens = self.tokens.min(burst);
        if was_full && !self.is_full() {
            self.restart(now * 1000);
        } else {
            self.next_no_later_than_an_interval(self.next_refill_us, now * 1000);
        }
    }

    pub fn tokens(&self) -> u32 {
        self.tokens
    }

    /// The tokens left and when the next one arrives (µs): what a snapshot keeps.
    pub fn level(&self) -> (u32, u64) {
        (self.tokens, self.next_refill_us)
    }

    /// Puts back a level from `level` at `now`: never above the bucket's
    /// size, and the next token no later than one interval away (what a
    /// saved level can say, whatever the file holds).
    pub fn restore_level(&mut self, tokens: u32, next_refill_us: u64, now: Ms) {
        self.tokens = tokens.min(self.burst);
        self.next_no_later_than_an_interval(next_refill_us, now.saturating_mul(1000));
    }

    /// The tokens there will be at `now` once refilled, without refilling:
    /// what a reader (metrics, the dashboard) shows between acquires.
    pub fn tokens_at(&self, now: Ms) -> u32 {
        self.tokens + self.due(now)
    }

    /// The tokens that have come due by `now` and still fit: what `refill` adds.
    fn due(&self, now: Ms) -> u32 {
        let now_us = now * 1000;
        if self.is_full() || self.next_refill_us > now_us {
            return 0;
        }
        // Token `k` has come when `k * MINUTE_US / rpm <= now_us - from_us`
        // (whole µs on the right, so the rounding up changes nothing). A
        // product past 64 bits is more than any bucket holds.
        let came = (now_us - self.from_us).saturating_mul(u64::from(self.rpm)) / MINUTE_US + 1;
        (came - self.added).min(u64::from(self.burst - self.tokens)) as u32
    }

    pub fn is_full(&self) -> bool {
        self.tokens >= self.burst
    }

    pub fn has_token(&self) -> bool {
        self.tokens > 0
    }

    /// Takes one token; the caller checked `has_token`.
    ///
    /// Taking from a full bucket starts the refills again. When it filled
    /// less than an interval ago, no token has overflowed since, and the
    /// next comes one interval after the one that filled it, as it would
    /// have: a waiter that takes each token at the (whole-millisecond) tick
    /// after it came due does not push every later token back by that
    /// delay. A bucket full for longer restarts from now.
    pub fn take(&mut self, now: Ms) {
        debug_assert!(self.tokens > 0);
        if self.is_full() {
            // While full, `next_refill_us` is where the refill that filled it
            // left the schedule (0 for a bucket that started full).
            let now_us = now * 1000;
            if self.next_refill_us <= now_us {
                self.restart(now_us);
            }
        }
        self.tokens -= 1;
    }

    /// Adds every token that has come due by `now`, each at its instant in
    /// the schedule.
    pub fn refill(&mut self, now: Ms) {
        let due = self.due(now);
        if due == 0 {
            return;
        }
        self.tokens += due;
        self.schedule(self.from_us, self.added + u64::from(due));
    }

    /// When the next token is due, or `None` when full (the governor arms
    /// its wake from `wait_ms`; the tests read the schedule here).
    #[cfg(test)]
    pub fn next_refill_ms(&self) -> Option<Ms> {
        (!self.is_full()).then(|| self.next_refill_us.div_ceil(1000))
    }

    /// Time until a token is available (0 when one is).
    pub fn wait_ms(&self, now: Ms) -> u64 {
        if self.has_token() {
            0
        } else {
            self.next_refill_us.div_ceil(1000).saturating_sub(now)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_at_a_time_are_what_a_refill_then_would_leave() {
        // 600 rpm: one token every 100 ms, burst 10; spent at 0.
        let mut b = TokenBucket::new(600, 10);
        for _ in 0..10 {
            b.take(0);
        }
        for now in [0, 99, 100, 150, 250, 999, 1000, 1001, 5000] {
            let mut refilled = b.clone();
            refilled.refill(now);
            assert_eq!(b.tokens_at(now), refilled.tokens(), "at {now} ms");
        }
        assert_eq!(b.tokens_at(450), 4);
        assert_eq!(b.tokens_at(5000), 10, "never above the burst");
        assert_eq!(b.tokens(), 0, "reading changes nothing");
    }

    #[test]
    fn burst_then_one_token_per_interval() {
        // 120 rpm: one token every 500 ms, burst 2.
        let mut b = TokenBucket::new(120, 2);
        b.take(0);
        b.take(0);
        assert!(!b.has_token());
        assert_eq!(b.next_refill_ms(), Some(500));
        assert_eq!(b.wait_ms(100), 400);
        b.refill(499);
        assert!(!b.has_token());
        b.refill(500);
        assert_eq!(b.tokens(), 1);
        assert_eq!(b.next_refill_ms(), Some(1000));
        b.refill(5000);
        assert_eq!(b.tokens(), 2);
        assert_eq!(b.next_refill_ms(), None);
    }

    #[test]
    fn odd_rates_do_not_drift() {
        // 7 rpm: a token every 8571.428 ms; after 7 tokens, exactly one minute.
        let mut b = TokenBucket::new(7, 7);
        for _ in 0..7 {
            b.take(0);
        }
        b.refill(59_999);
        assert_eq!(b.tokens(), 6);
        b.refill(60_000);
        assert_eq!(b.tokens(), 7);
    }

    #[test]
    fn a_minute_gives_exactly_rpm_tokens_at_any_rate() {
        // Emptied at once and every millisecond for a minute: the burst,
        // then exactly `rpm` more, at rates whose interval is no whole
        // number of µs (7 000 000: 8.57 µs; 40 000 000: 1.5 µs) as well.
        for rpm in [7, 60, 7_000, 45_000, 700_000, 3_500_000, 7_000_000, 40_000_000, 60_000_000] {
            let burst = rpm / 60_000 + 1;
            let mut b = TokenBucket::new(rpm, burst);
            let mut taken = 0u64;
            for now in 0..=60_000 {
                b.refill(now);
                while b.has_token() {
                    b.take(now);
                    taken += 1;
                }
            }
            assert_eq!(taken, u64::from(burst) + u64::from(rpm), "rpm {rpm}");
        }
    }

    #[test]
    fn a_bucket_of_one_taken_at_each_tick_keeps_its_rate() {
        // 700 rpm, burst 1: a token every 85.714 ms. A waiter takes each one
        // at the first whole millisecond it is due (the wheel's tick), or a
        // millisecond later: a minute still gives 700, the one it starts
        // with and the 699 due before the minute ends.
        for late in [0, 1] {
            let mut b = TokenBucket::new(700, 1);
            let (mut now, mut taken) = (0, 0);
            while now < 60_000 {
                b.refill(now);
                if b.has_token() {
                    b.take(now);
                    taken += 1;
                }
                now = b.next_refill_ms().expect("emptied") + late;
            }
            assert_eq!(taken, 700, "late by {late} ms");
        }
    }

    #[test]
    fn a_bucket_full_for_longer_than_an_interval_restarts_from_now() {
        let mut b = TokenBucket::new(60, 2);
        b.take(0);
        b.refill(1000);
        assert!(b.is_full());
        // Taken within the interval after it filled: the schedule goes on.
        let mut soon = b.clone();
        soon.take(1500);
        assert_eq!(soon.next_refill_ms(), Some(2000));
        // Full since 1000 and idle past 2000: a token overflowed; from now.
        b.take(2500);
        assert_eq!(b.next_refill_ms(), Some(3500));
        // A bucket that started full restarts from now too.
        let mut fresh = TokenBucket::new(60, 1);
        fresh.take(7);
        assert_eq!(fresh.next_refill_ms(), Some(1007));
    }

    #[test]
    fn taking_from_a_partial_bucket_keeps_the_refill_schedule() {
        let mut b = TokenBucket::new(60, 3);
        b.take(0); // next at 1000
        b.take(400); // schedule unchanged
        assert_eq!(b.next_refill_ms(), Some(1000));
        b.refill(1000);
        assert_eq!(b.tokens(), 2);
        assert_eq!(b.next_refill_ms(), Some(2000));
    }

    #[test]
    fn a_raised_rate_applies_at_once() {
        // 2 rpm, burst 1: the next token is 30 s away after a grant.
        let mut b = TokenBucket::new(2, 1);
        b.take(0);
        assert_eq!(b.wait_ms(1000), 29_000);
        b.reconfigure(600, 10, 1000);
        assert_eq!(b.next_refill_ms(), Some(1100));
        b.refill(1100);
        assert!(b.has_token());
        // A raised burst alone starts refilling a full bucket.
        let mut b = TokenBucket::new(60, 1);
        b.reconfigure(60, 5, 0);
        assert_eq!(b.next_refill_ms(), Some(1000));
        // A lowered rate keeps the token already on its way.
        let mut b = TokenBucket::new(60, 1);
        b.take(0);
        b.reconfigure(1, 1, 500);
        assert_eq!(b.next_refill_ms(), Some(1000));
    }

    #[test]
    fn a_reload_that_leaves_a_full_bucket_full_brings_no_token_early() {
        // 60 rpm, burst 1, full: a reload that changes nothing (a key
        // rotated) and a grant 900 ms later. The next token is an interval
        // after that grant, as without the reload, not one after the reload.
        let mut b = TokenBucket::new(60, 1);
        b.reconfigure(60, 1, 10_000);
        b.take(10_900);
        assert_eq!(b.next_refill_ms(), Some(11_900));
        // Filled less than an interval before the reload: the schedule goes on.
        let mut b = TokenBucket::new(60, 1);
        b.take(0);
        b.refill(1000);
        b.reconfigure(60, 1, 1500);
        b.take(1600);
        assert_eq!(b.next_refill_ms(), Some(2000));
        // A raised rate still brings the next token within its interval.
        let mut b = TokenBucket::new(60, 1);
        b.take(0);
        b.refill(1000);
        b.reconfigure(600, 1, 1500);
        b.take(1550);
        assert_eq!(b.next_refill_ms(), Some(1600));
    }

    #[test]
    fn reconfigure_drops_excess_tokens() {
        let mut b = TokenBucket::new(60, 10);
        b.reconfigure(60, 2, 0);
        assert_eq!(b.tokens(), 2);
        assert!(b.is_full());
    }
}
