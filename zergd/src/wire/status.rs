//! The `RushStatus`, `RushSummary` and `WatchEvent` messages, projected from what the
//! supervisor hands out (a rush's view, its registry entry, its event lines).

use tokio::sync::mpsc;
use zerg_proto::v1;

use std::collections::BTreeMap;

use crate::calls::{Escalation, RushView, WatchSink};
use crate::domain::staging_branch;
use crate::domain::{RushState, TaskStatus};
use crate::monitor::{Level, MonitorEvent};
use crate::state::{ModelSpend, RegistryEntry, Tokens};
use crate::wire;

/// A rush's sandbox: the line, and the last spawned worker's policy as paths inside.
fn sandbox(s: &crate::calls::SandboxView) -> v1::Sandbox {
    let paths = |b: &[zerg_sandbox::Bind]| -> Vec<String> {
        b.iter().map(|b| b.to.display().to_string()).collect()
    };
    let p = s.policy.as_ref();
    let mut read_write = p.map(|p| paths(&p.read_write)).unwrap_or_default();
    if p.is_some() {
        read_write.push("/tmp (private)".into());
    }
    v1::Sandbox {
        mode: s.mode.to_string(),
        confined: s.enforcement.confined(),
        summary: s.enforcement.summary(),
        read_write,
        read_only: p.map(|p| paths(&p.read_only)).unwrap_or_default(),
        hidden: p
            .map(|p| p.hidden.iter().map(|h| h.display().to_string()).collect())
            .unwrap_or_default(),
        allow_hosts: if s.enforcement.confined() {
            s.allow_hosts.clone()
        } else {
            Vec::new()
        },
        setup_allow_hosts: s.setup_allow_hosts.clone(),
        egress_refused: s.egress_refused,
    }
}

/// The full status of a rush.
pub fn rush_status(rush: &RushView<'_>) -> v1::RushStatus {
    let d = rush.doc;
    let tasks = d
        .tasks
        .iter()
        .map(|(id, t)| {
            (
                id.clone(),
                v1::TaskStatus {
                    status: wire::state::<v1::TaskState>(t.status),
                    level: t.level.unwrap_or(0),
                    worker_id: t.worker_id,
                    attempts: t.retry_count
                        + u32::from(
                            t.status == TaskStatus::InProgress || t.status == TaskStatus::Complete,
                        ),
                    error: t.error.clone().unwrap_or_default(),
                    title: t.title.clone(),
                    commit: t.commit.clone().unwrap_or_default(),
                    out_of_scope: t.out_of_scope.clone(),
                    blocked_by: t.blocked_by.clone(),
                    crashes: t.crashes,
                    next_retry_at: t.next_retry_at.clone().unwrap_or_default(),
                    cost_usd: t.cost_usd,
                    started_at: t.started_at.clone().unwrap_or_default(),
                    duration_ms: t.duration_ms.unwrap_or(0),
                    tokens: Some(tokens(&t.tokens)),
                    attempt_models: t.attempt_models.clone(),
                    notes: t.notes.iter().map(|n| n.text.clone()).collect(),
                },
            )
        })
        .collect();
    let workers = d
        .workers
        .iter()
        .map(|(id, w)| {
            (
                id.clone(),
                v1::WorkerStatus {
                    status: wire::state::<v1::WorkerState>(w.status),
                    current_task: w.current_task.clone().unwrap_or_default(),
                    last_heartbeat: w.health_check_at.clone().unwrap_or_default(),
                    step: w.step.map(|s| wire::step_to_wire(s) as i32).unwrap_or(0),
                    progress_pct: w.progress_pct,
                    pid: w.pid,
                    container_id: w.container_id.clone().unwrap_or_default(),
                    respawns: w.respawns,
                    spawn_failures: w.spawn_failures,
                    last_exit: w.last_exit.clone().unwrap_or_default(),
                    reason: w.reason.clone().unwrap_or_default(),
                    tasks_completed: w.tasks_completed,
                    branch: w.branch.clone(),
                    detail: w.detail.clone().unwrap_or_default(),
                },
            )
        })
        .collect();
    let levels = rush
        .levels
        .iter()
        .map(|(l, ts)| {
            let ls = d.levels.get(&l.to_string()).cloned().unwrap_or_default();
            (
                l.to_string(),
                v1::LevelStatus {
                    status: wire::state::<v1::LevelState>(ls.status),
                    merge_status: wire::state::<v1::MergeState>(ls.merge_status),
                    merge_commit: ls.merge_commit.unwrap_or_default(),
                    conflicts: ls.conflicts,
                    tasks: ts.len() as u32,
                    complete: ts
                        .iter()
                        .filter(|t| {
                            d.tasks
                                .get(**t)
                                .is_some_and(|x| x.status == TaskStatus::Complete)
                        })
                        .count() as u32,
                },
            )
        })
        .collect();
    let r = &d.rush.resilience;
    let rate_limited_until = if d.rush.rate_limited_until_ms > 0 {
        crate::clock::iso_millis(crate::clock::from_unix_millis(d.rush.rate_limited_until_ms))
    } else {
        String::new()
    };
    let mut total = Tokens::default();
    let mut models: BTreeMap<String, ModelSpend> = BTreeMap::new();
    for t in d.tasks.values() {
        total.add(&t.tokens);
        for (m, s) in &t.models {
            models.entry(m.clone()).or_default().add(s);
        }
    }
    let mut warnings = d.rush.warnings.clone();
    for (id, t) in &d.tasks {
        if !t.out_of_scope.is_empty() {
            warnings.push(format!(
                "task {id} changed files outside its ownership: {}",
                t.out_of_scope.join(", ")
            ));
        }
    }
    let report = if rush.ended && d.rush.state != RushState::Complete {
        d.tasks
            .iter()
            .filter(|(_, t)| t.status != TaskStatus::Complete)
            .map(|(id, t)| format!("{id}: {} {}", t.status, t.error.clone().unwrap_or_default()))
            .collect()
    } else {
        vec![]
    };
    v1::RushStatus {
        rush_id: d.rush.rush_id.clone(),
        repo: d.rush.repo.clone(),
        feature: d.feature.clone(),
        state: wire::state::<v1::RushState>(d.rush.state),
        current_level: d.current_level,
        total_levels: rush.total_levels,
        mode: wire::state::<v1::LaunchMode>(d.rush.mode),
        tasks,
        workers,
        levels,
        reason: d.rush.reason.clone(),
        escalations: rush.escalations.iter().map(escalation).collect(),
        warnings,
        resilience: Some(v1::Resilience {
            spawn_retries: r.spawn_retries,
            stale_detections: r.stale_detections,
            task_reassignments: r.task_reassignments,
            worker_respawns: r.worker_respawns,
            reconcile_fixes: r.reconcile_fixes,
        }),
        rate_limited_until,
        started_at: d.started_at.clone(),
        finished_at: d.rush.finished_at.clone(),
        staging_branch: staging_branch(&d.feature),
        base_branch: d.rush.base_branch.clone(),
        report,
        cost_usd: d.tasks.values().map(|t| t.cost_usd).sum(),
        rate_limit_type: if d.rush.rate_limited_until_ms > 0 {
            d.rush.rate_limit_type.clone()
        } else {
            String::new()
        },
        tokens: Some(tokens(&total)),
        models: models
            .into_iter()
            .map(|(m, s)| {
                (
                    m,
                    v1::ModelUsage {
                        tokens: Some(tokens(&s.tokens)),
                        cost_usd: s.cost_usd,
                    },
                )
            })
            .collect(),
        max_usd: d.rush.max_usd.unwrap_or(0.0),
        // Measured by the `Status` handler, off the supervisor.
        disk: None,
        sandbox: Some(sandbox(&rush.sandbox)),
    }
}

fn tokens(t: &Tokens) -> v1::Tokens {
    v1::Tokens {
        input_tokens: t.input_tokens,
        output_tokens: t.output_tokens,
        cache_read_tokens: t.cache_read_tokens,
        cache_creation_tokens: t.cache_creation_tokens,
    }
}

/// What a rush uses on disk, as `status` sends it.
pub fn disk_usage(u: crate::disk::Usage) -> v1::DiskUsage {
    v1::DiskUsage {
        state_bytes: u.state_bytes,
        worktree_bytes: u.worktree_bytes,
        log_bytes: u.log_bytes,
    }
}

/// A rush's line in `List`, from its registry entry.
pub fn rush_summary(e: &RegistryEntry) -> v1::RushSummary {
    v1::RushSummary {
        rush_id: e.rush_id.clone(),
        repo: e.repo.clone(),
        feature: e.feature.clone(),
        state: wire::state::<v1::RushState>(e.state),
        tasks_total: e.summary.tasks_total,
        tasks_complete: e.summary.tasks_complete,
        started_at: e.summary.started_at.clone(),
    }
}

/// An escalation as the wire shows it.
pub fn escalation(e: &Escalation) -> v1::Escalation {
    v1::Escalation {
        worker_id: e.worker_id,
        task_id: e.task_id.clone(),
        category: e.category.clone(),
        message: e.message.clone(),
        timestamp: e.timestamp.clone(),
        resolved: false,
        context_json: e.context_json.clone(),
    }
}

/// One line of a rush's watch stream: a monitor event (if any) and, on the last line of a
/// batch, the new status.
pub fn watch_event(ev: Option<&MonitorEvent>, status: Option<v1::RushStatus>) -> v1::WatchEvent {
    v1::WatchEvent {
        status,
        message: ev.map(|e| e.message.clone()).unwrap_or_default(),
        event: ev.map(|e| e.kind.clone()).unwrap_or_default(),
        level: ev
            .map(|e| match e.level {
                Level::Info => v1::EventLevel::Info,
                Level::Warn => v1::EventLevel::Warn,
                Level::Error => v1::EventLevel::Error,
            })
            .unwrap_or(v1::EventLevel::Unspecified) as i32,
        ..Default::default()
    }
}

/// A `Watch` stream as a [`WatchSink`]: each update becomes one [`v1::WatchEvent`], projected
/// as it is sent; a stream that asked for deltas gets only what changed after its first status
/// ([`zerg_proto::watch::Delta`]).
pub struct WatchStream {
    tx: mpsc::Sender<Result<v1::WatchEvent, tonic::Status>>,
    delta: Option<zerg_proto::watch::Delta>,
}

impl WatchStream {
    /// A stream over `tx`, sending deltas when `deltas`.
    pub fn new(tx: mpsc::Sender<Result<v1::WatchEvent, tonic::Status>>, deltas: bool) -> Self {
        WatchStream {
            tx,
            delta: deltas.then(zerg_proto::watch::Delta::default),
        }
    }
}

impl WatchSink for WatchStream {
    fn send(&mut self, line: Option<&MonitorEvent>, view: Option<&RushView<'_>>) {
        let status = view.map(rush_status);
        let ev = match (&mut self.delta, status) {
            (Some(d), Some(s)) => d.event(s, watch_event(line, None)),
            (_, s) => watch_event(line, s),
        };
        let carried = ev.status.is_some();
        if self.tx.try_send(Ok(ev)).is_err()
            && carried
            && let Some(d) = &mut self.delta
        {
            // A client too slow to take it misses this one: the next status goes whole, so
            // that what it holds is right again.
            *d = zerg_proto::watch::Delta::default();
        }
    }

    fn drained(&self) -> bool {
        self.tx.capacity() == self.tx.max_capacity()
    }

    fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}
