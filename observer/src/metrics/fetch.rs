//! One GET of a running daemon's `/metrics` (`top --from URL`, `check
//! --daemon`), on hyper's client (`web::client`), which reads the answer
//! however the server frames it.
use std::time::Duration;

use http::StatusCode;

use crate::web::client::Get;

/// How long a daemon may take to accept, and to answer in whole.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// The per-pod view of a thousand pods is about 20 MB; ten times that is
/// no daemon's.
const MAX_BODY: usize = 256 << 20;

/// Where to read: host, port and path of an `http://` URL.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub host: String,
    pub port: u16,
    pub path: String,
}

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("--from {0}: expected http://HOST[:PORT][/PATH], e.g. http://127.0.0.1:9464/metrics")]
    BadUrl(String),
    #[error("--from {url}: cannot reach it ({reason}); is `canaryscope run` listening there?")]
    Unreachable { url: String, reason: String },
    #[error("--from {url}: answered {status} instead of metrics")]
    Status { url: String, status: String },
}

impl Target {
    /// Parses `http://host[:port][/path]`; the path defaults to `/metrics`,
    /// the port to 80.
    pub fn parse(url: &str) -> Result<Self, FetchError> {
        let (host, port, path) =
            crate::config::parse_http_url(url).ok_or_else(|| FetchError::BadUrl(url.to_string()))?;
        let path = if path.is_empty() || path == "/" { "/metrics".to_string() } else { path };
        Ok(Self { host, port, path })
    }

    fn url(&self) -> String {
        format!("http://{}:{}{}", self.host, self.port, self.path)
    }

    fn unreachable(&self, reason: String) -> FetchError {
        FetchError::Unreachable { url: self.url(), reason }
    }

    /// The body of one GET.
    pub fn get(&self) -> Result<String, FetchError> {
        // The callers are synchronous, and `top`'s loop runs inside a
        // runtime, where blocking on another one would panic: the GET has
        // a thread and a runtime of its own.
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| self.unreachable(format!("cannot start a runtime: {e}")))?;
                    runtime.block_on(self.fetch())
                })
                .join()
                .unwrap_or_else(|_| Err(self.unreachable("the HTTP client panicked".into())))
        })
    }

    async fn fetch(&self) -> Result<String, FetchError> {
        let get = Get {
            host: &self.host,
            port: self.port,
            path: &self.path,
            accept: "text/plain",
            max_body: MAX_BODY,
            connect_timeout: CONNECT_TIMEOUT,
        };
        let answer = tokio::time::timeout(ANSWER_TIMEOUT, get.send())
            .await
            .map_err(|_| self.unreachable(format!("no answer within {ANSWER_TIMEOUT:?}")))?
            .map_err(|e| self.unreachable(e.to_string()))?;
        if answer.status != StatusCode::OK {
            return Err(FetchError::Status { url: self.url(), status: answer.status.to_string() });
        }
        Ok(String::from_utf8_lossy(&answer.body).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_default_to_the_metrics_path() {
        let t = Target::parse("http://127.0.0.1:9464").expect("valid");
        assert_eq!(t, Target { host: "127.0.0.1".into(), port: 9464, path: "/metrics".into() });
        assert_eq!(Target::parse("http://node-a/x").expect("valid").port, 80);
        assert_eq!(Target::parse("http://[::1]:9464/metrics").expect("valid").host, "::1");
        for bad in ["127.0.0.1:9464", "https://node:9464", "http://:9464", "http://h:port"] {
            assert!(matches!(Target::parse(bad), Err(FetchError::BadUrl(_))), "{bad}");
        }
    }

    #[test]
    fn a_closed_port_is_unreachable() {
        // Bound then dropped: nothing listens there now.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let t = Target::parse(&format!("http://127.0.0.1:{port}")).expect("valid");
        let err = t.get().expect_err("nothing listens");
        assert!(matches!(err, FetchError::Unreachable { .. }), "{err}");
    }
}
