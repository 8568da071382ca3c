//! `nthpool-governor-bench`: what the governor and the timer wheel cost on
//! their own, with no socket, parser or system clock in the way.
//!
//! The governor is pure and takes `now` as a number, so a manual clock drives
//! it here exactly as the reactor would: one millisecond passes every
//! `CYCLES_PER_MS` cycles and `advance` runs at each tick. The question it
//! answers is whether an acquire+release cycle gets dearer as the server holds
//! more slots and queues more waiters; the answer should be a flat row of
//! numbers. Every measurement is bounded in time, the whole run in seconds.

#![forbid(unsafe_code)]

use std::hint::black_box;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nthpool::config::Config;
use nthpool::governor::{Admission, Entropy, Governor, Ms, Outcome, PoolId};
use nthpool::wheel::Wheel;
use serde_json::{json, Value};

const HELP: &str = "\
nthpool-governor-bench: the governor and timer wheel alone, manual clock, no sockets

USAGE:
    nthpool-governor-bench [--json] [--quick]

Prints acquire+release cycles per second on pool `bench` while pool `full`
holds 10, 1 000, 100 000 and 1 000 000 slots (then also with 100 000 acquires
queued on pool `waiters`), and timer-wheel insert+expire and insert+cancel
operations per second. Each number is measured for about 0.3 s.

    --json     one JSON object instead of the table
    --quick    smaller sizes and shorter windows (a smoke run, not a result)
";

/// The pools of `scripts/bench.sh`'s scale run, minus the ones it does not use.
const CONFIG: &str = r#"{"pools":{
  "bench":{"keys":["k"],"concurrency":1000000,"adaptive":false},
  "full":{"keys":["k"],"concurrency":1000000,"adaptive":false,"termMs":3600000,"renewIntervalMs":1000000,"requestTimeoutMs":3600000},
  "waiters":{"keys":["k"],"concurrency":1,"queue":{"size":200000,"timeoutMs":3600000},
             "termMs":3600000,"renewIntervalMs":1000000,"requestTimeoutMs":3600000}}}"#;

/// How many cycles fit in one millisecond of the manual clock: roughly the
/// rate a busy server reaches, so lease timers land in the wheel's lowest
/// levels as they do in production.
const CYCLES_PER_MS: u64 = 64;
/// Cycles between two looks at the real clock.
const BATCH: u64 = 4096;

struct Sizes {
    held: &'static [u64],
    waiting: u64,
    wheel_entries: u64,
    window: Duration,
}

const FULL: Sizes = Sizes {
    held: &[10, 1_000, 100_000, 1_000_000],
    waiting: 100_000,
    wheel_entries: 1_000_000,
    window: Duration::from_millis(300),
};
const QUICK: Sizes =
    Sizes { held: &[10, 1_000], waiting: 100, wheel_entries: 10_000, window: Duration::from_millis(20) };

#[derive(Debug, Clone, PartialEq)]
struct CycleRow {
    held: u64,
    waiting: u64,
    cycles: u64,
    elapsed: Duration,
}

#[derive(Debug, Clone, PartialEq)]
struct WheelRow {
    what: &'static str,
    entries: u64,
    elapsed: Duration,
}

fn main() -> ExitCode {
    let mut json_out = false;
    let mut sizes = &FULL;
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--json" => json_out = true,
            "--quick" => sizes = &QUICK,
            "-h" | "--help" => {
                print!("{HELP}");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("nthpool-governor-bench: unknown argument {other:?} (see --help)");
                return ExitCode::from(2);
            }
        }
    }
    let cycles = match cycle_rows(sizes) {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!("nthpool-governor-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let wheel = wheel_rows(sizes.wheel_entries);
    if json_out {
        println!("{}", to_json(&cycles, &wheel));
    } else {
        print!("{}", table(&cycles, &wheel));
    }
    ExitCode::SUCCESS
}

/// The bench's own manual clock and the governor it drives.
struct Bench {
    gov: Governor,
    now: Ms,
    bench: PoolId,
    full: PoolId,
    waiters: PoolId,
    /// Cycles since the clock last ticked.
    phase: u64,
    owner: u64,
}

impl Bench {
    fn new() -> Result<Bench, String> {
        let config = Config::parse(CONFIG.as_bytes()).map_err(|e| e.0)?;
        let gov = Governor::new(&nthpool::api::pool_settings(&config), Entropy::from_fn(nthpool::state::os_random));
        let pid = |name| gov.pool_id(name).ok_or(format!("pool {name} missing"));
        Ok(Bench {
            bench: pid("bench")?,
            full: pid("full")?,
            waiters: pid("waiters")?,
            gov,
            now: 1,
            phase: 0,
            owner: 0,
        })
    }

    fn tick(&mut self) {
        self.phase += 1;
        if self.phase == CYCLES_PER_MS {
            self.phase = 0;
            self.now += 1;
            self.gov.advance(self.now);
            // Nothing reaches the reactor in this run; drain what would.
            while self.gov.pop_notice().is_some() {}
        }
    }

    /// Grants `n` more slots on `full` and keeps them (their term is an hour).
    fn hold(&mut self, n: u64) -> Result<(), String> {
        for _ in 0..n {
            self.owner += 1;
            match self.gov.acquire(self.full, 0, self.owner, self.now) {
                Admission::Granted(_) => {}
                other => return Err(format!("filling pool full: {other:?}")),
            }
            self.tick();
        }
        Ok(())
    }

    /// Queues `n` acquires on `waiters`, whose single slot is taken first.
    fn queue(&mut self, n: u64) -> Result<(), String> {
        self.owner += 1;
        if !matches!(self.gov.acquire(self.waiters, 0, self.owner, self.now), Admission::Granted(_)) {
            return Err("pool waiters should grant its one slot".into());
        }
        for _ in 0..n {
            self.owner += 1;
            match self.gov.acquire(self.waiters, 3_600_000, self.owner, self.now) {
                Admission::Queued(_) => {}
                other => return Err(format!("queueing on pool waiters: {other:?}")),
            }
        }
        Ok(())
    }

    /// One acquire and its release, as the server does it for a release that
    /// reports `{"status":200}`.
    fn cycle(&mut self, outcome: &Outcome) -> Result<(), String> {
        self.owner += 1;
        let grant = match self.gov.acquire(self.bench, 0, self.owner, self.now) {
            Admission::Granted(g) => g,
            other => return Err(format!("cycle on pool bench: {other:?}")),
        };
        if !self.gov.release(self.bench, black_box(&grant.text), Some(outcome), self.now) {
            return Err("release of a fresh grant failed".into());
        }
        self.tick();
        Ok(())
    }

    /// Cycles for about `window` after a short warm-up.
    fn measure(&mut self, window: Duration) -> Result<(u64, Duration), String> {
        let outcome = Outcome { status: Some(200), ..Outcome::default() };
        for _ in 0..BATCH {
            self.cycle(&outcome)?;
        }
        let started = Instant::now();
        let mut cycles = 0;
        while started.elapsed() < window {
            for _ in 0..BATCH {
                self.cycle(&outcome)?;
            }
            cycles += BATCH;
        }
        Ok((cycles, started.elapsed()))
    }
}

/// One governor, grown from row to row: held slots first, then waiters.
fn cycle_rows(sizes: &Sizes) -> Result<Vec<CycleRow>, String> {
    let mut b = Bench::new()?;
    let mut rows = Vec::new();
    let mut held = 0;
    for &target in sizes.held {
        b.hold(target - held)?;
        held = target;
        let (cycles, elapsed) = b.measure(sizes.window)?;
        rows.push(CycleRow { held, waiting: 0, cycles, elapsed });
    }
    b.queue(sizes.waiting)?;
    // The one slot of `waiters` is held too.
    let (cycles, elapsed) = b.measure(sizes.window)?;
    rows.push(CycleRow { held: held + 1, waiting: sizes.waiting, cycles, elapsed });
    if b.gov.held_total() as u64 != held + 1 || b.gov.queued_total() as u64 != sizes.waiting {
        return Err("the governor lost held slots or waiters during the run".into());
    }
    Ok(rows)
}

/// Deadlines spread over `span_ms`, in a scattered order.
fn deadline(i: u64, span_ms: u64) -> u64 {
    1 + i.wrapping_mul(7919) % span_ms
}

fn wheel_rows(entries: u64) -> Vec<WheelRow> {
    let mut rows = Vec::new();
    for (what, span) in
        [("insert+expire, deadlines within 1 s", 1_000), ("insert+expire, deadlines within 1 h", 3_600_000)]
    {
        let mut w: Wheel<u64> = Wheel::new();
        let started = Instant::now();
        for i in 0..entries {
            w.insert(deadline(i, span), i);
        }
        let mut fired = 0;
        // As the reactor does: sleep until the next deadline, then fire all that is due.
        while let Some(at) = w.next_deadline() {
            while let Some(p) = w.poll(at) {
                black_box(p);
                fired += 1;
            }
        }
        debug_assert_eq!(fired, entries);
        rows.push(WheelRow { what, entries: fired, elapsed: started.elapsed() });
    }
    let mut w: Wheel<u64> = Wheel::new();
    let started = Instant::now();
    for i in 0..entries {
        // A lease released before its term: the common case for a lease timer.
        let key = w.insert(deadline(i, 30_000), i);
        black_box(w.cancel(key));
    }
    rows.push(WheelRow { what: "insert+cancel, deadlines within 30 s", entries, elapsed: started.elapsed() });
    rows
}

fn per_second(n: u64, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(1e-9)
}

fn ns_each(n: u64, d: Duration) -> f64 {
    d.as_nanos() as f64 / n.max(1) as f64
}

fn table(cycles: &[CycleRow], wheel: &[WheelRow]) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    let _ = writeln!(t, "====== nthpool-governor-bench: governor and timer wheel alone, manual clock ======");
    let _ = writeln!(t, "acquire+release cycles on pool bench (adaptive off, release reports status 200)");
    let _ = writeln!(t, "  {:>12} {:>10} {:>14} {:>10}", "held slots", "waiting", "cycles/s", "ns/cycle");
    for r in cycles {
        let _ = writeln!(
            t,
            "  {:>12} {:>10} {:>14.0} {:>10.1}",
            r.held,
            r.waiting,
            per_second(r.cycles, r.elapsed),
            ns_each(r.cycles, r.elapsed)
        );
    }
    let _ = writeln!(t, "timer wheel (Wheel<u64>)");
    let _ = writeln!(t, "  {:<38} {:>10} {:>14} {:>10}", "operation", "entries", "ops/s", "ns/op");
    for r in wheel {
        let _ = writeln!(
            t,
            "  {:<38} {:>10} {:>14.0} {:>10.1}",
            r.what,
            r.entries,
            per_second(r.entries, r.elapsed),
            ns_each(r.entries, r.elapsed)
        );
    }
    t
}

fn to_json(cycles: &[CycleRow], wheel: &[WheelRow]) -> Value {
    let cycles: Vec<Value> = cycles
        .iter()
        .map(|r| {
            json!({
                "held": r.held,
                "waiting": r.waiting,
                "cycles": r.cycles,
                "elapsedS": r.elapsed.as_secs_f64(),
                "cyclesPerSec": per_second(r.cycles, r.elapsed),
                "nsPerCycle": ns_each(r.cycles, r.elapsed),
            })
        })
        .collect();
    let wheel: Vec<Value> = wheel
        .iter()
        .map(|r| {
            json!({
                "operation": r.what,
                "entries": r.entries,
                "elapsedS": r.elapsed.as_secs_f64(),
                "opsPerSec": per_second(r.entries, r.elapsed),
                "nsPerOp": ns_each(r.entries, r.elapsed),
            })
        })
        .collect();
    json!({ "cycles": cycles, "wheel": wheel })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_run_keeps_every_slot_and_waiter() {
        let rows = cycle_rows(&QUICK).expect("cycles");
        let shape: Vec<_> = rows.iter().map(|r| (r.held, r.waiting)).collect();
        assert_eq!(shape, [(10, 0), (1_000, 0), (1_001, 100)]);
        assert!(rows.iter().all(|r| r.cycles >= BATCH));
        let wheel = wheel_rows(QUICK.wheel_entries);
        assert!(wheel.iter().all(|r| r.entries == QUICK.wheel_entries));
        let j = to_json(&rows, &wheel);
        assert_eq!(j["cycles"].as_array().map(Vec::len), Some(3));
        assert!(table(&rows, &wheel).contains("insert+cancel"));
    }
}
