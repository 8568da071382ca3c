//! What outcome reports teach, over the wire (SPEC §7): the three
//! reproductions of rules that used to misread the upstream.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{config, post, read_response, TestServer, KEY};

const POOL: &str = r#""concurrency":64,"queue":{"size":10,"timeoutMs":5000}"#;

fn metrics(s: &TestServer) -> String {
    let mut c = TcpStream::connect(s.admin.expect("admin listener")).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    text
}

fn gauge(text: &str, line_start: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(line_start).map(|v| v.trim().to_string()))
        .unwrap_or_else(|| panic!("no {line_start} in metrics"))
}

/// One per-request concurrency 429 with a retry hint, while four other
/// calls still run, does not stop the pool.
#[test]
fn one_concurrency_refusal_does_not_pause_the_pool() {
    let s = TestServer::start(&config(POOL, ""));
    let slots: Vec<String> = (0..5).map(|_| s.acquire("", "").slot()).collect();
    let r = s.release(&slots[0], r#"{"status":429,"throttled":1,"retryAfterMs":1000}"#);
    assert_eq!(r.json()["released"], true);
    let r = s.acquire("", "");
    assert_eq!(r.status, 200, "granted at once, not after a cool-down: {:?}", r.header("x-nthpool-deny-reason"));
    let m = metrics(&s);
    assert_eq!(gauge(&m, r#"nthpool_limited_by{pool="p",reason="cooldown"}"#), "0");
    assert_eq!(gauge(&m, r#"nthpool_cooldown_ms{pool="p"}"#), "0");
    assert_eq!(gauge(&m, r#"nthpool_learned_refused_at{pool="p"}"#), "5");
}

/// A late report from a call granted earlier does not re-open a budget that
/// a newer report closed inside the same window.
#[test]
fn a_late_report_does_not_reopen_a_closed_budget() {
    let s = TestServer::start(&config(POOL, ""));
    let b = s.acquire("", "").slot();
    let a = s.acquire("", "").slot();
    let headers = |remaining: u32| {
        format!(
            r#"{{"status":200,"headers":{{"x-ratelimit-remaining-requests":"{remaining}","x-ratelimit-reset-requests":"5s"}}}}"#
        )
    };
    assert_eq!(s.release(&a, &headers(0)).json()["released"], true);
    assert_eq!(s.release(&b, &headers(12)).json()["released"], true);
    let r = s.acquire("", "");
    assert_eq!(r.status, 429);
    assert_eq!(r.header("x-nthpool-deny-reason"), Some("rate"));
    let m = metrics(&s);
    assert_eq!(gauge(&m, r#"nthpool_budget_remaining{pool="p"}"#), "0");
    assert_eq!(gauge(&m, r#"nthpool_limited_by{pool="p",reason="rate"}"#), "1");
    let reset: i64 = gauge(&m, r#"nthpool_budget_reset_ms{pool="p"}"#).parse().unwrap();
    assert!((1..=5000).contains(&reset), "reset in {reset} ms");
}

/// One report whose reset is an hour away (a client that sent an instant
/// as `resetMs`), in the middle of a minute window the reports told, used
/// to replace that window: the newer reports of the minute were ignored as
/// of a window that ended, a spent minute went on granting, and its refills
/// were paced to the limit per hour. It is set aside.
#[test]
fn one_far_reset_does_not_replace_the_running_window() {
    let s = TestServer::start(&config(r#""concurrency":8"#, ""));
    let report = |remaining: u32, reset_ms: u64| {
        format!(r#"{{"status":200,"rate":{{"limit":60,"remaining":{remaining},"resetMs":{reset_ms}}}}}"#)
    };
    for (remaining, reset_ms) in [(59, 60_000), (58, 3_600_000), (0, 58_000)] {
        let slot = s.acquire("", "").slot();
        assert_eq!(s.release(&slot, &report(remaining, reset_ms)).json()["released"], true);
    }
    let r = s.acquire("", "");
    assert_eq!((r.status, r.header("x-nthpool-deny-reason")), (429, Some("rate")), "{r:?}");
    assert!(r.header_u64("retry-after") <= 60, "{r:?}");
    let m = metrics(&s);
    let reset: i64 = gauge(&m, r#"nthpool_budget_reset_ms{pool="p"}"#).parse().unwrap();
    assert!((1..=60_000).contains(&reset), "reset in {reset} ms");
}

/// A server whose pool was told a spent window of `limit` calls ending 3 s
/// on, and which has waited past that end: the next window is refilled.
fn refilled_after_a_told_window(limit: u32) -> TestServer {
    let s = TestServer::start(&config(r#""concurrency":8"#, ""));
    let slot = s.acquire("", "").slot();
    let told = format!(r#"{{"status":200,"rate":{{"limit":{limit},"remaining":0,"resetMs":3000}}}}"#);
    assert_eq!(s.release(&slot, &told).json()["released"], true);
    std::thread::sleep(Duration::from_millis(3050));
    s
}

/// A call granted after a learned window ended and refused with nothing
/// left, its reset sooner than the refilled window's end, used to be taken
/// for a late report of the window that ended: ignored, and the pool went
/// on granting the refilled budget into the upstream's refusals. It shuts
/// the pool until that reset.
#[test]
fn a_spent_window_said_after_a_refill_shuts_the_pool_until_its_reset() {
    let s = refilled_after_a_told_window(60);
    // Refilled: 60 for the next 3 s, one every 50 ms.
    let r = s.acquire("", "");
    assert_eq!(r.status, 200, "{r:?}");
    let refused = r#"{"status":429,"throttled":1,"rate":{"remaining":0,"resetMs":1000}}"#;
    assert_eq!(s.release(&r.slot(), refused).json()["released"], true);
    std::thread::sleep(Duration::from_millis(200));
    let r = s.acquire("", "");
    assert_eq!((r.status, r.header("x-nthpool-deny-reason")), (429, Some("rate")), "{r:?}");
    assert_eq!(r.header_u64("retry-after"), 1, "{r:?}");
    let reset: i64 = gauge(&metrics(&s), r#"nthpool_budget_reset_ms{pool="p"}"#).parse().unwrap();
    assert!((1..=800).contains(&reset), "reset in {reset} ms");
}

/// A refilled window that a report ends sooner than its pace would grant
/// again: the next window starts at that end with a grant at once, as the
/// dashboard and the metrics show it, not held back by the old pace.
#[test]
fn the_next_window_starts_at_the_reported_end_not_at_the_old_pace() {
    let s = refilled_after_a_told_window(3);
    // Refilled: 3 for the next 3 s, one a second.
    let first = s.acquire("", "");
    assert_eq!(first.status, 200, "{first:?}");
    std::thread::sleep(Duration::from_millis(1000));
    let second = s.acquire("", "");
    assert_eq!(second.status, 200, "{second:?}");
    // Its report ends the window 600 ms on, before the pace's next grant.
    let spent = r#"{"status":429,"throttled":1,"rate":{"remaining":0,"resetMs":600}}"#;
    assert_eq!(s.release(&second.slot(), spent).json()["released"], true);
    std::thread::sleep(Duration::from_millis(750));
    let r = s.acquire("", "");
    assert_eq!(r.status, 200, "the window ended: {r:?}");
}

/// A rate 429 (`remaining: 0`) teaches the budget and leaves the
/// concurrency limit alone.
#[test]
fn a_rate_refusal_does_not_cut_the_concurrency_limit() {
    let s = TestServer::start(&config(POOL, ""));
    // The pool starts at 16 and ramps: the last four wait a few ms for it.
    let slots: Vec<String> = (0..20).map(|_| s.acquire("", r#"{"waitMs":5000}"#).slot()).collect();
    let refused = r#"{"status":429,"throttled":1,"headers":{"x-ratelimit-limit-requests":"60","x-ratelimit-remaining-requests":"0","x-ratelimit-reset-requests":"300ms","retry-after":"1"}}"#;
    for slot in &slots[..10] {
        assert_eq!(s.release(slot, refused).json()["released"], true);
    }
    let r = s.acquire("", "");
    assert_eq!(r.status, 429);
    assert!(matches!(r.header("x-nthpool-deny-reason"), Some("rate" | "cooldown")));
    // Queued until the budget and the cool-down end, then granted under the
    // configured limit.
    let r = s.acquire("", r#"{"waitMs":5000}"#);
    assert_eq!(r.status, 200);
    assert_eq!(r.header_u64("x-nthpool-effective-limit"), 64);
    let m = metrics(&s);
    assert_eq!(gauge(&m, r#"nthpool_effective_limit{pool="p"}"#), "64");
    assert_eq!(gauge(&m, r#"nthpool_budget_limit{pool="p"}"#), "60");
}

/// A rate refusal that says its window is spent but not when it ends
/// (`remaining: 0`, no reset, no retry hint), or only when it ends (a reset
/// and no `remaining`, no hint), used to leave the pool open: every call
/// went into the spent window. The first pauses the pool and lets one call
/// at a time probe; a run of the second waits for the reset.
#[test]
fn a_rate_refusal_without_an_end_or_without_a_remaining_still_stops_the_pool() {
    let s = TestServer::start(&config(r#""concurrency":8,"queue":{"size":10,"timeoutMs":5000}"#, ""));
    let slots: Vec<String> = (0..8).map(|_| s.acquire("", "").slot()).collect();
    let spent = r#"{"status":429,"headers":{"x-ratelimit-limit":"60","x-ratelimit-remaining":"0"}}"#;
    for slot in &slots {
        assert_eq!(s.release(slot, spent).json()["released"], true);
    }
    let r = s.acquire("", "");
    assert_eq!((r.status, r.header("x-nthpool-deny-reason")), (429, Some("cooldown")));
    assert_eq!(r.header_u64("x-nthpool-effective-limit"), 1, "one call at a time probes");
    // After the pause one probe goes; while it runs, no second call does.
    let probe = s.acquire("", r#"{"waitMs":2000}"#);
    assert_eq!(probe.status, 200);
    let r = s.acquire("", "");
    assert_eq!((r.status, r.header("x-nthpool-deny-reason")), (429, Some("concurrency")));
    // It gets through: the window opened, and the limit is back.
    assert_eq!(s.release(&probe.slot(), r#"{"status":200}"#).json()["released"], true);
    let r = s.acquire("", "");
    assert_eq!((r.status, r.header_u64("x-nthpool-effective-limit")), (200, 8));

    // Only the reset said, and no retry hint (`x-ratelimit-reset-requests`
    // alone): too many at once or a spent window. It cuts; once the refusals
    // go on after the cut, the pool waits for the reset.
    let reset_only = r#"{"status":429,"headers":{"x-ratelimit-reset-requests":"3s"}}"#;
    assert_eq!(s.release(&r.slot(), reset_only).json()["released"], true);
    for _ in 0..2 {
        let r = s.acquire("", "");
        assert_eq!(r.status, 200, "{:?}", r.header("x-nthpool-deny-reason"));
        assert_eq!(s.release(&r.slot(), reset_only).json()["released"], true);
    }
    let r = s.acquire("", "");
    assert_eq!((r.status, r.header("x-nthpool-deny-reason")), (429, Some("cooldown")));
    assert!((2..=3).contains(&r.header_u64("retry-after")), "{:?}", r.header("retry-after"));
}

/// The first burst: a fresh pool configured at 64 grants 16 before any
/// evidence, says so in its metrics, and ramps up by the clock for waiters.
#[test]
fn a_fresh_pool_grants_its_initial_window_then_ramps() {
    let s = TestServer::start(&config(POOL, ""));
    let slots: Vec<String> = (0..16).map(|_| s.acquire("", "").slot()).collect();
    let r = s.acquire("", "");
    // Fail fast at the initial window, unless the ramp already moved on.
    let limit = r.header_u64("x-nthpool-effective-limit");
    assert!((16..64).contains(&limit), "{r:?}");
    if r.status == 429 {
        assert_eq!(r.header("x-nthpool-deny-reason"), Some("concurrency"));
    }
    // With no grant since, the ramp still moves on in what reads it: the
    // metrics show the limit the next grant finds, not the one the last found.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let m = metrics(&s);
    assert_eq!(gauge(&m, r#"nthpool_effective_limit{pool="p"}"#), "64", "{m}");
    assert_eq!(gauge(&m, r#"nthpool_learning_starting{pool="p"}"#), "0", "{m}");
    assert_eq!(gauge(&m, r#"nthpool_limited_by{pool="p",reason="concurrency"}"#), "0", "{m}");
    // Waiters are granted as the limit grows, with no release.
    let more: Vec<String> = (0..20).map(|_| s.acquire("", r#"{"waitMs":5000}"#).slot()).collect();
    assert_eq!(slots.len() + more.len(), 36);
    let m = metrics(&s);
    let effective: u32 = gauge(&m, r#"nthpool_effective_limit{pool="p"}"#).parse().unwrap();
    assert!(effective >= 36, "effective {effective}");
}

/// A 429 whose cool-down ends before its spent budget does: the denial
/// names the budget and waits for it (the gate that opens last), in both
/// dialects of the report.
#[test]
fn a_budget_spent_past_the_cooldown_decides_the_denial() {
    let s = TestServer::start(&config(r#""concurrency":10,"adaptive":true"#, ""));
    let slot = s.acquire("", "").slot();
    let refused = r#"{"status":429,"throttled":1,"headers":{"retry-after":"30","x-ratelimit-limit":"100","x-ratelimit-remaining":"0","x-ratelimit-reset":"90"}}"#;
    assert_eq!(s.release(&slot, refused).json()["released"], true);
    let r = s.acquire("", "");
    assert_eq!(r.status, 429);
    assert_eq!(r.header("x-nthpool-deny-reason"), Some("rate"));
    assert!((85..=90).contains(&r.header_u64("retry-after")), "{r:?}");
    let m = metrics(&s);
    // Both hold the pool, and the metrics say so (the denial names the later).
    assert_eq!(gauge(&m, r#"nthpool_limited_by{pool="p",reason="rate"}"#), "1");
    assert_eq!(gauge(&m, r#"nthpool_limited_by{pool="p",reason="cooldown"}"#), "1");
    assert_eq!(gauge(&m, r#"nthpool_limited_by{pool="p",reason="concurrency"}"#), "0");

    let s = TestServer::start(&config(r#""concurrency":10,"adaptive":true"#, ""));
    let slot = s.acquire("", "").slot();
    let refused =
        r#"{"status":429,"throttled":1,"rate":{"limit":100,"remaining":0,"resetMs":500000},"retryAfterMs":500000}"#;
    assert_eq!(s.release(&slot, refused).json()["released"], true);
    let r = s.acquire("", "");
    assert_eq!(r.status, 429);
    assert_eq!(r.header("x-nthpool-deny-reason"), Some("rate"));
    assert!((495..=500).contains(&r.header_u64("retry-after")), "{r:?}");
}

/// A learned upstream budget is a rate gate: its remaining grants are in
/// `x-nthpool-rpm-remaining`, also on the `429` it causes.
#[test]
fn rpm_remaining_reports_the_learned_budget() {
    let s = TestServer::start(&config(r#""concurrency":10,"adaptive":true"#, ""));
    let r = s.acquire("", "");
    assert_eq!(r.header("x-nthpool-rpm-remaining"), None, "no rate gate yet");
    let report = r#"{"status":200,"rate":{"limit":10,"remaining":0,"resetMs":1000000000000}}"#;
    assert_eq!(s.release(&r.slot(), report).json()["released"], true);
    let r = s.acquire("", "");
    assert_eq!(r.status, 429);
    assert_eq!(r.header("x-nthpool-deny-reason"), Some("rate"));
    assert_eq!(r.header("x-nthpool-rpm-remaining"), Some("0"), "{r:?}");

    let s = TestServer::start(&config(r#""concurrency":10,"adaptive":true,"rpm":600,"rpmBurst":8"#, ""));
    let r = s.acquire("", "");
    let report = r#"{"status":200,"rate":{"limit":10,"remaining":5,"resetMs":60000}}"#;
    assert_eq!(s.release(&r.slot(), report).json()["released"], true);
    let r = s.acquire("", "");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-nthpool-rpm-remaining"), Some("4"), "the budget, under the bucket's 6: {r:?}");
}

/// A learned budget larger than 32 bits (an upstream that counts tokens or
/// bytes as requests) is shown as it is, not as 4 294 967 295.
#[test]
fn rpm_remaining_shows_a_budget_past_32_bits_exactly() {
    let s = TestServer::start(&config(r#""concurrency":10,"adaptive":true"#, ""));
    let r = s.acquire("", "");
    let report = r#"{"status":200,"rate":{"limit":10000000000,"remaining":5000000000,"resetMs":60000}}"#;
    assert_eq!(s.release(&r.slot(), report).json()["released"], true);
    let r = s.acquire("", "");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-nthpool-rpm-remaining"), Some("4999999999"), "{r:?}");
}

/// A whole number past 64 bits in a report field without an upper bound
/// is as large as any: the report counts (not a `400`), and what it asks
/// for is capped, a cool-down at 120 s and a budget window at an hour.
#[test]
fn huge_report_numbers_count_and_are_capped() {
    let s = TestServer::start(&config(r#""concurrency":10,"adaptive":true"#, ""));
    let slot = s.acquire("", "").slot();
    let report = r#"{"status":429,"throttled":18446744073709551616,"retryAfterMs":1e20,
        "rate":{"limit":1e300,"remaining":0,"resetMs":99999999999999999999}}"#;
    let r = s.release(&slot, report);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.json()["released"], true);
    let r = s.acquire("", "");
    assert_eq!(r.status, 429);
    assert_eq!(r.header("x-nthpool-deny-reason"), Some("rate"));
    assert!((3590..=3600).contains(&r.header_u64("retry-after")), "{r:?}");
    let m = metrics(&s);
    let cooldown: u64 = gauge(&m, r#"nthpool_cooldown_ms{pool="p"}"#).parse().unwrap();
    assert!((1..=120_000).contains(&cooldown), "cool-down {cooldown} ms");
    assert_eq!(gauge(&m, r#"nthpool_effective_limit{pool="p"}"#), "10", "a rate refusal cuts nothing");
}

/// After a learned window ends, `/metrics` shows the budget the next grant
/// finds, refilled to the announced limit (as `x-nthpool-rpm-remaining`
/// does), not the spent window's 0; and a budget past what a gauge holds
/// reads as the largest gauge, not as -1 ("none").
#[test]
fn metrics_show_the_budget_the_next_grant_finds() {
    let s = TestServer::start(&config(r#""concurrency":10,"adaptive":true"#, ""));
    let slot = s.acquire("", "").slot();
    let report = r#"{"status":200,"rate":{"limit":7,"remaining":0,"resetMs":300}}"#;
    assert_eq!(s.release(&slot, report).json()["released"], true);
    assert_eq!(gauge(&metrics(&s), r#"nthpool_budget_remaining{pool="p"}"#), "0");
    std::thread::sleep(Duration::from_millis(600));
    let m = metrics(&s);
    assert_eq!(gauge(&m, r#"nthpool_budget_remaining{pool="p"}"#), "7", "refilled");
    let reset: i64 = gauge(&m, r#"nthpool_budget_reset_ms{pool="p"}"#).parse().unwrap();
    assert!((1..=300).contains(&reset), "the next window ends in {reset} ms");
    assert_eq!(gauge(&m, r#"nthpool_budget_paced_next_ms{pool="p"}"#), "0", "one grant at once");
    let r = s.acquire("", "");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-nthpool-rpm-remaining"), Some("6"), "{r:?}");

    let huge =
        r#"{"status":200,"rate":{"limit":18446744073709551615,"remaining":18446744073709551615,"resetMs":60000}}"#;
    assert_eq!(s.release(&r.slot(), huge).json()["released"], true);
    let m = metrics(&s);
    assert_eq!(gauge(&m, r#"nthpool_budget_limit{pool="p"}"#), i64::MAX.to_string());
    assert_eq!(gauge(&m, r#"nthpool_budget_remaining{pool="p"}"#), i64::MAX.to_string());
}

/// A spent token window shows where operators look for the budget: the
/// dashboard's pool (`tokenBlockedUntil`) and `/metrics`
/// (`nthpool_token_block_ms`), not only as a `rate` status.
#[test]
fn a_spent_token_window_shows_in_the_dashboard_and_the_metrics() {
    let s = TestServer::start(&config(r#""concurrency":10,"adaptive":true"#, ""));
    let m = metrics(&s);
    assert_eq!(gauge(&m, r#"nthpool_token_block_ms{pool="p"}"#), "-1", "none spent yet");
    let slot = s.acquire("", "").slot();
    let report = r#"{"status":429,"rate":{"tokenLimit":1000,"tokenRemaining":0,"tokenResetMs":60000}}"#;
    assert_eq!(s.release(&slot, report).json()["released"], true);
    let block: i64 = gauge(&metrics(&s), r#"nthpool_token_block_ms{pool="p"}"#).parse().unwrap();
    assert!((50_000..=60_000).contains(&block), "{block} ms");
    let admin = s.admin.expect("an admin listener");
    let page = common::admin_get(admin, "/api/pools/p");
    let body = &page[page.find("\r\n\r\n").unwrap() + 4..];
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    let (until, server) = (v["tokenBlockedUntil"].as_u64(), v["serverTime"].as_u64().unwrap());
    let left = until.map(|until| until.saturating_sub(server));
    assert!(left.is_some_and(|ms| (50_000..=60_000).contains(&ms)), "{v}");
}

/// A report with no status and no 429 (`{}`, `{"throttled":0}`, as a
/// client that always sends its count of upstream 429s writes it) says the
/// call was not refused, as a release without a body does: a limit cut by
/// a 429 grows back on such reports.
#[test]
fn reports_without_a_status_grow_a_cut_limit_back() {
    let s = TestServer::start(&config(r#""concurrency":8"#, ""));
    let mut c = s.connect();
    let mut send = |path: &str, body: &str| {
        c.write_all(&post(path, KEY, "", body)).unwrap();
        read_response(&mut c).expect("a response")
    };
    let release = |slot: &str| format!("/pools/p/lock/{slot}/release");
    let held: Vec<String> = (0..5).map(|_| send("/pools/p/lock/acquire", "").slot()).collect();
    assert_eq!(send(&release(&held[4]), r#"{"status":429}"#).json()["released"], true);
    for slot in &held[..4] {
        assert_eq!(send(&release(slot), r#"{"throttled":0}"#).json()["released"], true);
    }
    let mut limit = 0;
    for round in 0..1_000 {
        let first = send("/pools/p/lock/acquire", "");
        limit = first.header_u64("x-nthpool-effective-limit");
        if round == 0 {
            assert_eq!(limit, 4, "cut to the calls beside the refused one");
        }
        if limit == 8 {
            break;
        }
        let mut slots = vec![first.slot()];
        slots.extend((1..limit).map(|_| send("/pools/p/lock/acquire", "").slot()));
        for (i, slot) in slots.iter().enumerate() {
            let report = if i % 2 == 0 { "{}" } else { r#"{"throttled":0}"# };
            assert_eq!(send(&release(slot), report).json()["released"], true);
        }
    }
    assert_eq!(limit, 8, "grown back to concurrency");
}
