//! What one event-loop thread measured, and how threads' results are merged.
//!
//! Latencies go into HDR histograms in microseconds (1 µs to one hour, three
//! significant digits), so recording is a constant-time array increment with
//! no allocation, and percentiles are exact to 0.1 % however long the run.

use hdrhistogram::Histogram;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Acquire,
    Renew,
    Release,
    Get,
}

impl Endpoint {
    pub const ALL: [Endpoint; 4] = [Endpoint::Acquire, Endpoint::Renew, Endpoint::Release, Endpoint::Get];

    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Acquire => "acquire",
            Endpoint::Renew => "renew",
            Endpoint::Release => "release",
            Endpoint::Get => "get",
        }
    }
}

/// Why a request got no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// No complete answer within `--timeout-ms`.
    Timeout,
    /// The connection was reset or a read/write failed.
    Reset,
    /// The server closed the connection before answering.
    Closed,
    /// The answer could not be framed, or a 2xx grant had no `slotId`.
    BadResponse,
}

impl Failure {
    pub const ALL: [Failure; 4] = [Failure::Timeout, Failure::Reset, Failure::Closed, Failure::BadResponse];

    pub fn name(self) -> &'static str {
        match self {
            Failure::Timeout => "timeout",
            Failure::Reset => "reset",
            Failure::Closed => "closed",
            Failure::BadResponse => "bad-response",
        }
    }
}

const LOWEST_US: u64 = 1;
const HIGHEST_US: u64 = 3_600_000_000;
/// HTTP status codes are three digits; httparse guarantees it.
const STATUSES: usize = 1000;

#[derive(Debug, Clone)]
pub struct Stats {
    latency: Vec<Histogram<u64>>,
    statuses: Vec<[u64; STATUSES]>,
    failures: [[u64; Failure::ALL.len()]; Endpoint::ALL.len()],
    /// Connections that could not be opened (refused, unreachable, timed out).
    pub connect_errors: u64,
    /// Keep-alive connections the server closed between requests.
    pub idle_closes: u64,
    /// Completed acquire → release cycles.
    pub cycles: u64,
    /// Open loop only: how late the client itself sent each request after its
    /// intended time, or after the previous answer freed the connection if that
    /// came later. Large values mean the client, not the server, is the limit.
    pub send_lag: Histogram<u64>,
    /// Nanoseconds since the run's origin at which the last measured answer arrived.
    pub last_answer_ns: u64,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(LOWEST_US, HIGHEST_US, 3).expect("constant bounds are valid")
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            latency: Endpoint::ALL.iter().map(|_| histogram()).collect(),
            statuses: vec![[0; STATUSES]; Endpoint::ALL.len()],
            failures: [[0; Failure::ALL.len()]; Endpoint::ALL.len()],
            connect_errors: 0,
            idle_closes: 0,
            cycles: 0,
            send_lag: histogram(),
            last_answer_ns: 0,
        }
    }
}

impl Stats {
    pub fn answer(&mut self, ep: Endpoint, status: u16, latency_ns: u64, at_ns: u64) {
        self.latency[ep as usize].saturating_record(latency_ns.div_ceil(1000).max(LOWEST_US));
        self.statuses[ep as usize][usize::from(status) % STATUSES] += 1;
        self.last_answer_ns = self.last_answer_ns.max(at_ns);
    }

    pub fn failure(&mut self, ep: Endpoint, why: Failure) {
        self.failures[ep as usize][why as usize] += 1;
    }

    pub fn latency(&self, ep: Endpoint) -> &Histogram<u64> {
        &self.latency[ep as usize]
    }

    /// Non-zero status counts of one endpoint, in code order.
    pub fn statuses(&self, ep: Endpoint) -> impl Iterator<Item = (u16, u64)> + '_ {
        self.statuses[ep as usize].iter().enumerate().filter(|(_, &n)| n > 0).map(|(code, &n)| (code as u16, n))
    }

    pub fn failures(&self, ep: Endpoint) -> impl Iterator<Item = (Failure, u64)> + '_ {
        Failure::ALL.iter().map(move |&f| (f, self.failures[ep as usize][f as usize])).filter(|&(_, n)| n > 0)
    }

    pub fn answers(&self) -> u64 {
        self.latency.iter().map(Histogram::len).sum()
    }

    pub fn successes(&self) -> u64 {
        Endpoint::ALL
            .iter()
            .flat_map(|&ep| self.statuses(ep))
            .filter(|&(code, _)| (200..300).contains(&code))
            .map(|(_, n)| n)
            .sum()
    }

    pub fn failure_total(&self) -> u64 {
        self.failures.iter().flatten().sum::<u64>() + self.connect_errors
    }

    pub fn merge(&mut self, other: &Stats) {
        for (mine, theirs) in self.latency.iter_mut().zip(&other.latency) {
            mine.add(theirs).expect("same bounds");
        }
        for (mine, theirs) in self.statuses.iter_mut().zip(&other.statuses) {
            for (a, b) in mine.iter_mut().zip(theirs) {
                *a += b;
            }
        }
        for (mine, theirs) in self.failures.iter_mut().zip(&other.failures) {
            for (a, b) in mine.iter_mut().zip(theirs) {
                *a += b;
            }
        }
        self.connect_errors += other.connect_errors;
        self.idle_closes += other.idle_closes;
        self.cycles += other.cycles;
        self.send_lag.add(&other.send_lag).expect("same bounds");
        self.last_answer_ns = self.last_answer_ns.max(other.last_answer_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_and_merge() {
        let mut a = Stats::default();
        a.answer(Endpoint::Acquire, 200, 1_500, 10);
        a.answer(Endpoint::Acquire, 429, 0, 20);
        a.failure(Endpoint::Renew, Failure::Timeout);
        let mut b = Stats::default();
        b.answer(Endpoint::Acquire, 200, 9_000_000, 30);
        b.connect_errors = 2;
        a.merge(&b);
        assert_eq!(a.answers(), 3);
        assert_eq!(a.successes(), 2);
        assert_eq!(a.failure_total(), 3);
        assert_eq!(a.statuses(Endpoint::Acquire).collect::<Vec<_>>(), [(200, 2), (429, 1)]);
        assert_eq!(a.failures(Endpoint::Renew).collect::<Vec<_>>(), [(Failure::Timeout, 1)]);
        // 1.5 µs rounds up to 2; a zero latency still counts as the 1 µs floor.
        assert_eq!(a.latency(Endpoint::Acquire).min(), 1);
        assert_eq!(a.latency(Endpoint::Acquire).value_at_quantile(0.5), 2);
        assert!(a.latency(Endpoint::Acquire).max() >= 9_000);
        assert_eq!(a.last_answer_ns, 30);
    }
}
