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

mod doc;
pub mod journal;
mod store;

use std::collections::HashMap;
use std::fs::{self};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::domain::{Mode, RushState};
pub use doc::*;
pub use journal::{Journal, Saved};
pub use store::{StateStore, StoreError, write_atomic};
use store::{io, temp_with};

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

/// One worker's compatible files, to be written.
#[derive(Debug)]
struct WorkerFiles {
    dir: PathBuf,
    worker: u32,
    heartbeat: serde_json::Value,
    progress: Option<serde_json::Value>,
}

/// Writes workers' compatible files in the background, each at most once per window: every
/// heartbeat (a worker sends a few at each step change) used to be a temp file created and
/// renamed in the state directory on a thread of its own, and with 16 workers those creations
/// contended for the directory's lock and ext4's inode allocation, a third of zergd's time in
/// the throughput bench. Now an update that finds the writer idle is written at once, and the
/// updates that arrive within the window after a write are folded (the newest heartbeat, and
/// the newest progress, of each worker) and written in one blocking job when it ends.
#[derive(Debug, Clone)]
pub struct WorkerFileWriter {
    tx: tokio::sync::mpsc::Sender<WorkerFiles>,
}

impl WorkerFileWriter {
    /// Starts the writer on the current tokio runtime.
    pub fn spawn(window: Duration) -> Self {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<WorkerFiles>(4096);
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut due: HashMap<(PathBuf, u32), WorkerFiles> = HashMap::new();
                let mut fold = |f: WorkerFiles| {
                    let key = (f.dir.clone(), f.worker);
                    match due.get_mut(&key) {
                        Some(d) => {
                            d.heartbeat = f.heartbeat;
                            if f.progress.is_some() {
                                d.progress = f.progress;
                            }
                        }
                        None => {
                            due.insert(key, f);
                        }
                    }
                };
                fold(first);
                while let Ok(f) = rx.try_recv() {
                    fold(f);
                }
                let batch: Vec<WorkerFiles> = due.into_values().collect();
                let _ = tokio::task::spawn_blocking(move || {
                    for f in batch {
                        write_worker_files(&f.dir, f.worker, &f.heartbeat, f.progress.as_ref());
                    }
                })
                .await;
                // What arrives meanwhile waits for the window to pass, and is folded then.
                tokio::time::sleep(window).await;
            }
        });
        WorkerFileWriter { tx }
    }

    /// Queues a worker's files. When the queue is full (the disk has not kept up with 4,096
    /// updates) the update is dropped: the files are advisory, and the next one carries the
    /// newest state.
    pub fn write(
        &self,
        dir: PathBuf,
        worker: u32,
        heartbeat: serde_json::Value,
        progress: Option<serde_json::Value>,
    ) {
        let _ = self.tx.try_send(WorkerFiles {
            dir,
            worker,
            heartbeat,
            progress,
        });
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
    use crate::domain::TaskStatus;

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

    #[tokio::test(start_paused = true)]
    async fn worker_files_in_one_window_are_written_once_with_the_newest_of_each() {
        let dir = tempfile::tempdir().unwrap();
        let w = WorkerFileWriter::spawn(Duration::from_millis(500));
        let d = dir.path().to_path_buf();
        let read = |name: &str| fs::read_to_string(dir.path().join(name)).ok();
        // An idle writer writes at once.
        w.write(d.clone(), 1, serde_json::json!({"n": 0}), None);
        while read("heartbeat-1.json").is_none() {
            tokio::task::yield_now().await;
        }
        assert_eq!(read("heartbeat-1.json").unwrap(), "{\"n\":0}\n");
        // Then what arrives within the window is folded, and written when the window ends.
        w.write(
            d.clone(),
            1,
            serde_json::json!({"n": 1}),
            Some(serde_json::json!({"p": 1})),
        );
        w.write(d.clone(), 1, serde_json::json!({"n": 2}), None);
        w.write(d.clone(), 2, serde_json::json!({"n": 9}), None);
        w.write(d.clone(), 1, serde_json::json!({"n": 3}), None);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(read("heartbeat-2.json"), None, "not before the window ends");
        while read("heartbeat-2.json").is_none() || read("progress-1.json").is_none() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(read("heartbeat-1.json").unwrap(), "{\"n\":3}\n");
        assert_eq!(read("progress-1.json").unwrap(), "{\"p\":1}\n");
        assert_eq!(read("heartbeat-2.json").unwrap(), "{\"n\":9}\n");
        assert_eq!(read("progress-2.json"), None);
        // No temp file is left behind.
        let names: Vec<String> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 3, "{names:?}");
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
