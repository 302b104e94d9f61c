//! One task: preparing the worktree, the agent CLI, the verification tiers, the commit and
//! the report.

use super::*;

/// The handoff directory, relative to the worktree; never committed.
const TASK_DIR: &str = ".zerg-task";

/// Whether `path` (relative to the worktree) is the handoff directory or under it.
pub(super) fn under_task_dir(path: &str) -> bool {
    path == TASK_DIR
        || path
            .strip_prefix(TASK_DIR)
            .is_some_and(|r| r.starts_with('/'))
}

impl Session {
    pub(super) fn task_dir(&self) -> PathBuf {
        self.env.worktree.join(TASK_DIR)
    }

    /// Runs `f` on the worktree, opened in process, on the blocking pool; `None` when it
    /// cannot be opened in process (or if `f` panicked). The worktree is opened afresh each
    /// time, so an idle worker holds no repository state.
    async fn in_repo<T: Send + 'static>(
        &self,
        f: impl FnOnce(&zerg_git::Repo) -> T + Send + 'static,
    ) -> Option<T> {
        if !self.in_process {
            return None;
        }
        let wt = self.env.worktree.clone();
        tokio::task::spawn_blocking(move || match zerg_git::Repo::open_worktree(&wt) {
            Ok(r) => Some(f(&r)),
            Err(e) => {
                eprintln!(
                    "zerg-worker-agent: git fallback (cannot open the worktree in process: {e})"
                );
                None
            }
        })
        .await
        .ok()
        .flatten()
    }

    /// Pathspecs that keep the handoff directory out of commits. Paths that git already ignores
    /// are left out: naming an ignored path makes `git add` fail.
    pub(super) async fn pathspec_excludes(&self) -> Vec<String> {
        // The spec is not excluded here (in a container it is ignored, and naming an ignored
        // path fails `git add`): `restore_spec` puts it back in the index instead. What the
        // setup made is untracked and not ignored, so naming it is safe.
        let paths = vec![TASK_DIR.to_string()];
        let mut v: Vec<String> = self
            .setup_made
            .untracked
            .iter()
            .map(|p| format!(":(exclude){p}"))
            .collect();
        for p in paths {
            if run::git(&self.env.worktree, &["check-ignore", "-q", &p])
                .await
                .is_err()
            {
                v.push(format!(":(exclude){p}"));
            }
        }
        v
    }

    /// Resets the worktree to the commit zergd gave, so every task starts from a known state.
    /// Inside a level the base is usually this worker's own last commit, with nothing changed
    /// since: then there is nothing to reset.
    pub(super) async fn prepare_worktree(&mut self, task: &v1::Task) -> Result<(), String> {
        let skips = self.skips();
        let wt = &self.env.worktree;
        // An earlier process of this slot, or the agent CLI of an earlier attempt that was
        // stopped, may have been killed in the middle of a git command. The slot's worktree is
        // this process's alone, so its lock files are stale.
        if let Some(dir) = &self.git_dir {
            remove_stale_locks(dir).await;
        }
        let base = if task.base_commit.is_empty() {
            "HEAD"
        } else {
            task.base_commit.as_str()
        };
        let left = self.worktree_at.take();
        // Usually the worktree is clean on this worker's last commit and the base is that
        // commit or the level merge above it: the files that differ are moved in process.
        let moved = if task.base_commit.is_empty() || !task.resume_from.is_empty() {
            zerg_git::fell_back(zerg_git::Fallback::WorktreeReset);
            Err(zerg_git::Fallback::WorktreeReset.name().to_string())
        } else {
            let base = task.base_commit.clone();
            // Right after this process's own clean commit, nothing has run in the worktree: its
            // files are that commit's, and the move takes no status.
            let known_clean = left.as_ref().is_some_and(|l| l.committed);
            let from = left.map(|l| l.commit);
            let skips = skips.clone();
            match self
                .in_repo(move |r| {
                    let from = from.or_else(|| r.commit_id("HEAD")).unwrap_or_default();
                    let skips: Vec<&str> = skips.iter().map(String::as_str).collect();
                    r.checkout_clean(&from, &base, &skips, known_clean)
                })
                .await
            {
                Some(Ok(Ok(()))) => Ok(()),
                Some(Ok(Err(why))) => Err(why.name().to_string()),
                Some(Err(e)) => {
                    zerg_git::fell_back(zerg_git::Fallback::WorktreeReset);
                    Err(format!("the checkout in process failed: {e}"))
                }
                None => {
                    zerg_git::fell_back(zerg_git::Fallback::WorktreeReset);
                    Err(zerg_git::Fallback::WorktreeReset.name().to_string())
                }
            }
        };
        if let Err(why) = moved {
            eprintln!("zerg-worker-agent: git fallback ({why}) to {base}");
            run::git(wt, &["reset", "--hard", "-q", base]).await?;
            let rel = self.env.spec_rel();
            let mut clean = vec!["clean".to_string(), "-fdq".into(), "-e".into(), rel];
            for p in &skips {
                clean.extend(["-e".to_string(), format!("/{p}")]);
            }
            let clean: Vec<&str> = clean.iter().map(String::as_str).collect();
            run::git(wt, &clean).await?;
        }
        empty_task_dir(&self.task_dir()).await?;
        if !task.resume_from.is_empty()
            && let Err(e) = run::git(wt, &["cherry-pick", "--no-commit", &task.resume_from]).await
        {
            eprintln!(
                "zerg-worker-agent: cannot resume from checkpoint {}: {e}; starting fresh",
                task.resume_from
            );
            let _ = run::git(wt, &["cherry-pick", "--abort"]).await;
            if !task.base_commit.is_empty() {
                run::git(wt, &["reset", "--hard", "-q", &task.base_commit]).await?;
            }
        }
        self.worktree_at =
            (!task.base_commit.is_empty() && task.resume_from.is_empty()).then(|| LeftAt {
                commit: task.base_commit.clone(),
                committed: false,
            });
        Ok(())
    }

    /// A path the failed command's output says is missing, that is not in the worktree and
    /// that git ignores there: a file of the user's checkout that the worktree cannot have.
    async fn ignored_and_missing(&self, tail: &str) -> Option<String> {
        let wt = &self.env.worktree;
        for p in setup::missing_paths(tail) {
            let rel = match Path::new(&p).strip_prefix(wt) {
                Ok(r) => r.to_path_buf(),
                Err(_) if Path::new(&p).is_relative() => PathBuf::from(&p),
                Err(_) => continue,
            };
            let inside = rel
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
            let Some(rel) = rel.to_str().filter(|_| inside) else {
                continue;
            };
            if tokio::fs::symlink_metadata(wt.join(rel)).await.is_err()
                && run::git(wt, &["check-ignore", "-q", "--no-index", "--", rel])
                    .await
                    .is_ok()
            {
                return Some(rel.to_string());
            }
        }
        None
    }

    pub(super) async fn fail(
        &mut self,
        task: &v1::Task,
        kind: v1::FailKind,
        message: String,
        retry_at_ms: i64,
        checkpoint: String,
    ) -> TaskEnd {
        if self.env.remote.is_some() {
            self.push_artifacts(task).await;
        }
        let tiers = self.tier_results();
        let (tokens, models) = usage_to_wire(&self.attempt);
        let limit_type = self
            .attempt
            .limit
            .as_ref()
            .filter(|_| kind == v1::FailKind::RateLimited)
            .map(|l| {
                zerg_proto::contract::limits::clip(&l.kind, zerg_proto::contract::limits::MAX_NAME)
                    .to_string()
            })
            .unwrap_or_default();
        let req = v1::FailRequest {
            worker: Some(self.env.me()),
            lease_id: task.lease_id.clone(),
            task_id: task.id.clone(),
            kind: kind as i32,
            message,
            tiers,
            retry_at_ms,
            checkpoint_commit: checkpoint,
            cost_usd: self.attempt.cost_usd.unwrap_or(0.0),
            tokens,
            models,
            limit_type,
            context: std::mem::take(&mut self.retry_context),
        };
        match retrying!(self, |c| c.fail(req.clone())) {
            Ok(_) => TaskEnd::Next,
            Err(s) if s.code() == Code::FailedPrecondition => TaskEnd::Next,
            Err(s) => {
                eprintln!("zerg-worker-agent: cannot report failure: {}", s.message());
                TaskEnd::Exit(exit::ERROR)
            }
        }
    }

    pub(super) fn tier_results(&self) -> Vec<v1::TierResult> {
        self.tiers.clone()
    }

    pub(super) async fn run_task(&mut self, task: v1::Task) -> TaskEnd {
        let started = Instant::now();
        self.current = Some((task.id.clone(), task.lease_id.clone()));
        self.tiers.clear();
        self.attempt = Report::default();
        self.set_detail(String::new());
        self.last_output.store(0, Ordering::Relaxed);
        eprintln!(
            "zerg-worker-agent: task {} (attempt {}, lease {})",
            task.id, task.attempt, task.lease_id
        );
        self.set_step(v1::Step::LoadingContext, 5);
        if self.env.remote.is_some()
            && let Err(e) = self.fetch_base(&task).await
        {
            return self
                .fail(
                    &task,
                    v1::FailKind::AgentFailed,
                    format!("cannot fetch the base: {e}"),
                    0,
                    String::new(),
                )
                .await;
        }
        if self.env.remote.is_some()
            && !self.copies_fetched
            && let Err(e) = self.fetch_copies(&task).await
        {
            return self
                .fail(
                    &task,
                    v1::FailKind::Environment,
                    format!("worktree.copy: {e}"),
                    0,
                    String::new(),
                )
                .await;
        }
        if let Err(e) = self.prepare_worktree(&task).await {
            return self
                .fail(
                    &task,
                    v1::FailKind::AgentFailed,
                    format!("cannot prepare the worktree: {e}"),
                    0,
                    String::new(),
                )
                .await;
        }
        match self.ensure_setup().await {
            setup::Setup::Ready => {}
            setup::Setup::Abandoned => return self.abandon(&task).await,
            setup::Setup::Failed(msg) => {
                eprintln!("zerg-worker-agent: {msg}");
                return self
                    .fail(&task, v1::FailKind::Environment, msg, 0, String::new())
                    .await;
            }
        }
        let prompt = prompt::build(&task, &self.cfg.spec_context);

        // The agent CLI.
        self.set_step(v1::Step::Implementing, 10);
        let mut argv = self.cfg.agent_command.clone();
        // This attempt's own arguments (`--model <m>` from `agent.models`).
        argv.extend(task.agent_args.iter().cloned());
        argv.push(prompt);
        let task_dir = self.task_dir();
        let artifacts = self.env.log_dir.join("tasks").join(&task.id);
        let mut env = vec![
            (env::TASK_ID.to_string(), task.id.clone()),
            (
                env::TASK_DIR.to_string(),
                task_dir.to_string_lossy().to_string(),
            ),
        ];
        env.extend(self.identity.iter().cloned());
        let spec = Spec {
            argv: argv.clone(),
            cwd: &self.env.worktree.clone(),
            env: env.clone(),
            timeout: Duration::from_secs(self.cfg.agent_timeout_seconds.max(1)),
            artifact: Some(artifacts.join("agent-output.txt")),
            own_group: false,
            result_grace: run::RESULT_GRACE,
            detail: Some(self.detail.clone()),
            profile: Profile::from_name(&self.cfg.agent_profile),
        };
        let outcome = match self.supervise(spec).await {
            None => return self.abandon(&task).await,
            Some(Ok(o)) => o,
            Some(Err(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
                ) =>
            {
                let msg = format!(
                    "agent command '{}' cannot be run ({e}); install it or set agent.command in .zerg/config.yaml",
                    argv[0]
                );
                eprintln!("zerg-worker-agent: {msg}");
                self.fail(&task, v1::FailKind::AgentMissing, msg, 0, String::new())
                    .await;
                return TaskEnd::Exit(exit::BLOCKED);
            }
            Some(Err(e)) => {
                return self
                    .fail(
                        &task,
                        v1::FailKind::AgentFailed,
                        format!("cannot run the agent: {e}"),
                        0,
                        String::new(),
                    )
                    .await;
            }
        };

        self.attempt = outcome.report.clone();
        self.set_detail(String::new());
        if outcome.lingered {
            eprintln!(
                "zerg-worker-agent: the agent CLI printed its result but did not exit within {:?}; stopped it",
                run::RESULT_GRACE
            );
        }

        // Handoffs the agent CLI may have left.
        if let Some(esc) = read_json(&task_dir.join(ESCALATION_FILE)) {
            return self.escalate(&task, esc).await;
        }
        if let Some(cp) = read_json(&task_dir.join(CHECKPOINT_FILE)) {
            return self.checkpoint(&task, cp).await;
        }
        // A run that failed may have failed for a reason that is not the task's: a usage
        // limit, no login, no network. A successful run may merely mention one.
        let report = &outcome.report;
        let failed = !outcome.success() || report.verdict.as_ref().is_some_and(|v| v.failed);
        if failed && report.auth_failed {
            let msg = format!(
                "the agent CLI is not logged in ({}): run `claude /login` as the user zergd runs as, or give zergd ANTHROPIC_API_KEY, or a CLAUDE_CODE_OAUTH_TOKEN made with `claude setup-token`",
                said(&outcome)
            );
            return self
                .fail(&task, v1::FailKind::AuthFailed, msg, 0, String::new())
                .await;
        }
        if failed && let Some(limit) = report.limit.clone() {
            return self
                .fail(
                    &task,
                    v1::FailKind::RateLimited,
                    format!("agent reported a usage limit: {}", said(&outcome)),
                    limit.reset_ms,
                    String::new(),
                )
                .await;
        }
        if failed && report.unreachable {
            return self
                .fail(
                    &task,
                    v1::FailKind::ApiUnreachable,
                    format!("the agent CLI could not reach its API: {}", said(&outcome)),
                    0,
                    String::new(),
                )
                .await;
        }
        // What the next attempt is told if this one fails from here on: the end of what the
        // agent CLI printed, and its final message.
        let agent_said = match report.verdict.as_ref().map(|v| v.text.trim()) {
            Some(t) if !t.is_empty() => format!("The agent's last message:\n{}", clip_end(t, 3000)),
            _ => String::new(),
        };
        self.retry_context = format!(
            "The end of the agent CLI's output:\n```\n{}\n```\n{agent_said}",
            clip_end(&outcome.tail, 3000)
        );
        if outcome.timed_out {
            return self
                .fail(
                    &task,
                    v1::FailKind::AgentTimeout,
                    format!(
                        "agent ran longer than {}s (agent.timeout_seconds)",
                        self.cfg.agent_timeout_seconds
                    ),
                    0,
                    String::new(),
                )
                .await;
        }
        if let Some(v) = report
            .verdict
            .as_ref()
            .filter(|v| v.failed && outcome.success())
        {
            return self
                .fail(
                    &task,
                    v1::FailKind::AgentFailed,
                    format!(
                        "agent reported an error: {}",
                        v.text.chars().take(500).collect::<String>()
                    ),
                    0,
                    String::new(),
                )
                .await;
        }
        if !outcome.success() {
            let code = outcome
                .code
                .map(|c| c.to_string())
                .unwrap_or_else(|| "signal".into());
            return self
                .fail(
                    &task,
                    v1::FailKind::AgentFailed,
                    format!("agent exited {code}: {}", said(&outcome)),
                    0,
                    String::new(),
                )
                .await;
        }

        // What the agent changed, so that what verification leaves behind can go.
        let agent_changed = self.changed_paths().await;
        // Three-tier verification.
        let tiers = self.cfg.tiers.clone();
        for (i, t) in tiers.iter().enumerate() {
            let (cmd, timeout) = if !t.command.is_empty() {
                (t.command.clone(), t.timeout_seconds)
            } else if t.tier == 2 && !task.verification_command.is_empty() {
                (
                    task.verification_command.clone(),
                    task.verification_timeout_seconds,
                )
            } else {
                continue;
            };
            let step = match t.tier {
                1 => v1::Step::VerifyingTier1,
                2 => v1::Step::VerifyingTier2,
                _ => v1::Step::VerifyingTier3,
            };
            self.set_step(step, 70 + 10 * i as u32);
            let spec = Spec {
                argv: vec!["sh".into(), "-c".into(), cmd.clone()],
                cwd: &self.env.worktree.clone(),
                env: env.clone(),
                timeout: Duration::from_secs(timeout.max(1)),
                artifact: Some(artifacts.join(format!("verification-tier{}.txt", t.tier))),
                own_group: true,
                // Verification commands print no stream-json; a stray match must not cut them short.
                result_grace: Duration::from_secs(timeout.max(1)),
                detail: None,
                profile: Profile::Plain,
            };
            let o = match self.supervise(spec).await {
                None => return self.abandon(&task).await,
                Some(Ok(o)) => o,
                Some(Err(e)) => Outcome {
                    tail: format!("cannot run sh: {e}"),
                    ..Default::default()
                },
            };
            self.tiers.push(v1::TierResult {
                tier: t.tier,
                name: t.name.clone(),
                success: o.success(),
                blocking: t.blocking,
                exit_code: o.code.unwrap_or(-1),
                output_tail: last_line(&o.tail),
            });
            if !o.success()
                && t.blocking
                && let Some(program) = setup::missing_program(o.code, &o.tail)
            {
                return self
                    .fail(
                        &task,
                        v1::FailKind::Environment,
                        format!(
                            "tier {} ({}) `{cmd}` exited {}: `{program}` is not installed where the worker runs",
                            t.tier,
                            t.name,
                            o.code.unwrap_or(-1)
                        ),
                        0,
                        String::new(),
                    )
                    .await;
            }
            if !o.success()
                && t.blocking
                && let Some(path) = self.ignored_and_missing(&o.tail).await
            {
                return self
                    .fail(
                        &task,
                        v1::FailKind::Environment,
                        format!(
                            "tier {} ({}) `{cmd}` failed: `{path}` is missing from the worktree: git ignores it, so a worktree never has it; add it to worktree.copy (or make it with worktree.setup) in .zerg/config.yaml",
                            t.tier, t.name
                        ),
                        0,
                        String::new(),
                    )
                    .await;
            }
            if !o.success() && t.blocking {
                let why = if o.timed_out {
                    format!("timed out after {timeout}s")
                } else {
                    format!("exit {}", o.code.unwrap_or(-1))
                };
                self.retry_context = format!(
                    "Verification tier {} ({}) `{cmd}` failed ({why}). The end of its output:\n```\n{}\n```\n{agent_said}",
                    t.tier,
                    t.name,
                    clip_end(&o.tail, 5000)
                );
                return self
                    .fail(
                        &task,
                        v1::FailKind::VerificationFailed,
                        format!(
                            "tier {} ({}) `{cmd}` failed ({why}): {}",
                            t.tier,
                            t.name,
                            last_line(&o.tail)
                        ),
                        0,
                        String::new(),
                    )
                    .await;
            }
        }

        if let Some(before) = &agent_changed {
            self.drop_byproducts(&task, before).await;
        }
        self.restore_setup_changes().await;
        // Commit.
        self.set_step(v1::Step::Committing, 95);
        let (commit, changed) = match self.commit(&task).await {
            Ok((commit, changed, clean)) => {
                self.worktree_at = Some(LeftAt {
                    commit: commit.clone(),
                    committed: clean,
                });
                (commit, changed)
            }
            Err(e) => {
                return self
                    .fail(&task, v1::FailKind::CommitFailed, e, 0, String::new())
                    .await;
            }
        };
        if self.env.remote.is_some()
            && let Err(e) = self.push(&task, &commit).await
        {
            return self
                .fail(
                    &task,
                    v1::FailKind::CommitFailed,
                    format!("cannot push the commit: {e}"),
                    0,
                    String::new(),
                )
                .await;
        }
        if self.env.remote.is_some() {
            self.push_artifacts(&task).await;
        }
        let out_of_scope = self.out_of_scope(&task, &commit, changed).await;
        let (tokens, models) = usage_to_wire(&self.attempt);
        let req = v1::CompleteRequest {
            worker: Some(self.env.me()),
            lease_id: task.lease_id.clone(),
            task_id: task.id.clone(),
            commit: commit.clone(),
            tiers: self.tier_results(),
            out_of_scope,
            duration_ms: started.elapsed().as_millis() as u64,
            cost_usd: self.attempt.cost_usd.unwrap_or(0.0),
            tokens,
            models,
        };
        match retrying!(self, |c| c.complete(req.clone())) {
            Ok(_) => {
                self.tasks_completed += 1;
                eprintln!("zerg-worker-agent: task {} committed {commit}", task.id);
                TaskEnd::Next
            }
            Err(s) if s.code() == Code::FailedPrecondition => {
                // Our lease was superseded (we were presumed dead): drop the commit so it can
                // never reach staging twice.
                eprintln!(
                    "zerg-worker-agent: zergd refused the result ({}); discarding commit {commit}",
                    s.message()
                );
                // git moves the files back to the base: the next move checks them first.
                self.worktree_at = None;
                let _ = run::git(
                    &self.env.worktree,
                    &["reset", "--hard", "-q", &task.base_commit],
                )
                .await;
                TaskEnd::Next
            }
            Err(s) => {
                eprintln!(
                    "zerg-worker-agent: cannot report completion: {}",
                    s.message()
                );
                TaskEnd::Exit(exit::ERROR)
            }
        }
    }

    pub(super) async fn abandon(&mut self, task: &v1::Task) -> TaskEnd {
        if !task.base_commit.is_empty() {
            let _ = run::git(
                &self.env.worktree,
                &["reset", "--hard", "-q", &task.base_commit],
            )
            .await;
        }
        if *self.abort_rx.borrow() == Some(Revocation::Superseded) {
            return TaskEnd::Exit(exit::ERROR);
        }
        TaskEnd::Next
    }

    /// Commits the task: in process when it can be (the commit, and the paths it changed
    /// since the base), else with git (the commit alone).
    pub(super) async fn commit(
        &self,
        task: &v1::Task,
    ) -> Result<(String, Option<Vec<String>>, bool), String> {
        let msg = format!(
            "ZERG [{}]: {}\n\nTask-ID: {}\n",
            self.env.worker_id, task.title, task.id
        );
        let done = self
            .in_repo({
                let (base, spec, who, msg, skips) = (
                    task.base_commit.clone(),
                    self.env.spec_rel(),
                    self.who.clone(),
                    msg.clone(),
                    self.skips(),
                );
                move |r| {
                    let skips: Vec<&str> = skips.iter().map(String::as_str).collect();
                    r.commit_worktree(&base, &spec, &skips, &msg, &who)
                }
            })
            .await;
        match done {
            Some(Ok(Ok(c))) => return Ok((c.commit, Some(c.changed), c.clean)),
            Some(Ok(Err(why))) => {
                eprintln!(
                    "zerg-worker-agent: git fallback ({}): committing with git",
                    why.name()
                )
            }
            Some(Err(e)) => {
                eprintln!(
                    "zerg-worker-agent: git fallback (the commit in process failed: {e}): committing with git"
                )
            }
            // Opening it failed (said above) or the commit panicked.
            None if self.in_process => {
                eprintln!(
                    "zerg-worker-agent: git fallback (the commit in process did not run): committing with git"
                )
            }
            None => {}
        }
        let wt = &self.env.worktree;
        let mut add: Vec<String> = vec!["add".into(), "-A".into(), "--".into(), ".".into()];
        add.extend(self.pathspec_excludes().await);
        let add_ref: Vec<&str> = add.iter().map(String::as_str).collect();
        run::git(wt, &add_ref).await?;
        self.restore_spec(task).await;
        self.git_with_identity(&["commit", "-q", "--allow-empty", "--no-verify", "-m", &msg])
            .await?;
        Ok((run::git(wt, &["rev-parse", "HEAD"]).await?, None, false))
    }

    /// The paths that differ from `HEAD` (untracked ones included, the handoff directory and
    /// the spec left out), read in process; `None` where only git could say.
    async fn changed_paths(&self) -> Option<std::collections::HashSet<String>> {
        let mut skips = self.skips();
        skips.push(self.env.spec_rel());
        match self
            .in_repo(move |r| {
                let skips: Vec<&str> = skips.iter().map(String::as_str).collect();
                r.uncommitted_paths(&skips)
            })
            .await
        {
            Some(Ok(Ok(paths))) => Some(paths.into_iter().collect()),
            _ => None,
        }
    }

    /// The paths every status, commit and clean of the worktree leaves alone: the handoff
    /// directory and what `worktree.setup` made.
    fn skips(&self) -> Vec<String> {
        let mut v = vec![TASK_DIR.to_string()];
        v.extend(self.setup_made.untracked.iter().cloned());
        v
    }

    /// Puts back what only the verification tiers changed, so the task commits the agent's
    /// work: a tracked file they changed or removed is restored from `HEAD`, a file they made
    /// is removed (an untracked log, `__pycache__` in a repository that does not ignore it).
    async fn drop_byproducts(&self, task: &v1::Task, before: &std::collections::HashSet<String>) {
        let Some(after) = self.changed_paths().await else {
            return;
        };
        let wt = &self.env.worktree;
        let mut dropped: Vec<&String> = after.difference(before).collect();
        dropped.sort();
        for path in &dropped {
            if run::git(wt, &["checkout", "-q", "HEAD", "--", path.as_str()])
                .await
                .is_err()
            {
                let _ = tokio::fs::remove_file(wt.join(path.as_str())).await;
            }
        }
        if !dropped.is_empty() {
            eprintln!(
                "zerg-worker-agent: task {}: left out what only verification changed: {}",
                task.id,
                dropped
                    .iter()
                    .take(20)
                    .map(|p| p.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }

    /// Puts the rush's spec back in the index as the base commit has it, whatever the agent CLI
    /// did to it (or committed itself), so the task's commit never changes the spec.
    pub(super) async fn restore_spec(&self, task: &v1::Task) {
        let base = if task.base_commit.is_empty() {
            "HEAD"
        } else {
            task.base_commit.as_str()
        };
        let rel = self.env.spec_rel();
        if let Err(e) = run::git(&self.env.worktree, &["reset", "-q", base, "--", &rel]).await {
            eprintln!("zerg-worker-agent: cannot restore {rel} in the index: {e}");
        }
    }

    pub(super) async fn git_with_identity(&self, args: &[&str]) -> Result<String, String> {
        run::git_with(&self.env.worktree, args, &self.identity).await
    }

    /// Files the task changed that it does not own: from the commit's own change set, or
    /// (after a commit by git) from git's diff.
    pub(super) async fn out_of_scope(
        &self,
        task: &v1::Task,
        commit: &str,
        changed: Option<Vec<String>>,
    ) -> Vec<String> {
        if task.base_commit.is_empty() {
            return vec![];
        }
        let changed = match changed {
            Some(c) => c,
            None => run::git(
                &self.env.worktree,
                &["diff", "--name-only", &task.base_commit, commit],
            )
            .await
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect(),
        };
        changed
            .iter()
            .map(String::as_str)
            .filter(|f| !f.is_empty())
            .filter(|f| {
                !task
                    .files_create
                    .iter()
                    .chain(&task.files_modify)
                    .any(|o| o == f)
            })
            // Within what zergd accepts: the first paths are enough to act on.
            .filter(|f| f.len() <= zerg_proto::contract::limits::MAX_PATH)
            .take(zerg_proto::contract::limits::MAX_PATHS)
            .map(str::to_string)
            .collect()
    }
}

/// Leaves `dir` an empty directory of its own. The one the last task left is kept when it is
/// empty (the usual case): removing and creating a directory per task costs the file system an
/// inode freed and one allocated each time. Anything else there (files the agent CLI left, a
/// file or a symlink in its place) is removed, never followed.
async fn empty_task_dir(dir: &Path) -> Result<(), String> {
    match tokio::fs::symlink_metadata(dir).await {
        Ok(m) if m.is_dir() => {
            let empty = match tokio::fs::read_dir(dir).await {
                Ok(mut entries) => matches!(entries.next_entry().await, Ok(None)),
                Err(_) => false,
            };
            if empty {
                return Ok(());
            }
            let _ = tokio::fs::remove_dir_all(dir).await;
        }
        Ok(_) => {
            let _ = tokio::fs::remove_file(dir).await;
        }
        Err(_) => {}
    }
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))
}

/// Removes `index.lock` and `HEAD.lock` from the worktree's own git directory.
pub(super) async fn remove_stale_locks(git_dir: &Path) {
    for name in ["index.lock", "HEAD.lock"] {
        let p = git_dir.join(name);
        if tokio::fs::remove_file(&p).await.is_ok() {
            eprintln!("zerg-worker-agent: removed stale {}", p.display());
        }
    }
}

/// What the agent CLI said of its run, for a failure message: its final result's text when it
/// printed one (a stream-json line is no message for people), else its last output lines.
fn said(outcome: &Outcome) -> String {
    match outcome
        .report
        .verdict
        .as_ref()
        .filter(|v| !v.text.trim().is_empty())
    {
        Some(v) => v.text.chars().take(500).collect(),
        None => last_line(&outcome.tail),
    }
}

/// At most the last `max` bytes of `s`, cut at a character boundary.
fn clip_end(s: &str, max: usize) -> &str {
    let s = s.trim_end();
    let mut from = s.len().saturating_sub(max);
    while !s.is_char_boundary(from) {
        from += 1;
    }
    &s[from..]
}

pub(super) fn last_line(tail: &str) -> String {
    let t: Vec<&str> = tail.lines().filter(|l| !l.trim().is_empty()).collect();
    let s = t[t.len().saturating_sub(3)..].join(" | ");
    s.chars().take(500).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[tokio::test]
    async fn the_task_dir_is_kept_when_empty_and_emptied_of_anything_else() {
        let root = tempfile::tempdir().unwrap();
        let td = root.path().join(TASK_DIR);
        // Absent: created.
        empty_task_dir(&td).await.unwrap();
        let ino = std::fs::metadata(&td).unwrap().ino();
        // Empty: the same directory, not a new one.
        empty_task_dir(&td).await.unwrap();
        assert_eq!(std::fs::metadata(&td).unwrap().ino(), ino);
        // What an agent left there is removed.
        std::fs::create_dir_all(td.join("sub")).unwrap();
        std::fs::write(td.join("sub/checkpoint.json"), "{}").unwrap();
        empty_task_dir(&td).await.unwrap();
        assert_eq!(std::fs::read_dir(&td).unwrap().count(), 0);
        // A symlink in its place is removed, not followed; a file in its place is removed.
        let outside = root.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        std::fs::remove_dir(&td).unwrap();
        std::os::unix::fs::symlink(&outside, &td).unwrap();
        empty_task_dir(&td).await.unwrap();
        assert!(std::fs::symlink_metadata(&td).unwrap().is_dir());
        assert!(outside.join("keep").exists());
        std::fs::remove_dir(&td).unwrap();
        std::fs::write(&td, "not a directory").unwrap();
        empty_task_dir(&td).await.unwrap();
        assert!(std::fs::symlink_metadata(&td).unwrap().is_dir());
    }
}
