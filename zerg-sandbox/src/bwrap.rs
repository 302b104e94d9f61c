//! Namespaces through bubblewrap: the command line that runs a program under a [`Policy`],
//! and the probe that finds out whether this machine allows it.
//!
//! The sandbox gets user, mount, pid, ipc, uts and network namespaces of its own and no
//! capabilities. Its root is an empty tmpfs; only the policy's paths are bound into it, each
//! bind after the binds it lies under (the private home before the toolchains inside it, the
//! worktree before the spec mounted over part of it). Not used, on purpose: `--die-with-parent`
//! (a worker must outlive a restart of zergd, which re-adopts it) and `--new-session` (zergd
//! stops a worker by signalling its process group, which a new session would leave).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{Policy, Support};

/// The namespace flags every confined process gets.
const NAMESPACES: &[&str] = &[
    "--unshare-user",
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
    "--unshare-net",
    "--cap-drop",
    "ALL",
];

/// How long the probe may take before it counts as a failure.
const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// The arguments that run `program args…` under `policy` with bubblewrap (everything after
/// the `bwrap` binary itself).
pub fn args(policy: &Policy, program: &Path, program_args: &[OsString]) -> Vec<OsString> {
    let mut a: Vec<OsString> = NAMESPACES
        .iter()
        .filter(|n| !(policy.network && **n == "--unshare-net"))
        .map(OsString::from)
        .collect();
    a.extend(["--hostname", "zerg-sandbox"].map(OsString::from));
    a.extend(["--proc", "/proc", "--dev", "/dev"].map(OsString::from));
    for (target, link) in &policy.symlinks {
        a.push("--symlink".into());
        a.push(target.into());
        a.push(link.into());
    }
    // `/tmp` goes in with the binds, so a worktree that lies under `/tmp` lands on top of it.
    if policy.tmp.is_none() {
        a.extend(["--tmpfs", "/tmp"].map(OsString::from));
    }
    let mut binds: Vec<(&Path, &Path, bool)> = policy
        .read_only
        .iter()
        .map(|b| (b.from.as_path(), b.to.as_path(), false))
        .chain(
            policy
                .read_write
                .iter()
                .map(|b| (b.from.as_path(), b.to.as_path(), true)),
        )
        .chain(
            policy
                .tmp
                .iter()
                .map(|t| (t.as_path(), Path::new("/tmp"), true)),
        )
        .collect();
    // Shallower first, so a bind inside another one lands on top of it.
    binds.sort_by_key(|(_, to, _)| to.components().count());
    for (from, to, rw) in binds {
        a.push(if rw { "--bind" } else { "--ro-bind" }.into());
        a.push(from.into());
        a.push(to.into());
    }
    for m in &policy.masked {
        if m.is_dir() {
            a.extend(["--tmpfs".into(), m.into(), "--remount-ro".into(), m.into()]);
        } else {
            a.extend(["--ro-bind".into(), "/dev/null".into(), m.into()]);
        }
    }
    a.push("--chdir".into());
    a.push(policy.cwd.clone().into());
    a.push("--".into());
    a.push(program.into());
    a.extend(program_args.iter().cloned());
    a
}

/// Finds bubblewrap (`bwrap` on `PATH`, or `explicit`) and runs a probe under the worker's
/// namespaces: `true`, or `agent --sandbox-probe`, which applies Landlock inside and prints
/// `landlock-abi N`.
pub fn probe(explicit: Option<PathBuf>, agent: Option<&Path>) -> Support {
    let fail = |why: String| Support {
        namespaces: Err(why),
        bwrap_version: None,
        landlock_abi: 0,
    };
    if !cfg!(target_os = "linux") {
        return fail(
            "this is not Linux: zerg confines subprocess workers with Linux namespaces and Landlock only (on macOS, use --mode container)".into(),
        );
    }
    let Some(bwrap) = explicit.or_else(|| find_on_path("bwrap")) else {
        return fail(
            "bubblewrap is not installed (Debian and Ubuntu: apt install bubblewrap; Fedora: dnf install bubblewrap; Arch: pacman -S bubblewrap)".into(),
        );
    };
    let version = Command::new(&bwrap)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let Some(version) = version else {
        return fail(format!(
            "{} does not run (bwrap --version failed)",
            bwrap.display()
        ));
    };
    let mut cmd = Command::new(&bwrap);
    cmd.args(NAMESPACES)
        .args(["--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev"])
        .arg("--");
    match agent {
        Some(a) => cmd.arg(a).arg("--sandbox-probe"),
        None => cmd.arg("true"),
    };
    let out = match run_with_timeout(cmd, PROBE_TIMEOUT) {
        Ok(o) => o,
        Err(e) => return fail(format!("{}: {e}", bwrap.display())),
    };
    if !out.0 {
        return fail(explain(&out.2, &bwrap));
    }
    let landlock_abi = out
        .1
        .lines()
        .find_map(|l| l.strip_prefix("landlock-abi "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    Support {
        namespaces: Ok(bwrap),
        bwrap_version: Some(version),
        landlock_abi,
    }
}

/// What a failed probe means, with the fix the maintainers of bubblewrap-based sandboxes
/// document for the usual cause.
fn explain(stderr: &str, bwrap: &Path) -> String {
    let said = stderr.trim().lines().last().unwrap_or("").to_string();
    if said.contains("uid map")
        || said.contains("Permission denied")
        || said.contains("RTM_NEWADDR")
        || said.contains("Operation not permitted")
        || said.contains("No permissions to create")
    {
        format!(
            "{} cannot create unprivileged user namespaces ({said}). On Ubuntu 23.10 and later (and Debian 13) AppArmor blocks them: give bwrap an AppArmor profile with `userns` (see docs/Troubleshooting.md), or set `sysctl kernel.apparmor_restrict_unprivileged_userns=0`; elsewhere check `sysctl user.max_user_namespaces`",
            bwrap.display()
        )
    } else {
        format!("{} failed its probe: {said}", bwrap.display())
    }
}

/// Runs `cmd`, giving up after `timeout`: whether it succeeded, its stdout and its stderr.
fn run_with_timeout(
    mut cmd: Command,
    timeout: Duration,
) -> std::io::Result<(bool, String, String)> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let start = Instant::now();
    loop {
        if child.try_wait()?.is_some() {
            let out = child.wait_with_output()?;
            return Ok((
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ));
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other(format!(
                "the probe did not finish within {}s",
                timeout.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The first executable file named `name` on `PATH`.
pub fn find_on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Bind;

    #[test]
    fn binds_go_shallow_first_and_the_command_comes_last() {
        let p = Policy {
            read_write: vec![Bind::same("/h/repo/wt")],
            read_only: vec![Bind::same("/h/repo/wt/.gsd/specs/f"), Bind::same("/usr")],
            cwd: PathBuf::from("/h/repo/wt"),
            ..Policy::default()
        };
        let a: Vec<String> = args(&p, Path::new("/bin/agent"), &["x".into()])
            .into_iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        let at = |s: &str| a.iter().position(|x| x == s).unwrap();
        assert!(at("/usr") < at("/h/repo/wt") && at("/h/repo/wt") < at("/h/repo/wt/.gsd/specs/f"));
        assert_eq!(a[at("/h/repo/wt") - 1], "--bind");
        assert_eq!(a[at("/h/repo/wt/.gsd/specs/f") - 1], "--ro-bind");
        assert!(a.contains(&"--unshare-net".to_string()));
        assert!(!a.contains(&"--die-with-parent".to_string()));
        assert_eq!(&a[a.len() - 3..], ["--", "/bin/agent", "x"]);
    }
}
