//! Support code for zerg's end-to-end tests: scratch git repositories, a real zergd on a
//! private Unix socket, zergctl invocations, and the standard task graphs.
//!
//! The toolkit every test uses: [`git`] with an explicit identity, [`wait_until`] (which names
//! what it waited for when it gives up), [`Config`] (`.zerg/config.yaml` with typed overrides),
//! [`running_worker`] ("which worker runs this task"), and [`skip`] / [`docker_or_skip`] (a
//! skip prints why, and fails where the test must run). The zergd a test starts
//! ([`Daemon::builder`]) has an empty home and no git identity unless the test asks for one.
//!
//! The binaries under test are the workspace's own (`zergd`, `zergctl`, `zerg-worker-agent`,
//! `fake-claude`), taken from the cargo target directory: build them with
//! `cargo build --workspace --bins` before running the tests (the README's test command does).

pub mod browser;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

/// The target directory holding the workspace binaries.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // A test: target/<profile>/deps/e2e-<hash>; a binary of this crate (zerg-bench):
    // target/<profile>/zerg-bench. Either way, target/<profile>.
    let mut dir = exe.parent().expect("target dir").to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    for b in ["zergd", "zergctl", "zerg-worker-agent", "fake-claude"] {
        assert!(
            dir.join(b).exists(),
            "{} is missing: run `cargo build --workspace --bins` before the end-to-end tests",
            dir.join(b).display()
        );
    }
    dir
}

/// Path of one workspace binary.
pub fn bin(name: &str) -> PathBuf {
    bin_dir().join(name)
}

pub use zerg_proto::testkit::{
    IDENTITY, docker_engine, docker_or_skip, git, poll, skip, skipping_forbidden, wait_until,
};

/// A scratch git repository with one commit on `main`.
pub struct TestRepo {
    _dir: tempfile::TempDir,
    /// Repository root.
    pub path: PathBuf,
}

impl TestRepo {
    /// Creates the repository.
    pub fn new() -> TestRepo {
        TestRepo::with_object_format("sha1")
    }

    /// Creates the repository with object ids of `format` (`sha1` or `sha256`).
    pub fn with_object_format(format: &str) -> TestRepo {
        let dir = tempfile::Builder::new()
            .prefix("zerg-e2e-")
            .tempdir()
            .expect("tempdir");
        let path = dir.path().join("repo");
        std::fs::create_dir_all(&path).expect("mkdir");
        git(
            &path,
            &[
                "init",
                "-q",
                "-b",
                "main",
                &format!("--object-format={format}"),
            ],
        );
        std::fs::write(path.join("README.md"), "# test repo\n").expect("write");
        git(&path, &["add", "-A"]);
        git(&path, &["commit", "-q", "-m", "initial"]);
        TestRepo { _dir: dir, path }
    }

    /// Waits until no git worktree of a rush is left in the repository (a readiness wait; the
    /// bound only ends a hung test). zergd removes a completed rush's worktrees once its workers
    /// are gone, after `rush` has returned; `git fsck` of a worktree half removed sees a `HEAD`
    /// that points at nothing.
    pub fn wait_worktrees_removed(&self) {
        let admin = self.path.join(".git/worktrees");
        assert!(
            poll(Duration::from_secs(60), || std::fs::read_dir(&admin)
                .map_or(true, |mut rd| rd.next().is_none())),
            "the rush's worktrees were not removed: {:?}",
            std::fs::read_dir(&admin)
                .map(|rd| rd.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
        );
    }

    /// Writes `.gsd/specs/<feature>/task-graph.json` and a `design.md` beside it, and commits
    /// the spec directory, as users of the original do (its design step writes the spec and
    /// people commit it).
    pub fn write_graph(&self, feature: &str, graph: &str) {
        let d = self.path.join(".gsd/specs").join(feature);
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::write(d.join("task-graph.json"), graph).expect("write graph");
        std::fs::write(
            d.join("design.md"),
            format!("# {feature}\n\nThe design of {feature}, committed with the graph.\n"),
        )
        .expect("write design");
        self.commit_spec(feature);
    }

    /// Commits `.gsd/specs/<feature>/` as it is now.
    pub fn commit_spec(&self, feature: &str) {
        let rel = format!(".gsd/specs/{feature}");
        git(&self.path, &["add", "--", &rel]);
        if !git(&self.path, &["status", "--porcelain", "--", &rel]).is_empty() {
            git(
                &self.path,
                &["commit", "-q", "-m", &format!("spec: {feature}")],
            );
        }
    }

    /// The tree id of `.gsd/specs/<feature>` on a revision: equal ids mean byte-identical
    /// spec files.
    pub fn spec_tree(&self, rev: &str, feature: &str) -> String {
        git(
            &self.path,
            &["rev-parse", &format!("{rev}:.gsd/specs/{feature}")],
        )
    }

    /// Writes the fake agent's script into the spec directory (`fake-claude.json`).
    pub fn write_script(&self, feature: &str, script: &Value) {
        let d = self.path.join(".gsd/specs").join(feature);
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::write(
            d.join("fake-claude.json"),
            serde_json::to_vec_pretty(script).expect("json"),
        )
        .expect("write script");
        self.commit_spec(feature);
    }

    /// Writes `.zerg/config.yaml`: [`Config::fake_agent`] plus `extra` YAML lines (whole
    /// sections, such as [`FAST_WORKERS`]). [`TestRepo::configure`] takes a [`Config`] instead.
    pub fn write_config(&self, extra: &str) {
        let mut text = Config::fake_agent().yaml();
        text.push_str(extra);
        text.push('\n');
        self.write_config_text(&text);
    }

    /// Writes `config` to `.zerg/config.yaml`.
    pub fn configure(&self, config: &Config) {
        self.write_config_text(&config.yaml());
    }

    /// Writes `text` to `.zerg/config.yaml` as it is (for a test of what zergd makes of a
    /// file that is not what [`Config`] writes).
    pub fn write_config_text(&self, text: &str) {
        std::fs::create_dir_all(self.path.join(".zerg")).expect("mkdir");
        std::fs::write(self.path.join(".zerg/config.yaml"), text).expect("write config");
    }

    /// `git status --porcelain --untracked-files=all` of the user's checkout, as a set of lines.
    pub fn status_porcelain(&self) -> std::collections::BTreeSet<String> {
        git(
            &self.path,
            &["status", "--porcelain", "--untracked-files=all"],
        )
        .lines()
        .map(str::to_string)
        .collect()
    }

    /// Task-ID trailers of the commits on `branch` that are not on `main`.
    pub fn task_ids_on(&self, branch: &str) -> Vec<String> {
        let out = git(
            &self.path,
            &[
                "log",
                "--format=%(trailers:key=Task-ID,valueonly)",
                &format!("main..{branch}"),
            ],
        );
        let mut ids: Vec<String> = out
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        ids.sort();
        ids
    }

    /// Files on `branch` (`git ls-tree`).
    pub fn files_on(&self, branch: &str) -> Vec<String> {
        git(&self.path, &["ls-tree", "-r", "--name-only", branch])
            .lines()
            .map(str::to_string)
            .collect()
    }
}

impl Default for TestRepo {
    fn default() -> Self {
        Self::new()
    }
}

/// A required quality gate as loud as a real test suite (`seq 1 40000` prints about 230 KB).
pub const NOISY_GATE: &str = "quality_gates:
  - {name: noisy-test, command: 'seq 1 40000', required: true, timeout: 120}
";

/// Fast resilience settings for tests (values in seconds): short enough for the chaos tests,
/// long enough that a loaded 2-core CI machine does not produce false stale detections.
pub const FAST_WORKERS: &str = "workers:
  heartbeat_interval_seconds: 0.2
  heartbeat_stale_threshold: 4
  task_stale_timeout_seconds: 5
  backoff_base_seconds: 0.1
  backoff_max_seconds: 0.5
  spawn_backoff_base_seconds: 0.1
  spawn_backoff_max_seconds: 0.5
  stop_grace_seconds: 0.5
  spawn_ready_timeout_seconds: 20
  reconcile_interval_seconds: 1
  usage_limit_margin_seconds: 0.5
";

/// A test's `.zerg/config.yaml`, built as data: start from [`Config::new`] (zergd's defaults)
/// or [`Config::fake_agent`], change keys with [`Config::set`], write it with
/// [`TestRepo::configure`]. No YAML is built or edited as text.
#[derive(Debug, Clone, PartialEq)]
pub struct Config(Value);

impl Default for Config {
    fn default() -> Self {
        Self::new()
    }
}

impl Config {
    /// No key set: zergd's defaults for everything.
    pub fn new() -> Config {
        Config(Value::Object(Default::default()))
    }

    /// The fake agent CLI (`fake-claude --print --dangerously-skip-permissions`), a 120 s agent
    /// timeout and `FAKE_CLAUDE_*` passed through to it: what [`TestRepo::write_config`] starts
    /// from. `sandbox.mode` is `off`: these tests' scripts meet at files in the test's own temp
    /// dirs and watch the workers' processes from the host, which the sandbox keeps apart. The
    /// sandbox's own tests (`e2e/sandbox.rs`), the real-CLI tests and the demo run with zergd's
    /// default, `auto`.
    pub fn fake_agent() -> Config {
        Config::new()
            .agent_command(&[
                &bin("fake-claude").to_string_lossy(),
                "--print",
                "--dangerously-skip-permissions",
            ])
            .set("agent.timeout_seconds", 120)
            .set("agent.env_passthrough", ["FAKE_CLAUDE_*"])
            .set("sandbox.mode", "off")
    }

    /// With [`FAST_WORKERS`]' resilience settings.
    pub fn fast_workers(self) -> Config {
        self.merge_yaml(FAST_WORKERS)
    }

    /// With [`NOISY_GATE`] among the quality gates.
    pub fn noisy_gate(self) -> Config {
        self.gate("noisy-test", "seq 1 40000", true)
    }

    /// `agent.command`.
    pub fn agent_command(self, argv: &[&str]) -> Config {
        self.set("agent.command", argv)
    }

    /// Adds a quality gate (`quality_gates:`) with a 120 s timeout.
    pub fn gate(mut self, name: &str, command: &str, required: bool) -> Config {
        let gates = self.slot("quality_gates");
        if !gates.is_array() {
            *gates = Value::Array(vec![]);
        }
        gates
            .as_array_mut()
            .expect("an array")
            .push(serde_json::json!(
                {"name": name, "command": command, "required": required, "timeout": 120}
            ));
        self
    }

    /// Sets the key at `path` (dotted, such as `workers.retry_attempts`) to `value`, making
    /// the sections on the way.
    pub fn set(mut self, path: &str, value: impl serde::Serialize) -> Config {
        *self.slot(path) = serde_json::to_value(value).expect("a value JSON can hold");
        self
    }

    /// Removes the key at `path` (dotted), so zergd's default applies.
    pub fn unset(mut self, path: &str) -> Config {
        let (section, key) = path.rsplit_once('.').unwrap_or(("", path));
        let parent = if section.is_empty() {
            &mut self.0
        } else {
            self.slot(section)
        };
        if let Some(m) = parent.as_object_mut() {
            m.remove(key);
        }
        self
    }

    /// The value at `path` (dotted), `Null` when unset.
    pub fn get(&self, path: &str) -> &Value {
        path.split('.')
            .try_fold(&self.0, |v, k| v.get(k))
            .unwrap_or(&Value::Null)
    }

    /// The YAML text.
    pub fn yaml(&self) -> String {
        serde_yaml::to_string(&self.0).expect("YAML")
    }

    /// The slot at a dotted path, made (as an empty section) where missing.
    fn slot(&mut self, path: &str) -> &mut Value {
        path.split('.').fold(&mut self.0, |v, k| {
            if !v.is_object() {
                *v = Value::Object(Default::default());
            }
            v.as_object_mut()
                .expect("a section")
                .entry(k)
                .or_insert(Value::Null)
        })
    }

    /// Merges a YAML document of settings in, key by key (sections recursively).
    pub fn merge_yaml(mut self, yaml: &str) -> Config {
        fn merge(into: &mut Value, from: Value) {
            match (into, from) {
                (Value::Object(a), Value::Object(b)) => {
                    for (k, v) in b {
                        merge(a.entry(k).or_insert(Value::Null), v);
                    }
                }
                (slot, v) => *slot = v,
            }
        }
        let doc: Value = serde_yaml::from_str(yaml).expect("settings in YAML");
        merge(&mut self.0, doc);
        self
    }
}

/// How a test's zergd is started: [`Daemon::builder`].
#[derive(Debug, Default)]
pub struct DaemonBuilder {
    env: Vec<(String, String)>,
    unset: Vec<String>,
    git_identity: bool,
    state_files: Vec<(PathBuf, String)>,
}

impl DaemonBuilder {
    /// One more variable in zergd's environment; an empty value removes it.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> DaemonBuilder {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Variables for zergd's environment, as [`DaemonBuilder::env`] takes them one by one.
    pub fn envs(mut self, vars: Vec<(String, String)>) -> DaemonBuilder {
        self.env.extend(vars);
        self
    }

    /// A variable of the tests' own environment that zergd does not inherit.
    pub fn unset(mut self, key: impl Into<String>) -> DaemonBuilder {
        self.unset.push(key.into());
        self
    }

    /// Gives git a commit identity in zergd's home ([`IDENTITY`] as `user.name` and
    /// `user.email` in its `.gitconfig`), for a test about what happens where git has one. By
    /// default it has none, as on a fresh machine, and may not guess one (`user.useConfigOnly`).
    pub fn git_identity(mut self) -> DaemonBuilder {
        self.git_identity = true;
        self
    }

    /// A file in zergd's state directory (`rel` below it) before zergd first starts, such as
    /// an old log of its own. Files are written in the order given.
    pub fn state_file(mut self, rel: impl Into<PathBuf>, text: impl Into<String>) -> DaemonBuilder {
        self.state_files.push((rel.into(), text.into()));
        self
    }

    /// Starts zergd and waits until it answers.
    pub fn start(self) -> Daemon {
        let d = self.start_unready();
        d.wait_answering();
        d
    }

    /// Starts zergd and returns at once, before anything has connected to its socket (for a
    /// test of what zergd does before its first client). [`Daemon::wait_answering`] waits.
    pub fn start_unready(self) -> Daemon {
        let dir = tempfile::Builder::new()
            .prefix("zergd-")
            .tempdir()
            .expect("tempdir");
        for (rel, text) in &self.state_files {
            let path = dir.path().join("state").join(rel);
            std::fs::create_dir_all(path.parent().expect("a file in a directory")).expect("mkdir");
            std::fs::write(&path, text).expect("write a state file");
        }
        let socket = dir.path().join("run").join("zergd.sock");
        let home = dir.path().join("home");
        std::fs::create_dir_all(home.join(".config")).expect("mkdir home");
        // Without an identity git may not guess one from the host name either, as it would
        // where the machine's name has a domain.
        let user = if self.git_identity {
            format!("\tname = {}\n\temail = {}\n", IDENTITY.0, IDENTITY.1)
        } else {
            "\tuseConfigOnly = true\n".to_string()
        };
        std::fs::write(home.join(".gitconfig"), format!("[user]\n{user}"))
            .expect("write .gitconfig");
        let mut d = Daemon {
            child: None,
            dir,
            socket,
            home,
            env: self.env,
            unset: self.unset,
        };
        d.spawn();
        d
    }
}

/// Variables through which git would find an identity or a configuration outside the empty
/// home a test's zergd runs with; zergd and zergctl never inherit them.
const GIT_IDENTITY_VARS: &[&str] = &[
    "GIT_CONFIG_GLOBAL",
    "GIT_CONFIG_SYSTEM",
    "GIT_AUTHOR_NAME",
    "GIT_AUTHOR_EMAIL",
    "GIT_COMMITTER_NAME",
    "GIT_COMMITTER_EMAIL",
    "EMAIL",
    "XDG_CONFIG_DIRS",
];

/// A zergd started for one test, on a private socket and state directory, with a home of its
/// own (empty, with no git identity unless [`DaemonBuilder::git_identity`]).
pub struct Daemon {
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// Control socket.
    pub socket: PathBuf,
    /// zergd's `HOME` (and, under `.config`, its `XDG_CONFIG_HOME`); zergctl runs with it too.
    pub home: PathBuf,
    env: Vec<(String, String)>,
    unset: Vec<String>,
}

impl Daemon {
    /// How to start zergd: with more variables in its environment, fewer, or a git identity.
    pub fn builder() -> DaemonBuilder {
        DaemonBuilder::default()
    }

    /// Starts zergd and waits until it answers.
    pub fn start() -> Daemon {
        Self::builder().start()
    }

    /// Starts zergd with extra environment variables; an empty value removes the variable from
    /// zergd's environment. The machine the tests run on counts as a sandbox: zergd gets
    /// `IS_SANDBOX=1` (which lets the agent command hold `--dangerously-skip-permissions` when
    /// the tests run as root) unless `env` names it.
    pub fn start_with_env(env: Vec<(String, String)>) -> Daemon {
        Self::builder().envs(env).start()
    }

    /// Starts zergd with extra environment variables and without the ones named in `unset`.
    pub fn start_with(env: Vec<(String, String)>, unset: Vec<String>) -> Daemon {
        let mut b = Self::builder().envs(env);
        for k in unset {
            b = b.unset(k);
        }
        b.start()
    }

    /// The environment every zergd and zergctl of this test starts from: its own empty home,
    /// and git without system config or identity.
    fn isolate(&self, cmd: &mut Command) {
        for k in GIT_IDENTITY_VARS {
            cmd.env_remove(k);
        }
        cmd.env("HOME", &self.home)
            .env("XDG_CONFIG_HOME", self.home.join(".config"))
            .env("GIT_CONFIG_NOSYSTEM", "1");
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("zergd.log"))
            .expect("log");
        // A profiler around zergd (`ZERG_TEST_ZERGD_WRAPPER="heaptrack -o /tmp/zergd"`): the
        // words of the variable, then zergd and its arguments.
        let wrapper = std::env::var("ZERG_TEST_ZERGD_WRAPPER").unwrap_or_default();
        let mut words = wrapper.split_whitespace();
        let mut cmd = match words.next() {
            Some(program) => {
                let mut c = Command::new(program);
                c.args(words).arg(bin("zergd"));
                c
            }
            None => Command::new(bin("zergd")),
        };
        self.isolate(&mut cmd);
        // What the test unsets goes first: what it sets wins.
        for k in &self.unset {
            cmd.env_remove(k);
        }
        if !self.env.iter().any(|(k, _)| k == "IS_SANDBOX") {
            cmd.env("IS_SANDBOX", "1");
        }
        for (k, v) in &self.env {
            if v.is_empty() {
                cmd.env_remove(k);
            } else {
                cmd.env(k, v);
            }
        }
        let child = cmd
            .arg("--socket")
            .arg(&self.socket)
            .arg("--state-dir")
            .arg(self.state_dir())
            .env("ZERG_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("zergd starts");
        self.child = Some(child);
    }

    /// Waits until zergd answers on its socket.
    pub fn wait_answering(&self) {
        if !poll(Duration::from_secs(20), || {
            self.ctl(&["list"]).status.success()
        }) {
            panic!(
                "zergd did not answer on {}; log:\n{}",
                self.socket.display(),
                self.log()
            );
        }
    }

    /// zergd's own log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("zergd.log")).unwrap_or_default()
    }

    /// The zergd process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// `kill -9` zergd (workers keep running).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// zergd's state directory (`--state-dir`).
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// zergd's own rotated log files (`<state dir>/logs/`), concatenated.
    pub fn state_log(&self) -> String {
        let mut out = String::new();
        if let Ok(rd) = std::fs::read_dir(self.state_dir().join("logs")) {
            for e in rd.flatten() {
                out.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
            }
        }
        out
    }

    /// SIGTERM to zergd, as a service manager stops it; waits for it to exit and returns how.
    pub fn sigterm(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("zergd is running");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(c.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("signal zergd");
        c.wait().expect("wait for zergd")
    }

    /// Starts zergd again on the same socket and state directory.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
        self.wait_answering();
    }

    /// Runs zergctl against this daemon.
    pub fn ctl(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(bin("zergctl"));
        self.isolate(&mut cmd);
        cmd.args(args)
            .env("ZERG_SOCKET", &self.socket)
            .stdin(Stdio::null())
            .output()
            .expect("zergctl runs")
    }

    /// Runs zergctl in a repository.
    pub fn ctl_in(&self, repo: &Path, args: &[&str]) -> Output {
        let mut cmd = Command::new(bin("zergctl"));
        self.isolate(&mut cmd);
        cmd.args(args)
            .current_dir(repo)
            .env("ZERG_SOCKET", &self.socket)
            .stdin(Stdio::null())
            .output()
            .expect("zergctl runs")
    }

    /// Runs zergctl in a repository with more variables in its environment (`PATH`).
    pub fn ctl_in_env(&self, repo: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(bin("zergctl"));
        self.isolate(&mut cmd);
        cmd.args(args)
            .current_dir(repo)
            .env("ZERG_SOCKET", &self.socket)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .output()
            .expect("zergctl runs")
    }

    /// `zergctl status FEATURE --json`, or `None` if the command failed.
    pub fn status(&self, repo: &Path, feature: &str) -> Option<Value> {
        let out = self.ctl_in(repo, &["status", feature, "--json"]);
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Polls status until `pred` holds; panics with the last status and the daemon log after
    /// `timeout`. This is a readiness wait, not a timing assertion: the timeout only bounds a
    /// hung test.
    pub fn wait_for(
        &self,
        repo: &Path,
        feature: &str,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let mut last = None;
        let mut found = None;
        let ready = poll(timeout, || match self.status(repo, feature) {
            Some(st) if pred(&st) => {
                found = Some(st);
                true
            }
            Some(st) => {
                last = Some(st);
                false
            }
            None => false,
        });
        match found {
            Some(st) if ready => st,
            _ => panic!(
                "timed out waiting for {what}; last status:\n{}\nzergd log:\n{}",
                serde_json::to_string_pretty(&last).unwrap_or_default(),
                self.log()
            ),
        }
    }

    /// Waits until the rush reaches a terminal state and returns the status.
    pub fn wait_end(&self, repo: &Path, feature: &str, timeout: Duration) -> Value {
        self.wait_for(repo, feature, timeout, "the rush to end", |s| {
            matches!(s["state"].as_str(), Some("complete" | "failed" | "stopped"))
        })
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // Leave nothing running: stop every rush, then the daemon.
        if let Ok(list) = serde_json::from_slice::<Value>(&self.ctl(&["list", "--json"]).stdout) {
            for r in list.as_array().into_iter().flatten() {
                if let (Some(repo), Some(f)) = (r["repo"].as_str(), r["feature"].as_str()) {
                    let _ = self.ctl(&["stop", f, "--force", "--repo", repo]);
                }
            }
        }
        self.kill9();
    }
}

/// Process ids of a rush's workers from a status document.
pub fn worker_pids(status: &Value) -> Vec<i32> {
    status["workers"]
        .as_object()
        .map(|m| {
            m.values()
                .filter_map(|w| w["pid"].as_i64())
                .map(|p| p as i32)
                .collect()
        })
        .unwrap_or_default()
}

/// A worker that is running a task, from a status document ([`running_worker`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunningWorker {
    /// The worker's id (its key in `workers`).
    pub id: String,
    /// Its process (subprocess mode).
    pub pid: Option<i32>,
    /// Its container (container mode).
    pub container_id: Option<String>,
}

/// The worker running `task`: the one whose `current_task` it is, in status `running`.
pub fn running_worker(status: &Value, task: &str) -> Option<RunningWorker> {
    let (id, w) = status["workers"]
        .as_object()?
        .iter()
        .find(|(_, w)| w["current_task"] == task && w["status"] == "running")?;
    Some(RunningWorker {
        id: id.clone(),
        pid: w["pid"].as_i64().and_then(|p| i32::try_from(p).ok()),
        container_id: w["container_id"]
            .as_str()
            .filter(|c| !c.is_empty())
            .map(str::to_string),
    })
}

/// Whether a process exists (and is not a zombie).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rfind(')')
            .and_then(|i| s[i + 1..].split_whitespace().next())
            .is_some_and(|st| st != "Z" && st != "X"),
        Err(_) => false,
    }
}

/// Ids of tasks by status.
pub fn tasks_with(status: &Value, want: &str) -> Vec<String> {
    let mut v: Vec<String> = status["tasks"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter(|(_, t)| t["status"] == want)
                .map(|(k, _)| k.clone())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// A graph of `levels` levels of `per_level` independent tasks each (every task of a level
/// depends on nothing, so the levels are the only ordering); each task creates one file.
pub fn graph_wide(feature: &str, levels: u32, per_level: u32) -> String {
    let mut tasks = Vec::new();
    for l in 1..=levels {
        for i in 1..=per_level {
            tasks.push(serde_json::json!({
                "id": format!("W-L{l}-{i:05}"), "title": format!("Level {l} part {i}"), "level": l,
                "dependencies": [],
                "files": {"create": [format!("w/l{l}/t{i}.txt")], "modify": [], "read": []}
            }));
        }
    }
    serde_json::json!({"feature": feature, "tasks": tasks}).to_string()
}

/// A loopback port free when asked (the listener that found it is closed again).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// The HTTP/1.1 requests the stand-in servers (`messages-api`, `kube-api`) read: one at a time
/// per connection, a body by `Content-Length` or chunked.
pub mod http1 {
    use std::io::BufRead;

    /// One request as read.
    pub struct Request {
        /// `GET`, `POST`, …
        pub method: String,
        /// The path and query, as sent.
        pub target: String,
        /// The body, de-chunked.
        pub body: Vec<u8>,
    }

    /// Reads the next request from `r`; `None` when the peer closed the connection first.
    pub fn read_request(r: &mut impl BufRead) -> std::io::Result<Option<Request>> {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_string();
        let target = parts.next().unwrap_or("").to_string();
        let mut length = 0usize;
        let mut chunked = false;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h)? == 0 {
                break;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
                if k == "content-length" {
                    length = v.parse().unwrap_or(0);
                } else if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
                    chunked = true;
                }
            }
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                let mut size = String::new();
                r.read_line(&mut size)?;
                let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16)
                    .unwrap_or(0);
                let mut chunk = vec![0; n + 2];
                r.read_exact(&mut chunk)?;
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..n]);
            }
        } else {
            body.resize(length, 0);
            r.read_exact(&mut body)?;
        }
        Ok(Some(Request {
            method,
            target,
            body,
        }))
    }
}

/// What `/proc` says of one process: memory and CPU.
pub mod procfs {
    /// Resident set size and its peak (VmHWM), in KiB.
    pub fn mem_kib(pid: i32) -> Option<(u64, u64)> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| {
            s.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        };
        Some((field("VmRSS:")?, field("VmHWM:")?))
    }

    /// CPU time (user + system) of the process itself, in seconds.
    pub fn cpu_s(pid: i32) -> Option<f64> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = &s[s.rfind(')')? + 1..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
        // USER_HZ is 100 on Linux.
        Some(ticks as f64 / 100.0)
    }

    /// CPU time of the process and of every child it has waited for (and so of their
    /// children in turn), in seconds: `utime + stime + cutime + cstime`.
    pub fn cpu_tree_s(pid: i32) -> Option<f64> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = &s[s.rfind(')')? + 1..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let mut ticks = 0u64;
        for i in 11..=14 {
            ticks += f.get(i)?.parse::<u64>().ok()?;
        }
        Some(ticks as f64 / 100.0)
    }

    /// One field of `/proc/<pid>/io`.
    fn io_field(pid: i32, name: &str) -> Option<u64> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
        s.lines()
            .find(|l| l.strip_prefix(name).is_some_and(|r| r.starts_with(':')))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    }

    /// Bytes the process has passed to write(2) and friends, to files, pipes and sockets alike
    /// (`wchar` of `/proc/<pid>/io`).
    pub fn written_bytes(pid: i32) -> Option<u64> {
        io_field(pid, "wchar")
    }

    /// The state letter (`R`, `S`, `T` for stopped, `Z`, …) and process group of a process.
    pub fn state_and_group(pid: i32) -> Option<(char, i32)> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let mut f = s[s.rfind(')')? + 1..].split_whitespace();
        let state = f.next()?.chars().next()?;
        let pgrp = f.nth(1)?.parse().ok()?;
        Some((state, pgrp))
    }

    /// The live (not zombie) processes of the process group `pgid`, with their state letters.
    pub fn group_members(pgid: i32) -> Vec<(i32, char)> {
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        let mut v: Vec<(i32, char)> = procs
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter_map(|pid| {
                let (state, pgrp) = state_and_group(pid)?;
                (pgrp == pgid && state != 'Z' && state != 'X').then_some((pid, state))
            })
            .collect();
        v.sort_unstable();
        v
    }

    /// Whether the process has no live child process.
    pub fn childless(pid: i32) -> bool {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return true;
        };
        tasks.flatten().all(|t| {
            std::fs::read_to_string(t.path().join("children"))
                .map(|c| c.trim().is_empty())
                .unwrap_or(true)
        })
    }
}

/// A command's stdout then stderr, as text.
pub fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Asserts that a command succeeded, showing its output if not; returns the output as text.
#[track_caller]
pub fn succeeded(out: &Output) -> String {
    assert!(out.status.success(), "{}", said(out));
    said(out)
}

/// `PATH` with `dir` first: where a test puts the stand-in programs a command should find.
pub fn path_with(dir: &Path) -> String {
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// The standard 12-task, 3-level graph. Level 2 tasks verify files made by *all* level-1
/// tasks and level 3 tasks verify files made by all level-2 tasks, so with several workers
/// every later level depends on other workers' output having been merged in between.
pub fn graph_12(feature: &str) -> String {
    let mut tasks = Vec::new();
    for i in 1..=5 {
        tasks.push(serde_json::json!({
            "id": format!("G-L1-{i:03}"), "title": format!("Level one part {i}"), "level": 1,
            "description": format!("Create l1/a{i}.txt"), "dependencies": [],
            "files": {"create": [format!("l1/a{i}.txt")], "modify": [], "read": []},
            "verification": {"command": format!("test -f l1/a{i}.txt"), "timeout_seconds": 30},
            "phase": "foundation", "estimate_minutes": 5
        }));
    }
    let all_l1 = (1..=5)
        .map(|i| format!("test -f l1/a{i}.txt"))
        .collect::<Vec<_>>()
        .join(" && ");
    for i in 1..=4 {
        tasks.push(serde_json::json!({
            "id": format!("G-L2-{i:03}"), "title": format!("Level two part {i}"), "level": 2,
            "dependencies": (1..=5).map(|j| format!("G-L1-{j:03}")).collect::<Vec<_>>(),
            "files": {"create": [format!("l2/b{i}.txt")], "modify": [], "read": ["l1/", "l1/a1.txt"]},
            "verification": {"command": format!("{all_l1} && test -f l2/b{i}.txt")}
        }));
    }
    let all_l2 = (1..=4)
        .map(|i| format!("test -f l2/b{i}.txt"))
        .collect::<Vec<_>>()
        .join(" && ");
    for i in 1..=3 {
        tasks.push(serde_json::json!({
            "id": format!("G-L3-{i:03}"), "title": format!("Level three part {i}"), "level": 3,
            "dependencies": (1..=4).map(|j| format!("G-L2-{j:03}")).collect::<Vec<_>>(),
            "files": {"create": [format!("l3/c{i}.txt")], "modify": [], "read": []},
            "verification": {"command": format!("{all_l2} && {all_l1} && test -f l3/c{i}.txt")}
        }));
    }
    serde_json::to_string_pretty(
        &serde_json::json!({"feature": feature, "version": "2.0", "tasks": tasks}),
    )
    .expect("json")
}

/// Task ids of [`graph_12`], sorted.
pub fn graph_12_ids() -> Vec<String> {
    let mut v: Vec<String> = (1..=5)
        .map(|i| format!("G-L1-{i:03}"))
        .chain((1..=4).map(|i| format!("G-L2-{i:03}")))
        .chain((1..=3).map(|i| format!("G-L3-{i:03}")))
        .collect();
    v.sort();
    v
}

/// The real Claude Code CLI: the binary the pinned `claude-agent-sdk` wheel bundles, fetched by
/// `tests/real-claude/fetch.sh` into `target/real-claude/` (once; later calls reuse it).
/// Returns the directory holding `claude`. When it cannot be had, the test fails under CI
/// (`CI=true`) or with `ZERG_REQUIRE_REAL_CLAUDE=1`, and is skipped (`None`, with the reason
/// printed) otherwise.
pub fn real_claude() -> Option<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("real-claude/fetch.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .output();
    let why = match out {
        Ok(o) if o.status.success() => {
            let rel = String::from_utf8_lossy(&o.stdout).trim().to_string();
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
            let bin = root.join(&rel);
            let version = Command::new(&bin)
                .arg("--version")
                .env("IS_SANDBOX", "1")
                .stdin(Stdio::null())
                .output();
            match version {
                Ok(v) if v.status.success() => {
                    return bin.parent().map(Path::to_path_buf);
                }
                Ok(v) => format!(
                    "{} --version failed: {}",
                    bin.display(),
                    String::from_utf8_lossy(&v.stderr)
                ),
                Err(e) => format!("cannot run {}: {e}", bin.display()),
            }
        }
        Ok(o) => format!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => format!("cannot run {}: {e}", script.display()),
    };
    let required =
        skipping_forbidden() || std::env::var("ZERG_REQUIRE_REAL_CLAUDE").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "the real Claude Code CLI is required here: {why}"
    );
    eprintln!("SKIPPED: the real Claude Code CLI is not available: {why}");
    None
}

/// A running `messages-api` stand-in; killed when dropped.
pub struct MessagesApi {
    child: Child,
    /// `http://127.0.0.1:PORT`, for `ANTHROPIC_BASE_URL`.
    pub url: String,
}

impl MessagesApi {
    /// Starts the stand-in with these arguments (`--mode 429 --until T`) and waits until it
    /// listens.
    pub fn start(args: &[&str]) -> MessagesApi {
        use std::io::BufRead;
        let mut child = Command::new(bin_dir().join("messages-api"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("messages-api starts");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("messages-api prints its address");
        let addr = line
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("messages-api said {line:?}"))
            .to_string();
        MessagesApi {
            child,
            url: format!("http://{addr}"),
        }
    }
}

impl Drop for MessagesApi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `kube-api` stand-in for a Kubernetes API server, recording what it is sent into
/// a directory of its own; killed when dropped, with the containers it ran for pods.
pub struct KubeApi {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    dir: tempfile::TempDir,
}

impl KubeApi {
    /// Starts the stand-in and waits until it listens.
    pub fn start() -> KubeApi {
        use std::io::BufRead;
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(bin_dir().join("kube-api"))
            .arg("--record")
            .arg(dir.path().join("record"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("kube-api starts");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("kube-api prints its address");
        let addr = line
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("kube-api said {line:?}"))
            .to_string();
        KubeApi { child, addr, dir }
    }

    /// Writes a kubeconfig whose cluster is the stand-in, with `namespace` as the context's,
    /// and returns its path (for `KUBECONFIG`).
    pub fn kubeconfig(&self, namespace: &str) -> PathBuf {
        let path = self.dir.path().join("kubeconfig");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: stand-in\n  cluster:\n    server: http://{}\nusers:\n- name: zergd\n  user: {{}}\ncontexts:\n- name: stand-in\n  context:\n    cluster: stand-in\n    user: zergd\n    namespace: {namespace}\ncurrent-context: stand-in\n",
            self.addr
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Every object created so far, as it was sent, in order.
    pub fn objects(&self) -> Vec<(PathBuf, Value)> {
        let dir = self.dir.path().join("record/objects");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        files.sort();
        files
            .into_iter()
            .map(|f| {
                let v = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
                (f, v)
            })
            .collect()
    }

    /// The requests served so far, one line each: `METHOD PATH?QUERY STATUS` (a watch is
    /// `WATCH`).
    pub fn requests(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("record/requests.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// `GET path` (with its query) and the JSON answered.
    pub fn get(&self, path: &str) -> Value {
        self.call("GET", path, &Value::Null)
    }

    /// Creates `object` in the collection at `path` as a test's own (not recorded among the
    /// objects zergd sent) and returns the answer.
    pub fn plant(&self, path: &str, object: &Value) -> Value {
        self.call("POST", &format!("{path}?unrecorded=1"), object)
    }

    fn call(&self, method: &str, path: &str, body: &Value) -> Value {
        use std::io::{Read, Write};
        let body = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        let mut s = std::net::TcpStream::connect(&self.addr).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nhost: {}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"))
    }
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let port = self.addr.rsplit(':').next().unwrap_or_default();
        let label = format!("label=zerg.kube-api={port}");
        if let Ok(out) = Command::new("docker")
            .args(["ps", "-aq", "--filter", &label])
            .output()
        {
            for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("docker").args(["rm", "-f", "-v", id]).output();
            }
        }
    }
}

/// The files a zerg task prompt's `## Files` section names: `(create, modify)`.
pub fn owned_files(prompt: &str) -> (Vec<String>, Vec<String>) {
    let (mut create, mut modify) = (Vec::new(), Vec::new());
    let mut in_section = false;
    for line in prompt.lines() {
        let t = line.trim();
        if t.starts_with('#') {
            in_section = t.starts_with("## ") && t.trim_start_matches('#').trim() == "Files";
            continue;
        }
        if !in_section {
            continue;
        }
        let item = t
            .trim_start_matches(['-', '*'])
            .trim_start()
            .trim_start_matches("**");
        let (target, list) = if let Some(r) = item.strip_prefix("Create:") {
            (&mut create, r)
        } else if let Some(r) = item.strip_prefix("Modify:") {
            (&mut modify, r)
        } else {
            continue;
        };
        for p in list.trim_start_matches("**").split(',') {
            let p = p.trim().trim_matches('`');
            if !p.is_empty() && p != "none" && p != "(none)" {
                target.push(p.to_string());
            }
        }
    }
    (create, modify)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What [`Config`] writes is a config zergd reads without a warning, with the values set.
    #[test]
    fn a_config_with_overrides_is_what_zergd_reads() {
        let c = Config::fake_agent()
            .fast_workers()
            .noisy_gate()
            .set("workers.retry_attempts", 0)
            .unset("workers.heartbeat_stale_threshold");
        let (parsed, warnings) =
            zergd::config::Config::parse(&c.yaml(), "config.yaml").expect("a valid config");
        assert!(warnings.is_empty(), "{warnings:?}\n{}", c.yaml());
        assert_eq!(parsed.workers.retry_attempts, 0);
        assert_eq!(
            parsed.workers.heartbeat_interval_seconds,
            Duration::from_millis(200)
        );
        assert_eq!(parsed.quality_gates.len(), 1);
        assert_eq!(parsed.quality_gates[0].command, "seq 1 40000");
        assert!(parsed.agent.command[0].ends_with("fake-claude"));
        assert_eq!(c.get("workers.retry_attempts"), 0);
        assert!(c.get("workers.heartbeat_stale_threshold").is_null());
    }
}
