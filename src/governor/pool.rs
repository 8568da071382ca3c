//! One pool's settings and live state, and the admission rule that reads them.
//!
//! A slot is free when `held < effective`, no learned pause is in force, and
//! the RPM gate has a token (SPEC §5). `blocked` is the only place that rule
//! is written; it also says why and for how long, for `Retry-After`.

use super::gate::TokenBucket;
use super::idempotency::Store;
use super::learn::{Learning, Pause};
use super::lease::PoolSeal;
use super::queue::Queue;
use crate::time::Ms;
use crate::wheel::TimerKey;

/// The numbers of a pool's configuration the governor works with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSettings {
    pub concurrency: u32,
    pub queue_size: u32,
    pub queue_timeout_ms: u64,
    pub rpm: Option<(u32, u32)>,
    /// At most a week (the configuration's bound), so a lease keeps it in a `u32`.
    pub term_ms: u64,
    pub renew_interval_ms: u64,
    pub request_timeout_ms: u64,
    pub adaptive: bool,
    /// The bound of the `Idempotency-Key` store.
    pub idempotency_keys: u32,
}

impl PoolSettings {
    /// Those of a pool no configuration names: no slot, no queue, no rate.
    /// Its leases renew by the terms they were granted with.
    const RETIRED: PoolSettings = PoolSettings {
        concurrency: 0,
        queue_size: 0,
        queue_timeout_ms: 0,
        rpm: None,
        term_ms: 1_000,
        renew_interval_ms: 500,
        request_timeout_ms: 0,
        adaptive: false,
        idempotency_keys: 0,
    };
}

/// Why an acquire was not granted; the value of `x-nthpool-deny-reason`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DenyReason {
    Concurrency,
    Rate,
    Cooldown,
    QueueFull,
    /// The re-adoption window after a start without a usable snapshot (SPEC §11).
    Recovering,
}

impl DenyReason {
    pub const ALL: [DenyReason; 5] = [
        DenyReason::Concurrency,
        DenyReason::Rate,
        DenyReason::Cooldown,
        DenyReason::QueueFull,
        DenyReason::Recovering,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DenyReason::Concurrency => "concurrency",
            DenyReason::Rate => "rate",
            DenyReason::Cooldown => "cooldown",
            DenyReason::QueueFull => "queue_full",
            DenyReason::Recovering => "recovering",
        }
    }
}

/// When nothing better is known (a concurrency limit), callers retry in a second.
pub const UNKNOWN_WAIT_MS: u64 = 1000;

/// Plain counters, bumped on the hot path and only formatted when scraped.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoolStats {
    pub grants: u64,
    pub denied: [u64; DenyReason::ALL.len()],
    pub queue_timeouts: u64,
    pub waiters_gone: u64,
    pub reclaimed_term: u64,
    pub reclaimed_cap: u64,
    pub renewed: u64,
    pub renew_not_found: u64,
    pub renew_capped: u64,
    pub released: u64,
    pub release_gone: u64,
    pub reports_throttled: u64,
    pub cooldowns: u64,
    /// Unknown but valid slots taken back in a re-adoption window.
    pub readopted: u64,
    /// Acquires answered with the grant their `Idempotency-Key` already held.
    pub idempotent_replays: u64,
    /// Queued acquires whose place a retry with the same key took.
    pub superseded: u64,
}

pub struct Pool {
    pub name: Box<str>,
    /// Binds this pool's slot ids to it (`SlotKey::seal` of its name under
    /// the governor's key).
    pub seal: PoolSeal,
    pub settings: PoolSettings,
    /// A pool dropped by a reload: it grants nothing more, its leases drain.
    pub retired: bool,
    pub held: u32,
    /// Of `held`, the leases a snapshot taken while running restored that
    /// no holder has renewed or released since: some may have ended after
    /// it was taken, so they do not count against re-adoptions.
    pub unconfirmed: u32,
    pub queue: Queue,
    pub gate: Option<TokenBucket>,
    pub learning: Learning,
    /// The one wheel entry that wakes this pool's queue when a pause or a
    /// rate wait ends, with its instant.
    pub wake: Option<(Ms, TimerKey)>,
    /// On the governor's `woken` list: its queue is pumped once the
    /// millisecond whose deadlines are firing has ended.
    pub woken: bool,
    pub stats: PoolStats,
    /// The end of the re-adoption window, while one is or was open.
    pub recovering_until: Option<Ms>,
    /// The end of the window the last move here opened or extended
    /// (`Governor::moved_here`): requests marked moved until then open none.
    pub moved_until: Option<Ms>,
    /// How many slots the process before this one may have held here (the
    /// live leases of a snapshot refused for changed settings, or the limit
    /// it granted under), and until when its holders come back: until then
    /// re-adoption takes that many back, however far below it a deploy set
    /// `concurrency` (a lowered limit never revokes held slots).
    pub held_before: Option<(u32, Ms)>,
    /// Live `Idempotency-Key`s and what they name.
    pub idem: Store,
}

impl Pool {
    pub fn new(name: &str, settings: PoolSettings, seal: PoolSeal) -> Pool {
        debug_assert!(settings.term_ms <= u32::MAX as u64);
        Pool {
            name: name.into(),
            seal,
            settings,
            retired: false,
            held: 0,
            unconfirmed: 0,
            queue: Queue::default(),
            gate: settings.rpm.map(|(rpm, burst)| TokenBucket::new(rpm, burst)),
            learning: Learning::new(settings.concurrency, settings.adaptive),
            wake: None,
            woken: false,
            stats: PoolStats::default(),
            recovering_until: None,
            moved_until: None,
            held_before: None,
            idem: Store::new(settings.idempotency_keys),
        }
    }

    /// A pool a snapshot names as retired and the configuration does not:
    /// it grants nothing and holds its leases until they end, or until a
    /// reload names it again and gives it settings.
    pub fn retired(name: &str, seal: PoolSeal) -> Pool {
        let mut pool = Pool::new(name, PoolSettings::RETIRED, seal);
        pool.retired = true;
        pool
    }

    /// Applies new settings; held slots, the queue and what was learned stay.
    pub fn reconfigure(&mut self, settings: PoolSettings, now: Ms) {
        debug_assert!(settings.term_ms <= u32::MAX as u64);
        // The holders an open window waits for were granted under the limit
        // before: a lowered one does not refuse them.
        if let Some(until) = self.recovering_until.filter(|&until| now < until) {
            self.expect_holders(self.readopt_limit(now), until);
        }
        self.learning.reconfigure(settings.concurrency, settings.adaptive);
        self.gate = match (settings.rpm, self.gate.take()) {
            (None, _) => None,
            (Some((rpm, burst)), Some(mut gate)) => {
                gate.reconfigure(rpm, burst, now);
                Some(gate)
            }
            (Some((rpm, burst)), None) => Some(TokenBucket::new(rpm, burst)),
        };
        self.idem.set_capacity(settings.idempotency_keys);
        self.settings = settings;
        self.retired = false;
    }

    /// Whether the re-adoption window is open at `now`.
    pub fn recovering(&self, now: Ms) -> bool {
        self.recovering_until.is_some_and(|until| now < until)
    }

    /// How many slots re-adoption may hold at `now`: the configured
    /// `concurrency`, or as many as the process before may have held
    /// (`held_before`) when that is more.
    pub fn readopt_limit(&self, now: Ms) -> u32 {
        match self.held_before {
            Some((holders, until)) if now < until => holders.max(self.settings.concurrency),
            _ => self.settings.concurrency,
        }
    }

    /// The process before may have held `holders` slots here, whose holders
    /// come back by `until`; the larger count and the later instant stay.
    pub fn expect_holders(&mut self, holders: u32, until: Ms) {
        let (before, by) = self.held_before.unwrap_or_default();
        self.held_before = Some((before.max(holders), by.max(until)));
    }

    /// A pool a reload removed that has nothing left to drain: no slot held
    /// (lock or proxied), no waiter. It is kept (a reload may name it again)
    /// but no longer shown in the metrics or on the dashboard.
    pub fn drained_away(&self) -> bool {
        self.retired && self.held == 0 && self.queue.is_empty()
    }

    pub fn effective_limit(&self) -> u32 {
        self.learning.effective()
    }

    /// The limit in force at `now`, the start's ramp carried there
    /// (`Learning::effective_at`): what a grant at `now` would find.
    pub fn effective_limit_at(&self, now: Ms) -> u32 {
        self.learning.effective_at(now)
    }

    /// Why a grant cannot happen at `now`, with the known wait in ms, or
    /// `None` when a slot is free. The caller refilled the gate first.
    /// When several gates block, the one that opens last decides both the
    /// reason and the wait: a retry sooner would be refused again.
    pub fn blocked(&self, now: Ms) -> Option<(DenyReason, u64)> {
        if self.retired {
            return Some((DenyReason::Concurrency, UNKNOWN_WAIT_MS));
        }
        // No grant until the old holders had one term to come back.
        if let Some(until) = self.recovering_until.filter(|&until| now < until) {
            return Some((DenyReason::Recovering, until - now));
        }
        let pause = self.learning.pause(now);
        let rate_wait = self.gate.as_ref().map_or(0, |g| g.wait_ms(now));
        let free = self.held < self.effective_limit_at(now);
        if pause.is_none() && rate_wait == 0 && free {
            // Nothing blocks: the usual case, decided without weighing the gates.
            return None;
        }
        let cooldown_wait = match pause {
            Some(Pause::Cooldown(wait)) => wait,
            _ => 0,
        };
        let budget_wait = match pause {
            Some(Pause::Budget(wait)) => wait,
            _ => 0,
        };
        let rate_wait = rate_wait.max(budget_wait);
        let concurrency_wait = if free { 0 } else { UNKNOWN_WAIT_MS };
        // Ties go to the first: a cool-down, then the concurrency limit, then rate.
        [
            (DenyReason::Cooldown, cooldown_wait),
            (DenyReason::Concurrency, concurrency_wait),
            (DenyReason::Rate, rate_wait),
        ]
        .into_iter()
        .filter(|&(_, wait)| wait > 0)
        .reduce(|latest, next| if next.1 > latest.1 { next } else { latest })
    }

    /// Every gate that holds the pool at `now`, each on its own (a cool-down
    /// and a spent budget may hold it together), for the metrics; `blocked`
    /// names the one that opens last.
    pub fn limited_by(&self, now: Ms) -> [(DenyReason, bool); 3] {
        let rate = self.gate.as_ref().is_some_and(|g| g.wait_ms(now) > 0) || self.learning.budget_wait(now) > 0;
        [
            (DenyReason::Concurrency, self.retired || self.held >= self.effective_limit_at(now)),
            (DenyReason::Rate, rate),
            (DenyReason::Cooldown, self.learning.cooldown_until > now),
        ]
    }

    /// Adds the RPM tokens that came due by `now`: an answer that shows the
    /// bucket (`x-nthpool-rpm-remaining`) off the grant path, which refills
    /// it anyway, must not show a level from before them.
    pub fn refill_gate(&mut self, now: Ms) {
        if let Some(gate) = &mut self.gate {
            gate.refill(now);
        }
    }

    /// Why a waiter leaving the queue at `now` has no slot, and for how
    /// long: the gate refilled first, so the answer shows its level at `now`.
    /// A slot that is free after all (its grant still to come) reads as the
    /// concurrency limit, with no known wait.
    pub fn refusal(&mut self, now: Ms) -> (DenyReason, u64) {
        self.refill_gate(now);
        self.blocked(now).unwrap_or((DenyReason::Concurrency, UNKNOWN_WAIT_MS))
    }

    pub fn rpm_remaining(&self) -> Option<u32> {
        self.gate.as_ref().map(TokenBucket::tokens)
    }

    /// `rpm_remaining` as it stands at `now`, refills due by then counted
    /// (the bucket itself is refilled only when an acquire needs it).
    pub fn rpm_tokens_at(&self, now: Ms) -> Option<u32> {
        self.gate.as_ref().map(|g| g.tokens_at(now))
    }
}

#[cfg(test)]
mod tests {
    use crate::api::pool_settings;
    use crate::config::Config;
    use crate::governor::{Admission, DenyReason, Entropy, Governor};

    #[test]
    fn the_gate_that_opens_last_decides_the_answer() {
        let config = Config::parse(br#"{"pools":{"p":{"keys":["k"],"concurrency":1,"rpm":1,"adaptive":false}}}"#);
        let mut g: Governor = Governor::new(&pool_settings(&config.unwrap()), Entropy::seeded(1));
        let p = g.pool_id("p").unwrap();
        assert!(matches!(g.acquire(p, 0, 1, 0), Admission::Granted(_)));
        // Held and out of tokens: the token is 60 s away, past the 1 s guess for a slot.
        match g.acquire(p, 0, 2, 0) {
            Admission::Denied(d) => assert_eq!((d.reason, d.retry_after_ms), (DenyReason::Rate, 60_000)),
            other => panic!("expected a denial, got {other:?}"),
        }
        // With the token back, only the concurrency limit blocks.
        match g.acquire(p, 0, 3, 60_000) {
            Admission::Denied(d) => assert_eq!((d.reason, d.retry_after_ms), (DenyReason::Concurrency, 1000)),
            other => panic!("expected a denial, got {other:?}"),
        }
    }
}
