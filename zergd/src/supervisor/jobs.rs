//! Blocking work the supervisor hands to `spawn_blocking`: preparing a rush (validation,
//! snapshots, worktrees), building its symbol map, and merging a level into staging.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant as StdInstant, SystemTime};

use crate::error::SupervisorError;
use zerg_proto::graph::{self, GraphError, TaskGraph};

use super::rush::{
    IndexJob, Indexed, MergeJob, MergeResult, RushPaths, staging_branch, worker_branch,
};
use crate::clock::iso_millis;
use crate::config::{Config, GatesRunOn, QualityGate};
use crate::domain::{LevelStatus, MergeStatus, Mode, RushState, TaskStatus, WorkerStatus};
use crate::git::{self, MergeOutcome};
use crate::state::{FORMAT_VERSION, LevelState, RushMeta, StateDoc, TaskState, WorkerState};

/// What a prepared rush consists of.
pub struct Prepared {
    /// Initial or resumed state.
    pub doc: StateDoc,
    /// The graph from the snapshot.
    pub graph: TaskGraph,
    /// The config snapshot.
    pub config: Config,
    /// File locations.
    pub paths: RushPaths,
    /// Feature context for prompts.
    pub spec_context: String,
}

/// Resolves and checks the repository path of a request.
pub fn resolve_repo(repo: &str) -> Result<PathBuf, SupervisorError> {
    if repo.is_empty() {
        return Err(SupervisorError::invalid_argument(
            "repo: no repository path given",
        ));
    }
    // Found in process: every command a client sends names its repository this way.
    zerg_git::toplevel(Path::new(repo)).map_err(|e| {
        SupervisorError::invalid_argument(format!(
            "{repo} is not inside a git repository: {}",
            e.message
        ))
    })
}

/// Formats graph errors for a client: every error on its own line.
pub fn graph_error_status(e: GraphError) -> SupervisorError {
    match e {
        GraphError::Invalid { path, errors, .. } => {
            let lines: Vec<String> = errors.iter().map(|d| format!("  - {d}")).collect();
            SupervisorError::invalid_argument(format!(
                "{}: task graph is invalid ({} errors):\n{}",
                path.display(),
                errors.len(),
                lines.join("\n")
            ))
        }
        other => SupervisorError::invalid_argument(other.to_string()),
    }
}

fn internal(ctx: &str) -> impl FnOnce(git::GitError) -> SupervisorError + '_ {
    move |e| SupervisorError::internal(format!("{ctx}: {e}"))
}

/// How many of the task graph's warnings a rush keeps in its state, its status and the reply to
/// `rush`; the rest are counted in one line. A generated graph can have tens of thousands (every
/// task of a level above 1 with no dependency is "unreachable"), and each copy of the rush's
/// status carried them all. `zergctl validate` lists every one.
const GRAPH_WARNINGS_KEPT: usize = 50;

/// Prepares a fresh rush: validates the graph and config, snapshots the spec directory and
/// config, resets zerg's branches for the feature and creates the worktrees.
pub fn prepare_fresh(
    repo: &Path,
    feature: &str,
    workers: u32,
    mode: Mode,
    rush_id: &str,
    wall: SystemTime,
) -> Result<(Prepared, Vec<String>), SupervisorError> {
    graph::validate_feature_name(feature)
        .map_err(|e| SupervisorError::invalid_argument(format!("feature: {e}")))?;
    let spec_src = repo.join(".gsd").join("specs").join(feature);
    let graph_path = spec_src.join("task-graph.json");
    if !graph_path.exists() {
        return Err(SupervisorError::not_found(format!(
            "{} does not exist: create the task graph for feature '{feature}' first",
            graph_path.display()
        )));
    }
    let validated = graph::load(&graph_path).map_err(graph_error_status)?;
    if validated.graph.feature != feature {
        return Err(SupervisorError::invalid_argument(format!(
            "{}: field `feature` is '{}' but the rush is for '{feature}'",
            graph_path.display(),
            validated.graph.feature
        )));
    }
    let (config, config_warnings) =
        Config::load(repo).map_err(|e| SupervisorError::invalid_argument(e.to_string()))?;
    check_root(&config, mode)?;
    crate::sandbox::check(&config, mode).map_err(SupervisorError::failed_precondition)?;
    // Before the rush's monitor opens: the logs it would append to are rotated first.
    crate::disk::rotate_logs(repo, feature, &config.logging, wall);
    let mut warnings: Vec<String> = config_warnings;
    if !git::has_identity(repo) {
        let who = &config.git.identity;
        warnings.push(format!(
            "git has no identity for this repository (no user.name / user.email); the staging merges are committed as {} <{}> (git.identity). Set your own with `git config user.name ...` and `git config user.email ...`",
            who.name, who.email
        ));
    }
    if mode != Mode::Subprocess
        && config.gates.run_on == crate::config::GatesRunOn::Host
        && !config.quality_gates.is_empty()
    {
        warnings.push(
            "gates.run_on: host: the quality gates run the code the workers wrote on this machine, as zergd's user, outside any container; a worker that commits a test, a build script or a conftest.py gets to run it here at the next level merge. Remove the setting to run them in the worker image".into(),
        );
    }
    let graph_warnings = validated.warnings.len();
    warnings.extend(
        validated
            .warnings
            .iter()
            .take(GRAPH_WARNINGS_KEPT)
            .map(|w| format!("task graph: {w}")),
    );
    if graph_warnings > GRAPH_WARNINGS_KEPT {
        warnings.push(format!(
            "task graph: {} more warnings; `zergctl validate {feature}` lists them all",
            graph_warnings - GRAPH_WARNINGS_KEPT
        ));
    }

    let (base_branch, base_commit) = git::head(repo).map_err(|e| {
        SupervisorError::failed_precondition(format!(
            "cannot read HEAD of {} (does it have a commit?): {}",
            repo.display(),
            e.stderr
        ))
    })?;
    let staging = staging_branch(feature);
    // Read in process: up to 64 worker branches are looked at.
    let handle = zerg_git::Repo::open(repo).map_err(|e| {
        SupervisorError::failed_precondition(format!("cannot open {}: {e}", repo.display()))
    })?;
    if mode.is_remote() {
        check_spec_committed(repo, &handle, &base_commit, feature, mode)?;
    }
    let on_base = |tip: &str| handle.is_ancestor(tip, &base_commit).unwrap_or(false);
    if let Some(old) = handle.commit_id(&format!("refs/heads/{staging}"))
        && !on_base(&old)
    {
        return Err(SupervisorError::failed_precondition(format!(
            "branch {staging} holds commits from an earlier rush that are not on {base_branch}; merge it, or delete it with `git branch -D {staging}`, then rush again"
        )));
    }
    let paths = RushPaths::new(repo.to_path_buf(), feature);
    // Leftovers of an earlier rush of this feature can go, but only when nothing would be lost:
    // every worker branch must already be on the base.
    let mut leftover = Vec::new();
    for w in 0..64u32 {
        let b = worker_branch(feature, w);
        let tip = handle.commit_id(&format!("refs/heads/{b}"));
        if let Some(tip) = &tip
            && !on_base(tip)
        {
            return Err(SupervisorError::failed_precondition(format!(
                "branch {b} holds commits from an earlier rush that are not on {base_branch}; merge them, or delete the branch with `git branch -D {b}`, then rush again"
            )));
        }
        if tip.is_some() || paths.worker_worktree(w).exists() {
            leftover.push((w, b));
        }
    }
    for (w, b) in leftover {
        git::remove_worktree(repo, &paths.worker_worktree(w), Some(&b))
            .map_err(internal("removing an old worktree"))?;
    }
    git::remove_worktree(repo, &paths.staging_worktree(), Some(&staging))
        .map_err(internal("removing the old staging worktree"))?;

    // Snapshot the spec directory and config: the rush runs with what was there at its start.
    let rush_dir = repo.join(".zerg").join("rush").join(feature);
    let _ = std::fs::remove_dir_all(&rush_dir);
    copy_dir(&spec_src, &paths.spec_dir).map_err(|e| {
        SupervisorError::internal(format!("snapshot of {}: {e}", spec_src.display()))
    })?;
    let cfg_src = repo.join(".zerg").join("config.yaml");
    if cfg_src.exists() {
        std::fs::copy(&cfg_src, rush_dir.join("config.yaml")).map_err(|e| {
            SupervisorError::internal(format!("snapshot of {}: {e}", cfg_src.display()))
        })?;
    }
    exclude_zerg_dirs(repo);

    let trusted = git::Trusted::new(repo, &base_commit);
    git::ensure_worktree(
        repo,
        &paths.staging_worktree(),
        &staging,
        &base_commit,
        &trusted,
    )
    .map_err(internal("creating the staging worktree"))?;
    for w in 0..workers {
        git::ensure_worktree(
            repo,
            &paths.worker_worktree(w),
            &worker_branch(feature, w),
            &base_commit,
            &trusted,
        )
        .map_err(internal("creating a worker worktree"))?;
    }
    // Into the staging worktree now; each worker's worktree gets them when the worker is
    // started (and again at a respawn).
    let copied = copy_ignored(
        repo,
        &config.worktree,
        &[paths.staging_worktree()],
        gate_reader(mode, &config),
    )?;
    if !copied.is_empty() {
        warnings.push(crate::worktree_copy::summary(&copied, mode.is_remote()));
    } else if !config.worktree.copy.is_empty() {
        warnings.push(format!(
            "worktree.copy: no ignored file of your checkout matches {:?}; nothing is copied",
            config.worktree.copy
        ));
    }

    let graph = validated.graph;
    let meta = RushMeta {
        rush_id: rush_id.to_string(),
        repo: repo.to_string_lossy().to_string(),
        mode,
        workers,
        base_branch,
        base_commit: base_commit.clone(),
        warnings: warnings.clone(),
        ..Default::default()
    };
    let doc = initial_doc(&graph, meta, &paths, wall);
    let spec_context = spec_context(&paths.spec_dir, feature);
    Ok((
        Prepared {
            doc,
            graph,
            config,
            paths,
            spec_context,
        },
        warnings,
    ))
}

/// The variable that tells Claude Code it runs in a sandbox, where it accepts
/// `--dangerously-skip-permissions` as root.
pub const SANDBOX_VAR: &str = "IS_SANDBOX";

/// The flag that Claude Code refuses as root unless [`SANDBOX_VAR`] is `1`.
pub const SKIP_PERMISSIONS: &str = "--dangerously-skip-permissions";

/// Refuses a subprocess rush that zergd, running as root, would start with an agent command
/// that Claude Code refuses as root: every task would fail. zergd never sets [`SANDBOX_VAR`]
/// itself.
pub fn check_root(config: &Config, mode: Mode) -> Result<(), SupervisorError> {
    let sandbox = std::env::var(SANDBOX_VAR).is_ok_and(|v| v == "1")
        && zerg_proto::contract::env_inherited(SANDBOX_VAR, &config.agent.env_passthrough);
    match root_refusal(
        &config.agent.command,
        mode,
        nix::unistd::geteuid().is_root(),
        sandbox,
    ) {
        Some(why) => Err(SupervisorError::failed_precondition(why)),
        None => Ok(()),
    }
}

/// Why a rush is refused as root, if it is: see [`check_root`]. `sandbox` is whether the agent
/// would see `IS_SANDBOX=1`.
fn root_refusal(command: &[String], mode: Mode, root: bool, sandbox: bool) -> Option<String> {
    if mode != Mode::Subprocess
        || !root
        || sandbox
        || !command.iter().any(|a| a == SKIP_PERMISSIONS)
    {
        return None;
    }
    Some(format!(
        "zergd runs as root and agent.command holds {SKIP_PERMISSIONS}, which Claude Code refuses as root: every task would fail. Choose one:\n  - run zergd as a normal user;\n  - rush with `--mode container`, where the workers are not root;\n  - on a machine that is itself a sandbox (a CI runner, a throwaway VM or container), start zergd with {SANDBOX_VAR}=1 in its environment: the workers and the agent inherit it."
    ))
}

/// The state document of a fresh rush: every task pending with its level, every level
/// pending, every worker slot starting from the base commit.
pub fn initial_doc(
    graph: &TaskGraph,
    meta: RushMeta,
    paths: &RushPaths,
    wall: SystemTime,
) -> StateDoc {
    let now = iso_millis(wall);
    let feature = graph.feature.clone();
    let base_commit = meta.base_commit.clone();
    let workers = meta.workers;
    let mut doc = StateDoc {
        format_version: FORMAT_VERSION,
        feature: feature.clone(),
        started_at: now.clone(),
        rush: RushMeta {
            state: RushState::Pending,
            staging_head: base_commit.clone(),
            spec_dir: paths.spec_dir.to_string_lossy().to_string(),
            ..meta
        },
        ..Default::default()
    };
    // Built at once rather than entry by entry: the map's nodes come out full (inserting in
    // order leaves them about half full, 8.5 MB instead of 5 MB at 10,000 tasks). The first
    // save of a rush writes the whole document, so no entry needs marking as changed.
    doc.tasks = graph
        .tasks
        .iter()
        .map(|t| {
            let task = TaskState {
                status: TaskStatus::Pending,
                level: Some(t.level),
                title: t.title.clone(),
                updated_at: now.clone(),
                ..Default::default()
            };
            (t.id.clone(), task)
        })
        .collect::<BTreeMap<_, _>>()
        .into();
    for l in graph.levels().keys() {
        doc.levels.insert(
            l.to_string(),
            LevelState {
                status: LevelStatus::Pending,
                merge_status: MergeStatus::Pending,
                ..Default::default()
            },
        );
    }
    for w in 0..workers {
        doc.workers.insert(
            w.to_string(),
            WorkerState {
                worker_id: w,
                status: WorkerStatus::Starting,
                worktree_path: paths.worker_worktree(w).to_string_lossy().to_string(),
                branch: worker_branch(&feature, w),
                accepted_head: base_commit.clone(),
                ..Default::default()
            },
        );
    }
    doc
}

/// Remote workers read the spec from the base commit they check out, not from a snapshot on
/// zergd's disk: it must be committed, as it is now.
fn check_spec_committed(
    repo: &Path,
    handle: &zerg_git::Repo,
    base: &str,
    feature: &str,
    mode: Mode,
) -> Result<(), SupervisorError> {
    let rel = format!(".gsd/specs/{feature}");
    let in_head = handle.entry_id(base, &rel).ok().flatten().is_some();
    let changed = git::git(repo, &["status", "--porcelain", "--", &rel])
        .map(|s| !s.is_empty())
        .unwrap_or(true);
    if !in_head || changed {
        return Err(SupervisorError::failed_precondition(format!(
            "--mode {mode}: remote workers read the spec from the commit they check out, and {rel} {} HEAD; commit it (git add {rel} && git commit), then rush again",
            if in_head { "differs from" } else { "is not in" }
        )));
    }
    Ok(())
}

/// Reloads a rush's graph and config from its snapshot (resume, or zergd restart).
pub fn load_snapshot(
    repo: &Path,
    feature: &str,
) -> Result<(TaskGraph, Config, RushPaths, String), String> {
    let paths = RushPaths::new(repo.to_path_buf(), feature);
    let g = graph::load(&paths.spec_dir.join("task-graph.json")).map_err(|e| e.to_string())?;
    let cfg_path = repo
        .join(".zerg")
        .join("rush")
        .join(feature)
        .join("config.yaml");
    let config = match std::fs::read_to_string(&cfg_path) {
        Ok(text) => {
            Config::parse(&text, &cfg_path.display().to_string())
                .map_err(|e| e.to_string())?
                .0
        }
        Err(_) => Config::default(),
    };
    let ctx = spec_context(&paths.spec_dir, feature);
    Ok((g.graph, config, paths, ctx))
}

/// Makes sure every worktree of a resumed rush exists; the checkouts read git attributes from
/// the rush's base commit `base`.
pub fn ensure_worktrees(
    paths: &RushPaths,
    feature: &str,
    workers: u32,
    staging_head: &str,
    base: &str,
    worktree: &crate::config::WorktreeConfig,
    readable_by: Option<u32>,
) -> Result<(), SupervisorError> {
    let repo = &paths.repo;
    let trusted = git::Trusted::new(repo, base);
    git::ensure_worktree(
        repo,
        &paths.staging_worktree(),
        &staging_branch(feature),
        staging_head,
        &trusted,
    )
    .map_err(internal("creating the staging worktree"))?;
    for w in 0..workers {
        git::ensure_worktree(
            repo,
            &paths.worker_worktree(w),
            &worker_branch(feature, w),
            staging_head,
            &trusted,
        )
        .map_err(internal("creating a worker worktree"))?;
    }
    copy_ignored(repo, worktree, &[paths.staging_worktree()], readable_by)?;
    Ok(())
}

/// The group that must read the staging worktree's copies: the workers' gid when the gates
/// run in a container of the worker image as another user than zergd (zergd runs as root, the
/// containers as uid 10001), so that a gate reads a `.env` of mode 0600 as a worker does.
pub fn gate_reader(mode: Mode, config: &Config) -> Option<u32> {
    let (_, gid, remapped) = zerg_launch::container::container_identity();
    (remapped && mode != Mode::Subprocess && config.gates.run_on == GatesRunOn::WorkerImage)
        .then_some(gid)
}

/// `worktree.copy`: copies the ignored files of the checkout that it names into each of
/// `worktrees`, and returns them; more than `worktree.copy_max_mb` is refused.
pub fn copy_ignored(
    repo: &Path,
    config: &crate::config::WorktreeConfig,
    worktrees: &[PathBuf],
    readable_by: Option<u32>,
) -> Result<Vec<crate::worktree_copy::CopiedFile>, SupervisorError> {
    let files = crate::worktree_copy::list(repo, &config.copy)
        .map_err(SupervisorError::invalid_argument)?;
    crate::worktree_copy::check_size(&files, config.copy_max_mb)
        .map_err(SupervisorError::invalid_argument)?;
    for wt in worktrees {
        crate::worktree_copy::copy_into(repo, &files, wt, readable_by)
            .map_err(SupervisorError::internal)?;
    }
    Ok(files)
}

/// Feature context for prompts: requirements.md and design.md, truncated (about 2000 tokens
/// each, as the original).
fn spec_context(spec_dir: &Path, feature: &str) -> String {
    const LIMIT: usize = 8000;
    let mut out = format!("# Feature Context: {feature}\n");
    for name in ["requirements.md", "design.md"] {
        if let Ok(mut text) = std::fs::read_to_string(spec_dir.join(name)) {
            if text.len() > LIMIT {
                let mut cut = LIMIT;
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                text.truncate(cut);
                text.push_str("\n[truncated]");
            }
            out.push_str(&format!("\n## {name}\n{text}\n"));
        }
    }
    out
}

fn copy_dir(src: &Path, dst: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dst)?;
    for entry in std::fs::read_dir(src)? {
        let entry = entry?;
        let ty = entry.file_type()?;
        let to = dst.join(entry.file_name());
        if ty.is_dir() {
            copy_dir(&entry.path(), &to)?;
        } else if ty.is_file() {
            std::fs::copy(entry.path(), &to)?;
        }
    }
    Ok(())
}

/// Keeps zerg's runtime files (state, logs, snapshots, worktrees) out of `git status` in the
/// user's checkout, through the repository-local (never committed) `.git/info/exclude`.
/// `.zerg/config.yaml` stays visible: it is the user's to commit.
fn exclude_zerg_dirs(repo: &Path) {
    let Ok(common) = git::git(repo, &["rev-parse", "--git-common-dir"]) else {
        return;
    };
    let common = if Path::new(&common).is_absolute() {
        PathBuf::from(common)
    } else {
        repo.join(common)
    };
    let path = common.join("info").join("exclude");
    let existing = std::fs::read_to_string(&path).unwrap_or_default();
    let mut add = String::new();
    for line in [
        "/.zerg-worktrees/",
        "/.zerg/state/",
        "/.zerg/logs/",
        "/.zerg/rush/",
        "/.zerg/cache/",
        "/.zerg/monitor.log",
    ] {
        if !existing.lines().any(|l| l.trim() == line) {
            add.push_str(line);
            add.push('\n');
        }
    }
    if !add.is_empty() {
        let _ = std::fs::create_dir_all(path.parent().unwrap_or(&common));
        let sep = if existing.is_empty() || existing.ends_with('\n') {
            ""
        } else {
            "\n"
        };
        let _ = std::fs::write(&path, format!("{existing}{sep}{add}"));
    }
}

/// Merges every worker's accepted commits into staging, runs the quality gates, and moves every
/// worker branch onto the new staging head. The merge never changes the rush's spec: every
/// merged commit was checked to leave it as the base had it.
///
/// The merge runs in memory ([`zerg_git::Repo::merge_level`]): staging and every worker branch
/// move in one ref transaction, then the staging worktree's files move to the merged head for
/// the gates, in process when they were clean ([`zerg_git::Repo::checkout_clean`]), else by
/// `git reset --hard`.
/// A conflict, or a merge driver the repository configures, sends the level to `git merge`
/// instead, so that the conflict list is git's own.
pub fn run_merge(job: &MergeJob, gates: &[QualityGate], feature: &str) -> MergeResult {
    let staging = &job.staging;
    let trusted = git::Trusted::new(staging, &job.base);
    // After a resolution task: staging moves to its commit (which holds the staging head and
    // the branch that conflicted), and the level's merge goes on from there.
    if let Some(resolved) = &job.resume_from {
        zerg_git::fell_back(zerg_git::Fallback::WorktreeReset);
        if let Err(e) = git::reset_hard(staging, resolved, &trusted) {
            return MergeResult::Error(e.to_string());
        }
    }
    let repo = match zerg_git::Repo::open(staging) {
        Ok(r) => r,
        Err(e) => return MergeResult::Error(e.to_string()),
    };
    // Checked at every merge: the user may have set an identity since the rush started.
    let configured = zerg_git::Identity::of(&repo);
    let message = |w: u32| {
        format!(
            "ZERG: merge {} (level {})",
            worker_branch(feature, w),
            job.level
        )
    };
    let workers: Vec<String> = job
        .heads
        .iter()
        .map(|(w, _, _)| format!("refs/heads/{}", worker_branch(feature, *w)))
        .collect();
    // A container worker's objects were imported (and verified) when its commit was accepted:
    // every head merged here is an accepted commit.
    let level = zerg_git::LevelMerge {
        staging: format!("refs/heads/{}", staging_branch(feature)),
        heads: job
            .heads
            .iter()
            .map(|(w, _, head)| (head.clone(), message(*w)))
            .collect(),
        also_move: workers.clone(),
        identity: configured.clone().unwrap_or_else(|| zerg_git::Identity {
            name: job.identity.name.clone(),
            email: job.identity.email.clone(),
        }),
    };
    // Where the staging worktree's files are: the merge moves the branch, not the files.
    let files_at = repo.commit_id("HEAD");
    let (head, moved) = match repo.merge_level(&level) {
        Ok(zerg_git::Merged::Head(head)) => {
            // The checkout counts the fallback when it declines; the other cases are counted here.
            let fallback = match files_at.map(|from| repo.checkout_clean(&from, &head, &[], false))
            {
                Some(Ok(Ok(()))) => None,
                Some(Ok(Err(why))) => Some(why.name().to_string()),
                Some(Err(e)) => {
                    zerg_git::fell_back(zerg_git::Fallback::WorktreeReset);
                    Some(format!("the checkout in process failed: {e}"))
                }
                None => {
                    zerg_git::fell_back(zerg_git::Fallback::WorktreeReset);
                    Some("the staging worktree has no HEAD".to_string())
                }
            };
            if let Some(why) = fallback {
                tracing::info!(
                    level = job.level,
                    "git fallback ({why}): git resets the staging worktree"
                );
                if let Err(e) = git::reset_hard(staging, &head, &trusted) {
                    return MergeResult::Error(e.to_string());
                }
            }
            (head, true)
        }
        Ok(zerg_git::Merged::NeedsGit(why)) => {
            tracing::info!(
                reason = why.name(),
                level = job.level,
                "the level merge falls back to git"
            );
            let identity = configured
                .is_none()
                .then_some((job.identity.name.as_str(), job.identity.email.as_str()));
            for (i, (w, _, head)) in job.heads.iter().enumerate() {
                match git::merge_into(staging, head, &message(*w), &trusted, identity) {
                    Ok(MergeOutcome::Merged(_)) => {}
                    Ok(MergeOutcome::Conflict(files)) => {
                        let marked = job
                            .mark_conflicts
                            .then(|| {
                                let note = format!(
                                    "ZERG: conflicted merge of {} (level {}), to resolve: {}",
                                    worker_branch(feature, *w),
                                    job.level,
                                    files.join(", ")
                                );
                                git::marked_merge(staging, head, &note, &trusted, identity).ok()
                            })
                            .flatten()
                            .map(|c| {
                                let rest = job.heads[i + 1..]
                                    .iter()
                                    .map(|(w, _, h)| (*w, h.clone()))
                                    .collect();
                                (c, rest)
                            });
                        return MergeResult::Conflict {
                            worker: *w,
                            files,
                            marked,
                        };
                    }
                    Err(e) => return MergeResult::Error(e.to_string()),
                }
            }
            match git::rev(staging, "HEAD") {
                Some(h) => (h, false),
                None => return MergeResult::Error("the staging worktree has no HEAD".into()),
            }
        }
        Err(e) => return MergeResult::Error(e.to_string()),
    };
    // The gates run the project's own commands: the staging worktree is set up as a worker's
    // is, first. (A gate in the worker image runs in a fresh copy of this worktree: the setup
    // runs there, before the gate, see [`with_setup`].)
    if !gates.is_empty() && job.gate_image.is_none() {
        let (commands, limit) = &job.setup;
        let started = std::time::Instant::now();
        for (i, cmd) in commands.iter().enumerate() {
            let log = job
                .log_dir
                .join(format!("setup-{i}-level-{}.log", job.level));
            let left = limit.saturating_sub(started.elapsed());
            let confined = match gate_confinement(job, staging, true) {
                Ok(c) => c,
                Err(e) => return MergeResult::Error(e),
            };
            let (ok, output) =
                run_shell_confined(cmd, staging, left, Some(&log), confined.as_ref());
            if !ok {
                return MergeResult::GateFailed {
                    gate: format!("worktree.setup[{i}] `{cmd}` (in the staging worktree)"),
                    output: tail(&output, 400),
                };
            }
        }
    }
    for (i, g) in gates.iter().enumerate() {
        let log = job.log_dir.join(format!(
            "gate-{}-level-{}.log",
            sanitize(&g.name),
            job.level
        ));
        let started = std::time::Instant::now();
        let (ok, output) = match &job.gate_image {
            Some(image) => run_gate_in_image(
                image,
                g,
                &format!("l{}-{i}", job.level),
                &job.setup.0,
                job.gates_stop.clone(),
                &log,
            ),
            None => match gate_confinement(job, staging, false) {
                Ok(c) => run_shell_confined(&g.command, staging, g.timeout, Some(&log), c.as_ref()),
                Err(e) => return MergeResult::Error(e),
            },
        };
        crate::metrics::METRICS.gate(&g.name, ok, started.elapsed());
        if !ok && g.required {
            return MergeResult::GateFailed {
                gate: g.name.clone(),
                output: tail(&output, 400),
            };
        }
        if !ok {
            tracing::warn!(gate = %g.name, "optional quality gate failed");
        }
    }
    // After git's merge, every worker branch moves onto the new staging head now, in one
    // transaction. Only the refs move: the worktrees are the workers' own (each task starts
    // from its lease's base commit), and zergd never runs git inside a worktree a worker could
    // have tampered with.
    if !moved {
        let moves: Vec<(&str, &str, zerg_git::Expect)> = workers
            .iter()
            .map(|r| (r.as_str(), head.as_str(), zerg_git::Expect::Any))
            .collect();
        if let Err(e) = repo.move_refs(&moves, "zerg: merge level") {
            return MergeResult::Error(e.to_string());
        }
    }
    MergeResult::Merged(head)
}

/// Builds a rush's symbol map of `job.commit`, from the repository's cache
/// (`.zerg/cache/symbols`) where it can. A panic in the indexer is an error, not a lost event.
pub fn build_symbols(job: &IndexJob) -> Indexed {
    let cache = zerg_symbols::Cache::in_repo(&job.repo);
    guarded(|| {
        let git = repo_handle(job.git.as_ref(), &job.repo)?;
        zerg_symbols::build(&git, &job.commit, &job.settings, Some(&cache))
            .map_err(|e| e.to_string())
    })
}

/// Moves a symbol map onto a merged staging head, parsing only the files whose blob changed
/// (see [`zerg_symbols::update`]).
pub fn update_symbols(
    repo: &Path,
    git: Option<&zerg_git::Repo>,
    previous: &zerg_symbols::SymbolIndex,
    head: &str,
    settings: &zerg_symbols::Settings,
) -> Indexed {
    let cache = zerg_symbols::Cache::in_repo(repo);
    guarded(|| {
        let git = repo_handle(git, repo)?;
        zerg_symbols::update(previous, &git, head, settings, Some(&cache))
            .map_err(|e| e.to_string())
    })
}

/// The rush's repository handle, or one opened at `repo` when the rush has none.
pub(crate) fn repo_handle(
    git: Option<&zerg_git::Repo>,
    repo: &Path,
) -> Result<zerg_git::Repo, String> {
    match git {
        Some(g) => Ok(g.clone()),
        None => zerg_git::Repo::open(repo).map_err(|e| e.to_string()),
    }
}

fn guarded(f: impl FnOnce() -> Indexed) -> Indexed {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|_| Err("the indexer panicked".to_string()))
}

/// The bubblewrap binary and policy a host gate of `job` runs under in `staging` (`network`:
/// a setup command, which keeps the host's network), or `None` when gates are not confined.
fn gate_confinement(
    job: &MergeJob,
    staging: &Path,
    network: bool,
) -> Result<Option<(PathBuf, zerg_sandbox::Policy)>, String> {
    let Some(gs) = &job.gate_sandbox else {
        return Ok(None);
    };
    let policy = gs
        .policy(staging, network)
        .map_err(|e| format!("cannot prepare the gates' sandbox: {e}"))?;
    Ok(Some((gs.bwrap.clone(), policy)))
}

/// How much of a command's output is kept in memory (the end of it), for status and errors.
const OUTPUT_TAIL_BYTES: usize = 64 << 10;

/// Runs `sh -c cmd` in `dir` with a timeout; returns success and the tail of its combined
/// output. The output is drained while the command runs (a command may print any amount: a
/// full pipe would block it), written in full to `log` when given, and only its last
/// [`OUTPUT_TAIL_BYTES`] are kept.
pub fn run_shell(cmd: &str, dir: &Path, timeout: Duration, log: Option<&Path>) -> (bool, String) {
    run_shell_confined(cmd, dir, timeout, log, None)
}

/// [`run_shell`], inside the sandbox when `confined` names bubblewrap and a policy.
pub fn run_shell_confined(
    cmd: &str,
    dir: &Path,
    timeout: Duration,
    log: Option<&Path>,
    confined: Option<&(PathBuf, zerg_sandbox::Policy)>,
) -> (bool, String) {
    use std::io::{Read, Write};
    use std::sync::{Arc, Mutex};
    let mut command = match confined {
        Some((bwrap, policy)) => {
            let mut c = crate::git::scrubbed(&bwrap.to_string_lossy());
            c.args(zerg_sandbox::bwrap::args(
                policy,
                Path::new("/bin/sh"),
                &["-c".into(), cmd.into()],
            ));
            c
        }
        None => {
            let mut c = crate::git::scrubbed("sh");
            c.arg("-c").arg(cmd);
            c
        }
    };
    let mut child = match command
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return (false, format!("cannot run sh: {e}")),
    };
    let file = log.and_then(|p| {
        if let Some(d) = p.parent() {
            let _ = std::fs::create_dir_all(d);
        }
        std::fs::File::create(p).ok()
    });
    let sink = Arc::new(Mutex::new((std::collections::VecDeque::<u8>::new(), file)));
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let pumps: Vec<_> = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .flatten()
    .map(|mut r| {
        let sink = sink.clone();
        let done = done_tx.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 64 << 10];
            while let Ok(n) = r.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let Ok(mut g) = sink.lock() else { break };
                let (tail, file) = &mut *g;
                if let Some(f) = file.as_mut() {
                    let _ = f.write_all(&buf[..n]);
                }
                tail.extend(&buf[..n]);
                let excess = tail.len().saturating_sub(OUTPUT_TAIL_BYTES);
                tail.drain(..excess);
            }
            let _ = done.send(());
        })
    })
    .collect();
    let start = StdInstant::now();
    let ok = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st.success(),
            Ok(None) if start.elapsed() > timeout => {
                let pid = child.id() as i32;
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                let _ = child.wait();
                let out = collect(&sink);
                return (
                    false,
                    format!("timed out after {:.0}s: {out}", timeout.as_secs_f64()),
                );
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return (false, e.to_string()),
        }
    };
    // The pipes close when the command and everything it started have exited. A grandchild
    // that keeps them open still belongs to the group (so its id cannot have been reused):
    // after a short wait it is killed with the group.
    let deadline = StdInstant::now() + Duration::from_secs(2);
    let mut closed = 0;
    while closed < pumps.len() {
        let left = deadline.saturating_duration_since(StdInstant::now());
        if done_rx.recv_timeout(left).is_err() {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            break;
        }
        closed += 1;
    }
    for p in pumps {
        let _ = p.join();
    }
    (ok, collect(&sink))
}

type OutputSink = std::sync::Mutex<(std::collections::VecDeque<u8>, Option<std::fs::File>)>;

fn collect(sink: &OutputSink) -> String {
    let Ok(g) = sink.lock() else {
        return String::new();
    };
    let (tail, _) = &*g;
    let bytes: Vec<u8> = tail.iter().copied().collect();
    String::from_utf8_lossy(&bytes).to_string()
}

/// Runs gate `g` in a fresh container of the rush's image (`gates.run_on: worker-image`),
/// named `zerg-gate-<rush>-<which>`, after `setup`, from a blocking job: the container is
/// removed however the gate ends, `stop` turning true (the rush stopped) included. An engine
/// that cannot be reached fails the gate, saying why.
pub(super) fn run_gate_in_image(
    image: &zerg_launch::gate::GateContainer,
    g: &QualityGate,
    which: &str,
    setup: &[String],
    mut stop: tokio::sync::watch::Receiver<bool>,
    log: &Path,
) -> (bool, String) {
    let mut c = image.clone();
    let rush: String = c
        .rush_id
        .chars()
        .filter(|ch| ch.is_ascii_alphanumeric())
        .take(24)
        .collect();
    c.name = format!("zerg-gate-{rush}-{which}");
    c.command = with_setup(setup, &g.command);
    c.timeout = g.timeout;
    let run = async {
        let docker = zerg_launch::engine::connect_engine()
            .await
            .map_err(|e| format!("gates.run_on: worker-image needs the Docker engine: {e}"))?;
        let stopped = async move {
            // The rush stopped (or its state is gone): the gate ends with it.
            let _ = stop.wait_for(|s| *s).await;
        };
        zerg_launch::gate::run(&docker, &c, log, stopped).await
    };
    match tokio::runtime::Handle::try_current() {
        Ok(h) => match h.block_on(run) {
            Ok(o) => (o.ok, o.output),
            Err(e) => (false, e),
        },
        Err(_) => (false, "no runtime to run the gate's container in".into()),
    }
}

/// The command a gate container runs: `worktree.setup`'s commands, then the gate. Each gate
/// container works in its own fresh copy of the staging worktree, so each sets it up; a setup
/// command that fails ends the container with its exit status and a line naming it. The
/// gate's timeout covers its setup.
fn with_setup(setup: &[String], gate: &str) -> String {
    let mut script = String::new();
    for (i, cmd) in setup.iter().enumerate() {
        let quoted = format!("'{}'", cmd.replace('\'', r"'\''"));
        script.push_str(&format!(
            "sh -c {quoted} || {{ s=$?; echo \"zerg: worktree.setup[{i}] failed with exit status $s\" >&2; exit $s; }}\n"
        ));
    }
    script.push_str(gate);
    script
}

/// A gate name usable in a file name.
pub(super) fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}

pub(super) fn tail(s: &str, n: usize) -> String {
    let t = s.trim();
    if t.len() <= n {
        return t.to_string();
    }
    let mut start = t.len() - n;
    while !t.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &t[start..])
}

/// Removes the worktrees and worker branches of a completed rush, once its workers are gone.
/// The staging branch (the result) stays.
pub fn cleanup_worktrees(paths: &RushPaths, feature: &str, workers: &BTreeMap<u32, PathBuf>) {
    for (w, wt) in workers {
        if let Err(e) = git::remove_worktree(&paths.repo, wt, Some(&worker_branch(feature, *w))) {
            tracing::warn!(error = %e, "could not remove worker worktree");
        }
    }
    if let Err(e) = git::remove_worktree(&paths.repo, &paths.staging_worktree(), None) {
        tracing::warn!(error = %e, "could not remove staging worktree");
    }
    let _ = std::fs::remove_dir(&paths.worktrees);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_container_runs_the_setup_first_and_stops_at_a_failed_setup_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let setup = vec![
            "printf \"it's set up\" > venv.txt".to_string(),
            "test -f venv.txt".to_string(),
        ];
        let (ok, out) = run_shell(
            &with_setup(&setup, "cat venv.txt"),
            dir.path(),
            Duration::from_secs(60),
            None,
        );
        assert!(ok, "{out}");
        assert!(out.contains("it's set up"), "{out}");

        let failing = vec!["true".to_string(), "exit 7".to_string()];
        let (ok, out) = run_shell(
            &with_setup(&failing, "echo gate ran"),
            dir.path(),
            Duration::from_secs(60),
            None,
        );
        assert!(!ok);
        assert!(
            out.contains("worktree.setup[1] failed with exit status 7"),
            "{out}"
        );
        assert!(!out.contains("gate ran"), "{out}");
    }

    #[test]
    fn a_gate_that_prints_10_mb_passes_with_its_tail_kept_and_its_output_logged() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("logs/gate.log");
        // About 10 MB on stdout and some on stderr: far more than a pipe holds.
        let (ok, out) = run_shell(
            "seq 1 1300000; echo done >&2",
            dir.path(),
            Duration::from_secs(300),
            Some(&log),
        );
        assert!(ok, "{}", tail(&out, 200));
        assert!(out.len() <= OUTPUT_TAIL_BYTES, "only the tail is kept");
        assert!(out.contains("1300000"), "{}", tail(&out, 200));
        let logged = std::fs::metadata(&log).unwrap().len();
        assert!(
            logged > 9_000_000,
            "the full output is in the log: {logged} bytes"
        );
        // A gate that leaves a process holding its output open: the gate's result counts, and
        // the straggler is killed with the gate's process group.
        let pidfile = dir.path().join("bg.pid");
        let cmd = format!(
            "sleep 300 & echo $! > {}; echo gate done",
            pidfile.display()
        );
        let (ok, out) = run_shell(&cmd, dir.path(), Duration::from_secs(300), None);
        assert!(ok, "{out}");
        assert!(out.contains("gate done"), "{out}");
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // SIGKILL was sent before run_shell returned; the kernel ends the process soon after.
        zerg_proto::testkit::wait_until(
            Duration::from_secs(60),
            "the process the gate left behind to be killed",
            || {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                stat.is_empty() || stat.contains(") Z")
            },
        );
        let (ok, out) = run_shell(
            "echo broken; exit 3",
            dir.path(),
            Duration::from_secs(30),
            None,
        );
        assert!(!ok);
        assert_eq!(out.trim(), "broken");
        let (ok, out) = run_shell(
            "echo started; sleep 30",
            dir.path(),
            Duration::from_millis(300),
            None,
        );
        assert!(!ok);
        assert!(
            out.starts_with("timed out after") && out.contains("started"),
            "{out}"
        );
    }

    #[test]
    fn root_refuses_only_a_subprocess_rush_whose_command_holds_the_flag() {
        let cmd = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let claude = cmd(&["claude", "--print", SKIP_PERMISSIONS]);
        let why = root_refusal(&claude, Mode::Subprocess, true, false).expect("refused");
        for choice in ["normal user", "--mode container", "IS_SANDBOX=1"] {
            assert!(why.contains(choice), "{choice}: {why}");
        }
        // Not root, in a container, or on a machine that says it is a sandbox.
        assert_eq!(root_refusal(&claude, Mode::Subprocess, false, false), None);
        assert_eq!(root_refusal(&claude, Mode::Container, true, false), None);
        assert_eq!(root_refusal(&claude, Mode::Subprocess, true, true), None);
        // Only the flag itself as an argument counts, not a mention of it inside one.
        for other in [
            cmd(&["claude", "--print"]),
            cmd(&["sh", "-c", "echo --dangerously-skip-permissions"]),
        ] {
            assert_eq!(root_refusal(&other, Mode::Subprocess, true, false), None);
        }
    }
}
