//! The wall around a zerg subprocess worker (and around quality gates that run on the host).
//!
//! The policy is plain data ([`Policy`]): which paths a confined process sees read-write,
//! which read-only, what is masked, what is kept out on purpose, and which hosts the egress
//! proxy lets it reach. zergd builds it from the rush's config in one place
//! ([`Policy::worker`], [`Policy::gate`]) and shows it in `status --json`; this crate enforces
//! it:
//!
//! - **Namespaces** (the wall): the process runs under bubblewrap (`bwrap`) in user, mount,
//!   pid, ipc, uts and network namespaces of its own, with every capability dropped. Its root
//!   is an empty tmpfs holding only what the policy binds; the rest of the machine (the home,
//!   the user's checkout, zergd's sockets and state) does not exist inside. The network
//!   namespace has only loopback: the worker agent reaches zergd's egress proxy over its
//!   worker-plane socket ([`bwrap`]).
//! - **Landlock** (the second wall, [`landlock`]): inside, the worker agent restricts itself
//!   and everything it starts to writing only the policy's read-write paths.
//!
//! [`probe`] finds out once what the machine allows (bubblewrap installed, unprivileged user
//! namespaces not blocked, the Landlock ABI) so a rush can say what is in effect, or refuse
//! under `sandbox.mode: strict`.

pub mod bwrap;
pub mod hosts;
#[cfg(target_os = "linux")]
pub mod landlock;
mod policy;

pub use policy::{Extra, GateLayout, Host, WorkerLayout};

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The environment variable that carries a worker's [`Policy`] (as JSON) into the sandbox, so
/// the worker agent can apply the second wall and start its egress forwarder.
pub const POLICY_ENV: &str = "ZERG_SANDBOX_POLICY";

/// The loopback port inside a confined worker where its worker agent forwards the agent CLI's
/// and the verification commands' proxy connections to zergd's egress proxy (each worker has a
/// network namespace of its own, so every worker uses the same port).
pub const EGRESS_PORT: u16 = 3128;

/// Set to `1` in a worker container with no network of its own (`container.network: none`):
/// its worker agent runs the egress forwarder too, so its agent CLI reaches the model provider
/// through zergd's proxy.
pub const EGRESS_ENV: &str = "ZERG_EGRESS";

/// The port the `worktree.setup` commands' connections go through, which the proxy judges
/// against `sandbox.setup_allow_hosts` too.
pub const SETUP_EGRESS_PORT: u16 = 3129;

/// The variables that point a process at a proxy (both spellings; the lower-case ones are the
/// older convention that curl and pip read).
pub const PROXY_VARS: &[&str] = &[
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
];

/// The variables that exempt hosts from a proxy: cleared inside, where nothing is reached
/// directly.
pub const NO_PROXY_VARS: &[&str] = &["NO_PROXY", "no_proxy"];

/// The proxy variables for a process inside the sandbox that goes through `port`.
pub fn proxy_env(port: u16) -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{port}");
    PROXY_VARS
        .iter()
        .map(|k| (k.to_string(), url.clone()))
        .chain(NO_PROXY_VARS.iter().map(|k| (k.to_string(), String::new())))
        .collect()
}

/// Where the repository's real object store is seen (read-only) inside a confined worker, as in
/// a worker container: its private git dir names it as its alternate.
pub const SHARED_OBJECTS: &str = "/zerg/shared-objects";

/// A path bound into the sandbox: `from` on the host, seen at `to` inside.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bind {
    /// Host path.
    pub from: PathBuf,
    /// Path inside the sandbox.
    pub to: PathBuf,
}

impl Bind {
    /// A path seen at the same place inside.
    pub fn same(p: impl Into<PathBuf>) -> Self {
        let p = p.into();
        Self {
            from: p.clone(),
            to: p,
        }
    }
}

/// What a confined process sees and may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// Paths it may write.
    pub read_write: Vec<Bind>,
    /// Paths it may read and run, not write.
    pub read_only: Vec<Bind>,
    /// Symbolic links made inside (`/bin` → `usr/bin` on a merged-/usr system): `(target, link)`.
    pub symlinks: Vec<(PathBuf, PathBuf)>,
    /// Files and directories inside a read-only bind that are replaced by empty ones (the
    /// secrets under `/etc`).
    pub masked: Vec<PathBuf>,
    /// What is kept out on purpose and named so in `status` (never mounted, so absent inside).
    pub hidden: Vec<PathBuf>,
    /// The host directory seen as `/tmp`; a fresh tmpfs when `None`.
    pub tmp: Option<PathBuf>,
    /// The working directory inside.
    pub cwd: PathBuf,
    /// Hosts the egress proxy lets the process reach (see [`hosts`]); the sandbox has no other
    /// network.
    pub allow_hosts: Vec<String>,
    /// Hosts the `worktree.setup` commands may reach as well.
    pub setup_allow_hosts: Vec<String>,
    /// Whether the process keeps the host's network (a `worktree.setup` command zergd runs
    /// in the staging worktree before host gates); otherwise it has a network namespace of its
    /// own with only loopback.
    pub network: bool,
}

impl Policy {
    /// Every path the process may write, as seen inside (for Landlock).
    pub fn writable_inside(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = self.read_write.iter().map(|b| b.to.clone()).collect();
        out.push(PathBuf::from("/tmp"));
        out.push(PathBuf::from("/dev"));
        out
    }
}

/// What this machine allows, found by [`probe`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Support {
    /// The bubblewrap binary that ran a confined probe, or why none could.
    pub namespaces: Result<PathBuf, String>,
    /// The bubblewrap version line, when it ran.
    pub bwrap_version: Option<String>,
    /// The Landlock ABI the probe could enforce inside (0: none), or why it could not.
    pub landlock_abi: u32,
}

/// How confined a rush's workers are, decided once at rush start from `sandbox.mode` and
/// [`Support`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Enforcement {
    /// Namespaces through bubblewrap, with Landlock inside when `landlock_abi` > 0.
    Namespaces {
        /// The bubblewrap binary.
        bwrap: PathBuf,
        /// Its version line.
        version: String,
        /// The Landlock ABI enforced inside (0: none).
        landlock_abi: u32,
    },
    /// No confinement, and why.
    Off {
        /// Why the workers are not confined (`sandbox.mode: off`, or what the machine lacks).
        why: String,
        /// Whether this was asked for (`sandbox.mode: off`) rather than forced by the machine.
        asked: bool,
    },
}

impl Enforcement {
    /// Decides from the mode (`auto`, `strict`, `off`) and what the machine allows. Under
    /// `strict` a machine that cannot confine is an error naming what is missing.
    pub fn decide(mode: &str, support: &Support) -> Result<Self, String> {
        if mode == "off" {
            return Ok(Enforcement::Off {
                why: "sandbox.mode: off".into(),
                asked: true,
            });
        }
        match &support.namespaces {
            Ok(bwrap) => Ok(Enforcement::Namespaces {
                bwrap: bwrap.clone(),
                version: support.bwrap_version.clone().unwrap_or_default(),
                landlock_abi: support.landlock_abi,
            }),
            Err(why) if mode == "strict" => Err(format!(
                "sandbox.mode is strict, but the workers cannot be confined here: {why}"
            )),
            Err(why) => Ok(Enforcement::Off {
                why: why.clone(),
                asked: false,
            }),
        }
    }

    /// Whether workers run confined.
    pub fn confined(&self) -> bool {
        matches!(self, Enforcement::Namespaces { .. })
    }

    /// The one line said at rush start, in `status` and on the dashboard.
    pub fn summary(&self) -> String {
        match self {
            Enforcement::Namespaces {
                version,
                landlock_abi,
                ..
            } => {
                let landlock = if *landlock_abi > 0 {
                    format!(", Landlock ABI {landlock_abi} inside")
                } else {
                    ", no Landlock (the kernel has none)".to_string()
                };
                let version = if version.is_empty() {
                    "bubblewrap".to_string()
                } else {
                    version.clone()
                };
                format!(
                    "on: {version}, user/mount/pid/net namespaces{landlock}; egress only through zergd's proxy"
                )
            }
            Enforcement::Off { why, asked: true } => {
                format!("OFF ({why}): workers act as you, with your files and network")
            }
            Enforcement::Off { why, asked: false } => format!(
                "OFF: {why}; workers act as you, with your files and network (sandbox.mode: strict refuses such a rush)"
            ),
        }
    }
}

/// Finds out what this machine allows: runs `true` under bubblewrap with every namespace the
/// worker gets (and, when `agent` is given, that program's `--sandbox-probe` inside, which
/// applies Landlock to itself and prints the ABI it enforced). `bwrap` overrides where
/// bubblewrap is looked for.
pub fn probe(bwrap: Option<PathBuf>, agent: Option<&std::path::Path>) -> Support {
    bwrap::probe(bwrap, agent)
}
