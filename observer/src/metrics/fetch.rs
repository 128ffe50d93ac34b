//! One GET of a running daemon's `/metrics` (`top --from URL`, `check
//! --daemon`). Plain HTTP
//! over a TCP stream is all the exporter speaks (see `metrics/server.rs`);
//! HTTP/1.0 keeps any other server from chunking its answer.
use std::{
    io::{Read, Write},
    net::{TcpStream, ToSocketAddrs},
    time::Duration,
};

/// How long a daemon may take to accept and to answer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const READ_TIMEOUT: Duration = Duration::from_secs(5);

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

    /// The body of one GET.
    pub fn get(&self) -> Result<String, FetchError> {
        let unreachable = |reason: String| FetchError::Unreachable { url: self.url(), reason };
        let addr = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| unreachable(e.to_string()))?
            .next()
            .ok_or_else(|| unreachable("no address".into()))?;
        let mut stream =
            TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(|e| unreachable(e.to_string()))?;
        stream.set_read_timeout(Some(READ_TIMEOUT)).map_err(|e| unreachable(e.to_string()))?;
        let request =
            format!("GET {} HTTP/1.0\r\nHost: {}\r\nAccept: text/plain\r\n\r\n", self.path, self.host);
        stream.write_all(request.as_bytes()).map_err(|e| unreachable(e.to_string()))?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).map_err(|e| unreachable(e.to_string()))?;
        let answer = String::from_utf8_lossy(&answer);
        let (head, body) =
            answer.split_once("\r\n\r\n").ok_or_else(|| unreachable("no HTTP answer".into()))?;
        let status = head.lines().next().unwrap_or("");
        let code = status.split_whitespace().nth(1).unwrap_or("");
        if code != "200" {
            return Err(FetchError::Status { url: self.url(), status: status.to_string() });
        }
        Ok(body.to_string())
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
