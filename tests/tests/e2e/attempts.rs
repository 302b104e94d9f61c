//! A failed attempt teaches the next one: the retry's prompt carries how the last attempt
//! failed and the tail of what its failed verification printed.

use std::time::Duration;

use serde_json::json;
use zerg_tests::*;

const T: Duration = Duration::from_secs(120);

/// One task whose verification wants a token it prints only when it fails (the token is not in
/// the command's text: `TOK` is spelled in base64), and an agent that writes every `TOKEN-`
/// word of its prompt into the file: it can pass only if its prompt holds the failure's text.
fn token_rush(d: &Daemon, repo: &TestRepo, config: Config) -> serde_json::Value {
    let check = r#"grep -q "$(printf VE9L | base64 -d)EN-7f3a" token.txt || { echo "token.txt lacks $(printf VE9L | base64 -d)EN-7f3a"; exit 1; }"#;
    let graph = json!({"feature": "tok", "version": "2.0", "tasks": [{
        "id": "R-L1-001", "title": "Write the token", "level": 1, "dependencies": [],
        "description": "Write the token the check asks for into token.txt",
        "files": {"create": ["token.txt"], "modify": [], "read": []},
        "verification": {"command": check, "timeout_seconds": 30}
    }]});
    repo.write_graph("tok", &graph.to_string());
    repo.write_script(
        "tok",
        &json!({"default": [{"op": "echo_prompt_words", "prefix": "TOKEN-", "path": "token.txt"}]}),
    );
    repo.configure(&config);
    assert!(
        d.ctl_in(&repo.path, &["rush", "tok", "--workers", "1", "--detach"])
            .status
            .success()
    );
    d.wait_end(&repo.path, "tok", T)
}

#[test]
fn the_retry_prompt_carries_the_failed_verifications_output_and_the_task_then_passes() {
    let repo = TestRepo::new();
    let d = Daemon::start();
    let st = token_rush(&d, &repo, Config::fake_agent().fast_workers());
    let t = &st["tasks"]["R-L1-001"];
    assert_eq!(st["state"], "complete", "{st}");
    assert_eq!(t["attempts"], 2, "the second attempt knew why: {t}");
    // The prompt of the second attempt, as the agent got it.
    let state: serde_json::Value =
        serde_json::from_slice(&std::fs::read(repo.path.join(".zerg/state/tok.json")).unwrap())
            .unwrap();
    let note = state["tasks"]["R-L1-001"]["previous_attempt"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        note.starts_with("Attempt 1 failed: verification_failed: tier")
            && note.contains("token.txt lacks TOKEN-7f3a"),
        "{note}"
    );
    assert_eq!(
        std::fs::read_to_string(repo.path.join(".zerg/logs/tasks/R-L1-001/agent-output.txt"))
            .map(|_| ())
            .ok(),
        Some(())
    );
}

#[test]
fn attempt_two_runs_with_the_second_model_and_status_names_each_attempts_model() {
    let repo = TestRepo::new();
    let log = repo.path.parent().unwrap().join("fake-claude.log");
    let d = Daemon::builder()
        .env("FAKE_CLAUDE_LOG", log.to_string_lossy().to_string())
        .start();
    let st = token_rush(
        &d,
        &repo,
        Config::fake_agent()
            .fast_workers()
            .set("agent.models", ["claude-small", "claude-large"]),
    );
    assert_eq!(st["state"], "complete", "{st}");
    let t = &st["tasks"]["R-L1-001"];
    assert_eq!(
        t["attempt_models"],
        json!(["claude-small", "claude-large"]),
        "{t}"
    );
    let runs: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(runs.len(), 2, "{runs:?}");
    for (run, model) in runs.iter().zip(["claude-small", "claude-large"]) {
        let argv: Vec<&str> = run["argv"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let at = argv
            .iter()
            .position(|a| *a == "--model")
            .expect("--model passed");
        assert_eq!(argv[at + 1], model, "{argv:?}");
    }
    // The second attempt's prompt carried the first one's failure.
    assert!(
        runs[1]["prompt"]
            .as_str()
            .unwrap()
            .contains("## Previous attempt"),
        "{}",
        runs[1]["prompt"]
    );
}

#[test]
fn what_only_verification_leaves_in_the_worktree_never_reaches_staging() {
    let repo = TestRepo::new();
    let d = Daemon::start();
    // The check writes a log, a `__pycache__` the repository does not ignore, and appends to
    // a tracked file the agent never touched; the agent writes its own file.
    std::fs::write(repo.path.join("NOTES.md"), "notes\n").unwrap();
    git(&repo.path, &["add", "NOTES.md"]);
    git(&repo.path, &["commit", "-qm", "notes"]);
    let check = "test -f out.txt && echo ran > verify.log && mkdir -p __pycache__ && echo pyc > __pycache__/m.cpython-312.pyc && echo more >> NOTES.md";
    let graph = json!({"feature": "bp", "version": "2.0", "tasks": [{
        "id": "B-L1-001", "title": "Write out.txt", "level": 1, "dependencies": [],
        "description": "Write out.txt",
        "files": {"create": ["out.txt"], "modify": [], "read": []},
        "verification": {"command": check, "timeout_seconds": 30}
    }]});
    repo.write_graph("bp", &graph.to_string());
    repo.write_script(
        "bp",
        &json!({"default": [{"op": "write", "path": "out.txt", "content": "the agent's work\n"}]}),
    );
    repo.configure(&Config::fake_agent().fast_workers());
    assert!(
        d.ctl_in(&repo.path, &["rush", "bp", "--workers", "1"])
            .status
            .success()
    );
    let st = d.wait_end(&repo.path, "bp", T);
    assert_eq!(st["state"], "complete", "{st}");
    let files = git(
        &repo.path,
        &["ls-tree", "-r", "--name-only", "zerg/bp/staging"],
    );
    assert!(files.lines().any(|f| f == "out.txt"), "{files}");
    for byproduct in ["verify.log", "__pycache__/m.cpython-312.pyc"] {
        assert!(
            !files.lines().any(|f| f == byproduct),
            "{byproduct} on staging:\n{files}"
        );
    }
    assert_eq!(
        git(&repo.path, &["show", "zerg/bp/staging:NOTES.md"]),
        "notes",
        "a tracked file only the check changed stays as it was"
    );
}

/// One task whose check wants a word that only the user's note holds (`NOTE` is spelled in
/// base64, so the check's own text in the prompt does not give it away), and an agent that
/// writes every `NOTE-` word of its prompt into the file.
fn note_rush(d: &Daemon, repo: &TestRepo, script: serde_json::Value, config: Config) {
    let check = r#"grep -q "$(printf Tk9URQ== | base64 -d)-b51e" note.txt || { echo "note.txt lacks the user's word"; exit 1; }"#;
    let graph = json!({"feature": "nt", "version": "2.0", "tasks": [{
        "id": "N-L1-001", "title": "Write the user's word", "level": 1, "dependencies": [],
        "description": "Write into note.txt the word the user gives",
        "files": {"create": ["note.txt"], "modify": [], "read": []},
        "verification": {"command": check, "timeout_seconds": 30}
    }]});
    repo.write_graph("nt", &graph.to_string());
    repo.write_script("nt", &json!({ "tasks": { "N-L1-001": script } }));
    repo.configure(&config);
    assert!(
        d.ctl_in(&repo.path, &["rush", "nt", "--workers", "1", "--detach"])
            .status
            .success()
    );
}

#[test]
fn a_note_with_restart_stops_the_hung_attempt_uncounted_and_the_next_prompt_carries_it() {
    let repo = TestRepo::new();
    let d = Daemon::start();
    let write = json!({"op": "echo_prompt_words", "prefix": "NOTE-", "path": "note.txt"});
    note_rush(
        &d,
        &repo,
        json!({"attempts": [[{"op": "hang"}], [write]]}),
        // The watchdog must not end the hung attempt first.
        Config::fake_agent()
            .fast_workers()
            .set("workers.task_stale_timeout_seconds", 600),
    );
    d.wait_for(&repo.path, "nt", T, "the task to run", |s| {
        s["tasks"]["N-L1-001"]["status"] == "in_progress"
    });
    let out = d.ctl_in(
        &repo.path,
        &[
            "note",
            "nt",
            "N-L1-001",
            "Write NOTE-b51e into note.txt",
            "--restart",
        ],
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("running attempt stopped"), "{said}");
    let st = d.wait_end(&repo.path, "nt", T);
    assert_eq!(st["state"], "complete", "{st}");
    let t = &st["tasks"]["N-L1-001"];
    assert_eq!(t["attempts"], 1, "the stopped attempt is not counted: {t}");
    assert_eq!(t["crashes"], 0, "{t}");
    assert_eq!(t["notes"], json!(["Write NOTE-b51e into note.txt"]), "{t}");
    assert_eq!(
        git(&repo.path, &["show", "zerg/nt/staging:note.txt"]),
        "NOTE-b51e"
    );
}

#[test]
fn retry_with_a_note_reaches_the_failed_tasks_next_prompt() {
    let repo = TestRepo::new();
    let d = Daemon::start();
    let write = json!([{"op": "echo_prompt_words", "prefix": "NOTE-", "path": "note.txt"}]);
    note_rush(
        &d,
        &repo,
        write,
        Config::fake_agent()
            .fast_workers()
            .set("workers.retry_attempts", 0),
    );
    let st = d.wait_end(&repo.path, "nt", T);
    assert_eq!(st["tasks"]["N-L1-001"]["status"], "failed", "{st}");
    // Bad input is refused by name, and nothing changes.
    let bad = d.ctl_in(&repo.path, &["retry", "nt", "--note", "  "]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("note: the note is empty"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let out = d.ctl_in(
        &repo.path,
        &["retry", "nt", "--note", "The word is NOTE-b51e"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = d.wait_end(&repo.path, "nt", T);
    assert_eq!(st["state"], "complete", "{st}");
    assert_eq!(st["tasks"]["N-L1-001"]["attempts"], 2, "{st}");
    assert_eq!(
        git(&repo.path, &["show", "zerg/nt/staging:note.txt"]),
        "NOTE-b51e"
    );
}
