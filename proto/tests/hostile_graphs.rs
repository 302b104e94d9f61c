//! Hostile task graphs, table-driven: each one is refused, the diagnostic names the field that
//! is wrong, and nothing panics. A second table holds near misses that must still be accepted,
//! so the rules do not drift into refusing legitimate graphs.

use std::path::Path;

use serde_json::{Value, json};
use zerg_proto::graph::{Diagnostic, GraphError, parse};

/// What a refusal must say.
enum Expect {
    /// Not JSON at all: a syntax error with a position.
    Syntax,
    /// An error diagnostic about this task (`None` for the graph) and exactly this field.
    Field(Option<&'static str>, &'static str),
}

/// A valid task: level 1, no dependencies, one created file, a verification command.
fn task(id: &str) -> Value {
    json!({
        "id": id,
        "title": format!("Task {id}"),
        "description": "does things",
        "level": 1,
        "dependencies": [],
        "files": {"create": [format!("src/{}.rs", id.to_lowercase())], "modify": [], "read": []},
        "verification": {"command": "cargo test", "timeout_seconds": 60},
    })
}

fn graph(tasks: Vec<Value>) -> Value {
    json!({"feature": "auth", "version": "2.0", "tasks": tasks})
}

/// A graph of one valid task `T1` with `key` set to `value` (a dotted key reaches into
/// `files` or `verification`).
fn one_task_with(key: &str, value: Value) -> Vec<u8> {
    let mut t = task("T1");
    match key.split_once('.') {
        Some((outer, inner)) => t[outer][inner] = value,
        None => t[key] = value,
    }
    graph(vec![t]).to_string().into_bytes()
}

/// A graph whose single task has `id` (so diagnostics name it `tasks[0]`).
fn id_case(id: Value) -> Vec<u8> {
    one_task_with("id", id)
}

fn with_feature(feature: Value) -> Vec<u8> {
    let mut g = graph(vec![task("T1")]);
    g["feature"] = feature;
    g.to_string().into_bytes()
}

fn bytes(v: Value) -> Vec<u8> {
    v.to_string().into_bytes()
}

/// Every hostile graph, with what its refusal must name.
fn cases() -> Vec<(&'static str, Vec<u8>, Expect)> {
    use Expect::{Field, Syntax};
    let t0 = Some("tasks[0]");
    let t1 = Some("T1");
    let chain = |deps_a: &[&str], level_b: u32, deps_b: &[&str]| {
        let mut a = task("A");
        a["dependencies"] = json!(deps_a);
        let mut b = task("B");
        b["level"] = json!(level_b);
        b["dependencies"] = json!(deps_b);
        bytes(graph(vec![a, b]))
    };
    vec![
        // The document itself.
        ("not JSON", b"hello, world".to_vec(), Syntax),
        ("empty file", Vec::new(), Syntax),
        (
            "truncated JSON",
            br#"{"feature": "auth", "tasks": ["#.to_vec(),
            Syntax,
        ),
        (
            "invalid UTF-8 in a string",
            b"{\"feature\": \"a\xff\xfeb\", \"tasks\": []}".to_vec(),
            Syntax,
        ),
        (
            "100k nested arrays",
            "[".repeat(100_000).into_bytes(),
            Syntax,
        ),
        (
            "100k nested objects",
            "{\"a\":".repeat(100_000).into_bytes(),
            Syntax,
        ),
        (
            "deeply nested title",
            format!(
                r#"{{"feature":"auth","tasks":[{{"id":"T1","title":{}1{},"level":1}}]}}"#,
                "[".repeat(10_000),
                "]".repeat(10_000)
            )
            .into_bytes(),
            Syntax,
        ),
        (
            "JSON array at top",
            bytes(json!([task("T1")])),
            Field(None, ""),
        ),
        ("JSON string at top", bytes(json!("graph")), Field(None, "")),
        ("JSON null at top", b"null".to_vec(), Field(None, "")),
        // feature
        (
            "missing feature",
            bytes(json!({"tasks": [task("T1")]})),
            Field(None, "feature"),
        ),
        (
            "feature not a string",
            with_feature(json!(7)),
            Field(None, "feature"),
        ),
        (
            "empty feature",
            with_feature(json!("")),
            Field(None, "feature"),
        ),
        (
            "feature with /",
            with_feature(json!("a/b")),
            Field(None, "feature"),
        ),
        (
            "feature ..",
            with_feature(json!("..")),
            Field(None, "feature"),
        ),
        (
            "feature with ..",
            with_feature(json!("a..b")),
            Field(None, "feature"),
        ),
        (
            "feature with a space",
            with_feature(json!("user auth")),
            Field(None, "feature"),
        ),
        (
            "feature starting with -",
            with_feature(json!("-rf")),
            Field(None, "feature"),
        ),
        (
            "feature with NUL",
            with_feature(json!("auth\u{0}x")),
            Field(None, "feature"),
        ),
        (
            "feature with unicode",
            with_feature(json!("authé")),
            Field(None, "feature"),
        ),
        (
            "feature ending in .lock",
            with_feature(json!("auth.lock")),
            Field(None, "feature"),
        ),
        (
            "feature of 101 characters",
            with_feature(json!("a".repeat(101))),
            Field(None, "feature"),
        ),
        // tasks
        (
            "missing tasks",
            bytes(json!({"feature": "auth"})),
            Field(None, "tasks"),
        ),
        (
            "tasks an object",
            bytes(json!({"feature": "auth", "tasks": {"T1": task("T1")}})),
            Field(None, "tasks"),
        ),
        (
            "tasks a string",
            bytes(json!({"feature": "auth", "tasks": "T1"})),
            Field(None, "tasks"),
        ),
        ("tasks empty", bytes(graph(vec![])), Field(None, "tasks")),
        (
            "task not an object",
            bytes(graph(vec![json!(42)])),
            Field(None, "tasks[0]"),
        ),
        (
            "task a list",
            bytes(graph(vec![task("T1"), json!(["T2"])])),
            Field(None, "tasks[1]"),
        ),
        // id
        (
            "missing id",
            bytes(graph(vec![json!({"title": "t", "level": 1})])),
            Field(t0, "id"),
        ),
        ("id not a string", id_case(json!(1)), Field(t0, "id")),
        ("id null", id_case(json!(null)), Field(t0, "id")),
        ("empty id", id_case(json!("")), Field(t0, "id")),
        ("id with /", id_case(json!("T1/../x")), Field(t0, "id")),
        ("id ..", id_case(json!("..")), Field(t0, "id")),
        ("id with ..", id_case(json!("T..1")), Field(t0, "id")),
        ("id with a space", id_case(json!("T 1")), Field(t0, "id")),
        ("id with NUL", id_case(json!("T\u{0}1")), Field(t0, "id")),
        ("id with newline", id_case(json!("T1\nT2")), Field(t0, "id")),
        (
            "id with unicode",
            id_case(json!("Tâche-1")),
            Field(t0, "id"),
        ),
        (
            "id with a right-to-left override",
            id_case(json!("T1\u{202e}")),
            Field(t0, "id"),
        ),
        (
            "id starting with a digit",
            id_case(json!("1T")),
            Field(t0, "id"),
        ),
        ("id starting with -", id_case(json!("-T1")), Field(t0, "id")),
        ("id with a dot", id_case(json!("T1.1")), Field(t0, "id")),
        (
            "id with a shell ;",
            id_case(json!("T1;rm")),
            Field(t0, "id"),
        ),
        (
            "id of 65 characters",
            id_case(json!("T".repeat(65))),
            Field(t0, "id"),
        ),
        (
            "id of 10 KB",
            id_case(json!("T".repeat(10_240))),
            Field(t0, "id"),
        ),
        (
            "duplicate ids",
            bytes(graph(vec![task("T1"), {
                let mut t = task("T1");
                t["files"]["create"] = json!(["src/other.rs"]);
                t
            }])),
            Field(t1, "id"),
        ),
        // title and the other text that reaches the agent's command line
        (
            "missing title",
            bytes(graph(vec![json!({"id": "T1", "level": 1})])),
            Field(t1, "title"),
        ),
        (
            "empty title",
            one_task_with("title", json!("")),
            Field(t1, "title"),
        ),
        (
            "blank title",
            one_task_with("title", json!(" \t\n")),
            Field(t1, "title"),
        ),
        (
            "title a number",
            one_task_with("title", json!(5)),
            Field(t1, "title"),
        ),
        (
            "title with NUL",
            one_task_with("title", json!("Build\u{0}it")),
            Field(t1, "title"),
        ),
        (
            "description a list",
            one_task_with("description", json!(["x"])),
            Field(t1, "description"),
        ),
        (
            "description with NUL",
            one_task_with("description", json!("a\u{0}b")),
            Field(t1, "description"),
        ),
        (
            "context with NUL",
            one_task_with("context", json!("scoped\u{0}")),
            Field(t1, "context"),
        ),
        (
            "acceptance criterion with NUL",
            one_task_with("acceptance_criteria", json!(["ok", "no\u{0}"])),
            Field(t1, "acceptance_criteria[1]"),
        ),
        (
            "single acceptance criterion with NUL",
            one_task_with("acceptance_criteria", json!("\u{0}")),
            Field(t1, "acceptance_criteria"),
        ),
        // level
        (
            "missing level",
            bytes(graph(vec![json!({"id": "T1", "title": "t"})])),
            Field(t1, "level"),
        ),
        (
            "level 0",
            one_task_with("level", json!(0)),
            Field(t1, "level"),
        ),
        (
            "negative level",
            one_task_with("level", json!(-1)),
            Field(t1, "level"),
        ),
        (
            "level as string",
            one_task_with("level", json!("1")),
            Field(t1, "level"),
        ),
        (
            "fractional level",
            one_task_with("level", json!(1.5)),
            Field(t1, "level"),
        ),
        (
            "level null",
            one_task_with("level", json!(null)),
            Field(t1, "level"),
        ),
        (
            "level past u32",
            one_task_with("level", json!(4_294_967_296u64)),
            Field(t1, "level"),
        ),
        (
            "level 1e300",
            br#"{"feature":"auth","tasks":[{"id":"T1","title":"t","level":1e300}]}"#.to_vec(),
            Field(t1, "level"),
        ),
        (
            "levels not contiguous",
            chain(&[], 3, &["A"]),
            Field(None, "level"),
        ),
        (
            "no level 1",
            one_task_with("level", json!(2)),
            Field(None, "level"),
        ),
        // dependencies
        (
            "dependency on an unknown task",
            chain(&[], 2, &["A", "GHOST"]),
            Field(Some("B"), "dependencies"),
        ),
        (
            "self-dependency",
            one_task_with("dependencies", json!(["T1"])),
            Field(t1, "dependencies"),
        ),
        (
            "cycle",
            chain(&["B"], 1, &["A"]),
            Field(Some("A"), "dependencies"),
        ),
        (
            "same-level dependency",
            chain(&[], 1, &["A"]),
            Field(Some("B"), "dependencies"),
        ),
        (
            "dependency on a higher level",
            chain(&["B"], 2, &[]),
            Field(Some("A"), "dependencies"),
        ),
        (
            "dependencies a string",
            one_task_with("dependencies", json!("A")),
            Field(t1, "dependencies"),
        ),
        (
            "dependency not a string",
            one_task_with("dependencies", json!([{"id": "A"}])),
            Field(t1, "dependencies[0]"),
        ),
        // files
        (
            "files a list",
            one_task_with("files", json!(["src/a.rs"])),
            Field(t1, "files"),
        ),
        (
            "files.create a string",
            one_task_with("files.create", json!("src/a.rs")),
            Field(t1, "files.create"),
        ),
        (
            "files.read element not a string",
            one_task_with("files.read", json!(["a", 3])),
            Field(t1, "files.read[1]"),
        ),
        (
            "create absolute path",
            one_task_with("files.create", json!(["/etc/passwd"])),
            Field(t1, "files.create[0]"),
        ),
        (
            "create .. traversal",
            one_task_with("files.create", json!(["src/../../outside.rs"])),
            Field(t1, "files.create[0]"),
        ),
        (
            "modify .. at the start",
            one_task_with("files.modify", json!(["../sibling/Cargo.toml"])),
            Field(t1, "files.modify[0]"),
        ),
        (
            "modify a .git file",
            one_task_with("files.modify", json!([".git/config"])),
            Field(t1, "files.modify[0]"),
        ),
        (
            "create a git hook, upper case",
            one_task_with("files.create", json!(["ok.rs", ".GIT/hooks/pre-commit"])),
            Field(t1, "files.create[1]"),
        ),
        (
            "create inside a nested .git",
            one_task_with("files.create", json!(["vendor/lib/.git/HEAD"])),
            Field(t1, "files.create[0]"),
        ),
        (
            "path with NUL",
            one_task_with("files.create", json!(["src/a\u{0}.rs"])),
            Field(t1, "files.create[0]"),
        ),
        (
            "path with newline",
            one_task_with("files.modify", json!(["src/a.rs\nsrc/b.rs"])),
            Field(t1, "files.modify[0]"),
        ),
        (
            "create path ending in /",
            one_task_with("files.create", json!(["src/"])),
            Field(t1, "files.create[0]"),
        ),
        (
            "modify path ending in /",
            one_task_with("files.modify", json!(["lib/"])),
            Field(t1, "files.modify[0]"),
        ),
        (
            "empty path",
            one_task_with("files.create", json!([""])),
            Field(t1, "files.create[0]"),
        ),
        (
            "path with //",
            one_task_with("files.create", json!(["src//a.rs"])),
            Field(t1, "files.create[0]"),
        ),
        (
            "path with ./",
            one_task_with("files.create", json!(["./src/a.rs"])),
            Field(t1, "files.create[0]"),
        ),
        (
            "path with backslashes",
            one_task_with("files.create", json!(["..\\..\\windows"])),
            Field(t1, "files.create[0]"),
        ),
        (
            "read absolute directory",
            one_task_with("files.read", json!(["/etc/"])),
            Field(t1, "files.read[0]"),
        ),
        (
            "read the root",
            one_task_with("files.read", json!(["/"])),
            Field(t1, "files.read[0]"),
        ),
        (
            "read .. directory",
            one_task_with("files.read", json!(["docs/", "../secrets/"])),
            Field(t1, "files.read[1]"),
        ),
        (
            "read .git directory",
            one_task_with("files.read", json!([".git/"])),
            Field(t1, "files.read[0]"),
        ),
        (
            "read path ending in //",
            one_task_with("files.read", json!(["src//"])),
            Field(t1, "files.read[0]"),
        ),
        (
            "same file owned twice in a level",
            bytes(graph(vec![task("A"), {
                let mut b = task("B");
                b["files"]["modify"] = json!(["src/a.rs"]);
                b
            }])),
            Field(Some("B"), "files.modify[0]"),
        ),
        // verification
        (
            "verification a string",
            one_task_with("verification", json!("cargo test")),
            Field(t1, "verification"),
        ),
        (
            "verification.command not a string",
            one_task_with("verification.command", json!(["cargo", "test"])),
            Field(t1, "verification.command"),
        ),
        (
            "verification.command missing",
            one_task_with("verification", json!({"timeout_seconds": 5})),
            Field(t1, "verification.command"),
        ),
        (
            "verification.command blank",
            one_task_with("verification.command", json!("  ")),
            Field(t1, "verification.command"),
        ),
        (
            "verification.command with NUL",
            one_task_with("verification.command", json!("true\u{0}; rm -rf /")),
            Field(t1, "verification.command"),
        ),
        (
            "timeout negative",
            one_task_with("verification.timeout_seconds", json!(-5)),
            Field(t1, "verification.timeout_seconds"),
        ),
        (
            "timeout zero",
            one_task_with("verification.timeout_seconds", json!(0)),
            Field(t1, "verification.timeout_seconds"),
        ),
        (
            "timeout huge (1e30)",
            br#"{"feature":"auth","tasks":[{"id":"T1","title":"t","level":1,
                "verification":{"command":"true","timeout_seconds":1e30}}]}"#
                .to_vec(),
            Field(t1, "verification.timeout_seconds"),
        ),
        (
            "timeout past u64",
            br#"{"feature":"auth","tasks":[{"id":"T1","title":"t","level":1,
                "verification":{"command":"true","timeout_seconds":18446744073709551616}}]}"#
                .to_vec(),
            Field(t1, "verification.timeout_seconds"),
        ),
        (
            "timeout as string",
            one_task_with("verification.timeout_seconds", json!("60")),
            Field(t1, "verification.timeout_seconds"),
        ),
        // the optional levels object
        (
            "levels a list",
            {
                let mut g = graph(vec![task("T1")]);
                g["levels"] = json!([1]);
                bytes(g)
            },
            Field(None, "levels"),
        ),
        (
            "levels key 0",
            {
                let mut g = graph(vec![task("T1")]);
                g["levels"] = json!({"0": {"name": "n", "tasks": ["T1"]}});
                bytes(g)
            },
            Field(None, "levels.0"),
        ),
        (
            "levels naming an unknown task",
            {
                let mut g = graph(vec![task("T1")]);
                g["levels"] = json!({"1": {"name": "n", "tasks": ["T1", "GHOST"]}});
                bytes(g)
            },
            Field(None, "levels.1.tasks[1]"),
        ),
    ]
}

fn diagnostics_summary(errors: &[Diagnostic]) -> String {
    let shown: Vec<String> = errors
        .iter()
        .take(5)
        .map(|d| {
            let mut s = d.to_string();
            s.truncate(200);
            s
        })
        .collect();
    format!("{} errors, first: {shown:#?}", errors.len())
}

#[test]
fn every_hostile_graph_is_refused_naming_the_field() {
    let cases = cases();
    assert!(cases.len() >= 25, "only {} cases", cases.len());
    let mut failures = Vec::new();
    for (name, input, expect) in &cases {
        let result = parse(input, Path::new("task-graph.json"));
        let problem = match (expect, result) {
            (_, Ok(v)) => Some(format!(
                "accepted (warnings: {:?})",
                v.warnings
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
            )),
            // serde_json counts lines from 1; an empty file fails at column 0 of line 1.
            (Expect::Syntax, Err(GraphError::Syntax { line, column, .. })) => {
                (line == 0).then(|| format!("no position: {line}:{column}"))
            }
            (Expect::Field(task, field), Err(GraphError::Invalid { errors, .. })) => {
                let found = errors
                    .iter()
                    .find(|d| d.task.as_deref() == *task && d.field == *field);
                match found {
                    None => Some(format!(
                        "no error for ({task:?}, {field:?}); {}",
                        diagnostics_summary(&errors)
                    )),
                    // The rendered diagnostic names the field (and the task), as a user sees it.
                    Some(d)
                        if !field.is_empty() && !d.to_string().contains(&format!("`{field}`")) =>
                    {
                        Some(format!("rendered without the field: {d}"))
                    }
                    Some(d) if task.is_some_and(|t| !d.to_string().contains(t)) => {
                        Some(format!("rendered without the task: {d}"))
                    }
                    Some(_) => None,
                }
            }
            (_, Err(other)) => Some(format!("wrong kind of error: {other}")),
        };
        if let Some(problem) = problem {
            failures.push(format!("{name}: {problem}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn syntax_errors_name_the_file_and_position() {
    let err = parse(
        b"{\n  \"feature\": auth\n}",
        Path::new("specs/x/task-graph.json"),
    )
    .expect_err("not JSON");
    assert!(
        err.to_string().starts_with("specs/x/task-graph.json:2:"),
        "{err}"
    );
}

/// Inputs close to the hostile ones that are legitimate and must stay accepted.
#[test]
fn near_misses_are_accepted() {
    let dir_reads = |read: Value| {
        let mut t = task("PERF-L1-001");
        t["files"]["read"] = read;
        graph(vec![t])
    };
    let ok: Vec<(&str, Value)> = vec![
        ("read one directory: zerg/", dir_reads(json!(["zerg/"]))),
        (
            "read a nested directory: zerg/performance/adapters/",
            dir_reads(json!(["zerg/performance/adapters/"])),
        ),
        (
            "read both directory forms and a file",
            dir_reads(json!(["zerg/", "zerg/performance/adapters/", "README.md"])),
        ),
        (
            "dot files that are not .git",
            one_task_value(
                "files",
                json!({"create": [".github/workflows/ci.yml", ".gitignore", "a/.gitkeep"]}),
            ),
        ),
        (
            "dots inside a name",
            one_task_value("files", json!({"create": ["x..y/z...rs"]})),
        ),
        (
            "unicode in titles, descriptions and paths",
            one_task_value(
                "files",
                json!({"create": ["docs/résumé.md"], "read": ["docs/日本語/"]}),
            )
            .pipe(|mut g| {
                g["tasks"][0]["title"] = json!("Écrire la doc 📝");
                g["tasks"][0]["description"] = json!("Line one\nline two\ttabbed");
                g
            }),
        ),
        (
            "a 100,000-character title",
            one_task_value("title", json!("x".repeat(100_000))),
        ),
        ("a 64-character id and a 100-character feature", {
            let id = format!("T{}", "x".repeat(63));
            let mut g = graph(vec![task(&id)]);
            g["feature"] = json!("f".repeat(100));
            g
        }),
        (
            "the largest timeout",
            one_task_value(
                "verification",
                json!({"command": "true", "timeout_seconds": u64::MAX}),
            ),
        ),
        (
            "explicit nulls for optional fields",
            one_task_value("verification", json!(null)).pipe(|mut g| {
                g["tasks"][0]["files"] = json!(null);
                g["tasks"][0]["dependencies"] = json!(null);
                g["tasks"][0]["description"] = json!(null);
                g
            }),
        ),
    ];
    for (name, g) in ok {
        if let Err(e) = parse(g.to_string().as_bytes(), Path::new("task-graph.json")) {
            let detail = match &e {
                GraphError::Invalid { errors, .. } => diagnostics_summary(errors),
                other => other.to_string(),
            };
            panic!("{name}: refused: {detail}");
        }
    }
}

/// A one-task graph with `key` of the task replaced by `value`.
fn one_task_value(key: &str, value: Value) -> Value {
    let mut t = task("T1");
    t[key] = value;
    graph(vec![t])
}

/// `x.pipe(f)` is `f(x)`: keeps the table above readable.
trait Pipe: Sized {
    fn pipe(self, f: impl FnOnce(Self) -> Self) -> Self {
        f(self)
    }
}

impl Pipe for Value {}
