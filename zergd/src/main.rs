//! The zergd binary: parses flags, sets up logging and runs [`zergd::run`].

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

/// glibc's malloc keeps freed memory where a long-running zergd does not want it kept:
/// - it gives each thread that contends for memory an arena of its own (up to eight per core)
///   and keeps what is freed there, and every rush's blocking jobs (preparing it, building its
///   symbol map, merging) run on threads of their own;
/// - it raises its mmap threshold each time a large block is freed, so later large blocks
///   come from the heap, where freeing them leaves holes rather than returning the memory.
///
/// So zergd's resident memory grew with each rush it had run although nothing of the rush was
/// still held (zerg-bench's soak of 200 rushes: 33–37 MB after rush 10, 41 MB after rush 200;
/// with two arenas and a fixed 128 KiB mmap threshold, 17.9 MB and 19.4 MB). glibc reads both
/// settings only at start, so zergd starts itself again with `MALLOC_ARENA_MAX=2` and
/// `MALLOC_MMAP_THRESHOLD_=131072`, unless `MALLOC_ARENA_MAX` is set already (to any value:
/// the user's choice stands; it also marks the second start). Elsewhere the variables mean
/// nothing and the exec is harmless; if it fails, zergd goes on as it is.
fn bound_malloc_arenas() {
    use std::os::unix::process::CommandExt;
    if !cfg!(target_os = "linux") || std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut cmd = std::process::Command::new(exe);
    cmd.args(std::env::args_os().skip(1))
        .env("MALLOC_ARENA_MAX", "2");
    if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
        cmd.env("MALLOC_MMAP_THRESHOLD_", "131072");
    }
    let err = cmd.exec();
    eprintln!("zergd: cannot restart itself with bounded malloc arenas ({err}); going on");
}

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
    /// Days of zergd's own log kept (one file a day).
    #[arg(long, env = "ZERG_LOG_RETAIN_DAYS", default_value_t = 7, value_parser = clap::value_parser!(u32).range(1..))]
    log_retain_days: u32,
    /// Serve the web dashboard and `/metrics` on this address (off by default). An address
    /// other than loopback needs ZERG_HTTP_TOKEN.
    #[arg(long, env = "ZERG_HTTP", value_name = "ADDR")]
    http: Option<std::net::SocketAddr>,
    /// The dashboard's token (`Authorization: Bearer`), at least 16 characters; required on an
    /// address other than loopback, made at start otherwise. Read from the environment only,
    /// so that it is not in `ps`.
    #[arg(skip = std::env::var("ZERG_HTTP_TOKEN").ok())]
    http_token: Option<String>,
    /// Bytes of one task-log file that one dashboard log answer shows at most.
    #[arg(long, env = "ZERG_HTTP_LOG_FILE_BYTES", default_value_t = 256 << 10, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1024..))]
    http_log_file_bytes: usize,
    /// Bytes of one dashboard log answer at most, all files together.
    #[arg(long, env = "ZERG_HTTP_LOG_BYTES", default_value_t = 1 << 20, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1024..))]
    http_log_bytes: usize,
}

/// Logs go to stderr (with colour only on a terminal, and never with `NO_COLOR`) and to
/// `<state dir>/logs/zergd.<date>.log`, rotated daily, the last `retain_days` files kept. The
/// returned guard flushes the file on exit.
fn init_logging(
    state_dir: &std::path::Path,
    retain_days: u32,
) -> Option<tracing_appender::non_blocking::WorkerGuard> {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = || {
        tracing_subscriber::EnvFilter::try_from_env("ZERG_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
    };
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colour);
    // The appender lists the directory as it starts (to prune old files) and says so on stderr
    // when it is missing: it exists before the appender looks. A failure shows in `build`.
    let logs = state_dir.join("logs");
    let _ = std::fs::create_dir_all(&logs);
    let file = tracing_appender::rolling::Builder::new()
        .rotation(tracing_appender::rolling::Rotation::DAILY)
        .filename_prefix("zergd")
        .filename_suffix("log")
        .max_log_files(retain_days as usize)
        .build(logs);
    let registry = tracing_subscriber::registry().with(filter());
    match file {
        Ok(appender) => {
            let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
                .buffered_lines_limit(zergd::monitor::BUFFERED_LINES)
                .finish(appender);
            let file = tracing_subscriber::fmt::layer()
                .with_writer(writer)
                .with_ansi(false);
            registry.with(stderr).with(file).init();
            Some(guard)
        }
        Err(e) => {
            registry.with(stderr).init();
            tracing::warn!(error = %e, "cannot open the log file; logging to stderr only");
            None
        }
    }
}

fn main() -> ExitCode {
    bound_malloc_arenas();
    let args = Args::parse();
    let opts = zergd::Options {
        socket: zerg_proto::transport::resolve_socket(args.socket.as_deref()),
        state_dir: args.state_dir.unwrap_or_else(zergd::default_state_dir),
        agent_bin: args.agent_bin.unwrap_or_else(zergd::default_agent_bin),
        http: args.http.map(|listen| zergd::http::HttpOptions {
            listen,
            token: args.http_token,
            log_limits: zergd::http::logs::LogLimits {
                file_bytes: args.http_log_file_bytes,
                response_bytes: args.http_log_bytes,
            },
        }),
    };
    let _log_guard = init_logging(&opts.state_dir, args.log_retain_days);
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
