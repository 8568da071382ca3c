//! Upstream rate-limit headers → numbers (SPEC §7).
//!
//! Owns the reading of the raw upstream response headers a client forwards in a
//! release report: every header dialect the governor learns from (generic/GitHub,
//! X, Discord, OpenAI/Groq/Azure, Anthropic, IETF drafts 06–10, Envoy lists,
//! Shopify, `Retry-After`, `retry-after-ms`) and the small number, duration and
//! date grammars they use. The result is relative milliseconds, with `None` for
//! anything unknown.
//!
//! It must never fail, panic or overflow on any input — a value it cannot read is
//! treated as absent, because a malformed upstream header is no reason to reject a
//! release. It is pure: it never reads the clock (the caller passes `now`) and
//! never allocates.

use std::cmp::Reverse;

use crate::calendar::{self, civil_seconds};

pub use crate::governor::RateInfo;

/// Reads rate-limit information out of raw upstream response headers.
///
/// `headers`: (name, value) pairs in arrival order; names in any case; duplicates possible.
/// `now_epoch_ms`: wall-clock now, used for epoch/date resets and HTTP-date Retry-After.
///
/// Values that do not parse are ignored. Of duplicated values the larger wins.
/// When several dialects describe the request window, each field is taken from the
/// most specific dialect that supplies it (vendor headers, then the IETF
/// `RateLimit` fields, then the generic `x-ratelimit-*` and `x-rate-limit-*`).
pub fn parse_headers<'a, I: IntoIterator<Item = (&'a str, &'a str)>>(headers: I, now_epoch_ms: u64) -> RateInfo {
    let now = now_epoch_ms;
    let mut windows = [Window::default(); WINDOWS];
    let mut rate_limit = Values::default();
    let mut policy = Values::default();
    let mut retry_after_ms = None;
    let mut ms_retry_after_ms = None;
    let mut retry_after = None;

    for (name, value) in headers {
        let Some(slot) = lookup(name) else { continue };
        match slot {
            Slot::Window(w, field) => windows[w].absorb(field, value, now),
            Slot::ShopifyCallLimit => {
                if let Some((used, limit)) = parse_call_limit(value) {
                    let shop = &mut windows[SHOPIFY];
                    keep_max(&mut shop.limit, Some(limit));
                    // Shopify reports calls used; past the limit nothing is left.
                    keep_max(&mut shop.remaining, Some(limit.saturating_sub(used)));
                }
            }
            Slot::RateLimit => rate_limit.push(value),
            Slot::RateLimitPolicy => policy.push(value),
            Slot::RetryAfterMs => {
                keep_max(&mut retry_after_ms, parse_time_list(value, Bare::Millis, now));
            }
            Slot::MsRetryAfterMs => {
                keep_max(&mut ms_retry_after_ms, parse_time_list(value, Bare::Millis, now));
            }
            Slot::RetryAfter => {
                keep_max(&mut retry_after, parse_time_list(value, Bare::Seconds, now));
            }
        }
    }

    let request = windows[ANTHROPIC_REQ]
        .budget()
        .or(windows[OPENAI_REQ].budget())
        .or(windows[SHOPIFY].budget())
        .or(structured_budget(&rate_limit, &policy, now))
        .or(windows[DRAFT06].budget())
        .or(windows[GENERIC].budget())
        .or(windows[X_RATE].budget());
    // Anthropic's combined `tokens-*` set is authoritative; its input/output sets
    // only stand in when it is absent, and then the tighter of the two governs.
    let token = windows[ANTHROPIC_TOK]
        .budget()
        .or(windows[OPENAI_TOK].budget())
        .or(most_restrictive(windows[ANTHROPIC_IN].budget(), windows[ANTHROPIC_OUT].budget()));

    RateInfo {
        limit: request.limit,
        remaining: request.remaining,
        reset_ms: request.reset,
        token_limit: token.limit,
        token_remaining: token.remaining,
        token_reset_ms: token.reset,
        retry_after_ms: retry_after_ms.or(ms_retry_after_ms).or(retry_after),
    }
}

// ---------------------------------------------------------------------------
// Header names

/// Which part of a window a header describes.
#[derive(Debug, Clone, Copy)]
enum Field {
    Limit,
    Remaining,
    Reset,
    /// A reset used only when the dialect's preferred reset header is absent
    /// (Discord's epoch `X-RateLimit-Reset` loses to its relative `Reset-After`,
    /// GitLab's HTTP-date `RateLimit-ResetTime` to `RateLimit-Reset`).
    ResetFallback,
}

#[derive(Debug, Clone, Copy)]
enum Slot {
    Window(usize, Field),
    ShopifyCallLimit,
    RateLimit,
    RateLimitPolicy,
    RetryAfterMs,
    MsRetryAfterMs,
    RetryAfter,
}

const OPENAI_REQ: usize = 0;
const OPENAI_TOK: usize = 1;
const ANTHROPIC_REQ: usize = 2;
const ANTHROPIC_TOK: usize = 3;
const ANTHROPIC_IN: usize = 4;
const ANTHROPIC_OUT: usize = 5;
const DRAFT06: usize = 6;
const GENERIC: usize = 7;
const X_RATE: usize = 8;
const SHOPIFY: usize = 9;
const WINDOWS: usize = 10;

/// Every header name this module reads, lowercase.
const NAMES: &[(&str, Slot)] = &[
    // Generic / GitHub / Discord / Envoy.
    ("x-ratelimit-limit", Slot::Window(GENERIC, Field::Limit)),
    ("x-ratelimit-remaining", Slot::Window(GENERIC, Field::Remaining)),
    ("x-ratelimit-reset-after", Slot::Window(GENERIC, Field::Reset)),
    ("x-ratelimit-reset", Slot::Window(GENERIC, Field::ResetFallback)),
    // OpenAI / Groq / Azure OpenAI.
    ("x-ratelimit-limit-requests", Slot::Window(OPENAI_REQ, Field::Limit)),
    ("x-ratelimit-remaining-requests", Slot::Window(OPENAI_REQ, Field::Remaining)),
    ("x-ratelimit-reset-requests", Slot::Window(OPENAI_REQ, Field::Reset)),
    ("x-ratelimit-limit-tokens", Slot::Window(OPENAI_TOK, Field::Limit)),
    ("x-ratelimit-remaining-tokens", Slot::Window(OPENAI_TOK, Field::Remaining)),
    ("x-ratelimit-reset-tokens", Slot::Window(OPENAI_TOK, Field::Reset)),
    // Anthropic.
    ("anthropic-ratelimit-requests-limit", Slot::Window(ANTHROPIC_REQ, Field::Limit)),
    ("anthropic-ratelimit-requests-remaining", Slot::Window(ANTHROPIC_REQ, Field::Remaining)),
    ("anthropic-ratelimit-requests-reset", Slot::Window(ANTHROPIC_REQ, Field::Reset)),
    ("anthropic-ratelimit-tokens-limit", Slot::Window(ANTHROPIC_TOK, Field::Limit)),
    ("anthropic-ratelimit-tokens-remaining", Slot::Window(ANTHROPIC_TOK, Field::Remaining)),
    ("anthropic-ratelimit-tokens-reset", Slot::Window(ANTHROPIC_TOK, Field::Reset)),
    ("anthropic-ratelimit-input-tokens-limit", Slot::Window(ANTHROPIC_IN, Field::Limit)),
    ("anthropic-ratelimit-input-tokens-remaining", Slot::Window(ANTHROPIC_IN, Field::Remaining)),
    ("anthropic-ratelimit-input-tokens-reset", Slot::Window(ANTHROPIC_IN, Field::Reset)),
    ("anthropic-ratelimit-output-tokens-limit", Slot::Window(ANTHROPIC_OUT, Field::Limit)),
    ("anthropic-ratelimit-output-tokens-remaining", Slot::Window(ANTHROPIC_OUT, Field::Remaining)),
    ("anthropic-ratelimit-output-tokens-reset", Slot::Window(ANTHROPIC_OUT, Field::Reset)),
    // IETF draft-06 (and GitLab, which adds an HTTP-date reset).
    ("ratelimit-limit", Slot::Window(DRAFT06, Field::Limit)),
    ("ratelimit-remaining", Slot::Window(DRAFT06, Field::Remaining)),
    ("ratelimit-reset", Slot::Window(DRAFT06, Field::Reset)),
    ("ratelimit-resettime", Slot::Window(DRAFT06, Field::ResetFallback)),
    // IETF draft-07 dictionary and drafts 08–10 structured lists.
    ("ratelimit", Slot::RateLimit),
    ("ratelimit-policy", Slot::RateLimitPolicy),
    // X (Twitter).
    ("x-rate-limit-limit", Slot::Window(X_RATE, Field::Limit)),
    ("x-rate-limit-remaining", Slot::Window(X_RATE, Field::Remaining)),
    ("x-rate-limit-reset", Slot::Window(X_RATE, Field::Reset)),
    // Shopify.
    ("x-shopify-shop-api-call-limit", Slot::ShopifyCallLimit),
    // Retry hints.
    ("retry-after-ms", Slot::RetryAfterMs),
    ("x-ms-retry-after-ms", Slot::MsRetryAfterMs),
    ("retry-after", Slot::RetryAfter),
];

fn lookup(name: &str) -> Option<Slot> {
    let name = name.trim();
    NAMES.iter().find(|(known, _)| known.eq_ignore_ascii_case(name)).map(|&(_, slot)| slot)
}

// ---------------------------------------------------------------------------
// Windows and budgets

/// What the headers of one dialect said about one window, before resolution.
#[derive(Debug, Clone, Copy, Default)]
struct Window {
    limit: Option<u64>,
    remaining: Option<u64>,
    reset: Option<u64>,
    reset_fallback: Option<u64>,
    /// Azure sends `-1` limits and remaining with a `0` reset for windows it does
    /// not meter; the whole window is a placeholder and says nothing.
    placeholder: bool,
}

impl Window {
    fn absorb(&mut self, field: Field, value: &str, now_ms: u64) {
        match field {
            Field::Limit | Field::Remaining if value.trim() == "-1" => self.placeholder = true,
            Field::Limit => keep_max(&mut self.limit, parse_count(value)),
            Field::Remaining => keep_max(&mut self.remaining, parse_count(value)),
            Field::Reset => {
                keep_max(&mut self.reset, parse_time_list(value, Bare::Seconds, now_ms));
            }
            Field::ResetFallback => keep_max(&mut self.reset_fallback, parse_time_list(value, Bare::Seconds, now_ms)),
        }
    }

    fn budget(&self) -> Budget {
        if self.placeholder {
            return Budget::default();
        }
        Budget { limit: self.limit, remaining: self.remaining, reset: self.reset.or(self.reset_fallback) }
    }
}

/// One resolved window: limit, remaining and relative reset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Budget {
    limit: Option<u64>,
    remaining: Option<u64>,
    reset: Option<u64>,
}

impl Budget {
    /// Field by field, `self` where it knows, else `other`.
    fn or(self, other: Budget) -> Budget {
        Budget {
            limit: self.limit.or(other.limit),
            remaining: self.remaining.or(other.remaining),
            reset: self.reset.or(other.reset),
        }
    }

    fn is_empty(&self) -> bool {
        self.limit.is_none() && self.remaining.is_none() && self.reset.is_none()
    }

    /// Smaller is more restrictive: least remaining, then the longest wait.
    fn rank(&self) -> (u64, Reverse<u64>) {
        (self.remaining.unwrap_or(u64::MAX), Reverse(self.reset.unwrap_or(0)))
    }
}

fn most_restrictive(a: Budget, b: Budget) -> Budget {
    if a.is_empty() || (!b.is_empty() && b.rank() < a.rank()) {
        b
    } else {
        a
    }
}

/// Of duplicated values the larger wins (SPEC §7).
fn keep_max(slot: &mut Option<u64>, value: Option<u64>) {
    if let Some(v) = value {
        *slot = Some(slot.map_or(v, |old| old.max(v)));
    }
}

// ---------------------------------------------------------------------------
// IETF `RateLimit` / `RateLimit-Policy`

/// Header values kept for parsing after all headers are seen, since `RateLimit`
/// items are joined to `RateLimit-Policy` items by name. Values past the capacity
/// are dropped: no real upstream repeats these headers that often.
#[derive(Default)]
struct Values<'a> {
    items: [&'a str; 8],
    len: usize,
}

impl<'a> Values<'a> {
    fn push(&mut self, value: &'a str) {
        if let Some(item) = self.items.get_mut(self.len) {
            *item = value;
            self.len += 1;
        }
    }

    /// All list members of all kept values.
    fn members(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.items[..self.len].iter().flat_map(|value| split_top(value, b','))
    }
}

/// Draft-07's dictionary (`limit=…, remaining=…, reset=…`) becomes one unnamed
/// candidate; drafts 08–10's named items (`"name";r=…;t=…`) one candidate each.
/// The most restrictive candidate wins, and a named winner takes its limit from
/// the `RateLimit-Policy` item of exactly the same name.
fn structured_budget(rate_limit: &Values, policy: &Values, now_ms: u64) -> Budget {
    let mut dictionary = Budget::default();
    let mut best: Option<(Option<&str>, Budget)> = None;
    for member in rate_limit.members() {
        let mut parts = split_top(member, b';');
        let bare = parts.next().unwrap_or("").trim();
        if !bare.starts_with('"') {
            if let Some((key, value)) = bare.split_once('=') {
                let key = key.trim();
                if key.eq_ignore_ascii_case("limit") {
                    keep_max(&mut dictionary.limit, parse_uint(value.trim()));
                } else if key.eq_ignore_ascii_case("remaining") {
                    keep_max(&mut dictionary.remaining, parse_uint(value.trim()));
                } else if key.eq_ignore_ascii_case("reset") {
                    keep_max(&mut dictionary.reset, parse_time(value.trim(), Bare::Seconds, now_ms));
                }
                continue;
            }
        }
        let Some(name) = item_name(bare) else {
            continue;
        };
        let mut item = Budget::default();
        for (key, value) in params(parts) {
            if key == "r" {
                keep_max(&mut item.remaining, parse_uint(value));
            } else if key == "t" {
                keep_max(&mut item.reset, parse_time(value, Bare::Seconds, now_ms));
            }
        }
        if !item.is_empty() && best.is_none_or(|(_, kept)| item.rank() < kept.rank()) {
            best = Some((Some(name), item));
        }
    }
    if !dictionary.is_empty() && best.is_none_or(|(_, kept)| dictionary.rank() < kept.rank()) {
        best = Some((None, dictionary));
    }
    let Some((name, mut budget)) = best else {
        return Budget::default();
    };
    if let Some(name) = name {
        budget.limit = policy_quota(policy, name);
    }
    budget
}

/// The quota `q` of the policy named exactly `name`.
fn policy_quota(policy: &Values, name: &str) -> Option<u64> {
    let mut quota = None;
    for member in policy.members() {
        let mut parts = split_top(member, b';');
        if item_name(parts.next().unwrap_or("").trim()) != Some(name) {
            continue;
        }
        for (key, value) in params(parts) {
            if key == "q" {
                keep_max(&mut quota, parse_uint(value));
            }
        }
    }
    quota
}

/// The name of a structured-field item: a quoted string (compared raw, escapes
/// and all) or, leniently, a bare token.
fn item_name(bare: &str) -> Option<&str> {
    if let Some(quoted) = bare.strip_prefix('"') {
        return quoted.strip_suffix('"');
    }
    let token =
        !bare.is_empty() && bare.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&b));
    token.then_some(bare)
}

/// `key=value` parameters, trimmed; parameters without a value are skipped.
fn params<'a>(parts: impl Iterator<Item = &'a str>) -> impl Iterator<Item = (&'a str, &'a str)> {
    parts.filter_map(|p| p.split_once('=').map(|(k, v)| (k.trim(), v.trim())))
}

/// Splits on `sep` outside double-quoted strings. Every split point is an ASCII
/// byte, so every slice stays on a character boundary.
fn split_top(s: &str, sep: u8) -> TopSplit<'_> {
    TopSplit { rest: Some(s), sep }
}

struct TopSplit<'a> {
    rest: Option<&'a str>,
    sep: u8,
}

impl<'a> Iterator for TopSplit<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let s = self.rest?;
        let (mut quoted, mut escaped) = (false, false);
        for (i, &b) in s.as_bytes().iter().enumerate() {
            if quoted {
                if escaped {
                    escaped = false;
                } else if b == b'\\' {
                    escaped = true;
                } else if b == b'"' {
                    quoted = false;
                }
            } else if b == b'"' {
                quoted = true;
            } else if b == self.sep {
                self.rest = s.get(i + 1..);
                return s.get(..i);
            }
        }
        self.rest = None;
        Some(s)
    }
}

// ---------------------------------------------------------------------------
// Counts

/// A count, or a list of counts. Envoy's `10, 10;w=60` puts the limit in force
/// first and describes quota policies in parameterised members, so members
/// without parameters win; among them (joined duplicates) the larger wins.
fn parse_count(value: &str) -> Option<u64> {
    let mut bare = None;
    let mut described = None;
    for member in value.split(',') {
        match member.split_once(';') {
            Some((item, _)) => keep_max(&mut described, parse_uint(item.trim())),
            None => keep_max(&mut bare, parse_uint(member.trim())),
        }
    }
    bare.or(described)
}

fn parse_uint(s: &str) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.bytes().try_fold(0u64, |acc, b| {
        if b.is_ascii_digit() {
            acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
        } else {
            None
        }
    })
}

/// Shopify's `used/limit`.
fn parse_call_limit(value: &str) -> Option<(u64, u64)> {
    let (used, limit) = value.split_once('/')?;
    Some((parse_uint(used.trim())?, parse_uint(limit.trim())?))
}

// ---------------------------------------------------------------------------
// Times

const NS_PER_MS: u128 = 1_000_000;
const NS_PER_SEC: u128 = 1_000_000_000;

/// The unit of a number written without one.
#[derive(Debug, Clone, Copy)]
enum Bare {
    Seconds,
    Millis,
}

/// A time value, or a comma list of them (joined duplicates): the larger wins.
/// An HTTP-date carries a comma of its own, so a member that does not parse is
/// retried joined with the next one.
fn parse_time_list(value: &str, bare: Bare, now_ms: u64) -> Option<u64> {
    let comma_from = |from: usize| value.get(from..).and_then(|s| s.find(',')).map(|i| from + i);
    let member = |from: usize, to: usize| {
        let s = value.get(from..to).unwrap_or("");
        // Parameters (`60;w=…`) describe the value, they are not part of it.
        s.split(';').next().unwrap_or("").trim()
    };
    let mut best = None;
    let mut start = 0;
    while start <= value.len() {
        let end = comma_from(start).unwrap_or(value.len());
        let mut next = end + 1;
        let mut got = parse_time(member(start, end), bare, now_ms);
        if got.is_none() && end < value.len() {
            let joined_end = comma_from(end + 1).unwrap_or(value.len());
            got = parse_time(member(start, joined_end), bare, now_ms);
            if got.is_some() {
                next = joined_end + 1;
            }
        }
        keep_max(&mut best, got);
        start = next;
    }
    best
}

/// One time value as relative milliseconds: a bare number (seconds or
/// milliseconds, or an epoch instant when large), a Go duration, an RFC 3339
/// timestamp or an HTTP-date. Instants in the past give `0`.
fn parse_time(s: &str, bare: Bare, now_ms: u64) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let now_ns = i128::from(now_ms) * NS_PER_MS as i128;
    if s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return parse_bare(s.as_bytes(), bare, now_ns);
    }
    if let Some(ns) = parse_go_duration(s.as_bytes()) {
        return ns_to_ms(ns);
    }
    let at = parse_rfc3339(s.as_bytes()).or_else(|| parse_http_date(s, now_ms))?;
    until(at, now_ns)
}

/// Large bare numbers are instants, not delays (SPEC §7): above 1e12 they are
/// epoch milliseconds, above 1e9 (seconds only) epoch seconds.
fn parse_bare(digits: &[u8], bare: Bare, now_ns: i128) -> Option<u64> {
    match bare {
        Bare::Seconds => {
            let ns = parse_decimal(digits, NS_PER_SEC)?;
            if ns > 1_000_000_000_000 * NS_PER_SEC {
                until(i128::try_from(parse_decimal(digits, NS_PER_MS)?).ok()?, now_ns)
            } else if ns > 1_000_000_000 * NS_PER_SEC {
                until(i128::try_from(ns).ok()?, now_ns)
            } else {
                ns_to_ms(ns)
            }
        }
        Bare::Millis => {
            let ns = parse_decimal(digits, NS_PER_MS)?;
            if ns > 1_000_000_000_000 * NS_PER_MS {
                until(i128::try_from(ns).ok()?, now_ns)
            } else {
                ns_to_ms(ns)
            }
        }
    }
}

/// Relative milliseconds from now to an instant, clamped at 0 for the past.
fn until(at_ns: i128, now_ns: i128) -> Option<u64> {
    let delta = at_ns.checked_sub(now_ns)?;
    ns_to_ms(u128::try_from(delta).unwrap_or(0))
}

/// Rounds up: a reset reported early would let the governor grant before the
/// upstream window has refilled (`500µs` → 1 ms).
fn ns_to_ms(ns: u128) -> Option<u64> {
    u64::try_from(ns.div_ceil(NS_PER_MS)).ok()
}

/// `digits[.digits]` times `unit_ns`, in nanoseconds rounded up; `None` on
/// overflow. Fraction digits past the 18th only matter for the rounding.
fn parse_decimal(s: &[u8], unit_ns: u128) -> Option<u128> {
    let (int, frac) = match s.iter().position(|&b| b == b'.') {
        Some(dot) => (&s[..dot], &s[dot + 1..]),
        None => (s, &[][..]),
    };
    if (int.is_empty() && frac.is_empty()) || !int.iter().chain(frac).all(u8::is_ascii_digit) {
        return None;
    }
    let mut whole: u128 = 0;
    for &d in int {
        whole = whole.checked_mul(10)?.checked_add(u128::from(d - b'0'))?;
    }
    let (mut numerator, mut scale, mut sticky) = (0u128, 1u128, false);
    for (i, &d) in frac.iter().enumerate() {
        if i < 18 {
            numerator = numerator * 10 + u128::from(d - b'0');
            scale *= 10;
        } else if d != b'0' {
            sticky = true;
        }
    }
    // numerator < 1e18 and unit_ns <= 3.6e12 (one hour), so this cannot overflow.
    let scaled = numerator * unit_ns;
    let frac_ns = scaled / scale + u128::from(!scaled.is_multiple_of(scale) || sticky);
    whole.checked_mul(unit_ns)?.checked_add(frac_ns)
}

/// Go's `time.Duration` text: one or more `number unit` pairs, e.g. `1h2m3.5s`.
fn parse_go_duration(s: &[u8]) -> Option<u128> {
    let is_num = |b: &u8| b.is_ascii_digit() || *b == b'.';
    let mut rest = s;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let num_len = rest.iter().take_while(|b| is_num(b)).count();
        let (num, after) = rest.split_at(num_len);
        let unit_len = after.iter().take_while(|b| !is_num(b)).count();
        let (unit, after) = after.split_at(unit_len);
        let unit_ns = match unit {
            b"ns" => 1,
            b"us" | [0xC2, 0xB5, b's'] | [0xCE, 0xBC, b's'] => 1_000,
            b"ms" => NS_PER_MS,
            b"s" => NS_PER_SEC,
            b"m" => 60 * NS_PER_SEC,
            b"h" => 3_600 * NS_PER_SEC,
            _ => return None,
        };
        total = total.checked_add(parse_decimal(num, unit_ns)?)?;
        rest = after;
    }
    (!s.is_empty()).then_some(total)
}

/// `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` as epoch nanoseconds.
fn parse_rfc3339(b: &[u8]) -> Option<i128> {
    let at = |i: usize| b.get(i).copied();
    let year = fixed_digits(b, 0, 4)?;
    let month = fixed_digits(b, 5, 2)?;
    let day = fixed_digits(b, 8, 2)?;
    let hour = fixed_digits(b, 11, 2)?;
    let minute = fixed_digits(b, 14, 2)?;
    let second = fixed_digits(b, 17, 2)?;
    if at(4) != Some(b'-')
        || at(7) != Some(b'-')
        || !matches!(at(10), Some(b'T' | b't' | b' '))
        || at(13) != Some(b':')
        || at(16) != Some(b':')
    {
        return None;
    }
    let mut i = 19;
    let mut frac_ns = 0;
    if at(i) == Some(b'.') {
        let digits = b.get(i + 1..)?.iter().take_while(|d| d.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        frac_ns = parse_decimal(b.get(i..i + 1 + digits)?, NS_PER_SEC)?;
        i += 1 + digits;
    }
    let offset_secs: i64 = match at(i)? {
        b'Z' | b'z' if b.len() == i + 1 => 0,
        sign @ (b'+' | b'-') if b.len() == i + 6 && at(i + 3) == Some(b':') => {
            let (h, m) = (fixed_digits(b, i + 1, 2)?, fixed_digits(b, i + 4, 2)?);
            if h > 23 || m > 59 {
                return None;
            }
            let secs = i64::from(h * 3_600 + m * 60);
            if sign == b'+' {
                secs
            } else {
                -secs
            }
        }
        _ => return None,
    };
    let secs = civil_seconds(i64::from(year), month, day, hour, minute, second)? - offset_secs;
    Some(i128::from(secs) * NS_PER_SEC as i128 + i128::try_from(frac_ns).ok()?)
}

const SHORT_DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
const LONG_DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

/// An HTTP-date (RFC 9110 §5.6.7) in any of its three forms, as epoch nanoseconds:
/// IMF-fixdate `Sun, 06 Nov 1994 08:49:37 GMT`, RFC 850 `Sunday, 06-Nov-94
/// 08:49:37 GMT`, asctime `Sun Nov  6 08:49:37 1994`. `now_ms` places RFC 850's
/// two-digit year.
fn parse_http_date(s: &str, now_ms: u64) -> Option<i128> {
    let mut parts = [""; 6];
    let mut n = 0;
    for part in s.split_ascii_whitespace() {
        *parts.get_mut(n)? = part;
        n += 1;
    }
    let is_day = |names: &[&str], s: &str| names.iter().any(|d| d.eq_ignore_ascii_case(s));
    let (year, month, day, time) = match (n, parts) {
        (6, [weekday, day, month, year, time, zone]) => {
            if !is_day(&SHORT_DAYS, weekday.strip_suffix(',')?) || zone != "GMT" || year.len() != 4 {
                return None;
            }
            (i64::from(fixed_digits(year.as_bytes(), 0, 4)?), month, day, time)
        }
        (4, [weekday, date, time, zone, ..]) => {
            if !is_day(&LONG_DAYS, weekday.strip_suffix(',')?) || zone != "GMT" {
                return None;
            }
            let mut dmy = date.split('-');
            let (day, month, year) = (dmy.next()?, dmy.next()?, dmy.next()?);
            if dmy.next().is_some() {
                return None;
            }
            let year = match year.len() {
                2 => full_year(parse_uint(year)?, now_ms)?,
                4 => i64::from(fixed_digits(year.as_bytes(), 0, 4)?),
                _ => return None,
            };
            (year, month, day, time)
        }
        (5, [weekday, month, day, time, year, _]) => {
            if !is_day(&SHORT_DAYS, weekday) || year.len() != 4 {
                return None;
            }
            (i64::from(fixed_digits(year.as_bytes(), 0, 4)?), month, day, time)
        }
        _ => return None,
    };
    let month = MONTHS.iter().position(|m| m.eq_ignore_ascii_case(month)).and_then(|i| u32::try_from(i + 1).ok())?;
    if day.is_empty() || day.len() > 2 {
        return None;
    }
    let day = u32::try_from(parse_uint(day)?).ok()?;
    let t = time.as_bytes();
    if t.len() != 8 || t.get(2) != Some(&b':') || t.get(5) != Some(&b':') {
        return None;
    }
    let (hour, minute, second) = (fixed_digits(t, 0, 2)?, fixed_digits(t, 3, 2)?, fixed_digits(t, 6, 2)?);
    let secs = civil_seconds(year, month, day, hour, minute, second)?;
    Some(i128::from(secs) * NS_PER_SEC as i128)
}

/// RFC 9110: a two-digit year that would lie more than 50 years in the future
/// belongs to the previous century.
fn full_year(two_digits: u64, now_ms: u64) -> Option<i64> {
    let now_days = i64::try_from(now_ms / 86_400_000).ok()?;
    let now_year = calendar::civil_from_days(now_days).0;
    let year = now_year - now_year.rem_euclid(100) + i64::try_from(two_digits).ok()?;
    Some(if year > now_year + 50 { year - 100 } else { year })
}

/// `n` ASCII digits at `from`, exactly.
fn fixed_digits(b: &[u8], from: usize, n: usize) -> Option<u32> {
    b.get(from..from.checked_add(n)?)?
        .iter()
        .try_fold(0u32, |acc, &d| d.is_ascii_digit().then(|| acc * 10 + u32::from(d - b'0')))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    const VECTORS: &str = include_str!("../../tests/data/ratelimit-vectors.json");

    fn vectors() -> Value {
        serde_json::from_str(VECTORS).expect("ratelimit-vectors.json is valid JSON")
    }

    fn field(info: &RateInfo, name: &str) -> Option<u64> {
        match name {
            "limit" => info.limit,
            "remaining" => info.remaining,
            "resetMs" => info.reset_ms,
            "tokenLimit" => info.token_limit,
            "tokenRemaining" => info.token_remaining,
            "tokenResetMs" => info.token_reset_ms,
            "retryAfterMs" => info.retry_after_ms,
            other => panic!("vector expects unknown field {other}"),
        }
    }

    fn http_date_ms(date: &str) -> u64 {
        let ns = parse_http_date(date, 0).unwrap_or_else(|| panic!("bad date {date}"));
        u64::try_from(ns / NS_PER_MS as i128).expect("date after the epoch")
    }

    /// Checks one vector of the reference table; fields absent from `expect` are
    /// not constrained by it.
    fn check_vector(id: &str) {
        let all = vectors();
        let v = all["vectors"]
            .as_array()
            .expect("vectors array")
            .iter()
            .find(|v| v["id"] == id)
            .unwrap_or_else(|| panic!("no vector {id}"));
        let now = match v["now"].as_str() {
            Some(date) => http_date_ms(date),
            None => all["conventions"]["nowMs"].as_u64().expect("nowMs"),
        };
        if let Some(cases) = v["cases"].as_array() {
            let (header, name) = match id {
                "bare-reset-heuristic" => ("x-ratelimit-reset", "resetMs"),
                _ if id.starts_with("retry-after") => ("Retry-After", "retryAfterMs"),
                _ => panic!("vector {id}: no rule for which header its cases feed"),
            };
            for case in cases {
                let value = case[0].as_str().expect("case value");
                let info = parse_headers([(header, value)], now);
                assert_eq!(field(&info, name), case[1].as_u64(), "{id}: {header}: {value:?}");
            }
            return;
        }
        let pairs: Vec<(&str, &str)> = match &v["headers"] {
            Value::Object(map) => map.iter().map(|(k, v)| (k.as_str(), v.as_str().expect("header value"))).collect(),
            Value::Array(list) => {
                list.iter().map(|p| (p[0].as_str().expect("name"), p[1].as_str().expect("value"))).collect()
            }
            other => panic!("vector {id}: headers {other}"),
        };
        let info = parse_headers(pairs.iter().copied(), now);
        let expect = v["expect"].as_object().expect("expect object");
        for (name, want) in expect {
            assert_eq!(field(&info, name), want.as_u64(), "{id}: {name} in {info:?}");
        }
        // Arrival order must not matter for any of these sets.
        let reversed = parse_headers(pairs.iter().rev().copied(), now);
        assert_eq!(info, reversed, "{id}: order dependence");
    }

    macro_rules! vector_tests {
        ($($test:ident => $id:literal,)*) => {
            $(
                #[test]
                fn $test() {
                    check_vector($id);
                }
            )*
            const COVERED: &[&str] = &[$($id),*];
        };
    }

    vector_tests! {
        vector_openai_docs => "openai-docs",
        vector_openai_real_ms => "openai-real-ms",
        vector_groq_fractional => "groq-fractional",
        vector_go_duration_edge => "go-duration-edge",
        vector_azure_429 => "azure-429",
        vector_azure_sentinel => "azure-sentinel",
        vector_azure_int_reset => "azure-int-reset",
        vector_anthropic_fixture_past => "anthropic-fixture-past",
        vector_anthropic_429 => "anthropic-429",
        vector_anthropic_input_only => "anthropic-input-only",
        vector_github_primary => "github-primary",
        vector_github_secondary_real => "github-secondary-real",
        vector_github_403_retry => "github-403-retry",
        vector_x_twitter => "x-twitter",
        vector_discord_user_429 => "discord-user-429",
        vector_discord_shared_429 => "discord-shared-429",
        vector_ietf_06 => "ietf-06",
        vector_ietf_07 => "ietf-07",
        vector_ietf_08_10 => "ietf-08-10",
        vector_ietf_multi_policy => "ietf-multi-policy",
        vector_ietf_no_t => "ietf-no-t",
        vector_cloudflare_doc => "cloudflare-doc",
        vector_envoy_draft03 => "envoy-draft03",
        vector_gitlab_epoch_reset => "gitlab-epoch-reset",
        vector_shopify => "shopify",
        vector_retry_after_dates => "retry-after-dates",
        vector_retry_after_invalid => "retry-after-invalid",
        vector_retry_after_ms_precedence => "retry-after-ms-precedence",
        vector_retry_after_ms_zero => "retry-after-ms-zero",
        vector_duplicate_retry_after => "duplicate-retry-after",
        vector_case_insensitive => "case-insensitive",
        vector_stripe_429 => "stripe-429",
        vector_bare_reset_heuristic => "bare-reset-heuristic",
    }

    /// A vector added to the table without a test here would silently go unchecked.
    #[test]
    fn every_vector_has_a_test() {
        let all = vectors();
        let ids: Vec<&str> =
            all["vectors"].as_array().expect("vectors array").iter().map(|v| v["id"].as_str().expect("id")).collect();
        assert_eq!(ids, COVERED);
    }

    const NOW: u64 = 1_696_004_797_000;

    fn one(name: &str, value: &str) -> RateInfo {
        parse_headers([(name, value)], NOW)
    }

    #[test]
    fn go_durations() {
        let ms = |s: &str| parse_go_duration(s.as_bytes()).and_then(ns_to_ms);
        assert_eq!(ms("6m0s"), Some(360_000));
        assert_eq!(ms("1h2m3.5s"), Some(3_723_500));
        assert_eq!(ms("500µs"), Some(1));
        assert_eq!(ms("500μs"), Some(1));
        assert_eq!(ms("1500us"), Some(2));
        assert_eq!(ms("1ns"), Some(1));
        assert_eq!(ms("0s"), Some(0));
        assert_eq!(ms(".5s"), Some(500));
        assert_eq!(ms("0.0000000000000000000001s"), Some(1));
        for bad in ["", "1", "1x", "-1s", "1.2.3s", "s", "1h5", "1S", "inf", "nans"] {
            assert_eq!(ms(bad), None, "{bad:?}");
        }
        assert_eq!(ms("99999999999999999999999999999999999999h"), None);
    }

    #[test]
    fn http_dates_in_all_three_forms() {
        let at = |s: &str| parse_http_date(s, NOW).map(|ns| ns / NS_PER_SEC as i128);
        let want = Some(784_111_777);
        assert_eq!(at("Sun, 06 Nov 1994 08:49:37 GMT"), want);
        assert_eq!(at("Sunday, 06-Nov-94 08:49:37 GMT"), want);
        assert_eq!(at("Sun Nov  6 08:49:37 1994"), want);
        // RFC 850 years more than 50 years ahead belong to the previous century.
        assert_eq!(at("Thursday, 01-Jan-70 00:00:00 GMT"), Some(3_155_760_000));
        assert_eq!(at("Tuesday, 01-Jan-74 00:00:00 GMT"), Some(126_230_400));
        assert_eq!(at("Monday, 01-Jan-80 00:00:00 GMT"), Some(315_532_800));
        for bad in [
            "Sun, 31 Feb 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 24:00:00 GMT",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sun, 06 Nov 94 08:49:37 GMT",
            "Sun 06 Nov 1994 08:49:37 GMT",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 08:49 GMT",
            "Sun, 06 Nov 1994 08:49:37 GMT extra",
        ] {
            assert_eq!(at(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn rfc3339_offsets_and_fractions() {
        let reset = |v: &str| one("anthropic-ratelimit-requests-reset", v).reset_ms;
        assert_eq!(reset("2023-09-29T16:27:37Z"), Some(60_000));
        assert_eq!(reset("2023-09-29T18:27:37+02:00"), Some(60_000));
        assert_eq!(reset("2023-09-29T16:26:37.0001Z"), Some(1));
        assert_eq!(reset("2000-01-01T00:00:00Z"), Some(0));
        assert_eq!(reset("2023-09-29T16:27:37"), None);
        assert_eq!(reset("2023-13-29T16:27:37Z"), None);
        assert_eq!(reset("2023-09-29T16:27:37.Z"), None);
    }

    #[test]
    fn placeholder_window_says_nothing_but_zero_counts_are_real() {
        let info = parse_headers(
            [
                ("x-ratelimit-limit-requests", "-1"),
                ("x-ratelimit-reset-requests", "0"),
                ("x-ratelimit-remaining-tokens", "0"),
                ("x-ratelimit-reset-tokens", "0s"),
            ],
            NOW,
        );
        assert_eq!((info.limit, info.reset_ms), (None, None));
        assert_eq!((info.token_remaining, info.token_reset_ms), (Some(0), Some(0)));
    }

    #[test]
    fn retry_after_precedence_falls_through_invalid_values() {
        let info =
            parse_headers([("retry-after-ms", "soon"), ("x-ms-retry-after-ms", "1500.5"), ("retry-after", "9")], NOW);
        assert_eq!(info.retry_after_ms, Some(1501));
        assert_eq!(one("retry-after", "5, 10").retry_after_ms, Some(10_000));
        assert_eq!(
            one("retry-after", "Fri, 29 Sep 2023 16:26:57 GMT, Fri, 29 Sep 2023 16:27:07 GMT").retry_after_ms,
            Some(30_000)
        );
    }

    #[test]
    fn structured_fields_join_by_exact_name_and_pick_the_tightest() {
        let info = parse_headers(
            [
                ("RateLimit-Policy", "\"a,b\";q=10;w=1, \"day\";q=1000;w=86400"),
                ("RateLimit", "\"a,b\";r=3;t=1, \"day\";r=3;t=600"),
            ],
            NOW,
        );
        // Equal remaining: the longer reset governs.
        assert_eq!((info.limit, info.remaining, info.reset_ms), (Some(1000), Some(3), Some(600_000)));
        let info = one("RateLimit", "\"q\";r=-5;t=x");
        assert_eq!(info, RateInfo::default());
    }

    #[test]
    fn shopify_over_the_limit_has_nothing_left() {
        let info = one("x-shopify-shop-api-call-limit", "41/40");
        assert_eq!((info.limit, info.remaining), (Some(40), Some(0)));
        assert_eq!(one("x-shopify-shop-api-call-limit", "40"), RateInfo::default());
    }

    #[test]
    fn anthropic_split_tokens_take_the_tighter_set() {
        let info = parse_headers(
            [
                ("anthropic-ratelimit-input-tokens-limit", "80000"),
                ("anthropic-ratelimit-input-tokens-remaining", "500"),
                ("anthropic-ratelimit-output-tokens-limit", "16000"),
                ("anthropic-ratelimit-output-tokens-remaining", "9000"),
            ],
            NOW,
        );
        assert_eq!((info.token_limit, info.token_remaining), (Some(80_000), Some(500)));
    }

    #[test]
    fn extremes_neither_overflow_nor_wrap() {
        assert_eq!(one("x-ratelimit-remaining", "18446744073709551615").remaining, Some(u64::MAX));
        assert_eq!(one("x-ratelimit-remaining", "18446744073709551616").remaining, None);
        // Read as epoch milliseconds, far in the future.
        let epoch_ms = one("x-ratelimit-reset", "18446744073709551615").reset_ms;
        assert_eq!(epoch_ms, Some(u64::MAX - NOW));
        let far = parse_headers([("x-ratelimit-reset", "9999999999999999999")], 0);
        assert_eq!(far.reset_ms, Some(9_999_999_999_999_999_999));
        // Further out than u64 milliseconds can say: unknown, not wrapped.
        let beyond = parse_headers([("x-ratelimit-reset", "99999999999999999999")], 0);
        assert_eq!(beyond.reset_ms, None);
        assert_eq!(one("retry-after-ms", "99999999999999999999999").retry_after_ms, None);
        let late = parse_headers(
            [
                ("x-ratelimit-reset", "1696004857"),
                ("retry-after", "Friday, 29-Sep-23 16:26:57 GMT"),
                ("anthropic-ratelimit-requests-reset", "9999-12-31T23:59:60Z"),
            ],
            u64::MAX,
        );
        assert_eq!(late.reset_ms, Some(0));
        // Near the end of u64 time the two-digit year lands in a later century.
        assert!(late.retry_after_ms.is_some());
        assert_eq!(one("retry-after", "1e3").retry_after_ms, None);
    }

    /// Deterministic xorshift64; the fuzzer must be reproducible.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            usize::try_from(self.next() % n as u64).unwrap_or(0)
        }
    }

    /// Fragments of every grammar, so random values reach deep into each parser.
    const FRAGMENTS: &[&str] = &[
        "0",
        "1",
        "9",
        "-1",
        "60",
        ".",
        "..",
        ",",
        ", ",
        ";",
        "=",
        "\"",
        "\\",
        ":",
        "/",
        " ",
        "s",
        "m",
        "h",
        "ms",
        "us",
        "µs",
        "μs",
        "ns",
        "T",
        "Z",
        "+",
        "-",
        "GMT",
        "Fri,",
        "Friday,",
        "Fri",
        "Sep",
        "29",
        "29-Sep-23",
        "2023",
        "16:26:57",
        "2023-09-29",
        "T16:26:57",
        ".250",
        "+02:00",
        "r=",
        "t=",
        "q=",
        "w=",
        "limit=",
        "reset=",
        "remaining=",
        "\"default\"",
        "pk=:YQ==:",
        "1696004857",
        "1696004857000",
        "99999999999999999999999999999999999999999",
        "1470173023.123",
        "é",
        "\u{0}",
        "∞",
    ];

    #[test]
    fn never_panics_on_random_values() {
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        let nows = [0, 1, NOW, u64::MAX / 2, u64::MAX];
        for round in 0..4_000 {
            let value = if round % 2 == 0 {
                let bytes: Vec<u8> = (0..rng.below(48)).map(|_| rng.next() as u8).collect();
                String::from_utf8_lossy(&bytes).into_owned()
            } else {
                (0..rng.below(14)).map(|_| FRAGMENTS[rng.below(FRAGMENTS.len())]).collect()
            };
            let now = if round % 3 == 0 { rng.next() } else { nows[rng.below(nows.len())] };
            for &(name, _) in NAMES {
                let info = parse_headers([(name, value.as_str())], now);
                let upper = name.to_ascii_uppercase();
                assert_eq!(info, parse_headers([(upper.as_str(), value.as_str())], now));
            }
            let every = NAMES.iter().map(|&(name, _)| (name, value.as_str()));
            let _ = parse_headers(every, now);
            let _ = parse_headers([(value.as_str(), value.as_str())], now);
        }
    }
}
