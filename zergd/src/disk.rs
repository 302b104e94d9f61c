//! What a rush leaves on disk: measured for `status`, and removed by `zergctl prune`.
//!
//! A rush's own files are its state (`.zerg/state/<feature>.json` with its backup, journal and
//! lock), its events file, its spec and config snapshot (`.zerg/rush/<feature>/`), its
//! worktrees (`.zerg-worktrees/<feature>/`) and its branches (`zerg/<feature>/worker-<N>`,
//! `zerg/<feature>/staging`). The logs (`.zerg/logs/`, `.zerg/monitor.log` and their rotated
//! copies) are the repository's, shared by all its rushes: they go only with its last rush.

use std::path::{Path, PathBuf};

use crate::git;

/// The repository-relative files of a feature's state (whichever exist).
fn state_files(feature: &str) -> Vec<PathBuf> {
    let state = Path::new(".zerg").join("state");
    let mut v: Vec<PathBuf> = [
        format!("{feature}.json"),
        format!("{feature}.json.bak"),
        format!("{feature}.journal"),
        format!("{feature}.journal.prev"),
        format!("{feature}.lock"),
        format!("{feature}-events.jsonl"),
    ]
    .into_iter()
    .map(|n| state.join(n))
    .collect();
    v.push(Path::new(".zerg").join("rush").join(feature));
    v
}

/// The repository-relative log files and rotated copies, shared by every rush of the repository.
fn log_files(repo: &Path) -> Vec<PathBuf> {
    let mut v = vec![Path::new(".zerg").join("logs")];
    let zerg = repo.join(".zerg");
    if let Ok(rd) = std::fs::read_dir(&zerg) {
        let mut names: Vec<String> = rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n == "monitor.log" || n.starts_with("monitor.log."))
            .collect();
        names.sort();
        v.extend(names.into_iter().map(|n| Path::new(".zerg").join(n)));
    }
    v
}

/// Bytes under `path` (a file, or a directory walked without following symlinks); 0 when it
/// does not exist.
pub fn bytes_of(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    let mut total = 0;
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                stack.push(e.path());
            } else {
                total += m.len();
            }
        }
    }
    total
}

/// What a feature's rush uses on disk, in bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Its state, journal, lock, events file and spec snapshot.
    pub state_bytes: u64,
    /// Its worktrees.
    pub worktree_bytes: u64,
    /// The repository's logs (shared by its rushes).
    pub log_bytes: u64,
}

/// What a feature's rush uses on disk now.
pub fn usage(repo: &Path, feature: &str) -> Usage {
    let sum = |paths: Vec<PathBuf>| paths.iter().map(|p| bytes_of(&repo.join(p))).sum();
    Usage {
        state_bytes: sum(state_files(feature)),
        worktree_bytes: bytes_of(&worktrees_dir(repo, feature)),
        log_bytes: sum(log_files(repo)),
    }
}

fn worktrees_dir(repo: &Path, feature: &str) -> PathBuf {
    repo.join(".zerg-worktrees").join(feature)
}

/// What pruning one rush did (or, dry, would do).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Pruned {
    /// Repository-relative paths and branch names removed.
    pub removed: Vec<String>,
    /// What was kept, each with why.
    pub kept: Vec<String>,
    /// Bytes freed.
    pub bytes: u64,
}

/// How to prune one rush.
#[derive(Debug, Clone)]
pub struct PruneJob {
    /// Repository root.
    pub repo: PathBuf,
    /// Feature.
    pub feature: String,
    /// Remove nothing, only say what would go.
    pub dry_run: bool,
    /// Delete the staging branch too.
    pub branches: bool,
    /// Remove the repository's logs too (no other rush of the repository is left).
    pub logs: bool,
}

/// Removes what an ended rush left: its worktrees without uncommitted changes and their
/// branches, its state, events and snapshot, the staging branch with `branches`, and the
/// repository's logs with `logs`.
pub fn prune(job: &PruneJob) -> Pruned {
    let mut out = Pruned::default();
    let repo = &job.repo;
    let feature = &job.feature;
    let rel = |p: &Path| {
        p.strip_prefix(repo)
            .unwrap_or(p)
            .to_string_lossy()
            .into_owned()
    };
    // Worktrees first: one with uncommitted work keeps its branch too.
    let wt_dir = worktrees_dir(repo, feature);
    let mut keep_branches: Vec<String> = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(&wt_dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    entries.sort();
    for wt in entries {
        let name = wt
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let branch = if name == "staging" {
            format!("zerg/{feature}/staging")
        } else {
            format!("zerg/{feature}/{name}")
        };
        match git::git(&wt, &["status", "--porcelain", "--untracked-files=normal"]) {
            Ok(s) if !s.trim().is_empty() => {
                out.kept
                    .push(format!("{}: has uncommitted changes", rel(&wt)));
                keep_branches.push(branch);
                continue;
            }
            Ok(_) => {}
            // Not a worktree git knows (a damaged `.git` file, an interrupted add): nothing
            // of it can be committed work, so it goes.
            Err(e) if e.stderr.contains("not a git repository") => {}
            Err(e) => {
                out.kept.push(format!(
                    "{}: cannot tell whether it has changes: {e}",
                    rel(&wt)
                ));
                keep_branches.push(branch);
                continue;
            }
        }
        let bytes = bytes_of(&wt);
        if !job.dry_run
            && let Err(e) = git::remove_worktree(repo, &wt, None)
        {
            out.kept.push(format!("{}: {e}", rel(&wt)));
            keep_branches.push(branch);
            continue;
        }
        out.bytes += bytes;
        out.removed.push(rel(&wt));
    }
    if !job.dry_run {
        let _ = std::fs::remove_dir(&wt_dir);
        let _ = std::fs::remove_dir(repo.join(".zerg-worktrees"));
    }
    // Branches: the workers' always, staging only when asked (it is the rush's result).
    let prefix = format!("refs/heads/zerg/{feature}/");
    let listed =
        git::git(repo, &["for-each-ref", "--format=%(refname)", &prefix]).unwrap_or_default();
    for full in listed.lines() {
        let Some(short) = full.strip_prefix("refs/heads/") else {
            continue;
        };
        if keep_branches.iter().any(|b| b == short) {
            out.kept.push(format!("{short}: its worktree was kept"));
            continue;
        }
        if short == format!("zerg/{feature}/staging") && !job.branches {
            out.kept.push(format!(
                "{short}: the rush's result (--branches deletes it)"
            ));
            continue;
        }
        if !job.dry_run
            && let Err(e) = git::git(repo, &["branch", "-D", short])
        {
            out.kept.push(format!("{short}: {e}"));
            continue;
        }
        out.removed.push(short.to_string());
    }
    // State, events, snapshot, and with the repository's last rush its logs.
    let mut files = state_files(feature);
    if job.logs {
        files.extend(log_files(repo));
    }
    for f in files {
        let path = repo.join(&f);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let bytes = bytes_of(&path);
        if !job.dry_run {
            let r = if meta.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            if let Err(e) = r {
                out.kept.push(format!("{}: {e}", f.display()));
                continue;
            }
        }
        out.bytes += bytes;
        out.removed.push(f.to_string_lossy().into_owned());
    }
    if !job.dry_run {
        let _ = std::fs::remove_dir(repo.join(".zerg").join("rush"));
        // A container rush's private git dirs and homes, if any are left.
        if let Err(e) = crate::container_host::remove_rush_area(repo, feature) {
            out.kept.push(format!("the rush's private git dirs: {e}"));
        }
    }
    out
}

/// The repository's logs that grow across rushes: `.zerg/monitor.log`, the feature's events
/// file, and every `.zerg/logs/*.log` (worker output, gate output).
fn growing_logs(repo: &Path, feature: &str) -> Vec<PathBuf> {
    let zerg = repo.join(".zerg");
    let mut v = vec![
        zerg.join("monitor.log"),
        zerg.join("state").join(format!("{feature}-events.jsonl")),
    ];
    if let Ok(rd) = std::fs::read_dir(zerg.join("logs")) {
        v.extend(
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "log")),
        );
    }
    v
}

/// Rotates the logs a rush is about to append to and drops old rotated copies: a log over
/// `logging.max_log_size_mb` is renamed to `<name>.<UTC time>` (a new one starts), and a
/// rotated copy older than `logging.retain_days` is removed. Failures are logged, never fatal.
pub fn rotate_logs(
    repo: &Path,
    feature: &str,
    cfg: &crate::config::LoggingConfig,
    now: std::time::SystemTime,
) {
    let max = cfg.max_log_size_mb.saturating_mul(1 << 20);
    let stamp = humantime::format_rfc3339_seconds(now)
        .to_string()
        .replace([':', '-'], "");
    let keep = std::time::Duration::from_secs(u64::from(cfg.retain_days) * 86_400);
    for log in growing_logs(repo, feature) {
        if std::fs::symlink_metadata(&log).is_ok_and(|m| m.is_file() && m.len() > max) {
            let mut to = log.clone().into_os_string();
            to.push(format!(".{stamp}"));
            if let Err(e) = std::fs::rename(&log, &to) {
                tracing::warn!(log = %log.display(), error = %e, "cannot rotate a log");
            }
        }
        // Rotated copies of this log: `<name>.<stamp>`.
        let (Some(dir), Some(name)) = (log.parent(), log.file_name()) else {
            continue;
        };
        let prefix = format!("{}.", name.to_string_lossy());
        let Ok(rd) = std::fs::read_dir(dir) else {
            continue;
        };
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            let Some(rest) = n.strip_prefix(&prefix) else {
                continue;
            };
            // Only our own stamps (digits, `T`, `Z`): `worker-0.log.bak` of the user's stays.
            if !rest.ends_with('Z')
                || !rest
                    .chars()
                    .all(|c| c.is_ascii_digit() || c == 'T' || c == 'Z')
            {
                continue;
            }
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| now.duration_since(t).is_ok_and(|age| age > keep));
            if old && let Err(err) = std::fs::remove_file(e.path()) {
                tracing::warn!(log = %e.path().display(), error = %err, "cannot remove an old log");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Git with the tests' explicit identity.
    use zerg_proto::testkit::git as git_ok;

    /// A repository with one ended rush of `f`: state files, two worker worktrees (one dirty),
    /// their branches and a staging branch, and logs.
    fn ended_rush() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        git_ok(r, &["init", "-q", "-b", "main"]);
        std::fs::write(r.join("a.txt"), "a\n").unwrap();
        git_ok(r, &["add", "a.txt"]);
        git_ok(r, &["commit", "-qm", "base"]);
        std::fs::create_dir_all(r.join(".zerg/state")).unwrap();
        std::fs::create_dir_all(r.join(".zerg/rush/f/spec")).unwrap();
        std::fs::create_dir_all(r.join(".zerg/logs")).unwrap();
        std::fs::write(r.join(".zerg/state/f.json"), "{}").unwrap();
        std::fs::write(r.join(".zerg/state/f.journal"), "x").unwrap();
        std::fs::write(r.join(".zerg/state/f-events.jsonl"), "{}\n").unwrap();
        std::fs::write(r.join(".zerg/state/g.json"), "{}").unwrap();
        std::fs::write(r.join(".zerg/rush/f/spec/task-graph.json"), "{}").unwrap();
        std::fs::write(r.join(".zerg/logs/worker-0.log"), "hello\n").unwrap();
        std::fs::write(r.join(".zerg/monitor.log"), "line\n").unwrap();
        git_ok(r, &["branch", "zerg/f/staging"]);
        for w in 0..2 {
            git_ok(
                r,
                &[
                    "worktree",
                    "add",
                    "-q",
                    "-b",
                    &format!("zerg/f/worker-{w}"),
                    &format!(".zerg-worktrees/f/worker-{w}"),
                ],
            );
        }
        std::fs::write(r.join(".zerg-worktrees/f/worker-1/a.txt"), "changed\n").unwrap();
        d
    }

    #[test]
    fn prune_removes_an_ended_rush_but_keeps_uncommitted_work_and_the_result() {
        let d = ended_rush();
        let r = d.path();
        let job = PruneJob {
            repo: r.to_path_buf(),
            feature: "f".into(),
            dry_run: true,
            branches: false,
            logs: false,
        };
        let dry = prune(&job);
        // A dry run removes nothing and says the same as the real one.
        assert!(r.join(".zerg/state/f.json").exists());
        assert!(r.join(".zerg-worktrees/f/worker-0").exists());
        let real = prune(&PruneJob {
            dry_run: false,
            ..job
        });
        assert_eq!(dry, real);
        assert!(real.bytes > 0);
        for gone in [
            ".zerg/state/f.json",
            ".zerg/state/f.journal",
            ".zerg/state/f-events.jsonl",
            ".zerg/rush/f",
            ".zerg-worktrees/f/worker-0",
        ] {
            assert!(!r.join(gone).exists(), "{gone} should be gone");
            assert!(real.removed.iter().any(|x| x == gone), "{real:?}");
        }
        // Another feature's state, the logs, the dirty worktree and its branch, and the staging
        // branch stay, each with its reason.
        assert!(r.join(".zerg/state/g.json").exists());
        assert!(r.join(".zerg/logs/worker-0.log").exists());
        assert!(r.join(".zerg/monitor.log").exists());
        assert!(r.join(".zerg-worktrees/f/worker-1/a.txt").exists());
        let kept = real.kept.join("\n");
        assert!(kept.contains("worker-1: has uncommitted changes"), "{kept}");
        assert!(
            kept.contains("zerg/f/worker-1: its worktree was kept"),
            "{kept}"
        );
        assert!(kept.contains("zerg/f/staging: the rush's result"), "{kept}");
        let branches = git::git(r, &["branch", "--list", "zerg/*"]).unwrap();
        assert!(!branches.contains("zerg/f/worker-0"), "{branches}");
        assert!(branches.contains("zerg/f/worker-1"), "{branches}");
        assert!(branches.contains("zerg/f/staging"), "{branches}");
    }

    #[test]
    fn prune_with_branches_and_logs_takes_the_staging_branch_and_the_logs() {
        let d = ended_rush();
        let r = d.path();
        std::fs::write(r.join(".zerg-worktrees/f/worker-1/a.txt"), "a\n").unwrap();
        let out = prune(&PruneJob {
            repo: r.to_path_buf(),
            feature: "f".into(),
            dry_run: false,
            branches: true,
            logs: true,
        });
        assert!(out.kept.is_empty(), "{out:?}");
        assert!(!r.join(".zerg/logs").exists());
        assert!(!r.join(".zerg/monitor.log").exists());
        assert!(!r.join(".zerg-worktrees").exists());
        let branches = git::git(r, &["branch", "--list", "zerg/*"]).unwrap();
        assert!(branches.is_empty(), "{branches}");
        assert_eq!(usage(r, "f"), Usage::default());
    }

    #[test]
    fn logs_over_the_size_rotate_and_old_rotated_ones_go() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        std::fs::create_dir_all(r.join(".zerg/logs")).unwrap();
        std::fs::create_dir_all(r.join(".zerg/state")).unwrap();
        let big = vec![b'x'; (1 << 20) + 1];
        std::fs::write(r.join(".zerg/monitor.log"), &big).unwrap();
        std::fs::write(r.join(".zerg/logs/worker-0.log"), b"small\n").unwrap();
        std::fs::write(r.join(".zerg/state/f-events.jsonl"), &big).unwrap();
        // An old rotated copy, and a file of the user's that only looks like one.
        let old = r.join(".zerg/logs/worker-0.log.20200101T000000Z");
        std::fs::write(&old, b"old").unwrap();
        let now = std::time::SystemTime::now();
        std::fs::File::options()
            .write(true)
            .open(&old)
            .unwrap()
            .set_modified(now - std::time::Duration::from_secs(8 * 86_400))
            .unwrap();
        std::fs::write(r.join(".zerg/logs/worker-0.log.bak"), b"mine").unwrap();
        let cfg = crate::config::LoggingConfig {
            retain_days: 7,
            max_log_size_mb: 1,
        };
        rotate_logs(r, "f", &cfg, now);
        let names = |dir: &str| -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(r.join(dir))
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        let zerg = names(".zerg");
        assert!(!zerg.contains(&"monitor.log".to_string()), "{zerg:?}");
        assert!(
            zerg.iter()
                .any(|n| n.starts_with("monitor.log.") && n.ends_with('Z')),
            "{zerg:?}"
        );
        let state = names(".zerg/state");
        assert!(
            state.iter().any(|n| n.starts_with("f-events.jsonl.")),
            "{state:?}"
        );
        // The small log stays; the old rotated copy goes; the user's file stays.
        assert_eq!(
            names(".zerg/logs"),
            vec!["worker-0.log".to_string(), "worker-0.log.bak".to_string()]
        );
        // Eight days on, the copy rotated today goes too.
        rotate_logs(
            r,
            "f",
            &cfg,
            now + std::time::Duration::from_secs(8 * 86_400),
        );
        assert!(!names(".zerg").iter().any(|n| n.starts_with("monitor.log.")));
    }

    #[test]
    fn usage_counts_state_worktrees_and_logs_apart() {
        let d = ended_rush();
        let u = usage(d.path(), "f");
        // {} + x + {}\n + {} (task graph)
        assert_eq!(u.state_bytes, 2 + 1 + 3 + 2);
        assert_eq!(u.log_bytes, 6 + 5);
        assert!(u.worktree_bytes > 0);
    }
}
