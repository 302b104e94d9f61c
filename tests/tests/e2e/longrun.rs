//! zergd as a long-running service: a rush that ends releases what it held (its worker plane,
//! open files, log-writer threads and in-memory state), `Watch` clients that go are let go,
//! an ended rush is still there for `status`, `list`, `logs` and a resume, and `prune` removes
//! what it left on disk.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use zerg_tests::*;

const T: Duration = Duration::from_secs(120);

/// How long an idle thread of tokio's blocking pool lives (10 s), with room: the bound of the
/// wait for zergd's thread count to come back down, never a figure the test checks.
const SETTLE: Duration = Duration::from_secs(60);

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

fn fds(pid: u32) -> usize {
    count(&format!("/proc/{pid}/fd"))
}

fn threads(pid: u32) -> usize {
    count(&format!("/proc/{pid}/task"))
}

/// The open files of zergd, one per line, for a failure message.
fn fd_list(pid: u32) -> String {
    let mut v: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            std::fs::read_link(e.path())
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        })
        .collect();
    v.sort();
    v.join("\n")
}

/// A repository whose 12-task rush `feature` completes quickly.
fn quick_repo(feature: &str) -> TestRepo {
    let repo = TestRepo::new();
    repo.write_graph(feature, &graph_12(feature));
    repo.configure(&Config::fake_agent().fast_workers());
    repo.write_script(
        feature,
        &json!({"default": [{"op": "tick", "count": 1, "interval_ms": 20}, {"op": "write_owned"}]}),
    );
    repo
}

/// Runs a rush to completion, then waits until zergd has released it: its worker plane's
/// directory is gone, which happens only once nothing of the rush is live.
fn run_to_release(d: &Daemon, repo: &Path, feature: &str) -> Value {
    let out = d.ctl_in(repo, &["rush", feature, "--workers", "3", "--detach"]);
    assert!(out.status.success(), "{out:?}");
    let st = d.wait_end(repo, feature, T);
    assert_eq!(st["state"], "complete", "{st}");
    let id = st["rush_id"].as_str().unwrap().to_string();
    let plane = zergd::worker_plane::plane_dir(&d.socket, &id);
    wait_until(T, "the ended rush's worker plane to close", || {
        !plane.exists()
    });
    st
}

#[test]
fn a_finished_rush_leaves_no_open_file_and_no_thread_behind() {
    let d = Daemon::start();
    let pid = d.pid();
    let threads0 = threads(pid);
    // The first rush warms up what zergd keeps for its whole life (the blocking pool's first
    // threads, the subprocess launcher): counts are taken once it is released.
    let first = quick_repo("soak0");
    run_to_release(&d, &first.path, "soak0");
    wait_until(SETTLE, "zergd's idle threads to end", || {
        threads(pid) <= threads0
    });
    let fds1 = fds(pid);
    let before = fd_list(pid);
    for i in 1..=3 {
        let feature = format!("soak{i}");
        let repo = quick_repo(&feature);
        run_to_release(&d, &repo.path, &feature);
        // Every file, socket and thread of the rush is gone once it is released; a leaked one
        // never goes, and the wait names what is still open.
        if !poll(SETTLE, || fds(pid) <= fds1 && threads(pid) <= threads0) {
            panic!(
                "after rush {i}: {} fds (was {fds1}), {} threads (was {threads0});\nopen before:\n{before}\nopen now:\n{}",
                fds(pid),
                threads(pid),
                fd_list(pid)
            );
        }
    }
    // Released is not forgotten: `list` has all four from their summaries, and status, logs
    // and a second status load an ended rush from its files.
    let list: Value = serde_json::from_slice(&d.ctl(&["list", "--json"]).stdout).unwrap();
    let rows = list.as_array().unwrap();
    assert_eq!(rows.len(), 4, "{list}");
    for r in rows {
        assert_eq!(r["state"], "complete", "{r}");
        assert_eq!(r["tasks_complete"], 12, "{r}");
        assert_eq!(r["tasks_total"], 12, "{r}");
    }
    let st = d
        .status(&first.path, "soak0")
        .expect("status of a released rush");
    assert_eq!(st["state"], "complete");
    assert_eq!(tasks_with(&st, "complete").len(), 12);
    let logs = d.ctl_in(&first.path, &["logs", "soak0", "--tail", "5"]);
    assert!(logs.status.success(), "{logs:?}");
    assert!(
        !logs.stdout.is_empty(),
        "logs of a released rush print its workers' output"
    );
}

#[test]
fn watch_clients_that_connect_and_drop_are_released_with_the_rush() {
    let d = Daemon::start();
    let pid = d.pid();
    let repo = TestRepo::new();
    repo.write_graph("watched", &graph_12("watched"));
    repo.configure(&Config::fake_agent().fast_workers());
    // Tasks that take a while, so the clients come and go while the rush runs.
    repo.write_script(
        "watched",
        &json!({"default": [{"op": "tick", "count": 10, "interval_ms": 100}, {"op": "write_owned"}]}),
    );
    let out = d.ctl_in(
        &repo.path,
        &["rush", "watched", "--workers", "3", "--detach"],
    );
    assert!(out.status.success(), "{out:?}");
    let st = d.wait_for(&repo.path, "watched", T, "a running task", |s| {
        !tasks_with(s, "in_progress").is_empty()
    });
    let id = st["rush_id"].as_str().unwrap().to_string();
    let fds_running = fds(pid);
    // A hundred clients, each taking its first snapshot, then gone.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut streams = Vec::new();
        for _ in 0..100 {
            let ch = zerg_proto::transport::connect(&d.socket).await.unwrap();
            let mut c = zerg_proto::v1::control_client::ControlClient::new(ch);
            let mut s = c
                .watch(zerg_proto::v1::WatchRequest {
                    repo: repo.path.to_string_lossy().into_owned(),
                    feature: "watched".into(),
                    deltas: false,
                })
                .await
                .unwrap()
                .into_inner();
            let first = s.message().await.unwrap().expect("a first snapshot");
            assert!(first.status.is_some());
            streams.push((c, s));
        }
        drop(streams);
    });
    drop(rt);
    let st = d.wait_end(&repo.path, "watched", T);
    assert_eq!(st["state"], "complete", "{st}");
    // Released: the gone clients do not hold the rush, nor their connections' files.
    let plane = zergd::worker_plane::plane_dir(&d.socket, &id);
    wait_until(
        T,
        "the rush to be released despite 100 gone watchers",
        || !plane.exists(),
    );
    if !poll(SETTLE, || fds(pid) < fds_running) {
        panic!(
            "{} fds open after the rush (were {fds_running} while it ran):\n{}",
            fds(pid),
            fd_list(pid)
        );
    }
}

#[test]
fn a_restarted_zergd_lists_ended_rushes_without_loading_them_and_resumes_a_failed_one() {
    let mut d = Daemon::start();
    let done = quick_repo("kept");
    run_to_release(&d, &done.path, "kept");
    // A failed rush: every task's agent fails for good.
    let failing = TestRepo::new();
    failing.write_graph("broken", &graph_12("broken"));
    failing.configure(
        &Config::fake_agent()
            .fast_workers()
            .set("workers.retry_attempts", 0),
    );
    // Every task fails until this file exists: the fix a user makes outside zerg's files.
    let fixed = failing.path.parent().unwrap().join("fixed");
    failing.write_script(
        "broken",
        &json!({"default": [
            {"op": "wait_for_file", "path": fixed.to_string_lossy(), "timeout_ms": 1},
            {"op": "write_owned"}
        ]}),
    );
    let out = d.ctl_in(
        &failing.path,
        &["rush", "broken", "--workers", "2", "--detach"],
    );
    assert!(out.status.success(), "{out:?}");
    let st = d.wait_end(&failing.path, "broken", T);
    assert_eq!(st["state"], "failed", "{st}");
    d.restart();
    // The registry has each ended rush's summary: `list` shows them as they ended, though no
    // state file is read for it (the complete rush's state is gone and it still lists).
    std::fs::rename(
        done.path.join(".zerg/state/kept.json"),
        done.path.join(".zerg/state/kept.json.moved"),
    )
    .unwrap();
    let list: Value = serde_json::from_slice(&d.ctl(&["list", "--json"]).stdout).unwrap();
    let by = |f: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|r| r["feature"] == f)
            .cloned()
            .unwrap_or_else(|| panic!("{f} missing from {list}"))
    };
    assert_eq!(by("kept")["state"], "complete");
    assert_eq!(by("kept")["tasks_complete"], 12);
    assert_eq!(by("broken")["state"], "failed");
    // Status of a rush whose files are gone says so.
    let out = d.ctl_in(&done.path, &["status", "kept"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("kept.json") || err.contains("gone"), "{err}");
    // The failed rush resumes from its files, and with the fix every task completes.
    std::fs::write(&fixed, "").unwrap();
    let out = d.ctl_in(&failing.path, &["retry", "broken"]);
    assert!(out.status.success(), "{out:?}");
    let st = d.wait_end(&failing.path, "broken", T);
    assert_eq!(st["state"], "complete", "{st}");
}

#[test]
fn prune_removes_what_ended_rushes_left_and_keeps_the_rest_with_reasons() {
    let d = Daemon::start();
    let repo = quick_repo("old");
    run_to_release(&d, &repo.path, "old");
    // A second, stopped rush in the same repository whose worker left uncommitted work.
    repo.write_graph("halted", &graph_12("halted"));
    repo.write_script(
        "halted",
        &json!({"default": [{"op": "tick", "count": 600, "interval_ms": 100}]}),
    );
    let out = d.ctl_in(
        &repo.path,
        &["rush", "halted", "--workers", "2", "--detach"],
    );
    assert!(out.status.success(), "{out:?}");
    d.wait_for(&repo.path, "halted", T, "a running task", |s| {
        !tasks_with(s, "in_progress").is_empty()
    });
    // Running: prune keeps it whole and says why.
    let out = d.ctl_in(&repo.path, &["prune", "--feature", "halted"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("kept halted (running)"), "{text}");
    assert!(repo.path.join(".zerg/state/halted.json").exists());
    let out = d.ctl_in(&repo.path, &["stop", "halted", "--force"]);
    assert!(out.status.success(), "{out:?}");
    d.wait_end(&repo.path, "halted", T);
    std::fs::write(
        repo.path
            .join(".zerg-worktrees/halted/worker-0/uncommitted.txt"),
        "work in progress\n",
    )
    .unwrap();
    // status shows what each uses on disk.
    let st = d.status(&repo.path, "old").unwrap();
    assert!(st["disk"]["state_bytes"].as_u64().unwrap() > 0, "{st}");
    let text =
        String::from_utf8_lossy(&d.ctl_in(&repo.path, &["status", "old"]).stdout).into_owned();
    assert!(text.contains("Disk: "), "{text}");
    // A dry run says what would go and removes nothing.
    let out = d.ctl_in(&repo.path, &["prune", "--dry-run", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let dry: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(dry["dry_run"], true);
    assert!(repo.path.join(".zerg/state/old.json").exists());
    // An --older-than the rushes are not old enough for keeps both.
    let out = d.ctl_in(&repo.path, &["prune", "--older-than", "30d", "--json"]);
    let kept: Value = serde_json::from_slice(&out.stdout).unwrap();
    for r in kept["rushes"].as_array().unwrap() {
        assert_eq!(r["pruned"], false, "{kept}");
        assert!(
            r["kept"][0]
                .as_str()
                .unwrap()
                .contains("within --older-than"),
            "{kept}"
        );
    }
    let out = d.ctl_in(&repo.path, &["prune", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let done: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        done["rushes"], dry["rushes"],
        "the dry run said what prune did"
    );
    for f in ["old", "halted"] {
        assert!(
            !repo.path.join(format!(".zerg/state/{f}.json")).exists(),
            "{f}"
        );
        assert!(!repo.path.join(format!(".zerg/rush/{f}")).exists(), "{f}");
    }
    // The uncommitted work and its branch stay; the complete rush's result stays; the logs go
    // with the repository's last rush.
    assert!(
        repo.path
            .join(".zerg-worktrees/halted/worker-0/uncommitted.txt")
            .exists()
    );
    let branches = git(&repo.path, &["branch", "--list", "zerg/*"]);
    assert!(branches.contains("zerg/halted/worker-0"), "{branches}");
    assert!(!branches.contains("zerg/halted/worker-1"), "{branches}");
    assert!(branches.contains("zerg/old/staging"), "{branches}");
    assert!(!branches.contains("zerg/old/worker-"), "{branches}");
    assert!(!repo.path.join(".zerg/logs").exists());
    let halted = done["rushes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["feature"] == "halted")
        .unwrap();
    assert!(
        halted["kept"]
            .to_string()
            .contains("has uncommitted changes"),
        "{halted}"
    );
    // zergd forgot them.
    let list: Value = serde_json::from_slice(&d.ctl(&["list", "--json"]).stdout).unwrap();
    assert_eq!(list, json!([]));
}

#[test]
fn a_watch_with_deltas_sends_the_whole_status_then_only_what_changed() {
    let d = Daemon::start();
    let repo = TestRepo::new();
    repo.write_graph("delta", &graph_12("delta"));
    repo.configure(&Config::fake_agent().fast_workers());
    repo.write_script(
        "delta",
        &json!({"default": [{"op": "sleep_ms", "ms": 50}, {"op": "write_owned"}]}),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let out = d.ctl_in(&repo.path, &["rush", "delta", "--workers", "2", "--detach"]);
    assert!(out.status.success(), "{out:?}");
    let (held, events, partial, sizes) = rt.block_on(async {
        let ch = zerg_proto::transport::connect(&d.socket).await.unwrap();
        let mut c = zerg_proto::v1::control_client::ControlClient::new(ch);
        let mut s = c
            .watch(zerg_proto::v1::WatchRequest {
                repo: repo.path.to_string_lossy().into_owned(),
                feature: "delta".into(),
                deltas: true,
            })
            .await
            .unwrap()
            .into_inner();
        let mut held = None;
        let (mut events, mut partial) = (0, 0);
        let mut sizes = Vec::new();
        while let Ok(Some(mut ev)) = s.message().await {
            if let Some(st) = &ev.status {
                sizes.push((ev.delta, st.tasks.len()));
                partial += usize::from(ev.delta && st.tasks.len() < 12);
            }
            events += 1;
            zerg_proto::watch::apply(&mut held, &mut ev);
            let ended = held.as_ref().is_some_and(|h: &zerg_proto::v1::RushStatus| {
                matches!(
                    h.state(),
                    zerg_proto::v1::RushState::Complete | zerg_proto::v1::RushState::Failed
                )
            });
            if ended {
                break;
            }
        }
        (held, events, partial, sizes)
    });
    let held = held.expect("a status");
    assert_eq!(
        sizes.first(),
        Some(&(false, 12)),
        "the first status is whole: {sizes:?}"
    );
    assert!(
        partial > 0,
        "later statuses carry only what changed: {sizes:?}"
    );
    // What the deltas built is what Status says.
    let st = d.wait_end(&repo.path, "delta", T);
    assert_eq!(st["state"], "complete");
    let mut built: Vec<(String, String)> = held
        .tasks
        .iter()
        .map(|(k, t)| (k.clone(), t.status().as_str_name().to_string()))
        .collect();
    built.sort();
    assert_eq!(built.len(), 12, "{events} events");
    assert!(
        built.iter().all(|(_, s)| s == "TASK_STATE_COMPLETE"),
        "{built:?}"
    );
    assert_eq!(held.workers.len(), st["workers"].as_object().unwrap().len());
    assert_eq!(held.levels.len(), 3);
}
