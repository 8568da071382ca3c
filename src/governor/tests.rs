//! Governor behaviour driven by a manual clock: no sockets, no sleeps.

use super::*;
use crate::api::pool_settings;
use crate::config::Config;
use crate::governor::lease::SLOT_ID_CHARS;
use crate::time::{Epoch, EpochMs};

pub(super) fn governor(pool_json: &str) -> (Governor, PoolId) {
    governor_seeded(pool_json, 1)
}

/// As `governor`, its random bytes from `seed`: processes that must not
/// share them (a crashed one and its successor) get different seeds.
pub(super) fn governor_seeded(pool_json: &str, seed: u64) -> (Governor, PoolId) {
    let text = format!(r#"{{"pools":{{"p":{{"keys":["k"]{pool_json}}},"other":{{"keys":["k2"]}}}}}}"#);
    let config = Config::parse(text.as_bytes()).unwrap();
    let g = Governor::new(&pool_settings(&config), Entropy::seeded(seed));
    let pid = g.pool_id("p").unwrap();
    (g, pid)
}

pub(super) fn granted(a: Admission) -> Grant {
    match a {
        Admission::Granted(g) => g,
        other => panic!("expected a grant, got {other:?}"),
    }
}

pub(super) fn denied(a: Admission) -> Denial {
    match a {
        Admission::Denied(d) => d,
        other => panic!("expected a denial, got {other:?}"),
    }
}

pub(super) fn queued(a: Admission) -> WaiterKey {
    match a {
        Admission::Queued(k) => k,
        other => panic!("expected to queue, got {other:?}"),
    }
}

fn notices(g: &mut Governor) -> Vec<Notice> {
    std::iter::from_fn(|| g.pop_notice()).collect()
}

pub(super) fn granted_owners(g: &mut Governor) -> Vec<u64> {
    notices(g)
        .into_iter()
        .map(|n| match n {
            Notice::Granted { owner, .. } => owner,
            other => panic!("expected a grant notice, got {other:?}"),
        })
        .collect()
}

pub(super) fn id(grant: &Grant) -> SlotText {
    grant.text
}

const OK: Outcome = Outcome {
    status: Some(200),
    throttled: 0,
    rate: RateInfo {
        limit: None,
        remaining: None,
        reset_ms: None,
        reset_coarse: false,
        reset_instant: false,
        token_limit: None,
        token_remaining: None,
        token_reset_ms: None,
        retry_after_ms: None,
    },
};

#[test]
fn grants_up_to_the_limit_then_fails_fast() {
    let (mut g, p) = governor(r#","concurrency":2,"adaptive":false"#);
    let a = granted(g.acquire(p, 0, 1, 1000));
    assert_eq!(a.lease_deadline, 1000 + 30_000);
    assert_eq!(a.request_deadline, 1000 + 60_000);
    assert_eq!((a.term_ms, a.renew_interval_ms), (30_000, 10_000));
    assert_eq!(a.signals.remaining_slots, 1);
    let b = granted(g.acquire(p, 0, 2, 1000));
    assert_eq!(b.signals.remaining_slots, 0);
    assert_ne!(a.slot, b.slot);
    let d = denied(g.acquire(p, 0, 3, 1000));
    assert_eq!(d.reason, DenyReason::Concurrency);
    assert_eq!(d.retry_after_ms, 1000);
    assert_eq!(d.signals.effective_limit, 2);
    assert_eq!(d.signals.limit, 2);
    assert_eq!(g.pool(p).stats.denied[DenyReason::Concurrency as usize], 1);
}

#[test]
fn release_is_idempotent_and_pool_scoped() {
    let (mut g, p) = governor("");
    let other = g.pool_id("other").unwrap();
    let a = granted(g.acquire(p, 0, 1, 0));
    assert!(!g.release(other, &id(&a), None, 1), "another pool never releases it");
    assert!(g.release(p, &id(&a), None, 1));
    assert!(!g.release(p, &id(&a), None, 2));
    assert!(!g.release(p, b"not-a-slot-id", None, 2));
    assert_eq!(g.pool(p).held, 0);
    assert_eq!(g.held_total(), 0);
    assert_eq!(g.timers_total(), 0, "a released lease leaves no timer behind");
}

#[test]
fn only_the_whole_text_of_a_held_id_finds_it() {
    let (mut g, p) = governor(r#","concurrency":2"#);
    let a = granted(g.acquire(p, 0, 1, 0));
    let b = granted(g.acquire(p, 0, 2, 0));
    // Each character changed, to another base64url one or to one that is
    // not: the index in the first eight may still name the lease.
    let mut tries = 0;
    for at in 0..SLOT_ID_CHARS {
        for c in [b'A', b'_', b'!', b'='] {
            let mut text = id(&a);
            if text[at] == c {
                continue;
            }
            text[at] = c;
            tries += 1;
            assert_eq!(g.renew(p, &text, 10), Err(RenewError::NotFound), "{at}: {}", c as char);
        }
    }
    // Another lease's tail after this one's index; too short; too long.
    let mixed = [&id(&a)[..8], &id(&b)[8..]].concat();
    assert_eq!(g.renew(p, &mixed, 10), Err(RenewError::NotFound));
    assert_eq!(g.renew(p, &id(&a)[..SLOT_ID_CHARS - 1], 10), Err(RenewError::NotFound));
    assert_eq!(g.renew(p, &[&id(&a)[..], b"A"].concat(), 10), Err(RenewError::NotFound));
    assert_eq!(g.pool(p).stats.renew_not_found, tries + 3);
    // The leases are untouched.
    assert_eq!(g.renew(p, &id(&a), 20), Ok(20 + g.pool(p).settings.term_ms));
    assert!(g.release(p, &id(&a), None, 20));
    assert!(g.release(p, &id(&b), None, 20));
}

#[test]
fn a_held_id_releases_by_its_bytes_as_by_its_text() {
    let (mut g, p) = governor("");
    let other = g.pool_id("other").unwrap();
    let a = granted(g.acquire(p, 0, 1, 0));
    assert!(!g.release_id(other, &a.slot, None, 1), "another pool never releases it");
    assert!(g.release_id(p, &a.slot, None, 1));
    assert!(!g.release_id(p, &a.slot, None, 2), "once");
    assert_eq!(g.pool(p).held, 0);
    // Its index taken by a newer grant: the old id finds nothing.
    let b = granted(g.acquire(p, 0, 2, 10));
    assert_eq!(a.slot.index(), b.slot.index());
    assert!(!g.release_id(p, &a.slot, None, 11));
    assert!(g.release(p, &id(&b), None, 12));
}

#[test]
fn renew_extends_and_caps_at_the_request_deadline() {
    let (mut g, p) = governor(r#","termMs":1000,"renewIntervalMs":300,"requestTimeoutMs":2500"#);
    let a = granted(g.acquire(p, 0, 1, 0));
    assert_eq!(g.renew(p, &id(&a), 500), Ok(1500));
    assert_eq!(g.renew(p, &id(&a), 1400), Ok(2400));
    assert_eq!(g.renew(p, &id(&a), 2000), Ok(2500), "capped at requestDeadline");
    assert_eq!(g.renew(p, &id(&a), 2100), Err(RenewError::Capped));
    g.advance(2499);
    assert_eq!(g.pool(p).held, 1);
    g.advance(2500);
    assert_eq!(g.pool(p).held, 0);
    assert_eq!(g.pool(p).stats.reclaimed_cap, 1);
    assert_eq!(g.renew(p, &id(&a), 2600), Err(RenewError::NotFound));
}

#[test]
fn unrenewed_lease_is_reclaimed_at_its_deadline() {
    let (mut g, p) = governor(r#","termMs":1000,"renewIntervalMs":300"#);
    let a = granted(g.acquire(p, 0, 1, 0));
    g.advance(999);
    assert_eq!(g.pool(p).held, 1);
    g.advance(1000);
    assert_eq!(g.pool(p).held, 0);
    assert_eq!(g.pool(p).stats.reclaimed_term, 1);
    assert!(!g.release(p, &id(&a), Some(&OK), 1001));
}

#[test]
fn renewed_lease_survives_its_first_deadline() {
    let (mut g, p) = governor(r#","termMs":1000,"renewIntervalMs":300"#);
    let a = granted(g.acquire(p, 0, 1, 0));
    g.renew(p, &id(&a), 600).unwrap();
    g.advance(1000);
    assert_eq!(g.pool(p).held, 1);
    g.advance(1599);
    assert_eq!(g.pool(p).held, 1);
    g.advance(1600);
    assert_eq!(g.pool(p).held, 0);
}

#[test]
fn renew_after_expiry_fails_even_before_the_wheel_runs() {
    let (mut g, p) = governor(r#","termMs":1000,"renewIntervalMs":300"#);
    let a = granted(g.acquire(p, 0, 1, 0));
    assert_eq!(g.renew(p, &id(&a), 1000), Err(RenewError::NotFound));
    assert_eq!(g.pool(p).held, 0);
    g.advance(5000);
    assert_eq!(g.pool(p).stats.reclaimed_term, 1, "reclaimed once");
}

#[test]
fn waiters_are_granted_in_arrival_order() {
    let (mut g, p) = governor(r#","concurrency":1,"adaptive":false"#);
    let a = granted(g.acquire(p, 0, 100, 0));
    for owner in 1..=5 {
        queued(g.acquire(p, 10_000, owner, owner));
    }
    assert_eq!(g.signals(p, 0).queue_depth, 5);
    let mut holder = a;
    for expected in 1..=5u64 {
        assert!(g.release(p, &id(&holder), None, 100 + expected));
        let n = notices(&mut g);
        assert_eq!(n.len(), 1);
        match &n[0] {
            Notice::Granted { owner, grant } => {
                assert_eq!(*owner, expected);
                assert_eq!(grant.queued_ms, 100 + expected - expected);
                holder = *grant;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(g.queued_total(), 0);
}

#[test]
fn newcomers_never_overtake_waiters() {
    let (mut g, p) = governor(r#","concurrency":1,"adaptive":false"#);
    let a = granted(g.acquire(p, 0, 1, 0));
    queued(g.acquire(p, 1000, 2, 0));
    g.release(p, &id(&a), None, 10);
    assert_eq!(granted_owners(&mut g), vec![2]);
    let d = denied(g.acquire(p, 0, 3, 10));
    assert_eq!(d.reason, DenyReason::Concurrency);
}

#[test]
fn queue_deadline_answers_504_and_is_clamped() {
    let (mut g, p) = governor(r#","concurrency":1,"queue":{"size":10,"timeoutMs":500}"#);
    granted(g.acquire(p, 0, 1, 0));
    queued(g.acquire(p, 60_000, 2, 100));
    // The clock reads whole milliseconds, rounded down: the acquire came
    // at 100 or up to a millisecond later, so 600 could be early.
    g.advance(600);
    assert!(notices(&mut g).is_empty());
    g.advance(601);
    match &notices(&mut g)[..] {
        [Notice::TimedOut { owner: 2, denial }] => {
            assert_eq!(denial.queued_ms, 501);
            assert_eq!(denial.reason, DenyReason::Concurrency);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(g.pool(p).stats.queue_timeouts, 1);
    assert_eq!(g.queued_total(), 0);
    assert_eq!(g.timers_total(), 1, "only the held lease's timer is left");
}

#[test]
fn a_budget_runs_from_when_the_request_was_read() {
    let (mut g, p) = governor(r#","concurrency":1,"queue":{"size":10,"timeoutMs":5000},"adaptive":false"#);
    let held = granted(g.acquire(p, 0, 1, 0));
    // Read at 100, its turn came at 400: 300 of its 500 ms are left.
    queued(g.acquire_read_at(p, 500, 2, 100, 400));
    // Read at 100, its turn at 700: its budget is spent, it is due at once
    // (the next turn, in the same millisecond), not a tick later.
    queued(g.acquire_read_at(p, 500, 3, 100, 700));
    g.advance(600);
    assert!(notices(&mut g).is_empty());
    for (at, owner) in [(601, 2), (700, 3)] {
        g.advance(at);
        match &notices(&mut g)[..] {
            [Notice::TimedOut { owner: o, denial }] if *o == owner => {
                assert_eq!(denial.queued_ms, at - 100, "from when it was read")
            }
            other => panic!("at {at}: {other:?}"),
        }
    }
    // A slot free when its turn comes is granted, however late.
    assert!(g.release(p, &id(&held), None, 800));
    let grant = granted(g.acquire_read_at(p, 500, 4, 100, 900));
    assert_eq!(grant.queued_ms, 0, "it never queued");
}

#[test]
fn a_slot_the_starts_ramp_opens_goes_to_the_queue_when_it_opens() {
    // Adaptive at 64: the start grants 16, then the limit grows with the clock.
    let (mut g, p) = governor(r#","concurrency":64,"queue":{"size":10,"timeoutMs":5000},"adaptive":true"#);
    for owner in 0..16 {
        granted(g.acquire(p, 0, owner, 0));
    }
    queued(g.acquire(p, 5000, 100, 0));
    // The 17th slot comes 6.25 ms in: at 7 the waiter has it, and a
    // newcomer is told none is left.
    g.advance(6);
    assert!(notices(&mut g).is_empty());
    g.advance(7);
    assert_eq!(granted_owners(&mut g), vec![100]);
    let d = denied(g.acquire(p, 0, 200, 7));
    assert_eq!((d.reason, d.signals.remaining_slots, d.signals.queue_depth), (DenyReason::Concurrency, 0, 0));
    assert_eq!(d.signals.effective_limit, 17);
}

#[test]
fn full_queue_fails_at_once() {
    let (mut g, p) = governor(r#","concurrency":1,"queue":{"size":2,"timeoutMs":5000}"#);
    granted(g.acquire(p, 0, 1, 0));
    queued(g.acquire(p, 1000, 2, 0));
    queued(g.acquire(p, 1000, 3, 0));
    let d = denied(g.acquire(p, 1000, 4, 0));
    assert_eq!(d.reason, DenyReason::QueueFull);
    assert_eq!(d.signals.queue_depth, 2);
}

#[test]
fn zero_wait_or_zero_queue_timeout_fails_fast() {
    let (mut g, p) = governor(r#","concurrency":1,"queue":{"size":10,"timeoutMs":0}"#);
    granted(g.acquire(p, 0, 1, 0));
    let d = denied(g.acquire(p, 5000, 2, 0));
    assert_eq!(d.reason, DenyReason::Concurrency);
}

/// `waiters_gone` counts the waiters whose client went away (or
/// half-closed), not those the server answered (a stop, a reload's
/// recheck, a pipeline too deep).
#[test]
fn only_a_waiter_whose_client_went_away_counts_as_gone() {
    let (mut g, p) = governor(r#","concurrency":1,"adaptive":false"#);
    granted(g.acquire(p, 0, 1, 0));
    let keys: Vec<WaiterKey> = (2..=5).map(|owner| queued(g.acquire(p, 5000, owner, 0))).collect();
    g.cancel_waiter(keys[0], 2, Leaving::ClientGone);
    g.cancel_waiter(keys[1], 3, Leaving::Answered);
    assert!(g.withdraw_waiter(keys[2], 4, 10, Leaving::ClientGone).is_some());
    assert!(g.withdraw_waiter(keys[3], 5, 10, Leaving::Answered).is_some());
    assert_eq!(g.signals(p, 10).queue_depth, 0);
    assert_eq!(g.pool(p).stats.waiters_gone, 2);
    assert_eq!(g.pool(p).stats.queue_timeouts, 0);
}

#[test]
fn a_cancelled_waiter_is_never_granted_and_leaks_nothing() {
    let (mut g, p) = governor(r#","concurrency":1,"adaptive":false"#);
    let a = granted(g.acquire(p, 0, 1, 0));
    let k2 = queued(g.acquire(p, 5000, 2, 0));
    queued(g.acquire(p, 5000, 3, 0));
    g.cancel_waiter(k2, 999, Leaving::ClientGone); // wrong owner: no effect
    assert_eq!(g.signals(p, 0).queue_depth, 2);
    g.cancel_waiter(k2, 2, Leaving::ClientGone);
    assert_eq!(g.signals(p, 0).queue_depth, 1);
    g.release(p, &id(&a), None, 10);
    assert_eq!(granted_owners(&mut g), vec![3]);
    g.advance(100_000);
    assert!(notices(&mut g).is_empty());
    assert_eq!(g.queued_total(), 0);
    assert_eq!(g.held_total(), 0);
    assert_eq!(g.timers_total(), 0);
}

#[test]
fn a_reclaim_grants_the_head_waiter() {
    let (mut g, p) = governor(r#","concurrency":1,"termMs":1000,"renewIntervalMs":300"#);
    granted(g.acquire(p, 0, 1, 0));
    queued(g.acquire(p, 5000, 2, 10));
    g.advance(1000);
    match &notices(&mut g)[..] {
        [Notice::Granted { owner: 2, grant }] => assert_eq!(grant.queued_ms, 990),
        other => panic!("{other:?}"),
    }
}

#[test]
fn rpm_gate_denies_with_time_to_next_token_and_wakes_waiters() {
    // 60 rpm, burst 2: a token every second.
    let (mut g, p) = governor(r#","rpm":60,"rpmBurst":2,"adaptive":false"#);
    let a = granted(g.acquire(p, 0, 1, 0));
    assert_eq!(a.signals.rpm_remaining, Some(1));
    granted(g.acquire(p, 0, 2, 0));
    let d = denied(g.acquire(p, 0, 3, 250));
    assert_eq!(d.reason, DenyReason::Rate);
    assert_eq!(d.retry_after_ms, 750);
    assert_eq!(d.signals.rpm_remaining, Some(0));
    queued(g.acquire(p, 5000, 4, 300));
    queued(g.acquire(p, 5000, 5, 300));
    g.advance(999);
    assert!(notices(&mut g).is_empty());
    g.advance(1000);
    assert_eq!(granted_owners(&mut g), vec![4]);
    g.advance(2000);
    assert_eq!(granted_owners(&mut g), vec![5]);
    // Back to a full bucket after idling.
    g.advance(10_000);
    assert_eq!(g.signals(p, 10_000).rpm_remaining, Some(0), "refill is lazy until asked");
    let a = granted(g.acquire(p, 0, 6, 10_000));
    assert_eq!(a.signals.rpm_remaining, Some(1));
}

#[test]
fn a_burst_of_throttled_reports_cuts_the_limit_to_the_calls_in_flight() {
    let (mut g, p) = governor(r#","concurrency":10"#);
    let grants: Vec<_> = (0..10).map(|i| granted(g.acquire(p, 0, i, 0))).collect();
    let throttled = Outcome { status: Some(429), ..OK };
    for grant in &grants[..5] {
        assert!(g.release(p, &id(grant), Some(&throttled), 10));
    }
    assert_eq!(g.signals(p, 0).effective_limit, 5);
    assert_eq!(g.signals(p, 0).remaining_slots, 0);
    assert_eq!(denied(g.acquire(p, 0, 99, 20)).reason, DenyReason::Concurrency);
}

/// A release without a report is a call its caller did not see refused
/// (the lock API asks for outcome fields when a call saw throttling): at
/// full use it counts towards growing a cut limit back, as a reported 200
/// does, and it ends a run of refusals, so isolated 429s between such
/// calls never add up to a pool-wide pause.
#[test]
fn releases_without_a_report_grow_a_cut_limit_back_and_end_a_run_of_refusals() {
    let (mut g, p) = governor(r#","concurrency":8"#);
    let throttled = Outcome { status: Some(429), ..OK };
    let held: Vec<_> = (0..4).map(|i| granted(g.acquire(p, 0, i, 0))).collect();
    let refused = granted(g.acquire(p, 0, 4, 0));
    g.release(p, &id(&refused), Some(&throttled), 10);
    assert_eq!(g.pool(p).effective_limit(), 4, "cut to the calls beside the refused one");
    for grant in &held {
        g.release(p, &id(grant), None, 20);
    }
    // Calls at full use, each released without a report: the step onto
    // the refused level waits `PROBE_WAIT_MIN` of them.
    let mut now = 100;
    for round in 0..1_000u64 {
        let limit = g.pool(p).effective_limit();
        let grants: Vec<_> = (0..limit).map(|i| granted(g.acquire(p, 0, round * 100 + u64::from(i), now))).collect();
        for grant in &grants {
            g.release(p, &id(grant), None, now + 5);
        }
        now += 10;
    }
    assert_eq!(g.pool(p).effective_limit(), 8, "grown back to concurrency");

    // A 429 with a retry hint now and then, many silent successes between:
    // the pool never pauses.
    let (mut g, p) = governor(r#","concurrency":8"#);
    let hinted = Outcome { status: Some(429), rate: RateInfo { retry_after_ms: Some(10_000), ..OK.rate }, ..OK };
    let mut now = 0;
    for round in 0..3u64 {
        for i in 0..50 {
            let grant = granted(g.acquire(p, 0, round * 100 + i, now));
            g.release(p, &id(&grant), None, now + 1);
            now += 2;
        }
        let grant = granted(g.acquire(p, 0, round * 100 + 99, now));
        g.release(p, &id(&grant), Some(&hinted), now + 1);
        now += 2;
    }
    assert_eq!(g.pool(p).learning.cooldown_until, 0, "no pause");
    granted(g.acquire(p, 0, 1_000, now));
}

/// A report with no status and no 429 (`{}`, `{"throttled":0}`) says what
/// a release without a report says: the call was not refused. A limit cut
/// by a 429 grows back on such reports as on silent releases; a `503`
/// report is not a success and grows nothing.
#[test]
fn reports_without_a_status_or_a_429_grow_a_cut_limit_back() {
    // What `{}` and `{"throttled":0}` parse to.
    let unrefused = Outcome::default();
    let failed = Outcome { status: Some(503), ..OK };
    // No status, but a retry hint: the call may have been refused.
    let hinted = Outcome { rate: RateInfo { retry_after_ms: Some(2_000), ..OK.rate }, ..unrefused };
    for (report, grows) in [(unrefused, true), (failed, false), (hinted, false)] {
        let (mut g, p) = governor(r#","concurrency":8"#);
        let held: Vec<_> = (0..4).map(|i| granted(g.acquire(p, 0, i, 0))).collect();
        let refused = granted(g.acquire(p, 0, 4, 0));
        g.release(p, &id(&refused), Some(&Outcome { status: Some(429), ..OK }), 10);
        assert_eq!(g.pool(p).effective_limit(), 4, "cut to the calls beside the refused one");
        for grant in &held {
            g.release(p, &id(grant), Some(&report), 20);
        }
        let mut now = 100;
        for round in 0..1_000u64 {
            let limit = g.pool(p).effective_limit();
            let grants: Vec<_> =
                (0..limit).map(|i| granted(g.acquire(p, 0, round * 100 + u64::from(i), now))).collect();
            for grant in &grants {
                g.release(p, &id(grant), Some(&report), now + 5);
            }
            now += 10;
        }
        let limit = g.pool(p).effective_limit();
        assert_eq!(limit == 8, grows, "{report:?}: limit {limit}");
    }
}

#[test]
fn a_lowered_limit_never_revokes_held_slots() {
    let (mut g, p) = governor(r#","concurrency":4"#);
    let grants: Vec<_> = (0..4).map(|i| granted(g.acquire(p, 0, i, 0))).collect();
    let throttled = Outcome { status: Some(429), ..OK };
    g.release(p, &id(&grants[0]), Some(&throttled), 1);
    // Cut to the three calls still in flight: none free.
    assert_eq!(g.pool(p).held, 3);
    assert_eq!(g.signals(p, 0).effective_limit, 3);
    assert_eq!(denied(g.acquire(p, 0, 9, 2)).reason, DenyReason::Concurrency);
}

#[test]
fn a_report_on_an_already_released_slot_changes_nothing() {
    let (mut g, p) = governor(r#","concurrency":10"#);
    let a = granted(g.acquire(p, 0, 1, 0));
    assert!(g.release(p, &id(&a), None, 1));
    let throttled = Outcome { status: Some(429), rate: RateInfo { retry_after_ms: Some(5000), ..OK.rate }, ..OK };
    assert!(!g.release(p, &id(&a), Some(&throttled), 2));
    assert_eq!(g.signals(p, 0).effective_limit, 10);
    granted(g.acquire(p, 0, 2, 3));
}

#[test]
fn cooldown_denies_fail_fast_and_grants_waiters_when_it_ends() {
    let (mut g, p) = governor(r#","concurrency":4"#);
    let a = granted(g.acquire(p, 0, 1, 0));
    // A rate refusal (the budget is spent): pool-wide evidence.
    let hint = Outcome {
        status: Some(429),
        rate: RateInfo { retry_after_ms: Some(1000), remaining: Some(0), reset_ms: Some(1000), ..OK.rate },
        ..OK
    };
    g.release(p, &id(&a), Some(&hint), 100);
    let d = denied(g.acquire(p, 0, 2, 200));
    assert_eq!(d.reason, DenyReason::Cooldown);
    assert_eq!(d.retry_after_ms, 900);
    queued(g.acquire(p, 5000, 3, 300));
    queued(g.acquire(p, 5000, 4, 400));
    g.advance(1099);
    assert!(notices(&mut g).is_empty());
    g.advance(1100);
    assert_eq!(granted_owners(&mut g), vec![3, 4]);
}

#[test]
fn learned_budget_blocks_until_reset() {
    let (mut g, p) = governor(r#","concurrency":10"#);
    let a = granted(g.acquire(p, 0, 1, 0));
    let report = Outcome { rate: RateInfo { remaining: Some(0), reset_ms: Some(700), ..OK.rate }, ..OK };
    g.release(p, &id(&a), Some(&report), 100);
    let d = denied(g.acquire(p, 0, 2, 100));
    assert_eq!(d.reason, DenyReason::Rate);
    assert_eq!(d.retry_after_ms, 700);
    queued(g.acquire(p, 5000, 3, 200));
    g.advance(799);
    assert!(notices(&mut g).is_empty());
    g.advance(800);
    assert_eq!(granted_owners(&mut g), vec![3]);
}

/// A cool-down and a spent budget both block: the answer names the gate
/// that opens last, with its wait, and waiters are woken when it opens.
#[test]
fn a_budget_spent_past_a_cooldown_decides_the_denial_and_the_wake() {
    let (mut g, p) = governor(r#","concurrency":10,"queue":{"size":10,"timeoutMs":200000}"#);
    let a = granted(g.acquire(p, 0, 1, 0));
    // `Retry-After: 30`, budget 100 spent until 90 s.
    let refused = Outcome {
        status: Some(429),
        throttled: 1,
        rate: RateInfo {
            limit: Some(100),
            remaining: Some(0),
            reset_ms: Some(90_000),
            retry_after_ms: Some(30_000),
            ..OK.rate
        },
    };
    g.release(p, &id(&a), Some(&refused), 0);
    let d = denied(g.acquire(p, 0, 2, 10));
    assert_eq!((d.reason, d.retry_after_ms), (DenyReason::Rate, 89_990));
    queued(g.acquire(p, 200_000, 3, 20));
    assert_eq!(g.pool(p).wake.map(|(at, _)| at), Some(90_000), "woken when the budget opens");
    g.advance(30_000);
    assert!(notices(&mut g).is_empty());
    let d = denied(g.acquire(p, 0, 4, 30_000));
    assert_eq!((d.reason, d.retry_after_ms), (DenyReason::Rate, 60_000));
    g.advance(89_999);
    assert!(notices(&mut g).is_empty());
    g.advance(90_000);
    assert_eq!(granted_owners(&mut g), vec![3]);

    // The budget's reset is 500 s away, the cool-down capped at 120 s.
    let (mut g, p) = governor(r#","concurrency":10"#);
    let a = granted(g.acquire(p, 0, 1, 0));
    let refused = Outcome {
        rate: RateInfo { remaining: Some(0), reset_ms: Some(500_000), retry_after_ms: Some(500_000), ..OK.rate },
        ..refused
    };
    g.release(p, &id(&a), Some(&refused), 0);
    let d = denied(g.acquire(p, 0, 2, 0));
    assert_eq!((d.reason, d.retry_after_ms), (DenyReason::Rate, 500_000));
    // A cool-down that outlasts the budget still decides.
    let (mut g, p) = governor(r#","concurrency":10"#);
    let a = granted(g.acquire(p, 0, 1, 0));
    let refused = Outcome { rate: RateInfo { reset_ms: Some(5_000), ..refused.rate }, ..refused };
    g.release(p, &id(&a), Some(&refused), 0);
    let d = denied(g.acquire(p, 0, 2, 0));
    assert_eq!((d.reason, d.retry_after_ms), (DenyReason::Cooldown, 120_000));
}

/// A spent token window blocks grants until its reset; a report of a call
/// granted after the one that set the block is a newer view of the window:
/// tokens left lift the block at once, a sooner reset moves it earlier. A
/// call granted before it can only make it longer.
#[test]
fn a_newer_calls_report_lifts_or_moves_a_token_block_and_an_older_one_cannot() {
    let tokens = |left: u64, reset_ms: u64| Outcome {
        rate: RateInfo {
            token_limit: Some(100_000),
            token_remaining: Some(left),
            token_reset_ms: Some(reset_ms),
            ..OK.rate
        },
        ..OK
    };
    let (mut g, p) = governor(r#","concurrency":10"#);
    let (old, blocking, newer) =
        (granted(g.acquire(p, 0, 1, 0)), granted(g.acquire(p, 0, 2, 0)), granted(g.acquire(p, 0, 3, 0)));
    g.release(p, &id(&blocking), Some(&tokens(0, 3_600_000)), 10);
    let d = denied(g.acquire(p, 0, 4, 20));
    assert_eq!((d.reason, d.retry_after_ms), (DenyReason::Rate, 3_599_990));
    // The older call saw tokens left before the window was spent: no change.
    g.release(p, &id(&old), Some(&tokens(90_000, 2_000)), 30);
    assert_eq!(denied(g.acquire(p, 0, 5, 40)).retry_after_ms, 3_599_970);
    // The newer one sees tokens left: the block ends.
    g.release(p, &id(&newer), Some(&tokens(90_000, 2_000)), 50);
    granted(g.acquire(p, 0, 6, 60));

    // A newer call's sooner reset moves the block earlier; waiters are
    // granted when it ends.
    let (mut g, p) = governor(r#","concurrency":10,"queue":{"size":10,"timeoutMs":60000}"#);
    let (blocking, newer) = (granted(g.acquire(p, 0, 1, 0)), granted(g.acquire(p, 0, 2, 0)));
    g.release(p, &id(&blocking), Some(&tokens(0, 3_600_000)), 10);
    queued(g.acquire(p, 60_000, 7, 20));
    g.release(p, &id(&newer), Some(&tokens(0, 2_000)), 30);
    assert_eq!(denied(g.acquire(p, 0, 8, 40)).retry_after_ms, 1_990);
    g.advance(2_030);
    assert_eq!(granted_owners(&mut g), [7]);
}

/// The learned budget is a rate gate: its remaining grants are in
/// `rpm_remaining`, the smaller of the two when the pool also has `rpm`.
#[test]
fn rpm_remaining_reports_the_learned_budget() {
    let (mut g, p) = governor(r#","concurrency":10"#);
    let a = granted(g.acquire(p, 0, 1, 0));
    assert_eq!(a.signals.rpm_remaining, None, "no rate gate");
    let report =
        Outcome { rate: RateInfo { limit: Some(10), remaining: Some(3), reset_ms: Some(1000), ..OK.rate }, ..OK };
    g.release(p, &id(&a), Some(&report), 0);
    let b = granted(g.acquire(p, 0, 2, 10));
    assert_eq!(b.signals.rpm_remaining, Some(2));
    let report = Outcome { rate: RateInfo { remaining: Some(0), ..report.rate }, ..OK };
    g.release(p, &id(&b), Some(&report), 20);
    let d = denied(g.acquire(p, 0, 3, 30));
    assert_eq!((d.reason, d.signals.rpm_remaining), (DenyReason::Rate, Some(0)));
    // Past the reset, the window counts as refilled to the known limit.
    assert_eq!(g.signals(p, 1000).rpm_remaining, Some(10));

    // With `rpm` too: the smaller of the two.
    let (mut g, p) = governor(r#","concurrency":10,"rpm":60,"rpmBurst":5"#);
    let a = granted(g.acquire(p, 0, 1, 0));
    assert_eq!(a.signals.rpm_remaining, Some(4));
    let report = Outcome { rate: RateInfo { remaining: Some(2), reset_ms: Some(60_000), ..OK.rate }, ..OK };
    g.release(p, &id(&a), Some(&report), 0);
    let b = granted(g.acquire(p, 0, 2, 0));
    assert_eq!(b.signals.rpm_remaining, Some(1), "budget 1 left, bucket 3");
}

/// A spent token window is a rate gate too: while it holds the pool the
/// header says no grant is left, even beside a request budget with room.
#[test]
fn rpm_remaining_is_0_while_a_spent_token_window_holds_the_pool() {
    let (mut g, p) = governor(r#","concurrency":10"#);
    let a = granted(g.acquire(p, 0, 1, 0));
    let b = granted(g.acquire(p, 0, 2, 0));
    let tokens_spent = Outcome {
        rate: RateInfo { token_limit: Some(1000), token_remaining: Some(0), token_reset_ms: Some(1500), ..OK.rate },
        ..OK
    };
    g.release(p, &id(&a), Some(&tokens_spent), 0);
    let d = denied(g.acquire(p, 0, 3, 10));
    assert_eq!((d.reason, d.signals.rpm_remaining), (DenyReason::Rate, Some(0)));
    // With a request budget that has room, the token window still decides.
    let requests_left =
        Outcome { rate: RateInfo { limit: Some(10), remaining: Some(9), reset_ms: Some(60_000), ..OK.rate }, ..OK };
    g.release(p, &id(&b), Some(&requests_left), 20);
    let d = denied(g.acquire(p, 0, 4, 30));
    assert_eq!((d.reason, d.signals.rpm_remaining), (DenyReason::Rate, Some(0)));
    // Past the token reset the request budget is what is left.
    let e = granted(g.acquire(p, 0, 5, 1500));
    assert_eq!(e.signals.rpm_remaining, Some(8));
}

#[test]
fn raising_the_limit_grants_waiters_and_removing_a_pool_answers_them() {
    let (mut g, p) = governor(r#","concurrency":1"#);
    let a = granted(g.acquire(p, 0, 1, 0));
    queued(g.acquire(p, 5000, 2, 0));
    queued(g.acquire(p, 5000, 3, 0));
    let raised = Config::parse(br#"{"pools":{"p":{"keys":["k"],"concurrency":2},"other":{"keys":["k2"]}}}"#).unwrap();
    g.reconfigure(&pool_settings(&raised), 10);
    assert!(notices(&mut g).is_empty(), "the reload grants nothing before its caller has rechecked the waiters");
    g.grant_after_reload(10);
    assert_eq!(granted_owners(&mut g), vec![2]);
    assert_eq!(g.pool(p).held, 2);
    let removed = Config::parse(br#"{"pools":{"other":{"keys":["k2"]}}}"#).unwrap();
    g.reconfigure(&pool_settings(&removed), 20);
    assert!(matches!(&notices(&mut g)[..], [Notice::TimedOut { owner: 3, .. }]));
    assert!(g.pool(p).retired);
    assert_eq!(denied(g.acquire(p, 0, 4, 30)).reason, DenyReason::Concurrency);
    assert!(g.release(p, &id(&a), None, 40), "leases of a removed pool still drain");
    assert_eq!(g.timers_total(), 1);
}

/// A removed pool keeps what its leases need until they end; drained, it
/// gives its `Idempotency-Key` room back (about 790 KB at the default
/// bound), and a reload that names it again makes the room anew.
#[test]
fn a_removed_pool_gives_back_its_key_room_once_drained() {
    let (mut g, p) = governor("");
    let key = crate::governor::idempotency::IdemKey::new(7, b"job").unwrap();
    let Ok(Admission::Granted(a)) = g.acquire_keyed(p, &key, 0, 1, 0) else { panic!("granted") };
    let removed = Config::parse(br#"{"pools":{"other":{"keys":["k2"]}}}"#).unwrap();
    g.reconfigure(&pool_settings(&removed), 10);
    g.shed_drained();
    assert!(g.pool(p).idem.has_room(), "its lease still holds a key");
    assert!(g.release(p, &id(&a), None, 20));
    g.shed_drained();
    assert!(!g.pool(p).idem.has_room(), "drained, its room is given back");
    let again = Config::parse(br#"{"pools":{"p":{"keys":["k"]},"other":{"keys":["k2"]}}}"#).unwrap();
    g.reconfigure(&pool_settings(&again), 30);
    g.shed_drained();
    let Ok(Admission::Granted(b)) = g.acquire_keyed(p, &key, 0, 2, 40) else { panic!("granted") };
    let Ok(Admission::Granted(retry)) = g.acquire_keyed(p, &key, 0, 3, 50) else { panic!("the same grant") };
    assert_eq!(retry.slot, b.slot, "keys work again in the pool named again");
}

/// A token's wake-up and a lease's deadline in the same millisecond: the
/// lease is reclaimed first, so the grant the token wakes tells the room
/// left without the lease that just ended.
#[test]
fn a_grant_woken_by_a_token_as_a_lease_ends_does_not_count_that_lease() {
    let (mut g, p) = governor(
        r#","concurrency":4,"rpm":6000,"rpmBurst":1,"termMs":30,"renewIntervalMs":10,"requestTimeoutMs":3000,"adaptive":false"#,
    );
    let a = granted(g.acquire(p, 0, 1, 0));
    assert_eq!(a.lease_deadline, 30);
    queued(g.acquire(p, 2000, 2, 1));
    g.advance(10);
    queued(g.acquire(p, 2000, 3, 11));
    g.advance(20);
    queued(g.acquire(p, 2000, 4, 21));
    assert_eq!(granted_owners(&mut g), vec![2, 3]);
    g.advance(30);
    let grants: Vec<Grant> = notices(&mut g)
        .into_iter()
        .filter_map(|n| match n {
            Notice::Granted { grant, .. } => Some(grant),
            _ => None,
        })
        .collect();
    assert_eq!(grants.len(), 1, "the waiter granted at 30");
    assert_eq!(g.pool(p).held, 3, "a's lease ended at 30");
    assert_eq!(grants[0].signals.remaining_slots, 1, "4 less the 3 held after this grant");
}

/// A turn that comes late (a busy loop, a paused process) fires several
/// milliseconds' deadlines at once: a slot that came free before a waiter's
/// deadline goes to that waiter, as it would have on time.
#[test]
fn a_late_advance_grants_a_waiter_the_token_that_came_before_its_deadline() {
    // 60 rpm, burst 1: the next token at 1000.
    let (mut g, p) = governor(r#","rpm":60,"rpmBurst":1,"adaptive":false"#);
    granted(g.acquire(p, 0, 1, 0));
    queued(g.acquire(p, 1000, 2, 100));
    g.advance(1200);
    assert_eq!(granted_owners(&mut g), vec![2], "the token at 1000 came before its deadline at 1101");
}

/// A lease that ends in the millisecond a waiter's deadline comes: the
/// waiter has timed out (its budget has passed), and the slot goes to the
/// next one, whichever of the two timers the wheel hands out first.
#[test]
fn a_waiter_whose_deadline_it_is_times_out_when_a_lease_ends_in_that_millisecond() {
    for renewed in [false, true] {
        let (mut g, p) = governor(r#","concurrency":1,"termMs":300,"renewIntervalMs":100,"adaptive":false"#);
        let a = granted(g.acquire(p, 0, 1, 0));
        // Renewed, the lease's timer fires at 300 and is armed again
        // for 550, after the waiters': the wheel then hands it out last.
        let (budget, end) = if renewed { (449, 550) } else { (199, 300) };
        queued(g.acquire(p, budget, 2, 100));
        queued(g.acquire(p, 5_000, 3, 150));
        if renewed {
            assert_eq!(g.renew(p, &id(&a), 250), Ok(550));
            g.advance(300);
        }
        g.advance(end);
        let answered: Vec<(u64, bool)> = notices(&mut g)
            .into_iter()
            .map(|n| match n {
                Notice::Granted { owner, .. } => (owner, true),
                Notice::TimedOut { owner, .. } => (owner, false),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(answered, [(2, false), (3, true)], "renewed: {renewed}");
    }
}

/// A late turn fires a lease's timer, finds it renewed to a deadline it
/// has also passed, and arms it again: the lease ends before a waiter's
/// deadline that the wheel had found due with the timer, so the waiter gets
/// its slot rather than timing out before the lease is reclaimed.
#[test]
fn a_late_advance_reclaims_a_renewed_lease_before_a_later_waiter_deadline() {
    let (mut g, p) = governor(r#","concurrency":1,"termMs":300,"renewIntervalMs":100,"adaptive":false"#);
    let a = granted(g.acquire(p, 0, 1, 0));
    // Its timer stays at 300; the lease now ends at 310.
    assert_eq!(g.renew(p, &id(&a), 10), Ok(310));
    // Deadline 315: after the lease's end, in the same stretch of the wheel.
    queued(g.acquire(p, 214, 2, 100));
    queued(g.acquire(p, 5_000, 3, 150));
    g.advance(1_000);
    assert_eq!(granted_owners(&mut g), vec![2], "the lease ended at 310, before the waiter's deadline at 315");
}

/// A late turn pumps a queue a reclaim freed before the next deadline
/// fires, as it stood then: a token that came only after a waiter's
/// deadline does not go to that waiter, which times out as on time, and the
/// next one gets it.
#[test]
fn a_late_advance_grants_no_waiter_a_token_that_came_after_its_deadline() {
    // 60 rpm, burst 1: the next token at 1000.
    let (mut g, p) =
        governor(r#","concurrency":1,"termMs":300,"renewIntervalMs":100,"rpm":60,"rpmBurst":1,"adaptive":false"#);
    granted(g.acquire(p, 0, 1, 0));
    queued(g.acquire(p, 399, 2, 100));
    queued(g.acquire(p, 5_000, 3, 150));
    // The lease ends at 300, waiter 2's deadline is 500, the token comes at 1000.
    g.advance(1_200);
    let answered: Vec<(u64, bool)> = notices(&mut g)
        .into_iter()
        .map(|n| match n {
            Notice::Granted { owner, .. } => (owner, true),
            Notice::TimedOut { owner, .. } => (owner, false),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(answered, [(2, false), (3, true)]);
}

#[test]
fn a_held_lease_keeps_the_term_it_was_granted_with_across_a_reload() {
    let (mut g, p) = governor(r#","termMs":1000,"renewIntervalMs":300,"requestTimeoutMs":60000"#);
    let key = crate::governor::idempotency::IdemKey::new(7, b"retry").unwrap();
    let Ok(Admission::Granted(a)) = g.acquire_keyed(p, &key, 0, 1, 0) else { panic!("granted") };
    let shorter = Config::parse(
        br#"{"pools":{"p":{"keys":["k"],"termMs":100,"renewIntervalMs":30,"requestTimeoutMs":60000},"other":{"keys":["k2"]}}}"#,
    )
    .unwrap();
    g.reconfigure(&pool_settings(&shorter), 10);
    // Its holder renews every 300 ms, as its grant said: a 100 ms term would lose it.
    assert_eq!(g.renew(p, &id(&a), 300), Ok(1300), "renewed by its own term");
    assert_eq!(g.renew(p, &id(&a), 600), Ok(1600));
    // A retry of its acquire is told the lease's term, and the pool's ratio of renewals to it.
    let Ok(Admission::Granted(again)) = g.acquire_keyed(p, &key, 0, 2, 700) else { panic!("the same grant") };
    assert_eq!((again.slot, again.term_ms, again.renew_interval_ms), (a.slot, 1000, 300));
    // A new grant has the new term.
    let b = granted(g.acquire(p, 0, 3, 700));
    assert_eq!((b.term_ms, b.renew_interval_ms, b.lease_deadline), (100, 30, 800));
    assert_eq!(g.renew(p, &id(&b), 750), Ok(850));
}

/// A keyed retry that cannot wait takes no queued acquire's place: with no
/// wait budget, or with one the pool's queue timeout clamps to nothing (a
/// reload set it to 0 while the first waited).
#[test]
fn a_keyed_retry_that_cannot_wait_leaves_the_queued_one_in_place() {
    let (mut g, p) = governor(r#","concurrency":1"#);
    let key = crate::governor::idempotency::IdemKey::new(7, b"job").unwrap();
    granted(g.acquire(p, 0, 1, 0));
    assert!(matches!(g.acquire_keyed(p, &key, 5000, 2, 0), Ok(Admission::Queued(_))));
    assert!(matches!(g.acquire_keyed(p, &key, 0, 3, 10), Ok(Admission::Denied(_))), "no wait budget");
    let no_queue = Config::parse(
        br#"{"pools":{"p":{"keys":["k"],"concurrency":1,"queue":{"timeoutMs":0}},"other":{"keys":["k2"]}}}"#,
    )
    .unwrap();
    g.reconfigure(&pool_settings(&no_queue), 20);
    assert!(matches!(g.acquire_keyed(p, &key, 5000, 4, 30), Ok(Admission::Denied(_))), "clamped to nothing");
    assert!(notices(&mut g).iter().all(|n| !matches!(n, Notice::Superseded { .. })), "nothing superseded");
}

#[test]
fn a_reload_that_turns_learning_or_the_rate_gate_off_and_on_starts_them_afresh() {
    let with = |extra: &str| {
        let text = format!(r#"{{"pools":{{"p":{{"keys":["k"],"concurrency":8{extra}}},"other":{{"keys":["k2"]}}}}}}"#);
        pool_settings(&Config::parse(text.as_bytes()).unwrap())
    };
    let (mut g, p) = governor(r#","concurrency":8,"rpm":60,"rpmBurst":3"#);
    let slots: Vec<Grant> = (0..3).map(|i| granted(g.acquire(p, 0, i, 0))).collect();
    assert_eq!(g.pool(p).rpm_remaining(), Some(0));
    let throttled = Outcome { status: Some(429), throttled: 1, ..OK };
    for s in &slots {
        g.release(p, &id(s), Some(&throttled), 10);
    }
    assert!(g.pool(p).effective_limit() < 8, "cut by the refusals");
    g.reconfigure(&with(r#","adaptive":false"#), 20);
    assert_eq!(g.pool(p).effective_limit(), 8, "learning off: the configured limit");
    assert_eq!(g.pool(p).rpm_remaining(), None, "no gate");
    g.reconfigure(&with(r#","rpm":60,"rpmBurst":3"#), 30);
    assert_eq!(g.pool(p).rpm_remaining(), Some(3), "a gate a reload adds starts full");
    assert_eq!(g.pool(p).effective_limit(), 8, "learning on again starts from the configured limit");
    assert_eq!(granted(g.acquire(p, 0, 9, 30)).signals.rpm_remaining, Some(2));
}

#[test]
fn undelivered_grant_is_released() {
    let (mut g, p) = governor(r#","concurrency":1"#);
    let a = granted(g.acquire(p, 0, 1, 0));
    g.release_undelivered(&a.slot, 5);
    assert_eq!(g.pool(p).held, 0);
    granted(g.acquire(p, 0, 2, 6));
}

/// A keyed grant answered twice (the first acquire, then its retry) is not
/// released when one answer fails to arrive: the other may have, and its
/// holder works with it. When both are lost, none arrived: it is released.
#[test]
fn a_grant_an_idempotent_retry_was_answered_with_goes_back_only_with_its_last_answer() {
    let (mut g, p) = governor(r#","concurrency":1,"termMs":1000,"renewIntervalMs":300"#);
    let key = crate::governor::idempotency::IdemKey::new(7, b"job").unwrap();
    let Ok(Admission::Granted(first)) = g.acquire_keyed(p, &key, 0, 1, 0) else { panic!("granted") };
    let Ok(Admission::Granted(again)) = g.acquire_keyed(p, &key, 0, 2, 10) else { panic!("the same grant") };
    assert_eq!(again.slot, first.slot);
    g.release_undelivered(&again.slot, 20);
    assert_eq!(g.pool(p).held, 1, "the retry's lost answer leaves the first one's holder its slot");
    assert_eq!(g.renew(p, &id(&first), 40), Ok(1040));
    assert!(matches!(g.acquire(p, 0, 3, 50), Admission::Denied(_)), "one slot, held");
    // Retried again, and this answer and the first are lost too: none arrived.
    let Ok(Admission::Granted(third)) = g.acquire_keyed(p, &key, 0, 4, 60) else { panic!("the same grant") };
    g.release_undelivered(&first.slot, 70);
    assert_eq!(g.pool(p).held, 1, "the third answer may have arrived");
    g.release_undelivered(&third.slot, 80);
    assert_eq!(g.pool(p).held, 0, "every answer that carried it was lost");
    // An unkeyed grant, answered once, goes back at once.
    let lone = granted(g.acquire(p, 0, 5, 90));
    g.release_undelivered(&lone.slot, 95);
    assert_eq!(g.pool(p).held, 0);
}

/// Past the top of its count of answers, a lease is no longer counted
/// down: lost answers could otherwise reach 0 while some were delivered.
#[test]
fn a_grant_answered_more_often_than_counted_is_left_to_its_term() {
    let (mut g, p) = governor(r#","concurrency":1,"termMs":60000,"renewIntervalMs":1000,"requestTimeoutMs":120000"#);
    let key = crate::governor::idempotency::IdemKey::new(7, b"job").unwrap();
    let Ok(Admission::Granted(first)) = g.acquire_keyed(p, &key, 0, 1, 0) else { panic!("granted") };
    for _ in 0..u16::MAX {
        assert!(matches!(g.acquire_keyed(p, &key, 0, 2, 1), Ok(Admission::Granted(_))));
    }
    for _ in 0..u16::MAX {
        g.release_undelivered(&first.slot, 2);
    }
    assert_eq!(g.pool(p).held, 1, "counted down past what was counted");
}

#[test]
fn external_timers_come_back_as_notices() {
    let (mut g, _) = governor("");
    g.schedule(50, 7);
    let k = g.schedule(60, 8);
    g.cancel_timer(k);
    g.advance(100);
    assert!(matches!(&notices(&mut g)[..], [Notice::Timer(7)]));
}

/// A pair of governors sharing a slot secret: `old` grants, `new` starts
/// after it with nothing known, as after a crash or on a standby.
pub(super) fn crashed_pair(pool_json: &str, crash_at_unix: u64) -> (Governor, Governor, PoolId) {
    let (mut old, pid) = governor(pool_json);
    old.set_identity(&[7; 32], Epoch::at(EpochMs(1_000_000)));
    let (mut new, _) = governor_seeded(pool_json, 2);
    new.set_identity(&[7; 32], Epoch::at(EpochMs(crash_at_unix)));
    (old, new, pid)
}

/// Two slots of a full pool (limit 2, term 1 s) granted by a process that
/// then died 500 ms later, and its successor.
fn two_held_then_crash() -> (Governor, PoolId, Grant, Grant) {
    let json = r#","concurrency":2,"termMs":1000,"renewIntervalMs":300,"requestTimeoutMs":60000"#;
    let (mut old, new, p) = crashed_pair(json, 1_000_500);
    let a = granted(old.acquire(p, 0, 1, 0));
    let b = granted(old.acquire(p, 0, 2, 0));
    (new, p, a, b)
}

#[test]
fn a_valid_unknown_slot_is_readopted_in_the_window_and_fail_fast_acquires_wait() {
    let (mut new, p, a, b) = two_held_then_crash();
    new.open_recovery_window(0);
    assert!(new.recovering(0) && new.pool(p).recovering(999));
    let d = denied(new.acquire(p, 0, 3, 10));
    assert_eq!(d.reason, DenyReason::Recovering);
    assert_eq!(d.retry_after_ms, 990);
    // A waiter waits through the window.
    let w = queued(new.acquire(p, 5000, 4, 10));
    assert!(notices(&mut new).is_empty());
    // Renewing `a` re-adopts it and extends it by a term; releasing `b` re-adopts and frees it.
    assert_eq!(new.renew(p, &id(&a), 100), Ok(1100));
    assert_eq!(new.renew(p, &id(&a), 200), Ok(1200));
    assert!(new.release(p, &id(&b), None, 300));
    assert!(!new.release(p, &id(&b), None, 301));
    assert_eq!(new.pool(p).held, 1);
    assert_eq!(new.pool(p).stats.readopted, 2);
    // At the window's end the waiter gets the one free slot, and the pool is full.
    new.advance(1000);
    assert!(!new.pool(p).recovering(1000));
    assert_eq!(granted_owners(&mut new), vec![4]);
    assert_eq!(denied(new.acquire(p, 0, 5, 1001)).reason, DenyReason::Concurrency);
    let _ = w;
}

#[test]
fn a_reload_that_lowers_the_limit_in_the_window_revokes_no_holder_yet_to_renew() {
    let json = r#","concurrency":3,"termMs":1000,"renewIntervalMs":300,"requestTimeoutMs":60000"#;
    let (mut old, mut new, p) = crashed_pair(json, 1_000_500);
    let held: Vec<_> = (1..=3).map(|owner| granted(old.acquire(p, 0, owner, 0))).collect();
    new.open_recovery_window(0);
    assert_eq!(new.renew(p, &id(&held[0]), 100), Ok(1100));
    // The reload lowers the limit to 1 before the other two renew.
    let lowered = Config::parse(
        br#"{"pools":{"p":{"keys":["k"],"concurrency":1,"termMs":1000,"renewIntervalMs":300,"requestTimeoutMs":60000}}}"#,
    )
    .unwrap();
    new.reconfigure(&pool_settings(&lowered), 200);
    for lease in &held[1..] {
        assert_eq!(new.renew(p, &id(lease), 300), Ok(1300), "held before the reload");
    }
    assert_eq!(new.pool(p).held, 3);
    // After the window nothing is granted until `held` falls under the new limit.
    new.advance(1000);
    assert_eq!(denied(new.acquire(p, 0, 9, 1000)).reason, DenyReason::Concurrency);
}

/// A holder whose slot was released or reclaimed by its term before a
/// crash, and that renews anyway, is indistinguishable from a live one;
/// the window re-adopts up to the pool's limit and no further, so a crash
/// never leaves more slots held than the limit.
#[test]
fn the_window_readopts_no_more_than_the_limit() {
    let json = r#","concurrency":2,"termMs":1000,"renewIntervalMs":300,"requestTimeoutMs":60000"#;
    let (mut old, mut new, p) = crashed_pair(json, 1_000_500);
    let released = granted(old.acquire(p, 0, 1, 0));
    let lapsed = granted(old.acquire(p, 0, 2, 0));
    assert!(old.release(p, &id(&released), None, 10));
    old.advance(1000);
    assert_eq!(old.pool(p).held, 0, "the second lapsed by its term");
    let live = [granted(old.acquire(p, 0, 3, 1000)), granted(old.acquire(p, 0, 4, 1000))];
    new.open_recovery_window(0);
    assert_eq!(new.renew(p, &id(&released), 100), Ok(1100), "indistinguishable from a live one");
    assert_eq!(new.renew(p, &id(&live[0]), 110), Ok(1110));
    assert_eq!(new.renew(p, &id(&lapsed), 120), Err(RenewError::NotFound), "the pool holds its limit");
    assert_eq!(new.renew(p, &id(&live[1]), 130), Err(RenewError::NotFound));
    assert!(!new.release(p, &id(&live[1]), None, 140));
    assert_eq!((new.pool(p).held, new.pool(p).stats.readopted), (2, 2));
    // A place freed in the window can be taken by the next one that renews.
    assert!(new.release(p, &id(&released), None, 150));
    assert_eq!(new.renew(p, &id(&live[1]), 160), Ok(1160));
    assert_eq!(new.pool(p).held, 2);
}

#[test]
fn forged_tampered_foreign_and_late_ids_are_never_readopted() {
    let json = r#","concurrency":2,"termMs":1000,"renewIntervalMs":300,"requestTimeoutMs":2000"#;
    let (mut old, mut new, p) = crashed_pair(json, 1_000_500);
    let other = new.pool_id("other").unwrap();
    let a = granted(old.acquire(p, 0, 1, 0));
    new.open_recovery_window(0);
    let mut tampered = a.slot;
    tampered.0[14] ^= 0x40; // a later request deadline
    assert_eq!(new.renew(p, &tampered.encode(), 10), Err(RenewError::NotFound));
    let (mut stranger, _) = governor_seeded(json, 3);
    stranger.set_identity(&[8; 32], Epoch::at(EpochMs(1_000_000)));
    let forged = granted(stranger.acquire(p, 0, 1, 0));
    assert_eq!(new.renew(p, &id(&forged), 10), Err(RenewError::NotFound));
    assert_eq!(new.renew(other, &id(&a), 10), Err(RenewError::NotFound));
    // Past its request deadline (2000 ms after grant = 1500 ms into the new process).
    new.advance(999);
    assert_eq!(new.pool(p).held, 0);
    assert_eq!(new.pool(p).stats.readopted, 0);
}

#[test]
fn a_released_readopted_id_stays_dead_as_long_as_it_reads_alive() {
    // The granting host's clock is 30 s ahead: the id reads as alive 30 s
    // past the cap it is re-adopted with here. Released, it must not be
    // taken back by a later window once that cap has passed.
    let json = r#","concurrency":1,"termMs":1000,"renewIntervalMs":300,"requestTimeoutMs":60000"#;
    let (mut old, p) = governor(json);
    old.set_identity(&[7; 32], Epoch::at(EpochMs(1_030_000)));
    let (mut new, _) = governor_seeded(json, 2);
    new.set_identity(&[7; 32], Epoch::at(EpochMs(1_000_000)));
    let a = granted(old.acquire(p, 0, 1, 0));
    new.open_recovery_window(0);
    assert!(new.renew(p, &id(&a), 10).is_ok(), "re-adopted");
    assert!(new.release(p, &id(&a), None, 20));
    assert_eq!(new.renew(p, &id(&a), 30), Err(RenewError::NotFound));
    new.advance(60_010);
    new.moved_here(p, 60_100);
    assert_eq!(new.renew(p, &id(&a), 60_100), Err(RenewError::NotFound), "past the cap, inside its own deadline");
}

#[test]
fn a_readopted_slot_is_held_no_longer_than_its_request_cap_whatever_the_clocks_say() {
    // The successor's wall clock is ten minutes behind the granting one's
    // (set back, or another host's): the id's request deadline reads as
    // eleven minutes ahead. It keeps at most the pool's 60-s cap.
    let json = r#","concurrency":2,"termMs":1000,"renewIntervalMs":300,"requestTimeoutMs":60000"#;
    let (mut old, mut new, p) = crashed_pair(json, 400_000);
    let a = granted(old.acquire(p, 0, 1, 0));
    new.open_recovery_window(0);
    for at in (10..60_010).step_by(900) {
        assert_eq!(new.renew(p, &id(&a), at), Ok((at + 1000).min(60_010)), "at {at}");
    }
    assert_eq!(new.renew(p, &id(&a), 60_000), Err(RenewError::Capped));
    new.advance(60_010);
    assert_eq!(new.pool(p).held, 0);
    assert_eq!(new.pool(p).stats.reclaimed_cap, 1);
}

/// Less than a term before its request deadline, the renew that re-adopts
/// a slot is answered as the same renew before the crash would have been:
/// extended to the cap. Only the next one is `capped`.
#[test]
fn a_renew_that_readopts_a_slot_near_its_cap_extends_it_to_the_cap() {
    let json = r#","concurrency":2,"termMs":1000,"renewIntervalMs":300,"requestTimeoutMs":2000"#;
    let (mut old, mut new, p) = crashed_pair(json, 1_000_000);
    let a = granted(old.acquire(p, 0, 1, 0));
    // The successor started 1 s after the grant: its window runs to 2 s.
    new.open_recovery_window(1_000);
    assert_eq!(new.renew(p, &id(&a), 1_500), Ok(2_000));
    assert_eq!(new.renew(p, &id(&a), 1_600), Err(RenewError::Capped));
    assert_eq!(new.pool(p).stats.readopted, 1);
}

#[test]
fn outside_a_window_unknown_slots_are_not_found_and_readopted_ones_are_reclaimed() {
    let (mut new, p, a, b) = two_held_then_crash();
    // The first start (a fresh secret) opens no window.
    assert_eq!(new.renew(p, &id(&a), 10), Err(RenewError::NotFound));
    new.open_recovery_window(20);
    assert!(new.renew(p, &id(&b), 30).is_ok());
    // `b` stops renewing: reclaimed one term after its re-adoption.
    new.advance(1029);
    assert_eq!(new.pool(p).held, 1);
    new.advance(1030);
    assert_eq!(new.pool(p).held, 0);
    assert_eq!(new.pool(p).stats.reclaimed_term, 1);
    assert_eq!(new.renew(p, &id(&b), 1031), Err(RenewError::NotFound));
}

#[test]
fn a_released_readopted_id_is_remembered_until_its_request_deadline_and_no_longer() {
    // `b` was granted at Unix 1 000 000 with a 60-s cap: its request
    // deadline is 59 500 ms into the new process.
    let (mut new, p, _a, b) = two_held_then_crash();
    new.open_recovery_window(0);
    assert!(new.release(p, &id(&b), None, 300));
    assert_eq!(new.adopted.get(&b.slot), Some(&None));
    // A later window (a pool moved here again) does not adopt it twice.
    new.advance(59_000);
    new.open_recovery_window(59_000);
    assert!(!new.release(p, &id(&b), None, 59_001));
    assert_eq!(new.pool(p).held, 0);
    // At its request deadline nothing could adopt it any more: the entry goes.
    new.advance(59_500);
    assert!(new.adopted.is_empty() && new.tombstones.is_empty());
    new.open_recovery_window(59_600);
    assert!(!new.release(p, &id(&b), None, 59_601));
    assert_eq!(new.pool(p).stats.readopted, 1);
}

#[test]
fn pool_names_resolve_to_their_own_pool_in_any_order_and_after_a_reload() {
    let (mut g, p) = governor("");
    let other = g.pool_id("other").unwrap();
    assert_ne!(p, other);
    for (name, want) in [("p", Some(p)), ("p", Some(p)), ("other", Some(other)), ("nope", None), ("other", Some(other))]
    {
        assert_eq!(g.pool_id(name), want, "{name}");
    }
    // "p" is dropped and "q" added: the names keep their pools, retired or not.
    let config = Config::parse(br#"{"pools":{"other":{"keys":["k2"]},"q":{"keys":["k3"]}}}"#).unwrap();
    g.reconfigure(&pool_settings(&config), 0);
    let q = g.pool_id("q").unwrap();
    assert!(![p, other].contains(&q));
    assert_eq!(g.pool_id("p"), Some(p));
    assert!(g.pool(p).retired);
    assert_eq!(g.pool_id("q"), Some(q));
    assert_eq!(g.pool_id("other"), Some(other));
    assert_eq!(g.pool_id(""), None);
}

/// Of eight calls granted together four succeeded and four were refused,
/// the successes reported first: the upstream allows about four, not one
/// (SPEC §7: cut to the evidence, at most once per congestion window).
#[test]
fn refusals_reported_after_the_successes_beside_them_cut_to_those_successes() {
    let (mut g, p) = governor(r#","concurrency":8"#);
    let slots: Vec<Grant> = (0..8).map(|i| granted(g.acquire(p, 0, i, 0))).collect();
    assert_eq!(g.pool(p).effective_limit(), 8);
    for s in &slots[..4] {
        assert!(g.release(p, &id(s), Some(&OK), 100));
    }
    let refused = Outcome { status: Some(429), throttled: 1, ..OK };
    for (i, s) in slots[4..].iter().enumerate() {
        assert!(g.release(p, &id(s), Some(&refused), 110 + i as u64));
        assert_eq!(g.pool(p).effective_limit(), 4, "after refusal {i}");
    }
    // Refusals reported while the calls beside them still run follow those
    // calls down, as before.
    let (mut g, p) = governor(r#","concurrency":8"#);
    let slots: Vec<Grant> = (0..8).map(|i| granted(g.acquire(p, 0, i, 0))).collect();
    for (i, s) in slots[3..].iter().enumerate() {
        assert!(g.release(p, &id(s), Some(&refused), 10 + i as u64));
    }
    assert_eq!(g.pool(p).effective_limit(), 3, "three calls still running");
}

/// A pool of 8 whose one call was refused at 10 ms with `remaining: 0` and
/// nothing said of when the window ends: a blind probe.
fn blindly_refused() -> (Governor, PoolId) {
    let (mut g, p) = governor(r#","concurrency":8"#);
    let a = granted(g.acquire(p, 0, 1, 0));
    let blind = Outcome { status: Some(429), throttled: 1, rate: RateInfo { remaining: Some(0), ..OK.rate } };
    g.release(p, &id(&a), Some(&blind), 10);
    (g, p)
}

/// The calls out when a blind probe's pause began are no probe and hold
/// none back: once the pause ends, one call at a time goes out beside them,
/// not only when the last of them (a long call, a vanished holder) is back.
/// What they report changes nothing; the probe's own success gives the
/// limit back.
#[test]
fn a_blind_probe_goes_out_beside_the_calls_already_out() {
    let (mut g, p) = governor(r#","concurrency":8"#);
    let out: Vec<_> = (0..3).map(|i| granted(g.acquire(p, 0, i, 0))).collect();
    let refused = granted(g.acquire(p, 0, 3, 0));
    let blind = Outcome { status: Some(429), throttled: 1, rate: RateInfo { remaining: Some(0), ..OK.rate } };
    g.release(p, &id(&refused), Some(&blind), 10);
    denied(g.acquire(p, 0, 10, 100));
    // They have the longest pause to come back; then the probe goes.
    g.advance(300);
    assert_eq!(denied(g.acquire(p, 0, 9, 300)).reason, DenyReason::Concurrency, "the calls out may come back");
    g.advance(1_010);
    let probe = granted(g.acquire(p, 0, 11, 1_010));
    // The limit shown counts the calls out beside the probe.
    assert_eq!((probe.signals.effective_limit, probe.signals.remaining_slots), (4, 0));
    assert_eq!(denied(g.acquire(p, 0, 12, 1_020)).reason, DenyReason::Concurrency, "one probe at a time");
    // An old call succeeding says nothing of the spent window; the limit
    // falls with the calls still out.
    g.release(p, &id(&out[0]), Some(&OK), 1_100);
    assert_eq!(g.signals(p, 1_100).effective_limit, 3);
    assert_eq!(denied(g.acquire(p, 0, 13, 1_110)).reason, DenyReason::Concurrency);
    g.release(p, &id(&probe), Some(&OK), 1_200);
    assert_eq!(g.pool(p).effective_limit(), 8, "the probe got through");
    let again = granted(g.acquire(p, 0, 14, 1_210));
    assert_eq!(again.signals.remaining_slots, 8 - 3, "the calls still out count again");
}

/// A blind probe goes out beside the calls already out, but never past the
/// configured limit: one lowered by a reload below them grants nothing.
#[test]
fn a_blind_probe_beside_the_calls_out_keeps_to_a_lowered_concurrency() {
    let (mut g, p) = governor(r#","concurrency":8"#);
    for i in 0..7 {
        granted(g.acquire(p, 0, i, 0));
    }
    let refused = granted(g.acquire(p, 0, 7, 0));
    let blind = Outcome { status: Some(429), throttled: 1, rate: RateInfo { remaining: Some(0), ..OK.rate } };
    g.release(p, &id(&refused), Some(&blind), 10);
    let lowered = Config::parse(br#"{"pools":{"p":{"keys":["k"],"concurrency":2},"other":{"keys":["k2"]}}}"#).unwrap();
    g.reconfigure(&pool_settings(&lowered), 20);
    g.advance(1_010);
    assert_eq!(denied(g.acquire(p, 0, 8, 1_010)).reason, DenyReason::Concurrency, "7 out of 2 allowed");
    assert!(g.signals(p, 1_010).effective_limit <= 2);
}

/// A waiter is granted when the calls out stop holding the probe back, at
/// the end of the longest pause, with nothing else to wake the queue.
#[test]
fn a_queued_acquire_goes_out_as_a_blind_probe_once_the_calls_out_stop_counting() {
    let (mut g, p) = governor(r#","concurrency":8,"queue":{"size":10,"timeoutMs":30000}"#);
    for i in 0..3 {
        granted(g.acquire(p, 0, i, 0));
    }
    let refused = granted(g.acquire(p, 0, 3, 0));
    let blind = Outcome { status: Some(429), throttled: 1, rate: RateInfo { remaining: Some(0), ..OK.rate } };
    g.release(p, &id(&refused), Some(&blind), 10);
    queued(g.acquire(p, 20_000, 7, 100));
    g.advance(1_000);
    assert!(granted_owners(&mut g).is_empty(), "the calls out may still come back");
    g.advance(1_010);
    assert_eq!(granted_owners(&mut g), [7]);
}

/// A blind probe (a `remaining: 0` refusal with no end said) whose calls
/// are released without a report: those got an answer their caller did not
/// call a refusal, so the probe ends, rather than hold the pool at one call
/// at a time for good.
#[test]
fn a_blind_probe_ends_at_a_probe_released_without_a_report() {
    let (mut g, p) = blindly_refused();
    assert_eq!(g.pool(p).effective_limit(), 1);
    g.advance(1_000);
    let probe = granted(g.acquire(p, 0, 2, 1_000));
    assert!(g.release(p, &id(&probe), None, 1_005));
    assert_eq!(g.pool(p).effective_limit(), 8, "the probe's caller said nothing of a refusal");
}

/// A probe's report with no status that still shows the window spent, or
/// a retry hint, is no success: the blind probe goes on.
#[test]
fn a_blind_probe_goes_on_past_a_report_with_no_status_that_shows_a_refusal() {
    let spent = Outcome { status: None, throttled: 0, rate: RateInfo { remaining: Some(0), ..OK.rate } };
    let hinted = Outcome { status: None, throttled: 0, rate: RateInfo { retry_after_ms: Some(5), ..OK.rate } };
    for report in [spent, hinted] {
        let (mut g, p) = blindly_refused();
        g.advance(1_000);
        let probe = granted(g.acquire(p, 0, 2, 1_000));
        assert!(g.release(p, &id(&probe), Some(&report), 1_005));
        assert_eq!(g.pool(p).effective_limit(), 1, "{report:?} is no success");
    }
}

/// A report with no status that shows the window spent is a rate refusal
/// (SPEC §7): with a retry hint it pauses the pool for it; with neither a
/// hint nor a reset, one call at a time probes.
#[test]
fn a_report_with_no_status_that_shows_a_spent_window_is_a_rate_refusal() {
    let (mut g, p) = governor(r#","concurrency":8"#);
    let a = granted(g.acquire(p, 0, 1, 0));
    let hinted = RateInfo { remaining: Some(0), retry_after_ms: Some(5_000), ..OK.rate };
    g.release(p, &id(&a), Some(&Outcome { status: None, throttled: 0, rate: hinted }), 10);
    assert_eq!(denied(g.acquire(p, 0, 2, 20)).reason, DenyReason::Cooldown);
    assert_eq!(g.pool(p).learning.cooldown_until, 5_010);

    let (mut g, p) = governor(r#","concurrency":8"#);
    let a = granted(g.acquire(p, 0, 1, 0));
    let spent = RateInfo { token_remaining: Some(0), ..OK.rate };
    g.release(p, &id(&a), Some(&Outcome { status: None, throttled: 0, rate: spent }), 10);
    assert_eq!(g.pool(p).effective_limit(), 1, "a blind probe");
}

/// A probe's grant that never reached its holder (released by the server),
/// or a proxied probe that ended with no answer from the upstream, says
/// nothing of the window: the blind probe goes on.
#[test]
fn a_blind_probe_goes_on_past_a_probe_that_never_reached_the_upstream() {
    let (mut g, p) = blindly_refused();
    g.advance(1_000);
    let undelivered = granted(g.acquire(p, 0, 2, 1_000));
    g.release_undelivered(&undelivered.slot, 1_005);
    assert_eq!(g.pool(p).effective_limit(), 1, "an undelivered grant is no probe");
    let proxied = granted(g.acquire(p, 0, 3, 1_010));
    assert!(g.release_id(p, &proxied.slot, None, 1_020));
    assert_eq!(g.pool(p).effective_limit(), 1, "an exchange with no answer is no probe");
}
