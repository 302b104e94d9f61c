//! The worker's environment (what zergd's launcher set) and its authenticated client.

use super::*;

/// The worker's environment, set by zergd's launcher.
#[derive(Debug, Clone)]
pub struct Env {
    pub(super) socket: PathBuf,
    pub(super) rush_id: String,
    pub(super) worker_id: u32,
    pub(super) generation: u64,
    pub(super) worktree: PathBuf,
    pub(super) feature: String,
    pub(super) log_dir: PathBuf,
    pub(super) token: Token,
    pub(super) reconnect_timeout: Duration,
    /// Set for a remote worker: the TCP plane it dials instead of a socket.
    pub(super) remote: Option<RemotePlane>,
    /// Whether the worker's commands reach the network only through the egress forwarder (in
    /// zergd's sandbox, or in a container with no network of its own).
    pub(super) confined: bool,
}

/// The TCP worker plane a remote worker dials.
#[derive(Debug, Clone)]
pub(super) struct RemotePlane {
    /// `https://host:port`.
    pub(super) url: String,
    /// The CA that signed the plane's certificate (PEM).
    pub(super) ca_pem: String,
}

/// Adds the worker's token to every RPC (`authorization: Bearer <token>`).
#[derive(Clone)]
pub(super) struct Token(Option<MetadataValue<Ascii>>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Interceptor for Token {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut()
                .insert(zerg_proto::contract::TOKEN_METADATA, v.clone());
        }
        Ok(req)
    }
}

/// A client of zergd's worker plane.
pub(super) type Client = WorkerClient<InterceptedService<Channel, Token>>;

impl Env {
    /// Reads the `ZERG_*` environment.
    pub fn from_env() -> Result<Env, String> {
        let var = |k: &str| {
            std::env::var(k).map_err(|_| {
                format!("environment variable {k} is not set (this program is started by zergd)")
            })
        };
        let num = |k: &str| -> Result<u64, String> {
            var(k)?
                .parse()
                .map_err(|_| format!("environment variable {k} is not a number"))
        };
        let remote = match std::env::var(env::PLANE_URL) {
            Ok(url) if !url.is_empty() => {
                let ca = var(env::PLANE_CA)?;
                Some(RemotePlane {
                    url,
                    ca_pem: std::fs::read_to_string(&ca)
                        .map_err(|e| format!("cannot read the plane's CA {ca}: {e}"))?,
                })
            }
            _ => None,
        };
        // A remote worker's token is a mounted secret file, never a variable.
        let token = match std::env::var(env::WORKER_TOKEN_FILE) {
            Ok(f) if !f.is_empty() => Some(
                std::fs::read_to_string(&f)
                    .map_err(|e| format!("cannot read the worker's token {f}: {e}"))?
                    .trim()
                    .to_string(),
            ),
            _ => std::env::var(env::WORKER_TOKEN).ok(),
        };
        Ok(Env {
            socket: if remote.is_some() {
                PathBuf::new()
            } else {
                PathBuf::from(var(env::SOCKET)?)
            },
            rush_id: var(env::RUSH_ID)?,
            worker_id: num(env::WORKER_ID)? as u32,
            generation: num(env::GENERATION)?,
            worktree: PathBuf::from(var(env::WORKTREE)?),
            feature: var(env::FEATURE)?,
            log_dir: PathBuf::from(var(env::LOG_DIR)?),
            // Without it every call is refused, with a message saying so.
            token: Token(token.and_then(|t| zerg_proto::contract::bearer(&t).parse().ok())),
            reconnect_timeout: Duration::from_secs(
                std::env::var("ZERG_RECONNECT_TIMEOUT_SECONDS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(600),
            ),
            remote,
            confined: std::env::var_os(zerg_sandbox::POLICY_ENV).is_some()
                || std::env::var(zerg_sandbox::EGRESS_ENV).is_ok_and(|v| v == "1"),
        })
    }

    /// Whether zergd's socket and this worker's worktree are both gone: the rush is over, and
    /// nothing will ever answer on the socket again.
    pub(super) fn orphaned(&self) -> bool {
        self.remote.is_none() && !self.socket.exists() && !self.worktree.exists()
    }

    /// Where zergd is reached: the TCP plane's URL, or the socket's path.
    pub(super) fn plane_name(&self) -> String {
        match &self.remote {
            Some(p) => p.url.clone(),
            None => self.socket.display().to_string(),
        }
    }

    /// Says why an orphaned worker gives up.
    pub(super) fn orphaned_message(&self) -> String {
        format!(
            "zergd's socket {} and this worker's worktree {} are both gone: the rush is over",
            self.socket.display(),
            self.worktree.display()
        )
    }

    pub(super) fn client(&self, ch: Channel) -> Client {
        WorkerClient::with_interceptor(ch, self.token.clone())
    }

    /// The rush's spec directory relative to the worktree, as committed in the repository:
    /// tasks never change it (the commit restores it and zergd refuses commits that touch it).
    pub(super) fn spec_rel(&self) -> String {
        format!(".gsd/specs/{}", self.feature)
    }

    pub(super) fn me(&self) -> v1::WorkerRef {
        v1::WorkerRef {
            rush_id: self.rush_id.clone(),
            worker_id: self.worker_id,
            generation: self.generation,
        }
    }
}
