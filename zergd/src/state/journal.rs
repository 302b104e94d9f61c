//! The state journal: persistence in proportion to the change.
//!
//! Rewriting the whole state document after every batch of events costs as much as the graph
//! is large (5 MiB per save at 10,000 tasks), however little changed. Instead, each batch
//! appends one record to `<feature>.journal` holding only what changed since the previous
//! record: the tasks, workers and levels touched, the new `execution_log` entries, and the
//! document's scalar fields when any of them changed. The record is fsynced before anyone is
//! told about the change, exactly as the whole-file save was.
//!
//! The journal is folded into the compatible `<feature>.json` (a *compaction*, the crash-safe
//! whole-file write) when the rush starts or is reloaded, when the rush changes state (paused,
//! complete, …), when zergd shuts down, when the journal has grown past twice the document's
//! size (at least 1 MiB), and when a level starts: always for a document under 1 MiB (about
//! 1,400 tasks), for a larger one once the journal is as large as the document. So the
//! original's tools, which read only `<feature>.json`, see every level boundary of an ordinary
//! rush and the final state of every rush; during a very large one the file may be a few levels
//! behind (at 10,000 tasks a level adds about a tenth of the document to the journal, and a
//! whole write at every level start would be most of what is written).
//!
//! **Record format.** One line per record: 16 hex digits (the first 8 bytes of the SHA-256 of
//! the JSON that follows), a space, a JSON object, a newline. The object has `rush` (the rush
//! id, so a journal left by an earlier rush of the same feature is never applied), `seq`
//! (consecutive from 1 per rush), optional `head` (the scalar fields), `tasks`, `workers`,
//! `levels` (changed entries, whole) and `log` (new execution-log entries).
//!
//! **Recovery.** The document records, in `rush.journal_seq`, the last record folded into it.
//! Loading replays the records after it, in order, and stops at the first line that is torn
//! (no newline), fails its checksum or does not parse, or whose `seq` does not follow: such a
//! line was never acknowledged. At compaction the journal is renamed to `<feature>.journal.prev`
//! after the new document is in place, so a document restored from `<feature>.json.bak` (the
//! generation before) replays `.prev` and then the journal and loses nothing either. A crash at
//! any step of a compaction leaves a document and records that replay to the same state.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::doc::{
    FORMAT_VERSION, LevelState, LogEntry, RushMeta, StateDoc, TaskState, Tracked, WorkerState,
};
use super::store::{StateStore, StoreError, io, parse_doc, sync_dir};
use crate::domain::RushState;

/// Loading a state document replays its journal: the store's reads live here, beside the
/// replay.
impl StateStore {
    /// Loads the document, falling back to the backup if the main file is corrupt.
    /// Returns `Ok(None)` when there is no state file.
    pub fn load(&self) -> Result<Option<StateDoc>, StoreError> {
        Ok(self.load_noting_backup()?.map(|(d, _)| d))
    }

    /// [`StateStore::load`], also saying what was out of the ordinary: a corrupt, truncated
    /// or empty state file falls back to `<feature>.json.bak`, the previous generation, and a
    /// journal record that cannot be trusted ends the replay (see [`crate::state::journal`]). A file from a
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
        let replayed = replay(self, &mut doc, note.is_some());
        let note = match (note, replayed) {
            (Some(a), Some(b)) => Some(format!("{a}; {b}")),
            (a, b) => a.or(b),
        };
        if let Some(n) = &note {
            tracing::warn!("{n}");
        }
        Ok(Some((doc, note)))
    }

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

/// The journal is compacted once it is larger than this and than twice the last document.
const COMPACT_MIN_BYTES: u64 = 1 << 20;

/// The document's scalar fields: what a record carries in `head` when any of them changed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Head {
    format_version: u32,
    feature: String,
    started_at: String,
    current_level: u32,
    metrics: Option<serde_json::Value>,
    paused: bool,
    error: Option<String>,
    rush: RushMeta,
}

impl Head {
    fn of(doc: &StateDoc) -> Head {
        Head {
            format_version: doc.format_version,
            feature: doc.feature.clone(),
            started_at: doc.started_at.clone(),
            current_level: doc.current_level,
            metrics: doc.metrics.clone(),
            paused: doc.paused,
            error: doc.error.clone(),
            // The journal position changes with every record; it is not part of the head.
            rush: RushMeta {
                journal_seq: 0,
                ..doc.rush.clone()
            },
        }
    }

    /// Whether these are `doc`'s head fields, compared in place: a record copies the head only
    /// when it changed (a level start, a pause, a counter), not at every save.
    fn is_of(&self, doc: &mut StateDoc) -> bool {
        let Head {
            format_version,
            feature,
            started_at,
            current_level,
            metrics,
            paused,
            error,
            rush,
        } = self;
        // The journal position is not part of the head (see `of`).
        let seq = std::mem::replace(&mut doc.rush.journal_seq, 0);
        let same = *format_version == doc.format_version
            && *feature == doc.feature
            && *started_at == doc.started_at
            && *current_level == doc.current_level
            && *metrics == doc.metrics
            && *paused == doc.paused
            && *error == doc.error
            && *rush == doc.rush;
        doc.rush.journal_seq = seq;
        same
    }

    fn apply(self, doc: &mut StateDoc) {
        doc.format_version = self.format_version;
        doc.feature = self.feature;
        doc.started_at = self.started_at;
        doc.current_level = self.current_level;
        doc.metrics = self.metrics;
        doc.paused = self.paused;
        doc.error = self.error;
        // The journal position is the reader's, not the record's.
        let seq = doc.rush.journal_seq;
        doc.rush = self.rush;
        doc.rush.journal_seq = seq;
    }
}

/// One record as read back.
#[derive(Debug, Deserialize)]
struct Record {
    rush: String,
    seq: u64,
    #[serde(default)]
    head: Option<Head>,
    #[serde(default)]
    tasks: BTreeMap<String, TaskState>,
    #[serde(default)]
    workers: BTreeMap<String, WorkerState>,
    #[serde(default)]
    levels: BTreeMap<String, LevelState>,
    #[serde(default)]
    log: Vec<LogEntry>,
}

fn checksum(json: &[u8]) -> String {
    let d = Sha256::digest(json);
    d[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `,"name":{…}` with the touched entries of `map`.
fn section<V: Serialize>(
    out: &mut Vec<u8>,
    name: &str,
    map: &Tracked<V>,
) -> Result<(), serde_json::Error> {
    if !map.is_touched() {
        return Ok(());
    }
    out.extend_from_slice(b",\"");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\":{");
    let mut first = true;
    let mut put = |out: &mut Vec<u8>, k: &String, v: &V| -> Result<(), serde_json::Error> {
        if !first {
            out.push(b',');
        }
        first = false;
        serde_json::to_writer(&mut *out, k)?;
        out.push(b':');
        serde_json::to_writer(&mut *out, v)
    };
    if map.all {
        for (k, v) in &map.map {
            put(out, k, v)?;
        }
    } else {
        for k in &map.touched {
            if let Some(v) = map.map.get(k) {
                put(out, k, v)?;
            }
        }
    }
    out.push(b'}');
    Ok(())
}

/// What the journal writer knows of what is on disk, for one rush.
#[derive(Debug)]
pub struct Journal {
    store: StateStore,
    file: Option<File>,
    /// Last record written (or folded into the document).
    seq: u64,
    /// Size of the journal file.
    bytes: u64,
    /// Size of the document at the last compaction.
    doc_bytes: u64,
    /// `head` as of the last record or compaction.
    head: Option<Head>,
    /// Level and rush state at the last compaction.
    compacted_at: Option<(u32, RushState)>,
    /// The next save must be a compaction (first save, or after a failed append).
    must_compact: bool,
}

/// How a save went to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saved {
    /// One journal record of this many bytes.
    Record(u64),
    /// The whole document.
    Compacted,
}

impl Journal {
    /// The writer for a rush whose document holds everything up to record `seq` (its
    /// `rush.journal_seq`). The first save is a compaction.
    pub fn new(store: StateStore, seq: u64) -> Journal {
        Journal {
            store,
            file: None,
            seq,
            bytes: 0,
            doc_bytes: 0,
            head: None,
            compacted_at: None,
            must_compact: true,
        }
    }

    /// Saves what changed in `doc` since the last save: one record, or a compaction when one
    /// is due (see the module documentation).
    pub fn save(&mut self, doc: &mut StateDoc) -> Result<Saved, StoreError> {
        let level_changed = self.compacted_at.map(|(l, _)| l) != Some(doc.current_level);
        let state_changed = self.compacted_at.map(|(_, s)| s) != Some(doc.rush.state);
        // A level start compacts a document under 1 MiB every time (the compatible file is
        // exact at each level boundary), a larger one once the journal is as large as it: so
        // whole writes never cost more than the records since the last one.
        let level_due =
            level_changed && (self.doc_bytes < COMPACT_MIN_BYTES || self.bytes >= self.doc_bytes);
        let due = self.must_compact
            || state_changed
            || level_due
            || self.bytes > COMPACT_MIN_BYTES.max(2 * self.doc_bytes);
        if due {
            self.compact(doc)?;
            return Ok(Saved::Compacted);
        }
        self.append(doc).map(Saved::Record)
    }

    /// Folds everything into the whole document now (shutdown), if anything is in the journal.
    pub fn compact_if_journaled(&mut self, doc: &mut StateDoc) -> Result<(), StoreError> {
        if self.bytes > 0 || self.must_compact {
            self.compact(doc)?;
        }
        Ok(())
    }

    fn append(&mut self, doc: &mut StateDoc) -> Result<u64, StoreError> {
        let path = self.store.journal_path();
        let head = match &self.head {
            Some(h) if h.is_of(doc) => None,
            _ => Some(Head::of(doc)),
        };
        let seq = self.seq + 1;
        let mut json = Vec::with_capacity(1024);
        let ser = |e: serde_json::Error| StoreError::Io {
            op: "serialise",
            path: path.clone(),
            source: std::io::Error::other(e),
        };
        json.extend_from_slice(b"{\"rush\":");
        serde_json::to_writer(&mut json, &doc.rush.rush_id).map_err(ser)?;
        write!(json, ",\"seq\":{seq}").map_err(io("write", &path))?;
        if let Some(head) = &head {
            json.extend_from_slice(b",\"head\":");
            serde_json::to_writer(&mut json, head).map_err(ser)?;
        }
        section(&mut json, "tasks", &doc.tasks).map_err(ser)?;
        section(&mut json, "workers", &doc.workers).map_err(ser)?;
        section(&mut json, "levels", &doc.levels).map_err(ser)?;
        if doc.execution_log.fresh > 0 {
            json.extend_from_slice(b",\"log\":");
            let fresh: Vec<&LogEntry> = doc.execution_log.fresh().collect();
            serde_json::to_writer(&mut json, &fresh).map_err(ser)?;
        }
        json.push(b'}');
        let mut line = Vec::with_capacity(json.len() + 18);
        line.extend_from_slice(checksum(&json).as_bytes());
        line.push(b' ');
        line.extend_from_slice(&json);
        line.push(b'\n');

        let written = self.write_line(&path, &line);
        if written.is_err() {
            // Part of the line may be in the file; nothing may follow it. What was touched is
            // no longer known either: the next save writes the whole document.
            self.file = None;
            self.must_compact = true;
        }
        written?;
        self.seq = seq;
        doc.rush.journal_seq = seq;
        self.bytes += line.len() as u64;
        if head.is_some() {
            self.head = head;
        }
        settle(doc);
        Ok(line.len() as u64)
    }

    fn write_line(&mut self, path: &Path, line: &[u8]) -> Result<(), StoreError> {
        if self.file.is_none() {
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(io("open", path))?;
            // A new directory entry is durable only once the directory is.
            sync_dir(&self.store.dir)?;
            self.file = Some(f);
        }
        let f = self.file.as_mut().expect("opened above");
        f.write_all(line).map_err(io("append to", path))?;
        f.sync_data().map_err(io("fsync", path))
    }

    /// Writes the whole document (crash-safe), then retires the journal to `.prev`.
    fn compact(&mut self, doc: &mut StateDoc) -> Result<(), StoreError> {
        doc.format_version = FORMAT_VERSION;
        doc.rush.journal_seq = self.seq;
        let written = self.store.save(doc)?;
        self.retire()?;
        self.bytes = 0;
        self.doc_bytes = written;
        self.head = Some(Head::of(doc));
        self.compacted_at = Some((doc.current_level, doc.rush.state));
        self.must_compact = false;
        settle(doc);
        Ok(())
    }

    /// The second step of a compaction: the records now in the document move to `.prev`.
    fn retire(&mut self) -> Result<(), StoreError> {
        self.file = None;
        let path = self.store.journal_path();
        if path.exists() {
            let prev = prev_path(&path);
            fs::rename(&path, &prev).map_err(io("rename", &path))?;
            sync_dir(&self.store.dir)?;
        }
        Ok(())
    }
}

fn settle(doc: &mut StateDoc) {
    doc.tasks.settle();
    doc.workers.settle();
    doc.levels.settle();
    doc.execution_log.fresh = 0;
}

fn prev_path(journal: &Path) -> PathBuf {
    let mut p = journal.as_os_str().to_owned();
    p.push(".prev");
    PathBuf::from(p)
}

/// Replays the journal onto a document just loaded. `from_backup` says the document is the
/// generation before the last compaction, so `.prev` is replayed first. Returns a note when
/// records had to be left out.
pub(super) fn replay(store: &StateStore, doc: &mut StateDoc, from_backup: bool) -> Option<String> {
    let journal = store.journal_path();
    let mut files = Vec::new();
    if from_backup {
        files.push(prev_path(&journal));
    }
    files.push(journal);
    let mut notes = Vec::new();
    for path in files {
        let Ok(bytes) = fs::read(&path) else { continue };
        // A damaged `.prev` does not end the replay: the journal after it goes on only if its
        // first record follows what was applied, and says so when it does not.
        if let Err(why) = replay_file(&bytes, doc) {
            notes.push(format!("{}: {why}", path.display()));
        }
    }
    (!notes.is_empty()).then(|| notes.join("; "))
}

/// Applies the records of one journal file that follow the document; stops at the first one
/// that cannot be trusted and says why.
fn replay_file(bytes: &[u8], doc: &mut StateDoc) -> Result<(), String> {
    let mut rest = bytes;
    let mut line_no = 0usize;
    while !rest.is_empty() {
        line_no += 1;
        let Some(end) = rest.iter().position(|b| *b == b'\n') else {
            // Torn by a crash during the append: never acknowledged.
            return Err(format!(
                "line {line_no} is torn (no newline); it was left out"
            ));
        };
        let line = &rest[..end];
        rest = &rest[end + 1..];
        let later = rest.iter().filter(|b| **b == b'\n').count();
        let lost = |what: String| {
            if later == 0 {
                format!("line {line_no} {what}; it was left out")
            } else {
                format!("line {line_no} {what}; it and the {later} line(s) after it were left out")
            }
        };
        let (sum, json) = match line.split_first_chunk::<16>() {
            Some((sum, json)) if json.first() == Some(&b' ') => (sum, &json[1..]),
            _ => return Err(lost("has no checksum".into())),
        };
        if checksum(json).as_bytes() != sum {
            return Err(lost("fails its checksum".into()));
        }
        let rec: Record =
            serde_json::from_slice(json).map_err(|e| lost(format!("does not parse ({e})")))?;
        if rec.rush != doc.rush.rush_id || rec.seq <= doc.rush.journal_seq {
            // An earlier rush of this feature, or already in the document.
            continue;
        }
        if rec.seq != doc.rush.journal_seq + 1 {
            return Err(lost(format!(
                "is record {} where {} was expected",
                rec.seq,
                doc.rush.journal_seq + 1
            )));
        }
        if let Some(h) = rec.head {
            if h.format_version > FORMAT_VERSION {
                return Err(lost(format!(
                    "has format_version {}, newer than this zergd understands",
                    h.format_version
                )));
            }
            h.apply(doc);
        }
        doc.tasks.apply(rec.tasks);
        doc.workers.apply(rec.workers);
        doc.levels.apply(rec.levels);
        doc.execution_log.apply(rec.log);
        doc.rush.journal_seq = rec.seq;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::TaskStatus;

    fn store(dir: &Path) -> StateStore {
        StateStore::new(dir, "f")
    }

    fn doc(tasks: usize) -> StateDoc {
        let mut d = StateDoc {
            format_version: FORMAT_VERSION,
            feature: "f".into(),
            ..Default::default()
        };
        d.rush.rush_id = "r1".into();
        d.rush.state = RushState::Running;
        for i in 0..tasks {
            d.tasks.insert(
                format!("T-L1-{i:03}"),
                TaskState {
                    level: Some(1),
                    title: "x".repeat(200),
                    ..Default::default()
                },
            );
        }
        d
    }

    /// One step of a rush: a task changes, a worker heartbeats, an event is logged.
    fn step(d: &mut StateDoc, i: usize) {
        let id = format!("T-L1-{:03}", i % d.tasks.len());
        let t = d.tasks.get_mut(&id).unwrap();
        t.status = TaskStatus::InProgress;
        t.leases += 1;
        d.workers
            .entry((i % 3).to_string())
            .or_default()
            .progress_pct = i as u32;
        d.log(
            format!("t{i}"),
            "task_claimed",
            serde_json::json!({ "i": i }),
        );
        if i.is_multiple_of(7) {
            d.rush.resilience.task_reassignments += 1;
        }
    }

    /// A journal in a fresh directory whose rush of `tasks` tasks has had its first (whole)
    /// save.
    fn started(tasks: usize) -> (tempfile::TempDir, Journal, StateDoc) {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::new(store(dir.path()), 0);
        let mut d = doc(tasks);
        j.save(&mut d).unwrap();
        (dir, j, d)
    }

    fn load(dir: &Path) -> StateDoc {
        store(dir).load().unwrap().unwrap()
    }

    #[test]
    fn a_map_of_the_document_keeps_the_last_of_two_equal_keys_as_inserting_does() {
        use super::super::doc::Tracked;
        let t: Tracked<u32> = serde_json::from_str(r#"{"b": 1, "a": 2, "b": 3, "c": 4}"#).unwrap();
        let read: Vec<(&str, u32)> = t.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(read, [("a", 2), ("b", 3), ("c", 4)]);
        let err = serde_json::from_str::<Tracked<u32>>("[1]").unwrap_err();
        assert!(err.to_string().contains("a map"), "{err}");
        // A bad value is refused with its place in the file.
        let err = serde_json::from_str::<Tracked<u32>>("{\n\"a\": \"x\"}").unwrap_err();
        assert_eq!(err.line(), 2, "{err}");
    }

    #[test]
    fn a_record_holds_only_what_changed_and_replays_to_the_same_document() {
        let dir = tempfile::tempdir().unwrap();
        let mut j = Journal::new(store(dir.path()), 0);
        let mut d = doc(1000);
        assert_eq!(j.save(&mut d).unwrap(), Saved::Compacted);
        let whole = fs::metadata(store(dir.path()).path()).unwrap().len();
        for i in 0..50 {
            step(&mut d, i);
            match j.save(&mut d).unwrap() {
                Saved::Record(n) => assert!(
                    n < 2048 && n * 100 < whole,
                    "record {i} is {n} bytes, the document {whole}"
                ),
                Saved::Compacted => panic!("no compaction is due at step {i}"),
            }
            assert_eq!(load(dir.path()), d, "after step {i}");
        }
        // Nothing changed: the record is tiny and still applies.
        assert!(matches!(j.save(&mut d).unwrap(), Saved::Record(n) if n < 100));
        assert_eq!(load(dir.path()), d);
    }

    #[test]
    fn level_and_state_changes_compact_and_retire_the_journal() {
        let (dir, mut j, mut d) = started(10);
        step(&mut d, 1);
        j.save(&mut d).unwrap();
        d.current_level = 2;
        assert_eq!(j.save(&mut d).unwrap(), Saved::Compacted);
        let on_disk: StateDoc =
            serde_json::from_slice(&fs::read(store(dir.path()).path()).unwrap()).unwrap();
        assert_eq!(on_disk, d, "the compatible file alone holds the state");
        assert_eq!(on_disk.rush.journal_seq, 1);
        assert!(!dir.path().join("f.journal").exists());
        assert!(dir.path().join("f.journal.prev").exists());
        d.rush.state = RushState::Complete;
        assert_eq!(j.save(&mut d).unwrap(), Saved::Compacted);
        assert_eq!(load(dir.path()), d);
    }

    #[test]
    fn a_large_document_is_compacted_at_a_level_start_once_the_journal_is_as_large() {
        let (dir, mut j, mut d) = started(3000);
        assert!(j.doc_bytes > COMPACT_MIN_BYTES, "{} bytes", j.doc_bytes);
        step(&mut d, 0);
        d.current_level = 2;
        assert!(
            matches!(j.save(&mut d).unwrap(), Saved::Record(_)),
            "a small journal is not folded into a large document at a level start"
        );
        let mut i = 1;
        while j.bytes < j.doc_bytes {
            step(&mut d, i);
            i += 1;
            assert!(matches!(j.save(&mut d).unwrap(), Saved::Record(_)));
        }
        d.current_level = 3;
        assert_eq!(j.save(&mut d).unwrap(), Saved::Compacted);
        assert_eq!(load(dir.path()), d);
    }

    #[test]
    fn the_journal_is_compacted_past_twice_the_document() {
        let (dir, mut j, mut d) = started(5);
        let mut compactions = 0;
        for i in 0..20_000 {
            step(&mut d, i);
            if j.save(&mut d).unwrap() == Saved::Compacted {
                compactions += 1;
            }
            assert!(j.bytes <= COMPACT_MIN_BYTES + 4096, "bounded at {i}");
        }
        assert!(compactions >= 1, "{compactions}");
        assert_eq!(load(dir.path()), d);
    }

    #[test]
    fn a_journal_cut_anywhere_replays_every_record_before_the_cut() {
        let (dir, mut j, mut d) = started(8);
        let mut states = vec![d.clone()];
        let mut ends = vec![0usize];
        for i in 0..12 {
            step(&mut d, i);
            j.save(&mut d).unwrap();
            states.push(d.clone());
            ends.push(fs::metadata(dir.path().join("f.journal")).unwrap().len() as usize);
        }
        let full = fs::read(dir.path().join("f.journal")).unwrap();
        for cut in 0..=full.len() {
            fs::write(dir.path().join("f.journal"), &full[..cut]).unwrap();
            let whole = ends.iter().rposition(|e| *e <= cut).unwrap();
            let (got, note) = store(dir.path()).load_noting_backup().unwrap().unwrap();
            assert_eq!(got, states[whole], "cut at byte {cut}");
            assert_eq!(
                note.is_some(),
                cut != ends[whole],
                "a torn tail is named, at byte {cut}: {note:?}"
            );
        }
    }

    #[test]
    fn a_damaged_record_is_named_and_nothing_after_it_is_applied() {
        let (dir, mut j, mut d) = started(8);
        step(&mut d, 0);
        j.save(&mut d).unwrap();
        let after_one = d.clone();
        for i in 1..4 {
            step(&mut d, i);
            j.save(&mut d).unwrap();
        }
        let path = dir.path().join("f.journal");
        let text = fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        // A flipped character in record 2 fails its checksum.
        let bad = lines[1].replacen("task_claimed", "task_clamed", 1);
        fs::write(
            &path,
            format!("{}\n{bad}\n{}\n{}\n", lines[0], lines[2], lines[3]),
        )
        .unwrap();
        let (got, note) = store(dir.path()).load_noting_backup().unwrap().unwrap();
        assert_eq!(got, after_one);
        let note = note.unwrap();
        assert!(
            note.contains("f.journal: line 2 fails its checksum")
                && note.contains("2 line(s) after it"),
            "{note}"
        );
        // Records out of order are refused the same way.
        fs::write(&path, format!("{}\n{}\n", lines[0], lines[2])).unwrap();
        let (got, note) = store(dir.path()).load_noting_backup().unwrap().unwrap();
        assert_eq!(got, after_one);
        assert!(note.unwrap().contains("is record 3 where 2 was expected"));
    }

    #[test]
    fn a_journal_of_an_earlier_rush_of_the_feature_is_not_applied() {
        let (dir, mut j, mut d) = started(8);
        step(&mut d, 0);
        j.save(&mut d).unwrap();
        // A new rush of the same feature whose first save was cut off after the document was
        // written, before the old journal was retired.
        let mut fresh = doc(8);
        fresh.rush.rush_id = "r2".into();
        store(dir.path()).save(&fresh).unwrap();
        assert!(dir.path().join("f.journal").exists());
        assert_eq!(load(dir.path()), fresh);
    }

    #[test]
    fn a_crash_at_any_step_of_a_compaction_loses_nothing() {
        for from_backup in [false, true] {
            let (dir, mut j, mut d) = started(8);
            for i in 0..3 {
                step(&mut d, i);
                j.save(&mut d).unwrap();
            }
            d.current_level = 2;
            j.save(&mut d).unwrap(); // compaction: .bak = seq 0, .prev = 1..3
            for i in 3..6 {
                step(&mut d, i);
                j.save(&mut d).unwrap(); // records 4..6
            }
            // The next compaction stops after the document is written, before the journal
            // is retired: the document holds 1..6, the journal still 4..6.
            d.current_level = 3;
            d.rush.journal_seq = j.seq;
            store(dir.path()).save(&d).unwrap();
            if from_backup {
                // And the new document is then lost: the backup holds 1..3, `.prev` 1..3,
                // the journal 4..6.
                fs::write(store(dir.path()).path(), b"{\"tasks\": {").unwrap();
                let mut want = d.clone();
                want.current_level = 2;
                let (got, note) = store(dir.path()).load_noting_backup().unwrap().unwrap();
                assert_eq!(got.tasks, want.tasks);
                assert_eq!(got.execution_log, want.execution_log);
                assert_eq!(got.rush.journal_seq, 6);
                assert!(note.unwrap().contains("f.json.bak"));
            } else {
                assert_eq!(load(dir.path()), d);
                // Writing goes on where it left off.
                let mut j = Journal::new(store(dir.path()), 6);
                let mut d2 = load(dir.path());
                assert_eq!(j.save(&mut d2).unwrap(), Saved::Compacted);
                step(&mut d2, 9);
                j.save(&mut d2).unwrap();
                assert_eq!(load(dir.path()), d2);
            }
        }
    }

    #[test]
    fn a_restore_from_the_backup_goes_past_a_torn_tail_of_the_previous_journal() {
        let (dir, mut j, mut d) = started(8);
        for i in 0..3 {
            step(&mut d, i);
            j.save(&mut d).unwrap();
        }
        // A crash tore an append after record 3; the restarted zergd compacted (seq 3), so
        // the torn journal became `.prev`, and went on writing records 4 and 5.
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.path().join("f.journal"))
            .unwrap();
        f.write_all(b"0123456789abcdef {\"rush\":\"r1\",\"se")
            .unwrap();
        let mut d = load(dir.path());
        let mut j = Journal::new(store(dir.path()), d.rush.journal_seq);
        j.save(&mut d).unwrap();
        for i in 3..5 {
            step(&mut d, i);
            j.save(&mut d).unwrap();
        }
        // Then the state file is lost: the backup (seq 0), `.prev` (1..3 and the torn tail)
        // and the journal (4, 5) still make the whole state.
        fs::write(store(dir.path()).path(), b"").unwrap();
        let (got, note) = store(dir.path()).load_noting_backup().unwrap().unwrap();
        assert_eq!(got.tasks, d.tasks);
        assert_eq!(got.execution_log, d.execution_log);
        assert_eq!(got.rush.journal_seq, 5);
        let note = note.unwrap();
        assert!(note.contains("f.journal.prev: line 4 is torn"), "{note}");
    }

    #[test]
    fn a_failed_append_makes_the_next_save_a_compaction() {
        let (dir, mut j, mut d) = started(8);
        // The journal cannot be created: a directory stands in its way.
        fs::create_dir(dir.path().join("f.journal")).unwrap();
        step(&mut d, 0);
        assert!(j.save(&mut d).is_err());
        fs::remove_dir(dir.path().join("f.journal")).unwrap();
        step(&mut d, 1);
        assert_eq!(j.save(&mut d).unwrap(), Saved::Compacted);
        assert_eq!(load(dir.path()), d);
    }
}
