//! Rushes driven by the real Claude Code CLI (the binary the pinned `claude-agent-sdk` wheel
//! bundles) with the default agent command, against the `messages-api` stand-in on 127.0.0.1:
//! tasks done with their cost and tokens, a subscription's usage limit and an API key's 429
//! held until they pass, no login, and an API that cannot be reached.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use zerg_tests::*;

const T: Duration = Duration::from_secs(240);

/// The config of these tests: the default agent command, fast resilience settings, and
/// `IS_SANDBOX` passed on (as root, Claude Code refuses `--dangerously-skip-permissions`
/// without it).
fn config() -> Config {
    // The real CLI is a large program: on a loaded machine it may be silent for seconds while
    // it starts, which is not a hang.
    Config::new()
        .set("agent.timeout_seconds", 120)
        .set("agent.env_passthrough", ["IS_SANDBOX"])
        .fast_workers()
        .set("workers.task_stale_timeout_seconds", 60)
        .set("workers.heartbeat_stale_threshold", 30)
}

/// A repository with a graph and `config`, and zergd with `claude` on its PATH (in its home of
/// its own there is no login, and git has no identity). `env` adds the login and the API's
/// address.
fn setup(
    claude: &Path,
    feature: &str,
    graph: &str,
    config: Config,
    env: Vec<(&str, String)>,
) -> (TestRepo, Daemon) {
    let repo = TestRepo::new();
    repo.write_graph(feature, graph);
    repo.configure(&config);
    let path = format!(
        "{}:{}",
        claude.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut d = Daemon::builder()
        .env("PATH", path)
        .env("IS_SANDBOX", "1")
        // The CLI's own retries, short: the tests are about what comes after them.
        .env("CLAUDE_CODE_MAX_RETRIES", "1");
    for (k, v) in env {
        d = d.env(k, v);
    }
    // Nothing of the machine's own login may leak in.
    for k in [
        "ANTHROPIC_API_KEY",
        "CLAUDE_CODE_OAUTH_TOKEN",
        "ANTHROPIC_AUTH_TOKEN",
    ] {
        d = d.unset(k);
    }
    (repo, d.start())
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
    let (repo, d) = setup(
        &claude,
        "rc",
        &graph_12("rc"),
        config(),
        vec![api_key(), ("ANTHROPIC_BASE_URL", api.url.clone())],
    );
    rush(&d, &repo, "rc", 3);
    let st = complete_once(&d, &repo, "rc", &graph_12_ids());
    // Under zergd's default sandbox: the workers have no network of their own, so every
    // request reached the stand-in on 127.0.0.1 through the egress proxy.
    assert_eq!(st["sandbox"]["confined"], true, "{}", st["sandbox"]);
    assert_eq!(st["sandbox"]["egress_refused"], 0, "{}", monitor(&repo));
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
    // A 5-hour limit that resets a few seconds after the CLI's first call.
    let api = MessagesApi::start(&["--mode", "429-oauth", "--for", "4"]);
    let (repo, d) = setup(
        &claude,
        "sub",
        &graph_wide("sub", 1, 3),
        // A counted attempt would fail the rush.
        config().set("workers.retry_attempts", 0),
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
    // Rejected for a few seconds from the CLI's first call.
    let api = MessagesApi::start(&["--mode", "429", "--for", "3"]);
    let (repo, d) = setup(
        &claude,
        "key",
        &graph_wide("key", 1, 2),
        config().set("workers.retry_attempts", 0),
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
    let (repo, d) = setup(
        &claude,
        "nologin",
        &graph_wide("nologin", 1, 4),
        config(),
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
    let port = free_port();
    let (repo, d) = setup(
        &claude,
        "nonet",
        &graph_wide("nonet", 1, 3),
        config().set("workers.retry_attempts", 0),
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
/// The containers have no network (`container.network: none`, the default): the CLI reaches
/// the stand-in on the host's 127.0.0.1 only through zergd's egress proxy, over the worker
/// socket.
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
    let (repo, d) = setup(
        &claude,
        "rcc",
        &graph_12("rcc"),
        config().set("container.image", image),
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

#[test]
fn the_real_clis_second_request_carries_the_failed_verifications_text() {
    let Some(claude) = real_claude() else { return };
    let record = tempfile::tempdir().unwrap();
    let log = record.path().join("requests.jsonl");
    let api = MessagesApi::start(&["--record", log.to_str().unwrap()]);
    // The check wants a token that only its own failure prints (`TOK` is spelled in base64, so
    // the token is not in the command's text, which the prompt shows); the stand-in writes
    // every `TOKEN-` word of its prompt into the file it creates.
    let check = r#"grep -q "$(printf VE9L | base64 -d)EN-7f3a" token.txt || { echo "token.txt lacks $(printf VE9L | base64 -d)EN-7f3a"; exit 1; }"#;
    let graph = serde_json::json!({"feature": "rt", "version": "2.0", "tasks": [{
        "id": "R-L1-001", "title": "Write the token", "level": 1, "dependencies": [],
        "description": "Write the token the check asks for into token.txt",
        "files": {"create": ["token.txt"], "modify": [], "read": []},
        "verification": {"command": check, "timeout_seconds": 30}
    }]});
    let (repo, d) = setup(
        &claude,
        "rt",
        &graph.to_string(),
        config(),
        vec![api_key(), ("ANTHROPIC_BASE_URL", api.url.clone())],
    );
    rush(&d, &repo, "rt", 1);
    let st = complete_once(&d, &repo, "rt", &["R-L1-001".to_string()]);
    assert_eq!(st["tasks"]["R-L1-001"]["attempts"], 2, "{}", monitor(&repo));
    // What the API got: two task requests, the second with the first one's failure.
    let requests: Vec<Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(requests.len(), 2, "{requests:?}");
    let prompt = |i: usize| requests[i]["prompt"].as_str().unwrap_or_default();
    assert!(
        !prompt(0).contains("TOKEN-7f3a") && !prompt(0).contains("## Previous attempt"),
        "{}",
        prompt(0)
    );
    assert!(
        prompt(1).contains("## Previous attempt")
            && prompt(1).contains("token.txt lacks TOKEN-7f3a"),
        "{}",
        prompt(1)
    );
}
