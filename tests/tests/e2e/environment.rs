//! Real projects' environments: a worker's worktree holds only tracked files, so a project
//! whose tests read a gitignored `.env` and run in a venv needs `worktree.copy` and
//! `worktree.setup`; a verification command that is not installed is an environment error that
//! pauses the rush once with the fix, not a task failure that burns every attempt.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use serde_json::{Value, json};
use zerg_tests::*;

const T: Duration = Duration::from_secs(180);

const CHECK_ENV: &str = include_str!("../../fixtures/python-env/check_env.py");
const GITIGNORE: &str = include_str!("../../fixtures/python-env/gitignore");

fn monitor(repo: &TestRepo) -> String {
    std::fs::read_to_string(repo.path.join(".zerg/monitor.log")).unwrap_or_default()
}

fn ok(out: &std::process::Output) {
    succeeded(out);
}

/// Starts a detached rush of `feature` on `workers` workers, waits until it is no longer
/// running, asserts it paused and returns the reason.
fn rush_until_paused(d: &Daemon, repo: &TestRepo, feature: &str, workers: &str) -> String {
    ok(&d.ctl_in(
        &repo.path,
        &["rush", feature, "--workers", workers, "--detach"],
    ));
    let st = d.wait_for(&repo.path, feature, T, "the rush to pause", |s| {
        s["state"] != "running" && s["state"] != "pending"
    });
    assert_eq!(st["state"], "paused", "{st}\n{}", monitor(repo));
    assert_eq!(tasks_with(&st, "failed"), Vec::<String>::new(), "{st}");
    st["reason"].as_str().unwrap_or_default().to_string()
}

/// The twelve-task graph with each task verified by `verify <the file it creates>`.
fn graph_verified_by(feature: &str, verify: &str) -> String {
    let mut g: Value = serde_json::from_str(&graph_12(feature)).unwrap();
    for t in g["tasks"].as_array_mut().unwrap() {
        let file = t["files"]["create"][0].as_str().unwrap().to_string();
        t["verification"]["command"] = json!(format!("{verify} {file}"));
    }
    g.to_string()
}

/// A small Python project, committed: its test (`check_env.py`) reads the gitignored `.env`
/// and must run in the project's venv. The `.env` (mode 0600) is in the checkout, not in git.
fn python_project() -> TestRepo {
    let repo = TestRepo::new();
    std::fs::write(repo.path.join("check_env.py"), CHECK_ENV).unwrap();
    std::fs::write(repo.path.join(".gitignore"), GITIGNORE).unwrap();
    git(&repo.path, &["add", "check_env.py", ".gitignore"]);
    git(&repo.path, &["commit", "-q", "-m", "a python project"]);
    // Private, as a file of secrets is.
    let env = repo.path.join(".env");
    std::fs::write(&env, "# local settings\nGREETING=hello\n").unwrap();
    std::fs::set_permissions(&env, std::fs::Permissions::from_mode(0o600)).unwrap();
    repo
}

#[test]
fn a_python_project_whose_tests_read_a_gitignored_env_completes_with_worktree_copy_and_setup() {
    let repo = python_project();
    repo.write_graph(
        "py",
        &graph_verified_by("py", ".venv/bin/python check_env.py"),
    );
    repo.configure(
        &Config::fake_agent()
            .fast_workers()
            .set("worktree.copy", [".env"])
            .set(
                "worktree.setup",
                ["python3 -m venv --system-site-packages .venv"],
            )
            .set("worktree.setup_when_changed", ["requirements.txt"])
            // The gate runs the project's test on staging: the staging worktree is set up too.
            .gate("project-test", ".venv/bin/python check_env.py", true),
    );
    let d = Daemon::start();
    let out = d.ctl_in(&repo.path, &["rush", "py", "--workers", "3", "--detach"]);
    ok(&out);
    // The user sees what leaves their checkout.
    let said = said(&out);
    assert!(
        said.contains("worktree.copy: 1 ignored file(s)") && said.contains(".env"),
        "{said}"
    );
    let st = d.wait_end(&repo.path, "py", T);
    assert_eq!(st["state"], "complete", "{st}\n{}", monitor(&repo));
    assert_eq!(tasks_with(&st, "complete"), graph_12_ids());
    let log = monitor(&repo);
    assert!(!log.contains("verification_failed"), "{log}");
    // The copies and the venv stay out of every commit.
    let files = repo.files_on("zerg/py/staging");
    assert!(
        !files.iter().any(|f| f == ".env" || f.starts_with(".venv")),
        "{files:?}"
    );
    // Each worker ran the setup once, before its first task, with its output in its log.
    let logs = std::fs::read_dir(repo.path.join(".zerg/logs")).unwrap();
    let mut setups = 0;
    let mut seen = String::new();
    for e in logs.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with("worker-") && name.ends_with(".log") {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            setups += text.matches("worktree.setup[0]: python3 -m venv").count();
            seen.push_str(&format!("== {name}\n{text}\n"));
        }
    }
    assert!(
        (1..=3).contains(&setups),
        "setup runs once per worker process, not per task: {setups}\n{seen}"
    );
    assert!(
        repo.path.join(".zerg/logs/setup-0-level-1.log").exists(),
        "the staging worktree was set up before the gate"
    );
}

#[test]
fn a_verification_command_that_is_not_installed_pauses_the_rush_once_naming_the_fix() {
    let repo = TestRepo::new();
    repo.write_graph("nf", &graph_verified_by("nf", "zz-check"));
    repo.configure(&Config::fake_agent().fast_workers());
    // A directory on zergd's PATH, empty for now: `zz-check` is not installed.
    let bin_dir = repo.path.parent().unwrap().join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let path = path_with(&bin_dir);
    let d = Daemon::builder().env("PATH", path).start();
    let reason = rush_until_paused(&d, &repo, "nf", "3");
    assert!(
        reason.contains("`zz-check` is not installed") && reason.contains("worktree.setup"),
        "{reason}"
    );
    assert!(reason.contains("zergctl retry nf"), "{reason}");
    let log = monitor(&repo);
    assert_eq!(
        log.matches("rush paused: environment error").count(),
        1,
        "one pause, however many workers saw it: {log}"
    );
    assert!(
        !log.contains("verification_failed"),
        "no attempt was spent: {log}"
    );

    // The fix: install it. Then the rush goes on and completes.
    let tool = bin_dir.join("zz-check");
    std::fs::write(&tool, "#!/bin/sh\ntest -f \"$1\"\n").unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    ok(&d.ctl_in(&repo.path, &["retry", "nf"]));
    let st = d.wait_end(&repo.path, "nf", T);
    assert_eq!(st["state"], "complete", "{st}\n{}", monitor(&repo));
    assert_eq!(tasks_with(&st, "complete"), graph_12_ids());
}

#[test]
fn a_failed_worktree_setup_pauses_the_rush_naming_the_command_instead_of_failing_tasks() {
    let repo = TestRepo::new();
    repo.write_graph("sf", &graph_12("sf"));
    repo.configure(
        &Config::fake_agent()
            .fast_workers()
            .set("worktree.setup", ["echo preparing", "exit 3"]),
    );
    let d = Daemon::start();
    let reason = rush_until_paused(&d, &repo, "sf", "2");
    assert!(
        reason.contains("worktree.setup[1] `exit 3` failed (exit 3)"),
        "{reason}"
    );
    let st = d.status(&repo.path, "sf").expect("status");
    assert_eq!(tasks_with(&st, "complete"), Vec::<String>::new(), "{st}");
}

#[test]
fn a_gitignored_file_the_tests_need_but_nobody_copied_pauses_the_rush_naming_worktree_copy() {
    // The issue a new user meets first: the tests read `.env`, which the worktree cannot have.
    let repo = python_project();
    repo.write_graph(
        "nc",
        &graph_verified_by("nc", ".venv/bin/python check_env.py"),
    );
    repo.configure(&Config::fake_agent().fast_workers().set(
        "worktree.setup",
        ["python3 -m venv --system-site-packages .venv"],
    ));
    let d = Daemon::start();
    let reason = rush_until_paused(&d, &repo, "nc", "2");
    assert!(
        reason.contains("`.env` is missing from the worktree") && reason.contains("worktree.copy"),
        "{reason}"
    );
    let log = monitor(&repo);
    assert!(
        !log.contains("verification_failed"),
        "no attempt was spent: {log}"
    );
}

/// Builds `dockerfile` into `tag` with the docker CLI (the classic builder, which takes a
/// local base image without asking any registry), as a user builds their project's image.
/// `context` holds the files the Dockerfile adds.
fn docker_build(tag: &str, dockerfile: &str, context: &std::path::Path) {
    std::fs::write(context.join("Dockerfile"), dockerfile).unwrap();
    let out = std::process::Command::new("docker")
        .args(["build", "-q", "-t", tag])
        .arg(context)
        .env("DOCKER_BUILDKIT", "0")
        .output()
        .expect("docker runs");
    assert!(
        out.status.success(),
        "docker build {tag}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The shared libraries `elf` loads, as `ldd` names them (each at its directory's real path,
/// so that an image whose `/lib` is a symlink gets them where the loader looks).
fn libraries_of(elf: &std::path::Path, into: &mut std::collections::BTreeSet<String>) {
    let out = std::process::Command::new("ldd").arg(elf).output().unwrap();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((_, right)) = line.split_once("=> ") else {
            continue;
        };
        let Some(path) = right.split_whitespace().next().map(std::path::Path::new) else {
            continue;
        };
        if let (Some(dir), Some(name)) = (path.parent(), path.file_name())
            && let Ok(real) = std::fs::canonicalize(dir)
        {
            into.insert(real.join(name).to_string_lossy().into_owned());
        }
    }
}

/// A project's own image with Python, made without a registry: the e2e worker image with this
/// machine's Debian Python (its interpreter, standard library, the wheels `venv` installs pip
/// from, and the libraries they load) added, and with zerg's agent and `worker` user removed,
/// as a project image has neither.
fn python_base(tag: &str) {
    let python = std::path::Path::new("/usr/bin/python3");
    assert!(
        python.exists(),
        "this test takes Python from the machine's /usr/bin/python3 (Debian's python3-venv)"
    );
    let version = std::process::Command::new(python)
        .args(["-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
        .output()
        .unwrap();
    let version = String::from_utf8_lossy(&version.stdout).trim().to_string();
    let interpreter = format!("/usr/bin/python{version}");
    let stdlib = format!("/usr/lib/python{version}");
    let mut paths = std::collections::BTreeSet::from([interpreter.clone(), stdlib.clone()]);
    if std::path::Path::new("/usr/share/python-wheels").exists() {
        paths.insert("/usr/share/python-wheels".into());
    }
    libraries_of(std::path::Path::new(&interpreter), &mut paths);
    for e in std::fs::read_dir(format!("{stdlib}/lib-dynload"))
        .unwrap()
        .flatten()
    {
        libraries_of(&e.path(), &mut paths);
    }
    let context = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("tar")
        .arg("-chf")
        .arg(context.path().join("python.tar"))
        .args(["-C", "/"])
        .args(paths.iter().map(|p| p.trim_start_matches('/')))
        .output()
        .unwrap();
    ok(&out);
    docker_build(
        tag,
        &format!(
            "FROM {}\nUSER 0\nADD python.tar /\nRUN ln -sf python{version} /usr/bin/python3 && sed -i '/^worker:/d' /etc/passwd /etc/group && rm -f /usr/local/bin/zerg-worker-agent\n",
            crate::container::IMAGE
        ),
        context.path(),
    );
}

#[test]
fn a_python_project_completes_in_container_mode_in_an_image_built_from_a_local_base_with_python() {
    if !crate::container::docker_ready() {
        return;
    }
    let (project, worker_image) = ("zerg-python-project:e2e", "zerg-worker:e2e-from-python");
    python_base(project);
    let out = std::process::Command::new(bin("zergctl"))
        .args([
            "image",
            "build",
            "--from",
            project,
            "--tag",
            worker_image,
            "--agent",
        ])
        .arg(bin("zerg-worker-agent"))
        .output()
        .unwrap();
    ok(&out);

    let repo = python_project();
    repo.write_graph(
        "cf",
        &graph_verified_by("cf", ".venv/bin/python check_env.py"),
    );
    repo.configure(
        &crate::container::container_cfg(worker_image)
            .set("worktree.copy", [".env"])
            .set(
                "worktree.setup",
                ["python3 -m venv --system-site-packages .venv"],
            )
            // The gate runs in a container of the same image, in a fresh copy of staging that
            // is set up first.
            .gate("project-test", ".venv/bin/python check_env.py", true),
    );
    let ctx = crate::container::cdaemon();
    crate::container::start_detached(&ctx.d, &repo, "cf", 2);
    let st = ctx.d.wait_end(&repo.path, "cf", crate::container::T);
    assert_eq!(st["state"], "complete", "{st}\n{}", monitor(&repo));
    assert_eq!(tasks_with(&st, "complete"), graph_12_ids());
    let log = monitor(&repo);
    assert!(!log.contains("verification_failed"), "{log}");
    let files = repo.files_on("zerg/cf/staging");
    assert!(
        !files.iter().any(|f| f == ".env" || f.starts_with(".venv")),
        "{files:?}"
    );
    crate::container::wait_no_containers(st["rush_id"].as_str().unwrap_or_default());
    // `--no-prune`: the untagged layers below the image may be the cache another test's build
    // is standing on right now (the same `FROM` and `USER 0`); removing them fails that build
    // with `unknown parent image ID`.
    let _ = std::process::Command::new("docker")
        .args(["rmi", "-f", "--no-prune", worker_image, project])
        .output();
}

/// A remote rush (`mode`: swarm or kubernetes, with `cfg` and the daemon of `ctx`) of a
/// project whose test tool needs two ignored files of the checkout, in a worker image built
/// `--from` the project's own: the files come over the worker plane, survive the worker's
/// `git clean` between tasks, and stay out of its commits.
fn remote_rush_gets_copies_in_a_project_image(
    mode: &str,
    cfg: Config,
    ctx: &mut crate::container::Ctx,
) -> String {
    // The project's own image: a test tool that needs both copies (`zz-check`), a shell and
    // git, as root, with no zerg agent and no `worker` user.
    let project = format!("zerg-project:e2e-{mode}");
    let worker_image = format!("zerg-worker:e2e-from-{mode}");
    let context = tempfile::tempdir().unwrap();
    docker_build(
        &project,
        &format!(
            "FROM {}\nUSER 0\nRUN sed -i '/^worker:/d' /etc/passwd /etc/group && rm -f /usr/local/bin/zerg-worker-agent && printf '#!/bin/sh\\ngrep -q GREETING=hello .env && test -f config/local.json && test -f \"$1\"\\n' > /usr/local/bin/zz-check && chmod 755 /usr/local/bin/zz-check\n",
            crate::container::IMAGE
        ),
        context.path(),
    );
    let out = std::process::Command::new(bin("zergctl"))
        .args(["image", "build", "--from", &project, "--tag", &worker_image])
        .arg("--agent")
        .arg(bin("zerg-worker-agent"))
        .output()
        .unwrap();
    ok(&out);

    let repo = python_project();
    // A second copied file, ignored only by the checkout's own `.git/info/exclude` (which a
    // remote worker's repository does not have): it must survive the worker's `git clean`
    // between tasks and stay out of its commits.
    std::fs::create_dir_all(repo.path.join("config")).unwrap();
    std::fs::write(repo.path.join("config/local.json"), "{\"port\": 1}\n").unwrap();
    let exclude = repo.path.join(".git/info/exclude");
    let mut ex = std::fs::read_to_string(&exclude).unwrap_or_default();
    ex.push_str("\nconfig/local.json\n");
    std::fs::write(&exclude, ex).unwrap();
    repo.write_graph("rc", &graph_verified_by("rc", "zz-check"));
    repo.configure(
        &cfg.set("container.image", worker_image.as_str())
            .set("worktree.copy", [".env", "config/"]),
    );
    let d = &mut ctx.d;
    let out = d.ctl_in(
        &repo.path,
        &["rush", "rc", "--workers", "2", "--mode", mode, "--detach"],
    );
    ok(&out);
    let said = said(&out);
    assert!(
        said.contains("over the worker plane to every worker") && said.contains(".env"),
        "{said}"
    );
    let st = d.wait_end(&repo.path, "rc", crate::container::T);
    assert_eq!(st["state"], "complete", "{st}\n{}", monitor(&repo));
    assert_eq!(st["mode"], mode);
    assert_eq!(tasks_with(&st, "complete"), graph_12_ids());
    assert!(!monitor(&repo).contains("verification_failed"));
    let files = repo.files_on("zerg/rc/staging");
    assert!(
        !files
            .iter()
            .any(|f| f == ".env" || f.starts_with("config/")),
        "{files:?}"
    );
    // `--no-prune`: the untagged layers below the image may be the cache another test's build
    // is standing on right now (the same `FROM` and `USER 0`); removing them fails that build
    // with `unknown parent image ID`.
    let _ = std::process::Command::new("docker")
        .args(["rmi", "-f", "--no-prune", &worker_image, &project])
        .output();
    st["rush_id"].as_str().unwrap_or_default().to_string()
}

#[test]
fn a_swarm_rush_in_an_image_built_from_the_projects_own_gets_env_over_the_worker_plane() {
    let Some(_swarm) = crate::remote::swarm() else {
        return;
    };
    let mut ctx = crate::container::cdaemon();
    let rush = remote_rush_gets_copies_in_a_project_image(
        "swarm",
        crate::remote::swarm_cfg(free_port()),
        &mut ctx,
    );
    crate::remote::wait_nothing_left(&rush);
}

#[test]
fn a_kubernetes_rush_in_an_image_built_from_the_projects_own_gets_env_over_the_worker_plane() {
    if !crate::container::docker_ready() {
        return;
    }
    let api = KubeApi::start();
    let namespace = "zerg-e2e-env";
    let cfg = crate::container::container_cfg(crate::container::IMAGE)
        .set("remote.listen", format!("127.0.0.1:{}", free_port()))
        .set("kubernetes.namespace", namespace)
        .set("kubernetes.cpu_request", "100m")
        .set("kubernetes.memory_request", "64Mi");
    let mut ctx = crate::container::cdaemon_with(vec![(
        "KUBECONFIG".into(),
        api.kubeconfig(namespace).to_string_lossy().into_owned(),
    )]);
    remote_rush_gets_copies_in_a_project_image("kubernetes", cfg, &mut ctx);
}

#[test]
fn setup_runs_again_only_when_a_level_merge_changed_a_setup_when_changed_file() {
    let repo = TestRepo::new();
    std::fs::write(repo.path.join("requirements.txt"), "first==1\n").unwrap();
    git(&repo.path, &["add", "requirements.txt"]);
    git(&repo.path, &["commit", "-q", "-m", "requirements"]);
    // Level 1 changes the lock file; level 2 has two tasks on the one worker, with the same
    // base: setup runs before the first task, once after the merge, and not again.
    repo.write_graph(
        "sw",
        &json!({"feature": "sw", "tasks": [
            {"id": "S-L1-001", "title": "bump", "level": 1,
             "files": {"create": [], "modify": ["requirements.txt"], "read": []}},
            {"id": "S-L2-001", "title": "a", "level": 2, "dependencies": ["S-L1-001"],
             "files": {"create": ["a.txt"], "modify": [], "read": []}},
            {"id": "S-L2-002", "title": "b", "level": 2, "dependencies": ["S-L1-001"],
             "files": {"create": ["b.txt"], "modify": [], "read": []}}
        ]})
        .to_string(),
    );
    let runs = repo.path.parent().unwrap().join("setup-runs");
    repo.configure(
        &Config::fake_agent()
            .fast_workers()
            .set(
                "worktree.setup",
                [format!("sha1sum requirements.txt >> '{}'", runs.display())],
            )
            .set("worktree.setup_when_changed", ["requirements.txt"]),
    );
    let d = Daemon::start();
    ok(&d.ctl_in(&repo.path, &["rush", "sw", "--workers", "1", "--detach"]));
    let st = d.wait_end(&repo.path, "sw", T);
    assert_eq!(st["state"], "complete", "{st}\n{}", monitor(&repo));
    let lines: Vec<String> = std::fs::read_to_string(&runs)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(lines.len(), 2, "setup runs: {lines:?}");
    assert_ne!(
        lines[0], lines[1],
        "the second run saw the new lock file: {lines:?}"
    );
}

/// Runs graph 12 on two workers, every task's check needing what `setup` made (a directory of
/// its own, as a venv or `node_modules` is, and a generated file beside tracked ones), in a
/// repository that ignores nothing and tracks `NOTES.md`; returns the files on staging and how
/// many times the setup ran.
fn rush_with_setup(feature: &str, setup: &str) -> (TestRepo, Vec<String>, usize) {
    let repo = TestRepo::new();
    std::fs::write(repo.path.join("NOTES.md"), "notes\n").unwrap();
    git(&repo.path, &["add", "NOTES.md"]);
    git(&repo.path, &["commit", "-qm", "notes"]);
    repo.write_graph(
        feature,
        &graph_verified_by(
            feature,
            "test -f deps/lib/a.txt && test -f gen.txt && test -f",
        ),
    );
    repo.configure(
        &Config::fake_agent()
            .fast_workers()
            .set("worktree.setup", [setup]),
    );
    let d = Daemon::start();
    ok(&d.ctl_in(&repo.path, &["rush", feature, "--workers", "2", "--detach"]));
    let st = d.wait_end(&repo.path, feature, T);
    assert_eq!(st["state"], "complete", "{st}\n{}", monitor(&repo));
    assert_eq!(tasks_with(&st, "complete"), graph_12_ids());
    let files = repo.files_on(&format!("zerg/{feature}/staging"));
    assert!(
        !files
            .iter()
            .any(|f| f == "gen.txt" || f.starts_with("deps")),
        "what the setup made reached staging: {files:?}"
    );
    let mut runs = 0;
    for e in std::fs::read_dir(repo.path.join(".zerg/logs"))
        .unwrap()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with("worker-") && name.ends_with(".log") {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            runs += text.matches("worktree.setup[0]: mkdir").count();
        }
    }
    (repo, files, runs)
}

const MAKE_DEPS: &str = "mkdir -p deps/lib && echo a > deps/lib/a.txt && echo gen > gen.txt";

#[test]
fn what_only_worktree_setup_makes_stays_off_staging_and_serves_every_later_task() {
    let (_repo, _files, runs) = rush_with_setup("su", MAKE_DEPS);
    // Once per worker process: what it made survived every move between tasks.
    assert!((1..=2).contains(&runs), "setup ran {runs} times");
}

#[test]
fn a_tracked_file_only_worktree_setup_changed_is_put_back_before_each_commit() {
    let (repo, _files, runs) =
        rush_with_setup("st", &format!("{MAKE_DEPS} && echo setup >> NOTES.md"));
    assert_eq!(
        git(&repo.path, &["show", "zerg/st/staging:NOTES.md"]),
        "notes",
        "a tracked file only the setup changed stays as it was"
    );
    // Put back, it is the setup's again before the next task.
    assert!(runs > 2, "setup ran {runs} times");
}
