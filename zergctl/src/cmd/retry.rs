//! `zergctl retry`: requeue failed and blocked tasks and resume the rush; `zergctl note`: a
//! note of the user that a task's later attempts carry in their prompt.

use std::path::Path;

use crate::{CliError, code, connect, from_status, repo_arg};
use zerg_proto::v1;

/// What `zergctl retry` asks for.
pub struct Retry {
    /// Feature.
    pub feature: String,
    /// Tasks to requeue; empty means every failed or blocked one.
    pub tasks: Vec<String>,
    /// Also reset the attempt counters.
    pub reset: bool,
    /// A new budget (USD).
    pub max_usd: Option<f64>,
    /// A note for each retried task.
    pub note: Option<String>,
}

/// Runs `zergctl retry`.
pub async fn run(
    socket: &Path,
    r: Retry,
    repo: Option<std::path::PathBuf>,
) -> Result<u8, CliError> {
    let repo = repo_arg(repo)?;
    let mut c = connect(socket).await?;
    let feature = r.feature;
    let reply = c
        .retry(v1::RetryRequest {
            repo,
            feature: feature.clone(),
            task_ids: r.tasks,
            reset: r.reset,
            max_usd: r.max_usd,
            note: r.note.unwrap_or_default(),
        })
        .await
        .map_err(from_status)?
        .into_inner();
    if reply.requeued.is_empty() {
        println!("Rush {feature} resumed; no failed or blocked tasks to requeue.");
    } else {
        println!(
            "Requeued {} task(s): {}",
            reply.requeued.len(),
            reply.requeued.join(", ")
        );
    }
    Ok(code::OK)
}

/// Runs `zergctl note`.
pub async fn note(
    socket: &Path,
    feature: String,
    task: String,
    text: String,
    restart: bool,
    repo: Option<std::path::PathBuf>,
) -> Result<u8, CliError> {
    let repo = repo_arg(repo)?;
    let mut c = connect(socket).await?;
    let reply = c
        .note(v1::NoteRequest {
            repo,
            feature,
            task_id: task.clone(),
            text,
            restart,
        })
        .await
        .map_err(from_status)?
        .into_inner();
    println!(
        "Note added to {task} ({} in all): {}.",
        reply.notes, reply.outcome
    );
    Ok(code::OK)
}
