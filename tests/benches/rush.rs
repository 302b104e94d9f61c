//! End-to-end benchmark: a 12-task, 3-level rush with 3 subprocess workers and a stand-in agent
//! that writes its files and sleeps 1 s (the setup the original was measured with), measuring wall time,
//! memory, CLI latency, crash-reassignment latency and heartbeat overhead.
//!
//! Needs release binaries: `cargo build --release --workspace --bins && cargo bench -p zerg-tests`.
//! Results go to docs/benchmarks.md.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;
use zerg_tests::*;

/// Resident set size and peak (VmHWM) of a process, in KiB.
fn mem_kib(pid: i32) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// CPU time (user + system) of a process in clock ticks.
fn cpu_ticks(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn ms_of(ts: &str) -> f64 {
    // "2026-02-03T05:41:55.123Z" -> seconds within the day, as ms.
    let t = &ts[11..23];
    let h: f64 = t[0..2].parse().unwrap_or(0.0);
    let m: f64 = t[3..5].parse().unwrap_or(0.0);
    let s: f64 = t[6..12].parse().unwrap_or(0.0);
    ((h * 60.0 + m) * 60.0 + s) * 1000.0
}

fn main() {
    // 1. Wall time and memory of a 12-task rush.
    let repo = TestRepo::new();
    repo.write_graph("bench", &graph_12("bench"));
    repo.write_config("workers:\n  heartbeat_interval_seconds: 1\n  stop_grace_seconds: 2\n");
    repo.write_script(
        "bench",
        &json!({"default": [{"op": "write_owned"}, {"op": "sleep_ms", "ms": 1000}]}),
    );
    let d = Daemon::start();
    let zergd = d.pid() as i32;
    let start = Instant::now();
    let mut child = Command::new(bin("zergctl"))
        .args(["rush", "bench", "--workers", "3"])
        .current_dir(&repo.path)
        .env("ZERG_SOCKET", &d.socket)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("zergctl");
    let (mut zergd_peak, mut agent_peak, mut total_peak) = (0u64, 0u64, 0u64);
    let mut agents: Vec<i32> = Vec::new();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if let Some(s) = d.status(&repo.path, "bench") {
            for p in worker_pids(&s) {
                if !agents.contains(&p) {
                    agents.push(p);
                }
            }
        }
        let z = mem_kib(zergd).map(|m| m.0).unwrap_or(0);
        zergd_peak = zergd_peak.max(mem_kib(zergd).map(|m| m.1).unwrap_or(0));
        let mut total = z;
        for &a in &agents {
            if let Some((rss, hwm)) = mem_kib(a) {
                agent_peak = agent_peak.max(hwm);
                total += rss;
            }
        }
        total_peak = total_peak.max(total);
        std::thread::sleep(Duration::from_millis(25));
    };
    let wall = start.elapsed();
    assert!(status.success(), "rush failed");
    assert_eq!(repo.task_ids_on("zerg/bench/staging"), graph_12_ids());

    // 2. CLI latency.
    let n = 20;
    let t = Instant::now();
    for _ in 0..n {
        assert!(
            d.ctl_in(&repo.path, &["status", "bench", "--json"])
                .status
                .success()
        );
    }
    let status_ms = t.elapsed().as_secs_f64() * 1000.0 / n as f64;
    let t = Instant::now();
    for _ in 0..n {
        assert!(
            Command::new(bin("zergctl"))
                .arg("--version")
                .output()
                .expect("zergctl")
                .status
                .success()
        );
    }
    let version_ms = t.elapsed().as_secs_f64() * 1000.0 / n as f64;

    // 3. Crash reassignment latency and heartbeat overhead.
    let repo2 = TestRepo::new();
    let signal = repo2.path.parent().unwrap().join("mid");
    repo2.write_graph("crash", &graph_12("crash"));
    repo2.write_config("workers:\n  heartbeat_interval_seconds: 1\n  stop_grace_seconds: 2\n");
    repo2.write_script("crash", &json!({"tasks": {
        "G-L1-001": {"attempts": [[{"op": "touch", "path": signal}, {"op": "sleep_ms", "ms": 10000}], [{"op": "write_owned"}]]}
    }, "default": [{"op": "write_owned"}, {"op": "sleep_ms", "ms": 300}]}));
    assert!(
        d.ctl_in(
            &repo2.path,
            &["rush", "crash", "--workers", "2", "--detach"]
        )
        .status
        .success()
    );
    while !signal.exists() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = d.wait_for(
        &repo2.path,
        "crash",
        Duration::from_secs(60),
        "G-L1-001 running",
        |s| {
            s["workers"]
                .as_object()
                .is_some_and(|w| w.values().any(|x| x["current_task"] == "G-L1-001"))
        },
    );
    let pid = st["workers"]
        .as_object()
        .unwrap()
        .values()
        .find(|x| x["current_task"] == "G-L1-001")
        .and_then(|x| x["pid"].as_i64())
        .unwrap() as i32;
    // Heartbeat overhead: CPU of an agent that waits on a silent agent CLI for 5 s.
    let c0 = cpu_ticks(pid).unwrap_or(0);
    std::thread::sleep(Duration::from_secs(5));
    let c1 = cpu_ticks(pid).unwrap_or(0);
    let hz = 100.0; // USER_HZ on Linux
    let hb_cpu_pct = (c1 - c0) as f64 / hz / 5.0 * 100.0;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let end = d.wait_end(&repo2.path, "crash", Duration::from_secs(120));
    assert_eq!(end["state"], "complete");
    let log = std::fs::read_to_string(Path::new(&repo2.path).join(".zerg/monitor.log")).unwrap();
    let crash_at = log
        .lines()
        .find(|l| l.contains("crashed: signal 9"))
        .map(ms_of)
        .unwrap();
    let reclaim_at = log
        .lines()
        .filter(|l| l.contains("claimed task G-L1-001"))
        .map(ms_of)
        .find(|&t| t >= crash_at)
        .unwrap();

    println!("| measurement | value |");
    println!("|---|---|");
    println!(
        "| 12-task, 3-level rush, 3 workers, agent sleeps 1 s per task: wall time (zergctl rush, start to exit) | {:.2} s |",
        wall.as_secs_f64()
    );
    println!(
        "| zergd peak RSS (VmHWM) | {:.1} MiB |",
        zergd_peak as f64 / 1024.0
    );
    println!(
        "| zerg-worker-agent peak RSS, largest of the workers | {:.1} MiB |",
        agent_peak as f64 / 1024.0
    );
    println!(
        "| zergd + 3 agents, peak of the summed RSS | {:.1} MiB |",
        total_peak as f64 / 1024.0
    );
    println!("| `zergctl status --json`, mean of {n} | {status_ms:.1} ms |");
    println!("| `zergctl --version` (process start), mean of {n} | {version_ms:.1} ms |");
    println!(
        "| kill -9 of a worker → its task claimed by another worker (monitor.log timestamps) | {:.0} ms |",
        reclaim_at - crash_at
    );
    println!(
        "| agent CPU while its agent CLI is silent, heartbeat every 1 s (5 s window) | {hb_cpu_pct:.2} % |"
    );
}
