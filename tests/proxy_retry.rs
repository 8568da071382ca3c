//! Proxy mode's one retry (SPEC §12), over real sockets: a request goes on a
//! fresh connection when the reused idle one is found dead before any byte
//! of the request was written to it, and is never sent twice once it was.

mod common;
#[path = "common/upstream.rs"]
mod upstream;

use std::time::Duration;

use upstream::{exchange, ok, proxied, proxy_server, MockUpstream, Reply};

/// The answer to the first request on connection 0: no `Connection: close`,
/// so the proxy keeps the connection for the next request.
fn kept_alive() -> Vec<u8> {
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst".to_vec()
}

fn metric(server: &common::TestServer, name: &str) -> u64 {
    server.metric(name).unwrap_or_else(|| panic!("no {name}")) as u64
}

fn paths(up: &MockUpstream) -> Vec<(usize, String)> {
    up.seen().iter().map(|s| (s.conn, s.request_line().split(' ').nth(1).unwrap().to_string())).collect()
}

#[test]
fn a_kept_alive_connection_the_upstream_closed_while_idle_is_replaced_by_a_fresh_one() {
    for reset in [false, true] {
        let up = MockUpstream::start(move |seen| match (seen.conn, reset) {
            // Answered as kept alive, then closed by the upstream's side.
            (0, false) => Reply::RawThenClose(kept_alive()),
            (0, true) => Reply::RawThenReset(kept_alive()),
            _ => ok("second", ""),
        });
        let server = proxy_server(&up, 2, "");
        let r = exchange(&server, &proxied("GET", "/one", "", ""));
        assert_eq!((r.status, r.body.as_slice()), (200, &b"first"[..]), "{r:?}");
        // The close reaches the proxy while the connection is idle.
        std::thread::sleep(Duration::from_millis(200));
        let r = exchange(&server, &proxied("GET", "/two", "", ""));
        assert_eq!((r.status, r.body.as_slice()), (200, &b"second"[..]), "reset {reset}: {r:?}");
        assert_eq!(up.connections(), 2, "reset {reset}: the second request went on a fresh connection");
        assert_eq!(paths(&up), [(0, "/one".to_string()), (1, "/two".to_string())], "reset {reset}: each seen once");
        // Found dead when taken from the idle pool, or when the first write
        // to it failed: either way it carried no request, and a reuse of it
        // was followed by a retry.
        let (reuses, retries) =
            (metric(&server, "nthpool_proxy_upstream_reuses_total"), metric(&server, "nthpool_proxy_retries_total"));
        assert_eq!(reuses, retries, "reset {reset}");
    }
}

#[test]
fn a_reused_connection_that_fails_after_the_request_was_written_is_not_retried() {
    let up = MockUpstream::start(|seen| match seen.request_line() {
        "GET /one HTTP/1.1" => Reply::Raw(kept_alive()),
        // Read whole, then reset without an answer.
        "POST /two HTTP/1.1" => Reply::RawThenReset(Vec::new()),
        _ => ok("third", ""),
    });
    let server = proxy_server(&up, 2, "");
    let r = exchange(&server, &proxied("GET", "/one", "", ""));
    assert_eq!((r.status, r.body.as_slice()), (200, &b"first"[..]), "{r:?}");
    let r = exchange(&server, &proxied("POST", "/two", "", "charge card 42"));
    assert_eq!(r.status, 502, "{r:?}");
    assert_eq!(r.json()["error"], "bad_gateway", "{r:?}");
    assert_eq!(up.connections(), 1, "the request was not sent again on a fresh connection");
    assert_eq!(metric(&server, "nthpool_proxy_upstream_reuses_total"), 1);
    assert_eq!(metric(&server, "nthpool_proxy_retries_total"), 0);
    assert_eq!(
        paths(&up),
        [(0, "/one".to_string()), (0, "/two".to_string())],
        "the reused connection carried it, once"
    );
    // The slot came back: the pool serves the next request on a fresh connection.
    let r = exchange(&server, &proxied("GET", "/three", "", ""));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(up.connections(), 2);
}
