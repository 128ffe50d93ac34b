//! The judge's HTTP/1.1: one request per connection, head and body bounded
//! in size and time. Argo Rollouts' `web` provider and Flagger's webhooks
//! send small JSON requests and read one JSON answer; nothing more is
//! spoken, so a general server would only add surface.
use std::time::Duration;

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use super::request::parse_query;

/// A request larger than this is refused: the judge's inputs are a few
/// names and durations.
const MAX_REQUEST: usize = 64 * 1024;
/// A client slower than this to send its request is dropped.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub method: String,
    /// The path without its query.
    pub path: String,
    /// Decoded `key=value` pairs of the query string.
    pub query: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// What a malformed request gets: status 400 with this one line.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RequestError {
    #[error("request head is not HTTP/1.x")]
    BadHead,
    #[error("request larger than {MAX_REQUEST} bytes")]
    TooLarge,
    #[error("Content-Length is not a number")]
    BadLength,
}

/// Reads one request; `Ok(None)` when the client went away or was too slow.
pub async fn read_request(stream: &mut TcpStream) -> std::io::Result<Option<Result<Request, RequestError>>> {
    let mut buf = Vec::with_capacity(2048);
    let read = async {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(parsed) = complete(&buf) {
                return Ok(Some(parsed));
            }
            if buf.len() > MAX_REQUEST {
                return Ok(Some(Err(RequestError::TooLarge)));
            }
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(None);
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    match tokio::time::timeout(READ_TIMEOUT, read).await {
        Ok(r) => r,
        Err(_) => Ok(None),
    }
}

/// The request in `buf` once its head and body have arrived.
fn complete(buf: &[u8]) -> Option<Result<Request, RequestError>> {
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&buf[..head_end]);
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or("").split_whitespace();
    let (Some(method), Some(target), Some(version)) = (first.next(), first.next(), first.next()) else {
        return Some(Err(RequestError::BadHead));
    };
    if !version.starts_with("HTTP/1.") {
        return Some(Err(RequestError::BadHead));
    }
    let mut length = 0usize;
    for line in lines {
        if let Some((name, value)) = line.split_once(':') {
            if name.trim().eq_ignore_ascii_case("content-length") {
                match value.trim().parse() {
                    Ok(n) => length = n,
                    Err(_) => return Some(Err(RequestError::BadLength)),
                }
            }
        }
    }
    if length > MAX_REQUEST {
        return Some(Err(RequestError::TooLarge));
    }
    let body_start = head_end + 4;
    if buf.len() < body_start + length {
        return None;
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    Some(Ok(Request {
        method: method.to_string(),
        path: path.to_string(),
        query: parse_query(query),
        body: buf[body_start..body_start + length].to_vec(),
    }))
}

/// Writes one answer and closes.
pub async fn respond(
    stream: &mut TcpStream,
    status: u16,
    content_type: &str,
    body: &[u8],
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        412 => "Precondition Failed",
        _ => "Status",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_complete_only_with_its_whole_body() {
        let raw =
            b"POST /v1/judge?namespace=ml&window=10m HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n{\"a\"";
        assert_eq!(complete(&raw[..raw.len() - 1]), None);
        let req = complete(raw).expect("complete").expect("valid");
        assert_eq!(req.method, "POST");
        assert_eq!(req.path, "/v1/judge");
        assert_eq!(req.query, vec![("namespace".into(), "ml".into()), ("window".into(), "10m".into())]);
        assert_eq!(req.body, b"{\"a\"");
    }

    #[test]
    fn malformed_heads_are_named() {
        assert_eq!(complete(b"GARBAGE\r\n\r\n"), Some(Err(RequestError::BadHead)));
        assert_eq!(complete(b"GET / SPDY/3\r\n\r\n"), Some(Err(RequestError::BadHead)));
        assert_eq!(
            complete(b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n"),
            Some(Err(RequestError::BadLength))
        );
        assert_eq!(
            complete(b"GET / HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n"),
            Some(Err(RequestError::TooLarge))
        );
    }
}
