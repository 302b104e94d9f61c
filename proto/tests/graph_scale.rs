//! Large and deep task graphs: validation must neither recurse (a 10,000-deep dependency chain
//! runs on a small stack) nor grow faster than the graph (a 100,000-task graph validates, and a
//! graph with very many cycles gets a bounded report).
//!
//! The tests print how long each validation took (`--nocapture` shows it); they assert nothing
//! about time.

use std::path::Path;
use std::time::Instant;

use serde_json::{Value, json};
use zerg_proto::graph::{GraphError, Validated, parse};

/// Stack for the validating thread: far less than a recursive walk of a 10,000-deep chain
/// needs, plenty for an iterative one.
const SMALL_STACK: usize = 256 * 1024;

fn task(id: &str, level: u32, deps: &[String]) -> Value {
    json!({
        "id": id,
        "title": format!("Task {id}"),
        "level": level,
        "dependencies": deps,
        "files": {"create": [format!("src/{id}.rs")], "read": ["src/"]},
        "verification": {"command": "true", "timeout_seconds": 10},
    })
}

/// Parses `text` on a thread with [`SMALL_STACK`], printing how long it took.
fn parse_on_small_stack(what: &'static str, text: String) -> Result<Validated, GraphError> {
    std::thread::Builder::new()
        .name(what.into())
        .stack_size(SMALL_STACK)
        .spawn(move || {
            let started = Instant::now();
            let result = parse(text.as_bytes(), Path::new("task-graph.json"));
            eprintln!("{what}: validated in {:?}", started.elapsed());
            result
        })
        .expect("spawn the validating thread")
        .join()
        .expect("validation must not panic or overflow its stack")
}

fn id(i: usize) -> String {
    format!("T{i}")
}

/// Task `i` sits at level `i + 1` and depends on task `i - 1`: one task per level, as the
/// format requires dependencies to be at strictly lower levels.
fn chain(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            let deps: Vec<String> = i.checked_sub(1).map(id).into_iter().collect();
            task(&id(i), u32::try_from(i + 1).expect("level fits"), &deps)
        })
        .collect()
}

#[test]
fn ten_thousand_deep_chain_validates_without_recursion() {
    let n = 10_000;
    let g = json!({"feature": "deep", "tasks": chain(n)});
    let v = parse_on_small_stack("10k-deep chain", g.to_string()).expect("the chain is valid");
    assert_eq!(v.graph.tasks.len(), n);
    assert_eq!(v.graph.max_level(), 10_000);
    assert!(
        v.warnings.is_empty(),
        "{:?}",
        v.warnings.iter().take(3).collect::<Vec<_>>()
    );
    // The closure walk is iterative too.
    assert_eq!(v.graph.dependents_closure("T0").len(), n - 1);
}

#[test]
fn ten_thousand_deep_cycle_is_refused_with_a_bounded_message() {
    let n = 10_000;
    let mut tasks = chain(n);
    // Close the chain: the first task depends on the last.
    tasks[0]["dependencies"] = json!([id(n - 1)]);
    let g = json!({"feature": "deep", "tasks": tasks});
    let Err(GraphError::Invalid { errors, .. }) = parse_on_small_stack("10k cycle", g.to_string())
    else {
        panic!("a cycle must be refused");
    };
    let cycles: Vec<_> = errors
        .iter()
        .filter(|d| d.message.starts_with("dependency cycle"))
        .collect();
    assert_eq!(cycles.len(), 1, "one back edge, one cycle");
    assert_eq!(cycles[0].task.as_deref(), Some("T0"));
    assert_eq!(cycles[0].field, "dependencies");
    assert!(
        cycles[0].message.contains("of 10000 tasks") && cycles[0].message.len() < 1_000,
        "{}",
        cycles[0].message
    );
}

#[test]
fn many_long_cycles_get_a_bounded_report() {
    // T0 -> T1 -> ... -> T(n-1) (each depends on the next), and T(n-1) depends on every other
    // task: n - 1 back edges whose cycles have n, n-1, ..., 2 tasks. Listing each in full
    // would take n²/2 entries (200 million here); the report must stay small.
    let n = 20_000;
    let mut tasks: Vec<Value> = (0..n).map(|i| task(&id(i), 1, &[id(i + 1)])).collect();
    tasks[n - 1]["dependencies"] = json!((0..n - 1).map(id).collect::<Vec<_>>());
    let g = json!({"feature": "cycles", "tasks": tasks});
    let Err(GraphError::Invalid { errors, .. }) =
        parse_on_small_stack("many cycles", g.to_string())
    else {
        panic!("cycles must be refused");
    };
    let cycles = errors
        .iter()
        .filter(|d| d.message.starts_with("dependency cycle"))
        .count();
    assert!((1..=10).contains(&cycles), "{cycles} cycles listed");
    let total: usize = errors.iter().map(|d| d.message.len()).sum();
    assert!(
        total < 200 * errors.len(),
        "{total} bytes of messages for {} errors",
        errors.len()
    );
    assert!(
        errors.iter().any(|d| d.task.is_none()
            && d.field == "tasks"
            && d.message
                .contains(&format!("{} more dependency cycles", n - 1 - cycles))),
        "the cycles not listed are counted"
    );
}

#[test]
fn hundred_thousand_task_graph_validates() {
    // 100 levels of 1,000 tasks; each task depends on two tasks of the level below, and every
    // task below the top level has a dependent, so the graph is valid without warnings.
    let (levels, width) = (100usize, 1_000usize);
    let name = |level: usize, j: usize| format!("L{level}-{j}");
    let mut tasks = Vec::with_capacity(levels * width);
    for level in 1..=levels {
        for j in 0..width {
            let deps = if level == 1 {
                vec![]
            } else {
                vec![name(level - 1, j), name(level - 1, (j + 1) % width)]
            };
            tasks.push(task(
                &name(level, j),
                u32::try_from(level).expect("level fits"),
                &deps,
            ));
        }
    }
    let g = json!({"feature": "wide", "tasks": tasks});
    let text = g.to_string();
    eprintln!("100k-task graph: {} bytes of JSON", text.len());
    let v = parse_on_small_stack("100k tasks", text).expect("the graph is valid");
    assert_eq!(v.graph.tasks.len(), levels * width);
    assert_eq!(v.graph.levels().len(), levels);
    assert!(
        v.warnings.is_empty(),
        "{:?}",
        v.warnings.iter().take(3).collect::<Vec<_>>()
    );
}
