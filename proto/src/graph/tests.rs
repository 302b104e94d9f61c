//! Unit tests of the task-graph reader and validator.

use super::*;
use serde_json::json;

fn run(v: &Value) -> Result<Validated, GraphError> {
    parse(v.to_string().as_bytes(), Path::new("task-graph.json"))
}

fn errors(v: &Value) -> (Vec<Diagnostic>, Vec<Diagnostic>) {
    match run(v) {
        Err(GraphError::Invalid {
            errors, warnings, ..
        }) => {
            assert!(!errors.is_empty());
            (errors, warnings)
        }
        Ok(ok) => panic!("graph unexpectedly valid; warnings: {:?}", ok.warnings),
        Err(other) => panic!("unexpected error: {other}"),
    }
}

fn ok(v: &Value) -> Validated {
    match run(v) {
        Ok(ok) => ok,
        Err(GraphError::Invalid { errors, .. }) => {
            panic!(
                "graph unexpectedly invalid: {:#?}",
                errors.iter().map(ToString::to_string).collect::<Vec<_>>()
            )
        }
        Err(other) => panic!("unexpected error: {other}"),
    }
}

fn task(id: &str, level: u32, deps: &[&str], create: &[&str]) -> Value {
    json!({
        "id": id,
        "title": format!("Task {id}"),
        "description": "does things",
        "level": level,
        "dependencies": deps,
        "files": {"create": create, "modify": [], "read": []},
        "verification": {"command": "cargo test", "timeout_seconds": 60},
    })
}

fn graph(tasks: Vec<Value>) -> Value {
    json!({"feature": "auth", "version": "2.0", "tasks": tasks})
}

/// True when some diagnostic has this task and field and its message contains `text`.
fn has(diags: &[Diagnostic], task: Option<&str>, field: &str, text: &str) -> bool {
    diags
        .iter()
        .any(|d| d.task.as_deref() == task && d.field == field && d.message.contains(text))
}

#[track_caller]
fn assert_has(diags: &[Diagnostic], task: Option<&str>, field: &str, text: &str) {
    assert!(
        has(diags, task, field, text),
        "no diagnostic ({task:?}, {field:?}, {text:?}) in {diags:#?}"
    );
}

/// Two level-1 tasks and one level-2 task depending on both: valid, no warnings.
fn small() -> Vec<Value> {
    vec![
        task("A-L1-001", 1, &[], &["src/a.rs"]),
        task("A-L1-002", 1, &[], &["src/b.rs"]),
        task("A-L2-001", 2, &["A-L1-001", "A-L1-002"], &["src/c.rs"]),
    ]
}

#[test]
fn small_graph_is_valid_and_fully_read() {
    let v = ok(&graph(small()));
    assert!(v.warnings.is_empty(), "{:?}", v.warnings);
    assert_eq!(v.graph.feature, "auth");
    assert_eq!(v.graph.version.as_deref(), Some("2.0"));
    let t = v.graph.task("A-L2-001").unwrap();
    assert_eq!(t.dependencies, vec!["A-L1-001", "A-L1-002"]);
    assert_eq!(t.files.create, vec!["src/c.rs"]);
    assert_eq!(
        t.verification,
        Some(Verification {
            command: "cargo test".into(),
            timeout_seconds: 60
        })
    );
}

#[test]
fn defaults_for_absent_optional_fields() {
    let v = ok(&graph(vec![
        json!({"id": "T1", "title": "t", "level": 1, "verification": {"command": "true"}}),
    ]));
    let t = &v.graph.tasks[0];
    assert_eq!(t.description, "");
    assert!(t.dependencies.is_empty());
    assert_eq!(t.files, Files::default());
    assert_eq!(
        t.verification.as_ref().unwrap().timeout_seconds,
        DEFAULT_VERIFICATION_TIMEOUT_SECONDS
    );
    assert_eq!(t.estimate_minutes, None);
    assert!(t.acceptance_criteria.is_empty());
}

#[test]
fn unknown_keys_are_ignored() {
    let mut tasks = small();
    tasks[0]["phase"] = json!("foundation");
    tasks[0]["skills_required"] = json!(["rust"]);
    tasks[0]["steps"] = json!([{"step": 1, "action": "implement"}]);
    tasks[0]["status"] = json!("pending");
    tasks[0]["files"]["delete"] = json!(["old.rs"]);
    tasks[0]["files"]["move"] = json!([{"from": "a", "to": "b"}]);
    let mut g = graph(tasks);
    g["$schema"] = json!("./schema.json");
    g["conflict_matrix"] = json!({"description": "x", "conflicts": []});
    g["generated"] = json!("2025-01-01T00:00:00Z");
    let v = ok(&g);
    assert!(v.warnings.is_empty(), "{:?}", v.warnings);
}

#[test]
fn json_syntax_error_reports_line_and_column() {
    let text = b"{\n  \"feature\": \"x\",\n  \"tasks\": [,]\n}\n";
    match parse(text, Path::new("g.json")) {
        Err(GraphError::Syntax {
            line,
            column,
            message,
            path,
        }) => {
            assert_eq!((line, column), (3, 13));
            assert!(!message.contains("at line"), "{message}");
            assert_eq!(path, Path::new("g.json"));
        }
        other => panic!("expected syntax error, got {other:?}"),
    }
    let err = parse(b"{\"a\": ", Path::new("g.json")).unwrap_err();
    assert!(
        err.to_string().starts_with("g.json:1:6: invalid JSON: "),
        "{err}"
    );
}

#[test]
fn load_reports_io_error_and_reads_files() {
    let missing = Path::new("/nonexistent/zerg/task-graph.json");
    assert!(matches!(load(missing), Err(GraphError::Io { .. })));
    let dir = std::env::temp_dir().join(format!("zerg-graph-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("task-graph.json");
    std::fs::write(&file, graph(small()).to_string()).unwrap();
    let loaded = load(&file);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(loaded.unwrap().graph.tasks.len(), 3);
}

#[test]
fn top_level_must_be_object() {
    let (e, _) = errors(&json!([1, 2]));
    assert_has(&e, None, "", "must be a JSON object");
}

#[test]
fn top_level_of_every_other_json_type_is_named() {
    for (text, kind) in [
        ("null", "null"),
        ("true", "a boolean"),
        ("-3", "an integer"),
        ("18446744073709551615", "an integer"),
        ("1.5", "a number"),
        ("\"x\"", "a string"),
        ("[{\"a\": [1]}, 2]", "a list"),
    ] {
        match parse(text.as_bytes(), Path::new("g.json")) {
            Err(GraphError::Invalid { errors, .. }) => assert_has(
                &errors,
                None,
                "",
                &format!("must be a JSON object, not {kind}"),
            ),
            other => panic!("{text}: expected the type refused, got {other:?}"),
        }
    }
}

#[test]
fn tasks_of_every_other_json_type_are_named() {
    for (tasks, kind) in [
        (json!(null), "null"),
        (json!(false), "a boolean"),
        (json!(7), "an integer"),
        (json!("T1"), "a string"),
        (json!({"T1": {"id": "T1"}}), "an object"),
    ] {
        let (e, _) = errors(&json!({"feature": "f", "tasks": tasks}));
        assert_has(&e, None, "tasks", &format!("non-empty list, not {kind}"));
    }
}

#[test]
fn a_repeated_tasks_key_counts_once_and_the_last_one_wins() {
    // Any JSON reader keeps the last of two equal keys: so does the graph's, and what the first
    // list held (here an invalid task) is neither run nor reported.
    let last = graph(small()).to_string();
    let text = format!(
        "{{\"tasks\": [{{\"id\": 5}}], {}",
        last.strip_prefix('{').unwrap()
    );
    let v = parse(text.as_bytes(), Path::new("g.json")).expect("the last tasks key is valid");
    assert_eq!(v.graph.tasks.len(), 3);
    let text = format!(
        "{}, \"tasks\": [{{\"id\": 5}}]}}",
        last.strip_suffix('}').unwrap()
    );
    match parse(text.as_bytes(), Path::new("g.json")) {
        Err(GraphError::Invalid { errors, .. }) => {
            assert_has(&errors, Some("tasks[0]"), "id", "must be a string")
        }
        other => panic!("expected the last tasks key refused, got {other:?}"),
    }
}

#[test]
fn text_after_the_document_is_a_syntax_error() {
    let text = format!("{} x", graph(small()));
    match parse(text.as_bytes(), Path::new("g.json")) {
        Err(GraphError::Syntax { line, message, .. }) => {
            assert_eq!(line, 1);
            assert!(message.contains("trailing"), "{message}");
        }
        other => panic!("expected a syntax error, got {other:?}"),
    }
}

#[test]
fn feature_and_tasks_required() {
    let (e, _) = errors(&json!({}));
    assert_has(&e, None, "feature", "missing required field");
    assert_has(&e, None, "tasks", "missing required field");
    let (e, _) = errors(&json!({"feature": 3, "tasks": []}));
    assert_has(&e, None, "feature", "must be a string");
    assert_has(&e, None, "tasks", "non-empty list");
    let (e, _) = errors(&json!({"feature": "f", "tasks": {}}));
    assert_has(&e, None, "tasks", "non-empty list");
}

#[test]
fn feature_name_rule() {
    let mut g = graph(small());
    g["feature"] = json!("bad name");
    let (e, _) = errors(&g);
    assert_has(&e, None, "feature", "[A-Za-z0-9][A-Za-z0-9_-]*");
    assert!(validate_feature_name("user-auth_2").is_ok());
    assert!(validate_feature_name("2fa").is_ok());
    assert!(validate_feature_name("").is_err());
    assert!(validate_feature_name("-x").unwrap_err().contains("start"));
    assert!(validate_feature_name("a/b").is_err());
    assert!(validate_feature_name(&"a".repeat(100)).is_ok());
    assert!(
        validate_feature_name(&"a".repeat(101))
            .unwrap_err()
            .contains("100")
    );
}

#[test]
fn task_must_be_object_with_required_fields() {
    let (e, _) = errors(&graph(vec![
        json!("nope"),
        json!({"dependencies": []}),
        json!({"id": "T2", "title": ""}),
    ]));
    assert_has(&e, None, "tasks[0]", "must be an object");
    assert_has(&e, Some("tasks[1]"), "id", "missing required field");
    assert_has(&e, Some("tasks[1]"), "title", "missing required field");
    assert_has(&e, Some("tasks[1]"), "level", "missing required field");
    assert_has(&e, Some("T2"), "title", "non-empty");
    assert_has(&e, Some("T2"), "level", "missing required field");
}

#[test]
fn level_must_be_positive_integer() {
    for (bad, text) in [
        (json!(0), "integer >= 1"),
        (json!(-1), "integer >= 1"),
        (json!(1.5), "integer >= 1"),
        (json!("1"), "a string"),
    ] {
        let mut t = task("T1", 1, &[], &[]);
        t["level"] = bad.clone();
        let (e, _) = errors(&graph(vec![t]));
        assert_has(&e, Some("T1"), "level", text);
    }
}

#[test]
fn task_id_rule() {
    for good in [
        "TASK-001",
        "T1",
        "RES-L2-001",
        "a_b-c",
        &format!("A{}", "x".repeat(63)),
    ] {
        assert!(validate_task_id(good).is_ok(), "{good}");
    }
    for bad in [
        "T1.1",
        "1abc",
        "a;b",
        "",
        "-a",
        "a b",
        &format!("A{}", "x".repeat(64)),
    ] {
        assert!(validate_task_id(bad).is_err(), "{bad:?}");
    }
    let (e, _) = errors(&graph(vec![
        task("T1.1", 1, &[], &[]),
        json!({"id": 7, "title": "t", "level": 1}),
    ]));
    assert_has(&e, Some("tasks[0]"), "id", "T1.1");
    assert_has(&e, Some("tasks[1]"), "id", "must be a string");
}

#[test]
fn duplicate_ids_refused() {
    let (e, _) = errors(&graph(vec![
        task("T1", 1, &[], &["a"]),
        task("T1", 1, &[], &["b"]),
    ]));
    assert_has(&e, Some("T1"), "id", "tasks[1] reuses the id of tasks[0]");
    assert_eq!(e.len(), 1, "{e:#?}");
}

#[test]
fn dependency_must_exist() {
    let (e, _) = errors(&graph(vec![
        task("A", 1, &[], &[]),
        task("B", 2, &["A", "X"], &[]),
    ]));
    assert_has(
        &e,
        Some("B"),
        "dependencies",
        "dependency 'X' does not exist",
    );
    assert_eq!(e.len(), 1, "{e:#?}");
    assert_eq!(
        e[0].to_string(),
        "task B, field `dependencies`: dependency 'X' does not exist"
    );
}

#[test]
fn dependency_on_self_refused() {
    let (e, _) = errors(&graph(vec![task("A", 1, &["A"], &[])]));
    assert_has(&e, Some("A"), "dependencies", "depends on itself");
}

#[test]
fn dependency_must_be_at_lower_level() {
    let (e, _) = errors(&graph(vec![
        task("A", 1, &[], &[]),
        task("C", 2, &["A"], &[]),
        task("B", 2, &["A", "C"], &[]),
    ]));
    assert_has(
        &e,
        Some("B"),
        "dependencies",
        "dependency 'C' is at level 2, which is not lower than this task's level 2",
    );
    assert_eq!(e.len(), 1, "{e:#?}");
}

#[test]
fn dependency_cycle_reported_once() {
    let (e, _) = errors(&graph(vec![
        task("A", 1, &["B"], &[]),
        task("B", 1, &["A"], &[]),
        task("C", 1, &["A"], &[]),
    ]));
    let cycles: Vec<_> = e
        .iter()
        .filter(|d| d.message.starts_with("dependency cycle"))
        .collect();
    assert_eq!(cycles.len(), 1, "{e:#?}");
    assert_eq!(cycles[0].task.as_deref(), Some("A"));
    assert_eq!(cycles[0].field, "dependencies");
    assert_eq!(cycles[0].message, "dependency cycle: A -> B -> A");
    // A three-task cycle where levels go round.
    let (e, _) = errors(&graph(vec![
        task("P", 1, &["R"], &[]),
        task("Q", 1, &["P"], &[]),
        task("R", 1, &["Q"], &[]),
    ]));
    assert_has(
        &e,
        Some("P"),
        "dependencies",
        "dependency cycle: P -> R -> Q -> P",
    );
    assert_eq!(
        e.iter()
            .filter(|d| d.message.starts_with("dependency cycle"))
            .count(),
        1
    );
}

#[test]
fn levels_must_be_contiguous() {
    let (e, _) = errors(&graph(vec![
        task("A", 1, &[], &[]),
        task("B", 3, &["A"], &[]),
    ]));
    assert_has(
        &e,
        None,
        "level",
        "level 2 has no tasks; levels must be contiguous from 1",
    );
    assert_eq!(e.len(), 1, "{e:#?}");
    let (e, _) = errors(&graph(vec![task("A", 2, &[], &[])]));
    assert_has(&e, None, "level", "level 1 has no tasks");
    let (e, _) = errors(&graph(vec![
        task("A", 1, &[], &[]),
        task("B", 4_000_000_000, &["A"], &[]),
    ]));
    assert_has(&e, None, "level", "levels 2 to 3999999999 have no tasks");
}

#[test]
fn path_rules() {
    for good in [
        "src/a.rs",
        "a",
        ".github/workflows/ci.yml",
        ".gitignore",
        "a/.gitkeep",
        "x..y/z",
    ] {
        assert!(validate_file_path(good).is_ok(), "{good}");
    }
    for bad in [
        "",
        "/etc/passwd",
        "a//b",
        "./a",
        "a/./b",
        "../a",
        "a/..",
        "a/",
        "a\\b",
        ".git",
        ".git/config",
        "sub/.git/x",
        ".GIT/x",
    ] {
        assert!(validate_file_path(bad).is_err(), "{bad:?}");
    }
    // A read path may name a directory; create and modify paths may not.
    for good in ["src/", "zerg/performance/adapters/", "a.rs"] {
        assert!(validate_read_path(good).is_ok(), "{good}");
    }
    for bad in ["/", "//", "a//", "../", ".git/", "/abs/", "a/../"] {
        assert!(validate_read_path(bad).is_err(), "{bad:?}");
    }
    assert!(validate_file_path("src/").is_err());
    let mut t = task("T1", 1, &[], &["ok.rs", "/abs", "a//b"]);
    t["files"]["modify"] = json!(["../up"]);
    t["files"]["read"] = json!([".git/HEAD", "fine.md"]);
    let (e, _) = errors(&graph(vec![t]));
    assert_has(&e, Some("T1"), "files.create[1]", "relative");
    assert_has(&e, Some("T1"), "files.create[2]", "empty components");
    assert_has(&e, Some("T1"), "files.modify[0]", "normalised");
    assert_has(&e, Some("T1"), "files.read[0]", ".git");
    assert_eq!(e.len(), 4, "{e:#?}");
}

#[test]
fn same_level_shared_file_refused() {
    let mut b = task("B", 1, &[], &[]);
    b["files"]["modify"] = json!(["src/shared.rs"]);
    let (e, _) = errors(&graph(vec![task("A", 1, &[], &["src/shared.rs"]), b]));
    assert_has(
        &e,
        Some("B"),
        "files.modify[0]",
        "'src/shared.rs' is claimed (create/modify) by both A and B at level 1",
    );
    assert_eq!(e.len(), 1, "{e:#?}");
}

#[test]
fn cross_level_shared_file_and_shared_reads_accepted() {
    let mut b = task("B", 2, &["A"], &[]);
    b["files"]["modify"] = json!(["src/shared.rs"]);
    b["files"]["read"] = json!(["README.md"]);
    let mut c = task("C", 2, &["A"], &[]);
    c["files"]["read"] = json!(["README.md", "src/shared.rs"]);
    let v = ok(&graph(vec![task("A", 1, &[], &["src/shared.rs"]), b, c]));
    assert!(v.warnings.is_empty(), "{:?}", v.warnings);
}

#[test]
fn same_task_listing_path_twice_is_not_a_conflict() {
    let mut a = task("A", 1, &[], &["x.rs"]);
    a["files"]["modify"] = json!(["x.rs"]);
    ok(&graph(vec![a]));
}

#[test]
fn wrong_types_for_engine_fields_are_errors() {
    let t = json!({
        "id": "T1",
        "title": "t",
        "level": 1,
        "description": 5,
        "dependencies": "A",
        "files": {"create": "a.rs", "modify": [1], "read": []},
        "verification": {"timeout_seconds": 0},
    });
    let u = json!({
        "id": "T2", "title": "t", "level": 1, "files": [], "verification": "cargo test"
    });
    let w = json!({
        "id": "T3", "title": "t", "level": 1, "dependencies": ["T1", 2],
        "verification": {"command": 1, "timeout_seconds": "5"},
    });
    let (e, _) = errors(&graph(vec![t, u, w]));
    assert_has(&e, Some("T1"), "description", "must be a string");
    assert_has(&e, Some("T1"), "dependencies", "list of strings");
    assert_has(&e, Some("T1"), "files.create", "list of strings");
    assert_has(&e, Some("T1"), "files.modify[0]", "must be a string");
    assert_has(
        &e,
        Some("T1"),
        "verification.command",
        "missing required field",
    );
    assert_has(
        &e,
        Some("T1"),
        "verification.timeout_seconds",
        "positive integer",
    );
    assert_has(&e, Some("T2"), "files", "must be an object");
    assert_has(&e, Some("T2"), "verification", "must be an object");
    assert_has(&e, Some("T3"), "dependencies[1]", "must be a string");
    assert_has(&e, Some("T3"), "verification.command", "must be a string");
    assert_has(
        &e,
        Some("T3"),
        "verification.timeout_seconds",
        "positive integer",
    );
}

#[test]
fn informational_wrong_types_are_warnings() {
    let mut t = task("T1", 1, &[], &[]);
    t["estimate_minutes"] = json!("ten");
    t["consumers"] = json!("T2");
    t["integration_test"] = json!(3);
    t["context"] = json!(["x"]);
    t["acceptance_criteria"] = json!([1]);
    let mut g = graph(vec![t]);
    g["version"] = json!(2.0);
    let v = ok(&g);
    let w = &v.warnings;
    assert_has(w, Some("T1"), "estimate_minutes", "ignored");
    assert_has(w, Some("T1"), "consumers", "list of strings");
    assert_has(w, Some("T1"), "integration_test", "should be a string");
    assert_has(w, Some("T1"), "context", "should be a string");
    assert_has(w, Some("T1"), "acceptance_criteria[0]", "must be a string");
    assert_has(w, None, "version", "should be a string");
    let t = &v.graph.tasks[0];
    assert_eq!(
        (
            t.estimate_minutes,
            t.context.clone(),
            v.graph.version.clone()
        ),
        (None, None, None)
    );
    assert!(t.consumers.is_empty() && t.acceptance_criteria.is_empty());
}

#[test]
fn informational_fields_read_when_well_typed() {
    let mut t = task("T1", 1, &[], &[]);
    t["estimate_minutes"] = json!(20);
    t["context"] = json!("ctx");
    t["acceptance_criteria"] = json!("works");
    let v = ok(&graph(vec![t]));
    let t = &v.graph.tasks[0];
    assert_eq!(t.estimate_minutes, Some(20));
    assert_eq!(t.context.as_deref(), Some("ctx"));
    assert_eq!(t.acceptance_criteria, vec!["works"]);
}

#[test]
fn consumers_without_integration_test_warns() {
    let mut tasks = small();
    tasks[0]["consumers"] = json!(["A-L2-001"]);
    tasks[1]["consumers"] = json!(["A-L2-001"]);
    tasks[1]["integration_test"] = json!("tests/it.rs");
    let v = ok(&graph(tasks));
    assert_eq!(v.warnings.len(), 1, "{:?}", v.warnings);
    assert_has(
        &v.warnings,
        Some("A-L1-001"),
        "integration_test",
        "consumers but no integration_test",
    );
    let mut tasks = small();
    tasks[0]["consumers"] = json!(["A-L2-001"]);
    tasks[0]["integration_test"] = json!("");
    assert_has(
        &ok(&graph(tasks)).warnings,
        Some("A-L1-001"),
        "integration_test",
        "no integration_test",
    );
}

#[test]
fn unknown_consumer_warns() {
    let mut tasks = small();
    tasks[0]["consumers"] = json!(["GHOST"]);
    tasks[0]["integration_test"] = json!("tests/it.rs");
    let v = ok(&graph(tasks));
    assert_has(
        &v.warnings,
        Some("A-L1-001"),
        "consumers",
        "consumer 'GHOST' does not exist",
    );
    assert_eq!(v.warnings.len(), 1, "{:?}", v.warnings);
}

#[test]
fn unreachable_task_warns() {
    let v = ok(&graph(vec![
        task("A", 1, &[], &[]),
        task("B", 2, &["A"], &[]),
        task("C", 2, &[], &[]),
    ]));
    assert_has(&v.warnings, Some("C"), "dependencies", "unreachable");
    assert!(!has(&v.warnings, Some("B"), "dependencies", "unreachable"));
    assert_eq!(v.warnings.len(), 1, "{:?}", v.warnings);
}

#[test]
fn orphan_task_warns() {
    let tasks = vec![
        task("A", 1, &[], &[]),
        task("B", 2, &["A"], &[]),
        task("C", 2, &["A"], &[]),
        task("D", 3, &["B"], &[]),
    ];
    let v = ok(&graph(tasks));
    assert_has(&v.warnings, Some("C"), "consumers", "orphan");
    assert_eq!(v.warnings.len(), 1, "{:?}", v.warnings);
    // With consumers, C is not an orphan (and has an integration test, so no other warning).
    let mut tasks = vec![
        task("A", 1, &[], &[]),
        task("B", 2, &["A"], &[]),
        task("C", 2, &["A"], &[]),
        task("D", 3, &["B"], &[]),
    ];
    tasks[2]["consumers"] = json!(["D"]);
    tasks[2]["integration_test"] = json!("tests/c.rs");
    assert!(ok(&graph(tasks)).warnings.is_empty());
}

#[test]
fn levels_object_checked() {
    let mut g = graph(small());
    g["levels"] = json!({
        "1": {"name": "foundation", "tasks": ["A-L1-001", "A-L1-002"]},
        "2": {"tasks": ["A-L2-001", "NOPE"]},
        "3": {"name": 4, "tasks": "x"},
        "x": {"name": "n", "tasks": []},
    });
    let (e, _) = errors(&g);
    assert_has(&e, None, "levels.2.name", "missing required field");
    assert_has(&e, None, "levels.2.tasks[1]", "task 'NOPE' does not exist");
    assert_has(&e, None, "levels.3.name", "must be a string");
    assert_has(&e, None, "levels.3.tasks", "list of strings");
    assert_has(&e, None, "levels.x", "level number");
    assert_eq!(e.len(), 5, "{e:#?}");
    let mut g = graph(small());
    g["levels"] = json!([]);
    assert_has(&errors(&g).0, None, "levels", "must be an object");
    let mut g = graph(small());
    g["levels"] = json!({
        "1": {"name": "foundation", "tasks": ["A-L1-001", "A-L1-002"]},
        "2": {"name": "core", "tasks": ["A-L2-001"]},
    });
    assert!(ok(&g).warnings.is_empty());
}

#[test]
fn multiple_errors_reported_at_once() {
    let mut bad = task("B", 2, &["A", "GHOST"], &["/abs"]);
    bad["title"] = json!(null);
    let mut g = graph(vec![
        task("A", 1, &[], &["x"]),
        bad,
        task("C", 1, &[], &["x"]),
        task("T1.1", 4, &[], &[]),
    ]);
    g["feature"] = json!("");
    let (e, _) = errors(&g);
    assert_has(&e, None, "feature", "must not be empty");
    assert_has(&e, Some("B"), "title", "non-empty string");
    assert_has(&e, Some("B"), "dependencies", "'GHOST' does not exist");
    assert_has(&e, Some("B"), "files.create[0]", "relative");
    assert_has(&e, Some("C"), "files.create[0]", "both A and C");
    assert_has(&e, Some("tasks[3]"), "id", "T1.1");
    assert_has(&e, None, "level", "level 3 has no tasks");
    assert_eq!(e.len(), 7, "{e:#?}");
    let err = run(&g).unwrap_err();
    assert_eq!(
        err.to_string(),
        "task-graph.json: task graph is invalid (7 errors)"
    );
}

#[test]
fn diagnostic_display() {
    let d = Diagnostic {
        task: Some("A-L1-001".into()),
        field: "dependencies".into(),
        message: "dependency 'X' does not exist".into(),
    };
    assert_eq!(
        d.to_string(),
        "task A-L1-001, field `dependencies`: dependency 'X' does not exist"
    );
    let d = Diagnostic {
        task: None,
        field: "feature".into(),
        message: "missing required field".into(),
    };
    assert_eq!(d.to_string(), "field `feature`: missing required field");
}

#[test]
fn level_from_id_parses_first_marker() {
    assert_eq!(level_from_id("RES-L2-001"), Some(2));
    assert_eq!(level_from_id("A-L10-x"), Some(10));
    assert_eq!(level_from_id("T1"), None);
    assert_eq!(level_from_id("A-L-1-L3-x"), Some(3));
    assert_eq!(level_from_id("A-L2"), None);
    assert_eq!(level_from_id("AL2-x"), None);
    assert_eq!(level_from_id("X-L99999999999-L4-y"), Some(4));
}

/// The 12-task, 3-level graph used by several tests.
fn realistic() -> Value {
    let mut tasks = Vec::new();
    for i in 1..=4 {
        let mut t = task(
            &format!("AUTH-L1-00{i}"),
            1,
            &[],
            &[&format!("src/auth/m{i}.rs")],
        );
        t["files"]["modify"] = json!(
            ["Cargo.toml"]
                .iter()
                .take(usize::from(i == 1))
                .collect::<Vec<_>>()
        );
        t["estimate_minutes"] = json!(10 + i);
        t["phase"] = json!("foundation");
        tasks.push(t);
    }
    for i in 1..=4 {
        let deps = [format!("AUTH-L1-00{i}"), "AUTH-L1-001".to_owned()];
        let deps: Vec<&str> = deps
            .iter()
            .map(String::as_str)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut t = task(
            &format!("AUTH-L2-00{i}"),
            2,
            &deps,
            &[&format!("src/core/c{i}.rs")],
        );
        // Modify a file that a level-1 task created: allowed across levels.
        t["files"]["modify"] = json!([format!("src/auth/m{i}.rs")]);
        t["files"]["read"] = json!(["Cargo.toml", "src/auth/m1.rs"]);
        t["consumers"] = json!([format!("AUTH-L3-00{i}")]);
        t["integration_test"] = json!(format!("tests/c{i}.rs"));
        t["acceptance_criteria"] = json!(["compiles", "tests pass"]);
        tasks.push(t);
    }
    for i in 1..=4 {
        let mut t = task(
            &format!("AUTH-L3-00{i}"),
            3,
            &[&format!("AUTH-L2-00{i}")],
            &[&format!("tests/c{i}.rs")],
        );
        t["files"]["modify"] = json!(
            ["Cargo.toml"]
                .iter()
                .take(usize::from(i == 4))
                .collect::<Vec<_>>()
        );
        t["context"] = json!("scoped context");
        tasks.push(t);
    }
    let mut g = graph(tasks);
    g["levels"] = json!({
        "1": {"name": "foundation",
              "tasks": ["AUTH-L1-001", "AUTH-L1-002", "AUTH-L1-003", "AUTH-L1-004"]},
        "2": {"name": "core",
              "tasks": ["AUTH-L2-001", "AUTH-L2-002", "AUTH-L2-003", "AUTH-L2-004"]},
        "3": {"name": "integration",
              "tasks": ["AUTH-L3-001", "AUTH-L3-002", "AUTH-L3-003", "AUTH-L3-004"]},
    });
    g
}

#[test]
fn realistic_twelve_task_graph_is_valid() {
    let v = ok(&realistic());
    assert!(v.warnings.is_empty(), "{:?}", v.warnings);
    let g = &v.graph;
    assert_eq!(g.tasks.len(), 12);
    assert_eq!(g.max_level(), 3);
    let levels = g.levels();
    assert_eq!(levels.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3]);
    assert!(levels.values().all(|ts| ts.len() == 4));
    assert_eq!(levels[&2][0].id, "AUTH-L2-001");
    for t in &g.tasks {
        assert_eq!(level_from_id(&t.id), Some(t.level));
    }
    assert_eq!(
        g.task("AUTH-L2-003").unwrap().dependencies,
        vec!["AUTH-L1-001", "AUTH-L1-003"]
    );
    assert!(g.task("NOPE").is_none());
}

#[test]
fn dependents_closure_is_transitive_and_ordered() {
    let v = ok(&realistic());
    let g = &v.graph;
    assert_eq!(
        g.dependents_closure("AUTH-L1-001"),
        vec![
            "AUTH-L2-001",
            "AUTH-L2-002",
            "AUTH-L2-003",
            "AUTH-L2-004",
            "AUTH-L3-001",
            "AUTH-L3-002",
            "AUTH-L3-003",
            "AUTH-L3-004"
        ]
    );
    assert_eq!(
        g.dependents_closure("AUTH-L1-002"),
        vec!["AUTH-L2-002", "AUTH-L3-002"]
    );
    assert!(g.dependents_closure("AUTH-L3-001").is_empty());
    assert!(g.dependents_closure("NOPE").is_empty());
}

#[test]
fn byte_order_mark_is_accepted() {
    let mut bytes = b"\xEF\xBB\xBF".to_vec();
    bytes.extend(graph(small()).to_string().into_bytes());
    assert!(parse(&bytes, Path::new("g.json")).is_ok());
}

#[test]
fn graphs_that_read_whole_directories_are_accepted() {
    // As the original's design step writes them.
    let mut a = task("PERF-L1-001", 1, &[], &["zerg/performance/report.md"]);
    a["files"]["read"] = json!(["zerg/", "zerg/performance/adapters/"]);
    let v = ok(&graph(vec![a]));
    assert_eq!(
        v.graph.tasks[0].files.read,
        vec!["zerg/", "zerg/performance/adapters/"]
    );
    // Creating or modifying a directory is still refused, with the field named.
    let mut b = task("PERF-L1-002", 1, &[], &["src/"]);
    b["files"]["modify"] = json!(["lib/"]);
    match run(&graph(vec![b])) {
        Err(GraphError::Invalid { errors, .. }) => {
            assert_has(
                &errors,
                Some("PERF-L1-002"),
                "files.create[0]",
                "must not end with '/'",
            );
            assert_has(
                &errors,
                Some("PERF-L1-002"),
                "files.modify[0]",
                "must not end with '/'",
            );
        }
        other => panic!("expected invalid, got {other:?}"),
    }
}

#[test]
fn cycle_reports_are_capped_and_the_rest_counted() {
    // Twelve separate two-task cycles: ten are listed, two counted.
    let mut tasks = Vec::new();
    for i in 0..12 {
        tasks.push(task(&format!("A{i}"), 1, &[&format!("B{i}")], &[]));
        tasks.push(task(&format!("B{i}"), 1, &[&format!("A{i}")], &[]));
    }
    let (e, _) = errors(&graph(tasks));
    let listed = e
        .iter()
        .filter(|d| d.message.starts_with("dependency cycle"))
        .count();
    assert_eq!(listed, MAX_REPORTED_CYCLES);
    assert_has(
        &e,
        None,
        "tasks",
        "2 more dependency cycles were found and are not listed",
    );
}

#[test]
fn long_cycles_are_shortened_in_the_middle() {
    let n = 30;
    let tasks: Vec<Value> = (0..n)
        .map(|i| task(&format!("T{i}"), 1, &[&format!("T{}", (i + 1) % n)], &[]))
        .collect();
    let (e, _) = errors(&graph(tasks));
    let cycle = e
        .iter()
        .find(|d| d.message.starts_with("dependency cycle"))
        .expect("the cycle is reported");
    assert_eq!(cycle.task.as_deref(), Some("T0"));
    assert_eq!(
        cycle.message,
        "dependency cycle of 30 tasks: T0 -> T1 -> T2 -> T3 -> T4 -> T5 -> T6 -> T7 -> T8 -> T9 \
         -> ... (10 more tasks) ... -> T20 -> T21 -> T22 -> T23 -> T24 -> T25 -> T26 -> T27 -> T28 \
         -> T29 -> T0"
    );
}
