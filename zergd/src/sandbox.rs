//! The subprocess workers' sandbox as zergd sees it: what this machine allows (probed once,
//! when zergd starts), what each rush gets (`sandbox.mode` against that), the hosts its egress
//! proxy lets through, and each worker's policy (built in [`crate::container_host`], beside the
//! container layout it shares). Enforcement is the `zerg-sandbox` crate's.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use zerg_sandbox::{Enforcement, Extra, Support};

use crate::config::{Config, SandboxMode};
use crate::domain::Mode;

static SUPPORT: OnceLock<Support> = OnceLock::new();

/// The variable that names the bubblewrap binary instead of `bwrap` on `PATH` (a path that
/// does not exist makes the machine one without it).
pub const BWRAP_ENV: &str = "ZERG_SANDBOX_BWRAP";

/// Probes the machine once, with the worker agent `agent_bin` inside (which reports the
/// Landlock ABI it could enforce), and logs what it found.
pub fn init(agent_bin: &Path) {
    let s = SUPPORT.get_or_init(|| zerg_sandbox::probe(bwrap_override(), Some(agent_bin)));
    match &s.namespaces {
        Ok(b) => {
            tracing::info!(bwrap = %b.display(), landlock_abi = s.landlock_abi, "subprocess workers can be confined")
        }
        Err(why) => tracing::warn!(reason = %why, "subprocess workers cannot be confined"),
    }
}

/// What the machine allows (probed at first use when [`init`] did not run).
pub fn support() -> &'static Support {
    SUPPORT.get_or_init(|| zerg_sandbox::probe(bwrap_override(), None))
}

fn bwrap_override() -> Option<PathBuf> {
    std::env::var_os(BWRAP_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// What a rush in `mode` with `config` gets: workers outside subprocess mode are confined by
/// their container or machine, not here.
pub fn decide(config: &Config, mode: Mode) -> Enforcement {
    if mode != Mode::Subprocess {
        return Enforcement::Off {
            why: format!(
                "{} workers are confined by their own runtime",
                mode.as_str()
            ),
            asked: false,
        };
    }
    Enforcement::decide(config.sandbox.mode.as_str(), support())
        .unwrap_or_else(|why| Enforcement::Off { why, asked: false })
}

/// Refuses a subprocess rush under `sandbox.mode: strict` that this machine cannot confine,
/// naming what is missing.
pub fn check(config: &Config, mode: Mode) -> Result<(), String> {
    if mode != Mode::Subprocess || config.sandbox.mode != SandboxMode::Strict {
        return Ok(());
    }
    Enforcement::decide("strict", support()).map(|_| ())
}

/// The hosts a confined worker may reach: the model provider's (from zergd's environment,
/// which the workers inherit, and the agent profile), `sandbox.allow_hosts`, and for setup
/// commands `sandbox.setup_allow_hosts`; with the config's extra paths.
pub fn extra(config: &Config) -> Extra {
    let profile = config.agent.profile.as_str();
    let mut allow = zerg_sandbox::hosts::provider_hosts(|k| std::env::var(k).ok(), profile);
    allow.extend(config.sandbox.allow_hosts.iter().cloned());
    Extra {
        read_only: config.sandbox.read_only.iter().map(PathBuf::from).collect(),
        read_write: config
            .sandbox
            .read_write
            .iter()
            .map(PathBuf::from)
            .collect(),
        allow_hosts: allow,
        setup_allow_hosts: config.sandbox.setup_allow_hosts.clone(),
    }
}

/// What a quality gate on the host needs to run confined: the bubblewrap binary, the rush's
/// repository and feature (whose git dir holds the gate's scratch home and `/tmp`), and the
/// config's extra paths.
#[derive(Debug, Clone)]
pub struct GateSandbox {
    /// The bubblewrap binary.
    pub bwrap: PathBuf,
    /// The repository.
    pub repo: PathBuf,
    /// The feature.
    pub feature: String,
    /// The config's extra paths.
    pub extra: Extra,
}

/// How a rush's gates on the host are confined: whenever the machine allows it and
/// `sandbox.mode` is not `off`, whatever mode the workers run in.
pub fn for_gates(config: &Config, repo: &Path, feature: &str) -> Option<GateSandbox> {
    match Enforcement::decide(config.sandbox.mode.as_str(), support()) {
        Ok(Enforcement::Namespaces { bwrap, .. }) => Some(GateSandbox {
            bwrap,
            repo: repo.to_path_buf(),
            feature: feature.to_string(),
            extra: extra(config),
        }),
        _ => None,
    }
}

impl GateSandbox {
    /// The policy of a gate (`network`: for a `worktree.setup` command, which keeps the host's
    /// network) run in `worktree`: a fresh scratch home and `/tmp` in the rush's area of the
    /// git dir, the repository's git dir read-only.
    pub fn policy(&self, worktree: &Path, network: bool) -> std::io::Result<zerg_sandbox::Policy> {
        let common = zerg_git::objects::common_dir_of(&self.repo)?;
        let area = common
            .join(zerg_git::objects::WORKER_GIT_SUBDIR)
            .join(&self.feature);
        let (home, tmp) = (area.join("gate-home"), area.join("gate-tmp"));
        for d in [&home, &tmp] {
            let _ = std::fs::remove_dir_all(d);
            std::fs::create_dir_all(d)?;
        }
        let host = zerg_sandbox::Host::current();
        let home_inside = host
            .home
            .clone()
            .unwrap_or_else(|| PathBuf::from("/home/zerg"));
        let mut hidden = vec![self.repo.clone()];
        hidden.extend(host.home.clone());
        let layout = zerg_sandbox::GateLayout {
            worktree: worktree.to_path_buf(),
            git_dir: common,
            home: zerg_sandbox::Bind {
                from: home,
                to: home_inside,
            },
            tmp,
            hidden,
        };
        let mut p = zerg_sandbox::Policy::gate(&layout, &host, &self.extra);
        p.network = network;
        Ok(p)
    }
}
