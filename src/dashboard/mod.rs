//! The dashboard on the admin listener: `/` (every pool at a glance),
//! `/pools/{pool}` (one pool's Overview) and the JSON behind them,
//! `/api/pools` and `/api/pools/{pool}`.
//!
//! The pages are one static shell plus a script and a style sheet, all
//! embedded in the binary; they carry no data. The script fetches the JSON
//! (with the admin token as a Bearer header when one is configured) and
//! builds the DOM with `textContent` only. The JSON is built here, off the
//! request path, from the governor's state and the per-pool histories the
//! reactor samples once a second.

use serde_json::{json, Value};

use crate::api::proxy::path_without_query;
use crate::api::route::BadEscape;
use crate::api::{App, CredentialsAsked};
use crate::ct::secret_eq;
use crate::governor::history::Sample;
use crate::governor::{DenyReason, Pool, PoolId, PoolSettings};
use crate::http::request::Head;
use crate::http::response::{error_body, Status, Writer};

const INDEX_HTML: &[u8] = include_bytes!("assets/index.html");
const APP_JS: &[u8] = include_bytes!("assets/app.js");
const APP_CSS: &[u8] = include_bytes!("assets/app.css");
/// The tab's icon, named by the page, so the browser asks for no `/favicon.ico`
/// (which a token-guarded listener would refuse, an error in its console).
const ICON_SVG: &[u8] = include_bytes!("assets/icon.svg");

/// The security headers every admin answer carries, its refusals included.
pub const SECURITY_HEADERS: &[u8] =
    b"Content-Security-Policy: default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; \
      object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'\r\n\
      X-Frame-Options: DENY\r\nX-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\n\
      Cache-Control: no-store\r\n";

/// Starts an admin answer with the security headers.
pub fn start(out: &mut Vec<u8>, status: Status) -> Writer<'_> {
    let mut w = Writer::start(out, status);
    w.raw(SECURITY_HEADERS);
    w
}

fn error(out: &mut Vec<u8>, status: Status, code: &str, message: &str, close: bool) {
    let mut body = Vec::new();
    error_body(&mut body, code, message);
    let mut w = start(out, status);
    if status == Status::Unauthorized {
        w.header(b"WWW-Authenticate", b"Bearer realm=\"nthpool admin\"");
    }
    w.finish_json(&body, close);
}

/// What a request may see of the admin routes that hold data.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Granted,
    /// An `adminToken` is configured and the request does not carry it.
    NoToken,
    /// No `adminToken` (so a loopback listener), and the request is
    /// addressed to a host name other than `localhost`.
    ForeignHost,
}

/// Whether the request carries the admin token or, without one, is
/// addressed to this machine. A listener without a token is loopback-only,
/// yet a page of another site can reach it from a browser on this machine
/// by pointing its own name at 127.0.0.1 (DNS rebinding): such a request
/// names that site in its `Host`, so without the token only an IP address,
/// `localhost` or a `*.localhost` name is answered.
fn access(head: &Head, app: &App) -> Access {
    let Some(token) = app.admin_token.as_deref() else {
        return match head.host.map(crate::api::host_name) {
            Some(name) if !names_this_machine(name) => Access::ForeignHost,
            _ => Access::Granted,
        };
    };
    let given = head.header("authorization").and_then(|v| crate::http::credentials(v, "bearer")).unwrap_or_default();
    if secret_eq(given, token.as_bytes()) {
        Access::Granted
    } else {
        Access::NoToken
    }
}

/// An IP address, `localhost`, or a name under `localhost.` (RFC 6761 §6.3).
fn names_this_machine(name: &[u8]) -> bool {
    const SUFFIX: &[u8] = b".localhost";
    name.eq_ignore_ascii_case(&SUFFIX[1..])
        || name.len() > SUFFIX.len() && name[name.len() - SUFFIX.len()..].eq_ignore_ascii_case(SUFFIX)
        || std::str::from_utf8(name).is_ok_and(|n| n.parse::<std::net::IpAddr>().is_ok())
}

/// Answers the dashboard's routes and refuses what the token does not
/// allow, returning the status written; `None` for routes left to the
/// caller (`/healthz`, `/metrics`, unknown ones), which are then authorized
/// already. Only GET and HEAD reach here.
pub fn handle(head: &Head, app: &App, out: &mut Vec<u8>, close: bool) -> Option<Status> {
    let path = path_without_query(head.path_str());
    let asset = |out: &mut Vec<u8>, kind: &[u8], body: &[u8]| {
        let mut w = start(out, Status::Ok);
        w.header(b"Content-Type", kind);
        w.finish(body, close);
    };
    // The shell and its assets are the same bytes for everyone and hold no
    // data; the page asks for the token itself.
    let shell = match path {
        "/" => Some((&b"text/html; charset=utf-8"[..], INDEX_HTML)),
        "/assets/app.js" => Some((&b"text/javascript; charset=utf-8"[..], APP_JS)),
        "/assets/app.css" => Some((&b"text/css; charset=utf-8"[..], APP_CSS)),
        "/assets/icon.svg" => Some((&b"image/svg+xml"[..], ICON_SVG)),
        "/healthz" => return None,
        _ => None,
    };
    if let Some((kind, body)) = shell {
        asset(out, kind, body);
        return Some(Status::Ok);
    }
    if let Some(name) = pool_name(path, "/pools/") {
        // An escape that can name no pool is refused whoever asks: it
        // tells nothing of which pools exist.
        let shown = match shown_pool(app, name) {
            Ok(shown) => shown,
            Err(e) => {
                error(out, Status::BadRequest, "bad_request", e.message(), close);
                return Some(Status::BadRequest);
            }
        };
        // The shell holds no data: without the token, any pool name gets it,
        // so the page does not tell who may not see the pools which exist.
        // An unknown pool's page is the shell too, as a 404: its script
        // finds the pool missing and says so in the page.
        let status = if access(head, app) == Access::Granted && shown.is_none() {
            // A browser gets the page, which says so; any other client the
            // JSON error every other admin refusal is.
            if !accepts_html(head) {
                error(out, Status::NotFound, "not_found", "No such pool.", close);
                return Some(Status::NotFound);
            }
            Status::NotFound
        } else {
            Status::Ok
        };
        let mut w = start(out, status);
        w.header(b"Content-Type", b"text/html; charset=utf-8");
        w.finish(INDEX_HTML, close);
        return Some(status);
    }
    match access(head, app) {
        Access::Granted => {}
        Access::NoToken => {
            let message = "This admin route needs Authorization: Bearer <adminToken>.";
            error(out, Status::Unauthorized, "unauthorized", message, close);
            return Some(Status::Unauthorized);
        }
        Access::ForeignHost => {
            let message = "Without adminToken the admin listener answers requests addressed to localhost or an IP \
                address only; set adminToken to reach it under a host name.";
            error(out, Status::Forbidden, "forbidden_host", message, close);
            return Some(Status::Forbidden);
        }
    }
    let body = match path {
        "/api/pools" => pools_json(app),
        _ => match pool_name(path, "/api/pools/").map(|name| shown_pool(app, name)) {
            Some(Ok(Some(pid))) => pool_json(app, pid, head.host),
            Some(Ok(None)) => {
                error(out, Status::NotFound, "not_found", "No such pool.", close);
                return Some(Status::NotFound);
            }
            Some(Err(e)) => {
                error(out, Status::BadRequest, "bad_request", e.message(), close);
                return Some(Status::BadRequest);
            }
            None => return None,
        },
    };
    start(out, Status::Ok).finish_json(body.to_string().as_bytes(), close);
    Some(Status::Ok)
}

/// Whether the client asks for HTML (`Accept: text/html`, as a browser
/// navigating to a page does).
fn accepts_html(head: &Head) -> bool {
    head.headers
        .into_iter()
        .filter(|h| h.name.eq_ignore_ascii_case(b"accept"))
        .any(|h| h.value.windows(9).any(|w| w.eq_ignore_ascii_case(b"text/html")))
}

/// The status word of a pool: what stops its next grant, if anything.
/// `recovering`: the pool is in its re-adoption window after a restart.
fn status(pool: &Pool, now: u64) -> &'static str {
    if pool.retired {
        return "draining";
    }
    match pool.blocked(now) {
        None => "ok",
        Some((DenyReason::Concurrency | DenyReason::QueueFull, _)) => "concurrency",
        Some((DenyReason::Rate, _)) => "rate",
        Some((DenyReason::Cooldown, _)) => "cooldown",
        Some((DenyReason::Recovering, _)) => "recovering",
    }
}

/// The cool-down's time left, also while a later gate decides the status.
fn cooldown_left(pool: &Pool, now: u64) -> u64 {
    pool.learning.cooldown_until.saturating_sub(now)
}

fn summary(app: &App, pool: &Pool) -> Value {
    let now = app.turn().ms;
    json!({
        "name": &*pool.name,
        "status": status(pool, now),
        "held": pool.held,
        "effectiveLimit": pool.effective_limit_at(now),
        "limit": pool.settings.concurrency,
        "queueDepth": pool.queue.len(),
        "queueSize": pool.settings.queue_size,
        "rpmTokens": pool.rpm_tokens_at(now),
        "cooldownMs": cooldown_left(pool, now),
    })
}

/// The pool the path segment `name` names (percent-escapes decoded, as on
/// the lock routes), unless it is unknown or a removed pool with nothing
/// left to drain (`Pool::drained_away`); an error for an escape that can
/// name no pool.
fn shown_pool(app: &App, name: &str) -> Result<Option<PoolId>, BadEscape> {
    let pid = app.pool_in_path(name.as_bytes())?;
    Ok(pid.filter(|&pid| !app.governor().pool(pid).drained_away()))
}

fn pools_json(app: &App) -> Value {
    let epoch_now = app.turn().wall().0;
    // By name, as at start: a reload adds its new pools at the governor's end.
    let mut shown: Vec<&Pool> = app.governor().pools().map(|(_, p)| p).filter(|p| !p.drained_away()).collect();
    shown.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    let pools: Vec<Value> = shown.into_iter().map(|p| summary(app, p)).collect();
    json!({ "serverTime": epoch_now, "pools": pools })
}

/// The lock API's address as its callers reach it: `publicHost`, else the
/// public listener's address (`listener_url`).
fn public_url(app: &App, reached_as: Option<&[u8]>) -> String {
    match (app.public_host(), app.listen_addr) {
        (Some(host), _) => format!("https://{}", String::from_utf8_lossy(host)),
        (None, Some(addr)) => listener_url(addr, reached_as),
        (None, None) => "http://127.0.0.1:7070".into(),
    }
}

/// The listener's address, unless it is a wildcard (`0.0.0.0`, `[::]`),
/// which is no address to call: then the host this page was reached by
/// (`reached_as`, a valid `host[:port]`) stands in, with the listener's port.
fn listener_url(addr: std::net::SocketAddr, reached_as: Option<&[u8]>) -> String {
    match reached_as.filter(|_| addr.ip().is_unspecified()) {
        Some(host) => {
            let name_end = match host.first() {
                Some(b'[') => host.iter().position(|&b| b == b']').map_or(host.len(), |at| at + 1),
                _ => host.iter().position(|&b| b == b':').unwrap_or(host.len()),
            };
            format!("http://{}:{}", String::from_utf8_lossy(&host[..name_end]), addr.port())
        }
        None => format!("http://{addr}"),
    }
}

fn pool_json(app: &App, pid: PoolId, reached_as: Option<&[u8]>) -> Value {
    let pool = app.governor().pool(pid);
    let (now, epoch_now) = (app.turn().ms, app.turn().wall().0);
    let (history, attempts) = &app.history[pid.0 as usize];
    let s = &pool.settings;
    let budget = pool
        .learning
        .budget_at(now)
        .0
        .map(|b| json!({ "remaining": b.remaining, "resetAt": epoch_now + b.reset_at.saturating_sub(now) }));
    let token_block = pool.learning.token_block_until;
    let token_blocked_until = (token_block > now).then(|| epoch_now + (token_block - now));
    let series = |f: fn(&Sample) -> u32| -> Vec<u32> { history.iter().map(f).collect() };
    let end = history.last_second().map(|sec| epoch_now - now + (sec * 1000));
    let attempts: Vec<Value> = attempts
        .iter()
        .map(|a| {
            json!({
                "time": a.epoch_ms,
                "status": a.status,
                "error": a.error,
                "denyReason": a.reason.map(DenyReason::as_str),
                "waitMs": a.wait_ms,
                // Clamped as the governor clamps it, by the queue timeout
                // (as it is now: a reload may have changed it since): worked
                // out here, so no request pays for what only this page shows.
                "appliedWaitMs": a.wait_ms.min(s.queue_timeout_ms),
                "queuedMs": a.queued_ms,
                "serverUs": a.server_us,
                "slotRef": a.slot_ref.map(|r| format!("#{r:08x}")),
            })
        })
        .collect();
    let lock_path = format!("/pools/{}/lock", pool.name);
    let lock_api = format!("{}{lock_path}", public_url(app, reached_as));
    json!({
        "serverTime": epoch_now,
        "pool": summary(app, pool),
        "config": {
            "concurrency": s.concurrency,
            "queueSize": s.queue_size,
            "queueTimeoutMs": s.queue_timeout_ms,
            "rpm": s.rpm.map(|(rpm, _)| rpm),
            "rpmBurst": s.rpm.map(|(_, burst)| burst),
            "termMs": s.term_ms,
            "renewIntervalMs": s.renew_interval_ms,
            "requestTimeoutMs": s.request_timeout_ms,
            "adaptive": s.adaptive,
            "publicHost": app.public_host().map(String::from_utf8_lossy),
        },
        "budget": budget,
        "tokenBlockedUntil": token_blocked_until,
        "history": {
            "resolutionMs": 1000,
            "endTime": end,
            "grants": series(|x| x.grants),
            "deniedConcurrency": series(|x| x.denied[DenyReason::Concurrency as usize]),
            "deniedRate": series(|x| x.denied[DenyReason::Rate as usize]),
            "deniedCooldown": series(|x| x.denied[DenyReason::Cooldown as usize]),
            "deniedQueueFull": series(|x| x.denied[DenyReason::QueueFull as usize]),
            "deniedRecovering": series(|x| x.denied[DenyReason::Recovering as usize]),
            "throttled": series(|x| x.throttled),
            "effectiveLimit": series(|x| x.effective),
            "limit": series(|x| x.limit),
            "held": series(|x| x.held),
            "queueDepth": series(|x| x.queue),
        },
        "attempts": attempts,
        "examples": examples(&lock_api, &lock_path, app.credentials_asked(pid), queued_wait(s)),
    })
}

/// The queued acquire's wait and title: 30 s, or the pool's queue timeout
/// when that is shorter (the server would clamp the wait to it), so the
/// title says what the line does with this pool.
fn queued_wait(s: &PoolSettings) -> (u64, String) {
    const WAIT_MS: u64 = 30_000;
    match s.queue_timeout_ms.min(WAIT_MS) {
        _ if s.queue_size == 0 => (WAIT_MS, "Acquire with a wait (this pool has no queue: it answers at once)".into()),
        0 => (WAIT_MS, "Acquire with a wait (this pool's queue.timeoutMs is 0: it answers at once)".into()),
        ms if ms % 1000 == 0 => (ms, format!("Acquire, wait up to {} s in the queue", ms / 1000)),
        ms => (ms, format!("Acquire, wait up to {ms} ms in the queue")),
    }
}

/// Ready `curl` lines in the shapes of the lock-API page, with the key as
/// `$POOL_KEY`. Proxy usage joins these when the pool has an upstream. A
/// pool whose access policies want more than the key gets those too: its
/// JWT as `$POOL_JWT`, its Cloudflare Access token as `$CF_ACCESS_JWT`, and
/// an `hmac` signature computed with `openssl` from `$POOL_HMAC_SECRET`.
fn examples(lock_api: &str, lock_path: &str, asked: CredentialsAsked, queued: (u64, String)) -> Value {
    // Single-quoted for the shell; a quote in publicHost is closed and escaped.
    let head = format!("export LOCK_API='{}'\n", lock_api.replace('\'', "'\\''"));
    let signed = asked.hmac;
    let mut auth = String::from(" \\\n  -H \"X-Nthpool-Key: $POOL_KEY\"");
    if asked.jwt {
        auth.push_str(" \\\n  -H \"X-Nthpool-Jwt: $POOL_JWT\"");
    }
    if asked.cloudflare {
        auth.push_str(" \\\n  -H \"Cf-Access-Jwt-Assertion: $CF_ACCESS_JWT\"");
    }
    if signed {
        auth.push_str(
            " \\\n  -H \"X-Nthpool-Timestamp: $TS\" -H \"X-Nthpool-Nonce: $NONCE\" -H \"X-Nthpool-Signature: v1=$SIG\"",
        );
    }
    // `body`: None sends none; Some is JSON sent with its Content-Type.
    // `note`: comment lines said after the LOCK_API line. `keep_slot`: the
    // answer (a grant) is printed and its slotId kept in SLOT_ID, for the
    // examples pasted after it.
    let call = |path: &str, body: Option<&str>, note: &str, keep_slot: bool| {
        let mut text = head.clone();
        text.push_str(note);
        if signed {
            // SPEC §8: HMAC-SHA256 over v1, method, path, time, nonce and the body's SHA-256.
            // `date` has whole seconds everywhere: the time is rounded up, since a
            // server refuses what was signed before it started (its nonces are gone).
            text.push_str(&format!(
                "BODY='{}' TS=$((($(date +%s) + 1) * 1000)) NONCE=$(openssl rand -hex 16)\n\
                 SIG=$(printf 'v1\\nPOST\\n%s\\n%s\\n%s\\n%s' \"{lock_path}/{path}\" \"$TS\" \"$NONCE\" \\\n  \
                 \"$(printf '%s' \"$BODY\" | openssl dgst -sha256 -r | cut -d' ' -f1)\" \\\n  \
                 | openssl dgst -sha256 -hmac \"$POOL_HMAC_SECRET\" -r | cut -d' ' -f1)\n",
                body.unwrap_or("")
            ));
        }
        if keep_slot {
            text.push_str("GRANT=$(");
        }
        text.push_str(&format!("curl -sS -X POST \"$LOCK_API/{path}\"{auth}"));
        match body {
            Some(_) if signed => text.push_str(" \\\n  -H \"Content-Type: application/json\" \\\n  -d \"$BODY\""),
            Some(json) => text.push_str(&format!(" \\\n  -H \"Content-Type: application/json\" \\\n  -d '{json}'")),
            None => {}
        }
        if keep_slot {
            text.push_str(
                ")\necho \"$GRANT\"\n\
                 export SLOT_ID=$(printf '%s' \"$GRANT\" | sed -n 's/.*\"slotId\":\"\\([^\"]*\\)\".*/\\1/p')",
            );
        }
        text
    };
    let throttle_note = "# A 429 with no sign of a spent budget cuts the pool's limit and pauses nothing;\n\
                         # with \"rate\":{\"remaining\":0,\"resetMs\":2000} it pauses the pool instead.\n";
    let throttled = Some("{\"status\":429,\"throttled\":1,\"retryAfterMs\":2000}");
    json!([
        { "id": "acquire", "title": "Acquire, fail fast", "text": call("acquire", None, "", true) },
        { "id": "acquire-queued", "title": queued.1,
          "text": call("acquire", Some(&format!("{{\"waitMs\":{}}}", queued.0)), "", true) },
        { "id": "renew", "title": "Renew", "text": call("$SLOT_ID/renew", None, "", false) },
        { "id": "release", "title": "Release", "text": call("$SLOT_ID/release", Some("{\"status\":200}"), "", false) },
        { "id": "release-throttled", "title": "Release with a throttle report",
          "text": call("$SLOT_ID/release", throttled, throttle_note, false) },
    ])
}

/// A `308` to `route`, the admin route the request named with a slash
/// after it (`/pools/demo/`), its query kept: a browser lands on the page
/// itself (whose script reads the pool from its own address), a script on
/// the JSON it asked for. The `Location` is one of the admin routes, so it
/// can never point off this listener. A pool segment with an escape that
/// can name no pool (`/pools/a%2Fb/`) is the `400` the route itself would
/// answer, not a redirect to it.
pub fn redirect(out: &mut Vec<u8>, app: &App, route: &str, target: &str, close: bool) -> Status {
    let name = pool_name(route, "/pools/").or_else(|| pool_name(route, "/api/pools/"));
    if let Some(Err(e)) = name.map(|name| app.pool_in_path(name.as_bytes())) {
        error(out, Status::BadRequest, "bad_request", e.message(), close);
        return Status::BadRequest;
    }
    let query = target.find('?').map_or("", |at| &target[at..]);
    let mut w = start(out, Status::PermanentRedirect);
    w.header(b"Location", format!("{route}{query}").as_bytes());
    w.finish(b"", close);
    Status::PermanentRedirect
}

/// Whether `path` is one of the dashboard's routes (for the method check).
pub fn is_route(path: &str) -> bool {
    matches!(path, "/" | "/assets/app.js" | "/assets/app.css" | "/assets/icon.svg" | "/api/pools")
        || pool_name(path, "/pools/").is_some()
        || pool_name(path, "/api/pools/").is_some()
}

/// The `{pool}` of `<prefix>{pool}`: one non-empty path segment.
fn pool_name<'p>(path: &'p str, prefix: &str) -> Option<&'p str> {
    path.strip_prefix(prefix).filter(|name| !name.is_empty() && !name.contains('/'))
}

#[cfg(test)]
mod tests {
    use super::listener_url;

    #[test]
    fn a_wildcard_listener_is_shown_as_the_host_the_page_was_reached_by() {
        let at = |addr: &str, host: Option<&[u8]>| listener_url(addr.parse().unwrap(), host);
        assert_eq!(at("127.0.0.1:7070", Some(b"admin.example:7071")), "http://127.0.0.1:7070");
        assert_eq!(at("0.0.0.0:7070", Some(b"gate.example:7071")), "http://gate.example:7070");
        assert_eq!(at("[::]:7070", Some(b"[2001:db8::1]:7071")), "http://[2001:db8::1]:7070");
        assert_eq!(at("0.0.0.0:7070", Some(b"10.0.0.5")), "http://10.0.0.5:7070");
        assert_eq!(at("0.0.0.0:7070", None), "http://0.0.0.0:7070", "no Host (HTTP/1.0): the address as it is");
    }
}
