//! Notifications (`notify:`): a webhook the test serves on 127.0.0.1 and a command are told,
//! once each, when a rush pauses, completes, fails or is stopped, and when a task fails for
//! good; a webhook that answers 503 first is tried again.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use zerg_tests::*;

const T: Duration = Duration::from_secs(120);

/// An HTTP listener on 127.0.0.1 that keeps the JSON body of every POST, answering 503 to
/// the first `refuse` of them and 200 to the rest.
struct Hook {
    url: String,
    got: Arc<Mutex<Vec<(u16, Value)>>>,
}

impl Hook {
    fn start(refuse: usize) -> Hook {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/zerg", listener.local_addr().unwrap());
        let got: Arc<Mutex<Vec<(u16, Value)>>> = Arc::default();
        let kept = got.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { continue };
                let Some(body) = read_request(&mut s) else {
                    continue;
                };
                let mut got = kept.lock().unwrap();
                let status = if got.len() < refuse { 503 } else { 200 };
                got.push((status, serde_json::from_slice(&body).unwrap_or(Value::Null)));
                drop(got);
                let _ = s.write_all(
                    format!(
                        "HTTP/1.1 {status} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                    )
                    .as_bytes(),
                );
            }
        });
        Hook { url, got }
    }

    /// The events received with a 200, in order.
    fn events(&self) -> Vec<Value> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .filter(|(s, _)| *s == 200)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Waits until an accepted event of `kind` for `feature` arrived, and returns it.
    fn wait(&self, kind: &str, feature: &str) -> Value {
        let found = zerg_proto::testkit::poll(T, || {
            self.events()
                .iter()
                .any(|e| e["event"] == kind && e["feature"] == feature)
        });
        assert!(found, "no {kind} of {feature}: {:#?}", self.events());
        self.events()
            .into_iter()
            .find(|e| e["event"] == kind && e["feature"] == feature)
            .unwrap()
    }

    fn count(&self, kind: &str, feature: &str) -> usize {
        self.events()
            .iter()
            .filter(|e| e["event"] == kind && e["feature"] == feature)
            .count()
    }
}

/// One HTTP/1.1 request's body (by its `content-length`).
fn read_request(s: &mut std::net::TcpStream) -> Option<Vec<u8>> {
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = s.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        got.extend_from_slice(&buf[..n]);
        if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&got[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if got.len() >= end + 4 + len {
                return Some(got[end + 4..end + 4 + len].to_vec());
            }
        }
    }
}

fn ok(out: &std::process::Output) {
    succeeded(out);
}

#[test]
fn a_webhook_and_a_command_hear_once_of_each_pause_completion_failure_and_stop() {
    // The first POST is refused: zergd tries again.
    let hook = Hook::start(1);
    let repo = TestRepo::new();
    let lines = repo.path.parent().unwrap().join("notified.jsonl");
    let notify = |cfg: Config| {
        cfg.set("notify.webhook", hook.url.as_str())
            .set("notify.command", format!("cat >> '{}'", lines.display()))
            .set("notify.webhook_retries", 2)
            .set("notify.timeout_seconds", 5)
    };
    // A verification program that is not installed yet: the rush pauses.
    let mut g: Value = serde_json::from_str(&graph_12("np")).unwrap();
    for t in g["tasks"].as_array_mut().unwrap() {
        let file = t["files"]["create"][0].as_str().unwrap().to_string();
        t["verification"]["command"] = json!(format!("zz-notify-check {file}"));
    }
    repo.write_graph("np", &g.to_string());
    repo.configure(&notify(Config::fake_agent().fast_workers()));
    let bin_dir = repo.path.parent().unwrap().join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let path = path_with(&bin_dir);
    let d = Daemon::builder().env("PATH", path).start();
    ok(&d.ctl_in(&repo.path, &["rush", "np", "--workers", "3", "--detach"]));
    let paused = hook.wait("rush_paused", "np");
    assert_eq!(paused["state"], "paused", "{paused}");
    assert!(
        paused["reason"]
            .as_str()
            .unwrap()
            .contains("`zz-notify-check` is not installed"),
        "{paused}"
    );
    assert_eq!(paused["tasks"]["total"], 12, "{paused}");
    assert_eq!(paused["repo"], repo.path.to_string_lossy().as_ref());
    assert!(paused["rush_id"].as_str().is_some_and(|r| !r.is_empty()));
    // The refused first POST was this same event, delivered on the second try.
    let all = hook.got.lock().unwrap().clone();
    assert_eq!(all[0].0, 503);
    assert_eq!(all[0].1["event"], "rush_paused");

    // Fixed and resumed: it completes.
    let tool = bin_dir.join("zz-notify-check");
    std::fs::write(&tool, "#!/bin/sh\ntest -f \"$1\"\n").unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    ok(&d.ctl_in(&repo.path, &["retry", "np"]));
    let done = hook.wait("rush_complete", "np");
    assert_eq!(done["tasks"]["complete"], 12, "{done}");

    // A task that fails for good fails the rush: both are told.
    repo.write_graph("nq", &graph_12("nq"));
    repo.configure(&notify(
        Config::fake_agent()
            .fast_workers()
            .set("workers.retry_attempts", 0),
    ));
    repo.write_script(
        "nq",
        &json!({"default": [{"op": "write_owned"}],
                "tasks": {"G-L2-001": [{"op": "exit", "code": 1}]}}),
    );
    ok(&d.ctl_in(&repo.path, &["rush", "nq", "--workers", "2", "--detach"]));
    let failed_task = hook.wait("task_failed", "nq");
    assert_eq!(failed_task["task_id"], "G-L2-001", "{failed_task}");
    assert!(failed_task["error"].as_str().is_some_and(|e| !e.is_empty()));
    let failed = hook.wait("rush_failed", "nq");
    assert_eq!(failed["state"], "failed");

    // A stopped rush.
    repo.write_graph("ns", &graph_12("ns"));
    repo.configure(&notify(Config::fake_agent().fast_workers()));
    repo.write_script("ns", &json!({"default": [{"op": "hang"}]}));
    ok(&d.ctl_in(&repo.path, &["rush", "ns", "--workers", "2", "--detach"]));
    d.wait_for(&repo.path, "ns", T, "the rush running", |s| {
        s["state"] == "running"
    });
    ok(&d.ctl_in(&repo.path, &["stop", "ns"]));
    hook.wait("rush_stopped", "ns");

    // Each once.
    for (kind, feature) in [
        ("rush_paused", "np"),
        ("rush_complete", "np"),
        ("task_failed", "nq"),
        ("rush_failed", "nq"),
        ("rush_stopped", "ns"),
    ] {
        assert_eq!(
            hook.count(kind, feature),
            1,
            "{kind} {feature}: {:#?}",
            hook.events()
        );
    }
    // The command heard the same events, one JSON object per line.
    let heard: Vec<Value> = std::fs::read_to_string(&lines)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<String> = heard
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e["event"].as_str().unwrap(),
                e["feature"].as_str().unwrap()
            )
        })
        .collect();
    for want in [
        "rush_paused np",
        "rush_complete np",
        "task_failed nq",
        "rush_failed nq",
        "rush_stopped ns",
    ] {
        assert_eq!(
            kinds.iter().filter(|k| *k == want).count(),
            1,
            "{want} in {kinds:?}"
        );
    }
}

#[test]
fn events_limits_what_is_sent_and_a_bad_webhook_is_refused_naming_the_key() {
    let hook = Hook::start(0);
    let repo = TestRepo::new();
    repo.write_graph("ne", &graph_12("ne"));
    // A task fails for good, and so the rush: only the rush's failure is asked for.
    repo.configure(
        &Config::fake_agent()
            .fast_workers()
            .set("workers.retry_attempts", 0)
            .set("notify.webhook", hook.url.as_str())
            .set("notify.desktop", true)
            .set("notify.events", ["rush_failed"]),
    );
    repo.write_script(
        "ne",
        &json!({"default": [{"op": "write_owned"}],
                "tasks": {"G-L1-001": [{"op": "exit", "code": 1}]}}),
    );
    // A stand-in `notify-send` that records its arguments.
    let bin_dir = repo.path.parent().unwrap().join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let shown = repo.path.parent().unwrap().join("desktop.txt");
    let tool = bin_dir.join("notify-send");
    std::fs::write(
        &tool,
        format!("#!/bin/sh\nprintf '%s|' \"$@\" >> '{}'\n", shown.display()),
    )
    .unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = path_with(&bin_dir);
    let d = Daemon::builder().env("PATH", path).start();
    let out = d.ctl_in(&repo.path, &["rush", "ne", "--workers", "2"]);
    assert_eq!(out.status.code(), Some(1));
    hook.wait("rush_failed", "ne");
    // The task's failure was saved, and would have been sent, before the rush's: by the time
    // the rush's failure has also reached the desktop, a task_failed would have arrived too.
    // The stand-in's shell creates the file before it writes to it: wait for the whole line.
    let read_shown = || std::fs::read_to_string(&shown).unwrap_or_default();
    zerg_proto::testkit::poll(T, || {
        let d = read_shown();
        d.contains("tasks complete") && d.ends_with('|')
    });
    assert_eq!(hook.events().len(), 1, "{:#?}", hook.events());
    let desktop = read_shown();
    assert!(
        desktop.starts_with("--app-name=zerg|--|zerg: ne failed|")
            && desktop.contains("of 12 tasks complete"),
        "{desktop}"
    );

    repo.configure(
        &Config::fake_agent()
            .fast_workers()
            .set("notify.webhook", "ftp://example.invalid/"),
    );
    repo.write_graph("nf", &graph_12("nf"));
    let out = d.ctl_in(&repo.path, &["rush", "nf", "--workers", "2"]);
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("notify.webhook: must be an http:// or https:// URL"),
        "{said}"
    );
}
