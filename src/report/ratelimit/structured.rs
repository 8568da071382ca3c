//! The IETF `RateLimit` and `RateLimit-Policy` structured fields (drafts
//! 07–10): dictionaries and named items, joined by name.

use super::*;

/// Header values kept for parsing after all headers are seen, since `RateLimit`
/// items are joined to `RateLimit-Policy` items by name. Values past the capacity
/// are dropped: no real upstream repeats these headers that often.
#[derive(Default)]
pub(super) struct Values<'a> {
    items: [&'a str; 8],
    len: usize,
}

impl<'a> Values<'a> {
    pub(super) fn push(&mut self, value: &'a str) {
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
pub(super) fn structured_budget(rate_limit: &Values, policy: &Values, now_ms: u64) -> Budget {
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
pub(super) fn policy_quota(policy: &Values, name: &str) -> Option<u64> {
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
pub(super) fn item_name(bare: &str) -> Option<&str> {
    if let Some(quoted) = bare.strip_prefix('"') {
        return quoted.strip_suffix('"');
    }
    let token =
        !bare.is_empty() && bare.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(&b));
    token.then_some(bare)
}

/// `key=value` parameters, trimmed; parameters without a value are skipped.
pub(super) fn params<'a>(parts: impl Iterator<Item = &'a str>) -> impl Iterator<Item = (&'a str, &'a str)> {
    parts.filter_map(|p| p.split_once('=').map(|(k, v)| (k.trim(), v.trim())))
}

/// Splits on `sep` outside double-quoted strings. Every split point is an ASCII
/// byte, so every slice stays on a character boundary.
pub(super) fn split_top(s: &str, sep: u8) -> TopSplit<'_> {
    TopSplit { rest: Some(s), sep }
}

pub(super) struct TopSplit<'a> {
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
