//! Reading a commit from git: its tree, what changed between two commits, and the contents of
//! blobs, which are parsed on a few threads as they arrive.
//!
//! Every call is `git -C <repo> …` with the environment scrubbed the way zergd scrubs it
//! ([`crate::contract::env_denied`]), so a `GIT_DIR` in the caller's environment cannot point
//! the index at another repository. Paths and sizes come from git's `-z` output, never from a
//! shell or a quoted form.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc;

use super::{FileSymbols, Grammar, SkipReason, SymbolError, extract};

/// One file of a tree.
#[derive(Debug, Clone)]
pub(crate) struct TreeEntry {
    /// Repository-relative path, `/`-separated.
    pub path: String,
    /// Blob id.
    pub blob: String,
    /// Size in bytes.
    pub size: u64,
    /// A regular file (not a symlink) with a UTF-8 path.
    pub regular: bool,
}

/// The largest blob read into memory whatever the settings say (a guard against a size
/// header that does not match what was asked for).
const HARD_BLOB_LIMIT: u64 = 64 << 20;

fn git(repo: &Path) -> Command {
    let mut cmd = crate::contract::scrubbed_command("git");
    cmd.arg("-C").arg(repo);
    cmd.stdin(Stdio::null());
    cmd
}

fn run(repo: &Path, args: &[&str]) -> Result<Vec<u8>, SymbolError> {
    let out = git(repo)
        .args(args)
        .output()
        .map_err(|e| SymbolError(format!("cannot run git: {e}")))?;
    if !out.status.success() {
        return Err(SymbolError(format!(
            "git {} failed in {}: {}",
            args.join(" "),
            repo.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(out.stdout)
}

use crate::contract::is_object_id;

/// The commit a revision names.
pub(crate) fn resolve_commit(repo: &Path, rev: &str) -> Result<String, SymbolError> {
    if rev.is_empty() || rev.starts_with('-') {
        return Err(SymbolError(format!("{rev:?} is not a revision")));
    }
    let out = run(
        repo,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{rev}^{{commit}}"),
        ],
    )?;
    let id = String::from_utf8_lossy(&out).trim().to_string();
    if !is_object_id(&id) {
        return Err(SymbolError(format!("{rev} does not name a commit")));
    }
    Ok(id)
}

/// Every blob of a commit's tree (submodules are left out).
pub(crate) fn list_tree(repo: &Path, commit: &str) -> Result<Vec<TreeEntry>, SymbolError> {
    let out = run(repo, &["ls-tree", "-r", "-z", "-l", "--full-tree", commit])?;
    let mut entries = Vec::new();
    for record in out.split(|b| *b == 0).filter(|r| !r.is_empty()) {
        // <mode> SP <type> SP <object> SP+ <size> TAB <path>
        let Some(tab) = record.iter().position(|b| *b == b'\t') else {
            continue;
        };
        let (meta, path) = (&record[..tab], &record[tab + 1..]);
        let meta = String::from_utf8_lossy(meta);
        let mut it = meta.split_ascii_whitespace();
        let (Some(mode), Some(kind), Some(blob), Some(size)) =
            (it.next(), it.next(), it.next(), it.next())
        else {
            continue;
        };
        if kind != "blob" || !is_object_id(blob) {
            continue;
        }
        let (path, utf8) = match std::str::from_utf8(path) {
            Ok(p) => (p.to_string(), true),
            Err(_) => (String::from_utf8_lossy(path).into_owned(), false),
        };
        entries.push(TreeEntry {
            path,
            blob: blob.to_string(),
            size: size.parse().unwrap_or(u64::MAX),
            regular: utf8 && (mode == "100644" || mode == "100755"),
        });
    }
    Ok(entries)
}

/// What changed between two commits: each changed path with its new entry, or `None` when it
/// is gone (or is no longer a blob).
pub(crate) fn diff_trees(
    repo: &Path,
    old: &str,
    new: &str,
) -> Result<Vec<(String, Option<TreeEntry>)>, SymbolError> {
    let out = run(
        repo,
        &[
            "diff-tree",
            "-r",
            "-z",
            "--raw",
            "--no-renames",
            "--no-commit-id",
            old,
            new,
        ],
    )?;
    let mut records = out.split(|b| *b == 0);
    let mut changes: Vec<(String, Option<(String, bool)>)> = Vec::new();
    while let Some(meta) = records.next() {
        if meta.is_empty() {
            continue;
        }
        let Some(path) = records.next() else { break };
        // :<old mode> <new mode> <old id> <new id> <status>
        let meta = String::from_utf8_lossy(meta);
        let f: Vec<&str> = meta.trim_start_matches(':').split(' ').collect();
        if f.len() < 5 {
            continue;
        }
        let (path, utf8) = match std::str::from_utf8(path) {
            Ok(p) => (p.to_string(), true),
            Err(_) => (String::from_utf8_lossy(path).into_owned(), false),
        };
        let (mode, blob, status) = (f[1], f[3], f[4]);
        let gone = status.starts_with('D') || mode == "000000" || mode == "160000";
        if gone || !is_object_id(blob) {
            changes.push((path, None));
        } else {
            let regular = utf8 && (mode == "100644" || mode == "100755");
            changes.push((path, Some((blob.to_string(), regular))));
        }
    }
    let ids: Vec<String> = changes
        .iter()
        .filter_map(|(_, e)| e.as_ref().map(|(b, _)| b.clone()))
        .collect();
    let sizes = blob_sizes(repo, &ids)?;
    Ok(changes
        .into_iter()
        .map(|(path, e)| {
            let e = e.map(|(blob, regular)| TreeEntry {
                size: sizes.get(&blob).copied().unwrap_or(u64::MAX),
                path: path.clone(),
                blob,
                regular,
            });
            (path, e)
        })
        .collect())
}

/// Runs `git cat-file <mode>` with `ids` on stdin (written from another thread, so neither
/// pipe can fill up while the other waits) and hands its stdout to `read`.
fn cat_file<T>(
    repo: &Path,
    mode: &str,
    ids: &[String],
    read: impl FnOnce(&mut BufReader<std::process::ChildStdout>) -> Result<T, SymbolError>,
) -> Result<T, SymbolError> {
    let mut child = git(repo)
        .args(["cat-file", mode])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| SymbolError(format!("cannot run git cat-file: {e}")))?;
    let mut stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let result = std::thread::scope(|s| {
        s.spawn(move || {
            if let Some(w) = stdin.as_mut() {
                for id in ids {
                    if w.write_all(id.as_bytes()).is_err() || w.write_all(b"\n").is_err() {
                        break;
                    }
                }
            }
            drop(stdin);
        });
        match stdout {
            Some(out) => read(&mut BufReader::with_capacity(64 << 10, out)),
            None => Err(SymbolError("git cat-file has no output".into())),
        }
    });
    let status = child.wait();
    let result = result?;
    match status {
        Ok(st) if st.success() => Ok(result),
        Ok(st) => Err(SymbolError(format!("git cat-file {mode} failed: {st}"))),
        Err(e) => Err(SymbolError(format!("git cat-file {mode}: {e}"))),
    }
}

/// Reads one header line of `git cat-file` output: `<id> <type> <size>` (or `<id> missing`).
fn header(r: &mut impl BufRead) -> Result<(String, String, u64), SymbolError> {
    let mut line = Vec::new();
    r.by_ref()
        .take(512)
        .read_until(b'\n', &mut line)
        .map_err(|e| SymbolError(format!("reading git cat-file: {e}")))?;
    let line = String::from_utf8_lossy(&line);
    let mut it = line.split_ascii_whitespace();
    match (it.next(), it.next(), it.next()) {
        (Some(id), Some(kind), Some(size)) => Ok((
            id.to_string(),
            kind.to_string(),
            size.parse()
                .map_err(|_| SymbolError(format!("git cat-file said {line:?}")))?,
        )),
        _ => Err(SymbolError(format!(
            "git cat-file said {:?}",
            line.chars().take(200).collect::<String>()
        ))),
    }
}

fn blob_sizes(repo: &Path, ids: &[String]) -> Result<HashMap<String, u64>, SymbolError> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    cat_file(repo, "--batch-check", ids, |r| {
        let mut sizes = HashMap::new();
        for _ in ids {
            let (id, _, size) = header(r)?;
            sizes.insert(id, size);
        }
        Ok(sizes)
    })
}

/// Reads the blobs `ids` and parses each with its grammar, on up to four threads; the
/// outcomes are in the order of `ids`.
pub(crate) fn parse_blobs(
    repo: &Path,
    ids: &[String],
    grammars: Vec<Grammar>,
) -> Result<Vec<Result<FileSymbols, SkipReason>>, SymbolError> {
    let n = ids.len();
    if n == 0 {
        return Ok(Vec::new());
    }
    let threads = std::thread::available_parallelism()
        .map(|p| p.get())
        .unwrap_or(1)
        .clamp(1, 4)
        .min(n);
    let results: Mutex<Vec<Option<Result<FileSymbols, SkipReason>>>> =
        Mutex::new((0..n).map(|_| None).collect());
    let (tx, rx) = mpsc::sync_channel::<(usize, Vec<u8>)>(threads * 2);
    let rx = Mutex::new(rx);
    let read = std::thread::scope(|s| {
        for _ in 0..threads {
            let (rx, results, grammars) = (&rx, &results, &grammars);
            s.spawn(move || {
                loop {
                    let next = match rx.lock() {
                        Ok(r) => r.recv(),
                        Err(_) => return,
                    };
                    let Ok((i, bytes)) = next else { return };
                    // The grammars are C code run on hostile input: a panic on one file only
                    // skips that file.
                    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        extract(grammars[i], &bytes)
                    }))
                    .unwrap_or(Err(SkipReason::Unparsable));
                    if let Ok(mut r) = results.lock() {
                        r[i] = Some(outcome);
                    }
                }
            });
        }
        let read = cat_file(repo, "--batch", ids, |r| {
            for (i, want) in ids.iter().enumerate() {
                let (id, kind, size) = header(r)?;
                if id != *want || kind != "blob" {
                    return Err(SymbolError(format!(
                        "git cat-file gave {id} {kind} for {want}"
                    )));
                }
                if size > HARD_BLOB_LIMIT {
                    std::io::copy(&mut r.by_ref().take(size + 1), &mut std::io::sink())
                        .map_err(|e| SymbolError(format!("reading {id}: {e}")))?;
                    if let Ok(mut res) = results.lock() {
                        res[i] = Some(Err(SkipReason::TooLarge));
                    }
                    continue;
                }
                let mut bytes = Vec::with_capacity(size as usize);
                r.by_ref()
                    .take(size)
                    .read_to_end(&mut bytes)
                    .map_err(|e| SymbolError(format!("reading {id}: {e}")))?;
                let mut nl = [0u8; 1];
                let _ = r.read_exact(&mut nl);
                if tx.send((i, bytes)).is_err() {
                    return Err(SymbolError("the parser threads stopped".into()));
                }
            }
            Ok(())
        });
        drop(tx);
        read
    });
    read?;
    let results = results
        .into_inner()
        .map_err(|_| SymbolError("a parser thread panicked".into()))?;
    Ok(results
        .into_iter()
        .map(|r| r.unwrap_or(Err(SkipReason::Unparsable)))
        .collect())
}
