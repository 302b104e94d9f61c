//! The zergd binary: parses flags, sets up logging and runs [`zergd::run`].

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// zerg daemon: runs task graphs across coding-agent workers.
#[derive(Debug, Parser)]
#[command(name = "zergd", version, about)]
struct Args {
    /// Control socket path [default: $XDG_RUNTIME_DIR/zerg/zergd.sock].
    #[arg(long, env = "ZERG_SOCKET")]
    socket: Option<PathBuf>,
    /// Directory for zergd's own state [default: $XDG_STATE_HOME/zerg].
    #[arg(long, env = "ZERG_STATE_HOME")]
    state_dir: Option<PathBuf>,
    /// The zerg-worker-agent binary [default: next to zergd, else on PATH].
    #[arg(long, env = "ZERG_WORKER_AGENT_BIN")]
    agent_bin: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ZERG_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let opts = zergd::Options {
        socket: zerg_proto::transport::resolve_socket(args.socket.as_deref()),
        state_dir: args.state_dir.unwrap_or_else(zergd::default_state_dir),
        agent_bin: args.agent_bin.unwrap_or_else(zergd::default_agent_bin),
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("zergd: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(zergd::run(opts, zergd::shutdown_signal())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let mut msg = format!("zergd: {e}");
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(&format!(": {s}"));
                src = s.source();
            }
            eprintln!("{msg}");
            ExitCode::FAILURE
        }
    }
}
