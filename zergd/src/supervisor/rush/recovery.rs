//! Re-adoption after zergd restarts: given what the launcher observed of the rush's workers,
//! decide which ones to keep (and watch again), which ones died while zergd was down, and which
//! ones nobody knows. Pure: the actor shell asks the launcher and carries out the decision.

use super::*;
use crate::launcher::Discovered;

impl Rush {
    /// The handle each slot's current generation was recorded with, completed by what discovery
    /// found (a container id the state did not get to save).
    pub fn recorded_workers(&self, discovered: &[Discovered]) -> Vec<(u32, u64, Spawned)> {
        self.doc
            .workers
            .values()
            .map(|w| {
                let mut sp = Spawned {
                    pid: w.pid,
                    start_time: w.pid_start_time,
                    container_id: w.container_id.clone(),
                };
                if sp.container_id.is_none()
                    && let Some(d) = discovered
                        .iter()
                        .find(|d| d.worker_id == w.worker_id && d.generation == w.generation)
                {
                    sp = d.spawned.clone();
                }
                (w.worker_id, w.generation, sp)
            })
            .collect()
    }

    /// Resumes the rush after a restart: live workers keep their leases and get `grace` to
    /// reconnect, dead ones are handled as exits, in-progress tasks restart their progress
    /// clock, and a merge that was running is run again (it is idempotent).
    pub fn readopt(
        &mut self,
        observed: &Observed,
        grace: Duration,
        now: Instant,
        wall: SystemTime,
        fx: &mut Effects,
    ) -> Readoption {
        self.event(
            wall,
            Source::Orchestrator,
            Level::Info,
            "rush_resumed",
            format!(
                "zergd restarted; resuming rush {} and re-adopting its workers (grace {:.0}s to reconnect)",
                self.feature(),
                grace.as_secs_f64()
            ),
            json!({}),
        );
        self.sandbox_event(wall);
        let mut out = Readoption::default();
        let workers = self.recorded_workers(&observed.discovered);
        for d in &observed.discovered {
            let known = workers
                .iter()
                .any(|(w, g, _)| *w == d.worker_id && *g == d.generation);
            if !known {
                out.orphans.push(d.spawned.clone());
            }
        }
        let state = self.state();
        for (w, generation, sp) in workers {
            let alive = observed.alive.get(&w).copied().unwrap_or(false);
            let status = self.worker_status(w).unwrap_or_default();
            let rt = self.rt_workers.entry(w).or_default();
            if alive && state != RushState::Paused {
                rt.spawned = Some(sp.clone());
                rt.registered = false;
                rt.reconnect_by = Some(now + grace);
                rt.last_hb = Some(now);
                out.watch.push((w, generation, sp));
            } else if state == RushState::Running {
                let settled = matches!(
                    status,
                    WorkerStatus::Done
                        | WorkerStatus::GaveUp
                        | WorkerStatus::Blocked
                        | WorkerStatus::Exited
                        | WorkerStatus::Backoff
                );
                if !settled {
                    rt.spawned = Some(sp.clone());
                    if sp.container_id.is_some() {
                        // An exited container still holds its exit code: the launcher reports
                        // it (or that the container vanished) and removes it.
                        out.watch.push((w, generation, sp));
                    } else {
                        self.on_exit(w, generation, ExitInfo::Vanished, now, wall, fx);
                    }
                } else if status == WorkerStatus::Backoff {
                    rt.spawn_due = Some(now);
                }
            }
        }
        // Tasks in progress keep their leases; their progress clock restarts now.
        let restart: Vec<(String, bool)> = self
            .doc
            .tasks
            .iter()
            .filter(|(_, t)| matches!(t.status, TaskStatus::InProgress | TaskStatus::WaitingRetry))
            .map(|(id, t)| (id.clone(), t.status == TaskStatus::WaitingRetry))
            .collect();
        for (t, waiting) in restart {
            self.rt_tasks.insert(
                t,
                TaskRt {
                    last_progress: now,
                    last_output_ms: 0,
                    last_step: None,
                    retry_due: waiting.then_some(now),
                },
            );
        }
        if self.state() == RushState::Running {
            // A merge that was running when zergd died is simply run again.
            self.check_level_done(now, wall, fx);
        }
        self.dirty = true;
        out
    }
}
