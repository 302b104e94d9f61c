//! `zergctl land`: a complete rush's staging branch taken into the branch it started from — a
//! fast-forward, or a merge commit on which the quality gates run again — never losing the
//! user's uncommitted work or a commit made meanwhile; and `--pr`, which pushes the staging
//! branch and opens a pull request with `gh` (a stand-in that records its arguments).

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use serde_json::json;
use zerg_tests::*;

fn ok(out: &std::process::Output) -> String {
    succeeded(out)
}

fn refused(out: &std::process::Output) -> String {
    assert!(!out.status.success(), "{}", said(out));
    said(out)
}

fn head(repo: &TestRepo, rev: &str) -> String {
    git(&repo.path, &["rev-parse", rev]).trim().to_string()
}

#[test]
fn land_fast_forwards_or_merges_with_the_gates_run_again_and_never_loses_work() {
    let repo = TestRepo::new();
    let runs = repo.path.parent().unwrap().join("gate-runs");
    // The gate passes during the rush; on a landing merge it sees `user.txt` (the user's commit
    // on main) and, while `block-landing` exists, fails there.
    let gate = format!(
        "echo run >> '{}' && ! {{ test -e user.txt && test -e '{}'; }}",
        runs.display(),
        repo.path.parent().unwrap().join("block-landing").display()
    );
    repo.configure(
        &Config::fake_agent()
            .fast_workers()
            .gate("landing-check", &gate, true),
    );
    let d = Daemon::start();
    let ctl = |args: &[&str]| d.ctl_in(&repo.path, args);

    // Not complete: refused.
    repo.write_graph("lf", &graph_12("lf"));
    repo.write_script("lf", &json!({"default": [{"op": "hang"}]}));
    ok(&ctl(&["rush", "lf", "--workers", "2", "--detach"]));
    d.wait_for(&repo.path, "lf", Duration::from_secs(60), "running", |s| {
        s["state"] == "running"
    });
    let out = refused(&ctl(&["land", "lf"]));
    assert!(out.contains("only a complete rush lands"), "{out}");
    ok(&ctl(&["stop", "lf", "--force"]));

    // A complete rush, the base untouched: a fast-forward, the checkout updated.
    repo.write_graph("la", &graph_12("la"));
    ok(&ctl(&["rush", "la", "--workers", "2"]));
    let main_before = head(&repo, "main");
    // Uncommitted work in a file the landing would bring: refused, nothing moved.
    std::fs::create_dir_all(repo.path.join("l1")).unwrap();
    std::fs::write(repo.path.join("l1/a1.txt"), "mine\n").unwrap();
    let out = refused(&ctl(&["land", "la"]));
    assert!(
        out.contains("uncommitted changes in files the landing would change: l1/a1.txt"),
        "{out}"
    );
    assert_eq!(head(&repo, "main"), main_before);
    assert_eq!(
        std::fs::read_to_string(repo.path.join("l1/a1.txt")).unwrap(),
        "mine\n"
    );
    std::fs::remove_file(repo.path.join("l1/a1.txt")).unwrap();
    // Uncommitted work elsewhere is no reason to refuse, and is kept.
    std::fs::write(repo.path.join("notes.txt"), "keep me\n").unwrap();
    let runs_before = std::fs::read_to_string(&runs).unwrap().lines().count();
    let out = ok(&ctl(&["land", "la"]));
    assert!(out.contains("main fast-forwarded to"), "{out}");
    assert_eq!(head(&repo, "main"), head(&repo, "zerg/la/staging"));
    assert!(
        repo.path.join("l3/c3.txt").is_file(),
        "the checkout is updated"
    );
    assert_eq!(
        std::fs::read_to_string(repo.path.join("notes.txt")).unwrap(),
        "keep me\n"
    );
    assert_eq!(
        std::fs::read_to_string(&runs).unwrap().lines().count(),
        runs_before,
        "a fast-forward runs no gate again"
    );
    let out = ok(&ctl(&["land", "la"]));
    assert!(out.contains("already contains zerg/la/staging"), "{out}");
    std::fs::remove_file(repo.path.join("notes.txt")).unwrap();

    // The base moved on meanwhile: a merge commit, with the gate run again on it.
    let mut g: serde_json::Value = serde_json::from_str(&graph_12("lm")).unwrap();
    for t in g["tasks"].as_array_mut().unwrap() {
        let f = t["files"]["create"][0]
            .as_str()
            .unwrap()
            .replace('/', "/m-");
        t["files"]["create"][0] = json!(f);
        t["verification"] = json!({"command": format!("test -f {f}")});
    }
    repo.write_graph("lm", &g.to_string());
    ok(&ctl(&["rush", "lm", "--workers", "2"]));
    std::fs::write(repo.path.join("user.txt"), "the user's work\n").unwrap();
    git(&repo.path, &["add", "user.txt"]);
    git(&repo.path, &["commit", "-q", "-m", "the user's commit"]);
    let user_commit = head(&repo, "main");
    // First with the gate failing on the merge: refused, main untouched.
    std::fs::write(repo.path.parent().unwrap().join("block-landing"), "").unwrap();
    let out = refused(&ctl(&["land", "lm"]));
    assert!(
        out.contains("quality gate 'landing-check' failed on the merge"),
        "{out}"
    );
    assert_eq!(head(&repo, "main"), user_commit);
    std::fs::remove_file(repo.path.parent().unwrap().join("block-landing")).unwrap();
    let runs_before = std::fs::read_to_string(&runs).unwrap().lines().count();
    let out = ok(&ctl(&["land", "lm"]));
    assert!(out.contains("gate landing-check: passed"), "{out}");
    assert!(out.contains("was merged into it as"), "{out}");
    assert_eq!(
        std::fs::read_to_string(&runs).unwrap().lines().count(),
        runs_before + 1
    );
    let parents = git(&repo.path, &["log", "-1", "--format=%P", "main"]);
    assert_eq!(
        parents.split_whitespace().collect::<Vec<_>>(),
        vec![
            user_commit.as_str(),
            head(&repo, "zerg/lm/staging").as_str()
        ]
    );
    assert!(repo.path.join("user.txt").is_file());
    assert!(repo.path.join("l3/m-c3.txt").is_file());
    assert_eq!(
        git(&repo.path, &["status", "--porcelain", "--", ".", ":!.zerg"]).trim(),
        "",
        "the checkout matches main"
    );

    // A commit on main that conflicts with the rush's work: refused naming the file.
    let mut g: serde_json::Value = serde_json::from_str(&graph_12("lc")).unwrap();
    for t in g["tasks"].as_array_mut().unwrap() {
        let f = t["files"]["create"][0]
            .as_str()
            .unwrap()
            .replace('/', "/c-");
        t["files"]["create"][0] = json!(f);
        t["verification"] = json!({"command": format!("test -f {f}")});
    }
    repo.write_graph("lc", &g.to_string());
    ok(&ctl(&["rush", "lc", "--workers", "2"]));
    std::fs::write(repo.path.join("l1/c-a1.txt"), "the user's version\n").unwrap();
    git(&repo.path, &["add", "l1/c-a1.txt"]);
    git(
        &repo.path,
        &["commit", "-q", "-m", "the user's l1/c-a1.txt"],
    );
    let before = head(&repo, "main");
    let out = refused(&ctl(&["land", "lc"]));
    assert!(out.contains("conflicts in: l1/c-a1.txt"), "{out}");
    assert_eq!(head(&repo, "main"), before);
    assert_eq!(
        git(&repo.path, &["status", "--porcelain", "--", ".", ":!.zerg"]).trim(),
        ""
    );
    assert!(
        !repo.path.join(".zerg/worktrees/lc/land").exists(),
        "the landing's worktree is gone"
    );
}

#[test]
fn land_pr_pushes_staging_and_opens_a_pull_request_listing_tasks_cost_and_gates() {
    let repo = TestRepo::new();
    let origin = repo.path.parent().unwrap().join("origin.git");
    git(
        repo.path.parent().unwrap(),
        &["init", "-q", "--bare", &origin.to_string_lossy()],
    );
    git(
        &repo.path,
        &["remote", "add", "origin", &origin.to_string_lossy()],
    );
    repo.configure(
        &Config::fake_agent()
            .fast_workers()
            .gate("unit", "true", true),
    );
    repo.write_graph("lp", &graph_12("lp"));
    // A stand-in gh: logged in, records each call's arguments (one per line, NUL-free), and
    // prints the new pull request's URL.
    let bin = repo.path.parent().unwrap().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let calls = repo.path.parent().unwrap().join("gh-calls");
    std::fs::write(
        bin.join("gh"),
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done >> '{}'\necho ---- >> '{}'\nif [ \"$1\" = pr ]; then echo https://github.example/o/r/pull/7; fi\n",
            calls.display(),
            calls.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(bin.join("gh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = path_with(&bin);
    let d = Daemon::start();
    ok(&d.ctl_in(&repo.path, &["rush", "lp", "--workers", "2"]));
    let main_before = head(&repo, "main");

    // Without gh: said so.
    let out = refused(&d.ctl_in_env(
        &repo.path,
        &["land", "lp", "--pr"],
        &[("PATH", "/usr/bin:/bin")],
    ));
    assert!(out.contains("gh, which is not installed"), "{out}");

    let out = ok(&d.ctl_in_env(
        &repo.path,
        &["land", "lp", "--pr"],
        &[("PATH", path.as_str())],
    ));
    assert!(
        out.contains(
            "Opened a pull request of zerg/lp/staging into main: https://github.example/o/r/pull/7"
        ),
        "{out}"
    );
    assert_eq!(head(&repo, "main"), main_before, "--pr moves nothing here");
    assert_eq!(
        git(&origin, &["rev-parse", "refs/heads/zerg/lp/staging"]).trim(),
        head(&repo, "zerg/lp/staging"),
        "the staging branch was pushed"
    );
    let recorded = std::fs::read_to_string(&calls).unwrap();
    let pr = recorded
        .split("----\n")
        .find(|c| c.starts_with("pr\ncreate\n"))
        .expect("gh pr create was called");
    let args: Vec<&str> = pr.lines().collect();
    let after = |flag: &str| {
        args.iter()
            .position(|a| *a == flag)
            .map(|i| args[i + 1])
            .unwrap_or_default()
    };
    assert_eq!(after("--base"), "main");
    assert_eq!(after("--head"), "zerg/lp/staging");
    assert_eq!(after("--title"), "zerg: lp");
    assert!(recorded.starts_with("auth\nstatus\n"), "{recorded}");
    for id in graph_12_ids() {
        assert!(pr.contains(&format!("| `{id}` |")), "{id} in {pr}");
    }
    assert!(pr.contains("Level three part 3"), "{pr}");
    assert!(pr.contains("Agent cost: $"), "{pr}");
    assert!(pr.contains("- passed `unit`"), "{pr}");
}
