//! A level's merge, in memory: each worker's head merged into staging with gix's commit
//! merge, then staging and every worker branch moved in one ref transaction.

use crate::{Error, Expect, Fallback, Identity, Repo, fell_back};

/// One level's merge.
#[derive(Debug, Clone)]
pub struct LevelMerge {
    /// The staging branch (full ref name); it must exist.
    pub staging: String,
    /// What to merge, in order: each commit and the message of its merge commit.
    pub heads: Vec<(String, String)>,
    /// Refs (full names) that move to the merged head with staging, whatever they point at now.
    pub also_move: Vec<String>,
    /// Author and committer of the merge commits.
    pub identity: Identity,
}

/// How a level merge went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Merged {
    /// Staging and the other refs now point at this commit.
    Head(String),
    /// Nothing was moved: this merge must be done by git (a conflict, whose list should be
    /// git's own, or a merge driver the repository configures).
    NeedsGit(Fallback),
}

impl Repo {
    /// Merges `m.heads` into `m.staging` without touching any worktree: every head already
    /// contained is skipped, every other one gets a merge commit (never a fast-forward). Staging
    /// moves only if it still points where it did when the merge began. The merge's commits and
    /// trees go to the store as one pack, written before any ref moves.
    pub fn merge_level(&self, m: &LevelMerge) -> Result<Merged, Error> {
        let mem = self.in_memory();
        let (old, new) = match mem.merge_heads(m)? {
            Ok(ends) => ends,
            Err(fallback) => return Ok(Merged::NeedsGit(fallback)),
        };
        // Written before any ref moves: a ref never points at an object not on disk.
        self.store_objects(&mem.take_objects())?;
        let new = new.to_string();
        let mut moves = vec![(m.staging.as_str(), new.as_str(), Expect::Is(old))];
        moves.extend(
            m.also_move
                .iter()
                .map(|r| (r.as_str(), new.as_str(), Expect::Any)),
        );
        self.move_refs(&moves, "zerg: merge level")?;
        Ok(Merged::Head(new))
    }

    /// The merge commits of [`Repo::merge_level`], written to this handle (one made by
    /// [`Repo::in_memory`]): staging's commit and the merged head, or why git must merge.
    fn merge_heads(
        &self,
        m: &LevelMerge,
    ) -> Result<Result<(String, gix::ObjectId), Fallback>, Error> {
        if self.configures_drivers() {
            return Ok(Err(fell_back(Fallback::Merge)));
        }
        let old = self
            .commit_id(&m.staging)
            .ok_or_else(|| self.err(format!("resolve {}", m.staging), "no such branch"))?;
        let who = m.identity.signature();
        let mut time = gix::date::parse::TimeBuf::default();
        let who = who.to_ref(&mut time);
        let options: gix::merge::commit::Options = self
            .repo
            .tree_merge_options()
            .map_err(|e| self.err("read the merge options", e))?
            .into();
        let mut cur = self.oid(&old)?;
        for (head, message) in &m.heads {
            let theirs = self.oid(head)?;
            if self.is_ancestor(head, &cur.to_string())? {
                continue;
            }
            let labels = gix::merge::blob::builtin_driver::text::Labels {
                ancestor: None,
                current: Some("staging".into()),
                other: Some(head.as_str().into()),
            };
            let mut out = self
                .repo
                .merge_commits(cur, theirs, labels, options.clone())
                .map_err(|e| self.err(format!("merge {head}"), e))?;
            if out
                .tree_merge
                .has_unresolved_conflicts(gix::merge::tree::TreatAsUnresolved::git())
            {
                return Ok(Err(fell_back(Fallback::Merge)));
            }
            let tree = out
                .tree_merge
                .tree
                .write()
                .map_err(|e| self.err(format!("write the tree of the merge of {head}"), e))?;
            let commit = self
                .repo
                .new_commit_as(who, who, message, tree, [cur, theirs])
                .map_err(|e| self.err(format!("write the merge commit of {head}"), e))?;
            cur = commit.id;
        }
        Ok(Ok((old, cur)))
    }

    /// Whether the repository's config names a merge driver or a content filter, which a
    /// worker-committed `.gitattributes` could select: those merges are left to git, which
    /// runs with the drivers switched off.
    fn configures_drivers(&self) -> bool {
        let config = self.repo.config_snapshot();
        config.sections().any(|s| {
            let name = s.header().name();
            (name == "merge" && s.value("driver").is_some())
                || (name == "filter"
                    && ["clean", "smudge", "process"]
                        .iter()
                        .any(|k| s.value(k).is_some()))
        })
    }
}
