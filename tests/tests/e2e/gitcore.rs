//! git done in process: a whole rush in a SHA-1 and in a SHA-256 repository, with the workers'
//! commits and moves to each level's base, zergd's checks and the level merges made without
//! the git program.

use serde_json::json;
use zerg_tests::*;

/// `git fallback (…)` lines of the workers' logs and zergd's.
fn fallbacks(repo: &TestRepo, d: &Daemon) -> Vec<String> {
    let mut text = d.log();
    if let Ok(rd) = std::fs::read_dir(repo.path.join(".zerg/logs")) {
        for e in rd.flatten() {
            text.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
        }
    }
    text.lines()
        .filter(|l| l.contains("git fallback"))
        .map(str::to_string)
        .collect()
}

/// The packs in the repository's object store.
fn packs(repo: &TestRepo) -> usize {
    std::fs::read_dir(repo.path.join(".git/objects/pack"))
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".pack"))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn a_rush_completes_in_sha1_and_sha256_repositories_with_git_in_process() {
    for format in ["sha1", "sha256"] {
        let repo = TestRepo::with_object_format(format);
        repo.write_graph("feat", &graph_12("feat"));
        // One agent also commits on its own, and one stages a file without committing it.
        repo.write_script(
            "feat",
            &json!({"default": [{"op": "write_owned"}], "tasks": {
                "G-L1-001": [{"op": "write_owned"}, {"op": "shell", "command": "git add -A && git -c user.name=a -c user.email=a@a commit -qm own"}],
                "G-L1-002": [{"op": "write_owned"}, {"op": "shell", "command": "git add -A"}],
            }}),
        );
        repo.configure(&Config::fake_agent().fast_workers());
        let packs_before = packs(&repo);
        let d = Daemon::start();
        let out = d.ctl_in(&repo.path, &["rush", "feat", "--workers", "3"]);
        assert!(
            out.status.success(),
            "{format}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            d.log()
        );
        let staging = "zerg/feat/staging";
        assert_eq!(
            git(&repo.path, &["rev-parse", "--show-object-format"]),
            format
        );
        // Every task's commit is on staging, once, and so is every file the tasks own.
        let ids = git(
            &repo.path,
            &["log", "--format=%(trailers:key=Task-ID,valueonly)", staging],
        );
        let mut ids: Vec<&str> = ids.lines().filter(|l| !l.is_empty()).collect();
        ids.sort();
        assert_eq!(ids, graph_12_ids(), "{format}");
        let files = git(&repo.path, &["ls-tree", "-r", "--name-only", staging]);
        for f in ["l1/a1.txt", "l1/a5.txt", "l3/c3.txt"] {
            assert!(
                files.lines().any(|l| l == f),
                "{format}: {f} not on staging:\n{files}"
            );
        }
        // Levels were merged: the merge commits are zergd's, with both parents.
        let merges = git(&repo.path, &["rev-list", "--merges", "--count", staging]);
        assert!(
            merges.parse::<u32>().unwrap() >= 3,
            "{format}: {merges} merges"
        );
        repo.wait_worktrees_removed();
        git(&repo.path, &["fsck", "--strict", "--no-dangling"]);
        // Each level's merge wrote its commits and trees as one pack: one new pack per level
        // (three) at most, no loose file per merge object.
        let new_packs = packs(&repo) - packs_before;
        assert!(
            (1..=3).contains(&new_packs),
            "{format}: {new_packs} new packs for 12 tasks in 3 levels"
        );
        // Nothing went to the git program, the workers' moves to each level's base included.
        assert_eq!(fallbacks(&repo, &d), Vec::<String>::new(), "{format}");
    }
}
