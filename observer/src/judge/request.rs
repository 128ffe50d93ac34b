//! What the judge is asked, from Argo Rollouts' `web` provider or from a
//! Flagger webhook, as one question: which pods are the canary, which the
//! baseline, over what window, and how often the caller looks.
use std::time::Duration;

use serde::Serialize;

/// Which pods one side of the comparison is.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Side {
    pub workload: String,
    /// The pod-template hash (Argo's `Latest`/`Stable`); `None` for every
    /// revision of the workload (Flagger's `NAME` and `NAME-primary`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Question {
    pub namespace: String,
    pub canary: Side,
    pub baseline: Side,
    /// How far back the analysis reads, ending at `end`.
    #[serde(serialize_with = "as_secs")]
    pub window: Duration,
    /// How often the caller asks; the looks are counted from it.
    #[serde(serialize_with = "as_secs")]
    pub interval: Duration,
    /// Unix seconds the analysis ends at; `None` is now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end: Option<f64>,
    /// The share of the canary's HTTP requests answered 5xx (and, apart,
    /// cut off) tolerated whatever the baseline's, when the caller sets
    /// it: the runbook's 1% (`http_error_share`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_error_share: Option<f64>,
    /// How long the canary's p99 must stay above 1.25 times the baseline's
    /// before it fails, when the caller sets it: the runbook's 3 minutes
    /// (`p99_for`).
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "opt_as_secs")]
    pub p99_for: Option<Duration>,
}

fn as_secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

fn opt_as_secs<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => as_secs(d, s),
        None => s.serialize_none(),
    }
}

/// Argo's AnalysisRuns ask every minute unless told otherwise.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
/// A canary analysis rarely runs longer than this; older data is another
/// rollout's.
const DEFAULT_WINDOW: Duration = Duration::from_secs(3600);

/// The shortest interval between looks: a scrape or two. Looks counted at a
/// shorter one would spend the false-rollback budget on samples that
/// cannot have changed.
pub const MIN_INTERVAL: Duration = Duration::from_secs(30);

/// A request the judge cannot read: status 400 with this one line.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BadRequest {
    #[error("missing `{0}`")]
    Missing(&'static str),
    #[error("`{0}`: {1}")]
    Invalid(&'static str, String),
    #[error("body is not a JSON object ({0})")]
    NotJson(String),
    #[error("`interval` {0}s is below {min}s: looks that close spend alpha on unchanged counts", min = MIN_INTERVAL.as_secs())]
    IntervalTooShort(f64),
    #[error("`baseline` is the canary itself ({0}): there is nothing to compare")]
    SameSides(String),
}

/// Named parameters from the query string and a JSON object body (the
/// body wins), as Argo's `web` provider sends either.
pub struct Params(Vec<(String, String)>);

impl Params {
    pub fn new(query: Vec<(String, String)>, body: &[u8]) -> Result<Self, BadRequest> {
        let mut all = query;
        if !body.iter().all(u8::is_ascii_whitespace) {
            let value: serde_json::Value =
                serde_json::from_slice(body).map_err(|e| BadRequest::NotJson(e.to_string()))?;
            let object = value.as_object().ok_or_else(|| BadRequest::NotJson("not an object".into()))?;
            for (k, v) in object {
                flatten(k, v, &mut all);
            }
        }
        Ok(Self(all))
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v.as_str()).filter(|v| !v.is_empty())
    }

    fn require(&self, name: &'static str) -> Result<&str, BadRequest> {
        self.get(name).ok_or(BadRequest::Missing(name))
    }
}

/// A JSON body's strings and numbers as parameters; `metadata` (Flagger's
/// free-form map) one level down.
fn flatten(key: &str, value: &serde_json::Value, out: &mut Vec<(String, String)>) {
    match value {
        serde_json::Value::String(s) => out.push((key.to_string(), s.clone())),
        serde_json::Value::Number(n) => out.push((key.to_string(), n.to_string())),
        serde_json::Value::Object(map) if key == "metadata" => {
            for (k, v) in map {
                if let serde_json::Value::String(s) = v {
                    out.push((k.clone(), s.clone()));
                }
            }
        }
        _ => {}
    }
}

/// Argo Rollouts: `namespace`, `workload`, `canary` and `baseline`
/// (revisions: `{{args.canary-hash}}` from `podTemplateHashValue: Latest`,
/// `Stable` for the baseline), optional `window`, `interval`, `end`,
/// `http_error_share`, `p99_for`.
pub fn from_argo(p: &Params) -> Result<Question, BadRequest> {
    let workload = p.require("workload")?;
    let side = |name: &'static str| -> Result<Side, BadRequest> {
        Ok(Side { workload: workload.to_string(), revision: Some(p.require(name)?.to_string()) })
    };
    checked(Question {
        namespace: p.require("namespace")?.to_string(),
        canary: side("canary")?,
        baseline: side("baseline")?,
        window: duration_or(p, "window", DEFAULT_WINDOW)?,
        interval: duration_or(p, "interval", DEFAULT_INTERVAL)?,
        end: end(p)?,
        http_error_share: error_share(p)?,
        p99_for: p99_for(p)?,
    })
}

/// What a question cannot ask, whatever Prometheus holds.
fn checked(q: Question) -> Result<Question, BadRequest> {
    if q.interval < MIN_INTERVAL {
        return Err(BadRequest::IntervalTooShort(q.interval.as_secs_f64()));
    }
    if q.canary == q.baseline {
        let name = match &q.canary.revision {
            Some(r) => format!("{} revision {r}", q.canary.workload),
            None => q.canary.workload.clone(),
        };
        return Err(BadRequest::SameSides(name));
    }
    Ok(q)
}

/// Flagger: its payload names the Canary (`name`, `namespace`); the canary
/// pods are its target Deployment's current revision (`metadata.workload`,
/// else the Canary's name; the revision is found in Prometheus, see
/// `signals`) and the baseline `<target>-primary`, as Flagger names them.
/// `window`, `interval`, `http_error_share` and `p99_for` may come in the
/// webhook's metadata.
pub fn from_flagger(p: &Params) -> Result<Question, BadRequest> {
    let target = p.get("workload").unwrap_or(p.require("name")?).to_string();
    checked(Question {
        namespace: p.require("namespace")?.to_string(),
        canary: Side { workload: target.clone(), revision: None },
        baseline: Side { workload: format!("{target}-primary"), revision: None },
        window: duration_or(p, "window", DEFAULT_WINDOW)?,
        interval: duration_or(p, "interval", DEFAULT_INTERVAL)?,
        end: end(p)?,
        http_error_share: error_share(p)?,
        p99_for: p99_for(p)?,
    })
}

fn error_share(p: &Params) -> Result<Option<f64>, BadRequest> {
    p.get("http_error_share")
        .map(|t| {
            t.parse::<f64>().ok().filter(|v| (0.0..1.0).contains(v)).ok_or_else(|| {
                BadRequest::Invalid(
                    "http_error_share",
                    format!("{t:?} is not a share from 0 to below 1, such as 0.01"),
                )
            })
        })
        .transpose()
}

/// A duration, zero included: `p99_for=0s` fails on the look's counts alone.
fn p99_for(p: &Params) -> Result<Option<Duration>, BadRequest> {
    p.get("p99_for")
        .map(|t| {
            parse_duration(t).ok_or_else(|| {
                BadRequest::Invalid("p99_for", format!("{t:?} is not a duration such as 3m or 0s"))
            })
        })
        .transpose()
}

fn duration_or(p: &Params, name: &'static str, default: Duration) -> Result<Duration, BadRequest> {
    match p.get(name) {
        None => Ok(default),
        Some(text) => match parse_duration(text) {
            Some(d) if !d.is_zero() => Ok(d),
            _ => Err(BadRequest::Invalid(name, format!("{text:?} is not a duration such as 90s, 10m or 1h"))),
        },
    }
}

fn end(p: &Params) -> Result<Option<f64>, BadRequest> {
    p.get("end")
        .map(|t| {
            t.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
                .ok_or_else(|| BadRequest::Invalid("end", format!("{t:?} is not Unix seconds")))
        })
        .transpose()
}

/// `a=1&b=x%2Fy` as decoded pairs; `+` is a space, as forms send it.
pub fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = match bytes.get(i..i + 3) {
            Some([b'%', hi, lo]) => hex(*hi).zip(hex(*lo)).map(|(h, l)| (h * 16 + l) as u8),
            _ => None,
        };
        match (escaped, bytes[i]) {
            (Some(b), _) => {
                out.push(b);
                i += 3;
            }
            (None, b'+') => {
                out.push(b' ');
                i += 1;
            }
            (None, b) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `s` with everything but unreserved characters percent-encoded.
pub fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Prometheus-style durations: `90s`, `10m`, `1h30m`, `2d`, `500ms`.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let mut total = 0.0f64;
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(rest.len());
        let (number, tail) = rest.split_at(digits);
        let number: f64 = number.parse().ok()?;
        let unit_len = tail.find(|c: char| c.is_ascii_digit()).unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let scale = match unit {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "d" => 86400.0,
            _ => return None,
        };
        total += number * scale;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(query: &str, body: &str) -> Params {
        Params::new(parse_query(query), body.as_bytes()).expect("params")
    }

    #[test]
    fn argo_reads_query_or_body_and_requires_both_revisions() {
        let q = from_argo(&params(
            "namespace=ml&workload=infer&canary=abc&baseline=def&window=30m",
            r#"{"interval": "2m", "end": 1700000000}"#,
        ))
        .expect("question");
        assert_eq!(q.canary, Side { workload: "infer".into(), revision: Some("abc".into()) });
        assert_eq!(q.baseline.revision.as_deref(), Some("def"));
        assert_eq!((q.window, q.interval), (Duration::from_secs(1800), Duration::from_secs(120)));
        assert_eq!(q.end, Some(1_700_000_000.0));
        let missing = from_argo(&params("namespace=ml&workload=infer&canary=abc", ""));
        assert_eq!(missing, Err(BadRequest::Missing("baseline")));
        let bad = from_argo(&params("namespace=ml&workload=w&canary=a&baseline=b&window=soon", ""));
        assert!(matches!(bad, Err(BadRequest::Invalid("window", _))));
    }

    #[test]
    fn the_runbooks_tolerances_come_with_the_question_or_are_refused() {
        let argo = |extra: &str| {
            from_argo(&params(&format!("namespace=ml&workload=w&canary=a&baseline=b{extra}"), ""))
        };
        let q = argo("&http_error_share=0.02&p99_for=5m").expect("question");
        assert_eq!((q.http_error_share, q.p99_for), (Some(0.02), Some(Duration::from_secs(300))));
        let q = argo("").expect("question");
        assert_eq!((q.http_error_share, q.p99_for), (None, None));
        assert_eq!(argo("&p99_for=0s").expect("question").p99_for, Some(Duration::ZERO));
        assert!(matches!(argo("&http_error_share=1"), Err(BadRequest::Invalid("http_error_share", _))));
        assert!(matches!(argo("&http_error_share=1%"), Err(BadRequest::Invalid("http_error_share", _))));
        assert!(matches!(argo("&p99_for=three"), Err(BadRequest::Invalid("p99_for", _))));
        let body = r#"{"name":"c","namespace":"t","metadata":{"http_error_share":"0.05","p99_for":"2m"}}"#;
        let q = from_flagger(&params("", body)).expect("question");
        assert_eq!((q.http_error_share, q.p99_for), (Some(0.05), Some(Duration::from_secs(120))));
    }

    #[test]
    fn flagger_maps_the_canary_to_its_target_and_primary() {
        let body = r#"{"name":"podinfo","namespace":"test","phase":"Progressing","checksum":"x",
                       "metadata":{"window":"20m"}}"#;
        let q = from_flagger(&params("", body)).expect("question");
        assert_eq!(q.canary, Side { workload: "podinfo".into(), revision: None });
        assert_eq!(q.baseline.workload, "podinfo-primary");
        assert_eq!(q.window, Duration::from_secs(1200));
        let other = r#"{"name":"c","namespace":"t","metadata":{"workload":"infer"}}"#;
        assert_eq!(from_flagger(&params("", other)).expect("q").baseline.workload, "infer-primary");
        assert!(matches!(Params::new(vec![], b"[1]"), Err(BadRequest::NotJson(_))));
    }

    #[test]
    fn questions_that_would_mislead_are_refused() {
        let argo = |extra: &str| from_argo(&params(&format!("namespace=ml&workload=w&{extra}"), ""));
        assert_eq!(argo("canary=a&baseline=b&interval=29s"), Err(BadRequest::IntervalTooShort(29.0)));
        assert!(argo("canary=a&baseline=b&interval=30s").is_ok());
        assert!(matches!(argo("canary=a&baseline=a"), Err(BadRequest::SameSides(s)) if s == "w revision a"));
        let flagger =
            from_flagger(&params("", r#"{"name":"c","namespace":"t","metadata":{"interval":"1s"}}"#));
        assert_eq!(flagger, Err(BadRequest::IntervalTooShort(1.0)));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("10"), None);
        assert_eq!(parse_duration("5x"), None);
    }

    #[test]
    fn queries_round_trip_through_encoding() {
        let value = "sum by (node) (x{a=\"b c\"}) / 2 + 1";
        let pairs = parse_query(&format!("q={}&flag&bad=%zz%", percent_encode(value)));
        assert_eq!(pairs[0], ("q".to_string(), value.to_string()));
        assert_eq!(pairs[1], ("flag".to_string(), String::new()));
        assert_eq!(pairs[2], ("bad".to_string(), "%zz%".to_string()));
    }
}
