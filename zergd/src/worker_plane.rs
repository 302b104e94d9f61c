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
use crate::launcher::PLANE_SOCKET_NAME;
use crate::launcher::token::{hash_token, hex};
use crate::supervisor::{Event, Handle, PlaneServer, WorkerCmd};
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
#[derive(Debug, Clone)]
pub struct Planes {
    control_socket: PathBuf,
}

impl Planes {
    /// The planes beside `control_socket`.
    pub fn beside(control_socket: &Path) -> Self {
        Self {
            control_socket: control_socket.to_path_buf(),
        }
    }
}

impl PlaneServer for Planes {
    fn serve(&self, rush_id: &str, handle: Handle) -> std::io::Result<tokio::task::JoinHandle<()>> {
        serve(&self.control_socket, rush_id, handle)
    }

    fn serve_tcp(
        &self,
        listen: &str,
        tls: &crate::remote::PlaneTls,
        handle: Handle,
    ) -> std::io::Result<tokio::task::JoinHandle<()>> {
        serve_tcp(listen, tls, handle)
    }

    fn socket(&self, rush_id: &str) -> PathBuf {
        plane_socket(&self.control_socket, rush_id)
    }

    fn remove(&self, rush_id: &str) {
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
            .add_service(server)
            .serve_with_incoming(crate::incoming::bounded(listener, limits))
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
pub fn serve_tcp(
    listen: &str,
    tls: &crate::remote::PlaneTls,
    handle: Handle,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    use tonic::transport::{Identity, ServerTlsConfig};
    let std_listener = std::net::TcpListener::bind(listen)?;
    std_listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(std_listener)?;
    let identity = Identity::from_pem(&tls.cert_pem, &tls.key_pem);
    let mut builder = tonic::transport::Server::builder()
        .tls_config(ServerTlsConfig::new().identity(identity))
        .map_err(std::io::Error::other)?
        .http2_keepalive_interval(Some(TCP_KEEPALIVE))
        .http2_keepalive_timeout(Some(TCP_KEEPALIVE));
    let server = WorkerServer::new(PlaneService {
        rush_id: None,
        handle,
    })
    .max_decoding_message_size(MAX_WORKER_MESSAGE)
    .max_encoding_message_size(16 * MAX_WORKER_MESSAGE);
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
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
        let r = convert(req.into_inner())?;
        self.handle
            .ask(|tx| {
                let cmd = make(r, tx);
                Event::Worker(self.auth(&md, &cmd.caller().rush_id), cmd)
            })
            .await
            .map(|r| Response::new(reply(r)))
            .map_err(Status::from)
    }

    /// Where the lease's files go and how large a push may be: the caller must hold the lease.
    async fn lease_files(
        &self,
        md: &MetadataMap,
        caller: Caller,
        lease: LeaseRef,
    ) -> Result<LeaseFiles, Status> {
        let auth = self.auth(md, &caller.rush_id);
        self.handle
            .ask(|tx| Event::Worker(auth, WorkerCmd::LeaseFiles(caller, lease, tx)))
            .await
            .map_err(Status::from)
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

/// One artifact of a remote worker being written under `.zerg/logs/tasks/<task>/`: at most
/// `cap` bytes are kept, then a line saying how much was sent.
struct Artifact {
    file: std::fs::File,
    kept: u64,
    sent: u64,
    cap: u64,
}

impl Artifact {
    /// Creates (or truncates) `dir/name`, never through a symlink.
    fn create(dir: &Path, name: &str, cap: u64) -> std::io::Result<Artifact> {
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
                "\n[zerg: the worker sent {} bytes; the first {} are kept (container.log_max_size)]",
                self.sent, self.kept
            )?;
        }
        Ok(())
    }
}

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
        let mut stream = req.into_inner();
        while let Some(msg) = stream.next().await {
            let beat = Beat::try_from(msg?)?;
            let a = self.auth(&md, &beat.caller.rush_id);
            self.handle
                .ask(|tx| Event::Worker(a, WorkerCmd::Heartbeat(beat, tx)))
                .await
                .map_err(Status::from)?;
        }
        Ok(Response::new(v1::HeartbeatReply {}))
    }

    async fn complete(
        &self,
        req: Request<v1::CompleteRequest>,
    ) -> Result<Response<v1::Ack>, Status> {
        self.call(req, Completion::try_from, WorkerCmd::Complete, ack)
            .await
    }

    async fn fail(&self, req: Request<v1::FailRequest>) -> Result<Response<v1::Ack>, Status> {
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

    async fn fetch_base(
        &self,
        req: Request<v1::FetchBaseRequest>,
    ) -> Result<Response<Self::FetchBaseStream>, Status> {
        let md = req.metadata().clone();
        let (caller, lease, haves) = crate::wire::worker::fetch_request(req.into_inner())?;
        let auth = self.auth(&md, &caller.rush_id);
        let BasePack {
            file,
            shallow,
            sha256,
            size,
        } = self
            .handle
            .ask(|tx| Event::Worker(auth, WorkerCmd::FetchBase(caller, lease, haves, tx)))
            .await
            .map_err(Status::from)?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::task::spawn_blocking(move || {
            use std::io::{Read, Seek};
            let mut file = file;
            let mut first = Some(v1::PackChunk {
                object_format: if sha256 { "sha256" } else { "sha1" }.into(),
                shallow,
                pack_bytes: size,
                data: Vec::new(),
            });
            if let Err(e) = file.rewind() {
                let _ = tx.blocking_send(Err(Status::internal(e.to_string())));
                return;
            }
            loop {
                let mut buf = vec![0u8; PACK_CHUNK];
                let n = match file.read(&mut buf) {
                    Ok(n) => n,
                    Err(e) => {
                        let _ = tx.blocking_send(Err(Status::internal(e.to_string())));
                        return;
                    }
                };
                if n == 0 && first.is_none() {
                    return;
                }
                buf.truncate(n);
                let mut msg = first.take().unwrap_or_default();
                msg.data = buf;
                if tx.blocking_send(Ok(msg)).is_err() || n == 0 {
                    return;
                }
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    async fn push_artifact(
        &self,
        req: Request<Streaming<v1::ArtifactChunk>>,
    ) -> Result<Response<v1::Ack>, Status> {
        let md = req.metadata().clone();
        let mut stream = req.into_inner();
        let mut first = stream
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("an artifact needs a first message"))?;
        let (caller, lease, name) = crate::wire::worker::artifact_header(&mut first)?;
        let files = self.lease_files(&md, caller, lease).await?;
        let mut out = Artifact::create(&files.artifacts, &name, files.artifact_cap)
            .map_err(|e| Status::internal(format!("cannot keep {name}: {e}")))?;
        let mut data = first.data;
        loop {
            out.write(&data)
                .map_err(|e| Status::internal(format!("cannot keep {name}: {e}")))?;
            match stream.message().await? {
                Some(m) => data = m.data,
                None => break,
            }
        }
        out.finish()
            .map_err(|e| Status::internal(format!("cannot keep {name}: {e}")))?;
        Ok(Response::new(v1::Ack {}))
    }

    async fn push_objects(
        &self,
        req: Request<Streaming<v1::PushChunk>>,
    ) -> Result<Response<v1::PushReply>, Status> {
        use std::io::{Seek, Write};
        let md = req.metadata().clone();
        let mut stream = req.into_inner();
        let first = stream
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("a push needs a first message"))?;
        let head = crate::wire::worker::PushHeader::try_from(first)?;
        let (caller, lease) = (head.caller.clone(), head.lease.clone());
        let max = self
            .lease_files(&md, caller.clone(), lease.clone())
            .await?
            .max_pack;
        if head.size > max {
            let why = format!(
                "the pack's {} bytes are more than the {max} bytes allowed",
                head.size
            );
            return Err(self.refuse_push(&md, caller, lease, why).await);
        }
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
            match stream.message().await? {
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
        let done = self
            .handle
            .ask(|tx| Event::Worker(auth, WorkerCmd::PushObjects(c, l, commit, file, tx)))
            .await
            .map_err(Status::from)?;
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

    #[test]
    fn an_artifact_is_capped_and_never_written_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("tasks/T-1");
        let mut a = Artifact::create(&d, "agent-output.txt", 10).unwrap();
        a.write(b"0123456789abcdef").unwrap();
        a.write(b"more").unwrap();
        a.finish().unwrap();
        let text = std::fs::read_to_string(d.join("agent-output.txt")).unwrap();
        assert!(
            text.starts_with("0123456789\n[zerg: the worker sent 20 bytes"),
            "{text}"
        );
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), d.join("planted")).unwrap();
        assert!(Artifact::create(&d, "planted", 10).is_err());
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
