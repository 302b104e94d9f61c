//! `worktree.copy`: the ignored files of the user's checkout (a `.env`, local settings) that a
//! worker's worktree needs and git does not put there. They are listed by git itself (`git
//! ls-files --others --ignored --exclude-standard` with glob pathspecs), so a pattern means what
//! it means to git, tracked files are never copied, and nothing under `.zerg/` is.
//!
//! The copies are written into a tree a worker can write, so by directory descriptor
//! ([`crate::fsat`]): a symlink a worker left where a copy goes is replaced, never followed.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::fsat::Dir;

/// One ignored file of the checkout that `worktree.copy` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopiedFile {
    /// Path relative to the repository root.
    pub path: String,
    /// Size in bytes when listed.
    pub size: u64,
}

/// The ignored files of `repo`'s checkout that `patterns` name, sorted; an empty list of
/// patterns lists nothing. An error names the pattern list and git's complaint.
pub fn list(repo: &Path, patterns: &[String]) -> Result<Vec<CopiedFile>, String> {
    if patterns.is_empty() {
        return Ok(Vec::new());
    }
    let mut args = vec![
        "ls-files".to_string(),
        "-z".into(),
        "--others".into(),
        "--ignored".into(),
        "--exclude-standard".into(),
        "--".into(),
    ];
    args.extend(patterns.iter().map(|p| format!(":(glob){}", p.trim())));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = crate::git::git(repo, &argv)
        .map_err(|e| format!("worktree.copy {patterns:?}: git cannot list them: {e}"))?;
    let mut files: Vec<CopiedFile> = out
        .split('\0')
        .filter(|p| !p.is_empty() && !p.starts_with(".zerg/"))
        .filter_map(|p| {
            let meta = std::fs::symlink_metadata(repo.join(p)).ok()?;
            meta.is_file().then(|| CopiedFile {
                path: p.to_string(),
                size: meta.len(),
            })
        })
        .collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    files.dedup_by(|a, b| a.path == b.path);
    Ok(files)
}

/// Copies `files` from `repo` into the worktree `dst`, at the same paths, with the same
/// permission bits (and, with `readable_by`, group read for that gid); what is there already
/// is replaced. Returns the bytes written.
pub fn copy_into(
    repo: &Path,
    files: &[CopiedFile],
    dst: &Path,
    readable_by: Option<u32>,
) -> Result<u64, String> {
    if files.is_empty() {
        return Ok(0);
    }
    let root =
        Dir::open(dst).map_err(|e| format!("worktree.copy: cannot open {}: {e}", dst.display()))?;
    let mut total = 0;
    for f in files {
        let rel = PathBuf::from(&f.path);
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
            continue;
        };
        let src = repo.join(&rel);
        let what =
            |e: std::io::Error| format!("worktree.copy: {} into {}: {e}", f.path, dst.display());
        let mut file = std::fs::File::open(&src).map_err(what)?;
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&file.metadata().map_err(what)?.permissions())
                & 0o7777;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(what)?;
        let dir = if parent.as_os_str().is_empty() {
            Dir::open(dst).map_err(what)?
        } else {
            root.make_dirs(parent, 0o755).map_err(what)?
        };
        dir.write_new(name, &bytes, mode).map_err(what)?;
        if let Some(gid) = readable_by {
            dir.grant_file(name, gid, 0o040).map_err(what)?;
        }
        total += bytes.len() as u64;
    }
    Ok(total)
}

/// Refuses copies larger than `max_mb` MiB in all, naming the largest files.
pub fn check_size(files: &[CopiedFile], max_mb: u64) -> Result<(), String> {
    let total: u64 = files.iter().map(|f| f.size).sum();
    if total <= max_mb.saturating_mul(1 << 20) {
        return Ok(());
    }
    let mut big: Vec<&CopiedFile> = files.iter().collect();
    big.sort_by_key(|f| std::cmp::Reverse(f.size));
    let largest: Vec<String> = big
        .iter()
        .take(5)
        .map(|f| format!("{} ({} bytes)", f.path, f.size))
        .collect();
    Err(format!(
        "worktree.copy: {} file(s), {total} bytes, more than worktree.copy_max_mb ({max_mb} MiB) for each worktree; name fewer files or raise the limit. The largest: {}",
        files.len(),
        largest.join(", ")
    ))
}

/// What a rush's start says about the copies: which files leave the checkout, and their size.
pub fn summary(files: &[CopiedFile], remote: bool) -> String {
    let bytes: u64 = files.iter().map(|f| f.size).sum();
    let mut names: Vec<&str> = files.iter().take(20).map(|f| f.path.as_str()).collect();
    if files.len() > names.len() {
        names.push("…");
    }
    let to = if remote {
        "sent from your checkout over the worker plane to every worker, and copied into the staging worktree"
    } else {
        "copied from your checkout into every worker's worktree and the staging worktree"
    };
    format!(
        "worktree.copy: {} ignored file(s), {bytes} bytes, are {to}: {}",
        files.len(),
        names.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        crate::git::git(p, &["init", "-q"]).unwrap();
        std::fs::write(p.join(".gitignore"), ".env\nsecrets/\n.zerg/\n*.log\n").unwrap();
        std::fs::write(p.join(".env"), "KEY=1\n").unwrap();
        std::fs::create_dir_all(p.join("secrets/deep")).unwrap();
        std::fs::write(p.join("secrets/deep/k"), "k").unwrap();
        std::fs::create_dir_all(p.join(".zerg")).unwrap();
        std::fs::write(p.join(".zerg/state"), "s").unwrap();
        std::fs::write(p.join("tracked.txt"), "t").unwrap();
        std::fs::write(p.join("a.log"), "l").unwrap();
        crate::git::git(p, &["add", ".gitignore", "tracked.txt"]).unwrap();
        d
    }

    #[test]
    fn lists_only_ignored_files_the_patterns_name_and_never_zergs_own() {
        let r = repo();
        let pats = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let got = list(
            r.path(),
            &pats(&[".env", "secrets", "tracked.txt", ".zerg", "nothing"]),
        )
        .unwrap();
        let names: Vec<&str> = got.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(names, vec![".env", "secrets/deep/k"]);
        assert_eq!(got[0].size, 6);
        assert!(list(r.path(), &[]).unwrap().is_empty());
        assert!(
            summary(&got, false).contains(".env, secrets/deep/k"),
            "{}",
            summary(&got, false)
        );
        assert!(summary(&got, true).contains("over the worker plane to every worker"));
        assert!(check_size(&got, 1).is_ok());
        let huge = vec![
            CopiedFile {
                path: "a.bin".into(),
                size: 3 << 20,
            },
            CopiedFile {
                path: ".env".into(),
                size: 10,
            },
        ];
        let err = check_size(&huge, 2).unwrap_err();
        assert!(
            err.contains("more than worktree.copy_max_mb (2 MiB)")
                && err.contains("a.bin (3145728 bytes)"),
            "{err}"
        );
    }

    #[test]
    fn copies_replace_a_symlink_a_worker_left_instead_of_writing_through_it() {
        let r = repo();
        let files = list(r.path(), &[".env".into(), "secrets/".into()]).unwrap();
        let dst = tempfile::tempdir().unwrap();
        let victim = dst.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        std::os::unix::fs::symlink(&victim, dst.path().join(".env")).unwrap();
        std::os::unix::fs::symlink(dst.path().join("elsewhere"), dst.path().join("secrets"))
            .unwrap();
        let n = copy_into(r.path(), &files, dst.path(), None).unwrap();
        assert_eq!(n, 7);
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(
            std::fs::read_to_string(dst.path().join(".env")).unwrap(),
            "KEY=1\n"
        );
        assert!(!dst.path().join(".env").is_symlink());
        assert_eq!(
            std::fs::read_to_string(dst.path().join("secrets/deep/k")).unwrap(),
            "k"
        );
        assert!(!dst.path().join("elsewhere").exists());
    }
}
