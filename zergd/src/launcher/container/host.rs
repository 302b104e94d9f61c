//! Preparing the host for a worker container: its mount points, its private git dir, and,
//! when zergd runs as root, group access for the container's unprivileged user to exactly what
//! it may write (owners are never changed).

use super::*;

/// Creates the mount points and directories the container needs, rebuilds the worker's
/// private git dir and, when zergd is root, grants the container's gid access to exactly what
/// it may write.
pub(crate) fn prepare_host(spec: &WorkerSpec, facts: &HostFacts) -> Result<(), SpawnError> {
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
    let area = worker_git_dir(&g.common_dir, spec.worker_id);
    let logs = worker_log_dir(&spec.log_dir, spec.worker_id);
    // The mount point inside the worktree is created here, not by the engine (which would make
    // it root-owned), and without following anything a worker left in its worktree.
    let mount_point = Path::new(".gsd/specs").join(&spec.feature);
    dir_below(&spec.worktree, &mount_point)
        .map_err(ctx("cannot create", &spec.worktree.join(&mount_point)))?;
    fs::create_dir_all(&logs).map_err(ctx("cannot create", &logs))?;
    write_private_git_dir(g, &area, spec)
        .map_err(ctx("cannot prepare the worker's git dir", &area))?;
    if facts.remapped {
        let gid = facts.gid;
        grant_tree(&spec.worktree, gid, true, Some(&spec.worktree.join(".git")))
            .map_err(ctx("cannot grant access to", &spec.worktree))?;
        grant_tree(&area, gid, true, None).map_err(ctx("cannot grant access to", &area))?;
        grant_tree(&logs, gid, true, None).map_err(ctx("cannot grant access to", &logs))?;
        grant_readable(&spec.spec_dir, gid)
            .map_err(ctx("cannot grant access to", &spec.spec_dir))?;
        grant_socket(&spec.socket, gid).map_err(ctx("cannot grant access to", &spec.socket))?;
        for p in facts
            .claude_dir
            .iter()
            .chain(&facts.claude_json)
            .chain(&facts.test_paths)
        {
            if p.exists() {
                grant_tree(p, gid, true, None).map_err(ctx("cannot grant access to", p))?;
            }
        }
    }
    Ok(())
}

/// Rebuilds the worker's private git dir (see [`worker_git_dir`]). Objects the container wrote
/// earlier are kept (they are imported on exit and on each accepted commit); refs, logs, the
/// index and the admin dir start afresh from the real repository.
pub(crate) fn write_private_git_dir(
    g: &GitLayout,
    area: &Path,
    spec: &WorkerSpec,
) -> io::Result<()> {
    let common = &g.common_dir;
    for d in ["refs", "logs", "worktrees", "info"] {
        let p = area.join(d);
        if fs::symlink_metadata(&p).is_ok() {
            if p.is_dir() && !p.is_symlink() {
                fs::remove_dir_all(&p)?;
            } else {
                fs::remove_file(&p)?;
            }
        }
    }
    // A symlink a container left in place of its object dir would send zergd's writes (and the
    // import) elsewhere.
    let objects = area.join("objects");
    if fs::symlink_metadata(&objects).is_ok_and(|m| !m.is_dir()) {
        fs::remove_file(&objects)?;
    }
    for name in [
        "packed-refs",
        "index",
        "ORIG_HEAD",
        "FETCH_HEAD",
        "MERGE_HEAD",
    ] {
        let _ = fs::remove_file(area.join(name));
    }
    let admin = area.join("worktrees").join(g.admin_name());
    for d in [
        area.join("objects/pack"),
        area.join("objects/info"),
        area.join("refs/heads"),
        area.join("refs/tags"),
        area.join("info"),
        admin.join("info"),
    ] {
        fs::create_dir_all(&d)?;
    }
    let copy_or = |name: &str, default: &str| {
        let text = fs::read_to_string(common.join(name)).unwrap_or_else(|_| default.to_string());
        write_fresh(&area.join(name), text)
    };
    copy_or("config", "")?;
    copy_or("HEAD", "ref: refs/heads/main\n")?;
    let spec_rel = format!("/.gsd/specs/{}/", spec.feature);
    let mut exclude = fs::read_to_string(common.join("info/exclude")).unwrap_or_default();
    exclude.push_str(&format!(
        "\n# zerg: the spec snapshot is mounted here read-only\n{spec_rel}\n"
    ));
    write_fresh(&area.join("info/exclude"), exclude)?;
    write_fresh(
        &area.join("objects/info/alternates"),
        format!("{SHARED_OBJECTS}\n"),
    )?;
    // The worktree's own admin dir, private too: its HEAD names the worker branch, whose value
    // comes from the snapshot below; no index, so the agent's first `git reset --hard` builds
    // one that honours the sparse patterns and never touches the mounted spec.
    write_fresh(
        &admin.join("HEAD"),
        format!("ref: refs/heads/{}\n", spec.branch),
    )?;
    write_fresh(&admin.join("commondir"), "../..\n")?;
    write_fresh(
        &admin.join("gitdir"),
        format!("{}\n", spec.worktree.join(".git").display()),
    )?;
    write_fresh(
        &admin.join("info/sparse-checkout"),
        format!("/*\n!{spec_rel}\n"),
    )?;
    let refs = crate::git::git(
        common,
        &["for-each-ref", "--format=%(objectname) %(refname)"],
    )
    .map_err(|e| io::Error::other(e.to_string()))?;
    write_fresh(&area.join("packed-refs"), format!("{refs}\n"))
}

/// Writes a new file at `path`, removing whatever was there first: a symlink a container left
/// is replaced, never followed.
fn write_fresh(path: &Path, text: impl AsRef<[u8]>) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    io::Write::write_all(&mut f, text.as_ref())
}

/// Sets the group of `path` (and, if `recursive`, of everything below it except `skip`) to
/// `gid` with group read/write, group search on directories (plus setgid) and group execute
/// where the owner may execute. Symlinks are left alone. Entries already granted cost one
/// `lstat`.
pub(crate) fn grant_tree(
    path: &Path,
    gid: u32,
    recursive: bool,
    skip: Option<&Path>,
) -> io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    let ft = meta.file_type();
    let mode = meta.mode() & 0o7777;
    let want = if ft.is_dir() {
        0o2070
    } else if ft.is_file() {
        0o060 | if mode & 0o100 != 0 { 0o010 } else { 0 }
    } else if ft.is_socket() {
        0o060
    } else {
        return Ok(());
    };
    set_group_bits(path, &meta, gid, want)?;
    if recursive && ft.is_dir() {
        for entry in fs::read_dir(path)? {
            let p = entry?.path();
            if Some(p.as_path()) != skip {
                grant_tree(&p, gid, true, skip)?;
            }
        }
    }
    Ok(())
}

/// Group read (and search) on a tree the container only reads.
pub(crate) fn grant_readable(path: &Path, gid: u32) -> io::Result<()> {
    let meta = fs::symlink_metadata(path)?;
    let ft = meta.file_type();
    if ft.is_dir() {
        set_group_bits(path, &meta, gid, 0o050)?;
        for entry in fs::read_dir(path)? {
            grant_readable(&entry?.path(), gid)?;
        }
        Ok(())
    } else if ft.is_file() {
        set_group_bits(path, &meta, gid, 0o040)
    } else {
        Ok(())
    }
}

/// Lets the container's gid connect to the worker-plane socket: group search on its directory
/// (which holds nothing else) and group read/write on the socket. The control socket's
/// directory above stays closed to everyone but zergd's user.
pub(crate) fn grant_socket(socket: &Path, gid: u32) -> io::Result<()> {
    if let Some(dir) = socket.parent() {
        let meta = fs::metadata(dir)?;
        set_group_bits(dir, &meta, gid, 0o010)?;
    }
    let meta = fs::metadata(socket)?;
    set_group_bits(socket, &meta, gid, 0o060)
}

pub(crate) fn set_group_bits(
    path: &Path,
    meta: &fs::Metadata,
    gid: u32,
    want: u32,
) -> io::Result<()> {
    if meta.gid() != gid {
        std::os::unix::fs::chown(path, None, Some(gid))?;
    }
    let mode = meta.mode() & 0o7777;
    if mode & want != want || meta.gid() != gid {
        // chown may clear setgid; always re-apply the full mode after a group change.
        fs::set_permissions(path, fs::Permissions::from_mode(mode | want))?;
    }
    Ok(())
}

/// Makes `root/rel` a directory, one component at a time, replacing whatever a worker left on
/// the way that is not a directory (a symlink to elsewhere, a file): nothing outside `root` is
/// ever created or followed. `rel` is relative and has no `..`.
pub(crate) fn dir_below(root: &Path, rel: &Path) -> io::Result<()> {
    let mut at = root.to_path_buf();
    for c in rel.components() {
        let std::path::Component::Normal(name) = c else {
            return Err(io::Error::other(format!(
                "{} is not a plain relative path",
                rel.display()
            )));
        };
        at.push(name);
        match fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => continue,
            Ok(_) => fs::remove_file(&at)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        fs::create_dir(&at)?;
    }
    Ok(())
}

#[cfg(test)]
mod dir_tests {
    use super::*;

    #[test]
    fn the_mount_point_is_made_inside_the_worktree_whatever_the_worker_left() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let wt = root.path();
        // A worker replaced `.gsd` with a symlink out of its worktree, and `specs` with a file.
        std::os::unix::fs::symlink(outside.path(), wt.join(".gsd")).unwrap();
        dir_below(wt, Path::new(".gsd/specs/feat")).unwrap();
        assert!(fs::symlink_metadata(wt.join(".gsd")).unwrap().is_dir());
        assert!(wt.join(".gsd/specs/feat").is_dir());
        assert_eq!(
            fs::read_dir(outside.path()).unwrap().count(),
            0,
            "nothing made outside"
        );
        fs::remove_dir_all(wt.join(".gsd/specs")).unwrap();
        fs::write(wt.join(".gsd/specs"), "not a dir").unwrap();
        dir_below(wt, Path::new(".gsd/specs/feat")).unwrap();
        assert!(wt.join(".gsd/specs/feat").is_dir());
        // Already there: nothing changes, and nothing but plain relative paths is accepted.
        dir_below(wt, Path::new(".gsd/specs/feat")).unwrap();
        assert!(dir_below(wt, Path::new("../x")).is_err());
    }
}
