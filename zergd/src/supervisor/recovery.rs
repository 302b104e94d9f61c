//! Recovery after a restart: every unfinished rush is reloaded, live workers are re-adopted
//! and the rest are treated as crashed.

use super::effects::{exit_sink, object_import};
use super::*;

impl Supervisor {
    /// Loads every unfinished rush from the registry and resumes it: live workers are
    /// re-adopted (pid plus start time, or container labels) and get a grace period to
    /// reconnect; dead ones are treated as crashed.
    pub(super) async fn recover(&mut self) {
        let reg = Registry::load(&self.settings.registry_path);
        let now = self.clock.now();
        let wall = self.clock.wall();
        // Rushes whose gates ran in containers: only they can have left a gate container.
        let mut gated = Vec::new();
        for e in reg.rushes {
            if e.state.is_terminal() && !e.summary.is_empty() {
                // Ended while zergd ran: listed from its entry, loaded when a command asks.
                if e.summary.mode != Mode::Subprocess {
                    gated.push(e.rush_id.clone());
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
            if r.doc.rush.mode != Mode::Subprocess {
                gated.push(e.rush_id.clone());
            }
            if r.doc.rush.state.is_active() {
                clear_stale_locks(&r, wall);
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
        // Before the actor runs again, so no merge resumes before its old gate is gone.
        sweep_gates(gated).await;
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
        let import = object_import(r);
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
                l.watch(sp, exit_sink(&self.tx, &rid, w, generation, import.clone()));
            }
        }
        self.pending.push((rid, fx));
    }
}

/// Removes the gate containers a killed zergd left for `rushes` (nothing when no engine
/// answers, and no engine is asked when no rush ran in containers), before any of them
/// resumes: a merge it starts again must not lose its new gate container to the sweep.
async fn sweep_gates(rushes: Vec<String>) {
    if rushes.is_empty() {
        return;
    }
    let sweep = async {
        let Ok(docker) = zerg_launch::engine::connect_engine().await else {
            return;
        };
        for rid in rushes {
            let n = zerg_launch::gate::sweep(&docker, &rid).await;
            if n > 0 {
                tracing::info!(rush = %rid, containers = n, "removed gate containers a previous zergd left");
            }
        }
    };
    if tokio::time::timeout(Duration::from_secs(30), sweep)
        .await
        .is_err()
    {
        tracing::warn!(
            "the Docker engine did not answer in 30 s; gate containers a previous zergd left may remain"
        );
    }
}

/// Removes the ref and index locks a killed zergd left in a rush's repository (in the middle
/// of a level merge, say), which would make its next merge fail: those of the rush's branches
/// and of its staging worktree, older than this zergd.
fn clear_stale_locks(r: &Rush, started: std::time::SystemTime) {
    let Ok(common) = zerg_git::objects::common_dir_of(&r.paths.repo) else {
        return;
    };
    // The staging worktree's own git dir, from its `.git` file (`gitdir: <path>`).
    let staging = r.paths.staging_worktree();
    let staging_git = std::fs::read_to_string(staging.join(".git"))
        .ok()
        .and_then(|t| t.strip_prefix("gitdir:").map(|p| staging.join(p.trim())));
    for p in zerg_git::objects::clear_stale_locks(
        &common,
        &r.doc.feature,
        staging_git.as_deref(),
        started,
    ) {
        tracing::warn!(lock = %p.display(), rush = %r.id(), "removed a lock file a killed zergd left behind");
    }
}
