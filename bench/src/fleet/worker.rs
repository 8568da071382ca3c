//! The workers: each runs jobs until the deadline. A job is done when one
//! upstream call succeeded; a refused call is retried after its hint.
//!
//! `lock`: acquire (queueing up to the wait budget) → call the upstream →
//! release with the full report (status, throttled, retryAfterMs and the raw
//! headers). `direct`: call, and on a 429 sleep the `Retry-After`. `proxy`:
//! send the call to the server under the pool's proxy `Host`; the server
//! acquires, calls the upstream and releases with its answer. An answer with
//! `x-nthpool-deny-reason` (or nthpool's `504 queue_timeout`) is the pool's
//! refusal, anything else the upstream's answer relayed.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use super::http::{Answer, Conn};
use super::stats::Timeline;

/// The nthpool server a lock-mode (or proxy-mode) fleet goes through.
#[derive(Clone)]
pub struct Lock {
    pub addr: SocketAddr,
    pub key: String,
    pub pool: String,
    /// Calls go through the pool's proxy instead of acquire/release.
    pub proxy: bool,
}

pub struct Fleet<'a> {
    pub upstream: SocketAddr,
    pub lock: Option<Lock>,
    pub origin: Instant,
    pub deadline: Instant,
    pub wait_ms: u64,
    pub no_hint_ms: u64,
    pub max_calls: u64,
    pub calls: AtomicU64,
    pub timeline: &'a Timeline,
}

/// What one worker saw beyond the timeline: the latencies of its finished jobs (ms).
#[derive(Default)]
pub struct Seen {
    pub latencies: Vec<u64>,
}

enum Attempt {
    Done,
    /// Try again after this long.
    Retry(Duration),
    /// The run is over.
    Stop,
}

pub struct Worker<'a> {
    fleet: &'a Fleet<'a>,
    upstream: Conn,
    server: Option<Conn>,
    upstream_head: String,
}

impl<'a> Worker<'a> {
    pub fn new(fleet: &'a Fleet<'a>) -> Worker<'a> {
        let timeout = Duration::from_millis(fleet.wait_ms) + Duration::from_secs(30);
        let upstream_head = match &fleet.lock {
            Some(l) if l.proxy => {
                format!("GET /v1/call HTTP/1.1\r\nHost: {}\r\nX-Nthpool-Key: {}\r\n", super::server::PROXY_HOST, l.key)
            }
            _ => format!("GET /v1/call HTTP/1.1\r\nHost: {}\r\n", fleet.upstream),
        };
        let upstream = match &fleet.lock {
            Some(l) if l.proxy => Conn::new(l.addr, timeout + Duration::from_secs(60)),
            _ => Conn::new(fleet.upstream, Duration::from_secs(60)),
        };
        Worker { fleet, upstream, server: fleet.lock.as_ref().map(|l| Conn::new(l.addr, timeout)), upstream_head }
    }

    fn over(&self) -> bool {
        Instant::now() >= self.fleet.deadline || self.fleet.calls.load(Relaxed) >= self.fleet.max_calls
    }

    fn secs(&self) -> f64 {
        self.fleet.origin.elapsed().as_secs_f64()
    }

    pub fn run(mut self) -> Seen {
        let mut seen = Seen::default();
        'jobs: while !self.over() {
            let start = Instant::now();
            loop {
                match self.attempt() {
                    Attempt::Done => break,
                    Attempt::Stop => break 'jobs,
                    Attempt::Retry(after) => {
                        let left = self.fleet.deadline.saturating_duration_since(Instant::now());
                        std::thread::sleep(after.min(left));
                        if self.over() {
                            break 'jobs;
                        }
                    }
                }
            }
            if Instant::now() < self.fleet.deadline {
                self.fleet.timeline.at(self.secs()).jobs.fetch_add(1, Relaxed);
                seen.latencies.push(start.elapsed().as_millis() as u64);
            }
        }
        seen
    }

    fn attempt(&mut self) -> Attempt {
        let Some(lock) = self.fleet.lock.clone() else {
            return match self.call_upstream() {
                Some(a) => self.outcome(&a),
                None => Attempt::Retry(Duration::from_millis(100)),
            };
        };
        if lock.proxy {
            return self.through_proxy();
        }
        let slot = match self.acquire(&lock) {
            Ok(slot) => slot,
            Err(a) => return a,
        };
        if self.over() {
            self.release(&lock, &slot, b"");
            return Attempt::Stop;
        }
        let Some(answer) = self.call_upstream() else {
            self.release(&lock, &slot, br#"{"status":502}"#);
            return Attempt::Retry(Duration::from_millis(100));
        };
        self.release(&lock, &slot, &report(&answer));
        self.outcome(&answer)
    }

    fn outcome(&self, a: &Answer) -> Attempt {
        match a.status {
            200..=299 => Attempt::Done,
            429 => Attempt::Retry(retry_after(a).unwrap_or(Duration::from_millis(self.fleet.no_hint_ms))),
            _ => Attempt::Retry(Duration::from_millis(100)),
        }
    }

    fn call_upstream(&mut self) -> Option<Answer> {
        self.fleet.calls.fetch_add(1, Relaxed);
        let answer = self.upstream.call(&self.upstream_head, b"");
        let b = self.fleet.timeline.at(self.secs());
        match answer {
            Ok(a) => {
                b.seen_calls.fetch_add(1, Relaxed);
                if a.status == 429 {
                    b.seen_429.fetch_add(1, Relaxed);
                }
                Some(a)
            }
            Err(_) => {
                b.acquire_errors.fetch_add(1, Relaxed);
                None
            }
        }
    }

    /// One call through the pool's proxy: the pool's refusal, or the
    /// upstream's answer relayed.
    fn through_proxy(&mut self) -> Attempt {
        let answer = self.upstream.call(&self.upstream_head, b"");
        let b = self.fleet.timeline.at(self.secs());
        let a = match answer {
            Ok(a) => a,
            Err(_) => {
                b.acquire_errors.fetch_add(1, Relaxed);
                return Attempt::Retry(Duration::from_millis(100));
            }
        };
        if let Some(limit) = a.header("x-nthpool-effective-limit").and_then(|v| v.trim().parse().ok()) {
            b.effective_limit.store(limit, Relaxed);
        }
        let queue_timeout = a.status == 504 && a.body.windows(13).any(|w| w == b"queue_timeout");
        if a.header("x-nthpool-deny-reason").is_some() || queue_timeout {
            b.acquire_denied.fetch_add(1, Relaxed);
            let wait = if queue_timeout { Duration::ZERO } else { retry_after(&a).unwrap_or(Duration::from_secs(1)) };
            return Attempt::Retry(wait);
        }
        if !(200..600).contains(&a.status) || a.status == 502 || a.status == 504 {
            b.acquire_errors.fetch_add(1, Relaxed);
            return Attempt::Retry(Duration::from_millis(100));
        }
        self.fleet.calls.fetch_add(1, Relaxed);
        b.seen_calls.fetch_add(1, Relaxed);
        if a.status == 429 {
            b.seen_429.fetch_add(1, Relaxed);
        }
        self.outcome(&a)
    }

    /// A slot id, or what to do instead.
    fn acquire(&mut self, lock: &Lock) -> Result<String, Attempt> {
        let left = self.fleet.deadline.saturating_duration_since(Instant::now()).as_millis() as u64;
        if left == 0 {
            return Err(Attempt::Stop);
        }
        let body = format!(r#"{{"waitMs":{}}}"#, self.fleet.wait_ms.min(left).max(1));
        let head = format!(
            "POST /pools/{}/lock/acquire HTTP/1.1\r\nHost: {}\r\nX-Nthpool-Key: {}\r\nContent-Type: application/json\r\n",
            lock.pool, lock.addr, lock.key
        );
        let server = self.server.as_mut().expect("a lock-mode worker has a server connection");
        let answer = server.call(&head, body.as_bytes());
        let b = self.fleet.timeline.at(self.secs());
        let a = match answer {
            Ok(a) => a,
            Err(_) => {
                b.acquire_errors.fetch_add(1, Relaxed);
                return Err(Attempt::Retry(Duration::from_millis(100)));
            }
        };
        if let Some(limit) = a.header("x-nthpool-effective-limit").and_then(|v| v.trim().parse().ok()) {
            b.effective_limit.store(limit, Relaxed);
        }
        if a.status == 200 {
            let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap_or_default();
            if let Some(slot) = v["slotId"].as_str() {
                return Ok(slot.to_string());
            }
        }
        if matches!(a.status, 429 | 503 | 504) {
            b.acquire_denied.fetch_add(1, Relaxed);
            // A queue timeout asks again at once; a refusal waits its Retry-After.
            let wait = if a.status == 504 { Duration::ZERO } else { retry_after(&a).unwrap_or(Duration::from_secs(1)) };
            return Err(Attempt::Retry(wait));
        }
        b.acquire_errors.fetch_add(1, Relaxed);
        Err(Attempt::Retry(Duration::from_millis(100)))
    }

    fn release(&mut self, lock: &Lock, slot: &str, body: &[u8]) {
        let head = format!(
            "POST /pools/{}/lock/{slot}/release HTTP/1.1\r\nHost: {}\r\nX-Nthpool-Key: {}\r\nContent-Type: application/json\r\n",
            lock.pool, lock.addr, lock.key
        );
        let server = self.server.as_mut().expect("a lock-mode worker has a server connection");
        let ok = matches!(server.call(&head, body), Ok(a) if a.status == 200);
        if !ok {
            self.fleet.timeline.at(self.secs()).acquire_errors.fetch_add(1, Relaxed);
        }
    }
}

/// `Retry-After` in whole or fractional seconds.
fn retry_after(a: &Answer) -> Option<Duration> {
    let s: f64 = a.header("retry-after")?.trim().parse().ok()?;
    (0.0..=600.0).contains(&s).then(|| Duration::from_secs_f64(s))
}

/// The release body: status, throttled, retryAfterMs and every upstream header.
fn report(a: &Answer) -> Vec<u8> {
    let mut r = serde_json::json!({
        "status": a.status,
        "throttled": u8::from(a.status == 429),
        "headers": a.headers.iter().map(|(n, v)| [n, v]).collect::<Vec<_>>(),
    });
    if let Some(d) = retry_after(a).filter(|_| a.status == 429) {
        r["retryAfterMs"] = (d.as_millis() as u64).into();
    }
    r.to_string().into_bytes()
}
