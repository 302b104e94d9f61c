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
//!   one's path* — but it is the worker's private copy ([`worker_git_dir`]: config, `HEAD`, the
//!   refs as `packed-refs`, the worktree's admin dir with a sparse checkout that leaves the
//!   mounted spec alone, and its own object dir, with the real objects read-only at
//!   `/zerg/shared-objects` as an alternate). Whatever git writes inside stays private; zergd
//!   imports the new objects ([`import_worker_objects`], verified), checks a reported commit
//!   and moves the real worker branch itself. No file of the host's `.git` is writable from
//!   inside.
//! - Identity: never root. The agent runs as zergd's uid:gid, or, when zergd runs as root, as
//!   [`UNPRIVILEGED_UID`]; then the paths above are made group-accessible for that gid
//!   ([`grant_container_access`]), leaving every owner unchanged.
//! - Hardening: all capabilities dropped, `no-new-privileges`, no Docker socket, memory / CPU /
//!   pids limits, network `none` unless configured.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
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

/// Label: the rush id.
pub const LABEL_RUSH: &str = "zerg.rush";
/// Label: the feature.
pub const LABEL_FEATURE: &str = "zerg.feature";
/// Label: the worker slot.
pub const LABEL_WORKER: &str = "zerg.worker";
/// Label: the spawn generation.
pub const LABEL_GENERATION: &str = "zerg.generation";
/// Label: the repository's common git directory (host path), for importing objects after a
/// zergd restart.
pub const LABEL_GIT_DIR: &str = "zerg.git-dir";

const WORKSPACE: &str = image::WORKSPACE;
const LOG_MOUNT: &str = image::LOG_MOUNT;
const RUN_MOUNT: &str = image::RUN_MOUNT;
const HOME_IN_IMAGE: &str = image::HOME;
/// Where the repository's real object store is visible (read-only) inside.
const SHARED_OBJECTS: &str = "/zerg/shared-objects";
/// Per-worker git areas (`<common>/zerg/worker-<N>`) live here, inside the common git dir.
const WORKER_GIT_SUBDIR: &str = "zerg";
/// Engine request timeout (stop requests get the grace period on top).
const ENGINE_TIMEOUT: Duration = Duration::from_secs(60);
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
        let docker = Docker::connect_with_local_defaults()
            .map_err(|e| unreachable_error(&e))?
            .with_timeout(ENGINE_TIMEOUT);
        let docker = docker
            .negotiate_version()
            .await
            .map_err(|e| unreachable_error(&e))?;
        docker.ping().await.map_err(|e| unreachable_error(&e))?;
        Ok(Self { docker })
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
            let spec2 = spec.clone();
            let facts = tokio::task::spawn_blocking(move || {
                let facts = HostFacts::gather(&spec2)?;
                prepare_host(&spec2, &facts)?;
                Ok::<_, SpawnError>(facts)
            })
            .await
            .map_err(|e| SpawnError::new(format!("container preparation panicked: {e}")))??;
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
            let logs = mirror_logs(this.docker.clone(), id.clone(), log_path, 0);
            let objects = Some((facts.git.common_dir.clone(), spec.worker_id));
            tokio::spawn(finish(
                this.clone(),
                id.clone(),
                Some(logs),
                objects,
                on_exit,
            ));
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
            let mut objects = None;
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
                    logs = Some(mirror_logs(this.docker.clone(), id.clone(), path, since));
                }
                objects = adopted.objects;
            }
            finish(this, id, logs, objects, on_exit).await;
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

/// The exit path shared by spawned and adopted containers: wait, drain the log mirror,
/// import the worker's git objects, report the exit once, remove the container.
async fn finish(
    this: ContainerLauncher,
    id: String,
    logs: Option<tokio::task::JoinHandle<()>>,
    objects: Option<(PathBuf, u32)>,
    on_exit: ExitSink,
) {
    let info = wait_for_exit(&this.docker, &id).await;
    if let Some(h) = logs {
        let _ = tokio::time::timeout(LOG_DRAIN, h).await;
    }
    if let Some((common, worker)) = objects {
        let r = tokio::task::spawn_blocking(move || {
            import_objects(&common, &worker_object_dir(&common, worker))
        })
        .await;
        if let Ok(Err(e)) = r {
            tracing::warn!(container = %id, error = %e, "cannot import the worker's git objects");
        }
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

/// Maps a container's exit code and OOM flag to an [`ExitInfo`].
pub fn exit_info(code: i64, oom_killed: bool) -> ExitInfo {
    if oom_killed {
        ExitInfo::OomKilled
    } else {
        ExitInfo::Code(code.clamp(i32::MIN as i64, i32::MAX as i64) as i32)
    }
}

/// Appends the container's output to `path` (like the subprocess launcher's
/// `worker-<N>.log`) until the container stops.
fn mirror_logs(
    docker: Docker,
    id: String,
    path: PathBuf,
    since: i32,
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
        while let Some(Ok(chunk)) = stream.next().await {
            if file.write_all(&chunk.into_bytes()).await.is_err() {
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
    objects: Option<(PathBuf, u32)>,
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
            socket: source_of(RUN_MOUNT).map(|d| d.join(crate::worker_plane::PLANE_SOCKET_NAME)),
            // The mirrored log is `worker-<N>.log` beside the worker's own log dir.
            log_file: source_of(LOG_MOUNT)
                .and_then(|d| d.parent().map(Path::to_path_buf))
                .zip(worker)
                .map(|(d, w)| d.join(format!("worker-{w}.log"))),
            objects: labels.get(LABEL_GIT_DIR).map(PathBuf::from).zip(worker),
            remapped,
        }
    }
}

fn parse_user(user: &str) -> Option<(u32, u32)> {
    let (u, g) = user.split_once(':')?;
    Some((u.parse().ok()?, g.parse().ok()?))
}

/// Reads `zerg.worker` and `zerg.generation` from a container's labels.
pub fn parse_worker_labels(labels: &HashMap<String, String>) -> Option<(u32, u64)> {
    let worker = labels.get(LABEL_WORKER)?.parse().ok()?;
    let generation = labels.get(LABEL_GENERATION)?.parse().ok()?;
    Some((worker, generation))
}

// === Errors ===

fn status(e: &DockerError) -> Option<u16> {
    match e {
        DockerError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

fn missing_image(image: &str) -> SpawnError {
    SpawnError::new(format!(
        "image {image} not found: build it with zergctl image build (or zergctl image build --offline without a registry)"
    ))
}

fn unreachable_error(e: &DockerError) -> SpawnError {
    let host =
        std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".into());
    SpawnError::new(format!(
        "docker engine unreachable at {host}: {e}; start dockerd (or set DOCKER_HOST), make sure this user may use the engine (docker group), or run the rush with --mode subprocess"
    ))
}

fn engine_error(what: &str, e: &DockerError) -> SpawnError {
    match e {
        DockerError::DockerResponseServerError { .. } | DockerError::DockerStreamError { .. } => {
            SpawnError::new(format!("{what}: {e}"))
        }
        _ => unreachable_error(e),
    }
}

// === What a worker container looks like ===

/// The container's name: feature-scoped and unique per generation.
pub fn container_name(spec: &WorkerSpec) -> String {
    let feature: String = spec
        .feature
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!(
        "zerg-{feature}-worker-{}-g{}",
        spec.worker_id, spec.generation
    )
}

fn image_of(spec: &WorkerSpec) -> String {
    if spec.container.image.trim().is_empty() {
        DEFAULT_IMAGE.to_string()
    } else {
        spec.container.image.trim().to_string()
    }
}

/// Where a worker worktree's git metadata lives on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitLayout {
    /// The worktree's admin dir (`<common>/worktrees/<name>`), as the host's git knows it.
    pub admin_dir: PathBuf,
    /// The repository's common git directory (usually `<repo>/.git`).
    pub common_dir: PathBuf,
}

impl GitLayout {
    /// Finds the layout from the repository's side: its common git dir, and the admin dir whose
    /// `gitdir` file names `<worktree>/.git`. Nothing is read from the worktree itself, which a
    /// container can write: a `.git` file a worker rewrote never redirects zergd.
    pub fn of(repo: &Path, worktree: &Path) -> io::Result<Self> {
        let common_dir = common_dir_of(repo)?;
        let want = normalize(&worktree.join(".git"));
        let admins = common_dir.join("worktrees");
        for entry in fs::read_dir(&admins)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", admins.display())))?
            .flatten()
        {
            let gitdir = fs::read_to_string(entry.path().join("gitdir")).unwrap_or_default();
            if normalize(Path::new(gitdir.trim())) == want {
                return Ok(Self {
                    admin_dir: normalize(&entry.path()),
                    common_dir,
                });
            }
        }
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{} is not a worktree of {}",
                worktree.display(),
                repo.display()
            ),
        ))
    }

    /// The admin dir's name (`worker-<N>` unless git had to pick another).
    fn admin_name(&self) -> String {
        self.admin_dir
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_else(|| "worker".into())
    }
}

/// Resolves `.` and `..` without touching the filesystem.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// The private git directory of worker `worker_id` (`<common>/zerg/worker-<N>`), mounted in
/// its container in place of the real common git dir. zergd rebuilds it at every spawn: copies
/// of `config`, `HEAD` and `info/exclude`, a snapshot of every ref as `packed-refs`, the
/// worktree's own admin dir (`worktrees/<name>`: `HEAD`, `commondir`, `gitdir`, the sparse
/// checkout that keeps the spec out of git's hands), and `objects/` where the container's new
/// objects land (the real store, read-only, is its alternate). Everything git writes inside the
/// container — commits, the worker branch, other refs, the index — stays here; zergd moves the
/// real worker branch itself once it has checked and accepted a reported commit.
pub fn worker_git_dir(common_dir: &Path, worker_id: u32) -> PathBuf {
    common_dir
        .join(WORKER_GIT_SUBDIR)
        .join(format!("worker-{worker_id}"))
}

/// The private object directory of worker `worker_id` (see [`worker_git_dir`]).
pub fn worker_object_dir(common_dir: &Path, worker_id: u32) -> PathBuf {
    worker_git_dir(common_dir, worker_id).join("objects")
}

/// The worker's own log directory (`.zerg/logs/worker-<N>`), the only part of `.zerg` a
/// container can write: the agent keeps each task's CLI and verification output there.
pub fn worker_log_dir(log_dir: &Path, worker_id: u32) -> PathBuf {
    log_dir.join(format!("worker-{worker_id}"))
}

/// Everything about the host that shapes a worker container, gathered once per spawn (and
/// built by hand in tests).
#[derive(Debug, Clone)]
pub struct HostFacts {
    /// uid the agent runs as.
    pub uid: u32,
    /// gid the agent runs as.
    pub gid: u32,
    /// Whether zergd is root and the agent runs as [`UNPRIVILEGED_UID`] instead.
    pub remapped: bool,
    /// The worktree's git layout.
    pub git: GitLayout,
    /// Commit identity (`user.name`, `user.email`) as zergd's git sees it for the repository.
    pub git_identity: (String, String),
    /// The Claude config dir to mount at `/home/worker/.claude`, if any.
    pub claude_dir: Option<PathBuf>,
    /// `~/.claude.json`, if it exists.
    pub claude_json: Option<PathBuf>,
    /// Variables passed through from zergd's environment (`ANTHROPIC_API_KEY`, `FAKE_CLAUDE_*`).
    pub passthrough: Vec<(String, String)>,
    /// Host paths named by `FAKE_CLAUDE_*` variables, mounted at the same path.
    pub test_paths: Vec<PathBuf>,
}

impl HostFacts {
    /// Reads the facts from the host for `spec`.
    pub fn gather(spec: &WorkerSpec) -> Result<Self, SpawnError> {
        let git = GitLayout::of(&spec.repo, &spec.worktree)
            .map_err(|e| SpawnError::new(e.to_string()))?;
        for p in [&git.common_dir, &git.admin_dir] {
            if let Some(r) = RESERVED.iter().find(|r| p.starts_with(r)) {
                return Err(SpawnError::new(format!(
                    "the repository's git directory {} lies under {r}, which the worker container needs for itself: move the repository",
                    p.display()
                )));
            }
        }
        let config = fs::read_to_string(git.common_dir.join("config")).unwrap_or_default();
        if config.to_ascii_lowercase().contains("reftable") {
            return Err(SpawnError::new(
                "the repository stores its refs as reftable, which container mode does not support: use --mode subprocess",
            ));
        }
        let (uid, gid, remapped) = container_identity();
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let claude_dir = std::env::var_os("CLAUDE_CONFIG_DIR")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".claude")))
            .filter(|p| p.is_dir());
        let claude_json = home.map(|h| h.join(".claude.json")).filter(|p| p.is_file());
        let mut passthrough = Vec::new();
        let mut test_paths = Vec::new();
        for (k, v) in std::env::vars() {
            if k == "ANTHROPIC_API_KEY" && !v.is_empty() {
                passthrough.push((k, v));
            } else if k.starts_with("FAKE_CLAUDE_") {
                if let Some(p) = test_path(&k, &v) {
                    test_paths.push(p);
                }
                passthrough.push((k, v));
            }
        }
        passthrough.sort();
        test_paths.sort();
        test_paths.dedup();
        Ok(Self {
            uid,
            gid,
            remapped,
            git_identity: git_identity(&spec.repo, spec.worker_id),
            git,
            claude_dir,
            claude_json,
            passthrough,
            test_paths,
        })
    }
}

/// A `FAKE_CLAUDE_*` variable naming an absolute host path (a test hook of the fake agent
/// CLI): the path to mount at the same place inside. A missing `*_DIR` is created as a
/// directory, any other missing path as an empty file (a log to append to) when its parent
/// exists.
fn test_path(var: &str, value: &str) -> Option<PathBuf> {
    let p = PathBuf::from(value);
    if !p.is_absolute() || p.parent().is_none() {
        return None;
    }
    if !p.exists() {
        if var.ends_with("_DIR") {
            fs::create_dir_all(&p).ok()?;
        } else if p.parent().is_some_and(Path::is_dir) {
            fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&p)
                .ok()?;
        }
    }
    p.exists().then_some(p)
}

/// The uid:gid the agent runs as, and whether it differs from zergd's own (zergd is root).
pub fn container_identity() -> (u32, u32, bool) {
    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    if uid == 0 {
        (UNPRIVILEGED_UID, UNPRIVILEGED_UID, true)
    } else {
        (uid, if gid == 0 { UNPRIVILEGED_UID } else { gid }, false)
    }
}

fn git_identity(repo: &Path, worker_id: u32) -> (String, String) {
    let get = |key: &str| {
        crate::git::git(repo, &["config", "--get", key])
            .ok()
            .filter(|s| !s.is_empty())
    };
    (
        get("user.name").unwrap_or_else(|| format!("zerg worker {worker_id}")),
        get("user.email").unwrap_or_else(|| format!("zerg-worker-{worker_id}@localhost")),
    )
}

/// In-container path of the spec snapshot (FR-7).
pub fn spec_dir_in_container(feature: &str) -> String {
    format!("{WORKSPACE}/.gsd/specs/{feature}")
}

fn socket_in_container() -> String {
    format!("{RUN_MOUNT}/{}", crate::worker_plane::PLANE_SOCKET_NAME)
}

/// The agent's environment: the subprocess worker's, with the paths it sees inside, plus git
/// settings and credentials. `ZERG_STATE_DIR` is not set: nothing of `.zerg/state` is inside.
pub fn container_env(spec: &WorkerSpec, facts: &HostFacts) -> Vec<String> {
    let inside: HashMap<&str, String> = HashMap::from([
        (worker_env_names::WORKTREE, WORKSPACE.to_string()),
        (
            worker_env_names::SPEC_DIR,
            spec_dir_in_container(&spec.feature),
        ),
        (worker_env_names::LOG_DIR, LOG_MOUNT.to_string()),
        (worker_env_names::SOCKET, socket_in_container()),
    ]);
    let mut env: Vec<(String, String)> = super::subprocess::worker_env(spec)
        .into_iter()
        .filter(|(k, _)| k != worker_env_names::STATE_DIR)
        .map(|(k, v)| match inside.get(k.as_str()) {
            Some(p) => (k, p.clone()),
            None => (k, v),
        })
        .collect();
    env.push(("HOME".into(), HOME_IN_IMAGE.into()));
    if facts.claude_dir.is_some() {
        env.push((
            "CLAUDE_CONFIG_DIR".into(),
            format!("{HOME_IN_IMAGE}/.claude"),
        ));
    }
    let config = [
        // The common git dir belongs to another uid (root, or the repo's owner).
        ("safe.directory", "*".to_string()),
        ("user.name", facts.git_identity.0.clone()),
        ("user.email", facts.git_identity.1.clone()),
        // gc would pack into the private object dir, for nothing.
        ("gc.auto", "0".to_string()),
        ("maintenance.auto", "false".to_string()),
        // The spec is mounted read-only over its tracked files: a sparse checkout keeps git
        // from ever writing or deleting them there (the patterns are in the private admin dir),
        // and tells git their presence on disk is expected.
        ("core.sparseCheckout", "true".to_string()),
        ("core.sparseCheckoutCone", "false".to_string()),
        ("sparse.expectFilesOutsideOfPatterns", "true".to_string()),
    ];
    env.push(("GIT_CONFIG_COUNT".into(), config.len().to_string()));
    for (i, (k, v)) in config.iter().enumerate() {
        env.push((format!("GIT_CONFIG_KEY_{i}"), k.to_string()));
        env.push((format!("GIT_CONFIG_VALUE_{i}"), v.clone()));
    }
    env.extend(facts.passthrough.iter().cloned());
    env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

fn bind(source: &Path, target: &str, read_only: bool) -> Mount {
    Mount {
        source: Some(source.to_string_lossy().to_string()),
        target: Some(target.to_string()),
        typ: Some(MountType::BIND),
        read_only: Some(read_only),
        ..Default::default()
    }
}

fn same_path(p: &Path, read_only: bool) -> Mount {
    bind(p, &p.to_string_lossy(), read_only)
}

/// The container's bind mounts. The only writable ones are the worktree, the worker's private
/// git dir and its own log dir (and the Claude login and test hooks when present).
pub fn container_mounts(spec: &WorkerSpec, facts: &HostFacts) -> Vec<Mount> {
    let g = &facts.git;
    let mut m = vec![
        bind(&spec.worktree, WORKSPACE, false),
        bind(&spec.spec_dir, &spec_dir_in_container(&spec.feature), true),
        // The worker's private git dir where the real one is.
        bind(
            &worker_git_dir(&g.common_dir, spec.worker_id),
            &g.common_dir.to_string_lossy(),
            false,
        ),
        bind(&g.common_dir.join("objects"), SHARED_OBJECTS, true),
        bind(
            &worker_log_dir(&spec.log_dir, spec.worker_id),
            LOG_MOUNT,
            false,
        ),
        // The rush's worker-plane directory: one socket, the Worker service only.
        bind(&parent_of(&spec.socket), RUN_MOUNT, true),
    ];
    if let Some(d) = &facts.claude_dir {
        m.push(bind(d, &format!("{HOME_IN_IMAGE}/.claude"), false));
    }
    if let Some(f) = &facts.claude_json {
        m.push(bind(f, &format!("{HOME_IN_IMAGE}/.claude.json"), false));
    }
    for p in &facts.test_paths {
        m.push(same_path(p, false));
    }
    m
}

fn parent_of(p: &Path) -> PathBuf {
    p.parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| p.to_path_buf())
}

/// Resource limits and hardening.
pub fn host_config(spec: &WorkerSpec, facts: &HostFacts) -> HostConfig {
    let c = &spec.container;
    let network = if c.network.trim().is_empty() {
        "none".to_string()
    } else {
        c.network.trim().to_string()
    };
    let memory = (c.memory_bytes > 0).then_some(c.memory_bytes);
    HostConfig {
        mounts: Some(container_mounts(spec, facts)),
        network_mode: Some(network),
        memory,
        // No swap beyond the memory limit, so a runaway agent is OOM-killed (and reported).
        memory_swap: memory,
        nano_cpus: (c.cpus > 0.0).then(|| (c.cpus * 1e9).round() as i64),
        pids_limit: (c.pids_limit > 0).then_some(c.pids_limit),
        cap_drop: Some(vec!["ALL".into()]),
        security_opt: Some(vec!["no-new-privileges".into()]),
        privileged: Some(false),
        init: Some(true),
        ..Default::default()
    }
}

/// The labels that identify a worker container.
pub fn container_labels(spec: &WorkerSpec, facts: &HostFacts) -> HashMap<String, String> {
    HashMap::from([
        (LABEL_RUSH.to_string(), spec.rush_id.clone()),
        (LABEL_FEATURE.to_string(), spec.feature.clone()),
        (LABEL_WORKER.to_string(), spec.worker_id.to_string()),
        (LABEL_GENERATION.to_string(), spec.generation.to_string()),
        (
            LABEL_GIT_DIR.to_string(),
            facts.git.common_dir.to_string_lossy().to_string(),
        ),
    ])
}

/// The full create request.
pub fn create_body(spec: &WorkerSpec, facts: &HostFacts) -> ContainerCreateBody {
    ContainerCreateBody {
        image: Some(image_of(spec)),
        user: Some(format!("{}:{}", facts.uid, facts.gid)),
        env: Some(container_env(spec, facts)),
        // The entrypoint is set (not the command) so no image ENTRYPOINT/CMD is mixed in.
        entrypoint: Some(vec![AGENT_IN_IMAGE.into()]),
        working_dir: Some(WORKSPACE.into()),
        hostname: Some(format!("zerg-worker-{}", spec.worker_id)),
        labels: Some(container_labels(spec, facts)),
        stop_signal: Some("SIGTERM".into()),
        tty: Some(false),
        open_stdin: Some(false),
        attach_stdin: Some(false),
        host_config: Some(host_config(spec, facts)),
        ..Default::default()
    }
}

// === Host preparation ===

/// Creates the mount points and directories the container needs, rebuilds the worker's
/// private git dir and, when zergd is root, grants the container's gid access to exactly what
/// it may write.
fn prepare_host(spec: &WorkerSpec, facts: &HostFacts) -> Result<(), SpawnError> {
    let g = &facts.git;
    let ctx = |what: &str, p: &Path| {
        let p = p.display().to_string();
        let what = what.to_string();
        move |e: io::Error| SpawnError::new(format!("{what} {p}: {e}"))
    };
    if !spec.spec_dir.is_dir() {
        return Err(SpawnError::new(format!(
            "spec snapshot {} does not exist",
            spec.spec_dir.display()
        )));
    }
    let area = worker_git_dir(&g.common_dir, spec.worker_id);
    let logs = worker_log_dir(&spec.log_dir, spec.worker_id);
    // The mount point inside the worktree is created here, not by the engine (which would make
    // it root-owned).
    for d in [
        spec.worktree.join(".gsd/specs").join(&spec.feature),
        logs.clone(),
    ] {
        fs::create_dir_all(&d).map_err(ctx("cannot create", &d))?;
    }
    write_private_git_dir(g, &area, spec)
        .map_err(ctx("cannot prepare the worker's git dir", &area))?;
    if facts.remapped {
        let gid = facts.gid;
        grant_tree(&spec.worktree, gid, true, Some(&spec.worktree.join(".git")))
            .map_err(ctx("cannot grant access to", &spec.worktree))?;
        grant_tree(&area, gid, true, None).map_err(ctx("cannot grant access to", &area))?;
        grant_tree(&logs, gid, true, None).map_err(ctx("cannot grant access to", &logs))?;
        grant_readable(&spec.spec_dir, gid)
            .map_err(ctx("cannot grant access to", &spec.spec_dir))?;
        grant_socket(&spec.socket, gid).map_err(ctx("cannot grant access to", &spec.socket))?;
        for p in facts
            .claude_dir
            .iter()
            .chain(&facts.claude_json)
            .chain(&facts.test_paths)
        {
            if p.exists() {
                grant_tree(p, gid, true, None).map_err(ctx("cannot grant access to", p))?;
            }
        }
    }
    Ok(())
}

/// Rebuilds the worker's private git dir (see [`worker_git_dir`]). Objects the container wrote
/// earlier are kept (they are imported on exit and on each accepted commit); refs, logs, the
/// index and the admin dir start afresh from the real repository.
fn write_private_git_dir(g: &GitLayout, area: &Path, spec: &WorkerSpec) -> io::Result<()> {
    let common = &g.common_dir;
    for d in ["refs", "logs", "worktrees", "info"] {
        let p = area.join(d);
        if fs::symlink_metadata(&p).is_ok() {
            if p.is_dir() && !p.is_symlink() {
                fs::remove_dir_all(&p)?;
            } else {
                fs::remove_file(&p)?;
            }
        }
    }
    for name in [
        "packed-refs",
        "index",
        "ORIG_HEAD",
        "FETCH_HEAD",
        "MERGE_HEAD",
    ] {
        let _ = fs::remove_file(area.join(name));
    }
    let admin = area.join("worktrees").join(g.admin_name());
    for d in [
        area.join("objects/pack"),
        area.join("objects/info"),
        area.join("refs/heads"),
        area.join("refs/tags"),
        area.join("info"),
        admin.join("info"),
    ] {
        fs::create_dir_all(&d)?;
    }
    let copy_or = |name: &str, default: &str| {
        let text = fs::read_to_string(common.join(name)).unwrap_or_else(|_| default.to_string());
        fs::write(area.join(name), text)
    };
    copy_or("config", "")?;
    copy_or("HEAD", "ref: refs/heads/main\n")?;
    let spec_rel = format!("/.gsd/specs/{}/", spec.feature);
    let mut exclude = fs::read_to_string(common.join("info/exclude")).unwrap_or_default();
    exclude.push_str(&format!(
        "\n# zerg: the spec snapshot is mounted here read-only\n{spec_rel}\n"
    ));
    fs::write(area.join("info/exclude"), exclude)?;
    fs::write(
        area.join("objects/info/alternates"),
        format!("{SHARED_OBJECTS}\n"),
    )?;
    // The worktree's own admin dir, private too: its HEAD names the worker branch, whose value
    // comes from the snapshot below; no index, so the agent's first `git reset --hard` builds
    // one that honours the sparse patterns and never touches the mounted spec.
    fs::write(
        admin.join("HEAD"),
        format!("ref: refs/heads/{}\n", spec.branch),
    )?;
    fs::write(admin.join("commondir"), "../..\n")?;
    fs::write(
        admin.join("gitdir"),
        format!("{}\n", spec.worktree.join(".git").display()),
    )?;
    fs::write(
        admin.join("info/sparse-checkout"),
        format!("/*\n!{spec_rel}\n"),
    )?;
    let refs = crate::git::git(
        common,
        &["for-each-ref", "--format=%(objectname) %(refname)"],
    )
    .map_err(|e| io::Error::other(e.to_string()))?;
    fs::write(area.join("packed-refs"), format!("{refs}\n"))
}

/// Sets the group of `path` (and, if `recursive`, of everything below it except `skip`) to
/// `gid` with group read/write, group search on directories (plus setgid) and group execute
/// where the owner may execute. Symlinks are left alone. Entries already granted cost one
/// `lstat`.
fn grant_tree(path: &Path, gid: u32, recursive: bool, skip: Option<&Path>) -> io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    let ft = meta.file_type();
    let mode = meta.mode() & 0o7777;
    let want = if ft.is_dir() {
        0o2070
    } else if ft.is_file() {
        0o060 | if mode & 0o100 != 0 { 0o010 } else { 0 }
    } else if ft.is_socket() {
        0o060
    } else {
        return Ok(());
    };
    set_group_bits(path, &meta, gid, want)?;
    if recursive && ft.is_dir() {
        for entry in fs::read_dir(path)? {
            let p = entry?.path();
            if Some(p.as_path()) != skip {
                grant_tree(&p, gid, true, skip)?;
            }
        }
    }
    Ok(())
}

/// Group read (and search) on a tree the container only reads.
fn grant_readable(path: &Path, gid: u32) -> io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    let ft = meta.file_type();
    if ft.is_dir() {
        set_group_bits(path, &meta, gid, 0o050)?;
        for entry in fs::read_dir(path)? {
            grant_readable(&entry?.path(), gid)?;
        }
        Ok(())
    } else if ft.is_file() {
        set_group_bits(path, &meta, gid, 0o040)
    } else {
        Ok(())
    }
}

/// Lets the container's gid connect to the worker-plane socket: group search on its directory
/// (which holds nothing else) and group read/write on the socket. The control socket's
/// directory above stays closed to everyone but zergd's user.
fn grant_socket(socket: &Path, gid: u32) -> io::Result<()> {
    if let Some(dir) = socket.parent() {
        let meta = fs::metadata(dir)?;
        set_group_bits(dir, &meta, gid, 0o010)?;
    }
    let meta = fs::metadata(socket)?;
    set_group_bits(socket, &meta, gid, 0o060)
}

fn set_group_bits(path: &Path, meta: &fs::Metadata, gid: u32, want: u32) -> io::Result<()> {
    if meta.gid() != gid {
        std::os::unix::fs::chown(path, None, Some(gid))?;
    }
    let mode = meta.mode() & 0o7777;
    if mode & want != want || meta.gid() != gid {
        // chown may clear setgid; always re-apply the full mode after a group change.
        fs::set_permissions(path, fs::Permissions::from_mode(mode | want))?;
    }
    Ok(())
}

// === Git objects written by containers ===

/// Copies the objects worker `worker_id`'s containers wrote (into their private object dir,
/// `<git dir>/zerg/worker-<N>/objects`) into the repository's shared object store, so zergd's
/// own git sees the worker's commits. Every loose object is inflated and hashed first: one whose
/// content does not match its name, a symlink, or anything but a plain file is skipped (and
/// logged), so a hostile container can neither plant a corrupt object nor make zergd copy a file
/// it could not read itself. Packs go through `git index-pack`, which checks them the same way.
/// Objects that already exist are never overwritten. Returns how many were imported.
///
/// The launcher calls this whenever a worker container exits; zergd also calls it before it
/// checks a commit a container worker reports.
pub fn import_worker_objects(repo: &Path, worker_id: u32) -> io::Result<usize> {
    let common = common_dir_of(repo)?;
    import_objects(&common, &worker_object_dir(&common, worker_id))
}

/// The repository's common git dir (absolute), asked of git itself.
fn common_dir_of(repo: &Path) -> io::Result<PathBuf> {
    let out = crate::git::git(
        repo,
        &["rev-parse", "--path-format=absolute", "--git-common-dir"],
    )
    .map_err(|e| io::Error::other(e.to_string()))?;
    Ok(normalize(Path::new(&out)))
}

fn import_objects(common: &Path, from: &Path) -> io::Result<usize> {
    let to = common.join("objects");
    let Ok(entries) = fs::read_dir(from) else {
        return Ok(0);
    };
    let mut n = 0;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        let is_fanout = name.len() == 2 && name.bytes().all(|c| c.is_ascii_hexdigit());
        if is_fanout && is_dir {
            for obj in fs::read_dir(entry.path())?.flatten() {
                let file = obj.file_name().to_string_lossy().to_string();
                if !file.bytes().all(|c| c.is_ascii_hexdigit()) {
                    continue;
                }
                let dest_dir = to.join(&name);
                if dest_dir.join(&file).exists() {
                    continue;
                }
                match verify_loose(&obj.path(), &format!("{name}{file}")) {
                    Ok(bytes) => {
                        if write_object(&dest_dir, &file, &bytes)? {
                            n += 1;
                        }
                    }
                    Err(why) => {
                        tracing::warn!(object = %obj.path().display(), reason = %why, "not importing a worker's object")
                    }
                }
            }
        } else if name == "pack" && is_dir {
            for p in fs::read_dir(entry.path())?.flatten() {
                let file = p.file_name().to_string_lossy().to_string();
                let Some(stem) = file.strip_suffix(".pack") else {
                    continue;
                };
                if !p.file_type().is_ok_and(|t| t.is_file())
                    || to.join("pack").join(format!("{stem}.idx")).exists()
                {
                    continue;
                }
                let pack = fs::File::open(p.path())?;
                let out = std::process::Command::new("git")
                    .arg("--git-dir")
                    .arg(common)
                    .args(["index-pack", "--stdin", "--fix-thin", "--strict"])
                    .stdin(pack)
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped())
                    .output()?;
                if out.status.success() {
                    n += 1;
                } else {
                    tracing::warn!(pack = %p.path().display(), error = %String::from_utf8_lossy(&out.stderr).trim(), "not importing a worker's pack");
                }
            }
        }
    }
    Ok(n)
}

/// Largest loose object zergd imports from a container (compressed and inflated).
const MAX_OBJECT_BYTES: u64 = 512 << 20;

/// Reads a loose object a container wrote and checks that it is what its name says: a plain
/// file (not a link), zlib data that inflates to `<type> <size>\0<content>` of that size, whose
/// SHA-1 (40-digit names) or SHA-256 (64-digit names) is the name. Returns the file's bytes.
fn verify_loose(path: &Path, id: &str) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let meta = fs::symlink_metadata(path).map_err(|e| e.to_string())?;
    if !meta.file_type().is_file() {
        return Err("not a regular file".into());
    }
    if meta.len() > MAX_OBJECT_BYTES {
        return Err(format!("{} bytes is too large", meta.len()));
    }
    let bytes = fs::read(path).map_err(|e| e.to_string())?;
    let mut inflated = Vec::new();
    flate2::read::ZlibDecoder::new(&bytes[..])
        .take(MAX_OBJECT_BYTES)
        .read_to_end(&mut inflated)
        .map_err(|e| format!("not zlib data: {e}"))?;
    let nul = inflated
        .iter()
        .position(|b| *b == 0)
        .ok_or("no object header")?;
    let header = std::str::from_utf8(&inflated[..nul]).map_err(|_| "bad object header")?;
    let (kind, size) = header.split_once(' ').ok_or("bad object header")?;
    if !matches!(kind, "blob" | "tree" | "commit" | "tag") {
        return Err(format!("unknown object type {kind:?}"));
    }
    if size.parse::<usize>().ok() != Some(inflated.len() - nul - 1) {
        return Err("object size does not match its header".into());
    }
    let digest = match id.len() {
        40 => {
            use sha1::Digest;
            format!("{:x}", sha1::Sha1::digest(&inflated))
        }
        64 => {
            use sha2::Digest;
            format!("{:x}", sha2::Sha256::digest(&inflated))
        }
        _ => return Err("not an object id".into()),
    };
    if digest != id.to_ascii_lowercase() {
        return Err("content does not match the object id".into());
    }
    Ok(bytes)
}

/// Writes one verified object unless the destination has it; returns whether it wrote. The
/// file is written under a temporary name and renamed, so readers never see half an object.
fn write_object(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<bool> {
    let dest = dir.join(name);
    if dest.exists() {
        return Ok(false);
    }
    fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".zerg-import-{}-{name}", std::process::id()));
    fs::write(&tmp, bytes)?;
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o444))?;
    if dest.exists() {
        fs::remove_file(&tmp)?;
        return Ok(false);
    }
    fs::rename(&tmp, &dest)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launcher::ContainerSpec;

    fn spec() -> WorkerSpec {
        WorkerSpec {
            rush_id: "r-123".into(),
            feature: "feat-x".into(),
            worker_id: 2,
            generation: 5,
            repo: "/srv/repo".into(),
            worktree: "/srv/repo/.zerg-worktrees/feat-x/worker-2".into(),
            branch: "zerg/feat-x/worker-2".into(),
            spec_dir: "/srv/repo/.zerg/specs/feat-x".into(),
            state_dir: "/srv/repo/.zerg/state".into(),
            log_dir: "/srv/repo/.zerg/logs".into(),
            socket: "/run/user/0/zerg/w/0123456789abcdef/worker.sock".into(),
            token: crate::worker_plane::WorkerToken::generate(),
            agent_bin: "/usr/local/bin/zerg-worker-agent".into(),
            container: ContainerSpec {
                image: String::new(),
                network: String::new(),
                memory_bytes: 4 << 30,
                cpus: 2.0,
                pids_limit: 1024,
            },
        }
    }

    fn facts() -> HostFacts {
        HostFacts {
            uid: UNPRIVILEGED_UID,
            gid: UNPRIVILEGED_UID,
            remapped: true,
            git: GitLayout {
                admin_dir: "/srv/repo/.git/worktrees/worker-2".into(),
                common_dir: "/srv/repo/.git".into(),
            },
            git_identity: ("Ada".into(), "ada@example.com".into()),
            claude_dir: Some("/root/.claude".into()),
            claude_json: None,
            passthrough: vec![
                ("ANTHROPIC_API_KEY".into(), "sk-test".into()),
                ("FAKE_CLAUDE_SCRIPT".into(), "/tmp/t/script.json".into()),
            ],
            test_paths: vec!["/tmp/t/script.json".into()],
        }
    }

    fn mount<'a>(ms: &'a [Mount], target: &str) -> &'a Mount {
        ms.iter()
            .find(|m| m.target.as_deref() == Some(target))
            .unwrap_or_else(|| panic!("no mount at {target}: {ms:?}"))
    }

    #[test]
    fn name_is_feature_scoped_and_per_generation() {
        let mut s = spec();
        assert_eq!(container_name(&s), "zerg-feat-x-worker-2-g5");
        s.feature = "a/b c".into();
        assert_eq!(container_name(&s), "zerg-a-b-c-worker-2-g5");
    }

    #[test]
    fn env_uses_container_paths() {
        let env = container_env(&spec(), &facts());
        let get = |k: &str| {
            env.iter()
                .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
                .unwrap_or_else(|| panic!("{k} missing from {env:?}"))
                .to_string()
        };
        assert_eq!(get("ZERG_WORKTREE"), "/workspace");
        assert_eq!(get("ZERG_SPEC_DIR"), "/workspace/.gsd/specs/feat-x");
        assert!(
            !env.iter().any(|kv| kv.starts_with("ZERG_STATE_DIR=")),
            "nothing of the state dir is inside"
        );
        assert_eq!(get("ZERG_LOG_DIR"), "/zerg/logs");
        assert_eq!(get("ZERG_SOCKET"), "/zerg/run/worker.sock");
        assert_eq!(get("ZERG_WORKER_TOKEN").len(), 64);
        assert_eq!(get("ZERG_REPO_PATH"), "/srv/repo");
        assert_eq!(get("ZERG_WORKER_ID"), "2");
        assert_eq!(get("ZERG_FEATURE"), "feat-x");
        assert_eq!(get("ZERG_BRANCH"), "zerg/feat-x/worker-2");
        assert_eq!(get("ZERG_RUSH_ID"), "r-123");
        assert_eq!(get("ZERG_GENERATION"), "5");
        assert_eq!(get("HOME"), "/home/worker");
        assert!(
            !env.iter().any(|kv| kv.starts_with("GIT_DIR=")
                || kv.starts_with("GIT_OBJECT_DIRECTORY=")
                || kv.starts_with("GIT_COMMON_DIR=")),
            "no git path variables: they would leak into every other repository"
        );
        assert_eq!(get("ANTHROPIC_API_KEY"), "sk-test");
        assert_eq!(get("FAKE_CLAUDE_SCRIPT"), "/tmp/t/script.json");
        let n: usize = get("GIT_CONFIG_COUNT").parse().unwrap();
        let pairs: Vec<(String, String)> = (0..n)
            .map(|i| {
                (
                    get(&format!("GIT_CONFIG_KEY_{i}")),
                    get(&format!("GIT_CONFIG_VALUE_{i}")),
                )
            })
            .collect();
        assert!(pairs.contains(&("safe.directory".into(), "*".into())));
        assert!(pairs.contains(&("user.name".into(), "Ada".into())));
        assert!(pairs.contains(&("gc.auto".into(), "0".into())));
        assert!(pairs.contains(&("core.sparseCheckout".into(), "true".into())));
    }

    #[test]
    fn mounts_follow_the_contract() {
        let s = spec();
        let ms = container_mounts(&s, &facts());
        assert!(ms.iter().all(|m| m.typ == Some(MountType::BIND)));
        let ws = mount(&ms, "/workspace");
        assert_eq!(
            ws.source.as_deref(),
            Some("/srv/repo/.zerg-worktrees/feat-x/worker-2")
        );
        assert_eq!(ws.read_only, Some(false));
        let sp = mount(&ms, "/workspace/.gsd/specs/feat-x");
        assert_eq!(sp.source.as_deref(), Some("/srv/repo/.zerg/specs/feat-x"));
        assert_eq!(sp.read_only, Some(true), "the spec must be read-only");
        // The worker's private git dir at the real one's path; nothing of the real one is
        // writable.
        let git = mount(&ms, "/srv/repo/.git");
        assert_eq!(git.source.as_deref(), Some("/srv/repo/.git/zerg/worker-2"));
        let objects = mount(&ms, "/zerg/shared-objects");
        assert_eq!(objects.source.as_deref(), Some("/srv/repo/.git/objects"));
        assert_eq!(objects.read_only, Some(true));
        let logs = mount(&ms, "/zerg/logs");
        assert_eq!(
            logs.source.as_deref(),
            Some("/srv/repo/.zerg/logs/worker-2")
        );
        let run = mount(&ms, "/zerg/run");
        assert_eq!(
            run.source.as_deref(),
            Some("/run/user/0/zerg/w/0123456789abcdef")
        );
        assert_eq!(run.read_only, Some(true));
        let writable: Vec<&str> = ms
            .iter()
            .filter(|m| m.read_only == Some(false))
            .filter_map(|m| m.target.as_deref())
            .collect();
        assert_eq!(
            writable,
            vec![
                "/workspace",
                "/srv/repo/.git",
                "/zerg/logs",
                "/home/worker/.claude",
                "/tmp/t/script.json"
            ]
        );
        for m in &ms {
            let src = m.source.as_deref().unwrap_or("");
            assert!(
                !src.contains("docker.sock") && !src.ends_with("zergd.sock"),
                "{src}"
            );
            assert!(!src.contains(".zerg/state"), "{src}");
            assert!(
                !src.contains("/refs/") && !src.contains("/worktrees/"),
                "no window into the real git dir: {src}"
            );
        }
    }

    #[test]
    fn hardening_and_limits() {
        let s = spec();
        let body = create_body(&s, &facts());
        assert_eq!(body.image.as_deref(), Some(DEFAULT_IMAGE));
        assert_eq!(body.user.as_deref(), Some("10001:10001"));
        assert_eq!(body.entrypoint, Some(vec![AGENT_IN_IMAGE.to_string()]));
        assert_eq!(body.cmd, None);
        assert_eq!(body.working_dir.as_deref(), Some("/workspace"));
        let hc = body.host_config.unwrap();
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(hc.security_opt, Some(vec!["no-new-privileges".to_string()]));
        assert_eq!(hc.privileged, Some(false));
        assert_eq!(hc.network_mode.as_deref(), Some("none"));
        assert_eq!(hc.memory, Some(4 << 30));
        assert_eq!(hc.memory_swap, Some(4 << 30));
        assert_eq!(hc.nano_cpus, Some(2_000_000_000));
        assert_eq!(hc.pids_limit, Some(1024));
        assert_eq!(hc.init, Some(true));
        assert_eq!(hc.binds, None);
        let labels = body.labels.unwrap();
        assert_eq!(labels[LABEL_RUSH], "r-123");
        assert_eq!(labels[LABEL_FEATURE], "feat-x");
        assert_eq!(parse_worker_labels(&labels), Some((2, 5)));

        let mut s = spec();
        s.container.image = "zerg-worker:foo".into();
        s.container.network = "bridge".into();
        s.container.memory_bytes = 0;
        s.container.cpus = 0.5;
        s.container.pids_limit = 0;
        let body = create_body(&s, &facts());
        assert_eq!(body.image.as_deref(), Some("zerg-worker:foo"));
        let hc = body.host_config.unwrap();
        assert_eq!(hc.network_mode.as_deref(), Some("bridge"));
        assert_eq!(
            (hc.memory, hc.memory_swap, hc.pids_limit),
            (None, None, None)
        );
        assert_eq!(hc.nano_cpus, Some(500_000_000));
    }

    #[test]
    fn never_root() {
        let (uid, gid, remapped) = container_identity();
        assert_ne!(uid, 0);
        assert_ne!(gid, 0);
        assert_eq!(remapped, nix::unistd::geteuid().is_root());
    }

    #[test]
    fn exit_mapping() {
        assert_eq!(exit_info(0, false), ExitInfo::Code(0));
        assert_eq!(exit_info(3, false), ExitInfo::Code(3));
        assert_eq!(exit_info(137, false), ExitInfo::Code(137));
        assert_eq!(exit_info(137, true), ExitInfo::OomKilled);
        assert_eq!(exit_info(i64::MAX, false), ExitInfo::Code(i32::MAX));
    }

    #[test]
    fn labels_parse_or_skip() {
        let l = |w: &str, g: &str| {
            HashMap::from([
                (LABEL_WORKER.to_string(), w.to_string()),
                (LABEL_GENERATION.to_string(), g.to_string()),
            ])
        };
        assert_eq!(parse_worker_labels(&l("3", "7")), Some((3, 7)));
        assert_eq!(parse_worker_labels(&l("x", "7")), None);
        assert_eq!(parse_worker_labels(&HashMap::new()), None);
        assert_eq!(parse_user("10001:10001"), Some((10001, 10001)));
        assert_eq!(parse_user("worker"), None);
    }

    #[test]
    fn missing_image_message_is_actionable() {
        let e = missing_image("zerg-worker:foo");
        assert!(
            e.message
                .starts_with("image zerg-worker:foo not found: build it with zergctl image build"),
            "{e}"
        );
    }

    #[test]
    fn git_layout_comes_from_the_repository_not_the_worktree() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        fs::create_dir_all(&repo).unwrap();
        git_ok(&repo, &["init", "-q", "-b", "main"]);
        git_ok(
            &repo,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-q",
                "--allow-empty",
                "-m",
                "i",
            ],
        );
        let wt = dir.path().join("wt/worker-1");
        git_ok(
            &repo,
            &["worktree", "add", "-q", "-b", "b1", &wt.to_string_lossy()],
        );
        let g = GitLayout::of(&repo, &wt).unwrap();
        let common = fs::canonicalize(repo.join(".git")).unwrap();
        assert_eq!(fs::canonicalize(&g.common_dir).unwrap(), common);
        assert_eq!(
            fs::canonicalize(&g.admin_dir).unwrap(),
            common.join("worktrees/worker-1")
        );
        // A worker that rewrites its `.git` file does not redirect zergd.
        fs::write(wt.join(".git"), "gitdir: /etc\n").unwrap();
        assert_eq!(GitLayout::of(&repo, &wt).unwrap(), g);
        assert!(GitLayout::of(&repo, dir.path()).is_err());
    }

    /// Writes a blob into `repo` and returns its id and loose-object path.
    fn blob(repo: &Path, content: &str) -> (String, PathBuf) {
        let f = repo.join("blob.tmp");
        fs::write(&f, content).unwrap();
        let id = git_ok(repo, &["hash-object", "-w", &f.to_string_lossy()]);
        let path = repo.join(".git/objects").join(&id[..2]).join(&id[2..]);
        (id, path)
    }

    #[test]
    fn only_objects_that_match_their_names_are_imported_once() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        let other = dir.path().join("other");
        for r in [&repo, &other] {
            fs::create_dir_all(r).unwrap();
            git_ok(r, &["init", "-q", "-b", "main"]);
        }
        let common = repo.join(".git");
        let from = worker_object_dir(&common, 1);
        let put = |id: &str, src: &Path| {
            let d = from.join(&id[..2]);
            fs::create_dir_all(&d).unwrap();
            fs::copy(src, d.join(&id[2..])).unwrap();
        };
        // A genuine new object.
        let (good, good_path) = blob(&other, "new content\n");
        put(&good, &good_path);
        // A genuine object stored under another object's name.
        let (victim, _) = blob(&other, "the real one\n");
        let (_, liar_path) = blob(&other, "something else\n");
        put(&victim, &liar_path);
        // Garbage, and a symlink to a file the worker could not read itself.
        let bogus = "ab".to_string() + &"0".repeat(38);
        fs::create_dir_all(from.join("ab")).unwrap();
        fs::write(from.join("ab").join(&bogus[2..]), "not zlib").unwrap();
        let secret = dir.path().join("secret");
        fs::write(&secret, "secret").unwrap();
        let linked = "cd".to_string() + &"1".repeat(38);
        fs::create_dir_all(from.join("cd")).unwrap();
        std::os::unix::fs::symlink(&secret, from.join("cd").join(&linked[2..])).unwrap();

        assert_eq!(import_worker_objects(&repo, 1).unwrap(), 1);
        assert_eq!(git_ok(&repo, &["cat-file", "-p", &good]), "new content");
        for id in [&victim, &bogus, &linked] {
            assert!(
                !common
                    .join("objects")
                    .join(&id[..2])
                    .join(&id[2..])
                    .exists(),
                "{id} must not be imported"
            );
        }
        assert_eq!(import_worker_objects(&repo, 1).unwrap(), 0, "imported once");
        assert_eq!(import_worker_objects(&repo, 9).unwrap(), 0);
    }

    // === Against the real engine (skipped where none is reachable) ===

    const TEST_IMAGE: &str = "zerg-worker:launcher-test";

    /// The fake agent: reports what it sees, commits, and exits 3 (other workers sleep).
    const FAKE_AGENT: &str = r#"#!/bin/sh
out=/zerg/logs/report
{
  echo "worktree=$ZERG_WORKTREE pwd=$(pwd)"
  while read k v rest; do if [ "$k" = "Uid:" ]; then echo "uid=$v"; fi; done < /proc/self/status
  read line < "$ZERG_SPEC_DIR/requirements.md"; echo "spec_line=$line"
  if (echo x > "$ZERG_SPEC_DIR/new") 2>/dev/null; then echo "spec_writable=yes"; else echo "spec_writable=no"; fi
  if git credential-cache --socket "$ZERG_SOCKET" exit; then echo "socket=ok"; else echo "socket=fail"; fi
  if [ -e /var/run/docker.sock ]; then echo "docker_sock=yes"; else echo "docker_sock=no"; fi
  if [ -e /zerg/state ]; then echo "state_dir=yes"; else echo "state_dir=no"; fi
  if git reset -q --hard HEAD; then echo "reset=ok"; else echo "reset=fail"; fi
  echo "status=[$(git status --porcelain)]"
} > "$out" 2>&1
if [ "$ZERG_WORKER_ID" != "1" ]; then echo "worker $ZERG_WORKER_ID sleeping"; exec sleep 600; fi
echo hello > hello.txt
if git add -A && git commit -q -m "from container"; then echo "commit=$(git rev-parse HEAD)" >> "$out"; else echo "commit=fail" >> "$out"; fi
git update-ref refs/heads/zerg/feat/staging HEAD
echo "agent done"
exit 3
"#;

    fn host_git() -> Option<PathBuf> {
        ["/usr/local/bin/git", "/usr/bin/git"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
    }

    /// Copies `file` (following symlinks) and the shared libraries `ldd` names into `root`.
    fn stage(root: &Path, file: &Path) {
        let mut files = vec![file.to_path_buf()];
        let out = std::process::Command::new("ldd")
            .arg(file)
            .output()
            .unwrap();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some(lib) = line.split_whitespace().find(|t| t.starts_with('/')) {
                files.push(PathBuf::from(lib));
            }
        }
        for f in files {
            let dest = root.join(f.strip_prefix("/").unwrap());
            fs::create_dir_all(dest.parent().unwrap()).unwrap();
            fs::copy(&f, &dest).unwrap();
        }
    }

    /// A minimal image (sh, sleep, git, the fake agent) from the host's own binaries,
    /// imported with `docker import` semantics.
    async fn build_test_image(docker: &Docker, git: &Path) {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        stage(r, Path::new("/bin/sh"));
        stage(r, Path::new("/bin/sleep"));
        stage(r, git);
        let agent = r.join("usr/local/bin/zerg-worker-agent");
        fs::create_dir_all(agent.parent().unwrap()).unwrap();
        fs::write(&agent, FAKE_AGENT).unwrap();
        fs::set_permissions(&agent, fs::Permissions::from_mode(0o755)).unwrap();
        fs::create_dir_all(r.join("etc")).unwrap();
        fs::write(
            r.join("etc/passwd"),
            "root:x:0:0::/root:/bin/sh\nworker:x:10001:10001::/home/worker:/bin/sh\n",
        )
        .unwrap();
        fs::write(r.join("etc/group"), "root:x:0:\nworker:x:10001:\n").unwrap();
        for d in ["tmp", "home/worker"] {
            fs::create_dir_all(r.join(d)).unwrap();
            fs::set_permissions(r.join(d), fs::Permissions::from_mode(0o1777)).unwrap();
        }
        let tar = std::process::Command::new("tar")
            .arg("-C")
            .arg(r)
            .args(["-cf", "-", "."])
            .output()
            .unwrap();
        assert!(tar.status.success(), "tar failed");
        let (repo, tag) = TEST_IMAGE.split_once(':').unwrap();
        let opts = bollard::query_parameters::CreateImageOptionsBuilder::new()
            .from_src("-")
            .repo(repo)
            .tag(tag)
            .changes(vec![format!("ENV PATH={}", "/usr/local/bin:/usr/bin:/bin")])
            .build();
        let mut s = std::pin::pin!(docker.create_image(
            Some(opts),
            Some(bollard::body_full(tar.stdout.into())),
            None
        ));
        while let Some(item) = s.next().await {
            item.expect("image import failed");
        }
    }

    fn git_ok(dir: &Path, args: &[&str]) -> String {
        let out = std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    async fn exit_of(rx: tokio::sync::oneshot::Receiver<ExitInfo>) -> ExitInfo {
        tokio::time::timeout(Duration::from_secs(30), rx)
            .await
            .expect("no exit within 30 s")
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn real_engine_lifecycle() {
        let launcher = match ContainerLauncher::connect().await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("skipping: no Docker engine reachable ({e})");
                return;
            }
        };
        let Some(git) = host_git() else {
            eprintln!("skipping: no git on this host");
            return;
        };
        build_test_image(&launcher.docker, &git).await;

        // A repository with a worktree per worker, a spec snapshot, and a zergd-like socket
        // (0600 in a 0700 directory).
        let tmp = tempfile::tempdir().unwrap();
        let t = tmp.path();
        let repo = t.join("repo");
        fs::create_dir_all(&repo).unwrap();
        git_ok(&repo, &["init", "-q", "-b", "main"]);
        // The spec is committed, as users do: the read-only mount lies over tracked files.
        fs::create_dir_all(repo.join(".gsd/specs/feat")).unwrap();
        fs::write(
            repo.join(".gsd/specs/feat/requirements.md"),
            "# committed\n",
        )
        .unwrap();
        git_ok(&repo, &["add", "-A"]);
        git_ok(
            &repo,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-q",
                "-m",
                "init",
            ],
        );
        let spec_dir = t.join("specs/feat");
        fs::create_dir_all(&spec_dir).unwrap();
        fs::write(spec_dir.join("requirements.md"), "# the spec\n").unwrap();
        let run = t.join("run/w/0123456789abcdef");
        fs::create_dir_all(&run).unwrap();
        fs::set_permissions(&run, fs::Permissions::from_mode(0o700)).unwrap();
        let socket = run.join("worker.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        fs::set_permissions(&socket, fs::Permissions::from_mode(0o600)).unwrap();
        let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let conns = connections.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                conns.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut buf = Vec::new();
                let _ = tokio::io::AsyncReadExt::read_to_end(&mut s, &mut buf).await;
            }
        });
        let rush = format!("test-{}", std::process::id());
        let mk = |w: u32| {
            let wt = t.join(format!("wt/worker-{w}"));
            let branch = format!("zerg/feat/worker-{w}");
            git_ok(
                &repo,
                &[
                    "worktree",
                    "add",
                    "-q",
                    "-b",
                    &branch,
                    &wt.to_string_lossy(),
                ],
            );
            WorkerSpec {
                rush_id: rush.clone(),
                feature: "feat".into(),
                worker_id: w,
                generation: 1,
                repo: repo.clone(),
                worktree: wt,
                branch,
                spec_dir: spec_dir.clone(),
                state_dir: t.join("state"),
                log_dir: t.join("logs"),
                socket: socket.clone(),
                token: crate::worker_plane::WorkerToken::generate(),
                agent_bin: AGENT_IN_IMAGE.into(),
                container: ContainerSpec {
                    image: TEST_IMAGE.into(),
                    network: "none".into(),
                    memory_bytes: 256 << 20,
                    cpus: 1.0,
                    pids_limit: 64,
                },
            }
        };
        let s1 = mk(1);
        let dotgit_before = fs::read(s1.worktree.join(".git")).unwrap();
        let admin_gitdir_before = fs::read(repo.join(".git/worktrees/worker-1/gitdir")).unwrap();

        // A missing image is reported the way the supervisor shows it.
        let mut bad = s1.clone();
        bad.container.image = "zerg-worker:does-not-exist".into();
        let err = launcher.spawn(bad, Box::new(|_| {})).await.unwrap_err();
        assert!(
            err.message.starts_with(
                "image zerg-worker:does-not-exist not found: build it with zergctl image build"
            ),
            "{err}"
        );

        // Worker 1 runs to completion: its exit code is observed, its commit lands on the host.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let sp = launcher
            .spawn(
                s1.clone(),
                Box::new(move |i| {
                    let _ = tx.send(i);
                }),
            )
            .await
            .unwrap();
        let id1 = sp.container_id.clone().unwrap();
        assert_eq!(exit_of(rx).await, ExitInfo::Code(3));
        let report = fs::read_to_string(t.join("logs/worker-1/report")).unwrap();
        assert!(
            report.contains("worktree=/workspace pwd=/workspace"),
            "{report}"
        );
        assert!(!report.contains("uid=0\n"), "{report}");
        assert!(report.contains("spec_line=# the spec"), "{report}");
        assert!(report.contains("spec_writable=no"), "{report}");
        assert!(report.contains("socket=ok"), "{report}");
        assert!(report.contains("docker_sock=no"), "{report}");
        assert!(report.contains("state_dir=no"), "{report}");
        // The committed spec under the read-only mount does not break git.
        assert!(report.contains("reset=ok"), "{report}");
        assert!(report.contains("status=[]"), "{report}");
        let commit = report
            .lines()
            .find_map(|l| l.strip_prefix("commit="))
            .unwrap_or("fail")
            .to_string();
        assert!(commit.len() == 40, "{report}");
        assert!(connections.load(std::sync::atomic::Ordering::SeqCst) >= 1);
        // The commit stays private to the container (zergd moves the branch once it accepts
        // it); its objects reached the host's store, verified, when the container exited.
        assert_eq!(
            git_ok(&repo, &["log", "-1", "--format=%s", "zerg/feat/worker-1"]),
            "init"
        );
        assert_eq!(
            git_ok(&repo, &["log", "-1", "--format=%s", &commit]),
            "from container"
        );
        assert!(
            git_ok(&repo, &["branch", "--list", "zerg/feat/staging"]).is_empty(),
            "a ref moved inside the container must not appear on the host"
        );
        assert_eq!(
            git_ok(
                &repo,
                &["show", &format!("{commit}:.gsd/specs/feat/requirements.md")]
            ),
            "# committed",
            "the commit keeps the committed spec"
        );
        assert_eq!(
            fs::read(s1.worktree.join(".git")).unwrap(),
            dotgit_before,
            "the .git file is untouched"
        );
        assert_eq!(
            fs::read(repo.join(".git/worktrees/worker-1/gitdir")).unwrap(),
            admin_gitdir_before
        );
        let log = fs::read_to_string(t.join("logs/worker-1.log")).unwrap_or_default();
        assert!(log.contains("agent done"), "log mirror: {log:?}");
        let mut gone = false;
        for _ in 0..50 {
            if launcher
                .docker
                .inspect_container(&id1, None::<InspectContainerOptions>)
                .await
                .is_err()
            {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(gone, "an exited worker's container is removed");

        // Worker 2 runs until stopped; discover() finds it by label, stop() ends and removes it.
        let s2 = mk(2);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let sp2 = launcher
            .spawn(
                s2,
                Box::new(move |i| {
                    let _ = tx.send(i);
                }),
            )
            .await
            .unwrap();
        assert!(launcher.is_alive(sp2.clone()).await);
        let found = launcher.discover(&rush).await;
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(
            (found[0].worker_id, found[0].generation, found[0].running),
            (2, 1, true)
        );
        assert_eq!(found[0].spawned.container_id, sp2.container_id);
        launcher.stop(sp2.clone(), Duration::from_secs(1)).await;
        assert_eq!(exit_of(rx).await, ExitInfo::Code(143));
        assert!(!launcher.is_alive(sp2).await);
        assert!(launcher.discover(&rush).await.is_empty());

        // A leftover container with worker 3's name is ours by label: it is replaced. A kill
        // (as by `docker kill`) is seen as a crash exit.
        let s3 = mk(3);
        let leftover = ContainerCreateBody {
            image: Some(TEST_IMAGE.into()),
            entrypoint: Some(vec!["/bin/sh".into()]),
            labels: Some(HashMap::from([
                (LABEL_FEATURE.to_string(), "feat".to_string()),
                (LABEL_WORKER.to_string(), "3".to_string()),
            ])),
            ..Default::default()
        };
        let opts = CreateContainerOptionsBuilder::new()
            .name(&container_name(&s3))
            .build();
        launcher
            .docker
            .create_container(Some(opts), leftover)
            .await
            .unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let sp3 = launcher
            .spawn(
                s3,
                Box::new(move |i| {
                    let _ = tx.send(i);
                }),
            )
            .await
            .unwrap();
        let id3 = sp3.container_id.clone().unwrap();
        launcher
            .docker
            .kill_container(
                &id3,
                None::<bollard::query_parameters::KillContainerOptions>,
            )
            .await
            .unwrap();
        assert_eq!(exit_of(rx).await, ExitInfo::Code(137));
        launcher.cleanup(sp3).await;
        assert!(launcher.discover(&rush).await.is_empty());

        let _ = launcher
            .docker
            .remove_image(
                TEST_IMAGE,
                Some(
                    bollard::query_parameters::RemoveImageOptionsBuilder::new()
                        .force(true)
                        .build(),
                ),
                None,
            )
            .await;
    }
}
