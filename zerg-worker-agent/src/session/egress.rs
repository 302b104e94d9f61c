//! The egress forwarder of a confined worker. Its network namespace has only loopback, so the
//! agent CLI, the verification commands and the setup commands are pointed (by `HTTPS_PROXY`
//! and the like) at a port on loopback where this forwarder listens; each connection is carried
//! to zergd's egress proxy over the worker plane (`Worker.Egress`), which judges its host. The
//! forwarder itself decides nothing: a connection made here is only what it would have been
//! without it, one hop further.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use zerg_proto::v1;

use super::Client;

/// Listens on `127.0.0.1:port` and forwards every connection (`setup`: the port of the
/// `worktree.setup` commands), until the worker exits.
pub(super) async fn forward(port: u16, setup: bool, me: v1::WorkerRef, client: Client) {
    let listener = match TcpListener::bind(("127.0.0.1", port)).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "zerg-worker-agent: cannot listen on 127.0.0.1:{port} for the egress proxy: {e}; the agent CLI will have no network"
            );
            return;
        }
    };
    loop {
        let Ok((sock, _)) = listener.accept().await else {
            continue;
        };
        let (me, client) = (me.clone(), client.clone());
        tokio::spawn(async move {
            if let Err(e) = one(sock, setup, me, client).await {
                eprintln!("zerg-worker-agent: egress: {e}");
            }
        });
    }
}

/// Carries one connection both ways until either side ends it.
async fn one(
    sock: TcpStream,
    setup: bool,
    me: v1::WorkerRef,
    mut client: Client,
) -> Result<(), String> {
    let (mut rd, mut wr) = sock.into_split();
    let (tx, rx) = mpsc::channel::<v1::EgressChunk>(8);
    let _ = tx
        .send(v1::EgressChunk {
            worker: Some(me),
            setup,
            data: Vec::new(),
        })
        .await;
    tokio::spawn(async move {
        let mut buf = vec![0u8; 32 << 10];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let chunk = v1::EgressChunk {
                        data: buf[..n].to_vec(),
                        ..Default::default()
                    };
                    if tx.send(chunk).await.is_err() {
                        break;
                    }
                }
            }
        }
    });
    let mut inbound = client
        .egress(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(|s| format!("zergd refused the connection: {}", s.message()))?
        .into_inner();
    while let Some(m) = inbound
        .message()
        .await
        .map_err(|s| format!("the proxy stream ended: {}", s.message()))?
    {
        if wr.write_all(&m.data).await.is_err() {
            break;
        }
    }
    let _ = wr.shutdown().await;
    Ok(())
}
