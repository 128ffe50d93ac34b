//! The readiness gate as the tests read it: the condition the daemon
//! writes on a gated pod, through the stand-in API server.
use std::{
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::k8s::{control, NS};

/// The readiness gate's condition type.
pub const GATE: &str = "canaryscope.io/gpu-runtime";

/// `pod` with the readiness gate in its spec, as a gated Deployment's
/// pods have it.
pub fn gated(mut pod: Value) -> Value {
    pod["spec"]["readinessGates"] = serde_json::json!([{"conditionType": GATE}]);
    pod
}

/// The gate's condition among `pod`'s, if the daemon has written one.
pub fn gate_condition(pod: &Value) -> Option<Value> {
    pod["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == GATE).cloned()
}

/// Waits up to `within` for pod `name`'s gate condition to be one `pred`
/// accepts, and returns it; when none is, the last condition seen (if
/// any) and the pod, for the test to say what it had.
pub fn wait_gate(
    api_port: u16,
    name: &str,
    within: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Result<Value, (Option<Value>, Value)> {
    let deadline = Instant::now() + within;
    loop {
        let body = control(api_port, "GET", &format!("/api/v1/namespaces/{NS}/pods/{name}"), "");
        let pod: Value = serde_json::from_str(&body).expect("a Pod");
        let condition = gate_condition(&pod);
        if let Some(c) = condition.as_ref().filter(|c| pred(c)) {
            return Ok(c.clone());
        }
        if Instant::now() >= deadline {
            return Err((condition, pod));
        }
        thread::sleep(Duration::from_millis(50));
    }
}
