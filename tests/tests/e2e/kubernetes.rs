//! zergd's kubernetes mode end to end against `kube-api`, a stand-in API server that zergd
//! reaches through a kubeconfig (`server: http://127.0.0.1:PORT`) and that runs each started
//! Job's pod as a container of the test image on the host network (see its module doc).
//! Every object zergd sends is recorded and checked against the Kubernetes API schemas and
//! the restricted Pod Security profile.
//!
//! These tests skip, saying why, when no engine is reachable; with `ZERG_REQUIRE_DOCKER=1` (set
//! by CI when the engine is present) they fail instead.

use serde_json::{Value, json};
use zerg_proto::testkit::{kubernetes_validate, restricted_pod_violations};
use zerg_tests::*;

use crate::container::{IMAGE, T, cdaemon_with, container_cfg, docker_ready, start_detached_in};

const NAMESPACE: &str = "zerg-e2e";

/// The rush's objects of `collection` (`jobs`, `pods`, `secrets`, `configmaps`) the
/// stand-in still holds.
fn left(api: &KubeApi, collection: &str, rush_label: &str) -> Vec<String> {
    let prefix = if collection == "jobs" {
        "/apis/batch/v1"
    } else {
        "/api/v1"
    };
    let selector = if collection == "pods" {
        String::new()
    } else {
        format!("?labelSelector=zerg.rush%3D{rush_label}")
    };
    api.get(&format!(
        "{prefix}/namespaces/{NAMESPACE}/{collection}{selector}"
    ))["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| format!("{collection}/{}", o["metadata"]["name"]))
        .collect()
}

#[test]
fn a_twelve_task_kubernetes_rush_sends_valid_restricted_objects_and_survives_zergd_kill_9() {
    if !docker_ready() {
        return;
    }
    let api = KubeApi::start();
    let repo = TestRepo::new();
    repo.write_graph("ku", &graph_12("ku"));
    let port = free_port();
    repo.configure(
        &container_cfg(IMAGE)
            .set("remote.listen", format!("127.0.0.1:{port}"))
            .set("kubernetes.namespace", NAMESPACE)
            .set("kubernetes.service_account", "zerg-worker")
            .set("kubernetes.cpu_request", "100m")
            .set("kubernetes.memory_request", "64Mi"),
    );
    repo.write_script(
        "ku",
        &json!({
            "default": [{"op": "tick", "count": 4, "interval_ms": 100}, {"op": "write_owned"}],
            // Long enough to be running when zergd is killed.
            "tasks": {"G-L2-001": [{"op": "tick", "count": 60, "interval_ms": 100}, {"op": "write_owned"}]}
        }),
    );
    let kubeconfig = api.kubeconfig(NAMESPACE);
    let mut ctx = cdaemon_with(vec![(
        "KUBECONFIG".into(),
        kubeconfig.to_string_lossy().into_owned(),
    )]);
    let d = &mut ctx.d;
    start_detached_in(d, &repo, "ku", 3, "kubernetes");
    let st = d.wait_for(&repo.path, "ku", T, "G-L2-001 in its agent CLI", |s| {
        running_worker(s, "G-L2-001").is_some_and(|w| w.container_id.is_some())
            && s["workers"].as_object().is_some_and(|w| {
                w.values()
                    .any(|x| x["current_task"] == "G-L2-001" && x["step"] == "implementing")
            })
    });
    assert_eq!(st["mode"], "kubernetes");
    let rush_id = st["rush_id"].as_str().unwrap().to_string();
    let jobs_before: Vec<Value> = api
        .objects()
        .into_iter()
        .map(|(_, o)| o)
        .filter(|o| o["kind"] == "Job")
        .collect();
    let rush_label = jobs_before[0]["metadata"]["labels"]["zerg.rush"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        jobs_before[0]["metadata"]["annotations"]["zerg.rush"],
        rush_id
    );

    // zergd is killed while the pods run. Meanwhile a Job of the rush appears that zergd
    // never recorded (a slot and generation it does not know), and a Job of another rush.
    d.kill9();
    let requests_before = api.requests().len();
    let jobs_path = format!("/apis/batch/v1/namespaces/{NAMESPACE}/jobs");
    let planted = |name: &str, label: &str| {
        let mut job = jobs_before[0].clone();
        job["metadata"]["name"] = json!(name);
        job["metadata"]["labels"] =
            json!({"zerg.rush": label, "zerg.worker": "9", "zerg.generation": "1"});
        job["spec"]["suspend"] = json!(true);
        let created = api.plant(&jobs_path, &job);
        assert_eq!(created["metadata"]["name"], name, "{created}");
    };
    let orphan = format!("zerg-{rush_label}-w9-g1");
    planted(&orphan, &rush_label);
    planted("zerg-000000000000-w9-g1", "000000000000");
    std::thread::sleep(std::time::Duration::from_millis(500));
    d.restart();
    let st = d.wait_end(&repo.path, "ku", T);
    assert_eq!(st["state"], "complete", "{st}\n{}", d.log());
    assert_eq!(repo.task_ids_on("zerg/ku/staging"), graph_12_ids());
    let log = std::fs::read_to_string(repo.path.join(".zerg/monitor.log")).unwrap();
    assert!(log.contains("zergd restarted; resuming rush ku"), "{log}");
    assert!(log.contains("reconnected after zergd restart"), "{log}");

    // The restarted zergd found its Jobs by the rush's label, and created none twice.
    let requests = api.requests();
    let discovery = format!(
        "GET /apis/batch/v1/namespaces/{NAMESPACE}/jobs?labelSelector=zerg.rush={rush_label} 200"
    );
    assert!(
        requests[requests_before..].contains(&discovery),
        "no {discovery:?} after the restart: {requests:#?}"
    );
    assert!(
        !requests.iter().any(|r| r.ends_with(" 409")),
        "a create met a leftover: {requests:#?}"
    );
    let objects = api.objects();
    let jobs: Vec<&Value> = objects
        .iter()
        .map(|(_, o)| o)
        .filter(|o| o["kind"] == "Job")
        .collect();
    let mut names: Vec<&str> = jobs
        .iter()
        .map(|j| j["metadata"]["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    let created = names.len();
    names.dedup();
    assert_eq!(names.len(), created, "a Job was created twice: {names:?}");

    // Every object as sent passes the API schemas; every pod the restricted profile.
    let files: Vec<_> = objects.iter().map(|(f, _)| f.clone()).collect();
    match kubernetes_validate(&files) {
        Some(verdict) => verdict.unwrap(),
        None => skip(
            "python3.12 -m kubernetes_validate is not installed (PYENV_VERSION=3.12.1 python3.12 -m pip install kubernetes-validate==1.37.0)",
        ),
    }
    let tokens: Vec<&str> = objects
        .iter()
        .map(|(_, o)| o)
        .filter(|o| o["kind"] == "Secret")
        .map(|s| s["stringData"]["zerg-token"].as_str().unwrap())
        .collect();
    assert_eq!(tokens.len(), created);
    for job in &jobs {
        let pod = &job["spec"]["template"]["spec"];
        assert_eq!(
            restricted_pod_violations(pod),
            Vec::<String>::new(),
            "{pod:#}"
        );
        assert_eq!(pod["enableServiceLinks"], false);
        assert_eq!(pod["automountServiceAccountToken"], false);
        assert_eq!(pod["serviceAccountName"], "zerg-worker");
        assert_eq!(job["metadata"]["labels"]["zerg.rush"], rush_label.as_str());
        let text = job.to_string();
        assert!(
            !tokens.iter().any(|t| text.contains(t)),
            "a worker's token is in Job {}",
            job["metadata"]["name"]
        );
    }

    // Nothing of the rush is left in the namespace.
    let everything = || {
        ["jobs", "pods", "secrets", "configmaps"]
            .iter()
            .flat_map(|c| left(&api, c, &rush_label))
            .collect::<Vec<_>>()
    };
    assert!(
        poll(T, || everything().is_empty()),
        "left behind: {:?}\n{:#?}\n{}",
        everything(),
        &api.requests()[requests_before..],
        d.log()
    );
    // The Job zergd never recorded was found by the rush's label and deleted; another
    // rush's Job is not this rush's to delete.
    assert!(
        requests[requests_before..]
            .iter()
            .any(|r| r.starts_with(&format!("DELETE {jobs_path}/{orphan}?"))),
        "the Job zergd never recorded was not deleted: {requests:#?}"
    );
    assert_eq!(
        api.get(&format!("{jobs_path}/zerg-000000000000-w9-g1"))["kind"],
        "Job"
    );
}
