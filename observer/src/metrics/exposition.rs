//! Reads the Prometheus text exposition back into samples: `top --from`
//! and `check` read a daemon's `/metrics` this way, and `top` on its own
//! probes reads the text its in-process recorder renders, so every view is
//! computed from exactly what Prometheus would scrape.
use std::collections::BTreeMap;

/// One sample line: `name{label="value",...} value`.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, name: &str) -> &str {
        self.labels.get(name).map(String::as_str).unwrap_or("")
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("line {line}: {what}")]
pub struct ParseError {
    pub line: usize,
    pub what: &'static str,
}

/// Every sample of the text; comments and blank lines are skipped. A line
/// that is not a sample is an error: a page that is not an exposition (a
/// proxy's HTML, a wrong port) must not read as an idle node.
pub fn parse(text: &str) -> Result<Vec<Sample>, ParseError> {
    let mut samples = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        samples.push(parse_line(line).map_err(|what| ParseError { line: i + 1, what })?);
    }
    Ok(samples)
}

fn parse_line(line: &str) -> Result<Sample, &'static str> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..name_end];
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
        return Err("not a metric name");
    }
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(body) = rest.strip_prefix('{') {
        rest = parse_labels(body, &mut labels)?;
    }
    // A timestamp may follow the value; the value is the first field.
    let value = rest.split_whitespace().next().ok_or("no value")?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().map_err(|_| "value is not a number")?,
    };
    Ok(Sample { name: name.to_string(), labels, value })
}

/// Parses `a="x",b="y"}` and returns what follows the closing brace.
fn parse_labels<'a>(
    mut body: &'a str,
    labels: &mut BTreeMap<String, String>,
) -> Result<&'a str, &'static str> {
    loop {
        body = body.trim_start_matches([',', ' ']);
        if let Some(rest) = body.strip_prefix('}') {
            return Ok(rest);
        }
        let eq = body.find('=').ok_or("label without value")?;
        let key = body[..eq].trim().to_string();
        let quoted = body[eq + 1..].strip_prefix('"').ok_or("label value not quoted")?;
        let mut value = String::new();
        let mut chars = quoted.char_indices();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => return Err("unterminated label value"),
                },
                Some((_, c)) => value.push(c),
                None => return Err("unterminated label value"),
            }
        };
        labels.insert(key, value);
        body = &quoted[end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_with_labels_escapes_and_infinity() {
        let text = "# HELP x y\n# TYPE x counter\n\
            canaryscope_x{a=\"1\",b=\"q\\\"uo\\\\te\\n\"} 3\n\
            canaryscope_h_bucket{le=\"+Inf\"} 7 1700000000\n\
            plain 2.5e-3\n";
        let s = parse(text).expect("parses");
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].name, "canaryscope_x");
        assert_eq!(s[0].label("a"), "1");
        assert_eq!(s[0].label("b"), "q\"uo\\te\n");
        assert_eq!(s[0].value, 3.0);
        assert_eq!(s[1].label("le"), "+Inf");
        assert_eq!(s[1].value, 7.0);
        assert_eq!(s[2].value, 0.0025);
        assert_eq!(s[2].label("missing"), "");
    }

    #[test]
    fn a_page_that_is_not_an_exposition_is_refused() {
        assert_eq!(parse("<html> x\n").map(|_| ()), Err(ParseError { line: 1, what: "not a metric name" }));
        assert!(parse("<html>\n").is_err());
        assert!(parse("x{a=\"1\" 3\n").is_err());
        assert!(parse("x{a=1} 3\n").is_err());
        assert!(parse("x nan-ish\n").is_err());
        assert_eq!(parse("").map(|s| s.len()), Ok(0));
    }
}
