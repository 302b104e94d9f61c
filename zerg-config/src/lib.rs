//! `.zerg/config.yaml` as plain data: the per-repository settings a rush runs with, each section
//! a type, read once by zergd and handed to whoever needs it (the launchers, the symbol map).
//!
//! Keys and defaults follow the original ZERG plus the resilience keys of the
//! requirements. Sections that the original knows but this engine does not use (`plugins`, `mcp_servers`,
//! `git`, …) are accepted silently; any other key the config types do not know (found by
//! `serde_ignored`, at any depth) produces a warning; a value of the wrong
//! type is an error that names the key path.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How a backoff delay grows with the attempt number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum BackoffStrategy {
    /// `base · 2^attempt`.
    #[default]
    Exponential,
    /// `base · attempt`.
    Linear,
    /// `base`.
    Fixed,
}

/// The whole config file.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct Config {
    /// Worker and task-retry settings.
    pub workers: WorkersConfig,
    /// Master switch for the resilience loops.
    pub resilience: ResilienceConfig,
    /// The agent CLI the workers run.
    pub agent: AgentConfig,
    /// Three-tier verification.
    pub verification_tiers: VerificationTiers,
    /// Gates run on staging after every level merge.
    pub quality_gates: Vec<QualityGate>,
    /// Where the gates run.
    pub gates: GatesConfig,
    /// Container mode settings (swarm and kubernetes modes use its image, network and pack
    /// limits too).
    pub container: ContainerConfig,
    /// The TCP worker plane of remote workers (swarm and kubernetes modes).
    pub remote: RemoteConfig,
    /// Kubernetes mode: namespace, service account, resources, node selector.
    pub kubernetes: KubernetesSettings,
    /// Resource limits for container workers.
    pub resources: ResourcesConfig,
    /// The repository symbol map behind each prompt's `## Relevant Symbols` section.
    pub symbols: SymbolsConfig,
    /// zergd's own commits (the staging merges).
    pub git: GitConfig,
    /// What the agent may spend.
    pub budget: BudgetConfig,
    /// How long the repository's logs are kept, and how large one grows.
    pub logging: LoggingConfig,
    /// What a worker's worktree needs beyond the tracked files: ignored files copied from the
    /// checkout, and setup commands.
    pub worktree: WorktreeConfig,
    /// Who hears when a rush ends or pauses, or a task fails for good.
    pub notify: NotifyConfig,
    /// `zergctl design`: the agent writing a feature's task graph.
    pub design: DesignConfig,
    /// What a conflict at a level merge becomes.
    pub merge: MergeConfig,
    /// How subprocess workers (and the gates run on the host) are confined.
    pub sandbox: SandboxConfig,
}

/// `sandbox:` section: the wall around subprocess workers and host gates.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct SandboxConfig {
    /// `auto` (confine where the kernel allows it), `strict` (refuse to start a rush that
    /// cannot be confined) or `off`.
    pub mode: SandboxMode,
    /// More paths a confined worker may read (and run), at the same path inside.
    pub read_only: Vec<String>,
    /// More paths a confined worker may write, at the same path inside.
    pub read_write: Vec<String>,
    /// More hosts (`name`, `name:port`, or `*.suffix`) the egress proxy lets a worker reach,
    /// beyond the model provider's.
    pub allow_hosts: Vec<String>,
    /// Hosts the `worktree.setup` commands may reach as well (package registries).
    pub setup_allow_hosts: Vec<String>,
}

/// `sandbox.mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxMode {
    /// Confine wherever the machine allows it, and say what is in effect.
    #[default]
    Auto,
    /// Refuse to start a rush that cannot be fully confined.
    Strict,
    /// No confinement (subprocess workers act as the user).
    Off,
}

impl SandboxMode {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::Auto => "auto",
            SandboxMode::Strict => "strict",
            SandboxMode::Off => "off",
        }
    }
}

/// `merge:` section: a conflict while merging a worker's branch into staging.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct MergeConfig {
    /// `agent`: the conflict becomes a resolution task that a worker's agent resolves; `pause`:
    /// the rush pauses for a person to resolve it on the staging branch.
    pub resolve: MergeResolve,
    /// Attempts of one resolution task before the rush pauses, naming the files.
    pub resolve_attempts: u32,
}

impl Default for MergeConfig {
    fn default() -> Self {
        Self {
            resolve: MergeResolve::Agent,
            resolve_attempts: 2,
        }
    }
}

/// Who resolves a merge conflict.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MergeResolve {
    /// A resolution task, run by a worker's agent.
    #[default]
    Agent,
    /// A person: the rush pauses.
    Pause,
}

/// `design:` section: `zergctl design FEATURE`, where the agent CLI writes the task graph from
/// the feature's requirements.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct DesignConfig {
    /// Agent runs at most: the first, and one more for each time its graph had problems (they
    /// are given back to it).
    pub max_rounds: u32,
}

impl Default for DesignConfig {
    fn default() -> Self {
        Self { max_rounds: 3 }
    }
}

/// `notify:` section: telling someone when a rush completes, fails, is stopped or pauses, and
/// when a task fails for good. Each configured way is tried on its own, never holding the rush.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct NotifyConfig {
    /// A shell command run (`sh -c`, in the repository) with the event as one JSON object on
    /// its stdin.
    pub command: String,
    /// An `http://` or `https://` URL the event is POSTed to as JSON.
    pub webhook: String,
    /// A desktop notification (`notify-send` on Linux, `osascript` on macOS) when the tool is
    /// there.
    pub desktop: bool,
    /// Time limit of one command run or one webhook request.
    #[serde(with = "seconds")]
    pub timeout_seconds: Duration,
    /// Webhook attempts after the first that failed (a connection error, a timeout, or an
    /// answer other than 2xx), 1 s, 2 s, 4 s … apart.
    pub webhook_retries: u32,
    /// Which events are sent; all of them by default: `rush_complete`, `rush_failed`,
    /// `rush_stopped`, `rush_paused`, `task_failed`.
    pub events: Vec<String>,
}

/// Every event `notify.events` may name.
pub const NOTIFY_EVENTS: [&str; 5] = [
    "rush_complete",
    "rush_failed",
    "rush_stopped",
    "rush_paused",
    "task_failed",
];

impl NotifyConfig {
    /// Whether any way of notifying is configured.
    pub fn enabled(&self) -> bool {
        !self.command.trim().is_empty() || !self.webhook.trim().is_empty() || self.desktop
    }

    /// Whether `event` is sent.
    pub fn wants(&self, event: &str) -> bool {
        self.enabled() && (self.events.is_empty() || self.events.iter().any(|e| e == event))
    }

    /// The webhook is an http(s) URL; events are known ones; the limits are positive.
    fn check(&self) -> Result<(), String> {
        let url = self.webhook.trim();
        if !(url.is_empty() || url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "notify.webhook: must be an http:// or https:// URL, got {url:?}"
            ));
        }
        for (i, e) in self.events.iter().enumerate() {
            if !NOTIFY_EVENTS.contains(&e.as_str()) {
                return Err(format!(
                    "notify.events[{i}]: unknown event {e:?} (one of {})",
                    NOTIFY_EVENTS.join(", ")
                ));
            }
        }
        if self.timeout_seconds.is_zero() {
            return Err("notify.timeout_seconds: must be more than 0".into());
        }
        if self.webhook_retries > 10 {
            return Err(format!(
                "notify.webhook_retries: at most 10, got {}",
                self.webhook_retries
            ));
        }
        Ok(())
    }
}

impl Default for NotifyConfig {
    fn default() -> Self {
        Self {
            command: String::new(),
            webhook: String::new(),
            desktop: false,
            timeout_seconds: Duration::from_secs(10),
            webhook_retries: 3,
            events: Vec::new(),
        }
    }
}

/// `worktree:` section: making a worker's worktree like the user's checkout. A worktree holds
/// only tracked files; a project whose tests read a gitignored `.env`, or need `npm ci`, a
/// venv or generated files first, says so here.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct WorktreeConfig {
    /// Ignored files copied from the checkout into each worker's worktree and the staging
    /// worktree: paths or git glob pathspecs (`.env`, `config/*.local.json`, `secrets/`),
    /// relative to the repository root. Tracked files are never copied (they are there already).
    pub copy: Vec<String>,
    /// The most `copy` may bring into each worktree (MiB, all files together); more is an
    /// error at rush start naming the largest files.
    pub copy_max_mb: u64,
    /// Shell commands run in order in a worker's worktree before its first task, and again
    /// when a level merge changed any file of `setup_when_changed`; also in the staging
    /// worktree before the quality gates. A failure pauses the rush (an environment error),
    /// rather than failing tasks.
    pub setup: Vec<String>,
    /// Files whose change reruns `setup` (lock files: `package-lock.json`, `uv.lock`,
    /// `Cargo.lock`).
    pub setup_when_changed: Vec<String>,
    /// Time limit of the whole setup.
    #[serde(with = "seconds")]
    pub setup_timeout_seconds: Duration,
}

impl WorktreeConfig {
    /// Copy entries and lock files name paths inside the repository; setup commands are not
    /// blank.
    fn check(&self) -> Result<(), String> {
        for (key, list) in [
            ("worktree.copy", &self.copy),
            ("worktree.setup_when_changed", &self.setup_when_changed),
        ] {
            for (i, p) in list.iter().enumerate() {
                let path = Path::new(p.trim());
                if p.trim().is_empty()
                    || path.is_absolute()
                    || path
                        .components()
                        .any(|c| matches!(c, std::path::Component::ParentDir))
                {
                    return Err(format!(
                        "{key}[{i}]: must be a path inside the repository, relative to its root, got {p:?}"
                    ));
                }
            }
        }
        if self.copy_max_mb == 0 {
            return Err("worktree.copy_max_mb: must be at least 1".into());
        }
        for (i, c) in self.setup.iter().enumerate() {
            if c.trim().is_empty() {
                return Err(format!("worktree.setup[{i}]: must not be empty"));
            }
        }
        Ok(())
    }
}

impl Default for WorktreeConfig {
    fn default() -> Self {
        Self {
            copy: Vec::new(),
            copy_max_mb: 64,
            setup: Vec::new(),
            setup_when_changed: Vec::new(),
            setup_timeout_seconds: Duration::from_secs(600),
        }
    }
}

/// `logging:` section. The original's other keys in this section (`level`, `directory`, …)
/// are accepted and ignored.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct LoggingConfig {
    /// Days a rotated log is kept.
    pub retain_days: u32,
    /// A log larger than this (MiB) when a rush starts is rotated.
    pub max_log_size_mb: u64,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        Self {
            retain_days: 7,
            max_log_size_mb: 50,
        }
    }
}

/// `git:` section. The original's keys in this section are accepted and ignored.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct GitConfig {
    /// Who zergd's merge commits are by when git has no identity for the repository.
    pub identity: GitIdentity,
}

/// `git.identity`: the author and committer of zergd's merge commits on a machine where git
/// has none (`git var GIT_COMMITTER_IDENT` fails: no `user.name` / `user.email` anywhere). Where
/// git has one, the merges are the user's, as their own commits are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct GitIdentity {
    /// Name.
    pub name: String,
    /// Email address.
    pub email: String,
}

impl Default for GitIdentity {
    fn default() -> Self {
        Self {
            name: "zerg".into(),
            email: "zerg@localhost".into(),
        }
    }
}

/// `budget:` section. Costs are the ones the agent CLI reports (Claude Code's
/// `total_cost_usd`).
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct BudgetConfig {
    /// Once a rush's cost reaches this (USD), no new task starts and the rush pauses with the
    /// reason `budget`; `zergctl rush --max-usd` sets it for one rush.
    pub max_usd: Option<f64>,
    /// Passed to the agent CLI as `--max-budget-usd` (Claude Code's cap on one invocation).
    pub task_max_usd: Option<f64>,
}

/// `workers:` section.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkersConfig {
    /// Retries of a task that failed (after the first attempt).
    pub retry_attempts: u32,
    /// Task retry backoff curve.
    pub backoff_strategy: BackoffStrategy,
    /// Task retry backoff base, seconds.
    #[serde(with = "seconds")]
    pub backoff_base_seconds: Duration,
    /// Task retry backoff cap, seconds.
    #[serde(with = "seconds")]
    pub backoff_max_seconds: Duration,
    /// Retries of a worker spawn that failed.
    pub spawn_retry_attempts: u32,
    /// Spawn backoff curve.
    pub spawn_backoff_strategy: BackoffStrategy,
    /// Spawn backoff base, seconds.
    #[serde(with = "seconds")]
    pub spawn_backoff_base_seconds: Duration,
    /// Spawn backoff cap, seconds.
    #[serde(with = "seconds")]
    pub spawn_backoff_max_seconds: Duration,
    /// A task with no progress for this long is failed with reason `timeout`.
    #[serde(with = "seconds")]
    pub task_stale_timeout_seconds: Duration,
    /// How often agents send a heartbeat.
    #[serde(with = "seconds")]
    pub heartbeat_interval_seconds: Duration,
    /// A worker with no heartbeat for this long is stale.
    #[serde(with = "seconds")]
    pub heartbeat_stale_threshold: Duration,
    /// Replace workers that exit while work remains.
    pub auto_respawn: bool,
    /// Respawns allowed per worker slot within `respawn_window_seconds`.
    pub max_respawn_attempts: u32,
    /// Window for counting respawns.
    #[serde(with = "seconds")]
    pub respawn_window_seconds: Duration,
    /// A spawned worker must register within this long.
    #[serde(with = "seconds")]
    pub spawn_ready_timeout_seconds: Duration,
    /// Grace between SIGTERM and SIGKILL when stopping a worker.
    #[serde(with = "seconds")]
    pub stop_grace_seconds: Duration,
    /// Interval of the light reconciliation check.
    #[serde(with = "seconds")]
    pub reconcile_interval_seconds: Duration,
    /// How long after a usage limit's stated reset new work stays held (clocks differ).
    #[serde(with = "seconds")]
    pub usage_limit_margin_seconds: Duration,
    /// Accepted for compatibility; the rush's `--workers` decides.
    pub max_concurrent: Option<u32>,
    /// Accepted for compatibility; unused.
    pub timeout_minutes: Option<u32>,
    /// Accepted for compatibility; `--mode` decides.
    pub launcher_type: Option<String>,
    /// Accepted for compatibility; unused.
    pub context_threshold_percent: Option<u32>,
    /// Accepted for compatibility; unused.
    pub task_list_id: Option<String>,
}

impl Default for WorkersConfig {
    fn default() -> Self {
        Self {
            retry_attempts: 3,
            backoff_strategy: BackoffStrategy::Exponential,
            backoff_base_seconds: Duration::from_secs_f64(30.0),
            backoff_max_seconds: Duration::from_secs_f64(300.0),
            spawn_retry_attempts: 3,
            spawn_backoff_strategy: BackoffStrategy::Exponential,
            spawn_backoff_base_seconds: Duration::from_secs_f64(2.0),
            spawn_backoff_max_seconds: Duration::from_secs_f64(30.0),
            task_stale_timeout_seconds: Duration::from_secs_f64(600.0),
            heartbeat_interval_seconds: Duration::from_secs_f64(30.0),
            heartbeat_stale_threshold: Duration::from_secs_f64(120.0),
            auto_respawn: true,
            max_respawn_attempts: 5,
            respawn_window_seconds: Duration::from_secs_f64(600.0),
            spawn_ready_timeout_seconds: Duration::from_secs_f64(60.0),
            stop_grace_seconds: Duration::from_secs_f64(10.0),
            reconcile_interval_seconds: Duration::from_secs_f64(60.0),
            usage_limit_margin_seconds: Duration::from_secs_f64(30.0),
            max_concurrent: None,
            timeout_minutes: None,
            launcher_type: None,
            context_threshold_percent: None,
            task_list_id: None,
        }
    }
}

/// `resilience:` section.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct ResilienceConfig {
    /// When false, spawn retry, respawn and the watchdogs are off: the first failure is final.
    pub enabled: bool,
}

impl Default for ResilienceConfig {
    fn default() -> Self {
        Self { enabled: true }
    }
}

/// Which agent CLI the workers drive, and so how its output is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AgentProfile {
    /// Claude Code: stream-json events (result, cost, tokens, limits, API errors).
    #[default]
    Claude,
    /// OpenAI's Codex CLI: `codex exec --json` events (tokens, failed turns; no cost).
    Codex,
    /// Any other CLI: the exit code decides, and usage limits are read from its text.
    Plain,
}

impl AgentProfile {
    /// The name, as in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentProfile::Claude => "claude",
            AgentProfile::Codex => "codex",
            AgentProfile::Plain => "plain",
        }
    }
}

/// The default `agent.command`: Claude Code in print mode with its stream-json events.
pub fn claude_command() -> Vec<String> {
    [
        "claude",
        "--print",
        "--dangerously-skip-permissions",
        // Machine-readable events: the result with its cost and tokens, usage limits, API
        // retries. Claude Code refuses stream-json under --print without --verbose.
        "--output-format",
        "stream-json",
        "--verbose",
    ]
    .map(String::from)
    .to_vec()
}

/// The command of `profile: codex` when `agent.command` is left at its default.
pub fn codex_command() -> Vec<String> {
    [
        "codex",
        "exec",
        "--json",
        "--dangerously-bypass-approvals-and-sandbox",
    ]
    .map(String::from)
    .to_vec()
}

/// `agent:` section.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentConfig {
    /// How the agent CLI's output is read: `claude`, `codex` or `plain`.
    pub profile: AgentProfile,
    /// argv of the agent CLI; the prompt is appended as the last argument. Left at its
    /// default with `profile: codex`, the Codex CLI runs instead ([`codex_command`]).
    pub command: Vec<String>,
    /// Wall-clock limit for one agent run.
    #[serde(with = "seconds")]
    pub timeout_seconds: Duration,
    /// Variables of zergd's environment that subprocess workers inherit beyond the built-in
    /// allowlist (`MY_TOOL_TOKEN`, or a prefix such as `MY_TOOL_*`).
    pub env_passthrough: Vec<String>,
    /// The model of each attempt: attempt k runs with `models[k-1]`, the last repeating
    /// (Claude Code's `--model`, Codex's `-m`); empty: the CLI's own default.
    pub models: Vec<String>,
    /// The most a retry's prompt says of the failed attempt before it (`## Previous attempt`:
    /// how it failed, the failed tier's output tail, the agent's last message), in bytes.
    pub retry_context_bytes: ByteSize,
}

impl AgentConfig {
    /// The model attempt `attempt` (1 for the first) runs with, if `models` names any.
    pub fn model_for(&self, attempt: u32) -> Option<&str> {
        let i = (attempt.max(1) as usize - 1).min(self.models.len().checked_sub(1)?);
        self.models.get(i).map(String::as_str)
    }

    /// The arguments that give the agent CLI `model`, as the profile's CLI takes them.
    pub fn model_args(&self, model: &str) -> Vec<String> {
        match self.profile {
            AgentProfile::Claude => vec!["--model".into(), model.into()],
            AgentProfile::Codex => vec!["-m".into(), model.into()],
            AgentProfile::Plain => Vec::new(),
        }
    }

    /// The command the workers run: `command`, or Codex's when the profile is `codex` and
    /// `command` was left at Claude Code's default.
    pub fn effective_command(&self) -> Vec<String> {
        if self.profile == AgentProfile::Codex && self.command == claude_command() {
            codex_command()
        } else {
            self.command.clone()
        }
    }
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            profile: AgentProfile::Claude,
            command: claude_command(),
            timeout_seconds: Duration::from_secs_f64(1800.0),
            env_passthrough: Vec::new(),
            retry_context_bytes: ByteSize(8 << 10),
            models: Vec::new(),
        }
    }
}

/// `verification_tiers:` section.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct VerificationTiers {
    /// Whether a tier 1 failure fails the task.
    pub tier1_blocking: bool,
    /// Tier 1 (syntax) command.
    pub tier1_command: Option<String>,
    /// Whether a tier 2 failure fails the task.
    pub tier2_blocking: bool,
    /// Tier 2 (correctness) command; defaults to the task's verification command.
    pub tier2_command: Option<String>,
    /// Whether a tier 3 failure fails the task.
    pub tier3_blocking: bool,
    /// Tier 3 (quality) command.
    pub tier3_command: Option<String>,
    /// Timeout for tiers 1 and 3 (tier 2 uses the task's own timeout when it runs the task's command).
    #[serde(with = "seconds")]
    pub timeout_seconds: Duration,
}

impl Default for VerificationTiers {
    fn default() -> Self {
        Self {
            tier1_blocking: true,
            tier1_command: None,
            tier2_blocking: true,
            tier2_command: None,
            tier3_blocking: false,
            tier3_command: None,
            timeout_seconds: Duration::from_secs_f64(300.0),
        }
    }
}

/// One entry of `quality_gates:`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct QualityGate {
    /// Gate name, shown in status.
    pub name: String,
    /// Shell command, run with `sh -c` in the staging worktree.
    pub command: String,
    /// A failing required gate pauses the rush.
    #[serde(default)]
    pub required: bool,
    /// Timeout in seconds.
    #[serde(default = "default_gate_timeout")]
    #[serde(with = "seconds")]
    pub timeout: Duration,
    /// Accepted for compatibility; unused.
    #[serde(default)]
    pub coverage_threshold: Option<f64>,
}

fn default_gate_timeout() -> Duration {
    Duration::from_secs_f64(300.0)
}

/// `gates:` section: where `quality_gates` run.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct GatesConfig {
    /// In container, swarm and kubernetes rushes: `worker-image` (a fresh container of the
    /// rush's image) or `host` (zergd's machine, as zergd's user). Subprocess rushes always run
    /// them on the host.
    pub run_on: GatesRunOn,
}

/// Where a container rush's quality gates run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GatesRunOn {
    /// A fresh container of the rush's image, with the workers' limits.
    #[default]
    WorkerImage,
    /// zergd's machine, as zergd's user.
    Host,
}

/// `container:` section.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct ContainerConfig {
    /// Image the workers run in.
    pub image: String,
    /// Docker network for worker containers.
    pub network: String,
    /// Largest git object (inflated) zergd imports from a worker container.
    pub max_object_size: ByteSize,
    /// Largest pack file zergd imports from a worker container.
    pub max_pack_size: ByteSize,
    /// Largest log the engine keeps per worker container, and largest `worker-<N>.log` the
    /// mirror writes for one container.
    pub log_max_size: ByteSize,
    /// The most artifacts a remote worker may push for one task attempt.
    pub artifacts_max_files: u64,
    /// The most artifact bytes zergd keeps for one task attempt.
    pub artifacts_max_bytes: ByteSize,
    /// The most artifacts a rush's remote workers may push in all.
    pub rush_artifacts_max_files: u64,
    /// The most artifact bytes zergd keeps for one rush in all.
    pub rush_artifacts_max_bytes: ByteSize,
}

impl Default for ContainerConfig {
    fn default() -> Self {
        use zerg_proto::contract::limits::{MAX_OBJECT_BYTES, MAX_PACK_BYTES};
        Self {
            image: "zerg-worker:latest".into(),
            network: "none".into(),
            max_object_size: ByteSize(MAX_OBJECT_BYTES as i64),
            max_pack_size: ByteSize(MAX_PACK_BYTES as i64),
            log_max_size: ByteSize(64 << 20),
            artifacts_max_files: 64,
            artifacts_max_bytes: ByteSize(256 << 20),
            rush_artifacts_max_files: 100_000,
            rush_artifacts_max_bytes: ByteSize(4 << 30),
        }
    }
}

/// `remote:` section: how workers that share no filesystem with zergd reach it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default)]
pub struct RemoteConfig {
    /// Address the TCP worker plane listens on (`host:port`). One zergd serves every remote
    /// rush on one address: a second remote rush with another address is refused.
    pub listen: String,
    /// The URL workers dial (`https://host:port`); empty means `https://<listen>`.
    pub advertise_url: String,
    /// The operator's server certificate chain (PEM file); empty means zergd mints a CA and a
    /// server certificate of its own and keeps them under its state directory.
    pub tls_cert: String,
    /// The key of `tls_cert` (PEM file).
    pub tls_key: String,
    /// The CA that signed `tls_cert` (PEM file), which workers trust.
    pub tls_ca: String,
    /// Connections the TCP plane holds in all.
    pub max_connections: u32,
    /// Connections one peer address may hold on the TCP plane.
    pub max_connections_per_peer: u32,
    /// How long a new TCP connection has to finish its TLS handshake and make its first call
    /// with a valid worker token; it is closed otherwise.
    #[serde(with = "seconds")]
    pub handshake_timeout: Duration,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:7446".into(),
            advertise_url: String::new(),
            tls_cert: String::new(),
            tls_key: String::new(),
            tls_ca: String::new(),
            max_connections: 1024,
            max_connections_per_peer: 64,
            handshake_timeout: Duration::from_secs(10),
        }
    }
}

impl RemoteConfig {
    /// The URL workers dial.
    pub fn url(&self) -> String {
        if self.advertise_url.is_empty() {
            format!("https://{}", self.listen)
        } else {
            self.advertise_url.trim_end_matches('/').to_string()
        }
    }
}

/// `resources:` section.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct ResourcesConfig {
    /// Memory limit per container, Docker syntax (`4g`, `512m`), checked when the file is read.
    pub container_memory_limit: ByteSize,
    /// CPU limit per container.
    pub container_cpu_limit: f64,
    /// Process limit per container.
    pub container_pids_limit: i64,
    /// Accepted for compatibility; unused.
    pub cpu_cores: Option<f64>,
    /// Accepted for compatibility; unused.
    pub memory_gb: Option<f64>,
    /// Accepted for compatibility; unused.
    pub disk_gb: Option<f64>,
}

impl Default for ResourcesConfig {
    fn default() -> Self {
        Self {
            container_memory_limit: ByteSize(4 << 30),
            container_cpu_limit: 2.0,
            container_pids_limit: 1024,
            cpu_cores: None,
            memory_gb: None,
            disk_gb: None,
        }
    }
}

/// When the kubelet pulls the worker image (the container's `imagePullPolicy`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ImagePullPolicy {
    /// Pull on every start.
    Always,
    /// Pull only when the node does not have the image.
    #[default]
    IfNotPresent,
    /// Never pull: the image must be on the node.
    Never,
}

impl ImagePullPolicy {
    /// The name Kubernetes gives the policy.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

/// `kubernetes:` section: where and how worker Jobs run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct KubernetesSettings {
    /// Namespace of the Jobs, Secrets and ConfigMaps.
    pub namespace: String,
    /// Service account the worker pods run as; the namespace's `default` when unset. Its API
    /// token is never mounted.
    pub service_account: Option<String>,
    /// Node labels a worker pod must match (`nodeSelector`).
    pub node_selector: BTreeMap<String, String>,
    /// CPU request of a worker (`500m`, `1`); none when unset.
    pub cpu_request: Option<String>,
    /// CPU limit of a worker (`2`); `resources.container_cpu_limit` when unset.
    pub cpu_limit: Option<String>,
    /// Memory request of a worker (`1Gi`); none when unset.
    pub memory_request: Option<String>,
    /// Memory limit of a worker (`4Gi`); `resources.container_memory_limit` when unset.
    pub memory_limit: Option<String>,
    /// Seconds a finished Job (and its pod, Secret and ConfigMap) is kept before Kubernetes
    /// deletes it.
    pub ttl_seconds_after_finished: u32,
    /// When the kubelet pulls the image: `Always`, `IfNotPresent` or `Never`.
    pub image_pull_policy: ImagePullPolicy,
}

impl Default for KubernetesSettings {
    fn default() -> Self {
        Self {
            namespace: "default".into(),
            service_account: None,
            node_selector: BTreeMap::new(),
            cpu_request: None,
            cpu_limit: None,
            memory_request: None,
            memory_limit: None,
            ttl_seconds_after_finished: 3600,
            image_pull_policy: ImagePullPolicy::IfNotPresent,
        }
    }
}

/// A language the symbol map understands. TypeScript covers `.ts` and `.tsx` files (two
/// grammars); JavaScript covers `.js`, `.jsx`, `.mjs` and `.cjs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// `.py`, `.pyi`.
    Python,
    /// `.js`, `.jsx`, `.mjs`, `.cjs`.
    #[serde(rename = "javascript")]
    JavaScript,
    /// `.ts`, `.tsx`, `.mts`, `.cts`.
    #[serde(rename = "typescript")]
    TypeScript,
    /// `.rs`.
    Rust,
    /// `.go`.
    Go,
}

impl Language {
    /// Every language, in the order the config lists them by default.
    pub const ALL: [Language; 5] = [
        Language::Python,
        Language::JavaScript,
        Language::TypeScript,
        Language::Rust,
        Language::Go,
    ];

    /// The name used in the config and in output.
    pub fn name(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::JavaScript => "javascript",
            Language::TypeScript => "typescript",
            Language::Rust => "rust",
            Language::Go => "go",
        }
    }

    /// Languages whose files import each other: JavaScript and TypeScript are one family.
    pub fn family(self) -> Language {
        match self {
            Language::JavaScript => Language::TypeScript,
            other => other,
        }
    }
}

/// The `symbols:` section of `.zerg/config.yaml`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SymbolsConfig {
    /// Whether task prompts get a `## Relevant Symbols` section.
    pub enabled: bool,
    /// The languages to index; files in other languages are skipped.
    pub languages: Vec<Language>,
    /// The most bytes the section of one task may take.
    pub max_bytes_per_task: usize,
    /// Files larger than this are skipped, unread.
    pub max_file_bytes: u64,
}

impl Default for SymbolsConfig {
    fn default() -> Self {
        SymbolsConfig {
            enabled: true,
            languages: Language::ALL.to_vec(),
            max_bytes_per_task: 4096,
            max_file_bytes: 1 << 20,
        }
    }
}

impl SymbolsConfig {
    /// Range checks beyond the types; the message starts with the key.
    pub fn check(&self) -> Result<(), String> {
        if self.max_bytes_per_task == 0 {
            return Err("symbols.max_bytes_per_task: must be positive".into());
        }
        if self.max_file_bytes == 0 {
            return Err("symbols.max_file_bytes: must be positive".into());
        }
        Ok(())
    }
}

/// A config file that could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file exists but could not be read.
    #[error("cannot read {path}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Wrong type, bad value or bad YAML; the message names the key path.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong, starting with the key path.
        message: String,
    },
}

/// Top-level sections of the original ZERG config that this engine accepts and ignores.
const IGNORED_SECTIONS: &[&str] = &[
    "project",
    "ports",
    "mcp_servers",
    "logging",
    "security",
    "plugins",
    "efficiency",
    "rules",
    "error_recovery",
    "git",
    "improvement_loops",
    "behavioral_modes",
    "verification",
    "mcp_routing",
    "tdd",
    "heartbeat",
    "escalation",
    "repo_map",
    "token_metrics",
    "planning",
    "rush",
    "analyze",
    "architecture",
];

impl Config {
    /// Loads `<repo>/.zerg/config.yaml`; a missing file gives the defaults.
    /// Returns the config and the warnings (unknown keys).
    pub fn load(repo: &Path) -> Result<(Config, Vec<String>), ConfigError> {
        let path = repo.join(".zerg").join("config.yaml");
        match std::fs::read_to_string(&path) {
            Ok(text) => Self::parse(&text, &path.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((Config::default(), vec![])),
            Err(source) => Err(ConfigError::Io {
                path: path.display().to_string(),
                source,
            }),
        }
    }

    /// Parses config text. `path` is used in messages only.
    pub fn parse(text: &str, path: &str) -> Result<(Config, Vec<String>), ConfigError> {
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_string(),
            message,
        };
        let value: serde_yaml::Value =
            serde_yaml::from_str(text).map_err(|e| invalid(e.to_string()))?;
        if value.is_null() {
            return Ok((Config::default(), vec![]));
        }
        // Deserialise from the text (not the Value) so errors carry the key path and line; every
        // key the structs do not know is reported on the way.
        let mut unknown = Vec::new();
        let config: Config =
            serde_ignored::deserialize(serde_yaml::Deserializer::from_str(text), |p| {
                unknown.push(p.to_string())
            })
            .map_err(|e| invalid(e.to_string()))?;
        let warnings = unknown
            .into_iter()
            .filter(|k| warn_unknown(k))
            .map(|k| format!("{path}: unknown key {k} (ignored)"))
            .collect();
        config.check().map_err(invalid)?;
        Ok((config, warnings))
    }

    /// Range checks that types alone do not express.
    fn check(&self) -> Result<(), String> {
        let w = &self.workers;
        let positive = [
            ("workers.backoff_base_seconds", w.backoff_base_seconds),
            ("workers.backoff_max_seconds", w.backoff_max_seconds),
            (
                "workers.spawn_backoff_base_seconds",
                w.spawn_backoff_base_seconds,
            ),
            (
                "workers.spawn_backoff_max_seconds",
                w.spawn_backoff_max_seconds,
            ),
            (
                "workers.task_stale_timeout_seconds",
                w.task_stale_timeout_seconds,
            ),
            (
                "workers.heartbeat_interval_seconds",
                w.heartbeat_interval_seconds,
            ),
            (
                "workers.heartbeat_stale_threshold",
                w.heartbeat_stale_threshold,
            ),
            ("workers.respawn_window_seconds", w.respawn_window_seconds),
            (
                "workers.spawn_ready_timeout_seconds",
                w.spawn_ready_timeout_seconds,
            ),
            (
                "workers.reconcile_interval_seconds",
                w.reconcile_interval_seconds,
            ),
            ("agent.timeout_seconds", self.agent.timeout_seconds),
            (
                "worktree.setup_timeout_seconds",
                self.worktree.setup_timeout_seconds,
            ),
            ("remote.handshake_timeout", self.remote.handshake_timeout),
            (
                "verification_tiers.timeout_seconds",
                self.verification_tiers.timeout_seconds,
            ),
        ];
        for (key, v) in positive {
            if v.is_zero() {
                return Err(format!(
                    "{key}: must be a positive number of seconds, got 0"
                ));
            }
        }
        if w.heartbeat_stale_threshold <= w.heartbeat_interval_seconds {
            return Err(format!(
                "workers.heartbeat_stale_threshold: must be larger than workers.heartbeat_interval_seconds ({} <= {})",
                w.heartbeat_stale_threshold.as_secs_f64(),
                w.heartbeat_interval_seconds.as_secs_f64()
            ));
        }
        for (key, v) in [
            (
                "remote.max_connections",
                u64::from(self.remote.max_connections),
            ),
            (
                "remote.max_connections_per_peer",
                u64::from(self.remote.max_connections_per_peer),
            ),
            (
                "container.artifacts_max_files",
                self.container.artifacts_max_files,
            ),
            (
                "container.rush_artifacts_max_files",
                self.container.rush_artifacts_max_files,
            ),
        ] {
            if v == 0 {
                return Err(format!("{key}: must be at least 1"));
            }
        }
        if self.agent.command.is_empty() || self.agent.command[0].trim().is_empty() {
            return Err("agent.command: must be a non-empty list, e.g. [claude, --print]".into());
        }
        for (i, g) in self.quality_gates.iter().enumerate() {
            if g.command.trim().is_empty() {
                return Err(format!("quality_gates[{i}].command: must not be empty"));
            }
            if g.timeout.is_zero() {
                return Err(format!("quality_gates[{i}].timeout: must be positive"));
            }
        }
        if !(self.resources.container_cpu_limit.is_finite()
            && self.resources.container_cpu_limit > 0.0)
        {
            return Err("resources.container_cpu_limit: must be positive".into());
        }
        for (key, v) in [
            ("budget.max_usd", self.budget.max_usd),
            ("budget.task_max_usd", self.budget.task_max_usd),
        ] {
            if let Some(v) = v
                && !(v.is_finite() && v > 0.0)
            {
                return Err(format!("{key}: must be an amount in USD above 0"));
            }
        }
        if self.logging.max_log_size_mb == 0 {
            return Err("logging.max_log_size_mb: must be at least 1".into());
        }
        self.symbols.check()?;
        self.worktree.check()?;
        self.notify.check()?;
        if let Some(m) = self.agent.models.iter().find(|m| {
            m.trim().is_empty()
                || m.len() > 128
                || m.starts_with('-')
                || m.chars().any(char::is_control)
        }) {
            return Err(format!(
                "agent.models: {m:?} is not a model name (at most 128 characters, not starting with '-')"
            ));
        }
        if !self.agent.models.is_empty() && self.agent.profile == AgentProfile::Plain {
            return Err(
                "agent.models: agent.profile plain has no way to pass a model to the CLI; put the model in agent.command"
                    .into(),
            );
        }
        if !(1..=10).contains(&self.merge.resolve_attempts) {
            return Err(format!(
                "merge.resolve_attempts: must be 1 to 10, got {}",
                self.merge.resolve_attempts
            ));
        }
        if !(1..=10).contains(&self.design.max_rounds) {
            return Err(format!(
                "design.max_rounds: must be 1 to 10, got {}",
                self.design.max_rounds
            ));
        }
        for (key, v) in [
            ("git.identity.name", &self.git.identity.name),
            ("git.identity.email", &self.git.identity.email),
        ] {
            if v.trim().is_empty() || v.contains(['<', '>', '\n']) {
                return Err(format!(
                    "{key}: must be non-empty, on one line and without < or >, got {v:?}"
                ));
            }
        }
        Ok(())
    }
}

/// A size in bytes, read from Docker's syntax (`4g`, `512m`, `1024k`) or a plain integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSize(pub i64);

impl Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i64(self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Checked inside the visitor, so the error carries the key path.
        struct Size;
        impl serde::de::Visitor<'_> for Size {
            type Value = ByteSize;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a size such as 4g or 512m")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ByteSize, E> {
                parse_memory(v).map(ByteSize).map_err(E::custom)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ByteSize, E> {
                match i64::try_from(v) {
                    Ok(n) if n > 0 => Ok(ByteSize(n)),
                    _ => Err(E::custom(format!("'{v}' must be positive"))),
                }
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ByteSize, E> {
                if v > 0 {
                    Ok(ByteSize(v))
                } else {
                    Err(E::custom(format!("'{v}' must be positive")))
                }
            }
        }
        d.deserialize_any(Size)
    }
}

/// Parses a Docker-style memory size (`4g`, `512m`, `1024k`, `1073741824`) into bytes.
pub fn parse_memory(s: &str) -> Result<i64, String> {
    let t = s.trim().to_ascii_lowercase();
    let t = t.strip_suffix('b').unwrap_or(&t);
    let (num, mult) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1i64 << 10),
        Some('m') => (&t[..t.len() - 1], 1 << 20),
        Some('g') => (&t[..t.len() - 1], 1 << 30),
        Some('t') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a size such as 4g or 512m"))?;
    let bytes = n * mult as f64;
    // NaN, infinities and sizes that round to zero bytes are not sizes.
    if !n.is_finite() || bytes.is_nan() || bytes < 1.0 {
        return Err(format!("'{s}' must be positive"));
    }
    if bytes >= i64::MAX as f64 {
        return Err(format!("'{s}' is too large"));
    }
    Ok(bytes as i64)
}

/// Whether an ignored key (as `serde_ignored` names it, e.g. `workers.retry_atempts`) deserves a
/// warning: everything outside the original's sections that this engine ignores. (The keys of
/// the original that zerg accepts inside its own sections are fields of the config types.)
fn warn_unknown(path: &str) -> bool {
    let section = path.split('.').next().unwrap_or(path);
    // `git` and `logging` are the original's sections too: only zerg's own keys in them are
    // checked (`logging`'s are both the original's).
    path.starts_with("git.identity.") || !IGNORED_SECTIONS.contains(&section)
}

/// Config durations: written as seconds (fractions allowed), held as [`Duration`], so they
/// are parsed and checked once. A negative, infinite or non-numeric value is an error that names
/// the key.
mod seconds {
    use std::time::Duration;

    use serde::{Deserializer, Serializer, de::Error};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        // Checked inside the visitor, so the error carries the key path.
        struct Secs;
        impl serde::de::Visitor<'_> for Secs {
            type Value = Duration;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number of seconds (zero or more)")
            }
            fn visit_f64<E: Error>(self, v: f64) -> Result<Duration, E> {
                if v.is_finite() && v >= 0.0 {
                    Duration::try_from_secs_f64(v)
                        .map_err(|_| E::custom(format!("{v} seconds is too long for a duration")))
                } else {
                    Err(E::custom(format!(
                        "{v} is not a number of seconds (zero or more)"
                    )))
                }
            }
            fn visit_u64<E: Error>(self, v: u64) -> Result<Duration, E> {
                Ok(Duration::from_secs(v))
            }
            fn visit_i64<E: Error>(self, v: i64) -> Result<Duration, E> {
                u64::try_from(v).map(Duration::from_secs).map_err(|_| {
                    E::custom(format!("{v} is not a number of seconds (zero or more)"))
                })
            }
        }
        d.deserialize_f64(Secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_settings_have_defaults() {
        let s: KubernetesSettings = serde_yaml::from_str("namespace: zerg\nimage_pull_policy: Always\nnode_selector: {pool: agents}\nmemory_limit: 2Gi\n").unwrap();
        assert_eq!(s.namespace, "zerg");
        assert_eq!(s.image_pull_policy, ImagePullPolicy::Always);
        assert_eq!(s.ttl_seconds_after_finished, 3600);
        assert_eq!(s.node_selector["pool"], "agents");
        let d: KubernetesSettings = serde_yaml::from_str("{}").unwrap();
        assert_eq!(d, KubernetesSettings::default());
        assert_eq!(d.namespace, "default");
        assert_eq!(d.image_pull_policy, ImagePullPolicy::IfNotPresent);
        assert!(
            serde_yaml::from_str::<KubernetesSettings>("image_pull_policy: Sometimes").is_err()
        );
    }

    #[test]
    fn empty_file_gives_defaults() {
        let (c, w) = Config::parse("", "c.yaml").unwrap();
        assert_eq!(c.workers.retry_attempts, 3);
        assert_eq!(c.workers.spawn_backoff_base_seconds, Duration::from_secs(2));
        assert_eq!(
            c.workers.task_stale_timeout_seconds,
            Duration::from_secs(600)
        );
        assert_eq!(c.agent.command[0], "claude");
        assert!(c.resilience.enabled);
        assert!(w.is_empty());
    }

    #[test]
    fn original_sections_are_accepted_silently() {
        let text = "project: {name: x}\nplugins: {enabled: true}\nworkers: {timeout_minutes: 60, retry_attempts: 2}\n";
        let (c, w) = Config::parse(text, "c.yaml").unwrap();
        assert_eq!(c.workers.retry_attempts, 2);
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn unknown_keys_warn() {
        let text = "workers: {retry_atempts: 2}\nbogus: 1\n";
        let (_, w) = Config::parse(text, "c.yaml").unwrap();
        assert_eq!(w.len(), 2);
        assert!(w[0].contains("workers.retry_atempts"));
        assert!(w[1].contains("bogus"));
    }

    #[test]
    fn unknown_keys_are_found_at_any_depth_from_the_types() {
        let text = "quality_gates:\n  - {name: t, command: 'cargo test', retries: 2}\ncontainer: {image: x, gpu: true}\nresources: {cpu_cores: 4}\n";
        let (c, w) = Config::parse(text, "c.yaml").unwrap();
        assert_eq!(c.quality_gates.len(), 1);
        assert_eq!(
            w,
            vec![
                "c.yaml: unknown key quality_gates.0.retries (ignored)".to_string(),
                "c.yaml: unknown key container.gpu (ignored)".to_string(),
            ],
            "resources.cpu_cores is one of the original's keys: accepted silently"
        );
    }

    #[test]
    fn wrong_type_names_the_key_path() {
        let err = Config::parse("workers:\n  retry_attempts: lots\n", "c.yaml").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("workers.retry_attempts"), "{msg}");
    }

    #[test]
    fn small_timeouts_are_accepted() {
        let text = "workers: {heartbeat_interval_seconds: 0.2, heartbeat_stale_threshold: 1, task_stale_timeout_seconds: 1}\n";
        let (c, _) = Config::parse(text, "c.yaml").unwrap();
        assert_eq!(c.workers.heartbeat_stale_threshold, Duration::from_secs(1));
        assert_eq!(
            c.workers.heartbeat_interval_seconds,
            Duration::from_millis(200)
        );
    }

    #[test]
    fn range_errors_name_the_key() {
        let err =
            Config::parse("workers: {task_stale_timeout_seconds: 0}\n", "c.yaml").unwrap_err();
        assert!(
            err.to_string()
                .contains("workers.task_stale_timeout_seconds")
        );
        let err = Config::parse("agent: {command: []}\n", "c.yaml").unwrap_err();
        assert!(err.to_string().contains("agent.command"));
        let err =
            Config::parse("resources: {container_memory_limit: lots}\n", "c.yaml").unwrap_err();
        assert!(err.to_string().contains("container_memory_limit"));
    }

    #[test]
    fn durations_are_parsed_once_and_bad_ones_name_the_key() {
        let (c, _) = Config::parse("workers: {stop_grace_seconds: 0.5}\n", "c.yaml").unwrap();
        assert_eq!(c.workers.stop_grace_seconds, Duration::from_millis(500));
        for bad in ["-1", ".inf", "soon"] {
            let text = format!("workers:\n  task_stale_timeout_seconds: {bad}\n");
            let err = Config::parse(&text, "c.yaml").unwrap_err().to_string();
            assert!(
                err.contains("workers.task_stale_timeout_seconds"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn the_config_zergctl_init_writes_is_exactly_the_defaults() {
        let text = include_str!("../../zergctl/src/init/config.yaml");
        let (c, warnings) = Config::parse(text, "config.yaml").unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            serde_json::to_value(Config::default()).unwrap()
        );
        // And it names every key there is: a key added to the config is added to init's file.
        let yaml: serde_yaml::Value = serde_yaml::from_str(text).unwrap();
        let defaults = serde_json::to_value(Config::default()).unwrap();
        for (section, keys) in defaults.as_object().unwrap() {
            let Some(keys) = keys.as_object() else {
                continue;
            };
            for k in keys.keys().filter(|k| !COMPAT_ONLY.contains(&k.as_str())) {
                assert!(
                    yaml.get(section).and_then(|s| s.get(k)).is_some(),
                    "{section}.{k} is missing from zergctl init's config"
                );
            }
        }
    }

    #[test]
    fn every_config_key_is_in_the_configuration_reference() {
        let doc = include_str!("../../docs/Configuration-Reference.md");
        let mut defaults = serde_json::to_value(Config::default()).unwrap();
        // A quality gate's keys, from one entry.
        defaults["quality_gates"] = serde_json::json!({
            "name": "", "command": "", "required": true, "timeout": 1, "coverage_threshold": null
        });
        let mut missing = Vec::new();
        for (section, keys) in defaults.as_object().unwrap() {
            if !doc.contains(&format!("`{section}`")) {
                missing.push(section.clone());
            }
            for k in keys
                .as_object()
                .map(|m| m.keys().collect())
                .unwrap_or(Vec::<&String>::new())
            {
                if !doc.contains(&format!("`{k}`")) && !doc.contains(&format!("`{section}.{k}`")) {
                    missing.push(format!("{section}.{k}"));
                }
            }
        }
        assert!(
            missing.is_empty(),
            "not in docs/Configuration-Reference.md: {missing:?}"
        );
    }

    /// Keys accepted only so that the original's config files load; init does not write them.
    const COMPAT_ONLY: &[&str] = &[
        "max_concurrent",
        "timeout_minutes",
        "launcher_type",
        "context_threshold_percent",
        "task_list_id",
        "cpu_cores",
        "memory_gb",
        "disk_gb",
    ];

    #[test]
    fn the_symbols_section_is_typed_and_checked() {
        let (c, w) = Config::parse(
            "symbols: {languages: [rust, go], max_bytes_per_task: 2000}\n",
            "c.yaml",
        )
        .unwrap();
        assert!(w.is_empty(), "{w:?}");
        assert!(c.symbols.enabled);
        assert_eq!(c.symbols.max_bytes_per_task, 2000);
        assert_eq!(c.symbols.max_file_bytes, 1 << 20);
        assert_eq!(c.symbols.languages.len(), 2);
        let err = Config::parse("symbols: {languages: [cobol]}\n", "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("symbols.languages") && err.contains("cobol"),
            "{err}"
        );
        let err = Config::parse("symbols: {max_bytes_per_task: 0}\n", "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("symbols.max_bytes_per_task"), "{err}");
        let (_, w) = Config::parse("symbols: {enable: false}\n", "c.yaml").unwrap();
        assert_eq!(w, ["c.yaml: unknown key symbols.enable (ignored)"]);
    }

    #[test]
    fn the_git_identity_is_typed_checked_and_shares_the_originals_section() {
        let (c, w) = Config::parse(
            "git: {identity: {name: Merge Bot, email: bot@example.com}, auto_push: true}\n",
            "c.yaml",
        )
        .unwrap();
        assert!(
            w.is_empty(),
            "the original's git keys are accepted silently: {w:?}"
        );
        assert_eq!(c.git.identity.name, "Merge Bot");
        assert_eq!(c.git.identity.email, "bot@example.com");
        assert_eq!(Config::default().git.identity.name, "zerg");
        assert_eq!(Config::default().git.identity.email, "zerg@localhost");
        let (_, w) = Config::parse("git: {identity: {nmae: x}}\n", "c.yaml").unwrap();
        assert_eq!(w, ["c.yaml: unknown key git.identity.nmae (ignored)"]);
        for bad in ["''", "'a <b>'", "\"a\\nb\""] {
            let err = Config::parse(&format!("git: {{identity: {{email: {bad}}}}}\n"), "c.yaml")
                .unwrap_err()
                .to_string();
            assert!(err.contains("git.identity.email"), "{bad}: {err}");
        }
    }

    #[test]
    fn memory_sizes() {
        assert_eq!(parse_memory("4g").unwrap(), 4 << 30);
        assert_eq!(parse_memory("512m").unwrap(), 512 << 20);
        assert_eq!(parse_memory("1024").unwrap(), 1024);
        assert!(parse_memory("-1g").is_err());
        for bad in ["nan", "nank", "inf", "1e-30g", "0.0001k", "1e300t"] {
            assert!(parse_memory(bad).is_err(), "{bad}");
        }
        // Read once, into bytes, with the key named when it is wrong.
        let (c, _) =
            Config::parse("resources: {container_memory_limit: 512m}\n", "c.yaml").unwrap();
        assert_eq!(c.resources.container_memory_limit, ByteSize(512 << 20));
        let (c, _) =
            Config::parse("resources: {container_memory_limit: 2048}\n", "c.yaml").unwrap();
        assert_eq!(c.resources.container_memory_limit, ByteSize(2048));
        // A duration too long to represent is an error, not a panic.
        let err = Config::parse("workers: {backoff_max_seconds: 1.0e30}\n", "c.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("workers.backoff_max_seconds") && err.contains("too long"),
            "{err}"
        );
        for bad in ["0", "-5", "0m", "'x'"] {
            let err = Config::parse(
                &format!("resources: {{container_memory_limit: {bad}}}\n"),
                "c.yaml",
            )
            .unwrap_err()
            .to_string();
            assert!(
                err.contains("resources.container_memory_limit"),
                "{bad}: {err}"
            );
            assert!(
                err.contains("positive") || err.contains("size"),
                "{bad}: {err}"
            );
        }
    }
}
