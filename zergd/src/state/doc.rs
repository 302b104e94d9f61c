//! The state document: the original ZERG's shape (`feature`, `current_level`, `tasks`,
//! `workers`, `levels`, `execution_log`, …) plus what zergd needs to resume, and the tracked
//! maps and log that remember what changed since the last journal record.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Deref;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::domain::{LevelStatus, MergeStatus, Mode, RushState, Step, TaskStatus, WorkerStatus};

/// Version of the state document format written by this build. Version 2 added the journal:
/// a document of version 2 may have records in `<feature>.journal` that an older zergd would
/// not replay, so it refuses the file instead.
pub const FORMAT_VERSION: u32 = 2;

/// Entries kept in `execution_log`; older ones are dropped.
pub const EXECUTION_LOG_LIMIT: usize = 500;

/// The whole state document.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct StateDoc {
    /// Format version; see [`FORMAT_VERSION`].
    pub format_version: u32,
    /// Feature name.
    pub feature: String,
    /// When the rush started (RFC 3339).
    pub started_at: String,
    /// Level being executed (0 before the first level starts).
    pub current_level: u32,
    /// Per-task state, keyed by task id.
    pub tasks: Tracked<TaskState>,
    /// Per-worker state, keyed by worker id as a string.
    pub workers: Tracked<WorkerState>,
    /// Per-level state, keyed by level number as a string.
    pub levels: Tracked<LevelState>,
    /// Recent events, oldest first, bounded by [`EXECUTION_LOG_LIMIT`].
    pub execution_log: ExecutionLog,
    /// Summary metrics, written when the rush ends.
    pub metrics: Option<serde_json::Value>,
    /// Whether the rush is paused.
    pub paused: bool,
    /// Why the rush failed or paused, if it did.
    pub error: Option<String>,
    /// zergd's own bookkeeping.
    pub rush: RushMeta,
}

/// zergd's bookkeeping for a rush.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct RushMeta {
    /// Unique id of this rush.
    pub rush_id: String,
    /// Absolute repository path.
    pub repo: String,
    /// Where the workers run.
    pub mode: Mode,
    /// Target number of workers.
    pub workers: u32,
    /// The rush's state.
    pub state: RushState,
    /// Why the rush is in its state.
    pub reason: String,
    /// The branch the rush started from.
    pub base_branch: String,
    /// The commit the rush started from.
    pub base_commit: String,
    /// Current tip of the staging branch.
    pub staging_head: String,
    /// Snapshot of the spec directory.
    pub spec_dir: String,
    /// When the rush ended.
    pub finished_at: String,
    /// Unix ms until which new work is held back (agent rate limit), 0 if none.
    pub rate_limited_until_ms: i64,
    /// Which usage limit holds new work (`five_hour`, …), when the agent CLI named it.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub rate_limit_type: String,
    /// The rush's budget (USD): no new work once the agent's cost reaches it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_usd: Option<f64>,
    /// Resilience counters.
    pub resilience: Counters,
    /// Graph and config warnings from rush start.
    pub warnings: Vec<String>,
    /// The last journal record folded into this document (0: none).
    #[serde(skip_serializing_if = "is_zero")]
    pub journal_seq: u64,
    /// Connections the sandbox's egress proxy refused, over the rush's whole life (kept here
    /// so a finished or reloaded rush still shows them).
    #[serde(skip_serializing_if = "is_zero")]
    pub egress_refused: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Resilience counters (NFR-3).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct Counters {
    /// Spawn attempts retried.
    pub spawn_retries: u64,
    /// Stale workers and stale tasks detected.
    pub stale_detections: u64,
    /// Tasks taken from one worker and put back for another.
    pub task_reassignments: u64,
    /// Workers respawned after an exit.
    pub worker_respawns: u64,
    /// Divergences fixed by reconciliation.
    pub reconcile_fixes: u64,
}

/// One task.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct TaskState {
    /// The task's state.
    pub status: TaskStatus,
    /// Task level (never missing, unlike the original: bug B1).
    pub level: Option<u32>,
    /// Task title.
    pub title: String,
    /// Worker holding or last holding the task.
    pub worker_id: Option<u32>,
    /// Last change.
    pub updated_at: String,
    /// When the current lease was granted.
    pub claimed_at: Option<String>,
    /// When the current attempt started.
    pub started_at: Option<String>,
    /// When the task completed.
    pub completed_at: Option<String>,
    /// Last error.
    pub error: Option<String>,
    /// Failed attempts so far (crashes excluded).
    pub retry_count: u32,
    /// Worker crashes while holding the task.
    pub crashes: u32,
    /// When a waiting_retry task becomes pending again.
    pub next_retry_at: Option<String>,
    /// Duration of the successful attempt.
    pub duration_ms: Option<u64>,
    /// The current lease (attempt id); results for other leases are refused.
    pub lease_id: Option<String>,
    /// Number of leases granted so far (feeds lease ids).
    pub leases: u32,
    /// Commit that completed the task.
    pub commit: Option<String>,
    /// Checkpoint commit to resume from.
    pub resume_from: Option<String>,
    /// The commit the current lease started from; a reported commit must descend from it.
    pub base_commit: Option<String>,
    /// Files changed outside the task's ownership.
    pub out_of_scope: Vec<String>,
    /// Failed tasks this one waits on.
    pub blocked_by: Vec<String>,
    /// Agent cost over all attempts (USD), as reported by the agent CLI.
    pub cost_usd: f64,
    /// Tokens over all attempts, as reported by the agent CLI.
    #[serde(skip_serializing_if = "Tokens::is_zero")]
    pub tokens: Tokens,
    /// Tokens and cost over all attempts, per model.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub models: BTreeMap<String, ModelSpend>,
    /// Attempts that could not reach the agent's API, in a row (not counted as failures;
    /// they only lengthen the wait before the next one).
    #[serde(skip_serializing_if = "is_zero_u32")]
    pub unreachable: u32,
    /// How the last attempt failed, with the tail of what it printed: the next attempt's
    /// prompt carries it (`## Previous attempt`), bounded by `agent.retry_context_bytes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_attempt: Option<String>,
    /// The model each attempt was leased with (`agent.models`), first attempt first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub attempt_models: Vec<String>,
    /// The user's notes (`zergctl note`, `retry --note`), oldest first: every later attempt's
    /// prompt carries them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<UserNote>,
}

/// One note of the user to a task.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct UserNote {
    /// The text, as checked on the way in (plain, at most 4 KiB).
    pub text: String,
    /// When it was given (RFC 3339).
    pub at: String,
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

/// Tokens an agent CLI reported.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, Default, PartialEq, Eq)]
#[serde(default)]
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
        *self == Tokens::default()
    }

    /// Adds another count (saturating).
    pub fn add(&mut self, o: &Tokens) {
        self.input_tokens = self.input_tokens.saturating_add(o.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(o.output_tokens);
        self.cache_read_tokens = self.cache_read_tokens.saturating_add(o.cache_read_tokens);
        self.cache_creation_tokens = self
            .cache_creation_tokens
            .saturating_add(o.cache_creation_tokens);
    }
}

/// One model's tokens and cost.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct ModelSpend {
    /// Tokens.
    #[serde(flatten)]
    pub tokens: Tokens,
    /// Cost (USD).
    pub cost_usd: f64,
}

impl ModelSpend {
    /// Adds another model line.
    pub fn add(&mut self, o: &ModelSpend) {
        self.tokens.add(&o.tokens);
        self.cost_usd += o.cost_usd;
    }
}

/// One worker slot.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct WorkerState {
    /// Slot number.
    pub worker_id: u32,
    /// The slot's state.
    pub status: WorkerStatus,
    /// Task being run.
    pub current_task: Option<String>,
    /// Worktree path.
    pub worktree_path: String,
    /// Worker branch.
    pub branch: String,
    /// When the current process started.
    pub started_at: Option<String>,
    /// When it registered.
    pub ready_at: Option<String>,
    /// Last heartbeat received.
    pub health_check_at: Option<String>,
    /// Tasks completed by this slot.
    pub tasks_completed: u32,
    /// Process id (subprocess mode, or the agent inside a container).
    pub pid: Option<i32>,
    /// Process start time (clock ticks since boot), to tell a live worker from a reused pid.
    pub pid_start_time: Option<u64>,
    /// Container id (container mode).
    pub container_id: Option<String>,
    /// Spawn generation; results from older generations are refused.
    pub generation: u64,
    /// Last commit of this slot that zergd accepted.
    pub accepted_head: String,
    /// SHA-256 of the current generation's worker token (the token itself is never stored).
    pub token_sha256: String,
    /// Unix ms of recent respawns, for the respawn window.
    pub respawn_times_ms: Vec<i64>,
    /// Respawns so far.
    pub respawns: u32,
    /// Consecutive spawn failures.
    pub spawn_failures: u32,
    /// Last exit and its meaning, e.g. `3 (blocked)`.
    pub last_exit: Option<String>,
    /// Why the worker is in its status.
    pub reason: Option<String>,
    /// Current step from the last heartbeat.
    pub step: Option<Step>,
    /// Progress from the last heartbeat.
    pub progress_pct: u32,
    /// What the agent CLI said it is doing within the step (`API retry 3/10: overloaded`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// One level.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct LevelState {
    /// The level's state.
    pub status: LevelStatus,
    /// When the level started.
    pub started_at: Option<String>,
    /// When the level finished.
    pub completed_at: Option<String>,
    /// Merge commit on staging.
    pub merge_commit: Option<String>,
    /// The state of its merge into staging.
    pub merge_status: MergeStatus,
    /// Conflicting files, when the merge conflicted.
    pub conflicts: Vec<String>,
    /// Error details of a failed merge or gate.
    pub merge_details: Option<String>,
    /// The merge conflict an agent is resolving (`merge.resolve: agent`), while it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolution: Option<Resolution>,
}

/// A merge conflict turned into a resolution task: what the task is, and where the level's
/// merge goes on from once it is done.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct Resolution {
    /// The resolution task's id (`RESOLVE-L<level>-W<worker>`).
    pub task_id: String,
    /// The worker whose branch conflicted.
    pub worker: u32,
    /// The commit the task starts from: the merge of that branch into staging, conflict
    /// markers committed as they are.
    pub base: String,
    /// The conflicting paths.
    pub files: Vec<String>,
    /// The heads of the level still to merge after it, in order: (worker, commit).
    pub rest: Vec<(u32, String)>,
    /// The task's title.
    pub title: String,
    /// The task's description (the prompt's body).
    pub description: String,
    /// Files the task may read.
    pub read: Vec<String>,
    /// The task's verification: no conflict marker left, and both tasks' verifications.
    pub verification: String,
}

/// One `execution_log` entry.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct LogEntry {
    /// RFC 3339 timestamp.
    pub timestamp: String,
    /// Event name.
    pub event: String,
    /// Event data.
    pub data: serde_json::Value,
}

impl StateDoc {
    /// How many tasks are complete.
    pub fn tasks_complete(&self) -> usize {
        self.tasks
            .values()
            .filter(|t| t.status == TaskStatus::Complete)
            .count()
    }

    /// Appends to the execution log, dropping the oldest entries past the limit.
    pub fn log(&mut self, timestamp: String, event: &str, data: serde_json::Value) {
        self.execution_log.push(LogEntry {
            timestamp,
            event: event.to_string(),
            data,
        });
    }
}

/// A map of the state document that remembers which entries were handed out for change since
/// the last journal record. Reads go through `Deref` to the map; every way of getting an entry
/// mutably marks it.
#[derive(Debug, Clone)]
pub struct Tracked<V> {
    pub(super) map: BTreeMap<String, V>,
    pub(super) touched: BTreeSet<String>,
    pub(super) all: bool,
}

impl<V> Default for Tracked<V> {
    fn default() -> Self {
        Self {
            map: BTreeMap::new(),
            touched: BTreeSet::new(),
            all: false,
        }
    }
}

impl<V> Deref for Tracked<V> {
    type Target = BTreeMap<String, V>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl<V: PartialEq> PartialEq for Tracked<V> {
    fn eq(&self, other: &Self) -> bool {
        self.map == other.map
    }
}

impl<V> From<BTreeMap<String, V>> for Tracked<V> {
    fn from(map: BTreeMap<String, V>) -> Self {
        Self {
            map,
            ..Self::default()
        }
    }
}

impl<'a, V> IntoIterator for &'a Tracked<V> {
    type Item = (&'a String, &'a V);
    type IntoIter = std::collections::btree_map::Iter<'a, String, V>;
    fn into_iter(self) -> Self::IntoIter {
        self.map.iter()
    }
}

impl<V: Serialize> Serialize for Tracked<V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.map.serialize(s)
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Tracked<V> {
    /// Read as a list of entries and built at once, so that the map's nodes come out full
    /// (entry by entry, in the file's sorted order, they are left about half full: 8.5 MB
    /// instead of 5 MB for the task map of 10,000 tasks). Of two equal keys the last counts, as
    /// when inserting.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entries<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de>> serde::de::Visitor<'de> for Entries<V> {
            type Value = Vec<(String, V)>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0).min(4096));
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(entries)
            }
        }
        let entries = d.deserialize_map(Entries(std::marker::PhantomData))?;
        Ok(Self::from(entries.into_iter().collect::<BTreeMap<_, _>>()))
    }
}

impl<V> Tracked<V> {
    pub(super) fn touch(&mut self, k: &str) {
        if !self.all && !self.touched.contains(k) {
            self.touched.insert(k.to_owned());
        }
    }

    /// The entry `k`, for change.
    pub fn get_mut(&mut self, k: &str) -> Option<&mut V> {
        if self.map.contains_key(k) {
            self.touch(k);
        }
        self.map.get_mut(k)
    }

    /// The entry `k`, for a change that need not reach the journal at once: it is written
    /// with the next record that touches the entry, or the next compaction. Only for fields
    /// that are refreshed continuously and whose loss in a crash costs nothing (the time of
    /// the last heartbeat, its step and progress): a heartbeat would otherwise put its worker
    /// into every record.
    pub fn get_mut_unjournaled(&mut self, k: &str) -> Option<&mut V> {
        self.map.get_mut(k)
    }

    /// The entry `k`, for change or insertion.
    pub fn entry(&mut self, k: String) -> std::collections::btree_map::Entry<'_, String, V> {
        self.touch(&k);
        self.map.entry(k)
    }

    /// Sets the entry `k`.
    pub fn insert(&mut self, k: String, v: V) -> Option<V> {
        self.touch(&k);
        self.map.insert(k, v)
    }

    /// Every entry, for change (all of them go into the next record).
    pub fn values_mut(&mut self) -> std::collections::btree_map::ValuesMut<'_, String, V> {
        self.all = true;
        self.map.values_mut()
    }

    /// Every entry with its key, for change (all of them go into the next record).
    pub fn iter_mut(&mut self) -> std::collections::btree_map::IterMut<'_, String, V> {
        self.all = true;
        self.map.iter_mut()
    }

    /// Forgets what was touched: it is on disk.
    pub(super) fn settle(&mut self) {
        self.touched.clear();
        self.all = false;
    }

    /// Whether anything was touched since the last record.
    pub(super) fn is_touched(&self) -> bool {
        self.all || !self.touched.is_empty()
    }

    /// Applies a record's entries without marking them.
    pub(super) fn apply(&mut self, entries: BTreeMap<String, V>) {
        self.map.extend(entries);
    }
}

/// The execution log: the last [`EXECUTION_LOG_LIMIT`] entries, remembering how many were
/// added since the last journal record.
#[derive(Debug, Clone, Default)]
pub struct ExecutionLog {
    pub(super) entries: VecDeque<LogEntry>,
    pub(super) fresh: usize,
}

impl Deref for ExecutionLog {
    type Target = VecDeque<LogEntry>;
    fn deref(&self) -> &Self::Target {
        &self.entries
    }
}

impl PartialEq for ExecutionLog {
    fn eq(&self, other: &Self) -> bool {
        self.entries == other.entries
    }
}

impl Serialize for ExecutionLog {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.entries.serialize(s)
    }
}

impl<'de> Deserialize<'de> for ExecutionLog {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Self {
            entries: VecDeque::deserialize(d)?,
            fresh: 0,
        })
    }
}

impl From<Vec<LogEntry>> for ExecutionLog {
    fn from(entries: Vec<LogEntry>) -> Self {
        Self {
            entries: entries.into(),
            fresh: 0,
        }
    }
}

impl ExecutionLog {
    /// Appends an entry, dropping the oldest past the limit.
    pub fn push(&mut self, entry: LogEntry) {
        self.entries.push_back(entry);
        self.fresh += 1;
        self.trim();
    }

    pub(super) fn trim(&mut self) {
        while self.entries.len() > EXECUTION_LOG_LIMIT {
            self.entries.pop_front();
        }
    }

    /// The entries added since the last record (those still kept).
    pub(super) fn fresh(&self) -> impl Iterator<Item = &LogEntry> + Clone {
        let n = self.fresh.min(self.entries.len());
        self.entries.iter().skip(self.entries.len() - n)
    }

    pub(super) fn apply(&mut self, entries: Vec<LogEntry>) {
        self.entries.extend(entries);
        self.trim();
    }
}
