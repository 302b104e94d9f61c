//! `zergctl land`: take a complete rush's result into the branch it started from, or (`--pr`)
//! push it and open a pull request with `gh`.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{CliError, code, connect, from_status, repo_arg};
use zerg_proto::v1;

/// What `zergctl land` was asked.
#[derive(Debug)]
pub struct LandArgs {
    /// The feature.
    pub feature: String,
    /// Open a pull request instead of moving the base branch here.
    pub pr: bool,
    /// The remote the staging branch is pushed to (`--pr`).
    pub remote: String,
    /// The repository.
    pub repo: Option<PathBuf>,
}

/// Runs `zergctl land`.
pub async fn run(socket: &Path, a: LandArgs) -> Result<u8, CliError> {
    let repo = repo_arg(a.repo)?;
    let gh = if a.pr { Some(gh_ready()?) } else { None };
    let mut c = connect(socket).await?;
    let reply = c
        .land(v1::LandRequest {
            repo: repo.clone(),
            feature: a.feature.clone(),
            gates_only: a.pr,
        })
        .await
        .map_err(from_status)?
        .into_inner();
    for g in &reply.gates {
        println!(
            "gate {}: {}{}",
            g.name,
            if g.passed { "passed" } else { "failed" },
            if g.required { "" } else { " (optional)" }
        );
    }
    let short = |c: &str| c.chars().take(10).collect::<String>();
    let Some(gh) = gh else {
        match v1::LandOutcome::try_from(reply.outcome).unwrap_or_default() {
            v1::LandOutcome::FastForward => println!(
                "Landed {}: {} fast-forwarded to {} ({}).",
                a.feature,
                reply.base_branch,
                short(&reply.commit),
                reply.staging_branch
            ),
            v1::LandOutcome::Merge => println!(
                "Landed {}: {} moved on since the rush started, so {} was merged into it as {}; the quality gates passed on the merge.",
                a.feature,
                reply.base_branch,
                reply.staging_branch,
                short(&reply.commit)
            ),
            v1::LandOutcome::AlreadyLanded => println!(
                "{} already contains {} ({}): nothing to land.",
                reply.base_branch,
                reply.staging_branch,
                short(&reply.commit)
            ),
            _ => println!("{}: nothing moved.", a.feature),
        }
        return Ok(code::OK);
    };
    // The pull request: the staging branch pushed, its tasks, cost and gates in the body.
    let status = c
        .status(v1::StatusRequest {
            repo: repo.clone(),
            feature: a.feature.clone(),
        })
        .await
        .map_err(from_status)?
        .into_inner();
    run_tool(
        Command::new("git").arg("-C").arg(&repo).args([
            "push",
            "-u",
            &a.remote,
            &reply.staging_branch,
        ]),
        &format!("git push {} {}", a.remote, reply.staging_branch),
    )?;
    let body = pr_body(&a.feature, &status, &reply);
    let url = run_tool(
        Command::new(&gh).current_dir(&repo).args([
            "pr",
            "create",
            "--base",
            &reply.base_branch,
            "--head",
            &reply.staging_branch,
            "--title",
            &format!("zerg: {}", a.feature),
            "--body",
            &body,
        ]),
        "gh pr create",
    )?;
    println!(
        "Opened a pull request of {} into {}: {}",
        reply.staging_branch,
        reply.base_branch,
        url.trim()
    );
    Ok(code::OK)
}

/// `gh` on the `PATH` and logged in, or why not.
fn gh_ready() -> Result<PathBuf, CliError> {
    let gh = std::env::var_os("PATH")
        .and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("gh"))
                .find(|f| f.is_file())
        })
        .ok_or_else(|| {
            CliError::new(
                code::FAILED,
                "--pr needs the GitHub CLI, gh, which is not installed (https://cli.github.com); without it, push zerg/<feature>/staging and open the pull request yourself, or land here with `zergctl land <feature>`",
            )
        })?;
    let auth = Command::new(&gh)
        .args(["auth", "status"])
        .output()
        .map_err(|e| CliError::new(code::FAILED, format!("cannot run gh: {e}")))?;
    if !auth.status.success() {
        return Err(CliError::new(
            code::FAILED,
            format!(
                "gh is not logged in (gh auth status: {}); run `gh auth login`, then land again",
                String::from_utf8_lossy(&auth.stderr).trim()
            ),
        ));
    }
    Ok(gh)
}

/// Runs `cmd`, returning its stdout, or an error with its stderr.
fn run_tool(cmd: &mut Command, what: &str) -> Result<String, CliError> {
    let out = cmd
        .output()
        .map_err(|e| CliError::new(code::FAILED, format!("cannot run {what}: {e}")))?;
    if !out.status.success() {
        return Err(CliError::new(
            code::FAILED,
            format!(
                "{what} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).to_string())
}

/// The pull request's description: the rush, each task with its Task-ID, title and cost, the
/// total cost, and the gates that ran on the staging head.
fn pr_body(feature: &str, st: &v1::RushStatus, land: &v1::LandReply) -> String {
    let mut tasks: Vec<(&String, &v1::TaskStatus)> = st.tasks.iter().collect();
    tasks.sort_by(|a, b| (a.1.level, a.0).cmp(&(b.1.level, b.0)));
    let mut b = format!(
        "The result of the zerg rush `{feature}` ({} tasks in {} levels), from `{}`.\n\n",
        tasks.len(),
        st.total_levels,
        land.staging_branch
    );
    b.push_str("| Task-ID | Level | Title | Cost |\n|---|---|---|---|\n");
    for (id, t) in &tasks {
        b.push_str(&format!(
            "| `{id}` | {} | {} | ${:.2} |\n",
            t.level,
            t.title.replace('|', "\\|").replace('\n', " "),
            t.cost_usd
        ));
    }
    b.push_str(&format!("\nAgent cost: ${:.2}.\n\n", st.cost_usd));
    if land.gates.is_empty() {
        b.push_str("No quality gates are configured.\n");
    } else {
        b.push_str(&format!(
            "Quality gates on `{}`:\n\n",
            land.commit.chars().take(10).collect::<String>()
        ));
        for g in &land.gates {
            b.push_str(&format!(
                "- {} `{}`{}\n",
                if g.passed { "passed" } else { "failed" },
                g.name,
                if g.required { "" } else { " (optional)" }
            ));
        }
    }
    b
}
