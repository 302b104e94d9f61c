//! A remote worker's code: it shares no filesystem with zergd, so before each task it fetches
//! the lease's base over the plane (a depth-one pack of what it lacks, into its own repository
//! at the worktree), and before it reports a commit or a checkpoint it pushes a thin pack of
//! `base..commit`. zergd checks the pack in quarantine before anything of it reaches the
//! repository, and refuses a report whose commit it has not received.

use std::io::{Read, Seek, Write};

use super::*;

/// Most haves a fetch names (zergd accepts 64).
const MAX_HAVES: usize = 32;

/// Bytes per message of a pushed pack.
const PUSH_CHUNK: usize = 256 * 1024;

impl Session {
    /// Commits whose whole trees this worker holds: the fetched bases (newest last in the
    /// shallow file) and its `HEAD`.
    async fn haves(&self) -> Vec<String> {
        let wt = &self.env.worktree;
        let mut haves: Vec<String> = tokio::fs::read_to_string(wt.join(".git").join("shallow"))
            .await
            .unwrap_or_default()
            .lines()
            .rev()
            .filter(|l| zerg_proto::contract::is_object_id(l))
            .map(str::to_string)
            .take(MAX_HAVES - 1)
            .collect();
        if let Ok(head) = run::git(wt, &["rev-parse", "-q", "--verify", "HEAD^{commit}"]).await
            && zerg_proto::contract::is_object_id(&head)
            && !haves.contains(&head)
        {
            haves.push(head);
        }
        haves
    }

    /// Fetches the lease's base (and the checkpoint it resumes from) into the worker's own
    /// repository, creating it on the first task.
    pub(super) async fn fetch_base(&mut self, task: &v1::Task) -> Result<(), String> {
        let wt = self.env.worktree.clone();
        let req = v1::FetchBaseRequest {
            worker: Some(self.env.me()),
            lease_id: task.lease_id.clone(),
            task_id: task.id.clone(),
            haves: self.haves().await,
        };
        let mut stream = retrying!(self, |c| c.fetch_base(req.clone()))
            .map_err(|s| format!("zergd refused the fetch: {}", s.message()))?;
        let mut file = tempfile::tempfile().map_err(|e| format!("cannot spool the pack: {e}"))?;
        let mut header: Option<v1::PackChunk> = None;
        let mut got = 0u64;
        loop {
            match stream.message().await {
                Ok(Some(mut m)) => {
                    got += m.data.len() as u64;
                    file.write_all(&m.data)
                        .map_err(|e| format!("cannot spool the pack: {e}"))?;
                    if header.is_none() {
                        m.data = Vec::new();
                        header = Some(m);
                    }
                }
                Ok(None) => break,
                Err(s) => return Err(format!("the fetch broke off: {}", s.message())),
            }
        }
        let header = header.ok_or("zergd sent no pack")?;
        if got != header.pack_bytes {
            return Err(format!(
                "the pack was cut short: {got} of {} bytes",
                header.pack_bytes
            ));
        }
        if !wt.join(".git").exists() {
            let format = match header.object_format.as_str() {
                "sha256" => "--object-format=sha256",
                _ => "--object-format=sha1",
            };
            tokio::fs::create_dir_all(&wt)
                .await
                .map_err(|e| format!("cannot create {}: {e}", wt.display()))?;
            run::git(&wt, &["init", "-q", format]).await?;
            for (k, v) in [("gc.auto", "0"), ("maintenance.auto", "false")] {
                run::git(&wt, &["config", k, v]).await?;
            }
        }
        file.rewind().map_err(|e| e.to_string())?;
        let git_dir = wt.join(".git");
        let shallow = header.shallow.clone();
        let size = header.pack_bytes;
        tokio::task::spawn_blocking(move || {
            zerg_git::transfer::store_fetched(&git_dir, file, &shallow)
        })
        .await
        .map_err(|e| e.to_string())??;
        eprintln!(
            "zerg-worker-agent: fetched {} ({size} bytes)",
            task.base_commit
        );
        if !self.in_process && zerg_git::Repo::open_worktree(&wt).is_ok() {
            self.in_process = true;
            self.git_dir = Some(wt.join(".git"));
        }
        Ok(())
    }

    /// Writes the ignored files of the user's checkout that `worktree.copy` names (a `.env`)
    /// into the workspace, as zergd streams them, and names them in `.git/info/exclude` so
    /// that no commit of this worker takes them in, whatever ignored them in the checkout.
    pub(super) async fn fetch_copies(&mut self, task: &v1::Task) -> Result<(), String> {
        let req = v1::FetchBaseRequest {
            worker: Some(self.env.me()),
            lease_id: task.lease_id.clone(),
            task_id: task.id.clone(),
            haves: Vec::new(),
        };
        let mut stream = retrying!(self, |c| c.fetch_copies(req.clone()))
            .map_err(|s| format!("zergd refused the copies: {}", s.message()))?;
        let wt = self.env.worktree.clone();
        let mut current: Option<(std::fs::File, String, u64)> = None;
        let mut names = Vec::new();
        let mut bytes = 0u64;
        loop {
            let m = match stream.message().await {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(s) => return Err(format!("the copies broke off: {}", s.message())),
            };
            if !m.path.is_empty() {
                finish_copy(current.take())?;
                let rel = copy_path(&m.path)?;
                let path = wt.join(&rel);
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
                }
                let file = open_copy(&path, m.mode & 0o777)
                    .map_err(|e| format!("cannot write {}: {e}", m.path))?;
                names.push(m.path.clone());
                current = Some((file, m.path, m.size));
            }
            let Some((file, path, left)) = current.as_mut() else {
                return Err("zergd sent data before naming a file".into());
            };
            let n = m.data.len() as u64;
            if n > *left {
                return Err(format!("{path}: more bytes than announced"));
            }
            file.write_all(&m.data)
                .map_err(|e| format!("cannot write {path}: {e}"))?;
            *left -= n;
            bytes += n;
        }
        finish_copy(current)?;
        if !names.is_empty() {
            let exclude = wt.join(".git/info/exclude");
            if let Some(dir) = exclude.parent() {
                std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
            }
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&exclude)
                .map_err(|e| format!("cannot write {}: {e}", exclude.display()))?;
            let mut lines = String::from("\n# zerg: worktree.copy\n");
            for n in &names {
                lines.push_str(&exclude_line(n));
                lines.push('\n');
            }
            f.write_all(lines.as_bytes()).map_err(|e| e.to_string())?;
            eprintln!(
                "zerg-worker-agent: worktree.copy: {} file(s), {bytes} bytes: {}",
                names.len(),
                names.join(", ")
            );
        }
        self.copies_fetched = true;
        Ok(())
    }

    /// Pushes `base..commit` to zergd as a thin pack; zergd checks it before it answers.
    pub(super) async fn push(&mut self, task: &v1::Task, commit: &str) -> Result<(), String> {
        let (wt, base, c) = (
            self.env.worktree.clone(),
            task.base_commit.clone(),
            commit.to_string(),
        );
        let (file, size) = tokio::task::spawn_blocking(move || -> Result<_, String> {
            let repo = zerg_git::Repo::open_worktree(&wt).map_err(|e| e.to_string())?;
            let f = tempfile::tempfile().map_err(|e| e.to_string())?;
            let size = repo
                .write_thin_pack(&base, &c, f.try_clone().map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
            Ok((f, size))
        })
        .await
        .map_err(|e| e.to_string())??;
        let mut chunks = Vec::new();
        let mut file = file;
        file.rewind().map_err(|e| e.to_string())?;
        loop {
            let mut buf = vec![0u8; PUSH_CHUNK];
            let n = file.read(&mut buf).map_err(|e| e.to_string())?;
            if n == 0 && !chunks.is_empty() {
                break;
            }
            buf.truncate(n);
            let mut m = v1::PushChunk {
                data: buf,
                ..Default::default()
            };
            if chunks.is_empty() {
                m.worker = Some(self.env.me());
                m.lease_id = task.lease_id.clone();
                m.task_id = task.id.clone();
                m.commit = commit.to_string();
                m.pack_bytes = size;
            }
            chunks.push(m);
            if n == 0 {
                break;
            }
        }
        let reply = retrying!(self, |c| c.push_objects(tokio_stream::iter(chunks.clone())))
            .map_err(|s| s.message().to_string())?;
        eprintln!(
            "zerg-worker-agent: pushed {commit} ({size} bytes, {} objects)",
            reply.objects
        );
        Ok(())
    }

    /// Sends the task's artifacts (the files of `<log dir>/tasks/<task>/`: the agent CLI's
    /// output) to zergd, which keeps them in its own log dir, capped. A file that cannot be sent
    /// is said on stderr; the report goes on.
    pub(super) async fn push_artifacts(&mut self, task: &v1::Task) {
        let dir = self.env.log_dir.join("tasks").join(&task.id);
        let Ok(mut entries) = tokio::fs::read_dir(&dir).await else {
            return;
        };
        while let Ok(Some(e)) = entries.next_entry().await {
            if !e.file_type().await.is_ok_and(|t| t.is_file()) {
                continue;
            }
            let name = e.file_name().to_string_lossy().to_string();
            let Ok(bytes) = tokio::fs::read(e.path()).await else {
                continue;
            };
            let mut chunks: Vec<v1::ArtifactChunk> = bytes
                .chunks(PUSH_CHUNK)
                .map(|c| v1::ArtifactChunk {
                    data: c.to_vec(),
                    ..Default::default()
                })
                .collect();
            if chunks.is_empty() {
                chunks.push(v1::ArtifactChunk::default());
            }
            chunks[0].worker = Some(self.env.me());
            chunks[0].lease_id = task.lease_id.clone();
            chunks[0].task_id = task.id.clone();
            chunks[0].name = name.clone();
            if let Err(s) = retrying!(self, |c| c
                .push_artifact(tokio_stream::iter(chunks.clone())))
            {
                eprintln!("zerg-worker-agent: cannot send {name}: {}", s.message());
            }
        }
    }
}

/// A copied file's path, checked: relative, `/`-separated, plain names only, nothing in `.git`.
fn copy_path(p: &str) -> Result<std::path::PathBuf, String> {
    let ok = !p.starts_with('/')
        && p.split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && c != ".git" && !c.contains('\0'));
    if ok {
        Ok(std::path::PathBuf::from(p))
    } else {
        Err(format!("zergd named a copy at {p:?}, outside the worktree"))
    }
}

/// Creates (or truncates) a copy with `mode`, never through a symlink.
fn open_copy(path: &std::path::Path, mode: u32) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
}

/// Checks that the file being written got all its announced bytes.
fn finish_copy(current: Option<(std::fs::File, String, u64)>) -> Result<(), String> {
    match current {
        Some((_, path, left)) if left > 0 => Err(format!("{path} was cut short by {left} bytes")),
        Some((f, path, _)) => f
            .sync_all()
            .map_err(|e| format!("cannot write {path}: {e}")),
        None => Ok(()),
    }
}

/// `path` as a line of `.git/info/exclude` that matches only itself: anchored, with the
/// pattern characters escaped.
fn exclude_line(path: &str) -> String {
    let mut line = String::from("/");
    for c in path.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '!' | '#' | ' ') {
            line.push('\\');
        }
        line.push(c);
    }
    line
}

#[cfg(test)]
mod copy_tests {
    use super::*;

    #[test]
    fn copies_stay_inside_the_worktree_and_out_of_git() {
        for bad in [
            "/etc/passwd",
            "../x",
            "a/../../x",
            ".git/config",
            "a//b",
            "",
            "a/./b",
        ] {
            assert!(copy_path(bad).is_err(), "{bad:?} is refused");
        }
        assert_eq!(
            copy_path("config/.env.local").unwrap(),
            std::path::PathBuf::from("config/.env.local")
        );
        assert_eq!(exclude_line(".env"), "/.env");
        assert_eq!(exclude_line("a b/[x]*.env"), "/a\\ b/\\[x\\]\\*.env");
    }

    #[test]
    fn a_copy_replaces_a_symlink_instead_of_writing_through_it() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        std::fs::write(&outside, "keep").unwrap();
        let link = dir.path().join(".env");
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        let mut f = open_copy(&link, 0o600).unwrap();
        f.write_all(b"GREETING=hello").unwrap();
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(&link).unwrap(), "GREETING=hello");
        assert!(
            !std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
    }
}
