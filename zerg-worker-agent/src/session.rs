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
use zerg_proto::contract::{Revocation, env};

/// The worker's environment, set by zergd's launcher.
#[derive(Debug, Clone)]
pub struct Env {
    socket: PathBuf,
    rush_id: String,
    worker_id: u32,
    generation: u64,
    worktree: PathBuf,
    feature: String,
    log_dir: PathBuf,
    token: Token,
    reconnect_timeout: Duration,
}

/// Adds the worker's token to every RPC (`authorization: Bearer <token>`).
#[derive(Clone)]
struct Token(Option<MetadataValue<Ascii>>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Interceptor for Token {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut()
                .insert(zerg_proto::contract::TOKEN_METADATA, v.clone());
        }
        Ok(req)
    }
}

/// A client of zergd's worker plane.
type Client = WorkerClient<InterceptedService<Channel, Token>>;

impl Env {
    /// Reads the `ZERG_*` environment.
    pub fn from_env() -> Result<Env, String> {
        let var = |k: &str| {
            std::env::var(k).map_err(|_| {
                format!("environment variable {k} is not set (this program is started by zergd)")
            })
        };
        let num = |k: &str| -> Result<u64, String> {
            var(k)?
                .parse()
                .map_err(|_| format!("environment variable {k} is not a number"))
        };
        Ok(Env {
            socket: PathBuf::from(var(env::SOCKET)?),
            rush_id: var(env::RUSH_ID)?,
            worker_id: num(env::WORKER_ID)? as u32,
            generation: num(env::GENERATION)?,
            worktree: PathBuf::from(var(env::WORKTREE)?),
            feature: var(env::FEATURE)?,
            log_dir: PathBuf::from(var(env::LOG_DIR)?),
            // Without it every call is refused, with a message saying so.
            token: Token(
                std::env::var(env::WORKER_TOKEN)
                    .ok()
                    .and_then(|t| zerg_proto::contract::bearer(&t).parse().ok()),
            ),
            reconnect_timeout: Duration::from_secs(
                std::env::var("ZERG_RECONNECT_TIMEOUT_SECONDS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(600),
            ),
        })
    }

    fn client(&self, ch: Channel) -> Client {
        WorkerClient::with_interceptor(ch, self.token.clone())
    }

    /// The rush's spec directory relative to the worktree, as committed in the repository:
    /// tasks never change it (the commit restores it and zergd refuses commits that touch it).
    fn spec_rel(&self) -> String {
        format!(".gsd/specs/{}", self.feature)
    }

    fn me(&self) -> v1::WorkerRef {
        v1::WorkerRef {
            rush_id: self.rush_id.clone(),
            worker_id: self.worker_id,
            generation: self.generation,
        }
    }
}

/// Whether an RPC error means "zergd is not reachable right now" (worth reconnecting).
fn is_transport(s: &Status) -> bool {
    matches!(
        s.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled
    )
}

/// Connects to the socket, retrying with capped exponential backoff (0.5 s to 5 s).
async fn connect_retrying(socket: &Path, timeout: Duration) -> Result<Channel, String> {
    let start = Instant::now();
    let mut delay = Duration::from_millis(500);
    loop {
        match zerg_proto::transport::connect(socket).await {
            Ok(ch) => return Ok(ch),
            Err(e) if start.elapsed() < timeout => {
                eprintln!(
                    "zerg-worker-agent: cannot reach zergd at {} ({e}); retrying in {delay:?}",
                    socket.display()
                );
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(e) => {
                return Err(format!(
                    "cannot reach zergd at {} for {timeout:?}: {e}",
                    socket.display()
                ));
            }
        }
    }
}

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

/// What happened to a task.
enum TaskEnd {
    /// Reported to zergd (success or failure); lease the next one.
    Next,
    /// Exit the worker with this code.
    Exit(u8),
}

/// A running worker.
pub struct Session {
    env: Env,
    client: Client,
    cfg: v1::RegisterReply,
    hb_tx: mpsc::Sender<v1::HeartbeatRequest>,
    abort_rx: watch::Receiver<Option<Revocation>>,
    last_output: Arc<AtomicI64>,
    current: Option<(String, String)>,
    step: &'static str,
    progress: u32,
    tasks_completed: u32,
    tiers: Vec<v1::TierResult>,
    identity: Vec<(String, String)>,
    /// Cost the agent CLI reported for the current attempt.
    attempt_cost: f64,
}

impl Session {
    /// Connects, registers and starts the heartbeat stream.
    pub async fn start(env: Env) -> Result<Session, String> {
        let ch = connect_retrying(&env.socket, env.reconnect_timeout).await?;
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
        let (hb_tx, hb_rx) = mpsc::channel(16);
        let (abort_tx, abort_rx) = watch::channel(None);
        tokio::spawn(heartbeat_loop(env.clone(), hb_rx, abort_tx));
        // Commits need an identity; use the user's git config when it has one.
        let identity = match run::git(&env.worktree, &["config", "user.email"]).await {
            Ok(e) if !e.is_empty() => vec![],
            _ => {
                let name = format!("ZERG Worker {}", env.worker_id);
                vec![
                    ("GIT_AUTHOR_NAME".to_string(), name.clone()),
                    ("GIT_COMMITTER_NAME".to_string(), name),
                    (
                        "GIT_AUTHOR_EMAIL".to_string(),
                        "zerg-worker@local".to_string(),
                    ),
                    (
                        "GIT_COMMITTER_EMAIL".to_string(),
                        "zerg-worker@local".to_string(),
                    ),
                ]
            }
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
            last_output: Arc::new(AtomicI64::new(0)),
            current: None,
            step: "initializing",
            progress: 0,
            tasks_completed: 0,
            tiers: Vec::new(),
            identity,
            attempt_cost: 0.0,
        })
    }

    /// Reconnects after zergd went away (it may have restarted) and registers again, telling it
    /// which lease this worker still holds.
    async fn reconnect(&mut self) -> Result<(), String> {
        let ch = connect_retrying(&self.env.socket, self.env.reconnect_timeout).await?;
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
            step: self.step.to_string(),
            progress_pct: self.progress,
            timestamp_ms: now_ms(),
            last_output_ms: self.last_output.load(Ordering::Relaxed),
        };
        let _ = self.hb_tx.try_send(hb);
    }

    fn set_step(&mut self, step: &'static str, progress: u32) {
        self.step = step;
        self.progress = progress;
        self.beat();
    }

    /// The lease loop. Returns the process exit code.
    pub async fn run(&mut self) -> u8 {
        loop {
            self.current = None;
            self.set_step("idle", 0);
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
                Some(v1::lease_reply::Outcome::Wait(w)) => {
                    tokio::time::sleep(Duration::from_millis(w.retry_after_ms.clamp(100, 30_000)))
                        .await;
                }
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

    /// Waits for a lease while heartbeating as idle (a parked worker is alive, not stale).
    async fn lease(&mut self) -> Result<v1::LeaseReply, Status> {
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

    /// Runs a child process while heartbeating; `None` when zergd revoked the lease meanwhile.
    async fn supervise(&mut self, spec: Spec<'_>) -> Option<std::io::Result<Outcome>> {
        let lease = self
            .current
            .as_ref()
            .map(|(_, l)| l.clone())
            .unwrap_or_default();
        let last = self.last_output.clone();
        let fut = run::run(spec, last);
        tokio::pin!(fut);
        let mut tick = tokio::time::interval(self.hb_interval());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                r = &mut fut => return Some(r),
                _ = tick.tick() => self.beat(),
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

    fn task_dir(&self) -> PathBuf {
        self.env.worktree.join(".zerg-task")
    }

    /// Pathspecs that keep the handoff directory out of commits. Paths that git already ignores
    /// are left out: naming an ignored path makes `git add` fail.
    async fn pathspec_excludes(&self) -> Vec<String> {
        // The spec is not excluded here (in a container it is ignored, and naming an ignored
        // path fails `git add`): `restore_spec` puts it back in the index instead.
        let paths = vec![".zerg-task".to_string()];
        let mut v = Vec::new();
        for p in paths {
            if run::git(&self.env.worktree, &["check-ignore", "-q", &p])
                .await
                .is_err()
            {
                v.push(format!(":(exclude){p}"));
            }
        }
        v
    }

    /// Resets the worktree to the commit zergd gave, so every task starts from a known state.
    async fn prepare_worktree(&self, task: &v1::Task) -> Result<(), String> {
        let wt = &self.env.worktree;
        // An earlier process of this slot may have been killed in the middle of a git command.
        // The slot's worktree is this process's alone, so its lock files are stale.
        remove_stale_locks(wt).await;
        let base = if task.base_commit.is_empty() {
            "HEAD"
        } else {
            task.base_commit.as_str()
        };
        run::git(wt, &["reset", "--hard", "-q", base]).await?;
        let rel = self.env.spec_rel();
        run::git(wt, &["clean", "-fdq", "-e", ".zerg-task", "-e", &rel]).await?;
        let td = self.task_dir();
        let _ = tokio::fs::remove_dir_all(&td).await;
        tokio::fs::create_dir_all(&td)
            .await
            .map_err(|e| format!("cannot create {}: {e}", td.display()))?;
        if !task.resume_from.is_empty()
            && let Err(e) = run::git(wt, &["cherry-pick", "--no-commit", &task.resume_from]).await
        {
            eprintln!(
                "zerg-worker-agent: cannot resume from checkpoint {}: {e}; starting fresh",
                task.resume_from
            );
            let _ = run::git(wt, &["cherry-pick", "--abort"]).await;
            if !task.base_commit.is_empty() {
                run::git(wt, &["reset", "--hard", "-q", &task.base_commit]).await?;
            }
        }
        Ok(())
    }

    async fn fail(
        &mut self,
        task: &v1::Task,
        kind: &str,
        message: String,
        retry_at_ms: i64,
        checkpoint: String,
    ) -> TaskEnd {
        let tiers = self.tier_results();
        let req = v1::FailRequest {
            worker: Some(self.env.me()),
            lease_id: task.lease_id.clone(),
            task_id: task.id.clone(),
            kind: kind.to_string(),
            message,
            tiers,
            retry_at_ms,
            checkpoint_commit: checkpoint,
            cost_usd: self.attempt_cost,
        };
        match retrying!(self, |c| c.fail(req.clone())) {
            Ok(_) => TaskEnd::Next,
            Err(s) if s.code() == Code::FailedPrecondition => TaskEnd::Next,
            Err(s) => {
                eprintln!("zerg-worker-agent: cannot report failure: {}", s.message());
                TaskEnd::Exit(exit::ERROR)
            }
        }
    }

    fn tier_results(&self) -> Vec<v1::TierResult> {
        self.tiers.clone()
    }

    async fn run_task(&mut self, task: v1::Task) -> TaskEnd {
        let started = Instant::now();
        self.current = Some((task.id.clone(), task.lease_id.clone()));
        self.tiers.clear();
        self.attempt_cost = 0.0;
        self.last_output.store(0, Ordering::Relaxed);
        eprintln!(
            "zerg-worker-agent: task {} (attempt {}, lease {})",
            task.id, task.attempt, task.lease_id
        );
        self.set_step("loading_context", 5);
        if let Err(e) = self.prepare_worktree(&task).await {
            return self
                .fail(
                    &task,
                    "agent_failed",
                    format!("cannot prepare the worktree: {e}"),
                    0,
                    String::new(),
                )
                .await;
        }
        let prompt = prompt::build(&task, &self.cfg.spec_context);

        // The agent CLI.
        self.set_step("implementing", 10);
        let mut argv = self.cfg.agent_command.clone();
        argv.push(prompt);
        let task_dir = self.task_dir();
        let artifacts = self.env.log_dir.join("tasks").join(&task.id);
        let mut env = vec![
            (env::TASK_ID.to_string(), task.id.clone()),
            (
                env::TASK_DIR.to_string(),
                task_dir.to_string_lossy().to_string(),
            ),
        ];
        env.extend(self.identity.iter().cloned());
        let spec = Spec {
            argv: argv.clone(),
            cwd: &self.env.worktree.clone(),
            env: env.clone(),
            timeout: Duration::from_secs(self.cfg.agent_timeout_seconds.max(1)),
            artifact: Some(artifacts.join("agent-output.txt")),
            own_group: false,
            result_grace: run::RESULT_GRACE,
        };
        let outcome = match self.supervise(spec).await {
            None => return self.abandon(&task).await,
            Some(Ok(o)) => o,
            Some(Err(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
                ) =>
            {
                let msg = format!(
                    "agent command '{}' cannot be run ({e}); install it or set agent.command in .zerg/config.yaml",
                    argv[0]
                );
                eprintln!("zerg-worker-agent: {msg}");
                self.fail(&task, "agent_missing", msg, 0, String::new())
                    .await;
                return TaskEnd::Exit(exit::BLOCKED);
            }
            Some(Err(e)) => {
                return self
                    .fail(
                        &task,
                        "agent_failed",
                        format!("cannot run the agent: {e}"),
                        0,
                        String::new(),
                    )
                    .await;
            }
        };

        self.attempt_cost = outcome.cost_usd.unwrap_or(0.0);
        if outcome.lingered {
            eprintln!(
                "zerg-worker-agent: the agent CLI printed its result but did not exit within {:?}; stopped it",
                run::RESULT_GRACE
            );
        }

        // Handoffs the agent CLI may have left.
        if let Some(esc) = read_json(&task_dir.join(ESCALATION_FILE)) {
            return self.escalate(&task, esc).await;
        }
        if let Some(cp) = read_json(&task_dir.join(CHECKPOINT_FILE)) {
            return self.checkpoint(&task, cp).await;
        }
        // A usage limit only counts when the run failed: a successful run may merely mention one.
        if let Some(reset) = outcome.rate_limit.filter(|_| !outcome.success()) {
            return self
                .fail(
                    &task,
                    "rate_limited",
                    format!("agent reported a usage limit: {}", last_line(&outcome.tail)),
                    reset,
                    String::new(),
                )
                .await;
        }
        if outcome.timed_out {
            return self
                .fail(
                    &task,
                    "agent_timeout",
                    format!(
                        "agent ran longer than {}s (agent.timeout_seconds)",
                        self.cfg.agent_timeout_seconds
                    ),
                    0,
                    String::new(),
                )
                .await;
        }
        if !outcome.success() {
            let code = outcome
                .code
                .map(|c| c.to_string())
                .unwrap_or_else(|| "signal".into());
            return self
                .fail(
                    &task,
                    "agent_failed",
                    format!("agent exited {code}: {}", last_line(&outcome.tail)),
                    0,
                    String::new(),
                )
                .await;
        }

        // Three-tier verification.
        let tiers = self.cfg.tiers.clone();
        for (i, t) in tiers.iter().enumerate() {
            let (cmd, timeout) = if !t.command.is_empty() {
                (t.command.clone(), t.timeout_seconds)
            } else if t.tier == 2 && !task.verification_command.is_empty() {
                (
                    task.verification_command.clone(),
                    task.verification_timeout_seconds,
                )
            } else {
                continue;
            };
            let step = match t.tier {
                1 => "verifying_tier1",
                2 => "verifying_tier2",
                _ => "verifying_tier3",
            };
            self.set_step(step, 70 + 10 * i as u32);
            let spec = Spec {
                argv: vec!["sh".into(), "-c".into(), cmd.clone()],
                cwd: &self.env.worktree.clone(),
                env: env.clone(),
                timeout: Duration::from_secs(timeout.max(1)),
                artifact: Some(artifacts.join(format!("verification-tier{}.txt", t.tier))),
                own_group: true,
                // Verification commands print no stream-json; a stray match must not cut them short.
                result_grace: Duration::from_secs(timeout.max(1)),
            };
            let o = match self.supervise(spec).await {
                None => return self.abandon(&task).await,
                Some(Ok(o)) => o,
                Some(Err(e)) => Outcome {
                    tail: format!("cannot run sh: {e}"),
                    ..Default::default()
                },
            };
            self.tiers.push(v1::TierResult {
                tier: t.tier,
                name: t.name.clone(),
                success: o.success(),
                blocking: t.blocking,
                exit_code: o.code.unwrap_or(-1),
                output_tail: last_line(&o.tail),
            });
            if !o.success() && t.blocking {
                let why = if o.timed_out {
                    format!("timed out after {timeout}s")
                } else {
                    format!("exit {}", o.code.unwrap_or(-1))
                };
                return self
                    .fail(
                        &task,
                        "verification_failed",
                        format!(
                            "tier {} ({}) `{cmd}` failed ({why}): {}",
                            t.tier,
                            t.name,
                            last_line(&o.tail)
                        ),
                        0,
                        String::new(),
                    )
                    .await;
            }
        }

        // Commit.
        self.set_step("committing", 95);
        let commit = match self.commit(&task).await {
            Ok(c) => c,
            Err(e) => return self.fail(&task, "commit_failed", e, 0, String::new()).await,
        };
        let out_of_scope = self.out_of_scope(&task, &commit).await;
        let req = v1::CompleteRequest {
            worker: Some(self.env.me()),
            lease_id: task.lease_id.clone(),
            task_id: task.id.clone(),
            commit: commit.clone(),
            tiers: self.tier_results(),
            out_of_scope,
            duration_ms: started.elapsed().as_millis() as u64,
            cost_usd: self.attempt_cost,
        };
        match retrying!(self, |c| c.complete(req.clone())) {
            Ok(_) => {
                self.tasks_completed += 1;
                eprintln!("zerg-worker-agent: task {} committed {commit}", task.id);
                TaskEnd::Next
            }
            Err(s) if s.code() == Code::FailedPrecondition => {
                // Our lease was superseded (we were presumed dead): drop the commit so it can
                // never reach staging twice.
                eprintln!(
                    "zerg-worker-agent: zergd refused the result ({}); discarding commit {commit}",
                    s.message()
                );
                let _ = run::git(
                    &self.env.worktree,
                    &["reset", "--hard", "-q", &task.base_commit],
                )
                .await;
                TaskEnd::Next
            }
            Err(s) => {
                eprintln!(
                    "zerg-worker-agent: cannot report completion: {}",
                    s.message()
                );
                TaskEnd::Exit(exit::ERROR)
            }
        }
    }

    async fn abandon(&mut self, task: &v1::Task) -> TaskEnd {
        if !task.base_commit.is_empty() {
            let _ = run::git(
                &self.env.worktree,
                &["reset", "--hard", "-q", &task.base_commit],
            )
            .await;
        }
        if *self.abort_rx.borrow() == Some(Revocation::Superseded) {
            return TaskEnd::Exit(exit::ERROR);
        }
        TaskEnd::Next
    }

    async fn commit(&self, task: &v1::Task) -> Result<String, String> {
        let wt = &self.env.worktree;
        let mut add: Vec<String> = vec!["add".into(), "-A".into(), "--".into(), ".".into()];
        add.extend(self.pathspec_excludes().await);
        let add_ref: Vec<&str> = add.iter().map(String::as_str).collect();
        run::git(wt, &add_ref).await?;
        self.restore_spec(task).await;
        let msg = format!(
            "ZERG [{}]: {}\n\nTask-ID: {}\n",
            self.env.worker_id, task.title, task.id
        );
        self.git_with_identity(&["commit", "-q", "--allow-empty", "--no-verify", "-m", &msg])
            .await?;
        run::git(wt, &["rev-parse", "HEAD"]).await
    }

    /// Puts the rush's spec back in the index as the base commit has it, whatever the agent CLI
    /// did to it (or committed itself), so the task's commit never changes the spec.
    async fn restore_spec(&self, task: &v1::Task) {
        let base = if task.base_commit.is_empty() {
            "HEAD"
        } else {
            task.base_commit.as_str()
        };
        let rel = self.env.spec_rel();
        if let Err(e) = run::git(&self.env.worktree, &["reset", "-q", base, "--", &rel]).await {
            eprintln!("zerg-worker-agent: cannot restore {rel} in the index: {e}");
        }
    }

    async fn git_with_identity(&self, args: &[&str]) -> Result<String, String> {
        let out = tokio::process::Command::new("git")
            .arg("-C")
            .arg(&self.env.worktree)
            .args(args)
            .envs(self.identity.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .map_err(|e| format!("cannot run git: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(format!(
                "git {}: {}",
                args.first().unwrap_or(&""),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Files the task changed that it does not own.
    async fn out_of_scope(&self, task: &v1::Task, commit: &str) -> Vec<String> {
        if task.base_commit.is_empty() {
            return vec![];
        }
        let changed = run::git(
            &self.env.worktree,
            &["diff", "--name-only", &task.base_commit, commit],
        )
        .await
        .unwrap_or_default();
        changed
            .lines()
            .filter(|f| !f.is_empty())
            .filter(|f| {
                !task
                    .files_create
                    .iter()
                    .chain(&task.files_modify)
                    .any(|o| o == f)
            })
            .map(str::to_string)
            .collect()
    }

    async fn escalate(&mut self, task: &v1::Task, esc: serde_json::Value) -> TaskEnd {
        let category = esc["category"]
            .as_str()
            .unwrap_or("ambiguous_spec")
            .to_string();
        let message = esc["message"].as_str().unwrap_or("").to_string();
        let req = v1::EscalateRequest {
            worker: Some(self.env.me()),
            lease_id: task.lease_id.clone(),
            task_id: task.id.clone(),
            category: category.clone(),
            message: message.clone(),
            context_json: esc
                .get("context")
                .map(|c| c.to_string())
                .unwrap_or_default(),
        };
        if let Err(s) = retrying!(self, |c| c.escalate(req.clone())) {
            eprintln!(
                "zerg-worker-agent: cannot report escalation: {}",
                s.message()
            );
        }
        self.fail(
            task,
            "escalated",
            format!("[{category}] {message}"),
            0,
            String::new(),
        )
        .await;
        TaskEnd::Exit(exit::ESCALATION)
    }

    async fn checkpoint(&mut self, task: &v1::Task, cp: serde_json::Value) -> TaskEnd {
        let pct = cp["progress_pct"].as_u64().unwrap_or(0);
        let next = cp["next_action"].as_str().unwrap_or("").to_string();
        let wt = self.env.worktree.clone();
        let mut add: Vec<String> = vec!["add".into(), "-A".into(), "--".into(), ".".into()];
        add.extend(self.pathspec_excludes().await);
        let add_ref: Vec<&str> = add.iter().map(String::as_str).collect();
        let _ = run::git(&wt, &add_ref).await;
        self.restore_spec(task).await;
        let files = run::git(&wt, &["diff", "--cached", "--name-status"])
            .await
            .unwrap_or_default();
        let listed: Vec<String> = files
            .lines()
            .filter_map(|l| {
                let (st, f) = l.split_once('\t')?;
                let kind = if st.starts_with('A') {
                    "added"
                } else if st.starts_with('D') {
                    "deleted"
                } else {
                    "modified"
                };
                Some(format!("  - {f} ({kind})"))
            })
            .collect();
        let msg = format!(
            "WIP: ZERG [worker-{w}] checkpoint during {t}\n\nStatus: {pct}% complete\nFiles modified:\n{files}\n\nResume context:\n  - Current step: implementing\n  - Next action: {next}\n  - Blockers: none\n\nWorker-ID: {w}\nFeature: {f}\nContext-Usage: {pct}%\n",
            w = self.env.worker_id,
            t = task.id,
            files = listed.join("\n"),
            f = self.env.feature,
        );
        let sha = match self
            .git_with_identity(&["commit", "-q", "--allow-empty", "--no-verify", "-m", &msg])
            .await
        {
            Ok(_) => run::git(&wt, &["rev-parse", "HEAD"])
                .await
                .unwrap_or_default(),
            Err(e) => {
                eprintln!("zerg-worker-agent: checkpoint commit failed: {e}");
                String::new()
            }
        };
        if !sha.is_empty() {
            // Keep the checkpoint reachable after the worker branch moves on.
            let r = format!("refs/zerg/{}/wip/{}", self.env.feature, task.id);
            let _ = run::git(&wt, &["update-ref", &r, &sha]).await;
        }
        self.fail(
            task,
            "checkpoint",
            format!("checkpoint at {pct}%: {next}"),
            0,
            sha,
        )
        .await;
        TaskEnd::Exit(exit::CHECKPOINT)
    }
}

/// Removes `index.lock` and `HEAD.lock` from the worktree's own git directory.
async fn remove_stale_locks(worktree: &Path) {
    if let Ok(dir) = run::git(worktree, &["rev-parse", "--absolute-git-dir"]).await {
        for name in ["index.lock", "HEAD.lock"] {
            let p = Path::new(&dir).join(name);
            if tokio::fs::remove_file(&p).await.is_ok() {
                eprintln!("zerg-worker-agent: removed stale {}", p.display());
            }
        }
    }
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    let bytes = std::fs::read(path).ok()?;
    Some(
        serde_json::from_slice(&bytes).unwrap_or_else(
            |_| serde_json::json!({"message": String::from_utf8_lossy(&bytes).trim()}),
        ),
    )
}

fn last_line(tail: &str) -> String {
    let t: Vec<&str> = tail.lines().filter(|l| !l.trim().is_empty()).collect();
    let s = t[t.len().saturating_sub(3)..].join(" | ");
    s.chars().take(500).collect()
}

/// Keeps a client-streaming Heartbeat RPC open and feeds it from the work loop; reconnects when
/// zergd goes away; reports a refused heartbeat (revoked lease) through `abort`.
async fn heartbeat_loop(
    env: Env,
    mut rx: mpsc::Receiver<v1::HeartbeatRequest>,
    abort: watch::Sender<Option<Revocation>>,
) {
    let mut pending: Option<v1::HeartbeatRequest> = None;
    loop {
        let ch = match connect_retrying(&env.socket, env.reconnect_timeout).await {
            Ok(c) => c,
            Err(_) => return,
        };
        let mut client = env.client(ch);
        let (tx, inner) = mpsc::channel(16);
        if let Some(p) = pending.take() {
            let _ = tx.try_send(p);
        }
        let call = client.heartbeat(ReceiverStream::new(inner));
        tokio::pin!(call);
        loop {
            tokio::select! {
                res = &mut call => {
                    if let Err(s) = res
                        && let Some(r) = Revocation::of_status(&s) {
                            let _ = abort.send(Some(r));
                        }
                    break;
                }
                m = rx.recv() => match m {
                    None => return,
                    Some(m) => {
                        if tx.send(m.clone()).await.is_err() {
                            pending = Some(m);
                            break;
                        }
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
