//! The command line of `nthpool-fleet`.

use std::time::Duration;

pub const HELP: &str = "\
nthpool-fleet — a fleet of workers against a mock rate-limited upstream, through nthpool

USAGE:
    nthpool-fleet [OPTIONS]

RUN:
    --name NAME               scenario name in the output row (default: the mode)
    --mode MODE               lock (acquire → upstream → release with the report; default),
                              static (lock through a pool configured right for the upstream:
                              concurrency and rpm of the upstream, adaptive off),
                              direct (no nthpool: call, on 429 sleep Retry-After, retry),
                              proxy (the call goes to the pool's proxy: Host fleet.proxy
                              on the server, which acquires, calls the upstream and releases
                              with its answer; a refused call is retried after Retry-After)
    -w, --workers N           workers (default 100)
    --processes K             split the workers over K child processes (default 1)
    -d, --duration SECS       measured run (default 60; at most 3600)
    --max-calls N             stop early after N upstream calls in all (default 200000)
    --wait-ms MS              acquire wait budget `waitMs` (default 30000)
    --no-hint-ms MS           back-off after a 429 without Retry-After (default 1000)
    --settle-secs S           sliding window of the 429-share settle measure (default 5)
    --json                    print one JSON object with a per-second timeline
    --json-file PATH          also write that JSON object to PATH
    --no-header               print only the table row

UPSTREAM (embedded, 127.0.0.1, ephemeral port):
    --upstream-concurrency N  calls in flight it allows (default 20; 0 = unlimited)
    --upstream-rpm N          requests per minute it allows (default 600; 0 = unlimited)
    --window SECS             rate window (default 6: budget rpm*window/60 per window)
    --window-kind fixed|sliding   (default fixed)
    --count-refused           refused calls count against the budget
    --dialect D               openai (default), anthropic, ietf, ietf-structured,
                              xratelimit, remaining-only, reset-only, retry-after,
                              none
    --stamp admission|response    when rate headers are computed (default admission)
    --service DIST            fixed:MS, uniform:LO:HI, lognormal:MEDIAN:P99 (ms);
                              default lognormal:500:2000
    --change AT:SPEC          limit change at AT (e.g. 30s) to SPEC
                              (concurrency=N,rpm=N); repeatable
    --seed N                  service-time random seed (default 1)

NTHPOOL:
    --nthpool PATH            server binary (default: nthpool next to this binary)
    --pool-concurrency N      pool `concurrency` (default 64)
    --pool-rpm N              pool `rpm` (default none)
    --adaptive on|off         pool `adaptive` (default on)
    --queue-size N            pool `queue.size` (default 1000)
    --access-log PATH         server access log (default off)
    --server ADDR             use a running server instead (with --key and --pool)
    --key K, --pool P         key and pool on --server
    -h, --help                this text

Stops by itself after --duration (plus at most one wait budget) or --max-calls.
Talks to loopback only.
";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Lock,
    Static,
    Direct,
    /// Through the server's proxy mode (the pool's `upstream`).
    Proxy,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    OpenAi,
    Anthropic,
    Ietf,
    IetfStructured,
    XRateLimit,
    /// `x-ratelimit-limit` and `-remaining`, no reset, no `retry-after`:
    /// a spent window that never says when it ends.
    RemainingOnly,
    /// OpenAI's `x-ratelimit-reset-requests` alone, no `retry-after`: when
    /// the window resets, nothing of what is left.
    ResetOnly,
    RetryAfter,
    None,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Service {
    Fixed(f64),
    Uniform(f64, f64),
    /// Median and sigma of ln(ms).
    LogNormal(f64, f64),
}

impl Service {
    /// Mean service time in ms: the constant, the midpoint, or median·e^(σ²/2).
    pub fn mean_ms(self) -> f64 {
        match self {
            Service::Fixed(v) => v,
            Service::Uniform(a, b) => (a + b) / 2.0,
            Service::LogNormal(m, s) => m * (s * s / 2.0).exp(),
        }
    }
}

/// Limits of the upstream; `None` is unlimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    pub concurrency: Option<u32>,
    pub rpm: Option<u32>,
}

#[derive(Clone, Copy, Debug)]
pub struct Change {
    pub at: Duration,
    pub concurrency: Option<Option<u32>>,
    pub rpm: Option<Option<u32>>,
}

impl Change {
    pub fn apply(&self, l: Limits) -> Limits {
        Limits { concurrency: self.concurrency.unwrap_or(l.concurrency), rpm: self.rpm.unwrap_or(l.rpm) }
    }
}

#[derive(Clone, Debug)]
pub struct Upstream {
    pub limits: Limits,
    pub window: Duration,
    pub sliding: bool,
    pub count_refused: bool,
    pub dialect: Dialect,
    pub stamp_at_admission: bool,
    pub service: Service,
    pub changes: Vec<Change>,
    pub seed: u64,
}

impl Upstream {
    /// Budget per window for a per-minute rate: rpm · window / 60, at least 1.
    pub fn budget(&self, rpm: u32) -> u32 {
        ((rpm as f64 * self.window.as_secs_f64() / 60.0).round() as u32).max(1)
    }
}

#[derive(Clone, Debug)]
pub struct Pool {
    pub concurrency: u32,
    pub rpm: Option<u32>,
    pub adaptive: bool,
    pub queue_size: u32,
    pub access_log: Option<String>,
}

#[derive(Clone, Debug)]
pub struct Options {
    pub name: Option<String>,
    pub mode: Mode,
    pub workers: usize,
    pub processes: usize,
    pub duration: Duration,
    pub max_calls: u64,
    pub wait_ms: u64,
    pub no_hint_ms: u64,
    pub settle_secs: usize,
    pub json: bool,
    pub json_file: Option<String>,
    pub no_header: bool,
    pub upstream: Upstream,
    pub nthpool: Option<String>,
    pub pool: Pool,
    pub server: Option<String>,
    pub key: Option<String>,
    pub pool_name: Option<String>,
    /// Set in a child process: the parent's upstream and server, and the run's origin.
    pub child: Option<Child>,
}

#[derive(Clone, Debug)]
pub struct Child {
    pub upstream: String,
    pub origin_epoch_ms: u64,
}

pub enum Command {
    Run(Box<Options>),
    Help,
}

impl Options {
    pub fn name(&self) -> String {
        self.name.clone().unwrap_or_else(|| mode_name(self.mode).to_string())
    }

    /// The pool as it is configured for this run: `static` derives it from the upstream.
    pub fn effective_pool(&self) -> Pool {
        let mut p = self.pool.clone();
        if self.mode == Mode::Static {
            p.concurrency = self.upstream.limits.concurrency.unwrap_or(p.concurrency);
            p.rpm = self.upstream.limits.rpm;
            p.adaptive = false;
        }
        p
    }
}

pub fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Lock => "lock",
        Mode::Static => "static",
        Mode::Direct => "direct",
        Mode::Proxy => "proxy",
    }
}

pub fn dialect_name(d: Dialect) -> &'static str {
    match d {
        Dialect::OpenAi => "openai",
        Dialect::Anthropic => "anthropic",
        Dialect::Ietf => "ietf",
        Dialect::IetfStructured => "ietf-structured",
        Dialect::XRateLimit => "xratelimit",
        Dialect::RemainingOnly => "remaining-only",
        Dialect::ResetOnly => "reset-only",
        Dialect::RetryAfter => "retry-after",
        Dialect::None => "none",
    }
}

fn num<T: std::str::FromStr>(name: &str, v: &str) -> Result<T, String> {
    v.parse().map_err(|_| format!("{name}: {v:?} is not a valid number"))
}

/// `0` is unlimited.
fn limit(name: &str, v: &str) -> Result<Option<u32>, String> {
    let n: u32 = num(name, v)?;
    Ok((n > 0).then_some(n))
}

/// `30`, `30s`, `1500ms`, `1m`.
pub fn duration(name: &str, v: &str) -> Result<Duration, String> {
    let bad = || format!("{name}: {v:?} is not a duration like 30s, 1500ms or 1m");
    let (n, scale) = if let Some(n) = v.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = v.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix('m') {
        (n, 60.0)
    } else {
        (v, 1.0)
    };
    let secs = n.parse::<f64>().map_err(|_| bad())? * scale;
    if !(0.0..=86_400.0).contains(&secs) {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(secs))
}

fn service(v: &str) -> Result<Service, String> {
    let bad = || format!("--service: {v:?} is not fixed:MS, uniform:LO:HI or lognormal:MEDIAN:P99");
    let parts: Vec<&str> = v.split(':').collect();
    let n = |i: usize| parts.get(i).and_then(|p| p.parse::<f64>().ok()).filter(|x| *x >= 0.0).ok_or_else(bad);
    match (parts[0], parts.len()) {
        ("fixed", 2) => Ok(Service::Fixed(n(1)?)),
        ("uniform", 3) if n(1)? <= n(2)? => Ok(Service::Uniform(n(1)?, n(2)?)),
        ("lognormal", 3) if n(1)? > 0.0 && n(2)? >= n(1)? => {
            // p99 = median · e^(z₀.₉₉ σ)
            Ok(Service::LogNormal(n(1)?, (n(2)? / n(1)?).ln() / 2.326_348))
        }
        _ => Err(bad()),
    }
}

fn change(v: &str) -> Result<Change, String> {
    let (at, spec) = v.split_once(':').ok_or_else(|| format!("--change: {v:?} is not AT:SPEC"))?;
    let mut c = Change { at: duration("--change", at)?, concurrency: None, rpm: None };
    for kv in spec.split(',') {
        match kv.split_once('=') {
            Some(("concurrency", n)) => c.concurrency = Some(limit("--change concurrency", n)?),
            Some(("rpm", n)) => c.rpm = Some(limit("--change rpm", n)?),
            _ => return Err(format!("--change: {kv:?} is not concurrency=N or rpm=N")),
        }
    }
    Ok(c)
}

fn on_off(name: &str, v: &str) -> Result<bool, String> {
    match v {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err(format!("{name}: {v:?} is not on or off")),
    }
}

pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, String> {
    let mut o = Options {
        name: None,
        mode: Mode::Lock,
        workers: 100,
        processes: 1,
        duration: Duration::from_secs(60),
        max_calls: 200_000,
        wait_ms: 30_000,
        no_hint_ms: 1000,
        settle_secs: 5,
        json: false,
        json_file: None,
        no_header: false,
        upstream: Upstream {
            limits: Limits { concurrency: Some(20), rpm: Some(600) },
            window: Duration::from_secs(6),
            sliding: false,
            count_refused: false,
            dialect: Dialect::OpenAi,
            stamp_at_admission: true,
            service: Service::LogNormal(500.0, (4.0f64).ln() / 2.326_348),
            changes: Vec::new(),
            seed: 1,
        },
        nthpool: None,
        pool: Pool { concurrency: 64, rpm: None, adaptive: true, queue_size: 1000, access_log: None },
        server: None,
        key: None,
        pool_name: None,
        child: None,
    };
    let mut child_upstream = None;
    let mut child_origin = None;
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--name" => o.name = Some(value("--name")?),
            "--mode" => {
                o.mode = match value("--mode")?.as_str() {
                    "lock" => Mode::Lock,
                    "static" => Mode::Static,
                    "direct" => Mode::Direct,
                    "proxy" => Mode::Proxy,
                    v => return Err(format!("--mode: {v:?} is not lock, static, direct or proxy")),
                }
            }
            "-w" | "--workers" => o.workers = num("--workers", &value("--workers")?)?,
            "--processes" => o.processes = num("--processes", &value("--processes")?)?,
            "-d" | "--duration" => o.duration = duration("--duration", &value("--duration")?)?,
            "--max-calls" => o.max_calls = num("--max-calls", &value("--max-calls")?)?,
            "--wait-ms" => o.wait_ms = num("--wait-ms", &value("--wait-ms")?)?,
            "--no-hint-ms" => o.no_hint_ms = num("--no-hint-ms", &value("--no-hint-ms")?)?,
            "--settle-secs" => o.settle_secs = num("--settle-secs", &value("--settle-secs")?)?,
            "--json" => o.json = true,
            "--json-file" => o.json_file = Some(value("--json-file")?),
            "--no-header" => o.no_header = true,
            "--upstream-concurrency" => {
                o.upstream.limits.concurrency = limit(&arg, &value(&arg)?)?;
            }
            "--upstream-rpm" => o.upstream.limits.rpm = limit(&arg, &value(&arg)?)?,
            "--window" => o.upstream.window = duration("--window", &value("--window")?)?,
            "--window-kind" => {
                o.upstream.sliding = match value("--window-kind")?.as_str() {
                    "fixed" => false,
                    "sliding" => true,
                    v => return Err(format!("--window-kind: {v:?} is not fixed or sliding")),
                }
            }
            "--count-refused" => o.upstream.count_refused = true,
            "--dialect" => {
                let v = value("--dialect")?;
                o.upstream.dialect = [
                    Dialect::OpenAi,
                    Dialect::Anthropic,
                    Dialect::Ietf,
                    Dialect::IetfStructured,
                    Dialect::XRateLimit,
                    Dialect::RemainingOnly,
                    Dialect::ResetOnly,
                    Dialect::RetryAfter,
                    Dialect::None,
                ]
                .into_iter()
                .find(|d| dialect_name(*d) == v)
                .ok_or_else(|| format!("--dialect: {v:?} is not a known dialect (see --help)"))?;
            }
            "--stamp" => {
                o.upstream.stamp_at_admission = match value("--stamp")?.as_str() {
                    "admission" => true,
                    "response" => false,
                    v => return Err(format!("--stamp: {v:?} is not admission or response")),
                }
            }
            "--service" => o.upstream.service = service(&value("--service")?)?,
            "--change" => o.upstream.changes.push(change(&value("--change")?)?),
            "--seed" => o.upstream.seed = num("--seed", &value("--seed")?)?,
            "--nthpool" => o.nthpool = Some(value("--nthpool")?),
            "--pool-concurrency" => o.pool.concurrency = num(&arg, &value(&arg)?)?,
            "--pool-rpm" => o.pool.rpm = limit(&arg, &value(&arg)?)?,
            "--adaptive" => o.pool.adaptive = on_off("--adaptive", &value("--adaptive")?)?,
            "--queue-size" => o.pool.queue_size = num(&arg, &value(&arg)?)?,
            "--access-log" => o.pool.access_log = Some(value("--access-log")?),
            "--server" => o.server = Some(value("--server")?),
            "--key" => o.key = Some(value("--key")?),
            "--pool" => o.pool_name = Some(value("--pool")?),
            // Internal: how the parent starts a child process.
            "--child-upstream" => child_upstream = Some(value(&arg)?),
            "--child-origin-ms" => child_origin = Some(num(&arg, &value(&arg)?)?),
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    if let (Some(upstream), Some(origin_epoch_ms)) = (child_upstream, child_origin) {
        o.child = Some(Child { upstream, origin_epoch_ms });
    }
    if o.workers == 0 || o.processes == 0 || o.processes > o.workers || o.processes > 64 {
        return Err("--workers must be at least 1 and --processes between 1 and min(64, workers)".into());
    }
    if o.duration.is_zero() || o.duration > Duration::from_secs(3600) {
        return Err("--duration must be above 0 and at most 3600 s".into());
    }
    if o.upstream.window.is_zero() {
        return Err("--window must be above 0".into());
    }
    if o.server.is_some() && (o.key.is_none() || o.pool_name.is_none()) {
        return Err("--server needs --key and --pool".into());
    }
    if o.settle_secs == 0 {
        return Err("--settle-secs must be at least 1".into());
    }
    o.upstream.changes.sort_by_key(|c| c.at);
    Ok(Command::Run(Box::new(o)))
}
