//! Running child processes (the agent CLI, verification tiers) while tracking their output.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::process::Command;
use tokio::sync::{Mutex, Notify};

use crate::stream::{Profile, Reader, Report};

/// How a child process ended.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Exit code; `None` when killed by a signal or timed out.
    pub code: Option<i32>,
    /// Killed because it ran past its timeout.
    pub timed_out: bool,
    /// The last lines of output (stdout and stderr interleaved).
    pub tail: String,
    /// The CLI printed its final stream-json `result` event but did not exit within its grace
    /// period ([`RESULT_GRACE`] for the agent CLI), so it was killed; the code reflects the
    /// result's verdict.
    pub lingered: bool,
    /// What the output said: the result, cost and tokens, a usage limit, a missing login.
    pub report: Report,
}

/// How long a CLI may linger after printing its final `result` event. Claude Code's
/// `-p --output-format stream-json` sometimes never exits after it (a known hang); the work is
/// done by then, so waiting for the stale-task watchdog would only throw it away.
pub const RESULT_GRACE: Duration = Duration::from_secs(5);

impl Outcome {
    /// Whether the process exited 0.
    pub fn success(&self) -> bool {
        self.code == Some(0) && !self.timed_out
    }
}

/// Milliseconds since the epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// What to run.
pub struct Spec<'a> {
    /// argv.
    pub argv: Vec<String>,
    /// Working directory.
    pub cwd: &'a Path,
    /// Extra environment.
    pub env: Vec<(String, String)>,
    /// Wall-clock limit.
    pub timeout: Duration,
    /// File that receives the output.
    pub artifact: Option<PathBuf>,
    /// Own process group (so a timeout kills everything it started).
    pub own_group: bool,
    /// How long the process may linger after its final `result` event.
    pub result_grace: Duration,
    /// Receives the CLI's own account of what it is doing (`API retry 3/10: overloaded`).
    pub detail: Option<Arc<std::sync::Mutex<String>>>,
    /// How the output is read.
    pub profile: Profile,
}

/// Runs a process to completion (or timeout). `last_output` is set to the time of every output
/// line, which the heartbeat reports. Returns `Err` only when the program could not be started.
pub async fn run(spec: Spec<'_>, last_output: Arc<AtomicI64>) -> std::io::Result<Outcome> {
    let mut cmd = Command::new(&spec.argv[0]);
    cmd.args(&spec.argv[1..])
        .current_dir(spec.cwd)
        .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        // The worker's token is the agent's alone: code the CLI writes never sees it.
        .env_remove(zerg_proto::contract::env::WORKER_TOKEN)
        // A closed stdin: an open one makes headless CLIs wait for input.
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if spec.own_group {
        cmd.process_group(0);
    }
    let (mut child, _started) = spawn(&mut cmd)?;
    let artifact = match &spec.artifact {
        Some(p) => {
            if let Some(d) = p.parent() {
                let _ = tokio::fs::create_dir_all(d).await;
            }
            tokio::fs::File::create(p)
                .await
                .ok()
                .map(|f| tokio::io::BufWriter::with_capacity(256 << 10, f))
        }
        None => None,
    };
    let sink = Arc::new(Mutex::new(Sink {
        file: artifact,
        tail: VecDeque::new(),
        reader: Reader::new(spec.profile),
        detail: spec.detail.clone(),
    }));
    let done = Arc::new(Notify::new());
    let out = child
        .stdout
        .take()
        .map(|s| tokio::spawn(pump(s, sink.clone(), last_output.clone(), done.clone())));
    let err = child
        .stderr
        .take()
        .map(|s| tokio::spawn(pump(s, sink.clone(), last_output.clone(), done.clone())));
    let waited = tokio::time::timeout(spec.timeout, async {
        tokio::select! {
            st = child.wait() => Some(st),
            _ = async { done.notified().await; tokio::time::sleep(spec.result_grace).await } => None,
        }
    })
    .await;
    let mut lingered = false;
    let (code, timed_out) = match waited {
        Ok(Some(Ok(st))) => (st.code(), false),
        Ok(Some(Err(e))) => return Err(e),
        Ok(None) => {
            // Finished its work but did not exit: stop it and go by its result.
            lingered = true;
            kill_child(&mut child, spec.own_group).await;
            let failed = sink
                .lock()
                .await
                .reader
                .report()
                .verdict
                .is_none_or(|v| v.failed);
            (Some(i32::from(failed)), false)
        }
        Err(_) => {
            if spec.own_group
                && let Some(pid) = child.id()
            {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            let _ = child.kill().await;
            (None, true)
        }
    };
    for h in [out, err].into_iter().flatten() {
        // Output pipes can be held open by grandchildren; do not wait on them forever.
        let _ = tokio::time::timeout(Duration::from_secs(2), h).await;
    }
    let mut s = sink.lock().await;
    if let Some(f) = s.file.as_mut() {
        let _ = f.flush().await;
    }
    Ok(Outcome {
        code,
        timed_out,
        tail: s.tail.iter().cloned().collect::<Vec<_>>().join("\n"),
        lingered,
        report: s.reader.report(),
    })
}

async fn kill_child(child: &mut tokio::process::Child, own_group: bool) {
    if own_group && let Some(pid) = child.id() {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = child.kill().await;
}

struct Sink {
    /// The artifact file, buffered: a command may print hundreds of thousands of lines.
    file: Option<tokio::io::BufWriter<tokio::fs::File>>,
    tail: VecDeque<String>,
    reader: Reader,
    detail: Option<Arc<std::sync::Mutex<String>>>,
}

/// Longest line read as an event (a stream-json `init` or `result` line is several KiB); the
/// rest of a longer line still reaches the log file.
const MAX_LINE: usize = 1 << 20;

/// Longest line kept in the tail.
const MAX_TAIL_LINE: usize = 4096;

/// Drains one output pipe until it closes: every byte goes to the artifact file as it
/// arrives, whatever the line length or encoding, while at most [`MAX_LINE`] bytes of each line
/// are read as events, and at most [`MAX_TAIL_LINE`] of them kept for the tail.
async fn pump<R: AsyncRead + Unpin>(
    r: R,
    sink: Arc<Mutex<Sink>>,
    last_output: Arc<AtomicI64>,
    done: Arc<Notify>,
) {
    let mut reader = BufReader::with_capacity(64 * 1024, r);
    let mut line: Vec<u8> = Vec::with_capacity(256);
    loop {
        let chunk = match reader.fill_buf().await {
            Ok([]) | Err(_) => break,
            Ok(c) => c,
        };
        last_output.store(now_ms(), Ordering::Relaxed);
        let n = chunk.len();
        let mut s = sink.lock().await;
        if let Some(f) = s.file.as_mut() {
            let _ = f.write_all(chunk).await;
        }
        for part in chunk.split_inclusive(|b| *b == b'\n') {
            let (body, ends) = match part.strip_suffix(b"\n") {
                Some(b) => (b, true),
                None => (part, false),
            };
            let room = MAX_LINE.saturating_sub(line.len());
            line.extend_from_slice(&body[..body.len().min(room)]);
            if ends {
                s.take_line(&String::from_utf8_lossy(&line), &done);
                line.clear();
            }
        }
        drop(s);
        reader.consume(n);
    }
    if !line.is_empty() {
        sink.lock()
            .await
            .take_line(&String::from_utf8_lossy(&line), &done);
    }
}

impl Sink {
    /// One (possibly cut) output line: the reader, then the tail.
    fn take_line(&mut self, line: &str, done: &Notify) {
        let seen = self.reader.line(line, now_ms());
        if seen.result {
            done.notify_one();
        }
        if seen.detail
            && let Some(d) = &self.detail
        {
            let r = self.reader.report();
            if let Some(text) = r.retrying.or(r.warning)
                && let Ok(mut d) = d.lock()
            {
                *d = text;
            }
        }
        let mut end = line.len().min(MAX_TAIL_LINE);
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        self.tail.push_back(line[..end].to_string());
        if self.tail.len() > 20 {
            self.tail.pop_front();
        }
    }
}

/// Processes started by [`run`] and [`git_with`] and not yet waited for: [`sweep`] leaves them
/// alone. Held while a process is started, so that a sweep never sees one half-registered.
static STARTED: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

fn started() -> std::sync::MutexGuard<'static, Vec<u32>> {
    STARTED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Takes its process off [`STARTED`] when dropped: waited for, or killed on drop.
struct Started(Option<u32>);

impl Drop for Started {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            started().retain(|p| *p != pid);
        }
    }
}

/// Starts `cmd`, registered in [`STARTED`] until the returned guard is dropped.
fn spawn(cmd: &mut Command) -> std::io::Result<(tokio::process::Child, Started)> {
    let mut list = started();
    let child = cmd.spawn()?;
    let pid = child.id();
    list.extend(pid);
    Ok((child, Started(pid)))
}

/// Makes this process the subreaper of everything it starts (Linux): a process whose parent
/// exits (a server an agent CLI put in the background, a daemon that left its session with
/// `setsid`) becomes this process's child instead of init's, where [`sweep`] can find it.
pub fn become_subreaper() {
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        eprintln!("zerg-worker-agent: cannot become the subreaper of the agent's processes: {e}");
    }
}

/// This process's children that [`run`] and [`git_with`] did not start (nor are waiting for):
/// what earlier commands left behind, handed over when their parents exited.
pub fn adopted() -> Vec<i32> {
    not_started(children(), &started())
}

fn not_started(mut kids: Vec<i32>, started: &[u32]) -> Vec<i32> {
    kids.retain(|p| !started.iter().any(|s| i64::from(*s) == i64::from(*p)));
    kids.sort_unstable();
    kids.dedup();
    kids
}

/// Every child of this process, from each of its threads' `children` list.
fn children() -> Vec<i32> {
    let mut kids = Vec::new();
    #[cfg(target_os = "linux")]
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for t in tasks.flatten() {
            if let Ok(text) = std::fs::read_to_string(t.path().join("children")) {
                kids.extend(
                    text.split_whitespace()
                        .filter_map(|p| p.parse::<i32>().ok()),
                );
            }
        }
    }
    kids
}

/// Kills (SIGKILL) and reaps every [`adopted`] child but those in `keep` (what was there before
/// the command ran: a service a setup command started), then again for what their deaths
/// handed over; reaps any of `keep` that has exited. Returns how many it killed.
pub async fn sweep(keep: Vec<i32>) -> usize {
    let mut any = false;
    for pid in adopted() {
        if keep.contains(&pid) {
            reap(pid);
        } else {
            any = true;
        }
    }
    if !any {
        return 0;
    }
    tokio::task::spawn_blocking(move || sweep_now(&keep))
        .await
        .unwrap_or(0)
}

/// Reaps `pid` if it has exited, without waiting; whether it is gone.
#[cfg(target_os = "linux")]
fn reap(pid: i32) -> bool {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    !matches!(
        waitpid(nix::unistd::Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)),
        Ok(WaitStatus::StillAlive)
    )
}

#[cfg(not(target_os = "linux"))]
fn reap(_pid: i32) -> bool {
    true
}

#[cfg(target_os = "linux")]
fn sweep_now(keep: &[i32]) -> usize {
    use nix::sys::signal::{Signal, kill};
    let mut killed = std::collections::BTreeSet::new();
    // Each round kills what is there; a killed process's own children come to this one next.
    for _ in 0..64 {
        let mut left: Vec<i32> = {
            // No process is started while the list is taken and killed.
            let started = started();
            not_started(children(), &started)
                .into_iter()
                .filter(|p| !keep.contains(p))
                .inspect(|p| {
                    let _ = kill(nix::unistd::Pid::from_raw(*p), Signal::SIGKILL);
                    killed.insert(*p);
                })
                .collect()
        };
        if left.is_empty() {
            break;
        }
        let until = std::time::Instant::now() + Duration::from_millis(500);
        while !left.is_empty() && std::time::Instant::now() < until {
            left.retain(|p| !reap(*p));
            if !left.is_empty() {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
    killed.len()
}

#[cfg(not(target_os = "linux"))]
fn sweep_now(_keep: &[i32]) -> usize {
    0
}

/// Runs git in the worktree and returns trimmed stdout, or stderr as the error.
pub async fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    git_with(dir, args, &[]).await
}

/// [`git`] with extra environment variables (a commit identity).
pub async fn git_with(
    dir: &Path,
    args: &[&str],
    env: &[(String, String)],
) -> Result<String, String> {
    // The agent's environment comes from zergd, which already left out what could redirect
    // git (and sets GIT_CONFIG_* itself in containers): nothing to scrub here. The user's hooks
    // never run for the worker's own git (its commits, resets and checkouts), as for zergd's:
    // `--no-verify` alone leaves `prepare-commit-msg` and `post-commit` running.
    let mut cmd = Command::new("git");
    cmd.args(["-c", "core.hooksPath=/dev/null"])
        .arg("-C")
        .arg(dir)
        .args(args)
        .envs(zerg_proto::contract::GIT_ENV.iter().copied())
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let (child, _started) = spawn(&mut cmd).map_err(|e| format!("cannot run git: {e}"))?;
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| format!("cannot run git: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(format!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn captures_output_exit_code_and_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let last = Arc::new(AtomicI64::new(0));
        let spec = Spec {
            argv: vec![
                "sh".into(),
                "-c".into(),
                "echo one; echo two >&2; exit 3".into(),
            ],
            cwd: dir.path(),
            env: vec![],
            timeout: Duration::from_secs(10),
            artifact: Some(dir.path().join("out.txt")),
            own_group: true,
            result_grace: RESULT_GRACE,
            detail: None,
            profile: Profile::Plain,
        };
        let o = run(spec, last.clone()).await.unwrap();
        assert_eq!(o.code, Some(3));
        assert!(o.tail.contains("one") && o.tail.contains("two"));
        assert!(last.load(Ordering::Relaxed) > 0);
        assert!(
            std::fs::read_to_string(dir.path().join("out.txt"))
                .unwrap()
                .contains("one")
        );

        let spec = Spec {
            argv: vec!["sh".into(), "-c".into(), "sleep 30".into()],
            cwd: dir.path(),
            env: vec![],
            timeout: Duration::from_millis(200),
            artifact: None,
            own_group: true,
            result_grace: RESULT_GRACE,
            detail: None,
            profile: Profile::Plain,
        };
        let o = run(spec, Arc::new(AtomicI64::new(0))).await.unwrap();
        assert!(o.timed_out);
        assert!(!o.success());
    }

    #[tokio::test]
    async fn binary_output_and_a_10_mb_line_are_drained_logged_and_cut_in_the_tail() {
        let dir = tempfile::tempdir().unwrap();
        let spec = Spec {
            argv: vec![
                "sh".into(),
                "-c".into(),
                "printf '\\377\\376 not utf-8\\n'; head -c 10000000 /dev/zero | tr '\\0' x; echo; echo last line; exit 1"
                    .into(),
            ],
            cwd: dir.path(),
            env: vec![],
            timeout: Duration::from_secs(60),
            artifact: Some(dir.path().join("out.txt")),
            own_group: true,
            result_grace: RESULT_GRACE,
            detail: None,
            profile: Profile::Plain,
        };
        let o = run(spec, Arc::new(AtomicI64::new(0))).await.unwrap();
        assert_eq!(
            o.code,
            Some(1),
            "the command ran to its end: nothing waited on a pipe"
        );
        assert!(!o.timed_out);
        assert!(
            o.tail.contains("last line"),
            "{}",
            &o.tail[..200.min(o.tail.len())]
        );
        assert!(o.tail.contains("not utf-8"));
        assert!(
            o.tail.len() < 3 * MAX_TAIL_LINE,
            "tail is bounded: {}",
            o.tail.len()
        );
        let logged = std::fs::metadata(dir.path().join("out.txt")).unwrap().len();
        assert!(logged > 10_000_000, "everything reaches the log: {logged}");
    }

    #[tokio::test]
    async fn a_cli_that_lingers_after_its_result_is_stopped_and_judged_by_it() {
        let dir = tempfile::tempdir().unwrap();
        let spec = Spec {
            argv: vec![
                "sh".into(),
                "-c".into(),
                r#"echo '{"type":"result","subtype":"success","is_error":false,"result":"ok"}'; exec sleep 3600"#.into(),
            ],
            cwd: dir.path(),
            env: vec![],
            timeout: Duration::from_secs(60),
            artifact: None,
            own_group: true,
            result_grace: Duration::from_millis(200),
            detail: None,
            profile: Profile::Claude,
        };
        let o = run(spec, Arc::new(AtomicI64::new(0))).await.unwrap();
        assert!(o.lingered);
        assert!(o.success(), "{o:?}");
    }

    #[tokio::test]
    async fn missing_program_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let spec = Spec {
            argv: vec!["/nonexistent/claude".into()],
            cwd: dir.path(),
            env: vec![],
            timeout: Duration::from_secs(1),
            artifact: None,
            own_group: false,
            result_grace: RESULT_GRACE,
            detail: None,
            profile: Profile::Plain,
        };
        let e = run(spec, Arc::new(AtomicI64::new(0))).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
    }
}
