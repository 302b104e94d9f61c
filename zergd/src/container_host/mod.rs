//! The host side of a container worker, prepared by zergd before the launcher starts it: where
//! its worktree's git metadata is, its mount points, its private git dir and home, and, when
//! zergd runs as root, group access for the container's unprivileged user to exactly what it
//! may write (owners are never changed). Also their removal once a rush has ended.
//!
//! Everything here that touches a tree a container can write goes through [`crate::fsat`]: by
//! directory descriptor, never following a symlink, with modes and owners changed through the
//! descriptor of the entry itself.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::fsat::Dir;
use crate::git::objects::{WORKER_GIT_SUBDIR, common_dir_of, normalize, worker_git_dir};
use crate::launcher::container::{ClaudeLogin, GitLayout, HostFacts, grant_socket, worker_log_dir};
use crate::launcher::{SpawnError, WorkerSpec};

/// Where the objects of the repository's real store are visible (read-only) inside a worker
/// container; the private git dir names it as its alternate.
const SHARED_OBJECTS: &str = "/zerg/shared-objects";

/// Everything the container of `spec` needs on the host, made afresh: finds the worktree's git
/// layout and commit identity, gathers the host's facts, and prepares the mount points, the
/// private git dir and home, and group access. The facts go to the launcher with the spec.
pub fn prepare(spec: &WorkerSpec) -> Result<HostFacts, SpawnError> {
    let git = git_layout(&spec.repo, &spec.worktree, &spec.feature, spec.worker_id)
        .map_err(|e| SpawnError::new(e.to_string()))?;
    let config = fs::read_to_string(git.common_dir.join("config")).unwrap_or_default();
    if config.to_ascii_lowercase().contains("reftable") {
        return Err(SpawnError::new(
            "the repository stores its refs as reftable, which container mode does not support: use --mode subprocess",
        ));
    }
    let identity = git_identity(&spec.repo, spec.worker_id);
    let facts = HostFacts::gather(spec, git, identity)?;
    prepare_host(spec, &facts)?;
    Ok(facts)
}

/// Everything a confined subprocess worker needs on the host, made afresh as for a container
/// (the private git dir over the common dir, a home with a copy of the Claude login, the spec's
/// mount point), plus a private `/tmp`; and the policy that binds them, with the config's
/// additions in `extra`. `agent_cli` is the agent command's program, whose directory the
/// worker may run.
pub fn prepare_sandbox(
    spec: &WorkerSpec,
    extra: &zerg_sandbox::Extra,
    agent_cli: Option<&str>,
    bwrap: &Path,
) -> Result<crate::launcher::SandboxSpec, SpawnError> {
    use zerg_sandbox::{Bind, Host, Policy, WorkerLayout};
    let git = git_layout(&spec.repo, &spec.worktree, &spec.feature, spec.worker_id)
        .map_err(|e| SpawnError::new(e.to_string()))?;
    let config = fs::read_to_string(git.common_dir.join("config")).unwrap_or_default();
    if config.to_ascii_lowercase().contains("reftable") {
        return Err(SpawnError::new(
            "the repository stores its refs as reftable, which the sandbox does not support: set sandbox.mode: off",
        ));
    }
    let identity = git_identity(&spec.repo, spec.worker_id);
    let facts = HostFacts::gather(spec, git, identity)?;
    let g = &facts.git;
    let ctx = |what: &str, p: &Path| {
        let p = p.display().to_string();
        let what = what.to_string();
        move |e: io::Error| SpawnError::new(format!("{what} {p}: {e}"))
    };
    if !spec.spec_dir.is_dir() {
        return Err(SpawnError::new(format!(
            "spec snapshot {} does not exist",
            spec.spec_dir.display()
        )));
    }
    let spec_rel = Path::new(".gsd/specs").join(&spec.feature);
    Dir::open(&spec.worktree)
        .and_then(|d| d.make_dirs(&spec_rel, 0o755))
        .map_err(ctx("cannot create the spec mount point in", &spec.worktree))?;
    write_private_git_dir(g, spec)
        .map_err(ctx("cannot prepare the worker's git dir", &g.private_dir))?;
    write_home(g, spec, &facts.login)
        .map_err(ctx("cannot prepare the worker's home", &g.home_dir))?;
    let tmp_name = format!("tmp-{}", spec.worker_id);
    let tmp = g.home_dir.with_file_name(&tmp_name);
    rush_area(&g.common_dir, &spec.feature)
        .and_then(|a| {
            a.remove(&tmp_name)?;
            a.make_dir(&tmp_name, 0o700)
        })
        .map_err(ctx("cannot prepare the worker's /tmp", &tmp))?;
    let logs = vec![spec.log_dir.join("tasks"), spec.log_dir.join("setup")];
    for l in &logs {
        fs::create_dir_all(l).map_err(ctx("cannot create", l))?;
    }
    let host = Host::current();
    let home_inside = host
        .home
        .clone()
        .unwrap_or_else(|| PathBuf::from("/home/zerg"));
    let mut programs: Vec<PathBuf> = spec
        .agent_bin
        .parent()
        .map(Path::to_path_buf)
        .into_iter()
        .collect();
    if let Some(cli) = agent_cli.and_then(resolve_program) {
        programs.extend(cli.parent().map(Path::to_path_buf));
    }
    let plane_dir = spec
        .socket
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let control_dir = plane_dir
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let mut hidden = vec![spec.repo.clone(), spec.state_dir.clone(), control_dir];
    hidden.extend(host.home.clone());
    let layout = WorkerLayout {
        worktree: spec.worktree.clone(),
        git_dir: Bind {
            from: g.private_dir.clone(),
            to: g.common_dir.clone(),
        },
        objects: g.common_dir.join("objects"),
        home: Bind {
            from: g.home_dir.clone(),
            to: home_inside.clone(),
        },
        tmp,
        spec: Bind {
            from: spec.spec_dir.clone(),
            to: spec.worktree.join(&spec_rel),
        },
        plane_dir,
        logs,
        programs,
        hidden,
    };
    let mut policy = Policy::worker(&layout, &host, extra);
    // The test agent's hooks (`FAKE_CLAUDE_*` paths), as a container gets them.
    policy
        .read_write
        .extend(facts.test_paths.iter().map(Bind::same));
    Ok(crate::launcher::SandboxSpec {
        bwrap: bwrap.to_path_buf(),
        policy,
        home: home_inside,
    })
}

/// The file a program name runs: itself when it has a `/`, else the first on `PATH`, with
/// symbolic links resolved (an installer's `~/.local/bin/claude` leads to its versions dir).
fn resolve_program(name: &str) -> Option<PathBuf> {
    let p = if name.contains('/') {
        PathBuf::from(name)
    } else {
        zerg_sandbox::bwrap::find_on_path(name)?
    };
    fs::canonicalize(p).ok()
}

/// Finds the layout from the repository's side: its common git dir, and the admin dir whose
/// `gitdir` file names `<worktree>/.git`. Nothing is read from the worktree itself, which a
/// container can write: a `.git` file a worker rewrote never redirects zergd.
pub fn git_layout(
    repo: &Path,
    worktree: &Path,
    feature: &str,
    worker_id: u32,
) -> io::Result<GitLayout> {
    let common_dir = common_dir_of(repo)?;
    let want = normalize(&worktree.join(".git"));
    let admins = common_dir.join("worktrees");
    for entry in fs::read_dir(&admins)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", admins.display())))?
        .flatten()
    {
        let gitdir = fs::read_to_string(entry.path().join("gitdir")).unwrap_or_default();
        if normalize(Path::new(gitdir.trim())) == want {
            return Ok(GitLayout {
                admin_dir: normalize(&entry.path()),
                private_dir: worker_git_dir(&common_dir, feature, worker_id),
                home_dir: worker_home_dir(&common_dir, feature, worker_id),
                cache_dir: worker_home_dir(&common_dir, feature, worker_id)
                    .with_file_name(format!("cache-{worker_id}")),
                common_dir,
            });
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!(
            "{} is not a worktree of {}",
            worktree.display(),
            repo.display()
        ),
    ))
}

/// The home directory of worker `worker_id` (`<common>/zerg/<feature>/home-<N>`), mounted at
/// `/home/worker`: built afresh at every spawn with a copy of the Claude login and nothing
/// else, removed when the rush ends.
pub fn worker_home_dir(common_dir: &Path, feature: &str, worker_id: u32) -> PathBuf {
    common_dir
        .join(WORKER_GIT_SUBDIR)
        .join(feature)
        .join(format!("home-{worker_id}"))
}

/// The commit identity (`user.name`, `user.email`) zergd's git sees for the repository, or one
/// named after the worker.
fn git_identity(repo: &Path, worker_id: u32) -> (String, String) {
    let get = |key: &str| {
        crate::git::git(repo, &["config", "--get", key])
            .ok()
            .filter(|s| !s.is_empty())
    };
    (
        get("user.name").unwrap_or_else(|| format!("zerg worker {worker_id}")),
        get("user.email").unwrap_or_else(|| format!("zerg-worker-{worker_id}@localhost")),
    )
}

/// Creates the mount points and directories the container needs, rebuilds the worker's
/// private git dir and home and, when zergd is root, grants the container's gid access to
/// exactly what it may write.
fn prepare_host(spec: &WorkerSpec, facts: &HostFacts) -> Result<(), SpawnError> {
    let g = &facts.git;
    let ctx = |what: &str, p: &Path| {
        let p = p.display().to_string();
        let what = what.to_string();
        move |e: io::Error| SpawnError::new(format!("{what} {p}: {e}"))
    };
    if !spec.spec_dir.is_dir() {
        return Err(SpawnError::new(format!(
            "spec snapshot {} does not exist",
            spec.spec_dir.display()
        )));
    }
    let area = g.private_dir.clone();
    let home = g.home_dir.clone();
    let logs = worker_log_dir(&spec.log_dir, spec.worker_id);
    // The mount point inside the worktree is created here, not by the engine (which would make
    // it root-owned), and without following anything a worker left in its worktree.
    let worktree = Dir::open(&spec.worktree).map_err(ctx("cannot open", &spec.worktree))?;
    worktree
        .make_dirs(&Path::new(".gsd/specs").join(&spec.feature), 0o755)
        .map_err(ctx("cannot create the spec mount point in", &spec.worktree))?;
    fs::create_dir_all(&logs).map_err(ctx("cannot create", &logs))?;
    let area_dir = write_private_git_dir(g, spec)
        .map_err(ctx("cannot prepare the worker's git dir", &area))?;
    let home_dir = write_home(g, spec, &facts.login)
        .map_err(ctx("cannot prepare the worker's home", &home))?;
    // The cache is the slot's for the whole rush: kept from one container to the next (pip's,
    // npm's and go's downloads and builds), removed with the rush's area when the rush ends.
    let cache_dir = rush_area(&g.common_dir, &spec.feature)
        .and_then(|a| a.make_dir(format!("cache-{}", spec.worker_id), 0o700))
        .map_err(ctx("cannot prepare the worker's cache", &g.cache_dir))?;
    if facts.remapped {
        let gid = facts.gid;
        worktree
            .grant(gid, true, &[OsStr::new(".git")])
            .map_err(ctx("cannot grant access to", &spec.worktree))?;
        area_dir
            .grant(gid, true, &[])
            .map_err(ctx("cannot grant access to", &area))?;
        home_dir
            .grant(gid, true, &[])
            .map_err(ctx("cannot grant access to", &home))?;
        cache_dir
            .grant(gid, true, &[])
            .map_err(ctx("cannot grant access to", &g.cache_dir))?;
        Dir::open(&logs)
            .and_then(|d| d.grant(gid, true, &[]))
            .map_err(ctx("cannot grant access to", &logs))?;
        Dir::open(&spec.spec_dir)
            .and_then(|d| d.grant_readable(gid))
            .map_err(ctx("cannot grant access to", &spec.spec_dir))?;
        grant_socket(&spec.socket, gid).map_err(ctx("cannot grant access to", &spec.socket))?;
        for p in &facts.test_paths {
            grant_test_path(p, gid).map_err(ctx("cannot grant access to", p))?;
        }
        for (_, p) in &facts.host_files {
            grant_readable_path(p, gid).map_err(ctx("cannot grant access to", p))?;
        }
    }
    Ok(())
}

/// Opens (making them as needed, replacing anything that is not a directory) the rush's area
/// in the common git dir, `<common>/zerg/<feature>`.
fn rush_area(common: &Path, feature: &str) -> io::Result<Dir> {
    Dir::open(common)?
        .make_dir(WORKER_GIT_SUBDIR, 0o755)?
        .make_dir(feature, 0o755)
}

/// Builds the worker's private git dir (see [`worker_git_dir`]) from scratch: whatever an
/// earlier container of the slot left there (its objects were imported when it exited) is
/// removed first, so nothing it planted survives into the next spawn.
fn write_private_git_dir(g: &GitLayout, spec: &WorkerSpec) -> io::Result<Dir> {
    let common = &g.common_dir;
    let parent = rush_area(common, &spec.feature)?;
    let name = format!("worker-{}", spec.worker_id);
    parent.remove(&name)?;
    let area = parent.make_dir(&name, 0o755)?;
    let objects = area.make_dir("objects", 0o755)?;
    objects.make_dir("pack", 0o755)?;
    let oinfo = objects.make_dir("info", 0o755)?;
    area.make_dirs(Path::new("refs/heads"), 0o755)?;
    area.make_dirs(Path::new("refs/tags"), 0o755)?;
    let info = area.make_dir("info", 0o755)?;
    let admin = area
        .make_dir("worktrees", 0o755)?
        .make_dir(g.admin_name(), 0o755)?;
    let admin_info = admin.make_dir("info", 0o755)?;
    let read_or = |name: &str, default: &str| {
        fs::read(common.join(name)).unwrap_or_else(|_| default.as_bytes().to_vec())
    };
    area.write_new("config", &read_or("config", ""), 0o644)?;
    area.write_new("HEAD", &read_or("HEAD", "ref: refs/heads/main\n"), 0o644)?;
    let spec_rel = format!("/.gsd/specs/{}/", spec.feature);
    let mut exclude = read_or("info/exclude", "");
    // The container's git has another home: what the user ignores globally (a `.env` ignored
    // only by `core.excludesFile`, and copied in by `worktree.copy`) is ignored here too, so
    // that the worker's `git clean` keeps it and no commit takes it in.
    let global = global_excludes(&spec.repo);
    if !global.is_empty() {
        exclude.extend_from_slice(b"\n# zerg: the user's global excludes (core.excludesFile)\n");
        exclude.extend_from_slice(&global);
    }
    exclude.extend_from_slice(
        format!("\n# zerg: the spec snapshot is mounted here read-only\n{spec_rel}\n").as_bytes(),
    );
    info.write_new("exclude", &exclude, 0o644)?;
    oinfo.write_new(
        "alternates",
        format!("{SHARED_OBJECTS}\n").as_bytes(),
        0o644,
    )?;
    // The worktree's own admin dir, private too: its HEAD names the worker branch, whose value
    // comes from the snapshot below; no index, so the agent's first `git reset --hard` builds
    // one that honours the sparse patterns and never touches the mounted spec.
    admin.write_new(
        "HEAD",
        format!("ref: refs/heads/{}\n", spec.branch).as_bytes(),
        0o644,
    )?;
    admin.write_new("commondir", b"../..\n", 0o644)?;
    admin.write_new(
        "gitdir",
        format!("{}\n", spec.worktree.join(".git").display()).as_bytes(),
        0o644,
    )?;
    admin_info.write_new(
        "sparse-checkout",
        format!("/*\n!{spec_rel}\n").as_bytes(),
        0o644,
    )?;
    let refs = crate::git::git(
        common,
        &["for-each-ref", "--format=%(objectname) %(refname)"],
    )
    .map_err(|e| io::Error::other(e.to_string()))?;
    area.write_new("packed-refs", format!("{refs}\n").as_bytes(), 0o644)?;
    Ok(area)
}

/// Most of the user's global excludes file copied into a worker's private git dir.
const GLOBAL_EXCLUDES_MAX: u64 = 1 << 20;

/// The content of the user's global excludes file as zergd's git finds it for `repo`
/// (`core.excludesFile`, else `$XDG_CONFIG_HOME/git/ignore` or `~/.config/git/ignore`), or
/// nothing; at most [`GLOBAL_EXCLUDES_MAX`] bytes.
fn global_excludes(repo: &Path) -> Vec<u8> {
    let configured = crate::git::git(repo, &["config", "--path", "--get", "core.excludesFile"])
        .ok()
        .filter(|p| !p.is_empty())
        .map(PathBuf::from);
    let default = || {
        std::env::var_os("XDG_CONFIG_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
            .map(|d| d.join("git/ignore"))
    };
    let Some(path) = configured.or_else(default) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Ok(f) = fs::File::open(&path) {
        let _ = io::Read::read_to_end(&mut io::Read::take(f, GLOBAL_EXCLUDES_MAX), &mut out);
    }
    if !out.is_empty() && !out.ends_with(b"\n") {
        out.push(b'\n');
    }
    out
}

/// Builds the worker's home (see [`worker_home_dir`]) from scratch: `.claude/` with a copy of
/// the host's Claude credentials file, and `.claude.json` with only the account fields of the
/// host's. The container writes here freely; nothing of it reaches the host's own Claude
/// config.
fn write_home(g: &GitLayout, spec: &WorkerSpec, login: &ClaudeLogin) -> io::Result<Dir> {
    let parent = rush_area(&g.common_dir, &spec.feature)?;
    let name = format!("home-{}", spec.worker_id);
    parent.remove(&name)?;
    let home = parent.make_dir(&name, 0o700)?;
    // The mount point of the worker's cache (see `prepare_host`).
    home.make_dir(".cache", 0o700)?;
    let claude = home.make_dir(".claude", 0o700)?;
    if let Some(c) = &login.credentials {
        claude.write_new(".credentials.json", c, 0o600)?;
    }
    let account = serde_json::to_vec(&login.account).unwrap_or_else(|_| b"{}".to_vec());
    // Claude Code reads its global settings from `$CLAUDE_CONFIG_DIR/.claude.json` when that
    // variable is set, and from `~/.claude.json` otherwise: both get the same copy.
    claude.write_new(".claude.json", &account, 0o600)?;
    home.write_new(".claude.json", &account, 0o600)?;
    Ok(home)
}

/// Removes everything zergd made for a rush's containers in the repository's git dir (the
/// private git dirs and homes of every slot, `<common>/zerg/<feature>`), once the rush has
/// ended and its containers are gone.
pub fn remove_rush_area(repo: &Path, feature: &str) -> io::Result<()> {
    let common = common_dir_of(repo)?;
    match Dir::open(&common.join(WORKER_GIT_SUBDIR)) {
        Ok(d) => d.remove(feature),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// Grants a `FAKE_CLAUDE_*` test path (a directory tree or a single file).
fn grant_test_path(p: &Path, gid: u32) -> io::Result<()> {
    match Dir::open(p) {
        Ok(d) => d.grant(gid, true, &[]),
        Err(_) => grant_file(p, gid, 0o060),
    }
}

/// Group read on a host file or directory tree the container reads (a CA bundle).
fn grant_readable_path(p: &Path, gid: u32) -> io::Result<()> {
    match Dir::open(p) {
        Ok(d) => d.grant_readable(gid),
        Err(_) => grant_file(p, gid, 0o040),
    }
}

/// Group bits on one file, through its descriptor, opened without following a symlink.
fn grant_file(p: &Path, gid: u32, want: u32) -> io::Result<()> {
    let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else {
        return Ok(());
    };
    Dir::open(parent)?.grant_file(name, gid, want)
}

#[cfg(test)]
mod engine_tests;

#[cfg(test)]
mod dir_tests {
    use super::*;
    use zerg_proto::testkit::git;

    #[test]
    fn the_mount_point_is_made_inside_the_worktree_whatever_the_worker_left() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let wt = root.path();
        let d = Dir::open(wt).unwrap();
        // A worker replaced `.gsd` with a symlink out of its worktree, and `specs` with a file.
        std::os::unix::fs::symlink(outside.path(), wt.join(".gsd")).unwrap();
        d.make_dirs(Path::new(".gsd/specs/feat"), 0o755).unwrap();
        assert!(fs::symlink_metadata(wt.join(".gsd")).unwrap().is_dir());
        assert!(wt.join(".gsd/specs/feat").is_dir());
        assert_eq!(
            fs::read_dir(outside.path()).unwrap().count(),
            0,
            "nothing made outside"
        );
        fs::remove_dir_all(wt.join(".gsd/specs")).unwrap();
        fs::write(wt.join(".gsd/specs"), "not a dir").unwrap();
        d.make_dirs(Path::new(".gsd/specs/feat"), 0o755).unwrap();
        assert!(wt.join(".gsd/specs/feat").is_dir());
        // Already there: nothing changes, and nothing but plain relative paths is accepted.
        d.make_dirs(Path::new(".gsd/specs/feat"), 0o755).unwrap();
        assert!(d.make_dirs(Path::new("../x"), 0o755).is_err());
    }
    #[test]
    fn the_users_global_excludes_are_read_as_git_finds_them() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        fs::create_dir_all(&repo).unwrap();
        git(&repo, &["init", "-q"]);
        let ignore = tmp.path().join("my-ignore");
        fs::write(&ignore, ".env\n*.local.json").unwrap();
        git(
            &repo,
            &["config", "core.excludesFile", &ignore.to_string_lossy()],
        );
        assert_eq!(global_excludes(&repo), b".env\n*.local.json\n".to_vec());
        fs::remove_file(&ignore).unwrap();
        assert!(
            global_excludes(&repo).is_empty(),
            "a missing file is nothing"
        );
    }

    #[test]
    fn git_layout_comes_from_the_repository_not_the_worktree() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        fs::create_dir_all(&repo).unwrap();
        git(&repo, &["init", "-q", "-b", "main"]);
        git(&repo, &["commit", "-q", "--allow-empty", "-m", "i"]);
        let wt = dir.path().join("wt/worker-1");
        git(
            &repo,
            &["worktree", "add", "-q", "-b", "b1", &wt.to_string_lossy()],
        );
        let g = git_layout(&repo, &wt, "f", 1).unwrap();
        let common = fs::canonicalize(repo.join(".git")).unwrap();
        assert_eq!(fs::canonicalize(&g.common_dir).unwrap(), common);
        assert_eq!(
            fs::canonicalize(&g.admin_dir).unwrap(),
            common.join("worktrees/worker-1")
        );
        // A worker that rewrites its `.git` file does not redirect zergd.
        fs::write(wt.join(".git"), "gitdir: /etc\n").unwrap();
        assert_eq!(git_layout(&repo, &wt, "f", 1).unwrap(), g);
        assert!(git_layout(&repo, dir.path(), "f", 1).is_err());
    }
}
