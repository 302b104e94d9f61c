use super::*;

/// Recorded runs of Claude Code 2.1.327 (see tests/fixtures/claude-code-2.1.327/README.md).
macro_rules! recorded {
    ($name:literal) => {
        include_str!(concat!(
            "../../../tests/fixtures/claude-code-2.1.327/",
            $name
        ))
    };
}

/// 2026-12-01T19:22:21Z, when rl-oauth.jsonl was recorded.
const RECORDED_AT_MS: i64 = 1_796_152_941_000;

fn read(text: &str, now_ms: i64) -> Report {
    let mut r = Reader::default();
    for l in text.lines() {
        r.line(l, now_ms);
    }
    r.report()
}

#[test]
fn a_recorded_tool_run_succeeds_with_its_cost_and_tokens() {
    let r = read(recorded!("tool.jsonl"), RECORDED_AT_MS);
    let v = r.verdict.expect("a result");
    assert!(!v.failed);
    assert_eq!(v.text, "done");
    assert_eq!(r.cost_usd, Some(0.016));
    assert_eq!(
        r.tokens,
        Tokens {
            input: 2000,
            output: 400,
            cache_read: 0,
            cache_creation: 0
        }
    );
    let m = &r.models["claude-opus-5-5"];
    assert_eq!(m.cost_usd, 0.016);
    assert_eq!(m.tokens.output, 400);
    assert!(r.limit.is_none() && !r.auth_failed && !r.unreachable);
}

#[test]
fn without_a_result_an_assistant_message_id_is_counted_once() {
    let text: String = recorded!("tool.jsonl")
        .lines()
        .filter(|l| !l.contains("\"type\":\"result\""))
        .map(|l| format!("{l}\n"))
        .collect();
    let r = read(&text, RECORDED_AT_MS);
    assert!(r.verdict.is_none());
    // msg_00001 is printed twice (text, then tool_use) with the same usage; msg_00002 once.
    assert_eq!(r.tokens.input, 2000);
    assert_eq!(r.tokens.output, 2);
    assert_eq!(r.models["claude-opus-5-5"].tokens.input, 2000);
}

#[test]
fn a_subscription_limit_is_read_from_the_rate_limit_event() {
    let r = read(recorded!("rl-oauth.jsonl"), RECORDED_AT_MS);
    assert!(r.verdict.unwrap().failed, "subtype success, is_error true");
    assert_eq!(
        r.limit,
        Some(Limit {
            reset_ms: 1_796_156_532_000,
            kind: "five_hour".into()
        })
    );
}

#[test]
fn an_api_key_429_is_a_limit_without_a_reset() {
    let r = read(recorded!("rl.jsonl"), RECORDED_AT_MS);
    assert!(r.verdict.unwrap().failed);
    assert_eq!(
        r.limit,
        Some(Limit {
            reset_ms: 0,
            kind: String::new()
        })
    );
}

#[test]
fn no_login_and_no_network_are_told_apart() {
    let r = read(recorded!("nologin.jsonl"), RECORDED_AT_MS);
    assert!(r.auth_failed && !r.unreachable && r.limit.is_none());
    assert!(r.verdict.unwrap().failed);
    let r = read(recorded!("nonet.jsonl"), RECORDED_AT_MS);
    assert!(r.unreachable && !r.auth_failed && r.limit.is_none());
    assert_eq!(r.retrying.as_deref(), Some("API retry 10/10: no answer"));
}

#[test]
fn api_retries_become_the_detail() {
    let mut r = Reader::default();
    let seen = r.line(
        r#"{"type":"system","subtype":"api_retry","attempt":3,"max_retries":10,"retry_delay_ms":2000,"error_status":529,"error":"overloaded"}"#,
        0,
    );
    assert!(seen.detail);
    assert_eq!(
        r.report().retrying.as_deref(),
        Some("API retry 3/10: overloaded")
    );
}

#[test]
fn resets_at_in_seconds_or_milliseconds_and_a_warning() {
    for at in ["1796156532", "1796156532000"] {
        let line = format!(
            r#"{{"type":"rate_limit_event","rate_limit_info":{{"status":"rejected","resetsAt":{at},"rateLimitType":"seven_day"}}}}"#
        );
        let r = read(&line, 0);
        assert_eq!(
            r.limit,
            Some(Limit {
                reset_ms: 1_796_156_532_000,
                kind: "seven_day".into()
            })
        );
    }
    let mut r = Reader::default();
    let seen = r.line(
        r#"{"type":"rate_limit_event","rate_limit_info":{"status":"allowed_warning","resetsAt":1796156532,"rateLimitType":"five_hour","utilization":0.9}}"#,
        0,
    );
    assert!(seen.detail);
    let rep = r.report();
    assert!(rep.limit.is_none(), "a warning is not a limit");
    assert_eq!(
        rep.warning.as_deref(),
        Some("five_hour limit at 90%, close to it")
    );
}

#[test]
fn spliced_events_are_each_read_and_junk_is_skipped() {
    let rl = r#"{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":1796156532,"rateLimitType":"five_hour"}}"#;
    let result = r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":429,"result":"x","total_cost_usd":0}"#;
    // One event cut into the middle of another, and two back to back.
    let assistant_head =
        r#"{"type":"assistant","message":{"id":"m1","content":[{"type":"text","text":"hel"#;
    let line = format!("{assistant_head}{rl}lo\"}}]}}}}{result}");
    let evs = events(&line);
    assert_eq!(evs.len(), 2, "{evs:?}");
    // Whatever the order of the keys.
    let rl_sorted = r#"{"rate_limit_info":{"rateLimitType":"seven_day","resetsAt":1796156532,"status":"rejected"},"type":"rate_limit_event"}"#;
    let sorted = format!("{assistant_head}{rl_sorted}lo\"}}]}}}}");
    assert_eq!(read(&sorted, 0).limit.unwrap().kind, "seven_day");
    let r = read(&line, 0);
    assert_eq!(r.limit.unwrap().kind, "five_hour");
    assert!(r.verdict.unwrap().failed);
    let mut r = Reader::default();
    for junk in [
        "{not json",
        "{\"type\":",
        "}}}{{{",
        "{\"type\":\"result\",\"is_error\":\"yes\"}",
        "",
    ] {
        assert_eq!(r.line(junk, 0), Seen::default(), "{junk:?}");
    }
    assert_eq!(r.report(), Report::default());
    assert_eq!(
        events(r#"{"type":"stream_event","event":{"type":"ping"}}"#),
        vec![Event::Unknown]
    );
}

#[test]
fn success_is_is_error_and_api_error_status_not_subtype() {
    let r = read(
        r#"{"type":"result","subtype":"error_max_turns","is_error":false,"result":"ok"}"#,
        0,
    );
    assert!(!r.verdict.unwrap().failed);
    let r = read(
        r#"{"type":"result","subtype":"success","is_error":false,"api_error_status":529,"result":"overloaded"}"#,
        0,
    );
    assert!(r.verdict.unwrap().failed);
}

#[test]
fn text_forms_of_a_limit() {
    // 2026-12-01T19:22:21Z.
    let now = RECORDED_AT_MS;
    let at = |s: &str| {
        jiff::Timestamp::strptime("%Y-%m-%dT%H:%M:%S%z", s)
            .map(|t| t.as_millisecond())
            .unwrap_or_else(|e| panic!("{s}: {e}"))
    };
    let l = limit_in_text("You've hit your 5-hour limit · resets 8:22pm (UTC)", now).unwrap();
    assert_eq!(l.reset_ms, at("2026-12-01T20:22:00+0000"));
    assert_eq!(l.kind, "five_hour");
    // 7pm UTC has passed: the next one is tomorrow's.
    let l = limit_in_text("You've hit your limit · resets 7pm (UTC)", now).unwrap();
    assert_eq!(l.reset_ms, at("2026-12-02T19:00:00+0000"));
    assert_eq!(l.kind, "");
    // Lisbon is on UTC in winter, Tokyo 9 hours ahead.
    let l = limit_in_text(
        "You've hit your session limit · resets 1pm (Europe/Lisbon)",
        now,
    )
    .unwrap();
    assert_eq!(l.reset_ms, at("2026-12-02T13:00:00+0000"));
    let l = limit_in_text(
        "You've hit your weekly limit · resets Dec 3, 9:30am (Asia/Tokyo)",
        now,
    )
    .unwrap();
    assert_eq!(l.reset_ms, at("2026-12-03T00:30:00+0000"));
    assert_eq!(l.kind, "seven_day");
    // A zone that does not exist still is a limit, with the reset unknown.
    let l = limit_in_text("You've hit your limit · resets 1pm (Mars/Olympus)", now).unwrap();
    assert_eq!(l.reset_ms, 0);
    assert_eq!(
        limit_in_text("Claude AI usage limit reached|1719532800", now)
            .unwrap()
            .reset_ms,
        1_719_532_800_000
    );
    assert!(limit_in_text("API Error: Request rejected (429) · slow down", now).is_some());
    assert!(limit_in_text("Error: rate_limit_error", now).is_some());
    assert!(limit_in_text("all good, no limits here", now).is_none());
}

#[test]
fn plain_text_lines_are_checked_for_the_text_forms() {
    let r = read("working\nClaude AI usage limit reached|1700000000\n", 0);
    assert_eq!(r.limit.unwrap().reset_ms, 1_700_000_000_000);
    assert!(r.verdict.is_none());
}

#[test]
fn a_server_throttle_under_a_subscription_is_a_limit_without_a_reset() {
    // Claude Code 2.1.327 on a 429 without the unified reset and claim headers.
    let text = concat!(
        r#"{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","isUsingOverage":false}}"#,
        "\n",
        r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":429,"result":"API Error: Server is temporarily limiting requests (not your usage limit) · Rate limited","total_cost_usd":0}"#,
    );
    let r = read(text, 0);
    assert_eq!(
        r.limit,
        Some(Limit {
            reset_ms: 0,
            kind: String::new()
        })
    );
}

#[test]
fn codex_events_give_tokens_and_failed_turns() {
    let mut r = Reader::new(Profile::Codex);
    for l in [
        r#"{"type":"thread.started","thread_id":"t1"}"#,
        r#"{"type":"turn.started"}"#,
        r#"{"type":"item.completed","item":{"id":"i0","type":"agent_message","text":"done"}}"#,
        r#"{"type":"turn.completed","usage":{"input_tokens":1200,"cached_input_tokens":200,"output_tokens":30}}"#,
        r#"{"type":"turn.completed","usage":{"input_tokens":100,"cached_input_tokens":0,"output_tokens":5}}"#,
    ] {
        r.line(l, 0);
    }
    let rep = r.report();
    assert!(!rep.verdict.unwrap().failed);
    assert_eq!(
        rep.tokens,
        Tokens {
            input: 1100,
            output: 35,
            cache_read: 200,
            cache_creation: 0
        }
    );
    assert_eq!(rep.cost_usd, None, "Codex reports no cost");
    let mut r = Reader::new(Profile::Codex);
    r.line(
        r#"{"type":"turn.failed","error":{"message":"You've hit your usage limit. Try again later."}}"#,
        0,
    );
    let rep = r.report();
    assert!(rep.verdict.unwrap().failed);
    assert!(rep.limit.is_some());
}

#[test]
fn the_plain_profile_reads_only_text() {
    let mut r = Reader::new(Profile::Plain);
    r.line(
        r#"{"type":"result","is_error":true,"total_cost_usd":1.0,"result":"x"}"#,
        0,
    );
    r.line("Claude AI usage limit reached|1700000000", 0);
    let rep = r.report();
    assert!(rep.verdict.is_none() && rep.cost_usd.is_none());
    assert_eq!(rep.limit.unwrap().reset_ms, 1_700_000_000_000);
}
