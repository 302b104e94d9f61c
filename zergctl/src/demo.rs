//! `zergctl demo`: a complete rush in a scratch repository, with a scripted agent instead of
//! Claude Code, and a zergd that lives only as long as the demo.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use zerg_proto::v1;

use crate::{CliError, code};

/// The scripted agent: writes every file the prompt asks it to create or modify. The prompt is
/// appended as the last argument, which `sh -c` sees as `$1`.
const SCRIPTED_AGENT: &str = r#"prompt="$1"
files() { printf '%s\n' "$prompt" | sed -n "s/^$1: //p" | tr ',' '\n' | sed 's/^ *//;s/ *$//' | grep -v '^$'; }
files Create | while read -r f; do mkdir -p "$(dirname "$f")"; echo "created by $ZERG_TASK_ID" > "$f"; done
files Modify | while read -r f; do mkdir -p "$(dirname "$f")"; echo "modified by $ZERG_TASK_ID" >> "$f"; done
echo "scripted agent finished $ZERG_TASK_ID""#;

const GRAPH: &str = r#"{
  "feature": "demo",
  "version": "2.0",
  "tasks": [
    {"id": "DEMO-L1-001", "title": "Greeting", "level": 1, "dependencies": [],
     "files": {"create": ["src/greeting.txt"], "modify": [], "read": []},
     "verification": {"command": "test -f src/greeting.txt"}},
    {"id": "DEMO-L1-002", "title": "Name", "level": 1, "dependencies": [],
     "files": {"create": ["src/name.txt"], "modify": [], "read": []},
     "verification": {"command": "test -f src/name.txt"}},
    {"id": "DEMO-L1-003", "title": "Intro doc", "level": 1, "dependencies": [],
     "files": {"create": ["docs/intro.md"], "modify": [], "read": []},
     "verification": {"command": "test -f docs/intro.md"}},
    {"id": "DEMO-L2-001", "title": "Hello from greeting and name", "level": 2, "dependencies": ["DEMO-L1-001", "DEMO-L1-002"],
     "files": {"create": ["src/hello.txt"], "modify": [], "read": ["src/greeting.txt", "src/name.txt"]},
     "verification": {"command": "test -f src/greeting.txt && test -f src/name.txt && test -f src/hello.txt"}},
    {"id": "DEMO-L2-002", "title": "Usage doc", "level": 2, "dependencies": ["DEMO-L1-003"],
     "files": {"create": ["docs/usage.md"], "modify": [], "read": ["docs/intro.md"]},
     "verification": {"command": "test -f docs/intro.md && test -f docs/usage.md"}},
    {"id": "DEMO-L3-001", "title": "Polish hello", "level": 3, "dependencies": ["DEMO-L2-001", "DEMO-L2-002"],
     "files": {"create": [], "modify": ["src/hello.txt"], "read": ["docs/usage.md"]},
     "verification": {"command": "grep -q 'modified by DEMO-L3-001' src/hello.txt && test -f docs/usage.md"}}
  ]
}
"#;

/// Who commits in the demo repository.
const DEMO_NAME: &str = "zerg demo";
const DEMO_EMAIL: &str = "demo@zerg.invalid";

fn sh(dir: &Path, args: &[&str]) -> Result<String, CliError> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .map_err(|e| {
            CliError::new(
                code::INTERNAL,
                format!("cannot run git (is it installed?): {e}"),
            )
        })?;
    if !out.status.success() {
        return Err(CliError::new(
            code::INTERNAL,
            format!(
                "git {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            ),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}

/// Writes the demo repository.
pub fn make_repo(dir: &Path) -> Result<(), CliError> {
    let io = |e: std::io::Error| {
        CliError::new(
            code::INTERNAL,
            format!("cannot write the demo repository: {e}"),
        )
    };
    std::fs::create_dir_all(dir.join(".gsd/specs/demo")).map_err(io)?;
    std::fs::create_dir_all(dir.join(".zerg")).map_err(io)?;
    std::fs::write(dir.join("README.md"), "# zerg demo\n").map_err(io)?;
    std::fs::write(dir.join(".gsd/specs/demo/task-graph.json"), GRAPH).map_err(io)?;
    std::fs::write(
        dir.join(".gsd/specs/demo/requirements.md"),
        "Build a greeting in three levels.\n",
    )
    .map_err(io)?;
    let agent =
        serde_json::to_string(&vec!["sh", "-c", SCRIPTED_AGENT, "demo-agent"]).unwrap_or_default();
    let config = format!(
        "agent:\n  command: {agent}\n  timeout_seconds: 60\nworkers:\n  backoff_base_seconds: 1\n  backoff_max_seconds: 5\n  heartbeat_interval_seconds: 1\n  heartbeat_stale_threshold: 10\n  task_stale_timeout_seconds: 30\n  stop_grace_seconds: 2\n"
    );
    std::fs::write(dir.join(".zerg/config.yaml"), config).map_err(io)?;
    sh(dir, &["init", "-q", "-b", "main"])?;
    // An identity of its own, in the repository's config: the workers' commits and zergd's
    // merges need one, and a fresh machine (a CI runner, a new VM) has none.
    sh(dir, &["config", "user.name", DEMO_NAME])?;
    sh(dir, &["config", "user.email", DEMO_EMAIL])?;
    sh(dir, &["add", "-A"])?;
    sh(dir, &["commit", "-q", "-m", "demo: initial commit"])?;
    Ok(())
}

fn zergd_bin() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("zergd")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("zergd"))
}

/// Runs the demo. However it ends (complete, paused, failed, or interrupted with Ctrl-C), its
/// workers are stopped before its zergd is shut down: nothing it started outlives it.
pub async fn run(workers: u32, keep: bool) -> Result<u8, CliError> {
    let tmp = tempfile::Builder::new()
        .prefix("zerg-demo-")
        .tempdir()
        .map_err(|e| {
            CliError::new(
                code::INTERNAL,
                format!("cannot create a scratch directory: {e}"),
            )
        })?;
    let repo = tmp.path().join("repo");
    make_repo(&repo)?;
    let socket = tmp.path().join("run").join("zergd.sock");
    // From here on a Ctrl-C is the demo's to handle: it ends the demo the same way as any other
    // outcome.
    let mut interrupt =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
            .map_err(|e| CliError::new(code::INTERNAL, format!("cannot handle Ctrl-C: {e}")))?;
    let mut zergd = tokio::process::Command::new(zergd_bin())
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(tmp.path().join("state"))
        .env("ZERG_LOG", "warn")
        .stdin(Stdio::null())
        // Its own process group: a Ctrl-C at the terminal reaches the demo, which stops the
        // workers and then zergd, rather than zergd, which would leave its workers running.
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            CliError::new(
                code::INTERNAL,
                format!("cannot start zergd ({}): {e}", zergd_bin().display()),
            )
        })?;
    println!(
        "Demo repository: {}\nzergd: pid {} on {}",
        repo.display(),
        zergd.id().unwrap_or(0),
        socket.display()
    );
    // Wait until zergd answers on its socket.
    let mut client = None;
    for _ in 0..200 {
        if let Ok(Some(st)) = zergd.try_wait() {
            return Err(CliError::new(
                code::INTERNAL,
                format!("zergd exited early: {st}"),
            ));
        }
        if let Ok(ch) = zerg_proto::transport::connect(&socket).await {
            client = Some(v1::control_client::ControlClient::new(ch));
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            _ = interrupt.recv() => {
                // No rush has started: zergd has no workers yet.
                let _ = zergd.kill().await;
                return Ok(code::FAILED);
            }
        }
    }
    let mut c =
        client.ok_or_else(|| CliError::new(code::INTERNAL, "zergd did not start listening"))?;
    let repo_s = repo.to_string_lossy().to_string();
    let start = crate::cmd::rush::Start {
        repo: &repo_s,
        feature: "demo",
        workers,
        mode: "subprocess",
        max_usd: None,
    };
    let result = tokio::select! {
        r = crate::cmd::rush::rush(&mut c, start, false, false) => r,
        _ = interrupt.recv() => Ok(code::FAILED),
    };
    let complete = status(&mut c, &repo_s)
        .await
        .is_some_and(|st| st.state() == v1::RushState::Complete);
    let result = match result {
        Ok(code::OK) if !complete => Ok(code::FAILED),
        other => other,
    };
    if complete {
        let log = sh(&repo, &["log", "--oneline", "zerg/demo/staging"])?;
        println!("\nzerg/demo/staging:\n{log}");
        let hello = sh(&repo, &["show", "zerg/demo/staging:src/hello.txt"])?;
        println!("src/hello.txt on staging:\n{hello}");
    } else {
        println!("The demo did not complete; stopping its workers.");
    }
    stop_workers(&mut c, &repo_s).await;
    let _ = c.shutdown(v1::ShutdownRequest {}).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), zergd.wait()).await;
    if keep {
        let path = tmp.keep();
        println!("Kept {}", path.display());
    }
    result
}

async fn status(
    c: &mut v1::control_client::ControlClient<tonic::transport::Channel>,
    repo: &str,
) -> Option<v1::RushStatus> {
    c.status(v1::StatusRequest {
        repo: repo.to_string(),
        feature: "demo".into(),
    })
    .await
    .ok()
    .map(|r| r.into_inner())
}

/// Stops the demo rush's workers (SIGKILL: the demo is over) and waits until zergd has seen
/// every one of them exit.
async fn stop_workers(
    c: &mut v1::control_client::ControlClient<tonic::transport::Channel>,
    repo: &str,
) {
    // A complete rush has nothing to stop: its workers exit by themselves.
    let _ = c
        .stop(v1::StopRequest {
            repo: repo.to_string(),
            feature: "demo".into(),
            force: true,
        })
        .await;
    let gone = |st: &v1::RushStatus| {
        st.workers.values().all(|w| {
            matches!(
                w.status(),
                v1::WorkerState::Exited
                    | v1::WorkerState::Done
                    | v1::WorkerState::GaveUp
                    | v1::WorkerState::Blocked
            )
        })
    };
    for _ in 0..600 {
        match status(c, repo).await {
            Some(st) if !gone(&st) => tokio::time::sleep(Duration::from_millis(50)).await,
            _ => return,
        }
    }
    eprintln!("warning: some demo workers had not exited after 30 s");
}
