//! The fleet simulator against the real server (in this process, on a
//! thread, bound to 127.0.0.1:0): tiny scenarios of a few seconds whose
//! accounting must agree with itself. No timing assertions.

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

const KEY: &str = "fleet-test-key";

fn start_server() -> SocketAddr {
    // Right for an upstream of 4 in flight and 600/min: the same concurrency,
    // and a bucket (9/s, burst 1) that never outruns a 10-per-second window.
    let config = format!(
        r#"{{"listen":"127.0.0.1:0","adminListen":null,"accessLog":null,"pools":{{
        "right":{{"keys":["{KEY}"],"concurrency":4,"rpm":540,"rpmBurst":1,"adaptive":false}}}}}}"#
    );
    let config = nthpool::config::Config::parse(config.as_bytes()).expect("valid configuration");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let listen = "127.0.0.1:0".parse().unwrap();
        let result = nthpool::server::serve(&config, Some(listen), None, Default::default(), |addr, _, _| {
            tx.send(addr).unwrap()
        });
        panic!("server stopped: {result:?}");
    });
    rx.recv_timeout(Duration::from_secs(10)).expect("server listening")
}

fn fleet(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_nthpool-fleet"))
        .args(["--json", "-w", "8", "-d", "4", "--upstream-concurrency", "4", "--window", "1", "--service", "fixed:50"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run nthpool-fleet");
    assert!(out.status.success(), "{:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// What the workers saw is what the upstream counted, and the timeline adds up.
fn check_accounting(j: &Value) {
    let a = &j["accounting"];
    assert_eq!(a["upstreamCalls"], a["workerCalls"], "{a}");
    assert_eq!(a["upstream429"], a["worker429"], "{a}");
    let t = j["timeline"].as_array().unwrap();
    let sum = |f: &str| t.iter().map(|b| u(&b[f])).sum::<u64>();
    assert_eq!(sum("calls"), u(&j["upstreamCalls"]));
    assert_eq!(sum("refusedConcurrency") + sum("refusedRate"), u(&j["upstream429"]));
    assert_eq!(sum("ok"), u(&j["okCalls"]));
    // A job is one successful call; the ones finished in the run are both.
    assert_eq!(sum("jobs"), u(&j["jobs"]));
    assert!(u(&j["jobs"]) <= u(&j["okCalls"]), "{j}");
    assert!(u(&j["okCalls"]) > 0, "{j}");
}

#[test]
fn a_right_static_pool_keeps_the_books_and_few_429s() {
    let addr = start_server().to_string();
    let j = fleet(&["--server", &addr, "--key", KEY, "--pool", "right", "--upstream-rpm", "600"]);
    check_accounting(&j);
    // The upstream serves at most 10 calls per 1-s window: 4 windows.
    assert!(u(&j["okCalls"]) <= 40, "{j}");
    // The pool never holds more than the upstream allows, nor outruns its budget
    // but for a grant that crosses a window edge on its way.
    assert_eq!(j["timeline"].as_array().unwrap().iter().map(|b| u(&b["refusedConcurrency"])).sum::<u64>(), 0);
    assert!(u(&j["upstream429"]) * 10 <= u(&j["upstreamCalls"]), "{j}");
    let limits: Vec<u64> =
        j["timeline"].as_array().unwrap().iter().filter_map(|b| b["effectiveLimit"].as_u64()).collect();
    assert!(!limits.is_empty() && limits.iter().all(|&l| l == 4), "{limits:?}");
}

#[test]
fn direct_callers_over_several_processes_keep_the_books() {
    let j = fleet(&["--mode", "direct", "--processes", "2", "--upstream-rpm", "300", "--window-kind", "sliding"]);
    check_accounting(&j);
    // 5 per sliding second: at most 5 per second started plus one window's worth.
    assert!(u(&j["okCalls"]) <= 5 * 4 + 5, "{j}");
    assert!(u(&j["upstream429"]) > 0, "8 direct callers overrun 4 in flight and 5/s: {j}");
}
