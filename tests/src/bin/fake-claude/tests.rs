//! Unit tests of the fake agent CLI: argument parsing, scripts and owned files.

use super::*;

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[test]
fn prompt_is_last_argument() {
    let a = parse_args(&args(&[
        "--print",
        "--dangerously-skip-permissions",
        "--model",
        "opus",
        "--output-format",
        "stream-json",
        "--verbose",
        "do the task",
    ]));
    assert_eq!(a.prompt.as_deref(), Some("do the task"));
    assert_eq!(a.output_format, OutputFormat::StreamJson);
    assert!(!a.version);
}

#[test]
fn equals_form_and_unknown_flags() {
    let a = parse_args(&args(&[
        "-p",
        "--output-format=json",
        "--weird=1",
        "the prompt",
    ]));
    assert_eq!(a.output_format, OutputFormat::Json);
    assert_eq!(a.prompt.as_deref(), Some("the prompt"));

    let a = parse_args(&args(&["-p", "--output-format=stream-json", "x"]));
    assert_eq!(a.output_format, OutputFormat::StreamJson);
    assert_eq!(a.prompt.as_deref(), Some("x"));

    // An unknown flag swallows a following value, but never the final prompt.
    let a = parse_args(&args(&["--unknown", "val", "prompt"]));
    assert_eq!(a.prompt.as_deref(), Some("prompt"));
    let a = parse_args(&args(&["--print", "--unknown", "prompt"]));
    assert_eq!(a.prompt.as_deref(), Some("prompt"));
}

#[test]
fn no_prompt_and_version() {
    let a = parse_args(&args(&[
        "--print",
        "--output-format",
        "stream-json",
        "--verbose",
    ]));
    assert_eq!(a.prompt, None);
    assert_eq!(a.output_format, OutputFormat::StreamJson);

    let a = parse_args(&args(&["-p", "--model", "sonnet"]));
    assert_eq!(a.prompt, None);

    let a = parse_args(&args(&["--version"]));
    assert!(a.version);
    assert_eq!(a.prompt, None);

    let a = parse_args(&args(&["--session-id", "abc", "hi"]));
    assert_eq!(a.session_id.as_deref(), Some("abc"));
    assert_eq!(a.prompt.as_deref(), Some("hi"));
}

#[test]
fn task_id_parsed_from_prompt() {
    assert_eq!(
        task_id_from_prompt("# Task\nTask ID: A-L1-001\nmore").as_deref(),
        Some("A-L1-001")
    );
    assert_eq!(
        task_id_from_prompt("**Task ID:** `B-L2-003`").as_deref(),
        Some("B-L2-003")
    );
    assert_eq!(task_id_from_prompt("nothing here"), None);
}

#[test]
fn files_section() {
    let prompt = "# Task\nTask ID: A\n\n## Files\nCreate: src/a.rs, src/b.rs\nModify: README.md\n\n## Acceptance\nCreate: not/this.rs\n";
    let files = parse_files_section(prompt);
    assert_eq!(files.create, vec!["src/a.rs", "src/b.rs"]);
    assert_eq!(files.modify, vec!["README.md"]);

    let files = parse_files_section("## Files\nModify: x.txt, y/z.txt\n");
    assert!(files.create.is_empty());
    assert_eq!(files.modify, vec!["x.txt", "y/z.txt"]);

    assert_eq!(parse_files_section("Create: a.rs\n"), OwnedFiles::default());
}

#[test]
fn script_list_and_attempts() {
    let script = parse_script(
        r#"{
            "default": [{"op":"print","text":"hi"}],
            "tasks": {
                "T1": [{"op":"exit","code":3}],
                "T2": {"attempts": [[{"op":"crash"}], [{"op":"sleep_ms","ms":5}, {"op":"write_owned"}]]}
            }
        }"#,
    )
    .unwrap();
    let print = vec![Op::Print {
        text: "hi".to_string(),
    }];
    assert_eq!(script.ops_for("other", 1).unwrap(), print);
    assert_eq!(script.ops_for("T1", 1).unwrap(), vec![Op::Exit { code: 3 }]);
    assert_eq!(script.ops_for("T1", 7).unwrap(), vec![Op::Exit { code: 3 }]);
    assert_eq!(script.ops_for("T2", 1).unwrap(), vec![Op::Crash]);
    let second = vec![Op::SleepMs { ms: 5 }, Op::WriteOwned];
    assert_eq!(script.ops_for("T2", 2).unwrap(), second);
    assert_eq!(script.ops_for("T2", 3).unwrap(), second);
    assert_eq!(script.ops_for("T2", 99).unwrap(), second);
}

#[test]
fn script_defaults_and_errors() {
    let script = parse_script(r#"{"tasks": {}}"#).unwrap();
    assert_eq!(script.ops_for("any", 1).unwrap(), vec![Op::WriteOwned]);

    let script =
        parse_script(r#"{"tasks":{"X":[{"op":"rate_limit","reset_in_secs":60}]}}"#).unwrap();
    assert_eq!(
        script.ops_for("X", 1).unwrap(),
        vec![Op::RateLimit {
            reset_in_secs: 60,
            form: LimitForm::Auto
        }]
    );

    // An unknown op only fails the task that uses it.
    let script = parse_script(
        r#"{"tasks":{"X":[{"op":"print","text":"a"},{"op":"dance"}],"Y":[{"op":"hang"}]}}"#,
    )
    .unwrap();
    let err = script.ops_for("X", 1).unwrap_err();
    assert!(err.contains("tasks.X[1]") && err.contains("dance"), "{err}");
    assert_eq!(script.ops_for("Y", 1).unwrap(), vec![Op::Hang]);
    assert!(parse_script(r#"{"tasks":{"X":[42]}}"#).is_err());
    assert!(parse_script("not json").is_err());
    assert!(parse_script(r#"{"tasks":{"X":{"attempts":[]}}}"#).is_err());
    assert!(parse_script(r#"{"task":{}}"#).is_err());
}

#[test]
fn rate_limit_line_and_sanitize() {
    assert_eq!(
        rate_limit_message(1_700_000_000),
        "Claude AI usage limit reached|1700000000"
    );
    assert_eq!(sanitize("A-L1/001 x"), "A-L1_001_x");
}

#[test]
fn a_spec_dir_without_its_graph_is_an_error_not_the_default_script() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("spec");
    // Missing, or there but empty (a mount point with nothing mounted): an error.
    assert!(spec_script(&spec).unwrap_err().contains("task-graph.json"));
    fs::create_dir(&spec).unwrap();
    assert!(
        spec_script(&spec)
            .unwrap_err()
            .contains("the spec is missing")
    );
    // A spec without a script: the default; with one: that script.
    fs::write(spec.join("task-graph.json"), "{}").unwrap();
    assert_eq!(spec_script(&spec).unwrap(), None);
    fs::write(spec.join("fake-claude.json"), "{}").unwrap();
    assert_eq!(
        spec_script(&spec).unwrap(),
        Some(spec.join("fake-claude.json"))
    );
}
