//! Telling people what happened to a rush (`notify:` in the config): when it completes, fails,
//! is stopped or pauses, and when a task fails for good. Each way configured (a command, a
//! webhook, a desktop notification) runs in a task of its own with a time limit, so a slow or
//! dead receiver never holds the supervisor; at most [`IN_FLIGHT`] deliveries run at once, and
//! one over that is dropped with a warning rather than queued without bound.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;

use crate::config::NotifyConfig;

/// Deliveries running at once, over every rush.
pub const IN_FLIGHT: usize = 32;

/// Bytes of a webhook's answer read (and then dropped).
const ANSWER_LIMIT: usize = 64 << 10;

fn places() -> &'static Arc<Semaphore> {
    static PLACES: OnceLock<Arc<Semaphore>> = OnceLock::new();
    PLACES.get_or_init(|| Arc::new(Semaphore::new(IN_FLIGHT)))
}

/// Sends `event` (one JSON object, its `event` field naming it) every way `cfg` configures,
/// in the background. `repo` is where the command runs. Outside a tokio runtime, or with no
/// place free, the event is dropped with a warning.
pub fn send(cfg: &NotifyConfig, repo: PathBuf, event: Value) {
    let kind = event["event"].as_str().unwrap_or_default().to_string();
    if !cfg.wants(&kind) {
        return;
    }
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let mut ways: Vec<Way> = Vec::new();
    if !cfg.command.trim().is_empty() {
        ways.push(Way::Command(cfg.command.clone()));
    }
    if !cfg.webhook.trim().is_empty() {
        ways.push(Way::Webhook(cfg.webhook.trim().to_string()));
    }
    if cfg.desktop {
        ways.push(Way::Desktop);
    }
    let body = Arc::new(event);
    for way in ways {
        let Ok(place) = places().clone().try_acquire_owned() else {
            tracing::warn!(event = %kind, "notification dropped: {IN_FLIGHT} are being delivered already");
            continue;
        };
        let (body, repo, timeout, retries) = (
            body.clone(),
            repo.clone(),
            cfg.timeout_seconds,
            cfg.webhook_retries,
        );
        rt.spawn(async move {
            let _place = place;
            let done = match &way {
                Way::Command(c) => run_command(c, &repo, &body, timeout).await,
                Way::Webhook(url) => post(url, &body, timeout, retries).await,
                Way::Desktop => desktop(&body, timeout).await,
            };
            if let Err(e) = done {
                tracing::warn!(way = way.name(), event = %body["event"], error = %e, "notification not delivered");
            }
        });
    }
}

enum Way {
    Command(String),
    Webhook(String),
    Desktop,
}

impl Way {
    fn name(&self) -> &'static str {
        match self {
            Way::Command(_) => "notify.command",
            Way::Webhook(_) => "notify.webhook",
            Way::Desktop => "notify.desktop",
        }
    }
}

/// Runs `command` with `sh -c` in `repo`, the event on its stdin; killed (its process group)
/// past `timeout`.
async fn run_command(
    command: &str,
    repo: &PathBuf,
    event: &Value,
    timeout: Duration,
) -> Result<(), String> {
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .current_dir(repo)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot run sh: {e}"))?;
    let pid = child.id();
    let mut line = serde_json::to_vec(event).unwrap_or_default();
    line.push(b'\n');
    let run = async {
        if let Some(mut stdin) = child.stdin.take() {
            // A command that does not read its stdin is not an error.
            let _ = stdin.write_all(&line).await;
        }
        child.wait().await
    };
    match tokio::time::timeout(timeout, run).await {
        Ok(Ok(st)) if st.success() => Ok(()),
        Ok(Ok(st)) => Err(format!("`{command}` ended with {st}")),
        Ok(Err(e)) => Err(format!("`{command}`: {e}")),
        Err(_) => {
            if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            Err(format!(
                "`{command}` ran past notify.timeout_seconds ({} s) and was killed",
                timeout.as_secs_f64()
            ))
        }
    }
}

/// POSTs `event` to `url` as JSON; a connection error, a time-out or an answer other than 2xx
/// is tried again after 1 s, 2 s, 4 s … up to `retries` more times.
async fn post(url: &str, event: &Value, timeout: Duration, retries: u32) -> Result<(), String> {
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| format!("notify.webhook {url:?}: {e}"))?;
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()
        .map_err(|e| format!("no root certificates for https: {e}"))?
        .https_or_http()
        .enable_http1()
        .build();
    let client: hyper_util::client::legacy::Client<_, Full<Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(connector);
    let body = Bytes::from(serde_json::to_vec(event).unwrap_or_default());
    let mut last = String::new();
    for attempt in 0..=retries {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_secs(1 << (attempt - 1).min(6))).await;
        }
        let req = http::Request::post(uri.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(
                http::header::USER_AGENT,
                concat!("zergd/", env!("CARGO_PKG_VERSION")),
            )
            .body(Full::new(body.clone()))
            .map_err(|e| e.to_string())?;
        let answer = tokio::time::timeout(timeout, async {
            let res = client.request(req).await.map_err(|e| e.to_string())?;
            let status = res.status();
            // Read (a bounded part of) the answer so that the connection ends cleanly.
            let _ = http_body_util::Limited::new(res.into_body(), ANSWER_LIMIT)
                .collect()
                .await;
            Ok::<_, String>(status)
        })
        .await;
        match answer {
            Ok(Ok(s)) if s.is_success() => return Ok(()),
            Ok(Ok(s)) => last = format!("{url} answered {s}"),
            Ok(Err(e)) => last = format!("{url}: {e}"),
            Err(_) => last = format!("{url} did not answer within {} s", timeout.as_secs_f64()),
        }
    }
    Err(format!("{last} (after {} attempts)", retries + 1))
}

/// A desktop notification: `notify-send` (Linux) or `osascript` (macOS), whichever is on the
/// `PATH`; neither is not an error.
async fn desktop(event: &Value, timeout: Duration) -> Result<(), String> {
    let (title, text) = summary(event);
    let on_path = |name: &str| {
        std::env::var_os("PATH")
            .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
    };
    let mut cmd = if on_path("notify-send") {
        let mut c = tokio::process::Command::new("notify-send");
        c.args(notify_send_args(&title, &text));
        c
    } else if on_path("osascript") {
        let quote = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
        let mut c = tokio::process::Command::new("osascript");
        c.arg("-e").arg(format!(
            "display notification \"{}\" with title \"{}\"",
            quote(&text),
            quote(&title)
        ));
        c
    } else {
        return Ok(());
    };
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    match tokio::time::timeout(timeout, cmd.status()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("the desktop notifier did not finish in time".into()),
    }
}

/// `notify-send`'s arguments: what follows `--` is never read as an option, whatever a worker
/// made it start with.
fn notify_send_args(title: &str, text: &str) -> [String; 4] {
    [
        "--app-name=zerg".into(),
        "--".into(),
        title.into(),
        text.into(),
    ]
}

/// Characters of any one field a worker or a graph wrote that a notification shows.
const FIELD_CHARS: usize = 200;

/// A field a worker or a graph wrote, as a notification shows it: control characters become
/// spaces, runs of white space one space, and it is cut at [`FIELD_CHARS`].
fn field(v: &Value) -> String {
    let s = v.as_str().unwrap_or("?");
    let flat: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let words: Vec<&str> = flat.split_whitespace().collect();
    let one = words.join(" ");
    if one.chars().count() > FIELD_CHARS {
        let cut: String = one.chars().take(FIELD_CHARS).collect();
        format!("{cut}…")
    } else {
        one
    }
}

/// A notification's title and one line of text. What a worker or a graph wrote (feature,
/// task id, error, reason) is flattened to one line and cut short.
pub fn summary(event: &Value) -> (String, String) {
    let feature = field(&event["feature"]);
    let title = match event["event"].as_str().unwrap_or_default() {
        "rush_complete" => format!("zerg: {feature} complete"),
        "rush_failed" => format!("zerg: {feature} failed"),
        "rush_stopped" => format!("zerg: {feature} stopped"),
        "rush_paused" => format!("zerg: {feature} paused"),
        "task_failed" => format!("zerg: {feature}: task {} failed", field(&event["task_id"])),
        other => format!("zerg: {feature}: {other}"),
    };
    let counts = &event["tasks"];
    let mut text = format!(
        "{} of {} tasks complete",
        counts["complete"].as_u64().unwrap_or(0),
        counts["total"].as_u64().unwrap_or(0)
    );
    if let Some(r) = event["reason"].as_str().filter(|r| !r.is_empty()) {
        text = format!("{} ({text})", field(&Value::from(r)));
    }
    if let Some(e) = event["error"].as_str().filter(|e| !e.is_empty()) {
        text = format!("{} ({text})", field(&Value::from(e)));
    }
    (title, text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_summary_names_the_feature_the_event_and_the_reason() {
        let (t, x) = summary(&json!({"event": "rush_paused", "feature": "auth",
            "reason": "usage limit", "tasks": {"complete": 3, "total": 12}}));
        assert_eq!(t, "zerg: auth paused");
        assert_eq!(x, "usage limit (3 of 12 tasks complete)");
        let (t, _) = summary(&json!({"event": "task_failed", "feature": "auth", "task_id": "A-1"}));
        assert_eq!(t, "zerg: auth: task A-1 failed");
    }

    #[test]
    fn worker_text_is_one_short_line_after_the_end_of_options() {
        let evil = format!("--help\u{1b}[31m\nrm -rf /\r{}", "x".repeat(5000));
        let (t, x) = summary(&json!({"event": "task_failed", "feature": "--version",
            "task_id": "A-1\u{7}", "error": evil, "tasks": {"complete": 1, "total": 2}}));
        assert_eq!(t, "zerg: --version: task A-1 failed");
        assert!(x.starts_with("--help [31m rm -rf / xxx"), "{x}");
        assert!(!x.chars().any(char::is_control), "{x:?}");
        assert!(x.chars().count() < FIELD_CHARS + 40, "{}", x.len());
        let args = notify_send_args(&t, &x);
        assert_eq!(
            args[1], "--",
            "positional arguments follow the end of options"
        );
        assert!(args[3].starts_with("--help"));
    }

    #[tokio::test]
    async fn a_command_gets_the_event_on_stdin_and_one_that_hangs_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("got.json");
        let cmd = format!("cat > '{}'", out.display());
        let ev = json!({"event": "rush_complete", "feature": "f"});
        run_command(
            &cmd,
            &dir.path().to_path_buf(),
            &ev,
            Duration::from_secs(30),
        )
        .await
        .unwrap();
        let got: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
        assert_eq!(got, ev);

        let err = run_command(
            "sleep 300",
            &dir.path().to_path_buf(),
            &ev,
            Duration::from_millis(200),
        )
        .await
        .unwrap_err();
        assert!(err.contains("was killed"), "{err}");
        let err = run_command(
            "exit 3",
            &dir.path().to_path_buf(),
            &ev,
            Duration::from_secs(30),
        )
        .await
        .unwrap_err();
        assert!(err.contains("exit status: 3"), "{err}");
    }

    #[tokio::test]
    async fn a_webhook_that_fails_is_tried_again_and_one_that_never_answers_times_out() {
        use tokio::io::AsyncReadExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // The first request gets a 503, the second a 204.
        let server = tokio::spawn(async move {
            let mut bodies = Vec::new();
            for status in ["503 Service Unavailable", "204 No Content"] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = vec![0u8; 8192];
                let mut got = Vec::new();
                loop {
                    let n = s.read(&mut buf).await.unwrap();
                    got.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&got).to_string();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let len: usize = head
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length: ")
                                    .map(|v| v.trim().parse().unwrap())
                            })
                            .unwrap_or(0);
                        if body.len() >= len {
                            bodies.push(body.to_string());
                            break;
                        }
                    }
                    if n == 0 {
                        break;
                    }
                }
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                        )
                        .as_bytes(),
                    )
                    .await;
            }
            bodies
        });
        let ev = json!({"event": "rush_failed", "feature": "f"});
        post(
            &format!("http://{addr}/hook"),
            &ev,
            Duration::from_secs(10),
            1,
        )
        .await
        .unwrap();
        let bodies = server.await.unwrap();
        assert_eq!(bodies.len(), 2);
        assert_eq!(serde_json::from_str::<Value>(&bodies[1]).unwrap(), ev);

        // A listener that accepts and never answers: each attempt times out.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = silent.local_addr().unwrap();
        let _hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = silent.accept().await {
                held.push(s);
            }
        });
        let err = post(
            &format!("http://{addr}/"),
            &ev,
            Duration::from_millis(200),
            0,
        )
        .await
        .unwrap_err();
        assert!(err.contains("did not answer"), "{err}");
    }
}
