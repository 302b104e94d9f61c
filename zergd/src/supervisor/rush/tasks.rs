//! How a task moves between pending, waiting for a retry, failed and blocked.

use super::*;

impl Rush {
    /// Puts an in-progress task back to pending without counting an attempt.
    pub(super) fn requeue(&mut self, t: &str, why: &str, wall: SystemTime) {
        let Some(ts) = self.doc.tasks.get_mut(t) else {
            return;
        };
        let w = ts.worker_id;
        ts.status = TaskStatus::Pending;
        ts.lease_id = None;
        ts.updated_at = iso_millis(wall);
        self.rt_tasks.remove(t);
        self.event(
            wall,
            w.map(Source::Worker).unwrap_or(Source::Orchestrator),
            Level::Info,
            "task_requeued",
            format!("Task {t} requeued ({why})"),
            json!({"task_id": t, "reason": why}),
        );
    }

    /// Keeps what the next attempt of `t` is told of this one: `head` (how it failed) and the
    /// end of `context` (output tails, the agent's last message), at most
    /// `agent.retry_context_bytes` in all, cut at a character boundary.
    pub(super) fn note_attempt(&mut self, t: &str, head: &str, context: &str) {
        let cap = usize::try_from(self.config.agent.retry_context_bytes.0).unwrap_or(usize::MAX);
        let Some(ts) = self.doc.tasks.get_mut(t) else {
            return;
        };
        ts.previous_attempt = Some(bounded_note(head, context, cap));
    }

    /// Adds the user's note to task `t`: every later attempt's prompt carries it. With
    /// `restart`, a running attempt is stopped and requeued without being counted (its worker
    /// is killed as zergd kills a stale one, and its lease no longer holds), a waiting retry
    /// comes due now, and a failed task is retried.
    pub fn note(
        &mut self,
        t: &str,
        text: String,
        restart: bool,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) -> Result<Noted, SupervisorError> {
        let notes = self.add_note(t, &text, wall)?;
        let (status, worker) = self
            .doc
            .tasks
            .get(t)
            .map(|ts| (ts.status, ts.worker_id))
            .unwrap_or((TaskStatus::Pending, None));
        let outcome = match (restart, status) {
            (true, TaskStatus::InProgress) => {
                let w = worker.unwrap_or(0);
                if let Some(ws) = self.doc.workers.get_mut(&w.to_string())
                    && ws.current_task.as_deref() == Some(t)
                {
                    ws.current_task = None;
                }
                self.requeue(t, "restarted by the user with a note", wall);
                self.kill_worker(w, true, fx);
                // It gets no new lease while it goes.
                self.set_worker_status(w, WorkerStatus::Stopping, None);
                self.dispatch(now, wall, fx);
                "running attempt stopped (not counted); the next one starts with the note"
            }
            (true, TaskStatus::WaitingRetry) => {
                if let Some(ts) = self.doc.tasks.get_mut(t) {
                    ts.status = TaskStatus::Pending;
                    ts.next_retry_at = None;
                    ts.updated_at = iso_millis(wall);
                }
                self.rt_tasks.remove(t);
                // A paused or ended rush leases nothing: dispatch checks that itself.
                self.dispatch(now, wall, fx);
                "retry brought forward; it starts with the note"
            }
            (true, TaskStatus::Failed | TaskStatus::Blocked) => {
                self.retry(&[t.to_string()], false, now, wall, fx)?;
                "requeued with the note"
            }
            _ => "kept for the next attempt",
        };
        Ok(Noted { notes, outcome })
    }

    /// Why task `t` cannot take a note, if it cannot: it does not exist, it is complete, or it
    /// holds [`NOTES_PER_TASK`] already.
    fn check_note(&self, t: &str) -> Result<(), SupervisorError> {
        let feature = self.feature();
        let Some(ts) = self.doc.tasks.get(t) else {
            return Err(SupervisorError::not_found(format!(
                "no task {t} in rush {feature}"
            )));
        };
        if ts.status == TaskStatus::Complete {
            return Err(SupervisorError::failed_precondition(format!(
                "task {t} of rush {feature} is complete: no attempt of it runs again, so a note would reach nothing"
            )));
        }
        if ts.notes.len() >= NOTES_PER_TASK {
            return Err(SupervisorError::failed_precondition(format!(
                "task {t} holds {NOTES_PER_TASK} notes already, the most it keeps; say it in fewer"
            )));
        }
        Ok(())
    }

    /// Adds `text` to the tasks a `retry --note` names (with none named, to every failed one),
    /// all or none: the first task that cannot take it is the error.
    pub fn note_retried(
        &mut self,
        ids: &[String],
        text: &str,
        wall: SystemTime,
    ) -> Result<(), SupervisorError> {
        let targets: Vec<String> = if ids.is_empty() {
            self.doc
                .tasks
                .iter()
                .filter(|(_, t)| matches!(t.status, TaskStatus::Failed | TaskStatus::WaitingRetry))
                .map(|(id, _)| id.clone())
                .collect()
        } else {
            ids.to_vec()
        };
        if targets.is_empty() {
            return Err(SupervisorError::failed_precondition(format!(
                "rush {} has no failed task for the note to reach: name the task (zergctl note {} TASK \"text\")",
                self.feature(),
                self.feature()
            )));
        }
        for t in &targets {
            self.check_note(t)?;
        }
        for t in &targets {
            self.add_note(t, text, wall)?;
        }
        Ok(())
    }

    /// Keeps `text` as a note of the user on task `t`, which must exist and not be complete:
    /// how many notes it holds now.
    fn add_note(&mut self, t: &str, text: &str, wall: SystemTime) -> Result<u32, SupervisorError> {
        self.check_note(t)?;
        let Some(ts) = self.doc.tasks.get_mut(t) else {
            return Ok(0);
        };
        ts.notes.push(crate::state::UserNote {
            text: text.to_string(),
            at: iso_millis(wall),
        });
        let notes = ts.notes.len() as u32;
        self.dirty = true;
        self.event(
            wall,
            Source::Orchestrator,
            Level::Info,
            "task_note",
            format!("Note for task {t} (its next attempt's prompt carries it): {text}"),
            json!({"task_id": t, "text": text, "notes": notes}),
        );
        Ok(notes)
    }

    /// The worker holding a task died: requeue at once without counting an attempt (FR-5).
    pub(super) fn crash_task(&mut self, t: &str, w: u32, why: &str, wall: SystemTime) {
        let cap = self.config.workers.max_respawn_attempts.max(3);
        let Some(ts) = self.doc.tasks.get_mut(t) else {
            return;
        };
        ts.crashes += 1;
        ts.error = Some(format!("worker_crash: {why}"));
        let crashes = ts.crashes;
        self.doc.rush.resilience.task_reassignments += 1;
        if crashes > cap {
            // A task that kills every worker it lands on is poison, not bad luck.
            self.fail_permanently(
                t,
                &format!("worker_crash: crashed its worker {crashes} times (last: {why})"),
                wall,
            );
            return;
        }
        let attempt = self.doc.tasks.get(t).map_or(1, |ts| ts.retry_count + 1);
        self.note_attempt(
            t,
            &format!("Attempt {attempt} did not finish: its worker went away ({why}). This attempt is not counted; start again from the task."),
            "",
        );
        self.requeue(t, "worker_crash", wall);
        self.event(
            wall,
            Source::Worker(w),
            Level::Warn,
            "task_reassign",
            format!("Task {t} failed with reason worker_crash ({why}); reassigning to a healthy worker (retry count unchanged: a crash is not a bug in the task)"),
            json!({"task_id": t, "worker_id": w, "retry_count_incremented": false}),
        );
    }

    /// A task attempt failed: retry with backoff, or fail for good.
    pub(super) fn fail_attempt(
        &mut self,
        t: &str,
        w: u32,
        why: &str,
        context: &str,
        now: Instant,
        wall: SystemTime,
    ) {
        let attempt = self.doc.tasks.get(t).map_or(1, |ts| ts.retry_count + 1);
        self.note_attempt(t, &format!("Attempt {attempt} failed: {why}"), context);
        let max = if self.is_resolution(t) {
            self.config.merge.resolve_attempts.saturating_sub(1)
        } else {
            self.config.workers.retry_attempts
        };
        let backoff = self.task_backoff();
        let Some(ts) = self.doc.tasks.get_mut(t) else {
            return;
        };
        ts.retry_count += 1;
        ts.error = Some(why.to_string());
        ts.lease_id = None;
        let n = ts.retry_count;
        // Task retries are part of the core, not of the resilience switch.
        if n <= max {
            let delay = backoff.jittered(n);
            self.wait_retry(t, delay, now, wall);
            self.event(
                wall,
                Source::Worker(w),
                Level::Warn,
                "task_failed",
                format!("Task {t} failed (attempt {n} of {}): {why}; retrying in {:.1}s", max + 1, delay.as_secs_f64()),
                json!({"task_id": t, "worker_id": w, "retry_count": n, "backoff_seconds": delay.as_secs_f64(), "error": why}),
            );
        } else {
            self.fail_permanently(t, &format!("failed after {n} attempts: {why}"), wall);
        }
    }

    /// Puts task `t` in `waiting_retry`, due again after `delay`.
    fn wait_retry(&mut self, t: &str, delay: Duration, now: Instant, wall: SystemTime) {
        if let Some(ts) = self.doc.tasks.get_mut(t) {
            ts.status = TaskStatus::WaitingRetry;
            ts.next_retry_at = Some(iso_millis(wall + delay));
            ts.updated_at = iso_millis(wall);
        }
        self.rt_tasks.insert(
            t.to_string(),
            TaskRt {
                last_progress: now,
                last_output_ms: 0,
                last_step: None,
                retry_due: Some(now + delay),
            },
        );
    }

    /// The agent CLI could not reach its API, after its own retries: not the task's fault.
    /// The task waits with backoff, the attempt not counted; once every worker of the rush has
    /// seen it since the last attempt that got through, the rush pauses.
    pub(super) fn api_unreachable(
        &mut self,
        t: &str,
        w: u32,
        why: &str,
        now: Instant,
        wall: SystemTime,
    ) {
        let backoff = self.task_backoff();
        let everyone = self.unreachable_from.len() >= self.doc.rush.workers.max(1) as usize;
        let Some(ts) = self.doc.tasks.get_mut(t) else {
            return;
        };
        ts.unreachable = ts.unreachable.saturating_add(1);
        ts.error = Some(format!("api_unreachable: {why}"));
        ts.lease_id = None;
        let delay = backoff.jittered(ts.unreachable);
        self.wait_retry(t, delay, now, wall);
        self.event(
            wall,
            Source::Worker(w),
            Level::Warn,
            "api_unreachable",
            format!(
                "Worker {w}: the agent CLI could not reach its API on {t} ({why}); retrying in {:.1}s (the attempt is not counted)",
                delay.as_secs_f64()
            ),
            json!({"task_id": t, "worker_id": w, "backoff_seconds": delay.as_secs_f64()}),
        );
        if everyone && self.state() == RushState::Running {
            let reason = format!(
                "the agent CLI cannot reach its API from any worker ({why}). Check the network (and ANTHROPIC_BASE_URL if set), then `zergctl retry {}`",
                self.feature()
            );
            self.set_state(RushState::Paused, &reason);
            self.event(
                wall,
                Source::Orchestrator,
                Level::Error,
                "api_unreachable_everywhere",
                format!("Rush paused: {reason}"),
                json!({"workers": self.unreachable_from.iter().collect::<Vec<_>>()}),
            );
        }
    }

    /// Fails a task for good and blocks everything that depends on it.
    pub(super) fn fail_permanently(&mut self, t: &str, why: &str, wall: SystemTime) {
        let Some(ts) = self.doc.tasks.get_mut(t) else {
            return;
        };
        ts.status = TaskStatus::Failed;
        ts.error = Some(why.to_string());
        ts.lease_id = None;
        ts.updated_at = iso_millis(wall);
        let w = ts.worker_id;
        self.rt_tasks.remove(t);
        self.event(
            wall,
            w.map(Source::Worker).unwrap_or(Source::Orchestrator),
            Level::Error,
            "task_failed_permanent",
            format!("Task {t} failed: {why}"),
            json!({"task_id": t, "error": why}),
        );
        let dependents = self.graph.dependents_closure(t);
        let mut blocked = Vec::new();
        for d in dependents {
            if let Some(ds) = self.doc.tasks.get_mut(&d) {
                if ds.status == TaskStatus::Complete {
                    continue;
                }
                ds.status = TaskStatus::Blocked;
                if !ds.blocked_by.contains(&t.to_string()) {
                    ds.blocked_by.push(t.to_string());
                }
                ds.error = Some(format!("blocked: depends on failed task {t}"));
                ds.updated_at = iso_millis(wall);
                blocked.push(d);
            }
        }
        if !blocked.is_empty() {
            self.event(
                wall,
                Source::Orchestrator,
                Level::Warn,
                "tasks_blocked",
                format!(
                    "Blocked {} dependent task(s) of {t}: {}",
                    blocked.len(),
                    blocked.join(", ")
                ),
                json!({"task_id": t, "blocked": blocked}),
            );
        }
    }
}

/// `head`, then as much of the end of `context` as fits, in at most `cap` bytes.
fn bounded_note(head: &str, context: &str, cap: usize) -> String {
    let mut out: String = head.chars().take(cap).collect();
    while out.len() > cap {
        out.pop();
    }
    let context = context.trim();
    let room = cap.saturating_sub(out.len() + 2);
    if !context.is_empty() && room > 0 {
        let mut from = context.len().saturating_sub(room);
        while !context.is_char_boundary(from) {
            from += 1;
        }
        out.push_str("\n\n");
        out.push_str(&context[from..]);
    }
    out
}

#[cfg(test)]
mod note_tests {
    use super::bounded_note;

    #[test]
    fn a_note_keeps_its_head_and_the_end_of_its_context_within_the_cap() {
        let n = bounded_note(
            "Attempt 1 failed: tier 2",
            "line one\nline two\nTOKEN-é",
            40,
        );
        assert!(n.len() <= 40, "{n}");
        assert!(n.starts_with("Attempt 1 failed: tier 2\n\n"), "{n}");
        assert!(n.ends_with("TOKEN-é"), "the end is kept: {n}");
        assert_eq!(bounded_note("head", "", 100), "head");
        assert!(bounded_note(&"x".repeat(50), "ctx", 10).len() <= 10);
    }
}
