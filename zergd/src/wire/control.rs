//! zergctl's requests, checked on the way in, and the replies built from the supervisor's
//! answers.

use zerg_proto::v1;

use crate::calls::{
    LandHow, LandRush, Landed, NoteTask, Noted, PruneReport, PruneRequest, PrunedRush, RetryTasks,
    RushKey, StartRush, Started, StopRush, note_text,
};
use crate::error::SupervisorError;

/// Longest repository path or feature name accepted.
const MAX_FIELD: usize = 4096;
/// Most task ids accepted in one retry.
const MAX_RETRY_IDS: usize = 100_000;

fn field(name: &str, s: String) -> Result<String, SupervisorError> {
    if s.len() > MAX_FIELD {
        return Err(SupervisorError::invalid_argument(format!(
            "{name}: longer than {MAX_FIELD} bytes"
        )));
    }
    Ok(s)
}

fn key(repo: String, feature: String) -> Result<RushKey, SupervisorError> {
    Ok(RushKey::given(
        field("repo", repo)?,
        field("feature", feature)?,
    ))
}

fn budget(v: Option<f64>) -> Result<Option<f64>, SupervisorError> {
    match v {
        Some(m) if !m.is_finite() || m <= 0.0 => Err(SupervisorError::invalid_argument(format!(
            "max_usd: {m} is not an amount above 0"
        ))),
        v => Ok(v),
    }
}

impl TryFrom<v1::RushRequest> for StartRush {
    type Error = SupervisorError;
    fn try_from(r: v1::RushRequest) -> Result<Self, SupervisorError> {
        let mode = super::mode_from_wire(r.mode).map_err(|raw| {
            SupervisorError::invalid_argument(format!("mode: {raw} is not subprocess or container"))
        })?;
        if r.workers == 0 || r.workers > 64 {
            return Err(SupervisorError::invalid_argument(
                "workers: must be between 1 and 64",
            ));
        }
        Ok(StartRush {
            repo: field("repo", r.repo)?,
            feature: field("feature", r.feature)?,
            workers: r.workers,
            mode,
            max_usd: budget(r.max_usd)?,
        })
    }
}

impl TryFrom<v1::StatusRequest> for RushKey {
    type Error = SupervisorError;
    fn try_from(r: v1::StatusRequest) -> Result<Self, SupervisorError> {
        key(r.repo, r.feature)
    }
}

impl TryFrom<v1::WatchRequest> for RushKey {
    type Error = SupervisorError;
    fn try_from(r: v1::WatchRequest) -> Result<Self, SupervisorError> {
        key(r.repo, r.feature)
    }
}

impl TryFrom<v1::StopRequest> for StopRush {
    type Error = SupervisorError;
    fn try_from(r: v1::StopRequest) -> Result<Self, SupervisorError> {
        Ok(StopRush {
            key: key(r.repo, r.feature)?,
            force: r.force,
        })
    }
}

impl TryFrom<v1::LandRequest> for LandRush {
    type Error = SupervisorError;
    fn try_from(r: v1::LandRequest) -> Result<Self, SupervisorError> {
        Ok(LandRush {
            key: key(r.repo, r.feature)?,
            gates_only: r.gates_only,
        })
    }
}

impl From<Landed> for v1::LandReply {
    fn from(l: Landed) -> Self {
        let outcome = match l.how {
            LandHow::FastForward => v1::LandOutcome::FastForward,
            LandHow::Merge => v1::LandOutcome::Merge,
            LandHow::AlreadyLanded => v1::LandOutcome::AlreadyLanded,
            LandHow::Checked => v1::LandOutcome::Checked,
        };
        v1::LandReply {
            outcome: outcome as i32,
            commit: l.commit,
            base_branch: l.base_branch,
            staging_branch: l.staging_branch,
            gates: l
                .gates
                .into_iter()
                .map(|g| v1::GateRun {
                    name: g.name,
                    required: g.required,
                    passed: g.passed,
                    output: g.output,
                })
                .collect(),
        }
    }
}

impl TryFrom<v1::RetryRequest> for RetryTasks {
    type Error = SupervisorError;
    fn try_from(r: v1::RetryRequest) -> Result<Self, SupervisorError> {
        if r.task_ids.len() > MAX_RETRY_IDS {
            return Err(SupervisorError::invalid_argument(format!(
                "task_ids: more than {MAX_RETRY_IDS}"
            )));
        }
        let task_ids = r
            .task_ids
            .into_iter()
            .map(|t| field("task_ids", t))
            .collect::<Result<_, _>>()?;
        Ok(RetryTasks {
            key: key(r.repo, r.feature)?,
            task_ids,
            reset: r.reset,
            max_usd: budget(r.max_usd)?,
            note: if r.note.is_empty() {
                None
            } else {
                Some(note_text("note", &r.note).map_err(SupervisorError::invalid_argument)?)
            },
        })
    }
}

impl TryFrom<v1::NoteRequest> for NoteTask {
    type Error = SupervisorError;
    fn try_from(r: v1::NoteRequest) -> Result<Self, SupervisorError> {
        if r.task_id.is_empty() {
            return Err(SupervisorError::invalid_argument("task_id: empty"));
        }
        Ok(NoteTask {
            key: key(r.repo, r.feature)?,
            task_id: field("task_id", r.task_id)?,
            text: note_text("text", &r.text).map_err(SupervisorError::invalid_argument)?,
            restart: r.restart,
        })
    }
}

impl From<Noted> for v1::NoteReply {
    fn from(n: Noted) -> Self {
        v1::NoteReply {
            notes: n.notes,
            outcome: n.outcome.to_string(),
        }
    }
}

impl From<Started> for v1::RushReply {
    fn from(s: Started) -> Self {
        v1::RushReply {
            rush_id: s.rush_id,
            warnings: s.warnings,
            resumed: s.resumed,
            mode: super::state::<v1::LaunchMode>(s.mode),
            workers: s.workers,
        }
    }
}

impl From<v1::PruneRequest> for PruneRequest {
    fn from(r: v1::PruneRequest) -> Self {
        Self {
            repo: r.repo,
            feature: r.feature,
            older_than: std::time::Duration::from_secs(r.older_than_seconds),
            dry_run: r.dry_run,
            branches: r.branches,
        }
    }
}

impl From<PrunedRush> for v1::PrunedRush {
    fn from(r: PrunedRush) -> Self {
        Self {
            feature: r.feature,
            rush_id: r.rush_id,
            state: super::state::<v1::RushState>(r.state),
            finished_at: r.finished_at,
            pruned: r.pruned,
            removed: r.removed,
            kept: r.kept,
            bytes: r.bytes,
        }
    }
}

impl From<PruneReport> for v1::PruneReply {
    fn from(r: PruneReport) -> Self {
        Self {
            rushes: r.rushes.into_iter().map(Into::into).collect(),
            dry_run: r.dry_run,
        }
    }
}
