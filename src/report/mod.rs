//! Outcome reports: the release body, validated to the field and merged into
//! one `Outcome` (SPEC §7). A bad report is a `400` and releases nothing, so
//! validation happens before the governor is touched.

pub mod ratelimit;

use std::fmt;

use serde::de::{Deserializer, Error, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::governor::{Outcome, RateInfo};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReleaseBody {
    #[serde(default)]
    status: Option<serde_json::Number>,
    #[serde(default)]
    throttled: Option<serde_json::Number>,
    #[serde(default)]
    retry_after_ms: Option<serde_json::Number>,
    #[serde(default, deserialize_with = "object_or_null")]
    rate: Option<RateBody>,
    #[serde(default)]
    headers: Option<RawHeaders>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RateBody {
    #[serde(default)]
    limit: Option<serde_json::Number>,
    #[serde(default)]
    remaining: Option<serde_json::Number>,
    #[serde(default)]
    reset_ms: Option<serde_json::Number>,
    #[serde(default)]
    token_limit: Option<serde_json::Number>,
    #[serde(default)]
    token_remaining: Option<serde_json::Number>,
    #[serde(default)]
    token_reset_ms: Option<serde_json::Number>,
}

/// A nested object field: derived structs would also take a JSON array by
/// position (`"rate":[10,0,60000]`), which no client means.
fn object_or_null<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    struct V<T>(std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an object or null")
        }
        fn visit_unit<E: serde::de::Error>(self) -> Result<Option<T>, E> {
            Ok(None)
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Option<T>, A::Error> {
            T::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Some)
        }
    }
    d.deserialize_any(V(std::marker::PhantomData))
}

/// Raw upstream headers: an object of name → value, or an array of
/// `[name, value]` pairs (the only way to send a header twice). A value is
/// a string, or what clients turn header strings into: a number (taken as
/// its text) or an array of values (each one a field line). Any other
/// value (`null`, `true`, an object, an array inside the array, a number
/// past `f64`'s range) says nothing and is ignored: SPEC §7 has unparseable
/// header values ignored, never an error.
///
/// Only the headers the dialects read are kept, and of those the first
/// `MAX_FIELD_LINES` field lines, so what a report holds stays within its
/// body's size whatever its shape (a long name with many values is not
/// copied once per value).
struct RawHeaders(Vec<(&'static str, String)>);

/// Field lines of read headers kept from one report; later ones are ignored.
const MAX_FIELD_LINES: usize = 256;

/// The field lines one header value stands for.
struct HeaderValues(Vec<String>);

/// A value inside a header value's array: one field line, or, for an array
/// or object, nothing (skipped without recursion, however deep).
struct FieldLine(Vec<String>);

/// Reads a header value; `ARRAY`: an array is a list of field lines (only
/// at the top: deeper arrays say nothing).
struct Values<const ARRAY: bool>;

impl<'de, const ARRAY: bool> Visitor<'de> for Values<ARRAY> {
    type Value = Vec<String>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a header value")
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Vec<String>, E> {
        Ok(vec![v.to_owned()])
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Vec<String>, E> {
        Ok(vec![v.to_string()])
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Vec<String>, E> {
        Ok(vec![v.to_string()])
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Vec<String>, E> {
        Ok(vec![v.to_string()])
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Vec<String>, E> {
        Ok(Vec::new())
    }
    fn visit_unit<E: serde::de::Error>(self) -> Result<Vec<String>, E> {
        Ok(Vec::new())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
        let mut out = Vec::new();
        if ARRAY {
            while let Some(FieldLine(values)) = seq.next_element()? {
                if out.len() < MAX_FIELD_LINES {
                    out.extend(values);
                }
            }
        } else {
            while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        }
        Ok(out)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<String>, A::Error> {
        while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
        Ok(Vec::new())
    }
}

impl<'de> Deserialize<'de> for HeaderValues {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        lenient::<D, true>(d).map(HeaderValues)
    }
}

impl<'de> Deserialize<'de> for FieldLine {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        lenient::<D, false>(d).map(FieldLine)
    }
}

/// Reads a header value with `Values`, a number no `f64` holds (`1e400`, an
/// integer of 400 digits) being unparseable and so ignored (SPEC §7), as a
/// string that no dialect can read is. serde_json refuses such a number
/// before any visitor sees it, failing the whole report: the value is taken
/// raw (checked as JSON, its numbers not converted) and then read on its own.
/// Only values of the headers the dialects read come here, never a report
/// without `headers`.
fn lenient<'de, D: Deserializer<'de>, const ARRAY: bool>(d: D) -> Result<Vec<String>, D::Error> {
    let raw = <&'de serde_json::value::RawValue>::deserialize(d)?.get();
    // The usual value, a string without escapes, is its text: read no further.
    if let Some(text) = raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')).filter(|t| !t.contains('\\')) {
        return Ok(vec![text.to_owned()]);
    }
    match serde_json::Deserializer::from_str(raw).deserialize_any(Values::<ARRAY>) {
        Ok(values) => Ok(values),
        // Of well-formed JSON, only a number can fail to read, or a string
        // that spells a lone UTF-16 surrogate (`"\ud800"`), which no string
        // holds: both are unparseable values, ignored (an array's elements
        // come back here one by one).
        Err(_) if raw.starts_with(|c: char| c == '-' || c == '"' || c.is_ascii_digit()) => Ok(Vec::new()),
        Err(e) => Err(D::Error::custom(e)),
    }
}

/// A header name as a report gives it, as the dialects spell it when one
/// reads it (`None`: no dialect does). Read as bytes: a name JSON can spell
/// but no string holds (a lone UTF-16 surrogate, `"\ud800"`) is no header a
/// dialect reads, and is skipped as one (SPEC §7: never an error).
struct HeaderName(Option<&'static str>);

impl<'de> Deserialize<'de> for HeaderName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = HeaderName;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a header name")
            }
            fn visit_str<E: Error>(self, name: &str) -> Result<HeaderName, E> {
                Ok(HeaderName(ratelimit::name_of(name)))
            }
            fn visit_bytes<E: Error>(self, name: &[u8]) -> Result<HeaderName, E> {
                // Read as bytes, a name is not checked for control characters
                // JSON holds only escaped: none is in a header name a dialect
                // reads, so such a name is skipped like any unknown one.
                let readable = !name.iter().any(|&b| b < 0x20);
                let name = std::str::from_utf8(name).ok().filter(|_| readable);
                Ok(HeaderName(name.and_then(ratelimit::name_of)))
            }
        }
        d.deserialize_bytes(V)
    }
}

/// One header of a report: its name as the dialects spell it when they read
/// it (`None`: a header no dialect reads, its value skipped unread), and the
/// field lines its value stands for.
struct Header(Option<&'static str>, Vec<String>);

/// A `[name, value]` pair, exactly two elements.
impl<'de> Deserialize<'de> for Header {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Header;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a [name, value] pair")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Header, A::Error> {
                let pair = &"a [name, value] pair";
                let HeaderName(known) = seq.next_element()?.ok_or_else(|| Error::invalid_length(0, pair))?;
                let values = match known {
                    Some(_) => seq.next_element::<HeaderValues>()?.map(|v| v.0),
                    None => seq.next_element::<IgnoredAny>()?.map(|_| Vec::new()),
                };
                let values = values.ok_or_else(|| Error::invalid_length(1, pair))?;
                match seq.next_element::<IgnoredAny>()? {
                    None => Ok(Header(known, values)),
                    Some(_) => Err(Error::invalid_length(3, pair)),
                }
            }
        }
        d.deserialize_seq(V)
    }
}

impl RawHeaders {
    fn keep(&mut self, Header(name, values): Header) {
        let Some(name) = name else { return };
        let room = MAX_FIELD_LINES.saturating_sub(self.0.len());
        self.0.extend(values.into_iter().take(room).map(|v| (name, v)));
    }
}

impl<'de> Deserialize<'de> for RawHeaders {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawHeaders;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of header values or an array of [name, value] pairs")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawHeaders, A::Error> {
                let mut out = RawHeaders(Vec::new());
                while let Some(HeaderName(known)) = map.next_key()? {
                    let values = match known {
                        Some(_) => map.next_value::<HeaderValues>()?.0,
                        None => map.next_value::<IgnoredAny>().map(|_| Vec::new())?,
                    };
                    out.keep(Header(known, values));
                }
                Ok(out)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RawHeaders, A::Error> {
                let mut out = RawHeaders(Vec::new());
                while let Some(header) = seq.next_element::<Header>()? {
                    out.keep(header);
                }
                Ok(out)
            }
        }
        d.deserialize_any(V)
    }
}

/// Why a body was refused; the sentence goes into the `400` message.
pub type BodyError = &'static str;

/// A body is "absent" when it is empty or only JSON's white space (a form
/// feed is not: that body is no JSON at all).
pub fn is_blank(body: &[u8]) -> bool {
    body.iter().all(|b| matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
}

/// Bodies must be JSON objects (serde would also accept an array for a
/// struct) in UTF-8 (RFC 8259 §8.1; serde checks only the strings it reads,
/// so a body's verdict would depend on which of its strings a route reads).
pub fn check_object(body: &[u8]) -> Result<(), BodyError> {
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') if std::str::from_utf8(body).is_ok() => Ok(()),
        Some(b'{') => Err("The request body is not valid UTF-8."),
        _ => Err("The request body must be a JSON object."),
    }
}

/// Whether serde refused a body for a member given twice.
pub fn is_duplicate_field(e: &serde_json::Error) -> bool {
    e.is_data() && e.to_string().starts_with("duplicate field")
}

/// A JSON number that is a whole, non-negative value: `300`, and also
/// `300.0` or `3e2` (what float-typed JSON encoders send); `300.5` is not.
/// Floats are taken only up to 2^53, where every integer is exact.
pub fn integral(n: &serde_json::Number) -> Option<u64> {
    const EXACT: f64 = (1u64 << 53) as f64;
    n.as_u64().or_else(|| {
        let f = n.as_f64()?;
        ((0.0..=EXACT).contains(&f) && f.fract() == 0.0).then_some(f as u64)
    })
}

/// `integral`, also past 2^53: a whole number written as a float there
/// (`1e17`) is taken as it reads, and one too large for 64 bits (`1e20`,
/// `18446744073709551616`) is as large as any, `u64::MAX`. Such floats are
/// not exact, but are surely past any bound a field is held to.
pub fn integral_or_huge(n: &serde_json::Number) -> Option<u64> {
    // Every float past 2^53 is whole; `as` saturates at u64::MAX.
    integral(n).or_else(|| n.as_f64().filter(|f| *f > 0.0 && f.fract() == 0.0).map(|f| f as u64))
}

/// A whole, non-negative JSON number that fits `max`; a field without an
/// upper bound (`max == u64::MAX`) takes any whole number, saturating.
fn whole(n: &Option<serde_json::Number>, max: u64, err: BodyError) -> Result<Option<u64>, BodyError> {
    match n {
        None => Ok(None),
        Some(n) => match integral_or_huge(n) {
            Some(v) if v <= max => Ok(Some(v)),
            _ => Err(err),
        },
    }
}

/// Parses a release body into an outcome; `Ok(None)` for an absent body.
/// `now_epoch_ms` dates the `Retry-After` and reset headers in `headers`.
pub fn parse_release(body: &[u8], now_epoch_ms: u64) -> Result<Option<Outcome>, BodyError> {
    if is_blank(body) {
        return Ok(None);
    }
    if let Some(flat) = parse_flat(body) {
        return flat.map(Some);
    }
    check_object(body)?;
    let parsed: ReleaseBody =
        serde_json::from_slice(body)
            .map_err(|e| if is_duplicate_field(&e) { twice(&e) } else { misread_field(body) })?;
    const ANY: u64 = u64::MAX;
    let status = whole(&parsed.status, 599, STATUS_ERR)?;
    if matches!(status, Some(s) if s < 100) {
        return Err(STATUS_ERR);
    }
    let throttled = whole(&parsed.throttled, ANY, THROTTLED_ERR)?;
    let retry_after = whole(&parsed.retry_after_ms, ANY, RETRY_ERR)?;
    let rate = parsed.rate.unwrap_or_default();
    let from_headers = parsed
        .headers
        .map(|h| ratelimit::parse_headers(h.0.iter().map(|(n, v)| (*n, v.as_str())), now_epoch_ms))
        .unwrap_or_default();
    // `rate` wins over `headers` field by field; `retryAfterMs` over any header hint.
    Ok(Some(Outcome {
        status: status.map(|s| s as u16),
        throttled: throttled.unwrap_or(0),
        rate: RateInfo {
            limit: whole(&rate.limit, ANY, LIMIT_ERR)?.or(from_headers.limit),
            remaining: whole(&rate.remaining, ANY, REMAINING_ERR)?.or(from_headers.remaining),
            reset_ms: whole(&rate.reset_ms, ANY, RESET_ERR)?.or(from_headers.reset_ms),
            reset_coarse: rate.reset_ms.is_none() && from_headers.reset_coarse,
            reset_instant: rate.reset_ms.is_none() && from_headers.reset_instant,
            token_limit: whole(&rate.token_limit, ANY, TOKEN_LIMIT_ERR)?.or(from_headers.token_limit),
            token_remaining: whole(&rate.token_remaining, ANY, TOKEN_REMAINING_ERR)?.or(from_headers.token_remaining),
            token_reset_ms: whole(&rate.token_reset_ms, ANY, TOKEN_RESET_ERR)?.or(from_headers.token_reset_ms),
            retry_after_ms: retry_after.or(from_headers.retry_after_ms),
        },
    }))
}

const STATUS_ERR: BodyError = "`status` must be a whole number from 100 to 599.";
const THROTTLED_ERR: BodyError = "`throttled` must be a whole number of at least 0.";
const RETRY_ERR: BodyError = "`retryAfterMs` must be a whole number of milliseconds, at least 0.";

const LIMIT_ERR: BodyError = "`rate.limit` must be a whole number of at least 0 (or null).";
const REMAINING_ERR: BodyError = "`rate.remaining` must be a whole number of at least 0 (or null).";
const RESET_ERR: BodyError = "`rate.resetMs` must be a whole number of milliseconds, at least 0 (or null).";
const TOKEN_LIMIT_ERR: BodyError = "`rate.tokenLimit` must be a whole number of at least 0 (or null).";
const TOKEN_REMAINING_ERR: BodyError = "`rate.tokenRemaining` must be a whole number of at least 0 (or null).";
const TOKEN_RESET_ERR: BodyError = "`rate.tokenResetMs` must be a whole number of milliseconds, at least 0 (or null).";

/// The members of `rate` a report reads (`RateBody`), each with the sentence
/// that refuses it: a wrong one is named, as the body's own fields are.
const RATE_FIELDS: [(&str, BodyError); 6] = [
    ("limit", LIMIT_ERR),
    ("remaining", REMAINING_ERR),
    ("resetMs", RESET_ERR),
    ("tokenLimit", TOKEN_LIMIT_ERR),
    ("tokenRemaining", TOKEN_REMAINING_ERR),
    ("tokenResetMs", TOKEN_RESET_ERR),
];

/// The sentence for a release body with a member given twice, naming it
/// (serde names it in its error; every name a report reads is its own, a
/// member of `rate` included). Runs only for refused bodies.
#[cold]
fn twice(e: &serde_json::Error) -> BodyError {
    let text = e.to_string();
    let name = text.strip_prefix("duplicate field `").and_then(|rest| rest.split('`').next());
    match name {
        Some("status") => "`status` is given twice in the release body; send it once.",
        Some("throttled") => "`throttled` is given twice in the release body; send it once.",
        Some("retryAfterMs") => "`retryAfterMs` is given twice in the release body; send it once.",
        Some("rate") => "`rate` is given twice in the release body; send it once.",
        Some("headers") => "`headers` is given twice in the release body; send it once.",
        Some("limit") => "`rate.limit` is given twice in the release body; send it once.",
        Some("remaining") => "`rate.remaining` is given twice in the release body; send it once.",
        Some("resetMs") => "`rate.resetMs` is given twice in the release body; send it once.",
        Some("tokenLimit") => "`rate.tokenLimit` is given twice in the release body; send it once.",
        Some("tokenRemaining") => "`rate.tokenRemaining` is given twice in the release body; send it once.",
        Some("tokenResetMs") => "`rate.tokenResetMs` is given twice in the release body; send it once.",
        _ => "A field of the release body is given twice; send each once.",
    }
}

/// The sentence for a release body serde refused (well-formed JSON with a
/// member of the wrong type, or not JSON at all): the first member of the
/// wrong type, named, when one can be told. Runs only for refused bodies.
#[cold]
fn misread_field(body: &[u8]) -> BodyError {
    let members = match serde_json::from_slice::<Members>(body) {
        Ok(Members(members)) => members,
        Err(e) if e.to_string().starts_with("number out of range") => return too_large(body),
        _ => return "The release body is not valid JSON.",
    };
    let number_or_null = |shape: &Shape| matches!(shape, Shape::Number | Shape::Null);
    for (name, shape) in &members {
        match name.as_str() {
            "status" if !number_or_null(shape) => return STATUS_ERR,
            "throttled" if !number_or_null(shape) => return THROTTLED_ERR,
            "retryAfterMs" if !number_or_null(shape) => return RETRY_ERR,
            "rate" => match shape {
                Shape::Null => {}
                // Unknown members of `rate` are ignored, as the body's own
                // are: only the fields it reads can be of the wrong type.
                Shape::Object(rate) => {
                    let wrong = rate.iter().filter(|(_, ok)| !ok);
                    if let Some((_, error)) =
                        wrong.flat_map(|(f, _)| RATE_FIELDS.iter().find(|(name, _)| name == f)).next()
                    {
                        return error;
                    }
                }
                _ => return "`rate` must be an object (or null).",
            },
            _ => {}
        }
    }
    if members.iter().any(|(name, _)| name == "headers") {
        "`headers` must be an object of header values or an array of [name, value] pairs."
    } else {
        "The release body is not valid: fields must be numbers, `rate` an object and `headers` header values."
    }
}

/// The sentence for a release body with a number no double holds (`1e400`,
/// an integer of 310 digits) in a field it reads: that field, named as one of
/// the wrong type (such a number is no number, README). serde_json refuses
/// the number before any visitor sees it, so the members are taken raw
/// (their numbers not converted) and read one by one. Runs only for refused
/// bodies.
#[cold]
fn too_large(body: &[u8]) -> BodyError {
    type Raw<'a> = std::collections::BTreeMap<String, &'a serde_json::value::RawValue>;
    let unreadable = |raw: &serde_json::value::RawValue| serde_json::from_str::<Shape>(raw.get()).is_err();
    let members: Raw = serde_json::from_slice(body).unwrap_or_default();
    for (name, raw) in &members {
        match name.as_str() {
            "status" if unreadable(raw) => return STATUS_ERR,
            "throttled" if unreadable(raw) => return THROTTLED_ERR,
            "retryAfterMs" if unreadable(raw) => return RETRY_ERR,
            "rate" => {
                let rate: Raw = serde_json::from_str(raw.get()).unwrap_or_default();
                let huge = rate.iter().filter(|(_, raw)| unreadable(raw));
                if let Some((_, error)) = huge.flat_map(|(f, _)| RATE_FIELDS.iter().find(|(name, _)| name == f)).next()
                {
                    return error;
                }
            }
            _ => {}
        }
    }
    "A number in the release body is too large to read."
}

/// The members of a refused release body, each read one level deep: what
/// `misread_field` needs to name the wrong one. Values below that are
/// skipped unread (serde_json skips without recursion), so a body that nests
/// deeper than serde_json's 128 levels, in a value nothing reads, still has
/// its wrong member named rather than being called "not valid JSON".
struct Members(Vec<(String, Shape)>);

/// What a member's value is; an object's own members as whether each is a
/// number or null (all `rate` checks).
enum Shape {
    Null,
    Number,
    Object(Vec<(String, bool)>),
    Other,
}

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members, A::Error> {
                let mut members = Vec::new();
                while let Some(member) = map.next_entry::<String, Shape>()? {
                    members.push(member);
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(V)
    }
}

impl<'de> Deserialize<'de> for Shape {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Shape;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E: Error>(self) -> Result<Shape, E> {
                Ok(Shape::Null)
            }
            fn visit_u64<E: Error>(self, _: u64) -> Result<Shape, E> {
                Ok(Shape::Number)
            }
            fn visit_i64<E: Error>(self, _: i64) -> Result<Shape, E> {
                Ok(Shape::Number)
            }
            fn visit_f64<E: Error>(self, _: f64) -> Result<Shape, E> {
                Ok(Shape::Number)
            }
            fn visit_bool<E: Error>(self, _: bool) -> Result<Shape, E> {
                Ok(Shape::Other)
            }
            fn visit_str<E: Error>(self, _: &str) -> Result<Shape, E> {
                Ok(Shape::Other)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shape, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Shape::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shape, A::Error> {
                let mut members = Vec::new();
                while let Some(name) = map.next_key::<String>()? {
                    let value = map.next_value::<Shape>()?;
                    members.push((name, matches!(value, Shape::Number | Shape::Null)));
                }
                Ok(Shape::Object(members))
            }
        }
        d.deserialize_any(V)
    }
}

/// The report nearly every release carries — an object of `status`,
/// `throttled` and `retryAfterMs` with plain integers — read without serde.
/// `None` means "not that shape": the general parser decides, so both paths
/// accept and refuse exactly the same bodies.
fn parse_flat(body: &[u8]) -> Option<Result<Outcome, BodyError>> {
    let mut p = Scan { b: body, at: 0 };
    let (mut status, mut throttled, mut retry) = (None, None, None);
    p.ws();
    p.eat(b'{')?;
    p.ws();
    if !p.eat_if(b'}') {
        loop {
            p.eat(b'"')?;
            // Each key is taken with its closing quote: a longer or other
            // key matches none of them.
            let slot = if p.eat_text(b"status\"") {
                &mut status
            } else if p.eat_text(b"throttled\"") {
                &mut throttled
            } else if p.eat_text(b"retryAfterMs\"") {
                &mut retry
            } else {
                return None;
            };
            p.ws();
            p.eat(b':')?;
            p.ws();
            if slot.is_some() {
                return None; // a repeated field: the general parser refuses it
            }
            *slot = Some(p.integer()?);
            p.ws();
            if p.eat_if(b'}') {
                break;
            }
            p.eat(b',')?;
            p.ws();
        }
    }
    p.ws();
    if p.at != body.len() {
        return None;
    }
    Some(flat_outcome(status, throttled, retry))
}

fn flat_outcome(status: Option<u64>, throttled: Option<u64>, retry: Option<u64>) -> Result<Outcome, BodyError> {
    if matches!(status, Some(s) if !(100..=599).contains(&s)) {
        return Err("`status` must be a whole number from 100 to 599.");
    }
    Ok(Outcome {
        status: status.map(|s| s as u16),
        throttled: throttled.unwrap_or(0),
        rate: RateInfo { retry_after_ms: retry, ..RateInfo::default() },
    })
}

/// A cursor over a body for `parse_flat`.
struct Scan<'a> {
    b: &'a [u8],
    at: usize,
}

impl Scan<'_> {
    fn ws(&mut self) {
        while self.b.get(self.at).is_some_and(|c| matches!(c, b' ' | b'\t' | b'\r' | b'\n')) {
            self.at += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        self.eat_if(c).then_some(())
    }

    fn eat_if(&mut self, c: u8) -> bool {
        let hit = self.b.get(self.at) == Some(&c);
        self.at += usize::from(hit);
        hit
    }

    /// Takes `text` when the body goes on with it.
    fn eat_text(&mut self, text: &[u8]) -> bool {
        let hit = self.b[self.at..].starts_with(text);
        self.at += if hit { text.len() } else { 0 };
        hit
    }

    /// A JSON integer without sign, fraction or exponent that fits in u64.
    fn integer(&mut self) -> Option<u64> {
        let start = self.at;
        let mut n: u64 = 0;
        while let Some(&c) = self.b.get(self.at).filter(|c| c.is_ascii_digit()) {
            n = n.checked_mul(10)?.checked_add((c - b'0') as u64)?;
            self.at += 1;
        }
        let digits = self.at - start;
        let leading_zero = digits > 1 && self.b[start] == b'0';
        let more = matches!(self.b.get(self.at), Some(b'.' | b'e' | b'E'));
        (digits > 0 && !leading_zero && !more).then_some(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(body: &str) -> Outcome {
        parse_release(body.as_bytes(), 1_700_000_000_000).unwrap().unwrap()
    }

    fn bad(body: &str) {
        assert!(parse_release(body.as_bytes(), 0).is_err(), "{body} should be refused");
    }

    #[test]
    fn blank_bodies_are_no_report() {
        assert_eq!(parse_release(b"", 0), Ok(None));
        assert_eq!(parse_release(b"  \r\n", 0), Ok(None));
    }

    #[test]
    fn fields_are_read() {
        let o = ok(r#"{"status":429,"throttled":2,"retryAfterMs":2000}"#);
        assert_eq!(o.status, Some(429));
        assert_eq!(o.throttled, 2);
        assert_eq!(o.rate.retry_after_ms, Some(2000));
        assert_eq!(ok("{}"), Outcome::default());
    }

    #[test]
    fn rate_wins_over_headers_field_by_field() {
        let o = ok(r#"{"status":200,"rate":{"remaining":5},
            "headers":{"X-RateLimit-Remaining-Requests":"9","x-ratelimit-reset-requests":"700ms","x-ratelimit-limit-requests":"60"}}"#);
        assert_eq!(o.rate.remaining, Some(5));
        assert_eq!(o.rate.reset_ms, Some(700));
        assert_eq!(o.rate.limit, Some(60));
    }

    /// JSON can spell a lone UTF-16 surrogate (`"\ud800"`, as JavaScript's
    /// `JSON.stringify` writes a malformed string), which no string holds:
    /// in a header's value or name it is unparseable, ignored (SPEC §7), and
    /// the rest of the report applies.
    #[test]
    fn a_lone_surrogate_in_a_header_is_ignored_not_an_error() {
        let o = ok(r#"{"status":429,"headers":{"retry-after":"\ud800","x-ratelimit-remaining":"\udc00x"}}"#);
        assert_eq!((o.status, o.rate.retry_after_ms, o.rate.remaining), (Some(429), None, None));
        let o = ok(r#"{"headers":{"retry-after":["\ud800","2"],"\ud800":"5"}}"#);
        assert_eq!(
            o.rate.retry_after_ms,
            Some(2000),
            "the other value of the list, and a name no string holds skipped"
        );
        let o = ok(r#"{"headers":[["retry-after","\ud800"],["\udc00","1"],["Retry-After","4"]]}"#);
        assert_eq!(o.rate.retry_after_ms, Some(4000));
        // An escape that is whole still reads.
        let o = ok(r#"{"headers":{"retry-\u0061fter":"\u0033"}}"#);
        assert_eq!(o.rate.retry_after_ms, Some(3000));
        bad(r#"{"headers":{"retry-after":"\ud800}}"#);
        // A control character in a name, escaped or not, names no header a
        // dialect reads: skipped, the rest applies.
        let o = ok("{\"headers\":{\"x-\u{1}y\":\"1\",\"retry-after\":\"3\"}}");
        assert_eq!(o.rate.retry_after_ms, Some(3000));
        let o = ok(r#"{"headers":{"retry-after\u0001":"1","retry-after":"3"}}"#);
        assert_eq!(o.rate.retry_after_ms, Some(3000));
    }

    #[test]
    fn headers_as_pairs_and_retry_hints() {
        let o = ok(r#"{"headers":[["Retry-After","3"],["retry-after","1"]]}"#);
        assert_eq!(o.rate.retry_after_ms, Some(3000), "of duplicates the larger wins");
        let o = ok(r#"{"retryAfterMs":10,"headers":{"retry-after":"3"}}"#);
        assert_eq!(o.rate.retry_after_ms, Some(10));
    }

    /// What a report keeps is bounded by its body's size, whatever its
    /// shape: a long name with many values is not copied once per value.
    #[test]
    fn only_read_headers_are_kept_and_only_so_many_lines() {
        let keep = |body: &str| serde_json::from_str::<ReleaseBody>(body).unwrap().headers.unwrap().0;
        let many = vec!["0"; 20_000].join(",");
        for body in [
            format!(r#"{{"headers":{{"{}":[{many}]}}}}"#, "a".repeat(30_000)),
            format!(r#"{{"headers":[["{}",[{many}]]]}}"#, "a".repeat(30_000)),
        ] {
            assert!(keep(&body).is_empty());
        }
        let read = format!(r#"{{"headers":{{"Retry-After":[{many}],"x-ratelimit-remaining":"3"}}}}"#);
        let kept = keep(&read);
        assert_eq!(kept.len(), MAX_FIELD_LINES);
        assert!(kept.iter().all(|(name, value)| *name == "retry-after" && value == "0"), "{:?}", &kept[..3]);
        // Past the bound, later lines are ignored, not refused.
        assert_eq!(ok(&read).rate.retry_after_ms, Some(0));
        let pairs = format!(r#"{{"headers":[["x-ratelimit-remaining",[{many}]],["x-ratelimit-limit","60"]]}}"#);
        assert_eq!(keep(&pairs).len(), MAX_FIELD_LINES);
        assert_eq!(ok(r#"{"headers":[["x-ratelimit-remaining","7"],["other",[1,2]]]}"#).rate.remaining, Some(7));
    }

    #[test]
    fn unparseable_header_values_are_ignored() {
        let o = ok(r#"{"headers":{"retry-after":"soon","x-ratelimit-remaining":"lots"}}"#);
        assert_eq!(o.rate.retry_after_ms, None);
        assert_eq!(o.rate.remaining, None);
        // Arrays inside a value's array say nothing, however deep.
        let deep = format!(
            r#"{{"headers":{{"a":{}1{}, "x-ratelimit-remaining":["7",["8"]]}}}}"#,
            "[".repeat(5000),
            "]".repeat(5000)
        );
        assert_eq!(ok(&deep).rate.remaining, Some(7));
    }

    /// serde_json refuses a number past `f64` before any visitor sees it; in
    /// a header the dialects read, it is an unparseable value like any other.
    #[test]
    fn header_numbers_no_float_holds_are_ignored_not_refused() {
        let digits = "9".repeat(400);
        for headers in [
            r#"{"retry-after":1e400}"#.to_string(),
            r#"{"Retry-After":-1e400}"#.to_string(),
            format!(r#"{{"retry-after":{digits}}}"#),
            format!(r#"{{"retry-after":-{digits}.5}}"#),
            r#"[["retry-after",1e400]]"#.to_string(),
            r#"{"retry-after":[1e400]}"#.to_string(),
            r#"[["retry-after",[1e400,-1e400]]]"#.to_string(),
        ] {
            let o = ok(&format!(r#"{{"status":429,"headers":{headers}}}"#));
            assert_eq!(o.status, Some(429), "{headers}");
            assert_eq!(o.rate.retry_after_ms, None, "{headers}");
        }
        // The rest of the report still applies, the value's other lines too.
        let o = ok(&format!(
            r#"{{"status":200,"headers":{{"retry-after":[1e400,"3",2e0],"x-ratelimit-remaining":{digits},
                "x-ratelimit-limit":60,"x-ratelimit-reset":1e400}}}}"#
        ));
        assert_eq!((o.status, o.rate.retry_after_ms), (Some(200), Some(3000)));
        assert_eq!((o.rate.remaining, o.rate.limit, o.rate.reset_ms), (None, Some(60), None));
        let o = ok(r#"{"headers":[["x-ratelimit-remaining",1e400],["x-ratelimit-remaining",4]]}"#);
        assert_eq!(o.rate.remaining, Some(4));
        // Numbers a float holds are read as their text, as before: `2e0` is
        // "2"; 1e308 is 309 digits, past any count, so it says nothing.
        assert_eq!(ok(r#"{"headers":{"retry-after":2e0}}"#).rate.retry_after_ms, Some(2000));
        // A string is its text, escapes read.
        assert_eq!(ok(r#"{"headers":{"retry-after":"\u0034"}}"#).rate.retry_after_ms, Some(4000));
        assert_eq!(ok(r#"{"headers":[["retry-after",["\u0035",""]]]}"#).rate.retry_after_ms, Some(5000));
        assert_eq!(ok(r#"{"headers":{"x-ratelimit-remaining":1e308}}"#).rate.remaining, None);
        // Around the header values, the report is held to its shape as before.
        bad(r#"{"headers":1e400}"#);
        bad(r#"{"headers":[[1e400,"3"]]}"#);
        bad(r#"{"headers":[["retry-after",1e400,1]]}"#);
        bad(r#"{"status":1e400}"#);
    }

    #[test]
    fn the_flat_fast_path_agrees_with_serde() {
        for body in [
            r#"{"status":200}"#,
            r#" { "status" : 429 , "throttled" : 3, "retryAfterMs":0 } "#,
            r#"{}"#,
            r#"{"status":99}"#,
            r#"{"status":600}"#,
            r#"{"status":200,"status":200}"#,
            r#"{"status":01}"#,
            r#"{"status":2e2}"#,
            r#"{"status":-1}"#,
            r#"{"status":200,}"#,
            r#"{"status":200}x"#,
            r#"{"throttled":18446744073709551616}"#,
            r#"{"rate":{"remaining":1}}"#,
            r#"{"statuses":200}"#,
            r#"{"stat":200}"#,
            r#"{"Status":200}"#,
            r#"{"status"#,
            r#"{"retryAfterMs":5,"throttled":1}"#,
        ] {
            let flat = parse_flat(body.as_bytes());
            let mut reference = body.to_string();
            // The general path alone: a field the fast path does not know.
            reference.insert_str(reference.find('{').unwrap() + 1, r#""headers":{},"#);
            if let Some(flat) = flat {
                let general = parse_release(reference.replace(",}", "}").as_bytes(), 0).map(|o| o.unwrap());
                assert_eq!(flat.is_ok(), general.is_ok(), "{body}");
                if let (Ok(a), Ok(b)) = (flat, general) {
                    assert_eq!(a, b, "{body}");
                }
            }
        }
        assert!(parse_flat(br#"{"status":200}"#).is_some());
        assert!(parse_flat(br#"{"status":200,"status":200}"#).is_none());
        assert!(parse_flat(br#"{"rate":{}}"#).is_none());
        for body in [&br#"{"statuses":200}"#[..], br#"{"stat":200}"#, br#"{"status"#, br#"{"status"200}"#] {
            assert!(parse_flat(body).is_none(), "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn whole_numbers_past_64_bits_saturate_where_no_bound_holds() {
        let o = ok(r#"{"throttled":18446744073709551616,"retryAfterMs":1e20,
            "rate":{"limit":1e300,"remaining":1e17,"resetMs":99999999999999999999}}"#);
        assert_eq!(o.throttled, u64::MAX);
        assert_eq!(o.rate.retry_after_ms, Some(u64::MAX));
        assert_eq!(o.rate.limit, Some(u64::MAX));
        assert_eq!(o.rate.remaining, Some(100_000_000_000_000_000));
        assert_eq!(o.rate.reset_ms, Some(u64::MAX));
        // `status` has a bound, and no huge number is negative.
        bad(r#"{"status":1e20}"#);
        bad(r#"{"status":18446744073709551616}"#);
        bad(r#"{"retryAfterMs":-1e20}"#);
        bad(r#"{"rate":{"remaining":-18446744073709551616}}"#);
    }

    #[test]
    fn wrong_types_and_ranges_are_refused() {
        for body in [
            "[]",
            "null",
            "42",
            r#""text""#,
            r#"{"status":99}"#,
            r#"{"status":600}"#,
            r#"{"status":200.5}"#,
            r#"{"status":"200"}"#,
            r#"{"throttled":-1}"#,
            r#"{"retryAfterMs":1.5}"#,
            r#"{"rate":{"remaining":-3}}"#,
            r#"{"rate":5}"#,
            r#"{"status":200,"rate":[10,0,60000]}"#,
            r#"{"headers":[["a"]]}"#,
            r#"{"headers":[["retry-after"]]}"#,
            r#"{"headers":[["retry-after","1","2"]]}"#,
            r#"{"headers":[["a","1","2"]]}"#,
            r#"{"headers":[[1,"2"]]}"#,
            r#"{"headers":[[]]}"#,
            r#"{"headers":"retry-after: 3"}"#,
            r#"{"status":200"#,
        ] {
            bad(body);
        }
    }

    #[test]
    fn a_member_of_the_wrong_type_is_named() {
        for (body, named) in [
            (r#"{"status":"200"}"#, "`status`"),
            (r#"{"status":200,"throttled":true}"#, "`throttled`"),
            (r#"{"retryAfterMs":"2s"}"#, "`retryAfterMs`"),
            (r#"{"status":429,"rate":{"remaining":"0"}}"#, "`rate.remaining`"),
            (r#"{"rate":[10,0,60000]}"#, "`rate` must be an object"),
            (r#"{"status":200,"headers":"retry-after: 3"}"#, "`headers`"),
            (r#"{"headers":[["retry-after"]]}"#, "`headers`"),
            (r#"{"status":200"#, "not valid JSON"),
            (r#"{"status":1e400}"#, "`status`"),
            (r#"{"status":200,"throttled":-1e400}"#, "`throttled`"),
            (r#"{"retryAfterMs":1e999,"note":"x"}"#, "`retryAfterMs`"),
            (r#"{"status":429,"rate":{"note":"x","resetMs":1e400}}"#, "`rate.resetMs`"),
            (r#"{"status":"200","rate":{"note":"from the SDK"}}"#, "`status`"),
            (r#"{"rate":{"note":"x"},"headers":[["retry-after"]]}"#, "`headers`"),
            (r#"{"rate":{"note":"x","limit":"10"}}"#, "`rate.limit`"),
            (r#"{"rate":{"limit":10,"tokenResetMs":true}}"#, "`rate.tokenResetMs`"),
            (r#"{"rate":{"resetMs":-1}}"#, "`rate.resetMs`"),
            (r#"{"rate":{"remaining":0,"tokenRemaining":1.5}}"#, "`rate.tokenRemaining`"),
            (r#"{"rate":{"tokenLimit":-2}}"#, "`rate.tokenLimit`"),
        ] {
            let why = parse_release(body.as_bytes(), 0).unwrap_err();
            assert!(why.contains(named), "{body}: {why}");
        }
    }

    #[test]
    fn a_member_given_twice_is_named() {
        for (body, named) in [
            (r#"{"status":200,"status":429}"#, "`status` is given twice"),
            (r#"{"status":429,"throttled":1,"throttled":2}"#, "`throttled` is given twice"),
            (r#"{"retryAfterMs":null,"retryAfterMs":5}"#, "`retryAfterMs` is given twice"),
            (r#"{"rate":{},"rate":null}"#, "`rate` is given twice"),
            (r#"{"headers":{},"headers":[]}"#, "`headers` is given twice"),
            (r#"{"rate":{"limit":1,"limit":2}}"#, "`rate.limit` is given twice"),
            (r#"{"rate":{"remaining":0,"remaining":0}}"#, "`rate.remaining` is given twice"),
            (r#"{"rate":{"resetMs":1,"resetMs":2}}"#, "`rate.resetMs` is given twice"),
            (r#"{"rate":{"tokenLimit":1,"tokenLimit":2}}"#, "`rate.tokenLimit` is given twice"),
            (r#"{"rate":{"tokenRemaining":1,"tokenRemaining":0}}"#, "`rate.tokenRemaining` is given twice"),
            (r#"{"rate":{"tokenResetMs":1,"tokenResetMs":2}}"#, "`rate.tokenResetMs` is given twice"),
        ] {
            let why = parse_release(body.as_bytes(), 0).unwrap_err();
            assert!(why.contains(named), "{body}: {why}");
        }
    }

    #[test]
    fn a_member_nested_past_serde_jsons_depth_is_still_named() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        for (body, named) in [
            (format!(r#"{{"status":{}}}"#, deep(200)), "`status`"),
            (format!(r#"{{"throttled":{{"a":{}}}}}"#, deep(200)), "`throttled`"),
            (format!(r#"{{"rate":{{"limit":{}}}}}"#, deep(200)), "`rate.limit`"),
            (format!(r#"{{"headers":[{}]}}"#, deep(200)), "`headers`"),
            // A deep value nothing reads does not hide the member that is wrong.
            (format!(r#"{{"status":"200","note":{}}}"#, deep(200)), "`status`"),
            (r#"{"status":"200","note":[1e400]}"#.to_string(), "`status`"),
        ] {
            let why = parse_release(body.as_bytes(), 0).unwrap_err();
            assert!(why.contains(named), "{}: {why}", &body[..40]);
        }
        // A deep value nothing reads is skipped, as in any accepted body.
        assert!(parse_release(format!(r#"{{"status":200,"note":{}}}"#, deep(200)).as_bytes(), 0).is_ok());
    }
}
