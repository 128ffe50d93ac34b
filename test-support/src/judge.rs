//! `canaryscope judge` as the tests run and ask it: on a free port, over a
//! Prometheus, answering JSON as Argo's and Flagger's providers read it.
use std::{
    io::Write,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    canaryscope, free_port, http_get, http_request,
    k8s::{repo, Proc},
};

/// `canaryscope judge` on a free port, asking the Prometheus on
/// `prom_port`, with `extra` arguments; returned once it answers /healthz.
pub fn start_judge(prom_port: u16, extra: &[&str]) -> (Proc, u16) {
    let port = free_port();
    let judge = Proc(
        Command::new(canaryscope())
            .args(["judge", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--prometheus", &format!("http://127.0.0.1:{prom_port}")])
            .args(extra)
            .stdout(Stdio::null())
            .spawn()
            .expect("canaryscope judge"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while http_get(port, "/healthz").is_none_or(|(code, _)| code != 200) {
        assert!(Instant::now() < deadline, "the judge never answered /healthz");
        thread::sleep(Duration::from_millis(50));
    }
    (judge, port)
}

/// The judge's JSON answer to a GET of `path`, which must be a 200.
pub fn ask_judge(judge_port: u16, path: &str) -> Value {
    let (code, body) = http_request(judge_port, "GET", path, "").expect("the judge answers");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// The signal `name` of a verdict.
pub fn signal<'a>(answer: &'a Value, name: &str) -> &'a Value {
    answer["signals"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == name))
        .unwrap_or_else(|| panic!("no signal {name} in {answer:#}"))
}

/// A reference script's JSON answer to the JSON `input` on its stdin:
/// `script` (a path from the repository's root, one of the oracles under
/// tests/judge/, which share no code with the judge) run by python3 with
/// `env` added.
pub fn run_oracle(script: &str, input: &Value, env: &[(&str, &str)]) -> Value {
    let script = repo().join(script);
    let mut child = Command::new("python3")
        .arg(&script)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("python3 {}: {e}", script.display()));
    child.stdin.take().expect("stdin").write_all(input.to_string().as_bytes()).expect("write the cases");
    let out = child.wait_with_output().expect("the oracle ran");
    assert!(
        out.status.success(),
        "{} failed (scripts/setup.sh installs the SciPy and statsmodels it needs):\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the oracle answers JSON")
}
