//! The mock upstream: an HTTP/1.1 server on 127.0.0.1 (a thread per
//! connection) that admits calls under a concurrency limit and a request
//! budget per window, answers after a sampled service time, and stamps
//! rate-limit headers in one provider's dialect.
//!
//! A rate refusal is a `429` showing `remaining` 0 and the reset at the
//! window's end; a concurrency refusal is a `429` with `Retry-After: 1` and the
//! budget as it stands (not exhausted), as real providers answer.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::options::{Dialect, Limits, Service, Upstream as Config};
use super::stats::Timeline;

/// Longest service time sampled, well under the pool's lease term.
const MAX_SERVICE_MS: f64 = 20_000.0;

/// The rate budget as one answer reports it.
#[derive(Clone, Copy)]
struct Snapshot {
    limit: u32,
    remaining: u32,
    reset_ms: u64,
}

enum Decision {
    Admit(Duration, Option<Snapshot>),
    Refuse { rate: bool, snapshot: Option<Snapshot>, retry_after_s: u64 },
}

struct State {
    origin: Instant,
    limits: Limits,
    next_change: usize,
    in_flight: u32,
    /// Fixed windows: start of the current one (since origin) and calls in it.
    window_start: Duration,
    used: u32,
    /// Sliding window: the counted calls' times (since origin).
    log: VecDeque<Duration>,
    rng: u64,
}

pub struct Upstream {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

struct Shared {
    config: Config,
    state: Mutex<State>,
    timeline: Arc<Timeline>,
    stop: AtomicBool,
}

impl Upstream {
    pub fn start(config: Config, timeline: Arc<Timeline>) -> std::io::Result<Upstream> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let state = State {
            origin: Instant::now(),
            limits: config.limits,
            next_change: 0,
            in_flight: 0,
            window_start: Duration::ZERO,
            used: 0,
            log: VecDeque::new(),
            rng: config.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
        };
        let shared = Arc::new(Shared { config, state: Mutex::new(state), timeline, stop: AtomicBool::new(false) });
        let s = shared.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let s = s.clone();
                std::thread::spawn(move || serve(&s, stream));
            }
        });
        let s = shared.clone();
        std::thread::spawn(move || sample(&s));
        Ok(Upstream { addr, shared })
    }

    /// Starts the clock of the windows and the limit changes: the run's t = 0.
    pub fn begin(&self, origin: Instant) {
        self.shared.state.lock().unwrap().origin = origin;
    }

    pub fn stop(&self) {
        self.shared.stop.store(true, Relaxed);
    }
}

/// Samples the calls in flight ten times a second.
fn sample(s: &Shared) {
    while !s.stop.load(Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        let (t, n) = {
            let st = s.state.lock().unwrap();
            (st.origin.elapsed().as_secs_f64(), st.in_flight as u64)
        };
        let b = s.timeline.at(t);
        b.inflight_sum.fetch_add(n, Relaxed);
        b.inflight_samples.fetch_add(1, Relaxed);
        b.inflight_max.fetch_max(n, Relaxed);
    }
}

fn serve(s: &Shared, mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            if buf.len() > 64 * 1024 {
                return;
            }
            continue;
        };
        buf.drain(..end + 4);
        if stream.write_all(&answer(s)).is_err() {
            return;
        }
    }
}

/// Admits or refuses one call, waits out its service time, and builds the answer.
fn answer(s: &Shared) -> Vec<u8> {
    let (t, decision) = {
        let mut st = s.state.lock().unwrap();
        let t = st.origin.elapsed();
        (t, st.decide(&s.config, t))
    };
    let b = s.timeline.at(t.as_secs_f64());
    b.calls.fetch_add(1, Relaxed);
    let d = s.config.dialect;
    match decision {
        Decision::Refuse { rate, snapshot, retry_after_s } => {
            if rate { &b.refused_rate } else { &b.refused_concurrency }.fetch_add(1, Relaxed);
            let mut head = rate_headers(d, snapshot);
            if !matches!(d, Dialect::None | Dialect::RemainingOnly | Dialect::ResetOnly) {
                head.push_str(&format!("retry-after: {retry_after_s}\r\n"));
            }
            response(429, "Too Many Requests", &head, br#"{"error":"rate_limited"}"#)
        }
        Decision::Admit(service, admitted) => {
            std::thread::sleep(service);
            let (t_end, snapshot) = {
                let mut st = s.state.lock().unwrap();
                st.in_flight -= 1;
                let t = st.origin.elapsed();
                let now = st.snapshot(&s.config, t);
                (t, if s.config.stamp_at_admission { admitted } else { now })
            };
            s.timeline.at(t_end.as_secs_f64()).ok.fetch_add(1, Relaxed);
            response(200, "OK", &rate_headers(d, snapshot), br#"{"ok":true}"#)
        }
    }
}

impl State {
    fn budget(&self, c: &Config) -> Option<u32> {
        self.limits.rpm.map(|rpm| c.budget(rpm))
    }

    /// Applies due limit changes and moves the window to `t`.
    fn advance(&mut self, c: &Config, t: Duration) {
        while let Some(ch) = c.changes.get(self.next_change).filter(|ch| ch.at <= t) {
            self.limits = ch.apply(self.limits);
            self.next_change += 1;
        }
        if c.sliding {
            while self.log.front().is_some_and(|&a| a + c.window <= t) {
                self.log.pop_front();
            }
        } else if t >= self.window_start + c.window {
            let w = c.window.as_nanos();
            self.window_start = Duration::from_nanos((t.as_nanos() / w * w) as u64);
            self.used = 0;
        }
    }

    fn used(&self, c: &Config) -> u32 {
        if c.sliding {
            self.log.len() as u32
        } else {
            self.used
        }
    }

    fn count(&mut self, c: &Config, t: Duration) {
        if c.sliding {
            self.log.push_back(t);
        } else {
            self.used += 1;
        }
    }

    /// Reset: the fixed window's end, or when the oldest counted call leaves the sliding one.
    fn snapshot(&mut self, c: &Config, t: Duration) -> Option<Snapshot> {
        self.advance(c, t);
        let limit = self.budget(c)?;
        let reset = if c.sliding {
            self.log.front().map_or(c.window, |&a| a + c.window - t)
        } else {
            self.window_start + c.window - t
        };
        let reset_ms = (reset.as_nanos().div_ceil(1_000_000) as u64).max(1);
        Some(Snapshot { limit, remaining: limit.saturating_sub(self.used(c)), reset_ms })
    }

    fn decide(&mut self, c: &Config, t: Duration) -> Decision {
        self.advance(c, t);
        let rate_full = self.budget(c).is_some_and(|b| self.used(c) >= b);
        let busy = self.limits.concurrency.is_some_and(|n| self.in_flight >= n);
        if rate_full || busy {
            if c.count_refused {
                self.count(c, t);
            }
            let snapshot = self.snapshot(c, t);
            let retry_after_s = match snapshot {
                Some(s) if rate_full => s.reset_ms.div_ceil(1000).max(1),
                _ => 1,
            };
            return Decision::Refuse { rate: rate_full, snapshot, retry_after_s };
        }
        self.count(c, t);
        self.in_flight += 1;
        let ms = self.service_ms(c.service).min(MAX_SERVICE_MS);
        Decision::Admit(Duration::from_secs_f64(ms / 1000.0), self.snapshot(c, t))
    }

    /// xorshift64*: a uniform in (0, 1).
    fn uniform(&mut self) -> f64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let x = self.rng.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((x >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn service_ms(&mut self, s: Service) -> f64 {
        match s {
            Service::Fixed(v) => v,
            Service::Uniform(a, b) => a + (b - a) * self.uniform(),
            Service::LogNormal(median, sigma) => {
                // Box–Muller.
                let z = (-2.0 * self.uniform().ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos();
                median * (sigma * z).exp()
            }
        }
    }
}

fn response(code: u16, reason: &str, headers: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "HTTP/1.1 {code} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{headers}\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

/// The rate-limit headers of one dialect (none when the upstream has no budget).
fn rate_headers(d: Dialect, snapshot: Option<Snapshot>) -> String {
    let Some(Snapshot { limit, remaining, reset_ms }) = snapshot else {
        return String::new();
    };
    let secs = reset_ms.div_ceil(1000);
    match d {
        Dialect::OpenAi => format!(
            "x-ratelimit-limit-requests: {limit}\r\nx-ratelimit-remaining-requests: {remaining}\r\n\
             x-ratelimit-reset-requests: {}\r\n",
            go_duration(reset_ms)
        ),
        Dialect::Anthropic => format!(
            "anthropic-ratelimit-requests-limit: {limit}\r\nanthropic-ratelimit-requests-remaining: {remaining}\r\n\
             anthropic-ratelimit-requests-reset: {}\r\n",
            rfc3339_after(reset_ms)
        ),
        Dialect::Ietf => {
            format!("ratelimit-limit: {limit}\r\nratelimit-remaining: {remaining}\r\nratelimit-reset: {secs}\r\n")
        }
        // The policy's window is not known here; the reset stands in for it.
        Dialect::IetfStructured => {
            format!("ratelimit: \"fleet\";r={remaining};t={secs}\r\nratelimit-policy: \"fleet\";q={limit}\r\n")
        }
        Dialect::XRateLimit => {
            format!("x-ratelimit-limit: {limit}\r\nx-ratelimit-remaining: {remaining}\r\nx-ratelimit-reset: {secs}\r\n")
        }
        Dialect::RemainingOnly => format!("x-ratelimit-limit: {limit}\r\nx-ratelimit-remaining: {remaining}\r\n"),
        Dialect::ResetOnly => format!("x-ratelimit-reset-requests: {}\r\n", go_duration(reset_ms)),
        Dialect::RetryAfter | Dialect::None => String::new(),
    }
}

/// OpenAI's reset form: `350ms`, `5.2s`, `1m0s`.
fn go_duration(ms: u64) -> String {
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let trim = |s: String| s.trim_end_matches('0').trim_end_matches('.').to_string();
    let (m, rest) = (ms / 60_000, ms % 60_000);
    let s = trim(format!("{:.3}", rest as f64 / 1000.0));
    if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// The instant `ms` from now in RFC 3339 (UTC, whole seconds rounded up), as Anthropic sends it.
fn rfc3339_after(ms: u64) -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64;
    let mut b = Vec::with_capacity(24);
    nthpool::accesslog::write_rfc3339(&mut b, (now + ms).div_ceil(1000) * 1000);
    String::from_utf8(b).expect("RFC 3339 is ASCII")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_forms() {
        assert_eq!(go_duration(350), "350ms");
        assert_eq!(go_duration(6000), "6s");
        assert_eq!(go_duration(5250), "5.25s");
        assert_eq!(go_duration(60_000), "1m0s");
        let r = rfc3339_after(1);
        assert!(r.len() == 24 && r.ends_with(".000Z"), "{r}");
    }
}
