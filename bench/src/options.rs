//! Command-line flags of `nthpool-bench` and the help text that explains them.
//!
//! Parsing is a pure function from the argument list to [`Options`] so that it
//! can be unit-tested without a process; it never opens a socket or reads the
//! environment.

use std::fmt;
use std::time::Duration;

/// Everything one run needs to know, already checked for consistency.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Target as given on the command line; also sent as the `Host` header.
    pub addr: String,
    pub pool: String,
    pub key: Option<String>,
    pub connections: usize,
    pub threads: usize,
    pub duration: Duration,
    pub warmup: Duration,
    /// Total cap on measured requests; `None` means only the duration bounds the run.
    pub requests: Option<u64>,
    /// Total intended requests per second (open loop); `None` means closed loop.
    pub rate: Option<f64>,
    pub hold: Duration,
    pub renews: u32,
    pub wait_ms: Option<u64>,
    pub backoff: Duration,
    pub timeout: Duration,
    /// `Some(path)` switches from the lock workload to plain `GET path`.
    pub get: Option<String>,
    /// `Some(sha)` drives a Redis server instead: acquire is `EVALSHA sha`
    /// of a semaphore script, release is `ZREM`.
    pub redis: Option<String>,
    /// `--vary-header`: every HTTP request carries `X-Request-Id` with a value
    /// of its own (a run-wide counter), so no two header blocks are the same.
    pub vary_header: bool,
    /// `--no-report`: releases carry no body, as a client that reports
    /// nothing on success sends them (the report is optional).
    pub no_report: bool,
    /// `--fill N`: acquire N slots as fast as possible and leave them held.
    pub fill: Option<u64>,
    /// `--queue N`: open N connections that each send one waiting acquire.
    pub queue: Option<usize>,
    pub json: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            addr: "127.0.0.1:7070".to_string(),
            pool: "demo".to_string(),
            key: None,
            connections: 50,
            threads: 1,
            duration: Duration::from_secs(10),
            warmup: Duration::ZERO,
            requests: None,
            rate: None,
            hold: Duration::ZERO,
            renews: 0,
            wait_ms: None,
            backoff: Duration::ZERO,
            timeout: Duration::from_secs(5),
            get: None,
            redis: None,
            vary_header: false,
            no_report: false,
            fill: None,
            queue: None,
            json: false,
        }
    }
}

/// What the command line asked for.
#[derive(Debug, PartialEq)]
pub enum Command {
    Run(Box<Options>),
    Help,
}

/// A command-line mistake, reported with the flag it concerns.
#[derive(Debug, PartialEq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

pub const HELP: &str = "\
nthpool-bench: load tool for the nthpool lock server

Drives a running server over keep-alive HTTP/1.1 connections with cycles of
acquire -> [hold, renews] -> release against one pool, and reports requests/s,
cycles/s, latency percentiles per endpoint (HDR histograms, microseconds) and
every non-2xx answer and connection error. With --get it sends a plain GET
instead, so another server (nginx serving a static JSON file) can be measured
with the same client and the same connections.

USAGE:
    nthpool-bench [FLAGS]

TARGET:
    --addr HOST:PORT      Server to drive; only this address is contacted, and it
                          is also the Host header [default: 127.0.0.1:7070]
    --pool NAME           Pool in /pools/NAME/lock/... [default: demo]
    --key KEY             Pool key, sent as X-Nthpool-Key (the server prints its
                          demo key on start-up) [default: none; NTHPOOL_KEY is
                          used when set]
    --get PATH            Send `GET PATH` instead of the lock cycle
    --redis SHA           Drive a Redis server with the same cycle: acquire is
                          `EVALSHA SHA 2 POOL POOL:seq` (a semaphore script that
                          answers a new holder id, or nil when full), release is
                          `ZREM POOL id`. Load the script first with SCRIPT LOAD
    --no-report           Release with no body (no outcome report, as a client
                          that reports only throttling sends its releases)
    --vary-header         Add `X-Request-Id: <16 hex digits>` to every request,
                          a counter that goes up by one with each request of
                          the run (as a trace id would change), so no two
                          header blocks are alike. Not with --redis (an error)

LOAD:
    -c, --connections N   Keep-alive connections, each with one request in
                          flight [default: 50]
    --threads T           Event-loop threads; connections are split between
                          them [default: 1]
    --rate R              Open loop: R requests/s in total, spread evenly over
                          the connections. Latency is measured from each
                          request's intended send time, so a server stall shows
                          up in the percentiles instead of slowing the client
                          down. Without --rate each connection sends its next
                          request as soon as the answer arrives (closed loop)
    --hold-ms MS          Hold each granted slot MS ms before releasing it
                          [default: 0]
    --renews K            Renew each slot K times per cycle, spread evenly over
                          the hold time [default: 0]
    --wait-ms MS          Send {\"waitMs\":MS} with acquire (queue for a slot
                          instead of failing fast) [default: no body]
    --backoff-ms MS       Pause MS ms after a 429/504 before acquiring again
                          [default: 0]

STATE (for scale runs; both leave what they create on the server):
    --fill N              Acquire N slots on --pool as fast as the -c
                          connections allow (16 pipelined per connection), never
                          renew or release them, and exit once all N are
                          answered or --duration is over. Use a pool whose
                          termMs outlasts the test so the slots stay held
    --queue N             Open N connections (-c is ignored), send one waiting
                          acquire on each ({\"waitMs\":MS}, --wait-ms or one
                          hour) and keep them open until --duration is over.
                          Prints `queue: N waiting acquires sent` on standard
                          error once every request is written. Each connection is
                          a file descriptor here and one in the server: raise
                          `ulimit -n` to fit. To a loopback target they come
                          from 127.0.0.2-9, so that ephemeral ports stay cheap

BOUNDS:
    -d, --duration SECS   Measure for SECS seconds (fractions allowed)
                          [default: 10]
    -n, --requests N      Stop after N measured requests in total, if that comes
                          before the duration. Slots still held are released
                          even past N, so the total may exceed N by at most one
                          request per connection
    --warmup SECS         Run SECS seconds before measuring; those answers are
                          not reported [default: 0]
    --timeout-ms MS       Per-request timeout; the connection is closed and
                          opened again [default: 5000, plus --wait-ms]

OUTPUT:
    --json                Print one JSON object instead of the table
    -h, --help            Print this text

At the end every slot still held is released, so the next run starts from an
empty pool (--fill and --queue excepted: holding is their purpose). Exit
status: 0 after a run with at least one 2xx answer (--fill: all N granted;
--queue: all N sent and still open), 1 otherwise, 2 on a usage error.

EXAMPLES:
    # 10 s closed loop, 50 connections, against a local server's demo pool
    nthpool-bench --addr 127.0.0.1:7070 --pool demo --key nb_demo_...

    # open loop at 50 000 requests/s, slots held 5 ms with one renew, 2 s warm-up
    nthpool-bench --key nb_demo_... --rate 50000 --hold-ms 5 --renews 1 --warmup 2

    # queue for up to 100 ms, stop after 1 000 000 requests, JSON for scripts
    nthpool-bench --key nb_demo_... --wait-ms 100 -n 1000000 --json

    # every request with an X-Request-Id of its own: no header block repeats
    nthpool-bench --key nb_demo_... --vary-header -c 1

    # the same client against nginx serving a static JSON reply
    nthpool-bench --addr 127.0.0.1:8080 --get /grant.json -c 50

    # hold 1 000 000 slots (pool with a long termMs), then 9 000 queued waiters
    nthpool-bench --key nb_demo_... --pool full --fill 1000000 -c 64 -d 60
    nthpool-bench --key nb_demo_... --pool waiters --queue 9000 -d 40 &
";

/// Parses the arguments after the program name. `env_key` is the value of
/// `NTHPOOL_KEY`, passed in so the parser stays pure.
pub fn parse<I, S>(args: I, env_key: Option<String>) -> Result<Command, UsageError>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut o = Options { key: env_key.filter(|k| !k.is_empty()), ..Options::default() };
    let mut timeout_given = false;
    let mut args = args.into_iter().map(Into::into);
    while let Some(arg) = args.next() {
        // Both `--flag value` and `--flag=value` are accepted, as in most tools.
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| -> Result<String, UsageError> {
            match inline.clone().or_else(|| args.next()) {
                Some(v) => Ok(v),
                None => Err(UsageError(format!("{name} needs a value"))),
            }
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "--json" => o.json = true,
            "--vary-header" => o.vary_header = true,
            "--no-report" => o.no_report = true,
            "--addr" => o.addr = value("--addr")?,
            "--pool" => o.pool = value("--pool")?,
            "--key" => o.key = Some(value("--key")?),
            "--get" => o.get = Some(value("--get")?),
            "--redis" => o.redis = Some(value("--redis")?),
            "--fill" => o.fill = Some(number(&flag, &value(&flag)?)?),
            "--queue" => o.queue = Some(number(&flag, &value(&flag)?)?),
            "-c" | "--connections" => o.connections = number(&flag, &value(&flag)?)?,
            "--threads" => o.threads = number(&flag, &value(&flag)?)?,
            "-d" | "--duration" => o.duration = seconds(&flag, &value(&flag)?)?,
            "--warmup" => o.warmup = seconds(&flag, &value(&flag)?)?,
            "-n" | "--requests" => o.requests = Some(number(&flag, &value(&flag)?)?),
            "--rate" => o.rate = Some(positive(&flag, &value(&flag)?)?),
            "--hold-ms" => o.hold = Duration::from_millis(number(&flag, &value(&flag)?)?),
            "--renews" => o.renews = number(&flag, &value(&flag)?)?,
            "--wait-ms" => o.wait_ms = Some(number(&flag, &value(&flag)?)?),
            "--backoff-ms" => o.backoff = Duration::from_millis(number(&flag, &value(&flag)?)?),
            "--timeout-ms" => {
                o.timeout = Duration::from_millis(number(&flag, &value(&flag)?)?);
                timeout_given = true;
            }
            _ => return Err(UsageError(format!("unknown flag {arg} (see --help)"))),
        }
    }
    if o.queue.is_some() && o.wait_ms.is_none() {
        // The point of --queue is to stay queued for the whole run.
        o.wait_ms = Some(QUEUE_WAIT_MS);
    }
    if !timeout_given {
        // A queued acquire legitimately takes up to waitMs; do not call it a timeout.
        o.timeout += Duration::from_millis(o.wait_ms.unwrap_or(0));
    }
    check(&o)?;
    Ok(Command::Run(Box::new(o)))
}

/// The wait budget `--queue` asks for when `--wait-ms` is not given: one hour,
/// longer than any bounded run, so the waiters are still queued at its end.
pub const QUEUE_WAIT_MS: u64 = 3_600_000;

fn check(o: &Options) -> Result<(), UsageError> {
    let fail = |m: &str| Err(UsageError(m.to_string()));
    let modes = [o.get.is_some(), o.redis.is_some(), o.fill.is_some(), o.queue.is_some()];
    if modes.iter().filter(|&&m| m).count() > 1 {
        return fail("--get, --redis, --fill and --queue exclude each other");
    }
    if o.fill == Some(0) || o.queue == Some(0) {
        return fail("--fill and --queue want at least 1");
    }
    if (o.fill.is_some() || o.queue.is_some()) && (o.rate.is_some() || o.threads > 1 || o.requests.is_some()) {
        return fail("--fill and --queue run closed-loop on one thread: drop --rate, --threads and -n");
    }
    if o.redis.is_some() && (o.renews > 0 || o.wait_ms.is_some()) {
        return fail("--redis drives acquire and release only: drop --renews and --wait-ms");
    }
    if o.redis.is_some() && o.no_report {
        return fail("--no-report shapes an HTTP release, and --redis speaks RESP: drop one of them");
    }
    if o.redis.is_some() && o.vary_header {
        return fail("--vary-header adds an HTTP header, and --redis speaks RESP: drop one of them");
    }
    if let Some(sha) = &o.redis {
        if sha.len() != 40 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
            return fail("--redis wants the 40-hex-digit SHA1 that SCRIPT LOAD printed");
        }
    }
    if o.connections == 0 {
        return fail("--connections must be at least 1");
    }
    if o.threads == 0 || o.threads > o.connections {
        return fail("--threads must be between 1 and --connections");
    }
    if o.duration.is_zero() {
        return fail("--duration must be more than 0");
    }
    if o.requests == Some(0) {
        return fail("--requests must be at least 1");
    }
    if o.timeout.is_zero() {
        return fail("--timeout-ms must be more than 0");
    }
    if !o.addr.contains(':') {
        return fail("--addr must be HOST:PORT");
    }
    // These go verbatim into the request head; a control byte would forge headers.
    let head_safe = |s: &str| !s.is_empty() && s.bytes().all(|b| b > b' ' && b != 0x7f);
    if !head_safe(&o.addr) {
        return fail("--addr must not contain spaces or control characters");
    }
    if !o.pool.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') || o.pool.is_empty() {
        return fail("--pool must be letters, digits and '-'");
    }
    if let Some(k) = &o.key {
        if !head_safe(k) {
            return fail("--key must not contain spaces or control characters");
        }
    }
    if let Some(p) = &o.get {
        if !p.starts_with('/') || !head_safe(p) {
            return fail("--get must be a path starting with '/' without spaces");
        }
    }
    Ok(())
}

fn number<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, UsageError> {
    v.parse().map_err(|_| UsageError(format!("{flag} wants a whole number, not {v:?}")))
}

fn positive(flag: &str, v: &str) -> Result<f64, UsageError> {
    match v.parse::<f64>() {
        Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => Err(UsageError(format!("{flag} wants a number above 0, not {v:?}"))),
    }
}

fn seconds(flag: &str, v: &str) -> Result<Duration, UsageError> {
    match v.parse::<f64>() {
        Ok(x) if (0.0..1e9).contains(&x) => Ok(Duration::from_secs_f64(x)),
        _ => Err(UsageError(format!("{flag} wants seconds, not {v:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Options {
        match parse(args.iter().copied(), None).expect("valid") {
            Command::Run(o) => *o,
            Command::Help => panic!("unexpected help"),
        }
    }

    fn error(args: &[&str]) -> String {
        parse(args.iter().copied(), None).expect_err("invalid").0
    }

    #[test]
    fn defaults() {
        assert_eq!(run(&[]), Options::default());
    }

    #[test]
    fn every_flag_in_both_spellings() {
        let o = run(&[
            "--addr=localhost:8080",
            "--pool",
            "prod-acme",
            "--key",
            "nb_live_x",
            "-c",
            "200",
            "--threads=2",
            "-d",
            "2.5",
            "--warmup",
            "1",
            "-n",
            "1000",
            "--rate",
            "50000",
            "--hold-ms",
            "5",
            "--renews=2",
            "--wait-ms",
            "100",
            "--backoff-ms",
            "3",
            "--vary-header",
            "--json",
        ]);
        assert_eq!(o.addr, "localhost:8080");
        assert_eq!(o.pool, "prod-acme");
        assert_eq!(o.key.as_deref(), Some("nb_live_x"));
        assert_eq!((o.connections, o.threads), (200, 2));
        assert_eq!(o.duration, Duration::from_millis(2500));
        assert_eq!(o.warmup, Duration::from_secs(1));
        assert_eq!(o.requests, Some(1000));
        assert_eq!(o.rate, Some(50000.0));
        assert_eq!(o.hold, Duration::from_millis(5));
        assert_eq!(o.renews, 2);
        assert_eq!(o.wait_ms, Some(100));
        assert_eq!(o.backoff, Duration::from_millis(3));
        assert!(o.vary_header);
        assert!(o.json);
        // The wait budget is added to the default timeout.
        assert_eq!(o.timeout, Duration::from_millis(5100));
    }

    #[test]
    fn explicit_timeout_is_kept() {
        let o = run(&["--wait-ms", "100", "--timeout-ms", "250"]);
        assert_eq!(o.timeout, Duration::from_millis(250));
    }

    #[test]
    fn get_mode() {
        assert_eq!(run(&["--get", "/x.json"]).get.as_deref(), Some("/x.json"));
        assert!(error(&["--get", "x.json"]).contains("--get"));
    }

    #[test]
    fn state_modes() {
        let fill = run(&["--fill", "1000000", "-c", "64"]);
        assert_eq!((fill.fill, fill.wait_ms), (Some(1_000_000), None));
        let queue = run(&["--queue=9000"]);
        assert_eq!(queue.queue, Some(9000));
        // Queued for longer than any run unless told otherwise.
        assert_eq!(queue.wait_ms, Some(QUEUE_WAIT_MS));
        assert_eq!(run(&["--queue", "5", "--wait-ms", "100"]).wait_ms, Some(100));
        assert!(error(&["--fill", "0"]).contains("--fill"));
        assert!(error(&["--fill", "5", "--queue", "5"]).contains("exclude"));
        assert!(error(&["--fill", "5", "--get", "/x"]).contains("exclude"));
        assert!(error(&["--fill", "5", "--rate", "10"]).contains("--rate"));
        assert!(error(&["--queue", "5", "-n", "10"]).contains("-n"));
    }

    #[test]
    fn redis_mode() {
        let sha = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(run(&["--redis", sha]).redis.as_deref(), Some(sha));
        assert!(error(&["--redis", "abc"]).contains("SHA1"));
        assert!(error(&["--redis", sha, "--renews", "1"]).contains("--renews"));
        assert!(error(&["--redis", sha, "--get", "/x"]).contains("exclude"));
        assert!(error(&["--redis", sha, "--vary-header"]).contains("--vary-header"));
    }

    #[test]
    fn help_wins() {
        assert_eq!(parse(["-c", "5", "--help"], None), Ok(Command::Help));
        assert_eq!(parse(["-h"], None), Ok(Command::Help));
    }

    #[test]
    fn environment_key_is_the_fallback() {
        let with_env = |args: &[&str]| match parse(args.iter().copied(), Some("env".into())) {
            Ok(Command::Run(o)) => o.key,
            other => panic!("{other:?}"),
        };
        assert_eq!(with_env(&[]).as_deref(), Some("env"));
        assert_eq!(with_env(&["--key", "flag"]).as_deref(), Some("flag"));
    }

    #[test]
    fn mistakes_name_the_flag() {
        assert!(error(&["--bogus"]).contains("--bogus"));
        assert!(error(&["-c"]).contains("needs a value"));
        assert!(error(&["-c", "many"]).contains("-c"));
        assert!(error(&["-c", "0"]).contains("--connections"));
        assert!(error(&["-c", "2", "--threads", "3"]).contains("--threads"));
        assert!(error(&["--rate", "0"]).contains("--rate"));
        assert!(error(&["--rate", "NaN"]).contains("--rate"));
        assert!(error(&["-d", "-1"]).contains("-d"));
        assert!(error(&["-d", "0"]).contains("--duration"));
        assert!(error(&["-n", "0"]).contains("--requests"));
        assert!(error(&["--addr", "nohost"]).contains("--addr"));
        assert!(error(&["--key", "a\r\nX-Evil: 1"]).contains("--key"));
        assert!(error(&["--pool", "a/b"]).contains("--pool"));
    }
}
