//! The request pipeline of a client connection: the complete requests in
//! its input are parsed, framed and answered in order.

use super::conn::{self, Conn, PendingBody, Timeouts};
use super::{arm_conn_timer, carry, client_mut, mark_conn_dirty, proxied, Server};
use crate::api::{ApiError, App, ConnId, Ctx, Handled};
use crate::http::chunked::{ChunkError, ChunkedDecoder};
use crate::http::request::{
    head_may_be_complete, header_storage, parse_head_on, serve_as_http11, BodyFraming, Head, HeadError, Method,
};
use crate::http::response::{say_kept_alive, write_kept_alive, CONTINUE};
use crate::time::Now;
use std::time::Instant;

impl Server {
    /// Answers every complete request in the input, in order, until one
    /// must wait in a queue, the output is too far behind or the turn's
    /// request budget is spent (then it goes on next turn).
    pub(super) fn process(&mut self, id: ConnId) {
        let Server { conns, app, now, turn, turn_started, ready, proxy, poll, dirty, timeouts, .. } = self;
        let (now, turn) = (*now, *turn);
        let Some(conn) = client_mut(conns, id) else {
            return;
        };
        if conn.exchange.is_some() {
            self.pump_exchange(id);
            return;
        }
        if conn.admin {
            self.process_admin(id);
            return;
        }
        let before = conn.unsent();
        let mut proxied = proxied::After::Nothing;
        loop {
            if !conn.is_open() || conn.unsent() > conn::OUTPUT_HIGH_WATER {
                break;
            }
            if conn.input.is_empty() {
                break;
            }
            if conn.budget(turn).requests_spent() {
                // Fairness: the others are served before the rest of this input.
                carry(ready, conn, id);
                break;
            }
            let data = &conn.input.buf[conn.input.start..conn.input.end];
            if cannot_be_complete(conn, app.max_body) {
                log_if_gone(app, conn, *turn_started, now);
                incomplete(conn);
                break;
            }
            let input_full = conn.input_full();
            let mut storage = header_storage();
            // Matched by reference: the head is large, and moving it out
            // would copy it on every request.
            let parsed = parse_head_on(data, &mut storage, &mut conn.head_memo);
            let head = match &parsed {
                Ok(Some(head)) => head,
                Ok(None) => {
                    log_if_gone(app, conn, *turn_started, now);
                    incomplete(conn);
                    break;
                }
                Err(HeadError::NewerMinorVersion) => {
                    let (start, end) = (conn.input.start, conn.input.end);
                    if serve_as_http11(&mut conn.input.buf[start..end]) {
                        continue;
                    }
                    let (head_request, answer_start) =
                        (is_head_request(&conn.input.buf[start..end]), conn.output.len());
                    app.write_error(&mut conn.output, ApiError::BadRequest("Only HTTP/1.x is served."), true);
                    close_refused(conn, answer_start, head_request);
                    break;
                }
                &Err(e) => {
                    let (head_request, answer_start) = (is_head_request(data), conn.output.len());
                    let error = ApiError::from(e);
                    let peer = conn.peer.ip();
                    app.note_refused_move(data, peer, now);
                    app.refuse_head(data, peer, conn.listener_pool, *turn_started, now, error, &mut conn.output);
                    close_refused(conn, answer_start, head_request);
                    break;
                }
            };
            let mut ctx = Ctx {
                now,
                conn: id,
                peer: conn.peer.ip(),
                // A half-closed client still gets every answer; the connection
                // closes once they are written (see `Server::flush`).
                close: !head.keep_alive || conn.last_request,
                started: *turn_started,
                read: conn.read_at.min(now.ms),
            };
            // A move is noted first: a request the router placed by a stale
            // map (refused below) moves the pool it was placed by all the
            // same, as does one whose target is refused (its `400` comes
            // when it is answered). A line read by comparison has its target
            // checked late; a head whose target a fresh parse refuses acts on
            // no pool the router did not name.
            let answer_start = conn.output.len();
            let head_request = head.method == Method::Head;
            if head.api.moved() && (head.api.placed_as().is_some() || head.check_target().is_ok()) {
                app.note_move(conn.listener_pool, &ctx, head);
            }
            if head.api.placed_as().is_some()
                && head.check_target().is_ok()
                && app.refuse_misplaced(conn.listener_pool, &ctx, head, &mut conn.output)
            {
                close_refused(conn, answer_start, head_request);
                break;
            }
            // A body refused for its framing or size: a target a fresh parse
            // refuses is what the answer names, as it would on a fresh connection.
            let refusal = |e: ApiError| head.check_target().map_or_else(ApiError::from, |()| e);
            if let Some(pid) = app.proxy_route(conn.listener_pool, head) {
                let head_len = head.head_len;
                let begun = proxied::begin(app, proxy, &mut conn.output, id, &ctx, head, pid);
                // Only its head is taken here: its body (if any) streams up
                // with the exchange, which owns the input from now on.
                conn.head_proxied(turn, head_len);
                proxied = proxied::enter(app, proxy, poll.registry(), conn, begun, now);
                break;
            }
            let (body, consumed) = match take_body(head, data, &mut conn.pending, &mut conn.body, app.max_body) {
                Body::Ready(body, consumed) => (body, consumed),
                Body::Incomplete if input_full => {
                    // Only a chunked body can outgrow the input buffer (its
                    // framing, extensions and trailers count): refuse it rather
                    // than stall until the head deadline.
                    app.reject(
                        &Ctx { close: true, ..ctx },
                        head,
                        refusal(ApiError::PayloadTooLarge(app.max_body as u64)),
                        &mut conn.output,
                    );
                    close_refused(conn, answer_start, head_request);
                    break;
                }
                // The client sent all it will: the body never completes.
                Body::Incomplete if conn.read_closed => {
                    log_if_gone(app, conn, *turn_started, now);
                    conn.close_after_flush();
                    break;
                }
                Body::Incomplete => {
                    let pending = conn.pending.as_mut().expect("an incomplete body is pending");
                    if head.expect_continue && !pending.continue_sent {
                        pending.continue_sent = true;
                        // Refuse now what the head already decides, before the body is sent.
                        match app.precheck(&ctx, head) {
                            Ok(()) => conn.output.extend_from_slice(CONTINUE),
                            Err(e) => {
                                // The body may still come: the connection cannot be reused.
                                app.reject(&Ctx { close: true, ..ctx }, head, e, &mut conn.output);
                                close_refused(conn, answer_start, head_request);
                            }
                        }
                    }
                    break;
                }
                Body::Refused(e) => {
                    app.reject(&Ctx { close: true, ..ctx }, head, refusal(e), &mut conn.output);
                    close_refused(conn, answer_start, head_request);
                    break;
                }
            };
            if conn.stopping && consumed == data.len() {
                ctx.close = true;
            }
            let handled = app.handle(&ctx, head, body, &mut conn.output, &mut conn.verdicts);
            let mut http10_keep_alive = false;
            if head_request || !head.http11 {
                let answer = Answer { start: answer_start, handled: &handled, close: ctx.close };
                http10_keep_alive = adapt_answer(&mut conn.output, head, answer);
            }
            conn.request_answered(turn, consumed, now.ms);
            let closes = ctx.close || matches!(handled, Handled::Close);
            match handled {
                Handled::Done | Handled::Close => {}
                Handled::Granted(slot) => conn.undelivered.push((slot, conn.output.len())),
                // A half-closed client cannot wait: nothing it sends can follow.
                Handled::Queued(q) if conn.peer_done_sending() => {
                    // Its answer keeps the connection for what was pipelined
                    // behind it, as when the half-close is read later.
                    write_kept_alive(&mut conn.output, http10_keep_alive, |out| {
                        app.withdraw(out, &q, id, now, ctx.close)
                    });
                }
                // Stopping: a request that was still arriving at the signal
                // waits no more than the waiters did; it gets their `503`.
                Handled::Queued(q) if conn.stopping => {
                    write_kept_alive(&mut conn.output, http10_keep_alive, |out| {
                        app.answer_shutdown(out, &q, id, now, ctx.close)
                    });
                }
                Handled::Queued(q) => {
                    conn.wait(q, ctx.close, http10_keep_alive);
                    continue;
                }
            }
            if closes {
                conn.close_after_flush();
            }
        }
        if before == 0 && conn.unsent() > 0 {
            conn.out_since = now.ms;
        }
        match proxied {
            // The common case: the connection is still in hand.
            proxied::After::Nothing => return after_answers(dirty, app, timeouts, conn, id),
            proxied::After::Pump => self.pump_exchange(id),
            proxied::After::Fail(err) => self.end_exchange(id, proxied::End::Answered(err)),
        }
        if let Some(conn) = client_mut(&mut self.conns, id) {
            after_answers(&mut self.dirty, &mut self.app, &self.timeouts, conn, id);
        }
    }
}

/// After answering: the connection goes on the flush list when it has
/// something to write or to close (the flush at the end of the turn then
/// arms its timer), else its timer follows its deadline now.
pub(super) fn after_answers(dirty: &mut Vec<ConnId>, app: &mut App, timeouts: &Timeouts, conn: &mut Conn, id: ConnId) {
    if conn.unsent() > 0 || conn.closes_after_flush() || conn.read_closed {
        mark_conn_dirty(dirty, conn, id);
        return;
    }
    arm_conn_timer(app, timeouts, conn, id);
}

/// When the client sent all it will, the request at the front of the input
/// never completes: an acquire there is logged, its client gone.
#[cold]
fn log_if_gone(app: &mut App, conn: &Conn, started: Instant, now: Now) {
    if conn.read_closed {
        log_unanswered(app, conn, started, now, crate::api::UNANSWERED_CLIENT_GONE);
    }
}

/// Logs the acquire that closing `conn` now leaves unanswered, if one is,
/// with `why` (`crate::api::UNANSWERED_*`). Only the first request of its
/// input is looked at.
#[cold]
pub(super) fn log_unanswered(app: &mut App, conn: &Conn, started: Instant, now: Now, why: (u16, &'static str)) {
    if conn.has_unanswered_request() {
        let input = &conn.input.buf[conn.input.start..conn.input.end];
        app.log_unanswered(input, conn.peer.ip(), conn.listener_pool, started, now, why);
    }
}

/// Whether the request at the front of the input cannot be complete yet:
/// a head usually arrives whole and is parsed at once; after a partial
/// parse, only new bytes that could end it (or break it) trigger another.
/// A head whose `Content-Length` body is still arriving is parsed again
/// only once the input holds all of it, unless the body limit `max_body`
/// changed since (a reload) or the input is full (which a body within the
/// limit never makes it): then the parse's refusal is not put off.
#[inline]
pub(super) fn cannot_be_complete(conn: &Conn, max_body: usize) -> bool {
    let data = &conn.input.buf[conn.input.start..conn.input.end];
    match &conn.pending {
        None => !head_may_be_complete(data, conn.head_scanned),
        Some(body) => data.len() < body.need && body.max_body == max_body && !conn.input_full(),
    }
}

/// The request at the front of the input is incomplete, all of the input
/// looked at. When the client has sent all it will (its FIN was read), it
/// never will be, and the connection closes once what was answered before
/// it is written.
#[inline]
pub(super) fn incomplete(conn: &mut Conn) {
    conn.head_scanned = conn.input.end - conn.input.start;
    if conn.read_closed {
        conn.close_after_flush();
    }
}

/// The answer just written for a request, from `start` in the output.
pub(super) struct Answer<'a> {
    pub start: usize,
    pub handled: &'a Handled,
    /// It closes the connection.
    pub close: bool,
}

/// What `HEAD` and HTTP/1.0 requests change in their answer. A `HEAD`
/// answer is the answer without its body. HTTP/1.0 keeps a connection only
/// when the answer says so (RFC 9112 §C.2.2): one written now says it at
/// once; a queued acquire's says it when it is written (`true`: the queued
/// acquire's answer must).
#[cold]
pub(super) fn adapt_answer(output: &mut Vec<u8>, head: &Head, answer: Answer) -> bool {
    if head.method == Method::Head {
        strip_body(output, answer.start);
    }
    let keep_alive = !head.http11 && head.keep_alive && !answer.close;
    if keep_alive && matches!(answer.handled, Handled::Done | Handled::Granted(_)) {
        say_kept_alive(output, answer.start);
    }
    keep_alive && matches!(answer.handled, Handled::Queued(_))
}

/// Whether `input` holds a `HEAD` request, read from its request line (past
/// the empty lines a parse skips): a refused head may not parse at all.
pub(super) fn is_head_request(input: &[u8]) -> bool {
    let line = input.iter().position(|&b| b != b'\r' && b != b'\n').unwrap_or(input.len());
    input[line..].starts_with(b"HEAD ")
}

/// Closes the connection once the refusal written from `answer_start` is
/// sent; a refused `HEAD` is sent its head alone (RFC 9110 §9.3.2).
pub(super) fn close_refused(conn: &mut Conn, answer_start: usize, head_request: bool) {
    if head_request {
        strip_body(&mut conn.output, answer_start);
    }
    conn.close_after_flush();
}

/// A `HEAD` answer is the answer without its body (RFC 9110 §9.3.2); the
/// head, `Content-Length` included, stays.
pub(super) fn strip_body(output: &mut Vec<u8>, answer_start: usize) {
    if let Some(end) = output[answer_start..].windows(4).position(|w| w == b"\r\n\r\n") {
        output.truncate(answer_start + end + 4);
    }
}

pub(super) enum Body<'a> {
    /// The whole body, and the input bytes the request took (head included).
    Ready(&'a [u8], usize),
    Incomplete,
    Refused(ApiError),
}

/// Finds the request's body in `data`, decoding chunked bodies into `decoded`
/// incrementally (their state lives in `pending` between reads). Inlined
/// into the request pipeline, like `parse_head_on`.
#[inline(always)]
pub(super) fn take_body<'a>(
    head: &Head,
    data: &'a [u8],
    pending: &mut Option<PendingBody>,
    decoded: &'a mut Vec<u8>,
    max_body: usize,
) -> Body<'a> {
    let head_len = head.head_len;
    match head.framing {
        BodyFraming::None => Body::Ready(&[], head_len),
        BodyFraming::Length(n) => {
            if n > max_body as u64 {
                return Body::Refused(ApiError::PayloadTooLarge(max_body as u64));
            }
            let end = head_len + n as usize;
            if data.len() < end {
                let body =
                    pending.get_or_insert(PendingBody { chunked: None, continue_sent: false, need: end, max_body });
                // Judged again under a new limit (a reload): that one holds from now.
                body.max_body = max_body;
                return Body::Incomplete;
            }
            Body::Ready(&data[head_len..end], end)
        }
        BodyFraming::Chunked => {
            // Taking a request clears its state, so a state here is this
            // request's; one without a decoder (never expected) is not
            // trusted but started afresh.
            let (decoder, eaten) = match pending {
                Some(PendingBody { chunked: Some(state), .. }) => state,
                _ => {
                    decoded.clear();
                    let fresh = pending.insert(PendingBody { chunked: None, continue_sent: false, need: 0, max_body });
                    fresh.chunked.insert((ChunkedDecoder::new(max_body), 0))
                }
            };
            match decoder.feed(&data[head_len + *eaten..], decoded) {
                Ok((n, done)) => {
                    *eaten += n;
                    if done {
                        Body::Ready(&decoded[..], head_len + *eaten)
                    } else {
                        Body::Incomplete
                    }
                }
                Err(ChunkError::TooLarge(limit)) => Body::Refused(ApiError::PayloadTooLarge(limit)),
                Err(ChunkError::Malformed(why)) => Body::Refused(ApiError::BadRequest(why)),
            }
        }
    }
}
