//! The web dashboard (`zergd --http`) in a real headless Chromium against a live rush: every
//! task of the graph drawn, a task's colour changing when it completes, Stop pressed on the page
//! stopping the rush; `/metrics` read by Prometheus's own text parser (the Python client's),
//! its values matching the rush's status; and who may call it: zergd's owner only (another
//! local user gets 401 everywhere but the page shell), loopback host names only, JSON actions
//! only from the dashboard's own page; and what a request may cost: a path that would block
//! is never opened, a log answer is bounded in bytes, floods of connections and held event
//! streams delay nobody.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use zerg_tests::browser::Browser;
use zerg_tests::*;

/// Where the screenshots are kept for the reader: `target/dashboard/`.
fn shots() -> PathBuf {
    bin_dir()
        .parent()
        .map(|t| t.join("dashboard"))
        .unwrap_or_else(|| PathBuf::from("target/dashboard"))
}

/// The dashboards' tokens by address, read from `dashboard.json` beside each zergd's socket.
static TOKENS: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());

/// The token zergd wrote for its dashboard (`dashboard.json`, beside the control socket).
fn door_file(d: &Daemon) -> Value {
    let path = d.socket.parent().unwrap().join("dashboard.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// The dashboard's address, from zergd's log (`--http 127.0.0.1:0` picks a port); requests to
/// it through [`http`] carry its token from then on.
fn dashboard_addr(d: &Daemon) -> String {
    let addr = dashboard_addr_only(d);
    let token = door_file(d)["token"].as_str().unwrap().to_string();
    let port = addr.rsplit(':').next().unwrap().to_string();
    let mut t = TOKENS.lock().unwrap();
    t.push((addr.clone(), token.clone()));
    t.push((format!("127.0.0.1:{port}"), token));
    addr
}

fn token_of(addr: &str) -> Option<String> {
    TOKENS
        .lock()
        .unwrap()
        .iter()
        .rev()
        .find(|(a, _)| a == addr)
        .map(|(_, t)| t.clone())
}

/// A one-time login address from `zergctl dashboard`.
fn login_url(d: &Daemon) -> String {
    let out = d.ctl(&["dashboard"]);
    assert!(out.status.success(), "{}", said(&out));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn dashboard_addr_only(d: &Daemon) -> String {
    let mut found = None;
    poll(Duration::from_secs(10), || {
        found = d
            .log()
            .split("url=http://")
            .nth(1)
            .and_then(|rest| rest.split('/').next())
            .map(str::to_string);
        found.is_some()
    });
    found.unwrap_or_else(|| panic!("no dashboard address in zergd's log:\n{}", d.log()))
}

/// One HTTP/1.1 request over a plain socket: (status, headers, body).
fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).expect("connect to the dashboard");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    // The owner's token, unless the caller speaks for someone else (`X-Anonymous`) or sends
    // its own credentials.
    let anonymous = headers.iter().any(|(k, _)| {
        k.eq_ignore_ascii_case("x-anonymous")
            || k.eq_ignore_ascii_case("authorization")
            || k.eq_ignore_ascii_case("cookie")
    });
    if !anonymous && let Some(t) = token_of(addr) {
        req.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    for (k, v) in headers
        .iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case("x-anonymous"))
    {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let text = String::from_utf8_lossy(&out).to_string();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    // Bodies of fixed length come whole; a chunked one is decoded.
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut b = String::new();
        let mut r = rest;
        while let Some((size, after)) = r.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 || after.len() < n {
                break;
            }
            b.push_str(&after[..n]);
            r = after[n..].trim_start_matches("\r\n");
        }
        b
    } else {
        rest.to_string()
    };
    (code, head.to_string(), body)
}

fn get_json(addr: &str, path: &str) -> Value {
    let (code, _, body) = http(addr, "GET", path, &[], "");
    assert_eq!(code, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {e}: {body}"))
}

/// `/metrics` through `prometheus_client.parser` (a real Prometheus text parser): every
/// sample as `name{k="v",…}` (labels sorted) → value.
fn scrape(addr: &str) -> std::collections::BTreeMap<String, f64> {
    let (code, head, text) = http(addr, "GET", "/metrics", &[], "");
    assert_eq!(code, 200, "{text}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    let script = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = {}
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        labels = ",".join('%s="%s"' % (k, v) for k, v in sorted(s.labels.items()))
        out[s.name + "{" + labels + "}"] = s.value
print(json.dumps(out))
"#;
    let mut child = std::process::Command::new("python3.12")
        .env("PYENV_VERSION", "3.12.1")
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3.12 (PYENV_VERSION=3.12.1) runs the Prometheus parser");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the Prometheus parser refused /metrics (pip install prometheus-client):\n{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Headless Chromium, or the reason the test skips (a failure under `CI=true`).
fn browser() -> Option<Browser> {
    match Browser::launch() {
        Ok(b) => Some(b),
        Err(e) => {
            skip(&format!(
                "no headless Chromium (apt-get install chromium): {e}"
            ));
            None
        }
    }
}

/// Whether the Prometheus Python client's parser is there; the test skips (fails under
/// `CI=true`) when it is not.
fn prometheus_parser() -> bool {
    let ok = std::process::Command::new("python3.12")
        .env("PYENV_VERSION", "3.12.1")
        .args(["-c", "import prometheus_client.parser"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        skip(
            "no Prometheus text parser (PYENV_VERSION=3.12.1 python3.12 -m pip install prometheus-client)",
        );
    }
    ok
}

fn sample(m: &std::collections::BTreeMap<String, f64>, key: &str) -> f64 {
    *m.get(key)
        .unwrap_or_else(|| panic!("no sample {key} in {:#?}", m.keys().collect::<Vec<_>>()))
}

fn count_tasks(st: &Value, state: &str) -> usize {
    st["tasks"]
        .as_object()
        .map(|t| t.values().filter(|t| t["status"] == state).count())
        .unwrap_or(0)
}

fn q(s: &str) -> String {
    s.replace('%', "%25")
        .replace('/', "%2F")
        .replace(' ', "%20")
        .replace('&', "%26")
}

#[test]
fn the_dashboard_draws_a_live_rush_in_chromium_and_stop_stops_it() {
    let Some(mut b) = browser() else { return };
    if !prometheus_parser() {
        return;
    }
    let repo = TestRepo::new();
    repo.configure(
        &Config::fake_agent()
            .fast_workers()
            .gate("check", "true", true),
    );
    let release = repo.path.parent().unwrap().join("release-l2");
    let release3 = repo.path.parent().unwrap().join("release-l3");
    repo.write_graph("dash", &graph_12("dash"));
    let wait = |p: &Path| json!([{"op": "wait_for_file", "path": p, "timeout_ms": 120_000}, {"op": "write_owned"}]);
    repo.write_script(
        "dash",
        &json!({"tasks": {"G-L2-001": wait(&release), "G-L3-001": wait(&release3)}}),
    );
    let d = Daemon::builder().env("ZERG_HTTP", "127.0.0.1:0").start();
    let addr = dashboard_addr(&d);
    succeeded(&d.ctl_in(&repo.path, &["rush", "dash", "--workers", "2", "--detach"]));
    // Level 1 merged, level 2 all but the task that waits.
    let st = d.wait_for(
        &repo.path,
        "dash",
        Duration::from_secs(90),
        "level 2 less one",
        |s| count_tasks(s, "complete") == 8 && s["tasks"]["G-L2-001"]["status"] == "in_progress",
    );
    let repo_path = st["repo"].as_str().unwrap().to_string();

    // The page, in a real browser, opened as `zergctl dashboard` says.
    let login = login_url(&d);
    assert!(
        login.starts_with(&format!("http://{addr}/?login=")),
        "{login}"
    );
    b.goto(&login).unwrap();
    let drawn = b
        .wait_for(
            "(() => { const ids = [...document.querySelectorAll('#graph [data-task]')].map(e => e.dataset.task).sort(); return ids.length === 12 ? ids : null; })()",
            Duration::from_secs(30),
        )
        .unwrap();
    assert_eq!(
        drawn,
        json!(graph_12_ids()),
        "every task of the graph is drawn"
    );
    let colour = |b: &mut Browser| {
        b.eval(
            "getComputedStyle(document.querySelector('[data-task=\"G-L2-001\"]')).borderLeftColor",
        )
        .unwrap()
    };
    b.wait_for(
        "document.querySelector('[data-task=\"G-L2-001\"]').dataset.state === 'in_progress'",
        Duration::from_secs(30),
    )
    .unwrap();
    let running = colour(&mut b);
    let banner = b
        .eval("document.getElementById('banner').textContent")
        .unwrap();
    assert!(
        banner.as_str().unwrap_or("").contains("loopback"),
        "the page says who can open it: {banner}"
    );
    // The workers' table and the page's own copy of the status.
    let workers = b
        .eval("document.querySelectorAll('#workers [data-worker]').length")
        .unwrap();
    assert_eq!(workers, json!(2));
    b.screenshot(&shots().join("running.png")).unwrap();

    // `/metrics` against the status, once level 2 is as it will stay until released.
    let m = scrape(&addr);
    let st = d.status(&repo.path, "dash").unwrap();
    let rid = st["rush_id"].as_str().unwrap();
    let key = |name: &str, extra: &str| {
        let mut labels = vec![format!("feature=\"dash\""), format!("rush_id=\"{rid}\"")];
        if !extra.is_empty() {
            labels.push(extra.to_string());
        }
        labels.sort();
        format!("{name}{{{}}}", labels.join(","))
    };
    for state in ["complete", "in_progress", "pending", "failed"] {
        assert_eq!(
            sample(&m, &key("zerg_tasks", &format!("state=\"{state}\""))),
            count_tasks(&st, state) as f64,
            "tasks {state}"
        );
    }
    let attempts: u64 = st["tasks"]
        .as_object()
        .unwrap()
        .values()
        .map(|t| t["attempts"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(
        sample(&m, &key("zerg_task_attempts_total", "")),
        attempts as f64
    );
    assert_eq!(sample(&m, "zerg_rushes{state=\"running\"}"), 1.0);
    // One level merged, its one gate passed; this zergd ran nothing else.
    assert_eq!(
        sample(&m, "zerg_level_merges_total{outcome=\"merged\"}"),
        1.0
    );
    assert_eq!(sample(&m, "zerg_level_merge_duration_seconds_count{}"), 1.0);
    assert_eq!(
        sample(
            &m,
            "zerg_gate_runs_total{gate=\"check\",outcome=\"passed\"}"
        ),
        1.0
    );
    assert!(sample(&m, "zerg_worker_plane_connections_accepted_total{}") >= 2.0);
    assert!(sample(&m, "process_resident_memory_bytes{}") > 1e6);
    let busy = st["workers"]
        .as_object()
        .unwrap()
        .values()
        .filter(|w| w["status"] == "running")
        .count();
    assert_eq!(
        sample(&m, &key("zerg_workers", "state=\"running\"")),
        busy as f64
    );

    // A task's colour changes when it completes.
    std::fs::write(&release, "go").unwrap();
    b.wait_for(
        "document.querySelector('[data-task=\"G-L2-001\"]').dataset.state === 'complete'",
        Duration::from_secs(60),
    )
    .unwrap();
    let done = colour(&mut b);
    assert_ne!(running, done, "the task's colour changed as it completed");
    // Level 3 runs, one task waits: the rush is still running when Stop is pressed.
    b.wait_for(
        "document.querySelector('[data-task=\"G-L3-001\"]').dataset.state === 'in_progress'",
        Duration::from_secs(60),
    )
    .unwrap();
    // The chosen task's log tail.
    b.click("[data-task=\"G-L1-001\"]").unwrap();
    let log = b
        .wait_for(
            "document.querySelector('#log pre') ? document.getElementById('log').textContent : null",
            Duration::from_secs(30),
        )
        .unwrap();
    assert!(log.as_str().unwrap_or("").contains("agent-output"), "{log}");
    // The note box: none on a complete task; on the running one, a note typed there is kept
    // for that task's next attempt, and the page lists it.
    assert_eq!(
        b.eval("document.getElementById('note-box').hidden")
            .unwrap(),
        json!(true),
        "a complete task has no note box"
    );
    b.click("[data-task=\"G-L3-001\"]").unwrap();
    b.wait_for(
        "!document.getElementById('note-box').hidden",
        Duration::from_secs(30),
    )
    .unwrap();
    b.eval("document.getElementById('note-text').value = 'use the helper in lib.rs'")
        .unwrap();
    b.click("#note-add").unwrap();
    let said = b
        .wait_for(
            "(() => { const t = document.getElementById('log-result').textContent; return t.includes('Note added') ? t : null; })()",
            Duration::from_secs(30),
        )
        .unwrap();
    assert!(
        said.as_str()
            .unwrap_or("")
            .contains("kept for the next attempt"),
        "{said}"
    );
    let st = d.status(&repo.path, "dash").unwrap();
    assert_eq!(
        st["tasks"]["G-L3-001"]["notes"],
        json!(["use the helper in lib.rs"]),
        "the note is the task's"
    );
    assert_eq!(st["tasks"]["G-L3-001"]["status"], "in_progress");
    b.wait_for(
        "document.getElementById('note-list').textContent.includes('use the helper in lib.rs')",
        Duration::from_secs(30),
    )
    .unwrap();

    b.click("#stop").unwrap();
    b.wait_for(
        "!!document.getElementById('stop-confirm')",
        Duration::from_secs(5),
    )
    .unwrap();
    b.click("#stop-confirm").unwrap();
    d.wait_for(
        &repo.path,
        "dash",
        Duration::from_secs(60),
        "stopped",
        |s| s["state"] == "stopped",
    );
    b.wait_for(
        "window.zergDashboard.lastStatus && window.zergDashboard.lastStatus.state === 'stopped'",
        Duration::from_secs(30),
    )
    .unwrap();
    // The rush list follows too.
    b.wait_for(
        "document.querySelector('#rushes [data-rush=\"dash\"]').textContent.includes('stopped')",
        Duration::from_secs(30),
    )
    .unwrap();
    b.screenshot(&shots().join("stopped.png")).unwrap();

    // The JSON API names what is wrong.
    let (code, _, body) = http(
        &addr,
        "GET",
        &format!("/api/rush?repo={}", q(&repo_path)),
        &[],
        "",
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("`feature`"), "{body}");
    let (code, _, body) = http(
        &addr,
        "GET",
        &format!(
            "/api/log?repo={}&feature=dash&task=..%2F..%2Fetc",
            q(&repo_path)
        ),
        &[],
        "",
    );
    assert_eq!(code, 404, "only a task of the rush names a log: {body}");
    let list = get_json(&addr, "/api/rushes");
    assert_eq!(list["rushes"][0]["feature"], "dash");
    assert_eq!(list["rushes"][0]["state"], "stopped");

    // Retry on the page resumes the stopped rush, which the page follows to its end.
    std::fs::write(&release3, "go").unwrap();
    b.click("#retry").unwrap();
    b.wait_for(
        "document.getElementById('action-result').textContent.includes('requeue')",
        Duration::from_secs(30),
    )
    .unwrap();
    let st = d.wait_end(&repo.path, "dash", Duration::from_secs(90));
    assert_eq!(st["state"], "complete", "{st}");
    b.wait_for(
        "window.zergDashboard.lastStatus && window.zergDashboard.lastStatus.state === 'complete' && document.querySelectorAll('#graph [data-state=\"complete\"]').length === 12",
        Duration::from_secs(30),
    )
    .unwrap();
    b.screenshot(&shots().join("complete.png")).unwrap();
}

#[test]
fn the_dashboard_answers_only_its_own_page_and_a_token_guards_any_other_address() {
    let Some(mut b) = browser() else { return };
    let d = Daemon::builder().env("ZERG_HTTP", "127.0.0.1:0").start();
    let addr = dashboard_addr(&d);
    // A page elsewhere whose name resolves here (DNS rebinding) gets nothing.
    let (code, _, body) = http(
        &addr,
        "GET",
        "/api/rushes",
        &[("Host", "attacker.example:80")],
        "",
    );
    assert_eq!(code, 403, "{body}");
    let (code, _, _) = http(&addr, "GET", "/api/rushes", &[("Host", "localhost")], "");
    assert_eq!(code, 200);
    // Actions: JSON only, and not from another site's page.
    let stop = r#"{"repo":"/nowhere","feature":"x"}"#;
    let (code, _, body) = http(
        &addr,
        "POST",
        "/api/stop",
        &[("Content-Type", "text/plain")],
        stop,
    );
    assert_eq!(code, 415, "{body}");
    let (code, _, body) = http(
        &addr,
        "POST",
        "/api/stop",
        &[
            ("Content-Type", "application/json"),
            ("Origin", "http://attacker.example"),
        ],
        stop,
    );
    assert_eq!(code, 403, "{body}");
    let (code, _, body) = http(
        &addr,
        "POST",
        "/api/stop",
        &[("Content-Type", "application/json")],
        r#"{"repo":1}"#,
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("/api/stop"), "{body}");
    let (code, _, body) = http(
        &addr,
        "POST",
        "/api/stop",
        &[("Content-Type", "application/json")],
        stop,
    );
    assert_eq!(code, 404, "no such rush: {body}");
    let (code, _, _) = http(&addr, "DELETE", "/metrics", &[], "");
    assert_eq!(code, 405);
    let (code, head, body) = http(&addr, "GET", "/", &[], "");
    assert_eq!(code, 200);
    assert!(
        body.contains("<title>zerg dashboard</title>"),
        "the page is in the binary"
    );
    assert!(
        head.contains("content-security-policy: default-src 'none'"),
        "{head}"
    );
    drop(d);

    // Any other address: no token, no start, and a message that says what to do.
    let scratch = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(bin("zergd"))
        .env("ZERG_HTTP", "0.0.0.0:0")
        .env_remove("ZERG_HTTP_TOKEN")
        .env("ZERG_SOCKET", scratch.path().join("run/s.sock"))
        .env("ZERG_STATE_HOME", scratch.path().join("state"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ZERG_HTTP_TOKEN"), "{err}");

    // With a token: every call but the page and /api/info carries it.
    let token = "s3cret-token-0123456789";
    let d = Daemon::builder()
        .env("ZERG_HTTP", "0.0.0.0:0")
        .env("ZERG_HTTP_TOKEN", token)
        .start();
    let port = dashboard_addr(&d).rsplit(':').next().unwrap().to_string();
    let addr = format!("127.0.0.1:{port}");
    assert_eq!(
        door_file(&d)["token"],
        token,
        "ZERG_HTTP_TOKEN is the token"
    );
    let (code, _, _) = http(&addr, "GET", "/api/info", &[("X-Anonymous", "1")], "");
    assert_eq!(code, 401);
    let info = get_json(&addr, "/api/info");
    assert_eq!(info["loopback"], false);
    let (code, _, _) = http(&addr, "GET", "/metrics", &[("X-Anonymous", "1")], "");
    assert_eq!(code, 401);
    let (code, _, _) = http(
        &addr,
        "GET",
        "/metrics",
        &[("Authorization", "Bearer wrong-token-0123456789")],
        "",
    );
    assert_eq!(code, 401);
    let (code, _, body) = http(
        &addr,
        "GET",
        "/metrics",
        &[("Authorization", &format!("Bearer {token}"))],
        "",
    );
    assert_eq!(code, 200, "{body}");
    // The token is never taken from an API address (it would sit in logs and history).
    let (code, _, _) = http(
        &addr,
        "GET",
        &format!("/api/rushes?token={token}"),
        &[("X-Anonymous", "1")],
        "",
    );
    assert_eq!(code, 401);
    // The page asks for the token, in a real browser, and trades it for a session.
    b.goto(&format!("http://{addr}/")).unwrap();
    b.wait_for(
        "!document.getElementById('token-form').hidden",
        Duration::from_secs(30),
    )
    .unwrap();
    b.eval(&format!(
        "document.getElementById('token-input').value = '{token}'; document.querySelector('#token-form button').click(); true"
    ))
    .unwrap();
    let banner = b
        .wait_for(
            "document.getElementById('banner').textContent.includes('owner') && document.getElementById('banner').textContent",
            Duration::from_secs(30),
        )
        .unwrap();
    assert!(banner.as_str().unwrap().contains("network"), "{banner}");
}

/// `cmd` run as uid `nobody` (needs root to switch), its stdout.
fn as_nobody(cmd: &[&str]) -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        skip("switching to uid nobody needs root");
        return None;
    }
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(cmd)
        .output()
        .expect("setpriv (util-linux)");
    Some(String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr))
}

/// A rush of [`graph_12`] run to its end, for the requests below to name.
fn ended_rush(d: &Daemon, feature: &str) -> (TestRepo, Value) {
    let repo = TestRepo::new();
    repo.configure(&Config::fake_agent().fast_workers());
    repo.write_graph(feature, &graph_12(feature));
    succeeded(&d.ctl_in(&repo.path, &["rush", feature, "--workers", "2"]));
    let st = d.wait_end(&repo.path, feature, Duration::from_secs(120));
    assert_eq!(st["state"], "complete", "{st}");
    (repo, st)
}

#[test]
fn another_local_user_gets_only_the_page_shell_and_the_owner_logs_in_once() {
    let d = Daemon::builder().env("ZERG_HTTP", "127.0.0.1:0").start();
    let addr = dashboard_addr(&d);
    let (_repo, st) = ended_rush(&d, "door");
    let repo_path = st["repo"].as_str().unwrap().to_string();
    let curl = |method: &str, path: &str| {
        let url = format!("http://{addr}{path}");
        as_nobody(&[
            "curl",
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-X",
            method,
            "-H",
            "Content-Type: application/json",
            "-d",
            &format!(r#"{{"repo":"{repo_path}","feature":"door"}}"#),
            &url,
        ])
    };
    let Some(page) = curl("GET", "/") else { return };
    assert_eq!(page, "200", "the page shell is open");
    for (m, p) in [
        ("GET", "/api/rushes".to_string()),
        ("GET", "/api/info".to_string()),
        ("GET", "/metrics".to_string()),
        (
            "GET",
            format!("/api/rush?repo={}&feature=door", q(&repo_path)),
        ),
        (
            "GET",
            format!("/api/log?repo={}&feature=door&task=G-L1-001", q(&repo_path)),
        ),
        (
            "GET",
            format!("/api/watch?repo={}&feature=door", q(&repo_path)),
        ),
        ("POST", "/api/stop".to_string()),
        ("POST", "/api/retry".to_string()),
        ("POST", "/api/note".to_string()),
    ] {
        assert_eq!(curl(m, &p).unwrap(), "401", "{m} {p} as another user");
    }
    // Nor can that user read the token.
    let file = d.socket.parent().unwrap().join("dashboard.json");
    let read = as_nobody(&["cat", &file.to_string_lossy()]).unwrap();
    assert!(
        !read.contains(door_file(&d)["token"].as_str().unwrap()),
        "{read}"
    );
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // The owner: `zergctl dashboard`'s address logs in once, for a cookie the page cannot read.
    let login = login_url(&d);
    let path = login.trim_start_matches(&format!("http://{addr}"));
    let (code, head, _) = http(&addr, "GET", path, &[("X-Anonymous", "1")], "");
    assert_eq!(code, 303, "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("location: /\r\n"), "{head}");
    assert!(
        lower.contains("httponly") && lower.contains("samesite=strict"),
        "{head}"
    );
    let cookie = head
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.split(';').next().unwrap().trim().to_string())
        .unwrap();
    let (code, _, body) = http(&addr, "GET", "/api/rushes", &[("Cookie", &cookie)], "");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"door\""), "{body}");
    // The note box's call reaches the rush: a complete task takes no note, and says so.
    let note = format!(
        r#"{{"repo":"{repo_path}","feature":"door","task_id":"G-L1-001","text":"use v2"}}"#
    );
    let (code, _, body) = http(
        &addr,
        "POST",
        "/api/note",
        &[("Cookie", &cookie), ("Content-Type", "application/json")],
        &note,
    );
    assert!(code >= 400 && code != 401, "{code} {body}");
    assert!(body.contains("G-L1-001 of rush door is complete"), "{body}");
    // The same address again is spent.
    let (code, head, _) = http(&addr, "GET", path, &[("X-Anonymous", "1")], "");
    assert_eq!(code, 303);
    assert!(
        head.contains("/?expired=1") && !head.to_ascii_lowercase().contains("set-cookie"),
        "{head}"
    );
    let (code, _, _) = http(
        &addr,
        "GET",
        "/api/rushes",
        &[("Cookie", "zerg_session_1=forged")],
        "",
    );
    assert_eq!(code, 401);
    // Two Host headers: refused.
    let (code, _, _) = http(
        &addr,
        "GET",
        "/api/rushes",
        &[("Host", &addr), ("Host", "attacker.example")],
        "",
    );
    assert_eq!(code, 400);
}

#[test]
fn a_request_naming_a_repository_behind_a_fifo_leaves_status_answering() {
    let d = Daemon::builder().env("ZERG_HTTP", "127.0.0.1:0").start();
    let addr = dashboard_addr(&d);
    let (repo, _) = ended_rush(&d, "fifo");
    // A directory whose .git/HEAD is a FIFO with no writer: opening it blocks.
    let trap = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(trap.path().join(".git")).unwrap();
    nix::unistd::mkfifo(
        &trap.path().join(".git/HEAD"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let trap_s = trap.path().to_string_lossy().to_string();
    let asked: Vec<_> = (0..3)
        .map(|_| {
            let (addr, trap_s) = (addr.clone(), trap_s.clone());
            std::thread::spawn(move || {
                http(
                    &addr,
                    "GET",
                    &format!("/api/rush?repo={}&feature=x", q(&trap_s)),
                    &[],
                    "",
                )
            })
        })
        .collect();
    // Meanwhile zergctl status answers, three times, each in its usual way.
    for _ in 0..3 {
        let out = d.ctl_in(&repo.path, &["status", "fifo", "--json"]);
        assert!(out.status.success(), "{}", said(&out));
    }
    for a in asked {
        let (code, _, body) = a.join().unwrap();
        assert_eq!(code, 404, "a rush zergd has not registered: {body}");
    }
    // The control plane finds repositories off the supervisor, and refuses this one.
    let out = d.ctl(&["status", "x", "--repo", &trap_s]);
    assert!(!out.status.success());
    assert!(said(&out).contains("not a regular file"), "{}", said(&out));
    assert!(d.ctl_in(&repo.path, &["status", "fifo"]).status.success());
}

#[test]
fn big_log_files_full_of_control_bytes_cost_zergd_little_to_answer_four_readers_at_once() {
    let d = Daemon::builder().env("ZERG_HTTP", "127.0.0.1:0").start();
    let addr = dashboard_addr(&d);
    let (repo, st) = ended_rush(&d, "logs");
    let repo_path = st["repo"].as_str().unwrap().to_string();
    // What a hostile worker can leave: 20 files of 8.5 MiB, long lines of control bytes.
    let dir = repo.path.join(".zerg/logs/tasks/G-L1-001");
    std::fs::create_dir_all(&dir).unwrap();
    let mut line: Vec<u8> = (0..(1 << 20)).map(|i| [1u8, 2, 27, 7][i % 4]).collect();
    line.push(b'\n');
    let file: Vec<u8> = line.iter().copied().cycle().take(17 << 19).collect();
    for i in 0..20 {
        std::fs::write(dir.join(format!("artifact-{i:02}.log")), &file).unwrap();
    }
    let before = procfs::mem_kib(d.pid() as i32).unwrap().1;
    let path = format!(
        "/api/log?repo={}&feature=logs&task=G-L1-001&tail=5000",
        q(&repo_path)
    );
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (addr, path) = (addr.clone(), path.clone());
            std::thread::spawn(move || http(&addr, "GET", &path, &[], ""))
        })
        .collect();
    for r in readers {
        let (code, _, body) = r.join().unwrap();
        assert_eq!(code, 200);
        assert!(body.len() <= (1 << 20) + (64 << 10), "{} bytes", body.len());
        let v: Value = serde_json::from_str(&body).unwrap();
        let files = v["files"].as_array().unwrap();
        assert!(
            files.iter().any(|f| f["truncated"] == true),
            "the caps cut the answer: {}",
            &body[..body.len().min(400)]
        );
    }
    let peak = procfs::mem_kib(d.pid() as i32).unwrap().1;
    assert!(
        peak < 64 << 10,
        "zergd's peak RSS went from {before} KiB to {peak} KiB"
    );
}

#[test]
fn a_flood_of_slow_connections_and_held_event_streams_delay_no_owner_request() {
    let d = Daemon::builder().env("ZERG_HTTP", "127.0.0.1:0").start();
    let addr = dashboard_addr(&d);
    // A running rush (its first task waits), so that its event streams stay open.
    let repo = TestRepo::new();
    repo.configure(&Config::fake_agent().fast_workers());
    repo.write_graph("flood", &graph_12("flood"));
    let release = repo.path.parent().unwrap().join("release");
    repo.write_script(
        "flood",
        &json!({"tasks": {"G-L1-001": [{"op": "wait_for_file", "path": release, "timeout_ms": 120_000}, {"op": "write_owned"}]}}),
    );
    succeeded(&d.ctl_in(&repo.path, &["rush", "flood", "--workers", "2", "--detach"]));
    let st = d.wait_for(
        &repo.path,
        "flood",
        Duration::from_secs(60),
        "a task running",
        |s| s["tasks"]["G-L1-001"]["status"] == "in_progress",
    );
    let repo_path = st["repo"].as_str().unwrap().to_string();
    let token = token_of(&addr).unwrap();
    // 64 held event streams, from the token and from sessions.
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..64 {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "GET /api/watch?repo={}&feature=flood HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\r\n",
            q(&repo_path)
        )
        .unwrap();
        let mut first = [0u8; 12];
        s.read_exact(&mut first).unwrap();
        refused += usize::from(first.ends_with(b"429"));
        held.push(s);
    }
    assert!(refused > 0, "one client's streams are capped");
    // 164 slow tokenless connections that never finish their headers, kept open.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood = {
        let (addr, stop) = (addr.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut conns: Vec<TcpStream> = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                conns.retain(|c| {
                    c.peek(&mut [0u8; 1])
                        .is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock)
                });
                while conns.len() < 164 {
                    let Ok(mut c) = TcpStream::connect(&addr) else {
                        break;
                    };
                    let _ = c.write_all(b"GET /api/rushes HTTP/1.1\r\nHost: 127.0.0.1\r\n");
                    let _ = c.set_nonblocking(true);
                    conns.push(c);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    for path in ["/api/rushes", "/", "/app.js"] {
        let t = std::time::Instant::now();
        let (code, _, body) = http(&addr, "GET", path, &[], "");
        let took = t.elapsed();
        assert_eq!(code, 200, "{path}: {body}");
        assert!(
            took < Duration::from_secs(1),
            "{path} took {took:?} during the flood"
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flood.join().unwrap();
    drop(held);
    std::fs::write(&release, "go").unwrap();
    let st = d.wait_end(&repo.path, "flood", Duration::from_secs(120));
    assert_eq!(st["state"], "complete");
}

#[test]
fn html_and_script_in_every_field_a_worker_or_graph_controls_show_as_text() {
    let Some(mut b) = browser() else { return };
    let d = Daemon::builder().env("ZERG_HTTP", "127.0.0.1:0").start();
    let addr = dashboard_addr(&d);
    let evil = r#"<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>"#;
    let repo = TestRepo::new();
    repo.configure(
        &Config::fake_agent()
            .fast_workers()
            .set("workers.retry_attempts", 0),
    );
    let mut graph: Value = serde_json::from_str(&graph_12("xss")).unwrap();
    for t in graph["tasks"].as_array_mut().unwrap() {
        t["title"] = json!(format!("title {evil}"));
        t["description"] = json!(format!("description {evil}"));
    }
    repo.write_graph("xss", &graph.to_string());
    repo.write_script(
        "xss",
        &json!({"default": [{"op": "print", "text": format!("log line {evil}")}, {"op": "write_owned"}],
                "tasks": {"G-L1-001": [{"op": "print", "text": format!("failure {evil}")}, {"op": "exit", "code": 1}]}}),
    );
    let out = d.ctl_in(&repo.path, &["rush", "xss", "--workers", "2"]);
    let st = d.wait_end(&repo.path, "xss", Duration::from_secs(120));
    assert_eq!(st["state"], "failed", "{}\n{st}", said(&out));
    b.goto(&login_url(&d)).unwrap();
    b.wait_for(
        "document.querySelectorAll('#rushes [data-rush]').length > 0",
        Duration::from_secs(30),
    )
    .unwrap();
    b.eval("document.querySelector('#rushes [data-rush=\"xss\"]').click(); true")
        .unwrap();
    b.wait_for(
        "document.querySelectorAll('#graph [data-task]').length === 12",
        Duration::from_secs(30),
    )
    .unwrap();
    b.eval("document.querySelector('[data-task=\"G-L1-001\"]').click(); true")
        .unwrap();
    let shown = b
        .wait_for(
            "document.body.innerText.includes('failure <img') && document.body.innerText",
            Duration::from_secs(30),
        )
        .unwrap();
    assert!(
        shown.as_str().unwrap().contains("title <img src=x"),
        "{shown}"
    );
    let injected = b
        .eval("[window.__pwned === undefined, document.querySelectorAll('img[src=x], script:not([src])').length]")
        .unwrap();
    assert_eq!(
        injected,
        json!([true, 0]),
        "the fields are text, not markup"
    );
    // And were some markup to get in, its inline script would not run: script-src 'self'.
    let inline = b
        .eval("(() => { const s = document.createElement('script'); s.textContent = 'window.__inline = 1'; document.head.appendChild(s); return window.__inline === undefined; })()")
        .unwrap();
    assert_eq!(
        inline,
        json!(true),
        "inline script is refused by the page's policy"
    );
    assert!(addr.contains("127.0.0.1"));
}
