//! Levels and merges: when a level is done, its merge into staging, quality gates, the
//! next level and the end of a rush; stop and retry.

use super::*;

impl Rush {
    /// Starts the level merge when every task of the current level is terminal.
    pub fn check_level_done(&mut self, now: Instant, wall: SystemTime, fx: &mut Effects) {
        if self.state() != RushState::Running || self.merging {
            return;
        }
        let level = self.doc.current_level;
        if self.level_tasks(level).next().is_none()
            || !self
                .level_tasks(level)
                .all(|t| Self::is_terminal_task(self.task_status(&t.id)))
        {
            return;
        }
        let any_complete = self
            .level_tasks(level)
            .any(|t| self.task_status(&t.id) == Some(TaskStatus::Complete));
        if !any_complete {
            // Nothing to merge: the level produced no commits.
            self.level_merged(level, None, now, wall, fx);
            return;
        }
        self.merging = true;
        let ls = self.doc.levels.entry(level.to_string()).or_default();
        ls.merge_status = MergeStatus::Merging;
        // A resolved conflict: the merge goes on from the resolution's commit with the heads
        // that were still to merge.
        let resolved = ls.resolution.as_ref().and_then(|r| {
            let commit = self.doc.tasks.get(&r.task_id)?.commit.clone()?;
            Some((commit, r.rest.clone()))
        });
        let heads = match &resolved {
            Some((_, rest)) => rest
                .iter()
                .map(|(w, h)| {
                    let wt = self
                        .doc
                        .workers
                        .get(&w.to_string())
                        .map(|ws| PathBuf::from(&ws.worktree_path))
                        .unwrap_or_default();
                    (*w, wt, h.clone())
                })
                .collect(),
            None => (0..self.doc.rush.workers)
                .filter_map(|w| {
                    let ws = self.doc.workers.get(&w.to_string())?;
                    (!ws.accepted_head.is_empty()).then(|| {
                        (
                            w,
                            PathBuf::from(&ws.worktree_path),
                            ws.accepted_head.clone(),
                        )
                    })
                })
                .collect(),
        };
        self.event(
            wall,
            Source::Orchestrator,
            Level::Info,
            "merge_started",
            format!(
                "Level {level} complete; merging worker branches into {}",
                staging_branch(self.feature())
            ),
            json!({"level": level}),
        );
        fx.merge = Some(MergeJob {
            level,
            heads,
            staging: self.paths.staging_worktree(),
            base: self.doc.rush.base_commit.clone(),
            identity: self.config.git.identity.clone(),
            log_dir: self.paths.log_dir.clone(),
            symbols: self.config.symbols.enabled.then(|| {
                (
                    self.symbols.clone().unwrap_or_default(),
                    self.config.symbols.clone(),
                )
            }),
            git: self.git(),
            gate_image: self.gate_image(),
            gate_sandbox: crate::sandbox::for_gates(
                &self.config,
                &self.paths.repo,
                &self.doc.feature,
            ),
            setup: (
                self.config.worktree.setup.clone(),
                self.config.worktree.setup_timeout_seconds,
            ),
            gates_stop: {
                self.gates_stop.send_replace(false);
                self.gates_stop.subscribe()
            },
            mark_conflicts: self.config.merge.resolve == crate::config::MergeResolve::Agent,
            resume_from: resolved.map(|(c, _)| c),
        });
    }

    /// What `zergctl land` needs of this rush (`gates_only`: check the staging head only).
    pub fn land_job(&self, gates_only: bool) -> crate::supervisor::land::LandJob {
        crate::supervisor::land::LandJob {
            repo: self.paths.repo.clone(),
            feature: self.doc.feature.clone(),
            base_branch: self.doc.rush.base_branch.clone(),
            base_commit: self.doc.rush.base_commit.clone(),
            scratch: self.paths.staging_worktree().with_file_name("land"),
            gates: self.config.quality_gates.clone(),
            worktree: self.config.worktree.clone(),
            readable_by: crate::supervisor::jobs::gate_reader(self.doc.rush.mode, &self.config),
            gate_image: self.gate_image(),
            gate_sandbox: crate::sandbox::for_gates(
                &self.config,
                &self.paths.repo,
                &self.doc.feature,
            ),
            log_dir: self.paths.log_dir.clone(),
            identity: self.config.git.identity.clone(),
            gates_only,
        }
    }

    /// The container a gate of this rush runs in, unless the gates run on the host (a
    /// subprocess rush, or `gates.run_on: host`).
    fn gate_image(&self) -> Option<zerg_launch::gate::GateContainer> {
        let mode = self.doc.rush.mode;
        if mode == Mode::Subprocess || self.config.gates.run_on == GatesRunOn::Host {
            return None;
        }
        let mut container = self.container_spec();
        // The network the rush's workers get: a swarm service with none gets the host's.
        let net = container.network.trim();
        if mode == Mode::Swarm && (net.is_empty() || net == "none") {
            container.network = "host".into();
        }
        let (uid, gid, _) = zerg_launch::container::container_identity();
        Some(zerg_launch::gate::GateContainer {
            container,
            user: format!("{uid}:{gid}"),
            staging: self.paths.staging_worktree(),
            rush_id: self.id().to_string(),
            name: String::new(),
            command: String::new(),
            timeout: std::time::Duration::ZERO,
        })
    }

    /// A merge job finished.
    pub fn on_merged(
        &mut self,
        level: u32,
        result: MergeResult,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) {
        self.merging = false;
        if self.state() != RushState::Running || level != self.doc.current_level {
            return;
        }
        match result {
            MergeResult::Merged(head) => self.level_merged(level, Some(head), now, wall, fx),
            MergeResult::Conflict {
                worker,
                files,
                marked: Some((base, rest)),
            } if self.resolvable(level, worker) => {
                self.open_resolution(level, worker, files, base, rest, wall);
                self.dispatch(now, wall, fx);
            }
            MergeResult::Conflict { worker, files, .. } => {
                let tasks: Vec<String> = self
                    .graph
                    .tasks
                    .iter()
                    .filter(|t| t.level == level)
                    .filter(|t| {
                        self.doc.tasks.get(&t.id).and_then(|x| x.worker_id) == Some(worker)
                            || t.files
                                .create
                                .iter()
                                .chain(&t.files.modify)
                                .any(|f| files.contains(f))
                    })
                    .map(|t| t.id.clone())
                    .collect();
                let reason = format!(
                    "merge conflict at level {level} merging worker {worker}: files {} (tasks {}). Resolve on {} and run `zergctl retry {}`",
                    files.join(", "),
                    tasks.join(", "),
                    staging_branch(self.feature()),
                    self.feature()
                );
                let ls = self.doc.levels.entry(level.to_string()).or_default();
                ls.merge_status = MergeStatus::Conflict;
                ls.conflicts = files.clone();
                ls.merge_details = Some(reason.clone());
                self.set_state(RushState::Paused, &reason);
                self.event(
                    wall,
                    Source::Orchestrator,
                    Level::Error,
                    "merge_conflict",
                    reason,
                    json!({"level": level, "files": files, "tasks": tasks}),
                );
            }
            MergeResult::GateFailed { gate, output } => {
                let reason = format!(
                    "quality gate '{gate}' failed on staging after level {level}: {output}. Fix it, then `zergctl retry {}`",
                    self.feature()
                );
                let ls = self.doc.levels.entry(level.to_string()).or_default();
                ls.merge_status = MergeStatus::Failed;
                ls.merge_details = Some(reason.clone());
                self.set_state(RushState::Paused, &reason);
                self.event(
                    wall,
                    Source::Orchestrator,
                    Level::Error,
                    "gate_failed",
                    reason,
                    json!({"level": level, "gate": gate}),
                );
            }
            MergeResult::Error(e) => {
                let reason = format!("merge of level {level} failed: {e}");
                let ls = self.doc.levels.entry(level.to_string()).or_default();
                ls.merge_status = MergeStatus::Failed;
                ls.merge_details = Some(reason.clone());
                self.set_state(RushState::Paused, &reason);
                self.event(
                    wall,
                    Source::Orchestrator,
                    Level::Error,
                    "merge_failed",
                    reason,
                    json!({"level": level}),
                );
            }
        }
        self.dispatch(now, wall, fx);
    }

    pub(super) fn level_merged(
        &mut self,
        level: u32,
        head: Option<String>,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) {
        let failed = self
            .graph
            .tasks
            .iter()
            .filter(|t| t.level == level)
            .any(|t| self.task_status(&t.id) != Some(TaskStatus::Complete));
        if let Some(h) = &head {
            self.doc.rush.staging_head = h.clone();
            for ws in self.doc.workers.values_mut() {
                ws.accepted_head = h.clone();
            }
        }
        let ls = self.doc.levels.entry(level.to_string()).or_default();
        ls.status = if failed {
            LevelStatus::Failed
        } else {
            LevelStatus::Complete
        };
        ls.merge_status = MergeStatus::Complete;
        ls.merge_commit = head.clone();
        ls.completed_at = Some(iso_millis(wall));
        ls.conflicts.clear();
        ls.merge_details = None;
        self.event(
            wall,
            Source::Orchestrator,
            Level::Info,
            "level_complete",
            format!(
                "Level {level} complete{}",
                head.as_deref()
                    .map(|h| format!(", staging at {}", &h[..h.len().min(10)]))
                    .unwrap_or_default()
            ),
            json!({"level": level, "merge_commit": head}),
        );
        // A thorough reconciliation before the level advances (FR-4).
        self.reconcile(true, wall);
        match self.first_open_level() {
            Some(next) => {
                self.start_level(next, wall);
                self.check_level_done(now, wall, fx);
                self.dispatch(now, wall, fx);
            }
            None => self.finish(now, wall, fx),
        }
    }

    /// Ends the rush: complete when every task completed, failed otherwise.
    pub(super) fn finish(&mut self, now: Instant, wall: SystemTime, fx: &mut Effects) {
        let total = self.doc.tasks.len();
        let done = self.doc.tasks_complete();
        self.doc.rush.finished_at = iso_millis(wall);
        self.doc.metrics = Some(json!({
            "computed_at": iso_millis(wall),
            "tasks_total": total,
            "tasks_completed": done,
            "tasks_failed": self.doc.tasks.values().filter(|t| t.status == TaskStatus::Failed).count(),
            "tasks_blocked": self.doc.tasks.values().filter(|t| t.status == TaskStatus::Blocked).count(),
            "levels_completed": self.doc.levels.values().filter(|l| l.status == LevelStatus::Complete).count(),
            "resilience": self.doc.rush.resilience,
        }));
        if done == total {
            self.set_state(RushState::Complete, "");
            self.event(
                wall,
                Source::Orchestrator,
                Level::Info,
                "rush_complete",
                format!(
                    "Rush complete: {done}/{total} tasks; result on {}",
                    staging_branch(self.feature())
                ),
                json!({"tasks": total}),
            );
            fx.cleanup = true;
        } else {
            let reason = self.failure_report();
            self.set_state(RushState::Failed, &reason);
            self.event(
                wall,
                Source::Orchestrator,
                Level::Error,
                "rush_failed",
                format!("Rush failed: {reason}"),
                json!({"completed": done, "total": total}),
            );
        }
        self.stop_all_workers(now, wall, fx, self.config.workers.stop_grace_seconds);
    }

    /// One-line summary of what failed.
    pub fn failure_report(&self) -> String {
        let failed: Vec<String> = self
            .doc
            .tasks
            .iter()
            .filter(|(_, t)| t.status == TaskStatus::Failed)
            .map(|(id, t)| format!("{id} ({})", t.error.clone().unwrap_or_default()))
            .collect();
        let blocked: Vec<&String> = self
            .doc
            .tasks
            .iter()
            .filter(|(_, t)| t.status == TaskStatus::Blocked)
            .map(|(id, _)| id)
            .collect();
        let mut s = format!("{} task(s) failed: {}", failed.len(), failed.join("; "));
        if !blocked.is_empty() {
            s.push_str(&format!(
                "; {} blocked: {}",
                blocked.len(),
                blocked
                    .iter()
                    .map(|s| s.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        s
    }

    pub(super) fn fail_rush(
        &mut self,
        reason: &str,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) {
        self.doc.rush.finished_at = iso_millis(wall);
        self.set_state(RushState::Failed, reason);
        self.event(
            wall,
            Source::Orchestrator,
            Level::Error,
            "rush_failed",
            format!("Rush failed: {reason}"),
            json!({"reason": reason}),
        );
        self.stop_all_workers(now, wall, fx, self.config.workers.stop_grace_seconds);
    }

    /// Replies Done to parked workers and stops them all: at once for `zergctl stop`, after a
    /// grace period to exit by themselves at the end of a rush.
    pub(super) fn stop_all_workers(
        &mut self,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
        grace: Duration,
    ) {
        let drain = self.state() != RushState::Stopped;
        self.dispatch(now, wall, fx);
        fx.sweep = Some(
            self.doc
                .workers
                .values()
                .map(|w| (w.worker_id, w.generation))
                .collect(),
        );
        let ids: Vec<u32> = self.rt_workers.keys().copied().collect();
        for w in ids {
            let rt = self.rt_workers.get_mut(&w).expect("key");
            rt.spawn_due = None;
            if let Some(sp) = rt.spawned.clone() {
                rt.stopping = true;
                if drain {
                    fx.drain.push((w, sp, grace));
                } else {
                    fx.stop.push((w, sp, grace));
                }
            }
            if matches!(
                self.worker_status(w),
                Some(WorkerStatus::Backoff | WorkerStatus::Starting)
            ) {
                self.set_worker_status(w, WorkerStatus::Exited, None);
            }
        }
    }

    /// Stops the rush and its workers (`zergctl stop`).
    pub fn stop(&mut self, force: bool, now: Instant, wall: SystemTime, fx: &mut Effects) -> u32 {
        let grace = if force {
            Duration::ZERO
        } else {
            self.config.workers.stop_grace_seconds
        };
        // A gate running in a container for this rush is killed and removed.
        self.gates_stop.send_replace(true);
        let in_progress: Vec<String> = self
            .doc
            .tasks
            .iter()
            .filter(|(_, t)| t.status == TaskStatus::InProgress)
            .map(|(id, _)| id.clone())
            .collect();
        for t in in_progress {
            self.requeue(&t, "rush stopped", wall);
        }
        self.doc.rush.finished_at = iso_millis(wall);
        self.set_state(
            RushState::Stopped,
            if force {
                "stopped by user (force)"
            } else {
                "stopped by user"
            },
        );
        self.event(
            wall,
            Source::Orchestrator,
            Level::Info,
            "rush_stopped",
            format!(
                "Rush stopped by user{}",
                if force { " (force)" } else { "" }
            ),
            json!({"force": force}),
        );
        let n = self.live_workers().len() as u32;
        for w in self.live_workers() {
            self.set_worker_status(w, WorkerStatus::Stopping, None);
        }
        self.stop_all_workers(now, wall, fx, grace);
        n
    }

    /// The state file could not be written (a full disk, an I/O error). The file keeps the
    /// previous state; the rush holds new work (paused, with the reason in status) until the
    /// user has fixed the cause and runs `zergctl retry`. Workers already running finish their
    /// tasks. The next change tries the save again, with a new temp file.
    pub fn storage_failed(&mut self, why: &str, wall: SystemTime) {
        self.dirty = true;
        if !matches!(self.state(), RushState::Running | RushState::Pending) {
            return;
        }
        let reason = format!(
            "cannot save the state file: {why}. New work is held; free space or fix the disk, then `zergctl retry {}`",
            self.feature()
        );
        self.set_state(RushState::Paused, &reason);
        self.event(
            wall,
            Source::Orchestrator,
            Level::Error,
            "state_write_failed",
            reason,
            json!({"error": why}),
        );
    }

    /// Requeues failed and blocked tasks (all, or the ones named) and resumes the rush.
    pub fn retry(
        &mut self,
        ids: &[String],
        reset: bool,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) -> Result<Vec<String>, SupervisorError> {
        self.unreachable_from.clear();
        for id in ids {
            if !self.doc.tasks.contains_key(id) {
                return Err(SupervisorError::not_found(format!(
                    "no task {id} in rush {}",
                    self.feature()
                )));
            }
        }
        let targets: Vec<String> = self
            .doc
            .tasks
            .iter()
            .filter(|(id, t)| {
                (ids.is_empty() || ids.contains(id))
                    && matches!(
                        t.status,
                        TaskStatus::Failed | TaskStatus::Blocked | TaskStatus::WaitingRetry
                    )
            })
            .map(|(id, _)| id.clone())
            .collect();
        // Blocked dependents of a retried task become runnable again too.
        let mut all: BTreeSet<String> = targets.iter().cloned().collect();
        for t in &targets {
            for d in self.graph.dependents_closure(t) {
                if self.task_status(&d) == Some(TaskStatus::Blocked) {
                    all.insert(d);
                }
            }
        }
        for t in &all {
            let ts = self.doc.tasks.get_mut(t).expect("exists");
            ts.status = TaskStatus::Pending;
            ts.blocked_by.clear();
            ts.error = None;
            ts.next_retry_at = None;
            if reset {
                ts.retry_count = 0;
                ts.crashes = 0;
            }
            self.rt_tasks.remove(t);
        }
        let paused_merge = self.state() == RushState::Paused;
        if all.is_empty()
            && !paused_merge
            && !matches!(self.state(), RushState::Failed | RushState::Stopped)
        {
            return Ok(vec![]);
        }
        self.event(
            wall,
            Source::Orchestrator,
            Level::Info,
            "task_retry",
            format!("Retry requested: {} task(s) requeued", all.len()),
            json!({"tasks": all, "reset": reset}),
        );
        // Levels from the lowest requeued one on are open again.
        if let Some(min) = all.iter().map(|t| self.task_level(t)).min() {
            for (l, ls) in self.doc.levels.iter_mut() {
                if l.parse::<u32>().unwrap_or(0) >= min {
                    ls.status = LevelStatus::Pending;
                }
            }
        }
        let was_running = self.state() == RushState::Running;
        if was_running {
            if let Some(l) = self.first_open_level()
                && l < self.doc.current_level
            {
                self.start_level(l, wall);
            }
            // Slots that gave up (or were blocked) get a fresh start: the user fixed the cause.
            for w in 0..self.doc.rush.workers {
                let dead = matches!(
                    self.worker_status(w),
                    Some(
                        WorkerStatus::GaveUp
                            | WorkerStatus::Blocked
                            | WorkerStatus::Exited
                            | WorkerStatus::Done
                    )
                );
                let live = self.rt_workers.get(&w).is_some_and(|r| r.spawned.is_some());
                if dead && !live {
                    if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
                        ws.spawn_failures = 0;
                        ws.respawn_times_ms.clear();
                        ws.reason = None;
                    }
                    self.spawn_slot(w, now, fx);
                }
            }
            self.dispatch(now, wall, fx);
        } else {
            for ws in self.doc.workers.values_mut() {
                ws.spawn_failures = 0;
                ws.respawn_times_ms.clear();
            }
            self.start(now, wall, fx);
            self.check_level_done(now, wall, fx);
        }
        Ok(all.into_iter().collect())
    }
}
