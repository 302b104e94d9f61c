//! `zergctl retry`: requeue failed and blocked tasks and resume the rush.

use std::path::Path;

use crate::{CliError, code, connect, from_status, repo_arg};
use zerg_proto::v1;

/// Runs `zergctl retry`.
pub async fn run(
    socket: &Path,
    feature: String,
    tasks: Vec<String>,
    reset: bool,
    repo: Option<std::path::PathBuf>,
    max_usd: Option<f64>,
) -> Result<u8, CliError> {
    let repo = repo_arg(repo)?;
    let mut c = connect(socket).await?;
    let r = c
        .retry(v1::RetryRequest {
            repo,
            feature: feature.clone(),
            task_ids: tasks,
            reset,
            max_usd,
        })
        .await
        .map_err(from_status)?
        .into_inner();
    if r.requeued.is_empty() {
        println!("Rush {feature} resumed; no failed or blocked tasks to requeue.");
    } else {
        println!(
            "Requeued {} task(s): {}",
            r.requeued.len(),
            r.requeued.join(", ")
        );
    }
    Ok(code::OK)
}
