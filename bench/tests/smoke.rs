//! Smoke tests of the load tool against the real server: the cycle, `--fill`
//! and `--queue`, each bounded to a few hundred requests and seconds.
//!
//! The server runs in this process (the `nthpool` library's `serve`, on a
//! thread, bound to 127.0.0.1:0), so the test needs no other binary than
//! `nthpool-bench` itself. What the tool claims to have built is checked
//! against the server's own answer headers.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

const KEY: &str = "smoke-key";

fn start_server() -> SocketAddr {
    let config = format!(
        r#"{{"listen":"127.0.0.1:0","adminListen":null,"accessLog":null,"pools":{{
        "bench":{{"keys":["{KEY}"],"concurrency":1000000,"adaptive":false}},
        "full":{{"keys":["{KEY}"],"concurrency":1000000,"adaptive":false,"termMs":3600000,"renewIntervalMs":1000000,"requestTimeoutMs":3600000}},
        "waiters":{{"keys":["{KEY}"],"concurrency":1,"queue":{{"size":1000,"timeoutMs":3600000}}}}}}}}"#
    );
    let config = nthpool::config::Config::parse(config.as_bytes()).expect("valid configuration");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let listen = "127.0.0.1:0".parse().unwrap();
        // Runs until the test process exits.
        let result = nthpool::server::serve(&config, Some(listen), None, Default::default(), |addr, _, _| {
            tx.send(addr).unwrap()
        });
        panic!("server stopped: {result:?}");
    });
    rx.recv_timeout(Duration::from_secs(10)).expect("server listening")
}

fn bench(addr: SocketAddr, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_nthpool-bench"));
    c.args(["--addr", &addr.to_string(), "--key", KEY, "--json"]).args(args).stdin(Stdio::null());
    c
}

fn run_json(mut c: Command) -> Value {
    let out = c.output().expect("run nthpool-bench");
    assert!(out.status.success(), "{:?}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

/// A fail-fast acquire on `pool`: its status and its governor headers.
fn probe(addr: SocketAddr, pool: &str) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let req = format!(
        "POST /pools/{pool}/lock/acquire HTTP/1.1\r\nHost: x\r\nX-Nthpool-Key: {KEY}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let status = answer[9..12].parse().unwrap();
    (status, answer.to_ascii_lowercase())
}

fn header(answer: &str, name: &str) -> u64 {
    let line = answer.lines().find_map(|l| l.strip_prefix(&format!("{name}: "))).expect(name);
    line.trim().parse().unwrap()
}

#[test]
fn cycles_against_the_real_server() {
    let addr = start_server();
    let j = run_json(bench(addr, &["--pool", "bench", "-c", "4", "-n", "200", "-d", "5"]));
    assert!(j["requests"].as_u64().unwrap() >= 200, "{j}");
    assert_eq!(j["endpoints"]["acquire"]["statuses"].as_object().unwrap().keys().collect::<Vec<_>>(), ["200"]);
    assert_eq!(j["endpoints"]["release"]["statuses"].as_object().unwrap().keys().collect::<Vec<_>>(), ["200"]);
    assert_eq!(j["connectErrors"], 0);
    // Every slot was given back at the end.
    let (status, answer) = probe(addr, "bench");
    assert_eq!(status, 200);
    assert_eq!(header(&answer, "x-nthpool-remaining-slots"), 1_000_000 - 1);
}

#[test]
fn fill_leaves_every_slot_held() {
    let addr = start_server();
    let j = run_json(bench(addr, &["--pool", "full", "--fill", "500", "-c", "3", "-d", "10"]));
    assert_eq!((j["granted"].as_u64(), j["lost"].as_u64(), j["complete"].as_bool()), (Some(500), Some(0), Some(true)));
    let (status, answer) = probe(addr, "full");
    assert_eq!(status, 200);
    // The 500 filled slots plus the probe's own.
    assert_eq!(header(&answer, "x-nthpool-remaining-slots"), 1_000_000 - 501);
}

#[test]
fn queue_holds_its_waiters_until_the_end() {
    let addr = start_server();
    let mut c = bench(addr, &["--pool", "waiters", "--queue", "20", "-d", "1.5"]);
    let mut child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "queue: 20 waiting acquires sent");
    // The first acquire took the pool's one slot; the other 19 wait behind it.
    let (status, answer) = probe(addr, "waiters");
    assert_eq!(status, 429);
    assert_eq!(header(&answer, "x-nthpool-queue-depth"), 19);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((j["sent"].as_u64(), j["granted"].as_u64(), j["waiting"].as_u64()), (Some(20), Some(1), Some(19)));
    assert_eq!(j["complete"], true);
}
