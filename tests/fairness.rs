//! Fairness between connections, on the wire: a client pipelining a long
//! run of requests is served a bounded number of them per reactor turn, so
//! another client's single acquire is not stuck behind the whole run.
//!
//! Both clients' bytes are made to arrive in the same turn by stopping the
//! server (SIGSTOP) while they are written and letting it go (SIGCONT)
//! afterwards. Every acquire holds its slot, so the `x-nthpool-remaining-slots`
//! of the single acquire's answer counts how many of the pipelined acquires
//! were granted before it: an order read from the answers, not a time.
//!
//! A turn also has a time: the connections it comes to past it wait for the
//! next turn, which serves them first. Hundreds of clients pipelining into
//! one turn are served round by round, a budget each, whether or not a turn
//! was cut short on the way, and none is lost (their readiness, reported
//! once, is kept while they wait).

mod common;

use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::*;

const PIPELINED: usize = 2000;
const CONCURRENCY: u64 = 100_000;
/// How many of the pipelined requests may be answered before the single
/// acquire: the server's per-connection budget is 16 requests a turn, and
/// the pipelining client may have been served once before the other.
const AT_MOST_BEFORE: u64 = 32;

fn acquire_request() -> Vec<u8> {
    post("/pools/p/lock/acquire", KEY, "", "")
}

#[test]
fn a_pipelining_client_does_not_hold_up_another_clients_acquire() {
    let s = TestServer::start(&config(&format!(r#""concurrency":{CONCURRENCY},"adaptive":false"#), ""));
    let mut busy = s.connect();
    let mut single = s.connect();
    busy.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // Both connections are accepted and idle before the server stops.
    for c in [&mut busy, &mut single] {
        c.write_all(&post("/pools/p/lock/nope/renew", KEY, "", "")).unwrap();
        assert_eq!(read_response(c).expect("an answer").status, 404);
    }

    s.signal("STOP");
    wait_stopped(s.pid());
    let pipeline: Vec<u8> = (0..PIPELINED).flat_map(|_| acquire_request()).collect();
    let mut writer = busy.try_clone().unwrap();
    let (done, written) = mpsc::channel();
    let write = thread::spawn(move || {
        writer.write_all(&pipeline).unwrap();
        let _ = done.send(());
    });
    // What the kernel buffers for a stopped reader is bounded; whatever part
    // of the run it took is in the server's socket when it wakes.
    let _ = written.recv_timeout(Duration::from_secs(3));
    single.write_all(&acquire_request()).unwrap();
    s.signal("CONT");

    let answer = read_response(&mut single).expect("the single acquire is answered");
    assert_eq!(answer.status, 200, "{answer:?}");
    let before = CONCURRENCY - 1 - answer.header_u64("x-nthpool-remaining-slots");
    println!("pipelined acquires granted before the single one: {before} of {PIPELINED}");

    let mut reader = BufReader::new(busy);
    for i in 0..PIPELINED {
        let r = read_response(&mut reader).unwrap_or_else(|| panic!("pipelined answer {i} is missing"));
        assert_eq!(r.status, 200, "pipelined answer {i}: {r:?}");
    }
    write.join().unwrap();
    assert!(
        before <= AT_MOST_BEFORE,
        "{before} pipelined acquires were answered before another client's single acquire (at most {AT_MOST_BEFORE})"
    );
}

/// Clients pipelining into one turn, and what each pipelines: three of the
/// server's per-turn budgets (16 requests), a few kilobytes that the
/// kernel takes while the server is stopped.
const CLIENTS: usize = 300;
const ROUNDS: usize = 3;
const BUDGET: usize = 16;

#[test]
fn clients_pipelining_into_one_turn_are_served_round_by_round_and_in_full() {
    let s = TestServer::start(&config(&format!(r#""concurrency":{CONCURRENCY},"adaptive":false"#), ""));
    let mut clients: Vec<TcpStream> = (0..CLIENTS).map(|_| s.connect()).collect();
    for c in &mut clients {
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        c.write_all(&post("/pools/p/lock/nope/renew", KEY, "", "")).unwrap();
        assert_eq!(read_response(c).expect("an answer").status, 404);
    }
    let pipeline: Vec<u8> = (0..ROUNDS * BUDGET).flat_map(|_| acquire_request()).collect();
    s.while_stopped(|| {
        for c in &mut clients {
            c.write_all(&pipeline).unwrap();
        }
    });

    // Each answer's place among all the grants, by client and by round.
    let mut rounds = vec![Vec::new(); ROUNDS];
    for (client, c) in clients.into_iter().enumerate() {
        let mut reader = BufReader::new(c);
        for i in 0..ROUNDS * BUDGET {
            let r = read_response(&mut reader).unwrap_or_else(|| panic!("client {client}: answer {i} is missing"));
            assert_eq!(r.status, 200, "client {client}, answer {i}: {r:?}");
            let place = CONCURRENCY - 1 - r.header_u64("x-nthpool-remaining-slots");
            rounds[i / BUDGET].push((place, client));
        }
    }
    for (round, pair) in rounds.windows(2).enumerate() {
        let (last, late) = pair[0].iter().max().unwrap();
        let (first, early) = pair[1].iter().min().unwrap();
        assert!(
            last < first,
            "client {early} had its round {} (grant {first}) before client {late} its round {round} (grant {last})",
            round + 1
        );
    }
}
