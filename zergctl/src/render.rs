//! Output for people: status text, the live progress view and the end-of-rush summary.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};
use zerg_proto::v1;

use crate::json::{self, Status};

/// `status --json`, from the CLI's own JSON types ([`crate::json`]).
pub fn status_json(st: &v1::RushStatus) -> String {
    serde_json::to_string_pretty(&Status::from(st)).unwrap_or_else(|_| "{}".into())
}

fn done_count(st: &Status) -> usize {
    st.tasks.values().filter(|t| t.status == "complete").count()
}

/// Up to this many tasks, status text lists completed tasks too (with how long each took).
const SMALL_RUSH: usize = 50;

/// How long ago an RFC 3339 timestamp was, as `4s` or `3m12s`; `-` when there is none.
fn age(ts: &str, now: std::time::SystemTime) -> String {
    match humantime::parse_rfc3339_weak(ts) {
        Ok(t) => short(now.duration_since(t).unwrap_or_default()),
        Err(_) => "-".into(),
    }
}

/// A duration for people: `850ms`, `42s`, `3m12s`, `2h05m`.
fn short(d: std::time::Duration) -> String {
    let s = d.as_secs();
    match s {
        0 => format!("{}ms", d.as_millis()),
        1..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

fn bar(done: usize, total: usize, width: usize) -> String {
    let filled = (done * width).checked_div(total).unwrap_or(0);
    format!("{}{}", "█".repeat(filled), "░".repeat(width - filled))
}

/// `status` as text, with ages and durations counted to the current time.
pub fn status_text(st: &v1::RushStatus) -> String {
    status_text_at(st, std::time::SystemTime::now())
}

/// `status` as text, with ages and durations counted to `now`.
pub fn status_text_at(st: &v1::RushStatus, now: std::time::SystemTime) -> String {
    let st = &Status::from(st);
    let mut o = String::new();
    let total = st.tasks.len();
    let done = done_count(st);
    o.push_str(&format!(
        "Rush {}  [{}]  mode {}  level {}/{}\n",
        st.feature,
        st.state.to_uppercase(),
        st.mode,
        st.current_level,
        st.total_levels
    ));
    o.push_str(&format!(
        "Progress: {} {}% ({done}/{total} tasks)\n",
        bar(done, total, 20),
        (done * 100).checked_div(total).unwrap_or(0)
    ));
    if !st.reason.is_empty() {
        o.push_str(&format!("Reason: {}\n", st.reason));
    }
    if st.cost_usd > 0.0 {
        o.push_str(&format!(
            "Agent cost: ${:.2} (as reported by the agent CLI)\n",
            st.cost_usd
        ));
    }
    if !st.rate_limited_until.is_empty() {
        o.push_str(&format!(
            "Rate-limited until {}: new work is paused\n",
            st.rate_limited_until
        ));
    }
    o.push_str("\nLevels:\n");
    let mut levels: Vec<(&String, &json::Level)> = st.levels.iter().collect();
    levels.sort_by_key(|(k, _)| k.parse::<u32>().unwrap_or(0));
    for (n, l) in levels {
        o.push_str(&format!(
            "  {n:>3}  {:<9} {:>3}/{:<3} merge {}",
            l.status, l.complete, l.tasks, l.merge_status
        ));
        if !l.conflicts.is_empty() {
            o.push_str(&format!("  conflicts: {}", l.conflicts.join(", ")));
        }
        o.push('\n');
    }
    o.push_str("\nWorkers:\n");
    let mut workers: Vec<(&String, &json::Worker)> = st.workers.iter().collect();
    workers.sort_by_key(|(k, _)| k.parse::<u32>().unwrap_or(0));
    for (id, w) in workers {
        let task = if w.current_task.is_empty() {
            "-"
        } else {
            w.current_task.as_str()
        };
        let step = if w.step.is_empty() {
            "-"
        } else {
            w.step.as_str()
        };
        o.push_str(&format!(
            "  W{id:<3} {:<9} task {task:<16} step {step:<16} done {:<3} hb {}",
            w.status,
            w.tasks_completed,
            if w.last_heartbeat.is_empty() {
                "-".to_string()
            } else {
                format!("{} ago", age(&w.last_heartbeat, now))
            }
        ));
        if !w.last_exit.is_empty() {
            o.push_str(&format!("  last exit {}", w.last_exit));
        }
        if !w.reason.is_empty() {
            o.push_str(&format!("  ({})", w.reason));
        }
        o.push('\n');
    }
    // Every started task of a small rush; of a big one, those not complete.
    let small = st.tasks.len() <= SMALL_RUSH;
    let mut not_done: Vec<(&String, &json::Task)> = st
        .tasks
        .iter()
        .filter(|(_, t)| t.status != "pending" && (small || t.status != "complete"))
        .collect();
    not_done.sort_by_key(|(id, t)| (t.level, id.to_string()));
    if !not_done.is_empty() {
        o.push_str("\nTasks:\n");
        for (id, t) in not_done {
            o.push_str(&format!(
                "  {id:<20} {:<13} L{} attempts {}",
                t.status, t.level, t.attempts
            ));
            if let Some(w) = t.worker_id {
                o.push_str(&format!(" W{w}"));
            }
            if t.status == "complete" && t.duration_ms > 0 {
                o.push_str(&format!(
                    " took {}",
                    short(std::time::Duration::from_millis(t.duration_ms))
                ));
            }
            if t.status == "in_progress" && !t.started_at.is_empty() {
                o.push_str(&format!(" running {}", age(&t.started_at, now)));
            }
            if t.cost_usd > 0.0 {
                o.push_str(&format!(" ${:.2}", t.cost_usd));
            }
            if !t.error.is_empty() {
                o.push_str(&format!("  {}", t.error));
            }
            o.push('\n');
        }
    }
    if let Some(r) = &st.resilience {
        o.push_str(&format!(
            "\nResilience: spawn retries {}, stale detections {}, task reassignments {}, worker respawns {}, reconcile fixes {}\n",
            r.spawn_retries, r.stale_detections, r.task_reassignments, r.worker_respawns, r.reconcile_fixes
        ));
    }
    let open: Vec<&json::Escalation> = st.escalations.iter().filter(|e| !e.resolved).collect();
    if !open.is_empty() {
        o.push_str("\nEscalations (need a human):\n");
        for e in open {
            o.push_str(&format!(
                "  W{} {} [{}] {}\n",
                e.worker_id, e.task_id, e.category, e.message
            ));
        }
    }
    for w in &st.warnings {
        o.push_str(&format!("warning: {w}\n"));
    }
    o
}

/// The end-of-rush summary.
pub fn summary(st: &v1::RushStatus) -> String {
    let st = &Status::from(st);
    let total = st.tasks.len();
    let done = done_count(st);
    let mut o = match st.state.as_str() {
        "complete" => format!(
            "✓ Rush {} complete: {done}/{total} tasks. Result on branch {}.\n",
            st.feature, st.staging_branch
        ),
        "paused" => format!("⏸ Rush {} paused: {}\n", st.feature, st.reason),
        "stopped" => format!(
            "■ Rush {} stopped ({done}/{total} tasks done). Resume with `zergctl rush {}`.\n",
            st.feature, st.feature
        ),
        _ => format!(
            "✗ Rush {} failed: {done}/{total} tasks complete.\n",
            st.feature
        ),
    };
    for line in &st.report {
        o.push_str(&format!("  {line}\n"));
    }
    if st.state == "failed" {
        if st.report.is_empty() && !st.reason.is_empty() {
            o.push_str(&format!("  {}\n", st.reason));
        }
        o.push_str(&format!(
            "Fix the cause, then `zergctl retry {}`.\n",
            st.feature
        ));
    }
    o
}

/// Live progress while following a rush: a bar on a terminal, plain lines otherwise.
pub struct Progress {
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A progress view on stderr.
    pub fn new() -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::new(0);
            b.set_style(
                ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} tasks  {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b.enable_steady_tick(std::time::Duration::from_millis(200));
            b
        });
        Progress { bar }
    }

    /// Prints one event line.
    pub fn message(&mut self, message: &str) {
        if message.is_empty() {
            return;
        }
        match &self.bar {
            Some(b) => b.println(message),
            None => eprintln!("{message}"),
        }
    }

    /// Shows a new status.
    pub fn update(&mut self, st: &v1::RushStatus) {
        let st = &Status::from(st);
        if let Some(b) = &self.bar {
            let running = st
                .workers
                .values()
                .filter(|w| w.status == "running")
                .count();
            b.set_length(st.tasks.len() as u64);
            b.set_position(done_count(st) as u64);
            b.set_message(format!(
                "level {}/{} · {running} running · {}",
                st.current_level, st.total_levels, st.state
            ));
        }
    }

    /// Removes the bar.
    pub fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    #[test]
    fn status_text_shows_heartbeat_ages_and_task_durations() {
        let now = humantime::parse_rfc3339("2026-12-01T10:00:00Z").unwrap();
        let mut st = v1::RushStatus {
            feature: "demo".into(),
            ..Default::default()
        };
        st.workers.insert(
            "0".into(),
            v1::WorkerStatus {
                current_task: "T-1".into(),
                last_heartbeat: "2026-12-01T09:59:56.500Z".into(),
                ..Default::default()
            },
        );
        st.workers.insert("1".into(), v1::WorkerStatus::default());
        st.tasks.insert(
            "T-1".into(),
            v1::TaskStatus {
                status: v1::TaskState::InProgress as i32,
                worker_id: Some(0),
                attempts: 2,
                started_at: "2026-12-01T09:58:48Z".into(),
                ..Default::default()
            },
        );
        st.tasks.insert(
            "T-2".into(),
            v1::TaskStatus {
                status: v1::TaskState::Complete as i32,
                attempts: 1,
                duration_ms: 62_000,
                cost_usd: 0.25,
                ..Default::default()
            },
        );
        let text = status_text_at(&st, now);
        assert!(text.contains("hb 3s ago"), "{text}");
        assert!(
            text.contains("T-1") && text.contains("running 1m12s"),
            "{text}"
        );
        assert!(text.contains("attempts 2"), "{text}");
        assert!(
            text.contains("T-2") && text.contains("took 1m02s") && text.contains("$0.25"),
            "{text}"
        );
        // A worker that never sent a heartbeat has no age.
        assert!(
            text.lines().any(|l| l.contains("W1") && l.contains("hb -")),
            "{text}"
        );
        assert_eq!(short(Duration::from_millis(850)), "850ms");
        assert_eq!(short(Duration::from_secs(7325)), "2h02m");
        assert_eq!(age("garbage", SystemTime::now()), "-");
    }
}
