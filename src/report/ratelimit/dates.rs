//! The dates in rate-limit header values: RFC 3339 timestamps and the three
//! HTTP-date forms (RFC 9110 §5.6.7), read against the caller's `now`.

use super::*;

/// `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` as epoch nanoseconds.
pub(super) fn parse_rfc3339(b: &[u8]) -> Option<i128> {
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

pub(super) const SHORT_DAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
pub(super) const LONG_DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
pub(super) const MONTHS: [&str; 12] =
    ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

/// An HTTP-date (RFC 9110 §5.6.7) in any of its three forms, as epoch nanoseconds:
/// IMF-fixdate `Sun, 06 Nov 1994 08:49:37 GMT`, RFC 850 `Sunday, 06-Nov-94
/// 08:49:37 GMT`, asctime `Sun Nov  6 08:49:37 1994`. `now_ms` places RFC 850's
/// two-digit year.
pub(super) fn parse_http_date(s: &str, now_ms: u64) -> Option<i128> {
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
pub(super) fn full_year(two_digits: u64, now_ms: u64) -> Option<i64> {
    let now_days = i64::try_from(now_ms / 86_400_000).ok()?;
    let now_year = calendar::civil_from_days(now_days).0;
    let year = now_year - now_year.rem_euclid(100) + i64::try_from(two_digits).ok()?;
    Some(if year > now_year + 50 { year - 100 } else { year })
}

/// `n` ASCII digits at `from`, exactly.
pub(super) fn fixed_digits(b: &[u8], from: usize, n: usize) -> Option<u32> {
    b.get(from..from.checked_add(n)?)?
        .iter()
        .try_fold(0u32, |acc, &d| d.is_ascii_digit().then(|| acc * 10 + u32::from(d - b'0')))
}
