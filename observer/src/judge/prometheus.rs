//! The judge's Prometheus client: queries over the HTTP API
//! (`/api/v1/query`), each a GET on hyper's client (`web::client`). An
//! instant query answers a vector; a range selector (`metric[10m]`)
//! answers a matrix of the raw samples, which the judge counts itself.
//! The judge's deadline bounds every query from outside (`signals.rs`).
use std::{collections::BTreeMap, time::Duration};

use super::request::percent_encode;
use crate::web::client::{Get, GetError};

/// Prometheus' answers to the judge's queries are small; more is an error.
const MAX_ANSWER: usize = 32 << 20;
/// The judge's deadline bounds every query; under a longer one, a connect
/// that hangs is told as such.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

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
    /// The queries still unanswered when the answer's deadline passed.
    #[error("Prometheus did not answer in time: {}", .0.join(", "))]
    Deadline(Vec<String>),
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

    /// The raw samples of a range selector `query` (`metric{..}[600s]`)
    /// evaluated at `at`: a matrix, every sample Prometheus holds in the range.
    pub async fn samples(&self, query: &str, at: f64) -> Result<Vec<Series>, PromError> {
        parse_matrix(&self.get(&self.query_path(query, at)).await?)
    }

    fn query_path(&self, query: &str, at: f64) -> String {
        format!("{}/api/v1/query?query={}&time={at:.3}", self.prefix, percent_encode(query))
    }

    async fn get(&self, path: &str) -> Result<String, PromError> {
        let get = Get {
            host: &self.host,
            port: self.port,
            path,
            accept: "application/json",
            max_body: MAX_ANSWER,
            connect_timeout: CONNECT_TIMEOUT,
        };
        let answer = get.send().await.map_err(|e| match e {
            GetError::TooLarge(_) => PromError::Query(e.to_string()),
            e => PromError::Unreachable(format!("{} ({e})", self.url())),
        })?;
        // A bad query is a 400 with Prometheus' own error in the body.
        if !matches!(answer.status.as_u16(), 200 | 400 | 422) {
            return Err(PromError::Status(answer.status.to_string()));
        }
        Ok(String::from_utf8_lossy(&answer.body).into_owned())
    }
}

/// One series of a matrix: its labels and raw samples `(unix seconds,
/// value)`, oldest first, as Prometheus stores them.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub labels: BTreeMap<String, String>,
    pub samples: Vec<(f64, f64)>,
}

/// The `data.result` of a successful answer of `kind`.
fn result_of(body: &str, kind: &str) -> Result<Vec<serde_json::Value>, PromError> {
    let mut answer: serde_json::Value =
        serde_json::from_str(body).map_err(|e| PromError::Query(format!("answer is not JSON ({e})")))?;
    if answer["status"] != "success" {
        return Err(PromError::Query(answer["error"].as_str().unwrap_or("unknown error").to_string()));
    }
    if answer["data"]["resultType"] != kind {
        return Err(PromError::Query(format!("expected a {kind}, got {}", answer["data"]["resultType"])));
    }
    match answer["data"]["result"].take() {
        serde_json::Value::Array(result) => Ok(result),
        _ => Ok(Vec::new()),
    }
}

fn labels_of(series: &serde_json::Value) -> BTreeMap<String, String> {
    series["metric"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
        .collect()
}

/// A `[time, "value"]` pair; `None` unless both are finite numbers.
fn point(pair: &serde_json::Value) -> Option<(f64, f64)> {
    let t = pair[0].as_f64()?;
    let v: f64 = pair[1].as_str()?.parse().ok()?;
    (t.is_finite() && v.is_finite()).then_some((t, v))
}

/// The `data.result` of a range-selector answer. Samples that are not
/// finite numbers are dropped; the rest are put in time order.
fn parse_matrix(body: &str) -> Result<Vec<Series>, PromError> {
    let mut matrix = Vec::new();
    for series in result_of(body, "matrix")? {
        let mut samples: Vec<(f64, f64)> =
            series["values"].as_array().into_iter().flatten().filter_map(point).collect();
        samples.sort_by(|a, b| a.0.total_cmp(&b.0));
        if !samples.is_empty() {
            matrix.push(Series { labels: labels_of(&series), samples });
        }
    }
    Ok(matrix)
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
    fn matrices_keep_every_sample_in_time_order() {
        let ok = r#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"node":"a"},"values":[[20,"5"],[10,"3"],[30,"NaN"]]},
            {"metric":{"node":"b"},"values":[]}]}}"#;
        let m = parse_matrix(ok).expect("matrix");
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].samples, vec![(10.0, 3.0), (20.0, 5.0)]);
        let vector = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        assert!(matches!(parse_matrix(vector), Err(PromError::Query(m)) if m.contains("matrix")));
        let err = r#"{"status":"error","errorType":"bad_data","error":"parse error"}"#;
        assert!(matches!(parse_matrix(err), Err(PromError::Query(m)) if m == "parse error"));
        assert!(parse_matrix("<html>").is_err());
    }

    #[test]
    fn label_values_are_quoted_safely() {
        assert_eq!(quote(r#"a"b\c"#), r#""a\"b\\c""#);
    }
}
