//! Workers as Kubernetes Jobs, through the API server ([`kube`]); no kubectl.
//!
//! Each spawn (one worker slot, one generation) creates, in the configured namespace:
//!
//! - a **Job** `zerg-<rush hash>-w<N>-g<G>`: one pod, never restarted (`backoffLimit: 0`,
//!   `restartPolicy: Never`), removed `ttlSecondsAfterFinished` after it ends. Its one
//!   container, `worker`, runs the image's agent as the image's unprivileged user with every
//!   capability dropped, and gets its whole environment from [`remote_env`] (never the token).
//!   The Job is created suspended, so no pod exists before its Secret and ConfigMap do;
//! - a **Secret** `<job>-token` holding the worker's token, mounted at
//!   [`image::SECRET_DIR`] (the file is `zerg-token`);
//! - a **ConfigMap** `<job>-ca` holding the plane's CA, mounted at `/zerg/remote`.
//!
//! The Secret and the ConfigMap are owned by the Job, so deleting the Job (always with
//! `propagationPolicy: Foreground`, which takes the pods down too) garbage-collects them.
//!
//! A task per worker watches the Job's pods and reports the exit once: the container's exit
//! code, an OOM kill, a pod that cannot start (image pull, container config: the Job is then
//! stopped), an eviction or a Job that disappeared ([`pod_exit`] maps one pod).
//!
//! Everything carries the labels `zerg.rush` (a hash of the rush id: label values are short
//! and restricted; the id itself is in the `zerg.rush` annotation), `zerg.worker` and
//! `zerg.generation`, which is how [`Launcher::discover`] and
//! [`KubernetesLauncher::remove_rush`] find them.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapVolumeSource, Container, EmptyDirVolumeSource, EnvVar, Pod,
    PodSecurityContext, PodSpec, PodTemplateSpec, ResourceRequirements, SeccompProfile, Secret,
    SecretVolumeSource, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use tokio_stream::StreamExt;
use zerg_proto::contract::image;

use super::engine::{LABEL_GENERATION, LABEL_RUSH, LABEL_WORKER};
use super::{
    BoxFuture, Discovered, ExitInfo, ExitSink, Launcher, SpawnError, Spawned, WorkerSpec,
    remote_env,
};
use zerg_config::KubernetesSettings;

/// Annotation: the feature.
pub const ANNOTATION_FEATURE: &str = "zerg.feature";
/// The label the Job controller puts on a Job's pods: the Job's uid.
const JOB_UID_LABEL: &str = "batch.kubernetes.io/controller-uid";
/// The worker's container in the pod.
const CONTAINER: &str = "worker";
/// The key of the token in the Secret (the file name under [`image::SECRET_DIR`]).
const TOKEN_KEY: &str = image::TOKEN_FILE_NAME;
/// The key of the CA in the ConfigMap (the file name under [`CA_DIR`]).
const CA_KEY: &str = "ca.pem";
/// Where the ConfigMap is mounted: the directory of [`image::REMOTE_CA_PATH`].
const CA_DIR: &str = "/zerg/remote";
/// Waiting reasons after which a container never starts on its own.
const FATAL_WAITING: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
];
/// How often the watch also looks at the Job itself (deleted, or finished with no pod left).
const JOB_CHECK: Duration = Duration::from_secs(30);
/// How long a spawn waits for a leftover object of the same name to go away.
const LEFTOVER_WAIT: Duration = Duration::from_secs(60);
/// Pause between retries when the API server cannot be reached at the start of a watch.
const RETRY_PAUSE: Duration = Duration::from_secs(5);

/// Launches workers as Kubernetes Jobs.
#[derive(Clone)]
pub struct KubernetesLauncher {
    client: Client,
    settings: KubernetesSettings,
}

impl std::fmt::Debug for KubernetesLauncher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesLauncher")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl KubernetesLauncher {
    /// A launcher talking to the API server through `client`.
    pub fn new(client: Client, settings: KubernetesSettings) -> Self {
        Self { client, settings }
    }

    /// Connects the way `kubectl` would: the in-cluster service account when zergd runs in a
    /// pod, else `KUBECONFIG` or `~/.kube/config`.
    pub async fn connect(settings: KubernetesSettings) -> Result<Self, SpawnError> {
        let client = Client::try_default().await.map_err(|e| {
            SpawnError::new(format!(
                "cannot reach the Kubernetes API server: {e}; run zergd in the cluster or point KUBECONFIG at a config for it"
            ))
        })?;
        Ok(Self::new(client, settings))
    }

    /// The launcher's settings.
    pub fn settings(&self) -> &KubernetesSettings {
        &self.settings
    }

    fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        <K as Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.settings.namespace)
    }

    /// Deletes every Job of a rush (their pods, Secrets and ConfigMaps go with them) and any
    /// labelled Secret or ConfigMap of the rush left without an owner. Returns how many Jobs
    /// were deleted.
    pub async fn remove_rush(&self, rush_id: &str) -> Result<usize, kube::Error> {
        let lp = ListParams::default().labels(&format!("{LABEL_RUSH}={}", rush_hash(rush_id)));
        let jobs: Api<Job> = self.api();
        let mut removed = 0;
        for job in jobs.list(&lp).await?.items {
            if !of_rush(&job.metadata, rush_id) {
                continue;
            }
            if let Some(name) = job.metadata.name.as_deref() {
                delete_job(&jobs, name, None).await?;
                removed += 1;
            }
        }
        remove_orphans::<Secret>(&self.api(), &lp, rush_id).await?;
        remove_orphans::<ConfigMap>(&self.api(), &lp, rush_id).await?;
        Ok(removed)
    }

    async fn create_worker(&self, spec: &WorkerSpec) -> Result<(String, String), SpawnError> {
        let name = job_name(spec);
        let jobs: Api<Job> = self.api();
        let job = create_fresh(&jobs, &job_body(spec, &self.settings, &name), &name).await?;
        let Some(owner) = owner_of(&job) else {
            let _ = delete_job(&jobs, &name, Some(0)).await;
            return Err(SpawnError::new(format!(
                "the API server returned Job {name} without a uid"
            )));
        };
        let uid = owner.uid.clone();
        let attached = async {
            let secrets: Api<Secret> = self.api();
            let secret = secret_body(spec, &name, owner.clone());
            create_fresh(&secrets, &secret, &secret_name(&name)).await?;
            let maps: Api<ConfigMap> = self.api();
            create_fresh(&maps, &config_map_body(spec, &name, owner), &ca_name(&name)).await?;
            let resume = serde_json::json!({ "spec": { "suspend": false } });
            jobs.patch(&name, &PatchParams::default(), &Patch::Merge(&resume))
                .await
                .map_err(|e| api_error(&format!("cannot start Job {name}"), &e))?;
            Ok::<_, SpawnError>(())
        };
        if let Err(e) = attached.await {
            if let Err(d) = delete_job(&jobs, &name, Some(0)).await {
                tracing::warn!(job = %name, error = %d, "cannot delete the half-created Job");
            }
            return Err(e);
        }
        Ok((name, uid))
    }

    /// Follows a Job until its worker ends; stops the Job when its pod cannot start.
    async fn wait_for_exit(&self, name: &str, uid: Option<String>) -> (ExitInfo, String) {
        let jobs: Api<Job> = self.api();
        let uid = match uid {
            Some(uid) => uid,
            None => loop {
                match jobs.get_opt(name).await {
                    Ok(Some(job)) => match job.metadata.uid {
                        Some(uid) => break uid,
                        None => return (ExitInfo::Vanished, "Job without a uid".into()),
                    },
                    Ok(None) => return (ExitInfo::Vanished, "Job not found".into()),
                    Err(e) => {
                        tracing::warn!(job = %name, error = %e, "cannot read the worker's Job; retrying");
                        tokio::time::sleep(RETRY_PAUSE).await;
                    }
                }
            },
        };
        let pods: Api<Pod> = self.api();
        let selector = format!("{JOB_UID_LABEL}={uid}");
        let config = watcher::Config::default().labels(&selector);
        let mut events = std::pin::pin!(watcher(pods.clone(), config).default_backoff());
        let mut check =
            tokio::time::interval_at(tokio::time::Instant::now() + JOB_CHECK, JOB_CHECK);
        let verdict = loop {
            tokio::select! {
                event = events.next() => match event {
                    Some(Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod))) => {
                        if let Some(v) = classify(&pod) {
                            break v;
                        }
                    }
                    Some(Ok(watcher::Event::Delete(pod))) => {
                        break classify(&pod).unwrap_or(Verdict {
                            info: ExitInfo::Vanished,
                            reason: "pod deleted".into(),
                            stuck: false,
                        });
                    }
                    Some(Ok(watcher::Event::Init | watcher::Event::InitDone)) => {}
                    Some(Err(e)) => {
                        tracing::warn!(job = %name, error = %e, "watch of the worker's pods failed; retrying");
                    }
                    None => break Verdict {
                        info: ExitInfo::Vanished,
                        reason: "watch ended".into(),
                        stuck: false,
                    },
                },
                _ = check.tick() => {
                    if let Some(v) = self.check_job(&jobs, &pods, name, &uid, &selector).await {
                        break v;
                    }
                }
            }
        };
        if verdict.stuck {
            tracing::warn!(job = %name, reason = %verdict.reason, "the worker's pod cannot start; stopping its Job");
            if let Err(e) = delete_job(&jobs, name, Some(0)).await {
                tracing::warn!(job = %name, error = %e, "cannot delete the worker's Job");
            }
        } else if verdict.reason.starts_with("Evicted") {
            tracing::warn!(job = %name, reason = %verdict.reason, "the worker's pod was evicted");
        } else {
            tracing::info!(job = %name, reason = %verdict.reason, exit = %verdict.info.describe(), "the worker's pod ended");
        }
        (verdict.info, verdict.reason)
    }

    /// The Job's own verdict when the pod watch has none: gone, or finished with no pod left
    /// to tell how.
    async fn check_job(
        &self,
        jobs: &Api<Job>,
        pods: &Api<Pod>,
        name: &str,
        uid: &str,
        selector: &str,
    ) -> Option<Verdict> {
        let job = match jobs.get_opt(name).await {
            Ok(job) => job,
            Err(e) => {
                tracing::debug!(job = %name, error = %e, "cannot read the worker's Job");
                return None;
            }
        };
        let Some(job) = job.filter(|j| j.metadata.uid.as_deref() == Some(uid)) else {
            return Some(Verdict {
                info: ExitInfo::Vanished,
                reason: "Job deleted".into(),
                stuck: false,
            });
        };
        let (complete, reason) = job_finished(&job)?;
        if let Ok(list) = pods.list(&ListParams::default().labels(selector)).await
            && let Some(v) = list.items.iter().find_map(classify)
        {
            return Some(v);
        }
        Some(Verdict {
            info: ExitInfo::Code(if complete { 0 } else { 1 }),
            reason,
            stuck: false,
        })
    }
}

impl Launcher for KubernetesLauncher {
    fn spawn(&self, spec: WorkerSpec, on_exit: ExitSink) -> BoxFuture<Result<Spawned, SpawnError>> {
        let this = self.clone();
        Box::pin(async move {
            spec.remote.check()?;
            let (name, uid) = this.create_worker(&spec).await?;
            tracing::info!(job = %name, namespace = %this.settings.namespace, image = %spec.container.image, "worker Job created");
            let watcher = this.clone();
            let job = name.clone();
            tokio::spawn(async move {
                let (info, _) = watcher.wait_for_exit(&job, Some(uid)).await;
                on_exit(info);
            });
            Ok(Spawned {
                pid: None,
                start_time: None,
                container_id: Some(name),
            })
        })
    }

    fn stop(&self, worker: Spawned, grace: Duration) -> BoxFuture<()> {
        let jobs: Api<Job> = self.api();
        Box::pin(async move {
            let Some(name) = worker.container_id else {
                return;
            };
            let secs = grace.as_secs().min(u64::from(u32::MAX)) as u32;
            if let Err(e) = delete_job(&jobs, &name, Some(secs)).await {
                tracing::warn!(job = %name, error = %e, "cannot delete the worker's Job");
            }
        })
    }

    fn is_alive(&self, worker: Spawned) -> BoxFuture<bool> {
        let jobs: Api<Job> = self.api();
        Box::pin(async move {
            let Some(name) = worker.container_id else {
                return false;
            };
            match jobs.get_opt(&name).await {
                Ok(Some(job)) => {
                    job.metadata.deletion_timestamp.is_none() && job_finished(&job).is_none()
                }
                Ok(None) => false,
                Err(e) => {
                    tracing::warn!(job = %name, error = %e, "cannot read the worker's Job");
                    false
                }
            }
        })
    }

    fn watch(&self, worker: Spawned, on_exit: ExitSink) {
        let this = self.clone();
        tokio::spawn(async move {
            let info = match worker.container_id {
                Some(name) => this.wait_for_exit(&name, None).await.0,
                None => ExitInfo::Vanished,
            };
            on_exit(info);
        });
    }

    fn discover(&self, rush_id: &str) -> BoxFuture<Vec<Discovered>> {
        let jobs: Api<Job> = self.api();
        let rush_id = rush_id.to_string();
        Box::pin(async move {
            let lp = ListParams::default().labels(&format!("{LABEL_RUSH}={}", rush_hash(&rush_id)));
            let list = match jobs.list(&lp).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list worker Jobs");
                    return Vec::new();
                }
            };
            list.items
                .into_iter()
                .filter(|j| {
                    of_rush(&j.metadata, &rush_id) && j.metadata.deletion_timestamp.is_none()
                })
                .filter_map(|job| {
                    let (worker_id, generation) = parse_labels(job.metadata.labels.as_ref()?)?;
                    Some(Discovered {
                        worker_id,
                        generation,
                        running: job_finished(&job).is_none(),
                        spawned: Spawned {
                            pid: None,
                            start_time: None,
                            container_id: job.metadata.name,
                        },
                    })
                })
                .collect()
        })
    }

    fn cleanup(&self, worker: Spawned) -> BoxFuture<()> {
        let jobs: Api<Job> = self.api();
        Box::pin(async move {
            if let Some(name) = worker.container_id
                && let Err(e) = delete_job(&jobs, &name, None).await
            {
                tracing::warn!(job = %name, error = %e, "cannot delete the worker's Job");
            }
        })
    }
}

// === Names and labels ===

/// The first 12 hex digits of the rush id's SHA-256: the `zerg.rush` label value and part of
/// every name.
pub fn rush_hash(rush_id: &str) -> String {
    Sha256::digest(rush_id.as_bytes())[..6]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The Job's name: `zerg-<rush hash>-w<N>-g<G>` (a DNS-1123 label).
pub fn job_name(spec: &WorkerSpec) -> String {
    format!(
        "zerg-{}-w{}-g{}",
        rush_hash(&spec.rush_id),
        spec.worker_id,
        spec.generation
    )
}

fn secret_name(job: &str) -> String {
    format!("{job}-token")
}

fn ca_name(job: &str) -> String {
    format!("{job}-ca")
}

fn labels(spec: &WorkerSpec) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_RUSH.to_string(), rush_hash(&spec.rush_id)),
        (LABEL_WORKER.to_string(), spec.worker_id.to_string()),
        (LABEL_GENERATION.to_string(), spec.generation.to_string()),
    ])
}

fn meta(spec: &WorkerSpec, name: String, owner: Option<OwnerReference>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        labels: Some(labels(spec)),
        annotations: Some(BTreeMap::from([
            (LABEL_RUSH.to_string(), spec.rush_id.clone()),
            (ANNOTATION_FEATURE.to_string(), spec.feature.clone()),
        ])),
        owner_references: owner.map(|o| vec![o]),
        ..ObjectMeta::default()
    }
}

/// Whether an object labelled with the rush's hash really is the rush's (the annotation
/// holds the full id; hashes can collide).
fn of_rush(meta: &ObjectMeta, rush_id: &str) -> bool {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(LABEL_RUSH))
        .is_none_or(|id| id == rush_id)
}

/// Worker slot and generation from the labels.
fn parse_labels(labels: &BTreeMap<String, String>) -> Option<(u32, u64)> {
    let worker = labels.get(LABEL_WORKER)?.parse().ok()?;
    let generation = labels.get(LABEL_GENERATION)?.parse().ok()?;
    Some((worker, generation))
}

fn owner_of(job: &Job) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: "batch/v1".into(),
        kind: "Job".into(),
        name: job.metadata.name.clone()?,
        uid: job.metadata.uid.clone()?,
        ..OwnerReference::default()
    })
}

// === Bodies ===

/// The worker's Job, created suspended.
fn job_body(spec: &WorkerSpec, settings: &KubernetesSettings, name: &str) -> Job {
    let uid = i64::from(image::WORKER_UID);
    let env = remote_env(spec)
        .into_iter()
        .map(|(name, value)| EnvVar {
            name,
            value: Some(value),
            ..EnvVar::default()
        })
        .collect();
    let mount = |name: &str, path: &str, read_only: bool| VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(read_only),
        ..VolumeMount::default()
    };
    let empty_dir = |name: &str| Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    };
    let container = Container {
        name: CONTAINER.into(),
        image: Some(spec.container.image.clone()),
        image_pull_policy: Some(settings.image_pull_policy.as_str().into()),
        command: Some(vec![image::AGENT_PATH.into()]),
        env: Some(env),
        resources: Some(resources(spec, settings)),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(uid),
            run_as_group: Some(uid),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(vec![
            mount("token", image::SECRET_DIR, true),
            mount("ca", CA_DIR, true),
            mount("workspace", image::WORKSPACE, false),
            mount("logs", image::LOG_MOUNT, false),
        ]),
        ..Container::default()
    };
    let pod = PodSpec {
        containers: vec![container],
        restart_policy: Some("Never".into()),
        service_account_name: settings.service_account.clone(),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        node_selector: (!settings.node_selector.is_empty()).then(|| settings.node_selector.clone()),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(uid),
            run_as_group: Some(uid),
            // The token file is root-owned; the group makes it readable to the worker.
            fs_group: Some(uid),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        }),
        volumes: Some(vec![
            Volume {
                name: "token".into(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(secret_name(name)),
                    // Owner root, group fsGroup: readable by the worker, by nobody else.
                    default_mode: Some(0o440),
                    ..SecretVolumeSource::default()
                }),
                ..Volume::default()
            },
            Volume {
                name: "ca".into(),
                config_map: Some(ConfigMapVolumeSource {
                    name: ca_name(name),
                    default_mode: Some(0o444),
                    ..ConfigMapVolumeSource::default()
                }),
                ..Volume::default()
            },
            empty_dir("workspace"),
            empty_dir("logs"),
        ]),
        ..PodSpec::default()
    };
    let template_meta = ObjectMeta {
        labels: Some(labels(spec)),
        ..ObjectMeta::default()
    };
    Job {
        metadata: meta(spec, name.into(), None),
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            suspend: Some(true),
            ttl_seconds_after_finished: Some(
                i32::try_from(settings.ttl_seconds_after_finished).unwrap_or(i32::MAX),
            ),
            template: PodTemplateSpec {
                metadata: Some(template_meta),
                spec: Some(pod),
            },
            ..JobSpec::default()
        }),
        ..Job::default()
    }
}

/// Requests and limits: the settings, with the rush's container limits as the default limits.
fn resources(spec: &WorkerSpec, settings: &KubernetesSettings) -> ResourceRequirements {
    let cpu_limit = settings.cpu_limit.clone().or_else(|| {
        (spec.container.cpus > 0.0)
            .then(|| format!("{}m", (spec.container.cpus * 1000.0).ceil() as i64))
    });
    let memory_limit = settings.memory_limit.clone().or_else(|| {
        (spec.container.memory_bytes > 0).then(|| spec.container.memory_bytes.to_string())
    });
    let quantities = |cpu: Option<String>, memory: Option<String>| {
        let map: BTreeMap<String, Quantity> = [("cpu", cpu), ("memory", memory)]
            .into_iter()
            .filter_map(|(k, v)| Some((k.to_string(), Quantity(v?))))
            .collect();
        (!map.is_empty()).then_some(map)
    };
    ResourceRequirements {
        requests: quantities(
            settings.cpu_request.clone(),
            settings.memory_request.clone(),
        ),
        limits: quantities(cpu_limit, memory_limit),
        ..ResourceRequirements::default()
    }
}

/// The Secret with the worker's token, owned by its Job.
fn secret_body(spec: &WorkerSpec, job: &str, owner: OwnerReference) -> Secret {
    Secret {
        metadata: meta(spec, secret_name(job), Some(owner)),
        type_: Some("Opaque".into()),
        immutable: Some(true),
        string_data: Some(BTreeMap::from([(
            TOKEN_KEY.to_string(),
            spec.token.expose().to_string(),
        )])),
        ..Secret::default()
    }
}

/// The ConfigMap with the plane's CA, owned by the worker's Job.
fn config_map_body(spec: &WorkerSpec, job: &str, owner: OwnerReference) -> ConfigMap {
    ConfigMap {
        metadata: meta(spec, ca_name(job), Some(owner)),
        immutable: Some(true),
        data: Some(BTreeMap::from([(
            CA_KEY.to_string(),
            spec.remote.ca_pem.clone(),
        )])),
        ..ConfigMap::default()
    }
}

// === Exits ===

/// How a worker's pod ended, as [`wait_for_exit`](KubernetesLauncher::wait_for_exit) sees it.
struct Verdict {
    info: ExitInfo,
    reason: String,
    /// The container never started and never will: the Job must be stopped.
    stuck: bool,
}

/// How a worker's pod ended, with the reason (`OOMKilled`, `Completed`, `ErrImagePull: …`,
/// `Evicted: …`); `None` while it has not. An eviction is [`ExitInfo::Vanished`]: the worker
/// did not fail, its node took it away.
pub fn pod_exit(pod: &Pod) -> Option<(ExitInfo, String)> {
    classify(pod).map(|v| (v.info, v.reason))
}

fn classify(pod: &Pod) -> Option<Verdict> {
    let status = pod.status.as_ref()?;
    let with_message = |reason: &str, message: Option<&String>| match message {
        Some(m) if !m.is_empty() => format!("{reason}: {m}"),
        _ => reason.to_string(),
    };
    let done = |info, reason| {
        Some(Verdict {
            info,
            reason,
            stuck: false,
        })
    };
    let phase = status.phase.as_deref().unwrap_or_default();
    if phase == "Failed" && status.reason.as_deref() == Some("Evicted") {
        return done(
            ExitInfo::Vanished,
            with_message("Evicted", status.message.as_ref()),
        );
    }
    let statuses = status.container_statuses.as_deref().unwrap_or_default();
    let state = statuses
        .iter()
        .find(|c| c.name == CONTAINER)
        .or_else(|| statuses.first())
        .and_then(|c| c.state.as_ref());
    if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
        let reason = t.reason.as_deref().unwrap_or("Terminated");
        let info = if reason == "OOMKilled" {
            ExitInfo::OomKilled
        } else {
            ExitInfo::Code(t.exit_code)
        };
        return done(info, with_message(reason, t.message.as_ref()));
    }
    if let Some(w) = state.and_then(|s| s.waiting.as_ref())
        && let Some(reason) = w.reason.as_deref()
        && FATAL_WAITING.contains(&reason)
    {
        return Some(Verdict {
            info: ExitInfo::Code(1),
            reason: with_message(reason, w.message.as_ref()),
            stuck: true,
        });
    }
    match phase {
        "Failed" => done(
            ExitInfo::Code(1),
            with_message(
                status.reason.as_deref().unwrap_or("Failed"),
                status.message.as_ref(),
            ),
        ),
        "Succeeded" => done(ExitInfo::Code(0), "Completed".into()),
        _ => None,
    }
}

/// `Some((complete, reason))` once the Job has finished.
fn job_finished(job: &Job) -> Option<(bool, String)> {
    job.status
        .as_ref()?
        .conditions
        .as_deref()?
        .iter()
        .find(|c| c.status == "True" && matches!(c.type_.as_str(), "Complete" | "Failed"))
        .map(|c| {
            (
                c.type_ == "Complete",
                c.reason.clone().unwrap_or_else(|| c.type_.clone()),
            )
        })
}

// === API calls ===

/// Deletes a Job and, first, its pods (`propagationPolicy: Foreground`); gone already is
/// fine. With a `grace`, the pods are also deleted with that grace period: the garbage
/// collector would give them their own (30 s by default).
async fn delete_job(jobs: &Api<Job>, name: &str, grace: Option<u32>) -> Result<(), kube::Error> {
    let mut dp = DeleteParams::foreground();
    if let Some(secs) = grace {
        dp = dp.grace_period(secs);
    }
    let job = match jobs.delete(name, &dp).await {
        Ok(deleted) => deleted.left(),
        Err(e) if is_status(&e, 404) => return Ok(()),
        Err(e) => return Err(e),
    };
    if let (Some(secs), Some(uid)) = (grace, job.and_then(|j| j.metadata.uid)) {
        let pods: Api<Pod> = Api::namespaced(
            jobs.clone().into_client(),
            jobs.namespace().unwrap_or("default"),
        );
        delete_pods(&pods, &uid, secs).await;
    }
    Ok(())
}

/// Deletes a Job's pods with a grace period; the garbage collector deletes whatever this
/// cannot.
async fn delete_pods(pods: &Api<Pod>, job_uid: &str, grace: u32) {
    let lp = ListParams::default().labels(&format!("{JOB_UID_LABEL}={job_uid}"));
    let list = match pods.list(&lp).await {
        Ok(list) => list.items,
        Err(e) => {
            tracing::debug!(error = %e, "cannot list the worker's pods");
            return;
        }
    };
    let dp = DeleteParams::default().grace_period(grace);
    for name in list.into_iter().filter_map(|p| p.metadata.name) {
        match pods.delete(&name, &dp).await {
            Ok(_) => {}
            Err(e) if is_status(&e, 404) => {}
            Err(e) => tracing::debug!(pod = %name, error = %e, "cannot delete the worker's pod"),
        }
    }
}

/// Deletes the rush's labelled objects that have no owner left to take them along.
async fn remove_orphans<K>(api: &Api<K>, lp: &ListParams, rush_id: &str) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    for obj in api.list(lp).await?.items {
        let meta = obj.meta();
        let owned = meta
            .owner_references
            .as_ref()
            .is_some_and(|o| !o.is_empty());
        if owned || !of_rush(meta, rush_id) {
            continue;
        }
        if let Some(name) = meta.name.as_deref() {
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if is_status(&e, 404) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Creates an object; a leftover of ours with the same name (an earlier attempt at the same
/// generation) is deleted first and the creation retried once.
async fn create_fresh<K>(api: &Api<K>, obj: &K, name: &str) -> Result<K, SpawnError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
    <K as Resource>::DynamicType: Default,
{
    let kind = K::kind(&Default::default()).to_string();
    let what = format!("{kind} {name}");
    match api.create(&PostParams::default(), obj).await {
        Ok(created) => return Ok(created),
        Err(e) if is_status(&e, 409) => {}
        Err(e) => return Err(api_error(&format!("cannot create {what}"), &e)),
    }
    let ours = |old: &K| {
        old.meta().labels.as_ref().and_then(|l| l.get(LABEL_RUSH))
            == obj.meta().labels.as_ref().and_then(|l| l.get(LABEL_RUSH))
    };
    match api.get_opt(name).await {
        Ok(Some(old)) if !ours(&old) => {
            return Err(SpawnError::new(format!(
                "{what} exists and zergd did not create it: delete or rename it"
            )));
        }
        Ok(_) => {}
        Err(e) => return Err(api_error(&format!("cannot read the existing {what}"), &e)),
    }
    tracing::warn!(object = %what, "deleting a leftover object with the same name");
    match api.delete(name, &DeleteParams::foreground()).await {
        Ok(_) => {}
        Err(e) if is_status(&e, 404) => {}
        Err(e) => return Err(api_error(&format!("cannot delete the leftover {what}"), &e)),
    }
    let deadline = tokio::time::Instant::now() + LEFTOVER_WAIT;
    while tokio::time::Instant::now() < deadline {
        match api.get_opt(name).await {
            Ok(None) => break,
            Ok(Some(_)) => tokio::time::sleep(Duration::from_millis(500)).await,
            Err(e) => return Err(api_error(&format!("cannot read the leftover {what}"), &e)),
        }
    }
    api.create(&PostParams::default(), obj)
        .await
        .map_err(|e| api_error(&format!("cannot create {what}"), &e))
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

fn api_error(what: &str, e: &kube::Error) -> SpawnError {
    let hint = match e {
        kube::Error::Api(s) if s.code == 403 => {
            " (zergd's service account lacks a permission: see the Role in docs/Remote-Workers.md)"
        }
        _ => "",
    };
    SpawnError::new(format!("{what}: {e}{hint}"))
}

#[cfg(test)]
mod tests;
