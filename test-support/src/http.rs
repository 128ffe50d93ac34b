//! Plain HTTP/1.1 on loopback and metric lines.
use std::time::Duration;

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let code = buf.split_whitespace().nth(1)?.parse().ok()?;
    let (head, body) = buf.split_once("\r\n\r\n").unwrap_or((&buf, ""));
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase().starts_with("transfer-encoding:") && l.to_ascii_lowercase().contains("chunked")
    });
    Some((code, if chunked { dechunk(body) } else { body.to_string() }))
}

/// (status, body) of one HTTP/1.0 request with `body`, waiting up to a
/// minute for the answer (a judge asking a slow Prometheus takes seconds).
pub fn http_request(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    let head = format!("{method} {path} HTTP/1.0\r\nHost: t\r\nContent-Length: {}\r\n\r\n", body.len());
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(body.as_bytes()).ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    let code = answer.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, answer.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()))
}

/// The body of a chunked HTTP/1.1 answer (a large Prometheus answer is one).
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16) else { break };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// The value of a metric line (`name{labels} value`).
pub fn metric_value(line: &str) -> f64 {
    line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}
