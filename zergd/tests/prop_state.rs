//! Property tests of the state file loader ([`StateStore::load`]): whatever bytes the state
//! file holds, loading returns instead of panicking and an error names the file; and a
//! generated [`StateDoc`] saved and loaded again is the same document.

use std::collections::BTreeMap;
use std::path::Path;

use proptest::prelude::*;
use proptest::test_runner::Config;
use serde_json::{Value, json};
use sha2::Digest;
use zergd::domain::{LevelStatus, MergeStatus, Mode, RushState, Step, TaskStatus, WorkerStatus};
use zergd::state::{
    Counters, FORMAT_VERSION, LevelState, LogEntry, ModelSpend, RushMeta, StateDoc, StateStore,
    StoreError, TaskState, Tokens, UserNote, WorkerState,
};

const FEATURE: &str = "feat";

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

/// Writes `bytes` as the state file of a fresh store (with no backup) and loads it.
fn load_bytes(bytes: &[u8]) -> (Result<Option<StateDoc>, StoreError>, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = StateStore::new(dir.path(), FEATURE);
    std::fs::write(store.path(), bytes).expect("write the state file");
    (store.load(), store.path())
}

/// A failed load must say which file it was about, both in the error and in its message.
fn check_names_file(result: &Result<Option<StateDoc>, StoreError>, path: &Path) {
    let Err(e) = result else { return };
    let named = match e {
        StoreError::Corrupt { path: p, .. } | StoreError::TooNew { path: p, .. } => p,
        StoreError::Io { path: p, .. } => p,
    };
    assert_eq!(named, path, "{e}");
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");
}

// ------------------------------------------------------------------------------------------
// Generated documents
// ------------------------------------------------------------------------------------------

fn text() -> impl Strategy<Value = String> {
    any::<String>()
}

fn opt_text() -> impl Strategy<Value = Option<String>> {
    prop::option::of(text())
}

fn texts() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(text(), 0..3)
}

/// JSON values as the engine writes them into `metrics` and `execution_log` data.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        text().prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(text(), inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A cost as the agent CLI reports it: dollars with up to six decimals (at most 15
/// significant digits). Any finite amount is the subject of
/// `any_finite_cost_round_trips_exactly` below.
fn cost() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(0.0),
        (0u32..1_000_000).prop_map(|c| f64::from(c) / 100.0),
        (0u64..1_000_000_000_000).prop_map(|micro| micro as f64 / 1e6),
    ]
}

fn task_state() -> impl Strategy<Value = TaskState> {
    (
        (
            prop::sample::select(TaskStatus::ALL),
            prop::option::of(any::<u32>()),
            text(),
            prop::option::of(any::<u32>()),
            text(),
            opt_text(),
            opt_text(),
            opt_text(),
        ),
        (
            opt_text(),
            any::<u32>(),
            any::<u32>(),
            opt_text(),
            prop::option::of(any::<u64>()),
            opt_text(),
            any::<u32>(),
        ),
        (opt_text(), opt_text(), opt_text(), texts(), texts(), cost()),
        (
            tokens(),
            prop::collection::btree_map(
                text(),
                (tokens(), cost()).prop_map(|(tokens, cost_usd)| ModelSpend { tokens, cost_usd }),
                0..3,
            ),
            any::<u32>(),
        ),
    )
        .prop_map(
            |(
                (status, level, title, worker_id, updated_at, claimed_at, started_at, completed_at),
                (error, retry_count, crashes, next_retry_at, duration_ms, lease_id, leases),
                (commit, resume_from, base_commit, out_of_scope, blocked_by, cost_usd),
                (tokens, models, unreachable),
            )| TaskState {
                status,
                level,
                title,
                worker_id,
                updated_at,
                claimed_at,
                started_at,
                completed_at,
                error,
                retry_count,
                crashes,
                next_retry_at,
                duration_ms,
                lease_id,
                leases,
                commit,
                resume_from,
                base_commit,
                out_of_scope,
                blocked_by,
                cost_usd,
                tokens,
                models,
                unreachable,
                previous_attempt: (unreachable % 2 == 1)
                    .then(|| format!("Attempt {unreachable} failed: \"x\"\n```\n✓ tail\n```")),
                attempt_models: (0..unreachable % 3).map(|i| format!("model-{i}")).collect(),
                notes: (0..unreachable % 2)
                    .map(|i| UserNote {
                        text: format!("note {i}:\n\t\"é\""),
                        at: "2026-12-07T03:00:00.000Z".into(),
                    })
                    .collect(),
            },
        )
}

fn tokens() -> impl Strategy<Value = Tokens> {
    any::<[u64; 4]>().prop_map(|t| Tokens {
        input_tokens: t[0],
        output_tokens: t[1],
        cache_read_tokens: t[2],
        cache_creation_tokens: t[3],
    })
}

fn worker_state() -> impl Strategy<Value = WorkerState> {
    (
        (
            any::<u32>(),
            prop::sample::select(WorkerStatus::ALL),
            opt_text(),
            text(),
            text(),
            opt_text(),
            opt_text(),
            opt_text(),
        ),
        (
            any::<u32>(),
            prop::option::of(any::<i32>()),
            prop::option::of(any::<u64>()),
            opt_text(),
            any::<u64>(),
            text(),
            text(),
        ),
        (
            prop::collection::vec(any::<i64>(), 0..4),
            any::<u32>(),
            any::<u32>(),
            opt_text(),
            opt_text(),
            prop::option::of(prop::sample::select(Step::ALL)),
            any::<u32>(),
        ),
        opt_text(),
    )
        .prop_map(
            |(
                (
                    worker_id,
                    status,
                    current_task,
                    worktree_path,
                    branch,
                    started_at,
                    ready_at,
                    health_check_at,
                ),
                (
                    tasks_completed,
                    pid,
                    pid_start_time,
                    container_id,
                    generation,
                    accepted_head,
                    token_sha256,
                ),
                (respawn_times_ms, respawns, spawn_failures, last_exit, reason, step, progress_pct),
                detail,
            )| WorkerState {
                worker_id,
                status,
                current_task,
                worktree_path,
                branch,
                started_at,
                ready_at,
                health_check_at,
                tasks_completed,
                pid,
                pid_start_time,
                container_id,
                generation,
                accepted_head,
                token_sha256,
                respawn_times_ms,
                respawns,
                spawn_failures,
                last_exit,
                reason,
                step,
                progress_pct,
                detail,
            },
        )
}

fn level_state() -> impl Strategy<Value = LevelState> {
    (
        prop::sample::select(LevelStatus::ALL),
        opt_text(),
        opt_text(),
        opt_text(),
        prop::sample::select(MergeStatus::ALL),
        texts(),
        opt_text(),
    )
        .prop_map(
            |(status, started_at, completed_at, merge_commit, merge_status, conflicts, details)| {
                LevelState {
                    status,
                    started_at,
                    completed_at,
                    merge_commit,
                    merge_status,
                    conflicts,
                    merge_details: details,
                    resolution: None,
                }
            },
        )
}

fn rush_meta() -> impl Strategy<Value = RushMeta> {
    (
        (
            text(),
            text(),
            prop::sample::select(Mode::ALL),
            any::<u32>(),
            prop::sample::select(RushState::ALL),
            text(),
            text(),
            text(),
        ),
        (
            text(),
            text(),
            text(),
            any::<i64>(),
            any::<[u64; 5]>(),
            texts(),
            any::<u64>(),
        ),
        (text(), prop::option::of(cost()), any::<u64>()),
    )
        .prop_map(
            |(
                (rush_id, repo, mode, workers, state, reason, base_branch, base_commit),
                (
                    staging_head,
                    spec_dir,
                    finished_at,
                    rate_limited_until_ms,
                    c,
                    warnings,
                    journal_seq,
                ),
                (rate_limit_type, max_usd, egress_refused),
            )| RushMeta {
                rush_id,
                repo,
                mode,
                workers,
                state,
                reason,
                base_branch,
                base_commit,
                staging_head,
                spec_dir,
                finished_at,
                rate_limited_until_ms,
                resilience: Counters {
                    spawn_retries: c[0],
                    stale_detections: c[1],
                    task_reassignments: c[2],
                    worker_respawns: c[3],
                    reconcile_fixes: c[4],
                },
                warnings,
                journal_seq,
                rate_limit_type,
                max_usd,
                egress_refused,
            },
        )
}

fn state_doc() -> impl Strategy<Value = StateDoc> {
    let log_entry = (text(), text(), json_value()).prop_map(|(timestamp, event, data)| LogEntry {
        timestamp,
        event,
        data,
    });
    (
        (
            0..=FORMAT_VERSION,
            text(),
            text(),
            any::<u32>(),
            prop::collection::btree_map(text(), task_state(), 0..4),
            prop::collection::btree_map(text(), worker_state(), 0..3),
            prop::collection::btree_map(text(), level_state(), 0..3),
        ),
        (
            prop::collection::vec(log_entry, 0..4),
            // `Some(null)` is written as `null`, which reads back as `None`: the engine writes
            // metrics as an object.
            prop::option::of(json_value().prop_filter("not null", |v| !v.is_null())),
            any::<bool>(),
            opt_text(),
            rush_meta(),
        ),
    )
        .prop_map(
            |(
                (format_version, feature, started_at, current_level, tasks, workers, levels),
                (log, metrics, paused, error, rush),
            )| StateDoc {
                format_version,
                feature,
                started_at,
                current_level,
                tasks: tasks.into(),
                workers: workers.into(),
                levels: levels.into(),
                execution_log: log.into(),
                metrics,
                paused,
                error,
                rush,
            },
        )
}

proptest! {
    #![proptest_config(config(128))]

    #[test]
    fn a_generated_state_doc_round_trips(doc in state_doc()) {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = StateStore::new(dir.path(), FEATURE);
        store.save(&doc).expect("save");
        let loaded = store.load().expect("load").expect("a state file");
        prop_assert_eq!(&loaded, &doc);
        // A second generation keeps the first as the backup, and loading still gives the newest.
        let mut newer = doc.clone();
        newer.current_level = doc.current_level.wrapping_add(1);
        store.save(&newer).expect("save again");
        prop_assert_eq!(store.load().expect("load").expect("a state file"), newer);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_errors_name_the_file(
        bytes in prop::collection::vec(any::<u8>(), 0..1024),
    ) {
        let (result, path) = load_bytes(&bytes);
        check_names_file(&result, &path);
    }

    #[test]
    fn json_ish_text_never_panics_and_errors_name_the_file(
        tokens in prop::collection::vec(
            prop::sample::select(vec![
                "{", "}", "[", "]", ":", ",", "\"format_version\"", "\"tasks\"", "\"workers\"",
                "\"levels\"", "\"status\"", "\"level\"", "\"rush\"", "\"state\"", "\"mode\"",
                "\"execution_log\"", "\"metrics\"", "\"T1\"", "\"0\"", "\"complete\"",
                "\"dancing\"", "1", "-1", "0", "1.5", "1e999", "4294967297",
                "18446744073709551616", "null", "true", "\"\"",
            ]),
            0..60,
        ),
    ) {
        let (result, path) = load_bytes(tokens.concat().as_bytes());
        check_names_file(&result, &path);
    }

    #[test]
    fn any_journal_beside_a_good_state_file_loads_and_a_note_names_the_journal(
        doc in state_doc(),
        lines in prop::collection::vec(
            (
                prop::collection::vec(
                    prop::sample::select(vec![
                        "{", "}", "[", "]", ":", ",", "\"rush\"", "\"seq\"", "\"r\"",
                        "\"head\"", "\"tasks\"", "\"workers\"", "\"levels\"", "\"log\"",
                        "\"T1\"", "\"status\"", "\"complete\"", "1", "2", "-1",
                        "18446744073709551616", "null", "true", "\"\"",
                    ]),
                    0..30,
                ),
                any::<bool>(),
                any::<Vec<u8>>(),
            ),
            0..6,
        ),
    ) {
        // Lines of JSON-ish tokens with a correct checksum (so the parser and the replay
        // see them), or raw bytes; the document is of rush `r`.
        let mut doc = doc;
        doc.format_version = FORMAT_VERSION;
        doc.rush.rush_id = "r".into();
        doc.rush.journal_seq = 0;
        let dir = tempfile::tempdir().expect("temp dir");
        let store = StateStore::new(dir.path(), FEATURE);
        store.save(&doc).expect("save");
        let mut journal = Vec::new();
        for (tokens, summed, raw) in &lines {
            if *summed {
                let json = tokens.concat();
                let sum: String = sha2::Sha256::digest(json.as_bytes())[..8]
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect();
                journal.extend_from_slice(format!("{sum} {json}\n").as_bytes());
            } else {
                journal.extend_from_slice(raw);
            }
        }
        let path = dir.path().join(format!("{FEATURE}.journal"));
        std::fs::write(&path, &journal).expect("write the journal");
        let (_, note) = store
            .load_noting_backup()
            .expect("a good state file loads whatever its journal holds")
            .expect("a state file");
        if let Some(note) = note {
            prop_assert!(note.contains(&path.display().to_string()), "{}", note);
        }
    }

    #[test]
    fn a_damaged_state_file_never_panics_and_errors_name_the_file(
        doc in state_doc(),
        cut in any::<prop::sample::Index>(),
        damage in 0u8..4,
        byte in any::<u8>(),
        value in json_value(),
        key in prop::sample::select(vec![
            "format_version", "feature", "current_level", "tasks", "workers", "levels",
            "execution_log", "paused", "rush", "metrics",
        ]),
    ) {
        let mut bytes = serde_json::to_vec_pretty(&doc).expect("serialise");
        match damage {
            // Truncated, as by a crash in the middle of a write without the rename.
            0 => bytes.truncate(cut.index(bytes.len())),
            // One byte overwritten.
            1 => {
                let i = cut.index(bytes.len());
                bytes[i] = byte;
            }
            // A top-level field replaced by any value.
            2 => {
                let mut v: Value = serde_json::from_slice(&bytes).expect("just written");
                v[key] = value;
                bytes = serde_json::to_vec(&v).expect("serialise");
            }
            // A field of a task, a worker or a level replaced by any value.
            _ => {
                let mut v: Value = serde_json::from_slice(&bytes).expect("just written");
                let section = ["tasks", "workers", "levels"][cut.index(3)];
                v[section]["X"] = json!({"status": value});
                bytes = serde_json::to_vec(&v).expect("serialise");
            }
        }
        let (result, path) = load_bytes(&bytes);
        check_names_file(&result, &path);
    }
}

#[test]
fn a_newer_format_version_is_refused_naming_the_file() {
    for version in [u64::from(FORMAT_VERSION) + 1, u64::from(u32::MAX)] {
        let (result, path) = load_bytes(format!("{{\"format_version\": {version}}}").as_bytes());
        assert!(
            matches!(result, Err(StoreError::TooNew { .. })),
            "{version}: {result:?}"
        );
        check_names_file(&result, &path);
    }
}

#[test]
fn unknown_state_names_are_refused_naming_the_file() {
    let mut doc = BTreeMap::new();
    doc.insert("tasks", json!({"T1": {"status": "dancing"}}));
    let (result, path) = load_bytes(&serde_json::to_vec(&doc).expect("serialise"));
    assert!(
        matches!(&result, Err(StoreError::Corrupt { message, .. }) if message.contains("dancing")),
        "{result:?}"
    );
    check_names_file(&result, &path);
}

/// Costs are sums of what the agent CLI reports, so they often need all 17 significant digits
/// (`0.1 + 0.2` is `0.30000000000000004`). serde_json parses some of those one unit in the
/// last place off unless its `float_roundtrip` feature is on (the workspace turns it on);
/// without it such a cost would change each time the state file is loaded and written again.
#[test]
fn any_finite_cost_round_trips_exactly() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = StateStore::new(dir.path(), FEATURE);
    let mut failures = Vec::new();
    for cost in [
        203_827.688_343_482_62,
        0.1 + 0.2,
        1.0 / 3.0,
        f64::MIN_POSITIVE,
        f64::MAX,
        5e-324,
    ] {
        let mut doc = StateDoc::default();
        doc.tasks.insert(
            "T1".into(),
            TaskState {
                cost_usd: cost,
                ..TaskState::default()
            },
        );
        store.save(&doc).expect("save");
        let back = store.load().expect("load").expect("a state file").tasks["T1"].cost_usd;
        if back.to_bits() != cost.to_bits() {
            failures.push(format!("{cost:?} read back as {back:?}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
