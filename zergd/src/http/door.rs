//! Who may use the dashboard, and how many connections each kind of caller may hold.
//!
//! **A token always.** zergd makes one at start (or takes `ZERG_HTTP_TOKEN`) and writes it,
//! with the dashboard's address, to `dashboard.json` beside the control socket (mode 0600, in
//! the owner-only 0700 socket directory), for scripts that send `Authorization: Bearer`. A
//! person runs `zergctl dashboard`, which asks zergd over the control socket (owner only, by
//! peer credentials) for a one-time login code; opening `/?login=<code>` trades it, once and
//! within a minute, for a session cookie (`HttpOnly`, `SameSite=Strict`), and the page moves
//! to `/`, so no secret stays in the address bar, the history or any later request's URL.
//! Every path but the page shell and its script answers 401 without the cookie or the token.
//!
//! **Fair connections.** A connection is *unauthenticated* until one of its requests carries
//! the cookie or the token. Unauthenticated connections have a short header deadline and a
//! pool of their own: when it is full, the one that has waited longest is closed to make room,
//! so a flood of slow tokenless connections can delay nobody for long, and a connection that
//! has shown the token leaves the pool and can no longer be closed that way. Event streams are
//! counted apart from plain requests, per client and in all, so held streams never stop a
//! page load.

use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// How long a one-time login code from `zergctl dashboard` stays good.
pub const LOGIN_TTL: Duration = Duration::from_secs(60);

/// Login codes waiting to be used; an older one is dropped when more are asked for.
const MAX_CODES: usize = 16;

/// Sessions remembered; the oldest is forgotten (and must log in again) past this.
const MAX_SESSIONS: usize = 64;

/// Unauthenticated connections held at once; past this the oldest is closed.
pub const MAX_UNAUTHENTICATED: usize = 64;

/// Event streams (`/api/watch`) one client (session or token) may hold at once.
pub const MAX_WATCHES_PER_CLIENT: usize = 8;

/// Event streams held at once, by all clients.
pub const MAX_WATCHES: usize = 64;

/// The file beside the control socket that holds the dashboard's address and token.
pub const DOOR_FILE: &str = "dashboard.json";

/// The dashboard's secrets and its connection accounting.
pub struct Door {
    token: String,
    url: OnceLock<String>,
    state: Mutex<DoorState>,
}

#[derive(Default)]
struct DoorState {
    codes: VecDeque<(String, Instant)>,
    sessions: VecDeque<String>,
    /// Unauthenticated connections, oldest first, each with the means to close it.
    waiting: VecDeque<(u64, oneshot::Sender<()>)>,
    next_conn: u64,
    watches: HashMap<String, usize>,
}

/// Who a request is from, once the door has admitted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// A page with a session cookie (the session id).
    Session(String),
    /// A script with the token.
    Token,
}

impl Caller {
    fn key(&self) -> String {
        match self {
            Caller::Session(s) => format!("session:{s}"),
            Caller::Token => "token".into(),
        }
    }
}

/// A held event stream; dropping it gives the slot back.
pub struct WatchSlot {
    door: std::sync::Arc<Door>,
    key: String,
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut s = self.door.lock();
        if let Some(n) = s.watches.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                s.watches.remove(&self.key);
            }
        }
    }
}

/// Why an event stream was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum WatchRefused {
    /// This client holds [`MAX_WATCHES_PER_CLIENT`] already.
    Client,
    /// All clients hold [`MAX_WATCHES`] already.
    All,
}

/// 32 random bytes from the kernel, as hex.
pub fn secret() -> std::io::Result<String> {
    let mut b = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Compares two strings in time that does not depend on where they differ.
pub fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl Door {
    /// A door with `token`, or with a new random one.
    pub fn new(token: Option<String>) -> std::io::Result<Door> {
        let token = match token.filter(|t| !t.is_empty()) {
            Some(t) => t,
            None => secret()?,
        };
        Ok(Door {
            token,
            url: OnceLock::new(),
            state: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, DoorState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the address once bound, and writes it with the token to [`DOOR_FILE`] in
    /// `dir` (0600, replaced whole: temp file, fsync, rename, directory fsync).
    pub fn opened(&self, addr: SocketAddr, dir: &Path) -> std::io::Result<PathBuf> {
        let url = format!("http://{addr}/");
        let _ = self.url.set(url.clone());
        let path = dir.join(DOOR_FILE);
        let body = serde_json::json!({"format_version": 1, "url": url, "token": self.token});
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        std::io::Write::write_all(&mut tmp, format!("{body}\n").as_bytes())?;
        tmp.as_file().sync_all()?;
        tmp.persist(&path).map_err(|e| e.error)?;
        std::fs::File::open(dir)?.sync_all()?;
        Ok(path)
    }

    /// The dashboard's address (empty before it is bound).
    pub fn url(&self) -> String {
        self.url.get().cloned().unwrap_or_default()
    }

    /// A new one-time login code, good for [`LOGIN_TTL`].
    pub fn login_code(&self, now: Instant) -> std::io::Result<String> {
        let code = secret()?;
        let mut s = self.lock();
        s.codes
            .retain(|(_, at)| now.duration_since(*at) < LOGIN_TTL);
        while s.codes.len() >= MAX_CODES {
            s.codes.pop_front();
        }
        s.codes.push_back((code.clone(), now));
        Ok(code)
    }

    /// Trades a login code (or the token itself) for a new session id; `None` when the code
    /// is unknown, used or too old.
    pub fn redeem(&self, code: &str, now: Instant) -> Option<String> {
        let ok = if same_secret(code, &self.token) {
            true
        } else {
            let mut s = self.lock();
            let at = s.codes.iter().position(|(c, _)| same_secret(c, code))?;
            let (_, made) = s.codes.remove(at)?;
            now.duration_since(made) < LOGIN_TTL
        };
        if !ok {
            return None;
        }
        let session = secret().ok()?;
        let mut s = self.lock();
        while s.sessions.len() >= MAX_SESSIONS {
            s.sessions.pop_front();
        }
        s.sessions.push_back(session.clone());
        Some(session)
    }

    /// Who sent a request with this `Authorization` header value and this session cookie, if
    /// either is good.
    pub fn admits(&self, bearer: Option<&str>, session: Option<&str>) -> Option<Caller> {
        if bearer.is_some_and(|t| same_secret(t, &self.token)) {
            return Some(Caller::Token);
        }
        let sid = session?;
        self.lock()
            .sessions
            .iter()
            .any(|s| same_secret(s, sid))
            .then(|| Caller::Session(sid.to_string()))
    }

    /// A new connection, unauthenticated: its id, and the receiver that fires when the door
    /// closes it to make room for a newer one.
    pub fn arrived(&self) -> (u64, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        let mut s = self.lock();
        s.next_conn += 1;
        let id = s.next_conn;
        while s.waiting.len() >= MAX_UNAUTHENTICATED {
            if let Some((_, close)) = s.waiting.pop_front() {
                let _ = close.send(());
            }
        }
        s.waiting.push_back((id, tx));
        (id, rx)
    }

    /// Connection `id` showed the cookie or the token: it leaves the unauthenticated pool.
    pub fn authenticated(&self, id: u64) {
        let mut s = self.lock();
        if let Some(at) = s.waiting.iter().position(|(c, _)| *c == id) {
            s.waiting.remove(at);
        }
    }

    /// Connection `id` ended.
    pub fn left(&self, id: u64) {
        self.authenticated(id);
    }

    /// Unauthenticated connections held now.
    pub fn waiting(&self) -> usize {
        self.lock().waiting.len()
    }

    /// A slot for one more event stream of `caller`.
    pub fn watch(self: &std::sync::Arc<Self>, caller: &Caller) -> Result<WatchSlot, WatchRefused> {
        let key = caller.key();
        let mut s = self.lock();
        let all: usize = s.watches.values().sum();
        let mine = s.watches.get(&key).copied().unwrap_or(0);
        if mine >= MAX_WATCHES_PER_CLIENT {
            return Err(WatchRefused::Client);
        }
        if all >= MAX_WATCHES {
            return Err(WatchRefused::All);
        }
        *s.watches.entry(key.clone()).or_default() += 1;
        Ok(WatchSlot {
            door: self.clone(),
            key,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret("abcdefghijklmnop", "abcdefghijklmnop"));
        assert!(!same_secret("abcdefghijklmnop", "abcdefghijklmnoq"));
        assert!(!same_secret("abc", "abcd"));
    }

    #[test]
    fn a_login_code_is_good_once_and_for_a_minute() {
        let door = Door::new(None).unwrap();
        let t0 = Instant::now();
        let code = door.login_code(t0).unwrap();
        assert_eq!(code.len(), 64);
        let sid = door.redeem(&code, t0).expect("a fresh code");
        assert_eq!(door.redeem(&code, t0), None, "used once");
        assert_eq!(door.admits(None, Some(&sid)), Some(Caller::Session(sid)));
        assert_eq!(door.admits(None, Some("forged")), None);
        let late = door.login_code(t0).unwrap();
        assert_eq!(door.redeem(&late, t0 + LOGIN_TTL), None, "too old");
        assert_eq!(door.admits(Some(&door.token), None), Some(Caller::Token));
        assert_eq!(door.admits(Some("wrong"), None), None);
    }

    #[test]
    fn the_oldest_unauthenticated_connection_makes_room_and_an_authenticated_one_stays() {
        let door = Door::new(Some("t".repeat(32))).unwrap();
        let (first, mut first_rx) = door.arrived();
        let (second, mut second_rx) = door.arrived();
        door.authenticated(second);
        for _ in 0..MAX_UNAUTHENTICATED - 1 {
            door.arrived();
        }
        assert!(first_rx.try_recv().is_err(), "room for all so far");
        door.arrived();
        assert!(first_rx.try_recv().is_ok(), "the oldest was closed");
        assert!(second_rx.try_recv().is_err(), "never the authenticated one");
        assert_eq!(door.waiting(), MAX_UNAUTHENTICATED);
        door.left(first);
    }

    #[test]
    fn event_streams_are_capped_per_client_and_in_all() {
        let door = std::sync::Arc::new(Door::new(None).unwrap());
        let a = Caller::Session("a".into());
        let held: Vec<_> = (0..MAX_WATCHES_PER_CLIENT)
            .map(|_| door.watch(&a).unwrap())
            .collect();
        assert!(matches!(door.watch(&a), Err(WatchRefused::Client)));
        assert!(
            door.watch(&Caller::Token).is_ok(),
            "another client is not held up"
        );
        drop(held);
        assert!(door.watch(&a).is_ok(), "slots come back when streams end");
    }
}
