//! `messages-api`: a scripted stand-in for the Anthropic Messages API, for running the real
//! Claude Code CLI in zerg's end-to-end tests (`ANTHROPIC_BASE_URL=http://127.0.0.1:PORT`).
//!
//! It listens on 127.0.0.1 (an ephemeral port), prints `listening 127.0.0.1:PORT` once it
//! accepts connections, and answers `POST /v1/messages` in the streaming (SSE) form:
//! `message_start`, `content_block_start` / `content_block_delta` (`text_delta`,
//! `input_json_delta`) / `content_block_stop`, `message_delta` with the usage, `message_stop`.
//! A request whose first user message is a zerg task prompt (`Task ID: …`) is answered with a
//! Bash `tool_use` that writes the task's owned files; once the request carries the tool's
//! result, with a final text. Anything else gets a short text.
//!
//! `--mode` chooses how it answers while the mode holds:
//! - `ok` (default): as above;
//! - `429`: HTTP 429 `rate_limit_error`, as an API key's limit;
//! - `429-oauth`: HTTP 429 with the `anthropic-ratelimit-unified-*` headers (status rejected,
//!   the reset, representative claim `five_hour`), as a subscription's limit. Claude Code
//!   2.1.327 with `CLAUDE_CODE_OAUTH_TOKEN` needs all three to report a usage limit
//!   (`rate_limit_event` with `resetsAt` and `rateLimitType`, `You've hit your 5-hour limit ·
//!   resets …`); with fewer it prints `Server is temporarily limiting requests (not your usage
//!   limit)` and an event without them;
//! - `529`: HTTP 529 `overloaded_error`.
//!
//! `--until EPOCH_SECONDS` makes the mode hold only until then; `ok` answers after it. That is
//! a usage limit that resets. `--for SECONDS` does the same for SECONDS from the first Messages
//! request, so the window opens when the client gets there, however long it took to start.
//! Every request is logged to stderr as one line.
//!
//! Each file a task creates gets the task's id and every `TOKEN-…` word of its prompt, so a
//! verification can ask for a token that only a failed attempt's output names. `--record FILE`
//! appends each task's first request, as the API got it, to FILE as a JSON line
//! (`{"task": …, "prompt": …}`).

use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use zerg_tests::http1::read_request;

/// How the stand-in answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Ok,
    RateLimited,
    RateLimitedOauth,
    Overloaded,
}

struct Server {
    mode: Mode,
    until: Option<u64>,
    /// `--for`: how long the mode holds from the first Messages request.
    hold_for: Option<u64>,
    /// When a `--for` hold ends, once the first Messages request has set it.
    hold_end: OnceLock<u64>,
    next_id: AtomicU64,
    /// `--record`: where each task's first request is appended.
    record: Option<std::path::PathBuf>,
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn main() -> ExitCode {
    let mut mode = Mode::Ok;
    let mut until = None;
    let mut hold_for = None;
    let mut record = None;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        match (args[i].as_str(), args.get(i + 1).map(String::as_str)) {
            ("--mode", Some(m)) => {
                mode = match m {
                    "ok" => Mode::Ok,
                    "429" => Mode::RateLimited,
                    "429-oauth" => Mode::RateLimitedOauth,
                    "529" => Mode::Overloaded,
                    other => {
                        eprintln!("messages-api: unknown mode {other:?}");
                        return ExitCode::from(2);
                    }
                };
                i += 2;
            }
            ("--until", Some(t)) => {
                let Ok(t) = t.parse::<u64>() else {
                    eprintln!("messages-api: --until takes epoch seconds, not {t:?}");
                    return ExitCode::from(2);
                };
                until = Some(t);
                i += 2;
            }
            ("--for", Some(t)) => {
                let Ok(t) = t.parse::<u64>() else {
                    eprintln!("messages-api: --for takes seconds, not {t:?}");
                    return ExitCode::from(2);
                };
                hold_for = Some(t);
                i += 2;
            }
            ("--record", Some(f)) => {
                record = Some(std::path::PathBuf::from(f));
                i += 2;
            }
            (other, _) => {
                eprintln!("messages-api: unknown argument {other:?}");
                return ExitCode::from(2);
            }
        }
    }
    let listener = match TcpListener::bind("127.0.0.1:0") {
        Ok(l) => l,
        Err(e) => {
            eprintln!("messages-api: cannot listen: {e}");
            return ExitCode::from(1);
        }
    };
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    println!("listening 127.0.0.1:{port}");
    let _ = std::io::stdout().flush();
    let server = Arc::new(Server {
        mode,
        until,
        hold_for,
        hold_end: OnceLock::new(),
        next_id: AtomicU64::new(1),
        record,
    });
    for stream in listener.incoming().flatten() {
        let server = server.clone();
        std::thread::spawn(move || {
            if let Err(e) = server.serve(stream) {
                eprintln!("messages-api: connection: {e}");
            }
        });
    }
    ExitCode::SUCCESS
}

impl Server {
    fn serve(&self, stream: TcpStream) -> std::io::Result<()> {
        let mut w = stream.try_clone()?;
        let mut r = BufReader::new(stream);
        let Some(req) = read_request(&mut r)? else {
            return Ok(());
        };
        let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let messages = req.method == "POST" && req.target.starts_with("/v1/messages");
        let until = match self.hold_for {
            Some(secs) if messages => Some(*self.hold_end.get_or_init(|| now_s() + secs)),
            Some(_) => self.hold_end.get().copied(),
            None => self.until,
        };
        let mode = match until {
            Some(t) if now_s() >= t => Mode::Ok,
            _ => self.mode,
        };
        eprintln!(
            "messages-api: {} {} mode {mode:?} stream {}",
            req.method, req.target, body["stream"]
        );
        if req.method != "POST" || !req.target.starts_with("/v1/messages") {
            return respond(
                &mut w,
                404,
                &[],
                &json!({"type": "error", "error": {"type": "not_found_error", "message": "not here"}}),
            );
        }
        if req.target.starts_with("/v1/messages/count_tokens") {
            return respond(&mut w, 200, &[], &json!({"input_tokens": 1000}));
        }
        let reset = until.unwrap_or_else(|| now_s() + 3600);
        match mode {
            Mode::RateLimited => respond(
                &mut w,
                429,
                &[("retry-after", "3600".to_string())],
                &json!({"type": "error", "error": {"type": "rate_limit_error", "message": "This request would exceed your account's rate limit. Please try again later."}}),
            ),
            Mode::RateLimitedOauth => respond(
                &mut w,
                429,
                &[
                    ("anthropic-ratelimit-unified-status", "rejected".to_string()),
                    ("anthropic-ratelimit-unified-reset", reset.to_string()),
                    (
                        "anthropic-ratelimit-unified-representative-claim",
                        "five_hour".to_string(),
                    ),
                ],
                &json!({"type": "error", "error": {"type": "rate_limit_error", "message": "Rate limited"}}),
            ),
            Mode::Overloaded => respond(
                &mut w,
                529,
                &[],
                &json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
            ),
            Mode::Ok => self.answer(&mut w, &body),
        }
    }

    /// A model turn: the task's Bash tool use, or a final text.
    fn answer(&self, w: &mut TcpStream, body: &Value) -> std::io::Result<()> {
        let model = body["model"]
            .as_str()
            .unwrap_or("claude-opus-5-5")
            .to_string();
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let prompt = messages
            .first()
            .map(|m| text_of(&m["content"]))
            .unwrap_or_default();
        let answered = messages.iter().any(|m| {
            m["content"]
                .as_array()
                .is_some_and(|c| c.iter().any(|b| b["type"] == "tool_result"))
        });
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let id = format!("msg_{n:05}");
        let mut blocks: Vec<Value> = Vec::new();
        let stop = match task_id(&prompt) {
            Some(task) if !answered => {
                if let Some(file) = &self.record {
                    let line = format!("{}\n", json!({"task": task, "prompt": prompt}));
                    let appended = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(file)
                        .and_then(|mut f| f.write_all(line.as_bytes()));
                    if let Err(e) = appended {
                        eprintln!("messages-api: cannot record to {}: {e}", file.display());
                    }
                }
                blocks.push(json!({"type": "text", "text": format!("Working on {task}.")}));
                let command = write_files_command(&task, &prompt);
                blocks.push(json!({
                    "type": "tool_use", "id": format!("toolu_{n:05}"), "name": "Bash",
                    "input": {"command": command, "description": format!("write the files of {task}")}
                }));
                "tool_use"
            }
            _ => {
                blocks.push(json!({"type": "text", "text": "done"}));
                "end_turn"
            }
        };
        if body["stream"] != true {
            let msg = json!({
                "id": id, "type": "message", "role": "assistant", "model": model,
                "content": blocks, "stop_reason": stop, "stop_sequence": null,
                "usage": {"input_tokens": 1000, "output_tokens": 200, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
            });
            return respond(w, 200, &[], &msg);
        }
        let mut out = String::from(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nrequest-id: req_fake\r\nconnection: close\r\n\r\n",
        );
        let mut ev = |name: &str, data: Value| {
            out.push_str(&format!("event: {name}\ndata: {data}\n\n"));
        };
        ev(
            "message_start",
            json!({"type": "message_start", "message": {
                "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": 1000, "output_tokens": 1, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
            }}),
        );
        for (i, b) in blocks.iter().enumerate() {
            if b["type"] == "text" {
                ev(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": i, "content_block": {"type": "text", "text": ""}}),
                );
                ev(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": b["text"]}}),
                );
            } else {
                ev(
                    "content_block_start",
                    json!({"type": "content_block_start", "index": i, "content_block": {"type": "tool_use", "id": b["id"], "name": b["name"], "input": {}}}),
                );
                ev(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": b["input"].to_string()}}),
                );
            }
            ev(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": i}),
            );
        }
        ev(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": 200}}),
        );
        ev("message_stop", json!({"type": "message_stop"}));
        w.write_all(out.as_bytes())?;
        w.flush()
    }
}

fn respond(
    w: &mut TcpStream,
    status: u16,
    headers: &[(&str, String)],
    body: &Value,
) -> std::io::Result<()> {
    let text = body.to_string();
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        429 => "Too Many Requests",
        _ => "Overloaded",
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nrequest-id: req_fake\r\nconnection: close\r\n",
        text.len()
    );
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    out.push_str(&text);
    w.write_all(out.as_bytes())?;
    w.flush()
}

/// The text of a message's content (a string, or text blocks).
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// `Task ID: <id>` of a zerg prompt.
fn task_id(prompt: &str) -> Option<String> {
    let rest = &prompt[prompt.find("Task ID:")? + "Task ID:".len()..];
    let id: String = rest
        .trim_start_matches(['*', '`', ' ', '\t'])
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != '`' && *c != '*')
        .collect();
    (!id.is_empty()).then_some(id)
}

/// A shell command that creates the files the prompt's `## Files` section names as created
/// and appends to the ones it names as modified.
fn write_files_command(task: &str, prompt: &str) -> String {
    let (create, modify) = zerg_tests::owned_files(prompt);
    // The prompt's `TOKEN-` words, shell-safe, for the files it creates.
    let mut tokens: Vec<&str> = prompt
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| w.starts_with("TOKEN-") && w.len() > "TOKEN-".len())
        .collect();
    tokens.dedup();
    let tokens: String = tokens.iter().map(|t| format!(" {t}")).collect();
    let mut cmds = Vec::new();
    let files = create
        .iter()
        .map(|p| (">", p))
        .chain(modify.iter().map(|p| (">>", p)));
    for (op, p) in files {
        // Quoted in single quotes below: a name holding one is left alone.
        if p.contains('\'') {
            continue;
        }
        let dir = std::path::Path::new(p)
            .parent()
            .map(|d| d.to_string_lossy().to_string())
            .filter(|d| !d.is_empty())
            .unwrap_or_else(|| ".".into());
        let words = if op == ">" { tokens.as_str() } else { "" };
        cmds.push(format!("mkdir -p '{dir}' && echo {task}{words} {op} '{p}'"));
    }
    if cmds.is_empty() {
        cmds.push("true".into());
    }
    cmds.join(" && ")
}
