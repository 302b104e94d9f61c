//! Rushes driven by the real Claude Code CLI (the binary the pinned `claude-agent-sdk` wheel
//! bundles) with the default agent command, against the `messages-api` stand-in on 127.0.0.1:
//! tasks done with their cost and tokens, a subscription's usage limit and an API key's 429
//! held until they pass, no login, and an API that cannot be reached.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use zerg_tests::*;

const T: Duration = Duration::from_secs(240);

/// The config of these tests: the default agent command, fast resilience settings, and
/// `IS_SANDBOX` passed on (as root, Claude Code refuses `--dangerously-skip-permissions`
/// without it).
fn config(extra: &str) -> String {
    // The real CLI is a large program: on a loaded machine it may be silent for seconds while
    // it starts, which is not a hang.
    let workers = FAST_WORKERS
        .replace(
            "task_stale_timeout_seconds: 5",
            "task_stale_timeout_seconds: 60",
        )
        .replace(
            "heartbeat_stale_threshold: 4",
            "heartbeat_stale_threshold: 30",
        );
    assert_ne!(workers, FAST_WORKERS);
    format!("agent:\n  timeout_seconds: 120\n  env_passthrough: [IS_SANDBOX]\n{workers}{extra}")
}

/// A repository with a graph, the config, and zergd with `claude` on its PATH and a home of
/// its own (no login there). `env` adds the login and the API's address.
fn setup(
    claude: &Path,
    feature: &str,
    graph: &str,
    extra: &str,
    env: Vec<(&str, String)>,
) -> (TestRepo, Daemon, tempfile::TempDir) {
    let repo = TestRepo::new();
    repo.write_graph(feature, graph);
    std::fs::create_dir_all(repo.path.join(".zerg")).unwrap();
    std::fs::write(repo.path.join(".zerg/config.yaml"), config(extra)).unwrap();
    let home = tempfile::tempdir().unwrap();
    let path = format!(
        "{}:{}",
        claude.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut all = vec![
        ("PATH".to_string(), path),
        ("HOME".to_string(), home.path().display().to_string()),
        ("IS_SANDBOX".to_string(), "1".to_string()),
        // The CLI's own retries, short: the tests are about what comes after them.
        ("CLAUDE_CODE_MAX_RETRIES".to_string(), "1".to_string()),
    ];
    // The merges zergd makes need an identity, which the home of its own does not have.
    for k in ["GIT_AUTHOR", "GIT_COMMITTER"] {
        all.push((format!("{k}_NAME"), "zerg test".to_string()));
        all.push((format!("{k}_EMAIL"), "test@zerg.invalid".to_string()));
    }
    all.extend(env.into_iter().map(|(k, v)| (k.to_string(), v)));
    // Nothing of the machine's own login may leak in.
    let unset = [
        "ANTHROPIC_API_KEY",
        "CLAUDE_CODE_OAUTH_TOKEN",
        "ANTHROPIC_AUTH_TOKEN",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let d = Daemon::start_with(all, unset);
    (repo, d, home)
}

fn rush(d: &Daemon, repo: &TestRepo, feature: &str, workers: u32) {
    let out = d.ctl_in(
        &repo.path,
        &[
            "rush",
            feature,
            "--workers",
            &workers.to_string(),
            "--detach",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn monitor(repo: &TestRepo) -> String {
    std::fs::read_to_string(repo.path.join(".zerg/monitor.log")).unwrap_or_default()
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Task ids of a [`graph_wide`] graph.
fn wide_ids(levels: u32, per_level: u32) -> Vec<String> {
    let mut v: Vec<String> = (1..=levels)
        .flat_map(|l| (1..=per_level).map(move |i| format!("W-L{l}-{i:05}")))
        .collect();
    v.sort();
    v
}

fn complete_once(d: &Daemon, repo: &TestRepo, feature: &str, ids: &[String]) -> Value {
    let st = d.wait_end(&repo.path, feature, T);
    assert_eq!(
        st["state"],
        "complete",
        "{}\n{}",
        serde_json::to_string_pretty(&st).unwrap(),
        monitor(repo)
    );
    assert_eq!(tasks_with(&st, "complete"), ids);
    assert_eq!(
        repo.task_ids_on(&format!("zerg/{feature}/staging")),
        ids,
        "each Task-ID exactly once on staging"
    );
    st
}

fn api_key() -> (&'static str, String) {
    ("ANTHROPIC_API_KEY", "sk-ant-api03-test".to_string())
}

#[test]
fn the_real_cli_completes_a_rush_and_status_has_its_cost_and_tokens() {
    let Some(claude) = real_claude() else { return };
    let api = MessagesApi::start(&[]);
    let (repo, d, _home) = setup(
        &claude,
        "rc",
        &graph_12("rc"),
        "",
        vec![api_key(), ("ANTHROPIC_BASE_URL", api.url.clone())],
    );
    rush(&d, &repo, "rc", 3);
    let st = complete_once(&d, &repo, "rc", &graph_12_ids());
    for (id, t) in st["tasks"].as_object().unwrap() {
        assert!(t["cost_usd"].as_f64().unwrap() > 0.0, "{id}: {t}");
        assert!(
            t["tokens"]["input_tokens"].as_u64().unwrap() > 0
                && t["tokens"]["output_tokens"].as_u64().unwrap() > 0,
            "{id}: {t}"
        );
        assert_eq!(t["attempts"], 1, "{id}: {}", monitor(&repo));
    }
    let total: f64 = st["tasks"]
        .as_object()
        .unwrap()
        .values()
        .map(|t| t["cost_usd"].as_f64().unwrap())
        .sum();
    assert!((st["cost_usd"].as_f64().unwrap() - total).abs() < 1e-9);
    let models = st["models"].as_object().unwrap();
    assert!(!models.is_empty(), "{st}");
    assert!(
        models
            .values()
            .all(|m| m["cost_usd"].as_f64().unwrap() > 0.0)
    );
    let text = String::from_utf8_lossy(&d.ctl_in(&repo.path, &["status", "rc"]).stdout).to_string();
    assert!(
        text.contains("Agent cost: $") && text.contains(" in, "),
        "{text}"
    );
}

#[test]
fn a_subscription_usage_limit_holds_the_rush_until_its_reset() {
    let Some(claude) = real_claude() else { return };
    // A 5-hour limit that resets in a few seconds.
    let reset = now_s() + 4;
    let api = MessagesApi::start(&["--mode", "429-oauth", "--until", &reset.to_string()]);
    let (repo, d, _home) = setup(
        &claude,
        "sub",
        &graph_wide("sub", 1, 3),
        // A counted attempt would fail the rush.
        "  retry_attempts: 0\n",
        vec![
            ("CLAUDE_CODE_OAUTH_TOKEN", "sk-ant-oat01-test".to_string()),
            ("ANTHROPIC_BASE_URL", api.url.clone()),
        ],
    );
    rush(&d, &repo, "sub", 2);
    let st = complete_once(&d, &repo, "sub", &wide_ids(1, 3));
    for (id, t) in st["tasks"].as_object().unwrap() {
        assert_eq!(t["attempts"], 1, "{id}: the limited attempt is not counted");
    }
    let log = monitor(&repo);
    assert!(log.contains("usage limit until"), "{log}");
    assert!(log.contains("UTC (five_hour)"), "{log}");
    assert!(
        log.contains("Usage limit reset; resuming new work"),
        "{log}"
    );
    // The hold is the whole rush's: no worker claimed a task while it lasted.
    let mut held = false;
    for line in log.lines() {
        if line.contains("hit the agent's usage limit") {
            held = true;
        } else if line.contains("Usage limit reset") {
            held = false;
        } else if line.contains(" claimed task ") {
            assert!(!held, "a task was claimed during the hold: {line}\n{log}");
        }
    }
}

#[test]
fn an_api_key_429_holds_new_work_and_costs_no_attempt() {
    let Some(claude) = real_claude() else { return };
    let until = now_s() + 3;
    let api = MessagesApi::start(&["--mode", "429", "--until", &until.to_string()]);
    let (repo, d, _home) = setup(
        &claude,
        "key",
        &graph_wide("key", 1, 2),
        "  retry_attempts: 0\n",
        vec![api_key(), ("ANTHROPIC_BASE_URL", api.url.clone())],
    );
    rush(&d, &repo, "key", 1);
    let st = complete_once(&d, &repo, "key", &wide_ids(1, 2));
    for (id, t) in st["tasks"].as_object().unwrap() {
        assert_eq!(t["attempts"], 1, "{id}");
    }
    let log = monitor(&repo);
    assert!(log.contains("hit the agent's usage limit"), "{log}");
}

#[test]
fn without_a_login_the_rush_pauses_once_naming_the_fix() {
    let Some(claude) = real_claude() else { return };
    let api = MessagesApi::start(&[]);
    let (repo, d, _home) = setup(
        &claude,
        "nologin",
        &graph_wide("nologin", 1, 4),
        "",
        vec![("ANTHROPIC_BASE_URL", api.url.clone())],
    );
    rush(&d, &repo, "nologin", 2);
    // Paused, and the tasks that were running then have ended.
    let st = d.wait_for(&repo.path, "nologin", T, "the rush to pause", |s| {
        s["state"] != "running"
            && s["state"] != "pending"
            && tasks_with(s, "in_progress").is_empty()
    });
    assert_eq!(st["state"], "paused", "{st}");
    let reason = st["reason"].as_str().unwrap();
    for fix in ["claude /login", "ANTHROPIC_API_KEY", "claude setup-token"] {
        assert!(reason.contains(fix), "{reason}");
    }
    assert!(reason.contains("Not logged in"), "{reason}");
    assert!(
        !reason.contains("{\""),
        "no raw stream-json in the reason: {reason}"
    );
    let log = monitor(&repo);
    for (id, t) in st["tasks"].as_object().unwrap() {
        assert_ne!(t["status"], "failed", "{id}");
        assert_eq!(t["attempts"], 0, "{id}: no attempt is counted: {log}");
    }
    assert_eq!(log.matches("rush paused").count(), 1, "refused once: {log}");
}

#[test]
fn an_unreachable_api_is_not_counted_and_pauses_the_rush_when_every_worker_sees_it() {
    let Some(claude) = real_claude() else { return };
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (repo, d, _home) = setup(
        &claude,
        "nonet",
        &graph_wide("nonet", 1, 3),
        "  retry_attempts: 0\n",
        vec![
            api_key(),
            ("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{port}")),
        ],
    );
    rush(&d, &repo, "nonet", 2);
    let st = d.wait_for(&repo.path, "nonet", T, "the rush to pause", |s| {
        s["state"] != "running" && s["state"] != "pending"
    });
    assert_eq!(st["state"], "paused", "{st}");
    assert!(
        st["reason"]
            .as_str()
            .unwrap()
            .contains("cannot reach its API"),
        "{st}"
    );
    for (id, t) in st["tasks"].as_object().unwrap() {
        assert_ne!(t["status"], "failed", "{id}: not the task's fault");
    }
    let log = monitor(&repo);
    assert!(log.contains("could not reach its API"), "{log}");
    assert!(log.contains("(the attempt is not counted)"), "{log}");
}

/// The real CLI inside worker containers, logged in with a subscription token from zergd's
/// environment and pointed at the stand-in through `ANTHROPIC_BASE_URL`: both reach the
/// containers, the CLI's calls get through, and the rush completes with every Task-ID once.
/// (The containers share the host's network so that 127.0.0.1 is the stand-in.)
#[test]
fn the_real_cli_in_containers_reaches_its_api_with_a_subscription_token() {
    let Some(claude) = real_claude() else { return };
    if !crate::container::docker_ready() {
        return;
    }
    let image = "zerg-worker:e2e-real-claude";
    let out = std::process::Command::new(bin("zergctl"))
        .args(["image", "build", "--offline", "--tag", image, "--with"])
        .arg(claude.join("claude"))
        .arg("--agent")
        .arg(bin("zerg-worker-agent"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "zergctl image build: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let api = MessagesApi::start(&[]);
    let (repo, d, _home) = setup(
        &claude,
        "rcc",
        &graph_12("rcc"),
        &format!("container:\n  image: {image}\n  network: host\n"),
        vec![
            ("CLAUDE_CODE_OAUTH_TOKEN", "sk-ant-oat01-test".to_string()),
            ("ANTHROPIC_BASE_URL", api.url.clone()),
        ],
    );
    crate::container::start_detached(&d, &repo, "rcc", 2);
    let st = complete_once(&d, &repo, "rcc", &graph_12_ids());
    for (id, t) in st["tasks"].as_object().unwrap() {
        assert!(t["cost_usd"].as_f64().unwrap() > 0.0, "{id}: {t}");
    }
}
