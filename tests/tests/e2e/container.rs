//! Container mode on the machine's real Docker engine (issue: container mode, FR-7).
//!
//! These tests skip, saying why, when no engine is reachable. With `ZERG_REQUIRE_DOCKER=1`
//! (set by CI when the engine is present) a missing engine is a failure instead.

use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::{Value, json};
use zerg_tests::*;

pub(crate) const T: Duration = Duration::from_secs(240);
pub(crate) const IMAGE: &str = "zerg-worker:e2e";

/// Builds the test image once (offline: host binaries plus the fake agent CLI and `zerg-attack`; cached by the
/// builder). Returns false when no engine answers `docker info` and skipping is allowed
/// ([`docker_or_skip`]).
pub(crate) fn docker_ready() -> bool {
    static BUILT: OnceLock<()> = OnceLock::new();
    if !docker_or_skip() {
        return false;
    }
    BUILT.get_or_init(|| {
        let out = Command::new(bin("zergctl"))
            .args(["image", "build", "--offline", "--tag", IMAGE, "--with"])
            .arg(bin("fake-claude"))
            // What hostile code inside a remote worker runs (it has no mounts to bring it in).
            .arg("--with")
            .arg(bin("zerg-attack"))
            .arg("--agent")
            .arg(bin("zerg-worker-agent"))
            .output()
            .expect("zergctl runs");
        assert!(
            out.status.success(),
            "zergctl image build failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    true
}

/// The config of a container rush: the image's fake agent CLI, `image`, small resource limits,
/// and lenient heartbeat limits (container tests exercise crashes and restarts, not staleness,
/// and a loaded machine must not add false stale detections).
pub(crate) fn container_cfg(image: &str) -> Config {
    Config::new()
        .agent_command(&["fake-claude", "--print", "--dangerously-skip-permissions"])
        .set("agent.timeout_seconds", 120)
        .set("container.image", image)
        .set("resources.container_memory_limit", "512m")
        .set("resources.container_cpu_limit", 1.0)
        .set("workers.heartbeat_interval_seconds", 0.5)
        .set("workers.heartbeat_stale_threshold", 15)
        .set("workers.task_stale_timeout_seconds", 30)
        .set("workers.backoff_base_seconds", 0.1)
        .set("workers.backoff_max_seconds", 0.5)
        .set("workers.spawn_backoff_base_seconds", 0.1)
        .set("workers.spawn_backoff_max_seconds", 0.5)
        .set("workers.stop_grace_seconds", 1)
        .set("workers.spawn_ready_timeout_seconds", 60)
}

/// Writes [`container_cfg`] into the repository.
pub(crate) fn container_config(repo: &TestRepo, image: &str) {
    repo.configure(&container_cfg(image));
}

/// A zergd for container tests. The fake agent CLI counts attempts across containers in a
/// directory of the test's (mounted into every worker at the same path, as `FAKE_CLAUDE_*`
/// paths are), and `marks` is a directory the agent can leave marker files in.
pub(crate) struct Ctx {
    pub(crate) d: Daemon,
    pub(crate) marks: std::path::PathBuf,
    pub(crate) _dir: tempfile::TempDir,
}

pub(crate) fn cdaemon() -> Ctx {
    cdaemon_with(vec![])
}

/// [`cdaemon`] with more variables in zergd's environment.
pub(crate) fn cdaemon_with(extra: Vec<(String, String)>) -> Ctx {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("fake-state");
    let marks = dir.path().join("marks");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::create_dir_all(&marks).unwrap();
    let mut env = vec![
        (
            "FAKE_CLAUDE_STATE_DIR".into(),
            state.to_string_lossy().into(),
        ),
        (
            "FAKE_CLAUDE_MARK_DIR".into(),
            marks.to_string_lossy().into(),
        ),
    ];
    env.extend(extra);
    let d = Daemon::start_with_env(env);
    Ctx {
        d,
        marks,
        _dir: dir,
    }
}

pub(crate) fn docker(args: &[&str]) -> String {
    let out = Command::new("docker")
        .args(args)
        .output()
        .expect("docker runs");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Starts a detached container rush of `feature` with `workers` workers.
#[track_caller]
pub(crate) fn start_detached(d: &Daemon, repo: &TestRepo, feature: &str, workers: u32) {
    start_detached_in(d, repo, feature, workers, "container");
}

/// Starts a detached rush of `feature` with `workers` workers in `mode`.
#[track_caller]
pub(crate) fn start_detached_in(
    d: &Daemon,
    repo: &TestRepo,
    feature: &str,
    workers: u32,
    mode: &str,
) {
    let n = workers.to_string();
    let out = d.ctl_in(
        &repo.path,
        &["rush", feature, "--workers", &n, "--mode", mode, "--detach"],
    );
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
}

/// Waits until `n` workers of the rush are in their agent CLI.
pub(crate) fn wait_implementing(d: &Daemon, repo: &TestRepo, feature: &str, n: usize) -> Value {
    d.wait_for(&repo.path, feature, T, "workers in their agent CLI", |s| {
        s["workers"].as_object().is_some_and(|w| {
            w.values()
                .filter(|x| x["status"] == "running" && x["step"] == "implementing")
                .count()
                == n
        })
    })
}

/// Containers (running or not) of a rush, by label.
pub(crate) fn containers_of(rush_id: &str, all: bool) -> Vec<String> {
    let filter = format!("label=zerg.rush={rush_id}");
    let mut args = vec!["ps", "-q", "--filter", filter.as_str()];
    if all {
        args.push("-a");
    }
    docker(&args)
        .lines()
        .map(str::to_string)
        .filter(|l| !l.is_empty())
        .collect()
}

pub(crate) fn wait_no_containers(rush_id: &str) {
    assert!(
        poll(T, || containers_of(rush_id, true).is_empty()),
        "containers left behind: {:?}",
        containers_of(rush_id, true)
    );
}

/// The container of the worker running `task`.
pub(crate) fn container_running(st: &Value, task: &str) -> Option<String> {
    running_worker(st, task)?.container_id
}

#[test]
fn a_twelve_task_rush_completes_in_containers_and_leaves_none_running() {
    if !docker_ready() {
        return;
    }
    let repo = TestRepo::new();
    repo.write_graph("ct", &graph_12("ct"));
    repo.configure(&container_cfg(IMAGE).noisy_gate());
    // One task proves the spec is readable inside the container: its agent copies
    // task-graph.json from the spec mount (the worktree's sparse checkout leaves the committed
    // copy out) into the file it owns.
    repo.write_script(
        "ct",
        &json!({"tasks": {"G-L1-001": [
            {"op": "shell", "command": "mkdir -p l1 && cat \"$ZERG_SPEC_DIR/task-graph.json\" > l1/a1.txt"}
        ]}}),
    );
    let ctx = cdaemon();
    let d = &ctx.d;
    let out = d.ctl_in(
        &repo.path,
        &["rush", "ct", "--workers", "3", "--mode", "container"],
    );
    assert!(
        out.status.success(),
        "{}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    let st = d.status(&repo.path, "ct").unwrap();
    assert_eq!(st["state"], "complete");
    assert_eq!(st["mode"], "container");
    assert_eq!(repo.task_ids_on("zerg/ct/staging"), graph_12_ids());
    assert!(
        st["workers"]["0"]["container_id"]
            .as_str()
            .is_some_and(|c| !c.is_empty())
    );
    // The committed spec is on staging byte for byte as on the base commit.
    assert_eq!(
        repo.spec_tree("zerg/ct/staging", "ct"),
        repo.spec_tree("main", "ct")
    );
    // What G-L1-001's agent read from the spec mount is the graph.
    assert_eq!(
        git(&repo.path, &["show", "zerg/ct/staging:l1/a1.txt"]),
        git(&repo.path, &["show", "main:.gsd/specs/ct/task-graph.json"]),
        "the spec was not readable inside the container"
    );
    let rush_id = st["rush_id"].as_str().unwrap().to_string();
    wait_no_containers(&rush_id);
    // Inside the containers (sparse checkout, private git dir, the real store as alternate)
    // each task was committed in process: the workers went to the git program only to reset
    // their worktree when a level started on a new base.
    let mut logs = String::new();
    for e in std::fs::read_dir(repo.path.join(".zerg/logs"))
        .unwrap()
        .flatten()
    {
        if e.path().is_file() {
            logs.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
        }
    }
    let other: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("git fallback") && !l.contains("worktree reset"))
        .collect();
    assert!(other.is_empty(), "{other:#?}");
    assert!(logs.contains("committed"), "no worker log read");
    // The host's git is intact.
    repo.wait_worktrees_removed();
    git(&repo.path, &["fsck", "--no-progress"]);
    assert_eq!(
        git(&repo.path, &["rev-parse", "--abbrev-ref", "HEAD"]),
        "main"
    );
}

#[test]
fn a_worker_container_runs_hardened_with_the_spec_read_only() {
    if !docker_ready() {
        return;
    }
    let repo = TestRepo::new();
    repo.write_graph("hard", &graph_12("hard"));
    container_config(&repo, IMAGE);
    repo.write_script("hard", &json!({"default": [{"op": "tick", "count": 80, "interval_ms": 100}, {"op": "write_owned"}]}));
    let ctx = cdaemon();
    let d = &ctx.d;
    start_detached(d, &repo, "hard", 1);
    let st = d.wait_for(&repo.path, "hard", T, "a running container", |s| {
        container_running(s, "G-L1-001").is_some()
    });
    let id = container_running(&st, "G-L1-001").unwrap();
    let inspect: Value = serde_json::from_str(&docker(&["inspect", &id])).expect("inspect JSON");
    let c = &inspect[0];
    let user = c["Config"]["User"].as_str().unwrap_or("");
    assert!(
        !user.is_empty() && !user.starts_with("0:") && user != "0" && user != "root",
        "runs as {user:?}"
    );
    assert_eq!(c["HostConfig"]["CapDrop"], json!(["ALL"]));
    let secopt = c["HostConfig"]["SecurityOpt"].to_string();
    assert!(secopt.contains("no-new-privileges"), "{secopt}");
    assert!(c["HostConfig"]["Memory"].as_i64().unwrap() > 0);
    assert!(c["HostConfig"]["NanoCpus"].as_i64().unwrap() > 0);
    assert!(c["HostConfig"]["PidsLimit"].as_i64().unwrap() > 0);
    let mounts = c["Mounts"].as_array().unwrap();
    let spec = mounts
        .iter()
        .find(|m| m["Destination"] == "/workspace/.gsd/specs/hard")
        .unwrap_or_else(|| panic!("no spec mount: {mounts:?}"));
    assert_eq!(spec["RW"], false, "spec mount must be read-only");
    assert!(
        mounts
            .iter()
            .all(|m| !m["Source"].as_str().unwrap_or("").contains("docker.sock")),
        "docker.sock mounted: {mounts:?}"
    );
    assert!(
        mounts
            .iter()
            .any(|m| m["Destination"] == "/workspace" && m["RW"] == true)
    );
    // Inside: task-graph.json is readable at the expected path, and the process is not root.
    let out = Command::new("docker")
        .args([
            "exec",
            &id,
            "sh",
            "-c",
            "test -r /workspace/.gsd/specs/hard/task-graph.json && id -u",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(String::from_utf8_lossy(&out.stdout).trim(), "0");
    let _ = d.ctl_in(&repo.path, &["stop", "hard", "--force"]);
    wait_no_containers(st["rush_id"].as_str().unwrap());
}

#[test]
fn docker_kill_of_a_worker_container_mid_task_is_reassigned() {
    if !docker_ready() {
        return;
    }
    let repo = TestRepo::new();
    let ctx = cdaemon();
    let d = &ctx.d;
    repo.write_graph("dk", &graph_12("dk"));
    container_config(&repo, IMAGE);
    repo.write_script(
        "dk",
        &json!({"tasks": {"G-L2-001": {"attempts": [
            [{"op": "touch", "path": ctx.marks.join("dk-mid-task")}, {"op": "tick", "count": 600, "interval_ms": 100}],
            [{"op": "write_owned"}]
        ]}}}),
    );
    start_detached(d, &repo, "dk", 3);
    let st = d.wait_for(&repo.path, "dk", T, "G-L2-001 in a container", |s| {
        container_running(s, "G-L2-001").is_some()
    });
    let id = container_running(&st, "G-L2-001").unwrap();
    // Kill only once the agent CLI is really running inside the container.
    let mid = ctx.marks.join("dk-mid-task");
    wait_until(T, "the agent to start G-L2-001", || mid.exists());
    docker(&["kill", &id]);
    let st = d.wait_end(&repo.path, "dk", T);
    assert_eq!(st["state"], "complete", "{st}\n{}", d.log());
    assert_eq!(repo.task_ids_on("zerg/dk/staging"), graph_12_ids());
    let log = std::fs::read_to_string(repo.path.join(".zerg/monitor.log")).unwrap();
    assert_eq!(st["tasks"]["G-L2-001"]["crashes"], 1, "{log}");
    assert_eq!(st["tasks"]["G-L2-001"]["attempts"], 1, "{log}");
    assert!(
        log.contains("crashed: 137") || log.contains("crashed: signal 9") || log.contains("OOM"),
        "{log}"
    );
    wait_no_containers(st["rush_id"].as_str().unwrap());
}

#[test]
fn a_missing_image_is_retried_then_refused_with_its_name_while_status_answers() {
    if !docker_ready() {
        return;
    }
    let repo = TestRepo::new();
    repo.write_graph("mi", &graph_12("mi"));
    // Slower backoff so the retries are observable.
    repo.configure(
        &Config::new()
            .set("container.image", "zerg-worker:missing")
            .set("workers.spawn_retry_attempts", 3)
            .set("workers.spawn_backoff_base_seconds", 2)
            .set("workers.spawn_backoff_max_seconds", 4),
    );
    let ctx = cdaemon();
    let d = &ctx.d;
    start_detached(d, &repo, "mi", 2);
    // While spawns are being retried, status answers (the loop never blocks on a retry).
    let st = d.wait_for(&repo.path, "mi", T, "a spawn retry in backoff", |s| {
        s["workers"]
            .as_object()
            .is_some_and(|w| w.values().any(|x| x["status"] == "backoff"))
    });
    // Each backoff lasts about 4 s. Status answers again and again within one of them: the
    // worker is still waiting out the same failed attempt, not past it as it would be had
    // zergd's loop slept through the backoff before answering.
    let waiting: Vec<(String, Value)> = st["workers"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, w)| w["status"] == "backoff")
        .map(|(id, w)| (id.clone(), w["reason"].clone()))
        .collect();
    for _ in 0..5 {
        let now = d.status(&repo.path, "mi").expect("status answers");
        for (id, reason) in &waiting {
            assert_eq!(now["workers"][id]["status"], "backoff", "{now}");
            assert_eq!(&now["workers"][id]["reason"], reason, "{now}");
        }
        assert!(d.ctl_in(&repo.path, &["status", "mi"]).status.success());
    }
    assert!(
        st["workers"]["0"]["reason"]
            .as_str()
            .unwrap_or("")
            .contains("zerg-worker:missing")
            || st["workers"]["1"]["reason"]
                .as_str()
                .unwrap_or("")
                .contains("zerg-worker:missing"),
        "{st}"
    );
    let st = d.wait_end(&repo.path, "mi", T);
    assert_eq!(st["state"], "failed");
    let reason = st["reason"].as_str().unwrap();
    assert!(
        reason.contains("image zerg-worker:missing not found"),
        "{reason}"
    );
    assert!(reason.contains("zergctl image build"), "{reason}");
    assert_eq!(st["resilience"]["spawn_retries"], 6);
}

#[test]
fn after_kill_9_of_zergd_with_containers_running_none_is_left_behind() {
    if !docker_ready() {
        return;
    }
    let repo = TestRepo::new();
    repo.write_graph("zc", &graph_12("zc"));
    container_config(&repo, IMAGE);
    repo.write_script("zc", &json!({"default": [{"op": "tick", "count": 8, "interval_ms": 100}, {"op": "write_owned"}]}));
    let mut ctx = cdaemon();
    let d = &mut ctx.d;
    start_detached(d, &repo, "zc", 3);
    let st = d.wait_for(&repo.path, "zc", T, "three running containers", |s| {
        s["workers"]
            .as_object()
            .is_some_and(|w| w.values().filter(|x| x["status"] == "running").count() == 3)
    });
    let rush_id = st["rush_id"].as_str().unwrap().to_string();
    assert!(!containers_of(&rush_id, false).is_empty());
    d.kill9();
    std::thread::sleep(Duration::from_millis(500));
    d.restart();
    let st = d.wait_end(&repo.path, "zc", T);
    assert_eq!(st["state"], "complete", "{st}\n{}", d.log());
    assert_eq!(repo.task_ids_on("zerg/zc/staging"), graph_12_ids());
    let log = std::fs::read_to_string(repo.path.join(".zerg/monitor.log")).unwrap();
    assert!(log.contains("zergd restarted; resuming rush zc"), "{log}");
    assert!(
        log.contains("reconnected after zergd restart"),
        "containers were not re-adopted:\n{log}"
    );
    wait_no_containers(&rush_id);
}

/// The worker's own worktree on the host.
pub(crate) fn worktree_of(repo: &TestRepo, feature: &str, worker: &str) -> std::path::PathBuf {
    repo.path
        .join(".zerg-worktrees")
        .join(feature)
        .join(format!("worker-{worker}"))
}

/// An environment variable of a container, from `docker inspect`.
pub(crate) fn container_env(id: &str, key: &str) -> String {
    let inspect: Value = serde_json::from_str(&docker(&["inspect", id])).expect("inspect JSON");
    inspect[0]["Config"]["Env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_probe_inside_a_worker_container_reaches_nothing_it_must_not() {
    if !docker_ready() {
        return;
    }
    let repo = TestRepo::new();
    repo.write_graph("iso", &graph_12("iso"));
    container_config(&repo, IMAGE);
    repo.write_script(
        "iso",
        &json!({"default": [{"op": "tick", "count": 1200, "interval_ms": 100}, {"op": "write_owned"}]}),
    );
    let ctx = cdaemon();
    let d = &ctx.d;
    start_detached(d, &repo, "iso", 2);
    let st = wait_implementing(d, &repo, "iso", 2);
    let rush_id = st["rush_id"].as_str().unwrap().to_string();
    let id_of = |w: &str| {
        st["workers"][w]["container_id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (a, b) = (id_of("0"), id_of("1"));
    let staging_before = git(&repo.path, &["rev-parse", "zerg/iso/staging"]);
    let state_path = repo.path.join(".zerg/state/iso.json");

    // The probe is a client binary in the worktree, as an agent could have written one.
    let probe = worktree_of(&repo, "iso", "0").join("zerg-probe");
    std::fs::copy(bin("zerg-probe"), &probe).unwrap();
    let other_token = container_env(&b, "ZERG_WORKER_TOKEN");
    assert_eq!(other_token.len(), 64, "worker 1 has a token");
    let out = Command::new("docker")
        .args(["exec", &a, "/workspace/zerg-probe", "--feature", "iso"])
        .args(["--other-token", &other_token, "--other-worker", "1"])
        .arg("--socket")
        .arg(&d.socket)
        .output()
        .unwrap();
    std::fs::remove_file(&probe).unwrap();
    assert!(
        out.status.success(),
        "probe failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("probe JSON");
    eprintln!("probe report: {report:#}");

    // No socket inside answers a control RPC; the worker plane is there and refuses it.
    let sockets = report["sockets"].as_array().unwrap();
    assert!(
        sockets
            .iter()
            .any(|s| s["path"] == "/zerg/run/worker.sock" && s["control"] == "Unimplemented"),
        "{report:#}"
    );
    for s in sockets {
        assert_ne!(s["control"], "answered", "{s} serves the control plane");
    }
    assert_eq!(report["docker_sock"], false);
    assert_eq!(report["state_dir_inside"], false);

    // Moving staging from inside (git succeeds: in the container's private git dir) has no
    // effect on the host.
    assert_eq!(report["staging_update_ref"], "ok", "{report:#}");
    assert_eq!(
        git(&repo.path, &["rev-parse", "zerg/iso/staging"]),
        staging_before
    );
    // Writing the state file from inside has no effect on the host.
    let state = std::fs::read_to_string(&state_path).unwrap();
    assert!(!state.contains("zerg-probe"), "state file overwritten");
    let doc: Value = serde_json::from_str(&state).expect("state file is intact JSON");
    assert_eq!(doc["rush"]["rush_id"], rush_id.as_str());

    // Worker RPCs without a token, with another worker's, or for another worker are refused.
    assert_eq!(report["rpc_no_token"], "Unauthenticated", "{report:#}");
    assert_eq!(report["rpc_other_token"], "PermissionDenied", "{report:#}");
    assert_eq!(report["rpc_other_worker"], "PermissionDenied", "{report:#}");

    // The rush is unharmed: both workers still hold their leases.
    let st = d.status(&repo.path, "iso").unwrap();
    assert_eq!(st["state"], "running", "{st}");
    assert_eq!(tasks_with(&st, "in_progress").len(), 2, "{st}");
    let _ = d.ctl_in(&repo.path, &["stop", "iso", "--force"]);
    wait_no_containers(&rush_id);
}

#[test]
fn a_failed_container_rush_leaves_no_container_behind() {
    if !docker_ready() {
        return;
    }
    let repo = TestRepo::new();
    repo.write_graph("cf", &graph_12("cf"));
    repo.configure(&container_cfg(IMAGE).set("workers.retry_attempts", 0));
    repo.write_script(
        "cf",
        &json!({"tasks": {"G-L1-003": [{"op": "print", "text": "cannot do it"}, {"op": "exit", "code": 1}]}}),
    );
    let ctx = cdaemon();
    let d = &ctx.d;
    let out = d.ctl_in(
        &repo.path,
        &["rush", "cf", "--workers", "3", "--mode", "container"],
    );
    assert!(!out.status.success());
    let st = d.status(&repo.path, "cf").unwrap();
    assert_eq!(st["state"], "failed", "{st}");
    wait_no_containers(st["rush_id"].as_str().unwrap());
}

#[test]
fn stop_force_removes_a_container_whose_agent_ignores_sigterm() {
    if !docker_ready() {
        return;
    }
    let repo = TestRepo::new();
    repo.write_graph("st", &graph_12("st"));
    // A grace period no wait below outlasts: the containers can only go in time if `--force`
    // skips it.
    repo.configure(&container_cfg(IMAGE).set("workers.stop_grace_seconds", 3600));
    repo.write_script(
        "st",
        &json!({"default": [{"op": "shell", "command": "trap '' TERM; while :; do sleep 1; done"}]}),
    );
    let ctx = cdaemon();
    let d = &ctx.d;
    start_detached(d, &repo, "st", 2);
    let st = wait_implementing(d, &repo, "st", 2);
    let rush_id = st["rush_id"].as_str().unwrap().to_string();
    assert_eq!(containers_of(&rush_id, false).len(), 2);
    let out = d.ctl_in(&repo.path, &["stop", "st", "--force"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `--force` has no grace period: the engine kills at once, and the containers go.
    wait_no_containers(&rush_id);
    assert_eq!(d.status(&repo.path, "st").unwrap()["state"], "stopped");
}
