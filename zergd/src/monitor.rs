//! `.zerg/monitor.log` and `.zerg/state/<feature>-events.jsonl`: one line per event.
//!
//! monitor.log lines have exactly the seed's form
//! `2026-02-03T05:41:55.123Z [W0] [INFO] Worker 0 claimed task A-L1-002`, with `[orchestrator]`
//! for zergd's own lines. The same events go as JSON objects
//! `{"timestamp","type","feature","data"}` to the events file. Both are written through
//! tracing-appender's non-blocking writer, so a slow disk never stalls the supervisor loop.

use std::io::Write;
use std::path::Path;
use std::time::SystemTime;

use serde_json::{Value, json};
use tracing_appender::non_blocking::{NonBlocking, WorkerGuard};

use crate::clock::iso_millis;

/// Severity of a monitor line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Normal progress.
    Info,
    /// Something went wrong and was handled.
    Warn,
    /// Something failed.
    Error,
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::Info => "INFO",
            Level::Warn => "WARN",
            Level::Error => "ERROR",
        }
    }
}

/// Who an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// zergd itself.
    Orchestrator,
    /// A worker slot.
    Worker(u32),
}

/// One event, as the state machine records it; the shell writes it out after the state is
/// saved.
#[derive(Debug, Clone, PartialEq)]
pub struct MonitorEvent {
    /// When it happened.
    pub at: SystemTime,
    /// Who it is about.
    pub source: Source,
    /// Severity.
    pub level: Level,
    /// Event type (`task_claimed`, `worker_crash`, …).
    pub kind: String,
    /// The human line.
    pub message: String,
    /// Structured details.
    pub data: Value,
}

/// Writes one rush's monitor and event lines.
pub struct Monitor {
    feature: String,
    log: Option<(NonBlocking, WorkerGuard)>,
    events: Option<(NonBlocking, WorkerGuard)>,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor")
            .field("feature", &self.feature)
            .finish()
    }
}

/// Lines a log writer may hold before its sender waits. The writer's channel allocates (and
/// touches) a slot for each line up front: tracing-appender's default of 128,000 lines is 4 MiB
/// per file, two files per rush. A burst of events is a few hundred lines; the writer thread
/// drains them as they come.
pub const BUFFERED_LINES: usize = 4096;

impl Monitor {
    /// Opens `<repo>/.zerg/monitor.log` and `<repo>/.zerg/state/<feature>-events.jsonl` for
    /// appending.
    pub fn open(repo: &Path, feature: &str) -> Monitor {
        let zerg = repo.join(".zerg");
        let state = zerg.join("state");
        let _ = std::fs::create_dir_all(&state);
        let open = |dir: &Path, name: &str| {
            let appender = tracing_appender::rolling::never(dir, name);
            Some(
                tracing_appender::non_blocking::NonBlockingBuilder::default()
                    .lossy(false)
                    .buffered_lines_limit(BUFFERED_LINES)
                    .finish(appender),
            )
        };
        Monitor {
            feature: feature.to_string(),
            log: open(&zerg, "monitor.log"),
            events: open(&state, &format!("{feature}-events.jsonl")),
        }
    }

    /// A monitor that writes nothing (unit tests).
    pub fn disabled(feature: &str) -> Monitor {
        Monitor {
            feature: feature.to_string(),
            log: None,
            events: None,
        }
    }

    /// Writes one event: a monitor.log line and an events.jsonl object.
    pub fn emit(&mut self, ev: &MonitorEvent) {
        let MonitorEvent {
            at,
            source,
            level,
            kind,
            message,
            data,
        } = ev;
        let (source, level, message) = (*source, *level, message.as_str());
        let mut data = data.clone();
        let ts = iso_millis(*at);
        let line = format_line(&ts, source, level, message);
        tracing::info!(target: "zergd::monitor", feature = %self.feature, "{}", line);
        if let Some((w, _)) = self.log.as_mut() {
            let _ = w.write_all(line.as_bytes());
            let _ = w.write_all(b"\n");
        }
        if let Some((w, _)) = self.events.as_mut() {
            if let Value::Object(m) = &mut data {
                m.insert("message".into(), Value::String(message.to_string()));
                m.insert("severity".into(), Value::String(level.as_str().to_string()));
                if let Source::Worker(n) = source {
                    m.insert("worker_id".into(), json!(n));
                }
            }
            let obj = json!({"timestamp": ts, "type": kind, "feature": self.feature, "data": data});
            let mut bytes = serde_json::to_vec(&obj).unwrap_or_default();
            bytes.push(b'\n');
            let _ = w.write_all(&bytes);
        }
    }
}

/// Formats one monitor.log line.
pub fn format_line(ts: &str, source: Source, level: Level, message: &str) -> String {
    let tag = match source {
        Source::Orchestrator => "orchestrator".to_string(),
        Source::Worker(n) => format!("W{n}"),
    };
    // One event per line: newlines inside messages (stderr excerpts) are folded.
    let message = message.replace(['\n', '\r'], " ");
    format!("{ts} [{tag}] [{}] {message}", level.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_has_the_seed_form() {
        let at = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_770_097_315_123);
        let l = format_line(
            &iso_millis(at),
            Source::Worker(0),
            Level::Info,
            "Worker 0 claimed task A-L1-002",
        );
        assert_eq!(
            l,
            "2026-02-03T05:41:55.123Z [W0] [INFO] Worker 0 claimed task A-L1-002"
        );
        let l = format_line("t", Source::Orchestrator, Level::Warn, "a\nb");
        assert_eq!(l, "t [orchestrator] [WARN] a b");
    }

    #[test]
    fn writes_both_files() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut m = Monitor::open(dir.path(), "feat");
            m.emit(&MonitorEvent {
                at: SystemTime::now(),
                source: Source::Worker(2),
                level: Level::Error,
                kind: "worker_crash".into(),
                message: "Worker 2 crashed".into(),
                data: json!({"exit": 9}),
            });
        }
        let log = std::fs::read_to_string(dir.path().join(".zerg/monitor.log")).unwrap();
        assert!(log.ends_with("[W2] [ERROR] Worker 2 crashed\n"), "{log}");
        let ev = std::fs::read_to_string(dir.path().join(".zerg/state/feat-events.jsonl")).unwrap();
        let v: Value = serde_json::from_str(ev.trim()).unwrap();
        assert_eq!(v["type"], "worker_crash");
        assert_eq!(v["data"]["worker_id"], 2);
        assert_eq!(v["data"]["exit"], 9);
    }
}
