//! The subprocess workers' sandbox, judged from outside: an agent in a default-mode worker
//! tries to read a private key in the user's home, write into the user's checkout and make a
//! branch in the user's repository, use zergd's control socket, and reach a local service, and
//! a quality gate on the host tries the same. Each attempt must fail while the rush completes;
//! the same rush with `sandbox.mode: off` must see every attempt succeed, so the probe is shown
//! able to see an escape.

use std::io::{Read, Write};
use std::time::Duration;

use serde_json::{Value, json};
use zerg_tests::*;

const T: Duration = Duration::from_secs(180);

/// The probe every task's agent runs (and the gate): its raw results, one per line, for the
/// test to judge. `$1` the key, `$2` the user's checkout, `$3` zergd's control socket, `$4`
/// zergctl, `$5` the local service's port, `$6` an HTTP service the config allows.
const PROBE: &str = r#"#!/bin/sh
key="$1"; repo="$2"; sock="$3"; zergctl="$4"; port="$5"; allowed="$6"
tag="${ZERG_TASK_ID:-gate}-$$"
echo "key: $(cat "$key" 2>&1 | head -c 200)"
echo "x" > "$repo/escaped-$tag" 2>/dev/null
git -C "$repo" branch "escaped-$tag" >/dev/null 2>&1
if "$zergctl" --socket "$sock" list >/dev/null 2>&1; then echo "control: answered"; else echo "control: no"; fi
echo "tcp: $(python3 -c 'import socket,sys
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), 3)
    print(s.recv(64).decode())
except Exception as e:
    print("refused", e)' "$port" 2>&1)"
echo "egress-refused: $(curl -s -m 10 -o /dev/null -w '%{http_connect}' https://blocked.example.invalid/ 2>&1)"
echo "egress-allowed: $(curl -s -m 10 "http://127.0.0.1:$allowed/" 2>&1)"
"#;

/// A TCP service on loopback that answers every connection with `answer` and closes it.
fn serve(answer: &'static str) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let mut buf = [0u8; 1024];
            let _ = c.set_read_timeout(Some(Duration::from_millis(200)));
            let _ = c.read(&mut buf);
            let _ = c.write_all(answer.as_bytes());
        }
    });
    port
}

/// What one rush of [`graph_12`] with every agent (and a gate) running the probe shows.
struct Seen {
    status: Value,
    probes: Vec<String>,
    gate: String,
    events: String,
    escaped_files: usize,
    escaped_branches: usize,
    staging_ids: Vec<String>,
}

fn rush(mode: &str) -> Seen {
    let repo = TestRepo::new();
    std::fs::write(repo.path.join("probe.sh"), PROBE).unwrap();
    git(&repo.path, &["add", "probe.sh"]);
    git(&repo.path, &["commit", "-qm", "probe"]);
    repo.write_graph("box", &graph_12("box"));
    let probe_dir = tempfile::tempdir().unwrap();
    let d = Daemon::builder()
        .env(
            "FAKE_CLAUDE_PROBE_DIR",
            probe_dir.path().to_string_lossy().to_string(),
        )
        .start();
    let key = d.home.join(".ssh/id_ed25519");
    std::fs::create_dir_all(key.parent().unwrap()).unwrap();
    std::fs::write(&key, "PRIVATE-KEY-OF-THE-USER\n").unwrap();
    let tcp = serve("SECRET-LOCAL-SERVICE\n");
    let http = serve("HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nHELLO\n");
    let args = format!(
        "'{}' '{}' '{}' '{}' {tcp} {http}",
        key.display(),
        repo.path.display(),
        d.socket.display(),
        bin("zergctl").display()
    );
    let probe = format!("sh probe.sh {args} > \"$FAKE_CLAUDE_PROBE_DIR/$ZERG_TASK_ID.txt\" 2>&1");
    repo.write_script(
        "box",
        &json!({"default": [{"op": "shell", "command": probe}, {"op": "write_owned"}]}),
    );
    repo.configure(
        &Config::fake_agent()
            .fast_workers()
            .set("sandbox.mode", mode)
            .set("sandbox.allow_hosts", [format!("127.0.0.1:{http}")])
            .gate("probe", &format!("sh probe.sh {args}"), true),
    );
    let out = d.ctl_in(&repo.path, &["rush", "box", "--workers", "3"]);
    let status = d.wait_end(&repo.path, "box", T);
    assert_eq!(
        status["state"],
        "complete",
        "sandbox {mode}: {}\n{}\n{}",
        said(&out),
        status,
        d.log()
    );
    let probes = graph_12_ids()
        .iter()
        .map(|t| {
            std::fs::read_to_string(probe_dir.path().join(format!("{t}.txt"))).unwrap_or_default()
        })
        .collect();
    let gate = std::fs::read_dir(repo.path.join(".zerg/logs"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("gate-probe"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n");
    let events =
        std::fs::read_to_string(repo.path.join(".zerg/state/box-events.jsonl")).unwrap_or_default();
    let escaped_files = std::fs::read_dir(&repo.path)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("escaped-"))
        .count();
    let escaped_branches = git(&repo.path, &["branch", "--list", "escaped-*"])
        .lines()
        .count();
    Seen {
        staging_ids: repo.task_ids_on("zerg/box/staging"),
        status,
        probes,
        gate,
        events,
        escaped_files,
        escaped_branches,
    }
}

fn count(probes: &[String], needle: &str) -> usize {
    probes.iter().filter(|p| p.contains(needle)).count()
}

#[test]
fn a_default_mode_worker_and_a_host_gate_reach_none_of_the_users_things_and_the_rush_completes() {
    if !sandbox_available() {
        return;
    }
    let on = rush("auto");
    assert_eq!(
        on.staging_ids,
        graph_12_ids(),
        "every Task-ID once on staging"
    );
    assert_eq!(
        on.status["sandbox"]["confined"], true,
        "{}",
        on.status["sandbox"]
    );
    assert!(
        on.status["sandbox"]["summary"]
            .as_str()
            .unwrap_or("")
            .contains("namespaces"),
        "{}",
        on.status["sandbox"]
    );
    assert_eq!(
        count(&on.probes, "tcp:"),
        12,
        "every agent ran the probe: {:?}",
        on.probes
    );
    assert_eq!(count(&on.probes, "PRIVATE-KEY"), 0, "{:?}", on.probes);
    assert_eq!(count(&on.probes, "control: answered"), 0, "{:?}", on.probes);
    assert_eq!(count(&on.probes, "SECRET-LOCAL"), 0, "{:?}", on.probes);
    assert_eq!((on.escaped_files, on.escaped_branches), (0, 0));
    // The egress proxy: an unlisted host is refused (and said so), a listed one reached.
    assert_eq!(
        count(&on.probes, "egress-refused: 403"),
        12,
        "{:?}",
        on.probes
    );
    assert_eq!(
        count(&on.probes, "egress-allowed: HELLO"),
        12,
        "{:?}",
        on.probes
    );
    assert!(
        on.events.contains("\"egress_refused\"")
            && on.events.contains("blocked.example.invalid:443"),
        "{}",
        on.events
    );
    assert!(on.status["sandbox"]["egress_refused"].as_u64().unwrap_or(0) >= 12);
    // The gate ran confined too: it ran (its log has the probe's lines) and reached nothing.
    assert!(on.gate.contains("tcp:"), "{}", on.gate);
    for escape in ["PRIVATE-KEY", "control: answered", "SECRET-LOCAL"] {
        assert!(!on.gate.contains(escape), "{escape}: {}", on.gate);
    }

    // The same rush unconfined: every escape is seen, so the checks above can fail.
    let off = rush("off");
    assert_eq!(off.staging_ids, graph_12_ids());
    assert_eq!(off.status["sandbox"]["confined"], false);
    assert!(count(&off.probes, "PRIVATE-KEY") == 12, "{:?}", off.probes);
    assert!(
        count(&off.probes, "control: answered") == 12,
        "{:?}",
        off.probes
    );
    assert!(count(&off.probes, "SECRET-LOCAL") == 12, "{:?}", off.probes);
    assert!(off.escaped_files >= 12 && off.escaped_branches >= 12);
    assert!(
        !off.events.contains("\"egress_refused\""),
        "no proxy, no event"
    );
    assert!(off.gate.contains("PRIVATE-KEY") && off.gate.contains("SECRET-LOCAL"));
}

#[test]
fn strict_mode_refuses_a_rush_the_machine_cannot_confine_and_names_what_is_missing() {
    let repo = TestRepo::new();
    repo.write_graph("strict", &graph_12("strict"));
    repo.configure(&Config::fake_agent().set("sandbox.mode", "strict"));
    // A machine without bubblewrap.
    let d = Daemon::builder()
        .env("ZERG_SANDBOX_BWRAP", "/nonexistent/bwrap")
        .start();
    let out = d.ctl_in(&repo.path, &["rush", "strict", "--workers", "2"]);
    assert!(!out.status.success());
    let text = said(&out);
    assert!(
        text.contains("sandbox.mode is strict") && text.contains("bwrap"),
        "{text}"
    );
    // Under auto the same machine runs the rush unconfined, and status says so.
    repo.configure(&Config::fake_agent().set("sandbox.mode", "auto"));
    let out = d.ctl_in(&repo.path, &["rush", "strict", "--workers", "2"]);
    let st = d.wait_end(&repo.path, "strict", T);
    assert_eq!(st["state"], "complete", "{}", said(&out));
    assert_eq!(st["sandbox"]["confined"], false);
    assert!(
        st["sandbox"]["summary"]
            .as_str()
            .unwrap_or("")
            .starts_with("OFF"),
        "{}",
        st["sandbox"]
    );
    let human = said(&d.ctl_in(&repo.path, &["status", "strict"]));
    assert!(human.contains("Sandbox: OFF"), "{human}");
}

/// Whether bubblewrap runs here; under `CI=true` a machine without it fails the test.
fn sandbox_available() -> bool {
    let ok = std::process::Command::new("bwrap")
        .args([
            "--unshare-user",
            "--unshare-net",
            "--ro-bind",
            "/",
            "/",
            "true",
        ])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var("CI").is_err(),
            "bubblewrap (bwrap) cannot run here: the sandbox tests need it (apt install bubblewrap)"
        );
        eprintln!("SKIPPED: bubblewrap cannot run here");
    }
    ok
}

#[test]
fn a_sandboxed_rush_survives_kill_9_of_a_worker_and_of_zergd_with_every_task_id_once() {
    if !sandbox_available() {
        return;
    }
    let repo = TestRepo::new();
    repo.write_graph("sk", &graph_12("sk"));
    repo.configure(
        &Config::fake_agent()
            .fast_workers()
            .set("sandbox.mode", "auto"),
    );
    repo.write_script(
        "sk",
        &json!({"default": [{"op": "tick", "count": 6, "interval_ms": 100}, {"op": "write_owned"}]}),
    );
    let mut d = Daemon::start();
    assert!(
        d.ctl_in(&repo.path, &["rush", "sk", "--workers", "3", "--detach"])
            .status
            .success()
    );
    // A confined worker killed mid-task: the pid status shows is the sandbox's, on the host.
    let st = d.wait_for(&repo.path, "sk", T, "a task running", |s| {
        s["workers"]
            .as_object()
            .is_some_and(|m| m.values().any(|w| w["status"] == "running"))
    });
    let (task, pid) = st["workers"]
        .as_object()
        .unwrap()
        .values()
        .find(|w| w["status"] == "running")
        .map(|w| {
            (
                w["current_task"].as_str().unwrap().to_string(),
                w["pid"].as_i64().unwrap(),
            )
        })
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    d.wait_for(&repo.path, "sk", T, "4 tasks complete", |s| {
        tasks_with(s, "complete").len() >= 4
    });
    d.kill9();
    std::thread::sleep(Duration::from_millis(500));
    d.restart();
    let st = d.wait_end(&repo.path, "sk", T);
    assert_eq!(st["state"], "complete", "{st}\n{}", d.log());
    assert_eq!(repo.task_ids_on("zerg/sk/staging"), graph_12_ids());
    assert_eq!(st["sandbox"]["confined"], true);
    assert!(
        st["tasks"][&task]["crashes"].as_u64().unwrap_or(0) >= 1,
        "{}",
        st["tasks"][&task]
    );
    let log = std::fs::read_to_string(repo.path.join(".zerg/monitor.log")).unwrap();
    assert!(log.contains("crashed: signal 9"), "{log}");
    assert!(
        log.contains("reconnected after zergd restart"),
        "re-adopted: {log}"
    );
}
