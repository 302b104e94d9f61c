//! Property tests of the task-graph validator: whatever the bytes, it returns instead of
//! panicking; a generated valid graph is accepted and read back as written; and one field
//! set to a bad value refuses the graph with an error that names that field.

use std::path::Path;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::Config;
use serde_json::{Value, json};
use zerg_proto::graph::{GraphError, parse};

/// `cases` cases, or `PROPTEST_CASES` when it is set (for a longer run by hand).
fn config(cases: u32) -> Config {
    Config {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(cases),
        // Shrunk failures are printed; no regression files are written into the tree.
        failure_persistence: None,
        ..Config::default()
    }
}

fn run(bytes: &[u8]) -> Result<zerg_proto::graph::Validated, GraphError> {
    parse(bytes, Path::new("task-graph.json"))
}

/// Every outcome is well formed: a syntax error has a position, a refusal at least one error.
fn check_outcome(result: &Result<zerg_proto::graph::Validated, GraphError>) {
    match result {
        Ok(_) => {}
        Err(GraphError::Syntax { line, .. }) => assert!(*line >= 1),
        Err(GraphError::Invalid { errors, .. }) => {
            assert!(!errors.is_empty());
            assert!(errors.iter().all(|d| !d.to_string().is_empty()));
        }
        Err(GraphError::Io { .. }) => panic!("parse does no I/O"),
    }
}

// ------------------------------------------------------------------------------------------
// Arbitrary input
// ------------------------------------------------------------------------------------------

/// Text made of JSON tokens, many of them the graph's own keys and typical bad values, so that
/// a good share of it parses as JSON and reaches the validator proper.
fn json_ish() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("{"),
        Just("}"),
        Just("["),
        Just("]"),
        Just(":"),
        Just(","),
        Just("\"feature\""),
        Just("\"tasks\""),
        Just("\"id\""),
        Just("\"title\""),
        Just("\"level\""),
        Just("\"dependencies\""),
        Just("\"files\""),
        Just("\"create\""),
        Just("\"read\""),
        Just("\"verification\""),
        Just("\"command\""),
        Just("\"timeout_seconds\""),
        Just("\"levels\""),
        Just("\"T1\""),
        Just("\"a/b/\""),
        Just("\"../x\""),
        Just("\"\\u0000\""),
        Just("\"\""),
        Just("1"),
        Just("0"),
        Just("-1"),
        Just("1.5"),
        Just("1e999"),
        Just("18446744073709551616"),
        Just("null"),
        Just("true"),
    ];
    prop::collection::vec(token, 0..80).prop_map(|t| t.concat())
}

/// Any JSON value, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
        "[A-Za-z][A-Za-z0-9_-]{0,6}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("id".to_owned()),
                    Just("title".to_owned()),
                    Just("level".to_owned()),
                    Just("create".to_owned()),
                    Just("command".to_owned()),
                    "[a-z_]{1,8}"
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..1024)) {
        check_outcome(&run(&bytes));
    }

    #[test]
    fn json_ish_text_never_panics(text in json_ish()) {
        check_outcome(&run(text.as_bytes()));
    }

    #[test]
    fn arbitrary_json_documents_never_panic(doc in any_json()) {
        let result = run(doc.to_string().as_bytes());
        check_outcome(&result);
        prop_assert!(!matches!(result, Err(GraphError::Syntax { .. })), "it is JSON");
    }
}

// ------------------------------------------------------------------------------------------
// Generated valid graphs
// ------------------------------------------------------------------------------------------

/// A task as generated, before it is written as JSON.
#[derive(Debug, Clone)]
struct GenTask {
    id: String,
    title: String,
    description: Option<String>,
    level: u32,
    dependencies: Vec<String>,
    create: Vec<String>,
    modify: Vec<String>,
    read: Vec<String>,
    verification: Option<(String, u64)>,
}

#[derive(Debug, Clone)]
struct GenGraph {
    feature: String,
    tasks: Vec<GenTask>,
}

impl GenGraph {
    fn to_json(&self) -> Value {
        let tasks: Vec<Value> = self
            .tasks
            .iter()
            .map(|t| {
                let mut v = json!({
                    "id": t.id,
                    "title": t.title,
                    "level": t.level,
                    "dependencies": t.dependencies,
                    "files": {"create": t.create, "modify": t.modify, "read": t.read},
                });
                if let Some(d) = &t.description {
                    v["description"] = json!(d);
                }
                if let Some((command, timeout)) = &t.verification {
                    v["verification"] = json!({"command": command, "timeout_seconds": timeout});
                }
                v
            })
            .collect();
        json!({"feature": self.feature, "version": "2.0", "tasks": tasks})
    }
}

/// One path component that the rules allow (not `.`, `..` or `.git`), unicode included.
fn component() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_. é日-]{1,10}".prop_filter("a component the rules refuse", |c| {
        c != "." && c != ".." && !c.eq_ignore_ascii_case(".git")
    })
}

/// A relative, normalised file path under `dir` (so paths of different tasks never clash).
fn file_path(dir: String) -> impl Strategy<Value = String> {
    prop::collection::vec(component(), 1..4)
        .prop_map(move |parts| format!("{dir}/{}", parts.join("/")))
}

/// A read path: a file or a directory with a trailing `/`.
fn read_path() -> impl Strategy<Value = String> {
    (prop::collection::vec(component(), 1..4), any::<bool>()).prop_map(|(parts, dir)| {
        let p = parts.join("/");
        if dir { format!("{p}/") } else { p }
    })
}

/// Text without NUL, possibly with newlines and any other unicode.
fn text() -> impl Strategy<Value = String> {
    any::<String>().prop_map(|s| s.replace('\0', ""))
}

/// The random parts of one task; the id and level come from its place in the graph.
#[allow(clippy::type_complexity)]
fn task_parts(
    index: usize,
) -> impl Strategy<
    Value = (
        String,
        String,
        Option<String>,
        u64,
        Vec<String>,
        Vec<String>,
        Vec<String>,
        Option<(String, u64)>,
    ),
> {
    let dir = format!("t{index}");
    (
        "[A-Za-z][A-Za-z0-9_]{0,20}",
        ("[A-Za-z]{1,8}", text()).prop_map(|(w, t)| format!("{w} {t}")),
        prop::option::of(text()),
        any::<u64>(),
        prop::collection::vec(file_path(dir.clone()), 0..3),
        prop::collection::vec(file_path(dir), 0..3),
        prop::collection::vec(read_path(), 0..3),
        prop::option::of((text().prop_map(|t| format!("true {t}")), 1..=u64::MAX)),
    )
}

/// A valid graph: 1–5 levels of 1–4 tasks, each depending on a random subset of the tasks
/// below it.
fn valid_graph() -> impl Strategy<Value = GenGraph> {
    (
        "[A-Za-z0-9][A-Za-z0-9_-]{0,30}",
        prop::collection::vec(1usize..=4, 1..=5),
    )
        .prop_flat_map(|(feature, widths)| {
            let total: usize = widths.iter().sum();
            let parts: Vec<_> = (0..total).map(task_parts).collect();
            (Just(feature), Just(widths), parts)
        })
        .prop_map(|(feature, widths, parts)| {
            let mut tasks: Vec<GenTask> = Vec::new();
            let mut parts = parts.into_iter();
            for (l, &width) in widths.iter().enumerate() {
                let level = u32::try_from(l + 1).expect("at most 5 levels");
                let below: Vec<String> = tasks.iter().map(|t| t.id.clone()).collect();
                for j in 0..width {
                    let Some((
                        prefix,
                        title,
                        description,
                        mask,
                        create,
                        modify,
                        read,
                        verification,
                    )) = parts.next()
                    else {
                        break;
                    };
                    // The prefix has no '-', so `-L<level>-<j>` makes every id unique.
                    let id = format!("{prefix}-L{level}-{j}");
                    let dependencies = below
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| mask >> (i % 64) & 1 == 1)
                        .map(|(_, d)| d.clone())
                        .collect();
                    tasks.push(GenTask {
                        id,
                        title,
                        description,
                        level,
                        dependencies,
                        create,
                        modify,
                        read,
                        verification,
                    });
                }
            }
            GenGraph { feature, tasks }
        })
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn generated_valid_graphs_are_accepted_as_written(g in valid_graph()) {
        let v = match run(g.to_json().to_string().as_bytes()) {
            Ok(v) => v,
            Err(GraphError::Invalid { errors, .. }) => {
                return Err(TestCaseError::fail(format!(
                    "refused: {:#?}",
                    errors.iter().map(ToString::to_string).collect::<Vec<_>>()
                )));
            }
            Err(other) => return Err(TestCaseError::fail(other.to_string())),
        };
        prop_assert_eq!(&v.graph.feature, &g.feature);
        prop_assert_eq!(v.graph.tasks.len(), g.tasks.len());
        for (read, want) in v.graph.tasks.iter().zip(&g.tasks) {
            prop_assert_eq!(&read.id, &want.id);
            prop_assert_eq!(&read.title, &want.title);
            prop_assert_eq!(&read.description, want.description.as_deref().unwrap_or(""));
            prop_assert_eq!(read.level, want.level);
            prop_assert_eq!(&read.dependencies, &want.dependencies);
            prop_assert_eq!(&read.files.create, &want.create);
            prop_assert_eq!(&read.files.modify, &want.modify);
            prop_assert_eq!(&read.files.read, &want.read);
            prop_assert_eq!(
                read.verification.as_ref().map(|v| (v.command.clone(), v.timeout_seconds)),
                want.verification.clone()
            );
        }
    }
}

// ------------------------------------------------------------------------------------------
// One bad field
// ------------------------------------------------------------------------------------------

/// Which field of which task to break, and the bad value's own randomness.
#[derive(Debug, Clone)]
enum Mutation {
    Feature(String),
    Id(String),
    Title(Value),
    Level(Value),
    Create(String),
    Modify(String),
    Read(String),
    UnknownDependency,
    SelfDependency,
    NotLowerDependency(Index),
    Command(Value),
    Timeout(Value),
    Files(Value),
}

/// A name that breaks the id or feature rule; `bad_start` is a pattern of names starting with a
/// character the rule refuses first, `max` the largest allowed length.
fn bad_name(bad_start: &'static str, max: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        bad_start,
        "[A-Za-z][A-Za-z0-9]{0,5}[/. ;\\\\\x00\n\u{e9}\u{202e}:*][A-Za-z0-9]{0,5}",
        Just("..".to_owned()),
        "[A-Za-z]{1,3}".prop_map(move |p| format!("{p}{}", "x".repeat(max))),
    ]
}

fn bad_file_path() -> impl Strategy<Value = String> {
    let c = "[a-z]{1,6}";
    prop_oneof![
        Just(String::new()),
        c.prop_map(|c| format!("/{c}")),
        c.prop_map(|c| format!("{c}/../{c}")),
        c.prop_map(|c| format!("../{c}")),
        c.prop_map(|c| format!("./{c}")),
        c.prop_map(|c| format!("{c}/./{c}")),
        c.prop_map(|c| format!(".git/{c}")),
        c.prop_map(|c| format!("{c}/.GiT/{c}")),
        c.prop_map(|c| format!("{c}/")),
        c.prop_map(|c| format!("{c}//{c}")),
        c.prop_map(|c| format!("{c}\\{c}")),
        c.prop_map(|c| format!("{c}\0{c}")),
        c.prop_map(|c| format!("{c}\n{c}")),
    ]
}

fn bad_read_path() -> impl Strategy<Value = String> {
    let c = "[a-z]{1,6}";
    prop_oneof![
        Just("/".to_owned()),
        Just("//".to_owned()),
        c.prop_map(|c| format!("/{c}/")),
        c.prop_map(|c| format!("../{c}/")),
        c.prop_map(|c| format!("{c}/../")),
        c.prop_map(|c| format!(".git/{c}")),
        Just(".git/".to_owned()),
        c.prop_map(|c| format!("{c}//")),
        c.prop_map(|c| format!("{c}\0/")),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        bad_name("[_.-][A-Za-z0-9]{0,5}", 100).prop_map(Mutation::Feature),
        bad_name("[0-9_.-][A-Za-z0-9]{0,5}", 64).prop_map(Mutation::Id),
        prop_oneof![
            Just(json!("")),
            Just(json!(" \t ")),
            Just(json!(null)),
            Just(json!(3)),
            Just(json!(["t"])),
            "[a-z]{0,5}".prop_map(|s| json!(format!("{s}\0{s}"))),
        ]
        .prop_map(Mutation::Title),
        prop_oneof![
            Just(json!(0)),
            (i64::MIN..0).prop_map(|n| json!(n)),
            (u64::from(u32::MAX) + 1..=u64::MAX).prop_map(|n| json!(n)),
            Just(json!(1.5)),
            Just(json!("1")),
            Just(json!(null)),
            Just(json!([1])),
        ]
        .prop_map(Mutation::Level),
        bad_file_path().prop_map(Mutation::Create),
        bad_file_path().prop_map(Mutation::Modify),
        bad_read_path().prop_map(Mutation::Read),
        Just(Mutation::UnknownDependency),
        Just(Mutation::SelfDependency),
        any::<Index>().prop_map(Mutation::NotLowerDependency),
        prop_oneof![
            Just(json!(1)),
            Just(json!(["cargo", "test"])),
            Just(json!("")),
            Just(json!(null)),
            "[a-z]{0,5}".prop_map(|s| json!(format!("true\0{s}"))),
        ]
        .prop_map(Mutation::Command),
        prop_oneof![
            Just(json!(0)),
            (i64::MIN..0).prop_map(|n| json!(n)),
            Just(json!(1.5)),
            Just(json!(1e30)),
            Just(json!("30")),
        ]
        .prop_map(Mutation::Timeout),
        prop_oneof![Just(json!([])), Just(json!("src/a.rs")), Just(json!(7))]
            .prop_map(Mutation::Files),
    ]
}

/// Applies `m` to task `i` of `doc`; returns the (task, field) the refusal must name.
fn apply(doc: &mut Value, g: &GenGraph, i: usize, m: &Mutation) -> (Option<String>, String) {
    let id = g.tasks[i].id.clone();
    let t = &mut doc["tasks"][i];
    let append = |t: &mut Value, kind: &str, path: &str| {
        let list = t["files"][kind]
            .as_array_mut()
            .expect("generated as a list");
        list.push(json!(path));
        format!("files.{kind}[{}]", list.len() - 1)
    };
    match m {
        Mutation::Feature(bad) => {
            doc["feature"] = json!(bad);
            (None, "feature".into())
        }
        Mutation::Id(bad) => {
            t["id"] = json!(bad);
            (Some(format!("tasks[{i}]")), "id".into())
        }
        Mutation::Title(bad) => {
            t["title"] = bad.clone();
            (Some(id), "title".into())
        }
        Mutation::Level(bad) => {
            t["level"] = bad.clone();
            (Some(id), "level".into())
        }
        Mutation::Create(bad) => (Some(id), append(t, "create", bad)),
        Mutation::Modify(bad) => (Some(id), append(t, "modify", bad)),
        Mutation::Read(bad) => (Some(id), append(t, "read", bad)),
        Mutation::UnknownDependency => {
            // Generated ids end in `-L<level>-<j>`; this one cannot be among them.
            push_dependency(t, "Unknown-dependency");
            (Some(id), "dependencies".into())
        }
        Mutation::SelfDependency => {
            push_dependency(t, &id);
            (Some(id), "dependencies".into())
        }
        Mutation::NotLowerDependency(pick) => {
            let level = g.tasks[i].level;
            let same_or_higher: Vec<&GenTask> = g
                .tasks
                .iter()
                .filter(|o| o.id != id && o.level >= level)
                .collect();
            let target = if same_or_higher.is_empty() {
                id.clone()
            } else {
                pick.get(&same_or_higher).id.clone()
            };
            push_dependency(t, &target);
            (Some(id), "dependencies".into())
        }
        Mutation::Command(bad) => {
            t["verification"] = json!({"command": bad, "timeout_seconds": 10});
            (Some(id), "verification.command".into())
        }
        Mutation::Timeout(bad) => {
            t["verification"] = json!({"command": "true", "timeout_seconds": bad});
            (Some(id), "verification.timeout_seconds".into())
        }
        Mutation::Files(bad) => {
            t["files"] = bad.clone();
            (Some(id), "files".into())
        }
    }
}

fn push_dependency(t: &mut Value, dep: &str) {
    t["dependencies"]
        .as_array_mut()
        .expect("generated as a list")
        .push(json!(dep));
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn one_bad_field_is_refused_and_named(
        g in valid_graph(),
        pick in any::<Index>(),
        m in mutation(),
    ) {
        let i = pick.index(g.tasks.len());
        let mut doc = g.to_json();
        let (task, field) = apply(&mut doc, &g, i, &m);
        match run(doc.to_string().as_bytes()) {
            Err(GraphError::Invalid { errors, .. }) => {
                let named = errors
                    .iter()
                    .find(|d| d.task == task && d.field == field);
                prop_assert!(
                    named.is_some(),
                    "no error for ({:?}, {:?}) in {:#?}",
                    task,
                    field,
                    errors.iter().map(ToString::to_string).collect::<Vec<_>>()
                );
                if let Some(d) = named {
                    let shown = d.to_string();
                    prop_assert!(shown.contains(&format!("`{field}`")), "{}", shown);
                }
            }
            Ok(_) => return Err(TestCaseError::fail(format!("accepted after {m:?}"))),
            Err(other) => return Err(TestCaseError::fail(other.to_string())),
        }
    }

    #[test]
    fn any_value_in_any_field_never_panics(
        g in valid_graph(),
        pick in any::<Index>(),
        key in prop_oneof![
            Just("id"), Just("title"), Just("description"), Just("level"),
            Just("dependencies"), Just("files"), Just("verification"), Just("consumers"),
            Just("integration_test"), Just("context"), Just("acceptance_criteria"),
            Just("estimate_minutes"),
        ],
        value in any_json(),
        top in prop_oneof![Just(None), Just(Some("feature")), Just(Some("levels")), Just(Some("version"))],
    ) {
        let i = pick.index(g.tasks.len());
        let mut doc = g.to_json();
        match top {
            Some(k) => doc[k] = value,
            None => doc["tasks"][i][key] = value,
        }
        let result = run(doc.to_string().as_bytes());
        check_outcome(&result);
        prop_assert!(!matches!(result, Err(GraphError::Syntax { .. })), "it is JSON");
    }
}
