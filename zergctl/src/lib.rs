//! zergctl, the command-line client of zergd.
//!
//! Every command except `validate`, `demo`, `image` and `service` talks to a running zergd over
//! its Unix socket (`--socket`, `ZERG_SOCKET`, or `$XDG_RUNTIME_DIR/zerg/zergd.sock`). Output
//! for people goes to stdout; `--json` gives machine-readable output. Exit codes are listed in
//! [`code`].

mod cmd;
mod demo;
pub mod image;
pub mod json;
mod render;
mod service;

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};
use tonic::transport::Channel;
use zerg_proto::v1::control_client::ControlClient;

/// zergctl exit codes.
pub mod code {
    /// The command succeeded (for `rush`: every task completed).
    pub const OK: u8 = 0;
    /// The rush failed, was stopped, or a graph is invalid.
    pub const FAILED: u8 = 1;
    /// Bad usage (sysexits `EX_USAGE`).
    pub const USAGE: u8 = 64;
    /// Bad input data, e.g. an unreadable task graph (`EX_DATAERR`).
    pub const DATA: u8 = 65;
    /// The rush or task was not found (`EX_NOINPUT`).
    pub const NOT_FOUND: u8 = 66;
    /// zergd is not running or not reachable (`EX_UNAVAILABLE`).
    pub const DAEMON_UNREACHABLE: u8 = 69;
    /// Unexpected internal error (`EX_SOFTWARE`).
    pub const INTERNAL: u8 = 70;
}

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "zergctl",
    version,
    about = "Run a feature's task graph across many coding-agent workers"
)]
pub struct Cli {
    /// zergd's control socket [default: $XDG_RUNTIME_DIR/zerg/zergd.sock].
    #[arg(long, global = true, env = "ZERG_SOCKET")]
    pub socket: Option<PathBuf>,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// A budget in USD: a finite number above 0.
fn budget_arg(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("{s:?} is not an amount in USD above 0")),
    }
}

/// A duration such as `30d`, `12h` or `90s`.
fn duration_arg(s: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration like 30d or 12h: {e}"))
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start (or resume) a rush and follow it until it ends.
    Rush {
        /// Feature name (`.gsd/specs/<FEATURE>/task-graph.json`).
        feature: String,
        /// Number of workers.
        #[arg(short, long, default_value_t = 5)]
        workers: u32,
        /// Where workers run [default: subprocess, or the mode of the rush being resumed].
        #[arg(short, long, value_parser = ["subprocess", "container", "swarm", "kubernetes"])]
        mode: Option<String>,
        /// Repository [default: the current directory].
        #[arg(long)]
        repo: Option<PathBuf>,
        /// Return once the rush is accepted instead of following it.
        #[arg(long)]
        detach: bool,
        /// While following, print every event (claims, starts, completions), not only the ones
        /// that need attention.
        #[arg(short, long)]
        verbose: bool,
        /// Budget in USD: once the agent's reported cost reaches it, no new task starts and
        /// the rush pauses [default: `budget.max_usd` of the config, or a resumed rush's own].
        #[arg(long, value_parser = budget_arg)]
        max_usd: Option<f64>,
    },
    /// Show a rush's status.
    Status {
        /// Feature [default: the most recent rush in the repository].
        feature: Option<String>,
        /// Repository [default: the current directory].
        #[arg(long)]
        repo: Option<PathBuf>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// Keep showing the status until the rush ends.
        #[arg(short, long)]
        watch: bool,
        /// With `--watch`, print every event, not only the ones that need attention.
        #[arg(short, long)]
        verbose: bool,
    },
    /// List every rush zergd knows.
    List {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Open the web dashboard (zergd --http): prints, or with --open opens, an address with a
    /// one-time login code that the page trades for a session cookie.
    Dashboard {
        /// Open it in the desktop's browser (xdg-open, or open on macOS) as well.
        #[arg(long)]
        open: bool,
    },
    /// Stop a rush: SIGTERM to every worker's process group, SIGKILL after the grace period.
    Stop {
        /// Feature.
        feature: String,
        /// Kill at once, without a grace period.
        #[arg(long)]
        force: bool,
        /// Repository [default: the current directory].
        #[arg(long)]
        repo: Option<PathBuf>,
    },
    /// Take a complete rush's staging branch into the branch it started from: a fast-forward,
    /// or a merge commit on which the quality gates run again. Refused while your checkout has
    /// uncommitted changes in files it would change.
    Land {
        /// Feature.
        feature: String,
        /// Instead, push the staging branch and open a pull request with `gh` (its body lists
        /// the tasks, their Task-IDs, cost and the gates run on the staging head).
        #[arg(long)]
        pr: bool,
        /// The remote `--pr` pushes to.
        #[arg(long, default_value = "origin")]
        remote: String,
        /// Repository [default: the current directory].
        #[arg(long)]
        repo: Option<PathBuf>,
    },
    /// Requeue failed or blocked tasks and resume the rush.
    Retry {
        /// Feature.
        feature: String,
        /// Tasks to requeue [default: every failed, blocked or waiting-to-retry task].
        tasks: Vec<String>,
        /// Also reset the attempt and crash counters.
        #[arg(long)]
        reset: bool,
        /// Repository [default: the current directory].
        #[arg(long)]
        repo: Option<PathBuf>,
        /// A new budget in USD for the rush (a rush paused at its budget resumes only above it).
        #[arg(long, value_parser = budget_arg)]
        max_usd: Option<f64>,
        /// A note for each retried task (with none named, each failed one): its next attempt's
        /// prompt carries it.
        #[arg(long)]
        note: Option<String>,
    },
    /// Add a note to a task: every later attempt's prompt carries it.
    Note {
        /// Feature.
        feature: String,
        /// Task id.
        task: String,
        /// The note (plain text, at most 4 KiB).
        text: String,
        /// Stop the running attempt now (not counted) so the next one starts with the note; a
        /// waiting retry comes forward, a failed task is retried.
        #[arg(long)]
        restart: bool,
        /// Repository [default: the current directory].
        #[arg(long)]
        repo: Option<PathBuf>,
    },
    /// Show worker logs.
    Logs {
        /// Feature.
        feature: String,
        /// Only this worker.
        #[arg(short, long)]
        worker: Option<u32>,
        /// Lines per worker.
        #[arg(short = 'n', long, default_value_t = 100)]
        tail: u32,
        /// Keep printing new lines.
        #[arg(short, long)]
        follow: bool,
        /// Repository [default: the current directory].
        #[arg(long)]
        repo: Option<PathBuf>,
    },
    /// Remove what ended rushes of the repository left on disk: state, journal, events, spec
    /// snapshot, logs, worktrees without uncommitted changes and worker branches. Running and
    /// paused rushes are never touched; what is kept is listed with why.
    Prune {
        /// Only rushes that ended at least this long ago (`30d`, `12h`, `0s`).
        #[arg(long, value_parser = duration_arg, default_value = "0s")]
        older_than: std::time::Duration,
        /// Only this feature's rush.
        #[arg(long)]
        feature: Option<String>,
        /// Say what would be removed, and remove nothing.
        #[arg(long)]
        dry_run: bool,
        /// Also delete the staging branch `zerg/<feature>/staging` (the rush's result).
        #[arg(long)]
        branches: bool,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// Repository [default: the current directory].
        #[arg(long)]
        repo: Option<PathBuf>,
    },
    /// Have the agent CLI write a feature's task graph from `.gsd/specs/FEATURE/requirements.md`
    /// (and `design.md`): validated, given back to the agent with its problems until it is
    /// valid (`design.max_rounds`), relevelled, then written to the spec directory.
    Design {
        /// Feature.
        feature: String,
        /// Print the graph instead of writing it.
        #[arg(long)]
        dry_run: bool,
        /// Repository [default: the current directory].
        #[arg(long)]
        repo: Option<PathBuf>,
    },
    /// Check a task graph offline and list every problem (exit 0 valid, 1 invalid, 65 unreadable).
    Validate {
        /// A task-graph.json path, or a feature name in the current repository.
        target: String,
        /// First set each task's level to the smallest its dependencies allow (keeping ids,
        /// the tasks' order and every other field), write the graph back, and print what moved.
        #[arg(long)]
        fix: bool,
    },
    /// Prepare a repository: a commented `.zerg/config.yaml` with every key at its default,
    /// `.gsd/specs/`, and `.gitignore` entries for zerg's working files. Never overwrites.
    Init {
        /// Repository [default: the current directory].
        #[arg(long)]
        repo: Option<PathBuf>,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish or powershell) to stdout.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Run a demo rush in a scratch repository with a scripted agent (no API key, no daemon).
    Demo {
        /// Number of workers.
        #[arg(short, long, default_value_t = 3)]
        workers: u32,
        /// Keep the scratch repository and print its path.
        #[arg(long)]
        keep: bool,
    },
    /// Build the `zerg-worker` container image.
    Image {
        /// What to do with the image.
        #[command(subcommand)]
        command: ImageCommand,
    },
    /// Install, remove or print zergd's user service (systemd on Linux, launchd on macOS).
    Service {
        /// What to do [default: install].
        #[command(subcommand)]
        action: Option<service::Action>,
        /// Only print the unit file (the same as `service print`).
        #[arg(long)]
        print: bool,
    },
    /// Print the repository symbol map of HEAD (or part of it), or with `--task` the
    /// `## Relevant Symbols` section a task's prompt gets. Offline: no zergd needed.
    Symbols {
        /// Files or directories to show [default: every indexed file].
        paths: Vec<String>,
        /// Print the section of task TASK_ID of FEATURE, from the rush's staging branch if it
        /// exists, else from HEAD.
        #[arg(long, num_args = 2, value_names = ["FEATURE", "TASK_ID"], conflicts_with = "paths")]
        task: Option<Vec<String>>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
        /// Repository [default: the current directory].
        #[arg(long)]
        repo: Option<PathBuf>,
    },
}

/// `zergctl image` subcommands.
#[derive(Debug, Subcommand)]
pub enum ImageCommand {
    /// Build the worker image: from docker/Dockerfile (needs a registry), or with `--offline`
    /// from a root filesystem assembled from this machine's binaries (no registry; cached).
    Build {
        /// Build without any registry.
        #[arg(long)]
        offline: bool,
        /// Image tag.
        #[arg(long, default_value = image::DEFAULT_TAG)]
        tag: String,
        /// The zerg-worker-agent binary to put in the image [default: next to zergctl].
        #[arg(long)]
        agent: Option<PathBuf>,
        /// Extra binaries to put in /usr/local/bin (offline builds), e.g. an agent CLI.
        #[arg(long = "with")]
        with: Vec<PathBuf>,
        /// Layer the worker onto IMAGE, an image on this machine with your project's tools (no
        /// registry): adds the agent, the `worker` user (uid/gid 10001), and checks for sh and git.
        #[arg(long, value_name = "IMAGE", conflicts_with = "offline")]
        from: Option<String>,
        /// Like --from, with the base `.devcontainer/devcontainer.json` names (`image`, or
        /// `build.dockerfile` built first) in the current directory's repository.
        #[arg(long, conflicts_with_all = ["offline", "from"])]
        devcontainer: bool,
    },
}

/// A failed command: a message for the user and an exit code.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CliError {
    /// What to tell the user.
    pub message: String,
    /// Exit code.
    pub code: u8,
}

impl CliError {
    /// An error with a code.
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code,
        }
    }
}

/// Maps an RPC error to a user message and exit code.
pub fn from_status(s: tonic::Status) -> CliError {
    let code = match s.code() {
        tonic::Code::NotFound => code::NOT_FOUND,
        tonic::Code::InvalidArgument => code::DATA,
        tonic::Code::Unavailable => code::DAEMON_UNREACHABLE,
        tonic::Code::AlreadyExists | tonic::Code::FailedPrecondition => code::FAILED,
        _ => code::INTERNAL,
    };
    CliError::new(code, s.message().to_string())
}

/// Connects to zergd, or explains how to start it.
pub async fn connect(socket: &Path) -> Result<ControlClient<Channel>, CliError> {
    match zerg_proto::transport::connect(socket).await {
        Ok(ch) => Ok(ControlClient::new(ch)),
        Err(e) => Err(CliError::new(
            code::DAEMON_UNREACHABLE,
            format!(
                "zergd is not running (cannot connect to {}: {}).\nStart it with `zergd &`, or install it as a user service with `zergctl service` and then `systemctl --user start zergd`.",
                socket.display(),
                std::error::Error::source(&e)
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| e.to_string())
            ),
        )),
    }
}

/// Runs git in `dir` (scrubbed, no prompts) and returns trimmed stdout, or stderr as the error.
pub(crate) fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = zerg_proto::contract::scrubbed_command("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

pub(crate) fn repo_arg(repo: Option<PathBuf>) -> Result<String, CliError> {
    let p = match repo {
        Some(p) => p,
        None => std::env::current_dir().map_err(|e| {
            CliError::new(
                code::USAGE,
                format!("cannot read the current directory: {e}"),
            )
        })?,
    };
    let abs = std::fs::canonicalize(&p)
        .map_err(|e| CliError::new(code::USAGE, format!("--repo {}: {e}", p.display())))?;
    Ok(abs.to_string_lossy().to_string())
}

/// Runs a parsed command line; returns the exit code.
pub async fn run(cli: Cli) -> Result<u8, CliError> {
    let socket = zerg_proto::transport::resolve_socket(cli.socket.as_deref());
    match cli.command {
        Command::Validate { target, fix } => cmd::validate::validate(&target, fix),
        Command::Design {
            feature,
            dry_run,
            repo,
        } => cmd::design::run(feature, dry_run, repo).await,
        Command::Init { repo } => cmd::init::run(repo),
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "zergctl", &mut std::io::stdout());
            Ok(code::OK)
        }
        Command::Demo { workers, keep } => demo::run(workers, keep).await,
        Command::Service { action, print } => service::run(if print {
            service::Action::Print
        } else {
            action.unwrap_or(service::Action::Install)
        }),
        Command::Image {
            command:
                ImageCommand::Build {
                    offline,
                    tag,
                    agent,
                    with,
                    from,
                    devcontainer,
                },
        } => {
            let opts = image::BuildOptions {
                offline,
                tag: tag.clone(),
                agent,
                with,
                from,
                devcontainer: if devcontainer {
                    Some(PathBuf::from(repo_arg(None)?))
                } else {
                    None
                },
            };
            let id = image::build(&opts)
                .await
                .map_err(|e| CliError::new(code::FAILED, e.to_string()))?;
            println!("Built {tag} ({id})");
            Ok(code::OK)
        }
        Command::Rush {
            feature,
            workers,
            mode,
            repo,
            detach,
            verbose,
            max_usd,
        } => {
            let repo = repo_arg(repo)?;
            let mut c = connect(&socket).await?;
            let start = cmd::rush::Start {
                repo: &repo,
                feature: &feature,
                workers,
                mode: mode.as_deref().unwrap_or(""),
                max_usd,
            };
            cmd::rush::rush(&mut c, start, detach, verbose).await
        }
        Command::Status {
            feature,
            repo,
            json,
            watch,
            verbose,
        } => cmd::status::run(&socket, feature, repo, json, watch, verbose).await,
        Command::List { json } => cmd::list::run(&socket, json).await,
        Command::Dashboard { open } => cmd::dashboard::run(&socket, open).await,
        Command::Stop {
            feature,
            force,
            repo,
        } => cmd::stop::run(&socket, feature, force, repo).await,
        Command::Land {
            feature,
            pr,
            remote,
            repo,
        } => {
            let args = cmd::land::LandArgs {
                feature,
                pr,
                remote,
                repo,
            };
            cmd::land::run(&socket, args).await
        }
        Command::Retry {
            feature,
            tasks,
            reset,
            repo,
            max_usd,
            note,
        } => {
            let retry = cmd::retry::Retry {
                feature,
                tasks,
                reset,
                max_usd,
                note,
            };
            cmd::retry::run(&socket, retry, repo).await
        }
        Command::Note {
            feature,
            task,
            text,
            restart,
            repo,
        } => cmd::retry::note(&socket, feature, task, text, restart, repo).await,
        Command::Logs {
            feature,
            worker,
            tail,
            follow,
            repo,
        } => cmd::logs::run(&socket, feature, worker, tail, follow, repo).await,
        Command::Prune {
            older_than,
            feature,
            dry_run,
            branches,
            json,
            repo,
        } => {
            let req = zerg_proto::v1::PruneRequest {
                repo: repo_arg(repo)?,
                feature: feature.unwrap_or_default(),
                older_than_seconds: older_than.as_secs(),
                dry_run,
                branches,
            };
            cmd::prune::run(&socket, req, json).await
        }
        Command::Symbols {
            paths,
            task,
            json,
            repo,
        } => cmd::symbols::run(paths, task, json, repo),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// What the README's command reference lacks of `cli`: each subcommand as
    /// `` `zergctl NAME``, each of its flags in its own row of the command table (or its parent
    /// command's, where it has no row of its own), the short form written beside the long one
    /// (`` `-w`, `--workers``), and each global flag.
    fn undocumented(cli: &clap::Command, readme: &str) -> Vec<String> {
        fn row<'r>(readme: &'r str, name: &str) -> Option<&'r str> {
            let start = format!("| `zergctl{name}");
            readme.lines().find(|l| {
                l.strip_prefix(&start)
                    .is_some_and(|rest| rest.starts_with([' ', '`']))
            })
        }
        fn walk(
            cmd: &clap::Command,
            path: &str,
            parent_row: Option<&str>,
            readme: &str,
            missing: &mut Vec<String>,
        ) {
            for sub in cmd.get_subcommands() {
                let name = format!("{path} {}", sub.get_name());
                if !readme.contains(&format!("`zergctl{name}")) {
                    missing.push(format!("command `zergctl{name}`"));
                }
                let own = row(readme, &name).or(parent_row);
                for a in sub.get_arguments() {
                    if a.is_hide_set() || a.get_id() == "help" || a.get_id() == "version" {
                        continue;
                    }
                    let want = match (a.get_short(), a.get_long()) {
                        (Some(short), Some(long)) => format!("`-{short}`, `--{long}"),
                        (None, Some(long)) => format!("`--{long}"),
                        (Some(short), None) => format!("`-{short}`"),
                        (None, None) => continue,
                    };
                    if !own.is_some_and(|r| r.contains(&want)) {
                        missing.push(format!("zergctl{name} {want}"));
                    }
                }
                walk(sub, &name, own, readme, missing);
            }
        }
        let mut missing = Vec::new();
        walk(cli, "", None, readme, &mut missing);
        for a in cli.get_arguments() {
            if let Some(long) = a.get_long()
                && a.get_id() != "help"
                && a.get_id() != "version"
                && !readme.contains(&format!("`--{long}"))
            {
                missing.push(format!("global --{long}"));
            }
        }
        missing
    }

    /// Every subcommand and every flag `--help` shows is in the README's command reference,
    /// in its command's row, with its short form where it has one.
    #[test]
    fn every_command_and_flag_is_documented_in_the_readme() {
        let missing = undocumented(&Cli::command(), include_str!("../../README.md"));
        assert!(missing.is_empty(), "missing from README.md: {missing:#?}");
    }

    /// One `` `-w` `` does not document three flags: each short form is checked beside its
    /// long one, in its own command's row.
    #[test]
    fn a_short_flag_documented_for_one_command_does_not_count_for_another() {
        let cli = clap::Command::new("zergctl")
            .subcommand(
                clap::Command::new("rush")
                    .arg(clap::Arg::new("workers").short('w').long("workers")),
            )
            .subcommand(
                clap::Command::new("logs").arg(clap::Arg::new("worker").short('w').long("worker")),
            )
            .subcommand(
                clap::Command::new("status").arg(
                    clap::Arg::new("watch")
                        .short('w')
                        .long("watch")
                        .action(clap::ArgAction::SetTrue),
                ),
            );
        let readme = "| `zergctl rush` | `-w`, `--workers N`: workers. |\n\
                      | `zergctl logs` | `--worker N`: one worker. |\n\
                      | `zergctl status` | `-w`: follow. `--watch`: follow. |\n";
        assert_eq!(
            undocumented(&cli, readme),
            [
                "zergctl logs `-w`, `--worker",
                "zergctl status `-w`, `--watch"
            ]
        );
    }
}
