//! What workers and zergctl ask of the supervisor, and what it answers, as domain values.
//!
//! The wire messages (`zerg_proto::v1`) stop at the edge: [`crate::wire`] turns each request
//! into one of these types, checking and bounding every field on the way (a worker is treated
//! as possibly hostile), and turns the answers back into replies. The supervisor and the rush
//! state machine see only what is here.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::domain::{FailKind, Mode, Step};
pub use crate::state::{ModelSpend, Tokens};

/// Who is calling on the worker plane: the rush whose socket the call came in on (or, on the
/// TCP plane, the one it names), and the hash of the token it carried.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerAuth {
    /// The rush the socket belongs to.
    pub rush_id: String,
    /// SHA-256 of the presented token; `None` when the call carried none.
    pub token_sha256: Option<String>,
}

impl WorkerAuth {
    /// The auth a worker holding `token` presents on the plane of `rush_id`.
    pub fn for_token(rush_id: &str, token: &crate::launcher::WorkerToken) -> Self {
        Self {
            rush_id: rush_id.to_string(),
            token_sha256: Some(token.hash()),
        }
    }
}

/// What the egress proxy did with one of a confined worker's connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressReport {
    /// `host:port` the connection asked for (or the start of a request that named none).
    pub host: String,
    /// Made by a `worktree.setup` command.
    pub setup: bool,
    /// Refused (else: a setup command reached a host only `sandbox.setup_allow_hosts` allows).
    pub refused: bool,
}

/// Where a remote worker's files of one lease go on zergd's side, and how large a pack it may
/// push.
#[derive(Debug, Clone)]
pub struct LeaseFiles {
    /// `.zerg/logs/tasks/<task>`: its task output.
    pub artifacts: std::path::PathBuf,
    /// How many artifacts, and how many bytes of them, are kept (`container.*`).
    pub artifact_caps: crate::transfers::ArtifactCaps,
    /// The largest pack it may push (`container.max_pack_size`).
    pub max_pack: u64,
    /// The user's checkout, whose ignored files `worktree.copy` names.
    pub repo: std::path::PathBuf,
    /// The rush's `worktree` settings.
    pub worktree: crate::config::WorktreeConfig,
}

/// A lease's base as one pack, in a temporary file: what a remote worker lacks of it.
#[derive(Debug)]
pub struct BasePack {
    /// The pack, written from its start.
    pub file: std::fs::File,
    /// The commits sent without their parents (the worker marks them shallow).
    pub shallow: Vec<String>,
    /// Whether the repository is SHA-256.
    pub sha256: bool,
    /// The pack's size in bytes.
    pub size: u64,
}

/// Who a worker call says it comes from. [`crate::supervisor::rush::Rush::authorize`] checks
/// it against the socket it arrived on and the token it carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The rush the worker belongs to.
    pub rush_id: String,
    /// The worker's slot.
    pub worker: u32,
    /// The slot's spawn generation.
    pub generation: u64,
}

/// A task lease as a worker names it: the task and the fencing token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRef {
    /// Task id.
    pub task_id: String,
    /// Lease id (`<task id>#<n>`).
    pub lease_id: String,
}

/// A worker announces itself.
#[derive(Debug, Clone)]
pub struct Register {
    /// Who.
    pub caller: Caller,
    /// Its process id, as it sees it.
    pub pid: i32,
    /// The lease it still holds, when it re-registers after zergd restarted.
    pub held: Option<LeaseRef>,
}

/// One verification tier as the worker runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierSpec {
    /// 1, 2 or 3.
    pub tier: u32,
    /// "syntax", "correctness" or "quality".
    pub name: &'static str,
    /// `None` means the task's own verification command.
    pub command: Option<String>,
    /// Whether a failure fails the task.
    pub blocking: bool,
    /// Time limit.
    pub timeout: Duration,
}

/// What a registered worker is told.
#[derive(Debug, Clone)]
pub struct Registration {
    /// The agent command as an argv list; the prompt goes last.
    pub agent_command: Vec<String>,
    /// How the worker reads the agent CLI's output.
    pub agent_profile: crate::config::AgentProfile,
    /// Time limit of one agent run.
    pub agent_timeout: Duration,
    /// How often to heartbeat.
    pub heartbeat_interval: Duration,
    /// The verification tiers.
    pub tiers: Vec<TierSpec>,
    /// Feature context for prompts.
    pub spec_context: String,
    /// Feature name.
    pub feature: String,
    /// Tasks in the graph.
    pub tasks_total: u32,
    /// `worktree.setup`.
    pub setup: SetupSpec,
}

/// `worktree.setup` as a worker is told it.
#[derive(Debug, Clone, Default)]
pub struct SetupSpec {
    /// Shell commands, in order.
    pub commands: Vec<String>,
    /// Files whose change reruns them.
    pub when_changed: Vec<String>,
    /// Time limit of the whole setup.
    pub timeout: Duration,
}

/// A task handed to a worker.
#[derive(Debug, Clone, PartialEq)]
pub struct Assignment {
    /// The fencing token of this attempt.
    pub lease_id: String,
    /// Task id.
    pub task_id: String,
    /// Title.
    pub title: String,
    /// Description.
    pub description: String,
    /// Level.
    pub level: u32,
    /// Files the task creates, modifies and reads.
    pub files: zerg_proto::graph::Files,
    /// The task's own verification command and its time limit.
    pub verification: Option<(String, Duration)>,
    /// Replaces the feature context in the prompt when set.
    pub context: Option<String>,
    /// The commit the worktree is reset to first.
    pub base_commit: String,
    /// A checkpoint commit to resume from.
    pub resume_from: Option<String>,
    /// 1 for the first attempt.
    pub attempt: u32,
    /// Acceptance criteria.
    pub acceptance_criteria: Vec<String>,
    /// The prompt's `## Relevant Symbols` section (heading included); empty when there is none.
    pub relevant_symbols: String,
    /// How the previous attempt failed, for the prompt's `## Previous attempt` section; empty
    /// for a first attempt.
    pub previous_attempt: String,
    /// Arguments for the agent CLI on this attempt (`--model <m>`).
    pub agent_args: Vec<String>,
    /// The user's notes for the task, oldest first (the prompt's `## Notes from the user`).
    pub notes: Vec<String>,
}

/// The answer to a lease request.
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseOutcome {
    /// Run this task.
    Task(Box<Assignment>),
    /// Nothing left for this worker: exit.
    Done {
        /// Why.
        reason: String,
    },
}

/// One heartbeat.
#[derive(Debug, Clone)]
pub struct Beat {
    /// Who.
    pub caller: Caller,
    /// The lease being worked on, if any.
    pub lease: Option<LeaseRef>,
    /// What the worker is doing.
    pub step: Step,
    /// 0..=100.
    pub progress_pct: u32,
    /// Unix milliseconds of the agent CLI's last output; 0 if none yet.
    pub last_output_ms: i64,
    /// What the agent CLI said it is doing within the step, empty if nothing.
    pub detail: String,
}

/// The result of one verification tier, as far as zergd keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierOutcome {
    /// 1, 2 or 3.
    pub tier: u32,
    /// Its name.
    pub name: String,
    /// Whether it passed.
    pub success: bool,
}

/// A committed task.
#[derive(Debug, Clone)]
pub struct Completion {
    /// Who.
    pub caller: Caller,
    /// Which lease.
    pub lease: LeaseRef,
    /// The task's commit (a full object id).
    pub commit: String,
    /// Tier results.
    pub tiers: Vec<TierOutcome>,
    /// Changed files outside the task's ownership.
    pub out_of_scope: Vec<String>,
    /// How long the attempt took.
    pub duration_ms: u64,
    /// What the agent CLI reported it cost (0 when unknown).
    pub cost_usd: f64,
    /// What it reported in tokens.
    pub usage: AttemptUsage,
}

/// The tokens an attempt used, as the agent CLI reported them.
#[derive(Debug, Clone, Default)]
pub struct AttemptUsage {
    /// All models together.
    pub tokens: Tokens,
    /// Per model.
    pub models: BTreeMap<String, ModelSpend>,
}

/// A task that did not finish.
#[derive(Debug, Clone)]
pub struct Failure {
    /// Who.
    pub caller: Caller,
    /// Which lease.
    pub lease: LeaseRef,
    /// Why; `None` for a kind this zergd does not know (an ordinary failed attempt).
    pub kind: Option<FailKind>,
    /// What happened, with the output's tail.
    pub message: String,
    /// Tier results.
    pub tiers: Vec<TierOutcome>,
    /// For a rate limit: Unix milliseconds of the reset, 0 if unknown.
    pub retry_at_ms: i64,
    /// For a checkpoint: the WIP commit to resume from.
    pub checkpoint: Option<String>,
    /// What the agent CLI reported it cost (0 when unknown).
    pub cost_usd: f64,
    /// What it reported in tokens.
    pub usage: AttemptUsage,
    /// For a rate limit: which one (`five_hour`, …), empty if not named.
    pub limit_type: String,
    /// What the next attempt should know of this one (output tails, the agent's last message).
    pub context: String,
}

/// An escalation left by the agent CLI.
#[derive(Debug, Clone)]
pub struct EscalationReport {
    /// Who.
    pub caller: Caller,
    /// The task it is about.
    pub task_id: String,
    /// Its category.
    pub category: String,
    /// Its message.
    pub message: String,
    /// The agent's context object, as JSON text (checked to parse).
    pub context_json: String,
}

/// An escalation as zergd keeps and shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Escalation {
    /// The worker that raised it.
    pub worker_id: u32,
    /// Its task.
    pub task_id: String,
    /// Its category.
    pub category: String,
    /// Its message.
    pub message: String,
    /// When (RFC 3339).
    pub timestamp: String,
    /// The agent's context object, as JSON text.
    pub context_json: String,
}

/// Which rush a zergctl command means: the repository, and a feature name or `""` for the
/// repository's most recent rush.
#[derive(Debug, Clone)]
pub struct RushKey {
    /// The repository, as [`RushKey::repo_is`] says.
    pub repo: String,
    /// Feature name, or empty.
    pub feature: String,
    /// What `repo` is.
    pub repo_is: RepoIs,
}

/// What the repository string of a [`RushKey`] is. The supervisor only ever compares it:
/// finding a repository from a path (a walk up to `.git`, which a FIFO or a hung mount can
/// block) is done before the key reaches it, off its thread, with a deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RepoIs {
    /// A path as the client gave it, not yet resolved.
    Given,
    /// The repository root found from the path the client gave, or why none was found.
    Resolved(Result<String, String>),
    /// A repository path exactly as zergd registered it (the dashboard's requests): compared
    /// as a string, never opened.
    Registered,
}

impl RushKey {
    /// A key naming the repository by a path the client gave.
    pub fn given(repo: impl Into<String>, feature: impl Into<String>) -> RushKey {
        RushKey {
            repo: repo.into(),
            feature: feature.into(),
            repo_is: RepoIs::Given,
        }
    }

    /// A key naming a registered rush by its repository string and feature.
    pub fn registered(repo: impl Into<String>, feature: impl Into<String>) -> RushKey {
        RushKey {
            repo: repo.into(),
            feature: feature.into(),
            repo_is: RepoIs::Registered,
        }
    }
}

/// Start (or resume) a rush.
#[derive(Debug, Clone)]
pub struct StartRush {
    /// Repository.
    pub repo: String,
    /// Feature name.
    pub feature: String,
    /// Worker count (1..=64).
    pub workers: u32,
    /// The mode asked for; `None` keeps a resumed rush's own, or means subprocess.
    pub mode: Option<Mode>,
    /// The budget asked for (USD); `None` keeps a resumed rush's own, or the config's.
    pub max_usd: Option<f64>,
}

/// What starting a rush did.
#[derive(Debug, Clone)]
pub struct Started {
    /// The rush's id.
    pub rush_id: String,
    /// Config and graph warnings.
    pub warnings: Vec<String>,
    /// Whether an existing rush was resumed.
    pub resumed: bool,
    /// Where its workers run.
    pub mode: Mode,
    /// How many workers it runs with.
    pub workers: u32,
}

/// Stop a rush.
#[derive(Debug, Clone)]
pub struct StopRush {
    /// Which.
    pub key: RushKey,
    /// Kill at once instead of draining.
    pub force: bool,
}

/// Land a complete rush's staging branch (`zergctl land`).
#[derive(Debug, Clone)]
pub struct LandRush {
    /// Which.
    pub key: RushKey,
    /// Run the gates on the staging head and move nothing.
    pub gates_only: bool,
}

/// How a landing went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LandHow {
    /// The base moved to the staging head.
    FastForward,
    /// The base moved to a merge commit.
    Merge,
    /// The base already held the staging head.
    AlreadyLanded,
    /// Gates only: nothing moved.
    Checked,
}

/// One quality gate run by a landing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateRun {
    /// The gate's name.
    pub name: String,
    /// Whether it must pass.
    pub required: bool,
    /// Whether it passed.
    pub passed: bool,
    /// The end of its output.
    pub output: String,
}

/// A landed (or checked) rush.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Landed {
    /// How.
    pub how: LandHow,
    /// The base branch's new head.
    pub commit: String,
    /// The base branch.
    pub base_branch: String,
    /// The staging branch.
    pub staging_branch: String,
    /// The gates that ran.
    pub gates: Vec<GateRun>,
}

/// Requeue failed or blocked tasks.
#[derive(Debug, Clone)]
pub struct RetryTasks {
    /// Which rush.
    pub key: RushKey,
    /// Empty means every failed or blocked task.
    pub task_ids: Vec<String>,
    /// Also reset attempt counters.
    pub reset: bool,
    /// A new budget (USD); `None` keeps the current one.
    pub max_usd: Option<f64>,
    /// A note for each task requeued by name (or, with none named, each failed one).
    pub note: Option<String>,
}

/// The most bytes one note of the user may hold.
pub const NOTE_MAX_BYTES: usize = 4096;

/// The most notes one task keeps: a further one is refused (nothing is dropped unseen).
pub const NOTES_PER_TASK: usize = 16;

/// The user's note to a task (`zergctl note`).
#[derive(Debug, Clone)]
pub struct NoteTask {
    /// Which rush.
    pub key: RushKey,
    /// Which task.
    pub task_id: String,
    /// The note: plain text, checked by [`note_text`].
    pub text: String,
    /// Stop the running attempt (not counted), or bring a waiting retry forward.
    pub restart: bool,
}

/// What a note did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Noted {
    /// How many notes the task holds now.
    pub notes: u32,
    /// What happened to the task.
    pub outcome: &'static str,
}

/// Checks a note's text: trimmed, not empty, at most [`NOTE_MAX_BYTES`], and plain text (a
/// control character other than a newline or a tab is refused, naming where it is).
pub fn note_text(field: &str, text: &str) -> Result<String, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err(format!("{field}: the note is empty"));
    }
    if t.len() > NOTE_MAX_BYTES {
        return Err(format!(
            "{field}: {} bytes, more than the {NOTE_MAX_BYTES} a note may hold",
            t.len()
        ));
    }
    if let Some((at, c)) = t
        .char_indices()
        .find(|(_, c)| c.is_control() && *c != '\n' && *c != '\t')
    {
        return Err(format!(
            "{field}: a control character (U+{:04X}) at byte {at}; a note is plain text",
            c as u32
        ));
    }
    Ok(t.to_string())
}

/// What `Status`, `Watch` and `List` show of a rush: a read-only view the supervisor hands
/// out, so that the wire projects it without knowing the supervisor's own types.
#[derive(Debug)]
pub struct RushView<'a> {
    /// The rush's state document.
    pub doc: &'a crate::state::StateDoc,
    /// Each level of the graph and the ids of its tasks.
    pub levels: BTreeMap<u32, Vec<&'a str>>,
    /// The graph's last level.
    pub total_levels: u32,
    /// Escalations raised during the rush.
    pub escalations: &'a [Escalation],
    /// Whether the rush has ended.
    pub ended: bool,
    /// How its workers are confined.
    pub sandbox: SandboxView,
}

/// A rush's sandbox as status shows it.
#[derive(Debug, Clone)]
pub struct SandboxView {
    /// `sandbox.mode`.
    pub mode: &'static str,
    /// What is in effect.
    pub enforcement: zerg_sandbox::Enforcement,
    /// The policy of the last worker spawned, once one was.
    pub policy: Option<zerg_sandbox::Policy>,
    /// The hosts the proxy lets through, and those only setup commands may reach.
    pub allow_hosts: Vec<String>,
    /// `sandbox.setup_allow_hosts`.
    pub setup_allow_hosts: Vec<String>,
    /// Connections refused since the rush was loaded.
    pub egress_refused: u64,
}

/// Where a `Watch` goes: the edge turns each update into its own message, so the supervisor
/// hands out lines and views without naming a wire type.
pub trait WatchSink: Send {
    /// Sends one update: a line of the rush's events, the rush's view, or both. Never blocks; an
    /// update a slow client has no room for is dropped (a later snapshot supersedes it).
    fn send(&mut self, line: Option<&crate::monitor::MonitorEvent>, view: Option<&RushView<'_>>);
    /// Whether the client has taken everything sent to it.
    fn drained(&self) -> bool;
    /// Whether the client has gone.
    fn is_closed(&self) -> bool;
}

/// A `Status` question. The edge projects the rush's view into its own answer when the
/// supervisor has the rush (or is told why there is none); the answer goes out once the state
/// it shows is on disk.
pub struct StatusQuery(StatusProjection);

/// See [`StatusQuery`]: the projection, which returns the sending of its answer.
type StatusProjection = Box<
    dyn FnOnce(Result<&RushView<'_>, crate::error::SupervisorError>) -> Box<dyn FnOnce() + Send>
        + Send,
>;

impl StatusQuery {
    /// A question answered by `project`.
    pub fn new(
        project: impl FnOnce(
            Result<&RushView<'_>, crate::error::SupervisorError>,
        ) -> Box<dyn FnOnce() + Send>
        + Send
        + 'static,
    ) -> Self {
        Self(Box::new(project))
    }

    /// Projects the answer now; the returned closure sends it.
    pub fn answer(
        self,
        view: Result<&RushView<'_>, crate::error::SupervisorError>,
    ) -> Box<dyn FnOnce() + Send> {
        (self.0)(view)
    }
}

/// `zergctl prune`: which ended rushes of a repository to forget and remove.
#[derive(Debug, Clone)]
pub struct PruneRequest {
    /// The repository (as the client names it).
    pub repo: String,
    /// Only this feature's rush; empty for every rush of the repository.
    pub feature: String,
    /// Only rushes that ended at least this long ago.
    pub older_than: Duration,
    /// Say what would go, and remove nothing.
    pub dry_run: bool,
    /// Also delete the staging branch (the rush's result).
    pub branches: bool,
}

/// What `zergctl prune` did, rush by rush.
#[derive(Debug, Clone, Default)]
pub struct PruneReport {
    /// Every rush of the repository (or the feature) that zergd knows, pruned or kept.
    pub rushes: Vec<PrunedRush>,
    /// Whether nothing was removed because it was a dry run.
    pub dry_run: bool,
}

/// One rush in a [`PruneReport`].
#[derive(Debug, Clone, Default)]
pub struct PrunedRush {
    /// Its feature.
    pub feature: String,
    /// Its id.
    pub rush_id: String,
    /// Its state.
    pub state: crate::domain::RushState,
    /// When it ended (RFC 3339).
    pub finished_at: String,
    /// Whether it was (or, in a dry run, would be) pruned; false when kept whole.
    pub pruned: bool,
    /// What went (or would go): repository-relative paths and branch names.
    pub removed: Vec<String>,
    /// What was kept, each with why.
    pub kept: Vec<String>,
    /// Bytes freed (or that would be).
    pub bytes: u64,
}

#[cfg(test)]
mod note_tests {
    use super::{NOTE_MAX_BYTES, note_text};

    #[test]
    fn a_note_is_trimmed_plain_text_within_its_cap_and_a_bad_one_is_named() {
        assert_eq!(
            note_text("text", "  use v2\n\tthen test \n").unwrap(),
            "use v2\n\tthen test"
        );
        assert!(
            note_text("text", " \n ")
                .unwrap_err()
                .contains("text: the note is empty")
        );
        let e = note_text("note", &"x".repeat(NOTE_MAX_BYTES + 1)).unwrap_err();
        assert!(e.starts_with("note: 4097 bytes"), "{e}");
        let e = note_text("text", "ok\u{1b}[2J").unwrap_err();
        assert!(e.contains("U+001B") && e.contains("byte 2"), "{e}");
    }
}
