//! What zerg still does with the `git` program: creating and removing worktrees, checking a
//! tree out into a worktree, and the fallbacks (a merge git must do, a commit with filters).
//! Every call is `git -C <dir> …` as a child process, with the user's hooks off and, where a
//! worker's files are checked out or merged, no driver a worker could name ([`Trusted`]).

use std::path::{Path, PathBuf};
use std::process::Stdio;

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

pub use zerg_proto::contract::scrubbed_command as scrubbed;

/// Options every git of zergd's runs with: the user's hooks (`.git/hooks`, or `core.hooksPath`
/// as husky and pre-commit set it) never run for zergd's own merges, worktrees and ref updates.
/// Checks belong in the quality gates, which run on every merged level.
const NO_HOOKS: [&str; 2] = ["-c", "core.hooksPath=/dev/null"];

/// Runs git in `dir` and returns trimmed stdout.
pub fn git(dir: &Path, args: &[&str]) -> Result<String, GitError> {
    run(dir, &Trusted::default(), &[], args)
}

/// Runs git in `dir` with `trusted`'s options and the extra environment `env`.
fn run(
    dir: &Path,
    trusted: &Trusted,
    env: &[(&str, &str)],
    args: &[&str],
) -> Result<String, GitError> {
    let out = scrubbed("git")
        .args(NO_HOOKS)
        .args(&trusted.options)
        .arg("-C")
        .arg(dir)
        .args(args)
        .envs(env.iter().copied())
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

/// How zergd's git runs where it checks out or merges trees that workers wrote (the staging
/// merge, and the worktrees zergd creates): no filter, merge or diff driver that a
/// worker-committed `.gitattributes` names is started. With git 2.40 or later the attributes
/// come from the rush's base commit, the commit the user started the rush from
/// (`--attr-source`), so the user's own attributes (Git LFS among them) keep working and a
/// worker's have no effect. With an older git, every filter, merge and diff driver in the git
/// config is overridden for these commands instead (the builtin text merge stands in for merge
/// drivers).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trusted {
    options: Vec<String>,
}

impl Trusted {
    /// The options for a rush of `repo` that started from `base`.
    pub fn new(repo: &Path, base: &str) -> Trusted {
        if !base.is_empty() && attr_source_supported() {
            Trusted {
                options: vec![format!("--attr-source={base}")],
            }
        } else {
            Trusted::without_drivers(repo)
        }
    }

    /// Overrides of every driver in `repo`'s git config (all scopes).
    fn without_drivers(repo: &Path) -> Trusted {
        let listed = git(
            repo,
            &["config", "--get-regexp", r"^(filter|merge|diff)\..*\."],
        )
        .unwrap_or_default();
        Trusted {
            options: driver_overrides(&listed),
        }
    }
}

/// `-c` options that switch off every driver in `git config --get-regexp` output: filters do
/// nothing and are optional, merge drivers are git's own text merge, external diff and textconv
/// commands are empty.
fn driver_overrides(listed: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in listed.lines() {
        let key = line.split_whitespace().next().unwrap_or_default();
        let Some((driver, var)) = key.rsplit_once('.') else {
            continue;
        };
        let value = match (driver.split('.').next(), var) {
            (Some("filter"), "clean" | "smudge" | "process") => "",
            (Some("filter"), "required") => "false",
            (Some("merge"), "driver") => "git merge-file --marker-size=%L %A %O %B",
            (Some("diff"), "command" | "textconv") => "",
            _ => continue,
        };
        let opt = format!("{key}={value}");
        if !out.contains(&opt) {
            out.push("-c".into());
            out.push(opt);
        }
    }
    out
}

/// Whether this machine's git has `--attr-source` (git 2.40 and later); asked once, in `/`
/// (zergd's own working directory may be gone).
fn attr_source_supported() -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(|| {
        git(Path::new("/"), &["version"])
            .ok()
            .and_then(|v| version_at_least(&v, (2, 40)))
            .unwrap_or(false)
    })
}

/// Whether `git version` output names at least `want` (major, minor); `None` when unreadable.
fn version_at_least(output: &str, want: (u32, u32)) -> Option<bool> {
    let v = output.split_whitespace().nth(2)?;
    let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
    let major = parts.next()??;
    let minor = parts.next()??;
    Some((major, minor) >= want)
}

/// Whether git knows who commits in `dir` (`git var GIT_COMMITTER_IDENT` and
/// `GIT_AUTHOR_IDENT` succeed): `user.name` and `user.email` in some config, the `GIT_*`
/// variables, or what git can work out from the machine.
pub fn has_identity(dir: &Path) -> bool {
    git(dir, &["var", "GIT_COMMITTER_IDENT"]).is_ok()
        && git(dir, &["var", "GIT_AUTHOR_IDENT"]).is_ok()
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

/// Held while a worktree is added, removed or pruned: `git worktree prune` removes the admin
/// dir of a worktree that another thread's `git worktree add` is still creating (one rush's
/// cleanup beside another rush's start in the same repository).
static WORKTREES: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn worktree_guard() -> std::sync::MutexGuard<'static, ()> {
    WORKTREES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes sure `path` is a worktree of `repo` on `branch`, creating the branch at `start` if it
/// does not exist. An existing worktree is kept as it is (its branch is owned by zergd). The
/// checkout runs with `trusted`'s options.
pub fn ensure_worktree(
    repo: &Path,
    path: &Path,
    branch: &str,
    start: &str,
    trusted: &Trusted,
) -> Result<(), GitError> {
    if path.join(".git").exists() {
        return Ok(());
    }
    let _one_at_a_time = worktree_guard();
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
        run(
            repo,
            trusted,
            &[],
            &["worktree", "add", "--force", &p, branch],
        )?;
    } else {
        run(
            repo,
            trusted,
            &[],
            &["worktree", "add", "--force", "-b", branch, &p, start],
        )?;
    }
    Ok(())
}

/// Removes a worktree (and, when `delete_branch`, its branch). A worktree whose `.git` file a
/// worker damaged is deleted directly and its registration pruned.
pub fn remove_worktree(repo: &Path, path: &Path, branch: Option<&str>) -> Result<(), GitError> {
    let _one_at_a_time = worktree_guard();
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

/// Checks `commit` out in the worktree `dir`, as `git reset --hard` (index and files), with
/// `trusted`'s options. Not counted: the caller counts why it came to git (an in-process move
/// that declined has counted already).
pub fn reset_hard(dir: &Path, commit: &str, trusted: &Trusted) -> Result<(), GitError> {
    run(dir, trusted, &[], &["reset", "--hard", "-q", commit]).map(|_| ())
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

/// Merges `commit` into the branch checked out in `staging_wt`, with `trusted`'s options. With
/// `identity` (name, email), the merge commit is by that author and committer; without, git's
/// own identity for the repository is used.
pub fn merge_into(
    staging_wt: &Path,
    commit: &str,
    message: &str,
    trusted: &Trusted,
    identity: Option<(&str, &str)>,
) -> Result<MergeOutcome, GitError> {
    let head = git(staging_wt, &["rev-parse", "HEAD"])?;
    if is_ancestor(staging_wt, commit, &head) {
        return Ok(MergeOutcome::Merged(head));
    }
    let env = identity_env(identity);
    match run(
        staging_wt,
        trusted,
        &env,
        &["merge", "--no-ff", "--no-edit", "-m", message, commit],
    ) {
        Ok(_) => Ok(MergeOutcome::Merged(git(
            staging_wt,
            &["rev-parse", "HEAD"],
        )?)),
        Err(e) => {
            let files =
                git(staging_wt, &["diff", "--name-only", "--diff-filter=U"]).unwrap_or_default();
            let _ = run(staging_wt, trusted, &[], &["merge", "--abort"]);
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

/// The author and committer variables for `identity` (name, email); none without one.
fn identity_env<'a>(identity: Option<(&'a str, &'a str)>) -> Vec<(&'static str, &'a str)> {
    match identity {
        Some((name, email)) => vec![
            ("GIT_AUTHOR_NAME", name),
            ("GIT_AUTHOR_EMAIL", email),
            ("GIT_COMMITTER_NAME", name),
            ("GIT_COMMITTER_EMAIL", email),
        ],
        None => vec![],
    }
}

/// Commits the merge of `commit` into the branch checked out in `staging_wt` as it stands,
/// conflict markers and all (a merge commit whose parents are the branch's head and `commit`),
/// then puts the branch back where it was. Returns the marked commit, for an agent to resolve
/// from. With `trusted`'s options and `identity` as [`merge_into`].
pub fn marked_merge(
    staging_wt: &Path,
    commit: &str,
    message: &str,
    trusted: &Trusted,
    identity: Option<(&str, &str)>,
) -> Result<String, GitError> {
    let head = git(staging_wt, &["rev-parse", "HEAD"])?;
    let env = identity_env(identity);
    // Conflicts make the merge exit non-zero: expected here.
    let _ = run(
        staging_wt,
        trusted,
        &env,
        &["merge", "--no-ff", "--no-commit", commit],
    );
    let marked = run(staging_wt, trusted, &env, &["add", "-A"])
        .and_then(|_| {
            run(
                staging_wt,
                trusted,
                &env,
                &["commit", "--no-verify", "-q", "-m", message],
            )
        })
        .and_then(|_| git(staging_wt, &["rev-parse", "HEAD"]));
    let _ = run(staging_wt, trusted, &[], &["merge", "--abort"]);
    run(staging_wt, trusted, &[], &["reset", "--hard", "-q", &head])?;
    marked
}

#[cfg(test)]
mod tests {
    use super::*;

    const WHO: Option<(&str, &str)> = Some(("zerg test", "test@zerg.invalid"));

    fn ok(dir: &Path, args: &[&str]) -> String {
        let mut all = vec!["-c", "user.name=t", "-c", "user.email=t@zerg.invalid"];
        all.extend_from_slice(args);
        git(dir, &all).unwrap_or_else(|e| panic!("{e}"))
    }

    /// A repository with a base commit, a staging worktree on it, and a worker commit that adds
    /// `.gitattributes` naming the repository's filter drivers `evil` (a smudge command) and
    /// `evilp` (a long-running process), each of which leaves a marker file when it runs.
    struct Attacked {
        dir: tempfile::TempDir,
        repo: PathBuf,
        staging: PathBuf,
        base: String,
        worker: String,
    }

    impl Attacked {
        fn new() -> Attacked {
            let dir = tempfile::tempdir().unwrap();
            let repo = dir.path().join("repo");
            std::fs::create_dir(&repo).unwrap();
            ok(&repo, &["init", "-q", "-b", "main"]);
            std::fs::write(repo.join("README.md"), "base\n").unwrap();
            ok(&repo, &["add", "-A"]);
            ok(&repo, &["commit", "-q", "-m", "base"]);
            let base = ok(&repo, &["rev-parse", "HEAD"]);
            let staging = dir.path().join("staging");
            ok(
                &repo,
                &[
                    "worktree",
                    "add",
                    "-q",
                    "-b",
                    "staging",
                    &staging.to_string_lossy(),
                ],
            );
            ok(&repo, &["checkout", "-q", "-b", "worker"]);
            std::fs::write(
                repo.join(".gitattributes"),
                "*.txt filter=evil merge=evil\n*.md filter=evilp\n",
            )
            .unwrap();
            std::fs::write(repo.join("x.txt"), "x\n").unwrap();
            std::fs::write(repo.join("y.md"), "y\n").unwrap();
            ok(&repo, &["add", "-A"]);
            ok(&repo, &["commit", "-q", "-m", "worker"]);
            let worker = ok(&repo, &["rev-parse", "HEAD"]);
            // Set only now: the worker's own commit above ran no filter.
            let m = |name: &str| dir.path().join(name).to_string_lossy().to_string();
            for (k, v) in [
                ("filter.evil.smudge", format!("touch {}; cat", m("smudge"))),
                ("filter.evil.required", "true".to_string()),
                ("filter.evilp.process", format!("touch {}", m("process"))),
                ("merge.evil.driver", format!("touch {}", m("merge"))),
            ] {
                ok(&repo, &["config", k, &v]);
            }
            Attacked {
                dir,
                repo,
                staging,
                base,
                worker,
            }
        }

        fn markers(&self) -> Vec<&'static str> {
            ["smudge", "process", "merge"]
                .into_iter()
                .filter(|m| self.dir.path().join(m).exists())
                .collect()
        }
    }

    #[test]
    fn a_worker_committed_gitattributes_starts_no_driver_in_the_staging_merge() {
        // The attack works when nothing stops it: the merge runs the repository's filters.
        let a = Attacked::new();
        let _ = merge_into(&a.staging, &a.worker, "m", &Trusted::default(), WHO);
        assert!(!a.markers().is_empty(), "the test's filters did not run");

        // Attributes from the base commit (git 2.40 and later).
        let a = Attacked::new();
        let trusted = Trusted::new(&a.repo, &a.base);
        let out = merge_into(&a.staging, &a.worker, "m", &trusted, WHO).unwrap();
        assert!(matches!(out, MergeOutcome::Merged(_)), "{out:?}");
        assert_eq!(a.markers(), Vec::<&str>::new());
        assert_eq!(
            std::fs::read_to_string(a.staging.join("x.txt")).unwrap(),
            "x\n"
        );

        // Older git: every configured driver overridden.
        let a = Attacked::new();
        let trusted = Trusted::without_drivers(&a.repo);
        let out = merge_into(&a.staging, &a.worker, "m", &trusted, WHO).unwrap();
        assert!(matches!(out, MergeOutcome::Merged(_)), "{out:?}");
        assert_eq!(a.markers(), Vec::<&str>::new());
        assert_eq!(
            std::fs::read_to_string(a.staging.join("y.md")).unwrap(),
            "y\n"
        );
    }

    #[test]
    fn driver_overrides_cover_filters_merge_and_diff_drivers_once() {
        let listed = "filter.lfs.process git-lfs filter-process\nfilter.lfs.required true\n\
                      filter.a.b.smudge x\nmerge.ours.driver true\ndiff.pdf.textconv pdftotext\n\
                      diff.x.command y\nmerge.ours.name keep ours\nfilter.lfs.process again\n";
        assert_eq!(
            driver_overrides(listed),
            [
                "-c",
                "filter.lfs.process=",
                "-c",
                "filter.lfs.required=false",
                "-c",
                "filter.a.b.smudge=",
                "-c",
                "merge.ours.driver=git merge-file --marker-size=%L %A %O %B",
                "-c",
                "diff.pdf.textconv=",
                "-c",
                "diff.x.command=",
            ]
        );
    }

    #[test]
    fn git_versions_are_compared_by_major_and_minor() {
        assert_eq!(version_at_least("git version 2.47.3", (2, 40)), Some(true));
        assert_eq!(version_at_least("git version 2.40.0", (2, 40)), Some(true));
        assert_eq!(
            version_at_least("git version 2.39.5 (Apple Git-154)", (2, 40)),
            Some(false)
        );
        assert_eq!(version_at_least("git version 3.0.0", (2, 40)), Some(true));
        assert_eq!(version_at_least("nonsense", (2, 40)), None);
    }

    #[test]
    fn the_users_commit_hooks_do_not_stop_a_merge() {
        let a = Attacked::new();
        let hooks = a.repo.join(".git/hooks");
        std::fs::create_dir_all(&hooks).unwrap();
        for hook in ["commit-msg", "pre-merge-commit", "prepare-commit-msg"] {
            let p = hooks.join(hook);
            std::fs::write(
                &p,
                "#!/bin/sh\necho rejected by the user's hook >&2\nexit 1\n",
            )
            .unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let trusted = Trusted::new(&a.repo, &a.base);
        let out = merge_into(&a.staging, &a.worker, "ZERG: merge", &trusted, WHO).unwrap();
        assert!(matches!(out, MergeOutcome::Merged(_)), "{out:?}");
        // The identity given is the merge's author and committer.
        assert_eq!(
            ok(&a.staging, &["log", "-1", "--format=%an <%ae> %cn <%ce>"]),
            "zerg test <test@zerg.invalid> zerg test <test@zerg.invalid>"
        );
    }
}
