//! The worker's side: whether a task can start without a reset, and the task's commit, both
//! from one status of the worktree, in process.

use std::collections::HashSet;
use std::path::Path;

use gix::bstr::{BStr, ByteSlice};
use gix::objs::tree::EntryKind;
use gix::status::index_worktree::Item as WorktreeItem;
use gix::status::plumbing::index_as_worktree::{Change as WtChange, EntryStatus};

use crate::{Error, Fallback, Repo, fell_back};

/// Who authors and commits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// `user.name`.
    pub name: String,
    /// `user.email`.
    pub email: String,
}

impl Identity {
    /// zergd's own name in reflogs.
    pub fn zerg() -> Identity {
        Identity {
            name: "zerg".into(),
            email: "zerg@localhost".into(),
        }
    }

    /// The committer git would use in `repo` (`GIT_COMMITTER_*`, `user.name` and
    /// `user.email`), if one is configured.
    pub fn of(repo: &Repo) -> Option<Identity> {
        let sig = repo.repo.committer()?.ok()?;
        let name = sig.name.to_str().ok()?.trim();
        let email = sig.email.to_str().ok()?.trim();
        (!name.is_empty() && !email.is_empty()).then(|| Identity {
            name: name.to_string(),
            email: email.to_string(),
        })
    }

    pub(crate) fn signature(&self) -> gix::actor::Signature {
        gix::actor::Signature {
            name: self.name.as_str().into(),
            email: self.email.as_str().into(),
            time: gix::date::Time::now_local_or_utc(),
        }
    }
}

/// A task's commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// The new commit (hex); the worktree's branch points at it.
    pub commit: String,
    /// Paths whose content differs from the base commit's.
    pub changed: Vec<String>,
    /// Whether the index and the files are now exactly the commit's tree: the status found
    /// nothing under the skipped paths or the spec, which the commit leaves as they are on disk.
    /// A move of this worktree that starts right after can then do without a status
    /// ([`Repo::checkout_clean`], `known_clean`).
    pub clean: bool,
}

/// A change to the worktree's tree, from the status.
pub(crate) enum Edit {
    /// Add or replace the file at the path with what is on disk.
    FromDisk(String),
    /// Set the path to this entry (a change already in the index).
    Set(String, EntryKind, gix::ObjectId),
    /// Remove the path.
    Remove(String),
}

/// Whether `path` is `prefix` or under it.
pub(crate) fn under(path: &str, prefix: &str) -> bool {
    path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

impl Repo {
    /// The worktree's changes against `HEAD`, as edits to `HEAD`'s tree, leaving out paths
    /// under `skip` (whether there were any: the flag); or why git must do this.
    fn changes(&self, skip: &[&str]) -> Result<Result<(Vec<Edit>, bool), Fallback>, Error> {
        let head_tree = self
            .repo
            .head_tree_id()
            .map_err(|e| self.err("read HEAD's tree", e))?
            .detach();
        self.changes_from(head_tree, skip)
    }

    /// The changes of the index and the worktree against `tree`, as edits to it, leaving out
    /// paths under `skip`, and whether any were left out; or why git must do this.
    pub(crate) fn changes_from(
        &self,
        tree: gix::ObjectId,
        skip: &[&str],
    ) -> Result<Result<(Vec<Edit>, bool), Fallback>, Error> {
        let index = match self.plain_index()? {
            Ok(index) => index,
            Err(f) => return Ok(Err(f)),
        };
        let iter = self
            .repo
            .status(gix::progress::Discard)
            .map_err(|e| self.err("start the status", e))?
            .untracked_files(gix::status::UntrackedFiles::Files)
            .index_worktree_rewrites(None)
            .tree_index_track_renames(gix::status::tree_index::TrackRenames::Disabled)
            // One thread for the files: a worktree of a few thousand files is a few
            // milliseconds of `lstat`, less than starting threads for it, and each worker has
            // its own status to take while the machine's cores run the others.
            .index_worktree_options_mut(|o| o.thread_limit = Some(1))
            .head_tree(tree)
            .index(gix::worktree::IndexPersistedOrInMemory::Persisted(index))
            .into_iter(Vec::<gix::bstr::BString>::new())
            .map_err(|e| self.err("take the status", e))?;
        let mut staged = Vec::new();
        let mut edits = Vec::new();
        let skipped = std::cell::Cell::new(false);
        let keep = |p: &BStr| {
            let p = p.to_str_lossy();
            let left_out = skip.iter().any(|s| under(&p, s));
            if left_out {
                skipped.set(true);
            }
            (!left_out).then(|| p.into_owned())
        };
        for item in iter {
            let item = item.map_err(|e| self.err("take the status", e))?;
            match item {
                gix::status::Item::TreeIndex(change) => {
                    let Some(path) = keep(change.location()) else {
                        continue;
                    };
                    match change.rhs_fields() {
                        Some((_, _, mode, id)) => match mode.to_tree_entry_mode() {
                            Some(m) => staged.push(Edit::Set(path, m.kind(), id.to_owned())),
                            None => return Ok(Err(fell_back(Fallback::Submodule))),
                        },
                        None => staged.push(Edit::Remove(path)),
                    }
                }
                gix::status::Item::IndexWorktree(WorktreeItem::Modification {
                    rela_path,
                    status,
                    ..
                }) => {
                    let Some(path) = keep(rela_path.as_ref()) else {
                        continue;
                    };
                    match status {
                        EntryStatus::Conflict { .. } => {
                            return Ok(Err(fell_back(Fallback::Unmerged)));
                        }
                        EntryStatus::Change(WtChange::Removed) => edits.push(Edit::Remove(path)),
                        EntryStatus::Change(WtChange::SubmoduleModification(_)) => {
                            return Ok(Err(fell_back(Fallback::Submodule)));
                        }
                        EntryStatus::Change(_) | EntryStatus::IntentToAdd => {
                            edits.push(Edit::FromDisk(path))
                        }
                        EntryStatus::NeedsUpdate(_) => {}
                    }
                }
                gix::status::Item::IndexWorktree(WorktreeItem::DirectoryContents {
                    entry, ..
                }) => {
                    if entry.status != gix::dir::entry::Status::Untracked {
                        continue;
                    }
                    let Some(path) = keep(entry.rela_path.as_ref()) else {
                        continue;
                    };
                    match entry.disk_kind {
                        Some(gix::dir::entry::Kind::File | gix::dir::entry::Kind::Symlink) => {
                            edits.push(Edit::FromDisk(path))
                        }
                        Some(gix::dir::entry::Kind::Repository) => {
                            return Ok(Err(fell_back(Fallback::Submodule)));
                        }
                        _ => {}
                    }
                }
                gix::status::Item::IndexWorktree(WorktreeItem::Rewrite { .. }) => {
                    return Err(self.err("take the status", "a rename was reported unasked"));
                }
            }
        }
        // Staged changes first: the worktree's own come on top of them.
        staged.extend(edits);
        Ok(Ok((staged, skipped.get())))
    }

    /// Whether the worktree is at `base` (a commit id) with nothing changed, paths under `skip`
    /// aside: a task that starts there needs no reset.
    #[cfg(test)]
    pub(crate) fn is_clean_at(&self, base: &str, skip: &[&str]) -> Result<bool, Error> {
        let head = self.commit_id("HEAD");
        if head.as_deref() != Some(base) {
            return Ok(false);
        }
        Ok(matches!(self.changes(skip)?, Ok((c, _)) if c.is_empty()))
    }

    /// The paths that differ from `HEAD` in the index or the worktree, untracked files
    /// included and ignored ones not, paths under `skip` left out; `Ok(Err(_))` when git must
    /// be asked instead.
    pub fn uncommitted_paths(&self, skip: &[&str]) -> Result<Result<Vec<String>, Fallback>, Error> {
        Ok(self.changes(skip)?.map(|(edits, _)| {
            edits
                .into_iter()
                .map(|e| match e {
                    Edit::FromDisk(p) | Edit::Set(p, ..) | Edit::Remove(p) => p,
                })
                .collect()
        }))
    }

    /// Commits everything in the worktree (like `git add -A` then `git commit`, paths under
    /// `skip` left out) on top of `HEAD`, with the directory `spec` exactly as `base` has it,
    /// moves the checked-out branch with a compare-and-swap, and writes the index to match the
    /// commit (index entries keep their flags, skip-worktree among them). `Ok(Err(_))` means
    /// nothing was done and git must commit instead.
    pub fn commit_worktree(
        &self,
        base: &str,
        spec: &str,
        skip: &[&str],
        message: &str,
        identity: &Identity,
    ) -> Result<Result<Committed, Fallback>, Error> {
        let workdir = self
            .repo
            .workdir()
            .ok_or_else(|| self.err("commit", "the repository has no worktree"))?
            .to_path_buf();
        // The spec is never taken from the worktree: it is set to the base's below.
        let mut skip = skip.to_vec();
        skip.push(spec);
        let (edits, skipped) = match self.changes(&skip)? {
            Ok(e) => e,
            Err(f) => return Ok(Err(f)),
        };
        let head = self
            .repo
            .head_commit()
            .map_err(|e| self.err("read HEAD", e))?;
        let head_id = head.id;
        let head_tree = head
            .tree_id()
            .map_err(|e| self.err("read HEAD's tree", e))?;
        let mut editor = self
            .repo
            .edit_tree(head_tree)
            .map_err(|e| self.err("edit HEAD's tree", e))?;
        let mut on_disk: HashSet<String> = HashSet::new();
        for edit in edits {
            match edit {
                Edit::Set(path, kind, id) => {
                    editor
                        .upsert(path.as_str(), kind, id)
                        .map_err(|e| self.err(format!("stage {path}"), e))?;
                }
                Edit::Remove(path) => {
                    editor
                        .remove(path.as_str())
                        .map_err(|e| self.err(format!("remove {path}"), e))?;
                }
                Edit::FromDisk(path) => {
                    match self.blob_from_disk(&workdir, &path)? {
                        Some((kind, id)) => {
                            editor
                                .upsert(path.as_str(), kind, id)
                                .map_err(|e| self.err(format!("add {path}"), e))?;
                            on_disk.insert(path);
                        }
                        // Gone since the status, or not a file: as `git add -A` would.
                        None => {
                            editor
                                .remove(path.as_str())
                                .map_err(|e| self.err(format!("remove {path}"), e))?;
                        }
                    }
                }
            }
        }
        let base_hex = if base.is_empty() {
            head_id.to_string()
        } else {
            base.to_string()
        };
        // HEAD's spec differs from the base's only if the agent CLI committed a change to it.
        let want = self.entry_id(&base_hex, spec)?;
        let spec_moved = self.entry_id(&head_id.to_string(), spec)? != want;
        if spec_moved {
            match want {
                Some(id) => editor.upsert(spec, EntryKind::Tree, id),
                None => editor.remove(spec),
            }
            .map_err(|e| self.err(format!("restore {spec}"), e))?;
        }
        let tree = editor
            .write()
            .map_err(|e| self.err("write the tree", e))?
            .detach();
        let who = identity.signature();
        let mut time = gix::date::parse::TimeBuf::default();
        let who = who.to_ref(&mut time);
        let commit = self
            .repo
            .new_commit_as(who, who, message, tree, [head_id])
            .map_err(|e| self.err("write the commit", e))?
            .id;
        let subject = message.lines().next().unwrap_or_default();
        self.move_head(head_id, commit, &format!("commit: {subject}"), who)?;
        self.write_index_of(tree, &workdir, spec, &on_disk)?;
        let changed = self.changed_paths(&base_hex, tree)?;
        Ok(Ok(Committed {
            commit: commit.to_string(),
            changed,
            clean: !skipped && !spec_moved,
        }))
    }

    /// Writes the blob of the file at `path` (not following a symlink); its kind, or `None`
    /// when it is not a file or a symlink now.
    fn blob_from_disk(
        &self,
        workdir: &Path,
        path: &str,
    ) -> Result<Option<(EntryKind, gix::ObjectId)>, Error> {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::PermissionsExt;
        let full = workdir.join(path);
        let Ok(meta) = std::fs::symlink_metadata(&full) else {
            return Ok(None);
        };
        let (kind, bytes) = if meta.file_type().is_symlink() {
            let target =
                std::fs::read_link(&full).map_err(|e| self.err(format!("read {path}"), e))?;
            (EntryKind::Link, target.as_os_str().as_bytes().to_vec())
        } else if meta.is_file() {
            let kind = if meta.permissions().mode() & 0o111 != 0 {
                EntryKind::BlobExecutable
            } else {
                EntryKind::Blob
            };
            let bytes = std::fs::read(&full).map_err(|e| self.err(format!("read {path}"), e))?;
            (kind, bytes)
        } else {
            return Ok(None);
        };
        let id = self
            .repo
            .write_blob(bytes)
            .map_err(|e| self.err(format!("write {path}"), e))?
            .detach();
        Ok(Some((kind, id)))
    }

    /// Replaces the index with `tree`'s entries. An entry the old index had at the same path
    /// keeps its flags (skip-worktree), and its file data when its content is unchanged; a file
    /// just read from disk gets its file data now, so the next status need not read it again.
    /// Everything else (the spec, which may differ on disk) is left for the next status to
    /// compare by content.
    fn write_index_of(
        &self,
        tree: gix::ObjectId,
        workdir: &Path,
        spec: &str,
        on_disk: &HashSet<String>,
    ) -> Result<(), Error> {
        let old = self
            .repo
            .index_or_empty()
            .map_err(|e| self.err("read the index", e))?;
        let mut new = self
            .repo
            .index_from_tree(&tree)
            .map_err(|e| self.err("build the index", e))?;
        for (entry, path) in new.entries_mut_with_paths() {
            let p = path.to_str_lossy();
            if let Some(o) = old.entry_by_path(path) {
                use gix::index::entry::Flags;
                if o.flags.contains(Flags::SKIP_WORKTREE) {
                    // An extended flag: the entry must say it has some.
                    entry.flags |= Flags::SKIP_WORKTREE | Flags::EXTENDED;
                }
                if o.id == entry.id && o.mode == entry.mode {
                    entry.stat = o.stat;
                    continue;
                }
            }
            if under(&p, spec) || !on_disk.contains(p.as_ref()) {
                continue;
            }
            if let Ok(meta) = gix::index::fs::Metadata::from_path_no_follow(&workdir.join(&*p))
                && let Ok(stat) = gix::index::entry::Stat::from_fs(&meta)
            {
                entry.stat = stat;
            }
        }
        new.write(Default::default(), gix::fs::SharedPermissions::Umask)
            .map_err(|e| self.err("write the index", e))
    }

    /// Paths that differ between `base`'s tree and `tree`: both paths of a rename.
    fn changed_paths(&self, base: &str, tree: gix::ObjectId) -> Result<Vec<String>, Error> {
        use gix::diff::tree::recorder::Change;
        let base_tree = self.tree_of(base)?;
        let new_tree = self
            .repo
            .find_tree(tree)
            .map_err(|e| self.err("read the new tree", e))?;
        let changes = self.tree_changes(&base_tree, &new_tree, &format!("compare with {base}"))?;
        Ok(changes
            .into_iter()
            .filter_map(|c| match c {
                Change::Addition {
                    entry_mode, path, ..
                }
                | Change::Deletion {
                    entry_mode, path, ..
                }
                | Change::Modification {
                    entry_mode, path, ..
                } => (!entry_mode.is_tree()).then(|| path.to_str_lossy().into_owned()),
            })
            .collect())
    }

    /// The worktree's index, or why git must handle the worktree (counted): a sparse or split
    /// index, unmerged entries, a submodule, or content conversion.
    pub(crate) fn plain_index(&self) -> Result<Result<gix::worktree::Index, Fallback>, Error> {
        let index = self
            .repo
            .index_or_empty()
            .map_err(|e| self.err("read the index", e))?;
        Ok(match self.unusual_index(&index) {
            Some(f) => Err(fell_back(f)),
            None => Ok(index),
        })
    }

    /// Why git must handle a worktree with this index.
    fn unusual_index(&self, index: &gix::index::File) -> Option<Fallback> {
        if index.is_sparse() || index.link().is_some() {
            return Some(Fallback::SplitOrSparseIndex);
        }
        if index.entries().iter().any(|e| e.stage_raw() != 0) {
            return Some(Fallback::Unmerged);
        }
        if index
            .entries()
            .iter()
            .any(|e| e.mode == gix::index::entry::Mode::COMMIT)
        {
            return Some(Fallback::Submodule);
        }
        self.converts_content(index).then_some(Fallback::Filters)
    }

    /// Whether attributes or config ask git to convert content between the worktree and the
    /// repository (filters, `text`, `eol`, `ident`, encodings, `core.autocrlf`), or to ignore
    /// the executable bit or symlinks: git then commits, so the commit is what `git add` would
    /// make.
    fn converts_content(&self, index: &gix::index::File) -> bool {
        const WORDS: [&str; 6] = ["filter", "text", "eol", "ident", "crlf", "encoding"];
        let mentions = |bytes: &[u8]| {
            let s = String::from_utf8_lossy(bytes);
            s.lines()
                .filter(|l| !l.trim_start().starts_with('#'))
                .any(|l| WORDS.iter().any(|w| l.contains(w)))
        };
        let config = self.repo.config_snapshot();
        let on = |key: &str| config.boolean(key);
        if config
            .string("core.autocrlf")
            .is_some_and(|v| !v.eq_ignore_ascii_case(b"false"))
            || on("core.fileMode") == Some(false)
            || on("core.symlinks") == Some(false)
            || config.string("core.attributesFile").is_some()
        {
            return true;
        }
        let common = self.repo.common_dir();
        if std::fs::read(common.join("info").join("attributes")).is_ok_and(|b| mentions(&b)) {
            return true;
        }
        let Some(workdir) = self.repo.workdir() else {
            return false;
        };
        let attributes = index.entries().iter().filter_map(|e| {
            let p = e.path(index);
            (p == ".gitattributes" || p.ends_with(b"/.gitattributes")).then_some(p)
        });
        for p in attributes {
            if std::fs::read(workdir.join(p.to_str_lossy().as_ref())).is_ok_and(|b| mentions(&b)) {
                return true;
            }
        }
        // A new, untracked `.gitattributes` the status is about to report.
        std::fs::read(workdir.join(".gitattributes")).is_ok_and(|b| mentions(&b))
    }
}
