//! What a pool learns from outcome reports: the adaptive limit, cool-downs
//! and the upstream's own budget.
//!
//! Pure arithmetic on `now`; the governor arms the wheel entries that end a
//! cool-down or a budget window, using the instants this module returns.
//! Every report is O(1) and allocates nothing. The rules and why they are
//! these are in the README ("What reports teach") and LEARNING.md.
//!
//! - A report is classified (`Evidence`): a refusal with an exhausted budget
//!   (`remaining: 0` or `tokenRemaining: 0`) is a rate refusal, any other
//!   refusal a concurrency refusal.
//! - A rate refusal teaches the budget (and its retry hint pauses the pool:
//!   an exhausted budget is pool-wide); it never touches the limit.
//! - A concurrency refusal cuts the limit to the evidence: the calls still in
//!   flight when it arrives (never below half the limit per report, never
//!   below 1). Its retry hint pauses the pool only when refusals go on after
//!   a cut: of leases granted after it, with no success of one in between.
//! - Successes grow the limit by one per `effective` successes while the pool
//!   uses its limit, up to just under the last refused level; the step onto
//!   that level (a probe) waits `probe_wait` such successes, which doubles on
//!   every refused probe, or `PROBE_WAIT_MS` once `PROBE_WAIT_MIN` of them
//!   are in (a pool of few calls a second finds a raised limit in seconds,
//!   not thousands of calls). A probe that holds for two call times means the
//!   upstream's limit rose: the limit climbs, one per success at full use,
//!   until the next refusal.
//! - Budget windows are told apart by their reset instant: within one window
//!   `remaining` only goes down; a report of a later window replaces it; a
//!   report of a window that already ended is ignored, and one ending more
//!   than two windows after the running one is set aside.
//! - Without rate headers the budget is learned from the pattern of refusals
//!   (`pattern`), and kept honest both ways: runs under it lower it, probes
//!   above it raise it. While it paces the pool, far fewer calls are in
//!   flight than the limit: a window's first refusal, or a probe's, there is
//!   taken as the window running out and cuts nothing.
use super::pattern::{Pattern, PROBE_BACKOFF_MAX_MS, PROBE_BACKOFF_MIN_MS};
use crate::time::Ms;

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
    /// The reset was given to the whole second (a date or epoch seconds on
    /// a second's boundary, or whole seconds from now): rounded up, the
    /// window may end up to a second before it.
    pub reset_coarse: bool,
    /// The reset named an instant on a second's boundary (a date, epoch
    /// seconds): `now + reset` is that instant whenever the headers were
    /// stamped, where seconds to go count from the stamp.
    pub reset_instant: bool,
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
}

/// What one report says about the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evidence {
    /// Refused because a request or token window is spent (or, with no
    /// status, showing it spent).
    Rate,
    /// Refused with no sign of a spent budget: too many at once, or overload.
    Concurrency,
    /// Served (`status < 400`, or no status and no sign of a refusal), not throttled.
    Success,
    /// Anything else (a 4xx other than 429, a 5xx, no status with a retry
    /// hint): teaches only its rate headers.
    Other,
}

impl Outcome {
    pub fn evidence(&self) -> Evidence {
        let r = &self.rate;
        // A spent budget: `remaining` 0, or a window resetting later that
        // says nothing of what is left, with a retry hint (SPEC §7: "a 429
        // with such headers"; Groq's). One that shows something left says
        // the refusal was not the window. A silent reset without a hint may
        // be either: it is judged as a concurrency refusal, whose run, once
        // pool-wide, waits for that reset (`Learning::on_report`).
        let hinted = r.retry_after_ms.is_some_and(|ms| ms > 0);
        let spent = r.remaining == Some(0) || r.token_remaining == Some(0) || r.silent_reset().is_some() && hinted;
        // A report with no status that shows the window spent is the rate
        // refusal's sign (SPEC §7: "the report shows `remaining` 0"): the
        // lock API asks for outcome fields when a call saw throttling, and
        // the next call would be refused whatever this one got.
        let refused = self.is_throttled() || self.status.is_none() && spent;
        match (refused, spent) {
            (true, true) => Evidence::Rate,
            (true, false) => Evidence::Concurrency,
            // Served: a status under 400, or none and no retry hint. A report
            // that gives no status and no 429 (`{}`, `{"throttled":0}`) says
            // what a release without a report says, since the lock API asks
            // for outcome fields when a call saw throttling: the same success
            // (`Learning::on_unreported`), or a limit cut by a 429 would never
            // grow back for a caller that always sends a report object. One
            // with a retry hint and no status may be of a refused call: it
            // teaches only its rate headers, as a `5xx` does.
            (false, _) if self.status.map_or(!hinted, |s| s < 400) => Evidence::Success,
            _ => Evidence::Other,
        }
    }
}

impl RateInfo {
    /// The reset of a window said with nothing of what is left (Groq's
    /// `x-ratelimit-reset-requests` alone, a body's `resetMs` alone); of a
    /// request and a token window said so, the sooner: a refusal for the
    /// other comes back with its own reset after it.
    fn silent_reset(&self) -> Option<u64> {
        if self.remaining.is_some() || self.token_remaining.is_some() {
            return None;
        }
        let (requests, tokens) = (self.reset_ms.filter(|&ms| ms > 0), self.token_reset_ms.filter(|&ms| ms > 0));
        requests.into_iter().chain(tokens).min()
    }

    /// Whether a spent window here says when it ends: a request window
    /// with its reset, or a token window with its own.
    fn says_when_spent_ends(&self) -> bool {
        let ends = |left: Option<u64>, reset: Option<u64>| left == Some(0) && reset.is_some_and(|ms| ms > 0);
        ends(self.remaining, self.reset_ms) || ends(self.token_remaining, self.token_reset_ms)
    }
}

/// The upstream request budget of one reset window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Budget {
    /// Grants still allowed before `reset_at`.
    pub remaining: u64,
    /// The earliest instant any report of this window put its reset at.
    pub reset_at: Ms,
}

/// The grants of a refilled window, spread over it: a window the refill
/// guessed may be sliding, where a reset frees only the calls that leave it,
/// not the whole budget. Spread evenly, the calls fit either kind, and a
/// fixed window still gets its whole budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Pace {
    /// The window's start.
    pub from: Ms,
    pub per_window: u64,
    pub window_ms: u64,
    /// Grants made since `from`.
    pub granted: u64,
}

impl Pace {
    /// When the next grant may go: one at once, then one every
    /// `window_ms / per_window`.
    pub fn next_at(&self) -> Ms {
        self.from + (self.granted * self.window_ms).div_ceil(self.per_window.max(1))
    }
}

/// What a report set that has an end: a cool-down, a budget window's reset,
/// a token block. The governor reads `cooldown_until` only, to count
/// cool-downs (the other two say what the report did, for the tests); the
/// instants themselves come back through `Learning::pause`, and a queue held
/// back by them is woken by the pool's one wake-up entry, armed when the
/// queue is pumped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Wakeups {
    pub cooldown_until: Option<Ms>,
    pub budget_reset_at: Option<Ms>,
    pub token_block_until: Option<Ms>,
}

/// The lease a report is about, as the governor saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported {
    /// The congestion epoch the lease was granted in.
    pub epoch: u32,
    /// When it was granted.
    pub granted_at: Ms,
    /// `Learning::grants` right after its grant.
    pub grant_seq: u64,
    /// Leases of the pool still held, the reported one not counted.
    pub in_flight: u32,
    /// Successes reported while it was held: calls that ran beside it.
    pub oks_beside: u32,
}

/// The first probe onto the last refused level waits this many successes.
pub const PROBE_WAIT_MIN: u32 = 256;
/// A probe that keeps failing waits at most this many successes: probing
/// costs at most one refusal in 256, at least one in 1024, and a limit the
/// upstream raised is found within 1024 successes.
pub const PROBE_WAIT_MAX: u32 = 1024;
/// ... or, once `PROBE_WAIT_MIN` successes are in, this long since the
/// first of them: at a few calls a second, 1024 successes would take
/// minutes. Probing still costs at most one refusal in `PROBE_WAIT_MIN`.
pub const PROBE_WAIT_MS: Ms = 20_000;
/// Concurrency refusals in a row of leases granted after the last cut (no
/// success of one between) that make a retry hint pool-wide.
pub const POOL_WIDE_STREAK: u32 = 3;
/// Calls granted this close together may reach the upstream in either
/// order (they leave through different connections and threads), so a
/// report's `remaining` may already count them.
pub const REORDER_MS: Ms = 50;
/// Grant instants remembered to place reports among the grants.
const MARKS: usize = 64;
/// A fresh adaptive pool grants at most this many at once before evidence
/// (an initial window, as TCP's of RFC 6928): the default `concurrency`, so
/// a pool left at the default starts as it always did, and one configured
/// higher ramps up from here.
pub const INITIAL_WINDOW: u32 = 16;
/// During the start, the limit doubles every this many ms until the first
/// concurrency refusal or `concurrency` (slow start, paced by the clock: a
/// pool whose callers never report must still reach its limit).
pub const RAMP_DOUBLING_MS: Ms = 100;
/// How far the stamping vote may lean either way.
pub const STAMP_VOTES: i32 = 8;

/// The grants made before each of the last `MARKS` distinct grant instants:
/// how many grants came after a given instant, in O(1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantMarks {
    /// `(instant, grants made before it)`, oldest at `next`.
    marks: [(Ms, u64); MARKS],
    next: usize,
    len: usize,
}

impl Default for GrantMarks {
    fn default() -> Self {
        GrantMarks { marks: [(0, 0); MARKS], next: 0, len: 0 }
    }
}

impl GrantMarks {
    /// Notes a grant at `now`; `before` grants were made earlier.
    fn on_grant(&mut self, now: Ms, before: u64) {
        let last = (self.next + MARKS - 1) % MARKS;
        if self.len > 0 && self.marks[last].0 >= now {
            return;
        }
        self.marks[self.next] = (now, before);
        self.next = (self.next + 1) % MARKS;
        self.len = (self.len + 1).min(MARKS);
    }

    /// The grants made before the first grant instant after `t`: `Some(total)`
    /// when none was after it, `None` when `t` is older than every mark.
    fn before_first_after(&self, t: Ms, total: u64) -> Option<u64> {
        let mut found = total;
        for i in 1..=self.len {
            let (at, before) = self.marks[(self.next + MARKS - i) % MARKS];
            if at <= t {
                return Some(found);
            }
            found = before;
        }
        None
    }
}

/// Where a pool is in its start (a state saved before there was one is past it).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Start {
    /// No grant yet: the limit is the initial window.
    Pending,
    /// Ramping up since the first grant at this instant.
    Since(Ms),
    /// Ended by the first concurrency refusal, or at `concurrency`.
    #[default]
    Done,
}

/// Everything a pool has learned: plain fields, so it can be saved and restored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Learning {
    pub adaptive: bool,
    pub concurrency: u32,
    /// The concurrency limit in force, in `[1, concurrency]`.
    pub effective: u32,
    #[serde(default)]
    pub start: Start,
    /// The lowest in-flight count the upstream refused since the last
    /// successful probe (`0`: none known). Growth stops just under it.
    pub refused_at: u32,
    /// The lowest level the reports of the burst that caused the last cut
    /// showed (`0`: none pending), held back from `refused_at` until a call
    /// of that burst is seen to succeed: only then were the calls beside
    /// its refusals allowed. A burst refused whole (its calls leaving one
    /// by one, each report showing fewer beside it) shows levels down to 1
    /// that the upstream never refused at.
    #[serde(default)]
    pub burst_low: u32,
    /// Successes at full use needed before probing `refused_at`.
    pub probe_wait: u32,
    /// A probe held: the upstream allows more than it did, and how much
    /// more is unknown. Every success at full use adds one until the next
    /// concurrency refusal.
    #[serde(default)]
    pub climbing: bool,
    /// Growth stepped onto `refused_at`: a refusal now is a refused probe.
    #[serde(default)]
    pub probe_out: bool,
    /// Bumped at every cut; leases remember the epoch they were granted in.
    pub epoch: u32,
    /// Successes counted towards the next step of growth.
    pub successes: u32,
    /// When the first of `successes` was counted.
    #[serde(default)]
    pub successes_since: Ms,
    /// Concurrency refusals of leases granted after the last cut, since the
    /// last success of one.
    pub refusal_streak: u32,
    /// Grants made so far (orders reports against grants).
    pub grants: u64,
    /// Successes reported so far (wrapping): a lease keeps the count at its
    /// grant, so its report knows how many calls succeeded beside it.
    #[serde(default)]
    pub oks: u32,
    /// Instants of this process's grants: not saved (a restored pool places
    /// reports by each lease's own grant count until it has new marks).
    #[serde(skip)]
    pub marks: GrantMarks,
    /// Whether reports look stamped when the upstream answered (their
    /// `now + reset` agree) rather than when it admitted the call: a vote
    /// in `-STAMP_VOTES..=STAMP_VOTES`, positive for the response.
    #[serde(default)]
    pub stamp_votes: i32,
    pub cooldown_until: Ms,
    pub budget: Option<Budget>,
    /// Set by a refill, cleared by a report of a later window.
    #[serde(default)]
    pub pace: Option<Pace>,
    /// The requests the upstream allows per window, when it said.
    pub budget_limit: Option<u64>,
    /// The longest reset the upstream announced: the window length.
    pub window_ms: u64,
    /// The reset instant of the window that ended last: reports of it are stale.
    pub ended_reset_at: Ms,
    /// The budget's reset is the refill's guess (one window after the last),
    /// not yet said by a report of its window: the first one replaces it.
    #[serde(default)]
    pub reset_guessed: bool,
    /// The budget's window cannot end before this: the latest of the
    /// earliest ends its reports allow (0: no report said it yet).
    #[serde(default)]
    pub budget_not_before: Ms,
    /// The newest lease (its grant count) whose report said the budget.
    #[serde(default)]
    pub budget_seq: u64,
    /// The newest lease (its grant count) whose report said `budget_limit`
    /// (0: none did, or refusals taught it).
    #[serde(default)]
    pub budget_limit_seq: u64,
    pub token_block_until: Ms,
    /// The lease (its grant count) whose report set `token_block_until`: a
    /// report of a call granted after it is a newer view of the token
    /// window, which may end the block early or move it.
    #[serde(default)]
    pub token_block_seq: u64,
    /// The budget learned from refusals when the upstream sends no rate
    /// headers (`pattern`).
    #[serde(skip)]
    pub pattern: Pattern,
    /// Rate refusals that say neither when their window ends nor when to
    /// retry (not saved: a restarted pool probes again on the next one).
    #[serde(skip)]
    pub blind: BlindProbe,
    /// One call at a time probes a spent upstream: the pattern probes a
    /// pool-wide run, or a blind probe goes on. Kept in one flag, brought up
    /// to date after every report, because every grant reads it.
    #[serde(skip)]
    pub one_at_a_time: bool,
    /// Calls this process granted during the start that have not left
    /// yet (counted until the start is done: only its ramp reads them).
    #[serde(skip)]
    pub out: u32,
    /// The start's ramp counts time of use: from this instant, when the
    /// last call out left, it stands still until the next grant.
    #[serde(skip)]
    pub idle_since: Option<Ms>,
}

/// A spent window whose end nobody said (`remaining: 0` with no reset, or
/// one already past, and no retry hint): the pool pauses, then lets one call
/// at a time probe the upstream until one succeeds. Without this the pool
/// would keep its limit and send every call into the spent window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlindProbe {
    /// The pause before the next probe (`PROBE_BACKOFF_MIN_MS` doubling to
    /// `PROBE_BACKOFF_MAX_MS`); 0 when not probing.
    pub backoff_ms: Ms,
    /// When the pause began: the calls granted by then were out in the
    /// spent window, and what they report neither doubles it nor ends it.
    pub since: Ms,
    /// Those calls still held. They are no probe, and hold none back: the
    /// one call at a time goes out beside them once the pause ends, not
    /// only when the last of them (a long call, a holder that vanished)
    /// has come back.
    pub out_before: u32,
}

/// Why a pool cannot grant right now, and for how long that is known to last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    Cooldown(u64),
    Budget(u64),
}

impl Learning {
    pub fn new(concurrency: u32, adaptive: bool) -> Learning {
        let ramps = adaptive && concurrency > INITIAL_WINDOW;
        Learning {
            adaptive,
            concurrency,
            effective: if ramps { INITIAL_WINDOW } else { concurrency },
            start: if ramps { Start::Pending } else { Start::Done },
            refused_at: 0,
            burst_low: 0,
            probe_wait: PROBE_WAIT_MIN,
            climbing: false,
            probe_out: false,
            epoch: 0,
            successes: 0,
            successes_since: 0,
            refusal_streak: 0,
            grants: 0,
            oks: 0,
            marks: GrantMarks::default(),
            stamp_votes: 0,
            cooldown_until: 0,
            budget: None,
            pace: None,
            budget_limit: None,
            window_ms: 0,
            ended_reset_at: 0,
            reset_guessed: false,
            budget_not_before: 0,
            budget_seq: 0,
            budget_limit_seq: 0,
            token_block_until: 0,
            token_block_seq: 0,
            pattern: Pattern::default(),
            blind: BlindProbe::default(),
            one_at_a_time: false,
            out: 0,
            idle_since: None,
        }
    }

    /// The limit in force: 1 while one call at a time probes a spent
    /// upstream (after a pool-wide run, or a blind rate refusal).
    pub fn effective(&self) -> u32 {
        if self.one_at_a_time {
            1
        } else {
            self.effective
        }
    }

    /// The limit in force at `now`: `effective`, with the start's ramp
    /// carried to `now`. Only a grant carries it (`ramp`); what reads the
    /// limit between grants (the governor headers, the metrics, the
    /// dashboard, the gates) sees where the ramp is, as the next grant would.
    pub fn effective_at(&self, now: Ms) -> u32 {
        match self.start {
            Start::Since(since) if !self.one_at_a_time => {
                self.effective.max(self.ramp_cap(since, self.ramp_clock(now)))
            }
            // Beside the calls out, but never past the configured limit (a
            // reload may have lowered it under them).
            _ if self.one_at_a_time => (1 + self.exempt_at(now)).min(self.concurrency.max(1)),
            _ => self.effective,
        }
    }

    /// Whether the start still ramps at `now` (see `effective_at`).
    pub fn starting_at(&self, now: Ms) -> bool {
        match self.start {
            Start::Done => false,
            Start::Pending => true,
            Start::Since(since) => self.effective.max(self.ramp_cap(since, self.ramp_clock(now))) < self.concurrency,
        }
    }

    /// Where the start's ramp is at `now`: it stands still while no call
    /// is out, so a pool that made one call and then stood idle meets its
    /// first burst with the limit it had, not `concurrency` (README rule 0:
    /// the limit doubles every 100 ms of use).
    fn ramp_clock(&self, now: Ms) -> Ms {
        self.idle_since.map_or(now, |idle| idle.min(now))
    }

    /// The start's limit `now`, for a ramp begun at `since`: the initial
    /// window, doubled every `RAMP_DOUBLING_MS` (linearly between), at most
    /// `concurrency`.
    fn ramp_cap(&self, since: Ms, now: Ms) -> u32 {
        let elapsed = now.saturating_sub(since);
        let doublings = (elapsed / RAMP_DOUBLING_MS).min(31) as u32;
        let base = (INITIAL_WINDOW as u64) << doublings;
        let cap = base + base * (elapsed % RAMP_DOUBLING_MS) / RAMP_DOUBLING_MS;
        cap.min(self.concurrency as u64) as u32
    }

    /// The first millisecond after `now` at which `ramp_cap` for a ramp
    /// begun at `since` has grown by a slot (or doubled: a doubling's end).
    fn ramp_grows_at(since: Ms, now: Ms) -> Ms {
        let elapsed = now.saturating_sub(since);
        let base = (INITIAL_WINDOW as u64) << (elapsed / RAMP_DOUBLING_MS).min(31);
        let into = elapsed % RAMP_DOUBLING_MS;
        let grown = base * into / RAMP_DOUBLING_MS;
        let next = ((grown + 1) * RAMP_DOUBLING_MS).div_ceil(base).min(RAMP_DOUBLING_MS);
        now + (next - into)
    }

    /// The same state with every instant passed through `at` (a snapshot
    /// moves them from one process's clock to another's). Every field that
    /// is an instant is listed here.
    pub fn rebased(&self, at: impl Fn(Ms) -> Ms) -> Learning {
        Learning {
            cooldown_until: at(self.cooldown_until),
            budget: self.budget.map(|b| Budget { reset_at: at(b.reset_at), ..b }),
            ended_reset_at: at(self.ended_reset_at),
            budget_not_before: at(self.budget_not_before),
            token_block_until: at(self.token_block_until),
            successes_since: at(self.successes_since),
            start: match self.start {
                Start::Since(t) => Start::Since(at(t)),
                other => other,
            },
            pace: self.pace.map(|p| Pace { from: at(p.from), ..p }),
            marks: GrantMarks::default(),
            pattern: Pattern::default(),
            blind: BlindProbe::default(),
            one_at_a_time: false,
            out: 0,
            idle_since: None,
            ..self.clone()
        }
    }

    /// The state a file restored, within what this pool could have learned
    /// by `now`: its configured limit and mode, and every instant no further
    /// ahead than its cap. A file passes a digest check, which says it is
    /// whole, not that its numbers are sane; a learned limit above the
    /// configured one would over-admit, an instant years ahead shut the pool.
    pub fn bounded(self, now: Ms, concurrency: u32, adaptive: bool) -> Learning {
        let horizon = now.saturating_add(MAX_BUDGET_WINDOW_MS);
        Learning {
            adaptive,
            concurrency,
            effective: self.effective.clamp(1, concurrency.max(1)),
            start: match self.start {
                Start::Since(t) => Start::Since(t.min(now)),
                other => other,
            },
            refused_at: self.refused_at.min(concurrency),
            burst_low: self.burst_low.min(concurrency),
            probe_wait: self.probe_wait.clamp(PROBE_WAIT_MIN, PROBE_WAIT_MAX),
            stamp_votes: self.stamp_votes.clamp(-STAMP_VOTES, STAMP_VOTES),
            cooldown_until: self.cooldown_until.min(now.saturating_add(MAX_COOLDOWN_MS)),
            budget: self.budget.map(|b| Budget { reset_at: b.reset_at.min(horizon), ..b }),
            pace: self.pace.filter(|p| p.per_window > 0 && p.window_ms <= MAX_BUDGET_WINDOW_MS && p.from <= now),
            window_ms: self.window_ms.min(MAX_BUDGET_WINDOW_MS),
            ended_reset_at: self.ended_reset_at.min(horizon),
            budget_not_before: self.budget_not_before.min(horizon),
            token_block_until: self.token_block_until.min(horizon),
            // A lease this process re-adopts counts as granted at the restore
            // (`grants`), but may be older than the block: it is no newer view.
            token_block_seq: self.token_block_seq.max(self.grants),
            successes_since: self.successes_since.min(now),
            ..self
        }
    }

    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    pub fn budget(&self) -> Option<Budget> {
        self.budget
    }

    /// A new configured limit: an unreduced limit follows it, but not onto
    /// or past a level the upstream refused above it and no probe has passed
    /// since (a limit lowered under what was learned, then raised again,
    /// comes back to the learned limit, not to `concurrency`); a reduced one
    /// only comes down to it. Held slots are never revoked by this.
    pub fn reconfigure(&mut self, concurrency: u32, adaptive: bool) {
        let was_unreduced = self.effective >= self.concurrency;
        let refused_above = self.refused_at > self.effective;
        self.concurrency = concurrency;
        self.adaptive = adaptive;
        if !adaptive || was_unreduced && !refused_above {
            self.effective = concurrency;
        } else if was_unreduced {
            self.effective = concurrency.min(self.refused_at - 1);
        } else {
            self.effective = self.effective.min(concurrency);
        }
        if !adaptive {
            *self = Learning { grants: self.grants, marks: self.marks.clone(), ..Learning::new(concurrency, false) };
        }
    }

    /// Raises the start's limit to where the ramp is at `now` (the first
    /// call starts it); while it runs, says when to look again: the
    /// millisecond it next grows by a slot, so a queue held back by it is
    /// granted that slot then (and no acquire meanwhile finds it free with
    /// waiters queued).
    #[inline]
    pub fn ramp(&mut self, now: Ms) -> Option<Ms> {
        // Done once and for all after a pool's first moments: every grant
        // asks, so the answer stays a test in the caller.
        if matches!(self.start, Start::Done) {
            return None;
        }
        self.ramp_on(now)
    }

    /// `ramp` while the start is not done.
    #[inline(never)]
    fn ramp_on(&mut self, now: Ms) -> Option<Ms> {
        let since = match self.start {
            Start::Done => return None,
            Start::Pending => {
                self.start = Start::Since(now);
                now
            }
            Start::Since(t) => t,
        };
        let idle = self.idle_since.is_some();
        self.effective = self.effective.max(self.ramp_cap(since, self.ramp_clock(now)));
        if self.effective >= self.concurrency {
            self.start = Start::Done;
            return None;
        }
        // Idle, it grows at no instant: the next grant moves it on.
        (!idle).then(|| Self::ramp_grows_at(since, now))
    }

    /// The learned pause in force at `now`, if any. When a cool-down and
    /// the budget (a spent window, a token block, pacing) both hold the pool,
    /// the one that ends last is the pause: a grant waits for both. A tie
    /// goes to the cool-down.
    pub fn pause(&self, now: Ms) -> Option<Pause> {
        let cooldown = self.cooldown_until.saturating_sub(now);
        let wait = self.budget_wait(now);
        if cooldown > 0 && cooldown >= wait {
            return Some(Pause::Cooldown(cooldown));
        }
        (wait > 0).then_some(Pause::Budget(wait))
    }

    /// How long the learned budget (a spent window, a token block, pacing)
    /// holds the pool from `now`; 0 when it does not.
    pub fn budget_wait(&self, now: Ms) -> u64 {
        let mut wait = self.token_block_until.saturating_sub(now);
        if let Some(b) = self.budget.filter(|b| b.reset_at > now) {
            if b.remaining == 0 {
                wait = wait.max(b.reset_at - now);
            }
            // The pace of a window that ended holds nothing: the next grant
            // refills the budget, and its pace starts with one at once.
            if let Some(p) = self.pace {
                wait = wait.max(p.next_at().saturating_sub(now));
            }
        }
        wait
    }

    /// The grants the learned budget still allows at `now`, while there is
    /// one: a window that ended counts as refilled to the known limit (the
    /// next grant refills it), or as lifted when no limit is known.
    pub fn budget_remaining(&self, now: Ms) -> Option<u64> {
        let b = self.budget?;
        if b.reset_at > now {
            return Some(b.remaining);
        }
        self.budget_limit.filter(|_| self.window_ms > 0)
    }

    /// The budget and its pacing as they stand at `now`, for display: a
    /// window that ended counts as refilled to the known limit for one more
    /// window (or lifted), as the next grant will find it.
    pub fn budget_at(&self, now: Ms) -> (Option<Budget>, Option<Pace>) {
        if self.budget.is_some_and(|b| b.reset_at <= now) {
            let mut next = self.clone();
            let _ = next.on_budget_reset(now);
            return (next.budget, next.pace);
        }
        (self.budget, self.pace)
    }

    /// Counts a grant against the learned budget (moving on from a window that ended).
    pub fn on_grant(&mut self, now: Ms) {
        // Calls out are counted for the start's ramp only: once it is done,
        // a grant pays for no bookkeeping of it.
        if !matches!(self.start, Start::Done) {
            // The ramp goes on from where it stood when the pool went idle.
            if let (Some(idle), Start::Since(since)) = (self.idle_since.take(), &mut self.start) {
                *since += now.saturating_sub(idle);
            }
            self.out = self.out.saturating_add(1);
        }
        self.marks.on_grant(now, self.grants);
        self.pattern.on_first_grant(now);
        // Refilled before it counts, so the window's grant counts start after this one's.
        let _ = self.on_budget_reset(now);
        self.grants += 1;
        if let Some(b) = &mut self.budget {
            b.remaining = b.remaining.saturating_sub(1);
        }
        if let Some(p) = &mut self.pace {
            p.granted += 1;
        }
    }

    /// Moves on from a budget window that ended by `now` (called lazily, on a
    /// grant, a report or a read of the budget; no timer of its own): it is
    /// refilled to the known limit for one more window, or lifted.
    pub fn on_budget_reset(&mut self, now: Ms) -> Option<Ms> {
        let b = self.budget.filter(|b| b.reset_at <= now)?;
        self.ended_reset_at = b.reset_at;
        (self.budget_not_before, self.budget_seq) = (0, 0);
        if self.pattern.in_force {
            // A budget learned from refusals moves its probe on.
            self.pattern.on_refill(b.remaining == 0, self.grants);
            (self.budget_limit, self.budget_limit_seq) = (self.pattern.per_window, 0);
        }
        self.budget = match (self.budget_limit, self.window_ms) {
            (Some(limit), w) if w > 0 => {
                let mut reset_at = b.reset_at + w;
                if reset_at <= now {
                    reset_at = now + w;
                }
                self.reset_guessed = true;
                self.pace = Some(Pace { from: reset_at - w, per_window: limit, window_ms: w, granted: 0 });
                Some(Budget { remaining: limit, reset_at })
            }
            _ => {
                self.pace = None;
                None
            }
        };
        self.budget.map(|b| b.reset_at)
    }

    /// Applies a report about `lease` at `now`.
    pub fn on_report(&mut self, o: &Outcome, lease: Reported, now: Ms) -> Wakeups {
        let mut wake = Wakeups::default();
        if !self.adaptive {
            return wake;
        }
        let evidence = o.evidence();
        if self.pattern.in_force
            && evidence == Evidence::Concurrency
            && self.probe_refused(lease)
            && self.far_below(lease)
        {
            return wake;
        }
        let mut pool_wide = false;
        let mut hint = o.rate.retry_after_ms.filter(|&h| h > 0);
        let mut probe = None;
        match evidence {
            Evidence::Concurrency => {
                pool_wide = self.on_refusal(lease);
                // A window's reset with nothing said of what is left: once
                // the refusals go on after a cut, the window was spent, and
                // its reset says when to come back.
                hint = hint.or(o.rate.silent_reset());
                if pool_wide {
                    probe = self.on_pool_wide_run(hint);
                }
            }
            Evidence::Success => self.on_success(lease, now),
            Evidence::Rate => {
                pool_wide = true;
                probe = self.on_rate_refusal(&o.rate, hint, lease, now);
            }
            Evidence::Other => {}
        }
        if let Some(pause) = hint.filter(|_| pool_wide).or(probe) {
            let until = now + pause.min(MAX_COOLDOWN_MS);
            if until > self.cooldown_until {
                self.cooldown_until = until;
                wake.cooldown_until = Some(until);
            }
        }
        wake.budget_reset_at = self.learn_budget(&o.rate, lease, now, evidence == Evidence::Concurrency);
        wake.token_block_until = self.learn_token_block(&o.rate, lease, now);
        self.one_at_a_time = self.pattern.probing || self.blind.backoff_ms > 0;
        wake
    }

    /// `lease` released by its holder without a report: its call got an
    /// answer the caller did not call a refusal (the lock API asks for
    /// outcome fields when a call saw throttling), so it counts as a
    /// success that says nothing of the budget. Else a pool whose callers
    /// report only their refusals would never grow back after a cut, and
    /// its refusals would count as a run however many calls succeeded
    /// between them; a call of a blind probe released so ends the probe.
    pub fn on_unreported(&mut self, lease: Reported, now: Ms) {
        if !self.adaptive {
            return;
        }
        self.on_success(lease, now);
        self.one_at_a_time = self.pattern.probing || self.blind.backoff_ms > 0;
    }

    /// Learns the token window: `tokenRemaining: 0` with its reset blocks
    /// grants until then. A report of a call granted after the one whose
    /// report set the block is a newer view, and replaces it: tokens left
    /// end the block at once, a sooner reset moves it earlier. An older
    /// call's report can only make it longer. Returns the block's end when
    /// it was set or moved later.
    fn learn_token_block(&mut self, rate: &RateInfo, lease: Reported, now: Ms) -> Option<Ms> {
        let blocked = self.token_block_until > now;
        let newer = blocked && lease.grant_seq > self.token_block_seq;
        match (rate.token_remaining, rate.token_reset_ms) {
            (Some(0), Some(reset)) if reset > 0 => {
                let until = now + reset.min(MAX_BUDGET_WINDOW_MS);
                if until > self.token_block_until || newer {
                    self.token_block_seq =
                        if blocked { self.token_block_seq.max(lease.grant_seq) } else { lease.grant_seq };
                    let later = until > self.token_block_until;
                    self.token_block_until = until;
                    return later.then_some(until);
                }
                None
            }
            (Some(left), _) if left > 0 && newer => {
                self.token_block_until = now;
                None
            }
            _ => None,
        }
    }

    /// A rate refusal: one that says when its window ends, or when to
    /// retry, is paused by that (the budget, the token block, the
    /// cool-down) and ends a blind probe. One that says neither starts or
    /// goes on with a blind probe (`BlindProbe`), and returns its pause: a
    /// refusal of a call granted since the last pause began doubles it.
    fn on_rate_refusal(&mut self, rate: &RateInfo, hint: Option<u64>, lease: Reported, now: Ms) -> Option<Ms> {
        if hint.is_some() || rate.says_when_spent_ends() {
            self.blind = BlindProbe::default();
            return None;
        }
        let b = &mut self.blind;
        if b.backoff_ms > 0 && lease.granted_at <= b.since {
            return None;
        }
        if b.backoff_ms == 0 {
            b.out_before = lease.in_flight;
        }
        b.backoff_ms =
            if b.backoff_ms == 0 { PROBE_BACKOFF_MIN_MS } else { (b.backoff_ms * 2).min(PROBE_BACKOFF_MAX_MS) };
        b.since = now;
        Some(b.backoff_ms)
    }

    /// A lease granted at `granted_at` left the pool (released, reclaimed)
    /// at `now`, before its report, if any, is applied.
    pub fn on_lease_left(&mut self, granted_at: Ms, now: Ms) {
        if !matches!(self.start, Start::Done) {
            if self.out == 1 && matches!(self.start, Start::Since(_)) {
                self.idle_since = Some(now);
            }
            self.out = self.out.saturating_sub(1);
        }
        let b = &mut self.blind;
        if b.backoff_ms > 0 && granted_at <= b.since {
            b.out_before = b.out_before.saturating_sub(1);
        }
    }

    /// When the limit next rises with the clock alone, if it will: the
    /// start's ramp (`ramp`, which it carries to `now`), or a blind probe's
    /// calls out ceasing to count (`exempt_at`). A queue held by the limit
    /// is woken then.
    #[inline]
    pub fn rises_at(&mut self, now: Ms) -> Option<Ms> {
        let ramp = self.ramp(now);
        let b = &self.blind;
        if b.backoff_ms == 0 {
            return ramp;
        }
        let exempt_from = b.since + PROBE_BACKOFF_MAX_MS;
        let exempts = b.out_before > 0 && !self.pattern.probing && now < exempt_from;
        ramp.into_iter().chain(exempts.then_some(exempt_from)).min()
    }

    /// The calls a blind probe's one at a time goes out beside at `now`:
    /// those that were out when its pause began and are still held, once
    /// they have had the longest pause (`PROBE_BACKOFF_MAX_MS`) to come
    /// back. Sooner, a probe waits for them: sent into the window they
    /// found spent, it would most likely be refused as they were.
    fn exempt_at(&self, now: Ms) -> u32 {
        let b = &self.blind;
        if b.backoff_ms > 0 && !self.pattern.probing && now >= b.since + PROBE_BACKOFF_MAX_MS {
            b.out_before
        } else {
            0
        }
    }

    /// A refusal while a budget learned from refusals is in force, of a
    /// call of a probe of that budget (`Pattern::on_probe_refusal`): it ends
    /// the probe, and the current window goes on at the level kept.
    /// Returns whether the refusal was that.
    fn probe_refused(&mut self, lease: Reported) -> bool {
        if !self.pattern.on_probe_refusal(lease.grant_seq) {
            return false;
        }
        (self.budget_limit, self.budget_limit_seq) = (self.pattern.per_window, 0);
        // The current window goes on at the level kept.
        if let (Some(b), Some(p), Some(level)) = (&mut self.budget, &mut self.pace, self.budget_limit) {
            b.remaining = b.remaining.min(level.saturating_sub(p.granted));
            p.per_window = p.per_window.min(level);
        }
        true
    }

    /// The refused call ran with far fewer beside it than the limit allows:
    /// a pool paced to a learned budget. Its refusal says little about
    /// concurrency.
    fn far_below(&self, lease: Reported) -> bool {
        (lease.in_flight as u64 + 1) * 4 < self.effective as u64 * 3
    }

    /// A concurrency refusal: the upstream allows about the calls that ran
    /// beside the refused one: those still in flight, or those that
    /// succeeded while it was held (reported first, they are no longer in
    /// flight), whichever says more. Says whether the refusals have become
    /// pool-wide.
    fn on_refusal(&mut self, lease: Reported) -> bool {
        self.start = Start::Done;
        self.climbing = false;
        // Paced to a budget learned from refusals, a pool keeps far fewer in
        // flight than its limit, and the first refusal in a window is most
        // likely where the window ran out: it counts towards a run but cuts
        // nothing; a second one in the window does.
        let spared = self.pattern.in_force
            && !std::mem::replace(&mut self.pattern.window_refused, true)
            && self.far_below(lease);
        let beside = lease.in_flight.max(lease.oks_beside.min(self.effective));
        let level = beside + 1;
        // At most a halving per report; a spared refusal cuts nothing.
        let target = if spared { self.effective } else { beside.max(self.effective / 2).max(1) };
        if !spared && lease.epoch == self.epoch {
            // A cut: the calls beside the refused one were in flight when it
            // was refused. A refusal again also bears out the last burst's levels.
            self.confirm_burst();
            self.refused_at = if self.refused_at == 0 { level } else { self.refused_at.min(level) };
        } else if !spared {
            // A report of the burst that caused the cut: what it shows beside
            // it counts once a call of the burst succeeds (at once when its
            // own successes reported first).
            self.burst_low = if self.burst_low == 0 { level } else { self.burst_low.min(level) };
            if lease.oks_beside > 0 {
                self.confirm_burst();
            }
        }
        if lease.epoch == self.epoch {
            // A lease granted since the last cut: the refusals go on.
            if self.refusal_streak == 0 {
                self.pattern.run_restore = (self.effective, self.refused_at, self.probe_wait);
                self.pattern.run_began = level;
                self.pattern.run_low = u32::MAX;
                self.pattern.run_place = lease.grant_seq.checked_sub(self.pattern.window_seq).filter(|&p| p > 0);
            }
            self.pattern.run_low = self.pattern.run_low.min(level);
            self.refusal_streak = self.refusal_streak.saturating_add(1);
            // A new congestion window (spared: a window of leases granted
            // after this refusal, so that a run still shows as one); a
            // refused probe makes the next one wait twice as long.
            if std::mem::take(&mut self.probe_out) && !spared {
                self.probe_wait = (self.probe_wait.saturating_mul(2)).min(PROBE_WAIT_MAX);
            }
            self.epoch = self.epoch.wrapping_add(1);
            self.successes = 0;
            self.effective = self.effective.min(target);
            return self.refusal_streak >= POOL_WIDE_STREAK;
        }
        // A report of the burst that caused the cut: follow the evidence down.
        self.effective = self.effective.min(target);
        false
    }

    /// The last burst's levels are borne out: the lowest is where the
    /// upstream refused.
    fn confirm_burst(&mut self) {
        let low = std::mem::take(&mut self.burst_low);
        if low != 0 {
            self.refused_at = if self.refused_at == 0 { low } else { self.refused_at.min(low) };
        }
    }

    /// Refusals went on after a cut: the upstream refuses everything.
    /// Without a retry hint, returns the pause before one call probes it
    /// (when no upstream header told a budget).
    fn on_pool_wide_run(&mut self, hint: Option<u64>) -> Option<Ms> {
        if self.budget_limit.is_some() && !self.pattern.in_force {
            return None;
        }
        self.pattern.on_spent(hint.is_some())
    }

    /// The first success after a pool-wide run: the window opened. Once the
    /// pattern knows a window's budget and length, the pool keeps them as a
    /// budget it was told, paced from this opening.
    fn on_window_open(&mut self, lease: Reported) {
        // Refused at under half the level the run began at: a spent window,
        // not too many at once (an upstream that halves its concurrency
        // refuses above the half), so the run's cuts are undone. The level,
        // not the limit: a pool that used less than its limit (few callers)
        // was cut from a limit it never reached. A pool paced by a budget
        // learned from refusals uses less than its limit for that reason:
        // there, under half the limit.
        let (effective, refused_at, probe_wait) = self.pattern.run_restore;
        let low = self.pattern.run_low.saturating_mul(2);
        if low < self.pattern.run_began || self.pattern.in_force && low < effective {
            self.effective = self.effective.max(effective).min(self.concurrency);
            self.refused_at = refused_at;
            self.probe_wait = probe_wait;
        }
        self.pattern.on_open(lease.granted_at);
        if self.budget_limit.is_some() && !self.pattern.in_force {
            return;
        }
        let Some((per_window, window_ms)) = self.pattern.budget() else { return };
        let from = self.pattern.last_open;
        let granted = self.grants - lease.grant_seq.saturating_sub(1).min(self.grants);
        self.pattern.in_force = true;
        self.pattern.window_seq = lease.grant_seq.saturating_sub(1);
        (self.budget_limit, self.budget_limit_seq) = (Some(per_window), 0);
        self.window_ms = window_ms;
        self.budget = Some(Budget { remaining: per_window.saturating_sub(granted), reset_at: from + window_ms });
        (self.budget_not_before, self.budget_seq) = (0, 0);
        self.pace = Some(Pace { from, per_window, window_ms, granted });
    }

    fn on_success(&mut self, lease: Reported, now: Ms) {
        self.oks = self.oks.wrapping_add(1);
        // A call granted after the blind pause began got through: the
        // window opened again.
        if self.blind.backoff_ms > 0 && lease.granted_at > self.blind.since {
            self.blind = BlindProbe::default();
        }
        if self.burst_low != 0 {
            if lease.epoch == self.epoch {
                // A call granted after the cut succeeded before any of the
                // burst's did: the burst was refused whole.
                self.burst_low = 0;
            } else {
                self.confirm_burst();
            }
        }
        // Only a call granted since the last cut shows that the cut helped;
        // the calls admitted before it finishing say nothing about it.
        if lease.epoch == self.epoch {
            if self.refusal_streak >= POOL_WIDE_STREAK || self.pattern.probing {
                self.on_window_open(lease);
            }
            self.refusal_streak = 0;
        }
        self.pattern.on_success(lease.granted_at);
        let held_before = lease.in_flight + 1;
        if held_before < self.effective || self.effective >= self.concurrency {
            return;
        }
        if self.successes == 0 {
            self.successes_since = now;
        }
        self.successes += 1;
        let probing = self.refused_at != 0 && self.effective + 1 >= self.refused_at;
        let needed = if self.climbing {
            1
        } else if self.probe_out {
            // On the probed level: a refusal would come within a call
            // time; two without one say it holds.
            2 * self.effective
        } else if probing {
            let waited_long =
                self.successes >= PROBE_WAIT_MIN && now.saturating_sub(self.successes_since) >= PROBE_WAIT_MS;
            if waited_long {
                self.successes
            } else {
                self.probe_wait.max(self.effective)
            }
        } else {
            self.effective
        };
        if self.successes >= needed {
            self.successes = 0;
            if self.probe_out {
                // The probed level held: the old refusal no longer binds,
                // and how far the upstream's limit rose is unknown. Climb
                // (double per call time) until it refuses again.
                self.refused_at = 0;
                self.climbing = true;
                self.probe_wait = (self.probe_wait / 2).max(PROBE_WAIT_MIN);
            }
            self.effective = (self.effective + 1).min(self.concurrency);
            self.probe_out = self.refused_at != 0 && self.effective >= self.refused_at;
        }
    }

    /// Headers stamped at the response put one window's end at the same
    /// `now + reset` in every report; stamped at admission, each report's
    /// lands a service time later than the window's end.
    fn vote_stamp(&mut self, latest: Ms) {
        let Some(b) = self.budget else { return };
        let vote = if latest.abs_diff(b.reset_at) <= REORDER_MS { 1 } else { -1 };
        self.stamp_votes = (self.stamp_votes + vote).clamp(-STAMP_VOTES, STAMP_VOTES);
    }

    /// Grants the report's `remaining` did not count yet: the ones made
    /// after its stamp. Stamped at admission, those are the grants made
    /// after the lease's own (less the ones close enough to have reached the
    /// upstream first), and of those only the ones still in flight are sure
    /// to be upstream calls (a refused call leaves at once and may not have
    /// counted). Stamped at the response, only calls still on their way.
    fn unseen_grants(&self, lease: Reported, now: Ms) -> u64 {
        let stamped = if self.stamp_votes > 0 { now } else { lease.granted_at };
        let before = self.marks.before_first_after(stamped + REORDER_MS, self.grants).unwrap_or(lease.grant_seq);
        self.grants.saturating_sub(before.max(lease.grant_seq)).min(lease.in_flight as u64)
    }

    /// A window's budget as a report told it (no refill's guess, no pace):
    /// its end no earlier than `earliest`, told by the lease granted `seq`th.
    fn told_budget(&mut self, budget: Budget, earliest: Ms, seq: u64) {
        self.budget = Some(budget);
        (self.budget_not_before, self.budget_seq) = (earliest, seq);
        self.reset_guessed = false;
        self.pace = None;
    }

    /// Learns the request budget from `remaining` and its reset; returns the
    /// instant to wake at when it set one. A concurrency refusal's
    /// `remaining` (`refused`) was stamped before the refused calls of its
    /// burst left, and those may not count upstream: it is taken as it is,
    /// a bound the budget never exceeds, not less the grants made since.
    fn learn_budget(&mut self, rate: &RateInfo, lease: Reported, now: Ms, refused: bool) -> Option<Ms> {
        if rate.limit.is_some() || rate.remaining.is_some() {
            // The upstream says its budget: what refusals taught gives way.
            self.pattern.in_force = false;
        }
        // A limit above the one known says the upstream raised it: within
        // the window, `remaining` may then go up (by this report's count).
        // Said by a call admitted before the one that told the known limit
        // (a slow call reporting late), it is the limit before the upstream
        // lowered it: an older view, which neither raises nor replaces it.
        let mut raised = false;
        if let Some(limit) = rate.limit.filter(|&l| l > 0 && lease.grant_seq >= self.budget_limit_seq) {
            raised = self.budget_limit.is_some_and(|known| limit > known);
            self.budget_limit = Some(limit);
            self.budget_limit_seq = lease.grant_seq;
        }
        let (Some(remaining), Some(reset)) = (rate.remaining, rate.reset_ms) else {
            return None;
        };
        if reset == 0 {
            return None;
        }
        let reset = reset.min(MAX_BUDGET_WINDOW_MS);
        // The headers were stamped between the grant and now, so the window
        // resets between `earliest` and `latest`. A whole number of seconds
        // may have been rounded up by up to a second: a window ending near a
        // second's boundary reads as that second in one report and the next
        // in another, and a window's length is its whole seconds.
        let coarse = rate.reset_coarse || reset % 1000 == 0;
        let slack = if coarse { 1000 } else { 0 };
        let earliest = (lease.granted_at + reset).saturating_sub(slack);
        let latest = now + reset;
        // No window begins before the one its reports said is running ends
        // (`budget_seq`: a report told it, not a refill or the refusals): a
        // report whose window would end more than two known windows after
        // it is no next window but one report's odd reset (a client that
        // sent an instant as `resetMs`). Taken, its window would shut the
        // pool that long, and its length, as the longest reset, pace every
        // refill after it. It says nothing; an upstream whose window really
        // grew is followed once the running window ends.
        let running = self.budget.filter(|b| self.budget_seq > 0 && b.reset_at > now);
        if running.is_some_and(|b| earliest > b.reset_at + 2 * self.window_ms + slack) && self.window_ms > 0 {
            return None;
        }
        self.window_ms = self.window_ms.max(if coarse { reset / 1000 * 1000 } else { reset });
        // Whole seconds to go, from a header (`x-ratelimit-reset: 5`), may
        // have been stamped when the upstream admitted the call, as SPEC §7's
        // upstream stamps them: the window then ends that long after the
        // call reached the upstream, just after its grant, and `now + reset`
        // would end it a whole call late, the budget shut that long in every
        // window. Such seconds cannot vote (a second's rounding hides a call
        // time), so they are taken as stamped at admission until an end
        // counted so proves early. Rounded up, they put the end no earlier
        // than the grant + reset, less the way to the upstream, which the
        // margin covers. Every other reset (a date, an epoch instant, a
        // duration, a release body's `resetMs`) counts from `now`, as before.
        let from_grant = rate.reset_coarse && !rate.reset_instant && self.stamp_votes <= 0;
        let end = if from_grant { (lease.granted_at + reset + REORDER_MS).min(latest) } else { latest };
        // A window that already ended. Half a window of margin: the instant a
        // window was taken to end is an estimate, and the next window's
        // reports reset a whole window later.
        if earliest < self.ended_reset_at.saturating_add(self.window_ms / 2) && self.ended_reset_at > 0 {
            // Spent, said by a call granted after that end: no such call is a
            // late report of the window that ended, so this is the upstream's
            // newest word (its window is not the one learned: shorter, or
            // sliding), and the pool is shut until its reset. Counted from the
            // grants, the end was early: the window had not ended. The seconds
            // were stamped at the response (or the way to the upstream is
            // longer than the margin): ends count from `now` from now on.
            if remaining == 0 && lease.granted_at >= self.ended_reset_at && latest > self.ended_reset_at {
                if from_grant {
                    self.stamp_votes = STAMP_VOTES;
                }
                self.told_budget(Budget { remaining: 0, reset_at: latest }, earliest, lease.grant_seq);
                return Some(latest);
            }
            return None;
        }
        let _ = self.on_budget_reset(now);
        // A refill's end is a guess, early when the window's length was
        // learned from resets all shorter than it: a report ending nearer
        // the guessed end than the next window's is of the refilled window
        // (which ends later than guessed), and its grants since the refill
        // still count (its end, a guess, tells nothing of the stamping).
        let outlasts_guess = self.reset_guessed
            && self.budget.is_some_and(|b| earliest > b.reset_at && earliest < b.reset_at + self.window_ms / 2);
        let same_window = outlasts_guess || self.budget.is_some_and(|b| earliest <= b.reset_at);
        // A window that ends before the budget's can is another, earlier
        // one. Said by a call admitted before the newest one that said the
        // budget (a slow call reporting late), it is an older view: it never
        // moves the reset earlier, which would re-open at that reset a budget
        // the newer report closed.
        if same_window && end < self.budget_not_before && lease.grant_seq < self.budget_seq {
            return None;
        }
        // Whole seconds cannot tell a service time from a rounding; a date
        // reads the same whenever it was stamped.
        if same_window && !outlasts_guess && !coarse && !refused {
            self.vote_stamp(latest);
        }
        let left = if refused { remaining } else { remaining.saturating_sub(self.unseen_grants(lease, now)) };
        match &mut self.budget {
            Some(b) if same_window => {
                self.budget_not_before = self.budget_not_before.max(earliest);
                self.budget_seq = self.budget_seq.max(lease.grant_seq);
                // The same window: `remaining` only goes down, unless the
                // upstream raised its limit (an older report carries the old
                // one); its end is the earliest one a report put it at (the
                // refill's guess, made with a window length learned from
                // resets that were all shorter than it, may be early).
                if raised {
                    b.remaining = left;
                    if let (Some(p), Some(limit)) = (&mut self.pace, self.budget_limit) {
                        p.per_window = limit;
                    }
                } else {
                    b.remaining = b.remaining.min(left);
                }
                let guessed = std::mem::take(&mut self.reset_guessed);
                let moved = end < b.reset_at || guessed && end != b.reset_at;
                b.reset_at = if guessed { end } else { b.reset_at.min(end) };
                moved.then_some(b.reset_at)
            }
            _ => {
                // A refill's guess that this report outlasts was the same
                // window, ending later than guessed: it did not end, and its
                // later reports are not stale.
                if let Some(b) = self.budget.filter(|_| !self.reset_guessed) {
                    self.ended_reset_at = b.reset_at;
                }
                self.told_budget(Budget { remaining: left, reset_at: end }, earliest, lease.grant_seq);
                Some(end)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::governor::pattern::RATE_PROBE_GAP_MIN;

    fn concurrency_429() -> Outcome {
        Outcome { status: Some(429), throttled: 1, ..Outcome::default() }
    }

    fn ok() -> Outcome {
        Outcome { status: Some(200), ..Outcome::default() }
    }

    /// A success whose headers said the window's `limit`, `remaining` and reset.
    fn said(limit: u64, remaining: u64, reset_ms: u64) -> Outcome {
        Outcome {
            rate: RateInfo {
                limit: Some(limit),
                remaining: Some(remaining),
                reset_ms: Some(reset_ms),
                ..RateInfo::default()
            },
            ..ok()
        }
    }

    fn with_budget(o: Outcome, remaining: u64, reset_ms: u64) -> Outcome {
        Outcome { rate: RateInfo { remaining: Some(remaining), reset_ms: Some(reset_ms), ..o.rate }, ..o }
    }

    /// An adaptive pool past its start (`ramp` ran it up to `concurrency`).
    fn ramped(concurrency: u32) -> Learning {
        let mut l = Learning::new(concurrency, true);
        let _ = l.ramp(0);
        assert_eq!(l.ramp(60_000), None);
        assert_eq!(l.effective(), concurrency);
        l
    }

    /// A lease granted now, in the current epoch.
    fn grant(l: &mut Learning, now: Ms) -> (u32, Ms, u64) {
        l.on_grant(now);
        (l.epoch, now, l.grants)
    }

    fn about((epoch, granted_at, grant_seq): (u32, Ms, u64), in_flight: u32) -> Reported {
        Reported { epoch, granted_at, grant_seq, in_flight, oks_beside: 0 }
    }

    /// Cause 1: one per-request concurrency 429 with a retry hint stopped
    /// every grant of a pool whose other calls were succeeding.
    #[test]
    fn one_concurrency_refusal_does_not_pause_the_pool() {
        let mut l = ramped(64);
        let leases: Vec<_> = (0..5).map(|_| grant(&mut l, 0)).collect();
        let hinted =
            Outcome { rate: RateInfo { retry_after_ms: Some(1000), ..RateInfo::default() }, ..concurrency_429() };
        let w = l.on_report(&hinted, about(leases[0], 4), 10);
        assert_eq!(w.cooldown_until, None);
        assert_eq!(l.pause(10), None);
        assert!(l.effective() > 4, "one refusal with 4 calls in flight does not close the pool");
    }

    /// A pool paced to a budget learned from refusals keeps far fewer in
    /// flight than its limit: the first refusal in a window is where the
    /// window ran out and cuts nothing; a second one in it does, as does one
    /// with the pool at its limit.
    #[test]
    fn a_paced_pools_first_refusal_in_a_window_cuts_nothing() {
        let mut l = ramped(20);
        l.pattern = Pattern { per_window: Some(60), in_force: true, ..Pattern::default() };
        let a = grant(&mut l, 0);
        let b = grant(&mut l, 1);
        l.on_report(&concurrency_429(), about(a, 5), 10);
        assert_eq!(l.effective(), 20);
        l.on_report(&concurrency_429(), about(b, 5), 11);
        assert_eq!(l.effective(), 10, "a second refusal in the window cuts");
        l.pattern.window_refused = false;
        let c = grant(&mut l, 20);
        l.on_report(&concurrency_429(), about(c, 9), 21);
        assert_eq!(l.effective(), 9, "at its limit, the refusal is about concurrency");
    }

    /// A probe's refused call ends the probe and cuts nothing; the current
    /// window goes on at the level kept.
    #[test]
    fn a_refused_probe_of_a_learned_budget_cuts_nothing() {
        let mut l = ramped(20);
        l.pattern = Pattern { per_window: Some(60), in_force: true, ..Pattern::default() };
        l.budget_limit = Some(60);
        l.window_ms = 6000;
        l.budget = Some(Budget { remaining: 0, reset_at: 6000 });
        // The window ending at 6 s was used whole; three more like it.
        let mut now = 6000;
        for _ in 1..RATE_PROBE_GAP_MIN {
            let _ = l.on_budget_reset(now);
            for _ in 0..60 {
                let _ = grant(&mut l, now);
            }
            now += 6000;
        }
        let _ = l.on_budget_reset(now);
        assert_eq!((l.budget_limit, l.budget.unwrap().remaining), (Some(61), 61), "a probe");
        let lease = grant(&mut l, now);
        l.on_report(&concurrency_429(), about(lease, 3), now + 5);
        assert_eq!(l.effective(), 20);
        assert_eq!((l.budget_limit, l.budget.unwrap().remaining, l.pace.unwrap().per_window), (Some(60), 59, 60));
    }

    /// Refusals that go on after the cut, with no success between, are
    /// pool-wide: then the retry hint pauses every grant.
    #[test]
    fn refusals_that_go_on_after_a_cut_pause_the_pool() {
        let mut l = Learning::new(8, true);
        let hinted =
            Outcome { rate: RateInfo { retry_after_ms: Some(1000), ..RateInfo::default() }, ..concurrency_429() };
        for i in 0..POOL_WIDE_STREAK {
            let lease = grant(&mut l, i as Ms);
            let w = l.on_report(&hinted, about(lease, 0), i as Ms);
            assert_eq!(w.cooldown_until.is_some(), i + 1 == POOL_WIDE_STREAK, "refusal {i}");
        }
        assert!(matches!(l.pause(POOL_WIDE_STREAK as Ms), Some(Pause::Cooldown(_))));
    }

    /// Cause 2: a late report from a call admitted earlier re-opened a budget
    /// that a newer report had closed.
    #[test]
    fn a_stale_report_never_reopens_a_closed_budget() {
        let mut l = Learning::new(20, true);
        let b = grant(&mut l, 0);
        let a = grant(&mut l, 100);
        l.on_report(&with_budget(ok(), 0, 5000), about(a, 1), 200);
        assert!(matches!(l.pause(200), Some(Pause::Budget(_))));
        l.on_report(&with_budget(ok(), 12, 5000), about(b, 0), 900);
        assert_eq!(l.budget().unwrap().remaining, 0);
        assert!(matches!(l.pause(900), Some(Pause::Budget(_))), "still closed inside the window");
        // A report of a later window replaces the budget.
        let c = grant(&mut l, 5300);
        l.on_report(&with_budget(ok(), 40, 5700), about(c, 0), 5400);
        assert_eq!(l.budget().unwrap().remaining, 40);
        assert_eq!(l.pause(5400), None);
        // A late report of the window that ended is ignored.
        l.on_report(&with_budget(ok(), 0, 1000), about(b, 0), 5500);
        assert_eq!(l.budget().unwrap().remaining, 40);
    }

    /// The same in whole seconds, stamped at admission: the older call's
    /// window ends at its grant + reset, a window before the one the newer
    /// refusal closed (its `now + reset` would put it in that window).
    #[test]
    fn an_older_report_in_whole_seconds_does_not_reopen_a_budget_a_newer_refusal_closed() {
        let coarse = |o: Outcome, remaining: u64| Outcome {
            rate: RateInfo { limit: Some(60), reset_coarse: true, ..with_budget(o, remaining, 3000).rate },
            ..o
        };
        let mut l = ramped(20);
        let older = grant(&mut l, 0);
        let newer = grant(&mut l, 3200);
        l.on_report(&coarse(concurrency_429(), 0), about(newer, 1), 3210);
        assert!(matches!(l.pause(3210), Some(Pause::Budget(_))));
        l.on_report(&coarse(ok(), 59), about(older, 0), 3400);
        assert!(matches!(l.pause(3400), Some(Pause::Budget(_))), "still closed: {:?}", l.budget());
        assert_eq!(l.budget().map(|b| b.remaining), Some(0));
    }

    /// A restored token block is not lifted by a lease re-adopted after the
    /// restart (counted as granted at the restore, but of unknown age); a
    /// call granted after the restore is a newer view.
    #[test]
    fn a_restored_token_block_is_lifted_by_a_new_call_not_by_a_readopted_one() {
        let tokens = |left: u64| Outcome {
            rate: RateInfo { token_remaining: Some(left), token_reset_ms: Some(3_600_000), ..RateInfo::default() },
            ..ok()
        };
        let mut l = ramped(8);
        let (blocking, _) = (grant(&mut l, 0), grant(&mut l, 0));
        l.on_report(&tokens(0), about(blocking, 1), 10);
        let mut l = l.bounded(20, 8, true);
        let readopted = (l.epoch, 20, l.grants);
        l.on_report(&tokens(500), about(readopted, 0), 30);
        assert!(matches!(l.pause(40), Some(Pause::Budget(_))), "still blocked");
        let newer = grant(&mut l, 50);
        l.on_report(&tokens(500), about(newer, 0), 60);
        assert_eq!(l.pause(70), None);
    }

    /// A late report of a call admitted earlier, whose window ends before
    /// the closed budget's can, is an older view: it does not move the reset
    /// earlier, where the budget would re-open.
    #[test]
    fn an_older_report_of_an_earlier_reset_does_not_reopen_a_closed_budget() {
        let mut l = Learning::new(8, true);
        let older = grant(&mut l, 0);
        let newer = grant(&mut l, 200);
        let spent = Outcome { rate: RateInfo { limit: Some(10), ..with_budget(ok(), 0, 5000).rate }, ..ok() };
        l.on_report(&spent, about(newer, 1), 250);
        assert_eq!(l.budget(), Some(Budget { remaining: 0, reset_at: 5250 }));
        for remaining in [5, 0] {
            l.on_report(&with_budget(ok(), remaining, 1000), about(older, 0), 550);
            assert_eq!(l.budget(), Some(Budget { remaining: 0, reset_at: 5250 }), "remaining {remaining}");
        }
        assert_eq!(l.on_budget_reset(1550), None, "nothing ends before the newer report's reset");
        assert!(matches!(l.pause(2000), Some(Pause::Budget(_))), "still closed");
        // A call admitted after the one that closed it is newer word.
        let newest = grant(&mut l, 5300);
        l.on_report(&with_budget(ok(), 7, 5000), about(newest, 0), 5400);
        assert_eq!(l.budget().unwrap().remaining, 7);
    }

    /// One report whose reset is an hour away, in the middle of a minute
    /// window its reports told, is no next window: taken, it shut the pool
    /// for the hour, the newer reports of the minute ignored as of a window
    /// that ended, and, as the longest reset, paced every refill after it
    /// to the limit per hour. It is set aside; the minute goes on.
    #[test]
    fn one_reports_far_reset_inside_a_running_window_is_set_aside() {
        let mut l = Learning::new(8, true);
        let first = grant(&mut l, 0);
        l.on_report(&said(60, 59, 60_000), about(first, 0), 0);
        let odd = grant(&mut l, 1_000);
        l.on_report(&said(60, 58, 3_600_000), about(odd, 0), 1_000);
        assert_eq!(l.budget().unwrap().reset_at, 60_000, "the minute's window still runs");
        assert_eq!(l.window_ms, 60_000);
        let newer = grant(&mut l, 2_000);
        l.on_report(&said(60, 0, 58_000), about(newer, 0), 2_000);
        assert_eq!(l.budget(), Some(Budget { remaining: 0, reset_at: 60_000 }));
        assert_eq!(l.on_budget_reset(60_000), Some(120_000), "refilled for a minute, not an hour");
    }

    /// A refill's guess of the next window's end is early when the window's
    /// length was learned from resets that were all shorter than it. The
    /// first report of the refilled window then ends later than guessed: it
    /// is the same window, whose grants since the refill still count, even
    /// those made in the refill's millisecond (taken to have reached the
    /// upstream first, which the report's `remaining` says they did not).
    #[test]
    fn a_refilled_window_that_ends_later_than_guessed_keeps_its_grants() {
        let mut l = ramped(10);
        let spent = Outcome { rate: RateInfo { limit: Some(30), ..with_budget(ok(), 0, 4500).rate }, ..ok() };
        let a = grant(&mut l, 1000);
        l.on_report(&spent, about(a, 0), 1500);
        assert_eq!(l.budget(), Some(Budget { remaining: 0, reset_at: 6000 }));
        // Held past the end (a cool-down), then a burst at the refill.
        let first = grant(&mut l, 6100);
        for _ in 0..4 {
            grant(&mut l, 6100);
        }
        assert_eq!(l.budget(), Some(Budget { remaining: 25, reset_at: 10_500 }), "refilled on a guess");
        // Stamped at admission, the first of the burst: 29 left until 12 000.
        l.on_report(&with_budget(ok(), 29, 5900), about(first, 4), 6600);
        assert_eq!(l.budget().map(|b| b.remaining), Some(25), "{:?}", l.budget());
        assert_eq!(l.budget().map(|b| b.reset_at), Some(12_500));
    }

    /// A concurrency refusal's `remaining` is a bound the budget never
    /// exceeds: the upstream said so few are left, whatever refused the call.
    #[test]
    fn a_refusal_that_shows_fewer_left_lowers_the_budget() {
        let mut l = Learning::new(8, true);
        let [a, b, _, _] = [0, 100, 200, 300].map(|at| grant(&mut l, at));
        l.on_report(&with_budget(ok(), 10, 10_000), about(a, 3), 350);
        assert_eq!(l.budget().unwrap().remaining, 7, "less the three calls still in flight");
        // Refused with two calls still in flight: its `remaining` as it is,
        // not less those (refused, they might not count upstream).
        let refused = with_budget(concurrency_429(), 5, 9_800);
        assert_eq!(refused.evidence(), Evidence::Concurrency);
        l.on_report(&refused, about(b, 2), 360);
        assert_eq!(l.budget().unwrap().remaining, 5);
        // With no budget yet, a refusal that shows one sets it.
        let mut fresh = Learning::new(8, true);
        let c = grant(&mut fresh, 0);
        fresh.on_report(&with_budget(concurrency_429(), 5, 3000), about(c, 0), 50);
        assert_eq!(fresh.budget(), Some(Budget { remaining: 5, reset_at: 3050 }));
    }

    /// The refill guessed the next window's end early (one window after the
    /// last, of the longest reset seen): the first report of that window puts
    /// its end later, and the window's later reports still count (a smaller
    /// `remaining`, say from other callers of the upstream, closes it), not
    /// dropped as reports of a window that ended at the guess.
    #[test]
    fn a_window_that_outlasts_the_refills_guess_still_learns_from_its_reports() {
        let mut l = Learning::new(20, true);
        let report = |remaining, reset| Outcome {
            rate: RateInfo {
                limit: Some(60),
                remaining: Some(remaining),
                reset_ms: Some(reset),
                ..RateInfo::default()
            },
            ..ok()
        };
        // Window 1 ends at 6 000; its longest reset seen is 5 950.
        let a = grant(&mut l, 40);
        l.on_report(&report(50, 5950), about(a, 0), 50);
        // The first grant of window 2 refills it, guessing its end at 11 950.
        let b = grant(&mut l, 6100);
        assert_eq!(l.budget(), Some(Budget { remaining: 59, reset_at: 11_950 }));
        // Its first report says 12 000, then the upstream says 20 are left.
        l.on_report(&report(55, 5895), about(b, 0), 6105);
        assert_eq!(l.budget(), Some(Budget { remaining: 55, reset_at: 12_000 }));
        let c = grant(&mut l, 6300);
        l.on_report(&report(20, 5690), about(c, 0), 6310);
        assert_eq!(l.budget(), Some(Budget { remaining: 20, reset_at: 12_000 }));
        // Window 1's late reports are still stale.
        l.on_report(&report(59, 100), about(a, 0), 6400);
        assert_eq!(l.budget().unwrap().remaining, 20);
    }

    /// Whole seconds to go, as a header says them (`x-ratelimit-reset: 5`).
    fn seconds_to_go(limit: u64, remaining: u64, reset_ms: u64) -> Outcome {
        let o = said(limit, remaining, reset_ms);
        Outcome { rate: RateInfo { reset_coarse: true, ..o.rate }, ..o }
    }

    /// Seconds to go, stamped when the upstream admitted the call: the
    /// window ends that long after the call reached it, just after its
    /// grant, not after its report (a whole call later, every window).
    #[test]
    fn seconds_to_go_count_from_the_grant() {
        let mut l = Learning::new(20, true);
        // The window ends at 6 000. Admitted at 1 000: 5 s to go (rounded
        // up from 5 000); reported when its 1 s call ended.
        let first = grant(&mut l, 1000);
        l.on_report(&seconds_to_go(60, 40, 5000), about(first, 0), 2000);
        assert_eq!(l.budget(), Some(Budget { remaining: 40, reset_at: 6000 + REORDER_MS }));
        // Admitted at 1 300, 4.7 s to go read as 5: no later end.
        let second = grant(&mut l, 1300);
        l.on_report(&seconds_to_go(60, 30, 5000), about(second, 0), 2300);
        assert_eq!(l.budget().unwrap().reset_at, 6000 + REORDER_MS);
        // A date is the instant itself, whenever it was stamped; a duration
        // votes on its stamping, and a release body's `resetMs` is taken as
        // it is: each counts from the report, as before.
        for rate in [
            RateInfo { reset_instant: true, ..seconds_to_go(60, 40, 4000).rate },
            said(60, 40, 4000).rate,
            RateInfo { reset_ms: Some(4010), ..said(60, 40, 4000).rate },
        ] {
            let mut l = Learning::new(20, true);
            let lease = grant(&mut l, 1000);
            l.on_report(&Outcome { rate, ..ok() }, about(lease, 0), 2000);
            assert_eq!(l.budget().unwrap().reset_at, 2000 + rate.reset_ms.unwrap(), "{rate:?}");
        }
    }

    /// Millisecond resets vote on their stamping, but the votes never move
    /// a window's end: the first report of a refilled window (compared with
    /// the window before), and releases made a varying time after the
    /// upstream's answer (a client that streams the body first), would lean
    /// them to admission when the upstream stamped at the response.
    #[test]
    fn votes_never_move_a_windows_end_earlier_than_the_reports_say() {
        let mut l = Learning::new(20, true);
        let a = grant(&mut l, 0);
        l.on_report(&said(10, 9, 5990), about(a, 0), 10);
        let c = grant(&mut l, 6100);
        l.on_report(&said(10, 8, 4900), about(c, 0), 7100);
        assert!(l.budget().unwrap().reset_at >= 12_000, "{:?}", l.budget());
        let mut l = Learning::new(20, true);
        for i in 0..10u64 {
            let granted = i * 100;
            let lease = grant(&mut l, granted);
            let stamped = granted + 500;
            let released = stamped + (i % 3) * 300;
            l.on_report(&said(100, 90 - i, 6000 - stamped + 7), about(lease, 0), released);
        }
        assert!(l.stamp_votes < 0, "the votes lean to admission");
        assert!(l.budget().unwrap().reset_at >= 6007, "{:?}", l.budget());
    }

    /// Stamped at the response instead, seconds to go counted from the
    /// grant end the window a call early: the first call refused for the
    /// window taken to have ended says so, the window is shut again until
    /// its real end, and ends are counted from the reports after that.
    #[test]
    fn a_window_reopened_early_is_shut_again_and_its_ends_turn_to_the_reports() {
        let mut l = Learning::new(20, true);
        // The window ends at 60 000; answered at 4 000 with 56 s to go.
        let first = grant(&mut l, 1000);
        l.on_report(&seconds_to_go(600, 0, 56_000), about(first, 0), 4000);
        assert_eq!(l.budget().unwrap().reset_at, 57_000 + REORDER_MS, "counted from the grant: early");
        // Refilled at that end; the next call is refused: the old window still runs.
        assert!(l.on_budget_reset(57_050).is_some());
        let early = grant(&mut l, 57_050);
        let refused = Outcome { status: Some(429), throttled: 1, ..seconds_to_go(600, 0, 3000) };
        l.on_report(&refused, about(early, 0), 57_060);
        assert_eq!(l.stamp_votes, STAMP_VOTES);
        assert_eq!(l.budget(), Some(Budget { remaining: 0, reset_at: 60_060 }), "shut until its end");
        assert!(l.pause(57_100).is_some(), "no more grants into the spent window");
        // The next window's reports put its end at `now + reset`.
        let next = grant(&mut l, 60_100);
        l.on_report(&seconds_to_go(600, 500, 60_000), about(next, 0), 61_000);
        assert_eq!(l.budget().unwrap().reset_at, 121_000);
    }

    /// A call granted after a window's end, refused with nothing left and a
    /// reset sooner than the next window's end: no late report of the window
    /// that ended, but the upstream's newest word. The pool is shut until its
    /// reset, not left granting the refilled window's budget into refusals.
    #[test]
    fn a_spent_window_said_by_a_call_granted_after_the_end_shuts_the_pool() {
        for reset_ms in [1000, 1200] {
            let mut l = ramped(8);
            let first = grant(&mut l, 0);
            l.on_report(&said(10, 0, 3000), about(first, 0), 10);
            assert_eq!(l.budget(), Some(Budget { remaining: 0, reset_at: 3010 }));
            // Refilled at that end; a call of the new window is refused.
            let next = grant(&mut l, 3200);
            let refused = Outcome {
                rate: RateInfo { remaining: Some(0), reset_ms: Some(reset_ms), ..RateInfo::default() },
                ..concurrency_429()
            };
            l.on_report(&refused, about(next, 0), 3210);
            let end = 3210 + reset_ms;
            assert_eq!(l.budget(), Some(Budget { remaining: 0, reset_at: end }), "reset {reset_ms}");
            assert_eq!(l.pause(end - 100), Some(Pause::Budget(100)), "no grant before its reset");
            assert_eq!(l.pause(end), None);
        }
        // A late report of the window that ended, by a call granted before
        // its end, is still ignored.
        let mut l = ramped(8);
        let (first, slow) = (grant(&mut l, 0), grant(&mut l, 0));
        l.on_report(&said(10, 0, 3000), about(first, 1), 10);
        let _ = l.on_budget_reset(3200);
        let stale = Outcome {
            rate: RateInfo { remaining: Some(0), reset_ms: Some(1000), ..RateInfo::default() },
            ..concurrency_429()
        };
        l.on_report(&stale, about(slow, 0), 3210);
        assert_eq!(l.budget().map(|b| (b.remaining, b.reset_at)), Some((10, 6010)));
    }

    /// A refilled window whose reports end it sooner than its pace would
    /// have granted again: at that end the next window starts as any does,
    /// with one grant at once, not held back by the old window's pace (what
    /// the metrics and the dashboard already showed).
    #[test]
    fn the_pace_of_a_window_that_ended_holds_no_grant_back() {
        let mut l = ramped(8);
        let first = grant(&mut l, 0);
        l.on_report(&said(10, 0, 10_000), about(first, 0), 0);
        // Refilled at 10 000: one at once, then one a second.
        let mut last = grant(&mut l, 10_000);
        for at in (11_000..=15_000).step_by(1000) {
            assert_eq!(l.pause(at), None, "paced grant at {at}");
            last = grant(&mut l, at);
        }
        assert_eq!(l.pause(15_100), Some(Pause::Budget(900)), "paced");
        // Spent, says a report of the window: it ends at 15 400.
        let spent = Outcome {
            rate: RateInfo { remaining: Some(0), reset_ms: Some(300), ..RateInfo::default() },
            ..concurrency_429()
        };
        l.on_report(&spent, about(last, 0), 15_100);
        assert_eq!(l.budget(), Some(Budget { remaining: 0, reset_at: 15_400 }));
        assert!(l.pause(15_399).is_some(), "shut inside the window");
        assert_eq!(l.pause(15_500), None, "a new window: one grant at once");
        assert_eq!(l.budget_at(15_500).1.map(|p| p.next_at()), Some(15_400), "as the readers show it");
        let _ = grant(&mut l, 15_500);
        assert!(l.pause(15_600).is_some(), "then paced again");
    }

    /// A reset given as a date in whole seconds: a window ending on a
    /// second's boundary reads as that second in one report and the next in
    /// another. The later date is the same window, not a new one that would
    /// re-open the budget.
    #[test]
    fn reset_dates_a_second_apart_are_one_window() {
        let mut l = Learning::new(20, true);
        let coarse = |remaining, reset_ms| Outcome {
            rate: RateInfo {
                limit: Some(60),
                remaining: Some(remaining),
                reset_ms: Some(reset_ms),
                reset_coarse: true,
                reset_instant: true,
                ..RateInfo::default()
            },
            ..ok()
        };
        let first = grant(&mut l, 0);
        // The window ends at 6 000: its date reads 6 000 here...
        l.on_report(&coarse(4, 5700), about(first, 0), 300);
        assert_eq!(l.budget(), Some(Budget { remaining: 4, reset_at: 6000 }));
        // ...and 7 000 in a report of a call admitted a little later.
        let second = grant(&mut l, 1200);
        l.on_report(&coarse(12, 5444), about(second, 0), 1556);
        assert_eq!(l.budget(), Some(Budget { remaining: 3, reset_at: 6000 }), "not re-opened");
        // The window's length is its whole seconds (5 700 reads as 5 s).
        assert_eq!(l.window_ms, 5000);
    }

    /// Grants made after the reported lease's grant are not in its `remaining`.
    #[test]
    fn grants_after_the_reported_one_are_counted() {
        let mut l = Learning::new(10, true);
        let first = grant(&mut l, 0);
        // Granted with it: either may have reached the upstream first.
        grant(&mut l, REORDER_MS);
        grant(&mut l, REORDER_MS + 10);
        grant(&mut l, REORDER_MS + 20);
        l.on_report(&with_budget(ok(), 5, 700), about(first, 3), 100);
        assert_eq!(l.budget().unwrap().remaining, 3);
        grant(&mut l, 100);
        grant(&mut l, 100);
        grant(&mut l, 100);
        assert_eq!(l.pause(100), Some(Pause::Budget(700)));
        assert!(l.pause(799).is_some());
        assert_eq!(l.pause(800), None);
        let _ = l.on_budget_reset(800);
        assert_eq!(l.budget(), None, "no known limit: lifted at the reset");
    }

    #[test]
    fn a_known_limit_refills_the_next_window() {
        let mut l = Learning::new(10, true);
        let lease = grant(&mut l, 0);
        let report = Outcome {
            rate: RateInfo { limit: Some(6), remaining: Some(0), reset_ms: Some(600), ..RateInfo::default() },
            ..ok()
        };
        l.on_report(&report, about(lease, 0), 0);
        assert!(l.pause(0).is_some());
        assert_eq!(l.on_budget_reset(600), Some(1200));
        assert_eq!(l.budget(), Some(Budget { remaining: 6, reset_at: 1200 }));
        // A late report of the window that ended, whose reset lands just after
        // the instant it was taken to end, does not close the new window.
        let late = grant(&mut l, 5);
        let old = Outcome { rate: RateInfo { remaining: Some(0), reset_ms: Some(605), ..RateInfo::default() }, ..ok() };
        l.on_report(&old, about(late, 0), 700);
        assert_eq!(l.budget().unwrap().remaining, 5);
    }

    /// The upstream raises its limit from 6 to 12 a window in the middle of
    /// one the pool refilled with 6: its reports say so, and the window's
    /// budget and pace follow at once instead of at the next refill. An
    /// older report of the window, with the old limit, does not re-open
    /// what a newer one closed.
    #[test]
    fn a_limit_raised_within_a_window_applies_to_that_window() {
        let mut l = Learning::new(10, true);
        let lease = grant(&mut l, 0);
        l.on_report(&said(6, 0, 600), about(lease, 0), 0);
        assert_eq!(l.on_budget_reset(600), Some(1200));
        let (old, new) = (grant(&mut l, 610), grant(&mut l, 620));
        assert_eq!(l.budget().unwrap().remaining, 4);
        // Two grants of this window counted: 10 left of 12.
        l.on_report(&said(12, 10, 580), about(new, 0), 630);
        assert_eq!(l.budget().unwrap().remaining, 10);
        assert_eq!(l.pace.unwrap().per_window, 12);
        // The older report, stamped before the raise, keeps its window as it is.
        l.on_report(&said(6, 5, 590), about(old, 0), 640);
        assert_eq!(l.budget().unwrap().remaining, 5, "remaining only goes down without a raise");
        assert_eq!(l.budget().unwrap().reset_at, 1210, "the end the first report put it at");
    }

    /// The upstream lowers its limit from 60 to 30 in the middle of a
    /// window. The newer call's report (30, none left) closes the budget;
    /// the older call's, reporting late with the old limit (60, 25 left), is
    /// not taken for a raise: it neither re-opens the window nor refills the
    /// next one to 60.
    #[test]
    fn an_older_report_of_a_higher_limit_is_not_a_raise() {
        let mut l = Learning::new(10, true);
        let (older, newer) = (grant(&mut l, 0), grant(&mut l, 20));
        l.on_report(&said(30, 0, 10_000), about(newer, 1), 100);
        assert_eq!(l.budget().unwrap().remaining, 0);
        l.on_report(&said(60, 25, 9_990), about(older, 0), 110);
        assert_eq!(l.budget().unwrap().remaining, 0, "an older, larger remaining re-opened the budget");
        assert_eq!(l.budget_limit, Some(30));
        assert_eq!(l.on_budget_reset(10_100), Some(20_100));
        assert_eq!(l.budget().unwrap().remaining, 30, "the next window refills to the newer limit");
        // A newer call's report of a higher limit is a raise.
        let newest = grant(&mut l, 10_200);
        l.on_report(&said(60, 50, 9_900), about(newest, 0), 10_250);
        assert_eq!((l.budget_limit, l.budget().unwrap().remaining), (Some(60), 50));
    }

    /// A 429 whose headers say when a window resets but not what is left
    /// (`x-ratelimit-reset-requests` and `retry-after`, as Groq sends) is a
    /// rate refusal: it keeps the limit and pauses for its hint. One that
    /// shows something left is a concurrency refusal.
    #[test]
    fn a_refusal_with_a_reset_and_nothing_left_said_is_a_rate_refusal() {
        let reset_only = |retry_after_ms| Outcome {
            rate: RateInfo { reset_ms: Some(179_560), retry_after_ms, ..RateInfo::default() },
            ..concurrency_429()
        };
        assert_eq!(reset_only(Some(2_000)).evidence(), Evidence::Rate);
        let tokens = Outcome {
            rate: RateInfo { token_reset_ms: Some(6_000), retry_after_ms: Some(1_000), ..RateInfo::default() },
            ..concurrency_429()
        };
        assert_eq!(tokens.evidence(), Evidence::Rate);
        assert_eq!(reset_only(None).evidence(), Evidence::Concurrency, "without a hint: judged by its run");
        let left = Outcome { rate: RateInfo { remaining: Some(3), ..reset_only(None).rate }, ..concurrency_429() };
        assert_eq!(left.evidence(), Evidence::Concurrency);
        assert_eq!(concurrency_429().evidence(), Evidence::Concurrency);
        let mut l = ramped(8);
        let leases: Vec<_> = (0..8).map(|_| grant(&mut l, 0)).collect();
        for (i, lease) in leases.iter().take(4).enumerate() {
            let wake = l.on_report(&reset_only(Some(2_000)), about(*lease, 7 - i as u32), 10);
            assert_eq!(wake.cooldown_until, (i == 0).then_some(2_010));
        }
        assert_eq!(l.effective(), 8, "a rate refusal never cuts the limit");
        assert_eq!(l.pause(100), Some(Pause::Cooldown(1_910)));
    }

    /// A refusal that says when its window resets and nothing of what is
    /// left, with no retry hint, paused nothing: every call went on into the
    /// spent window. Without a hint it may as well be too many at once
    /// (an upstream that sends the reset on every answer): it cuts, and once
    /// the refusals go on after the cut, the pool waits for that reset; of a
    /// request and a token window said so, the sooner one's.
    #[test]
    fn a_silent_reset_without_a_hint_cuts_and_a_run_of_them_waits_for_it() {
        let silent = |rate| Outcome { rate, ..concurrency_429() };
        let cases = [
            (RateInfo { reset_ms: Some(2_000), ..RateInfo::default() }, 2_000),
            (RateInfo { reset_ms: Some(179_560), token_reset_ms: Some(7_660), ..RateInfo::default() }, 7_660),
        ];
        for (rate, wait) in cases {
            assert_eq!(silent(rate).evidence(), Evidence::Concurrency);
            let mut l = ramped(8);
            for i in 0..POOL_WIDE_STREAK {
                let lease = grant(&mut l, i as Ms);
                let w = l.on_report(&silent(rate), about(lease, 0), 10 + i as Ms);
                let pool_wide = i + 1 == POOL_WIDE_STREAK;
                assert_eq!(w.cooldown_until, pool_wide.then_some(10 + i as Ms + wait), "refusal {i}");
            }
            assert!(l.effective() < 8, "cut as too many at once first");
        }
    }

    /// A rate refusal with `remaining: 0` and no reset (or one already past)
    /// and no retry hint: nothing said when the window ends, so the pool
    /// let every call through into it. It now pauses 250 ms, then one call
    /// at a time probes; a refused probe doubles the pause (to 1 s), and the
    /// first call that gets through restores the limit. The refusals of the
    /// calls already out when the pause began change nothing.
    #[test]
    fn a_rate_refusal_that_says_no_end_probes_one_call_at_a_time() {
        for reset_ms in [None, Some(0)] {
            let spent = Outcome {
                rate: RateInfo { limit: Some(60), remaining: Some(0), reset_ms, ..RateInfo::default() },
                ..concurrency_429()
            };
            assert_eq!(spent.evidence(), Evidence::Rate);
            let mut l = ramped(8);
            let burst: Vec<_> = (0..8).map(|_| grant(&mut l, 0)).collect();
            l.on_lease_left(burst[0].1, 10);
            let wake = l.on_report(&spent, about(burst[0], 7), 10);
            assert_eq!(wake.cooldown_until, Some(10 + PROBE_BACKOFF_MIN_MS));
            assert_eq!(l.effective_at(10 + PROBE_BACKOFF_MAX_MS), 1 + 7, "in time, beside the 7 still out");
            assert_eq!(l.effective_at(20), 1, "one call at a time probes");
            for (i, lease) in burst.iter().enumerate().skip(1) {
                l.on_lease_left(lease.1, 20);
                let wake = l.on_report(&spent, about(*lease, 7 - i as u32), 20);
                assert_eq!(wake.cooldown_until, None, "the same spent window, already paused");
            }
            assert_eq!(l.effective(), 1, "one call at a time probes");
            let mut at = 10 + PROBE_BACKOFF_MIN_MS;
            for pause in [500, 1_000, 1_000] {
                assert_eq!(l.pause(at), None);
                let probe = grant(&mut l, at);
                at += 30;
                assert_eq!(l.on_report(&spent, about(probe, 0), at).cooldown_until, Some(at + pause));
                at += pause;
            }
            let probe = grant(&mut l, at);
            l.on_report(&ok(), about(probe, 0), at + 30);
            assert_eq!((l.effective(), l.pause(at + 30)), (8, None), "the window opened: the limit is back");
        }
    }

    fn blind_429() -> Outcome {
        Outcome { rate: RateInfo { remaining: Some(0), ..RateInfo::default() }, ..concurrency_429() }
    }

    /// A blind refusal of an old call while a pool-wide run is probed; the
    /// run's probe (granted before that refusal) gets through. The blind
    /// probe goes on: the next call granted after its pause is its probe,
    /// and the limit is one until that one gets through.
    #[test]
    fn a_blind_probe_begun_while_a_run_is_probed_still_holds_the_limit_until_its_own_probe_answers() {
        let mut l = ramped(8);
        let early = grant(&mut l, 0);
        for i in 0..POOL_WIDE_STREAK {
            let lease = grant(&mut l, 1 + i as Ms);
            l.on_report(&concurrency_429(), about(lease, if i == 0 { 7 } else { 0 }), 10 + i as Ms);
        }
        assert_eq!(l.effective(), 1, "the run probes");
        let run_probe = grant(&mut l, 300);
        l.on_lease_left(early.1, 310);
        l.on_report(&blind_429(), about(early, 1), 310);
        l.on_lease_left(run_probe.1, 320);
        l.on_report(&ok(), about(run_probe, 0), 320);
        assert!(!l.pattern.probing, "the run's window opened");
        assert_eq!(l.effective(), 1, "the blind probe goes on");
        let probe = grant(&mut l, 600);
        l.on_report(&ok(), about(probe, 0), 610);
        assert_eq!((l.effective(), l.blind), (8, BlindProbe::default()));
    }

    /// A blind refusal in the middle of a concurrency run changes nothing of
    /// how the run ends: its window opening undoes its cuts and its pause.
    #[test]
    fn a_blind_refusal_does_not_hide_the_end_of_a_pool_wide_run() {
        let run = |blind: bool| {
            let mut l = ramped(8);
            let burst: Vec<_> = (0..8).map(|_| grant(&mut l, 0)).collect();
            l.on_report(&concurrency_429(), about(burst[0], 7), 5);
            let q1 = grant(&mut l, 6);
            l.on_report(&concurrency_429(), about(q1, 6), 7);
            if blind {
                l.on_report(&blind_429(), about(burst[1], 6), 8);
            }
            let q2 = grant(&mut l, 300);
            l.on_report(&concurrency_429(), about(q2, 0), 301);
            assert_eq!(l.effective(), 1, "pool-wide: one call at a time");
            let q3 = grant(&mut l, 1_000);
            l.on_report(&ok(), about(q3, 0), 1_010);
            (l.effective(), l.pattern.backoff_ms, l.pattern.probing, l.blind)
        };
        let without = run(false);
        assert_eq!(without.0, 8, "the run was a spent window: its cuts are undone");
        assert_eq!(run(true), without, "the same run, with a blind refusal in the middle");
    }

    /// A call granted in the millisecond a blind pause began was out in the
    /// spent window already: its refusal does not double the pause.
    #[test]
    fn a_call_granted_in_the_blind_refusals_millisecond_is_not_its_probe() {
        let mut l = ramped(8);
        let a = grant(&mut l, 10);
        let b = grant(&mut l, 10);
        l.on_report(&blind_429(), about(a, 1), 10);
        let w = l.on_report(&blind_429(), about(b, 0), 11);
        assert_eq!(w.cooldown_until, None, "b was out when the pause began");
    }

    /// Cause 3: a rate 429 (`remaining: 0`) also cut the concurrency limit.
    #[test]
    fn a_rate_refusal_teaches_the_budget_and_keeps_the_limit() {
        let mut l = ramped(20);
        let lease = grant(&mut l, 0);
        let refused = Outcome {
            rate: RateInfo {
                remaining: Some(0),
                reset_ms: Some(3000),
                retry_after_ms: Some(3000),
                ..RateInfo::default()
            },
            ..concurrency_429()
        };
        assert_eq!(refused.evidence(), Evidence::Rate);
        let w = l.on_report(&refused, about(lease, 19), 0);
        assert_eq!(l.effective(), 20);
        assert_eq!(w.cooldown_until, Some(3000), "a spent budget is pool-wide");
        assert!(l.pause(10).is_some());
    }

    /// Cause 4: a burst where 44 of 64 calls were refused cut only to 57.
    #[test]
    fn a_burst_of_refusals_cuts_to_the_calls_that_succeed() {
        let mut l = ramped(64);
        let leases: Vec<_> = (0..64).map(|_| grant(&mut l, 0)).collect();
        let mut held = 64;
        for lease in &leases[20..] {
            held -= 1;
            l.on_report(&concurrency_429(), about(*lease, held), 5);
        }
        assert_eq!(l.effective(), 20);
        assert_eq!(l.refused_at, 64, "the cut's level, until a call beside the refusals succeeds");
        l.on_report(&ok(), about(leases[0], held - 1), 500);
        assert_eq!(l.refused_at, 21, "the lowest level refused in the burst");
    }

    /// Eight calls granted together are all refused: each report shows
    /// fewer beside it as the others leave, and the limit follows them down
    /// to 1. None of the eight succeeded, so those levels were never refused
    /// with calls running beside: the upstream refused at 8, and once it
    /// serves again the limit climbs back to 7 without waiting on probes.
    #[test]
    fn a_burst_refused_whole_cuts_to_one_but_was_refused_at_its_size() {
        let mut l = ramped(8);
        let leases: Vec<_> = (0..8).map(|_| grant(&mut l, 0)).collect();
        for (i, lease) in leases.iter().enumerate() {
            l.on_report(&concurrency_429(), about(*lease, 7 - i as u32), 5);
        }
        assert_eq!((l.effective(), l.refused_at), (1, 8));
        let mut now = 100;
        let mut successes = 0;
        while l.effective() < 7 {
            now += 10;
            let held = l.effective();
            let calls: Vec<_> = (0..held).map(|_| grant(&mut l, now)).collect();
            for (i, lease) in calls.iter().enumerate() {
                l.on_report(&ok(), about(*lease, held - 1 - i as u32), now + 5);
                successes += 1;
            }
            assert!(successes < 100, "still at {} after {successes} successes", l.effective());
        }
        assert_eq!(l.refused_at, 8);
        // Had one of the eight succeeded, the burst's levels would stand.
        let mut m = ramped(8);
        let leases: Vec<_> = (0..8).map(|_| grant(&mut m, 0)).collect();
        for (i, lease) in leases[..7].iter().enumerate() {
            m.on_report(&concurrency_429(), about(*lease, 7 - i as u32), 5);
        }
        m.on_report(&ok(), about(leases[7], 0), 400);
        assert_eq!((m.effective(), m.refused_at), (1, 2));
    }

    /// The same burst with the 20 successes reported first: the refusals,
    /// reported after them, count them as the calls that ran beside them.
    #[test]
    fn a_burst_whose_successes_report_first_still_cuts_to_them() {
        let mut l = ramped(64);
        let leases: Vec<_> = (0..64).map(|_| grant(&mut l, 0)).collect();
        let mut held = 64;
        for lease in &leases[..20] {
            held -= 1;
            l.on_report(&ok(), about(*lease, held), 5);
        }
        for lease in &leases[20..] {
            held -= 1;
            l.on_report(&concurrency_429(), Reported { oks_beside: 20, ..about(*lease, held) }, 6);
        }
        assert_eq!(l.effective(), 20);
    }

    /// Cause 4: the additive probe past the learned limit cost one 429 in
    /// every window. An upstream that allows 20, a pool that always has
    /// demand: probing alone stays well under 1 % of calls.
    #[test]
    fn probing_above_the_refused_level_is_rare() {
        let mut l = ramped(64);
        let upstream = 20;
        let (mut calls, mut refused) = (0u64, 0u64);
        let mut now = 0;
        for _ in 0..200_000 {
            now += 1;
            // The pool runs at its limit: the call granted into the last free
            // slot succeeds only while the upstream allows that many.
            let lease = grant(&mut l, now);
            let in_flight = l.effective() - 1;
            calls += 1;
            if in_flight >= upstream {
                refused += 1;
                l.on_report(&concurrency_429(), about(lease, in_flight), now);
            } else {
                l.on_report(&ok(), about(lease, in_flight), now);
            }
            assert!((1..=64).contains(&l.effective()));
        }
        assert!(refused * 1000 < calls * 3, "{refused} refusals in {calls} calls");
        assert!(l.effective() >= upstream - 1);
    }

    #[test]
    fn growth_returns_to_concurrency_while_the_limit_is_used() {
        let mut l = Learning::new(10, true);
        let lease = grant(&mut l, 0);
        l.on_report(&concurrency_429(), about(lease, 4), 0);
        assert_eq!(l.effective(), 5);
        // An idle pool (1 held of 5) does not grow.
        for _ in 0..50 {
            let lease = grant(&mut l, 1);
            l.on_report(&ok(), about(lease, 0), 1);
        }
        assert_eq!(l.effective(), 5);
        // A busy pool grows back to the refused level, then probes it and beyond.
        for _ in 0..100_000 {
            let lease = grant(&mut l, 2);
            let e = l.effective();
            l.on_report(&ok(), about(lease, e - 1), 2);
        }
        assert_eq!(l.effective(), 10, "never above concurrency");
    }

    /// A queue held back by the start's limit is looked at again the very
    /// millisecond the limit grows, never later (nor needlessly sooner).
    #[test]
    fn the_ramp_is_looked_at_again_when_it_grows() {
        let l = Learning::new(1 << 20, true);
        for now in 0..10 * RAMP_DOUBLING_MS {
            let at = Learning::ramp_grows_at(0, now);
            assert!(at > now);
            assert!(l.ramp_cap(0, at) > l.ramp_cap(0, now), "grown at {at} (from {now})");
            assert_eq!(l.ramp_cap(0, at - 1), l.ramp_cap(0, now), "not before {at} (from {now})");
        }
    }

    /// The first burst: a fresh pool grants the initial window, then doubles
    /// it every `RAMP_DOUBLING_MS` until the first concurrency refusal.
    #[test]
    fn a_fresh_pool_starts_small_and_ramps_until_refused() {
        let mut l = Learning::new(64, true);
        assert_eq!(l.effective(), INITIAL_WINDOW);
        // The 17th slot comes 6.25 ms in: looked at again at 7.
        assert_eq!(l.ramp(1000), Some(1007));
        assert_eq!(l.effective(), INITIAL_WINDOW);
        l.ramp(1000 + RAMP_DOUBLING_MS / 2);
        assert_eq!(l.effective(), INITIAL_WINDOW * 3 / 2);
        l.ramp(1000 + RAMP_DOUBLING_MS);
        assert_eq!(l.effective(), 2 * INITIAL_WINDOW);
        // The upstream refuses the 21st call: the start ends there.
        let lease = grant(&mut l, 1000 + RAMP_DOUBLING_MS);
        l.on_report(&concurrency_429(), about(lease, 20), 1000 + RAMP_DOUBLING_MS);
        assert_eq!(l.effective(), 20);
        assert_eq!(l.start, Start::Done);
        assert_eq!(l.ramp(1000 + 10 * RAMP_DOUBLING_MS), None);
        assert_eq!(l.effective(), 20);
        // Without refusals it reaches the configured limit, and a small pool
        // or a static one starts at its limit.
        assert_eq!(ramped(64).effective(), 64);
        assert_eq!(Learning::new(INITIAL_WINDOW, true).effective(), INITIAL_WINDOW);
        assert_eq!(Learning::new(64, false).effective(), 64);
    }

    /// The ramp counts time of use: a pool that made one call and then
    /// stood idle meets its first burst with the initial window, not
    /// `concurrency` (README rule 0); it goes on from there once calls are
    /// out again.
    #[test]
    fn the_start_ramps_only_while_calls_are_out() {
        // As the governor grants: the ramp carried to `now` first.
        let take = |l: &mut Learning, now: Ms| {
            l.rises_at(now);
            grant(l, now)
        };
        let mut l = Learning::new(64, true);
        let first = take(&mut l, 1000);
        l.on_lease_left(first.1, 1005);
        l.on_report(&ok(), about(first, 0), 1005);
        for now in [1010, 1000 + 10 * RAMP_DOUBLING_MS, 60_000] {
            assert_eq!(l.effective_at(now), INITIAL_WINDOW, "idle at {now}");
            assert!(l.starting_at(now));
            assert_eq!(l.rises_at(now), None, "idle, it grows at no instant");
        }
        // The burst after a minute: the initial window, and the ramp goes
        // on from the 5 ms it had run.
        assert_eq!(l.rises_at(60_000), None);
        let burst: Vec<_> = (0..INITIAL_WINDOW).map(|_| take(&mut l, 60_000)).collect();
        assert_eq!(l.effective(), INITIAL_WINDOW);
        assert_eq!(l.effective_at(60_000 + RAMP_DOUBLING_MS - 5), 2 * INITIAL_WINDOW);
        assert!(l.rises_at(60_000 + 1).is_some());
        // Calls out, the clock runs as before: 200 ms of use reach 64.
        for lease in &burst[1..] {
            l.on_lease_left(lease.1, 60_050);
        }
        assert_eq!(l.effective_at(60_000 + 2 * RAMP_DOUBLING_MS), 64, "one call still out");
        assert_eq!(l.ramp(60_000 + 2 * RAMP_DOUBLING_MS), None);
        assert_eq!((l.effective(), l.start), (64, Start::Done));
    }

    /// Between grants the ramp stands still, but what reads the limit sees
    /// where it is: the next grant would find it there.
    #[test]
    fn readers_see_the_ramp_where_a_grant_would_find_it() {
        let mut l = Learning::new(64, true);
        assert!(l.starting_at(0));
        assert_eq!(l.effective_at(5_000), INITIAL_WINDOW, "no grant yet: no ramp");
        l.ramp(1000);
        assert_eq!(l.effective_at(1000 + RAMP_DOUBLING_MS), 2 * INITIAL_WINDOW);
        assert_eq!(l.effective_at(1000 + 10 * RAMP_DOUBLING_MS), 64);
        assert!(!l.starting_at(1000 + 10 * RAMP_DOUBLING_MS));
        assert_eq!(l.effective(), INITIAL_WINDOW, "reading carried nothing");
        l.ramp(1000 + 10 * RAMP_DOUBLING_MS);
        assert_eq!((l.effective(), l.start), (64, Start::Done));
    }

    #[test]
    fn cuts_never_go_below_one() {
        let mut l = Learning::new(3, true);
        for _ in 0..10 {
            let lease = grant(&mut l, 0);
            l.on_report(&concurrency_429(), about(lease, 0), 0);
        }
        assert_eq!(l.effective(), 1);
    }

    #[test]
    fn exhausted_tokens_block_until_their_reset() {
        let mut l = Learning::new(10, true);
        let lease = grant(&mut l, 0);
        let report = Outcome {
            rate: RateInfo { token_remaining: Some(0), token_reset_ms: Some(1500), ..RateInfo::default() },
            ..ok()
        };
        let w = l.on_report(&report, about(lease, 0), 0);
        assert_eq!(w.token_block_until, Some(1500));
        assert_eq!(l.pause(1000), Some(Pause::Budget(500)));
        assert_eq!(l.pause(1500), None);
    }

    /// A cool-down and a spent budget both hold the pool: the pause is the
    /// one that ends last, whichever was set first.
    #[test]
    fn the_pause_is_the_later_of_a_cooldown_and_a_spent_budget() {
        // A 429 with `Retry-After: 30` and a budget spent until 90 s.
        let mut l = ramped(10);
        let lease = grant(&mut l, 0);
        let refused = Outcome {
            rate: RateInfo {
                limit: Some(100),
                remaining: Some(0),
                reset_ms: Some(90_000),
                retry_after_ms: Some(30_000),
                ..RateInfo::default()
            },
            ..concurrency_429()
        };
        let w = l.on_report(&refused, about(lease, 0), 0);
        assert_eq!(w.cooldown_until, Some(30_000));
        assert_eq!(l.pause(0), Some(Pause::Budget(90_000)));
        assert_eq!(l.pause(29_000), Some(Pause::Budget(61_000)));
        // A retry hint past the budget's reset (capped at 120 s): the cool-down.
        let mut l = ramped(10);
        let lease = grant(&mut l, 0);
        let refused = Outcome {
            rate: RateInfo { remaining: Some(0), reset_ms: Some(5_000), retry_after_ms: Some(20_000), ..refused.rate },
            ..refused
        };
        l.on_report(&refused, about(lease, 0), 0);
        assert_eq!(l.pause(1_000), Some(Pause::Cooldown(19_000)));
        // A token block that outlasts the cool-down.
        let mut l = ramped(10);
        let lease = grant(&mut l, 0);
        let tokens = Outcome {
            rate: RateInfo {
                token_remaining: Some(0),
                token_reset_ms: Some(500_000),
                retry_after_ms: Some(500_000),
                ..RateInfo::default()
            },
            ..concurrency_429()
        };
        l.on_report(&tokens, about(lease, 0), 0);
        assert_eq!(l.cooldown_until, MAX_COOLDOWN_MS);
        assert_eq!(l.pause(0), Some(Pause::Budget(500_000)));
    }

    #[test]
    fn not_adaptive_learns_nothing() {
        let mut l = Learning::new(5, false);
        let lease = grant(&mut l, 0);
        let w = l.on_report(
            &with_budget(
                Outcome { rate: RateInfo { retry_after_ms: Some(5000), ..RateInfo::default() }, ..concurrency_429() },
                0,
                100,
            ),
            about(lease, 4),
            0,
        );
        assert_eq!(w, Wakeups::default());
        assert_eq!(l.effective(), 5);
        assert_eq!(l.pause(0), None);
    }

    fn hinted_429() -> Outcome {
        Outcome { rate: RateInfo { retry_after_ms: Some(1000), ..RateInfo::default() }, ..concurrency_429() }
    }

    /// A fresh pool's first 16 calls meet an upstream that admits 5: the 11
    /// refused ones were granted before the cut, so they do not show that
    /// refusals go on after it. The probe above 5 later is refused once:
    /// that pauses nothing (it paused the pool, and its run's undoing put
    /// the limit back at 16, every second).
    #[test]
    fn a_burst_refused_before_the_cut_does_not_make_the_next_refusal_pool_wide() {
        let mut l = Learning::new(64, true);
        let leases: Vec<_> = (0..INITIAL_WINDOW).map(|_| grant(&mut l, 0)).collect();
        let mut held = INITIAL_WINDOW;
        for lease in &leases[5..] {
            held -= 1;
            let w = l.on_report(&hinted_429(), about(*lease, held), 2);
            assert_eq!(w.cooldown_until, None);
        }
        assert_eq!(l.effective(), 5);
        let probe = grant(&mut l, 3000);
        let w = l.on_report(&hinted_429(), about(probe, 5), 3002);
        assert_eq!(w.cooldown_until, None, "one refused probe pauses nothing");
        assert_eq!(l.pause(3002), None);
        assert_eq!(l.effective(), 5);
    }

    /// Ten callers on a pool of 64; the upstream drops to 5 in flight. The
    /// refusals go on after each cut (the limit comes down from 64, which
    /// the pool never used), so the run is pool-wide; but they came at the
    /// level the pool ran at, not under half of it: too many at once, not a
    /// spent window, so the cuts stay, and they were no refused probes.
    /// (Compared with the limit, they were under half of it: the cuts were
    /// undone, back to 64, at every run, and each doubled the probe wait.)
    #[test]
    fn a_pool_using_less_than_its_limit_keeps_the_cuts_of_a_run() {
        let mut l = ramped(64);
        let callers = 10;
        for i in 0..POOL_WIDE_STREAK as Ms {
            let lease = grant(&mut l, 10 + i);
            l.on_report(&hinted_429(), about(lease, callers - 1), 10 + i);
        }
        assert!(matches!(l.pause(20), Some(Pause::Cooldown(_))), "refusals went on after the cuts");
        assert_eq!(l.effective(), callers - 1);
        assert_eq!(l.probe_wait, PROBE_WAIT_MIN, "a drop is no refused probe");
        // The old calls have left; one granted after the last cut succeeds.
        let lease = grant(&mut l, 1100);
        l.on_report(&ok(), about(lease, 4), 1600);
        assert_eq!(l.effective(), callers - 1, "not undone");
        // Growth onto the refused level is a probe: refused, it doubles the wait.
        while l.effective() < l.refused_at {
            let lease = grant(&mut l, 2000);
            l.on_report(&ok(), about(lease, l.effective() - 1), 2000);
        }
        let lease = grant(&mut l, 2000);
        l.on_report(&concurrency_429(), about(lease, l.effective() - 1), 2000);
        assert_eq!(l.probe_wait, 2 * PROBE_WAIT_MIN);
    }

    /// `calls` calls one after another from `from`, `step_ms` apart, by a pool
    /// at its limit against an upstream that allows `upstream` in flight: the
    /// ones refused, and the instant after the last.
    fn at_full_use(l: &mut Learning, from: Ms, calls: u32, step_ms: Ms, upstream: u32) -> (u32, Ms) {
        let (mut refused, mut now) = (0, from);
        for _ in 0..calls {
            let lease = grant(l, now);
            let in_flight = l.effective() - 1;
            if in_flight >= upstream {
                refused += 1;
                l.on_report(&concurrency_429(), about(lease, in_flight), now);
            } else {
                l.on_report(&ok(), about(lease, in_flight), now);
            }
            now += step_ms;
        }
        (refused, now)
    }

    /// The pool of `ramped(64)` after refusals taught it `limit` in flight.
    fn refused_above(limit: u32) -> Learning {
        let mut l = ramped(64);
        let leases: Vec<_> = (0..64).map(|_| grant(&mut l, 0)).collect();
        for (i, lease) in leases[limit as usize..].iter().enumerate() {
            l.on_report(&concurrency_429(), about(*lease, 63 - i as u32), 0);
        }
        // One of the calls that ran beside them succeeds.
        l.on_report(&ok(), about(leases[0], limit - 1), 0);
        assert_eq!((l.effective(), l.refused_at), (limit, limit + 1));
        l
    }

    /// The upstream raised its limit from 20 to 40 in flight. The probe onto
    /// the refused level holds, and the limit climbs (one more per success
    /// at full use) to the new limit, instead of one step per 256 successes
    /// (5 000 successes, minutes at 33 calls a second).
    #[test]
    fn a_probe_that_holds_climbs_to_the_upstreams_new_limit() {
        let mut l = refused_above(20);
        let upstream = 40;
        // The pool at its limit, one call after another (`now` counts calls).
        let climb = PROBE_WAIT_MIN + 2 * 21 + 30;
        let (refused, now) = at_full_use(&mut l, 1, climb, 1, upstream);
        assert_eq!(refused, 1, "the new limit found with one refusal");
        assert_eq!((l.effective(), l.refused_at), (upstream, upstream + 1), "climbed to it");
        // From there on, rare probes above it: after 256, then 512 successes.
        assert_eq!(at_full_use(&mut l, now, 1000, 1, upstream).0, 2);
        assert_eq!(l.effective(), upstream);
    }

    /// A pool of few calls a second whose probes were refused until they
    /// wait the most successes: the upstream raises its limit from 5 to 10
    /// in flight. The next probe comes `PROBE_WAIT_MS` after the wait began
    /// (once `PROBE_WAIT_MIN` successes are in), not 1 024 successes later,
    /// two minutes at eight calls a second; while the upstream stays put,
    /// probing costs no more than one refusal in `PROBE_WAIT_MIN`.
    #[test]
    fn at_a_few_calls_a_second_a_raised_limit_is_found_within_seconds() {
        let mut l = refused_above(5);
        l.probe_wait = PROBE_WAIT_MAX;
        // Eight calls a second. Unchanged upstream: one refused probe per
        // `PROBE_WAIT_MIN` successes at most (20 s is 160 calls here).
        let (refused, now) = at_full_use(&mut l, 1, 4 * PROBE_WAIT_MIN, 125, 5);
        assert!(refused <= 4, "{refused} refused probes in {} calls", 4 * PROBE_WAIT_MIN);
        assert_eq!(l.effective(), 5);
        // Raised to 10: found within the time bound's calls, not 1 024 successes.
        at_full_use(&mut l, now, PROBE_WAIT_MIN + 40, 125, 10);
        assert_eq!(l.effective(), 10, "found within {} calls", PROBE_WAIT_MIN + 40);
    }

    #[test]
    fn reconfigure_keeps_a_cut_but_follows_an_unreduced_limit() {
        let mut l = ramped(10);
        l.reconfigure(20, true);
        assert_eq!(l.effective(), 20);
        let lease = grant(&mut l, 0);
        l.on_report(&concurrency_429(), about(lease, 17), 0);
        assert_eq!(l.effective(), 17);
        l.reconfigure(30, true);
        assert_eq!(l.effective(), 17);
        l.reconfigure(5, true);
        assert_eq!(l.effective(), 5);
    }

    /// A limit lowered under what the pool learned and raised again comes
    /// back to the learned limit: the upstream refused above it, and going
    /// past that level is a probe, made only after its wait.
    #[test]
    fn a_limit_lowered_then_raised_comes_back_to_the_learned_limit() {
        let mut l = ramped(8);
        let leases: Vec<_> = (0..8).map(|_| grant(&mut l, 0)).collect();
        l.on_report(&concurrency_429(), about(leases[7], 4), 10);
        assert_eq!((l.effective(), l.refused_at), (4, 5));
        for lowered in [3, 4] {
            let mut m = l.clone();
            m.reconfigure(lowered, true);
            assert_eq!(m.effective(), lowered);
            m.reconfigure(8, true);
            assert_eq!(m.effective(), 4, "lowered to {lowered}: back to the 4 learned, not 8");
            m.reconfigure(2, true);
            m.reconfigure(16, true);
            assert_eq!(m.effective(), 4);
        }
        // Nothing refused above it: an unreduced limit follows the reload.
        let mut fresh = ramped(8);
        fresh.reconfigure(3, true);
        fresh.reconfigure(8, true);
        assert_eq!(fresh.effective(), 8);
    }
}
