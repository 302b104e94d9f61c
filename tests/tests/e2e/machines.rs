//! Machines as users have them: root, no git identity, commit hooks, user-level git filters,
//! and a zergd that goes away for good.

use std::io::BufRead;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;
use zerg_tests::*;

const T: Duration = Duration::from_secs(120);

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn write_exec(path: &Path, body: &str) {
    std::fs::write(path, body).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Processes whose working directory is under `dir` (a deleted one included).
fn processes_in(dir: &Path) -> Vec<(i32, String)> {
    let prefix = dir.to_string_lossy().to_string();
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if let Ok(cwd) = std::fs::read_link(e.path().join("cwd")) {
            let cwd = cwd.to_string_lossy().to_string();
            if cwd.starts_with(&prefix) && alive(pid) {
                found.push((pid, cwd));
            }
        }
    }
    found
}

#[test]
fn as_root_a_rush_whose_agent_skips_permissions_is_refused_at_start_with_the_choices() {
    if !nix::unistd::geteuid().is_root() {
        // What a normal user's rush does with the flag is the unit tests' part; this one is
        // about root, and CI runs as root.
        skip("the tests do not run as root, and the refusal is of root");
        return;
    }
    let repo = TestRepo::new();
    repo.write_graph("root", &graph_wide("root", 1, 1));
    repo.configure(&Config::fake_agent().fast_workers());
    let seen = tempfile::tempdir().unwrap();
    let dump = seen.path().join("env");
    repo.write_script(
        "root",
        &json!({"default": [
            {"op": "shell", "command": format!("env > {}", dump.display())},
            {"op": "write_owned"}]}),
    );
    // A machine that does not say it is a sandbox.
    let d = Daemon::start_with_env(vec![("IS_SANDBOX".into(), String::new())]);
    let out = d.ctl_in(&repo.path, &["rush", "root", "--workers", "1"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    for choice in [
        "--dangerously-skip-permissions",
        "as a normal user",
        "--mode container",
        "IS_SANDBOX=1",
    ] {
        assert!(err.contains(choice), "{choice} is not named:\n{err}");
    }
    // Refused at start: no rush, no worktree, no agent run.
    assert!(d.status(&repo.path, "root").is_none());
    assert!(!repo.path.join(".zerg-worktrees").exists());
    assert!(!dump.exists());
    drop(d);

    // Where zergd's environment says the machine is a sandbox, the same rush runs, and the agent
    // CLI is told so.
    let d = Daemon::start_with_env(vec![("IS_SANDBOX".into(), "1".into())]);
    let out = d.ctl_in(&repo.path, &["rush", "root", "--workers", "1"]);
    assert!(out.status.success(), "{}\n{}", text(&out), d.log());
    let env = std::fs::read_to_string(&dump).unwrap();
    assert!(env.lines().any(|l| l == "IS_SANDBOX=1"), "{env}");
}

#[test]
fn without_a_git_identity_the_merges_are_by_zergs_identity_or_the_configured_one() {
    let repo = TestRepo::new();
    // The test zergd's git has no identity (and may not guess one from the host name).
    let d = Daemon::start();
    let merges = |feature: &str| -> Vec<String> {
        git(
            &repo.path,
            &[
                "log",
                "--merges",
                "--format=%an <%ae>|%cn <%ce>",
                &format!("main..zerg/{feature}/staging"),
            ],
        )
        .lines()
        .map(str::to_string)
        .collect()
    };

    repo.write_graph("anon", &graph_wide("anon", 2, 2));
    repo.configure(&Config::fake_agent().fast_workers());
    let out = d.ctl_in(&repo.path, &["rush", "anon", "--workers", "2"]);
    assert!(out.status.success(), "{}\n{}", text(&out), d.log());
    assert!(
        text(&out).contains("git has no identity"),
        "no warning at start:\n{}",
        text(&out)
    );
    let m = merges("anon");
    assert!(m.len() >= 2, "{m:?}");
    assert!(
        m.iter()
            .all(|l| l == "zerg <zerg@localhost>|zerg <zerg@localhost>"),
        "{m:?}"
    );

    repo.write_graph("named", &graph_wide("named", 2, 2));
    repo.configure(
        &Config::fake_agent()
            .fast_workers()
            .set("git.identity.name", "Merge Bot")
            .set("git.identity.email", "bot@example.com"),
    );
    let out = d.ctl_in(&repo.path, &["rush", "named", "--workers", "2"]);
    assert!(out.status.success(), "{}\n{}", text(&out), d.log());
    let m = merges("named");
    assert!(m.len() >= 2, "{m:?}");
    assert!(
        m.iter()
            .all(|l| l == "Merge Bot <bot@example.com>|Merge Bot <bot@example.com>"),
        "{m:?}"
    );
    drop(d);

    // Where git has an identity, the merges are by it, and nobody is warned.
    let d = Daemon::builder().git_identity().start();
    repo.write_graph("own", &graph_wide("own", 2, 2));
    let out = d.ctl_in(&repo.path, &["rush", "own", "--workers", "2"]);
    assert!(out.status.success(), "{}\n{}", text(&out), d.log());
    assert!(
        !text(&out).contains("git has no identity"),
        "{}",
        text(&out)
    );
    let m = merges("own");
    assert!(m.len() >= 2, "{m:?}");
    let (name, email) = IDENTITY;
    let who = format!("{name} <{email}>");
    assert!(m.iter().all(|l| *l == format!("{who}|{who}")), "{m:?}");
}

#[test]
fn the_users_commit_hooks_do_not_stall_a_rush() {
    let repo = TestRepo::new();
    repo.write_graph("hooks", &graph_wide("hooks", 2, 2));
    repo.configure(&Config::fake_agent().fast_workers());
    // As commitlint (through husky or pre-commit) and a failing linter set them up.
    let hooks = repo.path.join(".git/hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    write_exec(
        &hooks.join("commit-msg"),
        "#!/bin/sh\ngrep -qE '^(feat|fix|chore): ' \"$1\" || { echo 'commitlint: bad message' >&2; exit 1; }\n",
    );
    write_exec(
        &hooks.join("pre-commit"),
        "#!/bin/sh\necho 'pre-commit: lint failed' >&2\nexit 1\n",
    );
    // `--no-verify` does not skip this one.
    write_exec(
        &hooks.join("prepare-commit-msg"),
        "#!/bin/sh\necho 'prepare-commit-msg: no ticket number' >&2\nexit 1\n",
    );
    // The hooks are live: the user's own commit is refused.
    let own = Command::new("git")
        .arg("-C")
        .arg(&repo.path)
        .args(["commit", "--allow-empty", "-m", "feat: mine"])
        .output()
        .unwrap();
    assert!(
        !own.status.success() && text(&own).contains("lint failed"),
        "{}",
        text(&own)
    );
    let d = Daemon::start();
    let out = d.ctl_in(&repo.path, &["rush", "hooks", "--workers", "2"]);
    assert!(out.status.success(), "{}\n{}", text(&out), d.log());
    let st = d.status(&repo.path, "hooks").unwrap();
    assert_eq!(st["state"], "complete", "{st}");
    assert_eq!(repo.task_ids_on("zerg/hooks/staging").len(), 4);
}

#[test]
fn a_worker_committed_gitattributes_runs_no_filter_of_zergds_user_in_the_staging_merge() {
    let repo = TestRepo::new();
    let graph = json!({"feature": "attr", "tasks": [
        {"id": "A-L1-001", "title": "attributes", "level": 1,
         "files": {"create": [".gitattributes", "a.txt", "b.md"], "modify": [], "read": []}},
        {"id": "A-L2-001", "title": "later", "level": 2, "dependencies": ["A-L1-001"],
         "files": {"create": ["c.txt", "d.md"], "modify": [], "read": []}}
    ]});
    repo.write_graph("attr", &graph.to_string());
    repo.configure(&Config::fake_agent().fast_workers());
    repo.write_script(
        "attr",
        &json!({"tasks": {"A-L1-001": [
            {"op": "write_owned"},
            {"op": "write", "path": ".gitattributes", "content": "*.txt filter=evil\n*.md filter=evilp\n"}
        ]}}),
    );
    // zergd's user has filter drivers in its own git config (as git-lfs installs one); only
    // zergd reads this file, its workers do not.
    let marks = tempfile::tempdir().unwrap();
    let m = |name: &str| marks.path().join(name).display().to_string();
    let config = marks.path().join("gitconfig");
    std::fs::write(
        &config,
        format!(
            "[user]\n\tname = zerg test\n\temail = test@zerg.invalid\n[filter \"evil\"]\n\tsmudge = touch {}; cat\n\tclean = cat\n[filter \"evilp\"]\n\tprocess = touch {}\n",
            m("smudge"),
            m("process")
        ),
    )
    .unwrap();
    let d = Daemon::start_with_env(vec![(
        "GIT_CONFIG_GLOBAL".into(),
        config.display().to_string(),
    )]);
    let out = d.ctl_in(&repo.path, &["rush", "attr", "--workers", "2"]);
    assert!(out.status.success(), "{}\n{}", text(&out), d.log());
    // The attack reached staging, and started nothing there.
    let attrs = git(&repo.path, &["show", "zerg/attr/staging:.gitattributes"]);
    assert!(attrs.contains("filter=evil"), "{attrs}");
    for marker in ["smudge", "process"] {
        assert!(
            !marks.path().join(marker).exists(),
            "zergd's git ran the {marker} filter a worker's .gitattributes named"
        );
    }
}

#[test]
fn a_worker_whose_zergd_socket_and_worktree_are_gone_exits() {
    let repo = TestRepo::new();
    let graph = json!({"feature": "orphan", "tasks": [
        {"id": "O-L1-001", "title": "hangs", "level": 1, "files": {"create": ["a.txt"], "modify": [], "read": []}},
        {"id": "O-L1-002", "title": "quick", "level": 1, "files": {"create": ["b.txt"], "modify": [], "read": []}},
        {"id": "O-L2-001", "title": "later", "level": 2, "dependencies": ["O-L1-002"], "files": {"create": ["c.txt"], "modify": [], "read": []}}
    ]});
    repo.write_graph("orphan", &graph.to_string());
    repo.configure(&Config::fake_agent().set("workers.heartbeat_interval_seconds", 0.5));
    repo.write_script("orphan", &json!({"tasks": {"O-L1-001": [{"op": "hang"}]}}));
    // Workers that would wait for their zergd for more than a day.
    let d = Daemon::start_with_env(vec![(
        "ZERG_RECONNECT_TIMEOUT_SECONDS".into(),
        "100000".into(),
    )]);
    let out = d.ctl_in(
        &repo.path,
        &["rush", "orphan", "--workers", "2", "--detach"],
    );
    assert!(out.status.success(), "{}", text(&out));
    // One worker runs the hanging task; the other has finished its task and waits for work.
    let st = d.wait_for(
        &repo.path,
        "orphan",
        T,
        "one busy and one idle worker",
        |s| {
            s["tasks"]["O-L1-001"]["status"] == "in_progress"
                && s["tasks"]["O-L1-002"]["status"] == "complete"
        },
    );
    let pids = worker_pids(&st);
    assert_eq!(pids.len(), 2, "{st}");
    // zergd goes away for good, and its rush's files with it.
    let mut d = d;
    d.kill9();
    std::fs::remove_dir_all(d.socket.parent().unwrap().join("w")).unwrap();
    std::fs::remove_dir_all(repo.path.join(".zerg-worktrees")).unwrap();
    poll(T, || !pids.iter().any(|p| alive(*p)));
    let left: Vec<i32> = pids.iter().copied().filter(|p| alive(*p)).collect();
    for p in &left {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p), nix::sys::signal::SIGKILL);
    }
    let logs: String = (0..2)
        .map(|w| {
            std::fs::read_to_string(repo.path.join(format!(".zerg/logs/worker-{w}.log")))
                .unwrap_or_default()
        })
        .collect();
    assert!(
        left.is_empty(),
        "workers {left:?} outlived their zergd; their logs:\n{logs}"
    );
    // The agent CLI of the hanging task went with its worker.
    let agents = processes_in(&repo.path);
    for (p, _) in &agents {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p), nix::sys::signal::SIGKILL);
    }
    assert!(agents.is_empty(), "{agents:?}");
}

#[test]
fn an_interrupted_demo_leaves_no_process_behind() {
    // An agent that hangs: the demo's scripted agent runs `tr`, which here never returns.
    let tools = tempfile::tempdir().unwrap();
    let started = tools.path().join("started");
    write_exec(
        &tools.path().join("tr"),
        &format!(
            "#!/bin/sh\necho $$ >> {}\nexec sleep 3600\n",
            started.display()
        ),
    );
    let path = format!(
        "{}:{}",
        tools.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // In a process group of its own, as a shell runs a command: Ctrl-C goes to the group.
    let mut demo = Command::new(bin("zergctl"))
        .args(["demo", "--workers", "2"])
        .env("PATH", path)
        // The hanging `tr` reports its pid in a file of the test's: unconfined (no bubblewrap
        // for the demo's zergd), as the sandbox keeps the agent out of the test's files.
        .env("ZERG_SANDBOX_BWRAP", "/nonexistent/bwrap")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let stdout = std::io::BufReader::new(demo.stdout.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let repo_line = rx
        .recv_timeout(T)
        .expect("the demo names its repository first");
    let scratch = PathBuf::from(
        repo_line
            .strip_prefix("Demo repository: ")
            .unwrap_or_else(|| panic!("{repo_line}")),
    )
    .parent()
    .unwrap()
    .to_path_buf();
    let zergd_line = rx.recv_timeout(T).expect("the demo names its zergd");
    let zergd: i32 = zergd_line
        .strip_prefix("zergd: pid ")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{zergd_line}"));
    // Ready: an agent runs.
    wait_until(T, "an agent to start", || {
        !std::fs::read_to_string(&started)
            .unwrap_or_default()
            .is_empty()
    });
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(demo.id() as i32),
        nix::sys::signal::SIGINT,
    )
    .unwrap();
    let status = demo.wait().unwrap();
    let said: Vec<String> = rx.try_iter().collect();
    assert!(!status.success(), "{said:?}");
    // Nothing the demo started is left: no zergd, worker or agent.
    let left = processes_in(&scratch);
    for (p, _) in &left {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p), nix::sys::signal::SIGKILL);
    }
    assert!(left.is_empty(), "left running: {left:?}\n{said:?}");
    assert!(!alive(zergd), "the demo's zergd {zergd} is still running");
}
