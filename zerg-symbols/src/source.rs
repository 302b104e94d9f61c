//! Reading a commit through [`zerg_git`]: its tree, what changed between two commits, and the
//! contents of blobs, which are parsed on a few threads as they are read. Nothing runs `git`,
//! and the repository handle zergd opens ignores any `GIT_*` variable of its environment, so a
//! `GIT_DIR` there cannot point the index at another repository.

use std::sync::Mutex;
use std::sync::mpsc;

use zerg_git::{Repo, TreeBlob};

use super::{FileSymbols, Grammar, SkipReason, SymbolError, extract};

/// The largest blob read into memory whatever the settings say.
const HARD_BLOB_LIMIT: u64 = 64 << 20;

fn failed(e: zerg_git::Error) -> SymbolError {
    SymbolError(e.to_string())
}

/// The commit a revision names.
pub(crate) fn resolve_commit(repo: &Repo, rev: &str) -> Result<String, SymbolError> {
    repo.resolve_commit(rev).map_err(failed)
}

/// Every blob of a commit's tree (submodules are left out).
pub(crate) fn list_tree(repo: &Repo, commit: &str) -> Result<Vec<TreeBlob>, SymbolError> {
    repo.list_blobs(commit).map_err(failed)
}

/// What changed between two commits: each changed path with its new entry, or `None` when it
/// is gone (or is no longer a blob).
pub(crate) fn diff_trees(
    repo: &Repo,
    old: &str,
    new: &str,
) -> Result<Vec<(String, Option<TreeBlob>)>, SymbolError> {
    repo.changed_blobs(old, new).map_err(failed)
}

/// Reads the blobs `ids` and parses each with its grammar, on up to four threads; the
/// outcomes are in the order of `ids`.
pub(crate) fn parse_blobs(
    repo: &Repo,
    ids: &[String],
    grammars: Vec<Grammar>,
) -> Result<Vec<Result<FileSymbols, SkipReason>>, SymbolError> {
    let n = ids.len();
    if n == 0 {
        return Ok(Vec::new());
    }
    let threads = std::thread::available_parallelism()
        .map(|p| p.get())
        .unwrap_or(1)
        .clamp(1, 4)
        .min(n);
    let results: Mutex<Vec<Option<Result<FileSymbols, SkipReason>>>> =
        Mutex::new((0..n).map(|_| None).collect());
    let (tx, rx) = mpsc::sync_channel::<(usize, Vec<u8>)>(threads * 2);
    let rx = Mutex::new(rx);
    let read = std::thread::scope(|s| {
        for _ in 0..threads {
            let (rx, results, grammars) = (&rx, &results, &grammars);
            s.spawn(move || {
                loop {
                    let next = match rx.lock() {
                        Ok(r) => r.recv(),
                        Err(_) => return,
                    };
                    let Ok((i, bytes)) = next else { return };
                    // The grammars are C code run on hostile input: a panic on one file only
                    // skips that file.
                    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        extract(grammars[i], &bytes)
                    }))
                    .unwrap_or(Err(SkipReason::Unparsable));
                    if let Ok(mut r) = results.lock() {
                        r[i] = Some(outcome);
                    }
                }
            });
        }
        let mut stopped = false;
        let read = repo.read_blobs(ids, HARD_BLOB_LIMIT, |i, bytes| match bytes {
            Some(bytes) => {
                stopped = tx.send((i, bytes)).is_err();
                !stopped
            }
            None => {
                if let Ok(mut res) = results.lock() {
                    res[i] = Some(Err(SkipReason::TooLarge));
                }
                true
            }
        });
        drop(tx);
        match read {
            Err(e) => Err(failed(e)),
            Ok(()) if stopped => Err(SymbolError("the parser threads stopped".into())),
            Ok(()) => Ok(()),
        }
    });
    read?;
    let results = results
        .into_inner()
        .map_err(|_| SymbolError("a parser thread panicked".into()))?;
    Ok(results
        .into_iter()
        .map(|r| r.unwrap_or(Err(SkipReason::Unparsable)))
        .collect())
}
