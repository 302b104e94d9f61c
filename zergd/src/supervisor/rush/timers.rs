//! Timers: the stale-worker and stale-task watchdogs, retries coming due, and reconciliation.

use super::*;

impl Rush {
    /// Runs every due timer. Returns the next time something is due.
    pub fn tick(&mut self, now: Instant, wall: SystemTime, fx: &mut Effects) -> Option<Instant> {
        if self.is_terminal() {
            return None;
        }
        let mut next: Option<Instant> = None;
        let mut due = |t: Instant| {
            next = Some(next.map_or(t, |n: Instant| n.min(t)));
        };
        // Spawn retries and respawns (FR-1, FR-6).
        let spawn_due: Vec<u32> = self
            .rt_workers
            .iter()
            .filter(|(_, rt)| rt.spawn_due.is_some_and(|d| d <= now))
            .map(|(w, _)| *w)
            .collect();
        for w in spawn_due {
            self.spawn_slot(w, now, fx);
        }
        for rt in self.rt_workers.values() {
            if let Some(d) = rt.spawn_due {
                due(d);
            }
        }
        // Task retries (backoff elapsed).
        let retry_due: Vec<String> = self
            .rt_tasks
            .iter()
            .filter(|(_, rt)| rt.retry_due.is_some_and(|d| d <= now))
            .map(|(t, _)| t.clone())
            .collect();
        for t in retry_due {
            if self.task_status(&t) == Some(TaskStatus::WaitingRetry) {
                let ts = self.doc.tasks.get_mut(&t).expect("exists");
                ts.status = TaskStatus::Pending;
                ts.next_retry_at = None;
                self.rt_tasks.remove(&t);
                self.event(
                    wall,
                    Source::Orchestrator,
                    Level::Info,
                    "task_retry_ready",
                    format!("Task {t} is ready for retry"),
                    json!({"task_id": t}),
                );
            } else {
                self.rt_tasks.remove(&t);
            }
        }
        for rt in self.rt_tasks.values() {
            if let Some(d) = rt.retry_due {
                due(d);
            }
        }
        if self.state() == RushState::Running && self.resilient() {
            self.check_stale(now, wall, fx);
            // Re-check at a fraction of the heartbeat interval.
            due(now
                + (self.config.workers.heartbeat_interval_seconds / 2).min(Duration::from_secs(1)));
        }
        if self.doc.rush.rate_limited_until_ms > 0 {
            if self.rate_limited(wall) {
                let left = self.doc.rush.rate_limited_until_ms - unix_millis(wall);
                due(now + Duration::from_millis(left as u64));
            } else {
                self.doc.rush.rate_limited_until_ms = 0;
                self.doc.rush.rate_limit_type.clear();
                self.dirty = true;
                self.event(
                    wall,
                    Source::Orchestrator,
                    Level::Info,
                    "rate_limit_over",
                    "Usage limit reset; resuming new work".into(),
                    json!({}),
                );
            }
        }
        if now >= self.next_reconcile {
            self.reconcile(false, wall);
            self.next_reconcile = now + self.reconcile_interval();
        }
        due(self.next_reconcile);
        self.check_level_done(now, wall, fx);
        self.dispatch(now, wall, fx);
        next
    }

    /// Heartbeat staleness, task progress watchdog, ready timeouts and reconnect grace.
    pub(super) fn check_stale(&mut self, now: Instant, wall: SystemTime, fx: &mut Effects) {
        let w_cfg = &self.config.workers;
        let hb_stale = w_cfg.heartbeat_stale_threshold;
        let task_stale = w_cfg.task_stale_timeout_seconds;
        let ready_timeout = w_cfg.spawn_ready_timeout_seconds;

        // Workers that never registered in time: a failed spawn.
        let slow: Vec<u32> = self
            .rt_workers
            .iter()
            .filter(|(_, rt)| rt.spawned.is_some() && !rt.registered && rt.reconnect_by.is_none())
            .filter(|(_, rt)| {
                rt.spawned_at
                    .is_some_and(|s| now.duration_since(s) > ready_timeout)
            })
            .map(|(w, _)| *w)
            .collect();
        for w in slow {
            self.kill_worker(w, true, fx);
            self.set_worker_status(w, WorkerStatus::Stopping, None);
            self.event(
                wall,
                Source::Worker(w),
                Level::Warn,
                "worker_spawn_timeout",
                format!("Worker {w} did not register within {:.0}s; killing it (counts as a failed spawn)", ready_timeout.as_secs_f64()),
                json!({"worker_id": w}),
            );
            // The timeout is the failure: the killed process's exit must not be handled again.
            let generation = self
                .doc
                .workers
                .get(&w.to_string())
                .map(|x| x.generation)
                .unwrap_or(0);
            if let Some(rt) = self.rt_workers.get_mut(&w) {
                rt.spawned = None;
                rt.handled_gen = generation;
            }
            self.spawn_failed(w, "did not register in time", now, wall, fx);
        }

        // Re-adopted workers that never reconnected after a zergd restart.
        let lost: Vec<u32> = self
            .rt_workers
            .iter()
            .filter(|(_, rt)| rt.reconnect_by.is_some_and(|d| d <= now))
            .map(|(w, _)| *w)
            .collect();
        for w in lost {
            let generation = self
                .doc
                .workers
                .get(&w.to_string())
                .map(|x| x.generation)
                .unwrap_or(0);
            self.kill_worker(w, true, fx);
            self.event(
                wall,
                Source::Worker(w),
                Level::Warn,
                "heartbeat_stale",
                format!(
                    "Worker {w} did not reconnect after zergd restarted; treating it as crashed"
                ),
                json!({"worker_id": w}),
            );
            self.doc.rush.resilience.stale_detections += 1;
            self.on_exit(w, generation, ExitInfo::Vanished, now, wall, fx);
        }

        // Stale heartbeats (FR-3).
        let live: Vec<u32> = self
            .rt_workers
            .iter()
            .filter(|(w, rt)| {
                rt.registered
                    && rt.spawned.is_some()
                    && !rt.stopping
                    && self.worker_status(**w) != Some(WorkerStatus::Stale)
            })
            .map(|(w, _)| *w)
            .collect();
        let stale: Vec<u32> = live
            .iter()
            .copied()
            .filter(|w| {
                self.rt_workers[w]
                    .last_hb
                    .is_some_and(|h| now.duration_since(h) > hb_stale)
            })
            .collect();
        if !stale.is_empty() {
            // If half or more of the workers went stale in the same tick, the likelier story is
            // that zergd itself was suspended or the clock jumped: re-check once before failing
            // everything (the Kubernetes node-controller brake).
            let brake_ok = self
                .brake_at
                .is_none_or(|b| now.duration_since(b) > hb_stale * 2);
            if live.len() >= 2 && stale.len() * 2 >= live.len() && brake_ok {
                self.brake_at = Some(now);
                for w in &stale {
                    if let Some(rt) = self.rt_workers.get_mut(w) {
                        rt.last_hb = Some(now);
                    }
                }
                for rt in self.rt_tasks.values_mut() {
                    if rt.retry_due.is_none() {
                        // A full new progress window: the silence may have been zergd's.
                        rt.last_progress = now;
                    }
                }
                self.event(
                    wall,
                    Source::Orchestrator,
                    Level::Warn,
                    "heartbeat_brake",
                    format!(
                        "{} of {} workers look stale at once; suspecting zergd was suspended or the clock jumped, re-checking after another {:.0}s instead of failing them",
                        stale.len(),
                        live.len(),
                        hb_stale.as_secs_f64()
                    ),
                    json!({"stale": stale, "live": live}),
                );
            } else {
                for w in stale {
                    self.doc.rush.resilience.stale_detections += 1;
                    let task = self
                        .doc
                        .workers
                        .get(&w.to_string())
                        .and_then(|x| x.current_task.clone());
                    self.set_worker_status(
                        w,
                        WorkerStatus::Stale,
                        Some(format!("no heartbeat for {:.0}s", hb_stale.as_secs_f64())),
                    );
                    self.event(
                        wall,
                        Source::Worker(w),
                        Level::Warn,
                        "heartbeat_stale",
                        format!(
                            "Worker {w} is stale: no heartbeat for more than {:.0}s; it gets no new work, is killed{}",
                            hb_stale.as_secs_f64(),
                            task.as_deref().map(|t| format!(", and its task {t} is reassigned")).unwrap_or_default()
                        ),
                        json!({"worker_id": w, "task_id": task}),
                    );
                    if let Some(t) =
                        task.filter(|t| self.task_status(t) == Some(TaskStatus::InProgress))
                    {
                        self.crash_task(&t, w, "worker heartbeat stale", wall);
                        if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
                            ws.current_task = None;
                        }
                    }
                    // Killed by us because it was stale: the respawn is counted (it may be a
                    // worker that keeps hanging), so the exit is not marked expected.
                    self.kill_worker(w, false, fx);
                }
            }
        }

        // Tasks with no progress (FR-2).
        let timed_out: Vec<(String, u32)> = self
            .doc
            .tasks
            .iter()
            .filter(|(_, t)| t.status == TaskStatus::InProgress)
            .filter_map(|(id, t)| {
                let rt = self.rt_tasks.get(id)?;
                (now.duration_since(rt.last_progress) > task_stale)
                    .then(|| (id.clone(), t.worker_id.unwrap_or(0)))
            })
            .collect();
        for (t, w) in timed_out {
            self.doc.rush.resilience.stale_detections += 1;
            self.doc.rush.resilience.task_reassignments += 1;
            self.event(
                wall,
                Source::Worker(w),
                Level::Warn,
                "task_timeout",
                format!(
                    "Task {t} on worker {w} made no progress for more than {:.0}s (no agent output); failing it with reason timeout, killing the worker's process group, and requeueing with backoff",
                    task_stale.as_secs_f64()
                ),
                json!({"task_id": t, "worker_id": w, "timeout_seconds": task_stale.as_secs_f64()}),
            );
            if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
                ws.current_task = None;
            }
            self.fail_attempt(
                &t,
                w,
                "timeout: no progress from the agent",
                &format!(
                    "The agent printed nothing for {} s, so zergd stopped it (workers.task_stale_timeout_seconds). Work in smaller steps that show progress.",
                    self.config.workers.task_stale_timeout_seconds.as_secs()
                ),
                now,
                wall,
            );
            self.kill_worker(w, true, fx);
        }
    }

    /// Stops a worker. An `expected` exit is zergd's doing and is not counted against the
    /// respawn cap; a stale worker's is (it may be one that keeps hanging).
    pub(super) fn kill_worker(&mut self, w: u32, expected: bool, fx: &mut Effects) {
        if let Some(rt) = self.rt_workers.get_mut(&w)
            && let Some(sp) = rt.spawned.clone()
        {
            rt.stopping |= expected;
            fx.stop
                .push((w, sp, self.config.workers.stop_grace_seconds));
        }
    }

    /// Compares task, worker and level state and fixes what disagrees (FR-4). `thorough` runs
    /// at level transitions.
    pub fn reconcile(&mut self, thorough: bool, wall: SystemTime) -> u32 {
        let mut fixes: Vec<String> = Vec::new();
        // A missing level is parsed from the id (`*-L{n}-*`) or taken from the graph.
        let graph_levels: HashMap<String, u32> = self
            .graph
            .tasks
            .iter()
            .map(|t| (t.id.clone(), t.level))
            .collect();
        let unlevelled: Vec<String> = self
            .doc
            .tasks
            .iter()
            .filter(|(_, t)| t.level.is_none())
            .map(|(id, _)| id.clone())
            .collect();
        for id in unlevelled {
            let level = zerg_proto::graph::level_from_id(&id).or(graph_levels.get(&id).copied());
            if let Some(ts) = self.doc.tasks.get_mut(&id) {
                ts.level = level;
            }
            fixes.push(format!("task {id} had no level; set to {level:?}"));
        }
        // In-progress tasks whose worker is not alive, or not holding them.
        let orphaned: Vec<(String, Option<u32>)> = self
            .doc
            .tasks
            .iter()
            .filter(|(_, t)| t.status == TaskStatus::InProgress)
            .filter(|(id, t)| {
                let Some(w) = t.worker_id else { return true };
                let alive = self
                    .rt_workers
                    .get(&w)
                    .is_some_and(|rt| rt.spawned.is_some());
                let holds = self
                    .doc
                    .workers
                    .get(&w.to_string())
                    .and_then(|x| x.current_task.as_deref())
                    == Some(id.as_str());
                !(alive && holds)
            })
            .map(|(id, t)| (id.clone(), t.worker_id))
            .collect();
        for (t, w) in orphaned {
            fixes.push(format!("task {t} was in progress on dead or idle worker {w:?}; failed with worker_crash and requeued"));
            match w {
                Some(w) => self.crash_task(&t, w, "reconciliation found its worker gone", wall),
                None => self.requeue(&t, "reconciliation: no worker", wall),
            }
        }
        // Workers that claim a task the task does not agree with.
        let mismatched: Vec<u32> = self
            .doc
            .workers
            .values()
            .filter(|ws| {
                ws.current_task.as_ref().is_some_and(|t| {
                    self.task_status(t) != Some(TaskStatus::InProgress)
                        || self.doc.tasks.get(t).and_then(|x| x.worker_id) != Some(ws.worker_id)
                })
            })
            .map(|ws| ws.worker_id)
            .collect();
        for w in mismatched {
            if let Some(ws) = self.doc.workers.get_mut(&w.to_string()) {
                fixes.push(format!(
                    "worker {w} listed task {:?} that it does not hold; cleared",
                    ws.current_task
                ));
                ws.current_task = None;
            }
        }
        // Level status must agree with task status.
        let levels: Vec<u32> = self.level_numbers().collect();
        for l in levels {
            let all_terminal = self
                .level_tasks(l)
                .all(|t| Self::is_terminal_task(self.task_status(&t.id)));
            let key = l.to_string();
            let st = self
                .doc
                .levels
                .get(&key)
                .map(|x| x.status)
                .unwrap_or_default();
            if (st == LevelStatus::Complete || st == LevelStatus::Failed) && !all_terminal {
                let want = if l == self.doc.current_level {
                    LevelStatus::Running
                } else {
                    LevelStatus::Pending
                };
                fixes.push(format!(
                    "level {l} was marked {st} with unfinished tasks; recalculated to {want}"
                ));
                self.doc.levels.entry(key).or_default().status = want;
            }
        }
        if thorough {
            // Nothing of a later level may be running while an earlier level is open.
            let cur = self.doc.current_level;
            let early: Vec<String> = self
                .doc
                .tasks
                .iter()
                .filter(|(_, t)| t.status == TaskStatus::InProgress && t.level.unwrap_or(0) > cur)
                .map(|(id, _)| id.clone())
                .collect();
            for t in early {
                fixes.push(format!(
                    "task {t} was running ahead of level {cur}; requeued"
                ));
                self.requeue(&t, "reconciliation: ahead of its level", wall);
            }
        }
        let n = fixes.len() as u32;
        for f in fixes {
            self.doc.rush.resilience.reconcile_fixes += 1;
            self.event(
                wall,
                Source::Orchestrator,
                Level::Warn,
                "state_reconcile_fix",
                format!("Reconciliation fixed a divergence: {f}"),
                json!({"fix": f, "thorough": thorough}),
            );
        }
        n
    }
}
