//! The judge's HTTP: hyper's parser within `web::server`'s limits, one
//! request per connection. Argo Rollouts' `web` provider and Flagger's
//! webhooks send a small request (a query string, a JSON body) and read one
//! JSON answer.
use std::{future::Future, time::Duration};

use bytes::Bytes;
use http::StatusCode;
use tokio::net::TcpListener;

use super::request::parse_query;
use crate::web::server::{self, answer, Answer, Limits};

/// What one client may take of the judge. A question is a few names and
/// durations; an answer is due within the judge's deadline, which the
/// limits leave alone (only waiting on the client is bounded).
pub const LIMITS: Limits = Limits {
    connections: 256,
    head_timeout: Duration::from_secs(5),
    head_bytes: 16 * 1024,
    body_timeout: Duration::from_secs(10),
    body_bytes: 64 * 1024,
    write_timeout: Duration::from_secs(10),
};

#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub method: String,
    /// The path without its query.
    pub path: String,
    /// Decoded `key=value` pairs of the query string.
    pub query: Vec<(String, String)>,
    pub body: Bytes,
}

impl Request {
    pub fn from_http(request: http::Request<Bytes>) -> Self {
        let (head, body) = request.into_parts();
        Self {
            method: head.method.as_str().to_string(),
            path: head.uri.path().to_string(),
            query: parse_query(head.uri.query().unwrap_or("")),
            body,
        }
    }
}

/// The judge's answer to one request.
#[derive(Debug, PartialEq)]
pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Bytes,
}

impl Reply {
    pub fn new(status: u16, content_type: &'static str, body: impl Into<Bytes>) -> Self {
        Self { status, content_type, body: body.into() }
    }

    fn into_answer(self) -> Answer {
        match StatusCode::from_u16(self.status) {
            Ok(status) => answer(status, self.content_type, self.body),
            Err(_) => answer(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", "no such status\n"),
        }
    }
}

/// Answers every connection on `listener` with `judge`, for ever.
pub async fn serve<J, F>(listener: TcpListener, judge: J)
where
    J: Fn(Request) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Reply> + Send + 'static,
{
    server::serve(listener, LIMITS, move |request| ask(judge.clone(), request)).await;
}

/// The judge's answer to one request as hyper takes it; the fuzz target
/// serves a connection in memory with it.
pub async fn ask<J, F>(judge: J, request: http::Request<Bytes>) -> Answer
where
    J: Fn(Request) -> F,
    F: Future<Output = Reply>,
{
    judge(Request::from_http(request)).await.into_answer()
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::web::server::{answer_connection, Connections};

    /// What the judge answers to `raw`, sent whole, and the request it saw.
    async fn exchange(raw: &[u8]) -> (String, Option<Request>) {
        let (mut client, served) = tokio::io::duplex(1 << 20);
        let seen = std::sync::Arc::new(std::sync::Mutex::new(None));
        let judge = {
            let seen = seen.clone();
            move |request: Request| {
                let lines = format!("{} {}\n", request.method, request.path);
                *seen.lock().expect("lock") = Some(request);
                async move { Reply::new(200, "text/plain", lines) }
            }
        };
        let slot = Connections::new(1).admit().await.expect("room");
        let server = tokio::spawn(answer_connection(served, slot, LIMITS, move |r| ask(judge.clone(), r)));
        client.write_all(raw).await.expect("write");
        client.shutdown().await.expect("shutdown");
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.expect("read");
        server.await.expect("served");
        let seen = seen.lock().expect("lock").take();
        (String::from_utf8_lossy(&answer).into_owned(), seen)
    }

    #[tokio::test]
    async fn a_request_reaches_the_judge_with_its_query_decoded_and_its_whole_body() {
        let raw =
            b"POST /v1/judge?namespace=ml&window=10m HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n{\"a\"";
        let (answer, seen) = exchange(raw).await;
        assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
        assert!(answer.to_ascii_lowercase().contains("connection: close\r\n"), "{answer}");
        let request = seen.expect("the judge was asked");
        assert_eq!(request.method, "POST");
        assert_eq!(request.path, "/v1/judge");
        assert_eq!(request.query, vec![("namespace".into(), "ml".into()), ("window".into(), "10m".into())]);
        assert_eq!(&request.body[..], b"{\"a\"");
    }

    #[tokio::test]
    async fn malformed_and_oversized_requests_are_refused_before_the_judge() {
        for (raw, status) in [
            (&b"GARBAGE\r\n\r\n"[..], "400"),
            (b"GET / SPDY/3\r\n\r\n", "400"),
            (b"GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n", "400"),
            (b"POST / HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n", "400"),
        ] {
            let (answer, seen) = exchange(raw).await;
            assert_eq!(
                answer.split(' ').nth(1),
                Some(status),
                "{:?}: {answer}",
                String::from_utf8_lossy(raw)
            );
            assert_eq!(seen, None, "{answer}");
        }
        let too_long = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(LIMITS.head_bytes));
        let (answer, seen) = exchange(too_long.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 431 "), "{answer}");
        assert_eq!(seen, None);
        // A body past the limit is told in one line.
        let (answer, _) = exchange(b"POST / HTTP/1.1\r\nContent-Length: 999999999\r\n\r\n").await;
        let body = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
        assert_eq!(body, "request body larger than 65536 bytes\n");
    }
}
