//! Remote workers on a real single-node Docker swarm (issue: workers past one host): services
//! that share no filesystem with zergd fetch their base over the TCP worker plane (TLS, zergd's
//! own CA), push their commits as packs, and survive a killed container and a `kill -9` of
//! zergd. The swarm is created on 127.0.0.1 for the test and left again if the test created it.
//!
//! These tests skip, saying why, when no engine is reachable; with `ZERG_REQUIRE_DOCKER=1` (set
//! by CI when the engine is present) they fail instead.

use serde_json::json;
use zerg_proto::testkit::{SwarmSession, docker_required};
use zerg_tests::*;

use crate::container::{IMAGE, T, cdaemon, container_cfg, docker, docker_ready, start_detached_in};

/// The swarm for a test, or `None` (skipped) without an engine.
pub(crate) fn swarm() -> Option<SwarmSession> {
    if !docker_ready() {
        return None;
    }
    match SwarmSession::start() {
        Ok(s) => Some(s),
        Err(e) => {
            assert!(
                !docker_required(),
                "a Docker engine is required here, but the engine cannot be a swarm: {e}"
            );
            skip(&format!("the engine cannot be a swarm: {e}"));
            None
        }
    }
}

/// The config of a swarm rush: container mode's, with the plane on a port of its own.
pub(crate) fn swarm_cfg(port: u16) -> Config {
    container_cfg(IMAGE)
        .set("remote.listen", format!("127.0.0.1:{port}"))
        .set("container.network", "host")
}

/// Services, secrets and configs labelled with the rush.
fn swarm_objects(rush_id: &str) -> Vec<String> {
    let filter = format!("label=zerg.rush={rush_id}");
    ["service", "secret", "config"]
        .iter()
        .flat_map(|kind| {
            docker(&[kind, "ls", "-q", "--filter", &filter])
                .lines()
                .map(|l| format!("{kind} {l}"))
                .collect::<Vec<_>>()
        })
        .filter(|l| !l.ends_with(' '))
        .collect()
}

pub(crate) fn wait_nothing_left(rush_id: &str) {
    assert!(
        poll(T, || swarm_objects(rush_id).is_empty()),
        "left behind: {:?}",
        swarm_objects(rush_id)
    );
}

/// A service's id, labels, mounts and image, as the engine has them.
fn service_spec(service: &str) -> String {
    docker(&[
        "service",
        "inspect",
        "--format",
        "{{.ID}} {{json .Spec.Labels}} {{json .Spec.TaskTemplate.ContainerSpec.Mounts}} {{.Spec.TaskTemplate.ContainerSpec.Image}}",
        service,
    ])
}

/// The running container of a worker's service.
fn container_of_service(service: &str) -> Option<String> {
    let filter = format!("label=com.docker.swarm.service.id={service}");
    docker(&["ps", "-q", "--filter", &filter])
        .lines()
        .next()
        .map(str::to_string)
        .filter(|s| !s.is_empty())
}

#[test]
fn a_twelve_task_rush_on_a_swarm_survives_a_killed_worker_and_zergd_kill_9() {
    let Some(_swarm) = swarm() else {
        return;
    };
    let repo = TestRepo::new();
    repo.write_graph("sw", &graph_12("sw"));
    repo.configure(&swarm_cfg(free_port()));
    repo.write_script(
        "sw",
        &json!({
            "default": [{"op": "tick", "count": 4, "interval_ms": 100}, {"op": "write_owned"}],
            "tasks": {
                // Reads the committed spec from the checkout the worker fetched.
                "G-L1-001": [
                    {"op": "shell", "command": "mkdir -p l1 && cat \"$ZERG_SPEC_DIR/task-graph.json\" > l1/a1.txt"}
                ],
                // Long enough to be killed in the middle (attempts are counted per container,
                // so every attempt runs this).
                "G-L2-001": [{"op": "tick", "count": 100, "interval_ms": 100}, {"op": "write_owned"}]
            }
        }),
    );
    let mut ctx = cdaemon();
    let d = &mut ctx.d;
    start_detached_in(d, &repo, "sw", 3, "swarm");
    let st = d.wait_for(&repo.path, "sw", T, "G-L2-001 in its agent CLI", |s| {
        running_worker(s, "G-L2-001").is_some_and(|w| w.container_id.is_some())
            && s["workers"].as_object().is_some_and(|w| {
                w.values()
                    .any(|x| x["current_task"] == "G-L2-001" && x["step"] == "implementing")
            })
    });
    let rush_id = st["rush_id"].as_str().unwrap().to_string();
    assert_eq!(st["mode"], "swarm");
    let service = running_worker(&st, "G-L2-001")
        .and_then(|w| w.container_id)
        .unwrap();
    let container = container_of_service(&service).expect("the worker's container runs");
    // The token is a mounted secret, not a variable of the container.
    let env = docker(&["inspect", "--format", "{{json .Config.Env}}", &container]);
    assert!(env.contains("ZERG_WORKER_TOKEN_FILE"), "{env}");
    assert!(!env.contains("ZERG_WORKER_TOKEN="), "{env}");
    // What the engine runs for the other workers: each one's service, its labels and mounts,
    // and its running container (the service's task).
    let others: Vec<(String, String, String)> = st["workers"]
        .as_object()
        .unwrap()
        .values()
        .filter_map(|w| w["container_id"].as_str().map(str::to_string))
        .filter(|svc| *svc != service)
        .map(|svc| {
            let spec = service_spec(&svc);
            let running = container_of_service(&svc).expect("the other worker's container runs");
            (svc, spec, running)
        })
        .collect();
    assert_eq!(others.len(), 2, "{st}");
    docker(&["kill", &container]);
    // zergd is killed too, while the swarm still runs the other workers' services.
    d.kill9();
    std::thread::sleep(std::time::Duration::from_millis(500));
    d.restart();
    d.wait_for(&repo.path, "sw", T, "the workers reconnected", |_| {
        std::fs::read_to_string(repo.path.join(".zerg/monitor.log"))
            .is_ok_and(|l| l.contains("reconnected after zergd restart"))
    });
    // Re-adopted, judged from the engine: the same services, unchanged, with the same
    // containers, and no slot with a second service.
    let mut checked = 0;
    for (svc, spec, running) in &others {
        // A worker whose work ran out may have ended since; one still running is the same.
        if let Some(now) = container_of_service(svc) {
            assert_eq!(&service_spec(svc), spec, "service {svc} was changed");
            assert_eq!(&now, running, "service {svc} runs a new container");
            checked += 1;
        }
    }
    assert!(checked > 0, "no other worker was still running to judge");
    let slots = docker(&[
        "service",
        "ls",
        "--filter",
        &format!("label=zerg.rush={rush_id}"),
        "--format",
        "{{.ID}} {{index .Labels \"zerg.worker\"}}",
    ]);
    let mut seen = std::collections::BTreeSet::new();
    for line in slots.lines().filter(|l| !l.trim().is_empty()) {
        let slot = line.split_whitespace().nth(1).unwrap_or("").to_string();
        assert!(
            seen.insert(slot.clone()),
            "slot {slot} has two services:\n{slots}"
        );
    }
    let st = d.wait_end(&repo.path, "sw", T);
    assert_eq!(st["state"], "complete", "{st}\n{}", d.log());
    assert_eq!(repo.task_ids_on("zerg/sw/staging"), graph_12_ids());
    assert_eq!(
        repo.spec_tree("zerg/sw/staging", "sw"),
        repo.spec_tree("main", "sw")
    );
    assert_eq!(
        git(&repo.path, &["show", "zerg/sw/staging:l1/a1.txt"]),
        git(&repo.path, &["show", "main:.gsd/specs/sw/task-graph.json"]),
        "the worker did not read the committed spec from its checkout"
    );
    // The agent CLI's output came back through the plane into zergd's log dir.
    let output = repo.path.join(".zerg/logs/tasks/G-L3-001/agent-output.txt");
    assert!(
        std::fs::metadata(&output).is_ok_and(|m| m.len() > 0),
        "{} is missing or empty",
        output.display()
    );
    let log = std::fs::read_to_string(repo.path.join(".zerg/monitor.log")).unwrap();
    assert!(log.contains("zergd restarted; resuming rush sw"), "{log}");
    // The killed container's task was reassigned, and the other workers' services were
    // re-adopted, not respawned.
    assert_eq!(st["tasks"]["G-L2-001"]["crashes"], 1, "{log}");
    assert!(log.contains("reconnected after zergd restart"), "{log}");
    wait_nothing_left(&rush_id);
    git(&repo.path, &["fsck", "--no-progress"]);
}

/// Starts a two-worker swarm rush of `feature` whose tasks G-L1-001 and G-L1-002 hold their
/// leases for `hold_ticks` tenths of a second, waits until both are in their agent CLI, and
/// returns the status then and the container of G-L1-001's worker.
fn start_two_holding(
    d: &Daemon,
    repo: &TestRepo,
    feature: &str,
    hold_ticks: u32,
) -> (serde_json::Value, String) {
    let hold =
        json!([{"op": "tick", "count": hold_ticks, "interval_ms": 100}, {"op": "write_owned"}]);
    repo.write_script(
        feature,
        &json!({"tasks": {"G-L1-001": hold.clone(), "G-L1-002": hold}}),
    );
    start_detached_in(d, repo, feature, 2, "swarm");
    let st = d.wait_for(
        &repo.path,
        feature,
        T,
        "both long tasks in their agent CLI, the first one's service recorded",
        |s| {
            // The agent can reach its CLI before zergd records the service the spawn made.
            running_worker(s, "G-L1-001").is_some_and(|w| w.container_id.is_some())
                && ["G-L1-001", "G-L1-002"].iter().all(|t| {
                    s["workers"].as_object().is_some_and(|w| {
                        w.values()
                            .any(|x| x["current_task"] == *t && x["step"] == "implementing")
                    })
                })
        },
    );
    let service = running_worker(&st, "G-L1-001")
        .and_then(|w| w.container_id)
        .unwrap();
    let container = container_of_service(&service).expect("the worker's container runs");
    (st, container)
}

#[test]
fn hostile_packs_from_inside_a_swarm_worker_are_refused_with_the_reason() {
    let Some(_swarm) = swarm() else {
        return;
    };
    let repo = TestRepo::new();
    repo.write_graph("hp", &graph_12("hp"));
    repo.configure(&swarm_cfg(free_port()));
    let ctx = cdaemon();
    let d = &ctx.d;
    // Two tasks hold their leases long enough for the attack.
    let (st, container) = start_two_holding(d, &repo, "hp", 300);
    let rush_id = st["rush_id"].as_str().unwrap().to_string();
    let out = docker(&[
        "exec",
        &container,
        "/usr/local/bin/zerg-attack",
        "push",
        "--task",
        "G-L1-001",
        "--lease",
        "G-L1-001#1",
        "--other-task",
        "G-L1-002",
        "--other-lease",
        "G-L1-002#1",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let r = &v["results"];
    let expect = [
        ("corrupt", "index-pack"),
        ("oversize", "bytes allowed"),
        ("off_base", "does not descend"),
        ("spec_change", "spec"),
        ("other_lease", "lease"),
        ("no_token", "token"),
    ];
    for (case, why) in expect {
        assert_eq!(r[case]["refused"], true, "{case} was not refused: {v}");
        let msg = r[case]["message"].as_str().unwrap_or("");
        assert!(msg.contains(why), "{case}: {msg}");
    }
    // The rush goes on and completes; nothing of the attack is on staging.
    let st = d.wait_end(&repo.path, "hp", T);
    assert_eq!(st["state"], "complete", "{st}\n{}", d.log());
    assert_eq!(repo.task_ids_on("zerg/hp/staging"), graph_12_ids());
    assert_eq!(
        repo.spec_tree("zerg/hp/staging", "hp"),
        repo.spec_tree("main", "hp")
    );
    assert!(
        !repo
            .files_on("zerg/hp/staging")
            .iter()
            .any(|f| f == "attack.txt")
    );
    // The refusals under the worker's own lease are events of the rush, with the reason.
    let log = std::fs::read_to_string(repo.path.join(".zerg/monitor.log")).unwrap();
    let refused = log
        .lines()
        .filter(|l| l.contains("pushed objects for G-L1-001 that zergd refused"))
        .count();
    assert_eq!(refused, 4, "{log}");
    assert!(
        log.contains("does not descend from the task's base commit"),
        "{log}"
    );
    wait_nothing_left(&rush_id);
}

/// zergd's thread count.
fn threads(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Runs `zerg-attack` in `container` and returns its JSON report.
fn attack_in(container: &str, args: &[&str]) -> serde_json::Value {
    let mut cmd = vec!["exec", container, "/usr/local/bin/zerg-attack"];
    cmd.extend_from_slice(args);
    let out = std::process::Command::new("docker")
        .args(&cmd)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "zerg-attack {args:?}: {e}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The plane against a hostile worker (with its own token, from inside its container) and a
/// network peer with none:
/// 1. 3,000 plain TCP connections that never start TLS: zergd holds a bounded number of
///    descriptors, answers `status`, and closes every one of them after
///    `remote.handshake_timeout`;
/// 2. 600 `FetchBase` streams of the worker's own lease over 8 connections, never read:
///    zergd's thread count stays small, `status` answers, and the other worker is not
///    declared stale;
/// 3. 300 artifacts of 1 MiB: kept up to `container.artifacts_max_bytes`, the rest refused
///    with an event naming the key;
/// 4. a checkpoint that is a merge with the base's parent (which would have shipped the
///    history behind the base, with a file the user deleted, to the resumed worker): refused.
#[test]
fn a_hostile_swarm_worker_and_a_tokenless_peer_cannot_stall_zergd_or_reach_past_the_snapshot() {
    use std::io::{BufRead, BufReader, Read};
    let Some(_swarm) = swarm() else {
        return;
    };
    // 3,000 connections of this process's own.
    zergd::incoming::raise_fd_limit();
    let repo = TestRepo::new();
    // A secret the user deleted: it is only in the history behind the base.
    std::fs::write(repo.path.join("secret.txt"), "the deleted secret\n").unwrap();
    git(&repo.path, &["add", "secret.txt"]);
    git(&repo.path, &["commit", "-q", "-m", "secret"]);
    git(&repo.path, &["rm", "-q", "secret.txt"]);
    git(&repo.path, &["commit", "-q", "-m", "no secret"]);
    repo.write_graph("hw", &graph_12("hw"));
    let port = free_port();
    repo.configure(
        &swarm_cfg(port)
            .set("remote.handshake_timeout", 3)
            .set("container.artifacts_max_bytes", "8m"),
    );
    let ctx = cdaemon();
    let d = &ctx.d;
    let (_, attacker) = start_two_holding(d, &repo, "hw", 450);
    let pid = d.pid();
    let status_answers = |when: &str| {
        let out = d.ctl_in(&repo.path, &["status", "hw", "--json"]);
        assert!(
            out.status.success(),
            "status did not answer {when}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };

    // 1. A peer with no token floods the TCP plane and never says hello.
    let fds_before = open_fds(pid);
    let mut flood = Vec::new();
    for _ in 0..3000 {
        if let Ok(c) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            flood.push(c);
        }
    }
    assert!(
        flood.len() > 2000,
        "only {} connections opened",
        flood.len()
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    let fds = open_fds(pid);
    assert!(
        fds < fds_before + 200,
        "zergd holds {fds} descriptors under the flood ({fds_before} before)"
    );
    status_answers("under the connection flood");
    // zergd closes each one once `remote.handshake_timeout` (3 s) passes: a read sees the end
    // as soon as it does, and none may still be open 10 s after the flood.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let still_open = flood
        .iter()
        .filter(|c| {
            let mut c: &std::net::TcpStream = c;
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            c.set_read_timeout(Some(left.max(std::time::Duration::from_millis(1))))
                .unwrap();
            let mut b = [0u8; 1];
            matches!(c.read(&mut b), Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut))
        })
        .count();
    assert_eq!(still_open, 0, "connections that never spoke are still open");
    drop(flood);

    // 2. Unread FetchBase streams of the worker's own lease.
    let mut streams = std::process::Command::new("docker")
        .args(["exec", &attacker, "/usr/local/bin/zerg-attack", "streams"])
        .args(["--task", "G-L1-001", "--lease", "G-L1-001#1"])
        .args(["--count", "600", "--conns", "8", "--seconds", "15"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(streams.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let report: serde_json::Value =
        serde_json::from_str(&first).unwrap_or_else(|e| panic!("{e}: {first}"));
    assert_eq!(report["holding"], true, "{report}");
    let t = threads(pid);
    assert!(
        t < 64,
        "zergd runs {t} threads under unread streams: {report}"
    );
    status_answers("under unread FetchBase streams");
    let _ = streams.wait();

    // 3. An artifact flood.
    let arts = attack_in(
        &attacker,
        &[
            "artifacts",
            "--task",
            "G-L1-001",
            "--lease",
            "G-L1-001#1",
            "--count",
            "300",
            "--bytes",
            "1048576",
        ],
    );
    assert_eq!(arts["accepted"], 8, "{arts}");
    assert!(
        arts["first_refusal"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("container.artifacts_max_bytes")),
        "{arts}"
    );
    let dir = repo.path.join(".zerg/logs/tasks/G-L1-001");
    let (files, bytes) = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .fold((0, 0), |(n, b), e| (n + 1, b + e.metadata().unwrap().len()));
    assert!(
        files <= 10 && bytes <= (8 << 20) + 4096,
        "{files} files, {bytes} bytes kept in {}",
        dir.display()
    );

    // 4. A checkpoint that reaches behind the base.
    let cp = attack_in(
        &attacker,
        &["checkpoint", "--task", "G-L1-001", "--lease", "G-L1-001#1"],
    );
    assert_eq!(cp["pushed"]["refused"], false, "{cp}");
    let merge = cp["commit"].as_str().unwrap().to_string();
    assert!(
        poll(T, || d.log().contains("not a line of commits")),
        "the checkpoint was not refused: {cp}\n{}",
        d.log()
    );
    let wip = git(&repo.path, &["for-each-ref", "refs/zerg/hw/wip/"]);
    assert!(!wip.contains(&merge), "the checkpoint was kept: {wip}");

    let st = d.wait_end(&repo.path, "hw", T);
    assert_eq!(st["state"], "complete", "{st}\n{}", d.log());
    assert_eq!(repo.task_ids_on("zerg/hw/staging"), graph_12_ids());
    let log = std::fs::read_to_string(repo.path.join(".zerg/monitor.log")).unwrap();
    assert!(
        !log.contains("is stale: no heartbeat"),
        "a worker was declared stale during the attack: {log}"
    );
    assert!(log.contains("container.artifacts_max_bytes"), "{log}");
    assert!(
        !repo
            .files_on("zerg/hw/staging")
            .iter()
            .any(|f| f == "secret.txt"),
        "the deleted secret is back on staging"
    );
    wait_nothing_left(st["rush_id"].as_str().unwrap());
}

/// A rush on a real Kubernetes cluster, run only on request (`cargo nextest run --run-ignored
/// only -E 'test(kubernetes_cluster)'`): `ZERG_TEST_KUBECONFIG` must name a kubeconfig, and
/// when it names none, or one that cannot be read, the test fails rather than skips. The
/// cluster must be able to run `ZERG_TEST_K8S_IMAGE` (default `zerg-worker:e2e`, which
/// `zergctl image build --offline` makes and, on kind, `kind load docker-image` loads), and its
/// pods must reach `ZERG_TEST_K8S_ADVERTISE_URL` (zergd's plane, listening on
/// `ZERG_TEST_K8S_LISTEN`, default `0.0.0.0:7447`). `ZERG_TEST_K8S_NAMESPACE` defaults to
/// `default`. Without a cluster, `kubernetes.rs` runs zergd's kubernetes mode against the
/// `kube-api` stand-in.
#[test]
#[ignore = "needs a Kubernetes cluster: set ZERG_TEST_KUBECONFIG (and ZERG_TEST_K8S_ADVERTISE_URL) and run ignored tests"]
fn a_twelve_task_rush_on_a_kubernetes_cluster() {
    let kubeconfig = std::env::var_os("ZERG_TEST_KUBECONFIG")
        .filter(|v| !v.is_empty())
        .expect("ZERG_TEST_KUBECONFIG must name the cluster's kubeconfig");
    if let Err(e) = std::fs::read(&kubeconfig) {
        panic!(
            "ZERG_TEST_KUBECONFIG={} cannot be read: {e}",
            kubeconfig.to_string_lossy()
        );
    }
    let var = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_string());
    let Ok(url) = std::env::var("ZERG_TEST_K8S_ADVERTISE_URL") else {
        panic!(
            "ZERG_TEST_KUBECONFIG is set: ZERG_TEST_K8S_ADVERTISE_URL must say how pods reach zergd"
        );
    };
    if !docker_ready() {
        return;
    }
    let repo = TestRepo::new();
    repo.write_graph("kc", &graph_12("kc"));
    repo.configure(
        &container_cfg(&var("ZERG_TEST_K8S_IMAGE", IMAGE))
            .set("remote.listen", var("ZERG_TEST_K8S_LISTEN", "0.0.0.0:7447"))
            .set("remote.advertise_url", url)
            .set(
                "kubernetes.namespace",
                var("ZERG_TEST_K8S_NAMESPACE", "default"),
            )
            .set("kubernetes.image_pull_policy", "IfNotPresent"),
    );
    let d = Daemon::start_with_env(vec![(
        "KUBECONFIG".into(),
        kubeconfig.to_string_lossy().into_owned(),
    )]);
    let out = d.ctl_in(
        &repo.path,
        &["rush", "kc", "--workers", "3", "--mode", "kubernetes"],
    );
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    let st = d.status(&repo.path, "kc").unwrap();
    assert_eq!(st["state"], "complete", "{st}");
    assert_eq!(st["mode"], "kubernetes");
    assert_eq!(repo.task_ids_on("zerg/kc/staging"), graph_12_ids());
}

#[test]
fn a_swarm_worker_checkpoint_is_pushed_and_resumed_in_another_container() {
    let Some(_swarm) = swarm() else {
        return;
    };
    let repo = TestRepo::new();
    repo.write_graph("scp", &graph_12("scp"));
    // A gate as loud as a test suite: a swarm rush runs it in a container of its image, in the
    // scratch copy of staging.
    repo.configure(&swarm_cfg(free_port()).gate("noisy-test", "seq 1 40000; pwd", true));
    // Attempts are counted per container, so the script looks at the worktree instead: the
    // first attempt writes the file and checkpoints; the resumed one finds the file restored
    // from the checkpoint (fetched from zergd into a new container) and writes nothing.
    repo.write_script(
        "scp",
        &json!({"tasks": {"G-L1-003": [{"op": "shell", "command":
            "if [ ! -f l1/a3.txt ]; then mkdir -p l1 && echo 'written before the checkpoint' > l1/a3.txt && printf '{\"progress_pct\": 60, \"next_action\": \"finish\"}' > \"$ZERG_TASK_DIR/checkpoint.json\"; fi"
        }]}}),
    );
    let ctx = cdaemon();
    let d = &ctx.d;
    start_detached_in(d, &repo, "scp", 2, "swarm");
    let st = d.wait_end(&repo.path, "scp", T);
    assert_eq!(st["state"], "complete", "{st}\n{}", d.log());
    assert_eq!(repo.task_ids_on("zerg/scp/staging"), graph_12_ids());
    let log = std::fs::read_to_string(repo.path.join(".zerg/monitor.log")).unwrap();
    assert!(log.contains("exited: 2 (checkpoint)"), "{log}");
    assert_eq!(
        git(&repo.path, &["show", "zerg/scp/staging:l1/a3.txt"]),
        "written before the checkpoint"
    );
    let gate = std::fs::read_to_string(repo.path.join(".zerg/logs/gate-noisy-test-level-1.log"))
        .unwrap_or_default();
    assert!(
        gate.ends_with("40000\n/workspace\n"),
        "the gate's output ({} bytes) ends {:?}",
        gate.len(),
        &gate[gate.len().saturating_sub(40)..]
    );
    // The checkpoint was pushed before it was reported: zergd keeps it reachable.
    assert!(!git(&repo.path, &["for-each-ref", "refs/zerg/scp/wip/"]).is_empty());
    wait_nothing_left(st["rush_id"].as_str().unwrap());
}

#[test]
fn a_remote_rush_of_a_spec_that_is_not_committed_is_refused_saying_so() {
    let repo = TestRepo::new();
    repo.write_graph("uc", &graph_12("uc"));
    repo.configure(&swarm_cfg(free_port()));
    std::fs::write(
        repo.path.join(".gsd/specs/uc/design.md"),
        "# uc\n\nChanged after the commit.\n",
    )
    .unwrap();
    let d = Daemon::start();
    let out = d.ctl_in(&repo.path, &["rush", "uc", "--mode", "swarm", "--detach"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(".gsd/specs/uc differs from HEAD") && err.contains("git commit"),
        "{err}"
    );
}

/// Starts a swarm rush of `feature` (graph_12) whose tasks hold their leases for a minute, so
/// it is still running while the test looks at the plane; returns its rush id.
fn start_holding_rush(d: &Daemon, repo: &TestRepo, feature: &str, cfg: &Config) -> String {
    repo.write_graph(feature, &graph_12(feature));
    repo.configure(cfg);
    repo.write_script(
        feature,
        &json!({"default": [{"op": "tick", "count": 600, "interval_ms": 100}, {"op": "write_owned"}]}),
    );
    start_detached_in(d, repo, feature, 1, "swarm");
    d.status(&repo.path, feature).expect("status")["rush_id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Stops a rush and waits until the swarm holds nothing of it.
fn stop_and_sweep(d: &Daemon, repo: &TestRepo, feature: &str, rush_id: &str) {
    let out = d.ctl_in(&repo.path, &["stop", feature, "--force"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    wait_nothing_left(rush_id);
}

/// One zergd serves one address (docs/Configuration-Reference.md, `remote`): while a remote
/// rush runs, another whose `remote.listen` or `remote.advertise_url` differs is refused,
/// naming the address in use; one that asks for the same address starts.
#[test]
fn a_second_remote_rush_that_asks_for_another_address_is_refused_naming_the_one_served() {
    let Some(_swarm) = swarm() else {
        return;
    };
    let port = free_port();
    let served = format!("127.0.0.1:{port}");
    let ctx = cdaemon();
    let d = &ctx.d;
    let first = TestRepo::new();
    let first_id = start_holding_rush(d, &first, "ra", &swarm_cfg(port));
    let other_port = free_port();
    let asks = [
        (swarm_cfg(other_port), format!("127.0.0.1:{other_port}")),
        (
            swarm_cfg(port).set("remote.advertise_url", format!("https://localhost:{port}")),
            served.clone(),
        ),
    ];
    for (cfg, listen) in asks {
        let repo = TestRepo::new();
        repo.write_graph("rb", &graph_12("rb"));
        repo.configure(&cfg);
        let out = d.ctl_in(&repo.path, &["rush", "rb", "--mode", "swarm", "--detach"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "a second address was served: {err}");
        assert!(
            err.contains(&format!(
                "this zergd serves remote workers on {served} (https://{served})"
            )) && err.contains(&format!("remote.listen {listen}")),
            "{err}"
        );
        assert!(
            d.status(&repo.path, "rb").is_none(),
            "the refused rush exists"
        );
    }
    let st = d.status(&first.path, "ra").expect("status");
    assert_eq!(st["state"], "running", "{st}");
    // The same address: a second remote rush shares the plane.
    let same = TestRepo::new();
    let same_id = start_holding_rush(d, &same, "rc", &swarm_cfg(port));
    stop_and_sweep(d, &same, "rc", &same_id);
    stop_and_sweep(d, &first, "ra", &first_id);
    // Once no remote rush uses it, the plane moves to the address the next rush asks for.
    let next = TestRepo::new();
    next.write_graph("rd", &graph_12("rd"));
    next.configure(&swarm_cfg(other_port));
    let mut last = String::new();
    let started = poll(std::time::Duration::from_secs(30), || {
        let out = d.ctl_in(&next.path, &["rush", "rd", "--mode", "swarm", "--detach"]);
        last = String::from_utf8_lossy(&out.stderr).to_string();
        out.status.success()
    });
    assert!(
        started,
        "the plane stayed on {served} after its rushes ended: {last}"
    );
    assert!(
        poll(std::time::Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", other_port)).is_ok()
        }),
        "nothing listens on the new address"
    );
    let next_id = d.status(&next.path, "rd").expect("status")["rush_id"]
        .as_str()
        .unwrap()
        .to_string();
    stop_and_sweep(d, &next, "rd", &next_id);
}

/// The TCP plane sends HTTP/2 keepalive pings every 20 s (docs/Remote-Workers.md,
/// "Keepalives"): a TLS client that trusts zergd's CA opens an HTTP/2 connection, says nothing
/// more, and reads the frames zergd sends until a PING comes.
#[test]
fn the_tcp_plane_pings_an_idle_connection_after_20_seconds() {
    let Some(_swarm) = swarm() else {
        return;
    };
    let port = free_port();
    let ctx = cdaemon();
    let d = &ctx.d;
    let repo = TestRepo::new();
    // A connection that makes no call is closed after remote.handshake_timeout: longer here
    // than the wait for the ping.
    let rush_id = start_holding_rush(
        d,
        &repo,
        "ka",
        &swarm_cfg(port).set("remote.handshake_timeout", 45),
    );
    let ca = std::fs::read(d.state_dir().join("remote/ca.pem")).unwrap();
    let gap = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(first_ping(port, &ca));
    // The lower bound is the claim (pings come after 20 s without a frame); the upper one only
    // bounds a hung test.
    assert!(
        gap >= std::time::Duration::from_secs(19),
        "the plane pinged after {gap:?} of silence"
    );
    stop_and_sweep(d, &repo, "ka", &rush_id);
}

/// Opens an HTTP/2 connection over TLS to the plane on `port` (trusting only `ca_pem`, as a
/// worker does), sends the preface and its settings, acknowledges the server's, and returns
/// how long after its last frame the server's first PING came. Panics if the connection ends
/// or 40 s pass without one.
async fn first_ping(port: u16, ca_pem: &[u8]) -> std::time::Duration {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
    use tokio_rustls::rustls::{ClientConfig, RootCertStore};
    const SETTINGS: u8 = 0x4;
    const PING: u8 = 0x6;
    const ACK: u8 = 0x1;
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem).unwrap())
        .unwrap();
    let mut config = ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .expect("a TLS session with the plane, trusting zergd's CA");
    let frame = |kind: u8, flags: u8| [0, 0, 0, kind, flags, 0, 0, 0, 0];
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    tls.write_all(&frame(SETTINGS, 0)).await.unwrap();
    tls.flush().await.unwrap();
    let mut last_sent = tokio::time::Instant::now();
    let read = async {
        loop {
            let mut head = [0u8; 9];
            if let Err(e) = tls.read_exact(&mut head).await {
                panic!("the plane closed the connection before a PING: {e}");
            }
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let mut payload = vec![0u8; len];
            tls.read_exact(&mut payload).await.unwrap();
            match (head[3], head[4] & ACK) {
                (PING, 0) => return last_sent.elapsed(),
                (SETTINGS, 0) => {
                    tls.write_all(&frame(SETTINGS, ACK)).await.unwrap();
                    tls.flush().await.unwrap();
                    last_sent = tokio::time::Instant::now();
                }
                (0x7, _) => panic!("the plane sent GOAWAY before a PING"),
                _ => {}
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(40), read)
        .await
        .expect("a PING within 40 s")
}
