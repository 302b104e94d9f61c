//! Quality gates in a fresh container of the rush's image, so that the checks of a container
//! rush run the workers' code where the workers ran it, not on zergd's machine.
//!
//! A gate container gets the staging worktree read-only at [`STAGING`], and a copy of it in a
//! scratch `tmpfs` at `/workspace` where the gate runs (build output goes there and is gone
//! with the container). It has what a worker container has — no capabilities,
//! `no-new-privileges`, the memory, CPU and process limits, the rush's network, the workers'
//! uid — and nothing else: no host home, no worker-plane socket, no control socket. Its output
//! is read back capped. It is removed however the gate ends (passed, failed, timed out); one
//! left by a zergd that was killed is found by its label ([`LABEL_GATE`], the rush id) and
//! removed when the next zergd loads the rush ([`sweep`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::Docker;
use bollard::errors::Error as DockerError;
use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, KillContainerOptionsBuilder, ListContainersOptionsBuilder,
    LogsOptionsBuilder, RemoveContainerOptionsBuilder, WaitContainerOptions,
};
use tokio::io::AsyncWriteExt;
use tokio_stream::StreamExt;

use crate::engine::{LABEL_RUSH, status};

/// Label on every gate container (its value is the rush id).
pub const LABEL_GATE: &str = "zerg.gate";

/// Where the staging worktree is mounted, read-only.
pub const STAGING: &str = "/zerg/staging";

/// Copies the staging worktree into the scratch `/workspace` (without its `.git` file, which
/// names a path of zergd's machine) and runs the gate there with `sh -c`.
const SCRIPT: &str = "cp -R /zerg/staging/. /workspace/ && rm -f /workspace/.git && cd /workspace && exec sh -c \"$ZERG_GATE\"";

/// One gate to run in a container.
#[derive(Debug, Clone)]
pub struct GateContainer {
    /// The workers' container settings: image, network, limits, and the output kept
    /// (`log_max_bytes`, `container.log_max_size`). `host` is not used.
    pub container: crate::ContainerSpec,
    /// `uid:gid` the gate runs as: the workers' own.
    pub user: String,
    /// The staging worktree.
    pub staging: PathBuf,
    /// The rush, for the label.
    pub rush_id: String,
    /// The container's name.
    pub name: String,
    /// The gate's shell command.
    pub command: String,
    /// The gate's timeout.
    pub timeout: Duration,
}

/// How a gate in a container ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateOutcome {
    /// Whether it exited 0 within its timeout.
    pub ok: bool,
    /// The end of its output (at most 64 KiB), with a line saying how it ended when it did not
    /// pass.
    pub output: String,
}

/// Bytes of a gate's output kept for its result.
const TAIL: usize = 64 << 10;

fn create_body(g: &GateContainer) -> ContainerCreateBody {
    ContainerCreateBody {
        image: Some(g.container.image.clone()),
        user: Some(g.user.clone()),
        entrypoint: Some(vec!["sh".into(), "-c".into(), SCRIPT.into()]),
        cmd: Some(vec![]),
        env: Some(vec![
            format!("ZERG_GATE={}", g.command),
            "HOME=/workspace".into(),
        ]),
        working_dir: Some("/".into()),
        labels: Some(HashMap::from([
            (LABEL_GATE.to_string(), g.rush_id.clone()),
            (LABEL_RUSH.to_string(), g.rush_id.clone()),
        ])),
        host_config: Some(HostConfig {
            mounts: Some(vec![Mount {
                target: Some(STAGING.into()),
                source: Some(g.staging.to_string_lossy().into_owned()),
                typ: Some(MountType::BIND),
                read_only: Some(true),
                ..Default::default()
            }]),
            tmpfs: Some(HashMap::from([(
                "/workspace".to_string(),
                "rw,exec,mode=1777".to_string(),
            )])),
            ..crate::container::hardened(&g.container)
        }),
        ..Default::default()
    }
}

/// Runs `g` and removes its container, whatever happens; its output (capped) goes to `log`.
/// When `stop` resolves first (the rush stopped), the gate is killed and fails. An error is
/// the engine's, said so that the user can act on it.
pub async fn run(
    docker: &Docker,
    g: &GateContainer,
    log: &Path,
    stop: impl std::future::Future<Output = ()>,
) -> Result<GateOutcome, String> {
    remove(docker, &g.name).await;
    let opts = CreateContainerOptionsBuilder::new().name(&g.name).build();
    let id = docker
        .create_container(Some(opts), create_body(g))
        .await
        .map_err(|e| match status(&e) {
            Some(404) => format!(
                "the gate's image {} is not in the local engine (gates.run_on: worker-image); build it with `zergctl image build`, or set gates.run_on: host",
                g.container.image
            ),
            _ => format!("cannot create the gate's container: {e}"),
        })?
        .id;
    let outcome = run_created(docker, g, &id, log, stop).await;
    remove(docker, &id).await;
    outcome
}

/// How a gate's container stopped running.
enum Ended {
    Exited(i64),
    TimedOut,
    Stopped,
}

async fn run_created(
    docker: &Docker,
    g: &GateContainer,
    id: &str,
    log: &Path,
    stop: impl std::future::Future<Output = ()>,
) -> Result<GateOutcome, String> {
    docker
        .start_container(id, None)
        .await
        .map_err(|e| format!("cannot start the gate's container: {e}"))?;
    let wait = async {
        let mut stream = std::pin::pin!(docker.wait_container(id, None::<WaitContainerOptions>));
        match stream.next().await {
            Some(Ok(r)) => r.status_code,
            Some(Err(DockerError::DockerContainerWaitError { code, .. })) => code,
            _ => -1,
        }
    };
    let ended = tokio::select! {
        r = tokio::time::timeout(g.timeout, wait) => r.map_or(Ended::TimedOut, Ended::Exited),
        () = stop => Ended::Stopped,
    };
    if !matches!(ended, Ended::Exited(_)) {
        let opts = KillContainerOptionsBuilder::new().signal("KILL").build();
        let _ = docker.kill_container(id, Some(opts)).await;
    }
    let mut output = read_output(docker, id, log, g.container.log_max_bytes).await;
    let ok = match ended {
        Ended::Exited(0) => true,
        Ended::Exited(code) => {
            output.push_str(&format!("\n[zerg] the gate exited with {code}\n"));
            false
        }
        Ended::TimedOut => {
            output.push_str(&format!(
                "\n[zerg] the gate timed out after {} s and was killed\n",
                g.timeout.as_secs_f64()
            ));
            false
        }
        Ended::Stopped => {
            output.push_str("\n[zerg] the rush stopped: the gate was killed\n");
            false
        }
    };
    Ok(GateOutcome { ok, output })
}

/// Writes the container's output to `log` (at most `cap` bytes, then a line saying so) and
/// returns its last [`TAIL`] bytes.
async fn read_output(docker: &Docker, id: &str, log: &Path, cap: u64) -> String {
    if let Some(d) = log.parent() {
        let _ = tokio::fs::create_dir_all(d).await;
    }
    let mut file = tokio::fs::File::create(log).await.ok();
    let opts = LogsOptionsBuilder::new().stdout(true).stderr(true).build();
    let mut stream = std::pin::pin!(docker.logs(id, Some(opts)));
    let mut tail: std::collections::VecDeque<u8> = std::collections::VecDeque::new();
    let mut written = 0u64;
    while let Some(Ok(chunk)) = stream.next().await {
        let bytes = chunk.into_bytes();
        if let Some(f) = file.as_mut() {
            let room = cap.saturating_sub(written);
            let take = bytes.len().min(usize::try_from(room).unwrap_or(usize::MAX));
            if f.write_all(&bytes[..take]).await.is_err() {
                file = None;
            } else {
                written += take as u64;
                if take < bytes.len() {
                    let note = format!(
                        "\n[zerg] the gate's output passed container.log_max_size ({cap} bytes); the rest is not kept\n"
                    );
                    let _ = f.write_all(note.as_bytes()).await;
                    file = None;
                }
            }
        }
        tail.extend(bytes.iter());
        let over = tail.len().saturating_sub(TAIL);
        tail.drain(..over);
    }
    String::from_utf8_lossy(tail.make_contiguous()).into_owned()
}

async fn remove(docker: &Docker, id: &str) {
    let opts = RemoveContainerOptionsBuilder::new()
        .force(true)
        .v(true)
        .build();
    if let Err(e) = docker.remove_container(id, Some(opts)).await
        && status(&e) != Some(404)
    {
        tracing::warn!(container = %id, error = %e, "cannot remove a gate container");
    }
}

/// Removes every gate container of rush `rush_id` (a zergd that was killed mid-gate left it: no
/// gate outlives the zergd that ran it); returns how many.
pub async fn sweep(docker: &Docker, rush_id: &str) -> usize {
    let filters = HashMap::from([("label", vec![format!("{LABEL_GATE}={rush_id}")])]);
    let opts = ListContainersOptionsBuilder::new()
        .all(true)
        .filters(&filters)
        .build();
    let Ok(list) = docker.list_containers(Some(opts)).await else {
        return 0;
    };
    let mut n = 0;
    for c in list {
        if let Some(id) = c.id {
            remove(docker, &id).await;
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_container_gets_the_staging_read_only_and_a_worker_containers_limits() {
        let g = GateContainer {
            container: crate::ContainerSpec {
                image: "zerg-worker:latest".into(),
                network: String::new(),
                memory_bytes: 1 << 30,
                cpus: 1.5,
                pids_limit: 256,
                host: None,
                log_max_bytes: 1 << 20,
            },
            user: "10001:10001".into(),
            staging: PathBuf::from("/repo/.zerg/worktrees/f/staging"),
            rush_id: "f-1".into(),
            name: "zerg-gate-x".into(),
            command: "cargo test".into(),
            timeout: Duration::from_secs(5),
        };
        let b = create_body(&g);
        let h = b.host_config.unwrap();
        let m = &h.mounts.unwrap()[0];
        assert_eq!(m.read_only, Some(true));
        assert_eq!(m.target.as_deref(), Some(STAGING));
        assert_eq!(h.network_mode.as_deref(), Some("none"));
        assert_eq!(h.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(h.memory, Some(1 << 30));
        assert_eq!(h.pids_limit, Some(256));
        assert_eq!(b.user.as_deref(), Some("10001:10001"));
        assert!(b.env.unwrap().contains(&"ZERG_GATE=cargo test".to_string()));
        assert_eq!(b.labels.unwrap()[LABEL_GATE], "f-1");
    }
}
