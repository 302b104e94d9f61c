//! What the engine launchers (container and swarm) share, and the labels every launcher puts on
//! what it makes: the engine connection, its errors turned into actionable spawn errors, the
//! image a worker runs in, what a container's exit means, and reading a worker's slot and
//! generation back from its labels.

use std::collections::HashMap;
use std::time::Duration;

use bollard::Docker;
use bollard::errors::Error as DockerError;

use crate::{ExitInfo, SpawnError, WorkerSpec};

/// Label: the rush id.
pub const LABEL_RUSH: &str = "zerg.rush";
/// Label: the feature.
pub const LABEL_FEATURE: &str = "zerg.feature";
/// Label: the worker slot.
pub const LABEL_WORKER: &str = "zerg.worker";
/// Label: the spawn generation.
pub const LABEL_GENERATION: &str = "zerg.generation";

/// The image a worker runs in: the rush's `container.image`, or the default tag.
pub fn image_of(spec: &WorkerSpec) -> String {
    match spec.container.image.trim() {
        "" => zerg_proto::contract::image::DEFAULT_TAG.to_string(),
        image => image.to_string(),
    }
}

/// Maps a container's exit code and OOM flag to an [`ExitInfo`].
pub fn exit_info(code: i64, oom_killed: bool) -> ExitInfo {
    if oom_killed {
        ExitInfo::OomKilled
    } else {
        ExitInfo::Code(code.clamp(i32::MIN as i64, i32::MAX as i64) as i32)
    }
}

/// Engine request timeout (stop requests get the grace period on top).
pub const ENGINE_TIMEOUT: Duration = Duration::from_secs(60);

/// Reads `zerg.worker` and `zerg.generation` from a container's labels.
pub fn parse_worker_labels(labels: &HashMap<String, String>) -> Option<(u32, u64)> {
    let worker = labels.get(LABEL_WORKER)?.parse().ok()?;
    let generation = labels.get(LABEL_GENERATION)?.parse().ok()?;
    Some((worker, generation))
}

/// Connects to the local Docker engine (`DOCKER_HOST`, else `/var/run/docker.sock`), negotiates
/// the API version (the engine may be older than the client) and pings it; the error says what
/// to do when the engine is unreachable.
pub async fn connect_engine() -> Result<Docker, SpawnError> {
    let docker = Docker::connect_with_local_defaults()
        .map_err(|e| unreachable_error(&e))?
        .with_timeout(ENGINE_TIMEOUT);
    let docker = docker
        .negotiate_version()
        .await
        .map_err(|e| unreachable_error(&e))?;
    docker.ping().await.map_err(|e| unreachable_error(&e))?;
    Ok(docker)
}

/// The HTTP status of an engine error, when the engine answered.
pub fn status(e: &DockerError) -> Option<u16> {
    match e {
        DockerError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// The error for an image the engine does not have, saying how to build it.
pub fn missing_image(image: &str) -> SpawnError {
    SpawnError::new(format!(
        "image {image} not found: build it with zergctl image build (or zergctl image build --offline without a registry)"
    ))
}

/// The error for an engine that cannot be reached, saying what to check.
pub fn unreachable_error(e: &DockerError) -> SpawnError {
    let host =
        std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".into());
    SpawnError::new(format!(
        "docker engine unreachable at {host}: {e}; start dockerd (or set DOCKER_HOST), make sure this user may use the engine (docker group), or run the rush with --mode subprocess"
    ))
}

/// An engine error while doing `what`: the engine's answer, or why it could not be reached.
pub fn engine_error(what: &str, e: &DockerError) -> SpawnError {
    match e {
        DockerError::DockerResponseServerError { .. } | DockerError::DockerStreamError { .. } => {
            SpawnError::new(format!("{what}: {e}"))
        }
        _ => unreachable_error(e),
    }
}
