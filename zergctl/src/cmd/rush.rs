//! `zergctl rush`: start or resume a rush and follow it until it ends.

use tonic::transport::Channel;
use zerg_proto::v1;
use zerg_proto::v1::control_client::ControlClient;

use crate::{CliError, code, from_status, render};
use zerg_proto::WireName;

/// What to start a rush with.
pub struct Start<'a> {
    /// Repository.
    pub repo: &'a str,
    /// Feature.
    pub feature: &'a str,
    /// Number of workers.
    pub workers: u32,
    /// `subprocess`, `container`, `swarm`, `kubernetes`, or empty for the default.
    pub mode: &'a str,
    /// The rush's budget (USD), if given.
    pub max_usd: Option<f64>,
}

/// Starts a rush and (unless detached) follows it.
pub async fn rush(
    c: &mut ControlClient<Channel>,
    start: Start<'_>,
    detach: bool,
    verbose: bool,
) -> Result<u8, CliError> {
    let Start {
        repo,
        feature,
        workers,
        mode,
        max_usd,
    } = start;
    let r = c
        .rush(v1::RushRequest {
            repo: repo.to_string(),
            feature: feature.to_string(),
            workers,
            mode: mode_arg(mode)? as i32,
            max_usd,
        })
        .await
        .map_err(from_status)?
        .into_inner();
    for w in &r.warnings {
        eprintln!("warning: {w}");
    }
    println!(
        "{} rush {feature} ({}) with {} {} worker(s)",
        if r.resumed { "Resumed" } else { "Started" },
        r.rush_id,
        if r.workers > 0 { r.workers } else { workers },
        r.mode().name()
    );
    if detach {
        println!(
            "Follow it with `zergctl status {feature} --watch`; stop it with `zergctl stop {feature}`."
        );
        return Ok(code::OK);
    }
    follow(c, repo, feature, true, verbose).await
}

/// Follows a rush with progress bars until it ends. Ctrl-C detaches (the rush goes on).
pub(crate) async fn follow(
    c: &mut ControlClient<Channel>,
    repo: &str,
    feature: &str,
    exit_by_outcome: bool,
    verbose: bool,
) -> Result<u8, CliError> {
    let mut stream = c
        .watch(v1::WatchRequest {
            repo: repo.to_string(),
            feature: feature.to_string(),
            deltas: true,
        })
        .await
        .map_err(from_status)?
        .into_inner();
    let mut view = render::Progress::new(verbose);
    // Ages and elapsed times move on between events: redraw the last status every second.
    let mut redraw = tokio::time::interval(std::time::Duration::from_secs(1));
    let mut last: Option<v1::RushStatus> = None;
    loop {
        let next = tokio::select! {
            m = stream.message() => m,
            _ = redraw.tick() => {
                if let Some(st) = &last {
                    view.update(st);
                }
                continue;
            }
            _ = tokio::signal::ctrl_c() => {
                view.finish();
                println!("Detached; the rush goes on. Stop it with `zergctl stop {feature}`.");
                return Ok(code::OK);
            }
        };
        let mut ev = match next {
            Ok(Some(ev)) => ev,
            Ok(None) => {
                view.finish();
                return Err(CliError::new(
                    code::DAEMON_UNREACHABLE,
                    "zergd closed the stream (did it stop?)",
                ));
            }
            Err(s) => {
                view.finish();
                return Err(from_status(s));
            }
        };
        view.event(&ev);
        // The first status is whole; the rest are deltas folded into it.
        if !zerg_proto::watch::apply(&mut last, &mut ev) {
            continue;
        }
        let Some(st) = &last else { continue };
        view.update(st);
        match st.state().name().as_str() {
            "complete" | "failed" | "stopped" => {
                view.finish();
                print!("{}", render::summary(st));
                let ok = st.state() == v1::RushState::Complete;
                return Ok(if ok || !exit_by_outcome {
                    code::OK
                } else {
                    code::FAILED
                });
            }
            "paused" if exit_by_outcome => {
                view.finish();
                print!("{}", render::summary(st));
                return Ok(code::FAILED);
            }
            _ => {}
        }
    }
}

/// The `--mode` flag as the wire has it; an empty one lets zergd choose.
fn mode_arg(mode: &str) -> Result<v1::LaunchMode, CliError> {
    if mode.is_empty() {
        return Ok(v1::LaunchMode::Unspecified);
    }
    v1::LaunchMode::from_name(mode).ok_or_else(|| {
        CliError::new(
            code::USAGE,
            format!("--mode: '{mode}' is not subprocess, container, swarm or kubernetes"),
        )
    })
}
