//! Workers as local processes.
//!
//! Each `zerg-worker-agent` runs in its own process group (so the agent CLI and anything it
//! starts can be signalled together), with cwd = its worktree and output appended to
//! `.zerg/logs/worker-<N>.log`. tokio reaps the child and reports the exit code at once.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::process::Stdio;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::Command;

use super::{BoxFuture, ExitInfo, ExitSink, Launcher, SpawnError, Spawned, WorkerSpec};

/// Launches workers as child processes of zergd.
#[derive(Debug, Default, Clone)]
pub struct SubprocessLauncher;

/// The SIGKILL deadlines of the workers being stopped, by pid. A worker agent exits at SIGTERM;
/// the rest of its process group (the agent CLI and whatever it started) keeps the grace period
/// all the same, so the exit of the agent does not bring the SIGKILL forward.
static STOPPING: LazyLock<Mutex<HashMap<i32, tokio::time::Instant>>> =
    LazyLock::new(Mutex::default);

/// The stop deadline of the worker `pid`, if it is being stopped.
fn stop_deadline(pid: i32) -> Option<tokio::time::Instant> {
    STOPPING
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&pid)
        .copied()
}

/// Whether a live process is left in the process group `pgid`. A zombie counts for kill(2)
/// but runs nothing, and an orphan's zombie lasts until whoever adopted it reaps it: it does
/// not keep the group. Without `/proc`, any member does.
fn group_alive(pgid: i32) -> bool {
    if matches!(
        killpg(Pid::from_raw(pgid), None),
        Err(nix::errno::Errno::ESRCH)
    ) {
        return false;
    }
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return true;
    };
    procs.flatten().any(|e| {
        e.file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
            .and_then(proc_state_pgrp)
            .is_some_and(|(state, pgrp)| pgrp == pgid && state != 'Z' && state != 'X')
    })
}

/// Waits until the process group `pgid` is empty or `deadline` has passed.
async fn wait_group(pgid: i32, deadline: tokio::time::Instant) {
    while group_alive(pgid) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The environment every subprocess worker gets (the `ZERG_*` variables of the original, plus
/// the worker's token), with host paths.
pub fn worker_env(spec: &WorkerSpec) -> Vec<(String, String)> {
    use zerg_proto::contract::env;
    let p = |x: &std::path::Path| x.to_string_lossy().to_string();
    [
        (env::WORKER_ID, spec.worker_id.to_string()),
        (env::FEATURE, spec.feature.clone()),
        (env::WORKTREE, p(&spec.worktree)),
        (env::BRANCH, spec.branch.clone()),
        (env::SPEC_DIR, p(&spec.spec_dir)),
        (env::STATE_DIR, p(&spec.state_dir)),
        (env::REPO_PATH, p(&spec.repo)),
        (env::LOG_DIR, p(&spec.log_dir)),
        (env::SOCKET, p(&spec.socket)),
        (env::RUSH_ID, spec.rush_id.clone()),
        (env::GENERATION, spec.generation.to_string()),
        (env::WORKER_TOKEN, spec.token.expose().to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// What a confined worker's environment changes: its private home and `/tmp`, the Claude
/// config in that home, the proxy variables that lead to its worker agent's forwarder, and the
/// policy itself (for the worker agent's second wall).
fn sandbox_env(s: &super::SandboxSpec) -> Result<Vec<(String, String)>, SpawnError> {
    let policy = serde_json::to_string(&s.policy)
        .map_err(|e| SpawnError::new(format!("cannot write the sandbox policy: {e}")))?;
    let home = s.home.to_string_lossy().to_string();
    let mut env = vec![
        (zerg_sandbox::POLICY_ENV.to_string(), policy),
        ("HOME".to_string(), home.clone()),
        ("CLAUDE_CONFIG_DIR".to_string(), format!("{home}/.claude")),
        ("TMPDIR".to_string(), "/tmp".to_string()),
    ];
    env.extend(zerg_sandbox::proxy_env(zerg_sandbox::EGRESS_PORT));
    // As in a worker container: the spec is mounted read-only over its tracked files, and a
    // sparse checkout (its patterns in the private admin dir) keeps git from writing or
    // deleting them there; gc would pack into the private object dir for nothing.
    let config = [
        ("gc.auto", "0"),
        ("maintenance.auto", "false"),
        ("core.sparseCheckout", "true"),
        ("core.sparseCheckoutCone", "false"),
        ("sparse.expectFilesOutsideOfPatterns", "true"),
    ];
    env.push(("GIT_CONFIG_COUNT".into(), config.len().to_string()));
    for (i, (k, v)) in config.iter().enumerate() {
        env.push((format!("GIT_CONFIG_KEY_{i}"), k.to_string()));
        env.push((format!("GIT_CONFIG_VALUE_{i}"), v.to_string()));
    }
    Ok(env)
}

impl Launcher for SubprocessLauncher {
    fn spawn(&self, spec: WorkerSpec, on_exit: ExitSink) -> BoxFuture<Result<Spawned, SpawnError>> {
        Box::pin(async move {
            std::fs::create_dir_all(&spec.log_dir).map_err(|e| {
                SpawnError::new(format!(
                    "cannot create log dir {}: {e}",
                    spec.log_dir.display()
                ))
            })?;
            let log_path = spec.log_dir.join(format!("worker-{}.log", spec.worker_id));
            let log = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
                .map_err(|e| SpawnError::new(format!("cannot open {}: {e}", log_path.display())))?;
            let log2 = log
                .try_clone()
                .map_err(|e| SpawnError::new(format!("cannot open {}: {e}", log_path.display())))?;
            let mut cmd = match &spec.sandbox {
                Some(s) => {
                    let mut c = Command::new(&s.bwrap);
                    c.args(zerg_sandbox::bwrap::args(&s.policy, &spec.agent_bin, &[]));
                    c
                }
                None => Command::new(&spec.agent_bin),
            };
            // Only allowlisted variables (and the rush's passthrough) reach the worker.
            cmd.env_clear();
            for (k, v) in std::env::vars_os() {
                if k.to_str()
                    .is_some_and(|k| zerg_proto::contract::env_inherited(k, &spec.env_passthrough))
                {
                    cmd.env(&k, &v);
                }
            }
            cmd.envs(worker_env(&spec));
            if let Some(s) = &spec.sandbox {
                // The spec snapshot is seen where it is mounted, over the worktree's spec dir.
                let spec_dir = spec.worktree.join(".gsd/specs").join(&spec.feature);
                cmd.envs(sandbox_env(s)?)
                    .env(zerg_proto::contract::env::SPEC_DIR, spec_dir)
                    .env_remove(zerg_proto::contract::env::STATE_DIR);
            }
            cmd.current_dir(&spec.worktree)
                .stdin(Stdio::null())
                .stdout(Stdio::from(log))
                .stderr(Stdio::from(log2))
                .process_group(0);
            let mut child = cmd.spawn().map_err(|e| {
                SpawnError::new(format!(
                    "cannot start worker agent {}: {e} (set ZERG_WORKER_AGENT_BIN or install zerg-worker-agent next to zergd)",
                    spec.agent_bin.display()
                ))
            })?;
            let pid = child.id().map(|p| p as i32);
            let start_time = pid.and_then(proc_start_time);
            tokio::spawn(async move {
                let info = match child.wait().await {
                    Ok(st) => {
                        use std::os::unix::process::ExitStatusExt;
                        match (st.code(), st.signal()) {
                            (Some(c), _) => ExitInfo::Code(c),
                            (None, Some(s)) => ExitInfo::Signal(s),
                            _ => ExitInfo::Vanished,
                        }
                    }
                    Err(_) => ExitInfo::Vanished,
                };
                // Whatever the worker started (the agent CLI, a verification command) must not
                // outlive it and keep writing into a worktree that is about to be reused. When
                // the worker is being stopped, what it started gets the rest of the grace first.
                if let Some(pid) = pid {
                    if let Some(deadline) = stop_deadline(pid) {
                        wait_group(pid, deadline).await;
                    }
                    let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                }
                on_exit(info);
            });
            Ok(Spawned {
                pid,
                start_time,
                container_id: None,
            })
        })
    }

    fn stop(&self, worker: Spawned, grace: Duration) -> BoxFuture<()> {
        Box::pin(async move {
            let Some(pid) = worker.pid else { return };
            if !same_process(&worker) {
                return;
            }
            let deadline = tokio::time::Instant::now() + grace;
            STOPPING
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(pid, deadline);
            let _ = killpg(Pid::from_raw(pid), Signal::SIGTERM);
            // The whole group gets the grace, not only the worker agent (which exits at
            // SIGTERM).
            wait_group(pid, deadline).await;
            // The group outlived its grace period (or is stopped): SIGKILL works on stopped
            // processes too.
            if group_alive(pid) {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            }
            STOPPING
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&pid);
        })
    }

    fn is_alive(&self, worker: Spawned) -> BoxFuture<bool> {
        Box::pin(async move { same_process(&worker) })
    }

    fn watch(&self, worker: Spawned, on_exit: ExitSink) {
        tokio::spawn(async move {
            while same_process(&worker) {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            on_exit(ExitInfo::Vanished);
        });
    }
}

/// Whether the recorded pid still names the same, live (non-zombie) process.
pub fn same_process(worker: &Spawned) -> bool {
    let Some(pid) = worker.pid else { return false };
    match (proc_stat(pid), worker.start_time) {
        (Some((state, _)), _) if state == 'Z' || state == 'X' => false,
        (Some((_, start)), Some(want)) => start == want,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// State and process group (fields 3 and 5 of `/proc/<pid>/stat`).
fn proc_state_pgrp(pid: i32) -> Option<(char, i32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let pgrp = fields.nth(1)?.parse().ok()?;
    Some((state, pgrp))
}

/// Start time (field 22 of `/proc/<pid>/stat`).
pub fn proc_start_time(pid: i32) -> Option<u64> {
    proc_stat(pid).map(|(_, s)| s)
}

fn proc_stat(pid: i32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((state, start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_is_alive_while_a_live_process_is_in_it_and_not_with_only_a_zombie() {
        use std::os::unix::process::CommandExt;
        let mut live = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = live.id() as i32;
        assert!(group_alive(pgid));
        live.kill().unwrap();
        live.wait().unwrap();
        assert!(!group_alive(pgid), "an empty group");
        // An exited child not yet reaped: a zombie, the only member of its group.
        let mut zombie = std::process::Command::new("true")
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = zombie.id() as i32;
        while proc_state_pgrp(pgid).is_some_and(|(state, _)| state != 'Z') {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(killpg(Pid::from_raw(pgid), None).is_ok(), "kill(2) sees it");
        assert!(!group_alive(pgid), "a zombie does not keep the group");
        zombie.wait().unwrap();
    }

    #[test]
    fn own_process_is_alive_and_start_time_matters() {
        let me = std::process::id() as i32;
        let st = proc_start_time(me).unwrap();
        assert!(same_process(&Spawned {
            pid: Some(me),
            start_time: Some(st),
            container_id: None
        }));
        assert!(!same_process(&Spawned {
            pid: Some(me),
            start_time: Some(st + 1),
            container_id: None
        }));
        assert!(!same_process(&Spawned {
            pid: None,
            start_time: None,
            container_id: None
        }));
    }
}
