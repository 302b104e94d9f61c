//! The closed sets of values the supervisor works with: the states of rushes, tasks, workers,
//! levels and merges, the launch mode, a worker's step and why an attempt failed.
//!
//! Each is an enum whose serde names are the strings the state file has always held, so a
//! state file written by an earlier version loads and is written back byte-identical. The wire
//! has its own types (`zerg_proto::v1`); the conversions live at the edge.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Defines an enum with fixed string names (used by serde, `Display`, `FromStr` and
/// `as_str`).
macro_rules! closed_set {
    (
        $(#[$meta:meta])*
        $name:ident { $( $(#[$vmeta:meta])* $variant:ident => $text:literal ),+ $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        pub enum $name {
            $( $(#[$vmeta])* #[serde(rename = $text)] $variant, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The name as written in the state file and shown to users.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownValue;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::ALL
                    .iter()
                    .copied()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| UnknownValue {
                        kind: stringify!($name),
                        value: s.chars().take(64).collect(),
                    })
            }
        }
    };
}

/// A string that names no value of a closed set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{value}' is not a valid {kind}")]
pub struct UnknownValue {
    /// The set.
    pub kind: &'static str,
    /// The value given (at most 64 characters of it).
    pub value: String,
}

closed_set! {
    /// The state of a rush.
    #[derive(Default)]
    RushState {
        /// Prepared, no worker started yet.
        #[default]
        Pending => "pending",
        /// Running levels.
        Running => "running",
        /// Waiting for the user (merge conflict, failed gate).
        Paused => "paused",
        /// Every task completed.
        Complete => "complete",
        /// Nothing more can run.
        Failed => "failed",
        /// Stopped by the user.
        Stopped => "stopped",
    }
}

impl RushState {
    /// Whether the rush has ended (complete, failed or stopped).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RushState::Complete | RushState::Failed | RushState::Stopped
        )
    }

    /// Whether the rush still runs or waits to run (pending, running or paused).
    pub fn is_active(self) -> bool {
        !self.is_terminal()
    }
}

closed_set! {
    /// The state of a task.
    #[derive(Default)]
    TaskStatus {
        /// Waiting for its dependencies or a worker.
        #[default]
        Pending => "pending",
        /// Leased to a worker.
        InProgress => "in_progress",
        /// Failed an attempt; retried after a backoff.
        WaitingRetry => "waiting_retry",
        /// Committed and accepted.
        Complete => "complete",
        /// Failed for good.
        Failed => "failed",
        /// A dependency failed.
        Blocked => "blocked",
        /// Held while the rush is paused.
        Paused => "paused",
    }
}

impl TaskStatus {
    /// Whether the task will not run again by itself (complete, failed or blocked).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskStatus::Complete | TaskStatus::Failed | TaskStatus::Blocked
        )
    }
}

closed_set! {
    /// The state of a worker slot.
    #[derive(Default)]
    WorkerStatus {
        /// Being started.
        #[default]
        Starting => "starting",
        /// Registered, idle.
        Ready => "ready",
        /// Running a task.
        Running => "running",
        /// No heartbeat for the stale threshold.
        Stale => "stale",
        /// Waiting to be spawned again.
        Backoff => "backoff",
        /// Told to stop.
        Stopping => "stopping",
        /// Exited.
        Exited => "exited",
        /// Given up after too many failed spawns or respawns.
        GaveUp => "gave_up",
        /// Cannot run tasks (the agent CLI is missing).
        Blocked => "blocked",
        /// Exited because no work is left.
        Done => "done",
    }
}

closed_set! {
    /// The state of a level.
    #[derive(Default)]
    LevelStatus {
        /// Not started.
        #[default]
        Pending => "pending",
        /// Its tasks are running.
        Running => "running",
        /// Merged, every task completed.
        Complete => "complete",
        /// Merged, but some task did not complete.
        Failed => "failed",
    }
}

closed_set! {
    /// The state of a level's merge into staging.
    #[derive(Default)]
    MergeStatus {
        /// Not started.
        #[default]
        Pending => "pending",
        /// Running.
        Merging => "merging",
        /// Merged (and the gates passed).
        Complete => "complete",
        /// A worker's commits conflicted with staging.
        Conflict => "conflict",
        /// A required gate failed, or git did.
        Failed => "failed",
    }
}

closed_set! {
    /// Where workers run.
    #[derive(Default)]
    Mode {
        /// Local processes.
        #[default]
        Subprocess => "subprocess",
        /// `zerg-worker` Docker containers.
        Container => "container",
        /// Docker Swarm services, sharing no filesystem with zergd.
        Swarm => "swarm",
        /// Kubernetes Jobs, sharing no filesystem with zergd.
        Kubernetes => "kubernetes",
    }
}

impl Mode {
    /// Whether its workers share no filesystem with zergd: they fetch their base and push
    /// their commits over the TCP worker plane.
    pub fn is_remote(self) -> bool {
        matches!(self, Mode::Swarm | Mode::Kubernetes)
    }
}

closed_set! {
    /// What a worker is doing, from its last heartbeat.
    Step {
        /// Between the lease and the first heartbeat of the task.
        Initializing => "initializing",
        /// Preparing the worktree.
        LoadingContext => "loading_context",
        /// Running the agent CLI.
        Implementing => "implementing",
        /// Verification tier 1.
        VerifyingTier1 => "verifying_tier1",
        /// Verification tier 2.
        VerifyingTier2 => "verifying_tier2",
        /// Verification tier 3.
        VerifyingTier3 => "verifying_tier3",
        /// Committing.
        Committing => "committing",
        /// Waiting for work.
        Idle => "idle",
    }
}

closed_set! {
    /// Why a worker reports that a task did not finish.
    FailKind {
        /// The agent CLI exited non-zero.
        AgentFailed => "agent_failed",
        /// The agent CLI ran past `agent.timeout_seconds`.
        AgentTimeout => "agent_timeout",
        /// A blocking verification tier failed.
        VerificationFailed => "verification_failed",
        /// Committing failed.
        CommitFailed => "commit_failed",
        /// The agent CLI reported a usage limit.
        RateLimited => "rate_limited",
        /// The agent CLI left a checkpoint.
        Checkpoint => "checkpoint",
        /// The agent CLI escalated to a human.
        Escalated => "escalated",
        /// The agent CLI cannot be run at all.
        AgentMissing => "agent_missing",
        /// The agent CLI is not logged in.
        AuthFailed => "auth_failed",
        /// The agent CLI could not reach its API after its own retries.
        ApiUnreachable => "api_unreachable",
        /// The worker's environment cannot run the task's commands (a failed worktree setup,
        /// a verification command that is not there).
        Environment => "environment",
    }
}

/// Branch of a worker slot.
pub fn worker_branch(feature: &str, id: u32) -> String {
    format!("zerg/{feature}/worker-{id}")
}

/// The staging branch.
pub fn staging_branch(feature: &str) -> String {
    format!("zerg/{feature}/staging")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_through_serde_and_from_str() {
        for s in TaskStatus::ALL {
            let json = serde_json::to_string(s).unwrap();
            assert_eq!(json, format!("\"{}\"", s.as_str()));
            assert_eq!(serde_json::from_str::<TaskStatus>(&json).unwrap(), *s);
            assert_eq!(s.as_str().parse::<TaskStatus>().unwrap(), *s);
        }
        assert_eq!(WorkerStatus::GaveUp.as_str(), "gave_up");
        assert_eq!(Step::VerifyingTier2.as_str(), "verifying_tier2");
        let e = "dancing".parse::<Step>().unwrap_err();
        assert_eq!(e.to_string(), "'dancing' is not a valid Step");
        assert!(serde_json::from_str::<RushState>("\"dancing\"").is_err());
    }

    #[test]
    fn terminal_states() {
        assert!(RushState::Stopped.is_terminal());
        assert!(RushState::Paused.is_active());
        assert!(TaskStatus::Blocked.is_terminal());
        assert!(!TaskStatus::WaitingRetry.is_terminal());
    }
}
