//! Building a [`Policy`] from what zergd knows about a worker (or a gate) and the host.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::{Bind, Policy, SHARED_OBJECTS};

/// The system's read-only parts: each seen at its own path (a symbolic link is made again
/// inside).
const SYSTEM: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/sys", "/nix",
    "/snap",
];

/// Secrets under `/etc` replaced by empty files or directories inside.
const ETC_SECRETS: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh",
    "/etc/ssl/private",
    "/etc/security/opasswd",
    "/etc/docker",
];

/// Toolchains under the home directory, read-only inside (their variables are read too).
const HOME_TOOLCHAINS: &[&str] = &[
    ".cargo",
    ".rustup",
    ".pyenv",
    ".nvm",
    ".volta",
    ".bun",
    ".deno",
    "go",
    ".sdkman",
    ".local/bin",
    ".local/share/claude",
    ".local/share/pnpm",
    ".npm-global",
    ".local/lib",
];

/// Variables that name a toolchain directory.
const TOOLCHAIN_VARS: &[&str] = &[
    "CARGO_HOME",
    "RUSTUP_HOME",
    "PYENV_ROOT",
    "NVM_DIR",
    "VOLTA_HOME",
    "BUN_INSTALL",
    "DENO_INSTALL",
    "GOPATH",
    "GOROOT",
    "PNPM_HOME",
    "SDKMAN_DIR",
];

/// What the policy needs of the host: its home, `PATH` and toolchain variables.
#[derive(Debug, Clone, Default)]
pub struct Host {
    /// `$HOME`.
    pub home: Option<PathBuf>,
    /// `$PATH`.
    pub path: Option<OsString>,
    /// The toolchain variables that are set, with their values.
    pub toolchain_vars: Vec<PathBuf>,
}

impl Host {
    /// The host as this process sees it.
    pub fn current() -> Self {
        Self {
            home: std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(PathBuf::from),
            path: std::env::var_os("PATH"),
            toolchain_vars: TOOLCHAIN_VARS
                .iter()
                .filter_map(std::env::var_os)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .collect(),
        }
    }

    /// The toolchain directories of this host that exist: those under the home, those the
    /// variables name, and every `PATH` entry outside `keep_out` (the home aside: its
    /// toolchains are wanted), never the home itself nor `/`.
    fn toolchains(&self, keep_out: &[PathBuf]) -> Vec<PathBuf> {
        let mut out = BTreeSet::new();
        if let Some(home) = &self.home {
            for t in HOME_TOOLCHAINS {
                out.insert(home.join(t));
            }
        }
        out.extend(self.toolchain_vars.iter().cloned());
        if let Some(path) = &self.path {
            out.extend(std::env::split_paths(path));
        }
        out.into_iter()
            .filter(|p| p.is_absolute() && p.is_dir())
            .filter(|p| p != Path::new("/") && Some(p) != self.home.as_ref())
            .filter(|p| {
                !keep_out
                    .iter()
                    .any(|k| Some(k) != self.home.as_ref() && p.starts_with(k))
            })
            .filter(|p| !SYSTEM.iter().any(|s| p.starts_with(s)))
            .collect()
    }
}

/// Where a worker's parts are on the host, as zergd laid them out (the container layout: a
/// private git dir over the common dir's path, the real objects as its alternate).
#[derive(Debug, Clone)]
pub struct WorkerLayout {
    /// The worker's worktree (read-write, the working directory).
    pub worktree: PathBuf,
    /// The worker's private git dir, seen at the repository's common git dir.
    pub git_dir: Bind,
    /// The repository's object store (read-only, at [`SHARED_OBJECTS`]).
    pub objects: PathBuf,
    /// The worker's private home, seen at `$HOME` (read-write).
    pub home: Bind,
    /// The worker's private `/tmp`.
    pub tmp: PathBuf,
    /// The spec snapshot, read-only over the worktree's spec directory.
    pub spec: Bind,
    /// The directory of the rush's worker-plane socket (read-only).
    pub plane_dir: PathBuf,
    /// Where the worker writes its task and setup output (`.zerg/logs/tasks`,
    /// `.zerg/logs/setup`).
    pub logs: Vec<PathBuf>,
    /// Directories of the programs the worker runs (the worker agent, the agent CLI).
    pub programs: Vec<PathBuf>,
    /// What is kept out and said so: the user's checkout, `.zerg/state`, zergd's socket
    /// directory, the home.
    pub hidden: Vec<PathBuf>,
}

/// Where a quality gate's parts are on the host.
#[derive(Debug, Clone)]
pub struct GateLayout {
    /// The staging worktree (read-write: a gate builds there).
    pub worktree: PathBuf,
    /// The repository's common git dir (read-only: `git` in a gate reads it).
    pub git_dir: PathBuf,
    /// A scratch home for the gate, seen at `$HOME`.
    pub home: Bind,
    /// The gate's private `/tmp`.
    pub tmp: PathBuf,
    /// What is kept out and said so.
    pub hidden: Vec<PathBuf>,
}

/// The config's own additions (`sandbox.read_only`, `sandbox.read_write`, the host lists).
#[derive(Debug, Clone, Default)]
pub struct Extra {
    /// `sandbox.read_only`.
    pub read_only: Vec<PathBuf>,
    /// `sandbox.read_write`.
    pub read_write: Vec<PathBuf>,
    /// The model provider's hosts and `sandbox.allow_hosts`.
    pub allow_hosts: Vec<String>,
    /// `sandbox.setup_allow_hosts`.
    pub setup_allow_hosts: Vec<String>,
}

impl Policy {
    /// A worker's policy: its worktree, private git dir, home, `/tmp` and task logs
    /// read-write; the system, the toolchains, the repository's objects, the spec and the
    /// worker-plane socket read-only; nothing else.
    pub fn worker(layout: &WorkerLayout, host: &Host, extra: &Extra) -> Policy {
        let keep_out: Vec<PathBuf> = layout.hidden.clone();
        let mut read_write = vec![
            layout.home.clone(),
            Bind::same(&layout.worktree),
            layout.git_dir.clone(),
        ];
        read_write.extend(layout.logs.iter().map(Bind::same));
        read_write.extend(extra.read_write.iter().map(Bind::same));
        let mut read_only: Vec<Bind> = Vec::new();
        let mut p = Policy::default();
        system(&mut p, &mut read_only);
        read_only.extend(host.toolchains(&keep_out).into_iter().map(Bind::same));
        read_only.extend(
            layout
                .programs
                .iter()
                .filter(|d| d.is_dir())
                .map(Bind::same),
        );
        read_only.push(Bind {
            from: layout.objects.clone(),
            to: PathBuf::from(SHARED_OBJECTS),
        });
        read_only.push(layout.spec.clone());
        read_only.push(Bind::same(&layout.plane_dir));
        read_only.extend(extra.read_only.iter().map(Bind::same));
        p.read_write = read_write;
        p.read_only = dedup(read_only);
        p.hidden = layout.hidden.clone();
        p.tmp = Some(layout.tmp.clone());
        p.cwd = layout.worktree.clone();
        p.allow_hosts = extra.allow_hosts.clone();
        p.setup_allow_hosts = extra.setup_allow_hosts.clone();
        p
    }

    /// A quality gate's policy on the host: the staging worktree and a scratch home read-write,
    /// the system, the toolchains and the repository's git dir read-only, and no network.
    pub fn gate(layout: &GateLayout, host: &Host, extra: &Extra) -> Policy {
        let mut p = Policy::default();
        let mut read_only = Vec::new();
        system(&mut p, &mut read_only);
        read_only.extend(host.toolchains(&layout.hidden).into_iter().map(Bind::same));
        read_only.push(Bind::same(&layout.git_dir));
        read_only.extend(extra.read_only.iter().map(Bind::same));
        let mut read_write = vec![layout.home.clone(), Bind::same(&layout.worktree)];
        read_write.extend(extra.read_write.iter().map(Bind::same));
        p.read_write = read_write;
        p.read_only = dedup(read_only);
        p.hidden = layout.hidden.clone();
        p.tmp = Some(layout.tmp.clone());
        p.cwd = layout.worktree.clone();
        p
    }
}

/// The system's parts, as binds and symbolic links, and its masked secrets.
fn system(p: &mut Policy, read_only: &mut Vec<Bind>) {
    for s in SYSTEM {
        let path = Path::new(s);
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(path) {
                    p.symlinks.push((target, path.to_path_buf()));
                }
            }
            Ok(m) if m.is_dir() => read_only.push(Bind::same(path)),
            _ => {}
        }
    }
    p.masked = ETC_SECRETS
        .iter()
        .map(PathBuf::from)
        .filter(|s| std::fs::symlink_metadata(s).is_ok())
        .collect();
}

/// The binds without repeats (the first of a destination wins).
fn dedup(binds: Vec<Bind>) -> Vec<Bind> {
    let mut seen = BTreeSet::new();
    binds
        .into_iter()
        .filter(|b| seen.insert(b.to.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(root: &Path) -> WorkerLayout {
        WorkerLayout {
            worktree: root.join("repo/.zerg-worktrees/f/worker-1"),
            git_dir: Bind {
                from: root.join("repo/.git/zerg/f/worker-1"),
                to: root.join("repo/.git"),
            },
            objects: root.join("repo/.git/objects"),
            home: Bind {
                from: root.join("repo/.git/zerg/f/home-1"),
                to: root.join("home"),
            },
            tmp: root.join("repo/.git/zerg/f/tmp-1"),
            spec: Bind {
                from: root.join("repo/.zerg/rush/f/spec"),
                to: root.join("repo/.zerg-worktrees/f/worker-1/.gsd/specs/f"),
            },
            plane_dir: root.join("run/zerg/w/0123"),
            logs: vec![root.join("repo/.zerg/logs/tasks")],
            programs: vec![],
            hidden: vec![root.join("repo"), root.join("run/zerg"), root.join("home")],
        }
    }

    #[test]
    fn a_workers_policy_binds_its_own_parts_and_keeps_the_rest_out() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let home = root.join("home");
        std::fs::create_dir_all(home.join(".cargo/bin")).unwrap();
        std::fs::create_dir_all(home.join(".ssh")).unwrap();
        std::fs::create_dir_all(root.join("repo/bin")).unwrap();
        let host = Host {
            home: Some(home.clone()),
            path: Some(
                std::env::join_paths([
                    home.join(".cargo/bin"),
                    root.join("repo/bin"),
                    PathBuf::from("/usr/bin"),
                ])
                .unwrap(),
            ),
            toolchain_vars: vec![],
        };
        let extra = Extra {
            read_only: vec![PathBuf::from("/srv/data")],
            allow_hosts: vec!["api.anthropic.com".into()],
            ..Extra::default()
        };
        let p = Policy::worker(&layout(root), &host, &extra);
        let ro: Vec<&Path> = p.read_only.iter().map(|b| b.to.as_path()).collect();
        let rw: Vec<&Path> = p.read_write.iter().map(|b| b.to.as_path()).collect();
        assert!(ro.contains(&home.join(".cargo").as_path()), "{ro:?}");
        assert!(ro.contains(&Path::new(SHARED_OBJECTS)));
        assert!(ro.contains(&Path::new("/srv/data")));
        assert!(
            !ro.iter().any(|p| p.starts_with(root.join("repo/bin"))),
            "a PATH entry inside the checkout stays out: {ro:?}"
        );
        assert!(!ro.contains(&home.join(".ssh").as_path()));
        assert!(!ro.contains(&home.as_path()) && rw.contains(&home.as_path()));
        assert_eq!(
            p.read_write[0].from,
            root.join("repo/.git/zerg/f/home-1"),
            "the home is the private one, bound first"
        );
        assert!(rw.contains(&root.join("repo/.git").as_path()));
        assert_eq!(p.allow_hosts, vec!["api.anthropic.com".to_string()]);
        assert_eq!(p.cwd, root.join("repo/.zerg-worktrees/f/worker-1"));
        let json = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<Policy>(&json).unwrap(), p);
    }
}
