//! The supervisor: one actor that owns every rush's state and reacts to events.
//!
//! Event sources are control commands (from zergctl), worker RPCs (from agents), worker exits
//! (from the launchers, the moment they happen), finished background jobs (prepare, spawn,
//! merge) and one timer that fires when the earliest deadline of any rush is due. Each event is
//! handed to the rush's synchronous state machine ([`rush::Rush`]); the effects it asks for run
//! after the state has been saved, so a reply never announces something a crash could lose.

pub mod jobs;
pub mod rush;
pub mod status;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tonic::Status;
use zerg_proto::v1;

use crate::clock::Clock;
use crate::config::parse_memory;
use crate::domain::{Mode, RushState, TaskStatus, WorkerStatus};
use crate::launcher::container::ContainerLauncher;
use crate::launcher::subprocess::SubprocessLauncher;
use crate::launcher::{ContainerSpec, ExitInfo, Launcher, SpawnError, Spawned, WorkerSpec};
use crate::monitor::{Level, Monitor, Source};
use crate::state::{Registry, RegistryEntry, StateStore};
use crate::worker_plane::WorkerAuth;
use rush::{CommitCheck, Effects, MergeResult, Rush};

/// Reply channel type.
pub type Reply<T> = oneshot::Sender<Result<T, Status>>;

/// Commands from zergctl.
pub enum ControlCmd {
    /// Start or resume a rush.
    Rush(v1::RushRequest, Reply<v1::RushReply>),
    /// Status of a rush.
    Status(v1::StatusRequest, Reply<v1::RushStatus>),
    /// All rushes.
    List(Reply<v1::ListReply>),
    /// Subscribe to a rush's status.
    Watch(
        v1::WatchRequest,
        Reply<mpsc::Receiver<Result<v1::WatchEvent, Status>>>,
    ),
    /// Stop a rush.
    Stop(v1::StopRequest, Reply<v1::StopReply>),
    /// Requeue failed tasks.
    Retry(v1::RetryRequest, Reply<v1::RetryReply>),
    /// Exit zergd.
    Shutdown(Reply<v1::ShutdownReply>),
}

/// RPCs from worker agents.
pub enum WorkerCmd {
    /// A worker announces itself.
    Register(v1::RegisterRequest, Reply<v1::RegisterReply>),
    /// A worker asks for work.
    Lease(v1::LeaseRequest, Reply<v1::LeaseReply>),
    /// One heartbeat.
    Heartbeat(v1::HeartbeatRequest, Reply<()>),
    /// A task was committed.
    Complete(v1::CompleteRequest, Reply<v1::Ack>),
    /// A task did not finish.
    Fail(v1::FailRequest, Reply<v1::Ack>),
    /// An escalation.
    Escalate(v1::EscalateRequest, Reply<v1::Ack>),
}

/// A worker report whose commit is being checked in the background.
pub enum Pending {
    /// A completion.
    Complete(v1::CompleteRequest, Reply<v1::Ack>),
    /// A checkpoint (a failure report carrying a WIP commit).
    Checkpoint(v1::FailRequest, Reply<v1::Ack>),
}

impl WorkerCmd {
    /// Answers the call with an error without handling it.
    pub fn refuse(self, e: Status) {
        match self {
            WorkerCmd::Register(_, r) => drop(r.send(Err(e))),
            WorkerCmd::Lease(_, r) => drop(r.send(Err(e))),
            WorkerCmd::Heartbeat(_, r) => drop(r.send(Err(e))),
            WorkerCmd::Complete(_, r) => drop(r.send(Err(e))),
            WorkerCmd::Fail(_, r) => drop(r.send(Err(e))),
            WorkerCmd::Escalate(_, r) => drop(r.send(Err(e))),
        }
    }
}

/// Everything the supervisor reacts to.
pub enum Event {
    /// A zergctl command.
    Control(ControlCmd),
    /// A worker RPC, with who sent it as the worker plane saw it.
    Worker(WorkerAuth, WorkerCmd),
    /// A reported commit was checked (see [`crate::git::check_task_commit`]).
    Verified {
        /// Rush id.
        rush: String,
        /// The report.
        pending: Pending,
        /// `Err` says why the commit is refused.
        result: Result<(), String>,
    },
    /// A worker ended.
    Exited {
        /// Rush id.
        rush: String,
        /// Slot.
        worker: u32,
        /// Generation.
        generation: u64,
        /// How it ended.
        info: ExitInfo,
    },
    /// A spawn finished.
    Spawned {
        /// Rush id.
        rush: String,
        /// Slot.
        worker: u32,
        /// Generation.
        generation: u64,
        /// Outcome.
        result: Result<Spawned, SpawnError>,
    },
    /// A rush was prepared (or could not be).
    Prepared {
        /// The request.
        req: v1::RushRequest,
        /// The outcome.
        result: Box<Result<(jobs::Prepared, Vec<String>), Status>>,
        /// Where to answer.
        reply: Reply<v1::RushReply>,
    },
    /// A level merge finished.
    Merged {
        /// Rush id.
        rush: String,
        /// Level.
        level: u32,
        /// Outcome.
        result: MergeResult,
    },
}

/// A cheap handle for sending events to the supervisor.
#[derive(Clone)]
pub struct Handle {
    tx: mpsc::UnboundedSender<Event>,
}

impl Handle {
    /// Sends a command and waits for its reply.
    pub async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Event) -> Result<T, Status> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(make(tx))
            .map_err(|_| Status::unavailable("the supervisor is not running"))?;
        rx.await
            .map_err(|_| Status::unavailable("the supervisor stopped before answering"))?
    }
}

/// Static settings of the daemon.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The control socket; the worker-plane sockets live in `w/` beside it.
    pub socket: PathBuf,
    /// The worker agent binary.
    pub agent_bin: PathBuf,
    /// zergd's list of rushes.
    pub registry_path: PathBuf,
}

/// The launchers: subprocess, and one container launcher connected on first use and then kept
/// for the life of zergd, so every spawn, stop, drain and cleanup acts through the same one.
#[derive(Clone)]
struct Launchers {
    subprocess: Arc<dyn Launcher>,
    container: Arc<tokio::sync::OnceCell<Arc<dyn Launcher>>>,
}

impl Launchers {
    async fn get(&self, mode: Mode) -> Result<Arc<dyn Launcher>, SpawnError> {
        if mode != Mode::Container {
            return Ok(self.subprocess.clone());
        }
        self.container
            .get_or_try_init(|| async {
                ContainerLauncher::connect()
                    .await
                    .map(|c| Arc::new(c) as Arc<dyn Launcher>)
            })
            .await
            .cloned()
    }
}

/// The supervisor actor.
pub struct Supervisor {
    rushes: HashMap<String, Rush>,
    preparing: HashSet<(String, String)>,
    watchers: HashMap<String, Vec<mpsc::Sender<Result<v1::WatchEvent, Status>>>>,
    launchers: Launchers,
    planes: HashMap<String, tokio::task::JoinHandle<()>>,
    clock: Arc<dyn Clock>,
    settings: Settings,
    tx: mpsc::UnboundedSender<Event>,
    rx: mpsc::UnboundedReceiver<Event>,
    pending: Vec<(String, Effects)>,
    shutdown: Option<Reply<v1::ShutdownReply>>,
    next_tick: Option<Instant>,
}

impl Supervisor {
    /// A supervisor with the real launchers.
    pub fn new(settings: Settings, clock: Arc<dyn Clock>) -> Self {
        Self::with_launchers(settings, clock, Arc::new(SubprocessLauncher), None)
    }

    /// A supervisor with given launchers (tests pass fakes). Without a container launcher, one
    /// is connected on first use.
    pub fn with_launchers(
        settings: Settings,
        clock: Arc<dyn Clock>,
        subprocess: Arc<dyn Launcher>,
        container: Option<Arc<dyn Launcher>>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let cell = tokio::sync::OnceCell::new_with(container);
        Supervisor {
            rushes: HashMap::new(),
            preparing: HashSet::new(),
            watchers: HashMap::new(),
            launchers: Launchers {
                subprocess,
                container: Arc::new(cell),
            },
            planes: HashMap::new(),
            clock,
            settings,
            tx,
            rx,
            pending: Vec::new(),
            shutdown: None,
            next_tick: None,
        }
    }

    /// A handle for the gRPC layer.
    pub fn handle(&self) -> Handle {
        Handle {
            tx: self.tx.clone(),
        }
    }

    /// Runs until a Shutdown command arrives or every handle is dropped. Workers are left
    /// running on purpose: a restarted zergd re-adopts them.
    pub async fn run(mut self) {
        self.recover().await;
        loop {
            let deadline = self
                .next_tick
                .unwrap_or_else(|| self.clock.now() + Duration::from_secs(1));
            tokio::select! {
                ev = self.rx.recv() => match ev {
                    Some(ev) => self.handle_event(ev).await,
                    None => break,
                },
                // A due deadline needs no handling of its own: the tick below runs the timers.
                _ = tokio::time::sleep_until(deadline) => {}
            }
            while let Ok(ev) = self.rx.try_recv() {
                self.handle_event(ev).await;
            }
            // Timers, and the next deadline after whatever the events changed.
            self.tick();
            self.flush();
            if let Some(reply) = self.shutdown.take() {
                let _ = reply.send(Ok(v1::ShutdownReply {}));
                break;
            }
        }
    }

    fn tick(&mut self) {
        let now = self.clock.now();
        let wall = self.clock.wall();
        let mut next: Option<Instant> = None;
        let ids: Vec<String> = self.rushes.keys().cloned().collect();
        for id in ids {
            let mut fx = Effects::default();
            let r = self.rushes.get_mut(&id).expect("key");
            if let Some(n) = r.tick(now, wall, &mut fx) {
                next = Some(next.map_or(n, |x: Instant| x.min(n)));
            }
            self.pending.push((id, fx));
        }
        self.next_tick = next;
    }

    // === Persistence and effects ===

    /// Saves every changed rush, then runs the effects queued for it.
    fn flush(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        let mut changed_registry = false;
        for r in self.rushes.values_mut() {
            if r.dirty {
                let store = StateStore::new(&r.paths.state_dir, &r.doc.feature);
                if let Err(e) = store.save(&r.doc) {
                    tracing::error!(error = %e, rush = %r.id(), "cannot save state");
                }
                r.dirty = false;
                changed_registry = true;
                let msgs = std::mem::take(&mut r.messages);
                if let Some(ws) = self.watchers.get_mut(r.id()) {
                    // One event per line; the last one carries the new status.
                    let n = msgs.len().max(1);
                    let status = r.status();
                    for i in 0..n {
                        let ev = v1::WatchEvent {
                            status: (i + 1 == n).then(|| status.clone()),
                            message: msgs.get(i).cloned().unwrap_or_default(),
                        };
                        ws.retain(|w| w.try_send(Ok(ev.clone())).is_ok() || !w.is_closed());
                    }
                }
            }
        }
        if changed_registry {
            self.save_registry();
        }
        for (id, fx) in pending {
            self.run_effects(&id, fx);
        }
    }

    fn save_registry(&self) {
        let mut reg = Registry::load(&self.settings.registry_path);
        for r in self.rushes.values() {
            let entry = RegistryEntry {
                rush_id: r.id().to_string(),
                repo: r.doc.rush.repo.clone(),
                feature: r.doc.feature.clone(),
                state: r.doc.rush.state,
            };
            reg.rushes
                .retain(|e| !(e.repo == entry.repo && e.feature == entry.feature));
            reg.rushes.push(entry);
        }
        if let Err(e) = reg.save(&self.settings.registry_path) {
            tracing::warn!(error = %e, "cannot save the rush registry");
        }
    }

    /// Serves the rush's worker plane (idempotent): its own socket, `Worker` only.
    fn ensure_plane(&mut self, rush_id: &str) {
        if self.planes.get(rush_id).is_some_and(|h| !h.is_finished()) {
            return;
        }
        match crate::worker_plane::serve(&self.settings.socket, rush_id, self.handle()) {
            Ok(h) => {
                self.planes.insert(rush_id.to_string(), h);
            }
            Err(e) => {
                tracing::error!(rush = rush_id, error = %e, "cannot serve the worker plane; workers of this rush cannot connect")
            }
        }
    }

    /// Stops serving a forgotten rush's worker plane and removes its socket directory.
    fn close_plane(&mut self, rush_id: &str) {
        if let Some(h) = self.planes.remove(rush_id) {
            h.abort();
        }
        let _ = std::fs::remove_dir_all(crate::worker_plane::plane_dir(
            &self.settings.socket,
            rush_id,
        ));
    }

    fn run_effects(&mut self, rush_id: &str, fx: Effects) {
        for r in fx.replies {
            r();
        }
        let Some(r) = self.rushes.get(rush_id) else {
            return;
        };
        let mode = r.doc.rush.mode;
        if !fx.escalations.is_empty() {
            let dir = r.paths.state_dir.clone();
            let list = fx.escalations.clone();
            tokio::task::spawn_blocking(move || append_escalations(&dir, &list));
        }
        for (w, generation) in fx.spawn {
            let Some(spec) = self.worker_spec(rush_id, w, generation) else {
                continue;
            };
            let tx = self.tx.clone();
            let rid = rush_id.to_string();
            let launchers = self.launchers.clone();
            tokio::spawn(async move {
                let launcher = match launchers.get(mode).await {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = tx.send(Event::Spawned {
                            rush: rid,
                            worker: w,
                            generation,
                            result: Err(e),
                        });
                        return;
                    }
                };
                let wt = spec.worktree.clone();
                let repo = spec.repo.clone();
                let branch = spec.branch.clone();
                let ensure = tokio::task::spawn_blocking(move || {
                    let start = crate::git::rev(&repo, "HEAD").unwrap_or_default();
                    crate::git::ensure_worktree(&repo, &wt, &branch, &start)
                })
                .await;
                if let Ok(Err(e)) = ensure {
                    let _ = tx.send(Event::Spawned {
                        rush: rid,
                        worker: w,
                        generation,
                        result: Err(SpawnError::new(e.to_string())),
                    });
                    return;
                }
                let sink = exit_sink(&tx, &rid, w, generation);
                let result = launcher.spawn(spec, sink).await;
                let _ = tx.send(Event::Spawned {
                    rush: rid,
                    worker: w,
                    generation,
                    result,
                });
            });
        }
        if let Some(job) = fx.merge {
            let gates = r.config.quality_gates.clone();
            let feature = r.doc.feature.clone();
            let tx = self.tx.clone();
            let rid = rush_id.to_string();
            tokio::task::spawn_blocking(move || {
                let level = job.level;
                let result = jobs::run_merge(&job, &gates, &feature);
                let _ = tx.send(Event::Merged {
                    rush: rid,
                    level,
                    result,
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
                for d in launcher.discover(&rid).await {
                    if upto.get(&d.worker_id).is_none_or(|g| d.generation <= *g) {
                        launcher.stop(d.spawned.clone(), Duration::ZERO).await;
                        launcher.cleanup(d.spawned).await;
                    }
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

    fn worker_spec(&self, rush_id: &str, w: u32, generation: u64) -> Option<WorkerSpec> {
        let r = self.rushes.get(rush_id)?;
        let res = &r.config.resources;
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
            socket: crate::worker_plane::plane_socket(&self.settings.socket, rush_id),
            token,
            agent_bin: self.settings.agent_bin.clone(),
            container: ContainerSpec {
                image: r.config.container.image.clone(),
                network: r.config.container.network.clone(),
                memory_bytes: parse_memory(&res.container_memory_limit).unwrap_or(4 << 30),
                cpus: res.container_cpu_limit,
                pids_limit: res.container_pids_limit,
            },
        })
    }

    // === Events ===

    async fn handle_event(&mut self, ev: Event) {
        let now = self.clock.now();
        let wall = self.clock.wall();
        match ev {
            Event::Control(c) => self.handle_control(c, now, wall),
            Event::Worker(auth, c) => self.handle_worker(auth, c, now, wall),
            Event::Verified {
                rush,
                pending,
                result,
            } => self.on_verified(&rush, pending, result, now, wall),
            Event::Exited {
                rush,
                worker,
                generation,
                info,
            } => {
                self.with_rush(&rush, |r, fx| {
                    r.on_exit(worker, generation, info, now, wall, fx)
                });
            }
            Event::Spawned {
                rush,
                worker,
                generation,
                result,
            } => {
                self.with_rush(&rush, |r, fx| {
                    r.on_spawned(worker, generation, result, now, wall, fx)
                });
            }
            Event::Merged {
                rush,
                level,
                result,
            } => {
                self.with_rush(&rush, |r, fx| r.on_merged(level, result, now, wall, fx));
            }
            Event::Prepared { req, result, reply } => {
                self.on_prepared(req, *result, reply, now, wall)
            }
        }
    }

    fn with_rush(&mut self, id: &str, f: impl FnOnce(&mut Rush, &mut Effects)) {
        if let Some(r) = self.rushes.get_mut(id) {
            let mut fx = Effects::default();
            f(r, &mut fx);
            self.pending.push((id.to_string(), fx));
        }
    }

    fn find(&self, repo: &str, feature: &str) -> Result<String, Status> {
        let repo_path = jobs::resolve_repo(repo)?;
        let repo_s = repo_path.to_string_lossy().to_string();
        let mut matches: Vec<&Rush> = self
            .rushes
            .values()
            .filter(|r| {
                r.doc.rush.repo == repo_s && (feature.is_empty() || r.doc.feature == feature)
            })
            .collect();
        matches.sort_by(|a, b| a.doc.started_at.cmp(&b.doc.started_at));
        matches.last().map(|r| r.id().to_string()).ok_or_else(|| {
            if feature.is_empty() {
                Status::not_found(format!("no rush in {repo_s}; start one with `zergctl rush FEATURE`"))
            } else {
                Status::not_found(format!("no rush for feature '{feature}' in {repo_s}; start one with `zergctl rush {feature}`"))
            }
        })
    }

    fn handle_control(&mut self, c: ControlCmd, now: Instant, wall: std::time::SystemTime) {
        match c {
            ControlCmd::Rush(req, reply) => self.start_rush(req, reply, now, wall),
            ControlCmd::Status(req, reply) => {
                let res = self
                    .find(&req.repo, &req.feature)
                    .map(|id| self.rushes[&id].status());
                let _ = reply.send(res);
            }
            ControlCmd::List(reply) => {
                let mut rushes: Vec<v1::RushSummary> =
                    self.rushes.values().map(|r| r.summary()).collect();
                rushes.sort_by(|a, b| a.started_at.cmp(&b.started_at));
                let _ = reply.send(Ok(v1::ListReply { rushes }));
            }
            ControlCmd::Watch(req, reply) => match self.find(&req.repo, &req.feature) {
                Ok(id) => {
                    let (tx, rx) = mpsc::channel(64);
                    let first = v1::WatchEvent {
                        status: Some(self.rushes[&id].status()),
                        message: String::new(),
                    };
                    let _ = tx.try_send(Ok(first));
                    self.watchers.entry(id).or_default().push(tx);
                    let _ = reply.send(Ok(rx));
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            ControlCmd::Stop(req, reply) => match self.find(&req.repo, &req.feature) {
                Ok(id) => {
                    // Replies only once the stopped state is on disk.
                    self.with_rush(&id, |r, fx| {
                        let n = r.stop(req.force, now, wall, fx);
                        fx.reply(
                            reply,
                            Ok(v1::StopReply {
                                workers_signalled: n,
                            }),
                        );
                    });
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            ControlCmd::Retry(req, reply) => match self.find(&req.repo, &req.feature) {
                Ok(id) => {
                    self.with_rush(&id, |r, fx| {
                        let res = r.retry(&req.task_ids, req.reset, now, wall, fx);
                        fx.reply(reply, res.map(|requeued| v1::RetryReply { requeued }));
                    });
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            ControlCmd::Shutdown(reply) => self.shutdown = Some(reply),
        }
    }

    fn start_rush(
        &mut self,
        req: v1::RushRequest,
        reply: Reply<v1::RushReply>,
        now: Instant,
        wall: std::time::SystemTime,
    ) {
        let repo = match jobs::resolve_repo(&req.repo) {
            Ok(r) => r,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let repo_s = repo.to_string_lossy().to_string();
        let mode_given = !req.mode.is_empty();
        let mode = if mode_given {
            match req.mode.parse::<Mode>() {
                Ok(m) => m,
                Err(_) => {
                    let _ = reply.send(Err(Status::invalid_argument(format!(
                        "mode: '{}' is not subprocess or container",
                        req.mode.chars().take(64).collect::<String>()
                    ))));
                    return;
                }
            }
        } else {
            Mode::Subprocess
        };
        if req.workers == 0 || req.workers > 64 {
            let _ = reply.send(Err(Status::invalid_argument(
                "workers: must be between 1 and 64",
            )));
            return;
        }
        let existing = self
            .rushes
            .values()
            .find(|r| r.doc.rush.repo == repo_s && r.doc.feature == req.feature)
            .map(|r| (r.id().to_string(), r.state().to_string()));
        if let Some((id, state)) = existing {
            match state.as_str() {
                "pending" | "running" | "paused" => {
                    let _ = reply.send(Err(Status::already_exists(format!(
                        "rush {} is already {state}; see `zergctl status {}`, or `zergctl stop {}`",
                        req.feature, req.feature, req.feature
                    ))));
                    return;
                }
                "stopped" | "failed" => {
                    // Resume in place: the same graph snapshot, completed work kept.
                    let ensure = {
                        let r = &self.rushes[&id];
                        jobs::ensure_worktrees(
                            &r.paths,
                            &r.doc.feature,
                            r.doc.rush.workers,
                            &r.doc.rush.staging_head,
                        )
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
                        let res = r.retry(&[], false, now, wall, fx);
                        let mode = r.doc.rush.mode.to_string();
                        fx.reply(
                            reply,
                            res.map(|_| v1::RushReply {
                                rush_id: rid,
                                warnings: vec![],
                                resumed: true,
                                mode,
                            }),
                        );
                    });
                    return;
                }
                _ => {
                    self.rushes.remove(&id);
                    self.close_plane(&id);
                }
            }
        }
        let key = (repo_s.clone(), req.feature.clone());
        if self.preparing.contains(&key) {
            let _ = reply.send(Err(Status::already_exists(format!(
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

    fn on_prepared(
        &mut self,
        req: v1::RushRequest,
        result: Result<(jobs::Prepared, Vec<String>), Status>,
        reply: Reply<v1::RushReply>,
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
        self.ensure_plane(&id);
        let mode = p.doc.rush.mode;
        let monitor = Monitor::open(&p.paths.repo, &p.doc.feature);
        let rush = Rush::new(
            p.doc,
            p.graph,
            p.config,
            p.paths,
            p.spec_context,
            monitor,
            now,
        );
        self.rushes.insert(id.clone(), rush);
        let mut fx = Effects::default();
        fx.reply(
            reply,
            Ok(v1::RushReply {
                rush_id: id.clone(),
                warnings,
                resumed: false,
                mode: mode.to_string(),
            }),
        );
        let r = self.rushes.get_mut(&id).expect("inserted");
        r.start(now, wall, &mut fx);
        self.pending.push((id, fx));
    }

    fn handle_worker(
        &mut self,
        auth: WorkerAuth,
        c: WorkerCmd,
        now: Instant,
        wall: std::time::SystemTime,
    ) {
        fn who(r: &Option<v1::WorkerRef>) -> v1::WorkerRef {
            r.clone().unwrap_or_default()
        }
        let me = match &c {
            WorkerCmd::Register(req, _) => who(&req.worker),
            WorkerCmd::Lease(req, _) => who(&req.worker),
            WorkerCmd::Heartbeat(req, _) => who(&req.worker),
            WorkerCmd::Complete(req, _) => who(&req.worker),
            WorkerCmd::Fail(req, _) => who(&req.worker),
            WorkerCmd::Escalate(req, _) => who(&req.worker),
        };
        // Who is calling is settled before anything looks at what it asks.
        let checked = match self.rushes.get(&auth.rush_id) {
            Some(r) => r.authorize(&auth, &me),
            None => Err(Status::not_found(format!(
                "zergd knows no rush {}",
                auth.rush_id
            ))),
        };
        if let Err(e) = checked {
            tracing::warn!(rush = %auth.rush_id, worker = me.worker_id, error = %e.message(), "worker RPC refused");
            c.refuse(e);
            return;
        }
        let id = auth.rush_id;
        match c {
            WorkerCmd::Register(req, reply) => {
                self.reply_in(&id, reply, |r, _| r.on_register(req, now, wall));
            }
            WorkerCmd::Lease(req, reply) => {
                self.with_rush(&id, |r, fx| r.on_lease(req, reply, now, wall, fx));
            }
            WorkerCmd::Heartbeat(req, reply) => {
                let w = me.worker_id;
                let Some(r) = self.rushes.get_mut(&id) else {
                    return;
                };
                let res = r.on_heartbeat(req, now, wall);
                if res.is_ok()
                    && let Some((hb, progress)) = r.worker_files(w, wall)
                {
                    let dir = r.paths.state_dir.clone();
                    tokio::task::spawn_blocking(move || {
                        crate::state::write_worker_files(&dir, w, &hb, &progress)
                    });
                }
                let _ = reply.send(res);
            }
            WorkerCmd::Complete(req, reply) => {
                let check = self.rushes[&id].commit_check(&me, &req.task_id, &req.lease_id);
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
            WorkerCmd::Fail(req, reply) if !req.checkpoint_commit.is_empty() => {
                let check = self.rushes[&id].commit_check(&me, &req.task_id, &req.lease_id);
                match check {
                    Ok(check) => self.verify(
                        &id,
                        check,
                        req.checkpoint_commit.clone(),
                        Pending::Checkpoint(req, reply),
                    ),
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            WorkerCmd::Fail(req, reply) => {
                self.reply_in(&id, reply, |r, fx| {
                    r.on_fail(req, now, wall, fx).map(|_| v1::Ack {})
                });
            }
            WorkerCmd::Escalate(req, reply) => {
                self.reply_in(&id, reply, |r, fx| {
                    r.on_escalate(req, wall, fx).map(|_| v1::Ack {})
                });
            }
        }
    }

    /// Checks a reported commit off the actor thread (importing a container's objects first),
    /// then hands the report back as [`Event::Verified`].
    fn verify(&self, rush: &str, check: CommitCheck, commit: String, pending: Pending) {
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

    fn on_verified(
        &mut self,
        rush: &str,
        pending: Pending,
        result: Result<(), String>,
        now: Instant,
        wall: std::time::SystemTime,
    ) {
        match pending {
            Pending::Complete(req, reply) => match result {
                Ok(()) => self.reply_in(rush, reply, |r, fx| {
                    r.on_complete(req, now, wall, fx).map(|_| v1::Ack {})
                }),
                Err(why) => self.reply_in(rush, reply, |r, fx| {
                    Err(r.refuse_commit(&req, &why, now, wall, fx))
                }),
            },
            Pending::Checkpoint(mut req, reply) => {
                if let Err(why) = result {
                    tracing::warn!(task = %req.task_id, reason = %why, "checkpoint commit refused; the task restarts from scratch");
                    req.checkpoint_commit.clear();
                }
                self.reply_in(rush, reply, |r, fx| {
                    r.on_fail(req, now, wall, fx).map(|_| v1::Ack {})
                });
            }
        }
    }

    /// Runs `f` on a rush and replies after the state is saved.
    fn reply_in<T: Send + 'static>(
        &mut self,
        id: &str,
        reply: Reply<T>,
        f: impl FnOnce(&mut Rush, &mut Effects) -> Result<T, Status>,
    ) {
        match self.rushes.get_mut(id) {
            Some(r) => {
                let mut fx = Effects::default();
                let res = f(r, &mut fx);
                fx.reply(reply, res);
                self.pending.push((id.to_string(), fx));
            }
            None => {
                let _ = reply.send(Err(Status::not_found(format!("zergd knows no rush {id}"))));
            }
        }
    }

    // === Recovery after a restart ===

    /// Loads every unfinished rush from the registry and resumes it: live workers are
    /// re-adopted (pid plus start time, or container labels) and get a grace period to
    /// reconnect; dead ones are treated as crashed.
    async fn recover(&mut self) {
        let reg = Registry::load(&self.settings.registry_path);
        let now = self.clock.now();
        let wall = self.clock.wall();
        for e in reg.rushes {
            let repo = PathBuf::from(&e.repo);
            let store = StateStore::new(&repo.join(".zerg").join("state"), &e.feature);
            let doc = match store.load() {
                Ok(Some(d)) if d.rush.rush_id == e.rush_id => d,
                Ok(_) => continue,
                Err(err) => {
                    tracing::error!(error = %err, feature = %e.feature, "cannot load rush state; skipping");
                    continue;
                }
            };
            let (graph, config, paths, spec_context) = match jobs::load_snapshot(&repo, &e.feature)
            {
                Ok(x) => x,
                Err(err) => {
                    tracing::error!(error = %err, feature = %e.feature, "cannot load rush snapshot; skipping");
                    continue;
                }
            };
            let active = matches!(doc.rush.state.as_str(), "running" | "pending" | "paused");
            let monitor = if active {
                Monitor::open(&repo, &e.feature)
            } else {
                Monitor::disabled(&e.feature)
            };
            let mut r = Rush::new(doc, graph, config, paths, spec_context, monitor, now);
            r.escalations = load_escalations(&r);
            r.dirty = false;
            if active {
                self.ensure_plane(&e.rush_id);
                self.readopt(&mut r, now, wall).await;
            } else if r.doc.rush.mode == Mode::Container {
                // A rush that ended while zergd was down leaves no container behind either.
                self.sweep_ended(&e.rush_id);
            }
            self.rushes.insert(e.rush_id.clone(), r);
        }
    }

    /// Removes every container of an ended rush (in the background).
    fn sweep_ended(&self, rush_id: &str) {
        let launchers = self.launchers.clone();
        let rid = rush_id.to_string();
        tokio::spawn(async move {
            let Ok(l) = launchers.get(Mode::Container).await else {
                return;
            };
            for d in l.discover(&rid).await {
                l.stop(d.spawned.clone(), Duration::ZERO).await;
                l.cleanup(d.spawned).await;
            }
        });
    }

    async fn readopt(&mut self, r: &mut Rush, now: Instant, wall: std::time::SystemTime) {
        let mode = r.doc.rush.mode;
        let launcher = self.launchers.get(mode).await.ok();
        // At least 10 s: agents retry their connection with a backoff capped at 5 s.
        let grace = crate::config::secs(r.config.workers.heartbeat_stale_threshold)
            .max(Duration::from_secs(10));
        let rid = r.id().to_string();
        r.event(
            wall,
            Source::Orchestrator,
            Level::Info,
            "rush_resumed",
            format!("zergd restarted; resuming rush {} and re-adopting its workers (grace {:.0}s to reconnect)", r.feature(), grace.as_secs_f64()),
            serde_json::json!({}),
        );
        // Containers of this rush that the state does not know (or knows as an older
        // generation) are orphans: remove them.
        let mut discovered = Vec::new();
        if let Some(l) = &launcher {
            discovered = l.discover(&rid).await;
        }
        let mut fx = Effects::default();
        let workers: Vec<(u32, u64, Spawned)> = r
            .doc
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
            .collect();
        for d in &discovered {
            let known = workers
                .iter()
                .any(|(w, g, _)| *w == d.worker_id && *g == d.generation);
            if !known && let Some(l) = &launcher {
                let l = l.clone();
                let sp = d.spawned.clone();
                tokio::spawn(async move {
                    l.stop(sp.clone(), Duration::ZERO).await;
                    l.cleanup(sp).await;
                });
            }
        }
        for (w, generation, sp) in workers {
            let alive = match (&launcher, sp.pid.is_some() || sp.container_id.is_some()) {
                (Some(l), true) => l.is_alive(sp.clone()).await,
                _ => false,
            };
            let rt = r.rt_workers.entry(w).or_default();
            if alive && r.doc.rush.state != RushState::Paused {
                rt.spawned = Some(sp.clone());
                rt.registered = false;
                rt.reconnect_by = Some(now + grace);
                rt.last_hb = Some(now);
                if let Some(l) = &launcher {
                    l.watch(sp, exit_sink(&self.tx, &rid, w, generation));
                }
            } else if r.doc.rush.state == RushState::Running {
                let status = r
                    .doc
                    .workers
                    .get(&w.to_string())
                    .map(|x| x.status)
                    .unwrap_or_default();
                if !matches!(
                    status.as_str(),
                    "done" | "gave_up" | "blocked" | "exited" | "backoff"
                ) {
                    rt.spawned = Some(sp.clone());
                    match (&launcher, sp.container_id.is_some()) {
                        // An exited container still holds its exit code: let the launcher
                        // report it (and remove the container).
                        (Some(l), true) => {
                            l.watch(sp, exit_sink(&self.tx, &rid, w, generation));
                        }
                        _ => r.on_exit(w, generation, ExitInfo::Vanished, now, wall, &mut fx),
                    }
                } else if status == WorkerStatus::Backoff {
                    rt.spawn_due = Some(now);
                }
            }
        }
        // Tasks in progress keep their leases; their progress clock restarts now.
        let in_progress: Vec<String> = r
            .doc
            .tasks
            .iter()
            .filter(|(_, t)| t.status == TaskStatus::InProgress)
            .map(|(id, _)| id.clone())
            .collect();
        for t in in_progress {
            r.rt_tasks.insert(
                t,
                rush::TaskRt {
                    last_progress: now,
                    last_output_ms: 0,
                    last_step: String::new(),
                    retry_due: None,
                },
            );
        }
        let waiting: Vec<String> = r
            .doc
            .tasks
            .iter()
            .filter(|(_, t)| t.status == TaskStatus::WaitingRetry)
            .map(|(id, _)| id.clone())
            .collect();
        for t in waiting {
            r.rt_tasks.insert(
                t,
                rush::TaskRt {
                    last_progress: now,
                    last_output_ms: 0,
                    last_step: String::new(),
                    retry_due: Some(now),
                },
            );
        }
        if r.doc.rush.state == RushState::Running {
            // A merge that was running when zergd died is simply run again (it is idempotent).
            r.check_level_done(now, wall, &mut fx);
        }
        r.dirty = true;
        self.pending.push((rid, fx));
    }
}

/// A sink that turns a worker's exit into an [`Event::Exited`].
fn exit_sink(
    tx: &mpsc::UnboundedSender<Event>,
    rush: &str,
    worker: u32,
    generation: u64,
) -> crate::launcher::ExitSink {
    let tx = tx.clone();
    let rush = rush.to_string();
    Box::new(move |info| {
        let _ = tx.send(Event::Exited {
            rush,
            worker,
            generation,
            info,
        });
    })
}

/// The unresolved escalations of a rush's tasks from `.zerg/state/escalations.json`.
fn load_escalations(r: &Rush) -> Vec<v1::Escalation> {
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
        .map(|e| v1::Escalation {
            worker_id: e["worker_id"].as_u64().unwrap_or(0) as u32,
            task_id: e["task_id"].as_str().unwrap_or("").to_string(),
            category: e["category"].as_str().unwrap_or("").to_string(),
            message: e["message"].as_str().unwrap_or("").to_string(),
            timestamp: e["timestamp"].as_str().unwrap_or("").to_string(),
            resolved: false,
            context_json: e.get("context").map(|c| c.to_string()).unwrap_or_default(),
        })
        .collect()
}

/// Appends escalations to `.zerg/state/escalations.json` under its lock.
fn append_escalations(state_dir: &Path, list: &[v1::Escalation]) {
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

/// [`crate::git::check_task_commit`] for a worker's report, after importing what a container
/// wrote. An accepted commit also moves the worker's branch on the host (a container cannot),
/// and a checkpoint gets the ref that keeps it reachable.
fn verify_commit(check: &CommitCheck, commit: &str, checkpoint: bool) -> Result<(), String> {
    if check.container
        && let Err(e) = crate::launcher::container::import_worker_objects(&check.repo, check.worker)
    {
        return Err(format!("cannot import the worker's git objects: {e}"));
    }
    crate::git::check_task_commit(&check.repo, &check.base, commit, &check.protected)?;
    if checkpoint {
        let r = format!("refs/zerg/{}/wip/{}", check.feature, check.task);
        if let Err(e) = crate::git::set_ref(&check.repo, &r, commit) {
            tracing::warn!(error = %e, "cannot keep the checkpoint reachable");
        }
    } else if crate::git::rev(&check.repo, &format!("refs/heads/{}", check.branch)).as_deref()
        != Some(commit)
    {
        let old = (!check.base.is_empty()).then_some(check.base.as_str());
        if let Err(e) = crate::git::move_branch(&check.repo, &check.branch, commit, old) {
            tracing::debug!(error = %e, "worker branch not moved (it moved meanwhile)");
        }
    }
    Ok(())
}
