//! `zergctl status`: one rush's state, as text or JSON, or followed live with `--watch`.

use std::path::Path;

use crate::{CliError, code, connect, from_status, repo_arg};
use zerg_proto::v1;

/// Runs `zergctl status`.
pub async fn run(
    socket: &Path,
    feature: Option<String>,
    repo: Option<std::path::PathBuf>,
    json: bool,
    watch: bool,
    verbose: bool,
) -> Result<u8, CliError> {
    let repo = repo_arg(repo)?;
    let mut c = connect(socket).await?;
    let feature = feature.unwrap_or_default();
    if watch {
        return super::rush::follow(&mut c, &repo, &feature, false, verbose).await;
    }
    let st = c
        .status(v1::StatusRequest { repo, feature })
        .await
        .map_err(from_status)?
        .into_inner();
    if json {
        println!("{}", crate::render::status_json(&st));
    } else {
        print!("{}", crate::render::status_text(&st));
    }
    Ok(code::OK)
}
