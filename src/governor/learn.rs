//! What a pool learns from outcome reports: the adaptive limit, cool-downs
//! and the upstream's own budget.
//!
//! Pure arithmetic on `now`; the governor arms the wheel entries that end a
//! cool-down or a budget window, using the instants this module returns.
//!
//! Rules (SPEC §7), in one place:
//! - a throttled report (status 429 or `throttled > 0`) multiplies the
//!   effective limit by 0.9, rounded down, never below 1 — once per congestion
//!   window: only a lease granted after the last cut can cut again;
//! - a success adds one to the limit per `effective` successes, up to
//!   `concurrency`, and only while the pool used at least half of its limit;
//! - a retry hint (capped at 120 s) pauses every grant until it ends;
//! - `remaining` + `resetMs` cap the grants until the reset instant, less the
//!   grants still in flight; `tokenRemaining: 0` + `tokenResetMs` blocks grants
//!   until the token window resets. At the reset the budget is lifted.

use super::Ms;

/// The longest pause a single retry hint can impose.
pub const MAX_COOLDOWN_MS: u64 = 120_000;
/// The furthest ahead a learned budget window may reach.
pub const MAX_BUDGET_WINDOW_MS: u64 = 3_600_000;

/// What the upstream said about its budget: parsed from its response headers
/// (`report::ratelimit::parse_headers`) or sent pre-parsed as `rate`.
///
/// Every duration is relative milliseconds from when the report was read;
/// `None` means the upstream did not say (never `0`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateInfo {
    /// Requests allowed in the request window.
    pub limit: Option<u64>,
    /// Requests still allowed before the request window resets.
    pub remaining: Option<u64>,
    /// Time until the request window resets.
    pub reset_ms: Option<u64>,
    /// Tokens allowed in the token window.
    pub token_limit: Option<u64>,
    /// Tokens still allowed before the token window resets.
    pub token_remaining: Option<u64>,
    /// Time until the token window resets.
    pub token_reset_ms: Option<u64>,
    /// How long the upstream asked callers to wait before retrying.
    pub retry_after_ms: Option<u64>,
}

/// One outcome report, already parsed and merged (`rate` over `headers`,
/// `retryAfterMs` over any header hint).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcome {
    pub status: Option<u16>,
    pub throttled: u64,
    pub rate: RateInfo,
}

impl Outcome {
    pub fn is_throttled(&self) -> bool {
        self.status == Some(429) || self.throttled > 0
    }

    fn is_success(&self) -> bool {
        !self.is_throttled() && matches!(self.status, Some(s) if s < 400)
    }
}

/// The upstream budget learned from the freshest report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub remaining: u64,
    pub reset_at: Ms,
}

/// Instants the governor must wake at because of a report.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Wakeups {
    pub cooldown_until: Option<Ms>,
    pub budget_reset_at: Option<Ms>,
    pub token_block_until: Option<Ms>,
}

#[derive(Debug, Clone)]
pub struct Learning {
    adaptive: bool,
    concurrency: u32,
    effective: u32,
    /// Bumped at every cut; leases remember the epoch they were granted in.
    epoch: u32,
    successes: u32,
    cooldown_until: Ms,
    budget: Option<Budget>,
    token_block_until: Ms,
}

/// Why a pool cannot grant right now, and for how long that is known to last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    Cooldown(u64),
    Budget(u64),
}

impl Learning {
    pub fn new(concurrency: u32, adaptive: bool) -> Learning {
        Learning {
            adaptive,
            concurrency,
            effective: concurrency,
            epoch: 0,
            successes: 0,
            cooldown_until: 0,
            budget: None,
            token_block_until: 0,
        }
    }

    pub fn effective(&self) -> u32 {
        self.effective
    }

    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    pub fn budget(&self) -> Option<Budget> {
        self.budget
    }

    /// A new configured limit: an unreduced limit follows it; a reduced one
    /// only comes down to it. Held slots are never revoked by this.
    pub fn reconfigure(&mut self, concurrency: u32, adaptive: bool) {
        let was_unreduced = self.effective >= self.concurrency;
        self.concurrency = concurrency;
        self.adaptive = adaptive;
        if !adaptive || was_unreduced {
            self.effective = concurrency;
        } else {
            self.effective = self.effective.min(concurrency);
        }
        if !adaptive {
            self.cooldown_until = 0;
            self.budget = None;
            self.token_block_until = 0;
        }
    }

    /// The learned pause in force at `now`, if any (cool-down first).
    pub fn pause(&self, now: Ms) -> Option<Pause> {
        if self.cooldown_until > now {
            return Some(Pause::Cooldown(self.cooldown_until - now));
        }
        let mut wait = self.token_block_until.saturating_sub(now);
        if let Some(b) = self.budget {
            if b.remaining == 0 && b.reset_at > now {
                wait = wait.max(b.reset_at - now);
            }
        }
        (wait > 0).then_some(Pause::Budget(wait))
    }

    /// Counts a grant against the learned budget (lifting one whose window ended).
    pub fn on_grant(&mut self, now: Ms) {
        self.on_budget_reset(now);
        if let Some(b) = &mut self.budget {
            b.remaining = b.remaining.saturating_sub(1);
        }
    }

    /// A wheel entry set by `Wakeups::budget_reset_at` fired.
    pub fn on_budget_reset(&mut self, now: Ms) {
        if matches!(self.budget, Some(b) if b.reset_at <= now) {
            self.budget = None;
        }
    }

    /// Applies a report about a lease granted in `lease_epoch`. `held_before`
    /// counts the reported lease; `in_flight` are the other leases still held.
    pub fn on_report(&mut self, o: &Outcome, lease_epoch: u32, held_before: u32, in_flight: u32, now: Ms) -> Wakeups {
        let mut wake = Wakeups::default();
        if !self.adaptive {
            return wake;
        }
        if o.is_throttled() {
            if lease_epoch == self.epoch {
                self.effective = (self.effective as u64 * 9 / 10).max(1) as u32;
                self.epoch = self.epoch.wrapping_add(1);
                self.successes = 0;
            }
        } else if o.is_success() && held_before as u64 * 2 >= self.effective as u64 {
            self.successes += 1;
            if self.successes >= self.effective {
                self.successes = 0;
                self.effective = (self.effective + 1).min(self.concurrency);
            }
        }
        if let Some(hint) = o.rate.retry_after_ms.filter(|&h| h > 0) {
            let until = now + hint.min(MAX_COOLDOWN_MS);
            if until > self.cooldown_until {
                self.cooldown_until = until;
                wake.cooldown_until = Some(until);
            }
        }
        if let (Some(remaining), Some(reset)) = (o.rate.remaining, o.rate.reset_ms) {
            if reset > 0 {
                let reset_at = now + reset.min(MAX_BUDGET_WINDOW_MS);
                self.budget = Some(Budget { remaining: remaining.saturating_sub(in_flight as u64), reset_at });
                wake.budget_reset_at = Some(reset_at);
            } else {
                self.budget = None;
            }
        }
        if let (Some(0), Some(reset)) = (o.rate.token_remaining, o.rate.token_reset_ms) {
            let until = now + reset.min(MAX_BUDGET_WINDOW_MS);
            if until > self.token_block_until {
                self.token_block_until = until;
                wake.token_block_until = Some(until);
            }
        }
        wake
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throttled() -> Outcome {
        Outcome { status: Some(429), throttled: 1, ..Outcome::default() }
    }

    fn ok() -> Outcome {
        Outcome { status: Some(200), ..Outcome::default() }
    }

    #[test]
    fn one_burst_of_429s_is_one_cut() {
        let mut l = Learning::new(20, true);
        let epoch = l.epoch();
        for _ in 0..5 {
            l.on_report(&throttled(), epoch, 20, 19, 0);
        }
        assert_eq!(l.effective(), 18);
        // A lease granted after the cut can cut again.
        l.on_report(&throttled(), l.epoch(), 18, 17, 0);
        assert_eq!(l.effective(), 16);
    }

    #[test]
    fn cuts_never_go_below_one() {
        let mut l = Learning::new(3, true);
        for _ in 0..10 {
            l.on_report(&throttled(), l.epoch(), 1, 0, 0);
        }
        assert_eq!(l.effective(), 1);
    }

    #[test]
    fn growth_is_additive_and_needs_half_usage() {
        let mut l = Learning::new(10, true);
        l.on_report(&throttled(), l.epoch(), 10, 9, 0);
        assert_eq!(l.effective(), 9);
        // Idle pool (1 held of 9): successes do not grow the limit.
        for _ in 0..50 {
            l.on_report(&ok(), l.epoch(), 1, 0, 0);
        }
        assert_eq!(l.effective(), 9);
        // Busy pool: +1 per `effective` successes.
        for _ in 0..8 {
            l.on_report(&ok(), l.epoch(), 5, 4, 0);
        }
        assert_eq!(l.effective(), 9);
        l.on_report(&ok(), l.epoch(), 5, 4, 0);
        assert_eq!(l.effective(), 10);
        for _ in 0..100 {
            l.on_report(&ok(), l.epoch(), 10, 9, 0);
        }
        assert_eq!(l.effective(), 10, "never above concurrency");
    }

    #[test]
    fn retry_hint_opens_a_capped_cooldown() {
        let mut l = Learning::new(4, true);
        let hint = Outcome { rate: RateInfo { retry_after_ms: Some(2000), ..RateInfo::default() }, ..throttled() };
        let w = l.on_report(&hint, l.epoch(), 1, 0, 1000);
        assert_eq!(w.cooldown_until, Some(3000));
        assert_eq!(l.pause(2999), Some(Pause::Cooldown(1)));
        assert_eq!(l.pause(3000), None);
        let long = Outcome { rate: RateInfo { retry_after_ms: Some(10_000_000), ..RateInfo::default() }, ..ok() };
        let w = l.on_report(&long, l.epoch(), 1, 0, 5000);
        assert_eq!(w.cooldown_until, Some(5000 + MAX_COOLDOWN_MS));
        // A shorter hint never shortens a cool-down.
        let w = l.on_report(&hint, l.epoch(), 1, 0, 6000);
        assert_eq!(w.cooldown_until, None);
    }

    #[test]
    fn budget_counts_in_flight_grants_and_lifts_at_reset() {
        let mut l = Learning::new(10, true);
        let report =
            Outcome { rate: RateInfo { remaining: Some(3), reset_ms: Some(700), ..RateInfo::default() }, ..ok() };
        let w = l.on_report(&report, l.epoch(), 2, 1, 100);
        assert_eq!(w.budget_reset_at, Some(800));
        assert_eq!(l.budget().unwrap().remaining, 2);
        assert_eq!(l.pause(100), None);
        l.on_grant(100);
        l.on_grant(100);
        assert_eq!(l.pause(100), Some(Pause::Budget(700)));
        l.on_budget_reset(799);
        assert!(l.pause(799).is_some());
        l.on_budget_reset(800);
        assert_eq!(l.pause(800), None);
        assert_eq!(l.budget(), None);
    }

    #[test]
    fn exhausted_tokens_block_until_their_reset() {
        let mut l = Learning::new(10, true);
        let report = Outcome {
            rate: RateInfo { token_remaining: Some(0), token_reset_ms: Some(1500), ..RateInfo::default() },
            ..ok()
        };
        let w = l.on_report(&report, l.epoch(), 1, 0, 0);
        assert_eq!(w.token_block_until, Some(1500));
        assert_eq!(l.pause(1000), Some(Pause::Budget(500)));
        assert_eq!(l.pause(1500), None);
    }

    #[test]
    fn not_adaptive_learns_nothing() {
        let mut l = Learning::new(5, false);
        let w = l.on_report(
            &Outcome { rate: RateInfo { retry_after_ms: Some(5000), ..RateInfo::default() }, ..throttled() },
            0,
            5,
            4,
            0,
        );
        assert_eq!(w, Wakeups::default());
        assert_eq!(l.effective(), 5);
        assert_eq!(l.pause(0), None);
    }

    #[test]
    fn reconfigure_keeps_a_cut_but_follows_an_unreduced_limit() {
        let mut l = Learning::new(10, true);
        l.reconfigure(20, true);
        assert_eq!(l.effective(), 20);
        l.on_report(&throttled(), l.epoch(), 20, 19, 0);
        assert_eq!(l.effective(), 18);
        l.reconfigure(30, true);
        assert_eq!(l.effective(), 18);
        l.reconfigure(5, true);
        assert_eq!(l.effective(), 5);
    }
}
