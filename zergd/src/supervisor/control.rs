//! zergctl's commands: finding a rush, starting or resuming one, status, watch, stop, retry.

use super::*;
use crate::calls::RepoIs;

impl Supervisor {
    /// The rush a command means: the newest rush of the feature (or of any feature, for an
    /// empty name) in the client's repository. Outside any repository, or when that repository
    /// has no such rush, a feature name that is unique among the rushes zergd knows picks that
    /// rush wherever it is; a name several repositories share lists them.
    pub(super) fn find(&self, key: &RushKey) -> Result<String, SupervisorError> {
        let feature = key.feature.as_str();
        let repo = match &key.repo_is {
            RepoIs::Registered => Ok(key.repo.clone()),
            RepoIs::Resolved(r) => r.clone().map_err(SupervisorError::invalid_argument),
            // Only a caller inside the process sends a path unresolved.
            RepoIs::Given => jobs::resolve_repo(&key.repo).map(|p| p.to_string_lossy().to_string()),
        };
        if let Ok(repo_s) = &repo {
            let newest = self
                .known()
                .filter(|r| r.repo == repo_s && (feature.is_empty() || r.feature == feature))
                .max_by(|a, b| a.started_at.cmp(b.started_at));
            if let Some(r) = newest {
                return Ok(r.id.to_string());
            }
            if let Some((_, _, why)) = self
                .unloadable
                .iter()
                .find(|(r, f, _)| r == repo_s && (feature.is_empty() || f == feature))
            {
                return Err(SupervisorError::failed_precondition(format!(
                    "zergd could not load this rush at startup: {why}"
                )));
            }
        }
        if !feature.is_empty() && key.repo_is != RepoIs::Registered {
            let mut named: Vec<park::Known<'_>> =
                self.known().filter(|r| r.feature == feature).collect();
            named.sort_by(|a, b| a.repo.cmp(b.repo));
            named.dedup_by(|a, b| a.repo == b.repo);
            match named.as_slice() {
                [one] => return Ok(one.id.to_string()),
                [] => {}
                many => {
                    let list: Vec<&str> = many.iter().map(|r| r.repo).collect();
                    return Err(SupervisorError::failed_precondition(format!(
                        "{} repositories have a rush named '{feature}': {}; run from one of them or pass --repo",
                        many.len(),
                        list.join(", ")
                    )));
                }
            }
        }
        Err(match (repo, feature.is_empty()) {
            (Err(e), true) => e,
            (Err(e), false) => SupervisorError::not_found(format!(
                "zergd knows no rush named '{feature}'; start one with `zergctl rush {feature}` in its repository ({})",
                e.message()
            )),
            (Ok(repo_s), true) => SupervisorError::not_found(format!(
                "no rush in {repo_s}; start one with `zergctl rush FEATURE`"
            )),
            (Ok(repo_s), false) => SupervisorError::not_found(format!(
                "no rush for feature '{feature}' in {repo_s}; start one with `zergctl rush {feature}`"
            )),
        })
    }

    /// The rush a command means, loaded whole (see [`Self::find`] and [`Self::unpark`]).
    fn find_whole(&mut self, key: &RushKey) -> Result<String, SupervisorError> {
        let id = self.find(key)?;
        self.unpark(&id)?;
        Ok(id)
    }

    pub(super) fn handle_control(
        &mut self,
        c: ControlCmd,
        now: Instant,
        wall: std::time::SystemTime,
    ) {
        match c {
            ControlCmd::Rush(req, reply) => self.start_rush(req, reply, now, wall),
            // Read-your-writes: the answer goes out after the state it shows is on disk.
            ControlCmd::Status(key, query) => match self.find_whole(&key) {
                Ok(id) => self.with_rush(&id, |r, fx| {
                    let send = query.answer(Ok(&r.view()));
                    fx.replies.push(Box::new(move |_| send()));
                }),
                Err(e) => query.answer(Err(e))(),
            },
            ControlCmd::List(reply) => {
                let _ = reply.send(Ok(self.summaries()));
            }
            ControlCmd::Watch(key, mut sink, reply) => match self.find_whole(&key) {
                Ok(id) => {
                    sink.send(None, Some(&self.rushes[&id].view()));
                    self.watchers.entry(id).or_default().push(super::Watcher {
                        sink,
                        sent_at: self.clock.now(),
                        owed: false,
                    });
                    let _ = reply.send(Ok(()));
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            ControlCmd::Stop(req, reply) => match self.find_whole(&req.key) {
                Ok(id) => {
                    // Replies only once the stopped state is on disk.
                    self.with_rush(&id, |r, fx| {
                        // An ended rush keeps its outcome: stopping a complete rush must not
                        // turn it into a stopped one (its workers exit by themselves). A failed
                        // or stopped rush can still be stopped while a worker runs (`--force`
                        // after a graceful stop).
                        let ended = r.state() == RushState::Complete
                            || (r.is_terminal() && r.live_workers().is_empty());
                        if ended {
                            let state = r.state();
                            let feature = r.feature().to_string();
                            fx.reply(
                                reply,
                                Err(SupervisorError::failed_precondition(format!(
                                    "rush {feature} is already {state}; there is nothing to stop"
                                ))),
                            );
                            return;
                        }
                        let n = r.stop(req.force, now, wall, fx);
                        fx.reply(reply, Ok(n));
                    });
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            ControlCmd::Retry(req, reply) => match self.find_whole(&req.key) {
                Ok(id) => {
                    // A retried rush runs again, and its workers need their plane.
                    self.ensure_plane(&id);
                    self.with_rush(&id, |r, fx| {
                        if let Some(m) = req.max_usd {
                            r.doc.rush.max_usd = Some(m);
                            r.dirty = true;
                        }
                        // The notes go first, so that an attempt leased by the retry carries them.
                        if let Some(text) = &req.note
                            && let Err(e) = r.note_retried(&req.task_ids, text, wall)
                        {
                            fx.reply(reply, Err(e));
                            return;
                        }
                        let res = r.retry(&req.task_ids, req.reset, now, wall, fx);
                        fx.reply(reply, res);
                    });
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            ControlCmd::Note(req, reply) => match self.find_whole(&req.key) {
                Ok(id) => {
                    if req.restart {
                        self.ensure_plane(&id);
                    }
                    self.with_rush(&id, |r, fx| {
                        let res = r.note(&req.task_id, req.text, req.restart, now, wall, fx);
                        fx.reply(reply, res);
                    });
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            ControlCmd::Prune(req, reply) => self.prune(req, reply, wall),
            ControlCmd::Land(req, reply) => match self.find_whole(&req.key) {
                Ok(id) => {
                    let r = &self.rushes[&id];
                    if r.state() != RushState::Complete {
                        let _ = reply.send(Err(SupervisorError::failed_precondition(format!(
                            "rush {} is {}: only a complete rush lands (see zergctl status {})",
                            r.feature(),
                            r.state(),
                            r.feature()
                        ))));
                        return;
                    }
                    let job = r.land_job(req.gates_only);
                    tokio::task::spawn_blocking(move || {
                        let _ = reply.send(super::land::land(&job));
                    });
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            ControlCmd::Shutdown(reply) => self.shutdown = Some(reply),
        }
    }

    pub(super) fn start_rush(
        &mut self,
        req: StartRush,
        reply: Reply<Started>,
        now: Instant,
        wall: std::time::SystemTime,
    ) {
        let Some((repo, repo_s, reply)) = park::resolved(&req.repo, reply) else {
            return;
        };
        let mode_given = req.mode.is_some();
        let mode = req.mode.unwrap_or(Mode::Subprocess);
        let existing = self
            .known()
            .find(|r| r.repo == repo_s && r.feature == req.feature)
            .map(|r| (r.id.to_string(), r.state));
        if let Some((id, state)) = existing {
            match state {
                RushState::Pending | RushState::Running | RushState::Paused => {
                    let _ = reply.send(Err(SupervisorError::already_exists(format!(
                        "rush {} is already {state}; see `zergctl status {}`, or `zergctl stop {}`",
                        req.feature, req.feature, req.feature
                    ))));
                    return;
                }
                RushState::Stopped | RushState::Failed => {
                    // Resume in place: the same graph snapshot, completed work kept.
                    if let Err(e) = self.unpark(&id) {
                        let _ = reply.send(Err(e));
                        return;
                    }
                    let ensure = {
                        let r = &self.rushes[&id];
                        let mode = if mode_given { mode } else { r.doc.rush.mode };
                        jobs::check_root(&r.config, mode)
                            .and_then(|()| {
                                crate::sandbox::check(&r.config, mode)
                                    .map_err(SupervisorError::failed_precondition)
                            })
                            .and_then(|()| {
                                jobs::ensure_worktrees(
                                    &r.paths,
                                    &r.doc.feature,
                                    r.doc.rush.workers,
                                    &r.doc.rush.staging_head,
                                    &r.doc.rush.base_commit,
                                    &r.config.worktree,
                                    jobs::gate_reader(mode, &r.config),
                                )
                            })
                    };
                    if let Err(e) = ensure {
                        let _ = reply.send(Err(e));
                        return;
                    }
                    self.ensure_plane(&id);
                    let rid = id.clone();
                    self.with_rush(&id, |r, fx| {
                        if mode_given {
                            r.doc.rush.mode = mode;
                        }
                        if let Some(m) = req.max_usd {
                            r.doc.rush.max_usd = Some(m);
                        }
                        let res = r.retry(&[], false, now, wall, fx);
                        let mode = r.doc.rush.mode;
                        let workers = r.doc.rush.workers;
                        fx.reply(
                            reply,
                            res.map(|_| Started {
                                rush_id: rid,
                                warnings: vec![],
                                resumed: true,
                                mode,
                                workers,
                            }),
                        );
                    });
                    return;
                }
                RushState::Complete => {
                    self.rushes.remove(&id);
                    self.parked.remove(&id);
                    self.close_plane(&id);
                }
            }
        }
        let key = (repo_s.clone(), req.feature.clone());
        if self.preparing.contains(&key) {
            let _ = reply.send(Err(SupervisorError::already_exists(format!(
                "rush {} is being prepared",
                req.feature
            ))));
            return;
        }
        self.preparing.insert(key);
        let tx = self.tx.clone();
        let rush_id = format!("{}-{:x}", req.feature, crate::clock::unix_millis(wall));
        tokio::task::spawn_blocking(move || {
            let result =
                jobs::prepare_fresh(&repo, &req.feature, req.workers, mode, &rush_id, wall);
            let _ = tx.send(Event::Prepared {
                req,
                result: Box::new(result),
                reply,
            });
        });
    }

    pub(super) fn on_prepared(
        &mut self,
        req: StartRush,
        result: Result<(jobs::Prepared, Vec<String>), SupervisorError>,
        reply: Reply<Started>,
        now: Instant,
        wall: std::time::SystemTime,
    ) {
        let repo_key = jobs::resolve_repo(&req.repo)
            .map(|p| p.to_string_lossy().to_string())
            .unwrap_or_default();
        self.preparing.remove(&(repo_key, req.feature.clone()));
        let (p, warnings) = match result {
            Ok(x) => x,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let id = p.doc.rush.rush_id.clone();
        if let Err(e) = self.prepare_remote(p.doc.rush.mode, &p.config) {
            let _ = reply.send(Err(e));
            return;
        }
        self.ensure_plane(&id);
        let mode = p.doc.rush.mode;
        let rush = Rush::new(p.doc, p.graph, p.config, p.paths, p.spec_context, now);
        self.rushes.insert(id.clone(), rush);
        let mut fx = Effects::default();
        fx.reply(
            reply,
            Ok(Started {
                rush_id: id.clone(),
                warnings,
                resumed: false,
                mode,
                workers: req.workers,
            }),
        );
        let r = self.rushes.get_mut(&id).expect("inserted");
        r.doc.rush.max_usd = req.max_usd.or(r.config.budget.max_usd);
        r.start(now, wall, &mut fx);
        self.pending.push((id, fx));
    }
}
