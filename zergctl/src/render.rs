//! Output for people: status text, the live progress view and the end-of-rush summary.

use std::io::IsTerminal;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
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
    if let Some(u) = usage_line(st) {
        o.push_str(&format!("{u}\n"));
    }
    for (m, u) in &st.models {
        o.push_str(&format!(
            "  {m}: ${:.4}, {}\n",
            u.cost_usd,
            tokens_text(&u.tokens)
        ));
    }
    if let Some(h) = hold_text(st) {
        o.push_str(&format!("Held: {h}: no new work until then\n"));
    }
    if let Some(d) = &st.disk {
        let hb = crate::cmd::prune::human_bytes;
        o.push_str(&format!(
            "Disk: {} (worktrees {}, state {}); logs {}, shared by the repository's rushes\n",
            hb(d.worktree_bytes + d.state_bytes),
            hb(d.worktree_bytes),
            hb(d.state_bytes),
            hb(d.log_bytes)
        ));
    }
    if let Some(sb) = &st.sandbox {
        o.push_str(&format!("Sandbox: {}\n", sb.summary));
        if sb.egress_refused > 0 {
            o.push_str(&format!(
                "  egress refused: {} connection(s) (events egress_refused; allow a host with sandbox.allow_hosts)\n",
                sb.egress_refused
            ));
        }
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
        if !w.detail.is_empty() {
            o.push_str(&format!("  [{}]", w.detail));
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
            if let Some(m) = t.attempt_models.last().filter(|m| !m.is_empty()) {
                o.push_str(&format!(" model {m}"));
            }
            if !t.notes.is_empty() {
                o.push_str(&format!(" notes {}", t.notes.len()));
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
            if !t.tokens.is_zero() {
                o.push_str(&format!(
                    " {}/{} tok",
                    count(
                        t.tokens.input_tokens
                            + t.tokens.cache_read_tokens
                            + t.tokens.cache_creation_tokens
                    ),
                    count(t.tokens.output_tokens)
                ));
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

/// `12,345`.
fn count(n: u64) -> String {
    let s = n.to_string();
    let mut o = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            o.push(',');
        }
        o.push(c);
    }
    o
}

fn tokens_text(t: &json::Tokens) -> String {
    format!(
        "tokens {} in, {} out, {} cache read, {} cache write",
        count(t.input_tokens),
        count(t.output_tokens),
        count(t.cache_read_tokens),
        count(t.cache_creation_tokens)
    )
}

/// The rush's cost and tokens, when the agent CLI reported any.
fn usage_line(st: &Status) -> Option<String> {
    if st.cost_usd <= 0.0 && st.tokens.is_zero() {
        return None;
    }
    let budget = if st.max_usd > 0.0 {
        format!(" of a ${:.2} budget", st.max_usd)
    } else {
        String::new()
    };
    Some(format!(
        "Agent cost: ${:.4}{budget}, {} (as reported by the agent CLI)",
        st.cost_usd,
        tokens_text(&st.tokens)
    ))
}

/// `usage limit until 20:22 UTC (five_hour)` while a usage limit holds new work.
fn hold_text(st: &Status) -> Option<String> {
    if st.rate_limited_until.is_empty() {
        return None;
    }
    let hm = st
        .rate_limited_until
        .get(11..16)
        .unwrap_or(&st.rate_limited_until);
    Some(if st.rate_limit_type.is_empty() {
        format!("usage limit until {hm} UTC")
    } else {
        format!("usage limit until {hm} UTC ({})", st.rate_limit_type)
    })
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
    if let Some(u) = usage_line(st) {
        o.push_str(&format!("{u}\n"));
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

/// Events worth a line in the live view without `--verbose`: what went wrong and how the rush
/// moves on. Routine progress (claims, starts, completions, heartbeats) is in the worker lines.
const NOTABLE: &[&str] = &[
    "rush_started",
    "rush_resumed",
    "rush_complete",
    "rush_failed",
    "rush_stopped",
    "level_complete",
    "merge_conflict",
    "merge_conflict_resolution",
    "gate_failed",
    "merge_failed",
    "task_retry",
    "task_failed",
    "task_failed_permanent",
    "task_reassign",
    "task_timeout",
    "worker_crash",
    "worker_gave_up",
    "rate_limited",
    "escalation_created",
    "state_write_failed",
];

/// Whether an event gets a line in the live view.
pub fn notable(ev: &v1::WatchEvent) -> bool {
    !ev.message.is_empty()
        && (NOTABLE.contains(&ev.event.as_str())
            || matches!(ev.level(), v1::EventLevel::Warn | v1::EventLevel::Error))
}

/// One line per worker for the live view: slot, state, task, step, how long the task has run,
/// heartbeat age and attempt.
pub fn worker_lines(st: &v1::RushStatus, now: std::time::SystemTime) -> Vec<String> {
    let st = &Status::from(st);
    let mut workers: Vec<(&String, &json::Worker)> = st.workers.iter().collect();
    workers.sort_by_key(|(k, _)| k.parse::<u32>().unwrap_or(0));
    workers
        .into_iter()
        .map(|(id, w)| {
            let task = st.tasks.get(&w.current_task);
            let (elapsed, attempt) = match task {
                Some(t) if !t.started_at.is_empty() => (
                    age(&t.started_at, now),
                    format!("attempt {}", t.attempts.max(1)),
                ),
                _ => ("-".into(), String::new()),
            };
            let hb = if w.last_heartbeat.is_empty() {
                "-".to_string()
            } else {
                format!("{} ago", age(&w.last_heartbeat, now))
            };
            let mut line = format!(
                "W{id:<2} {:<9} {:<18} {:<16} {:>7}  hb {:<8} {attempt}",
                w.status,
                if w.current_task.is_empty() {
                    "-"
                } else {
                    &w.current_task
                },
                if w.step.is_empty() { "-" } else { &w.step },
                elapsed,
                hb,
            );
            if !w.reason.is_empty() && w.current_task.is_empty() {
                line.push_str(&format!(" ({})", w.reason));
            }
            if !w.detail.is_empty() {
                line.push_str(&format!(" [{}]", w.detail));
            }
            line.trim_end().to_string()
        })
        .collect()
}

/// One line per level: a bar, tasks complete of total, and the merge.
pub fn level_lines(st: &v1::RushStatus) -> Vec<String> {
    let st = &Status::from(st);
    let mut levels: Vec<(&String, &json::Level)> = st.levels.iter().collect();
    levels.sort_by_key(|(k, _)| k.parse::<u32>().unwrap_or(0));
    levels
        .into_iter()
        .map(|(n, l)| {
            format!(
                "L{n:<2} {} {:>3}/{:<3} {:<9} merge {}",
                bar(l.complete as usize, l.tasks as usize, 20),
                l.complete,
                l.tasks,
                l.status,
                l.merge_status
            )
        })
        .collect()
}

/// Live progress while following a rush. On a terminal: a screen redrawn in place, with one
/// bar per level and one line per worker, and the events that matter printed above it. Without
/// one (a pipe, CI): plain event lines, no escape codes. `verbose` prints every event.
pub struct Progress {
    screen: Option<Screen>,
    verbose: bool,
}

struct Screen {
    multi: MultiProgress,
    header: ProgressBar,
    levels: Vec<ProgressBar>,
    workers: Vec<ProgressBar>,
}

fn line_bar(multi: &MultiProgress) -> ProgressBar {
    let b = multi.add(ProgressBar::new(0));
    b.set_style(
        ProgressStyle::with_template("{msg}").unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    b
}

impl Progress {
    /// A progress view on stderr.
    pub fn new(verbose: bool) -> Self {
        let screen = std::io::stderr().is_terminal().then(|| {
            let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
            let header = multi.add(ProgressBar::new(0));
            header.set_style(
                ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            header.enable_steady_tick(std::time::Duration::from_millis(200));
            Screen {
                multi,
                header,
                levels: Vec::new(),
                workers: Vec::new(),
            }
        });
        Progress { screen, verbose }
    }

    /// Prints the event's line if it matters (or with `verbose`).
    pub fn event(&mut self, ev: &v1::WatchEvent) {
        if ev.message.is_empty() || !(self.verbose || notable(ev)) {
            return;
        }
        match &self.screen {
            Some(s) => {
                let _ = s.multi.println(&ev.message);
            }
            None => eprintln!("{}", ev.message),
        }
    }

    /// Redraws the screen for a new status.
    pub fn update(&mut self, st: &v1::RushStatus) {
        let Some(s) = &mut self.screen else { return };
        let total = st.tasks.len();
        let view = Status::from(st);
        let done = done_count(&view);
        let mut extra = String::new();
        if st.cost_usd > 0.0 {
            extra.push_str(&format!(" · ${:.2}", st.cost_usd));
        }
        if let Some(h) = hold_text(&view) {
            extra.push_str(&format!(" · {h}"));
        }
        s.header.set_message(format!(
            "{} [{}] {done}/{total} tasks · level {}/{}{extra}",
            st.feature,
            v1::RushState::try_from(st.state)
                .map(|x| x
                    .as_str_name()
                    .trim_start_matches("RUSH_STATE_")
                    .to_string())
                .unwrap_or_default(),
            st.current_level,
            st.total_levels,
        ));
        let now = std::time::SystemTime::now();
        let levels = level_lines(st);
        while s.levels.len() < levels.len() {
            s.levels.push(line_bar(&s.multi));
        }
        for (b, l) in s.levels.iter().zip(levels) {
            b.set_message(l);
        }
        let workers = worker_lines(st, now);
        while s.workers.len() < workers.len() {
            s.workers.push(line_bar(&s.multi));
        }
        for (b, l) in s.workers.iter().zip(workers) {
            b.set_message(l);
        }
    }

    /// Clears the screen part of the view.
    pub fn finish(&mut self) {
        if let Some(s) = self.screen.take() {
            for b in s.workers.iter().chain(&s.levels) {
                b.finish_and_clear();
            }
            s.header.finish_and_clear();
            let _ = s.multi.clear();
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

    #[test]
    fn the_live_view_has_a_line_per_worker_and_level_and_keeps_only_notable_events() {
        let now = humantime::parse_rfc3339("2026-12-01T10:00:00Z").unwrap();
        let mut st = v1::RushStatus::default();
        for (w, task) in [("0", "A-L1-001"), ("1", ""), ("2", "A-L1-002")] {
            st.workers.insert(
                w.into(),
                v1::WorkerStatus {
                    status: if task.is_empty() {
                        v1::WorkerState::Ready as i32
                    } else {
                        v1::WorkerState::Running as i32
                    },
                    current_task: task.into(),
                    step: v1::Step::Implementing as i32,
                    last_heartbeat: "2026-12-01T09:59:58Z".into(),
                    ..Default::default()
                },
            );
        }
        for (t, attempts) in [("A-L1-001", 1), ("A-L1-002", 2)] {
            st.tasks.insert(
                t.into(),
                v1::TaskStatus {
                    status: v1::TaskState::InProgress as i32,
                    level: 1,
                    attempts,
                    started_at: "2026-12-01T09:59:30Z".into(),
                    ..Default::default()
                },
            );
        }
        st.levels.insert(
            "1".into(),
            v1::LevelStatus {
                status: v1::LevelState::Running as i32,
                tasks: 2,
                complete: 0,
                ..Default::default()
            },
        );
        let workers = worker_lines(&st, now);
        assert_eq!(workers.len(), 3, "{workers:#?}");
        assert!(workers[0].starts_with("W0") && workers[0].contains("A-L1-001"));
        assert!(workers[0].contains("implementing") && workers[0].contains("30s"));
        assert!(workers[0].contains("hb 2s ago") && workers[0].contains("attempt 1"));
        assert!(workers[1].starts_with("W1") && workers[1].contains("ready"));
        assert!(workers[2].contains("attempt 2"));
        let levels = level_lines(&st);
        assert_eq!(levels.len(), 1);
        assert!(
            levels[0].starts_with("L1") && levels[0].contains("0/2"),
            "{levels:?}"
        );

        let ev = |event: &str, level: v1::EventLevel| v1::WatchEvent {
            message: format!("{event} happened"),
            event: event.into(),
            level: level as i32,
            ..Default::default()
        };
        assert!(!notable(&ev("task_claimed", v1::EventLevel::Info)));
        assert!(!notable(&ev("task_started", v1::EventLevel::Info)));
        assert!(!notable(&ev("task_complete", v1::EventLevel::Info)));
        assert!(notable(&ev("worker_crash", v1::EventLevel::Warn)));
        assert!(notable(&ev("merge_conflict", v1::EventLevel::Error)));
        assert!(notable(&ev(
            "merge_conflict_resolution",
            v1::EventLevel::Warn
        )));
        assert!(notable(&ev("level_complete", v1::EventLevel::Info)));
        assert!(
            notable(&ev("anything_new", v1::EventLevel::Warn)),
            "every warning counts"
        );
        assert!(!notable(&v1::WatchEvent::default()));
    }

    /// A rush as people see it mid-way: one task failed for good and blocks another, one runs
    /// on its second attempt, one worker crashed and was respawned, an escalation waits.
    fn mid_rush() -> v1::RushStatus {
        let mut st = v1::RushStatus {
            rush_id: "demo-19ad1".into(),
            repo: "/home/me/app".into(),
            feature: "demo".into(),
            state: v1::RushState::Running as i32,
            current_level: 2,
            total_levels: 3,
            mode: v1::LaunchMode::Subprocess as i32,
            cost_usd: 1.75,
            tokens: Some(v1::Tokens {
                input_tokens: 120_000,
                output_tokens: 8_500,
                cache_read_tokens: 1_250_000,
                cache_creation_tokens: 40_000,
            }),
            rate_limited_until: "2026-12-01T20:22:30.000Z".into(),
            rate_limit_type: "five_hour".into(),
            started_at: "2026-12-01T09:50:00Z".into(),
            staging_branch: "zerg/demo/staging".into(),
            resilience: Some(v1::Resilience {
                spawn_retries: 1,
                stale_detections: 0,
                task_reassignments: 1,
                worker_respawns: 1,
                reconcile_fixes: 0,
            }),
            ..Default::default()
        };
        let task = |status: v1::TaskState, level, worker, attempts, error: &str| v1::TaskStatus {
            status: status as i32,
            level,
            worker_id: worker,
            attempts,
            error: error.into(),
            title: "a task".into(),
            ..Default::default()
        };
        let mut done = task(v1::TaskState::Complete, 1, Some(0), 1, "");
        done.duration_ms = 95_000;
        done.cost_usd = 0.5;
        done.tokens = Some(v1::Tokens {
            input_tokens: 30_000,
            output_tokens: 2_000,
            cache_read_tokens: 300_000,
            cache_creation_tokens: 10_000,
        });
        st.tasks.insert("D-L1-001".into(), done);
        let mut failed = task(
            v1::TaskState::Failed,
            1,
            Some(1),
            3,
            "verification_failed: tier 2 (correctness) exited 1: 2 tests failed",
        );
        failed.cost_usd = 1.25;
        st.tasks.insert("D-L1-002".into(), failed);
        let mut running = task(v1::TaskState::InProgress, 2, Some(0), 2, "");
        running.started_at = "2026-12-01T09:58:30Z".into();
        st.tasks.insert("D-L2-001".into(), running);
        let mut blocked = task(v1::TaskState::Blocked, 2, None, 0, "blocked by D-L1-002");
        blocked.blocked_by = vec!["D-L1-002".into()];
        st.tasks.insert("D-L2-002".into(), blocked);
        st.tasks.insert(
            "D-L3-001".into(),
            task(v1::TaskState::Pending, 3, None, 0, ""),
        );
        st.workers.insert(
            "0".into(),
            v1::WorkerStatus {
                status: v1::WorkerState::Running as i32,
                current_task: "D-L2-001".into(),
                last_heartbeat: "2026-12-01T09:59:57Z".into(),
                step: v1::Step::VerifyingTier2 as i32,
                tasks_completed: 1,
                detail: "API retry 3/10: overloaded".into(),
                ..Default::default()
            },
        );
        st.workers.insert(
            "1".into(),
            v1::WorkerStatus {
                status: v1::WorkerState::Ready as i32,
                last_heartbeat: "2026-12-01T09:59:41Z".into(),
                step: v1::Step::Idle as i32,
                respawns: 1,
                last_exit: "killed by signal 9".into(),
                ..Default::default()
            },
        );
        for (l, status, merge, tasks, complete) in [
            (
                "1",
                v1::LevelState::Complete,
                v1::MergeState::Complete,
                2,
                1,
            ),
            ("2", v1::LevelState::Running, v1::MergeState::Pending, 2, 0),
            ("3", v1::LevelState::Pending, v1::MergeState::Pending, 1, 0),
        ] {
            st.levels.insert(
                l.into(),
                v1::LevelStatus {
                    status: status as i32,
                    merge_status: merge as i32,
                    tasks,
                    complete,
                    ..Default::default()
                },
            );
        }
        st.escalations.push(v1::Escalation {
            worker_id: 1,
            task_id: "D-L1-002".into(),
            category: "ambiguous_spec".into(),
            message: "the spec names two config formats".into(),
            timestamp: "2026-12-01T09:55:00Z".into(),
            ..Default::default()
        });
        st
    }

    #[test]
    fn snapshot_of_the_status_text() {
        let now = humantime::parse_rfc3339("2026-12-01T10:00:00Z").unwrap();
        insta::assert_snapshot!(status_text_at(&mid_rush(), now));
    }

    #[test]
    fn snapshot_of_the_live_view_lines() {
        let now = humantime::parse_rfc3339("2026-12-01T10:00:00Z").unwrap();
        let st = mid_rush();
        let mut screen = level_lines(&st);
        screen.extend(worker_lines(&st, now));
        insta::assert_snapshot!(screen.join("\n"));
    }

    #[test]
    fn snapshot_of_the_end_of_rush_summary() {
        let mut st = mid_rush();
        st.state = v1::RushState::Failed as i32;
        st.reason = "task D-L1-002 failed after 3 attempts; 1 task blocked".into();
        st.report = vec![
            "D-L1-002: failed verification_failed: tier 2 (correctness) exited 1".into(),
            "D-L2-002: blocked blocked by D-L1-002".into(),
        ];
        insta::assert_snapshot!(summary(&st));
    }
}
