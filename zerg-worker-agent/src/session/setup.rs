//! `worktree.setup`: the commands that make a worktree ready for the task's commands (a venv,
//! `npm ci`, generated files), run before the worker's first task and again whenever the
//! commands or a `when_changed` file (a lock file a level merge brought in) differ from the last
//! setup that succeeded. Also how a verification command that is not installed is told apart
//! from a task that failed: both are environment errors, which zergd pauses the rush on.

use std::hash::{Hash, Hasher};

use super::*;

/// What came of making the worktree ready.
pub(super) enum Setup {
    /// Ready: nothing to run, or every command succeeded.
    Ready,
    /// zergd took the lease back (or cannot be reached) while a command ran.
    Abandoned,
    /// A command failed: why, and how to fix it.
    Failed(String),
}

impl Session {
    /// The environment of a `worktree.setup` command: the commit identity and, in the sandbox,
    /// the proxy port whose connections may also reach `sandbox.setup_allow_hosts`.
    fn setup_env(&self) -> Vec<(String, String)> {
        let mut env = self.identity.clone();
        if self.env.confined {
            env.extend(zerg_sandbox::proxy_env(zerg_sandbox::SETUP_EGRESS_PORT));
        }
        env
    }

    /// Runs `worktree.setup` in the worktree when it has not run yet for what the worktree
    /// holds now. The output of command `i` goes to `setup/worker-<N>-<i>.txt` in the worker's log directory and to this
    /// worker's log.
    pub(super) async fn ensure_setup(&mut self) -> Setup {
        let Some(setup) = self.cfg.setup.clone() else {
            return Setup::Ready;
        };
        if setup.commands.is_empty() {
            return Setup::Ready;
        }
        let key = setup_key(&self.env.worktree, &setup);
        if self.setup_key == Some(key) {
            return Setup::Ready;
        }
        let before = Made::find(&self.env.worktree).await;
        let started = Instant::now();
        let limit = Duration::from_secs(setup.timeout_seconds.max(1));
        for (i, cmd) in setup.commands.iter().enumerate() {
            eprintln!("zerg-worker-agent: worktree.setup[{i}]: {cmd}");
            let left = limit.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Setup::Failed(format!(
                    "worktree.setup timed out after {}s before `{cmd}` ran (worktree.setup_timeout_seconds)",
                    limit.as_secs()
                ));
            }
            let spec = Spec {
                argv: vec!["sh".into(), "-c".into(), cmd.clone()],
                cwd: &self.env.worktree.clone(),
                env: self.setup_env(),
                timeout: left,
                artifact: Some(
                    self.env
                        .log_dir
                        .join("setup")
                        .join(format!("worker-{}-{i}.txt", self.env.worker_id)),
                ),
                own_group: true,
                result_grace: left,
                detail: None,
                profile: Profile::Plain,
            };
            self.setup_running = Some((i, Instant::now()));
            let o = self.supervise(spec).await;
            self.setup_running = None;
            let o = match o {
                None => return Setup::Abandoned,
                Some(Ok(o)) => o,
                Some(Err(e)) => {
                    return Setup::Failed(format!(
                        "worktree.setup[{i}] `{cmd}`: cannot run sh: {e}"
                    ));
                }
            };
            for line in o.tail.lines() {
                eprintln!("zerg-worker-agent: setup: {line}");
            }
            if o.timed_out {
                return Setup::Failed(format!(
                    "worktree.setup[{i}] `{cmd}` did not finish within {}s (worktree.setup_timeout_seconds): {}",
                    limit.as_secs(),
                    task::last_line(&o.tail)
                ));
            }
            if !o.success() {
                return Setup::Failed(format!(
                    "worktree.setup[{i}] `{cmd}` failed (exit {}): {}; fix worktree.setup in .zerg/config.yaml",
                    o.code.unwrap_or(-1),
                    task::last_line(&o.tail)
                ));
            }
        }
        let after = Made::find(&self.env.worktree).await;
        self.setup_made.add(before, after);
        if !self.setup_made.untracked.is_empty() || !self.setup_made.tracked.is_empty() {
            eprintln!(
                "zerg-worker-agent: worktree.setup made or changed (never committed): {}",
                self.setup_made.names()
            );
        }
        self.setup_key = Some(key);
        Setup::Ready
    }

    /// Puts back the tracked files only `worktree.setup` changed, before a commit, so the task
    /// commits the agent's work; a file the agent changed after the setup is the agent's. The
    /// setup runs again before the next task, since what it changed is gone.
    pub(super) async fn restore_setup_changes(&mut self) {
        let mut restored = Vec::new();
        for (path, left) in &self.setup_made.tracked {
            if content_hash(&self.env.worktree.join(path)).await == *left
                && run::git(&self.env.worktree, &["checkout", "-q", "HEAD", "--", path])
                    .await
                    .is_ok()
            {
                restored.push(path.as_str());
            }
        }
        if !restored.is_empty() {
            eprintln!(
                "zerg-worker-agent: left out what only worktree.setup changed: {}",
                restored.join(", ")
            );
            self.setup_key = None;
            self.setup_made.tracked.clear();
        }
    }
}

/// What `worktree.setup` left in the worktree: the untracked paths it made (a directory made
/// whole, such as `.venv/` or `node_modules/` in a repository that does not ignore them, is one
/// entry) and the tracked files it changed, with a hash of what it left in each. The untracked
/// ones stay for the next task and are left out of every commit, status and clean, as the
/// handoff directory is.
#[derive(Default)]
pub(super) struct Made {
    /// Untracked paths, relative to the worktree, without a trailing `/`.
    pub(super) untracked: Vec<String>,
    /// Tracked files and the hash of their content after the setup (`None`: removed).
    pub(super) tracked: Vec<(String, Option<u64>)>,
}

impl Made {
    /// The untracked paths (git's own listing, whole new directories as one) and the changed
    /// tracked files now, as `tracked` holds them; empty where git cannot say.
    async fn find(wt: &Path) -> Made {
        let list = |args: &'static [&'static str]| async move {
            run::git(wt, args)
                .await
                .map(|out| {
                    out.split('\0')
                        .map(|p| p.trim_end_matches('/').to_string())
                        .filter(|p| !p.is_empty() && !task::under_task_dir(p))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
        };
        let untracked = list(&[
            "ls-files",
            "-z",
            "--others",
            "--directory",
            "--no-empty-directory",
            "--exclude-standard",
        ])
        .await;
        let mut tracked = Vec::new();
        for p in list(&["ls-files", "-z", "--modified", "--deleted"]).await {
            if !tracked.iter().any(|(q, _)| *q == p) {
                let h = content_hash(&wt.join(&p)).await;
                tracked.push((p, h));
            }
        }
        Made { untracked, tracked }
    }

    /// Adds what a setup made: what is in `after` and was not in `before`.
    fn add(&mut self, before: Made, after: Made) {
        for p in after.untracked {
            if !before.untracked.contains(&p) && !self.untracked.contains(&p) {
                self.untracked.push(p);
            }
        }
        for (p, h) in after.tracked {
            if !before.tracked.iter().any(|(q, g)| *q == p && *g == h) {
                self.tracked.retain(|(q, _)| *q != p);
                self.tracked.push((p, h));
            }
        }
    }

    /// The names, for the worker's log (the first 20).
    fn names(&self) -> String {
        self.untracked
            .iter()
            .chain(self.tracked.iter().map(|(p, _)| p))
            .take(20)
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A hash of a file's bytes; `None` when it cannot be read (removed).
async fn content_hash(path: &Path) -> Option<u64> {
    let bytes = tokio::fs::read(path).await.ok()?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    Some(h.finish())
}

/// What a setup ran for: the commands and the content of each `when_changed` file (absent is a
/// content of its own). Compared only within this process.
fn setup_key(worktree: &Path, setup: &v1::WorktreeSetup) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    setup.commands.hash(&mut h);
    for f in &setup.when_changed {
        f.hash(&mut h);
        // A name from zergd that leaves the worktree is read as absent.
        let inside = Path::new(f)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        match inside.then(|| std::fs::read(worktree.join(f))) {
            Some(Ok(bytes)) => {
                1u8.hash(&mut h);
                bytes.hash(&mut h);
            }
            _ => 0u8.hash(&mut h),
        }
    }
    h.finish()
}

/// When a blocking verification command failed because a program it names is not installed
/// where the worker runs (`sh: 1: python3: not found`, exit 127; or found but not executable,
/// exit 126), the program's name. A missing path (`./run-tests.sh`) is not one: a task may be
/// the one that should have made it.
pub(super) fn missing_program(code: Option<i32>, tail: &str) -> Option<String> {
    if !matches!(code, Some(126 | 127)) {
        return None;
    }
    tail.lines().rev().find_map(|line| {
        let line = line.trim_end();
        let rest = line
            .strip_suffix(": command not found")
            .or_else(|| line.strip_suffix(": not found"))?;
        let name = rest.rsplit(": ").next()?.trim();
        (!name.is_empty() && !name.contains('/') && !name.contains(' ')).then(|| name.to_string())
    })
}

/// The paths a failed command's output says are missing (`No such file or directory`, as
/// Python, Node and the shell tools print it), as written there.
pub(super) fn missing_paths(tail: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for line in tail.lines() {
        let lower = line.to_ascii_lowercase();
        let Some(at) = lower.find("no such file or directory") else {
            continue;
        };
        // Quoted after the message: `...: '.env'` (Python), `..., open '.env'` (Node).
        let after = &line[at..];
        let quoted = ['\'', '"'].iter().find_map(|&q| {
            let start = after.find(q)? + 1;
            let len = after[start..].find(q)?;
            Some(after[start..start + len].to_string())
        });
        // Before it, when nothing is quoted: `cat: .env: No such file or directory`.
        let before = line[..at]
            .trim_end()
            .strip_suffix(':')
            .and_then(|b| b.rsplit(": ").next())
            .map(|s| s.trim().to_string());
        if let Some(p) = quoted.or(before)
            && !p.is_empty()
            && !p.contains(char::is_whitespace)
            && !out.contains(&p)
        {
            out.push(p);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_missing_from_path_is_named_and_a_missing_path_is_not() {
        assert_eq!(
            missing_program(Some(127), "sh: 1: python3: not found").as_deref(),
            Some("python3")
        );
        assert_eq!(
            missing_program(Some(127), "x\nbash: line 1: pytest: command not found\n").as_deref(),
            Some("pytest")
        );
        assert_eq!(
            missing_program(Some(127), "sh: 1: ./run-tests.sh: not found"),
            None
        );
        assert_eq!(missing_program(Some(1), "sh: 1: python3: not found"), None);
        assert_eq!(missing_program(Some(127), "no such thing"), None);
    }

    #[test]
    fn missing_paths_are_read_from_python_node_and_shell_messages() {
        let tail = "Traceback (most recent call last):\nFileNotFoundError: [Errno 2] No such file or directory: '.env'\nError: ENOENT: no such file or directory, open \"/w/config/local.json\"\ncat: secrets/k: No such file or directory\nall good";
        assert_eq!(
            missing_paths(tail),
            vec![".env", "/w/config/local.json", "secrets/k"]
        );
        assert!(missing_paths("AssertionError: 1 != 2").is_empty());
    }

    #[test]
    fn the_key_changes_with_a_lock_file_and_the_commands() {
        let dir = tempfile::tempdir().unwrap();
        let s = v1::WorktreeSetup {
            commands: vec!["true".into()],
            when_changed: vec!["uv.lock".into(), "../outside".into()],
            timeout_seconds: 5,
        };
        let absent = setup_key(dir.path(), &s);
        std::fs::write(dir.path().join("uv.lock"), "a").unwrap();
        let a = setup_key(dir.path(), &s);
        assert_ne!(absent, a);
        assert_eq!(a, setup_key(dir.path(), &s));
        std::fs::write(dir.path().join("uv.lock"), "b").unwrap();
        assert_ne!(a, setup_key(dir.path(), &s));
        let mut other = s.clone();
        other.commands.push("make".into());
        assert_ne!(setup_key(dir.path(), &s), setup_key(dir.path(), &other));
    }
}
