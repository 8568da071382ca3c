//! The Prometheus text of `GET /metrics`, rendered from a [`MetricsSnapshot`]:
//! plain data, per pool and server-wide, that `api` fills from the governor
//! and the reactor from its own counters. Nothing here knows a pool, a
//! lease or a socket, so what is exposed and how it is counted are apart.
//!
//! Also the histograms those numbers come from ([`Histogram`]): recorded on
//! the request path in O(1), without allocating or formatting; the text is
//! built only when scraped.

/// Upper bounds of the acquire server-time buckets, in µs.
pub const ACQUIRE_US: [u64; 12] = [10, 25, 50, 100, 250, 500, 1000, 2500, 10_000, 100_000, 1_000_000, 10_000_000];
/// Upper bounds of the proxied upstream-time buckets, in ms.
pub const UPSTREAM_MS: [u64; 12] = [5, 10, 25, 50, 100, 250, 500, 1000, 2500, 10_000, 60_000, 600_000];
/// The most bounds a histogram has (one more bucket: +Inf).
const MAX_BOUNDS: usize = 16;

/// Counts of values by bucket (not cumulative; the last is +Inf) and their sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Histogram {
    bounds: &'static [u64],
    counts: [u64; MAX_BOUNDS + 1],
    sum: u64,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending, at most 16).
    pub const fn new(bounds: &'static [u64]) -> Histogram {
        assert!(bounds.len() <= MAX_BOUNDS);
        Histogram { bounds, counts: [0; MAX_BOUNDS + 1], sum: 0 }
    }

    /// The acquire server-time histogram, in µs.
    pub const fn acquire_us() -> Histogram {
        Histogram::new(&ACQUIRE_US)
    }

    /// Counts `value`. The bucket is found from the lowest bound up: at most
    /// 16 steps, and one for the usual value (most fall in the first buckets).
    pub fn observe(&mut self, value: u64) {
        self.observe_in(self.bucket_of(value), value);
    }

    /// The bucket `observe` counts `value` in.
    pub fn bucket_of(&self, value: u64) -> usize {
        self.bounds.iter().position(|&b| value <= b).unwrap_or(self.bounds.len())
    }

    /// Counts `value` in `bucket`, which `bucket_of` found for it on a
    /// histogram with these bounds (so values repeated across histograms
    /// are looked up once).
    pub fn observe_in(&mut self, bucket: usize, value: u64) {
        debug_assert_eq!(bucket, self.bucket_of(value), "{value} is not in bucket {bucket}");
        self.counts[bucket] += 1;
        self.sum = self.sum.saturating_add(value);
    }

    /// Count per bucket, the +Inf one last.
    pub fn counts(&self) -> &[u64] {
        &self.counts[..=self.bounds.len()]
    }

    #[cfg(test)]
    pub fn sum(&self) -> u64 {
        self.sum
    }
}

/// Everything `/metrics` shows, as of one scrape; the reactor's counters
/// are borrowed, not copied.
#[derive(Debug, Clone)]
pub struct MetricsSnapshot<'s> {
    /// Every pool, retired ones included, in the governor's order.
    pub pools: Vec<PoolMetrics>,
    /// Lock API answers of 400 and above whose pool is unknown or not yet
    /// resolved, by status code (each pool's are in `PoolMetrics`).
    pub rejections: Vec<(u16, u64)>,
    pub access_log: AccessLogCounters,
    pub server: &'s ServerStats,
}

/// One pool's values.
#[derive(Debug, Clone)]
pub struct PoolMetrics {
    pub name: String,
    /// Its index among the governor's pools (`PoolId`): what the proxy's
    /// per-pool counters are indexed by (a drained pool is not listed).
    pub index: usize,
    /// It names an upstream (proxy mode): a pool has the
    /// `nthpool_proxy_pool_*` series when it does, or once proxied.
    pub proxied: bool,
    pub held: u64,
    pub waiters: u64,
    pub limit: u64,
    pub effective_limit: u64,
    pub grants: u64,
    pub queue_timeouts: u64,
    pub waiters_gone: u64,
    pub reports_throttled: u64,
    pub cooldowns: u64,
    pub retired: bool,
    /// Grants left in the learned budget; -1: none learned.
    pub budget_remaining: i64,
    /// Each reason a pool can be blocked by, and whether it is the one now.
    pub limited_by: [(&'static str, bool); 3],
    pub learned_refused_at: i64,
    /// -1: unknown.
    pub budget_limit: i64,
    /// -1: no budget window.
    pub budget_reset_ms: i64,
    pub cooldown_ms: i64,
    pub learning_starting: bool,
    /// -1: not paced.
    pub budget_paced_next_ms: i64,
    /// Time until a spent token window lets grants through; -1: none spent.
    pub token_block_ms: i64,
    /// `None`: the pool has no rate gate.
    pub rpm_tokens: Option<u32>,
    pub recovering: bool,
    pub readopted: u64,
    pub idempotency_keys: u64,
    pub idempotent_replays: u64,
    pub superseded: u64,
    /// 429 answers by reason.
    pub denials: Vec<(&'static str, u64)>,
    /// Leases reclaimed by cause: `term`, `cap`.
    pub reclaims: [(&'static str, u64); 2],
    /// Renew requests by outcome: `renewed`, `not_found`, `capped`.
    pub renewals: [(&'static str, u64); 3],
    /// Release requests by outcome: `released`, `already_gone`.
    pub releases: [(&'static str, u64); 2],
    /// Lock API answers of 400 and above about this pool, by status code.
    pub rejections: Vec<(u16, u64)>,
    /// `None` for a pool added since the histograms were sized.
    pub acquire_us: Option<Histogram>,
}

#[derive(Debug, Clone, Copy, Default)]
pub struct AccessLogCounters {
    pub lines: u64,
    pub write_errors: u64,
    pub dropped: u64,
}

/// Server-wide counters, bumped by the reactor.
#[derive(Debug, Default, Clone)]
pub struct ServerStats {
    pub connections_open: u64,
    /// What the connections' buffers hold allocated, summed for a scrape.
    pub connection_buffer_bytes: u64,
    pub connections_accepted: u64,
    pub connections_refused: u64,
    pub bytes_received: u64,
    pub bytes_sent: u64,
    pub reloads_ok: u64,
    pub reloads_failed: u64,
    /// The server's own log lines a standard error with no room dropped.
    pub log_lines_dropped: u64,
    /// Proxy mode's counters, as of the scrape.
    pub proxy: ProxyStats,
}

/// Proxy counters, bumped by the reactor's proxy exchanges: server-wide,
/// and what the pools' exchanges did, each pool apart.
#[derive(Debug, Clone, Default)]
pub struct ProxyStats {
    pub upstream_connects: u64,
    /// TLS sessions refused or broken, by either side.
    pub tls_failures: u64,
    /// TLS sessions resumed from an earlier one instead of a full handshake.
    pub tls_resumed: u64,
    pub upstream_reuses: u64,
    pub retries: u64,
    /// Every pool's exchanges together.
    pub total: Traffic,
    /// Each pool's, indexed by pool id; a pool without exchanges yet may
    /// be missing (it has nothing to count).
    pub pools: Vec<Traffic>,
}

/// What proxied exchanges did: by upstream status class, upstream time,
/// bytes each way, failed upstream connections, idle connections.
#[derive(Debug, Clone, Copy)]
pub struct Traffic {
    /// Ended exchanges by the upstream's status class (`[1]` = 1xx ... `[5]`
    /// = 5xx); `[0]`: no upstream status (refused, failed, or the client left first).
    pub by_class: [u64; 6],
    /// Request and response bytes relayed, as written to the other side.
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// From sending the request to the end of the exchange, in ms.
    pub upstream_ms: Histogram,
    /// Upstream connections that failed to open.
    pub connect_errors: u64,
    /// Idle keep-alive connections, as of the scrape.
    pub idle: u64,
}

impl Default for Traffic {
    fn default() -> Self {
        Traffic {
            by_class: [0; 6],
            bytes_up: 0,
            bytes_down: 0,
            upstream_ms: Histogram::new(&UPSTREAM_MS),
            connect_errors: 0,
            idle: 0,
        }
    }
}

impl Traffic {
    /// Whether anything was counted (an exchange, a failed connection, an
    /// idle connection).
    fn any(&self) -> bool {
        self.by_class.iter().any(|&n| n > 0) || self.connect_errors > 0 || self.idle > 0
    }

    fn count(&mut self, upstream_status: Option<u16>, upstream_ms: Option<u64>, bytes_up: u64, bytes_down: u64) {
        let class = upstream_status.map_or(0, |s| (s / 100).clamp(1, 5) as usize);
        self.by_class[class] += 1;
        self.bytes_up += bytes_up;
        self.bytes_down += bytes_down;
        if let Some(ms) = upstream_ms {
            self.upstream_ms.observe(ms);
        }
    }
}

impl ProxyStats {
    /// Pool `pool`'s counters (pool ids are small and dense).
    pub fn pool(&mut self, pool: usize) -> &mut Traffic {
        if self.pools.len() <= pool {
            self.pools.resize(pool + 1, Traffic::default());
        }
        &mut self.pools[pool]
    }

    /// An ended exchange of `pool`: its upstream status, time and bytes each way.
    pub fn count(
        &mut self,
        pool: usize,
        upstream_status: Option<u16>,
        upstream_ms: Option<u64>,
        bytes_up: u64,
        bytes_down: u64,
    ) {
        self.total.count(upstream_status, upstream_ms, bytes_up, bytes_down);
        self.pool(pool).count(upstream_status, upstream_ms, bytes_up, bytes_down);
    }

    /// A proxied request of `pool` refused before it reached the upstream
    /// (by its pool's limits or access rules): no upstream status.
    pub fn refused(&mut self, pool: usize) {
        self.count(pool, None, None, 0, 0);
    }

    /// An upstream connection of `pool` that failed to open.
    pub fn connect_error(&mut self, pool: usize) {
        self.total.connect_errors += 1;
        self.pool(pool).connect_errors += 1;
    }
}

/// Appends `s` to the text.
fn put(t: &mut Vec<u8>, s: &str) {
    t.extend_from_slice(s.as_bytes());
}

/// One metric family: its `# HELP` and `# TYPE` lines.
fn family(t: &mut Vec<u8>, name: &str, kind: &str, help: &str) {
    for part in ["# HELP ", name, " ", help, "\n# TYPE ", name, " ", kind, "\n"] {
        put(t, part);
    }
}

/// One sample line: `name{label="value",…} number`, its name given in parts
/// (`["x", "_bucket"]`). Written without the formatter: a scrape of
/// thousands of pools is tens of megabytes of these. Label values are pool
/// names and fixed words, which need no escaping.
fn sample(t: &mut Vec<u8>, name: &[&str], labels: &[(&str, &str)], value: impl itoa::Integer) {
    for part in name {
        put(t, part);
    }
    for (i, (label, text)) in labels.iter().enumerate() {
        put(t, if i == 0 { "{" } else { "," });
        for part in [label, "=\"", text, "\""] {
            put(t, part);
        }
    }
    put(t, if labels.is_empty() { " " } else { "} " });
    put(t, itoa::Buffer::new().format(value));
    t.push(b'\n');
}

/// One family with a sample per pool.
fn per_pool<V: itoa::Integer>(
    t: &mut Vec<u8>,
    pools: &[PoolMetrics],
    (name, kind, help): (&str, &str, &str),
    value: impl Fn(&PoolMetrics) -> V,
) {
    family(t, name, kind, help);
    for p in pools {
        sample(t, &[name], &[("pool", &p.name)], value(p));
    }
}

/// One family with a sample per pool and value of a second label.
fn by_label(
    t: &mut Vec<u8>,
    pools: &[PoolMetrics],
    (name, kind, help): (&str, &str, &str),
    label: &str,
    values: impl Fn(&PoolMetrics) -> &[(&'static str, u64)],
) {
    family(t, name, kind, help);
    for p in pools {
        for &(value, n) in values(p) {
            sample(t, &[name], &[("pool", &p.name), (label, value)], n);
        }
    }
}

/// Appends the Prometheus text exposition of `m` to `t`: the connection's
/// output itself, so a large exposition is written once and held once.
pub fn render(t: &mut Vec<u8>, m: &MetricsSnapshot<'_>) {
    let pools = &m.pools;
    type PoolValue = fn(&PoolMetrics) -> u64;
    let plain: [(&str, &str, &str, PoolValue); 10] = [
        ("nthpool_slots_held", "gauge", "Slots currently held.", |p| p.held),
        ("nthpool_waiters", "gauge", "Acquires waiting in the queue.", |p| p.waiters),
        ("nthpool_limit", "gauge", "Configured concurrency limit.", |p| p.limit),
        ("nthpool_effective_limit", "gauge", "Concurrency limit in force after adaptive cuts.", |p| p.effective_limit),
        ("nthpool_grants_total", "counter", "Slots granted.", |p| p.grants),
        ("nthpool_queue_timeouts_total", "counter", "Queued acquires answered 504 at their deadline.", |p| {
            p.queue_timeouts
        }),
        ("nthpool_waiters_gone_total", "counter", "Queued acquires whose client went away.", |p| p.waiters_gone),
        ("nthpool_reports_throttled_total", "counter", "Outcome reports that saw upstream throttling.", |p| {
            p.reports_throttled
        }),
        ("nthpool_cooldowns_total", "counter", "Cool-downs opened or extended by a retry hint.", |p| p.cooldowns),
        ("nthpool_retired", "gauge", "1 when the pool was removed by a reload and is draining.", |p| p.retired as u64),
    ];
    for (name, kind, help, value) in plain {
        per_pool(t, pools, (name, kind, help), value);
    }
    let gauge = |name, help| (name, "gauge", help);
    per_pool(
        t,
        pools,
        gauge("nthpool_budget_remaining", "Grants left in the learned upstream budget (-1: none)."),
        |p| p.budget_remaining,
    );
    render_learning(t, pools);
    family(t, "nthpool_rpm_tokens", "gauge", "Tokens in the requests-per-minute bucket.");
    for p in pools {
        if let Some(tokens) = p.rpm_tokens {
            sample(t, &["nthpool_rpm_tokens"], &[("pool", &p.name)], tokens);
        }
    }
    per_pool(t, pools, gauge("nthpool_recovering", "1 while the pool's re-adoption window is open."), |p| {
        p.recovering as u8
    });
    let counter = |name, help| (name, "counter", help);
    per_pool(
        t,
        pools,
        counter("nthpool_readopted_total", "Slots held before a restart and re-adopted in the window."),
        |p| p.readopted,
    );
    per_pool(t, pools, gauge("nthpool_idempotency_keys", "Live Idempotency-Keys in the pool's store."), |p| {
        p.idempotency_keys
    });
    per_pool(
        t,
        pools,
        counter("nthpool_idempotent_replays_total", "Acquires answered with the grant their key held."),
        |p| p.idempotent_replays,
    );
    per_pool(
        t,
        pools,
        counter("nthpool_superseded_total", "Queued acquires whose place a retry with their key took."),
        |p| p.superseded,
    );
    by_label(t, pools, counter("nthpool_denials_total", "Acquires answered 429, by reason."), "reason", |p| &p.denials);
    family(
        t,
        "nthpool_rejections_total",
        "counter",
        "nthpool's own answers of 400 and above (lock API and proxy; relayed upstream answers not included), by pool and status code (no pool label: the pool is unknown or not yet resolved).",
    );
    for p in pools {
        for &(code, n) in &p.rejections {
            sample(
                t,
                &["nthpool_rejections_total"],
                &[("pool", &p.name), ("code", itoa::Buffer::new().format(code))],
                n,
            );
        }
    }
    for &(code, n) in &m.rejections {
        sample(t, &["nthpool_rejections_total"], &[("code", itoa::Buffer::new().format(code))], n);
    }
    let reclaims =
        counter("nthpool_reclaims_total", "Leases reclaimed, by cause (term: not renewed; cap: request deadline).");
    by_label(t, pools, reclaims, "cause", |p| &p.reclaims);
    by_label(t, pools, counter("nthpool_renewals_total", "Renew requests, by outcome."), "outcome", |p| &p.renewals);
    by_label(
        t,
        pools,
        counter(
            "nthpool_releases_total",
            "Releases, by outcome (a grant whose answer could not be written counts as released).",
        ),
        "outcome",
        |p| &p.releases,
    );
    family(t, "nthpool_acquire_server_time_us", "histogram", "Server time of acquire answers, in microseconds.");
    for p in pools {
        if let Some(h) = &p.acquire_us {
            histogram(t, "nthpool_acquire_server_time_us", Some(&p.name), h);
        }
    }
    let (s, log) = (m.server, &m.access_log);
    let server: [(&str, &str, &str, u64); 12] = [
        ("nthpool_connections_open", "gauge", "Open client connections (every listener).", s.connections_open),
        (
            "nthpool_connection_buffer_bytes",
            "gauge",
            "Bytes the client connections' buffers hold allocated.",
            s.connection_buffer_bytes,
        ),
        ("nthpool_connections_accepted_total", "counter", "Connections accepted.", s.connections_accepted),
        (
            "nthpool_connections_refused_total",
            "counter",
            "Connections refused at the maxConnections cap.",
            s.connections_refused,
        ),
        ("nthpool_bytes_received_total", "counter", "Bytes read from clients.", s.bytes_received),
        ("nthpool_bytes_sent_total", "counter", "Bytes written to clients.", s.bytes_sent),
        ("nthpool_config_reloads_total", "counter", "Configuration reloads applied.", s.reloads_ok),
        ("nthpool_config_reload_failures_total", "counter", "Configuration reloads refused.", s.reloads_failed),
        ("nthpool_access_log_lines_total", "counter", "Access log lines written or buffered.", log.lines),
        ("nthpool_access_log_write_errors_total", "counter", "Failed access log writes.", log.write_errors),
        (
            "nthpool_access_log_dropped_total",
            "counter",
            "Access log lines dropped while writes failed or fell behind.",
            log.dropped,
        ),
        (
            "nthpool_log_lines_dropped_total",
            "counter",
            "Server log lines dropped: standard error was not being read.",
            s.log_lines_dropped,
        ),
    ];
    unlabelled(t, &server);
    render_proxy(t, &s.proxy);
    render_proxy_pools(t, pools, &s.proxy.pools);
}

/// What limits each pool now, and what it learned of the upstream's limits.
fn render_learning(t: &mut Vec<u8>, pools: &[PoolMetrics]) {
    family(t, "nthpool_limited_by", "gauge", "1 for the reason a pool cannot grant now (concurrency, rate, cooldown).");
    for p in pools {
        for (reason, now) in p.limited_by {
            sample(t, &["nthpool_limited_by"], &[("pool", &p.name), ("reason", reason)], u8::from(now));
        }
    }
    type Learned = fn(&PoolMetrics) -> i64;
    let learned: [(&str, &str, Learned); 7] = [
        ("nthpool_learned_refused_at", "Lowest in-flight count the upstream refused (0: none known).", |p| {
            p.learned_refused_at
        }),
        ("nthpool_budget_limit", "Requests per window the upstream announced (-1: unknown).", |p| p.budget_limit),
        ("nthpool_budget_reset_ms", "Time until the learned budget window resets (-1: none).", |p| p.budget_reset_ms),
        ("nthpool_cooldown_ms", "Time left in the pool-wide cool-down.", |p| p.cooldown_ms),
        ("nthpool_learning_starting", "1 while the start's limit ramps up (no concurrency refusal yet).", |p| {
            i64::from(p.learning_starting)
        }),
        ("nthpool_budget_paced_next_ms", "Time until a paced refill allows the next grant (-1: not paced).", |p| {
            p.budget_paced_next_ms
        }),
        ("nthpool_token_block_ms", "Time until a spent upstream token window lets grants through (-1: none).", |p| {
            p.token_block_ms
        }),
    ];
    for (name, help, value) in learned {
        per_pool(t, pools, (name, "gauge", help), value);
    }
}

/// Proxy mode: exchanges by upstream status class, upstream time, bytes,
/// upstream connections.
fn render_proxy(t: &mut Vec<u8>, p: &ProxyStats) {
    family(
        t,
        "nthpool_proxy_requests_total",
        "counter",
        "Proxied exchanges ended, by upstream status class (none: no upstream answer).",
    );
    for (class, n) in CLASSES.iter().zip(p.total.by_class) {
        sample(t, &["nthpool_proxy_requests_total"], &[("class", class)], n);
    }
    family(
        t,
        "nthpool_proxy_upstream_time_ms",
        "histogram",
        "From sending a request upstream to the end of its exchange, in ms.",
    );
    histogram(t, "nthpool_proxy_upstream_time_ms", None, &p.total.upstream_ms);
    let plain: [(&str, &str, &str, u64); 9] = [
        ("nthpool_proxy_bytes_up_total", "counter", "Request bytes relayed to upstreams.", p.total.bytes_up),
        ("nthpool_proxy_bytes_down_total", "counter", "Response bytes relayed to clients.", p.total.bytes_down),
        (
            "nthpool_proxy_upstream_connects_total",
            "counter",
            "Upstream connections attempted (a failed one is counted in the errors too).",
            p.upstream_connects,
        ),
        (
            "nthpool_proxy_upstream_connection_errors_total",
            "counter",
            "Upstream connections that failed to open.",
            p.total.connect_errors,
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
        ("nthpool_proxy_idle_connections", "gauge", "Idle keep-alive upstream connections kept.", p.total.idle),
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

/// The upstream status classes of `Traffic::by_class`.
const CLASSES: [&str; 6] = ["none", "1xx", "2xx", "3xx", "4xx", "5xx"];

/// Proxy mode per pool: the server-wide proxy families' traffic, each pool
/// apart (`pools` by pool id; every pool has its series, zero until used).
fn render_proxy_pools(t: &mut Vec<u8>, pools: &[PoolMetrics], traffic: &[Traffic]) {
    let none = Traffic::default();
    let of = |i: usize| traffic.get(i).unwrap_or(&none);
    // A pool that never proxied has no proxy series: most pools of a server
    // with many do not proxy, and these would be a third of the scrape.
    let proxying: Vec<(usize, &PoolMetrics)> =
        pools.iter().map(|p| (p.index, p)).filter(|&(i, p)| p.proxied || of(i).any()).collect();
    family(
        t,
        "nthpool_proxy_pool_requests_total",
        "counter",
        "Proxied exchanges ended, by pool and upstream status class.",
    );
    for &(i, p) in &proxying {
        for (class, n) in CLASSES.iter().zip(of(i).by_class) {
            sample(t, &["nthpool_proxy_pool_requests_total"], &[("pool", &p.name), ("class", class)], n);
        }
    }
    family(t, "nthpool_proxy_pool_upstream_time_ms", "histogram", "A pool's upstream time per exchange, in ms.");
    for &(i, p) in &proxying {
        histogram(t, "nthpool_proxy_pool_upstream_time_ms", Some(&p.name), &of(i).upstream_ms);
    }
    type Value = fn(&Traffic) -> u64;
    let plain: [(&str, &str, &str, Value); 4] = [
        ("nthpool_proxy_pool_bytes_up_total", "counter", "Request bytes a pool relayed to its upstream.", |x| {
            x.bytes_up
        }),
        ("nthpool_proxy_pool_bytes_down_total", "counter", "Response bytes a pool relayed to clients.", |x| {
            x.bytes_down
        }),
        (
            "nthpool_proxy_pool_upstream_connection_errors_total",
            "counter",
            "A pool's upstream connections that failed to open.",
            |x| x.connect_errors,
        ),
        ("nthpool_proxy_pool_idle_connections", "gauge", "A pool's idle keep-alive upstream connections.", |x| x.idle),
    ];
    for (name, kind, help, value) in plain {
        family(t, name, kind, help);
        for &(i, p) in &proxying {
            sample(t, &[name], &[("pool", &p.name)], value(of(i)));
        }
    }
}

/// Families of one sample each, without labels.
fn unlabelled(t: &mut Vec<u8>, rows: &[(&str, &str, &str, u64)]) {
    for (name, kind, help, v) in rows {
        family(t, name, kind, help);
        sample(t, &[name], &[], *v);
    }
}

/// The samples of one histogram: cumulative buckets, sum and count, of
/// one pool's or of all.
fn histogram(t: &mut Vec<u8>, name: &str, pool: Option<&str>, h: &Histogram) {
    let pool_label = pool.map(|p| [("pool", p)]);
    let pool_only = pool_label.as_ref().map_or(&[][..], |label| &label[..]);
    let bucket = |t: &mut Vec<u8>, le: &str, n: u64| match pool {
        Some(p) => sample(t, &[name, "_bucket"], &[("pool", p), ("le", le)], n),
        None => sample(t, &[name, "_bucket"], &[("le", le)], n),
    };
    let mut cumulative = 0;
    for (&le, n) in h.bounds.iter().zip(h.counts()) {
        cumulative += n;
        bucket(t, itoa::Buffer::new().format(le), cumulative);
    }
    cumulative += h.counts[h.bounds.len()];
    bucket(t, "+Inf", cumulative);
    sample(t, &[name, "_sum"], pool_only, h.sum);
    sample(t, &[name, "_count"], pool_only, cumulative);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_land_in_the_first_bucket_that_holds_them() {
        let mut h = Histogram::acquire_us();
        for v in [0, 10, 11, u64::MAX / 2] {
            h.observe(v);
        }
        assert_eq!(h.counts().len(), ACQUIRE_US.len() + 1);
        assert_eq!((h.counts()[0], h.counts()[1], h.counts()[ACQUIRE_US.len()]), (2, 1, 1));
        assert_eq!(h.sum(), 21 + u64::MAX / 2);
        // Each bound is its own bucket's; one more is the next bucket's.
        for (i, &b) in ACQUIRE_US.iter().enumerate() {
            let mut h = Histogram::acquire_us();
            h.observe(b);
            h.observe(b + 1);
            assert_eq!((h.counts()[i], h.counts()[i + 1]), (1, 1), "bound {b}");
        }
    }

    #[test]
    fn a_histogram_renders_cumulative_buckets_sum_and_count() {
        let mut h = Histogram::new(&[1, 5]);
        for v in [1, 3, 9] {
            h.observe(v);
        }
        let mut t = Vec::new();
        histogram(&mut t, "x", Some("p"), &h);
        assert_eq!(
            String::from_utf8(t).unwrap(),
            "x_bucket{pool=\"p\",le=\"1\"} 1\nx_bucket{pool=\"p\",le=\"5\"} 2\nx_bucket{pool=\"p\",le=\"+Inf\"} 3\n\
             x_sum{pool=\"p\"} 13\nx_count{pool=\"p\"} 3\n"
        );
        let mut t = Vec::new();
        histogram(&mut t, "y", None, &Histogram::new(&[]));
        assert_eq!(String::from_utf8(t).unwrap(), "y_bucket{le=\"+Inf\"} 0\ny_sum 0\ny_count 0\n");
    }
}
