//! `zergctl land`: a complete rush's staging branch into the branch it started from.
//!
//! When the base branch has not moved since (it is an ancestor of the staging head), it moves
//! to the staging head: a fast-forward, with no gate run again (they passed on that very commit
//! at the last level merge). When it has moved, the staging head is merged into it in a scratch
//! worktree of zergd's (`.zerg/worktrees/<feature>/land`), the worktree is set up as the staging
//! one is, the quality gates run there once more, and only when every required one passed does
//! the base move to the merge commit. The base moves with an expected old value, so a commit
//! someone made meanwhile is never lost. When the base branch is checked out in the user's
//! checkout, it moves by `git merge --ff-only` there (index and files too), and is refused
//! first when uncommitted changes touch a file the landing would change.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::calls::{GateRun, LandHow, Landed};
use crate::config::{GitIdentity, QualityGate, WorktreeConfig};
use crate::error::SupervisorError;
use crate::git;

use super::jobs::{copy_ignored, run_gate_in_image, run_shell_confined, sanitize, tail};

/// Bytes of a gate's output kept in the answer.
const GATE_TAIL: usize = 2000;

/// What a landing needs of its rush.
#[derive(Debug, Clone)]
pub struct LandJob {
    /// The user's repository (its main checkout).
    pub repo: PathBuf,
    /// The feature.
    pub feature: String,
    /// The branch the rush started from.
    pub base_branch: String,
    /// The rush's base commit (git attributes come from it, as for the staging merges).
    pub base_commit: String,
    /// The scratch worktree of a merge landing.
    pub scratch: PathBuf,
    /// The rush's quality gates.
    pub gates: Vec<QualityGate>,
    /// `worktree:` of the rush: copies and setup for the scratch worktree.
    pub worktree: WorktreeConfig,
    /// The gid that must read the copies (gates in the worker image as another user).
    pub readable_by: Option<u32>,
    /// Where the gates run: a container of the worker image, or (`None`) the host.
    pub gate_image: Option<zerg_launch::gate::GateContainer>,
    /// How the gates that run on the host are confined (see [`crate::sandbox::for_gates`]).
    pub gate_sandbox: Option<crate::sandbox::GateSandbox>,
    /// Where each gate's full output goes.
    pub log_dir: PathBuf,
    /// Who the merge commit is by when git has no identity.
    pub identity: GitIdentity,
    /// Run the gates on the staging head and move nothing.
    pub gates_only: bool,
}

/// Lands `job`'s rush (see the module doc). Every refusal says why and changes nothing.
pub fn land(job: &LandJob) -> Result<Landed, SupervisorError> {
    let repo = &job.repo;
    let staging_branch = crate::domain::staging_branch(&job.feature);
    let base_ref = format!("refs/heads/{}", job.base_branch);
    let staging = git::rev(repo, &format!("refs/heads/{staging_branch}")).ok_or_else(|| {
        SupervisorError::failed_precondition(format!(
            "the staging branch {staging_branch} is gone: there is nothing to land"
        ))
    })?;
    let base = git::rev(repo, &base_ref).ok_or_else(|| {
        SupervisorError::failed_precondition(format!(
            "the base branch {} no longer exists: merge {staging_branch} yourself",
            job.base_branch
        ))
    })?;
    let landed = |how, commit: String, gates| Landed {
        how,
        commit,
        base_branch: job.base_branch.clone(),
        staging_branch: staging_branch.clone(),
        gates,
    };
    if job.gates_only {
        let gates = in_scratch(job, &staging, None)?.1;
        return Ok(landed(LandHow::Checked, staging, gates));
    }
    if git::is_ancestor(repo, &staging, &base) {
        return Ok(landed(LandHow::AlreadyLanded, base, Vec::new()));
    }
    let (how, commit, gates) = if git::is_ancestor(repo, &base, &staging) {
        (LandHow::FastForward, staging.clone(), Vec::new())
    } else {
        let (merge, gates) = in_scratch(job, &base, Some(&staging))?;
        (LandHow::Merge, merge, gates)
    };
    move_base(job, &base_ref, &base, &commit)?;
    Ok(landed(how, commit, gates))
}

/// In a scratch worktree at `at` (merging `merge` into it first, when given): the worktree set
/// up, the gates run. Returns the worktree's head and the gates' runs; a merge conflict or a
/// required gate that failed is an error naming it. The worktree is removed however it ends.
fn in_scratch(
    job: &LandJob,
    at: &str,
    merge: Option<&str>,
) -> Result<(String, Vec<GateRun>), SupervisorError> {
    let repo = &job.repo;
    let branch = format!("zerg/{}/land", job.feature);
    let trusted = git::Trusted::new(repo, &job.base_commit);
    let _ = git::remove_worktree(repo, &job.scratch, Some(&branch));
    git::ensure_worktree(repo, &job.scratch, &branch, at, &trusted).map_err(|e| {
        SupervisorError::internal(format!("cannot make the landing's worktree: {e}"))
    })?;
    let result = scratch_work(job, merge, &trusted);
    let _ = git::remove_worktree(repo, &job.scratch, Some(&branch));
    result
}

fn scratch_work(
    job: &LandJob,
    merge: Option<&str>,
    trusted: &git::Trusted,
) -> Result<(String, Vec<GateRun>), SupervisorError> {
    let dir = &job.scratch;
    if let Some(staging) = merge {
        let identity = (!git::has_identity(dir))
            .then_some((job.identity.name.as_str(), job.identity.email.as_str()));
        let message = format!(
            "zerg: land {} into {}",
            crate::domain::staging_branch(&job.feature),
            job.base_branch
        );
        match git::merge_into(dir, staging, &message, trusted, identity) {
            Ok(git::MergeOutcome::Merged(_)) => {}
            Ok(git::MergeOutcome::Conflict(files)) => {
                return Err(SupervisorError::failed_precondition(format!(
                    "{} has moved since the rush started, and merging {} into it conflicts in: {}; merge it yourself, or land after resolving",
                    job.base_branch,
                    crate::domain::staging_branch(&job.feature),
                    files.join(", ")
                )));
            }
            Err(e) => return Err(SupervisorError::internal(e.to_string())),
        }
    }
    let head = git::rev(dir, "HEAD")
        .ok_or_else(|| SupervisorError::internal("the landing's worktree has no HEAD"))?;
    let gates = run_gates(job)?;
    if let Some(failed) = gates.iter().find(|g| g.required && !g.passed) {
        return Err(SupervisorError::failed_precondition(format!(
            "quality gate '{}' failed on {}; nothing was landed: {}",
            failed.name,
            if merge.is_some() {
                "the merge of staging into the base branch"
            } else {
                "the staging head"
            },
            tail(&failed.output, 600)
        )));
    }
    Ok((head, gates))
}

/// The worktree's copies and setup, then every gate, in the scratch worktree.
fn run_gates(job: &LandJob) -> Result<Vec<GateRun>, SupervisorError> {
    let dir = &job.scratch;
    if job.gates.is_empty() {
        return Ok(Vec::new());
    }
    copy_ignored(
        &job.repo,
        &job.worktree,
        std::slice::from_ref(dir),
        job.readable_by,
    )?;
    if job.gate_image.is_none() {
        let started = std::time::Instant::now();
        for (i, cmd) in job.worktree.setup.iter().enumerate() {
            let left = job
                .worktree
                .setup_timeout_seconds
                .saturating_sub(started.elapsed());
            let log = job.log_dir.join(format!("setup-{i}-land.log"));
            let confined = job
                .gate_sandbox
                .as_ref()
                .map(|g| g.policy(dir, true).map(|p| (g.bwrap.clone(), p)))
                .transpose()
                .map_err(|e| {
                    SupervisorError::internal(format!("cannot prepare the gates' sandbox: {e}"))
                })?;
            let (ok, output) = run_shell_confined(cmd, dir, left, Some(&log), confined.as_ref());
            if !ok {
                return Err(SupervisorError::failed_precondition(format!(
                    "worktree.setup[{i}] `{cmd}` failed in the landing's worktree; nothing was landed: {}",
                    tail(&output, 600)
                )));
            }
        }
    }
    // Nothing stops a landing's gates early but their own timeouts.
    let (_never, stop) = tokio::sync::watch::channel(false);
    let mut runs = Vec::new();
    for (i, g) in job.gates.iter().enumerate() {
        let log = job
            .log_dir
            .join(format!("gate-{}-land.log", sanitize(&g.name)));
        let (passed, output) = match &job.gate_image {
            Some(image) => {
                let mut image = image.clone();
                image.staging = dir.clone();
                run_gate_in_image(
                    &image,
                    g,
                    &format!("land-{i}"),
                    &job.worktree.setup,
                    stop.clone(),
                    &log,
                )
            }
            None => {
                let confined = job
                    .gate_sandbox
                    .as_ref()
                    .map(|s| s.policy(dir, false).map(|p| (s.bwrap.clone(), p)))
                    .transpose()
                    .map_err(|e| {
                        SupervisorError::internal(format!("cannot prepare the gates' sandbox: {e}"))
                    })?;
                run_shell_confined(&g.command, dir, g.timeout, Some(&log), confined.as_ref())
            }
        };
        runs.push(GateRun {
            name: g.name.clone(),
            required: g.required,
            passed,
            output: tail(&output, GATE_TAIL),
        });
        if g.required && !passed {
            break;
        }
    }
    Ok(runs)
}

/// Moves the base branch from `old` to `new`: in the user's checkout when it has the branch
/// checked out (refused when its uncommitted changes touch a file that changes), else the ref
/// alone, expecting `old`.
fn move_base(job: &LandJob, base_ref: &str, old: &str, new: &str) -> Result<(), SupervisorError> {
    let repo = &job.repo;
    let checked_out = git::git(repo, &["symbolic-ref", "-q", "HEAD"]).ok();
    if checked_out.as_deref() != Some(base_ref) {
        return git::git(
            repo,
            &["update-ref", "-m", "zerg: land", base_ref, new, old],
        )
        .map(|_| ())
        .map_err(|e| {
            SupervisorError::failed_precondition(format!(
                "{} moved while landing: {e}",
                job.base_branch
            ))
        });
    }
    let changing: BTreeSet<String> = raw_git(repo, &["diff", "--name-only", "-z", old, new])?
        .split('\0')
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    let dirty = dirty_paths(repo)?;
    let both: Vec<&String> = dirty.intersection(&changing).collect();
    if !both.is_empty() {
        let names: Vec<&str> = both.iter().take(20).map(|s| s.as_str()).collect();
        return Err(SupervisorError::failed_precondition(format!(
            "your checkout has uncommitted changes in files the landing would change: {}; commit or stash them, then land again",
            names.join(", ")
        )));
    }
    git::git(repo, &["merge", "--ff-only", "-q", new])
        .map(|_| ())
        .map_err(|e| SupervisorError::failed_precondition(format!("git merge --ff-only: {e}")))
}

/// Paths with uncommitted changes in the checkout: modified, staged, deleted, and untracked
/// (which a landing that adds them would overwrite).
fn dirty_paths(repo: &Path) -> Result<BTreeSet<String>, SupervisorError> {
    let out = raw_git(
        repo,
        &["status", "--porcelain=v1", "-z", "--untracked-files=all"],
    )?;
    let mut paths = BTreeSet::new();
    let mut fields = out.split('\0');
    while let Some(entry) = fields.next() {
        if entry.len() < 4 {
            continue;
        }
        let (code, path) = entry.split_at(3);
        paths.insert(path.to_string());
        // A rename or copy names its source in the next field.
        if (code.starts_with('R') || code.starts_with('C'))
            && let Some(from) = fields.next()
        {
            paths.insert(from.to_string());
        }
    }
    Ok(paths)
}

/// Git's whole stdout, untrimmed (a `-z` listing's first entry may begin with a space).
fn raw_git(repo: &Path, args: &[&str]) -> Result<String, SupervisorError> {
    let out = git::scrubbed("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| SupervisorError::internal(format!("cannot run git: {e}")))?;
    if !out.status.success() {
        return Err(SupervisorError::internal(format!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirty_paths_reads_modified_untracked_and_renamed_entries() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        zerg_proto::testkit::git(r, &["init", "-q", "-b", "main"]);
        std::fs::write(r.join("a.txt"), "a").unwrap();
        std::fs::write(r.join("b.txt"), "b").unwrap();
        zerg_proto::testkit::git(r, &["add", "-A"]);
        zerg_proto::testkit::git(r, &["commit", "-q", "-m", "init"]);
        std::fs::write(r.join("a.txt"), "changed").unwrap();
        std::fs::write(r.join("new file.txt"), "n").unwrap();
        zerg_proto::testkit::git(r, &["mv", "b.txt", "c.txt"]);
        let got = dirty_paths(r).unwrap();
        let want: BTreeSet<String> = ["a.txt", "b.txt", "c.txt", "new file.txt"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(got, want);
    }
}
