//! `nthpool-bench`: the bundled load tool of the nthpool lock server.
//!
//! Splits the connections over `--threads` event loops ([`client`]), lets them
//! run for the measured window, merges their HDR histograms and prints one
//! report ([`report`]). `--fill` and `--queue` instead build state in the
//! server for the scale runs ([`hold`]). It contacts only the address it is
//! given.

#![forbid(unsafe_code)]

mod client;
mod hold;
mod options;
mod report;
mod request;
mod response;
mod stats;

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use client::{Client, Clock, Share};
use options::{Command, Options};
use request::Requests;
use stats::Stats;

fn main() -> ExitCode {
    let env_key = std::env::var("NTHPOOL_KEY").ok();
    let opts = match options::parse(std::env::args().skip(1), env_key) {
        Ok(Command::Run(o)) => o,
        Ok(Command::Help) => {
            print!("{}", options::HELP);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("nthpool-bench: {e}");
            return ExitCode::from(2);
        }
    };
    let addr = match resolve(&opts.addr) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("nthpool-bench: cannot resolve --addr {}: {e}", opts.addr);
            return ExitCode::from(2);
        }
    };
    if let Some(mode) = hold::Mode::of(&opts) {
        return build(mode, &opts, addr);
    }
    let (stats, elapsed) = match run(&opts, addr) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("nthpool-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let report = report::Run { opts: &opts, target: addr.to_string(), elapsed, stats: &stats };
    if opts.json {
        println!("{}", report.json());
    } else {
        print!("{}", report.table());
    }
    if stats.successes() == 0 {
        eprintln!("nthpool-bench: no request succeeded");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// `--fill` or `--queue`: build the state, report it, and succeed only if all
/// of it was built.
fn build(mode: hold::Mode, opts: &Options, addr: SocketAddr) -> ExitCode {
    let built = match hold::Holder::new(mode, opts, addr).and_then(hold::Holder::run) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("nthpool-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let target = addr.to_string();
    if opts.json {
        println!("{}", hold::json(mode, opts, &target, &built));
    } else {
        print!("{}", hold::table(mode, opts, &target, &built));
    }
    if built.complete(mode) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The first address the name resolves to; only that one is driven.
fn resolve(addr: &str) -> std::io::Result<SocketAddr> {
    addr.to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no address for this name"))
}

fn run(opts: &Options, addr: SocketAddr) -> std::io::Result<(Stats, Duration)> {
    let requests = Requests::new(opts);
    let warmup = opts.warmup.as_nanos() as u64;
    let clock =
        Clock { origin: Instant::now(), measure_from: warmup, measure_until: warmup + opts.duration.as_nanos() as u64 };
    let shares = split(opts.connections, opts.threads, opts.requests);
    let results: Vec<std::io::Result<Stats>> = std::thread::scope(|scope| {
        let handles: Vec<_> = shares
            .into_iter()
            .map(|share| {
                let requests = &requests;
                scope.spawn(move || Client::new(opts, requests, addr, clock, share)?.run())
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("event-loop thread panicked")).collect()
    });
    let mut total = Stats::default();
    for r in results {
        total.merge(&r?);
    }
    // A run cut short by --requests is rated over the time it really took.
    let window = clock.measure_until - clock.measure_from;
    let used = total.last_answer_ns.saturating_sub(clock.measure_from);
    let elapsed = if total.answers() > 0 { used.min(window) } else { window };
    Ok((total, Duration::from_nanos(elapsed)))
}

/// Splits connections and the request cap as evenly as possible over threads.
fn split(connections: usize, threads: usize, requests: Option<u64>) -> Vec<Share> {
    let mut first = 0;
    (0..threads)
        .map(|t| {
            let n = connections / threads + usize::from(t < connections % threads);
            let t64 = threads as u64;
            let budget = requests.map(|r| r / t64 + u64::from((t as u64) < r % t64));
            let share = Share { first, connections: n, budget };
            first += n;
            share
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_even_and_complete() {
        let shares = split(10, 3, Some(100));
        let conns: Vec<_> = shares.iter().map(|s| s.connections).collect();
        let firsts: Vec<_> = shares.iter().map(|s| s.first).collect();
        let budgets: Vec<_> = shares.iter().map(|s| s.budget).collect();
        assert_eq!(conns, [4, 3, 3]);
        assert_eq!(firsts, [0, 4, 7]);
        assert_eq!(budgets, [Some(34), Some(33), Some(33)]);
        assert!(split(4, 2, None).iter().all(|s| s.budget.is_none()));
    }
}
