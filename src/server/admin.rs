//! The admin listener's routes: `GET /healthz` and `GET /metrics`.
//!
//! Served by the same event loop as the lock API but on its own listener;
//! lock routes are not served here and these are not served there. The
//! metrics text is built only when scraped: `api` reads the governor into a
//! `metrics::MetricsSnapshot`, with the reactor's counters, and `metrics`
//! renders it.

use crate::api::App;
use crate::dashboard;
use crate::http::request::{Head, Method};
use crate::http::response::{error_body, Status};
pub use crate::metrics::ServerStats;
use crate::time::Ms;

pub fn handle(head: &Head, app: &App, stats: &ServerStats, out: &mut Vec<u8>, close: bool, now: Ms) {
    let path = crate::api::proxy::path_without_query(head.path_str());
    let known = matches!(path, "/healthz" | "/metrics") || crate::dashboard::is_route(path);
    if known && !matches!(head.method, Method::Get | Method::Head) {
        let mut body = Vec::new();
        error_body(&mut body, "method_not_allowed", "Admin routes accept GET and HEAD only.");
        let mut w = dashboard::start(out, Status::MethodNotAllowed);
        w.header(b"Allow", b"GET, HEAD");
        w.finish_json(&body, close);
        return;
    }
    if crate::dashboard::handle(head, app, out, close) {
        return;
    }
    match path {
        // Still 200 while re-adopting: the holders' renewals must reach this
        // instance (a health check that took it out of rotation would turn
        // the window into lost slots); the body tells an operator why
        // acquires are refused.
        "/healthz" if app.recovering(now) => {
            dashboard::start(out, Status::Ok).finish_json(b"{\"status\":\"recovering\"}", close)
        }
        "/healthz" => dashboard::start(out, Status::Ok).finish_json(b"{\"status\":\"ok\"}", close),
        "/metrics" => {
            let text = crate::metrics::render(&app.metrics(now, stats.clone()));
            let mut w = dashboard::start(out, Status::Ok);
            w.header(b"Content-Type", b"text/plain; version=0.0.4; charset=utf-8");
            w.finish(text.as_bytes(), close);
        }
        _ => {
            let mut body = Vec::new();
            error_body(&mut body, "not_found", "No such route.");
            dashboard::start(out, Status::NotFound).finish_json(&body, close);
        }
    }
}
