//! Model-based property test of the governor: random operation sequences run
//! against `nthpool::governor::Governor` and a small reference model side by
//! side, with the invariants of SPEC §5–§6 checked after every step.
//!
//! How to run:
//! - default (a few seconds in debug): `cargo test --test governor_model`;
//! - the large run, over 10^6 operations:
//!   `cargo test --release --test governor_model -- --ignored`;
//! - any number of cases: `NTHPOOL_MODEL_CASES=5000 cargo test --release --test governor_model`.
//!
//! The model does not re-implement admission (rate gates and learning are the
//! governor's to compute); it knows what must hold whatever they decide: who
//! holds what until when, who waits in which order, and that nothing leaks.
//! The clock moves like the reactor's: operations run at `now`, and the wheel
//! is usually, but not always, advanced to `now` before the next one, so the
//! lazy reclaim in `find` and late timers are exercised too.

use std::collections::{BTreeMap, HashMap, VecDeque};

use nthpool::api::pool_settings;
use nthpool::config::Config;
use nthpool::governor::{
    Admission, Entropy, Governor, Leaving, Notice, Outcome, PoolId, PoolSettings, RateInfo, RenewError, WaiterKey,
};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;

/// Everything after this many ms has fired whatever a case armed: budget
/// windows reach at most an hour ahead, cool-downs two minutes.
const DRAIN_MS: u64 = 4_000_000;

#[derive(Debug, Clone)]
struct PoolSetup {
    concurrency: u32,
    queue_size: u32,
    queue_timeout_ms: u64,
    term_ms: u64,
    request_terms: u64,
    rpm: Option<(u32, Option<u32>)>,
    adaptive: bool,
}

impl PoolSetup {
    fn request_timeout_ms(&self) -> u64 {
        self.term_ms * self.request_terms
    }

    fn json(&self, name: &str) -> String {
        let rpm = match self.rpm {
            None => String::new(),
            Some((rpm, None)) => format!(r#","rpm":{rpm}"#),
            Some((rpm, Some(burst))) => format!(r#","rpm":{rpm},"rpmBurst":{burst}"#),
        };
        format!(
            r#""{name}":{{"keys":["k-{name}"],"concurrency":{},"queue":{{"size":{},"timeoutMs":{}}},"termMs":{},"renewIntervalMs":{},"requestTimeoutMs":{},"adaptive":{}{rpm}}}"#,
            self.concurrency,
            self.queue_size,
            self.queue_timeout_ms,
            self.term_ms,
            self.term_ms / 2,
            self.request_timeout_ms(),
            self.adaptive,
        )
    }
}

fn pool_name(i: usize) -> String {
    format!("p{i}")
}

fn pools_config(setups: &[PoolSetup]) -> BTreeMap<String, PoolSettings> {
    let body: Vec<String> = setups.iter().enumerate().map(|(i, s)| s.json(&pool_name(i))).collect();
    let text = format!(r#"{{"pools":{{{}}}}}"#, body.join(","));
    pool_settings(
        &Config::parse(text.as_bytes()).unwrap_or_else(|e| panic!("generated configuration is valid: {e}\n{text}")),
    )
}

/// Which slot a release names.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// The lease's own pool.
    Own,
    /// Another pool's route (never releases it).
    OtherPool(usize),
    /// The right pool with one character of the secret changed.
    Forged,
}

/// How the wheel follows a clock move.
#[derive(Debug, Clone, Copy)]
enum Follow {
    /// Like an idle reactor: `advance` at every `next_deadline()` on the way,
    /// then at the new `now`.
    Keep,
    /// Like a reactor that was busy: one `advance(now)` over the whole gap.
    Jump,
    /// Not yet: operations run at the new `now` before the wheel catches up,
    /// as the reactor handles events before it advances.
    Lazy,
}

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        pool: usize,
        wait_ms: u64,
        owner_salt: u32,
    },
    Renew {
        lease: Index,
        other_pool: Option<usize>,
    },
    Release {
        lease: Index,
        target: Target,
        outcome: Option<Outcome>,
    },
    /// The clock moves by `dt` and the wheel follows as `mode` says.
    Tick {
        dt: u64,
        mode: Follow,
    },
    /// A queued client disconnects; `wrong_owner` tests a stale key.
    Cancel {
        waiter: Index,
        wrong_owner: bool,
    },
    Reconfigure {
        pool: usize,
        concurrency: u32,
    },
}

fn pool_setup() -> impl Strategy<Value = PoolSetup> {
    (
        1u32..=4,
        0u32..=3,
        prop_oneof![Just(0u64), 1u64..=600],
        50u64..=500,
        1u64..=3,
        prop::option::weighted(0.4, (30u32..=6000, prop::option::of(1u32..=3))),
        any::<bool>(),
    )
        .prop_map(|(concurrency, queue_size, queue_timeout_ms, term_ms, request_terms, rpm, adaptive)| PoolSetup {
            concurrency,
            queue_size,
            queue_timeout_ms,
            term_ms,
            request_terms,
            rpm,
            adaptive,
        })
}

fn outcome() -> impl Strategy<Value = Outcome> {
    let status = prop_oneof![
        4 => Just(Some(200u16)),
        3 => Just(Some(429)),
        1 => Just(Some(503)),
        1 => Just(Some(404)),
        1 => Just(None),
    ];
    let small = |max: u64| prop::option::weighted(0.3, 0..=max);
    (
        status,
        prop_oneof![4 => Just(0u64), 1 => 1u64..=3],
        small(1500),
        (small(20), small(5), small(2000)),
        (small(20), small(3), small(2000)),
    )
        .prop_map(|(status, throttled, retry_after_ms, (limit, remaining, reset_ms), tokens)| Outcome {
            status,
            throttled,
            rate: RateInfo {
                limit,
                remaining,
                reset_ms,
                reset_coarse: false,
                reset_instant: false,
                token_limit: tokens.0,
                token_remaining: tokens.1,
                token_reset_ms: tokens.2,
                retry_after_ms,
            },
        })
}

fn op() -> impl Strategy<Value = Op> {
    let target = prop_oneof![
        6 => Just(Target::Own),
        1 => (0usize..3).prop_map(Target::OtherPool),
        1 => Just(Target::Forged),
    ];
    prop_oneof![
        8 => (0usize..3, prop_oneof![Just(0u64), 1u64..=800], any::<u32>())
            .prop_map(|(pool, wait_ms, owner_salt)| Op::Acquire { pool, wait_ms, owner_salt }),
        3 => (any::<Index>(), prop::option::weighted(0.15, 0usize..3))
            .prop_map(|(lease, other_pool)| Op::Renew { lease, other_pool }),
        6 => (any::<Index>(), target, prop::option::weighted(0.8, outcome()))
            .prop_map(|(lease, target, outcome)| Op::Release { lease, target, outcome }),
        6 => (
            prop_oneof![Just(0u64), 1u64..=120, 100u64..=700],
            prop_oneof![5 => Just(Follow::Keep), 2 => Just(Follow::Jump), 2 => Just(Follow::Lazy)],
        )
            .prop_map(|(dt, mode)| Op::Tick { dt, mode }),
        2 => (any::<Index>(), prop::bool::weighted(0.2))
            .prop_map(|(waiter, wrong_owner)| Op::Cancel { waiter, wrong_owner }),
        1 => (0usize..3, 1u32..=5)
            .prop_map(|(pool, concurrency)| Op::Reconfigure { pool, concurrency }),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LeaseState {
    Held,
    Released,
    Reclaimed,
}

struct LeaseModel {
    pool: usize,
    slot: [u8; nthpool::governor::lease::SLOT_ID_CHARS],
    lease_deadline: u64,
    request_deadline: u64,
    state: LeaseState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WaiterState {
    Waiting,
    Granted,
    TimedOut,
    Cancelled,
}

struct WaiterModel {
    pool: usize,
    owner: u64,
    key: WaiterKey,
    enqueued_at: u64,
    deadline: u64,
    state: WaiterState,
}

struct Model {
    setups: Vec<PoolSetup>,
    pids: Vec<PoolId>,
    now: u64,
    /// The instant the wheel was last advanced to.
    wheel_now: u64,
    /// Whether the last `advance` kept up with every deadline on its way.
    keep_up: bool,
    leases: Vec<LeaseModel>,
    waiters: Vec<WaiterModel>,
    by_owner: HashMap<u64, usize>,
    queues: Vec<VecDeque<usize>>,
    next_owner: u64,
    /// Grants per pool in the current step, and `held` before it.
    grants: Vec<u32>,
    held_before: Vec<u32>,
    step: usize,
}

macro_rules! check {
    ($model:expr, $cond:expr, $($fmt:tt)+) => {
        prop_assert!($cond, "step {} (now {}): {}", $model.step, $model.now, format!($($fmt)+))
    };
}

impl Model {
    fn new(setups: Vec<PoolSetup>, g: &Governor) -> Model {
        let pids = (0..setups.len()).map(|i| g.pool_id(pool_name(i)).expect("configured pool")).collect();
        let n = setups.len();
        Model {
            setups,
            pids,
            now: 0,
            wheel_now: 0,
            keep_up: true,
            leases: Vec::new(),
            waiters: Vec::new(),
            by_owner: HashMap::new(),
            queues: vec![VecDeque::new(); n],
            next_owner: 0,
            grants: vec![0; n],
            held_before: vec![0; n],
            step: 0,
        }
    }

    fn held(&self, pool: usize) -> u32 {
        self.leases.iter().filter(|l| l.pool == pool && l.state == LeaseState::Held).count() as u32
    }

    fn record_grant(&mut self, pool: usize, grant: &nthpool::governor::Grant) -> Result<(), TestCaseError> {
        let s = &self.setups[pool];
        check!(
            self,
            grant.lease_deadline == self.now + s.term_ms,
            "lease deadline {} is not now + termMs",
            grant.lease_deadline
        );
        check!(
            self,
            grant.request_deadline == self.now + s.request_timeout_ms(),
            "request deadline {} is not now + requestTimeoutMs",
            grant.request_deadline
        );
        self.leases.push(LeaseModel {
            pool,
            slot: grant.slot.encode(),
            lease_deadline: grant.lease_deadline,
            request_deadline: grant.request_deadline,
            state: LeaseState::Held,
        });
        self.grants[pool] += 1;
        Ok(())
    }

    /// Applies every notice, checking FIFO order and deadlines as it goes.
    fn drain(&mut self, g: &mut Governor) -> Result<(), TestCaseError> {
        while let Some(notice) = g.pop_notice() {
            match notice {
                Notice::Granted { owner, grant } => {
                    let Some(&w) = self.by_owner.get(&owner) else {
                        return Err(TestCaseError::fail(format!(
                            "step {}: grant for unknown owner {owner}",
                            self.step
                        )));
                    };
                    let waiter = &self.waiters[w];
                    let pool = waiter.pool;
                    check!(
                        self,
                        waiter.state == WaiterState::Waiting,
                        "owner {owner} granted while {:?}",
                        waiter.state
                    );
                    check!(
                        self,
                        self.queues[pool].front() == Some(&w),
                        "pool p{pool}: owner {owner} granted out of FIFO order (head is {:?})",
                        self.queues[pool].front().map(|&h| self.waiters[h].owner)
                    );
                    // A waiter past its deadline may be granted only by an
                    // operation that ran before the wheel reached the deadline.
                    // In one `advance` over a gap the grant may have been
                    // caused by an earlier timer, which the model cannot see,
                    // so a jump is not held to this (see
                    // `a_catching_up_wheel_times_out_a_waiter_before_a_later_reclaim`).
                    let in_advance = self.wheel_now == self.now;
                    check!(
                        self,
                        waiter.deadline >= self.now
                            || (!in_advance && self.wheel_now < waiter.deadline)
                            || (in_advance && !self.keep_up),
                        "owner {owner} granted at {} after its queue deadline {} (wheel at {})",
                        self.now,
                        waiter.deadline,
                        self.wheel_now
                    );
                    check!(
                        self,
                        grant.queued_ms == self.now - waiter.enqueued_at,
                        "queued_ms {} for a wait since {}",
                        grant.queued_ms,
                        waiter.enqueued_at
                    );
                    self.queues[pool].pop_front();
                    self.waiters[w].state = WaiterState::Granted;
                    self.record_grant(pool, &grant)?;
                }
                Notice::TimedOut { owner, denial } => {
                    let Some(&w) = self.by_owner.get(&owner) else {
                        return Err(TestCaseError::fail(format!(
                            "step {}: timeout for unknown owner {owner}",
                            self.step
                        )));
                    };
                    let waiter = &self.waiters[w];
                    check!(
                        self,
                        waiter.state == WaiterState::Waiting,
                        "owner {owner} timed out while {:?}",
                        waiter.state
                    );
                    check!(
                        self,
                        self.now >= waiter.deadline,
                        "owner {owner} timed out before its deadline {}",
                        waiter.deadline
                    );
                    check!(
                        self,
                        denial.queued_ms == self.now - waiter.enqueued_at,
                        "timeout queued_ms {}",
                        denial.queued_ms
                    );
                    let pool = waiter.pool;
                    self.queues[pool].retain(|&x| x != w);
                    self.waiters[w].state = WaiterState::TimedOut;
                }
                Notice::Superseded { owner } => {
                    return Err(TestCaseError::fail(format!(
                        "step {}: owner {owner} superseded without an Idempotency-Key",
                        self.step
                    )))
                }
                Notice::Timer(tag) => {
                    return Err(TestCaseError::fail(format!(
                        "step {}: external timer {tag} nobody scheduled",
                        self.step
                    )))
                }
            }
        }
        Ok(())
    }

    fn advance(&mut self, g: &mut Governor) -> Result<(), TestCaseError> {
        g.advance(self.now);
        self.wheel_now = self.now;
        self.drain(g)?;
        // Every lease whose deadline has come is gone once the wheel ran.
        for l in &mut self.leases {
            if l.state == LeaseState::Held && l.lease_deadline <= self.now {
                l.state = LeaseState::Reclaimed;
            }
        }
        Ok(())
    }

    /// The governor reclaims an expired lease when it is named (renew,
    /// release in its own pool) before the wheel gets to it.
    fn touch_expired(&mut self, lease: usize) {
        let l = &mut self.leases[lease];
        if l.state == LeaseState::Held && l.lease_deadline <= self.now {
            l.state = LeaseState::Reclaimed;
        }
    }

    fn other_pool(&self, pool: usize, pick: usize) -> Option<usize> {
        let n = self.setups.len();
        (n > 1).then(|| (pool + 1 + pick % (n - 1)) % n)
    }

    fn apply(&mut self, g: &mut Governor, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Acquire { pool, wait_ms, owner_salt } => {
                let pool = pool % self.setups.len();
                let owner = (u64::from(owner_salt) << 32) | self.next_owner;
                self.next_owner += 1;
                let queue_len = self.queues[pool].len() as u32;
                let s = self.setups[pool].clone();
                let budget = wait_ms.min(s.queue_timeout_ms);
                match g.acquire(self.pids[pool], wait_ms, owner, self.now) {
                    Admission::Granted(grant) => {
                        check!(self, queue_len == 0, "p{pool}: a newcomer overtook {queue_len} waiters");
                        self.record_grant(pool, &grant)?;
                        let held = g.pool(self.pids[pool]).held;
                        check!(
                            self,
                            grant.signals.remaining_slots == grant.signals.effective_limit.saturating_sub(held),
                            "remaining_slots {:?} with {held} held",
                            grant.signals
                        );
                    }
                    Admission::Queued(key) => {
                        check!(self, budget > 0, "p{pool}: queued with no wait budget");
                        check!(self, queue_len < s.queue_size, "p{pool}: queued beyond queue.size {}", s.queue_size);
                        let w = self.waiters.len();
                        self.waiters.push(WaiterModel {
                            pool,
                            owner,
                            key,
                            enqueued_at: self.now,
                            // `now` is whole milliseconds, rounded down: the
                            // deadline is one after the budget, never before it.
                            deadline: self.now + budget + 1,
                            state: WaiterState::Waiting,
                        });
                        self.by_owner.insert(owner, w);
                        self.queues[pool].push_back(w);
                    }
                    Admission::Denied(d) => {
                        use nthpool::governor::DenyReason;
                        if d.reason == DenyReason::QueueFull {
                            check!(
                                self,
                                budget > 0 && queue_len >= s.queue_size,
                                "p{pool}: queue_full with {queue_len} of {} queued",
                                s.queue_size
                            );
                        } else {
                            check!(
                                self,
                                budget == 0,
                                "p{pool}: denied ({:?}) instead of queued with budget {budget}",
                                d.reason
                            );
                        }
                        check!(self, d.queued_ms == 0, "fail-fast queued_ms {}", d.queued_ms);
                    }
                }
            }
            Op::Renew { lease, other_pool } => {
                if self.leases.is_empty() {
                    let r = g.renew(self.pids[0], b"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", self.now);
                    check!(self, r == Err(RenewError::NotFound), "renew of nothing: {r:?}");
                    return Ok(());
                }
                let i = lease.index(self.leases.len());
                let pool = self.leases[i].pool;
                let slot = self.leases[i].slot;
                if let Some(other) = other_pool.and_then(|p| self.other_pool(pool, p)) {
                    let r = g.renew(self.pids[other], &slot, self.now);
                    check!(self, r == Err(RenewError::NotFound), "renew through another pool: {r:?}");
                    return Ok(());
                }
                self.touch_expired(i);
                let term = self.setups[pool].term_ms;
                let r = g.renew(self.pids[pool], &slot, self.now);
                let l = &mut self.leases[i];
                let expected = match l.state {
                    LeaseState::Held if l.lease_deadline >= l.request_deadline => Err(RenewError::Capped),
                    LeaseState::Held => Ok((self.now + term).min(l.request_deadline)),
                    _ => Err(RenewError::NotFound),
                };
                if let Ok(deadline) = expected {
                    l.lease_deadline = deadline;
                }
                check!(
                    self,
                    r == expected,
                    "renew of a {:?} lease: {r:?}, expected {expected:?}",
                    self.leases[i].state
                );
            }
            Op::Release { lease, target, ref outcome } => {
                if self.leases.is_empty() {
                    let r = g.release(self.pids[0], b"garbage", outcome.as_ref(), self.now);
                    check!(self, !r, "released garbage");
                    return Ok(());
                }
                let i = lease.index(self.leases.len());
                let pool = self.leases[i].pool;
                let mut slot = self.leases[i].slot;
                let (route, real) = match target {
                    Target::Own => (pool, true),
                    Target::OtherPool(p) => match self.other_pool(pool, p) {
                        Some(other) => (other, false),
                        None => (pool, true),
                    },
                    Target::Forged => {
                        slot[31] = if slot[31] == b'A' { b'B' } else { b'A' };
                        (pool, false)
                    }
                };
                // Only a matching id in its own pool reaches the lazy reclaim.
                if real {
                    self.touch_expired(i);
                }
                let learning = &g.pool(self.pids[route]).learning;
                let (before, limit_before) =
                    (learning.budget().filter(|b| b.reset_at > self.now), learning.budget_limit);
                let released = g.release(self.pids[route], &slot, outcome.as_ref(), self.now);
                let learning = &g.pool(self.pids[route]).learning;
                let (after, limit_after) = (learning.budget(), learning.budget_limit);
                // Inside one reset window a report only lowers `remaining`;
                // only a report of a later window (a later reset), or one
                // announcing a limit above the known one, may raise it.
                let raised = matches!((limit_before, limit_after), (Some(a), Some(b)) if b > a);
                if let (Some(b0), Some(b1)) = (before, after) {
                    check!(
                        self,
                        b1.reset_at > b0.reset_at || b1.remaining <= b0.remaining || raised,
                        "a report raised the budget inside its window: {b0:?} -> {b1:?}"
                    );
                }
                let expected = real && self.leases[i].state == LeaseState::Held;
                check!(
                    self,
                    released == expected,
                    "release ({target:?}) of a {:?} lease answered {released}",
                    self.leases[i].state
                );
                if expected {
                    self.leases[i].state = LeaseState::Released;
                }
            }
            Op::Tick { dt, mode } => {
                let to = self.now + dt;
                match mode {
                    Follow::Keep => {
                        let mut kept_up = true;
                        while let Some(at) = g.next_deadline().filter(|&at| at < to) {
                            // `next_deadline` may name the start of a coarse
                            // slot; advancing there cascades it, never fires
                            // early. A deadline already behind `now` (after a
                            // lazy move) is caught up in one jump.
                            self.keep_up = at >= self.now;
                            self.now = self.now.max(at);
                            self.advance(g)?;
                            if g.next_deadline() == Some(at) {
                                kept_up = false;
                                break;
                            }
                        }
                        self.keep_up = kept_up && self.wheel_now == self.now;
                        self.now = to;
                        self.advance(g)?;
                    }
                    Follow::Jump => {
                        self.now = to;
                        self.keep_up = false;
                        self.advance(g)?;
                    }
                    Follow::Lazy => self.now = to,
                }
            }
            Op::Cancel { waiter, wrong_owner } => {
                if self.waiters.is_empty() {
                    return Ok(());
                }
                let w = waiter.index(self.waiters.len());
                let (key, owner) = (self.waiters[w].key, self.waiters[w].owner);
                if wrong_owner {
                    // Owners are unique, so this one owns nothing.
                    g.cancel_waiter(key, owner ^ (1 << 63), Leaving::ClientGone);
                } else {
                    g.cancel_waiter(key, owner, Leaving::ClientGone);
                    if self.waiters[w].state == WaiterState::Waiting {
                        self.waiters[w].state = WaiterState::Cancelled;
                        let pool = self.waiters[w].pool;
                        self.queues[pool].retain(|&x| x != w);
                    }
                }
            }
            Op::Reconfigure { pool, concurrency } => {
                let pool = pool % self.setups.len();
                self.setups[pool].concurrency = concurrency;
                let configs = pools_config(&self.setups);
                g.reconfigure(&configs, self.now);
                g.grant_after_reload(self.now);
            }
        }
        self.drain(g)
    }

    fn check(&self, g: &Governor) -> Result<(), TestCaseError> {
        let mut held_total = 0;
        let mut queued_total = 0;
        for (p, &pid) in self.pids.iter().enumerate() {
            let pool = g.pool(pid);
            let signals = g.signals(pid, self.now);
            let held = pool.held;
            let model_held = self.held(p);
            check!(self, held == model_held, "p{p}: governor holds {held}, model {model_held}");
            check!(
                self,
                signals.limit == self.setups[p].concurrency,
                "p{p}: limit {} vs concurrency {}",
                signals.limit,
                self.setups[p].concurrency
            );
            check!(
                self,
                (1..=signals.limit).contains(&signals.effective_limit),
                "p{p}: effective limit {} outside 1..={}",
                signals.effective_limit,
                signals.limit
            );
            if self.grants[p] > 0 {
                check!(
                    self,
                    held <= signals.effective_limit,
                    "p{p}: granted up to {held} held over effective limit {}",
                    signals.effective_limit
                );
            }
            if held > signals.effective_limit {
                check!(
                    self,
                    held <= self.held_before[p],
                    "p{p}: held grew from {} to {held} above effective limit {}",
                    self.held_before[p],
                    signals.effective_limit
                );
            }
            let queued = self.queues[p].len() as u32;
            check!(self, signals.queue_depth == queued, "p{p}: queue depth {} vs model {queued}", signals.queue_depth);
            if self.wheel_now == self.now {
                for &w in &self.queues[p] {
                    check!(
                        self,
                        self.waiters[w].deadline > self.now,
                        "p{p}: owner {} still queued past its deadline {}",
                        self.waiters[w].owner,
                        self.waiters[w].deadline
                    );
                }
                if queued > 0 {
                    check!(
                        self,
                        pool.blocked(self.now).is_some(),
                        "p{p}: {queued} waiters left waiting while a slot is free \
                         (held {held}, effective {})",
                        signals.effective_limit
                    );
                }
            }
            held_total += held as usize;
            queued_total += queued as usize;
        }
        check!(self, g.held_total() == held_total, "held_total {} vs {held_total}", g.held_total());
        check!(self, g.queued_total() == queued_total, "queued_total {} vs {queued_total}", g.queued_total());
        // One timer per lease and per waiter, at most one wake-up per pool.
        let timers = g.timers_total();
        check!(
            self,
            timers >= held_total + queued_total && timers <= held_total + queued_total + self.pids.len(),
            "{timers} timers for {held_total} leases, {queued_total} waiters"
        );
        Ok(())
    }

    /// Releases and cancels everything, lets every timer run out, and checks
    /// that nothing is left.
    fn finish(&mut self, g: &mut Governor) -> Result<(), TestCaseError> {
        self.step += 1;
        for w in 0..self.waiters.len() {
            if self.waiters[w].state == WaiterState::Waiting {
                g.cancel_waiter(self.waiters[w].key, self.waiters[w].owner, Leaving::ClientGone);
                self.waiters[w].state = WaiterState::Cancelled;
                let pool = self.waiters[w].pool;
                self.queues[pool].retain(|&x| x != w);
            }
        }
        for i in 0..self.leases.len() {
            self.touch_expired(i);
            let l = &self.leases[i];
            let expected = l.state == LeaseState::Held;
            let released = g.release(self.pids[l.pool], &l.slot, None, self.now);
            check!(self, released == expected, "final release of a {:?} lease answered {released}", l.state);
            self.leases[i].state = LeaseState::Released;
        }
        self.drain(g)?;
        self.now += DRAIN_MS;
        self.advance(g)?;
        check!(self, g.held_total() == 0, "{} leases leaked", g.held_total());
        check!(self, g.queued_total() == 0, "{} waiters leaked", g.queued_total());
        check!(self, g.timers_total() == 0, "{} timers leaked", g.timers_total());
        Ok(())
    }
}

fn run(setups: Vec<PoolSetup>, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut g = Governor::new(&pools_config(&setups), Entropy::seeded(1));
    let mut model = Model::new(setups, &g);
    for (step, op) in ops.iter().enumerate() {
        model.step = step;
        model.held_before = (0..model.pids.len()).map(|p| model.held(p)).collect();
        model.grants.iter_mut().for_each(|n| *n = 0);
        model.apply(&mut g, op)?;
        model.check(&g)?;
    }
    model.finish(&mut g)
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        // Integration tests have no source-relative place for regressions to
        // go; a failure prints its minimal sequence instead.
        failure_persistence: None,
        max_shrink_iters: 100_000,
        ..ProptestConfig::default()
    }
}

fn default_cases() -> u32 {
    std::env::var("NTHPOOL_MODEL_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(96)
}

proptest! {
    #![proptest_config(config(default_cases()))]

    #[test]
    fn governor_matches_model(
        setups in prop::collection::vec(pool_setup(), 1..=3),
        ops in prop::collection::vec(op(), 1..200),
    ) {
        run(setups, &ops)?;
    }
}

proptest! {
    // 4000 cases of at least 250 operations: over 10^6 operations in all.
    #![proptest_config(config(4000))]

    #[test]
    #[ignore = "large run: cargo test --release --test governor_model -- --ignored"]
    fn governor_matches_model_large(
        setups in prop::collection::vec(pool_setup(), 1..=3),
        ops in prop::collection::vec(op(), 250..400),
    ) {
        run(setups, &ops)?;
    }
}

/// The minimal sequence the model found (shrunk from a `Follow::Jump`):
/// a waiter whose queue deadline (320) passed before a lease expired (329)
/// is granted that lease when one `advance(329)` catches up over both,
/// instead of being answered `504` at its deadline. Both wheel entries sit
/// in the same level-1 slot; `Wheel::process_slot` moves every entry due
/// by `now` to `pending` at once and `poll` hands them out last-in first-out,
/// so the later reclaim runs first and pumps the queue.
#[test]
fn a_catching_up_wheel_times_out_a_waiter_before_a_later_reclaim() {
    let setup = PoolSetup {
        concurrency: 1,
        queue_size: 1,
        queue_timeout_ms: 4,
        term_ms: 329,
        request_terms: 1,
        rpm: None,
        adaptive: false,
    };
    let mut g = Governor::new(&pools_config(&[setup]), Entropy::seeded(2));
    let p = g.pool_id("p0").unwrap();
    assert!(matches!(g.acquire(p, 0, 1, 0), Admission::Granted(_)));
    assert!(matches!(g.acquire(p, 4, 2, 316), Admission::Queued(_)));
    g.advance(329);
    let notices: Vec<Notice> = std::iter::from_fn(|| g.pop_notice()).collect();
    assert!(
        matches!(&notices[..], [Notice::TimedOut { owner: 2, .. }]),
        "the waiter's deadline came first: {notices:?}"
    );
}
