//! Every in-process operation, checked against the git program, in a SHA-1 and a SHA-256
//! repository.

use super::*;
use std::path::Path;
use zerg_proto::testkit::git;

const FORMATS: [&str; 2] = ["sha1", "sha256"];

/// A repository of `format` with a spec directory and a few files, committed on `main`.
fn fixture(format: &str) -> (tempfile::TempDir, PathBuf, String) {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path().join("repo");
    std::fs::create_dir(&r).unwrap();
    git(
        &r,
        &[
            "init",
            "-q",
            "-b",
            "main",
            &format!("--object-format={format}"),
        ],
    );
    write(&r, ".gsd/specs/f/task-graph.json", "{}\n");
    write(&r, ".gsd/specs/f/requirements.md", "req\n");
    write(&r, "src/lib.rs", "pub fn a() {}\n");
    write(&r, "README.md", "readme\n");
    write(&r, ".gitignore", "target/\n");
    git(&r, &["add", "-A"]);
    git(&r, &["commit", "-q", "-m", "base"]);
    let base = git(&r, &["rev-parse", "HEAD"]);
    (dir, r, base)
}

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

fn commit_on(r: &Path, branch: &str, from: &str, rel: &str, text: &str) -> String {
    git(r, &["checkout", "-q", "-B", branch, from]);
    write(r, rel, text);
    git(r, &["add", "-A"]);
    git(r, &["commit", "-q", "-m", rel]);
    let c = git(r, &["rev-parse", "HEAD"]);
    git(r, &["checkout", "-q", "main"]);
    c
}

fn who() -> Identity {
    Identity {
        name: "zerg test".into(),
        email: "test@zerg.invalid".into(),
    }
}

#[test]
fn a_task_commit_is_checked_like_git_would() {
    for format in FORMATS {
        let (_d, r, base) = fixture(format);
        let repo = Repo::open(&r).unwrap();
        assert_eq!(repo.is_sha256(), format == "sha256");
        let good = commit_on(&r, "w1", &base, "src/new.rs", "x\n");
        assert_eq!(repo.check_task_commit(&base, &good, ".gsd/specs/f"), Ok(()));
        // Two commits on: the merge-base walk, not only the parents.
        let deeper = commit_on(&r, "w1", &good, "src/more.rs", "y\n");
        assert_eq!(
            repo.check_task_commit(&base, &deeper, ".gsd/specs/f"),
            Ok(())
        );

        let spec = commit_on(&r, "w2", &base, ".gsd/specs/f/task-graph.json", "[]\n");
        let e = repo
            .check_task_commit(&base, &spec, ".gsd/specs/f")
            .unwrap_err();
        assert!(e.contains("changes the rush's spec"), "{e}");

        // Unrelated history: an orphan commit.
        git(&r, &["checkout", "-q", "--orphan", "orphan"]);
        git(&r, &["commit", "-q", "-m", "orphan"]);
        let orphan = git(&r, &["rev-parse", "HEAD"]);
        git(&r, &["checkout", "-q", "main"]);
        let e = repo
            .check_task_commit(&base, &orphan, ".gsd/specs/f")
            .unwrap_err();
        assert!(e.contains("does not descend"), "{e}");
        // An ancestor of the base does not descend from it either.
        let e = repo
            .check_task_commit(&good, &base, ".gsd/specs/f")
            .unwrap_err();
        assert!(e.contains("does not descend"), "{e}");

        let tree = git(&r, &["rev-parse", "HEAD^{tree}"]);
        let e = repo
            .check_task_commit(&base, &tree, ".gsd/specs/f")
            .unwrap_err();
        assert!(e.contains("is not a commit"), "{e}");
        let missing = "1".repeat(base.len());
        let e = repo
            .check_task_commit(&base, &missing, ".gsd/specs/f")
            .unwrap_err();
        assert!(e.contains("is not a commit"), "{e}");
        let e = repo
            .check_task_commit(&base, "HEAD; rm -rf /", ".gsd/specs/f")
            .unwrap_err();
        assert!(e.contains("not an object id"), "{e}");
        // An id of the other format is no commit here.
        let other = "2".repeat(if base.len() == 40 { 64 } else { 40 });
        assert!(
            repo.check_task_commit(&base, &other, ".gsd/specs/f")
                .is_err()
        );
    }
}

#[test]
fn ref_moves_are_compare_and_swap_and_all_or_nothing() {
    for format in FORMATS {
        let (_d, r, base) = fixture(format);
        let repo = Repo::open(&r).unwrap();
        let a = commit_on(&r, "wa", &base, "a.txt", "a\n");
        let b = commit_on(&r, "wb", &base, "b.txt", "b\n");
        repo.move_refs(&[("refs/heads/wa", &b, Expect::Is(a.clone()))], "t")
            .unwrap();
        assert_eq!(git(&r, &["rev-parse", "wa"]), b);
        // Stale expectation: refused, and the other move in the same transaction with it.
        let e = repo.move_refs(
            &[
                ("refs/heads/wb", &a, Expect::Any),
                ("refs/heads/wa", &a, Expect::Is(base.clone())),
            ],
            "t",
        );
        assert!(e.is_err());
        assert_eq!(git(&r, &["rev-parse", "wa"]), b);
        assert_eq!(git(&r, &["rev-parse", "wb"]), b);
        // A new ref with no expectation.
        repo.move_refs(&[("refs/zerg/f/wip/t1", &a, Expect::Any)], "t")
            .unwrap();
        assert_eq!(git(&r, &["rev-parse", "refs/zerg/f/wip/t1"]), a);
    }
}

#[test]
fn a_level_merges_in_memory_and_moves_every_branch_at_once() {
    for format in FORMATS {
        let (_d, r, base) = fixture(format);
        git(&r, &["branch", "staging", &base]);
        let a = commit_on(&r, "w1", &base, "src/a.rs", "a\n");
        let b = commit_on(&r, "w2", &base, "src/b.rs", "b\n");
        let repo = Repo::open(&r).unwrap();
        let m = LevelMerge {
            staging: "refs/heads/staging".into(),
            heads: vec![
                (a.clone(), "ZERG: merge w1".into()),
                (b.clone(), "ZERG: merge w2".into()),
                // Already contained: no merge commit of its own.
                (base.clone(), "ZERG: merge w3".into()),
            ],
            also_move: vec!["refs/heads/w1".into(), "refs/heads/w2".into()],
            identity: who(),
        };
        let Merged::Head(head) = repo.merge_level(&m).unwrap() else {
            panic!("no merge")
        };
        for b in ["staging", "w1", "w2"] {
            assert_eq!(git(&r, &["rev-parse", b]), head);
        }
        assert_eq!(git(&r, &["rev-list", "--count", "--merges", &head]), "2");
        assert_eq!(
            git(&r, &["ls-tree", "-r", "--name-only", &head, "src"]),
            "src/a.rs\nsrc/b.rs\nsrc/lib.rs"
        );
        assert_eq!(
            git(&r, &["log", "-1", "--format=%an <%ae>|%s", &head]),
            "zerg test <test@zerg.invalid>|ZERG: merge w2"
        );
        git(&r, &["fsck", "--strict", "--no-dangling"]);

        // A conflict moves nothing: git does that merge.
        let c1 = commit_on(&r, "c1", &head, "README.md", "one\n");
        let c2 = commit_on(&r, "c2", &head, "README.md", "two\n");
        let m = LevelMerge {
            staging: "refs/heads/staging".into(),
            heads: vec![(c1, "m".into()), (c2, "m".into())],
            also_move: vec!["refs/heads/w1".into()],
            identity: who(),
        };
        let before = fallbacks();
        assert_eq!(
            repo.merge_level(&m).unwrap(),
            Merged::NeedsGit(Fallback::Merge)
        );
        assert!(fallbacks() > before);
        assert_eq!(git(&r, &["rev-parse", "staging"]), head);
        assert_eq!(git(&r, &["rev-parse", "w1"]), head);
    }
}

#[test]
fn a_configured_merge_driver_or_filter_leaves_the_merge_to_git() {
    let (_d, r, base) = fixture("sha1");
    git(&r, &["branch", "staging", &base]);
    let a = commit_on(&r, "w1", &base, "a.txt", "a\n");
    git(&r, &["config", "filter.evil.smudge", "touch /tmp/never"]);
    let repo = Repo::open(&r).unwrap();
    let m = LevelMerge {
        staging: "refs/heads/staging".into(),
        heads: vec![(a, "m".into())],
        also_move: vec![],
        identity: who(),
    };
    assert_eq!(
        repo.merge_level(&m).unwrap(),
        Merged::NeedsGit(Fallback::Merge)
    );
    assert_eq!(git(&r, &["rev-parse", "staging"]), base);
}

/// A worktree on `wt-branch`, as zergd makes one for a worker.
fn worktree(r: &Path, base: &str) -> PathBuf {
    let wt = r.parent().unwrap().join("wt");
    git(
        r,
        &[
            "worktree",
            "add",
            "-q",
            "-b",
            "worker-1",
            &wt.to_string_lossy(),
            base,
        ],
    );
    wt
}

#[test]
fn the_workers_commit_is_what_git_add_and_commit_would_make() {
    use std::os::unix::fs::PermissionsExt;
    for format in FORMATS {
        let (_d, r, base) = fixture(format);
        let wt = worktree(&r, &base);
        // What an agent leaves: an edit, a new file deep down, a deletion, an executable, a
        // symlink, an ignored build dir, the handoff dir, and an edit to the spec.
        write(&wt, "src/lib.rs", "pub fn a() { changed() }\n");
        write(&wt, "src/deep/er/new.rs", "new\n");
        std::fs::remove_file(wt.join("README.md")).unwrap();
        write(&wt, "run.sh", "#!/bin/sh\n");
        std::fs::set_permissions(wt.join("run.sh"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        std::os::unix::fs::symlink("src/lib.rs", wt.join("link")).unwrap();
        write(&wt, "target/debug/out", "built\n");
        write(&wt, ".zerg-task/progress.json", "{}\n");
        write(&wt, ".gsd/specs/f/task-graph.json", "tampered\n");
        // And one change already staged by the agent itself.
        write(&wt, "staged.txt", "staged\n");
        git(&wt, &["add", "staged.txt"]);

        let repo = Repo::open(&wt).unwrap();
        assert!(!repo.is_clean_at(&base, &[".zerg-task"]).unwrap());
        let done = repo
            .commit_worktree(
                &base,
                ".gsd/specs/f",
                &[".zerg-task"],
                "ZERG [1]: t\n\nTask-ID: t\n",
                &who(),
            )
            .unwrap()
            .unwrap();
        assert_eq!(git(&wt, &["rev-parse", "HEAD"]), done.commit);
        assert_eq!(git(&r, &["rev-parse", "worker-1"]), done.commit);
        assert_eq!(git(&wt, &["rev-parse", "HEAD^"]), base);
        let files = git(
            &wt,
            &["ls-tree", "-r", "--format=%(objectmode) %(path)", "HEAD"],
        );
        assert_eq!(
            files,
            "100644 .gitignore\n100644 .gsd/specs/f/requirements.md\n100644 .gsd/specs/f/task-graph.json\n\
             120000 link\n100755 run.sh\n100644 src/deep/er/new.rs\n100644 src/lib.rs\n100644 staged.txt"
        );
        // The spec is the base's, whatever the worktree has.
        assert_eq!(
            git(&wt, &["show", "HEAD:.gsd/specs/f/task-graph.json"]),
            "{}"
        );
        assert_eq!(git(&wt, &["show", "HEAD:link"]), "src/lib.rs");
        let mut changed = done.changed.clone();
        changed.sort();
        assert_eq!(
            changed,
            [
                "README.md",
                "link",
                "run.sh",
                "src/deep/er/new.rs",
                "src/lib.rs",
                "staged.txt"
            ]
        );
        // The index is the commit: nothing staged, and only the spec edit and the handoff dir
        // differ in the worktree, as git itself sees it.
        assert_eq!(git(&wt, &["diff", "--cached", "--name-only"]), "");
        assert_eq!(
            git(&wt, &["status", "--porcelain"]),
            // (the first line's leading space is trimmed)
            "M .gsd/specs/f/task-graph.json\n?? .zerg-task/"
        );
        assert_eq!(
            git(&wt, &["log", "-1", "--format=%an <%ae>|%B"]),
            "zerg test <test@zerg.invalid>|ZERG [1]: t\n\nTask-ID: t"
        );
        git(&r, &["fsck", "--strict", "--no-dangling"]);

        // Put the spec back: the worktree is clean at the new commit, the handoff dir aside.
        git(&wt, &["checkout", "--", ".gsd"]);
        let repo = Repo::open(&wt).unwrap();
        assert!(repo.is_clean_at(&done.commit, &[".zerg-task"]).unwrap());
        assert!(!repo.is_clean_at(&base, &[".zerg-task"]).unwrap());
        assert!(!repo.is_clean_at(&done.commit, &[]).unwrap());
        write(&wt, "stray.txt", "x\n");
        assert!(!repo.is_clean_at(&done.commit, &[".zerg-task"]).unwrap());
    }
}

#[test]
fn a_spec_change_the_agent_committed_itself_is_undone() {
    let (_d, r, base) = fixture("sha1");
    let wt = worktree(&r, &base);
    write(&wt, ".gsd/specs/f/task-graph.json", "agent's\n");
    write(&wt, ".gsd/specs/f/extra.md", "agent's\n");
    write(&wt, "a.txt", "a\n");
    git(&wt, &["add", "-A"]);
    git(&wt, &["commit", "-qm", "the agent's own"]);
    let repo = Repo::open(&wt).unwrap();
    let done = repo
        .commit_worktree(&base, ".gsd/specs/f", &[], "m", &who())
        .unwrap()
        .unwrap();
    assert_eq!(
        repo.check_task_commit(&base, &done.commit, ".gsd/specs/f"),
        Ok(())
    );
    assert_eq!(done.changed, ["a.txt"]);
    assert_eq!(
        git(&wt, &["rev-list", "--count", &format!("{base}..HEAD")]),
        "2"
    );
    // The files on disk keep the agent's spec, which the commit does not: not clean.
    assert!(!done.clean);
}

#[test]
fn a_rename_changes_both_paths() {
    // git's own diff would pair the two paths as a rename and name only the new one; the
    // out-of-scope list must see the old path go.
    for format in FORMATS {
        let (_d, r, base) = fixture(format);
        let wt = worktree(&r, &base);
        std::fs::create_dir(wt.join("docs")).unwrap();
        git(&wt, &["mv", "README.md", "docs/README.md"]);
        git(&wt, &["commit", "-qm", "the agent's own rename"]);
        let repo = Repo::open(&wt).unwrap();
        let done = repo
            .commit_worktree(&base, ".gsd/specs/f", &[], "m", &who())
            .unwrap()
            .unwrap();
        let mut changed = done.changed.clone();
        changed.sort();
        assert_eq!(changed, ["README.md", "docs/README.md"], "{format}");
    }
}

#[test]
fn a_commit_is_read_without_a_worktree() {
    for format in FORMATS {
        let (_d, r, base) = fixture(format);
        commit_on(&r, "next", &base, "src/lib.rs", "pub fn b() {}\n");
        git(&r, &["checkout", "-q", "next"]);
        std::fs::remove_file(r.join("README.md")).unwrap();
        std::os::unix::fs::symlink("src/lib.rs", r.join("link")).unwrap();
        git(&r, &["add", "-A"]);
        git(&r, &["commit", "-qm", "more"]);
        let last = git(&r, &["rev-parse", "HEAD"]);
        let repo = Repo::open(&r).unwrap();
        assert_eq!(repo.resolve_commit("next").unwrap(), last);
        assert!(repo.resolve_commit("--all").is_err());
        assert!(repo.resolve_commit("no-such").is_err());

        let blobs = repo.list_blobs(&base).unwrap();
        let mut paths: Vec<&str> = blobs.iter().map(|b| b.path.as_str()).collect();
        paths.sort();
        assert_eq!(
            paths,
            [
                ".gitignore",
                ".gsd/specs/f/requirements.md",
                ".gsd/specs/f/task-graph.json",
                "README.md",
                "src/lib.rs"
            ]
        );
        let lib = blobs.iter().find(|b| b.path == "src/lib.rs").unwrap();
        assert_eq!(
            lib.id,
            git(&r, &["rev-parse", &format!("{base}:src/lib.rs")])
        );
        assert_eq!(lib.size, 14);
        assert!(lib.regular);

        let mut changes = repo.changed_blobs(&base, &last).unwrap();
        changes.sort_by(|a, b| a.0.cmp(&b.0));
        let summary: Vec<(&str, Option<bool>)> = changes
            .iter()
            .map(|(p, b)| (p.as_str(), b.as_ref().map(|b| b.regular)))
            .collect();
        assert_eq!(
            summary,
            [
                ("README.md", None),
                ("link", Some(false)),
                ("src/lib.rs", Some(true))
            ]
        );
        let ids: Vec<String> = changes
            .iter()
            .filter_map(|(_, b)| b.clone())
            .map(|b| b.id)
            .collect();
        let mut read = Vec::new();
        repo.read_blobs(&ids, 12, |i, bytes| {
            read.push((i, bytes));
            true
        })
        .unwrap();
        // The symlink's target (10 bytes) is read; the 14-byte file is over the cap.
        assert_eq!(
            read,
            [(0, Some(b"src/lib.rs".to_vec())), (1, None)],
            "{format}"
        );
        assert!(
            repo.read_blobs(std::slice::from_ref(&base), 1 << 20, |_, _| true)
                .is_err()
        );
    }
}

/// A container worker's worktree: the spec's entries skip-worktree, its files absent.
fn sparse_spec(wt: &Path) {
    git(
        wt,
        &[
            "update-index",
            "--skip-worktree",
            ".gsd/specs/f/task-graph.json",
            ".gsd/specs/f/requirements.md",
        ],
    );
    std::fs::remove_dir_all(wt.join(".gsd")).unwrap();
}

#[test]
fn skip_worktree_entries_keep_their_flag() {
    let (_d, r, base) = fixture("sha256");
    let wt = worktree(&r, &base);
    sparse_spec(&wt);
    write(&wt, "x.txt", "x\n");
    let repo = Repo::open(&wt).unwrap();
    let done = repo
        .commit_worktree(&base, ".gsd/specs/f", &[".zerg-task"], "m", &who())
        .unwrap()
        .unwrap();
    assert_eq!(done.changed, ["x.txt"]);
    assert_eq!(
        git(&wt, &["ls-files", "-t", ".gsd"]),
        "S .gsd/specs/f/requirements.md\nS .gsd/specs/f/task-graph.json"
    );
    assert_eq!(git(&wt, &["status", "--porcelain"]), "");
    assert!(
        Repo::open(&wt)
            .unwrap()
            .is_clean_at(&done.commit, &[])
            .unwrap()
    );
}

#[test]
fn content_filters_unmerged_entries_and_submodules_go_to_git() {
    // Filters named in a committed .gitattributes.
    let (_d, r, base) = fixture("sha1");
    let wt = worktree(&r, &base);
    write(&wt, ".gitattributes", "*.bin filter=lfs\n");
    let repo = Repo::open(&wt).unwrap();
    let before = fallbacks();
    assert_eq!(
        repo.commit_worktree(&base, ".gsd/specs/f", &[], "m", &who())
            .unwrap(),
        Err(Fallback::Filters)
    );
    assert_eq!(fallbacks(), before + 1);
    assert_eq!(git(&wt, &["rev-parse", "HEAD"]), base, "nothing committed");

    // core.autocrlf.
    let (_d, r, base) = fixture("sha1");
    let wt = worktree(&r, &base);
    git(&r, &["config", "core.autocrlf", "input"]);
    let repo = Repo::open(&wt).unwrap();
    assert_eq!(
        repo.commit_worktree(&base, ".gsd/specs/f", &[], "m", &who())
            .unwrap(),
        Err(Fallback::Filters)
    );

    // An unmerged index.
    let (_d, r, base) = fixture("sha1");
    let c1 = commit_on(&r, "c1", &base, "README.md", "one\n");
    let wt = worktree(&r, &base);
    write(&wt, "README.md", "two\n");
    git(&wt, &["commit", "-qam", "two"]);
    let _ = std::process::Command::new("git")
        .args([
            "-C",
            &wt.to_string_lossy(),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
        ])
        .args(["merge", "-q", &c1])
        .output();
    let repo = Repo::open(&wt).unwrap();
    assert_eq!(
        repo.commit_worktree(&base, ".gsd/specs/f", &[], "m", &who())
            .unwrap(),
        Err(Fallback::Unmerged)
    );

    // A nested repository the agent created.
    let (_d, r, base) = fixture("sha1");
    let wt = worktree(&r, &base);
    let nested = wt.join("vendor/dep");
    std::fs::create_dir_all(&nested).unwrap();
    git(&nested, &["init", "-q"]);
    write(&nested, "f", "x\n");
    git(&nested, &["add", "-A"]);
    git(&nested, &["commit", "-qm", "n"]);
    let repo = Repo::open(&wt).unwrap();
    assert_eq!(
        repo.commit_worktree(&base, ".gsd/specs/f", &[], "m", &who())
            .unwrap(),
        Err(Fallback::Submodule)
    );
}

#[test]
fn identities_come_from_the_repository_config() {
    let (_d, r, _) = fixture("sha1");
    git(&r, &["config", "user.name", "Ada"]);
    git(&r, &["config", "user.email", "ada@example.com"]);
    let repo = Repo::open(&r).unwrap();
    assert_eq!(
        Identity::of(&repo),
        Some(Identity {
            name: "Ada".into(),
            email: "ada@example.com".into()
        })
    );
}

#[test]
fn the_top_level_is_gits_own() {
    let (d, r, base) = fixture("sha1");
    let wt = worktree(&r, &base);
    std::fs::create_dir_all(r.join("src/deep")).unwrap();
    for dir in [r.join("src/deep"), r.clone(), wt.join("src"), wt.clone()] {
        assert_eq!(
            toplevel(&dir).unwrap().to_string_lossy(),
            git(&dir, &["rev-parse", "--show-toplevel"])
        );
    }
    // Through a symlink, as git resolves it.
    let link = d.path().join("link");
    std::os::unix::fs::symlink(&r, &link).unwrap();
    assert_eq!(
        toplevel(&link).unwrap().to_string_lossy(),
        git(&link, &["rev-parse", "--show-toplevel"])
    );
    assert!(toplevel(d.path()).is_err());
}

#[test]
fn zergd_ignores_git_variables_of_its_own_environment() {
    // The child: this same test, run again below with another repository's settings in its
    // environment, as from a shell inside it. Only the worker's opening (whose environment
    // zergd built) would read them.
    if let (Ok(r), Ok(base)) = (
        std::env::var("ZERG_GIT_TEST_REPO"),
        std::env::var("ZERG_GIT_TEST_BASE"),
    ) {
        let r = PathBuf::from(r);
        assert_eq!(toplevel(&r).unwrap(), std::fs::canonicalize(&r).unwrap());
        let repo = Repo::open(&r).unwrap();
        assert_eq!(repo.commit_id("HEAD"), Some(base.clone()));
        assert_eq!(repo.check_task_commit(&base, &base, ".gsd/specs/f"), Ok(()));
        return;
    }
    let (_d, r, base) = fixture("sha1");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "tests::zergd_ignores_git_variables_of_its_own_environment",
            "--nocapture",
        ])
        .env("ZERG_GIT_TEST_REPO", &r)
        .env("ZERG_GIT_TEST_BASE", &base)
        .env("GIT_DIR", "/nonexistent/.git")
        .env("GIT_WORK_TREE", "/nonexistent")
        .env("GIT_OBJECT_DIRECTORY", "/nonexistent/objects")
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_commit_whose_objects_are_not_all_there_is_refused() {
    for format in FORMATS {
        let (_d, r, base) = fixture(format);
        let c = commit_on(&r, "w", &base, "src/new.rs", "pub fn new_one() {}\n");
        let repo = Repo::open(&r).unwrap();
        repo.check_task_commit(&base, &c, ".gsd/specs/f").unwrap();
        // The new blob goes missing (an import that skipped it).
        let blob = git(&r, &["rev-parse", &format!("{c}:src/new.rs")]);
        let loose = r.join(".git/objects").join(&blob[..2]).join(&blob[2..]);
        std::fs::remove_file(&loose).unwrap();
        let repo = Repo::open(&r).unwrap();
        let why = repo
            .check_task_commit(&base, &c, ".gsd/specs/f")
            .unwrap_err();
        assert!(
            why.contains("is incomplete") && why.contains("src/new.rs"),
            "{why}"
        );
    }
}

/// The attack a checkpoint could carry: a merge whose first parent is the base's parent (its
/// id is in the base's header) and whose tree is the base's. It descends from the base and
/// changes nothing, so the task-commit check passes; the checkpoint check refuses it, while a
/// line of the worker's own commits on the base is a checkpoint.
#[test]
fn a_checkpoint_must_be_a_line_of_commits_on_the_base() {
    for format in FORMATS {
        let (_d, r, first) = fixture(format);
        write(&r, "secret.txt", "deleted later\n");
        git(&r, &["add", "-A"]);
        git(&r, &["commit", "-q", "-m", "secret"]);
        git(&r, &["rm", "-q", "secret.txt"]);
        git(&r, &["commit", "-q", "-m", "no secret"]);
        let base = git(&r, &["rev-parse", "HEAD"]);
        let older = git(&r, &["rev-parse", "HEAD^"]);
        let repo = Repo::open(&r).unwrap();
        let one = commit_on(&r, "w1", &base, "src/new.rs", "x\n");
        let two = commit_on(&r, "w1", &one, "src/more.rs", "y\n");
        assert_eq!(repo.check_checkpoint_line(&base, &one), Ok(()));
        assert_eq!(repo.check_checkpoint_line(&base, &two), Ok(()));
        assert_eq!(repo.check_checkpoint_line(&base, &base), Ok(()));
        let tree = git(&r, &["rev-parse", &format!("{base}^{{tree}}")]);
        let merge = git(
            &r,
            &["commit-tree", &tree, "-p", &older, "-p", &base, "-m", "wip"],
        );
        assert_eq!(
            repo.check_task_commit(&base, &merge, ".gsd/specs/f"),
            Ok(())
        );
        let e = repo.check_checkpoint_line(&base, &merge).unwrap_err();
        assert!(e.contains("2 parents"), "{e}");
        // A line that ends before the base (an older root) is refused too.
        let e = repo.check_checkpoint_line(&two, &first).unwrap_err();
        assert!(e.contains("0 parents"), "{e}");
    }
}

#[test]
fn only_a_rushs_own_locks_older_than_the_restart_are_cleared() {
    let t = tempfile::tempdir().unwrap();
    let common = t.path().join(".git");
    let refs = common.join("refs/heads/zerg/f");
    let other = common.join("refs/heads/zerg/g");
    let staging = common.join("worktrees/staging");
    for d in [&refs, &other, &staging] {
        std::fs::create_dir_all(d).unwrap();
    }
    let long_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    let make = |p: &std::path::Path, old: bool| {
        let f = std::fs::File::create(p).unwrap();
        if old {
            f.set_modified(long_ago).unwrap();
        }
    };
    let stale = refs.join("worker-3.lock");
    make(&stale, true);
    let fresh = refs.join("worker-1.lock");
    make(&fresh, false);
    let not_ours = other.join("staging.lock");
    make(&not_ours, true);
    let index = staging.join("index.lock");
    make(&index, true);
    let a_ref = refs.join("worker-2");
    make(&a_ref, true);
    let before = std::time::SystemTime::now() - std::time::Duration::from_secs(30);
    let mut removed = crate::objects::clear_stale_locks(&common, "f", Some(&staging), before);
    removed.sort();
    let mut want = vec![index.clone(), stale.clone()];
    want.sort();
    assert_eq!(removed, want);
    assert!(fresh.exists() && not_ours.exists() && a_ref.exists());
    assert!(!stale.exists() && !index.exists());
}

/// A level merge's commit on `main`, made with git from `from`: every kind of change a
/// checkout must apply.
fn level_merge(r: &Path, from: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    git(r, &["checkout", "-q", "--detach", from]);
    write(r, "src/lib.rs", "pub fn a() { merged() }\n");
    write(r, "src/a/b/c.rs", "deep\n");
    std::fs::remove_file(r.join("README.md")).unwrap();
    std::fs::remove_dir_all(r.join("docs")).unwrap();
    std::fs::remove_file(r.join("notes")).unwrap();
    write(r, "notes/n.md", "now a dir\n");
    std::fs::remove_dir_all(r.join("was_dir")).unwrap();
    write(r, "was_dir", "now a file\n");
    std::fs::set_permissions(r.join("tool.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("src/lib.rs", r.join("link")).unwrap();
    git(r, &["add", "-A"]);
    git(r, &["commit", "-q", "-m", "merge"]);
    let c = git(r, &["rev-parse", "HEAD"]);
    git(r, &["checkout", "-q", "main"]);
    c
}

#[test]
fn a_clean_worktree_is_moved_to_the_level_merge_like_git_reset_would() {
    use std::os::unix::fs::PermissionsExt;
    for format in FORMATS {
        let (_d, r, _) = fixture(format);
        write(&r, "docs/x.md", "x\n");
        write(&r, "docs/sub/y.md", "y\n");
        write(&r, "notes", "a file\n");
        write(&r, "was_dir/inner.txt", "inner\n");
        write(&r, "tool.sh", "#!/bin/sh\n");
        git(&r, &["add", "-A"]);
        git(&r, &["commit", "-q", "-m", "more"]);
        let base = git(&r, &["rev-parse", "HEAD"]);
        let merged = level_merge(&r, &base);
        let wt = worktree(&r, &base);
        // An ignored file inside a directory the merge removes stays, as with git; the task dir
        // is left alone.
        write(&wt, "docs/sub/build.log", "ignored\n");
        write(&r, ".git/info/exclude", "*.log\n");
        write(&wt, ".zerg-task/progress.json", "{}\n");

        // zergd's level merge moved the worker's branch already; its files are still at base.
        git(&r, &["update-ref", "refs/heads/worker-1", &merged]);
        let repo = Repo::open_worktree(&wt).unwrap();
        assert_eq!(
            repo.checkout_clean(&base, &merged, &[".zerg-task"], false)
                .unwrap(),
            Ok(())
        );
        assert_eq!(git(&wt, &["rev-parse", "HEAD"]), merged);
        assert_eq!(git(&r, &["rev-parse", "worker-1"]), merged);
        // Git sees the worktree and index exactly at the merge: nothing staged, changed or
        // untracked (the task dir aside), and its own refresh finds no stat to fix.
        assert_eq!(git(&wt, &["diff", "--cached", "--name-only"]), "");
        assert_eq!(git(&wt, &["status", "--porcelain"]), "?? .zerg-task/");
        assert_eq!(git(&wt, &["diff-files", "--name-only"]), "");
        assert_eq!(
            std::fs::read_to_string(wt.join("src/a/b/c.rs")).unwrap(),
            "deep\n"
        );
        assert!(!wt.join("README.md").exists());
        assert!(!wt.join("docs/x.md").exists());
        assert_eq!(
            std::fs::read_to_string(wt.join("docs/sub/build.log")).unwrap(),
            "ignored\n"
        );
        assert_eq!(
            std::fs::read_to_string(wt.join("notes/n.md")).unwrap(),
            "now a dir\n"
        );
        assert!(wt.join("was_dir").is_file());
        let mode = std::fs::metadata(wt.join("tool.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_ne!(mode & 0o111, 0, "{mode:o}");
        assert_eq!(
            std::fs::read_link(wt.join("link")).unwrap(),
            Path::new("src/lib.rs")
        );
        // Already there: nothing to do.
        let repo = Repo::open_worktree(&wt).unwrap();
        assert!(repo.is_clean_at(&merged, &[".zerg-task"]).unwrap());
        assert_eq!(
            repo.checkout_clean(&merged, &merged, &[".zerg-task"], false)
                .unwrap(),
            Ok(())
        );
        // The branch not moved yet (a container worker's own clone): it moves, compare-and-swap.
        let next = commit_on(&r, "next", &merged, "src/n.rs", "n\n");
        assert_eq!(
            repo.checkout_clean(&merged, &next, &[".zerg-task"], false)
                .unwrap(),
            Ok(())
        );
        assert_eq!(git(&r, &["rev-parse", "worker-1"]), next);
        assert_eq!(git(&wt, &["status", "--porcelain"]), "?? .zerg-task/");
        assert_eq!(
            git(&wt, &["reflog", "-1", "--format=%gs", "worker-1"]),
            format!("reset: moving to {next}")
        );
        git(&r, &["fsck", "--strict", "--no-dangling"]);
    }
}

#[test]
fn a_dirty_worktree_or_new_attributes_go_to_gits_reset() {
    let (_d, r, base) = fixture("sha1");
    let next = commit_on(&r, "next", &base, "src/n.rs", "n\n");
    let wt = worktree(&r, &base);
    // Something the last attempt left.
    write(&wt, "stray.txt", "x\n");
    let repo = Repo::open_worktree(&wt).unwrap();
    assert_eq!(
        repo.checkout_clean(&base, &next, &[".zerg-task"], false)
            .unwrap(),
        Err(Fallback::WorktreeReset)
    );
    assert_eq!(git(&wt, &["rev-parse", "HEAD"]), base, "nothing moved");
    assert!(!wt.join("src/n.rs").exists());
    std::fs::remove_file(wt.join("stray.txt")).unwrap();
    // The files are not where the caller thought they were.
    assert_eq!(
        repo.checkout_clean(&next, &next, &[".zerg-task"], false)
            .unwrap(),
        Err(Fallback::WorktreeReset)
    );
    assert!(!wt.join("src/n.rs").exists());

    // Attributes that may convert content on checkout: git decides.
    let attrs = commit_on(&r, "attrs", &base, ".gitattributes", "*.rs text eol=crlf\n");
    assert_eq!(
        repo.checkout_clean(&base, &attrs, &[".zerg-task"], false)
            .unwrap(),
        Err(Fallback::WorktreeReset)
    );
    assert!(!wt.join(".gitattributes").exists());
    // An ignored symlink where the merge has a directory's files: never written through;
    // the error sends the worker to git's reset.
    let outside = r.parent().unwrap().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let deep = commit_on(&r, "deep", &base, "escape/file.rs", "x\n");
    std::os::unix::fs::symlink(&outside, wt.join("escape")).unwrap();
    write(&r, ".git/info/exclude", "escape\n");
    let repo = Repo::open_worktree(&wt).unwrap();
    let e = repo
        .checkout_clean(&base, &deep, &[".zerg-task"], false)
        .unwrap_err();
    assert!(e.to_string().contains("in the way"), "{e}");
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
}

#[test]
fn a_sparse_spec_stays_out_of_the_worktree_when_it_moves() {
    let (_d, r, base) = fixture("sha1");
    let next = commit_on(&r, "next", &base, "src/n.rs", "n\n");
    let docs = commit_on(&r, "docs", &next, ".gsd/notes.md", "n\n");
    let wt = worktree(&r, &base);
    sparse_spec(&wt);
    let repo = Repo::open_worktree(&wt).unwrap();
    assert_eq!(
        repo.checkout_clean(&base, &next, &[".zerg-task"], false)
            .unwrap(),
        Ok(())
    );
    assert_eq!(std::fs::read_to_string(wt.join("src/n.rs")).unwrap(), "n\n");
    assert!(!wt.join(".gsd").exists());
    assert_eq!(
        git(&wt, &["ls-files", "-t", ".gsd"]),
        "S .gsd/specs/f/requirements.md\nS .gsd/specs/f/task-graph.json"
    );
    assert_eq!(git(&wt, &["status", "--porcelain"]), "");
    // A change beside the sparse entries: git knows the patterns, so git checks it out.
    assert_eq!(
        repo.checkout_clean(&next, &docs, &[".zerg-task"], false)
            .unwrap(),
        Err(Fallback::WorktreeReset)
    );
    assert_eq!(git(&wt, &["rev-parse", "HEAD"]), next);
}

/// The loose objects and the packs (their names) in `r`'s store.
fn store_files(r: &Path) -> (usize, Vec<String>) {
    let objects = r.join(".git/objects");
    let mut loose = 0;
    for e in std::fs::read_dir(&objects).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().unwrap();
        if name.len() == 2 {
            loose += std::fs::read_dir(e.path()).unwrap().count();
        }
    }
    let mut packs: Vec<String> = std::fs::read_dir(objects.join("pack"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    packs.sort();
    (loose, packs)
}

#[test]
fn a_level_merge_writes_its_commits_and_trees_as_one_pack() {
    for format in FORMATS {
        let (_d, r, base) = fixture(format);
        git(&r, &["branch", "staging", &base]);
        let a = commit_on(&r, "w1", &base, "src/w1/a.rs", "a\n");
        let b = commit_on(&r, "w2", &base, "src/w2/b.rs", "b\n");
        let c = commit_on(&r, "w3", &base, "src/w3/c.rs", "c\n");
        let (loose_before, packs_before) = store_files(&r);
        let repo = Repo::open(&r).unwrap();
        let m = LevelMerge {
            staging: "refs/heads/staging".into(),
            heads: [&a, &b, &c]
                .iter()
                .enumerate()
                .map(|(i, h)| (h.to_string(), format!("ZERG: merge w{}", i + 1)))
                .collect(),
            also_move: vec!["refs/heads/w1".into()],
            identity: who(),
        };
        let Merged::Head(head) = repo.merge_level(&m).unwrap() else {
            panic!("no merge")
        };
        let (loose, packs) = store_files(&r);
        assert_eq!(
            loose, loose_before,
            "{format}: the merge wrote loose objects"
        );
        let new: Vec<&String> = packs.iter().filter(|p| !packs_before.contains(p)).collect();
        assert_eq!(new.len(), 2, "{format}: one pack and its index: {new:?}");
        let idx = new.iter().find(|p| p.ends_with(".idx")).unwrap();
        let listed = git(
            &r,
            &["verify-pack", "-v", &format!(".git/objects/pack/{idx}")],
        );
        // Three merge commits, and a root and a `src` tree for the second and the third: the
        // first merge's tree is w1's own, already in the store.
        let commits = listed.lines().filter(|l| l.contains(" commit ")).count();
        let trees = listed.lines().filter(|l| l.contains(" tree ")).count();
        assert_eq!((commits, trees), (3, 4), "{format}:\n{listed}");
        assert_eq!(
            git(&r, &["ls-tree", "-r", "--name-only", &head, "src"]),
            "src/lib.rs\nsrc/w1/a.rs\nsrc/w2/b.rs\nsrc/w3/c.rs"
        );
        git(&r, &["fsck", "--strict", "--no-dangling"]);
        // Nothing new to merge: no pack at all.
        let m = LevelMerge {
            heads: vec![(a, "m".into())],
            ..m
        };
        assert_eq!(repo.merge_level(&m).unwrap(), Merged::Head(head));
        assert_eq!(store_files(&r).1, packs, "{format}");
    }
}

#[test]
fn a_clean_commit_lets_the_next_move_skip_its_status_and_anything_left_out_does_not() {
    for format in FORMATS {
        let (_d, r, base) = fixture(format);
        let wt = worktree(&r, &base);
        let repo = Repo::open_worktree(&wt).unwrap();
        write(&wt, "src/task.rs", "done\n");
        let done = repo
            .commit_worktree(&base, ".gsd/specs/f", &[".zerg-task"], "m", &who())
            .unwrap()
            .unwrap();
        assert!(done.clean, "{format}: nothing was left out");
        // zergd's level merge: this commit and another worker's file, the branch moved.
        git(&r, &["checkout", "-q", "--detach", &done.commit]);
        write(&r, "src/other.rs", "other worker\n");
        git(&r, &["add", "-A"]);
        git(&r, &["commit", "-q", "-m", "merge"]);
        let merged = git(&r, &["rev-parse", "HEAD"]);
        git(&r, &["checkout", "-q", "main"]);
        git(&r, &["update-ref", "refs/heads/worker-1", &merged]);
        assert_eq!(
            repo.checkout_clean(&done.commit, &merged, &[".zerg-task"], true)
                .unwrap(),
            Ok(())
        );
        assert_eq!(git(&wt, &["rev-parse", "HEAD"]), merged);
        assert_eq!(git(&wt, &["status", "--porcelain"]), "", "{format}");
        assert_eq!(git(&wt, &["diff-files", "--name-only"]), "");
        assert_eq!(
            std::fs::read_to_string(wt.join("src/other.rs")).unwrap(),
            "other worker\n"
        );

        // A spec edited on disk stays on disk (the commit keeps the base's): not clean.
        write(&wt, ".gsd/specs/f/task-graph.json", "edited\n");
        write(&wt, "src/t2.rs", "2\n");
        let done = repo
            .commit_worktree(&merged, ".gsd/specs/f", &[".zerg-task"], "m", &who())
            .unwrap()
            .unwrap();
        assert!(!done.clean, "{format}: the spec differs on disk");
        git(&wt, &["checkout", "--", ".gsd/specs/f"]);
        // A file in the task dir is left out of the commit: not clean either.
        write(&wt, ".zerg-task/checkpoint.json", "{}\n");
        write(&wt, "src/t3.rs", "3\n");
        let head = git(&wt, &["rev-parse", "HEAD"]);
        let done = repo
            .commit_worktree(&head, ".gsd/specs/f", &[".zerg-task"], "m", &who())
            .unwrap()
            .unwrap();
        assert!(!done.clean, "{format}: the task dir held a file");
    }
}

#[test]
fn statuses_compare_file_times_to_the_nanosecond_and_a_file_at_the_index_time_is_still_read() {
    // Statuses compare times to the nanosecond: a file whose time is the index's own is
    // "racily clean" and compared by content. With ctime not trusted, and the file rewritten
    // in place (same size, time put back), only that rule can see the change.
    for format in FORMATS {
        let (_d, r, base) = fixture(format);
        let wt = worktree(&r, &base);
        git(&wt, &["config", "core.trustCTime", "false"]);
        let repo = Repo::open_worktree(&wt).unwrap();
        write(&wt, "src/task.rs", "aaaa\n");
        let first = repo
            .commit_worktree(&base, ".gsd/specs/f", &[".zerg-task"], "m", &who())
            .unwrap()
            .unwrap();
        let file = wt.join("src/task.rs");
        let at = std::fs::metadata(&file).unwrap().modified().unwrap();
        std::fs::write(&file, "bbbb\n").unwrap();
        let set = |p: &Path, at| {
            std::fs::File::options()
                .write(true)
                .open(p)
                .unwrap()
                .set_modified(at)
                .unwrap()
        };
        set(&file, at);
        let index = PathBuf::from(git(
            &wt,
            &["rev-parse", "--path-format=absolute", "--git-path", "index"],
        ));
        set(&index, at);
        let second = repo
            .commit_worktree(&first.commit, ".gsd/specs/f", &[".zerg-task"], "m", &who())
            .unwrap()
            .unwrap();
        assert_eq!(second.changed, vec!["src/task.rs".to_string()], "{format}");
        assert_eq!(git(&wt, &["show", "HEAD:src/task.rs"]), "bbbb", "{format}");

        // And the comparison is to the nanosecond: with the index 1 ns newer than the file, the
        // same stat data is trusted and the file is not read (to the second, the two times
        // would be equal, and the file read and hashed).
        let at = std::fs::metadata(&file).unwrap().modified().unwrap();
        std::fs::write(&file, "cccc\n").unwrap();
        set(&file, at);
        set(&index, at + std::time::Duration::from_nanos(1));
        let third = repo
            .commit_worktree(&second.commit, ".gsd/specs/f", &[".zerg-task"], "m", &who())
            .unwrap()
            .unwrap();
        assert!(third.changed.is_empty(), "{format}: {:?}", third.changed);
    }
}

#[test]
fn a_ref_is_read_for_where_it_points_without_a_lock() {
    for format in FORMATS {
        let (_d, r, base) = fixture(format);
        let repo = Repo::open(&r).unwrap();
        let a = commit_on(&r, "wa", &base, "a.txt", "a\n");
        assert!(repo.points_at("refs/heads/wa", &a));
        assert!(!repo.points_at("refs/heads/wa", &base));
        assert!(!repo.points_at("refs/heads/absent", &a));
        assert!(!repo.points_at("refs/heads/wa", "not-an-id"));
        // A symbolic ref is not an object id, even when it leads to one.
        assert!(!repo.points_at("HEAD", &base));
        assert!(!r.join(".git/refs/heads/wa.lock").exists());
    }
}
