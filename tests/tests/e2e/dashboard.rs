//! The web dashboard (`zergd --http`) in a real headless Chromium against a live rush: every
//! task of the graph drawn, a task's colour changing when it completes, Stop pressed on the page
//! stopping the rush; `/metrics` read by Prometheus's own text parser (the Python client's),
//! its values matching the rush's status; and who may call it: loopback host names only, JSON
//! actions only from the dashboard's own page, a token on any other address.

use std::io::{Read, Write};
use std::net::TcpStream;
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

/// The dashboard's address, from zergd's log (`--http 127.0.0.1:0` picks a port).
fn dashboard_addr(d: &Daemon) -> String {
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
    for (k, v) in headers {
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

    // The page, in a real browser.
    b.goto(&format!("http://{addr}/")).unwrap();
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
    let info = get_json(&addr, "/api/info");
    assert_eq!(info["token_required"], true);
    assert_eq!(info["loopback"], false);
    let (code, _, _) = http(&addr, "GET", "/metrics", &[], "");
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
    let (code, _, _) = http(&addr, "GET", &format!("/api/rushes?token={token}"), &[], "");
    assert_eq!(code, 200);
    // The page tells the reader the token is needed, in a real browser.
    b.goto(&format!("http://{addr}/")).unwrap();
    let banner = b
        .wait_for(
            "document.getElementById('banner').textContent.includes('token') && document.getElementById('banner').textContent",
            Duration::from_secs(30),
        )
        .unwrap();
    assert!(banner.as_str().unwrap().contains("network"), "{banner}");
}
