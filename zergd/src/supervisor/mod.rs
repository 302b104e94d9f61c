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
use crate::launcher::container::ContainerLauncher;
use crate::launcher::subprocess::{SubprocessLauncher, same_process};
use crate::launcher::{ContainerSpec, ExitInfo, Launcher, SpawnError, Spawned, WorkerSpec};
use crate::monitor::{Level, Monitor, Source};
use crate::state::{Registry, RegistryEntry, StateStore};
use rush::{Effects, MergeResult, Rush};

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

/// Everything the supervisor reacts to.
pub enum Event {
    /// A zergctl command.
    Control(ControlCmd),
    /// A worker RPC.
    Worker(WorkerCmd),
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
    /// The control socket (passed to workers).
    pub socket: PathBuf,
    /// The worker agent binary.
    pub agent_bin: PathBuf,
    /// zergd's list of rushes.
    pub registry_path: PathBuf,
}

/// The supervisor actor.
pub struct Supervisor {
    rushes: HashMap<String, Rush>,
    preparing: HashSet<(String, String)>,
    watchers: HashMap<String, Vec<mpsc::Sender<Result<v1::WatchEvent, Status>>>>,
    subprocess: Arc<dyn Launcher>,
    container: Option<Arc<dyn Launcher>>,
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
        Supervisor {
            rushes: HashMap::new(),
            preparing: HashSet::new(),
            watchers: HashMap::new(),
            subprocess,
            container,
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
                state: r.doc.rush.state.clone(),
            };
            reg.rushes
                .retain(|e| !(e.repo == entry.repo && e.feature == entry.feature));
            reg.rushes.push(entry);
        }
        if let Err(e) = reg.save(&self.settings.registry_path) {
            tracing::warn!(error = %e, "cannot save the rush registry");
        }
    }

    fn launcher_for(&self, mode: &str) -> Result<Arc<dyn Launcher>, SpawnError> {
        if mode == "container" {
            if let Some(c) = &self.container {
                return Ok(c.clone());
            }
            Err(SpawnError::new("container launcher not connected yet"))
        } else {
            Ok(self.subprocess.clone())
        }
    }

    fn run_effects(&mut self, rush_id: &str, fx: Effects) {
        for r in fx.replies {
            r();
        }
        let Some(r) = self.rushes.get(rush_id) else {
            return;
        };
        let mode = r.doc.rush.mode.clone();
        if !fx.escalations.is_empty() {
            let dir = r.paths.state_dir.clone();
            let list = fx.escalations.clone();
            tokio::task::spawn_blocking(move || append_escalations(&dir, &list));
        }
        for (w, generation) in fx.spawn {
            let spec = self.worker_spec(rush_id, w, generation);
            let tx = self.tx.clone();
            let rid = rush_id.to_string();
            let launcher = self.launcher_for(&mode);
            let container_missing = launcher.is_err() && mode == "container";
            let known = launcher.ok();
            tokio::spawn(async move {
                let launcher: Arc<dyn Launcher> = match known {
                    Some(l) => l,
                    None if container_missing => match ContainerLauncher::connect().await {
                        Ok(c) => Arc::new(c),
                        Err(e) => {
                            let _ = tx.send(Event::Spawned {
                                rush: rid,
                                worker: w,
                                generation,
                                result: Err(e),
                            });
                            return;
                        }
                    },
                    None => return,
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
        for (_, sp, grace) in fx.stop {
            if let Ok(l) = self.launcher_for(&mode) {
                tokio::spawn(async move {
                    l.stop(sp.clone(), grace).await;
                    l.cleanup(sp).await;
                });
            }
        }
        for (_, sp, grace) in fx.drain {
            if let Ok(l) = self.launcher_for(&mode) {
                tokio::spawn(async move {
                    // Give the worker the grace period to exit by itself, then stop it.
                    let deadline = Instant::now() + grace;
                    while Instant::now() < deadline && l.is_alive(sp.clone()).await {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    l.stop(sp.clone(), grace).await;
                    l.cleanup(sp).await;
                });
            }
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
        if fx.cleanup {
            let paths = r.paths.clone();
            let feature = r.doc.feature.clone();
            let pids: Vec<Spawned> = r
                .rt_workers
                .values()
                .filter_map(|w| w.spawned.clone())
                .collect();
            let wts: BTreeMap<u32, PathBuf> = r
                .doc
                .workers
                .values()
                .map(|w| (w.worker_id, PathBuf::from(&w.worktree_path)))
                .collect();
            let grace =
                crate::config::secs(r.config.workers.stop_grace_seconds) + Duration::from_secs(5);
            tokio::spawn(async move {
                // Wait until the workers have exited (they were told to) before removing their
                // worktrees.
                let deadline = Instant::now() + grace;
                while Instant::now() < deadline
                    && pids
                        .iter()
                        .any(|p| p.container_id.is_none() && same_process(p))
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let _ = tokio::task::spawn_blocking(move || {
                    jobs::cleanup_worktrees(&paths, &feature, &wts)
                })
                .await;
            });
        }
    }

    fn worker_spec(&self, rush_id: &str, w: u32, generation: u64) -> WorkerSpec {
        let r = &self.rushes[rush_id];
        let res = &r.config.resources;
        WorkerSpec {
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
            socket: self.settings.socket.clone(),
            agent_bin: self.settings.agent_bin.clone(),
            container: ContainerSpec {
                image: r.config.container.image.clone(),
                network: r.config.container.network.clone(),
                memory_bytes: parse_memory(&res.container_memory_limit).unwrap_or(4 << 30),
                cpus: res.container_cpu_limit,
                pids_limit: res.container_pids_limit,
            },
        }
    }

    // === Events ===

    async fn handle_event(&mut self, ev: Event) {
        let now = self.clock.now();
        let wall = self.clock.wall();
        match ev {
            Event::Control(c) => self.handle_control(c, now, wall),
            Event::Worker(c) => self.handle_worker(c, now, wall),
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
                    let mut n = 0;
                    self.with_rush(&id, |r, fx| n = r.stop(req.force, now, wall, fx));
                    let _ = reply.send(Ok(v1::StopReply {
                        workers_signalled: n,
                    }));
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
            },
            ControlCmd::Retry(req, reply) => match self.find(&req.repo, &req.feature) {
                Ok(id) => {
                    let mut res = Ok(vec![]);
                    self.with_rush(&id, |r, fx| {
                        res = r.retry(&req.task_ids, req.reset, now, wall, fx)
                    });
                    let _ = reply.send(res.map(|requeued| v1::RetryReply { requeued }));
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
            req.mode.clone()
        } else {
            "subprocess".to_string()
        };
        if mode != "subprocess" && mode != "container" {
            let _ = reply.send(Err(Status::invalid_argument(format!(
                "mode: '{mode}' is not subprocess or container"
            ))));
            return;
        }
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
                    let mut res = Ok(vec![]);
                    self.with_rush(&id, |r, fx| {
                        if mode_given {
                            r.doc.rush.mode = mode.clone();
                        }
                        res = r.retry(&[], false, now, wall, fx);
                    });
                    let mode = self
                        .rushes
                        .get(&id)
                        .map(|r| r.doc.rush.mode.clone())
                        .unwrap_or_default();
                    let _ = reply.send(res.map(|_| v1::RushReply {
                        rush_id: id,
                        warnings: vec![],
                        resumed: true,
                        mode,
                    }));
                    return;
                }
                _ => {
                    self.rushes.remove(&id);
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
                jobs::prepare_fresh(&repo, &req.feature, req.workers, &mode, &rush_id, wall);
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
        let mode = p.doc.rush.mode.clone();
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
                mode: mode.clone(),
            }),
        );
        let r = self.rushes.get_mut(&id).expect("inserted");
        r.start(now, wall, &mut fx);
        self.pending.push((id, fx));
    }

    fn handle_worker(&mut self, c: WorkerCmd, now: Instant, wall: std::time::SystemTime) {
        fn rush_of(r: &Option<v1::WorkerRef>) -> String {
            r.as_ref().map(|w| w.rush_id.clone()).unwrap_or_default()
        }
        let unknown = |id: &str| Status::not_found(format!("zergd knows no rush {id}"));
        match c {
            WorkerCmd::Register(req, reply) => {
                let id = rush_of(&req.worker);
                match self.rushes.get_mut(&id) {
                    Some(r) => {
                        let res = r.on_register(req, now, wall);
                        let mut fx = Effects::default();
                        fx.reply(reply, res);
                        self.pending.push((id, fx));
                    }
                    None => {
                        let _ = reply.send(Err(unknown(&id)));
                    }
                }
            }
            WorkerCmd::Lease(req, reply) => {
                let id = rush_of(&req.worker);
                if !self.rushes.contains_key(&id) {
                    let _ = reply.send(Err(unknown(&id)));
                    return;
                }
                self.with_rush(&id, |r, fx| r.on_lease(req, reply, now, wall, fx));
            }
            WorkerCmd::Heartbeat(req, reply) => {
                let id = rush_of(&req.worker);
                let res = match self.rushes.get_mut(&id) {
                    Some(r) => r.on_heartbeat(req, now, wall),
                    None => Err(unknown(&id)),
                };
                let _ = reply.send(res);
            }
            WorkerCmd::Complete(req, reply) => {
                let id = rush_of(&req.worker);
                self.reply_in(&id, reply, |r, fx| {
                    r.on_complete(req, now, wall, fx).map(|_| v1::Ack {})
                });
            }
            WorkerCmd::Fail(req, reply) => {
                let id = rush_of(&req.worker);
                self.reply_in(&id, reply, |r, fx| {
                    r.on_fail(req, now, wall, fx).map(|_| v1::Ack {})
                });
            }
            WorkerCmd::Escalate(req, reply) => {
                let id = rush_of(&req.worker);
                self.reply_in(&id, reply, |r, fx| {
                    r.on_escalate(req, wall, fx).map(|_| v1::Ack {})
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
                self.readopt(&mut r, now, wall).await;
            }
            self.rushes.insert(e.rush_id.clone(), r);
        }
    }

    async fn readopt(&mut self, r: &mut Rush, now: Instant, wall: std::time::SystemTime) {
        let mode = r.doc.rush.mode.clone();
        if mode == "container"
            && self.container.is_none()
            && let Ok(c) = ContainerLauncher::connect().await
        {
            self.container = Some(Arc::new(c));
        }
        let launcher = self.launcher_for(&mode).ok();
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
            if alive && r.doc.rush.state != "paused" {
                rt.spawned = Some(sp.clone());
                rt.registered = false;
                rt.reconnect_by = Some(now + grace);
                rt.last_hb = Some(now);
                if let Some(l) = &launcher {
                    l.watch(sp, exit_sink(&self.tx, &rid, w, generation));
                }
            } else if r.doc.rush.state == "running" {
                let status = r
                    .doc
                    .workers
                    .get(&w.to_string())
                    .map(|x| x.status.clone())
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
                } else if status == "backoff" {
                    rt.spawn_due = Some(now);
                }
            }
        }
        // Tasks in progress keep their leases; their progress clock restarts now.
        let in_progress: Vec<String> = r
            .doc
            .tasks
            .iter()
            .filter(|(_, t)| t.status == "in_progress")
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
            .filter(|(_, t)| t.status == "waiting_retry")
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
        if r.doc.rush.state == "running" {
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
