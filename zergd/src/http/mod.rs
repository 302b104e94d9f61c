//! zergd's web dashboard and `/metrics`, served over HTTP/1 when zergd starts with `--http
//! ADDR` (off by default).
//!
//! The page (`page.html`, built into the binary: no CDN, works offline) reads a small JSON API
//! that calls the same control service as zergctl does ([`crate::server::Services`]): the list
//! of rushes, one rush's status, its changes as server-sent events over `Watch`, the tail of a
//! task's log, and `Stop` and `Retry`. `/metrics` is the Prometheus text format
//! ([`metrics`]).
//!
//! Who may call it: on a loopback address, anyone on this machine, as with any local web
//! server; the `Host` header must then name a loopback address too, so that a web page
//! elsewhere cannot reach the dashboard through a DNS name that resolves to 127.0.0.1. Any
//! other address needs a token (`ZERG_HTTP_TOKEN`), sent as `Authorization: Bearer <token>`
//! or `?token=<token>`; zergd refuses to start without one. The actions (`POST`) take only
//! `Content-Type: application/json`, which a form on another site cannot send without the
//! browser asking first, and a request whose `Origin` is not the dashboard's own is refused.

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

/// The page, with its script and styles inline.
const PAGE: &str = include_str!("page.html");

/// Connections served at once; more wait in the listen queue.
const MAX_CONNECTIONS: usize = 64;

/// The largest action body read.
const MAX_BODY: usize = 64 << 10;

/// Ended rushes whose status the rush list reads (the most recent ones); older ones show their
/// summary only.
const LIST_ENDED_STATUS: usize = 20;

/// What the dashboard listens on and who may use it.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// The address to listen on (`127.0.0.1:7878`; port 0 picks one).
    pub listen: SocketAddr,
    /// The token every request must carry; required on an address that is not loopback.
    pub token: Option<String>,
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
}

/// The dashboard, bound and ready to serve.
pub struct Dashboard {
    listener: TcpListener,
    ctx: Arc<Ctx>,
}

struct Ctx {
    services: Services,
    token: Option<String>,
    listen: SocketAddr,
    /// The list entries of ended rushes, by rush id and state: an ended rush does not change
    /// until it is retried (and so is no longer ended), and its status is read from disk.
    ended: std::sync::Mutex<std::collections::HashMap<(String, i32), Value>>,
}

type Body = BoxBody<Bytes, Infallible>;

impl Dashboard {
    /// Checks the options and binds the address.
    pub async fn bind(opts: HttpOptions, services: Services) -> Result<Dashboard, HttpError> {
        let token = checked_token(&opts)?;
        let listener = TcpListener::bind(opts.listen)
            .await
            .map_err(|source| HttpError::Bind {
                addr: opts.listen,
                source,
            })?;
        let listen = listener.local_addr().unwrap_or(opts.listen);
        Ok(Dashboard {
            listener,
            ctx: Arc::new(Ctx {
                services,
                token,
                listen,
                ended: Default::default(),
            }),
        })
    }

    /// The address it listens on (with the port picked, if 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.ctx.listen
    }

    /// Serves until the task is dropped or aborted.
    pub async fn serve(self) {
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                return;
            };
            let (stream, _) = match self.listener.accept().await {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "the dashboard cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let ctx = self.ctx.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let ctx = ctx.clone();
                    async move { Ok::<_, Infallible>(handle(&ctx, req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(10))
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
                drop(permit);
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

/// The rush a query names (`repo` and `feature`).
fn rush_key(q: &[(String, String)]) -> Result<RushKey, String> {
    let key = |n: &str| {
        param(q, n)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("the query needs `{n}` (…?repo=<path>&feature=<name>)"))
    };
    Ok(RushKey {
        repo: key("repo")?.to_string(),
        feature: key("feature")?.to_string(),
    })
}

/// Compares two strings in time that does not depend on where they differ.
fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl Ctx {
    /// Whether the request carries the token, where one is needed.
    fn authorised(&self, req: &Request<Incoming>, q: &[(String, String)]) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let bearer = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        bearer
            .or(param(q, "token"))
            .is_some_and(|t| same_secret(t, token))
    }

    /// Without a token the dashboard answers only to loopback names: a page elsewhere whose
    /// host name resolves to 127.0.0.1 gets nothing.
    fn host_allowed(&self, req: &Request<Incoming>) -> bool {
        if self.token.is_some() {
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
}

async fn handle(ctx: &Ctx, req: Request<Incoming>) -> Response<Body> {
    if !ctx.host_allowed(&req) {
        return error(
            StatusCode::FORBIDDEN,
            "this dashboard answers only to a loopback host name (127.0.0.1, localhost, [::1])",
        );
    }
    let q = query(&req);
    let path = req.uri().path().to_string();
    let open = matches!(path.as_str(), "/" | "/index.html" | "/api/info");
    if !open && !ctx.authorised(&req, &q) {
        let mut r = error(
            StatusCode::UNAUTHORIZED,
            "this dashboard needs its token (Authorization: Bearer <token>, or ?token=<token>)",
        );
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, hv("Bearer realm=\"zergd\""));
        return r;
    }
    match (req.method(), path.as_str()) {
        (&Method::GET, "/" | "/index.html") => page(),
        (&Method::GET, "/api/info") => json_reply(&json!({
            "version": env!("CARGO_PKG_VERSION"),
            "listen": ctx.listen.to_string(),
            "loopback": ctx.listen.ip().is_loopback(),
            "token_required": ctx.token.is_some(),
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
            Ok(key) => watch(ctx, key).await,
            Err(m) => error(StatusCode::BAD_REQUEST, m),
        },
        (&Method::GET, "/api/log") => match rush_key(&q) {
            Ok(key) => task_log(ctx, key, &q).await,
            Err(m) => error(StatusCode::BAD_REQUEST, m),
        },
        (&Method::POST, "/api/stop" | "/api/retry") => action(ctx, &path, req).await,
        (&Method::GET, "/metrics") => {
            let text = metrics::render(&ctx.services).await;
            respond(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                text,
            )
        }
        (_, "/" | "/index.html" | "/api/info" | "/api/rushes" | "/api/rush" | "/api/watch")
        | (_, "/api/log" | "/api/stop" | "/api/retry" | "/metrics") => error(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{} does not take {}", path, req.method()),
        ),
        _ => error(StatusCode::NOT_FOUND, format!("no such page: {path}")),
    }
}

fn page() -> Response<Body> {
    let mut r = respond(StatusCode::OK, "text/html; charset=utf-8", PAGE);
    let h = r.headers_mut();
    // Everything the page needs is in it: nothing else may load, and no other site may frame it.
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        hv("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    );
    h.insert(header::X_FRAME_OPTIONS, hv("DENY"));
    // The token may be in the page's address: it goes nowhere else.
    h.insert(header::REFERRER_POLICY, hv("no-referrer"));
    r
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
                .rush_status(RushKey {
                    repo: r.repo.clone(),
                    feature: r.feature.clone(),
                })
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
async fn watch(ctx: &Ctx, key: RushKey) -> Response<Body> {
    let events = match ctx
        .services
        .watch(tonic::Request::new(v1::WatchRequest {
            repo: key.repo,
            feature: key.feature,
            // Each browser gets whole statuses, built here from the deltas.
            deltas: true,
        }))
        .await
    {
        Ok(s) => s.into_inner(),
        Err(e) => return refused(e),
    };
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(forward(events, tx));
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

/// The last lines of each file of a task's output (`.zerg/logs/tasks/<task>/`).
async fn task_log(ctx: &Ctx, key: RushKey, q: &[(String, String)]) -> Response<Body> {
    let Some(task) = param(q, "task").filter(|t| !t.is_empty()) else {
        return error(StatusCode::BAD_REQUEST, "the query needs `task`");
    };
    let tail = param(q, "tail")
        .and_then(|t| t.parse::<usize>().ok())
        .unwrap_or(200)
        .clamp(1, 5000);
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
    let dir = Path::new(&status.repo)
        .join(".zerg")
        .join("logs")
        .join("tasks")
        .join(task);
    let task = task.clone();
    let files = tokio::task::spawn_blocking(move || read_tails(&dir, tail))
        .await
        .unwrap_or_default();
    json_reply(&json!({ "task": task, "files": files }))
}

/// The tails of the regular files in `dir` (at most 20, by name), never through a symlink.
fn read_tails(dir: &Path, tail: usize) -> Vec<Value> {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<_> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name())
        .collect();
    names.sort();
    names
        .into_iter()
        .take(20)
        .filter_map(|name| {
            let mut f = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
                .open(dir.join(&name))
                .ok()?;
            if !f.metadata().ok()?.is_file() {
                return None;
            }
            // One line more than asked tells whether there was more before.
            let (mut lines, _) = crate::logtail::tail(&mut f, tail + 1).ok()?;
            let truncated = lines.len() > tail;
            if lines.len() > tail {
                lines.drain(..lines.len() - tail);
            }
            Some(json!({
                "name": name.to_string_lossy(),
                "lines": lines,
                "truncated": truncated,
            }))
        })
        .collect()
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
}

/// `POST /api/stop` and `/api/retry`: the same calls as `zergctl stop` and `zergctl retry`.
async fn action(ctx: &Ctx, path: &str, req: Request<Incoming>) -> Response<Body> {
    let json_body = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(';').next().unwrap_or("").trim() == "application/json");
    if !json_body {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "actions take a JSON body with Content-Type: application/json",
        );
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
            .stop(tonic::Request::new(v1::StopRequest {
                repo: b.repo,
                feature: b.feature,
                force: b.force,
            }))
            .await
        {
            Ok(r) => json_reply(&json!({"workers_signalled": r.into_inner().workers_signalled})),
            Err(e) => refused(e),
        }
    } else {
        let b: RetryBody = match serde_json::from_slice(&bytes) {
            Ok(b) => b,
            Err(e) => return bad(e),
        };
        match ctx
            .services
            .retry(tonic::Request::new(v1::RetryRequest {
                repo: b.repo,
                feature: b.feature,
                task_ids: b.task_ids,
                reset: b.reset,
                max_usd: None,
            }))
            .await
        {
            Ok(r) => json_reply(&json!({"requeued": r.into_inner().requeued})),
            Err(e) => refused(e),
        }
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
    fn a_network_address_needs_a_token_of_some_length() {
        let opts = |listen: &str, token: Option<&str>| HttpOptions {
            listen: listen.parse().unwrap(),
            token: token.map(str::to_string),
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
