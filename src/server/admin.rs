//! The admin listener's routes: `GET /healthz` and `GET /metrics`.
//!
//! Served by the same event loop as the lock API but on its own listener;
//! lock routes are not served here and these are not served there. The
//! metrics text is built only when scraped, from plain counters.

use std::fmt::Write as _;

use crate::api::{App, LATENCY_BUCKETS_US};
use crate::dashboard;
use crate::governor::{DenyReason, Ms};
use crate::http::request::{Head, Method};
use crate::http::response::{error_body, Status};

/// Server-wide counters, bumped by the reactor.
#[derive(Debug, Default, Clone, Copy)]
pub struct ServerStats {
    pub connections_open: u64,
    pub connections_accepted: u64,
    pub connections_refused: u64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
    pub reloads_ok: u64,
    pub reloads_failed: u64,
    /// Proxy mode's counters, as of the scrape.
    pub proxy: crate::proxy::ProxyStats,
}

pub fn handle(head: &Head, app: &App, stats: &ServerStats, out: &mut Vec<u8>, close: bool, now: Ms) {
    let path = head.path.split_once('?').map_or(head.path, |(p, _)| p);
    let known = matches!(path, "/healthz" | "/metrics") || crate::dashboard::is_route(path);
    if known && !matches!(head.method, Method::Get | Method::Head) {
        let mut body = Vec::new();
        error_body(&mut body, "method_not_allowed", "Admin routes accept GET and HEAD only.");
        let mut w = dashboard::start(out, Status::MethodNotAllowed);
        w.header(b"Allow", b"GET, HEAD");
        w.finish_json(&body, close);
        return;
    }
    if crate::dashboard::handle(head, app, out, close) {
        return;
    }
    match path {
        // Still 200 while re-adopting: the holders' renewals must reach this
        // instance (a health check that took it out of rotation would turn
        // the window into lost slots); the body tells an operator why
        // acquires are refused.
        "/healthz" if app.governor().recovering(now) => {
            dashboard::start(out, Status::Ok).finish_json(b"{\"status\":\"recovering\"}", close)
        }
        "/healthz" => dashboard::start(out, Status::Ok).finish_json(b"{\"status\":\"ok\"}", close),
        "/metrics" => {
            let text = render(app, stats, now);
            let mut w = dashboard::start(out, Status::Ok);
            w.header(b"Content-Type", b"text/plain; version=0.0.4; charset=utf-8");
            w.finish(text.as_bytes(), close);
        }
        _ => {
            let mut body = Vec::new();
            error_body(&mut body, "not_found", "No such route.");
            dashboard::start(out, Status::NotFound).finish_json(&body, close);
        }
    }
}

/// One metric family: its `# HELP` and `# TYPE` lines.
fn family(t: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(t, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// The Prometheus text exposition of everything the server counts.
pub fn render(app: &App, stats: &ServerStats, now: Ms) -> String {
    let mut t = String::with_capacity(8192);
    let pools: Vec<_> = app.governor().pools().collect();
    type PoolValue = fn(&crate::governor::Pool) -> u64;
    let per_pool: [(&str, &str, &str, PoolValue); 10] = [
        ("nthpool_slots_held", "gauge", "Slots currently held.", |p| p.held as u64),
        ("nthpool_waiters", "gauge", "Acquires waiting in the queue.", |p| p.queue.len() as u64),
        ("nthpool_limit", "gauge", "Configured concurrency limit.", |p| p.settings.concurrency as u64),
        ("nthpool_effective_limit", "gauge", "Concurrency limit in force after adaptive cuts.", |p| {
            p.effective_limit() as u64
        }),
        ("nthpool_grants_total", "counter", "Slots granted.", |p| p.stats.grants),
        ("nthpool_queue_timeouts_total", "counter", "Queued acquires answered 504 at their deadline.", |p| {
            p.stats.queue_timeouts
        }),
        ("nthpool_waiters_gone_total", "counter", "Queued acquires whose client went away.", |p| p.stats.waiters_gone),
        ("nthpool_reports_throttled_total", "counter", "Outcome reports that saw upstream throttling.", |p| {
            p.stats.reports_throttled
        }),
        ("nthpool_cooldowns_total", "counter", "Cool-downs opened or extended by a retry hint.", |p| p.stats.cooldowns),
        ("nthpool_retired", "gauge", "1 when the pool was removed by a reload and is draining.", |p| p.retired as u64),
    ];
    for (name, kind, help, value) in &per_pool {
        family(&mut t, name, kind, help);
        for (_, p) in &pools {
            let _ = writeln!(t, "{name}{{pool=\"{}\"}} {}", p.name, value(p));
        }
    }
    family(&mut t, "nthpool_budget_remaining", "gauge", "Grants left in the learned upstream budget (-1: none).");
    for (_, p) in &pools {
        let v = p.learning.budget().map_or(-1, |b| b.remaining as i64);
        let _ = writeln!(t, "nthpool_budget_remaining{{pool=\"{}\"}} {v}", p.name);
    }
    render_learning(&mut t, app.governor());
    family(&mut t, "nthpool_rpm_tokens", "gauge", "Tokens in the requests-per-minute bucket.");
    for (_, p) in &pools {
        if let Some(tokens) = p.rpm_remaining() {
            let _ = writeln!(t, "nthpool_rpm_tokens{{pool=\"{}\"}} {tokens}", p.name);
        }
    }
    family(&mut t, "nthpool_recovering", "gauge", "1 while the pool's re-adoption window is open.");
    for (_, p) in &pools {
        let _ = writeln!(t, "nthpool_recovering{{pool=\"{}\"}} {}", p.name, p.recovering(now) as u8);
    }
    family(&mut t, "nthpool_readopted_total", "counter", "Slots held before a restart and re-adopted in the window.");
    for (_, p) in &pools {
        let _ = writeln!(t, "nthpool_readopted_total{{pool=\"{}\"}} {}", p.name, p.stats.readopted);
    }
    family(&mut t, "nthpool_idempotency_keys", "gauge", "Live Idempotency-Keys in the pool's store.");
    for (_, p) in &pools {
        let _ = writeln!(t, "nthpool_idempotency_keys{{pool=\"{}\"}} {}", p.name, p.idem.len());
    }
    family(&mut t, "nthpool_idempotent_replays_total", "counter", "Acquires answered with the grant their key held.");
    for (_, p) in &pools {
        let _ = writeln!(t, "nthpool_idempotent_replays_total{{pool=\"{}\"}} {}", p.name, p.stats.idempotent_replays);
    }
    family(&mut t, "nthpool_superseded_total", "counter", "Queued acquires whose place a retry with their key took.");
    for (_, p) in &pools {
        let _ = writeln!(t, "nthpool_superseded_total{{pool=\"{}\"}} {}", p.name, p.stats.superseded);
    }
    family(&mut t, "nthpool_denials_total", "counter", "Acquires answered 429, by reason.");
    for (_, p) in &pools {
        for reason in DenyReason::ALL {
            let _ = writeln!(
                t,
                "nthpool_denials_total{{pool=\"{}\",reason=\"{}\"}} {}",
                p.name,
                reason.as_str(),
                p.stats.denied[reason as usize]
            );
        }
    }
    family(&mut t, "nthpool_rejections_total", "counter", "Lock API answers of 400 and above, by status code.");
    for code in crate::api::Rejections::CODES {
        let _ = writeln!(t, "nthpool_rejections_total{{code=\"{code}\"}} {}", app.rejections.get(code));
    }
    family(
        &mut t,
        "nthpool_reclaims_total",
        "counter",
        "Leases reclaimed, by cause (term: not renewed; cap: request deadline).",
    );
    for (_, p) in &pools {
        let _ = writeln!(t, "nthpool_reclaims_total{{pool=\"{}\",cause=\"term\"}} {}", p.name, p.stats.reclaimed_term);
        let _ = writeln!(t, "nthpool_reclaims_total{{pool=\"{}\",cause=\"cap\"}} {}", p.name, p.stats.reclaimed_cap);
    }
    family(&mut t, "nthpool_renewals_total", "counter", "Renew requests, by outcome.");
    for (_, p) in &pools {
        for (outcome, v) in
            [("renewed", p.stats.renewed), ("not_found", p.stats.renew_not_found), ("capped", p.stats.renew_capped)]
        {
            let _ = writeln!(t, "nthpool_renewals_total{{pool=\"{}\",outcome=\"{outcome}\"}} {v}", p.name);
        }
    }
    family(&mut t, "nthpool_releases_total", "counter", "Release requests, by outcome.");
    for (_, p) in &pools {
        for (outcome, v) in [("released", p.stats.released), ("already_gone", p.stats.release_gone)] {
            let _ = writeln!(t, "nthpool_releases_total{{pool=\"{}\",outcome=\"{outcome}\"}} {v}", p.name);
        }
    }
    family(&mut t, "nthpool_acquire_server_time_us", "histogram", "Server time of acquire answers, in microseconds.");
    for ((_, p), h) in pools.iter().zip(&app.latency) {
        let labels = format!("pool=\"{}\",", p.name);
        histogram(&mut t, "nthpool_acquire_server_time_us", &labels, &LATENCY_BUCKETS_US, &h.counts, h.sum_us);
    }
    let server: [(&str, &str, &str, u64); 10] = [
        ("nthpool_connections_open", "gauge", "Open client connections (both listeners).", stats.connections_open),
        ("nthpool_connections_accepted_total", "counter", "Connections accepted.", stats.connections_accepted),
        (
            "nthpool_connections_refused_total",
            "counter",
            "Connections refused at the maxConnections cap.",
            stats.connections_refused,
        ),
        ("nthpool_bytes_received_total", "counter", "Bytes read from clients.", stats.bytes_received),
        ("nthpool_bytes_sent_total", "counter", "Bytes written to clients.", stats.bytes_sent),
        ("nthpool_config_reloads_total", "counter", "Configuration reloads applied.", stats.reloads_ok),
        ("nthpool_config_reload_failures_total", "counter", "Configuration reloads refused.", stats.reloads_failed),
        ("nthpool_access_log_lines_total", "counter", "Access log lines written or buffered.", app.log.lines),
        ("nthpool_access_log_write_errors_total", "counter", "Failed access log writes.", app.log.write_errors),
        (
            "nthpool_access_log_dropped_total",
            "counter",
            "Access log lines dropped while writes failed.",
            app.log.dropped,
        ),
    ];
    unlabelled(&mut t, &server);
    render_proxy(&mut t, &stats.proxy);
    t
}

/// Proxy mode: exchanges by upstream status class, upstream time, bytes,
/// upstream connections.
fn render_proxy(t: &mut String, p: &crate::proxy::ProxyStats) {
    use crate::proxy::UPSTREAM_MS_BUCKETS;
    family(
        t,
        "nthpool_proxy_requests_total",
        "counter",
        "Proxied exchanges ended, by upstream status class (none: no upstream answer).",
    );
    for (i, class) in ["none", "1xx", "2xx", "3xx", "4xx", "5xx"].iter().enumerate() {
        let _ = writeln!(t, "nthpool_proxy_requests_total{{class=\"{class}\"}} {}", p.by_class[i]);
    }
    family(
        t,
        "nthpool_proxy_upstream_time_ms",
        "histogram",
        "From sending a request upstream to the end of its exchange, in ms.",
    );
    histogram(t, "nthpool_proxy_upstream_time_ms", "", &UPSTREAM_MS_BUCKETS, &p.upstream_ms, p.upstream_ms_sum);
    let plain: [(&str, &str, &str, u64); 9] = [
        ("nthpool_proxy_bytes_up_total", "counter", "Request bytes relayed to upstreams.", p.bytes_up),
        ("nthpool_proxy_bytes_down_total", "counter", "Response bytes relayed to clients.", p.bytes_down),
        ("nthpool_proxy_upstream_connects_total", "counter", "Upstream connections opened.", p.upstream_connects),
        (
            "nthpool_proxy_upstream_connection_errors_total",
            "counter",
            "Upstream connections that failed to open.",
            p.upstream_connect_errors,
        ),
        (
            "nthpool_proxy_upstream_reuses_total",
            "counter",
            "Requests sent on a kept-alive upstream connection.",
            p.upstream_reuses,
        ),
        (
            "nthpool_proxy_retries_total",
            "counter",
            "Requests sent again on a fresh connection: a reused one failed before any byte, or a connect failed with addresses left.",
            p.retries,
        ),
        ("nthpool_proxy_idle_connections", "gauge", "Idle keep-alive upstream connections kept.", p.idle),
        (
            "nthpool_proxy_tls_failures_total",
            "counter",
            "TLS sessions with upstreams refused or broken (the log names each cause).",
            p.tls_failures,
        ),
        (
            "nthpool_proxy_tls_resumed_total",
            "counter",
            "TLS sessions with upstreams resumed instead of a full handshake.",
            p.tls_resumed,
        ),
    ];
    unlabelled(t, &plain);
}

/// Families of one sample each, without labels.
fn unlabelled(t: &mut String, rows: &[(&str, &str, &str, u64)]) {
    for (name, kind, help, v) in rows {
        family(t, name, kind, help);
        let _ = writeln!(t, "{name} {v}");
    }
}

/// The samples of one histogram: cumulative buckets (`counts` has one more,
/// the +Inf bucket, than `bounds`), sum and count. `labels` is empty or ends in `,`.
fn histogram(t: &mut String, name: &str, labels: &str, bounds: &[u64], counts: &[u64], sum: u64) {
    let mut cumulative = 0;
    for (le, n) in bounds.iter().zip(counts) {
        cumulative += n;
        let _ = writeln!(t, "{name}_bucket{{{labels}le=\"{le}\"}} {cumulative}");
    }
    cumulative += counts[bounds.len()];
    let _ = writeln!(t, "{name}_bucket{{{labels}le=\"+Inf\"}} {cumulative}");
    let bare = labels.trim_end_matches(',');
    let braces = |inner: &str| if inner.is_empty() { String::new() } else { format!("{{{inner}}}") };
    let _ = writeln!(t, "{name}_sum{} {sum}", braces(bare));
    let _ = writeln!(t, "{name}_count{} {cumulative}", braces(bare));
}

/// What limits each pool now, and what it learned of the upstream's limits.
fn render_learning<T: Copy>(t: &mut String, gov: &crate::governor::Governor<T>) {
    let now = gov.advanced_to();
    let reasons = [DenyReason::Concurrency, DenyReason::Rate, DenyReason::Cooldown];
    family(t, "nthpool_limited_by", "gauge", "1 for the reason a pool cannot grant now (concurrency, rate, cooldown).");
    for (_, p) in gov.pools() {
        let blocked = p.blocked(now).map(|(reason, _)| reason);
        for reason in reasons {
            let v = u8::from(blocked == Some(reason));
            let _ = writeln!(t, "nthpool_limited_by{{pool=\"{}\",reason=\"{}\"}} {v}", p.name, reason.as_str());
        }
    }
    type Learned = fn(&crate::governor::learn::Learning, u64) -> i64;
    let learned: [(&str, &str, Learned); 6] = [
        ("nthpool_learned_refused_at", "Lowest in-flight count the upstream refused (0: none known).", |l, _| {
            l.refused_at as i64
        }),
        ("nthpool_budget_limit", "Requests per window the upstream announced (-1: unknown).", |l, _| {
            l.budget_limit.map_or(-1, |v| v as i64)
        }),
        ("nthpool_budget_reset_ms", "Time until the learned budget window resets (-1: none).", |l, now| {
            l.budget.map_or(-1, |b| b.reset_at.saturating_sub(now) as i64)
        }),
        ("nthpool_cooldown_ms", "Time left in the pool-wide cool-down.", |l, now| {
            l.cooldown_until.saturating_sub(now) as i64
        }),
        ("nthpool_learning_starting", "1 while the start's limit ramps up (no concurrency refusal yet).", |l, _| {
            i64::from(l.start != crate::governor::learn::Start::Done)
        }),
        (
            "nthpool_budget_paced_next_ms",
            "Time until a paced refill allows the next grant (-1: not paced).",
            |l, now| l.pace.map_or(-1, |p| p.next_at().saturating_sub(now) as i64),
        ),
    ];
    for (name, help, value) in learned {
        family(t, name, "gauge", help);
        for (_, p) in gov.pools() {
            let _ = writeln!(t, "{name}{{pool=\"{}\"}} {}", p.name, value(&p.learning, now));
        }
    }
}
