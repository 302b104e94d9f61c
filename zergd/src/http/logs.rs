//! A task's log files for the dashboard, read at a bounded cost.
//!
//! A worker writes what it likes into its task's log files, so a request may cost only so
//! many bytes: at most [`LogLimits::file_bytes`] of each file and [`LogLimits::response_bytes`]
//! in all, counted as the JSON answer spells them (a control byte is shown as U+FFFD, three
//! bytes; a quote or backslash as two). Each file is read from its end, or from the offset the
//! page last saw, into a buffer no larger than that. Every directory on the way from the
//! repository to the task's own is opened without following a symlink, and only regular
//! files are read: a FIFO, a device or a socket is skipped, never waited on.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;
use serde_json::{Value, json};

/// Files of one task shown at most (the first ones by name).
const MAX_FILES: usize = 20;

/// What one log answer may cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogLimits {
    /// Bytes shown of one file (256 KiB by default).
    pub file_bytes: usize,
    /// Bytes in one answer, all files together (1 MiB by default).
    pub response_bytes: usize,
}

impl Default for LogLimits {
    fn default() -> Self {
        LogLimits {
            file_bytes: 256 << 10,
            response_bytes: 1 << 20,
        }
    }
}

fn open_dir_at(dir: &impl AsFd, name: &str) -> nix::Result<OwnedFd> {
    openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// The task's log directory, `<repo>/.zerg/logs/tasks/<task>`, opened one component at a time
/// without following a symlink.
fn task_dir(repo: &Path, task: &str) -> Option<OwnedFd> {
    let top: OwnedFd = File::open(repo).ok()?.into();
    let mut fd = top;
    for part in [".zerg", "logs", "tasks", task] {
        if part.is_empty() || part.contains('/') || part == "." || part == ".." {
            return None;
        }
        fd = open_dir_at(&fd, part).ok()?;
    }
    Some(fd)
}

/// One line as the page shows it: control bytes but tab become U+FFFD.
fn shown(line: &str) -> String {
    line.chars()
        .map(|c| {
            if c.is_control() && c != '\t' {
                '\u{FFFD}'
            } else {
                c
            }
        })
        .collect()
}

/// What `s` costs inside a JSON string.
fn json_len(s: &str) -> usize {
    s.chars()
        .map(|c| match c {
            '"' | '\\' | '\t' => 2,
            c => c.len_utf8(),
        })
        .sum()
}

/// The files of a task's log directory: from the end, or from the offset in `at` for a file
/// named there, within `limits`.
pub fn read(repo: &Path, task: &str, at: &[(String, u64)], limits: LogLimits) -> Vec<Value> {
    let Some(dir) = task_dir(repo, task) else {
        return Vec::new();
    };
    let Ok(mut listing) = nix::dir::Dir::from_fd(match dir.try_clone() {
        Ok(d) => d,
        Err(_) => return Vec::new(),
    }) else {
        return Vec::new();
    };
    let mut names: Vec<String> = listing
        .iter()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type() == Some(nix::dir::Type::File))
        .filter_map(|e| e.file_name().to_str().ok().map(str::to_string))
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    names.truncate(MAX_FILES);
    let mut budget = limits.response_bytes;
    let mut out = Vec::new();
    for name in names {
        let from = at.iter().find(|(n, _)| *n == name).map(|(_, o)| *o);
        if let Some(v) = read_one(
            &dir,
            &name,
            from,
            limits.file_bytes.min(budget),
            &mut budget,
        ) {
            out.push(v);
        }
    }
    out
}

fn read_one(
    dir: &OwnedFd,
    name: &str,
    from: Option<u64>,
    cap: usize,
    budget: &mut usize,
) -> Option<Value> {
    let fd = openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let mut f = File::from(fd);
    let meta = f.metadata().ok()?;
    if !meta.is_file() {
        return None;
    }
    let size = meta.len();
    // Where to start: the page's offset when it still lies in the file (a file that shrank
    // is read again from its end), else the end less the cap.
    let wanted = from.filter(|o| *o <= size);
    let floor = size.saturating_sub(cap as u64);
    let start = wanted.map_or(floor, |o| o.max(floor));
    let skipped = start - wanted.unwrap_or(0);
    f.seek(SeekFrom::Start(start)).ok()?;
    let mut buf = Vec::with_capacity((size - start).min(cap as u64) as usize);
    (&mut f).take(cap as u64).read_to_end(&mut buf).ok()?;
    // A read that began inside a line drops that line's head; only whole lines are shown,
    // unless the buffer is full and holds no line end at all.
    let head = match buf.iter().position(|b| *b == b'\n') {
        Some(nl) if wanted != Some(start) && start > 0 => nl + 1,
        _ => 0,
    };
    let rest = &buf[head..];
    let (body, used) = match rest.iter().rposition(|b| *b == b'\n') {
        Some(nl) => (&rest[..nl], head + nl + 1),
        None if buf.len() >= cap => (rest, buf.len()),
        None => (&rest[..0], head),
    };
    let mut end = start + used as u64;
    let mut lines = Vec::new();
    let mut truncated = head > 0;
    let mut at = start + head as u64;
    if !body.is_empty() {
        for raw in body.split(|b| *b == b'\n') {
            at += raw.len() as u64 + 1;
            let line = shown(&String::from_utf8_lossy(raw));
            let cost = json_len(&line) + 3;
            if cost > *budget {
                // What fits of the line that does not, and nothing after it: the next read
                // starts after it.
                let mut room = budget.saturating_sub(3);
                let part: String = line
                    .chars()
                    .take_while(|c| {
                        let n = json_len(c.encode_utf8(&mut [0; 4]));
                        let fits = n <= room;
                        room = room.saturating_sub(n);
                        fits
                    })
                    .collect();
                *budget = budget.saturating_sub(json_len(&part) + 3);
                if !part.is_empty() {
                    lines.push(part);
                }
                truncated = true;
                end = end.min(at);
                break;
            }
            *budget -= cost;
            lines.push(line);
        }
    }
    Some(json!({
        "name": name,
        "lines": lines,
        "start": start,
        "end": end,
        "size": size,
        "skipped": skipped,
        "truncated": truncated || skipped > 0,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logs(files: &[(&str, Vec<u8>)]) -> tempfile::TempDir {
        let repo = tempfile::tempdir().unwrap();
        let dir = repo.path().join(".zerg/logs/tasks/T1");
        std::fs::create_dir_all(&dir).unwrap();
        for (n, b) in files {
            std::fs::write(dir.join(n), b).unwrap();
        }
        repo
    }

    fn answer_len(v: &[Value]) -> usize {
        serde_json::to_string(v).unwrap().len()
    }

    #[test]
    fn control_bytes_and_long_lines_cost_no_more_than_the_caps() {
        let evil: Vec<u8> = (0..3 << 20).map(|i| (i % 31) as u8).collect();
        let files: Vec<(String, Vec<u8>)> = (0..20)
            .map(|i| (format!("a{i:02}.log"), evil.clone()))
            .collect();
        let refs: Vec<(&str, Vec<u8>)> =
            files.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
        let repo = logs(&refs);
        let limits = LogLimits::default();
        let v = read(repo.path(), "T1", &[], limits);
        // The per-line overhead and the names are outside the count; they are small.
        assert!(
            answer_len(&v) < limits.response_bytes + (64 << 10),
            "{}",
            answer_len(&v)
        );
        assert!(v[0]["truncated"].as_bool().unwrap());
        let shown = v[0]["lines"][0].as_str().unwrap();
        assert!(!shown.chars().any(|c| c.is_control() && c != '\t'));
    }

    #[test]
    fn the_page_gets_what_is_new_since_its_offset_in_whole_lines() {
        let repo = logs(&[("out.log", b"one\ntwo\nthr".to_vec())]);
        let l = LogLimits::default();
        let v = read(repo.path(), "T1", &[], l);
        assert_eq!(v[0]["lines"], json!(["one", "two"]));
        let end = v[0]["end"].as_u64().unwrap();
        assert_eq!(end, 8, "the unfinished line waits");
        let f = repo.path().join(".zerg/logs/tasks/T1/out.log");
        std::fs::write(&f, b"one\ntwo\nthree\nfour\n").unwrap();
        let v = read(repo.path(), "T1", &[("out.log".into(), end)], l);
        assert_eq!(v[0]["lines"], json!(["three", "four"]));
        assert_eq!(v[0]["skipped"], 0);
        // Past the cap, the start moves up and says how much was skipped.
        let small = LogLimits {
            file_bytes: 8,
            response_bytes: 1 << 20,
        };
        let v = read(repo.path(), "T1", &[("out.log".into(), 0)], small);
        assert_eq!(v[0]["lines"], json!(["four"]));
        assert!(v[0]["skipped"].as_u64().unwrap() > 0);
    }

    #[test]
    fn a_symlinked_directory_and_a_fifo_are_not_read() {
        let repo = logs(&[("ok.log", b"fine\n".to_vec())]);
        let tasks = repo.path().join(".zerg/logs/tasks");
        nix::unistd::mkfifo(&tasks.join("T1/pipe.log"), Mode::from_bits_truncate(0o600)).unwrap();
        let v = read(repo.path(), "T1", &[], LogLimits::default());
        assert_eq!(v.len(), 1, "the FIFO is skipped, not waited on: {v:?}");
        let secret = tempfile::tempdir().unwrap();
        std::fs::write(secret.path().join("key.log"), b"SECRET\n").unwrap();
        std::os::unix::fs::symlink(secret.path(), tasks.join("T2")).unwrap();
        assert!(read(repo.path(), "T2", &[], LogLimits::default()).is_empty());
        assert!(read(repo.path(), "..", &[], LogLimits::default()).is_empty());
    }
}
