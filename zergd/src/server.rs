//! The control service (zergctl's API): thin shims that turn each RPC into a supervisor
//! command. The worker service is in [`crate::worker_plane`].

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use zerg_proto::v1;
use zerg_proto::v1::control_server::Control;

use crate::calls::{
    LandRush, NoteTask, Noted, RepoIs, RetryTasks, RushKey, StartRush, StatusQuery, StopRush,
};
use crate::logtail;
use crate::supervisor::{ControlCmd, Event, Handle};
use crate::wire::status;

/// The control service, backed by the supervisor handle.
#[derive(Clone)]
pub struct Services {
    handle: Handle,
    /// The dashboard's door, once `--http` has bound it (for `DashboardLogin`).
    door: Arc<OnceLock<Arc<crate::http::door::Door>>>,
}

/// How long finding a repository from a client's path may take before the call fails.
const RESOLVE_DEADLINE: Duration = Duration::from_secs(5);

/// Whether a path on the way to a repository is a FIFO, a socket or a device: opening it
/// could block, so a repository behind one is refused before any git code reads it.
fn special_file_on_the_way(dir: &std::path::Path) -> Option<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    for d in dir.ancestors() {
        for p in [
            d.join(".git"),
            d.join(".git/HEAD"),
            d.join(".git/config"),
            d.join(".git/commondir"),
        ] {
            if let Ok(m) = std::fs::symlink_metadata(&p) {
                let t = m.file_type();
                if t.is_fifo() || t.is_socket() || t.is_block_device() || t.is_char_device() {
                    return Some(p);
                }
            }
        }
    }
    None
}

impl Services {
    /// Services backed by a supervisor.
    pub fn new(handle: Handle) -> Self {
        Self {
            handle,
            door: Arc::default(),
        }
    }

    /// The dashboard's door, for `DashboardLogin`.
    pub fn set_door(&self, door: Arc<crate::http::door::Door>) {
        let _ = self.door.set(door);
    }

    /// The key with the repository found from the client's path, off the supervisor's thread
    /// and within [`RESOLVE_DEADLINE`]; a key already resolved or registered is left as it is.
    pub async fn resolved(&self, mut key: RushKey) -> RushKey {
        if key.repo_is != RepoIs::Given {
            return key;
        }
        let repo = key.repo.clone();
        let find = tokio::task::spawn_blocking(move || {
            if let Some(p) = special_file_on_the_way(std::path::Path::new(&repo)) {
                return Err(format!(
                    "{repo}: {} is not a regular file or directory, so zergd does not read it",
                    p.display()
                ));
            }
            crate::supervisor::jobs::resolve_repo(&repo)
                .map(|p| p.to_string_lossy().to_string())
                .map_err(|e| e.message())
        });
        key.repo_is = RepoIs::Resolved(match tokio::time::timeout(RESOLVE_DEADLINE, find).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(format!("{}: finding the repository failed", key.repo)),
            Err(_) => Err(format!(
                "{}: finding the repository took more than {}s",
                key.repo,
                RESOLVE_DEADLINE.as_secs()
            )),
        });
        key
    }

    /// The status of a rush, projected from the view the supervisor hands out (after the
    /// state it shows is on disk), without the disk usage that `Status` adds.
    pub async fn rush_status(&self, key: RushKey) -> Result<v1::RushStatus, Status> {
        let key = self.resolved(key).await;
        let (tx, rx) = tokio::sync::oneshot::channel();
        let query = StatusQuery::new(move |view| {
            let answer = view.map(|v| status::rush_status(v));
            Box::new(move || {
                let _ = tx.send(answer);
            })
        });
        self.handle
            .send(Event::Control(ControlCmd::Status(key, query)))
            .map_err(Status::from)?;
        rx.await
            .map_err(|_| Status::unavailable("the supervisor stopped before answering"))?
            .map_err(Status::from)
    }

    /// A rush's changes as they happen: the whole status first, then deltas.
    pub async fn watch_rush(
        &self,
        key: RushKey,
    ) -> Result<ReceiverStream<Result<v1::WatchEvent, Status>>, Status> {
        self.watch_with(key, true).await
    }

    async fn watch_with(
        &self,
        key: RushKey,
        deltas: bool,
    ) -> Result<ReceiverStream<Result<v1::WatchEvent, Status>>, Status> {
        let r = self.resolved(key).await;
        let (tx, rx) = mpsc::channel(64);
        let sink = Box::new(status::WatchStream::new(tx, deltas));
        self.handle
            .ask(|reply| Event::Control(ControlCmd::Watch(r, sink, reply)))
            .await?;
        Ok(ReceiverStream::new(rx))
    }

    /// Stops a rush: the number of workers signalled.
    pub async fn stop_rush(&self, mut r: StopRush) -> Result<u32, Status> {
        r.key = self.resolved(r.key).await;
        self.handle
            .ask(|tx| Event::Control(ControlCmd::Stop(r, tx)))
            .await
            .map_err(Status::from)
    }

    /// Adds the user's note to a task: what it did.
    pub async fn note_task(&self, mut r: NoteTask) -> Result<Noted, Status> {
        r.key = self.resolved(r.key).await;
        self.handle
            .ask(|tx| Event::Control(ControlCmd::Note(r, tx)))
            .await
            .map_err(Status::from)
    }

    /// Requeues failed or blocked tasks: their ids.
    pub async fn retry_tasks(&self, mut r: RetryTasks) -> Result<Vec<String>, Status> {
        r.key = self.resolved(r.key).await;
        self.handle
            .ask(|tx| Event::Control(ControlCmd::Retry(r, tx)))
            .await
            .map_err(Status::from)
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Control for Services {
    async fn rush(&self, req: Request<v1::RushRequest>) -> Result<Response<v1::RushReply>, Status> {
        let r = StartRush::try_from(req.into_inner())?;
        self.handle
            .ask(|tx| Event::Control(ControlCmd::Rush(r, tx)))
            .await
            .map(|s| Response::new(s.into()))
            .map_err(Status::from)
    }

    async fn status(
        &self,
        req: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::RushStatus>, Status> {
        let r = RushKey::try_from(req.into_inner())?;
        let mut st = self.rush_status(r).await?;
        // What the rush uses on disk, measured off the supervisor (a walk of its worktrees).
        let (repo, feature) = (PathBuf::from(&st.repo), st.feature.clone());
        st.disk = tokio::task::spawn_blocking(move || crate::disk::usage(&repo, &feature))
            .await
            .ok()
            .map(crate::wire::status::disk_usage);
        Ok(Response::new(st))
    }

    async fn list(
        &self,
        _req: Request<v1::ListRequest>,
    ) -> Result<Response<v1::ListReply>, Status> {
        let rushes = self
            .handle
            .ask(|tx| Event::Control(ControlCmd::List(tx)))
            .await
            .map_err(Status::from)?;
        Ok(Response::new(v1::ListReply {
            rushes: rushes.iter().map(status::rush_summary).collect(),
        }))
    }

    type WatchStream = ReceiverStream<Result<v1::WatchEvent, Status>>;

    async fn watch(
        &self,
        req: Request<v1::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let req = req.into_inner();
        let deltas = req.deltas;
        let r = RushKey::try_from(req)?;
        Ok(Response::new(self.watch_with(r, deltas).await?))
    }

    async fn stop(&self, req: Request<v1::StopRequest>) -> Result<Response<v1::StopReply>, Status> {
        let r = StopRush::try_from(req.into_inner())?;
        self.stop_rush(r)
            .await
            .map(|workers_signalled| Response::new(v1::StopReply { workers_signalled }))
    }

    async fn retry(
        &self,
        req: Request<v1::RetryRequest>,
    ) -> Result<Response<v1::RetryReply>, Status> {
        let r = RetryTasks::try_from(req.into_inner())?;
        self.retry_tasks(r)
            .await
            .map(|requeued| Response::new(v1::RetryReply { requeued }))
    }

    async fn note(&self, req: Request<v1::NoteRequest>) -> Result<Response<v1::NoteReply>, Status> {
        let r = NoteTask::try_from(req.into_inner())?;
        self.note_task(r).await.map(|n| Response::new(n.into()))
    }

    type LogsStream = BoxStream<v1::LogChunk>;

    async fn logs(
        &self,
        req: Request<v1::LogsRequest>,
    ) -> Result<Response<Self::LogsStream>, Status> {
        let r = req.into_inner();
        // Resolve the rush (and so its workers) through the supervisor, then read files here.
        let status = self
            .rush_status(RushKey::given(r.repo.clone(), r.feature.clone()))
            .await?;
        let log_dir = PathBuf::from(&status.repo).join(".zerg").join("logs");
        let mut ids: Vec<u32> = status
            .workers
            .keys()
            .filter_map(|k| k.parse().ok())
            .collect();
        ids.sort_unstable();
        if let Some(w) = r.worker_id {
            if !ids.contains(&w) {
                return Err(Status::not_found(format!(
                    "rush {} has no worker {w} (workers: {ids:?})",
                    status.feature
                )));
            }
            ids = vec![w];
        }
        let (tx, rx) = mpsc::channel(256);
        let tail = if r.tail == 0 { 100 } else { r.tail as usize }.min(10_000);
        tokio::spawn(async move {
            // Reads happen on the blocking pool, a bounded chunk at a time.
            let read = |path: PathBuf, follower: Option<logtail::Follower>| {
                tokio::task::spawn_blocking(move || {
                    let mut f = std::fs::File::open(&path)?;
                    match follower {
                        None => {
                            let (lines, end) = logtail::tail(&mut f, tail)?;
                            Ok::<_, std::io::Error>((lines, logtail::Follower::at(end)))
                        }
                        Some(mut fol) => Ok((fol.read_new(&mut f)?, fol)),
                    }
                })
            };
            // Lines go out in batches of up to 512 (and about 256 KiB): a log of millions of
            // short lines is not millions of messages.
            let send = |w: u32, lines: Vec<String>| {
                let tx = tx.clone();
                async move {
                    let mut batch: Vec<String> = Vec::new();
                    let mut bytes = 0;
                    let mut it = lines.into_iter().peekable();
                    while let Some(l) = it.next() {
                        bytes += l.len() + 1;
                        batch.push(l);
                        if batch.len() >= 512 || bytes >= 256 << 10 || it.peek().is_none() {
                            let lines = std::mem::take(&mut batch);
                            bytes = 0;
                            let chunk = v1::LogChunk {
                                worker_id: w,
                                line: lines.join("\n"),
                                lines,
                            };
                            if tx.send(Ok(chunk)).await.is_err() {
                                return false;
                            }
                        }
                    }
                    true
                }
            };
            let mut followers = Vec::new();
            for w in &ids {
                let path = log_dir.join(format!("worker-{w}.log"));
                let (lines, fol) = match read(path.clone(), None).await {
                    Ok(Ok(x)) => x,
                    _ => (Vec::new(), logtail::Follower::at(0)),
                };
                if !send(*w, lines).await {
                    return;
                }
                followers.push((*w, path, Some(fol)));
            }
            if !r.follow {
                return;
            }
            loop {
                let mut more = false;
                for (w, path, fol) in followers.iter_mut() {
                    let Some(f) = fol.take() else { continue };
                    let (lines, f) = match read(path.clone(), Some(f)).await {
                        Ok(Ok(x)) => x,
                        // Not there (yet): start from its beginning once it is.
                        _ => (Vec::new(), logtail::Follower::at(0)),
                    };
                    more |= !lines.is_empty();
                    *fol = Some(f);
                    if !send(*w, lines).await {
                        return;
                    }
                }
                if tx.is_closed() {
                    return;
                }
                if !more {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn prune(
        &self,
        req: Request<v1::PruneRequest>,
    ) -> Result<Response<v1::PruneReply>, Status> {
        let r = req.into_inner().into();
        self.handle
            .ask(|tx| Event::Control(ControlCmd::Prune(r, tx)))
            .await
            .map(|report| Response::new(report.into()))
            .map_err(Status::from)
    }

    async fn land(&self, req: Request<v1::LandRequest>) -> Result<Response<v1::LandReply>, Status> {
        let r = LandRush::try_from(req.into_inner())?;
        self.handle
            .ask(|tx| Event::Control(ControlCmd::Land(r, tx)))
            .await
            .map(|landed| Response::new(landed.into()))
            .map_err(Status::from)
    }

    async fn dashboard_login(
        &self,
        _req: Request<v1::DashboardLoginRequest>,
    ) -> Result<Response<v1::DashboardLoginReply>, Status> {
        let door = self.door.get().ok_or_else(|| {
            Status::failed_precondition(
                "zergd serves no dashboard: start it with --http 127.0.0.1:7878 (or set ZERG_HTTP)",
            )
        })?;
        let code = door
            .login_code(std::time::Instant::now())
            .map_err(|e| Status::internal(format!("cannot make a login code: {e}")))?;
        let url = door.url();
        Ok(Response::new(v1::DashboardLoginReply {
            login_url: format!("{url}?login={code}"),
            url,
        }))
    }

    async fn shutdown(
        &self,
        _req: Request<v1::ShutdownRequest>,
    ) -> Result<Response<v1::ShutdownReply>, Status> {
        self.handle
            .ask(|tx| Event::Control(ControlCmd::Shutdown(tx)))
            .await
            .map(|()| Response::new(v1::ShutdownReply {}))
            .map_err(Status::from)
    }
}
