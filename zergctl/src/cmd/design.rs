//! `zergctl design FEATURE`: the agent CLI writes the feature's task graph from its
//! requirements.
//!
//! The agent runs in a scratch worktree of the repository's `HEAD` (with the feature's spec
//! files copied in, committed or not), once, with a prompt that gives the requirements (and
//! `design.md` when there is one) and the task-graph format. What it writes at
//! `.gsd/specs/FEATURE/task-graph.json` is validated as a rush validates it, plus two rules of
//! a graph worth running: every task has a verification command and owns a file. While there
//! are problems, the agent runs again with the list, up to `design.max_rounds` runs in all.
//! The graph is then relevelled as `zergctl validate --fix` does, and written to the spec
//! directory (or printed, `--dry-run`) with a summary.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::Value;

use crate::{CliError, code};

/// Runs `zergctl design`.
pub async fn run(feature: String, dry_run: bool, repo: Option<PathBuf>) -> Result<u8, CliError> {
    zerg_proto::graph::validate_feature_name(&feature)
        .map_err(|e| CliError::new(code::USAGE, format!("feature: {e}")))?;
    let start = match repo {
        Some(p) => p,
        None => std::env::current_dir()
            .map_err(|e| CliError::new(code::USAGE, format!("current directory: {e}")))?,
    };
    let repo = zerg_git::toplevel(&start).map_err(|e| {
        CliError::new(
            code::DATA,
            format!("{} is not in a git repository: {e}", start.display()),
        )
    })?;
    let spec = repo.join(".gsd/specs").join(&feature);
    let requirements = std::fs::read_to_string(spec.join("requirements.md")).map_err(|e| {
        CliError::new(
            code::NOT_FOUND,
            format!(
                "{}: {e}; write the feature's requirements there first",
                spec.join("requirements.md").display()
            ),
        )
    })?;
    let design = std::fs::read_to_string(spec.join("design.md")).ok();
    let (config, _) =
        zerg_config::Config::load(&repo).map_err(|e| CliError::new(code::DATA, e.to_string()))?;
    let scratch = Scratch::new(&repo, &feature)?;
    let rel = format!(".gsd/specs/{feature}/task-graph.json");
    let log = repo
        .join(".zerg/logs")
        .join(format!("design-{feature}.log"));
    let mut problems: Vec<String> = Vec::new();
    let mut graph: Option<Value> = None;
    let rounds = config.design.max_rounds;
    for round in 1..=rounds {
        let prompt = prompt(&feature, &requirements, design.as_deref(), &problems);
        println!("round {round} of {rounds}: running the agent");
        run_agent(&config.agent, &prompt, &scratch.dir, &feature, &log, round).await?;
        let written = scratch.dir.join(&rel);
        (graph, problems) = check(&written, &feature);
        if problems.is_empty() {
            break;
        }
        println!(
            "round {round}: {} problem(s) in the graph{}",
            problems.len(),
            if round < rounds {
                "; giving them back to the agent"
            } else {
                ""
            }
        );
        for p in &problems {
            println!("  {p}");
        }
    }
    let Some(mut graph) = graph.filter(|_| problems.is_empty()) else {
        println!(
            "no valid graph after {rounds} round(s) (design.max_rounds); nothing was written. The agent's output is in {}",
            log.display()
        );
        return Ok(code::FAILED);
    };
    let moved = zerg_proto::graph::relevel(&mut graph).map_err(|errors| {
        CliError::new(code::FAILED, format!("relevelling: {}", errors.join("; ")))
    })?;
    for m in &moved {
        println!(
            "relevelled {}: level {} -> {}",
            m.id,
            m.from.map_or_else(|| "none".to_string(), |l| l.to_string()),
            m.to
        );
    }
    let mut text = serde_json::to_vec_pretty(&graph)
        .map_err(|e| CliError::new(code::INTERNAL, e.to_string()))?;
    text.push(b'\n');
    if dry_run {
        println!("{}", String::from_utf8_lossy(&text).trim_end());
    } else {
        let path = spec.join("task-graph.json");
        crate::cmd::validate::write_atomically(&path, &text).map_err(|e| {
            CliError::new(code::DATA, format!("cannot write {}: {e}", path.display()))
        })?;
        println!("wrote {}", path.display());
    }
    print!("{}", summary(&graph));
    Ok(code::OK)
}

/// A detached worktree of the repository's `HEAD` in a temporary directory, with the
/// feature's spec files copied in and no task graph; removed when dropped.
struct Scratch {
    repo: PathBuf,
    dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Scratch {
    fn new(repo: &Path, feature: &str) -> Result<Scratch, CliError> {
        let tmp = tempfile::Builder::new()
            .prefix("zerg-design-")
            .tempdir()
            .map_err(|e| CliError::new(code::INTERNAL, format!("temporary directory: {e}")))?;
        let dir = tmp.path().join("worktree");
        zerg_git::cli::git(
            repo,
            &[
                "worktree",
                "add",
                "--detach",
                "-q",
                &dir.to_string_lossy(),
                "HEAD",
            ],
        )
        .map_err(|e| {
            CliError::new(
                code::DATA,
                format!(
                    "cannot make a scratch worktree of HEAD (the repository needs a commit): {e}"
                ),
            )
        })?;
        let scratch = Scratch {
            repo: repo.to_path_buf(),
            dir,
            _tmp: tmp,
        };
        let from = repo.join(".gsd/specs").join(feature);
        let to = scratch.dir.join(".gsd/specs").join(feature);
        std::fs::create_dir_all(&to).map_err(|e| CliError::new(code::INTERNAL, e.to_string()))?;
        for name in ["requirements.md", "design.md"] {
            if from.join(name).is_file() {
                std::fs::copy(from.join(name), to.join(name))
                    .map_err(|e| CliError::new(code::INTERNAL, e.to_string()))?;
            }
        }
        let _ = std::fs::remove_file(to.join("task-graph.json"));
        Ok(scratch)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = zerg_git::cli::remove_worktree(&self.repo, &self.dir, None);
    }
}

/// The agent's prompt: the requirements, the design when there is one, the format, and the
/// problems of its last graph.
fn prompt(feature: &str, requirements: &str, design: Option<&str>, problems: &[String]) -> String {
    let mut p = format!(
        "You are planning the work of feature `{feature}` for several coding agents that will run in parallel, each in its own git worktree. Do not implement anything. Read the requirements below and the repository, then write the task graph to `.gsd/specs/{feature}/task-graph.json` and nothing else.\n\n## Requirements\n\n{}\n",
        requirements.trim()
    );
    if let Some(d) = design {
        p.push_str(&format!("\n## Design\n\n{}\n", d.trim()));
    }
    p.push_str(&format!(
        r#"
## The task-graph format

One JSON object:

{{"feature": "{feature}", "tasks": [
  {{"id": "AUTH-L1-001", "title": "Add the user model", "description": "What to do, precisely.",
    "level": 1, "dependencies": [],
    "files": {{"create": ["src/models/user.py"], "modify": [], "read": ["src/models/"]}},
    "verification": {{"command": "python -m pytest -q tests/test_user.py", "timeout_seconds": 120}}}}
]}}

Rules:
- Every task has a unique `id` (letters, digits, `-`, `_`), a `title`, a `description` and a `level`.
- A task's `dependencies` are ids of tasks at lower levels; levels start at 1 and have no gaps.
- Tasks of the same level run at the same time: within a level, no two tasks may create or
  modify the same file. Paths are relative to the repository root, without `..`.
- Every task creates or modifies at least one file, and has a `verification.command` that
  exits 0 only when the task is done (its tests, a build, a check).
- `files.read` lists what the task needs to read (a directory ends with `/`).
- Prefer small tasks that can run in parallel; put shared foundations at level 1.
"#
    ));
    if !problems.is_empty() {
        p.push_str(&format!(
            "\n## Problems in the graph you wrote\n\nThe file `.gsd/specs/{feature}/task-graph.json` you wrote has these problems. Fix every one, keep what is right, and write the whole file again:\n\n"
        ));
        for x in problems {
            p.push_str(&format!("- {x}\n"));
        }
    }
    p
}

/// Runs the agent CLI (`agent.command` with the prompt appended) in `dir`, its output appended
/// to `log`, within `agent.timeout_seconds`.
async fn run_agent(
    agent: &zerg_config::AgentConfig,
    prompt: &str,
    dir: &Path,
    feature: &str,
    log: &Path,
    round: u32,
) -> Result<(), CliError> {
    let argv = agent.effective_command();
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| CliError::new(code::DATA, "agent.command is empty"))?;
    if let Some(parent) = log.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| CliError::new(code::INTERNAL, format!("{}: {e}", log.display())))?;
    use std::io::Write;
    let _ = writeln!(out, "=== zergctl design {feature}: round {round}");
    let err = out
        .try_clone()
        .map_err(|e| CliError::new(code::INTERNAL, e.to_string()))?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .arg(prompt)
        .current_dir(dir)
        .env("ZERG_FEATURE", feature)
        .env("ZERG_SPEC_DIR", dir.join(".gsd/specs").join(feature))
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            CliError::new(
                code::FAILED,
                format!("cannot run the agent CLI {program:?} (agent.command): {e}"),
            )
        })?;
    match tokio::time::timeout(agent.timeout_seconds, child.wait()).await {
        Ok(Ok(st)) if st.success() => Ok(()),
        Ok(Ok(st)) => Err(CliError::new(
            code::FAILED,
            format!(
                "the agent CLI ended with {st} in round {round}; its output is in {}",
                log.display()
            ),
        )),
        Ok(Err(e)) => Err(CliError::new(code::FAILED, e.to_string())),
        Err(_) => Err(CliError::new(
            code::FAILED,
            format!(
                "the agent CLI ran past agent.timeout_seconds ({} s) in round {round} and was stopped",
                agent.timeout_seconds.as_secs()
            ),
        )),
    }
}

/// The graph at `path` and its problems: none written, JSON that does not parse, what the
/// validation of a rush refuses, a task without a verification command or without a file.
fn check(path: &Path, feature: &str) -> (Option<Value>, Vec<String>) {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(_) => {
            return (
                None,
                vec![format!(
                    "no .gsd/specs/{feature}/task-graph.json was written"
                )],
            );
        }
    };
    let mut value: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => {
            return (
                None,
                vec![format!(
                    "the file is not JSON: line {}, column {}: {e}",
                    e.line(),
                    e.column()
                )],
            );
        }
    };
    // What a relevel fixes (a task at a level its dependencies do not allow) is fixed here, as
    // `zergctl validate --fix` would, and never costs the agent a round; the agent hears only
    // of what is left. A graph a relevel refuses (a cycle, a missing dependency) is checked as
    // it is.
    let mut relevelled = value.clone();
    let bytes = match zerg_proto::graph::relevel(&mut relevelled) {
        Ok(moved) if !moved.is_empty() => {
            for m in &moved {
                println!(
                    "relevelled {}: level {} -> {}",
                    m.id,
                    m.from.map_or_else(|| "none".to_string(), |l| l.to_string()),
                    m.to
                );
            }
            value = relevelled;
            serde_json::to_vec(&value).unwrap_or(bytes)
        }
        _ => bytes,
    };
    let mut problems = Vec::new();
    match zerg_proto::graph::parse(&bytes, path) {
        Ok(_) => {}
        Err(zerg_proto::graph::GraphError::Invalid { errors, .. }) => {
            problems.extend(errors.iter().map(ToString::to_string));
        }
        Err(e) => problems.push(e.to_string()),
    }
    if value["feature"].as_str() != Some(feature) {
        problems.push(format!("feature: must be \"{feature}\""));
    }
    for (i, t) in value["tasks"].as_array().into_iter().flatten().enumerate() {
        let who = format!("tasks[{i}] ({})", t["id"].as_str().unwrap_or("?"));
        if t["verification"]["command"]
            .as_str()
            .is_none_or(|c| c.trim().is_empty())
        {
            problems.push(format!(
                "{who}: verification.command: missing; every task needs a command that exits 0 only when it is done"
            ));
        }
        let owns = |k: &str| t["files"][k].as_array().is_some_and(|a| !a.is_empty());
        if !owns("create") && !owns("modify") {
            problems.push(format!(
                "{who}: files: creates and modifies nothing; every task must own the files it writes"
            ));
        }
    }
    (Some(value), problems)
}

/// Tasks per level, the files the tasks write, and the longest chain of dependencies.
fn summary(graph: &Value) -> String {
    let tasks: Vec<&Value> = graph["tasks"].as_array().into_iter().flatten().collect();
    let mut per_level = std::collections::BTreeMap::<u64, usize>::new();
    let mut files = std::collections::BTreeSet::<&str>::new();
    for t in &tasks {
        *per_level
            .entry(t["level"].as_u64().unwrap_or(0))
            .or_default() += 1;
        for k in ["create", "modify"] {
            for f in t["files"][k].as_array().into_iter().flatten() {
                if let Some(f) = f.as_str() {
                    files.insert(f);
                }
            }
        }
    }
    // The longest chain: tasks in level order, each one after its longest dependency.
    let mut order: Vec<usize> = (0..tasks.len()).collect();
    order.sort_by_key(|&i| tasks[i]["level"].as_u64().unwrap_or(0));
    let index: std::collections::HashMap<&str, usize> = tasks
        .iter()
        .enumerate()
        .filter_map(|(i, t)| t["id"].as_str().map(|id| (id, i)))
        .collect();
    let mut length = vec![1usize; tasks.len()];
    let mut before: Vec<Option<usize>> = vec![None; tasks.len()];
    for &i in &order {
        for d in tasks[i]["dependencies"].as_array().into_iter().flatten() {
            if let Some(&j) = d.as_str().and_then(|d| index.get(d))
                && length[j] + 1 > length[i]
            {
                length[i] = length[j] + 1;
                before[i] = Some(j);
            }
        }
    }
    let mut chain = Vec::new();
    // The first of the longest, in the graph's order.
    let mut at = (0..tasks.len()).rev().max_by_key(|&i| length[i]);
    while let Some(i) = at {
        chain.push(tasks[i]["id"].as_str().unwrap_or("?"));
        at = before[i];
    }
    chain.reverse();
    let levels: Vec<String> = per_level
        .iter()
        .map(|(l, n)| format!("level {l}: {n}"))
        .collect();
    format!(
        "{} tasks ({}); {} files created or modified; longest chain ({} tasks): {}\n",
        tasks.len(),
        levels.join(", "),
        files.len(),
        chain.len(),
        chain.join(" → ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_summary_counts_levels_and_files_and_follows_the_longest_chain() {
        let g = json!({"feature": "f", "tasks": [
            {"id": "A", "level": 1, "files": {"create": ["a"]}},
            {"id": "B", "level": 1, "files": {"create": ["b"], "modify": ["shared"]}},
            {"id": "C", "level": 2, "dependencies": ["A"], "files": {"modify": ["shared"]}},
            {"id": "D", "level": 3, "dependencies": ["C", "B"], "files": {"create": ["d"]}}
        ]});
        assert_eq!(
            summary(&g),
            "4 tasks (level 1: 2, level 2: 1, level 3: 1); 4 files created or modified; longest chain (3 tasks): A → C → D\n"
        );
    }

    #[test]
    fn problems_name_the_task_and_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("task-graph.json");
        assert_eq!(
            check(&path, "f").1,
            vec!["no .gsd/specs/f/task-graph.json was written"]
        );
        std::fs::write(&path, "{\"feature\": \"f\", \"tasks\": [").unwrap();
        assert!(check(&path, "f").1[0].starts_with("the file is not JSON: line 1"));
        std::fs::write(
            &path,
            json!({"feature": "f", "tasks": [
                {"id": "A", "title": "a", "level": 1, "files": {"create": ["a"]}}
            ]})
            .to_string(),
        )
        .unwrap();
        let problems = check(&path, "f").1;
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("tasks[0] (A): verification.command: missing"));
    }
}
