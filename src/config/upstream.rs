//! A pool's `upstream` section (SPEC §12): its shape, its checks, and the
//! one build step that turns it into what the proxy runs with.
//!
//! `UpstreamConfig` is the JSON as written; `Upstream::build` resolves it —
//! the address from `url`, `${env:NAME}` and `${file:PATH}` in `setHeaders`
//! — and is called where every other file a configuration names is read, so
//! `--check-config`, start-up and reload refuse the same mistakes. Header
//! values are held as `Secret`s: their `Debug` shows no byte of them, so a
//! logged configuration never carries a managed credential.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use serde::Deserialize;

use super::{ConfigError, MAX_DURATION_MS};
use crate::files;
use crate::net::resolve::MAX_HOST_LEN;
use crate::net::tls::ClientTls;

/// The most idle keep-alive connections one upstream may keep.
pub const MAX_IDLE_CONNECTIONS: usize = 10_000;
/// The longest an idle upstream connection may be kept (one hour).
pub const MAX_IDLE_TIMEOUT_MS: u64 = 3_600_000;
/// The longest a TLS handshake may be given (ten minutes).
pub const MAX_TLS_HANDSHAKE_TIMEOUT_MS: u64 = 600_000;
/// The largest proxied request body that may be configured (1 TiB).
pub const MAX_REQUEST_BYTES: u64 = 1 << 40;
/// The longest a managed header value may be, after resolution.
pub const MAX_HEADER_VALUE: usize = 8 * 1024;
/// The largest file a `${file:PATH}` reference may name (its text then has
/// to fit `MAX_HEADER_VALUE` with the rest of the value).
const MAX_FILE_VALUE_BYTES: u64 = 64 * 1024;

#[derive(Clone, Deserialize, PartialEq, Debug)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpstreamConfig {
    pub url: String,
    #[serde(default)]
    pub listen: Option<String>,
    #[serde(default)]
    pub hosts: Vec<String>,
    #[serde(default, deserialize_with = "unique_headers")]
    pub set_headers: BTreeMap<String, Secret>,
    #[serde(default = "defaults::wait_ms")]
    pub wait_ms: u64,
    #[serde(default = "defaults::timeout_ms")]
    pub timeout_ms: u64,
    #[serde(default = "defaults::max_request_bytes")]
    pub max_request_bytes: u64,
    #[serde(default = "defaults::idle_connections")]
    pub idle_connections: usize,
    #[serde(default = "defaults::idle_timeout_ms")]
    pub idle_timeout_ms: u64,
    #[serde(default)]
    pub ca_file: Option<String>,
    /// An `https://` upstream's TLS handshake must be done this long after the connect.
    #[serde(default = "defaults::tls_handshake_timeout_ms")]
    pub tls_handshake_timeout_ms: u64,
}

/// `setHeaders`, refusing a name given twice (the case-insensitive repeats
/// are found by `validate`).
fn unique_headers<'de, D: serde::Deserializer<'de>>(de: D) -> Result<BTreeMap<String, Secret>, D::Error> {
    super::unique_map(de, "header")
}

mod defaults {
    pub fn wait_ms() -> u64 {
        30_000
    }
    pub fn timeout_ms() -> u64 {
        600_000
    }
    pub fn max_request_bytes() -> u64 {
        32 * 1024 * 1024
    }
    pub fn idle_connections() -> usize {
        32
    }
    /// Below the 5 s keep-alive timeout of common upstream servers (Node.js,
    /// uvicorn, Apache), so nthpool closes an idle connection before the
    /// upstream does and a request never races the upstream's close.
    pub fn idle_timeout_ms() -> u64 {
        4_000
    }
    pub fn tls_handshake_timeout_ms() -> u64 {
        crate::net::tls::DEFAULT_HANDSHAKE_TIMEOUT_MS
    }
}

/// Text that may be a credential: compared and cloned like a string, never shown.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// The value itself, for the one place that writes it to the upstream.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Headers the proxy owns on the way to the upstream: `setHeaders` cannot name them.
const RESERVED_HEADERS: [&str; 12] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "proxy-authorization",
    "proxy-authenticate",
];

/// What the proxy runs with for one pool: resolved, checked, immutable.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// Where to connect: the name the resolver looks up (or an IP literal) and the port.
    pub target: Target,
    /// The `Host` the upstream is sent: the URL's authority, as written.
    pub host: Box<[u8]>,
    /// For `https://`: the roots (bundled plus `caFile`) and the session cache
    /// all connections to this upstream share.
    pub tls: Option<ClientTls>,
    pub listen: Option<SocketAddr>,
    /// Lower-case host names, without port, routed to this pool on the main listener.
    pub hosts: Vec<Box<[u8]>>,
    /// `setHeaders` with their references resolved; names as configured.
    pub set_headers: Vec<(Box<str>, Secret)>,
    pub wait_ms: u64,
    pub timeout_ms: u64,
    pub max_request_bytes: u64,
    pub idle_connections: usize,
    /// An idle kept-alive connection is closed after this long unused.
    pub idle_timeout_ms: u64,
    /// What a request head written for this upstream depends on (where it
    /// goes, its `Host`, the `setHeaders` values), as one number: a head
    /// written under another key (before a reload changed them) is not sent.
    pub head_key: u64,
}

impl UpstreamConfig {
    /// The files this section reads (`caFile`, `${file:PATH}` in
    /// `setHeaders`), each with the field that names it.
    pub fn files_read(&self) -> impl Iterator<Item = (String, &Path)> {
        let ca = self.ca_file.iter().map(|f| ("caFile".to_string(), Path::new(f.as_str())));
        let values = self.set_headers.iter().flat_map(|(name, value)| {
            file_references(value.expose()).map(move |path| (format!("setHeaders.{name}"), Path::new(path)))
        });
        ca.chain(values)
    }

    /// Checks what the JSON alone decides; `pools.<name>.upstream` is prefixed by the caller.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let target = parse_url(&self.url)?;
        if let Some(listen) = &self.listen {
            if listen.parse::<SocketAddr>().is_err() {
                return Err(field("listen", format!("{listen:?} is not an address like 127.0.0.1:7080")));
            }
        }
        for host in &self.hosts {
            if !crate::config::is_host_name(host) {
                return Err(field(
                    "hosts",
                    format!("{host:?} is not a host name without port, like acme.nthpool.local"),
                ));
            }
        }
        for name in self.set_headers.keys() {
            // Not quoted: a credential written where the name goes
            // (`"Bearer sk-…": ""`) would land in the log of a refused
            // start or reload.
            if !is_header_name(name) {
                return Err(field(
                    "setHeaders",
                    "a name is not a header name, which is one or more letters, digits and !#$%&'*+-.^_`|~ \
                     (not shown: it may be a secret)"
                        .to_string(),
                ));
            }
            // `Transfer_Encoding` too: an upstream that maps names to
            // CGI-style variables would take it for the real one.
            let lower = name.to_ascii_lowercase().replace('_', "-");
            if RESERVED_HEADERS.contains(&lower.as_str()) || lower.starts_with("x-nthpool-") {
                return Err(field("setHeaders", format!("{name} is set by the proxy itself and cannot be configured")));
            }
        }
        // `X-A` and `X_A` too: the proxy replaces a client's header of either
        // spelling, and an upstream that maps names to CGI-style variables
        // would see one field twice.
        let lower: Vec<String> = self.set_headers.keys().map(|k| k.to_ascii_lowercase().replace('_', "-")).collect();
        if let Some(dup) = lower.iter().enumerate().find(|(i, n)| lower[..*i].contains(n)) {
            return Err(field(
                "setHeaders",
                format!("{} is given twice (names are case-insensitive, and `_` counts as `-`)", dup.1),
            ));
        }
        if self.wait_ms > MAX_DURATION_MS {
            return Err(field("waitMs", format!("must be at most {MAX_DURATION_MS}")));
        }
        if self.timeout_ms == 0 || self.timeout_ms > MAX_DURATION_MS {
            return Err(field("timeoutMs", format!("must be between 1 and {MAX_DURATION_MS}")));
        }
        if self.max_request_bytes > MAX_REQUEST_BYTES {
            return Err(field("maxRequestBytes", format!("must be at most {MAX_REQUEST_BYTES}")));
        }
        if self.idle_connections > MAX_IDLE_CONNECTIONS {
            return Err(field("idleConnections", format!("must be at most {MAX_IDLE_CONNECTIONS}")));
        }
        if self.idle_timeout_ms == 0 || self.idle_timeout_ms > MAX_IDLE_TIMEOUT_MS {
            return Err(field("idleTimeoutMs", format!("must be between 1 and {MAX_IDLE_TIMEOUT_MS}")));
        }
        if !(1..=MAX_TLS_HANDSHAKE_TIMEOUT_MS).contains(&self.tls_handshake_timeout_ms) {
            return Err(field(
                "tlsHandshakeTimeoutMs",
                format!("must be between 1 and {MAX_TLS_HANDSHAKE_TIMEOUT_MS}"),
            ));
        }
        if self.ca_file.is_some() && !target.tls {
            return Err(field("caFile", "applies to https:// upstreams only".to_string()));
        }
        Ok(())
    }
}

impl Upstream {
    /// Resolves a validated section: reads the environment and the files that
    /// `setHeaders` names, and the `caFile`. An error names the field.
    pub fn build(config: &UpstreamConfig) -> Result<Upstream, String> {
        Upstream::rebuild(config, None)
    }

    /// `build` on a reload, `previous` the pool's running upstream: TLS
    /// settings that trust the same roots are kept (`ClientTls::same_as`).
    pub fn rebuild(config: &UpstreamConfig, previous: Option<&Upstream>) -> Result<Upstream, String> {
        let target = parse_url(&config.url).map_err(|e| e.0)?;
        let tls = match target.tls {
            true => {
                let tls =
                    ClientTls::new(config.ca_file.as_deref().map(Path::new)).map_err(|e| format!("upstream.{e}"))?;
                let tls = tls.with_handshake_timeout(config.tls_handshake_timeout_ms);
                // A reload that left the trust as it was keeps the running
                // settings: their kept-alive connections and session cache.
                match previous.and_then(|p| p.tls.as_ref()) {
                    Some(running) if running.same_as(&tls) => Some(running.clone()),
                    _ => Some(tls),
                }
            }
            false => None,
        };
        let mut set_headers = Vec::with_capacity(config.set_headers.len());
        for (name, value) in &config.set_headers {
            let resolved = resolve(value.expose()).map_err(|e| format!("upstream.setHeaders.{name}: {e}"))?;
            // RFC 9110 §5.5: a field value holds no control character but a tab.
            if resolved.len() > MAX_HEADER_VALUE || resolved.bytes().any(|b| (b < b' ' && b != b'\t') || b == 0x7f) {
                return Err(format!(
                    "upstream.setHeaders.{name}: the value must be one line of at most {MAX_HEADER_VALUE} bytes, \
                     with no control character but a tab"
                ));
            }
            set_headers.push((name.as_str().into(), Secret(resolved)));
        }
        let head_key = {
            use std::hash::{Hash, Hasher};
            let mut h = std::hash::DefaultHasher::new();
            (target.tls, &target.name, target.port, &target.authority).hash(&mut h);
            for (name, value) in &set_headers {
                (name, value.expose()).hash(&mut h);
            }
            h.finish()
        };
        Ok(Upstream {
            head_key,
            host: target.authority.as_bytes().into(),
            target,
            tls,
            listen: config.listen.as_ref().map(|l| l.parse().expect("validated")),
            // As requests are routed: without case or a final dot.
            hosts: config.hosts.iter().map(|h| crate::config::host_key(h).into_bytes().into()).collect(),
            set_headers,
            wait_ms: config.wait_ms,
            timeout_ms: config.timeout_ms,
            max_request_bytes: config.max_request_bytes,
            idle_connections: config.idle_connections,
            idle_timeout_ms: config.idle_timeout_ms,
        })
    }
}

fn field(name: &str, message: String) -> ConfigError {
    ConfigError(format!("upstream.{name}: {message}"))
}

/// Whether `name` may be a header's name (RFC 9110 §5.1: a token).
pub(crate) fn is_header_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(is_token_byte)
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Where an upstream is, from its `url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `https://`: the connection is TLS, verified for `name`.
    pub tls: bool,
    /// The host as a name to resolve and verify, or an IP literal (without brackets).
    pub name: Box<str>,
    pub port: u16,
    /// The `Host` the upstream is sent: the URL's authority, as written.
    pub authority: Box<str>,
}

/// `http[s]://HOST[:PORT][/]`, HOST a DNS name or an IP literal.
fn parse_url(url: &str) -> Result<Target, ConfigError> {
    // A user or a query may hold a credential (`https://user:sk-…@host`,
    // `?api_key=…`), and the message lands in the log of a refused start
    // or reload: such a URL is not quoted. So may a path or a fragment (a
    // webhook's `/services/…/…`, a bot's `/bot<token>`): only what comes
    // before it is.
    let bad = |why: &str| {
        if url.contains(['@', '?']) {
            return field("url", format!("{why} (the URL is not shown: a user or a query in it may be a credential)"));
        }
        // A scheme's `://` only: one further on (`api.example/x://…`) is in the path.
        let authority = url.find("://").filter(|&at| !url[..at].contains(['/', '#'])).map_or(0, |at| at + 3);
        match url[authority..].find(['/', '#']).map(|at| authority + at + 1) {
            Some(cut) if cut < url.len() => {
                let shown = format!("{}…", &url[..cut]);
                field("url", format!("{shown:?}: {why} (the rest is not shown: a path in it may be a credential)"))
            }
            _ => field("url", format!("{url:?}: {why}")),
        }
    };
    let (tls, rest) = if let Some(rest) = url.strip_prefix("http://") {
        (false, rest)
    } else if let Some(rest) = url.strip_prefix("https://") {
        (true, rest)
    } else {
        return Err(bad("must start with http:// or https://"));
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    if authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
        return Err(bad("must be http[s]://host[:port] with no path, query or user"));
    }
    let (host, port, literal) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (ip, after) = v6.split_once(']').ok_or_else(|| bad("an IPv6 address needs its closing ']'"))?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or_else(|| bad("expected :port after the address"))?),
            };
            (ip, port, true)
        }
        None => match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p), false),
            None => (authority, None, false),
        },
    };
    let port = match port {
        None if tls => 443,
        None => 80,
        Some(p) => p.parse::<u16>().ok().filter(|&p| p != 0).ok_or_else(|| bad("the port must be 1-65535"))?,
    };
    let is_ip = host.parse::<IpAddr>().is_ok();
    if literal && !is_ip {
        return Err(bad("between [ and ] must be an IPv6 address"));
    }
    let name_ok = host.len() <= MAX_HOST_LEN
        && !host.is_empty()
        && host.split('.').all(|label| {
            !label.is_empty()
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if !is_ip && !name_ok {
        return Err(bad("the host must be a DNS name or an IP address"));
    }
    Ok(Target { tls, name: host.to_ascii_lowercase().into(), port, authority: authority.into() })
}

/// The paths of the `${file:PATH}` references in `value`.
fn file_references(value: &str) -> impl Iterator<Item = &str> {
    value.split("${").skip(1).filter_map(|tail| tail.split_once('}')?.0.strip_prefix("file:"))
}

/// Whether a reference may be quoted in an error: a name as environment
/// variables are named (`API_KEY`), not a value written where a name goes
/// (`${sk-live-…}`, `${env:sk-live-…}`), which would land in the log of a
/// refused start or reload.
fn plain_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// A `${file:…}` path's names (between its `/` and `.`) are at most this
/// long to be quoted: a JWT's parts between its dots are longer.
const PATH_PART_SHOWN_BYTES: usize = 40;

/// Whether a `${file:…}` path may be quoted in an error: one that reads as
/// a path (`/run/secrets/key`, `key.txt`), not a value written where the
/// path goes (`${file:sk-live-…}`: API keys hold neither `/` nor `.`; nor
/// `${file:eyJhbGciOi….eyJzdWIi….SflKxwRJ…}`, a JWT, whose signature alone
/// is 43 characters or more).
fn reads_as_path(path: &str) -> bool {
    path.contains(['/', '.']) && path.split(['/', '.']).all(|name| name.len() <= PATH_PART_SHOWN_BYTES)
}

/// Replaces every `${env:NAME}` and `${file:PATH}` in `value`. A file's
/// trailing line break is dropped (editors add one).
fn resolve(value: &str) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let tail = &rest[at + 2..];
        let end = tail.find('}').ok_or("a `${` reference is not closed with `}`")?;
        let reference = &tail[..end];
        if reference == "env:" || reference == "file:" {
            return Err(format!("`${{{reference}}}` names nothing: write ${{env:NAME}} or ${{file:PATH}}"));
        }
        if let Some(name) = reference.strip_prefix("env:") {
            let v = std::env::var(name).map_err(|_| {
                if plain_name(name) {
                    format!("the environment variable {name} is not set")
                } else {
                    "a `${env:…}` names an environment variable that is not set (not shown: it may be a secret)".into()
                }
            })?;
            out.push_str(&v);
        } else if let Some(path) = reference.strip_prefix("file:") {
            let cannot = |why: &dyn fmt::Display| {
                if reads_as_path(path) {
                    format!("cannot read {path}: {why}")
                } else {
                    format!("cannot read the file a `${{file:…}}` names: {why} (not shown: it may be a secret)")
                }
            };
            let bytes = files::read_bounded(path.as_ref(), MAX_FILE_VALUE_BYTES).map_err(|e| cannot(&e))?;
            let text = String::from_utf8(bytes).map_err(|_| cannot(&"it is not UTF-8 text"))?;
            out.push_str(text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text));
        } else if plain_name(reference) {
            return Err(format!("`${{{reference}}}` is neither ${{env:NAME}} nor ${{file:PATH}}"));
        } else {
            return Err("a `${…}` is neither ${env:NAME} nor ${file:PATH} (not shown: it may be a secret)".into());
        }
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(extra: &str) -> UpstreamConfig {
        serde_json::from_str(&format!(r#"{{"url":"http://127.0.0.1:9"{extra}}}"#)).unwrap()
    }

    #[test]
    fn urls() {
        let t = |url: &str| {
            let t = parse_url(url).unwrap();
            (t.tls, t.name.to_string(), t.port, t.authority.to_string())
        };
        assert_eq!(t("http://127.0.0.1:8080"), (false, "127.0.0.1".into(), 8080, "127.0.0.1:8080".into()));
        assert_eq!(t("http://localhost/"), (false, "localhost".into(), 80, "localhost".into()));
        assert_eq!(t("http://[::1]:81"), (false, "::1".into(), 81, "[::1]:81".into()));
        assert_eq!(t("https://api.openai.com"), (true, "api.openai.com".into(), 443, "api.openai.com".into()));
        assert_eq!(
            t("https://API.Example.com:8443/"),
            (true, "api.example.com".into(), 8443, "API.Example.com:8443".into())
        );
        for bad in [
            "ftp://x",
            "http://",
            "https://",
            "http://1.2.3.4/v1",
            "http://1.2.3.4:0",
            "https://a..b",
            "https://-a.example",
            "https://a_b.example",
            "https://[api.example]",
            "https://user@api.example",
        ] {
            let e = parse_url(bad).unwrap_err().0;
            assert!(e.starts_with("upstream.url"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_url_that_may_hold_a_credential_is_refused_without_quoting_it() {
        for bad in
            ["https://user:sk-SECRET@api.example", "https://api.example/v1?api_key=SECRET", "sk-SECRET@api.example"]
        {
            let e = parse_url(bad).unwrap_err().0;
            assert!(
                e.starts_with("upstream.url: ")
                    && e.ends_with("(the URL is not shown: a user or a query in it may be a credential)"),
                "{bad}: {e}"
            );
            assert!(!e.contains("SECRET"), "{bad}: {e}");
        }
        let e = parse_url("https://api.example:0/").unwrap_err().0;
        assert!(e.contains(r#""https://api.example:0/": the port"#), "a URL with none is quoted: {e}");
        for (bad, shown) in [
            ("https://hooks.example/services/T0/B0/SECRET", r#""https://hooks.example/…""#),
            ("https://api.example/botSECRET", r#""https://api.example/…""#),
            ("https://api.example#SECRET", r#""https://api.example#…""#),
            ("api.example/SECRET", r#""api.example/…""#),
            ("api.example/hook://SECRET", r#""api.example/…""#),
            ("api.example#x://SECRET", r#""api.example#…""#),
        ] {
            let e = parse_url(bad).unwrap_err().0;
            assert!(e.starts_with(&format!("upstream.url: {shown}: must ")), "{bad}: {e}");
            assert!(e.ends_with("(the rest is not shown: a path in it may be a credential)"), "{bad}: {e}");
            assert!(!e.contains("SECRET"), "{bad}: {e}");
        }
    }

    #[test]
    fn https_builds_its_tls_settings_and_names_a_bad_ca_file() {
        let plain = Upstream::build(&section("")).unwrap();
        assert!(plain.tls.is_none());
        let config: UpstreamConfig = serde_json::from_str(r#"{"url":"https://api.example"}"#).unwrap();
        let tls = Upstream::build(&config).unwrap().tls.expect("TLS settings");
        assert_eq!(tls.handshake_timeout_ms(), 10_000);
        let config: UpstreamConfig =
            serde_json::from_str(r#"{"url":"https://api.example","tlsHandshakeTimeoutMs":2500}"#).unwrap();
        assert_eq!(Upstream::build(&config).unwrap().tls.expect("TLS settings").handshake_timeout_ms(), 2_500);
        let config: UpstreamConfig =
            serde_json::from_str(r#"{"url":"https://api.example","caFile":"/nonexistent/ca.pem"}"#).unwrap();
        config.validate().unwrap();
        let e = Upstream::build(&config).unwrap_err();
        assert!(e.starts_with("upstream.caFile /nonexistent/ca.pem: cannot be read"), "{e}");
        let e = section(r#","caFile":"ca.pem""#).validate().unwrap_err().0;
        assert_eq!(e, "upstream.caFile: applies to https:// upstreams only");
    }

    #[test]
    fn a_set_header_named_twice_in_any_spelling_is_refused() {
        for twice in [r#"{"X-A":"1","x-a":"2"}"#, r#"{"X-A":"1","X_A":"2"}"#, r#"{"x_a":"1","X-a":"2"}"#] {
            let e = section(&format!(r#","setHeaders":{twice}"#)).validate().unwrap_err().0;
            assert!(e.starts_with("upstream.setHeaders: x-a is given twice"), "{twice}: {e}");
        }
        section(r#","setHeaders":{"X-A":"1","X-B":"2"}"#).validate().unwrap();
    }

    #[test]
    fn a_set_header_value_holds_no_control_character_but_a_tab() {
        let build = |value: &str| Upstream::build(&section(&format!(r#","setHeaders":{{"X-Team":"{value}"}}"#)));
        assert!(build(r"core\tteam ~!").is_ok());
        for bad in [r"a\rb", r"a\nb", r"a\u0000b", r"a\u0001b", r"a\u001fb", r"a\u007fb"] {
            let e = build(bad).err().unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(e.starts_with("upstream.setHeaders.X-Team: the value must be one line"), "{bad}: {e}");
        }
        let long = "v".repeat(MAX_HEADER_VALUE + 1);
        assert!(build(&long).is_err());
    }

    #[test]
    fn references_are_resolved_and_named_when_missing() {
        std::env::set_var("NTHPOOL_UPSTREAM_TEST_TOKEN", "sk-123");
        let file = std::env::temp_dir().join(format!("nthpool-upstream-token-{}", std::process::id()));
        std::fs::write(&file, "from-file\n").unwrap();
        let value = format!("Bearer ${{env:NTHPOOL_UPSTREAM_TEST_TOKEN}}/${{file:{}}}", file.display());
        let resolved = resolve(&value);
        std::fs::remove_file(&file).unwrap();
        assert_eq!(resolved.unwrap(), "Bearer sk-123/from-file");
        assert!(resolve("${env:NTHPOOL_UPSTREAM_TEST_MISSING}").unwrap_err().contains("NTHPOOL_UPSTREAM_TEST_MISSING"));
        assert!(resolve("${file:/nonexistent/nthpool}").unwrap_err().contains("/nonexistent/nthpool"));
        assert!(resolve("${file:missing-key.txt}").unwrap_err().contains("cannot read missing-key.txt:"));
        let named: Vec<&str> = file_references("a ${file:x} ${env:Y}${file:/run/z}, $ {file:no}").collect();
        assert_eq!(named, ["x", "/run/z"], "the files a value reads");
        assert!(resolve("${vault:x}").is_err());
        for empty in ["${env:}", "${file:}"] {
            assert!(resolve(empty).unwrap_err().contains("names nothing"), "{empty}");
        }
        assert!(resolve("${env:X").is_err());
        assert!(resolve("${API_KEY}").unwrap_err().contains("`${API_KEY}` is neither"), "a name is quoted");
        let jwt = "Bearer ${file:eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJTRUNSRVQiLCJuYW1lIjoiSm9obiBEb2UifQ.\
                   SECRETSECRETSECRETSECRETSECRETSECRETSECRET}";
        for pasted in ["Bearer ${sk-live-SECRET}", "Bearer ${env:sk-live-SECRET}", "Bearer ${file:sk-live-SECRET}", jwt]
        {
            let e = resolve(pasted).unwrap_err();
            assert!(e.ends_with("(not shown: it may be a secret)") && !e.contains("SECRET"), "{pasted}: {e}");
        }
        let config = section(r#","setHeaders":{"Authorization":"Bearer ${env:NTHPOOL_UPSTREAM_TEST_MISSING}"}"#);
        let e = Upstream::build(&config).unwrap_err();
        assert!(e.starts_with("upstream.setHeaders.Authorization"), "{e}");
    }

    #[test]
    fn secrets_never_show_in_debug() {
        std::env::set_var("NTHPOOL_UPSTREAM_TEST_SECRET", "sk-very-secret");
        let config = section(
            r#","setHeaders":{"Authorization":"Bearer ${env:NTHPOOL_UPSTREAM_TEST_SECRET}","X-Literal":"literal-secret"}"#,
        );
        let built = Upstream::build(&config).unwrap();
        assert_eq!(built.set_headers[0].1.expose(), "Bearer sk-very-secret");
        for shown in [format!("{built:?}"), format!("{config:?}")] {
            assert!(!shown.contains("sk-very-secret") && !shown.contains("literal-secret"), "{shown}");
        }
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (r#","listen":"nowhere""#, "upstream.listen"),
            (r#","hosts":["a b"]"#, "upstream.hosts"),
            (r#","hosts":["a.example:80"]"#, "upstream.hosts"),
            (r#","setHeaders":{"Host":"x"}"#, "upstream.setHeaders"),
            (r#","setHeaders":{"X-Nthpool-Key":"x"}"#, "upstream.setHeaders"),
            // The `_` spellings a CGI-style upstream would take for the real ones.
            (r#","setHeaders":{"Transfer_Encoding":"chunked"}"#, "upstream.setHeaders"),
            (r#","setHeaders":{"content_length":"9"}"#, "upstream.setHeaders"),
            (r#","setHeaders":{"X_Nthpool_Key":"x"}"#, "upstream.setHeaders"),
            (r#","hosts":["."]"#, "upstream.hosts"),
            (r#","hosts":["a..example"]"#, "upstream.hosts"),
            (r#","hosts":["-a.example"]"#, "upstream.hosts"),
            (r#","setHeaders":{"bad name":"x"}"#, "upstream.setHeaders"),
            (r#","setHeaders":{"A":"x","a":"y"}"#, "upstream.setHeaders"),
            (r#","timeoutMs":0"#, "upstream.timeoutMs"),
            (r#","idleConnections":100000"#, "upstream.idleConnections"),
            (r#","idleTimeoutMs":0"#, "upstream.idleTimeoutMs"),
            (r#","idleTimeoutMs":3600001"#, "upstream.idleTimeoutMs"),
            (r#","caFile":"ca.pem""#, "upstream.caFile"),
            (r#","tlsHandshakeTimeoutMs":0"#, "upstream.tlsHandshakeTimeoutMs"),
            (r#","tlsHandshakeTimeoutMs":600001"#, "upstream.tlsHandshakeTimeoutMs"),
        ];
        for (extra, name) in cases {
            let e = section(extra).validate().unwrap_err().0;
            assert!(e.starts_with(name), "{extra}: {e}");
        }
        assert!(section("").validate().is_ok());
    }

    /// A name that is no header name is most often a credential written
    /// where the name goes: the error names the field and is silent on it.
    #[test]
    fn a_name_that_is_no_header_name_is_not_quoted() {
        for name in ["Bearer sk-live-SECRET", "Authorization: Bearer SECRET", "SECRET\\u0000", ""] {
            let e = section(&format!(r#","setHeaders":{{"{name}":"x"}}"#)).validate().unwrap_err().0;
            assert!(e.starts_with("upstream.setHeaders: a name is not a header name"), "{name}: {e}");
            assert!(e.ends_with("(not shown: it may be a secret)") && !e.contains("SECRET"), "{name}: {e}");
        }
    }
}
