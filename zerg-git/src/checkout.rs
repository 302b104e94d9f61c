//! Moving a clean worktree to a descendant commit in process: what `git reset --hard <base>`
//! followed by `git clean -fd` does at a level's start, where the worktree sits, unchanged, on
//! the worker's own last commit and the base is the level merge that contains it. Only the
//! files that differ between the two trees are touched; anything unusual goes to git.

use std::collections::HashSet;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use gix::bstr::{BStr, ByteSlice};
use gix::diff::tree::recorder::Change;
use gix::objs::tree::EntryMode;

use crate::{Error, Fallback, Repo, fell_back};

/// One file to write: path, blob and mode.
struct Put {
    path: String,
    id: gix::ObjectId,
    mode: EntryMode,
}

/// The first component of a slash-separated path; empty for a top-level path, so that a
/// top-level skip-worktree file stands for every top-level path.
fn top(path: &BStr) -> &[u8] {
    path.find_byte(b'/').map_or(&[], |i| &path[..i])
}

/// Whether a path from a tree is safe to write under the worktree: plain components only, none
/// of them `.git` in any case.
fn plain(path: &str) -> bool {
    !path.is_empty()
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && !c.eq_ignore_ascii_case(".git"))
}

impl Repo {
    /// Moves the worktree, its index and its checked-out branch to `base` (a commit id), when
    /// the index and the worktree hold exactly the tree of `from` (a commit id; paths under
    /// `skip` aside), as `git reset --hard` and `git clean -fd` would. `from` is where the
    /// caller last left the files: a level's merge moves the worker's branch to `base` but not
    /// its files. `Ok(Err(_))` means nothing was done (the fallback is counted) and git must
    /// reset; an error may leave the worktree half moved, which git's reset then repairs.
    ///
    /// A status checks the files first, unless `known_clean`: the caller left them at `from`
    /// with [`Repo::commit_worktree`], which said they were then [`crate::Committed::clean`],
    /// and nothing has run in the worktree since, so the status would find what the commit's
    /// found moments before. The index is checked either way, and everything the move itself
    /// finds unusual still goes to git.
    pub fn checkout_clean(
        &self,
        from: &str,
        base: &str,
        skip: &[&str],
        known_clean: bool,
    ) -> Result<Result<(), Fallback>, Error> {
        let old_tree = self.tree_of(from)?;
        let unchanged = if known_clean {
            self.plain_index()?.map(|_| true)
        } else {
            self.changes_from(old_tree.id, skip)?
                .map(|(changes, _)| changes.is_empty())
        };
        match unchanged {
            Ok(true) => self.move_files(old_tree, base, skip),
            Ok(false) => Ok(Err(fell_back(Fallback::WorktreeReset))),
            Err(f) => Ok(Err(f)),
        }
    }

    /// Moves a worktree known to hold exactly `old_tree` (paths under `skip` aside) to `base`.
    fn move_files(
        &self,
        old_tree: gix::Tree<'_>,
        base: &str,
        skip: &[&str],
    ) -> Result<Result<(), Fallback>, Error> {
        let head_id = self
            .repo
            .head_id()
            .map_err(|e| self.err("read HEAD", e))?
            .detach();
        let base_id = self.oid(base)?;
        let new_tree = self.tree_of(base)?;
        if old_tree.id == new_tree.id {
            if head_id != base_id {
                self.reset_head(head_id, base_id)?;
            }
            return Ok(Ok(()));
        }
        let index = self
            .repo
            .index_or_empty()
            .map_err(|e| self.err("read the index", e))?;
        // Skip-worktree entries (a container worker's sparse checkout leaves the spec out) are
        // never written; a change under the same top-level directory as one of them goes to
        // git, which knows the sparse patterns.
        let sparse_tops: HashSet<&[u8]> = index
            .entries()
            .iter()
            .filter(|e| e.flags.contains(gix::index::entry::Flags::SKIP_WORKTREE))
            .map(|e| top(e.path(&index)))
            .collect();
        let new_tree_id = new_tree.id;
        let diff = self.tree_changes(&old_tree, &new_tree, &format!("compare with {base}"))?;
        let (mut gone_files, mut gone_dirs, mut puts) = (Vec::new(), Vec::new(), Vec::new());
        for c in diff {
            let (old, new, path) = match c {
                Change::Addition {
                    entry_mode,
                    oid,
                    path,
                    ..
                } => (None, Some((entry_mode, oid)), path),
                Change::Deletion {
                    entry_mode,
                    oid,
                    path,
                    ..
                } => (Some((entry_mode, oid)), None, path),
                Change::Modification {
                    previous_entry_mode,
                    previous_oid,
                    entry_mode,
                    oid,
                    path,
                    ..
                } => (
                    Some((previous_entry_mode, previous_oid)),
                    Some((entry_mode, oid)),
                    path,
                ),
            };
            let Some(path) = path.to_str().ok().filter(|p| plain(p)) else {
                return Ok(Err(fell_back(Fallback::WorktreeReset)));
            };
            if skip.iter().any(|s| crate::worktree::under(path, s))
                || sparse_tops.contains(top(path.as_bytes().as_bstr()))
                || path == ".gitattributes"
                || path.ends_with("/.gitattributes")
            {
                // Paths the status leaves out, or attributes that may ask for conversion on
                // checkout: git decides.
                return Ok(Err(fell_back(Fallback::WorktreeReset)));
            }
            for (mode, _) in old.iter().chain(new.iter()) {
                if mode.is_commit() {
                    return Ok(Err(fell_back(Fallback::Submodule)));
                }
            }
            match old {
                Some((m, _)) if m.is_tree() => gone_dirs.push(path.to_string()),
                // A blob replaced by a blob is rewritten in place below.
                Some(_) if new.is_some_and(|(m, _)| !m.is_tree()) => {}
                Some(_) => gone_files.push(path.to_string()),
                None => {}
            }
            if let Some((mode, id)) = new.filter(|(m, _)| !m.is_tree()) {
                puts.push(Put {
                    path: path.to_string(),
                    id,
                    mode,
                });
            }
        }
        let workdir = self
            .repo
            .workdir()
            .ok_or_else(|| self.err("check out", "the repository has no worktree"))?
            .to_path_buf();
        for p in &gone_files {
            let full = workdir.join(p);
            if self.parents_are_dirs(&workdir, p)? {
                match std::fs::remove_file(&full) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(self.err(format!("remove {p}"), e)),
                }
            }
        }
        // Deepest first; a directory that still holds ignored files stays, as with git.
        gone_dirs.sort_by_key(|d| std::cmp::Reverse(d.matches('/').count()));
        for d in &gone_dirs {
            if self.parents_are_dirs(&workdir, d)? {
                let full = workdir.join(d);
                if std::fs::symlink_metadata(&full).is_ok_and(|m| m.is_dir()) {
                    let _ = std::fs::remove_dir(&full);
                }
            }
        }
        let mut written = HashSet::new();
        for put in &puts {
            self.put(&workdir, put)?;
            written.insert(put.path.as_str());
        }
        self.write_index_after_checkout(new_tree_id, &workdir, &index, &written)?;
        if head_id != base_id {
            self.reset_head(head_id, base_id)?;
        }
        Ok(Ok(()))
    }

    /// Moves the branch as `git reset` would, zerg named in the reflog.
    fn reset_head(&self, from: gix::ObjectId, to: gix::ObjectId) -> Result<(), Error> {
        let who = crate::Identity::zerg().signature();
        let mut time = gix::date::parse::TimeBuf::default();
        self.move_head(
            from,
            to,
            &format!("reset: moving to {to}"),
            who.to_ref(&mut time),
        )
    }

    /// Whether every directory above `rel` is a real directory (not a symlink); creates the
    /// missing ones when `create`.
    fn dirs_above(&self, workdir: &Path, rel: &str, create: bool) -> Result<bool, Error> {
        let mut dir = workdir.to_path_buf();
        let parts: Vec<&str> = rel.split('/').collect();
        for part in &parts[..parts.len() - 1] {
            dir.push(part);
            match std::fs::symlink_metadata(&dir) {
                Ok(m) if m.is_dir() => {}
                Ok(_) if create => {
                    // A file (or a symlink) where the new tree has a directory: HEAD's tree
                    // named it as a file that the diff removed above, or it is ignored.
                    return Err(self.err(
                        format!("create {}", dir.display()),
                        "a file or symlink is in the way",
                    ));
                }
                Ok(_) => return Ok(false),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
                    std::fs::create_dir(&dir)
                        .map_err(|e| self.err(format!("create {}", dir.display()), e))?;
                }
                Err(_) => return Ok(false),
            }
        }
        Ok(true)
    }

    fn parents_are_dirs(&self, workdir: &Path, rel: &str) -> Result<bool, Error> {
        self.dirs_above(workdir, rel, false)
    }

    /// Writes one blob of the new tree to the worktree, replacing what is there.
    fn put(&self, workdir: &Path, put: &Put) -> Result<(), Error> {
        let p = &put.path;
        self.dirs_above(workdir, p, true)?;
        let full: PathBuf = workdir.join(p);
        match std::fs::symlink_metadata(&full) {
            Ok(m) if m.is_dir() => {
                return Err(self.err(format!("write {p}"), "a directory is in the way"));
            }
            Ok(_) => {
                std::fs::remove_file(&full).map_err(|e| self.err(format!("replace {p}"), e))?
            }
            Err(_) => {}
        }
        let blob = self
            .repo
            .find_blob(put.id)
            .map_err(|e| self.err(format!("read {p}"), e))?;
        if put.mode.is_link() {
            use std::os::unix::ffi::OsStrExt;
            let target = std::ffi::OsStr::from_bytes(&blob.data);
            std::os::unix::fs::symlink(target, &full)
                .map_err(|e| self.err(format!("write {p}"), e))?;
            return Ok(());
        }
        let mode = if put.mode.is_executable() {
            0o777
        } else {
            0o666
        };
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&full)
            .map_err(|e| self.err(format!("write {p}"), e))?;
        f.write_all(&blob.data)
            .map_err(|e| self.err(format!("write {p}"), e))
    }

    /// Replaces the index with `tree`'s entries: an entry unchanged since the old index keeps
    /// its file data, a file just written gets its own, and the rest is left for the next
    /// status to compare by content.
    fn write_index_after_checkout(
        &self,
        tree: gix::ObjectId,
        workdir: &Path,
        old: &gix::index::File,
        written: &HashSet<&str>,
    ) -> Result<(), Error> {
        let mut new = self
            .repo
            .index_from_tree(&tree)
            .map_err(|e| self.err("build the index", e))?;
        for (entry, path) in new.entries_mut_with_paths() {
            let p: &BStr = path;
            let Ok(p) = p.to_str() else { continue };
            if written.contains(p) {
                if let Ok(meta) = gix::index::fs::Metadata::from_path_no_follow(&workdir.join(p))
                    && let Ok(stat) = gix::index::entry::Stat::from_fs(&meta)
                {
                    entry.stat = stat;
                }
            } else if let Some(o) = old.entry_by_path(path) {
                use gix::index::entry::Flags;
                if o.flags.contains(Flags::SKIP_WORKTREE) {
                    // An extended flag: the entry must say it has some.
                    entry.flags |= Flags::SKIP_WORKTREE | Flags::EXTENDED;
                }
                if o.id == entry.id && o.mode == entry.mode {
                    entry.stat = o.stat;
                }
            }
        }
        new.write(Default::default(), gix::fs::SharedPermissions::Umask)
            .map_err(|e| self.err("write the index", e))
    }

    /// Moves the checked-out branch from `from` to `to`, compare-and-swap, with `message` in
    /// its reflog by `who`. The branch is named, not reached through `HEAD`, so only its own
    /// lock file is made: through `HEAD`, `HEAD.lock` is made and removed as well, for `HEAD`'s
    /// reflog, once per task (this worktree is the worker's own; its branch's reflog has every
    /// move). A detached `HEAD` is moved itself.
    pub(crate) fn move_head(
        &self,
        from: gix::ObjectId,
        to: gix::ObjectId,
        message: &str,
        who: gix::actor::SignatureRef<'_>,
    ) -> Result<(), Error> {
        use gix::refs::transaction::{Change, LogChange, PreviousValue, RefEdit, RefLog};
        let name = match self
            .repo
            .head_name()
            .map_err(|e| self.err("read HEAD", e))?
        {
            Some(branch) => branch,
            None => "HEAD".try_into().map_err(|e| self.err("move HEAD", e))?,
        };
        self.repo
            .edit_references_as(
                Some(RefEdit {
                    change: Change::Update {
                        log: LogChange {
                            mode: RefLog::AndReference,
                            force_create_reflog: false,
                            message: message.into(),
                        },
                        expected: PreviousValue::MustExistAndMatch(gix::refs::Target::Object(from)),
                        new: gix::refs::Target::Object(to),
                    },
                    name,
                    deref: false,
                }),
                Some(who),
            )
            .map_err(|e| self.err("move HEAD", e))?;
        Ok(())
    }
}
