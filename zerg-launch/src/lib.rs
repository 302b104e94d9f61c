//! How zerg's workers are started and stopped: the [`Launcher`] trait, with a subprocess
//! implementation ([`subprocess`]), a Docker implementation ([`container`]), and, for workers
//! that share no filesystem with zergd, Docker Swarm ([`swarm`]) and Kubernetes ([`kubernetes`]).
//! What the engine launchers share (labels, the engine connection, its errors) is in [`engine`].
//!
//! The crate knows the contracts (`zerg-proto`) and the plain settings (`zerg-config`) and
//! nothing else: it does no git and never calls back into zergd. What a worker needs prepared
//! on the host (a container's private git dir, its home) is prepared by zergd and handed in with
//! the [`WorkerSpec`]; what a worker leaves behind (a container's git objects) is taken by zergd
//! when the exit is reported.
//!
//! A launcher starts one `zerg-worker-agent` per call, reports its exit exactly once through the
//! [`ExitSink`] it was given (the moment it happens, not at the next poll), and can stop a worker
//! (SIGTERM to the whole process group or container, then SIGKILL after a grace period).

pub mod container;
pub mod engine;
pub mod gate;
pub mod kubernetes;
pub mod subprocess;
pub mod swarm;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod token;

pub use token::WorkerToken;

/// File name of a worker-plane socket inside its own directory.
pub const PLANE_SOCKET_NAME: &str = "worker.sock";

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

/// A boxed future, so launchers can be used as trait objects.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Receives a worker's exit, once.
pub type ExitSink = Box<dyn FnOnce(ExitInfo) + Send + 'static>;

/// Everything needed to start one worker.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// Rush id.
    pub rush_id: String,
    /// Feature name.
    pub feature: String,
    /// Worker slot.
    pub worker_id: u32,
    /// Spawn generation of the slot.
    pub generation: u64,
    /// Repository root (host path).
    pub repo: PathBuf,
    /// The worker's worktree (host path).
    pub worktree: PathBuf,
    /// The worker's branch.
    pub branch: String,
    /// The rush's spec snapshot (host path).
    pub spec_dir: PathBuf,
    /// `.zerg/state` (host path).
    pub state_dir: PathBuf,
    /// `.zerg/logs` (host path).
    pub log_dir: PathBuf,
    /// The rush's worker-plane socket (host path); never the control socket.
    pub socket: PathBuf,
    /// The worker's token for this generation.
    pub token: WorkerToken,
    /// The `zerg-worker-agent` binary (host path).
    pub agent_bin: PathBuf,
    /// Container settings (container mode only).
    pub container: ContainerSpec,
    /// Variables of zergd's environment a subprocess worker inherits beyond the built-in
    /// allowlist (`agent.env_passthrough`; a `*` suffix is a prefix).
    pub env_passthrough: Vec<String>,
    /// How a worker that shares no filesystem with zergd reaches it (swarm and kubernetes
    /// modes); empty in the local modes.
    pub remote: RemoteSpec,
    /// How long a stopped worker has to exit before it is killed
    /// (`workers.stop_grace_seconds`); a swarm service is created with it.
    pub stop_grace: Duration,
    /// The wall a subprocess worker runs inside (`sandbox:`); `None` runs it as the user, with
    /// nothing closed to it.
    pub sandbox: Option<SandboxSpec>,
}

/// How a subprocess worker is confined: the bubblewrap binary, and the policy zergd built for
/// this worker (its private git dir, home and `/tmp` prepared on the host).
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    /// The bubblewrap binary.
    pub bwrap: PathBuf,
    /// What the worker sees and may reach.
    pub policy: zerg_sandbox::Policy,
    /// `$HOME` inside (the private home's mount point).
    pub home: PathBuf,
}

/// The TCP worker plane as a remote worker sees it.
#[derive(Debug, Clone, Default)]
pub struct RemoteSpec {
    /// The URL workers dial, `https://host:port` (`remote.advertise_url`).
    pub plane_url: String,
    /// PEM of the CA that signed the plane's server certificate.
    pub ca_pem: String,
}

impl RemoteSpec {
    /// Refuses to start a remote worker that could not reach zergd: the TCP plane is not
    /// serving.
    pub fn check(&self) -> Result<(), SpawnError> {
        if self.plane_url.is_empty() || self.ca_pem.is_empty() {
            return Err(SpawnError::new(
                "zergd's TCP worker plane is not serving (zergd's log says why: remote.listen in use, or the TLS files of remote.tls_*), so a remote worker could not reach it",
            ));
        }
        Ok(())
    }
}

/// Container-mode settings from the rush config.
#[derive(Debug, Clone, Default)]
pub struct ContainerSpec {
    /// Image.
    pub image: String,
    /// Network mode.
    pub network: String,
    /// Memory limit in bytes.
    pub memory_bytes: i64,
    /// CPU limit in cores.
    pub cpus: f64,
    /// Process limit.
    pub pids_limit: i64,
    /// The host side zergd prepared for the container (its git layout, identity, the host's
    /// facts); `None` until it has, and a container spawn without it is refused.
    pub host: Option<container::HostFacts>,
    /// Largest container log the engine keeps, and the largest `worker-<N>.log` the mirror
    /// writes, in bytes.
    pub log_max_bytes: u64,
}

/// The environment of a remote worker (swarm and kubernetes modes): the worker's identity, the
/// plane's URL, where its CA and its token are mounted, the image's paths, a git identity, and
/// the variables a container worker would be passed through (the agent CLI's API keys). The
/// token itself is never in it.
pub fn remote_env(spec: &WorkerSpec) -> Vec<(String, String)> {
    use zerg_proto::contract::{env, image};
    let mut out: Vec<(String, String)> = vec![
        (env::PLANE_URL.into(), spec.remote.plane_url.clone()),
        (env::PLANE_CA.into(), image::REMOTE_CA_PATH.into()),
        (
            env::WORKER_TOKEN_FILE.into(),
            format!("{}/{}", image::SECRET_DIR, image::TOKEN_FILE_NAME),
        ),
        (env::RUSH_ID.into(), spec.rush_id.clone()),
        (env::WORKER_ID.into(), spec.worker_id.to_string()),
        (env::GENERATION.into(), spec.generation.to_string()),
        (env::FEATURE.into(), spec.feature.clone()),
        (env::BRANCH.into(), spec.branch.clone()),
        (env::WORKTREE.into(), image::WORKSPACE.into()),
        // The spec as committed in the base the worker checks out.
        (
            env::SPEC_DIR.into(),
            format!("{}/.gsd/specs/{}", image::WORKSPACE, spec.feature),
        ),
        (env::LOG_DIR.into(), image::LOG_MOUNT.into()),
        ("HOME".into(), image::HOME.into()),
        (
            "CLAUDE_CONFIG_DIR".into(),
            format!("{}/.claude", image::HOME),
        ),
        (
            "GIT_AUTHOR_NAME".into(),
            format!("zerg worker {}", spec.worker_id),
        ),
        ("GIT_AUTHOR_EMAIL".into(), "zerg-worker@localhost".into()),
        (
            "GIT_COMMITTER_NAME".into(),
            format!("zerg worker {}", spec.worker_id),
        ),
        ("GIT_COMMITTER_EMAIL".into(), "zerg-worker@localhost".into()),
    ];
    // Host files (a credentials file named by a variable) cannot follow a remote worker.
    let (passed, _host_files) =
        container::container_passthrough(std::env::vars(), &spec.env_passthrough);
    out.extend(
        passed
            .into_iter()
            .filter(|(_, v)| !v.starts_with("/zerg/host/")),
    );
    out
}

/// A started worker.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spawned {
    /// Process id (of the agent; inside a container, as seen by the host if known).
    pub pid: Option<i32>,
    /// Process start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
    pub start_time: Option<u64>,
    /// Container id.
    pub container_id: Option<String>,
}

/// How a worker ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitInfo {
    /// Exited with a code.
    Code(i32),
    /// Killed by a signal.
    Signal(i32),
    /// Killed by the kernel's OOM killer (containers).
    OomKilled,
    /// Gone, code unknown (a re-adopted worker, whose parent was an earlier zergd).
    Vanished,
}

impl ExitInfo {
    /// The shell-style code: signals as `128 + n`.
    pub fn code(&self) -> Option<i32> {
        match self {
            ExitInfo::Code(c) => Some(*c),
            ExitInfo::Signal(s) => Some(128 + s),
            ExitInfo::OomKilled => Some(137),
            ExitInfo::Vanished => None,
        }
    }

    /// A human description, e.g. `3 (blocked)` or `signal 9`.
    pub fn describe(&self) -> String {
        match self {
            ExitInfo::Code(c) => format!("{c} ({})", exit_meaning(*c)),
            ExitInfo::Signal(s) => format!("signal {s}"),
            ExitInfo::OomKilled => "OOM-killed".into(),
            ExitInfo::Vanished => "vanished".into(),
        }
    }
}

/// Meaning of a worker exit code: the worker's own codes, `interrupted` (130) and `crash`
/// for anything else.
pub fn exit_meaning(code: i32) -> &'static str {
    match zerg_proto::contract::WorkerExit::from_code(code) {
        Some(e) => e.meaning(),
        None if code == 130 => "interrupted",
        None => "crash",
    }
}

/// A spawn that failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct SpawnError {
    /// What went wrong, and what to do about it.
    pub message: String,
}

impl SpawnError {
    /// A spawn error with a message.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }
}

/// A worker found by [`Launcher::discover`] (for example a container left by an earlier zergd).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Discovered {
    /// Worker slot.
    pub worker_id: u32,
    /// Spawn generation.
    pub generation: u64,
    /// Handle.
    pub spawned: Spawned,
    /// Whether it is still running.
    pub running: bool,
}

/// Starts and stops workers.
pub trait Launcher: Send + Sync + 'static {
    /// Starts a worker. `on_exit` is called once when it ends.
    fn spawn(&self, spec: WorkerSpec, on_exit: ExitSink) -> BoxFuture<Result<Spawned, SpawnError>>;

    /// Stops a worker: SIGTERM (or the container equivalent), then SIGKILL after `grace`.
    fn stop(&self, worker: Spawned, grace: Duration) -> BoxFuture<()>;

    /// Whether a worker recorded by an earlier zergd is still the same live worker.
    fn is_alive(&self, worker: Spawned) -> BoxFuture<bool>;

    /// Starts watching a worker that an earlier zergd started; `on_exit` is called once when
    /// it ends.
    fn watch(&self, worker: Spawned, on_exit: ExitSink);

    /// Workers of a rush that exist right now (containers found by label). Subprocess workers
    /// are found through the state file instead, so the default is empty.
    fn discover(&self, _rush_id: &str) -> BoxFuture<Vec<Discovered>> {
        Box::pin(async { Vec::new() })
    }

    /// Removes what is left of a stopped worker (a container). Default: nothing.
    fn cleanup(&self, _worker: Spawned) -> BoxFuture<()> {
        Box::pin(async {})
    }
}
