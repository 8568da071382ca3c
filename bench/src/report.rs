//! Turns merged [`Stats`] into the human table or the `--json` object.
//!
//! Formatting only: every number printed here was measured by the event loops.
//! The table follows `redis-benchmark`'s summary (throughput first, then a
//! latency row per request type); the JSON carries the same numbers with units
//! in the field names, for scripts comparing runs.

use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{json, Map, Value};

use crate::options::Options;
use crate::stats::{Endpoint, Stats};

/// The facts of one finished run that the report needs beside the counters.
pub struct Run<'a> {
    pub opts: &'a Options,
    /// The resolved address actually driven.
    pub target: String,
    /// Length of the measured window: the duration, or less when the request
    /// cap ended the run first.
    pub elapsed: Duration,
    pub stats: &'a Stats,
}

const QUANTILES: [(&str, f64); 4] = [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p99.9", 0.999)];

impl Run<'_> {
    fn endpoints(&self) -> impl Iterator<Item = Endpoint> + '_ {
        let get = self.opts.get.is_some();
        Endpoint::ALL.into_iter().filter(move |&ep| {
            let used = (ep == Endpoint::Get) == get;
            used && (ep != Endpoint::Renew || self.opts.renews > 0 || !self.stats.latency(ep).is_empty())
        })
    }

    fn per_second(&self, n: u64) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            n as f64 / s
        } else {
            0.0
        }
    }

    fn workload(&self) -> String {
        let o = self.opts;
        let vary = if o.vary_header { ", X-Request-Id new on every request" } else { "" };
        let report = if o.no_report { ", releases without a report" } else { "" };
        if o.redis.is_some() {
            return format!(
                "Redis semaphore: EVALSHA acquire -> ZREM release on sorted set {}, hold {} ms, back-off {} ms",
                o.pool,
                o.hold.as_millis(),
                o.backoff.as_millis()
            );
        }
        match &o.get {
            Some(path) => format!("GET {path}{vary}"),
            None => {
                let wait = match o.wait_ms {
                    Some(ms) => format!("wait {ms} ms"),
                    None => "fail fast".to_string(),
                };
                format!(
                    "acquire ({wait}) -> {} renews -> release on pool {}, hold {} ms, back-off {} ms{vary}{report}",
                    o.renews,
                    o.pool,
                    o.hold.as_millis(),
                    o.backoff.as_millis()
                )
            }
        }
    }

    fn pacing(&self) -> String {
        match self.opts.rate {
            Some(r) => format!("open loop at {r} requests/s"),
            None => "closed loop".to_string(),
        }
    }

    pub fn table(&self) -> String {
        let (o, s) = (self.opts, self.stats);
        let mut t = String::new();
        let plural = |n: usize| if n == 1 { "" } else { "s" };
        let _ = writeln!(t, "====== nthpool-bench {} ({}) ======", o.addr, self.target);
        let _ = writeln!(t, "  {}", self.workload());
        let _ = writeln!(
            t,
            "  {} connection{} on {} thread{}, {}, {:.2} s measured after {:.2} s warm-up",
            o.connections,
            plural(o.connections),
            o.threads,
            plural(o.threads),
            self.pacing(),
            self.elapsed.as_secs_f64(),
            o.warmup.as_secs_f64()
        );
        let _ = writeln!(t);
        let answers = s.answers();
        let _ = write!(t, "throughput: {:.1} requests/s", self.per_second(answers));
        if o.get.is_none() {
            let _ = write!(t, ", {:.1} cycles/s", self.per_second(s.cycles));
        }
        let _ = writeln!(t, "\n  {answers} answers, {} cycles\n", s.cycles);

        let _ = writeln!(
            t,
            "latency µs {:>11} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8}",
            "answers", "mean", "p50", "p90", "p99", "p99.9", "max"
        );
        for ep in self.endpoints() {
            let h = s.latency(ep);
            let _ = write!(t, "  {:<8} {:>11} {:>9.1}", ep.name(), h.len(), h.mean());
            for (_, q) in QUANTILES {
                let _ = write!(t, " {:>8}", h.value_at_quantile(q));
            }
            let _ = writeln!(t, " {:>8}", h.max());
        }
        if o.rate.is_some() {
            let h = &s.send_lag;
            let _ = writeln!(
                t,
                "  client send lag µs: p50 {} p99 {} max {} (how late the client itself sent)",
                h.value_at_quantile(0.5),
                h.value_at_quantile(0.99),
                h.max()
            );
        }

        let _ = write!(t, "\nanswers by status");
        let _ = writeln!(t, "{}", if answers == 0 { ": none" } else { "" });
        for ep in self.endpoints() {
            for (code, n) in s.statuses(ep) {
                let _ = writeln!(t, "  {:<8} {code} {n:>12}", ep.name());
            }
        }

        let _ = write!(t, "\nerrors");
        if s.failure_total() == 0 {
            let _ = writeln!(t, ": none");
        } else {
            let _ = writeln!(t);
            if s.connect_errors > 0 {
                let _ = writeln!(t, "  connect  {:>12}", s.connect_errors);
            }
            for ep in Endpoint::ALL {
                for (why, n) in s.failures(ep) {
                    let _ = writeln!(t, "  {:<8} {:<12} {n:>12}", ep.name(), why.name());
                }
            }
        }
        if s.idle_closes > 0 {
            let _ = writeln!(t, "  ({} keep-alive connections closed by the server)", s.idle_closes);
        }
        t
    }

    pub fn json(&self) -> Value {
        let (o, s) = (self.opts, self.stats);
        let mut endpoints = Map::new();
        for ep in self.endpoints() {
            let statuses: Map<String, Value> = s.statuses(ep).map(|(c, n)| (c.to_string(), n.into())).collect();
            let errors: Map<String, Value> = s.failures(ep).map(|(f, n)| (f.name().to_string(), n.into())).collect();
            let mut e = latency_json(s.latency(ep));
            e.insert("statuses".into(), statuses.into());
            e.insert("errors".into(), errors.into());
            endpoints.insert(ep.name().into(), e.into());
        }
        json!({
            "addr": o.addr,
            "target": self.target,
            "mode": if o.get.is_some() { "get" } else if o.redis.is_some() { "redis" } else { "lock" },
            "path": o.get,
            "varyHeader": o.vary_header,
            "noReport": o.no_report,
            "pool": o.pool,
            "connections": o.connections,
            "threads": o.threads,
            "loop": if o.rate.is_some() { "open" } else { "closed" },
            "rate": o.rate,
            "holdMs": o.hold.as_millis() as u64,
            "renews": o.renews,
            "waitMs": o.wait_ms,
            "backoffMs": o.backoff.as_millis() as u64,
            "warmupS": o.warmup.as_secs_f64(),
            "elapsedS": self.elapsed.as_secs_f64(),
            "requests": s.answers(),
            "requestsPerSec": self.per_second(s.answers()),
            "cycles": s.cycles,
            "cyclesPerSec": self.per_second(s.cycles),
            "endpoints": endpoints,
            "connectErrors": s.connect_errors,
            "idleCloses": s.idle_closes,
            "sendLagUs": o.rate.map(|_| Value::from(latency_json(&s.send_lag))),
        })
    }
}

fn latency_json(h: &Histogram<u64>) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("count".into(), h.len().into());
    m.insert("meanUs".into(), h.mean().into());
    for (name, q) in QUANTILES {
        let key = format!("{}Us", name.replace('.', ""));
        m.insert(key, h.value_at_quantile(q).into());
    }
    m.insert("maxUs".into(), h.max().into());
    m
}
