//! One GET on a connection of its own, for `top --from`, `check`'s look at
//! the daemon and the judge's Prometheus queries. hyper reads the answer
//! however it is framed (a length, chunks, or the close), and the body is
//! capped, so that a wrong URL cannot fill memory.
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpStream, task::JoinHandle};

#[derive(Debug, thiserror::Error)]
pub enum GetError {
    #[error("{0}")]
    Connect(std::io::Error),
    #[error("no connection within {0:?}")]
    ConnectTimeout(Duration),
    #[error("{0}")]
    Request(http::Error),
    #[error("{0}")]
    Http(hyper::Error),
    #[error("an answer larger than {0} bytes")]
    TooLarge(usize),
    #[error("the answer broke off: {0}")]
    Body(String),
}

/// What to ask, and how much to take.
pub struct Get<'a> {
    pub host: &'a str,
    pub port: u16,
    /// The path with its query, as sent.
    pub path: &'a str,
    pub accept: &'static str,
    pub max_body: usize,
    pub connect_timeout: Duration,
}

pub struct Answer {
    pub status: StatusCode,
    pub body: Bytes,
}

/// The task that drives a connection, stopped when the GET is given up.
struct Driver(JoinHandle<Result<(), hyper::Error>>);

impl Drop for Driver {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Get<'_> {
    pub async fn send(&self) -> Result<Answer, GetError> {
        let connect = TcpStream::connect((self.host, self.port));
        let stream = tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| GetError::ConnectTimeout(self.connect_timeout))?
            .map_err(GetError::Connect)?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(GetError::Http)?;
        let _driver = Driver(tokio::spawn(connection));
        let request = Request::get(self.path)
            .header(header::HOST, self.host_header())
            .header(header::ACCEPT, self.accept)
            // One exchange: the server closes after it, nothing is pooled.
            .header(header::CONNECTION, "close")
            .body(Empty::<Bytes>::new())
            .map_err(GetError::Request)?;
        let answer = sender.send_request(request).await.map_err(GetError::Http)?;
        let status = answer.status();
        let body = Limited::new(answer.into_body(), self.max_body).collect().await.map_err(|e| {
            if e.downcast_ref::<LengthLimitError>().is_some() {
                GetError::TooLarge(self.max_body)
            } else {
                GetError::Body(e.to_string())
            }
        })?;
        Ok(Answer { status, body: body.to_bytes() })
    }

    /// `host:port`, an IPv6 address in brackets.
    fn host_header(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}
