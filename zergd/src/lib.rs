//! zergd, the zerg daemon.
//!
//! zergd runs a feature's task graph (`.gsd/specs/<feature>/task-graph.json`) across N
//! coding-agent workers, each in its own git worktree, level by level, merging every level into
//! `zerg/<feature>/staging` so the next level sees all of the previous one. It keeps the run
//! going when workers fail to spawn, crash or hang, and when zergd itself restarts.
//!
//! The crate is a library with a thin `main`: [`run`] serves the `zerg.v1` control API on a Unix
//! socket only its owner can open, and drives one [`supervisor::Supervisor`] actor that owns
//! every rush; workers reach zergd on a separate socket per rush ([`worker_plane`]).

pub mod alerts;
pub mod backoff;
pub mod calls;
pub mod clock;
pub use zerg_config as config;
pub mod container_host;
pub mod disk;
pub mod domain;
pub mod egress;
pub mod error;
pub use zerg_git::fsat;
pub mod git;
pub mod incoming;
pub use zerg_launch as launcher;
pub mod http;
pub mod logtail;
pub mod metrics;
pub mod monitor;
pub mod notify;
pub mod remote;
pub mod sandbox;
pub mod server;
pub mod state;
pub mod supervisor;
pub mod transfers;
pub mod wire;
pub mod worker_plane;
pub mod worktree_copy;

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::fcntl::{Flock, FlockArg};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use zerg_proto::v1::control_server::ControlServer;

use crate::clock::SystemClock;
use crate::supervisor::{Settings, Supervisor};

/// Environment variable naming the worker agent binary.
pub const ENV_WORKER_AGENT_BIN: &str = "ZERG_WORKER_AGENT_BIN";

/// Daemon options.
#[derive(Debug, Clone)]
pub struct Options {
    /// Control socket path.
    pub socket: PathBuf,
    /// Directory for zergd's own state (the rush registry).
    pub state_dir: PathBuf,
    /// The worker agent binary.
    pub agent_bin: PathBuf,
    /// The web dashboard and `/metrics` (`--http`); off when `None`.
    pub http: Option<http::HttpOptions>,
}

/// Why the daemon could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Another zergd holds the lock.
    #[error("another zergd is already running for {0}")]
    AlreadyRunning(PathBuf),
    /// Socket or filesystem problem.
    #[error("{context}")]
    Io {
        /// What was being done.
        context: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("gRPC server failed")]
    Server(#[from] tonic::transport::Error),
    /// The socket's directory is one that someone else could change.
    #[error(
        "the socket directory {dir} {why}; zergd needs a directory only you can change (chmod 700 it, or pick another --socket)"
    )]
    UnsafeSocketDir {
        /// The directory.
        dir: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The dashboard cannot start.
    #[error(transparent)]
    Http(#[from] http::HttpError),
    /// The supervisor actor panicked: zergd must exit non-zero so that its service manager
    /// restarts it (a restarted zergd resumes every rush from its state file).
    #[error("the supervisor panicked: {0}")]
    ActorPanicked(String),
}

/// Refuses a socket directory that is not ours or that group or others may write to.
fn check_private_dir(dir: &Path) -> Result<(), DaemonError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(dir).map_err(io_err(format!("cannot stat {}", dir.display())))?;
    let me = nix::unistd::geteuid().as_raw();
    let why = if meta.uid() != me {
        Some(format!("belongs to uid {}, not to you ({me})", meta.uid()))
    } else if meta.mode() & 0o022 != 0 {
        Some(format!(
            "can be written by group or others (mode {:o})",
            meta.mode() & 0o7777
        ))
    } else {
        None
    };
    match why {
        Some(why) => Err(DaemonError::UnsafeSocketDir {
            dir: dir.to_path_buf(),
            why,
        }),
        None => Ok(()),
    }
}

fn io_err(context: String) -> impl FnOnce(std::io::Error) -> DaemonError {
    move |source| DaemonError::Io { context, source }
}

/// The default directory for zergd's own state: `$XDG_STATE_HOME/zerg` (or the platform's
/// equivalent).
pub fn default_state_dir() -> PathBuf {
    directories::ProjectDirs::from("", "", "zerg")
        .map(|d| d.state_dir().unwrap_or(d.data_dir()).to_path_buf())
        .unwrap_or_else(|| std::env::temp_dir().join("zerg-state"))
}

/// Finds the worker agent binary: `$ZERG_WORKER_AGENT_BIN`, else next to this executable,
/// else `zerg-worker-agent` on `PATH`.
pub fn default_agent_bin() -> PathBuf {
    if let Some(p) = std::env::var_os(ENV_WORKER_AGENT_BIN).filter(|v| !v.is_empty()) {
        return PathBuf::from(p);
    }
    if let Ok(exe) = std::env::current_exe()
        && let Some(dir) = exe.parent()
    {
        let sib = dir.join("zerg-worker-agent");
        if sib.exists() {
            return sib;
        }
    }
    PathBuf::from("zerg-worker-agent")
}

/// Runs the daemon until `shutdown` resolves or a Shutdown RPC arrives.
pub async fn run(
    opts: Options,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    incoming::raise_fd_limit();
    let dir = opts.socket.parent().unwrap_or(Path::new(".")).to_path_buf();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(io_err(format!(
            "cannot create socket directory {}",
            dir.display()
        )))?;
    // A directory that existed before keeps its mode; one that others can write to would let
    // them replace the socket with their own.
    check_private_dir(&dir)?;
    std::fs::create_dir_all(&opts.state_dir).map_err(io_err(format!(
        "cannot create {}",
        opts.state_dir.display()
    )))?;

    // One daemon per socket: the lock file is separate from the socket so a stale socket from
    // a killed daemon never blocks a restart.
    let lock_path = opts.socket.with_extension("lock");
    let lock_file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(io_err(format!("cannot open {}", lock_path.display())))?;
    let _lock = Flock::lock(lock_file, FlockArg::LockExclusiveNonblock)
        .map_err(|_| DaemonError::AlreadyRunning(opts.socket.clone()))?;
    let _ = std::fs::remove_file(&opts.socket);
    let listener = UnixListener::bind(&opts.socket)
        .map_err(io_err(format!("cannot bind {}", opts.socket.display())))?;
    std::fs::set_permissions(&opts.socket, std::fs::Permissions::from_mode(0o600))
        .map_err(io_err(format!("cannot chmod {}", opts.socket.display())))?;

    // What the machine allows for the subprocess workers' sandbox, found once (it runs the
    // worker agent under bubblewrap).
    {
        let agent = opts.agent_bin.clone();
        let _ = tokio::task::spawn_blocking(move || sandbox::init(&agent)).await;
    }
    let settings = Settings {
        planes: Arc::new(worker_plane::Planes::beside(&opts.socket)),
        agent_bin: opts.agent_bin.clone(),
        registry_path: opts.state_dir.join("rushes.json"),
    };
    let sup = Supervisor::new(settings, Arc::new(SystemClock));
    let services = server::Services::new(sup.handle());
    // The dashboard is bound before zergd says it is ready: a bad address or a missing token
    // stops zergd with a message instead of a dashboard that never answers.
    let dashboard = match opts.http.clone() {
        Some(h) => {
            let (d, door) = http::Dashboard::bind(h, services.clone(), &dir).await?;
            services.set_door(door);
            tracing::info!(
                url = %format!("http://{}/", d.local_addr()),
                "dashboard listening (open it with `zergctl dashboard`; scripts send the token in {})",
                dir.join(http::door::DOOR_FILE).display()
            );
            Some(tokio::spawn(d.serve()))
        }
        None => None,
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<Result<(), DaemonError>>();
    let sup_task = tokio::spawn(async move {
        let _ = stop_tx.send(watch_actor(sup.run()).await);
    });
    tracing::info!(socket = %opts.socket.display(), agent = %opts.agent_bin.display(), "zergd listening");
    // The listener is bound: connections queue until the server below accepts them.
    notify::ready();
    let (outcome_tx, outcome_rx) = tokio::sync::oneshot::channel();
    let stop = async move {
        let outcome = tokio::select! {
            _ = shutdown => Ok(()),
            r = stop_rx => r.unwrap_or(Ok(())),
        };
        let _ = outcome_tx.send(outcome);
    };
    // Reflection lets grpcurl and other generic clients discover the API; only the control
    // service is advertised, and the same peer check guards it.
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(zerg_proto::FILE_DESCRIPTOR_SET)
        .with_service_name("zerg.v1.Control")
        .build_v1()
        .map_err(|e| DaemonError::Io {
            context: "cannot build the reflection service".into(),
            source: std::io::Error::other(e),
        })?;
    let result = tonic::transport::Server::builder()
        .add_service(ControlServer::with_interceptor(services, owner_only))
        .add_service(tonic::service::interceptor::InterceptedService::new(
            reflection, owner_only,
        ))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop)
        .await;
    notify::stopping();
    sup_task.abort();
    if let Some(d) = dashboard {
        d.abort();
    }
    let _ = std::fs::remove_file(&opts.socket);
    result?;
    outcome_rx.await.unwrap_or(Ok(()))
}

/// Lets only zergd's own user use the control socket. The socket is already 0600 in a 0700
/// directory; this checks every call's peer credentials (`SO_PEERCRED`) as well, refuses anyone
/// else with a status that says why, and logs the refusal.
pub fn owner_only(req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
    let me = nix::unistd::geteuid().as_raw();
    let peer = req
        .extensions()
        .get::<tonic::transport::server::UdsConnectInfo>()
        .and_then(|i| i.peer_cred);
    match peer {
        Some(c) if c.uid() == me => Ok(req),
        Some(c) => {
            tracing::warn!(
                uid = c.uid(),
                pid = c.pid(),
                "refused a control call from another user"
            );
            Err(tonic::Status::permission_denied(format!(
                "uid {} may not use zergd's control socket: it belongs to uid {me}",
                c.uid()
            )))
        }
        None => {
            tracing::warn!("refused a control call whose peer credentials are unknown");
            Err(tonic::Status::permission_denied(
                "zergd cannot tell who is calling on its control socket",
            ))
        }
    }
}

/// Runs the supervisor actor and turns a panic inside it into an error, so that the daemon
/// exits non-zero instead of quietly shutting down with status 0.
pub async fn watch_actor(
    actor: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    match tokio::spawn(actor).await {
        Ok(()) => Ok(()),
        Err(e) if e.is_panic() => {
            let p = e.into_panic();
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            tracing::error!(panic = %msg, "the supervisor panicked; exiting so the service manager restarts zergd");
            Err(DaemonError::ActorPanicked(msg))
        }
        Err(_) => Ok(()),
    }
}

/// Resolves when SIGINT or SIGTERM arrives.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down (workers keep running and are re-adopted on restart)"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_actor_panic_is_an_error_and_a_clean_stop_is_not() {
        let r = watch_actor(async { panic!("boom") }).await;
        assert!(
            matches!(&r, Err(DaemonError::ActorPanicked(m)) if m == "boom"),
            "{r:?}"
        );
        assert!(watch_actor(async {}).await.is_ok());
    }

    #[test]
    fn a_socket_directory_others_can_write_to_is_refused_by_name() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("run");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(check_private_dir(&dir).is_ok());
        for mode in [0o777, 0o1777, 0o720, 0o702] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = check_private_dir(&dir).unwrap_err().to_string();
            assert!(
                e.contains(&dir.display().to_string()) && e.contains("written by group or others"),
                "{mode:o}: {e}"
            );
        }
        // Readable by others is fine: the socket itself is 0600.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(check_private_dir(&dir).is_ok());
    }
}
