//! zergd's own counters, for `/metrics`: what no rush's status holds because it happens
//! beside the rushes (level merges and their gates, usage-limit holds, worker-plane
//! connections). They live for the process, as Prometheus expects of counters; everything a
//! rush's status already says (tasks by state, attempts, crashes, respawns, cost and tokens) is
//! read from the status when `/metrics` is asked for, so the two can never disagree.
//!
//! Each figure is a relaxed atomic (or a small map behind a mutex, for the per-gate ones): the
//! cost on the paths that count is a few nanoseconds.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

/// The upper bounds (seconds) of the duration histograms' buckets: a level merge takes
/// milliseconds to minutes, a gate up to its timeout.
pub const BUCKETS: [f64; 12] = [
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// A Prometheus histogram of durations: cumulative bucket counts, their sum and count.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    /// The sum, in microseconds.
    sum_us: AtomicU64,
}

impl Histogram {
    /// Counts one observation.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        for (b, bound) in self.buckets.iter().zip(BUCKETS) {
            if secs <= bound {
                b.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(
            d.as_micros().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
    }

    /// The cumulative count of each bucket (in [`BUCKETS`]' order), the count and the sum in
    /// seconds.
    pub fn read(&self) -> (Vec<u64>, u64, f64) {
        (
            self.buckets
                .iter()
                .map(|b| b.load(Ordering::Relaxed))
                .collect(),
            self.count.load(Ordering::Relaxed),
            self.sum_us.load(Ordering::Relaxed) as f64 / 1e6,
        )
    }
}

/// How a level merge ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeOutcome {
    /// Merged, gates passed.
    Merged,
    /// Two branches conflicted.
    Conflict,
    /// A required gate failed.
    GateFailed,
    /// Git or the filesystem failed.
    Error,
}

impl MergeOutcome {
    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            MergeOutcome::Merged => "merged",
            MergeOutcome::Conflict => "conflict",
            MergeOutcome::GateFailed => "gate_failed",
            MergeOutcome::Error => "error",
        }
    }

    /// Every outcome, in the order `/metrics` lists them.
    pub const ALL: [MergeOutcome; 4] = [
        MergeOutcome::Merged,
        MergeOutcome::Conflict,
        MergeOutcome::GateFailed,
        MergeOutcome::Error,
    ];
}

/// zergd's process-wide counters.
#[derive(Debug, Default)]
pub struct Metrics {
    merges: [AtomicU64; 4],
    /// Durations of level merges (the merge, the gates and moving the branches).
    pub merge_seconds: Histogram,
    /// Durations of quality-gate runs, whatever their outcome.
    pub gate_seconds: Histogram,
    gates: Mutex<BTreeMap<String, (u64, u64)>>,
    usage_limit_holds: AtomicU64,
    plane_connections: AtomicI64,
    plane_connections_total: AtomicU64,
    egress_refused: AtomicU64,
    attempts_by_model: Mutex<BTreeMap<String, u64>>,
}

impl Metrics {
    /// Counts a level merge that ended with `outcome` after `took`.
    pub fn merged(&self, outcome: MergeOutcome, took: Duration) {
        self.merges[outcome as usize].fetch_add(1, Ordering::Relaxed);
        self.merge_seconds.observe(took);
    }

    /// Level merges so far with `outcome`.
    pub fn merges(&self, outcome: MergeOutcome) -> u64 {
        self.merges[outcome as usize].load(Ordering::Relaxed)
    }

    /// Counts one run of the gate `name`.
    pub fn gate(&self, name: &str, passed: bool, took: Duration) {
        self.gate_seconds.observe(took);
        let mut g = self.gates.lock().unwrap_or_else(|e| e.into_inner());
        // Gate names come from the projects' configs: a bounded set, but not a fixed one.
        if !g.contains_key(name) && g.len() >= 256 {
            return;
        }
        let e = g.entry(name.to_string()).or_default();
        if passed {
            e.0 += 1;
        } else {
            e.1 += 1;
        }
    }

    /// Runs per gate name: (passed, failed).
    pub fn gates(&self) -> BTreeMap<String, (u64, u64)> {
        self.gates.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Counts a rush that began holding new work for a usage limit.
    pub fn usage_limit_hold(&self) {
        self.usage_limit_holds.fetch_add(1, Ordering::Relaxed);
    }

    /// Usage-limit holds so far.
    pub fn usage_limit_holds(&self) -> u64 {
        self.usage_limit_holds.load(Ordering::Relaxed)
    }

    /// A worker-plane connection was accepted.
    pub fn plane_opened(&self) {
        self.plane_connections.fetch_add(1, Ordering::Relaxed);
        self.plane_connections_total.fetch_add(1, Ordering::Relaxed);
    }

    /// A worker-plane connection closed.
    pub fn plane_closed(&self) {
        self.plane_connections.fetch_sub(1, Ordering::Relaxed);
    }

    /// Counts an attempt leased with `model` (`agent.models`).
    pub fn attempt_on(&self, model: &str) {
        let mut m = self
            .attempts_by_model
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // Model names come from the projects' configs: a bounded set, but not a fixed one.
        if !m.contains_key(model) && m.len() >= 256 {
            return;
        }
        *m.entry(model.to_string()).or_default() += 1;
    }

    /// Attempts leased per model.
    pub fn attempts_by_model(&self) -> BTreeMap<String, u64> {
        self.attempts_by_model
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Counts a confined worker's connection that the egress proxy refused.
    pub fn egress_refused(&self) {
        self.egress_refused.fetch_add(1, Ordering::Relaxed);
    }

    /// Egress connections refused so far.
    pub fn egress_refusals(&self) -> u64 {
        self.egress_refused.load(Ordering::Relaxed)
    }

    /// Worker-plane connections open now, and accepted in all.
    pub fn plane_connections(&self) -> (u64, u64) {
        (
            self.plane_connections.load(Ordering::Relaxed).max(0) as u64,
            self.plane_connections_total.load(Ordering::Relaxed),
        )
    }
}

/// The process's counters.
pub static METRICS: std::sync::LazyLock<Metrics> = std::sync::LazyLock::new(Metrics::default);

/// zergd's resident memory (bytes), from `/proc/self/statm`; `None` where there is no procfs.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .unwrap_or(4096) as u64;
    Some(pages * page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_counts_cumulatively() {
        let h = Histogram::default();
        h.observe(Duration::from_millis(30));
        h.observe(Duration::from_secs(2));
        h.observe(Duration::from_secs(1000));
        let (b, count, sum) = h.read();
        assert_eq!(count, 3);
        assert!((sum - 1002.03).abs() < 1e-6, "{sum}");
        assert_eq!(b[0], 0, "≤ 10 ms");
        assert_eq!(b[1], 1, "≤ 50 ms");
        assert_eq!(b[5], 1, "≤ 1 s");
        assert_eq!(b[6], 2, "≤ 2.5 s");
        assert_eq!(
            b[11], 2,
            "≤ 300 s; the 1000 s one is only in +Inf (the count)"
        );
    }

    #[test]
    fn gates_are_counted_by_name_and_outcome() {
        let m = Metrics::default();
        m.gate("test", true, Duration::from_millis(5));
        m.gate("test", false, Duration::from_millis(5));
        m.gate("lint", true, Duration::from_millis(5));
        assert_eq!(m.gates().get("test"), Some(&(1, 1)));
        assert_eq!(m.gates().get("lint"), Some(&(1, 0)));
        assert_eq!(m.gate_seconds.read().1, 3);
    }
}
