//! The compatible state files: `heartbeat-<id>.json` and `progress-<id>.json` in
//! `ZERG_STATE_DIR`, written atomically (temp file, fsync, rename).

use std::io::Write;
use std::path::Path;
use std::time::SystemTime;

use serde::Serialize;

/// `heartbeat-<id>.json` (REFERENCE §6).
#[derive(Debug, Serialize)]
pub struct HeartbeatFile<'a> {
    pub worker_id: u32,
    pub timestamp: String,
    pub task_id: Option<&'a str>,
    pub step: &'a str,
    pub progress_pct: u32,
}

/// One verification tier result in `progress-<id>.json`.
#[derive(Debug, Clone, Serialize)]
pub struct TierEntry {
    pub tier: u32,
    pub name: String,
    pub success: bool,
    pub retry: u32,
}

/// `progress-<id>.json` (REFERENCE §6).
#[derive(Debug, Serialize)]
pub struct ProgressFile<'a> {
    pub worker_id: u32,
    pub tasks_completed: u32,
    pub tasks_total: u32,
    pub current_task: Option<&'a str>,
    pub current_step: &'a str,
    pub tier_results: &'a [TierEntry],
}

/// UTC timestamp, seconds precision, as the original writes.
pub fn utc_now() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// Writes `value` as JSON to `dir/name` atomically. Errors are reported, not fatal: these files
/// are for compatibility, the gRPC heartbeat is authoritative.
pub fn write_json<T: Serialize>(dir: &Path, name: &str, value: &T) {
    let result = (|| -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let mut tmp = tempfile::Builder::new().prefix(".tmp-").tempfile_in(dir)?;
        serde_json::to_writer(&mut tmp, value).map_err(std::io::Error::other)?;
        tmp.write_all(b"\n")?;
        tmp.as_file().sync_all()?;
        tmp.persist(dir.join(name)).map_err(|e| e.error)?;
        Ok(())
    })();
    if let Err(e) = result {
        eprintln!(
            "zerg-worker-agent: cannot write {}/{name}: {e}",
            dir.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeat_file_has_the_compatible_shape() {
        let dir = tempfile::tempdir().unwrap();
        let hb = HeartbeatFile {
            worker_id: 1,
            timestamp: utc_now(),
            task_id: Some("T-1"),
            step: "verifying_tier2",
            progress_pct: 65,
        };
        write_json(dir.path(), "heartbeat-1.json", &hb);
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("heartbeat-1.json")).unwrap())
                .unwrap();
        assert_eq!(v["worker_id"], 1);
        assert_eq!(v["task_id"], "T-1");
        assert_eq!(v["step"], "verifying_tier2");
        assert_eq!(v["progress_pct"], 65);
        assert!(v["timestamp"].as_str().unwrap().ends_with('Z'));
    }
}
