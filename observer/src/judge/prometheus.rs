//! The judge's Prometheus client: instant queries over the HTTP API
//! (`/api/v1/query`), HTTP/1.0 so that no server chunks its answer.
use std::{collections::BTreeMap, time::Duration};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use super::http::percent_encode;

/// A query slower than this makes the answer `inconclusive`, not a hang
/// of the AnalysisRun that asked.
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// Prometheus' answers to the judge's queries are small; more is an error.
const MAX_ANSWER: usize = 32 << 20;

#[derive(Clone, Debug, PartialEq)]
pub struct Prometheus {
    host: String,
    port: u16,
    /// A path prefix (Prometheus behind `--web.route-prefix`), without the
    /// trailing slash.
    prefix: String,
}

#[derive(Debug, thiserror::Error)]
pub enum PromError {
    #[error("cannot reach Prometheus at {0}")]
    Unreachable(String),
    #[error("Prometheus answered {0}")]
    Status(String),
    #[error("Prometheus refused the query: {0}")]
    Query(String),
    #[error("Prometheus took longer than {}s", QUERY_TIMEOUT.as_secs())]
    Timeout,
}

/// One series of an instant vector: its labels and value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Prometheus {
    /// `http://host[:port][/prefix]`.
    pub fn parse(url: &str) -> Result<Self, String> {
        let (host, port, path) = crate::config::parse_http_url(url)
            .ok_or_else(|| format!("--prometheus {url}: expected http://HOST[:PORT][/PREFIX]"))?;
        Ok(Self { host, port, prefix: path.trim_end_matches('/').to_string() })
    }

    pub fn url(&self) -> String {
        format!("http://{}:{}{}", self.host, self.port, self.prefix)
    }

    /// The instant vector of `query` evaluated at `at` (Unix seconds).
    pub async fn instant(&self, query: &str, at: f64) -> Result<Vec<Sample>, PromError> {
        let path = format!("{}/api/v1/query?query={}&time={at:.3}", self.prefix, percent_encode(query));
        let body =
            tokio::time::timeout(QUERY_TIMEOUT, self.get(&path)).await.map_err(|_| PromError::Timeout)??;
        parse_vector(&body)
    }

    async fn get(&self, path: &str) -> Result<String, PromError> {
        let unreachable = |e: std::io::Error| PromError::Unreachable(format!("{} ({e})", self.url()));
        let mut stream = TcpStream::connect((self.host.as_str(), self.port)).await.map_err(unreachable)?;
        let request =
            format!("GET {path} HTTP/1.0\r\nHost: {}\r\nAccept: application/json\r\n\r\n", self.host);
        stream.write_all(request.as_bytes()).await.map_err(unreachable)?;
        let mut raw = Vec::new();
        let mut limited = (&mut stream).take(MAX_ANSWER as u64);
        limited.read_to_end(&mut raw).await.map_err(unreachable)?;
        let text = String::from_utf8_lossy(&raw);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head.lines().next().unwrap_or("").split(' ').nth(1).unwrap_or("").to_string();
        // A bad query is a 400 with Prometheus' own error in the body.
        if status != "200" && status != "400" && status != "422" {
            return Err(PromError::Status(head.lines().next().unwrap_or("nothing").to_string()));
        }
        Ok(body.to_string())
    }
}

/// The `data.result` of an instant-vector answer.
fn parse_vector(body: &str) -> Result<Vec<Sample>, PromError> {
    let answer: serde_json::Value =
        serde_json::from_str(body).map_err(|e| PromError::Query(format!("answer is not JSON ({e})")))?;
    if answer["status"] != "success" {
        return Err(PromError::Query(answer["error"].as_str().unwrap_or("unknown error").to_string()));
    }
    if answer["data"]["resultType"] != "vector" {
        return Err(PromError::Query(format!("expected a vector, got {}", answer["data"]["resultType"])));
    }
    let mut samples = Vec::new();
    for series in answer["data"]["result"].as_array().into_iter().flatten() {
        let labels = series["metric"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
            .collect();
        let value = series["value"][1].as_str().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN);
        if value.is_finite() {
            samples.push(Sample { labels, value });
        }
    }
    Ok(samples)
}

/// `value` quoted for a PromQL label matcher.
pub fn quote(value: &str) -> String {
    format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_with_and_without_port_and_prefix() {
        let p = Prometheus::parse("http://prometheus.monitoring:9090/prom/").expect("valid");
        assert_eq!(p.url(), "http://prometheus.monitoring:9090/prom");
        assert_eq!(Prometheus::parse("http://p").expect("valid").url(), "http://p:80");
        assert!(Prometheus::parse("https://p").is_err());
        assert!(Prometheus::parse("http://:9090").is_err());
    }

    #[test]
    fn vectors_errors_and_non_finite_values() {
        let ok = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"node":"a"},"value":[1,"3"]},{"metric":{"node":"b"},"value":[1,"NaN"]}]}}"#;
        let v = parse_vector(ok).expect("vector");
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].labels["node"], "a");
        assert_eq!(v[0].value, 3.0);
        let err = r#"{"status":"error","errorType":"bad_data","error":"parse error"}"#;
        assert!(matches!(parse_vector(err), Err(PromError::Query(m)) if m == "parse error"));
        assert!(parse_vector("<html>").is_err());
    }

    #[test]
    fn label_values_are_quoted_safely() {
        assert_eq!(quote(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}
