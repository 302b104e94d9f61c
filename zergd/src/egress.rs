//! The egress proxy of confined workers. A sandboxed worker has a network namespace of its
//! own with only loopback in it; its worker agent listens there and hands each connection of
//! the agent CLI (or of a verification or setup command) to zergd over the worker plane
//! (`Worker.Egress`). Here zergd reads the proxy request that starts it (an HTTP `CONNECT
//! host:port`, or a plain HTTP request with an absolute URL), judges the host against the
//! rush's allow list, and either connects it and relays the bytes both ways, or answers `403`
//! with the reason. Every refusal is reported to the supervisor, which records it as an
//! `egress_refused` event.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Largest request head zergd reads before it judges a connection.
pub const MAX_HEAD: usize = 16 << 10;

/// How long a connection to an allowed host may take to open.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(20);

/// What a connection's first bytes ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `CONNECT host:port`: a tunnel (TLS, usually).
    Connect {
        /// Normalised host name.
        host: String,
        /// Port.
        port: u16,
    },
    /// A plain HTTP request through the proxy: `head` is rewritten to origin form.
    Plain {
        /// Normalised host name.
        host: String,
        /// Port.
        port: u16,
        /// The request head as the origin server gets it.
        head: Vec<u8>,
    },
}

impl Request {
    /// `host:port`.
    pub fn target(&self) -> String {
        let (Request::Connect { host, port } | Request::Plain { host, port, .. }) = self;
        if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        }
    }
}

/// Where a request head ends (`\r\n\r\n`), if it has.
pub fn head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// Reads a proxy request head (everything before the blank line). `Err` says what is wrong
/// with it, for the `400` answer.
pub fn parse(head: &[u8]) -> Result<Request, String> {
    let text = std::str::from_utf8(head).map_err(|_| "the request is not text".to_string())?;
    let text = text.strip_suffix("\r\n\r\n").unwrap_or(text);
    let mut lines = text.split("\r\n");
    let first = lines.next().unwrap_or("");
    let mut parts = first.split(' ');
    let (method, target, version) = match (parts.next(), parts.next(), parts.next()) {
        (Some(m), Some(t), Some(v)) if v.starts_with("HTTP/") => (m, t, v),
        _ => return Err(format!("not an HTTP request line: {:.80}", first)),
    };
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = zerg_sandbox::hosts::split_host_port(target, 443)
            .ok_or_else(|| format!("CONNECT to {target:.80}: not host:port"))?;
        return Ok(Request::Connect { host, port });
    }
    let Some(rest) = target.strip_prefix("http://") else {
        return Err(format!(
            "{method} {target:.80}: a proxy request names an http:// URL (https goes through CONNECT)"
        ));
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let (host, port) = zerg_sandbox::hosts::split_host_port(authority, 80)
        .ok_or_else(|| format!("{method} {target:.80}: no host"))?;
    let mut out = format!("{method} {path} {version}\r\n");
    for l in lines {
        let name = l.split(':').next().unwrap_or("").trim();
        if name.eq_ignore_ascii_case("proxy-connection")
            || name.eq_ignore_ascii_case("proxy-authorization")
        {
            continue;
        }
        out.push_str(l);
        out.push_str("\r\n");
    }
    out.push_str("\r\n");
    Ok(Request::Plain {
        host,
        port,
        head: out.into_bytes(),
    })
}

/// The answer to a refused connection.
pub fn refusal(status: &str, why: &str) -> Vec<u8> {
    let body = format!("zerg sandbox: {why}\n");
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Opens the connection `req` asks for, within [`CONNECT_TIMEOUT`].
pub async fn connect(req: &Request) -> Result<TcpStream, String> {
    let (Request::Connect { host, port } | Request::Plain { host, port, .. }) = req;
    match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect((host.as_str(), *port))).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(format!("cannot connect to {}: {e}", req.target())),
        Err(_) => Err(format!(
            "cannot connect to {}: no answer within {} s",
            req.target(),
            CONNECT_TIMEOUT.as_secs()
        )),
    }
}

/// Relays bytes from `up` to the worker (through `send`) until either side closes.
pub async fn pump_up(
    mut up: tokio::net::tcp::OwnedReadHalf,
    send: tokio::sync::mpsc::Sender<Result<zerg_proto::v1::EgressChunk, tonic::Status>>,
) {
    let mut buf = vec![0u8; 32 << 10];
    loop {
        match up.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let chunk = zerg_proto::v1::EgressChunk {
                    data: buf[..n].to_vec(),
                    ..Default::default()
                };
                if send.send(Ok(chunk)).await.is_err() {
                    break;
                }
            }
        }
    }
}

/// Writes `data` to the upstream connection.
pub async fn write_up(up: &mut tokio::net::tcp::OwnedWriteHalf, data: &[u8]) -> bool {
    up.write_all(data).await.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_requests_are_read_as_a_tunnel_or_a_plain_request_in_origin_form() {
        let head = b"CONNECT api.anthropic.com:443 HTTP/1.1\r\nHost: api.anthropic.com:443\r\n\r\n";
        assert_eq!(head_end(head), Some(head.len()));
        assert_eq!(
            parse(&head[..]).unwrap(),
            Request::Connect {
                host: "api.anthropic.com".into(),
                port: 443
            }
        );
        let plain = b"POST http://127.0.0.1:4010/v1/messages HTTP/1.1\r\nHost: 127.0.0.1:4010\r\nProxy-Connection: keep-alive\r\n\r\n";
        match parse(plain).unwrap() {
            Request::Plain { host, port, head } => {
                assert_eq!((host.as_str(), port), ("127.0.0.1", 4010));
                let head = String::from_utf8(head).unwrap();
                assert!(head.starts_with("POST /v1/messages HTTP/1.1\r\n"), "{head}");
                assert!(!head.to_ascii_lowercase().contains("proxy-connection"));
                assert!(head.ends_with("\r\n\r\n"));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            parse(b"GET /x HTTP/1.1\r\n\r\n").is_err(),
            "not a proxy request"
        );
        assert!(parse(b"garbage").is_err());
        assert!(parse(b"CONNECT a b:1 HTTP/1.1\r\n\r\n").is_err());
    }
}
