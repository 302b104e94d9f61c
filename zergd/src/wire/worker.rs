//! The worker plane's messages, checked and bounded on the way in, built on the way out.
//!
//! Every field a worker sends is treated as hostile: ids must look like ids, commits like full
//! object ids, and no string or list may exceed its limit. A refusal is `InvalidArgument`
//! naming the field, and nothing here can panic on any input.

use std::time::Duration;

use zerg_proto::v1;

use crate::calls::{
    AttemptUsage, Beat, Caller, Completion, EscalationReport, Failure, LeaseOutcome, LeaseRef,
    Register, Registration, TierOutcome,
};
use crate::error::SupervisorError;

pub use zerg_proto::contract::limits::{
    MAX_ID, MAX_MODELS, MAX_NAME, MAX_PATH, MAX_PATHS, MAX_TEXT, MAX_TIERS,
};

fn invalid(field: &str, why: impl std::fmt::Display) -> SupervisorError {
    SupervisorError::invalid_argument(format!("{field}: {why}"))
}

/// A printable ASCII id of at most [`MAX_ID`] bytes; `required` refuses an empty one.
fn id(field: &str, s: String, required: bool) -> Result<String, SupervisorError> {
    if s.is_empty() && required {
        return Err(invalid(field, "missing"));
    }
    if s.len() > MAX_ID {
        return Err(invalid(field, format!("longer than {MAX_ID} bytes")));
    }
    if let Some(c) = s.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(invalid(field, format!("contains {c:?}")));
    }
    Ok(s)
}

fn text(field: &str, s: String, max: usize) -> Result<String, SupervisorError> {
    if s.len() > max {
        return Err(invalid(field, format!("longer than {max} bytes")));
    }
    Ok(s)
}

fn commit(field: &str, s: String) -> Result<String, SupervisorError> {
    if !zerg_git::is_object_id(&s) {
        return Err(invalid(
            field,
            format!(
                "{:?} is not a full lowercase object id",
                s.chars().take(80).collect::<String>()
            ),
        ));
    }
    Ok(s)
}

fn caller(r: Option<v1::WorkerRef>) -> Result<Caller, SupervisorError> {
    let r = r.ok_or_else(|| invalid("worker", "missing"))?;
    Ok(Caller {
        rush_id: id("worker.rush_id", r.rush_id, true)?,
        worker: r.worker_id,
        generation: r.generation,
    })
}

/// A lease named by a task id and a lease id of the form `<task id>#<n>`.
fn lease(task_id: String, lease_id: String) -> Result<LeaseRef, SupervisorError> {
    let task_id = id("task_id", task_id, true)?;
    let lease_id = id("lease_id", lease_id, true)?;
    let well_formed = lease_id.rsplit_once('#').is_some_and(|(t, n)| {
        t == task_id && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
    });
    if !well_formed {
        return Err(invalid(
            "lease_id",
            format!("{lease_id:?} is not a lease of task {task_id:?}"),
        ));
    }
    Ok(LeaseRef { task_id, lease_id })
}

fn tiers(list: Vec<v1::TierResult>) -> Result<Vec<TierOutcome>, SupervisorError> {
    if list.len() > MAX_TIERS {
        return Err(invalid("tiers", format!("more than {MAX_TIERS} results")));
    }
    list.into_iter()
        .map(|t| {
            text("tiers.output_tail", t.output_tail, MAX_TEXT)?;
            Ok(TierOutcome {
                tier: t.tier,
                name: text("tiers.name", t.name, MAX_NAME)?,
                success: t.success,
            })
        })
        .collect()
}

fn finite_cost(field: &str, c: f64) -> Result<f64, SupervisorError> {
    if !c.is_finite() || c < 0.0 {
        return Err(invalid(field, format!("{c} is not a cost")));
    }
    Ok(c)
}

fn tokens(t: Option<v1::Tokens>) -> crate::calls::Tokens {
    let t = t.unwrap_or_default();
    crate::calls::Tokens {
        input_tokens: t.input_tokens,
        output_tokens: t.output_tokens,
        cache_read_tokens: t.cache_read_tokens,
        cache_creation_tokens: t.cache_creation_tokens,
    }
}

fn usage(
    t: Option<v1::Tokens>,
    models: std::collections::HashMap<String, v1::ModelUsage>,
) -> Result<AttemptUsage, SupervisorError> {
    if models.len() > MAX_MODELS {
        return Err(invalid("models", format!("more than {MAX_MODELS} models")));
    }
    let models = models
        .into_iter()
        .map(|(name, m)| {
            let name = text("models", name, MAX_NAME)?;
            let spend = crate::calls::ModelSpend {
                tokens: tokens(m.tokens),
                cost_usd: finite_cost("models.cost_usd", m.cost_usd)?,
            };
            Ok((name, spend))
        })
        .collect::<Result<_, SupervisorError>>()?;
    Ok(AttemptUsage {
        tokens: tokens(t),
        models,
    })
}

impl TryFrom<v1::RegisterRequest> for Register {
    type Error = SupervisorError;
    fn try_from(r: v1::RegisterRequest) -> Result<Self, SupervisorError> {
        let held = if r.held_lease_id.is_empty() {
            None
        } else {
            Some(lease(r.held_task_id, r.held_lease_id)?)
        };
        Ok(Register {
            caller: caller(r.worker)?,
            pid: r.pid,
            held,
        })
    }
}

/// The caller of a lease request.
pub fn lease_caller(r: v1::LeaseRequest) -> Result<Caller, SupervisorError> {
    caller(r.worker)
}

/// Most haves a fetch may name.
pub const MAX_HAVES: usize = 64;

/// A remote worker's fetch of its lease's base: who asks, for which lease, and the commits
/// whose trees it holds.
pub fn fetch_request(
    r: v1::FetchBaseRequest,
) -> Result<(Caller, LeaseRef, Vec<String>), SupervisorError> {
    if r.haves.len() > MAX_HAVES {
        return Err(invalid("haves", format!("more than {MAX_HAVES} commits")));
    }
    let haves = r
        .haves
        .into_iter()
        .map(|h| commit("haves", h))
        .collect::<Result<_, _>>()?;
    Ok((caller(r.worker)?, lease(r.task_id, r.lease_id)?, haves))
}

/// The first message of an egress connection: who opens it.
pub fn egress_caller(r: &mut v1::EgressChunk) -> Result<Caller, SupervisorError> {
    caller(r.worker.take())
}

/// The first message of an artifact: who sends it, for which lease, and the file's name.
pub fn artifact_header(
    r: &mut v1::ArtifactChunk,
) -> Result<(Caller, LeaseRef, String), SupervisorError> {
    let name = std::mem::take(&mut r.name);
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !ok {
        return Err(invalid(
            "name",
            format!(
                "{:?} is not a file name of letters, digits, '.', '_' and '-' (at most 64, not starting with '.')",
                name.chars().take(80).collect::<String>()
            ),
        ));
    }
    Ok((
        caller(r.worker.take())?,
        lease(
            std::mem::take(&mut r.task_id),
            std::mem::take(&mut r.lease_id),
        )?,
        name,
    ))
}

/// The first message of a push: who sends, for which lease, the commit the pack brings, the
/// pack's announced size, and the first of its bytes.
pub struct PushHeader {
    /// Who sends it.
    pub caller: Caller,
    /// The lease it is for.
    pub lease: LeaseRef,
    /// The commit the pack brings.
    pub commit: String,
    /// The pack's announced size.
    pub size: u64,
    /// The first bytes of the pack.
    pub data: Vec<u8>,
}

impl TryFrom<v1::PushChunk> for PushHeader {
    type Error = SupervisorError;
    fn try_from(r: v1::PushChunk) -> Result<Self, SupervisorError> {
        Ok(PushHeader {
            caller: caller(r.worker)?,
            lease: lease(r.task_id, r.lease_id)?,
            commit: commit("commit", r.commit)?,
            size: r.pack_bytes,
            data: r.data,
        })
    }
}

impl TryFrom<v1::HeartbeatRequest> for Beat {
    type Error = SupervisorError;
    fn try_from(r: v1::HeartbeatRequest) -> Result<Self, SupervisorError> {
        let step = super::step_from_wire(r.step)
            .ok_or_else(|| invalid("step", format!("{} is not a known step", r.step)))?;
        let lease = if r.lease_id.is_empty() {
            None
        } else {
            Some(lease(r.task_id, r.lease_id)?)
        };
        Ok(Beat {
            caller: caller(r.worker)?,
            lease,
            step,
            progress_pct: r.progress_pct.min(100),
            last_output_ms: r.last_output_ms.max(0),
            detail: text("detail", r.detail, MAX_NAME)?,
        })
    }
}

impl TryFrom<v1::CompleteRequest> for Completion {
    type Error = SupervisorError;
    fn try_from(r: v1::CompleteRequest) -> Result<Self, SupervisorError> {
        if r.out_of_scope.len() > MAX_PATHS {
            return Err(invalid(
                "out_of_scope",
                format!("more than {MAX_PATHS} paths"),
            ));
        }
        let out_of_scope = r
            .out_of_scope
            .into_iter()
            .map(|p| text("out_of_scope", p, MAX_PATH))
            .collect::<Result<_, _>>()?;
        Ok(Completion {
            caller: caller(r.worker)?,
            lease: lease(r.task_id, r.lease_id)?,
            commit: commit("commit", r.commit)?,
            tiers: tiers(r.tiers)?,
            out_of_scope,
            duration_ms: r.duration_ms,
            cost_usd: finite_cost("cost_usd", r.cost_usd)?,
            usage: usage(r.tokens, r.models)?,
        })
    }
}

impl TryFrom<v1::FailRequest> for Failure {
    type Error = SupervisorError;
    fn try_from(r: v1::FailRequest) -> Result<Self, SupervisorError> {
        let checkpoint = if r.checkpoint_commit.is_empty() {
            None
        } else {
            Some(commit("checkpoint_commit", r.checkpoint_commit)?)
        };
        Ok(Failure {
            caller: caller(r.worker)?,
            lease: lease(r.task_id, r.lease_id)?,
            kind: super::fail_kind_from_wire(r.kind),
            message: text("message", r.message, MAX_TEXT)?,
            tiers: tiers(r.tiers)?,
            retry_at_ms: r.retry_at_ms.max(0),
            checkpoint,
            cost_usd: finite_cost("cost_usd", r.cost_usd)?,
            usage: usage(r.tokens, r.models)?,
            limit_type: text("limit_type", r.limit_type, MAX_NAME)?,
            context: text("context", r.context, MAX_TEXT)?,
        })
    }
}

impl TryFrom<v1::EscalateRequest> for EscalationReport {
    type Error = SupervisorError;
    fn try_from(r: v1::EscalateRequest) -> Result<Self, SupervisorError> {
        let context_json = text("context_json", r.context_json, MAX_TEXT)?;
        if !context_json.is_empty()
            && let Err(e) = serde_json::from_str::<serde_json::Value>(&context_json)
        {
            return Err(invalid("context_json", format!("not JSON: {e}")));
        }
        Ok(EscalationReport {
            caller: caller(r.worker)?,
            task_id: id("task_id", r.task_id, true)?,
            category: text("category", r.category, MAX_NAME)?,
            message: text("message", r.message, MAX_TEXT)?,
            context_json,
        })
    }
}

fn secs(d: Duration) -> u64 {
    d.as_secs().max(1)
}

impl From<Registration> for v1::RegisterReply {
    fn from(r: Registration) -> Self {
        v1::RegisterReply {
            agent_command: r.agent_command,
            agent_profile: r.agent_profile.as_str().to_string(),
            agent_timeout_seconds: secs(r.agent_timeout),
            heartbeat_interval_ms: u64::try_from(r.heartbeat_interval.as_millis())
                .unwrap_or(u64::MAX),
            tiers: r
                .tiers
                .into_iter()
                .map(|t| v1::VerificationTier {
                    tier: t.tier,
                    name: t.name.to_string(),
                    command: t.command.unwrap_or_default(),
                    blocking: t.blocking,
                    timeout_seconds: secs(t.timeout),
                })
                .collect(),
            spec_context: r.spec_context,
            feature: r.feature,
            tasks_total: r.tasks_total,
            setup: Some(v1::WorktreeSetup {
                commands: r.setup.commands,
                when_changed: r.setup.when_changed,
                timeout_seconds: secs(r.setup.timeout),
            }),
        }
    }
}

impl From<LeaseOutcome> for v1::LeaseReply {
    fn from(o: LeaseOutcome) -> Self {
        let outcome = match o {
            LeaseOutcome::Done { reason } => v1::lease_reply::Outcome::Done(v1::Done { reason }),
            LeaseOutcome::Task(a) => {
                let a = *a;
                let (verification_command, timeout) = a
                    .verification
                    .unwrap_or((String::new(), Duration::from_secs(30)));
                v1::lease_reply::Outcome::Task(v1::Task {
                    lease_id: a.lease_id,
                    id: a.task_id,
                    title: a.title,
                    description: a.description,
                    level: a.level,
                    files_create: a.files.create,
                    files_modify: a.files.modify,
                    files_read: a.files.read,
                    verification_command,
                    verification_timeout_seconds: timeout.as_secs(),
                    context: a.context.unwrap_or_default(),
                    base_commit: a.base_commit,
                    resume_from: a.resume_from.unwrap_or_default(),
                    attempt: a.attempt,
                    acceptance_criteria: a.acceptance_criteria,
                    relevant_symbols: a.relevant_symbols,
                    previous_attempt: a.previous_attempt,
                    agent_args: a.agent_args,
                    notes: a.notes,
                })
            }
        };
        v1::LeaseReply {
            outcome: Some(outcome),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> Option<v1::WorkerRef> {
        Some(v1::WorkerRef {
            rush_id: "demo-1".into(),
            worker_id: 1,
            generation: 2,
        })
    }

    fn complete() -> v1::CompleteRequest {
        v1::CompleteRequest {
            worker: me(),
            lease_id: "T1#1".into(),
            task_id: "T1".into(),
            commit: "a".repeat(40),
            ..Default::default()
        }
    }

    fn refused<T>(r: Result<T, SupervisorError>, field: &str) {
        match r {
            Ok(_) => panic!("{field}: accepted"),
            Err(e) => assert!(
                e.message().starts_with(&format!("{field}:")),
                "{field}: {}",
                e.message()
            ),
        }
    }

    #[test]
    fn a_well_formed_report_converts() {
        let c = Completion::try_from(complete()).unwrap();
        assert_eq!(c.caller.worker, 1);
        assert_eq!(c.lease.lease_id, "T1#1");
    }

    #[test]
    fn hostile_fields_are_refused_by_name() {
        refused(
            Completion::try_from(v1::CompleteRequest {
                worker: None,
                ..complete()
            }),
            "worker",
        );
        for bad in ["", "é".repeat(20).as_str(), "ABCDEF", &"a".repeat(41)] {
            refused(
                Completion::try_from(v1::CompleteRequest {
                    commit: bad.into(),
                    ..complete()
                }),
                "commit",
            );
        }
        for bad in ["T2#1", "T1", "T1#", "T1#x", "T1 #1"] {
            refused(
                Completion::try_from(v1::CompleteRequest {
                    lease_id: bad.into(),
                    ..complete()
                }),
                "lease_id",
            );
        }
        refused(
            Completion::try_from(v1::CompleteRequest {
                task_id: "x".repeat(MAX_ID + 1),
                lease_id: format!("{}#1", "x".repeat(MAX_ID + 1)),
                ..complete()
            }),
            "task_id",
        );
        refused(
            Completion::try_from(v1::CompleteRequest {
                out_of_scope: vec![String::new(); MAX_PATHS + 1],
                ..complete()
            }),
            "out_of_scope",
        );
        refused(
            Completion::try_from(v1::CompleteRequest {
                cost_usd: f64::NAN,
                ..complete()
            }),
            "cost_usd",
        );
        refused(
            Failure::try_from(v1::FailRequest {
                worker: me(),
                task_id: "T1".into(),
                lease_id: "T1#1".into(),
                message: "m".repeat(MAX_TEXT + 1),
                ..Default::default()
            }),
            "message",
        );
        refused(
            EscalationReport::try_from(v1::EscalateRequest {
                worker: me(),
                task_id: "T1".into(),
                context_json: "{not json".into(),
                ..Default::default()
            }),
            "context_json",
        );
        refused(
            Beat::try_from(v1::HeartbeatRequest {
                worker: me(),
                step: 99,
                ..Default::default()
            }),
            "step",
        );
    }
}
