//! A hostile worker: model-written code inside a real worker container, as the container's
//! user, against a zergd on the host (root here, as on CI machines). One test per finding of the
//! security review; each runs its attack from inside a live container (`docker exec`, or the
//! fake agent CLI's `shell` op) with `zerg-attack`, then checks that zergd refused it or that it
//! did no harm.
//!
//! Like the other container tests these skip, saying why, without a Docker engine, and fail
//! instead under `ZERG_REQUIRE_DOCKER=1`.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use zerg_tests::*;

use crate::container::*;

/// A copy of `zerg-attack` in a directory of the test's, named by a `FAKE_CLAUDE_*` variable so
/// that zergd mounts it into every worker container at the same path.
struct Attack {
    dir: tempfile::TempDir,
    bin: PathBuf,
}

fn attack() -> Attack {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("zerg-attack");
    std::fs::copy(zerg_tests::bin("zerg-attack"), &bin).unwrap();
    Attack { dir, bin }
}

impl Attack {
    fn env(&self) -> (String, String) {
        (
            "FAKE_CLAUDE_ATTACK_DIR".into(),
            self.dir.path().to_string_lossy().into(),
        )
    }
    fn path(&self) -> String {
        self.bin.to_string_lossy().into()
    }
}

/// Runs `zerg-attack` in container `id` in the background.
fn exec_detached(id: &str, args: &[&str]) {
    let out = Command::new("docker")
        .args(["exec", "-d", id])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docker exec: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs a command in container `id` and returns its stdout; panics if it fails.
fn exec(id: &str, args: &[&str]) -> String {
    let out = Command::new("docker")
        .args(["exec", id])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docker exec {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// zergd's peak resident memory (`VmHWM`), in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Every file below `dir` with its bytes and mode (symlinks by their target).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (Vec<u8>, u32)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                out.insert(p.clone(), (Vec::new(), m.mode()));
                stack.push(p);
            } else if m.file_type().is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.insert(p, (t.to_string_lossy().as_bytes().to_vec(), m.mode()));
            } else {
                out.insert(p.clone(), (std::fs::read(&p).unwrap(), m.mode()));
            }
        }
    }
    out
}

fn running_container(d: &Daemon, repo: &TestRepo, feature: &str, w: &str) -> String {
    let st = d.wait_for(&repo.path, feature, T, "the worker's container", |s| {
        s["workers"][w]["status"] == "running"
            && s["workers"][w]["container_id"]
                .as_str()
                .is_some_and(|c| !c.is_empty())
            && s["workers"][w]["step"] == "implementing"
    });
    st["workers"][w]["container_id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Findings 1 (grant walk) and the Claude login: one worker swaps file/symlink pairs aimed at a
/// root-only host file in its Claude config dir while another is killed again and again, so
/// that zergd prepares spawn after spawn; the same worker rewrites `settings.json`, `CLAUDE.md`
/// and `commands/`. The host file keeps its mode, and the host's Claude config stays byte for
/// byte the same, while the worker did get a copy of the login.
#[test]
fn hostile_worker_cannot_change_host_files_or_the_hosts_claude_login() {
    if !docker_ready() {
        return;
    }
    let a = attack();
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let claude = home.join(".claude");
    std::fs::create_dir_all(claude.join("commands")).unwrap();
    std::fs::write(claude.join("settings.json"), r#"{"theme":"dark"}"#).unwrap();
    std::fs::write(
        claude.join(".credentials.json"),
        r#"{"claudeAiOauth":{"accessToken":"host-token"}}"#,
    )
    .unwrap();
    std::fs::write(
        home.join(".claude.json"),
        r#"{"userID":"u-1","projects":{"/secret/project":{"history":["private"]}}}"#,
    )
    .unwrap();
    let victim = tmp.path().join("victim");
    std::fs::write(&victim, "root only").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let victim_before = std::fs::metadata(&victim).unwrap();
    let home_before = snapshot(&home);

    let repo = TestRepo::new();
    repo.write_graph("grant", &graph_12("grant"));
    repo.configure(
        &container_cfg(IMAGE)
            .set("workers.max_respawn_attempts", 200)
            .set("workers.respawn_window_seconds", 600),
    );
    repo.write_script(
        "grant",
        &json!({"default": [{"op": "tick", "count": 600, "interval_ms": 100}, {"op": "write_owned"}]}),
    );
    let ctx = cdaemon_with(vec![
        a.env(),
        ("HOME".into(), home.to_string_lossy().into()),
    ]);
    let d = &ctx.d;
    start_detached(d, &repo, "grant", 2);
    let attacker = running_container(d, &repo, "grant", "0");

    // The worker's own copy of the login is there; the host's files are not.
    let creds = exec(
        &attacker,
        &["cat", "/home/worker/.claude/.credentials.json"],
    );
    assert!(creds.contains("host-token"), "{creds}");
    let account = exec(&attacker, &["cat", "/home/worker/.claude.json"]);
    assert!(account.contains("u-1"), "{account}");
    assert!(
        !account.contains("/secret/project"),
        "projects stay on the host: {account}"
    );

    // Code execution on the host at the user's next `claude` session, if these reached it.
    exec(
        &attacker,
        &[
            "sh",
            "-c",
            "echo '{\"hooks\":{\"SessionStart\":[{\"hooks\":[{\"type\":\"command\",\"command\":\"touch /tmp/pwned\"}]}]}}' > /home/worker/.claude/settings.json \
             && echo evil > /home/worker/.claude/CLAUDE.md \
             && mkdir -p /home/worker/.claude/commands && echo evil > /home/worker/.claude/commands/evil.md",
        ],
    );
    let victim_s = victim.to_string_lossy().to_string();
    exec_detached(
        &attacker,
        &[
            &a.path(),
            "swap-file",
            "--dir",
            "/home/worker/.claude/race",
            "--target",
            &victim_s,
            "--seconds",
            "60",
        ],
    );

    // Force spawn after spawn of the other slot while the swapping goes on: each respawn
    // prepares the host for a new container.
    let kills = 10;
    for killed in 0..kills {
        let st = d.wait_for(&repo.path, "grant", T, "worker 1 respawned", |s| {
            s["workers"]["1"]["respawns"].as_u64() == Some(killed)
                && s["workers"]["1"]["status"] == "running"
                && s["workers"]["1"]["container_id"]
                    .as_str()
                    .is_some_and(|c| !c.is_empty())
        });
        docker(&["kill", st["workers"]["1"]["container_id"].as_str().unwrap()]);
    }
    let st = d.wait_for(&repo.path, "grant", T, "the last respawn", |s| {
        s["workers"]["1"]["respawns"].as_u64() == Some(kills)
    });

    let after = std::fs::metadata(&victim).unwrap();
    assert_eq!(
        after.mode(),
        victim_before.mode(),
        "a host file's mode was changed through the grant walk"
    );
    assert_eq!(after.gid(), victim_before.gid());
    assert_eq!(
        snapshot(&home),
        home_before,
        "a container changed the host's Claude config"
    );
    let rush_id = st["rush_id"].as_str().unwrap().to_string();
    let _ = d.ctl_in(&repo.path, &["stop", "grant", "--force"]);
    wait_no_containers(&rush_id);
}

/// Finding 2: a container replaces `objects/info` in its private git dir with a symlink to a
/// host directory and is killed. The respawn rebuilds the private git dir without writing
/// through the symlink, and the rush ends with the private git dirs and homes removed.
#[test]
fn hostile_worker_symlink_in_its_private_git_dir_is_not_followed_at_respawn() {
    if !docker_ready() {
        return;
    }
    let a = attack();
    let tmp = tempfile::tempdir().unwrap();
    let host_dir = tmp.path().join("host-dir");
    std::fs::create_dir_all(&host_dir).unwrap();
    std::fs::write(host_dir.join("alternates"), "precious\n").unwrap();
    std::fs::write(host_dir.join("keep"), "keep me\n").unwrap();
    let before = snapshot(&host_dir);

    let repo = TestRepo::new();
    repo.write_graph("trap", &graph_12("trap"));
    container_config(&repo, IMAGE);
    let common = std::fs::canonicalize(repo.path.join(".git")).unwrap();
    let ctx = cdaemon_with(vec![a.env()]);
    let link_cmd = format!(
        "{} link --path {}/objects/info --target {} && touch $FAKE_CLAUDE_MARK_DIR/linked",
        a.path(),
        common.display(),
        host_dir.display()
    );
    repo.write_script(
        "trap",
        &json!({
            "default": [{"op": "write_owned"}],
            "tasks": {"G-L1-001": {"attempts": [
                [{"op": "shell", "command": link_cmd}, {"op": "hang"}],
                [{"op": "write_owned"}]
            ]}}
        }),
    );
    let d = &ctx.d;
    start_detached(d, &repo, "trap", 1);
    let mark = ctx.marks.join("linked");
    assert!(
        poll(T, || mark.exists()),
        "the link was never made; {}",
        d.log()
    );
    let st = d.status(&repo.path, "trap").unwrap();
    let id = st["workers"]["0"]["container_id"]
        .as_str()
        .unwrap()
        .to_string();
    docker(&["kill", &id]);
    let st = d.wait_end(&repo.path, "trap", T);
    assert_eq!(
        snapshot(&host_dir),
        before,
        "zergd wrote through the symlink a container left"
    );
    assert_eq!(st["state"], "complete", "{st}");
    let area = common.join("zerg").join("trap");
    wait_until(
        T,
        &format!(
            "the rush's private git dirs and homes to be removed: {}",
            area.display()
        ),
        || !area.exists(),
    );
}

/// Finding 3: while tasks complete (each completion imports the container's objects), the
/// container swaps its fan-out directories for symlinks into another repository's object store
/// on the host. Not one of that repository's objects reaches the rush's repository.
#[test]
fn hostile_worker_cannot_import_another_repositorys_objects() {
    if !docker_ready() {
        return;
    }
    let a = attack();
    let secret = TestRepo::new();
    let mut ids = Vec::new();
    for i in 0..60 {
        let f = secret.path.join(format!("s{i}"));
        std::fs::write(&f, format!("another repository's secret {i}\n")).unwrap();
        ids.push(git(
            &secret.path,
            &["hash-object", "-w", &f.to_string_lossy()],
        ));
    }
    let fanouts: Vec<String> = {
        let mut f: Vec<String> = ids.iter().map(|i| i[..2].to_string()).collect();
        f.sort();
        f.dedup();
        f
    };
    let repo = TestRepo::new();
    repo.write_graph("steal", &graph_12("steal"));
    // The swapping also breaks the attacker's own git now and then (a commit that cannot read
    // a tree fails its attempt): enough retries that its tasks still complete under load.
    repo.configure(&container_cfg(IMAGE).set("workers.retry_attempts", 20));
    repo.write_script(
        "steal",
        &json!({"default": [{"op": "tick", "count": 5, "interval_ms": 100}, {"op": "write_owned"}]}),
    );
    let common = std::fs::canonicalize(repo.path.join(".git")).unwrap();
    let ctx = cdaemon_with(vec![a.env()]);
    let d = &ctx.d;
    start_detached(d, &repo, "steal", 2);
    let attacker = running_container(d, &repo, "steal", "0");
    let objects = common.join("objects").to_string_lossy().to_string();
    let target = secret
        .path
        .join(".git/objects")
        .to_string_lossy()
        .to_string();
    exec_detached(
        &attacker,
        &[
            &a.path(),
            "swap-dir",
            "--dir",
            &objects,
            "--names",
            &fanouts.join(","),
            "--target",
            &target,
            "--seconds",
            "120",
        ],
    );
    // Every completion of the attacker's imports its objects while the swapping goes on.
    let st = d.wait_for(&repo.path, "steal", T, "completions by the attacker", |s| {
        s["workers"]["0"]["tasks_completed"].as_u64() >= Some(3)
            || matches!(s["state"].as_str(), Some("complete" | "failed"))
    });
    let leaked: Vec<&String> = ids
        .iter()
        .filter(|id| {
            Command::new("git")
                .arg("-C")
                .arg(&repo.path)
                .args(["cat-file", "-e", id])
                .status()
                .unwrap()
                .success()
        })
        .collect();
    assert!(
        leaked.is_empty(),
        "{} objects of another repository were imported; rush ended {}",
        leaked.len(),
        st["state"]
    );
    assert!(
        st["workers"]["0"]["tasks_completed"].as_u64() >= Some(1),
        "the attacker completed nothing, so nothing was imported during the attack: {st}"
    );
    let rush_id = st["rush_id"].as_str().unwrap().to_string();
    let _ = d.ctl_in(&repo.path, &["stop", "steal", "--force"]);
    wait_no_containers(&rush_id);
}

/// Finding 4: a container opens thousands of connections to its worker socket and holds them.
/// zergd holds only a few of them, `status` keeps answering, and the other worker's
/// completions are accepted: the rush completes.
#[test]
fn hostile_worker_flooding_the_worker_socket_costs_a_bounded_number_of_fds() {
    if !docker_ready() {
        return;
    }
    let a = attack();
    let repo = TestRepo::new();
    repo.write_graph("flood", &graph_12("flood"));
    container_config(&repo, IMAGE);
    repo.write_script(
        "flood",
        &json!({
            "default": [{"op": "write_owned"}],
            "tasks": {"G-L1-001": [{"op": "tick", "count": 300, "interval_ms": 100}, {"op": "write_owned"}]}
        }),
    );
    let ctx = cdaemon_with(vec![a.env()]);
    let d = &ctx.d;
    start_detached(d, &repo, "flood", 2);
    let st = d.wait_for(&repo.path, "flood", T, "G-L1-001 in a container", |s| {
        container_running(s, "G-L1-001").is_some()
    });
    let attacker = container_running(&st, "G-L1-001").unwrap();
    let mut child = Command::new("docker")
        .args([
            "exec",
            &attacker,
            &a.path(),
            "flood",
            "--socket",
            "/zerg/run/worker.sock",
        ])
        .args(["--count", "4000", "--seconds", "60"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let report: Value = serde_json::from_str(&first).expect("flood report");
    assert_eq!(report["holding"], true, "{report}");
    // The flood is held: zergd's descriptors stay bounded, and it still answers.
    let fds = open_fds(d.pid());
    assert!(fds < 600, "zergd holds {fds} descriptors under the flood");
    let out = d.ctl_in(&repo.path, &["status", "flood", "--json"]);
    assert!(
        out.status.success(),
        "status did not answer under the flood"
    );
    // The other worker's completions are taken: everything but the attacker's task is done
    // while the flood is held.
    d.wait_for(&repo.path, "flood", T, "the other level-one tasks", |s| {
        (2..=5).all(|i| s["tasks"][format!("G-L1-{i:03}")]["status"] == "complete")
    });
    let _ = child.kill();
    let _ = child.wait();
    let st = d.wait_end(&repo.path, "flood", T);
    assert_eq!(st["state"], "complete", "{st}");
}

/// Finding 5: a task's commit comes with a genuine 600 MB blob of zeros, a few hundred KiB
/// compressed, in the container's object dir. zergd refuses it without inflating it into
/// memory, removes it, and the rush goes on.
#[test]
fn hostile_worker_zlib_bomb_costs_zergd_no_memory() {
    if !docker_ready() {
        return;
    }
    let a = attack();
    let repo = TestRepo::new();
    repo.write_graph("bomb", &graph_12("bomb"));
    container_config(&repo, IMAGE);
    let common = std::fs::canonicalize(repo.path.join(".git")).unwrap();
    let bomb = format!(
        "{} bomb --dir {}/objects --size 629145600",
        a.path(),
        common.display()
    );
    repo.write_script(
        "bomb",
        &json!({
            "default": [{"op": "write_owned"}],
            "tasks": {"G-L1-001": [{"op": "shell", "command": bomb}, {"op": "write_owned"}]}
        }),
    );
    let ctx = cdaemon_with(vec![a.env()]);
    let d = &ctx.d;
    start_detached(d, &repo, "bomb", 1);
    let st = d.wait_end(&repo.path, "bomb", T);
    assert_eq!(st["state"], "complete", "{st}");
    let peak = peak_rss_kib(d.pid());
    assert!(peak < 150 << 10, "zergd's peak RSS was {peak} KiB");
    assert!(
        d.log().contains("larger than container.max_object_size"),
        "the bomb was not refused by size: {}",
        d.log()
    );
}

/// Finding 6: a container floods its own output with bare newlines and bytes that are not
/// UTF-8, then a marker line. `zergctl logs --follow` goes on past them and shows the marker,
/// `zergctl logs` shows it too, and reading a log of millions of lines costs zergd no memory.
/// The engine turns every line into a record of its own, passes on some ten thousand a second
/// and replaces bytes that are not UTF-8, so the test also puts what a subprocess worker's
/// output (or a flood running for minutes) leaves into the mirrored log directly: 7 MB of
/// newlines, raw bad bytes, and a second marker.
#[test]
fn hostile_worker_log_flood_and_bad_bytes_do_not_break_logs() {
    if !docker_ready() {
        return;
    }
    let a = attack();
    let repo = TestRepo::new();
    repo.write_graph("spam", &graph_12("spam"));
    container_config(&repo, IMAGE);
    repo.write_script(
        "spam",
        &json!({
            "default": [{"op": "write_owned"}],
            "tasks": {"G-L1-001": [
                {"op": "tick", "count": 300, "interval_ms": 100},
                {"op": "write_owned"}
            ]}
        }),
    );
    let ctx = cdaemon_with(vec![a.env()]);
    let d = &ctx.d;
    start_detached(d, &repo, "spam", 1);
    let id = running_container(d, &repo, "spam", "0");
    let mut follow = Command::new(bin("zergctl"))
        .env("ZERG_SOCKET", &d.socket)
        .args(["logs", "spam", "--worker", "0", "--follow"])
        .current_dir(&repo.path)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let out = follow.stdout.take().unwrap();
    std::thread::spawn(move || {
        let (mut raw, mut engine) = (false, false);
        for line in BufReader::new(out).split(b'\n').map_while(Result::ok) {
            let l = String::from_utf8_lossy(&line);
            raw |= l.contains("zerg-attack: after the raw bad bytes");
            engine |= l.contains("zerg-attack: after the bad bytes");
            if raw && engine {
                let _ = tx.send(());
                return;
            }
        }
    });
    let log_path = repo.path.join(".zerg/logs/worker-0.log");
    exec(
        &id,
        &[
            &a.path(),
            "spam",
            "--path",
            "/proc/1/fd/1",
            "--bytes",
            "100000",
        ],
    );
    // Once the engine's copy is through, what a subprocess worker's output could hold.
    wait_until(T, "the container's output to arrive", || {
        std::fs::read(&log_path)
            .unwrap_or_default()
            .ends_with(b"zerg-attack: after the bad bytes\n")
    });
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&log_path)
            .unwrap();
        f.write_all(&vec![b'\n'; 7_000_000]).unwrap();
        f.write_all(b"\xff\xfe raw\nzerg-attack: after the raw bad bytes\n")
            .unwrap();
    }
    let seen = rx.recv_timeout(T).is_ok();
    let _ = follow.kill();
    let _ = follow.wait();
    let log = std::fs::read(&log_path).unwrap_or_default();
    assert!(
        seen,
        "logs --follow stopped at the flood or the bad bytes; worker-0.log has {} bytes, ending {:?}",
        log.len(),
        String::from_utf8_lossy(&log[log.len().saturating_sub(300)..])
    );
    let before = peak_rss_kib(d.pid());
    let out = d.ctl_in(
        &repo.path,
        &["logs", "spam", "--worker", "0", "--tail", "10000"],
    );
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("zerg-attack: after the raw bad bytes"),
        "logs lost the lines after the bad bytes"
    );
    assert!(
        text.contains("[W0] \u{fffd}\u{fffd} raw"),
        "the bad bytes are not shown"
    );
    let after = peak_rss_kib(d.pid());
    assert!(
        after < before + (20 << 10),
        "zergd's peak RSS went from {before} to {after} KiB reading the log"
    );
    let _ = d.ctl_in(&repo.path, &["stop", "spam", "--force"]);
}

/// Finding 7: an agent that checkpoints every time. Its slot backs off and gives up like a
/// crash loop, with the reason in status, instead of respawning for ever.
#[test]
fn hostile_worker_that_always_checkpoints_hits_the_respawn_cap() {
    if !docker_ready() {
        return;
    }
    let repo = TestRepo::new();
    repo.write_graph("ckpt", &graph_12("ckpt"));
    repo.configure(&container_cfg(IMAGE).set("workers.max_respawn_attempts", 3));
    repo.write_script(
        "ckpt",
        &json!({"default": [{"op": "checkpoint", "progress_pct": 10, "next_action": "again"}]}),
    );
    let ctx = cdaemon();
    let d = &ctx.d;
    start_detached(d, &repo, "ckpt", 1);
    let st = d.wait_end(&repo.path, "ckpt", T);
    assert_eq!(st["state"], "failed", "{st}");
    let w = &st["workers"]["0"];
    assert_eq!(w["status"], "gave_up", "{st}");
    let reason = w["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("checkpoint"), "{reason}");
    assert!(w["respawns"].as_u64().unwrap() <= 4, "{st}");
    let rush_id = st["rush_id"].as_str().unwrap().to_string();
    wait_no_containers(&rush_id);
}
