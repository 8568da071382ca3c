//! What the governor is told of the configuration: the numbers of each
//! pool, as `PoolSettings`. The governor never sees the configuration file's
//! types; this is the one place they are translated.

use std::collections::BTreeMap;

use crate::config::{Config, PoolConfig};
use crate::governor::PoolSettings;

impl From<&PoolConfig> for PoolSettings {
    fn from(c: &PoolConfig) -> Self {
        PoolSettings {
            concurrency: c.concurrency,
            queue_size: c.queue.size,
            queue_timeout_ms: c.queue.timeout_ms,
            rpm: c.rpm.zip(c.rpm_burst_or_default()),
            term_ms: c.term_ms,
            renew_interval_ms: c.renew_interval_ms,
            request_timeout_ms: c.request_timeout_ms,
            adaptive: c.adaptive,
            idempotency_keys: c.idempotency_keys,
        }
    }
}

/// Every configured pool's settings, by name.
pub fn pool_settings(config: &Config) -> BTreeMap<String, PoolSettings> {
    config.pools.iter().map(|(name, pool)| (name.clone(), PoolSettings::from(pool))).collect()
}
