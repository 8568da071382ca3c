//! The admin listener's routes: `GET /healthz`, `GET /metrics`, the
//! dashboard (`/`, its assets, `/api/pools` and `/api/pools/{pool}`, built
//! by `dashboard`) and `OPTIONS *`.
//!
//! Served by the same event loop as the lock API but on its own listener;
//! lock routes are not served here and these are not served there. The
//! metrics text is built only when scraped: `api` reads the governor into a
//! `metrics::MetricsSnapshot`, with the reactor's counters, and `metrics`
//! renders it.

use super::conn::{self, Conn, PendingBody};
use super::pipeline::{
    adapt_answer, after_answers, cannot_be_complete, close_refused, incomplete, is_head_request, take_body, Answer,
    Body,
};
use super::{carry, client_mut, Entry, Server};
use crate::api::{ApiError, App, ConnId, Handled};
use crate::dashboard;
use crate::http::request::{header_storage, parse_head, serve_as_http11, Head, HeadError, Method};
use crate::http::response::{error_body, Status, CONTINUE};
pub use crate::metrics::ServerStats;
use crate::time::Ms;

impl Server {
    /// Answers every complete request of an admin connection, in order: the
    /// lock API's pipeline without its queue, proxying and access log. What
    /// cannot be framed is refused with the admin answers' headers, and
    /// counts as no lock API answer.
    pub(super) fn process_admin(&mut self, id: ConnId) {
        let Server { conns, app, now, turn, stats, metrics_len, ready, proxy, dirty, timeouts, .. } = self;
        let (now, turn) = (*now, *turn);
        // The connections' buffers are summed, a walk of every connection,
        // and the proxy's counters copied (one `Traffic` per pool) only for
        // what asks for `/metrics`, not for every health check.
        if conns.get(id.index as usize).is_some_and(|entry| match entry {
            Entry::Client(c) => c.input.data().windows(8).any(|w| w == b"/metrics"),
        }) {
            proxy.stats_into(&mut stats.proxy);
            stats.log_lines_dropped = crate::stdio::log_lines_dropped();
            stats.connection_buffer_bytes = conns
                .iter()
                .map(|(_, entry)| match entry {
                    Entry::Client(c) => c.buffered() as u64,
                })
                .sum();
        }
        let Some(conn) = client_mut(conns, id) else {
            return;
        };
        let before = conn.unsent();
        while conn.is_open() && conn.unsent() <= conn::OUTPUT_HIGH_WATER && !conn.input.is_empty() {
            if conn.budget(turn).requests_spent() {
                carry(ready, conn, id);
                break;
            }
            let data = &conn.input.buf[conn.input.start..conn.input.end];
            if cannot_be_complete(conn, app.max_body) {
                incomplete(conn);
                break;
            }
            let input_full = conn.input_full();
            let mut storage = header_storage();
            let head = match parse_head(data, &mut storage) {
                Ok(Some(head)) => head,
                Ok(None) => {
                    incomplete(conn);
                    break;
                }
                Err(HeadError::NewerMinorVersion) => {
                    let (start, end) = (conn.input.start, conn.input.end);
                    if serve_as_http11(&mut conn.input.buf[start..end]) {
                        continue;
                    }
                    let head_request = is_head_request(&conn.input.buf[start..end]);
                    refuse(conn, ApiError::BadRequest("Only HTTP/1.x is served."), head_request);
                    break;
                }
                Err(e) => {
                    let head_request = is_head_request(data);
                    refuse(conn, e.into(), head_request);
                    break;
                }
            };
            let (_, consumed) = match take_body(&head, data, &mut conn.pending, &mut conn.body, app.max_body) {
                Body::Ready(body, consumed) => (body, consumed),
                // Only a chunked body outgrows the input buffer.
                Body::Incomplete if input_full => {
                    refuse(conn, ApiError::PayloadTooLarge(app.max_body as u64), head.method == Method::Head);
                    break;
                }
                // The client sent all it will: the body never completes.
                Body::Incomplete if conn.read_closed => {
                    conn.close_after_flush();
                    break;
                }
                Body::Incomplete => {
                    let pending: &mut PendingBody = conn.pending.as_mut().expect("an incomplete body is pending");
                    if head.expect_continue && !pending.continue_sent {
                        pending.continue_sent = true;
                        let (start, head_request) = (conn.output.len(), head.method == Method::Head);
                        if refused_at_head(&head, app, (stats, metrics_len), &mut conn.output, now.ms) {
                            close_refused(conn, start, head_request);
                        }
                    }
                    break;
                }
                Body::Refused(e) => {
                    refuse(conn, e, head.method == Method::Head);
                    break;
                }
            };
            let close = !head.keep_alive || conn.last_request || conn.stopping && consumed == data.len();
            let start = conn.output.len();
            handle(&head, app, (stats, metrics_len), &mut conn.output, close, now.ms);
            if head.method == Method::Head || !head.http11 {
                adapt_answer(&mut conn.output, &head, Answer { start, handled: &Handled::Done, close });
            }
            conn.request_answered(turn, consumed, now.ms);
            if close {
                conn.close_after_flush();
            }
        }
        if before == 0 && conn.unsent() > 0 {
            conn.out_since = now.ms;
        }
        after_answers(dirty, app, timeouts, conn, id);
    }
}

/// `Expect: 100-continue` on a request whose body has not all arrived. No
/// admin route reads a body, so its head decides the answer: a refusal
/// (a method, the token, the host, an unknown route) is written to `out`
/// at once (`true`: the connection closes, the body unread, RFC 9110
/// §10.1.1); any other answer waits for the body, asked for with
/// `100 Continue`. The answer written to judge it is then taken back, and
/// written again once the body is in.
#[cold]
fn refused_at_head(head: &Head, app: &App, metrics: (&ServerStats, &mut usize), out: &mut Vec<u8>, now: Ms) -> bool {
    let start = out.len();
    if handle(head, app, metrics, out, true, now).code() >= 400 {
        return true;
    }
    out.truncate(start);
    out.extend_from_slice(CONTINUE);
    false
}

/// Answers one admin request into `out`, returning the status written;
/// `metrics` are the reactor's counters and the length of the last scrape's
/// text, updated by this one.
pub fn handle(
    head: &Head,
    app: &App,
    metrics: (&ServerStats, &mut usize),
    out: &mut Vec<u8>,
    close: bool,
    now: Ms,
) -> Status {
    // `OPTIONS *` asks what the server as a whole supports (RFC 9110 §9.3.7).
    if head.path == b"*" {
        let mut w = dashboard::start(out, Status::Ok);
        w.header(b"Allow", b"GET, HEAD");
        w.finish(b"", close);
        return Status::Ok;
    }
    let path = crate::api::proxy::path_without_query(head.path_str());
    let is_route = |path: &str| matches!(path, "/healthz" | "/metrics") || crate::dashboard::is_route(path);
    // A route with one slash after it (`/pools/demo/`, `/api/pools/`) is
    // that route, redirected to its own address for GET and HEAD (and
    // refused like it for other methods).
    let with_slash = path.strip_suffix('/').filter(|route| is_route(route));
    let known = is_route(path) || with_slash.is_some();
    if known && !matches!(head.method, Method::Get | Method::Head) {
        let mut body = Vec::new();
        error_body(&mut body, "method_not_allowed", "Admin routes accept GET and HEAD only.");
        let mut w = dashboard::start(out, Status::MethodNotAllowed);
        w.header(b"Allow", b"GET, HEAD");
        w.finish_json(&body, close);
        return Status::MethodNotAllowed;
    }
    if let Some(route) = with_slash {
        return dashboard::redirect(out, app, route, head.path_str(), close);
    }
    if let Some(status) = crate::dashboard::handle(head, app, out, close) {
        return status;
    }
    match path {
        // Still 200 while re-adopting: the holders' renewals must reach this
        // instance (a health check that took it out of rotation would turn
        // the window into lost slots); the body tells an operator why
        // acquires are refused.
        "/healthz" if app.recovering(now) => {
            dashboard::start(out, Status::Ok).finish_json(b"{\"status\":\"recovering\"}", close);
            Status::Ok
        }
        "/healthz" => {
            dashboard::start(out, Status::Ok).finish_json(b"{\"status\":\"ok\"}", close);
            Status::Ok
        }
        "/metrics" => {
            let (stats, last_len) = metrics;
            // The text is rendered straight into the answer, then moved past
            // its head once its length is known: one copy of it is held, in
            // the connection's output, which `Conn::flush` gives back once
            // sent. Its memory is reserved once, for the last scrape's length
            // and a margin for counters that grew a digit.
            out.reserve_exact(*last_len + *last_len / 64 + 1024);
            let start = out.len();
            crate::metrics::render(out, &app.metrics(now, stats));
            let len = out.len() - start;
            *last_len = len;
            let mut text_head = Vec::new();
            let mut w = dashboard::start(&mut text_head, Status::Ok);
            w.header(b"Content-Type", b"text/plain; version=0.0.4; charset=utf-8");
            w.finish_head(len as u64, close);
            out.extend_from_slice(&text_head);
            out.copy_within(start..start + len, start + text_head.len());
            out[start..start + text_head.len()].copy_from_slice(&text_head);
            Status::Ok
        }
        _ => {
            let mut body = Vec::new();
            error_body(&mut body, "not_found", "No such route.");
            dashboard::start(out, Status::NotFound).finish_json(&body, close);
            Status::NotFound
        }
    }
}

/// Refuses a request the admin listener cannot frame (a malformed head, a
/// body too large), with the admin answers' security headers; the
/// connection closes.
#[cold]
fn refuse(conn: &mut Conn, error: ApiError, head_request: bool) {
    let answer_start = conn.output.len();
    error.write_with(&mut conn.output, &mut Vec::new(), true, dashboard::SECURITY_HEADERS);
    close_refused(conn, answer_start, head_request);
}
