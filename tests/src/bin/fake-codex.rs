//! `fake-codex`: a stand-in for OpenAI's Codex CLI in its non-interactive mode,
//! `codex exec --json [FLAGS] PROMPT`, for the `agent.profile: codex` tests.
//!
//! It writes the files the prompt's `## Files` section names and prints the JSON lines
//! `codex exec --json` prints: `thread.started`, `turn.started`, `item.completed`, and
//! `turn.completed` with its usage (`input_tokens`, `cached_input_tokens`, `output_tokens`).
//! With `FAKE_CODEX_FAIL` set, the turn fails instead (`turn.failed` with that message) and it
//! exits 1.

use std::io::Write;
use std::process::ExitCode;

fn out(v: serde_json::Value) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{v}");
    let _ = o.flush();
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) != Some("exec") || !args.iter().any(|a| a == "--json") {
        eprintln!("fake-codex: only `exec --json … PROMPT` is supported");
        return ExitCode::from(2);
    }
    let prompt = args.last().cloned().unwrap_or_default();
    out(serde_json::json!({"type": "thread.started", "thread_id": "0199-fake"}));
    out(serde_json::json!({"type": "turn.started"}));
    if let Some(msg) = std::env::var_os("FAKE_CODEX_FAIL") {
        out(
            serde_json::json!({"type": "turn.failed", "error": {"message": msg.to_string_lossy()}}),
        );
        return ExitCode::from(1);
    }
    let (create, modify) = zerg_tests::owned_files(&prompt);
    for (p, append) in create
        .iter()
        .map(|p| (p, false))
        .chain(modify.iter().map(|p| (p, true)))
    {
        let path = std::path::Path::new(p);
        if let Some(d) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            let _ = std::fs::create_dir_all(d);
        }
        let res = std::fs::OpenOptions::new()
            .create(true)
            .append(append)
            .write(true)
            .truncate(!append)
            .open(path)
            .and_then(|mut f| f.write_all(b"written by fake-codex\n"));
        if let Err(e) = res {
            eprintln!("fake-codex: cannot write {p}: {e}");
            return ExitCode::from(1);
        }
    }
    out(
        serde_json::json!({"type": "item.completed", "item": {"id": "item_0", "type": "agent_message", "text": "done"}}),
    );
    out(
        serde_json::json!({"type": "turn.completed", "usage": {"input_tokens": 1200, "cached_input_tokens": 200, "output_tokens": 30}}),
    );
    ExitCode::SUCCESS
}
