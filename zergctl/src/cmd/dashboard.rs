//! `zergctl dashboard`: the web dashboard's address with a one-time login code, asked of zergd
//! over the control socket (which only its owner can open). The code is good once, within a
//! minute; the page trades it for a session cookie and drops it from the address bar.

use std::path::Path;

use crate::{CliError, code, connect, from_status};
use zerg_proto::v1;

/// Runs `zergctl dashboard`.
pub async fn run(socket: &Path, open: bool) -> Result<u8, CliError> {
    let mut c = connect(socket).await?;
    let r = c
        .dashboard_login(v1::DashboardLoginRequest {})
        .await
        .map_err(from_status)?
        .into_inner();
    println!("{}", r.login_url);
    eprintln!(
        "The address above logs this browser in once, within a minute; the dashboard is {}",
        r.url
    );
    if open {
        let opener = if cfg!(target_os = "macos") {
            "open"
        } else {
            "xdg-open"
        };
        match std::process::Command::new(opener)
            .arg(&r.login_url)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
        {
            Ok(s) if s.success() => {}
            Ok(s) => eprintln!("{opener} exited with {s}: open the address above by hand"),
            Err(e) => eprintln!("cannot run {opener} ({e}): open the address above by hand"),
        }
    }
    Ok(code::OK)
}
