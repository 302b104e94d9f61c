//! Reading a commit without a worktree: the blobs of its tree, what changed between two
//! commits, and blob contents, for the repository symbol map. All of it is object reads on the
//! rush's handle; nothing runs `git`.

use gix::bstr::ByteSlice;
use gix::objs::tree::EntryKind;

use crate::{Error, Repo};

/// One file of a tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeBlob {
    /// Repository-relative path, `/`-separated (lossily decoded when it is not UTF-8).
    pub path: String,
    /// Blob id, hex.
    pub id: String,
    /// Size in bytes (`u64::MAX` when the object's header could not be read).
    pub size: u64,
    /// A regular or executable file (not a symlink) with a UTF-8 path.
    pub regular: bool,
}

impl Repo {
    /// The commit `rev` names (`HEAD`, a branch, an id). An empty name, one starting with `-`,
    /// or one that names no commit is an error that says so.
    pub fn resolve_commit(&self, rev: &str) -> Result<String, Error> {
        if rev.is_empty() || rev.starts_with('-') {
            return Err(self.err(format!("resolve {rev:?}"), "not a revision"));
        }
        self.commit_id(rev)
            .ok_or_else(|| self.err(format!("resolve {rev}"), "it does not name a commit"))
    }

    /// Every blob of `commit`'s tree, symlinks included (marked not regular); submodules are
    /// left out.
    pub fn list_blobs(&self, commit: &str) -> Result<Vec<TreeBlob>, Error> {
        let tree = self.tree_of(commit)?;
        let mut recorder = gix::traverse::tree::Recorder::default();
        tree.traverse()
            .breadthfirst(&mut recorder)
            .map_err(|e| self.err(format!("list the tree of {commit}"), e))?;
        Ok(recorder
            .records
            .into_iter()
            .filter(|e| e.mode.is_blob_or_symlink())
            .map(|e| self.blob(e.filepath.as_bstr(), e.oid, e.mode.kind()))
            .collect())
    }

    /// What changed between the trees of `old` and `new`: each changed path with its new blob,
    /// or `None` when it is gone or is no longer a blob. No rename detection: a rename is its
    /// old path gone and its new path added.
    pub fn changed_blobs(
        &self,
        old: &str,
        new: &str,
    ) -> Result<Vec<(String, Option<TreeBlob>)>, Error> {
        let (old_tree, new_tree) = (self.tree_of(old)?, self.tree_of(new)?);
        let records =
            self.tree_changes(&old_tree, &new_tree, &format!("compare {old} with {new}"))?;
        use gix::diff::tree::recorder::Change;
        let mut out = Vec::new();
        for change in records {
            let (path, now) = match change {
                Change::Deletion {
                    entry_mode, path, ..
                } => {
                    if entry_mode.is_tree() {
                        continue;
                    }
                    (path, None)
                }
                Change::Addition {
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
                } => {
                    if entry_mode.is_tree() {
                        continue;
                    }
                    let blob = entry_mode
                        .is_blob_or_symlink()
                        .then(|| self.blob(path.as_bstr(), oid, entry_mode.kind()));
                    (path, blob)
                }
            };
            out.push((path.to_str_lossy().into_owned(), now));
        }
        Ok(out)
    }

    /// Reads the blobs `ids` in order and hands each to `each` with its index: its bytes, or
    /// `None` when it is larger than `max` bytes (not read into memory). `each` returns `false`
    /// to stop early.
    pub fn read_blobs(
        &self,
        ids: &[String],
        max: u64,
        mut each: impl FnMut(usize, Option<Vec<u8>>) -> bool,
    ) -> Result<(), Error> {
        for (i, hex) in ids.iter().enumerate() {
            let id = self.oid(hex)?;
            let header = self
                .repo
                .find_header(id)
                .map_err(|e| self.err(format!("read {hex}"), e))?;
            if header.kind() != gix::object::Kind::Blob {
                return Err(self.err(format!("read {hex}"), format!("it is a {}", header.kind())));
            }
            let bytes = if header.size() > max {
                None
            } else {
                let blob = self
                    .repo
                    .find_blob(id)
                    .map_err(|e| self.err(format!("read {hex}"), e))?;
                Some(blob.detach().data)
            };
            if !each(i, bytes) {
                break;
            }
        }
        Ok(())
    }

    /// The changes from `old` to `new`, path by path, with no rename detection (so a rename
    /// reports its old path gone, which matters to the out-of-scope list).
    pub(crate) fn tree_changes(
        &self,
        old: &gix::Tree<'_>,
        new: &gix::Tree<'_>,
        what: &str,
    ) -> Result<Vec<gix::diff::tree::recorder::Change>, Error> {
        let mut recorder = gix::diff::tree::Recorder::default();
        gix::diff::tree(
            gix::objs::TreeRefIter::from_bytes(&old.data, old.id.kind()),
            gix::objs::TreeRefIter::from_bytes(&new.data, new.id.kind()),
            gix::diff::tree::State::default(),
            &self.repo.objects,
            &mut recorder,
        )
        .map_err(|e| self.err(what, e))?;
        Ok(recorder.records)
    }

    pub(crate) fn tree_of(&self, commit: &str) -> Result<gix::Tree<'_>, Error> {
        self.repo
            .find_commit(self.oid(commit)?)
            .and_then(|c| c.tree())
            .map_err(|e| self.err(format!("read the tree of {commit}"), e))
    }

    fn blob(&self, path: &gix::bstr::BStr, id: gix::ObjectId, kind: EntryKind) -> TreeBlob {
        let utf8 = path.to_str().is_ok();
        TreeBlob {
            path: path.to_str_lossy().into_owned(),
            id: id.to_string(),
            size: self.repo.find_header(id).map_or(u64::MAX, |h| h.size()),
            regular: utf8 && matches!(kind, EntryKind::Blob | EntryKind::BlobExecutable),
        }
    }
}
