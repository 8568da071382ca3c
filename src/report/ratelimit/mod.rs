//! Upstream rate-limit headers → numbers (SPEC §7).
//!
//! Owns the reading of the raw upstream response headers a client forwards in a
//! release report: every header dialect the governor learns from (generic/GitHub,
//! X, Discord, OpenAI/Groq/Azure, Anthropic, IETF drafts 06–10, Envoy lists,
//! Shopify, `Retry-After`, `retry-after-ms`) and the small number, duration and
//! date grammars they use. The result is relative milliseconds, with `None` for
//! anything unknown.
//!
//! This file holds the dialects — which header names mean what, and how the
//! windows they describe resolve to one budget; the grammars are beside it:
//! `structured` (the IETF structured fields), `values` (counts and
//! durations) and `dates` (RFC 3339 and HTTP dates).
//!
//! It must never fail, panic or overflow on any input — a value it cannot read is
//! treated as absent, because a malformed upstream header is no reason to reject a
//! release. It is pure: it never reads the clock (the caller passes `now`) and
//! never allocates.

use std::cmp::Reverse;

use crate::calendar::{self, civil_seconds};

pub use crate::governor::RateInfo;
use dates::*;
use structured::*;
use values::*;

mod dates;
mod structured;
mod values;

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
                keep_max(&mut retry_after_ms, parse_time_list(value, Bare::Millis, now).map(|t| t.ms));
            }
            Slot::MsRetryAfterMs => {
                keep_max(&mut ms_retry_after_ms, parse_time_list(value, Bare::Millis, now).map(|t| t.ms));
            }
            Slot::RetryAfter => {
                keep_max(&mut retry_after, parse_time_list(value, Bare::Seconds, now).map(|t| t.ms));
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
        reset_ms: request.reset.map(|t| t.ms),
        reset_coarse: request.reset.is_some_and(|t| t.coarse),
        reset_instant: request.reset.is_some_and(|t| t.instant),
        token_limit: token.limit,
        token_remaining: token.remaining,
        token_reset_ms: token.reset.map(|t| t.ms),
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

/// The header `name` (in any case, around white space) as `parse_headers`
/// knows it, if it reads it: a report's reader keeps only the values that
/// can say something.
pub fn name_of(name: &str) -> Option<&'static str> {
    let name = name.trim();
    NAMES.iter().find(|(known, _)| known.eq_ignore_ascii_case(name)).map(|&(known, _)| known)
}

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
    reset: Option<Time>,
    reset_fallback: Option<Time>,
    /// A count was `-1`, which says it is unknown. Azure sends `-1` limits and
    /// remaining with a `0` reset for windows it does not meter: a window
    /// with no count that is known is a placeholder, its reset included, and
    /// says nothing; a known count beside a `-1` one still counts.
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
        if self.placeholder && self.limit.is_none() && self.remaining.is_none() {
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
    reset: Option<Time>,
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
        (self.remaining.unwrap_or(u64::MAX), Reverse(self.reset.map_or(0, |t| t.ms)))
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
fn keep_max<T: Ord + Copy>(slot: &mut Option<T>, value: Option<T>) {
    if let Some(v) = value {
        *slot = Some(slot.map_or(v, |old| old.max(v)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    const VECTORS: &str = include_str!("../../../tests/data/ratelimit-vectors.json");

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

    /// A reset to the whole second may be up to a second late; the governor
    /// is told so, whatever `now`'s milliseconds.
    #[test]
    fn resets_to_the_whole_second_are_coarse() {
        let coarse = |name: &str, v: &str, now: u64| parse_headers([(name, v)], now).reset_coarse;
        let date = "anthropic-ratelimit-requests-reset";
        assert!(coarse(date, "2023-09-29T16:27:37Z", NOW + 123));
        assert!(coarse(date, "2023-09-29T16:27:37.000Z", NOW + 999));
        assert!(!coarse(date, "2023-09-29T16:27:37.250Z", NOW + 123));
        assert!(coarse("ratelimit-reset", "5", NOW + 7));
        assert!(coarse("x-ratelimit-reset", "1696004850", NOW + 7));
        assert!(!coarse("x-ratelimit-reset-requests", "5.25s", NOW + 7));
        assert!(!coarse("x-ratelimit-remaining", "5", NOW));
        // Of those, an instant is one whenever it was said; seconds to go count from the stamp.
        let instant = |name: &str, v: &str, now: u64| parse_headers([(name, v)], now).reset_instant;
        assert!(instant(date, "2023-09-29T16:27:37Z", NOW + 123));
        assert!(instant("x-ratelimit-reset", "1696004850", NOW + 7));
        assert!(!instant("ratelimit-reset", "5", NOW + 7));
        assert!(!instant("x-ratelimit-reset-requests", "5.25s", NOW + 7));
    }

    /// What a reset was said as is read from its form, never from where
    /// `now` falls: seconds to go that happen to end on a second's boundary
    /// (about one report in a thousand) are no instant, and a duration
    /// with a fraction that ends on one is not said to the whole second.
    #[test]
    fn a_resets_kind_does_not_depend_on_where_now_falls() {
        let kind = |name: &str, v: &str, now: u64| {
            let info = parse_headers([(name, v)], now);
            (info.reset_ms, info.reset_coarse, info.reset_instant)
        };
        for now in [NOW, NOW + 7, NOW + 500] {
            assert_eq!(kind("x-ratelimit-reset", "5", now), (Some(5000), true, false), "{now}");
            assert_eq!(kind("ratelimit-reset", "60", now), (Some(60_000), true, false), "{now}");
            assert_eq!(kind("x-ratelimit-reset-requests", "6m0s", now), (Some(360_000), true, false), "{now}");
            assert_eq!(kind("RateLimit", "\"q\";r=1;t=5", now), (Some(5000), true, false), "{now}");
        }
        for now in [NOW + 500, NOW + 750] {
            let want = 2500 + NOW + 500 - now;
            let ms = want.to_string() + "ms";
            assert_eq!(kind("x-ratelimit-reset-requests", &ms, now), (Some(want), false, false), "{now}");
        }
        assert_eq!(kind("x-ratelimit-reset-requests", "2.5s", NOW + 500), (Some(2500), false, false));
        // Instants on a second's boundary are instants, whenever read.
        for now in [NOW, NOW + 1, NOW + 999] {
            let date = kind("anthropic-ratelimit-requests-reset", "2023-09-29T16:27:37Z", now);
            assert_eq!(date, (Some(NOW + 60_000 - now), true, true), "{now}");
            let epoch = kind("x-ratelimit-reset", "1696004857", now);
            assert_eq!(epoch, (Some(NOW + 60_000 - now), true, true), "{now}");
            let epoch_ms = kind("x-ratelimit-reset", "1696004857000", now);
            assert_eq!(epoch_ms, (Some(NOW + 60_000 - now), true, true), "{now}");
        }
        // An instant between seconds is said to the millisecond.
        let date = kind("anthropic-ratelimit-requests-reset", "2023-09-29T16:27:37.250Z", NOW + 250);
        assert_eq!(date, (Some(60_000), false, false));
        let epoch = kind("x-ratelimit-reset", "1696004857.250", NOW + 250);
        assert_eq!(epoch, (Some(60_000), false, false));
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
        // Only the limit unknown: the window's remaining and reset are real.
        for (limit, remaining, reset) in [
            ("x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"),
            ("x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"),
        ] {
            let info = parse_headers([(limit, "-1"), (remaining, "0"), (reset, "5s")], NOW);
            assert_eq!((info.limit, info.remaining, info.reset_ms), (None, Some(0), Some(5000)), "{limit}");
        }
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
