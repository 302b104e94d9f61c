//! The connection to zergd's worker plane: connecting with backoff, telling transport errors
//! from refusals, and the heartbeat stream.

use super::*;

/// Whether an RPC error means "zergd is not reachable right now" (worth reconnecting).
pub(super) fn is_transport(s: &Status) -> bool {
    matches!(
        s.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled
    )
}

/// Connects to zergd's worker plane, retrying with capped exponential backoff (0.5 s to 5 s) for
/// up to the reconnect timeout. Gives up at once when zergd's socket and this worker's worktree
/// are both gone: the rush is over (its zergd and its files went away, as a demo's do when it
/// ends), and nothing would ever answer. A zergd that restarts keeps both.
pub(super) async fn connect_retrying(env: &Env) -> Result<Channel, String> {
    let socket = &env.socket;
    let timeout = env.reconnect_timeout;
    let start = Instant::now();
    let mut delay = Duration::from_millis(500);
    loop {
        let connected = match &env.remote {
            Some(plane) => connect_tcp(plane).await,
            None => zerg_proto::transport::connect(socket)
                .await
                .map_err(|e| e.to_string()),
        };
        match connected {
            Ok(ch) => return Ok(ch),
            Err(_) if env.orphaned() => return Err(env.orphaned_message()),
            Err(e) if start.elapsed() < timeout => {
                eprintln!(
                    "zerg-worker-agent: cannot reach zergd at {} ({e}); retrying in {delay:?}",
                    env.plane_name()
                );
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(e) => {
                return Err(format!(
                    "cannot reach zergd at {} for {timeout:?}: {e}",
                    env.plane_name()
                ));
            }
        }
    }
}

/// Connects to the TCP worker plane over TLS, trusting only the plane's CA; HTTP/2 keepalive
/// pings keep an idle connection (a parked lease) open through the network's idle timeouts.
async fn connect_tcp(plane: &RemotePlane) -> Result<Channel, String> {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};
    let tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&plane.ca_pem));
    Endpoint::from_shared(plane.url.clone())
        .map_err(|e| format!("{}: {e}", plane.url))?
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(10))
        .http2_keep_alive_interval(Duration::from_secs(20))
        .keep_alive_timeout(Duration::from_secs(20))
        .keep_alive_while_idle(true)
        .connect()
        .await
        .map_err(|e| {
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg = format!("{msg}: {s}");
                src = s.source();
            }
            msg
        })
}

/// Keeps a client-streaming Heartbeat RPC open and feeds it from the work loop; reconnects when
/// zergd goes away; reports a refused heartbeat (revoked lease) through `abort`, and through
/// `unreachable` that zergd cannot be reached any more (the work in hand cannot be reported).
pub(super) async fn heartbeat_loop(
    env: Env,
    mut rx: mpsc::Receiver<v1::HeartbeatRequest>,
    abort: watch::Sender<Option<Revocation>>,
    unreachable: watch::Sender<bool>,
) {
    let mut pending: Option<v1::HeartbeatRequest> = None;
    loop {
        let ch = match connect_retrying(&env).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("zerg-worker-agent: {e}; giving up the task in hand");
                let _ = unreachable.send(true);
                return;
            }
        };
        let mut client = env.client(ch);
        let (tx, inner) = mpsc::channel(16);
        if let Some(p) = pending.take() {
            let _ = tx.try_send(p);
        }
        let call = client.heartbeat(ReceiverStream::new(inner));
        tokio::pin!(call);
        loop {
            tokio::select! {
                res = &mut call => {
                    if let Err(s) = res
                        && let Some(r) = Revocation::of_status(&s) {
                            let _ = abort.send(Some(r));
                        }
                    break;
                }
                m = rx.recv() => match m {
                    None => return,
                    Some(m) => {
                        if tx.send(m.clone()).await.is_err() {
                            pending = Some(m);
                            break;
                        }
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
