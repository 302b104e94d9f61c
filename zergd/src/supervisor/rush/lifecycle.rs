//! Starting a rush, spawning workers, and what happens when a worker exits: respawns, spawn
//! failures and the end of the worker pool.

use super::*;

impl Rush {
    /// Says once what confines the workers (`sandbox`), and warns when nothing does.
    pub(super) fn sandbox_event(&mut self, wall: SystemTime) {
        if self.doc.rush.mode != Mode::Subprocess {
            return;
        }
        let line = self.sandbox.summary();
        let level = if self.sandbox.confined() {
            Level::Info
        } else {
            Level::Warn
        };
        self.event(
            wall,
            Source::Orchestrator,
            level,
            "sandbox",
            format!("Sandbox {line}"),
            json!({"confined": self.sandbox.confined(), "mode": self.config.sandbox.mode.as_str(), "summary": line}),
        );
    }

    /// Starts (or resumes) execution once the worktrees exist.
    pub fn start(&mut self, now: Instant, wall: SystemTime, fx: &mut Effects) {
        self.set_state(RushState::Running, "");
        self.doc.rush.finished_at.clear();
        if self.doc.started_at.is_empty() {
            self.doc.started_at = iso_millis(wall);
        }
        self.doc.rush.rate_limited_until_ms = 0;
        self.doc.rush.rate_limit_type.clear();
        let level = self.first_open_level();
        self.event(
            wall,
            Source::Orchestrator,
            Level::Info,
            "rush_started",
            format!(
                "Rush {} started: {} tasks, {} levels, {} workers ({})",
                self.feature(),
                self.graph.tasks.len(),
                self.graph.max_level(),
                self.doc.rush.workers,
                self.doc.rush.mode
            ),
            json!({"workers": self.doc.rush.workers, "total_tasks": self.graph.tasks.len()}),
        );
        self.sandbox_event(wall);
        self.next_reconcile = now + self.reconcile_interval();
        match level {
            Some(l) => self.start_level(l, wall),
            None => {
                self.finish(now, wall, fx);
                return;
            }
        }
        for w in 0..self.doc.rush.workers {
            let live = self.rt_workers.get(&w).is_some_and(|r| r.spawned.is_some());
            if !live {
                if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
                    ws.spawn_failures = 0;
                    ws.respawn_times_ms.clear();
                }
                self.spawn_slot(w, now, fx);
            }
        }
        // A resumed level whose tasks are all done but whose merge did not complete merges now.
        self.check_level_done(now, wall, fx);
        self.dispatch(now, wall, fx);
    }

    pub(super) fn reconcile_interval(&self) -> Duration {
        let base = self.config.workers.reconcile_interval_seconds;
        // Jitter so that several rushes do not reconcile in lockstep.
        base.mul_f64(0.9 + 0.2 * fastrand::f64())
    }

    /// The first level that still has work: an unfinished task, or a merge that has not
    /// completed (a level whose tasks are all done but whose merge conflicted is still open).
    pub(super) fn first_open_level(&self) -> Option<u32> {
        self.level_numbers().find(|l| {
            self.level_tasks(*l)
                .any(|t| !Self::is_terminal_task(self.task_status(&t.id)))
                || self
                    .doc
                    .levels
                    .get(&l.to_string())
                    .is_none_or(|ls| ls.merge_status != MergeStatus::Complete)
        })
    }

    pub(super) fn start_level(&mut self, level: u32, wall: SystemTime) {
        self.doc.current_level = level;
        let ls = self.doc.levels.entry(level.to_string()).or_default();
        if ls.status != LevelStatus::Running {
            ls.status = LevelStatus::Running;
            ls.started_at = Some(iso_millis(wall));
            if ls.merge_status == MergeStatus::Pending
                || ls.merge_status == MergeStatus::Conflict
                || ls.merge_status == MergeStatus::Failed
            {
                ls.merge_status = MergeStatus::Pending;
            }
            let n = self.level_tasks(level).count();
            self.event(
                wall,
                Source::Orchestrator,
                Level::Info,
                "level_started",
                format!("Level {level} started with {n} tasks"),
                json!({"level": level, "tasks": n}),
            );
        }
        self.dirty = true;
    }

    /// Starts a new process in a worker slot.
    pub fn spawn_slot(&mut self, w: u32, now: Instant, fx: &mut Effects) {
        let key = w.to_string();
        let feature = self.feature().to_string();
        let wt = self.paths.worker_worktree(w);
        let ws = self.doc.workers.entry(key).or_default();
        ws.worker_id = w;
        ws.generation += 1;
        ws.status = WorkerStatus::Starting;
        ws.branch = worker_branch(&feature, w);
        ws.worktree_path = wt.to_string_lossy().to_string();
        ws.current_task = None;
        ws.pid = None;
        ws.container_id = None;
        let token = WorkerToken::generate();
        ws.token_sha256 = token.hash();
        let generation = ws.generation;
        let rt = self.rt_workers.entry(w).or_default();
        rt.token = Some(token);
        rt.spawn_due = None;
        rt.spawned = None;
        rt.registered = false;
        rt.stopping = false;
        rt.reconnect_by = None;
        rt.spawned_at = Some(now);
        self.dirty = true;
        fx.spawn.push((w, generation));
    }

    /// A spawn finished (successfully or not).
    pub fn on_spawned(
        &mut self,
        w: u32,
        generation: u64,
        result: Result<Spawned, SpawnError>,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) {
        let current = self.doc.workers.get(&w.to_string()).map(|x| x.generation);
        if current != Some(generation) {
            // A spawn for a superseded generation: make sure it does not linger.
            if let Ok(sp) = result {
                fx.stop.push((w, sp, Duration::ZERO));
            }
            return;
        }
        match result {
            Ok(sp) => {
                // A worker that died at once may report its exit before its spawn: that exit
                // was already handled, and the handle is of a dead process.
                if self
                    .rt_workers
                    .get(&w)
                    .is_some_and(|rt| rt.handled_gen >= generation)
                {
                    return;
                }
                if self.is_terminal() || self.worker_status(w) == Some(WorkerStatus::Stopping) {
                    fx.stop.push((w, sp, Duration::ZERO));
                    return;
                }
                let ws = self
                    .doc
                    .workers
                    .get_mut(&w.to_string())
                    .expect("slot exists");
                ws.pid = sp.pid;
                ws.pid_start_time = sp.start_time;
                ws.container_id = sp.container_id.clone();
                ws.started_at = Some(iso_millis(wall));
                let rt = self.rt_workers.entry(w).or_default();
                rt.spawned = Some(sp.clone());
                rt.spawned_at = Some(now);
                let respawn = std::mem::take(&mut rt.respawning);
                let what = if respawn { "respawned" } else { "spawned" };
                self.event(
                    wall,
                    Source::Worker(w),
                    Level::Info,
                    if respawn { "worker_respawn" } else { "worker_spawn" },
                    format!(
                        "Worker {w} {what} (generation {generation}, {})",
                        sp.container_id
                            .as_deref()
                            .map(|c| format!("container {}", &c[..c.len().min(12)]))
                            .or(sp.pid.map(|p| format!("pid {p}")))
                            .unwrap_or_default()
                    ),
                    json!({"worker_id": w, "generation": generation, "pid": sp.pid, "container_id": sp.container_id}),
                );
            }
            Err(e) => self.spawn_failed(w, &e.message, now, wall, fx),
        }
    }

    /// A spawn attempt failed: retry with backoff (FR-1) or give the slot up.
    pub(super) fn spawn_failed(
        &mut self,
        w: u32,
        reason: &str,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) {
        let retries = self.config.workers.spawn_retry_attempts;
        let resilient = self.resilient();
        let ws = self
            .doc
            .workers
            .get_mut(&w.to_string())
            .expect("slot exists");
        ws.spawn_failures += 1;
        let attempt = ws.spawn_failures;
        if resilient && attempt <= retries && !self.is_terminal() {
            let delay = self.spawn_backoff().jittered(attempt);
            self.doc.rush.resilience.spawn_retries += 1;
            self.set_worker_status(
                w,
                WorkerStatus::Backoff,
                Some(format!("spawn attempt {attempt} failed: {reason}")),
            );
            let rt = self.rt_workers.entry(w).or_default();
            rt.spawn_due = Some(now + delay);
            rt.spawned = None;
            self.event(
                wall,
                Source::Worker(w),
                Level::Warn,
                "worker_spawn_retry",
                format!(
                    "Worker {w} spawn attempt {attempt} of {} failed: {reason}; retrying in {:.1}s (reason: transient spawn failures are retried with exponential backoff)",
                    retries + 1,
                    delay.as_secs_f64()
                ),
                json!({"worker_id": w, "attempt": attempt, "reason": reason, "backoff_seconds": delay.as_secs_f64()}),
            );
        } else {
            let why = format!(
                "spawn failed {attempt} times, last error: {reason}. Fix the cause, then run `zergctl retry {}`",
                self.feature()
            );
            self.set_worker_status(w, WorkerStatus::GaveUp, Some(why.clone()));
            if let Some(rt) = self.rt_workers.get_mut(&w) {
                rt.spawned = None;
            }
            self.event(
                wall,
                Source::Worker(w),
                Level::Error,
                "worker_spawn_failed",
                format!("Worker {w} gave up: {why}"),
                json!({"worker_id": w, "attempts": attempt, "reason": reason}),
            );
            self.check_workers_exhausted(now, wall, fx);
        }
        self.dispatch(now, wall, fx);
    }

    /// A worker process or container ended.
    pub fn on_exit(
        &mut self,
        w: u32,
        generation: u64,
        info: ExitInfo,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) {
        let Some(ws) = self.doc.workers.get(&w.to_string()) else {
            return;
        };
        if ws.generation != generation {
            return;
        }
        let task = ws.current_task.clone();
        let rt = self.rt_workers.entry(w).or_default();
        if rt.handled_gen >= generation {
            return;
        }
        rt.handled_gen = generation;
        let registered = rt.registered;
        let expected = rt.stopping;
        rt.spawned = None;
        rt.registered = false;
        rt.reconnect_by = None;
        if let Some(tx) = rt.parked.take() {
            drop(tx);
        }
        let desc = info.describe();
        if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
            ws.last_exit = Some(desc.clone());
            ws.current_task = None;
        }
        let code = info.code();
        let exit = code.and_then(WorkerExit::from_code);

        // The task the worker held goes back to the queue (FR-5).
        let mid_task = task
            .as_deref()
            .is_some_and(|t| self.task_status(t) == Some(TaskStatus::InProgress));
        if let Some(t) = task.filter(|_| mid_task) {
            if exit == Some(WorkerExit::Checkpoint) {
                self.requeue(&t, "checkpoint", wall);
            } else if !expected {
                self.crash_task(&t, w, &format!("worker exited: {desc}"), wall);
            } else {
                self.requeue(&t, "worker stopped", wall);
            }
        }

        if self.is_terminal() {
            let status = if exit == Some(WorkerExit::Success) {
                WorkerStatus::Done
            } else {
                WorkerStatus::Exited
            };
            self.set_worker_status(w, status, None);
            self.event(
                wall,
                Source::Worker(w),
                Level::Info,
                "worker_exit",
                format!("Worker {w} exited: {desc}"),
                json!({"worker_id": w, "exit": desc}),
            );
            return;
        }

        let (level, kind, msg) = match (exit, registered) {
            (Some(WorkerExit::Success), _) => (
                Level::Info,
                "worker_exit",
                format!(
                    "Worker {w} exited: {desc}{}",
                    if self.has_open_work() {
                        ""
                    } else {
                        ", no work left"
                    }
                ),
            ),
            (Some(WorkerExit::Checkpoint), _) => (
                Level::Info,
                "worker_exit",
                format!("Worker {w} exited: {desc}; task requeued to resume from its checkpoint"),
            ),
            (Some(WorkerExit::Blocked), _) => (
                Level::Error,
                "worker_exit",
                format!("Worker {w} exited: {desc}"),
            ),
            (Some(WorkerExit::Escalation), _) => (
                Level::Warn,
                "worker_exit",
                format!("Worker {w} exited: {desc}; see escalations in status"),
            ),
            (_, false) => (
                Level::Error,
                "worker_crash",
                format!("Worker {w} exited before it registered: {desc}"),
            ),
            _ if expected => (
                Level::Info,
                "worker_exit",
                format!("Worker {w} stopped: {desc}"),
            ),
            _ => (
                Level::Error,
                "worker_crash",
                format!("Worker {w} crashed: {desc}"),
            ),
        };
        self.event(
            wall,
            Source::Worker(w),
            level,
            kind,
            msg,
            json!({"worker_id": w, "exit": desc, "code": code}),
        );

        // Checkpoints and escalations end a worker on purpose: not crashes. An escalation ends
        // its task for good; a checkpoint hands its task on, so a slot that checkpoints over
        // and over backs off and hits the respawn cap like a crash loop.
        let deliberate = matches!(exit, Some(WorkerExit::Checkpoint | WorkerExit::Escalation));
        let checkpoint = exit == Some(WorkerExit::Checkpoint);
        match exit {
            Some(WorkerExit::Success) if !self.has_open_work() => {
                self.set_worker_status(w, WorkerStatus::Done, Some("no work left".into()));
            }
            Some(WorkerExit::Success) => {
                // An agent that exits 0 while work remains (for example a late `Done` from an
                // earlier run) is replaced, without counting it as a crash.
                self.respawn(
                    w,
                    Cause {
                        counted: false,
                        mid_task: false,
                    },
                    &desc,
                    now,
                    wall,
                    fx,
                );
            }
            Some(WorkerExit::Blocked) => {
                let reason = self
                    .doc
                    .workers
                    .get(&w.to_string())
                    .and_then(|x| x.reason.clone())
                    .unwrap_or_else(|| "the worker reported it cannot run tasks".into());
                self.set_worker_status(w, WorkerStatus::Blocked, Some(reason));
                self.check_workers_exhausted(now, wall, fx);
            }
            _ if !registered && !expected && !deliberate => {
                // Died before registering: that is a failed spawn (FR-1).
                self.spawn_failed(
                    w,
                    &format!(
                        "worker exited before it registered ({desc}); see .zerg/logs/worker-{w}.log"
                    ),
                    now,
                    wall,
                    fx,
                );
            }
            _ => {
                // Escalations and supervisor-initiated stops do not count against the respawn
                // cap; crashes and checkpoints do.
                let counted = !expected && (!deliberate || checkpoint);
                self.respawn(w, Cause { counted, mid_task }, &desc, now, wall, fx);
            }
        }
        self.dispatch(now, wall, fx);
    }

    /// Keeps the worker count at target (FR-6), within the respawn cap.
    ///
    /// `cause.counted` exits count against the cap.
    ///
    /// A worker that died holding a task is respawned at once, however often: it had started
    /// and registered, so the slot is not what fails, and a task that kills every worker it
    /// lands on is failed by its own crash count. Other repeated exits back off.
    pub(super) fn respawn(
        &mut self,
        w: u32,
        Cause { counted, mid_task }: Cause,
        why: &str,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) {
        if !self.has_open_work() {
            self.set_worker_status(w, WorkerStatus::Done, Some("no work left".into()));
            return;
        }
        if !self.resilient() || !self.config.workers.auto_respawn {
            self.set_worker_status(
                w,
                WorkerStatus::Exited,
                Some(format!("exited ({why}); auto_respawn is off")),
            );
            self.check_workers_exhausted(now, wall, fx);
            return;
        }
        let window_ms = i64::try_from(self.config.workers.respawn_window_seconds.as_millis())
            .unwrap_or(i64::MAX);
        let cap = self.config.workers.max_respawn_attempts;
        let now_ms = unix_millis(wall);
        let ws = self
            .doc
            .workers
            .get_mut(&w.to_string())
            .expect("slot exists");
        ws.respawn_times_ms.retain(|t| now_ms - *t < window_ms);
        if counted && ws.respawn_times_ms.len() as u32 >= cap {
            let reason = format!(
                "respawned {} times within {}s and exited again ({why}); giving up to avoid a crash loop. See .zerg/logs/worker-{w}.log, then `zergctl retry {}`",
                ws.respawn_times_ms.len(),
                self.config.workers.respawn_window_seconds.as_secs_f64(),
                self.doc.feature
            );
            self.set_worker_status(w, WorkerStatus::GaveUp, Some(reason.clone()));
            self.event(
                wall,
                Source::Worker(w),
                Level::Error,
                "worker_gave_up",
                format!("Worker {w} gave up: {reason}"),
                json!({"worker_id": w}),
            );
            self.check_workers_exhausted(now, wall, fx);
            return;
        }
        if counted {
            ws.respawn_times_ms.push(now_ms);
        }
        ws.respawns += 1;
        ws.spawn_failures = 0;
        let n = ws.respawn_times_ms.len() as u32;
        self.doc.rush.resilience.worker_respawns += 1;
        // First respawn at once, later ones with the spawn backoff (like a crash-loop backoff).
        let delay = if n <= 1 || mid_task {
            Duration::ZERO
        } else {
            self.spawn_backoff().jittered(n - 1)
        };
        let rt = self.rt_workers.entry(w).or_default();
        rt.respawning = true;
        if delay.is_zero() {
            self.spawn_slot(w, now, fx);
        } else {
            rt.spawn_due = Some(now + delay);
            self.set_worker_status(
                w,
                WorkerStatus::Backoff,
                Some(format!(
                    "respawn in {:.1}s after {why}",
                    delay.as_secs_f64()
                )),
            );
        }
    }

    /// Fails the rush if no worker slot can ever run the remaining work.
    pub(super) fn check_workers_exhausted(
        &mut self,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) {
        if self.is_terminal() || !self.has_open_work() {
            return;
        }
        let all_gone = (0..self.doc.rush.workers).all(|w| {
            matches!(
                self.worker_status(w),
                Some(
                    WorkerStatus::GaveUp
                        | WorkerStatus::Blocked
                        | WorkerStatus::Exited
                        | WorkerStatus::Done
                )
            )
        });
        if !all_gone {
            return;
        }
        let reasons: BTreeSet<String> = self
            .doc
            .workers
            .values()
            .filter_map(|w| w.reason.clone())
            .collect();
        let reason = format!(
            "no worker can run the remaining tasks: {}",
            reasons.into_iter().collect::<Vec<_>>().join("; ")
        );
        self.fail_rush(&reason, now, wall, fx);
    }

    pub(super) fn has_open_work(&self) -> bool {
        self.doc.tasks.values().any(|t| !t.status.is_terminal())
    }
}

/// What ended the worker that is being respawned.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cause {
    /// The exit counts against the respawn cap (a crash, not a stop zergd asked for).
    pub counted: bool,
    /// The worker held a task when it died.
    pub mid_task: bool,
}
