//! The on-disk cache of parsed files, keyed by git blob id: a blob's symbols never change, so
//! a file parsed once (by any rush, or by `zergctl symbols`) is never parsed again.
//!
//! Layout: `<dir>/v<N>/<first two hex digits>/<rest of the id>.<grammar>.json`, where `N` is
//! [`FORMAT`], raised whenever extraction changes what it finds. Entries are written to a temp
//! file and renamed into place, so a reader sees a whole entry or none; an entry that does not
//! parse is ignored (and rewritten on the next parse). The cache may be deleted at any time.
//! Its directory holds a `.gitignore` of `*`, so it never shows in `git status`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{FileSymbols, Grammar};

/// The version of what the cache holds.
pub const FORMAT: u32 = 1;

/// Where an entry larger than this is found, it is ignored (entries are far smaller).
const MAX_ENTRY: u64 = 16 << 20;

/// A symbol cache directory.
#[derive(Debug, Clone)]
pub struct Cache {
    dir: PathBuf,
}

static TEMP_SEQ: AtomicU64 = AtomicU64::new(0);

impl Cache {
    /// The cache of a repository: `<repo>/.zerg/cache/symbols`.
    pub fn in_repo(repo: &Path) -> Cache {
        Cache::at(repo.join(".zerg").join("cache").join("symbols"))
    }

    /// A cache in `dir`.
    pub fn at(dir: PathBuf) -> Cache {
        Cache { dir }
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn entry(&self, blob: &str, grammar: Grammar) -> Option<PathBuf> {
        let ok = (blob.len() == 40 || blob.len() == 64)
            && blob.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        ok.then(|| {
            self.dir
                .join(format!("v{FORMAT}"))
                .join(&blob[..2])
                .join(format!("{}.{}.json", &blob[2..], grammar.name()))
        })
    }

    /// The cached symbols of a blob parsed with `grammar`, if any.
    pub fn get(&self, blob: &str, grammar: Grammar) -> Option<FileSymbols> {
        let path = self.entry(blob, grammar)?;
        let meta = std::fs::metadata(&path).ok()?;
        if !meta.is_file() || meta.len() > MAX_ENTRY {
            return None;
        }
        let bytes = std::fs::read(&path).ok()?;
        let symbols: FileSymbols = serde_json::from_slice(&bytes).ok()?;
        (symbols.language == grammar.language()).then_some(symbols)
    }

    /// Stores the symbols of a blob, atomically.
    pub fn put(&self, blob: &str, grammar: Grammar, symbols: &FileSymbols) -> std::io::Result<()> {
        let Some(path) = self.entry(blob, grammar) else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{blob:?} is not a blob id"),
            ));
        };
        let dir = path.parent().unwrap_or(&self.dir);
        std::fs::create_dir_all(dir)?;
        let ignore = self.dir.join(".gitignore");
        if !ignore.exists() {
            let _ = write_atomic(&ignore, b"*\n");
        }
        let bytes = serde_json::to_vec(symbols).map_err(std::io::Error::other)?;
        write_atomic(&path, &bytes)
    }
}

/// Writes `bytes` to a temp file beside `path`, then renames it over `path`.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".tmp-{}-{}",
        std::process::id(),
        TEMP_SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
