//! `/metrics`: zergd's figures in the Prometheus text format (version 0.0.4).
//!
//! Per rush (labelled `rush_id` and `feature`), for every rush that has not ended: tasks and
//! workers by state, attempts, crashes, the resilience loops' counts, cost and tokens by model,
//! whether a usage limit holds it, and its open escalations. They are read from the rush's
//! status as `zergctl status` shows it, so the two always agree. An ended rush counts only in
//! `zerg_rushes`: its status is on disk, and a scrape does not load it.
//!
//! Process-wide ([`crate::metrics::METRICS`]): level merges by outcome and their durations,
//! quality-gate runs and their durations, usage-limit holds, worker-plane connections, and
//! zergd's resident memory.

use std::fmt::Write as _;

use zerg_proto::v1::control_server::Control;
use zerg_proto::{WireName, v1};

use crate::calls::RushKey;
use crate::metrics::{BUCKETS, Histogram, METRICS, MergeOutcome, resident_bytes};
use crate::server::Services;

/// Whether a rush in this state has ended (complete, failed or stopped).
pub fn ended(state: i32) -> bool {
    matches!(
        v1::RushState::try_from(state),
        Ok(v1::RushState::Complete | v1::RushState::Failed | v1::RushState::Stopped)
    )
}

/// One metric family: its samples are written together under one `# HELP` and `# TYPE`.
struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    samples: Vec<(String, String)>,
}

#[derive(Default)]
struct Exposition(Vec<Family>);

/// A label value with `\`, `"` and newlines escaped.
fn escape(v: &str) -> String {
    v.replace('\\', r"\\")
        .replace('"', r#"\""#)
        .replace('\n', r"\n")
}

fn labels(pairs: &[(&str, &str)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

/// A sample value: integers as integers, the rest as Rust prints an f64 (which Prometheus
/// reads).
fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

impl Exposition {
    fn family(
        &mut self,
        name: &'static str,
        kind: &'static str,
        help: &'static str,
    ) -> &mut Family {
        let i = match self.0.iter().position(|f| f.name == name) {
            Some(i) => i,
            None => {
                self.0.push(Family {
                    name,
                    help,
                    kind,
                    samples: Vec::new(),
                });
                self.0.len() - 1
            }
        };
        &mut self.0[i]
    }

    fn add(
        &mut self,
        name: &'static str,
        kind: &'static str,
        help: &'static str,
        pairs: &[(&str, &str)],
        v: f64,
    ) {
        let f = self.family(name, kind, help);
        f.samples
            .push((format!("{name}{}", labels(pairs)), number(v)));
    }

    fn gauge(&mut self, name: &'static str, help: &'static str, pairs: &[(&str, &str)], v: f64) {
        self.add(name, "gauge", help, pairs, v);
    }

    fn counter(&mut self, name: &'static str, help: &'static str, pairs: &[(&str, &str)], v: f64) {
        self.add(name, "counter", help, pairs, v);
    }

    fn histogram(&mut self, name: &'static str, help: &'static str, h: &Histogram) {
        let (buckets, count, sum) = h.read();
        let f = self.family(name, "histogram", help);
        for (bound, n) in BUCKETS.iter().zip(buckets) {
            f.samples
                .push((format!("{name}_bucket{{le=\"{bound}\"}}"), n.to_string()));
        }
        f.samples
            .push((format!("{name}_bucket{{le=\"+Inf\"}}"), count.to_string()));
        f.samples.push((format!("{name}_sum"), number(sum)));
        f.samples.push((format!("{name}_count"), count.to_string()));
    }

    fn text(&self) -> String {
        let mut out = String::new();
        for f in &self.0 {
            let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
            let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
            for (series, v) in &f.samples {
                let _ = writeln!(out, "{series} {v}");
            }
        }
        out
    }
}

/// The exposition of every figure, as of now.
pub async fn render(services: &Services) -> String {
    let mut m = Exposition::default();
    m.gauge(
        "zerg_build_info",
        "zergd's version, as a label; always 1.",
        &[("version", env!("CARGO_PKG_VERSION"))],
        1.0,
    );
    let list = services
        .list(tonic::Request::new(v1::ListRequest {}))
        .await
        .map(|r| r.into_inner().rushes)
        .unwrap_or_default();
    for state in [
        v1::RushState::Pending,
        v1::RushState::Running,
        v1::RushState::Paused,
        v1::RushState::Complete,
        v1::RushState::Failed,
        v1::RushState::Stopped,
    ] {
        let n = list.iter().filter(|r| r.state == state as i32).count();
        m.gauge(
            "zerg_rushes",
            "Rushes this zergd knows of, by state.",
            &[("state", &state.name())],
            n as f64,
        );
    }
    for r in list.iter().filter(|r| !ended(r.state)) {
        let key = RushKey::registered(r.repo.clone(), r.feature.clone());
        if let Ok(s) = services.rush_status(key).await {
            rush(&mut m, &s);
        }
    }
    process(&mut m);
    m.text()
}

/// One rush's figures, from its status.
fn rush(m: &mut Exposition, s: &v1::RushStatus) {
    let id = [
        ("rush_id", s.rush_id.as_str()),
        ("feature", s.feature.as_str()),
    ];
    let with = |k: &'static str, v: &str| -> Vec<(&'static str, String)> {
        vec![
            ("rush_id", s.rush_id.clone()),
            ("feature", s.feature.clone()),
            (k, v.to_string()),
        ]
    };
    let add = |m: &mut Exposition,
               name: &'static str,
               kind: &'static str,
               help: &'static str,
               pairs: Vec<(&'static str, String)>,
               v: f64| {
        let p: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        m.add(name, kind, help, &p, v);
    };
    for state in [
        v1::TaskState::Pending,
        v1::TaskState::InProgress,
        v1::TaskState::WaitingRetry,
        v1::TaskState::Complete,
        v1::TaskState::Failed,
        v1::TaskState::Blocked,
        v1::TaskState::Paused,
    ] {
        let n = s
            .tasks
            .values()
            .filter(|t| t.status == state as i32)
            .count();
        add(
            m,
            "zerg_tasks",
            "gauge",
            "Tasks of a rush, by state.",
            with("state", &state.name()),
            n as f64,
        );
    }
    let attempts: u64 = s.tasks.values().map(|t| u64::from(t.attempts)).sum();
    let crashes: u64 = s.tasks.values().map(|t| u64::from(t.crashes)).sum();
    m.counter(
        "zerg_task_attempts_total",
        "Attempts started over every task of a rush.",
        &id,
        attempts as f64,
    );
    m.counter(
        "zerg_task_crashes_total",
        "Attempts that ended with their worker crashing.",
        &id,
        crashes as f64,
    );
    for state in [
        v1::WorkerState::Starting,
        v1::WorkerState::Ready,
        v1::WorkerState::Running,
        v1::WorkerState::Stale,
        v1::WorkerState::Backoff,
        v1::WorkerState::Stopping,
        v1::WorkerState::Exited,
        v1::WorkerState::GaveUp,
        v1::WorkerState::Blocked,
        v1::WorkerState::Done,
    ] {
        let n = s
            .workers
            .values()
            .filter(|w| w.status == state as i32)
            .count();
        add(
            m,
            "zerg_workers",
            "gauge",
            "Workers of a rush, by state.",
            with("state", &state.name()),
            n as f64,
        );
    }
    let r = s.resilience.unwrap_or_default();
    for (name, help, v) in [
        (
            "zerg_worker_respawns_total",
            "Workers started again after they exited or crashed.",
            r.worker_respawns,
        ),
        (
            "zerg_spawn_retries_total",
            "Worker starts that failed and were tried again.",
            r.spawn_retries,
        ),
        (
            "zerg_stale_detections_total",
            "Tasks whose worker stopped heartbeating and was counted stale.",
            r.stale_detections,
        ),
        (
            "zerg_task_reassignments_total",
            "Tasks given back to the queue after their worker crashed or went stale.",
            r.task_reassignments,
        ),
        (
            "zerg_reconcile_fixes_total",
            "Differences between the state and the world that reconciliation repaired.",
            r.reconcile_fixes,
        ),
    ] {
        m.counter(name, help, &id, v as f64);
    }
    m.gauge(
        "zerg_rush_level",
        "The level a rush is running.",
        &id,
        f64::from(s.current_level),
    );
    m.gauge(
        "zerg_rush_levels",
        "The levels of a rush's graph.",
        &id,
        f64::from(s.total_levels),
    );
    m.gauge(
        "zerg_usage_limit_held",
        "1 while a usage limit of the agent holds a rush's new work back.",
        &id,
        if s.rate_limited_until.is_empty() {
            0.0
        } else {
            1.0
        },
    );
    m.gauge(
        "zerg_escalations_open",
        "Escalations of a rush that no one has resolved.",
        &id,
        s.escalations.iter().filter(|e| !e.resolved).count() as f64,
    );
    let mut models: Vec<(&String, &v1::ModelUsage)> = s.models.iter().collect();
    models.sort_by_key(|(k, _)| k.as_str());
    for (model, u) in models {
        let base = with("model", model);
        add(
            m,
            "zerg_cost_usd_total",
            "counter",
            "Agent cost in US dollars, as the agent CLI reported it, by model.",
            base.clone(),
            u.cost_usd,
        );
        let t = u.tokens.unwrap_or_default();
        for (kind, n) in [
            ("input", t.input_tokens),
            ("output", t.output_tokens),
            ("cache_read", t.cache_read_tokens),
            ("cache_creation", t.cache_creation_tokens),
        ] {
            let mut p = base.clone();
            p.push(("kind", kind.to_string()));
            add(
                m,
                "zerg_tokens_total",
                "counter",
                "Tokens the agent CLI reported, by model and kind.",
                p,
                n as f64,
            );
        }
    }
}

/// zergd's own figures.
fn process(m: &mut Exposition) {
    for outcome in MergeOutcome::ALL {
        m.counter(
            "zerg_level_merges_total",
            "Level merges, by how they ended.",
            &[("outcome", outcome.name())],
            METRICS.merges(outcome) as f64,
        );
    }
    m.histogram(
        "zerg_level_merge_duration_seconds",
        "How long level merges took: the merge, the quality gates and moving the branches.",
        &METRICS.merge_seconds,
    );
    for (gate, (passed, failed)) in METRICS.gates() {
        for (outcome, n) in [("passed", passed), ("failed", failed)] {
            m.counter(
                "zerg_gate_runs_total",
                "Quality-gate runs after level merges, by gate and outcome.",
                &[("gate", &gate), ("outcome", outcome)],
                n as f64,
            );
        }
    }
    for (model, n) in METRICS.attempts_by_model() {
        m.counter(
            "zerg_task_attempts_by_model_total",
            "Task attempts leased with a model from agent.models, by model.",
            &[("model", &model)],
            n as f64,
        );
    }
    m.histogram(
        "zerg_gate_duration_seconds",
        "How long quality-gate runs took, whatever their outcome.",
        &METRICS.gate_seconds,
    );
    m.counter(
        "zerg_usage_limit_holds_total",
        "Times a rush began holding new work because the agent hit a usage limit.",
        &[],
        METRICS.usage_limit_holds() as f64,
    );
    m.counter(
        "zerg_egress_refused_total",
        "Connections of confined workers that the egress proxy refused (host not in sandbox.allow_hosts).",
        &[],
        METRICS.egress_refusals() as f64,
    );
    let (open, accepted) = METRICS.plane_connections();
    m.gauge(
        "zerg_worker_plane_connections",
        "Connections of workers to zergd's worker plane, open now.",
        &[],
        open as f64,
    );
    m.counter(
        "zerg_worker_plane_connections_accepted_total",
        "Connections of workers to zergd's worker plane, accepted in all.",
        &[],
        accepted as f64,
    );
    if let Some(rss) = resident_bytes() {
        m.gauge(
            "process_resident_memory_bytes",
            "zergd's resident memory.",
            &[],
            rss as f64,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_grouped_and_labels_escaped() {
        let mut m = Exposition::default();
        m.gauge("a", "A.", &[("x", "1")], 1.0);
        m.counter("b_total", "B.", &[], 2.5);
        m.gauge("a", "A.", &[("x", "q\"\\\nz")], 3.0);
        let t = m.text();
        assert_eq!(
            t,
            "# HELP a A.\n# TYPE a gauge\na{x=\"1\"} 1\na{x=\"q\\\"\\\\\\nz\"} 3\n# HELP b_total B.\n# TYPE b_total counter\nb_total 2.5\n"
        );
    }

    #[test]
    fn a_rush_counts_its_tasks_by_state() {
        let mut s = v1::RushStatus {
            rush_id: "r1".into(),
            feature: "f".into(),
            ..Default::default()
        };
        for (id, st, attempts) in [
            ("A", v1::TaskState::Complete, 1),
            ("B", v1::TaskState::Complete, 2),
            ("C", v1::TaskState::Failed, 3),
        ] {
            s.tasks.insert(
                id.into(),
                v1::TaskStatus {
                    status: st as i32,
                    attempts,
                    ..Default::default()
                },
            );
        }
        let mut m = Exposition::default();
        rush(&mut m, &s);
        let t = m.text();
        assert!(
            t.contains("zerg_tasks{rush_id=\"r1\",feature=\"f\",state=\"complete\"} 2\n"),
            "{t}"
        );
        assert!(
            t.contains("zerg_tasks{rush_id=\"r1\",feature=\"f\",state=\"failed\"} 1\n"),
            "{t}"
        );
        assert!(
            t.contains("zerg_task_attempts_total{rush_id=\"r1\",feature=\"f\"} 6\n"),
            "{t}"
        );
        assert_eq!(t.matches("# TYPE zerg_tasks gauge").count(), 1);
    }
}
