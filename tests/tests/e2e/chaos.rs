//! Chaos tests (FR-1 to FR-6, FR-8): a rush with nobody watching must finish, with every
//! task completed and every Task-ID on staging exactly once.

use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, poll as poll_fds};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};
use zerg_tests::*;

const T: Duration = Duration::from_secs(180);

/// Asserts the end state every chaos test shares.
fn assert_complete_exactly_once(d: &Daemon, repo: &TestRepo, feature: &str) -> Value {
    let st = d.wait_end(&repo.path, feature, T);
    assert_eq!(
        st["state"],
        "complete",
        "rush did not complete: {}\n{}",
        serde_json::to_string_pretty(&st).unwrap(),
        d.log()
    );
    assert_eq!(tasks_with(&st, "complete"), graph_12_ids());
    assert_eq!(
        repo.task_ids_on(&format!("zerg/{feature}/staging")),
        graph_12_ids(),
        "each Task-ID exactly once on staging"
    );
    check_monitor_log(&repo.path);
    st
}

/// Every monitor.log line has the seed's form:
/// `2026-02-03T05:41:55.123Z [W0] [INFO] Worker 0 claimed task A-L1-002`.
fn check_monitor_log(repo: &Path) {
    let text = std::fs::read_to_string(repo.join(".zerg/monitor.log")).expect("monitor.log exists");
    assert!(!text.is_empty());
    for line in text.lines() {
        let (ts, rest) = line
            .split_once(' ')
            .unwrap_or_else(|| panic!("no timestamp: {line}"));
        let b = ts.as_bytes();
        assert_eq!(b.len(), 24, "timestamp {ts} in {line}");
        let shape_ok = ts.chars().enumerate().all(|(i, c)| match i {
            4 | 7 => c == '-',
            10 => c == 'T',
            13 | 16 => c == ':',
            19 => c == '.',
            23 => c == 'Z',
            _ => c.is_ascii_digit(),
        });
        assert!(shape_ok, "timestamp {ts} in {line}");
        let (tag, rest) = rest
            .split_once(' ')
            .unwrap_or_else(|| panic!("no tag: {line}"));
        let tag_ok = tag == "[orchestrator]"
            || (tag.starts_with("[W")
                && tag.ends_with(']')
                && tag[2..tag.len() - 1].chars().all(|c| c.is_ascii_digit())
                && tag.len() > 3);
        assert!(tag_ok, "tag {tag} in {line}");
        let (level, msg) = rest
            .split_once(' ')
            .unwrap_or_else(|| panic!("no level: {line}"));
        assert!(
            matches!(level, "[INFO]" | "[WARN]" | "[ERROR]"),
            "level {level} in {line}"
        );
        assert!(!msg.trim().is_empty(), "empty message: {line}");
    }
    // The events file carries the same events as JSON lines.
    let events = std::fs::read_dir(repo.join(".zerg/state"))
        .unwrap()
        .filter_map(|e| e.ok())
        .find(|e| e.file_name().to_string_lossy().ends_with("-events.jsonl"))
        .expect("events file");
    for line in std::fs::read_to_string(events.path()).unwrap().lines() {
        let v: Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("bad JSON line {line}: {e}"));
        assert!(
            v["timestamp"].is_string() && v["type"].is_string() && v["data"].is_object(),
            "{line}"
        );
    }
}

/// The fake agent CLI's path.
fn fake_claude() -> String {
    bin("fake-claude").to_string_lossy().into_owned()
}

/// The Codex profile with the fake Codex CLI.
fn codex_config() -> Config {
    Config::new()
        .set("agent.profile", "codex")
        .agent_command(&[&bin("fake-codex").to_string_lossy(), "exec", "--json"])
        .set("agent.timeout_seconds", 120)
}

fn monitor(repo: &TestRepo) -> String {
    std::fs::read_to_string(repo.path.join(".zerg/monitor.log")).unwrap_or_default()
}

/// The pid of the worker running `task`.
fn pid_running(st: &Value, task: &str) -> Option<i32> {
    running_worker(st, task)?.pid
}

fn wait_file(path: &Path) {
    wait_until(T, &path.display().to_string(), || path.exists());
}

#[test]
fn kill_9_of_a_worker_agent_mid_task_requeues_its_task() {
    let repo = TestRepo::new();
    let signal = repo.path.parent().unwrap().join("mid-task");
    repo.write_graph("k9", &graph_12("k9"));
    repo.configure(&Config::fake_agent().fast_workers());
    repo.write_script(
        "k9",
        &json!({"tasks": {"G-L2-002": {"attempts": [
            [{"op": "touch", "path": signal}, {"op": "tick", "count": 600, "interval_ms": 100}],
            [{"op": "write_owned"}]
        ]}}}),
    );
    let d = Daemon::start();
    assert!(
        d.ctl_in(&repo.path, &["rush", "k9", "--workers", "3", "--detach"])
            .status
            .success()
    );
    wait_file(&signal);
    let st = d.wait_for(&repo.path, "k9", T, "G-L2-002 running", |s| {
        pid_running(s, "G-L2-002").is_some()
    });
    let pid = pid_running(&st, "G-L2-002").unwrap();
    kill(Pid::from_raw(pid), Signal::SIGKILL).unwrap();

    let st = assert_complete_exactly_once(&d, &repo, "k9");
    let t = &st["tasks"]["G-L2-002"];
    assert_eq!(t["crashes"], 1, "{t}");
    assert_eq!(t["attempts"], 1, "a crash is not a failed attempt: {t}");
    assert!(st["resilience"]["task_reassignments"].as_u64().unwrap() >= 1);
    assert!(st["resilience"]["worker_respawns"].as_u64().unwrap() >= 1);
    let log = monitor(&repo);
    assert!(log.contains("crashed: signal 9"), "{log}");
    assert!(log.contains("reason worker_crash"), "{log}");
}

#[test]
fn kill_9_of_zergd_twice_mid_rush_then_restart() {
    let repo = TestRepo::new();
    repo.write_graph("zk", &graph_12("zk"));
    repo.configure(&Config::fake_agent().fast_workers());
    // Every task takes a while and prints as it goes.
    repo.write_script("zk", &json!({"default": [{"op": "tick", "count": 6, "interval_ms": 100}, {"op": "write_owned"}]}));
    let mut d = Daemon::start();
    assert!(
        d.ctl_in(&repo.path, &["rush", "zk", "--workers", "3", "--detach"])
            .status
            .success()
    );
    d.wait_for(&repo.path, "zk", T, "2 tasks complete", |s| {
        tasks_with(s, "complete").len() >= 2
    });
    d.kill9();
    // zergd stays down for a while (deliberate downtime, not a wait for readiness): workers
    // run on, fail their RPCs and retry with backoff.
    std::thread::sleep(Duration::from_millis(700));
    d.restart();
    d.wait_for(&repo.path, "zk", T, "6 tasks complete", |s| {
        tasks_with(s, "complete").len() >= 6
    });
    d.kill9();
    std::thread::sleep(Duration::from_millis(300));
    d.restart();
    assert_complete_exactly_once(&d, &repo, "zk");
    // No completed task was redone: one lease per task except the ones interrupted mid-flight.
    let log = monitor(&repo);
    assert_eq!(
        log.matches("zergd restarted; resuming rush zk").count(),
        2,
        "{log}"
    );
    let state: Value =
        serde_json::from_slice(&std::fs::read(repo.path.join(".zerg/state/zk.json")).unwrap())
            .unwrap();
    for (id, t) in state["tasks"].as_object().unwrap() {
        assert!(
            t["leases"].as_u64().unwrap() <= 2,
            "task {id} leased too often: {t}"
        );
    }
    // Workers were re-adopted across the restarts, not killed and replaced.
    assert!(log.contains("reconnected after zergd restart"), "{log}");
}

#[test]
fn a_worker_sigstopped_past_the_stale_threshold_is_killed_while_still_stopped_with_its_group() {
    let repo = TestRepo::new();
    let signal = repo.path.parent().unwrap().join("stopped");
    // G-L1-001 holds level 1 open (printing, so it is not stale) until the test is done
    // looking: the rush cannot end, and zergd's stop of every worker at its end cannot be
    // what kills the stopped one.
    let release = repo.path.parent().unwrap().join("release");
    let hold = format!(
        "while [ ! -e '{}' ]; do echo holding; sleep 0.2; done",
        release.display()
    );
    repo.write_graph("ss", &graph_12("ss"));
    repo.configure(&Config::fake_agent().fast_workers());
    repo.write_script("ss", &json!({"tasks": {
        "G-L1-001": [{"op": "shell", "command": hold}, {"op": "write_owned"}],
        "G-L1-003": {"attempts": [
            [{"op": "touch", "path": signal}, {"op": "tick", "count": 100, "interval_ms": 50}, {"op": "write_owned"}],
            [{"op": "write_owned"}]
        ]}
    }}));
    let d = Daemon::start();
    assert!(
        d.ctl_in(&repo.path, &["rush", "ss", "--workers", "3", "--detach"])
            .status
            .success()
    );
    wait_file(&signal);
    let st = d.wait_for(&repo.path, "ss", T, "G-L1-003 running", |s| {
        pid_running(s, "G-L1-003").is_some()
    });
    let pid = pid_running(&st, "G-L1-003").unwrap();
    killpg(Pid::from_raw(pid), Signal::SIGSTOP).unwrap();
    // The whole group is stopped: the worker agent and the agent CLI it runs.
    wait_until(T, "the worker's group to stop", || {
        let m = procfs::group_members(pid);
        m.len() >= 2 && m.iter().all(|&(_, state)| state == 'T')
    });
    let members = procfs::group_members(pid);
    // Past the stale threshold (4 s), zergd declares the worker stale and reassigns its task.
    d.wait_for(&repo.path, "ss", T, "stale detection", |s| {
        s["resilience"]["stale_detections"].as_u64().unwrap_or(0) >= 1
    });
    // No SIGCONT is ever sent: a stopped process can only end by SIGKILL, so every member of
    // the group going away is zergd's doing, not a worker that finished by itself.
    let gone = std::panic::catch_unwind(|| {
        wait_until(T, "the stopped worker's group to be killed", || {
            procfs::group_members(pid).is_empty()
        })
    });
    if gone.is_err() {
        let left = procfs::group_members(pid);
        let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        std::fs::write(&release, b"").unwrap();
        panic!("the stopped group of worker {pid} ({members:?}) was not killed: {left:?} remain");
    }
    let st = d.status(&repo.path, "ss").expect("status");
    assert_eq!(st["state"], "running", "{st}");
    std::fs::write(&release, b"").unwrap();
    let st = assert_complete_exactly_once(&d, &repo, "ss");
    assert!(st["tasks"]["G-L1-003"]["crashes"].as_u64().unwrap() >= 1);
    assert!(monitor(&repo).contains("is stale: no heartbeat"));
}

#[test]
fn a_spawn_that_fails_twice_then_succeeds() {
    let repo = TestRepo::new();
    repo.write_graph("sp", &graph_12("sp"));
    repo.configure(&Config::fake_agent().fast_workers());
    let dir = repo.path.parent().unwrap();
    let counter = dir.join("spawn-count");
    let wrapper = dir.join("flaky-agent.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nn=$(cat '{c}' 2>/dev/null || echo 0)\nn=$((n+1))\necho $n > '{c}'\nif [ $n -le 2 ]; then echo \"simulated spawn failure $n\" >&2; exit 1; fi\nexec '{agent}'\n",
            c = counter.display(),
            agent = bin("zerg-worker-agent").display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let d = Daemon::start_with_env(vec![(
        "ZERG_WORKER_AGENT_BIN".into(),
        wrapper.to_string_lossy().to_string(),
    )]);
    let out = d.ctl_in(&repo.path, &["rush", "sp", "--workers", "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = assert_complete_exactly_once(&d, &repo, "sp");
    assert_eq!(st["resilience"]["spawn_retries"], 2);
    let log = monitor(&repo);
    assert!(log.contains("spawn attempt 1 of 4 failed"), "{log}");
    assert!(log.contains("spawn attempt 2 of 4 failed"), "{log}");
    assert!(!log.contains("spawn attempt 3 of 4 failed"), "{log}");
}

#[test]
fn spawns_that_always_fail_end_the_rush_with_an_actionable_error() {
    let repo = TestRepo::new();
    repo.write_graph("nf", &graph_12("nf"));
    repo.configure(&Config::fake_agent().fast_workers());
    let d = Daemon::start_with_env(vec![(
        "ZERG_WORKER_AGENT_BIN".into(),
        "/nonexistent/zerg-worker-agent".into(),
    )]);
    let out = d.ctl_in(&repo.path, &["rush", "nf", "--workers", "2"]);
    assert_eq!(out.status.code(), Some(1));
    let st = d.status(&repo.path, "nf").unwrap();
    assert_eq!(st["state"], "failed");
    let reason = st["reason"].as_str().unwrap();
    assert!(
        reason.contains("/nonexistent/zerg-worker-agent"),
        "{reason}"
    );
    assert!(reason.contains("ZERG_WORKER_AGENT_BIN"), "{reason}");
    assert_eq!(
        st["resilience"]["spawn_retries"], 6,
        "3 retries for each of 2 workers"
    );
}

#[test]
fn an_agent_that_hangs_without_printing_is_timed_out_and_retried() {
    let repo = TestRepo::new();
    repo.write_graph("hang", &graph_12("hang"));
    repo.configure(&Config::fake_agent().fast_workers());
    // Before hanging, the agent starts a child of its own that would run for long after it
    // (as a build or a server an agent starts does) and notes both pids.
    let dir = repo.path.parent().unwrap();
    let (agent_pid, child_pid) = (dir.join("agent.pid"), dir.join("child.pid"));
    let start = format!(
        "echo $PPID > '{a}'; sleep 1000 >/dev/null 2>&1 & echo $! > '{c}'",
        a = agent_pid.display(),
        c = child_pid.display()
    );
    repo.write_script(
        "hang",
        &json!({"tasks": {"G-L1-001": {"attempts": [
            [{"op": "shell", "command": start}, {"op": "hang"}],
            [{"op": "write_owned"}]
        ]}}}),
    );
    let d = Daemon::start();
    assert!(
        d.ctl_in(&repo.path, &["rush", "hang", "--workers", "3", "--detach"])
            .status
            .success()
    );
    let st = assert_complete_exactly_once(&d, &repo, "hang");
    let t = &st["tasks"]["G-L1-001"];
    assert_eq!(t["attempts"], 2, "the hung attempt counts: {t}");
    assert!(st["resilience"]["stale_detections"].as_u64().unwrap() >= 1);
    let log = monitor(&repo);
    assert!(log.contains("made no progress"), "{log}");
    assert!(log.contains("failing it with reason timeout"), "{log}");
    // The hung agent, what it started and the rest of its process group are gone.
    let pid = |p: &Path| -> i32 { std::fs::read_to_string(p).unwrap().trim().parse().unwrap() };
    let (agent, child) = (pid(&agent_pid), pid(&child_pid));
    let group = procfs::state_and_group(child).map(|(_, g)| g);
    let gone = std::panic::catch_unwind(|| {
        wait_until(T, "the hung agent's group to be gone", || {
            !alive(agent) && !alive(child)
        })
    });
    if gone.is_err() {
        let _ = kill(Pid::from_raw(child), Signal::SIGKILL);
        panic!("the hung agent {agent} or its child {child} (group {group:?}) outlived it");
    }
}

#[test]
fn a_hung_agent_killed_at_its_timeout_leaves_no_child_while_its_worker_lives() {
    // The worker agent's own timeout (not zergd's watchdog, which kills the whole worker and
    // so everything in it): the CLI is killed, and what it started, in its group and in a
    // session of its own, must be gone right then, with the worker that ran it still alive.
    let repo = TestRepo::new();
    repo.write_graph("hto", &graph_12("hto"));
    repo.configure(
        &Config::fake_agent()
            .fast_workers()
            .set("agent.timeout_seconds", 2)
            .set("workers.task_stale_timeout_seconds", 600),
    );
    let pids = tempfile::tempdir().unwrap();
    let start = format!(
        "echo $PPID > {}/agent.pid; {}",
        pids.path().display(),
        leave_children(pids.path())
    );
    // Level 2 waits, so that every worker is alive when the leftovers are judged.
    let release = pids.path().join("release");
    repo.write_script(
        "hto",
        &json!({"tasks": {
            "G-L1-001": {"attempts": [
                [{"op": "shell", "command": start}, {"op": "hang"}],
                [{"op": "write_owned"}]
            ]},
            "G-L2-001": [{"op": "wait_for_file", "path": release, "timeout_ms": 120_000}, {"op": "write_owned"}],
        }}),
    );
    let d = Daemon::start();
    assert!(
        d.ctl_in(&repo.path, &["rush", "hto", "--workers", "3", "--detach"])
            .status
            .success()
    );
    let mid = d.wait_for(
        &repo.path,
        "hto",
        T,
        "the retry done, level 2 waiting",
        |s| {
            s["tasks"]["G-L1-001"]["status"] == "complete"
                && s["tasks"]["G-L2-001"]["status"] == "in_progress"
        },
    );
    let left = kill_survivors(pids.path(), &["agent.pid", "bg.pid", "sid.pid"]);
    assert!(
        left.is_empty(),
        "still running after the agent's timeout: {left:?}"
    );
    // No worker died meanwhile: the one that ran the hung attempt killed them itself.
    for (w, ws) in mid["workers"].as_object().unwrap() {
        let pid = ws["pid"].as_i64().unwrap_or(0) as i32;
        assert!(pid > 0 && alive(pid), "worker {w} is gone: {mid}");
        assert_eq!(ws["respawns"], 0, "worker {w}: {mid}");
    }
    assert_eq!(mid["tasks"]["G-L1-001"]["attempts"], 2, "{mid}");
    std::fs::write(&release, "go").unwrap();
    assert_complete_exactly_once(&d, &repo, "hto");
    let log = monitor(&repo);
    assert!(log.contains("agent.timeout_seconds"), "{log}");
}

#[test]
fn an_agent_that_reports_a_rate_limit_pauses_new_work_without_burning_retries() {
    let repo = TestRepo::new();
    repo.write_graph("rl", &graph_12("rl"));
    repo.configure(
        &Config::fake_agent()
            .fast_workers()
            .set("workers.retry_attempts", 0),
    );
    repo.write_script("rl", &json!({"tasks": {"G-L1-002": {"attempts": [[{"op": "rate_limit", "reset_in_secs": 2}], [{"op": "write_owned"}]]}}}));
    let d = Daemon::start();
    assert!(
        d.ctl_in(&repo.path, &["rush", "rl", "--workers", "2", "--detach"])
            .status
            .success()
    );
    // While the hold lasts, status says until when, in JSON and in its text.
    let st = d.wait_for(&repo.path, "rl", T, "rate-limited status", |s| {
        s["rate_limited_until"]
            .as_str()
            .is_some_and(|x| !x.is_empty())
            || s["state"] != "running"
    });
    assert!(
        !st["rate_limited_until"].as_str().unwrap_or("").is_empty(),
        "{st}"
    );
    let mut text = String::new();
    let held = poll(T, || {
        text = String::from_utf8_lossy(&d.ctl_in(&repo.path, &["status", "rl"]).stdout).to_string();
        text.contains("usage limit until") || text.contains("[COMPLETE]")
    });
    let line = text.lines().find(|l| l.contains("usage limit until"));
    assert!(
        held && line.is_some_and(|l| l.contains(" UTC")),
        "status shows no usage-limit hold:\n{text}"
    );
    // With retry_attempts 0 a counted failure would fail the rush: the rate limit must not count.
    let st = assert_complete_exactly_once(&d, &repo, "rl");
    assert_eq!(st["tasks"]["G-L1-002"]["attempts"], 1);
    assert!(monitor(&repo).contains("usage limit"));
}

#[test]
fn a_missing_agent_cli_blocks_workers_with_a_clear_reason() {
    let repo = TestRepo::new();
    repo.write_graph("miss", &graph_12("miss"));
    repo.configure(
        &Config::new()
            .agent_command(&["/nonexistent/claude", "--print"])
            .fast_workers(),
    );
    let d = Daemon::start();
    let out = d.ctl_in(&repo.path, &["rush", "miss", "--workers", "2"]);
    assert_eq!(out.status.code(), Some(1));
    let st = d.status(&repo.path, "miss").unwrap();
    assert_eq!(st["state"], "failed");
    assert!(
        st["reason"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/claude"),
        "{st}"
    );
    assert!(
        tasks_with(&st, "failed").is_empty(),
        "no task is blamed for a missing CLI"
    );
}

#[test]
fn an_agent_that_hangs_after_its_result_event_is_stopped_and_its_work_kept() {
    let repo = TestRepo::new();
    repo.write_graph("linger", &graph_12("linger"));
    // The stale watchdog is far away: only the result-event grace can end the hung CLI in time.
    repo.configure(
        &Config::new()
            .agent_command(&[
                &fake_claude(),
                "--print",
                "--output-format",
                "stream-json",
                "--verbose",
            ])
            .fast_workers()
            .set("workers.task_stale_timeout_seconds", 120),
    );
    repo.write_script("linger", &json!({"tasks": {"G-L1-004": [{"op": "write_owned"}, {"op": "stream_json"}, {"op": "hang"}]}}));
    let d = Daemon::start();
    assert!(
        d.ctl_in(
            &repo.path,
            &["rush", "linger", "--workers", "3", "--detach"]
        )
        .status
        .success()
    );
    let st = assert_complete_exactly_once(&d, &repo, "linger");
    assert_eq!(st["tasks"]["G-L1-004"]["attempts"], 1);
    assert_eq!(st["resilience"]["stale_detections"], 0);
    // The cost in each result event is accounted per task and for the rush.
    assert_eq!(st["tasks"]["G-L1-004"]["cost_usd"], 0.01);
    assert!(
        (st["cost_usd"].as_f64().unwrap() - 0.12).abs() < 1e-9,
        "{}",
        st["cost_usd"]
    );
    let text =
        String::from_utf8_lossy(&d.ctl_in(&repo.path, &["status", "linger"]).stdout).to_string();
    assert!(text.contains("Agent cost: $0.12"), "{text}");
    let logs = String::from_utf8_lossy(
        &d.ctl_in(&repo.path, &["logs", "linger", "--tail", "500"])
            .stdout,
    )
    .to_string();
    assert!(
        logs.contains("printed its result but did not exit"),
        "{logs}"
    );
}

/// A shell command that leaves two processes running once it returns, both holding the agent's
/// output open as a server started in the background does: a `sleep` in the background (its
/// pid in `dir/bg.pid`) and one in a session of its own, out of every process group the worker
/// could signal (`dir/sid.pid`). It returns only once both pids are written.
fn leave_children(dir: &Path) -> String {
    let dir = dir.display();
    format!(
        "sleep 1000 & echo $! > {dir}/bg.pid; \
         setsid sh -c 'echo $$ > {dir}/sid.tmp; mv {dir}/sid.tmp {dir}/sid.pid; exec sleep 1000' & \
         while [ ! -e {dir}/sid.pid ]; do sleep 0.01; done"
    )
}

/// The pids named in `files` (under `dir`) that still run, each killed so that a failing test
/// leaves nothing behind.
fn kill_survivors(dir: &Path, files: &[&str]) -> Vec<(String, i32)> {
    let left: Vec<(String, i32)> = files
        .iter()
        .map(|name| {
            let pid = std::fs::read_to_string(dir.join(name))
                .unwrap_or_else(|e| panic!("{name}: {e}"))
                .trim()
                .parse()
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            (name.to_string(), pid)
        })
        .filter(|(_, pid)| alive(*pid))
        .collect();
    for (_, pid) in &left {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
    }
    left
}

#[test]
fn what_the_agent_cli_leaves_running_is_killed_when_it_exits() {
    // An agent CLI that puts a server in the background and starts a daemon in a session of
    // its own (out of every process group the worker could signal), then exits: both would go
    // on running, and writing into the worktree, during the worker's next tasks.
    let repo = TestRepo::new();
    repo.write_graph("left", &graph_12("left"));
    repo.configure(&Config::fake_agent().fast_workers());
    let pids = tempfile::tempdir().unwrap();
    let command = leave_children(pids.path());
    // Level 2 waits, so that both workers are still alive when the leftovers are judged: once
    // the rush ends every process is gone anyway.
    let release = pids.path().join("release");
    repo.write_script(
        "left",
        &json!({"tasks": {
            "G-L1-002": [{"op": "write_owned"}, {"op": "shell", "command": command}],
            "G-L2-001": [{"op": "wait_for_file", "path": release, "timeout_ms": 120_000}, {"op": "write_owned"}],
        }}),
    );
    let d = Daemon::start();
    assert!(
        d.ctl_in(&repo.path, &["rush", "left", "--workers", "2", "--detach"])
            .status
            .success()
    );
    let mid = d.wait_for(&repo.path, "left", T, "level 2 waiting", |s| {
        s["tasks"]["G-L1-002"]["status"] == "complete"
            && s["tasks"]["G-L2-001"]["status"] == "in_progress"
    });
    let left = kill_survivors(pids.path(), &["bg.pid", "sid.pid"]);
    assert!(
        left.is_empty(),
        "still running after the agent exited: {left:?}"
    );
    // The worker that ran the task is the same process, still alive: it killed them itself.
    let w = mid["tasks"]["G-L1-002"]["worker_id"].to_string();
    let worker = mid["workers"][&w]["pid"].as_i64().unwrap() as i32;
    assert!(alive(worker), "worker {w} (pid {worker}) is gone: {mid}");
    assert_eq!(mid["workers"][&w]["respawns"], 0, "{mid}");
    std::fs::write(&release, "go").unwrap();
    let st = assert_complete_exactly_once(&d, &repo, "left");
    assert_eq!(st["tasks"]["G-L1-002"]["attempts"], 1);
    let logs = String::from_utf8_lossy(
        &d.ctl_in(&repo.path, &["logs", "left", "--tail", "1000"])
            .stdout,
    )
    .to_string();
    assert!(logs.contains("process(es) that"), "{logs}");
}

#[test]
fn a_checkpoint_exit_resumes_the_task_from_its_wip_commit() {
    let repo = TestRepo::new();
    repo.write_graph("cp", &graph_12("cp"));
    repo.configure(&Config::fake_agent().fast_workers());
    // Attempt 1 writes the files, then checkpoints; attempt 2 writes nothing and relies on the
    // checkpoint's changes being restored (the verification needs the file).
    repo.write_script("cp", &json!({"tasks": {"G-L1-003": {"attempts": [
        [{"op": "write_owned"}, {"op": "checkpoint", "progress_pct": 60, "next_action": "finish up"}],
        [{"op": "print", "text": "resuming"}]
    ]}}}));
    let d = Daemon::start();
    assert!(
        d.ctl_in(&repo.path, &["rush", "cp", "--workers", "2", "--detach"])
            .status
            .success()
    );
    let st = assert_complete_exactly_once(&d, &repo, "cp");
    assert_eq!(
        st["tasks"]["G-L1-003"]["attempts"], 1,
        "a checkpoint is not a failed attempt"
    );
    let log = monitor(&repo);
    assert!(log.contains("exited: 2 (checkpoint)"), "{log}");
    // The WIP commit itself never reaches staging; its changes do, in the task's own commit.
    let subjects = git(&repo.path, &["log", "--format=%s", "main..zerg/cp/staging"]);
    assert!(!subjects.contains("WIP:"), "{subjects}");
    assert!(
        repo.files_on("zerg/cp/staging")
            .contains(&"l1/a3.txt".to_string())
    );
    // The checkpoint stays reachable under refs/zerg.
    assert!(!git(&repo.path, &["for-each-ref", "refs/zerg/cp/wip/"]).is_empty());
}

#[test]
fn a_state_file_torn_while_zergd_was_down_resumes_from_its_backup() {
    let repo = TestRepo::new();
    repo.write_graph("zb", &graph_12("zb"));
    repo.configure(&Config::fake_agent().fast_workers());
    repo.write_script("zb", &json!({"default": [{"op": "tick", "count": 4, "interval_ms": 100}, {"op": "write_owned"}]}));
    let mut d = Daemon::start();
    assert!(
        d.ctl_in(&repo.path, &["rush", "zb", "--workers", "3", "--detach"])
            .status
            .success()
    );
    // Into level 2: the state file was written whole at the start of each level, and what
    // happened since is in the journal.
    let before = d.wait_for(&repo.path, "zb", T, "6 tasks complete", |s| {
        tasks_with(s, "complete").len() >= 6
    });
    d.kill9();
    // What a torn write (or a bad disk) leaves: half a file. The backup is the generation
    // before it (rush start); the journals hold everything since.
    let state = repo.path.join(".zerg/state/zb.json");
    let whole = std::fs::read(&state).unwrap();
    std::fs::write(&state, &whole[..whole.len() / 3]).unwrap();
    assert!(repo.path.join(".zerg/state/zb.json.bak").exists());
    assert!(repo.path.join(".zerg/state/zb.journal.prev").exists());
    d.restart();
    let st = assert_complete_exactly_once(&d, &repo, "zb");
    // Nothing that was saved before the kill is lost: a task complete then was not run again.
    let doc: Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    for t in tasks_with(&before, "complete") {
        assert_eq!(doc["tasks"][&t]["leases"], 1, "task {t} ran again");
    }
    let warnings = st["warnings"].to_string();
    assert!(
        warnings.contains("zb.json was corrupt") && warnings.contains("zb.json.bak"),
        "status says the backup was used: {warnings}"
    );
    // The state file is whole again.
    assert_eq!(doc["rush"]["state"], "complete");
}

#[test]
fn sigterm_stops_zergd_cleanly_mid_rush_and_a_restarted_zergd_readopts_the_workers() {
    let repo = TestRepo::new();
    repo.write_graph("zt", &graph_12("zt"));
    repo.configure(&Config::fake_agent().fast_workers());
    repo.write_script("zt", &json!({"default": [{"op": "tick", "count": 6, "interval_ms": 100}, {"op": "write_owned"}]}));
    let mut d = Daemon::start();
    assert!(
        d.ctl_in(&repo.path, &["rush", "zt", "--workers", "3", "--detach"])
            .status
            .success()
    );
    let st = d.wait_for(
        &repo.path,
        "zt",
        T,
        "three workers, one running a task",
        |s| {
            worker_pids(s).len() == 3
                && !tasks_with(s, "in_progress").is_empty()
                && !tasks_with(s, "complete").is_empty()
        },
    );
    let running = worker_pids(&st);
    let status = d.sigterm();
    assert!(
        status.success(),
        "zergd exits 0 on SIGTERM: {status:?}\n{}",
        d.log()
    );
    assert!(d.log().contains("SIGTERM"), "{}", d.log());
    // Not a terminal: no colour codes, on stderr or in the rotated log in the state dir.
    assert!(
        !d.log().contains('\x1b'),
        "ANSI codes in a log that is not a terminal"
    );
    let file_log = d.state_log();
    assert!(
        file_log.contains("SIGTERM") && !file_log.contains('\x1b'),
        "{file_log}"
    );
    // Every worker is left running (adoptable), not killed with zergd.
    let killed: Vec<&i32> = running.iter().filter(|p| !alive(**p)).collect();
    assert!(
        killed.is_empty(),
        "workers {killed:?} of {running:?} did not survive zergd's SIGTERM"
    );
    let done_before = tasks_with(&st, "complete").len();
    d.restart();
    // Re-adopted, not replaced: once work has gone on under the new zergd, the rush's workers
    // are the very processes that were running before, and none was respawned.
    let after = d.wait_for(
        &repo.path,
        "zt",
        T,
        "a task completed after the restart",
        |s| tasks_with(s, "complete").len() > done_before || s["state"] != "running",
    );
    let mut before = running.clone();
    before.sort_unstable();
    let mut now = worker_pids(&after);
    now.sort_unstable();
    assert_eq!(
        now, before,
        "the workers after the restart are not the ones before: {after}"
    );
    assert_eq!(after["resilience"]["worker_respawns"], 0, "{after}");
    assert_complete_exactly_once(&d, &repo, "zt");
    let log = monitor(&repo);
    assert!(log.contains("zergd restarted; resuming rush zt"), "{log}");
    assert!(log.contains("reconnected after zergd restart"), "{log}");
}

#[test]
fn kill_9_of_zergd_in_the_middle_of_a_compaction_loses_nothing() {
    let repo = TestRepo::new();
    // Many short levels: the state file is written whole at the start of every one, and the
    // journal holds what happens in between.
    repo.write_graph("zc", &graph_wide("zc", 10, 20));
    repo.configure(&Config::fake_agent().fast_workers());
    repo.write_script("zc", &json!({"default": [{"op": "write_owned"}]}));
    let mut d = Daemon::start();
    assert!(
        d.ctl_in(&repo.path, &["rush", "zc", "--workers", "4", "--detach"])
            .status
            .success()
    );
    let dir = repo.path.join(".zerg/state");
    let writing = || {
        std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(".zc.json.tmp-"))
    };
    // Kill zergd the moment a whole write of the state file begins: inotify reports the temp
    // file's creation, and until then the test sleeps in poll(2), leaving the cores to zergd. A
    // temp file still there after the kill proves the write was cut off in the middle.
    let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).unwrap();
    ino.add_watch(&dir, AddWatchFlags::IN_CREATE).unwrap();
    // Reads every pending event: whether one was the creation of a temp file of zc.json.
    let write_began = |ino: &Inotify| {
        let mut began = false;
        while let Ok(events) = ino.read_events() {
            began |= events.iter().any(|e| {
                e.name
                    .as_ref()
                    .is_some_and(|n| n.to_string_lossy().starts_with(".zc.json.tmp-"))
            });
        }
        began
    };
    let (mut cut, mut kills) = (0, 0);
    let started = Instant::now();
    while cut < 2 && kills < 30 && started.elapsed() < T {
        let mut fds = [PollFd::new(ino.as_fd(), PollFlags::POLLIN)];
        let ready = poll_fds(&mut fds, 250u16).unwrap_or(0) > 0;
        if ready && write_began(&ino) {
            d.kill9();
            kills += 1;
            if writing() {
                cut += 1;
            }
            d.restart();
            // What happened while zergd restarted is past: wait for the next write.
            write_began(&ino);
        } else if !ready
            && d.status(&repo.path, "zc")
                .is_some_and(|s| s["state"] != "running")
        {
            break;
        }
    }
    assert!(
        cut >= 1,
        "no kill landed in the middle of a compaction ({kills} kills)"
    );
    let st = d.wait_end(&repo.path, "zc", T);
    assert_eq!(st["state"], "complete", "{st}\n{}", d.log());
    let mut ids: Vec<String> = (1..=10)
        .flat_map(|l| (1..=20).map(move |i| format!("W-L{l}-{i:05}")))
        .collect();
    ids.sort();
    assert_eq!(tasks_with(&st, "complete"), ids);
    assert_eq!(
        repo.task_ids_on("zerg/zc/staging"),
        ids,
        "each Task-ID exactly once on staging"
    );
    // The cut-off writes were cleared away, and the state file is whole.
    assert!(!writing(), "a temp file of a cut-off write is left");
    let doc: Value = serde_json::from_slice(&std::fs::read(dir.join("zc.json")).unwrap()).unwrap();
    assert_eq!(doc["rush"]["state"], "complete");
    assert!(d.log().contains("zergd restarted") || monitor(&repo).contains("zergd restarted"));
    eprintln!("{kills} kills, {cut} in the middle of a compaction");
}

/// The tasks whose completion zergd acknowledged, as the workers logged them
/// (`zerg-worker-agent: task <id> committed <sha>`, printed once `Complete` returned).
fn acknowledged(repo: &Path) -> std::collections::BTreeSet<String> {
    let mut acked = std::collections::BTreeSet::new();
    for e in std::fs::read_dir(repo.join(".zerg/logs"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("worker-") && name.ends_with(".log")) {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        for line in text.lines() {
            if let Some(rest) = line.split("zerg-worker-agent: task ").nth(1)
                && let Some((id, _)) = rest.split_once(" committed ")
            {
                acked.insert(id.to_string());
            }
        }
    }
    acked
}

#[test]
fn kill_9_of_zergd_right_after_a_journal_append_loses_nothing_acknowledged() {
    let repo = TestRepo::new();
    repo.write_graph("zj", &graph_wide("zj", 5, 20));
    repo.configure(&Config::fake_agent().fast_workers());
    repo.write_script("zj", &json!({"default": [{"op": "write_owned"}]}));
    let mut d = Daemon::start();
    assert!(
        d.ctl_in(&repo.path, &["rush", "zj", "--workers", "4", "--detach"])
            .status
            .success()
    );
    let dir = repo.path.join(".zerg/state");
    let journal = dir.join("zj.journal");
    // The journal is appended to once per batch of events (a group commit: one record, one
    // fsync), and nothing of the batch is acknowledged until that fsync returns. The test
    // kills zergd the moment an append's write lands (inotify's IN_MODIFY on the journal),
    // which is before or during its fsync, and checks that every completion a worker was told
    // of is in the state the restarted zergd reads back.
    let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).unwrap();
    ino.add_watch(&dir, AddWatchFlags::IN_MODIFY).unwrap();
    let appended = |ino: &Inotify| {
        let mut seen = false;
        while let Ok(events) = ino.read_events() {
            seen |= events.iter().any(|e| {
                e.name
                    .as_ref()
                    .is_some_and(|n| n.to_string_lossy() == "zj.journal")
            });
        }
        seen
    };
    let (mut kills, mut checked) = (0, 0usize);
    let started = Instant::now();
    while kills < 6 && started.elapsed() < T {
        let mut fds = [PollFd::new(ino.as_fd(), PollFlags::POLLIN)];
        let ready = poll_fds(&mut fds, 250u16).unwrap_or(0) > 0;
        if ready && appended(&ino) {
            d.kill9();
            kills += 1;
            // zergd is gone: no completion can be acknowledged from here on. The workers print
            // the line just after the answer; give them a moment to.
            std::thread::sleep(Duration::from_millis(200));
            let acked = acknowledged(&repo.path);
            d.restart();
            let st = d
                .status(&repo.path, "zj")
                .unwrap_or_else(|| panic!("no status after restart {kills}:\n{}", d.log()));
            let complete: std::collections::BTreeSet<String> =
                tasks_with(&st, "complete").into_iter().collect();
            let lost: Vec<&String> = acked.difference(&complete).collect();
            assert!(
                lost.is_empty(),
                "kill {kills}: acknowledged but not complete after the restart: {lost:?}\n{}",
                d.log()
            );
            checked += acked.len();
            // Some work is acknowledged between kills: the next kill waits for a task
            // completed after this restart (or the rush's end).
            let done = complete.len();
            d.wait_for(&repo.path, "zj", T, "a completion after the restart", |s| {
                tasks_with(s, "complete").len() > done || s["state"] != "running"
            });
            // What happened meanwhile is past: the next kill follows the next append.
            appended(&ino);
        } else if !ready
            && d.status(&repo.path, "zj")
                .is_some_and(|s| s["state"] != "running")
        {
            break;
        }
    }
    assert!(journal.exists() || kills > 0, "the rush never journaled");
    assert!(kills >= 2, "only {kills} kills landed after an append");
    assert!(checked > 0, "no acknowledged completion was checked");
    let st = d.wait_end(&repo.path, "zj", T);
    assert_eq!(st["state"], "complete", "{st}\n{}", d.log());
    let mut ids: Vec<String> = (1..=5)
        .flat_map(|l| (1..=20).map(move |i| format!("W-L{l}-{i:05}")))
        .collect();
    ids.sort();
    assert_eq!(tasks_with(&st, "complete"), ids);
    assert_eq!(
        repo.task_ids_on("zerg/zj/staging"),
        ids,
        "each Task-ID exactly once on staging"
    );
    eprintln!(
        "{kills} kills right after a journal append; {checked} acknowledged completions checked"
    );
}

#[test]
fn lock_files_a_killed_zergd_left_on_the_rushs_refs_are_cleared_on_restart() {
    let repo = TestRepo::new();
    repo.write_graph("lk", &graph_12("lk"));
    repo.configure(&Config::fake_agent().fast_workers());
    let release = repo.path.parent().unwrap().join("release-lk");
    repo.write_script(
        "lk",
        &json!({"tasks": {"G-L1-001": [{"op": "wait_for_file", "path": release, "timeout_ms": 120_000}, {"op": "write_owned"}]}}),
    );
    let mut d = Daemon::start();
    assert!(
        d.ctl_in(&repo.path, &["rush", "lk", "--workers", "2", "--detach"])
            .status
            .success()
    );
    d.wait_for(&repo.path, "lk", T, "G-L1-001 running", |s| {
        s["tasks"]["G-L1-001"]["status"] == "in_progress"
    });
    // zergd killed in the middle of a level merge leaves git's locks behind: on a worker
    // branch the merge moves, and on the staging worktree's index.
    d.kill9();
    let branch_lock = repo.path.join(".git/refs/heads/zerg/lk/worker-1.lock");
    std::fs::write(&branch_lock, "").unwrap();
    let staging = repo.path.join(".zerg-worktrees/lk/staging");
    let gitdir = std::fs::read_to_string(staging.join(".git")).unwrap();
    let index_lock = staging
        .join(gitdir.trim().trim_start_matches("gitdir:").trim())
        .join("index.lock");
    std::fs::write(&index_lock, "").unwrap();
    d.restart();
    std::fs::write(&release, "go").unwrap();
    let st = assert_complete_exactly_once(&d, &repo, "lk");
    assert_eq!(st["state"], "complete");
    assert!(!branch_lock.exists() && !index_lock.exists());
    assert!(
        d.log()
            .contains("removed a lock file a killed zergd left behind"),
        "{}",
        d.log()
    );
}

#[test]
fn todays_usage_limit_forms_each_hold_the_rush_without_counting_an_attempt() {
    let repo = TestRepo::new();
    repo.write_graph("forms", &graph_12("forms"));
    repo.configure(
        &Config::new()
            .agent_command(&[
                &fake_claude(),
                "--print",
                "--dangerously-skip-permissions",
                "--output-format",
                "stream-json",
                "--verbose",
            ])
            .set("agent.timeout_seconds", 120)
            .fast_workers()
            .set("workers.retry_attempts", 0),
    );
    let limited = |form: &str| {
        json!({"attempts": [
            [{"op": "rate_limit", "reset_in_secs": 1, "form": form}],
            [{"op": "write_owned"}, {"op": "stream_json"}]
        ]})
    };
    repo.write_script(
        "forms",
        &json!({"tasks": {
            "G-L1-001": limited("auto"),
            "G-L1-002": limited("event_ms"),
            "G-L1-003": limited("spliced"),
            "G-L1-004": limited("api_key"),
            "G-L1-005": limited("legacy"),
            "G-L2-001": [{"op": "usage_warning"}, {"op": "write_owned"}, {"op": "stream_json"}],
        }}),
    );
    let d = Daemon::start();
    assert!(
        d.ctl_in(&repo.path, &["rush", "forms", "--workers", "2", "--detach"])
            .status
            .success()
    );
    // With retry_attempts 0 a counted failure would fail the rush.
    let st = assert_complete_exactly_once(&d, &repo, "forms");
    for i in 1..=5 {
        let id = format!("G-L1-{i:03}");
        assert_eq!(st["tasks"][&id]["attempts"], 1, "{id}: {st}");
    }
    let log = monitor(&repo);
    assert!(log.contains("UTC (five_hour)"), "{log}");
    assert!(
        log.matches("hit the agent's usage limit").count() >= 5,
        "{log}"
    );
    // Every run that did the work reported its cost and tokens (an assistant message repeated
    // in several events counts once: the result's figures win anyway).
    for (id, t) in st["tasks"].as_object().unwrap() {
        assert!(t["cost_usd"].as_f64().unwrap() >= 0.01, "{id}: {t}");
        assert_eq!(t["tokens"]["input_tokens"], 1000, "{id}: {t}");
        assert_eq!(t["tokens"]["cache_read_tokens"], 500, "{id}: {t}");
    }
    assert_eq!(st["tokens"]["input_tokens"], 12_000, "{st}");
    assert_eq!(st["models"]["fake"]["output_tokens"], 1200, "{st}");
}

#[test]
fn a_rush_pauses_at_its_budget_and_retry_with_a_higher_one_finishes_it() {
    let repo = TestRepo::new();
    repo.write_graph("budget", &graph_12("budget"));
    repo.configure(
        &Config::new()
            .agent_command(&[
                &fake_claude(),
                "--print",
                "--output-format",
                "stream-json",
                "--verbose",
            ])
            .set("agent.timeout_seconds", 120)
            .fast_workers()
            .set("budget.max_usd", 100),
    );
    let d = Daemon::start();
    // Each run costs 0.01: the flag's budget (over the config's) runs out after three tasks.
    assert!(
        d.ctl_in(
            &repo.path,
            &[
                "rush",
                "budget",
                "--workers",
                "1",
                "--detach",
                "--max-usd",
                "0.03"
            ]
        )
        .status
        .success()
    );
    let st = d.wait_for(&repo.path, "budget", T, "the rush to pause", |s| {
        s["state"] != "running" && s["state"] != "pending"
    });
    assert_eq!(st["state"], "paused", "{st}");
    assert!(
        st["reason"].as_str().unwrap().starts_with("budget:"),
        "{st}"
    );
    assert_eq!(st["max_usd"], 0.03);
    assert_eq!(tasks_with(&st, "complete").len(), 3, "{st}");
    assert!(tasks_with(&st, "in_progress").is_empty(), "{st}");
    let out = d.ctl_in(&repo.path, &["retry", "budget", "--max-usd", "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = assert_complete_exactly_once(&d, &repo, "budget");
    assert_eq!(st["max_usd"], 1.0);
    assert!(
        (st["cost_usd"].as_f64().unwrap() - 0.12).abs() < 1e-9,
        "{st}"
    );
}

#[test]
fn the_codex_profile_reads_codex_events_for_tokens_and_failed_turns() {
    let repo = TestRepo::new();
    repo.write_graph("codex", &graph_12("codex"));
    repo.configure(&codex_config().fast_workers());
    let d = Daemon::start();
    assert!(
        d.ctl_in(&repo.path, &["rush", "codex", "--workers", "2", "--detach"])
            .status
            .success()
    );
    let st = assert_complete_exactly_once(&d, &repo, "codex");
    for (id, t) in st["tasks"].as_object().unwrap() {
        assert_eq!(t["tokens"]["input_tokens"], 1000, "{id}: {t}");
        assert_eq!(t["tokens"]["cache_read_tokens"], 200, "{id}: {t}");
        assert_eq!(t["tokens"]["output_tokens"], 30, "{id}: {t}");
        assert_eq!(t["cost_usd"], 0.0, "Codex reports no cost");
    }
}

#[test]
fn a_failed_codex_turn_with_a_usage_limit_holds_the_rush() {
    let repo = TestRepo::new();
    repo.write_graph("cdxl", &graph_12("cdxl"));
    repo.configure(
        &codex_config()
            .set("agent.env_passthrough", ["FAKE_CODEX_FAIL"])
            .fast_workers()
            .set("workers.retry_attempts", 0),
    );
    let d = Daemon::start_with_env(vec![(
        "FAKE_CODEX_FAIL".into(),
        "You've hit your usage limit. Upgrade or try again later.".into(),
    )]);
    assert!(
        d.ctl_in(&repo.path, &["rush", "cdxl", "--workers", "1", "--detach"])
            .status
            .success()
    );
    let st = d.wait_for(&repo.path, "cdxl", T, "a usage-limit hold", |s| {
        s["rate_limited_until"]
            .as_str()
            .is_some_and(|x| !x.is_empty())
    });
    assert_eq!(st["state"], "running", "{st}");
    assert!(tasks_with(&st, "failed").is_empty(), "not counted: {st}");
}
