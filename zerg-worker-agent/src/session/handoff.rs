//! Handoffs the agent CLI leaves in `$ZERG_TASK_DIR`: an escalation or a checkpoint.

use super::*;
use zerg_proto::contract::limits::{MAX_NAME, MAX_TEXT, clip};

impl Session {
    pub(super) async fn escalate(&mut self, task: &v1::Task, esc: serde_json::Value) -> TaskEnd {
        let category = esc["category"]
            .as_str()
            .unwrap_or("ambiguous_spec")
            .to_string();
        let category = clip(&category, MAX_NAME).to_string();
        let message = clip(esc["message"].as_str().unwrap_or(""), MAX_TEXT).to_string();
        // A context too large for zergd is replaced by a note and its beginning.
        let context_json = match esc.get("context").map(|c| c.to_string()) {
            Some(c) if c.len() > MAX_TEXT => serde_json::json!({
                "truncated": true,
                "bytes": c.len(),
                "excerpt": clip(&c, MAX_TEXT / 2),
            })
            .to_string(),
            Some(c) => c,
            None => String::new(),
        };
        let req = v1::EscalateRequest {
            worker: Some(self.env.me()),
            lease_id: task.lease_id.clone(),
            task_id: task.id.clone(),
            category: category.clone(),
            message: message.clone(),
            context_json,
        };
        if let Err(s) = retrying!(self, |c| c.escalate(req.clone())) {
            eprintln!(
                "zerg-worker-agent: cannot report escalation: {}",
                s.message()
            );
        }
        self.fail(
            task,
            v1::FailKind::Escalated,
            format!("[{category}] {message}"),
            0,
            String::new(),
        )
        .await;
        TaskEnd::Exit(exit::ESCALATION)
    }

    pub(super) async fn checkpoint(&mut self, task: &v1::Task, cp: serde_json::Value) -> TaskEnd {
        let pct = cp["progress_pct"].as_u64().unwrap_or(0);
        let next = cp["next_action"].as_str().unwrap_or("").to_string();
        let wt = self.env.worktree.clone();
        let mut add: Vec<String> = vec!["add".into(), "-A".into(), "--".into(), ".".into()];
        add.extend(self.pathspec_excludes().await);
        let add_ref: Vec<&str> = add.iter().map(String::as_str).collect();
        let _ = run::git(&wt, &add_ref).await;
        self.restore_spec(task).await;
        let files = run::git(&wt, &["diff", "--cached", "--name-status"])
            .await
            .unwrap_or_default();
        let listed: Vec<String> = files
            .lines()
            .filter_map(|l| {
                let (st, f) = l.split_once('\t')?;
                let kind = if st.starts_with('A') {
                    "added"
                } else if st.starts_with('D') {
                    "deleted"
                } else {
                    "modified"
                };
                Some(format!("  - {f} ({kind})"))
            })
            .collect();
        let msg = format!(
            "WIP: ZERG [worker-{w}] checkpoint during {t}\n\nStatus: {pct}% complete\nFiles modified:\n{files}\n\nResume context:\n  - Current step: implementing\n  - Next action: {next}\n  - Blockers: none\n\nWorker-ID: {w}\nFeature: {f}\nContext-Usage: {pct}%\n",
            w = self.env.worker_id,
            t = task.id,
            files = listed.join("\n"),
            f = self.env.feature,
        );
        let sha = match self
            .git_with_identity(&["commit", "-q", "--allow-empty", "--no-verify", "-m", &msg])
            .await
        {
            Ok(_) => run::git(&wt, &["rev-parse", "HEAD"])
                .await
                .unwrap_or_default(),
            Err(e) => {
                eprintln!("zerg-worker-agent: checkpoint commit failed: {e}");
                String::new()
            }
        };
        // A remote worker's checkpoint reaches zergd before the report that names it.
        let sha = if !sha.is_empty()
            && self.env.remote.is_some()
            && let Err(e) = self.push(task, &sha).await
        {
            eprintln!("zerg-worker-agent: cannot push the checkpoint: {e}");
            String::new()
        } else {
            sha
        };
        if !sha.is_empty() {
            // Keep the checkpoint reachable after the worker branch moves on.
            let r = format!("refs/zerg/{}/wip/{}", self.env.feature, task.id);
            let _ = run::git(&wt, &["update-ref", &r, &sha]).await;
        }
        self.fail(
            task,
            v1::FailKind::Checkpoint,
            format!("checkpoint at {pct}%: {next}"),
            0,
            sha,
        )
        .await;
        TaskEnd::Exit(exit::CHECKPOINT)
    }
}

pub(super) fn read_json(path: &Path) -> Option<serde_json::Value> {
    let bytes = std::fs::read(path).ok()?;
    Some(
        serde_json::from_slice(&bytes).unwrap_or_else(
            |_| serde_json::json!({"message": String::from_utf8_lossy(&bytes).trim()}),
        ),
    )
}
