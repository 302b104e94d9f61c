//! The swarm launcher: its objects as pure functions, then the launcher against the machine's
//! real engine. Where `docker info` finds no engine the engine test is skipped, saying so, or
//! fails under `ZERG_REQUIRE_DOCKER=1`. An engine not in a swarm is made a single-node swarm on
//! loopback for the test, and leaves it again at the end.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bollard::models::{ContainerStatus, ExecConfig, TaskStatus};
use tokio_stream::StreamExt;

use super::*;
use crate::ContainerSpec;
use crate::RemoteSpec;
use crate::WorkerToken;
use crate::testkit::{import_image, remove_image, stage};
use zerg_proto::contract::env as worker_env;
use zerg_proto::testkit::{docker_cli as cli, docker_or_skip, docker_required, skip};

const CA: &str = "-----BEGIN CERTIFICATE-----\nnot a real one\n-----END CERTIFICATE-----\n";

fn spec(rush: &str, worker: u32, image: &str, network: &str) -> WorkerSpec {
    WorkerSpec {
        rush_id: rush.into(),
        feature: "feat".into(),
        worker_id: worker,
        generation: 1,
        repo: PathBuf::new(),
        worktree: PathBuf::new(),
        branch: format!("zerg/feat/worker-{worker}"),
        spec_dir: PathBuf::new(),
        state_dir: PathBuf::new(),
        log_dir: PathBuf::new(),
        socket: PathBuf::new(),
        token: WorkerToken::generate(),
        agent_bin: PathBuf::new(),
        container: ContainerSpec {
            image: image.into(),
            network: network.into(),
            memory_bytes: 256 << 20,
            cpus: 1.5,
            pids_limit: 64,
            host: None,
            log_max_bytes: 1 << 20,
        },
        env_passthrough: vec![],
        stop_grace: Duration::from_secs(10),
        sandbox: None,
        remote: RemoteSpec {
            plane_url: "https://127.0.0.1:7443".into(),
            ca_pem: CA.into(),
        },
    }
}

fn refs() -> ObjectRefs {
    ObjectRefs {
        secret_id: "sid".into(),
        secret_name: "s-token".into(),
        config_id: "cid".into(),
        config_name: "s-ca".into(),
    }
}

// === Pure ===

#[test]
fn names_are_per_rush_slot_and_generation() {
    let a = spec("rush-a", 2, "img", "");
    let name = service_name(&a);
    let rush = crate::token::hex(&Sha256::digest(b"rush-a"));
    assert_eq!(name, format!("zerg-{}-w2-g1", &rush[..12]));
    let mut b = a.clone();
    b.generation = 2;
    assert_ne!(service_name(&b), name);
    b.rush_id = "rush-b".into();
    b.generation = 1;
    assert_ne!(service_name(&b), name);
    let mut long = a;
    long.worker_id = u32::MAX;
    long.generation = u64::MAX;
    assert!(format!("{}{TOKEN_SUFFIX}", service_name(&long)).len() <= 63);
}

#[test]
fn the_service_is_one_task_never_restarted_with_the_token_only_in_a_secret() {
    let s = spec("rush-a", 2, "zerg-worker:test", "");
    let body = service_spec(&s, "svc", &refs(), Duration::from_secs(7));
    let mode = body.mode.as_ref().unwrap();
    assert_eq!(mode.replicated.as_ref().unwrap().replicas, Some(1));
    assert!(mode.replicated_job.is_none() && mode.global.is_none());
    let labels = body.labels.clone().unwrap();
    assert_eq!(labels.get(LABEL_RUSH).unwrap(), "rush-a");
    assert_eq!(parse_worker_labels(&labels), Some((2, 1)));
    let t = body.task_template.unwrap();
    assert_eq!(
        t.restart_policy.unwrap().condition,
        Some(TaskSpecRestartPolicyConditionEnum::NONE)
    );
    let net: Vec<_> = t.networks.unwrap().into_iter().map(|n| n.target).collect();
    assert_eq!(net, vec![Some("host".to_string())]);
    let limits = t.resources.unwrap().limits.unwrap();
    assert_eq!(limits.memory_bytes, Some(256 << 20));
    assert_eq!(limits.nano_cpus, Some(1_500_000_000));
    assert_eq!(limits.pids, Some(64));
    let c = t.container_spec.unwrap();
    assert_eq!(c.labels.as_ref(), Some(&labels));
    assert_eq!(c.image.as_deref(), Some("zerg-worker:test"));
    assert_eq!(c.command, Some(vec![image::AGENT_PATH.to_string()]));
    assert_eq!(c.user.as_deref(), Some("10001:10001"));
    assert_eq!(c.stop_grace_period, Some(7_000_000_000));
    assert_eq!(c.capability_drop, Some(vec!["ALL".to_string()]));
    let env = c.env.unwrap();
    assert!(
        env.iter().all(|e| !e.contains(s.token.expose())),
        "the token is in no variable"
    );
    let token_file = format!("{}/{}", image::SECRET_DIR, image::TOKEN_FILE_NAME);
    assert!(env.contains(&format!("{}={token_file}", worker_env::WORKER_TOKEN_FILE)));
    assert!(env.contains(&format!(
        "{}={}",
        worker_env::PLANE_CA,
        image::REMOTE_CA_PATH
    )));
    let secret = &c.secrets.unwrap()[0];
    assert_eq!(secret.secret_id.as_deref(), Some("sid"));
    let file = secret.file.as_ref().unwrap();
    assert_eq!(
        Path::new(image::SECRET_DIR).join(file.name.as_deref().unwrap()),
        Path::new(&token_file)
    );
    assert_eq!(
        (file.uid.as_deref(), file.gid.as_deref(), file.mode),
        (Some("10001"), Some("10001"), Some(0o400))
    );
    let config = &c.configs.unwrap()[0];
    assert_eq!(config.config_id.as_deref(), Some("cid"));
    assert_eq!(
        config.file.as_ref().unwrap().name.as_deref(),
        Some(image::REMOTE_CA_PATH)
    );
}

#[test]
fn the_network_is_host_unless_configured() {
    let net = |n: &str| {
        service_spec(&spec("r", 1, "i", n), "svc", &refs(), DEFAULT_STOP_GRACE)
            .task_template
            .unwrap()
            .networks
            .unwrap()[0]
            .target
            .clone()
            .unwrap()
    };
    assert_eq!(net(""), "host");
    assert_eq!(net("none"), "host");
    assert_eq!(net("zerg-overlay"), "zerg-overlay");
}

fn task(state: TaskState, code: Option<i64>, err: &str) -> Task {
    Task {
        status: Some(TaskStatus {
            state: Some(state),
            err: (!err.is_empty()).then(|| err.to_string()),
            container_status: Some(ContainerStatus {
                exit_code: code,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn task_states_map_to_exits() {
    let exit = |t: Task| task_exit("svc", &t);
    for s in [
        TaskState::NEW,
        TaskState::PENDING,
        TaskState::PREPARING,
        TaskState::STARTING,
        TaskState::RUNNING,
    ] {
        assert_eq!(exit(task(s, None, "")), None, "{s}");
        assert!(task_running(&task(s, None, "")));
    }
    assert_eq!(
        exit(task(TaskState::COMPLETE, Some(0), "")),
        Some(ExitInfo::Code(0))
    );
    assert_eq!(
        exit(task(TaskState::FAILED, Some(3), "task: non-zero exit (3)")),
        Some(ExitInfo::Code(3))
    );
    assert_eq!(
        exit(task(
            TaskState::FAILED,
            Some(137),
            "task: non-zero exit (137)"
        )),
        Some(ExitInfo::Code(137))
    );
    assert_eq!(
        exit(task(
            TaskState::FAILED,
            Some(137),
            "task: non-zero exit (137): OOM killed"
        )),
        Some(ExitInfo::OomKilled)
    );
    assert_eq!(
        exit(task(TaskState::FAILED, None, "starting container failed")),
        Some(ExitInfo::Code(1))
    );
    assert_eq!(
        exit(task(TaskState::REJECTED, None, "No such image: x")),
        Some(ExitInfo::Code(1))
    );
    for s in [TaskState::SHUTDOWN, TaskState::ORPHANED, TaskState::REMOVE] {
        assert_eq!(
            exit(task(s, Some(143), "")),
            Some(ExitInfo::Vanished),
            "{s}"
        );
        assert!(!task_running(&task(s, None, "")));
    }
    assert_eq!(exit(Task::default()), None);
}

#[test]
fn a_rejection_for_a_missing_image_names_the_image() {
    let e = rejection(
        &task(TaskState::REJECTED, None, "No such image: zerg-worker:nope"),
        "zerg-worker:nope",
    );
    assert!(
        e.message.starts_with("image zerg-worker:nope not found"),
        "{e}"
    );
    let e = rejection(
        &task(TaskState::REJECTED, None, "invalid mount config"),
        "img",
    );
    assert!(e.message.contains("invalid mount config"), "{e}");
}

// === Against the real engine ===

const TEST_IMAGE: &str = "zerg-worker:swarm-test";

/// The fake agent: worker 1 exits 3, the others sleep until stopped.
const FAKE_AGENT: &str =
    "#!/bin/sh\nif [ \"$ZERG_WORKER_ID\" = 1 ]; then exit 3; fi\nexec sleep 1000\n";

/// A single-node swarm for the test: left again on drop if the test created it, after
/// removing whatever of the test's rush is left if the test failed half-way.
struct SwarmGuard {
    rush: String,
    _swarm: zerg_proto::testkit::SwarmSession,
}

impl SwarmGuard {
    fn swarm_state() -> String {
        cli(&["info", "--format", "{{.Swarm.LocalNodeState}}"]).unwrap_or_default()
    }

    /// Takes the test swarm's lock; checks, while the engine is not a swarm yet, that the
    /// launcher refuses to connect and says what to do; then makes it one.
    async fn ensure(rush: &str) -> Result<Self, String> {
        let mut swarm = zerg_proto::testkit::SwarmSession::lock()?;
        if Self::swarm_state() != "active" {
            let err = SwarmLauncher::connect()
                .await
                .err()
                .ok_or("connected without a swarm")?;
            assert!(err.message.contains("docker swarm init"), "{err}");
        }
        swarm.ensure_active()?;
        Ok(Self {
            rush: rush.to_string(),
            _swarm: swarm,
        })
    }
}

impl Drop for SwarmGuard {
    fn drop(&mut self) {
        let label = format!("label={LABEL_RUSH}={}", self.rush);
        for kind in ["service", "secret", "config"] {
            let ids = cli(&[kind, "ls", "-q", "--filter", &label]).unwrap_or_default();
            for id in ids.split_whitespace() {
                let _ = cli(&[kind, "rm", id]);
            }
        }
        let _ = cli(&["image", "rm", "--force", TEST_IMAGE]);
    }
}

/// A minimal image (sh, sleep, cat, the fake agent) from the host's own binaries.
async fn build_test_image(docker: &Docker) {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    for bin in ["/bin/sh", "/bin/sleep", "/bin/cat"] {
        stage(r, Path::new(bin));
    }
    let agent = r.join(image::AGENT_PATH.trim_start_matches('/'));
    fs::create_dir_all(agent.parent().unwrap()).unwrap();
    fs::write(&agent, FAKE_AGENT).unwrap();
    fs::set_permissions(&agent, fs::Permissions::from_mode(0o755)).unwrap();
    fs::create_dir_all(r.join("tmp")).unwrap();
    fs::set_permissions(r.join("tmp"), fs::Permissions::from_mode(0o1777)).unwrap();
    import_image(docker, r, TEST_IMAGE).await;
}

/// An exit sink that sends the exit on a channel and counts its calls.
fn sink(calls: &Arc<AtomicUsize>) -> (ExitSink, tokio::sync::oneshot::Receiver<ExitInfo>) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let calls = calls.clone();
    let sink: ExitSink = Box::new(move |i| {
        calls.fetch_add(1, Ordering::SeqCst);
        let _ = tx.send(i);
    });
    (sink, rx)
}

async fn exit_of(rx: tokio::sync::oneshot::Receiver<ExitInfo>) -> ExitInfo {
    tokio::time::timeout(Duration::from_secs(60), rx)
        .await
        .expect("no exit within 60 s")
        .unwrap()
}

/// Names of the services, secrets and configs that carry every label of `labels` (the engine
/// ANDs label filters). A worker's label alone is not enough: another rush running on the same
/// engine at the same time has a worker 1 too.
async fn labelled(docker: &Docker, labels: &[&str]) -> Vec<String> {
    let filters = HashMap::from([(
        "label",
        labels.iter().map(|l| l.to_string()).collect::<Vec<_>>(),
    )]);
    let mut out: Vec<String> = Vec::new();
    let services = docker
        .list_services(Some(
            ListServicesOptionsBuilder::new().filters(&filters).build(),
        ))
        .await
        .unwrap();
    out.extend(services.into_iter().filter_map(|s| s.spec?.name));
    let secrets = docker
        .list_secrets(Some(
            ListSecretsOptionsBuilder::new().filters(&filters).build(),
        ))
        .await
        .unwrap();
    out.extend(secrets.into_iter().filter_map(|s| s.spec?.name));
    let configs = docker
        .list_configs(Some(
            ListConfigsOptionsBuilder::new().filters(&filters).build(),
        ))
        .await
        .unwrap();
    out.extend(configs.into_iter().filter_map(|c| c.spec?.name));
    out.sort();
    out
}

/// Runs `cmd` in a container (as its configured user) and returns its stdout.
async fn exec(docker: &Docker, container: &str, cmd: &[&str]) -> String {
    let created = docker
        .create_exec(
            container,
            ExecConfig {
                cmd: Some(cmd.iter().map(|s| s.to_string()).collect()),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut out = String::new();
    if let bollard::exec::StartExecResults::Attached { mut output, .. } =
        docker.start_exec(&created.id, None).await.unwrap()
    {
        while let Some(Ok(chunk)) = output.next().await {
            if let bollard::container::LogOutput::StdOut { message } = chunk {
                out.push_str(&String::from_utf8_lossy(&message));
            }
        }
    }
    out
}

/// The container of a service's running task, once it runs.
async fn running_container(launcher: &SwarmLauncher, service: &str) -> String {
    for _ in 0..120 {
        if let Ok(Some(t)) = launcher.task_of(service).await
            && task_state(&t) == Some(TaskState::RUNNING)
            && let Some(id) = t
                .status
                .and_then(|s| s.container_status)
                .and_then(|c| c.container_id)
        {
            return id;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("the task of service {service} never ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_swarm_lifecycle() {
    if !docker_or_skip() {
        return;
    }
    let rush = format!("swarm-test-{}", std::process::id());
    let _swarm = match SwarmGuard::ensure(&rush).await {
        Ok(g) => g,
        Err(e) => {
            assert!(
                !docker_required(),
                "a Docker engine is required here, but docker swarm init failed: {e}"
            );
            skip(&format!("cannot make the engine a swarm: {e}"));
            return;
        }
    };
    let launcher = SwarmLauncher::connect_with_grace(Duration::from_secs(5))
        .await
        .expect("the engine is in a swarm, so the launcher connects");
    let docker = launcher.docker.clone();
    build_test_image(&docker).await;
    let rush_label = format!("{LABEL_RUSH}={rush}");
    let calls = Arc::new(AtomicUsize::new(0));

    // A missing image is the spawn's error, naming the image, and leaves nothing behind.
    let bad = spec(&rush, 9, "zerg-worker:does-not-exist", "");
    let err = launcher.spawn(bad, Box::new(|_| {})).await.unwrap_err();
    assert!(
        err.message
            .starts_with("image zerg-worker:does-not-exist not found"),
        "{err}"
    );
    assert!(labelled(&docker, &[&rush_label]).await.is_empty());

    // Worker 1 exits 3: reported once, then its service, secret and config are removed.
    let (on_exit, rx) = sink(&calls);
    let sp1 = launcher
        .spawn(spec(&rush, 1, TEST_IMAGE, ""), on_exit)
        .await
        .unwrap();
    assert_eq!(exit_of(rx).await, ExitInfo::Code(3));
    let w1 = format!("{LABEL_WORKER}=1");
    for _ in 0..100 {
        if labelled(&docker, &[&rush_label, &w1]).await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(labelled(&docker, &[&rush_label, &w1]).await.is_empty());
    assert!(!launcher.is_alive(sp1).await);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // Worker 2 sleeps: its token is a file only its user reads, and in no variable; a fresh
    // launcher discovers it by label; a stop reports its exit and removes everything.
    let s2 = spec(&rush, 2, TEST_IMAGE, "");
    let token = s2.token.expose().to_string();
    let (on_exit, rx) = sink(&calls);
    let sp2 = launcher.spawn(s2.clone(), on_exit).await.unwrap();
    let id2 = sp2.container_id.clone().unwrap();
    let container = running_container(&launcher, &id2).await;
    assert!(launcher.is_alive(sp2.clone()).await);
    let token_file = format!("{}/{}", image::SECRET_DIR, image::TOKEN_FILE_NAME);
    assert_eq!(
        exec(&docker, &container, &["cat", &token_file]).await,
        token
    );
    assert_eq!(
        exec(&docker, &container, &["cat", image::REMOTE_CA_PATH]).await,
        CA
    );
    let service = docker
        .inspect_service(&id2, None::<InspectServiceOptions>)
        .await
        .unwrap();
    let c = service
        .spec
        .unwrap()
        .task_template
        .unwrap()
        .container_spec
        .unwrap();
    let env = c.env.unwrap_or_default();
    assert!(env.iter().all(|e| !e.contains(&token)), "{env:?}");
    assert!(env.contains(&format!("{}={token_file}", worker_env::WORKER_TOKEN_FILE)));
    let inspected = docker
        .inspect_container(
            &container,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await
        .unwrap();
    let config = inspected.config.unwrap();
    assert_eq!(config.user.as_deref(), Some("10001:10001"));
    assert!(
        config
            .env
            .unwrap_or_default()
            .iter()
            .all(|e| !e.contains(&token))
    );
    let container_labels = config.labels.unwrap_or_default();
    assert_eq!(parse_worker_labels(&container_labels), Some((2, 1)));

    let fresh = SwarmLauncher::connect().await.unwrap();
    let found = fresh.discover(&rush).await;
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        (found[0].worker_id, found[0].generation, found[0].running),
        (2, 1, true)
    );
    assert_eq!(found[0].spawned.container_id, sp2.container_id);

    fresh.stop(sp2.clone(), Duration::from_secs(5)).await;
    let exit2 = exit_of(rx).await;
    assert!(
        matches!(exit2, ExitInfo::Vanished | ExitInfo::Code(143)),
        "{exit2:?}"
    );
    assert!(!launcher.is_alive(sp2).await);
    // The stop returned once the worker was down.
    let after = docker
        .inspect_container(
            &container,
            None::<bollard::query_parameters::InspectContainerOptions>,
        )
        .await;
    assert!(
        after
            .map(|c| !c.state.and_then(|s| s.running).unwrap_or(false))
            .unwrap_or(true),
        "the stopped worker's container still runs"
    );
    assert!(
        labelled(&docker, &[&rush_label, &format!("{LABEL_WORKER}=2")])
            .await
            .is_empty()
    );
    assert!(fresh.discover(&rush).await.is_empty());

    // Worker 3, adopted by a watch, and whatever else the rush has, go with remove_rush.
    let (on_exit, rx) = sink(&calls);
    let sp3 = launcher
        .spawn(spec(&rush, 3, TEST_IMAGE, ""), on_exit)
        .await
        .unwrap();
    let (on_watch, watched) = sink(&calls);
    fresh.watch(sp3, on_watch);
    // An object of the rush no spawn made is removed too.
    docker
        .create_secret(SecretSpec {
            name: Some(format!("zerg-stray-{}", std::process::id())),
            labels: Some(HashMap::from([(LABEL_RUSH.to_string(), rush.clone())])),
            data: Some(BASE64.encode("x")),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(labelled(&docker, &[&rush_label]).await.len(), 4);
    launcher.remove_rush(&rush).await;
    assert!(labelled(&docker, &[&rush_label]).await.is_empty());
    assert_eq!(exit_of(rx).await, ExitInfo::Vanished);
    assert_eq!(exit_of(watched).await, ExitInfo::Vanished);
    assert_eq!(calls.load(Ordering::SeqCst), 4);

    // The containers go too (the agent of each node removes them once they are down).
    let rush_filter = HashMap::from([("label", vec![rush_label.clone()])]);
    let list = bollard::query_parameters::ListContainersOptionsBuilder::new()
        .all(true)
        .filters(&rush_filter)
        .build();
    let mut left = Vec::new();
    for _ in 0..100 {
        left = docker.list_containers(Some(list.clone())).await.unwrap();
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(left.is_empty(), "{left:?}");

    remove_image(&docker, TEST_IMAGE).await;
}
