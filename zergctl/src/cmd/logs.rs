//! `zergctl logs`: the workers' output, optionally followed.

use std::path::Path;

use crate::{CliError, code, connect, from_status, repo_arg};
use zerg_proto::v1;

/// Runs `zergctl logs`.
pub async fn run(
    socket: &Path,
    feature: String,
    worker: Option<u32>,
    tail: u32,
    f: bool,
    repo: Option<std::path::PathBuf>,
) -> Result<u8, CliError> {
    let repo = repo_arg(repo)?;
    let mut c = connect(socket).await?;
    let mut s = c
        .logs(v1::LogsRequest {
            repo,
            feature,
            worker_id: worker,
            tail,
            follow: f,
        })
        .await
        .map_err(from_status)?
        .into_inner();
    while let Some(chunk) = s.message().await.map_err(from_status)? {
        println!("[W{}] {}", chunk.worker_id, chunk.line);
    }
    Ok(code::OK)
}
