//! What a worker container looks like, as pure functions of the worker's spec and the host's
//! facts: its name, environment, mounts, limits, labels and the full create request. Nothing here
//! talks to the engine or changes the host, so all of it is unit-tested.

use super::*;

/// The container's name: feature-scoped and unique per generation.
pub fn container_name(spec: &WorkerSpec) -> String {
    let feature: String = spec
        .feature
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!(
        "zerg-{feature}-worker-{}-g{}",
        spec.worker_id, spec.generation
    )
}

/// Where a worker worktree's git metadata lives on the host, and what zergd prepared there for
/// the container (found and made by zergd, which does the git work; the launcher only mounts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitLayout {
    /// The worktree's admin dir (`<common>/worktrees/<name>`), as the host's git knows it.
    pub admin_dir: PathBuf,
    /// The repository's common git directory (usually `<repo>/.git`).
    pub common_dir: PathBuf,
    /// The worker's private git dir, mounted where the common one is.
    pub private_dir: PathBuf,
    /// The worker's home, mounted at `/home/worker`.
    pub home_dir: PathBuf,
    /// The worker's cache, mounted at `/home/worker/.cache` (`XDG_CACHE_HOME`): kept from one
    /// container of the slot to the next for the whole rush.
    pub cache_dir: PathBuf,
}

impl GitLayout {
    /// The admin dir's name (`worker-<N>` unless git had to pick another).
    pub fn admin_name(&self) -> String {
        self.admin_dir
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_else(|| "worker".into())
    }
}

/// The worker's own log directory (`.zerg/logs/worker-<N>`), the only part of `.zerg` a
/// container can write: the agent keeps each task's CLI and verification output there.
pub fn worker_log_dir(log_dir: &Path, worker_id: u32) -> PathBuf {
    log_dir.join(format!("worker-{worker_id}"))
}

/// Everything about the host that shapes a worker container, gathered once per spawn (and
/// built by hand in tests).
#[derive(Debug, Clone)]
pub struct HostFacts {
    /// uid the agent runs as.
    pub uid: u32,
    /// gid the agent runs as.
    pub gid: u32,
    /// Whether zergd is root and the agent runs as [`UNPRIVILEGED_UID`] instead.
    pub remapped: bool,
    /// The worktree's git layout.
    pub git: GitLayout,
    /// Commit identity (`user.name`, `user.email`) as zergd's git sees it for the repository.
    pub git_identity: (String, String),
    /// What of the host's Claude login each worker's home gets a copy of.
    pub login: ClaudeLogin,
    /// Variables passed through from zergd's environment: the subprocess allowlist and
    /// `agent.env_passthrough`, less the denylist and host paths; file-valued ones already point
    /// inside.
    pub passthrough: Vec<(String, String)>,
    /// Host files and directories named by passed variables (certificate bundles, cloud
    /// credentials files), each mounted read-only at the path its variable names inside.
    pub host_files: Vec<(String, PathBuf)>,
    /// Host paths named by `FAKE_CLAUDE_*` variables, mounted at the same path.
    pub test_paths: Vec<PathBuf>,
}

/// The part of the host's Claude login a worker container gets, as copies: the credentials
/// file (`<config dir>/.credentials.json`) and the account fields of `.claude.json`. The host's
/// config dir itself is never mounted.
#[derive(Debug, Clone, Default)]
pub struct ClaudeLogin {
    /// The credentials file's bytes, if there is one.
    pub credentials: Option<Vec<u8>>,
    /// The account fields of the host's `.claude.json` (an object).
    pub account: serde_json::Value,
}

/// Fields of the host's `.claude.json` a worker's copy keeps: who is logged in, and that the
/// first-run questions were answered. Projects, history, trusted folders and settings stay on
/// the host.
const ACCOUNT_FIELDS: &[&str] = &[
    "oauthAccount",
    "userID",
    "hasCompletedOnboarding",
    "lastOnboardingVersion",
];

/// Largest credentials or `.claude.json` file read from the host.
const MAX_LOGIN_FILE: u64 = 4 << 20;

impl ClaudeLogin {
    /// Reads the login of zergd's user: `$CLAUDE_CONFIG_DIR` (else `~/.claude`) for the
    /// credentials file, and `$CLAUDE_CONFIG_DIR/.claude.json` (else `~/.claude.json`).
    pub fn gather() -> Self {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let config_dir = std::env::var_os("CLAUDE_CONFIG_DIR")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        let dir = config_dir
            .clone()
            .or_else(|| home.as_ref().map(|h| h.join(".claude")));
        let json = match &config_dir {
            Some(d) => Some(d.join(".claude.json")),
            None => home.map(|h| h.join(".claude.json")),
        };
        let read = |p: &Path| {
            fs::symlink_metadata(p)
                .ok()
                .filter(|m| m.is_file() && m.len() <= MAX_LOGIN_FILE)
                .and_then(|_| fs::read(p).ok())
        };
        let credentials = dir.and_then(|d| read(&d.join(".credentials.json")));
        let host: serde_json::Value = json
            .and_then(|p| read(&p))
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let mut account = serde_json::Map::new();
        for k in ACCOUNT_FIELDS {
            if let Some(v) = host.get(*k) {
                account.insert((*k).to_string(), v.clone());
            }
        }
        account
            .entry("hasCompletedOnboarding")
            .or_insert(serde_json::Value::Bool(true));
        Self {
            credentials,
            account: serde_json::Value::Object(account),
        }
    }
}

/// Variables of the subprocess allowlist ([`zerg_proto::contract::ENV_ALLOWLIST`]) that a
/// container does not take from zergd's environment: host paths and names that mean nothing
/// inside (its `PATH`, home, toolchain dirs), and what zergd sets itself for the inside
/// (`HOME`, `CLAUDE_CONFIG_DIR`, and every `ZERG_*` but the agent's own two settings). A `*`
/// suffix is a prefix. They stay out even when `agent.env_passthrough` names them.
pub const CONTAINER_ENV_HOST_ONLY: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
    "TMPDIR",
    "XDG_*",
    "CARGO_HOME",
    "RUSTUP_HOME",
    "RUSTUP_TOOLCHAIN",
    "GOPATH",
    "GOROOT",
    "GOCACHE",
    "GOMODCACHE",
    "NVM_DIR",
    "NODE_PATH",
    "PYENV_ROOT",
    "VIRTUAL_ENV",
    "JAVA_HOME",
    "CLAUDE_CONFIG_DIR",
];

/// Variables whose value names a host file or directory (a certificate bundle, a cloud
/// credentials file): when passed, it is mounted read-only at `/zerg/host/<VAR>` and the
/// variable points there.
pub const FILE_VARS: &[&str] = &[
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "AWS_CA_BUNDLE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "GOOGLE_APPLICATION_CREDENTIALS",
];

/// Where a host file named by a [`FILE_VARS`] variable is mounted inside.
pub fn host_file_in_container(var: &str) -> String {
    format!("/zerg/host/{var}")
}

/// Environment variables as name/value pairs.
pub type EnvVars = Vec<(String, String)>;

/// The passed-through variables of `vars` for a container with `extra` (the rush's
/// `agent.env_passthrough`): what a subprocess worker would inherit, less
/// [`CONTAINER_ENV_HOST_ONLY`]; and the host files they name. `FAKE_CLAUDE_*` (the test agent
/// CLI's hooks) pass as they are.
pub fn container_passthrough(
    vars: impl IntoIterator<Item = (String, String)>,
    extra: &[String],
) -> (EnvVars, Vec<(String, PathBuf)>) {
    let host_only = |name: &str| {
        CONTAINER_ENV_HOST_ONLY
            .iter()
            .any(|d| match d.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => name == *d,
            })
            || (name.starts_with("ZERG_")
                && !matches!(name, "ZERG_LOG" | "ZERG_RECONNECT_TIMEOUT_SECONDS"))
    };
    let mut out = Vec::new();
    let mut files = Vec::new();
    for (k, v) in vars {
        if k.starts_with("FAKE_CLAUDE_") {
            out.push((k, v));
            continue;
        }
        if !zerg_proto::contract::env_inherited(&k, extra) || host_only(&k) {
            continue;
        }
        if FILE_VARS.contains(&k.as_str()) {
            let p = PathBuf::from(&v);
            if p.is_absolute() && p.exists() {
                out.push((k.clone(), host_file_in_container(&k)));
                files.push((k, p));
            }
            continue;
        }
        out.push((k, v));
    }
    out.sort();
    files.sort();
    (out, files)
}

impl HostFacts {
    /// Reads the facts of the host for `spec`, around the git layout and commit identity zergd
    /// found for its worktree.
    pub fn gather(
        spec: &WorkerSpec,
        git: GitLayout,
        git_identity: (String, String),
    ) -> Result<Self, SpawnError> {
        for p in [&git.common_dir, &git.admin_dir] {
            if let Some(r) = RESERVED.iter().find(|r| p.starts_with(r)) {
                return Err(SpawnError::new(format!(
                    "the repository's git directory {} lies under {r}, which the worker container needs for itself: move the repository",
                    p.display()
                )));
            }
        }
        let (uid, gid, remapped) = container_identity();
        let (passthrough, host_files) =
            container_passthrough(std::env::vars(), &spec.env_passthrough);
        let mut test_paths: Vec<PathBuf> = passthrough
            .iter()
            .filter(|(k, _)| k.starts_with("FAKE_CLAUDE_"))
            .filter_map(|(k, v)| test_path(k, v))
            .collect();
        test_paths.sort();
        test_paths.dedup();
        Ok(Self {
            uid,
            gid,
            remapped,
            git_identity,
            git,
            login: ClaudeLogin::gather(),
            passthrough,
            host_files,
            test_paths,
        })
    }
}

/// A `FAKE_CLAUDE_*` variable naming an absolute host path (a test hook of the fake agent
/// CLI): the path to mount at the same place inside. A missing `*_DIR` is created as a
/// directory, any other missing path as an empty file (a log to append to) when its parent
/// exists.
pub(crate) fn test_path(var: &str, value: &str) -> Option<PathBuf> {
    let p = PathBuf::from(value);
    if !p.is_absolute() || p.parent().is_none() {
        return None;
    }
    if !p.exists() {
        if var.ends_with("_DIR") {
            fs::create_dir_all(&p).ok()?;
        } else if p.parent().is_some_and(Path::is_dir) {
            fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&p)
                .ok()?;
        }
    }
    p.exists().then_some(p)
}

/// The uid:gid the agent runs as, and whether it differs from zergd's own (zergd is root).
pub fn container_identity() -> (u32, u32, bool) {
    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    if uid == 0 {
        (UNPRIVILEGED_UID, UNPRIVILEGED_UID, true)
    } else {
        (uid, if gid == 0 { UNPRIVILEGED_UID } else { gid }, false)
    }
}

/// In-container path of the spec snapshot (FR-7).
pub fn spec_dir_in_container(feature: &str) -> String {
    format!("{WORKSPACE}/.gsd/specs/{feature}")
}

pub(crate) fn socket_in_container() -> String {
    format!("{RUN_MOUNT}/{}", crate::PLANE_SOCKET_NAME)
}

/// The agent's environment: the subprocess worker's, with the paths it sees inside, plus git
/// settings and credentials. `ZERG_STATE_DIR` is not set: nothing of `.zerg/state` is inside.
pub fn container_env(spec: &WorkerSpec, facts: &HostFacts) -> Vec<String> {
    let inside: HashMap<&str, String> = HashMap::from([
        (worker_env_names::WORKTREE, WORKSPACE.to_string()),
        (
            worker_env_names::SPEC_DIR,
            spec_dir_in_container(&spec.feature),
        ),
        (worker_env_names::LOG_DIR, LOG_MOUNT.to_string()),
        (worker_env_names::SOCKET, socket_in_container()),
    ]);
    let mut env: Vec<(String, String)> = crate::subprocess::worker_env(spec)
        .into_iter()
        .filter(|(k, _)| k != worker_env_names::STATE_DIR)
        .map(|(k, v)| match inside.get(k.as_str()) {
            Some(p) => (k, p.clone()),
            None => (k, v),
        })
        .collect();
    env.push(("HOME".into(), HOME_IN_IMAGE.into()));
    // Tools that keep downloads and builds outside the worktree (pip, uv, npm, go) keep them
    // in the worker's cache, which outlives a respawn; the worktree (a Rust `target/`,
    // `node_modules`, a venv) outlives one anyway.
    for (k, v) in [
        ("XDG_CACHE_HOME", String::new()),
        ("npm_config_cache", "/npm".into()),
        ("GOCACHE", "/go-build".into()),
        ("GOMODCACHE", "/go-mod".into()),
    ] {
        env.retain(|(name, _)| name != k);
        env.push((k.into(), format!("{CACHE_IN_IMAGE}{v}")));
    }
    env.push((
        "CLAUDE_CONFIG_DIR".into(),
        format!("{HOME_IN_IMAGE}/.claude"),
    ));
    let config = [
        // The common git dir belongs to another uid (root, or the repo's owner).
        ("safe.directory", "*".to_string()),
        ("user.name", facts.git_identity.0.clone()),
        ("user.email", facts.git_identity.1.clone()),
        // gc would pack into the private object dir, for nothing.
        ("gc.auto", "0".to_string()),
        ("maintenance.auto", "false".to_string()),
        // The spec is mounted read-only over its tracked files: a sparse checkout keeps git
        // from ever writing or deleting them there (the patterns are in the private admin dir),
        // and tells git their presence on disk is expected.
        ("core.sparseCheckout", "true".to_string()),
        ("core.sparseCheckoutCone", "false".to_string()),
        ("sparse.expectFilesOutsideOfPatterns", "true".to_string()),
    ];
    env.push(("GIT_CONFIG_COUNT".into(), config.len().to_string()));
    for (i, (k, v)) in config.iter().enumerate() {
        env.push((format!("GIT_CONFIG_KEY_{i}"), k.to_string()));
        env.push((format!("GIT_CONFIG_VALUE_{i}"), v.clone()));
    }
    env.extend(facts.passthrough.iter().cloned());
    // No network of its own: the worker agent forwards the agent CLI's connections to zergd's
    // egress proxy over the worker socket.
    if matches!(spec.container.network.trim(), "" | "none") {
        let proxied = zerg_sandbox::proxy_env(zerg_sandbox::EGRESS_PORT);
        env.retain(|(k, _)| !proxied.iter().any(|(p, _)| p == k));
        env.push((zerg_sandbox::EGRESS_ENV.into(), "1".into()));
        env.extend(proxied);
    }
    env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

pub(crate) fn bind(source: &Path, target: &str, read_only: bool) -> Mount {
    Mount {
        source: Some(source.to_string_lossy().to_string()),
        target: Some(target.to_string()),
        typ: Some(MountType::BIND),
        read_only: Some(read_only),
        ..Default::default()
    }
}

pub(crate) fn same_path(p: &Path, read_only: bool) -> Mount {
    bind(p, &p.to_string_lossy(), read_only)
}

/// The container's bind mounts. The only writable ones are the worktree, the worker's private
/// git dir, its own home and cache and its own log dir (and the test hooks when present).
pub fn container_mounts(spec: &WorkerSpec, facts: &HostFacts) -> Vec<Mount> {
    let g = &facts.git;
    let mut m = vec![
        bind(&spec.worktree, WORKSPACE, false),
        bind(&spec.spec_dir, &spec_dir_in_container(&spec.feature), true),
        // The worker's private git dir where the real one is.
        bind(&g.private_dir, &g.common_dir.to_string_lossy(), false),
        bind(&g.common_dir.join("objects"), SHARED_OBJECTS, true),
        bind(
            &worker_log_dir(&spec.log_dir, spec.worker_id),
            LOG_MOUNT,
            false,
        ),
        // The rush's worker-plane directory: one socket, the Worker service only.
        bind(&parent_of(&spec.socket), RUN_MOUNT, true),
    ];
    m.push(bind(&g.home_dir, HOME_IN_IMAGE, false));
    m.push(bind(&g.cache_dir, CACHE_IN_IMAGE, false));
    for (var, p) in &facts.host_files {
        m.push(bind(p, &host_file_in_container(var), true));
    }
    for p in &facts.test_paths {
        m.push(same_path(p, false));
    }
    m
}

pub(crate) fn parent_of(p: &Path) -> PathBuf {
    p.parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| p.to_path_buf())
}

/// Resource limits and hardening.
pub fn host_config(spec: &WorkerSpec, facts: &HostFacts) -> HostConfig {
    HostConfig {
        mounts: Some(container_mounts(spec, facts)),
        ..hardened(&spec.container)
    }
}

/// What every container zergd runs gets, worker or gate: the network (`none` when unset),
/// memory (no swap beyond it), CPU and process limits, no capabilities, `no-new-privileges`,
/// an init, and an engine log capped at `log_max_bytes`. No mounts.
pub fn hardened(c: &crate::ContainerSpec) -> HostConfig {
    let network = if c.network.trim().is_empty() {
        "none".to_string()
    } else {
        c.network.trim().to_string()
    };
    let memory = (c.memory_bytes > 0).then_some(c.memory_bytes);
    HostConfig {
        network_mode: Some(network),
        memory,
        // No swap beyond the memory limit, so a runaway agent is OOM-killed (and reported).
        memory_swap: memory,
        nano_cpus: (c.cpus > 0.0).then(|| (c.cpus * 1e9).round() as i64),
        pids_limit: (c.pids_limit > 0).then_some(c.pids_limit),
        cap_drop: Some(vec!["ALL".into()]),
        security_opt: Some(vec!["no-new-privileges".into()]),
        privileged: Some(false),
        init: Some(true),
        // The engine's own copy of the output, capped like the mirror.
        log_config: Some(bollard::models::HostConfigLogConfig {
            typ: Some("json-file".into()),
            config: Some(HashMap::from([
                (
                    "max-size".to_string(),
                    c.log_max_bytes.max(1 << 20).to_string(),
                ),
                ("max-file".to_string(), "1".to_string()),
            ])),
        }),
        ..Default::default()
    }
}

/// The labels that identify a worker container.
pub fn container_labels(spec: &WorkerSpec) -> HashMap<String, String> {
    HashMap::from([
        (LABEL_RUSH.to_string(), spec.rush_id.clone()),
        (LABEL_FEATURE.to_string(), spec.feature.clone()),
        (LABEL_WORKER.to_string(), spec.worker_id.to_string()),
        (LABEL_GENERATION.to_string(), spec.generation.to_string()),
    ])
}

/// The full create request.
pub fn create_body(spec: &WorkerSpec, facts: &HostFacts) -> ContainerCreateBody {
    ContainerCreateBody {
        image: Some(image_of(spec)),
        user: Some(format!("{}:{}", facts.uid, facts.gid)),
        env: Some(container_env(spec, facts)),
        // The entrypoint is set (not the command) so no image ENTRYPOINT/CMD is mixed in.
        entrypoint: Some(vec![AGENT_IN_IMAGE.into()]),
        working_dir: Some(WORKSPACE.into()),
        hostname: Some(format!("zerg-worker-{}", spec.worker_id)),
        labels: Some(container_labels(spec)),
        stop_signal: Some("SIGTERM".into()),
        tty: Some(false),
        open_stdin: Some(false),
        attach_stdin: Some(false),
        host_config: Some(host_config(spec, facts)),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ContainerSpec;

    fn spec() -> WorkerSpec {
        WorkerSpec {
            rush_id: "r-123".into(),
            feature: "feat-x".into(),
            worker_id: 2,
            generation: 5,
            repo: "/srv/repo".into(),
            worktree: "/srv/repo/.zerg-worktrees/feat-x/worker-2".into(),
            branch: "zerg/feat-x/worker-2".into(),
            spec_dir: "/srv/repo/.zerg/specs/feat-x".into(),
            state_dir: "/srv/repo/.zerg/state".into(),
            log_dir: "/srv/repo/.zerg/logs".into(),
            socket: "/run/user/0/zerg/w/0123456789abcdef/worker.sock".into(),
            token: crate::WorkerToken::generate(),
            agent_bin: "/usr/local/bin/zerg-worker-agent".into(),
            container: ContainerSpec {
                image: String::new(),
                network: String::new(),
                memory_bytes: 4 << 30,
                cpus: 2.0,
                pids_limit: 1024,
                host: None,
                log_max_bytes: 64 << 20,
            },
            env_passthrough: vec![],
            remote: Default::default(),
            stop_grace: std::time::Duration::from_secs(10),
            sandbox: None,
        }
    }

    fn facts() -> HostFacts {
        HostFacts {
            uid: UNPRIVILEGED_UID,
            gid: UNPRIVILEGED_UID,
            remapped: true,
            git: GitLayout {
                admin_dir: "/srv/repo/.git/worktrees/worker-2".into(),
                common_dir: "/srv/repo/.git".into(),
                private_dir: "/srv/repo/.git/zerg/feat-x/worker-2".into(),
                home_dir: "/srv/repo/.git/zerg/feat-x/home-2".into(),
                cache_dir: "/srv/repo/.git/zerg/feat-x/cache-2".into(),
            },
            git_identity: ("Ada".into(), "ada@example.com".into()),
            login: ClaudeLogin::default(),
            passthrough: vec![
                ("ANTHROPIC_API_KEY".into(), "sk-test".into()),
                ("FAKE_CLAUDE_SCRIPT".into(), "/tmp/t/script.json".into()),
                (
                    "SSL_CERT_FILE".into(),
                    host_file_in_container("SSL_CERT_FILE"),
                ),
            ],
            host_files: vec![("SSL_CERT_FILE".into(), "/etc/corp/ca.pem".into())],
            test_paths: vec!["/tmp/t/script.json".into()],
        }
    }

    fn mount<'a>(ms: &'a [Mount], target: &str) -> &'a Mount {
        ms.iter()
            .find(|m| m.target.as_deref() == Some(target))
            .unwrap_or_else(|| panic!("no mount at {target}: {ms:?}"))
    }

    #[test]
    fn name_is_feature_scoped_and_per_generation() {
        let mut s = spec();
        assert_eq!(container_name(&s), "zerg-feat-x-worker-2-g5");
        s.feature = "a/b c".into();
        assert_eq!(container_name(&s), "zerg-a-b-c-worker-2-g5");
    }

    #[test]
    fn env_uses_container_paths() {
        let env = container_env(&spec(), &facts());
        let get = |k: &str| {
            env.iter()
                .find_map(|kv| kv.strip_prefix(&format!("{k}=")))
                .unwrap_or_else(|| panic!("{k} missing from {env:?}"))
                .to_string()
        };
        assert_eq!(get("ZERG_WORKTREE"), "/workspace");
        assert_eq!(get("ZERG_SPEC_DIR"), "/workspace/.gsd/specs/feat-x");
        assert!(
            !env.iter().any(|kv| kv.starts_with("ZERG_STATE_DIR=")),
            "nothing of the state dir is inside"
        );
        assert_eq!(get("ZERG_LOG_DIR"), "/zerg/logs");
        assert_eq!(get("ZERG_SOCKET"), "/zerg/run/worker.sock");
        assert_eq!(get("ZERG_WORKER_TOKEN").len(), 64);
        assert_eq!(get("ZERG_REPO_PATH"), "/srv/repo");
        assert_eq!(get("ZERG_WORKER_ID"), "2");
        assert_eq!(get("ZERG_FEATURE"), "feat-x");
        assert_eq!(get("ZERG_BRANCH"), "zerg/feat-x/worker-2");
        assert_eq!(get("ZERG_RUSH_ID"), "r-123");
        assert_eq!(get("ZERG_GENERATION"), "5");
        assert_eq!(get("HOME"), "/home/worker");
        assert!(
            !env.iter().any(|kv| kv.starts_with("GIT_DIR=")
                || kv.starts_with("GIT_OBJECT_DIRECTORY=")
                || kv.starts_with("GIT_COMMON_DIR=")),
            "no git path variables: they would leak into every other repository"
        );
        assert_eq!(get("ANTHROPIC_API_KEY"), "sk-test");
        assert_eq!(get("FAKE_CLAUDE_SCRIPT"), "/tmp/t/script.json");
        let n: usize = get("GIT_CONFIG_COUNT").parse().unwrap();
        let pairs: Vec<(String, String)> = (0..n)
            .map(|i| {
                (
                    get(&format!("GIT_CONFIG_KEY_{i}")),
                    get(&format!("GIT_CONFIG_VALUE_{i}")),
                )
            })
            .collect();
        assert!(pairs.contains(&("safe.directory".into(), "*".into())));
        assert!(pairs.contains(&("user.name".into(), "Ada".into())));
        assert!(pairs.contains(&("gc.auto".into(), "0".into())));
        assert!(pairs.contains(&("core.sparseCheckout".into(), "true".into())));
    }

    #[test]
    fn mounts_follow_the_contract() {
        let s = spec();
        let ms = container_mounts(&s, &facts());
        assert!(ms.iter().all(|m| m.typ == Some(MountType::BIND)));
        let ws = mount(&ms, "/workspace");
        assert_eq!(
            ws.source.as_deref(),
            Some("/srv/repo/.zerg-worktrees/feat-x/worker-2")
        );
        assert_eq!(ws.read_only, Some(false));
        let sp = mount(&ms, "/workspace/.gsd/specs/feat-x");
        assert_eq!(sp.source.as_deref(), Some("/srv/repo/.zerg/specs/feat-x"));
        assert_eq!(sp.read_only, Some(true), "the spec must be read-only");
        // The worker's private git dir at the real one's path; nothing of the real one is
        // writable.
        let git = mount(&ms, "/srv/repo/.git");
        assert_eq!(
            git.source.as_deref(),
            Some("/srv/repo/.git/zerg/feat-x/worker-2")
        );
        let home = mount(&ms, "/home/worker");
        assert_eq!(
            home.source.as_deref(),
            Some("/srv/repo/.git/zerg/feat-x/home-2")
        );
        let cache = mount(&ms, "/home/worker/.cache");
        assert_eq!(
            cache.source.as_deref(),
            Some("/srv/repo/.git/zerg/feat-x/cache-2")
        );
        assert_eq!(cache.read_only, Some(false));
        let ca = mount(&ms, "/zerg/host/SSL_CERT_FILE");
        assert_eq!(ca.source.as_deref(), Some("/etc/corp/ca.pem"));
        assert_eq!(ca.read_only, Some(true));
        let objects = mount(&ms, "/zerg/shared-objects");
        assert_eq!(objects.source.as_deref(), Some("/srv/repo/.git/objects"));
        assert_eq!(objects.read_only, Some(true));
        let logs = mount(&ms, "/zerg/logs");
        assert_eq!(
            logs.source.as_deref(),
            Some("/srv/repo/.zerg/logs/worker-2")
        );
        let run = mount(&ms, "/zerg/run");
        assert_eq!(
            run.source.as_deref(),
            Some("/run/user/0/zerg/w/0123456789abcdef")
        );
        assert_eq!(run.read_only, Some(true));
        let writable: Vec<&str> = ms
            .iter()
            .filter(|m| m.read_only == Some(false))
            .filter_map(|m| m.target.as_deref())
            .collect();
        assert_eq!(
            writable,
            vec![
                "/workspace",
                "/srv/repo/.git",
                "/zerg/logs",
                "/home/worker",
                "/home/worker/.cache",
                "/tmp/t/script.json"
            ]
        );
        for m in &ms {
            let src = m.source.as_deref().unwrap_or("");
            assert!(
                !src.contains("docker.sock") && !src.ends_with("zergd.sock"),
                "{src}"
            );
            assert!(!src.contains(".zerg/state"), "{src}");
            assert!(
                !src.contains("/refs/") && !src.contains("/worktrees/"),
                "no window into the real git dir: {src}"
            );
            assert!(!src.contains(".claude"), "no host Claude config: {src}");
        }
    }

    #[test]
    fn containers_get_the_providers_settings_and_not_the_hosts_paths() {
        let vars = [
            ("ANTHROPIC_BASE_URL", "http://127.0.0.1:9"),
            ("CLAUDE_CODE_OAUTH_TOKEN", "tok"),
            ("CLAUDE_CODE_USE_BEDROCK", "1"),
            ("AWS_REGION", "eu-west-1"),
            ("HTTPS_PROXY", "http://proxy:3128"),
            ("PATH", "/host/bin"),
            ("HOME", "/root"),
            ("CLAUDE_CONFIG_DIR", "/root/.claude"),
            ("CARGO_HOME", "/root/.cargo"),
            ("LD_PRELOAD", "/x.so"),
            ("ZERG_WORKTREE", "/host/wt"),
            ("ZERG_LOG", "debug"),
            ("MY_TOOL_TOKEN", "t"),
            ("OTHER_SECRET", "s"),
            ("SSL_CERT_FILE", "/nonexistent/ca.pem"),
            ("NODE_EXTRA_CA_CERTS", "/etc/hostname"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let extra = vec![
            "MY_TOOL_*".to_string(),
            "PATH".to_string(),
            "LD_PRELOAD".to_string(),
        ];
        let (env, files) = container_passthrough(vars, &extra);
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            vec![
                "ANTHROPIC_BASE_URL",
                "AWS_REGION",
                "CLAUDE_CODE_OAUTH_TOKEN",
                "CLAUDE_CODE_USE_BEDROCK",
                "HTTPS_PROXY",
                "MY_TOOL_TOKEN",
                "NODE_EXTRA_CA_CERTS",
                "ZERG_LOG",
            ]
        );
        assert!(env.contains(&(
            "NODE_EXTRA_CA_CERTS".into(),
            "/zerg/host/NODE_EXTRA_CA_CERTS".into()
        )));
        assert_eq!(
            files,
            vec![(
                "NODE_EXTRA_CA_CERTS".to_string(),
                PathBuf::from("/etc/hostname")
            )]
        );
    }

    #[test]
    fn hardening_and_limits() {
        let s = spec();
        let body = create_body(&s, &facts());
        assert_eq!(body.image.as_deref(), Some(DEFAULT_IMAGE));
        assert_eq!(body.user.as_deref(), Some("10001:10001"));
        assert_eq!(body.entrypoint, Some(vec![AGENT_IN_IMAGE.to_string()]));
        assert_eq!(body.cmd, None);
        assert_eq!(body.working_dir.as_deref(), Some("/workspace"));
        let hc = body.host_config.unwrap();
        assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(hc.security_opt, Some(vec!["no-new-privileges".to_string()]));
        assert_eq!(hc.privileged, Some(false));
        assert_eq!(hc.network_mode.as_deref(), Some("none"));
        assert_eq!(hc.memory, Some(4 << 30));
        assert_eq!(hc.memory_swap, Some(4 << 30));
        assert_eq!(hc.nano_cpus, Some(2_000_000_000));
        assert_eq!(hc.pids_limit, Some(1024));
        assert_eq!(hc.init, Some(true));
        assert_eq!(hc.binds, None);
        let labels = body.labels.unwrap();
        assert_eq!(labels[LABEL_RUSH], "r-123");
        assert_eq!(labels[LABEL_FEATURE], "feat-x");
        assert_eq!(parse_worker_labels(&labels), Some((2, 5)));

        let mut s = spec();
        s.container.image = "zerg-worker:foo".into();
        s.container.network = "bridge".into();
        s.container.memory_bytes = 0;
        s.container.cpus = 0.5;
        s.container.pids_limit = 0;
        let body = create_body(&s, &facts());
        assert_eq!(body.image.as_deref(), Some("zerg-worker:foo"));
        let hc = body.host_config.unwrap();
        assert_eq!(hc.network_mode.as_deref(), Some("bridge"));
        assert_eq!(
            (hc.memory, hc.memory_swap, hc.pids_limit),
            (None, None, None)
        );
        assert_eq!(hc.nano_cpus, Some(500_000_000));
    }

    #[test]
    fn never_root() {
        let (uid, gid, remapped) = container_identity();
        assert_ne!(uid, 0);
        assert_ne!(gid, 0);
        assert_eq!(remapped, nix::unistd::geteuid().is_root());
    }

    #[test]
    fn exit_mapping() {
        assert_eq!(exit_info(0, false), ExitInfo::Code(0));
        assert_eq!(exit_info(3, false), ExitInfo::Code(3));
        assert_eq!(exit_info(137, false), ExitInfo::Code(137));
        assert_eq!(exit_info(137, true), ExitInfo::OomKilled);
        assert_eq!(exit_info(i64::MAX, false), ExitInfo::Code(i32::MAX));
    }

    #[test]
    fn labels_parse_or_skip() {
        let l = |w: &str, g: &str| {
            HashMap::from([
                (LABEL_WORKER.to_string(), w.to_string()),
                (LABEL_GENERATION.to_string(), g.to_string()),
            ])
        };
        assert_eq!(parse_worker_labels(&l("3", "7")), Some((3, 7)));
        assert_eq!(parse_worker_labels(&l("x", "7")), None);
        assert_eq!(parse_worker_labels(&HashMap::new()), None);
        assert_eq!(parse_user("10001:10001"), Some((10001, 10001)));
        assert_eq!(parse_user("worker"), None);
    }

    #[test]
    fn missing_image_message_is_actionable() {
        let e = missing_image("zerg-worker:foo");
        assert!(
            e.message
                .starts_with("image zerg-worker:foo not found: build it with zergctl image build"),
            "{e}"
        );
    }
}
