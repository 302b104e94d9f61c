//! The core rush: graphs, levels, merges, failures, status, stop, escalations.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use zerg_tests::*;

const T: Duration = Duration::from_secs(120);

#[test]
fn twelve_tasks_three_levels_three_workers_complete_on_staging() {
    let repo = TestRepo::new();
    repo.write_graph("feat", &graph_12("feat"));
    // Three level-1 tasks wait for each other, so they run at the same time in three workers.
    let marks = tempfile::tempdir().unwrap();
    let barrier = ["G-L1-001", "G-L1-002", "G-L1-003"];
    let meet = |me: &str| {
        let mut ops = vec![json!({"op": "touch", "path": marks.path().join(me)})];
        ops.extend(barrier.iter().map(
            |t| json!({"op": "wait_for_file", "path": marks.path().join(t), "timeout_ms": 60_000}),
        ));
        ops.push(json!({"op": "write_owned"}));
        ops
    };
    // An agent writes code anywhere it can reach, the spec included.
    let mut vandal = meet("G-L1-002");
    vandal.extend([
        json!({"op": "write", "path": ".gsd/specs/feat/design.md", "content": "vandalised\n"}),
        json!({"op": "write", "path": ".gsd/specs/feat/extra.md", "content": "new\n"}),
    ]);
    repo.write_script(
        "feat",
        &json!({"tasks": {"G-L1-001": meet("G-L1-001"), "G-L1-002": vandal, "G-L1-003": meet("G-L1-003")}}),
    );
    // The tasks that meet say nothing while they wait: no stale detection may cut that short.
    repo.configure(
        &Config::fake_agent()
            .fast_workers()
            .set("workers.task_stale_timeout_seconds", 60)
            .noisy_gate(),
    );
    let head_before = git(&repo.path, &["rev-parse", "HEAD"]);
    let status_before = repo.status_porcelain();
    let d = Daemon::start();
    let out = d.ctl_in(&repo.path, &["rush", "feat", "--workers", "3"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "rush failed: {}\n{stderr}\n{}",
        String::from_utf8_lossy(&out.stdout),
        d.log()
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("complete: 12/12"));
    // Not a terminal: plain lines, no escape codes, and no routine claim lines.
    assert!(
        !stderr.contains('\x1b'),
        "escape codes in piped output: {stderr:?}"
    );
    assert!(!stderr.contains("claimed task"), "{stderr}");
    assert!(
        stderr.contains("Level 1 complete"),
        "the events that matter are there: {stderr}"
    );

    let st = d.status(&repo.path, "feat").expect("status");
    assert_eq!(st["state"], "complete");
    assert_eq!(tasks_with(&st, "complete"), graph_12_ids());
    // Every Task-ID exactly once on staging.
    assert_eq!(repo.task_ids_on("zerg/feat/staging"), graph_12_ids());
    // Each task is one commit `ZERG [<N>]: <title>`, N the worker that ran it, with its Task-ID
    // trailer (docs/state-format.md).
    let graph: Value = serde_json::from_str(&graph_12("feat")).unwrap();
    let titles: std::collections::BTreeMap<&str, &str> = graph["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["id"].as_str().unwrap(), t["title"].as_str().unwrap()))
        .collect();
    let commits = git(
        &repo.path,
        &[
            "log",
            "--no-merges",
            "--format=%s%x1f%(trailers:key=Task-ID,valueonly)%x1e",
            "main..zerg/feat/staging",
        ],
    );
    let mut seen = Vec::new();
    for rec in commits
        .split('\x1e')
        .map(str::trim)
        .filter(|r| !r.is_empty())
    {
        let f: Vec<&str> = rec.split('\x1f').collect();
        let (subject, id) = (f[0], f[1].trim());
        let w = st["tasks"][id]["worker_id"].as_i64().unwrap();
        assert_eq!(subject, format!("ZERG [{w}]: {}", titles[id]), "{id}");
        seen.push(id.to_string());
    }
    seen.sort();
    assert_eq!(seen, graph_12_ids(), "one commit a task:\n{commits}");
    // Every file on staging.
    let files = repo.files_on("zerg/feat/staging");
    for f in (1..=5)
        .map(|i| format!("l1/a{i}.txt"))
        .chain((1..=4).map(|i| format!("l2/b{i}.txt")))
        .chain((1..=3).map(|i| format!("l3/c{i}.txt")))
    {
        assert!(files.contains(&f), "{f} missing on staging: {files:?}");
    }
    // The loud gate passed after every level, and its full output is in its log.
    let gate_log = repo.path.join(".zerg/logs/gate-noisy-test-level-3.log");
    let logged = std::fs::read_to_string(&gate_log).unwrap_or_default();
    assert!(logged.ends_with("40000\n"), "{}", gate_log.display());
    // The committed spec is on staging exactly as on the base, although one task's agent
    // vandalised it in its worktree.
    assert_eq!(
        repo.spec_tree("zerg/feat/staging", "feat"),
        repo.spec_tree(&head_before, "feat")
    );
    // The user's checkout is unchanged.
    assert_eq!(git(&repo.path, &["rev-parse", "HEAD"]), head_before);
    assert_eq!(
        git(&repo.path, &["rev-parse", "--abbrev-ref", "HEAD"]),
        "main"
    );
    let after = repo.status_porcelain();
    assert!(
        after.is_subset(&status_before),
        "user's checkout changed: before {status_before:?}, after {after:?}"
    );
    assert!(
        status_before.iter().all(|l| l.starts_with("??")),
        "{status_before:?}"
    );
    assert!(
        !repo.path.join("l1").exists(),
        "task output leaked into the user's checkout"
    );
    // Three distinct workers did work (the three that met), and the levels merged in order.
    let workers: std::collections::BTreeSet<i64> = barrier
        .iter()
        .filter_map(|t| st["tasks"][t]["worker_id"].as_i64())
        .collect();
    assert_eq!(workers.len(), 3, "work was not spread: {workers:?}\n{st}");
    for l in ["1", "2", "3"] {
        assert_eq!(st["levels"][l]["status"], "complete");
        assert_eq!(st["levels"][l]["merge_status"], "complete");
    }
    // monitor.log has the task lifecycle.
    let log = std::fs::read_to_string(repo.path.join(".zerg/monitor.log")).unwrap();
    for needle in [
        "claimed task G-L1-001",
        "started task G-L1-001",
        "completed task G-L1-001",
        "Level 3 complete",
        "Rush complete",
    ] {
        assert!(log.contains(needle), "monitor.log lacks {needle:?}:\n{log}");
    }
    // Compatible state file, with levels on every task.
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(repo.path.join(".zerg/state/feat.json")).unwrap())
            .unwrap();
    assert_eq!(state["format_version"], 2);
    assert_eq!(state["tasks"]["G-L2-001"]["level"], 2);
    assert_eq!(state["tasks"]["G-L2-001"]["status"], "complete");
    // Compatible heartbeat and progress files. zergd writes them at most every 500 ms, so a
    // rush this short can end before the last ones land.
    let hb_file = repo.path.join(".zerg/state/heartbeat-0.json");
    wait_until(Duration::from_secs(10), "heartbeat-0.json", || {
        hb_file.exists()
    });
    let hb: serde_json::Value = serde_json::from_slice(&std::fs::read(&hb_file).unwrap()).unwrap();
    assert!(hb["timestamp"].is_string() && hb["step"].is_string());
    let progress = repo.path.join(".zerg/state/progress-0.json");
    wait_until(Duration::from_secs(10), "progress-0.json", || {
        progress.exists()
    });
    // Workers are gone and worktrees removed after a complete rush.
    for pid in worker_pids(&st) {
        wait_until(T, &format!("worker {pid} to exit after the rush"), || {
            !alive(pid)
        });
    }
}

#[test]
fn status_json_has_the_documented_keys() {
    let repo = TestRepo::new();
    repo.write_graph("keys", &graph_12("keys"));
    repo.configure(&Config::fake_agent().fast_workers());
    let d = Daemon::start();
    assert!(
        d.ctl_in(&repo.path, &["rush", "keys", "--workers", "2", "--detach"])
            .status
            .success()
    );
    let st = d.wait_end(&repo.path, "keys", T);
    for k in [
        "feature",
        "state",
        "current_level",
        "tasks",
        "workers",
        "levels",
        "resilience",
    ] {
        assert!(st.get(k).is_some(), "missing key {k}");
    }
    let t = &st["tasks"]["G-L1-001"];
    for k in [
        "status",
        "level",
        "worker_id",
        "attempts",
        "error",
        "started_at",
        "duration_ms",
    ] {
        assert!(t.get(k).is_some(), "task missing key {k}: {t}");
    }
    assert!(t["duration_ms"].as_u64().unwrap() > 0, "{t}");
    let w = &st["workers"]["0"];
    for k in ["status", "current_task", "last_heartbeat"] {
        assert!(w.get(k).is_some(), "worker missing key {k}: {w}");
    }
    for k in ["status", "merge_status"] {
        assert!(st["levels"]["1"].get(k).is_some());
    }
    for k in [
        "spawn_retries",
        "stale_detections",
        "task_reassignments",
        "worker_respawns",
        "reconcile_fixes",
    ] {
        assert!(st["resilience"].get(k).is_some(), "resilience missing {k}");
    }
    // Text status renders too, with the resilience section.
    let text =
        String::from_utf8_lossy(&d.ctl_in(&repo.path, &["status", "keys"]).stdout).to_string();
    assert!(text.contains("Resilience:"), "{text}");
    assert!(text.contains("[COMPLETE]"), "{text}");
    assert!(
        text.contains(" took "),
        "each completed task says how long it took: {text}"
    );
    // From outside any repository, the name alone finds a rush zergd knows only once.
    let out = d.ctl_in(Path::new("/"), &["status", "keys", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let elsewhere: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(elsewhere["rush_id"], st["rush_id"]);
    let out = d.ctl_in(Path::new("/"), &["status", "no-such-rush"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("zergd knows no rush named 'no-such-rush'"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn invalid_graphs_are_refused_with_the_problem_named() {
    let repo = TestRepo::new();
    let cyclic = json!({"feature": "cyc", "tasks": [
        {"id": "A", "title": "a", "level": 1, "dependencies": ["B"]},
        {"id": "B", "title": "b", "level": 1, "dependencies": ["A"]}
    ]});
    repo.write_graph("cyc", &cyclic.to_string());
    repo.configure(&Config::fake_agent());
    let d = Daemon::start();
    let out = d.ctl_in(&repo.path, &["rush", "cyc", "--workers", "2"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cycle"), "{err}");
    assert!(err.contains("task A"), "{err}");

    // zergctl validate lists every error offline and exits 1.
    let out = d.ctl_in(&repo.path, &["validate", "cyc"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("error:"), "{text}");
    assert!(text.contains("cycle"), "{text}");

    // Same-level file conflict.
    let conflict = json!({"feature": "own", "tasks": [
        {"id": "A", "title": "a", "level": 1, "files": {"create": ["x.txt"], "modify": [], "read": []}},
        {"id": "B", "title": "b", "level": 1, "files": {"create": [], "modify": ["x.txt"], "read": []}}
    ]});
    repo.write_graph("own", &conflict.to_string());
    let out = d.ctl_in(&repo.path, &["validate", "own"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("x.txt"));

    // JSON syntax errors give line and column.
    repo.write_graph("bad", "{\n  \"feature\": \"bad\",\n  \"tasks\": [\n}\n");
    let out = d.ctl_in(&repo.path, &["validate", "bad"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(":4:"), "{text}");

    // A valid graph validates.
    repo.write_graph("ok", &graph_12("ok"));
    let out = d.ctl_in(&repo.path, &["validate", "ok"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // Bad config: the error names the key path.
    repo.configure(&Config::new().set("workers.retry_attempts", "many"));
    let out = d.ctl_in(&repo.path, &["rush", "ok", "--workers", "1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("workers.retry_attempts"));
}

#[test]
fn a_task_that_fails_for_good_ends_the_rush_with_dependents_blocked() {
    let repo = TestRepo::new();
    repo.write_graph("fail", &graph_12("fail"));
    repo.configure(
        &Config::fake_agent()
            .fast_workers()
            .set("workers.retry_attempts", 1),
    );
    // G-L1-002 exits 1 on both its attempts (every L2 and L3 task depends on it); the cause is
    // gone by the attempt after `retry`.
    let boom = json!([{"op": "stderr", "text": "boom"}, {"op": "exit", "code": 1}]);
    repo.write_script(
        "fail",
        &json!({"tasks": {"G-L1-002": {"attempts": [boom, boom, [{"op": "write_owned"}]]}}}),
    );
    let d = Daemon::start();
    let out = d.ctl_in(&repo.path, &["rush", "fail", "--workers", "3"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("failed"), "{stdout}");
    let st = d.status(&repo.path, "fail").unwrap();
    assert_eq!(st["state"], "failed");
    assert_eq!(tasks_with(&st, "failed"), vec!["G-L1-002"]);
    assert_eq!(
        st["tasks"]["G-L1-002"]["attempts"], 2,
        "one retry, then failed"
    );
    assert!(
        st["tasks"]["G-L1-002"]["error"]
            .as_str()
            .unwrap()
            .contains("agent exited 1")
    );
    let blocked = tasks_with(&st, "blocked");
    assert_eq!(
        blocked.len(),
        7,
        "all L2 and L3 tasks are blocked: {blocked:?}"
    );
    // The independent level-1 tasks completed and were merged.
    assert_eq!(tasks_with(&st, "complete").len(), 4);
    assert_eq!(repo.task_ids_on("zerg/fail/staging").len(), 4);

    // Retry once the cause is gone completes the rush.
    let out = d.ctl_in(&repo.path, &["retry", "fail"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = d.wait_end(&repo.path, "fail", T);
    assert_eq!(st["state"], "complete", "{st}");
    assert_eq!(repo.task_ids_on("zerg/fail/staging"), graph_12_ids());
}

#[test]
fn stop_really_stops_the_workers() {
    let repo = TestRepo::new();
    repo.write_graph("stop", &graph_12("stop"));
    repo.configure(
        &Config::fake_agent()
            .set("workers.stop_grace_seconds", 1)
            .set("workers.heartbeat_interval_seconds", 0.5),
    );
    repo.write_script("stop", &json!({"default": [{"op": "hang"}]}));
    let d = Daemon::start();
    assert!(
        d.ctl_in(&repo.path, &["rush", "stop", "--workers", "2", "--detach"])
            .status
            .success()
    );
    let st = d.wait_for(&repo.path, "stop", T, "two running tasks", |s| {
        tasks_with(s, "in_progress").len() == 2
    });
    let pids = worker_pids(&st);
    assert_eq!(pids.len(), 2);
    let out = d.ctl_in(&repo.path, &["stop", "stop"]);
    assert!(out.status.success());
    let st = d.wait_end(&repo.path, "stop", T);
    assert_eq!(st["state"], "stopped");
    assert!(tasks_with(&st, "in_progress").is_empty());
    for pid in pids {
        wait_until(T, &format!("worker {pid} to exit after stop"), || {
            !alive(pid)
        });
    }
    // The hanging fake agents (children in the worker's process group) are gone too.
    let out = std::process::Command::new("pgrep")
        .args(["-f", "fake-claude"])
        .output()
        .unwrap();
    let survivors = String::from_utf8_lossy(&out.stdout).to_string();
    for line in survivors.lines() {
        let pid: i32 = line.trim().parse().unwrap_or(0);
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_default();
        assert!(
            !cwd.starts_with(&repo.path),
            "fake agent {pid} in {cwd:?} survived stop"
        );
    }
    // Resuming reports the rush's own worker count, not the CLI's default.
    let out = d.ctl_in(&repo.path, &["rush", "stop", "--detach"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("Resumed rush stop") && stdout.contains("with 2 "),
        "{stdout}"
    );
    let _ = d.ctl_in(&repo.path, &["stop", "stop", "--force"]);
}

#[test]
fn escalations_out_of_scope_changes_and_logs_are_reported() {
    let repo = TestRepo::new();
    let graph = json!({"feature": "esc", "tasks": [
        {"id": "E-L1-001", "title": "ambiguous", "level": 1, "files": {"create": ["a.txt"], "modify": [], "read": []}},
        {"id": "E-L1-002", "title": "sloppy", "level": 1, "files": {"create": ["b.txt"], "modify": [], "read": []}}
    ]});
    repo.write_graph("esc", &graph.to_string());
    repo.configure(&Config::fake_agent().fast_workers());
    repo.write_script("esc", &json!({"tasks": {
        "E-L1-001": [{"op": "escalate", "category": "ambiguous_spec", "message": "which format?"}],
        "E-L1-002": [{"op": "write_owned"}, {"op": "write", "path": "stray.txt", "content": "x"}, {"op": "print", "text": "did extra work"}]
    }}));
    let d = Daemon::start();
    let out = d.ctl_in(&repo.path, &["rush", "esc", "--workers", "2"]);
    assert_eq!(out.status.code(), Some(1));
    let st = d.status(&repo.path, "esc").unwrap();
    let esc = &st["escalations"][0];
    assert_eq!(esc["task_id"], "E-L1-001");
    assert_eq!(esc["category"], "ambiguous_spec");
    assert_eq!(esc["message"], "which format?");
    assert_eq!(st["tasks"]["E-L1-001"]["status"], "failed");
    let file: serde_json::Value = serde_json::from_slice(
        &std::fs::read(repo.path.join(".zerg/state/escalations.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(file["escalations"][0]["category"], "ambiguous_spec");
    // The agent's context object is kept.
    assert_eq!(file["escalations"][0]["context"]["attempted"], json!([]));
    // The worker's exit 4 is observed (the slot is then respawned, so look at the log).
    let monitor = std::fs::read_to_string(repo.path.join(".zerg/monitor.log")).unwrap();
    assert!(monitor.contains("exited: 4 (escalation)"), "{monitor}");
    // Out-of-scope change recorded as a warning.
    assert_eq!(
        st["tasks"]["E-L1-002"]["out_of_scope"],
        json!(["stray.txt"])
    );
    assert!(
        st["warnings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w.as_str().unwrap().contains("stray.txt"))
    );
    // Logs.
    let out = d.ctl_in(&repo.path, &["logs", "esc", "--tail", "50"]);
    assert!(out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("[W"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let art = std::fs::read_to_string(repo.path.join(".zerg/logs/tasks/E-L1-002/agent-output.txt"))
        .unwrap();
    assert!(art.contains("did extra work"));
}

#[test]
fn zergctl_explains_a_missing_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(bin("zergctl"))
        .args(["status"])
        .env("ZERG_SOCKET", dir.path().join("none.sock"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("zergd is not running"), "{err}");
    assert!(err.contains("zergd &"), "{err}");
    // Bad usage is EX_USAGE.
    let out = std::process::Command::new(bin("zergctl"))
        .args(["rush"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
}

#[test]
fn the_socket_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let d = Daemon::start();
    let mode = std::fs::metadata(&d.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let dir_mode = std::fs::metadata(d.socket.parent().unwrap())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(dir_mode, 0o700);
    // A second daemon on the same socket refuses to start.
    let out = std::process::Command::new(bin("zergd"))
        .arg("--socket")
        .arg(&d.socket)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already running"));
}

#[test]
fn zergd_refuses_a_socket_directory_that_others_can_write_to() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("shared");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let out = std::process::Command::new(bin("zergd"))
        .arg("--socket")
        .arg(dir.join("zergd.sock"))
        .arg("--state-dir")
        .arg(t.path().join("state"))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&dir.display().to_string())
            && err.contains("can be written by group or others (mode 1777)"),
        "{err}"
    );
    assert!(!dir.join("zergd.sock").exists(), "no socket was made there");
}

#[test]
fn another_user_is_refused_on_the_control_socket_even_when_the_file_mode_allows_it() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    if !nix::unistd::geteuid().is_root() {
        skip("switching to another uid needs root");
        return;
    }
    let d = Daemon::start();
    // Open the file-mode gate on purpose: the peer-credential check must hold by itself.
    let dir = d.socket.parent().unwrap();
    for p in [dir, dir.parent().unwrap()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = std::process::Command::new(bin("zergctl"))
        .args(["list"])
        .env("ZERG_SOCKET", &d.socket)
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "another uid was served: {stderr}");
    assert!(
        stderr.contains("uid 65534 may not use zergd's control socket"),
        "{stderr}"
    );
    assert!(d.log().contains("refused a control call from another user"));
    // zergd's own user still gets through.
    assert!(d.ctl(&["list"]).status.success());
}

/// The demo runs as a new user would run it on a fresh machine: no git identity anywhere (an
/// empty home, no system config), and a zergd that has never run.
#[test]
fn the_demo_runs() {
    let home = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(bin("zergctl"))
        .args(["demo", "--workers", "2", "--keep"])
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path().join(".config"))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env_remove("GIT_CONFIG_GLOBAL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("complete: 6/6"), "{stdout}");
    assert!(stdout.contains("modified by DEMO-L3-001"), "{stdout}");
    // No stray line from zergd's log writer.
    assert!(!stderr.contains("Error reading the log"), "{stderr}");
    // The demo repository has an identity of its own: every commit on staging is by it.
    let kept = stdout
        .lines()
        .find_map(|l| l.strip_prefix("Kept "))
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| panic!("{stdout}"));
    let who = git(
        &kept.join("repo"),
        &["log", "--format=%an <%ae>|%cn <%ce>", "zerg/demo/staging"],
    );
    let _ = std::fs::remove_dir_all(&kept);
    assert!(
        who.lines()
            .all(|l| l == "zerg demo <demo@zerg.invalid>|zerg demo <demo@zerg.invalid>"),
        "{who}"
    );
}

#[test]
fn a_merge_conflict_pauses_the_rush_and_names_files_and_tasks() {
    let repo = TestRepo::new();
    let graph = json!({"feature": "mc", "tasks": [
        {"id": "M-L1-001", "title": "owner", "level": 1, "files": {"create": ["x.txt"], "modify": [], "read": []}},
        {"id": "M-L1-002", "title": "trespasser", "level": 1, "files": {"create": ["y.txt"], "modify": [], "read": []}},
        {"id": "M-L2-001", "title": "later", "level": 2, "dependencies": ["M-L1-001"], "files": {"create": ["z.txt"], "modify": [], "read": []}}
    ]});
    repo.write_graph("mc", &graph.to_string());
    // The tasks that meet say nothing while they wait: no stale detection may cut that short.
    // `merge.resolve: pause`: a person resolves conflicts.
    repo.configure(
        &Config::fake_agent()
            .fast_workers()
            .set("workers.task_stale_timeout_seconds", 60)
            .set("merge.resolve", "pause"),
    );
    // M-L1-002 writes the file M-L1-001 owns, with other content: the two branches conflict.
    // The two wait for each other, so they run at the same time in two workers (one worker
    // doing both would build the second on the first, with nothing to conflict).
    let marks = tempfile::tempdir().unwrap();
    let mark = |n: &str| marks.path().join(n);
    let meet = |me: &str, other: &str| {
        vec![
            json!({"op": "touch", "path": mark(me)}),
            json!({"op": "wait_for_file", "path": mark(other), "timeout_ms": 60_000}),
        ]
    };
    let mut owner = meet("owner", "trespasser");
    owner.push(json!({"op": "write_owned"}));
    let mut trespasser = meet("trespasser", "owner");
    trespasser.extend([
        json!({"op": "write_owned"}),
        json!({"op": "write", "path": "x.txt", "content": "not yours\n"}),
    ]);
    repo.write_script(
        "mc",
        &json!({"tasks": {"M-L1-001": owner, "M-L1-002": trespasser}}),
    );
    let d = Daemon::start();
    let out = d.ctl_in(&repo.path, &["rush", "mc", "--workers", "2"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let st = d.status(&repo.path, "mc").unwrap();
    assert_eq!(st["state"], "paused", "{st}");
    assert_eq!(st["levels"]["1"]["merge_status"], "conflict");
    assert_eq!(st["levels"]["1"]["conflicts"], json!(["x.txt"]));
    let reason = st["reason"].as_str().unwrap();
    assert!(
        reason.contains("x.txt") && reason.contains("M-L1-001"),
        "{reason}"
    );
    // Level 2 did not start on an unmerged level.
    assert_eq!(st["tasks"]["M-L2-001"]["status"], "pending");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("paused"), "{text}");
}

/// A repository whose two level-1 tasks append different lines to `notes.txt` (the second out
/// of its scope) at the same time in two workers, so that their branches conflict; `resolve`
/// is what the stand-in agent does as the resolution task.
fn conflicting_notes(resolve: serde_json::Value, attempts: u32) -> (TestRepo, tempfile::TempDir) {
    let repo = TestRepo::new();
    std::fs::write(repo.path.join("notes.txt"), "# notes\n").unwrap();
    git(&repo.path, &["add", "notes.txt"]);
    git(&repo.path, &["commit", "-q", "-m", "notes"]);
    // Two level-1 tasks append different lines to the same file (the second out of its scope).
    let graph = json!({"feature": "rc", "tasks": [
        {"id": "R-L1-001", "title": "first note", "description": "Append the first note.",
         "level": 1, "files": {"create": [], "modify": ["notes.txt"], "read": []},
         "verification": {"command": "grep -qx 'first' notes.txt"}},
        {"id": "R-L1-002", "title": "second note", "description": "Append the second note.",
         "level": 1, "files": {"create": ["b.txt"], "modify": [], "read": []},
         "verification": {"command": "grep -qx 'second' notes.txt && test -f b.txt"}},
        {"id": "R-L2-001", "title": "later", "level": 2,
         "dependencies": ["R-L1-001", "R-L1-002"],
         "files": {"create": ["z.txt"], "modify": [], "read": ["notes.txt"]},
         "verification": {"command": "grep -qx first notes.txt && grep -qx second notes.txt"}}
    ]});
    repo.write_graph("rc", &graph.to_string());
    repo.configure(
        &Config::fake_agent()
            .fast_workers()
            .set("workers.task_stale_timeout_seconds", 60)
            .set("merge.resolve_attempts", attempts),
    );
    let marks = tempfile::tempdir().unwrap();
    let mark = |n: &str| marks.path().join(n);
    let meet = |me: &str, other: &str| {
        vec![
            json!({"op": "touch", "path": mark(me)}),
            json!({"op": "wait_for_file", "path": mark(other), "timeout_ms": 60_000}),
        ]
    };
    let mut first = meet("first", "second");
    first.push(json!({"op": "append", "path": "notes.txt", "content": "first\n"}));
    let mut second = meet("second", "first");
    second.extend([
        json!({"op": "write_owned"}),
        json!({"op": "append", "path": "notes.txt", "content": "second\n"}),
    ]);
    repo.write_script(
        "rc",
        &json!({"tasks": {"R-L1-001": first, "R-L1-002": second,
                          "RESOLVE-L1-W1": resolve.clone(), "RESOLVE-L1-W0": resolve}}),
    );
    (repo, marks)
}

#[test]
fn a_merge_conflict_becomes_a_resolution_task_that_keeps_both_lines_and_the_rush_completes() {
    // The stand-in resolves by keeping both sides: it drops git's marker lines.
    let resolve = json!([{"op": "shell", "command":
        "sed -i -e '/^<<<<<<< /d' -e '/^=======$/d' -e '/^>>>>>>> /d' notes.txt"}]);
    let (repo, _marks) = conflicting_notes(resolve, 2);
    let d = Daemon::start();
    let out = d.ctl_in(&repo.path, &["rush", "rc", "--workers", "2"]);
    let st = d.status(&repo.path, "rc").unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{st}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(st["state"], "complete", "{st}");
    // The live view (plain lines without a terminal) said so.
    let shown = said(&out);
    assert!(shown.contains("; resolution task RESOLVE-L1-W"), "{shown}");
    // The resolution task is in the status like any task, and says what it resolved.
    let resolution = st["tasks"]
        .as_object()
        .unwrap()
        .iter()
        .find(|(id, _)| id.starts_with("RESOLVE-L1-W"))
        .map(|(id, t)| (id.clone(), t.clone()))
        .expect("a resolution task");
    assert_eq!(resolution.1["status"], "complete", "{st}");
    assert!(
        resolution.1["title"]
            .as_str()
            .is_some_and(|t| t.contains("notes.txt")
                && t.contains("R-L1-001")
                && t.contains("R-L1-002")),
        "{resolution:?}"
    );
    // Staging holds both lines, and every Task-ID once.
    let notes = git(&repo.path, &["show", "zerg/rc/staging:notes.txt"]);
    assert_eq!(
        notes.lines().filter(|l| *l == "first").count(),
        1,
        "{notes}"
    );
    assert_eq!(
        notes.lines().filter(|l| *l == "second").count(),
        1,
        "{notes}"
    );
    assert!(
        !notes.contains("<<<<<<<") && !notes.contains(">>>>>>>"),
        "{notes}"
    );
    let mut ids = repo.task_ids_on("zerg/rc/staging");
    ids.sort();
    let mut want = vec![
        "R-L1-001".to_string(),
        "R-L1-002".to_string(),
        "R-L2-001".to_string(),
        resolution.0.clone(),
    ];
    want.sort();
    assert_eq!(ids, want);
    let log = std::fs::read_to_string(repo.path.join(".zerg/monitor.log")).unwrap();
    assert!(
        log.contains(&format!("resolution task {} queued", resolution.0)),
        "{log}"
    );
}

#[test]
fn a_resolution_in_progress_survives_a_kill_9_of_zergd() {
    let go = tempfile::tempdir().unwrap();
    let resolve = json!([
        {"op": "wait_for_file", "path": go.path().join("go"), "timeout_ms": 120_000},
        {"op": "shell", "command":
            "sed -i -e '/^<<<<<<< /d' -e '/^=======$/d' -e '/^>>>>>>> /d' notes.txt"}
    ]);
    let (repo, _marks) = conflicting_notes(resolve, 2);
    let mut d = Daemon::start();
    let out = d.ctl_in(&repo.path, &["rush", "rc", "--workers", "2", "--detach"]);
    assert!(out.status.success(), "{}", said(&out));
    d.wait_for(
        &repo.path,
        "rc",
        Duration::from_secs(120),
        "the resolution task running",
        |s| {
            s["tasks"].as_object().is_some_and(|t| {
                t.iter()
                    .any(|(id, t)| id.starts_with("RESOLVE-") && t["status"] == "in_progress")
            })
        },
    );
    d.restart();
    std::fs::write(go.path().join("go"), "").unwrap();
    let st = d.wait_end(&repo.path, "rc", Duration::from_secs(120));
    assert_eq!(st["state"], "complete", "{st}\n{}", d.log());
    let notes = git(&repo.path, &["show", "zerg/rc/staging:notes.txt"]);
    assert!(
        notes.lines().any(|l| l == "first")
            && notes.lines().any(|l| l == "second")
            && !notes.contains("<<<<<<<"),
        "{notes}"
    );
}

#[test]
fn a_resolution_that_fails_its_attempts_pauses_the_rush_naming_the_files() {
    // The stand-in leaves the markers in: the verification refuses every attempt.
    let (repo, _marks) = conflicting_notes(json!([{"op": "print", "text": "left as is"}]), 2);
    let d = Daemon::start();
    let out = d.ctl_in(&repo.path, &["rush", "rc", "--workers", "2"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let st = d.status(&repo.path, "rc").unwrap();
    assert_eq!(st["state"], "paused", "{st}");
    assert_eq!(st["levels"]["1"]["conflicts"], json!(["notes.txt"]));
    let reason = st["reason"].as_str().unwrap();
    assert!(reason.contains("notes.txt"), "{reason}");
    let failed: Vec<(&String, &Value)> = st["tasks"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(id, _)| id.starts_with("RESOLVE-"))
        .collect();
    assert_eq!(failed.len(), 1, "{st}");
    assert_eq!(failed[0].1["status"], "failed", "{st}");
    assert_eq!(failed[0].1["attempts"], 2, "{st}");
    assert_eq!(st["tasks"]["R-L2-001"]["status"], "pending");
}

#[test]
fn a_fresh_rush_never_deletes_unmerged_work_of_an_earlier_one() {
    let repo = TestRepo::new();
    repo.write_graph("keep", &graph_12("keep"));
    repo.configure(&Config::fake_agent().fast_workers());
    // A worker branch left by an earlier rush, with a commit that is not on main.
    git(&repo.path, &["branch", "zerg/keep/worker-1"]);
    git(
        &repo.path,
        &["worktree", "add", "-q", "../wt", "zerg/keep/worker-1"],
    );
    let wt = repo.path.parent().unwrap().join("wt");
    std::fs::write(wt.join("precious.txt"), "work\n").unwrap();
    git(&wt, &["add", "-A"]);
    git(&wt, &["commit", "-q", "-m", "unmerged work"]);
    let d = Daemon::start();
    let out = d.ctl_in(&repo.path, &["rush", "keep", "--workers", "2"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("zerg/keep/worker-1") && err.contains("not on main"),
        "{err}"
    );
    // The branch and its commit are still there.
    assert!(
        git(&repo.path, &["log", "--format=%s", "zerg/keep/worker-1"]).contains("unmerged work")
    );
}

#[test]
fn a_hostile_environment_neither_redirects_git_nor_leaks_the_api_key() {
    const KEY: &str = "sk-zerg-e2e-secret-0123456789abcdef";
    let repo = TestRepo::new();
    repo.write_graph("envf", &graph_12("envf"));
    repo.configure(&Config::fake_agent().fast_workers());
    // What the agent CLI of one task sees, dumped outside the repository.
    let seen = tempfile::tempdir().unwrap();
    let dump = seen.path().join("env");
    repo.write_script(
        "envf",
        &json!({"default": [{"op": "write_owned"}],
                "tasks": {"G-L1-001": [
                    {"op": "shell", "command": format!("env > {}", dump.display())},
                    {"op": "write_owned"}]}}),
    );
    // As if zergd were started from a shell inside another repository, with a preload set and
    // another tool's credentials in its environment.
    let d = Daemon::start_with_env(vec![
        ("GIT_DIR".into(), "/nonexistent/.git".into()),
        ("GIT_WORK_TREE".into(), "/nonexistent".into()),
        ("ANTHROPIC_API_KEY".into(), KEY.into()),
        ("OTHER_TOOL_TOKEN".into(), "do-not-pass".into()),
    ]);
    let out = d.ctl_in(&repo.path, &["rush", "envf", "--workers", "3"]);
    assert!(
        out.status.success(),
        "{}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
    assert_eq!(repo.task_ids_on("zerg/envf/staging"), graph_12_ids());
    // The key reaches workers through their environment only: no file zerg wrote has it.
    let mut files = Vec::new();
    let mut stack = vec![
        repo.path.join(".zerg"),
        d.socket.parent().unwrap().to_path_buf(),
    ];
    if let Some(root) = d.socket.parent().and_then(|p| p.parent()) {
        stack.push(root.to_path_buf());
    }
    while let Some(p) = stack.pop() {
        if p.is_dir() {
            for e in std::fs::read_dir(&p).unwrap().flatten() {
                stack.push(e.path());
            }
        } else if p.is_file() {
            files.push(p);
        }
    }
    assert!(files.len() > 10, "{files:?}");
    for f in files {
        let bytes = std::fs::read(&f).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(KEY),
            "the API key is in {}",
            f.display()
        );
    }
    let st = d.ctl_in(&repo.path, &["status", "envf", "--json"]);
    assert!(!String::from_utf8_lossy(&st.stdout).contains(KEY));
    // The agent CLI got the key, and only what the allowlist lets through.
    let env = std::fs::read_to_string(&dump).unwrap();
    assert!(env.contains(&format!("ANTHROPIC_API_KEY={KEY}")), "{env}");
    assert!(env.lines().any(|l| l.starts_with("PATH=")), "{env}");
    for absent in [
        "OTHER_TOOL_TOKEN=",
        "GIT_DIR=",
        "GIT_WORK_TREE=",
        "ZERG_WORKER_TOKEN=",
    ] {
        assert!(
            !env.lines().any(|l| l.starts_with(absent)),
            "{absent} reached the agent CLI:\n{env}"
        );
    }
}

#[test]
fn init_then_rush_works_on_a_fresh_repository_with_exactly_what_init_wrote() {
    let repo = TestRepo::new();
    // The agent CLI as users have it: `claude` on PATH (here the fake one).
    let bin = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(zerg_tests::bin("fake-claude"), bin.path().join("claude")).unwrap();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let d = Daemon::start_with_env(vec![("PATH".into(), path)]);
    let out = d.ctl_in(&repo.path, &["init"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(said.contains("created  .zerg/config.yaml"), "{said}");
    let config = std::fs::read_to_string(repo.path.join(".zerg/config.yaml")).unwrap();
    // Idempotent: a second run keeps everything.
    let again = d.ctl_in(&repo.path, &["init"]);
    assert!(String::from_utf8_lossy(&again.stdout).contains("kept     .zerg/config.yaml"));
    assert_eq!(
        std::fs::read_to_string(repo.path.join(".zerg/config.yaml")).unwrap(),
        config
    );

    repo.write_graph("fresh", &graph_12("fresh"));
    let out = d.ctl_in(&repo.path, &["rush", "fresh", "--workers", "3", "--detach"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let warnings =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        !warnings.contains("unknown key"),
        "init's config has no unknown key: {warnings}"
    );
    let st = d.wait_end(&repo.path, "fresh", T);
    assert_eq!(st["state"], "complete", "{st}");
    // zerg's working files are ignored: the user's checkout shows nothing new but the config.
    let dirty: Vec<String> = repo
        .status_porcelain()
        .into_iter()
        .filter(|l| !l.ends_with(".gitignore") && !l.ends_with(".zerg/config.yaml"))
        .collect();
    assert!(dirty.is_empty(), "{dirty:?}");
}

/// One gRPC call made with curl over the control socket (HTTP/2 with prior knowledge, the
/// `:authority` set to `localhost`): the framed request body in, the response body out.
fn curl_grpc(socket: &Path, method: &str, message: &[u8]) -> (bool, Vec<u8>, String) {
    let dir = tempfile::tempdir().unwrap();
    let body = dir.path().join("req");
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(message);
    std::fs::write(&body, framed).unwrap();
    let out = std::process::Command::new("curl")
        .args(["-sS", "--http2-prior-knowledge", "--unix-socket"])
        .arg(socket)
        .args([
            "-H",
            "content-type: application/grpc",
            "-H",
            "te: trailers",
            "--data-binary",
        ])
        .arg(format!("@{}", body.display()))
        .arg(format!("http://localhost/{method}"))
        .output()
        .expect("curl runs");
    (
        out.status.success(),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn a_client_that_is_not_rust_drives_the_control_api_and_discovers_it_by_reflection() {
    if let Err(e) = std::process::Command::new("curl").arg("--version").output() {
        skip(&format!("cannot run curl ({e}): install curl"));
        return;
    }
    let repo = TestRepo::new();
    repo.write_graph("curl", &graph_12("curl"));
    repo.configure(&Config::fake_agent().fast_workers());
    let d = Daemon::start();
    assert!(
        d.ctl_in(&repo.path, &["rush", "curl", "--workers", "2", "--detach"])
            .status
            .success()
    );
    d.wait_end(&repo.path, "curl", T);
    // Control.List with an empty ListRequest: the reply carries the rush's feature name.
    let (ok, body, err) = curl_grpc(&d.socket, "zerg.v1.Control/List", &[]);
    assert!(ok, "{err}");
    assert!(body.len() > 5 && body[0] == 0, "a gRPC frame: {body:?}");
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.contains("curl") && text.contains(&*repo.path.to_string_lossy()),
        "{text}"
    );
    // Reflection: ServerReflectionRequest { list_services: "" } (field 7, empty string).
    let (ok, body, err) = curl_grpc(
        &d.socket,
        "grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        &[0x3a, 0x00],
    );
    assert!(ok, "{err}");
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("zerg.v1.Control"), "{text}");
    assert!(
        !text.contains("zerg.v1.Worker"),
        "only the control service is advertised: {text}"
    );
}

/// tmux with a socket of the test's own; killed when dropped.
struct Tmux(tempfile::TempDir);

impl Tmux {
    fn run(&self, args: &[&str]) -> std::process::Output {
        std::process::Command::new("tmux")
            .arg("-S")
            .arg(self.0.path().join("tmux.sock"))
            .args(args)
            .output()
            .expect("tmux runs")
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

#[test]
fn the_live_view_on_a_terminal_has_one_line_per_worker_and_no_routine_lines() {
    if let Err(e) = std::process::Command::new("tmux").arg("-V").output() {
        skip(&format!("cannot run tmux ({e}): install tmux"));
        return;
    }
    let repo = TestRepo::new();
    repo.write_graph("lv", &graph_12("lv"));
    repo.configure(&Config::fake_agent().fast_workers());
    // Slow tasks, so that the screen is captured mid-level.
    repo.write_script(
        "lv",
        &json!({"default": [{"op": "tick", "count": 30, "interval_ms": 200}, {"op": "write_owned"}]}),
    );
    let d = Daemon::start();
    let tmux = Tmux(tempfile::tempdir().unwrap());
    let cmd = format!(
        "ZERG_SOCKET={} {} rush lv --workers 3; sleep 60",
        d.socket.display(),
        zerg_tests::bin("zergctl").display()
    );
    let repo_dir = repo.path.to_string_lossy().to_string();
    let out = tmux.run(&[
        "new-session",
        "-d",
        "-x",
        "160",
        "-y",
        "40",
        "-c",
        &repo_dir,
        &cmd,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    d.wait_for(&repo.path, "lv", T, "three tasks running", |s| {
        tasks_with(s, "in_progress").len() == 3
    });
    // The view redraws a few times a second; look until it shows every worker at its task.
    let mut screen = String::new();
    poll(T, || {
        screen = String::from_utf8_lossy(&tmux.run(&["capture-pane", "-p"]).stdout).to_string();
        (0..3).all(|w| {
            screen.lines().any(|l| {
                l.trim_start().starts_with(&format!("W{w} "))
                    && l.contains("running")
                    && l.contains("-L1-")
            })
        })
    });
    for w in 0..3 {
        let lines: Vec<&str> = screen
            .lines()
            .filter(|l| l.trim_start().starts_with(&format!("W{w} ")))
            .collect();
        assert_eq!(lines.len(), 1, "one line for worker {w}:\n{screen}");
        assert!(
            lines[0].contains("running") && lines[0].contains("-L1-"),
            "{screen}"
        );
    }
    assert!(screen.contains("L1 "), "a bar per level:\n{screen}");
    assert!(
        !screen.contains("claimed task"),
        "no routine claim lines:\n{screen}"
    );
    assert!(
        !screen.contains("started task"),
        "no routine start lines:\n{screen}"
    );
    let _ = d.ctl_in(&repo.path, &["stop", "lv", "--force"]);
}

#[test]
fn a_verification_that_prints_10_mb_passes_and_a_failing_one_shows_its_tail_in_status() {
    let repo = TestRepo::new();
    let loud = "head -c 10000000 /dev/zero | tr '\\0' x; echo";
    let graph = json!({"feature": "loud", "tasks": [
        {"id": "L-L1-001", "title": "loud and fine", "level": 1,
         "files": {"create": ["ok.txt"], "modify": [], "read": []},
         "verification": {"command": loud, "timeout_seconds": 120}},
        {"id": "L-L1-002", "title": "loud and broken", "level": 1,
         "files": {"create": ["bad.txt"], "modify": [], "read": []},
         "verification": {"command": format!("{loud}; echo 'assertion failed: left == right'; exit 1"),
                          "timeout_seconds": 120}}
    ]});
    repo.write_graph("loud", &graph.to_string());
    repo.configure(
        &Config::fake_agent()
            .fast_workers()
            .set("workers.retry_attempts", 0),
    );
    let d = Daemon::start();
    let out = d.ctl_in(&repo.path, &["rush", "loud", "--workers", "2"]);
    assert!(!out.status.success(), "one task fails its verification");
    let st = d.status(&repo.path, "loud").expect("status");
    assert_eq!(st["tasks"]["L-L1-001"]["status"], "complete", "{st}");
    let t = &st["tasks"]["L-L1-002"];
    assert_eq!(t["status"], "failed", "{t}");
    let error = t["error"].as_str().unwrap();
    assert!(
        error.contains("assertion failed: left == right"),
        "the tail is in status: {error}"
    );
    assert!(
        error.len() < 4096,
        "and only the tail: {} bytes",
        error.len()
    );
    // The whole output is in the task's log.
    let log = repo
        .path
        .join(".zerg/logs/tasks/L-L1-002/verification-tier2.txt");
    let size = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    assert!(size > 10_000_000, "{} has {size} bytes", log.display());
}

#[test]
fn a_graph_with_thousands_of_warnings_keeps_fifty_and_counts_the_rest() {
    // 3 levels of 40 independent tasks: the 80 tasks above level 1 are unreachable, and the 40
    // of level 2 are orphans too: 120 warnings.
    let repo = TestRepo::new();
    repo.write_graph("gw", &graph_wide("gw", 3, 40));
    repo.configure(&Config::fake_agent().fast_workers());
    repo.write_script("gw", &json!({"default": [{"op": "write_owned"}]}));
    let d = Daemon::start();
    let out = d.ctl_in(&repo.path, &["rush", "gw", "--workers", "2", "--detach"]);
    assert!(out.status.success(), "{out:?}");
    let st = d.status(&repo.path, "gw").unwrap();
    let graph: Vec<&str> = st["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w.as_str())
        .filter(|w| w.starts_with("task graph: "))
        .collect();
    assert_eq!(graph.len(), 51, "{graph:#?}");
    assert_eq!(
        graph[50],
        "task graph: 70 more warnings; `zergctl validate gw` lists them all"
    );
    let validate = d.ctl_in(&repo.path, &["validate", "gw"]);
    assert!(
        String::from_utf8_lossy(&validate.stdout).contains("120 warnings")
            || String::from_utf8_lossy(&validate.stderr).contains("120 warnings"),
        "{validate:?}"
    );
}

#[test]
fn one_worker_starts_the_task_with_the_longest_chain_behind_it_first() {
    let repo = TestRepo::new();
    let t = |id: &str, level: u32, deps: &[&str]| {
        let file = format!("{}.txt", id.to_lowercase());
        json!({
            "id": id, "title": format!("Make {file}"), "level": level,
            "description": format!("Create {file}"), "dependencies": deps,
            "files": {"create": [file.clone()], "modify": [], "read": []},
            "verification": {"command": format!("test -f {file}"), "timeout_seconds": 30}
        })
    };
    // In graph order, the task with nothing behind it comes first and the one with two levels
    // behind it last.
    let graph = json!({"feature": "cp", "version": "2.0", "tasks": [
        t("C-L1-001", 1, &[]),
        t("C-L1-002", 1, &[]),
        t("C-L1-003", 1, &[]),
        t("C-L2-001", 2, &["C-L1-002"]),
        t("C-L2-002", 2, &["C-L1-003"]),
        t("C-L3-001", 3, &["C-L2-002"]),
    ]});
    repo.write_graph("cp", &graph.to_string());
    repo.configure(&Config::fake_agent().fast_workers());
    let d = Daemon::start();
    succeeded(&d.ctl_in(&repo.path, &["rush", "cp", "--workers", "1", "--detach"]));
    let st = d.wait_end(&repo.path, "cp", T);
    assert_eq!(st["state"], "complete", "{st}");
    let log = std::fs::read_to_string(repo.path.join(".zerg/monitor.log")).unwrap();
    let claimed: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split("claimed task ").nth(1))
        .map(|rest| rest.split_whitespace().next().unwrap_or(""))
        .collect();
    assert_eq!(
        claimed,
        [
            "C-L1-003", "C-L1-002", "C-L1-001", "C-L2-002", "C-L2-001", "C-L3-001"
        ],
        "{log}"
    );
}
