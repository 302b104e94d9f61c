//! What workers ask and report: registration, leases, heartbeats, completions, failures,
//! escalations, and the checks of who is calling and which lease they hold.

use super::*;
use crate::calls::EgressReport;

/// Unresolved escalations kept per task, and per rush.
const MAX_ESCALATIONS_PER_TASK: usize = 10;
const MAX_ESCALATIONS: usize = 1000;

/// The longest a usage limit a worker reports may hold new work: 6 hours (Claude's limits
/// reset within 5).
const MAX_RATE_LIMIT_PAUSE_MS: i64 = 6 * 3600 * 1000;

impl Rush {
    /// Any RPC from a worker proves it is alive; after a zergd restart it also ends the
    /// worker's reconnect grace period.
    pub(super) fn touch(&mut self, w: u32, now: Instant, wall: SystemTime) {
        let rt = self.rt_workers.entry(w).or_default();
        rt.registered = true;
        rt.last_hb = Some(now);
        if rt.reconnect_by.take().is_some() {
            self.event(
                wall,
                Source::Worker(w),
                Level::Info,
                "worker_ready",
                format!("Worker {w} reconnected after zergd restart"),
                json!({"worker_id": w}),
            );
        }
    }

    pub(super) fn check_generation(&self, r: &Caller) -> Result<(), SupervisorError> {
        match self.doc.workers.get(&r.worker.to_string()) {
            Some(ws) if ws.generation == r.generation => Ok(()),
            Some(ws) => Err(SupervisorError::revoked(
                Revocation::Superseded,
                SupervisorError::failed_precondition(format!(
                    "worker {} generation {} was superseded by generation {}",
                    r.worker, r.generation, ws.generation
                )),
            )),
            None => Err(SupervisorError::not_found(format!(
                "no worker slot {}",
                r.worker
            ))),
        }
    }

    /// Checks that a worker-plane call comes from the worker it names: on this rush's socket,
    /// with the token of that slot's current generation. Runs before anything else looks at the
    /// request.
    pub fn authorize(&self, auth: &WorkerAuth, r: &Caller) -> Result<(), SupervisorError> {
        if auth.rush_id != r.rush_id {
            return Err(SupervisorError::permission_denied(format!(
                "this worker socket serves rush {}, not {:?}",
                auth.rush_id,
                r.rush_id.chars().take(80).collect::<String>()
            )));
        }
        let Some(hash) = auth.token_sha256.as_deref() else {
            return Err(SupervisorError::unauthenticated(
                "worker RPCs must carry the worker's token (authorization: Bearer <ZERG_WORKER_TOKEN>)",
            ));
        };
        self.check_generation(r)?;
        let ws =
            self.doc.workers.get(&r.worker.to_string()).ok_or_else(|| {
                SupervisorError::not_found(format!("no worker slot {}", r.worker))
            })?;
        if ws.token_sha256.is_empty() || ws.token_sha256 != hash {
            return Err(SupervisorError::permission_denied(format!(
                "the token does not belong to worker {} generation {}",
                r.worker, r.generation
            )));
        }
        Ok(())
    }

    /// A worker announced itself.
    pub fn on_register(
        &mut self,
        req: Register,
        now: Instant,
        wall: SystemTime,
    ) -> Result<Registration, SupervisorError> {
        let r = &req.caller;
        self.check_generation(r)?;
        if self.is_terminal() {
            return Err(SupervisorError::failed_precondition(format!(
                "rush is {}",
                self.state()
            )));
        }
        let w = r.worker;
        // A pid from inside a container (or a sandbox's pid namespace) means nothing on the
        // host: never signal it.
        let host_pid = self.doc.rush.mode == Mode::Subprocess && !self.confined();
        let rt = self.rt_workers.entry(w).or_default();
        let reconnect = rt.reconnect_by.take().is_some();
        rt.registered = true;
        rt.last_hb = Some(now);
        if rt.spawned.is_none() && host_pid {
            rt.spawned = Some(Spawned {
                pid: Some(req.pid),
                start_time: crate::launcher::subprocess::proc_start_time(req.pid),
                container_id: None,
            });
        }
        let held = req.held.map(|h| (h.task_id, h.lease_id)).filter(|(t, l)| {
            self.doc.tasks.get(t).and_then(|x| x.lease_id.as_deref()) == Some(l.as_str())
        });
        let ws = self.doc.workers.get_mut(&w.to_string()).expect("checked");
        ws.ready_at = Some(iso_millis(wall));
        ws.health_check_at = Some(iso_millis(wall));
        ws.spawn_failures = 0;
        ws.reason = None;
        if let Some((t, _)) = &held {
            ws.status = WorkerStatus::Running;
            ws.current_task = Some(t.clone());
            self.rt_tasks
                .entry(t.clone())
                .and_modify(|x| x.last_progress = now);
        } else {
            ws.status = WorkerStatus::Ready;
        }
        let msg = if reconnect {
            format!("Worker {w} reconnected after zergd restart")
        } else {
            format!("Worker {w} ready")
        };
        self.event(
            wall,
            Source::Worker(w),
            Level::Info,
            "worker_ready",
            msg,
            json!({"worker_id": w, "pid": req.pid}),
        );
        Ok(self.register_reply())
    }

    pub(super) fn register_reply(&self) -> Registration {
        let vt = &self.config.verification_tiers;
        let tier = |tier, name, command: &Option<String>, blocking| TierSpec {
            tier,
            name,
            command: command.clone(),
            blocking,
            timeout: vt.timeout_seconds,
        };
        let mut agent_command = self.config.agent.effective_command();
        if let Some(cap) = self.config.budget.task_max_usd
            && self.config.agent.profile == crate::config::AgentProfile::Claude
        {
            agent_command.extend(["--max-budget-usd".to_string(), cap.to_string()]);
        }
        Registration {
            agent_command,
            agent_profile: self.config.agent.profile,
            agent_timeout: self.config.agent.timeout_seconds,
            heartbeat_interval: self.config.workers.heartbeat_interval_seconds,
            tiers: vec![
                tier(1, "syntax", &vt.tier1_command, vt.tier1_blocking),
                tier(2, "correctness", &vt.tier2_command, vt.tier2_blocking),
                tier(3, "quality", &vt.tier3_command, vt.tier3_blocking),
            ],
            spec_context: self.spec_context.clone(),
            feature: self.feature().to_string(),
            tasks_total: self.graph.tasks.len() as u32,
            setup: crate::calls::SetupSpec {
                commands: self.config.worktree.setup.clone(),
                when_changed: self.config.worktree.setup_when_changed.clone(),
                timeout: self.config.worktree.setup_timeout_seconds,
            },
        }
    }

    /// A worker asks for its next task; the reply may be deferred until one is ready.
    pub fn on_lease(
        &mut self,
        r: &Caller,
        tx: LeaseReplyTx,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) {
        if let Err(e) = self.check_generation(r) {
            let _ = tx.send(Err(e));
            return;
        }
        let w = r.worker;
        // Asking for a new lease while holding one means the old one was abandoned (for
        // example the reply was lost): put it back so it is not stuck in progress.
        let held = self
            .doc
            .workers
            .get(&w.to_string())
            .and_then(|x| x.current_task.clone());
        if let Some(t) = held.filter(|t| self.task_status(t) == Some(TaskStatus::InProgress)) {
            self.requeue(&t, "lease abandoned by its worker", wall);
        }
        if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
            ws.current_task = None;
            if ws.status == WorkerStatus::Running || ws.status == WorkerStatus::Starting {
                ws.status = WorkerStatus::Ready;
            }
        }
        self.touch(w, now, wall);
        self.rt_workers.entry(w).or_default().parked = Some(tx);
        self.dispatch(now, wall, fx);
    }

    /// Hands ready tasks to parked workers, or tells them to exit when nothing is left.
    pub fn dispatch(&mut self, now: Instant, wall: SystemTime, fx: &mut Effects) {
        if self.is_terminal() {
            for (_, rt) in self.rt_workers.iter_mut() {
                if let Some(tx) = rt.parked.take() {
                    let reply = LeaseOutcome::Done {
                        reason: format!("rush {}", self.doc.rush.state),
                    };
                    fx.reply(tx, Ok(reply));
                }
            }
            return;
        }
        if self.state() != RushState::Running || self.merging || self.rate_limited(wall) {
            return;
        }
        if self.budget_reached(wall) {
            return;
        }
        if self.wait_for_symbols(fx) {
            return;
        }
        let parked: Vec<u32> = self
            .rt_workers
            .iter()
            .filter(|(w, rt)| {
                rt.parked.is_some() && self.worker_status(**w) == Some(WorkerStatus::Ready)
            })
            .map(|(w, _)| *w)
            .collect();
        if parked.is_empty() {
            return;
        }
        let mut ready = self.ready_tasks().into_iter();
        for w in parked {
            let Some(task_id) = ready.next() else { break };
            let tx = self
                .rt_workers
                .get_mut(&w)
                .and_then(|r| r.parked.take())
                .expect("parked");
            let task = self.lease(&task_id, w, now, wall);
            fx.reply(tx, Ok(LeaseOutcome::Task(Box::new(task))));
        }
    }

    /// The agent's cost so far (USD), over every task and attempt.
    pub fn cost_usd(&self) -> f64 {
        self.doc.tasks.values().map(|t| t.cost_usd).sum()
    }

    /// Whether the rush's cost reached its budget; pauses it (reason `budget`) when it did.
    /// Running tasks finish; their cost still counts.
    fn budget_reached(&mut self, wall: SystemTime) -> bool {
        let Some(max) = self.doc.rush.max_usd else {
            return false;
        };
        let cost = self.cost_usd();
        if cost < max {
            return false;
        }
        let reason = format!(
            "budget: the agent's reported cost ${cost:.2} reached the rush's budget of ${max:.2}. Raise it with `zergctl retry {} --max-usd N`",
            self.feature()
        );
        self.set_state(RushState::Paused, &reason);
        self.event(
            wall,
            Source::Orchestrator,
            Level::Warn,
            "budget_reached",
            format!("Rush paused: {reason}"),
            json!({"cost_usd": cost, "max_usd": max}),
        );
        true
    }

    pub(super) fn rate_limited(&self, wall: SystemTime) -> bool {
        self.doc.rush.rate_limited_until_ms > unix_millis(wall)
    }

    /// Pending tasks of the current level whose dependencies are complete, the longest
    /// critical chain first (ties in graph order): the task with the most work waiting behind
    /// it starts first. The chains come from the graph alone, so a restarted zergd keeps the
    /// order.
    pub fn ready_tasks(&self) -> Vec<String> {
        let level = self.doc.current_level;
        let mut ready: Vec<(f64, String)> = self
            .level_tasks(level)
            .filter(|t| self.task_status(&t.id) == Some(TaskStatus::Pending))
            .filter(|t| {
                t.dependencies
                    .iter()
                    .all(|d| self.task_status(d) == Some(TaskStatus::Complete))
            })
            .map(|t| (self.critical_chain(&t.id), t.id.clone()))
            .collect();
        ready.sort_by(|a, b| b.0.total_cmp(&a.0));
        ready.into_iter().map(|(_, id)| id).collect()
    }

    pub(super) fn lease(
        &mut self,
        task_id: &str,
        w: u32,
        now: Instant,
        wall: SystemTime,
    ) -> Assignment {
        let staging = self.doc.rush.staging_head.clone();
        // A resolution task starts from its conflicted merge; any other from the worker's own
        // last accepted commit.
        let base = self.resolution_base(task_id).unwrap_or_else(|| {
            self.doc
                .workers
                .get(&w.to_string())
                .map(|x| x.accepted_head.clone())
                .filter(|h| !h.is_empty())
                .unwrap_or(staging)
        });
        let ts = self.doc.tasks.get_mut(task_id).expect("task exists");
        ts.leases += 1;
        let lease_id = format!("{task_id}#{}", ts.leases);
        ts.status = TaskStatus::InProgress;
        ts.worker_id = Some(w);
        ts.lease_id = Some(lease_id.clone());
        ts.claimed_at = Some(iso_millis(wall));
        ts.started_at = Some(iso_millis(wall));
        ts.updated_at = iso_millis(wall);
        ts.next_retry_at = None;
        ts.base_commit = Some(base.clone());
        let attempt = ts.retry_count + 1;
        let resume_from = ts.resume_from.clone();
        let previous_attempt = ts.previous_attempt.clone().unwrap_or_default();
        let notes = ts.notes.iter().map(|n| n.text.clone()).collect();
        // The model of this attempt (`agent.models`), recorded with the attempt.
        let model = self.config.agent.model_for(attempt).map(str::to_string);
        let agent_args = model
            .as_deref()
            .map(|m| self.config.agent.model_args(m))
            .unwrap_or_default();
        if let Some(m) = &model {
            crate::metrics::METRICS.attempt_on(m);
        }
        if let Some(ts) = self.doc.tasks.get_mut(task_id) {
            let n = attempt.saturating_sub(1) as usize;
            ts.attempt_models.truncate(n);
            ts.attempt_models.resize(n, String::new());
            ts.attempt_models.push(model.unwrap_or_default());
            if ts.attempt_models.iter().all(String::is_empty) {
                ts.attempt_models.clear();
            }
        }
        self.rt_tasks.insert(
            task_id.to_string(),
            TaskRt {
                last_progress: now,
                last_output_ms: 0,
                last_step: None,
                retry_due: None,
            },
        );
        if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
            ws.status = WorkerStatus::Running;
            ws.current_task = Some(task_id.to_string());
            ws.step = Some(Step::Initializing);
            ws.progress_pct = 0;
        }
        self.event(
            wall,
            Source::Worker(w),
            Level::Info,
            "task_claimed",
            format!("Worker {w} claimed task {task_id}"),
            json!({"task_id": task_id, "worker_id": w, "lease_id": lease_id, "attempt": attempt}),
        );
        let t = self.graph_task(task_id).expect("task in graph");
        let relevant_symbols = self.relevant_symbols(&t.files);
        Assignment {
            lease_id,
            task_id: t.id.clone(),
            title: t.title.clone(),
            description: t.description.clone(),
            level: t.level,
            files: t.files.clone(),
            verification: t
                .verification
                .as_ref()
                .map(|v| (v.command.clone(), Duration::from_secs(v.timeout_seconds))),
            context: t.context.clone(),
            base_commit: base,
            resume_from,
            attempt,
            acceptance_criteria: t.acceptance_criteria.clone(),
            relevant_symbols,
            previous_attempt,
            agent_args,
            notes,
        }
    }

    /// Checks that a report comes from the task's current lease (the fencing token).
    pub(super) fn check_lease(&self, r: &Caller, lease: &LeaseRef) -> Result<(), SupervisorError> {
        self.check_generation(r)?;
        let (task_id, lease_id) = (lease.task_id.as_str(), lease.lease_id.as_str());
        let revoked = Revocation::Lease(lease_id.to_string());
        let ts = self.doc.tasks.get(task_id).ok_or_else(|| {
            SupervisorError::revoked(
                revoked.clone(),
                SupervisorError::not_found(format!(
                    "no task {:?}",
                    task_id.chars().take(80).collect::<String>()
                )),
            )
        })?;
        if ts.lease_id.as_deref() != Some(lease_id)
            || ts.status != TaskStatus::InProgress
            || ts.worker_id != Some(r.worker)
        {
            return Err(SupervisorError::revoked(
                revoked,
                SupervisorError::failed_precondition(format!(
                    "lease {lease_id} for task {task_id} is no longer valid (current: {}, status {})",
                    ts.lease_id.as_deref().unwrap_or("none"),
                    ts.status
                )),
            ));
        }
        Ok(())
    }

    /// A heartbeat from a worker's work loop.
    pub fn on_heartbeat(
        &mut self,
        req: Beat,
        now: Instant,
        wall: SystemTime,
    ) -> Result<(), SupervisorError> {
        let r = &req.caller;
        self.check_generation(r)?;
        if let Some(lease) = &req.lease {
            self.check_lease(r, lease)?;
        }
        let step = req.step;
        let w = r.worker;
        self.touch(w, now, wall);
        let recovered = self.worker_status(w) == Some(WorkerStatus::Stale);
        let detail = (!req.detail.is_empty()).then(|| req.detail.clone());
        let mut new_detail = false;
        if let Some(ws) = self.doc.workers.get_mut_unjournaled(&w.to_string()) {
            ws.health_check_at = Some(iso_millis(wall));
            ws.step = Some(step);
            ws.progress_pct = req.progress_pct.min(100);
            new_detail = detail.is_some() && ws.detail != detail;
            ws.detail = detail;
        }
        if recovered {
            let status = if req.lease.is_none() {
                WorkerStatus::Ready
            } else {
                WorkerStatus::Running
            };
            self.set_worker_status(w, status, None);
            self.event(
                wall,
                Source::Worker(w),
                Level::Info,
                "heartbeat_recovered",
                format!("Worker {w} heartbeat recovered"),
                json!({"worker_id": w}),
            );
        }
        if let Some(lease) = &req.lease
            && let Some(trt) = self.rt_tasks.get_mut(&lease.task_id)
        {
            // Only evidence of work refreshes the task's progress deadline: new output from
            // the agent CLI or a new step. A heartbeat alone proves the worker is alive, not
            // that a hung `claude -p` is making progress.
            // The CLI's own account of what it does (an API retry) is evidence too.
            let mut started = false;
            if req.last_output_ms > trt.last_output_ms || Some(step) != trt.last_step || new_detail
            {
                trt.last_progress = now;
                trt.last_output_ms = req.last_output_ms.max(trt.last_output_ms);
                started = step == Step::Implementing && trt.last_step != Some(Step::Implementing);
                trt.last_step = Some(step);
            }
            if started {
                let t = lease.task_id.clone();
                self.event(
                    wall,
                    Source::Worker(w),
                    Level::Info,
                    "task_started",
                    format!("Worker {w} started task {t}: invoking the agent CLI"),
                    json!({"task_id": t, "worker_id": w}),
                );
            }
        }
        Ok(())
    }

    /// What to check about a commit a worker reports for its current lease (`Complete`, or a
    /// checkpoint's WIP commit), or why the report is refused outright.
    pub fn commit_check(
        &self,
        r: &Caller,
        lease: &LeaseRef,
    ) -> Result<CommitCheck, SupervisorError> {
        self.check_lease(r, lease)?;
        let task_id = lease.task_id.as_str();
        let ts = &self.doc.tasks[task_id];
        Ok(CommitCheck {
            repo: self.paths.repo.clone(),
            git: self.git(),
            worker: r.worker,
            branch: worker_branch(self.feature(), r.worker),
            base: ts.base_commit.clone().unwrap_or_default(),
            protected: format!(".gsd/specs/{}", self.feature()),
            container: self
                .private_git()
                .then(|| crate::git::import_limits(&self.config.container)),
            feature: self.feature().to_string(),
            task: task_id.to_string(),
            resume_from: ts.resume_from.clone().unwrap_or_default(),
            pack_limits: crate::git::import_limits(&self.config.container),
            artifacts: self.paths.log_dir.join("tasks").join(task_id),
            artifact_caps: crate::transfers::ArtifactCaps::of(&self.config.container),
        })
    }

    /// A remote worker's pack was refused: said in the rush's events, with the reason, so
    /// `zergctl status` and `zergctl logs` show it.
    pub fn push_refused(
        &mut self,
        r: &Caller,
        lease: &LeaseRef,
        why: &str,
        wall: SystemTime,
    ) -> Result<(), SupervisorError> {
        self.check_lease(r, lease)?;
        let (w, task_id) = (r.worker, lease.task_id.as_str());
        self.event(
            wall,
            Source::Worker(w),
            Level::Warn,
            "push_refused",
            format!("Worker {w} pushed objects for {task_id} that zergd refused: {why}"),
            json!({"task_id": task_id, "worker_id": w, "reason": why}),
        );
        Ok(())
    }

    /// The hosts a confined worker's connection may reach (`setup`: made by a
    /// `worktree.setup` command, which may reach `sandbox.setup_allow_hosts` too). A rush whose
    /// workers are not confined has no proxy.
    pub fn egress_allow(&self, setup: bool) -> Result<(Vec<String>, Vec<String>), SupervisorError> {
        let container_egress = self.doc.rush.mode == Mode::Container
            && matches!(self.config.container.network.trim(), "" | "none");
        if !self.confined() && !container_egress {
            return Err(SupervisorError::failed_precondition(
                "this rush's workers have a network of their own: it has no egress proxy",
            ));
        }
        let setup_hosts = if setup {
            self.egress.setup_allow_hosts.clone()
        } else {
            Vec::new()
        };
        Ok((self.egress.allow_hosts.clone(), setup_hosts))
    }

    /// The egress proxy refused a connection of worker `r` (or let a setup command through to
    /// a host only `sandbox.setup_allow_hosts` names): an event naming the host, the worker
    /// and its task, counted for `status` and `/metrics`.
    pub fn egress_seen(&mut self, r: &Caller, report: &EgressReport, wall: SystemTime) {
        let w = r.worker;
        let task = self
            .doc
            .workers
            .get(&w.to_string())
            .and_then(|ws| ws.current_task.clone());
        let host = report.host.as_str();
        let by = if report.setup {
            "a worktree.setup command of worker"
        } else {
            "worker"
        };
        let on = task
            .as_deref()
            .map(|t| format!(" (task {t})"))
            .unwrap_or_default();
        if report.refused {
            self.doc.rush.egress_refused += 1;
            crate::metrics::METRICS.egress_refused();
            self.event(
                wall,
                Source::Worker(w),
                Level::Warn,
                "egress_refused",
                format!(
                    "The sandbox refused {by} {w}{on} a connection to {host}: not in sandbox.allow_hosts"
                ),
                json!({"host": host, "worker_id": w, "task_id": task, "setup": report.setup}),
            );
        } else {
            self.event(
                wall,
                Source::Worker(w),
                Level::Info,
                "egress_setup",
                format!("{by} {w} reached {host} (sandbox.setup_allow_hosts)"),
                json!({"host": host, "worker_id": w, "setup": true}),
            );
        }
    }

    /// A reported commit failed zergd's checks: the attempt fails (and is retried with
    /// backoff, up to the retry limit) and the worker is told its lease is over.
    pub fn refuse_commit(
        &mut self,
        req: &Completion,
        why: &str,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) -> SupervisorError {
        let task_id = req.lease.task_id.as_str();
        if let Err(e) = self.check_lease(&req.caller, &req.lease) {
            return e;
        }
        let w = req.caller.worker;
        self.touch(w, now, wall);
        if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
            ws.current_task = None;
            ws.status = WorkerStatus::Ready;
            ws.step = Some(Step::Idle);
        }
        self.event(
            wall,
            Source::Worker(w),
            Level::Warn,
            "commit_refused",
            format!("Worker {w} reported a commit for {task_id} that zergd refused: {why}"),
            json!({"task_id": task_id, "worker_id": w, "reason": why}),
        );
        self.fail_attempt(task_id, w, &format!("commit refused: {why}"), "", now, wall);
        self.check_level_done(now, wall, fx);
        self.dispatch(now, wall, fx);
        SupervisorError::failed_precondition(format!("commit refused: {why}"))
    }

    /// The inputs of the compatible `heartbeat-<id>.json` and `progress-<id>.json` files of a
    /// worker, as zergd last heard from it.
    pub fn worker_files(
        &self,
        w: u32,
        wall: SystemTime,
    ) -> Option<(serde_json::Value, serde_json::Value)> {
        let ws = self.doc.workers.get(&w.to_string())?;
        let step = ws.step.unwrap_or(Step::Initializing);
        let hb = json!({
            "worker_id": w,
            "timestamp": humantime::format_rfc3339_seconds(wall).to_string(),
            "task_id": ws.current_task,
            "step": step,
            "progress_pct": ws.progress_pct,
        });
        let tiers = self
            .rt_workers
            .get(&w)
            .map(|rt| rt.tiers.clone())
            .unwrap_or_default();
        let progress = json!({
            "worker_id": w,
            "tasks_completed": ws.tasks_completed,
            "tasks_total": self.graph.tasks.len(),
            "current_task": ws.current_task,
            "current_step": step,
            "tier_results": tiers,
        });
        Some((hb, progress))
    }

    /// Keeps the tier results of a slot's last attempt for its progress file.
    pub(super) fn record_tiers(&mut self, w: u32, task_id: &str, tiers: &[TierOutcome]) {
        let retry = self
            .doc
            .tasks
            .get(task_id)
            .map(|t| t.retry_count)
            .unwrap_or(0);
        self.rt_workers.entry(w).or_default().tiers = tiers
            .iter()
            .map(|t| json!({"tier": t.tier, "name": t.name, "success": t.success, "retry": retry}))
            .collect();
    }

    /// A worker committed its task.
    pub fn on_complete(
        &mut self,
        req: Completion,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) -> Result<(), SupervisorError> {
        self.check_lease(&req.caller, &req.lease)?;
        let w = req.caller.worker;
        let task_id = req.lease.task_id.clone();
        self.touch(w, now, wall);
        self.record_tiers(w, &task_id, &req.tiers);
        let ts = self.doc.tasks.get_mut(&task_id).expect("checked");
        ts.cost_usd += req.cost_usd;
        add_usage(ts, &req.usage);
        ts.unreachable = 0;
        ts.status = TaskStatus::Complete;
        ts.commit = Some(req.commit.clone());
        ts.completed_at = Some(iso_millis(wall));
        ts.updated_at = iso_millis(wall);
        ts.duration_ms = Some(req.duration_ms);
        ts.error = None;
        ts.resume_from = None;
        ts.out_of_scope = req.out_of_scope.clone();
        self.rt_tasks.remove(&task_id);
        self.unreachable_from.clear();
        if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
            ws.detail = None;
            ws.accepted_head = req.commit.clone();
            ws.tasks_completed += 1;
            ws.current_task = None;
            ws.status = WorkerStatus::Ready;
            ws.step = Some(Step::Idle);
        }
        self.event(
            wall,
            Source::Worker(w),
            Level::Info,
            "task_complete",
            format!("Worker {w} completed task {task_id} ({})", req.commit.get(..10).unwrap_or(&req.commit)),
            json!({"task_id": task_id, "worker_id": w, "commit": req.commit, "duration_ms": req.duration_ms}),
        );
        if !req.out_of_scope.is_empty() {
            let warning = format!(
                "task {task_id} changed files outside its ownership: {}",
                req.out_of_scope.join(", ")
            );
            self.event(
                wall,
                Source::Worker(w),
                Level::Warn,
                "task_out_of_scope",
                warning,
                json!({"task_id": task_id, "files": req.out_of_scope}),
            );
        }
        self.check_level_done(now, wall, fx);
        self.dispatch(now, wall, fx);
        Ok(())
    }

    /// A worker reports a task that did not finish.
    pub fn on_fail(
        &mut self,
        req: Failure,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) -> Result<(), SupervisorError> {
        self.check_lease(&req.caller, &req.lease)?;
        let w = req.caller.worker;
        let t = req.lease.task_id.clone();
        self.touch(w, now, wall);
        self.record_tiers(w, &t, &req.tiers);
        if let Some(ts) = self.doc.tasks.get_mut(&t) {
            ts.cost_usd += req.cost_usd;
            add_usage(ts, &req.usage);
        }
        if req.kind != Some(FailKind::ApiUnreachable) {
            self.unreachable_from.clear();
        }
        if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
            ws.detail = None;
            ws.current_task = None;
            ws.status = WorkerStatus::Ready;
            ws.step = Some(Step::Idle);
        }
        // An unknown kind is an ordinary failed attempt.
        let kind = req.kind;
        match kind {
            Some(FailKind::RateLimited) => {
                // A reset time the worker states is believed up to a bound: one worker cannot
                // hold the whole rush for ever.
                let latest = unix_millis(wall).saturating_add(MAX_RATE_LIMIT_PAUSE_MS);
                let until = if req.retry_at_ms > unix_millis(wall) {
                    // A little after the reset: the provider's clock and ours differ.
                    from_unix_millis(req.retry_at_ms.min(latest))
                        + self.config.workers.usage_limit_margin_seconds
                } else {
                    wall + self.task_backoff().jittered(1)
                };
                // Another worker may already have reported a later reset.
                if self.doc.rush.rate_limited_until_ms == 0 {
                    crate::metrics::METRICS.usage_limit_hold();
                }
                if unix_millis(until) > self.doc.rush.rate_limited_until_ms {
                    self.doc.rush.rate_limited_until_ms = unix_millis(until);
                    self.doc.rush.rate_limit_type = req.limit_type.clone();
                }
                self.requeue(&t, "rate limited", wall);
                let what = limit_text(
                    self.doc.rush.rate_limited_until_ms,
                    &self.doc.rush.rate_limit_type,
                );
                self.event(
                    wall,
                    Source::Worker(w),
                    Level::Warn,
                    "rate_limited",
                    format!(
                        "Worker {w} hit the agent's {what} on {t}: new work is held (retrying before the reset would fail again; the attempt is not counted)"
                    ),
                    json!({"task_id": t, "worker_id": w, "until": iso_millis(until), "limit_type": req.limit_type}),
                );
            }
            Some(FailKind::Checkpoint) => {
                if let Some(ts) = self.doc.tasks.get_mut(&t) {
                    ts.resume_from = req.checkpoint.clone();
                }
                self.requeue(&t, "checkpoint", wall);
            }
            Some(FailKind::AgentMissing) => {
                self.set_worker_status(w, WorkerStatus::Ready, Some(req.message.clone()));
                self.requeue(
                    &t,
                    &format!("worker cannot run the agent: {}", req.message),
                    wall,
                );
            }
            Some(FailKind::AuthFailed) => {
                self.requeue(&t, "the agent CLI is not logged in", wall);
                let cause = req.message.trim_end_matches('.').to_string();
                self.pause_for_worker(w, &t, "agent_not_logged_in", &cause, wall);
            }
            Some(FailKind::Environment) => {
                // No attempt can succeed until someone fixes the environment: the attempt is
                // not counted, and the rush pauses once, whichever worker saw it first.
                self.requeue(&t, "the worker's environment cannot run the task", wall);
                // A failed setup names its own fix; a missing program gets the one that fits
                // where the workers run.
                let fix = if req.message.contains("worktree.setup") {
                    ""
                } else if self.doc.rush.mode == Mode::Subprocess {
                    ": install it for the user zergd runs as, or make it in the worktree with worktree.setup in .zerg/config.yaml"
                } else {
                    ": add it to the worker image (container.image; `zergctl image build --from YOUR-IMAGE` layers the worker onto your project's own), or make it in the worktree with worktree.setup in .zerg/config.yaml"
                };
                let cause = format!(
                    "environment error on worker {w} (task {t}): {}{fix}",
                    req.message.trim_end_matches('.')
                );
                self.pause_for_worker(w, &t, "environment_error", &cause, wall);
            }
            Some(FailKind::ApiUnreachable) => {
                self.unreachable_from.insert(w);
                self.api_unreachable(&t, w, &req.message, now, wall);
            }
            Some(FailKind::Escalated) => {
                self.fail_permanently(&t, &format!("escalated: {}", req.message), wall);
            }
            _ => {
                let kind = kind.map(FailKind::as_str).unwrap_or("failed");
                self.fail_attempt(
                    &t,
                    w,
                    &format!("{kind}: {}", req.message),
                    &req.context,
                    now,
                    wall,
                );
            }
        }
        self.check_level_done(now, wall, fx);
        self.dispatch(now, wall, fx);
        Ok(())
    }

    /// Pauses a running rush for what worker `w` reported on task `t` (once: a rush that is
    /// already paused stays as it is), with `cause` and how to resume as the reason.
    fn pause_for_worker(&mut self, w: u32, t: &str, kind: &str, cause: &str, wall: SystemTime) {
        if self.state() != RushState::Running {
            return;
        }
        let reason = format!("{cause}. Then `zergctl retry {}`", self.feature());
        self.set_state(RushState::Paused, &reason);
        self.event(
            wall,
            Source::Worker(w),
            Level::Error,
            kind,
            format!("Worker {w}: rush paused: {reason}"),
            json!({"task_id": t, "worker_id": w}),
        );
    }

    /// An escalation from a worker.
    pub fn on_escalate(
        &mut self,
        req: EscalationReport,
        wall: SystemTime,
        fx: &mut Effects,
    ) -> Result<(), SupervisorError> {
        let r = &req.caller;
        self.check_generation(r)?;
        // A worker escalates about a task of this rush, and cannot flood the list a person
        // has to read.
        if !self.doc.tasks.contains_key(&req.task_id) {
            return Err(SupervisorError::not_found(format!(
                "task_id: rush {} has no task {:?}",
                self.feature(),
                req.task_id
            )));
        }
        let for_task = self
            .escalations
            .iter()
            .filter(|e| e.task_id == req.task_id)
            .count();
        if for_task >= MAX_ESCALATIONS_PER_TASK || self.escalations.len() >= MAX_ESCALATIONS {
            return Err(SupervisorError::failed_precondition(format!(
                "too many escalations (at most {MAX_ESCALATIONS_PER_TASK} per task and {MAX_ESCALATIONS} per rush); resolve the ones in status first"
            )));
        }
        let esc = Escalation {
            worker_id: r.worker,
            task_id: req.task_id.clone(),
            category: req.category.clone(),
            message: req.message.clone(),
            timestamp: iso_millis(wall),
            context_json: req.context_json.clone(),
        };
        self.escalations.push(esc.clone());
        fx.escalations.push(esc);
        self.event(
            wall,
            Source::Worker(r.worker),
            Level::Warn,
            "escalation_created",
            format!(
                "ESCALATION from Worker {} on {} [{}]: {}",
                r.worker, req.task_id, req.category, req.message
            ),
            json!({"task_id": req.task_id, "category": req.category, "message": req.message}),
        );
        Ok(())
    }
}

/// Adds an attempt's tokens to its task.
fn add_usage(ts: &mut crate::state::TaskState, u: &crate::calls::AttemptUsage) {
    ts.tokens.add(&u.tokens);
    for (m, spend) in &u.models {
        ts.models.entry(m.clone()).or_default().add(spend);
    }
}

/// `usage limit until 20:22 UTC (five_hour)`: a hold as status and monitor.log show it.
pub fn limit_text(until_ms: i64, kind: &str) -> String {
    let at = iso_millis(from_unix_millis(until_ms));
    let hm = at.get(11..16).unwrap_or(&at);
    if kind.is_empty() {
        format!("usage limit until {hm} UTC")
    } else {
        format!("usage limit until {hm} UTC ({kind})")
    }
}
