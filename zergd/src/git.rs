//! Git operations: worktrees, the staging merge, and resets. Every call is `git -C <dir> …`
//! as a child process; nothing here touches the user's checkout except to read `HEAD`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

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

/// Runs git in `dir` and returns trimmed stdout.
pub fn git(dir: &Path, args: &[&str]) -> Result<String, GitError> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_TERMINAL_PROMPT", "0")
        // Merges must never wait for an editor (a known hang in peers' tools).
        .env("GIT_EDITOR", "true")
        .env("GIT_MERGE_AUTOEDIT", "no")
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

/// Moves a worktree's branch and files to `commit`, discarding local changes. Lock files left
/// by a worker killed in the middle of a git command are removed once (zergd only resets a
/// worker worktree while its worker is idle or dead).
pub fn reset_hard(worktree: &Path, commit: &str) -> Result<(), GitError> {
    match git(worktree, &["reset", "--hard", "-q", commit]) {
        Err(e) if e.stderr.contains(".lock") => {
            if let Ok(dir) = git(worktree, &["rev-parse", "--absolute-git-dir"]) {
                for name in ["index.lock", "HEAD.lock"] {
                    let _ = std::fs::remove_file(Path::new(&dir).join(name));
                }
            }
            git(worktree, &["reset", "--hard", "-q", commit])?;
            Ok(())
        }
        other => other.map(|_| ()),
    }
}

/// Removes a worktree (and, when `delete_branch`, its branch).
pub fn remove_worktree(repo: &Path, path: &Path, branch: Option<&str>) -> Result<(), GitError> {
    if path.exists() {
        git(
            repo,
            &["worktree", "remove", "--force", &path.to_string_lossy()],
        )?;
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

/// Commits `(sha, Task-ID trailer)` reachable from `tip` but not from `base`.
pub fn task_commits(repo: &Path, base: &str, tip: &str) -> Result<Vec<(String, String)>, GitError> {
    let out = git(
        repo,
        &[
            "log",
            "--format=%H %(trailers:key=Task-ID,valueonly,separator=%x2C)",
            &format!("{base}..{tip}"),
        ],
    )?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let (sha, ids) = l.split_once(' ')?;
            let ids = ids.trim();
            (!ids.is_empty()).then(|| (sha.to_string(), ids.to_string()))
        })
        .collect())
}

/// Files changed between two commits.
pub fn changed_files(repo: &Path, from: &str, to: &str) -> Result<Vec<String>, GitError> {
    Ok(git(repo, &["diff", "--name-only", from, to])?
        .lines()
        .map(str::to_string)
        .collect())
}
