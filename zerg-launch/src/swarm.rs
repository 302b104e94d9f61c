//! Workers as Docker Swarm services, through the Docker Engine API ([`bollard`]); no docker CLI.
//!
//! A worker shares no filesystem with zergd here: it clones and pushes over the TCP worker
//! plane, and everything it needs arrives through the engine. Each worker generation is three
//! Swarm objects named after `zerg-<rush>-w<N>-g<G>` ([`service_name`]; the rush as the first 12
//! hex digits of its id's SHA-256), all labelled `zerg.rush`, `zerg.feature`, `zerg.worker` and
//! `zerg.generation`:
//!
//! - a secret `<name>-token` holding the worker's token, mounted at `/run/secrets/zerg-token`
//!   (mode 0400, owned by the worker's uid), so the token is in no environment and no spec;
//! - a config `<name>-ca` holding the CA of the plane's certificate, at `/zerg/remote/ca.pem`;
//! - a replicated service `<name>` of one replica whose restart condition is `none`: one task,
//!   never restarted by Swarm (zergd owns respawns), running the agent with [`remote_env`] as
//!   its environment, as the image's unprivileged user, all capabilities dropped, within the
//!   rush's memory / CPU / pids limits, on the `host` network unless `container.network` names
//!   another one. (Not a `replicated-job` service: before Engine 24, removing a job service
//!   leaves its task's container running, moby/moby#44312, so a stop would not stop the
//!   worker.)
//!
//! The service id is the worker's handle (`Spawned::container_id`). Its task is polled; the
//! exit is reported once, then the service, secret and config are removed. Since everything
//! carries the labels, [`SwarmLauncher::remove_rush`] removes whatever a rush left behind.

use std::collections::HashMap;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::models::{
    ConfigSpec, Limit, LocalNodeState, NetworkAttachmentConfig, SecretSpec, Service, ServiceSpec,
    ServiceSpecMode, ServiceSpecModeReplicated, Task, TaskSpec, TaskSpecContainerSpec,
    TaskSpecContainerSpecConfigs, TaskSpecContainerSpecFile, TaskSpecContainerSpecFile1,
    TaskSpecContainerSpecSecrets, TaskSpecLogDriver, TaskSpecResources, TaskSpecRestartPolicy,
    TaskSpecRestartPolicyConditionEnum, TaskState,
};
use bollard::query_parameters::{
    InspectServiceOptions, ListConfigsOptionsBuilder, ListSecretsOptionsBuilder,
    ListServicesOptionsBuilder, ListTasksOptionsBuilder,
};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::engine::{
    LABEL_FEATURE, LABEL_GENERATION, LABEL_RUSH, LABEL_WORKER, connect_engine, engine_error,
    exit_info, image_of, missing_image, parse_worker_labels, status,
};
use super::{
    BoxFuture, Discovered, ExitInfo, ExitSink, Launcher, SpawnError, Spawned, WorkerSpec,
    remote_env,
};

use zerg_proto::contract::image;

/// The stop grace period of a worker's service when none is configured.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(10);
/// The network a worker's service joins when `container.network` is empty or `none`: the
/// node's own, so a worker on a single-node swarm reaches zergd on 127.0.0.1.
pub const DEFAULT_NETWORK: &str = "host";
/// Suffix of the name of a worker's token secret.
const TOKEN_SUFFIX: &str = "-token";
/// Suffix of the name of a worker's CA config.
const CA_SUFFIX: &str = "-ca";
/// How often a worker's task is polled.
const POLL: Duration = Duration::from_millis(500);
/// The longest pause between polls while the engine answers with errors.
const POLL_MAX: Duration = Duration::from_secs(10);
/// How long a spawn watches its first task for a rejection (a missing image).
const START_WINDOW: Duration = Duration::from_secs(10);
/// How long a stop waits for the worker's task beyond the stop grace period.
const STOP_MARGIN: Duration = Duration::from_secs(10);

/// Launches workers as Docker Swarm services.
#[derive(Debug, Clone)]
pub struct SwarmLauncher {
    docker: Docker,
    stop_grace: Duration,
}

impl SwarmLauncher {
    /// Connects to the local engine (as [`super::container::ContainerLauncher::connect`] does),
    /// with the default stop grace period ([`DEFAULT_STOP_GRACE`]).
    pub async fn connect() -> Result<Self, SpawnError> {
        Self::connect_with_grace(DEFAULT_STOP_GRACE).await
    }

    /// Connects to the local engine; `stop_grace` is how long Swarm lets a worker's agent
    /// handle SIGTERM before it kills it. Refused, saying what to do, when the engine is too
    /// old (before 20.10), is not in an active swarm, or is not a swarm manager.
    pub async fn connect_with_grace(stop_grace: Duration) -> Result<Self, SpawnError> {
        let docker = connect_engine().await?;
        let v = docker.client_version();
        if (v.major_version, v.minor_version) < (1, 41) {
            return Err(SpawnError::new(format!(
                "swarm mode needs Docker Engine 20.10 or later (API 1.41, for the pids limit and the dropped capabilities); this engine speaks API {}.{}: upgrade it, or run the rush with --mode container",
                v.major_version, v.minor_version
            )));
        }
        let info = docker
            .info()
            .await
            .map_err(|e| engine_error("cannot read the engine's info", &e))?;
        let swarm = info.swarm.unwrap_or_default();
        match swarm.local_node_state {
            Some(LocalNodeState::ACTIVE) => {}
            state => {
                let state = state.map_or_else(|| "unknown".to_string(), |s| s.to_string());
                return Err(SpawnError::new(format!(
                    "the Docker engine is not in an active swarm (node state: {state}): run docker swarm init (or join this node to a swarm), or run the rush with --mode container"
                )));
            }
        }
        if swarm.control_available != Some(true) {
            return Err(SpawnError::new(
                "this Docker engine is a swarm worker, not a manager: point DOCKER_HOST at a manager node, or promote this one (docker node promote)",
            ));
        }
        Ok(Self { docker, stop_grace })
    }

    /// Removes every service, secret and config labelled with `rush_id` (when the rush ends,
    /// or to clear what an earlier zergd left), and waits until the services' tasks are down
    /// (at most the stop grace period, plus a margin). Failures are logged; what cannot be
    /// removed now is found by label next time.
    pub async fn remove_rush(&self, rush_id: &str) {
        let filters = HashMap::from([("label", vec![format!("{LABEL_RUSH}={rush_id}")])]);
        let mut up = Vec::new();
        match self
            .docker
            .list_services(Some(
                ListServicesOptionsBuilder::new().filters(&filters).build(),
            ))
            .await
        {
            Ok(list) => {
                for id in list.into_iter().filter_map(|s| s.id) {
                    up.extend(self.tasks_up(&id).await);
                    self.delete_service(&id).await;
                }
            }
            Err(e) => tracing::warn!(rush = rush_id, error = %e, "cannot list worker services"),
        }
        match self
            .docker
            .list_secrets(Some(
                ListSecretsOptionsBuilder::new().filters(&filters).build(),
            ))
            .await
        {
            Ok(list) => {
                for id in list.into_iter().filter_map(|s| s.id) {
                    self.delete_secret(&id).await;
                }
            }
            Err(e) => tracing::warn!(rush = rush_id, error = %e, "cannot list worker secrets"),
        }
        match self
            .docker
            .list_configs(Some(
                ListConfigsOptionsBuilder::new().filters(&filters).build(),
            ))
            .await
        {
            Ok(list) => {
                for id in list.into_iter().filter_map(|c| c.id) {
                    self.delete_config(&id).await;
                }
            }
            Err(e) => tracing::warn!(rush = rush_id, error = %e, "cannot list worker configs"),
        }
        self.await_tasks_down(&up, self.stop_grace.saturating_add(STOP_MARGIN))
            .await;
    }

    /// Creates the secret, the config and the service of a worker; on a failure, what was
    /// created is removed again.
    async fn create_objects(&self, spec: &WorkerSpec, name: &str) -> Result<String, DockerError> {
        let labels = worker_labels(spec);
        let secret_name = format!("{name}{TOKEN_SUFFIX}");
        let secret = self
            .docker
            .create_secret(SecretSpec {
                name: Some(secret_name.clone()),
                labels: Some(labels.clone()),
                data: Some(BASE64.encode(spec.token.expose())),
                ..Default::default()
            })
            .await?
            .id;
        let config_name = format!("{name}{CA_SUFFIX}");
        let config = match self
            .docker
            .create_config(ConfigSpec {
                name: Some(config_name.clone()),
                labels: Some(labels),
                data: Some(BASE64.encode(&spec.remote.ca_pem)),
                ..Default::default()
            })
            .await
        {
            Ok(r) => r.id,
            Err(e) => {
                self.delete_secret(&secret).await;
                return Err(e);
            }
        };
        let refs = ObjectRefs {
            secret_id: secret.clone(),
            secret_name,
            config_id: config.clone(),
            config_name,
        };
        // The rush's own grace (`workers.stop_grace_seconds`) when it has one.
        let grace = if spec.stop_grace.is_zero() {
            self.stop_grace
        } else {
            spec.stop_grace
        };
        let body = service_spec(spec, name, &refs, grace);
        let created = self.docker.create_service(body, None).await;
        match created {
            Ok(r) if r.id.as_deref().is_some_and(|id| !id.is_empty()) => {
                for w in r.warnings.unwrap_or_default() {
                    tracing::debug!(service = name, warning = %w, "engine warning");
                }
                Ok(r.id.unwrap_or_default())
            }
            other => {
                self.delete_secret(&secret).await;
                self.delete_config(&config).await;
                match other {
                    Err(e) => Err(e),
                    Ok(_) => Err(DockerError::DockerResponseServerError {
                        status_code: 500,
                        message: "the engine returned no service id".into(),
                    }),
                }
            }
        }
    }

    /// Removes a leftover service, secret and config named after `name` (a spawn of the same
    /// generation that an earlier zergd did not finish); refused for objects of another rush
    /// or of no rush.
    async fn clear_leftovers(&self, name: &str, rush_id: &str) -> Result<(), SpawnError> {
        let taken = |what: &str, n: &str| {
            SpawnError::new(format!(
                "swarm {what} name {n} is taken by one zergd did not create for this rush: remove or rename it"
            ))
        };
        let ours = |labels: Option<&HashMap<String, String>>| {
            labels.and_then(|l| l.get(LABEL_RUSH)).map(String::as_str) == Some(rush_id)
        };
        match self
            .docker
            .inspect_service(name, None::<InspectServiceOptions>)
            .await
        {
            Ok(s) if ours(s.spec.as_ref().and_then(|s| s.labels.as_ref())) => {
                tracing::warn!(
                    service = name,
                    "removing leftover service with the same name"
                );
                self.remove_worker(s.id.as_deref().unwrap_or(name)).await;
            }
            Ok(_) => return Err(taken("service", name)),
            Err(e) if status(&e) == Some(404) => {}
            Err(e) => return Err(engine_error("cannot inspect a conflicting service", &e)),
        }
        let secret = format!("{name}{TOKEN_SUFFIX}");
        match self.docker.inspect_secret(&secret).await {
            Ok(s) if ours(s.spec.as_ref().and_then(|s| s.labels.as_ref())) => {
                self.delete_secret(&secret).await;
            }
            Ok(_) => return Err(taken("secret", &secret)),
            Err(e) if status(&e) == Some(404) => {}
            Err(e) => return Err(engine_error("cannot inspect a conflicting secret", &e)),
        }
        let config = format!("{name}{CA_SUFFIX}");
        match self.docker.inspect_config(&config).await {
            Ok(c) if ours(c.spec.as_ref().and_then(|s| s.labels.as_ref())) => {
                self.delete_config(&config).await;
            }
            Ok(_) => return Err(taken("config", &config)),
            Err(e) if status(&e) == Some(404) => {}
            Err(e) => return Err(engine_error("cannot inspect a conflicting config", &e)),
        }
        Ok(())
    }

    /// Watches a new service's first task for a few seconds: a rejection (a missing image) is
    /// the spawn's error. A task still pending after that is left to the exit poller.
    async fn await_start(&self, id: &str, image: &str) -> Result<(), SpawnError> {
        let deadline = Instant::now() + START_WINDOW;
        loop {
            if let Ok(Some(task)) = self.task_of(id).await {
                match task_state(&task) {
                    Some(TaskState::REJECTED) => return Err(rejection(&task, image)),
                    Some(s) if s >= TaskState::RUNNING => return Ok(()),
                    _ => {}
                }
            }
            if Instant::now() >= deadline {
                return Ok(());
            }
            tokio::time::sleep(POLL / 2).await;
        }
    }

    /// The service's newest task; `None` while it has none.
    async fn task_of(&self, service: &str) -> Result<Option<Task>, DockerError> {
        Ok(self
            .tasks_of(service)
            .await?
            .into_iter()
            .max_by(|a, b| (&a.created_at, &a.id).cmp(&(&b.created_at, &b.id))))
    }

    async fn tasks_of(&self, service: &str) -> Result<Vec<Task>, DockerError> {
        let filters = HashMap::from([("service", vec![service.to_string()])]);
        self.docker
            .list_tasks(Some(
                ListTasksOptionsBuilder::new().filters(&filters).build(),
            ))
            .await
    }

    /// The ids of the service's tasks that are not down yet.
    async fn tasks_up(&self, service: &str) -> Vec<String> {
        self.tasks_of(service)
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|t| task_state(t).is_some_and(|s| s <= TaskState::RUNNING))
            .filter_map(|t| t.id)
            .collect()
    }

    /// Polls the service's task until it ends, and says how.
    async fn wait_for_exit(&self, id: &str) -> ExitInfo {
        let mut pause = POLL;
        loop {
            match self.task_of(id).await {
                Ok(Some(task)) => {
                    if let Some(info) = task_exit(id, &task) {
                        return info;
                    }
                    pause = POLL;
                }
                Ok(None) => match self
                    .docker
                    .inspect_service(id, None::<InspectServiceOptions>)
                    .await
                {
                    Err(e) if status(&e) == Some(404) => return ExitInfo::Vanished,
                    _ => pause = POLL,
                },
                // The service is gone (removed by a stop, or by hand).
                Err(e) if status(&e) == Some(404) => return ExitInfo::Vanished,
                Err(e) => {
                    tracing::debug!(service = id, error = %e, "cannot list the worker's tasks");
                    pause = (pause * 2).min(POLL_MAX);
                }
            }
            tokio::time::sleep(pause).await;
        }
    }

    /// Removes a worker's service, then the secrets and configs its spec names. A service
    /// already gone is no error.
    async fn remove_worker(&self, id: &str) {
        let service = match self
            .docker
            .inspect_service(id, None::<InspectServiceOptions>)
            .await
        {
            Ok(s) => s,
            Err(e) if status(&e) == Some(404) => return,
            Err(e) => {
                tracing::warn!(service = id, error = %e, "cannot inspect worker service");
                return;
            }
        };
        let (secrets, configs) = mounted_objects(&service);
        self.delete_service(id).await;
        for s in secrets {
            self.delete_secret(&s).await;
        }
        for c in configs {
            self.delete_config(&c).await;
        }
    }

    async fn delete_service(&self, id: &str) {
        match self.docker.delete_service(id).await {
            Ok(()) => {}
            Err(e) if status(&e) == Some(404) => {}
            Err(e) => tracing::warn!(service = id, error = %e, "cannot remove worker service"),
        }
    }

    /// Deletes a secret; retried a few times while the engine still counts it in use by a
    /// service being removed.
    async fn delete_secret(&self, id: &str) {
        let mut last = None;
        for _ in 0..5 {
            match self.docker.delete_secret(id).await {
                Ok(()) => return,
                Err(e) if status(&e) == Some(404) => return,
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if let Some(e) = last {
            tracing::warn!(secret = id, error = %e, "cannot remove worker secret");
        }
    }

    /// Deletes a config, retried like [`Self::delete_secret`].
    async fn delete_config(&self, id: &str) {
        let mut last = None;
        for _ in 0..5 {
            match self.docker.delete_config(id).await {
                Ok(()) => return,
                Err(e) if status(&e) == Some(404) => return,
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if let Some(e) = last {
            tracing::warn!(config = id, error = %e, "cannot remove worker config");
        }
    }

    /// Waits (at most `limit`) until the given tasks are down: in a final state, or gone.
    async fn await_tasks_down(&self, tasks: &[String], limit: Duration) {
        let deadline = Instant::now() + limit;
        for id in tasks {
            loop {
                match self.docker.inspect_task(id).await {
                    Ok(t) if task_state(&t).is_none_or(|s| s > TaskState::RUNNING) => break,
                    Err(e) if status(&e) == Some(404) => break,
                    _ => {}
                }
                if Instant::now() >= deadline {
                    tracing::warn!(task = %id, "worker task still up after the stop grace period");
                    return;
                }
                tokio::time::sleep(POLL).await;
            }
        }
    }
}

/// Reports a worker's exit once, then removes its service, secret and config.
async fn follow(this: SwarmLauncher, id: String, on_exit: ExitSink) {
    let info = this.wait_for_exit(&id).await;
    tracing::info!(service = %id, exit = %info.describe(), "worker service ended");
    on_exit(info);
    this.remove_worker(&id).await;
}

impl Launcher for SwarmLauncher {
    fn spawn(&self, spec: WorkerSpec, on_exit: ExitSink) -> BoxFuture<Result<Spawned, SpawnError>> {
        let this = self.clone();
        Box::pin(async move {
            spec.remote.check()?;
            let name = service_name(&spec);
            let image = image_of(&spec);
            let mut retried = false;
            let id = loop {
                match this.create_objects(&spec, &name).await {
                    Ok(id) => break id,
                    Err(e) if status(&e) == Some(409) && !retried => {
                        retried = true;
                        this.clear_leftovers(&name, &spec.rush_id).await?;
                    }
                    Err(e) => {
                        return Err(engine_error(
                            &format!("cannot create the swarm service {name}"),
                            &e,
                        ));
                    }
                }
            };
            if let Err(e) = this.await_start(&id, &image).await {
                this.remove_worker(&id).await;
                return Err(e);
            }
            tokio::spawn(follow(this.clone(), id.clone(), on_exit));
            tracing::info!(service = %name, image = %image, "worker service created");
            Ok(Spawned {
                pid: None,
                start_time: None,
                container_id: Some(id),
            })
        })
    }

    /// Removes the worker's service (Swarm stops its container, SIGTERM then SIGKILL after the
    /// service's stop grace period, the launcher's), its secret and its config, and waits
    /// until the task is down, at most the longer of `grace` and the service's grace period,
    /// plus a margin.
    fn stop(&self, worker: Spawned, grace: Duration) -> BoxFuture<()> {
        let this = self.clone();
        Box::pin(async move {
            let Some(id) = worker.container_id else {
                return;
            };
            let up = this.tasks_up(&id).await;
            this.remove_worker(&id).await;
            let limit = grace.max(this.stop_grace).saturating_add(STOP_MARGIN);
            this.await_tasks_down(&up, limit).await;
        })
    }

    fn is_alive(&self, worker: Spawned) -> BoxFuture<bool> {
        let this = self.clone();
        Box::pin(async move {
            let Some(id) = worker.container_id else {
                return false;
            };
            // A service whose task is not created yet is starting.
            match this.task_of(&id).await {
                Ok(Some(task)) => task_running(&task),
                Ok(None) => this
                    .docker
                    .inspect_service(&id, None::<InspectServiceOptions>)
                    .await
                    .is_ok(),
                Err(_) => false,
            }
        })
    }

    fn watch(&self, worker: Spawned, on_exit: ExitSink) {
        let this = self.clone();
        tokio::spawn(async move {
            match worker.container_id {
                Some(id) => follow(this, id, on_exit).await,
                None => on_exit(ExitInfo::Vanished),
            }
        });
    }

    fn discover(&self, rush_id: &str) -> BoxFuture<Vec<Discovered>> {
        let this = self.clone();
        let filter = format!("{LABEL_RUSH}={rush_id}");
        Box::pin(async move {
            let filters = HashMap::from([("label", vec![filter])]);
            let opts = ListServicesOptionsBuilder::new().filters(&filters).build();
            let list = match this.docker.list_services(Some(opts)).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list worker services");
                    return Vec::new();
                }
            };
            let mut out = Vec::new();
            for service in list {
                let labels = service
                    .spec
                    .as_ref()
                    .and_then(|s| s.labels.clone())
                    .unwrap_or_default();
                let (Some((worker_id, generation)), Some(id)) =
                    (parse_worker_labels(&labels), service.id)
                else {
                    continue;
                };
                let running = match this.task_of(&id).await {
                    Ok(Some(task)) => task_running(&task),
                    Ok(None) => true,
                    Err(_) => false,
                };
                out.push(Discovered {
                    worker_id,
                    generation,
                    spawned: Spawned {
                        pid: None,
                        start_time: None,
                        container_id: Some(id),
                    },
                    running,
                });
            }
            out
        })
    }

    fn cleanup(&self, worker: Spawned) -> BoxFuture<()> {
        let this = self.clone();
        Box::pin(async move {
            if let Some(id) = worker.container_id {
                this.remove_worker(&id).await;
            }
        })
    }
}

// === The objects, as pure functions of the worker's spec ===

/// The name of a worker's service (its secret and config add `-token` and `-ca`):
/// `zerg-<first 12 hex digits of the rush id's SHA-256>-w<slot>-g<generation>`, unique per
/// rush, slot and generation, and within Swarm's 63 characters.
pub fn service_name(spec: &WorkerSpec) -> String {
    let rush = crate::token::hex(&Sha256::digest(spec.rush_id.as_bytes()));
    format!(
        "zerg-{}-w{}-g{}",
        &rush[..12],
        spec.worker_id,
        spec.generation
    )
}

/// The labels of everything a worker's spawn creates.
fn worker_labels(spec: &WorkerSpec) -> HashMap<String, String> {
    HashMap::from([
        (LABEL_RUSH.to_string(), spec.rush_id.clone()),
        (LABEL_FEATURE.to_string(), spec.feature.clone()),
        (LABEL_WORKER.to_string(), spec.worker_id.to_string()),
        (LABEL_GENERATION.to_string(), spec.generation.to_string()),
    ])
}

/// The network a worker's service joins: `container.network` unless empty or `none`.
fn network_of(spec: &WorkerSpec) -> String {
    match spec.container.network.trim() {
        "" | "none" => DEFAULT_NETWORK.to_string(),
        n => n.to_string(),
    }
}

/// The secret and config a worker's service mounts.
#[derive(Debug, Clone)]
struct ObjectRefs {
    secret_id: String,
    secret_name: String,
    config_id: String,
    config_name: String,
}

/// The full service of a worker.
fn service_spec(
    spec: &WorkerSpec,
    name: &str,
    refs: &ObjectRefs,
    stop_grace: Duration,
) -> ServiceSpec {
    let labels = worker_labels(spec);
    let uid = image::WORKER_UID.to_string();
    let c = &spec.container;
    let env = remote_env(spec)
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let limits = Limit {
        nano_cpus: (c.cpus > 0.0).then(|| (c.cpus * 1e9).round().min(i64::MAX as f64) as i64),
        memory_bytes: (c.memory_bytes > 0).then_some(c.memory_bytes),
        pids: (c.pids_limit > 0).then_some(c.pids_limit),
    };
    let log_driver = TaskSpecLogDriver {
        name: Some("json-file".into()),
        options: Some(HashMap::from([
            (
                "max-size".to_string(),
                c.log_max_bytes.max(1 << 20).to_string(),
            ),
            ("max-file".to_string(), "1".to_string()),
        ])),
    };
    ServiceSpec {
        name: Some(name.to_string()),
        labels: Some(labels.clone()),
        mode: Some(ServiceSpecMode {
            replicated: Some(ServiceSpecModeReplicated { replicas: Some(1) }),
            ..Default::default()
        }),
        task_template: Some(TaskSpec {
            container_spec: Some(TaskSpecContainerSpec {
                image: Some(image_of(spec)),
                labels: Some(labels),
                command: Some(vec![image::AGENT_PATH.to_string()]),
                env: Some(env),
                user: Some(format!("{uid}:{uid}")),
                init: Some(true),
                stop_grace_period: Some(i64::try_from(stop_grace.as_nanos()).unwrap_or(i64::MAX)),
                capability_drop: Some(vec!["ALL".to_string()]),
                secrets: Some(vec![TaskSpecContainerSpecSecrets {
                    // Relative to the secrets directory, `/run/secrets`.
                    file: Some(TaskSpecContainerSpecFile {
                        name: Some(image::TOKEN_FILE_NAME.to_string()),
                        uid: Some(uid.clone()),
                        gid: Some(uid.clone()),
                        mode: Some(0o400),
                    }),
                    secret_id: Some(refs.secret_id.clone()),
                    secret_name: Some(refs.secret_name.clone()),
                }]),
                configs: Some(vec![TaskSpecContainerSpecConfigs {
                    file: Some(TaskSpecContainerSpecFile1 {
                        name: Some(image::REMOTE_CA_PATH.to_string()),
                        uid: Some(uid.clone()),
                        gid: Some(uid),
                        mode: Some(0o444),
                    }),
                    config_id: Some(refs.config_id.clone()),
                    config_name: Some(refs.config_name.clone()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            resources: Some(TaskSpecResources {
                limits: Some(limits),
                ..Default::default()
            }),
            restart_policy: Some(TaskSpecRestartPolicy {
                condition: Some(TaskSpecRestartPolicyConditionEnum::NONE),
                ..Default::default()
            }),
            networks: Some(vec![NetworkAttachmentConfig {
                target: Some(network_of(spec)),
                ..Default::default()
            }]),
            log_driver: Some(log_driver),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The secrets and configs a service's spec mounts, by id.
fn mounted_objects(service: &Service) -> (Vec<String>, Vec<String>) {
    let c = service
        .spec
        .as_ref()
        .and_then(|s| s.task_template.as_ref())
        .and_then(|t| t.container_spec.as_ref());
    let secrets = c
        .and_then(|c| c.secrets.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|s| s.secret_id.clone())
        .collect();
    let configs = c
        .and_then(|c| c.configs.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| c.config_id.clone())
        .collect();
    (secrets, configs)
}

fn task_state(task: &Task) -> Option<TaskState> {
    task.status.as_ref().and_then(|s| s.state)
}

/// Whether a task is on its way or running (`new` … `running`).
fn task_running(task: &Task) -> bool {
    task_state(task).is_none_or(|s| s <= TaskState::RUNNING)
}

/// What the engine said about a task: its error, else its message.
fn task_said(task: &Task) -> String {
    let s = task.status.as_ref();
    s.and_then(|s| s.err.clone())
        .filter(|e| !e.is_empty())
        .or_else(|| s.and_then(|s| s.message.clone()))
        .unwrap_or_default()
}

/// How a task ended; `None` while it has not. A rejected task (the node could not create its
/// container) is a crash, `1`; a task shut down or removed (its service removed) vanished.
fn task_exit(service: &str, task: &Task) -> Option<ExitInfo> {
    let code = task
        .status
        .as_ref()
        .and_then(|s| s.container_status.as_ref())
        .and_then(|c| c.exit_code);
    match task_state(task)? {
        TaskState::COMPLETE => Some(exit_info(code.unwrap_or(0), false)),
        TaskState::FAILED => match code.filter(|c| *c != 0) {
            Some(c) => {
                let oom = c == 137 && task_said(task).to_ascii_lowercase().contains("oom");
                Some(exit_info(c, oom))
            }
            None => {
                tracing::warn!(service, error = %task_said(task), "worker task failed without an exit code");
                Some(ExitInfo::Code(1))
            }
        },
        TaskState::REJECTED => {
            tracing::warn!(service, error = %task_said(task), "worker task rejected by the swarm");
            Some(ExitInfo::Code(1))
        }
        TaskState::SHUTDOWN | TaskState::ORPHANED | TaskState::REMOVE => Some(ExitInfo::Vanished),
        _ => None,
    }
}

/// The spawn error of a rejected first task: the image's, when the node does not have it.
fn rejection(task: &Task, image: &str) -> SpawnError {
    let said = task_said(task);
    let lower = said.to_ascii_lowercase();
    if [
        "no such image",
        "pull access denied",
        "manifest unknown",
        "repository does not exist",
    ]
    .iter()
    .any(|m| lower.contains(m))
    {
        let err = missing_image(image);
        SpawnError::new(format!("{} (the swarm said: {said})", err.message))
    } else {
        SpawnError::new(format!(
            "the swarm rejected the worker's task (image {image}): {said}"
        ))
    }
}

#[cfg(test)]
mod tests;
