//! The numbers and durations in rate-limit header values: counts and count
//! lists, Shopify's `used/limit`, seconds, milliseconds, Go durations and
//! reset times given as epoch seconds or deltas.

use super::*;

/// A count, or a list of counts. Envoy's `10, 10;w=60` puts the limit in force
/// first and describes quota policies in parameterised members, so members
/// without parameters win; among them (joined duplicates) the larger wins.
pub(super) fn parse_count(value: &str) -> Option<u64> {
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

pub(super) fn parse_uint(s: &str) -> Option<u64> {
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
pub(super) fn parse_call_limit(value: &str) -> Option<(u64, u64)> {
    let (used, limit) = value.split_once('/')?;
    Some((parse_uint(used.trim())?, parse_uint(limit.trim())?))
}

// ---------------------------------------------------------------------------
// Times

pub(super) const NS_PER_MS: u128 = 1_000_000;
pub(super) const NS_PER_SEC: u128 = 1_000_000_000;

/// A time value as relative milliseconds, with what its form said of it:
/// read from the value itself, never from where `now` falls (seconds to go
/// that happen to end on a second's boundary are no instant). Ordered by
/// `ms` first, so of duplicates the larger wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Time {
    pub(super) ms: u64,
    /// Said to the whole second: whole seconds to go (`5`, `6m0s`), or an
    /// instant on a second's boundary.
    pub(super) coarse: bool,
    /// Said as an instant on a second's boundary (a date, whole epoch
    /// seconds): the same instant whenever the headers were stamped.
    pub(super) instant: bool,
}

impl Time {
    /// A delay from now: whole seconds when it is a whole number of them.
    fn delay(ms: u64) -> Time {
        Time { ms, coarse: ms.is_multiple_of(1000), instant: false }
    }

    /// An instant, as the delay from now to it (clamped at 0 for the past).
    fn at(at_ns: i128, now_ns: i128) -> Option<Time> {
        let whole = at_ns.rem_euclid(NS_PER_SEC as i128) == 0;
        Some(Time { ms: until(at_ns, now_ns)?, coarse: whole, instant: whole })
    }
}

/// The unit of a number written without one.
#[derive(Debug, Clone, Copy)]
pub(super) enum Bare {
    Seconds,
    Millis,
}

/// A time value, or a comma list of them (joined duplicates): the larger wins.
/// An HTTP-date carries a comma of its own, so a member that does not parse is
/// retried joined with the next one.
pub(super) fn parse_time_list(value: &str, bare: Bare, now_ms: u64) -> Option<Time> {
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
pub(super) fn parse_time(s: &str, bare: Bare, now_ms: u64) -> Option<Time> {
    if s.is_empty() {
        return None;
    }
    let now_ns = i128::from(now_ms) * NS_PER_MS as i128;
    if s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return parse_bare(s.as_bytes(), bare, now_ns);
    }
    if let Some(ns) = parse_go_duration(s.as_bytes()) {
        return ns_to_ms(ns).map(Time::delay);
    }
    let at = parse_rfc3339(s.as_bytes()).or_else(|| parse_http_date(s, now_ms))?;
    Time::at(at, now_ns)
}

/// Large bare numbers are instants, not delays (SPEC §7): above 1e12 they are
/// epoch milliseconds, above 1e9 (seconds only) epoch seconds.
pub(super) fn parse_bare(digits: &[u8], bare: Bare, now_ns: i128) -> Option<Time> {
    match bare {
        Bare::Seconds => {
            let ns = parse_decimal(digits, NS_PER_SEC)?;
            if ns > 1_000_000_000_000 * NS_PER_SEC {
                Time::at(i128::try_from(parse_decimal(digits, NS_PER_MS)?).ok()?, now_ns)
            } else if ns > 1_000_000_000 * NS_PER_SEC {
                Time::at(i128::try_from(ns).ok()?, now_ns)
            } else {
                ns_to_ms(ns).map(Time::delay)
            }
        }
        Bare::Millis => {
            let ns = parse_decimal(digits, NS_PER_MS)?;
            if ns > 1_000_000_000_000 * NS_PER_MS {
                Time::at(i128::try_from(ns).ok()?, now_ns)
            } else {
                ns_to_ms(ns).map(Time::delay)
            }
        }
    }
}

/// Relative milliseconds from now to an instant, clamped at 0 for the past.
pub(super) fn until(at_ns: i128, now_ns: i128) -> Option<u64> {
    let delta = at_ns.checked_sub(now_ns)?;
    ns_to_ms(u128::try_from(delta).unwrap_or(0))
}

/// Rounds up: a reset reported early would let the governor grant before the
/// upstream window has refilled (`500µs` → 1 ms).
pub(super) fn ns_to_ms(ns: u128) -> Option<u64> {
    u64::try_from(ns.div_ceil(NS_PER_MS)).ok()
}

/// `digits[.digits]` times `unit_ns`, in nanoseconds rounded up; `None` on
/// overflow. Fraction digits past the 18th only matter for the rounding.
pub(super) fn parse_decimal(s: &[u8], unit_ns: u128) -> Option<u128> {
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
pub(super) fn parse_go_duration(s: &[u8]) -> Option<u128> {
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
