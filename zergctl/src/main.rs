//! The zergctl binary: parses the command line and runs [`zergctl::run`].

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = zergctl::Cli::parse();
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
