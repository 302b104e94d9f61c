//! `zergctl prune`: remove what ended rushes of a repository left on disk.

use std::path::Path;

use crate::{CliError, code, connect, from_status};
use zerg_proto::WireName;
use zerg_proto::v1;

/// A byte count for people: `512 B`, `3.4 KiB`, `12.0 MiB`, `1.2 GiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = UNITS[0];
    for u in &UNITS[1..] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1} {unit}")
}

/// Runs `zergctl prune`.
pub async fn run(socket: &Path, req: v1::PruneRequest, json: bool) -> Result<u8, CliError> {
    let mut c = connect(socket).await?;
    let reply = c.prune(req).await.map_err(from_status)?.into_inner();
    if json {
        let rows: Vec<serde_json::Value> = reply
            .rushes
            .iter()
            .map(|r| {
                serde_json::json!({
                    "feature": r.feature,
                    "rush_id": r.rush_id,
                    "state": r.state().name(),
                    "finished_at": r.finished_at,
                    "pruned": r.pruned,
                    "removed": r.removed,
                    "kept": r.kept,
                    "bytes": r.bytes,
                })
            })
            .collect();
        let doc = serde_json::json!({"dry_run": reply.dry_run, "rushes": rows});
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        return Ok(code::OK);
    }
    if reply.rushes.is_empty() {
        println!("no rushes in this repository");
        return Ok(code::OK);
    }
    let verb = if reply.dry_run {
        "would prune"
    } else {
        "pruned"
    };
    let mut total = 0;
    for r in &reply.rushes {
        if r.pruned {
            total += r.bytes;
            println!(
                "{verb} {} ({}): {}, {} item(s)",
                r.feature,
                r.state().name(),
                human_bytes(r.bytes),
                r.removed.len()
            );
            for x in &r.removed {
                println!("  - {x}");
            }
            for k in &r.kept {
                println!("  kept {k}");
            }
        } else {
            println!(
                "kept {} ({}): {}",
                r.feature,
                r.state().name(),
                r.kept.join("; ")
            );
        }
    }
    println!(
        "{} {}{}",
        if reply.dry_run { "Would free" } else { "Freed" },
        human_bytes(total),
        if reply.dry_run {
            " (dry run: nothing was removed)"
        } else {
            ""
        }
    );
    Ok(code::OK)
}

#[cfg(test)]
mod tests {
    use super::human_bytes;

    #[test]
    fn bytes_read_as_people_write_them() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1024), "1.0 KiB");
        assert_eq!(human_bytes(12 << 20), "12.0 MiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }
}
