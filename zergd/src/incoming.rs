//! The worker plane's connections, bounded: a worker (one container, or one process) may hold
//! a few connections, the plane a fixed number in all, and a connection that sends nothing for
//! a while is closed. The accept loop backs off when the process runs out of descriptors
//! instead of spinning, so a worker that floods its socket costs zergd a bounded number of
//! descriptors and no CPU, and the control socket keeps answering.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};
use tokio_stream::wrappers::ReceiverStream;

/// How many connections the plane accepts, and for how long one may stay silent.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Connections one peer (a container, or one process outside containers) may hold.
    pub per_peer: usize,
    /// Connections the plane holds in all.
    pub total: usize,
    /// How long a new connection may take to send its first bytes.
    pub handshake: Duration,
    /// How long an open connection may send nothing (HTTP/2 keepalive pings, answered by every
    /// live client, reset it).
    pub idle: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            per_peer: 16,
            total: 512,
            handshake: Duration::from_secs(10),
            idle: Duration::from_secs(120),
        }
    }
}

/// Who is on the other end of a connection: the cgroup of the peer process when it is not
/// zergd's own (a container has its own), else the process itself.
fn peer_key(s: &UnixStream, own_cgroup: &str) -> String {
    let Some(pid) = s.peer_cred().ok().and_then(|c| c.pid()) else {
        return "unknown".into();
    };
    match cgroup_of(&pid.to_string()) {
        Some(cg) if cg != own_cgroup => format!("cgroup:{cg}"),
        _ => format!("pid:{pid}"),
    }
}

fn cgroup_of(pid: &str) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()
        .map(|s| s.trim().to_string())
}

#[derive(Default)]
struct Counts {
    total: usize,
    by_peer: HashMap<String, usize>,
    refused: u64,
}

/// A connection's place in the counts, given back when the connection closes.
struct Slot {
    counts: Arc<Mutex<Counts>>,
    key: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.by_peer.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                c.by_peer.remove(&self.key);
            }
        }
    }
}

/// Accepts connections on `listener` within `limits`, as a stream for tonic's
/// `serve_with_incoming`. The accept loop ends when the stream is dropped.
pub fn bounded(listener: UnixListener, limits: Limits) -> ReceiverStream<io::Result<Guarded>> {
    let (tx, rx) = mpsc::channel(16);
    let own = cgroup_of("self").unwrap_or_default();
    let counts = Arc::new(Mutex::new(Counts::default()));
    tokio::spawn(async move {
        let mut pause = Duration::from_millis(10);
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                () = tx.closed() => return,
            };
            let stream = match accepted {
                Ok((s, _)) => {
                    pause = Duration::from_millis(10);
                    s
                }
                Err(e) => {
                    // Out of descriptors (EMFILE, ENFILE) or memory: wait for some to be
                    // given back rather than spin on an accept that fails at once.
                    tracing::warn!(error = %e, pause_ms = pause.as_millis() as u64, "worker plane cannot accept");
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {},
                        () = tx.closed() => return,
                    }
                    pause = (pause * 2).min(Duration::from_secs(1));
                    continue;
                }
            };
            let key = peer_key(&stream, &own);
            let slot = {
                let mut c = counts.lock().unwrap_or_else(|e| e.into_inner());
                let mine = c.by_peer.get(&key).copied().unwrap_or(0);
                if c.total >= limits.total || mine >= limits.per_peer {
                    c.refused += 1;
                    if c.refused.is_power_of_two() {
                        tracing::warn!(peer = %key, refused = c.refused, per_peer = limits.per_peer, total = limits.total, "worker plane connection refused: over the limit");
                    }
                    None
                } else {
                    c.total += 1;
                    *c.by_peer.entry(key.clone()).or_default() += 1;
                    Some(Slot {
                        counts: counts.clone(),
                        key,
                    })
                }
            };
            // Over the limit: closed at once.
            let Some(slot) = slot else { continue };
            let g = Guarded {
                inner: stream,
                _slot: slot,
                deadline: Box::pin(tokio::time::sleep(limits.handshake)),
                idle: limits.idle,
            };
            if tx.send(Ok(g)).await.is_err() {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}

/// A connection within the limits: it gives its place back when it closes, and fails its
/// next read once it has sent nothing for the handshake or idle time.
pub struct Guarded {
    inner: UnixStream,
    _slot: Slot,
    deadline: Pin<Box<Sleep>>,
    idle: Duration,
}

impl tonic::transport::server::Connected for Guarded {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for Guarded {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    let next = Instant::now() + self.idle;
                    self.deadline.as_mut().reset(next);
                }
                Poll::Ready(r)
            }
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "worker plane connection sent nothing for too long",
                ))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl AsyncWrite for Guarded {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Raises this process's soft limit on open files to its hard limit, so the bounds above,
/// not the default soft limit (often 1,024), decide how many connections zergd can hold.
pub fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        tracing::debug!(error = %e, "cannot raise the open-file limit");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_stream::StreamExt;

    /// One peer (this test process) floods the socket: only `per_peer` connections are held,
    /// the rest are closed at once, and a silent one is closed after the handshake time.
    #[tokio::test]
    async fn a_peer_holds_at_most_its_share_and_silence_is_closed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let limits = Limits {
            per_peer: 4,
            total: 100,
            handshake: Duration::from_millis(300),
            idle: Duration::from_secs(60),
        };
        let mut incoming = bounded(listener, limits);
        let mut clients = Vec::new();
        for _ in 0..50 {
            clients.push(UnixStream::connect(&path).await.unwrap());
        }
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(incoming.next().await.unwrap().unwrap());
        }
        // Every other connection was closed by the plane: each client beyond the first four
        // reads end-of-file.
        use tokio::io::AsyncReadExt;
        let mut closed = 0;
        for c in clients.iter_mut().skip(4) {
            let mut b = [0u8; 1];
            if c.read(&mut b).await.unwrap() == 0 {
                closed += 1;
            }
        }
        assert_eq!(closed, 46);
        // A held connection that sends nothing fails its read once the handshake time passes.
        let mut g = held.pop().unwrap();
        let mut b = [0u8; 1];
        let e = g.read(&mut b).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        // Closing one gives its place back.
        drop(g);
        let _c = UnixStream::connect(&path).await.unwrap();
        assert!(incoming.next().await.unwrap().is_ok());
    }
}
