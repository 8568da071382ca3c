//! A request budget learned from the pattern of refusals alone, for an
//! upstream that sends no rate headers (at most a `Retry-After`).
//!
//! A spent window shows as a run of refusals that goes on after a cut (the
//! pool-wide evidence of `learn`); the window opening again shows as the
//! first success after such a run. The successes between an opening and the
//! next run are the budget of one window; the openings, counted in windows,
//! give the window's length. Once both are known, `Learning` keeps them as
//! a budget it was told (`budget_limit`, `window_ms`) and paces its grants
//! to it: the refusals stop, and so do the runs that taught it.
//!
//! Pure arithmetic on instants; O(1) per report.
use crate::time::Ms;

/// The first pause of a run without a retry hint, before one call probes
/// whether the upstream admits again.
pub const PROBE_BACKOFF_MIN_MS: Ms = 250;
/// Probes of a run that goes on are at most this far apart.
pub const PROBE_BACKOFF_MAX_MS: Ms = 1000;

/// What the refusals have taught so far (not saved: a restored pool keeps
/// the budget it learned, and learns the pattern again).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pattern {
    /// The limit, the refused level and the probe wait before the current
    /// run of refusals: a run that proves pool-wide was no evidence about
    /// concurrency.
    pub run_restore: (u32, u32, u32),
    /// The level of the run's first refusal, and the lowest level refused
    /// in it since.
    pub run_began: u32,
    pub run_low: u32,
    /// A pool-wide run without a retry hint: one call at a time probes the
    /// upstream until one succeeds.
    pub probing: bool,
    pub backoff_ms: Ms,
    /// The first grant: the first window opened then.
    pub first_open: Option<Ms>,
    /// The last opening seen, and the windows counted since `first_open`.
    pub last_open: Ms,
    pub windows: u64,
    /// Successes of leases granted since `last_open`.
    pub since_open: u64,
    /// The successes between the last opening and the run after it.
    pub last_sample: Option<u64>,
    /// The budget of one window, once two such samples agreed (an upstream
    /// that only limits concurrency refuses in runs now and then, with any
    /// number of successes between).
    pub per_window: Option<u64>,
    /// `Learning`'s budget is this pattern's (no upstream header said one).
    pub in_force: bool,
}

impl Pattern {
    pub fn on_first_grant(&mut self, now: Ms) {
        if self.first_open.is_none() {
            self.first_open = Some(now);
            self.last_open = now;
        }
    }

    /// The window's length: the time since the first opening over the
    /// windows counted in it.
    pub fn window_ms(&self) -> Option<Ms> {
        let first = self.first_open?;
        (self.windows > 0).then(|| (self.last_open - first) / self.windows)
    }

    /// A run of refusals became pool-wide: the window is spent. Returns the
    /// pause before the next probe when there is no retry hint.
    pub fn on_spent(&mut self, hinted: bool) -> Option<Ms> {
        if let Some(n) = self.per_window.filter(|_| self.in_force && !self.probing) {
            // A run under a learned budget: it allowed a call too many.
            self.per_window = Some(n.saturating_sub(1).max(1));
        }
        if hinted {
            return None;
        }
        self.probing = true;
        self.backoff_ms =
            if self.backoff_ms == 0 { PROBE_BACKOFF_MIN_MS } else { (self.backoff_ms * 2).min(PROBE_BACKOFF_MAX_MS) };
        Some(self.backoff_ms)
    }

    /// The first success of a lease granted at `granted_at` after a pool-wide
    /// run: the window opened by then. The successes of the leases granted
    /// since the last opening were the budget of a window.
    pub fn on_open(&mut self, granted_at: Ms) {
        self.probing = false;
        self.backoff_ms = 0;
        if self.first_open.is_none() || granted_at <= self.last_open {
            return;
        }
        let sample = self.since_open;
        if !self.in_force && self.last_sample.is_some_and(|last| last.abs_diff(sample) <= (sample / 10).max(2)) {
            self.per_window = self.last_sample.map(|last| last.min(sample));
        }
        self.last_sample = Some(sample);
        let interval = granted_at - self.last_open;
        // Openings seen after a long paced stretch span several windows.
        let windows = match self.window_ms() {
            Some(w) if w > 0 => ((interval + w / 2) / w).max(1),
            _ => 1,
        };
        self.windows += windows;
        self.last_open = granted_at;
        self.since_open = 0;
    }

    /// A success of a lease granted at `granted_at`.
    pub fn on_success(&mut self, granted_at: Ms) {
        if self.first_open.is_some() && granted_at >= self.last_open {
            self.since_open += 1;
        }
    }

    /// The budget to keep, once the budget of a window and its length are known.
    pub fn budget(&self) -> Option<(u64, Ms)> {
        Some((self.per_window?, self.window_ms().filter(|&w| w > 0)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openings_and_runs_give_the_budget_and_the_window() {
        let mut p = Pattern::default();
        p.on_first_grant(100);
        for i in 0..60 {
            p.on_success(100 + i);
        }
        assert_eq!(p.on_spent(false), Some(PROBE_BACKOFF_MIN_MS));
        assert_eq!(p.on_spent(false), Some(2 * PROBE_BACKOFF_MIN_MS), "a probe refused doubles the pause");
        p.on_open(6300);
        assert!(!p.probing);
        assert_eq!(p.budget(), None, "one sample of the budget is not a pattern");
        for i in 0..59 {
            p.on_success(6300 + i);
        }
        p.on_spent(false);
        p.on_open(12_100);
        assert_eq!(p.budget(), Some((59, 6000)));
        // A long paced stretch: the next opening, 30 s on, counts five windows.
        p.in_force = true;
        p.on_open(12_100 + 5 * 6000 + 900);
        assert_eq!(p.windows, 7);
        // A run under the learned budget: one fewer per window.
        assert_eq!(p.on_spent(true), None);
        assert_eq!(p.per_window, Some(58));
    }

    #[test]
    fn runs_with_any_number_of_successes_between_teach_no_budget() {
        let mut p = Pattern::default();
        p.on_first_grant(0);
        for (at, successes) in [(1000, 40), (9000, 700), (20_000, 90)] {
            for _ in 0..successes {
                p.on_success(at - 1);
            }
            p.on_spent(true);
            p.on_open(at);
        }
        assert_eq!(p.per_window, None);
    }
}
