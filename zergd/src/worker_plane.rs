//! The worker plane: the `Worker` gRPC service on sockets of its own, and the tokens that say
//! which worker is calling.
//!
//! zergd serves the control plane (`Control`, for zergctl) on its control socket, which only its
//! owner can open and which is never mounted into a container. Workers talk to one socket per
//! rush instead, `<control socket dir>/w/<id>/worker.sock`, which serves `Worker` and nothing
//! else. Its directory holds only that socket, so container mode mounts the directory and no path
//! inside a container leads to the control socket.
//!
//! Every spawn gets a fresh random 256-bit [`crate::launcher::WorkerToken`], bound to the rush,
//! the worker slot and the spawn generation. It reaches the worker through its environment
//! ([`zerg_proto::contract::env::WORKER_TOKEN`]) and must come back on every RPC as
//! `authorization: Bearer <token>`. zergd keeps only its SHA-256 in the state file, so workers
//! can still be re-adopted after a restart; the token itself is never logged nor persisted. The
//! protocol does not depend on the transport: the same token check works for a worker that
//! reaches zergd over TCP.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use tokio::net::UnixListener;
use tokio_stream::StreamExt;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status, Streaming};
use zerg_proto::v1;
use zerg_proto::v1::worker_server::{Worker, WorkerServer};

use crate::calls::{
    BasePack, Beat, Caller, Completion, EscalationReport, Failure, LeaseFiles, LeaseRef, Register,
    WorkerAuth,
};
use crate::error::SupervisorError;
use crate::incoming::Seen;
use crate::launcher::PLANE_SOCKET_NAME;
use crate::launcher::token::{hash_token, hex};
use crate::supervisor::{Event, Handle, PlaneServer, WorkerCmd};
use crate::transfers::{Kind, Place, STREAM_IDLE, Transfers};
use crate::wire::worker::lease_caller;

/// Largest message a worker may send (a completion with many tier results is a few KiB).
const MAX_WORKER_MESSAGE: usize = 1 << 20;

/// Who is calling: the rush the call came in for and the SHA-256 of the token it carried
/// (`authorization: Bearer <token>`; none, or one over 256 bytes, counts as none).
pub fn auth_from_metadata(rush_id: &str, md: &MetadataMap) -> WorkerAuth {
    let token = md
        .get(zerg_proto::contract::TOKEN_METADATA)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty() && t.len() <= 256);
    WorkerAuth {
        rush_id: rush_id.to_string(),
        token_sha256: token.map(hash_token),
    }
}

/// The worker planes of a zergd whose control socket is `control_socket`: each rush's socket in
/// `w/` beside it, and the TCP plane of remote workers.
/// Every plane shares one [`Transfers`]: the bounds on streams hold over all of them.
#[derive(Debug, Clone)]
pub struct Planes {
    control_socket: PathBuf,
    transfers: Arc<Transfers>,
}

impl Planes {
    /// The planes beside `control_socket`.
    pub fn beside(control_socket: &Path) -> Self {
        Self {
            control_socket: control_socket.to_path_buf(),
            transfers: Transfers::new(
                crate::transfers::MAX_STREAMS,
                crate::transfers::pack_work_limit(),
            ),
        }
    }
}

impl PlaneServer for Planes {
    fn serve(&self, rush_id: &str, handle: Handle) -> std::io::Result<tokio::task::JoinHandle<()>> {
        serve(
            &self.control_socket,
            rush_id,
            handle,
            self.transfers.clone(),
        )
    }

    fn serve_tcp(
        &self,
        listen: &str,
        tls: &crate::remote::PlaneTls,
        limits: crate::incoming::Limits,
        handle: Handle,
    ) -> std::io::Result<tokio::task::JoinHandle<()>> {
        serve_tcp(listen, tls, limits, handle, self.transfers.clone())
    }

    fn socket(&self, rush_id: &str) -> PathBuf {
        plane_socket(&self.control_socket, rush_id)
    }

    fn remove(&self, rush_id: &str) {
        self.transfers.forget(rush_id);
        let _ = std::fs::remove_dir_all(plane_dir(&self.control_socket, rush_id));
    }
}

/// The directory of a rush's worker-plane socket, beside the control socket:
/// `<dir>/w/<16 hex digits of the rush id's SHA-256>` (short, so the socket path stays within
/// the 108 bytes a Unix socket path may have).
pub fn plane_dir(control_socket: &Path, rush_id: &str) -> PathBuf {
    let dir = control_socket.parent().unwrap_or(Path::new("."));
    let id = hex(&Sha256::digest(rush_id.as_bytes()));
    dir.join("w").join(&id[..16])
}

/// The worker-plane socket of a rush.
pub fn plane_socket(control_socket: &Path, rush_id: &str) -> PathBuf {
    plane_dir(control_socket, rush_id).join(PLANE_SOCKET_NAME)
}

/// Binds a rush's worker-plane socket (mode 0600, in a 0700 directory that holds nothing else)
/// and serves the `Worker` service on it until the returned task is aborted, within
/// [`crate::incoming::Limits`]: a few connections per worker, a fixed number in all, and
/// silent connections closed. The directory is
/// kept across restarts, so containers that mounted it see the new socket.
pub fn serve(
    control_socket: &Path,
    rush_id: &str,
    handle: Handle,
    transfers: Arc<Transfers>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let dir = plane_dir(control_socket, rush_id);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    // Anything else in the directory would be visible inside every container of the rush.
    for entry in std::fs::read_dir(&dir)?.flatten() {
        let p = entry.path();
        if entry.file_name() != PLANE_SOCKET_NAME {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let _ = std::fs::remove_dir_all(&p);
            } else {
                let _ = std::fs::remove_file(&p);
            }
        }
    }
    let socket = dir.join(PLANE_SOCKET_NAME);
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket)?;
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o600))?;
    let svc = PlaneService {
        rush_id: Some(rush_id.to_string()),
        handle,
        transfers,
    };
    let server = WorkerServer::new(svc)
        .max_decoding_message_size(MAX_WORKER_MESSAGE)
        .max_encoding_message_size(16 * MAX_WORKER_MESSAGE);
    let rid = rush_id.to_string();
    let limits = crate::incoming::Limits::default();
    Ok(tokio::spawn(async move {
        let r = tonic::transport::Server::builder()
            // Pings keep a live client's connection from counting as idle.
            .http2_keepalive_interval(Some(limits.idle / 4))
            .http2_keepalive_timeout(Some(limits.idle / 4))
            .max_concurrent_streams(Some(MAX_CALLS_PER_CONNECTION))
            .add_service(server)
            .serve_with_incoming(crate::incoming::bounded(
                crate::incoming::UnixPeers::new(listener),
                limits,
            ))
            .await;
        if let Err(e) = r {
            tracing::error!(rush = %rid, error = %e, "worker plane stopped");
        }
    }))
}

/// How often the TCP plane pings an idle connection, and how long it waits for the answer.
const TCP_KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(20);

/// Serves the `Worker` service of every remote rush on `listen` (TCP, `host:port`) over TLS
/// with `tls` until the returned task is aborted. Calls are routed by the rush they name.
/// Connections are bounded by `limits` before the TLS handshake ([`crate::incoming`]): per
/// peer address and in all, with the handshake and the first call with a valid token due
/// within `limits.handshake`.
pub fn serve_tcp(
    listen: &str,
    tls: &crate::remote::PlaneTls,
    limits: crate::incoming::Limits,
    handle: Handle,
    transfers: Arc<Transfers>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    use tonic::transport::{Identity, ServerTlsConfig};
    let std_listener = std::net::TcpListener::bind(listen)?;
    std_listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(std_listener)?;
    let identity = Identity::from_pem(&tls.cert_pem, &tls.key_pem);
    let mut builder = tonic::transport::Server::builder()
        .tls_config(
            ServerTlsConfig::new()
                .identity(identity)
                .timeout(limits.handshake),
        )
        .map_err(std::io::Error::other)?
        .http2_keepalive_interval(Some(TCP_KEEPALIVE))
        .http2_keepalive_timeout(Some(TCP_KEEPALIVE))
        .max_concurrent_streams(Some(MAX_CALLS_PER_CONNECTION));
    let server = WorkerServer::new(PlaneService {
        rush_id: None,
        handle,
        transfers,
    })
    .max_decoding_message_size(MAX_WORKER_MESSAGE)
    .max_encoding_message_size(16 * MAX_WORKER_MESSAGE);
    let incoming = crate::incoming::bounded(listener, limits);
    let addr = listen.to_string();
    Ok(tokio::spawn(async move {
        if let Err(e) = builder
            .add_service(server)
            .serve_with_incoming(incoming)
            .await
        {
            tracing::error!(listen = %addr, error = %e, "TCP worker plane stopped");
        }
    }))
}

/// The `Worker` service: of one rush on its Unix socket, or of every remote rush on the TCP
/// plane, where a call is routed by the rush it names (its token must then belong to that rush's
/// slot and generation, as everywhere).
#[derive(Clone)]
struct PlaneService {
    /// The rush whose socket this is; `None` on the TCP plane.
    rush_id: Option<String>,
    handle: Handle,
    transfers: Arc<Transfers>,
}

/// The connection a request came on, so that a call the token checked out for can vouch for
/// it ([`crate::incoming::Seen`]).
fn seen<T>(req: &Request<T>) -> Option<Seen> {
    req.extensions().get::<Seen>().cloned().or_else(|| {
        req.extensions()
            .get::<tonic::transport::server::TlsConnectInfo<Seen>>()
            .map(|t| t.get_ref().clone())
    })
}

fn vouch(seen: &Option<Seen>) {
    if let Some(s) = seen {
        s.vouch();
    }
}

/// The next message of a worker's stream: ended by zergd when the worker sends nothing for
/// [`STREAM_IDLE`], or when a newer stream of the same worker and kind replaced this one.
async fn next_message<T>(
    stream: &mut Streaming<T>,
    place: &mut Place,
) -> Result<Option<T>, Status> {
    tokio::select! {
        m = tokio::time::timeout(STREAM_IDLE, stream.message()) => match m {
            Ok(m) => m,
            Err(_) => Err(Status::deadline_exceeded(format!(
                "the worker sent nothing for {} s",
                STREAM_IDLE.as_secs()
            ))),
        },
        _ = &mut place.replaced => Err(Status::aborted(
            "a newer stream of this worker replaced this one",
        )),
    }
}

impl PlaneService {
    /// Who is calling: the rush of the socket (or, on the TCP plane, the one the call names)
    /// and the token it carried.
    fn auth(&self, md: &MetadataMap, claimed: &str) -> WorkerAuth {
        auth_from_metadata(self.rush_id.as_deref().unwrap_or(claimed), md)
    }

    /// Checks the request at the edge, hands it to the supervisor with who sent it, and turns
    /// the answer into the reply message.
    async fn call<T, D, R, W>(
        &self,
        req: Request<T>,
        convert: impl FnOnce(T) -> Result<D, SupervisorError>,
        make: impl FnOnce(D, crate::supervisor::Reply<R>) -> WorkerCmd,
        reply: impl FnOnce(R) -> W,
    ) -> Result<Response<W>, Status> {
        let md = req.metadata().clone();
        let seen = seen(&req);
        let r = convert(req.into_inner())?;
        let out = self
            .handle
            .ask(|tx| {
                let cmd = make(r, tx);
                Event::Worker(self.auth(&md, &cmd.caller().rush_id), cmd)
            })
            .await
            .map(|r| Response::new(reply(r)))
            .map_err(Status::from)?;
        vouch(&seen);
        Ok(out)
    }

    /// Where the lease's files go and how large a push may be: the caller must hold the lease.
    /// A call that passes vouches for its connection.
    async fn lease_files(
        &self,
        md: &MetadataMap,
        seen: &Option<Seen>,
        caller: Caller,
        lease: LeaseRef,
    ) -> Result<LeaseFiles, Status> {
        let auth = self.auth(md, &caller.rush_id);
        let files = self
            .handle
            .ask(|tx| Event::Worker(auth, WorkerCmd::LeaseFiles(caller, lease, tx)))
            .await
            .map_err(Status::from)?;
        vouch(seen);
        Ok(files)
    }

    /// Refuses a push: the rush's events say why, and so does the answer.
    async fn refuse_push(
        &self,
        md: &MetadataMap,
        caller: Caller,
        lease: LeaseRef,
        why: String,
    ) -> Status {
        tracing::warn!(worker = caller.worker, task = %lease.task_id, reason = %why, "pack refused");
        let auth = self.auth(md, &caller.rush_id);
        let msg = format!("pack refused: {why}");
        let _ = self
            .handle
            .ask(|tx| Event::Worker(auth, WorkerCmd::PushRefused(caller, lease, why, tx)))
            .await;
        Status::failed_precondition(msg)
    }
}

/// One egress connection, from its first bytes to its end: reads the request head (at most
/// [`crate::egress::MAX_HEAD`] bytes, within [`STREAM_IDLE`]), judges its host against
/// `allow` (telling `report` of a refusal, and of a setup command let through by
/// `sandbox.setup_allow_hosts`), then relays both ways until either side closes.
async fn relay<F, Fut>(
    mut stream: Streaming<v1::EgressChunk>,
    mut buf: Vec<u8>,
    allow: (Vec<String>, Vec<String>),
    setup: bool,
    tx: tokio::sync::mpsc::Sender<Result<v1::EgressChunk, Status>>,
    report: F,
) where
    F: Fn(crate::calls::EgressReport) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    use crate::egress;
    let answer = |bytes: Vec<u8>| v1::EgressChunk {
        data: bytes,
        ..Default::default()
    };
    let end = loop {
        if let Some(end) = egress::head_end(&buf) {
            break end;
        }
        if buf.len() > egress::MAX_HEAD {
            let _ = tx
                .send(Ok(answer(egress::refusal(
                    "431 Request Header Fields Too Large",
                    "the request head is too large",
                ))))
                .await;
            return;
        }
        match tokio::time::timeout(STREAM_IDLE, stream.message()).await {
            Ok(Ok(Some(m))) => buf.extend_from_slice(&m.data),
            _ => return,
        }
    };
    let rest = buf.split_off(end);
    let req = match egress::parse(&buf) {
        Ok(r) => r,
        Err(why) => {
            let _ = tx
                .send(Ok(answer(egress::refusal("400 Bad Request", &why))))
                .await;
            return;
        }
    };
    let target = req.target();
    let (host, port) = match &req {
        egress::Request::Connect { host, port } | egress::Request::Plain { host, port, .. } => {
            (host.clone(), *port)
        }
    };
    let (allow, setup_hosts) = allow;
    if !zerg_sandbox::hosts::allowed(&allow, &host, port) {
        let by_setup = setup && zerg_sandbox::hosts::allowed(&setup_hosts, &host, port);
        report(crate::calls::EgressReport {
            host: target.clone(),
            setup,
            refused: !by_setup,
        })
        .await;
        if !by_setup {
            let key = if setup {
                "sandbox.allow_hosts or sandbox.setup_allow_hosts"
            } else {
                "sandbox.allow_hosts"
            };
            let why = format!(
                "{target} is not in the sandbox's allow list: add it to {key} in .zerg/config.yaml"
            );
            let _ = tx
                .send(Ok(answer(egress::refusal("403 Forbidden", &why))))
                .await;
            return;
        }
    }
    let up = match egress::connect(&req).await {
        Ok(s) => s,
        Err(why) => {
            tracing::debug!(target = %target, reason = %why, "egress: upstream unreachable");
            // A tunnel that cannot be made is a proxy error the client reads as one; a plain
            // request is closed unanswered, as the host itself would have refused it, so the
            // agent CLI sees a connection that failed, not an answer of the API's.
            if matches!(req, egress::Request::Connect { .. }) {
                let _ = tx
                    .send(Ok(answer(egress::refusal("502 Bad Gateway", &why))))
                    .await;
            }
            return;
        }
    };
    let (up_r, mut up_w) = up.into_split();
    let first = match req {
        egress::Request::Connect { .. } => {
            if tx
                .send(Ok(answer(
                    b"HTTP/1.1 200 Connection Established\r\n\r\n".to_vec(),
                )))
                .await
                .is_err()
            {
                return;
            }
            rest
        }
        egress::Request::Plain { mut head, .. } => {
            head.extend_from_slice(&rest);
            head
        }
    };
    if !first.is_empty() && !egress::write_up(&mut up_w, &first).await {
        return;
    }
    let down = tokio::spawn(egress::pump_up(up_r, tx));
    while let Ok(Some(m)) = stream.message().await {
        if !egress::write_up(&mut up_w, &m.data).await {
            break;
        }
    }
    let _ = tokio::io::AsyncWriteExt::shutdown(&mut up_w).await;
    let _ = down.await;
}

/// One artifact of a remote worker being written under `.zerg/logs/tasks/<task>/`: at most
/// `cap` bytes are kept, then a line saying how much was sent and which cap (`cut_by`, a
/// config key) stopped it.
struct Artifact {
    file: std::fs::File,
    kept: u64,
    sent: u64,
    cap: u64,
    cut_by: &'static str,
}

impl Artifact {
    /// Creates (or truncates) `dir/name`, never through a symlink.
    fn create(dir: &Path, name: &str, cap: u64, cut_by: &'static str) -> std::io::Result<Artifact> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::create_dir_all(dir)?;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(dir.join(name))?;
        Ok(Artifact {
            file,
            kept: 0,
            sent: 0,
            cap,
            cut_by,
        })
    }

    fn write(&mut self, data: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        self.sent += data.len() as u64;
        let room = self.cap.saturating_sub(self.kept) as usize;
        let take = &data[..data.len().min(room)];
        self.file.write_all(take)?;
        self.kept += take.len() as u64;
        Ok(())
    }

    fn finish(mut self) -> std::io::Result<()> {
        use std::io::Write;
        if self.sent > self.kept {
            writeln!(
                self.file,
                "\n[zerg: the worker sent {} bytes; the first {} are kept ({})]",
                self.sent, self.kept, self.cut_by
            )?;
        }
        Ok(())
    }
}

/// Sends `files` of `repo` as `CopyChunk`s: each file's first message names it with its mode
/// and size, the rest carry data, at most [`PACK_CHUNK`] bytes each. A file that changed size
/// since it was listed is sent as it is now. Ends when the worker has read nothing for
/// [`STREAM_IDLE`] or opened a newer `FetchCopies`.
async fn send_copies(
    repo: PathBuf,
    files: Vec<crate::worktree_copy::CopiedFile>,
    mut place: Place,
    tx: tokio::sync::mpsc::Sender<Result<v1::CopyChunk, Status>>,
) {
    use tokio::io::AsyncReadExt;
    for f in files {
        let opened = async {
            let file = tokio::fs::File::open(repo.join(&f.path)).await?;
            let meta = file.metadata().await?;
            Ok::<_, std::io::Error>((file, meta))
        }
        .await;
        let (file, meta) = match opened {
            Ok(x) => x,
            Err(e) => {
                let _ = tx
                    .send(Err(Status::failed_precondition(format!(
                        "worktree.copy: cannot read {}: {e}",
                        f.path
                    ))))
                    .await;
                return;
            }
        };
        let size = meta.len();
        let mut file = file.take(size);
        let mut first = Some(v1::CopyChunk {
            path: f.path.clone(),
            mode: meta.permissions().mode() & 0o777,
            size,
            data: Vec::new(),
        });
        let mut sent = 0u64;
        loop {
            let mut buf = Vec::with_capacity(PACK_CHUNK);
            let n = match (&mut file)
                .take(PACK_CHUNK as u64)
                .read_to_end(&mut buf)
                .await
            {
                Ok(n) => n as u64,
                Err(e) => {
                    let _ = tx.send(Err(Status::internal(e.to_string()))).await;
                    return;
                }
            };
            if n == 0 && first.is_none() {
                break;
            }
            let mut msg = first.take().unwrap_or_default();
            sent += n;
            if n == 0 && sent < size {
                // The file shrank since it was opened: say so rather than send a short copy.
                let _ = tx
                    .send(Err(Status::aborted(format!(
                        "worktree.copy: {} changed while it was sent",
                        f.path
                    ))))
                    .await;
                return;
            }
            msg.data = buf;
            tokio::select! {
                r = tx.send_timeout(Ok(msg), STREAM_IDLE) => if r.is_err() { return },
                _ = &mut place.replaced => return,
            }
            if sent >= size {
                break;
            }
        }
    }
}

/// Streams (calls) one connection may have open at once.
const MAX_CALLS_PER_CONNECTION: u32 = 32;

/// Bytes per message of a pack on the wire.
const PACK_CHUNK: usize = 256 * 1024;

fn ack(_: ()) -> v1::Ack {
    v1::Ack {}
}

#[tonic::async_trait]
impl Worker for PlaneService {
    async fn register(
        &self,
        req: Request<v1::RegisterRequest>,
    ) -> Result<Response<v1::RegisterReply>, Status> {
        self.call(req, Register::try_from, WorkerCmd::Register, Into::into)
            .await
    }

    async fn lease(
        &self,
        req: Request<v1::LeaseRequest>,
    ) -> Result<Response<v1::LeaseReply>, Status> {
        self.call(req, lease_caller, WorkerCmd::Lease, Into::into)
            .await
    }

    async fn heartbeat(
        &self,
        req: Request<Streaming<v1::HeartbeatRequest>>,
    ) -> Result<Response<v1::HeartbeatReply>, Status> {
        let md = req.metadata().clone();
        let seen = seen(&req);
        let mut stream = req.into_inner();
        while let Some(msg) = stream.next().await {
            let beat = Beat::try_from(msg?)?;
            // At most one beat per BEAT_GAP per connection: a worker cannot keep the
            // supervisor busy with beats.
            if let Some(s) = &seen {
                tokio::time::sleep_until(s.beat_turn()).await;
            }
            let a = self.auth(&md, &beat.caller.rush_id);
            self.handle
                .ask(|tx| Event::Worker(a, WorkerCmd::Heartbeat(beat, tx)))
                .await
                .map_err(Status::from)?;
            vouch(&seen);
        }
        Ok(Response::new(v1::HeartbeatReply {}))
    }

    async fn complete(
        &self,
        req: Request<v1::CompleteRequest>,
    ) -> Result<Response<v1::Ack>, Status> {
        // The commit is checked (a container's objects imported first) with git work that
        // takes its turn like a pack's.
        let _turn = self.transfers.pack_work().await;
        self.call(req, Completion::try_from, WorkerCmd::Complete, ack)
            .await
    }

    async fn fail(&self, req: Request<v1::FailRequest>) -> Result<Response<v1::Ack>, Status> {
        // A checkpoint's commit is checked like a completion's.
        let _turn = if req.get_ref().checkpoint_commit.is_empty() {
            None
        } else {
            Some(self.transfers.pack_work().await)
        };
        self.call(req, Failure::try_from, WorkerCmd::Fail, ack)
            .await
    }

    async fn escalate(
        &self,
        req: Request<v1::EscalateRequest>,
    ) -> Result<Response<v1::Ack>, Status> {
        self.call(req, EscalationReport::try_from, WorkerCmd::Escalate, ack)
            .await
    }

    type FetchBaseStream = tokio_stream::wrappers::ReceiverStream<Result<v1::PackChunk, Status>>;

    /// Sends the lease's base as a pack. The caller's lease is checked first; then the stream
    /// takes its place ([`Transfers::open`]), waits for a turn to build the pack, and feeds it
    /// from an async task that gives up when the worker has read nothing for
    /// [`STREAM_IDLE`] or opened a newer `FetchBase`.
    async fn fetch_base(
        &self,
        req: Request<v1::FetchBaseRequest>,
    ) -> Result<Response<Self::FetchBaseStream>, Status> {
        let md = req.metadata().clone();
        let seen = seen(&req);
        let (caller, lease, haves) = crate::wire::worker::fetch_request(req.into_inner())?;
        self.lease_files(&md, &seen, caller.clone(), lease.clone())
            .await?;
        let mut place = self
            .transfers
            .open(&caller.rush_id, caller.worker, Kind::Fetch)
            .await?;
        let auth = self.auth(&md, &caller.rush_id);
        let built = {
            let _turn = tokio::select! {
                t = self.transfers.pack_work() => t,
                _ = &mut place.replaced => return Err(Status::aborted(
                    "a newer FetchBase of this worker replaced this one",
                )),
            };
            self.handle
                .ask(|tx| Event::Worker(auth, WorkerCmd::FetchBase(caller, lease, haves, tx)))
                .await
                .map_err(Status::from)?
        };
        let BasePack {
            file,
            shallow,
            sha256,
            size,
        } = built;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncSeekExt};
            let mut place = place;
            let mut file = tokio::fs::File::from_std(file);
            let mut first = Some(v1::PackChunk {
                object_format: if sha256 { "sha256" } else { "sha1" }.into(),
                shallow,
                pack_bytes: size,
                data: Vec::new(),
            });
            if let Err(e) = file.rewind().await {
                let _ = tx.try_send(Err(Status::internal(e.to_string())));
                return;
            }
            loop {
                let mut buf = Vec::with_capacity(PACK_CHUNK);
                let n = match (&mut file)
                    .take(PACK_CHUNK as u64)
                    .read_to_end(&mut buf)
                    .await
                {
                    Ok(n) => n,
                    Err(e) => {
                        let _ = tx.try_send(Err(Status::internal(e.to_string())));
                        return;
                    }
                };
                if n == 0 && first.is_none() {
                    return;
                }
                let mut msg = first.take().unwrap_or_default();
                msg.data = buf;
                // A worker that reads nothing for a while, or that opened a newer FetchBase,
                // loses this stream: it holds a task and a file, never a thread.
                tokio::select! {
                    sent = tx.send_timeout(Ok(msg), STREAM_IDLE) => {
                        if sent.is_err() {
                            return;
                        }
                    }
                    _ = &mut place.replaced => return,
                }
                if n == 0 {
                    return;
                }
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    type FetchCopiesStream = tokio_stream::wrappers::ReceiverStream<Result<v1::CopyChunk, Status>>;

    /// Sends the ignored files of the user's checkout that `worktree.copy` names, listed and
    /// capped (`worktree.copy_max_mb`) as at rush start, for a remote worker's new workspace.
    /// The caller's lease is checked first; the files are read one chunk at a time by a task
    /// that gives up when the worker reads nothing for [`STREAM_IDLE`] or opens a newer one.
    async fn fetch_copies(
        &self,
        req: Request<v1::FetchBaseRequest>,
    ) -> Result<Response<Self::FetchCopiesStream>, Status> {
        let md = req.metadata().clone();
        let seen = seen(&req);
        let (caller, lease, _) = crate::wire::worker::fetch_request(req.into_inner())?;
        let files = self.lease_files(&md, &seen, caller.clone(), lease).await?;
        let place = self
            .transfers
            .open(&caller.rush_id, caller.worker, Kind::Copies)
            .await?;
        let (repo, cfg) = (files.repo, files.worktree);
        let listed = tokio::task::spawn_blocking(move || {
            let list = crate::worktree_copy::list(&repo, &cfg.copy)?;
            crate::worktree_copy::check_size(&list, cfg.copy_max_mb)?;
            Ok::<_, String>((repo, list))
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?;
        let (repo, list) = listed.map_err(Status::failed_precondition)?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(send_copies(repo, list, place, tx));
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    /// Keeps an artifact of the caller's lease under `.zerg/logs/tasks/<task>/`, within the
    /// artifact caps ([`crate::transfers::ArtifactCaps`]); one over a cap is refused, with a
    /// `push_refused` event naming the cap.
    async fn push_artifact(
        &self,
        req: Request<Streaming<v1::ArtifactChunk>>,
    ) -> Result<Response<v1::Ack>, Status> {
        let md = req.metadata().clone();
        let seen = seen(&req);
        let mut stream = req.into_inner();
        let mut first = tokio::time::timeout(STREAM_IDLE, stream.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no first message"))??
            .ok_or_else(|| Status::invalid_argument("an artifact needs a first message"))?;
        let (caller, lease, name) = crate::wire::worker::artifact_header(&mut first)?;
        let files = self
            .lease_files(&md, &seen, caller.clone(), lease.clone())
            .await?;
        let mut place = self
            .transfers
            .open(&caller.rush_id, caller.worker, Kind::Artifact)
            .await?;
        let (rush, lease_id) = (caller.rush_id.clone(), lease.lease_id.clone());
        let reserved = match self
            .transfers
            .reserve_artifact(&rush, &lease_id, &files.artifact_caps)
        {
            Ok(r) => r,
            Err(why) => {
                let why = format!("artifact {name}: {why}");
                let st = self.refuse_push(&md, caller, lease, why).await;
                return Err(Status::resource_exhausted(st.message().to_string()));
            }
        };
        let cut_by = reserved.cut_by.unwrap_or("container.log_max_size");
        let keep = |e: std::io::Error| Status::internal(format!("cannot keep {name}: {e}"));
        let written = async {
            let mut out =
                Artifact::create(&files.artifacts, &name, reserved.bytes, cut_by).map_err(keep)?;
            let mut data = first.data;
            loop {
                out.write(&data).map_err(keep)?;
                match next_message(&mut stream, &mut place).await? {
                    Some(m) => data = m.data,
                    None => break,
                }
            }
            let (kept, sent) = (out.kept, out.sent);
            out.finish().map_err(keep)?;
            Ok::<_, Status>((kept, sent))
        }
        .await;
        let kept = written.as_ref().map_or(0, |(k, _)| *k);
        self.transfers
            .unreserve(&rush, &lease_id, reserved.bytes.saturating_sub(kept));
        let (kept, sent) = written?;
        if sent > kept && reserved.cut_by.is_some() {
            let why = format!("artifact {name}: {sent} bytes sent, {kept} kept ({cut_by})");
            let _ = self.refuse_push(&md, caller, lease, why).await;
        }
        Ok(Response::new(v1::Ack {}))
    }

    type EgressStream = tokio_stream::wrappers::ReceiverStream<Result<v1::EgressChunk, Status>>;

    /// One connection of a confined worker through the egress proxy: its request is read and
    /// judged here against the rush's allow list (see [`crate::egress`]), then connected and
    /// relayed, or answered `403` and reported.
    async fn egress(
        &self,
        req: Request<Streaming<v1::EgressChunk>>,
    ) -> Result<Response<Self::EgressStream>, Status> {
        let md = req.metadata().clone();
        let seen = seen(&req);
        let mut stream = req.into_inner();
        let mut first = tokio::time::timeout(STREAM_IDLE, stream.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no first message"))??
            .ok_or_else(|| Status::invalid_argument("an egress stream needs a first message"))?;
        let caller = crate::wire::worker::egress_caller(&mut first)?;
        let setup = first.setup;
        let auth = self.auth(&md, &caller.rush_id);
        let c = caller.clone();
        let allow = self
            .handle
            .ask(|tx| Event::Worker(auth, WorkerCmd::Egress(c, setup, tx)))
            .await
            .map_err(Status::from)?;
        vouch(&seen);
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let handle = self.handle.clone();
        let auth = self.auth(&md, &caller.rush_id);
        tokio::spawn(async move {
            relay(stream, first.data, allow, setup, tx, move |report| {
                let c = caller.clone();
                let auth = auth.clone();
                let handle = handle.clone();
                async move {
                    let _ = handle
                        .ask(|tx| Event::Worker(auth, WorkerCmd::EgressSeen(c, report, tx)))
                        .await;
                }
            })
            .await
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    /// Receives a pack of the caller's lease into a spool file, then has it indexed and
    /// checked in quarantine (one pack at a time per worker, within the plane's bounds).
    async fn push_objects(
        &self,
        req: Request<Streaming<v1::PushChunk>>,
    ) -> Result<Response<v1::PushReply>, Status> {
        use std::io::{Seek, Write};
        let md = req.metadata().clone();
        let seen = seen(&req);
        let mut stream = req.into_inner();
        let first = tokio::time::timeout(STREAM_IDLE, stream.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no first message"))??
            .ok_or_else(|| Status::invalid_argument("a push needs a first message"))?;
        let head = crate::wire::worker::PushHeader::try_from(first)?;
        let (caller, lease) = (head.caller.clone(), head.lease.clone());
        let max = self
            .lease_files(&md, &seen, caller.clone(), lease.clone())
            .await?
            .max_pack;
        if head.size > max {
            let why = format!(
                "the pack's {} bytes are more than the {max} bytes allowed",
                head.size
            );
            return Err(self.refuse_push(&md, caller, lease, why).await);
        }
        let mut place = self
            .transfers
            .open(&caller.rush_id, caller.worker, Kind::Push)
            .await?;
        let mut file = tempfile::tempfile().map_err(|e| Status::internal(format!("spool: {e}")))?;
        let mut got = 0u64;
        let mut data = head.data;
        loop {
            got += data.len() as u64;
            if got > head.size {
                let why = format!("more data than the {} bytes announced", head.size);
                return Err(self.refuse_push(&md, caller, lease, why).await);
            }
            file.write_all(&data)
                .map_err(|e| Status::internal(format!("spool: {e}")))?;
            match next_message(&mut stream, &mut place).await? {
                Some(m) => data = m.data,
                None => break,
            }
        }
        if got != head.size {
            let why = format!("{got} bytes of the {} announced", head.size);
            return Err(self.refuse_push(&md, caller, lease, why).await);
        }
        file.rewind()
            .map_err(|e| Status::internal(format!("spool: {e}")))?;
        let auth = self.auth(&md, &caller.rush_id);
        let (c, l, commit) = (caller.clone(), lease.clone(), head.commit);
        let done = {
            let _turn = self.transfers.pack_work().await;
            self.handle
                .ask(|tx| Event::Worker(auth, WorkerCmd::PushObjects(c, l, commit, file, tx)))
                .await
                .map_err(Status::from)?
        };
        drop(place);
        match done {
            Ok(objects) => Ok(Response::new(v1::PushReply { objects })),
            Err(why) => Err(self.refuse_push(&md, caller, lease, why).await),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::launcher::WorkerToken;

    #[test]
    fn auth_reads_the_bearer_token() {
        let t = WorkerToken::generate();
        let mut md = MetadataMap::new();
        md.insert(
            zerg_proto::contract::TOKEN_METADATA,
            zerg_proto::contract::bearer(t.expose()).parse().unwrap(),
        );
        assert_eq!(auth_from_metadata("r", &md), WorkerAuth::for_token("r", &t));
        assert_eq!(
            auth_from_metadata("r", &MetadataMap::new()).token_sha256,
            None
        );
        let mut md = MetadataMap::new();
        md.insert(
            zerg_proto::contract::TOKEN_METADATA,
            "Basic abc".parse().unwrap(),
        );
        assert_eq!(auth_from_metadata("r", &md).token_sha256, None);
    }

    /// A token over 256 bytes counts as no token (docs/Security.md, "Tokens"); one of 256
    /// bytes is read.
    #[test]
    fn a_token_over_256_bytes_counts_as_none() {
        let with = |token: &str| {
            let mut md = MetadataMap::new();
            md.insert(
                zerg_proto::contract::TOKEN_METADATA,
                zerg_proto::contract::bearer(token).parse().unwrap(),
            );
            auth_from_metadata("r", &md).token_sha256
        };
        let at_most = "a".repeat(256);
        assert_eq!(with(&at_most), Some(hash_token(&at_most)));
        assert_eq!(with(&"a".repeat(257)), None);
    }

    #[test]
    fn an_artifact_is_capped_and_never_written_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("tasks/T-1");
        let mut a = Artifact::create(&d, "agent-output.txt", 10, "container.log_max_size").unwrap();
        a.write(b"0123456789abcdef").unwrap();
        a.write(b"more").unwrap();
        a.finish().unwrap();
        let text = std::fs::read_to_string(d.join("agent-output.txt")).unwrap();
        assert!(
            text.starts_with("0123456789\n[zerg: the worker sent 20 bytes"),
            "{text}"
        );
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), d.join("planted")).unwrap();
        assert!(Artifact::create(&d, "planted", 10, "container.log_max_size").is_err());
        assert!(!dir.path().join("elsewhere").exists());
        let bad = v1::ArtifactChunk {
            name: "../x".into(),
            ..Default::default()
        };
        assert!(
            crate::wire::worker::artifact_header(&mut bad.clone())
                .unwrap_err()
                .message()
                .starts_with("name:")
        );
    }

    #[test]
    fn plane_sockets_are_short_and_per_rush() {
        let ctl = Path::new("/run/user/1000/zerg/zergd.sock");
        let a = plane_socket(ctl, "feature-x-19ab");
        let b = plane_socket(ctl, "feature-y-19ab");
        assert_ne!(a, b);
        assert!(a.starts_with("/run/user/1000/zerg/w/"));
        assert_eq!(a.file_name().unwrap(), PLANE_SOCKET_NAME);
        assert!(a.as_os_str().len() < 60);
        assert_eq!(a, plane_socket(ctl, "feature-x-19ab"));
    }
}
