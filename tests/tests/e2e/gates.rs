//! Quality gates of a container rush run in a fresh container of the rush's image
//! (`gates.run_on: worker-image`, the default), not on zergd's machine: a gate script a worker
//! committed cannot write a host file, reach zergd's sockets or change the staging worktree,
//! a gate that exits 1 fails its level with its output, staging holding that level and nothing
//! past it, and a gate that hangs is killed at its timeout and leaves no container.
//! `gates.run_on: host` runs them on the host, and the rush says so when it starts.
//!
//! Like the other container tests these skip without a Docker engine, and fail instead under
//! `ZERG_REQUIRE_DOCKER=1`.

use serde_json::json;
use zerg_tests::*;

use crate::container::{
    IMAGE, T, cdaemon, container_cfg, docker, docker_ready, start_detached, wait_no_containers,
};

/// Gate containers of `rush_id`, running or not.
fn gate_containers(rush_id: &str) -> Vec<String> {
    docker(&[
        "ps",
        "-aq",
        "--filter",
        &format!("label=zerg.gate={rush_id}"),
    ])
    .lines()
    .filter(|l| !l.is_empty())
    .map(str::to_string)
    .collect()
}

/// The script G-L1-001 commits and the `probe` gate runs: it tries to write `escape` (a host
/// path), to reach zergd's control socket and to write into the staging worktree, and prints
/// what it could do. It exits 0.
fn probe_script(escape: &std::path::Path, socket: &std::path::Path) -> String {
    format!(
        r#"if echo escaped > {e} 2>/dev/null; then echo host-file: written; else echo host-file: blocked; fi
if [ -e {s} ]; then echo socket: reachable; else echo socket: unreachable; fi
if touch /zerg/staging/pwned 2>/dev/null || touch ../staging/pwned 2>/dev/null; then echo staging: written; else echo staging: read-only; fi
echo gate-ran-in "$(pwd)"
exit 0
"#,
        e = escape.display(),
        s = socket.display()
    )
}

/// Writes the graph, the config (with the `probe` gate) and a script whose G-L1-001 commits
/// `gate.sh`.
fn setup(repo: &TestRepo, feature: &str, cfg: Config, script: &str) {
    repo.write_graph(feature, &graph_12(feature));
    repo.configure(&cfg.set(
        "quality_gates",
        json!([{"name": "probe", "command": "sh ./gate.sh", "required": true, "timeout": 60}]),
    ));
    let write = format!("cat > gate.sh <<'ZERG_GATE_EOF'\n{script}ZERG_GATE_EOF\n");
    repo.write_script(
        feature,
        &json!({"tasks": {"G-L1-001": [{"op": "shell", "command": write}, {"op": "write_owned"}]}}),
    );
}

/// A completed container rush of `feature` with `cfg`, whose G-L1-001 committed the probe
/// script that the `probe` gate runs; `escape` is the host file it tries to write.
struct Probe {
    ctx: crate::container::Ctx,
    repo: TestRepo,
    escape: std::path::PathBuf,
    st: serde_json::Value,
    _outside: tempfile::TempDir,
}

fn probe_rush(feature: &str, cfg: Config) -> Probe {
    let ctx = cdaemon();
    let outside = tempfile::tempdir().unwrap();
    let escape = outside.path().join("escape");
    let repo = TestRepo::new();
    setup(&repo, feature, cfg, &probe_script(&escape, &ctx.d.socket));
    start_detached(&ctx.d, &repo, feature, 2);
    let st = ctx.d.wait_end(&repo.path, feature, T);
    assert_eq!(st["state"], "complete", "{st}\n{}", ctx.d.log());
    Probe {
        ctx,
        repo,
        escape,
        st,
        _outside: outside,
    }
}

#[test]
fn a_gate_a_worker_committed_runs_in_the_worker_image_and_touches_nothing_on_the_host() {
    if !docker_ready() {
        return;
    }
    // The temporary directory stays until the end, so a file the gate wrote would be seen.
    let Probe {
        ctx,
        repo,
        escape,
        st,
        _outside,
    } = probe_rush("gi", container_cfg(IMAGE));
    let rush_id = st["rush_id"].as_str().unwrap();
    // The gate ran (in the container's scratch copy), and what it returned is the result.
    let log = std::fs::read_to_string(repo.path.join(".zerg/logs/gate-probe-level-1.log"))
        .unwrap_or_else(|e| panic!("no gate log: {e}\n{}", ctx.d.log()));
    assert!(log.contains("gate-ran-in /workspace"), "{log}");
    assert!(log.contains("host-file: blocked"), "{log}");
    assert!(log.contains("socket: unreachable"), "{log}");
    assert!(log.contains("staging: read-only"), "{log}");
    assert!(!escape.exists(), "the gate wrote a file on the host");
    assert!(
        gate_containers(rush_id).is_empty(),
        "a gate container is left"
    );
    assert!(
        !st["warnings"].to_string().contains("gates.run_on: host"),
        "{st}"
    );
    wait_no_containers(rush_id);
}

#[test]
fn with_gates_run_on_host_the_rush_warns_and_the_gate_runs_on_the_host() {
    if !docker_ready() {
        return;
    }
    let Probe {
        ctx: _ctx,
        escape,
        st,
        _outside,
        ..
    } = probe_rush(
        "gh",
        // Unconfined: with the sandbox (the default where bubblewrap runs) a host gate reaches
        // none of this, as `sandbox.rs` shows.
        container_cfg(IMAGE)
            .set("gates.run_on", "host")
            .set("sandbox.mode", "off"),
    );
    assert!(
        st["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap_or("").starts_with("gates.run_on: host")),
        "{st}"
    );
    // What the warning names happened: the worker's script wrote a file on the host.
    assert_eq!(
        std::fs::read_to_string(&escape).unwrap_or_default(),
        "escaped\n"
    );
    wait_no_containers(st["rush_id"].as_str().unwrap());
}

#[test]
fn a_gate_that_hangs_in_the_worker_image_is_killed_at_its_timeout_and_leaves_no_container() {
    if !docker_ready() {
        return;
    }
    let ctx = cdaemon();
    let d = &ctx.d;
    let repo = TestRepo::new();
    let st = paused_by_gate(
        d,
        &repo,
        "gt",
        json!({"name": "hang", "command": "echo started; sleep 600", "required": true, "timeout": 3}),
    );
    let reason = st["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("quality gate 'hang' failed") && reason.contains("timed out after 3 s"),
        "{st}"
    );
    assert!(
        reason.contains("started"),
        "the gate's output is not in the reason: {st}"
    );
    let rush_id = st["rush_id"].as_str().unwrap();
    assert!(
        gate_containers(rush_id).is_empty(),
        "the hung gate's container is left: {:?}",
        gate_containers(rush_id)
    );
    staging_holds_only_level_1(&repo, "gt");
    let out = d.ctl_in(&repo.path, &["stop", "gt"]);
    assert!(out.status.success());
}

/// Runs a two-worker container rush of the 12-task graph with `gate` as its one quality gate,
/// and returns its status once the gate's failure has paused it.
fn paused_by_gate(
    d: &Daemon,
    repo: &TestRepo,
    feature: &str,
    gate: serde_json::Value,
) -> serde_json::Value {
    repo.write_graph(feature, &graph_12(feature));
    repo.configure(&container_cfg(IMAGE).set("quality_gates", json!([gate])));
    start_detached(d, repo, feature, 2);
    d.wait_for(&repo.path, feature, T, "the gate's failure", |s| {
        s["state"] == "paused"
    })
}

/// Staging holds the level whose gate failed and nothing past it (the fix is committed on top
/// of it, then `zergctl retry` runs the gates again): every commit since `main` is a level-1
/// task or a level-1 merge, and each level-1 task's is there.
fn staging_holds_only_level_1(repo: &TestRepo, feature: &str) {
    let staging = format!("zerg/{feature}/staging");
    let log = git(
        &repo.path,
        &["log", "--format=%s", &format!("main..{staging}")],
    );
    let subjects: Vec<&str> = log.lines().collect();
    assert!(
        subjects
            .iter()
            .all(|s| s.contains("(level 1)") || s.contains("Level one")),
        "{staging} moved past the level whose gate failed:\n{log}"
    );
    let l1 = graph_12_ids()
        .iter()
        .filter(|id| id.starts_with("G-L1-"))
        .count();
    assert_eq!(
        subjects.iter().filter(|s| s.contains("Level one")).count(),
        l1,
        "{log}"
    );
}

#[test]
fn a_gate_that_exits_1_in_the_worker_image_fails_the_level_with_its_output_and_nothing_past_it() {
    if !docker_ready() {
        return;
    }
    let ctx = cdaemon();
    let d = &ctx.d;
    let repo = TestRepo::new();
    // The image's own shell prints where it runs, so the output is the container's.
    let st = paused_by_gate(
        d,
        &repo,
        "gx",
        json!({"name": "broken", "command": "echo \"gate-in $(pwd)\"; echo 'error[E0425]: cannot find value' >&2; exit 1", "required": true, "timeout": 60}),
    );
    let reason = st["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("quality gate 'broken' failed on staging after level 1"),
        "{st}"
    );
    assert!(
        reason.contains("cannot find value") && reason.contains("gate-in /workspace"),
        "the gate's output tail is not in the reason: {st}"
    );
    assert_eq!(st["levels"]["1"]["merge_status"], "failed", "{st}");
    // Level 2 never started: nothing past level 1 ran.
    for (id, t) in st["tasks"].as_object().unwrap() {
        if !id.starts_with("G-L1-") {
            assert_eq!(t["status"], "pending", "{id}: {st}");
        }
    }
    staging_holds_only_level_1(&repo, "gx");
    assert!(gate_containers(st["rush_id"].as_str().unwrap()).is_empty());
    let out = d.ctl_in(&repo.path, &["stop", "gx"]);
    assert!(out.status.success());
}

/// Waits until the rush has a gate container, and returns its id.
fn wait_gate_container(d: &Daemon, rush_id: &str) -> String {
    assert!(
        poll(T, || !gate_containers(rush_id).is_empty()),
        "no gate container started\n{}",
        d.log()
    );
    gate_containers(rush_id)[0].clone()
}

/// Whether container `id` still exists, running or not.
fn exists(id: &str) -> bool {
    !docker(&["ps", "-aq", "--filter", &format!("id={id}")]).is_empty()
}

#[test]
fn a_gate_container_is_removed_when_the_rush_stops_and_after_zergd_is_killed() {
    if !docker_ready() {
        return;
    }
    let hang = json!([{"name": "hang", "command": "sleep 600", "required": true, "timeout": 600}]);
    let mut ctx = cdaemon();
    let d = &mut ctx.d;
    // zergctl stop: the gate is killed and its container removed.
    let repo = TestRepo::new();
    repo.write_graph("gs", &graph_12("gs"));
    repo.configure(&container_cfg(IMAGE).set("quality_gates", hang.clone()));
    start_detached(d, &repo, "gs", 2);
    let st = d.wait_for(&repo.path, "gs", T, "the rush's id", |s| {
        s["rush_id"].is_string()
    });
    let rush_id = st["rush_id"].as_str().unwrap().to_string();
    let gate = wait_gate_container(d, &rush_id);
    let out = d.ctl_in(&repo.path, &["stop", "gs"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        poll(T, || !exists(&gate)),
        "the gate's container outlived the stop\n{}",
        d.log()
    );

    // kill -9 of zergd mid-gate: the next zergd removes the container it left.
    let repo = TestRepo::new();
    repo.write_graph("gk", &graph_12("gk"));
    repo.configure(&container_cfg(IMAGE).set("quality_gates", hang));
    start_detached(d, &repo, "gk", 2);
    let st = d.wait_for(&repo.path, "gk", T, "the rush's id", |s| {
        s["rush_id"].is_string()
    });
    let rush_id = st["rush_id"].as_str().unwrap().to_string();
    let gate = wait_gate_container(d, &rush_id);
    d.kill9();
    assert!(exists(&gate), "the gate's container went with zergd");
    d.restart();
    assert!(
        poll(T, || !exists(&gate)),
        "the restarted zergd left the gate's container\n{}",
        d.log()
    );
    assert!(
        d.log()
            .contains("removed gate containers a previous zergd left"),
        "{}",
        d.log()
    );
    let out = d.ctl_in(&repo.path, &["stop", "gk"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        poll(T, || gate_containers(&rush_id).is_empty()),
        "{:?}",
        gate_containers(&rush_id)
    );
}
