//! A container worker's host side and the container launcher together, against the machine's
//! real engine: zergd prepares the host, the launcher runs the container, and the worker's
//! objects are imported when it exits (as the supervisor's exit sink does). Where `docker info`
//! finds none the test is skipped, saying so, or fails under `ZERG_REQUIRE_DOCKER=1` (as
//! `.ci/run` sets when the engine is there).

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use bollard::Docker;
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{CreateContainerOptionsBuilder, InspectContainerOptions};
use tokio_stream::StreamExt;

use super::*;
use crate::launcher::container::{
    AGENT_IN_IMAGE, ContainerLauncher, LABEL_FEATURE, LABEL_WORKER, container_name,
};
use crate::launcher::testkit::{import_image, remove_image, stage};
use crate::launcher::{ContainerSpec, ExitInfo, ExitSink, Launcher, SpawnError, Spawned};
use crate::supervisor::Event;
use crate::supervisor::effects::{ObjectImport, exit_sink};
use zerg_proto::testkit::{docker_or_skip, git, skip};

// === Against the real engine ===

const TEST_IMAGE: &str = "zerg-worker:launcher-test";

/// The fake agent: reports what it sees, commits, and exits 3 (other workers sleep).
const FAKE_AGENT: &str = r#"#!/bin/sh
out=/zerg/logs/report
{
  echo "worktree=$ZERG_WORKTREE pwd=$(pwd)"
  while read k v rest; do if [ "$k" = "Uid:" ]; then echo "uid=$v"; fi; done < /proc/self/status
  read line < "$ZERG_SPEC_DIR/requirements.md"; echo "spec_line=$line"
  if (echo x > "$ZERG_SPEC_DIR/new") 2>/dev/null; then echo "spec_writable=yes"; else echo "spec_writable=no"; fi
  if git credential-cache --socket "$ZERG_SOCKET" exit; then echo "socket=ok"; else echo "socket=fail"; fi
  if [ -e /var/run/docker.sock ]; then echo "docker_sock=yes"; else echo "docker_sock=no"; fi
  if [ -e /zerg/state ]; then echo "state_dir=yes"; else echo "state_dir=no"; fi
  if git reset -q --hard HEAD; then echo "reset=ok"; else echo "reset=fail"; fi
  echo "status=[$(git status --porcelain)]"
  echo "cache_home=$XDG_CACHE_HOME"
  if (echo kept > "$XDG_CACHE_HOME/kept") 2>/dev/null; then echo "cache_writable=yes"; else echo "cache_writable=no"; fi
  echo planted > "$HOME/planted"
} > "$out" 2>&1
if [ "$ZERG_WORKER_ID" != "1" ]; then echo "worker $ZERG_WORKER_ID sleeping"; exec sleep 600; fi
echo hello > hello.txt
if git add -A && git commit -q -m "from container"; then echo "commit=$(git rev-parse HEAD)" >> "$out"; else echo "commit=fail" >> "$out"; fi
git update-ref refs/heads/zerg/feat/staging HEAD
echo "agent done"
exit 3
"#;

fn host_git() -> Option<PathBuf> {
    ["/usr/local/bin/git", "/usr/bin/git"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// A minimal image (sh, sleep, git, the fake agent) from the host's own binaries,
/// imported with `docker import` semantics.
async fn build_test_image(docker: &Docker, git: &Path) {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    stage(r, Path::new("/bin/sh"));
    stage(r, Path::new("/bin/sleep"));
    stage(r, git);
    let agent = r.join("usr/local/bin/zerg-worker-agent");
    fs::create_dir_all(agent.parent().unwrap()).unwrap();
    fs::write(&agent, FAKE_AGENT).unwrap();
    fs::set_permissions(&agent, fs::Permissions::from_mode(0o755)).unwrap();
    fs::create_dir_all(r.join("etc")).unwrap();
    fs::write(
        r.join("etc/passwd"),
        "root:x:0:0::/root:/bin/sh\nworker:x:10001:10001::/home/worker:/bin/sh\n",
    )
    .unwrap();
    fs::write(r.join("etc/group"), "root:x:0:\nworker:x:10001:\n").unwrap();
    for d in ["tmp", "home/worker"] {
        fs::create_dir_all(r.join(d)).unwrap();
        fs::set_permissions(r.join(d), fs::Permissions::from_mode(0o1777)).unwrap();
    }
    import_image(docker, r, TEST_IMAGE).await;
}

/// Prepares the host side of `spec`'s container and starts it, as the supervisor does.
async fn spawn(
    launcher: &ContainerLauncher,
    mut spec: WorkerSpec,
    on_exit: ExitSink,
) -> Result<Spawned, SpawnError> {
    let s = spec.clone();
    spec.container.host = Some(
        tokio::task::spawn_blocking(move || prepare(&s))
            .await
            .unwrap()?,
    );
    launcher.spawn(spec, on_exit).await
}

async fn exit_of(rx: tokio::sync::oneshot::Receiver<ExitInfo>) -> ExitInfo {
    tokio::time::timeout(Duration::from_secs(30), rx)
        .await
        .expect("no exit within 30 s")
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_engine_lifecycle() {
    if !docker_or_skip() {
        return;
    }
    let launcher = ContainerLauncher::connect()
        .await
        .expect("docker info answers, so the launcher connects");
    let docker = crate::launcher::engine::connect_engine()
        .await
        .expect("docker info answers, so the engine connects");
    let Some(host_git) = host_git() else {
        skip("no git at /usr/local/bin/git or /usr/bin/git to put in the test image");
        return;
    };
    build_test_image(&docker, &host_git).await;

    // A repository with a worktree per worker, a spec snapshot, and a zergd-like socket
    // (0600 in a 0700 directory).
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let repo = t.join("repo");
    fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    // The spec is committed, as users do: the read-only mount lies over tracked files.
    fs::create_dir_all(repo.join(".gsd/specs/feat")).unwrap();
    fs::write(
        repo.join(".gsd/specs/feat/requirements.md"),
        "# committed\n",
    )
    .unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "init"]);
    let spec_dir = t.join("specs/feat");
    fs::create_dir_all(&spec_dir).unwrap();
    fs::write(spec_dir.join("requirements.md"), "# the spec\n").unwrap();
    let run = t.join("run/w/0123456789abcdef");
    fs::create_dir_all(&run).unwrap();
    fs::set_permissions(&run, fs::Permissions::from_mode(0o700)).unwrap();
    let socket = run.join("worker.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    fs::set_permissions(&socket, fs::Permissions::from_mode(0o600)).unwrap();
    let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let conns = connections.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            conns.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut buf = Vec::new();
            let _ = tokio::io::AsyncReadExt::read_to_end(&mut s, &mut buf).await;
        }
    });
    let rush = format!("test-{}", std::process::id());
    let mk = |w: u32| {
        let wt = t.join(format!("wt/worker-{w}"));
        let branch = format!("zerg/feat/worker-{w}");
        git(
            &repo,
            &[
                "worktree",
                "add",
                "-q",
                "-b",
                &branch,
                &wt.to_string_lossy(),
            ],
        );
        WorkerSpec {
            rush_id: rush.clone(),
            feature: "feat".into(),
            worker_id: w,
            generation: 1,
            repo: repo.clone(),
            worktree: wt,
            branch,
            spec_dir: spec_dir.clone(),
            state_dir: t.join("state"),
            log_dir: t.join("logs"),
            socket: socket.clone(),
            token: crate::launcher::WorkerToken::generate(),
            agent_bin: AGENT_IN_IMAGE.into(),
            container: ContainerSpec {
                image: TEST_IMAGE.into(),
                network: "none".into(),
                memory_bytes: 256 << 20,
                cpus: 1.0,
                pids_limit: 64,
                host: None,
                log_max_bytes: 64 << 20,
            },
            env_passthrough: vec![],
            remote: Default::default(),
            stop_grace: std::time::Duration::from_secs(10),
            sandbox: None,
        }
    };
    let s1 = mk(1);
    let dotgit_before = fs::read(s1.worktree.join(".git")).unwrap();
    let admin_gitdir_before = fs::read(repo.join(".git/worktrees/worker-1/gitdir")).unwrap();

    // A missing image is reported the way the supervisor shows it.
    let mut bad = s1.clone();
    bad.container.image = "zerg-worker:does-not-exist".into();
    let err = spawn(&launcher, bad, Box::new(|_| {})).await.unwrap_err();
    assert!(
        err.message.starts_with(
            "image zerg-worker:does-not-exist not found: build it with zergctl image build"
        ),
        "{err}"
    );

    // Worker 1 runs to completion through the supervisor's own exit sink: its exit code is
    // observed, and its commit's objects are imported before the supervisor hears of the exit.
    let (events, mut exited) = tokio::sync::mpsc::unbounded_channel();
    let import = ObjectImport::new(repo.clone(), "feat".into(), Default::default());
    let sp = spawn(
        &launcher,
        s1.clone(),
        exit_sink(&events, &rush, 1, 1, Some(import)),
    )
    .await
    .unwrap();
    let id1 = sp.container_id.clone().unwrap();
    match tokio::time::timeout(Duration::from_secs(30), exited.recv()).await {
        Ok(Some(Event::Exited { worker, info, .. })) => {
            assert_eq!((worker, info), (1, ExitInfo::Code(3)));
        }
        other => panic!("no exit event within 30 s: {}", other.is_ok()),
    }
    let report = fs::read_to_string(t.join("logs/worker-1/report")).unwrap();
    assert!(
        report.contains("worktree=/workspace pwd=/workspace"),
        "{report}"
    );
    assert!(!report.contains("uid=0\n"), "{report}");
    assert!(report.contains("spec_line=# the spec"), "{report}");
    assert!(report.contains("spec_writable=no"), "{report}");
    assert!(report.contains("socket=ok"), "{report}");
    assert!(report.contains("docker_sock=no"), "{report}");
    assert!(report.contains("state_dir=no"), "{report}");
    // The committed spec under the read-only mount does not break git.
    assert!(report.contains("reset=ok"), "{report}");
    assert!(report.contains("status=[]"), "{report}");
    let commit = report
        .lines()
        .find_map(|l| l.strip_prefix("commit="))
        .unwrap_or("fail")
        .to_string();
    assert!(commit.len() == 40, "{report}");
    assert!(connections.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    // The commit stays private to the container (zergd moves the branch once it accepts
    // it); its objects reached the host's store, verified, when the container exited.
    assert_eq!(
        git(&repo, &["log", "-1", "--format=%s", "zerg/feat/worker-1"]),
        "init"
    );
    assert_eq!(
        git(&repo, &["log", "-1", "--format=%s", &commit]),
        "from container"
    );
    assert!(
        git(&repo, &["branch", "--list", "zerg/feat/staging"]).is_empty(),
        "a ref moved inside the container must not appear on the host"
    );
    assert_eq!(
        git(
            &repo,
            &["show", &format!("{commit}:.gsd/specs/feat/requirements.md")]
        ),
        "# committed",
        "the commit keeps the committed spec"
    );
    assert_eq!(
        fs::read(s1.worktree.join(".git")).unwrap(),
        dotgit_before,
        "the .git file is untouched"
    );
    assert_eq!(
        fs::read(repo.join(".git/worktrees/worker-1/gitdir")).unwrap(),
        admin_gitdir_before
    );
    let log = fs::read_to_string(t.join("logs/worker-1.log")).unwrap_or_default();
    assert!(log.contains("agent done"), "log mirror: {log:?}");
    // The slot's cache outlives the container; its home does not: the next spawn of the slot
    // (prepared again, as a respawn is) finds the cache and a clean home.
    assert!(
        report.contains("cache_home=/home/worker/.cache"),
        "{report}"
    );
    assert!(report.contains("cache_writable=yes"), "{report}");
    let area = repo.join(".git/zerg/feat");
    assert!(area.join("home-1/planted").exists());
    let again = s1.clone();
    tokio::task::spawn_blocking(move || prepare(&again))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        fs::read_to_string(area.join("cache-1/kept")).unwrap(),
        "kept\n"
    );
    assert!(!area.join("home-1/planted").exists(), "the home is rebuilt");
    // The launcher removes the container after reporting its exit: the engine says when (a
    // wait on a container already gone ends at once, with a 404).
    let removed = bollard::query_parameters::WaitContainerOptions {
        condition: "removed".into(),
    };
    let mut removal = std::pin::pin!(docker.wait_container(&id1, Some(removed)));
    tokio::time::timeout(Duration::from_secs(120), removal.next())
        .await
        .expect("the engine reports the exited worker's container removed");
    assert!(
        docker
            .inspect_container(&id1, None::<InspectContainerOptions>)
            .await
            .is_err(),
        "an exited worker's container is removed"
    );

    // Worker 2 runs until stopped; discover() finds it by label, stop() ends and removes it.
    let s2 = mk(2);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let sp2 = spawn(
        &launcher,
        s2,
        Box::new(move |i| {
            let _ = tx.send(i);
        }),
    )
    .await
    .unwrap();
    assert!(launcher.is_alive(sp2.clone()).await);
    // Stopped once it sleeps (SIGTERM ends `sleep`), not while its shell is still starting up.
    let log2 = t.join("logs/worker-2.log");
    let mut sleeping = false;
    for _ in 0..600 {
        if fs::read_to_string(&log2).is_ok_and(|l| l.contains("worker 2 sleeping")) {
            sleeping = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(sleeping, "worker 2 never reached its sleep");
    let found = launcher.discover(&rush).await;
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        (found[0].worker_id, found[0].generation, found[0].running),
        (2, 1, true)
    );
    assert_eq!(found[0].spawned.container_id, sp2.container_id);
    launcher.stop(sp2.clone(), Duration::from_secs(10)).await;
    assert_eq!(exit_of(rx).await, ExitInfo::Code(143));
    assert!(!launcher.is_alive(sp2).await);
    assert!(launcher.discover(&rush).await.is_empty());

    // A leftover container with worker 3's name is ours by label: it is replaced. A kill
    // (as by `docker kill`) is seen as a crash exit.
    let s3 = mk(3);
    let leftover = ContainerCreateBody {
        image: Some(TEST_IMAGE.into()),
        entrypoint: Some(vec!["/bin/sh".into()]),
        labels: Some(HashMap::from([
            (LABEL_FEATURE.to_string(), "feat".to_string()),
            (LABEL_WORKER.to_string(), "3".to_string()),
        ])),
        ..Default::default()
    };
    let opts = CreateContainerOptionsBuilder::new()
        .name(&container_name(&s3))
        .build();
    docker.create_container(Some(opts), leftover).await.unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let sp3 = spawn(
        &launcher,
        s3,
        Box::new(move |i| {
            let _ = tx.send(i);
        }),
    )
    .await
    .unwrap();
    let id3 = sp3.container_id.clone().unwrap();
    docker
        .kill_container(
            &id3,
            None::<bollard::query_parameters::KillContainerOptions>,
        )
        .await
        .unwrap();
    assert_eq!(exit_of(rx).await, ExitInfo::Code(137));
    launcher.cleanup(sp3).await;
    assert!(launcher.discover(&rush).await.is_empty());

    remove_image(&docker, TEST_IMAGE).await;
}
