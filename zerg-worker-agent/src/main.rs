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
    // zergd's probe of what the sandbox can enforce: the second wall applied here, inside
    // bubblewrap's namespaces, and the Landlock ABI it got.
    if std::env::args().nth(1).as_deref() == Some("--sandbox-probe") {
        return probe();
    }
    // Inside zergd's sandbox: the second wall, before any thread or child exists.
    if let Some(policy) = std::env::var_os(zerg_sandbox::POLICY_ENV) {
        match serde_json::from_str::<zerg_sandbox::Policy>(&policy.to_string_lossy()) {
            Ok(p) => second_wall(&p),
            Err(e) => {
                eprintln!("zerg-worker-agent: the sandbox policy does not parse: {e}");
                return ExitCode::from(exit::ERROR);
            }
        }
    }
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

/// Applies Landlock to this process: writes only beneath the policy's read-write paths.
#[cfg(target_os = "linux")]
fn second_wall(p: &zerg_sandbox::Policy) {
    match zerg_sandbox::landlock::restrict_self(&p.writable_inside()) {
        Ok(0) => eprintln!("zerg-worker-agent: sandboxed (namespaces; no Landlock on this kernel)"),
        Ok(abi) => eprintln!("zerg-worker-agent: sandboxed (namespaces, Landlock ABI {abi})"),
        Err(e) => eprintln!("zerg-worker-agent: sandboxed (namespaces; {e})"),
    }
}

#[cfg(not(target_os = "linux"))]
fn second_wall(_: &zerg_sandbox::Policy) {}

/// `--sandbox-probe`: restricts itself as a worker would be (writes only to `/tmp`), checks
/// that a write elsewhere is refused, and prints the Landlock ABI that was enforced.
fn probe() -> ExitCode {
    #[cfg(target_os = "linux")]
    let abi =
        zerg_sandbox::landlock::restrict_self(&[std::path::PathBuf::from("/tmp")]).unwrap_or(0);
    #[cfg(not(target_os = "linux"))]
    let abi = 0;
    println!("landlock-abi {abi}");
    ExitCode::SUCCESS
}
