//! The agent CLI's output, read as it is printed: Claude Code's `--output-format stream-json`
//! events, one JSON object a line, and the plain-text forms of a usage limit that any CLI (or
//! Claude Code in text mode) prints.
//!
//! [`Reader`] takes every output line and keeps what zergd needs of the attempt: the final
//! `result` (success is its `is_error` and `api_error_status`, never its `subtype`), the cost
//! and tokens, a usage limit with its reset time and type, a missing login, an unreachable API,
//! and the CLI's own API retries. A line that is not JSON is only checked for the text forms; a
//! line that does not parse is skipped, and events spliced into one line are each still read.

use std::collections::{BTreeMap, HashSet};

use serde::Deserialize;

/// One stream-json event. Types and fields this reader does not use are ignored.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// `system` events: `init`, `api_retry`, others.
    System(System),
    /// A message of the model (or a synthetic one for an API error).
    Assistant(Assistant),
    /// Tool results sent back to the model.
    User(Ignored),
    /// The last event of a run.
    Result(ResultEvent),
    /// The state of a usage limit.
    RateLimitEvent(RateLimitEvent),
    /// Any other type.
    #[serde(other)]
    Unknown,
}

/// An object whose fields are not used.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Ignored {}

/// `system` events, by `subtype`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(tag = "subtype", rename_all = "snake_case")]
pub enum System {
    /// The session started.
    Init {
        /// The model the session uses.
        #[serde(default)]
        model: Option<String>,
    },
    /// The CLI retries a failed API call itself.
    ApiRetry {
        /// This retry's number, from 1.
        #[serde(default)]
        attempt: u32,
        /// How many it makes at most.
        #[serde(default)]
        max_retries: u32,
        /// The HTTP status of the failure, if there was one.
        #[serde(default)]
        error_status: Option<u16>,
        /// What failed (`overloaded`, `rate_limit`, `unknown`, …).
        #[serde(default)]
        error: Option<String>,
    },
    /// Any other subtype.
    #[serde(other)]
    Other,
}

/// An `assistant` event.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Assistant {
    /// The message.
    pub message: Message,
    /// Set on a synthetic message that reports an API error (`rate_limit`,
    /// `authentication_failed`, `server_error`, …).
    #[serde(default)]
    pub error: Option<String>,
    /// Finer cause of an API error (`connection_failed`, `usage_limit_reached`, …).
    #[serde(default)]
    pub api_error: Option<String>,
    /// The HTTP status of the failed call.
    #[serde(default)]
    pub api_error_status: Option<u16>,
}

/// An assistant message.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Message {
    /// Message id; several events may repeat one message and its usage.
    #[serde(default)]
    pub id: Option<String>,
    /// The model (`<synthetic>` for error messages).
    #[serde(default)]
    pub model: Option<String>,
    /// Content blocks.
    #[serde(default)]
    pub content: Vec<Content>,
    /// Tokens of this message.
    #[serde(default)]
    pub usage: Option<Usage>,
}

/// A content block of a message.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Content {
    /// Text.
    Text {
        /// The text.
        #[serde(default)]
        text: String,
    },
    /// Any other block (tool use, thinking, …).
    #[serde(other)]
    Other,
}

/// Token counts in the Messages API's names.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Usage {
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read_input_tokens: u64,
    /// Input tokens written to the prompt cache.
    pub cache_creation_input_tokens: u64,
}

/// One model's line of the result's `modelUsage`.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq)]
#[serde(default, rename_all = "camelCase")]
pub struct ModelUsageEvent {
    /// Input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Cache reads.
    pub cache_read_input_tokens: u64,
    /// Cache writes.
    pub cache_creation_input_tokens: u64,
    /// Cost of this model's calls (USD).
    #[serde(rename = "costUSD")]
    pub cost_usd: f64,
}

/// The `result` event.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct ResultEvent {
    /// `success`, `error_max_turns`, … (a failed API call arrives as `success` too).
    #[serde(default)]
    pub subtype: Option<String>,
    /// Whether the run failed.
    #[serde(default)]
    pub is_error: bool,
    /// The HTTP status of a failed API call.
    #[serde(default)]
    pub api_error_status: Option<u16>,
    /// Finer cause of an API error.
    #[serde(default)]
    pub api_error: Option<String>,
    /// The final text.
    #[serde(default)]
    pub result: Option<String>,
    /// The cost of this invocation (USD).
    #[serde(default)]
    pub total_cost_usd: Option<f64>,
    /// Tokens of this invocation.
    #[serde(default)]
    pub usage: Option<Usage>,
    /// Tokens and cost per model.
    #[serde(default, rename = "modelUsage")]
    pub model_usage: Option<BTreeMap<String, ModelUsageEvent>>,
}

/// A `rate_limit_event`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct RateLimitEvent {
    /// The limit's state.
    pub rate_limit_info: RateLimitInfo,
}

/// What a `rate_limit_event` says.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct RateLimitInfo {
    /// `allowed`, `allowed_warning` or `rejected`.
    #[serde(default)]
    pub status: String,
    /// When it resets: epoch seconds or milliseconds (both have been seen).
    #[serde(default, rename = "resetsAt")]
    pub resets_at: Option<f64>,
    /// `five_hour`, `seven_day`, …
    #[serde(default, rename = "rateLimitType")]
    pub rate_limit_type: Option<String>,
    /// How much of the limit is used (0..1).
    #[serde(default)]
    pub utilization: Option<f64>,
}

/// Tokens, summed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    /// Input tokens.
    pub input: u64,
    /// Output tokens.
    pub output: u64,
    /// Cache reads.
    pub cache_read: u64,
    /// Cache writes.
    pub cache_creation: u64,
}

impl Tokens {
    fn add(&mut self, u: &Usage) {
        self.input = self.input.saturating_add(u.input_tokens);
        self.output = self.output.saturating_add(u.output_tokens);
        self.cache_read = self.cache_read.saturating_add(u.cache_read_input_tokens);
        self.cache_creation = self
            .cache_creation
            .saturating_add(u.cache_creation_input_tokens);
    }

    fn of(u: &Usage) -> Tokens {
        let mut t = Tokens::default();
        t.add(u);
        t
    }
}

/// One model's tokens and cost.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ModelSpend {
    /// Tokens.
    pub tokens: Tokens,
    /// Cost (USD).
    pub cost_usd: f64,
}

/// A usage limit the CLI reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// When it resets (Unix ms), 0 when the CLI did not say.
    pub reset_ms: i64,
    /// Which limit (`five_hour`, …), empty when not named.
    pub kind: String,
}

/// The final `result` of a run, as far as success goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// `is_error`, or an `api_error_status` of 400 and above.
    pub failed: bool,
    /// The result's text.
    pub text: String,
}

/// What one attempt's output said.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    /// The final `result`, once printed.
    pub verdict: Option<Verdict>,
    /// `total_cost_usd` of the result.
    pub cost_usd: Option<f64>,
    /// Tokens: the result's, or the assistant messages' (each id once) when no result came.
    pub tokens: Tokens,
    /// Per model.
    pub models: BTreeMap<String, ModelSpend>,
    /// A usage limit that stopped the run (or was mentioned: it only counts on a failed run).
    pub limit: Option<Limit>,
    /// A usage limit close to its end (`allowed_warning`).
    pub warning: Option<String>,
    /// The CLI is not logged in.
    pub auth_failed: bool,
    /// The API could not be reached (after the CLI's own retries).
    pub unreachable: bool,
    /// The CLI's latest API retry, as a worker step's detail (`API retry 3/10: overloaded`).
    pub retrying: Option<String>,
}

/// Which agent CLI prints the output, and so how it is read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Profile {
    /// Claude Code's stream-json events, and the text forms of a limit.
    #[default]
    Claude,
    /// `codex exec --json` events (`turn.completed` with its usage, `turn.failed`), and the
    /// text forms of a limit.
    Codex,
    /// Only the text forms of a limit: the exit code decides success.
    Plain,
}

impl Profile {
    /// The profile zergd names (`claude`, `codex`, `plain`); anything else is `claude`.
    pub fn from_name(name: &str) -> Profile {
        match name {
            "codex" => Profile::Codex,
            "plain" => Profile::Plain,
            _ => Profile::Claude,
        }
    }
}

/// One `codex exec --json` event. Types this reader does not use are ignored.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(tag = "type")]
pub enum CodexEvent {
    /// A turn ended; its usage.
    #[serde(rename = "turn.completed")]
    TurnCompleted {
        /// Tokens of the turn.
        #[serde(default)]
        usage: CodexUsage,
    },
    /// A turn failed.
    #[serde(rename = "turn.failed")]
    TurnFailed {
        /// Why.
        #[serde(default)]
        error: CodexError,
    },
    /// An error outside a turn (the stream itself).
    #[serde(rename = "error")]
    Error {
        /// What went wrong.
        #[serde(default)]
        message: String,
    },
    /// Any other type.
    #[serde(other)]
    Unknown,
}

/// A Codex turn's tokens.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct CodexUsage {
    /// Input tokens, cached ones included.
    pub input_tokens: u64,
    /// Input tokens read from the cache.
    pub cached_input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
}

/// A failed Codex turn's error.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct CodexError {
    /// What went wrong.
    pub message: String,
}

/// Reads an agent CLI's output line by line.
#[derive(Debug, Default)]
pub struct Reader {
    profile: Profile,
    report: Report,
    seen_ids: HashSet<String>,
    /// Tokens of the assistant messages, each id once, for a run that printed no result.
    streamed: Tokens,
    streamed_models: BTreeMap<String, Tokens>,
    /// The result's own tokens arrived.
    have_result_usage: bool,
}

/// What a line changed that the caller acts on at once.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// The final `result` event was read.
    pub result: bool,
    /// The step detail changed (an API retry, a limit warning).
    pub detail: bool,
}

impl Reader {
    /// A reader for one profile's output.
    pub fn new(profile: Profile) -> Reader {
        Reader {
            profile,
            ..Reader::default()
        }
    }

    /// Reads one output line (without its newline). `now_ms` is the time a clock-time reset is
    /// counted from.
    pub fn line(&mut self, line: &str, now_ms: i64) -> Seen {
        let mut seen = Seen::default();
        match self.profile {
            Profile::Claude => {}
            Profile::Plain => {
                if let Some(l) = limit_in_text(line, now_ms) {
                    self.set_limit(l);
                }
                return seen;
            }
            Profile::Codex => {
                self.codex(line, now_ms);
                return seen;
            }
        }
        let events = events(line);
        if events.is_empty() {
            if let Some(l) = limit_in_text(line, now_ms) {
                self.set_limit(l);
            }
            return seen;
        }
        for ev in events {
            self.event(ev, now_ms, &mut seen);
        }
        seen
    }

    /// What the output said so far.
    pub fn report(&self) -> Report {
        let mut r = self.report.clone();
        if !self.have_result_usage {
            r.tokens = self.streamed;
            r.models = self
                .streamed_models
                .iter()
                .map(|(m, t)| {
                    (
                        m.clone(),
                        ModelSpend {
                            tokens: *t,
                            cost_usd: 0.0,
                        },
                    )
                })
                .collect();
        }
        r
    }

    fn codex(&mut self, line: &str, now_ms: i64) {
        let t = line.trim();
        let ev = if t.starts_with('{') {
            serde_json::from_str::<CodexEvent>(t).ok()
        } else {
            None
        };
        let failed_with = match ev {
            None => {
                if let Some(l) = limit_in_text(line, now_ms) {
                    self.set_limit(l);
                }
                return;
            }
            Some(CodexEvent::TurnCompleted { usage }) => {
                // Each turn once; Codex counts cached input inside `input_tokens`.
                self.streamed.add(&Usage {
                    input_tokens: usage.input_tokens.saturating_sub(usage.cached_input_tokens),
                    output_tokens: usage.output_tokens,
                    cache_read_input_tokens: usage.cached_input_tokens,
                    cache_creation_input_tokens: 0,
                });
                if self.report.verdict.is_none() {
                    self.report.verdict = Some(Verdict {
                        failed: false,
                        text: String::new(),
                    });
                }
                return;
            }
            Some(CodexEvent::TurnFailed { error }) => error.message,
            Some(CodexEvent::Error { message }) => message,
            Some(CodexEvent::Unknown) => return,
        };
        if let Some(l) = limit_in_text(&failed_with, now_ms) {
            self.set_limit(l);
        }
        let lower = failed_with.to_ascii_lowercase();
        if lower.contains("not logged in") || lower.contains("codex login") {
            self.report.auth_failed = true;
        }
        self.report.verdict = Some(Verdict {
            failed: true,
            text: failed_with,
        });
    }

    fn set_limit(&mut self, l: Limit) {
        // A reset time and a type, once known, are not lost to a vaguer later mention.
        match &mut self.report.limit {
            Some(have) => {
                if have.reset_ms == 0 {
                    have.reset_ms = l.reset_ms;
                }
                if have.kind.is_empty() {
                    have.kind = l.kind;
                }
            }
            None => self.report.limit = Some(l),
        }
    }

    fn event(&mut self, ev: Event, now_ms: i64, seen: &mut Seen) {
        match ev {
            Event::System(System::ApiRetry {
                attempt,
                max_retries,
                error_status,
                error,
            }) => {
                let what = match (error.as_deref(), error_status) {
                    (Some(e), _) if e != "unknown" => e.to_string(),
                    (_, Some(s)) => format!("HTTP {s}"),
                    _ => "no answer".to_string(),
                };
                self.report.retrying = Some(format!("API retry {attempt}/{max_retries}: {what}"));
                seen.detail = true;
            }
            Event::Assistant(a) => self.assistant(a, now_ms),
            Event::Result(r) => {
                self.result(r, now_ms);
                seen.result = true;
            }
            Event::RateLimitEvent(e) => {
                let info = e.rate_limit_info;
                let kind = info.rate_limit_type.clone().unwrap_or_default();
                match info.status.as_str() {
                    "rejected" => {
                        let reset_ms = info.resets_at.map(epoch_to_ms).unwrap_or(0);
                        // The event is the best source: it overrides what text said.
                        self.report.limit = Some(Limit { reset_ms, kind });
                    }
                    "allowed_warning" => {
                        let used = info
                            .utilization
                            .map(|u| format!(" at {:.0}%", u * 100.0))
                            .unwrap_or_default();
                        let name = if kind.is_empty() { "usage" } else { &kind };
                        self.report.warning = Some(format!("{name} limit{used}, close to it"));
                        seen.detail = true;
                    }
                    _ => {}
                }
            }
            Event::System(_) | Event::User(_) | Event::Unknown => {}
        }
    }

    fn assistant(&mut self, a: Assistant, now_ms: i64) {
        let m = a.message;
        let first = match &m.id {
            Some(id) => self.seen_ids.insert(id.clone()),
            None => true,
        };
        if first && let Some(u) = &m.usage {
            self.streamed.add(u);
            if let Some(model) = m.model.as_deref().filter(|m| !m.starts_with('<')) {
                self.streamed_models
                    .entry(model.to_string())
                    .or_default()
                    .add(u);
            }
        }
        let Some(err) = a.error.as_deref() else {
            return;
        };
        let text: String = m
            .content
            .iter()
            .filter_map(|c| match c {
                Content::Text { text } => Some(text.as_str()),
                Content::Other => None,
            })
            .collect::<Vec<_>>()
            .join(" ");
        match err {
            "authentication_failed" => self.report.auth_failed = true,
            "rate_limit" => {
                let l = limit_in_text(&text, now_ms).unwrap_or(Limit {
                    reset_ms: 0,
                    kind: String::new(),
                });
                self.set_limit(l);
            }
            _ => {}
        }
        if a.api_error.as_deref() == Some("connection_failed") {
            self.report.unreachable = true;
        }
        if a.api_error_status == Some(429) && self.report.limit.is_none() {
            self.set_limit(limit_in_text(&text, now_ms).unwrap_or(Limit {
                reset_ms: 0,
                kind: String::new(),
            }));
        }
    }

    fn result(&mut self, r: ResultEvent, now_ms: i64) {
        let text = r.result.clone().unwrap_or_default();
        let failed = r.is_error || r.api_error_status.is_some_and(|s| s >= 400);
        if failed {
            if let Some(l) = limit_in_text(&text, now_ms) {
                self.set_limit(l);
            } else if r.api_error_status == Some(429) {
                self.set_limit(Limit {
                    reset_ms: 0,
                    kind: String::new(),
                });
            }
            if r.api_error.as_deref() == Some("connection_failed") {
                self.report.unreachable = true;
            }
            if is_login_message(&text) {
                self.report.auth_failed = true;
            }
        }
        self.report.verdict = Some(Verdict { failed, text });
        self.report.cost_usd = r.total_cost_usd.filter(|c| c.is_finite() && *c >= 0.0);
        if let Some(u) = &r.usage {
            self.report.tokens = Tokens::of(u);
            self.have_result_usage = true;
        }
        if let Some(models) = r.model_usage.filter(|m| !m.is_empty()) {
            self.report.models = models
                .into_iter()
                .map(|(name, m)| {
                    let tokens = Tokens {
                        input: m.input_tokens,
                        output: m.output_tokens,
                        cache_read: m.cache_read_input_tokens,
                        cache_creation: m.cache_creation_input_tokens,
                    };
                    let cost_usd = if m.cost_usd.is_finite() && m.cost_usd >= 0.0 {
                        m.cost_usd
                    } else {
                        0.0
                    };
                    (name, ModelSpend { tokens, cost_usd })
                })
                .collect();
            self.have_result_usage = true;
        }
    }
}

/// Whether a text is Claude Code's "not logged in" message.
fn is_login_message(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    lower.contains("not logged in") && lower.contains("/login")
}

/// A `resetsAt` as Unix ms: values below 10^11 are seconds (10^11 ms is in 1973, 10^11 s in
/// the year 5138).
fn epoch_to_ms(v: f64) -> i64 {
    if !v.is_finite() || v <= 0.0 {
        return 0;
    }
    let ms = if v < 1e11 { v * 1000.0 } else { v };
    ms.min(i64::MAX as f64) as i64
}

/// Most objects tried in one line that does not parse as a whole.
const MAX_CANDIDATES: usize = 256;

/// The events in one line: the whole line when it is one event, else every balanced object
/// that parses as a known event (events spliced into one line), outermost first, trying at
/// most [`MAX_CANDIDATES`] objects.
pub fn events(line: &str) -> Vec<Event> {
    let t = line.trim();
    if !t.contains('{') {
        return Vec::new();
    }
    if t.starts_with('{')
        && let Ok(ev) = serde_json::from_str::<Event>(t)
    {
        return vec![ev];
    }
    let b = t.as_bytes();
    let mut out = Vec::new();
    let mut tried = 0;
    let mut i = 0;
    while i < b.len() && tried < MAX_CANDIDATES {
        // Objects nested in an event (its content blocks) are part of it.
        if b[i] == b'{'
            && starts_with_key(&b[i + 1..])
            && {
                tried += 1;
                true
            }
            && let Some(end) = balanced_end(b, i)
            && let Ok(ev) = serde_json::from_str::<Event>(&t[i..=end])
            && ev != Event::Unknown
        {
            out.push(ev);
            i = end + 1;
            continue;
        }
        i += 1;
    }
    out
}

/// Whether an object's text goes on with a key (`"`), after any whitespace.
fn starts_with_key(rest: &[u8]) -> bool {
    rest.iter()
        .find(|c| !c.is_ascii_whitespace())
        .is_some_and(|c| *c == b'"')
}

/// The index of the `}` closing the object that opens at `start`, skipping strings.
fn balanced_end(b: &[u8], start: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_str = false;
    let mut escaped = false;
    for (k, &c) in b.iter().enumerate().skip(start) {
        if in_str {
            match c {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            b'"' => in_str = true,
            b'{' => depth += 1,
            b'}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(k);
                }
            }
            _ => {}
        }
    }
    None
}

/// Recognises a usage limit in text:
/// - Claude Code's `You've hit your … limit · resets <time> (<IANA zone>)`, the reset read as
///   the next such clock time in that zone;
/// - the API-key form `API Error: Request rejected (429)`, and other CLIs' "rate limit
///   exceeded", `rate_limit_error` or "429 Too Many Requests" (reset unknown);
/// - the legacy `Claude AI usage limit reached|<epoch seconds>`.
pub fn limit_in_text(line: &str, now_ms: i64) -> Option<Limit> {
    let lower = line.to_ascii_lowercase();
    if let Some(i) = lower.find("usage limit reached") {
        let reset_ms = line[i..]
            .split('|')
            .nth(1)
            .map(|s| {
                s.chars()
                    .take_while(|c| c.is_ascii_digit())
                    .collect::<String>()
            })
            .and_then(|d| d.parse::<f64>().ok())
            .map(epoch_to_ms)
            .unwrap_or(0);
        return Some(Limit {
            reset_ms,
            kind: String::new(),
        });
    }
    if let Some(i) = lower.find("hit your")
        && lower[i..].contains("limit")
    {
        let reset_ms = lower[i..]
            .find("resets ")
            .and_then(|j| clock_reset(&line[i + j + "resets ".len()..], now_ms))
            .unwrap_or(0);
        return Some(Limit {
            reset_ms,
            kind: limit_kind(&lower[i..]),
        });
    }
    if lower.contains("request rejected (429)")
        || lower.contains("rate_limit_error")
        || lower.contains("rate limit exceeded")
        || lower.contains("429 too many requests")
    {
        return Some(Limit {
            reset_ms: 0,
            kind: String::new(),
        });
    }
    None
}

/// The limit a "You've hit your … limit" text names, in the `rateLimitType` names.
fn limit_kind(lower: &str) -> String {
    let head = lower.split("limit").next().unwrap_or("");
    let kind = if head.contains("5-hour") || head.contains("session") {
        "five_hour"
    } else if head.contains("opus") {
        "seven_day_opus"
    } else if head.contains("sonnet") {
        "seven_day_sonnet"
    } else if head.contains("weekly") || head.contains("7-day") {
        "seven_day"
    } else {
        ""
    };
    kind.to_string()
}

/// `8:22pm (UTC)`, `1pm (Europe/Lisbon)`, `20:22 (Asia/Tokyo)`, optionally after a date such
/// as `Dec 3, `: the next such instant after `now_ms`, in Unix ms.
fn clock_reset(s: &str, now_ms: i64) -> Option<i64> {
    let open = s.find('(')?;
    let close = open + s[open..].find(')')?;
    let zone = s[open + 1..close].trim();
    let when = s[..open].trim().to_ascii_lowercase();
    let tz = jiff::tz::TimeZone::get(zone).ok()?;
    let words: Vec<&str> = when
        .split(|c: char| c.is_whitespace() || c == ',')
        .filter(|w| !w.is_empty() && *w != "at")
        .collect();
    // The time is the last word, or the last two when the am/pm stands apart.
    let (time, rest) = match words.as_slice() {
        [rest @ .., t, ap] if *ap == "am" || *ap == "pm" => (format!("{t}{ap}"), rest),
        [rest @ .., t] => (t.to_string(), rest),
        [] => return None,
    };
    let (hour, minute) = clock_time(&time)?;
    let now = jiff::Timestamp::from_millisecond(now_ms)
        .ok()?
        .to_zoned_datetime(tz.clone());
    let date = match rest {
        [] => None,
        [m, d] => Some((month(m)?, d.parse::<i8>().ok()?)),
        _ => return None,
    };
    let at = |d: jiff::civil::Date| -> Option<jiff::Timestamp> {
        Some(
            d.at(hour, minute, 0, 0)
                .to_zoned_datetime(tz.clone())
                .ok()?
                .timestamp(),
        )
    };
    let ts = match date {
        None => {
            let today = at(now.date())?;
            if today > now.timestamp() {
                today
            } else {
                at(now.date().tomorrow().ok()?)?
            }
        }
        Some((m, d)) => {
            let this_year = at(jiff::civil::Date::new(now.year(), m, d).ok()?)?;
            if this_year > now.timestamp() {
                this_year
            } else {
                at(jiff::civil::Date::new(now.year() + 1, m, d).ok()?)?
            }
        }
    };
    Some(ts.as_millisecond())
}

/// `8:22pm`, `1pm`, `12am`, `20:22`: hour and minute on a 24-hour clock.
fn clock_time(t: &str) -> Option<(i8, i8)> {
    let (digits, ampm) = if let Some(d) = t.strip_suffix("am") {
        (d, Some(false))
    } else if let Some(d) = t.strip_suffix("pm") {
        (d, Some(true))
    } else {
        (t, None)
    };
    let (h, m) = match digits.split_once(':') {
        Some((h, m)) => (h.parse::<i8>().ok()?, m.parse::<i8>().ok()?),
        None => (digits.parse::<i8>().ok()?, 0),
    };
    if !(0..60).contains(&m) {
        return None;
    }
    let h = match ampm {
        None if (0..24).contains(&h) => h,
        Some(pm) if (1..=12).contains(&h) => (h % 12) + if pm { 12 } else { 0 },
        _ => return None,
    };
    Some((h, m))
}

fn month(w: &str) -> Option<i8> {
    const MONTHS: [&str; 12] = [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ];
    let p = w.get(..3)?;
    MONTHS.iter().position(|m| *m == p).map(|i| i as i8 + 1)
}

#[cfg(test)]
mod tests;
