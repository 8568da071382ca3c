//! Runs the README's reference client, `examples/nthpool_client.py`, against
//! the real server: a renewed lease, a busy pool, a lease that ends under
//! the client, and a server that goes away. Skipped, saying so, when
//! `python3` is not installed.

mod common;

use std::process::Command;

use common::*;

fn python_missing() -> bool {
    let found = Command::new("python3").arg("--version").output().is_ok_and(|o| o.status.success());
    if !found {
        println!("skipped: python3 is not installed, so the Python reference client cannot run");
    }
    !found
}

/// Runs the client; its one line of JSON output.
fn client(s: &TestServer, wait_ms: u64, work_s: f64) -> serde_json::Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/nthpool_client.py");
    let base = format!("http://{}", s.addr);
    let out = Command::new("python3")
        .args([script, &base, "p", KEY, &wait_ms.to_string(), &work_s.to_string()])
        .output()
        .expect("run python3");
    assert!(out.status.success(), "client failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn metric(s: &TestServer, sample: &str) -> f64 {
    s.metric(sample).expect(sample)
}

#[test]
fn the_reference_client_renews_reports_and_backs_off() {
    if python_missing() {
        return;
    }
    let pool = r#""concurrency":1,"termMs":1200,"renewIntervalMs":200,"requestTimeoutMs":4000,"adaptive":false"#;
    let s = TestServer::start(&config(pool, ""));

    // Work lasting two terms: only renewing keeps the slot. Renewing every 200 ms leaves
    // five renewals of slack inside a term, for a loaded machine.
    let done = client(&s, 0, 2.4);
    assert_eq!(done["lost"], false, "{done}");
    assert!(metric(&s, r#"nthpool_renewals_total{pool="p",outcome="renewed"}"#) >= 3.0);
    assert_eq!(metric(&s, r#"nthpool_reclaims_total{pool="p",cause="term"}"#), 0.0);
    assert_eq!(metric(&s, r#"nthpool_releases_total{pool="p",outcome="released"}"#), 1.0);

    // A held pool: fail fast gets a 429 and the time to wait.
    let held = s.acquire("", "").slot();
    let busy = client(&s, 0, 0.0);
    assert_eq!((busy["busy"].as_u64(), busy["retryAfter"].as_u64()), (Some(429), Some(1)), "{busy}");
    s.release(&held, "");

    // Work past requestDeadline: renew answers 409 (or 404 once reclaimed) and the client is told it lost the slot.
    let lost = client(&s, 0, 5.0);
    assert_eq!(lost["lost"], true, "{lost}");
    let refused = metric(&s, r#"nthpool_renewals_total{pool="p",outcome="capped"}"#)
        + metric(&s, r#"nthpool_renewals_total{pool="p",outcome="not_found"}"#);
    assert!(refused >= 1.0, "renew was refused once the lease hit its request deadline");
}

/// nthpool unreachable while the client holds a slot (a crash, a network cut):
/// renewing cannot succeed, so once a term has passed since the last renewal
/// the lease is over on any server, and the client must say so (`lost`)
/// rather than let the work believe it still holds the slot. Its release
/// cannot connect either, and must not turn the finished work into a crash.
#[test]
fn the_reference_client_reports_the_slot_lost_when_nthpool_is_unreachable() {
    if python_missing() {
        return;
    }
    use std::io::BufRead;
    let pool = r#""termMs":1200,"renewIntervalMs":200,"requestTimeoutMs":60000,"adaptive":false"#;
    let mut s = TestServer::start(&config(pool, ""));
    // Acquire with the reference client, say so, then wait up to 8 s for `lost`.
    let harness = r#"
import json, sys, time
sys.path.insert(0, sys.argv[1])
from nthpool_client import Slot
slot = Slot(sys.argv[2], "p", sys.argv[3]).__enter__()
print("acquired", flush=True)
lost = slot.lost.wait(8)
slot.__exit__(None, None, None)
print(json.dumps({"lost": lost}), flush=True)
"#;
    let (mut child, mut out) = common::reference_client_holding(harness, &format!("http://{}", s.addr), KEY);
    // The server goes away with the slot held: every renewal now fails to connect.
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{err}");
    assert_eq!(line.trim(), r#"{"lost": true}"#, "the client never learned its slot was gone: {err}");
}
