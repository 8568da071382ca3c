//! The JSON configuration: its shape, its defaults and its validation.
//!
//! Parsing is strict (camelCase, unknown fields rejected) and validation
//! names the offending field, so a typo stops start-up (or is refused by a
//! reload) instead of silently changing how a pool is governed. Nothing here
//! touches sockets or pool state; `Config::load` only reads the file.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::Path;

use serde::Deserialize;

pub mod resolver;
pub mod upstream;
use resolver::ResolverConfig;
use upstream::UpstreamConfig;

/// The configuration the binary runs with when no `--config` is given.
pub const EMBEDDED_DEFAULT: &str = r#"{
  "listen": "127.0.0.1:7070",
  "adminListen": "127.0.0.1:7071",
  "accessLog": "-",
  "pools": {
    "demo": {
      "keys": ["nb_demo_0123456789abcdef"],
      "concurrency": 4,
      "queue": { "size": 100, "timeoutMs": 30000 }
    }
  }
}"#;

/// Upper bounds that keep every number meaningful; each is documented in the README.
pub const MAX_CONCURRENCY: u32 = 10_000_000;
pub const MAX_QUEUE_SIZE: u32 = 10_000_000;
pub const MAX_DURATION_MS: u64 = 7 * 24 * 3_600_000;
/// The shortest `termMs`.
pub const MIN_TERM_MS: u64 = 10;
pub const MAX_BODY_LIMIT: usize = 16 * 1024 * 1024;
pub const MAX_CONNECTIONS: usize = 1_000_000;
/// The longest `idleSpinUs`: a spin is a pause in sleeping, not a busy loop.
pub const MAX_IDLE_SPIN_US: u64 = 1_000;
/// The most keys (and, apart, key digests) one pool takes: each request's
/// key is compared with every one of them, in constant time.
pub const MAX_KEYS: usize = 1_000;
/// The largest configuration file read.
pub const MAX_CONFIG_BYTES: u64 = 64 * 1024 * 1024;
/// The longest connection timeout (`headTimeoutMs`, `idleTimeoutMs`,
/// `writeTimeoutMs`) and the widest clock allowance (`access.hmac.toleranceMs`,
/// `access.jwt.leewayMs`): an hour.
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;
/// The longest key, in bytes.
pub const MAX_KEY_LEN: usize = 512;
/// The fastest rate gate: a million grants a second.
pub const MAX_RPM: u32 = 60_000_000;
/// The largest `rpmBurst`, `idempotencyKeys` and `access.hmac.nonceCapacity`
/// (each a count of things held in memory, as a queue's places are).
pub const MAX_HELD_COUNT: u32 = 10_000_000;

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    #[serde(default = "defaults::listen")]
    pub listen: String,
    #[serde(default = "defaults::admin_listen")]
    pub admin_listen: Option<String>,
    /// Bearer token for every admin route but `/healthz`; required when
    /// `adminListen` is not a loopback address.
    #[serde(default)]
    pub admin_token: Option<String>,
    #[serde(default = "defaults::access_log")]
    pub access_log: Option<String>,
    #[serde(default = "defaults::max_body_bytes")]
    pub max_body_bytes: usize,
    #[serde(default)]
    pub public_host: Option<String>,
    /// Open connections on the public listener; beyond it new ones get a 503 and are closed.
    #[serde(default = "defaults::max_connections")]
    pub max_connections: usize,
    /// A request head and body must arrive within this after its first byte.
    #[serde(default = "defaults::head_timeout_ms")]
    pub head_timeout_ms: u64,
    /// A keep-alive connection with nothing in flight is closed after this.
    #[serde(default = "defaults::idle_timeout_ms")]
    pub idle_timeout_ms: u64,
    /// A client that takes none of its pending answers for this long is closed.
    #[serde(default = "defaults::write_timeout_ms")]
    pub write_timeout_ms: u64,
    /// After a turn that served several clients, the loop polls without
    /// sleeping this long before it blocks (0: it sleeps at once).
    #[serde(default = "defaults::idle_spin_us")]
    pub idle_spin_us: u64,
    /// The 32-byte secret that signs slot ids, beside the configuration file
    /// (SPEC §11); the embedded demo keeps it in memory.
    #[serde(default = "defaults::slot_secret_file")]
    pub slot_secret_file: String,
    /// Where a graceful stop leaves its snapshot, beside the configuration
    /// file (SPEC §11); `null`: every start takes the crash path.
    #[serde(default = "defaults::state_file")]
    pub state_file: Option<String>,
    /// Also snapshot this often while running (off the request path); `null`: only at stop.
    #[serde(default)]
    pub snapshot_interval_ms: Option<u64>,
    /// How upstream host names are looked up and cached (proxy mode).
    #[serde(default)]
    pub resolver: ResolverConfig,
    #[serde(deserialize_with = "unique_pools")]
    pub pools: BTreeMap<String, PoolConfig>,
}

/// serde's message with the Rust type it expected said in words: an
/// operator reads `expected a whole number from 0 to 4294967295`, not
/// `expected u32` (the field's own range is checked after, in words too).
fn plain_types(message: &str) -> String {
    const WORDS: [(&str, &str); 6] = [
        ("expected u8", "expected a whole number from 0 to 255"),
        ("expected u16", "expected a whole number from 0 to 65535"),
        ("expected u32", "expected a whole number from 0 to 4294967295"),
        ("expected u64", "expected a whole number from 0 to 18446744073709551615"),
        ("expected usize", "expected a whole number from 0 to 18446744073709551615"),
        ("expected f64", "expected a number"),
    ];
    let mut out = message.to_owned();
    // A nested section (`expected struct QueueConfig`) is a JSON object.
    if let Some(at) = out.find("expected struct ") {
        let name = at + "expected struct ".len();
        let end = out[name..].find(|c: char| !c.is_ascii_alphanumeric()).map_or(out.len(), |n| name + n);
        out.replace_range(at..end, "expected an object");
    }
    // serde_json reads a whole number past 64 bits as a float, and serde
    // then calls it a wrong type; say what the operator wrote instead.
    if let Some(at) = out.find("invalid type: floating point `") {
        let value = at + "invalid type: floating point `".len();
        if let Some(n) = out[value..].find('`') {
            let read = out[value..value + n].to_owned();
            let words =
                format!("invalid value: a number with a fraction, an exponent or out of range (read as {read})");
            out.replace_range(at..value + n + 1, &words);
        }
    }
    for (rust, words) in WORDS {
        // Only the whole word: `expected u32` is not `expected u32x`.
        if let Some(at) = out.find(rust) {
            let end = at + rust.len();
            if !out[end..].starts_with(|c: char| c.is_ascii_alphanumeric()) {
                out.replace_range(at..end, words);
            }
        }
    }
    hide_number_for_string(hide_misplaced_string(out))
}

/// A string where a list or an object goes is quoted by serde (`invalid
/// type: string "…", expected a sequence`), yet it is most often a secret
/// written one level too high (`"keys": "nb_live_…"`, `"setHeaders": "Bearer
/// …"`, `"hmac": "…"`), and the message lands in the log of a refused start
/// or reload: it is said to be a string, not quoted. A string where a number
/// or a word goes (`"termMs": "soon"`) is still quoted.
fn hide_misplaced_string(mut message: String) -> String {
    const STRING: &str = "invalid type: string \"";
    let Some(at) = message.find(STRING) else {
        return message;
    };
    const EXPECTED: &str = "\", expected ";
    let Some(close) = message[at..].rfind(EXPECTED).map(|n| at + n) else {
        return message;
    };
    let expected = &message[close + EXPECTED.len()..];
    if ["a sequence", "a map", "an object"].iter().any(|kind| expected.starts_with(kind)) {
        message.replace_range(at..close + 1, "invalid type: a string (not shown: it may be a secret)");
    }
    message
}

/// A number where a string goes is most often a key, token or secret
/// written without its quotes (`"keys": [98765…]`, `"adminToken": 1234…`,
/// `"hmac": {"secret": 5…}`), and serde shows it in the message that lands
/// in the log of a refused start or reload: it is said to be a number, not
/// shown. A number out of a number field's range is still shown.
fn hide_number_for_string(mut message: String) -> String {
    const EXPECTED: &str = ", expected a string";
    let Some(end) = message.find(EXPECTED) else {
        return message;
    };
    let shown = ["invalid type: integer `", "invalid value: a number with a fraction"];
    if let Some(at) = shown.iter().find_map(|start| message[..end].rfind(start)) {
        message.replace_range(at..end, "invalid type: a number (not shown: it may be a secret)");
    }
    message
}

/// The only places a configuration holds arrays, as paths (`*`: any pool
/// name). Anywhere else an array would be read as a struct's fields in
/// order (serde takes `"queue": [5, 1000]` for `{"size": 5, "timeoutMs":
/// 1000}`), which bypasses the named fields: it is refused instead. A new
/// list-valued field is added here.
const ARRAY_FIELDS: [&[&str]; 6] = [
    &["resolver", "nameservers"],
    &["pools", "*", "keys"],
    &["pools", "*", "keySha256"],
    &["pools", "*", "access", "ipAllow"],
    &["pools", "*", "access", "trustedProxies"],
    &["pools", "*", "upstream", "hosts"],
];

/// What an error's path says in place of a `setHeaders` name that is no
/// header name: most often a credential written where the name goes, it
/// would land in the log of a refused start or reload.
const HIDDEN_NAME: &str = "(a name that is no header name, not shown: it may be a secret)";

/// serde's path to a wrongly typed value (`pools.p.queue.timeoutMs`), a
/// `setHeaders` name that is no header name said as `HIDDEN_NAME`.
fn shown_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut shown = String::new();
    let mut headers = false;
    for segment in path {
        if !shown.is_empty() && !matches!(segment, Segment::Seq { .. }) {
            shown.push('.');
        }
        match segment {
            Segment::Map { key } if headers && !upstream::is_header_name(key) => shown.push_str(HIDDEN_NAME),
            segment => shown.push_str(&segment.to_string()),
        }
        headers = matches!(segment, Segment::Map { key } if key == "setHeaders");
    }
    if shown.is_empty() {
        shown.push('.');
    }
    shown
}

/// Whether `path` (the members walked from the top) is one of `ARRAY_FIELDS`.
fn is_array_field(path: &[&str]) -> bool {
    ARRAY_FIELDS.iter().any(|pattern| {
        pattern.len() == path.len() && pattern.iter().zip(path.iter()).all(|(p, name)| *p == "*" || p == name)
    })
}

/// The refusal of an array at `path`, which is none of `ARRAY_FIELDS`.
fn positional(path: &[&str]) -> ConfigError {
    if path.is_empty() {
        return ConfigError("invalid configuration: it must be a JSON object of named fields".into());
    }
    let lists: Vec<String> = ARRAY_FIELDS.iter().map(|pattern| pattern.join(".").replace('*', "<pool>")).collect();
    ConfigError(format!(
        "invalid configuration: {}: an array where named fields or a single value go; only {} are lists",
        path.join("."),
        lists.join(", ")
    ))
}

/// The members walked to an array that serde read as a struct's fields in
/// order, when its error's path went through one: in a file that is no
/// JSON (`[[{}`, cut short), `refuse_positional` sees no value, and serde
/// would name a place that is no field (`[0]: invalid type: sequence,
/// expected a string`).
fn positional_path(path: &serde_path_to_error::Path) -> Option<Vec<&str>> {
    use serde_path_to_error::Segment;
    let mut members = Vec::new();
    let mut headers = false;
    for segment in path {
        match segment {
            Segment::Seq { .. } if !is_array_field(&members) => return Some(members),
            Segment::Map { key } => {
                members.push(if headers && !upstream::is_header_name(key) { HIDDEN_NAME } else { key.as_str() });
                headers = key == "setHeaders";
            }
            _ => headers = false,
        }
    }
    None
}

/// Refuses an array anywhere but at `ARRAY_FIELDS`, naming its path
/// (`path` is the members walked to `value`).
fn refuse_positional<'v>(value: &'v serde_json::Value, path: &mut Vec<&'v str>) -> Result<(), ConfigError> {
    use serde_json::Value;
    match value {
        Value::Array(_) if is_array_field(path) => Ok(()),
        Value::Array(_) => Err(positional(path)),
        Value::Object(members) => {
            let headers = path.last() == Some(&"setHeaders");
            for (name, member) in members {
                path.push(if headers && !upstream::is_header_name(name) { HIDDEN_NAME } else { name });
                refuse_positional(member, path)?;
                path.pop();
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The `pools` object, refusing a pool name given twice: a map would keep the
/// last and silently drop the first pool's keys and limits.
fn unique_pools<'de, D: serde::Deserializer<'de>>(de: D) -> Result<BTreeMap<String, PoolConfig>, D::Error> {
    unique_map(de, "pool")
}

/// A JSON object as a map, refusing a name given twice (`what` names such a
/// name in the error): a map would keep the last value and silently drop the first.
pub(crate) fn unique_map<'de, D, V>(de: D, what: &'static str) -> Result<BTreeMap<String, V>, D::Error>
where
    D: serde::Deserializer<'de>,
    V: Deserialize<'de>,
{
    struct Unique<V>(&'static str, std::marker::PhantomData<V>);
    impl<'de, V: Deserialize<'de>> serde::de::Visitor<'de> for Unique<V> {
        type Value = BTreeMap<String, V>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "an object of {}s by name", self.0)
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(name) = map.next_key::<String>()? {
                if out.contains_key(&name) {
                    // A name that is no token is not quoted: most often a
                    // credential written where a header's name goes.
                    let message = if upstream::is_header_name(&name) {
                        format!("duplicate {} `{name}`", self.0)
                    } else {
                        format!("duplicate {} name (not shown: it may be a secret)", self.0)
                    };
                    return Err(serde::de::Error::custom(message));
                }
                let value = map.next_value()?;
                out.insert(name, value);
            }
            Ok(out)
        }
    }
    de.deserialize_map(Unique(what, std::marker::PhantomData))
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolConfig {
    #[serde(default)]
    pub keys: Vec<String>,
    #[serde(default)]
    pub key_sha256: Vec<String>,
    #[serde(default)]
    pub allow_authorization_header: bool,
    #[serde(default = "defaults::concurrency")]
    pub concurrency: u32,
    #[serde(default)]
    pub queue: QueueConfig,
    #[serde(default)]
    pub rpm: Option<u32>,
    #[serde(default)]
    pub rpm_burst: Option<u32>,
    #[serde(default = "defaults::term_ms")]
    pub term_ms: u64,
    #[serde(default = "defaults::renew_interval_ms")]
    pub renew_interval_ms: u64,
    #[serde(default = "defaults::request_timeout_ms")]
    pub request_timeout_ms: u64,
    #[serde(default = "defaults::adaptive")]
    pub adaptive: bool,
    /// Live `Idempotency-Key`s the pool keeps at most; a new key beyond them gets a 503.
    #[serde(default = "defaults::idempotency_keys")]
    pub idempotency_keys: u32,
    #[serde(default)]
    pub access: AccessConfig,
    /// Proxy mode (SPEC §12): requests for this pool are forwarded here.
    #[serde(default)]
    pub upstream: Option<UpstreamConfig>,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QueueConfig {
    #[serde(default = "defaults::queue_size")]
    pub size: u32,
    #[serde(default = "defaults::queue_timeout_ms")]
    pub timeout_ms: u64,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig { size: defaults::queue_size(), timeout_ms: defaults::queue_timeout_ms() }
    }
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AccessConfig {
    #[serde(default)]
    pub ip_allow: Vec<String>,
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    #[serde(default)]
    pub hmac: Option<HmacConfig>,
    #[serde(default)]
    pub jwt: Option<JwtConfig>,
    #[serde(default)]
    pub cloudflare_access: Option<CloudflareAccessConfig>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HmacConfig {
    pub secret: String,
    #[serde(default = "defaults::hmac_tolerance_ms")]
    pub tolerance_ms: u64,
    /// Nonces remembered at once; when full, signed requests get a 503.
    #[serde(default = "defaults::nonce_capacity")]
    pub nonce_capacity: usize,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JwtConfig {
    pub hs256_secret: String,
    #[serde(default)]
    pub issuer: Option<String>,
    #[serde(default)]
    pub audience: Option<String>,
    #[serde(default = "defaults::jwt_leeway_ms")]
    pub leeway_ms: u64,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CloudflareAccessConfig {
    pub jwks_file: String,
    pub audience: String,
    pub issuer: String,
}

mod defaults {
    pub fn listen() -> String {
        "127.0.0.1:7070".into()
    }
    pub fn admin_listen() -> Option<String> {
        Some("127.0.0.1:7071".into())
    }
    pub fn slot_secret_file() -> String {
        "nthpool.secret".into()
    }
    pub fn state_file() -> Option<String> {
        Some("nthpool.state".into())
    }
    pub fn access_log() -> Option<String> {
        Some("access.log".into())
    }
    pub fn max_body_bytes() -> usize {
        65_536
    }
    pub fn max_connections() -> usize {
        10_000
    }
    pub fn head_timeout_ms() -> u64 {
        10_000
    }
    pub fn idle_timeout_ms() -> u64 {
        60_000
    }
    pub fn write_timeout_ms() -> u64 {
        10_000
    }
    pub fn idle_spin_us() -> u64 {
        50
    }
    pub fn concurrency() -> u32 {
        16
    }
    pub fn queue_size() -> u32 {
        1000
    }
    pub fn queue_timeout_ms() -> u64 {
        30_000
    }
    pub fn term_ms() -> u64 {
        30_000
    }
    pub fn renew_interval_ms() -> u64 {
        10_000
    }
    pub fn request_timeout_ms() -> u64 {
        60_000
    }
    pub fn adaptive() -> bool {
        true
    }
    pub fn idempotency_keys() -> u32 {
        1024
    }
    pub fn hmac_tolerance_ms() -> u64 {
        300_000
    }
    pub fn nonce_capacity() -> usize {
        100_000
    }
    pub fn jwt_leeway_ms() -> u64 {
        30_000
    }
}

/// A configuration problem, worded for the operator: it names the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

fn fail<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        use std::io::Read;
        let cannot = |e: std::io::Error| ConfigError(format!("cannot read {}: {e}", path.display()));
        let mut text = Vec::new();
        std::fs::File::open(path).and_then(|f| f.take(MAX_CONFIG_BYTES + 1).read_to_end(&mut text)).map_err(cannot)?;
        if text.len() as u64 > MAX_CONFIG_BYTES {
            return fail(format!("{}: larger than {} MiB", path.display(), MAX_CONFIG_BYTES >> 20));
        }
        Config::parse(&text).map_err(|e| ConfigError(format!("{}: {}", path.display(), e.0)))
    }

    /// `load` for a reload, which reads the file in the event loop: only a
    /// regular file (symbolic links followed) is opened, as for the files
    /// the configuration names (`files::read_bounded`). A named pipe's `open`
    /// would wait for a writer, and every client with it.
    pub fn reload(path: &Path) -> Result<Config, ConfigError> {
        // `metadata` does not open: a named pipe is refused without waiting.
        match std::fs::metadata(path) {
            Ok(meta) if !meta.is_file() => fail(format!("cannot read {}: it is not a regular file", path.display())),
            _ => Config::load(path),
        }
    }

    pub fn embedded() -> Config {
        Config::parse(EMBEDDED_DEFAULT.as_bytes()).expect("the embedded configuration is valid")
    }

    pub fn parse(text: &[u8]) -> Result<Config, ConfigError> {
        // A UTF-8 byte order mark, which some editors write, is no part of
        // the JSON (RFC 8259 §8.1 lets a parser ignore it).
        let text = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
        // Broken JSON is left to the typed pass, which says where.
        let positional = serde_json::from_slice::<serde_json::Value>(text)
            .map_or(Ok(()), |value| refuse_positional(&value, &mut Vec::new()));
        let typed = Config::typed(text);
        if let Err(misplaced) = positional {
            // A misspelled field holding a list (`"key": [...]`) is named as
            // unknown, with the names that go there, as one holding a number is.
            return Err(match typed {
                Err(unknown) if unknown.0.contains("unknown field") => unknown,
                _ => misplaced,
            });
        }
        let config = typed?;
        config.validate()?;
        Ok(config)
    }

    /// The typed pass: the configuration as serde reads it, before the
    /// checks of `validate`.
    fn typed(text: &[u8]) -> Result<Config, ConfigError> {
        // The path names the field of a wrongly typed value (`pools.p.queue.timeoutMs`).
        let mut de = serde_json::Deserializer::from_slice(text);
        let config: Config = serde_path_to_error::deserialize(&mut de).map_err(|e| {
            if let Some(members) = positional_path(e.path()) {
                return positional(&members);
            }
            let path = shown_path(e.path());
            let inner = e.into_inner();
            // Broken JSON names no field (the path would read `?`): its line
            // and column say where. A value that is itself broken (`1e400`,
            // `01`, none at all) has its field named too.
            let field = !path.contains('?') && path != ".";
            if inner.is_syntax() && field {
                ConfigError(format!("invalid configuration: {path}: JSON syntax error: {inner}"))
            } else if inner.is_syntax() || inner.is_eof() {
                ConfigError(format!("invalid configuration: JSON syntax error: {inner}"))
            } else if path == "." {
                ConfigError(format!("invalid configuration: {}", plain_types(&inner.to_string())))
            } else {
                ConfigError(format!("invalid configuration: {path}: {}", plain_types(&inner.to_string())))
            }
        })?;
        // One object and nothing after it but whitespace.
        de.end()
            .map_err(|e| ConfigError(format!("invalid configuration: text after the configuration object ({e})")))?;
        Ok(config)
    }

    pub fn listen_addr(&self) -> SocketAddr {
        self.listen.parse().expect("validated")
    }

    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_listen.as_ref().map(|a| a.parse().expect("validated"))
    }

    /// The files the configuration reads besides itself (a JWKS, a CA
    /// bundle, a `${file:PATH}` value), each with the field that names it.
    pub fn files_read(&self) -> Vec<(String, &Path)> {
        let mut files = Vec::new();
        for (name, pool) in &self.pools {
            if let Some(cf) = &pool.access.cloudflare_access {
                files.push((format!("pools.{name}.access.cloudflareAccess.jwksFile"), Path::new(&cf.jwks_file)));
            }
            if let Some(upstream) = &pool.upstream {
                files.extend(
                    upstream.files_read().map(|(field, path)| (format!("pools.{name}.upstream.{field}"), path)),
                );
            }
        }
        files
    }

    /// What is valid but likely not meant, one sentence each: logged at a
    /// start and a reload, printed by `--check-config`.
    pub fn cautions(&self) -> Vec<String> {
        let mut said = Vec::new();
        for (name, pool) in &self.pools {
            if let Some(upstream) = pool.upstream.as_ref().filter(|u| u.timeout_ms > pool.request_timeout_ms) {
                said.push(format!(
                    "pools.{name}: requestTimeoutMs ({}) cuts every proxied exchange, streams included, before \
                     upstream.timeoutMs ({}) can run out: raise requestTimeoutMs for calls that take longer",
                    pool.request_timeout_ms, upstream.timeout_ms
                ));
            }
        }
        said
    }

    /// A reload's check against the admin listener actually bound (a new
    /// `adminListen` waits for a restart): a non-loopback one keeps
    /// requiring `adminToken`.
    pub fn check_admin_bound(&self, bound: SocketAddr) -> Result<(), ConfigError> {
        if !bound.ip().to_canonical().is_loopback() && self.admin_token.is_none() {
            return fail(format!(
                "adminToken: the admin listener stays bound to {bound}, not a loopback address, until a restart: it keeps requiring a token"
            ));
        }
        Ok(())
    }

    /// `--listen` in place of `listen`: refused where the file's `listen`
    /// would be (the admin or a pool's listener on that address).
    pub fn check_listen_override(&self, listen: SocketAddr) -> Result<(), ConfigError> {
        let with = Config { listen: listen.to_string(), ..self.clone() };
        with.validate().map_err(|e| ConfigError(format!("--listen {listen}: {}", e.0)))
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.listen.parse::<SocketAddr>().is_err() {
            return fail(format!("listen: {:?} is not an address like 127.0.0.1:7070", self.listen));
        }
        if let Some(admin) = &self.admin_listen {
            let Ok(addr) = admin.parse::<SocketAddr>() else {
                return fail(format!("adminListen: {admin:?} is not an address like 127.0.0.1:7071"));
            };
            if let Some(listen) = self.listen.parse().ok().filter(|&l| clash(addr, l)) {
                return fail(match addr == listen {
                    true => format!("adminListen: {admin} is the lock API's `listen` address too"),
                    false => format!("adminListen: {admin} and `listen` {listen} {OVERLAP}"),
                });
            }
            // `[::ffff:127.0.0.1]` is loopback as much as `127.0.0.1`.
            if !addr.ip().to_canonical().is_loopback() && self.admin_token.is_none() {
                return fail(format!(
                    "adminListen {admin} is not a loopback address: set adminToken (16 bytes or more) to protect the dashboard"
                ));
            }
        }
        if self.admin_token.as_ref().is_some_and(|t| t.len() < 16 || t.bytes().any(|b| !b.is_ascii_graphic())) {
            return fail("adminToken must be 16 or more printable ASCII characters without spaces");
        }
        if self.slot_secret_file.is_empty() {
            return fail("slotSecretFile: use a file path (relative to the configuration file)");
        }
        match self.state_file.as_deref() {
            Some("") => return fail("stateFile: use a file path (relative to the configuration file), or null"),
            Some(f) if f == self.slot_secret_file => {
                return fail(format!("stateFile: {f} is the slot secret's file too"));
            }
            _ => {}
        }
        if self.snapshot_interval_ms.is_some_and(|ms| !(1000..=MAX_DURATION_MS).contains(&ms)) {
            return fail(format!("snapshotIntervalMs must be between 1000 and {MAX_DURATION_MS}, or null"));
        }
        if self.snapshot_interval_ms.is_some() && self.state_file.is_none() {
            return fail("snapshotIntervalMs needs stateFile to be set");
        }
        if let Some(path) = &self.access_log {
            if path.is_empty() {
                return fail("accessLog: use a file path, \"-\" for standard output, or null");
            }
        }
        // No file can be named so: said here, by `--check-config` too, not
        // found out by the start that opens it.
        let paths = [
            ("accessLog", self.access_log.as_deref()),
            ("slotSecretFile", Some(self.slot_secret_file.as_str())),
            ("stateFile", self.state_file.as_deref()),
        ];
        for (field, path) in paths {
            if path.is_some_and(|p| p.contains('\0')) {
                return fail(format!("{field}: a file path cannot hold a NUL character"));
            }
        }
        if self.max_body_bytes == 0 || self.max_body_bytes > MAX_BODY_LIMIT {
            return fail(format!("maxBodyBytes must be between 1 and {MAX_BODY_LIMIT}"));
        }
        if self.max_connections == 0 || self.max_connections > MAX_CONNECTIONS {
            return fail(format!("maxConnections must be between 1 and {MAX_CONNECTIONS}"));
        }
        for (name, value) in [
            ("headTimeoutMs", self.head_timeout_ms),
            ("idleTimeoutMs", self.idle_timeout_ms),
            ("writeTimeoutMs", self.write_timeout_ms),
        ] {
            if !(10..=MAX_TIMEOUT_MS).contains(&value) {
                return fail(format!("{name} must be between 10 and {MAX_TIMEOUT_MS}"));
            }
        }
        if self.idle_spin_us > MAX_IDLE_SPIN_US {
            return fail(format!("idleSpinUs must be between 0 and {MAX_IDLE_SPIN_US}"));
        }
        if let Some(host) = &self.public_host {
            if !is_host_name(host) {
                return fail(format!(
                    "publicHost: {host:?} is not a host name without port, like api.example.com (or an IP address, an IPv6 one in brackets)"
                ));
            }
        }
        self.resolver.validate()?;
        if self.pools.is_empty() {
            return fail("pools: configure at least one pool");
        }
        for (name, pool) in &self.pools {
            if !is_dns_label(name) {
                return fail(format!(
                    "pools: {} is not a valid pool name (1-63 characters of a-z, 0-9 and '-', not starting or ending with '-')",
                    quoted_pool_name(name)
                ));
            }
            pool.validate().map_err(|e| ConfigError(format!("pools.{name}.{}", e.0)))?;
        }
        self.validate_proxy_routes()
    }

    /// No two pools claim one proxy host or listener, and no proxy listener
    /// takes the lock API's or the admin listener's address.
    fn validate_proxy_routes(&self) -> Result<(), ConfigError> {
        let mut hosts: BTreeMap<String, &str> = BTreeMap::new();
        let mut listens: Vec<(&str, SocketAddr)> = Vec::new();
        for (name, upstream) in self.pools.iter().filter_map(|(n, p)| Some((n, p.upstream.as_ref()?))) {
            for host in &upstream.hosts {
                // Proxy hosts take their requests before any lock route is
                // looked at; both are matched without case or a final dot.
                if self.public_host.as_ref().is_some_and(|public| host_key(public) == host_key(host)) {
                    return fail(format!(
                        "pools.{name}.upstream.hosts: {host} is publicHost, where the lock API is served"
                    ));
                }
                match hosts.insert(host_key(host), name) {
                    Some(other) if other == name => {
                        return fail(format!("pools.{name}.upstream.hosts: {host} is listed twice"));
                    }
                    Some(other) => {
                        return fail(format!("pools.{name}.upstream.hosts: {host} is already routed to pool {other}"));
                    }
                    None => {}
                }
            }
            if let Some(listen) = &upstream.listen {
                let addr: SocketAddr = listen.parse().expect("validated");
                if let Some((other, at)) = listens.iter().find(|(_, at)| clash(addr, *at)) {
                    return fail(match addr == *at {
                        true => format!("pools.{name}.upstream.listen: {addr} is already pool {other}'s listener"),
                        false => format!("pools.{name}.upstream.listen: {addr} and pool {other}'s {at} {OVERLAP}"),
                    });
                }
                listens.push((name, addr));
                let servers = [("listen", Some(&self.listen)), ("adminListen", self.admin_listen.as_ref())];
                for (field, server) in servers {
                    if let Some(at) = server.and_then(|a| a.parse().ok()).filter(|&at| clash(addr, at)) {
                        return fail(format!("pools.{name}.upstream.listen: {addr} and `{field}` {at} {OVERLAP}"));
                    }
                }
            }
        }
        Ok(())
    }
}

impl PoolConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.keys.is_empty() && self.key_sha256.is_empty() {
            return fail("keys: a pool needs at least one key in keys or keySha256");
        }
        for (field, count) in [("keys", self.keys.len()), ("keySha256", self.key_sha256.len())] {
            if count > MAX_KEYS {
                return fail(format!("{field}: at most {MAX_KEYS} entries (this pool has {count})"));
            }
        }
        let mut keys = std::collections::HashMap::with_capacity(self.keys.len());
        for (i, key) in self.keys.iter().enumerate() {
            if key.is_empty() || key.len() > MAX_KEY_LEN || key.bytes().any(|b| !b.is_ascii_graphic()) {
                return fail(format!(
                    "keys: entry {} is not 1-{MAX_KEY_LEN} printable ASCII characters without spaces",
                    i + 1
                ));
            }
            // Named by place, never by text: a key is a secret.
            if let Some(first) = keys.insert(key.as_str(), i) {
                return fail(format!("keys: entry {} repeats entry {} (each key once)", i + 1, first + 1));
            }
        }
        let mut digests = std::collections::HashMap::with_capacity(self.key_sha256.len());
        for (i, digest) in self.key_sha256.iter().enumerate() {
            let Some(digest) = parse_sha256_hex(digest) else {
                return fail(format!("keySha256: entry {} is not 64 hex digits (the SHA-256 of a key)", i + 1));
            };
            if let Some(first) = digests.insert(digest, i) {
                return fail(format!("keySha256: entry {} repeats entry {} (each digest once)", i + 1, first + 1));
            }
            // What `sha256sum` prints for an unset `$KEY`: it would let an
            // empty `X-Nthpool-Key` in, where `keys` takes no empty key.
            if digest == EMPTY_KEY_SHA256 {
                return fail(format!("keySha256: entry {} is the SHA-256 of an empty key", i + 1));
            }
        }
        if self.concurrency == 0 || self.concurrency > MAX_CONCURRENCY {
            return fail(format!("concurrency must be between 1 and {MAX_CONCURRENCY}"));
        }
        if self.queue.size > MAX_QUEUE_SIZE {
            return fail(format!("queue.size must be at most {MAX_QUEUE_SIZE}"));
        }
        if self.queue.timeout_ms > MAX_DURATION_MS {
            return fail(format!("queue.timeoutMs must be at most {MAX_DURATION_MS}"));
        }
        match (self.rpm, self.rpm_burst) {
            (Some(0), _) => return fail("rpm must be at least 1 (or null for no gate)"),
            (Some(rpm), _) if rpm > MAX_RPM => return fail(format!("rpm must be at most {MAX_RPM}")),
            (None, Some(_)) => return fail("rpmBurst needs rpm to be set"),
            (Some(_), Some(0)) => return fail("rpmBurst must be at least 1"),
            (Some(_), Some(burst)) if burst > MAX_HELD_COUNT => {
                return fail(format!("rpmBurst must be at most {MAX_HELD_COUNT}"))
            }
            _ => {}
        }
        if self.idempotency_keys == 0 || self.idempotency_keys > MAX_HELD_COUNT {
            return fail(format!("idempotencyKeys must be between 1 and {MAX_HELD_COUNT}"));
        }
        if self.term_ms < MIN_TERM_MS || self.term_ms > MAX_DURATION_MS {
            return fail(format!("termMs must be between {MIN_TERM_MS} and {MAX_DURATION_MS}"));
        }
        if self.renew_interval_ms == 0 || self.renew_interval_ms >= self.term_ms {
            return fail(format!(
                "renewIntervalMs must be at least 1 and below termMs ({}); it is {}",
                self.term_ms, self.renew_interval_ms
            ));
        }
        if self.request_timeout_ms < self.term_ms || self.request_timeout_ms > MAX_DURATION_MS {
            return fail(format!(
                "requestTimeoutMs must be at least termMs ({}) and at most {MAX_DURATION_MS}",
                self.term_ms
            ));
        }
        // `ipAllow` and `trustedProxies` are parsed where the policies are
        // built (`access::PoolAccess::build`), the step `--check-config`,
        // start-up and reload share.
        if let Some(hmac) = &self.access.hmac {
            if hmac.secret.is_empty() {
                return fail("access.hmac.secret must not be empty");
            }
            if hmac.tolerance_ms == 0 || hmac.tolerance_ms > MAX_TIMEOUT_MS {
                return fail(format!("access.hmac.toleranceMs must be between 1 and {MAX_TIMEOUT_MS}"));
            }
            if hmac.nonce_capacity == 0 || hmac.nonce_capacity > MAX_HELD_COUNT as usize {
                return fail(format!("access.hmac.nonceCapacity must be between 1 and {MAX_HELD_COUNT}"));
            }
        }
        if let Some(cf) = &self.access.cloudflare_access {
            for (name, value) in [("jwksFile", &cf.jwks_file), ("audience", &cf.audience), ("issuer", &cf.issuer)] {
                if value.is_empty() {
                    return fail(format!("access.cloudflareAccess.{name} must not be empty"));
                }
            }
        }
        if let Some(upstream) = &self.upstream {
            upstream.validate()?;
            if self.access.hmac.is_some() {
                // The signature covers the whole body, which a streaming proxy
                // forwards before it has all of it.
                return fail("upstream: proxy mode cannot be combined with access.hmac (use keys, ipAllow, jwt or cloudflareAccess)");
            }
        }
        if let Some(jwt) = &self.access.jwt {
            if jwt.hs256_secret.len() < 16 {
                return fail("access.jwt.hs256Secret must be at least 16 bytes");
            }
            // An empty one would demand tokens that carry an empty claim.
            for (name, value) in [("issuer", &jwt.issuer), ("audience", &jwt.audience)] {
                if value.as_ref().is_some_and(|v| v.is_empty()) {
                    return fail(format!("access.jwt.{name} must not be empty (null: not checked)"));
                }
            }
            if jwt.leeway_ms > MAX_TIMEOUT_MS {
                return fail(format!("access.jwt.leewayMs must be at most {MAX_TIMEOUT_MS}"));
            }
        }
        Ok(())
    }

    /// The token-bucket size of the RPM gate: `rpmBurst`, else one second's worth.
    pub fn rpm_burst_or_default(&self) -> Option<u32> {
        self.rpm.map(|rpm| self.rpm_burst.unwrap_or(rpm.div_ceil(60).max(1)))
    }
}

/// How `clash` is worded: the second listener could not be bound.
const OVERLAP: &str = "cannot both be bound (the same port, on the same address or on every address)";

/// Whether listeners at `a` and `b` cannot both be bound: the same port
/// (port 0 is a fresh one each time) on the same address, or on every
/// address of a family (`0.0.0.0`), or on every address at all (`[::]`,
/// which also takes IPv4 where IPv6 sockets are dual-stack, the default).
fn clash(a: SocketAddr, b: SocketAddr) -> bool {
    let (x, y) = (a.ip().to_canonical(), b.ip().to_canonical());
    let covers = |wild: std::net::IpAddr, other: std::net::IpAddr| {
        wild.is_unspecified() && (wild.is_ipv6() || wild.is_ipv4() == other.is_ipv4())
    };
    a.port() != 0 && a.port() == b.port() && (x == y || covers(x, y) || covers(y, x))
}

/// Pool names are DNS labels, so they fit in a host name and need no escaping.
/// A pool name that is none, as its error quotes it: whole when short (a
/// typo is found by it), else its first characters and its length. A long
/// string in a name's place may be a key pasted there, and the error goes
/// to the log.
fn quoted_pool_name(name: &str) -> String {
    const WHOLE: usize = 24;
    let chars = name.chars().count();
    if chars <= WHOLE {
        return format!("{name:?}");
    }
    let start: String = name.chars().take(6).collect();
    format!("{:?} ({chars} characters)", format!("{start}…"))
}

pub fn is_dns_label(name: &str) -> bool {
    let b = name.as_bytes();
    (1..=63).contains(&b.len())
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// A host name as a `Host` header names it, without port: dot-separated
/// labels of letters, digits, `-` and `_` (an IPv4 address is one), at most
/// 253 characters and an optional trailing dot, or an IPv6 address in
/// brackets.
pub(crate) fn is_host_name(host: &str) -> bool {
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return inner.parse::<std::net::Ipv6Addr>().is_ok();
    }
    let name = host.strip_suffix('.').unwrap_or(host);
    let label = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    (1..=253).contains(&name.len()) && name.split('.').all(label)
}

/// A host name as requests are routed by it: without case, a final dot or an
/// IPv6 address's brackets (as `api::host_name` takes it from a `Host`).
pub(crate) fn host_key(host: &str) -> String {
    let name = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(inner) => inner,
        None => host.strip_suffix('.').unwrap_or(host),
    };
    name.to_ascii_lowercase()
}

/// SHA-256 of no bytes at all.
const EMPTY_KEY_SHA256: [u8; 32] = [
    0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14, 0x9a, 0xfb, 0xf4, 0xc8, 0x99, 0x6f, 0xb9, 0x24, 0x27, 0xae, 0x41,
    0xe4, 0x64, 0x9b, 0x93, 0x4c, 0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55,
];

pub fn parse_sha256_hex(s: &str) -> Option<[u8; 32]> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in b.chunks(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        out[i] = (hi * 16 + lo) as u8;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool_json(extra: &str) -> String {
        format!(r#"{{"pools":{{"p1":{{"keys":["k"]{extra}}}}}}}"#)
    }

    fn err(json: &str) -> String {
        Config::parse(json.as_bytes()).unwrap_err().0
    }

    #[test]
    fn an_invalid_pool_name_is_quoted_whole_only_when_short() {
        let e = err(r#"{"pools":{"Prod_Acme":{"keys":["k1"]}}}"#);
        assert!(e.contains(r#"pools: "Prod_Acme" is not a valid pool name"#), "{e}");
        let key = "nb_live_Secr3tKeyValue0123456789";
        let e = err(&format!(r#"{{"pools":{{"{key}":{{"keys":["k1"]}}}}}}"#));
        assert!(e.contains(r#"pools: "nb_liv…" (32 characters) is not a valid pool name"#), "{e}");
        assert!(!e.contains("Secr3t"), "{e}");
    }

    #[test]
    fn a_pool_named_twice_is_refused() {
        let e = err(r#"{"pools":{"p":{"keys":["k1"]},"p":{"keys":["k2"]}}}"#);
        assert!(e.contains("duplicate pool `p`"), "{e}");
    }

    #[test]
    fn type_errors_say_the_expected_number_in_words() {
        let e = err(&pool_json(r#","concurrency":4294967296"#));
        assert!(e.ends_with("pools.p1.concurrency: invalid value: integer `4294967296`, expected a whole number from 0 to 4294967295 at line 1 column 53"), "{e}");
        let e = err(&pool_json(r#","termMs":"soon""#));
        assert!(e.contains(r#"pools.p1.termMs: invalid type: string "soon", expected a whole number from 0 to 18446744073709551615"#), "{e}");
        assert!(!err(&pool_json(r#","concurrency":-1"#)).contains("u32"));
        for (field, value) in [("queue", "null"), ("access", "null"), ("upstream", "5")] {
            let e = err(&pool_json(&format!(r#","{field}":{value}"#)));
            assert!(e.contains(&format!("pools.p1.{field}: invalid type: ")), "{e}");
            assert!(e.contains(", expected an object at line 1"), "{e}");
        }
    }

    #[test]
    fn a_string_where_a_list_or_an_object_goes_is_not_quoted() {
        let hidden = "invalid type: a string (not shown: it may be a secret), expected";
        for (json, expected) in [
            (
                r#"{"pools":{"p1":{"keys":"nb_live_SECRET"}}}"#.to_owned(),
                "pools.p1.keys: {hidden} a sequence at line 1",
            ),
            (pool_json(r#","access":{"hmac":"SECRET"}"#), "pools.p1.access.hmac: {hidden} an object at line 1"),
            (
                pool_json(r#","upstream":{"url":"http://u","setHeaders":"Bearer SECRET"}"#),
                "pools.p1.upstream.setHeaders: {hidden} an object of headers by name at line 1",
            ),
        ] {
            let e = err(&json);
            assert!(e.contains(&expected.replace("{hidden}", hidden)), "{e}");
            assert!(!e.contains("SECRET"), "{e}");
        }
        let e = err(&pool_json(r#","termMs":"soon""#));
        assert!(e.contains(r#"invalid type: string "soon", expected"#), "a word where a number goes is quoted: {e}");
    }

    #[test]
    fn a_number_where_a_string_goes_is_not_shown() {
        let hidden = "invalid type: a number (not shown: it may be a secret), expected a string at line 1";
        for (json, field) in [
            (r#"{"pools":{"p1":{"keys":[98765432109876543]}}}"#.to_owned(), "pools.p1.keys[0]"),
            (r#"{"adminToken":98765432109876543,"pools":{"p1":{"keys":["k"]}}}"#.to_owned(), "adminToken"),
            (pool_json(r#","access":{"hmac":{"secret":-98765432109876543}}"#), "pools.p1.access.hmac.secret"),
            (pool_json(r#","access":{"jwt":{"hs256Secret":98765432109.876543}}"#), "pools.p1.access.jwt.hs256Secret"),
            (
                pool_json(r#","upstream":{"url":"http://u","setHeaders":{"Authorization":98765432109876543}}"#),
                "pools.p1.upstream.setHeaders.Authorization",
            ),
        ] {
            let e = err(&json);
            assert!(e.contains(&format!("{field}: {hidden}")), "{e}");
            assert!(!e.contains("98765"), "{e}");
        }
        let e = err(&pool_json(r#","termMs":1.5"#));
        assert!(e.contains("(read as 1.5)"), "a number where a number goes is still shown: {e}");
    }

    /// A `setHeaders` name that is no header name is most often a
    /// credential written where the name goes: an error about it, or about
    /// its value, names the field and is silent on the name.
    #[test]
    fn a_set_headers_name_that_is_no_header_name_is_not_quoted() {
        let headers =
            |members: &str| pool_json(&format!(r#","upstream":{{"url":"http://u","setHeaders":{{{members}}}}}"#));
        for (members, expected) in [
            (r#""Bearer sk-SECRET":"x""#, "pools.p1.upstream.setHeaders: a name is not a header name"),
            (r#""Bearer sk-SECRET":"x","Bearer sk-SECRET":"y""#, "pools.p1.upstream.setHeaders: duplicate header name"),
            (r#""Bearer sk-SECRET":5"#, "pools.p1.upstream.setHeaders.(a name that is no header name, not shown"),
            (r#""Bearer sk-SECRET":["x"]"#, "pools.p1.upstream.setHeaders.(a name that is no header name, not shown"),
        ] {
            let e = err(&headers(members));
            assert!(e.contains(expected), "{members}: {e}");
            assert!(!e.contains("SECRET"), "{members}: {e}");
        }
        // A header's name is still quoted: it is what the operator looks for.
        let e = err(&headers(r#""X-Team":"x","X-Team":"y""#));
        assert!(e.contains("pools.p1.upstream.setHeaders: duplicate header `X-Team`"), "{e}");
        let e = err(&headers(r#""X-Team":5"#));
        assert!(e.contains("pools.p1.upstream.setHeaders.X-Team: invalid type: a number (not shown"), "{e}");
    }

    #[test]
    fn objects_given_as_arrays_of_their_fields_are_refused() {
        let e = err(&pool_json(r#","queue":[5,1000]"#));
        assert!(e.contains("pools.p1.queue: an array where named fields"), "{e}");
        let e = err(&pool_json(r#","access":{"hmac":["sekrit",1000,10]}"#));
        assert!(e.contains("pools.p1.access.hmac: an array"), "{e}");
        assert!(err(r#"{"pools":{"p":["k"]}}"#).contains("pools.p: an array"));
        for root in ["[]", r#"["127.0.0.1:7070"]"#] {
            assert!(err(root).contains("must be a JSON object of named fields"), "{root}: {}", err(root));
        }
        // In a file that is no JSON too: serde would read the array as the
        // fields in order and name a place that is no field (`[0]: …`).
        for root in ["[[{}", r#"["127.0.0.1:7070",[1]"#, "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[{}"] {
            let e = err(root);
            assert!(e.ends_with("invalid configuration: it must be a JSON object of named fields"), "{root}: {e}");
        }
        let e = err(&pool_json(r#","queue":[5,"soon""#).replace("}}}", ""));
        assert!(e.contains("pools.p1.queue: an array where named fields"), "{e}");
        // The lists stay lists, also in a pool named like one of them.
        let lists = r#"{"pools":{"keys":{"keys":["k"],"keySha256":[],"access":{"ipAllow":["10.0.0.0/8"],
            "trustedProxies":[]},"upstream":{"url":"http://127.0.0.1:9","hosts":["a.test"]}}}}"#;
        assert!(Config::parse(lists.as_bytes()).is_ok(), "{:?}", Config::parse(lists.as_bytes()).err());
        // A misspelled or misplaced field is named as unknown, whatever it holds.
        for (json, named) in [
            (r#"{"pools":{"p":{"keys":["k"],"access":{"keys":["x"]}}}}"#, "pools.p.access.keys: unknown field `keys`"),
            (r#"{"pools":{"p":{"keys":["k"],"key":["k2"]}}}"#, "pools.p.key: unknown field `key`"),
            (r#"{"pools":{"p":{"keys":["k"],"access":{"ipallow":["10.0.0.0/8"]}}}}"#, "unknown field `ipallow`"),
        ] {
            let e = err(json);
            assert!(e.contains(named) && e.contains("expected one of"), "{json}: {e}");
        }
    }

    #[test]
    fn public_host_is_a_host_name_without_port() {
        let with = |host: &str| {
            format!(r#"{{"publicHost":{},"pools":{{"p":{{"keys":["k"]}}}}}}"#, serde_json::Value::from(host))
        };
        let good =
            ["api.example.com", "API.Example.com", "api.example.com.", "my_service", "127.0.0.1", "[::1]", "a-b.c0"];
        for good in good {
            assert!(
                Config::parse(with(good).as_bytes()).is_ok(),
                "{good}: {:?}",
                Config::parse(with(good).as_bytes()).err()
            );
        }
        for bad in
            ["", "api.example.com/v1", "host:443", "<script>", "a\"b", "a..b", ".a", "-a.com", "a b", "[::1", "[zz]"]
        {
            let e = err(&with(bad));
            assert!(e.contains("publicHost") && e.contains("not a host name without port"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn a_listen_override_is_checked_as_the_file_listen_would_be() {
        let c = Config::parse(
            br#"{"listen":"127.0.0.1:7070","adminListen":"127.0.0.1:7071","pools":{"p":{"keys":["k"]}}}"#,
        )
        .unwrap();
        assert!(c.check_listen_override("127.0.0.1:7072".parse().unwrap()).is_ok());
        let e = c.check_listen_override("127.0.0.1:7071".parse().unwrap()).unwrap_err().0;
        assert_eq!(e, "--listen 127.0.0.1:7071: adminListen: 127.0.0.1:7071 is the lock API's `listen` address too");
    }

    #[test]
    fn text_after_the_configuration_object_is_refused() {
        let e = err(r#"{"pools":{"p":{"keys":["k"]}}}{"pools":{}}"#);
        assert!(e.contains("text after the configuration object"), "{e}");
        assert!(err(r#"{"pools":{"p":{"keys":["k"]}}} x"#).contains("text after"));
        assert!(Config::parse(b"{\"pools\":{\"p\":{\"keys\":[\"k\"]}}}\n \t").is_ok(), "whitespace is fine");
    }

    #[test]
    fn the_admin_listener_cannot_share_the_lock_apis_address() {
        let e = err(r#"{"listen":"127.0.0.1:7070","adminListen":"127.0.0.1:7070","pools":{"p":{"keys":["k"]}}}"#);
        assert!(e.contains("adminListen: 127.0.0.1:7070 is the lock API's `listen` address too"), "{e}");
        // Port 0 is a fresh port each time.
        let ok = r#"{"listen":"127.0.0.1:0","adminListen":"127.0.0.1:0","pools":{"p":{"keys":["k"]}}}"#;
        assert!(Config::parse(ok.as_bytes()).is_ok());
    }

    #[test]
    fn listeners_that_cannot_all_be_bound_are_refused() {
        let up = |listen: &str| format!(r#""upstream":{{"url":"http://127.0.0.1:9","listen":"{listen}"}}"#);
        let with = |top: &str, pools: &str| err(&format!(r#"{{{top}"pools":{{{pools}}}}}"#));
        let overlap = "cannot both be bound";
        // `listen` on every address of the admin listener's port, and the other way round.
        let e = with(r#""listen":"0.0.0.0:7070","adminListen":"127.0.0.1:7070","#, r#""p":{"keys":["k"]}"#);
        assert!(e.starts_with("adminListen: 127.0.0.1:7070 and `listen` 0.0.0.0:7070 ") && e.contains(overlap), "{e}");
        let token = r#""adminToken":"0123456789abcdefgh","#;
        let e =
            with(&format!(r#""listen":"127.0.0.1:7070","adminListen":"[::]:7070",{token}"#), r#""p":{"keys":["k"]}"#);
        assert!(e.starts_with("adminListen: ") && e.contains(overlap), "[::] takes IPv4 too: {e}");
        // A pool's listener against the server's and another pool's.
        let e = with(r#""listen":"0.0.0.0:7070","#, &format!(r#""p":{{"keys":["k"],{}}}"#, up("127.0.0.2:7070")));
        assert!(e.starts_with("pools.p.upstream.listen: 127.0.0.2:7070 and `listen` 0.0.0.0:7070 "), "{e}");
        let e = with("", &format!(r#""p":{{"keys":["k"],{}}}"#, up("127.0.0.1:7071")));
        assert!(e.starts_with("pools.p.upstream.listen: 127.0.0.1:7071 and `adminListen` 127.0.0.1:7071 "), "{e}");
        let two = format!(r#""p":{{"keys":["k"],{}}},"q":{{"keys":["k"],{}}}"#, up("[::]:7080"), up("127.0.0.1:7080"));
        let e = with("", &two);
        assert!(e.starts_with("pools.q.upstream.listen: 127.0.0.1:7080 and pool p's [::]:7080 "), "{e}");
        let same =
            format!(r#""p":{{"keys":["k"],{}}},"q":{{"keys":["k"],{}}}"#, up("127.0.0.1:7080"), up("127.0.0.1:7080"));
        assert!(with("", &same).starts_with("pools.q.upstream.listen: 127.0.0.1:7080 is already pool p's listener"));
        // Other addresses of one port, other families, and fresh ports are fine.
        let fine = [
            r#"{"listen":"127.0.0.1:7070","adminListen":"127.0.0.2:7070","pools":{"p":{"keys":["k"]}}}"#,
            r#"{"listen":"0.0.0.0:7070","adminListen":"[::1]:7070","pools":{"p":{"keys":["k"]}}}"#,
            r#"{"listen":"0.0.0.0:0","adminListen":"127.0.0.1:0","pools":{"p":{"keys":["k"]}}}"#,
        ];
        for ok in fine {
            assert!(Config::parse(ok.as_bytes()).is_ok(), "{ok}");
        }
        let hosts = r#""upstream":{"url":"http://127.0.0.1:9","hosts":["a.example"]}"#;
        // A proxy host would take the lock API's own host.
        let e = with(
            r#""publicHost":"api.example","#,
            &format!(r#""p":{{"keys":["k"],{}}}"#, hosts.replace("a.example", "API.example")),
        );
        assert_eq!(e, "pools.p.upstream.hosts: API.example is publicHost, where the lock API is served");
        // One proxy host, two pools.
        let e = with(
            "",
            &format!(r#""p":{{"keys":["k"],{hosts}}},"q":{{"keys":["k"],{}}}"#, hosts.replace("a.ex", "A.Ex")),
        );
        assert!(e.starts_with("pools.q.upstream.hosts: A.Example is already routed to pool p"), "{e}");
        // One proxy host, twice in one pool.
        let e = with(
            "",
            &format!(r#""p":{{"keys":["k"],{}}}"#, hosts.replace(r#""a.example""#, r#""a.example","A.example.""#)),
        );
        assert_eq!(e, "pools.p.upstream.hosts: A.example. is listed twice");
        // Requests are routed without a host's final dot, so the checks are too.
        let e = with(
            "",
            &format!(r#""p":{{"keys":["k"],{hosts}}},"q":{{"keys":["k"],{}}}"#, hosts.replace("e\"]", "e.\"]")),
        );
        assert!(e.starts_with("pools.q.upstream.hosts: a.example. is already routed to pool p"), "{e}");
        for (public, host) in [("api.example", "api.example."), ("API.EXAMPLE.", "api.example")] {
            let e = with(
                &format!(r#""publicHost":"{public}","#),
                &format!(r#""p":{{"keys":["k"],{}}}"#, hosts.replace("a.example", host)),
            );
            assert_eq!(e, format!("pools.p.upstream.hosts: {host} is publicHost, where the lock API is served"));
        }
    }

    #[test]
    fn proxy_hosts_are_kept_as_requests_are_routed_by_them() {
        let json =
            r#"{"pools":{"p":{"keys":["k"],"upstream":{"url":"http://127.0.0.1:9","hosts":["A.Example.","b"]}}}}"#;
        let config = Config::parse(json.as_bytes()).unwrap();
        let upstream = upstream::Upstream::build(config.pools["p"].upstream.as_ref().unwrap()).unwrap();
        assert_eq!(upstream.hosts, [b"a.example".to_vec().into(), b"b".to_vec().into()]);
        assert!(err(&json.replace("\"b\"", "\".\"")).contains("upstream.hosts"), "a lone dot names no host");
    }

    #[test]
    fn a_pool_takes_at_most_max_keys_of_each_kind() {
        let keys: Vec<String> = (0..=MAX_KEYS).map(|i| format!("key-{i}")).collect();
        let list = |n: usize| serde_json::to_string(&keys[..n]).unwrap();
        assert!(Config::parse(format!(r#"{{"pools":{{"p":{{"keys":{}}}}}}}"#, list(MAX_KEYS)).as_bytes()).is_ok());
        let e = err(&format!(r#"{{"pools":{{"p":{{"keys":{}}}}}}}"#, list(MAX_KEYS + 1)));
        assert_eq!(e, format!("pools.p.keys: at most {MAX_KEYS} entries (this pool has {})", MAX_KEYS + 1));
        let digests: Vec<String> = (0..=MAX_KEYS).map(|i| format!("{:064x}", i + 1)).collect();
        let e = err(&format!(r#"{{"pools":{{"p":{{"keySha256":{}}}}}}}"#, serde_json::to_string(&digests).unwrap()));
        assert!(e.starts_with("pools.p.keySha256: at most"), "{e}");
    }

    #[test]
    fn a_configuration_file_past_the_size_limit_is_refused_unread() {
        let path = std::env::temp_dir().join(format!("nthpool-config-size-{}.json", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        // Sparse: no 64 MiB are written, but that many are there to read.
        file.set_len(MAX_CONFIG_BYTES + 1).unwrap();
        let e = Config::load(&path).unwrap_err().0;
        std::fs::remove_file(&path).unwrap();
        assert!(e.ends_with("larger than 64 MiB"), "{e}");
    }

    #[test]
    fn a_key_or_a_header_given_twice_is_refused() {
        // Keys are named by place: the text of a key is never printed.
        let e = err(&pool_json(r#","keys":["k","secret-one","secret-one"]"#).replace(r#""keys":["k"],"#, ""));
        assert_eq!(e, "pools.p1.keys: entry 3 repeats entry 2 (each key once)");
        // A bad entry is named by its place too (the list may be long).
        let e = err(r#"{"pools":{"p1":{"keys":["k1","k 2"]}}}"#);
        assert_eq!(e, "pools.p1.keys: entry 2 is not 1-512 printable ASCII characters without spaces");
        let e = err(&pool_json(r#","keySha256":["nothex"]"#));
        assert_eq!(e, "pools.p1.keySha256: entry 1 is not 64 hex digits (the SHA-256 of a key)");
        let digest = "3b6c7f0e1c4e0b8f7f1e4b1b7e2a3e8f0d5c6b7a8f9e0d1c2b3a4f5e6d7c8b9a";
        let twice = format!(r#","keySha256":["{digest}","{}"]"#, digest.to_uppercase());
        assert_eq!(err(&pool_json(&twice)), "pools.p1.keySha256: entry 2 repeats entry 1 (each digest once)");
        let e = err(&pool_json(r#","upstream":{"url":"http://127.0.0.1:9","setHeaders":{"X-A":"1","X-A":"2"}}"#));
        assert!(e.starts_with("invalid configuration: pools.p1.upstream.setHeaders: duplicate header `X-A`"), "{e}");
        // The same key in two pools is allowed: the route names the pool.
        assert!(Config::parse(br#"{"pools":{"a":{"keys":["k"]},"b":{"keys":["k"]}}}"#).is_ok());
    }

    #[test]
    fn the_digest_of_an_empty_key_is_refused() {
        use sha2::Digest;
        assert_eq!(EMPTY_KEY_SHA256, <[u8; 32]>::from(sha2::Sha256::digest(b"")));
        let empty = r#","keySha256":["3b6c7f0e1c4e0b8f7f1e4b1b7e2a3e8f0d5c6b7a8f9e0d1c2b3a4f5e6d7c8b9a","e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"]"#;
        assert_eq!(err(&pool_json(empty)), "pools.p1.keySha256: entry 2 is the SHA-256 of an empty key");
    }

    #[test]
    fn a_byte_order_mark_before_the_configuration_is_ignored() {
        let text = pool_json("");
        let marked = [&b"\xEF\xBB\xBF"[..], text.as_bytes()].concat();
        assert_eq!(Config::parse(&marked).map(|c| c.pools.len()).map_err(|e| e.0), Ok(1));
        // Only at the start.
        let inside = text.replacen("{", "{\u{feff}", 1);
        assert!(Config::parse(inside.as_bytes()).is_err());
    }

    /// A proxied request is not signed by its caller for this server (SDKs
    /// do not know the scheme): HMAC and an upstream are refused together,
    /// naming every policy proxy mode takes.
    #[test]
    fn hmac_with_an_upstream_is_refused_naming_what_proxy_mode_takes() {
        let e = err(&pool_json(r#","access":{"hmac":{"secret":"s"}},"upstream":{"url":"http://127.0.0.1:9"}"#));
        assert!(e.contains("proxy mode cannot be combined with access.hmac"), "{e}");
        assert!(e.contains("keys, ipAllow, jwt or cloudflareAccess"), "{e}");
    }

    #[test]
    fn empty_names_in_access_policies_are_refused() {
        let jwt =
            |extra: &str| pool_json(&format!(r#","access":{{"jwt":{{"hs256Secret":"0123456789abcdef"{extra}}}}}"#));
        assert_eq!(err(&jwt(r#","issuer":"""#)), "pools.p1.access.jwt.issuer must not be empty (null: not checked)");
        assert_eq!(
            err(&jwt(r#","audience":"""#)),
            "pools.p1.access.jwt.audience must not be empty (null: not checked)"
        );
        assert!(Config::parse(jwt(r#","issuer":null,"audience":"a""#).as_bytes()).is_ok());
        let cf = |jwks: &str, aud: &str, iss: &str| {
            pool_json(&format!(
                r#","access":{{"cloudflareAccess":{{"jwksFile":"{jwks}","audience":"{aud}","issuer":"{iss}"}}}}"#
            ))
        };
        assert_eq!(err(&cf("", "a", "i")), "pools.p1.access.cloudflareAccess.jwksFile must not be empty");
        assert_eq!(err(&cf("c.json", "", "i")), "pools.p1.access.cloudflareAccess.audience must not be empty");
        assert_eq!(err(&cf("c.json", "a", "")), "pools.p1.access.cloudflareAccess.issuer must not be empty");
        assert!(Config::parse(cf("c.json", "a", "i").as_bytes()).is_ok(), "the file is read later, by the build step");
    }

    #[test]
    fn embedded_default_is_valid() {
        let c = Config::embedded();
        assert_eq!(c.listen_addr().to_string(), "127.0.0.1:7070");
        assert!(c.pools.contains_key("demo"));
    }

    #[test]
    fn defaults_match_the_spec() {
        let c = Config::parse(pool_json("").as_bytes()).unwrap();
        let p = &c.pools["p1"];
        assert_eq!(c.max_body_bytes, 65_536);
        assert_eq!(c.access_log.as_deref(), Some("access.log"));
        assert_eq!(c.admin_listen.as_deref(), Some("127.0.0.1:7071"));
        assert_eq!(p.concurrency, 16);
        assert_eq!(p.queue, QueueConfig { size: 1000, timeout_ms: 30_000 });
        assert_eq!((p.term_ms, p.renew_interval_ms, p.request_timeout_ms), (30_000, 10_000, 60_000));
        assert!(p.adaptive);
        assert!(!p.allow_authorization_header);
        assert_eq!(p.rpm, None);
        assert_eq!(p.idempotency_keys, 1024);
        assert_eq!(c.idle_spin_us, 50);
    }

    #[test]
    fn idle_spin_is_bounded_and_may_be_off() {
        let at =
            |us: &str| Config::parse(format!(r#"{{"idleSpinUs":{us},"pools":{{"p":{{"keys":["k"]}}}}}}"#).as_bytes());
        assert_eq!(at("0").unwrap().idle_spin_us, 0);
        assert_eq!(at("1000").unwrap().idle_spin_us, 1000);
        for bad in ["1001", "-1", "\"50\""] {
            assert!(at(bad).unwrap_err().0.contains("idleSpinUs"), "{bad}");
        }
    }

    #[test]
    fn broken_json_reads_as_a_syntax_error_with_its_place() {
        for (text, place) in
            [("{bad", "line 1 column 2"), ("{\n\"pools\": {", "line 2 column 10"), ("[", "line 1 column 1")]
        {
            let e = err(text);
            assert!(e.starts_with("invalid configuration: JSON syntax error: "), "{e}");
            assert!(e.ends_with(place) && !e.contains('?'), "{e}");
        }
    }

    #[test]
    fn a_broken_value_names_its_field() {
        for (value, what) in
            [("1e400", "number out of range"), ("-1e400", "number out of range"), ("01", "invalid number")]
        {
            let e = err(&pool_json(&format!(r#","queue":{{"timeoutMs":{value}}}"#)));
            assert!(e.starts_with("invalid configuration: pools.p1.queue.timeoutMs: JSON syntax error: "), "{e}");
            assert!(e.contains(what) && e.contains("line 1"), "{e}");
        }
        let e = err(r#"{"maxBodyBytes":1e999,"pools":{"p":{"keys":["k"]}}}"#);
        assert!(e.starts_with("invalid configuration: maxBodyBytes: JSON syntax error: number out of range"), "{e}");
        let e = err(&pool_json(r#","access":{"ipAllow":[1e400]}"#));
        assert!(e.contains("pools.p1.access.ipAllow[0]: "), "{e}");
        let e = err(&pool_json(r#","concurrency":}"#));
        assert!(e.starts_with("invalid configuration: pools.p1.concurrency: JSON syntax error: expected value"), "{e}");
        // A number past 64 bits but within a float's range, or with a fraction, is named as such.
        let e = err(&pool_json(r#","termMs":18446744073709551616"#));
        assert!(e.starts_with("invalid configuration: pools.p1.termMs: invalid value: a number with a fraction, an exponent or out of range (read as 1.8446744073709552e+19), expected a whole number from 0 to 18446744073709551615"), "{e}");
        let e = err(&pool_json(r#","termMs":3e4"#));
        assert!(e.contains("pools.p1.termMs: invalid value: a number with a fraction, an exponent or out of range (read as 30000.0)"), "{e}");
        let e = err(&pool_json(r#","concurrency":2.5"#));
        assert!(e.contains("pools.p1.concurrency: invalid value: a number with a fraction, an exponent or out of range (read as 2.5), expected a whole number from 0 to 4294967295"), "{e}");
        assert!(!e.contains("floating point"), "{e}");
    }

    /// Every numeric field at both ends of its documented range (the README's
    /// limits table): the ends are accepted, one past either end is refused
    /// with the field named.
    #[test]
    fn every_number_is_bounded_as_documented() {
        let top = |m: &str| format!(r#"{{{m},"pools":{{"p1":{{"keys":["k"]}}}}}}"#);
        let pool = |m: &str| pool_json(&format!(",{m}"));
        let hmac = |m: &str| pool_json(&format!(r#","access":{{"hmac":{{"secret":"s",{m}}}}}"#));
        let jwt = |m: &str| pool_json(&format!(r#","access":{{"jwt":{{"hs256Secret":"0123456789abcdef",{m}}}}}"#));
        let up = |m: &str| pool_json(&format!(r#","upstream":{{"url":"http://127.0.0.1:9",{m}}}"#));
        let week = MAX_DURATION_MS;
        #[allow(clippy::type_complexity)]
        let cases: [(&dyn Fn(&str) -> String, &str, &str, u64, u64); 25] = [
            (&top, "maxBodyBytes", "maxBodyBytes", 1, 16 << 20),
            (&top, "maxConnections", "maxConnections", 1, 1_000_000),
            (&top, "headTimeoutMs", "headTimeoutMs", 10, 3_600_000),
            (&top, "idleTimeoutMs", "idleTimeoutMs", 10, 3_600_000),
            (&top, "writeTimeoutMs", "writeTimeoutMs", 10, 3_600_000),
            (&top, "idleSpinUs", "idleSpinUs", 0, 1_000),
            (&top, "snapshotIntervalMs", "snapshotIntervalMs", 1_000, week),
            (&pool, "concurrency", "pools.p1.concurrency", 1, 10_000_000),
            (&|m: &str| pool(&format!(r#""queue":{{{m}}}"#)), "size", "pools.p1.queue.size", 0, 10_000_000),
            (&|m: &str| pool(&format!(r#""queue":{{{m}}}"#)), "timeoutMs", "pools.p1.queue.timeoutMs", 0, week),
            (&pool, "rpm", "pools.p1.rpm", 1, 60_000_000),
            (&|m: &str| pool(&format!(r#""rpm":60,{m}"#)), "rpmBurst", "pools.p1.rpmBurst", 1, 10_000_000),
            (
                &|m: &str| pool(&format!(r#""renewIntervalMs":1,"requestTimeoutMs":{week},{m}"#)),
                "termMs",
                "pools.p1.termMs",
                10,
                week,
            ),
            (&|m: &str| pool(&format!(r#""termMs":1000,{m}"#)), "renewIntervalMs", "pools.p1.renewIntervalMs", 1, 999),
            (
                &|m: &str| pool(&format!(r#""termMs":1000,"renewIntervalMs":1,{m}"#)),
                "requestTimeoutMs",
                "pools.p1.requestTimeoutMs",
                1000,
                week,
            ),
            (&pool, "idempotencyKeys", "pools.p1.idempotencyKeys", 1, 10_000_000),
            (&hmac, "toleranceMs", "pools.p1.access.hmac.toleranceMs", 1, 3_600_000),
            (&hmac, "nonceCapacity", "pools.p1.access.hmac.nonceCapacity", 1, 10_000_000),
            (&jwt, "leewayMs", "pools.p1.access.jwt.leewayMs", 0, 3_600_000),
            (&up, "waitMs", "pools.p1.upstream.waitMs", 0, week),
            (&up, "timeoutMs", "pools.p1.upstream.timeoutMs", 1, week),
            (&up, "maxRequestBytes", "pools.p1.upstream.maxRequestBytes", 0, 1 << 40),
            (&up, "idleConnections", "pools.p1.upstream.idleConnections", 0, 10_000),
            (&up, "idleTimeoutMs", "pools.p1.upstream.idleTimeoutMs", 1, 3_600_000),
            (&up, "tlsHandshakeTimeoutMs", "pools.p1.upstream.tlsHandshakeTimeoutMs", 1, 600_000),
        ];
        for (json, field, path, low, high) in cases {
            for ok in [low, high] {
                let text = json(&format!(r#""{field}":{ok}"#));
                assert!(Config::parse(text.as_bytes()).is_ok(), "{path} = {ok}: {:?}", Config::parse(text.as_bytes()));
            }
            let below = (low > 0).then(|| low - 1).map(|n| n.to_string()).unwrap_or_else(|| "-1".into());
            for bad in [below, (high + 1).to_string()] {
                let e = err(&json(&format!(r#""{field}":{bad}"#)));
                assert!(e.contains(path), "{path} = {bad}: {e}");
            }
        }
    }

    #[test]
    fn an_unknown_field_is_refused_at_every_level_with_its_path() {
        let jwt = r#""jwt":{"hs256Secret":"0123456789abcdef","#;
        let cf = r#""cloudflareAccess":{"jwksFile":"c","audience":"a","issuer":"i","#;
        for (json, path) in [
            (r#"{"bogus":1,"pools":{"p":{"keys":["k"]}}}"#.to_string(), "bogus"),
            (r#"{"resolver":{"bogus":1},"pools":{"p":{"keys":["k"]}}}"#.to_string(), "resolver.bogus"),
            (pool_json(r#","bogus":1"#), "pools.p1.bogus"),
            (pool_json(r#","queue":{"bogus":1}"#), "pools.p1.queue.bogus"),
            (pool_json(r#","access":{"bogus":1}"#), "pools.p1.access.bogus"),
            (pool_json(r#","access":{"hmac":{"secret":"s","bogus":1}}"#), "pools.p1.access.hmac.bogus"),
            (pool_json(&format!(r#","access":{{{jwt}"bogus":1}}}}"#)), "pools.p1.access.jwt.bogus"),
            (pool_json(&format!(r#","access":{{{cf}"bogus":1}}}}"#)), "pools.p1.access.cloudflareAccess.bogus"),
            (pool_json(r#","upstream":{"url":"http://127.0.0.1:9","bogus":1}"#), "pools.p1.upstream.bogus"),
            // camelCase only: the Rust name of a field is not a field.
            (pool_json(r#","term_ms":1000"#), "pools.p1.term_ms"),
        ] {
            let e = err(&json);
            assert!(e.starts_with(&format!("invalid configuration: {path}: unknown field ")), "{json}: {e}");
        }
    }

    #[test]
    fn errors_name_the_field() {
        assert!(err(&pool_json(r#","renewIntervalMs":5000,"termMs":5000"#)).contains("pools.p1.renewIntervalMs"));
        assert!(err(&pool_json(r#","concurrency":0"#)).contains("pools.p1.concurrency"));
        assert!(err(&pool_json(r#","bogus":1"#)).contains("bogus"));
        assert!(err(&pool_json(r#","rpmBurst":3"#)).contains("rpmBurst"));
        assert!(err(&pool_json(r#","requestTimeoutMs":100"#)).contains("requestTimeoutMs"));
        assert!(err(r#"{"pools":{"Bad_Name":{"keys":["k"]}}}"#).contains("Bad_Name"));
        assert!(err(r#"{"pools":{"p":{}}}"#).contains("pools.p.keys"));
        assert!(err(r#"{"pools":{"p":{"keys":["k"],"keySha256":["xyz"]}}}"#).contains("keySha256"));
        assert!(err(r#"{"listen":"nowhere","pools":{"p":{"keys":["k"]}}}"#).contains("listen"));
        assert!(err(r#"{"pools":{}}"#).contains("pools"));
        assert!(err(&pool_json(r#","queue":{"timeoutMs":"soon"}"#)).contains("pools.p1.queue.timeoutMs"));
        assert!(err(&pool_json(r#","termMs":-1"#)).contains("pools.p1.termMs"));
        assert!(err(&pool_json(r#","idempotencyKeys":0"#)).contains("pools.p1.idempotencyKeys"));
    }

    #[test]
    fn state_file_and_snapshot_interval() {
        let c = Config::parse(pool_json("").as_bytes()).unwrap();
        assert_eq!((c.state_file.as_deref(), c.snapshot_interval_ms), (Some("nthpool.state"), None));
        let off = Config::parse(br#"{"stateFile":null,"pools":{"p":{"keys":["k"]}}}"#).unwrap();
        assert_eq!(off.state_file, None);
        assert!(err(r#"{"stateFile":"","pools":{"p":{"keys":["k"]}}}"#).contains("stateFile"));
        let e = err(r#"{"stateFile":"nthpool.secret","pools":{"p":{"keys":["k"]}}}"#);
        assert!(e.contains("stateFile: nthpool.secret is the slot secret's file too"), "{e}");
        let e = err(r#"{"slotSecretFile":"s1","stateFile":"s1","pools":{"p":{"keys":["k"]}}}"#);
        assert!(e.contains("stateFile: s1 is the slot secret's file too"), "{e}");
        assert!(err(r#"{"snapshotIntervalMs":10,"pools":{"p":{"keys":["k"]}}}"#).contains("snapshotIntervalMs"));
        let e = err(r#"{"stateFile":null,"snapshotIntervalMs":5000,"pools":{"p":{"keys":["k"]}}}"#);
        assert!(e.contains("snapshotIntervalMs needs stateFile"), "{e}");
        let periodic = Config::parse(br#"{"snapshotIntervalMs":5000,"pools":{"p":{"keys":["k"]}}}"#).unwrap();
        assert_eq!(periodic.snapshot_interval_ms, Some(5000));
    }

    #[test]
    fn rpm_burst_defaults_to_one_second() {
        let c = Config::parse(pool_json(r#","rpm":600"#).as_bytes()).unwrap();
        assert_eq!(c.pools["p1"].rpm_burst_or_default(), Some(10));
        let c = Config::parse(pool_json(r#","rpm":30"#).as_bytes()).unwrap();
        assert_eq!(c.pools["p1"].rpm_burst_or_default(), Some(1));
    }

    #[test]
    fn a_request_cap_below_the_upstreams_timeout_is_a_caution() {
        let proxy = |extra: &str| {
            let json = format!(
                r#"{{"pools":{{"p":{{"keys":["k"]{extra},"upstream":{{"url":"http://127.0.0.1:9","hosts":["a.example"]}}}}}}}}"#
            );
            Config::parse(json.as_bytes()).unwrap().cautions()
        };
        let said = proxy("");
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            said[0].starts_with("pools.p: requestTimeoutMs (60000) cuts") && said[0].contains("(600000)"),
            "{said:?}"
        );
        assert!(proxy(r#","requestTimeoutMs":600000"#).is_empty());
        assert!(Config::parse(pool_json("").as_bytes()).unwrap().cautions().is_empty(), "no upstream, no caution");
    }

    #[test]
    fn a_non_loopback_admin_listener_needs_a_token() {
        let open = r#"{"adminListen":"0.0.0.0:7071","pools":{"p":{"keys":["k"]}}}"#;
        assert!(err(open).contains("adminToken"), "{}", err(open));
        let short = r#"{"adminListen":"0.0.0.0:7071","adminToken":"short","pools":{"p":{"keys":["k"]}}}"#;
        assert!(err(short).contains("adminToken must be 16"));
        let ok = r#"{"adminListen":"[::]:7071","adminToken":"0123456789abcdef","pools":{"p":{"keys":["k"]}}}"#;
        assert_eq!(Config::parse(ok.as_bytes()).unwrap().admin_token.as_deref(), Some("0123456789abcdef"));
        let loopback = r#"{"adminListen":"[::1]:7071","pools":{"p":{"keys":["k"]}}}"#;
        assert!(Config::parse(loopback.as_bytes()).is_ok());
        let mapped = r#"{"adminListen":"[::ffff:127.0.0.1]:7071","pools":{"p":{"keys":["k"]}}}"#;
        let mapped = Config::parse(mapped.as_bytes()).expect("an IPv4-mapped loopback address is loopback");
        assert!(mapped.check_admin_bound("[::ffff:127.0.0.1]:7071".parse().unwrap()).is_ok());
        // A reload is judged by the address bound, not the one it names.
        let loopback = Config::parse(loopback.as_bytes()).unwrap();
        let e = loopback.check_admin_bound("0.0.0.0:7071".parse().unwrap()).unwrap_err().0;
        assert!(e.starts_with("adminToken: ") && e.contains("0.0.0.0:7071"), "{e}");
        assert!(loopback.check_admin_bound("127.0.0.1:7071".parse().unwrap()).is_ok());
        let ok = Config::parse(ok.as_bytes()).unwrap();
        assert!(ok.check_admin_bound("0.0.0.0:7071".parse().unwrap()).is_ok());
    }

    #[test]
    fn dns_labels() {
        assert!(is_dns_label("prod-acme"));
        assert!(is_dns_label("a"));
        assert!(!is_dns_label(""));
        assert!(!is_dns_label("-a"));
        assert!(!is_dns_label("a-"));
        assert!(!is_dns_label("A"));
        assert!(!is_dns_label(&"a".repeat(64)));
    }
}
