//! Workers in Docker containers, through the Docker Engine API ([`bollard`]); no docker CLI.
//!
//! Each worker is one container running `/usr/local/bin/zerg-worker-agent` directly (under
//! `docker-init`), so the agent's exit code *is* the container's exit code: a task watching
//! `wait_container` reports it the moment the container stops, together with the kernel's OOM
//! verdict. See `docs/Container-Mode.md` for the full picture; in short:
//!
//! - Mounts: the worktree at `/workspace` (rw), the spec snapshot read-only at
//!   `/workspace/.gsd/specs/<feature>`, the worker's own log dir at `/zerg/logs`, and the
//!   rush's worker-plane directory (one socket, the `Worker` service only) at `/zerg/run`.
//!   Nothing of `.zerg/state` and no control socket is inside. Git: the worktree's `.git` file
//!   names its admin dir by absolute host path, so a git directory is mounted *at the real
//!   one's path* — but it is the worker's private copy (prepared by zergd: config, `HEAD`, the
//!   refs as `packed-refs`, the worktree's admin dir with a sparse checkout that leaves the
//!   mounted spec alone, and its own object dir, with the real objects read-only at
//!   `/zerg/shared-objects` as an alternate). Whatever git writes inside stays private; zergd
//!   imports the new objects when the exit is reported (verified), checks a reported commit
//!   and moves the real worker branch itself. No file of the host's `.git` is writable from
//!   inside.
//! - Identity: never root. The agent runs as zergd's uid:gid, or, when zergd runs as root, as
//!   [`UNPRIVILEGED_UID`]; then the paths above are made group-accessible for that gid
//!   (by zergd before the spawn, and [`grant_socket`] again for a container adopted after a
//!   restart), leaving every owner unchanged.
//! - Hardening: all capabilities dropped, `no-new-privileges`, no Docker socket, memory / CPU /
//!   pids limits, network `none` unless configured.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, ContainerSummaryStateEnum, HostConfig, Mount,
    MountType,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, InspectContainerOptions, ListContainersOptionsBuilder,
    LogsOptionsBuilder, RemoveContainerOptionsBuilder, StopContainerOptionsBuilder,
    WaitContainerOptions,
};
use tokio::io::AsyncWriteExt;
use tokio_stream::StreamExt;

use super::subprocess::proc_start_time;
use super::{BoxFuture, Discovered, ExitInfo, ExitSink, Launcher, SpawnError, Spawned, WorkerSpec};

use zerg_proto::contract::{env as worker_env_names, image};

/// The image used when the rush config names none.
pub const DEFAULT_IMAGE: &str = image::DEFAULT_TAG;
/// The uid (and gid) the agent runs as when zergd runs as root.
pub const UNPRIVILEGED_UID: u32 = image::WORKER_UID;
/// The agent binary inside the image.
pub const AGENT_IN_IMAGE: &str = image::AGENT_PATH;

const WORKSPACE: &str = image::WORKSPACE;
const LOG_MOUNT: &str = image::LOG_MOUNT;
const RUN_MOUNT: &str = image::RUN_MOUNT;
const HOME_IN_IMAGE: &str = image::HOME;
/// Where the worker's cache is mounted (`XDG_CACHE_HOME`), inside its home.
const CACHE_IN_IMAGE: &str = "/home/worker/.cache";
/// Where the repository's real object store is visible (read-only) inside.
const SHARED_OBJECTS: &str = "/zerg/shared-objects";
/// How long the exit path waits for the log mirror to drain.
const LOG_DRAIN: Duration = Duration::from_secs(2);
/// Container paths a repository's git directory must not shadow.
const RESERVED: &[&str] = &[
    WORKSPACE,
    "/zerg",
    HOME_IN_IMAGE,
    "/proc",
    "/sys",
    "/dev",
    "/etc",
    "/bin",
    "/sbin",
    "/lib",
    "/lib64",
    "/usr/bin",
    "/usr/lib",
    "/usr/local/bin",
];

/// Launches workers as Docker containers.
#[derive(Debug, Clone)]
pub struct ContainerLauncher {
    docker: Docker,
}

impl ContainerLauncher {
    /// Connects to the local Docker engine (`DOCKER_HOST`, else `/var/run/docker.sock`),
    /// negotiates the API version (the engine may be older than the client) and pings it.
    ///
    /// The error says what to do when the engine is unreachable.
    pub async fn connect() -> Result<Self, SpawnError> {
        Ok(Self {
            docker: connect_engine().await?,
        })
    }

    async fn check_image(&self, image: &str) -> Result<(), SpawnError> {
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(()),
            Err(e) if status(&e) == Some(404) => Err(missing_image(image)),
            Err(e) => Err(engine_error("cannot inspect image", &e)),
        }
    }

    /// Creates the container; a leftover container of ours with the same name is removed and
    /// the creation retried once.
    async fn create(
        &self,
        name: &str,
        body: ContainerCreateBody,
        spec: &WorkerSpec,
    ) -> Result<String, SpawnError> {
        let opts = CreateContainerOptionsBuilder::new().name(name).build();
        let image = body.image.clone().unwrap_or_default();
        let mut retried = false;
        loop {
            match self
                .docker
                .create_container(Some(opts.clone()), body.clone())
                .await
            {
                Ok(r) => return Ok(r.id),
                Err(e) if status(&e) == Some(409) && !retried => {
                    retried = true;
                    let old = self
                        .docker
                        .inspect_container(name, None::<InspectContainerOptions>)
                        .await
                        .map_err(|e| engine_error("cannot inspect conflicting container", &e))?;
                    let labels = old.config.and_then(|c| c.labels).unwrap_or_default();
                    if labels.get(LABEL_FEATURE) != Some(&spec.feature)
                        || labels.get(LABEL_WORKER) != Some(&spec.worker_id.to_string())
                    {
                        return Err(SpawnError::new(format!(
                            "container name {name} is taken by a container zergd did not create: remove or rename it"
                        )));
                    }
                    tracing::warn!(
                        container = name,
                        "removing leftover container with the same name"
                    );
                    self.remove(name).await;
                }
                Err(e) if status(&e) == Some(404) => return Err(missing_image(&image)),
                Err(e) => return Err(engine_error("cannot create container", &e)),
            }
        }
    }

    async fn remove(&self, id: &str) {
        let opts = RemoveContainerOptionsBuilder::new().force(true).build();
        match self.docker.remove_container(id, Some(opts)).await {
            // Gone already.
            Ok(())
            | Err(DockerError::DockerResponseServerError {
                status_code: 404, ..
            }) => {}
            // Being removed by a concurrent call: wait until it is gone, so callers can rely
            // on it.
            Err(DockerError::DockerResponseServerError {
                status_code: 409, ..
            }) => {
                for _ in 0..50 {
                    let gone = self
                        .docker
                        .inspect_container(id, None::<InspectContainerOptions>)
                        .await
                        .is_err();
                    if gone {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            Err(e) => tracing::warn!(container = id, error = %e, "cannot remove container"),
        }
    }
}

impl Launcher for ContainerLauncher {
    fn spawn(&self, spec: WorkerSpec, on_exit: ExitSink) -> BoxFuture<Result<Spawned, SpawnError>> {
        let this = self.clone();
        Box::pin(async move {
            let image = image_of(&spec);
            this.check_image(&image).await?;
            let facts = spec.container.host.clone().ok_or_else(|| {
                SpawnError::new(
                    "the container's host side was not prepared (zergd prepares it before a spawn)",
                )
            })?;
            let name = container_name(&spec);
            let id = this
                .create(&name, create_body(&spec, &facts), &spec)
                .await?;
            if let Err(e) = this.docker.start_container(&id, None).await {
                this.remove(&id).await;
                return Err(engine_error(&format!("cannot start container {name}"), &e));
            }
            let pid = match this
                .docker
                .inspect_container(&id, None::<InspectContainerOptions>)
                .await
            {
                Ok(info) => info
                    .state
                    .and_then(|s| s.pid)
                    .filter(|p| *p > 0)
                    .map(|p| p as i32),
                Err(_) => None,
            };
            let log_path = spec.log_dir.join(format!("worker-{}.log", spec.worker_id));
            let logs = mirror_logs(
                this.docker.clone(),
                id.clone(),
                log_path,
                0,
                spec.container.log_max_bytes,
            );
            tokio::spawn(finish(this.clone(), id.clone(), Some(logs), on_exit));
            tracing::info!(container = %name, image = %image, "worker container started");
            Ok(Spawned {
                pid,
                start_time: pid.and_then(proc_start_time),
                container_id: Some(id),
            })
        })
    }

    fn stop(&self, worker: Spawned, grace: Duration) -> BoxFuture<()> {
        let this = self.clone();
        Box::pin(async move {
            let Some(id) = worker.container_id else {
                return;
            };
            let secs = grace.as_secs_f64().ceil().min(i32::MAX as f64) as i32;
            let opts = StopContainerOptionsBuilder::new().t(secs).build();
            // The engine answers once the container is down: give the request the grace period.
            let docker = this
                .docker
                .clone()
                .with_timeout(ENGINE_TIMEOUT.saturating_add(grace));
            match docker.stop_container(&id, Some(opts)).await {
                Ok(()) => {}
                // 304: already stopped; 404: gone.
                Err(e) if matches!(status(&e), Some(304 | 404)) => {}
                Err(e) => {
                    tracing::warn!(container = %id, error = %e, "cannot stop container; removing it by force")
                }
            }
            this.remove(&id).await;
        })
    }

    fn is_alive(&self, worker: Spawned) -> BoxFuture<bool> {
        let docker = self.docker.clone();
        Box::pin(async move {
            let Some(id) = worker.container_id else {
                return false;
            };
            match docker
                .inspect_container(&id, None::<InspectContainerOptions>)
                .await
            {
                Ok(info) => info.state.and_then(|s| s.running).unwrap_or(false),
                Err(_) => false,
            }
        })
    }

    fn watch(&self, worker: Spawned, on_exit: ExitSink) {
        let this = self.clone();
        tokio::spawn(async move {
            let Some(id) = worker.container_id else {
                on_exit(ExitInfo::Vanished);
                return;
            };
            let mut logs = None;
            if let Ok(info) = this
                .docker
                .inspect_container(&id, None::<InspectContainerOptions>)
                .await
            {
                let adopted = Adopted::from_inspect(&info);
                // A restarted zergd recreated its socket: let the agent reconnect.
                if let (Some(sock), Some((_, gid))) = (&adopted.socket, adopted.remapped)
                    && let Err(e) = grant_socket(sock, gid)
                {
                    tracing::warn!(socket = %sock.display(), error = %e, "cannot grant the container access to the socket");
                }
                if let Some(path) = adopted.log_file {
                    let since = fs::metadata(&path)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                        .map(|d| d.as_secs().min(i32::MAX as u64) as i32)
                        .unwrap_or(0);
                    logs = Some(mirror_logs(
                        this.docker.clone(),
                        id.clone(),
                        path,
                        since,
                        DEFAULT_LOG_MAX,
                    ));
                }
            }
            finish(this, id, logs, on_exit).await;
        });
    }

    fn discover(&self, rush_id: &str) -> BoxFuture<Vec<Discovered>> {
        let docker = self.docker.clone();
        let filter = format!("{LABEL_RUSH}={rush_id}");
        Box::pin(async move {
            let filters = HashMap::from([("label", vec![filter])]);
            let opts = ListContainersOptionsBuilder::new()
                .all(true)
                .filters(&filters)
                .build();
            let list = match docker.list_containers(Some(opts)).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list worker containers");
                    return Vec::new();
                }
            };
            list.into_iter()
                .filter_map(|c| {
                    let labels = c.labels.unwrap_or_default();
                    let (worker_id, generation) = parse_worker_labels(&labels)?;
                    if c.state == Some(ContainerSummaryStateEnum::REMOVING) {
                        return None;
                    }
                    let running = matches!(
                        c.state,
                        Some(
                            ContainerSummaryStateEnum::RUNNING
                                | ContainerSummaryStateEnum::PAUSED
                                | ContainerSummaryStateEnum::RESTARTING
                        )
                    );
                    Some(Discovered {
                        worker_id,
                        generation,
                        spawned: Spawned {
                            pid: None,
                            start_time: None,
                            container_id: c.id,
                        },
                        running,
                    })
                })
                .collect()
        })
    }

    fn cleanup(&self, worker: Spawned) -> BoxFuture<()> {
        let this = self.clone();
        Box::pin(async move {
            if let Some(id) = worker.container_id {
                this.remove(&id).await;
            }
        })
    }
}

/// The exit path shared by spawned and adopted containers: wait, drain the log mirror, report
/// the exit once (zergd takes the worker's git objects then), remove the container.
async fn finish(
    this: ContainerLauncher,
    id: String,
    logs: Option<tokio::task::JoinHandle<()>>,
    on_exit: ExitSink,
) {
    let info = wait_for_exit(&this.docker, &id).await;
    if let Some(h) = logs {
        let _ = tokio::time::timeout(LOG_DRAIN, h).await;
    }
    tracing::info!(container = %id, exit = %info.describe(), "worker container exited");
    on_exit(info);
    this.remove(&id).await;
}

/// Waits until the container is no longer running and says how it ended. Survives a dropped
/// engine connection (it waits again); a container that disappears is `Vanished`.
async fn wait_for_exit(docker: &Docker, id: &str) -> ExitInfo {
    let mut pause = Duration::from_millis(500);
    loop {
        let mut stream = std::pin::pin!(docker.wait_container(id, None::<WaitContainerOptions>));
        let waited = match stream.next().await {
            Some(Ok(r)) => Some(r.status_code),
            // bollard reports a non-zero exit as an error carrying the code.
            Some(Err(DockerError::DockerContainerWaitError { code, .. })) => Some(code),
            _ => None,
        };
        match docker
            .inspect_container(id, None::<InspectContainerOptions>)
            .await
        {
            Ok(info) => {
                let state = info.state.unwrap_or_default();
                match (waited, state.running.unwrap_or(false)) {
                    (Some(code), _) => return exit_info(code, state.oom_killed.unwrap_or(false)),
                    (None, false) => {
                        return exit_info(
                            state.exit_code.unwrap_or(-1),
                            state.oom_killed.unwrap_or(false),
                        );
                    }
                    (None, true) => {}
                }
            }
            Err(e) if status(&e) == Some(404) => {
                return waited
                    .map(|c| exit_info(c, false))
                    .unwrap_or(ExitInfo::Vanished);
            }
            Err(_) => {
                if let Some(code) = waited {
                    return exit_info(code, false);
                }
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(10));
    }
}

/// The log cap of a container adopted after a restart (its rush's own setting is not on it).
const DEFAULT_LOG_MAX: u64 = 64 << 20;

/// Appends the container's output to `path` (like the subprocess launcher's
/// `worker-<N>.log`) until the container stops, at most `max` bytes of it; past that one line
/// says the rest was cut (the engine's own copy is capped the same way).
fn mirror_logs(
    docker: Docker,
    id: String,
    path: PathBuf,
    since: i32,
    max: u64,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .await;
        let mut file = match file {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot open worker log");
                return;
            }
        };
        let opts = LogsOptionsBuilder::new()
            .follow(true)
            .stdout(true)
            .stderr(true)
            .since(since)
            .build();
        let mut stream = std::pin::pin!(docker.logs(&id, Some(opts)));
        let mut written = 0u64;
        while let Some(Ok(chunk)) = stream.next().await {
            let bytes = chunk.into_bytes();
            let room = max.saturating_sub(written);
            let take = bytes.len().min(usize::try_from(room).unwrap_or(usize::MAX));
            if file.write_all(&bytes[..take]).await.is_err() {
                break;
            }
            written += take as u64;
            if take < bytes.len() {
                let note = format!(
                    "\n[zerg] this container's output passed container.log_max_size ({max} bytes); the rest is not kept\n"
                );
                let _ = file.write_all(note.as_bytes()).await;
                break;
            }
        }
        let _ = file.flush().await;
    })
}

/// What a container inspected after a zergd restart tells about itself.
#[derive(Debug, Default)]
struct Adopted {
    socket: Option<PathBuf>,
    log_file: Option<PathBuf>,
    remapped: Option<(u32, u32)>,
}

impl Adopted {
    fn from_inspect(info: &ContainerInspectResponse) -> Self {
        let mounts = info.mounts.clone().unwrap_or_default();
        let source_of = |dest: &str| {
            mounts
                .iter()
                .find(|m| m.destination.as_deref() == Some(dest))
                .and_then(|m| m.source.clone())
                .map(PathBuf::from)
        };
        let config = info.config.clone().unwrap_or_default();
        let labels = config.labels.unwrap_or_default();
        let worker = labels.get(LABEL_WORKER).and_then(|w| w.parse::<u32>().ok());
        let remapped = config
            .user
            .as_deref()
            .and_then(parse_user)
            .filter(|_| nix::unistd::geteuid().is_root());
        Self {
            socket: source_of(RUN_MOUNT).map(|d| d.join(crate::PLANE_SOCKET_NAME)),
            // The mirrored log is `worker-<N>.log` beside the worker's own log dir.
            log_file: source_of(LOG_MOUNT)
                .and_then(|d| d.parent().map(Path::to_path_buf))
                .zip(worker)
                .map(|(d, w)| d.join(format!("worker-{w}.log"))),
            remapped,
        }
    }
}

fn parse_user(user: &str) -> Option<(u32, u32)> {
    let (u, g) = user.split_once(':')?;
    Some((u.parse().ok()?, g.parse().ok()?))
}

mod spec;

use crate::engine::{
    ENGINE_TIMEOUT, connect_engine, engine_error, exit_info, image_of, missing_image, status,
};
pub use crate::engine::{
    LABEL_FEATURE, LABEL_GENERATION, LABEL_RUSH, LABEL_WORKER, parse_worker_labels,
};
pub use spec::*;

/// Lets the container's gid connect to the worker-plane socket: group search on its directory
/// (which holds nothing else) and group read/write on the socket. The control socket's
/// directory above stays closed to everyone but zergd's user. Both are zergd's own; no
/// container can write either.
pub fn grant_socket(socket: &Path, gid: u32) -> io::Result<()> {
    if let Some(dir) = socket.parent() {
        set_group_bits(dir, gid, 0o010)?;
    }
    set_group_bits(socket, gid, 0o060)
}

fn set_group_bits(path: &Path, gid: u32, want: u32) -> io::Result<()> {
    let meta = fs::metadata(path)?;
    if meta.gid() != gid {
        std::os::unix::fs::chown(path, None, Some(gid))?;
    }
    let mode = meta.mode() & 0o7777;
    if mode & want != want || meta.gid() != gid {
        fs::set_permissions(path, fs::Permissions::from_mode(mode | want))?;
    }
    Ok(())
}
