//! What the tests of every zerg crate share (cargo feature `testkit`, which the other crates
//! enable in their dev-dependencies; zerg-proto's own tests have it too): git with an explicit
//! identity, waiting for a condition, skipping a test that cannot run here (or failing it where
//! it must run), and whether a Docker engine answers.
//!
//! The end-to-end toolkit of `zerg-tests` builds on it. Nothing in the binaries uses it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The name and email of every commit a test makes through [`git`].
pub const IDENTITY: (&str, &str) = ("zerg test", "test@zerg.invalid");

/// How often [`wait_until`] and [`poll`] look again.
const POLL_EVERY: Duration = Duration::from_millis(50);

/// Runs `git -C dir ARGS` with [`IDENTITY`] as author and committer (given on the command
/// line, so the machine's own identity, or its lack, plays no part) and returns its trimmed
/// stdout; panics with its stderr when it fails.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            &format!("user.name={}", IDENTITY.0),
            "-c",
            &format!("user.email={}", IDENTITY.1),
        ])
        .args(args)
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .stdin(Stdio::null())
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?} in {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Waits until `ready` returns true, looking again every 50 ms. Panics naming `what` when
/// `deadline` has passed first: the deadline only bounds a test that would otherwise hang, it
/// is not a claim about how long anything takes.
#[track_caller]
pub fn wait_until(deadline: Duration, what: &str, ready: impl FnMut() -> bool) {
    assert!(
        poll(deadline, ready),
        "timed out after {deadline:?} waiting for {what}"
    );
}

/// [`wait_until`] for callers that describe the failure themselves: whether `ready` returned
/// true before `deadline`.
pub fn poll(deadline: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + deadline;
    loop {
        if ready() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(POLL_EVERY);
    }
}

/// Whether this run must not skip a test: under CI (`CI=true`), which `.ci/run` sets up with
/// everything the tests need.
pub fn skipping_forbidden() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Skips the calling test because `why` (what it needs is missing here): prints
/// `SKIPPED: <why>` on stderr, and the caller returns. Where skipping is forbidden
/// ([`skipping_forbidden`]) it panics with the reason instead.
#[track_caller]
pub fn skip(why: &str) {
    assert!(
        !skipping_forbidden(),
        "this test must run under CI (CI=true), but {why}"
    );
    eprintln!("SKIPPED: {why}");
}

/// Whether a Docker engine answers `docker info`, the way `.ci/run` decides it; the reason
/// when none does.
pub fn docker_engine() -> Result<(), String> {
    match Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .stdin(Stdio::null())
        .output()
    {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "no Docker engine reachable (docker info: {})",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Err(format!(
            "no Docker engine reachable (cannot run docker: {e})"
        )),
    }
}

/// Runs `docker <args>`: its stdout, trimmed, or its stderr, trimmed, when it fails.
pub fn docker_cli(args: &[&str]) -> Result<String, String> {
    let out = Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
    }
}

/// Whether a missing Docker engine fails a test rather than skipping it: under CI
/// ([`skipping_forbidden`]) or with `ZERG_REQUIRE_DOCKER=1`.
pub fn docker_required() -> bool {
    skipping_forbidden() || std::env::var("ZERG_REQUIRE_DOCKER").as_deref() == Ok("1")
}

/// For a test that needs a Docker engine: true when one answers ([`docker_engine`]).
/// Otherwise the test is skipped (false, with `SKIPPED: <reason>` printed), or fails when the
/// engine is required ([`docker_required`]: under `CI=true`, which `.ci/run` sets after
/// starting or installing an engine, or with `ZERG_REQUIRE_DOCKER=1`).
#[track_caller]
pub fn docker_or_skip() -> bool {
    match docker_engine() {
        Ok(()) => true,
        Err(why) => {
            assert!(
                !docker_required(),
                "a Docker engine is required here (CI=true or ZERG_REQUIRE_DOCKER=1), but {why}"
            );
            eprintln!("SKIPPED: {why} (container-mode tests need a Docker engine)");
            false
        }
    }
}

/// The Kubernetes release whose API schemas [`kubernetes_validate`] checks objects against:
/// the newest the `kubernetes-validate` package (1.37.0, which `.ci/run` installs) ships.
pub const KUBERNETES_SCHEMA_VERSION: &str = "1.37.0";

/// Validates each JSON file in `files` (one Kubernetes object each, as sent to an API server)
/// strictly (no property the schema lacks) against the API schemas of
/// [`KUBERNETES_SCHEMA_VERSION`], with `python3.12 -m kubernetes_validate` under
/// `PYENV_VERSION=3.12.1`, the interpreter `.ci/run` installs it into. `None` when that tool
/// is not installed here (the caller [`skip`]s); otherwise every complaint, a kind with no
/// schema included.
pub fn kubernetes_validate(files: &[std::path::PathBuf]) -> Option<Result<(), String>> {
    let python = || {
        let mut c = Command::new("python3.12");
        c.env("PYENV_VERSION", "3.12.1")
            .args(["-m", "kubernetes_validate"])
            .stdin(Stdio::null());
        c
    };
    let installed = python()
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !installed {
        return None;
    }
    let out = python()
        .args(["--strict", "--quiet", "--kubernetes-version"])
        .arg(KUBERNETES_SCHEMA_VERSION)
        .args(files)
        .output()
        .expect("python3.12 runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some(if out.status.success() && said.trim().is_empty() {
        Ok(())
    } else {
        Err(format!("kubernetes-validate ({}): {said}", out.status))
    })
}

/// A container's security setting `key` as Kubernetes applies it: the container's own
/// `securityContext` value, or else the pod's (`pod` is a pod spec).
pub fn effective_security(
    pod: &serde_json::Value,
    container: &serde_json::Value,
    key: &str,
) -> serde_json::Value {
    let own = &container["securityContext"][key];
    if own.is_null() {
        pod["securityContext"][key].clone()
    } else {
        own.clone()
    }
}

/// What a pod spec (`PodSpec` as JSON) breaks of the Pod Security Standards' **restricted**
/// profile (and of its baseline, which restricted includes): for the pod and each container,
/// `runAsNonRoot: true`, `allowPrivilegeEscalation: false`, capabilities dropping `ALL` and
/// adding at most `NET_BIND_SERVICE`, a `RuntimeDefault` or `Localhost` seccomp profile, not
/// privileged, no root uid; no host network, PID or IPC namespace, no host port, no sysctl,
/// and only the volume types the profile allows. Empty when it complies.
pub fn restricted_pod_violations(pod: &serde_json::Value) -> Vec<String> {
    use serde_json::Value;
    let mut bad = Vec::new();
    for key in ["hostNetwork", "hostPID", "hostIPC"] {
        if pod[key] == Value::Bool(true) {
            bad.push(format!("{key} is true"));
        }
    }
    if pod["securityContext"]["sysctls"]
        .as_array()
        .is_some_and(|s| !s.is_empty())
    {
        bad.push("the pod sets sysctls".into());
    }
    const VOLUMES: &[&str] = &[
        "configMap",
        "csi",
        "downwardAPI",
        "emptyDir",
        "ephemeral",
        "persistentVolumeClaim",
        "projected",
        "secret",
    ];
    for v in pod["volumes"].as_array().into_iter().flatten() {
        let kinds: Vec<&String> = v
            .as_object()
            .into_iter()
            .flat_map(|o| o.keys())
            .filter(|k| *k != "name")
            .collect();
        if kinds.len() != 1 || !VOLUMES.contains(&kinds[0].as_str()) {
            bad.push(format!("volume {} is of type {kinds:?}", v["name"]));
        }
    }
    let seccomp_ok = |t: &Value| matches!(t.as_str(), Some("RuntimeDefault") | Some("Localhost"));
    let containers = ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .flat_map(|k| pod[*k].as_array().cloned().unwrap_or_default());
    for c in containers {
        let name = c["name"].as_str().unwrap_or("?").to_string();
        let sc = &c["securityContext"];
        let either = |k: &str| effective_security(pod, &c, k);
        if either("runAsNonRoot") != Value::Bool(true) {
            bad.push(format!("{name}: runAsNonRoot is not true"));
        }
        if either("runAsUser").as_i64() == Some(0) {
            bad.push(format!("{name}: runAsUser is 0"));
        }
        if sc["allowPrivilegeEscalation"] != Value::Bool(false) {
            bad.push(format!("{name}: allowPrivilegeEscalation is not false"));
        }
        if sc["privileged"] == Value::Bool(true) {
            bad.push(format!("{name}: privileged"));
        }
        if !sc["capabilities"]["drop"]
            .as_array()
            .is_some_and(|d| d.iter().any(|c| c == "ALL"))
        {
            bad.push(format!("{name}: capabilities do not drop ALL"));
        }
        for add in sc["capabilities"]["add"].as_array().into_iter().flatten() {
            if add != "NET_BIND_SERVICE" {
                bad.push(format!("{name}: adds capability {add}"));
            }
        }
        if !seccomp_ok(&either("seccompProfile")["type"]) {
            bad.push(format!(
                "{name}: seccompProfile is not RuntimeDefault or Localhost"
            ));
        }
        for p in c["ports"].as_array().into_iter().flatten() {
            if p["hostPort"].as_i64().is_some_and(|h| h != 0) {
                bad.push(format!("{name}: hostPort {}", p["hostPort"]));
            }
        }
    }
    bad
}

/// A single-node Docker swarm for one test (`docker swarm init --advertise-addr 127.0.0.1`, so
/// its traffic stays on loopback). Tests in other processes that need one wait for this one to
/// end (a lock directory under the temporary dir, taken over when its holder is gone), and the
/// swarm is left again on drop if this session created it: a machine whose engine was in a
/// swarm already stays in it.
pub struct SwarmSession {
    created: bool,
    lock: std::path::PathBuf,
}

impl SwarmSession {
    /// Takes the lock and makes sure the engine is a swarm manager.
    pub fn start() -> Result<SwarmSession, String> {
        let mut s = SwarmSession::lock()?;
        s.ensure_active()?;
        Ok(s)
    }

    /// Takes the lock only: the engine's swarm is as it was.
    pub fn lock() -> Result<SwarmSession, String> {
        let lock = std::env::temp_dir().join("zerg-test-swarm.lock");
        let me = std::process::id().to_string();
        loop {
            match std::fs::create_dir(&lock) {
                Ok(()) => {
                    std::fs::write(lock.join("pid"), &me).map_err(|e| e.to_string())?;
                    break;
                }
                Err(_) => {
                    let holder = std::fs::read_to_string(lock.join("pid")).unwrap_or_default();
                    let gone =
                        !holder.is_empty() && !Path::new("/proc").join(holder.trim()).exists();
                    if gone {
                        let _ = std::fs::remove_dir_all(&lock);
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
        Ok(SwarmSession {
            created: false,
            lock,
        })
    }

    /// Makes the engine a swarm manager unless it is one.
    pub fn ensure_active(&mut self) -> Result<(), String> {
        let state = |args: &[&str]| {
            Command::new("docker")
                .args(args)
                .output()
                .map_err(|e| e.to_string())
        };
        let info = state(&["info", "--format", "{{.Swarm.LocalNodeState}}"])?;
        if String::from_utf8_lossy(&info.stdout).trim() != "active" {
            let out = state(&["swarm", "init", "--advertise-addr", "127.0.0.1"])?;
            if !out.status.success() {
                return Err(format!(
                    "docker swarm init failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            self.created = true;
        }
        Ok(())
    }
}

impl Drop for SwarmSession {
    fn drop(&mut self) {
        if self.created {
            let _ = Command::new("docker")
                .args(["swarm", "leave", "--force"])
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.lock);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_commits_with_the_explicit_identity() {
        let dir = tempfile::tempdir().unwrap();
        git(dir.path(), &["init", "-q", "-b", "main"]);
        git(dir.path(), &["commit", "-q", "--allow-empty", "-m", "one"]);
        assert_eq!(
            git(dir.path(), &["log", "-1", "--format=%an <%ae>|%cn <%ce>"]),
            "zerg test <test@zerg.invalid>|zerg test <test@zerg.invalid>"
        );
    }

    #[test]
    fn a_restricted_pod_passes_and_each_breach_of_the_profile_is_named() {
        let good = serde_json::json!({
            "securityContext": {"runAsNonRoot": true, "runAsUser": 10001,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "w", "securityContext": {
                "allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}],
            "volumes": [{"name": "t", "secret": {"secretName": "s"}},
                        {"name": "w", "emptyDir": {}}],
        });
        assert_eq!(restricted_pod_violations(&good), Vec::<String>::new());
        let breaches: &[(&str, serde_json::Value)] = &[
            ("/hostNetwork", true.into()),
            ("/hostPID", true.into()),
            ("/hostIPC", true.into()),
            ("/securityContext/runAsNonRoot", false.into()),
            ("/securityContext/runAsUser", 0.into()),
            ("/securityContext/seccompProfile/type", "Unconfined".into()),
            (
                "/securityContext/sysctls",
                serde_json::json!([{"name": "a", "value": "1"}]),
            ),
            (
                "/containers/0/securityContext/allowPrivilegeEscalation",
                true.into(),
            ),
            ("/containers/0/securityContext/privileged", true.into()),
            (
                "/containers/0/securityContext/capabilities/drop",
                serde_json::json!([]),
            ),
            (
                "/containers/0/securityContext/capabilities/add",
                serde_json::json!(["SYS_ADMIN"]),
            ),
            (
                "/containers/0/ports",
                serde_json::json!([{"containerPort": 80, "hostPort": 80}]),
            ),
            (
                "/volumes/1",
                serde_json::json!({"name": "h", "hostPath": {"path": "/"}}),
            ),
        ];
        for (pointer, value) in breaches {
            let mut pod = good.clone();
            let (parent, key) = pointer.rsplit_once('/').unwrap();
            let slot = pod.pointer_mut(parent).unwrap();
            match slot {
                serde_json::Value::Array(a) => a[key.parse::<usize>().unwrap()] = value.clone(),
                _ => slot[key] = value.clone(),
            }
            assert!(
                !restricted_pod_violations(&pod).is_empty(),
                "{pointer} = {value} passed"
            );
        }
    }

    #[test]
    fn wait_until_returns_once_ready_and_names_what_it_waited_for_otherwise() {
        let mut n = 0;
        wait_until(Duration::from_secs(60), "the third look", || {
            n += 1;
            n == 3
        });
        assert_eq!(n, 3);
        let e =
            std::panic::catch_unwind(|| wait_until(Duration::ZERO, "godot", || false)).unwrap_err();
        let msg = e.downcast_ref::<String>().unwrap();
        assert!(msg.contains("waiting for godot"), "{msg}");
    }
}
