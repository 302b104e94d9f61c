//! Every zergctl command against a live zergd, with snapshots of what people read. Paths, ids,
//! times and durations are replaced by placeholders; everything else is compared as written.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use zerg_tests::*;

const T: Duration = Duration::from_secs(120);

/// The text of a command's stdout then stderr, with what changes from run to run replaced.
fn shown(out: &std::process::Output) -> String {
    let mut s = String::from_utf8_lossy(&out.stdout).to_string();
    let err = String::from_utf8_lossy(&out.stderr);
    if !err.is_empty() {
        s.push_str("--- stderr\n");
        s.push_str(&err);
    }
    s.push_str(&format!("--- exit {}\n", out.status.code().unwrap_or(-1)));
    s
}

fn settings(repo: &Path) -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path("snapshots");
    s.set_prepend_module_to_snapshot(false);
    let repo = regex_escape(&repo.to_string_lossy());
    s.add_filter(&repo, "[REPO]");
    s.add_filter(r"/tmp/[^\s`'\]]+", "[TMP]");
    s.add_filter(r"\b([a-z]+)-[0-9a-f]{9,12}\b", "$1-[ID]");
    s.add_filter(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "[TIME]");
    s.add_filter(r"\b\d+(ms|s|m\d\ds|h\d\dm)\b", "[DUR]");
    s.add_filter(r"\[\d\d:\d\d:\d\d\]", "[CLOCK]");
    // Which worker ran which task, and so how many each did, depends on timing.
    s.add_filter(r"(attempts \d+) W\d", "$1 W?");
    s.add_filter(r"done \d+ ", "done N ");
    // Sizes on disk vary with git's and the fake agent's files.
    s.add_filter(r"\d+(\.\d)? (B|KiB|MiB|GiB)\b", "[SIZE]");
    s
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .map(|c| {
            if "\\.+*?()|[]{}^$#&-~".contains(c) {
                format!("\\{c}")
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[test]
fn every_zergctl_command_against_a_live_zergd() {
    let repo = TestRepo::new();
    let d = Daemon::start();
    let run = |args: &[&str]| d.ctl_in(&repo.path, args);
    let s = settings(&repo.path);
    s.bind(|| {
        insta::assert_snapshot!("init", shown(&run(&["init"])));
        insta::assert_snapshot!("init_again", shown(&run(&["init"])));

        // A graph with two problems: both named, with the task and field.
        std::fs::create_dir_all(repo.path.join(".gsd/specs/bad")).unwrap();
        std::fs::write(
            repo.path.join(".gsd/specs/bad/task-graph.json"),
            json!({"feature": "bad", "tasks": [{"id": "B-1", "title": "x", "level": 1,
                "dependencies": ["NOPE"],
                "files": {"create": ["/etc/passwd"], "modify": [], "read": []}}]})
            .to_string(),
        )
        .unwrap();
        insta::assert_snapshot!("validate_bad", shown(&run(&["validate", "bad"])));
        insta::assert_snapshot!("rush_bad", shown(&run(&["rush", "bad", "--detach"])));
        insta::assert_snapshot!(
            "rush_workers_out_of_range",
            shown(&run(&["rush", "bad", "-w", "65"]))
        );
        insta::assert_snapshot!("status_unknown", shown(&run(&["status", "nope"])));

        // One task fails for good and blocks its dependents; retry after the "fix".
        repo.write_graph("cli", &graph_12("cli"));
        // One retry: two failed attempts fail the task for good; the attempt after `retry`
        // (the third) succeeds.
        repo.configure(
            &Config::fake_agent()
                .fast_workers()
                .set("workers.retry_attempts", 1),
        );
        let fail = json!([{"op": "exit", "code": 1}]);
        repo.write_script(
            "cli",
            &json!({"default": [{"op": "write_owned"}],
                    "tasks": {"G-L2-001": {"attempts": [fail, fail, [{"op": "write_owned"}]]}}}),
        );
        insta::assert_snapshot!("validate_ok", shown(&run(&["validate", "cli"])));
        insta::assert_snapshot!(
            "rush_detach",
            shown(&run(&["rush", "cli", "-w", "2", "--detach"]))
        );
        let st = d.wait_end(&repo.path, "cli", T);
        assert_eq!(st["state"], "failed", "{st}");
        // Workers are told there is nothing left and exit; the snapshot is of that end state.
        d.wait_for(&repo.path, "cli", T, "every worker done", |s| {
            s["workers"].as_object().is_some_and(|w| {
                w.values()
                    .all(|w| w["status"] == "done" && w["last_exit"] != "")
            })
        });
        insta::assert_snapshot!("status_failed", shown(&run(&["status", "cli"])));
        let list = run(&["list", "--json"]);
        let rushes: Value = serde_json::from_slice(&list.stdout).unwrap();
        assert_eq!(rushes[0]["feature"], "cli");
        insta::assert_snapshot!("list", shown(&run(&["list"])));
        let logs = run(&["logs", "cli", "--tail", "2"]);
        assert!(logs.status.success());
        let text = String::from_utf8_lossy(&logs.stdout);
        // Each worker's last two lines as its log file has them, prefixed with its number.
        for w in 0..2 {
            let file = repo.path.join(format!(".zerg/logs/worker-{w}.log"));
            let kept = std::fs::read_to_string(&file).unwrap();
            let kept: Vec<&str> = kept.lines().collect();
            assert!(kept.len() >= 2, "{}: {kept:?}", file.display());
            let want: Vec<String> = kept[kept.len() - 2..]
                .iter()
                .map(|l| format!("[W{w}] {l}"))
                .collect();
            let shown: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with(&format!("[W{w}] ")))
                .collect();
            assert_eq!(shown, want, "logs --tail 2 of worker {w}:\n{text}");
        }
        assert_eq!(text.lines().count(), 4, "two lines per worker:\n{text}");

        insta::assert_snapshot!("retry", shown(&run(&["retry", "cli"])));
        let st = d.wait_end(&repo.path, "cli", T);
        assert_eq!(st["state"], "complete", "{st}");
        insta::assert_snapshot!("stop_ended", shown(&run(&["stop", "cli"])));

        let comp = run(&["completions", "bash"]);
        assert!(comp.status.success());
        assert!(String::from_utf8_lossy(&comp.stdout).contains("complete -F"));
        let unit = run(&["service", "print"]);
        let unit_text = String::from_utf8_lossy(&unit.stdout).to_string();
        assert!(unit_text.contains("Type=notify"), "{unit_text}");
    });
}

#[test]
fn a_rush_with_an_invalid_config_exits_65_naming_the_file_and_the_key() {
    let repo = TestRepo::new();
    repo.write_graph("bad", &graph_12("bad"));
    repo.write_config_text("workers:\n  stop_grace_seconds: soon\n");
    let d = Daemon::start();
    let out = d.ctl_in(&repo.path, &["rush", "bad", "--workers", "1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(65), "{}", shown(&out));
    assert!(err.contains("config.yaml"), "{err}");
    assert!(err.contains("stop_grace_seconds"), "{err}");
    // Nothing started: no rush, no worker worktree.
    assert!(d.status(&repo.path, "bad").is_none());
    assert!(!repo.path.join(".zerg-worktrees").exists());
}

#[test]
fn validate_fix_relevels_a_graph_from_its_dependencies_and_refuses_a_cycle_by_name() {
    let repo = TestRepo::new();
    let dir = repo.path.join(".gsd/specs/fx");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("task-graph.json");
    let task = |id: &str, level: u32, deps: &[&str], file: &str| {
        json!({"id": id, "title": id, "level": level, "dependencies": deps,
               "files": {"create": [file], "modify": [], "read": []},
               "verification": {"command": "true", "timeout_seconds": 30}})
    };
    // B depends on A at the same level, C sits at level 3 with nothing below it at 2, and D
    // is one level higher than it needs.
    let graph = json!({"feature": "fx", "tasks": [
        task("FX-A", 1, &[], "a.txt"),
        task("FX-B", 1, &["FX-A"], "b.txt"),
        task("FX-C", 3, &[], "c.txt"),
        task("FX-D", 4, &["FX-B"], "d.txt"),
    ]});
    std::fs::write(&path, serde_json::to_vec_pretty(&graph).unwrap()).unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(bin("zergctl"))
            .args(args)
            .current_dir(&repo.path)
            .output()
            .unwrap()
    };
    let before = run(&["validate", "fx"]);
    assert_eq!(before.status.code(), Some(1), "{}", shown(&before));

    let out = run(&["validate", "fx", "--fix"]);
    let said = shown(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    for line in [
        "moved FX-B: level 1 -> 2",
        "moved FX-C: level 3 -> 1",
        "moved FX-D: level 4 -> 3",
        "3 task(s) moved; written",
        "valid (4 tasks, 3 levels",
    ] {
        assert!(said.contains(line), "{line:?} in {said}");
    }
    let fixed: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let got: Vec<(String, u64)> = fixed["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["id"].as_str().unwrap().into(),
                t["level"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("FX-A".into(), 1),
            ("FX-B".into(), 2),
            ("FX-C".into(), 1),
            ("FX-D".into(), 3)
        ]
    );
    // Everything else is as it was.
    assert_eq!(fixed["tasks"][1]["files"], graph["tasks"][1]["files"]);
    let again = run(&["validate", "fx", "--fix"]);
    assert!(
        shown(&again).contains("nothing was written"),
        "{}",
        shown(&again)
    );

    // A cycle: refused by name, the file untouched.
    let cyclic = json!({"feature": "fx", "tasks": [
        task("FX-A", 1, &["FX-B"], "a.txt"),
        task("FX-B", 2, &["FX-A"], "b.txt"),
    ]});
    let bytes = serde_json::to_vec(&cyclic).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    let out = run(&["validate", "fx", "--fix"]);
    let said = shown(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("dependency cycle: FX-A → FX-B → FX-A"),
        "{said}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

#[test]
fn design_gives_the_agent_its_graphs_problems_until_it_is_valid_and_the_graph_then_runs() {
    let repo = TestRepo::new();
    let spec = repo.path.join(".gsd/specs/ds");
    std::fs::create_dir_all(&spec).unwrap();
    std::fs::write(
        spec.join("requirements.md"),
        "# Greeting\n\nA greeting module and its formatter.\n",
    )
    .unwrap();
    let dir = repo.path.parent().unwrap();
    let prompts = dir.join("prompts");
    // A stand-in for the agent CLI: its first graph puts B at A's level though B depends on A,
    // and gives C no verification; given its problems, it writes them right (leaving C one
    // level higher than it needs, for the relevelling).
    let bad = json!({"feature": "ds", "tasks": [
        {"id": "DS-A", "title": "module", "level": 1, "dependencies": [],
         "files": {"create": ["greet/mod.txt"], "modify": [], "read": []},
         "verification": {"command": "test -f greet/mod.txt"}},
        {"id": "DS-B", "title": "formatter", "level": 1, "dependencies": ["DS-A"],
         "files": {"create": ["greet/fmt.txt"], "modify": [], "read": ["greet/"]},
         "verification": {"command": "test -f greet/fmt.txt"}},
        {"id": "DS-C", "title": "docs", "level": 2, "dependencies": ["DS-A"],
         "files": {"create": ["greet/README.txt"], "modify": [], "read": []}}
    ]});
    let mut good = bad.clone();
    good["tasks"][1]["level"] = json!(2);
    good["tasks"][2]["level"] = json!(3);
    good["tasks"][2]["verification"] = json!({"command": "test -f greet/README.txt"});
    std::fs::write(dir.join("bad.json"), bad.to_string()).unwrap();
    std::fs::write(dir.join("good.json"), good.to_string()).unwrap();
    let agent = dir.join("design-agent.sh");
    std::fs::write(
        &agent,
        format!(
            "for a; do p=\"$a\"; done\nprintf '%s\\n=====\\n' \"$p\" >> '{p}'\nmkdir -p .gsd/specs/ds\ncase \"$p\" in\n  *'Problems in the graph'*) cp '{d}/good.json' .gsd/specs/ds/task-graph.json ;;\n  *) cp '{d}/bad.json' .gsd/specs/ds/task-graph.json ;;\nesac\n",
            p = prompts.display(),
            d = dir.display()
        ),
    )
    .unwrap();
    repo.configure(&Config::new().agent_command(&["sh", &agent.to_string_lossy()]));
    let d = Daemon::start();

    let dry = d.ctl_in(&repo.path, &["design", "ds", "--dry-run"]);
    assert_eq!(dry.status.code(), Some(0), "{}", shown(&dry));
    assert!(
        !spec.join("task-graph.json").exists(),
        "--dry-run writes nothing"
    );

    let out = d.ctl_in(&repo.path, &["design", "ds"]);
    let said = shown(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    for line in [
        // B at A's level is relevelled, not given back: only C's missing check is.
        "relevelled DS-B: level 1 -> 2",
        "round 1: 1 problem(s) in the graph; giving them back to the agent",
        "relevelled DS-C: level 3 -> 2",
        "3 tasks (level 1: 1, level 2: 2); 3 files created or modified; longest chain (2 tasks): DS-A → DS-B",
    ] {
        assert!(said.contains(line), "{line:?} in {said}");
    }
    assert!(!said.contains("round 3"), "{said}");
    // The second prompt carried the first graph's problems.
    let asked = std::fs::read_to_string(&prompts).unwrap();
    let second = asked.split("=====\n").nth(3).unwrap_or_default();
    assert!(second.contains("A greeting module"), "{second}");
    assert!(
        !second.contains("not lower than this task's level"),
        "a level a relevel sets is not the agent's problem: {second}"
    );
    assert!(
        second.contains("tasks[2] (DS-C): verification.command: missing"),
        "{second}"
    );
    let written: Value =
        serde_json::from_slice(&std::fs::read(spec.join("task-graph.json")).unwrap()).unwrap();
    assert_eq!(written["tasks"][2]["level"], 2);
    let v = d.ctl_in(&repo.path, &["validate", "ds"]);
    assert_eq!(v.status.code(), Some(0), "{}", shown(&v));
    assert!(
        git(&repo.path, &["worktree", "list"]).lines().count() == 1,
        "the scratch worktree is gone"
    );

    // The designed graph runs.
    repo.configure(&Config::fake_agent().fast_workers());
    git(&repo.path, &["add", ".gsd"]);
    git(&repo.path, &["commit", "-q", "-m", "the designed graph"]);
    let rush = d.ctl_in(&repo.path, &["rush", "ds", "--workers", "2"]);
    assert_eq!(rush.status.code(), Some(0), "{}", shown(&rush));
    let files = repo.files_on("zerg/ds/staging");
    for f in ["greet/mod.txt", "greet/fmt.txt", "greet/README.txt"] {
        assert!(files.iter().any(|x| x == f), "{f} in {files:?}");
    }
}

#[test]
fn design_relevels_a_same_level_dependency_itself_and_succeeds_in_one_round() {
    let repo = TestRepo::new();
    let spec = repo.path.join(".gsd/specs/dl");
    std::fs::create_dir_all(&spec).unwrap();
    std::fs::write(spec.join("requirements.md"), "# Two steps\n").unwrap();
    let dir = repo.path.parent().unwrap();
    // The agent's only fault: B depends on A at A's own level.
    let graph = json!({"feature": "dl", "tasks": [
        {"id": "DL-A", "title": "first", "level": 1, "dependencies": [],
         "files": {"create": ["a.txt"], "modify": [], "read": []},
         "verification": {"command": "test -f a.txt"}},
        {"id": "DL-B", "title": "second", "level": 1, "dependencies": ["DL-A"],
         "files": {"create": ["b.txt"], "modify": [], "read": []},
         "verification": {"command": "test -f b.txt"}}
    ]});
    std::fs::write(dir.join("dl.json"), graph.to_string()).unwrap();
    let runs = dir.join("runs");
    let agent = dir.join("dl-agent.sh");
    std::fs::write(
        &agent,
        format!(
            "echo run >> '{r}'\nmkdir -p .gsd/specs/dl\ncp '{d}/dl.json' .gsd/specs/dl/task-graph.json\n",
            r = runs.display(),
            d = dir.display()
        ),
    )
    .unwrap();
    repo.configure(&Config::new().agent_command(&["sh", &agent.to_string_lossy()]));
    let d = Daemon::start();
    let out = d.ctl_in(&repo.path, &["design", "dl"]);
    let said = shown(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(said.contains("relevelled DL-B: level 1 -> 2"), "{said}");
    assert!(!said.contains("problem(s)"), "{said}");
    assert_eq!(
        std::fs::read_to_string(&runs).unwrap().lines().count(),
        1,
        "one agent round: {said}"
    );
    let written: Value =
        serde_json::from_slice(&std::fs::read(spec.join("task-graph.json")).unwrap()).unwrap();
    assert_eq!(written["tasks"][1]["level"], 2);
}
