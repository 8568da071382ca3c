//! Proxy metrics per pool, over real sockets: each pool's exchanges by
//! upstream status class, upstream time, bytes each way, failed upstream
//! connections and idle connections, beside the server-wide totals.

mod common;
#[path = "common/upstream.rs"]
mod upstream;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use upstream::*;

fn metrics(server: &TestServer) -> String {
    let mut c = TcpStream::connect(server.admin.unwrap()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    String::from_utf8(read_response(&mut c).unwrap().body).unwrap()
}

/// The value of the sample named exactly `series`.
fn sample(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no sample {series} in\n{text}"))
}

fn to_pool(server: &TestServer, host: &str) -> Response {
    let raw = format!("GET /v1/x HTTP/1.1\r\nHost: {host}\r\nX-Nthpool-Key: {KEY}\r\n\r\n");
    exchange(server, raw.as_bytes())
}

#[test]
fn each_pool_counts_its_own_proxied_exchanges_beside_the_totals() {
    let fine = MockUpstream::start(|_| ok("fine", ""));
    let failing = MockUpstream::start(|_| {
        Reply::Raw(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\noops".to_vec())
    });
    let closed = refused_addr();
    let pool = |url: String, host: &str| {
        format!(r#"{{"keys":["{KEY}"],"adaptive":false,"upstream":{{"url":"{url}","hosts":["{host}"]}}}}"#)
    };
    let server = TestServer::start(&format!(
        r#"{{"adminListen":"127.0.0.1:0","accessLog":null,"pools":{{"a":{},"b":{},"c":{},"lock":{{"keys":["{KEY}"]}}}}}}"#,
        pool(fine.url(), "a.proxy.test"),
        pool(failing.url(), "b.proxy.test"),
        pool(format!("http://{closed}"), "c.proxy.test"),
    ));
    for _ in 0..2 {
        assert_eq!(to_pool(&server, "a.proxy.test").status, 200);
    }
    assert_eq!(to_pool(&server, "b.proxy.test").status, 500);
    assert_eq!(to_pool(&server, "c.proxy.test").status, 502);

    let m = metrics(&server);
    let pool_class = |p: &str, class: &str| {
        sample(&m, &format!("nthpool_proxy_pool_requests_total{{pool=\"{p}\",class=\"{class}\"}}"))
    };
    assert_eq!((pool_class("a", "2xx"), pool_class("a", "5xx")), (2, 0));
    assert_eq!((pool_class("b", "2xx"), pool_class("b", "5xx")), (0, 1));
    assert_eq!((pool_class("c", "2xx"), pool_class("c", "5xx")), (0, 0));
    // A pool that names no upstream (and never did) has no proxy series.
    assert!(m.lines().filter(|l| l.starts_with("nthpool_proxy_pool_")).all(|l| !l.contains("pool=\"lock\"")));
    for class in ["none", "1xx", "2xx", "3xx", "4xx", "5xx"] {
        let total = sample(&m, &format!("nthpool_proxy_requests_total{{class=\"{class}\"}}"));
        let pools: u64 = ["a", "b", "c"].iter().map(|p| pool_class(p, class)).sum();
        assert_eq!(pools, total, "the pools add up to the total of class {class}");
    }

    let per = |name: &str, p: &str| sample(&m, &format!("{name}{{pool=\"{p}\"}}"));
    assert_eq!(per("nthpool_proxy_pool_upstream_time_ms_count", "a"), 2);
    assert_eq!(per("nthpool_proxy_pool_upstream_time_ms_count", "b"), 1);
    assert_eq!(per("nthpool_proxy_pool_upstream_connection_errors_total", "c"), 1);
    assert_eq!(per("nthpool_proxy_pool_upstream_connection_errors_total", "a"), 0);
    assert_eq!(sample(&m, "nthpool_proxy_upstream_connection_errors_total"), 1);
    let down = |p| per("nthpool_proxy_pool_bytes_down_total", p);
    assert!(down("a") > 0 && down("b") > 0, "a: {} b: {}", down("a"), down("b"));
    assert_eq!(down("c"), 0, "no upstream answer relayed");
    for name in ["nthpool_proxy_pool_bytes_up_total", "nthpool_proxy_pool_bytes_down_total"] {
        let total = sample(&m, &name.replace("_pool", ""));
        assert_eq!(["a", "b", "c"].iter().map(|p| per(name, p)).sum::<u64>(), total, "{name}");
    }
    // Keep-alive answers leave one idle connection to each answering upstream.
    assert_eq!(
        (per("nthpool_proxy_pool_idle_connections", "a"), per("nthpool_proxy_pool_idle_connections", "b")),
        (1, 1)
    );
    assert_eq!(per("nthpool_proxy_pool_idle_connections", "c"), 0);
    assert_eq!(sample(&m, "nthpool_proxy_idle_connections"), 2);
}

/// A proxied request refused (a wrong key, no free slot) counts among its
/// pool's rejections, not among the pool-less ones.
#[test]
fn proxied_refusals_count_under_their_pool() {
    let fine = MockUpstream::start(|_| ok("fine", ""));
    let server = TestServer::start(&format!(
        r#"{{"adminListen":"127.0.0.1:0","accessLog":null,"pools":{{"a":{{"keys":["{KEY}"],"adaptive":false,"concurrency":1,"upstream":{{"url":"{}","hosts":["a.proxy.test"]}}}}}}}}"#,
        fine.url(),
    ));
    let wrong = "GET /v1/x HTTP/1.1\r\nHost: a.proxy.test\r\nX-Nthpool-Key: wrong\r\n\r\n";
    assert_eq!(exchange(&server, wrong.as_bytes()).status, 401);
    let held = server.request(&post("/pools/a/lock/acquire", KEY, "", ""));
    assert_eq!(held.status, 200);
    let no_queue =
        format!("GET /v1/x HTTP/1.1\r\nHost: a.proxy.test\r\nX-Nthpool-Key: {KEY}\r\nX-Nthpool-No-Queue: 1\r\n\r\n");
    assert_eq!(exchange(&server, no_queue.as_bytes()).status, 429);
    // Queued, then out of time: a 504 with no upstream answer either.
    let short = format!(
        "GET /v1/x HTTP/1.1\r\nHost: a.proxy.test\r\nX-Nthpool-Key: {KEY}\r\nX-Nthpool-Queue-Timeout-Ms: 50\r\n\r\n"
    );
    assert_eq!(exchange(&server, short.as_bytes()).status, 504);
    let m = metrics(&server);
    for (code, n) in [(401, 1), (429, 1), (504, 1), (404, 0)] {
        assert_eq!(sample(&m, &format!("nthpool_rejections_total{{pool=\"a\",code=\"{code}\"}}")), n, "{code}");
        assert_eq!(sample(&m, &format!("nthpool_rejections_total{{code=\"{code}\"}}")), 0, "{code}");
    }
    // Each is a proxied request that ended with no upstream answer.
    assert_eq!(sample(&m, "nthpool_proxy_pool_requests_total{pool=\"a\",class=\"none\"}"), 3, "{m}");
    assert_eq!(sample(&m, "nthpool_proxy_requests_total{class=\"none\"}"), 3, "{m}");
    assert_eq!(sample(&m, "nthpool_proxy_pool_requests_total{pool=\"a\",class=\"2xx\"}"), 0, "{m}");
    // Every acquire attempt is timed, the lock route's and the proxied ones,
    // the key's refusal included, as the access log has a line for each.
    assert_eq!(sample(&m, "nthpool_acquire_server_time_us_count{pool=\"a\"}"), 4, "{m}");
}

/// A pool removed by a reload leaves the list once drained; the pools after
/// it keep their own proxy counters, and a lock-only pool still has none.
#[test]
fn a_removed_pool_leaves_every_other_pools_proxy_series_its_own() {
    let fine = MockUpstream::start(|_| ok("fine", ""));
    let pool = |host: &str| {
        format!(r#"{{"keys":["{KEY}"],"adaptive":false,"upstream":{{"url":"{}","hosts":["{host}"]}}}}"#, fine.url())
    };
    let json = |with_a: bool| {
        let a = if with_a { format!(r#""a":{},"#, pool("a.proxy.test")) } else { String::new() };
        format!(
            r#"{{"adminListen":"127.0.0.1:0","accessLog":null,"pools":{{{a}"b":{{"keys":["{KEY}"]}},"c":{}}}}}"#,
            pool("c.proxy.test")
        )
    };
    let server = TestServer::start(&json(true));
    for _ in 0..3 {
        assert_eq!(to_pool(&server, "a.proxy.test").status, 200);
    }
    assert_eq!(to_pool(&server, "c.proxy.test").status, 200);
    server.reload(&json(false));
    let m = metrics(&server);
    let twos = |p: &str| sample(&m, &format!("nthpool_proxy_pool_requests_total{{pool=\"{p}\",class=\"2xx\"}}"));
    assert_eq!(twos("c"), 1, "{m}");
    assert!(m.lines().filter(|l| l.starts_with("nthpool_proxy_pool_")).all(|l| !l.contains("pool=\"b\"")), "{m}");
    assert!(!m.contains("pool=\"a\""), "the drained pool is gone: {m}");
}

/// An upstream whose accept queue is full drops the connect's SYNs: the
/// connection never opens, and the request's `timeoutMs` answers `504`. That
/// connection failed to open as surely as a refused one, and is counted so.
#[test]
fn a_connect_that_never_opens_counts_as_a_connection_error() {
    use socket2::{Domain, Socket, Type};
    let hole = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    hole.bind(&"127.0.0.1:0".parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
    hole.listen(0).unwrap();
    let addr = hole.local_addr().unwrap().as_socket().unwrap();
    // Connections nobody accepts fill the queue; later SYNs are dropped.
    let mut fillers = Vec::new();
    for _ in 0..4 {
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        s.set_nonblocking(true).unwrap();
        let _ = s.connect(&addr.into());
        fillers.push(s);
    }
    std::thread::sleep(Duration::from_millis(100));
    let server = TestServer::start(&format!(
        r#"{{"adminListen":"127.0.0.1:0","accessLog":null,"pools":{{"h":{{"keys":["{KEY}"],"adaptive":false,
            "upstream":{{"url":"http://{addr}","hosts":["h.proxy.test"],"timeoutMs":300}}}}}}}}"#
    ));
    let r = to_pool(&server, "h.proxy.test");
    assert_eq!((r.status, r.error_code()), (504, "upstream_timeout".to_string()), "{r:?}");
    let m = metrics(&server);
    assert_eq!(sample(&m, "nthpool_proxy_pool_upstream_connection_errors_total{pool=\"h\"}"), 1, "{m}");
    assert_eq!(sample(&m, "nthpool_proxy_upstream_connection_errors_total"), 1);
}
