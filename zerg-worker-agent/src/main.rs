//! zerg-worker-agent runs inside each zerg worker (a local process or a container).
//!
//! It registers with zergd over gRPC, then loops: lease a task, build the prompt, run the agent
//! CLI (Claude Code by default) in the worktree, run the three verification tiers, commit
//! `ZERG [N]: <title>` with a `Task-ID` trailer, and report. Heartbeats go from the same loop
//! that does the work and carry when the agent CLI last printed, so a hung CLI is visible to
//! zergd, which writes the compatible `heartbeat-<id>.json` and `progress-<id>.json` files from
//! them: the worker needs no write access to zergd's state. Every RPC carries the worker's token
//! (`ZERG_WORKER_TOKEN`), which is never passed on to the agent CLI or verification commands.
//!
//! Exit codes (those of the original ZERG): 0 no work left, 1 error, 2 checkpoint, 3 blocked (the agent CLI
//! cannot run), 4 escalation.

mod prompt;
mod run;
mod session;
mod stream;

use std::process::ExitCode;

use session::{Env, Session};

/// Worker exit codes, from the shared contract.
pub mod exit {
    use zerg_proto::contract::WorkerExit;
    /// No work left.
    pub const SUCCESS: u8 = WorkerExit::Success.code();
    /// Unrecoverable error.
    pub const ERROR: u8 = WorkerExit::Error.code();
    /// Checkpointed; the task resumes elsewhere.
    pub const CHECKPOINT: u8 = WorkerExit::Checkpoint.code();
    /// Cannot run tasks at all (agent CLI missing).
    pub const BLOCKED: u8 = WorkerExit::Blocked.code();
    /// Escalated to a human.
    pub const ESCALATION: u8 = WorkerExit::Escalation.code();
}

fn main() -> ExitCode {
    let env = match Env::from_env() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("zerg-worker-agent: {e}");
            return ExitCode::from(exit::ERROR);
        }
    };
    // Before any thread or child exists: what the agent CLI leaves running comes back here.
    run::become_subreaper();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("zerg-worker-agent: cannot start the runtime: {e}");
            return ExitCode::from(exit::ERROR);
        }
    };
    let code = rt.block_on(async move {
        match Session::start(env).await {
            Ok(mut s) => s.run().await,
            Err(e) => {
                eprintln!("zerg-worker-agent: {e}");
                exit::ERROR
            }
        }
    });
    ExitCode::from(code)
}
