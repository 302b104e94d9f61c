//! The contract between zergd, its workers and the worker image, in one place: the environment
//! a worker is started with, its exit codes, how it proves who it is, how zergd tells it that
//! its lease is gone, and what the `zerg-worker` image must provide.
//!
//! zergd's launchers, `zerg-worker-agent` and `zergctl image build` all use these definitions,
//! so none of them can drift from the others.

/// The environment variables zergd starts every worker with (the original ZERG's names, plus
/// the token).
pub mod env {
    /// Worker slot number, from 0.
    pub const WORKER_ID: &str = "ZERG_WORKER_ID";
    /// Feature name.
    pub const FEATURE: &str = "ZERG_FEATURE";
    /// The worker's worktree (its working directory).
    pub const WORKTREE: &str = "ZERG_WORKTREE";
    /// The worker's branch.
    pub const BRANCH: &str = "ZERG_BRANCH";
    /// The rush's spec snapshot.
    pub const SPEC_DIR: &str = "ZERG_SPEC_DIR";
    /// `.zerg/state` (subprocess mode only).
    pub const STATE_DIR: &str = "ZERG_STATE_DIR";
    /// The repository root (host path).
    pub const REPO_PATH: &str = "ZERG_REPO_PATH";
    /// Where the worker keeps task output.
    pub const LOG_DIR: &str = "ZERG_LOG_DIR";
    /// The rush's worker-plane socket.
    pub const SOCKET: &str = "ZERG_SOCKET";
    /// The rush id.
    pub const RUSH_ID: &str = "ZERG_RUSH_ID";
    /// The slot's spawn generation.
    pub const GENERATION: &str = "ZERG_GENERATION";
    /// The worker's token (never passed on to the agent CLI).
    pub const WORKER_TOKEN: &str = "ZERG_WORKER_TOKEN";
    /// Set for the agent CLI and verification commands: the task being run.
    pub const TASK_ID: &str = "ZERG_TASK_ID";
    /// Set for the agent CLI and verification commands: the task's handoff directory.
    pub const TASK_DIR: &str = "ZERG_TASK_DIR";
    /// Remote workers (swarm and kubernetes modes): the worker plane's URL,
    /// `https://host:port`. When it is set the agent shares no filesystem with zergd: it fetches
    /// each lease's base over the plane and pushes its commits back.
    pub const PLANE_URL: &str = "ZERG_PLANE_URL";
    /// Remote workers: a file holding the PEM of the CA that signed the plane's certificate.
    pub const PLANE_CA: &str = "ZERG_PLANE_CA";
    /// Remote workers: a file holding the worker's token (a mounted secret, never an
    /// environment variable).
    pub const WORKER_TOKEN_FILE: &str = "ZERG_WORKER_TOKEN_FILE";
}

/// How a worker process ends (the original ZERG's codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerExit {
    /// No work left.
    Success,
    /// Unrecoverable error.
    Error,
    /// Checkpointed; the task resumes elsewhere.
    Checkpoint,
    /// Cannot run tasks at all (the agent CLI is missing).
    Blocked,
    /// Escalated to a human.
    Escalation,
}

impl WorkerExit {
    /// The process exit code.
    pub const fn code(self) -> u8 {
        match self {
            WorkerExit::Success => 0,
            WorkerExit::Error => 1,
            WorkerExit::Checkpoint => 2,
            WorkerExit::Blocked => 3,
            WorkerExit::Escalation => 4,
        }
    }

    /// The exit with this code, if it is one of ours.
    pub fn from_code(code: i32) -> Option<Self> {
        [
            WorkerExit::Success,
            WorkerExit::Error,
            WorkerExit::Checkpoint,
            WorkerExit::Blocked,
            WorkerExit::Escalation,
        ]
        .into_iter()
        .find(|e| i32::from(e.code()) == code)
    }

    /// A word for logs and status.
    pub const fn meaning(self) -> &'static str {
        match self {
            WorkerExit::Success => "success",
            WorkerExit::Error => "error",
            WorkerExit::Checkpoint => "checkpoint",
            WorkerExit::Blocked => "blocked",
            WorkerExit::Escalation => "escalation",
        }
    }
}

/// The environment every git command of zergd and of the worker agent runs with: git must
/// never wait for a terminal or an editor (a merge that opens an editor hangs an unattended
/// run).
pub const GIT_ENV: &[(&str, &str)] = &[
    ("GIT_TERMINAL_PROMPT", "0"),
    ("GIT_EDITOR", "true"),
    ("GIT_MERGE_AUTOEDIT", "no"),
];

/// Variables of zergd's own environment that a worker never inherits: they would load code into
/// every process the worker starts (`LD_PRELOAD`, `DYLD_*`, …) or point the worker's git at
/// another repository than its worktree (`GIT_DIR`, `GIT_WORK_TREE`, …). A name ending in `*`
/// is a prefix.
pub const ENV_DENYLIST: &[&str] = &[
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "DYLD_*",
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_COMMON_DIR",
    "GIT_NAMESPACE",
    "GIT_CEILING_DIRECTORIES",
    "GIT_CONFIG_PARAMETERS",
    "GIT_CONFIG_COUNT",
    "GIT_CONFIG_KEY_*",
    "GIT_CONFIG_VALUE_*",
];

/// A command for `program` that inherits none of the denylisted variables of this process's
/// environment (a `GIT_DIR` or an `LD_PRELOAD` must not redirect or load into it) and runs with
/// [`GIT_ENV`]'s no-prompt settings. Every git that zergd and zergctl run, and every quality
/// gate, starts from this. (The worker agent's environment was already built by zergd.)
pub fn scrubbed_command(program: &str) -> std::process::Command {
    let mut cmd = std::process::Command::new(program);
    for (k, _) in std::env::vars_os() {
        if k.to_str().is_some_and(env_denied) {
            cmd.env_remove(&k);
        }
    }
    cmd.envs(GIT_ENV.iter().copied());
    cmd
}

/// Whether `s` is a full object id: 40 lowercase hex digits (SHA-1) or 64 (SHA-256).
pub fn is_object_id(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether `name` is in [`ENV_DENYLIST`].
pub fn env_denied(name: &str) -> bool {
    matches_any(ENV_DENYLIST, name)
}

/// The variables of zergd's environment a subprocess worker inherits (a name ending in `*` is a
/// prefix); everything else is left behind, so credentials and settings of unrelated tools do
/// not reach code the agent writes. What a worker needs beyond these is named in the config
/// (`agent.env_passthrough`). The denylist wins over both.
pub const ENV_ALLOWLIST: &[&str] = &[
    // The basics of a login environment.
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "TERM",
    "TMPDIR",
    "XDG_*",
    // Networks behind a proxy or with their own certificates.
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NODE_EXTRA_CA_CERTS",
    // The agent CLI and the model providers it may use.
    "ANTHROPIC_*",
    "CLAUDE_*",
    "AWS_*",
    "GOOGLE_*",
    "CLOUDSDK_*",
    // Claude Code's own switch for a machine that is a sandbox: it then accepts
    // `--dangerously-skip-permissions` as root. zergd never sets it.
    "IS_SANDBOX",
    // Toolchains that verification commands run (`cargo test`, `go test`, `npm test`, …).
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
    // Who commits.
    "GIT_AUTHOR_NAME",
    "GIT_AUTHOR_EMAIL",
    "GIT_COMMITTER_NAME",
    "GIT_COMMITTER_EMAIL",
    // The agent's own settings.
    "ZERG_LOG",
    "ZERG_RECONNECT_TIMEOUT_SECONDS",
    "RUST_BACKTRACE",
];

/// Whether a subprocess worker inherits `name` from zergd: allowed by [`ENV_ALLOWLIST`] or by
/// `extra` (the rush's `agent.env_passthrough`, same syntax), and not denied.
pub fn env_inherited(name: &str, extra: &[String]) -> bool {
    !env_denied(name)
        && (matches_any(ENV_ALLOWLIST, name)
            || extra.iter().any(|p| matches_any(&[p.as_str()], name)))
}

fn matches_any(patterns: &[&str], name: &str) -> bool {
    patterns.iter().any(|d| match d.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == *d,
    })
}

/// gRPC metadata key of the worker token on every `Worker` RPC: `authorization: Bearer <hex>`.
pub const TOKEN_METADATA: &str = "authorization";

/// The metadata value for a worker token.
pub fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// gRPC metadata key zergd sets on a refusal that ends a worker's lease or the worker itself,
/// so the agent matches on it instead of on the message text. See [`Revocation`].
pub const REVOKED_METADATA: &str = "zerg-revoked";

/// Why zergd refused a worker's call, when the refusal means "stop what you are doing".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Revocation {
    /// This lease is no longer the task's current one (the task was reassigned or requeued).
    Lease(String),
    /// A newer generation replaced this worker process: it must exit.
    Superseded,
}

impl Revocation {
    /// The metadata value (`lease:<id>` or `superseded`).
    pub fn to_metadata(&self) -> String {
        match self {
            Revocation::Lease(id) => format!("lease:{id}"),
            Revocation::Superseded => "superseded".into(),
        }
    }

    /// Parses a metadata value written by [`Revocation::to_metadata`].
    pub fn from_metadata(v: &str) -> Option<Self> {
        match v.strip_prefix("lease:") {
            Some(id) => Some(Revocation::Lease(id.to_string())),
            None => (v == "superseded").then_some(Revocation::Superseded),
        }
    }

    /// The revocation a refusal carries, if any.
    pub fn of_status(s: &tonic::Status) -> Option<Self> {
        s.metadata()
            .get(REVOKED_METADATA)
            .and_then(|v| v.to_str().ok())
            .and_then(Self::from_metadata)
    }

    /// Marks a refusal with this revocation.
    pub fn mark(&self, mut s: tonic::Status) -> tonic::Status {
        if let Ok(v) = self.to_metadata().parse() {
            s.metadata_mut().insert(REVOKED_METADATA, v);
        }
        s
    }
}

/// The largest values zergd accepts in a worker's call; the agent keeps what it sends within
/// them, and zergd refuses anything larger with `InvalidArgument` naming the field.
pub mod limits {
    /// Longest rush, task or lease id.
    pub const MAX_ID: usize = 256;
    /// Longest free text: failure messages, escalation messages and context, output tails.
    pub const MAX_TEXT: usize = 64 * 1024;
    /// Longest list of out-of-scope paths.
    pub const MAX_PATHS: usize = 10_000;
    /// Longest path in such a list.
    pub const MAX_PATH: usize = 4096;
    /// Most tier results in one report.
    pub const MAX_TIERS: usize = 16;
    /// Longest short name: tier names, escalation categories, model names, limit types.
    pub const MAX_NAME: usize = 128;
    /// Most models in one usage report.
    pub const MAX_MODELS: usize = 64;
    /// Largest git object (inflated) zergd takes from a worker, unless `container.max_object_size`
    /// says otherwise.
    pub const MAX_OBJECT_BYTES: u64 = 100 << 20;
    /// Largest pack zergd takes from a worker, unless `container.max_pack_size` says otherwise.
    pub const MAX_PACK_BYTES: u64 = 512 << 20;

    /// `s` cut to at most `max` bytes, at a character boundary.
    pub fn clip(s: &str, max: usize) -> &str {
        if s.len() <= max {
            return s;
        }
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        &s[..end]
    }
}

/// What the `zerg-worker` image provides, and how a worker container is laid out.
pub mod image {
    /// The image used when the rush config names none.
    pub const DEFAULT_TAG: &str = "zerg-worker:latest";
    /// The uid (and gid) of the image's `worker` user, which the agent runs as when zergd runs
    /// as root.
    pub const WORKER_UID: u32 = 10001;
    /// The agent binary inside the image (the container's entrypoint).
    pub const AGENT_PATH: &str = "/usr/local/bin/zerg-worker-agent";
    /// The worker's home inside the image.
    pub const HOME: &str = "/home/worker";
    /// Where the worktree is mounted.
    pub const WORKSPACE: &str = "/workspace";
    /// Remote workers: where the plane's CA certificate is mounted (a Swarm config or a
    /// Kubernetes ConfigMap).
    pub const REMOTE_CA_PATH: &str = "/zerg/remote/ca.pem";
    /// Remote workers: the directory the worker's token secret is mounted in.
    pub const SECRET_DIR: &str = "/run/secrets";
    /// Remote workers: the file name of the token inside [`SECRET_DIR`].
    pub const TOKEN_FILE_NAME: &str = "zerg-token";
    /// Where the worker's own log dir is mounted.
    pub const LOG_MOUNT: &str = "/zerg/logs";
    /// Where the rush's worker-plane directory is mounted.
    pub const RUN_MOUNT: &str = "/zerg/run";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_round_trip() {
        for e in [
            WorkerExit::Success,
            WorkerExit::Error,
            WorkerExit::Checkpoint,
            WorkerExit::Blocked,
            WorkerExit::Escalation,
        ] {
            assert_eq!(WorkerExit::from_code(i32::from(e.code())), Some(e));
        }
        assert_eq!(WorkerExit::from_code(137), None);
    }

    #[test]
    fn the_denylist_catches_loaders_and_git_redirections() {
        for bad in [
            "LD_PRELOAD",
            "DYLD_INSERT_LIBRARIES",
            "GIT_DIR",
            "GIT_CONFIG_KEY_0",
        ] {
            assert!(env_denied(bad), "{bad}");
        }
        for ok in [
            "PATH",
            "HOME",
            "ANTHROPIC_API_KEY",
            "GIT_AUTHOR_NAME",
            "LD_PRELOADX",
        ] {
            assert!(!env_denied(ok), "{ok}");
        }
    }

    #[test]
    fn revocations_travel_in_metadata() {
        for r in [Revocation::Lease("T-1#2".into()), Revocation::Superseded] {
            let s = r.mark(tonic::Status::failed_precondition("gone"));
            assert_eq!(Revocation::of_status(&s), Some(r));
        }
        assert_eq!(
            Revocation::of_status(&tonic::Status::failed_precondition("superseded")),
            None,
            "the message text means nothing"
        );
    }
}
