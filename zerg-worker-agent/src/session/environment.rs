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
        Ok(Env {
            socket: PathBuf::from(var(env::SOCKET)?),
            rush_id: var(env::RUSH_ID)?,
            worker_id: num(env::WORKER_ID)? as u32,
            generation: num(env::GENERATION)?,
            worktree: PathBuf::from(var(env::WORKTREE)?),
            feature: var(env::FEATURE)?,
            log_dir: PathBuf::from(var(env::LOG_DIR)?),
            // Without it every call is refused, with a message saying so.
            token: Token(
                std::env::var(env::WORKER_TOKEN)
                    .ok()
                    .and_then(|t| zerg_proto::contract::bearer(&t).parse().ok()),
            ),
            reconnect_timeout: Duration::from_secs(
                std::env::var("ZERG_RECONNECT_TIMEOUT_SECONDS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(600),
            ),
        })
    }

    /// Whether zergd's socket and this worker's worktree are both gone: the rush is over, and
    /// nothing will ever answer on the socket again.
    pub(super) fn orphaned(&self) -> bool {
        !self.socket.exists() && !self.worktree.exists()
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
