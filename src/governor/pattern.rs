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
//! Nothing tells such a pool when the upstream changes its budget, so the
//! learned one is kept honest both ways:
//! - down: a run under it shows where the window ran out, the place of its
//!   first refusal among the window's grants, and the calls before that
//!   place are the new budget (at most a halving per run). Refusals in two
//!   windows running, without a run, say it is a little too high: one fewer.
//! - up: after `RATE_PROBE_GAP_MIN` windows that used the whole budget
//!   without a refusal, the pool probes: each window grants more than the
//!   one before, one call, then two, four... (at most a quarter of the
//!   budget more per window). The first refusal of a probe's call ends it,
//!   cuts nothing, and leaves the budget at the last level whose calls had
//!   all reported without one: the window before the refused call's. A
//!   probe refused at its first step doubles the wait for the next (at most
//!   `RATE_PROBE_GAP_MAX` windows): at a budget that holds, probing costs
//!   about one refusal in that many windows.
//!
//! Pure arithmetic on instants and grant counts; O(1) per report.
use crate::time::Ms;

/// The first pause of a run without a retry hint, before one call probes
/// whether the upstream admits again.
pub const PROBE_BACKOFF_MIN_MS: Ms = 250;
/// Probes of a run that goes on are at most this far apart.
pub const PROBE_BACKOFF_MAX_MS: Ms = 1000;
/// Windows that use a learned budget whole, without a refusal, before a
/// probe grants more.
pub const RATE_PROBE_GAP_MIN: u32 = 4;
/// Each probe refused at its first step doubles the wait for the next, up
/// to this many windows.
pub const RATE_PROBE_GAP_MAX: u32 = 64;

/// A raise of the learned budget on trial, one level per window: the
/// grants from the `first`-th on are its calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateProbe {
    pub first: u64,
    /// The first grant of the current window.
    pub window_first: u64,
    /// The levels of the window before the last one, the last one, and
    /// the current one. The first is sure: its calls all reported.
    pub sure: u64,
    pub last: u64,
    pub current: u64,
}

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
    /// Grants made before the current window of the budget in force: a
    /// lease's grant count less this is its place in the window.
    pub window_seq: u64,
    /// The place in its window of the lease whose refusal began the current
    /// run (`None`: granted in an earlier window).
    pub run_place: Option<u64>,
    /// A call of the current window was refused (a probe's calls aside).
    pub window_refused: bool,
    /// Refills for which a run under the budget in force counts as one
    /// more after a recent run (set to 3 by a run: the next two windows).
    pub run_lately: u8,
    /// The window before it had one too.
    pub refused_before: bool,
    /// Windows used whole without a refusal since the last probe.
    pub quiet: u32,
    /// Such windows to wait before the next probe (0: not yet set).
    pub probe_gap: u32,
    pub probe: Option<RateProbe>,
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
            // A run under a learned budget: the upstream admits fewer than
            // it now. The calls before the run's first refusal are what it
            // admitted (at most a halving per run; one fewer when the run
            // began in an earlier window).
            // One run may be a window the pool's grid placed wrong (its
            // start is a guess); a run again within two windows is not.
            let admitted = match self.run_place {
                Some(place) if self.run_lately > 0 => place - 1,
                _ => n,
            };
            self.run_lately = 3;
            self.quiet = 0;
            self.per_window = Some(admitted.clamp((n / 2).max(1), n.saturating_sub(1).max(1)));
            self.probe = None;
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
        // The length is measured from the pool's first grant, which need not
        // be near a window's start: a pool idle after its first call, or one
        // whose first windows were not spent, spans more windows there than
        // one, and nothing yet said how long one is. The next interval says:
        // half again as long as it, the one interval measured is no window,
        // and the length is measured from its end on.
        if let Some(first) = self.first_open.filter(|_| self.windows == 1) {
            if self.last_open - first > interval + interval / 2 {
                (self.first_open, self.windows) = (Some(self.last_open), 0);
            }
        }
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

    /// A window of the budget in force begins, after `grants` grants; the
    /// one before it was granted whole (`used_up`) or not. Moves a probe on
    /// a level, or begins one; either sets `per_window`.
    pub fn on_refill(&mut self, used_up: bool, grants: u64) {
        let refused = std::mem::take(&mut self.window_refused);
        let refused_before = std::mem::replace(&mut self.refused_before, refused);
        self.window_seq = grants;
        self.run_place = None;
        self.run_lately = self.run_lately.saturating_sub(1);
        let Some(n) = self.per_window else { return };
        if let Some(probe) = &mut self.probe {
            if !used_up {
                // Calls too few to fill it: the probe says nothing more.
                self.per_window = Some(probe.sure);
                self.probe = None;
                return;
            }
            let step = (2 * (probe.current - probe.last)).clamp(1, (probe.current / 4).max(1));
            *probe = RateProbe {
                window_first: grants + 1,
                sure: probe.last,
                last: probe.current,
                current: probe.current + step,
                ..*probe
            };
            self.per_window = Some(probe.current);
            return;
        }
        if refused && refused_before {
            // Each of the upstream's windows refuses a call: one too many.
            self.per_window = Some(n.saturating_sub(1).max(1));
        }
        self.quiet = if used_up && !refused { self.quiet + 1 } else { 0 };
        if self.quiet >= self.probe_gap.max(RATE_PROBE_GAP_MIN) {
            self.quiet = 0;
            self.per_window = Some(n + 1);
            self.probe =
                Some(RateProbe { first: grants + 1, window_first: grants + 1, sure: n, last: n, current: n + 1 });
        }
    }

    /// A refusal of the call granted `seq`-th, while the budget is in force.
    /// Returns whether it was a probe's call: the raise went too far, and
    /// that, not too many at once, is what it says.
    pub fn on_probe_refusal(&mut self, seq: u64) -> bool {
        let Some(probe) = self.probe.filter(|p| seq >= p.first) else { return false };
        self.probe = None;
        // The level kept is on trial: a refusal in the next window takes one off it.
        self.refused_before = true;
        self.per_window = Some(if seq >= probe.window_first { probe.last } else { probe.sure });
        if probe.current == probe.sure + 1 || probe.last == probe.sure && seq < probe.window_first {
            self.probe_gap = (self.probe_gap.max(RATE_PROBE_GAP_MIN) * 2).min(RATE_PROBE_GAP_MAX);
        } else {
            self.probe_gap = RATE_PROBE_GAP_MIN;
        }
        true
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

    /// The first window's length is measured from the pool's first grant:
    /// one call, then a minute idle before the windows are spent, is no
    /// window of a minute. The next interval shows it, and the length is
    /// measured from the first opening on (before, 33 s here: 66 calls a
    /// minute kept to an upstream that takes 600).
    #[test]
    fn an_idle_stretch_before_the_first_run_is_no_window() {
        let mut p = Pattern::default();
        p.on_first_grant(0);
        p.on_success(0);
        for i in 0..59 {
            p.on_success(60_000 + i);
        }
        p.on_spent(false);
        p.on_open(66_300);
        for i in 0..59 {
            p.on_success(66_300 + i);
        }
        p.on_spent(false);
        p.on_open(72_100);
        assert_eq!(p.budget(), Some((59, 5800)));
        // Later openings count from the first one, in windows.
        for i in 0..60 {
            p.on_success(72_100 + i);
        }
        p.on_spent(false);
        p.on_open(78_100);
        assert_eq!(p.budget(), Some((59, 5900)));
        // A first interval that is about a window is kept.
        let mut p = Pattern::default();
        p.on_first_grant(100);
        for (from, open, n) in [(100, 6_300, 60), (6_300, 12_100, 59)] {
            for i in 0..n {
                p.on_success(from + i);
            }
            p.on_spent(false);
            p.on_open(open);
        }
        assert_eq!(p.budget(), Some((59, 6000)));
    }

    /// A pattern whose budget of 60 is in force, `grants` grants in.
    fn in_force(grants: u64) -> Pattern {
        Pattern { per_window: Some(60), in_force: true, window_seq: grants, ..Pattern::default() }
    }

    #[test]
    fn whole_quiet_windows_lead_to_a_probe_that_climbs_until_refused() {
        let mut p = in_force(0);
        let mut grants = 0;
        for _ in 0..RATE_PROBE_GAP_MIN - 1 {
            grants += 60;
            p.on_refill(true, grants);
            assert_eq!((p.per_window, p.probe), (Some(60), None));
        }
        grants += 60;
        p.on_refill(true, grants);
        assert_eq!(p.per_window, Some(61), "a probe: one call more");
        let first = grants + 1;
        for want in [63, 67, 75] {
            grants += p.per_window.unwrap();
            p.on_refill(true, grants);
            assert_eq!(p.per_window, Some(want), "each window adds twice as many");
        }
        // A call of the window at 75 is refused: the window at 67 was the
        // last whose calls all reported.
        assert!(!p.on_probe_refusal(first - 1), "a call granted before the probe is not its");
        assert!(p.on_probe_refusal(grants + 10));
        assert_eq!((p.per_window, p.probe), (Some(67), None));
        assert_eq!(p.probe_gap, RATE_PROBE_GAP_MIN, "it found a new level: no longer wait");
    }

    #[test]
    fn a_probe_refused_at_its_first_step_keeps_the_budget_and_waits_longer() {
        let mut p = in_force(0);
        for i in 1..=RATE_PROBE_GAP_MIN as u64 {
            p.on_refill(true, 60 * i);
        }
        assert_eq!(p.per_window, Some(61));
        assert!(p.on_probe_refusal(60 * RATE_PROBE_GAP_MIN as u64 + 61));
        assert_eq!(p.per_window, Some(60));
        assert_eq!(p.probe_gap, 2 * RATE_PROBE_GAP_MIN);
        // Windows not used whole, or with a refusal, are not quiet.
        let mut grants = 1000;
        for used_up in [true, false, true, true, true, true, true, true, true] {
            grants += 60;
            p.on_refill(used_up, grants);
            assert_eq!(p.probe, None);
        }
        grants += 60;
        p.on_refill(true, grants);
        assert_eq!(p.per_window, Some(61), "after eight quiet windows in a row");
    }

    #[test]
    fn a_run_again_within_two_windows_says_where_the_budget_now_ends() {
        let mut p = in_force(600);
        // Its first refusal was the window's 31st call: one run may be a
        // window placed wrong, so one off.
        p.run_place = Some(31);
        p.on_spent(true);
        assert_eq!(p.per_window, Some(59));
        p.on_refill(true, 660);
        p.run_place = Some(31);
        p.on_spent(true);
        assert_eq!(p.per_window, Some(30), "the calls before the run's first refusal");
        // Never below half per run.
        p.on_refill(true, 700);
        p.run_place = Some(3);
        p.on_spent(true);
        assert_eq!(p.per_window, Some(15));
        // Refusals in two windows running, without a run: one off.
        p.on_refill(false, 800);
        p.on_refill(false, 900);
        p.window_refused = true;
        p.on_refill(true, 1000);
        assert_eq!(p.per_window, Some(15));
        p.window_refused = true;
        p.on_refill(true, 1100);
        assert_eq!(p.per_window, Some(14));
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
