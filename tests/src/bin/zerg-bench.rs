//! zerg-bench: measures zerg end to end, with the real release binaries, real git and the
//! stand-in agent CLI (`fake-claude`), and prints one JSON object on the last line of stdout.
//!
//! ```sh
//! cargo build --release --workspace --bins
//! cargo run --release -p zerg-tests --bin zerg-bench -- --json            # everything, 3 runs
//! cargo run --release -p zerg-tests --bin zerg-bench -- --quick --json    # a smoke run for CI
//! cargo run --release -p zerg-tests --bin zerg-bench -- --only demo,throughput --json
//! cargo run --release -p zerg-tests --bin zerg-bench -- --markdown out.json > section.md
//! ```
//!
//! Each scenario reports its figures under the keys of the benchmark table in
//! docs/benchmarks.md; a scenario that cannot run here reports why instead.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use zerg_tests::procfs::{childless, cpu_s, cpu_tree_s, mem_kib, written_bytes};
use zerg_tests::*;

/// How long any one rush may take before the scenario is reported as not completing.
const LIMIT: Duration = Duration::from_secs(900);

/// Workers config for benchmarks: heartbeats every second, quick stops.
const BENCH_WORKERS: &str = "workers:\n  heartbeat_interval_seconds: 1\n  stop_grace_seconds: 2\n";

/// Scenario names for `--only`, in the order they run. `vs_original` runs only when `--only`
/// names it or with `--vs-original`.
const SCENARIOS: [&str; 18] = [
    "git",
    "transfer",
    "demo",
    "throughput",
    "processes",
    "big",
    "crash",
    "hang",
    "idle",
    "noisy",
    "reconcile",
    "container",
    "soak",
    "concurrent",
    "restart",
    "build",
    "warm_build",
    "vs_original",
];

struct Opts {
    quick: bool,
    runs: usize,
    vs_original: bool,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--markdown") {
        let Some(path) = args.get(i + 1) else {
            eprintln!("zerg-bench: --markdown needs the JSON file zerg-bench --json wrote");
            std::process::exit(64);
        };
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
            eprintln!("zerg-bench: cannot read {path}: {e}");
            std::process::exit(66)
        });
        let last = text.lines().rev().find(|l| l.trim_start().starts_with('{'));
        let v: Value = match last.map(serde_json::from_str) {
            Some(Ok(v)) => v,
            _ => {
                eprintln!("zerg-bench: {path} has no JSON result line");
                std::process::exit(65)
            }
        };
        print!("{}", markdown(&v));
        return;
    }
    let mut only: Option<Vec<String>> = None;
    let mut rest = args.iter();
    while let Some(a) = rest.next() {
        match a.as_str() {
            "--json" | "--quick" | "--vs-original" => {}
            "--only" => {
                let names: Vec<String> = rest
                    .next()
                    .map(|v| v.split(',').map(str::to_string).collect())
                    .unwrap_or_default();
                if let Some(bad) = names.iter().find(|n| !SCENARIOS.contains(&n.as_str())) {
                    eprintln!(
                        "zerg-bench: --only: no scenario {bad:?} (scenarios: {})",
                        SCENARIOS.join(", ")
                    );
                    std::process::exit(64);
                }
                only = Some(names);
            }
            _ => {
                eprintln!(
                    "zerg-bench: unknown argument {a} (use --json, --quick, --vs-original, --only SCENARIO[,SCENARIO…], --markdown FILE)"
                );
                std::process::exit(64);
            }
        }
    }
    let want = |name: &str| only.as_ref().is_none_or(|o| o.iter().any(|n| n == name));
    let quick = args.iter().any(|a| a == "--quick");
    let opts = Opts {
        quick,
        runs: if quick { 1 } else { 3 },
        vs_original: args.iter().any(|a| a == "--vs-original")
            || only
                .as_ref()
                .is_some_and(|o| o.iter().any(|n| n == "vs_original")),
    };
    let started = Instant::now();
    let mut results = BTreeMap::<String, Value>::new();
    fn record(results: &mut BTreeMap<String, Value>, key: &str, v: Value) {
        eprintln!("zerg-bench: {key} = {v}");
        results.insert(key.to_string(), v);
    }

    // With the throughput scenario, the git loop runs right before each of its runs instead
    // (below): the machine's file system slows as repositories are made and deleted, so a
    // ratio is only fair between figures taken at the same time.
    if want("git") && !want("throughput") {
        record(
            &mut results,
            "git_commit_limit_per_s",
            runs(&opts, || git_commit_limit(&opts)),
        );
    }
    if want("transfer") {
        match transfer() {
            Ok(m) => {
                for (k, v) in m {
                    record(&mut results, k, json!(v));
                }
            }
            Err(e) => record(&mut results, "transfer_task_result_kb", json!({"error": e})),
        }
    }
    let several = |results: &mut BTreeMap<String, Value>,
                   keys: &[&'static str],
                   f: fn(&Opts) -> Result<BTreeMap<&'static str, f64>, String>| {
        let got = runs_obj(&opts, keys, || f(&opts));
        for k in keys {
            record(results, k, got.get(*k).cloned().unwrap_or(Value::Null));
        }
    };
    if want("demo") {
        several(
            &mut results,
            &["demo_wall_over_ideal", "zergd_peak_rss_mb_demo"],
            demo,
        );
    }
    if want("throughput") {
        let keys: &[&'static str] = &[
            "throughput_tasks_per_s",
            "throughput_sandboxed_tasks_per_s",
            "sandboxed_over_unconfined_throughput",
            "zerg_cpu_ms_per_task",
            "zergd_write_syscall_bytes_per_event",
            "zergd_peak_rss_mb_throughput",
            "git_commit_limit_per_s",
            "throughput_over_git_limit",
        ];
        let paired = want("git");
        let got = runs_obj(&opts, keys, || {
            let limit = paired
                .then(|| {
                    settle();
                    git_commit_limit(&opts)
                })
                .transpose()?;
            settle();
            let mut m = throughput(&opts, false)?;
            // The same rush with every worker in the sandbox, right after: the ratio is between
            // figures taken at the same time.
            settle();
            let confined = throughput(&opts, true)?;
            let s = confined["throughput_tasks_per_s"];
            m.insert("throughput_sandboxed_tasks_per_s", s);
            m.insert(
                "sandboxed_over_unconfined_throughput",
                s / m["throughput_tasks_per_s"],
            );
            if let Some(g) = limit {
                let ratio = m["throughput_tasks_per_s"] / g;
                m.insert("git_commit_limit_per_s", g);
                m.insert("throughput_over_git_limit", ratio);
            }
            Ok(m)
        });
        for k in keys {
            if let Some(v) = got.get(*k) {
                record(&mut results, k, v.clone());
            }
        }
    }
    if want("throughput") {
        record(
            &mut results,
            "sandbox_spawn_ms",
            runs(&opts, sandbox_spawn_ms),
        );
    }
    if want("processes") {
        let p = processes(&opts);
        for k in ["processes_per_task", "git_fallbacks"] {
            let v = p
                .get(k)
                .cloned()
                .map(|v| json!({"median": v, "runs": 1, "detail": p}))
                .unwrap_or_else(|| p.clone());
            record(&mut results, k, v);
        }
    }
    if want("big") && opts.quick {
        for k in ["big_rush_10k", "state_write_bytes_per_event"] {
            record(&mut results, k, json!({"skipped": "not in --quick"}));
        }
    } else if want("big") {
        let big = big_rush();
        let per_event = match &big["state_write_bytes_per_event"] {
            Value::Number(n) => json!({"median": n, "runs": 1, "tasks": 10_000}),
            other => other.clone(),
        };
        record(&mut results, "big_rush_10k", big);
        record(&mut results, "state_write_bytes_per_event", per_event);
    }
    if want("crash") {
        let crash = crash_reassign(&opts);
        record(&mut results, "crash_reassign_ms_p50", crash["p50"].clone());
        record(&mut results, "crash_reassign_ms_p99", crash["p99"].clone());
    }
    if want("hang") {
        record(&mut results, "hang_detect_s", runs(&opts, hang_detect));
    }
    if want("idle") {
        let idle = idle_workers(&opts);
        for k in [
            "zergd_rss_mb_50_workers",
            "agent_rss_mb",
            "heartbeat_cpu_pct_per_worker",
        ] {
            record(&mut results, k, idle.get(k).cloned().unwrap_or(Value::Null));
        }
    }
    if want("noisy") {
        record(
            &mut results,
            "noisy_verify_overhead_ms",
            runs(&opts, noisy_verify_overhead),
        );
    }
    if want("reconcile") {
        record(
            &mut results,
            "reconcile_ms_10k_tasks",
            runs(&opts, reconcile_ms_10k),
        );
    }
    if want("container") {
        record(&mut results, "container_ready_s_10", container_ready(&opts));
    }
    if want("soak") {
        record(&mut results, "soak_sequential_rushes", soak(&opts));
    }
    if want("concurrent") {
        record(&mut results, "concurrent_8_rushes", concurrent());
    }
    if want("restart") {
        record(
            &mut results,
            "restart_first_list_ms_500_ended",
            restart_500(),
        );
    }
    if want("build") {
        let v = if opts.quick {
            json!({"skipped": "not in --quick"})
        } else {
            clean_release_build()
        };
        record(&mut results, "clean_release_build_s", v);
    }
    if want("warm_build") {
        record(
            &mut results,
            "warm_build_second_over_first",
            runs_warm(&opts),
        );
    }
    if opts.vs_original {
        record(&mut results, "vs_original", vs_original(&opts));
    }
    let machine = json!({
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "memory_gib": mem_total_gib(),
        "quick": opts.quick,
        "runs": opts.runs,
        "seconds": round(started.elapsed().as_secs_f64(), 1),
    });
    let failed: Vec<&String> = results
        .iter()
        .filter(|(_, v)| v.get("error").is_some() || v["completed"] == false)
        .map(|(k, _)| k)
        .collect();
    let code = i32::from(!failed.is_empty());
    if !failed.is_empty() {
        eprintln!("zerg-bench: scenarios that did not run to their end: {failed:?}");
    }
    let out = json!({"machine": machine, "results": results});
    println!("{out}");
    std::process::exit(code);
}

fn round(x: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (x * m).round() / m
}

fn mem_total_gib() -> f64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map(|kib| round(kib / 1024.0 / 1024.0, 1))
        .unwrap_or(0.0)
}

/// Runs a scenario that yields one number `opts.runs` times: median, min, max and each run.
fn runs(opts: &Opts, mut f: impl FnMut() -> Result<f64, String>) -> Value {
    let mut xs = Vec::new();
    for _ in 0..opts.runs {
        match f() {
            Ok(x) => xs.push(x),
            Err(why) => return json!({"error": why}),
        }
    }
    summary(&xs)
}

fn summary(xs: &[f64]) -> Value {
    let mut s = xs.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let median = s[s.len() / 2];
    json!({"median": round(median, 3), "min": round(s[0], 3), "max": round(s[s.len() - 1], 3), "runs": xs.iter().map(|x| round(*x, 3)).collect::<Vec<_>>()})
}

/// Runs a scenario that yields several numbers `opts.runs` times; a summary per number.
fn runs_obj(
    opts: &Opts,
    keys: &[&'static str],
    mut f: impl FnMut() -> Result<BTreeMap<&'static str, f64>, String>,
) -> BTreeMap<String, Value> {
    let mut all: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for _ in 0..opts.runs {
        match f() {
            Ok(m) => {
                for (k, v) in m {
                    all.entry(k).or_default().push(v);
                }
            }
            Err(why) => {
                return keys
                    .iter()
                    .map(|k| (k.to_string(), json!({"error": why})))
                    .collect();
            }
        }
    }
    all.into_iter()
        .map(|(k, v)| (k.to_string(), summary(&v)))
        .collect()
}

/// Waits until the files the last run deleted no longer slow the next one's file creation:
/// ext4 skips inodes freed in the last 30 s (`dirty_expire_centisecs`, plus 5 s while their
/// block is dirty) when it allocates one, reading inode table blocks as it goes, so a run that
/// starts right after a deleted repository spends much of its CPU in the kernel's inode
/// allocation, and each run of a series is slower than the last.
fn settle() {
    let expire_s = std::fs::read_to_string("/proc/sys/vm/dirty_expire_centisecs")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or(30, |c| c / 100);
    std::thread::sleep(Duration::from_secs(expire_s.min(60) + 5));
}

/// `git add` + `git commit` of one file in a loop, on 2 processes at once: the machine's own
/// limit for what a rush does once per task.
fn git_commit_limit(opts: &Opts) -> Result<f64, String> {
    let n = if opts.quick { 60 } else { 300 };
    let dirs: Vec<tempfile::TempDir> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    for d in &dirs {
        git(d.path(), &["init", "-q", "-b", "main"]);
    }
    let t = Instant::now();
    let handles: Vec<_> = dirs
        .iter()
        .map(|d| {
            let p = d.path().to_path_buf();
            std::thread::spawn(move || {
                for i in 0..n {
                    std::fs::write(p.join(format!("f{i}.txt")), "x").unwrap();
                    git(&p, &["add", "-A"]);
                    git(&p, &["commit", "-q", "-m", "c"]);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| "a git loop panicked".to_string())?;
    }
    Ok((2 * n) as f64 / t.elapsed().as_secs_f64())
}

/// Runs `zergctl rush FEATURE` to its end; returns the wall time.
fn rush_to_end(
    d: &Daemon,
    repo: &TestRepo,
    feature: &str,
    workers: u32,
) -> Result<Duration, String> {
    let t = Instant::now();
    let out = d.ctl_in(
        &repo.path,
        &["rush", feature, "--workers", &workers.to_string()],
    );
    let wall = t.elapsed();
    if !out.status.success() {
        return Err(format!(
            "rush {feature} did not complete: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ));
    }
    Ok(wall)
}

/// The scripted agent of the demo: it writes the task's files, then sleeps 1 s.
fn demo_script() -> Value {
    json!({"default": [{"op": "write_owned"}, {"op": "sleep_ms", "ms": 1000}]})
}

/// The demo's repository: the 12-task graph as feature `demo`, the bench's workers config and
/// [`demo_script`], with zergd's default sandbox (`auto`), as `zergctl demo` runs.
fn demo_repo() -> TestRepo {
    let repo = TestRepo::new();
    repo.write_graph("demo", &graph_12("demo"));
    repo.configure(
        &Config::fake_agent()
            .merge_yaml(BENCH_WORKERS)
            .set("sandbox.mode", "auto"),
    );
    repo.write_script("demo", &demo_script());
    repo
}

/// The 12-task, 3-level graph on 3 workers, the agent sleeping 1 s per task: wall time over
/// the ideal (levels of 5, 4 and 3 tasks on 3 workers take 2 + 2 + 1 rounds of 1 s).
fn demo(_: &Opts) -> Result<BTreeMap<&'static str, f64>, String> {
    let repo = demo_repo();
    let d = Daemon::start();
    let wall = rush_to_end(&d, &repo, "demo", 3)?;
    let peak = mem_kib(d.pid() as i32).map(|m| m.1).unwrap_or(0);
    Ok(BTreeMap::from([
        ("demo_wall_over_ideal", wall.as_secs_f64() / 5.0),
        ("zergd_peak_rss_mb_demo", peak as f64 / 1024.0),
    ]))
}

/// How long a sandboxed spawn takes: bubblewrap with a worker's policy (the system, the
/// toolchains, a worktree, private git dir, home and `/tmp`) running `true`, in milliseconds;
/// the median of 20.
fn sandbox_spawn_ms() -> Result<f64, String> {
    let bwrap = zerg_sandbox::bwrap::find_on_path("bwrap").ok_or("bubblewrap is not installed")?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let p = |s: &str| {
        let d = dir.path().join(s);
        std::fs::create_dir_all(&d).map(|_| d)
    };
    let err = |e: std::io::Error| e.to_string();
    let layout = zerg_sandbox::WorkerLayout {
        worktree: p("repo/wt").map_err(err)?,
        git_dir: zerg_sandbox::Bind {
            from: p("repo/.git/zerg/f/worker-0").map_err(err)?,
            to: p("repo/.git").map_err(err)?,
        },
        objects: p("repo/.git/objects").map_err(err)?,
        home: zerg_sandbox::Bind {
            from: p("repo/.git/zerg/f/home-0").map_err(err)?,
            to: p("home").map_err(err)?,
        },
        tmp: p("repo/.git/zerg/f/tmp-0").map_err(err)?,
        spec: zerg_sandbox::Bind {
            from: p("spec").map_err(err)?,
            to: p("repo/wt/.gsd/specs/f").map_err(err)?,
        },
        plane_dir: p("run/w/0").map_err(err)?,
        logs: vec![p("repo/.zerg/logs/tasks").map_err(err)?],
        programs: vec![bin_dir()],
        hidden: vec![dir.path().join("repo")],
    };
    let policy =
        zerg_sandbox::Policy::worker(&layout, &zerg_sandbox::Host::current(), &Default::default());
    let args = zerg_sandbox::bwrap::args(&policy, Path::new("/bin/true"), &[]);
    let mut took = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let st = Command::new(&bwrap)
            .args(&args)
            .status()
            .map_err(|e| e.to_string())?;
        if !st.success() {
            return Err(format!("bwrap exited {st}"));
        }
        took.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    took.sort_by(f64::total_cmp);
    Ok(took[took.len() / 2])
}

/// Many one-file tasks: tasks per second, CPU of zergd and everything it ran (agents, their
/// git, the stand-in agent CLI) per task, and bytes zergd wrote per event; `confined`: every
/// worker in the sandbox.
fn throughput(opts: &Opts, confined: bool) -> Result<BTreeMap<&'static str, f64>, String> {
    let (levels, per, workers) = if opts.quick {
        (5, 40, 8)
    } else {
        (10, 100, 16)
    };
    let tasks = f64::from(levels * per);
    let repo = TestRepo::new();
    repo.write_graph("tp", &graph_wide("tp", levels, per));
    repo.configure(
        &Config::fake_agent()
            .merge_yaml(BENCH_WORKERS)
            .set("sandbox.mode", if confined { "auto" } else { "off" }),
    );
    repo.write_script("tp", &json!({"default": [{"op": "write_owned"}]}));
    let d = Daemon::start();
    let pid = d.pid() as i32;
    let cpu0 = cpu_tree_s(pid).unwrap_or(0.0);
    let s0 = written_bytes(pid).unwrap_or(0);
    let wall = rush_to_end(&d, &repo, "tp", workers)?;
    // Workers exit after the rush; once zergd has reaped them (it has no child left), their
    // CPU and that of everything they ran is in its cutime.
    let reaped = Instant::now();
    while !childless(pid) {
        if reaped.elapsed() > Duration::from_secs(60) {
            return Err("zergd still has child processes 60 s after the rush".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let cpu = cpu_tree_s(pid).unwrap_or(0.0) - cpu0;
    let syscall_written = written_bytes(pid).unwrap_or(0).saturating_sub(s0);
    let events = std::fs::read_to_string(repo.path.join(".zerg/state/tp-events.jsonl"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
        .max(1);
    let peak = mem_kib(pid).map(|m| m.1).unwrap_or(0);
    let mut m = BTreeMap::new();
    m.insert("throughput_tasks_per_s", tasks / wall.as_secs_f64());
    m.insert("zerg_cpu_ms_per_task", cpu * 1000.0 / tasks);
    m.insert(
        "zergd_write_syscall_bytes_per_event",
        syscall_written as f64 / events as f64,
    );
    m.insert("zergd_peak_rss_mb_throughput", peak as f64 / 1024.0);
    Ok(m)
}

/// 10,000 tasks in 20 levels on 16 workers with a no-op agent: does it complete, how long,
/// and zergd's peak RSS and bytes written per event.
fn big_rush() -> Value {
    let repo = TestRepo::new();
    repo.write_graph("big", &graph_wide("big", 20, 500));
    repo.write_config(BENCH_WORKERS);
    repo.write_script("big", &json!({"default": [{"op": "write_owned"}]}));
    let d = Daemon::start();
    let pid = d.pid() as i32;
    let trace = StateWrites::attach(pid);
    let result = rush_to_end(&d, &repo, "big", 16);
    let written = trace.and_then(|t| t.finish("big"));
    match result {
        Ok(wall) => {
            let log = std::fs::read_to_string(repo.path.join(".zerg/state/big-events.jsonl"))
                .unwrap_or_default();
            let events = log.lines().count().max(1);
            // Events by type: two runs' counts compare kind by kind.
            let mut by_type = std::collections::BTreeMap::<String, u64>::new();
            for line in log.lines() {
                let kind = serde_json::from_str::<Value>(line)
                    .ok()
                    .and_then(|v| v["type"].as_str().map(str::to_string))
                    .unwrap_or_else(|| "(unreadable)".into());
                *by_type.entry(kind).or_default() += 1;
            }
            let per_event = match written {
                Ok(w) => json!(round(w as f64 / events as f64, 0)),
                Err(why) => json!({"skipped": why}),
            };
            json!({
                "completed": true,
                "wall_s": round(wall.as_secs_f64(), 1),
                "tasks_per_s": round(10_000.0 / wall.as_secs_f64(), 1),
                "events": events,
                "events_by_type": by_type,
                "zergd_peak_rss_mb": round(mem_kib(pid).map(|m| m.1).unwrap_or(0) as f64 / 1024.0, 1),
                "state_write_bytes_per_event": per_event,
            })
        }
        Err(why) => json!({"completed": false, "why": why}),
    }
}

/// `strace` attached to every thread of zergd: `args` choose what it records.
struct Strace {
    strace: std::process::Child,
    out: tempfile::NamedTempFile,
}

impl Strace {
    fn attach(pid: i32, args: &[&str]) -> Result<Strace, String> {
        let out = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
        let tids: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map_err(|e| e.to_string())?
            .flatten()
            .map(|t| t.file_name().to_string_lossy().into_owned())
            .collect();
        let mut cmd = Command::new("strace");
        cmd.args(args).arg("-o").arg(out.path());
        for t in &tids {
            cmd.args(["-p", t]);
        }
        let strace = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("strace is not available ({e})"))?;
        // Ready once every thread names a tracer (`TracerPid` in its status).
        let traced = |t: &String| {
            // A thread that has exited since needs no tracing.
            std::fs::read_to_string(format!("/proc/{pid}/task/{t}/status"))
                .ok()
                .is_none_or(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("TracerPid:"))
                        .is_some_and(|v| v.trim() != "0")
                })
        };
        let t = Instant::now();
        while !tids.iter().all(traced) {
            if t.elapsed() > Duration::from_secs(10) {
                return Err("strace did not attach to zergd's threads within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(Strace { strace, out })
    }

    /// Stops tracing; what was recorded.
    fn finish(mut self) -> Result<String, String> {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.strace.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        );
        let _ = self.strace.wait();
        std::fs::read_to_string(self.out.path()).map_err(|e| e.to_string())
    }
}

/// What zergd writes to one rush's state document and journal, counted by `strace` on its
/// threads (not its children): the bytes of every write to `<feature>.journal` and to the
/// temp files that become `<feature>.json`.
struct StateWrites(Strace);

impl StateWrites {
    fn attach(pid: i32) -> Result<StateWrites, String> {
        Strace::attach(pid, &["-qq", "-y", "-e", "trace=write,writev,pwrite64"]).map(StateWrites)
    }

    fn finish(self, feature: &str) -> Result<u64, String> {
        let text = self.0.finish()?;
        let journal = format!("/.zerg/state/{feature}.journal>");
        let whole = format!("/.zerg/state/.{feature}.json.tmp-");
        Ok(text
            .lines()
            .filter(|l| l.contains(&journal) || l.contains(&whole))
            .filter_map(|l| {
                l.rsplit_once(" = ")
                    .and_then(|(_, n)| n.trim().parse::<u64>().ok())
            })
            .sum())
    }
}

/// Programs started (successful `execve`) by zergd and everything under it, from
/// `strace -f` output: in all, and per program name.
fn programs_started(trace: &str) -> BTreeMap<String, u64> {
    // With -f, a call another thread interrupts is split: `PID execve("/usr/bin/git", …
    // <unfinished ...>` and later `PID <... execve resumed>) = 0`.
    let mut pending: BTreeMap<&str, String> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for line in trace.lines() {
        let Some((pid, rest)) = line.split_once(' ') else {
            continue;
        };
        if let Some(args) = rest.trim_start().strip_prefix("execve(\"") {
            let path = args.split('"').next().unwrap_or_default();
            let mut name = path.rsplit('/').next().unwrap_or(path).to_string();
            if name == "git" {
                name = format!("git {}", git_subcommand(args));
            }
            pending.insert(pid, name);
        }
        if rest.contains("execve")
            && rest.trim_end().ends_with("= 0")
            && let Some(name) = pending.remove(pid)
        {
            *out.entry(name).or_insert(0) += 1;
        }
    }
    out
}

/// The subcommand of a git command line as strace prints it (`"/usr/bin/git", ["git", "-c",
/// "core.hooksPath=/dev/null", "-C", "/x", "merge-base", …`): the first word that is not an
/// option or an option's value.
fn git_subcommand(args: &str) -> String {
    let Some(argv) = args.split_once('[').map(|(_, a)| a) else {
        return String::new();
    };
    let mut words = argv
        .split("\", \"")
        .map(|w| w.trim_matches(|c| c == '"' || c == ']'));
    words.next(); // "git"
    while let Some(w) = words.next() {
        match w {
            "-c" | "-C" | "--git-dir" | "--work-tree" => {
                words.next();
            }
            w if w.starts_with('-') => {}
            w => return w.chars().take(24).collect(),
        }
    }
    String::new()
}

/// Ids of the containers (running or not) of the bench's container rushes.
fn bench_containers() -> Vec<String> {
    Command::new("docker")
        .args(["ps", "-aq", "--filter", "name=zerg-cready-worker-"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// A rush of a few levels under `strace -f -e trace=execve` on zergd: the programs started per
/// task (git, the agent CLI, the worker agents, anything else), and how often git was the
/// fallback for something normally done in process (the `git fallback` lines of zergd's and
/// the workers' logs).
fn processes(opts: &Opts) -> Value {
    let (levels, per, workers) = if opts.quick { (3, 16, 4) } else { (5, 40, 8) };
    let tasks = f64::from(levels * per);
    let repo = TestRepo::new();
    repo.write_graph("pr", &graph_wide("pr", levels, per));
    repo.write_config(BENCH_WORKERS);
    repo.write_script("pr", &json!({"default": [{"op": "write_owned"}]}));
    let d = Daemon::start();
    // Strings long enough (`-s`) that every argument is whole: git's subcommand comes after
    // `-C <path>`.
    let trace = match Strace::attach(
        d.pid() as i32,
        &[
            "-f",
            "-qq",
            "-s",
            "1024",
            "-e",
            "trace=execve",
            "-e",
            "signal=none",
        ],
    ) {
        Ok(t) => t,
        Err(why) => return json!({"skipped": why}),
    };
    let result = rush_to_end(&d, &repo, "pr", workers);
    // The workers exit after the rush; their last programs are in the trace once reaped.
    let reaped = Instant::now();
    while !childless(d.pid() as i32) && reaped.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let text = match trace.finish() {
        Ok(t) => t,
        Err(why) => return json!({"skipped": why}),
    };
    if let Err(why) = result {
        return json!({"completed": false, "why": why});
    }
    let started = programs_started(&text);
    let all: u64 = started.values().sum();
    let per_task: BTreeMap<&String, f64> = started
        .iter()
        .map(|(k, v)| (k, round(*v as f64 / tasks, 2)))
        .collect();
    // zergd's log file when it keeps one, else what it printed.
    let zergd_log = match d.state_log() {
        s if s.is_empty() => d.log(),
        s => s,
    };
    let fallbacks: usize = zergd_log.matches("git fallback").count()
        + std::fs::read_dir(repo.path.join(".zerg/logs"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().is_file())
            .map(|e| {
                std::fs::read_to_string(e.path())
                    .unwrap_or_default()
                    .matches("git fallback")
                    .count()
            })
            .sum::<usize>();
    json!({
        "processes_per_task": round(all as f64 / tasks, 2),
        "by_program": per_task,
        "tasks": tasks,
        "levels": levels,
        "workers": workers,
        "git_fallbacks": fallbacks,
        "git_fallbacks_per_task": round(fallbacks as f64 / tasks, 3),
    })
}

/// Pid of the worker running `task`, from status.
fn worker_of(st: &Value, task: &str) -> Option<(String, i32)> {
    st["workers"].as_object()?.iter().find_map(|(id, w)| {
        (w["current_task"] == task && w["status"] == "running")
            .then(|| w["pid"].as_i64().map(|p| (id.clone(), p as i32)))
            .flatten()
    })
}

/// `kill -9` of a worker mid-task, repeatedly: the time until its task runs on another worker.
fn crash_reassign(opts: &Opts) -> Value {
    let kills = if opts.quick { 3 } else { 20 };
    let repo = TestRepo::new();
    repo.write_graph("cr", &graph_wide("cr", 1, 4));
    // Every killed slot is respawned (and so becomes a spare again), however often.
    repo.write_config(&format!("{BENCH_WORKERS}  max_respawn_attempts: 100\n"));
    // Four long tasks on six workers: two wait for work, as in any level with fewer tasks
    // left than workers, and take over a crashed worker's task.
    repo.write_script(
        "cr",
        &json!({"default": [{"op": "sleep_ms", "ms": 600000}]}),
    );
    let d = Daemon::start();
    if !d
        .ctl_in(&repo.path, &["rush", "cr", "--workers", "6", "--detach"])
        .status
        .success()
    {
        return json!({"error": "rush did not start"});
    }
    let mut samples = Vec::new();
    for _ in 0..kills {
        let st = d.wait_for(&repo.path, "cr", LIMIT, "four tasks running", |s| {
            tasks_with(s, "in_progress").len() >= 4
        });
        let task = tasks_with(&st, "in_progress")[0].clone();
        let Some((_, pid)) = worker_of(&st, &task) else {
            continue;
        };
        let t = Instant::now();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        // Running again, in a process other than the dead one (another slot, or the respawn).
        loop {
            if t.elapsed() > Duration::from_secs(60) {
                return json!({"error": format!("task {task} was not reassigned within 60 s")});
            }
            if let Some(s) = d.status(&repo.path, "cr")
                && worker_of(&s, &task).is_some_and(|(_, p)| p != pid)
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        samples.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let _ = d.ctl_in(&repo.path, &["stop", "cr", "--force"]);
    if samples.is_empty() {
        return json!({"error": "no worker could be killed"});
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| samples[((samples.len() as f64 - 1.0) * p).round() as usize];
    json!({"p50": {"median": round(pct(0.5), 1), "runs": samples.len()},
           "p99": {"median": round(pct(0.99), 1), "runs": samples.len()}})
}

/// SIGSTOP of a worker mid-task with a 5 s stale threshold: seconds until its task is requeued.
fn hang_detect() -> Result<f64, String> {
    let repo = TestRepo::new();
    repo.write_graph("hd", &graph_wide("hd", 1, 4));
    repo.write_config("workers:\n  heartbeat_interval_seconds: 1\n  heartbeat_stale_threshold: 5\n  stop_grace_seconds: 1\n");
    repo.write_script("hd", &json!({"default": [{"op": "sleep_ms", "ms": 60000}]}));
    let d = Daemon::start();
    if !d
        .ctl_in(&repo.path, &["rush", "hd", "--workers", "4", "--detach"])
        .status
        .success()
    {
        return Err("rush did not start".into());
    }
    let st = d.wait_for(&repo.path, "hd", LIMIT, "four tasks running", |s| {
        tasks_with(s, "in_progress").len() == 4
    });
    let task = tasks_with(&st, "in_progress")[0].clone();
    let (_, pid) = worker_of(&st, &task).ok_or("no worker holds the task")?;
    let t = Instant::now();
    // The whole process group: the agent and the agent CLI stop together.
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGSTOP,
    );
    let result = loop {
        if t.elapsed() > Duration::from_secs(120) {
            break Err(format!("task {task} was not requeued within 120 s"));
        }
        if let Some(s) = d.status(&repo.path, "hd")
            && (s["tasks"][&task]["status"] != "in_progress"
                || worker_of(&s, &task).is_some_and(|(_, p)| p != pid))
        {
            break Ok(t.elapsed().as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = d.ctl_in(&repo.path, &["stop", "hd", "--force"]);
    result
}

/// 50 workers connected and heartbeating every second while their agent CLIs wait: zergd's
/// RSS, the largest agent's peak RSS, and zergd's CPU per idle worker.
fn idle_workers(opts: &Opts) -> BTreeMap<String, Value> {
    let workers = 50;
    let window = if opts.quick { 10 } else { 30 };
    let repo = TestRepo::new();
    repo.write_graph("idle", &graph_wide("idle", 1, workers));
    repo.write_config(BENCH_WORKERS);
    repo.write_script(
        "idle",
        &json!({"default": [{"op": "sleep_ms", "ms": 600000}]}),
    );
    let d = Daemon::start();
    let zergd = d.pid() as i32;
    let mut out = BTreeMap::new();
    if !d
        .ctl_in(
            &repo.path,
            &[
                "rush",
                "idle",
                "--workers",
                &workers.to_string(),
                "--detach",
            ],
        )
        .status
        .success()
    {
        out.insert(
            "zergd_rss_mb_50_workers".into(),
            json!({"error": "rush did not start"}),
        );
        return out;
    }
    let st = d.wait_for(&repo.path, "idle", LIMIT, "every worker running", |s| {
        tasks_with(s, "in_progress").len() == workers as usize
    });
    std::thread::sleep(Duration::from_secs(2));
    let c0 = cpu_s(zergd).unwrap_or(0.0);
    std::thread::sleep(Duration::from_secs(window));
    let c1 = cpu_s(zergd).unwrap_or(0.0);
    let rss = mem_kib(zergd).map(|m| m.0).unwrap_or(0) as f64 / 1024.0;
    let agent_peak = st["workers"]
        .as_object()
        .map(|w| {
            w.values()
                .filter_map(|w| w["pid"].as_i64())
                .filter_map(|p| mem_kib(p as i32).map(|m| m.1))
                .max()
                .unwrap_or(0)
        })
        .unwrap_or(0) as f64
        / 1024.0;
    let pct = (c1 - c0) / window as f64 * 100.0 / f64::from(workers);
    out.insert(
        "zergd_rss_mb_50_workers".into(),
        json!({"median": round(rss, 1), "runs": 1}),
    );
    out.insert(
        "agent_rss_mb".into(),
        json!({"median": round(agent_peak, 1), "runs": 1}),
    );
    out.insert(
        "heartbeat_cpu_pct_per_worker".into(),
        json!({"median": round(pct, 4), "runs": 1, "window_s": window}),
    );
    let _ = d.ctl_in(&repo.path, &["stop", "idle", "--force"]);
    out
}

const NOISY: &str = "head -c 10000000 /dev/zero | tr '\\0' x; echo";

/// A verification that prints 10 MB, against the same rush with a silent one, minus the
/// command run alone: what the draining and logging cost.
fn noisy_verify_overhead() -> Result<f64, String> {
    let t = Instant::now();
    let st = Command::new("sh")
        .args(["-c", NOISY])
        .stdout(Stdio::null())
        .status()
        .map_err(|e| e.to_string())?;
    if !st.success() {
        return Err("the noisy command failed alone".into());
    }
    let alone = t.elapsed().as_secs_f64() * 1000.0;
    let one = |verify: &str| -> Result<f64, String> {
        let repo = TestRepo::new();
        let graph = json!({"feature": "nv", "tasks": [{"id": "N-L1-001", "title": "noisy", "level": 1,
            "files": {"create": ["n.txt"], "modify": [], "read": []},
            "verification": {"command": verify, "timeout_seconds": 120}}]});
        repo.write_graph("nv", &graph.to_string());
        repo.write_config(BENCH_WORKERS);
        let d = Daemon::start();
        Ok(rush_to_end(&d, &repo, "nv", 1)?.as_secs_f64() * 1000.0)
    };
    let quiet = one("true")?;
    let noisy = one(NOISY)?;
    Ok(noisy - quiet - alone)
}

/// The crate of the `warm_build` scenario (`tests/fixtures/rust-crate`).
const SHAPES_CARGO_TOML: &str = include_str!("../../fixtures/rust-crate/Cargo.toml");
const SHAPES_CARGO_LOCK: &str = include_str!("../../fixtures/rust-crate/Cargo.lock");
const SHAPES_LIB: &str = include_str!("../../fixtures/rust-crate/src/lib.rs");
const SHAPES_GITIGNORE: &str = include_str!("../../fixtures/rust-crate/gitignore");

/// `warm_build` `opts.runs` times: the median of each run's ratio, with each run's detail.
fn runs_warm(opts: &Opts) -> Value {
    let mut ratios = Vec::new();
    let mut detail = Vec::new();
    for _ in 0..opts.runs {
        match warm_build() {
            Ok((ratio, d)) => {
                ratios.push(ratio);
                detail.push(d);
            }
            Err(e) => return json!({"error": e}),
        }
    }
    let mut v = summary(&ratios);
    v["detail"] = json!(detail);
    v
}

/// A small crate (`tests/fixtures/rust-crate`) committed in a repository, six tasks on two
/// workers, each adding an integration test and verified with `cargo test --offline` in the
/// worker's worktree: how long a worker's second verification takes over its first. The
/// first builds the crate from nothing; the second finds the worker's `target/` (ignored, so
/// kept between tasks) and builds only the new test. Figures: the median over workers of
/// second / first, and each worker's times.
fn warm_build() -> Result<(f64, Value), String> {
    let repo = TestRepo::new();
    std::fs::create_dir_all(repo.path.join("src")).map_err(|e| e.to_string())?;
    for (name, text) in [
        ("Cargo.toml", SHAPES_CARGO_TOML),
        ("Cargo.lock", SHAPES_CARGO_LOCK),
        ("src/lib.rs", SHAPES_LIB),
        (".gitignore", SHAPES_GITIGNORE),
    ] {
        std::fs::write(repo.path.join(name), text).map_err(|e| e.to_string())?;
    }
    git(&repo.path, &["add", "-A"]);
    git(&repo.path, &["commit", "-q", "-m", "the shapes crate"]);
    // The verification times itself into a file outside the repository, keyed by worktree.
    // The daemon's HOME is a fresh one: cargo and rustup are told where they live.
    let home = std::env::var("HOME").unwrap_or_default();
    let env_or = |k: &str, d: String| std::env::var(k).unwrap_or(d);
    let timings = repo
        .path
        .parent()
        .unwrap_or(&repo.path)
        .join("warm-build.txt");
    let script = repo
        .path
        .parent()
        .unwrap_or(&repo.path)
        .join("timed-cargo-test.sh");
    std::fs::write(
        &script,
        format!(
            "export CARGO_HOME='{}' RUSTUP_HOME='{}' PATH='{}'\nunset CARGO_TARGET_DIR CARGO_BUILD_TARGET_DIR\nstart=$(date +%s%N)\ncargo test --offline -q >/dev/null 2>&1\nrc=$?\nend=$(date +%s%N)\necho \"$(pwd) $(( (end - start) / 1000000 ))\" >> '{}'\nexit $rc\n",
            env_or("CARGO_HOME", format!("{home}/.cargo")),
            env_or("RUSTUP_HOME", format!("{home}/.rustup")),
            std::env::var("PATH").unwrap_or_default(),
            timings.display()
        ),
    )
    .map_err(|e| e.to_string())?;
    let mut tasks = Vec::new();
    let mut ops = serde_json::Map::new();
    for i in 1..=6 {
        let id = format!("WB-L1-{i:03}");
        let file = format!("tests/t{i}.rs");
        tasks.push(json!({"id": id, "title": format!("test {i}"), "level": 1,
            "files": {"create": [file], "modify": [], "read": ["src/"]},
            "verification": {"command": format!("sh '{}'", script.display()), "timeout_seconds": 600}}));
        ops.insert(
            id,
            json!([{"op": "write", "path": file,
                "content": format!("#[test]\nfn shape_{i}_scores() {{\n    let s = fixture_shapes::S{i} {{ a: {i}, ..Default::default() }};\n    assert_eq!(s.score(), {i});\n}}\n")}]),
        );
    }
    repo.write_graph("wb", &json!({"feature": "wb", "tasks": tasks}).to_string());
    repo.write_config(BENCH_WORKERS);
    repo.write_script("wb", &json!({"tasks": ops}));
    let d = Daemon::start();
    rush_to_end(&d, &repo, "wb", 2)?;
    let text = std::fs::read_to_string(&timings).map_err(|e| format!("no timings: {e}"))?;
    let mut by_worker: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for line in text.lines() {
        if let Some((wt, ms)) = line.rsplit_once(' ')
            && let Ok(ms) = ms.parse::<f64>()
        {
            by_worker.entry(wt.to_string()).or_default().push(ms);
        }
    }
    let mut ratios: Vec<f64> = by_worker
        .values()
        .filter(|t| t.len() >= 2 && t[0] > 0.0)
        .map(|t| t[1] / t[0])
        .collect();
    if ratios.is_empty() {
        return Err(format!("no worker verified two tasks: {by_worker:?}"));
    }
    ratios.sort_by(f64::total_cmp);
    let ratio = round(ratios[ratios.len() / 2], 3);
    let workers: Vec<Value> = by_worker
        .values()
        .map(|t| json!({"verify_ms": t}))
        .collect();
    Ok((ratio, json!({"ratio": ratio, "workers": workers})))
}

/// `cargo build --release --workspace --bins` of this workspace into an empty target
/// directory (the crates themselves already downloaded): the seconds it takes, and the size of
/// the binaries.
fn clean_release_build() -> Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = match tempfile::tempdir() {
        Ok(t) => t,
        Err(e) => return json!({"error": e.to_string()}),
    };
    let t = Instant::now();
    let out = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["build", "--release", "--workspace", "--bins", "--quiet"])
        .arg("--target-dir")
        .arg(target.path())
        .current_dir(&root)
        .stdin(Stdio::null())
        .output();
    let secs = t.elapsed().as_secs_f64();
    match out {
        Ok(o) if o.status.success() => {
            let size = |b: &str| {
                std::fs::metadata(target.path().join("release").join(b))
                    .map(|m| round(m.len() as f64 / 1e6, 1))
                    .unwrap_or(0.0)
            };
            json!({
                "median": round(secs, 1),
                "runs": 1,
                "binary_mb": {"zergd": size("zergd"), "zergctl": size("zergctl"), "zerg-worker-agent": size("zerg-worker-agent")},
            })
        }
        Ok(o) => {
            json!({"error": String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("").to_string()})
        }
        Err(e) => json!({"error": format!("cannot run cargo: {e}")}),
    }
}

/// The version of the original that `--vs-original` installs and drives.
const ORIGINAL: &str = "zerg-ai==0.3.2";

/// How long each run of the original may take: `zerg rush` as shipped never ends by itself.
fn original_cap(opts: &Opts) -> Duration {
    Duration::from_secs(if opts.quick { 120 } else { 300 })
}

/// How often the process trees' memory is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);

/// The original ZERG (`zerg-ai` 0.3.2 from PyPI, in a venv of its own) and zerg on the demo's
/// 12-task graph with 3 workers and the demo's scripted agent: the original as shipped, the
/// original with each task's `level` written into its state file first, and zerg's demo, each
/// with its wall time, the tasks it completed and the peak RSS of its orchestrator, of its
/// largest worker and of all its processes together.
fn vs_original(opts: &Opts) -> Value {
    let original = match Original::install() {
        Ok(o) => o,
        Err(why) => return json!({"skipped": why}),
    };
    let cap = original_cap(opts);
    let zerg = match zerg_demo_measured() {
        Ok(z) => z,
        Err(why) => return json!({"error": format!("zerg's demo: {why}")}),
    };
    let as_shipped = match original.rush(false, cap) {
        Ok(v) => v,
        Err(why) => return json!({"error": format!("the original as shipped: {why}")}),
    };
    let level_in_state = match original.rush(true, cap) {
        Ok(v) => v,
        Err(why) => {
            return json!({"error": format!("the original with levels in its state file: {why}")});
        }
    };
    let ratio = |k: &str| match (level_in_state[k].as_f64(), zerg[k].as_f64()) {
        (Some(a), Some(b)) if b > 0.0 => json!(round(a / b, 2)),
        _ => Value::Null,
    };
    let ratios = json!({
        "wall_s": ratio("wall_s"),
        "orchestrator_peak_rss_mb": ratio("orchestrator_peak_rss_mb"),
        "worker_peak_rss_mb": ratio("worker_peak_rss_mb"),
        "all_processes_peak_rss_mb": ratio("all_processes_peak_rss_mb"),
    });
    json!({
        "original": ORIGINAL,
        "python": original.python,
        "pip_install_s": original.pip_install_s,
        "graph": "the demo's 12 tasks in 3 levels (5, 4, 3) on 3 workers; the agent writes the task's files and sleeps 1 s",
        "original_graph_change": "each task's verification is `test -f <its file>`: the original refuses a command with `&&` (and its later levels do not see other workers' files)",
        "original_command": "zerg rush --mode subprocess --workers 3, answered y",
        "rss": format!("VmHWM of each process and the sum of VmRSS of all, sampled every {} ms", SAMPLE_EVERY.as_millis()),
        "runs": 1,
        "original_as_shipped": as_shipped,
        "original_level_in_state": level_in_state,
        "zerg_demo": zerg,
        "level_in_state_over_zerg": ratios,
    })
}

/// Runs a program for its output, with a reason when it cannot run or fails.
fn output_of(cmd: &mut Command) -> Result<String, String> {
    let o = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        let err = String::from_utf8_lossy(&o.stderr);
        Err(format!(
            "{:?} failed ({}): {}",
            cmd.get_program(),
            o.status,
            err.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim()
        ))
    }
}

/// Interpreters that may be Python 3.12 or newer, best first: `python3.14`, `python3.13` and
/// `python3.12` on PATH as they are, then the same through pyenv's shims with each installed
/// version (`PYENV_VERSION`), then `PYENV_VERSION=3.12.1 python3.12`.
fn python_candidates() -> Vec<(String, Option<String>)> {
    let mut c: Vec<(String, Option<String>)> = ["python3.14", "python3.13", "python3.12"]
        .iter()
        .map(|p| (p.to_string(), None))
        .collect();
    let versions =
        output_of(Command::new("pyenv").args(["versions", "--bare"])).unwrap_or_default();
    let mut found: Vec<(u32, u32, String)> = versions
        .lines()
        .filter_map(|v| {
            let v = v.trim();
            let mut n = v.split('.').map(|x| x.parse::<u32>().ok());
            match (n.next()??, n.next()??, n.next()??, n.next()) {
                (3, minor, patch, None) if minor >= 12 => Some((minor, patch, v.to_string())),
                _ => None,
            }
        })
        .collect();
    found.sort_by_key(|v| std::cmp::Reverse((v.0, v.1)));
    for (minor, _, v) in found {
        c.push((format!("python3.{minor}"), Some(v)));
    }
    let fallback = ("python3.12".to_string(), Some("3.12.1".to_string()));
    if !c.contains(&fallback) {
        c.push(fallback);
    }
    c
}

/// The original installed in a scratch directory (removed when dropped), with a home and a
/// stand-in `claude` of its own.
struct Original {
    scratch: tempfile::TempDir,
    /// `<venv>/bin/zerg`.
    zerg: std::path::PathBuf,
    /// The interpreter the venv was made from: version and path.
    python: String,
    pip_install_s: f64,
}

impl Original {
    /// Makes a venv from the first Python 3.12 or newer that can make one, and installs the
    /// original into it from PyPI.
    fn install() -> Result<Original, String> {
        let scratch = tempfile::Builder::new()
            .prefix("zerg-vs-original-")
            .tempdir()
            .map_err(|e| e.to_string())?;
        let home = scratch.path().join("home");
        let bin_dir = scratch.path().join("bin");
        for d in [&home, &bin_dir] {
            std::fs::create_dir_all(d).map_err(|e| e.to_string())?;
        }
        // The stand-in `claude`: the tests' fake agent CLI, which runs the demo's script
        // (`fake-claude.json` in `$ZERG_SPEC_DIR`, which the original sets for its workers).
        std::os::unix::fs::symlink(bin("fake-claude"), bin_dir.join("claude"))
            .map_err(|e| e.to_string())?;
        let venv = scratch.path().join("venv");
        let mut tried = Vec::new();
        let mut made = None;
        for (cmd, pyenv) in python_candidates() {
            let mut probe = Command::new(&cmd);
            probe.args([
                "-c",
                "import sys; print(sys.version_info >= (3, 12)); print(sys.version.split()[0]); print(sys.executable)",
            ]);
            if let Some(v) = &pyenv {
                probe.env("PYENV_VERSION", v);
            }
            let label = match &pyenv {
                Some(v) => format!("PYENV_VERSION={v} {cmd}"),
                None => cmd.clone(),
            };
            let out = match output_of(&mut probe) {
                Ok(o) => o,
                Err(_) => {
                    tried.push(format!("{label}: not here"));
                    continue;
                }
            };
            let lines: Vec<&str> = out.lines().collect();
            let [ok, version, exe] = lines[..] else {
                tried.push(format!("{label}: unexpected answer"));
                continue;
            };
            if ok != "True" {
                tried.push(format!("{label}: Python {version}"));
                continue;
            }
            let _ = std::fs::remove_dir_all(&venv);
            match output_of(Command::new(exe).arg("-m").arg("venv").arg(&venv)) {
                Ok(_) => {
                    made = Some(format!("{version} ({exe})"));
                    break;
                }
                Err(why) => tried.push(format!("{label}: venv: {why}")),
            }
        }
        let Some(python) = made else {
            return Err(format!(
                "{ORIGINAL} needs Python >= 3.12 and a venv made from it; none here ({})",
                tried.join("; ")
            ));
        };
        let t = Instant::now();
        output_of(
            Command::new(venv.join("bin/python"))
                .args(["-m", "pip", "install", "--quiet", "--no-cache-dir"])
                .args(["--disable-pip-version-check", ORIGINAL])
                .env("HOME", &home),
        )
        .map_err(|why| format!("pip install {ORIGINAL} failed: {why}"))?;
        let pip_install_s = round(t.elapsed().as_secs_f64(), 1);
        let zerg = venv.join("bin/zerg");
        let version = output_of(Command::new(&zerg).arg("--version").env("HOME", &home))
            .map_err(|why| format!("the installed original does not run: {why}"))?;
        let want = ORIGINAL.rsplit('=').next().unwrap_or_default();
        if !version.contains(want) {
            return Err(format!("pip installed {}, not {want}", version.trim()));
        }
        Ok(Original {
            scratch,
            zerg,
            python,
            pip_install_s,
        })
    }

    /// The demo's repository as the original needs it: the graph and the agent script
    /// committed under `.gsd/specs/demo/`, each verification reduced to its own file, and its
    /// `.zerg/config.yaml` committed (its workers read it from their worktrees, which it
    /// branches from `main`). With `level_in_state`, `.zerg/state/demo.json` starts with each
    /// task's `level`, which nothing in the original writes.
    fn repo(level_in_state: bool) -> Result<TestRepo, String> {
        let mut graph: Value =
            serde_json::from_str(&graph_12("demo")).map_err(|e| e.to_string())?;
        let tasks = graph["tasks"]
            .as_array_mut()
            .ok_or("graph_12 has no tasks")?;
        for t in tasks.iter_mut() {
            let file = t["files"]["create"][0]
                .as_str()
                .ok_or("a task of graph_12 creates no file")?
                .to_string();
            t["verification"]["command"] = json!(format!("test -f {file}"));
        }
        let repo = TestRepo::new();
        git(&repo.path, &["config", "user.name", IDENTITY.0]);
        git(&repo.path, &["config", "user.email", IDENTITY.1]);
        repo.write_graph("demo", &graph.to_string());
        repo.write_script("demo", &demo_script());
        repo.write_config_text("workers:\n  max_concurrent: 3\n");
        git(&repo.path, &["add", ".zerg/config.yaml"]);
        git(&repo.path, &["commit", "-q", "-m", "zerg config"]);
        if level_in_state {
            let mut levels = serde_json::Map::new();
            for t in graph["tasks"].as_array().into_iter().flatten() {
                let id = t["id"].as_str().unwrap_or_default().to_string();
                levels.insert(id, json!({"level": t["level"]}));
            }
            // The shape of the original's initial state document, with the tasks' levels.
            let state = json!({"feature": "demo", "current_level": 0, "tasks": levels,
                "workers": {}, "levels": {}, "execution_log": [], "metrics": null,
                "paused": false, "error": null});
            let dir = repo.path.join(".zerg/state");
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            std::fs::write(dir.join("demo.json"), state.to_string()).map_err(|e| e.to_string())?;
        }
        Ok(repo)
    }

    /// `zerg rush --mode subprocess --workers 3` on the demo's repository, answered `y`, in a
    /// process group of its own, until it returns or `cap` passes; then every process of the
    /// group is ended.
    fn rush(&self, level_in_state: bool, cap: Duration) -> Result<Value, String> {
        use std::io::Write;
        use std::os::unix::process::CommandExt;
        let repo = Original::repo(level_in_state)?;
        let log_path = self.scratch.path().join(format!(
            "rush-{}.log",
            if level_in_state { "level" } else { "shipped" }
        ));
        let log = std::fs::File::create(&log_path).map_err(|e| e.to_string())?;
        let path = std::env::join_paths(std::iter::once(self.scratch.path().join("bin")).chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
        ))
        .map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&self.zerg);
        cmd.args(["rush", "--mode", "subprocess", "--workers", "3"])
            .current_dir(&repo.path)
            .env("PATH", path)
            .env("HOME", self.scratch.path().join("home"))
            .stdin(Stdio::piped())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .process_group(0);
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if k.starts_with("ZERG_")
                || k.starts_with("FAKE_CLAUDE_")
                || k == "CLAUDE_CODE_TASK_LIST_ID"
            {
                cmd.env_remove(k.as_ref());
            }
        }
        let t = Instant::now();
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("cannot start zerg rush: {e}"))?;
        let pid = child.id() as i32;
        if let Some(mut stdin) = child.stdin.take() {
            // "Start execution? [Y/n]"
            let _ = stdin.write_all(b"y\n");
        }
        let sampler = PeakSampler::start(Watch {
            root: pid,
            group: Some(pid),
            orchestrator: pid,
            is_worker: |argv| argv.iter().any(|a| a == "zerg.worker_main"),
        });
        let state_path = repo.path.join(".zerg/state/demo.json");
        let mut all_complete = None;
        let exit = loop {
            if let Ok(Some(st)) = child.try_wait() {
                break Some(st);
            }
            if all_complete.is_none() && task_counts(&state_path).0 == 12 {
                all_complete = Some(t.elapsed().as_secs_f64());
            }
            if t.elapsed() >= cap {
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let wall = t.elapsed().as_secs_f64();
        let alive_at_end = group_members(pid).len();
        let peaks = sampler.finish();
        let left = end_group(pid);
        let _ = child.wait();
        if left > 0 {
            return Err(format!("{left} of its processes outlived SIGKILL"));
        }
        let (complete, failed) = task_counts(&state_path);
        if all_complete.is_none() && complete == 12 {
            all_complete = Some(wall);
        }
        let rush_log = std::fs::read_to_string(&log_path).unwrap_or_default();
        let (refused, first_refusal) = level_refusals(&repo.path.join(".zerg/logs/workers"));
        Ok(json!({
            "cap_s": cap.as_secs(),
            "tasks": 12,
            "tasks_complete": complete,
            "tasks_failed": failed,
            "wall_s": exit.map(|_| round(wall, 1)),
            "rush_exit_code": exit.and_then(|s| s.code()),
            "all_tasks_complete_s": all_complete.map(|s| round(s, 1)),
            "orchestrator_peak_rss_mb": mb(peaks.orchestrator_kib),
            "worker_peak_rss_mb": mb(peaks.worker_kib),
            "all_processes_peak_rss_mb": mb(peaks.all_kib),
            "rss_samples": peaks.samples,
            "worker_processes_spawned": rush_log.matches("Spawned worker").count(),
            "claims_refused_level_mismatch": refused,
            "first_refusal": first_refusal,
            "processes_alive_at_end": alive_at_end,
        }))
    }
}

/// Tasks `complete` and `failed` in one of the original's state files (0, 0 while it cannot
/// be read).
fn task_counts(state: &Path) -> (usize, usize) {
    let doc: Value = std::fs::read(state)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or(Value::Null);
    let count = |want: &str| {
        doc["tasks"]
            .as_object()
            .map(|t| t.values().filter(|t| t["status"] == want).count())
            .unwrap_or(0)
    };
    (count("complete"), count("failed"))
}

/// Claims the original's workers refused for a level mismatch, from their structured logs
/// (`worker-N.jsonl`, appended to across respawns): how many, and the first message.
fn level_refusals(dir: &Path) -> (usize, Option<String>) {
    let mut n = 0;
    let mut first: Option<(String, String)> = None;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("worker-") || name.contains("orchestrator") {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        for line in text.lines().filter(|l| l.contains("Level mismatch")) {
            n += 1;
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let ts = v["ts"].as_str().unwrap_or_default().to_string();
            let msg = v["message"].as_str().unwrap_or_default().to_string();
            if first.as_ref().is_none_or(|(t, _)| ts < *t) {
                first = Some((ts, msg));
            }
        }
    }
    (n, first.map(|(_, m)| m))
}

/// zerg's demo (the `demo` scenario's repository, `zergctl rush demo --workers 3`), with the
/// same figures as a run of the original.
fn zerg_demo_measured() -> Result<Value, String> {
    let repo = demo_repo();
    let d = Daemon::start();
    // zergd, zergctl and everything under them: the bench's own descendants.
    let sampler = PeakSampler::start(Watch {
        root: std::process::id() as i32,
        group: None,
        orchestrator: d.pid() as i32,
        is_worker: |argv| {
            argv.first().is_some_and(|a| {
                Path::new(a)
                    .file_name()
                    .is_some_and(|n| n == "zerg-worker-agent")
            })
        },
    });
    let wall = rush_to_end(&d, &repo, "demo", 3);
    let peaks = sampler.finish();
    let wall = wall?;
    let complete = d
        .status(&repo.path, "demo")
        .map(|s| tasks_with(&s, "complete").len())
        .unwrap_or(0);
    Ok(json!({
        "tasks": 12,
        "tasks_complete": complete,
        "wall_s": round(wall.as_secs_f64(), 1),
        "orchestrator_peak_rss_mb": mb(peaks.orchestrator_kib),
        "worker_peak_rss_mb": mb(peaks.worker_kib),
        "all_processes_peak_rss_mb": mb(peaks.all_kib),
        "rss_samples": peaks.samples,
    }))
}

/// KiB as MB with one decimal.
fn mb(kib: u64) -> f64 {
    round(kib as f64 / 1024.0, 1)
}

/// `/proc/<pid>/stat`'s parent and process group, unless the process is gone or a zombie.
fn parent_and_group(pid: i32) -> Option<(i32, i32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f: Vec<&str> = s[s.rfind(')')? + 1..].split_whitespace().collect();
    if matches!(f.first(), Some(&"Z") | Some(&"X")) {
        return None;
    }
    Some((f.get(1)?.parse().ok()?, f.get(2)?.parse().ok()?))
}

/// Every live process: (pid, parent, process group).
fn all_processes() -> Vec<(i32, i32, i32)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| parent_and_group(pid).map(|(pp, pg)| (pid, pp, pg)))
        .collect()
}

/// Live processes of a process group.
fn group_members(pgid: i32) -> Vec<i32> {
    all_processes()
        .into_iter()
        .filter(|p| p.2 == pgid)
        .map(|p| p.0)
        .collect()
}

/// SIGTERM to a process group, SIGKILL to what is left of it after 10 s: how many of its
/// processes are still there 5 s after that.
fn end_group(pgid: i32) -> usize {
    use nix::sys::signal::{Signal, killpg};
    use nix::unistd::Pid;
    let _ = killpg(Pid::from_raw(pgid), Signal::SIGTERM);
    if !poll(Duration::from_secs(10), || group_members(pgid).is_empty()) {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        poll(Duration::from_secs(5), || group_members(pgid).is_empty());
    }
    group_members(pgid).len()
}

/// The processes a [`PeakSampler`] watches, and their roles.
struct Watch {
    /// This process and all its descendants (the bench itself excepted).
    root: i32,
    /// And every process of this group, also once it has lost its parent.
    group: Option<i32>,
    /// The orchestrator's pid.
    orchestrator: i32,
    /// Whether a command line is a worker's.
    is_worker: fn(&[String]) -> bool,
}

/// Peak memory a [`PeakSampler`] saw, in KiB.
#[derive(Default)]
struct Peaks {
    /// The orchestrator's VmHWM.
    orchestrator_kib: u64,
    /// The largest VmHWM of any worker process.
    worker_kib: u64,
    /// The largest sum of VmRSS over all watched processes at one sample.
    all_kib: u64,
    /// Samples taken.
    samples: u64,
}

/// Samples the memory of a [`Watch`]'s processes from `/proc` every [`SAMPLE_EVERY`] on a
/// thread of its own, until [`PeakSampler::finish`].
struct PeakSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<Peaks>,
}

impl PeakSampler {
    /// Starts sampling `w`'s processes (the first sample at once).
    fn start(w: Watch) -> PeakSampler {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut p = Peaks::default();
            loop {
                let last = stopped.load(Ordering::Relaxed);
                w.sample(&mut p);
                if last {
                    return p;
                }
                std::thread::sleep(SAMPLE_EVERY);
            }
        });
        PeakSampler { stop, thread }
    }

    /// Takes one last sample and stops.
    fn finish(self) -> Peaks {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

impl Watch {
    /// One look at the watched processes: their memory goes into `p`.
    fn sample(&self, p: &mut Peaks) {
        let procs = all_processes();
        let me = std::process::id() as i32;
        let mut members: Vec<i32> = procs
            .iter()
            .filter(|q| q.0 == self.root || Some(q.2) == self.group)
            .map(|q| q.0)
            .collect();
        let mut i = 0;
        while i < members.len() {
            let parent = members[i];
            for q in &procs {
                if q.1 == parent && !members.contains(&q.0) {
                    members.push(q.0);
                }
            }
            i += 1;
        }
        let mut all = 0;
        for pid in members.into_iter().filter(|pid| *pid != me) {
            let Some((rss, hwm)) = mem_kib(pid) else {
                continue;
            };
            all += rss;
            if pid == self.orchestrator {
                p.orchestrator_kib = p.orchestrator_kib.max(hwm);
                continue;
            }
            let argv: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|b| {
                    b.split(|c| *c == 0)
                        .filter(|a| !a.is_empty())
                        .map(|a| String::from_utf8_lossy(a).into_owned())
                        .collect()
                })
                .unwrap_or_default();
            if (self.is_worker)(&argv) {
                p.worker_kib = p.worker_kib.max(hwm);
            }
        }
        p.all_kib = p.all_kib.max(all);
        p.samples += 1;
    }
}

/// The benchmark table of docs/benchmarks.md, from zerg-bench's JSON.
fn markdown(v: &Value) -> String {
    let m = &v["machine"];
    let mut o = format!(
        "Measured by `zerg-bench` on {} cores and {} GiB of memory, {} run(s) per figure{} ({} s in all).\n\n",
        m["cores"],
        m["memory_gib"],
        m["runs"],
        if m["quick"] == true {
            ", quick sizes"
        } else {
            ""
        },
        m["seconds"]
    );
    o.push_str("| key | median | min | max | goal |\n|---|---|---|---|---|\n");
    let goals = [
        ("demo_wall_over_ideal", "≤ 1.10"),
        ("zergd_peak_rss_mb_demo", "≤ 18"),
        ("throughput_tasks_per_s", "≥ 90"),
        ("zerg_cpu_ms_per_task", "≤ 20"),
        ("processes_per_task", "≤ 3"),
        ("git_fallbacks", "report"),
        ("git_commit_limit_per_s", "report"),
        ("throughput_over_git_limit", "≥ 0.5"),
        ("transfer_source_tree_kb", "report"),
        ("transfer_first_snapshot_kb", "about a megabyte"),
        ("transfer_base_move_kb", "tens of KB"),
        ("transfer_task_result_kb", "kilobytes"),
        ("big_rush_10k", "completes; zergd peak RSS < 64 MB"),
        ("state_write_bytes_per_event", "≤ 4096"),
        ("zergd_peak_rss_mb_throughput", "report"),
        ("zergd_write_syscall_bytes_per_event", "report"),
        ("crash_reassign_ms_p50", "report"),
        ("crash_reassign_ms_p99", "< 1000"),
        ("hang_detect_s", "≤ 6"),
        ("zergd_rss_mb_50_workers", "< 30"),
        ("agent_rss_mb", "< 10"),
        ("heartbeat_cpu_pct_per_worker", "< 0.1"),
        ("reconcile_ms_10k_tasks", "< 5"),
        ("noisy_verify_overhead_ms", "< 200"),
        ("container_ready_s_10", "≤ 1.2 × plain docker run"),
        (
            "soak_sequential_rushes",
            "RSS growth from rush 10 to the last < 5 MB; 0 more fds, 0 more threads",
        ),
        (
            "concurrent_8_rushes",
            "every Task-ID once; status_ms_p99 < 50",
        ),
        ("restart_first_list_ms_500_ended", "< 200"),
        ("clean_release_build_s", "report"),
        ("warm_build_second_over_first", "≤ 0.30"),
    ];
    for (k, goal) in goals {
        let r = &v["results"][k];
        let cell = |f: &str| match &r[f] {
            Value::Null => String::new(),
            x => x.to_string(),
        };
        if r.get("median").is_some() {
            // A figure measured against a baseline of the same run shows both.
            let against = match (r.get("ratio"), r["plain_docker_run_s"].get("median")) {
                (Some(ratio), Some(base)) => {
                    format!(" (plain `docker run`: {base} s; ratio {ratio})")
                }
                _ => String::new(),
            };
            o.push_str(&format!(
                "| `{k}` | {} | {} | {} | {goal}{against} |\n",
                cell("median"),
                cell("min"),
                cell("max")
            ));
        } else if r.is_number() {
            o.push_str(&format!("| `{k}` | {r} | | | {goal} |\n"));
        } else if r.is_null() {
            o.push_str(&format!("| `{k}` | not run | | | {goal} |\n"));
        } else {
            let text = r.to_string().replace('|', "\\|");
            o.push_str(&format!("| `{k}` | {text} | | | {goal} |\n"));
        }
    }
    if let Some(vs) = v["results"].get("vs_original") {
        o.push_str(&vs_original_markdown(vs));
    }
    o
}

/// The `vs_original` result as a table: one row per run and one of ratios, or why it did not
/// run.
fn vs_original_markdown(vs: &Value) -> String {
    let text = |x: &Value| match x {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        x => x.to_string(),
    };
    if let Some(why) = vs.get("skipped").or_else(|| vs.get("error")) {
        return format!("\nThe original ZERG side by side: not run: {}\n", text(why));
    }
    let mut o = format!(
        "\nThe original ZERG side by side: {} on Python {}; {}; {}.\n\n",
        text(&vs["original"]),
        text(&vs["python"]),
        text(&vs["graph"]),
        text(&vs["rss"])
    );
    o.push_str("| run | wall s | tasks complete | orchestrator peak RSS MB | largest worker peak RSS MB | all processes peak RSS MB |\n|---|---|---|---|---|---|\n");
    let rss = [
        "orchestrator_peak_rss_mb",
        "worker_peak_rss_mb",
        "all_processes_peak_rss_mb",
    ];
    for (name, key) in [
        ("original, as shipped", "original_as_shipped"),
        (
            "original, each task's `level` in its state file",
            "original_level_in_state",
        ),
        ("zerg", "zerg_demo"),
    ] {
        let r = &vs[key];
        let wall = match &r["wall_s"] {
            Value::Null => format!("had not ended at {} s", text(&r["cap_s"])),
            w => text(w),
        };
        o.push_str(&format!(
            "| {name} | {wall} | {}/{} | {} | {} | {} |\n",
            text(&r["tasks_complete"]),
            text(&r["tasks"]),
            text(&r[rss[0]]),
            text(&r[rss[1]]),
            text(&r[rss[2]])
        ));
    }
    let q = &vs["level_in_state_over_zerg"];
    o.push_str(&format!(
        "| original with levels / zerg | {} | | {} | {} | {} |\n",
        text(&q["wall_s"]),
        text(&q[rss[0]]),
        text(&q[rss[1]]),
        text(&q[rss[2]])
    ));
    o
}

/// One thorough reconciliation of a 10,000-task rush (20 levels of 500, half of them done),
/// in process: the mean of 50, in milliseconds.
fn reconcile_ms_10k() -> Result<f64, String> {
    use zergd::supervisor::rush::{Effects, Rush, RushPaths};
    let text = graph_wide("rc", 20, 500);
    let g = zerg_proto::graph::parse(text.as_bytes(), std::path::Path::new("rc.json"))
        .map_err(|e| e.to_string())?
        .graph;
    let paths = RushPaths::new(std::path::PathBuf::from("/nonexistent/repo"), "rc");
    let meta = zergd::state::RushMeta {
        rush_id: "rc-1".into(),
        workers: 16,
        base_commit: "base".into(),
        ..Default::default()
    };
    let wall = std::time::SystemTime::now();
    let doc = zergd::supervisor::jobs::initial_doc(&g, meta, &paths, wall);
    let now = tokio::time::Instant::now();
    let mut r = Rush::new(
        doc,
        g,
        zergd::config::Config::default(),
        paths,
        String::new(),
        now,
    );
    r.start(now, wall, &mut Effects::default());
    for t in r.doc.tasks.values_mut() {
        if t.level.unwrap_or(0) <= 10 {
            t.status = zergd::domain::TaskStatus::Complete;
        }
    }
    r.doc.current_level = 11;
    let n = 50;
    let t = Instant::now();
    for _ in 0..n {
        std::hint::black_box(r.reconcile(true, wall));
    }
    Ok(t.elapsed().as_secs_f64() * 1000.0 / f64::from(n))
}

const BENCH_IMAGE: &str = "zerg-worker:bench";

/// Ten container workers from `zergctl rush` to a first heartbeat from each, against ten plain
/// `docker run`s of the same image started together, in the same run.
/// Whether status `s` lists `n` workers, each with a non-empty `key`.
fn every_worker_has(s: &Value, n: usize, key: &str) -> bool {
    s["workers"].as_object().is_some_and(|w| {
        w.len() == n
            && w.values()
                .all(|w| w[key].as_str().is_some_and(|v| !v.is_empty()))
    })
}

fn container_ready(opts: &Opts) -> Value {
    let engine = Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output();
    if !engine.is_ok_and(|o| o.status.success()) {
        return json!({"skipped": "no Docker engine reachable"});
    }
    let built = Command::new(bin("zergctl"))
        .args([
            "image",
            "build",
            "--offline",
            "--tag",
            BENCH_IMAGE,
            "--with",
        ])
        .arg(bin("fake-claude"))
        .arg("--agent")
        .arg(bin("zerg-worker-agent"))
        .output();
    match built {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            return json!({"error": format!("zergctl image build failed: {}", String::from_utf8_lossy(&o.stderr).trim())});
        }
        Err(e) => return json!({"error": format!("zergctl image build: {e}")}),
    }
    let n = 10usize;
    let plain = || -> Result<f64, String> {
        let t = Instant::now();
        let children: Vec<_> = (0..n)
            .map(|_| {
                Command::new("docker")
                    .args([
                        "run",
                        "--rm",
                        "--entrypoint",
                        "/bin/sh",
                        BENCH_IMAGE,
                        "-c",
                        "true",
                    ])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
            })
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        for mut c in children {
            if !c.wait().map_err(|e| e.to_string())?.success() {
                return Err("a plain docker run failed".into());
            }
        }
        Ok(t.elapsed().as_secs_f64())
    };
    let zerg = || -> Result<f64, String> {
        let repo = TestRepo::new();
        repo.write_graph("cready", &graph_wide("cready", 1, n as u32));
        // Each task holds its worker until the bench stops the rush. Tasks that end at once
        // let the first workers up take every task, and the rush could end before the last
        // container had started: that worker would never heartbeat.
        repo.write_script(
            "cready",
            &json!({"default": [{"op": "write_owned"}, {"op": "sleep_ms", "ms": 600000}]}),
        );
        std::fs::create_dir_all(repo.path.join(".zerg")).map_err(|e| e.to_string())?;
        std::fs::write(
            repo.path.join(".zerg/config.yaml"),
            format!("agent:\n  command: [fake-claude, --print]\ncontainer:\n  image: {BENCH_IMAGE}\n{BENCH_WORKERS}"),
        )
        .map_err(|e| e.to_string())?;
        let d = Daemon::start();
        let t = Instant::now();
        let out = d.ctl_in(
            &repo.path,
            &[
                "rush",
                "cready",
                "--workers",
                &n.to_string(),
                "--mode",
                "container",
                "--detach",
            ],
        );
        if !out.status.success() {
            return Err(format!(
                "rush did not start: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let mut ready = None;
        let mut in_containers = false;
        let mut last = None;
        while t.elapsed() < Duration::from_secs(120) {
            let status = d.status(&repo.path, "cready");
            if let Some(s) = &status {
                if ready.is_none() && every_worker_has(s, n, "last_heartbeat") {
                    ready = Some(t.elapsed().as_secs_f64());
                }
                // A worker's first heartbeat can reach zergd before the spawn that made its
                // container is recorded: the containers are checked once both are in.
                if ready.is_some() && every_worker_has(s, n, "container_id") {
                    in_containers = true;
                    break;
                }
            }
            last = status.or(last);
            std::thread::sleep(Duration::from_millis(10));
        }
        if ready.is_some() && !in_containers {
            let _ = d.ctl_in(&repo.path, &["stop", "cready", "--force"]);
            return Err(format!(
                "the workers did not run in containers: {}",
                last.unwrap_or_default()
            ));
        }
        let _ = d.ctl_in(&repo.path, &["stop", "cready", "--force"]);
        // zergd removes the containers of a stopped rush; the bench leaves none behind either
        // way (what zergd had not removed after 30 s is removed here).
        let gone = Instant::now();
        while !bench_containers().is_empty() && gone.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(100));
        }
        let left = bench_containers();
        if !left.is_empty() {
            let _ = Command::new("docker")
                .args(["rm", "-f"])
                .args(&left)
                .output();
        }
        ready.ok_or_else(|| {
            // Name what the bench last saw, so a run that fails here says why.
            let seen = last.as_ref().map_or_else(
                || "no status answered".to_string(),
                |s| {
                    let workers = s["workers"].as_object().map_or_else(Vec::new, |w| {
                        w.iter()
                            .map(|(id, w)| {
                                format!(
                                    "{id}: {} (heartbeat {:?})",
                                    w["status"].as_str().unwrap_or("?"),
                                    w["last_heartbeat"].as_str().unwrap_or("")
                                )
                            })
                            .collect()
                    });
                    format!(
                        "rush {}, {} of {n} workers: {}",
                        s["state"].as_str().unwrap_or("?"),
                        workers.len(),
                        workers.join("; ")
                    )
                },
            );
            format!("the ten workers did not all heartbeat within 120 s; last status: {seen}")
        })
    };
    let (mut zs, mut ps) = (Vec::new(), Vec::new());
    for _ in 0..opts.runs {
        match (plain(), zerg()) {
            (Ok(p), Ok(z)) => {
                ps.push(p);
                zs.push(z);
            }
            (Err(e), _) | (_, Err(e)) => return json!({"error": e}),
        }
    }
    let mut v = summary(&zs);
    let plain = summary(&ps);
    if let (Some(z), Some(p)) = (v["median"].as_f64(), plain["median"].as_f64()) {
        v["plain_docker_run_s"] = plain;
        v["ratio"] = json!(round(z / p, 2));
    }
    v
}

/// zergd's open files and threads.
fn fds_threads(pid: i32) -> (usize, usize) {
    let n = |d: String| std::fs::read_dir(d).map(|r| r.count()).unwrap_or(0);
    (n(format!("/proc/{pid}/fd")), n(format!("/proc/{pid}/task")))
}

/// zergd's resident set once its idle threads have ended (tokio's blocking pool keeps an idle
/// thread 10 s): (RSS MB, fds, threads).
fn settled(pid: i32, threads_at_start: usize) -> (f64, usize, usize) {
    poll(Duration::from_secs(30), || {
        fds_threads(pid).1 <= threads_at_start
    });
    let (fds, threads) = fds_threads(pid);
    let rss = mem_kib(pid)
        .map(|(rss, _)| rss as f64 / 1024.0)
        .unwrap_or(0.0);
    (round(rss, 1), fds, threads)
}

/// 200 rushes of the 12-task graph one after another on one zergd, each in a repository of its
/// own (removed once its rush ended, as a user's scratch repositories are): zergd's RSS, open
/// files and threads after rush 10 and after the last, each once its idle threads have ended.
fn soak(opts: &Opts) -> Value {
    let n = if opts.quick { 20 } else { 200 };
    let d = Daemon::start();
    let pid = d.pid() as i32;
    let (_, _, threads0) = settled(pid, usize::MAX);
    let t = Instant::now();
    let mut at_10 = (0.0, 0, 0);
    for i in 1..=n {
        let feature = format!("soak{i}");
        let repo = TestRepo::new();
        repo.write_graph(&feature, &graph_12(&feature));
        repo.write_config(BENCH_WORKERS);
        repo.write_script(&feature, &json!({"default": [{"op": "write_owned"}]}));
        if let Err(e) = rush_to_end(&d, &repo, &feature, 3) {
            return json!({"error": format!("rush {i}: {e}"), "completed": false});
        }
        if i == 10 {
            at_10 = settled(pid, threads0);
        }
    }
    let seconds = t.elapsed().as_secs_f64();
    let end = settled(pid, threads0);
    json!({
        "rushes": n,
        "rss_mb_after_10": at_10.0,
        "rss_mb_after_last": end.0,
        "rss_growth_mb": round(end.0 - at_10.0, 1),
        "fds_after_10": at_10.1,
        "fds_after_last": end.1,
        "threads_after_10": at_10.2,
        "threads_after_last": end.2,
        "seconds": round(seconds, 1),
    })
}

/// p50 and p99 of a list of milliseconds.
fn percentiles(mut ms: Vec<f64>) -> (f64, f64) {
    if ms.is_empty() {
        return (0.0, 0.0);
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
    (round(at(0.5), 2), round(at(0.99), 2))
}

/// 8 rushes of the 12-task graph at once, in 8 repositories, 2 workers each: each must end
/// with every Task-ID on its staging branch exactly once, while a client asks `Status` of one
/// of them after another; the latency of those answers.
fn concurrent() -> Value {
    let d = Daemon::start();
    let repos: Vec<(TestRepo, String)> = (0..8)
        .map(|i| {
            let feature = format!("many{i}");
            let repo = TestRepo::new();
            repo.write_graph(&feature, &graph_12(&feature));
            repo.write_config(BENCH_WORKERS);
            repo.write_script(
                &feature,
                &json!({"default": [{"op": "write_owned"}, {"op": "sleep_ms", "ms": 300}]}),
            );
            (repo, feature)
        })
        .collect();
    let t = Instant::now();
    for (repo, feature) in &repos {
        let out = d.ctl_in(&repo.path, &["rush", feature, "--workers", "2", "--detach"]);
        if !out.status.success() {
            return json!({"error": format!("rush {feature}: {}", String::from_utf8_lossy(&out.stderr).trim()), "completed": false});
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let keys: Vec<(String, String)> = repos
        .iter()
        .map(|(r, f)| (r.path.to_string_lossy().into_owned(), f.clone()))
        .collect();
    let latencies: Result<Vec<f64>, String> = rt.block_on(async {
        let ch = zerg_proto::transport::connect(&d.socket)
            .await
            .map_err(|e| e.to_string())?;
        let mut c = zerg_proto::v1::control_client::ControlClient::new(ch);
        let mut ms = Vec::new();
        let mut ended = vec![false; keys.len()];
        let mut i = 0;
        while !ended.iter().all(|e| *e) && t.elapsed() < LIMIT {
            let k = i % keys.len();
            i += 1;
            let asked = Instant::now();
            let st = c
                .status(zerg_proto::v1::StatusRequest {
                    repo: keys[k].0.clone(),
                    feature: keys[k].1.clone(),
                })
                .await
                .map_err(|e| e.message().to_string())?
                .into_inner();
            if !ended[k] {
                ms.push(asked.elapsed().as_secs_f64() * 1000.0);
            }
            use zerg_proto::v1::RushState;
            ended[k] = matches!(
                st.state(),
                RushState::Complete | RushState::Failed | RushState::Stopped
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(ms)
    });
    let ms = match latencies {
        Ok(ms) => ms,
        Err(e) => return json!({"error": e, "completed": false}),
    };
    let wall = t.elapsed().as_secs_f64();
    let ids = graph_12_ids();
    let mut wrong = Vec::new();
    for (repo, feature) in &repos {
        let on = repo.task_ids_on(&format!("zerg/{feature}/staging"));
        if on != ids {
            wrong.push(format!("{feature}: {} Task-IDs", on.len()));
        }
    }
    if !wrong.is_empty() {
        return json!({"error": format!("not every Task-ID once: {wrong:?}"), "completed": false});
    }
    let (p50, p99) = percentiles(ms.clone());
    json!({
        "rushes": 8,
        "tasks": 8 * 12,
        "wall_s": round(wall, 2),
        "status_answers": ms.len(),
        "status_ms_p50": p50,
        "status_ms_p99": p99,
        "every_task_id_once": true,
    })
}

/// zergd started over a state directory whose registry lists 500 ended rushes (copies of one
/// real rush's files, in 500 repositories): the time from starting zergd to its first `List`
/// answer, and that the answer has all 500.
fn restart_500() -> Value {
    let work = tempfile::tempdir().expect("tempdir");
    let state_dir = work.path().join("state");
    let socket = work.path().join("zergd.sock");
    // One real rush, on a zergd of the bench's own, gives the files every copy has.
    let repo = TestRepo::new();
    repo.write_graph("seed", &graph_12("seed"));
    repo.write_config(BENCH_WORKERS);
    let start = || {
        Command::new(bin("zergd"))
            .arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(&state_dir)
            .env("IS_SANDBOX", "1")
            .env("ZERG_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("zergd starts")
    };
    let ctl = |args: &[&str]| {
        Command::new(bin("zergctl"))
            .args(args)
            .current_dir(&repo.path)
            .env("ZERG_SOCKET", &socket)
            .stdin(Stdio::null())
            .output()
            .expect("zergctl runs")
    };
    let mut z = start();
    if !poll(Duration::from_secs(20), || ctl(&["list"]).status.success()) {
        let _ = z.kill();
        let _ = z.wait();
        return json!({"error": "zergd did not start", "completed": false});
    }
    let out = ctl(&["rush", "seed", "--workers", "3"]);
    let _ = Command::new("kill").arg(z.id().to_string()).status();
    let _ = z.wait();
    if !out.status.success() {
        return json!({"error": "the seed rush did not complete", "completed": false});
    }
    let reg_path = state_dir.join("rushes.json");
    let mut reg: Value = match std::fs::read(&reg_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
    {
        Some(v) => v,
        None => return json!({"error": "no registry after the seed rush", "completed": false}),
    };
    let seed = reg["rushes"][0].clone();
    let mut entries = Vec::new();
    let copies = work.path().join("repos");
    for i in 0..500 {
        let dir = copies.join(format!("r{i}"));
        let st = dir.join(".zerg");
        std::fs::create_dir_all(&st).expect("mkdir");
        let ok = Command::new("cp")
            .arg("-a")
            .arg(repo.path.join(".zerg/state"))
            .arg(repo.path.join(".zerg/rush"))
            .arg(&st)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return json!({"error": "cannot copy the seed rush's files", "completed": false});
        }
        let mut e = seed.clone();
        e["rush_id"] = json!(format!("seed-{i:04}"));
        e["repo"] = json!(dir.to_string_lossy());
        entries.push(e);
    }
    reg["rushes"] = json!(entries);
    std::fs::write(&reg_path, serde_json::to_vec(&reg).expect("json")).expect("write registry");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let t = Instant::now();
    let mut z = start();
    let listed = rt.block_on(async {
        while t.elapsed() < Duration::from_secs(60) {
            if let Ok(ch) = zerg_proto::transport::connect(&socket).await {
                let mut c = zerg_proto::v1::control_client::ControlClient::new(ch);
                if let Ok(l) = c.list(zerg_proto::v1::ListRequest {}).await {
                    return Some((t.elapsed(), l.into_inner().rushes.len()));
                }
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        None
    });
    let rss = mem_kib(z.id() as i32).map(|(r, _)| round(r as f64 / 1024.0, 1));
    let _ = z.kill();
    let _ = z.wait();
    match listed {
        Some((wall, 500)) => json!({
            "median": round(wall.as_secs_f64() * 1000.0, 1),
            "runs": 1,
            "rushes": 500,
            "zergd_rss_mb": rss,
        }),
        Some((_, n)) => {
            json!({"error": format!("list had {n} rushes, not 500"), "completed": false})
        }
        None => json!({"error": "zergd did not answer list within 60 s", "completed": false}),
    }
}

/// The tokio crate's sources from cargo's registry (the version this workspace builds with):
/// a repository of real size that CI has without the network.
fn tokio_sources() -> Result<PathBuf, String> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set")?;
    let mut found: Vec<PathBuf> = std::fs::read_dir(home.join("registry/src"))
        .map_err(|e| format!("cargo's registry: {e}"))?
        .flatten()
        .flat_map(|index| {
            std::fs::read_dir(index.path())
                .into_iter()
                .flatten()
                .flatten()
        })
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("tokio-"))
                .is_some_and(|v| v.starts_with(|c: char| c.is_ascii_digit()))
        })
        .collect();
    found.sort();
    found
        .pop()
        .ok_or_else(|| "no tokio sources in cargo's registry".into())
}

fn copy_tree(from: &Path, to: &Path) -> std::io::Result<u64> {
    let mut bytes = 0;
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)?.flatten() {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let t = e.file_type()?;
        if t.is_dir() {
            bytes += copy_tree(&src, &dst)?;
        } else if t.is_file() {
            bytes += std::fs::copy(&src, &dst)?;
        }
    }
    Ok(bytes)
}

/// Appends `lines` lines of code to `rel` in `repo`.
fn grow(repo: &Path, rel: &str, lines: usize, tag: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(repo.join(rel))
        .expect("open");
    for i in 0..lines {
        writeln!(
            f,
            "pub fn {tag}_{i}(x: u64) -> u64 {{ x.wrapping_mul({i}) ^ 0x5bd1e995 }}"
        )
        .expect("write");
    }
}

/// What crosses the worker plane in swarm and kubernetes modes, measured on the tokio crate's
/// sources committed as a repository: the first depth-one snapshot a worker fetches, a task's
/// thin pack pushed back (one file changed, one added), and the fetch of a base that moved by a
/// level (eight files changed by other workers), each as the bytes of the pack.
fn transfer() -> Result<BTreeMap<&'static str, f64>, String> {
    use zerg_git::transfer::store_fetched;
    let src = tokio_sources()?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let origin = dir.path().join("origin");
    let tree_bytes = copy_tree(&src, &origin).map_err(|e| e.to_string())?;
    let g = |r: &Path, args: &[&str]| zerg_proto::testkit::git(r, args);
    g(&origin, &["init", "-q", "-b", "main"]);
    g(&origin, &["add", "-A"]);
    g(&origin, &["commit", "-q", "-m", "tokio"]);
    let files: Vec<String> = g(&origin, &["ls-files", "src/*.rs"])
        .lines()
        .map(str::to_string)
        .collect();
    if files.len() < 10 {
        return Err("too few source files".into());
    }
    let base = g(&origin, &["rev-parse", "HEAD"]);
    let repo = zerg_git::Repo::open(&origin).map_err(|e| e.to_string())?;
    let spool = |f: &dyn Fn(std::fs::File) -> Result<u64, zerg_git::Error>| {
        let file = tempfile::tempfile().map_err(|e| e.to_string())?;
        let n = f(file.try_clone().map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
        use std::io::Seek;
        let mut file = file;
        file.rewind().map_err(|e| e.to_string())?;
        Ok::<_, String>((file, n))
    };
    // The first snapshot.
    let objects = repo
        .snapshot_objects(std::slice::from_ref(&base), &[])
        .map_err(|e| e.to_string())?;
    let (pack, first) = spool(&|f| repo.write_pack(&objects, f))?;
    let worker = dir.path().join("worker");
    std::fs::create_dir_all(&worker).map_err(|e| e.to_string())?;
    g(&worker, &["init", "-q"]);
    store_fetched(&worker.join(".git"), pack, std::slice::from_ref(&base))?;
    g(&worker, &["reset", "-q", "--hard", &base]);
    // A task: one file grows, one is new.
    grow(&worker, &files[0], 20, "task");
    grow(&worker, "src/zerg_task.rs", 100, "added");
    g(&worker, &["add", "-A"]);
    g(
        &worker,
        &[
            "-c",
            "user.name=w",
            "-c",
            "user.email=w@x",
            "commit",
            "-q",
            "-m",
            "task",
        ],
    );
    let commit = g(&worker, &["rev-parse", "HEAD"]);
    let wrepo = zerg_git::Repo::open(&worker).map_err(|e| e.to_string())?;
    let (_, task) = spool(&|f| wrepo.write_thin_pack(&base, &commit, f))?;
    // A level of other workers: eight files change on zergd's side.
    for (i, f) in files.iter().skip(1).take(8).enumerate() {
        grow(&origin, f, 20, &format!("level_{i}"));
    }
    g(&origin, &["commit", "-q", "-am", "level"]);
    let moved = g(&origin, &["rev-parse", "HEAD"]);
    let repo = zerg_git::Repo::open(&origin).map_err(|e| e.to_string())?;
    let objects = repo
        .snapshot_objects(std::slice::from_ref(&moved), std::slice::from_ref(&base))
        .map_err(|e| e.to_string())?;
    let (_, base_move) = spool(&|f| repo.write_pack(&objects, f))?;
    let kb = |b: u64| (b as f64 / 1024.0 * 10.0).round() / 10.0;
    Ok(BTreeMap::from([
        ("transfer_source_tree_kb", kb(tree_bytes)),
        ("transfer_first_snapshot_kb", kb(first)),
        ("transfer_task_result_kb", kb(task)),
        ("transfer_base_move_kb", kb(base_move)),
    ]))
}
