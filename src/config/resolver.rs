//! The top-level `resolver` section: how upstream host names are looked up
//! (the system's resolver, or the name servers given) and how long answers
//! are kept. One resolver thread serves every upstream, so the section is
//! one for the whole configuration.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde::Deserialize;

use super::{ConfigError, MAX_DURATION_MS};
use crate::net::resolve::{CachePolicy, Nameservers};

/// Name servers that may be listed.
pub const MAX_NAMESERVERS: usize = 8;
/// Rounds over the name servers a lookup may make.
pub const MAX_ATTEMPTS: u32 = 5;
/// The per-attempt wait may be set between these.
pub const MIN_ATTEMPT_MS: u64 = 10;
pub const MAX_ATTEMPT_MS: u64 = 60_000;
/// The shortest TTL that may be configured: below it every request would ask again.
pub const MIN_TTL_FLOOR_MS: u64 = 100;

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResolverConfig {
    /// `IP` or `IP:PORT` (53 when absent); empty: the system's resolver (`getaddrinfo`).
    #[serde(default)]
    pub nameservers: Vec<String>,
    /// The wait for one answer from one name server.
    #[serde(default = "defaults::timeout_ms")]
    pub timeout_ms: u64,
    /// Rounds over all the name servers before a lookup fails.
    #[serde(default = "defaults::attempts")]
    pub attempts: u32,
    /// How long an answer without a TTL (the system resolver's) is fresh.
    #[serde(default = "defaults::ttl_ms")]
    pub ttl_ms: u64,
    /// A DNS answer's TTL is held between these.
    #[serde(default = "defaults::min_ttl_ms")]
    pub min_ttl_ms: u64,
    #[serde(default = "defaults::max_ttl_ms")]
    pub max_ttl_ms: u64,
    /// How long past its TTL an answer is still used while a refresh runs.
    #[serde(default = "defaults::max_stale_ms")]
    pub max_stale_ms: u64,
    /// How long a name that did not resolve is answered as such without asking again.
    #[serde(default = "defaults::negative_ttl_ms")]
    pub negative_ttl_ms: u64,
}

mod defaults {
    use crate::net::resolve;

    pub fn timeout_ms() -> u64 {
        2_000
    }
    pub fn attempts() -> u32 {
        2
    }
    pub fn ttl_ms() -> u64 {
        resolve::DEFAULT_TTL_MS
    }
    pub fn min_ttl_ms() -> u64 {
        resolve::DEFAULT_MIN_TTL_MS
    }
    pub fn max_ttl_ms() -> u64 {
        resolve::DEFAULT_MAX_TTL_MS
    }
    pub fn max_stale_ms() -> u64 {
        resolve::DEFAULT_MAX_STALE_MS
    }
    pub fn negative_ttl_ms() -> u64 {
        resolve::DEFAULT_NEGATIVE_TTL_MS
    }
}

impl Default for ResolverConfig {
    fn default() -> Self {
        ResolverConfig {
            nameservers: Vec::new(),
            timeout_ms: defaults::timeout_ms(),
            attempts: defaults::attempts(),
            ttl_ms: defaults::ttl_ms(),
            min_ttl_ms: defaults::min_ttl_ms(),
            max_ttl_ms: defaults::max_ttl_ms(),
            max_stale_ms: defaults::max_stale_ms(),
            negative_ttl_ms: defaults::negative_ttl_ms(),
        }
    }
}

fn field(name: &str, message: String) -> ConfigError {
    ConfigError(format!("resolver.{name}: {message}"))
}

/// `IP` or `IP:PORT`, IPv6 with a port in brackets.
fn nameserver(text: &str) -> Option<SocketAddr> {
    text.parse::<SocketAddr>().ok().or_else(|| Some(SocketAddr::new(text.parse::<IpAddr>().ok()?, 53)))
}

impl ResolverConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.nameservers.len() > MAX_NAMESERVERS {
            return Err(field("nameservers", format!("at most {MAX_NAMESERVERS} may be listed")));
        }
        for ns in &self.nameservers {
            if nameserver(ns).is_none_or(|a| a.port() == 0) {
                return Err(field("nameservers", format!("{ns:?} is not an address like 127.0.0.53 or [::1]:5353")));
            }
        }
        if !(MIN_ATTEMPT_MS..=MAX_ATTEMPT_MS).contains(&self.timeout_ms) {
            return Err(field("timeoutMs", format!("must be between {MIN_ATTEMPT_MS} and {MAX_ATTEMPT_MS}")));
        }
        if !(1..=MAX_ATTEMPTS).contains(&self.attempts) {
            return Err(field("attempts", format!("must be between 1 and {MAX_ATTEMPTS}")));
        }
        for (name, value) in [("ttlMs", self.ttl_ms), ("minTtlMs", self.min_ttl_ms), ("maxTtlMs", self.max_ttl_ms)] {
            if !(MIN_TTL_FLOOR_MS..=MAX_DURATION_MS).contains(&value) {
                return Err(field(name, format!("must be between {MIN_TTL_FLOOR_MS} and {MAX_DURATION_MS}")));
            }
        }
        if self.min_ttl_ms > self.max_ttl_ms {
            return Err(field(
                "minTtlMs",
                format!("must not be above maxTtlMs ({} > {})", self.min_ttl_ms, self.max_ttl_ms),
            ));
        }
        if !(self.min_ttl_ms..=self.max_ttl_ms).contains(&self.ttl_ms) {
            return Err(field(
                "ttlMs",
                format!(
                    "must be between minTtlMs ({}) and maxTtlMs ({}); it is {}",
                    self.min_ttl_ms, self.max_ttl_ms, self.ttl_ms
                ),
            ));
        }
        for (name, value) in [("maxStaleMs", self.max_stale_ms), ("negativeTtlMs", self.negative_ttl_ms)] {
            if value > MAX_DURATION_MS {
                return Err(field(name, format!("must be at most {MAX_DURATION_MS}")));
            }
        }
        Ok(())
    }

    /// The cache's timings.
    pub fn policy(&self) -> CachePolicy {
        CachePolicy {
            ttl_ms: self.ttl_ms,
            min_ttl_ms: self.min_ttl_ms,
            max_ttl_ms: self.max_ttl_ms,
            max_stale_ms: self.max_stale_ms,
            negative_ttl_ms: self.negative_ttl_ms,
        }
    }

    /// The name servers to ask, or `None` for the system's resolver.
    pub fn nameservers(&self) -> Option<Nameservers> {
        (!self.nameservers.is_empty()).then(|| Nameservers {
            servers: self.nameservers.iter().map(|ns| nameserver(ns).expect("validated")).collect(),
            timeout: Duration::from_millis(self.timeout_ms),
            attempts: self.attempts,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> ResolverConfig {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn defaults_are_the_system_resolver_with_the_cache_timings() {
        let config = parse("{}");
        assert_eq!(config, ResolverConfig::default());
        config.validate().unwrap();
        assert_eq!(config.nameservers(), None);
        let policy = config.policy();
        assert_eq!((policy.ttl_ms, policy.max_stale_ms, policy.negative_ttl_ms), (30_000, 300_000, 1_000));
    }

    #[test]
    fn nameservers_take_a_default_port() {
        let config = parse(r#"{"nameservers":["127.0.0.53","[::1]:5353","10.0.0.1:54"],"timeoutMs":500}"#);
        config.validate().unwrap();
        let ns = config.nameservers().unwrap();
        let expected: Vec<SocketAddr> =
            vec!["127.0.0.53:53".parse().unwrap(), "[::1]:5353".parse().unwrap(), "10.0.0.1:54".parse().unwrap()];
        assert_eq!(ns.servers, expected);
        assert_eq!(ns.timeout, Duration::from_millis(500));
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (r#"{"nameservers":["dns.example"]}"#, "resolver.nameservers"),
            (r#"{"nameservers":["127.0.0.1:0"]}"#, "resolver.nameservers"),
            (
                r#"{"nameservers":["1.1.1.1","1.1.1.2","1.1.1.3","1.1.1.4","1.1.1.5","1.1.1.6","1.1.1.7","1.1.1.8","1.1.1.9"]}"#,
                "resolver.nameservers",
            ),
            (r#"{"timeoutMs":0}"#, "resolver.timeoutMs"),
            (r#"{"attempts":0}"#, "resolver.attempts"),
            (r#"{"attempts":6}"#, "resolver.attempts"),
            (r#"{"minTtlMs":50}"#, "resolver.minTtlMs"),
            (r#"{"minTtlMs":5000,"maxTtlMs":4000,"ttlMs":4500}"#, "resolver.minTtlMs"),
            (r#"{"ttlMs":600000}"#, "resolver.ttlMs"),
            (r#"{"maxStaleMs":700000000}"#, "resolver.maxStaleMs"),
            (r#"{"negativeTtlMs":700000000}"#, "resolver.negativeTtlMs"),
        ];
        for (json, name) in cases {
            let e = parse(json).validate().unwrap_err().0;
            assert!(e.starts_with(name), "{json}: {e}");
        }
    }
}
