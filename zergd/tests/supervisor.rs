//! Integration tests of the supervisor actor with a fake launcher: the real event loop, real
//! git, the real state store and each rush's real worker-plane socket, with the test playing the
//! worker agents over gRPC.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tonic::transport::Channel;
use zerg_proto::contract::{TOKEN_METADATA, bearer};
use zerg_proto::testkit::{git, skip};
use zerg_proto::transport;
use zerg_proto::v1;
use zerg_proto::v1::worker_client::WorkerClient;
use zergd::calls::WorkerAuth;
use zergd::calls::{NoteTask, RetryTasks, RushKey, StartRush};
use zergd::clock::SystemClock;
use zergd::domain::Mode;
use zergd::domain::{RushState, TaskStatus};
use zergd::launcher::{BoxFuture, ExitInfo, ExitSink, Launcher, SpawnError, Spawned, WorkerSpec};
use zergd::supervisor::{ControlCmd, Event, Handle, Settings, Supervisor, WorkerCmd};

/// A launcher that starts nothing: it hands each spawn to the test and lets the test end
/// workers.
#[derive(Clone, Default)]
struct FakeLauncher {
    spawns: Arc<Mutex<Option<mpsc::UnboundedSender<WorkerSpec>>>>,
    sinks: Arc<Mutex<HashMap<(u32, u64), ExitSink>>>,
    fail_next: Arc<Mutex<u32>>,
}

impl FakeLauncher {
    fn exit(&self, worker: u32, generation: u64, info: ExitInfo) {
        if let Some(sink) = self.sinks.lock().unwrap().remove(&(worker, generation)) {
            sink(info);
        }
    }
}

impl Launcher for FakeLauncher {
    fn spawn(&self, spec: WorkerSpec, on_exit: ExitSink) -> BoxFuture<Result<Spawned, SpawnError>> {
        let me = self.clone();
        Box::pin(async move {
            {
                let mut f = me.fail_next.lock().unwrap();
                if *f > 0 {
                    *f -= 1;
                    return Err(SpawnError::new("fake spawn failure"));
                }
            }
            me.sinks
                .lock()
                .unwrap()
                .insert((spec.worker_id, spec.generation), on_exit);
            let id = format!("fake-{}-{}", spec.worker_id, spec.generation);
            if let Some(tx) = me.spawns.lock().unwrap().as_ref() {
                let _ = tx.send(spec);
            }
            Ok(Spawned {
                pid: None,
                start_time: None,
                container_id: Some(id),
            })
        })
    }

    fn stop(&self, worker: Spawned, _grace: Duration) -> BoxFuture<()> {
        let me = self.clone();
        Box::pin(async move {
            let id = worker.container_id.unwrap_or_default();
            let key = me
                .sinks
                .lock()
                .unwrap()
                .keys()
                .find(|(w, g)| format!("fake-{w}-{g}") == id)
                .copied();
            if let Some((w, g)) = key {
                me.exit(w, g, ExitInfo::Signal(15));
            }
        })
    }

    fn is_alive(&self, worker: Spawned) -> BoxFuture<bool> {
        let me = self.clone();
        Box::pin(async move {
            let id = worker.container_id.unwrap_or_default();
            me.sinks
                .lock()
                .unwrap()
                .keys()
                .any(|(w, g)| format!("fake-{w}-{g}") == id)
        })
    }

    fn watch(&self, _worker: Spawned, _on_exit: ExitSink) {}
}

fn repo(dir: &Path) -> PathBuf {
    let r = dir.join("repo");
    std::fs::create_dir_all(r.join(".gsd/specs/f")).unwrap();
    git(&r, &["init", "-q", "-b", "main"]);
    std::fs::write(r.join("README.md"), "x\n").unwrap();
    git(&r, &["add", "-A"]);
    git(&r, &["commit", "-q", "-m", "init"]);
    let graph = serde_json::json!({"feature": "f", "tasks": [
        {"id": "F-L1-001", "title": "a", "level": 1, "files": {"create": ["a.txt"], "modify": [], "read": []}},
        {"id": "F-L1-002", "title": "b", "level": 1, "files": {"create": ["b.txt"], "modify": [], "read": []}},
        {"id": "F-L2-001", "title": "c", "level": 2, "dependencies": ["F-L1-001", "F-L1-002"],
         "files": {"create": ["c.txt"], "modify": [], "read": []}}
    ]});
    std::fs::write(r.join(".gsd/specs/f/task-graph.json"), graph.to_string()).unwrap();
    // Committed, as users commit their specs.
    git(&r, &["add", ".gsd"]);
    git(&r, &["commit", "-q", "-m", "spec: f"]);
    std::fs::create_dir_all(r.join(".zerg")).unwrap();
    std::fs::write(
        r.join(".zerg/config.yaml"),
        // The launcher is a fake: no agent CLI runs (and none that zergd refuses as root).
        "agent:\n  command: [unused-agent]\nworkers:\n  spawn_backoff_base_seconds: 0.05\n  spawn_backoff_max_seconds: 0.1\n  heartbeat_interval_seconds: 1\n  heartbeat_stale_threshold: 30\n",
    )
    .unwrap();
    r
}

fn me(spec: &WorkerSpec) -> Option<v1::WorkerRef> {
    Some(v1::WorkerRef {
        rush_id: spec.rush_id.clone(),
        worker_id: spec.worker_id,
        generation: spec.generation,
    })
}

/// A client of the rush's real worker-plane socket, as the worker's agent would open it.
async fn plane(spec: &WorkerSpec) -> WorkerClient<Channel> {
    WorkerClient::new(transport::connect(&spec.socket).await.unwrap())
}

/// `msg` carrying `token` (if any) the way the agent sends it.
fn signed<T>(token: Option<&str>, msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Some(t) = token {
        r.metadata_mut()
            .insert(TOKEN_METADATA, bearer(t).parse().unwrap());
    }
    r
}

/// `msg` signed with this worker's own token.
fn from<T>(spec: &WorkerSpec, msg: T) -> tonic::Request<T> {
    signed(Some(spec.token.expose()), msg)
}

/// Registers a spawned worker and leases its next task.
async fn lease(spec: &WorkerSpec) -> v1::LeaseReply {
    let reg = v1::RegisterRequest {
        worker: me(spec),
        pid: 1,
        ..Default::default()
    };
    plane(spec).await.register(from(spec, reg)).await.unwrap();
    next(spec).await
}

async fn next(spec: &WorkerSpec) -> v1::LeaseReply {
    let req = v1::LeaseRequest { worker: me(spec) };
    let mut c = plane(spec).await;
    tokio::time::timeout(Duration::from_secs(30), c.lease(from(spec, req)))
        .await
        .expect("a lease reply")
        .unwrap()
        .into_inner()
}

fn task(reply: v1::LeaseReply) -> v1::Task {
    match reply.outcome {
        Some(v1::lease_reply::Outcome::Task(t)) => t,
        other => panic!("expected a task, got {other:?}"),
    }
}

async fn report(spec: &WorkerSpec, req: v1::CompleteRequest) -> Result<(), tonic::Status> {
    plane(spec)
        .await
        .complete(from(spec, req))
        .await
        .map(|_| ())
}

/// Does the task's work in the worker's worktree, as the agent would, and reports it.
async fn complete(spec: &WorkerSpec, t: &v1::Task) {
    let wt = &spec.worktree;
    git(wt, &["reset", "--hard", "-q", &t.base_commit]);
    for f in &t.files_create {
        std::fs::write(wt.join(f), &t.id).unwrap();
    }
    git(wt, &["add", "-A"]);
    git(
        wt,
        &[
            "commit",
            "-q",
            "-m",
            &format!(
                "ZERG [{}]: {}\n\nTask-ID: {}",
                spec.worker_id, t.title, t.id
            ),
        ],
    );
    let commit = git(wt, &["rev-parse", "HEAD"]);
    let req = v1::CompleteRequest {
        worker: me(spec),
        lease_id: t.lease_id.clone(),
        task_id: t.id.clone(),
        commit,
        ..Default::default()
    };
    report(spec, req).await.unwrap();
}

async fn status(h: &Handle, repo: &Path) -> v1::RushStatus {
    let req = RushKey::given(repo.to_string_lossy(), "f");
    let (tx, rx) = tokio::sync::oneshot::channel();
    let query = zergd::calls::StatusQuery::new(move |view| {
        let answer = view.map(zergd::wire::status::rush_status);
        Box::new(move || {
            let _ = tx.send(answer);
        })
    });
    h.send(Event::Control(ControlCmd::Status(req, query)))
        .unwrap();
    rx.await.unwrap().unwrap()
}

async fn start(
    dir: &Path,
    fake: &FakeLauncher,
) -> (Handle, mpsc::UnboundedReceiver<WorkerSpec>, PathBuf) {
    let r = repo(dir);
    let (tx, rx) = mpsc::unbounded_channel();
    *fake.spawns.lock().unwrap() = Some(tx);
    let settings = Settings {
        planes: Arc::new(zergd::worker_plane::Planes::beside(&dir.join("zergd.sock"))),
        agent_bin: PathBuf::from("/unused"),
        registry_path: dir.join("state/rushes.json"),
    };
    let sup = Supervisor::with_launchers(
        settings,
        Arc::new(SystemClock),
        Arc::new(fake.clone()),
        None,
    );
    let h = sup.handle();
    tokio::spawn(sup.run());
    let req = StartRush {
        repo: r.to_string_lossy().into(),
        feature: "f".into(),
        workers: 2,
        mode: Some(Mode::Subprocess),
        max_usd: None,
    };
    let reply = h
        .ask(|tx| Event::Control(ControlCmd::Rush(req, tx)))
        .await
        .unwrap();
    assert!(!reply.resumed);
    (h, rx, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rush_runs_level_by_level_and_merges_into_staging() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeLauncher::default();
    let (h, mut spawns, r) = start(dir.path(), &fake).await;
    let w0 = spawns.recv().await.unwrap();
    let w1 = spawns.recv().await.unwrap();
    let t0 = task(lease(&w0).await);
    let t1 = task(lease(&w1).await);
    assert_eq!(t0.level, 1);
    assert_eq!(t1.level, 1);
    assert_ne!(t0.id, t1.id);
    complete(&w0, &t0).await;
    complete(&w1, &t1).await;
    // Level 2 sees both level-1 files: the lease's base commit is the new staging head.
    let reply = tokio::select! {
        r = next(&w0) => r,
        r = next(&w1) => r,
    };
    let t2 = task(reply);
    assert_eq!(t2.id, "F-L2-001");
    let staging = git(&r, &["rev-parse", "zerg/f/staging"]);
    assert_eq!(t2.base_commit, staging);
    let files = git(&r, &["ls-tree", "-r", "--name-only", &staging]);
    assert!(
        files.contains("a.txt") && files.contains("b.txt"),
        "{files}"
    );
    let worker = status(&h, &r).await.tasks["F-L2-001"].worker_id.unwrap();
    let spec = if w0.worker_id == worker { &w0 } else { &w1 };
    complete(spec, &t2).await;
    // The last merge runs in the background; wait for the rush to end.
    let mut st = status(&h, &r).await;
    for _ in 0..1500 {
        if st.state() != v1::RushState::Running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        st = status(&h, &r).await;
    }
    assert_eq!(st.state(), v1::RushState::Complete);
    let ids = git(
        &r,
        &[
            "log",
            "--format=%(trailers:key=Task-ID,valueonly)",
            "main..zerg/f/staging",
        ],
    );
    let mut ids: Vec<&str> = ids.lines().filter(|l| !l.is_empty()).collect();
    ids.sort();
    assert_eq!(ids, vec!["F-L1-001", "F-L1-002", "F-L2-001"]);
    // The state file on disk agrees.
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(r.join(".zerg/state/f.json")).unwrap()).unwrap();
    assert_eq!(doc["rush"]["state"], "complete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_worker_is_replaced_and_its_task_goes_to_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeLauncher::default();
    let (h, mut spawns, r) = start(dir.path(), &fake).await;
    let w0 = spawns.recv().await.unwrap();
    let w1 = spawns.recv().await.unwrap();
    let t0 = task(lease(&w0).await);
    let t1 = task(lease(&w1).await);
    complete(&w0, &t0).await;
    // w0 parks for more work; w1 crashes holding t1.
    let w0c = w0.clone();
    let parked = tokio::spawn(async move { next(&w0c).await });
    fake.exit(w1.worker_id, w1.generation, ExitInfo::Signal(9));
    let got = task(parked.await.unwrap());
    assert_eq!(
        got.id, t1.id,
        "the crashed worker's task goes to the parked one"
    );
    // The slot is respawned with a new generation, and the old generation is fenced off.
    let respawn = tokio::time::timeout(Duration::from_secs(10), spawns.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(respawn.worker_id, w1.worker_id);
    assert_eq!(respawn.generation, w1.generation + 1);
    let late = v1::CompleteRequest {
        worker: me(&w1),
        lease_id: t1.lease_id.clone(),
        task_id: t1.id.clone(),
        commit: "0".repeat(40),
        ..Default::default()
    };
    let err = report(&w1, late).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    let st = status(&h, &r).await;
    assert_eq!(st.tasks[&t1.id].crashes, 1);
    assert_eq!(
        st.tasks[&t1.id].attempts, 1,
        "a crash does not count as an attempt"
    );
    let res = st.resilience.unwrap();
    assert_eq!(res.task_reassignments, 1);
    assert_eq!(res.worker_respawns, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_note_with_restart_stops_the_attempt_uncounted_and_the_next_lease_carries_it() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeLauncher::default();
    let (h, mut spawns, r) = start(dir.path(), &fake).await;
    let w0 = spawns.recv().await.unwrap();
    let w1 = spawns.recv().await.unwrap();
    let t0 = task(lease(&w0).await);
    let t1 = task(lease(&w1).await);
    assert!(t1.notes.is_empty());
    complete(&w0, &t0).await;
    let w0c = w0.clone();
    let parked = tokio::spawn(async move { next(&w0c).await });
    let note = |task: &str, restart: bool| NoteTask {
        key: RushKey::given(r.to_string_lossy(), "f"),
        task_id: task.into(),
        text: "use the v2 API".into(),
        restart,
    };
    let n = h
        .ask(|tx| Event::Control(ControlCmd::Note(note(&t1.id, true), tx)))
        .await
        .unwrap();
    assert_eq!(n.notes, 1);
    assert!(n.outcome.starts_with("running attempt stopped"), "{n:?}");
    // The next lease of the task carries the note, as the same attempt.
    let got = task(parked.await.unwrap());
    assert_eq!(got.id, t1.id);
    assert_eq!(got.notes, vec!["use the v2 API".to_string()]);
    assert_eq!(got.attempt, 1, "the stopped attempt is not counted");
    // The stopped attempt's lease no longer holds, and its worker was stopped and respawned.
    let late = v1::CompleteRequest {
        worker: me(&w1),
        lease_id: t1.lease_id.clone(),
        task_id: t1.id.clone(),
        commit: "0".repeat(40),
        ..Default::default()
    };
    assert_eq!(
        report(&w1, late).await.unwrap_err().code(),
        tonic::Code::FailedPrecondition
    );
    let respawn = tokio::time::timeout(Duration::from_secs(10), spawns.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(respawn.worker_id, w1.worker_id);
    let st = status(&h, &r).await;
    let t = &st.tasks[&t1.id];
    assert_eq!((t.attempts, t.crashes), (1, 0), "{t:?}");
    assert_eq!(t.notes, vec!["use the v2 API".to_string()]);
    // A complete task and an unknown one are refused, by name.
    let e = h
        .ask(|tx| Event::Control(ControlCmd::Note(note(&t0.id, false), tx)))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("is complete"), "{e}");
    let e = h
        .ask(|tx| Event::Control(ControlCmd::Note(note("NOPE-1", false), tx)))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no task NOPE-1"), "{e}");
    // A retry whose note names no task, in a rush with no failed task, would keep the note
    // nowhere: it is refused, and says how to reach a task.
    let retry = RetryTasks {
        key: RushKey::given(r.to_string_lossy(), "f"),
        task_ids: vec![],
        reset: false,
        max_usd: None,
        note: Some("try harder".into()),
    };
    let e = h
        .ask(|tx| Event::Control(ControlCmd::Retry(retry, tx)))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no failed task"), "{e}");
    assert!(
        status(&h, &r)
            .await
            .tasks
            .values()
            .all(|t| !t.notes.iter().any(|n| n == "try harder"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn_failures_are_retried_while_status_keeps_answering() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeLauncher::default();
    *fake.fail_next.lock().unwrap() = 2;
    let (h, mut spawns, r) = start(dir.path(), &fake).await;
    // While the retries are pending the loop answers status.
    let st = status(&h, &r).await;
    assert_eq!(st.state(), v1::RushState::Running);
    let a = tokio::time::timeout(Duration::from_secs(10), spawns.recv())
        .await
        .unwrap()
        .unwrap();
    let b = tokio::time::timeout(Duration::from_secs(10), spawns.recv())
        .await
        .unwrap()
        .unwrap();
    assert_ne!(a.worker_id, b.worker_id);
    let st = status(&h, &r).await;
    assert_eq!(st.resilience.unwrap().spawn_retries, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_calls_need_the_callers_own_token_and_commits_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeLauncher::default();
    let (h, mut spawns, r) = start(dir.path(), &fake).await;
    let w0 = spawns.recv().await.unwrap();
    let w1 = spawns.recv().await.unwrap();
    let lease_as = |token: Option<String>, spec: &WorkerSpec| {
        let req = v1::LeaseRequest { worker: me(spec) };
        let spec = spec.clone();
        async move {
            plane(&spec)
                .await
                .lease(signed(token.as_deref(), req))
                .await
                .unwrap_err()
        }
    };
    // No token, or another worker's token.
    assert_eq!(
        lease_as(None, &w0).await.code(),
        tonic::Code::Unauthenticated
    );
    let other = Some(w1.token.expose().to_string());
    assert_eq!(
        lease_as(other, &w0).await.code(),
        tonic::Code::PermissionDenied
    );
    // The right token on the socket of a rush zergd does not know.
    let elsewhere = WorkerAuth::for_token("another-rush", &w0.token);
    let caller = zergd::wire::worker::lease_caller(v1::LeaseRequest { worker: me(&w0) }).unwrap();
    let err = h
        .ask(|tx| Event::Worker(elsewhere, WorkerCmd::Lease(caller, tx)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    assert_ne!(w0.token, w1.token);

    // A commit that changes the spec is refused and the attempt fails; the spec on staging
    // stays as the base had it.
    let t0 = task(lease(&w0).await);
    let wt = &w0.worktree;
    git(wt, &["reset", "--hard", "-q", &t0.base_commit]);
    std::fs::create_dir_all(wt.join(".gsd/specs/f")).unwrap();
    std::fs::write(wt.join(".gsd/specs/f/task-graph.json"), "{}").unwrap();
    git(wt, &["add", "-A"]);
    git(wt, &["commit", "-q", "-m", "rewrites the spec"]);
    let commit = git(wt, &["rev-parse", "HEAD"]);
    let req = v1::CompleteRequest {
        worker: me(&w0),
        lease_id: t0.lease_id.clone(),
        task_id: t0.id.clone(),
        commit,
        ..Default::default()
    };
    let err = report(&w0, req).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(err.message().contains("spec"), "{}", err.message());
    let st = status(&h, &r).await;
    assert_ne!(st.tasks[&t0.id].status(), v1::TaskState::Complete);
    assert!(
        st.tasks[&t0.id].error.contains("commit refused"),
        "{:?}",
        st.tasks[&t0.id]
    );
    // A commit id that is not hex is refused at the edge, naming the field; nothing panics.
    let t = task(next(&w1).await);
    let req = v1::CompleteRequest {
        worker: me(&w1),
        lease_id: t.lease_id.clone(),
        task_id: t.id.clone(),
        commit: "é".repeat(20),
        ..Default::default()
    };
    let err = report(&w1, req).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().starts_with("commit:"), "{}", err.message());
}

/// Every worker call with hostile values, over the real worker-plane socket: each is answered
/// (accepted or refused), none crashes the supervisor, and the rush still runs afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_worker_calls_never_crash_the_supervisor() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeLauncher::default();
    let (h, mut spawns, r) = start(dir.path(), &fake).await;
    let w0 = spawns.recv().await.unwrap();
    let w1 = spawns.recv().await.unwrap();
    let t0 = task(lease(&w0).await);
    let huge = "x".repeat(1 << 20);
    let weird = [
        "",
        "é",
        "\u{0}",
        "../../etc/passwd",
        huge.as_str(),
        "#",
        "F-L1-001#999",
    ];
    let refs = [
        me(&w0),
        None,
        Some(v1::WorkerRef {
            rush_id: w0.rush_id.clone(),
            worker_id: u32::MAX,
            generation: u64::MAX,
        }),
        Some(v1::WorkerRef {
            rush_id: huge.clone(),
            worker_id: 0,
            generation: 0,
        }),
    ];
    let mut c = plane(&w0).await;
    for wref in &refs {
        for s in weird {
            let hb = v1::HeartbeatRequest {
                worker: wref.clone(),
                lease_id: s.into(),
                task_id: s.into(),
                step: i32::MAX,
                progress_pct: u32::MAX,
                timestamp_ms: i64::MIN,
                last_output_ms: i64::MAX,
                detail: s.into(),
            };
            let _ = c.heartbeat(from(&w0, tokio_stream::iter(vec![hb]))).await;
            let rep = v1::CompleteRequest {
                worker: wref.clone(),
                lease_id: s.into(),
                task_id: s.into(),
                commit: s.into(),
                out_of_scope: vec![s.into(); 3],
                duration_ms: u64::MAX,
                cost_usd: f64::NAN,
                ..Default::default()
            };
            let _ = c.complete(from(&w0, rep)).await;
            let f = v1::FailRequest {
                worker: wref.clone(),
                lease_id: s.into(),
                task_id: s.into(),
                kind: -7,
                message: s.into(),
                retry_at_ms: i64::MAX,
                checkpoint_commit: s.into(),
                cost_usd: f64::INFINITY,
                ..Default::default()
            };
            let _ = c.fail(from(&w0, f)).await;
            let e = v1::EscalateRequest {
                worker: wref.clone(),
                lease_id: s.into(),
                task_id: s.into(),
                category: s.into(),
                message: s.into(),
                context_json: s.into(),
            };
            let _ = c.escalate(from(&w0, e)).await;
            let reg = v1::RegisterRequest {
                worker: wref.clone(),
                pid: i32::MIN,
                held_lease_id: s.into(),
                held_task_id: s.into(),
            };
            let _ = c.register(from(&w0, reg)).await;
        }
    }
    // The real lease with hostile report values: refused or accepted, never a crash.
    let hb = v1::HeartbeatRequest {
        worker: me(&w0),
        lease_id: t0.lease_id.clone(),
        task_id: t0.id.clone(),
        step: 3,
        progress_pct: u32::MAX,
        ..Default::default()
    };
    c.heartbeat(from(&w0, tokio_stream::iter(vec![hb])))
        .await
        .unwrap();
    // zergd still answers and the rush still runs: the other worker gets the other task.
    let st = status(&h, &r).await;
    assert_eq!(st.state(), v1::RushState::Running, "{st:?}");
    let t1 = task(lease(&w1).await);
    assert_ne!(t1.id, t0.id);
}

/// A small tmpfs of the test's own, unmounted when dropped; `None` (the test skipped, saying
/// why) where this process may not mount one, which fails under CI (`.ci/run` runs as root).
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs(dir)),
            Ok(o) => {
                skip(&format!(
                    "cannot mount a tmpfs to fill (mounting needs root): {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
                None
            }
            Err(e) => {
                skip(&format!("cannot run mount: {e}"));
                None
            }
        }
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    /// Writes zeros into `name` until the file system is full.
    fn fill(&self, name: &str) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.path().join(name)).unwrap();
        let block = vec![0u8; 64 * 1024];
        while f.write_all(&block).is_ok() {}
        let _ = f.sync_all();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

/// A full disk while a worker reports: the old state file survives intact, the worker is told
/// the report was not saved, status says why and the rush holds new work; once there is space
/// again, `retry` resumes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_keeps_the_old_state_pauses_the_rush_and_retry_resumes_it() {
    let Some(fs) = Tmpfs::mount("16m") else {
        return;
    };
    let fake = FakeLauncher::default();
    let (h, mut spawns, r) = start(fs.path(), &fake).await;
    let w0 = spawns.recv().await.unwrap();
    let _w1 = spawns.recv().await.unwrap();
    let t0 = task(lease(&w0).await);
    // The work is committed before the disk fills; the report comes after.
    let wt = &w0.worktree;
    git(wt, &["reset", "--hard", "-q", &t0.base_commit]);
    std::fs::write(wt.join(&t0.files_create[0]), "a").unwrap();
    git(wt, &["add", "-A"]);
    git(wt, &["commit", "-q", "-m", "a\n\nTask-ID: F-L1-001"]);
    let commit = git(wt, &["rev-parse", "HEAD"]);
    let state_file = r.join(".zerg/state/f.json");
    let before = std::fs::read(&state_file).unwrap();
    fs.fill("filler");

    let req = v1::CompleteRequest {
        worker: me(&w0),
        lease_id: t0.lease_id.clone(),
        task_id: t0.id.clone(),
        commit,
        ..Default::default()
    };
    let err = report(&w0, req).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");
    assert!(err.message().contains("cannot save"), "{}", err.message());
    let st = status(&h, &r).await;
    assert_eq!(st.state(), v1::RushState::Paused, "{st:?}");
    assert!(
        st.reason.contains("cannot save the state file") && st.reason.contains("zergctl retry f"),
        "{}",
        st.reason
    );
    // What is on disk is the last state that was saved: the state file untouched, and its
    // journal replays to the task in progress (the append that failed left nothing usable).
    let on_disk = std::fs::read(&state_file).unwrap();
    assert_eq!(on_disk, before, "the state file is untouched");
    let saved = || {
        zergd::state::StateStore::new(&r.join(".zerg/state"), "f")
            .load()
            .unwrap()
            .unwrap()
    };
    assert_eq!(saved().tasks[&t0.id].status, TaskStatus::InProgress);

    // Space again: retry resumes, and the state on disk catches up.
    std::fs::remove_file(fs.path().join("filler")).unwrap();
    let key = RushKey::given(r.to_string_lossy(), "f");
    let retry = RetryTasks {
        key,
        task_ids: vec![],
        reset: false,
        max_usd: None,
        note: None,
    };
    h.ask(|tx| Event::Control(ControlCmd::Retry(retry, tx)))
        .await
        .unwrap();
    let st = status(&h, &r).await;
    assert_eq!(st.state(), v1::RushState::Running, "{st:?}");
    let doc = saved();
    assert_eq!(doc.rush.state, RushState::Running);
    assert_eq!(doc.tasks[&t0.id].status, TaskStatus::Complete);
}
