//! A rush's escalations on disk: `.zerg/state/escalations.json`, appended under its lock as
//! workers raise them, and read back (the unresolved ones) when a rush is loaded again.

use super::*;

/// The unresolved escalations of a rush's tasks from `.zerg/state/escalations.json`.
pub(super) fn load_escalations(r: &Rush) -> Vec<Escalation> {
    let path = r.paths.state_dir.join("escalations.json");
    let Some(doc) = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
    else {
        return Vec::new();
    };
    doc["escalations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| !e["resolved"].as_bool().unwrap_or(false))
        .filter(|e| {
            e["task_id"]
                .as_str()
                .is_some_and(|t| r.doc.tasks.contains_key(t))
        })
        .map(|e| Escalation {
            worker_id: e["worker_id"].as_u64().unwrap_or(0) as u32,
            task_id: e["task_id"].as_str().unwrap_or("").to_string(),
            category: e["category"].as_str().unwrap_or("").to_string(),
            message: e["message"].as_str().unwrap_or("").to_string(),
            timestamp: e["timestamp"].as_str().unwrap_or("").to_string(),
            context_json: e.get("context").map(|c| c.to_string()).unwrap_or_default(),
        })
        .collect()
}

/// Appends escalations to `.zerg/state/escalations.json` under its lock.
pub(super) fn append_escalations(state_dir: &Path, list: &[Escalation]) {
    let path = state_dir.join("escalations.json");
    let lock_path = state_dir.join("escalations.lock");
    let Ok(lock) = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
    else {
        return;
    };
    let Ok(_guard) = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive) else {
        return;
    };
    let mut doc: serde_json::Value = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| serde_json::json!({"escalations": []}));
    if !doc["escalations"].is_array() {
        doc["escalations"] = serde_json::json!([]);
    }
    if let Some(arr) = doc["escalations"].as_array_mut() {
        for e in list {
            arr.push(serde_json::json!({
                "worker_id": e.worker_id,
                "task_id": e.task_id,
                "timestamp": e.timestamp,
                "category": e.category,
                "message": e.message,
                "context": serde_json::from_str::<serde_json::Value>(&e.context_json)
                    .ok()
                    .filter(|v| v.is_object())
                    .unwrap_or_else(|| serde_json::json!({})),
                "resolved": false,
            }));
        }
    }
    let bytes = serde_json::to_vec_pretty(&doc).unwrap_or_default();
    if let Err(e) = crate::state::write_atomic(state_dir, &path, &bytes, None) {
        tracing::warn!(error = %e, "cannot write escalations.json");
    }
}
