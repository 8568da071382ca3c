//! Crashes and failover lose no slot (SPEC §11), over real sockets: a server
//! killed with `kill -9` and started again, or a standby sharing its slot
//! secret, re-adopts the slots their holders still renew, refuses new grants
//! for one term, and never takes a tampered, forged or foreign id.

mod common;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{config, post, read_response, Response, TestServer, KEY};

const POOL: &str = r#""concurrency":3,"termMs":1500,"renewIntervalMs":500,"requestTimeoutMs":60000"#;

fn get(addr: SocketAddr, path: &str) -> Response {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").as_bytes()).unwrap();
    read_response(&mut c).expect("an answer")
}

fn metric(s: &TestServer, line_start: &str) -> u64 {
    let text = String::from_utf8(get(s.admin.unwrap(), "/metrics").body).unwrap();
    let line = text.lines().find(|l| l.starts_with(line_start)).unwrap_or_else(|| panic!("no {line_start}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// Kills `s` with SIGKILL and keeps its directory (config and slot secret).
fn kill_9(mut s: TestServer) -> (PathBuf, PathBuf) {
    s.signal("KILL");
    s.child.wait().unwrap();
    let kept = (std::mem::take(&mut s.dir), s.config_path.clone());
    // `Drop` removes `dir`; it is empty now, so nothing is removed.
    kept
}

fn restart(kept: &(PathBuf, PathBuf)) -> TestServer {
    TestServer::start_with(kept.0.clone(), kept.1.clone(), &[])
}

#[test]
fn kill_9_readopts_renewing_holders_and_never_over_admits() {
    let first = TestServer::start(&config(POOL, ""));
    assert_eq!(get(first.admin.unwrap(), "/healthz").json()["status"], "ok", "a first start opens no window");
    let slots: Vec<String> = (0..3).map(|_| first.acquire("", "").slot()).collect();
    let kept = kill_9(first);
    let s = restart(&kept);
    let started = Instant::now();

    // In the window: fail-fast acquires wait for the old holders.
    let denied = s.acquire("", "");
    assert_eq!(denied.status, 429, "{denied:?}");
    assert_eq!(denied.header("x-nthpool-deny-reason"), Some("recovering"));
    assert!((1..=2).contains(&denied.header_u64("Retry-After")), "{denied:?}");
    assert_eq!(get(s.admin.unwrap(), "/healthz").json()["status"], "recovering");
    assert_eq!(metric(&s, "nthpool_recovering{pool=\"p\"}"), 1);

    // Two holders come back: one renews, one releases; the third vanished.
    assert_eq!(s.renew(&slots[0]).status, 200);
    assert_eq!(s.release(&slots[1], "").json()["released"], true);
    assert_eq!(s.release(&slots[1], "").json()["released"], false, "a released slot is not adopted again");
    assert_eq!(s.renew(&slots[1]).status, 404);
    assert_eq!(metric(&s, "nthpool_readopted_total{pool=\"p\"}"), 2);

    // A waiter queued in the window is granted when it ends.
    let mut waiter = s.connect();
    waiter.write_all(&post("/pools/p/lock/acquire", KEY, "", r#"{"waitMs":10000}"#)).unwrap();
    // The holder keeps renewing at its interval meanwhile.
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(s.renew(&slots[0]).status, 200);
    let granted = read_response(&mut waiter).expect("the waiter's answer");
    assert_eq!(granted.status, 200, "{granted:?}");
    assert!(started.elapsed() >= Duration::from_millis(1000), "granted only after the window");
    // Pool `other` (default 30 s term) is still in its window; `p` is not.
    assert_eq!(metric(&s, "nthpool_recovering{pool=\"p\"}"), 0);

    // Held now: the renewed old slot and the waiter's; the vanished one is not
    // counted but can no longer come back, so one grant is left, then none.
    assert_eq!(s.renew(&slots[0]).status, 200);
    assert_eq!(s.renew(&slots[2]).status, 404, "outside the window an unknown slot is gone");
    assert_eq!(s.acquire("", "").status, 200);
    let full = s.acquire("", "");
    assert_eq!((full.status, full.header("x-nthpool-deny-reason")), (429, Some("concurrency")));
    assert_eq!(s.release(&slots[0], "").json()["released"], true);
    assert_eq!(s.acquire("", "").status, 200);
}

#[test]
fn a_readopted_holder_that_stops_renewing_is_reclaimed_at_its_term() {
    let first = TestServer::start(&config(POOL, ""));
    let slot = first.acquire("", "").slot();
    let s = restart(&kill_9(first));
    assert_eq!(s.renew(&slot).status, 200);
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(&s, "nthpool_reclaims_total{pool=\"p\",cause=\"term\"}") == 0 {
        assert!(Instant::now() < deadline, "the re-adopted lease was never reclaimed");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(s.renew(&slot).status, 404);
    assert_eq!(metric(&s, "nthpool_slots_held{pool=\"p\"}"), 0);
}

#[test]
fn a_standby_sharing_the_secret_takes_over_on_another_port() {
    let primary = TestServer::start(&config(POOL, ""));
    let slot = primary.acquire("", "").slot();
    let standby_dir = common::scratch_dir();
    std::fs::copy(primary.dir.join("nthpool.secret"), standby_dir.join("nthpool.secret")).unwrap();
    let standby_config = standby_dir.join("config.json");
    std::fs::write(&standby_config, config(POOL, "")).unwrap();
    let standby = TestServer::start_with(standby_dir, standby_config, &[]);
    assert_ne!(standby.addr, primary.addr);
    drop(kill_9(primary));

    assert_eq!(standby.renew(&slot).status, 200, "the standby re-adopts the primary's slot");
    assert_eq!(standby.release(&slot, "").json()["released"], true);
    assert_eq!(metric(&standby, "nthpool_readopted_total{pool=\"p\"}"), 1);
}

#[test]
fn tampered_forged_and_other_pool_ids_are_refused_and_never_adopted() {
    let first = TestServer::start(&config(POOL, ""));
    let slot = first.acquire("", "").slot();
    let stranger = TestServer::start(&config(POOL, ""));
    let forged = stranger.acquire("", "").slot();
    let s = restart(&kill_9(first));

    let mut tampered = slot.clone().into_bytes();
    tampered[20] = if tampered[20] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    assert_eq!(s.renew(&tampered).status, 404, "tampered");
    assert_eq!(s.renew(&forged).status, 404, "signed under another secret");
    assert_eq!(s.renew(&"A".repeat(56)).status, 404, "made up");
    let other = s.request(&post(&format!("/pools/other/lock/{slot}/renew"), "other-key", "", ""));
    assert_eq!(other.status, 404, "another pool's route");
    assert_eq!(metric(&s, "nthpool_readopted_total{pool=\"p\"}"), 0);
    assert_eq!(metric(&s, "nthpool_slots_held{pool=\"p\"}"), 0);
    // The genuine id is still adoptable afterwards.
    assert_eq!(s.renew(&slot).status, 200);
    assert_eq!(metric(&s, "nthpool_slots_held{pool=\"p\"}"), 1);
}
