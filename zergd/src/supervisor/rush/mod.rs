//! One rush as a synchronous state machine.
//!
//! Every input (a worker RPC, a worker exit, a timer tick, a finished merge) is a method call
//! with the current time; outputs that need I/O (spawning, stopping, merging, replying after the
//! state is saved) are pushed into [`Effects`] for the actor shell to run. Nothing here blocks or
//! sleeps, which is what lets status answer while spawns are being retried, and what lets the
//! unit tests drive hours of timeouts with a fake clock.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::error::SupervisorError;
use serde_json::json;
use tokio::sync::oneshot;
use tokio::time::Instant;
use zerg_proto::graph::{Task, TaskGraph};
use zerg_symbols::{BuildStats, Settings as SymbolSettings, SymbolIndex};

use crate::backoff::Backoff;
use crate::calls::WorkerAuth;
use crate::calls::{
    Assignment, Beat, Caller, Completion, Escalation, EscalationReport, Failure, LeaseOutcome,
    LeaseRef, NOTES_PER_TASK, Noted, Register, Registration, TierOutcome, TierSpec,
};
use crate::clock::{from_unix_millis, iso_millis, unix_millis};
use crate::config::{Config, GatesRunOn};
use crate::domain::{
    FailKind, LevelStatus, MergeStatus, Mode, RushState, Step, TaskStatus, WorkerStatus,
};
use crate::launcher::WorkerToken;
use crate::launcher::{ExitInfo, SpawnError, Spawned};
use crate::monitor::{Level, MonitorEvent, Source};
use crate::state::{Journal, StateDoc, StateStore};
use zerg_proto::contract::{Revocation, WorkerExit};

mod levels;
mod lifecycle;
mod recovery;
mod resolve;
mod symbols;
mod tasks;
mod timers;
mod worker_rpc;

/// Reply channel for a lease request.
pub type LeaseReplyTx = oneshot::Sender<Result<LeaseOutcome, SupervisorError>>;

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
    /// A symbol map to build.
    pub index: Option<IndexJob>,
    /// Replies to send once the state is saved.
    pub replies: Vec<Box<dyn FnOnce(Option<SupervisorError>) + Send>>,
    /// Worktrees to remove (the rush completed).
    pub cleanup: bool,
    /// Escalations to append to `escalations.json`.
    pub escalations: Vec<Escalation>,
    /// The rush ended: once the stops and drains are done, remove whatever is left of its
    /// workers (containers, running or exited) up to these generations per slot.
    pub sweep: Option<BTreeMap<u32, u64>>,
}

impl Effects {
    /// Queues a reply to send after the state is persisted. If the state could not be saved,
    /// the caller gets that error instead: nobody is told what a crash could lose.
    pub fn reply<T: Send + 'static>(
        &mut self,
        tx: oneshot::Sender<Result<T, SupervisorError>>,
        v: Result<T, SupervisorError>,
    ) {
        self.replies.push(Box::new(move |unsaved| {
            let _ = tx.send(match unsaved {
                Some(e) => Err(e),
                None => v,
            });
        }));
    }

    /// Queues a reply that reports state rather than changing it (status): it goes out after
    /// the save like every reply, and still goes out when the save failed, since what it shows
    /// (the rush held, and why) is how the user learns about the failure.
    pub fn report<T: Send + 'static>(&mut self, tx: oneshot::Sender<T>, v: T) {
        self.replies.push(Box::new(move |_| {
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
    /// The rush's base commit: the staging merge reads git attributes from it.
    pub base: String,
    /// Who the merge commits are by when git has no identity (`git.identity`).
    pub identity: crate::config::GitIdentity,
    /// Where each quality gate's full output goes (`.zerg/logs`).
    pub log_dir: PathBuf,
    /// The symbol map to move onto the merged head, and its settings (`None` when
    /// `symbols.enabled` is off).
    pub symbols: Option<(Arc<SymbolIndex>, SymbolSettings)>,
    /// The rush's repository handle, which the symbol map's update reads through (`None` when
    /// the rush could not open one: the job opens its own).
    pub git: Option<zerg_git::Repo>,
    /// Where the gates run: `Some` (the container each gate gets, its name, command and timeout
    /// filled per gate) in a container rush with `gates.run_on: worker-image`; `None` on the
    /// host.
    pub gate_image: Option<zerg_launch::gate::GateContainer>,
    /// How the gates that run on the host (and the setup before them) are confined; `None`
    /// runs them as zergd's user.
    pub gate_sandbox: Option<crate::sandbox::GateSandbox>,
    /// `worktree.setup` and its time limit, run in the staging worktree before gates that run
    /// on the host.
    pub setup: (Vec<String>, Duration),
    /// Turns true when the rush stops, which ends a gate running in a container.
    pub gates_stop: tokio::sync::watch::Receiver<bool>,
    /// Whether a conflict is committed with its markers for a resolution task
    /// (`merge.resolve: agent`) rather than only reported.
    pub mark_conflicts: bool,
    /// After a resolution: the resolved commit staging moves to first, before `heads`.
    pub resume_from: Option<String>,
}

/// A symbol map to build from a commit (the first of a rush, in a blocking job).
#[derive(Debug, Clone)]
pub struct IndexJob {
    /// Repository root.
    pub repo: PathBuf,
    /// The commit to index: the staging head.
    pub commit: String,
    /// `symbols:` of the rush's config.
    pub settings: SymbolSettings,
    /// The rush's repository handle (`None` when the rush could not open one: the job opens its
    /// own).
    pub git: Option<zerg_git::Repo>,
}

/// A built or updated symbol map with what building it did, or why it could not be built.
pub type Indexed = Result<(SymbolIndex, BuildStats), String>;

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
        /// With `merge.resolve: agent`: the merge committed with its conflict markers, and the
        /// heads still to merge after it.
        marked: Option<(String, Vec<(u32, String)>)>,
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

impl MergeResult {
    /// How the merge ended, as `/metrics` counts it.
    pub fn outcome(&self) -> crate::metrics::MergeOutcome {
        use crate::metrics::MergeOutcome as O;
        match self {
            MergeResult::Merged(_) => O::Merged,
            MergeResult::Conflict { .. } => O::Conflict,
            MergeResult::GateFailed { .. } => O::GateFailed,
            MergeResult::Error(_) => O::Error,
        }
    }
}

/// Per-task runtime data that is not persisted.
#[derive(Debug, Clone)]
pub struct TaskRt {
    /// Last time the holder showed progress.
    pub last_progress: Instant,
    /// Last agent output time the holder reported (Unix ms).
    pub last_output_ms: i64,
    /// Last step the holder reported.
    pub last_step: Option<Step>,
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
/// [`zerg_git::Repo::check_task_commit`]), gathered from the rush under the actor.
#[derive(Debug, Clone)]
pub struct CommitCheck {
    /// Repository root.
    pub repo: PathBuf,
    /// The rush's repository handle (`None` when it could not be opened; the check opens it
    /// again and reports why it cannot).
    pub git: Option<zerg_git::Repo>,
    /// The worker slot.
    pub worker: u32,
    /// Its branch.
    pub branch: String,
    /// The commit the lease started from.
    pub base: String,
    /// The spec directory tasks must not change (`.gsd/specs/<feature>`).
    pub protected: String,
    /// Container mode: the worker's new objects must be imported first, within these limits.
    pub container: Option<crate::git::objects::ImportLimits>,
    /// The feature (for checkpoint refs).
    pub feature: String,
    /// The task.
    pub task: String,
    /// The checkpoint the lease resumes from (empty when none).
    pub resume_from: String,
    /// Size limits on a pack a remote worker pushes.
    pub pack_limits: crate::git::objects::ImportLimits,
    /// Where a remote worker's artifacts of the task go (`.zerg/logs/tasks/<task>`).
    pub artifacts: PathBuf,
    /// How many artifacts, and how many bytes of them, are kept (`container.*`).
    pub artifact_caps: crate::transfers::ArtifactCaps,
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

pub use crate::domain::{staging_branch, worker_branch};

/// A graph's tasks by level (in graph order) and by id, as indexes into its `tasks`: built once
/// and extended as tasks are added, so finding a level's tasks or a task by id never walks the
/// whole graph.
#[derive(Debug, Default)]
pub struct GraphIndex {
    by_level: BTreeMap<u32, Vec<usize>>,
    by_id: HashMap<String, usize>,
    /// Each task's critical chain: its own weight plus the heaviest chain of the tasks that
    /// depend on it, by index (see [`critical_chains`]).
    chain: Vec<f64>,
}

impl GraphIndex {
    /// Indexes the tasks of `graph` from the `from`-th on (the chains of every task, since a
    /// new task can lengthen its dependencies' chains).
    fn extend(&mut self, graph: &TaskGraph, from: usize) {
        for (i, t) in graph.tasks.iter().enumerate().skip(from) {
            self.by_level.entry(t.level).or_default().push(i);
            self.by_id.insert(t.id.clone(), i);
        }
        self.chain = critical_chains(graph, self);
    }
}

/// The length of the heaviest chain of dependents that starts at each task (by index), the
/// task itself included. A task weighs its `estimate_minutes`; one without an estimate weighs
/// the median of the graph's estimates (1 when none has one), so that a graph with no
/// estimates counts tasks. Every dependency is at a lower level (the graph is refused
/// otherwise), so one pass from the highest level down has each dependent's chain ready.
fn critical_chains(graph: &TaskGraph, index: &GraphIndex) -> Vec<f64> {
    let mut given: Vec<u32> = graph
        .tasks
        .iter()
        .filter_map(|t| t.estimate_minutes)
        .collect();
    given.sort_unstable();
    let default = given.get(given.len() / 2).map_or(1.0, |m| f64::from(*m));
    let mut chain = vec![0.0; graph.tasks.len()];
    for &i in index.by_level.values().rev().flatten() {
        let t = &graph.tasks[i];
        chain[i] += t.estimate_minutes.map_or(default, f64::from);
        // Done with `i`: the heaviest chain among its dependents is in `chain[i]` already.
        for d in &t.dependencies {
            if let Some(&j) = index.by_id.get(d) {
                chain[j] = f64::max(chain[j], chain[i]);
            }
        }
    }
    chain
}

/// One rush.
pub struct Rush {
    /// Persisted state.
    pub doc: StateDoc,
    /// The task graph (from the spec snapshot, and the resolution tasks added since).
    pub graph: TaskGraph,
    /// `graph`'s tasks by level and by id, kept in step with it.
    shape: GraphIndex,
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
    /// Events since the last save, for monitor.log and the events file (written by the shell).
    pub events: Vec<MonitorEvent>,
    /// The state `notify:` was last told about (the state the rush was loaded in, at first):
    /// a change to an end or to `paused` is told once.
    pub notified_state: RushState,
    /// Whether `doc` changed since the last save.
    pub dirty: bool,
    /// What of `doc` is on disk, and where the next change goes.
    pub journal: Journal,
    /// Whether a merge is running.
    pub merging: bool,
    /// Next light reconciliation.
    pub next_reconcile: Instant,
    /// Escalations raised during this rush.
    pub escalations: Vec<Escalation>,
    /// Event lines since the last save, for watchers.
    pub messages: Vec<MonitorEvent>,
    /// When the mass-staleness brake last fired.
    pub brake_at: Option<Instant>,
    /// The symbol map of the staging head that prompts draw on; `None` until the first one is
    /// built (never persisted: a restarted zergd builds it again, mostly from the cache).
    pub symbols: Option<Arc<SymbolIndex>>,
    /// A symbol map is being built; leases wait for it.
    pub indexing: bool,
    /// Workers whose agent CLI could not reach its API since the last attempt that could.
    pub unreachable_from: BTreeSet<u32>,
    /// The repository, opened once for the rush's commit checks (see [`Rush::git`]).
    pub git: std::sync::OnceLock<zerg_git::Repo>,
    /// Set when the rush stops: a gate running in a container for it is killed and removed.
    pub gates_stop: tokio::sync::watch::Sender<bool>,
    /// How its subprocess workers and host gates are confined (decided when the rush is made
    /// or loaded, from `sandbox.mode` and what the machine allows).
    pub sandbox: zerg_sandbox::Enforcement,
    /// The hosts and paths the config adds to the sandbox's policy.
    pub egress: zerg_sandbox::Extra,
    /// The policy of the rush's last spawned confined worker (written by the spawn job).
    pub policy: Arc<std::sync::Mutex<Option<zerg_sandbox::Policy>>>,
}

// === Construction and small helpers ===

impl Rush {
    /// The rush's repository handle, opened at first use and kept while the rush is held;
    /// `None` when it cannot be opened.
    pub fn git(&self) -> Option<zerg_git::Repo> {
        if let Some(g) = self.git.get() {
            return Some(g.clone());
        }
        match zerg_git::Repo::open(&self.paths.repo) {
            Ok(g) => Some(self.git.get_or_init(|| g).clone()),
            Err(e) => {
                tracing::warn!(error = %e, "cannot open the repository");
                None
            }
        }
    }

    /// The view of the rush that `Status`, `Watch` and `List` project.
    pub fn view(&self) -> crate::calls::RushView<'_> {
        let levels: BTreeMap<u32, Vec<&str>> = self
            .shape
            .by_level
            .iter()
            .map(|(l, ix)| {
                (
                    *l,
                    ix.iter()
                        .map(|i| self.graph.tasks[*i].id.as_str())
                        .collect(),
                )
            })
            .collect();
        crate::calls::RushView {
            doc: &self.doc,
            levels,
            total_levels: self.graph.max_level(),
            escalations: &self.escalations,
            ended: self.is_terminal(),
            sandbox: crate::calls::SandboxView {
                mode: self.config.sandbox.mode.as_str(),
                enforcement: self.sandbox.clone(),
                policy: self
                    .policy
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone(),
                allow_hosts: self.egress.allow_hosts.clone(),
                setup_allow_hosts: self.egress.setup_allow_hosts.clone(),
                egress_refused: self.doc.rush.egress_refused,
            },
        }
    }

    /// A rush from its state, graph and config, with empty runtime data.
    pub fn new(
        doc: StateDoc,
        graph: TaskGraph,
        config: Config,
        paths: RushPaths,
        spec_context: String,
        now: Instant,
    ) -> Rush {
        let journal = Journal::new(
            StateStore::new(&paths.state_dir, &doc.feature),
            doc.rush.journal_seq,
        );

        let sandbox = crate::sandbox::decide(&config, doc.rush.mode);
        let egress = crate::sandbox::extra(&config);
        let mut rush = Rush {
            journal,
            notified_state: doc.rush.state,
            doc,
            shape: GraphIndex::default(),
            graph,
            config,
            paths,
            spec_context,
            rt_tasks: HashMap::new(),
            rt_workers: BTreeMap::new(),
            unreachable_from: BTreeSet::new(),
            git: std::sync::OnceLock::new(),
            events: Vec::new(),
            dirty: true,
            merging: false,
            next_reconcile: now,
            escalations: Vec::new(),
            messages: Vec::new(),
            brake_at: None,
            symbols: None,
            indexing: false,
            gates_stop: tokio::sync::watch::channel(false).0,
            sandbox,
            egress,
            policy: Arc::default(),
        };
        rush.shape.extend(&rush.graph, 0);
        // Resolution tasks are not in the spec's graph: they come back from the state.
        rush.restore_resolutions();
        rush
    }

    /// Whether the rush's workers run in the sandbox (subprocess mode, with namespaces).
    pub fn confined(&self) -> bool {
        self.doc.rush.mode == Mode::Subprocess && self.sandbox.confined()
    }

    /// Whether a worker's objects come from a private git dir that zergd imports (container
    /// mode, and confined subprocess workers), rather than written into the repository.
    pub fn private_git(&self) -> bool {
        self.doc.rush.mode == Mode::Container || self.confined()
    }

    /// Adds tasks to the graph (resolution tasks), indexed.
    pub(super) fn add_tasks(&mut self, tasks: impl IntoIterator<Item = Task>) {
        let from = self.graph.tasks.len();
        self.graph.tasks.extend(tasks);
        self.shape.extend(&self.graph, from);
    }

    /// The weight of the heaviest chain of tasks that starts at task `id` (0 for no task).
    pub fn critical_chain(&self, id: &str) -> f64 {
        self.shape
            .by_id
            .get(id)
            .and_then(|i| self.shape.chain.get(*i))
            .copied()
            .unwrap_or(0.0)
    }

    /// The task of the graph with id `id`.
    pub fn graph_task(&self, id: &str) -> Option<&Task> {
        self.shape.by_id.get(id).map(|i| &self.graph.tasks[*i])
    }

    /// The tasks of `level`, in graph order.
    pub fn level_tasks(&self, level: u32) -> impl Iterator<Item = &Task> {
        self.shape
            .by_level
            .get(&level)
            .into_iter()
            .flatten()
            .map(|i| &self.graph.tasks[*i])
    }

    /// The graph's levels, lowest first.
    pub fn level_numbers(&self) -> impl Iterator<Item = u32> + '_ {
        self.shape.by_level.keys().copied()
    }

    /// The container settings of the rush's workers (and of its gate containers), from its
    /// config; the host side is prepared per spawn.
    pub fn container_spec(&self) -> crate::launcher::ContainerSpec {
        let res = &self.config.resources;
        crate::launcher::ContainerSpec {
            image: self.config.container.image.clone(),
            network: self.config.container.network.clone(),
            memory_bytes: res.container_memory_limit.0,
            cpus: res.container_cpu_limit,
            pids_limit: res.container_pids_limit,
            host: None,
            log_max_bytes: self.config.container.log_max_size.0.max(0) as u64,
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

    /// What `notify:` is told about this rush: `event` (`rush_complete`, `task_failed`, …),
    /// the rush's feature, id, repository, state and reason, the time, and its task counts;
    /// plus the fields of `extra`.
    pub fn notice(
        &self,
        event: &str,
        wall: SystemTime,
        extra: serde_json::Value,
    ) -> serde_json::Value {
        let count = |s: TaskStatus| self.doc.tasks.values().filter(|t| t.status == s).count();
        let mut v = serde_json::json!({
            "event": event,
            "feature": self.doc.feature,
            "rush_id": self.id(),
            "repo": self.paths.repo,
            "state": self.state(),
            "reason": self.doc.rush.reason,
            "at": iso_millis(wall),
            "tasks": {
                "total": self.doc.tasks.len(),
                "complete": count(TaskStatus::Complete),
                "failed": count(TaskStatus::Failed),
                "blocked": count(TaskStatus::Blocked),
            },
        });
        if let (Some(v), serde_json::Value::Object(extra)) = (v.as_object_mut(), extra) {
            v.extend(extra);
        }
        v
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
        self.doc.log(iso_millis(wall), kind, data.clone());
        let ev = MonitorEvent {
            at: wall,
            source,
            level,
            kind: kind.to_string(),
            message,
            data,
        };
        if self.messages.len() < 1000 {
            self.messages.push(ev.clone());
        }
        self.events.push(ev);
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
            base: w.spawn_backoff_base_seconds,
            max: w.spawn_backoff_max_seconds,
        }
    }

    fn task_backoff(&self) -> Backoff {
        let w = &self.config.workers;
        Backoff {
            strategy: w.backoff_strategy,
            base: w.backoff_base_seconds,
            max: w.backoff_max_seconds,
        }
    }

    /// The slots whose worker is running (spawned and not yet exited).
    pub fn live_workers(&self) -> Vec<u32> {
        self.rt_workers
            .iter()
            .filter(|(_, rt)| rt.spawned.is_some())
            .map(|(w, _)| *w)
            .collect()
    }
}

/// What the launcher saw of a rush's workers after a restart.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// Workers the launcher found by itself (containers, by label).
    pub discovered: Vec<crate::launcher::Discovered>,
    /// Slot by slot: whether its recorded handle is still the same live worker (a pid whose
    /// start time still matches, a running container).
    pub alive: BTreeMap<u32, bool>,
}

/// What the shell must do once a rush is re-adopted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Readoption {
    /// Workers to watch again: live ones, and exited containers whose exit the engine still
    /// holds.
    pub watch: Vec<(u32, u64, Spawned)>,
    /// Workers that no slot of the state knows (or knows as an older generation): stop and
    /// remove them.
    pub orphans: Vec<Spawned>,
}
