//! The supervisor: one actor that owns every rush's state and reacts to events.
//!
//! Event sources are control commands (from zergctl), worker RPCs (from agents), worker exits
//! (from the launchers, the moment they happen), finished background jobs (prepare, spawn,
//! merge) and one timer that fires when the earliest deadline of any rush is due. Each event is
//! handed to the rush's synchronous state machine ([`rush::Rush`]); the effects it asks for run
//! after the state has been saved, so a reply never announces something a crash could lose.

mod control;
pub(crate) mod effects;
mod escalations;
pub mod jobs;
pub mod land;
mod park;
mod recovery;
pub mod rush;
#[cfg(test)]
mod tests;
mod worker_calls;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::calls::{
    BasePack, Beat, Caller, Completion, Escalation, EscalationReport, Failure, LeaseFiles,
    LeaseOutcome, LeaseRef, PruneReport, PruneRequest, Register, Registration, RetryTasks, RushKey,
    StartRush, Started, StatusQuery, StopRush, WatchSink, WorkerAuth,
};
use crate::error::SupervisorError;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::clock::Clock;
use crate::domain::{Mode, RushState};
use crate::launcher::container::ContainerLauncher;
use crate::launcher::subprocess::SubprocessLauncher;
use crate::launcher::{ExitInfo, Launcher, SpawnError, Spawned, WorkerSpec};
use crate::monitor::Monitor;
use crate::state::{Registry, RegistryEntry, StateStore, Summary};
use rush::{CommitCheck, Effects, MergeResult, Rush};

/// The least time between two status snapshots to one `Watch` client while the rush runs.
/// A snapshot of a large rush is megabytes, and a client that renders each one slows the rush
/// it watches; event lines are never held back, and the latest snapshot follows within this.
const SNAPSHOT_EVERY: Duration = Duration::from_millis(200);

/// One `Watch` client.
pub(super) struct Watcher {
    /// Where its updates go.
    pub sink: Box<dyn WatchSink>,
    /// When it was last sent a snapshot.
    pub sent_at: Instant,
    /// The rush changed since its last snapshot.
    pub owed: bool,
}

impl Watcher {
    /// How long until it may be sent a snapshot: `None` when it may be now.
    fn snapshot_wait(&self, running: bool, now: Instant) -> Option<Duration> {
        snapshot_wait(
            running,
            self.sink.drained(),
            now.saturating_duration_since(self.sent_at),
        )
    }
}

/// When a `Watch` client may be sent a snapshot: only once it has taken everything sent to it
/// (so at most one snapshot waits in its queue), and, while the rush runs, at most every
/// [`SNAPSHOT_EVERY`]. A snapshot of a rush that is not running (paused, ended: a follower may
/// wait for exactly that one) does not wait for the interval, but it waits for the queue too:
/// the batches of events after a rush ends (its workers' exits) would otherwise queue one whole
/// snapshot each. `since` is the time since its last snapshot; `None` means now.
fn snapshot_wait(running: bool, drained: bool, since: Duration) -> Option<Duration> {
    let interval = if running {
        SNAPSHOT_EVERY.saturating_sub(since)
    } else {
        Duration::ZERO
    };
    match (drained, interval.is_zero()) {
        (true, true) => None,
        // Not drained: look again a little later; the client takes its queue meanwhile.
        (false, _) => Some(interval.max(SNAPSHOT_EVERY / 4)),
        (true, false) => Some(interval),
    }
}

/// Reply channel type.
pub type Reply<T> = oneshot::Sender<Result<T, SupervisorError>>;

/// Commands from zergctl.
pub enum ControlCmd {
    /// Start or resume a rush.
    Rush(StartRush, Reply<Started>),
    /// The status of a rush, as the question projects it.
    Status(RushKey, StatusQuery),
    /// All rushes, by their registry entries.
    List(Reply<Vec<RegistryEntry>>),
    /// Subscribe to a rush's status: the sink gets a snapshot at once, then its lines.
    Watch(RushKey, Box<dyn WatchSink>, Reply<()>),
    /// Stop a rush; answers how many workers were signalled.
    Stop(StopRush, Reply<u32>),
    /// Requeue failed tasks; answers which.
    Retry(RetryTasks, Reply<Vec<String>>),
    /// Add the user's note to a task (and restart its attempt); answers what it did.
    Note(crate::calls::NoteTask, Reply<crate::calls::Noted>),
    /// Remove what ended rushes left on disk.
    Prune(PruneRequest, Reply<PruneReport>),
    /// Take a complete rush's staging branch into its base branch.
    Land(crate::calls::LandRush, Reply<crate::calls::Landed>),
    /// Exit zergd.
    Shutdown(Reply<()>),
}

/// RPCs from worker agents.
pub enum WorkerCmd {
    /// A worker announces itself.
    Register(Register, Reply<Registration>),
    /// A worker asks for work.
    Lease(Caller, Reply<LeaseOutcome>),
    /// One heartbeat.
    Heartbeat(Beat, Reply<()>),
    /// A task was committed.
    Complete(Completion, Reply<()>),
    /// A task did not finish.
    Fail(Failure, Reply<()>),
    /// An escalation.
    Escalate(EscalationReport, Reply<()>),
    /// Where a remote worker's files of its lease go, and how large a push may be.
    LeaseFiles(Caller, LeaseRef, Reply<LeaseFiles>),
    /// A remote worker fetches its lease's base, less the objects of the commits it has.
    FetchBase(Caller, LeaseRef, Vec<String>, Reply<BasePack>),
    /// A remote worker pushed the pack of `commit` (spooled to the file): checked in quarantine
    /// and moved in, answering how many objects it held, or why it is refused.
    PushObjects(
        Caller,
        LeaseRef,
        String,
        std::fs::File,
        Reply<Result<u64, String>>,
    ),
    /// A remote worker's pack was refused (recorded as an event, with the reason).
    PushRefused(Caller, LeaseRef, String, Reply<()>),
    /// A confined worker opens a connection through the egress proxy (`true`: for a
    /// `worktree.setup` command): the hosts it may reach, and those a setup command may reach
    /// as well.
    Egress(Caller, bool, Reply<(Vec<String>, Vec<String>)>),
    /// The egress proxy refused a confined worker's connection to this `host:port` (`true`:
    /// for a `worktree.setup` command), or let a setup command reach it (`false` refused).
    EgressSeen(Caller, crate::calls::EgressReport, Reply<()>),
}

/// A worker report whose commit is being checked in the background.
pub enum Pending {
    /// A completion.
    Complete(Completion, Reply<()>),
    /// A checkpoint (a failure report carrying a WIP commit).
    Checkpoint(Failure, Reply<()>),
}

impl WorkerCmd {
    /// Who the call says it comes from.
    pub fn caller(&self) -> &Caller {
        match self {
            WorkerCmd::Register(r, _) => &r.caller,
            WorkerCmd::Lease(c, _) => c,
            WorkerCmd::Heartbeat(b, _) => &b.caller,
            WorkerCmd::Complete(c, _) => &c.caller,
            WorkerCmd::Fail(f, _) => &f.caller,
            WorkerCmd::Escalate(e, _) => &e.caller,
            WorkerCmd::LeaseFiles(c, ..)
            | WorkerCmd::FetchBase(c, ..)
            | WorkerCmd::PushObjects(c, ..)
            | WorkerCmd::PushRefused(c, ..)
            | WorkerCmd::Egress(c, ..)
            | WorkerCmd::EgressSeen(c, ..) => c,
        }
    }

    /// Answers the call with an error without handling it.
    pub fn refuse(self, e: SupervisorError) {
        match self {
            WorkerCmd::Register(_, r) => drop(r.send(Err(e))),
            WorkerCmd::Lease(_, r) => drop(r.send(Err(e))),
            WorkerCmd::Heartbeat(_, r) => drop(r.send(Err(e))),
            WorkerCmd::Complete(_, r) => drop(r.send(Err(e))),
            WorkerCmd::Fail(_, r) => drop(r.send(Err(e))),
            WorkerCmd::Escalate(_, r) => drop(r.send(Err(e))),
            WorkerCmd::LeaseFiles(_, _, r) => drop(r.send(Err(e))),
            WorkerCmd::FetchBase(_, _, _, r) => drop(r.send(Err(e))),
            WorkerCmd::PushObjects(_, _, _, _, r) => drop(r.send(Err(e))),
            WorkerCmd::PushRefused(_, _, _, r) => drop(r.send(Err(e))),
            WorkerCmd::Egress(_, _, r) => drop(r.send(Err(e))),
            WorkerCmd::EgressSeen(_, _, r) => drop(r.send(Err(e))),
        }
    }
}

/// Everything the supervisor reacts to.
pub enum Event {
    /// A zergctl command.
    Control(ControlCmd),
    /// A worker RPC, with who sent it as the worker plane saw it.
    Worker(WorkerAuth, WorkerCmd),
    /// A reported commit was checked (see [`zerg_git::Repo::check_task_commit`]).
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
        req: StartRush,
        /// The outcome.
        result: Box<Result<(jobs::Prepared, Vec<String>), SupervisorError>>,
        /// Where to answer.
        reply: Reply<Started>,
    },
    /// A level merge finished.
    Merged {
        /// Rush id.
        rush: String,
        /// Level.
        level: u32,
        /// Outcome.
        result: MergeResult,
        /// The symbol map moved onto the merged head (`None` when the feature is off or the
        /// merge did not produce a head).
        symbols: Option<rush::Indexed>,
    },
    /// A rush's first symbol map was built (or could not be).
    Indexed {
        /// Rush id.
        rush: String,
        /// Outcome.
        result: Box<rush::Indexed>,
    },
}

/// A cheap handle for sending events to the supervisor.
#[derive(Clone)]
pub struct Handle {
    tx: mpsc::UnboundedSender<Event>,
}

impl Handle {
    /// Sends an event whose answer comes back some other way (a [`StatusQuery`]).
    pub fn send(&self, event: Event) -> Result<(), SupervisorError> {
        self.tx
            .send(event)
            .map_err(|_| SupervisorError::unavailable("the supervisor is not running"))
    }

    /// Sends a command and waits for its reply.
    pub async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Event) -> Result<T, SupervisorError> {
        let (tx, rx) = oneshot::channel();
        self.tx
            .send(make(tx))
            .map_err(|_| SupervisorError::unavailable("the supervisor is not running"))?;
        rx.await
            .map_err(|_| SupervisorError::unavailable("the supervisor stopped before answering"))?
    }
}

/// The worker planes, as the supervisor starts and stops them. The worker plane itself
/// (`worker_plane`, wired in by `run`) talks back only through the [`Handle`] it is given.
pub trait PlaneServer: std::fmt::Debug + Send + Sync + 'static {
    /// Serves the Unix plane of one rush (its own socket, the `Worker` service only).
    fn serve(&self, rush_id: &str, handle: Handle) -> std::io::Result<tokio::task::JoinHandle<()>>;
    /// Serves the TCP plane of remote workers on `listen`, with `tls`, its connections within
    /// `limits`.
    fn serve_tcp(
        &self,
        listen: &str,
        tls: &crate::remote::PlaneTls,
        limits: crate::incoming::Limits,
        handle: Handle,
    ) -> std::io::Result<tokio::task::JoinHandle<()>>;
    /// The Unix socket of a rush's plane, as its workers are told.
    fn socket(&self, rush_id: &str) -> PathBuf;
    /// Removes what a rush's Unix plane left on disk.
    fn remove(&self, rush_id: &str);
}

/// Static settings of the daemon.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Serves the worker planes.
    pub planes: Arc<dyn PlaneServer>,
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
    swarm: Arc<tokio::sync::OnceCell<Arc<dyn Launcher>>>,
    kubernetes: Arc<tokio::sync::OnceCell<Arc<dyn Launcher>>>,
    /// The `kubernetes:` settings of the first kubernetes rush: one zergd drives one cluster
    /// namespace with one set of settings.
    kube_settings: Arc<std::sync::Mutex<Option<crate::config::KubernetesSettings>>>,
}

impl Launchers {
    fn new(subprocess: Arc<dyn Launcher>, container: Option<Arc<dyn Launcher>>) -> Self {
        Launchers {
            subprocess,
            container: Arc::new(tokio::sync::OnceCell::new_with(container)),
            swarm: Arc::default(),
            kubernetes: Arc::default(),
            kube_settings: Arc::default(),
        }
    }

    async fn get(&self, mode: Mode) -> Result<Arc<dyn Launcher>, SpawnError> {
        match mode {
            Mode::Subprocess => Ok(self.subprocess.clone()),
            Mode::Container => self
                .container
                .get_or_try_init(|| async {
                    ContainerLauncher::connect()
                        .await
                        .map(|c| Arc::new(c) as Arc<dyn Launcher>)
                })
                .await
                .cloned(),
            Mode::Swarm => self
                .swarm
                .get_or_try_init(|| async {
                    crate::launcher::swarm::SwarmLauncher::connect()
                        .await
                        .map(|c| Arc::new(c) as Arc<dyn Launcher>)
                })
                .await
                .cloned(),
            Mode::Kubernetes => {
                let settings = self
                    .kube_settings
                    .lock()
                    .map(|s| s.clone())
                    .unwrap_or_default()
                    .unwrap_or_default();
                self.kubernetes
                    .get_or_try_init(|| async {
                        crate::launcher::kubernetes::KubernetesLauncher::connect(settings)
                            .await
                            .map(|c| Arc::new(c) as Arc<dyn Launcher>)
                    })
                    .await
                    .cloned()
            }
        }
    }
}

/// The TCP worker plane, as remote workers are told to reach it.
struct RemotePlane {
    /// The address it listens on (`remote.listen`).
    listen: String,
    /// The URL workers dial.
    url: String,
    /// The CA workers trust.
    ca_pem: String,
    task: tokio::task::JoinHandle<()>,
}

/// The supervisor actor.
pub struct Supervisor {
    /// The rushes held whole: every rush that runs, is paused, or ended but still has a worker,
    /// a watcher or a job in flight.
    rushes: HashMap<String, Rush>,
    /// Ended rushes held only as their registry entry; a command that needs one whole loads
    /// it from disk again (see `park.rs`).
    parked: HashMap<String, RegistryEntry>,
    /// Background jobs per rush whose answer has not come back yet (spawns, symbol builds,
    /// merges, commit checks): a rush is not parked while it waits for one.
    inflight: HashMap<String, u32>,
    preparing: HashSet<(String, String)>,
    /// Rushes of the registry whose state could not be loaded at startup: (repo, feature, why).
    unloadable: Vec<(String, String, String)>,
    watchers: HashMap<String, Vec<Watcher>>,
    launchers: Launchers,
    planes: HashMap<String, tokio::task::JoinHandle<()>>,
    /// The TCP worker plane of remote rushes, once one needed it.
    remote_plane: Option<RemotePlane>,
    /// The last `progress-<N>.json` written per (rush, slot), so an unchanged one is not
    /// rewritten on every heartbeat.
    last_progress: HashMap<(String, u32), serde_json::Value>,
    /// Writes the workers' compatible files, folded per window (started with the first).
    worker_files: Option<crate::state::WorkerFileWriter>,
    /// monitor.log and events-file writers, opened on a rush's first event.
    monitors: HashMap<String, Monitor>,
    clock: Arc<dyn Clock>,
    settings: Settings,
    tx: mpsc::UnboundedSender<Event>,
    rx: mpsc::UnboundedReceiver<Event>,
    pending: Vec<(String, Effects)>,
    shutdown: Option<Reply<()>>,
    /// Each rush's state as the registry file has it, so it is rewritten only on a change.
    registered: HashMap<String, RushState>,
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
            parked: HashMap::new(),
            inflight: HashMap::new(),
            preparing: HashSet::new(),
            unloadable: Vec::new(),
            watchers: HashMap::new(),
            launchers: Launchers::new(subprocess, container),
            planes: HashMap::new(),
            remote_plane: None,
            last_progress: HashMap::new(),
            worker_files: None,
            monitors: HashMap::new(),
            clock,
            settings,
            tx,
            rx,
            pending: Vec::new(),
            shutdown: None,
            registered: HashMap::new(),
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
        // Pinged from this loop itself, so a wedged actor is restarted by systemd.
        let mut watchdog = crate::notify::Watchdog::from_env(Instant::now());
        loop {
            watchdog.ping_if_due(Instant::now());
            let mut deadline = self
                .next_tick
                .unwrap_or_else(|| self.clock.now() + Duration::from_secs(1));
            if let Some(ping) = watchdog.due() {
                deadline = deadline.min(ping);
            }
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
            if let Some(due) = self.send_owed_snapshots() {
                self.next_tick = Some(self.next_tick.map_or(due, |n| n.min(due)));
            }
            self.park_ended();
            if let Some(reply) = self.shutdown.take() {
                self.compact_all();
                let _ = reply.send(Ok(()));
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
        let mut unsaved: HashMap<String, SupervisorError> = HashMap::new();
        let wall = self.clock.wall();
        let now = self.clock.now();
        for r in self.rushes.values_mut() {
            if r.dirty {
                r.dirty = false;
                if let Err(e) = r.journal.save(&mut r.doc) {
                    // The file on disk still holds the previous state (every save writes a new
                    // temp file; a failed one never replaces it). Hold new work, say why, and
                    // try again with the next change.
                    let why = crate::error::chain(&e);
                    tracing::error!(error = %why, rush = %r.id(), "cannot save state");
                    r.storage_failed(&why, wall);
                    unsaved.insert(
                        r.id().to_string(),
                        SupervisorError::unavailable(format!(
                            "zergd cannot save the rush's state, so nothing was changed on disk: {why}"
                        )),
                    );
                }
                // So do notifications: a task failed for good, the rush ended or paused.
                if r.config.notify.wants("task_failed") {
                    for ev in r
                        .events
                        .iter()
                        .filter(|e| e.kind == "task_failed_permanent")
                    {
                        let extra = serde_json::json!({
                            "task_id": ev.data["task_id"],
                            "error": ev.data["error"],
                        });
                        let n = r.notice("task_failed", wall, extra);
                        crate::alerts::send(&r.config.notify, r.paths.repo.clone(), n);
                    }
                }
                let state = r.doc.rush.state;
                if r.notified_state != state {
                    r.notified_state = state;
                    let kind = match state {
                        RushState::Complete => Some("rush_complete"),
                        RushState::Failed => Some("rush_failed"),
                        RushState::Stopped => Some("rush_stopped"),
                        RushState::Paused => Some("rush_paused"),
                        _ => None,
                    };
                    if let Some(kind) = kind
                        && r.config.notify.wants(kind)
                    {
                        let n = r.notice(kind, wall, serde_json::json!({}));
                        crate::alerts::send(&r.config.notify, r.paths.repo.clone(), n);
                    }
                }
                // Monitor lines go out once the state they describe is on disk.
                if !r.events.is_empty() {
                    let m = self
                        .monitors
                        .entry(r.id().to_string())
                        .or_insert_with(|| Monitor::open(&r.paths.repo, &r.doc.feature));
                    for ev in r.events.drain(..) {
                        m.emit(&ev);
                    }
                }
                changed_registry |= self.registered.get(r.id()) != Some(&r.doc.rush.state);
                let msgs = std::mem::take(&mut r.messages);
                if let Some(ws) = self.watchers.get_mut(r.id()) {
                    ws.retain(|w| !w.sink.is_closed());
                    // One event per line; the last one carries the new status when
                    // `snapshot_wait` allows; otherwise the watcher is owed one, sent by
                    // `send_owed_snapshots`.
                    let n = msgs.len().max(1);
                    let running = r.state() == RushState::Running;
                    // The view walks every task: made only when a snapshot goes out.
                    let mut view = None;
                    for w in ws.iter_mut() {
                        let send = w.snapshot_wait(running, now).is_none();
                        w.owed = !send;
                        if send {
                            w.sent_at = now;
                        }
                        for i in 0..n {
                            let last = i + 1 == n && send;
                            if msgs.get(i).is_none() && !last {
                                continue;
                            }
                            let snapshot = last.then(|| &*view.get_or_insert_with(|| r.view()));
                            w.sink.send(msgs.get(i), snapshot);
                        }
                    }
                }
            }
        }
        if changed_registry {
            self.save_registry();
        }
        for (id, fx) in pending {
            let e = unsaved.get(&id);
            self.run_effects(&id, fx, e);
        }
    }

    /// Sends the snapshots that watchers are owed and may have now; returns when the next one
    /// is due.
    fn send_owed_snapshots(&mut self) -> Option<Instant> {
        let now = self.clock.now();
        let mut next: Option<Instant> = None;
        for (id, ws) in self.watchers.iter_mut() {
            let Some(r) = self.rushes.get(id) else {
                continue;
            };
            let running = r.state() == RushState::Running;
            let mut view = None;
            for w in ws.iter_mut().filter(|w| w.owed) {
                if let Some(wait) = w.snapshot_wait(running, now) {
                    let at = now + wait;
                    next = Some(next.map_or(at, |n| n.min(at)));
                    continue;
                }
                w.sink
                    .send(None, Some(view.get_or_insert_with(|| r.view())));
                w.owed = false;
                w.sent_at = now;
            }
        }
        next
    }

    /// Folds every rush's journal into its state file, so that the compatible files are
    /// whole when zergd stops.
    fn compact_all(&mut self) {
        for r in self.rushes.values_mut() {
            if let Err(e) = r.journal.compact_if_journaled(&mut r.doc) {
                // The journal still holds every change; the next zergd replays it.
                tracing::warn!(error = %crate::error::chain(&e), rush = %r.id(), "cannot compact the state journal");
            }
        }
    }

    fn save_registry(&mut self) {
        let mut reg = Registry::load(&self.settings.registry_path);
        let entries = self
            .rushes
            .values()
            .map(registry_entry)
            .chain(self.parked.values().cloned());
        for entry in entries {
            reg.rushes
                .retain(|e| !(e.repo == entry.repo && e.feature == entry.feature));
            reg.rushes.push(entry);
        }
        match reg.save(&self.settings.registry_path) {
            Ok(()) => {
                self.registered = self.known().map(|k| (k.id.to_string(), k.state)).collect();
            }
            Err(e) => tracing::warn!(error = %e, "cannot save the rush registry"),
        }
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
            } => {
                self.answered(&rush);
                self.on_verified(&rush, pending, result, now, wall)
            }
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
                self.answered(&rush);
                self.with_rush(&rush, |r, fx| {
                    r.on_spawned(worker, generation, result, now, wall, fx)
                });
            }
            Event::Merged {
                rush,
                level,
                result,
                symbols,
            } => {
                self.answered(&rush);
                self.with_rush(&rush, |r, fx| {
                    if let Some(s) = symbols {
                        r.on_reindexed(level, &result, s, wall);
                    }
                    r.on_merged(level, result, now, wall, fx)
                });
            }
            Event::Indexed { rush, result } => {
                self.answered(&rush);
                self.with_rush(&rush, |r, fx| r.on_indexed(*result, now, wall, fx));
            }
            Event::Prepared { req, result, reply } => {
                self.on_prepared(req, *result, reply, now, wall)
            }
        }
    }

    /// Counts a background job of a rush as answered.
    fn answered(&mut self, id: &str) {
        if let Some(n) = self.inflight.get_mut(id) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.inflight.remove(id);
            }
        }
    }

    /// Counts a background job of a rush as started.
    fn started_job(&mut self, id: &str) {
        *self.inflight.entry(id.to_string()).or_default() += 1;
    }

    fn with_rush(&mut self, id: &str, f: impl FnOnce(&mut Rush, &mut Effects)) {
        if let Some(r) = self.rushes.get_mut(id) {
            let mut fx = Effects::default();
            f(r, &mut fx);
            self.pending.push((id.to_string(), fx));
        }
    }

    /// Runs `f` on a rush and replies after the state is saved.
    fn reply_in<T: Send + 'static>(
        &mut self,
        id: &str,
        reply: Reply<T>,
        f: impl FnOnce(&mut Rush, &mut Effects) -> Result<T, SupervisorError>,
    ) {
        match self.rushes.get_mut(id) {
            Some(r) => {
                let mut fx = Effects::default();
                let res = f(r, &mut fx);
                fx.reply(reply, res);
                self.pending.push((id.to_string(), fx));
            }
            None => {
                let _ = reply.send(Err(SupervisorError::not_found(format!(
                    "zergd knows no rush {id}"
                ))));
            }
        }
    }
}

/// A rush's line in the registry, with what `list` shows of it.
pub(super) fn registry_entry(r: &Rush) -> RegistryEntry {
    RegistryEntry {
        rush_id: r.id().to_string(),
        repo: r.doc.rush.repo.clone(),
        feature: r.doc.feature.clone(),
        state: r.doc.rush.state,
        summary: Summary {
            started_at: r.doc.started_at.clone(),
            finished_at: r.doc.rush.finished_at.clone(),
            tasks_total: r.doc.tasks.len() as u32,
            tasks_complete: r.doc.tasks_complete() as u32,
            mode: r.doc.rush.mode,
        },
    }
}
