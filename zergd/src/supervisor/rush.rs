//! One rush as a synchronous state machine.
//!
//! Every input (a worker RPC, a worker exit, a timer tick, a finished merge) is a method call
//! with the current time; outputs that need I/O (spawning, stopping, merging, replying after the
//! state is saved) are pushed into [`Effects`] for the actor shell to run. Nothing here blocks or
//! sleeps, which is what lets status answer while spawns are being retried, and what lets the
//! unit tests drive hours of timeouts with a fake clock.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use serde_json::json;
use tokio::sync::oneshot;
use tokio::time::Instant;
use tonic::Status;
use zerg_proto::graph::TaskGraph;
use zerg_proto::v1;

use crate::backoff::Backoff;
use crate::clock::{from_unix_millis, iso_millis, unix_millis};
use crate::config::{Config, secs};
use crate::domain::{
    FailKind, LevelStatus, MergeStatus, Mode, RushState, Step, TaskStatus, WorkerStatus,
};
use crate::launcher::{ExitInfo, SpawnError, Spawned};
use crate::monitor::{Level, Monitor, Source};
use crate::state::StateDoc;
use crate::worker_plane::{WorkerAuth, WorkerToken};
use zerg_proto::contract::{Revocation, WorkerExit};

/// Reply channel for a lease request.
pub type LeaseReplyTx = oneshot::Sender<Result<v1::LeaseReply, Status>>;

/// Side effects requested by the state machine.
#[derive(Default)]
pub struct Effects {
    /// Workers to start: (worker id, generation).
    pub spawn: Vec<(u32, u64)>,
    /// Workers to stop: (worker id, handle, grace).
    pub stop: Vec<(u32, Spawned, Duration)>,
    /// Workers to stop only if they have not exited by themselves within the delay (the end of
    /// a rush: parked workers were told there is no work left).
    pub drain: Vec<(u32, Spawned, Duration)>,
    /// A level merge to run.
    pub merge: Option<MergeJob>,
    /// Replies to send once the state is saved.
    pub replies: Vec<Box<dyn FnOnce() + Send>>,
    /// Worktrees to remove (the rush completed).
    pub cleanup: bool,
    /// Escalations to append to `escalations.json`.
    pub escalations: Vec<v1::Escalation>,
    /// The rush ended: once the stops and drains are done, remove whatever is left of its
    /// workers (containers, running or exited) up to these generations per slot.
    pub sweep: Option<BTreeMap<u32, u64>>,
}

impl Effects {
    /// Queues a reply to send after the state is persisted.
    pub fn reply<T: Send + 'static>(&mut self, tx: oneshot::Sender<T>, v: T) {
        self.replies.push(Box::new(move || {
            let _ = tx.send(v);
        }));
    }
}

/// A merge of every worker's accepted commits into staging, then quality gates.
#[derive(Debug, Clone)]
pub struct MergeJob {
    /// Level being merged.
    pub level: u32,
    /// (worker id, worktree, accepted head) per slot.
    pub heads: Vec<(u32, PathBuf, String)>,
    /// Staging worktree.
    pub staging: PathBuf,
}

/// Result of a [`MergeJob`].
#[derive(Debug, Clone)]
pub enum MergeResult {
    /// Staging now points at this commit.
    Merged(String),
    /// A worker's commits conflicted with staging.
    Conflict {
        /// Worker whose branch conflicted.
        worker: u32,
        /// Conflicting paths.
        files: Vec<String>,
    },
    /// A required quality gate failed.
    GateFailed {
        /// Gate name.
        gate: String,
        /// Output excerpt.
        output: String,
    },
    /// Git itself failed.
    Error(String),
}

/// Per-task runtime data that is not persisted.
#[derive(Debug, Clone)]
pub struct TaskRt {
    /// Last time the holder showed progress.
    pub last_progress: Instant,
    /// Last agent output time the holder reported (Unix ms).
    pub last_output_ms: i64,
    /// Last step the holder reported.
    pub last_step: String,
    /// When a waiting_retry task becomes pending.
    pub retry_due: Option<Instant>,
}

/// Per-worker runtime data that is not persisted.
#[derive(Default)]
pub struct WorkerRt {
    /// Handle of the running process or container.
    pub spawned: Option<Spawned>,
    /// Last heartbeat or registration.
    pub last_hb: Option<Instant>,
    /// When a spawn retry or respawn is due.
    pub spawn_due: Option<Instant>,
    /// When the current process was started (for the ready timeout).
    pub spawned_at: Option<Instant>,
    /// Whether the current process has registered.
    pub registered: bool,
    /// A parked lease request.
    pub parked: Option<LeaseReplyTx>,
    /// zergd asked this worker to stop; its exit is expected.
    pub stopping: bool,
    /// A respawn (as opposed to a first spawn) is pending.
    pub respawning: bool,
    /// Re-adopted after a zergd restart; must reconnect before this deadline.
    pub reconnect_by: Option<Instant>,
    /// The last generation whose exit was handled (an exit is handled once).
    pub handled_gen: u64,
    /// The current generation's token, handed to the launcher (never persisted).
    pub token: Option<WorkerToken>,
    /// Verification tiers of the slot's last reported attempt, for `progress-<id>.json`.
    pub tiers: Vec<serde_json::Value>,
}

/// What zergd checks about a reported commit before accepting it (see
/// [`crate::git::check_task_commit`]), gathered from the rush under the actor.
#[derive(Debug, Clone)]
pub struct CommitCheck {
    /// Repository root.
    pub repo: PathBuf,
    /// The worker slot.
    pub worker: u32,
    /// Its branch.
    pub branch: String,
    /// The commit the lease started from.
    pub base: String,
    /// The spec directory tasks must not change (`.gsd/specs/<feature>`).
    pub protected: String,
    /// Container mode: the worker's new objects must be imported first.
    pub container: bool,
    /// The feature (for checkpoint refs).
    pub feature: String,
    /// The task.
    pub task: String,
}

/// Where a rush keeps its files.
#[derive(Debug, Clone)]
pub struct RushPaths {
    /// Repository root.
    pub repo: PathBuf,
    /// `.zerg/state`.
    pub state_dir: PathBuf,
    /// `.zerg/logs`.
    pub log_dir: PathBuf,
    /// Spec snapshot.
    pub spec_dir: PathBuf,
    /// `.zerg-worktrees/<feature>`.
    pub worktrees: PathBuf,
}

impl RushPaths {
    /// Paths for a feature in a repository.
    pub fn new(repo: PathBuf, feature: &str) -> Self {
        let zerg = repo.join(".zerg");
        RushPaths {
            state_dir: zerg.join("state"),
            log_dir: zerg.join("logs"),
            spec_dir: zerg.join("rush").join(feature).join("spec"),
            worktrees: repo.join(".zerg-worktrees").join(feature),
            repo,
        }
    }

    /// Worktree of a worker slot.
    pub fn worker_worktree(&self, id: u32) -> PathBuf {
        self.worktrees.join(format!("worker-{id}"))
    }

    /// The staging worktree.
    pub fn staging_worktree(&self) -> PathBuf {
        self.worktrees.join("staging")
    }
}

/// Branch of a worker slot.
pub fn worker_branch(feature: &str, id: u32) -> String {
    format!("zerg/{feature}/worker-{id}")
}

/// The staging branch.
pub fn staging_branch(feature: &str) -> String {
    format!("zerg/{feature}/staging")
}

/// One rush.
pub struct Rush {
    /// Persisted state.
    pub doc: StateDoc,
    /// The task graph (from the spec snapshot).
    pub graph: TaskGraph,
    /// The config snapshot.
    pub config: Config,
    /// File locations.
    pub paths: RushPaths,
    /// Feature context for prompts.
    pub spec_context: String,
    /// Task runtime data.
    pub rt_tasks: HashMap<String, TaskRt>,
    /// Worker runtime data.
    pub rt_workers: BTreeMap<u32, WorkerRt>,
    /// monitor.log writer.
    pub monitor: Monitor,
    /// Whether `doc` changed since the last save.
    pub dirty: bool,
    /// Whether a merge is running.
    pub merging: bool,
    /// Next light reconciliation.
    pub next_reconcile: Instant,
    /// Escalations raised during this rush.
    pub escalations: Vec<v1::Escalation>,
    /// Event lines since the last save, for watchers.
    pub messages: Vec<String>,
    /// When the mass-staleness brake last fired.
    pub brake_at: Option<Instant>,
}

// === Construction and small helpers ===

impl Rush {
    /// A rush from its state, graph and config, with empty runtime data.
    pub fn new(
        doc: StateDoc,
        graph: TaskGraph,
        config: Config,
        paths: RushPaths,
        spec_context: String,
        monitor: Monitor,
        now: Instant,
    ) -> Rush {
        Rush {
            doc,
            graph,
            config,
            paths,
            spec_context,
            rt_tasks: HashMap::new(),
            rt_workers: BTreeMap::new(),
            monitor,
            dirty: true,
            merging: false,
            next_reconcile: now,
            escalations: Vec::new(),
            messages: Vec::new(),
            brake_at: None,
        }
    }

    /// Rush id.
    pub fn id(&self) -> &str {
        &self.doc.rush.rush_id
    }

    /// Feature name.
    pub fn feature(&self) -> &str {
        &self.doc.feature
    }

    /// Current rush state.
    pub fn state(&self) -> RushState {
        self.doc.rush.state
    }

    /// Whether the rush has ended (complete, failed or stopped).
    pub fn is_terminal(&self) -> bool {
        self.state().is_terminal()
    }

    fn resilient(&self) -> bool {
        self.config.resilience.enabled
    }

    fn set_state(&mut self, state: RushState, reason: &str) {
        self.doc.rush.state = state;
        self.doc.rush.reason = reason.to_string();
        self.doc.paused = state == RushState::Paused;
        self.doc.error =
            (!reason.is_empty() && state != RushState::Running && state != RushState::Complete)
                .then(|| reason.to_string());
        self.dirty = true;
    }

    /// Records an event in monitor.log, the events file and the execution log.
    pub fn event(
        &mut self,
        wall: SystemTime,
        source: Source,
        level: Level,
        kind: &str,
        message: String,
        data: serde_json::Value,
    ) {
        self.monitor
            .emit(wall, source, level, kind, &message, data.clone());
        self.doc.log(iso_millis(wall), kind, data);
        if self.messages.len() < 1000 {
            self.messages.push(message);
        }
        self.dirty = true;
    }

    fn task_level(&self, id: &str) -> u32 {
        self.doc.tasks.get(id).and_then(|t| t.level).unwrap_or(0)
    }

    fn task_status(&self, id: &str) -> Option<TaskStatus> {
        self.doc.tasks.get(id).map(|t| t.status)
    }

    fn worker_status(&self, w: u32) -> Option<WorkerStatus> {
        self.doc.workers.get(&w.to_string()).map(|x| x.status)
    }

    fn set_worker_status(&mut self, w: u32, status: WorkerStatus, reason: Option<String>) {
        if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
            ws.status = status;
            if reason.is_some() {
                ws.reason = reason;
            }
            self.dirty = true;
        }
    }

    /// Whether a task status is final for level accounting.
    pub fn is_terminal_task(status: Option<TaskStatus>) -> bool {
        status.is_some_and(TaskStatus::is_terminal)
    }

    fn spawn_backoff(&self) -> Backoff {
        let w = &self.config.workers;
        Backoff {
            strategy: w.spawn_backoff_strategy,
            base: secs(w.spawn_backoff_base_seconds),
            max: secs(w.spawn_backoff_max_seconds),
        }
    }

    fn task_backoff(&self) -> Backoff {
        let w = &self.config.workers;
        Backoff {
            strategy: w.backoff_strategy,
            base: secs(w.backoff_base_seconds),
            max: secs(w.backoff_max_seconds),
        }
    }

    fn live_workers(&self) -> Vec<u32> {
        self.rt_workers
            .iter()
            .filter(|(_, rt)| rt.spawned.is_some())
            .map(|(w, _)| *w)
            .collect()
    }
}

// === Lifecycle: start, spawn, exit ===

impl Rush {
    /// Starts (or resumes) execution once the worktrees exist.
    pub fn start(&mut self, now: Instant, wall: SystemTime, fx: &mut Effects) {
        self.set_state(RushState::Running, "");
        self.doc.rush.finished_at.clear();
        if self.doc.started_at.is_empty() {
            self.doc.started_at = iso_millis(wall);
        }
        self.doc.rush.rate_limited_until_ms = 0;
        let level = self.first_open_level();
        self.event(
            wall,
            Source::Orchestrator,
            Level::Info,
            "rush_started",
            format!(
                "Rush {} started: {} tasks, {} levels, {} workers ({})",
                self.feature(),
                self.graph.tasks.len(),
                self.graph.max_level(),
                self.doc.rush.workers,
                self.doc.rush.mode
            ),
            json!({"workers": self.doc.rush.workers, "total_tasks": self.graph.tasks.len()}),
        );
        self.next_reconcile = now + self.reconcile_interval();
        match level {
            Some(l) => self.start_level(l, wall),
            None => {
                self.finish(now, wall, fx);
                return;
            }
        }
        for w in 0..self.doc.rush.workers {
            let live = self.rt_workers.get(&w).is_some_and(|r| r.spawned.is_some());
            if !live {
                if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
                    ws.spawn_failures = 0;
                    ws.respawn_times_ms.clear();
                }
                self.spawn_slot(w, now, fx);
            }
        }
        // A resumed level whose tasks are all done but whose merge did not complete merges now.
        self.check_level_done(now, wall, fx);
        self.dispatch(now, wall, fx);
    }

    fn reconcile_interval(&self) -> Duration {
        let base = secs(self.config.workers.reconcile_interval_seconds);
        // Jitter so that several rushes do not reconcile in lockstep.
        base.mul_f64(0.9 + 0.2 * fastrand::f64())
    }

    /// The first level that still has work: an unfinished task, or a merge that has not
    /// completed (a level whose tasks are all done but whose merge conflicted is still open).
    fn first_open_level(&self) -> Option<u32> {
        self.graph
            .levels()
            .into_iter()
            .find(|(l, ts)| {
                ts.iter()
                    .any(|t| !Self::is_terminal_task(self.task_status(&t.id)))
                    || self
                        .doc
                        .levels
                        .get(&l.to_string())
                        .is_none_or(|ls| ls.merge_status != MergeStatus::Complete)
            })
            .map(|(l, _)| l)
    }

    fn start_level(&mut self, level: u32, wall: SystemTime) {
        self.doc.current_level = level;
        let ls = self.doc.levels.entry(level.to_string()).or_default();
        if ls.status != LevelStatus::Running {
            ls.status = LevelStatus::Running;
            ls.started_at = Some(iso_millis(wall));
            if ls.merge_status == MergeStatus::Pending
                || ls.merge_status == MergeStatus::Conflict
                || ls.merge_status == MergeStatus::Failed
            {
                ls.merge_status = MergeStatus::Pending;
            }
            let n = self
                .graph
                .levels()
                .get(&level)
                .map(|v| v.len())
                .unwrap_or(0);
            self.event(
                wall,
                Source::Orchestrator,
                Level::Info,
                "level_started",
                format!("Level {level} started with {n} tasks"),
                json!({"level": level, "tasks": n}),
            );
        }
        self.dirty = true;
    }

    /// Starts a new process in a worker slot.
    pub fn spawn_slot(&mut self, w: u32, now: Instant, fx: &mut Effects) {
        let key = w.to_string();
        let feature = self.feature().to_string();
        let wt = self.paths.worker_worktree(w);
        let ws = self.doc.workers.entry(key).or_default();
        ws.worker_id = w;
        ws.generation += 1;
        ws.status = WorkerStatus::Starting;
        ws.branch = worker_branch(&feature, w);
        ws.worktree_path = wt.to_string_lossy().to_string();
        ws.current_task = None;
        ws.pid = None;
        ws.container_id = None;
        let token = WorkerToken::generate();
        ws.token_sha256 = token.hash();
        let generation = ws.generation;
        let rt = self.rt_workers.entry(w).or_default();
        rt.token = Some(token);
        rt.spawn_due = None;
        rt.spawned = None;
        rt.registered = false;
        rt.stopping = false;
        rt.reconnect_by = None;
        rt.spawned_at = Some(now);
        self.dirty = true;
        fx.spawn.push((w, generation));
    }

    /// A spawn finished (successfully or not).
    pub fn on_spawned(
        &mut self,
        w: u32,
        generation: u64,
        result: Result<Spawned, SpawnError>,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) {
        let current = self.doc.workers.get(&w.to_string()).map(|x| x.generation);
        if current != Some(generation) {
            // A spawn for a superseded generation: make sure it does not linger.
            if let Ok(sp) = result {
                fx.stop.push((w, sp, Duration::ZERO));
            }
            return;
        }
        match result {
            Ok(sp) => {
                // A worker that died at once may report its exit before its spawn: that exit
                // was already handled, and the handle is of a dead process.
                if self
                    .rt_workers
                    .get(&w)
                    .is_some_and(|rt| rt.handled_gen >= generation)
                {
                    return;
                }
                if self.is_terminal() || self.worker_status(w) == Some(WorkerStatus::Stopping) {
                    fx.stop.push((w, sp, Duration::ZERO));
                    return;
                }
                let ws = self
                    .doc
                    .workers
                    .get_mut(&w.to_string())
                    .expect("slot exists");
                ws.pid = sp.pid;
                ws.pid_start_time = sp.start_time;
                ws.container_id = sp.container_id.clone();
                ws.started_at = Some(iso_millis(wall));
                let rt = self.rt_workers.entry(w).or_default();
                rt.spawned = Some(sp.clone());
                rt.spawned_at = Some(now);
                let respawn = std::mem::take(&mut rt.respawning);
                let what = if respawn { "respawned" } else { "spawned" };
                self.event(
                    wall,
                    Source::Worker(w),
                    Level::Info,
                    if respawn { "worker_respawn" } else { "worker_spawn" },
                    format!(
                        "Worker {w} {what} (generation {generation}, {})",
                        sp.container_id
                            .as_deref()
                            .map(|c| format!("container {}", &c[..c.len().min(12)]))
                            .or(sp.pid.map(|p| format!("pid {p}")))
                            .unwrap_or_default()
                    ),
                    json!({"worker_id": w, "generation": generation, "pid": sp.pid, "container_id": sp.container_id}),
                );
            }
            Err(e) => self.spawn_failed(w, &e.message, now, wall, fx),
        }
    }

    /// A spawn attempt failed: retry with backoff (FR-1) or give the slot up.
    fn spawn_failed(
        &mut self,
        w: u32,
        reason: &str,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) {
        let retries = self.config.workers.spawn_retry_attempts;
        let resilient = self.resilient();
        let ws = self
            .doc
            .workers
            .get_mut(&w.to_string())
            .expect("slot exists");
        ws.spawn_failures += 1;
        let attempt = ws.spawn_failures;
        if resilient && attempt <= retries && !self.is_terminal() {
            let delay = self.spawn_backoff().jittered(attempt);
            self.doc.rush.resilience.spawn_retries += 1;
            self.set_worker_status(
                w,
                WorkerStatus::Backoff,
                Some(format!("spawn attempt {attempt} failed: {reason}")),
            );
            let rt = self.rt_workers.entry(w).or_default();
            rt.spawn_due = Some(now + delay);
            rt.spawned = None;
            self.event(
                wall,
                Source::Worker(w),
                Level::Warn,
                "worker_spawn_retry",
                format!(
                    "Worker {w} spawn attempt {attempt} of {} failed: {reason}; retrying in {:.1}s (reason: transient spawn failures are retried with exponential backoff)",
                    retries + 1,
                    delay.as_secs_f64()
                ),
                json!({"worker_id": w, "attempt": attempt, "reason": reason, "backoff_seconds": delay.as_secs_f64()}),
            );
        } else {
            let why = format!(
                "spawn failed {attempt} times, last error: {reason}. Fix the cause, then run `zergctl retry {}`",
                self.feature()
            );
            self.set_worker_status(w, WorkerStatus::GaveUp, Some(why.clone()));
            if let Some(rt) = self.rt_workers.get_mut(&w) {
                rt.spawned = None;
            }
            self.event(
                wall,
                Source::Worker(w),
                Level::Error,
                "worker_spawn_failed",
                format!("Worker {w} gave up: {why}"),
                json!({"worker_id": w, "attempts": attempt, "reason": reason}),
            );
            self.check_workers_exhausted(now, wall, fx);
        }
        self.dispatch(now, wall, fx);
    }

    /// A worker process or container ended.
    pub fn on_exit(
        &mut self,
        w: u32,
        generation: u64,
        info: ExitInfo,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) {
        let Some(ws) = self.doc.workers.get(&w.to_string()) else {
            return;
        };
        if ws.generation != generation {
            return;
        }
        let task = ws.current_task.clone();
        let rt = self.rt_workers.entry(w).or_default();
        if rt.handled_gen >= generation {
            return;
        }
        rt.handled_gen = generation;
        let registered = rt.registered;
        let expected = rt.stopping;
        rt.spawned = None;
        rt.registered = false;
        rt.reconnect_by = None;
        if let Some(tx) = rt.parked.take() {
            drop(tx);
        }
        let desc = info.describe();
        if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
            ws.last_exit = Some(desc.clone());
            ws.current_task = None;
        }
        let code = info.code();
        let exit = code.and_then(WorkerExit::from_code);

        // The task the worker held goes back to the queue (FR-5).
        if let Some(t) = task.filter(|t| self.task_status(t) == Some(TaskStatus::InProgress)) {
            if exit == Some(WorkerExit::Checkpoint) {
                self.requeue(&t, "checkpoint", wall);
            } else if !expected {
                self.crash_task(&t, w, &format!("worker exited: {desc}"), wall);
            } else {
                self.requeue(&t, "worker stopped", wall);
            }
        }

        if self.is_terminal() {
            let status = if exit == Some(WorkerExit::Success) {
                WorkerStatus::Done
            } else {
                WorkerStatus::Exited
            };
            self.set_worker_status(w, status, None);
            self.event(
                wall,
                Source::Worker(w),
                Level::Info,
                "worker_exit",
                format!("Worker {w} exited: {desc}"),
                json!({"worker_id": w, "exit": desc}),
            );
            return;
        }

        let (level, kind, msg) = match (exit, registered) {
            (Some(WorkerExit::Success), _) => (
                Level::Info,
                "worker_exit",
                format!(
                    "Worker {w} exited: {desc}{}",
                    if self.has_open_work() {
                        ""
                    } else {
                        ", no work left"
                    }
                ),
            ),
            (Some(WorkerExit::Checkpoint), _) => (
                Level::Info,
                "worker_exit",
                format!("Worker {w} exited: {desc}; task requeued to resume from its checkpoint"),
            ),
            (Some(WorkerExit::Blocked), _) => (
                Level::Error,
                "worker_exit",
                format!("Worker {w} exited: {desc}"),
            ),
            (Some(WorkerExit::Escalation), _) => (
                Level::Warn,
                "worker_exit",
                format!("Worker {w} exited: {desc}; see escalations in status"),
            ),
            (_, false) => (
                Level::Error,
                "worker_crash",
                format!("Worker {w} exited before it registered: {desc}"),
            ),
            _ if expected => (
                Level::Info,
                "worker_exit",
                format!("Worker {w} stopped: {desc}"),
            ),
            _ => (
                Level::Error,
                "worker_crash",
                format!("Worker {w} crashed: {desc}"),
            ),
        };
        self.event(
            wall,
            Source::Worker(w),
            level,
            kind,
            msg,
            json!({"worker_id": w, "exit": desc, "code": code}),
        );

        // Checkpoints and escalations end a worker on purpose: not crashes.
        let deliberate = matches!(exit, Some(WorkerExit::Checkpoint | WorkerExit::Escalation));
        match exit {
            Some(WorkerExit::Success) if !self.has_open_work() => {
                self.set_worker_status(w, WorkerStatus::Done, Some("no work left".into()));
            }
            Some(WorkerExit::Success) => {
                // An agent that exits 0 while work remains (for example a late `Done` from an
                // earlier run) is replaced, without counting it as a crash.
                self.respawn(w, false, &desc, now, wall, fx);
            }
            Some(WorkerExit::Blocked) => {
                let reason = self
                    .doc
                    .workers
                    .get(&w.to_string())
                    .and_then(|x| x.reason.clone())
                    .unwrap_or_else(|| "the worker reported it cannot run tasks".into());
                self.set_worker_status(w, WorkerStatus::Blocked, Some(reason));
                self.check_workers_exhausted(now, wall, fx);
            }
            _ if !registered && !expected && !deliberate => {
                // Died before registering: that is a failed spawn (FR-1).
                self.spawn_failed(
                    w,
                    &format!(
                        "worker exited before it registered ({desc}); see .zerg/logs/worker-{w}.log"
                    ),
                    now,
                    wall,
                    fx,
                );
            }
            _ => {
                // Checkpoints, escalations and supervisor-initiated stops are not crashes and do
                // not count against the respawn cap.
                let counted = !expected && !deliberate;
                self.respawn(w, counted, &desc, now, wall, fx);
            }
        }
        self.dispatch(now, wall, fx);
    }

    /// Keeps the worker count at target (FR-6), within the respawn cap.
    fn respawn(
        &mut self,
        w: u32,
        counted: bool,
        why: &str,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) {
        if !self.has_open_work() {
            self.set_worker_status(w, WorkerStatus::Done, Some("no work left".into()));
            return;
        }
        if !self.resilient() || !self.config.workers.auto_respawn {
            self.set_worker_status(
                w,
                WorkerStatus::Exited,
                Some(format!("exited ({why}); auto_respawn is off")),
            );
            self.check_workers_exhausted(now, wall, fx);
            return;
        }
        let window_ms = (self.config.workers.respawn_window_seconds * 1000.0) as i64;
        let cap = self.config.workers.max_respawn_attempts;
        let now_ms = unix_millis(wall);
        let ws = self
            .doc
            .workers
            .get_mut(&w.to_string())
            .expect("slot exists");
        ws.respawn_times_ms.retain(|t| now_ms - *t < window_ms);
        if counted && ws.respawn_times_ms.len() as u32 >= cap {
            let reason = format!(
                "respawned {} times within {}s and exited again ({why}); giving up to avoid a crash loop. See .zerg/logs/worker-{w}.log, then `zergctl retry {}`",
                ws.respawn_times_ms.len(),
                self.config.workers.respawn_window_seconds,
                self.doc.feature
            );
            self.set_worker_status(w, WorkerStatus::GaveUp, Some(reason.clone()));
            self.event(
                wall,
                Source::Worker(w),
                Level::Error,
                "worker_gave_up",
                format!("Worker {w} gave up: {reason}"),
                json!({"worker_id": w}),
            );
            self.check_workers_exhausted(now, wall, fx);
            return;
        }
        if counted {
            ws.respawn_times_ms.push(now_ms);
        }
        ws.respawns += 1;
        ws.spawn_failures = 0;
        let n = ws.respawn_times_ms.len() as u32;
        self.doc.rush.resilience.worker_respawns += 1;
        // First respawn at once, later ones with the spawn backoff (like a crash-loop backoff).
        let delay = if n <= 1 {
            Duration::ZERO
        } else {
            self.spawn_backoff().jittered(n - 1)
        };
        let rt = self.rt_workers.entry(w).or_default();
        rt.respawning = true;
        if delay.is_zero() {
            self.spawn_slot(w, now, fx);
        } else {
            rt.spawn_due = Some(now + delay);
            self.set_worker_status(
                w,
                WorkerStatus::Backoff,
                Some(format!(
                    "respawn in {:.1}s after {why}",
                    delay.as_secs_f64()
                )),
            );
        }
    }

    /// Fails the rush if no worker slot can ever run the remaining work.
    fn check_workers_exhausted(&mut self, now: Instant, wall: SystemTime, fx: &mut Effects) {
        if self.is_terminal() || !self.has_open_work() {
            return;
        }
        let all_gone = (0..self.doc.rush.workers).all(|w| {
            matches!(
                self.worker_status(w),
                Some(
                    WorkerStatus::GaveUp
                        | WorkerStatus::Blocked
                        | WorkerStatus::Exited
                        | WorkerStatus::Done
                )
            )
        });
        if !all_gone {
            return;
        }
        let reasons: BTreeSet<String> = self
            .doc
            .workers
            .values()
            .filter_map(|w| w.reason.clone())
            .collect();
        let reason = format!(
            "no worker can run the remaining tasks: {}",
            reasons.into_iter().collect::<Vec<_>>().join("; ")
        );
        self.fail_rush(&reason, now, wall, fx);
    }

    fn has_open_work(&self) -> bool {
        self.doc.tasks.values().any(|t| !t.status.is_terminal())
    }
}

// === Worker RPCs ===

impl Rush {
    /// Any RPC from a worker proves it is alive; after a zergd restart it also ends the
    /// worker's reconnect grace period.
    fn touch(&mut self, w: u32, now: Instant, wall: SystemTime) {
        let rt = self.rt_workers.entry(w).or_default();
        rt.registered = true;
        rt.last_hb = Some(now);
        if rt.reconnect_by.take().is_some() {
            self.event(
                wall,
                Source::Worker(w),
                Level::Info,
                "worker_ready",
                format!("Worker {w} reconnected after zergd restart"),
                json!({"worker_id": w}),
            );
        }
    }

    fn check_generation(&self, r: &v1::WorkerRef) -> Result<(), Status> {
        match self.doc.workers.get(&r.worker_id.to_string()) {
            Some(ws) if ws.generation == r.generation => Ok(()),
            Some(ws) => Err(
                Revocation::Superseded.mark(Status::failed_precondition(format!(
                    "worker {} generation {} was superseded by generation {}",
                    r.worker_id, r.generation, ws.generation
                ))),
            ),
            None => Err(Status::not_found(format!("no worker slot {}", r.worker_id))),
        }
    }

    /// Checks that a worker-plane call comes from the worker it names: on this rush's socket,
    /// with the token of that slot's current generation. Runs before anything else looks at the
    /// request.
    pub fn authorize(&self, auth: &WorkerAuth, r: &v1::WorkerRef) -> Result<(), Status> {
        if auth.rush_id != r.rush_id {
            return Err(Status::permission_denied(format!(
                "this worker socket serves rush {}, not {:?}",
                auth.rush_id,
                r.rush_id.chars().take(80).collect::<String>()
            )));
        }
        let Some(hash) = auth.token_sha256.as_deref() else {
            return Err(Status::unauthenticated(
                "worker RPCs must carry the worker's token (authorization: Bearer <ZERG_WORKER_TOKEN>)",
            ));
        };
        self.check_generation(r)?;
        let ws = self
            .doc
            .workers
            .get(&r.worker_id.to_string())
            .ok_or_else(|| Status::not_found(format!("no worker slot {}", r.worker_id)))?;
        if ws.token_sha256.is_empty() || ws.token_sha256 != hash {
            return Err(Status::permission_denied(format!(
                "the token does not belong to worker {} generation {}",
                r.worker_id, r.generation
            )));
        }
        Ok(())
    }

    /// A worker announced itself.
    pub fn on_register(
        &mut self,
        req: v1::RegisterRequest,
        now: Instant,
        wall: SystemTime,
    ) -> Result<v1::RegisterReply, Status> {
        let r = req.worker.unwrap_or_default();
        self.check_generation(&r)?;
        if self.is_terminal() {
            return Err(Status::failed_precondition(format!(
                "rush is {}",
                self.state()
            )));
        }
        let w = r.worker_id;
        let rt = self.rt_workers.entry(w).or_default();
        let reconnect = rt.reconnect_by.take().is_some();
        rt.registered = true;
        rt.last_hb = Some(now);
        // A pid from inside a container means nothing on the host: never signal it.
        if rt.spawned.is_none() && self.doc.rush.mode != Mode::Container {
            rt.spawned = Some(Spawned {
                pid: Some(req.pid),
                start_time: crate::launcher::subprocess::proc_start_time(req.pid),
                container_id: None,
            });
        }
        let held = (!req.held_lease_id.is_empty())
            .then(|| (req.held_task_id.clone(), req.held_lease_id.clone()))
            .filter(|(t, l)| {
                self.doc.tasks.get(t).and_then(|x| x.lease_id.as_deref()) == Some(l.as_str())
            });
        let ws = self.doc.workers.get_mut(&w.to_string()).expect("checked");
        ws.ready_at = Some(iso_millis(wall));
        ws.health_check_at = Some(iso_millis(wall));
        ws.spawn_failures = 0;
        ws.reason = None;
        if let Some((t, _)) = &held {
            ws.status = WorkerStatus::Running;
            ws.current_task = Some(t.clone());
            self.rt_tasks
                .entry(t.clone())
                .and_modify(|x| x.last_progress = now);
        } else {
            ws.status = WorkerStatus::Ready;
        }
        let msg = if reconnect {
            format!("Worker {w} reconnected after zergd restart")
        } else {
            format!("Worker {w} ready")
        };
        self.event(
            wall,
            Source::Worker(w),
            Level::Info,
            "worker_ready",
            msg,
            json!({"worker_id": w, "pid": req.pid}),
        );
        Ok(self.register_reply())
    }

    fn register_reply(&self) -> v1::RegisterReply {
        let vt = &self.config.verification_tiers;
        let t = secs(vt.timeout_seconds).as_secs().max(1);
        let tier = |tier, name: &str, command: &Option<String>, blocking| v1::VerificationTier {
            tier,
            name: name.into(),
            command: command.clone().unwrap_or_default(),
            blocking,
            timeout_seconds: t,
        };
        v1::RegisterReply {
            agent_command: self.config.agent.command.clone(),
            agent_timeout_seconds: secs(self.config.agent.timeout_seconds).as_secs().max(1),
            heartbeat_interval_ms: (self.config.workers.heartbeat_interval_seconds * 1000.0) as u64,
            tiers: vec![
                tier(1, "syntax", &vt.tier1_command, vt.tier1_blocking),
                tier(2, "correctness", &vt.tier2_command, vt.tier2_blocking),
                tier(3, "quality", &vt.tier3_command, vt.tier3_blocking),
            ],
            spec_context: self.spec_context.clone(),
            feature: self.feature().to_string(),
            tasks_total: self.graph.tasks.len() as u32,
        }
    }

    /// A worker asks for its next task; the reply may be deferred until one is ready.
    pub fn on_lease(
        &mut self,
        req: v1::LeaseRequest,
        tx: LeaseReplyTx,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) {
        let r = req.worker.unwrap_or_default();
        if let Err(e) = self.check_generation(&r) {
            let _ = tx.send(Err(e));
            return;
        }
        let w = r.worker_id;
        // Asking for a new lease while holding one means the old one was abandoned (for
        // example the reply was lost): put it back so it is not stuck in progress.
        let held = self
            .doc
            .workers
            .get(&w.to_string())
            .and_then(|x| x.current_task.clone());
        if let Some(t) = held.filter(|t| self.task_status(t) == Some(TaskStatus::InProgress)) {
            self.requeue(&t, "lease abandoned by its worker", wall);
        }
        if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
            ws.current_task = None;
            if ws.status == WorkerStatus::Running || ws.status == WorkerStatus::Starting {
                ws.status = WorkerStatus::Ready;
            }
        }
        self.touch(w, now, wall);
        self.rt_workers.entry(w).or_default().parked = Some(tx);
        self.dispatch(now, wall, fx);
    }

    /// Hands ready tasks to parked workers, or tells them to exit when nothing is left.
    pub fn dispatch(&mut self, now: Instant, wall: SystemTime, fx: &mut Effects) {
        if self.is_terminal() {
            for (_, rt) in self.rt_workers.iter_mut() {
                if let Some(tx) = rt.parked.take() {
                    let reply = v1::LeaseReply {
                        outcome: Some(v1::lease_reply::Outcome::Done(v1::Done {
                            reason: format!("rush {}", self.doc.rush.state),
                        })),
                    };
                    fx.reply(tx, Ok(reply));
                }
            }
            return;
        }
        if self.state() != RushState::Running || self.merging || self.rate_limited(wall) {
            return;
        }
        let parked: Vec<u32> = self
            .rt_workers
            .iter()
            .filter(|(w, rt)| {
                rt.parked.is_some() && self.worker_status(**w) == Some(WorkerStatus::Ready)
            })
            .map(|(w, _)| *w)
            .collect();
        if parked.is_empty() {
            return;
        }
        let mut ready = self.ready_tasks().into_iter();
        for w in parked {
            let Some(task_id) = ready.next() else { break };
            let tx = self
                .rt_workers
                .get_mut(&w)
                .and_then(|r| r.parked.take())
                .expect("parked");
            let task = self.lease(&task_id, w, now, wall);
            fx.reply(
                tx,
                Ok(v1::LeaseReply {
                    outcome: Some(v1::lease_reply::Outcome::Task(task)),
                }),
            );
        }
    }

    fn rate_limited(&self, wall: SystemTime) -> bool {
        self.doc.rush.rate_limited_until_ms > unix_millis(wall)
    }

    /// Pending tasks of the current level whose dependencies are complete, in graph order.
    pub fn ready_tasks(&self) -> Vec<String> {
        let level = self.doc.current_level;
        self.graph
            .tasks
            .iter()
            .filter(|t| t.level == level && self.task_status(&t.id) == Some(TaskStatus::Pending))
            .filter(|t| {
                t.dependencies
                    .iter()
                    .all(|d| self.task_status(d) == Some(TaskStatus::Complete))
            })
            .map(|t| t.id.clone())
            .collect()
    }

    fn lease(&mut self, task_id: &str, w: u32, now: Instant, wall: SystemTime) -> v1::Task {
        let staging = self.doc.rush.staging_head.clone();
        let base = self
            .doc
            .workers
            .get(&w.to_string())
            .map(|x| x.accepted_head.clone())
            .filter(|h| !h.is_empty())
            .unwrap_or(staging);
        let ts = self.doc.tasks.get_mut(task_id).expect("task exists");
        ts.leases += 1;
        let lease_id = format!("{task_id}#{}", ts.leases);
        ts.status = TaskStatus::InProgress;
        ts.worker_id = Some(w);
        ts.lease_id = Some(lease_id.clone());
        ts.claimed_at = Some(iso_millis(wall));
        ts.started_at = Some(iso_millis(wall));
        ts.updated_at = iso_millis(wall);
        ts.next_retry_at = None;
        ts.base_commit = Some(base.clone());
        let attempt = ts.retry_count + 1;
        let resume_from = ts.resume_from.clone().unwrap_or_default();
        self.rt_tasks.insert(
            task_id.to_string(),
            TaskRt {
                last_progress: now,
                last_output_ms: 0,
                last_step: String::new(),
                retry_due: None,
            },
        );
        if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
            ws.status = WorkerStatus::Running;
            ws.current_task = Some(task_id.to_string());
            ws.step = Some(Step::Initializing);
            ws.progress_pct = 0;
        }
        self.event(
            wall,
            Source::Worker(w),
            Level::Info,
            "task_claimed",
            format!("Worker {w} claimed task {task_id}"),
            json!({"task_id": task_id, "worker_id": w, "lease_id": lease_id, "attempt": attempt}),
        );
        let t = self.graph.task(task_id).expect("task in graph");
        v1::Task {
            lease_id,
            id: t.id.clone(),
            title: t.title.clone(),
            description: t.description.clone(),
            level: t.level,
            files_create: t.files.create.clone(),
            files_modify: t.files.modify.clone(),
            files_read: t.files.read.clone(),
            verification_command: t
                .verification
                .as_ref()
                .map(|v| v.command.clone())
                .unwrap_or_default(),
            verification_timeout_seconds: t
                .verification
                .as_ref()
                .map(|v| v.timeout_seconds)
                .unwrap_or(30),
            context: t.context.clone().unwrap_or_default(),
            base_commit: base,
            resume_from,
            attempt,
            acceptance_criteria: t.acceptance_criteria.clone(),
        }
    }

    /// Checks that a report comes from the task's current lease (the fencing token).
    fn check_lease(&self, r: &v1::WorkerRef, task_id: &str, lease_id: &str) -> Result<(), Status> {
        self.check_generation(r)?;
        let revoked = Revocation::Lease(lease_id.to_string());
        let ts = self.doc.tasks.get(task_id).ok_or_else(|| {
            revoked.mark(Status::not_found(format!(
                "no task {:?}",
                task_id.chars().take(80).collect::<String>()
            )))
        })?;
        if ts.lease_id.as_deref() != Some(lease_id)
            || ts.status != TaskStatus::InProgress
            || ts.worker_id != Some(r.worker_id)
        {
            return Err(revoked.mark(Status::failed_precondition(format!(
                "lease {lease_id} for task {task_id} is no longer valid (current: {}, status {})",
                ts.lease_id.as_deref().unwrap_or("none"),
                ts.status
            ))));
        }
        Ok(())
    }

    /// A heartbeat from a worker's work loop.
    pub fn on_heartbeat(
        &mut self,
        req: v1::HeartbeatRequest,
        now: Instant,
        wall: SystemTime,
    ) -> Result<(), Status> {
        let r = req.worker.clone().unwrap_or_default();
        self.check_generation(&r)?;
        if !req.lease_id.is_empty() {
            self.check_lease(&r, &req.task_id, &req.lease_id)?;
        }
        let step: Step = req
            .step
            .parse()
            .map_err(|e| Status::invalid_argument(format!("step: {e}")))?;
        let w = r.worker_id;
        self.touch(w, now, wall);
        let recovered = self.worker_status(w) == Some(WorkerStatus::Stale);
        if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
            ws.health_check_at = Some(iso_millis(wall));
            ws.step = Some(step);
            ws.progress_pct = req.progress_pct.min(100);
        }
        if recovered {
            let status = if req.lease_id.is_empty() {
                WorkerStatus::Ready
            } else {
                WorkerStatus::Running
            };
            self.set_worker_status(w, status, None);
            self.event(
                wall,
                Source::Worker(w),
                Level::Info,
                "heartbeat_recovered",
                format!("Worker {w} heartbeat recovered"),
                json!({"worker_id": w}),
            );
        }
        if !req.lease_id.is_empty()
            && let Some(trt) = self.rt_tasks.get_mut(&req.task_id)
        {
            // Only evidence of work refreshes the task's progress deadline: new output from
            // the agent CLI or a new step. A heartbeat alone proves the worker is alive, not
            // that a hung `claude -p` is making progress.
            let mut started = false;
            if req.last_output_ms > trt.last_output_ms || req.step != trt.last_step {
                trt.last_progress = now;
                trt.last_output_ms = req.last_output_ms.max(trt.last_output_ms);
                started = req.step == "implementing" && trt.last_step != "implementing";
                trt.last_step = req.step;
            }
            if started {
                let t = req.task_id.clone();
                self.event(
                    wall,
                    Source::Worker(w),
                    Level::Info,
                    "task_started",
                    format!("Worker {w} started task {t}: invoking the agent CLI"),
                    json!({"task_id": t, "worker_id": w}),
                );
            }
        }
        Ok(())
    }

    /// What to check about a commit a worker reports for its current lease (`Complete`, or a
    /// checkpoint's WIP commit), or why the report is refused outright.
    pub fn commit_check(
        &self,
        r: &v1::WorkerRef,
        task_id: &str,
        lease_id: &str,
    ) -> Result<CommitCheck, Status> {
        self.check_lease(r, task_id, lease_id)?;
        let ts = &self.doc.tasks[task_id];
        Ok(CommitCheck {
            repo: self.paths.repo.clone(),
            worker: r.worker_id,
            branch: worker_branch(self.feature(), r.worker_id),
            base: ts.base_commit.clone().unwrap_or_default(),
            protected: format!(".gsd/specs/{}", self.feature()),
            container: self.doc.rush.mode == Mode::Container,
            feature: self.feature().to_string(),
            task: task_id.to_string(),
        })
    }

    /// A reported commit failed zergd's checks: the attempt fails (and is retried with
    /// backoff, up to the retry limit) and the worker is told its lease is over.
    pub fn refuse_commit(
        &mut self,
        req: &v1::CompleteRequest,
        why: &str,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) -> Status {
        let r = req.worker.clone().unwrap_or_default();
        let task_id = req.task_id.as_str();
        if let Err(e) = self.check_lease(&r, task_id, &req.lease_id) {
            return e;
        }
        let w = r.worker_id;
        self.touch(w, now, wall);
        if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
            ws.current_task = None;
            ws.status = WorkerStatus::Ready;
            ws.step = Some(Step::Idle);
        }
        self.event(
            wall,
            Source::Worker(w),
            Level::Warn,
            "commit_refused",
            format!("Worker {w} reported a commit for {task_id} that zergd refused: {why}"),
            json!({"task_id": task_id, "worker_id": w, "reason": why}),
        );
        self.fail_attempt(task_id, w, &format!("commit refused: {why}"), now, wall);
        self.check_level_done(now, wall, fx);
        self.dispatch(now, wall, fx);
        Status::failed_precondition(format!("commit refused: {why}"))
    }

    /// The inputs of the compatible `heartbeat-<id>.json` and `progress-<id>.json` files of a
    /// worker, as zergd last heard from it.
    pub fn worker_files(
        &self,
        w: u32,
        wall: SystemTime,
    ) -> Option<(serde_json::Value, serde_json::Value)> {
        let ws = self.doc.workers.get(&w.to_string())?;
        let step = ws.step.unwrap_or(Step::Initializing);
        let hb = json!({
            "worker_id": w,
            "timestamp": humantime::format_rfc3339_seconds(wall).to_string(),
            "task_id": ws.current_task,
            "step": step,
            "progress_pct": ws.progress_pct,
        });
        let tiers = self
            .rt_workers
            .get(&w)
            .map(|rt| rt.tiers.clone())
            .unwrap_or_default();
        let progress = json!({
            "worker_id": w,
            "tasks_completed": ws.tasks_completed,
            "tasks_total": self.graph.tasks.len(),
            "current_task": ws.current_task,
            "current_step": step,
            "tier_results": tiers,
        });
        Some((hb, progress))
    }

    /// Keeps the tier results of a slot's last attempt for its progress file.
    fn record_tiers(&mut self, w: u32, task_id: &str, tiers: &[v1::TierResult]) {
        let retry = self
            .doc
            .tasks
            .get(task_id)
            .map(|t| t.retry_count)
            .unwrap_or(0);
        self.rt_workers.entry(w).or_default().tiers = tiers
            .iter()
            .map(|t| json!({"tier": t.tier, "name": t.name, "success": t.success, "retry": retry}))
            .collect();
    }

    /// A worker committed its task.
    pub fn on_complete(
        &mut self,
        req: v1::CompleteRequest,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) -> Result<(), Status> {
        let r = req.worker.clone().unwrap_or_default();
        self.check_lease(&r, &req.task_id, &req.lease_id)?;
        let w = r.worker_id;
        self.touch(w, now, wall);
        self.record_tiers(w, &req.task_id, &req.tiers);
        let ts = self.doc.tasks.get_mut(&req.task_id).expect("checked");
        ts.cost_usd += req.cost_usd.max(0.0);
        ts.status = TaskStatus::Complete;
        ts.commit = Some(req.commit.clone());
        ts.completed_at = Some(iso_millis(wall));
        ts.updated_at = iso_millis(wall);
        ts.duration_ms = Some(req.duration_ms);
        ts.error = None;
        ts.resume_from = None;
        ts.out_of_scope = req.out_of_scope.clone();
        self.rt_tasks.remove(&req.task_id);
        if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
            ws.accepted_head = req.commit.clone();
            ws.tasks_completed += 1;
            ws.current_task = None;
            ws.status = WorkerStatus::Ready;
            ws.step = Some(Step::Idle);
        }
        self.event(
            wall,
            Source::Worker(w),
            Level::Info,
            "task_complete",
            format!("Worker {w} completed task {} ({})", req.task_id, req.commit.chars().take(10).collect::<String>()),
            json!({"task_id": req.task_id, "worker_id": w, "commit": req.commit, "duration_ms": req.duration_ms}),
        );
        if !req.out_of_scope.is_empty() {
            let warning = format!(
                "task {} changed files outside its ownership: {}",
                req.task_id,
                req.out_of_scope.join(", ")
            );
            self.event(
                wall,
                Source::Worker(w),
                Level::Warn,
                "task_out_of_scope",
                warning,
                json!({"task_id": req.task_id, "files": req.out_of_scope}),
            );
        }
        self.check_level_done(now, wall, fx);
        self.dispatch(now, wall, fx);
        Ok(())
    }

    /// A worker reports a task that did not finish.
    pub fn on_fail(
        &mut self,
        req: v1::FailRequest,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) -> Result<(), Status> {
        let r = req.worker.clone().unwrap_or_default();
        self.check_lease(&r, &req.task_id, &req.lease_id)?;
        let w = r.worker_id;
        self.touch(w, now, wall);
        self.record_tiers(w, &req.task_id, &req.tiers);
        let t = req.task_id.clone();
        if let Some(ts) = self.doc.tasks.get_mut(&t) {
            ts.cost_usd += req.cost_usd.max(0.0);
        }
        if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
            ws.current_task = None;
            ws.status = WorkerStatus::Ready;
            ws.step = Some(Step::Idle);
        }
        // An unknown kind is an ordinary failed attempt.
        let kind: Option<FailKind> = req.kind.parse().ok();
        match kind {
            Some(FailKind::RateLimited) => {
                let until = if req.retry_at_ms > unix_millis(wall) {
                    from_unix_millis(req.retry_at_ms)
                } else {
                    wall + self.task_backoff().jittered(1)
                };
                self.doc.rush.rate_limited_until_ms = unix_millis(until);
                self.requeue(&t, "rate limited", wall);
                self.event(
                    wall,
                    Source::Worker(w),
                    Level::Warn,
                    "rate_limited",
                    format!(
                        "Worker {w} hit the agent's usage limit on {t}; new work paused until {} (reason: retrying before the reset would fail again; the attempt is not counted)",
                        iso_millis(until)
                    ),
                    json!({"task_id": t, "worker_id": w, "until": iso_millis(until)}),
                );
            }
            Some(FailKind::Checkpoint) => {
                if let Some(ts) = self.doc.tasks.get_mut(&t) {
                    ts.resume_from =
                        (!req.checkpoint_commit.is_empty()).then(|| req.checkpoint_commit.clone());
                }
                self.requeue(&t, "checkpoint", wall);
            }
            Some(FailKind::AgentMissing) => {
                self.set_worker_status(w, WorkerStatus::Ready, Some(req.message.clone()));
                self.requeue(
                    &t,
                    &format!("worker cannot run the agent: {}", req.message),
                    wall,
                );
            }
            Some(FailKind::Escalated) => {
                self.fail_permanently(&t, &format!("escalated: {}", req.message), wall);
            }
            _ => {
                let kind = kind.map(FailKind::as_str).unwrap_or("failed");
                self.fail_attempt(&t, w, &format!("{kind}: {}", req.message), now, wall);
            }
        }
        self.check_level_done(now, wall, fx);
        self.dispatch(now, wall, fx);
        Ok(())
    }

    /// An escalation from a worker.
    pub fn on_escalate(
        &mut self,
        req: v1::EscalateRequest,
        wall: SystemTime,
        fx: &mut Effects,
    ) -> Result<(), Status> {
        let r = req.worker.clone().unwrap_or_default();
        self.check_generation(&r)?;
        let esc = v1::Escalation {
            worker_id: r.worker_id,
            task_id: req.task_id.clone(),
            category: req.category.clone(),
            message: req.message.clone(),
            timestamp: iso_millis(wall),
            resolved: false,
            context_json: req.context_json.clone(),
        };
        self.escalations.push(esc.clone());
        fx.escalations.push(esc);
        self.event(
            wall,
            Source::Worker(r.worker_id),
            Level::Warn,
            "escalation_created",
            format!(
                "ESCALATION from Worker {} on {} [{}]: {}",
                r.worker_id, req.task_id, req.category, req.message
            ),
            json!({"task_id": req.task_id, "category": req.category, "message": req.message}),
        );
        Ok(())
    }
}

// === Task transitions ===

impl Rush {
    /// Puts an in-progress task back to pending without counting an attempt.
    fn requeue(&mut self, t: &str, why: &str, wall: SystemTime) {
        let Some(ts) = self.doc.tasks.get_mut(t) else {
            return;
        };
        let w = ts.worker_id;
        ts.status = TaskStatus::Pending;
        ts.lease_id = None;
        ts.updated_at = iso_millis(wall);
        self.rt_tasks.remove(t);
        self.event(
            wall,
            w.map(Source::Worker).unwrap_or(Source::Orchestrator),
            Level::Info,
            "task_requeued",
            format!("Task {t} requeued ({why})"),
            json!({"task_id": t, "reason": why}),
        );
    }

    /// The worker holding a task died: requeue at once without counting an attempt (FR-5).
    fn crash_task(&mut self, t: &str, w: u32, why: &str, wall: SystemTime) {
        let cap = self.config.workers.max_respawn_attempts.max(3);
        let Some(ts) = self.doc.tasks.get_mut(t) else {
            return;
        };
        ts.crashes += 1;
        ts.error = Some(format!("worker_crash: {why}"));
        let crashes = ts.crashes;
        self.doc.rush.resilience.task_reassignments += 1;
        if crashes > cap {
            // A task that kills every worker it lands on is poison, not bad luck.
            self.fail_permanently(
                t,
                &format!("worker_crash: crashed its worker {crashes} times (last: {why})"),
                wall,
            );
            return;
        }
        self.requeue(t, "worker_crash", wall);
        self.event(
            wall,
            Source::Worker(w),
            Level::Warn,
            "task_reassign",
            format!("Task {t} failed with reason worker_crash ({why}); reassigning to a healthy worker (retry count unchanged: a crash is not a bug in the task)"),
            json!({"task_id": t, "worker_id": w, "retry_count_incremented": false}),
        );
    }

    /// A task attempt failed: retry with backoff, or fail for good.
    fn fail_attempt(&mut self, t: &str, w: u32, why: &str, now: Instant, wall: SystemTime) {
        let max = self.config.workers.retry_attempts;
        let backoff = self.task_backoff();
        let Some(ts) = self.doc.tasks.get_mut(t) else {
            return;
        };
        ts.retry_count += 1;
        ts.error = Some(why.to_string());
        ts.lease_id = None;
        let n = ts.retry_count;
        // Task retries are part of the core, not of the resilience switch.
        if n <= max {
            let delay = backoff.jittered(n);
            ts.status = TaskStatus::WaitingRetry;
            ts.next_retry_at = Some(iso_millis(wall + delay));
            ts.updated_at = iso_millis(wall);
            self.rt_tasks.insert(
                t.to_string(),
                TaskRt {
                    last_progress: now,
                    last_output_ms: 0,
                    last_step: String::new(),
                    retry_due: Some(now + delay),
                },
            );
            self.event(
                wall,
                Source::Worker(w),
                Level::Warn,
                "task_failed",
                format!("Task {t} failed (attempt {n} of {}): {why}; retrying in {:.1}s", max + 1, delay.as_secs_f64()),
                json!({"task_id": t, "worker_id": w, "retry_count": n, "backoff_seconds": delay.as_secs_f64(), "error": why}),
            );
        } else {
            self.fail_permanently(t, &format!("failed after {n} attempts: {why}"), wall);
        }
    }

    /// Fails a task for good and blocks everything that depends on it.
    fn fail_permanently(&mut self, t: &str, why: &str, wall: SystemTime) {
        let Some(ts) = self.doc.tasks.get_mut(t) else {
            return;
        };
        ts.status = TaskStatus::Failed;
        ts.error = Some(why.to_string());
        ts.lease_id = None;
        ts.updated_at = iso_millis(wall);
        let w = ts.worker_id;
        self.rt_tasks.remove(t);
        self.event(
            wall,
            w.map(Source::Worker).unwrap_or(Source::Orchestrator),
            Level::Error,
            "task_failed_permanent",
            format!("Task {t} failed: {why}"),
            json!({"task_id": t, "error": why}),
        );
        let dependents = self.graph.dependents_closure(t);
        let mut blocked = Vec::new();
        for d in dependents {
            if let Some(ds) = self.doc.tasks.get_mut(&d) {
                if ds.status == TaskStatus::Complete {
                    continue;
                }
                ds.status = TaskStatus::Blocked;
                if !ds.blocked_by.contains(&t.to_string()) {
                    ds.blocked_by.push(t.to_string());
                }
                ds.error = Some(format!("blocked: depends on failed task {t}"));
                ds.updated_at = iso_millis(wall);
                blocked.push(d);
            }
        }
        if !blocked.is_empty() {
            self.event(
                wall,
                Source::Orchestrator,
                Level::Warn,
                "tasks_blocked",
                format!(
                    "Blocked {} dependent task(s) of {t}: {}",
                    blocked.len(),
                    blocked.join(", ")
                ),
                json!({"task_id": t, "blocked": blocked}),
            );
        }
    }
}

// === Levels, merges and the end of a rush ===

impl Rush {
    /// Starts the level merge when every task of the current level is terminal.
    pub fn check_level_done(&mut self, now: Instant, wall: SystemTime, fx: &mut Effects) {
        if self.state() != RushState::Running || self.merging {
            return;
        }
        let level = self.doc.current_level;
        let levels = self.graph.levels();
        let Some(tasks) = levels.get(&level) else {
            return;
        };
        if !tasks
            .iter()
            .all(|t| Self::is_terminal_task(self.task_status(&t.id)))
        {
            return;
        }
        let any_complete = tasks
            .iter()
            .any(|t| self.task_status(&t.id) == Some(TaskStatus::Complete));
        if !any_complete {
            // Nothing to merge: the level produced no commits.
            self.level_merged(level, None, now, wall, fx);
            return;
        }
        self.merging = true;
        let ls = self.doc.levels.entry(level.to_string()).or_default();
        ls.merge_status = MergeStatus::Merging;
        let heads = (0..self.doc.rush.workers)
            .filter_map(|w| {
                let ws = self.doc.workers.get(&w.to_string())?;
                (!ws.accepted_head.is_empty()).then(|| {
                    (
                        w,
                        PathBuf::from(&ws.worktree_path),
                        ws.accepted_head.clone(),
                    )
                })
            })
            .collect();
        self.event(
            wall,
            Source::Orchestrator,
            Level::Info,
            "merge_started",
            format!(
                "Level {level} complete; merging worker branches into {}",
                staging_branch(self.feature())
            ),
            json!({"level": level}),
        );
        fx.merge = Some(MergeJob {
            level,
            heads,
            staging: self.paths.staging_worktree(),
        });
    }

    /// A merge job finished.
    pub fn on_merged(
        &mut self,
        level: u32,
        result: MergeResult,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) {
        self.merging = false;
        if self.state() != RushState::Running || level != self.doc.current_level {
            return;
        }
        match result {
            MergeResult::Merged(head) => self.level_merged(level, Some(head), now, wall, fx),
            MergeResult::Conflict { worker, files } => {
                let tasks: Vec<String> = self
                    .graph
                    .tasks
                    .iter()
                    .filter(|t| t.level == level)
                    .filter(|t| {
                        self.doc.tasks.get(&t.id).and_then(|x| x.worker_id) == Some(worker)
                            || t.files
                                .create
                                .iter()
                                .chain(&t.files.modify)
                                .any(|f| files.contains(f))
                    })
                    .map(|t| t.id.clone())
                    .collect();
                let reason = format!(
                    "merge conflict at level {level} merging worker {worker}: files {} (tasks {}). Resolve on {} and run `zergctl retry {}`",
                    files.join(", "),
                    tasks.join(", "),
                    staging_branch(self.feature()),
                    self.feature()
                );
                let ls = self.doc.levels.entry(level.to_string()).or_default();
                ls.merge_status = MergeStatus::Conflict;
                ls.conflicts = files.clone();
                ls.merge_details = Some(reason.clone());
                self.set_state(RushState::Paused, &reason);
                self.event(
                    wall,
                    Source::Orchestrator,
                    Level::Error,
                    "merge_conflict",
                    reason,
                    json!({"level": level, "files": files, "tasks": tasks}),
                );
            }
            MergeResult::GateFailed { gate, output } => {
                let reason = format!(
                    "quality gate '{gate}' failed on staging after level {level}: {output}. Fix it, then `zergctl retry {}`",
                    self.feature()
                );
                let ls = self.doc.levels.entry(level.to_string()).or_default();
                ls.merge_status = MergeStatus::Failed;
                ls.merge_details = Some(reason.clone());
                self.set_state(RushState::Paused, &reason);
                self.event(
                    wall,
                    Source::Orchestrator,
                    Level::Error,
                    "gate_failed",
                    reason,
                    json!({"level": level, "gate": gate}),
                );
            }
            MergeResult::Error(e) => {
                let reason = format!("merge of level {level} failed: {e}");
                let ls = self.doc.levels.entry(level.to_string()).or_default();
                ls.merge_status = MergeStatus::Failed;
                ls.merge_details = Some(reason.clone());
                self.set_state(RushState::Paused, &reason);
                self.event(
                    wall,
                    Source::Orchestrator,
                    Level::Error,
                    "merge_failed",
                    reason,
                    json!({"level": level}),
                );
            }
        }
        self.dispatch(now, wall, fx);
    }

    fn level_merged(
        &mut self,
        level: u32,
        head: Option<String>,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) {
        let failed = self
            .graph
            .tasks
            .iter()
            .filter(|t| t.level == level)
            .any(|t| self.task_status(&t.id) != Some(TaskStatus::Complete));
        if let Some(h) = &head {
            self.doc.rush.staging_head = h.clone();
            for ws in self.doc.workers.values_mut() {
                ws.accepted_head = h.clone();
            }
        }
        let ls = self.doc.levels.entry(level.to_string()).or_default();
        ls.status = if failed {
            LevelStatus::Failed
        } else {
            LevelStatus::Complete
        };
        ls.merge_status = MergeStatus::Complete;
        ls.merge_commit = head.clone();
        ls.completed_at = Some(iso_millis(wall));
        ls.conflicts.clear();
        ls.merge_details = None;
        self.event(
            wall,
            Source::Orchestrator,
            Level::Info,
            "level_complete",
            format!(
                "Level {level} complete{}",
                head.as_deref()
                    .map(|h| format!(", staging at {}", &h[..h.len().min(10)]))
                    .unwrap_or_default()
            ),
            json!({"level": level, "merge_commit": head}),
        );
        // A thorough reconciliation before the level advances (FR-4).
        self.reconcile(true, wall);
        match self.first_open_level() {
            Some(next) => {
                self.start_level(next, wall);
                self.check_level_done(now, wall, fx);
                self.dispatch(now, wall, fx);
            }
            None => self.finish(now, wall, fx),
        }
    }

    /// Ends the rush: complete when every task completed, failed otherwise.
    fn finish(&mut self, now: Instant, wall: SystemTime, fx: &mut Effects) {
        let total = self.doc.tasks.len();
        let done = self
            .doc
            .tasks
            .values()
            .filter(|t| t.status == TaskStatus::Complete)
            .count();
        self.doc.rush.finished_at = iso_millis(wall);
        self.doc.metrics = Some(json!({
            "computed_at": iso_millis(wall),
            "tasks_total": total,
            "tasks_completed": done,
            "tasks_failed": self.doc.tasks.values().filter(|t| t.status == TaskStatus::Failed).count(),
            "tasks_blocked": self.doc.tasks.values().filter(|t| t.status == TaskStatus::Blocked).count(),
            "levels_completed": self.doc.levels.values().filter(|l| l.status == LevelStatus::Complete).count(),
            "resilience": self.doc.rush.resilience,
        }));
        if done == total {
            self.set_state(RushState::Complete, "");
            self.event(
                wall,
                Source::Orchestrator,
                Level::Info,
                "rush_complete",
                format!(
                    "Rush complete: {done}/{total} tasks; result on {}",
                    staging_branch(self.feature())
                ),
                json!({"tasks": total}),
            );
            fx.cleanup = true;
        } else {
            let reason = self.failure_report();
            self.set_state(RushState::Failed, &reason);
            self.event(
                wall,
                Source::Orchestrator,
                Level::Error,
                "rush_failed",
                format!("Rush failed: {reason}"),
                json!({"completed": done, "total": total}),
            );
        }
        self.stop_all_workers(now, wall, fx, secs(self.config.workers.stop_grace_seconds));
    }

    /// One-line summary of what failed.
    pub fn failure_report(&self) -> String {
        let failed: Vec<String> = self
            .doc
            .tasks
            .iter()
            .filter(|(_, t)| t.status == TaskStatus::Failed)
            .map(|(id, t)| format!("{id} ({})", t.error.clone().unwrap_or_default()))
            .collect();
        let blocked: Vec<&String> = self
            .doc
            .tasks
            .iter()
            .filter(|(_, t)| t.status == TaskStatus::Blocked)
            .map(|(id, _)| id)
            .collect();
        let mut s = format!("{} task(s) failed: {}", failed.len(), failed.join("; "));
        if !blocked.is_empty() {
            s.push_str(&format!(
                "; {} blocked: {}",
                blocked.len(),
                blocked
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        s
    }

    fn fail_rush(&mut self, reason: &str, now: Instant, wall: SystemTime, fx: &mut Effects) {
        self.doc.rush.finished_at = iso_millis(wall);
        self.set_state(RushState::Failed, reason);
        self.event(
            wall,
            Source::Orchestrator,
            Level::Error,
            "rush_failed",
            format!("Rush failed: {reason}"),
            json!({"reason": reason}),
        );
        self.stop_all_workers(now, wall, fx, secs(self.config.workers.stop_grace_seconds));
    }

    /// Replies Done to parked workers and stops them all: at once for `zergctl stop`, after a
    /// grace period to exit by themselves at the end of a rush.
    fn stop_all_workers(
        &mut self,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
        grace: Duration,
    ) {
        let drain = self.state() != RushState::Stopped;
        self.dispatch(now, wall, fx);
        fx.sweep = Some(
            self.doc
                .workers
                .values()
                .map(|w| (w.worker_id, w.generation))
                .collect(),
        );
        let ids: Vec<u32> = self.rt_workers.keys().copied().collect();
        for w in ids {
            let rt = self.rt_workers.get_mut(&w).expect("key");
            rt.spawn_due = None;
            if let Some(sp) = rt.spawned.clone() {
                rt.stopping = true;
                if drain {
                    fx.drain.push((w, sp, grace));
                } else {
                    fx.stop.push((w, sp, grace));
                }
            }
            if matches!(
                self.worker_status(w),
                Some(WorkerStatus::Backoff | WorkerStatus::Starting)
            ) {
                self.set_worker_status(w, WorkerStatus::Exited, None);
            }
        }
    }

    /// Stops the rush and its workers (`zergctl stop`).
    pub fn stop(&mut self, force: bool, now: Instant, wall: SystemTime, fx: &mut Effects) -> u32 {
        let grace = if force {
            Duration::ZERO
        } else {
            secs(self.config.workers.stop_grace_seconds)
        };
        let in_progress: Vec<String> = self
            .doc
            .tasks
            .iter()
            .filter(|(_, t)| t.status == TaskStatus::InProgress)
            .map(|(id, _)| id.clone())
            .collect();
        for t in in_progress {
            self.requeue(&t, "rush stopped", wall);
        }
        self.doc.rush.finished_at = iso_millis(wall);
        self.set_state(
            RushState::Stopped,
            if force {
                "stopped by user (force)"
            } else {
                "stopped by user"
            },
        );
        self.event(
            wall,
            Source::Orchestrator,
            Level::Info,
            "rush_stopped",
            format!(
                "Rush stopped by user{}",
                if force { " (force)" } else { "" }
            ),
            json!({"force": force}),
        );
        let n = self.live_workers().len() as u32;
        for w in self.live_workers() {
            self.set_worker_status(w, WorkerStatus::Stopping, None);
        }
        self.stop_all_workers(now, wall, fx, grace);
        n
    }

    /// Requeues failed and blocked tasks (all, or the ones named) and resumes the rush.
    pub fn retry(
        &mut self,
        ids: &[String],
        reset: bool,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) -> Result<Vec<String>, Status> {
        for id in ids {
            if !self.doc.tasks.contains_key(id) {
                return Err(Status::not_found(format!(
                    "no task {id} in rush {}",
                    self.feature()
                )));
            }
        }
        let targets: Vec<String> = self
            .doc
            .tasks
            .iter()
            .filter(|(id, t)| {
                (ids.is_empty() || ids.contains(id))
                    && matches!(t.status.as_str(), "failed" | "blocked" | "waiting_retry")
            })
            .map(|(id, _)| id.clone())
            .collect();
        // Blocked dependents of a retried task become runnable again too.
        let mut all: BTreeSet<String> = targets.iter().cloned().collect();
        for t in &targets {
            for d in self.graph.dependents_closure(t) {
                if self.task_status(&d) == Some(TaskStatus::Blocked) {
                    all.insert(d);
                }
            }
        }
        for t in &all {
            let ts = self.doc.tasks.get_mut(t).expect("exists");
            ts.status = TaskStatus::Pending;
            ts.blocked_by.clear();
            ts.error = None;
            ts.next_retry_at = None;
            if reset {
                ts.retry_count = 0;
                ts.crashes = 0;
            }
            self.rt_tasks.remove(t);
        }
        let paused_merge = self.state() == RushState::Paused;
        if all.is_empty()
            && !paused_merge
            && !matches!(self.state(), RushState::Failed | RushState::Stopped)
        {
            return Ok(vec![]);
        }
        self.event(
            wall,
            Source::Orchestrator,
            Level::Info,
            "task_retry",
            format!("Retry requested: {} task(s) requeued", all.len()),
            json!({"tasks": all, "reset": reset}),
        );
        // Levels from the lowest requeued one on are open again.
        if let Some(min) = all.iter().map(|t| self.task_level(t)).min() {
            for (l, ls) in self.doc.levels.iter_mut() {
                if l.parse::<u32>().unwrap_or(0) >= min {
                    ls.status = LevelStatus::Pending;
                }
            }
        }
        let was_running = self.state() == RushState::Running;
        if was_running {
            if let Some(l) = self.first_open_level()
                && l < self.doc.current_level
            {
                self.start_level(l, wall);
            }
            // Slots that gave up (or were blocked) get a fresh start: the user fixed the cause.
            for w in 0..self.doc.rush.workers {
                let dead = matches!(
                    self.worker_status(w),
                    Some(
                        WorkerStatus::GaveUp
                            | WorkerStatus::Blocked
                            | WorkerStatus::Exited
                            | WorkerStatus::Done
                    )
                );
                let live = self.rt_workers.get(&w).is_some_and(|r| r.spawned.is_some());
                if dead && !live {
                    if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
                        ws.spawn_failures = 0;
                        ws.respawn_times_ms.clear();
                        ws.reason = None;
                    }
                    self.spawn_slot(w, now, fx);
                }
            }
            self.dispatch(now, wall, fx);
        } else {
            for ws in self.doc.workers.values_mut() {
                ws.spawn_failures = 0;
                ws.respawn_times_ms.clear();
            }
            self.start(now, wall, fx);
            self.check_level_done(now, wall, fx);
        }
        Ok(all.into_iter().collect())
    }
}

// === Timers: watchdogs, retries, reconciliation ===

impl Rush {
    /// Runs every due timer. Returns the next time something is due.
    pub fn tick(&mut self, now: Instant, wall: SystemTime, fx: &mut Effects) -> Option<Instant> {
        if self.is_terminal() {
            return None;
        }
        let mut next: Option<Instant> = None;
        let mut due = |t: Instant| {
            next = Some(next.map_or(t, |n: Instant| n.min(t)));
        };
        // Spawn retries and respawns (FR-1, FR-6).
        let spawn_due: Vec<u32> = self
            .rt_workers
            .iter()
            .filter(|(_, rt)| rt.spawn_due.is_some_and(|d| d <= now))
            .map(|(w, _)| *w)
            .collect();
        for w in spawn_due {
            self.spawn_slot(w, now, fx);
        }
        for rt in self.rt_workers.values() {
            if let Some(d) = rt.spawn_due {
                due(d);
            }
        }
        // Task retries (backoff elapsed).
        let retry_due: Vec<String> = self
            .rt_tasks
            .iter()
            .filter(|(_, rt)| rt.retry_due.is_some_and(|d| d <= now))
            .map(|(t, _)| t.clone())
            .collect();
        for t in retry_due {
            if self.task_status(&t) == Some(TaskStatus::WaitingRetry) {
                let ts = self.doc.tasks.get_mut(&t).expect("exists");
                ts.status = TaskStatus::Pending;
                ts.next_retry_at = None;
                self.rt_tasks.remove(&t);
                self.event(
                    wall,
                    Source::Orchestrator,
                    Level::Info,
                    "task_retry_ready",
                    format!("Task {t} is ready for retry"),
                    json!({"task_id": t}),
                );
            } else {
                self.rt_tasks.remove(&t);
            }
        }
        for rt in self.rt_tasks.values() {
            if let Some(d) = rt.retry_due {
                due(d);
            }
        }
        if self.state() == RushState::Running && self.resilient() {
            self.check_stale(now, wall, fx);
            // Re-check at a fraction of the heartbeat interval.
            due(now
                + secs(self.config.workers.heartbeat_interval_seconds / 2.0)
                    .min(Duration::from_secs(1)));
        }
        if self.doc.rush.rate_limited_until_ms > 0 {
            if self.rate_limited(wall) {
                let left = self.doc.rush.rate_limited_until_ms - unix_millis(wall);
                due(now + Duration::from_millis(left as u64));
            } else {
                self.doc.rush.rate_limited_until_ms = 0;
                self.dirty = true;
                self.event(
                    wall,
                    Source::Orchestrator,
                    Level::Info,
                    "rate_limit_over",
                    "Usage limit reset; resuming new work".into(),
                    json!({}),
                );
            }
        }
        if now >= self.next_reconcile {
            self.reconcile(false, wall);
            self.next_reconcile = now + self.reconcile_interval();
        }
        due(self.next_reconcile);
        self.check_level_done(now, wall, fx);
        self.dispatch(now, wall, fx);
        next
    }

    /// Heartbeat staleness, task progress watchdog, ready timeouts and reconnect grace.
    fn check_stale(&mut self, now: Instant, wall: SystemTime, fx: &mut Effects) {
        let w_cfg = &self.config.workers;
        let hb_stale = secs(w_cfg.heartbeat_stale_threshold);
        let task_stale = secs(w_cfg.task_stale_timeout_seconds);
        let ready_timeout = secs(w_cfg.spawn_ready_timeout_seconds);

        // Workers that never registered in time: a failed spawn.
        let slow: Vec<u32> = self
            .rt_workers
            .iter()
            .filter(|(_, rt)| rt.spawned.is_some() && !rt.registered && rt.reconnect_by.is_none())
            .filter(|(_, rt)| {
                rt.spawned_at
                    .is_some_and(|s| now.duration_since(s) > ready_timeout)
            })
            .map(|(w, _)| *w)
            .collect();
        for w in slow {
            self.kill_worker(w, true, fx);
            self.set_worker_status(w, WorkerStatus::Stopping, None);
            self.event(
                wall,
                Source::Worker(w),
                Level::Warn,
                "worker_spawn_timeout",
                format!("Worker {w} did not register within {:.0}s; killing it (counts as a failed spawn)", ready_timeout.as_secs_f64()),
                json!({"worker_id": w}),
            );
            // The timeout is the failure: the killed process's exit must not be handled again.
            let generation = self
                .doc
                .workers
                .get(&w.to_string())
                .map(|x| x.generation)
                .unwrap_or(0);
            if let Some(rt) = self.rt_workers.get_mut(&w) {
                rt.spawned = None;
                rt.handled_gen = generation;
            }
            self.spawn_failed(w, "did not register in time", now, wall, fx);
        }

        // Re-adopted workers that never reconnected after a zergd restart.
        let lost: Vec<u32> = self
            .rt_workers
            .iter()
            .filter(|(_, rt)| rt.reconnect_by.is_some_and(|d| d <= now))
            .map(|(w, _)| *w)
            .collect();
        for w in lost {
            let generation = self
                .doc
                .workers
                .get(&w.to_string())
                .map(|x| x.generation)
                .unwrap_or(0);
            self.kill_worker(w, true, fx);
            self.event(
                wall,
                Source::Worker(w),
                Level::Warn,
                "heartbeat_stale",
                format!(
                    "Worker {w} did not reconnect after zergd restarted; treating it as crashed"
                ),
                json!({"worker_id": w}),
            );
            self.doc.rush.resilience.stale_detections += 1;
            self.on_exit(w, generation, ExitInfo::Vanished, now, wall, fx);
        }

        // Stale heartbeats (FR-3).
        let live: Vec<u32> = self
            .rt_workers
            .iter()
            .filter(|(w, rt)| {
                rt.registered
                    && rt.spawned.is_some()
                    && !rt.stopping
                    && self.worker_status(**w) != Some(WorkerStatus::Stale)
            })
            .map(|(w, _)| *w)
            .collect();
        let stale: Vec<u32> = live
            .iter()
            .copied()
            .filter(|w| {
                self.rt_workers[w]
                    .last_hb
                    .is_some_and(|h| now.duration_since(h) > hb_stale)
            })
            .collect();
        if !stale.is_empty() {
            // If half or more of the workers went stale in the same tick, the likelier story is
            // that zergd itself was suspended or the clock jumped: re-check once before failing
            // everything (the Kubernetes node-controller brake).
            let brake_ok = self
                .brake_at
                .is_none_or(|b| now.duration_since(b) > hb_stale * 2);
            if live.len() >= 2 && stale.len() * 2 >= live.len() && brake_ok {
                self.brake_at = Some(now);
                for w in &stale {
                    if let Some(rt) = self.rt_workers.get_mut(w) {
                        rt.last_hb = Some(now);
                    }
                }
                for rt in self.rt_tasks.values_mut() {
                    if rt.retry_due.is_none() {
                        // A full new progress window: the silence may have been zergd's.
                        rt.last_progress = now;
                    }
                }
                self.event(
                    wall,
                    Source::Orchestrator,
                    Level::Warn,
                    "heartbeat_brake",
                    format!(
                        "{} of {} workers look stale at once; suspecting zergd was suspended or the clock jumped, re-checking after another {:.0}s instead of failing them",
                        stale.len(),
                        live.len(),
                        hb_stale.as_secs_f64()
                    ),
                    json!({"stale": stale, "live": live}),
                );
            } else {
                for w in stale {
                    self.doc.rush.resilience.stale_detections += 1;
                    let task = self
                        .doc
                        .workers
                        .get(&w.to_string())
                        .and_then(|x| x.current_task.clone());
                    self.set_worker_status(
                        w,
                        WorkerStatus::Stale,
                        Some(format!("no heartbeat for {:.0}s", hb_stale.as_secs_f64())),
                    );
                    self.event(
                        wall,
                        Source::Worker(w),
                        Level::Warn,
                        "heartbeat_stale",
                        format!(
                            "Worker {w} is stale: no heartbeat for more than {:.0}s; it gets no new work, is killed{}",
                            hb_stale.as_secs_f64(),
                            task.as_deref().map(|t| format!(", and its task {t} is reassigned")).unwrap_or_default()
                        ),
                        json!({"worker_id": w, "task_id": task}),
                    );
                    if let Some(t) =
                        task.filter(|t| self.task_status(t) == Some(TaskStatus::InProgress))
                    {
                        self.crash_task(&t, w, "worker heartbeat stale", wall);
                        if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
                            ws.current_task = None;
                        }
                    }
                    // Killed by us because it was stale: the respawn is counted (it may be a
                    // worker that keeps hanging), so the exit is not marked expected.
                    self.kill_worker(w, false, fx);
                }
            }
        }

        // Tasks with no progress (FR-2).
        let timed_out: Vec<(String, u32)> = self
            .doc
            .tasks
            .iter()
            .filter(|(_, t)| t.status == TaskStatus::InProgress)
            .filter_map(|(id, t)| {
                let rt = self.rt_tasks.get(id)?;
                (now.duration_since(rt.last_progress) > task_stale)
                    .then(|| (id.clone(), t.worker_id.unwrap_or(0)))
            })
            .collect();
        for (t, w) in timed_out {
            self.doc.rush.resilience.stale_detections += 1;
            self.doc.rush.resilience.task_reassignments += 1;
            self.event(
                wall,
                Source::Worker(w),
                Level::Warn,
                "task_timeout",
                format!(
                    "Task {t} on worker {w} made no progress for more than {:.0}s (no agent output); failing it with reason timeout, killing the worker's process group, and requeueing with backoff",
                    task_stale.as_secs_f64()
                ),
                json!({"task_id": t, "worker_id": w, "timeout_seconds": task_stale.as_secs_f64()}),
            );
            if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
                ws.current_task = None;
            }
            self.fail_attempt(&t, w, "timeout: no progress from the agent", now, wall);
            self.kill_worker(w, true, fx);
        }
    }

    /// Stops a worker. An `expected` exit is zergd's doing and is not counted against the
    /// respawn cap; a stale worker's is (it may be one that keeps hanging).
    fn kill_worker(&mut self, w: u32, expected: bool, fx: &mut Effects) {
        if let Some(rt) = self.rt_workers.get_mut(&w)
            && let Some(sp) = rt.spawned.clone()
        {
            rt.stopping |= expected;
            fx.stop
                .push((w, sp, secs(self.config.workers.stop_grace_seconds)));
        }
    }

    /// Compares task, worker and level state and fixes what disagrees (FR-4). `thorough` runs
    /// at level transitions.
    pub fn reconcile(&mut self, thorough: bool, wall: SystemTime) -> u32 {
        let mut fixes: Vec<String> = Vec::new();
        // A missing level is parsed from the id (`*-L{n}-*`) or taken from the graph.
        let graph_levels: HashMap<String, u32> = self
            .graph
            .tasks
            .iter()
            .map(|t| (t.id.clone(), t.level))
            .collect();
        for (id, ts) in self.doc.tasks.iter_mut() {
            if ts.level.is_none() {
                ts.level = zerg_proto::graph::level_from_id(id).or(graph_levels.get(id).copied());
                fixes.push(format!("task {id} had no level; set to {:?}", ts.level));
            }
        }
        // In-progress tasks whose worker is not alive, or not holding them.
        let orphaned: Vec<(String, Option<u32>)> = self
            .doc
            .tasks
            .iter()
            .filter(|(_, t)| t.status == TaskStatus::InProgress)
            .filter(|(id, t)| {
                let Some(w) = t.worker_id else { return true };
                let alive = self
                    .rt_workers
                    .get(&w)
                    .is_some_and(|rt| rt.spawned.is_some());
                let holds = self
                    .doc
                    .workers
                    .get(&w.to_string())
                    .and_then(|x| x.current_task.as_deref())
                    == Some(id.as_str());
                !(alive && holds)
            })
            .map(|(id, t)| (id.clone(), t.worker_id))
            .collect();
        for (t, w) in orphaned {
            fixes.push(format!("task {t} was in progress on dead or idle worker {w:?}; failed with worker_crash and requeued"));
            match w {
                Some(w) => self.crash_task(&t, w, "reconciliation found its worker gone", wall),
                None => self.requeue(&t, "reconciliation: no worker", wall),
            }
        }
        // Workers that claim a task the task does not agree with.
        let mismatched: Vec<u32> = self
            .doc
            .workers
            .values()
            .filter(|ws| {
                ws.current_task.as_ref().is_some_and(|t| {
                    self.task_status(t) != Some(TaskStatus::InProgress)
                        || self.doc.tasks.get(t).and_then(|x| x.worker_id) != Some(ws.worker_id)
                })
            })
            .map(|ws| ws.worker_id)
            .collect();
        for w in mismatched {
            if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
                fixes.push(format!(
                    "worker {w} listed task {:?} that it does not hold; cleared",
                    ws.current_task
                ));
                ws.current_task = None;
            }
        }
        // Level status must agree with task status.
        let levels = self.graph.levels();
        for (l, tasks) in &levels {
            let all_terminal = tasks
                .iter()
                .all(|t| Self::is_terminal_task(self.task_status(&t.id)));
            let key = l.to_string();
            let st = self
                .doc
                .levels
                .get(&key)
                .map(|x| x.status)
                .unwrap_or_default();
            if (st == LevelStatus::Complete || st == LevelStatus::Failed) && !all_terminal {
                let want = if *l == self.doc.current_level {
                    LevelStatus::Running
                } else {
                    LevelStatus::Pending
                };
                fixes.push(format!(
                    "level {l} was marked {st} with unfinished tasks; recalculated to {want}"
                ));
                self.doc.levels.entry(key).or_default().status = want;
            }
        }
        if thorough {
            // Nothing of a later level may be running while an earlier level is open.
            let cur = self.doc.current_level;
            let early: Vec<String> = self
                .doc
                .tasks
                .iter()
                .filter(|(_, t)| t.status == TaskStatus::InProgress && t.level.unwrap_or(0) > cur)
                .map(|(id, _)| id.clone())
                .collect();
            for t in early {
                fixes.push(format!(
                    "task {t} was running ahead of level {cur}; requeued"
                ));
                self.requeue(&t, "reconciliation: ahead of its level", wall);
            }
        }
        let n = fixes.len() as u32;
        for f in fixes {
            self.doc.rush.resilience.reconcile_fixes += 1;
            self.event(
                wall,
                Source::Orchestrator,
                Level::Warn,
                "state_reconcile_fix",
                format!("Reconciliation fixed a divergence: {f}"),
                json!({"fix": f, "thorough": thorough}),
            );
        }
        n
    }
}
