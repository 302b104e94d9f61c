//! `fake-claude`: a scriptable stand-in for the `claude` CLI, used by zerg's end-to-end tests.
//!
//! It accepts the real CLI's flags, takes the prompt as the last argument (or from stdin), and
//! behaves according to the JSON script named by `FAKE_CLAUDE_SCRIPT` (or `$ZERG_SPEC_DIR/fake-claude.json`): per task id (from
//! `ZERG_TASK_ID`, else `Task ID: <id>` in the prompt) and per attempt it runs a list of ops
//! such as writing the task's owned files, printing, sleeping, hanging, crashing, reporting a
//! usage limit (in the forms Claude Code prints today: the `rate_limit_event` with `resetsAt` in
//! seconds or milliseconds, spliced into another line, the `You've hit your … limit` text, an
//! API key's 429, and the legacy line), printing an `allowed_warning`, replaying a recorded
//! run of the real CLI, or writing escalation/checkpoint handoff files into `ZERG_TASK_DIR`.
//!
//! Without a script every task runs `[{"op":"write_owned"}]`; a spec directory that cannot be
//! read (no `task-graph.json` in `ZERG_SPEC_DIR`) is an error, not a reason to run the default.
//! `wait_for_file` fails when its file does not appear in time. Attempts are counted in
//! `<state dir>/<task-id>.count`. If `FAKE_CLAUDE_LOG` is set, one JSON line per invocation is
//! appended to it.

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use serde_json::{Value, json};

/// Version string printed for `--version`.
const VERSION: &str = "1.0.0 (Fake Claude Code)";

/// Exit code for errors of fake-claude itself (bad script, unknown op, I/O failure).
const EXIT_INTERNAL: i32 = 2;

/// Flags of the real CLI that take no value.
const BOOL_FLAGS: &[&str] = &[
    "-p",
    "--print",
    "--dangerously-skip-permissions",
    "--verbose",
    "-c",
    "--continue",
    "--version",
    "-v",
    "-d",
    "--debug",
    "--include-partial-messages",
    "--replay-user-messages",
    "--strict-mcp-config",
    "--ide",
];

/// Flags of the real CLI that take exactly one value.
const VALUE_FLAGS: &[&str] = &[
    "--output-format",
    "--input-format",
    "--model",
    "--fallback-model",
    "-r",
    "--resume",
    "--session-id",
    "--allowedTools",
    "--allowed-tools",
    "--disallowedTools",
    "--disallowed-tools",
    "--max-turns",
    "--append-system-prompt",
    "--system-prompt",
    "--permission-mode",
    "--permission-prompt-tool",
    "--add-dir",
    "--settings",
    "--setting-sources",
    "--mcp-config",
    "--agents",
];

/// Output format selected with `--output-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OutputFormat {
    Text,
    Json,
    StreamJson,
}

/// What the command line asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Args {
    output_format: OutputFormat,
    version: bool,
    session_id: Option<String>,
    prompt: Option<String>,
}

/// Parses the arguments (without the program name). The prompt is the last argument when it is
/// not a flag nor the value of a known value-taking flag.
fn parse_args(args: &[String]) -> Args {
    let mut parsed = Args {
        output_format: OutputFormat::Text,
        version: false,
        session_id: None,
        prompt: None,
    };
    let mut positional: Vec<&str> = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = args[i].as_str();
        if arg == "--" {
            positional.extend(args[i + 1..].iter().map(String::as_str));
            break;
        }
        if !arg.starts_with('-') || arg == "-" {
            positional.push(arg);
            i += 1;
            continue;
        }
        let (name, inline_value) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v)),
            _ => (arg, None),
        };
        let value: Option<&str> = if inline_value.is_some() {
            inline_value
        } else if VALUE_FLAGS.contains(&name) {
            i += 1;
            args.get(i).map(String::as_str)
        } else if BOOL_FLAGS.contains(&name) {
            None
        } else {
            // Unknown flag: swallow a following non-flag value, but never the last argument.
            match args.get(i + 1) {
                Some(next) if !next.starts_with('-') && i + 2 < args.len() => {
                    i += 1;
                    Some(next.as_str())
                }
                _ => None,
            }
        };
        match name {
            "--version" | "-v" => parsed.version = true,
            "--output-format" => {
                parsed.output_format = match value {
                    Some("json") => OutputFormat::Json,
                    Some("stream-json") => OutputFormat::StreamJson,
                    _ => OutputFormat::Text,
                }
            }
            "--session-id" | "--resume" | "-r" => {
                if let Some(v) = value {
                    parsed.session_id = Some(v.to_string());
                }
            }
            _ => {}
        }
        i += 1;
    }
    parsed.prompt = positional.last().map(|s| s.to_string());
    parsed
}

/// Finds `Task ID: <id>` in the prompt (tolerating markdown emphasis and backticks).
fn task_id_from_prompt(prompt: &str) -> Option<String> {
    let idx = prompt.find("Task ID:")?;
    let rest = &prompt[idx + "Task ID:".len()..];
    let rest = rest.trim_start_matches(['*', '`', ' ', '\t']);
    let id: String = rest
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != '`' && *c != '*')
        .collect();
    (!id.is_empty()).then_some(id)
}

/// Files a task owns, from the prompt's `## Files` section.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct OwnedFiles {
    create: Vec<String>,
    modify: Vec<String>,
}

/// Parses the `## Files` section: `Create: a, b` and `Modify: c, d` lines up to the next heading.
fn parse_files_section(prompt: &str) -> OwnedFiles {
    let mut files = OwnedFiles::default();
    let mut in_section = false;
    for line in prompt.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') {
            in_section =
                trimmed.trim_start_matches('#').trim() == "Files" && trimmed.starts_with("## ");
            continue;
        }
        if !in_section {
            continue;
        }
        let item = trimmed
            .trim_start_matches(['-', '*'])
            .trim_start()
            .trim_start_matches("**");
        let (target, list) = if let Some(rest) = item.strip_prefix("Create:") {
            (&mut files.create, rest)
        } else if let Some(rest) = item.strip_prefix("Modify:") {
            (&mut files.modify, rest)
        } else {
            continue;
        };
        let list = list.trim_start_matches("**");
        for path in list.split(',') {
            let path = path.trim().trim_matches('`');
            if !path.is_empty() && path != "none" && path != "(none)" {
                target.push(path.to_string());
            }
        }
    }
    files
}

/// One scripted action.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Op {
    WriteOwned,
    Write {
        path: String,
        content: String,
    },
    Append {
        path: String,
        content: String,
    },
    Print {
        text: String,
    },
    Stderr {
        text: String,
    },
    SleepMs {
        ms: u64,
    },
    Tick {
        count: u64,
        interval_ms: u64,
    },
    Hang,
    Exit {
        code: i32,
    },
    Crash,
    /// Reports a usage limit that resets in `reset_in_secs`, in one of the forms Claude Code
    /// prints (see [`LimitForm`]), and exits 1.
    RateLimit {
        reset_in_secs: i64,
        #[serde(default)]
        form: LimitForm,
    },
    /// Prints a `rate_limit_event` with `status: "allowed_warning"` (stream-json only).
    UsageWarning,
    /// Prints the lines of a recorded run of Claude Code 2.1.327 (`tool`, `nologin`, `nonet`,
    /// `rl`, `rl-oauth`: tests/fixtures/claude-code-2.1.327/).
    Recorded {
        name: String,
    },
    Escalate {
        category: String,
        message: String,
    },
    Checkpoint {
        progress_pct: u32,
        next_action: String,
    },
    Touch {
        path: String,
    },
    WaitForFile {
        path: String,
        timeout_ms: u64,
    },
    StreamJson,
    /// Runs `sh -c <command>` and waits for it (for example a child that ignores SIGTERM).
    Shell {
        command: String,
    },
    /// Writes to `path` every word of the prompt that starts with `prefix`, one per line (an
    /// agent that acts on what its prompt says, such as a retry's failure text).
    EchoPromptWords {
        prefix: String,
        path: String,
    },
}

/// How [`Op::RateLimit`] reports the limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum LimitForm {
    /// As Claude Code 2.1.327 with a subscription: in stream-json a `rate_limit_event`
    /// (`resetsAt` in epoch seconds, `five_hour`), an `assistant` error message and a failed
    /// `result`; in text mode the legacy line (the text form has only minutes, see `Text`).
    #[default]
    Auto,
    /// The `rate_limit_event` with `resetsAt` in epoch milliseconds.
    EventMs,
    /// The event spliced into the middle of the `assistant` line (seen in Claude Code 2.1.74).
    Spliced,
    /// `You've hit your 5-hour limit · resets <h:mm>pm (UTC)`, the reset rounded up to the
    /// minute.
    Text,
    /// An API key's 429: `API Error: Request rejected (429) · …`, no reset stated.
    ApiKey,
    /// `Claude AI usage limit reached|<epoch>`, which Claude Code no longer prints.
    Legacy,
}

/// A recorded run of Claude Code 2.1.327.
fn recorded(name: &str) -> Option<&'static str> {
    Some(match name {
        "tool" => include_str!("../../../fixtures/claude-code-2.1.327/tool.jsonl"),
        "nologin" => include_str!("../../../fixtures/claude-code-2.1.327/nologin.jsonl"),
        "nonet" => include_str!("../../../fixtures/claude-code-2.1.327/nonet.jsonl"),
        "rl" => include_str!("../../../fixtures/claude-code-2.1.327/rl.jsonl"),
        "rl-oauth" => include_str!("../../../fixtures/claude-code-2.1.327/rl-oauth.jsonl"),
        _ => return None,
    })
}

/// `You've hit your 5-hour limit · resets 8:22pm (UTC)` for the minute at or after `epoch`.
fn limit_text(epoch: i64) -> String {
    let minutes = (epoch + 59).div_euclid(60);
    let (h, m) = ((minutes / 60).rem_euclid(24), minutes.rem_euclid(60));
    let (h12, ampm) = match h {
        0 => (12, "am"),
        1..=11 => (h, "am"),
        12 => (12, "pm"),
        _ => (h - 12, "pm"),
    };
    format!("You've hit your 5-hour limit · resets {h12}:{m:02}{ampm} (UTC)")
}

/// The ops of one task: the same for every attempt, or one list per attempt. Ops are kept as raw
/// JSON and only decoded when selected, so a bad op breaks only the task that uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum TaskOps {
    Same(Vec<Value>),
    Attempts(Vec<Vec<Value>>),
}

/// A parsed `FAKE_CLAUDE_SCRIPT`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Script {
    /// `None` means the built-in default, `[{"op":"write_owned"}]`.
    default: Option<Vec<Value>>,
    tasks: BTreeMap<String, TaskOps>,
}

impl Script {
    /// The ops to run for `task_id` on attempt `attempt` (1-based); the last attempt repeats.
    /// Fails (naming the location) if one of them is unknown or malformed.
    fn ops_for(&self, task_id: &str, attempt: u64) -> Result<Vec<Op>, String> {
        let (raw, at): (&[Value], String) = match self.tasks.get(task_id) {
            None => match &self.default {
                None => return Ok(vec![Op::WriteOwned]),
                Some(ops) => (ops, "default".to_string()),
            },
            Some(TaskOps::Same(ops)) => (ops, format!("tasks.{task_id}")),
            Some(TaskOps::Attempts(attempts)) => {
                let idx = usize::try_from(attempt.max(1) - 1)
                    .unwrap_or(usize::MAX)
                    .min(attempts.len().saturating_sub(1));
                let ops = attempts.get(idx).map_or(&[][..], Vec::as_slice);
                (ops, format!("tasks.{task_id}.attempts[{idx}]"))
            }
        };
        raw.iter()
            .enumerate()
            .map(|(i, op)| {
                Op::deserialize(op)
                    .map_err(|e| format!("{at}[{i}]: unknown or invalid op {op}: {e}"))
            })
            .collect()
    }
}

fn parse_ops(value: &Value, at: &str) -> Result<Vec<Value>, String> {
    let items = value
        .as_array()
        .ok_or_else(|| format!("{at}: expected an array of ops"))?;
    for (i, op) in items.iter().enumerate() {
        if op.get("op").and_then(Value::as_str).is_none() {
            return Err(format!(
                "{at}[{i}]: expected an object with a string \"op\" field"
            ));
        }
    }
    Ok(items.clone())
}

/// Parses script text; errors name the offending location.
fn parse_script(text: &str) -> Result<Script, String> {
    let root: Value = serde_json::from_str(text).map_err(|e| format!("invalid JSON: {e}"))?;
    let obj = root
        .as_object()
        .ok_or_else(|| "top level must be an object".to_string())?;
    let mut script = Script {
        default: None,
        tasks: BTreeMap::new(),
    };
    for (key, value) in obj {
        match key.as_str() {
            "default" => script.default = Some(parse_ops(value, "default")?),
            "tasks" => {
                let tasks = value
                    .as_object()
                    .ok_or_else(|| "tasks: expected an object".to_string())?;
                for (task, spec) in tasks {
                    let at = format!("tasks.{task}");
                    let ops = if spec.is_array() {
                        TaskOps::Same(parse_ops(spec, &at)?)
                    } else if let Some(attempts) = spec.get("attempts") {
                        let list = attempts
                            .as_array()
                            .ok_or_else(|| format!("{at}.attempts: expected an array"))?;
                        if list.is_empty() {
                            return Err(format!("{at}.attempts: must not be empty"));
                        }
                        let parsed = list
                            .iter()
                            .enumerate()
                            .map(|(i, ops)| parse_ops(ops, &format!("{at}.attempts[{i}]")))
                            .collect::<Result<Vec<_>, _>>()?;
                        TaskOps::Attempts(parsed)
                    } else {
                        return Err(format!(
                            "{at}: expected an array of ops or {{\"attempts\": [[ops], ...]}}"
                        ));
                    };
                    script.tasks.insert(task.clone(), ops);
                }
            }
            k if k.starts_with('_') => {}
            k => return Err(format!("unknown top-level key {k:?}")),
        }
    }
    Ok(script)
}

/// The line the real CLI prints when the usage limit is hit.
fn rate_limit_message(reset_epoch: i64) -> String {
    format!("Claude AI usage limit reached|{reset_epoch}")
}

/// Makes a task id safe to use as a file name.
fn sanitize(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn now_epoch() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Prints an error and exits with the internal-error code.
fn fail(msg: impl std::fmt::Display) -> ! {
    let _ = std::io::stdout().flush();
    eprintln!("fake-claude: {msg}");
    std::process::exit(EXIT_INTERNAL);
}

/// Writes one line to stdout and flushes; a closed pipe is ignored.
fn out(line: &str) {
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}");
    let _ = stdout.flush();
}

fn exit_now(code: i32) -> ! {
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    std::process::exit(code);
}

fn ensure_parent(path: &Path) {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty())
        && let Err(e) = fs::create_dir_all(parent)
    {
        fail(format!("cannot create {}: {e}", parent.display()));
    }
}

fn write_file(path: &Path, content: &str) {
    ensure_parent(path);
    if let Err(e) = fs::write(path, content) {
        fail(format!("cannot write {}: {e}", path.display()));
    }
}

fn append_file(path: &Path, content: &str) {
    ensure_parent(path);
    let res = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(content.as_bytes()));
    if let Err(e) = res {
        fail(format!("cannot append to {}: {e}", path.display()));
    }
}

/// Writes a JSON file atomically (temp file + rename), so pollers never see a partial file.
fn write_json_atomic(path: &Path, value: &Value) {
    ensure_parent(path);
    let tmp = path.with_extension(format!("json.tmp.{}", std::process::id()));
    write_file(&tmp, &format!("{value}\n"));
    if let Err(e) = fs::rename(&tmp, path) {
        fail(format!("cannot rename to {}: {e}", path.display()));
    }
}

/// Runtime context shared by the ops.
struct Ctx {
    task_id: String,
    prompt: String,
    cwd: PathBuf,
    format: OutputFormat,
    session_id: String,
    started: Instant,
    stream_json_done: bool,
}

impl Ctx {
    fn resolve(&self, path: &str) -> PathBuf {
        self.cwd.join(path)
    }

    fn task_dir(&self) -> PathBuf {
        match std::env::var_os("ZERG_TASK_DIR") {
            Some(dir) if !dir.is_empty() => self.cwd.join(dir),
            _ => fail("ZERG_TASK_DIR is not set"),
        }
    }

    fn result_event(&self, is_error: bool, result: &str) -> Value {
        let elapsed = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        // A fixed, recognisable cost and usage per run, so tests can check they are accounted;
        // a failed API call costs nothing, as with the real CLI.
        let (cost, input, output, cached) = if is_error {
            (0.0, 0, 0, 0)
        } else {
            (0.01, 1000, 100, 500)
        };
        let mut v = json!({
            "type": "result",
            "subtype": "success",
            "is_error": is_error,
            "duration_ms": elapsed,
            "duration_api_ms": 0,
            "num_turns": 1,
            "result": result,
            "session_id": self.session_id,
            "total_cost_usd": cost,
            "usage": {"input_tokens": input, "output_tokens": output, "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached},
            "modelUsage": {},
            "api_error_status": null,
        });
        if !is_error {
            v["modelUsage"] = json!({"fake": {"inputTokens": input, "outputTokens": output, "cacheReadInputTokens": cached, "cacheCreationInputTokens": 0, "costUSD": cost}});
        }
        v
    }

    /// The synthetic `assistant` message of an API error.
    fn error_message(&self, error: &str, text: &str) -> Value {
        json!({
            "type": "assistant",
            "message": {
                "id": make_session_id(), "type": "message", "role": "assistant", "model": "<synthetic>",
                "content": [{"type": "text", "text": text}],
                "usage": {"input_tokens": 0, "output_tokens": 0}
            },
            "session_id": self.session_id,
            "error": error,
            "is_api_error_message": true,
        })
    }

    fn rate_limit(&self, reset_epoch: i64, form: LimitForm) -> ! {
        // Written out, to keep the real CLI's key order (`type` first).
        let event = |resets_at: i64| {
            format!(
                r#"{{"type":"rate_limit_event","rate_limit_info":{{"status":"rejected","resetsAt":{resets_at},"rateLimitType":"five_hour","isUsingOverage":false}},"session_id":"{}"}}"#,
                self.session_id
            )
        };
        let text = match form {
            LimitForm::ApiKey => "API Error: Request rejected (429) · This request would exceed your account's rate limit. Please try again later.".to_string(),
            LimitForm::Legacy => rate_limit_message(reset_epoch),
            LimitForm::Auto if self.format == OutputFormat::Text => rate_limit_message(reset_epoch),
            _ => limit_text(reset_epoch),
        };
        if self.format == OutputFormat::Text {
            out(&text);
            exit_now(1);
        }
        let mut result = self.result_event(true, &text);
        if form != LimitForm::Legacy {
            result["api_error_status"] = json!(429);
        }
        match form {
            LimitForm::Auto => out(&event(reset_epoch)),
            LimitForm::EventMs => out(&event(reset_epoch.saturating_mul(1000))),
            _ => {}
        }
        let assistant = self.error_message("rate_limit", &text).to_string();
        if form == LimitForm::Spliced {
            // The event cut into the assistant line, inside its text.
            let at = assistant.find("hit your").unwrap_or(assistant.len() / 2);
            out(&format!(
                "{}{}{}",
                &assistant[..at],
                event(reset_epoch),
                &assistant[at..]
            ));
        } else {
            out(&assistant);
        }
        out(&result.to_string());
        exit_now(1);
    }

    fn run(&mut self, op: &Op) {
        match op {
            Op::WriteOwned => {
                let files = parse_files_section(&self.prompt);
                for path in &files.create {
                    write_file(
                        &self.resolve(path),
                        &format!("created by {}\n", self.task_id),
                    );
                }
                for path in &files.modify {
                    append_file(
                        &self.resolve(path),
                        &format!("modified by {}\n", self.task_id),
                    );
                }
            }
            Op::Write { path, content } => write_file(&self.resolve(path), content),
            Op::Append { path, content } => append_file(&self.resolve(path), content),
            Op::Print { text } => out(text),
            Op::Stderr { text } => {
                let mut stderr = std::io::stderr().lock();
                let _ = writeln!(stderr, "{text}");
                let _ = stderr.flush();
            }
            Op::SleepMs { ms } => sleep(Duration::from_millis(*ms)),
            Op::Tick { count, interval_ms } => {
                for i in 1..=*count {
                    out(&format!("working {i}"));
                    if i < *count {
                        sleep(Duration::from_millis(*interval_ms));
                    }
                }
            }
            Op::Hang => loop {
                sleep(Duration::from_secs(3600));
            },
            Op::Exit { code } => exit_now(*code),
            Op::Crash => {
                let _ = std::io::stdout().flush();
                std::process::abort();
            }
            Op::RateLimit {
                reset_in_secs,
                form,
            } => self.rate_limit(now_epoch().saturating_add(*reset_in_secs), *form),
            Op::UsageWarning => {
                if self.format == OutputFormat::StreamJson {
                    let reset = now_epoch().saturating_add(3600);
                    out(&json!({"type": "rate_limit_event", "rate_limit_info": {
                        "status": "allowed_warning", "resetsAt": reset, "rateLimitType": "seven_day",
                        "utilization": 0.9, "isUsingOverage": false
                    }, "session_id": self.session_id}).to_string());
                }
            }
            Op::Recorded { name } => {
                let Some(text) = recorded(name) else {
                    fail(format!("no recorded run {name:?}"))
                };
                for line in text.lines() {
                    out(line);
                }
                if text.contains("\"type\":\"result\"") {
                    self.stream_json_done = true;
                }
            }
            Op::Escalate { category, message } => {
                let value = json!({
                    "category": category,
                    "message": message,
                    "context": {"attempted": []},
                });
                write_json_atomic(&self.task_dir().join("escalation.json"), &value);
            }
            Op::Checkpoint {
                progress_pct,
                next_action,
            } => {
                let value = json!({"progress_pct": progress_pct, "next_action": next_action});
                write_json_atomic(&self.task_dir().join("checkpoint.json"), &value);
            }
            Op::EchoPromptWords { prefix, path } => {
                let words: Vec<&str> = self
                    .prompt
                    .split(|c: char| c.is_whitespace() || "`'\",.;:()".contains(c))
                    .filter(|w| w.starts_with(prefix.as_str()) && w.len() > prefix.len())
                    .collect();
                let path = self.resolve(path);
                ensure_parent(&path);
                let mut text = words.join("\n");
                text.push('\n');
                if let Err(e) = fs::write(&path, text) {
                    fail(format!("cannot write {}: {e}", path.display()));
                }
            }
            Op::Touch { path } => {
                let path = self.resolve(path);
                ensure_parent(&path);
                if let Err(e) = fs::OpenOptions::new().create(true).append(true).open(&path) {
                    fail(format!("cannot touch {}: {e}", path.display()));
                }
            }
            Op::WaitForFile { path, timeout_ms } => {
                let path = self.resolve(path);
                let deadline = Instant::now() + Duration::from_millis(*timeout_ms);
                while !path.exists() {
                    if Instant::now() >= deadline {
                        fail(format!(
                            "wait_for_file: {} did not appear within {timeout_ms} ms",
                            path.display()
                        ));
                    }
                    sleep(Duration::from_millis(20));
                }
            }
            Op::Shell { command } => {
                let status = std::process::Command::new("sh")
                    .arg("-c")
                    .arg(command)
                    .current_dir(&self.cwd)
                    .status();
                if let Err(e) = status {
                    fail(format!("cannot run sh: {e}"));
                }
            }
            Op::StreamJson => {
                let init = json!({
                    "type": "system",
                    "subtype": "init",
                    "session_id": self.session_id,
                    "model": "fake",
                    "cwd": self.cwd.display().to_string(),
                    "tools": ["Bash", "Edit", "Read", "Write"],
                    "permissionMode": "bypassPermissions",
                    "apiKeySource": "none",
                });
                let assistant = json!({
                    "type": "assistant",
                    "message": {
                        "id": "msg_fake",
                        "type": "message",
                        "role": "assistant",
                        "model": "fake",
                        "content": [{"type": "text", "text": format!("Working on task {}.", self.task_id)}],
                        "usage": {"input_tokens": 1000, "output_tokens": 1},
                    },
                    "session_id": self.session_id,
                });
                out(&init.to_string());
                // As the real CLI does, one message's blocks in several events, its usage
                // repeated.
                out(&assistant.to_string());
                out(&assistant.to_string());
                out(&self.result_event(false, "done").to_string());
                self.stream_json_done = true;
            }
        }
    }
}

/// The script in the rush's spec directory `dir` (`ZERG_SPEC_DIR`): `None` when the spec has
/// none (every task runs the default). A spec directory without its `task-graph.json` (a mount
/// that is missing, an unreadable directory) is an error, never a fall back to the default.
fn spec_script(dir: &Path) -> Result<Option<PathBuf>, String> {
    let graph = dir.join("task-graph.json");
    if let Err(e) = fs::File::open(&graph) {
        return Err(format!(
            "ZERG_SPEC_DIR={} has no readable task-graph.json ({e}): the spec is missing",
            dir.display()
        ));
    }
    let script = dir.join("fake-claude.json");
    match fs::metadata(&script) {
        Ok(_) => Ok(Some(script)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read script {}: {e}", script.display())),
    }
}

/// Directory holding the per-task attempt counters.
fn state_dir(script_path: Option<&Path>) -> PathBuf {
    if let Some(dir) = std::env::var_os("FAKE_CLAUDE_STATE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    // Inside a zerg worker the state dir is writable (the spec dir may be a read-only mount).
    if let Some(dir) = std::env::var_os("ZERG_STATE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("fake-claude-state");
    }
    // Inside zergd's sandbox the state dir is out of sight; the task logs are shared by the
    // rush's workers and writable.
    if let Some(dir) = std::env::var_os("ZERG_LOG_DIR").filter(|d| !d.is_empty()) {
        let tasks = PathBuf::from(dir).join("tasks");
        if tasks.is_dir() {
            return tasks.join(".fake-claude-state");
        }
    }
    if let Some(parent) = script_path.and_then(Path::parent) {
        let parent = if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        };
        return parent.join(".fake-claude-state");
    }
    std::env::temp_dir().join("fake-claude-state")
}

/// Increments and returns the attempt counter of `task_id`.
fn next_attempt(dir: &Path, task_id: &str) -> u64 {
    if let Err(e) = fs::create_dir_all(dir) {
        fail(format!("cannot create state dir {}: {e}", dir.display()));
    }
    let path = dir.join(format!("{}.count", sanitize(task_id)));
    let previous = fs::read_to_string(&path)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let attempt = previous + 1;
    let tmp = dir.join(format!(
        ".{}.count.{}",
        sanitize(task_id),
        std::process::id()
    ));
    if let Err(e) = fs::write(&tmp, format!("{attempt}\n")).and_then(|()| fs::rename(&tmp, &path)) {
        fail(format!("cannot write {}: {e}", path.display()));
    }
    attempt
}

/// A UUID-shaped session id derived from the clock and pid.
fn make_session_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let x = (u128::from(std::process::id()) << 96) | (nanos & ((1u128 << 96) - 1));
    let hex = format!("{x:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

fn log_invocation(
    log: &Path,
    argv: &[String],
    cwd: &Path,
    task_id: &str,
    attempt: u64,
    prompt: &str,
) {
    let env: BTreeMap<String, String> = std::env::vars_os()
        .filter_map(|(k, v)| {
            let k = k.into_string().ok()?;
            k.starts_with("ZERG_")
                .then(|| (k, v.to_string_lossy().into_owned()))
        })
        .collect();
    let line = json!({
        "argv": argv,
        "cwd": cwd.display().to_string(),
        "task_id": task_id,
        "attempt": attempt,
        "env": env,
        "prompt": prompt,
    });
    // One write call in append mode so concurrent invocations do not interleave.
    append_file(log, &format!("{line}\n"));
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let args = parse_args(&argv);
    if args.version {
        out(VERSION);
        return ExitCode::SUCCESS;
    }

    let prompt = match args.prompt.clone() {
        Some(p) => p,
        None => {
            let mut buf = String::new();
            if let Err(e) = std::io::stdin().read_to_string(&mut buf) {
                fail(format!("cannot read prompt from stdin: {e}"));
            }
            buf
        }
    };
    let task_id = std::env::var("ZERG_TASK_ID")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| task_id_from_prompt(&prompt))
        .unwrap_or_else(|| "unknown".to_string());
    let cwd = std::env::current_dir().unwrap_or_else(|e| fail(format!("no cwd: {e}")));

    // `FAKE_CLAUDE_SCRIPT`, else `fake-claude.json` in the rush's spec directory (which zergd
    // mounts into containers too, so tests can drive container workers without extra env).
    let script_path = match std::env::var_os("FAKE_CLAUDE_SCRIPT").filter(|s| !s.is_empty()) {
        Some(p) => Some(PathBuf::from(p)),
        None => std::env::var_os("ZERG_SPEC_DIR")
            .filter(|d| !d.is_empty())
            .and_then(|d| spec_script(Path::new(&d)).unwrap_or_else(|e| fail(e))),
    };
    let attempt = next_attempt(&state_dir(script_path.as_deref()), &task_id);

    if let Some(log) = std::env::var_os("FAKE_CLAUDE_LOG").filter(|s| !s.is_empty()) {
        log_invocation(Path::new(&log), &argv, &cwd, &task_id, attempt, &prompt);
    }

    let ops = match &script_path {
        None => vec![Op::WriteOwned],
        Some(path) => {
            let text = fs::read_to_string(path)
                .unwrap_or_else(|e| fail(format!("cannot read script {}: {e}", path.display())));
            let script = parse_script(&text)
                .unwrap_or_else(|e| fail(format!("invalid script {}: {e}", path.display())));
            script
                .ops_for(&task_id, attempt)
                .unwrap_or_else(|e| fail(format!("script {}: {e}", path.display())))
        }
    };

    let mut ctx = Ctx {
        task_id,
        prompt,
        cwd,
        format: args.output_format,
        session_id: args.session_id.unwrap_or_else(make_session_id),
        started: Instant::now(),
        stream_json_done: false,
    };
    for op in &ops {
        ctx.run(op);
    }

    let summary = format!("done {}", ctx.task_id);
    match ctx.format {
        OutputFormat::Text => out(&summary),
        OutputFormat::Json => out(&ctx.result_event(false, &summary).to_string()),
        OutputFormat::StreamJson => {
            if !ctx.stream_json_done {
                out(&ctx.result_event(false, &summary).to_string());
            }
        }
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests;
