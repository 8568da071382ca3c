//! Pools sharded across instances behind HAProxy (SPEC §14), end to end:
//! `scripts/cluster.sh` starts the real binary three times and HAProxy with
//! its generated configuration, on loopback ports of its own; the tests talk
//! to HAProxy only, and read which instance answered from the
//! `X-Nthpool-Instance` header HAProxy adds.
//!
//! Every test skips, saying so, only when HAProxy is not installed and
//! apt-get cannot install it (`.ci/run` installs it).

mod common;
#[path = "common/upstream.rs"]
mod upstream;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{eventually, post, read_response, scratch_dir, Response, Scratch};
use upstream::{ok, MockUpstream};

const KEY: &str = "cluster-test-key";
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/cluster.sh");

/// Whether HAProxy is there, installing Debian's package when it is not.
fn haproxy_available() -> bool {
    let found = || Command::new("haproxy").arg("-v").output().is_ok_and(|o| o.status.success());
    if found() {
        return true;
    }
    let _ = Command::new("apt-get")
        .args(["install", "-y", "-qq", "haproxy"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output();
    if found() {
        return true;
    }
    eprintln!("SKIPPED: HAProxy is not installed and `apt-get install haproxy` failed; the cluster tests need it");
    false
}

/// A base port whose cluster ports (base .. base+2, base+11 .., base+21 ..) are free now.
/// They lie below Linux's ephemeral range (32768 and up by default), so the
/// outgoing connections of tests running meanwhile cannot take one between
/// this check and HAProxy's bind.
/// `NTHPOOL_CLUSTER_TEST_PORT` names the base instead (one test at a time).
fn free_base_port(instances: u16) -> u16 {
    if let Some(base) = std::env::var("NTHPOOL_CLUSTER_TEST_PORT").ok().and_then(|p| p.parse().ok()) {
        return base;
    }
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let seed = std::process::id() as usize * 7919;
    for _ in 0..200 {
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let base = 20_000 + ((seed + n * 97) % 120) as u16 * 100;
        let ports = (0..3).chain((11..11 + instances).chain(21..21 + instances)).map(|off| base + off);
        let held: Vec<_> = ports.map_while(|p| TcpListener::bind(("127.0.0.1", p)).ok()).collect();
        if held.len() == 3 + 2 * instances as usize {
            return base;
        }
    }
    panic!("no free block of loopback ports");
}

/// Instances `n1 … nN` behind HAProxy, started and stopped by the script.
struct Cluster {
    /// The script's directory, in `_scratch`.
    dir: PathBuf,
    port: u16,
    /// Removed after `Drop` has stopped the instances (fields drop after it).
    _scratch: Scratch,
}

impl Cluster {
    /// `pools` is the configuration's `pools` object; `check_ms` and
    /// `stick_ms` are HAProxy's health-check interval and stick expiry.
    fn start(instances: u16, pools: &str, check_ms: u64, stick_ms: u64) -> Option<Cluster> {
        let (cluster, out) = Cluster::launch(instances, pools, check_ms, stick_ms)?;
        assert!(out.status.success(), "cluster.sh failed: {}", String::from_utf8_lossy(&out.stderr));
        Some(cluster)
    }

    /// Runs the script's start, whatever it answers (`None` without HAProxy).
    fn launch(instances: u16, pools: &str, check_ms: u64, stick_ms: u64) -> Option<(Cluster, std::process::Output)> {
        if !haproxy_available() {
            return None;
        }
        let dir = scratch_dir();
        let config = dir.join("pools.json");
        std::fs::write(&config, format!(r#"{{"accessLog":null,"pools":{pools}}}"#)).unwrap();
        let port = free_base_port(instances);
        let cluster = Cluster { dir: dir.join("cluster"), port, _scratch: dir };
        let out = cluster.script(&[
            "--instances",
            &instances.to_string(),
            "--config",
            config.to_str().unwrap(),
            "--port",
            &port.to_string(),
            "--bin",
            env!("CARGO_BIN_EXE_nthpool"),
            "--check-ms",
            &check_ms.to_string(),
            "--stick-ms",
            &stick_ms.to_string(),
        ]);
        Some((cluster, out))
    }

    /// Runs the script's start again in the same directory (after `--stop`).
    fn start_again(&self, instances: u16) -> std::process::Output {
        let config = self.dir.parent().unwrap().join("pools.json");
        self.script(&[
            "--instances",
            &instances.to_string(),
            "--config",
            config.to_str().unwrap(),
            "--port",
            &self.port.to_string(),
            "--bin",
            env!("CARGO_BIN_EXE_nthpool"),
        ])
    }

    fn script(&self, args: &[&str]) -> std::process::Output {
        Command::new("bash").arg(SCRIPT).args(args).arg("--dir").arg(&self.dir).output().expect("run cluster.sh")
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_nodelay(true).unwrap();
        s
    }

    fn request(&self, raw: &[u8]) -> Response {
        let mut s = self.connect();
        s.write_all(raw).unwrap();
        read_response(&mut s).expect("an answer through HAProxy")
    }

    fn pid(&self, instance: &str) -> u32 {
        std::fs::read_to_string(self.dir.join(instance).join("pid")).unwrap().trim().parse().unwrap()
    }

    fn signal(&self, instance: &str, sig: &str) {
        let ok =
            Command::new("kill").arg(format!("-{sig}")).arg(self.pid(instance).to_string()).status().unwrap().success();
        assert!(ok, "kill -{sig} {instance}");
    }

    fn kill_9(&self, instance: &str) {
        self.signal(instance, "KILL");
    }

    fn restart(&self, instance: &str) {
        let out = self.script(&["--restart", instance]);
        assert!(out.status.success(), "restart {instance}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// One counter of instance `n` (1-based) from its admin listener.
    fn metric(&self, n: u16, line_start: &str) -> u64 {
        let mut c = TcpStream::connect(("127.0.0.1", self.port + 20 + n)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
        let text = String::from_utf8(read_response(&mut c).unwrap().body).unwrap();
        let line = text.lines().find(|l| l.starts_with(line_start)).unwrap_or_else(|| panic!("no {line_start}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.script(&["--stop"]);
    }
}

fn instance(r: &Response) -> String {
    r.header("x-nthpool-instance").unwrap_or_else(|| panic!("no X-Nthpool-Instance in {r:?}")).to_string()
}

fn pools_json(names: &[String], settings: &str) -> String {
    let pools: Vec<String> = names.iter().map(|n| format!(r#""{n}":{{"keys":["{KEY}"],{settings}}}"#)).collect();
    format!("{{{}}}", pools.join(","))
}

/// A connection to `to` from the loopback address `from` (as HAProxy's
/// `source` makes its own).
fn connect_from(from: Ipv4Addr, to: SocketAddr) -> TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.bind(&SocketAddr::from((from, 0)).into()).unwrap();
    socket.connect(&to.into()).unwrap();
    let stream = TcpStream::from(socket);
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:03}")).collect()
}

const SHORT: &str = r#""concurrency":2,"termMs":1500,"renewIntervalMs":500,"requestTimeoutMs":60000,
    "queue":{"size":100,"timeoutMs":3000}"#;

/// Proxied requests per pool in absolute form without Host.
const ABSOLUTE_FORM: usize = 3;

#[test]
fn every_request_of_a_pool_lands_on_one_instance() {
    let upstream = MockUpstream::start(|_| ok("{}", ""));
    let pools = names("route", 8);
    let with_upstream: Vec<String> = pools
        .iter()
        .map(|n| {
            format!(
                r#""{n}":{{"keys":["{KEY}"],{SHORT},"upstream":{{"url":"{}","hosts":["{n}.proxy.test"]}}}}"#,
                upstream.url()
            )
        })
        .collect();
    let Some(cluster) = Cluster::start(3, &format!("{{{}}}", with_upstream.join(",")), 300, 120_000) else { return };
    let mut served_by = BTreeMap::new();
    for pool in &pools {
        // The fresh instances are in their start window: wait through it.
        let acquire = post(&format!("/pools/{pool}/lock/acquire"), KEY, "", r#"{"waitMs":3000}"#);
        let granted = cluster.request(&acquire);
        let slot = granted.slot();
        let renewed = cluster.request(&post(&format!("/pools/{pool}/lock/{slot}/renew"), KEY, "", ""));
        assert_eq!(renewed.status, 200, "{renewed:?}");
        let released = cluster.request(&post(&format!("/pools/{pool}/lock/{slot}/release"), KEY, "", ""));
        assert_eq!(released.json()["released"], true);
        let again = cluster.request(&acquire);
        // The pool's name percent-encoded in the path is the same pool to the
        // instance, so HAProxy places it by the decoded name too.
        let escaped = format!("%{:02X}{}", pool.as_bytes()[0], &pool[1..]);
        let spelled = cluster.request(&post(&format!("/pools/{escaped}/lock/acquire"), KEY, "", ""));
        assert_eq!(spelled.status, 200, "{spelled:?}");
        let spelled_slot = spelled.slot();
        let freed = cluster.request(&post(&format!("/pools/{escaped}/lock/{spelled_slot}/release"), KEY, "", ""));
        assert_eq!(freed.json()["released"], true, "{freed:?}");
        // Proxy traffic of the pool, routed by its Host.
        let proxied: Vec<Response> = ["/v1/models", "/pools/elsewhere/lock/acquire"]
            .iter()
            .map(|path| {
                cluster.request(
                    format!(
                        "GET {path} HTTP/1.1\r\nHost: {pool}.proxy.test\r\nX-Nthpool-Key: {KEY}\r\n\
                         X-Nthpool-Queue-Timeout-Ms: 3000\r\n\r\n"
                    )
                    .as_bytes(),
                )
            })
            .collect();
        // HTTP/1.0 may name the host in an absolute-form target and send no
        // Host: the authority places it (an empty Host hashed anywhere).
        let absolute = (0..ABSOLUTE_FORM).map(|_| {
            cluster.request(
                format!(
                    "GET http://{pool}.proxy.test/v1/models HTTP/1.0\r\nX-Nthpool-Key: {KEY}\r\n\
                     X-Nthpool-Queue-Timeout-Ms: 3000\r\n\r\n"
                )
                .as_bytes(),
            )
        });
        let proxied: Vec<Response> = proxied.into_iter().chain(absolute).collect();
        for p in &proxied {
            assert_eq!(p.status, 200, "proxied for {pool}: {p:?}");
        }
        let seen: Vec<String> = [&granted, &renewed, &released, &again, &spelled, &freed]
            .into_iter()
            .chain(&proxied)
            .map(instance)
            .collect();
        assert!(seen.iter().all(|i| *i == seen[0]), "{pool} was served by {seen:?}");
        served_by.insert(pool.clone(), seen[0].clone());
    }
    let per_pool = 2 + ABSOLUTE_FORM as u64;
    assert_eq!(
        upstream.seen().len() as u64,
        per_pool * pools.len() as u64,
        "every proxied request reached the upstream"
    );
    // Each instance's own counters agree: a pool's grants (three lock
    // acquires, the proxied requests) are all on its instance.
    for (pool, owner) in &served_by {
        for n in 1..=3u16 {
            let grants = cluster.metric(n, &format!("nthpool_grants_total{{pool=\"{pool}\"}}"));
            let expected = if *owner == format!("n{n}") { 3 + per_pool } else { 0 };
            assert_eq!(grants, expected, "{pool} (served by {owner}) on n{n}");
        }
    }
    let used: std::collections::BTreeSet<_> = served_by.values().collect();
    assert!(used.len() >= 2, "8 pools all on one instance: {served_by:?}");

    // A pool segment no pool can be named places nothing: one that decodes
    // to the pool's name, a NUL and more (which the stick table's key ends
    // at) hashed elsewhere and moved the pool there, to be governed twice.
    for (pool, owner) in &served_by {
        for i in 0..6 {
            // A NUL and more, a newline (which a `$` in the check would let by).
            let suffix = if i % 2 == 0 { format!("%00{i}") } else { "%0A".to_string() };
            let poison = cluster.request(&post(&format!("/pools/{pool}{suffix}/lock/acquire"), "", "", ""));
            assert!(matches!(poison.status, 400 | 404), "{poison:?}");
            let after = cluster.request(&post(&format!("/pools/{pool}/lock/acquire"), "", "", ""));
            assert_eq!(instance(&after), *owner, "{pool} moved after /pools/{pool}{suffix}/lock/acquire");
        }
    }

    // A client cannot say a pool moved: HAProxy drops its X-Nthpool-Moved, so
    // the pool grants as usual; sent straight to the instance from the
    // client's own address it is ignored too; from HAProxy's address (the
    // one trusted proxy of every pool the script runs, as the README says to
    // configure) it opens the pool's window there.
    for n in 1..=3 {
        let config = std::fs::read_to_string(cluster.dir.join(format!("n{n}/config.json"))).unwrap();
        let config: serde_json::Value = serde_json::from_str(&config).unwrap();
        for (pool, settings) in config["pools"].as_object().unwrap() {
            let trusted = &settings["access"]["trustedProxies"];
            assert_eq!(*trusted, serde_json::json!(["127.0.0.2/32"]), "n{n}'s {pool} trusts other than HAProxy");
        }
    }
    let (pool, owner) = served_by.iter().next().unwrap();
    let forged = post(&format!("/pools/{pool}/lock/acquire"), KEY, "X-Nthpool-Moved: n1\r\n", "");
    assert_eq!(cluster.request(&forged).status, 200, "a client's X-Nthpool-Moved passed HAProxy");
    let n: u16 = owner[1..].parse().unwrap();
    let instance = SocketAddr::from(([127, 0, 0, 1], cluster.port + 10 + n));
    let mut local = TcpStream::connect(instance).unwrap();
    local.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    local.write_all(&forged).unwrap();
    let answered = read_response(&mut local).unwrap();
    assert_ne!(
        answered.header("x-nthpool-deny-reason"),
        Some("recovering"),
        "a local client's X-Nthpool-Moved opened a window: {answered:?}"
    );
    let mut direct = connect_from(Ipv4Addr::new(127, 0, 0, 2), instance);
    direct.write_all(&forged).unwrap();
    let denied = read_response(&mut direct).unwrap();
    assert_eq!((denied.status, denied.header("x-nthpool-deny-reason")), (429, Some("recovering")), "{denied:?}");
}

/// A pool's proxy traffic reaches its one instance whatever form of a
/// configured host its `Host` (or absolute-form authority) takes, as long as
/// nthpool routes it to the pool: any case, a port, the final dot of an
/// absolute name, an IPv6 literal in brackets; and a host configured with a
/// final dot takes the traffic that names it without one. HAProxy's map
/// missed such forms and balanced them round-robin, so every instance
/// governed the pool.
#[test]
fn every_form_of_a_pools_host_reaches_its_one_instance() {
    let upstream = MockUpstream::start(|_| ok("{}", ""));
    let pool = |name: &str, hosts: &str| {
        format!(r#""{name}":{{"keys":["{KEY}"],{SHORT},"upstream":{{"url":"{}","hosts":[{hosts}]}}}}"#, upstream.url())
    };
    let pools = [
        pool("plain", r#""plain.proxy.test""#),
        pool("literal", r#""[fd00::1]","10.1.2.3""#),
        pool("dotted", r#""Dotted.Proxy.Test.""#),
    ];
    let Some(cluster) = Cluster::start(3, &format!("{{{}}}", pools.join(",")), 300, 120_000) else { return };
    let forms: [(&str, &[&str]); 3] = [
        ("plain", &["plain.proxy.test", "plain.proxy.test.", "PLAIN.Proxy.Test:8443", "plain.proxy.test.:80"]),
        ("literal", &["[fd00::1]", "[FD00::1]:443", "[fd00::1]:", "10.1.2.3:8080", "10.1.2.3."]),
        ("dotted", &["dotted.proxy.test", "dotted.proxy.test.", "DOTTED.proxy.test:80"]),
    ];
    let mut proxied_count = 0;
    for (name, hosts) in forms {
        // The fresh instances are in their start window: wait through it.
        let acquire = post(&format!("/pools/{name}/lock/acquire"), KEY, "", r#"{"waitMs":3000}"#);
        let granted = cluster.request(&acquire);
        assert_eq!(granted.status, 200, "{granted:?}");
        let owner = instance(&granted);
        let released = cluster.request(&post(&format!("/pools/{name}/lock/{}/release", granted.slot()), KEY, "", ""));
        assert_eq!(released.json()["released"], true);
        for host in hosts {
            // Three of each: a miss is balanced round-robin over the three
            // instances, so it cannot land on the owner every time.
            for _ in 0..3 {
                let requests = [
                    format!(
                        "GET /v1/models HTTP/1.1\r\nHost: {host}\r\nX-Nthpool-Key: {KEY}\r\n\
                         X-Nthpool-Queue-Timeout-Ms: 3000\r\n\r\n"
                    ),
                    format!(
                        "GET http://{host}/v1/models HTTP/1.0\r\nX-Nthpool-Key: {KEY}\r\n\
                         X-Nthpool-Queue-Timeout-Ms: 3000\r\n\r\n"
                    ),
                ];
                for raw in requests {
                    let answer = cluster.request(raw.as_bytes());
                    assert_eq!(answer.status, 200, "{name} as {host}: {answer:?}");
                    assert_eq!(instance(&answer), owner, "{name} as {host} left {owner}: {answer:?}");
                    proxied_count += 1;
                }
            }
        }
        // Only the owner's governor ever granted the pool.
        for n in 1..=3u16 {
            let grants = cluster.metric(n, &format!("nthpool_grants_total{{pool=\"{name}\"}}"));
            let expected = if owner == format!("n{n}") { 1 + 6 * hosts.len() as u64 } else { 0 };
            assert_eq!(grants, expected, "{name} (served by {owner}) on n{n}");
        }
    }
    assert_eq!(upstream.seen().len(), proxied_count, "every proxied request reached the upstream");
    // hosts.map holds each name as HAProxy reads a Host.
    let map = std::fs::read_to_string(cluster.dir.join("hosts.map")).unwrap();
    assert_eq!(map, "plain.proxy.test plain\n[fd00::1] literal\n10.1.2.3 literal\ndotted.proxy.test dotted\n");
}

/// A reload of the instances that adds a host to a pool, before hosts.map is
/// written again and HAProxy reloaded: HAProxy's map misses the new host and
/// balances its traffic to any instance. Each instance refuses it (`421`)
/// rather than govern the pool beside the pool's own instance; the pool's
/// mapped host is still served, by its one instance, and a client cannot
/// choose the pool HAProxy names.
#[test]
fn a_host_the_map_does_not_know_yet_is_refused_not_governed_twice() {
    let upstream = MockUpstream::start(|_| ok("{}", ""));
    let pools = format!(
        r#"{{"plain":{{"keys":["{KEY}"],{SHORT},"upstream":{{"url":"{}","hosts":["plain.proxy.test"]}}}}}}"#,
        upstream.url()
    );
    let Some(cluster) = Cluster::start(3, &pools, 300, 120_000) else { return };
    // The fresh instances are in their start window: wait through it.
    let granted = cluster.request(&post("/pools/plain/lock/acquire", KEY, "", r#"{"waitMs":3000}"#));
    assert_eq!(granted.status, 200, "{granted:?}");
    let owner = instance(&granted);
    let released = cluster.request(&post(&format!("/pools/plain/lock/{}/release", granted.slot()), KEY, "", ""));
    assert_eq!(released.json()["released"], true);

    // Every instance learns a second host of the pool; HAProxy does not.
    for n in 1..=3u16 {
        let path = cluster.dir.join(format!("n{n}/config.json"));
        let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        config["pools"]["plain"]["upstream"]["hosts"].as_array_mut().unwrap().push("late.proxy.test".into());
        std::fs::write(&path, config.to_string()).unwrap();
        cluster.signal(&format!("n{n}"), "HUP");
    }
    let served_before = upstream.seen().len();
    // Applied once an instance routes the new host (asked directly, from
    // 127.0.0.1, which no pool trusts as a proxy: a plain client).
    for n in 1..=3u16 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut s = TcpStream::connect(("127.0.0.1", cluster.port + 10 + n)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let raw = format!("GET /v1/models HTTP/1.1\r\nHost: late.proxy.test\r\nX-Nthpool-Key: {KEY}\r\n\r\n");
            s.write_all(raw.as_bytes()).unwrap();
            if read_response(&mut s).unwrap().status == 200 {
                break;
            }
            assert!(Instant::now() < deadline, "n{n} did not apply the reload");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let direct = upstream.seen().len() - served_before;

    let grants_before: Vec<u64> =
        (1..=3u16).map(|n| cluster.metric(n, "nthpool_grants_total{pool=\"plain\"}")).collect();
    let mut refused_by = BTreeMap::new();
    // Nine: balanced round-robin, a miss reaches every instance.
    for _ in 0..9 {
        let raw = format!(
            "POST /v1/chat HTTP/1.1\r\nHost: late.proxy.test\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 2\r\n\r\n{{}}"
        );
        let refused = cluster.request(raw.as_bytes());
        assert_eq!(
            (refused.status, refused.json()["error"].as_str()),
            (421, Some("misdirected_request")),
            "{refused:?}"
        );
        *refused_by.entry(instance(&refused)).or_insert(0) += 1;
    }
    assert_eq!(refused_by.len(), 3, "the map's misses reach every instance: {refused_by:?}");
    assert_eq!(upstream.seen().len() - served_before, direct, "no misdirected request reached the upstream");
    for n in 1..=3u16 {
        let grants = cluster.metric(n, "nthpool_grants_total{pool=\"plain\"}");
        assert_eq!(grants, grants_before[n as usize - 1], "n{n} granted a misdirected request");
        let counted = cluster.metric(n, "nthpool_rejections_total{pool=\"plain\",code=\"421\"}");
        assert_eq!(counted, refused_by.get(&format!("n{n}")).copied().unwrap_or(0), "n{n}'s 421s");
    }

    // The mapped host still reaches the pool's one instance, whatever pool a
    // client claims: HAProxy replaces the field.
    let raw = format!(
        "GET /v1/models HTTP/1.1\r\nHost: plain.proxy.test\r\nX-Nthpool-Key: {KEY}\r\nX-Nthpool-Pool: elsewhere\r\n\r\n"
    );
    let served = cluster.request(raw.as_bytes());
    assert_eq!((served.status, instance(&served)), (200, owner.clone()), "{served:?}");
}

#[test]
fn three_hundred_pools_spread_within_a_quarter_of_even() {
    let pools = names("spread", 300);
    let Some(cluster) = Cluster::start(3, &pools_json(&pools, r#""concurrency":1"#), 1000, 120_000) else { return };
    let mut per_instance: BTreeMap<String, usize> = BTreeMap::new();
    let mut conn = cluster.connect();
    for pool in &pools {
        conn.write_all(&post(&format!("/pools/{pool}/lock/acquire"), KEY, "", "")).unwrap();
        let answer = read_response(&mut conn).expect("an answer");
        *per_instance.entry(instance(&answer)).or_default() += 1;
    }
    assert_eq!(per_instance.len(), 3, "{per_instance:?}");
    for (name, count) in &per_instance {
        assert!((75..=125).contains(count), "{name} serves {count} of 300 pools: {per_instance:?}");
    }
}

/// What the load saw of one pool, as its clients believe it.
#[derive(Default)]
struct PoolSeen {
    holders: AtomicI64,
    max_holders: AtomicI64,
    grants: AtomicU64,
    /// `(when, instance)` of every grant.
    granted_by: Mutex<Vec<(Instant, String)>>,
}

/// Workers that acquire, hold with renewals, and release, through HAProxy.
struct Load {
    stop: Arc<AtomicBool>,
    seen: Arc<Vec<PoolSeen>>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

const TERM_MS: u64 = 3000;
const RENEW_MS: u64 = 1000;
/// How long a holder waits for a renew's answer before it sends it again. A
/// renew that reaches a dead instance's address waits about 2 s for its `503`
/// (`retries 2`, HAProxy's 1 s turn-around between connection attempts): a
/// holder that waited it out could not send again within its 3 s term once
/// HAProxy has marked the instance down. Renewing is idempotent.
const RENEW_ATTEMPT: Duration = Duration::from_millis(400);
const LIMIT: i64 = 2;
const LOAD_POOL: &str = r#""concurrency":2,"termMs":3000,"renewIntervalMs":1000,"requestTimeoutMs":60000,
    "queue":{"size":100,"timeoutMs":1000}"#;

/// One keep-alive connection that reconnects after any failure.
struct Client {
    port: u16,
    conn: Option<TcpStream>,
}

impl Client {
    fn call(&mut self, raw: &[u8]) -> Option<Response> {
        self.call_within(raw, Duration::from_secs(5))
    }

    /// `call`, given up after `patience` without an answer.
    fn call_within(&mut self, raw: &[u8], patience: Duration) -> Option<Response> {
        if self.conn.is_none() {
            let s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
            s.set_nodelay(true).unwrap();
            self.conn = Some(s);
        }
        let s = self.conn.as_mut().unwrap();
        s.set_read_timeout(Some(patience)).unwrap();
        let answer = s.write_all(raw).ok().and_then(|_| read_response_lenient(s));
        if answer.as_ref().is_none_or(|r| r.header("connection") == Some("close")) {
            self.conn = None;
        }
        answer
    }
}

/// `read_response`, but a reset or a timeout is `None` rather than a panic:
/// connections through a killed instance fail.
fn read_response_lenient(s: &mut TcpStream) -> Option<Response> {
    common::try_read_response(s).ok().flatten()
}

impl Load {
    fn start(port: u16, pools: &[String], per_pool: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let seen: Arc<Vec<PoolSeen>> = Arc::new(pools.iter().map(|_| PoolSeen::default()).collect());
        let mut workers = Vec::new();
        for (p, pool) in pools.iter().enumerate() {
            for w in 0..per_pool {
                let (stop, seen, pool) = (stop.clone(), seen.clone(), pool.clone());
                workers.push(std::thread::spawn(move || worker(port, &pool, &seen[p], &stop, w as u64)));
            }
        }
        Load { stop, seen, workers }
    }

    fn finish(self) -> Arc<Vec<PoolSeen>> {
        self.stop.store(true, Ordering::SeqCst);
        for w in self.workers {
            w.join().expect("a load worker panicked");
        }
        self.seen
    }
}

/// A well-behaved holder: it counts itself as holding from the grant until it
/// releases, gets `404` on a renew, or its lease (by its own clock, from the
/// send instant of its last successful renew) runs out without a renew
/// getting through.
fn worker(port: u16, pool: &str, seen: &PoolSeen, stop: &AtomicBool, n: u64) {
    let mut client = Client { port, conn: None };
    let acquire = post(&format!("/pools/{pool}/lock/acquire"), KEY, "", r#"{"waitMs":1000}"#);
    let mut round = n;
    while !stop.load(Ordering::SeqCst) {
        round += 1;
        let sent = Instant::now();
        let Some(granted) = client.call(&acquire).filter(|r| r.status == 200) else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let now_holding = seen.holders.fetch_add(1, Ordering::SeqCst) + 1;
        seen.max_holders.fetch_max(now_holding, Ordering::SeqCst);
        seen.grants.fetch_add(1, Ordering::SeqCst);
        seen.granted_by.lock().unwrap().push((Instant::now(), instance(&granted)));
        let slot = granted.slot();
        let hold_until = Instant::now() + Duration::from_millis(200 + (round * 347) % 1800);
        let lost = hold(&mut client, pool, &slot, sent, || Instant::now() < hold_until);
        seen.holders.fetch_sub(1, Ordering::SeqCst);
        if !lost {
            let _ = client.call(&post(&format!("/pools/{pool}/lock/{slot}/release"), KEY, "", ""));
        }
    }
}

/// Renews `slot`, granted to a request sent at `sent`, every `RENEW_MS`
/// while `keep()` holds; whether the lease was lost (a renew answered `404`
/// or `409`, or the lease ran out, by the holder's own clock, with no renew
/// through).
fn hold(client: &mut Client, pool: &str, slot: &str, sent: Instant, keep: impl Fn() -> bool) -> bool {
    let mut lease_end = sent + Duration::from_millis(TERM_MS);
    let mut next_renew = sent + Duration::from_millis(RENEW_MS);
    let renew = post(&format!("/pools/{pool}/lock/{slot}/renew"), KEY, "", "");
    while keep() {
        std::thread::sleep(Duration::from_millis(20).min(next_renew.saturating_duration_since(Instant::now())));
        if Instant::now() < next_renew {
            continue;
        }
        loop {
            let sent = Instant::now();
            if sent + Duration::from_millis(100) >= lease_end {
                return true;
            }
            match client.call_within(&renew, RENEW_ATTEMPT).map(|r| r.status) {
                Some(200) => {
                    lease_end = sent + Duration::from_millis(TERM_MS);
                    next_renew = sent + Duration::from_millis(RENEW_MS);
                    break;
                }
                Some(404) | Some(409) => return true,
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }
    false
}

/// One slot of a pool held, with renewals, until dropped: a holder that is
/// certain to renew across an instance's death, whatever the load's random
/// hold times happen to be at that instant.
struct Anchor {
    holding: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Anchor {
    fn start(port: u16, pool: &str, seen: &Arc<Vec<PoolSeen>>, p: usize) -> Anchor {
        let (holding, stop) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let (pool, seen, h, s) = (pool.to_string(), seen.clone(), holding.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut client = Client { port, conn: None };
            let acquire = post(&format!("/pools/{pool}/lock/acquire"), KEY, "", r#"{"waitMs":1000}"#);
            let deadline = Instant::now() + Duration::from_secs(20);
            let (sent, granted) = loop {
                assert!(Instant::now() < deadline, "no slot of {pool} for the anchor in 20 s");
                let sent = Instant::now();
                match client.call(&acquire).filter(|r| r.status == 200) {
                    Some(granted) => break (sent, granted),
                    None => std::thread::sleep(Duration::from_millis(20)),
                }
            };
            let now_holding = seen[p].holders.fetch_add(1, Ordering::SeqCst) + 1;
            seen[p].max_holders.fetch_max(now_holding, Ordering::SeqCst);
            h.store(true, Ordering::SeqCst);
            let slot = granted.slot();
            let lost = hold(&mut client, &pool, &slot, sent, || !s.load(Ordering::SeqCst));
            seen[p].holders.fetch_sub(1, Ordering::SeqCst);
            assert!(!lost, "the anchor's slot in {pool} was lost");
            let _ = client.call(&post(&format!("/pools/{pool}/lock/{slot}/release"), KEY, "", ""));
        });
        Anchor { holding, stop, thread: Some(thread) }
    }

    /// Waits (bounded) until the slot is held.
    fn wait_holding(&self) {
        let deadline = Instant::now() + Duration::from_secs(25);
        while !self.holding.load(Ordering::SeqCst) {
            assert!(!self.thread.as_ref().unwrap().is_finished(), "the anchor stopped before it held a slot");
            assert!(Instant::now() < deadline, "the anchor held no slot in 25 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Releases the slot; panics if the lease was lost on the way.
    fn release(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Err(e) = self.thread.take().unwrap().join() {
            std::panic::resume_unwind(e);
        }
    }
}

impl Drop for Anchor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// The instance that granted most of `pools`' recent grants since `since`.
fn grants_by_instance(seen: &[PoolSeen], since: Instant) -> Vec<BTreeMap<String, usize>> {
    seen.iter()
        .map(|s| {
            let mut m = BTreeMap::new();
            for (at, inst) in s.granted_by.lock().unwrap().iter().filter(|(at, _)| *at >= since) {
                let _ = at;
                *m.entry(inst.clone()).or_default() += 1;
            }
            m
        })
        .collect()
}

fn assert_never_over_limit(seen: &[PoolSeen], pools: &[String], phase: &str) {
    for (s, pool) in seen.iter().zip(pools) {
        let max = s.max_holders.load(Ordering::SeqCst);
        assert!(max <= LIMIT, "{phase}: {pool} had {max} holders at once (limit {LIMIT})");
    }
}

/// Each pool's instance, and the instance serving the most of them: after
/// the fresh instances' start windows, with the probe grants ended again so
/// a load starts from empty pools.
fn pick_victim(cluster: &Cluster, pools: &[String]) -> (Vec<String>, String) {
    std::thread::sleep(Duration::from_millis(TERM_MS + 200));
    let home: Vec<String> = pools
        .iter()
        .map(|p| instance(&cluster.request(&post(&format!("/pools/{p}/lock/acquire"), KEY, "", ""))))
        .collect();
    let victim = (1..=3).map(|n| format!("n{n}")).max_by_key(|n| home.iter().filter(|h| *h == n).count()).unwrap();
    std::thread::sleep(Duration::from_millis(TERM_MS + 200));
    (home, victim)
}

#[test]
fn killing_an_instance_under_load_moves_its_pools_which_readopt_and_never_over_admit_and_it_takes_them_back() {
    let pools = names("load", 6);
    let stick_ms = TERM_MS + 1000 + 1500;
    let Some(cluster) = Cluster::start(3, &pools_json(&pools, LOAD_POOL), 250, stick_ms) else { return };
    let (home, victim) = pick_victim(&cluster, &pools);
    let moved: Vec<usize> = (0..pools.len()).filter(|&i| home[i] == victim).collect();

    let load = Load::start(cluster.port, &pools, 4);
    // A slot in each moved pool that is held across the death for certain:
    // the load's own holders may all be between renewals at that instant.
    let anchors: Vec<Anchor> = moved.iter().map(|&i| Anchor::start(cluster.port, &pools[i], &load.seen, i)).collect();
    anchors.iter().for_each(Anchor::wait_holding);
    std::thread::sleep(Duration::from_millis(2500));
    let killed_at = Instant::now();
    cluster.kill_9(&victim);
    // Health checks notice, the pools move, their windows pass, grants resume.
    std::thread::sleep(Duration::from_millis(TERM_MS + 4000));
    let after_kill = grants_by_instance(&load.seen, killed_at + Duration::from_millis(TERM_MS + 1500));
    for &i in &moved {
        let by = &after_kill[i];
        assert!(!by.is_empty(), "{} got no grant after its instance died", pools[i]);
        assert!(!by.contains_key(&victim), "{} granted by the dead {victim}: {by:?}", pools[i]);
    }
    let readopted: u64 = (1..=3u16)
        .filter(|n| format!("n{n}") != victim)
        .flat_map(|n| moved.iter().map(move |&i| (n, i)))
        .map(|(n, i)| cluster.metric(n, &format!("nthpool_readopted_total{{pool=\"{}\"}}", pools[i])))
        .sum();
    assert!(readopted >= moved.len() as u64, "the live slots of {victim}'s pools were not all re-adopted: {readopted}");
    anchors.into_iter().for_each(Anchor::release);

    // The victim comes back: busy pools stay where they moved (they would
    // return within a term, the dangerous case), and grants go on.
    cluster.restart(&victim);
    let restarted_at = Instant::now();
    std::thread::sleep(Duration::from_millis(3000));
    let seen = load.finish();
    let busy_after_restart = grants_by_instance(&seen, restarted_at);
    for &i in &moved {
        assert!(!busy_after_restart[i].contains_key(&victim), "{} moved back while busy", pools[i]);
    }
    assert_never_over_limit(&seen, &pools, "kill and restart under load");
    for (s, pool) in seen.iter().zip(&pools) {
        assert_eq!(
            s.max_holders.load(Ordering::SeqCst),
            LIMIT,
            "{pool} never reached its limit: the load was too light"
        );
    }

    // Idle for longer than the stick expiry, pools go home; under load again
    // the instance that came back serves its pools, still within the limit.
    std::thread::sleep(Duration::from_millis(stick_ms + 1000));
    let resumed_at = Instant::now();
    let load = Load::start(cluster.port, &pools, 4);
    std::thread::sleep(Duration::from_millis(4000));
    let seen = load.finish();
    let back = grants_by_instance(&seen, resumed_at);
    for &i in &moved {
        assert!(back[i].contains_key(&victim), "{} did not go back to {victim}: {:?}", pools[i], back[i]);
        assert_eq!(back[i].len(), 1, "{} served by two instances: {:?}", pools[i], back[i]);
    }
    assert_never_over_limit(&seen, &pools, "after the pools went home");
}

#[test]
fn an_instance_out_of_rotation_but_alive_grants_nothing_stale_when_it_comes_back() {
    let pools = names("flap", 6);
    let Some(cluster) = Cluster::start(3, &pools_json(&pools, LOAD_POOL), 250, TERM_MS + 2500) else { return };
    let (home, victim) = pick_victim(&cluster, &pools);

    let load = Load::start(cluster.port, &pools, 4);
    std::thread::sleep(Duration::from_millis(2500));
    // Stopped, not dead: health checks fail, its pools move and their holders
    // renew elsewhere, while it still holds their leases and queued acquires.
    cluster.signal(&victim, "STOP");
    std::thread::sleep(Duration::from_millis(TERM_MS + 1500));
    let resumed_at = Instant::now();
    cluster.signal(&victim, "CONT");
    std::thread::sleep(Duration::from_millis(TERM_MS + 1500));
    let seen = load.finish();
    assert_never_over_limit(&seen, &pools, "an instance stopped and resumed under load");
    let after = grants_by_instance(&seen, resumed_at);
    for (i, pool) in pools.iter().enumerate().filter(|(i, _)| home[*i] == victim) {
        assert!(!after[i].contains_key(&victim), "{pool} granted by {victim} after it resumed: {:?}", after[i]);
        assert!(!after[i].is_empty(), "{pool} got no grant after {victim} resumed");
    }
}

impl Cluster {
    /// Waits (bounded) until HAProxy's stats say `instance` is `status` (`UP`, `DOWN`).
    fn wait_status(&self, instance: &str, status: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut c = TcpStream::connect(("127.0.0.1", self.port + 1)).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            // HTTP/1.0: the page is sent whole, then the connection closes.
            c.write_all(b"GET /;csv HTTP/1.0\r\n\r\n").unwrap();
            let mut csv = String::new();
            std::io::Read::read_to_string(&mut c, &mut csv).unwrap();
            let now = csv.lines().find_map(|l| {
                let f: Vec<&str> = l.split(',').collect();
                (f.len() > 17 && f[0] == "nthpool" && f[1] == instance).then(|| f[17].to_string())
            });
            if now.as_deref().is_some_and(|s| s.starts_with(status)) {
                return;
            }
            assert!(Instant::now() < deadline, "{instance} is not {status} in HAProxy's stats: {now:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A cluster of three (health checks every 250 ms) serving `pools` (limit 2,
/// a term of 6 s, a request deadline far beyond any test's end, however slow
/// the machine), with one slot held in each: the instance it was granted on
/// and its id. `None` where HAProxy is missing.
fn one_slot_in_each(pools: &[String]) -> Option<(Cluster, Vec<(String, String)>)> {
    let settings = r#""concurrency":2,"termMs":6000,"renewIntervalMs":1000,"requestTimeoutMs":600000,
        "queue":{"size":100,"timeoutMs":8000}"#;
    let cluster = Cluster::start(3, &pools_json(pools, settings), 250, 60_000)?;
    // Waiting through the fresh instances' start windows.
    let held = pools
        .iter()
        .map(|p| {
            let granted = cluster.request(&post(&format!("/pools/{p}/lock/acquire"), KEY, "", r#"{"waitMs":8000}"#));
            (instance(&granted), granted.slot())
        })
        .collect();
    Some((cluster, held))
}

/// Pools whose holders were on an instance killed (`kill -9`) and seen down
/// by HAProxy, before any request of theirs since.
struct Killed {
    cluster: Cluster,
    pools: Vec<String>,
    held: Vec<(String, String)>,
    victim: String,
    /// The pools (indices) whose slot was held on `victim`.
    on_victim: Vec<usize>,
}

impl Killed {
    /// `one_slot_in_each` of 12 pools named `prefix`; `n` of those held on
    /// one instance renewed there, then that instance killed.
    fn start(prefix: &str, n: usize) -> Option<Killed> {
        let pools = names(prefix, 12);
        let (cluster, held) = one_slot_in_each(&pools)?;
        let victim = held[0].0.clone();
        let on_victim: Vec<usize> = (0..pools.len()).filter(|&i| held[i].0 == victim).take(n).collect();
        assert_eq!(on_victim.len(), n, "fewer than {n} of 12 pools on {victim}: {held:?}");
        let killed = Killed { cluster, pools, held, victim, on_victim };
        for &i in &killed.on_victim {
            assert_eq!(killed.renew(i).status, 200);
        }
        killed.cluster.kill_9(&killed.victim);
        killed.cluster.wait_status(&killed.victim, "DOWN");
        Some(killed)
    }

    fn renew(&self, i: usize) -> Response {
        self.cluster.request(&post(&format!("/pools/{}/lock/{}/renew", self.pools[i], self.held[i].1), KEY, "", ""))
    }

    /// Each pool moved with its window open: its holder keeps its slot on
    /// another instance, and a new acquire is refused `recovering`.
    fn assert_moved_in_their_windows(&self) {
        for &i in &self.on_victim {
            let renewed = self.renew(i);
            assert_eq!(
                renewed.status, 200,
                "{}'s holder lost its slot when the pool moved: {renewed:?}",
                self.pools[i]
            );
            assert_ne!(instance(&renewed), self.victim);
            let acquired = self.cluster.request(&post(&format!("/pools/{}/lock/acquire", self.pools[i]), KEY, "", ""));
            assert_eq!(
                (acquired.status, acquired.header("x-nthpool-deny-reason")),
                (429, Some("recovering")),
                "{} granted at once after its move: {acquired:?}",
                self.pools[i]
            );
        }
    }
}

/// HAProxy marks the requests of a pool after its instance went down until
/// the new instance answers one (its stick table names the new instance from
/// then on): when the first is one the new instance refuses, the pool has
/// moved all the same, and its window must open, or the old holders'
/// renewals are `404` and the full limit is granted beside them.
#[test]
fn a_moved_pool_opens_its_window_even_when_its_first_request_is_refused() {
    let Some(k) = Killed::start("first", 2) else { return };
    // The first request of each pool since: a route under the pool that does
    // not exist, and an acquire with a wrong key.
    let (a, b) = (k.on_victim[0], k.on_victim[1]);
    let first = k.cluster.request(&post(&format!("/pools/{}/lock/acquire/", k.pools[a]), KEY, "", ""));
    assert_eq!(first.status, 404, "{first:?}");
    let first = k.cluster.request(&post(&format!("/pools/{}/lock/acquire", k.pools[b]), "wrong-key", "", ""));
    assert_eq!(first.status, 401, "{first:?}");
    k.assert_moved_in_their_windows();
}

/// The same when the first request is refused for its head before its
/// fields are read (a control field sent twice: `400`; more than 64 fields:
/// `431`) or for a byte its target may not hold (`400`): HAProxy passes
/// them, and has moved the pool they were placed by all the same.
#[test]
fn a_moved_pool_opens_its_window_even_when_its_first_head_is_refused() {
    let Some(k) = Killed::start("head", 3) else { return };
    let pool = |n: usize| &k.pools[k.on_victim[n]];
    let padding: String = (0..70).map(|n| format!("X-Padding-{n}: {n}\r\n")).collect();
    let firsts = [
        (post(&format!("/pools/{}/lock/acquire", pool(0)), KEY, &format!("X-Nthpool-Key: {KEY}\r\n"), ""), 400),
        (post(&format!("/pools/{}/lock/acquire", pool(1)), KEY, &padding, ""), 431),
        (post(&format!("/pools/{}/lock/acq\"uire", pool(2)), KEY, "", ""), 400),
    ];
    for (raw, status) in &firsts {
        let first = k.cluster.request(raw);
        assert_eq!(first.status, *status, "{first:?}");
    }
    k.assert_moved_in_their_windows();
}

/// The README's reference client, holding a slot through HAProxy when the
/// slot's instance is killed: a renewal sent before HAProxy marks the
/// instance down gets HAProxy's own `503` (HTML, not nthpool's JSON); the
/// client tries again, its next renewal is re-adopted by the instance the
/// pool moved to, and it keeps its slot, which that instance counts: once
/// the window has passed, the pool grants only what the client left free.
#[test]
fn the_reference_client_keeps_its_slot_through_a_failover() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("SKIPPED: python3 is not installed");
        return;
    }
    let settings = r#""concurrency":2,"termMs":6000,"renewIntervalMs":1000,"requestTimeoutMs":600000,
        "queue":{"size":100,"timeoutMs":8000}"#;
    // Health checks every second: renewals reach the killed instance before it is down.
    let Some(cluster) = Cluster::start(3, &pools_json(&["refc".to_string()], settings), 1000, 60_000) else { return };
    // Through the fresh instances' start windows; which instance the pool is on.
    let granted = cluster.request(&post("/pools/refc/lock/acquire", KEY, "", r#"{"waitMs":8000}"#));
    assert_eq!(granted.status, 200, "{granted:?}");
    let owner = instance(&granted);
    let released = cluster.request(&post(&format!("/pools/refc/lock/{}/release", granted.slot()), KEY, "", ""));
    assert_eq!(released.json()["released"], true);

    let harness = r#"
import json, sys
sys.path.insert(0, sys.argv[1])
from nthpool_client import Slot
slot = Slot(sys.argv[2], "refc", sys.argv[3]).__enter__()
print("acquired", flush=True)
sys.stdin.readline()
print(json.dumps({"lost": slot.lost.is_set()}), flush=True)
slot.__exit__(None, None, None)
print(json.dumps({"lost": slot.lost.is_set()}), flush=True)
"#;
    let (mut child, mut out) =
        common::reference_client_holding(harness, &format!("http://127.0.0.1:{}", cluster.port), KEY);
    cluster.kill_9(&owner);
    cluster.wait_status(&owner, "DOWN");
    // The client's renewals reach the new instance meanwhile; this acquire
    // waits out the window the first of them opened, and takes the one slot
    // the client leaves free.
    std::thread::sleep(Duration::from_secs(3));
    let wait = || cluster.request(&post("/pools/refc/lock/acquire", KEY, "", r#"{"waitMs":8000}"#));
    let mut free = wait();
    if free.header("x-nthpool-deny-reason") == Some("recovering") {
        // The pool's first request since the move, answered at once.
        free = wait();
    }
    assert_eq!(free.status, 200, "{free:?}");
    let over = cluster.request(&post("/pools/refc/lock/acquire", KEY, "", ""));
    assert_eq!(
        (over.status, over.header("x-nthpool-deny-reason")),
        (429, Some("concurrency")),
        "the reference client's slot was not counted after the failover: {over:?}"
    );
    child.stdin.as_mut().unwrap().write_all(b"\n").unwrap();
    let mut lines = Vec::new();
    for _ in 0..2 {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        lines.push(line.trim().to_string());
    }
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success() && err.is_empty(), "{err}");
    assert_eq!(lines, [r#"{"lost": false}"#; 2], "{err}");
    cluster.request(&post(&format!("/pools/refc/lock/{}/release", free.slot()), KEY, "", ""));
}

/// `--restart NAME` starts the instance again with the binary its cluster
/// started with (`--bin`), not the default release build, which may be
/// another version (or be built then, in the middle of a failover).
#[test]
fn a_restarted_instance_runs_the_binary_its_cluster_started_with() {
    let Some(cluster) = Cluster::start(3, &pools_json(&names("bin", 1), r#""concurrency":1"#), 1000, 120_000) else {
        return;
    };
    let pid = cluster.pid("n2").to_string();
    cluster.kill_9("n2");
    eventually("the killed instance gone", || {
        !Command::new("kill").args(["-0", &pid]).stderr(std::process::Stdio::null()).status().unwrap().success()
    });
    cluster.restart("n2");
    let exe = std::fs::read_link(format!("/proc/{}/exe", cluster.pid("n2"))).unwrap();
    let started_with = std::fs::canonicalize(env!("CARGO_BIN_EXE_nthpool")).unwrap();
    assert_eq!(exe, started_with, "n2 came back as another binary");
}

/// A request that reaches a pool's instance just after it died is answered
/// by HAProxy itself (after its retries): in nthpool's shape (JSON with an
/// error code and a sentence, and `Retry-After`), as the lock API answers
/// every error, not HAProxy's HTML page.
#[test]
fn haproxys_own_answers_read_as_nthpools() {
    let pools = names("own", 1);
    let settings = r#""concurrency":1,"termMs":3000,"renewIntervalMs":1000"#;
    let Some(cluster) = Cluster::start(3, &pools_json(&pools, settings), 1000, 120_000) else { return };
    // Through the fresh instances' start windows.
    let granted = cluster.request(&post(&format!("/pools/{}/lock/acquire", pools[0]), KEY, "", r#"{"waitMs":8000}"#));
    assert_eq!(granted.status, 200, "{granted:?}");
    cluster.kill_9(&instance(&granted));
    let refused = cluster.request(&post(&format!("/pools/{}/lock/{}/renew", pools[0], granted.slot()), KEY, "", ""));
    // 503 when the instance refuses connections; 502 when it died with the
    // request (or a kept connection to it) in hand.
    let code = match refused.status {
        502 => "bad_gateway",
        503 => "unavailable",
        _ => panic!("{refused:?}"),
    };
    assert_eq!(refused.header("content-type"), Some("application/json"));
    assert_eq!(refused.header("retry-after"), Some("1"));
    let body = refused.json();
    assert_eq!(body["error"], code, "{body}");
    assert!(body["message"].as_str().is_some_and(|m| m.ends_with('.')), "{body}");
}

/// HAProxy's answer when an instance takes longer than `timeout server`
/// reads as nthpool's: JSON with an error code and a sentence, and a
/// `Retry-After`, not HAProxy's HTML page. The configuration is the
/// script's, its timeout shortened and its health check off; the instance
/// accepts and never answers.
#[test]
fn haproxys_answer_to_a_silent_instance_reads_as_nthpools() {
    if !haproxy_available() {
        return;
    }
    let dir = scratch_dir();
    let port = free_base_port(1);
    let out = Command::new("bash")
        .arg(SCRIPT)
        .args(["--print-haproxy", "--instances", "1", "--port", &port.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let config = String::from_utf8(out.stdout)
        .unwrap()
        .replace("timeout server 660000ms", "timeout server 300ms")
        .replace(&format!("127.0.0.1:{} ", port + 11), &format!("{} ", silent.local_addr().unwrap()))
        .replace(&format!("check port {} ", port + 21), "");
    std::fs::write(dir.join("haproxy.cfg"), config).unwrap();
    std::fs::write(dir.join("hosts.map"), "").unwrap();
    let mut haproxy = Command::new("haproxy").arg("-f").arg(dir.join("haproxy.cfg")).arg("-db").spawn().unwrap();
    eventually("HAProxy listens", || TcpStream::connect(("127.0.0.1", port)).is_ok());
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&post("/pools/p/lock/acquire", KEY, "", "")).unwrap();
    let r = read_response(&mut s).expect("an answer from HAProxy");
    let _ = haproxy.kill();
    let _ = haproxy.wait();
    drop(silent);
    assert_eq!(
        (r.status, r.header("content-type"), r.header("retry-after")),
        (504, Some("application/json"), Some("1")),
        "{r:?}"
    );
    let body = r.json();
    assert_eq!(body["error"], "gateway_timeout", "{body}");
    assert!(body["message"].as_str().is_some_and(|m| m.ends_with('.')), "{body}");
}

/// A map older than the instances' configuration places a host by the pool
/// it named before a reload moved the host to another pool. When such a
/// request is the first of that pool after its instance went down, it is
/// refused (`421`), yet HAProxy moves the pool it placed the request by all
/// the same: that pool's window opens, its holder renews, nothing is granted.
#[test]
fn a_moved_pool_opens_its_window_when_its_first_request_is_misdirected() {
    // Never reached: every proxied request here is refused.
    let url = "http://127.0.0.1:9";
    let settings = r#""concurrency":2,"termMs":6000,"renewIntervalMs":1000,"requestTimeoutMs":60000,
        "queue":{"size":100,"timeoutMs":8000}"#;
    let pools = format!(
        r#"{{"from":{{"keys":["{KEY}"],{settings},"upstream":{{"url":"{url}","hosts":["moving.proxy.test"]}}}},
            "to":{{"keys":["{KEY}"],{settings},"upstream":{{"url":"{url}","hosts":["to.proxy.test"]}}}}}}"#
    );
    let Some(cluster) = Cluster::start(3, &pools, 250, 120_000) else { return };
    // Waiting through the fresh instances' start windows.
    let granted = cluster.request(&post("/pools/from/lock/acquire", KEY, "", r#"{"waitMs":8000}"#));
    assert_eq!(granted.status, 200, "{granted:?}");
    let (victim, slot) = (instance(&granted), granted.slot());

    // Every instance moves the host to `to`; HAProxy's map still says `from`.
    for n in 1..=3u16 {
        let path = cluster.dir.join(format!("n{n}/config.json"));
        let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        config["pools"]["from"]["upstream"]["hosts"] = serde_json::json!([]);
        config["pools"]["to"]["upstream"]["hosts"] = serde_json::json!(["to.proxy.test", "moving.proxy.test"]);
        std::fs::write(&path, config.to_string()).unwrap();
        cluster.signal(&format!("n{n}"), "HUP");
    }
    // Applied once an instance, asked as HAProxy asks it, refuses the host.
    for n in 1..=3u16 {
        let to = SocketAddr::from(([127, 0, 0, 1], cluster.port + 10 + n));
        eventually(&format!("n{n} applied the reload"), || {
            let mut s = connect_from(Ipv4Addr::new(127, 0, 0, 2), to);
            let raw = format!(
                "GET /v1/models HTTP/1.1\r\nHost: moving.proxy.test\r\nX-Nthpool-Pool: from\r\nX-Nthpool-Key: {KEY}\r\n\r\n"
            );
            s.write_all(raw.as_bytes()).unwrap();
            read_response(&mut s).unwrap().status == 421
        });
    }
    let raw = format!("GET /v1/models HTTP/1.1\r\nHost: moving.proxy.test\r\nX-Nthpool-Key: {KEY}\r\n\r\n");

    cluster.kill_9(&victim);
    cluster.wait_status(&victim, "DOWN");
    let first = cluster.request(raw.as_bytes());
    assert_eq!(first.status, 421, "{first:?}");
    assert_ne!(instance(&first), victim);
    let renewed = cluster.request(&post(&format!("/pools/from/lock/{slot}/renew"), KEY, "", ""));
    assert_eq!(renewed.status, 200, "the holder lost its slot when the pool moved: {renewed:?}");
    let acquired = cluster.request(&post("/pools/from/lock/acquire", KEY, "", ""));
    assert_eq!(
        (acquired.status, acquired.header("x-nthpool-deny-reason")),
        (429, Some("recovering")),
        "granted at once after its move: {acquired:?}"
    );
}

/// HAProxy records where a pool lives when the instance it chose answers,
/// and marks the pool's requests moved until then. A waiting acquire moved
/// to another instance is answered at once (`429 recovering`), so the record
/// names that instance before the failed one can come back: once it is up
/// again, the pool's requests still go where the pool moved, never to both.
#[test]
fn a_waiting_acquire_moved_elsewhere_is_answered_at_once_and_the_pool_stays_there() {
    let pools = names("stay", 12);
    let Some((cluster, held)) = one_slot_in_each(&pools) else { return };
    let victim = held[0].0.clone();
    let renew =
        |i: usize| cluster.request(&post(&format!("/pools/{}/lock/{}/renew", pools[i], held[i].1), KEY, "", ""));
    assert_eq!(renew(0).status, 200);
    cluster.kill_9(&victim);
    cluster.wait_status(&victim, "DOWN");
    let sent = Instant::now();
    let moved = cluster.request(&post(&format!("/pools/{}/lock/acquire", pools[0]), KEY, "", r#"{"waitMs":8000}"#));
    assert_eq!((moved.status, moved.header("x-nthpool-deny-reason")), (429, Some("recovering")), "{moved:?}");
    assert!(sent.elapsed() < Duration::from_secs(3), "the moved acquire waited {:?}", sent.elapsed());
    let home = instance(&moved);
    assert_ne!(home, victim);
    // The holder renews every second throughout, as a live one does: each
    // renewal must reach the instance the pool moved to, before the failed
    // one is back and after.
    let renewing = AtomicBool::new(true);
    let renewals = std::thread::scope(|scope| {
        let renewer = scope.spawn(|| {
            let mut seen = Vec::new();
            while renewing.load(Ordering::Relaxed) {
                let r = renew(0);
                seen.push((r.status, instance(&r)));
                std::thread::sleep(Duration::from_millis(1000));
            }
            seen
        });
        // `cluster.sh --restart` refuses while the killed process is still there.
        let pid = cluster.pid(&victim).to_string();
        eventually("the killed instance gone", || {
            !Command::new("kill").args(["-0", &pid]).stderr(std::process::Stdio::null()).status().unwrap().success()
        });
        cluster.restart(&victim);
        cluster.wait_status(&victim, "UP");
        // Two more renewals with the failed instance back in rotation.
        std::thread::sleep(Duration::from_millis(2500));
        renewing.store(false, Ordering::Relaxed);
        renewer.join().unwrap()
    });
    assert!(renewals.len() >= 3, "{renewals:?}");
    for (status, at) in &renewals {
        assert_eq!((*status, at), (200, &home), "a renewal went elsewhere ({victim} came back): {renewals:?}");
    }
    let acquired = cluster.request(&post(&format!("/pools/{}/lock/acquire", pools[0]), KEY, "", ""));
    assert_eq!(instance(&acquired), home, "{acquired:?}");
}

/// A pool whose stick entry expires may move: the expiry must outlast the
/// longest a slot or a waiter of any pool lives without a request of the
/// pool, a proxied exchange (no renewals, up to `requestTimeoutMs`) included.
#[test]
fn the_stick_expiry_outlasts_every_slot_that_lives_without_requests() {
    let dir = scratch_dir();
    let config = dir.join("pools.json");
    let print = |pools: &str, extra: &[&str]| {
        std::fs::write(&config, format!(r#"{{"pools":{pools}}}"#)).unwrap();
        let out = Command::new("bash")
            .arg(SCRIPT)
            .args(["--print-haproxy", "--config", config.to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
    };
    let proxied = format!(
        r#"{{"short":{{"keys":["{KEY}"]}},"llm":{{"keys":["{KEY}"],"requestTimeoutMs":300000,
            "upstream":{{"url":"http://127.0.0.1:9","hosts":["llm.test"]}}}}}}"#
    );
    // upstream.waitMs (30 s, the default) + requestTimeoutMs, and a second more.
    let (ok, cfg, _) = print(&proxied, &[]);
    assert!(ok && cfg.contains(" expire 331000ms "), "{cfg}");
    let (ok, _, err) = print(&proxied, &["--stick-ms", "120000"]);
    assert!(!ok && err.contains("pool llm") && err.contains("330000 ms"), "{err}");
    // A long queue: termMs + queue.timeoutMs.
    let queued = format!(r#"{{"q":{{"keys":["{KEY}"],"termMs":5000,"queue":{{"timeoutMs":200000}}}}}}"#);
    let (ok, cfg, _) = print(&queued, &[]);
    assert!(ok && cfg.contains(" expire 206000ms "), "{cfg}");
    // HAProxy waits for an answer longer than any wait, or it would cut one
    // with a 504 of its own: 660 s at least, else the longest wait and a minute.
    assert!(cfg.contains("timeout server 660000ms"), "{cfg}");
    let long = format!(
        r#"{{"q":{{"keys":["{KEY}"],"queue":{{"timeoutMs":1000000}}}},
            "u":{{"keys":["{KEY}"],"upstream":{{"url":"http://127.0.0.1:9","waitMs":5000,"timeoutMs":1200000}}}}}}"#
    );
    let (ok, cfg, _) = print(&long, &[]);
    assert!(ok && cfg.contains("timeout server 1290000ms"), "{cfg}");
    // A proxied call's wait is at most queue.timeoutMs, however short
    // upstream.waitMs is: its X-Nthpool-Queue-Timeout-Ms may ask for all of it.
    let asks_longer = format!(
        r#"{{"u":{{"keys":["{KEY}"],"queue":{{"timeoutMs":300000}},
            "upstream":{{"url":"http://127.0.0.1:9","waitMs":1000,"timeoutMs":600000}}}}}}"#
    );
    let (ok, cfg, _) = print(&asks_longer, &[]);
    assert!(ok && cfg.contains("timeout server 960000ms"), "{cfg}");
    let (ok, cfg, _) = print(&queued, &["--stick-ms", "205001"]);
    assert!(ok && cfg.contains(" expire 205001ms "), "{cfg}");
    // Short pools keep the default.
    let (ok, cfg, _) = print(&format!(r#"{{"p":{{"keys":["{KEY}"]}}}}"#), &[]);
    assert!(ok && cfg.contains(" expire 120000ms "), "{cfg}");
}

/// Without `--config` the script runs its demo pools (termMs 10 s, the
/// default queue.timeoutMs of 30 s): a stick expiry shorter than what they
/// need is refused as for a configuration's pools, before anything starts.
#[test]
fn the_demo_cluster_refuses_a_stick_expiry_shorter_than_its_pools_need() {
    let dir = scratch_dir();
    let cluster = dir.join("cluster");
    let port = free_base_port(3).to_string();
    let run = |stick_ms: &str| {
        let out = Command::new("bash")
            .arg(SCRIPT)
            .args(["--port", &port, "--bin", env!("CARGO_BIN_EXE_nthpool"), "--stick-ms", stick_ms, "--dir"])
            .arg(&cluster)
            .output()
            .unwrap();
        // Whatever it did, nothing it started outlives the test.
        Command::new("bash").arg(SCRIPT).arg("--stop").arg("--dir").arg(&cluster).output().unwrap();
        out
    };
    let out = run("39999");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("pool dept-a") && err.contains("40000 ms"), "{err}");
    assert!(!cluster.join("n1").exists(), "no instance started");
}

/// A port or health-check interval the script cannot use is refused with a
/// sentence naming the option, not a shell error or a configuration
/// HAProxy refuses later.
#[test]
fn the_cluster_script_refuses_a_port_or_interval_it_cannot_use() {
    for (args, says) in [
        (["--port", "abc"], "--port takes a port number"),
        (["--port", "65530"], "--port 65530: the cluster takes ports up to PORT+29, past 65535"),
        (["--check-ms", "0"], "--check-ms takes milliseconds"),
        (["--check-ms", "1s"], "--check-ms takes milliseconds"),
        // HAProxy's timers end at 2^31 - 1 ms: past it, it refuses the configuration.
        (["--check-ms", "2147483648"], "--check-ms 2147483648: HAProxy's timers take at most 2147483647 ms"),
        (["--stick-ms", "2147483648"], "--stick-ms 2147483648: HAProxy's timers take at most 2147483647 ms"),
        (["--stick-ms", "99999999999999999999"], "--stick-ms 99999999999999999999: HAProxy's timers"),
    ] {
        let out = Command::new("bash").arg(SCRIPT).args(args).arg("--print-haproxy").output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.starts_with(&format!("cluster.sh: {says}")), "{args:?}: {err}");
    }
}

/// An option given without its value (last on the line, or followed by the
/// next option), or naming a file that is not there, is refused with a
/// sentence naming the option, not a shell error about `$2` or `realpath`'s.
#[test]
fn the_cluster_script_says_which_option_lacks_its_value() {
    for (args, says) in [
        (&["--print-haproxy", "--instances"][..], "--instances needs a value"),
        (&["--print-haproxy", "--stick-ms"], "--stick-ms needs a value"),
        (&["--dir", "--print-haproxy"], "--dir needs a value"),
        (&["--config", "", "--print-haproxy"], "--config needs a value"),
        (&["--config", "/nonexistent/pools.json", "--print-haproxy"], "--config /nonexistent/pools.json: no such file"),
        (&["--bin", "/nonexistent/nthpool", "--print-haproxy"], "--bin /nonexistent/nthpool: no such file"),
    ] {
        let out = Command::new("bash").arg(SCRIPT).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let one_sentence = err.lines().count() == 1 && err.starts_with(&format!("cluster.sh: {says}"));
        assert!(!out.status.success() && one_sentence, "{args:?}: {err}");
    }
}

#[test]
fn the_committed_haproxy_configuration_is_the_scripts_default() {
    let out = Command::new("bash").arg(SCRIPT).arg("--print-haproxy").output().unwrap();
    assert!(out.status.success());
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/haproxy.cfg")).unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        committed,
        "run scripts/cluster.sh --print-haproxy > deploy/haproxy.cfg"
    );
}

/// The committed configuration is valid as shipped, checked from a directory
/// of no cluster: the map of proxy hosts it reads is the one beside it
/// (`deploy/hosts.map`), not a file some earlier run of the script left.
#[test]
fn the_committed_haproxy_configuration_passes_haproxys_check_as_shipped() {
    if !haproxy_available() {
        return;
    }
    let dir = scratch_dir();
    let out = Command::new("haproxy")
        .arg("-c")
        .arg("-f")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/haproxy.cfg"))
        .current_dir(&*dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "haproxy -c: {}", String::from_utf8_lossy(&out.stderr));
}

/// Whether nginx is here to check or run `deploy/nginx.conf` (`what` was
/// done with it); under CI (`.ci/run` installs it) it must be.
fn nginx_available(what: &str) -> bool {
    if Command::new("nginx").arg("-v").output().is_ok() {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "CI is set but nginx is not installed");
    eprintln!("SKIPPED: nginx is not installed; deploy/nginx.conf was not {what}");
    false
}

#[test]
fn the_nginx_alternative_is_a_valid_nginx_configuration() {
    if !nginx_available("checked") {
        return;
    }
    let dir = scratch_dir();
    let out = Command::new("nginx")
        .arg("-t")
        .arg("-q")
        .arg("-p")
        .arg(dir.as_os_str())
        .arg("-e")
        .arg(dir.join("error.log"))
        .arg("-c")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/nginx.conf"))
        .output()
        .unwrap();
    assert!(out.status.success(), "nginx -t: {}", String::from_utf8_lossy(&out.stderr));
}

/// nginx running `deploy/nginx.conf` as shipped, in front of `instances`
/// (its three `server` lines pointed at them in turn), with `map` as its
/// host map's only line; stopped when dropped. `None` without nginx.
struct Nginx {
    child: std::process::Child,
    port: u16,
    /// Removed after `Drop` has stopped nginx (fields drop after it).
    _dir: Scratch,
}

impl Nginx {
    fn start(instances: &[SocketAddr], map: &str) -> Option<Nginx> {
        if !nginx_available("run") {
            return None;
        }
        let dir = scratch_dir();
        let port = std::env::var("NTHPOOL_NGINX_TEST_PORT")
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(common::free_port);
        let mut text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/nginx.conf")).unwrap();
        text = text.replace("127.0.0.1:7070", &format!("127.0.0.1:{port}"));
        for (i, default) in ["127.0.0.1:7081", "127.0.0.1:7082", "127.0.0.1:7083"].iter().enumerate() {
            text = text.replace(default, &instances[i % instances.len()].to_string());
        }
        text = text.replace("# prod-acme.nthpool.local prod-acme;", map);
        // Temporary files in the scratch directory, not the package's.
        let temp: String = ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"]
            .iter()
            .map(|t| format!("    {t}_temp_path {};\n", dir.join(t).display()))
            .collect();
        text = text.replacen("http {\n", &format!("http {{\n{temp}"), 1);
        let conf = dir.join("nginx.conf");
        std::fs::write(&conf, text).unwrap();
        let child = Command::new("nginx")
            .arg("-p")
            .arg(&*dir)
            .arg("-e")
            .arg(dir.join("error.log"))
            .arg("-c")
            .arg(&conf)
            .arg("-g")
            .arg(format!("daemon off; pid {};", dir.join("nginx.pid").display()))
            .spawn()
            .unwrap();
        let nginx = Nginx { child, port, _dir: dir };
        eventually("nginx listens", || TcpStream::connect(("127.0.0.1", port)).is_ok());
        Some(nginx)
    }

    fn request(&self, raw: &[u8]) -> Response {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(raw).unwrap();
        read_response(&mut s).expect("an answer through nginx")
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGQUIT, nginx's graceful stop: its workers go with the master.
        let _ = Command::new("kill").arg("-QUIT").arg(self.child.id().to_string()).status();
        if common::exit_within(&mut self.child, Duration::from_secs(5)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// nginx in front passes every request an instance serves: a proxied body
/// of several MiB (`upstream.maxRequestBytes` is 32 MiB by default) and a
/// header line of 12 KiB (an instance reads 16 KiB of head) reach the
/// instance rather than being refused by nginx's own limits, in HTML.
#[test]
fn the_nginx_alternative_passes_what_an_instance_serves() {
    let up = MockUpstream::start(|_| ok("done", ""));
    let pool = format!(r#""upstream":{{"url":"{}","hosts":["px.example"]}}"#, up.url());
    let server = common::TestServer::start(&common::config(&pool, ""));
    let Some(nginx) = Nginx::start(&[server.addr], "px.example p;") else { return };
    let body = vec![b'a'; 3 << 20];
    let mut raw = format!(
        "POST /v1/files HTTP/1.1\r\nHost: px.example\r\nX-Nthpool-Key: {}\r\nContent-Length: {}\r\n\r\n",
        common::KEY,
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(&body);
    let r = nginx.request(&raw);
    assert_eq!((r.status, &r.body[..]), (200, &b"done"[..]), "{r:?}");
    assert_eq!(up.seen().last().map(|s| s.body.len()), Some(body.len()));

    let pad = "a".repeat(12 << 10);
    let r = nginx.request(&post("/pools/p/lock/acquire", common::KEY, &format!("X-Pad: {pad}\r\n"), ""));
    assert_eq!(r.status, 200, "{r:?}");
}

/// nginx's own answers read as nthpool's: JSON with an error code and a
/// sentence, and `Retry-After` where a retry helps (an instance that
/// cannot be reached), not nginx's HTML pages.
#[test]
fn the_nginx_alternatives_own_answers_read_as_nthpools() {
    let Some(nginx) = Nginx::start(&[common::refused_addr()], "") else { return };
    let r = nginx.request(&post("/pools/p/lock/acquire", common::KEY, "", ""));
    assert_eq!((r.status, r.error_code(), r.header("retry-after")), (502, "bad_gateway".into(), Some("1")), "{r:?}");
    assert!(r.json()["message"].as_str().is_some_and(|m| m.ends_with('.')), "{r:?}");
    let r = nginx.request(b"POST /pools/p/lock/acquire HTTP/1.1\r\nHost: x\r\nBad Header: k\r\n\r\n");
    assert_eq!((r.status, r.error_code()), (400, "bad_request".into()), "{r:?}");
    let line = format!("POST /pools/p/lock/acquire HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n", "a".repeat(17 << 10));
    let r = nginx.request(line.as_bytes());
    assert_eq!((r.status, r.error_code()), (400, "bad_request".into()), "{r:?}");
}

/// A pool's own proxy listener cannot be run behind HAProxy: every instance
/// would bind it (all but the first failing), and traffic there would
/// bypass the placement. The script refuses such a configuration, naming
/// the pool, before it starts anything.
#[test]
fn a_pool_with_its_own_proxy_listener_is_refused_by_the_cluster_script() {
    let pools =
        format!(r#"{{"pp":{{"keys":["{KEY}"],"upstream":{{"url":"http://127.0.0.1:9","listen":"127.0.0.1:0"}}}}}}"#);
    let Some((_cluster, out)) = Cluster::launch(3, &pools, 1000, 120_000) else { return };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("sets upstream.listen for pp"), "{stderr}");
}

/// Each instance runs in a directory of its own, yet the files a
/// configuration names by a relative path (`jwksFile`, `caFile`,
/// `${file:PATH}`) are the ones beside the directory the script was
/// started in, as for `nthpool --config FILE` started there; `accessLog`
/// and `stateFile` stay relative, one per instance. Checked with a stand-in
/// for the binary that keeps the configuration it was given and where it ran.
#[test]
fn the_cluster_script_gives_each_instance_the_files_its_configuration_names() {
    if !haproxy_available() {
        return;
    }
    let base = scratch_dir();
    let config = r#"{"accessLog":"access.log","pools":{"cf":{"keys":["k"],"access":{"cloudflareAccess":
        {"jwksFile":"keys/certs.json","audience":"a","issuer":"https://team.cloudflareaccess.com"}},
        "upstream":{"url":"https://api.example","hosts":["cf.example"],"caFile":"ca.pem",
        "setHeaders":{"Authorization":"Bearer ${file:token.txt} ${file:/run/abs} ${env:HOME}"}}}}}"#;
    std::fs::write(base.join("pools.json"), config).unwrap();
    let stand_in = base.join("nthpool");
    std::fs::write(&stand_in, "#!/bin/sh\npwd > ran-in\ncp config.json given.json\nexit 1\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&stand_in, std::fs::Permissions::from_mode(0o755)).unwrap();
    let port = free_base_port(1);
    let dir = base.join("cluster");
    let out = Command::new("bash")
        .arg(SCRIPT)
        .args(["--instances", "1", "--config", "pools.json", "--port", &port.to_string(), "--bin", "nthpool", "--dir"])
        .arg(&dir)
        .current_dir(&*base)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("instance n1 did not start"), "{stderr}");
    let ran_in = PathBuf::from(std::fs::read_to_string(dir.join("n1/ran-in")).unwrap().trim());
    let given: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("n1/given.json")).unwrap()).unwrap();
    let read = |path: &serde_json::Value| ran_in.join(path.as_str().unwrap());
    let pool = &given["pools"]["cf"];
    assert_eq!(read(&pool["access"]["cloudflareAccess"]["jwksFile"]), base.join("keys/certs.json"), "{given}");
    assert_eq!(read(&pool["upstream"]["caFile"]), base.join("ca.pem"), "{given}");
    let token = format!("${{file:{}}}", base.join("token.txt").display());
    assert_eq!(
        pool["upstream"]["setHeaders"]["Authorization"],
        format!("Bearer {token} ${{file:/run/abs}} ${{env:HOME}}"),
        "{given}"
    );
    assert_eq!(read(&given["accessLog"]), dir.join("n1/access.log"), "one access log per instance");
}

#[test]
fn a_cluster_stopped_and_started_again_starts_every_pool_in_its_window() {
    // The stop ends HAProxy, and its table of where failed-over pools live:
    // a pool may come back to an instance with no record of its holders. So
    // the instances start from no stop snapshot of their own, in their
    // re-adoption window, not granting at once beside slots still held.
    let pools = names("again", 2);
    // A window (one term) long enough for the script's start to end in it.
    let settings = r#""concurrency":2,"termMs":6000,"renewIntervalMs":2000,"requestTimeoutMs":60000"#;
    let json: Vec<String> = pools.iter().map(|n| format!(r#""{n}":{{"keys":["{KEY}"],{settings}}}"#)).collect();
    let Some(cluster) = Cluster::start(2, &format!("{{{}}}", json.join(",")), 300, 120_000) else { return };
    let acquire = post(&format!("/pools/{}/lock/acquire", pools[0]), KEY, "", r#"{"waitMs":10000}"#);
    assert_eq!(cluster.request(&acquire).status, 200, "a slot, once the fresh cluster's window ended");
    let out = cluster.script(&["--stop"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = cluster.start_again(2);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let fail_fast = post(&format!("/pools/{}/lock/acquire", pools[0]), KEY, "", "");
    let r = cluster.request(&fail_fast);
    assert_eq!((r.status, r.header("x-nthpool-deny-reason")), (429, Some("recovering")), "{r:?}");
}
