//! Worker RPCs: who is calling is settled first, then the call goes to the rush; reported
//! commits are checked off the actor before they are accepted.

use super::*;
use zerg_git::Expect;

/// How long the workers' compatible files may lag what their heartbeats said: updates within
/// it are written once.
const WORKER_FILES_WINDOW: std::time::Duration = std::time::Duration::from_millis(500);

impl Supervisor {
    pub(super) fn handle_worker(
        &mut self,
        auth: WorkerAuth,
        c: WorkerCmd,
        now: Instant,
        wall: std::time::SystemTime,
    ) {
        let me = c.caller().clone();
        // Who is calling is settled before anything looks at what it asks.
        let checked = match self.rushes.get(&auth.rush_id) {
            Some(r) => r.authorize(&auth, &me),
            None => Err(SupervisorError::not_found(format!(
                "zergd knows no rush {}",
                auth.rush_id
            ))),
        };
        if let Err(e) = checked {
            tracing::warn!(rush = %auth.rush_id, worker = me.worker, error = %e.message(), "worker RPC refused");
            c.refuse(e);
            return;
        }
        let id = auth.rush_id;
        match c {
            WorkerCmd::Register(req, reply) => {
                self.reply_in(&id, reply, |r, _| r.on_register(req, now, wall));
            }
            WorkerCmd::Lease(caller, reply) => {
                self.with_rush(&id, |r, fx| r.on_lease(&caller, reply, now, wall, fx));
            }
            WorkerCmd::Heartbeat(req, reply) => {
                let w = me.worker;
                let Some(r) = self.rushes.get_mut(&id) else {
                    return;
                };
                let res = r.on_heartbeat(req, now, wall);
                if res.is_ok()
                    && let Some((hb, progress)) = r.worker_files(w, wall)
                {
                    let dir = r.paths.state_dir.clone();
                    // The progress file changes far less often than the heartbeat: rewrite it
                    // only when it does.
                    let key = (id.clone(), w);
                    let progress = (self.last_progress.get(&key) != Some(&progress)).then(|| {
                        self.last_progress.insert(key, progress.clone());
                        progress
                    });
                    self.worker_files
                        .get_or_insert_with(|| {
                            crate::state::WorkerFileWriter::spawn(WORKER_FILES_WINDOW)
                        })
                        .write(dir, w, hb, progress);
                }
                let _ = reply.send(res);
            }
            WorkerCmd::Complete(req, reply) => {
                let check = self.rushes[&id].commit_check(&me, &req.lease);
                match check {
                    Ok(check) => self.verify(
                        &id,
                        check,
                        req.commit.clone(),
                        Pending::Complete(req, reply),
                    ),
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            WorkerCmd::Fail(req, reply) if req.checkpoint.is_some() => {
                let check = self.rushes[&id].commit_check(&me, &req.lease);
                match check {
                    Ok(check) => self.verify(
                        &id,
                        check,
                        req.checkpoint.clone().unwrap_or_default(),
                        Pending::Checkpoint(req, reply),
                    ),
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            WorkerCmd::Fail(req, reply) => {
                self.reply_in(&id, reply, |r, fx| r.on_fail(req, now, wall, fx));
            }
            WorkerCmd::Escalate(req, reply) => {
                self.reply_in(&id, reply, |r, fx| r.on_escalate(req, wall, fx));
            }
            WorkerCmd::LeaseFiles(caller, lease, reply) => {
                let rush = &self.rushes[&id];
                let files = rush.commit_check(&caller, &lease).map(|c| LeaseFiles {
                    artifacts: c.artifacts,
                    artifact_caps: c.artifact_caps,
                    max_pack: c.pack_limits.max_pack,
                    repo: rush.paths.repo.clone(),
                    worktree: rush.config.worktree.clone(),
                });
                let _ = reply.send(files);
            }
            WorkerCmd::FetchBase(caller, lease, haves, reply) => {
                match self.rushes[&id].commit_check(&caller, &lease) {
                    Ok(check) => {
                        tokio::task::spawn_blocking(move || {
                            let pack = base_pack(&check, &haves)
                                .map_err(SupervisorError::failed_precondition);
                            let _ = reply.send(pack);
                        });
                    }
                    Err(e) => drop(reply.send(Err(e))),
                }
            }
            WorkerCmd::PushObjects(caller, lease, commit, pack, reply) => {
                match self.rushes[&id].commit_check(&caller, &lease) {
                    Ok(check) => {
                        tokio::task::spawn_blocking(move || {
                            let _ = reply.send(Ok(receive_push(&check, &commit, pack)));
                        });
                    }
                    Err(e) => drop(reply.send(Err(e))),
                }
            }
            WorkerCmd::PushRefused(caller, lease, why, reply) => {
                self.reply_in(&id, reply, |r, _| {
                    r.push_refused(&caller, &lease, &why, wall)
                });
            }
            WorkerCmd::Egress(_, setup, reply) => {
                let _ = reply.send(self.rushes[&id].egress_allow(setup));
            }
            WorkerCmd::EgressSeen(caller, report, reply) => {
                self.reply_in(&id, reply, |r, _| {
                    r.egress_seen(&caller, &report, wall);
                    Ok(())
                });
            }
        }
    }

    /// Checks a reported commit off the actor thread (importing a container's objects first),
    /// then hands the report back as [`Event::Verified`].
    pub(super) fn verify(
        &mut self,
        rush: &str,
        check: CommitCheck,
        commit: String,
        pending: Pending,
    ) {
        self.started_job(rush);
        let tx = self.tx.clone();
        let rush = rush.to_string();
        tokio::task::spawn_blocking(move || {
            let result = verify_commit(&check, &commit, matches!(pending, Pending::Checkpoint(..)));
            let _ = tx.send(Event::Verified {
                rush,
                pending,
                result,
            });
        });
    }

    pub(super) fn on_verified(
        &mut self,
        rush: &str,
        pending: Pending,
        result: Result<(), String>,
        now: Instant,
        wall: std::time::SystemTime,
    ) {
        match pending {
            Pending::Complete(req, reply) => match result {
                Ok(()) => self.reply_in(rush, reply, |r, fx| r.on_complete(req, now, wall, fx)),
                Err(why) => self.reply_in(rush, reply, |r, fx| {
                    Err(r.refuse_commit(&req, &why, now, wall, fx))
                }),
            },
            Pending::Checkpoint(mut req, reply) => {
                if let Err(why) = result {
                    tracing::warn!(task = %req.lease.task_id, reason = %why, "checkpoint commit refused; the task restarts from scratch");
                    req.checkpoint = None;
                }
                self.reply_in(rush, reply, |r, fx| r.on_fail(req, now, wall, fx));
            }
        }
    }
}

/// [`zerg_git::Repo::check_task_commit`] for a worker's report, after importing what a
/// container wrote. An accepted commit also moves the worker's branch on the host (a container
/// cannot), with a compare-and-swap from the lease's base, and a checkpoint gets the ref that
/// keeps it reachable.
pub(super) fn verify_commit(
    check: &CommitCheck,
    commit: &str,
    checkpoint: bool,
) -> Result<(), String> {
    let git = super::jobs::repo_handle(check.git.as_ref(), &check.repo)?;
    if let Some(limits) = check.container
        && let Err(e) = crate::git::objects::import_objects(
            &crate::git::objects::common_dir_in(&git),
            &check.feature,
            check.worker,
            limits,
        )
    {
        return Err(format!("cannot import the worker's git objects: {e}"));
    }
    git.check_task_commit(&check.base, commit, &check.protected)?;
    if checkpoint && !check.base.is_empty() {
        git.check_checkpoint_line(&check.base, commit)?;
    }
    if checkpoint {
        let r = format!("refs/zerg/{}/wip/{}", check.feature, check.task);
        if let Err(e) = git.move_refs(&[(&r, commit, Expect::Any)], "zerg: checkpoint") {
            tracing::warn!(error = %e, "cannot keep the checkpoint reachable");
        }
    } else {
        let branch = format!("refs/heads/{}", check.branch);
        let expect = if check.base.is_empty() {
            Expect::Any
        } else {
            Expect::Is(check.base.clone())
        };
        // A subprocess worker commits on the branch itself: then it is there already, and
        // reading it spares a lock file made and removed per task. Moved on meanwhile: the
        // compare-and-swap leaves it.
        if git.points_at(&branch, commit) {
            return Ok(());
        }
        if let Err(e) = git.move_refs(&[(&branch, commit, expect)], "zerg: task commit") {
            tracing::debug!(error = %e, "worker branch not moved (it is there already, or moved meanwhile)");
        }
    }
    Ok(())
}

/// Builds the pack of what a worker lacks for `check`'s base (and the checkpoint it resumes
/// from, with that checkpoint's parent, which applying it needs), in a temporary file.
///
/// A checkpoint was checked when it was reported to be a line of single-parent commits on the
/// base of the lease that reported it (which is not this lease's base: another worker may
/// resume it). Here it is sent only if it still has exactly one parent, so that the pack never
/// holds the tree of a commit behind a base through a merge (one recorded by an older zergd);
/// otherwise the task starts from its base.
fn base_pack(check: &CommitCheck, haves: &[String]) -> Result<BasePack, String> {
    if check.base.is_empty() {
        return Err("the lease has no base commit to fetch".into());
    }
    let git = super::jobs::repo_handle(check.git.as_ref(), &check.repo)?;
    let mut wants = vec![check.base.clone()];
    if !check.resume_from.is_empty() {
        let parents = git.parents(&check.resume_from).map_err(|e| e.to_string())?;
        if let [parent] = parents.as_slice() {
            wants.push(check.resume_from.clone());
            wants.push(parent.clone());
        } else {
            tracing::warn!(task = %check.task, checkpoint = %check.resume_from, parents = parents.len(), "the checkpoint is not sent (it is not a commit with one parent); the task starts from its base");
        }
    }
    let objects = git
        .snapshot_objects(&wants, haves)
        .map_err(|e| e.to_string())?;
    let file = tempfile::tempfile().map_err(|e| format!("cannot make a temporary file: {e}"))?;
    let size = git
        .write_pack(&objects, file.try_clone().map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    Ok(BasePack {
        file,
        shallow: wants,
        sha256: git.is_sha256(),
        size,
    })
}

/// Indexes a pushed pack in quarantine, checks the commit there (the same check as a
/// [`verify_commit`]), and moves the pack into the
/// repository; returns how many objects it held.
fn receive_push(check: &CommitCheck, commit: &str, pack: std::fs::File) -> Result<u64, String> {
    let git = super::jobs::repo_handle(check.git.as_ref(), &check.repo)?;
    let common = crate::git::objects::common_dir_in(&git);
    let incoming = zerg_git::transfer::Incoming::index(&common, pack, check.pack_limits)?;
    let q = incoming
        .repo()
        .map_err(|e| format!("cannot open the quarantine: {e}"))?;
    q.check_task_commit(&check.base, commit, &check.protected)?;
    let n = incoming.objects_count as u64;
    incoming.accept(&common)?;
    Ok(n)
}
