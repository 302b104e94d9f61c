//! Persisted rush state: `.zerg/state/<feature>.json`.
//!
//! The document keeps the original ZERG's shape (`feature`, `current_level`,
//! `tasks`, `workers`, `levels`, `execution_log`, `paused`, `error`, string keys for worker ids
//! and levels) and adds `format_version`, each task's `level`, and a `rush` section with what
//! zergd needs to resume after a restart.
//!
//! Between whole writes, changes go to an append-only journal, `<feature>.journal` (see
//! [`journal`]), so that a save costs what changed, not what the graph holds.
//!
//! Whole writes are crash-safe: the new document goes to a temp file in the same directory,
//! which is fsynced and renamed over the old one, then the directory is fsynced. The previous
//! document is kept as `<feature>.json.bak` (a hard link, so there is no window without a state
//! file). Every whole write holds an exclusive `flock` on the separate `<feature>.lock`, the
//! lock the original's tools take.

pub mod journal;

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::domain::{LevelStatus, MergeStatus, Mode, RushState, Step, TaskStatus, WorkerStatus};
pub use journal::{ExecutionLog, Journal, Saved, Tracked};

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
    /// Appends to the execution log, dropping the oldest entries past the limit.
    pub fn log(&mut self, timestamp: String, event: &str, data: serde_json::Value) {
        self.execution_log.push(LogEntry {
            timestamp,
            event: event.to_string(),
            data,
        });
    }
}

/// A state file that could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// I/O failure.
    #[error("{op} {path}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// Which file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Neither the file nor its backup parsed.
    #[error("{path} is corrupt ({message}) and has no usable backup")]
    Corrupt {
        /// Which file.
        path: PathBuf,
        /// Parser message.
        message: String,
    },
    /// Written by a newer zergd.
    #[error(
        "{path} has format_version {found}, newer than this zergd understands ({FORMAT_VERSION})"
    )]
    TooNew {
        /// Which file.
        path: PathBuf,
        /// Version found.
        found: u32,
    },
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Reads and writes one feature's state file.
#[derive(Debug, Clone)]
pub struct StateStore {
    dir: PathBuf,
    feature: String,
}

impl StateStore {
    /// A store for `<state_dir>/<feature>.json`.
    pub fn new(state_dir: &Path, feature: &str) -> Self {
        Self {
            dir: state_dir.to_path_buf(),
            feature: feature.to_string(),
        }
    }

    /// Path of the state file.
    pub fn path(&self) -> PathBuf {
        self.dir.join(format!("{}.json", self.feature))
    }

    /// Path of the state journal (see [`journal`]).
    pub fn journal_path(&self) -> PathBuf {
        self.dir.join(format!("{}.journal", self.feature))
    }

    fn lock(&self) -> Result<Flock<File>, StoreError> {
        let path = self.dir.join(format!("{}.lock", self.feature));
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io("open lock", &path))?;
        Flock::lock(f, FlockArg::LockExclusive).map_err(|(_, e)| StoreError::Io {
            op: "lock",
            path,
            source: e.into(),
        })
    }

    /// Writes the whole document atomically under the lock; returns its size. Used by
    /// [`Journal`], which also keeps the journal consistent with it.
    pub fn save(&self, doc: &StateDoc) -> Result<u64, StoreError> {
        // Compact, not pretty: at 10,000 tasks the indentation alone is a third of the file,
        // and every reader parses it (`jq .` shows it indented).
        let mut bytes = serde_json::to_vec(doc).map_err(|e| StoreError::Io {
            op: "serialise",
            path: self.path(),
            source: std::io::Error::other(e),
        })?;
        bytes.push(b'\n');
        write_atomic(&self.dir, &self.path(), &bytes, Some(&|| self.lock()))?;
        Ok(bytes.len() as u64)
    }

    /// Loads the document, falling back to the backup if the main file is corrupt.
    /// Returns `Ok(None)` when there is no state file.
    pub fn load(&self) -> Result<Option<StateDoc>, StoreError> {
        Ok(self.load_noting_backup()?.map(|(d, _)| d))
    }

    /// [`StateStore::load`], also saying what was out of the ordinary: a corrupt, truncated
    /// or empty state file falls back to `<feature>.json.bak`, the previous generation, and a
    /// journal record that cannot be trusted ends the replay (see [`journal`]). A file from a
    /// newer zergd is refused, never replaced by an older backup.
    pub fn load_noting_backup(&self) -> Result<Option<(StateDoc, Option<String>)>, StoreError> {
        let path = self.path();
        let primary = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io("read", &path)(e)),
        };
        let (mut doc, note) = match parse_doc(&primary, &path) {
            Ok(d) => (d, None),
            Err(StoreError::Corrupt { message, .. }) => {
                let bak = self.dir.join(format!("{}.json.bak", self.feature));
                match fs::read(&bak).ok().map(|b| parse_doc(&b, &bak)) {
                    Some(Ok(d)) => {
                        let note = format!(
                            "{} was corrupt ({message}); resumed from the previous generation, {}, and its journal",
                            path.display(),
                            bak.display()
                        );
                        (d, Some(note))
                    }
                    _ => return Err(StoreError::Corrupt { path, message }),
                }
            }
            Err(e) => return Err(e),
        };
        self.remove_cut_off_writes();
        let replayed = journal::replay(self, &mut doc, note.is_some());
        let note = match (note, replayed) {
            (Some(a), Some(b)) => Some(format!("{a}; {b}")),
            (a, b) => a.or(b),
        };
        if let Some(n) = &note {
            tracing::warn!("{n}");
        }
        Ok(Some((doc, note)))
    }
}

impl StateStore {
    /// Removes the temp files of whole writes that a crash cut off (they are never renamed
    /// into place, so nothing reads them).
    fn remove_cut_off_writes(&self) {
        let prefix = format!(".{}.json.tmp-", self.feature);
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = fs::remove_file(e.path());
            }
        }
    }
}

fn parse_doc(bytes: &[u8], path: &Path) -> Result<StateDoc, StoreError> {
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let found = v
        .get("format_version")
        .and_then(|x| x.as_u64())
        .unwrap_or(0) as u32;
    if found > FORMAT_VERSION {
        return Err(StoreError::TooNew {
            path: path.to_path_buf(),
            found,
        });
    }
    serde_json::from_value(v).map_err(|e| StoreError::Corrupt {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

type LockFn<'a> = &'a dyn Fn() -> Result<Flock<File>, StoreError>;

/// A temporary file in `dir` holding `bytes`, fsynced when `sync`: the first half of every
/// atomic write here.
fn temp_with(
    dir: &Path,
    target: &Path,
    bytes: &[u8],
    sync: bool,
) -> Result<tempfile::NamedTempFile, StoreError> {
    // Named after the target, so that whose write was cut off can be told from what is left.
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}.tmp-"))
        .tempfile_in(dir)
        .map_err(io("create temp in", dir))?;
    tmp.write_all(bytes).map_err(io("write", target))?;
    if sync {
        tmp.as_file().sync_all().map_err(io("fsync", target))?;
    }
    Ok(tmp)
}

/// Crash-safe replace of `target` with `bytes`: temp file, fsync, hard-link backup, rename,
/// directory fsync. `lock` (if given) is held for the duration.
pub fn write_atomic(
    dir: &Path,
    target: &Path,
    bytes: &[u8],
    lock: Option<LockFn<'_>>,
) -> Result<(), StoreError> {
    fs::create_dir_all(dir).map_err(io("create", dir))?;
    let _guard = match lock {
        Some(l) => Some(l()?),
        None => None,
    };
    let tmp = temp_with(dir, target, bytes, true)?;
    if target.exists() {
        let mut bak = target.as_os_str().to_owned();
        bak.push(".bak");
        let bak = PathBuf::from(bak);
        let _ = fs::remove_file(&bak);
        // A hard link keeps the previous generation without ever leaving the target missing.
        if fs::hard_link(target, &bak).is_err() {
            let _ = fs::copy(target, &bak);
        }
    }
    tmp.persist(target)
        .map_err(|e| io("rename onto", target)(e.error))?;
    sync_dir(dir)
}

/// Makes the entries of `dir` (a new, renamed or removed file) durable.
fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("fsync directory", dir))
}

/// zergd's own list of rushes, in its XDG state directory.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
pub struct Registry {
    /// Format version.
    pub format_version: u32,
    /// Known rushes.
    pub rushes: Vec<RegistryEntry>,
}

/// One rush zergd knows about.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RegistryEntry {
    /// Rush id.
    pub rush_id: String,
    /// Absolute repository path.
    pub repo: String,
    /// Feature name.
    pub feature: String,
    /// Last known state.
    pub state: RushState,
    /// What `list` shows of an ended rush, so zergd need not load the rush to list it (empty in
    /// registries written before these fields: such a rush is loaded once to fill them).
    #[serde(default, skip_serializing_if = "Summary::is_empty")]
    pub summary: Summary,
}

/// The few facts about a rush that `zergctl list` shows.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(default)]
pub struct Summary {
    /// When it started (RFC 3339).
    pub started_at: String,
    /// When it ended (RFC 3339), empty while it runs.
    pub finished_at: String,
    /// Its number of tasks.
    pub tasks_total: u32,
    /// How many of them completed.
    pub tasks_complete: u32,
    /// Where its workers ran.
    pub mode: Mode,
}

impl Summary {
    /// Whether nothing is known (a registry entry of an older zergd).
    pub fn is_empty(&self) -> bool {
        self.started_at.is_empty()
    }
}

impl Registry {
    /// Loads the registry. A corrupt file falls back to its backup (`rushes.json.bak`); with
    /// neither, the registry starts empty and says so (the state files in each repository
    /// remain the source of truth for the rushes themselves).
    pub fn load(path: &Path) -> Registry {
        let parse = |p: &Path| -> Result<Option<Registry>, String> {
            match fs::read(p) {
                Ok(b) => serde_json::from_slice(&b)
                    .map(Some)
                    .map_err(|e| format!("{}: {e}", p.display())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(format!("{}: {e}", p.display())),
            }
        };
        match parse(path) {
            Ok(r) => r.unwrap_or_default(),
            Err(why) => {
                let mut bak = path.as_os_str().to_owned();
                bak.push(".bak");
                match parse(Path::new(&bak)) {
                    Ok(Some(r)) => {
                        tracing::warn!("the rush registry is corrupt ({why}); using its backup");
                        r
                    }
                    _ => {
                        tracing::error!(
                            "the rush registry is corrupt ({why}) and has no usable backup; starting with none"
                        );
                        Registry::default()
                    }
                }
            }
        }
    }

    /// Saves the registry atomically.
    pub fn save(&self, path: &Path) -> Result<(), StoreError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut me = self.clone();
        me.format_version = FORMAT_VERSION;
        let bytes = serde_json::to_vec_pretty(&me).map_err(|e| StoreError::Io {
            op: "serialise",
            path: path.to_path_buf(),
            source: std::io::Error::other(e),
        })?;
        write_atomic(dir, path, &bytes, None)
    }
}

/// Writes the compatible `heartbeat-<id>.json` and `progress-<id>.json` of a worker into the
/// state directory (temp file, fsync, rename). zergd writes them from what workers report over
/// gRPC, so workers never need write access to the state directory. Failures are logged: the
/// files are for compatibility, zergd's own state is authoritative.
pub fn write_worker_files(
    dir: &Path,
    worker: u32,
    heartbeat: &serde_json::Value,
    progress: Option<&serde_json::Value>,
) {
    let files = [
        (format!("heartbeat-{worker}.json"), Some(heartbeat)),
        (format!("progress-{worker}.json"), progress),
    ];
    for (name, value) in files {
        let Some(value) = value else { continue };
        let target = dir.join(&name);
        let mut bytes = serde_json::to_vec(value).unwrap_or_default();
        bytes.push(b'\n');
        // Written whole and renamed into place, so a reader never sees half a file; not
        // fsynced: the files are advisory, rewritten with every heartbeat, and a file lost to a
        // power cut is written again by the next one.
        let result = fs::create_dir_all(dir)
            .map_err(io("create", dir))
            .and_then(|()| temp_with(dir, &target, &bytes, false))
            .and_then(|tmp| {
                tmp.persist(&target)
                    .map(|_| ())
                    .map_err(|e| io("rename onto", &target)(e.error))
            });
        if let Err(e) = result {
            tracing::warn!(file = %dir.join(&name).display(), error = %e, "cannot write worker file");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> StateDoc {
        let mut d = StateDoc {
            format_version: FORMAT_VERSION,
            feature: "f".into(),
            ..Default::default()
        };
        d.tasks.insert(
            "A-L1-001".into(),
            TaskState {
                status: TaskStatus::Pending,
                level: Some(1),
                ..Default::default()
            },
        );
        d
    }

    #[test]
    fn save_then_load_round_trips_and_keeps_a_backup() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path(), "f");
        let mut d = doc();
        store.save(&d).unwrap();
        d.current_level = 2;
        store.save(&d).unwrap();
        assert_eq!(store.load().unwrap().unwrap(), d);
        let bak: StateDoc =
            serde_json::from_slice(&fs::read(dir.path().join("f.json.bak")).unwrap()).unwrap();
        assert_eq!(bak.current_level, 0);
        assert!(dir.path().join("f.lock").exists());
        // No temp files are left behind.
        let leftovers: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().contains(".tmp-"))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn corrupt_file_falls_back_to_backup() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path(), "f");
        store.save(&doc()).unwrap();
        store.save(&doc()).unwrap();
        fs::write(store.path(), b"{ truncated").unwrap();
        assert_eq!(store.load().unwrap().unwrap(), doc());
        fs::write(dir.path().join("f.json.bak"), b"").unwrap();
        assert!(matches!(store.load(), Err(StoreError::Corrupt { .. })));
    }

    #[test]
    fn truncated_empty_or_garbage_state_says_which_file_and_uses_the_backup() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path(), "f");
        let mut older = doc();
        older.current_level = 1;
        store.save(&older).unwrap();
        let mut newer = doc();
        newer.current_level = 2;
        store.save(&newer).unwrap();
        let whole = fs::read(store.path()).unwrap();
        for bad in [&whole[..whole.len() / 2], b"", b"\0\0\0\xff", b"[1, 2"] {
            fs::write(store.path(), bad).unwrap();
            let (d, note) = store.load_noting_backup().unwrap().unwrap();
            assert_eq!(d.current_level, 1, "the previous generation");
            let note = note.expect("says it used the backup");
            assert!(
                note.contains("f.json was corrupt") && note.contains("f.json.bak"),
                "{note}"
            );
        }
        // With no usable backup either, the error names the file.
        fs::write(dir.path().join("f.json.bak"), b"nope").unwrap();
        let err = store.load().unwrap_err().to_string();
        assert!(err.contains("f.json") && err.contains("corrupt"), "{err}");
    }

    #[test]
    fn a_corrupt_registry_falls_back_to_its_backup() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rushes.json");
        let entry = |id: &str| RegistryEntry {
            rush_id: id.into(),
            repo: "/r".into(),
            feature: id.into(),
            state: RushState::Running,
            summary: Summary::default(),
        };
        let mut reg = Registry::default();
        reg.rushes.push(entry("a"));
        reg.save(&path).unwrap();
        reg.rushes.push(entry("b"));
        reg.save(&path).unwrap();
        fs::write(&path, b"{\"rushes\": [").unwrap();
        assert_eq!(Registry::load(&path).rushes, vec![entry("a")]);
        fs::write(dir.path().join("rushes.json.bak"), b"").unwrap();
        assert!(Registry::load(&path).rushes.is_empty());
    }

    #[test]
    fn newer_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path(), "f");
        fs::write(store.path(), br#"{"format_version": 99}"#).unwrap();
        assert!(matches!(
            store.load(),
            Err(StoreError::TooNew { found: 99, .. })
        ));
    }

    #[test]
    fn original_state_files_load() {
        // A document as the original writes it: no format_version, no rush section.
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(dir.path(), "f");
        fs::write(
            store.path(),
            br#"{"feature":"f","started_at":"2026-01-01T00:00:00","current_level":1,
                "tasks":{"T1":{"status":"complete","worker_id":0}},"workers":{},"levels":{},
                "execution_log":[],"metrics":null,"paused":false,"error":null}"#,
        )
        .unwrap();
        let d = store.load().unwrap().unwrap();
        assert_eq!(d.tasks["T1"].status, TaskStatus::Complete);
        assert_eq!(d.tasks["T1"].level, None);
    }

    #[test]
    fn execution_log_is_bounded() {
        let mut d = doc();
        for i in 0..(EXECUTION_LOG_LIMIT + 10) {
            d.log(String::new(), "e", serde_json::json!({ "i": i }));
        }
        assert_eq!(d.execution_log.len(), EXECUTION_LOG_LIMIT);
        assert_eq!(d.execution_log[0].data["i"], 10);
    }

    #[test]
    fn a_state_file_of_the_previous_version_is_written_back_byte_identical() {
        // Written by the version whose states were plain strings (a completed demo rush).
        let old = include_bytes!("../../tests/fixtures/state-demo.json");
        let doc: StateDoc = serde_json::from_slice(old).expect("the old file loads");
        assert_eq!(doc.rush.state, RushState::Complete);
        assert!(doc.tasks.values().all(|t| t.status == TaskStatus::Complete));
        let again = serde_json::to_vec_pretty(&doc).unwrap();
        assert_eq!(
            String::from_utf8_lossy(&again),
            String::from_utf8_lossy(old),
            "written back byte for byte"
        );
    }
}
