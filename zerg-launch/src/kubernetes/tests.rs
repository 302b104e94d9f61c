//! The launcher against a mocked API server: the requests it sends, and how it reads pods.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use http::{Request, Response};
use kube::client::Body;
use serde_json::{Value, json};

use super::*;
use crate::ContainerSpec;

/// One request the mocked API server received.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    query: String,
    body: Value,
}

impl Seen {
    fn is(&self, method: &str, path: &str) -> bool {
        self.method == method && self.path == path
    }
}

/// How the mocked API server answers one request.
enum Reply {
    Json(u16, Value),
    Raw(u16, String),
    /// No answer ever (a watch that stays open).
    Hold,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// A client whose API server is `answer`, and the log of what it received.
fn mock(mut answer: impl FnMut(&Seen) -> Reply + Send + 'static) -> (Client, Log) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let log: Log = Arc::default();
    let seen = log.clone();
    tokio::spawn(async move {
        let mut handle = std::pin::pin!(handle);
        let mut held = Vec::new();
        while let Some((request, send)) = handle.next_request().await {
            let method = request.method().to_string();
            let path = request.uri().path().to_string();
            let query = request.uri().query().unwrap_or_default().to_string();
            let bytes = request.into_body().collect_bytes().await.unwrap();
            let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let s = Seen {
                method,
                path,
                query,
                body,
            };
            seen.lock().unwrap().push(s.clone());
            let (code, text) = match answer(&s) {
                Reply::Json(code, v) => (code, v.to_string()),
                Reply::Raw(code, text) => (code, text),
                Reply::Hold => {
                    held.push(send);
                    continue;
                }
            };
            let response = Response::builder()
                .status(code)
                .body(Body::from(text.into_bytes()))
                .unwrap();
            send.send_response(response);
        }
    });
    (Client::new(service, "default"), log)
}

/// Waits until the log holds a request matching `what`.
async fn seen(log: &Log, what: impl Fn(&Seen) -> bool) -> Seen {
    for _ in 0..200 {
        if let Some(s) = log.lock().unwrap().iter().find(|s| what(s)) {
            return s.clone();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("request never sent; seen: {:#?}", log.lock().unwrap());
}

fn not_found() -> Reply {
    Reply::Json(
        404,
        json!({"apiVersion": "v1", "kind": "Status", "status": "Failure",
               "reason": "NotFound", "code": 404, "message": "not found"}),
    )
}

fn pod_list(items: Vec<Value>) -> Reply {
    Reply::Json(
        200,
        json!({"apiVersion": "v1", "kind": "PodList",
               "metadata": {"resourceVersion": "1"}, "items": items}),
    )
}

fn spec() -> WorkerSpec {
    WorkerSpec {
        rush_id: "rush-0001".into(),
        feature: "feat".into(),
        worker_id: 2,
        generation: 5,
        repo: "/repo".into(),
        worktree: "/repo/.zerg/worktrees/w2".into(),
        branch: "zerg/feat/worker-2".into(),
        spec_dir: "/repo/.gsd/specs/feat".into(),
        state_dir: "/repo/.zerg/state".into(),
        log_dir: "/repo/.zerg/logs".into(),
        socket: "/run/zerg.sock".into(),
        token: crate::WorkerToken::generate(),
        agent_bin: image::AGENT_PATH.into(),
        container: ContainerSpec {
            image: "registry.example/zerg-worker:1".into(),
            memory_bytes: 256 << 20,
            cpus: 1.5,
            ..ContainerSpec::default()
        },
        env_passthrough: vec![],
        stop_grace: std::time::Duration::from_secs(10),
        sandbox: None,
        remote: crate::RemoteSpec {
            plane_url: "https://zergd.example:7443".into(),
            ca_pem: "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n".into(),
        },
    }
}

fn pod(status: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "resourceVersion": "2"},
        "status": status,
    }))
    .unwrap()
}

fn terminated(code: i32, reason: &str) -> Value {
    json!({"phase": if code == 0 { "Succeeded" } else { "Failed" },
           "containerStatuses": [{"name": "worker", "image": "i", "imageID": "", "ready": false,
             "restartCount": 0,
             "state": {"terminated": {"exitCode": code, "reason": reason}}}]})
}

fn waiting(reason: &str, message: &str) -> Value {
    json!({"phase": "Pending",
           "containerStatuses": [{"name": "worker", "image": "i", "imageID": "", "ready": false,
             "restartCount": 0,
             "state": {"waiting": {"reason": reason, "message": message}}}]})
}

fn running() -> Value {
    json!({"phase": "Running",
           "containerStatuses": [{"name": "worker", "image": "i", "imageID": "", "ready": true,
             "restartCount": 0, "state": {"running": {}}}]})
}

#[test]
fn job_names_are_dns_labels() {
    let name = job_name(&spec());
    assert_eq!(name, format!("zerg-{}-w2-g5", rush_hash("rush-0001")));
    assert_eq!(rush_hash("rush-0001").len(), 12);
    assert!(name.len() <= 63);
    assert!(
        name.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    );
}

#[test]
fn pod_exits_map_to_worker_exits() {
    let exit = |s: Value| pod_exit(&pod(s)).map(|(info, _)| info);
    assert_eq!(exit(terminated(0, "Completed")), Some(ExitInfo::Code(0)));
    assert_eq!(exit(terminated(3, "Error")), Some(ExitInfo::Code(3)));
    assert_eq!(exit(terminated(137, "Error")), Some(ExitInfo::Code(137)));
    assert_eq!(
        exit(terminated(137, "OOMKilled")),
        Some(ExitInfo::OomKilled)
    );

    let (info, reason) = pod_exit(&pod(waiting("ErrImagePull", "no such image"))).unwrap();
    assert_eq!(info, ExitInfo::Code(1));
    assert_eq!(reason, "ErrImagePull: no such image");
    assert!(classify(&pod(waiting("ErrImagePull", "x"))).unwrap().stuck);
    let (info, reason) = pod_exit(&pod(waiting(
        "CreateContainerConfigError",
        "secret not found",
    )))
    .unwrap();
    assert_eq!(info, ExitInfo::Code(1));
    assert!(reason.starts_with("CreateContainerConfigError"));
    // Still starting: not an exit.
    assert_eq!(exit(waiting("ContainerCreating", "")), None);

    let evicted = json!({"phase": "Failed", "reason": "Evicted",
                         "message": "The node was low on resource: memory."});
    let (info, reason) = pod_exit(&pod(evicted)).unwrap();
    assert_eq!(info, ExitInfo::Vanished);
    assert!(reason.starts_with("Evicted: The node was low"));
    // An evicted pod whose container was killed is still an eviction.
    let mut killed = terminated(137, "Error");
    killed["reason"] = json!("Evicted");
    assert_eq!(exit(killed), Some(ExitInfo::Vanished));

    assert_eq!(exit(running()), None);
    assert_eq!(exit(json!({"phase": "Pending"})), None);
    assert_eq!(pod_exit(&Pod::default()), None);
    assert_eq!(
        exit(json!({"phase": "Failed", "reason": "DeadlineExceeded"})),
        Some(ExitInfo::Code(1))
    );
}

/// An API server that creates whatever it is sent (a Job gets the uid `uid-1`), starts Jobs,
/// and has no pod yet.
fn accepting(s: &Seen) -> Reply {
    let jobs = "/apis/batch/v1/namespaces/default/jobs";
    if s.is("POST", jobs) {
        let mut job = s.body.clone();
        job["metadata"]["uid"] = json!("uid-1");
        job["metadata"]["namespace"] = json!("default");
        Reply::Json(201, job)
    } else if s.method == "POST" {
        Reply::Json(201, s.body.clone())
    } else if s.method == "PATCH" {
        Reply::Json(
            200,
            json!({"apiVersion": "batch/v1", "kind": "Job",
                   "metadata": {"name": "j", "uid": "uid-1"}}),
        )
    } else if s.path.ends_with("/pods") && !s.query.contains("watch=true") {
        pod_list(vec![])
    } else {
        Reply::Hold
    }
}

#[tokio::test]
async fn spawn_creates_the_job_then_its_owned_secret_and_config_map() {
    let (client, log) = mock(accepting);
    let settings = KubernetesSettings {
        service_account: Some("zerg-worker".into()),
        node_selector: BTreeMap::from([("pool".into(), "agents".into())]),
        cpu_request: Some("500m".into()),
        memory_request: Some("1Gi".into()),
        ..KubernetesSettings::default()
    };
    let launcher = KubernetesLauncher::new(client, settings);
    let spec = spec();
    let token = spec.token.expose().to_string();
    let name = job_name(&spec);
    let exits = Arc::new(AtomicUsize::new(0));
    let counted = exits.clone();
    let spawned = launcher
        .spawn(
            spec,
            Box::new(move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
            }),
        )
        .await
        .unwrap();
    assert_eq!(spawned.container_id.as_deref(), Some(name.as_str()));
    assert_eq!(spawned.pid, None);

    let watch = seen(&log, |s| s.path.ends_with("/pods")).await;
    assert!(
        watch.query.contains("controller-uid%3Duid-1"),
        "{}",
        watch.query
    );
    let log = log.lock().unwrap().clone();
    let methods: Vec<_> = log
        .iter()
        .map(|s| format!("{} {}", s.method, s.path))
        .collect();
    assert_eq!(
        methods[..4],
        [
            "POST /apis/batch/v1/namespaces/default/jobs".to_string(),
            "POST /api/v1/namespaces/default/secrets".to_string(),
            "POST /api/v1/namespaces/default/configmaps".to_string(),
            format!("PATCH /apis/batch/v1/namespaces/default/jobs/{name}"),
        ]
    );

    // The Job.
    let job = &log[0].body;
    assert_eq!(job["metadata"]["name"], name.as_str());
    assert_eq!(
        job["metadata"]["labels"]["zerg.rush"],
        rush_hash("rush-0001")
    );
    assert_eq!(job["metadata"]["labels"]["zerg.worker"], "2");
    assert_eq!(job["metadata"]["labels"]["zerg.generation"], "5");
    assert_eq!(job["metadata"]["annotations"]["zerg.rush"], "rush-0001");
    assert_eq!(job["spec"]["backoffLimit"], 0);
    assert_eq!(job["spec"]["suspend"], true);
    assert_eq!(job["spec"]["ttlSecondsAfterFinished"], 3600);
    let template = &job["spec"]["template"];
    assert_eq!(template["metadata"]["labels"]["zerg.worker"], "2");
    let pod = &template["spec"];
    assert_eq!(pod["restartPolicy"], "Never");
    assert_eq!(pod["serviceAccountName"], "zerg-worker");
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["nodeSelector"]["pool"], "agents");
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["fsGroup"], image::WORKER_UID);
    let c = &pod["containers"][0];
    assert_eq!(c["name"], "worker");
    assert_eq!(c["image"], "registry.example/zerg-worker:1");
    assert_eq!(c["imagePullPolicy"], "IfNotPresent");
    assert_eq!(c["command"], json!([image::AGENT_PATH]));
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["runAsUser"], image::WORKER_UID);
    assert_eq!(sc["runAsGroup"], image::WORKER_UID);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(
        c["resources"],
        json!({"requests": {"cpu": "500m", "memory": "1Gi"},
               "limits": {"cpu": "1500m", "memory": (256 << 20).to_string()}})
    );
    let env: BTreeMap<String, String> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["value"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    use zerg_proto::contract::env as names;
    assert_eq!(env[names::WORKER_TOKEN_FILE], "/run/secrets/zerg-token");
    assert_eq!(env[names::PLANE_CA], image::REMOTE_CA_PATH);
    assert_eq!(env[names::PLANE_URL], "https://zergd.example:7443");
    let mounts: BTreeMap<&str, &str> = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["name"].as_str().unwrap(),
                m["mountPath"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(mounts["token"], image::SECRET_DIR);
    assert_eq!(mounts["ca"], "/zerg/remote");
    let volumes = pod["volumes"].as_array().unwrap();
    let token_volume = volumes.iter().find(|v| v["name"] == "token").unwrap();
    assert_eq!(
        token_volume["secret"]["secretName"],
        format!("{name}-token")
    );
    assert_eq!(token_volume["secret"]["defaultMode"], 0o440);
    let ca_volume = volumes.iter().find(|v| v["name"] == "ca").unwrap();
    assert_eq!(ca_volume["configMap"]["name"], format!("{name}-ca"));

    // The Secret and the ConfigMap, owned by the Job the server created.
    let owner = json!([{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": "uid-1"}]);
    let secret = &log[1].body;
    assert_eq!(secret["metadata"]["ownerReferences"], owner);
    assert_eq!(secret["stringData"]["zerg-token"], token.as_str());
    assert_eq!(
        secret["metadata"]["labels"]["zerg.rush"],
        rush_hash("rush-0001")
    );
    let map = &log[2].body;
    assert_eq!(map["metadata"]["ownerReferences"], owner);
    assert_eq!(map["data"]["ca.pem"], spec_ca());
    assert_eq!(log[3].body, json!({"spec": {"suspend": false}}));

    // The token is in the Secret and nowhere else.
    for (i, s) in log.iter().enumerate() {
        assert_eq!(
            s.body.to_string().contains(&token),
            i == 1,
            "{} {}",
            s.method,
            s.path
        );
    }
    assert_eq!(exits.load(Ordering::SeqCst), 0);
}

fn spec_ca() -> String {
    spec().remote.ca_pem
}

#[tokio::test]
async fn spawn_deletes_the_job_when_its_secret_cannot_be_created() {
    let (client, log) = mock(|s| {
        if s.is("POST", "/apis/batch/v1/namespaces/default/jobs") {
            let mut job = s.body.clone();
            job["metadata"]["uid"] = json!("uid-1");
            Reply::Json(201, job)
        } else if s.method == "POST" {
            Reply::Json(
                403,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                       "reason": "Forbidden", "code": 403, "message": "secrets is forbidden"}),
            )
        } else {
            Reply::Json(
                200,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
            )
        }
    });
    let launcher = KubernetesLauncher::new(client, KubernetesSettings::default());
    let err = launcher.spawn(spec(), Box::new(|_| {})).await.unwrap_err();
    assert!(err.message.contains("Secret"), "{}", err.message);
    assert!(err.message.contains("permission"), "{}", err.message);
    let del = seen(&log, |s| s.method == "DELETE").await;
    assert_eq!(
        del.path,
        format!(
            "/apis/batch/v1/namespaces/default/jobs/{}",
            job_name(&spec())
        )
    );
    assert_eq!(del.body["propagationPolicy"], "Foreground");
}

#[tokio::test]
async fn stop_deletes_the_job_in_the_foreground_and_its_pods_with_the_grace() {
    let (client, log) = mock(|s| {
        if s.is("DELETE", "/apis/batch/v1/namespaces/default/jobs/job-a") {
            Reply::Json(
                200,
                json!({"apiVersion": "batch/v1", "kind": "Job",
                                    "metadata": {"name": "job-a", "uid": "uid-a"}}),
            )
        } else if s.is("GET", "/api/v1/namespaces/default/pods") {
            let mut p = serde_json::to_value(pod(running())).unwrap();
            p["metadata"]["name"] = json!("job-a-xyz");
            pod_list(vec![p])
        } else {
            Reply::Json(
                200,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
            )
        }
    });
    let launcher = KubernetesLauncher::new(client, KubernetesSettings::default());
    let worker = Spawned {
        container_id: Some("job-a".into()),
        ..Spawned::default()
    };
    launcher.stop(worker, Duration::from_secs(7)).await;
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 3, "{log:#?}");
    assert_eq!(log[0].body["propagationPolicy"], "Foreground");
    assert_eq!(log[0].body["gracePeriodSeconds"], 7);
    assert!(
        log[1].query.contains("controller-uid%3Duid-a"),
        "{}",
        log[1].query
    );
    assert!(log[2].is("DELETE", "/api/v1/namespaces/default/pods/job-a-xyz"));
    assert_eq!(log[2].body["gracePeriodSeconds"], 7);
}

#[tokio::test]
async fn stop_and_cleanup_of_a_job_already_gone_are_quiet() {
    let (client, log) = mock(|_| not_found());
    let launcher = KubernetesLauncher::new(client, KubernetesSettings::default());
    let worker = Spawned {
        container_id: Some("job-a".into()),
        ..Spawned::default()
    };
    launcher.stop(worker.clone(), Duration::from_secs(7)).await;
    launcher.cleanup(worker.clone()).await;
    assert!(!launcher.is_alive(worker).await);
    launcher.stop(Spawned::default(), Duration::ZERO).await;
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 3, "{log:#?}");
    assert_eq!(log[1].body["propagationPolicy"], "Foreground");
}

fn job(name: &str, rush: &str, worker: u32, generation: u64, condition: Option<&str>) -> Value {
    let mut j = json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "uid": format!("uid-{name}"),
                     "labels": {"zerg.rush": rush_hash(rush), "zerg.worker": worker.to_string(),
                                "zerg.generation": generation.to_string()},
                     "annotations": {"zerg.rush": rush}},
        "status": {},
    });
    if let Some(c) = condition {
        j["status"]["conditions"] = json!([{"type": c, "status": "True"}]);
    }
    j
}

#[tokio::test]
async fn discover_lists_the_rush_jobs_by_label() {
    let (client, log) = mock(|_| {
        let mut unlabelled = job("other", "rush-0001", 9, 9, None);
        unlabelled["metadata"]["labels"] = json!({"zerg.rush": rush_hash("rush-0001")});
        Reply::Json(
            200,
            json!({"apiVersion": "batch/v1", "kind": "JobList", "metadata": {},
                   "items": [job("a", "rush-0001", 1, 2, None),
                             job("b", "rush-0001", 3, 1, Some("Complete")),
                             job("c", "a-colliding-rush", 4, 1, None),
                             unlabelled]}),
        )
    });
    let launcher = KubernetesLauncher::new(client, KubernetesSettings::default());
    let found = launcher.discover("rush-0001").await;
    let request = log.lock().unwrap()[0].clone();
    assert!(request.is("GET", "/apis/batch/v1/namespaces/default/jobs"));
    assert!(
        request.query.contains(&format!(
            "labelSelector=zerg.rush%3D{}",
            rush_hash("rush-0001")
        )),
        "{}",
        request.query
    );
    let got: Vec<_> = found
        .iter()
        .map(|d| {
            (
                d.worker_id,
                d.generation,
                d.running,
                d.spawned.container_id.clone().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (1, 2, true, "a".to_string()),
            (3, 1, false, "b".to_string())
        ]
    );
}

#[tokio::test]
async fn remove_rush_deletes_its_jobs_and_unowned_leftovers() {
    let (client, log) = mock(|s| match (s.method.as_str(), s.path.as_str()) {
        ("GET", "/apis/batch/v1/namespaces/default/jobs") => Reply::Json(
            200,
            json!({"apiVersion": "batch/v1", "kind": "JobList", "metadata": {},
                   "items": [job("a", "rush-0001", 1, 2, None)]}),
        ),
        ("GET", "/api/v1/namespaces/default/secrets") => {
            let secret = |name: &str| {
                let mut s = job(name, "rush-0001", 1, 2, None);
                s["apiVersion"] = json!("v1");
                s["kind"] = json!("Secret");
                s.as_object_mut().unwrap().remove("status");
                s
            };
            let mut owned = secret("a-token");
            owned["metadata"]["ownerReferences"] =
                json!([{"apiVersion": "batch/v1", "kind": "Job", "name": "a", "uid": "uid-a"}]);
            let orphan = secret("old-token");
            Reply::Json(
                200,
                json!({"apiVersion": "v1", "kind": "SecretList", "metadata": {},
                       "items": [owned, orphan]}),
            )
        }
        ("GET", _) => Reply::Json(
            200,
            json!({"apiVersion": "v1", "kind": "ConfigMapList", "metadata": {}, "items": []}),
        ),
        _ => not_found(),
    });
    let launcher = KubernetesLauncher::new(client, KubernetesSettings::default());
    assert_eq!(launcher.remove_rush("rush-0001").await.unwrap(), 1);
    let deletes: Vec<_> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.method == "DELETE")
        .cloned()
        .collect();
    assert_eq!(deletes.len(), 2, "{deletes:#?}");
    assert_eq!(deletes[0].path, "/apis/batch/v1/namespaces/default/jobs/a");
    assert_eq!(deletes[0].body["propagationPolicy"], "Foreground");
    assert_eq!(
        deletes[1].path,
        "/api/v1/namespaces/default/secrets/old-token"
    );
}

/// A server for a watched Job `job-a`: its pods are listed as running, then the watch sends
/// `events`; later watches stay open.
fn watched(events: Vec<Value>) -> (Client, Log) {
    let mut watches = 0;
    mock(move |s| {
        if s.is("GET", "/apis/batch/v1/namespaces/default/jobs/job-a") {
            Reply::Json(200, job("job-a", "rush-0001", 1, 1, None))
        } else if s.is("GET", "/api/v1/namespaces/default/pods") {
            if !s.query.contains("watch=true") {
                return pod_list(vec![serde_json::to_value(pod(running())).unwrap()]);
            }
            watches += 1;
            if watches > 1 {
                return Reply::Hold;
            }
            let lines: String = events
                .iter()
                .map(|object| format!("{}\n", json!({"type": "MODIFIED", "object": object})))
                .collect();
            Reply::Raw(200, lines)
        } else {
            Reply::Json(
                200,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
            )
        }
    })
}

/// Watches `job-a` and returns its exits, waiting a little after the first for any other.
async fn exits_of(launcher: &KubernetesLauncher) -> Vec<ExitInfo> {
    exits_within(launcher, 500).await
}

/// [`exits_of`], looking `polls` times, 10 ms apart, for a first exit.
async fn exits_within(launcher: &KubernetesLauncher, polls: usize) -> Vec<ExitInfo> {
    let exits: Arc<Mutex<Vec<ExitInfo>>> = Arc::default();
    let sink = exits.clone();
    let worker = Spawned {
        container_id: Some("job-a".into()),
        ..Spawned::default()
    };
    launcher.watch(worker, Box::new(move |e| sink.lock().unwrap().push(e)));
    for _ in 0..polls {
        if !exits.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    exits.lock().unwrap().clone()
}

#[tokio::test]
async fn watch_reports_the_exit_code_once() {
    let done = serde_json::to_value(pod(terminated(3, "Error"))).unwrap();
    let (client, log) = watched(vec![done.clone(), done]);
    let launcher = KubernetesLauncher::new(client, KubernetesSettings::default());
    assert_eq!(exits_of(&launcher).await, [ExitInfo::Code(3)]);
    let log = log.lock().unwrap().clone();
    let list = log
        .iter()
        .find(|s| s.path.ends_with("/pods"))
        .expect("pods listed");
    assert!(
        list.query.contains("controller-uid%3Duid-job-a"),
        "{}",
        list.query
    );
    assert!(!log.iter().any(|s| s.method == "DELETE"), "{log:#?}");
}

#[tokio::test]
async fn watch_stops_a_job_whose_image_cannot_be_pulled() {
    let stuck = serde_json::to_value(pod(waiting("ErrImagePull", "pull access denied"))).unwrap();
    let (client, log) = watched(vec![stuck]);
    let launcher = KubernetesLauncher::new(client, KubernetesSettings::default());
    assert_eq!(exits_of(&launcher).await, [ExitInfo::Code(1)]);
    let del = seen(&log, |s| s.method == "DELETE").await;
    assert_eq!(del.path, "/apis/batch/v1/namespaces/default/jobs/job-a");
    assert_eq!(del.body["propagationPolicy"], "Foreground");
}

#[tokio::test]
async fn watch_of_a_job_gone_reports_vanished() {
    let (client, _log) = mock(|_| not_found());
    let launcher = KubernetesLauncher::new(client, KubernetesSettings::default());
    assert_eq!(exits_of(&launcher).await, [ExitInfo::Vanished]);
}

// === A cluster that answers per selector and replays watch sequences ===

/// The `labelSelector` of a request, decoded.
fn selector_of(s: &Seen) -> Option<String> {
    s.query.split('&').find_map(|kv| {
        let v = kv.strip_prefix("labelSelector=")?;
        Some(
            v.replace("%3D", "=")
                .replace("%2F", "/")
                .replace("%2C", ","),
        )
    })
}

/// The label the Job controller puts on a Job's pods, as the API server knows it (spelled out
/// here, so a launcher that asks for another label is served nothing).
const CONTROLLER_UID: &str = "batch.kubernetes.io/controller-uid";

/// A pod of the Job whose uid is `job_uid`, labelled the way the Job controller labels it.
fn pod_of(name: &str, job_uid: &str, status: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "resourceVersion": "7",
                        "labels": {CONTROLLER_UID: job_uid, "zerg.worker": "1"}},
           "status": status})
}

/// One line of a watch response.
fn event(kind: &str, object: &Value) -> String {
    format!("{}\n", json!({"type": kind, "object": object}))
}

/// The watch error an API server sends when the resource version asked for is too old.
fn gone() -> String {
    event(
        "ERROR",
        &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired",
                "code": 410, "message": "too old resource version: 1 (9)"}),
    )
}

/// A namespace holding Job `job-a` (uid `uid-job-a`) and another Job's pod, which has exited
/// 9. Pod lists are answered per label selector: the `n`th list of the Job's pods gets
/// `lists[n]` (the last one again after), the `n`th watch replays `watches[n]` (later ones
/// stay open). Any other selector, or none, gets only the pods it matches.
fn cluster(lists: Vec<Vec<Value>>, watches: Vec<String>) -> (Client, Log) {
    let other = pod_of("other-pod", "uid-other", terminated(9, "Error"));
    let (mut listed, mut watched) = (0, 0);
    mock(move |s| {
        if s.is("GET", "/apis/batch/v1/namespaces/default/jobs/job-a") {
            return Reply::Json(200, job("job-a", "rush-0001", 1, 1, None));
        }
        if !s.is("GET", "/api/v1/namespaces/default/pods") {
            return not_found();
        }
        let ours = selector_of(s).as_deref() == Some(&format!("{CONTROLLER_UID}=uid-job-a"));
        if s.query.contains("watch=true") {
            if !ours {
                return Reply::Hold;
            }
            watched += 1;
            return match watches.get(watched - 1) {
                Some(lines) => Reply::Raw(200, lines.clone()),
                None => Reply::Hold,
            };
        }
        let items = if ours {
            listed += 1;
            lists[(listed - 1).min(lists.len() - 1)].clone()
        } else if selector_of(s).is_none_or(|l| l == format!("{CONTROLLER_UID}=uid-other")) {
            vec![other.clone()]
        } else {
            vec![]
        };
        pod_list(items)
    })
}

#[tokio::test]
async fn watch_follows_added_modified_deleted_of_the_jobs_own_pods() {
    let pending = pod_of("job-a-1", "uid-job-a", json!({"phase": "Pending"}));
    let up = pod_of("job-a-1", "uid-job-a", running());
    let script = event("ADDED", &pending) + &event("MODIFIED", &up) + &event("DELETED", &up);
    let (client, log) = cluster(vec![vec![]], vec![script]);
    let launcher = KubernetesLauncher::new(client, KubernetesSettings::default());
    // A pod deleted while it ran is a worker that vanished; the other Job's exited pod is not
    // this worker's exit.
    assert_eq!(exits_of(&launcher).await, [ExitInfo::Vanished]);
    let log = log.lock().unwrap().clone();
    assert!(!log.iter().any(|s| s.method == "DELETE"), "{log:#?}");

    // A pod deleted after its container ended reports how it ended.
    let done = pod_of("job-a-1", "uid-job-a", terminated(0, "Completed"));
    let script = event("ADDED", &up) + &event("DELETED", &done);
    let (client, _) = cluster(vec![vec![]], vec![script]);
    let launcher = KubernetesLauncher::new(client, KubernetesSettings::default());
    assert_eq!(exits_of(&launcher).await, [ExitInfo::Code(0)]);
}

#[tokio::test]
async fn watch_lists_again_after_410_gone_and_reads_the_exit_from_the_new_list() {
    let up = pod_of("job-a-1", "uid-job-a", running());
    let done = pod_of("job-a-1", "uid-job-a", terminated(4, "Error"));
    let (client, log) = cluster(vec![vec![up], vec![done]], vec![gone()]);
    let launcher = KubernetesLauncher::new(client, KubernetesSettings::default());
    assert_eq!(exits_of(&launcher).await, [ExitInfo::Code(4)]);
    let lists: Vec<_> = log
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.path.ends_with("/pods") && !s.query.contains("watch=true"))
        .cloned()
        .collect();
    assert_eq!(lists.len(), 2, "{lists:#?}");
    for l in &lists {
        assert_eq!(
            selector_of(l).as_deref(),
            Some("batch.kubernetes.io/controller-uid=uid-job-a")
        );
    }
}

/// A namespace where Job `job-a` runs with no pod it can be told by, until its second read,
/// which gets `later`; the Job's pods are listed as `lists` in turn (the last again after),
/// and every watch stays open.
fn job_changes_to(later: Option<Value>, lists: Vec<Vec<Value>>) -> (Client, Log) {
    let (mut reads, mut listed) = (0, 0);
    mock(move |s| {
        if s.is("GET", "/apis/batch/v1/namespaces/default/jobs/job-a") {
            reads += 1;
            return match (reads, &later) {
                (1, _) => Reply::Json(200, job("job-a", "rush-0001", 1, 1, None)),
                (_, Some(job)) => Reply::Json(200, job.clone()),
                (_, None) => not_found(),
            };
        }
        if s.is("GET", "/api/v1/namespaces/default/pods") && !s.query.contains("watch=true") {
            listed += 1;
            return pod_list(lists[(listed - 1).min(lists.len() - 1)].clone());
        }
        Reply::Hold
    })
}

#[tokio::test(start_paused = true)]
async fn a_job_that_finishes_or_goes_without_a_pod_event_is_read_from_the_job() {
    // Every 30 s the watch also reads the Job: failed with no pod left, complete, deleted,
    // deleted and created again under the same name (another uid).
    let failed = job("job-a", "rush-0001", 1, 1, Some("Failed"));
    let complete = job("job-a", "rush-0001", 1, 1, Some("Complete"));
    let mut replaced = job("job-a", "rush-0001", 1, 1, None);
    replaced["metadata"]["uid"] = json!("uid-new");
    for (later, want) in [
        (Some(failed.clone()), ExitInfo::Code(1)),
        (Some(complete), ExitInfo::Code(0)),
        (None, ExitInfo::Vanished),
        (Some(replaced), ExitInfo::Vanished),
    ] {
        let (client, log) = job_changes_to(later.clone(), vec![vec![]]);
        let launcher = KubernetesLauncher::new(client, KubernetesSettings::default());
        assert_eq!(exits_within(&launcher, 6000).await, [want], "{later:#?}");
        let reads = log
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.is("GET", "/apis/batch/v1/namespaces/default/jobs/job-a"))
            .count();
        assert!(reads >= 2, "{reads}");
    }
    // A failed Job whose pod is still listed reports the pod's own exit.
    let (client, _) = job_changes_to(
        Some(failed),
        vec![
            vec![],
            vec![pod_of("job-a-1", "uid-job-a", terminated(5, "Error"))],
        ],
    );
    let launcher = KubernetesLauncher::new(client, KubernetesSettings::default());
    assert_eq!(exits_within(&launcher, 6000).await, [ExitInfo::Code(5)]);
}

/// An API server that answers the first create of a Job with 409 AlreadyExists, shows `old`
/// under that name until it is deleted, and then accepts as [`accepting`] does.
fn with_leftover(old: Value) -> (Client, Log) {
    let (mut posts, mut deleted) = (0, false);
    mock(move |s| {
        let jobs = "/apis/batch/v1/namespaces/default/jobs";
        let name = job_name(&spec());
        if s.is("POST", jobs) {
            posts += 1;
            if posts == 1 {
                return Reply::Json(
                    409,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                           "reason": "AlreadyExists", "code": 409,
                           "message": format!("jobs.batch \"{name}\" already exists")}),
                );
            }
        } else if s.is("GET", &format!("{jobs}/{name}")) {
            return if deleted {
                not_found()
            } else {
                Reply::Json(200, old.clone())
            };
        } else if s.is("DELETE", &format!("{jobs}/{name}")) {
            deleted = true;
            return Reply::Json(200, old.clone());
        }
        accepting(s)
    })
}

#[tokio::test]
async fn a_leftover_job_of_the_rush_is_deleted_and_created_again_and_another_is_left_alone() {
    let name = job_name(&spec());
    let (client, log) = with_leftover(job(&name, "rush-0001", 2, 5, Some("Failed")));
    let launcher = KubernetesLauncher::new(client, KubernetesSettings::default());
    launcher.spawn(spec(), Box::new(|_| {})).await.unwrap();
    let log = log.lock().unwrap().clone();
    let calls: Vec<_> = log
        .iter()
        .take(8)
        .map(|s| format!("{} {}", s.method, s.path))
        .collect();
    let job_path = format!("/apis/batch/v1/namespaces/default/jobs/{name}");
    assert_eq!(
        calls,
        [
            "POST /apis/batch/v1/namespaces/default/jobs".to_string(),
            format!("GET {job_path}"),
            format!("DELETE {job_path}"),
            format!("GET {job_path}"),
            "POST /apis/batch/v1/namespaces/default/jobs".to_string(),
            "POST /api/v1/namespaces/default/secrets".to_string(),
            "POST /api/v1/namespaces/default/configmaps".to_string(),
            format!("PATCH {job_path}"),
        ]
    );
    assert_eq!(log[2].body["propagationPolicy"], "Foreground");

    // A Job of that name that is not the rush's is not zergd's to delete.
    let mut foreign = job(&name, "rush-0001", 2, 5, None);
    foreign["metadata"]["labels"] = json!({"app": "someone-else"});
    let (client, log) = with_leftover(foreign);
    let launcher = KubernetesLauncher::new(client, KubernetesSettings::default());
    let err = launcher.spawn(spec(), Box::new(|_| {})).await.unwrap_err();
    assert!(
        err.message.contains("zergd did not create it"),
        "{}",
        err.message
    );
    let log = log.lock().unwrap().clone();
    assert!(!log.iter().any(|s| s.method == "DELETE"), "{log:#?}");
}

/// Spawns a worker with `settings` against [`accepting`] and returns the objects it sent, as
/// sent: the Job (and the Job once started), the Secret, the ConfigMap.
async fn objects_sent(settings: KubernetesSettings) -> Vec<Value> {
    let (client, log) = mock(accepting);
    let launcher = KubernetesLauncher::new(client, settings);
    launcher.spawn(spec(), Box::new(|_| {})).await.unwrap();
    let log = log.lock().unwrap().clone();
    let mut objects: Vec<Value> = log
        .iter()
        .filter(|s| s.method == "POST")
        .map(|s| s.body.clone())
        .collect();
    // The Job as it runs: the merge patch that starts it applied.
    let patch = log.iter().find(|s| s.method == "PATCH").unwrap();
    let mut started = objects[0].clone();
    started["spec"]["suspend"] = patch.body["spec"]["suspend"].clone();
    objects.push(started);
    objects
}

#[tokio::test]
async fn every_object_spawn_sends_passes_the_api_schemas_and_the_restricted_pod_profile() {
    let full = KubernetesSettings {
        service_account: Some("zerg-worker".into()),
        node_selector: BTreeMap::from([("pool".into(), "agents".into())]),
        cpu_request: Some("500m".into()),
        memory_request: Some("1Gi".into()),
        cpu_limit: Some("2".into()),
        memory_limit: Some("4Gi".into()),
        ..KubernetesSettings::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (n, settings) in [KubernetesSettings::default(), full]
        .into_iter()
        .enumerate()
    {
        let objects = objects_sent(settings).await;
        let kinds: Vec<_> = objects.iter().map(|o| o["kind"].clone()).collect();
        assert_eq!(
            kinds,
            [
                json!("Job"),
                json!("Secret"),
                json!("ConfigMap"),
                json!("Job")
            ]
        );
        for (i, o) in objects.iter().enumerate() {
            let file = dir
                .path()
                .join(format!("{n}-{i}-{}.json", o["kind"].as_str().unwrap()));
            std::fs::write(&file, o.to_string()).unwrap();
            files.push(file);
        }
        let job = &objects[3];
        let pod = &job["spec"]["template"]["spec"];
        assert_eq!(
            zerg_proto::testkit::restricted_pod_violations(pod),
            Vec::<String>::new(),
            "{pod:#}"
        );
        // What docs/Remote-Workers.md promises besides the profile.
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        assert_eq!(pod["enableServiceLinks"], false);
        assert_eq!(pod["automountServiceAccountToken"], false);
        assert_eq!(pod["restartPolicy"], "Never");
        assert_eq!(job["spec"]["backoffLimit"], 0);
        // The labels a restarted zergd lists the rush's Jobs by, on the Job and on its pods.
        let labels = json!({"zerg.rush": rush_hash("rush-0001"), "zerg.worker": "2",
                            "zerg.generation": "5"});
        assert_eq!(job["metadata"]["labels"], labels);
        assert_eq!(job["spec"]["template"]["metadata"]["labels"], labels);
        assert_eq!(objects[1]["metadata"]["labels"], labels);
        assert_eq!(objects[2]["metadata"]["labels"], labels);
    }
    match zerg_proto::testkit::kubernetes_validate(&files) {
        Some(verdict) => verdict.unwrap(),
        None => zerg_proto::testkit::skip(
            "python3.12 -m kubernetes_validate is not installed (PYENV_VERSION=3.12.1 python3.12 -m pip install kubernetes-validate==1.37.0)",
        ),
    }
}
