//! The worker's session with zergd: register, the lease loop, and one task's execution.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};
use zerg_proto::v1;
use zerg_proto::v1::worker_client::WorkerClient;

use crate::exit;
use crate::prompt::{self, CHECKPOINT_FILE, ESCALATION_FILE};
use crate::run::{self, Outcome, Spec, now_ms};
use crate::stream::{ModelSpend, Profile, Report, Tokens};
use zerg_proto::contract::{Revocation, env};

/// Repeats an RPC across reconnects.
macro_rules! retrying {
    ($self:ident, |$c:ident| $call:expr) => {{
        loop {
            let mut $c = $self.client.clone();
            match $call.await {
                Ok(r) => break Ok(r.into_inner()),
                Err(s) if is_transport(&s) => {
                    if let Err(e) = $self.reconnect().await {
                        break Err(Status::unavailable(e));
                    }
                }
                Err(s) => break Err(s),
            }
        }
    }};
}

mod connection;
mod egress;
mod environment;
mod handoff;
mod remote;
mod setup;
mod task;

use connection::*;
pub use environment::Env;
use environment::*;
use handoff::read_json;

fn tokens_to_wire(t: &Tokens) -> v1::Tokens {
    v1::Tokens {
        input_tokens: t.input,
        output_tokens: t.output,
        cache_read_tokens: t.cache_read,
        cache_creation_tokens: t.cache_creation,
    }
}

/// The tokens and per-model usage of an attempt, as the wire carries them.
fn usage_to_wire(
    r: &Report,
) -> (
    Option<v1::Tokens>,
    std::collections::HashMap<String, v1::ModelUsage>,
) {
    let models = r
        .models
        .iter()
        // Within what zergd accepts.
        .filter(|(m, _)| m.len() <= zerg_proto::contract::limits::MAX_NAME)
        .take(zerg_proto::contract::limits::MAX_MODELS)
        .map(|(m, ModelSpend { tokens, cost_usd })| {
            (
                m.clone(),
                v1::ModelUsage {
                    tokens: Some(tokens_to_wire(tokens)),
                    cost_usd: *cost_usd,
                },
            )
        })
        .collect();
    (Some(tokens_to_wire(&r.tokens)), models)
}

/// What happened to a task.
enum TaskEnd {
    /// Reported to zergd (success or failure); lease the next one.
    Next,
    /// Exit the worker with this code.
    Exit(u8),
}

/// Where a worker process last left its worktree's index and files.
struct LeftAt {
    /// The commit whose tree they hold.
    commit: String,
    /// Whether this process's last act there was its own commit, and that commit left nothing
    /// out ([`zerg_git::Committed::clean`]): the files are the commit's, and the next move takes
    /// no status. Otherwise the move checks the files first.
    committed: bool,
}

/// A running worker.
pub struct Session {
    env: Env,
    client: Client,
    cfg: v1::RegisterReply,
    hb_tx: mpsc::Sender<v1::HeartbeatRequest>,
    abort_rx: watch::Receiver<Option<Revocation>>,
    /// Set when the heartbeat stream gave up reaching zergd.
    unreachable_rx: watch::Receiver<bool>,
    last_output: Arc<AtomicI64>,
    current: Option<(String, String)>,
    step: v1::Step,
    progress: u32,
    tasks_completed: u32,
    tiers: Vec<v1::TierResult>,
    /// `GIT_AUTHOR_*` and `GIT_COMMITTER_*` for the agent CLI and git, when the repository
    /// has no identity of its own.
    identity: Vec<(String, String)>,
    /// What the next `Fail` report tells the task's next attempt (output tails, the agent's
    /// last message), taken by [`Session::fail`].
    retry_context: String,
    /// Who the task commits are by.
    who: zerg_git::Identity,
    /// Whether the worktree opened in process at the start (if not, git does every step).
    in_process: bool,
    /// The worktree's own git directory, where stale lock files are looked for before each
    /// task (found once: it does not change while this process runs).
    git_dir: Option<PathBuf>,
    /// Where this process last left the worktree's index and files (its last prepare or
    /// commit): a level's merge moves the worker's branch but not its files, so the next task's
    /// files move from here.
    worktree_at: Option<LeftAt>,
    /// What the agent CLI's output said of the current attempt: cost, tokens.
    attempt: Report,
    /// The agent CLI's own account of what it does (`API retry 3/10: overloaded`), sent with
    /// every heartbeat of the attempt.
    detail: Arc<std::sync::Mutex<String>>,
    /// What the last `worktree.setup` that succeeded ran for (see [`setup::Setup`]).
    setup_key: Option<u64>,
    /// What `worktree.setup` made in the worktree (see [`setup::Made`]): never committed.
    setup_made: setup::Made,
    /// A remote worker wrote `worktree.copy`'s files into its workspace (once per process).
    copies_fetched: bool,
    /// The `worktree.setup` command running now, and since when: each heartbeat says so, with
    /// the time it has run, which is progress to zergd's watchdog (a setup that hangs ends at
    /// its own time limit).
    setup_running: Option<(usize, Instant)>,
}

impl Session {
    /// Connects, registers and starts the heartbeat stream.
    pub async fn start(env: Env) -> Result<Session, String> {
        let ch = connect_retrying(&env).await?;
        let mut client = env.client(ch);
        let reg = v1::RegisterRequest {
            worker: Some(env.me()),
            pid: std::process::id() as i32,
            ..Default::default()
        };
        let cfg = client
            .register(reg)
            .await
            .map_err(|s| format!("zergd refused registration: {}", s.message()))?
            .into_inner();
        if env.confined {
            for (port, setup) in [
                (zerg_sandbox::EGRESS_PORT, false),
                (zerg_sandbox::SETUP_EGRESS_PORT, true),
            ] {
                tokio::spawn(egress::forward(port, setup, env.me(), client.clone()));
            }
        }
        let (hb_tx, hb_rx) = mpsc::channel(16);
        let (abort_tx, abort_rx) = watch::channel(None);
        let (unreachable_tx, unreachable_rx) = watch::channel(false);
        tokio::spawn(heartbeat_loop(env.clone(), hb_rx, abort_tx, unreachable_tx));
        let repo = match zerg_git::Repo::open_worktree(&env.worktree) {
            Ok(r) => Some(r),
            Err(e) => {
                eprintln!(
                    "zerg-worker-agent: git fallback (cannot open the worktree in process: {e}): git does every step"
                );
                None
            }
        };
        // Commits need an identity; use the user's git config when it has one.
        let (who, identity) = match repo.as_ref().and_then(zerg_git::Identity::of) {
            Some(who) => (who, vec![]),
            None => {
                let who = zerg_git::Identity {
                    name: format!("ZERG Worker {}", env.worker_id),
                    email: "zerg-worker@local".into(),
                };
                let identity = vec![
                    ("GIT_AUTHOR_NAME".to_string(), who.name.clone()),
                    ("GIT_COMMITTER_NAME".to_string(), who.name.clone()),
                    ("GIT_AUTHOR_EMAIL".to_string(), who.email.clone()),
                    ("GIT_COMMITTER_EMAIL".to_string(), who.email.clone()),
                ];
                (who, identity)
            }
        };
        let git_dir = match &repo {
            Some(r) => Some(r.git_dir().to_path_buf()),
            None => run::git(&env.worktree, &["rev-parse", "--absolute-git-dir"])
                .await
                .ok()
                .map(PathBuf::from),
        };
        eprintln!(
            "zerg-worker-agent: worker {} registered for rush {}",
            env.worker_id, env.rush_id
        );
        Ok(Session {
            env,
            client,
            cfg,
            hb_tx,
            abort_rx,
            unreachable_rx,
            last_output: Arc::new(AtomicI64::new(0)),
            current: None,
            step: v1::Step::Initializing,
            progress: 0,
            tasks_completed: 0,
            tiers: Vec::new(),
            identity,
            retry_context: String::new(),
            who,
            in_process: repo.is_some(),
            copies_fetched: false,
            git_dir,
            worktree_at: None,
            setup_key: None,
            setup_made: setup::Made::default(),
            setup_running: None,
            attempt: Report::default(),
            detail: Arc::default(),
        })
    }

    /// Reconnects after zergd went away (it may have restarted) and registers again, telling it
    /// which lease this worker still holds.
    async fn reconnect(&mut self) -> Result<(), String> {
        let ch = connect_retrying(&self.env).await?;
        self.client = self.env.client(ch);
        let (held_task_id, held_lease_id) = self.current.clone().unwrap_or_default();
        let reg = v1::RegisterRequest {
            worker: Some(self.env.me()),
            pid: std::process::id() as i32,
            held_lease_id,
            held_task_id,
        };
        let deadline = Instant::now() + self.env.reconnect_timeout;
        loop {
            match self.client.register(reg.clone()).await {
                Ok(r) => {
                    self.cfg = r.into_inner();
                    eprintln!("zerg-worker-agent: re-registered with zergd");
                    return Ok(());
                }
                Err(_) if self.env.orphaned() => return Err(self.env.orphaned_message()),
                Err(s) if is_transport(&s) && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(500)).await
                }
                Err(s) => return Err(format!("zergd refused re-registration: {}", s.message())),
            }
        }
    }

    fn hb_interval(&self) -> Duration {
        Duration::from_millis(self.cfg.heartbeat_interval_ms.max(100))
    }

    /// Sends a heartbeat (zergd writes the compatible heartbeat and progress files from it).
    fn beat(&self) {
        let (task_id, lease_id) = self.current.clone().unwrap_or_default();
        let hb = v1::HeartbeatRequest {
            worker: Some(self.env.me()),
            lease_id,
            task_id: task_id.clone(),
            step: self.step as i32,
            progress_pct: self.progress,
            timestamp_ms: now_ms(),
            last_output_ms: self.last_output.load(Ordering::Relaxed),
            detail: match self.setup_running {
                Some((i, since)) => format!(
                    "running worktree.setup[{i}] for {}s",
                    since.elapsed().as_secs()
                ),
                None => self
                    .detail
                    .lock()
                    .map(|d| {
                        zerg_proto::contract::limits::clip(
                            &d,
                            zerg_proto::contract::limits::MAX_NAME,
                        )
                        .to_string()
                    })
                    .unwrap_or_default(),
            },
        };
        let _ = self.hb_tx.try_send(hb);
    }

    fn set_detail(&self, text: String) {
        if let Ok(mut d) = self.detail.lock() {
            *d = text;
        }
    }

    fn set_step(&mut self, step: v1::Step, progress: u32) {
        self.step = step;
        self.progress = progress;
        self.beat();
    }

    /// The lease loop. Returns the process exit code.
    pub async fn run(&mut self) -> u8 {
        loop {
            self.current = None;
            self.set_step(v1::Step::Idle, 0);
            let lease = match self.lease().await {
                Ok(l) => l,
                Err(s) => {
                    eprintln!("zerg-worker-agent: lease failed: {}", s.message());
                    return exit::ERROR;
                }
            };
            match lease.outcome {
                Some(v1::lease_reply::Outcome::Task(task)) => match self.run_task(task).await {
                    TaskEnd::Next => continue,
                    TaskEnd::Exit(code) => return code,
                },
                Some(v1::lease_reply::Outcome::Done(d)) => {
                    eprintln!(
                        "zerg-worker-agent: no work left ({}); {} task(s) completed",
                        d.reason, self.tasks_completed
                    );
                    return exit::SUCCESS;
                }
                None => return exit::ERROR,
            }
        }
    }

    /// Waits for a lease while heartbeating as idle (a parked worker is alive, not stale). Gives
    /// up when the heartbeat stream gave up reaching zergd: a lease call in flight when zergd
    /// went away may never return.
    async fn lease(&mut self) -> Result<v1::LeaseReply, Status> {
        let mut unreachable = self.unreachable_rx.clone();
        loop {
            let mut c = self.client.clone();
            let req = v1::LeaseRequest {
                worker: Some(self.env.me()),
            };
            let fut = c.lease(req);
            tokio::pin!(fut);
            let mut tick = tokio::time::interval(self.hb_interval());
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let res = loop {
                tokio::select! {
                    r = &mut fut => break r,
                    _ = tick.tick() => self.beat(),
                    Ok(_) = unreachable.wait_for(|gone| *gone) => {
                        return Err(Status::unavailable("zergd cannot be reached"));
                    }
                }
            };
            match res {
                Ok(r) => return Ok(r.into_inner()),
                Err(s) if is_transport(&s) => {
                    self.reconnect().await.map_err(Status::unavailable)?
                }
                Err(s) => return Err(s),
            }
        }
    }

    /// Runs `spec` under [`Self::watch`], then kills whatever it left running: processes it put
    /// in the background or in a session of their own outlive it, and would otherwise go on
    /// writing into the worktree during the next task. What was already there before it ran
    /// (a service a setup command started) is left alone.
    async fn supervise(&mut self, spec: Spec<'_>) -> Option<std::io::Result<Outcome>> {
        let keep = run::adopted();
        let program = spec.argv.first().cloned().unwrap_or_default();
        let r = self.watch(spec).await;
        let killed = run::sweep(keep).await;
        if killed > 0 {
            eprintln!(
                "zerg-worker-agent: killed {killed} process(es) that `{program}` left running"
            );
        }
        r
    }

    /// Runs a child process while heartbeating; `None` when zergd revoked the lease meanwhile,
    /// or when zergd cannot be reached any more (the child is stopped: its result could never be
    /// reported).
    async fn watch(&mut self, spec: Spec<'_>) -> Option<std::io::Result<Outcome>> {
        let lease = self
            .current
            .as_ref()
            .map(|(_, l)| l.clone())
            .unwrap_or_default();
        let last = self.last_output.clone();
        let fut = run::run(spec, last);
        tokio::pin!(fut);
        let mut unreachable = self.unreachable_rx.clone();
        let mut tick = tokio::time::interval(self.hb_interval());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                r = &mut fut => return Some(r),
                _ = tick.tick() => self.beat(),
                Ok(_) = unreachable.wait_for(|gone| *gone) => {
                    eprintln!("zerg-worker-agent: zergd cannot be reached; stopping the task");
                    return None;
                }
                changed = self.abort_rx.changed() => {
                    if changed.is_ok() {
                        let revoked = self.abort_rx.borrow().clone();
                        match revoked {
                            Some(Revocation::Lease(l)) if l == lease => {
                                eprintln!("zerg-worker-agent: zergd revoked lease {lease}");
                                return None;
                            }
                            Some(Revocation::Superseded) => {
                                eprintln!("zerg-worker-agent: a newer worker generation replaced this one");
                                return None;
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
    }
}
