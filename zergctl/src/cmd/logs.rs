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
    use std::io::Write;
    while let Some(chunk) = s.message().await.map_err(from_status)? {
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        let lines: Vec<&str> = if chunk.lines.is_empty() {
            vec![chunk.line.as_str()]
        } else {
            chunk.lines.iter().map(String::as_str).collect()
        };
        for l in lines {
            // A closed pipe (`| head`) ends the command quietly.
            if writeln!(out, "[W{}] {l}", chunk.worker_id).is_err() {
                return Ok(code::OK);
            }
        }
        if out.flush().is_err() {
            return Ok(code::OK);
        }
    }
    Ok(code::OK)
}
