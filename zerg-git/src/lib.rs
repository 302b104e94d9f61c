//! The one place zerg does git. zergd's commit checks and ref moves, the level merges, the
//! symbol map's reads, and the worker's move to its next base and its commit run in process on
//! [gix] (SHA-1 and SHA-256 repositories alike), so a task costs a few object reads and writes
//! instead of a dozen git processes. What gix cannot do safely here (unmerged index entries,
//! submodules, split or sparse indexes, filter and merge drivers, resetting a worktree that
//! holds changes, the first checkout of a worktree) goes to the `git` program through [`cli`],
//! and every such fallback is counted ([`fallbacks`]). The import
//! of what a container worker wrote into its private object dir ([`objects`]) checks every
//! object against its name and walks the dir by descriptor ([`fsat`]), never following what the
//! container left there.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use gix::ObjectId;
use gix::refs::transaction::{Change, LogChange, PreviousValue, RefEdit, RefLog};
pub use zerg_proto::contract::is_object_id;

mod checkout;
pub mod cli;
pub mod fsat;
mod merge;
pub mod objects;
mod pack;
mod read;
pub mod transfer;
mod worktree;

pub use merge::{LevelMerge, Merged};
pub use read::TreeBlob;
pub use worktree::{Committed, Identity};

/// A git operation that failed: what was tried, where, and what gix or git said.
#[derive(Debug, thiserror::Error)]
#[error("{what} in {dir}: {message}")]
pub struct Error {
    /// The operation (`resolve HEAD`, `move refs/heads/x`, …).
    pub what: String,
    /// The repository or worktree.
    pub dir: PathBuf,
    /// The cause.
    pub message: String,
}

/// Why an operation went to the `git` program instead of running in process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// The index has unmerged entries.
    Unmerged,
    /// The index or tree has a submodule (gitlink) or the worktree a nested repository.
    Submodule,
    /// The index is split or sparse.
    SplitOrSparseIndex,
    /// Attributes or config ask for content conversion (filters, `text`, `eol`, `autocrlf`),
    /// which only git applies exactly as the user expects.
    Filters,
    /// The repository configures a merge driver, or a merge had a conflict (git's own conflict
    /// list is the one reported).
    Merge,
    /// A worktree's files had to be reset to a commit.
    WorktreeReset,
}

impl Fallback {
    /// A short name, for logs.
    pub fn name(self) -> &'static str {
        match self {
            Fallback::Unmerged => "unmerged index entries",
            Fallback::Submodule => "submodule",
            Fallback::SplitOrSparseIndex => "split or sparse index",
            Fallback::Filters => "content filters",
            Fallback::Merge => "merge driver or conflict",
            Fallback::WorktreeReset => "worktree reset",
        }
    }
}

static FALLBACKS: AtomicU64 = AtomicU64::new(0);

/// How many times this process went to the `git` program for something that normally runs in
/// process.
pub fn fallbacks() -> u64 {
    FALLBACKS.load(Ordering::Relaxed)
}

/// Counts one fallback and returns it.
pub fn fell_back(why: Fallback) -> Fallback {
    FALLBACKS.fetch_add(1, Ordering::Relaxed);
    why
}

/// Most bytes of decoded objects a [`Repo`] keeps cached: enough for the trees and commits of a
/// level merge or a commit check, small beside a long-running zergd.
const OBJECT_CACHE_BYTES: usize = 512 * 1024;

/// What a ref must point at for a compare-and-swap move to go ahead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Anything, or nothing.
    Any,
    /// This commit (hex).
    Is(String),
}

/// One repository, opened once and kept (zergd holds one per rush; the worker one per session).
/// Cheap to clone; `Send`, so it can go to a blocking thread.
#[derive(Clone)]
pub struct Repo {
    repo: gix::Repository,
    dir: PathBuf,
}

impl std::fmt::Debug for Repo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Repo").field("dir", &self.dir).finish()
    }
}

/// The most commits a checkpoint may sit above its task's base.
pub const MAX_CHECKPOINT_LINE: usize = 1000;

impl Repo {
    /// Opens the repository or worktree at `dir` for zergd: the user's and the system's git
    /// config count, but no `GIT_*` variable of the process's own environment does (`GIT_DIR`,
    /// `GIT_WORK_TREE`, `GIT_OBJECT_DIRECTORY`, `GIT_CONFIG_*` …), as zergd may have been
    /// started from a shell inside another repository.
    pub fn open(dir: &Path) -> Result<Repo, Error> {
        Repo::open_with(dir, without_git_env(gix::open::Options::default()))
    }

    /// Opens the worktree at `dir` for a worker: its environment is the one zergd built, and
    /// its `GIT_CONFIG_*` (a container's identity and sparse checkout) apply.
    pub fn open_worktree(dir: &Path) -> Result<Repo, Error> {
        Repo::open_with(dir, gix::open::Options::default())
    }

    fn open_with(dir: &Path, options: gix::open::Options) -> Result<Repo, Error> {
        // Compare file times to the nanosecond in this handle's statuses (git's `USE_NSEC`), an
        // override of this handle only. Otherwise every file written in the same second as the
        // index is "racily clean" and read and hashed again by every status in that second:
        // after a worker's move, that is each file the move wrote, for each task of the level.
        // A file whose time is the index's own is still compared by content.
        let options = options.config_overrides(["gitoxide.core.useNsec=true"]);
        let mut repo = gix::open_opts(dir, options).map_err(|e| Error {
            what: "open the repository".into(),
            dir: dir.to_path_buf(),
            message: e.to_string(),
        })?;
        repo.object_cache_size(OBJECT_CACHE_BYTES);
        Ok(Repo {
            repo,
            dir: dir.to_path_buf(),
        })
    }

    /// The directory it was opened at.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The git directory (a linked worktree's own admin directory).
    pub fn git_dir(&self) -> &Path {
        self.repo.git_dir()
    }

    /// The common git directory (the main repository's, also for a linked worktree).
    pub fn common_dir(&self) -> &Path {
        self.repo.common_dir()
    }

    /// Whether the repository stores SHA-256 object ids.
    pub fn is_sha256(&self) -> bool {
        self.repo.object_hash() != gix::hash::Kind::Sha1
    }

    pub(crate) fn err(&self, what: impl Into<String>, e: impl std::fmt::Display) -> Error {
        Error {
            what: what.into(),
            dir: self.dir.clone(),
            message: e.to_string(),
        }
    }

    /// Parses a hex object id of this repository's format.
    pub(crate) fn oid(&self, hex: &str) -> Result<ObjectId, Error> {
        let id = ObjectId::from_hex(hex.as_bytes())
            .map_err(|e| self.err(format!("read object id {hex:?}"), e))?;
        if id.kind() != self.repo.object_hash() {
            return Err(self.err(
                format!("read object id {hex:?}"),
                "not an id of this repository's object format",
            ));
        }
        Ok(id)
    }

    /// Resolves a revision (`HEAD`, `refs/heads/x`, an id) to a commit id, if it names one.
    pub fn commit_id(&self, rev: &str) -> Option<String> {
        let id = self.repo.rev_parse_single(rev).ok()?;
        let commit = id.object().ok()?.peel_to_commit().ok()?;
        Some(commit.id.to_string())
    }

    /// Whether the ref `name` (a full name) points straight at the object `hex`: read from the
    /// ref store, without a lock file and without reading the object.
    pub fn points_at(&self, name: &str, hex: &str) -> bool {
        let Ok(id) = self.oid(hex) else {
            return false;
        };
        self.repo
            .try_find_reference(name)
            .ok()
            .flatten()
            .is_some_and(|r| r.target().try_id() == Some(id.as_ref()))
    }

    /// Whether `hex` names a commit object in the repository (not a tree, blob or tag).
    pub fn is_commit(&self, hex: &str) -> bool {
        self.oid(hex)
            .ok()
            .and_then(|id| self.repo.find_header(id).ok())
            .is_some_and(|h| h.kind() == gix::object::Kind::Commit)
    }

    /// Whether `ancestor` is `of` or one of its ancestors. The parents are looked at first: a
    /// task's commit usually sits right on its base.
    pub fn is_ancestor(&self, ancestor: &str, of: &str) -> Result<bool, Error> {
        let a = self.oid(ancestor)?;
        let o = self.oid(of)?;
        if a == o {
            return Ok(true);
        }
        let commit = self
            .repo
            .find_commit(o)
            .map_err(|e| self.err(format!("read commit {of}"), e))?;
        if commit.parent_ids().any(|p| p == a) {
            return Ok(true);
        }
        let base = self
            .repo
            .merge_base(a, o)
            .map_err(|e| self.err(format!("merge base of {ancestor} and {of}"), e))?;
        Ok(base.is_some_and(|b| b == a))
    }

    /// The object id of `path` (a file or directory) in `commit`'s tree, if it is there.
    pub fn entry_id(&self, commit: &str, path: &str) -> Result<Option<ObjectId>, Error> {
        let id = self.oid(commit)?;
        let tree = self
            .repo
            .find_commit(id)
            .and_then(|c| c.tree())
            .map_err(|e| self.err(format!("read the tree of {commit}"), e))?;
        let entry = tree
            .lookup_entry_by_path(path)
            .map_err(|e| self.err(format!("look up {path} in {commit}"), e))?;
        Ok(entry.map(|e| e.object_id()))
    }

    /// Checks a commit a worker reports before zergd accepts it: it is a commit in the
    /// repository, it descends from the task's base commit, and it leaves `protected` (the
    /// rush's committed spec directory) exactly as the base has it. The error says which check
    /// failed.
    pub fn check_task_commit(
        &self,
        base: &str,
        commit: &str,
        protected: &str,
    ) -> Result<(), String> {
        if !is_object_id(commit) {
            return Err(format!(
                "commit {:?} is not an object id",
                commit.chars().take(80).collect::<String>()
            ));
        }
        if !self.is_commit(commit) {
            return Err(format!("commit {commit} is not a commit in the repository"));
        }
        if base.is_empty() {
            return Ok(());
        }
        match self.is_ancestor(base, commit) {
            Ok(true) => {}
            Ok(false) => {
                return Err(format!(
                    "commit {commit} does not descend from the task's base commit {base}"
                ));
            }
            Err(e) => return Err(e.to_string()),
        }
        let before = self.entry_id(base, protected).map_err(|e| e.to_string())?;
        let after = self
            .entry_id(commit, protected)
            .map_err(|e| e.to_string())?;
        if before != after {
            return Err(format!(
                "commit {commit} changes the rush's spec ({protected}), which tasks must not touch"
            ));
        }
        self.check_complete(base, commit)
    }

    /// Refuses a checkpoint that is not a line of commits on `base`: from `commit` back to
    /// `base`, every commit must have exactly one parent, within [`MAX_CHECKPOINT_LINE`]
    /// commits. A resumed lease is sent the checkpoint and its parent with their whole trees,
    /// so a checkpoint that is a merge with an older commit (which a worker can name: the
    /// base's parent is in the base's header) would pull history from outside the base
    /// snapshot; a line on the base holds only trees the worker itself wrote.
    pub fn check_checkpoint_line(&self, base: &str, commit: &str) -> Result<(), String> {
        let base_id = self.oid(base).map_err(|e| e.to_string())?;
        let mut at = self.oid(commit).map_err(|e| e.to_string())?;
        for _ in 0..MAX_CHECKPOINT_LINE {
            if at == base_id {
                return Ok(());
            }
            let c = self
                .repo
                .find_commit(at)
                .map_err(|e| format!("checkpoint {commit}: cannot read commit {at}: {e}"))?;
            let parents: Vec<ObjectId> = c.parent_ids().map(|p| p.detach()).collect();
            match parents.as_slice() {
                [one] => at = *one,
                _ => {
                    return Err(format!(
                        "checkpoint {commit} is not a line of commits on the task's base {base}: commit {at} has {} parents",
                        parents.len()
                    ));
                }
            }
        }
        Err(format!(
            "checkpoint {commit} is more than {MAX_CHECKPOINT_LINE} commits from the task's base {base}"
        ))
    }

    /// Refuses a commit whose tree is not all in the repository: every tree and blob it has
    /// that `base` does not must be there, or the level merge would fail on it later (a
    /// worker's objects that were never imported, a pack that left one out).
    fn check_complete(&self, base: &str, commit: &str) -> Result<(), String> {
        let incomplete = |why: String| format!("commit {commit} is incomplete: {why}");
        let old = self.tree_of(base).map_err(|e| e.to_string())?;
        let new = self
            .tree_of(commit)
            .map_err(|e| incomplete(e.message.clone()))?;
        let changes = self
            .tree_changes(&old, &new, &format!("compare {base} with {commit}"))
            .map_err(|e| incomplete(e.message.clone()))?;
        use gix::diff::tree::recorder::Change;
        for c in changes {
            if let Change::Addition {
                entry_mode,
                oid,
                path,
                ..
            }
            | Change::Modification {
                entry_mode,
                oid,
                path,
                ..
            } = c
                && !entry_mode.is_commit()
                && self.repo.find_header(oid).is_err()
            {
                return Err(incomplete(format!("object {oid} ({path}) is missing")));
            }
        }
        Ok(())
    }

    /// Moves every ref in `moves` (full names, new commit, what it must point at now) in one
    /// transaction: all of them move, or none does. `message` goes to the reflogs.
    pub fn move_refs(&self, moves: &[(&str, &str, Expect)], message: &str) -> Result<(), Error> {
        let mut edits = Vec::with_capacity(moves.len());
        for (name, new, expect) in moves {
            let new = self.oid(new)?;
            let expected = match expect {
                Expect::Any => PreviousValue::Any,
                Expect::Is(old) => {
                    PreviousValue::MustExistAndMatch(gix::refs::Target::Object(self.oid(old)?))
                }
            };
            edits.push(RefEdit {
                change: Change::Update {
                    log: LogChange {
                        mode: RefLog::AndReference,
                        force_create_reflog: false,
                        message: message.into(),
                    },
                    expected,
                    new: gix::refs::Target::Object(new),
                },
                name: (*name)
                    .try_into()
                    .map_err(|e| self.err(format!("move {name}"), e))?,
                deref: false,
            });
        }
        let who = Identity::zerg().signature();
        let mut time = gix::date::parse::TimeBuf::default();
        self.repo
            .edit_references_as(edits, Some(who.to_ref(&mut time)))
            .map_err(|e| self.err(format!("move {}", names(moves)), e))?;
        Ok(())
    }
}

fn names(moves: &[(&str, &str, Expect)]) -> String {
    moves.iter().map(|m| m.0).collect::<Vec<_>>().join(", ")
}

/// `options` that read no `GIT_*` variable of the process's environment and no config from
/// the environment (see [`Repo::open`]).
fn without_git_env(mut options: gix::open::Options) -> gix::open::Options {
    options.permissions.env.git_prefix = gix::sec::Permission::Deny;
    options.permissions.env.objects = gix::sec::Permission::Deny;
    options.permissions.config.env = false;
    options
}

/// The top level of the worktree that contains `dir`, symlinks resolved: what
/// `git rev-parse --show-toplevel` prints, without starting git.
pub fn toplevel(dir: &Path) -> Result<PathBuf, Error> {
    let err = |message: String| Error {
        what: "find the repository".into(),
        dir: dir.to_path_buf(),
        message,
    };
    let repo = gix::ThreadSafeRepository::discover_opts(dir, Default::default(), |o, _| {
        without_git_env(o)
    })
    .map(gix::Repository::from)
    .map_err(|e| err(format!("not a git repository: {e}")))?;
    let top = repo
        .workdir()
        .ok_or_else(|| err("a bare repository has no worktree".into()))?;
    std::fs::canonicalize(top).map_err(|e| err(e.to_string()))
}

#[cfg(test)]
mod tests;
