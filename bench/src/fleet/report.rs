//! One run's measures: the table row and the JSON object with its timeline.
//!
//! The upstream's maximum is the number of successful calls it could have
//! served in the run: for each rate window `[kW, kW+W)` that starts inside the
//! run, the smaller of the window's budget (limits at the window's start) and
//! what the concurrency allows in the part of the window inside the run,
//! ∫ min(concurrency, workers) / mean service time dt (limits as they change).
//! Without a rate limit it is that integral over the whole run. Goodput and
//! its share count the successful calls the upstream finished inside the run.

use std::sync::atomic::Ordering::Relaxed;

use super::options::{dialect_name, mode_name, Limits, Options};
use super::stats::{quantile, Timeline, NONE};

pub const HEADER: &str = "| scenario | goodput/s | of max | upstream 429s | job p50 / p99 | 429 < 1 % after |\n\
                          |---|---|---|---|---|---|";

pub struct Report<'a> {
    o: &'a Options,
    secs: usize,
    ok: u64,
    max: f64,
    calls: u64,
    refused: u64,
    latencies: Vec<u64>,
    /// (change time in s, seconds until settled): t = 0 first, then each change.
    settle: Vec<(u64, Option<usize>)>,
    totals: [u64; 4],
}

/// The upstream's limits at `t` seconds into the run.
fn limits_at(o: &Options, t: f64) -> Limits {
    o.upstream.changes.iter().filter(|c| c.at.as_secs_f64() <= t).fold(o.upstream.limits, |l, c| c.apply(l))
}

/// Successful calls the upstream could have served in the run (see the module text).
pub fn max_calls(o: &Options) -> f64 {
    let u = &o.upstream;
    let d = o.duration.as_secs_f64();
    let limits_at =
        |t: f64| -> Limits { u.changes.iter().filter(|c| c.at.as_secs_f64() <= t).fold(u.limits, |l, c| c.apply(l)) };
    let mean_s = u.service.mean_ms().max(0.001) / 1000.0;
    let step: f64 = 0.01;
    let concurrent = |from: f64, to: f64| -> f64 {
        let mut t = from;
        let mut sum = 0.0;
        while t < to {
            let dt = step.min(to - t);
            let c = limits_at(t).concurrency.map_or(o.workers, |c| (c as usize).min(o.workers));
            sum += c as f64 / mean_s * dt;
            t += dt;
        }
        sum
    };
    let w = u.window.as_secs_f64();
    let mut total = 0.0;
    let mut start = 0.0;
    while start < d {
        let end = (start + w).min(d);
        let by_concurrency = concurrent(start, end);
        total += match limits_at(start).rpm {
            Some(rpm) => by_concurrency.min(u.budget(rpm) as f64),
            None => by_concurrency,
        };
        start += w;
    }
    total
}

impl<'a> Report<'a> {
    pub fn new(o: &'a Options, t: &Timeline, mut latencies: Vec<u64>) -> Report<'a> {
        let secs = (o.duration.as_secs_f64().ceil() as usize).min(t.buckets.len());
        latencies.sort_unstable();
        let refused = (0..secs).map(|i| t.refused(i)).sum();
        let mut starts: Vec<u64> = vec![0];
        starts.extend(o.upstream.changes.iter().map(|c| c.at.as_secs()));
        let settle = starts
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                let until = starts.get(i + 1).map_or(secs, |&n| n as usize);
                (s, t.settle(s as usize, until, o.settle_secs))
            })
            .collect();
        let n = t.buckets.len();
        let upstream_429 = (0..n).map(|i| t.refused(i)).sum();
        let totals =
            [t.sum(0, n, |b| &b.calls), t.sum(0, n, |b| &b.seen_calls), upstream_429, t.sum(0, n, |b| &b.seen_429)];
        Report {
            o,
            secs,
            ok: t.sum(0, secs, |b| &b.ok),
            max: max_calls(o),
            calls: t.sum(0, secs, |b| &b.calls),
            refused,
            latencies,
            settle,
            totals,
        }
    }

    fn goodput(&self) -> f64 {
        self.ok as f64 / self.o.duration.as_secs_f64()
    }

    fn share(&self) -> f64 {
        if self.max > 0.0 {
            self.ok as f64 / self.max
        } else {
            0.0
        }
    }

    fn refused_share(&self) -> f64 {
        self.refused as f64 / self.calls.max(1) as f64
    }

    fn settle_text(&self) -> String {
        let parts: Vec<String> = self
            .settle
            .iter()
            .map(|(at, s)| {
                let s = s.map_or("never".to_string(), |s| format!("{s} s"));
                if *at == 0 {
                    format!("start: {s}")
                } else {
                    format!("change at {at} s: {s}")
                }
            })
            .collect();
        parts.join("; ")
    }

    pub fn row(&self) -> String {
        let p = |q| quantile(&self.latencies, q).map_or("-".to_string(), |v| format!("{v}"));
        format!(
            "| {} | {:.1} | {:.1} % | {} ({:.1} %) | {} / {} ms | {} |",
            self.o.name(),
            self.goodput(),
            self.share() * 100.0,
            self.refused,
            self.refused_share() * 100.0,
            p(0.5),
            p(0.99),
            self.settle_text()
        )
    }

    pub fn json(&self, t: &Timeline) -> serde_json::Value {
        let o = self.o;
        let pool = o.effective_pool();
        let u = &o.upstream;
        let timeline: Vec<_> = t.buckets[..self.secs]
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let samples = b.inflight_samples.load(Relaxed).max(1);
                let limit = b.effective_limit.load(Relaxed);
                serde_json::json!({
                    "t": i,
                    "calls": b.calls.load(Relaxed),
                    "ok": b.ok.load(Relaxed),
                    "refusedConcurrency": b.refused_concurrency.load(Relaxed),
                    "refusedRate": b.refused_rate.load(Relaxed),
                    "inFlightMean": b.inflight_sum.load(Relaxed) as f64 / samples as f64,
                    "inFlightMax": b.inflight_max.load(Relaxed),
                    "jobs": b.jobs.load(Relaxed),
                    "acquireDenied": b.acquire_denied.load(Relaxed),
                    "errors": b.acquire_errors.load(Relaxed),
                    "effectiveLimit": (limit != NONE).then_some(limit),
                })
            })
            .collect();
        serde_json::json!({
            "scenario": o.name(),
            "row": self.row(),
            "mode": mode_name(o.mode),
            "workers": o.workers,
            "processes": o.processes,
            "durationS": o.duration.as_secs_f64(),
            "pool": (o.mode != super::options::Mode::Direct && o.server.is_none()).then(|| serde_json::json!({
                "concurrency": pool.concurrency, "rpm": pool.rpm, "adaptive": pool.adaptive,
            })),
            "upstream": {
                "concurrency": u.limits.concurrency,
                "rpm": u.limits.rpm,
                "windowS": u.window.as_secs_f64(),
                "windowKind": if u.sliding { "sliding" } else { "fixed" },
                "countRefused": u.count_refused,
                "dialect": dialect_name(u.dialect),
                "stamp": if u.stamp_at_admission { "admission" } else { "response" },
                "meanServiceMs": u.service.mean_ms(),
                // Each change with the limits it leaves (null: unlimited).
                "changes": u.changes.iter().map(|c| {
                    let l = limits_at(o, c.at.as_secs_f64());
                    serde_json::json!({ "atS": c.at.as_secs_f64(), "concurrency": l.concurrency, "rpm": l.rpm })
                }).collect::<Vec<_>>(),
            },
            "goodput": self.goodput(),
            "maxCalls": self.max,
            "okCalls": self.ok,
            "shareOfMax": self.share(),
            "upstreamCalls": self.calls,
            "upstream429": self.refused,
            "share429": self.refused_share(),
            "jobs": self.latencies.len(),
            "jobP50Ms": quantile(&self.latencies, 0.5),
            "jobP99Ms": quantile(&self.latencies, 0.99),
            "settle": self.settle.iter().map(|(at, s)| serde_json::json!({"atS": at, "settledAfterS": s})).collect::<Vec<_>>(),
            "accounting": {
                "upstreamCalls": self.totals[0], "workerCalls": self.totals[1],
                "upstream429": self.totals[2], "worker429": self.totals[3],
            },
            "timeline": timeline,
        })
    }
}
