//! `zergctl list`: every rush zergd knows.

use std::path::Path;

use crate::{CliError, code, connect, from_status};
use zerg_proto::WireName;
use zerg_proto::v1;

/// Runs `zergctl list`.
pub async fn run(socket: &Path, json: bool) -> Result<u8, CliError> {
    let mut c = connect(socket).await?;
    let l = c
        .list(v1::ListRequest {})
        .await
        .map_err(from_status)?
        .into_inner();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &l.rushes
                    .iter()
                    .map(crate::json::Summary::from)
                    .collect::<Vec<_>>()
            )
            .unwrap_or_default()
        );
    } else if l.rushes.is_empty() {
        println!("no rushes");
    } else {
        for r in &l.rushes {
            println!(
                "{:<24} {:<9} {:>4}/{:<4} {}  {}",
                r.feature,
                r.state().name(),
                r.tasks_complete,
                r.tasks_total,
                r.started_at,
                r.repo
            );
        }
    }
    Ok(code::OK)
}
