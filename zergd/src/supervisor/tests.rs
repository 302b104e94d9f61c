//! Tests of the rush state machine ([`Rush`]) driven with a fake clock and no processes.
//!
//! Every input is a method call with an explicit `Instant` and wall time, so hours of timeouts
//! take no real time. Lease replies travel over real oneshot channels; the replies the machine
//! queues in [`Effects`] are delivered right after each call, as the actor does after saving.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::domain::{LevelStatus, MergeStatus, Mode, RushState, TaskStatus, WorkerStatus};
use crate::error::SupervisorError;
use serde_json::{Value, json};
use tokio::sync::oneshot::{self, error::TryRecvError};
use tokio::time::Instant;
use tonic::Code;
use zerg_proto::graph::TaskGraph;
use zerg_symbols::{BuildStats, Grammar, SymbolIndex};

use crate::calls::{
    Assignment, Beat, Caller, Completion, Failure, LeaseOutcome, LeaseRef, Register,
};

use super::rush::{Effects, MergeResult, Rush, RushPaths};
use crate::config::{Config, WorkersConfig};
use crate::launcher::{ExitInfo, SpawnError, Spawned};
use crate::state::{RushMeta, TaskState, WorkerState};

const FEATURE: &str = "feat";
const RUSH_ID: &str = "feat-1";

type LeaseRx = oneshot::Receiver<Result<LeaseOutcome, SupervisorError>>;

/// The lease a task handed out names.
fn lease_of(t: &Assignment) -> LeaseRef {
    LeaseRef {
        task_id: t.task_id.clone(),
        lease_id: t.lease_id.clone(),
    }
}

/// One task of a test graph; it creates `src/<id>.rs`.
fn task(id: &str, level: u32, deps: &[&str]) -> Value {
    json!({
        "id": id,
        "title": format!("Task {id}"),
        "description": "does things",
        "level": level,
        "dependencies": deps,
        "files": {"create": [format!("src/{}.rs", id.to_lowercase())], "modify": [], "read": []},
        "verification": {"command": "true", "timeout_seconds": 30},
    })
}

fn graph(tasks: Vec<Value>) -> TaskGraph {
    let v = json!({"feature": FEATURE, "version": "2.0", "tasks": tasks});
    match zerg_proto::graph::parse(v.to_string().as_bytes(), Path::new("task-graph.json")) {
        Ok(v) => v.graph,
        Err(e) => panic!("test graph is invalid: {e}"),
    }
}

/// The default config with some `workers:` keys changed.
fn config(f: impl FnOnce(&mut WorkersConfig)) -> Config {
    let mut c = Config::default();
    f(&mut c.workers);
    c
}

/// Asserts that `d` is `nominal_secs` with at most ±10 % jitter.
#[track_caller]
fn assert_jittered(d: Duration, nominal_secs: f64) {
    let s = d.as_secs_f64();
    assert!(
        s >= nominal_secs * 0.9 - 1e-6 && s <= nominal_secs * 1.1 + 1e-6,
        "delay {s}s is not {nominal_secs}s ±10 %"
    );
}

fn stopped(fx: &Effects) -> Vec<u32> {
    fx.stop.iter().map(|(w, _, _)| *w).collect()
}

fn drained(fx: &Effects) -> Vec<u32> {
    fx.drain.iter().map(|(w, _, _)| *w).collect()
}

/// A rush plus a fake clock and the lease channels of the fake agents.
struct H {
    r: Rush,
    now: Instant,
    wall: SystemTime,
    leases: BTreeMap<u32, LeaseRx>,
}

impl H {
    /// A rush as `jobs::prepare_fresh` builds it, not started yet.
    fn new(tasks: Vec<Value>, workers: u32, config: Config) -> H {
        let graph = graph(tasks);
        let paths = RushPaths::new(PathBuf::from("/nonexistent/repo"), FEATURE);
        let meta = RushMeta {
            rush_id: RUSH_ID.into(),
            repo: "/nonexistent/repo".into(),
            mode: Mode::Subprocess,
            workers,
            base_branch: "main".into(),
            base_commit: "base".into(),
            ..Default::default()
        };
        let doc = super::jobs::initial_doc(&graph, meta, &paths, SystemTime::UNIX_EPOCH);
        let now = Instant::now();
        let mut r = Rush::new(doc, graph, config, paths, "feature context".into(), now);
        // The symbol map is built by a blocking job that these tests do not run: they start
        // with an empty one (the tests of the map itself hand one over with `on_indexed`).
        r.symbols = Some(Arc::new(SymbolIndex::default()));
        r.dirty = false;
        H {
            r,
            now,
            wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
            leases: BTreeMap::new(),
        }
    }

    // --- clock ---

    fn advance(&mut self, d: Duration) {
        self.now += d;
        self.wall += d;
    }

    fn advance_to(&mut self, t: Instant) {
        assert!(t >= self.now, "the fake clock only moves forward");
        let d = t - self.now;
        self.advance(d);
    }

    fn wall_ms(&self) -> i64 {
        crate::clock::unix_millis(self.wall)
    }

    // --- driving the machine ---

    /// Runs one input and delivers the replies it queued (as the actor does after saving).
    fn run(&mut self, f: impl FnOnce(&mut Rush, Instant, SystemTime, &mut Effects)) -> Effects {
        let mut fx = Effects::default();
        f(&mut self.r, self.now, self.wall, &mut fx);
        for reply in fx.replies.drain(..) {
            reply(None);
        }
        fx
    }

    fn start(&mut self) -> Effects {
        self.run(|r, now, wall, fx| r.start(now, wall, fx))
    }

    fn tick_next(&mut self) -> (Effects, Option<Instant>) {
        let mut next = None;
        let fx = self.run(|r, now, wall, fx| next = r.tick(now, wall, fx));
        (fx, next)
    }

    fn tick(&mut self) -> Effects {
        self.tick_next().0
    }

    fn stop(&mut self, force: bool) -> (Effects, u32) {
        let mut n = 0;
        let fx = self.run(|r, now, wall, fx| n = r.stop(force, now, wall, fx));
        (fx, n)
    }

    fn retry(&mut self) -> (Effects, Vec<String>) {
        let mut ids = vec![];
        let fx = self.run(|r, now, wall, fx| {
            ids = r.retry(&[], false, now, wall, fx).expect("retry accepted");
        });
        (fx, ids)
    }

    fn generation(&self, w: u32) -> u64 {
        self.worker(w).generation
    }

    fn wref(&self, w: u32) -> Caller {
        Caller {
            rush_id: RUSH_ID.into(),
            worker: w,
            generation: self.generation(w),
        }
    }

    /// The launcher reports that the current generation of slot `w` started.
    fn spawned(&mut self, w: u32) -> Effects {
        let generation = self.generation(w);
        let sp = Spawned {
            pid: Some(1000 + w as i32),
            start_time: None,
            container_id: None,
        };
        self.run(|r, now, wall, fx| r.on_spawned(w, generation, Ok(sp), now, wall, fx))
    }

    /// The launcher reports that the current spawn of slot `w` failed.
    fn spawn_failed(&mut self, w: u32, message: &str) -> Effects {
        let generation = self.generation(w);
        let err = SpawnError::new(message);
        self.run(|r, now, wall, fx| r.on_spawned(w, generation, Err(err), now, wall, fx))
    }

    fn register(&mut self, w: u32) {
        let req = Register {
            caller: self.wref(w),
            pid: 1000 + w as i32,
            held: None,
        };
        if let Err(e) = self.r.on_register(req, self.now, self.wall) {
            panic!("worker {w} could not register: {e:?}");
        }
    }

    /// Worker `w` asks for work; the reply (now or later) is read with [`H::reply`].
    fn lease_as(&mut self, w: u32, worker: Caller) -> Effects {
        let (tx, rx) = oneshot::channel();
        self.leases.insert(w, rx);
        self.run(|r, now, wall, fx| r.on_lease(&worker, tx, now, wall, fx))
    }

    fn lease(&mut self, w: u32) -> Effects {
        let me = self.wref(w);
        self.lease_as(w, me)
    }

    /// The lease reply worker `w` received, if any yet.
    fn reply(&mut self, w: u32) -> Option<Result<LeaseOutcome, SupervisorError>> {
        let rx = self.leases.get_mut(&w)?;
        match rx.try_recv() {
            Ok(v) => {
                self.leases.remove(&w);
                Some(v)
            }
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Closed) => {
                self.leases.remove(&w);
                None
            }
        }
    }

    #[track_caller]
    fn leased(&mut self, w: u32) -> Assignment {
        match self.reply(w) {
            Some(Ok(LeaseOutcome::Task(t))) => *t,
            other => panic!("worker {w} expected a task, got {other:?}"),
        }
    }

    #[track_caller]
    fn done(&mut self, w: u32) -> String {
        match self.reply(w) {
            Some(Ok(LeaseOutcome::Done { reason })) => reason,
            other => panic!("worker {w} expected Done, got {other:?}"),
        }
    }

    /// The fake agent of slot `w` starts, registers and asks for work. Returns the task if
    /// one was handed out at once (otherwise the request stays parked).
    #[track_caller]
    fn join(&mut self, w: u32) -> Option<Assignment> {
        self.spawned(w);
        self.register(w);
        self.lease(w);
        match self.reply(w) {
            None => None,
            Some(Ok(LeaseOutcome::Task(t))) => Some(*t),
            other => panic!("worker {w} expected a task or nothing, got {other:?}"),
        }
    }

    fn complete_req(&self, w: u32, t: &Assignment) -> Completion {
        Completion {
            caller: self.wref(w),
            lease: lease_of(t),
            commit: format!("c-{}", t.task_id),
            tiers: vec![],
            out_of_scope: vec![],
            duration_ms: 1000,
            cost_usd: 0.0,
            usage: Default::default(),
        }
    }

    fn try_complete(&mut self, req: Completion) -> Result<Effects, SupervisorError> {
        let mut res = Ok(());
        let fx = self.run(|r, now, wall, fx| res = r.on_complete(req, now, wall, fx));
        res.map(|()| fx)
    }

    #[track_caller]
    fn complete(&mut self, w: u32, t: &Assignment) -> Effects {
        let req = self.complete_req(w, t);
        match self.try_complete(req) {
            Ok(fx) => fx,
            Err(e) => panic!("complete of {} refused: {e:?}", t.task_id),
        }
    }

    fn fail_req(&self, w: u32, t: &Assignment, kind: &str) -> Failure {
        Failure {
            caller: self.wref(w),
            lease: lease_of(t),
            // Test names: the domain's (`agent_failed`); an unknown one stays unspecified.
            kind: kind.parse::<crate::domain::FailKind>().ok(),
            message: format!("{kind} on {}", t.task_id),
            tiers: vec![],
            retry_at_ms: 0,
            checkpoint: None,
            cost_usd: 0.0,
            usage: Default::default(),
            limit_type: String::new(),
            context: String::new(),
        }
    }

    fn try_fail(&mut self, req: Failure) -> Result<Effects, SupervisorError> {
        let mut res = Ok(());
        let fx = self.run(|r, now, wall, fx| res = r.on_fail(req, now, wall, fx));
        res.map(|()| fx)
    }

    #[track_caller]
    fn fail_with(&mut self, req: Failure) -> Effects {
        let id = req.lease.task_id.clone();
        match self.try_fail(req) {
            Ok(fx) => fx,
            Err(e) => panic!("fail of {id} refused: {e:?}"),
        }
    }

    #[track_caller]
    fn fail(&mut self, w: u32, t: &Assignment, kind: &str) -> Effects {
        let req = self.fail_req(w, t, kind);
        self.fail_with(req)
    }

    fn heartbeat_as(
        &mut self,
        worker: Caller,
        t: Option<&Assignment>,
        step: &str,
        last_output_ms: i64,
    ) -> Result<(), SupervisorError> {
        let req = Beat {
            caller: worker,
            lease: t.map(lease_of),
            step: step.parse::<crate::domain::Step>().expect("a known step"),
            progress_pct: 50,
            last_output_ms,
            detail: String::new(),
        };
        self.r.on_heartbeat(req, self.now, self.wall)
    }

    #[track_caller]
    fn heartbeat(&mut self, w: u32, t: Option<&Assignment>, step: &str, last_output_ms: i64) {
        let me = self.wref(w);
        if let Err(e) = self.heartbeat_as(me, t, step, last_output_ms) {
            panic!("heartbeat of worker {w} refused: {e:?}");
        }
    }

    /// The current generation of slot `w` ended.
    fn exit(&mut self, w: u32, info: ExitInfo) -> Effects {
        let generation = self.generation(w);
        self.run(|r, now, wall, fx| r.on_exit(w, generation, info, now, wall, fx))
    }

    fn merge_result(&mut self, level: u32, result: MergeResult) -> Effects {
        self.run(|r, now, wall, fx| r.on_merged(level, result, now, wall, fx))
    }

    /// The git job merged `level` into staging as `sha-L<level>`.
    fn merge(&mut self, level: u32) -> Effects {
        self.merge_result(level, MergeResult::Merged(format!("sha-L{level}")))
    }

    // --- reading state ---

    #[track_caller]
    fn task(&self, id: &str) -> &TaskState {
        &self.r.doc.tasks[id]
    }

    #[track_caller]
    fn worker(&self, w: u32) -> &WorkerState {
        &self.r.doc.workers[&w.to_string()]
    }

    fn reason(&self, w: u32) -> String {
        self.worker(w).reason.clone().unwrap_or_default()
    }

    fn logged(&self, kind: &str) -> bool {
        self.r.doc.execution_log.iter().any(|e| e.event == kind)
    }
}

// === 1, 2: levels, leases, merges, work stealing ===

#[test]
fn happy_path_runs_level_by_level_and_completes() {
    let mut h = H::new(
        vec![
            task("A-L1-001", 1, &[]),
            task("A-L1-002", 1, &[]),
            task("A-L1-003", 1, &[]),
            task("A-L2-001", 2, &["A-L1-001"]),
            task("A-L2-002", 2, &["A-L1-002", "A-L1-003"]),
        ],
        2,
        config(|_| {}),
    );
    let fx = h.start();
    assert_eq!(fx.spawn, vec![(0, 1), (1, 1)]);
    assert_eq!(h.r.state(), RushState::Running);
    assert_eq!(h.r.doc.current_level, 1);
    assert_eq!(h.r.doc.levels["1"].status, LevelStatus::Running);
    assert_eq!(h.r.doc.levels["2"].status, LevelStatus::Pending);

    let a = h.join(0).expect("worker 0 gets a task");
    let b = h.join(1).expect("worker 1 gets a task");
    assert_eq!(
        (a.task_id.as_str(), b.task_id.as_str()),
        ("A-L1-001", "A-L1-002")
    );
    assert_eq!(a.level, 1);
    assert_eq!(a.lease_id, "A-L1-001#1");
    assert_eq!(a.attempt, 1);
    assert_eq!(a.base_commit, "base");
    assert_eq!(a.files.create, vec!["src/a-l1-001.rs".to_string()]);
    assert_eq!(h.task("A-L1-001").status, TaskStatus::InProgress);
    assert_eq!(h.task("A-L1-001").worker_id, Some(0));
    assert_eq!(h.worker(0).status, WorkerStatus::Running);
    assert_eq!(h.worker(0).current_task.as_deref(), Some("A-L1-001"));
    // Level 2 is not leasable while level 1 is open.
    assert_eq!(h.r.ready_tasks(), vec!["A-L1-003".to_string()]);

    let fx = h.complete(0, &a);
    assert!(fx.merge.is_none(), "level 1 still has open tasks");
    assert_eq!(h.task("A-L1-001").status, TaskStatus::Complete);
    assert_eq!(h.task("A-L1-001").commit.as_deref(), Some("c-A-L1-001"));
    assert_eq!(h.worker(0).accepted_head, "c-A-L1-001");
    h.lease(0);
    let c = h.leased(0);
    assert_eq!(c.task_id, "A-L1-003");
    assert_eq!(
        c.base_commit, "c-A-L1-001",
        "a worker continues from its own commits"
    );

    let fx = h.complete(1, &b);
    assert!(fx.merge.is_none(), "A-L1-003 is still running");
    h.lease(1);
    assert!(
        h.reply(1).is_none(),
        "nothing of level 1 is ready and level 2 is not open"
    );
    assert_eq!(h.task("A-L2-001").status, TaskStatus::Pending);
    assert_eq!(h.task("A-L2-002").status, TaskStatus::Pending);

    let fx = h.complete(0, &c);
    let job = fx
        .merge
        .expect("level 1 merge once all its tasks are terminal");
    assert_eq!(job.level, 1);
    let heads: Vec<(u32, String)> = job
        .heads
        .iter()
        .map(|(w, _, head)| (*w, head.clone()))
        .collect();
    assert_eq!(
        heads,
        vec![(0, "c-A-L1-003".to_string()), (1, "c-A-L1-002".to_string())]
    );
    assert_eq!(h.r.doc.levels["1"].merge_status, MergeStatus::Merging);
    h.lease(0);
    assert!(h.reply(0).is_none(), "no dispatch while the level merges");
    assert!(h.reply(1).is_none(), "no dispatch while the level merges");

    let fx = h.merge(1);
    assert!(fx.merge.is_none());
    assert_eq!(h.r.doc.levels["1"].status, LevelStatus::Complete);
    assert_eq!(h.r.doc.levels["1"].merge_status, MergeStatus::Complete);
    assert_eq!(h.r.doc.levels["1"].merge_commit.as_deref(), Some("sha-L1"));
    assert_eq!(h.r.doc.rush.staging_head, "sha-L1");
    assert_eq!(h.r.doc.current_level, 2);
    assert_eq!(h.r.doc.levels["2"].status, LevelStatus::Running);
    // Both parked workers get level 2 work in the same call, based on the merged staging.
    let d = h.leased(0);
    let e = h.leased(1);
    assert_eq!(
        (d.task_id.as_str(), e.task_id.as_str()),
        ("A-L2-001", "A-L2-002")
    );
    assert_eq!(d.base_commit, "sha-L1");
    assert_eq!(e.base_commit, "sha-L1");

    assert!(h.complete(0, &d).merge.is_none());
    h.lease(0);
    let job = h.complete(1, &e).merge.expect("level 2 merge");
    assert_eq!(job.level, 2);
    h.lease(1);

    let fx = h.merge(2);
    assert_eq!(h.r.state(), RushState::Complete);
    assert!(h.r.is_terminal());
    assert_eq!(h.r.doc.rush.reason, "");
    assert_eq!(h.r.doc.error, None);
    assert_eq!(h.r.doc.levels["2"].status, LevelStatus::Complete);
    assert_eq!(h.r.doc.rush.staging_head, "sha-L2");
    assert!(
        h.r.doc
            .tasks
            .values()
            .all(|t| t.status == TaskStatus::Complete)
    );
    assert!(fx.cleanup);
    assert!(fx.stop.is_empty(), "the end of a rush drains workers");
    assert_eq!(drained(&fx), vec![0, 1]);
    assert!(h.done(0).contains("complete"));
    assert!(h.done(1).contains("complete"));
    assert_eq!(h.worker(0).tasks_completed, 3);
    assert_eq!(h.worker(1).tasks_completed, 2);

    // Exit 0 because no work is left: done, not respawned.
    let fx = h.exit(0, ExitInfo::Code(0));
    assert!(fx.spawn.is_empty());
    assert_eq!(h.worker(0).status, WorkerStatus::Done);
    assert_eq!(h.r.doc.rush.resilience.worker_respawns, 0);
    assert!(h.tick().spawn.is_empty(), "a finished rush has no timers");
}

#[test]
fn work_stealing_gives_a_free_worker_the_next_ready_task_at_once() {
    let mut h = H::new(
        vec![
            task("A-L1-001", 1, &[]),
            task("A-L1-002", 1, &[]),
            task("A-L1-003", 1, &[]),
            task("A-L1-004", 1, &[]),
        ],
        2,
        config(|_| {}),
    );
    h.start();
    let mut t = h.join(0).expect("task");
    let slow = h.join(1).expect("task");
    assert_eq!(slow.task_id, "A-L1-002");
    // Worker 1 is slow; worker 0 takes every other task of the level, one after the other.
    for next in ["A-L1-003", "A-L1-004"] {
        h.complete(0, &t);
        h.lease(0);
        t = h.leased(0);
        assert_eq!(t.task_id, next);
        assert_eq!(h.task("A-L1-002").status, TaskStatus::InProgress);
        assert_eq!(h.task("A-L1-002").worker_id, Some(1));
    }
    h.complete(0, &t);
    h.lease(0);
    assert!(h.reply(0).is_none(), "nothing left to steal");
    assert_eq!(h.worker(0).tasks_completed, 3);
    let fx = h.complete(1, &slow);
    assert_eq!(fx.merge.expect("level merge").level, 1);
}

#[test]
fn the_ready_task_with_the_longest_chain_behind_it_starts_first_by_estimate_too() {
    // No estimates: A-L1-003 has two levels of work behind it, A-L1-002 one, A-L1-001 none.
    let mut h = H::new(
        vec![
            task("A-L1-001", 1, &[]),
            task("A-L1-002", 1, &[]),
            task("A-L1-003", 1, &[]),
            task("A-L2-001", 2, &["A-L1-002"]),
            task("A-L2-002", 2, &["A-L1-003"]),
            task("A-L3-001", 3, &["A-L2-002"]),
        ],
        1,
        config(|_| {}),
    );
    h.start();
    assert_eq!(h.r.ready_tasks(), ["A-L1-003", "A-L1-002", "A-L1-001"]);
    assert_eq!(h.join(0).expect("task").task_id, "A-L1-003");
    // The order comes from the graph alone: a rebuilt rush whose worker is gone puts the task
    // back first.
    h.restart(&super::rush::Observed::default());
    assert_eq!(h.task("A-L1-003").status, TaskStatus::Pending);
    assert_eq!(h.r.ready_tasks(), ["A-L1-003", "A-L1-002", "A-L1-001"]);

    // With estimates, minutes count, not tasks: one long task outweighs a chain of short ones,
    // and a task without one weighs the median estimate (10 here).
    let est = |mut t: Value, m: u32| {
        t["estimate_minutes"] = json!(m);
        t
    };
    let mut h = H::new(
        vec![
            est(task("A-L1-001", 1, &[]), 5),
            est(task("A-L1-002", 1, &[]), 60),
            task("A-L1-003", 1, &[]),
            est(task("A-L2-001", 2, &["A-L1-001"]), 10),
            est(task("A-L2-002", 2, &["A-L1-003"]), 10),
        ],
        1,
        config(|_| {}),
    );
    h.start();
    // A-L1-002: 60; A-L1-003: 10 + 10; A-L1-001: 5 + 10.
    assert_eq!(h.r.ready_tasks(), ["A-L1-002", "A-L1-003", "A-L1-001"]);
}

// === 3: fencing ===

#[test]
fn stale_leases_and_old_generations_are_refused_and_change_nothing() {
    let mut h = H::new(
        vec![task("A-L1-001", 1, &[]), task("A-L1-002", 1, &[])],
        2,
        config(|_| {}),
    );
    h.start();
    let a = h.join(0).expect("task");
    let b = h.join(1).expect("task");
    let before = h.r.doc.clone();

    // A lease id that is not the current one.
    let old = Assignment {
        lease_id: "A-L1-001#0".into(),
        ..a.clone()
    };
    let req = h.complete_req(0, &old);
    assert_eq!(
        h.try_complete(req).err().map(|e| e.code()),
        Some(Code::FailedPrecondition)
    );
    let req = h.fail_req(0, &old, "verification_failed");
    assert_eq!(
        h.try_fail(req).err().map(|e| e.code()),
        Some(Code::FailedPrecondition)
    );
    let me = h.wref(0);
    assert_eq!(
        h.heartbeat_as(me, Some(&old), "implementing", 1)
            .err()
            .map(|e| e.code()),
        Some(Code::FailedPrecondition)
    );
    // Another worker's lease.
    let req = h.complete_req(1, &a);
    assert_eq!(
        h.try_complete(req).err().map(|e| e.code()),
        Some(Code::FailedPrecondition)
    );
    assert_eq!(h.r.doc, before, "refused reports change nothing");

    // Worker 0 crashes; its slot is respawned as generation 2 and the task leased again.
    let gen1 = h.wref(0);
    let fx = h.exit(0, ExitInfo::Signal(9));
    assert_eq!(fx.spawn, vec![(0, 2)]);
    let a2 = h.join(0).expect("the requeued task");
    assert_eq!(a2.task_id, "A-L1-001");
    assert_eq!(a2.lease_id, "A-L1-001#2");
    let before = h.r.doc.clone();
    // The old generation can report neither the old lease nor the new one.
    for lease in [&a, &a2] {
        let mut req = h.complete_req(0, lease);
        req.caller = gen1.clone();
        assert_eq!(
            h.try_complete(req).err().map(|e| e.code()),
            Some(Code::FailedPrecondition)
        );
        let mut req = h.fail_req(0, lease, "agent_failed");
        req.caller = gen1.clone();
        assert_eq!(
            h.try_fail(req).err().map(|e| e.code()),
            Some(Code::FailedPrecondition)
        );
    }
    assert_eq!(
        h.heartbeat_as(gen1.clone(), None, "idle", 0)
            .err()
            .map(|e| e.code()),
        Some(Code::FailedPrecondition)
    );
    h.lease_as(0, gen1);
    match h.reply(0) {
        Some(Err(e)) => assert_eq!(e.code(), Code::FailedPrecondition),
        other => panic!("an old generation's lease must be refused, got {other:?}"),
    }
    assert_eq!(h.r.doc, before, "refused reports change nothing");
    // A spawn result for a superseded generation is stopped at once.
    let sp = Spawned {
        pid: Some(4242),
        start_time: None,
        container_id: None,
    };
    let fx = h.run(|r, now, wall, fx| r.on_spawned(0, 1, Ok(sp.clone()), now, wall, fx));
    assert_eq!(fx.stop.len(), 1);
    assert_eq!(fx.stop[0].0, 0);
    assert_eq!(fx.stop[0].1, sp);
    assert_eq!(fx.stop[0].2, Duration::ZERO);
    assert_eq!(
        h.worker(0).pid,
        Some(1000),
        "the live generation keeps its pid"
    );

    // A duplicate report after completion is refused too (no Task-ID twice).
    h.complete(1, &b);
    let req = h.complete_req(1, &b);
    assert_eq!(
        h.try_complete(req).err().map(|e| e.code()),
        Some(Code::FailedPrecondition)
    );
    assert_eq!(h.worker(1).tasks_completed, 1);
}

// === 4: task retries, permanent failure, blocking ===

#[test]
fn failed_task_retries_with_backoff_then_fails_and_blocks_its_dependents() {
    let mut h = H::new(
        vec![
            task("A-L1-001", 1, &[]),
            task("A-L1-002", 1, &[]),
            task("A-L2-001", 2, &["A-L1-001"]),
            task("A-L2-002", 2, &["A-L1-002"]),
            task("A-L3-001", 3, &["A-L2-001"]),
        ],
        2,
        config(|w| {
            w.retry_attempts = 2;
            w.heartbeat_stale_threshold = Duration::from_secs(10_000);
            w.task_stale_timeout_seconds = Duration::from_secs(10_000);
        }),
    );
    h.start();
    let mut t = h.join(0).expect("task");
    let other = h.join(1).expect("task");
    assert_eq!(t.task_id, "A-L1-001");
    for attempt in 1..=2u32 {
        let fx = h.fail(0, &t, "verification_failed");
        assert!(fx.merge.is_none());
        let ts = h.task("A-L1-001");
        assert_eq!(ts.status, TaskStatus::WaitingRetry);
        assert_eq!(ts.retry_count, attempt);
        assert!(
            ts.error
                .as_deref()
                .unwrap_or("")
                .contains("verification_failed")
        );
        assert_eq!(ts.lease_id, None);
        assert!(ts.next_retry_at.is_some());
        assert_eq!(h.worker(0).status, WorkerStatus::Ready);
        // Backoff 30 s · 2^attempt (config defaults), ±10 %.
        let due = h.r.rt_tasks["A-L1-001"].retry_due.expect("retry scheduled");
        assert_jittered(due - h.now, 30.0 * 2f64.powi(attempt as i32));
        h.lease(0);
        assert!(h.reply(0).is_none(), "not leasable during the backoff");
        h.advance_to(due - Duration::from_secs(1));
        h.tick();
        assert_eq!(h.task("A-L1-001").status, TaskStatus::WaitingRetry);
        assert!(h.reply(0).is_none(), "not leasable during the backoff");
        h.advance_to(due);
        h.tick();
        t = h.leased(0);
        assert_eq!(t.task_id, "A-L1-001");
        assert_eq!(t.attempt, attempt + 1);
        assert_eq!(t.lease_id, format!("A-L1-001#{}", attempt + 1));
    }

    // The third failure exhausts retry_attempts (2).
    h.fail(0, &t, "verification_failed");
    let ts = h.task("A-L1-001");
    assert_eq!(ts.status, TaskStatus::Failed);
    assert_eq!(ts.retry_count, 3);
    assert!(
        ts.error
            .as_deref()
            .unwrap_or("")
            .contains("failed after 3 attempts")
    );
    for dependent in ["A-L2-001", "A-L3-001"] {
        assert_eq!(h.task(dependent).status, TaskStatus::Blocked, "{dependent}");
        assert_eq!(h.task(dependent).blocked_by, vec!["A-L1-001".to_string()]);
    }
    assert_eq!(h.task("A-L2-002").status, TaskStatus::Pending);
    assert!(!h.r.rt_tasks.contains_key("A-L1-001"));
    assert_eq!(
        h.r.state(),
        RushState::Running,
        "independent work is still running"
    );

    // Independent tasks go on: level 1 merges what completed, then A-L2-002 runs.
    h.lease(0);
    assert!(h.reply(0).is_none());
    let fx = h.complete(1, &other);
    assert_eq!(fx.merge.expect("level 1 merge").level, 1);
    h.lease(1);
    h.merge(1);
    assert_eq!(h.r.doc.levels["1"].status, LevelStatus::Failed);
    assert_eq!(h.r.doc.current_level, 2);
    let t2 = h.leased(0);
    assert_eq!(t2.task_id, "A-L2-002");
    assert!(h.reply(1).is_none(), "the blocked A-L2-001 is never leased");
    assert_eq!(h.task("A-L2-001").status, TaskStatus::Blocked);

    let fx = h.complete(0, &t2);
    assert_eq!(fx.merge.expect("level 2 merge").level, 2);
    let fx = h.merge(2);
    assert_eq!(
        h.r.state(),
        RushState::Failed,
        "level 3 holds only blocked tasks"
    );
    let reason = &h.r.doc.rush.reason;
    assert!(reason.contains("A-L1-001"), "{reason}");
    assert!(reason.contains("2 blocked"), "{reason}");
    assert!(
        reason.contains("A-L2-001") && reason.contains("A-L3-001"),
        "{reason}"
    );
    assert_eq!(h.r.doc.error.as_deref(), Some(reason.as_str()));
    assert!(h.done(1).contains("failed"));
    assert!(fx.stop.is_empty(), "the end of a rush drains workers");
    assert_eq!(drained(&fx), vec![0, 1]);
    assert!(!fx.cleanup);
}

#[test]
fn permanent_failure_ends_the_rush_at_once_when_nothing_else_can_run() {
    let mut h = H::new(
        vec![
            task("A-L1-001", 1, &[]),
            task("A-L2-001", 2, &["A-L1-001"]),
            task("A-L3-001", 3, &["A-L2-001"]),
        ],
        2,
        config(|w| w.retry_attempts = 0),
    );
    h.start();
    let t = h.join(0).expect("task");
    assert!(h.join(1).is_none());
    let fx = h.fail(0, &t, "verification_failed");
    // The same call ends the rush: no waiting for timers or retries of blocked tasks.
    assert_eq!(h.r.state(), RushState::Failed);
    assert_eq!(h.task("A-L1-001").status, TaskStatus::Failed);
    assert_eq!(h.task("A-L2-001").status, TaskStatus::Blocked);
    assert_eq!(h.task("A-L3-001").status, TaskStatus::Blocked);
    assert_eq!(h.r.doc.levels["1"].status, LevelStatus::Failed);
    assert!(h.r.doc.rush.reason.contains("A-L1-001"));
    assert!(!h.r.doc.rush.finished_at.is_empty());
    assert!(fx.merge.is_none(), "nothing completed, nothing to merge");
    assert!(fx.spawn.is_empty());
    assert!(fx.stop.is_empty(), "the end of a rush drains workers");
    assert_eq!(drained(&fx), vec![0, 1]);
    assert!(h.done(1).contains("failed"));
}

// === 5: FR-1 spawn retry ===

#[test]
fn failed_spawns_retry_with_exponential_backoff_then_the_slot_gives_up() {
    let mut h = H::new(vec![task("A-L1-001", 1, &[])], 1, config(|_| {}));
    assert_eq!(h.start().spawn, vec![(0, 1)]);
    for attempt in 1..=3u32 {
        let fx = h.spawn_failed(0, "docker: connection refused");
        assert!(fx.spawn.is_empty(), "no immediate retry");
        assert_eq!(h.worker(0).status, WorkerStatus::Backoff);
        assert_eq!(h.worker(0).spawn_failures, attempt);
        assert!(
            h.reason(0).contains(&format!(
                "spawn attempt {attempt} failed: docker: connection refused"
            )),
            "{}",
            h.reason(0)
        );
        assert_eq!(h.r.doc.rush.resilience.spawn_retries, u64::from(attempt));
        assert!(h.logged("worker_spawn_retry"));
        // base 2 s · 2^attempt: about 4, 8, 16 s.
        let due = h.r.rt_workers[&0].spawn_due.expect("retry scheduled");
        assert_jittered(due - h.now, 2.0 * 2f64.powi(attempt as i32));
        h.advance_to(due - Duration::from_millis(100));
        let (fx, next) = h.tick_next();
        assert!(fx.spawn.is_empty(), "not before the backoff");
        assert_eq!(next, Some(due), "the actor is woken when the retry is due");
        h.advance_to(due);
        let fx = h.tick();
        assert_eq!(fx.spawn, vec![(0, u64::from(attempt) + 1)]);
        assert_eq!(h.worker(0).status, WorkerStatus::Starting);
        assert_eq!(h.r.state(), RushState::Running);
    }
    // The fourth failure (three retries spent) gives the slot up.
    let fx = h.spawn_failed(0, "docker: connection refused");
    assert!(fx.spawn.is_empty());
    assert_eq!(h.worker(0).status, WorkerStatus::GaveUp);
    let reason = h.reason(0);
    assert!(reason.contains("spawn failed 4 times"), "{reason}");
    assert!(reason.contains("docker: connection refused"), "{reason}");
    assert!(reason.contains("zergctl retry feat"), "{reason}");
    assert_eq!(h.r.doc.rush.resilience.spawn_retries, 3);
    // Every slot gave up with work left: the rush fails and says why.
    assert_eq!(h.r.state(), RushState::Failed);
    let why = &h.r.doc.rush.reason;
    assert!(
        why.contains("no worker can run the remaining tasks"),
        "{why}"
    );
    assert!(why.contains("docker: connection refused"), "{why}");
    assert!(h.tick().spawn.is_empty());
}

#[test]
fn a_spawn_that_fails_twice_then_succeeds_runs_work() {
    let mut h = H::new(vec![task("A-L1-001", 1, &[])], 1, config(|_| {}));
    h.start();
    for _ in 0..2 {
        h.spawn_failed(0, "transient");
        let due = h.r.rt_workers[&0].spawn_due.expect("retry scheduled");
        h.advance_to(due);
        assert_eq!(h.tick().spawn.len(), 1);
    }
    assert_eq!(h.generation(0), 3);
    let t = h.join(0).expect("task");
    assert_eq!(t.task_id, "A-L1-001");
    assert_eq!(h.worker(0).status, WorkerStatus::Running);
    assert_eq!(
        h.worker(0).spawn_failures,
        0,
        "reset once the worker registered"
    );
    assert_eq!(h.worker(0).reason, None);
    assert_eq!(h.r.doc.rush.resilience.spawn_retries, 2);
    assert_eq!(h.r.doc.rush.resilience.worker_respawns, 0);
}

#[test]
fn dying_before_registering_or_never_registering_counts_as_a_failed_spawn() {
    let mut h = H::new(vec![task("A-L1-001", 1, &[])], 1, config(|_| {}));
    h.start();
    h.spawned(0);
    let fx = h.exit(0, ExitInfo::Code(1));
    assert!(fx.spawn.is_empty(), "retried with backoff, not at once");
    assert_eq!(h.worker(0).status, WorkerStatus::Backoff);
    assert_eq!(h.worker(0).spawn_failures, 1);
    assert!(
        h.reason(0).contains("before it registered"),
        "{}",
        h.reason(0)
    );
    assert_eq!(h.r.doc.rush.resilience.spawn_retries, 1);
    assert_eq!(h.r.doc.rush.resilience.worker_respawns, 0);
    let due = h.r.rt_workers[&0].spawn_due.expect("retry scheduled");
    h.advance_to(due);
    assert_eq!(h.tick().spawn, vec![(0, 2)]);

    // Generation 2 starts but never registers within spawn_ready_timeout_seconds (60).
    h.spawned(0);
    h.advance(Duration::from_secs(60));
    assert!(h.tick().stop.is_empty(), "not before the timeout");
    h.advance(Duration::from_secs(1));
    let fx = h.tick();
    assert_eq!(stopped(&fx), vec![0], "the silent process is killed");
    assert_eq!(h.worker(0).status, WorkerStatus::Backoff);
    assert_eq!(h.worker(0).spawn_failures, 2);
    assert_eq!(h.r.doc.rush.resilience.spawn_retries, 2);
    // The exit of the killed process is not counted a second time.
    let fx = h.exit(0, ExitInfo::Signal(15));
    assert!(fx.spawn.is_empty());
    assert_eq!(h.worker(0).spawn_failures, 2);
    assert_eq!(h.worker(0).status, WorkerStatus::Backoff);
}

// === 6: FR-5 crash reassignment ===

#[test]
fn crashed_workers_task_is_reassigned_at_once_and_the_slot_respawned() {
    for info in [ExitInfo::Code(137), ExitInfo::Signal(9)] {
        let mut h = H::new(
            vec![task("A-L1-001", 1, &[]), task("A-L2-001", 2, &["A-L1-001"])],
            2,
            config(|_| {}),
        );
        h.start();
        let t = h.join(0).expect("task");
        assert!(h.join(1).is_none(), "worker 1 waits for work");

        let fx = h.exit(0, info);
        let ts = h.task("A-L1-001");
        assert_eq!(
            ts.retry_count, 0,
            "a crash is not a task failure ({info:?})"
        );
        assert_eq!(ts.crashes, 1);
        assert!(
            ts.error
                .as_deref()
                .unwrap_or("")
                .starts_with("worker_crash")
        );
        // Reassigned to the healthy parked worker in the same call.
        assert_eq!(ts.status, TaskStatus::InProgress);
        assert_eq!(ts.worker_id, Some(1));
        let t2 = h.leased(1);
        assert_eq!(t2.task_id, t.task_id);
        assert_eq!(t2.attempt, 1);
        assert_eq!(t2.lease_id, "A-L1-001#2");
        let c = h.r.doc.rush.resilience;
        assert_eq!(c.task_reassignments, 1);
        assert_eq!(c.worker_respawns, 1);
        assert!(h.logged("worker_crash"));
        assert!(h.logged("task_reassign"));
        // The crashed slot is respawned at once.
        assert_eq!(fx.spawn, vec![(0, 2)]);
        assert_eq!(h.worker(0).status, WorkerStatus::Starting);
        assert_eq!(h.worker(0).current_task, None);
        assert_eq!(h.worker(0).respawns, 1);
        assert_eq!(h.worker(0).respawn_times_ms.len(), 1);
        h.spawned(0);
        assert!(h.logged("worker_respawn"));
    }
}

#[test]
fn crashed_task_waits_for_a_worker_when_none_is_healthy() {
    let mut h = H::new(vec![task("A-L1-001", 1, &[])], 1, config(|_| {}));
    h.start();
    h.join(0).expect("task");
    let fx = h.exit(0, ExitInfo::Signal(9));
    assert_eq!(h.task("A-L1-001").status, TaskStatus::Pending);
    assert_eq!(h.task("A-L1-001").lease_id, None);
    assert_eq!(fx.spawn, vec![(0, 2)]);
    let t = h.join(0).expect("the respawned worker gets the task");
    assert_eq!(t.task_id, "A-L1-001");
    assert_eq!(t.attempt, 1);
}

// === 7: FR-6 respawn cap and exit codes ===

#[test]
fn workers_that_crash_together_back_off_for_different_times() {
    // Eight idle workers crash at the same instant, twice (the first respawn is immediate):
    // their second respawns are spread by the jitter rather than due all at once.
    let n = 8;
    let mut h = H::new(vec![task("A-L1-001", 1, &[])], n, config(|_| {}));
    h.start();
    for _ in 0..2 {
        for w in 0..n {
            h.spawned(w);
            h.register(w);
        }
        for w in 0..n {
            h.exit(w, ExitInfo::Signal(9));
        }
    }
    let mut delays = std::collections::BTreeSet::new();
    for w in 0..n {
        assert_eq!(h.worker(w).status, WorkerStatus::Backoff);
        let due = h.r.rt_workers[&w].spawn_due.expect("respawn scheduled");
        assert_jittered(due - h.now, 4.0);
        delays.insert(due - h.now);
    }
    assert!(delays.len() >= n as usize - 1, "{delays:?}");
}

/// One stale-watchdog kill of slot 0: it registers, sends no heartbeat past the threshold, is
/// killed by the next tick, and exits; then its respawn, if one is due, is started.
fn stale_kill(h: &mut H) -> Effects {
    h.spawned(0);
    h.register(0);
    h.advance(h.r.config.workers.heartbeat_stale_threshold + Duration::from_secs(1));
    let fx = h.tick();
    assert!(
        fx.stop.iter().any(|(w, ..)| *w == 0),
        "the watchdog kills the silent worker"
    );
    let fx = h.exit(0, ExitInfo::Signal(9));
    if fx.spawn.is_empty()
        && let Some(due) = h.r.rt_workers[&0].spawn_due
    {
        h.advance_to(due);
        assert_eq!(h.tick().spawn.len(), 1);
    }
    fx
}

#[test]
fn the_watchdogs_kills_count_against_the_respawn_rate_limit_within_its_window() {
    let cfg = || {
        config(|w| {
            w.heartbeat_stale_threshold = Duration::from_secs(5);
            w.max_respawn_attempts = 3;
            w.respawn_window_seconds = Duration::from_secs(100);
        })
    };
    // Kills close together: three respawns, and the fourth kill gives the slot up.
    let mut h = H::new(vec![task("A-L1-001", 1, &[])], 1, cfg());
    h.start();
    for kill in 1..=3u32 {
        stale_kill(&mut h);
        assert_eq!(h.worker(0).respawns, kill, "a stale kill is counted");
        assert_ne!(h.worker(0).status, WorkerStatus::GaveUp);
    }
    stale_kill(&mut h);
    assert_eq!(h.worker(0).status, WorkerStatus::GaveUp);
    let reason = h.reason(0);
    assert!(reason.contains("respawned 3 times within 100s"), "{reason}");
    assert_eq!(h.r.doc.rush.resilience.stale_detections, 4);

    // The same kills spread wider than the window: the old ones age out, and the slot lives.
    let mut h = H::new(vec![task("A-L1-001", 1, &[])], 1, cfg());
    h.start();
    for _ in 0..8 {
        stale_kill(&mut h);
        assert_ne!(h.worker(0).status, WorkerStatus::GaveUp);
        assert!(
            h.worker(0).respawn_times_ms.len() <= 2,
            "{:?}",
            h.worker(0).respawn_times_ms
        );
        h.advance(Duration::from_secs(60));
    }
    assert_eq!(h.worker(0).respawns, 8);
}

#[test]
fn crash_loop_gives_the_slot_up_after_max_respawn_attempts() {
    let mut h = H::new(vec![task("A-L1-001", 1, &[])], 1, config(|_| {}));
    h.start();
    for crash in 1..=5u32 {
        h.spawned(0);
        h.register(0);
        let fx = h.exit(0, ExitInfo::Signal(9));
        assert_eq!(h.worker(0).respawn_times_ms.len(), crash as usize);
        assert_eq!(h.worker(0).respawns, crash);
        assert_eq!(h.r.doc.rush.resilience.worker_respawns, u64::from(crash));
        if crash == 1 {
            assert_eq!(fx.spawn, vec![(0, 2)], "the first respawn is immediate");
        } else {
            assert!(fx.spawn.is_empty(), "later respawns back off");
            assert_eq!(h.worker(0).status, WorkerStatus::Backoff);
            let due = h.r.rt_workers[&0].spawn_due.expect("respawn scheduled");
            assert_jittered(due - h.now, (2.0 * 2f64.powi(crash as i32 - 1)).min(30.0));
            h.advance_to(due);
            assert_eq!(h.tick().spawn.len(), 1);
        }
        h.advance(Duration::from_secs(1));
    }
    h.spawned(0);
    h.register(0);
    let fx = h.exit(0, ExitInfo::Signal(9));
    assert!(fx.spawn.is_empty());
    assert_eq!(h.worker(0).status, WorkerStatus::GaveUp);
    let reason = h.reason(0);
    assert!(reason.contains("respawned 5 times within 600s"), "{reason}");
    assert!(reason.contains("crash loop"), "{reason}");
    assert_eq!(h.r.doc.rush.resilience.worker_respawns, 5);
    assert!(h.logged("worker_gave_up"));
    assert_eq!(
        h.r.state(),
        RushState::Failed,
        "no slot is left to run the task"
    );
    assert!(h.r.doc.rush.reason.contains("crash loop"));
    h.advance(Duration::from_secs(120));
    assert!(h.tick().spawn.is_empty());
}

#[test]
fn a_slot_that_checkpoints_over_and_over_backs_off_and_gives_up() {
    let mut h = H::new(vec![task("A-L1-001", 1, &[])], 1, config(|_| {}));
    h.start();
    for n in 1..=5u32 {
        h.spawned(0);
        let t = h.join(0).expect("task");
        let mut req = h.fail_req(0, &t, "checkpoint");
        req.checkpoint = None;
        h.fail_with(req);
        let fx = h.exit(0, ExitInfo::Code(2));
        assert_eq!(h.worker(0).respawn_times_ms.len(), n as usize);
        if n == 1 {
            assert_eq!(fx.spawn, vec![(0, 2)], "the first respawn is immediate");
        } else {
            assert!(fx.spawn.is_empty(), "later respawns back off");
            assert_eq!(h.worker(0).status, WorkerStatus::Backoff);
            let due = h.r.rt_workers[&0].spawn_due.expect("respawn scheduled");
            h.advance_to(due);
            assert_eq!(h.tick().spawn.len(), 1);
        }
        h.advance(Duration::from_secs(1));
    }
    h.spawned(0);
    let t = h.join(0).expect("task");
    let req = h.fail_req(0, &t, "checkpoint");
    h.fail_with(req);
    let fx = h.exit(0, ExitInfo::Code(2));
    assert!(fx.spawn.is_empty());
    assert_eq!(h.worker(0).status, WorkerStatus::GaveUp);
    let reason = h.reason(0);
    assert!(reason.contains("2 (checkpoint)"), "{reason}");
    assert!(reason.contains("crash loop"), "{reason}");
    // The task never lost an attempt to its checkpoints.
    assert_eq!(h.task("A-L1-001").retry_count, 0);
}

#[test]
fn a_worker_killed_mid_task_is_respawned_at_once_every_time_within_the_cap() {
    let mut h = H::new(vec![task("A-L1-001", 1, &[])], 1, config(|_| {}));
    h.start();
    for crash in 1..=5u32 {
        let t = h.join(0).expect("a task");
        let fx = h.exit(0, ExitInfo::Signal(9));
        // The task's own crash cap (max(3, max_respawn_attempts) = 5) is not reached yet.
        assert_eq!(h.task(&t.task_id).crashes, crash);
        assert_eq!(h.worker(0).respawn_times_ms.len(), crash as usize);
        assert_eq!(
            fx.spawn,
            vec![(0, u64::from(crash) + 1)],
            "crash {crash} mid-task: respawned at once, no backoff"
        );
        assert_eq!(h.worker(0).status, WorkerStatus::Starting);
        h.advance(Duration::from_secs(1));
    }
    // A task that keeps killing its worker is failed by its own crash count, and nothing is
    // respawned for it.
    h.join(0).expect("a task");
    let fx = h.exit(0, ExitInfo::Signal(9));
    assert!(fx.spawn.is_empty());
    assert_eq!(h.task("A-L1-001").status, TaskStatus::Failed);
    assert_ne!(h.worker(0).status, WorkerStatus::Starting);
}

#[test]
fn respawns_older_than_the_window_are_forgotten() {
    let mut h = H::new(
        vec![task("A-L1-001", 1, &[])],
        1,
        config(|w| {
            w.max_respawn_attempts = 2;
            w.respawn_window_seconds = Duration::from_secs(60);
        }),
    );
    h.start();
    h.spawned(0);
    h.register(0);
    assert_eq!(h.exit(0, ExitInfo::Signal(9)).spawn.len(), 1);
    h.advance(Duration::from_secs(1));
    h.spawned(0);
    h.register(0);
    assert!(h.exit(0, ExitInfo::Signal(9)).spawn.is_empty());
    let due = h.r.rt_workers[&0].spawn_due.expect("respawn scheduled");
    h.advance_to(due);
    assert_eq!(h.tick().spawn.len(), 1);
    assert_eq!(h.worker(0).respawn_times_ms.len(), 2);
    // Both earlier crashes are out of the 60 s window by now.
    h.advance(Duration::from_secs(61));
    h.spawned(0);
    h.register(0);
    let fx = h.exit(0, ExitInfo::Signal(9));
    assert_eq!(fx.spawn.len(), 1, "respawned at once, not given up");
    assert_eq!(h.worker(0).status, WorkerStatus::Starting);
    assert_eq!(h.worker(0).respawn_times_ms.len(), 1);
    assert_eq!(h.r.state(), RushState::Running);
}

#[test]
fn exit_three_blocks_the_slot_and_fails_the_rush_with_the_reason() {
    let mut h = H::new(vec![task("A-L1-001", 1, &[])], 1, config(|_| {}));
    h.start();
    let t = h.join(0).expect("task");
    let mut req = h.fail_req(0, &t, "agent_missing");
    req.message = "agent command 'claude' cannot be run (No such file or directory)".into();
    h.fail_with(req);
    assert_eq!(h.task("A-L1-001").status, TaskStatus::Pending);
    assert_eq!(h.task("A-L1-001").retry_count, 0);
    let fx = h.exit(0, ExitInfo::Code(3));
    assert!(fx.spawn.is_empty(), "a blocked worker is not respawned");
    assert_eq!(h.worker(0).status, WorkerStatus::Blocked);
    assert!(h.reason(0).contains("cannot be run"), "{}", h.reason(0));
    assert_eq!(h.worker(0).last_exit.as_deref(), Some("3 (blocked)"));
    assert_eq!(h.r.state(), RushState::Failed);
    assert!(h.r.doc.rush.reason.contains("cannot be run"));
}

#[test]
fn checkpoint_exit_requeues_the_task_and_respawns_at_once_counted_against_the_cap() {
    let mut h = H::new(vec![task("A-L1-001", 1, &[])], 1, config(|_| {}));
    h.start();
    h.join(0).expect("task");
    // Exit 2 while the task is still held (its Fail report was lost).
    let fx = h.exit(0, ExitInfo::Code(2));
    let ts = h.task("A-L1-001");
    assert_eq!(ts.status, TaskStatus::Pending);
    assert_eq!(ts.retry_count, 0);
    assert_eq!(ts.crashes, 0, "a checkpoint is not a crash");
    assert_eq!(fx.spawn, vec![(0, 2)], "the first respawn is at once");
    assert_eq!(
        h.worker(0).respawn_times_ms.len(),
        1,
        "counted against the respawn cap"
    );
    assert_eq!(h.r.doc.rush.resilience.worker_respawns, 1);
    assert_eq!(h.r.doc.rush.resilience.task_reassignments, 0);
    assert_eq!(h.join(0).expect("task").task_id, "A-L1-001");
}

// === 8: FR-2 task watchdog ===

#[test]
fn task_without_output_or_step_change_times_out() {
    let mut h = H::new(
        vec![task("A-L1-001", 1, &[])],
        1,
        config(|w| w.task_stale_timeout_seconds = Duration::from_secs(3)),
    );
    h.start();
    let t = h.join(0).expect("task");
    // One step change at +1 s, then heartbeats that carry nothing new.
    for _ in 1..=4 {
        h.advance(Duration::from_secs(1));
        h.heartbeat(0, Some(&t), "implementing", 0);
        let fx = h.tick();
        assert!(fx.stop.is_empty());
        assert_eq!(h.task("A-L1-001").status, TaskStatus::InProgress);
    }
    h.advance(Duration::from_secs(1));
    h.heartbeat(0, Some(&t), "implementing", 0);
    let fx = h.tick();
    let ts = h.task("A-L1-001");
    assert_eq!(ts.status, TaskStatus::WaitingRetry);
    assert_eq!(ts.retry_count, 1);
    assert!(ts.error.as_deref().unwrap_or("").contains("timeout"));
    assert_eq!(stopped(&fx), vec![0], "the hung worker is stopped");
    assert_eq!(h.r.doc.rush.resilience.stale_detections, 1);
    assert_eq!(h.worker(0).current_task, None);
    assert!(h.logged("task_timeout"));
    // A late report of the timed-out attempt is refused.
    let req = h.complete_req(0, &t);
    assert!(h.try_complete(req).is_err());
    // The stopped worker's exit was expected: it is replaced without counting.
    let fx = h.exit(0, ExitInfo::Signal(15));
    assert_eq!(fx.spawn, vec![(0, 2)]);
    assert!(h.worker(0).respawn_times_ms.is_empty());
    assert_eq!(h.task("A-L1-001").crashes, 0);
}

#[test]
fn agent_output_keeps_a_long_task_alive() {
    let mut h = H::new(
        vec![task("A-L1-001", 1, &[])],
        1,
        config(|w| w.task_stale_timeout_seconds = Duration::from_secs(3)),
    );
    h.start();
    let t = h.join(0).expect("task");
    for _ in 0..10 {
        h.advance(Duration::from_secs(1));
        let out = h.wall_ms();
        h.heartbeat(0, Some(&t), "implementing", out);
        let fx = h.tick();
        assert!(fx.stop.is_empty());
    }
    assert_eq!(h.task("A-L1-001").status, TaskStatus::InProgress);
    assert_eq!(h.task("A-L1-001").retry_count, 0);
    assert_eq!(h.r.doc.rush.resilience.stale_detections, 0);
    // Once the output stops, the timeout applies again.
    for _ in 0..4 {
        h.advance(Duration::from_secs(1));
        h.tick();
    }
    assert_eq!(h.task("A-L1-001").status, TaskStatus::WaitingRetry);
}

// === 9: FR-3 stale workers and the mass-staleness brake ===

#[test]
fn silent_worker_goes_stale_and_its_task_moves_to_a_healthy_worker() {
    let mut h = H::new(
        vec![task("A-L1-001", 1, &[]), task("A-L2-001", 2, &["A-L1-001"])],
        3,
        config(|w| w.task_stale_timeout_seconds = Duration::from_secs(10_000)),
    );
    h.start();
    h.join(0).expect("task");
    assert!(h.join(1).is_none());
    assert!(h.join(2).is_none());
    let t0 = h.now;
    for s in [60, 120] {
        h.advance_to(t0 + Duration::from_secs(s));
        h.heartbeat(1, None, "idle", 0);
        h.heartbeat(2, None, "idle", 0);
        let fx = h.tick();
        assert!(fx.stop.is_empty(), "not stale at {s}s");
        assert_eq!(h.worker(0).status, WorkerStatus::Running);
    }
    h.advance_to(t0 + Duration::from_secs(121));
    let fx = h.tick();
    assert_eq!(h.worker(0).status, WorkerStatus::Stale);
    assert!(h.reason(0).contains("no heartbeat"), "{}", h.reason(0));
    assert_eq!(stopped(&fx), vec![0], "the stale worker is killed");
    assert_eq!(h.r.doc.rush.resilience.stale_detections, 1);
    assert_eq!(h.r.doc.rush.resilience.task_reassignments, 1);
    let ts = h.task("A-L1-001");
    assert_eq!(ts.retry_count, 0);
    assert_eq!(ts.crashes, 1);
    assert_eq!(ts.worker_id, Some(1), "reassigned in the same tick");
    assert_eq!(h.leased(1).task_id, "A-L1-001");
    assert!(h.reply(2).is_none());
    assert!(h.logged("heartbeat_stale"));
    // The killed worker's exit counts as a crash and the slot is replaced.
    let fx = h.exit(0, ExitInfo::Signal(15));
    assert_eq!(fx.spawn, vec![(0, 2)]);
    assert_eq!(h.worker(0).respawn_times_ms.len(), 1);
}

#[test]
fn mass_staleness_rechecks_once_before_failing_workers() {
    let mut h = H::new(
        vec![
            task("A-L1-001", 1, &[]),
            task("A-L1-002", 1, &[]),
            task("A-L2-001", 2, &["A-L1-001", "A-L1-002"]),
        ],
        4,
        config(|_| {}),
    );
    h.start();
    h.join(0).expect("task");
    h.join(1).expect("task");
    assert!(h.join(2).is_none());
    assert!(h.join(3).is_none());
    let t0 = h.now;
    // Workers 2 and 3 keep heartbeating; workers 0 and 1 fall silent.
    let at = |h: &mut H, s: u64| {
        h.advance_to(t0 + Duration::from_secs(s));
        h.heartbeat(2, None, "idle", 0);
        h.heartbeat(3, None, "idle", 0);
    };
    at(&mut h, 60);
    h.tick();
    at(&mut h, 120);
    h.tick();
    h.advance_to(t0 + Duration::from_secs(121));
    // 2 of 4 live workers look stale at once: suspect zergd, fail nobody yet.
    let fx = h.tick();
    assert!(fx.stop.is_empty());
    assert_eq!(h.worker(0).status, WorkerStatus::Running);
    assert_eq!(h.worker(1).status, WorkerStatus::Running);
    assert_eq!(h.r.doc.rush.resilience.stale_detections, 0);
    assert_eq!(h.task("A-L1-001").status, TaskStatus::InProgress);
    assert_eq!(h.task("A-L1-001").worker_id, Some(0));
    assert!(h.logged("heartbeat_brake"));
    assert_eq!(h.r.brake_at, Some(h.now));
    // Still silent one threshold later: now they are failed and their tasks reassigned.
    at(&mut h, 180);
    h.tick();
    at(&mut h, 240);
    h.tick();
    assert_eq!(
        h.worker(0).status,
        WorkerStatus::Running,
        "120 s since the brake is not over"
    );
    h.advance_to(t0 + Duration::from_secs(242));
    let fx = h.tick();
    assert_eq!(h.worker(0).status, WorkerStatus::Stale);
    assert_eq!(h.worker(1).status, WorkerStatus::Stale);
    assert_eq!(stopped(&fx), vec![0, 1]);
    assert_eq!(h.r.doc.rush.resilience.stale_detections, 2);
    assert_eq!(h.r.doc.rush.resilience.task_reassignments, 2);
    let got = BTreeSet::from([h.leased(2).task_id, h.leased(3).task_id]);
    assert_eq!(
        got,
        BTreeSet::from(["A-L1-001".to_string(), "A-L1-002".to_string()])
    );
    for id in ["A-L1-001", "A-L1-002"] {
        assert_eq!(h.task(id).retry_count, 0);
        assert_eq!(h.task(id).crashes, 1);
    }
}

// === 10: rate limits ===

#[test]
fn an_agent_cli_without_a_login_pauses_the_rush_once_and_costs_no_attempt() {
    let mut h = H::new(
        vec![task("A-L1-001", 1, &[]), task("A-L1-002", 1, &[])],
        2,
        config(|_| {}),
    );
    h.start();
    let t0 = h.join(0).expect("task");
    let t1 = h.join(1).expect("task");
    let mut req = h.fail_req(0, &t0, "auth_failed");
    req.message = "the agent CLI is not logged in: run `claude /login`".into();
    h.fail_with(req);
    assert_eq!(h.r.state(), RushState::Paused);
    assert!(h.r.doc.rush.reason.contains("claude /login"));
    assert!(h.r.doc.rush.reason.contains("zergctl retry"));
    // The other worker's run ends the same way: no second pause, no attempt counted.
    h.fail(1, &t1, "auth_failed");
    for id in ["A-L1-001", "A-L1-002"] {
        assert_eq!(h.task(id).status, TaskStatus::Pending, "{id}");
        assert_eq!(h.task(id).retry_count, 0, "{id}");
    }
    let pauses =
        h.r.doc
            .execution_log
            .iter()
            .filter(|e| e.event == "agent_not_logged_in")
            .count();
    assert_eq!(pauses, 1);
    h.lease(0);
    assert!(h.reply(0).is_none(), "no new work while paused");
}

#[test]
fn an_unreachable_api_backs_off_uncounted_and_pauses_once_every_worker_saw_it() {
    let mut h = H::new(
        vec![task("A-L1-001", 1, &[]), task("A-L1-002", 1, &[])],
        2,
        config(|w| {
            w.retry_attempts = 0;
            w.backoff_base_seconds = Duration::from_secs(10);
            w.backoff_max_seconds = Duration::from_secs(1000);
        }),
    );
    h.start();
    let t0 = h.join(0).expect("task");
    let t1 = h.join(1).expect("task");
    h.fail(0, &t0, "api_unreachable");
    let ts = h.task("A-L1-001");
    assert_eq!(ts.status, TaskStatus::WaitingRetry, "retried with backoff");
    assert_eq!(
        ts.retry_count, 0,
        "not counted: with retry_attempts 0 it would fail"
    );
    assert_eq!(ts.unreachable, 1);
    assert_eq!(
        h.r.state(),
        RushState::Running,
        "one worker is not every worker"
    );
    // A success in between means the API is reachable after all.
    let mut fx_t1 = h.complete_req(1, &t1);
    fx_t1.cost_usd = 0.0;
    h.try_complete(fx_t1).expect("complete");
    assert!(h.r.unreachable_from.is_empty());
    h.advance(Duration::from_secs(30));
    h.tick();
    h.lease(0);
    let t0 = h.leased(0);
    h.fail(0, &t0, "api_unreachable");
    assert_eq!(h.task("A-L1-001").unreachable, 2, "the backoff grows");
    assert_eq!(h.r.state(), RushState::Running);
    let t0b = {
        h.advance(Duration::from_secs(100));
        h.tick();
        h.lease(1);
        h.leased(1)
    };
    h.fail(1, &t0b, "api_unreachable");
    assert_eq!(h.r.state(), RushState::Paused, "both workers saw it");
    assert!(h.r.doc.rush.reason.contains("cannot reach its API"));
    assert_eq!(h.task("A-L1-001").retry_count, 0);
}

#[test]
fn cost_and_tokens_are_summed_per_task_and_rush_across_attempts() {
    use crate::calls::{AttemptUsage, ModelSpend, Tokens};
    let mut h = H::new(
        vec![task("A-L1-001", 1, &[]), task("A-L1-002", 1, &[])],
        1,
        config(|w| {
            w.backoff_base_seconds = Duration::from_millis(10);
            w.backoff_max_seconds = Duration::from_millis(10);
        }),
    );
    h.start();
    let usage = |n: u64| {
        let tokens = Tokens {
            input_tokens: n,
            output_tokens: n / 10,
            cache_read_tokens: 2 * n,
            cache_creation_tokens: 1,
        };
        AttemptUsage {
            tokens,
            models: [(
                "m".to_string(),
                ModelSpend {
                    tokens,
                    cost_usd: 0.5,
                },
            )]
            .into(),
        }
    };
    let t = h.join(0).expect("task");
    let mut req = h.fail_req(0, &t, "agent_failed");
    req.cost_usd = 0.5;
    req.usage = usage(100);
    h.fail_with(req);
    h.advance(Duration::from_secs(1));
    h.tick();
    h.lease(0);
    let t = h.leased(0);
    let mut req = h.complete_req(0, &t);
    req.cost_usd = 0.5;
    req.usage = usage(1000);
    h.try_complete(req).expect("complete");
    let ts = h.task(&t.task_id);
    assert_eq!(ts.cost_usd, 1.0);
    assert_eq!(ts.tokens.input_tokens, 1100);
    assert_eq!(ts.tokens.cache_read_tokens, 2200);
    assert_eq!(ts.models["m"].cost_usd, 1.0);
    let st = crate::wire::status::rush_status(&h.r.view());
    assert_eq!(st.cost_usd, 1.0);
    let tok = st.tokens.expect("tokens");
    assert_eq!((tok.input_tokens, tok.output_tokens), (1100, 110));
    assert_eq!(
        st.models["m"]
            .tokens
            .as_ref()
            .unwrap()
            .cache_creation_tokens,
        2
    );
    // What an older state file lacks, it does not write either.
    let other = serde_json::to_value(h.task("A-L1-002")).unwrap();
    assert!(
        other.get("tokens").is_none() && other.get("models").is_none(),
        "{other}"
    );
}

#[test]
fn the_budget_stops_new_leases_and_pauses_the_rush() {
    let mut h = H::new(
        vec![
            task("A-L1-001", 1, &[]),
            task("A-L1-002", 1, &[]),
            task("A-L1-003", 1, &[]),
        ],
        2,
        config(|_| {}),
    );
    h.r.doc.rush.max_usd = Some(1.0);
    h.start();
    let t0 = h.join(0).expect("task");
    let t1 = h.join(1).expect("task");
    let mut req = h.complete_req(0, &t0);
    req.cost_usd = 1.0;
    h.try_complete(req).expect("complete");
    assert_eq!(h.r.state(), RushState::Paused);
    assert!(
        h.r.doc.rush.reason.starts_with("budget:"),
        "{}",
        h.r.doc.rush.reason
    );
    h.lease(0);
    assert!(h.reply(0).is_none(), "no new lease at the budget");
    // The running task finishes and its cost counts.
    let mut req = h.complete_req(1, &t1);
    req.cost_usd = 0.25;
    h.try_complete(req).expect("a running task finishes");
    assert_eq!(h.task(&t1.task_id).status, TaskStatus::Complete);
}

#[test]
fn a_new_detail_from_the_agent_counts_as_progress() {
    let mut h = H::new(
        vec![task("A-L1-001", 1, &[])],
        1,
        config(|w| {
            w.heartbeat_stale_threshold = Duration::from_secs(10_000);
            w.task_stale_timeout_seconds = Duration::from_secs(10);
        }),
    );
    h.start();
    let t = h.join(0).expect("task");
    h.heartbeat(0, Some(&t), "implementing", 1);
    for i in 1..=5 {
        h.advance(Duration::from_secs(6));
        let me = h.wref(0);
        let req = Beat {
            caller: me,
            lease: Some(lease_of(&t)),
            step: crate::domain::Step::Implementing,
            progress_pct: 10,
            last_output_ms: 1,
            detail: format!("API retry {i}/10: overloaded"),
        };
        h.r.on_heartbeat(req, h.now, h.wall).expect("beat");
        h.tick();
        assert_eq!(
            h.task(&t.task_id).status,
            TaskStatus::InProgress,
            "retry {i}"
        );
    }
    assert_eq!(
        h.worker(0).detail.as_deref(),
        Some("API retry 5/10: overloaded")
    );
    // Without a new detail or new output there is no progress: the watchdog fires.
    h.advance(Duration::from_secs(6));
    h.heartbeat(0, Some(&t), "implementing", 1);
    h.advance(Duration::from_secs(6));
    h.tick();
    assert_ne!(h.task(&t.task_id).status, TaskStatus::InProgress);
}

#[test]
fn a_reported_reset_far_in_the_future_holds_new_work_for_six_hours_at_most() {
    let mut h = H::new(vec![task("A-L1-001", 1, &[])], 1, config(|_| {}));
    h.start();
    let t = h.join(0).expect("task");
    let mut req = h.fail_req(0, &t, "rate_limited");
    req.retry_at_ms = i64::MAX;
    h.fail_with(req);
    let held = h.r.doc.rush.rate_limited_until_ms - h.wall_ms();
    // Six hours, and the margin after a stated reset.
    assert!(
        held > 0 && held <= 6 * 3600 * 1000 + 30_000,
        "held for {held} ms"
    );
}

#[test]
fn rate_limit_pauses_new_work_until_the_reset_without_burning_retries() {
    let mut h = H::new(
        vec![task("A-L1-001", 1, &[]), task("A-L1-002", 1, &[])],
        2,
        config(|w| {
            w.heartbeat_stale_threshold = Duration::from_secs(10_000);
            w.task_stale_timeout_seconds = Duration::from_secs(10_000);
            w.usage_limit_margin_seconds = Duration::from_secs(5);
        }),
    );
    h.start();
    let t = h.join(0).expect("task");
    h.join(1).expect("task");
    let reset = h.wall_ms() + 60_000;
    // Held until the reset plus the margin.
    let until = reset + 5_000;
    let mut req = h.fail_req(0, &t, "rate_limited");
    req.retry_at_ms = reset;
    req.limit_type = "five_hour".into();
    h.fail_with(req);
    let ts = h.task("A-L1-001");
    assert_eq!(ts.status, TaskStatus::Pending);
    assert_eq!(ts.retry_count, 0);
    assert_eq!(ts.lease_id, None);
    assert_eq!(h.r.doc.rush.rate_limited_until_ms, until);
    let st = crate::wire::status::rush_status(&h.r.view());
    assert!(!st.rate_limited_until.is_empty());
    assert_eq!(st.rate_limit_type, "five_hour");
    assert!(
        h.r.events
            .iter()
            .any(|e| e.kind == "rate_limited" && e.message.contains("UTC (five_hour)")),
        "the event names the limit"
    );
    assert_eq!(h.r.state(), RushState::Running);

    h.lease(0);
    assert!(h.reply(0).is_none(), "no new work while rate-limited");
    h.advance(Duration::from_secs(30));
    h.tick();
    assert!(h.reply(0).is_none(), "no new work while rate-limited");
    assert_eq!(h.task("A-L1-001").status, TaskStatus::Pending);
    h.advance(Duration::from_secs(31));
    h.tick();
    assert!(
        h.reply(0).is_none(),
        "the reset has passed, the margin has not"
    );
    h.advance(Duration::from_secs(5));
    h.tick();
    assert_eq!(h.r.doc.rush.rate_limited_until_ms, 0);
    assert_eq!(
        h.r.doc.rush.rate_limit_type, "",
        "the type goes with the hold"
    );
    assert!(h.logged("rate_limit_over"));
    let t2 = h.leased(0);
    assert_eq!(t2.task_id, "A-L1-001");
    assert_eq!(t2.attempt, 1, "the rate-limited attempt was not counted");
    assert_eq!(h.task("A-L1-001").retry_count, 0);
}

// === 11: FR-4 reconciliation ===

#[test]
fn reconcile_requeues_tasks_whose_worker_is_gone() {
    let mut h = H::new(
        vec![task("A-L1-001", 1, &[]), task("A-L1-002", 1, &[])],
        2,
        config(|_| {}),
    );
    h.start();
    h.join(0).expect("task");
    h.join(1).expect("task");
    // The process is gone, but its exit was never reported.
    h.r.rt_workers.get_mut(&0).expect("slot 0").spawned = None;
    let n = h.r.reconcile(false, h.wall);
    assert!(n >= 1);
    let ts = h.task("A-L1-001");
    assert_eq!(ts.status, TaskStatus::Pending);
    assert_eq!(ts.lease_id, None);
    assert_eq!(ts.retry_count, 0);
    assert_eq!(ts.crashes, 1);
    assert!(
        ts.error
            .as_deref()
            .unwrap_or("")
            .starts_with("worker_crash")
    );
    assert_eq!(h.worker(0).current_task, None);
    assert_eq!(
        h.task("A-L1-002").status,
        TaskStatus::InProgress,
        "a live worker's task stays"
    );
    assert_eq!(h.r.doc.rush.resilience.reconcile_fixes, u64::from(n));
    assert!(h.logged("state_reconcile_fix"));
    assert_eq!(h.r.reconcile(false, h.wall), 0, "nothing left to fix");
}

#[test]
fn reconcile_recalculates_level_status_and_fills_in_missing_levels() {
    let mut h = H::new(
        vec![task("A-L1-001", 1, &[]), task("A-L2-001", 2, &["A-L1-001"])],
        1,
        config(|_| {}),
    );
    h.start();
    h.r.doc.levels.get_mut("1").expect("level 1").status = LevelStatus::Complete;
    h.r.doc.levels.get_mut("2").expect("level 2").status = LevelStatus::Failed;
    h.r.doc.tasks.get_mut("A-L2-001").expect("task").level = None;
    let n = h.r.reconcile(true, h.wall);
    assert_eq!(n, 3);
    assert_eq!(
        h.r.doc.levels["1"].status,
        LevelStatus::Running,
        "the current level"
    );
    assert_eq!(h.r.doc.levels["2"].status, LevelStatus::Pending);
    assert_eq!(h.task("A-L2-001").level, Some(2), "parsed from *-L2-*");
    assert_eq!(h.r.doc.rush.resilience.reconcile_fixes, 3);
}

#[test]
fn the_light_reconciliation_runs_periodically_from_tick() {
    let mut h = H::new(vec![task("A-L1-001", 1, &[])], 1, config(|_| {}));
    h.start();
    h.r.doc.tasks.get_mut("A-L1-001").expect("task").level = None;
    h.advance(Duration::from_secs(1));
    h.tick();
    assert_eq!(h.task("A-L1-001").level, None, "not due yet");
    h.advance(Duration::from_secs(70));
    h.tick();
    assert_eq!(h.task("A-L1-001").level, Some(1));
    assert_eq!(h.r.doc.rush.resilience.reconcile_fixes, 1);
    assert!(h.r.next_reconcile > h.now);
}

// === 12: stop and retry ===

#[test]
fn stop_requeues_running_tasks_and_stops_every_live_worker() {
    let mut h = H::new(
        vec![task("A-L1-001", 1, &[]), task("A-L1-002", 1, &[])],
        3,
        config(|_| {}),
    );
    h.start();
    let a = h.join(0).expect("task");
    h.join(1).expect("task");
    assert!(h.join(2).is_none());
    let (fx, n) = h.stop(false);
    assert_eq!(n, 3);
    assert_eq!(h.r.state(), RushState::Stopped);
    assert_eq!(h.r.doc.rush.reason, "stopped by user");
    for id in ["A-L1-001", "A-L1-002"] {
        assert_eq!(h.task(id).status, TaskStatus::Pending);
        assert_eq!(h.task(id).lease_id, None);
    }
    assert_eq!(stopped(&fx), vec![0, 1, 2]);
    assert!(
        fx.stop
            .iter()
            .all(|(_, _, g)| *g == Duration::from_secs(10))
    );
    assert!(h.done(2).contains("stopped"));
    assert_eq!(h.worker(0).status, WorkerStatus::Stopping);
    // Late reports of the stopped work are refused; exits are not respawned.
    let req = h.complete_req(0, &a);
    assert!(h.try_complete(req).is_err());
    let fx = h.exit(0, ExitInfo::Signal(15));
    assert!(fx.spawn.is_empty());
    assert_eq!(h.worker(0).status, WorkerStatus::Exited);
    assert!(h.tick().spawn.is_empty());

    let mut h = H::new(vec![task("A-L1-001", 1, &[])], 1, config(|_| {}));
    h.start();
    h.join(0).expect("task");
    let (fx, _) = h.stop(true);
    assert!(
        fx.stop.iter().all(|(_, _, g)| g.is_zero()),
        "force: no grace"
    );
    assert_eq!(h.r.doc.rush.reason, "stopped by user (force)");
}

#[test]
fn retry_after_failure_requeues_failed_and_blocked_tasks_and_restarts() {
    let mut h = H::new(
        vec![task("A-L1-001", 1, &[]), task("A-L2-001", 2, &["A-L1-001"])],
        1,
        config(|w| w.retry_attempts = 0),
    );
    h.start();
    let t = h.join(0).expect("task");
    h.fail(0, &t, "verification_failed");
    assert_eq!(h.r.state(), RushState::Failed);
    assert!(h.exit(0, ExitInfo::Signal(15)).spawn.is_empty());

    let (fx, ids) = h.retry();
    assert_eq!(ids, vec!["A-L1-001".to_string(), "A-L2-001".to_string()]);
    assert_eq!(h.r.state(), RushState::Running);
    assert_eq!(h.r.doc.rush.reason, "");
    assert_eq!(h.r.doc.error, None);
    for id in ["A-L1-001", "A-L2-001"] {
        assert_eq!(h.task(id).status, TaskStatus::Pending);
        assert!(h.task(id).blocked_by.is_empty());
        assert_eq!(h.task(id).error, None);
    }
    assert_eq!(h.task("A-L1-001").retry_count, 1, "kept without --reset");
    assert_eq!(h.r.doc.current_level, 1);
    assert_eq!(h.r.doc.levels["1"].status, LevelStatus::Running);
    assert_eq!(h.r.doc.levels["2"].status, LevelStatus::Pending);
    assert_eq!(fx.spawn, vec![(0, 2)]);
    let t = h.join(0).expect("task");
    assert_eq!(t.task_id, "A-L1-001");
    assert_eq!(t.attempt, 2);
}

#[test]
fn retry_clears_finished_at() {
    let mut h = H::new(
        vec![task("A-L1-001", 1, &[])],
        1,
        config(|w| w.retry_attempts = 0),
    );
    h.start();
    let t = h.join(0).expect("task");
    h.fail(0, &t, "verification_failed");
    assert!(!h.r.doc.rush.finished_at.is_empty());
    h.retry();
    assert_eq!(h.r.state(), RushState::Running);
    assert_eq!(
        crate::wire::status::rush_status(&h.r.view()).finished_at,
        ""
    );
}

#[test]
fn resume_right_after_stop_respawns_workers_when_their_exits_arrive() {
    let mut h = H::new(
        vec![task("A-L1-001", 1, &[]), task("A-L1-002", 1, &[])],
        2,
        config(|_| {}),
    );
    h.start();
    h.join(0).expect("task");
    h.join(1).expect("task");
    h.stop(false);
    // `zergctl rush feat` again within the stop grace: the old processes are still exiting.
    h.retry();
    assert_eq!(h.r.state(), RushState::Running);
    let mut spawned: BTreeSet<u32> = BTreeSet::new();
    for w in [0, 1] {
        spawned.extend(
            h.exit(w, ExitInfo::Signal(15))
                .spawn
                .iter()
                .map(|(w, _)| *w),
        );
    }
    h.advance(Duration::from_secs(5));
    spawned.extend(h.tick().spawn.iter().map(|(w, _)| *w));
    assert_eq!(
        spawned,
        BTreeSet::from([0, 1]),
        "the resumed rush must get its workers back (statuses: {:?}, {:?})",
        h.worker(0).status,
        h.worker(1).status
    );
}

#[test]
fn exit_zero_with_work_left_does_not_stall_the_rush() {
    let mut h = H::new(vec![task("A-L1-001", 1, &[])], 1, config(|_| {}));
    h.start();
    h.join(0).expect("task");
    let mut respawned = !h.exit(0, ExitInfo::Code(0)).spawn.is_empty();
    assert_eq!(h.task("A-L1-001").status, TaskStatus::Pending);
    for _ in 0..60 {
        h.advance(Duration::from_secs(1));
        respawned |= !h.tick().spawn.is_empty();
    }
    assert!(
        respawned || h.r.is_terminal(),
        "rush {} with a pending task and no worker (slot 0: {})",
        h.r.state(),
        h.worker(0).status
    );
}

// === 13: merge conflicts ===

fn conflicted() -> H {
    let mut h = H::new(
        vec![
            task("A-L1-001", 1, &[]),
            task("A-L1-002", 1, &[]),
            task("A-L2-001", 2, &["A-L1-001", "A-L1-002"]),
        ],
        2,
        config(|_| {}),
    );
    h.start();
    let a = h.join(0).expect("task");
    let b = h.join(1).expect("task");
    h.complete(0, &a);
    let job = h.complete(1, &b).merge.expect("level 1 merge");
    assert_eq!(job.level, 1);
    h.merge_result(
        1,
        MergeResult::Conflict {
            worker: 1,
            files: vec!["src/a-l1-002.rs".into()],
            marked: None,
        },
    );
    h.lease(0);
    h
}

#[test]
fn merge_conflict_pauses_and_names_files_and_tasks() {
    let mut h = conflicted();
    assert_eq!(h.r.state(), RushState::Paused);
    assert!(h.r.doc.paused);
    let reason = h.r.doc.rush.reason.clone();
    assert!(reason.contains("src/a-l1-002.rs"), "{reason}");
    assert!(reason.contains("A-L1-002"), "{reason}");
    assert!(!reason.contains("A-L1-001"), "{reason}");
    assert!(reason.contains("zergctl retry feat"), "{reason}");
    let ls = &h.r.doc.levels["1"];
    assert_eq!(ls.merge_status, MergeStatus::Conflict);
    assert_eq!(ls.conflicts, vec!["src/a-l1-002.rs".to_string()]);
    assert_eq!(h.r.doc.current_level, 1);
    assert!(h.reply(0).is_none(), "no work is handed out while paused");
    assert!(h.tick().merge.is_none());
    assert_eq!(h.task("A-L2-001").status, TaskStatus::Pending);
}

#[test]
fn retry_after_merge_conflict_reruns_the_merge() {
    let mut h = conflicted();
    let (fx, ids) = h.retry();
    assert!(ids.is_empty(), "no task needed requeueing");
    assert_eq!(h.r.state(), RushState::Running);
    assert_eq!(h.r.doc.current_level, 1, "level 1 is not merged yet");
    let job = fx.merge.expect("the conflicted level is merged again");
    assert_eq!(job.level, 1);
    assert!(
        h.reply(0).is_none(),
        "level 2 must wait for the level 1 merge"
    );
    assert_eq!(h.task("A-L2-001").status, TaskStatus::Pending);
}

// === 14: checkpoints ===

#[test]
fn checkpoint_requeues_the_task_to_resume_from_its_wip_commit() {
    let mut h = H::new(
        vec![task("A-L1-001", 1, &[]), task("A-L2-001", 2, &["A-L1-001"])],
        2,
        config(|_| {}),
    );
    h.start();
    let t = h.join(0).expect("task");
    assert!(h.join(1).is_none());
    let mut req = h.fail_req(0, &t, "checkpoint");
    req.checkpoint = Some("wip".into());
    h.fail_with(req);
    let ts = h.task("A-L1-001");
    assert_eq!(ts.resume_from.as_deref(), Some("wip"));
    assert_eq!(ts.retry_count, 0);
    // The parked worker picks it up at once, resuming from the checkpoint.
    let t2 = h.leased(1);
    assert_eq!(t2.task_id, "A-L1-001");
    assert_eq!(t2.resume_from.as_deref(), Some("wip"));
    assert_eq!(t2.attempt, 1);
    // The checkpointing worker exits 2 and is replaced at once.
    let fx = h.exit(0, ExitInfo::Code(2));
    assert_eq!(fx.spawn, vec![(0, 2)]);
    h.complete(1, &t2);
    assert_eq!(h.task("A-L1-001").resume_from, None);
    assert_eq!(h.task("A-L1-001").status, TaskStatus::Complete);
}

#[test]
fn an_exit_reported_before_its_spawn_counts_once() {
    let mut h = H::new(
        vec![serde_json::json!({"id": "T-L1-001", "title": "t", "level": 1})],
        1,
        Config::default(),
    );
    let mut fx = Effects::default();
    h.r.start(h.now, h.wall, &mut fx);
    let (w, generation) = fx.spawn[0];
    // The process died before the launcher returned: the exit arrives first.
    let mut fx = Effects::default();
    h.r.on_exit(w, generation, ExitInfo::Code(1), h.now, h.wall, &mut fx);
    assert_eq!(h.r.doc.workers["0"].spawn_failures, 1);
    let mut fx = Effects::default();
    h.r.on_spawned(
        w,
        generation,
        Ok(Spawned {
            pid: Some(4242),
            start_time: None,
            container_id: None,
        }),
        h.now,
        h.wall,
        &mut fx,
    );
    assert!(
        h.r.rt_workers[&w].spawned.is_none(),
        "a dead process must not be tracked as live"
    );
    assert_eq!(h.r.doc.workers["0"].status, WorkerStatus::Backoff);
    assert_eq!(h.r.doc.workers["0"].spawn_failures, 1);
}

// === Re-adoption after a zergd restart ===

impl H {
    /// zergd restarts: the rush is rebuilt from its saved state (no runtime data), and the
    /// launcher reports `observed`.
    fn restart(&mut self, observed: &super::rush::Observed) -> (Effects, super::rush::Readoption) {
        let doc = self.r.doc.clone();
        self.r = Rush::new(
            doc,
            self.r.graph.clone(),
            self.r.config.clone(),
            self.r.paths.clone(),
            self.r.spec_context.clone(),
            self.now,
        );
        self.r.symbols = Some(Arc::new(SymbolIndex::default()));
        self.leases.clear();
        let mut out = None;
        let grace = Duration::from_secs(10);
        let fx = self.run(|r, now, wall, fx| out = Some(r.readopt(observed, grace, now, wall, fx)));
        (fx, out.expect("readopt ran"))
    }

    /// One worker running the first of two level-1 tasks.
    fn one_running(mode: Mode) -> (H, Assignment) {
        let mut h = H::new(
            vec![task("A-L1-001", 1, &[]), task("A-L1-002", 1, &[])],
            1,
            config(|_| {}),
        );
        h.r.doc.rush.mode = mode;
        h.start();
        h.spawned(0);
        if mode == Mode::Container {
            h.r.doc.workers.get_mut("0").unwrap().container_id = Some("c0".into());
        }
        h.register(0);
        h.lease(0);
        let t = h.leased(0);
        (h, t)
    }
}

fn alive(w: u32, yes: bool) -> super::rush::Observed {
    super::rush::Observed {
        discovered: vec![],
        alive: BTreeMap::from([(w, yes)]),
    }
}

#[test]
fn readoption_keeps_a_live_worker_and_its_lease() {
    let (mut h, t) = H::one_running(Mode::Subprocess);
    h.advance(Duration::from_secs(5));
    let (fx, out) = h.restart(&alive(0, true));
    assert_eq!(out.watch.len(), 1, "{out:?}");
    assert_eq!(out.watch[0].0, 0);
    assert!(out.orphans.is_empty());
    assert!(fx.spawn.is_empty(), "nothing is respawned");
    assert_eq!(h.task(&t.task_id).status, TaskStatus::InProgress);
    assert_eq!(
        h.task(&t.task_id).lease_id.as_deref(),
        Some(t.lease_id.as_str())
    );
    assert!(h.logged("rush_resumed"));
    // It must reconnect within the grace period; its old lease still counts when it does.
    h.advance(Duration::from_secs(2));
    let req = Register {
        caller: h.wref(0),
        pid: 1000,
        held: Some(lease_of(&t)),
    };
    h.r.on_register(req, h.now, h.wall).unwrap();
    assert_eq!(h.worker(0).status, WorkerStatus::Running);
    assert!(h.logged("worker_ready"));
}

#[test]
fn readoption_treats_a_dead_worker_as_crashed_and_requeues_its_task() {
    let (mut h, t) = H::one_running(Mode::Subprocess);
    let (fx, out) = h.restart(&alive(0, false));
    assert!(out.watch.is_empty(), "{out:?}");
    assert_eq!(h.task(&t.task_id).status, TaskStatus::Pending, "requeued");
    assert_eq!(h.task(&t.task_id).crashes, 1);
    assert_eq!(
        h.task(&t.task_id).retry_count,
        0,
        "a crash is not an attempt"
    );
    let _ = fx;
    h.advance(Duration::from_secs(60));
    assert_eq!(h.tick().spawn, vec![(0, 2)], "the slot is respawned");
}

#[test]
fn readoption_of_a_reused_pid_is_a_dead_worker() {
    // The launcher compares the recorded start time; a pid now naming another process is
    // reported as not alive, and nothing of it is watched or signalled.
    let (mut h, t) = H::one_running(Mode::Subprocess);
    // The recorded pid now names a live process (this test), started at another time.
    let me = std::process::id() as i32;
    let real_start = crate::launcher::subprocess::proc_start_time(me).unwrap();
    let ws = h.r.doc.workers.get_mut("0").unwrap();
    ws.pid = Some(me);
    ws.pid_start_time = Some(real_start + 1);
    // What the shell asks the launcher, for each recorded handle.
    let mut observed = alive(0, true);
    for (w, _, sp) in h.r.recorded_workers(&[]) {
        observed
            .alive
            .insert(w, crate::launcher::subprocess::same_process(&sp));
    }
    assert!(!observed.alive[&0], "a reused pid is not our worker");
    let (fx, out) = h.restart(&observed);
    assert!(out.watch.is_empty());
    assert!(
        fx.stop.is_empty(),
        "a process that is not ours is never signalled"
    );
    assert_eq!(h.task(&t.task_id).status, TaskStatus::Pending);
}

#[test]
fn readoption_watches_a_gone_container_until_the_engine_reports_it() {
    let (mut h, t) = H::one_running(Mode::Container);
    let (fx, out) = h.restart(&alive(0, false));
    // The engine may still hold the exit code: the launcher reports it (or that it vanished).
    assert_eq!(out.watch.len(), 1, "{out:?}");
    assert_eq!(out.watch[0].2.container_id.as_deref(), Some("c0"));
    assert!(fx.spawn.is_empty());
    assert_eq!(h.task(&t.task_id).status, TaskStatus::InProgress);
    h.exit(0, ExitInfo::Vanished);
    assert_eq!(h.task(&t.task_id).status, TaskStatus::Pending);
    h.advance(Duration::from_secs(60));
    assert_eq!(h.tick().spawn, vec![(0, 2)]);
}

#[test]
fn readoption_removes_containers_nobody_knows() {
    let (mut h, _) = H::one_running(Mode::Container);
    let stray = |g: u64, id: &str| crate::launcher::Discovered {
        worker_id: 0,
        generation: g,
        spawned: Spawned {
            pid: None,
            start_time: None,
            container_id: Some(id.into()),
        },
        running: true,
    };
    let mut observed = alive(0, true);
    observed.discovered = vec![stray(1, "c0"), stray(0, "old"), stray(7, "future")];
    let (_, out) = h.restart(&observed);
    let orphans: Vec<_> = out
        .orphans
        .iter()
        .filter_map(|s| s.container_id.clone())
        .collect();
    assert_eq!(orphans, vec!["old".to_string(), "future".to_string()]);
    assert_eq!(out.watch.len(), 1);
}

// === The symbol map behind each prompt ===

/// A task that modifies one file and reads another.
fn task_on(id: &str, level: u32, deps: &[&str], modify: &str, read: &str) -> Value {
    let mut t = task(id, level, deps);
    t["files"] = json!({"create": [], "modify": [modify], "read": [read]});
    t
}

/// A map of `src/ledger.rs` (and `src/entry.rs` when `with_entry`) as of `commit`.
fn ledger_map(commit: &str, with_entry: bool) -> SymbolIndex {
    let mut ix = SymbolIndex::new(commit);
    let ledger = "mod entry;\nuse self::entry::Entry;\n\npub struct Ledger;\n\nimpl Ledger {\n    pub fn post(&mut self, e: Entry) -> bool {\n        true\n    }\n}\n";
    let blob = "1111111111111111111111111111111111111111";
    ix.insert(
        "src/ledger.rs",
        blob,
        zerg_symbols::extract(Grammar::Rust, ledger.as_bytes()).unwrap(),
    );
    if with_entry {
        let entry = "pub struct Entry {\n    pub cents: i64,\n}\n\npub fn reverse(e: &Entry) -> Entry {\n    Entry { cents: -e.cents }\n}\n";
        ix.insert(
            "src/entry.rs",
            blob,
            zerg_symbols::extract(Grammar::Rust, entry.as_bytes()).unwrap(),
        );
    }
    ix
}

#[test]
fn leases_wait_for_the_symbol_map_and_carry_each_tasks_section() {
    let mut h = H::new(
        vec![
            task_on("S-L1-001", 1, &[], "src/ledger.rs", "README.md"),
            task_on("S-L2-001", 2, &["S-L1-001"], "src/main.rs", "src/entry.rs"),
        ],
        1,
        config(|_| {}),
    );
    h.r.symbols = None;
    let fx = h.start();
    let job = fx
        .index
        .expect("the first symbol map is asked for at start");
    assert_eq!(job.commit, "base");
    assert_eq!(job.repo, PathBuf::from("/nonexistent/repo"));
    assert!(h.r.indexing);
    assert!(h.join(0).is_none(), "no lease before the map is there");
    let fx = h.tick();
    assert!(fx.index.is_none(), "asked for once");
    let built = (ledger_map("base", false), BuildStats::default());
    h.run(|r, now, wall, fx| r.on_indexed(Ok(built), now, wall, fx));
    assert!(h.logged("symbols_indexed"));
    let t = h.leased(0);
    assert!(
        t.relevant_symbols.starts_with("## Relevant Symbols\n"),
        "{}",
        t.relevant_symbols
    );
    assert!(
        t.relevant_symbols.contains("### src/ledger.rs (modified)"),
        "{}",
        t.relevant_symbols
    );
    assert!(
        t.relevant_symbols
            .contains("  - L7 pub fn post(&mut self, e: Entry) -> bool"),
        "{}",
        t.relevant_symbols
    );
    // The level merge moves the map onto the merged head.
    let fx = h.complete(0, &t);
    let job = fx.merge.expect("level 1 merge");
    let (previous, settings) = job.symbols.expect("the merge carries the map");
    assert!(Arc::ptr_eq(&previous, h.r.symbols.as_ref().unwrap()));
    assert_eq!(settings.max_bytes_per_task, 4096);
    h.lease(0);
    let merged = MergeResult::Merged("sha-L1".into());
    let update = Ok((ledger_map("sha-L1", true), BuildStats::default()));
    h.run(|r, now, wall, fx| {
        r.on_reindexed(1, &merged, update, wall);
        r.on_merged(1, merged.clone(), now, wall, fx)
    });
    assert!(h.logged("symbols_updated"));
    let t = h.leased(0);
    assert_eq!(t.task_id, "S-L2-001");
    // What level 1 wrote is in level 2's prompt.
    assert!(
        t.relevant_symbols
            .contains("- L5 pub fn reverse(e: &Entry) -> Entry"),
        "{}",
        t.relevant_symbols
    );
}

#[test]
fn a_map_that_cannot_be_built_or_updated_does_not_hold_the_rush() {
    let mut h = H::new(
        vec![
            task_on("S-L1-001", 1, &[], "src/ledger.rs", "src/entry.rs"),
            task_on(
                "S-L2-001",
                2,
                &["S-L1-001"],
                "src/ledger.rs",
                "src/entry.rs",
            ),
        ],
        1,
        config(|_| {}),
    );
    h.r.symbols = None;
    h.start();
    assert!(h.join(0).is_none());
    h.run(|r, now, wall, fx| r.on_indexed(Err("git exploded".into()), now, wall, fx));
    assert!(h.logged("symbols_failed"));
    let t = h.leased(0);
    assert_eq!(t.relevant_symbols, "");
    h.complete(0, &t);
    // An update that comes with a refused merge is not taken.
    let conflict = MergeResult::Conflict {
        worker: 0,
        files: vec!["src/ledger.rs".into()],
        marked: None,
    };
    let update = Ok((ledger_map("sha-L1", true), BuildStats::default()));
    h.run(|r, _, wall, _| r.on_reindexed(1, &conflict, update, wall));
    assert_eq!(h.r.symbols.as_ref().unwrap().commit(), "");
}

#[test]
fn with_symbols_off_nothing_is_indexed_and_prompts_have_no_section() {
    let mut c = config(|_| {});
    c.symbols.enabled = false;
    let mut h = H::new(
        vec![task_on("S-L1-001", 1, &[], "src/ledger.rs", "src/entry.rs")],
        1,
        c,
    );
    h.r.symbols = None;
    let fx = h.start();
    assert!(fx.index.is_none());
    let t = h.join(0).expect("leased at once");
    assert_eq!(t.relevant_symbols, "");
    let fx = h.complete(0, &t);
    assert!(fx.merge.expect("merge").symbols.is_none());
}

#[test]
fn escalations_name_a_task_of_the_rush_and_cannot_flood_it() {
    let mut h = H::new(vec![task("A-L1-001", 1, &[])], 1, config(|_| {}));
    h.start();
    h.join(0).expect("task");
    let esc = |h: &mut H, task_id: &str| {
        let req = crate::calls::EscalationReport {
            caller: h.wref(0),
            task_id: task_id.into(),
            category: "ambiguous_spec".into(),
            message: "which format?".into(),
            context_json: String::new(),
        };
        let mut res = Ok(());
        h.run(|r, _, wall, fx| res = r.on_escalate(req, wall, fx));
        res
    };
    assert_eq!(
        esc(&mut h, "NOT-A-TASK").err().map(|e| e.code()),
        Some(Code::NotFound)
    );
    for _ in 0..10 {
        esc(&mut h, "A-L1-001").expect("accepted");
    }
    let err = esc(&mut h, "A-L1-001").unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.message().contains("too many escalations"),
        "{}",
        err.message()
    );
    assert_eq!(h.r.escalations.len(), 10);
}

/// A `Watch` client's snapshots: at most every `SNAPSHOT_EVERY` while the rush runs, never
/// onto a queue it has not taken, and for a rush that is no longer running as soon as the
/// queue is taken (the end of a rush queued one whole snapshot per batch of events after it).
#[test]
fn watch_snapshots_wait_for_the_queue_and_the_interval() {
    use super::{SNAPSHOT_EVERY, snapshot_wait};
    let ms = Duration::from_millis;
    // Running: the interval, then the queue.
    assert_eq!(snapshot_wait(true, true, SNAPSHOT_EVERY), None);
    assert_eq!(snapshot_wait(true, true, ms(150)), Some(ms(50)));
    assert_eq!(
        snapshot_wait(true, false, SNAPSHOT_EVERY),
        Some(SNAPSHOT_EVERY / 4)
    );
    assert_eq!(snapshot_wait(true, false, ms(10)), Some(ms(190)));
    // Not running: no interval, but the queue still.
    assert_eq!(snapshot_wait(false, true, ms(0)), None);
    assert_eq!(snapshot_wait(false, false, ms(0)), Some(SNAPSHOT_EVERY / 4));
    assert_eq!(
        snapshot_wait(false, false, ms(5000)),
        Some(SNAPSHOT_EVERY / 4)
    );
}
