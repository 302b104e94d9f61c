//! The zergctl binary: parses the command line and runs [`zergctl::run`].

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = match zergctl::Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // --help and --version are not errors; bad usage exits 64 (EX_USAGE).
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() {
                zergctl::code::USAGE
            } else {
                zergctl::code::OK
            });
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("zergctl: cannot start the runtime: {e}");
            return ExitCode::from(zergctl::code::INTERNAL);
        }
    };
    match rt.block_on(zergctl::run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("zergctl: {}", e.message);
            ExitCode::from(e.code)
        }
    }
}
