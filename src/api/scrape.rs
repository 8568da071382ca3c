//! What `/metrics` shows, read from the governor into plain data
//! (`metrics::MetricsSnapshot`); the reactor adds its own counters and
//! `metrics::render` writes the text.

use super::App;
use crate::governor::{DenyReason, Pool};
use crate::metrics::{AccessLogCounters, Histogram, MetricsSnapshot, PoolMetrics, ServerStats};
use crate::time::Ms;

impl App {
    /// Every pool's values and the application's counters at `now`, with
    /// the reactor's `server` counters.
    pub fn metrics<'s>(&self, now: Ms, server: &'s ServerStats) -> MetricsSnapshot<'s> {
        let gov = &self.gov;
        let pools = gov
            .pools()
            .enumerate()
            .filter(|(_, (_, p))| !p.drained_away())
            .map(|(i, (pid, p))| {
                let mut m = pool_metrics(p, now, gov.advanced_to(), self.latency.get(i).copied());
                m.rejections = self.rejections.by_code(Some(pid));
                m.proxied = self.creds[pid.0 as usize].upstream.is_some();
                m.index = i;
                m
            })
            .collect();
        MetricsSnapshot {
            pools,
            rejections: self.rejections.by_code(None),
            access_log: AccessLogCounters {
                lines: self.log.lines,
                write_errors: self.log.write_errors,
                dropped: self.log.dropped,
            },
            server,
        }
    }
}

/// One pool at `now`; what it learned as of `learned_at`, the instant the
/// governor last advanced to.
fn pool_metrics(p: &Pool, now: Ms, learned_at: Ms, acquire_us: Option<Histogram>) -> PoolMetrics {
    let (s, l) = (&p.stats, &p.learning);
    let (budget, pace) = l.budget_at(learned_at);
    let gauge = |v: u64| v.min(i64::MAX as u64) as i64;
    let limited_by = p.limited_by(learned_at).map(|(reason, on)| (reason.as_str(), on));
    PoolMetrics {
        name: p.name.to_string(),
        proxied: false,
        index: 0,
        held: p.held as u64,
        waiters: p.queue.len() as u64,
        limit: p.settings.concurrency as u64,
        effective_limit: p.effective_limit_at(learned_at) as u64,
        grants: s.grants,
        queue_timeouts: s.queue_timeouts,
        waiters_gone: s.waiters_gone,
        reports_throttled: s.reports_throttled,
        cooldowns: s.cooldowns,
        retired: p.retired,
        budget_remaining: budget.map_or(-1, |b| gauge(b.remaining)),
        limited_by,
        learned_refused_at: l.refused_at as i64,
        budget_limit: l.budget_limit.map_or(-1, gauge),
        budget_reset_ms: budget.map_or(-1, |b| gauge(b.reset_at.saturating_sub(learned_at))),
        cooldown_ms: gauge(l.cooldown_until.saturating_sub(learned_at)),
        learning_starting: l.starting_at(learned_at),
        budget_paced_next_ms: pace.map_or(-1, |pace| gauge(pace.next_at().saturating_sub(learned_at))),
        token_block_ms: match l.token_block_until {
            until if until > learned_at => gauge(until - learned_at),
            _ => -1,
        },
        rpm_tokens: p.rpm_tokens_at(now),
        recovering: p.recovering(now),
        readopted: s.readopted,
        idempotency_keys: p.idem.len() as u64,
        idempotent_replays: s.idempotent_replays,
        superseded: s.superseded,
        denials: DenyReason::ALL.iter().map(|&reason| (reason.as_str(), s.denied[reason as usize])).collect(),
        reclaims: [("term", s.reclaimed_term), ("cap", s.reclaimed_cap)],
        renewals: [("renewed", s.renewed), ("not_found", s.renew_not_found), ("capped", s.renew_capped)],
        releases: [("released", s.released), ("already_gone", s.release_gone)],
        rejections: Vec::new(),
        acquire_us,
    }
}
