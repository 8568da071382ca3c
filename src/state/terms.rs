//! The lease terms a crash must wait for (SPEC §11), kept in `<stateFile>.lock`.
//!
//! A start without a usable snapshot opens each pool's re-adoption window
//! for one term, so that every holder renews before anything new is
//! granted. But a held lease keeps the term it was granted with: after a
//! reload (or a deploy) that lowered `termMs`, the leases granted before it
//! renew at the old, longer cadence until their request caps. A window of
//! the new term would end before they come back, and grant their places
//! twice. So each process writes down, per pool, every term its leases may
//! still have and until when (at start and at every reload, never per
//! request); the next start reads it before it takes the file over, and
//! keeps each window open for the longest term still in force, and no
//! longer than the leases of that term can still live.
//!
//! The record is advisory: one that is missing (the first start) leaves
//! each window at the configured term, and so does one that cannot be read
//! (a torn write, a foreign file), with a warning naming it. A rewrite that
//! stopped before it cut the file to its new length left the old record's
//! tail behind the new one, which is read past.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, Write};

use serde::{Deserialize, Serialize};

use crate::config::{Config, MAX_CONCURRENCY, MAX_DURATION_MS};

/// One term a pool's leases may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Term {
    #[serde(rename = "termMs")]
    pub term_ms: u64,
    /// The Unix ms after which no lease of this term is alive; `0` while a
    /// process grants with it (then `requestTimeoutMs` after it stopped).
    #[serde(rename = "untilUnixMs")]
    pub until_unix_ms: u64,
    #[serde(rename = "requestTimeoutMs")]
    pub request_timeout_ms: u64,
    /// The pool's `concurrency` when it granted with this term: a crash's
    /// successor re-adopts as many, past a limit lowered since. `0` where
    /// unknown (the leases a snapshot restored, a record written before it
    /// was kept).
    #[serde(rename = "concurrency", default)]
    pub concurrency: u32,
}

/// Drops from one pool's terms those that have ended and those another one
/// covers; past `MAX_TERMS`, the closed ones that need the shortest wait.
fn prune(terms: &mut Vec<Term>, now_unix: u64) {
    terms.retain(|t| t.ends(now_unix) > now_unix);
    // Of two that cover each other (the same in effect), the first stays.
    let mut i = 0;
    while i < terms.len() {
        let covered = (0..terms.len()).any(|j| {
            j != i && terms[j].covers(&terms[i], now_unix) && (j < i || !terms[i].covers(&terms[j], now_unix))
        });
        if covered {
            terms.remove(i);
        } else {
            i += 1;
        }
    }
    if terms.len() > MAX_TERMS {
        // The open ones (granted with now) first, then by the wait each needs.
        let wait = |t: &Term| {
            if t.until_unix_ms == 0 {
                u64::MAX
            } else {
                t.term_ms.min(t.until_unix_ms.saturating_sub(now_unix))
            }
        };
        terms.sort_by_key(|t| std::cmp::Reverse(wait(t)));
        terms.truncate(MAX_TERMS);
    }
}

impl Term {
    /// Whether this one makes `other` redundant for every later reader: a
    /// term at least as long, of a limit at least as high, in force at least
    /// as long.
    fn covers(&self, other: &Term, now_unix: u64) -> bool {
        let lasts = match (self.until_unix_ms, other.until_unix_ms) {
            (0, 0) => self.request_timeout_ms >= other.request_timeout_ms,
            // Open, it lasts a cap past whenever it is read, now at the earliest.
            (0, until) => now_unix.saturating_add(self.request_timeout_ms) >= until,
            (_, 0) => false,
            (mine, theirs) => mine >= theirs,
        };
        self.term_ms >= other.term_ms && self.concurrency >= other.concurrency && lasts
    }

    /// The instant it ends, for a reader at `now`: a term still granted
    /// with when the writer stopped ends a request cap after that, which
    /// was `now` at the latest.
    fn ends(&self, now_unix: u64) -> u64 {
        match self.until_unix_ms {
            0 => now_unix.saturating_add(self.request_timeout_ms),
            until => until,
        }
    }
}

/// Per pool, the terms its leases may have.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Terms {
    pools: BTreeMap<String, Vec<Term>>,
}

/// At most this many terms are kept per pool: each reload that changes a
/// pool's term adds one, and they expire within a request cap; past the
/// bound the ones granted with and those that end last are kept.
const MAX_TERMS: usize = 16;

/// A record is read up to this size: `MAX_TERMS` terms of 63-character pool
/// names take about 1.1 KB a pool, so this is room for over 200 000 pools.
const MAX_RECORD_BYTES: u64 = 256 << 20;

impl Terms {
    /// What a previous process left in `file` (from its start): nothing when
    /// it is empty, why when it cannot be read. Its durations are held to
    /// what a configuration allows: a file is not trusted to be sane.
    pub fn read(file: &mut File) -> Result<Terms, String> {
        let mut bytes = Vec::new();
        file.rewind().map_err(|e| e.to_string())?;
        file.take(MAX_RECORD_BYTES + 1).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
        if bytes.len() as u64 > MAX_RECORD_BYTES {
            return Err(format!("it is over {} MiB, more than any record takes", MAX_RECORD_BYTES >> 20));
        }
        // The first value (none in an empty file): what follows it is an
        // older, longer record's tail.
        let first = serde_json::Deserializer::from_slice(&bytes).into_iter::<Terms>().next();
        let mut terms = match first {
            Some(Ok(terms)) => terms,
            Some(Err(e)) => return Err(format!("it is not a record of lease terms ({e})")),
            None => return Ok(Terms::default()),
        };
        for t in terms.pools.values_mut().flatten() {
            t.term_ms = t.term_ms.min(MAX_DURATION_MS);
            t.request_timeout_ms = t.request_timeout_ms.min(MAX_DURATION_MS);
            t.concurrency = t.concurrency.min(MAX_CONCURRENCY);
        }
        Ok(terms)
    }

    /// Whether any pool's leases may still be alive at `now`: a process ran
    /// here and granted slots not long ago.
    pub fn any_in_force(&self, now_unix: u64) -> bool {
        self.pools.keys().any(|pool| self.window(pool, now_unix).is_some())
    }

    /// How long a re-adoption window of `pool` opened at `now` must last for
    /// the leases this record knows of to come back: each term, but no longer
    /// than the leases of that term can still be alive.
    pub fn window(&self, pool: &str, now_unix: u64) -> Option<u64> {
        let terms = self.pools.get(pool)?;
        terms
            .iter()
            .filter_map(|t| Some(t.term_ms.min(t.ends(now_unix).checked_sub(now_unix).filter(|&left| left > 0)?)))
            .max()
    }

    /// The most slots `pool`'s leases still alive at `now` may number: the
    /// highest limit they were granted under.
    pub fn holders(&self, pool: &str, now_unix: u64) -> Option<u32> {
        let terms = self.pools.get(pool)?;
        terms.iter().filter(|t| t.ends(now_unix) > now_unix).map(|t| t.concurrency).max()
    }

    /// The record this process starts from: what the last one left, closed
    /// at `now` (its process is gone) and without what has ended; then the
    /// terms of the leases a snapshot restored, each to its latest request
    /// deadline; then `config`'s terms, which this process grants with.
    pub fn carried(&self, now_unix: u64, restored: &BTreeMap<String, (u64, u64)>, config: &Config) -> Terms {
        let mut next = Terms::default();
        for (pool, terms) in &self.pools {
            for t in terms {
                next.add(pool, Term { until_unix_ms: t.ends(now_unix), ..*t }, now_unix);
            }
        }
        for (pool, &(term_ms, until_unix_ms)) in restored {
            next.add(pool, Term { term_ms, until_unix_ms, request_timeout_ms: 0, concurrency: 0 }, now_unix);
        }
        next.granting(config, now_unix);
        next
    }

    /// This process stops granting with its terms at `now` (a graceful
    /// stop, or a reload before it grants with new ones): they end a request
    /// cap from now, not from whenever the next start reads them.
    pub fn close_open(&mut self, now_unix: u64) {
        for terms in self.pools.values_mut() {
            for t in terms.iter_mut().filter(|t| t.until_unix_ms == 0) {
                t.until_unix_ms = now_unix.saturating_add(t.request_timeout_ms);
            }
            prune(terms, now_unix);
        }
    }

    /// A reload applied `config` at `now`: a pool's term it changed ends a
    /// request cap from now (the leases granted with it end by then), and
    /// the new one is granted with from now on.
    pub fn reconfigured(&mut self, config: &Config, now_unix: u64) {
        self.close_open(now_unix);
        self.granting(config, now_unix);
    }

    /// Adds the terms `config`'s pools grant with, open while this process runs.
    fn granting(&mut self, config: &Config, now_unix: u64) {
        for (name, pool) in &config.pools {
            let open = Term {
                term_ms: pool.term_ms,
                until_unix_ms: 0,
                request_timeout_ms: pool.request_timeout_ms,
                concurrency: pool.concurrency,
            };
            self.add(name, open, now_unix);
        }
    }

    fn add(&mut self, pool: &str, term: Term, now_unix: u64) {
        let terms = self.pools.entry(pool.to_string()).or_default();
        if term.ends(now_unix) <= now_unix || terms.iter().any(|t| t.covers(&term, now_unix)) {
            return;
        }
        terms.push(term);
        prune(terms, now_unix);
    }
    /// Writes the record over `file`'s contents, synced. Written first and
    /// cut to its length after: a write that fails (a full disk) leaves the
    /// record before it rather than none.
    pub fn write(&self, file: &mut File) -> std::io::Result<()> {
        let text = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        file.rewind()?;
        file.write_all(&text)?;
        file.set_len(text.len() as u64)?;
        file.sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(term_ms: u64, request_timeout_ms: u64) -> Config {
        let json = format!(
            r#"{{"pools":{{"p":{{"keys":["nb_test_0123456789abcdef"],"termMs":{term_ms},"renewIntervalMs":{},
                "requestTimeoutMs":{request_timeout_ms}}}}}}}"#,
            term_ms / 3
        );
        Config::parse(json.as_bytes()).expect("a valid configuration")
    }

    /// A reload lowers the term from 6 s to 1 s: the leases granted before
    /// it keep 6 s until their request caps (60 s from the reload). A crash
    /// within them must wait 6 s; after them, 1 s.
    #[test]
    fn a_lowered_term_is_waited_for_until_the_old_leases_caps() {
        let none = BTreeMap::new();
        let mut terms = Terms::default().carried(1_000, &none, &config(6_000, 60_000));
        terms.reconfigured(&config(1_000, 30_000), 10_000);
        // The process crashes at 20 s; the next one starts at 25 s.
        assert_eq!(terms.window("p", 25_000), Some(6_000));
        let next = terms.carried(25_000, &none, &config(1_000, 30_000));
        assert_eq!(next.window("p", 65_000), Some(5_000), "the old leases' caps end at 70 s");
        assert_eq!(next.window("p", 70_000), Some(1_000));
        assert_eq!(next.window("q", 25_000), None, "a pool never written down");
    }

    /// A reload lowers the limit from 8 to 2: up to 8 leases granted before
    /// it live until their request caps, and a crash within them must take
    /// all 8 back; after them, the record asks for no more than the limit.
    #[test]
    fn a_lowered_limit_is_waited_for_until_the_old_leases_caps() {
        let none = BTreeMap::new();
        let limit = |concurrency: u32| {
            let json = format!(
                r#"{{"pools":{{"p":{{"keys":["nb_test_0123456789abcdef"],"concurrency":{concurrency},
                    "termMs":6000,"renewIntervalMs":2000,"requestTimeoutMs":60000}}}}}}"#
            );
            Config::parse(json.as_bytes()).expect("a valid configuration")
        };
        let mut terms = Terms::default().carried(1_000, &none, &limit(8));
        terms.reconfigured(&limit(2), 10_000);
        assert_eq!(terms.holders("p", 25_000), Some(8));
        let next = terms.carried(25_000, &none, &limit(2));
        assert_eq!(next.holders("p", 69_000), Some(8), "the old leases' caps end at 70 s");
        assert_eq!(next.holders("p", 70_000), Some(2));
        assert_eq!(next.holders("q", 25_000), None, "a pool never written down");
        // A record written before limits were kept in it asks for none.
        let old: Terms =
            serde_json::from_slice(br#"{"pools":{"p":[{"termMs":6000,"untilUnixMs":0,"requestTimeoutMs":60000}]}}"#)
                .unwrap();
        assert_eq!(old.holders("p", 1_000), Some(0));
    }

    /// A graceful stop, then a start with a lower term: the restored leases
    /// keep 6 s until their request deadlines; a crash of the new process
    /// before then must wait 6 s.
    #[test]
    fn restored_leases_keep_their_term_in_the_record() {
        let restored = BTreeMap::from([("p".to_string(), (6_000, 50_000))]);
        let terms = Terms::default().carried(1_000, &restored, &config(1_000, 30_000));
        assert_eq!(terms.window("p", 40_000), Some(6_000));
        assert_eq!(terms.window("p", 46_000), Some(4_000), "no longer than they live");
        assert_eq!(terms.window("p", 50_000), Some(1_000), "still granted with while its process runs");
    }

    /// A window never outlasts the leases it waits for: a 10-minute term
    /// lowered at 10 s has its leases all end by 610 s (their caps); a crash
    /// and a start at 609 s wait one more second for them, not ten minutes.
    #[test]
    fn a_window_never_outlasts_the_leases_it_waits_for() {
        let none = BTreeMap::new();
        let mut terms = Terms::default().carried(1_000, &none, &config(600_000, 600_000));
        terms.reconfigured(&config(10_000, 600_000), 10_000);
        let next = terms.carried(609_000, &none, &config(10_000, 600_000));
        // The old leases have one second left; the new term is ten.
        assert_eq!(next.window("p", 609_000), Some(10_000));
    }

    /// The bound on entries never drops the term the process grants with.
    #[test]
    fn the_bound_keeps_the_term_granted_with() {
        let none = BTreeMap::new();
        let mut terms = Terms::default().carried(0, &none, &config(200_000, 600_000));
        for i in 0..20u64 {
            terms.reconfigured(&config(100_000 - i * 1_000, 600_000), 1_000 + i);
        }
        let p = &terms.pools["p"];
        assert_eq!(p.len(), MAX_TERMS);
        assert_eq!(p.iter().filter(|t| t.until_unix_ms == 0).map(|t| t.term_ms).collect::<Vec<_>>(), [81_000]);
    }

    /// A reload that shortens only the request cap keeps the longer-lived
    /// leases of the same term: the entry that lasts longer is not replaced.
    #[test]
    fn a_shorter_request_cap_does_not_forget_the_leases_granted_under_the_longer_one() {
        let none = BTreeMap::new();
        let mut terms = Terms::default().carried(0, &none, &config(60_000, 600_000));
        terms.reconfigured(&config(60_000, 120_000), 1_000);
        terms.reconfigured(&config(1_000, 120_000), 2_000);
        assert_eq!(terms.window("p", 130_000), Some(60_000), "the leases of the first cap live to 601 s");
        assert_eq!(terms.window("p", 600_000), Some(1_000));
    }

    /// Past the bound, the entry that sets the window is kept.
    #[test]
    fn the_bound_keeps_the_entry_that_sets_the_window() {
        let none = BTreeMap::new();
        let mut terms = Terms::default().carried(0, &none, &config(600_000, 600_000));
        for i in 0..20u64 {
            terms.reconfigured(&config(1_000 + i, 600_000), 1_000 + i);
        }
        assert!(terms.pools["p"].len() <= MAX_TERMS);
        assert_eq!(terms.window("p", 10_000), Some(591_000), "the 10-minute leases, until 601 s");
    }

    /// A graceful stop closes the terms granted with at the stop.
    #[test]
    fn a_stop_closes_the_terms_at_the_stop() {
        let mut terms = Terms::default().carried(1_000, &BTreeMap::new(), &config(6_000, 60_000));
        terms.close_open(2_000);
        assert_eq!(terms.window("p", 60_000), Some(2_000), "its leases end by 62 s");
        assert_eq!(terms.window("p", 62_000), None);
    }

    #[test]
    fn the_record_round_trips_through_its_file_and_a_torn_one_is_told_unreadable() {
        let dir = std::env::temp_dir().join(format!("nthpool-terms-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("state.lock");
        let mut file =
            std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        assert_eq!(Terms::read(&mut file), Ok(Terms::default()), "a new lock file holds none");
        let terms = Terms::default().carried(1_000, &BTreeMap::new(), &config(6_000, 60_000));
        terms.write(&mut file).unwrap();
        assert_eq!(Terms::read(&mut file), Ok(terms.clone()));
        // A shorter record written over a longer one is read whole.
        let shorter = Terms::default();
        shorter.write(&mut file).unwrap();
        assert_eq!(Terms::read(&mut file), Ok(shorter.clone()));
        // ...also when the write stopped before the file was cut to its length.
        terms.write(&mut file).unwrap();
        file.rewind().unwrap();
        std::io::Write::write_all(&mut file, &serde_json::to_vec(&shorter).unwrap()).unwrap();
        assert_eq!(Terms::read(&mut file), Ok(shorter));
        // A write cut short is unreadable, and says so.
        terms.write(&mut file).unwrap();
        file.set_len(10).unwrap();
        assert!(Terms::read(&mut file).unwrap_err().contains("not a record of lease terms"));
        // Durations past any a configuration allows are held to that bound.
        file.set_len(0).unwrap();
        file.rewind().unwrap();
        std::io::Write::write_all(
            &mut file,
            br#"{"pools":{"p":[{"termMs":18446744073709551615,"untilUnixMs":0,"requestTimeoutMs":18446744073709551615,"concurrency":4294967295}]}}"#,
        )
        .unwrap();
        assert_eq!(Terms::read(&mut file).unwrap().window("p", 1_000), Some(MAX_DURATION_MS));
        assert_eq!(Terms::read(&mut file).unwrap().holders("p", 1_000), Some(MAX_CONCURRENCY));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Tens of thousands of pools with a term lowered each make a record of
    /// megabytes: it is read whole, not cut at some size and dropped.
    #[test]
    fn a_record_of_many_pools_is_read_whole() {
        let dir = std::env::temp_dir().join(format!("nthpool-terms-many-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join("state.lock"))
            .unwrap();
        let mut terms = Terms::default();
        for i in 0..30_000 {
            let pool = format!("tenant-{i:05}-with-a-name-long-enough-to-weigh");
            terms.add(
                &pool,
                Term { term_ms: 6_000, until_unix_ms: 90_000, request_timeout_ms: 60_000, concurrency: 16 },
                1_000,
            );
            terms.add(
                &pool,
                Term { term_ms: 1_000, until_unix_ms: 0, request_timeout_ms: 60_000, concurrency: 16 },
                1_000,
            );
        }
        terms.write(&mut file).unwrap();
        assert!(file.metadata().unwrap().len() > 4 << 20, "a record of megabytes");
        let read = Terms::read(&mut file).unwrap();
        assert_eq!(read.window("tenant-29999-with-a-name-long-enough-to-weigh", 2_000), Some(6_000));
        assert_eq!(read, terms);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
