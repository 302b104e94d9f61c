//! The worker planes' connections, bounded: a worker (one container, one process, or one
//! address on the TCP plane) may hold a few connections, the plane a fixed number in all, and a
//! connection that sends nothing for a while is closed; on the TCP plane, one that has not made
//! a call with a valid worker token soon after it opened is closed too. The accept loop backs
//! off when the process runs out of descriptors instead of spinning, so a peer that floods a
//! plane costs zergd a bounded number of descriptors and no CPU, and the control socket keeps
//! answering.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
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
    /// When set, how long a new connection has to make a call that a valid worker token
    /// vouched for ([`Seen::vouch`]); it is closed at that point otherwise, however much it
    /// sends. The TCP plane sets it (`remote.handshake_timeout`).
    pub first_call: Option<Duration>,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            per_peer: 16,
            total: 512,
            handshake: Duration::from_secs(10),
            idle: Duration::from_secs(120),
            first_call: None,
        }
    }
}

impl Limits {
    /// The TCP plane's limits: `remote.max_connections` in all, `remote.max_connections_per_peer`
    /// per address, and `remote.handshake_timeout` for the TLS handshake and the first call.
    pub fn tcp(cfg: &crate::config::RemoteConfig) -> Self {
        Self {
            per_peer: cfg.max_connections_per_peer.max(1) as usize,
            total: cfg.max_connections.max(1) as usize,
            handshake: cfg.handshake_timeout,
            first_call: Some(cfg.handshake_timeout),
            ..Self::default()
        }
    }
}

/// A listener whose connections [`bounded`] counts by peer.
pub trait Listener: Send + 'static {
    /// A connection.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The next connection and who is on its other end.
    fn accept(&mut self) -> impl Future<Output = io::Result<(Self::Io, String)>> + Send;
}

/// A Unix plane: peers are told apart by cgroup (or process).
pub struct UnixPeers {
    listener: UnixListener,
    own_cgroup: String,
}

impl UnixPeers {
    /// Counts `listener`'s peers by cgroup.
    pub fn new(listener: UnixListener) -> Self {
        Self {
            listener,
            own_cgroup: cgroup_of("self").unwrap_or_default(),
        }
    }
}

impl Listener for UnixPeers {
    type Io = UnixStream;
    async fn accept(&mut self) -> io::Result<(UnixStream, String)> {
        let (s, _) = self.listener.accept().await?;
        let key = peer_key(&s, &self.own_cgroup);
        Ok((s, key))
    }
}

impl Listener for TcpListener {
    type Io = TcpStream;
    async fn accept(&mut self) -> io::Result<(TcpStream, String)> {
        let (s, addr) = TcpListener::accept(self).await?;
        let _ = s.set_nodelay(true);
        Ok((s, addr.ip().to_string()))
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
        crate::metrics::METRICS.plane_closed();
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
pub fn bounded<L: Listener>(
    mut listener: L,
    limits: Limits,
) -> ReceiverStream<io::Result<Guarded<L::Io>>> {
    let (tx, rx) = mpsc::channel(16);
    let counts = Arc::new(Mutex::new(Counts::default()));
    tokio::spawn(async move {
        let mut pause = Duration::from_millis(10);
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                () = tx.closed() => return,
            };
            let (stream, key) = match accepted {
                Ok(a) => {
                    pause = Duration::from_millis(10);
                    a
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
                    crate::metrics::METRICS.plane_opened();
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
                first_call_by: limits.first_call.map(|d| Instant::now() + d),
                seen: Seen::default(),
                handshake_by: Instant::now() + limits.handshake,
                last_read: None,
            };
            if tx.send(Ok(g)).await.is_err() {
                return;
            }
        }
    });
    ReceiverStream::new(rx)
}

/// The pace of heartbeats zergd handles from one connection, after a burst of [`BEAT_BURST`]
/// (a worker agent sends one every `workers.heartbeat_interval_seconds`, at least 100 ms, and
/// one more at each step change: a few at once, then few).
pub const BEAT_GAP: Duration = Duration::from_millis(50);

/// Heartbeats one connection may send at once before [`BEAT_GAP`] paces them.
pub const BEAT_BURST: u32 = 16;

/// What the service knows of a connection: whether it made a call that a valid worker token
/// vouched for, and how many heartbeats it may still send at once. Every request carries it
/// (as tonic's connect info).
#[derive(Debug, Clone, Default)]
pub struct Seen {
    vouched: Arc<AtomicBool>,
    /// Heartbeats owed (negative: in hand) and when that was counted.
    beats: Arc<Mutex<Option<(f64, Instant)>>>,
}

impl Seen {
    /// The connection made a call with a valid token: from now on only the idle time applies.
    pub fn vouch(&self) {
        self.vouched.store(true, Ordering::Relaxed);
    }

    fn vouched(&self) -> bool {
        self.vouched.load(Ordering::Relaxed)
    }

    /// When the connection's next heartbeat may be handled: at once while it has not sent more
    /// than [`BEAT_BURST`] in a row, then one per [`BEAT_GAP`]. A worker that sends beats
    /// faster, on however many streams of the connection, is slowed down (its streams are not
    /// read meanwhile), and no connection's beats wait on another's.
    pub fn beat_turn(&self) -> Instant {
        let now = Instant::now();
        let mut beats = self.beats.lock().unwrap_or_else(|e| e.into_inner());
        // `owed` counts beats beyond the pace: each beat adds one, each BEAT_GAP takes one off.
        let owed = beats.map_or(0.0, |(owed, at)| {
            let paid = now.saturating_duration_since(at).as_secs_f64() / BEAT_GAP.as_secs_f64();
            (owed - paid).max(0.0)
        }) + 1.0;
        *beats = Some((owed, now));
        let over = owed - f64::from(BEAT_BURST);
        if over > 0.0 {
            now + BEAT_GAP.mul_f64(over)
        } else {
            now
        }
    }
}

/// A connection within the limits: it gives its place back when it closes, and fails its
/// next read once it has sent nothing for the handshake or idle time, or, where a first call
/// is due, once that time passed without one.
pub struct Guarded<S> {
    inner: S,
    _slot: Slot,
    deadline: Pin<Box<Sleep>>,
    idle: Duration,
    first_call_by: Option<Instant>,
    seen: Seen,
    /// When the first bytes are due.
    handshake_by: Instant,
    /// When bytes last came, if they did.
    last_read: Option<Instant>,
}

impl<S> Guarded<S> {
    /// When the connection is due to be closed if it sends nothing more.
    fn next_deadline(&self) -> Instant {
        let Some(last_read) = self.last_read else {
            return self.handshake_by;
        };
        let idle = last_read + self.idle;
        match self.first_call_by {
            Some(by) if !self.seen.vouched() => by.min(idle),
            _ => idle,
        }
    }
}

impl<S: Unpin> tonic::transport::server::Connected for Guarded<S> {
    type ConnectInfo = Seen;
    fn connect_info(&self) -> Seen {
        self.seen.clone()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    self.last_read = Some(Instant::now());
                    let next = self.next_deadline();
                    self.deadline.as_mut().reset(next);
                }
                Poll::Ready(r)
            }
            Poll::Pending => loop {
                match self.deadline.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(()) => {
                        // The first call was vouched for after the deadline was set: the
                        // idle time from the last read counts now.
                        let next = self.next_deadline();
                        if next > Instant::now() {
                            self.deadline.as_mut().reset(next);
                            continue;
                        }
                        let why = if self.first_call_by.is_some() && !self.seen.vouched() {
                            "worker plane connection made no call with a valid token in time"
                        } else {
                            "worker plane connection sent nothing for too long"
                        };
                        return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, why)));
                    }
                }
            },
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
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
            first_call: None,
        };
        let mut incoming = bounded(UnixPeers::new(listener), limits);
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

    #[tokio::test(start_paused = true)]
    async fn a_connections_heartbeats_are_paced_after_a_burst() {
        let (a, b) = (Seen::default(), Seen::default());
        let now = Instant::now();
        for _ in 0..BEAT_BURST {
            assert_eq!(a.beat_turn(), now);
        }
        assert_eq!(a.clone().beat_turn(), now + BEAT_GAP);
        assert_eq!(a.beat_turn(), now + BEAT_GAP * 2);
        // Another connection has its own pace.
        assert_eq!(b.beat_turn(), now);
        // After a quiet while, beats are handled at once again.
        tokio::time::advance(BEAT_GAP * (BEAT_BURST + 2)).await;
        assert_eq!(a.beat_turn(), Instant::now());
    }

    /// On TCP, peers are counted by address; a connection that keeps sending but makes no call
    /// a token vouched for is closed at the first-call time, one that did is kept.
    #[tokio::test]
    async fn tcp_peers_are_counted_by_address_and_must_make_a_vouched_call() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = Limits {
            per_peer: 3,
            total: 100,
            handshake: Duration::from_secs(5),
            idle: Duration::from_secs(60),
            first_call: Some(Duration::from_millis(400)),
        };
        let mut incoming = bounded(listener, limits);
        let mut clients = Vec::new();
        for _ in 0..10 {
            clients.push(TcpStream::connect(addr).await.unwrap());
        }
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(incoming.next().await.unwrap().unwrap());
        }
        let mut closed = 0;
        for c in clients.iter_mut().skip(3) {
            let mut b = [0u8; 1];
            if c.read(&mut b).await.unwrap_or(0) == 0 {
                closed += 1;
            }
        }
        assert_eq!(closed, 7);
        // Both talk all the time; only the first is vouched for.
        let (mut vouched, mut chatty) = (held.pop().unwrap(), held.pop().unwrap());
        tonic::transport::server::Connected::connect_info(&vouched).vouch();
        async fn talk(c: &mut TcpStream) {
            for _ in 0..20 {
                let _ = c.write_all(b"x").await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        // Accepted in order: the second and third clients are `chatty` and `vouched`.
        let (c0, c1) = clients.split_at_mut(2);
        let reads = async {
            let (mut b, mut b2) = ([0u8; 64], [0u8; 64]);
            let mut chatty_err = None;
            let mut vouched_ok = 0;
            let end = Instant::now() + Duration::from_millis(900);
            while Instant::now() < end {
                tokio::select! {
                    r = chatty.read(&mut b), if chatty_err.is_none() => {
                        if let Err(e) = r { chatty_err = Some(e.kind()); }
                    }
                    r = vouched.read(&mut b2) => {
                        r.unwrap();
                        vouched_ok += 1;
                    }
                    () = tokio::time::sleep(Duration::from_millis(20)) => {}
                }
            }
            (chatty_err, vouched_ok)
        };
        let ((chatty_err, vouched_ok), (), ()) =
            tokio::join!(reads, talk(&mut c0[1]), talk(&mut c1[0]));
        assert_eq!(chatty_err, Some(io::ErrorKind::TimedOut));
        assert!(vouched_ok > 0);
    }
}
