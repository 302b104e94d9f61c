//! Running what the state machine asked for once the state is saved: spawning, stopping and
//! draining workers, sweeping an ended rush's containers, merges, and the worker planes.

use super::escalations::append_escalations;
use super::*;

impl Supervisor {
    /// What a rush of `mode` needs before its workers start, if they are remote: the TCP plane
    /// (`config.remote`), and for kubernetes the launcher's settings (`config.kubernetes`; the
    /// first kubernetes rush's are kept). Nothing for the local modes.
    pub(super) fn prepare_remote(
        &mut self,
        mode: Mode,
        config: &crate::config::Config,
    ) -> Result<(), SupervisorError> {
        if !mode.is_remote() {
            return Ok(());
        }
        if mode == Mode::Kubernetes
            && let Ok(mut s) = self.launchers.kube_settings.lock()
            && s.is_none()
        {
            *s = Some(config.kubernetes.clone());
        }
        self.ensure_remote_plane(&config.remote)
    }

    /// Serves the TCP worker plane of remote workers with `cfg` (idempotent). One zergd serves
    /// one address at a time: a rush that asks for another while a remote rush held whole (one
    /// that runs, is paused, or still has a worker) uses the current one is told so; once none
    /// does, the old plane is closed and the new address served.
    fn ensure_remote_plane(
        &mut self,
        cfg: &crate::config::RemoteConfig,
    ) -> Result<(), SupervisorError> {
        if let Some(p) = &self.remote_plane
            && !p.task.is_finished()
        {
            if p.listen == cfg.listen && p.url == cfg.url() {
                return Ok(());
            }
            let in_use = self.rushes.values().any(|r| {
                r.doc.rush.mode.is_remote()
                    && r.config.remote.listen == p.listen
                    && r.config.remote.url() == p.url
            });
            if !in_use {
                // No rush held whole needs the old address any more: serve the new one.
                tracing::info!(listen = %p.listen, "no rush uses the TCP worker plane any more: closing it");
                p.task.abort();
                self.remote_plane = None;
                return self.ensure_remote_plane(cfg);
            }
            return Err(SupervisorError::failed_precondition(format!(
                "this zergd serves remote workers on {} ({}); remote.listen {} with remote.advertise_url {:?} needs that rush to end or zergd to restart",
                p.listen,
                p.url,
                cfg.listen,
                cfg.url()
            )));
        }
        let dir = self
            .settings
            .registry_path
            .parent()
            .unwrap_or(Path::new("."))
            .join("remote");
        let tls =
            crate::remote::tls_material(&dir, cfg).map_err(SupervisorError::failed_precondition)?;
        let task = self
            .settings
            .planes
            .serve_tcp(
                &cfg.listen,
                &tls,
                crate::incoming::Limits::tcp(cfg),
                self.handle(),
            )
            .map_err(|e| {
                SupervisorError::failed_precondition(format!(
                    "cannot serve the TCP worker plane on {} (remote.listen): {e}",
                    cfg.listen
                ))
            })?;
        tracing::info!(listen = %cfg.listen, url = %cfg.url(), "serving remote workers");
        self.remote_plane = Some(RemotePlane {
            listen: cfg.listen.clone(),
            url: cfg.url(),
            ca_pem: tls.ca_pem,
            task,
        });
        Ok(())
    }

    /// Serves the rush's worker plane (idempotent): its own socket, `Worker` only; and, for a
    /// remote rush, the TCP plane.
    pub(super) fn ensure_plane(&mut self, rush_id: &str) {
        if let Some((mode, config)) = self
            .rushes
            .get(rush_id)
            .filter(|r| r.doc.rush.mode.is_remote())
            .map(|r| (r.doc.rush.mode, r.config.clone()))
            && let Err(e) = self.prepare_remote(mode, &config)
        {
            tracing::error!(rush = rush_id, error = %e.message(), "remote workers of this rush cannot connect");
        }
        if self.planes.get(rush_id).is_some_and(|h| !h.is_finished()) {
            return;
        }
        match self.settings.planes.serve(rush_id, self.handle()) {
            Ok(h) => {
                self.planes.insert(rush_id.to_string(), h);
            }
            Err(e) => {
                tracing::error!(rush = rush_id, error = %e, "cannot serve the worker plane; workers of this rush cannot connect")
            }
        }
    }

    /// Stops serving a forgotten rush's worker plane and removes its socket directory.
    pub(super) fn close_plane(&mut self, rush_id: &str) {
        self.last_progress.retain(|(r, _), _| r != rush_id);
        if let Some(h) = self.planes.remove(rush_id) {
            h.abort();
        }
        if let Some(m) = self.monitors.remove(rush_id) {
            // Dropping it flushes its two files and ends their writer threads, which can take
            // a moment: not on the actor.
            tokio::task::spawn_blocking(move || drop(m));
        }
        self.settings.planes.remove(rush_id);
    }

    /// Carries out what a rush asked for. `unsaved` is why its state could not be written, if
    /// it could not: every reply then carries that error instead of its answer.
    pub(super) fn run_effects(
        &mut self,
        rush_id: &str,
        fx: Effects,
        unsaved: Option<&SupervisorError>,
    ) {
        for r in fx.replies {
            r(unsaved.cloned());
        }
        if !self.rushes.contains_key(rush_id) {
            return;
        }
        let spawns: Vec<(u32, u64, WorkerSpec)> = fx
            .spawn
            .iter()
            .filter_map(|&(w, g)| Some((w, g, self.worker_spec(rush_id, w, g)?)))
            .collect();
        // Each of these jobs answers with an event; the rush stays whole until it has.
        let jobs = spawns.len() + usize::from(fx.index.is_some()) + usize::from(fx.merge.is_some());
        for _ in 0..jobs {
            self.started_job(rush_id);
        }
        let r = &self.rushes[rush_id];
        let mode = r.doc.rush.mode;
        let base = r.doc.rush.base_commit.clone();
        let worktree_cfg = r.config.worktree.clone();
        if !fx.escalations.is_empty() {
            let dir = r.paths.state_dir.clone();
            let list = fx.escalations.clone();
            tokio::task::spawn_blocking(move || append_escalations(&dir, &list));
        }
        let import = object_import(r);
        let git = if spawns.is_empty() { None } else { r.git() };
        // A confined worker's host side (its private git dir, home and /tmp) and policy.
        let sandbox = match &r.sandbox {
            zerg_sandbox::Enforcement::Namespaces { bwrap, .. } if r.confined() => Some((
                bwrap.clone(),
                r.egress.clone(),
                r.config.agent.effective_command().first().cloned(),
                r.policy.clone(),
            )),
            _ => None,
        };
        for (w, generation, spec) in spawns {
            let import = import.clone();
            let git = git.clone();
            let tx = self.tx.clone();
            let rid = rush_id.to_string();
            let launchers = self.launchers.clone();
            let base = base.clone();
            let worktree_cfg = worktree_cfg.clone();
            let sandbox = sandbox.clone();
            tokio::spawn(async move {
                let result = async {
                    let launcher = launchers.get(mode).await?;
                    // The worktree, and for a container its host side, are made here:
                    // launchers do no git.
                    let spec = tokio::task::spawn_blocking(move || {
                        let mut spec = spec;
                        // Where a new worktree's branch starts: read in process, as nearly
                        // every spawn finds its worktree there already and never uses it.
                        let start = git
                            .and_then(|g| g.commit_id("HEAD"))
                            .or_else(|| crate::git::rev(&spec.repo, "HEAD"))
                            .unwrap_or_default();
                        let trusted = crate::git::Trusted::new(&spec.repo, &base);
                        crate::git::ensure_worktree(
                            &spec.repo,
                            &spec.worktree,
                            &spec.branch,
                            &start,
                            &trusted,
                        )
                        .map_err(|e| SpawnError::new(e.to_string()))?;
                        // Before a container's host side is prepared: the copies are then
                        // part of what it grants.
                        if !mode.is_remote() {
                            super::jobs::copy_ignored(
                                &spec.repo,
                                &worktree_cfg,
                                std::slice::from_ref(&spec.worktree),
                                None,
                            )
                            .map_err(|e| SpawnError::new(e.to_string()))?;
                        }
                        if mode == Mode::Container {
                            spec.container.host = Some(crate::container_host::prepare(&spec)?);
                        }
                        if let Some((bwrap, extra, cli, shown)) = &sandbox {
                            let s = crate::container_host::prepare_sandbox(
                                &spec,
                                extra,
                                cli.as_deref(),
                                bwrap,
                            )?;
                            *shown.lock().unwrap_or_else(|e| e.into_inner()) =
                                Some(s.policy.clone());
                            spec.sandbox = Some(s);
                        }
                        Ok::<_, SpawnError>(spec)
                    })
                    .await
                    .unwrap_or_else(|e| {
                        Err(SpawnError::new(format!("spawn preparation failed: {e}")))
                    })?;
                    let sink = exit_sink(&tx, &rid, w, generation, import);
                    launcher.spawn(spec, sink).await
                }
                .await;
                let _ = tx.send(Event::Spawned {
                    rush: rid,
                    worker: w,
                    generation,
                    result,
                });
            });
        }
        if let Some(job) = fx.index {
            let tx = self.tx.clone();
            let rid = rush_id.to_string();
            tokio::task::spawn_blocking(move || {
                let result = jobs::build_symbols(&job);
                let _ = tx.send(Event::Indexed {
                    rush: rid,
                    result: Box::new(result),
                });
            });
        }
        if let Some(job) = fx.merge {
            let gates = r.config.quality_gates.clone();
            let feature = r.doc.feature.clone();
            let repo = r.paths.repo.clone();
            let tx = self.tx.clone();
            let rid = rush_id.to_string();
            tokio::task::spawn_blocking(move || {
                let level = job.level;
                let started = std::time::Instant::now();
                let result = jobs::run_merge(&job, &gates, &feature);
                crate::metrics::METRICS.merged(result.outcome(), started.elapsed());
                // Level N+1's prompts show what level N wrote: the map moves onto the new
                // staging head before the next level is dispatched.
                let symbols = match (&result, &job.symbols) {
                    (MergeResult::Merged(head), Some((previous, settings))) => Some(
                        jobs::update_symbols(&repo, job.git.as_ref(), previous, head, settings),
                    ),
                    _ => None,
                };
                let _ = tx.send(Event::Merged {
                    rush: rid,
                    level,
                    result,
                    symbols,
                });
            });
        }
        let stops: Vec<(Spawned, Duration, bool)> = fx
            .stop
            .into_iter()
            .map(|(_, sp, g)| (sp, g, false))
            .chain(fx.drain.into_iter().map(|(_, sp, g)| (sp, g, true)))
            .collect();
        let cleanup = fx.cleanup.then(|| {
            let wts: BTreeMap<u32, PathBuf> = r
                .doc
                .workers
                .values()
                .map(|w| (w.worker_id, PathBuf::from(&w.worktree_path)))
                .collect();
            (r.paths.clone(), r.doc.feature.clone(), wts)
        });
        if stops.is_empty() && fx.sweep.is_none() && cleanup.is_none() {
            return;
        }
        let launchers = self.launchers.clone();
        let rid = rush_id.to_string();
        let sweep = fx.sweep;
        let area = r
            .private_git()
            .then(|| (r.paths.repo.clone(), r.doc.feature.clone()));
        tokio::spawn(async move {
            let launcher = match launchers.get(mode).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(rush = %rid, error = %e, "cannot stop the rush's workers");
                    return;
                }
            };
            let mut set = tokio::task::JoinSet::new();
            for (sp, grace, drain) in stops {
                let l = launcher.clone();
                set.spawn(async move {
                    if drain {
                        // Give the worker the grace period to exit by itself, then stop it.
                        let deadline = Instant::now() + grace;
                        while Instant::now() < deadline && l.is_alive(sp.clone()).await {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                    l.stop(sp.clone(), grace).await;
                    l.cleanup(sp).await;
                });
            }
            while set.join_next().await.is_some() {}
            // Whatever is still there (an exited container, one whose exit was never seen)
            // goes too; a resumed rush's newer generations are left alone.
            if let Some(upto) = sweep {
                let mut newer = false;
                for d in launcher.discover(&rid).await {
                    if upto.get(&d.worker_id).is_none_or(|g| d.generation <= *g) {
                        launcher.stop(d.spawned.clone(), Duration::ZERO).await;
                        launcher.cleanup(d.spawned).await;
                    } else {
                        newer = true;
                    }
                }
                // The rush's containers are gone: their private git dirs and homes go too.
                if let Some((repo, feature)) = area.filter(|_| !newer) {
                    remove_rush_area(repo, feature).await;
                }
            }
            if let Some((paths, feature, wts)) = cleanup {
                let _ = tokio::task::spawn_blocking(move || {
                    jobs::cleanup_worktrees(&paths, &feature, &wts)
                })
                .await;
            }
        });
    }

    pub(super) fn worker_spec(&self, rush_id: &str, w: u32, generation: u64) -> Option<WorkerSpec> {
        let r = self.rushes.get(rush_id)?;
        let token = r.rt_workers.get(&w)?.token.clone()?;
        Some(WorkerSpec {
            rush_id: rush_id.to_string(),
            feature: r.doc.feature.clone(),
            worker_id: w,
            generation,
            repo: r.paths.repo.clone(),
            worktree: r.paths.worker_worktree(w),
            branch: rush::worker_branch(&r.doc.feature, w),
            spec_dir: r.paths.spec_dir.clone(),
            state_dir: r.paths.state_dir.clone(),
            log_dir: r.paths.log_dir.clone(),
            socket: self.settings.planes.socket(rush_id),
            token,
            agent_bin: self.settings.agent_bin.clone(),
            container: r.container_spec(),
            env_passthrough: r.config.agent.env_passthrough.clone(),
            stop_grace: r.config.workers.stop_grace_seconds,
            sandbox: None,
            remote: match &self.remote_plane {
                Some(p) if r.doc.rush.mode.is_remote() => crate::launcher::RemoteSpec {
                    plane_url: p.url.clone(),
                    ca_pem: p.ca_pem.clone(),
                },
                _ => Default::default(),
            },
        })
    }
}

/// Where a container worker's git objects are taken from when it exits.
#[derive(Debug, Clone)]
pub(crate) struct ObjectImport {
    /// The repository (its common git dir is found from it).
    repo: PathBuf,
    /// The feature, which names the worker's private git dir.
    feature: String,
    /// The rush's limits (`container.max_object_size`, `container.max_pack_size`).
    limits: crate::git::objects::ImportLimits,
}

/// What to import from a rush's workers when they exit: for container mode only (swarm and
/// kubernetes workers push their objects; subprocess workers write the repository's).
pub(super) fn object_import(r: &Rush) -> Option<ObjectImport> {
    r.private_git().then(|| {
        ObjectImport::new(
            r.paths.repo.clone(),
            r.doc.feature.clone(),
            crate::git::import_limits(&r.config.container),
        )
    })
}

impl ObjectImport {
    /// The import of `feature`'s workers' objects into `repo` within `limits`.
    pub(crate) fn new(
        repo: PathBuf,
        feature: String,
        limits: crate::git::objects::ImportLimits,
    ) -> Self {
        Self {
            repo,
            feature,
            limits,
        }
    }
}

/// A sink that turns a worker's exit into an [`Event::Exited`]; a container worker's git
/// objects are imported (verified, within the rush's limits) first, so the supervisor sees its
/// last commit when it handles the exit.
pub(crate) fn exit_sink(
    tx: &mpsc::UnboundedSender<Event>,
    rush: &str,
    worker: u32,
    generation: u64,
    import: Option<ObjectImport>,
) -> crate::launcher::ExitSink {
    let tx = tx.clone();
    let rush = rush.to_string();
    let runtime = tokio::runtime::Handle::current();
    Box::new(move |info| {
        let exited = Event::Exited {
            rush,
            worker,
            generation,
            info,
        };
        let Some(o) = import else {
            let _ = tx.send(exited);
            return;
        };
        runtime.spawn(async move {
            let r = tokio::task::spawn_blocking(move || {
                let common = crate::git::objects::common_dir_of(&o.repo)?;
                crate::git::objects::import_objects(&common, &o.feature, worker, o.limits)
            })
            .await;
            if let Ok(Err(e)) = r {
                tracing::warn!(worker, error = %e, "cannot import the worker's git objects");
            }
            let _ = tx.send(exited);
        });
    })
}

/// Removes what container mode made for a rush in the repository's git dir, once the rush has
/// ended and its containers are gone.
pub(super) async fn remove_rush_area(repo: PathBuf, feature: String) {
    let r = tokio::task::spawn_blocking(move || {
        crate::container_host::remove_rush_area(&repo, &feature)
    })
    .await;
    if let Ok(Err(e)) = r {
        tracing::warn!(error = %e, "cannot remove the rush's private git dirs and homes");
    }
}
