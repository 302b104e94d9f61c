//! Recovery after a restart: every unfinished rush is reloaded, live workers are re-adopted
//! and the rest are treated as crashed.

use super::effects::exit_sink;
use super::*;

impl Supervisor {
    /// Loads every unfinished rush from the registry and resumes it: live workers are
    /// re-adopted (pid plus start time, or container labels) and get a grace period to
    /// reconnect; dead ones are treated as crashed.
    pub(super) async fn recover(&mut self) {
        let reg = Registry::load(&self.settings.registry_path);
        let now = self.clock.now();
        let wall = self.clock.wall();
        for e in reg.rushes {
            if e.state.is_terminal() && !e.summary.is_empty() {
                // Ended while zergd ran: listed from its entry, loaded when a command asks.
                if e.summary.mode != Mode::Subprocess {
                    // Its containers may have outlived a zergd killed as the rush ended.
                    let (repo, feature) = (PathBuf::from(&e.repo), e.feature.clone());
                    self.sweep_ended(&e.rush_id, e.summary.mode, repo, feature);
                }
                self.parked.insert(e.rush_id.clone(), e);
                continue;
            }
            let mut r = match super::park::load_rush(&e, now) {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(why) => {
                    tracing::error!(error = %why, feature = %e.feature, "cannot load rush; skipping");
                    // zergctl status names the file and the problem instead of "no rush".
                    self.unloadable
                        .push((e.repo.clone(), e.feature.clone(), why));
                    continue;
                }
            };
            if r.doc.rush.state.is_active() {
                if let Err(err) = self.prepare_remote(r.doc.rush.mode, &r.config) {
                    tracing::error!(rush = %e.rush_id, error = %err.message(), "remote workers of this rush cannot reconnect");
                }
                self.ensure_plane(&e.rush_id);
                self.readopt(&mut r, now, wall).await;
            } else if r.doc.rush.mode != Mode::Subprocess {
                // A rush that ended while zergd was down leaves no container behind either.
                let (repo, feature) = (r.paths.repo.clone(), r.doc.feature.clone());
                self.sweep_ended(&e.rush_id, r.doc.rush.mode, repo, feature);
            }
            self.rushes.insert(e.rush_id.clone(), r);
        }
    }

    /// Removes every container, service or Job of an ended rush (in the background).
    pub(super) fn sweep_ended(&self, rush_id: &str, mode: Mode, repo: PathBuf, feature: String) {
        let launchers = self.launchers.clone();
        let rid = rush_id.to_string();
        tokio::spawn(async move {
            let Ok(l) = launchers.get(mode).await else {
                return;
            };
            for d in l.discover(&rid).await {
                l.stop(d.spawned.clone(), Duration::ZERO).await;
                l.cleanup(d.spawned).await;
            }
            super::effects::remove_rush_area(repo, feature).await;
        });
    }

    pub(super) async fn readopt(
        &mut self,
        r: &mut Rush,
        now: Instant,
        wall: std::time::SystemTime,
    ) {
        let launcher = self.launchers.get(r.doc.rush.mode).await.ok();
        // At least 10 s: agents retry their connection with a backoff capped at 5 s.
        let grace = r
            .config
            .workers
            .heartbeat_stale_threshold
            .max(Duration::from_secs(10));
        let rid = r.id().to_string();
        // Ask the launcher what is there; the state machine decides what it means.
        let mut observed = rush::Observed::default();
        if let Some(l) = &launcher {
            observed.discovered = l.discover(&rid).await;
            for (w, _, sp) in r.recorded_workers(&observed.discovered) {
                let alive = (sp.pid.is_some() || sp.container_id.is_some()) && l.is_alive(sp).await;
                observed.alive.insert(w, alive);
            }
        }
        let mut fx = Effects::default();
        let out = r.readopt(&observed, grace, now, wall, &mut fx);
        if let Some(l) = &launcher {
            for sp in out.orphans {
                let l = l.clone();
                tokio::spawn(async move {
                    l.stop(sp.clone(), Duration::ZERO).await;
                    l.cleanup(sp).await;
                });
            }
            for (w, generation, sp) in out.watch {
                l.watch(sp, exit_sink(&self.tx, &rid, w, generation));
            }
        }
        self.pending.push((rid, fx));
    }
}

/// The unresolved escalations of a rush's tasks from `.zerg/state/escalations.json`.
pub(super) fn load_escalations(r: &Rush) -> Vec<Escalation> {
    let path = r.paths.state_dir.join("escalations.json");
    let Some(doc) = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
    else {
        return Vec::new();
    };
    doc["escalations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| !e["resolved"].as_bool().unwrap_or(false))
        .filter(|e| {
            e["task_id"]
                .as_str()
                .is_some_and(|t| r.doc.tasks.contains_key(t))
        })
        .map(|e| Escalation {
            worker_id: e["worker_id"].as_u64().unwrap_or(0) as u32,
            task_id: e["task_id"].as_str().unwrap_or("").to_string(),
            category: e["category"].as_str().unwrap_or("").to_string(),
            message: e["message"].as_str().unwrap_or("").to_string(),
            timestamp: e["timestamp"].as_str().unwrap_or("").to_string(),
            context_json: e.get("context").map(|c| c.to_string()).unwrap_or_default(),
        })
        .collect()
}

/// Appends escalations to `.zerg/state/escalations.json` under its lock.
pub(super) fn append_escalations(state_dir: &Path, list: &[Escalation]) {
    let path = state_dir.join("escalations.json");
    let lock_path = state_dir.join("escalations.lock");
    let Ok(lock) = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
    else {
        return;
    };
    let Ok(_guard) = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive) else {
        return;
    };
    let mut doc: serde_json::Value = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| serde_json::json!({"escalations": []}));
    if !doc["escalations"].is_array() {
        doc["escalations"] = serde_json::json!([]);
    }
    if let Some(arr) = doc["escalations"].as_array_mut() {
        for e in list {
            arr.push(serde_json::json!({
                "worker_id": e.worker_id,
                "task_id": e.task_id,
                "timestamp": e.timestamp,
                "category": e.category,
                "message": e.message,
                "context": serde_json::from_str::<serde_json::Value>(&e.context_json)
                    .ok()
                    .filter(|v| v.is_object())
                    .unwrap_or_else(|| serde_json::json!({})),
                "resolved": false,
            }));
        }
    }
    let bytes = serde_json::to_vec_pretty(&doc).unwrap_or_default();
    if let Err(e) = crate::state::write_atomic(state_dir, &path, &bytes, None) {
        tracing::warn!(error = %e, "cannot write escalations.json");
    }
}
