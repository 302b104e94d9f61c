//! `zergctl service`: installs zergd as a user service.

use std::path::PathBuf;

use crate::{CliError, code};

fn zergd_path() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("zergd")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("/usr/local/bin/zergd"))
}

/// A systemd user unit. `Restart=on-failure` with exponential steps restarts a crashed zergd;
/// workers keep running meanwhile and are re-adopted.
pub fn systemd_unit(zergd: &str) -> String {
    format!(
        "[Unit]\nDescription=zerg daemon: runs task graphs across coding-agent workers\nStartLimitIntervalSec=300\nStartLimitBurst=10\n\n\
[Service]\nExecStart={zergd}\nRestart=on-failure\nRestartSec=2s\nRestartSteps=5\nRestartMaxDelaySec=60s\n\
# Workers live in their own process groups and survive a zergd restart: only stop zergd itself.\nKillMode=process\nTimeoutStopSec=30\n\n\
[Install]\nWantedBy=default.target\n"
    )
}

/// A launchd agent.
pub fn launchd_plist(zergd: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n\
<plist version=\"1.0\">\n<dict>\n  <key>Label</key><string>dev.zerg.zergd</string>\n  <key>ProgramArguments</key><array><string>{zergd}</string></array>\n\
  <key>KeepAlive</key><dict><key>SuccessfulExit</key><false/></dict>\n  <key>ThrottleInterval</key><integer>10</integer>\n  <key>RunAtLoad</key><true/>\n</dict>\n</plist>\n"
    )
}

/// Writes the unit (or prints it) and says how to enable it.
pub fn install(print: bool) -> Result<u8, CliError> {
    let zergd = zergd_path().to_string_lossy().to_string();
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .ok_or_else(|| CliError::new(code::USAGE, "HOME is not set"))?;
    let (path, text, enable) = if cfg!(target_os = "macos") {
        (
            home.join("Library/LaunchAgents/dev.zerg.zergd.plist"),
            launchd_plist(&zergd),
            "launchctl load -w ~/Library/LaunchAgents/dev.zerg.zergd.plist".to_string(),
        )
    } else {
        (
            home.join(".config/systemd/user/zergd.service"),
            systemd_unit(&zergd),
            "systemctl --user daemon-reload && systemctl --user enable --now zergd\n(and `loginctl enable-linger $USER` to keep it running after logout)".to_string(),
        )
    };
    if print {
        print!("{text}");
        return Ok(code::OK);
    }
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(|e| {
            CliError::new(
                code::INTERNAL,
                format!("cannot create {}: {e}", d.display()),
            )
        })?;
    }
    std::fs::write(&path, text).map_err(|e| {
        CliError::new(
            code::INTERNAL,
            format!("cannot write {}: {e}", path.display()),
        )
    })?;
    println!("Wrote {}.\nEnable it with:\n  {enable}", path.display());
    Ok(code::OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_name_the_binary_and_restart_on_failure() {
        let u = systemd_unit("/opt/zergd");
        assert!(u.contains("ExecStart=/opt/zergd"));
        assert!(u.contains("Restart=on-failure"));
        assert!(u.contains("KillMode=process"));
        let p = launchd_plist("/opt/zergd");
        assert!(p.contains("<string>/opt/zergd</string>"));
        assert!(p.contains("SuccessfulExit"));
    }
}
