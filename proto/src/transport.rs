//! Socket discovery and client connections over Unix sockets.

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::ENV_SOCKET;

/// Default socket path: `$XDG_RUNTIME_DIR/zerg/zergd.sock`, or a per-user runtime
/// directory derived from the platform's conventions when that variable is unset.
pub fn default_socket_path() -> PathBuf {
    runtime_dir().join("zergd.sock")
}

/// The socket path to use: an explicit flag, else `ZERG_SOCKET`, else the default.
pub fn resolve_socket(flag: Option<&Path>) -> PathBuf {
    if let Some(p) = flag {
        return p.to_path_buf();
    }
    match std::env::var_os(ENV_SOCKET) {
        Some(v) if !v.is_empty() => PathBuf::from(v),
        _ => default_socket_path(),
    }
}

/// Per-user runtime directory for zerg (`$XDG_RUNTIME_DIR/zerg`).
pub fn runtime_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir).join("zerg");
    }
    if let Some(dirs) = directories::ProjectDirs::from("", "", "zerg") {
        if let Some(rt) = dirs.runtime_dir() {
            return rt.to_path_buf();
        }
        // macOS and Linux without XDG_RUNTIME_DIR: a private directory under the cache dir.
        return dirs.cache_dir().join("run");
    }
    std::env::temp_dir().join(format!("zerg-{}", user_name()))
}

fn user_name() -> String {
    std::env::var("USER").unwrap_or_else(|_| "user".into())
}

/// Opens a gRPC channel to zergd's Unix socket.
///
/// The connection is made eagerly, so an absent daemon is reported here.
pub async fn connect(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = socket.to_path_buf();
    // The URI is required by the builder but unused: the connector ignores it.
    Endpoint::from_static("http://zergd.local")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}

/// Whether an error from [`connect`] or an RPC means "nobody is listening on the socket".
pub fn is_unreachable(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::NotFound
                    | std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::PermissionDenied
            );
        }
        cur = e.source();
    }
    false
}
