//! Documented behaviours driven end to end: a real zergd, real git, real worker processes and
//! the fake agent scripted per task. Quality gates and `retry`, verification tiers and their
//! `*_blocking` flags, `stop`'s SIGTERM-grace-SIGKILL, `retry --reset` and `retry TASK…`,
//! `logs --follow`, `status --watch`, Ctrl-C on `rush`, the service's `READY=1`, reconciliation
//! in a live zergd and a merge conflict resolved as docs/Troubleshooting.md says.
//!
//! Every wait here is for a state, a file or a line (readiness); the timeouts only bound a hung
//! test. Tasks that must wait for the test block on a file in a directory of the test's own
//! ([`Signals`]), never on a sleep.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use zerg_tests::*;

const T: Duration = Duration::from_secs(180);

/// The config of these tests: the fake agent, fast backoffs and reconciliation, and stale
/// limits far above what a task that waits for the test takes, so that waiting is never
/// mistaken for a hang.
fn config() -> Config {
    Config::fake_agent()
        .fast_workers()
        .set("workers.heartbeat_stale_threshold", 60)
        .set("workers.task_stale_timeout_seconds", 120)
}

/// [`poll`] for a value: waits until `ready` returns `Some`, panicking with `what` and
/// `context()` once `T` has passed (which only bounds a hung test).
fn wait_value<R>(
    what: &str,
    context: impl Fn() -> String,
    mut ready: impl FnMut() -> Option<R>,
) -> R {
    let mut got = None;
    if !poll(T, || {
        got = ready();
        got.is_some()
    }) {
        panic!("timed out waiting for {what}\n{}", context());
    }
    got.expect("ready")
}

/// A directory of files through which the test and the scripted agents signal each other.
struct Signals(tempfile::TempDir);

impl Signals {
    fn new() -> Signals {
        Signals(
            tempfile::Builder::new()
                .prefix("zerg-sig-")
                .tempdir()
                .expect("tempdir"),
        )
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }

    /// The path as a shell word for the agents' scripts.
    fn sh(&self, name: &str) -> String {
        format!("'{}'", self.path(name).display())
    }

    fn touch(&self, name: &str) {
        std::fs::write(self.path(name), b"").expect("touch");
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.path(name)).unwrap_or_default()
    }

    /// A fake-claude op that blocks until the test creates `name`.
    fn wait_op(&self, name: &str) -> Value {
        json!({"op": "shell", "command": format!("while [ ! -e {} ]; do sleep 0.05; done", self.sh(name))})
    }
}

/// The repository's `.zerg/monitor.log`.
fn monitor(repo: &TestRepo) -> String {
    std::fs::read_to_string(repo.path.join(".zerg/monitor.log")).unwrap_or_default()
}

/// A zergctl child of the test with its stdout and stderr (where a followed rush's events go)
/// collected line by line into one shared buffer.
struct Follower {
    child: Child,
    out: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Follower {
    fn start(d: &Daemon, repo: &TestRepo, args: &[&str]) -> Follower {
        let mut child = Command::new(bin("zergctl"))
            .args(args)
            .current_dir(&repo.path)
            .env("ZERG_SOCKET", &d.socket)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("zergctl starts");
        let out = Arc::new(Mutex::new(String::new()));
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        let readers = vec![
            Self::collect(stdout, out.clone()),
            Self::collect(stderr, out.clone()),
        ];
        Follower {
            child,
            out,
            readers,
        }
    }

    fn collect(
        stream: impl std::io::Read + Send + 'static,
        sink: Arc<Mutex<String>>,
    ) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let mut s = sink.lock().expect("lock");
                s.push_str(&line);
                s.push('\n');
            }
        })
    }

    fn text(&self) -> String {
        self.out.lock().expect("lock").clone()
    }

    /// Waits until the output holds `needle`.
    fn wait_for(&self, needle: &str) {
        wait_value(
            &format!("zergctl to print {needle:?}"),
            || format!("printed so far:\n{}", self.text()),
            || self.text().contains(needle).then_some(()),
        );
    }

    /// Waits for the child to exit by itself and returns how, once all it printed is read.
    fn wait_exit(&mut self) -> std::process::ExitStatus {
        let out = self.out.clone();
        let status = wait_value(
            "zergctl to exit",
            || format!("printed so far:\n{}", out.lock().expect("lock")),
            || self.child.try_wait().expect("try_wait"),
        );
        for r in self.readers.drain(..) {
            r.join().expect("reader");
        }
        status
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Asserts that a zergctl invocation succeeded.
fn ok(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A two-level graph: `<P>-L1-001` creates `a.txt`, `<P>-L2-001` (after it) creates `b.txt`.
fn two_levels(feature: &str, prefix: &str) -> String {
    json!({"feature": feature, "tasks": [
        {"id": format!("{prefix}-L1-001"), "title": "first", "level": 1,
         "files": {"create": ["a.txt"], "modify": [], "read": []}},
        {"id": format!("{prefix}-L2-001"), "title": "second", "level": 2,
         "dependencies": [format!("{prefix}-L1-001")],
         "files": {"create": ["b.txt"], "modify": [], "read": []}}
    ]})
    .to_string()
}

#[test]
fn a_failed_required_gate_pauses_the_rush_and_retry_resumes_it_once_the_user_fixes_staging() {
    let repo = TestRepo::new();
    repo.write_graph("gate", &two_levels("gate", "Q"));
    // The gate checks the merged code on staging for a file that only the user adds.
    repo.configure(&config().gate("release-check", "echo checking; test -f approved.txt", true));
    let d = Daemon::start();
    let out = d.ctl_in(&repo.path, &["rush", "gate", "--workers", "1"]);
    let followed = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        out.status.code(),
        Some(1),
        "a paused rush exits 1:\n{followed}"
    );
    assert!(followed.contains("release-check"), "{followed}");

    let st = d.status(&repo.path, "gate").expect("status");
    assert_eq!(st["state"], "paused", "{st}");
    let reason = st["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("quality gate 'release-check' failed on staging after level 1")
            && reason.contains("checking"),
        "{reason}"
    );
    assert_eq!(st["tasks"]["Q-L1-001"]["status"], "complete");
    assert_eq!(
        st["tasks"]["Q-L2-001"]["status"], "pending",
        "level 2 does not start on a level whose gate failed"
    );
    let text =
        String::from_utf8_lossy(&d.ctl_in(&repo.path, &["status", "gate"]).stdout).to_string();
    assert!(
        text.contains("PAUSED") && text.contains("quality gate 'release-check' failed"),
        "status shows the gate failure:\n{text}"
    );
    assert!(
        monitor(&repo).contains("quality gate 'release-check' failed on staging after level 1"),
        "{}",
        monitor(&repo)
    );

    // The fix docs/Troubleshooting.md gives: a commit in the staging worktree, then retry.
    let staging = repo.path.join(".zerg-worktrees/gate/staging");
    std::fs::write(staging.join("approved.txt"), "ok\n").unwrap();
    git(&staging, &["add", "approved.txt"]);
    git(&staging, &["commit", "-q", "-m", "approve"]);
    ok(&d.ctl_in(&repo.path, &["retry", "gate"]));
    let st = d.wait_end(&repo.path, "gate", T);
    assert_eq!(st["state"], "complete", "{st}");
    assert_eq!(
        repo.task_ids_on("zerg/gate/staging"),
        vec!["Q-L1-001", "Q-L2-001"]
    );
    let files = repo.files_on("zerg/gate/staging");
    for f in ["a.txt", "b.txt", "approved.txt"] {
        assert!(files.iter().any(|x| x == f), "{f} on staging: {files:?}");
    }
}

#[test]
fn an_optional_gate_that_fails_is_logged_and_the_rush_goes_on() {
    let repo = TestRepo::new();
    repo.write_graph("opt", &two_levels("opt", "O"));
    repo.configure(&config().gate("advisory", "echo advisory-says-no; exit 3", false));
    let d = Daemon::start();
    let out = d.ctl_in(&repo.path, &["rush", "opt", "--workers", "1"]);
    ok(&out);
    let st = d.status(&repo.path, "opt").expect("status");
    assert_eq!(st["state"], "complete", "{st}");
    // The gate did run, and failed, after each level.
    for level in [1, 2] {
        let log = std::fs::read_to_string(
            repo.path
                .join(format!(".zerg/logs/gate-advisory-level-{level}.log")),
        )
        .unwrap_or_default();
        assert!(log.contains("advisory-says-no"), "level {level}: {log:?}");
    }
    let zergd_log = format!("{}{}", d.log(), d.state_log());
    assert!(
        zergd_log.contains("advisory"),
        "the optional gate's failure is in zergd's log:\n{zergd_log}"
    );
}

/// The tasks of [`tiers_graph`]: the one that fails tier 1, tier 2, tier 3, and none.
const TIER_TASKS: [&str; 4] = ["V-L1-001", "V-L1-002", "V-L1-003", "V-L1-004"];

fn tiers_graph(feature: &str) -> String {
    let tasks: Vec<Value> = TIER_TASKS
        .iter()
        .enumerate()
        .map(|(i, id)| {
            json!({"id": id, "title": format!("tiers {i}"), "level": 1,
                   "files": {"create": [format!("v{i}.txt")], "modify": [], "read": []}})
        })
        .collect();
    json!({"feature": feature, "tasks": tasks}).to_string()
}

/// Tier N fails for the task `V-L1-00N` only; each tier prints that it ran.
fn tiers_config(mut config: Config, blocking: [bool; 3]) -> Config {
    config = config.set("verification_tiers.timeout_seconds", 60);
    for (i, b) in blocking.iter().enumerate() {
        let n = i + 1;
        config = config
            .set(
                &format!("verification_tiers.tier{n}_command"),
                format!("echo tier{n}-ran; test \"$ZERG_TASK_ID\" != V-L1-00{n}"),
            )
            .set(&format!("verification_tiers.tier{n}_blocking"), b);
    }
    config
}

#[test]
fn verification_tiers_one_to_three_run_and_only_a_blocking_failure_fails_the_task() {
    // Each flag is tried both ways across the two rushes.
    let cases: [(&str, [bool; 3]); 2] = [
        ("tiersa", [true, false, true]),
        ("tiersb", [false, true, false]),
    ];
    let d = Daemon::start();
    let repos: Vec<TestRepo> = cases
        .iter()
        .map(|(feature, blocking)| {
            let repo = TestRepo::new();
            repo.write_graph(feature, &tiers_graph(feature));
            repo.configure(&tiers_config(
                config().set("workers.retry_attempts", 0),
                *blocking,
            ));
            ok(&d.ctl_in(&repo.path, &["rush", feature, "--workers", "2", "--detach"]));
            repo
        })
        .collect();
    for ((feature, blocking), repo) in cases.iter().zip(&repos) {
        let st = d.wait_end(&repo.path, feature, T);
        for (i, id) in TIER_TASKS.iter().enumerate() {
            let task = &st["tasks"][id];
            let fails_blocking = i < 3 && blocking[i];
            if fails_blocking {
                assert_eq!(task["status"], "failed", "{feature} {id}: {st}");
                let err = task["error"].as_str().unwrap_or_default();
                assert!(
                    err.contains(&format!("tier {}", i + 1)),
                    "{feature} {id}: {err}"
                );
            } else {
                assert_eq!(task["status"], "complete", "{feature} {id}: {st}");
            }
        }
        // Every tier ran for the task that passes them all.
        for n in 1..=3 {
            let out = std::fs::read_to_string(repo.path.join(format!(
                ".zerg/logs/tasks/V-L1-004/verification-tier{n}.txt"
            )))
            .unwrap_or_default();
            assert!(
                out.contains(&format!("tier{n}-ran")),
                "{feature} tier {n}: {out:?}"
            );
        }
    }
}

/// Process ids of the live members of the process group `pgid`.
fn group_members(pgid: i32) -> Vec<i32> {
    procfs::group_members(pgid)
        .into_iter()
        .map(|(pid, _)| pid)
        .collect()
}

#[test]
fn stop_sends_sigterm_then_sigkill_no_sooner_than_the_grace_to_an_agent_that_traps_sigterm() {
    let sig = Signals::new();
    let repo = TestRepo::new();
    repo.write_graph(
        "trap",
        &json!({"feature": "trap", "tasks": [
            {"id": "S-L1-001", "title": "stubborn", "level": 1, "files": {"create": ["s.txt"], "modify": [], "read": []}}
        ]})
        .to_string(),
    );
    // Long enough for the test to see the agent survive SIGTERM and to tell the grace from a
    // prompt SIGKILL; the test waits it out once.
    let grace = 6.0;
    repo.configure(&config().set("workers.stop_grace_seconds", grace));
    // The agent records SIGTERM (with the time it saw it) and goes on, noting the time every
    // 50 ms; asked after SIGTERM, it says it is still alive. Its output goes nowhere: the
    // worker agent that read it is gone at SIGTERM, and a write to the closed pipe would end
    // it by SIGPIPE.
    let script = format!(
        "exec >/dev/null 2>&1; trap 'echo TERM >> {log}; date +%s.%N > {term_at}' TERM; echo $$ > {pid}; \
         while :; do if [ -e {ask} ]; then rm -f {ask}; echo alive-after-TERM >> {log}; fi; \
         date +%s.%N >> {alive}; sleep 0.05; done",
        log = sig.sh("trap.log"),
        term_at = sig.sh("term-at"),
        alive = sig.sh("alive-at"),
        pid = sig.sh("agent.pid"),
        ask = sig.sh("ask"),
    );
    repo.write_script(
        "trap",
        &json!({"default": [{"op": "shell", "command": script}]}),
    );
    let d = Daemon::start();
    ok(&d.ctl_in(&repo.path, &["rush", "trap", "--workers", "1", "--detach"]));
    let agent: i32 = wait_value(
        "the agent to start",
        || d.log(),
        || sig.read("agent.pid").trim().parse().ok(),
    );
    let st = d.wait_for(&repo.path, "trap", T, "the task running", |s| {
        tasks_with(s, "in_progress").len() == 1 && !worker_pids(s).is_empty()
    });
    let worker = worker_pids(&st)[0];
    assert!(
        group_members(worker).contains(&agent),
        "the agent runs in the worker's process group {worker}"
    );

    ok(&d.ctl_in(&repo.path, &["stop", "trap"]));
    wait_value(
        "SIGTERM to reach the agent",
        || {
            format!(
                "trap.log: {:?}; agent alive: {}; group: {:?}\nmonitor.log:\n{}\nzergd:\n{}",
                sig.read("trap.log"),
                alive(agent),
                group_members(worker),
                monitor(&repo),
                d.log()
            )
        },
        || sig.read("trap.log").contains("TERM").then_some(()),
    );
    // SIGTERM did not end it, and no SIGKILL came with it: it still answers.
    sig.touch("ask");
    wait_value(
        "the agent to answer after SIGTERM",
        || {
            format!(
                "trap.log: {:?}; agent alive: {}",
                sig.read("trap.log"),
                alive(agent)
            )
        },
        || {
            sig.read("trap.log")
                .contains("alive-after-TERM")
                .then_some(())
        },
    );
    // Only SIGKILL ends a loop that traps SIGTERM; the whole group goes with it.
    wait_value(
        "the worker's process group to be killed",
        || format!("members: {:?}", group_members(worker)),
        || group_members(worker).is_empty().then_some(()),
    );
    assert!(!alive(agent));
    assert_eq!(
        sig.read("trap.log").lines().collect::<Vec<_>>(),
        vec!["TERM", "alive-after-TERM"],
        "one SIGTERM, then nothing the agent could see"
    );
    // The SIGKILL came no sooner than the grace after the SIGTERM: the agent was still noting
    // the time (nearly) a whole grace period after it saw SIGTERM. Its last note is a lower
    // bound of the moment of the SIGKILL; the second of slack is for a loaded machine's
    // scheduling of a 50 ms loop, far below the grace a prompt SIGKILL would fall short by.
    let term_at: f64 = sig.read("term-at").trim().parse().expect("SIGTERM time");
    let last_alive: f64 = sig
        .read("alive-at")
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .fold(f64::MIN, f64::max);
    assert!(
        last_alive - term_at >= grace - 1.0,
        "SIGKILL {:.2}s after SIGTERM, grace {grace}s",
        last_alive - term_at
    );
    let st = d.wait_end(&repo.path, "trap", T);
    assert_eq!(st["state"], "stopped", "{st}");
    assert_eq!(
        st["tasks"]["S-L1-001"]["status"], "pending",
        "the task is requeued"
    );
}

#[test]
fn retry_of_named_tasks_requeues_only_those_and_reset_zeroes_their_attempts() {
    let repo = TestRepo::new();
    repo.write_graph(
        "rt",
        &json!({"feature": "rt", "tasks": [
            {"id": "R-L1-001", "title": "a", "level": 1, "files": {"create": ["a.txt"], "modify": [], "read": []}},
            {"id": "R-L1-002", "title": "b", "level": 1, "files": {"create": ["b.txt"], "modify": [], "read": []}},
            {"id": "R-L2-001", "title": "c", "level": 2, "dependencies": ["R-L1-002"], "files": {"create": ["c.txt"], "modify": [], "read": []}}
        ]})
        .to_string(),
    );
    repo.configure(&config().set("workers.retry_attempts", 1));
    // Both level-1 tasks fail their first two attempts and succeed from the third on.
    let flaky = json!({"attempts": [
        [{"op": "stderr", "text": "flaky"}, {"op": "exit", "code": 1}],
        [{"op": "stderr", "text": "flaky"}, {"op": "exit", "code": 1}],
        [{"op": "write_owned"}]
    ]});
    repo.write_script(
        "rt",
        &json!({"tasks": {"R-L1-001": flaky, "R-L1-002": flaky}}),
    );
    let d = Daemon::start();
    let out = d.ctl_in(&repo.path, &["rush", "rt", "--workers", "2"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let st = d.status(&repo.path, "rt").expect("status");
    assert_eq!(st["state"], "failed", "{st}");
    assert_eq!(tasks_with(&st, "failed"), vec!["R-L1-001", "R-L1-002"]);
    assert_eq!(tasks_with(&st, "blocked"), vec!["R-L2-001"]);

    let out = d.ctl_in(&repo.path, &["retry", "rt", "R-L9-999"]);
    assert_eq!(out.status.code(), Some(66), "an unknown task id");

    // Only the named task is requeued: the other failed task and its dependent stay as they are.
    ok(&d.ctl_in(&repo.path, &["retry", "rt", "R-L1-001"]));
    let st = d.wait_for(
        &repo.path,
        "rt",
        T,
        "R-L1-001 to complete and the rush to end",
        |s| s["tasks"]["R-L1-001"]["status"] == "complete" && s["state"] == "failed",
    );
    assert_eq!(
        st["tasks"]["R-L1-001"]["attempts"], 3,
        "counted on from 2: {st}"
    );
    assert_eq!(st["tasks"]["R-L1-002"]["status"], "failed", "{st}");
    assert_eq!(st["tasks"]["R-L1-002"]["attempts"], 2, "{st}");
    assert_eq!(st["tasks"]["R-L2-001"]["status"], "blocked", "{st}");

    // `--reset`: the requeued task counts its attempts from zero again; its dependent goes too.
    ok(&d.ctl_in(&repo.path, &["retry", "rt", "R-L1-002", "--reset"]));
    let st = d.wait_end(&repo.path, "rt", T);
    assert_eq!(st["state"], "complete", "{st}");
    assert_eq!(
        st["tasks"]["R-L1-002"]["attempts"], 1,
        "one attempt since the reset: {st}"
    );
    assert_eq!(
        st["tasks"]["R-L1-001"]["attempts"], 3,
        "not named, not reset: {st}"
    );
    assert_eq!(
        repo.task_ids_on("zerg/rt/staging"),
        vec!["R-L1-001", "R-L1-002", "R-L2-001"]
    );
}

#[test]
fn logs_follow_prints_lines_the_worker_writes_after_it_started() {
    let sig = Signals::new();
    let repo = TestRepo::new();
    repo.write_graph(
        "lf",
        &json!({"feature": "lf", "tasks": [
            {"id": "L-L1-001", "title": "talker", "level": 1, "files": {"create": ["l.txt"], "modify": [], "read": []}}
        ]})
        .to_string(),
    );
    repo.configure(&config());
    repo.write_script(
        "lf",
        &json!({"default": [sig.wait_op("go"), {"op": "write_owned"}]}),
    );
    let d = Daemon::start();
    ok(&d.ctl_in(&repo.path, &["rush", "lf", "--workers", "1", "--detach"]));
    // The worker has said which task it took, and waits in it.
    let log = repo.path.join(".zerg/logs/worker-0.log");
    let started = "zerg-worker-agent: task L-L1-001 (attempt 1";
    let finished = "zerg-worker-agent: task L-L1-001 committed";
    wait_value(
        "the worker log to name the task",
        || d.log(),
        || {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains(started)
                .then_some(())
        },
    );
    let follow = Follower::start(&d, &repo, &["logs", "lf", "--follow"]);
    // Following: it has printed what was there.
    follow.wait_for(&format!("[W0] {started}"));
    assert!(!follow.text().contains(finished));
    sig.touch("go");
    // The worker's next line, written after `logs --follow` started.
    follow.wait_for(&format!("[W0] {finished}"));
    drop(follow);
    let st = d.wait_end(&repo.path, "lf", T);
    assert_eq!(st["state"], "complete", "{st}");
}

#[test]
fn status_watch_exits_0_when_the_rush_ends_even_failed() {
    let sig = Signals::new();
    let repo = TestRepo::new();
    repo.write_graph(
        "sw",
        &json!({"feature": "sw", "tasks": [
            {"id": "W-L1-001", "title": "doomed", "level": 1, "files": {"create": ["w.txt"], "modify": [], "read": []}}
        ]})
        .to_string(),
    );
    repo.configure(&config().set("workers.retry_attempts", 0));
    repo.write_script(
        "sw",
        &json!({"default": [sig.wait_op("go"), {"op": "exit", "code": 1}]}),
    );
    let d = Daemon::start();
    ok(&d.ctl_in(&repo.path, &["rush", "sw", "--workers", "1", "--detach"]));
    d.wait_for(&repo.path, "sw", T, "the task running", |s| {
        tasks_with(s, "in_progress").len() == 1
    });
    let mut watch = Follower::start(&d, &repo, &["status", "sw", "--watch"]);
    assert!(
        watch.child.try_wait().unwrap().is_none(),
        "still watching a running rush: {}",
        watch.text()
    );
    sig.touch("go");
    let code = watch.wait_exit();
    let text = watch.text();
    assert_eq!(code.code(), Some(0), "{text}");
    // It followed the rush to its end: the failure and the end are in what it printed.
    assert!(
        text.contains("W-L1-001") && text.contains("failed"),
        "{text}"
    );
    assert_eq!(d.status(&repo.path, "sw").unwrap()["state"], "failed");
}

#[test]
fn ctrl_c_detaches_from_a_followed_rush_with_exit_0_and_the_rush_goes_on() {
    let sig = Signals::new();
    let repo = TestRepo::new();
    repo.write_graph("cc", &two_levels("cc", "C"));
    repo.configure(&config());
    repo.write_script(
        "cc",
        &json!({"tasks": {"C-L1-001": [sig.wait_op("go"), {"op": "write_owned"}]}}),
    );
    let d = Daemon::start();
    let mut rush = Follower::start(&d, &repo, &["rush", "cc", "--workers", "1", "--verbose"]);
    // Following: it has printed the claim of the first task.
    rush.wait_for("C-L1-001");
    d.wait_for(&repo.path, "cc", T, "the task running", |s| {
        tasks_with(s, "in_progress") == ["C-L1-001"]
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(rush.child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .expect("SIGINT");
    let code = rush.wait_exit();
    assert_eq!(code.code(), Some(0), "{}", rush.text());
    assert!(
        rush.text().contains("Detached; the rush goes on"),
        "{}",
        rush.text()
    );
    let st = d.status(&repo.path, "cc").expect("status");
    assert_eq!(st["state"], "running", "the rush goes on: {st}");
    assert_eq!(st["tasks"]["C-L1-001"]["status"], "in_progress", "{st}");
    sig.touch("go");
    let st = d.wait_end(&repo.path, "cc", T);
    assert_eq!(st["state"], "complete", "{st}");
    assert_eq!(
        repo.task_ids_on("zerg/cc/staging"),
        vec!["C-L1-001", "C-L2-001"]
    );
}

/// A datagram socket standing in for systemd's `NOTIFY_SOCKET`.
struct NotifySocket {
    _dir: tempfile::TempDir,
    path: PathBuf,
    sock: std::os::unix::net::UnixDatagram,
}

impl NotifySocket {
    fn bind() -> NotifySocket {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let sock = std::os::unix::net::UnixDatagram::bind(&path).expect("bind");
        sock.set_read_timeout(Some(T)).unwrap();
        NotifySocket {
            _dir: dir,
            path,
            sock,
        }
    }

    /// The next datagram, as text.
    fn recv(&self, d: &Daemon) -> String {
        let mut buf = [0u8; 4096];
        let n = self
            .sock
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("no notification from zergd: {e}; log:\n{}", d.log()));
        String::from_utf8_lossy(&buf[..n]).to_string()
    }
}

#[test]
fn zergd_tells_the_service_manager_ready_once_its_socket_answers() {
    let notify = NotifySocket::bind();
    let d = Daemon::builder()
        .env("NOTIFY_SOCKET", notify.path.to_string_lossy())
        .start_unready();
    // Nothing has connected to zergd yet: READY=1 is zergd's own doing, not a reply to a
    // client's first call.
    let msg = notify.recv(&d);
    assert!(msg.lines().any(|l| l == "READY=1"), "{msg:?}");
    // At READY the socket is already listening: a connection made the moment READY arrives
    // is accepted (it queues until served), with no retry.
    if let Err(e) = std::os::unix::net::UnixStream::connect(&d.socket) {
        panic!(
            "READY=1 came before the socket listened: {e}\nlog:\n{}",
            d.log()
        );
    }
    // And a call on it is answered.
    let out = d.ctl(&["list"]);
    assert!(
        out.status.success(),
        "READY=1 came before the socket answered: {}\nlog:\n{}",
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
}

#[test]
fn zergd_pings_the_watchdog_systemd_asked_for_over_and_over() {
    let notify = NotifySocket::bind();
    // systemd asks for a ping at least every 0.4 s: zergd pings every 0.2 s.
    let d = Daemon::builder()
        .env("NOTIFY_SOCKET", notify.path.to_string_lossy())
        .env("WATCHDOG_USEC", "400000")
        .start_unready();
    let mut pings = 0;
    let mut seen = Vec::new();
    while pings < 10 {
        let msg = notify.recv(&d);
        if msg.lines().any(|l| l == "WATCHDOG=1") {
            pings += 1;
        }
        seen.push(msg);
    }
    assert!(
        seen.iter().any(|m| m.lines().any(|l| l == "READY=1")),
        "{seen:?}"
    );
    // Pinging is no sign of a stuck loop: zergd still answers.
    ok(&d.ctl(&["list"]));
}

#[test]
fn reconciliation_in_a_live_zergd_fixes_drifted_state_and_logs_each_fix() {
    let sig = Signals::new();
    let repo = TestRepo::new();
    repo.write_graph(
        "rec",
        &json!({"feature": "rec", "tasks": [
            {"id": "N-L1-001", "title": "first", "level": 1, "files": {"create": ["n1.txt"], "modify": [], "read": []}},
            {"id": "N-L2-001", "title": "second", "level": 2, "dependencies": ["N-L1-001"], "files": {"create": ["n2.txt"], "modify": [], "read": []}},
            {"id": "N-L2-002", "title": "third", "level": 2, "dependencies": ["N-L1-001"], "files": {"create": ["n3.txt"], "modify": [], "read": []}}
        ]})
        .to_string(),
    );
    repo.configure(&config().set("workers.reconcile_interval_seconds", 0.5));
    repo.write_script(
        "rec",
        &json!({"tasks": {"N-L1-001": [sig.wait_op("go"), {"op": "write_owned"}]}}),
    );
    let mut d = Daemon::start();
    ok(&d.ctl_in(&repo.path, &["rush", "rec", "--workers", "1", "--detach"]));
    d.wait_for(&repo.path, "rec", T, "level 1 running", |s| {
        tasks_with(s, "in_progress") == ["N-L1-001"]
    });
    // With zergd down, the state drifts as an older writer (the original ZERG) leaves it: tasks
    // without a level, and a level marked complete whose tasks have not run.
    d.kill9();
    let path = repo.path.join(".zerg/state/rec.json");
    let mut state: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for id in ["N-L2-001", "N-L2-002"] {
        state["tasks"][id]
            .as_object_mut()
            .expect("task in the state file")
            .remove("level");
    }
    state["levels"]["2"]["status"] = json!("complete");
    std::fs::write(&path, serde_json::to_vec_pretty(&state).unwrap()).unwrap();
    d.restart();
    let log = wait_value(
        "reconciliation to log its fixes",
        || monitor(&repo),
        || {
            let log = monitor(&repo);
            (log.contains("task N-L2-001 had no level")
                && log.contains("task N-L2-002 had no level")
                && log.contains("level 2 was marked complete with unfinished tasks"))
            .then_some(log)
        },
    );
    assert!(log.contains("Reconciliation fixed a divergence"), "{log}");
    sig.touch("go");
    let st = d.wait_end(&repo.path, "rec", T);
    assert_eq!(st["state"], "complete", "{st}");
    assert!(
        st["resilience"]["reconcile_fixes"].as_u64().unwrap_or(0) >= 3,
        "{}",
        st["resilience"]
    );
    for id in ["N-L2-001", "N-L2-002"] {
        assert_eq!(st["tasks"][id]["level"], 2, "{st}");
    }
    assert_eq!(
        repo.task_ids_on("zerg/rec/staging"),
        vec!["N-L1-001", "N-L2-001", "N-L2-002"]
    );
}

#[test]
fn a_merge_conflict_resolved_as_documented_then_retry_completes_the_rush() {
    let sig = Signals::new();
    let repo = TestRepo::new();
    repo.write_graph(
        "mr",
        &json!({"feature": "mr", "tasks": [
            {"id": "M-L1-001", "title": "owner", "level": 1, "files": {"create": ["x.txt"], "modify": [], "read": []}},
            {"id": "M-L1-002", "title": "trespasser", "level": 1, "files": {"create": ["y.txt"], "modify": [], "read": []}},
            {"id": "M-L2-001", "title": "later", "level": 2, "dependencies": ["M-L1-001", "M-L1-002"], "files": {"create": ["z.txt"], "modify": [], "read": ["x.txt"]}}
        ]})
        .to_string(),
    );
    // `merge.resolve: pause`: the conflict is the person's to resolve.
    repo.configure(&config().set("merge.resolve", "pause"));
    // A barrier: each level-1 task waits until both have started, so two workers hold them.
    let barrier = |me: &str| {
        json!({"op": "shell", "command": format!(
            "touch {mine}; while [ ! -e {a} ] || [ ! -e {b} ]; do sleep 0.05; done",
            mine = sig.sh(me), a = sig.sh("M-L1-001"), b = sig.sh("M-L1-002")
        )})
    };
    // M-L1-002 also writes x.txt, which M-L1-001 owns, with other content.
    repo.write_script("mr", &json!({"tasks": {
        "M-L1-001": [barrier("M-L1-001"), {"op": "write_owned"}],
        "M-L1-002": [barrier("M-L1-002"), {"op": "write_owned"}, {"op": "write", "path": "x.txt", "content": "not yours\n"}]
    }}));
    let d = Daemon::start();
    let out = d.ctl_in(&repo.path, &["rush", "mr", "--workers", "2"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let st = d.status(&repo.path, "mr").expect("status");
    assert_eq!(st["state"], "paused", "{st}");
    assert_eq!(st["levels"]["1"]["conflicts"], json!(["x.txt"]));
    let reason = st["reason"].as_str().unwrap_or_default().to_string();
    assert!(reason.contains("x.txt"), "{reason}");
    // `merging worker N`: the worker whose commit the user merges.
    let worker: u32 = reason
        .split("merging worker ")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no worker named in {reason:?}"));

    // The resolution docs/Troubleshooting.md gives, step by step.
    let state: Value = serde_json::from_str(
        &std::fs::read_to_string(repo.path.join(".zerg/state/mr.json")).unwrap(),
    )
    .unwrap();
    let head = state["workers"][worker.to_string()]["accepted_head"]
        .as_str()
        .expect("accepted_head")
        .to_string();
    let staging = repo.path.join(".zerg-worktrees/mr/staging");
    let merge = Command::new("git")
        .arg("-C")
        .arg(&staging)
        .args(["-c", &format!("user.name={}", IDENTITY.0)])
        .args(["-c", &format!("user.email={}", IDENTITY.1), "merge", &head])
        .output()
        .unwrap();
    assert!(
        !merge.status.success(),
        "the merge conflicts as zergd's did"
    );
    std::fs::write(staging.join("x.txt"), "resolved\n").unwrap();
    git(&staging, &["add", "-A"]);
    git(&staging, &["commit", "--no-edit", "-q"]);
    ok(&d.ctl_in(&repo.path, &["retry", "mr"]));
    let st = d.wait_end(&repo.path, "mr", T);
    assert_eq!(st["state"], "complete", "{st}");
    assert_eq!(
        repo.task_ids_on("zerg/mr/staging"),
        vec!["M-L1-001", "M-L1-002", "M-L2-001"]
    );
    assert_eq!(
        git(&repo.path, &["show", "zerg/mr/staging:x.txt"]),
        "resolved"
    );
}

#[test]
fn service_without_home_exits_64_and_one_that_cannot_write_its_unit_exits_70() {
    let dir = tempfile::tempdir().unwrap();
    let service = |home: Option<&std::path::Path>| {
        let mut cmd = Command::new(bin("zergctl"));
        cmd.args(["service", "install"])
            .env_remove("HOME")
            .env_remove("XDG_CONFIG_HOME")
            .stdin(Stdio::null());
        if let Some(h) = home {
            cmd.env("HOME", h);
        }
        cmd.output().expect("zergctl runs")
    };
    let out = service(None);
    assert_eq!(
        out.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A HOME that is a file: the unit's directory cannot be made.
    let home = dir.path().join("home-is-a-file");
    std::fs::write(&home, b"").unwrap();
    let out = service(Some(&home));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(70), "{err}");
    assert!(err.contains("cannot create"), "{err}");
}

/// `budget.task_max_usd` is appended to the agent command as `--max-budget-usd N`, with
/// `agent.profile: claude` only (docs/Configuration-Reference.md, `budget`): the fake agent
/// records the arguments of every invocation (`FAKE_CLAUDE_LOG`).
#[test]
fn budget_task_max_usd_reaches_claude_as_max_budget_usd_and_no_other_profile() {
    let marks = tempfile::tempdir().unwrap();
    let log = marks.path().join("invocations.jsonl");
    let d = Daemon::start_with_env(vec![("FAKE_CLAUDE_LOG".into(), log.display().to_string())]);
    let mut repos = Vec::new();
    for (feature, profile) in [("bc", "claude"), ("bp", "plain")] {
        let repo = TestRepo::new();
        repo.write_graph(feature, &two_levels(feature, &feature.to_uppercase()));
        repo.configure(
            &config()
                .set("budget.task_max_usd", 2.5)
                .set("agent.profile", profile),
        );
        ok(&d.ctl_in(&repo.path, &["rush", feature, "--workers", "1"]));
        let st = d.status(&repo.path, feature).expect("status");
        assert_eq!(st["state"], "complete", "{st}");
        repos.push(repo);
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let mut tasks = Vec::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let task = v["task_id"].as_str().unwrap().to_string();
        let argv: Vec<&str> = v["argv"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let caps: Vec<&[&str]> = argv
            .windows(2)
            .filter(|w| w[0] == "--max-budget-usd")
            .collect();
        if task.starts_with("BC-") {
            assert_eq!(caps, [["--max-budget-usd", "2.5"]], "{task}: {argv:?}");
        } else {
            assert!(
                !argv.contains(&"--max-budget-usd"),
                "{task} (agent.profile: plain): {argv:?}"
            );
        }
        tasks.push(task);
    }
    tasks.sort();
    assert_eq!(tasks, ["BC-L1-001", "BC-L2-001", "BP-L1-001", "BP-L2-001"]);
}

/// zergd's own log rotates daily and keeps the last `--log-retain-days` files
/// (`ZERG_LOG_RETAIN_DAYS`, default 7; docs/Configuration-Reference.md, `logging`): older ones
/// are removed when zergd starts.
#[test]
fn zergd_keeps_the_last_log_retain_days_files_of_its_own_log() {
    /// zergd's log files in its state directory, sorted.
    fn logs(d: &Daemon) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d.state_dir().join("logs"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("zergd.") && n.ends_with(".log"))
            .collect();
        v.sort();
        v
    }
    let old = |n: u32| format!("logs/zergd.2020-01-{n:02}.log");
    for (retain, kept) in [(Some("3"), 8..=9), (None, 4..=9)] {
        let mut b = Daemon::builder();
        // Nine days of old logs, written oldest first.
        for n in 1..=9 {
            b = b.state_file(old(n), format!("day {n}\n"));
        }
        if let Some(days) = retain {
            b = b.env("ZERG_LOG_RETAIN_DAYS", days);
        }
        let d = b.start();
        let files = logs(&d);
        let (today, earlier): (Vec<&String>, Vec<&String>) =
            files.iter().partition(|n| !n.starts_with("zergd.2020-"));
        let want: Vec<String> = kept
            .clone()
            .map(|n| old(n).trim_start_matches("logs/").to_string())
            .collect();
        assert_eq!(earlier, want.iter().collect::<Vec<_>>(), "{retain:?}");
        assert_eq!(
            today.len(),
            1,
            "today's log beside the kept ones: {files:?}"
        );
        assert_eq!(
            files.len(),
            retain.map_or(7, |r| r.parse().unwrap()),
            "{files:?}"
        );
    }
}
