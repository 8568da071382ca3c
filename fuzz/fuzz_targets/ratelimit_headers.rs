//! `ratelimit::parse_headers` must not panic on any header set and never wrap:
//! a lone bare number must come out as one of the readings SPEC §7 allows for it.
//!
//! Input: one byte choosing the clock, then records of one byte naming the
//! header (one of the names the module reads, or a raw name) and the value up
//! to the next NUL byte.

#![no_main]

use libfuzzer_sys::fuzz_target;
use nthpool::report::ratelimit::parse_headers;

const NAMES: &[&str] = &[
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset-after",
    "x-ratelimit-reset",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-requests-limit",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
    "anthropic-ratelimit-tokens-limit",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-tokens-reset",
    "anthropic-ratelimit-input-tokens-reset",
    "anthropic-ratelimit-output-tokens-reset",
    "RateLimit-Limit",
    "RateLimit-Remaining",
    "RateLimit-Reset",
    "ratelimit-resettime",
    "RateLimit",
    "RateLimit-Policy",
    "x-rate-limit-limit",
    "x-rate-limit-remaining",
    "x-rate-limit-reset",
    "x-shopify-shop-api-call-limit",
    "retry-after-ms",
    "x-ms-retry-after-ms",
    "Retry-After",
];

/// Wall clocks worth trying: a plausible present, the epoch, and the extremes.
const NOWS: [u64; 4] = [1_700_000_000_000, 0, u64::MAX / 2, u64::MAX];

fuzz_target!(|input: &[u8]| {
    let Some((&clock, mut rest)) = input.split_first() else {
        return;
    };
    let now = if clock < 0xf0 { NOWS[0] + u64::from(clock) * 1_000 } else { NOWS[usize::from(clock) % NOWS.len()] };
    let mut pairs: Vec<(String, String)> = Vec::new();
    while let Some((&tag, after)) = rest.split_first() {
        let (name, after) = match NAMES.get(usize::from(tag)) {
            Some(name) => (name.to_string(), after),
            None => {
                // A raw name, up to the next NUL.
                let end = after.iter().position(|&b| b == 0).unwrap_or(after.len());
                (String::from_utf8_lossy(&after[..end]).into_owned(), after.get(end + 1..).unwrap_or(&[]))
            }
        };
        let end = after.iter().position(|&b| b == 0).unwrap_or(after.len());
        pairs.push((name, String::from_utf8_lossy(&after[..end]).into_owned()));
        rest = after.get(end + 1..).unwrap_or(&[]);
    }
    let info = parse_headers(pairs.iter().map(|(n, v)| (n.as_str(), v.as_str())), now);

    let durations =
        [("reset_ms", info.reset_ms), ("token_reset_ms", info.token_reset_ms), ("retry_after_ms", info.retry_after_ms)];
    // 0 is a real answer ("now", or a reset already past; see the
    // `retry-after-ms-zero` vector), so only the readings are checked.

    // A lone bare number has few readings: seconds or milliseconds, as a delay
    // or as an epoch instant. Anything else is arithmetic gone wrong.
    if let [(name, value)] = &pairs[..] {
        let Ok(n) = value.trim().parse::<u64>() else {
            return;
        };
        // An instant already past is a reset of 0.
        let readings = [
            Some(n),
            n.checked_mul(1000),
            n.checked_mul(1000).map(|ms| ms.saturating_sub(now)),
            Some(n.saturating_sub(now)),
        ];
        for (field, got) in durations {
            if let Some(got) = got {
                assert!(readings.contains(&Some(got)), "{field} = {got} is no reading of {name}: {value:?} at {now}");
            }
        }
    }
});
