//! The dashboard's JSON: a rush's status as the page draws it. Enums become their short
//! lower-case names (`in_progress`, not `TASK_STATE_IN_PROGRESS`), maps become lists in a
//! stable order (tasks by level then id, workers by number), and each worker's heartbeat age is
//! computed here, against zergd's clock, so that a browser on another machine with a skewed
//! clock shows the same ages.

use serde_json::{Value, json};
use zerg_proto::{WireName, v1};

/// A wire enum's short name (`in_progress`, see [`WireName`]); empty for an unknown or
/// unspecified value.
pub fn name<E: TryFrom<i32> + WireName>(v: i32) -> String {
    E::try_from(v).map(|e| e.name()).unwrap_or_default()
}

fn tokens(t: Option<&v1::Tokens>) -> Value {
    let t = t.cloned().unwrap_or_default();
    json!({
        "input": t.input_tokens,
        "output": t.output_tokens,
        "cache_read": t.cache_read_tokens,
        "cache_creation": t.cache_creation_tokens,
    })
}

/// Milliseconds from an RFC 3339 time to `now`; `None` when the time is absent or unreadable.
fn age_ms(at: &str, now: std::time::SystemTime) -> Option<u64> {
    let t = humantime::parse_rfc3339_weak(at).ok()?;
    Some(now.duration_since(t).unwrap_or_default().as_millis() as u64)
}

/// Levels in order, with their merge state and progress.
pub fn levels(s: &v1::RushStatus) -> Value {
    let mut levels: Vec<(u32, &v1::LevelStatus)> = s
        .levels
        .iter()
        .filter_map(|(k, l)| Some((k.parse().ok()?, l)))
        .collect();
    levels.sort_by_key(|(n, _)| *n);
    levels
        .into_iter()
        .map(|(n, l)| {
            json!({
                "level": n,
                "state": name::<v1::LevelState>(l.status),
                "merge": name::<v1::MergeState>(l.merge_status),
                "tasks": l.tasks,
                "complete": l.complete,
                "merge_commit": l.merge_commit,
                "conflicts": l.conflicts,
            })
        })
        .collect()
}

/// A rush's whole status, as of `now`.
pub fn rush(s: &v1::RushStatus, now: std::time::SystemTime) -> Value {
    let mut tasks: Vec<(&String, &v1::TaskStatus)> = s.tasks.iter().collect();
    tasks.sort_by(|a, b| (a.1.level, a.0).cmp(&(b.1.level, b.0)));
    let tasks: Vec<Value> = tasks
        .into_iter()
        .map(|(id, t)| {
            json!({
                "id": id,
                "title": t.title,
                "level": t.level,
                "state": name::<v1::TaskState>(t.status),
                "worker": t.worker_id,
                "attempts": t.attempts,
                "attempt_models": t.attempt_models,
                "notes": t.notes,
                "crashes": t.crashes,
                "error": t.error,
                "commit": t.commit,
                "cost_usd": t.cost_usd,
                "duration_ms": t.duration_ms,
                "started_at": t.started_at,
                "blocked_by": t.blocked_by,
            })
        })
        .collect();
    let mut workers: Vec<(u32, &v1::WorkerStatus)> = s
        .workers
        .iter()
        .filter_map(|(k, w)| Some((k.parse().ok()?, w)))
        .collect();
    workers.sort_by_key(|(n, _)| *n);
    let workers: Vec<Value> = workers
        .into_iter()
        .map(|(id, w)| {
            json!({
                "id": id,
                "state": name::<v1::WorkerState>(w.status),
                "task": w.current_task,
                "last_heartbeat": w.last_heartbeat,
                "heartbeat_age_ms": age_ms(&w.last_heartbeat, now),
                "step": name::<v1::Step>(w.step),
                "progress_pct": w.progress_pct,
                "detail": w.detail,
                "respawns": w.respawns,
                "tasks_completed": w.tasks_completed,
                "reason": w.reason,
                "last_exit": w.last_exit,
            })
        })
        .collect();
    let models: serde_json::Map<String, Value> = s
        .models
        .iter()
        .map(|(m, u)| {
            (
                m.clone(),
                json!({"cost_usd": u.cost_usd, "tokens": tokens(u.tokens.as_ref())}),
            )
        })
        .collect();
    let r = s.resilience.unwrap_or_default();
    json!({
        "rush_id": s.rush_id,
        "repo": s.repo,
        "feature": s.feature,
        "state": name::<v1::RushState>(s.state),
        "current_level": s.current_level,
        "total_levels": s.total_levels,
        "mode": name::<v1::LaunchMode>(s.mode),
        "reason": s.reason,
        "sandbox": s.sandbox.as_ref().filter(|_| s.mode() == v1::LaunchMode::Subprocess).map(|b| json!({
            "confined": b.confined,
            "summary": b.summary,
            "egress_refused": b.egress_refused,
        })),
        "started_at": s.started_at,
        "finished_at": s.finished_at,
        "staging_branch": s.staging_branch,
        "base_branch": s.base_branch,
        "cost_usd": s.cost_usd,
        "max_usd": s.max_usd,
        "rate_limited_until": s.rate_limited_until,
        "rate_limit_type": s.rate_limit_type,
        "now": humantime::format_rfc3339_millis(now).to_string(),
        "tokens": tokens(s.tokens.as_ref()),
        "models": models,
        "levels": levels(s),
        "tasks": tasks,
        "workers": workers,
        "escalations": s.escalations.iter().map(|e| json!({
            "worker": e.worker_id,
            "task": e.task_id,
            "category": e.category,
            "message": e.message,
            "timestamp": e.timestamp,
            "resolved": e.resolved,
        })).collect::<Vec<_>>(),
        "resilience": {
            "spawn_retries": r.spawn_retries,
            "stale_detections": r.stale_detections,
            "task_reassignments": r.task_reassignments,
            "worker_respawns": r.worker_respawns,
            "reconcile_fixes": r.reconcile_fixes,
        },
        "warnings": s.warnings.len(),
    })
}

/// A rush of the list: its summary, and where its status was read, its cost, tokens and
/// levels.
pub fn summary(r: &v1::RushSummary, status: Option<&v1::RushStatus>) -> Value {
    let mut v = json!({
        "rush_id": r.rush_id,
        "repo": r.repo,
        "feature": r.feature,
        "state": name::<v1::RushState>(r.state),
        "tasks_total": r.tasks_total,
        "tasks_complete": r.tasks_complete,
        "started_at": r.started_at,
    });
    if let (Some(s), Some(m)) = (status, v.as_object_mut()) {
        m.insert("cost_usd".into(), json!(s.cost_usd));
        m.insert("tokens".into(), tokens(s.tokens.as_ref()));
        m.insert("levels".into(), levels(s));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_have_short_names_and_workers_a_heartbeat_age() {
        let mut s = v1::RushStatus {
            feature: "f".into(),
            state: v1::RushState::Running as i32,
            ..Default::default()
        };
        s.tasks.insert(
            "B-1".into(),
            v1::TaskStatus {
                status: v1::TaskState::InProgress as i32,
                level: 2,
                ..Default::default()
            },
        );
        s.tasks.insert(
            "A-1".into(),
            v1::TaskStatus {
                status: v1::TaskState::Complete as i32,
                level: 1,
                ..Default::default()
            },
        );
        s.workers.insert(
            "10".into(),
            v1::WorkerStatus {
                status: v1::WorkerState::GaveUp as i32,
                ..Default::default()
            },
        );
        s.workers.insert(
            "2".into(),
            v1::WorkerStatus {
                status: v1::WorkerState::Running as i32,
                last_heartbeat: "2026-01-01T00:00:00Z".into(),
                step: v1::Step::VerifyingTier1 as i32,
                ..Default::default()
            },
        );
        let now = humantime::parse_rfc3339("2026-01-01T00:00:02.500Z").unwrap();
        let v = rush(&s, now);
        assert_eq!(v["state"], "running");
        assert_eq!(v["tasks"][0]["id"], "A-1", "level order");
        assert_eq!(v["tasks"][1]["state"], "in_progress");
        assert_eq!(v["workers"][0]["id"], 2, "numeric order: 2 before 10");
        assert_eq!(v["workers"][0]["heartbeat_age_ms"], 2500);
        assert_eq!(v["workers"][0]["step"], "verifying_tier1");
        assert_eq!(v["workers"][1]["state"], "gave_up");
        assert_eq!(v["workers"][1]["heartbeat_age_ms"], Value::Null);
    }
}
