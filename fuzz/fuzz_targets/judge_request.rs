//! The judge's questions come from outside: Argo Rollouts' `web` provider
//! (query string or JSON body) and Flagger's webhooks (JSON, with a
//! free-form `metadata` map). Whatever arrives, parsing must not panic, and
//! a question it accepts must be one the judge can answer honestly: both
//! sides named, a window, an interval no shorter than the minimum, a
//! baseline that is not the canary, an end that is a time, a tolerated
//! share below 1.
//!
//! Input: the query string, then 0xFF, then the body (either may be empty).
#![no_main]

use canaryscope_fuzz::request::{
    from_argo, from_flagger, parse_query, percent_encode, Params, Question, MIN_INTERVAL,
};
use libfuzzer_sys::fuzz_target;

fn sound(q: &Question) {
    assert!(!q.namespace.is_empty() && !q.canary.workload.is_empty(), "{q:?}");
    assert!(!q.window.is_zero(), "{q:?}");
    assert!(q.interval >= MIN_INTERVAL, "{q:?}");
    assert_ne!(q.canary, q.baseline, "{q:?}");
    assert!(q.end.is_none_or(|e| e.is_finite() && e > 0.0), "{q:?}");
    assert!(q.http_error_share.is_none_or(|s| (0.0..1.0).contains(&s)), "{q:?}");
    // It serialises into the answer.
    serde_json::to_string(q).expect("a question serialises");
}

fuzz_target!(|data: &[u8]| {
    let (query, body) = match data.iter().position(|&b| b == 0xff) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let query = String::from_utf8_lossy(query);
    let pairs = parse_query(&query);
    // Encoding a decoded pair and decoding it again gives it back.
    for (k, v) in &pairs {
        let again = parse_query(&format!("{}={}", percent_encode(k), percent_encode(v)));
        assert_eq!(again, vec![(k.clone(), v.clone())]);
    }
    let Ok(params) = Params::new(pairs, body) else {
        return;
    };
    if let Ok(q) = from_argo(&params) {
        sound(&q);
        assert!(q.canary.revision.is_some() && q.baseline.revision.is_some(), "{q:?}");
        assert_eq!(q.canary.workload, q.baseline.workload);
    }
    if let Ok(q) = from_flagger(&params) {
        sound(&q);
        assert_eq!(q.baseline.workload, format!("{}-primary", q.canary.workload));
        assert!(q.canary.revision.is_none() && q.baseline.revision.is_none(), "{q:?}");
    }
});
