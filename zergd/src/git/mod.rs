//! Git operations: worktrees, the staging merge, and resets. Every call is `git -C <dir> …`
//! as a child process; nothing here touches the user's checkout except to read `HEAD`.

use std::path::{Path, PathBuf};
use std::process::Stdio;

pub mod objects;

/// A git command that failed.
#[derive(Debug, thiserror::Error)]
#[error("git {args} failed in {dir}: {stderr}")]
pub struct GitError {
    /// The arguments.
    pub args: String,
    /// Where it ran.
    pub dir: PathBuf,
    /// Its stderr (trimmed).
    pub stderr: String,
}

pub use zerg_proto::contract::{is_object_id, scrubbed_command as scrubbed};

/// Runs git in `dir` and returns trimmed stdout.
pub fn git(dir: &Path, args: &[&str]) -> Result<String, GitError> {
    let out = scrubbed("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| GitError {
            args: args.join(" "),
            dir: dir.to_path_buf(),
            stderr: format!("cannot run git: {e}"),
        })?;
    if !out.status.success() {
        let mut stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if stderr.is_empty() {
            stderr = String::from_utf8_lossy(&out.stdout).trim().to_string();
        }
        return Err(GitError {
            args: args.join(" "),
            dir: dir.to_path_buf(),
            stderr,
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The top level of the repository containing `dir`.
pub fn toplevel(dir: &Path) -> Result<PathBuf, GitError> {
    git(dir, &["rev-parse", "--show-toplevel"]).map(PathBuf::from)
}

/// The checked-out branch name (or `HEAD` when detached) and commit.
pub fn head(repo: &Path) -> Result<(String, String), GitError> {
    let commit = git(repo, &["rev-parse", "HEAD"])?;
    let branch = git(repo, &["rev-parse", "--abbrev-ref", "HEAD"])?;
    Ok((branch, commit))
}

/// Resolves a revision to a commit id, if it exists.
pub fn rev(repo: &Path, name: &str) -> Option<String> {
    git(
        repo,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{name}^{{commit}}"),
        ],
    )
    .ok()
}

/// Makes sure `path` is a worktree of `repo` on `branch`, creating the branch at `start` if it
/// does not exist. An existing worktree is kept as it is (its branch is owned by zergd).
pub fn ensure_worktree(
    repo: &Path,
    path: &Path,
    branch: &str,
    start: &str,
) -> Result<(), GitError> {
    if path.join(".git").exists() {
        return Ok(());
    }
    // A stale registration (directory deleted by hand) blocks `worktree add`.
    let _ = git(repo, &["worktree", "prune"]);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| GitError {
            args: "mkdir".into(),
            dir: parent.to_path_buf(),
            stderr: e.to_string(),
        })?;
    }
    let p = path.to_string_lossy().to_string();
    if rev(repo, &format!("refs/heads/{branch}")).is_some() {
        git(repo, &["worktree", "add", "--force", &p, branch])?;
    } else {
        git(
            repo,
            &["worktree", "add", "--force", "-b", branch, &p, start],
        )?;
    }
    Ok(())
}

/// Removes a worktree (and, when `delete_branch`, its branch). A worktree whose `.git` file a
/// worker damaged is deleted directly and its registration pruned.
pub fn remove_worktree(repo: &Path, path: &Path, branch: Option<&str>) -> Result<(), GitError> {
    if path.exists()
        && let Err(e) = git(
            repo,
            &["worktree", "remove", "--force", &path.to_string_lossy()],
        )
    {
        std::fs::remove_dir_all(path).map_err(|io| GitError {
            args: e.args.clone(),
            dir: e.dir.clone(),
            stderr: format!("{}; removing the directory failed too: {io}", e.stderr),
        })?;
    }
    let _ = git(repo, &["worktree", "prune"]);
    if let Some(b) = branch {
        let _ = git(repo, &["branch", "-D", b]);
    }
    Ok(())
}

/// Whether `ancestor` is an ancestor of (or equal to) `of`.
pub fn is_ancestor(repo: &Path, ancestor: &str, of: &str) -> bool {
    git(repo, &["merge-base", "--is-ancestor", ancestor, of]).is_ok()
}

/// Outcome of merging one commit into the staging worktree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MergeOutcome {
    /// Merged (or already contained); the new staging head.
    Merged(String),
    /// Conflict; the merge was aborted. The conflicting paths.
    Conflict(Vec<String>),
}

/// Merges `commit` into the branch checked out in `staging_wt`.
pub fn merge_into(
    staging_wt: &Path,
    commit: &str,
    message: &str,
) -> Result<MergeOutcome, GitError> {
    let head = git(staging_wt, &["rev-parse", "HEAD"])?;
    if is_ancestor(staging_wt, commit, &head) {
        return Ok(MergeOutcome::Merged(head));
    }
    match git(
        staging_wt,
        &["merge", "--no-ff", "--no-edit", "-m", message, commit],
    ) {
        Ok(_) => Ok(MergeOutcome::Merged(git(
            staging_wt,
            &["rev-parse", "HEAD"],
        )?)),
        Err(e) => {
            let files =
                git(staging_wt, &["diff", "--name-only", "--diff-filter=U"]).unwrap_or_default();
            let _ = git(staging_wt, &["merge", "--abort"]);
            if files.is_empty() {
                Err(e)
            } else {
                Ok(MergeOutcome::Conflict(
                    files.lines().map(str::to_string).collect(),
                ))
            }
        }
    }
}

/// Checks a commit a worker reports before zergd accepts it: it exists in the repository, it
/// descends from the task's base commit, and it leaves `protected` (the rush's committed spec
/// directory) exactly as the base has it. The error says which check failed.
pub fn check_task_commit(
    repo: &Path,
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
    if rev(repo, commit).as_deref() != Some(commit) {
        return Err(format!("commit {commit} is not a commit in the repository"));
    }
    if base.is_empty() {
        return Ok(());
    }
    if !is_ancestor(repo, base, commit) {
        return Err(format!(
            "commit {commit} does not descend from the task's base commit {base}"
        ));
    }
    let changed = git(
        repo,
        &[
            "diff",
            "--name-only",
            "--no-renames",
            base,
            commit,
            "--",
            protected,
        ],
    )
    .map_err(|e| e.to_string())?;
    if !changed.is_empty() {
        let files: Vec<&str> = changed.lines().take(5).collect();
        return Err(format!(
            "commit {commit} changes the rush's spec ({}), which tasks must not touch",
            files.join(", ")
        ));
    }
    Ok(())
}

/// Points `refs/heads/<branch>` at `new`; with `old`, only if it is still there (a
/// compare-and-swap, so a later move by zergd is never undone).
pub fn move_branch(
    repo: &Path,
    branch: &str,
    new: &str,
    old: Option<&str>,
) -> Result<(), GitError> {
    let r = format!("refs/heads/{branch}");
    match old {
        Some(o) => git(repo, &["update-ref", &r, new, o]).map(|_| ()),
        None => git(repo, &["update-ref", &r, new]).map(|_| ()),
    }
}

/// Points `refs/<name>` (e.g. a checkpoint's `refs/zerg/<feature>/wip/<task>`) at `commit`.
pub fn set_ref(repo: &Path, name: &str, commit: &str) -> Result<(), GitError> {
    git(repo, &["update-ref", name, commit]).map(|_| ())
}
