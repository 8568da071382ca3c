//! `nthpool-fleet`: a fleet of workers against an embedded mock upstream that
//! limits calls in flight and requests per window, through a real nthpool
//! server (lock API or proxy mode) or directly, printing one row per run: goodput and its
//! share of the upstream's maximum, upstream 429s, job latency and how long
//! the 429 share takes to settle under 1 % after each limit change.
//!
//! Threads and blocking sockets: this is a tool, not the server. Everything
//! it contacts is on loopback; the run stops by itself after `--duration` or
//! `--max-calls`.

mod http;
mod options;
mod report;
mod server;
mod stats;
mod upstream;
mod worker;

use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use options::{Mode, Options};
use stats::{Timeline, WORKER_FIELDS};
use worker::{Fleet, Lock, Worker};

fn main() -> ExitCode {
    let opts = match options::parse(std::env::args().skip(1)) {
        Ok(options::Command::Run(o)) => o,
        Ok(options::Command::Help) => {
            print!("{}", options::HELP);
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("nthpool-fleet: {e}");
            return ExitCode::from(2);
        }
    };
    let result = if opts.child.is_some() { child(&opts) } else { parent(&opts) };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nthpool-fleet: {e}");
            ExitCode::FAILURE
        }
    }
}

fn epoch_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64
}

/// Buckets for the run, the longest wait after it, and some slack.
fn timeline_secs(o: &Options) -> usize {
    o.duration.as_secs() as usize + (o.wait_ms / 1000) as usize + 30
}

/// Runs `workers` threads over `fleet`; the latencies of their finished jobs.
fn run_workers(fleet: &Fleet, workers: usize) -> Vec<u64> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers).map(|_| scope.spawn(|| Worker::new(fleet).run())).collect();
        handles.into_iter().flat_map(|h| h.join().expect("worker panicked").latencies).collect()
    })
}

fn fleet<'a>(
    o: &Options,
    upstream: std::net::SocketAddr,
    lock: Option<Lock>,
    origin: Instant,
    t: &'a Timeline,
) -> Fleet<'a> {
    Fleet {
        upstream,
        lock,
        origin,
        deadline: origin + o.duration,
        wait_ms: o.wait_ms,
        no_hint_ms: o.no_hint_ms,
        max_calls: o.max_calls / o.processes as u64,
        calls: AtomicU64::new(0),
        timeline: t,
    }
}

fn parent(o: &Options) -> Result<(), String> {
    let timeline = Arc::new(Timeline::new(timeline_secs(o)));
    let upstream = upstream::Upstream::start(o.upstream.clone(), timeline.clone()).map_err(|e| e.to_string())?;
    let mut _server = None;
    let lock = match (o.mode, &o.server) {
        (Mode::Direct, _) => None,
        (_, Some(addr)) => Some(Lock {
            addr: addr.parse().map_err(|_| format!("--server: {addr:?} is not an address like 127.0.0.1:7070"))?,
            key: o.key.clone().unwrap_or_default(),
            pool: o.pool_name.clone().unwrap_or_default(),
            proxy: o.mode == Mode::Proxy,
        }),
        (_, None) => {
            let binary = o.nthpool.clone().map_or_else(server::default_binary, Into::into);
            let proxied = (o.mode == Mode::Proxy).then_some(upstream.addr);
            let s = server::Server::start(&binary, &o.effective_pool(), o.wait_ms, proxied)?;
            let lock =
                Lock { addr: s.addr, key: server::KEY.into(), pool: server::POOL.into(), proxy: o.mode == Mode::Proxy };
            _server = Some(s);
            Some(lock)
        }
    };
    let origin = Instant::now();
    let origin_epoch = epoch_ms();
    upstream.begin(origin);
    let latencies = if o.processes == 1 {
        run_workers(&fleet(o, upstream.addr, lock, origin, &timeline), o.workers)
    } else {
        children(o, upstream.addr, lock.as_ref(), origin_epoch, &timeline)?
    };
    upstream.stop();
    drop(_server);
    let r = report::Report::new(o, &timeline, latencies);
    let json = r.json(&timeline);
    if let Some(path) = &o.json_file {
        std::fs::write(path, format!("{json}\n")).map_err(|e| format!("{path}: {e}"))?;
    }
    if o.json {
        println!("{json}");
    } else {
        if !o.no_header {
            println!("{}", report::HEADER);
        }
        println!("{}", r.row());
    }
    Ok(())
}

/// Splits the workers over child processes running this binary; merges what they saw.
fn children(
    o: &Options,
    upstream: std::net::SocketAddr,
    lock: Option<&Lock>,
    origin: u64,
    t: &Timeline,
) -> Result<Vec<u64>, String> {
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let spawned: Vec<_> = (0..o.processes)
        .map(|i| {
            let n = o.workers / o.processes + usize::from(i < o.workers % o.processes);
            let mut c = Command::new(&me);
            c.args(&args).args(["--workers", &n.to_string(), "--processes", "1"]);
            c.args(["--max-calls", &(o.max_calls / o.processes as u64).to_string()]);
            c.args(["--child-upstream", &upstream.to_string(), "--child-origin-ms", &origin.to_string()]);
            match lock {
                Some(l) => {
                    let mode = if l.proxy { "proxy" } else { "lock" };
                    c.args(["--mode", mode, "--server", &l.addr.to_string(), "--key", &l.key, "--pool", &l.pool])
                }
                None => c.args(["--mode", "direct"]),
            };
            c.stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot start a worker process: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut latencies = Vec::new();
    for c in spawned {
        let out = c.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("a worker process failed: {:?}", out.status));
        }
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).map_err(|e| format!("worker process output: {e}"))?;
        let rows: Vec<[u64; WORKER_FIELDS]> = serde_json::from_value(v["rows"].clone()).map_err(|e| e.to_string())?;
        t.add_worker_rows(&rows);
        latencies.extend(v["latencies"].as_array().into_iter().flatten().filter_map(|x| x.as_u64()));
    }
    Ok(latencies)
}

/// A child process: the parent's upstream and server, the parent's t = 0.
fn child(o: &Options) -> Result<(), String> {
    let c = o.child.as_ref().expect("child options");
    let upstream = c.upstream.parse().map_err(|_| "--child-upstream is not an address".to_string())?;
    let lock = match (o.mode, &o.server) {
        (Mode::Direct, _) | (_, None) => None,
        (_, Some(server)) => Some(Lock {
            addr: server.parse().map_err(|_| "--server is not an address".to_string())?,
            key: o.key.clone().unwrap_or_default(),
            pool: o.pool_name.clone().unwrap_or_default(),
            proxy: o.mode == Mode::Proxy,
        }),
    };
    let behind = Duration::from_millis(epoch_ms().saturating_sub(c.origin_epoch_ms));
    let origin = Instant::now().checked_sub(behind).unwrap_or_else(Instant::now);
    let timeline = Timeline::new(timeline_secs(o));
    let latencies = run_workers(&fleet(o, upstream, lock, origin, &timeline), o.workers);
    println!("{}", serde_json::json!({ "rows": timeline.worker_rows(), "latencies": latencies }));
    Ok(())
}
