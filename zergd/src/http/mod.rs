//! zergd's web dashboard and `/metrics`, served over HTTP/1 when zergd starts with `--http
//! ADDR` (off by default).
//!
//! The page (`page.html`, built into the binary: no CDN, works offline) reads a small JSON API
//! that calls the same control service as zergctl does ([`crate::server::Services`]): the list
//! of rushes, one rush's status, its changes as server-sent events over `Watch`, the tail of a
//! task's log, and `Stop` and `Retry`. `/metrics` is the Prometheus text format
//! ([`metrics`]).
//!
//! Who may call it: only zergd's owner, on loopback as on any other address ([`door`]): a
//! session cookie that `zergctl dashboard`'s one-time link gives, or the token (made at start,
//! in `dashboard.json` beside the control socket, or `ZERG_HTTP_TOKEN`, which an address other
//! than loopback requires) as `Authorization: Bearer`. Without either, everything but the page
//! shell answers 401. On loopback the `Host` header must name a loopback address too, so that a
//! web page elsewhere cannot reach the dashboard through a DNS name that resolves to 127.0.0.1;
//! two `Host` headers get 400. The actions (`POST`) take only `Content-Type:
//! application/json`, which a form on another site cannot send without the browser asking
//! first, and a request whose `Origin` is not the dashboard's own is refused.
//!
//! What a request may cost: a rush is named by a repository and feature that zergd already
//! has registered, compared as strings, so no request makes zergd open a path it names; a log
//! answer is bounded in bytes ([`logs`]), at most [`LOG_READERS`] are read at once, and off the
//! supervisor.

pub mod door;
pub mod logs;
pub mod metrics;
pub mod view;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode, header};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use zerg_proto::v1;
use zerg_proto::v1::control_server::Control;

use crate::calls::RushKey;
use crate::server::Services;

/// The page shell: markup and styles.
const PAGE: &str = include_str!("page.html");

/// The page's script, served as its own file so that the page's policy allows no inline script.
const SCRIPT: &str = include_str!("app.js");

/// How long a connection may take to send a request's headers.
const HEADER_DEADLINE: Duration = Duration::from_secs(2);

/// The largest action body read.
const MAX_BODY: usize = 64 << 10;

/// Log answers read at once; more wait (up to [`LOG_WAIT`]) for a turn.
pub const LOG_READERS: usize = 4;

/// How long a log request waits for a turn before it is told to come back.
const LOG_WAIT: Duration = Duration::from_secs(10);

/// Ended rushes whose status the rush list reads (the most recent ones); older ones show their
/// summary only.
const LIST_ENDED_STATUS: usize = 20;

/// What the dashboard listens on and who may use it.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// The address to listen on (`127.0.0.1:7878`; port 0 picks one).
    pub listen: SocketAddr,
    /// The token every request must carry without a session; required on an address that is
    /// not loopback, made at start on one that is.
    pub token: Option<String>,
    /// What one log answer may cost.
    pub log_limits: logs::LogLimits,
}

/// Why the dashboard cannot start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// Not loopback, and no token.
    #[error(
        "--http {0} is reachable from other machines: set ZERG_HTTP_TOKEN to a secret that every request must carry, or listen on 127.0.0.1"
    )]
    NeedsToken(SocketAddr),
    /// The token is too short to be a secret.
    #[error("ZERG_HTTP_TOKEN must be at least 16 characters (it has {0})")]
    WeakToken(usize),
    /// The address cannot be bound.
    #[error("cannot listen on {addr} for the dashboard")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The token cannot be made or written down.
    #[error("cannot make or keep the dashboard's token in {dir}")]
    Door {
        /// The directory beside the control socket.
        dir: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The dashboard, bound and ready to serve.
pub struct Dashboard {
    listener: TcpListener,
    ctx: Arc<Ctx>,
}

struct Ctx {
    services: Services,
    door: Arc<door::Door>,
    listen: SocketAddr,
    log_limits: logs::LogLimits,
    log_readers: tokio::sync::Semaphore,
    /// The list entries of ended rushes, by rush id and state: an ended rush does not change
    /// until it is retried (and so is no longer ended), and its status is read from disk.
    ended: std::sync::Mutex<std::collections::HashMap<(String, i32), Value>>,
}

type Body = BoxBody<Bytes, Infallible>;

impl Dashboard {
    /// Checks the options, makes the door (its token written to `door_dir`) and binds the
    /// address. The door is returned for the control service's `DashboardLogin`.
    pub async fn bind(
        opts: HttpOptions,
        services: Services,
        door_dir: &Path,
    ) -> Result<(Dashboard, Arc<door::Door>), HttpError> {
        let token = checked_token(&opts)?;
        let door_err = |source| HttpError::Door {
            dir: door_dir.to_path_buf(),
            source,
        };
        let door = Arc::new(door::Door::new(token).map_err(door_err)?);
        let listener = TcpListener::bind(opts.listen)
            .await
            .map_err(|source| HttpError::Bind {
                addr: opts.listen,
                source,
            })?;
        let listen = listener.local_addr().unwrap_or(opts.listen);
        door.opened(listen, door_dir).map_err(door_err)?;
        Ok((
            Dashboard {
                listener,
                ctx: Arc::new(Ctx {
                    services,
                    door: door.clone(),
                    listen,
                    log_limits: opts.log_limits,
                    log_readers: tokio::sync::Semaphore::new(LOG_READERS),
                    ended: Default::default(),
                }),
            },
            door,
        ))
    }

    /// The address it listens on (with the port picked, if 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.ctx.listen
    }

    /// Serves until the task is dropped or aborted. Every connection is accepted at once; the
    /// door closes the oldest unauthenticated one when their pool is full.
    pub async fn serve(self) {
        loop {
            let (stream, _) = match self.listener.accept().await {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "the dashboard cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let ctx = self.ctx.clone();
            let (id, closed) = ctx.door.arrived();
            tokio::spawn(async move {
                let conn = ctx.clone();
                let service = hyper::service::service_fn(move |req| {
                    let ctx = conn.clone();
                    async move { Ok::<_, Infallible>(handle(&ctx, id, req).await) }
                });
                let serving = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(HEADER_DEADLINE)
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                tokio::select! {
                    _ = serving => {}
                    // Fired by the door (a dropped sender means the connection left its pool).
                    Ok(()) = closed => {}
                }
                ctx.door.left(id);
            });
        }
    }
}

/// The token, checked: one is needed on an address that is not loopback, and it must be long
/// enough to be a secret.
fn checked_token(opts: &HttpOptions) -> Result<Option<String>, HttpError> {
    let token = opts.token.clone().filter(|t| !t.is_empty());
    match &token {
        None if !opts.listen.ip().is_loopback() => Err(HttpError::NeedsToken(opts.listen)),
        Some(t) if t.chars().count() < 16 => Err(HttpError::WeakToken(t.chars().count())),
        _ => Ok(token),
    }
}

fn body(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).boxed()
}

fn respond(status: StatusCode, content_type: &str, b: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(body(b));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, hv(content_type));
    h.insert(header::CACHE_CONTROL, hv("no-store"));
    h.insert("x-content-type-options", hv("nosniff"));
    r
}

fn hv(s: &str) -> header::HeaderValue {
    header::HeaderValue::from_str(s).unwrap_or(header::HeaderValue::from_static(""))
}

fn json_reply(v: &Value) -> Response<Body> {
    respond(StatusCode::OK, "application/json", v.to_string())
}

fn error(status: StatusCode, msg: impl std::fmt::Display) -> Response<Body> {
    respond(
        status,
        "application/json",
        json!({ "error": msg.to_string() }).to_string(),
    )
}

/// A control call's refusal as an HTTP status.
fn refused(s: tonic::Status) -> Response<Body> {
    use tonic::Code;
    let status = match s.code() {
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::InvalidArgument | Code::OutOfRange => StatusCode::BAD_REQUEST,
        Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::Unavailable | Code::ResourceExhausted => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, s.message())
}

/// The query's parameters.
fn query(req: &Request<Incoming>) -> Vec<(String, String)> {
    form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .into_owned()
        .collect()
}

fn param<'a>(q: &'a [(String, String)], name: &str) -> Option<&'a str> {
    q.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// The rush a query names (`repo` and `feature`), as zergd registered it: matched as strings,
/// never resolved as a path.
fn rush_key(q: &[(String, String)]) -> Result<RushKey, String> {
    let key = |n: &str| {
        param(q, n)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("the query needs `{n}` (…?repo=<path>&feature=<name>)"))
    };
    Ok(RushKey::registered(key("repo")?, key("feature")?))
}

/// The name of this dashboard's session cookie: the port is in it, so that two zergd on one
/// machine do not overwrite each other's (cookies are not kept apart by port).
fn cookie_name(listen: SocketAddr) -> String {
    format!("zerg_session_{}", listen.port())
}

/// The value of cookie `name` in the request, if sent.
fn cookie<'a>(req: &'a Request<Incoming>, name: &str) -> Option<&'a str> {
    req.headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

impl Ctx {
    /// Who sent the request, when it carries the session cookie or the token.
    fn caller(&self, req: &Request<Incoming>) -> Option<door::Caller> {
        let bearer = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        self.door
            .admits(bearer, cookie(req, &cookie_name(self.listen)))
    }

    /// On loopback the dashboard answers only to loopback names: a page elsewhere whose host
    /// name resolves to 127.0.0.1 gets nothing.
    fn host_allowed(&self, req: &Request<Incoming>) -> bool {
        if !self.listen.ip().is_loopback() {
            return true;
        }
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .or(req.uri().authority().map(|a| a.as_str()))
            .unwrap_or("");
        let name = match host.rsplit_once(':') {
            Some((n, port)) if port.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => host,
        };
        let name = name.trim_start_matches('[').trim_end_matches(']');
        name.eq_ignore_ascii_case("localhost")
            || name
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    }

    /// A session for whoever holds `code` (a login code or the token): to `/` with the
    /// cookie set, or back to the page saying the link is spent.
    fn log_in(&self, code: &str) -> Response<Body> {
        let mut r = respond(StatusCode::SEE_OTHER, "text/plain; charset=utf-8", "");
        let h = r.headers_mut();
        h.insert(header::REFERRER_POLICY, hv("no-referrer"));
        match self.door.redeem(code, std::time::Instant::now()) {
            Some(sid) => {
                h.insert(header::LOCATION, hv("/"));
                h.insert(
                    header::SET_COOKIE,
                    hv(&format!(
                        "{}={sid}; Path=/; HttpOnly; SameSite=Strict",
                        cookie_name(self.listen)
                    )),
                );
            }
            None => {
                h.insert(header::LOCATION, hv("/?expired=1"));
            }
        }
        r
    }
}

fn unauthorised() -> Response<Body> {
    let mut r = error(
        StatusCode::UNAUTHORIZED,
        "this dashboard is its owner's: open the address `zergctl dashboard` prints, or send Authorization: Bearer <token> (the token is in dashboard.json beside zergd's socket)",
    );
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, hv("Bearer realm=\"zergd\""));
    r
}

async fn handle(ctx: &Ctx, conn: u64, req: Request<Incoming>) -> Response<Body> {
    if req.headers().get_all(header::HOST).iter().count() > 1 {
        return error(StatusCode::BAD_REQUEST, "a request has one Host header");
    }
    if !ctx.host_allowed(&req) {
        return error(
            StatusCode::FORBIDDEN,
            "this dashboard answers only to a loopback host name (127.0.0.1, localhost, [::1])",
        );
    }
    let q = query(&req);
    let path = req.uri().path().to_string();
    match (req.method(), path.as_str()) {
        (&Method::GET, "/" | "/index.html") => {
            return match param(&q, "login").or(param(&q, "token")) {
                Some(code) => ctx.log_in(code),
                None => page(),
            };
        }
        (&Method::GET, "/app.js") => return script(),
        (&Method::POST, "/api/session") => return session(ctx, req).await,
        _ => {}
    }
    let Some(caller) = ctx.caller(&req) else {
        return unauthorised();
    };
    ctx.door.authenticated(conn);
    match (req.method(), path.as_str()) {
        (&Method::GET, "/api/info") => json_reply(&json!({
            "version": env!("CARGO_PKG_VERSION"),
            "listen": ctx.listen.to_string(),
            "loopback": ctx.listen.ip().is_loopback(),
        })),
        (&Method::GET, "/api/rushes") => rushes(ctx).await,
        (&Method::GET, "/api/rush") => match rush_key(&q) {
            Ok(key) => match ctx.services.rush_status(key).await {
                Ok(s) => json_reply(&view::rush(&s, SystemTime::now())),
                Err(e) => refused(e),
            },
            Err(m) => error(StatusCode::BAD_REQUEST, m),
        },
        (&Method::GET, "/api/watch") => match rush_key(&q) {
            Ok(key) => watch(ctx, &caller, key).await,
            Err(m) => error(StatusCode::BAD_REQUEST, m),
        },
        (&Method::GET, "/api/log") => match rush_key(&q) {
            Ok(key) => task_log(ctx, key, &q).await,
            Err(m) => error(StatusCode::BAD_REQUEST, m),
        },
        (&Method::POST, "/api/stop" | "/api/retry" | "/api/note") => action(ctx, &path, req).await,
        (&Method::GET, "/metrics") => {
            let text = metrics::render(&ctx.services).await;
            respond(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                text,
            )
        }
        (_, "/" | "/index.html" | "/app.js" | "/api/session" | "/api/info" | "/api/rushes")
        | (
            _,
            "/api/rush" | "/api/watch" | "/api/log" | "/api/stop" | "/api/retry" | "/api/note"
            | "/metrics",
        ) => error(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{} does not take {}", path, req.method()),
        ),
        _ => error(StatusCode::NOT_FOUND, format!("no such page: {path}")),
    }
}

/// `POST /api/session {"token": …}`: the page's form trades the token for a session cookie,
/// so that the page holds no secret itself.
async fn session(ctx: &Ctx, req: Request<Incoming>) -> Response<Body> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Login {
        token: String,
    }
    if let Some(r) = not_json(&req) {
        return r;
    }
    let bytes = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return error(StatusCode::PAYLOAD_TOO_LARGE, e),
    };
    let login: Login = match serde_json::from_slice(&bytes) {
        Ok(l) => l,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("/api/session: {e}")),
    };
    let r = ctx.log_in(&login.token);
    if r.headers().contains_key(header::SET_COOKIE) {
        let mut ok = json_reply(&json!({"session": true}));
        if let Some(c) = r.headers().get(header::SET_COOKIE) {
            ok.headers_mut().insert(header::SET_COOKIE, c.clone());
        }
        ok
    } else {
        unauthorised()
    }
}

/// A 415 unless the request's body is JSON.
fn not_json(req: &Request<Incoming>) -> Option<Response<Body>> {
    let json_body = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(';').next().unwrap_or("").trim() == "application/json");
    (!json_body).then(|| {
        error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "this takes a JSON body with Content-Type: application/json",
        )
    })
}

fn page() -> Response<Body> {
    let mut r = respond(StatusCode::OK, "text/html; charset=utf-8", PAGE);
    let h = r.headers_mut();
    // The page loads its own script and nothing else; no other site may frame it.
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        hv("default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    );
    h.insert(header::X_FRAME_OPTIONS, hv("DENY"));
    h.insert(header::REFERRER_POLICY, hv("no-referrer"));
    r
}

fn script() -> Response<Body> {
    respond(StatusCode::OK, "text/javascript; charset=utf-8", SCRIPT)
}

/// Every rush, most recent first, with the status of those that have not ended and of the most
/// recent ended ones.
async fn rushes(ctx: &Ctx) -> Response<Body> {
    let list = match ctx
        .services
        .list(tonic::Request::new(v1::ListRequest {}))
        .await
    {
        Ok(l) => l.into_inner().rushes,
        Err(e) => return refused(e),
    };
    let mut list = list;
    list.sort_by(|a, b| b.started_at.cmp(&a.started_at));
    let mut ended_read = 0;
    let mut out = Vec::with_capacity(list.len());
    let mut keep = std::collections::HashSet::new();
    for r in &list {
        let ended = metrics::ended(r.state);
        let key = (r.rush_id.clone(), r.state);
        if ended
            && let Some(v) = ctx
                .ended
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&key)
        {
            keep.insert(key);
            out.push(v.clone());
            continue;
        }
        let read = !ended || ended_read < LIST_ENDED_STATUS;
        ended_read += usize::from(ended && read);
        let status = if read {
            ctx.services
                .rush_status(RushKey::registered(r.repo.clone(), r.feature.clone()))
                .await
                .ok()
        } else {
            None
        };
        let v = view::summary(r, status.as_ref());
        if ended && status.is_some() {
            ctx.ended
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key.clone(), v.clone());
            keep.insert(key);
        }
        out.push(v);
    }
    // Rushes pruned or retried since are forgotten.
    ctx.ended
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|k, _| keep.contains(k));
    json_reply(&json!({ "rushes": out }))
}

/// A rush's changes as server-sent events: `status` (the whole status, first and after each
/// batch of changes), `message` (one line of what happened), and `end` when the rush has ended
/// and nothing more will come.
async fn watch(ctx: &Ctx, caller: &door::Caller, key: RushKey) -> Response<Body> {
    let slot = match ctx.door.watch(caller) {
        Ok(s) => s,
        Err(why) => {
            let msg = match why {
                door::WatchRefused::Client => format!(
                    "this client holds {} event streams already: close one",
                    door::MAX_WATCHES_PER_CLIENT
                ),
                door::WatchRefused::All => format!(
                    "the dashboard serves {} event streams already",
                    door::MAX_WATCHES
                ),
            };
            return error(StatusCode::TOO_MANY_REQUESTS, msg);
        }
    };
    let events = match ctx.services.watch_rush(key).await {
        Ok(s) => s,
        Err(e) => return refused(e),
    };
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(async move {
        forward(events, tx).await;
        drop(slot);
    });
    let stream = ReceiverStream::new(rx).map(|b| Ok::<_, Infallible>(Frame::data(b)));
    let mut r = Response::new(StreamBody::new(stream).boxed());
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, hv("text/event-stream"));
    h.insert(header::CACHE_CONTROL, hv("no-store"));
    r
}

fn sse(event: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

/// Copies a `Watch` stream to the browser. Updates that arrive together go out as their lines
/// and one status (the last): a burst of events is one redraw, not hundreds. A comment every
/// 15 s keeps proxies from closing a quiet stream; the copy ends when the browser goes.
async fn forward(
    mut events: tokio_stream::wrappers::ReceiverStream<Result<v1::WatchEvent, tonic::Status>>,
    tx: mpsc::Sender<Bytes>,
) {
    // The status as the deltas build it.
    let mut held: Option<v1::RushStatus> = None;
    let level = |l: i32| match v1::EventLevel::try_from(l) {
        Ok(v1::EventLevel::Warn) => "warn",
        Ok(v1::EventLevel::Error) => "error",
        _ => "info",
    };
    loop {
        let first = tokio::select! {
            e = events.next() => e,
            () = tokio::time::sleep(Duration::from_secs(15)) => {
                if tx.send(Bytes::from_static(b": keep-alive\n\n")).await.is_err() {
                    return;
                }
                continue;
            }
            () = tx.closed() => return,
        };
        let Some(first) = first else {
            let _ = tx.send(sse("end", &json!({}))).await;
            return;
        };
        let mut batch = vec![first];
        while batch.len() < 256 {
            match tokio::time::timeout(Duration::ZERO, events.next()).await {
                Ok(Some(e)) => batch.push(e),
                _ => break,
            }
        }
        let mut out = Vec::new();
        let mut changed = false;
        for e in batch {
            let mut e = match e {
                Ok(e) => e,
                Err(s) => {
                    let _ = tx
                        .send(sse(
                            "message",
                            &json!({"event": "error", "level": "error", "message": s.message()}),
                        ))
                        .await;
                    return;
                }
            };
            if !e.message.is_empty() {
                out.extend_from_slice(&sse(
                    "message",
                    &json!({"event": e.event, "level": level(e.level), "message": e.message}),
                ));
            }
            changed |= zerg_proto::watch::apply(&mut held, &mut e);
        }
        if changed && let Some(s) = &held {
            out.extend_from_slice(&sse("status", &view::rush(s, SystemTime::now())));
        }
        if !out.is_empty() && tx.send(Bytes::from(out)).await.is_err() {
            return;
        }
    }
}

/// What is new in each file of a task's output (`.zerg/logs/tasks/<task>/`) since the offsets
/// the page names (`at=<file>:<offset>`, repeated), or the end of each file, within the log
/// limits.
async fn task_log(ctx: &Ctx, key: RushKey, q: &[(String, String)]) -> Response<Body> {
    let Some(task) = param(q, "task").filter(|t| !t.is_empty()) else {
        return error(StatusCode::BAD_REQUEST, "the query needs `task`");
    };
    let at: Vec<(String, u64)> = q
        .iter()
        .filter(|(k, _)| k == "at")
        .filter_map(|(_, v)| v.rsplit_once(':'))
        .filter_map(|(n, o)| Some((n.to_string(), o.parse().ok()?)))
        .take(64)
        .collect();
    let status = match ctx.services.rush_status(key).await {
        Ok(s) => s,
        Err(e) => return refused(e),
    };
    // Only a task of the rush: its id, not the query, names the directory.
    let Some((task, _)) = status.tasks.get_key_value(task) else {
        return error(
            StatusCode::NOT_FOUND,
            format!("rush {} has no task {task}", status.feature),
        );
    };
    let Ok(Ok(_turn)) = tokio::time::timeout(LOG_WAIT, ctx.log_readers.acquire()).await else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{LOG_READERS} logs are being read: ask again in a moment"),
        );
    };
    let repo = std::path::PathBuf::from(&status.repo);
    let (task, limits) = (task.clone(), ctx.log_limits);
    let t = task.clone();
    let files = tokio::task::spawn_blocking(move || logs::read(&repo, &t, &at, limits))
        .await
        .unwrap_or_default();
    json_reply(&json!({
        "task": task,
        "files": files,
        "limits": {"file_bytes": limits.file_bytes, "response_bytes": limits.response_bytes},
    }))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct StopBody {
    repo: String,
    feature: String,
    #[serde(default)]
    force: bool,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryBody {
    repo: String,
    feature: String,
    #[serde(default)]
    task_ids: Vec<String>,
    #[serde(default)]
    reset: bool,
    #[serde(default)]
    note: String,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NoteBody {
    repo: String,
    feature: String,
    task_id: String,
    text: String,
    #[serde(default)]
    restart: bool,
}

/// `POST /api/stop`, `/api/retry` and `/api/note`: the same calls as `zergctl stop`,
/// `zergctl retry` and `zergctl note`.
async fn action(ctx: &Ctx, path: &str, req: Request<Incoming>) -> Response<Body> {
    if let Some(r) = not_json(&req) {
        return r;
    }
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let own = [
            format!("http://{}", ctx.listen),
            req.headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(|h| format!("http://{h}"))
                .unwrap_or_default(),
        ];
        if !own.iter().any(|o| origin.as_bytes() == o.as_bytes()) {
            return error(
                StatusCode::FORBIDDEN,
                "an action from another site's page is refused",
            );
        }
    }
    let bytes = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body cannot be read (at most {MAX_BODY} bytes): {e}"),
            );
        }
    };
    let bad = |e: serde_json::Error| error(StatusCode::BAD_REQUEST, format!("{path}: {e}"));
    if path == "/api/stop" {
        let b: StopBody = match serde_json::from_slice(&bytes) {
            Ok(b) => b,
            Err(e) => return bad(e),
        };
        match ctx
            .services
            .stop_rush(crate::calls::StopRush {
                key: RushKey::registered(&b.repo, &b.feature),
                force: b.force,
            })
            .await
        {
            Ok(n) => json_reply(&json!({"workers_signalled": n})),
            Err(e) => refused(e),
        }
    } else if path == "/api/note" {
        let b: NoteBody = match serde_json::from_slice(&bytes) {
            Ok(b) => b,
            Err(e) => return bad(e),
        };
        let text = match crate::calls::note_text("text", &b.text) {
            Ok(t) => t,
            Err(e) => return error(StatusCode::BAD_REQUEST, format!("{path}: {e}")),
        };
        match ctx
            .services
            .note_task(crate::calls::NoteTask {
                key: RushKey::registered(&b.repo, &b.feature),
                task_id: b.task_id,
                text,
                restart: b.restart,
            })
            .await
        {
            Ok(n) => json_reply(&json!({"notes": n.notes, "outcome": n.outcome})),
            Err(e) => refused(e),
        }
    } else {
        let b: RetryBody = match serde_json::from_slice(&bytes) {
            Ok(b) => b,
            Err(e) => return bad(e),
        };
        match ctx
            .services
            .retry_tasks(crate::calls::RetryTasks {
                key: RushKey::registered(&b.repo, &b.feature),
                task_ids: b.task_ids,
                reset: b.reset,
                max_usd: None,
                note: match b.note.trim() {
                    "" => None,
                    n => match crate::calls::note_text("note", n) {
                        Ok(t) => Some(t),
                        Err(e) => return error(StatusCode::BAD_REQUEST, format!("{path}: {e}")),
                    },
                },
            })
            .await
        {
            Ok(n) => json_reply(&json!({"requeued": n})),
            Err(e) => refused(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_network_address_needs_a_token_of_some_length() {
        let opts = |listen: &str, token: Option<&str>| HttpOptions {
            listen: listen.parse().unwrap(),
            token: token.map(str::to_string),
            log_limits: logs::LogLimits::default(),
        };
        let e = checked_token(&opts("0.0.0.0:0", None)).unwrap_err();
        assert!(e.to_string().contains("ZERG_HTTP_TOKEN"), "{e}");
        let e = checked_token(&opts("0.0.0.0:0", Some("short"))).unwrap_err();
        assert!(e.to_string().contains("at least 16"), "{e}");
        let t = "0123456789abcdef";
        assert_eq!(
            checked_token(&opts("0.0.0.0:0", Some(t)))
                .unwrap()
                .as_deref(),
            Some(t)
        );
        assert_eq!(checked_token(&opts("127.0.0.1:0", Some(""))).unwrap(), None);
        assert_eq!(checked_token(&opts("[::1]:0", None)).unwrap(), None);
    }
}
