//! `zergctl stop`: stop a rush's workers (SIGTERM, then SIGKILL after the grace period).

use std::path::Path;

use crate::{CliError, code, connect, from_status, repo_arg};
use zerg_proto::v1;

/// Runs `zergctl stop`.
pub async fn run(
    socket: &Path,
    feature: String,
    force: bool,
    repo: Option<std::path::PathBuf>,
) -> Result<u8, CliError> {
    let repo = repo_arg(repo)?;
    let mut c = connect(socket).await?;
    let r = c
        .stop(v1::StopRequest {
            repo,
            feature: feature.clone(),
            force,
        })
        .await
        .map_err(from_status)?
        .into_inner();
    println!(
        "Stopped rush {feature}: {} worker(s) signalled ({}). Resume with `zergctl rush {feature}`.",
        r.workers_signalled,
        if force {
            "SIGKILL"
        } else {
            "SIGTERM, then SIGKILL after the grace period"
        }
    );
    Ok(code::OK)
}
