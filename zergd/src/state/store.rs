//! Reading and writing one feature's state file, crash-safe: a temp file in the same
//! directory, fsynced and renamed over the old one, then the directory fsynced, under an
//! exclusive `flock` on the separate `<feature>.lock`.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use super::doc::{FORMAT_VERSION, StateDoc};

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

pub(super) fn io<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Reads and writes one feature's state file.
#[derive(Debug, Clone)]
pub struct StateStore {
    pub(super) dir: PathBuf,
    pub(super) feature: String,
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

    /// Path of the state journal (see [`super::journal`]).
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
    /// [`super::Journal`], which also keeps the journal consistent with it.
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
}

pub(super) fn parse_doc(bytes: &[u8], path: &Path) -> Result<StateDoc, StoreError> {
    /// Only the version, read first so that a newer format is refused by name rather than by
    /// whichever field it changed. Every other field is skipped without being built.
    #[derive(serde::Deserialize)]
    struct Version {
        #[serde(default)]
        format_version: Option<serde_json::Number>,
    }
    let corrupt = |e: serde_json::Error| StoreError::Corrupt {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let found = serde_json::from_slice::<Version>(bytes)
        .map_err(corrupt)?
        .format_version
        .and_then(|n| n.as_u64())
        .unwrap_or(0)
        .min(u64::from(u32::MAX)) as u32;
    if found > FORMAT_VERSION {
        return Err(StoreError::TooNew {
            path: path.to_path_buf(),
            found,
        });
    }
    // Straight into the typed document: no tree of JSON values first (at 10,000 tasks that
    // tree was 12.6 MB of heap on top of the document's 8.4 MB).
    serde_json::from_slice(bytes).map_err(corrupt)
}

type LockFn<'a> = &'a dyn Fn() -> Result<Flock<File>, StoreError>;

/// A temporary file in `dir` holding `bytes`, fsynced when `sync`: the first half of every
/// atomic write here.
pub(super) fn temp_with(
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
pub(super) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("fsync directory", dir))
}
