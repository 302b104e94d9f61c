//! The JSON that `zergctl status --json` and `zergctl list --json` print: serde structs of their
//! own, built from the wire messages, so that a change to the protocol cannot silently change
//! the CLI's output. Maps are sorted by key, so the output is stable.
//!
//! The keys are documented in the README and docs/state-format.md; the end-to-end test
//! `status_json_has_the_documented_keys` holds them.

use std::collections::BTreeMap;

use serde::Serialize;
use zerg_proto::WireName;
use zerg_proto::v1;

/// `zergctl status --json`.
#[derive(Debug, Serialize)]
pub struct Status {
    /// Rush id.
    pub rush_id: String,
    /// Repository root.
    pub repo: String,
    /// Feature.
    pub feature: String,
    /// pending, running, paused, complete, failed or stopped.
    pub state: String,
    /// Level being executed.
    pub current_level: u32,
    /// Number of levels.
    pub total_levels: u32,
    /// subprocess, container, swarm or kubernetes.
    pub mode: String,
    /// Tasks by id.
    pub tasks: BTreeMap<String, Task>,
    /// Worker slots by number.
    pub workers: BTreeMap<String, Worker>,
    /// Levels by number.
    pub levels: BTreeMap<String, Level>,
    /// Why the rush is paused, failed or stopped.
    pub reason: String,
    /// Unresolved escalations.
    pub escalations: Vec<Escalation>,
    /// Config and graph warnings.
    pub warnings: Vec<String>,
    /// Resilience counters.
    pub resilience: Option<Resilience>,
    /// Until when new work is held back (usage limit), if it is.
    pub rate_limited_until: String,
    /// When the rush started.
    pub started_at: String,
    /// When it ended.
    pub finished_at: String,
    /// The result branch.
    pub staging_branch: String,
    /// The branch the rush started from.
    pub base_branch: String,
    /// Per-task summary lines of the end-of-rush report.
    pub report: Vec<String>,
    /// Agent cost of the rush so far (USD).
    pub cost_usd: f64,
    /// Which usage limit holds new work (`five_hour`, …), empty if none or not named.
    pub rate_limit_type: String,
    /// Tokens of the rush so far.
    pub tokens: Tokens,
    /// Tokens and cost per model.
    pub models: BTreeMap<String, ModelUsage>,
    /// The rush's budget (USD), 0 for none.
    pub max_usd: f64,
    /// What the rush uses on disk, when measured (`status`; the live view does not).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk: Option<Disk>,
    /// How the workers are confined (subprocess mode), with the policy of the last spawned one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Sandbox>,
}

/// A rush's sandbox.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Sandbox {
    /// `sandbox.mode`: auto, strict or off.
    pub mode: String,
    /// Whether the workers run confined.
    pub confined: bool,
    /// What is in effect, in one line.
    pub summary: String,
    /// Paths inside a worker may write.
    pub read_write: Vec<String>,
    /// Paths inside a worker may read and run.
    pub read_only: Vec<String>,
    /// What is kept out on purpose.
    pub hidden: Vec<String>,
    /// Hosts the egress proxy lets through.
    pub allow_hosts: Vec<String>,
    /// Hosts only `worktree.setup` commands may reach as well.
    pub setup_allow_hosts: Vec<String>,
    /// Connections the egress proxy refused.
    pub egress_refused: u64,
}

/// What a rush uses on disk, in bytes.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Disk {
    /// State file, journal, backups, events file and spec snapshot.
    pub state_bytes: u64,
    /// Worker and staging worktrees.
    pub worktree_bytes: u64,
    /// The repository's logs, shared by its rushes.
    pub log_bytes: u64,
}

/// Tokens, as the agent CLI reported them.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Tokens {
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read_tokens: u64,
    /// Input tokens written to the prompt cache.
    pub cache_creation_tokens: u64,
}

impl Tokens {
    /// Whether every count is 0.
    pub fn is_zero(&self) -> bool {
        self.input_tokens == 0
            && self.output_tokens == 0
            && self.cache_read_tokens == 0
            && self.cache_creation_tokens == 0
    }
}

impl From<Option<&v1::Tokens>> for Tokens {
    fn from(t: Option<&v1::Tokens>) -> Self {
        let t = t.cloned().unwrap_or_default();
        Tokens {
            input_tokens: t.input_tokens,
            output_tokens: t.output_tokens,
            cache_read_tokens: t.cache_read_tokens,
            cache_creation_tokens: t.cache_creation_tokens,
        }
    }
}

/// One model's tokens and cost in [`Status`].
#[derive(Debug, Serialize)]
pub struct ModelUsage {
    /// Tokens.
    #[serde(flatten)]
    pub tokens: Tokens,
    /// Cost (USD).
    pub cost_usd: f64,
}

/// One task in [`Status`].
#[derive(Debug, Serialize)]
pub struct Task {
    /// pending, in_progress, waiting_retry, complete, failed, blocked or paused.
    pub status: String,
    /// Level.
    pub level: u32,
    /// Worker holding or last holding it.
    pub worker_id: Option<u32>,
    /// Attempts so far.
    pub attempts: u32,
    /// Last error.
    pub error: String,
    /// Title.
    pub title: String,
    /// Accepted commit.
    pub commit: String,
    /// Files changed outside its ownership.
    pub out_of_scope: Vec<String>,
    /// Failed tasks it waits on.
    pub blocked_by: Vec<String>,
    /// Worker crashes while it was held.
    pub crashes: u32,
    /// When a waiting retry is due.
    pub next_retry_at: String,
    /// Agent cost over all attempts (USD).
    pub cost_usd: f64,
    /// When the current or last attempt started (RFC 3339), empty if never.
    pub started_at: String,
    /// How long the completed attempt took (ms), 0 until complete.
    pub duration_ms: u64,
    /// Tokens over all attempts.
    pub tokens: Tokens,
    /// The model of each attempt (`agent.models`), first attempt first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub attempt_models: Vec<String>,
    /// The user's notes (`zergctl note`), oldest first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// One worker slot in [`Status`].
#[derive(Debug, Serialize)]
pub struct Worker {
    /// The slot's state.
    pub status: String,
    /// Task being run.
    pub current_task: String,
    /// Last heartbeat.
    pub last_heartbeat: String,
    /// Step from the last heartbeat.
    pub step: String,
    /// Progress from the last heartbeat.
    pub progress_pct: u32,
    /// Process id.
    pub pid: Option<i32>,
    /// Container id.
    pub container_id: String,
    /// Respawns.
    pub respawns: u32,
    /// Consecutive spawn failures.
    pub spawn_failures: u32,
    /// Last exit and its meaning.
    pub last_exit: String,
    /// Why it is in its state.
    pub reason: String,
    /// Tasks completed.
    pub tasks_completed: u32,
    /// Its branch.
    pub branch: String,
    /// What the agent CLI is doing within the step (`API retry 3/10: overloaded`).
    pub detail: String,
}

/// One level in [`Status`].
#[derive(Debug, Serialize)]
pub struct Level {
    /// pending, running, complete or failed.
    pub status: String,
    /// pending, merging, complete, conflict or failed.
    pub merge_status: String,
    /// The staging commit of its merge.
    pub merge_commit: String,
    /// Conflicting paths.
    pub conflicts: Vec<String>,
    /// Tasks in the level.
    pub tasks: u32,
    /// Of which complete.
    pub complete: u32,
}

/// One escalation in [`Status`].
#[derive(Debug, Serialize)]
pub struct Escalation {
    /// Worker.
    pub worker_id: u32,
    /// Task.
    pub task_id: String,
    /// Category.
    pub category: String,
    /// Message.
    pub message: String,
    /// When.
    pub timestamp: String,
    /// Resolved (never set by zerg).
    pub resolved: bool,
    /// The agent's context object, as JSON text.
    pub context_json: String,
}

/// Resilience counters in [`Status`].
#[derive(Debug, Serialize)]
pub struct Resilience {
    /// Spawn attempts retried.
    pub spawn_retries: u64,
    /// Stale workers and tasks detected.
    pub stale_detections: u64,
    /// Tasks moved from one worker to another.
    pub task_reassignments: u64,
    /// Workers respawned.
    pub worker_respawns: u64,
    /// Divergences fixed by reconciliation.
    pub reconcile_fixes: u64,
}

/// One rush in `zergctl list --json`.
#[derive(Debug, Serialize)]
pub struct Summary {
    /// Rush id.
    pub rush_id: String,
    /// Repository root.
    pub repo: String,
    /// Feature.
    pub feature: String,
    /// State.
    pub state: String,
    /// Tasks in the graph.
    pub tasks_total: u32,
    /// Of which complete.
    pub tasks_complete: u32,
    /// When it started.
    pub started_at: String,
}

impl From<&v1::RushStatus> for Status {
    fn from(s: &v1::RushStatus) -> Self {
        Status {
            rush_id: s.rush_id.clone(),
            repo: s.repo.clone(),
            feature: s.feature.clone(),
            state: s.state().name(),
            current_level: s.current_level,
            total_levels: s.total_levels,
            mode: s.mode().name(),
            tasks: s
                .tasks
                .iter()
                .map(|(k, t)| (k.clone(), Task::from(t)))
                .collect(),
            workers: s
                .workers
                .iter()
                .map(|(k, w)| (k.clone(), Worker::from(w)))
                .collect(),
            levels: s
                .levels
                .iter()
                .map(|(k, l)| (k.clone(), Level::from(l)))
                .collect(),
            reason: s.reason.clone(),
            escalations: s.escalations.iter().map(Escalation::from).collect(),
            warnings: s.warnings.clone(),
            resilience: s.resilience.as_ref().map(|r| Resilience {
                spawn_retries: r.spawn_retries,
                stale_detections: r.stale_detections,
                task_reassignments: r.task_reassignments,
                worker_respawns: r.worker_respawns,
                reconcile_fixes: r.reconcile_fixes,
            }),
            rate_limited_until: s.rate_limited_until.clone(),
            started_at: s.started_at.clone(),
            finished_at: s.finished_at.clone(),
            staging_branch: s.staging_branch.clone(),
            base_branch: s.base_branch.clone(),
            report: s.report.clone(),
            cost_usd: s.cost_usd,
            rate_limit_type: s.rate_limit_type.clone(),
            tokens: Tokens::from(s.tokens.as_ref()),
            models: s
                .models
                .iter()
                .map(|(m, u)| {
                    (
                        m.clone(),
                        ModelUsage {
                            tokens: Tokens::from(u.tokens.as_ref()),
                            cost_usd: u.cost_usd,
                        },
                    )
                })
                .collect(),
            max_usd: s.max_usd,
            disk: s.disk.as_ref().map(|d| Disk {
                state_bytes: d.state_bytes,
                worktree_bytes: d.worktree_bytes,
                log_bytes: d.log_bytes,
            }),
            sandbox: s
                .sandbox
                .as_ref()
                .filter(|_| s.mode() == v1::LaunchMode::Subprocess)
                .map(|b| Sandbox {
                    mode: b.mode.clone(),
                    confined: b.confined,
                    summary: b.summary.clone(),
                    read_write: b.read_write.clone(),
                    read_only: b.read_only.clone(),
                    hidden: b.hidden.clone(),
                    allow_hosts: b.allow_hosts.clone(),
                    setup_allow_hosts: b.setup_allow_hosts.clone(),
                    egress_refused: b.egress_refused,
                }),
        }
    }
}

impl From<&v1::TaskStatus> for Task {
    fn from(t: &v1::TaskStatus) -> Self {
        Task {
            status: t.status().name(),
            level: t.level,
            worker_id: t.worker_id,
            attempts: t.attempts,
            error: t.error.clone(),
            title: t.title.clone(),
            commit: t.commit.clone(),
            out_of_scope: t.out_of_scope.clone(),
            blocked_by: t.blocked_by.clone(),
            crashes: t.crashes,
            next_retry_at: t.next_retry_at.clone(),
            cost_usd: t.cost_usd,
            started_at: t.started_at.clone(),
            duration_ms: t.duration_ms,
            tokens: Tokens::from(t.tokens.as_ref()),
            attempt_models: t.attempt_models.clone(),
            notes: t.notes.clone(),
        }
    }
}

impl From<&v1::WorkerStatus> for Worker {
    fn from(w: &v1::WorkerStatus) -> Self {
        Worker {
            status: w.status().name(),
            current_task: w.current_task.clone(),
            last_heartbeat: w.last_heartbeat.clone(),
            step: w.step().name(),
            progress_pct: w.progress_pct,
            pid: w.pid,
            container_id: w.container_id.clone(),
            respawns: w.respawns,
            spawn_failures: w.spawn_failures,
            last_exit: w.last_exit.clone(),
            reason: w.reason.clone(),
            tasks_completed: w.tasks_completed,
            branch: w.branch.clone(),
            detail: w.detail.clone(),
        }
    }
}

impl From<&v1::LevelStatus> for Level {
    fn from(l: &v1::LevelStatus) -> Self {
        Level {
            status: l.status().name(),
            merge_status: l.merge_status().name(),
            merge_commit: l.merge_commit.clone(),
            conflicts: l.conflicts.clone(),
            tasks: l.tasks,
            complete: l.complete,
        }
    }
}

impl From<&v1::Escalation> for Escalation {
    fn from(e: &v1::Escalation) -> Self {
        Escalation {
            worker_id: e.worker_id,
            task_id: e.task_id.clone(),
            category: e.category.clone(),
            message: e.message.clone(),
            timestamp: e.timestamp.clone(),
            resolved: e.resolved,
            context_json: e.context_json.clone(),
        }
    }
}

impl From<&v1::RushSummary> for Summary {
    fn from(r: &v1::RushSummary) -> Self {
        Summary {
            rush_id: r.rush_id.clone(),
            repo: r.repo.clone(),
            feature: r.feature.clone(),
            state: r.state().name(),
            tasks_total: r.tasks_total,
            tasks_complete: r.tasks_complete,
            started_at: r.started_at.clone(),
        }
    }
}
