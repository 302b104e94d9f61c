//! Benchmarks of the supervisor's hot paths at scale: reconciliation (NFR-1: under 100 ms per
//! check; target 5 ms at 10k tasks), the watchdog tick, dispatch, status, and state saves (a
//! whole document, and one journal record).
//!
//! Run with `cargo bench -p zergd --bench supervisor`; results go to docs/benchmarks.md.

use std::path::PathBuf;
use std::time::{Duration, Instant as StdInstant, SystemTime};

use tokio::time::Instant;
use zerg_proto::graph;
use zergd::config::Config;
use zergd::state::{Journal, RushMeta, StateStore};
use zergd::supervisor::jobs::initial_doc;
use zergd::supervisor::rush::{Effects, Rush, RushPaths};

/// A graph of `levels` levels of `per_level` tasks; each task depends on two tasks of the
/// previous level.
fn graph_json(levels: usize, per_level: usize) -> String {
    let mut tasks = Vec::new();
    for l in 1..=levels {
        for i in 0..per_level {
            let deps: Vec<String> = if l == 1 {
                vec![]
            } else {
                vec![
                    format!("B-L{}-{:05}", l - 1, i),
                    format!("B-L{}-{:05}", l - 1, (i + 1) % per_level),
                ]
            };
            tasks.push(serde_json::json!({
                "id": format!("B-L{l}-{i:05}"), "title": format!("task {l}/{i}"), "level": l,
                "dependencies": deps,
                "files": {"create": [format!("l{l}/f{i}.txt")], "modify": [], "read": []},
                "verification": {"command": "true"}
            }));
        }
    }
    serde_json::json!({"feature": "bench", "tasks": tasks}).to_string()
}

fn rush(levels: usize, per_level: usize, workers: u32) -> Rush {
    let text = graph_json(levels, per_level);
    let g = graph::parse(text.as_bytes(), std::path::Path::new("bench.json"))
        .expect("valid graph")
        .graph;
    let paths = RushPaths::new(PathBuf::from("/nonexistent/repo"), "bench");
    let meta = RushMeta {
        rush_id: "bench-1".into(),
        workers,
        mode: zergd::domain::Mode::Subprocess,
        base_commit: "base".into(),
        ..Default::default()
    };
    let doc = initial_doc(&g, meta, &paths, SystemTime::now());
    Rush::new(
        doc,
        g,
        Config::default(),
        paths,
        String::new(),
        Instant::now(),
    )
}

/// Runs `f` `iters` times and returns (mean, max) per call.
fn measure(iters: u32, mut f: impl FnMut()) -> (Duration, Duration) {
    let mut max = Duration::ZERO;
    let start = StdInstant::now();
    for _ in 0..iters {
        let t = StdInstant::now();
        f();
        max = max.max(t.elapsed());
    }
    (start.elapsed() / iters, max)
}

fn row(name: &str, (mean, max): (Duration, Duration)) {
    println!(
        "| {name} | {:.3} ms | {:.3} ms |",
        mean.as_secs_f64() * 1e3,
        max.as_secs_f64() * 1e3
    );
}

fn main() {
    println!("| benchmark | mean | max |");
    println!("|---|---|---|");
    for &(levels, per_level) in &[(10usize, 100usize), (10, 1000)] {
        let n = levels * per_level;
        let mut r = rush(levels, per_level, 10);
        let now = Instant::now();
        let wall = SystemTime::now();
        // Half the graph done, the current level half leased.
        let mut fx = Effects::default();
        r.start(now, wall, &mut fx);
        for (id, t) in r.doc.tasks.iter_mut() {
            if t.level.unwrap_or(0) <= (levels as u32) / 2 {
                t.status = zergd::domain::TaskStatus::Complete;
                let _ = id;
            }
        }
        r.doc.current_level = (levels as u32) / 2 + 1;
        row(
            &format!("reconcile, light ({n} tasks)"),
            measure(50, || {
                r.reconcile(false, wall);
            }),
        );
        row(
            &format!("reconcile, thorough ({n} tasks)"),
            measure(50, || {
                r.reconcile(true, wall);
            }),
        );
        row(
            &format!("ready_tasks ({n} tasks)"),
            measure(50, || {
                std::hint::black_box(r.ready_tasks());
            }),
        );
        row(
            &format!("watchdog tick ({n} tasks)"),
            measure(50, || {
                let mut fx = Effects::default();
                std::hint::black_box(r.tick(now, wall, &mut fx));
            }),
        );
        row(
            &format!("status snapshot ({n} tasks)"),
            measure(20, || {
                std::hint::black_box(zergd::wire::status::rush_status(&r.view()));
            }),
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let store = StateStore::new(dir.path(), "bench");
        let bytes = serde_json::to_vec(&r.doc).expect("json").len();
        row(
            &format!(
                "state save, whole document: atomic + fsync ({n} tasks, {} KiB)",
                bytes / 1024
            ),
            measure(10, || {
                store.save(&r.doc).expect("save");
            }),
        );
        let mut journal = Journal::new(store.clone(), 0);
        journal.save(&mut r.doc).expect("first save");
        let ids: Vec<String> = r.doc.tasks.keys().take(50).cloned().collect();
        let mut i = 0;
        row(
            &format!("state save, journal record of one task change + fdatasync ({n} tasks)"),
            measure(50, || {
                let id = &ids[i % ids.len()];
                i += 1;
                if let Some(t) = r.doc.tasks.get_mut(id) {
                    t.leases += 1;
                }
                r.doc
                    .log(String::new(), "bench", serde_json::json!({"i": i}));
                journal.save(&mut r.doc).expect("record");
            }),
        );
        row(
            &format!("state load ({n} tasks)"),
            measure(10, || {
                std::hint::black_box(store.load().expect("load"));
            }),
        );
    }
}
