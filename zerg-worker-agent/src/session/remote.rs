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
