//! The judge's HTTP as the cluster's network reaches it: any bytes on a
//! connection go through hyper and the judge's limits (`web/server.rs`,
//! `judge/http.rs`, the code that ships) to the request the judge reads,
//! and its answer back. Whatever arrives, nothing panics and the
//! connection ends; the judge is asked at most once, with a path without
//! its query and a body within the limit; at most one answer is written,
//! framed by its length, closing the connection; an answer the judge
//! reached is written; and every 400 is empty (hyper's) or one line (ours).
//!
//! The judge here answers as the service's routes do, from
//! `judge/request.rs`'s parsing of the question (`judge_request` fuzzes
//! that part alone).
//!
//! Input: the bytes a client sends, then the end of its stream.
#![no_main]

use std::sync::{Arc, Mutex};

use canaryscope_fuzz::{
    judge_http::{ask, Reply, Request, LIMITS},
    request::{from_argo, from_flagger, Params},
    web::server::{answer_connection, Connections},
};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

thread_local! {
    // A paused clock: with nothing else to do, a timeout passes at once.
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
}

/// What the service answers, by route, without asking Prometheus.
fn judge(request: &Request) -> Reply {
    let parse = match request.path.as_str() {
        "/v1/judge" => from_argo,
        "/v1/flagger/rollout" | "/v1/flagger/confirm-promotion" => from_flagger,
        _ => return Reply::new(404, "text/plain", "not found\n"),
    };
    match Params::new(request.query.clone(), &request.body).and_then(|params| parse(&params)) {
        Ok(question) => {
            Reply::new(200, "application/json", serde_json::to_vec(&question).expect("serialises"))
        }
        Err(e) => Reply::new(400, "text/plain", format!("{e}\n")),
    }
}

/// The client's bytes in, the server's out; and what the judge was asked.
async fn exchange(data: &[u8]) -> (Vec<u8>, Vec<Request>) {
    let (client, served) = tokio::io::duplex(64 * 1024);
    let asked = Arc::new(Mutex::new(Vec::new()));
    let service = {
        let asked = asked.clone();
        move |request: Request| {
            let reply = judge(&request);
            asked.lock().expect("lock").push(request);
            async move { reply }
        }
    };
    let slot = Connections::new(1).admit().await.expect("room");
    let server = tokio::spawn(answer_connection(served, slot, LIMITS, move |r| ask(service.clone(), r)));
    let (mut from_server, mut to_server) = tokio::io::split(client);
    // At once: the server may answer and close before it has read all.
    let send = async {
        let _ = to_server.write_all(data).await;
        let _ = to_server.shutdown().await;
    };
    let mut answer = Vec::new();
    let receive = from_server.read_to_end(&mut answer);
    let ((), received) = tokio::join!(send, receive);
    received.expect("the client's end reads to the close");
    server.await.expect("the connection ends without a panic");
    let asked = std::mem::take(&mut *asked.lock().expect("lock"));
    (answer, asked)
}

/// The value of header `name` in `head`'s lines, if any.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.split("\r\n").skip(1).find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn check(sent: &[u8], answer: &[u8], asked: &[Request]) {
    assert!(asked.len() <= 1, "one request per connection: {asked:?}");
    if let Some(request) = asked.first() {
        assert!(!request.path.contains('?'), "{request:?}");
        assert!(request.body.len() <= LIMITS.body_bytes, "{} bytes", request.body.len());
        assert!(!answer.is_empty(), "the judge answered {request:?}, nothing was written");
    }
    // `Expect: 100-continue` gets its interim answer before the answer.
    let answer = answer.strip_prefix(&b"HTTP/1.1 100 Continue\r\n\r\n"[..]).unwrap_or(answer);
    if answer.is_empty() {
        return;
    }
    let end = answer.windows(4).position(|w| w == b"\r\n\r\n").expect("an answer has a whole head");
    let head = std::str::from_utf8(&answer[..end]).expect("a head is text");
    let body = &answer[end + 4..];
    let status: u16 = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status");
    assert!(head.starts_with("HTTP/1."), "{head}");
    if head.starts_with("HTTP/1.1") {
        assert_eq!(header(head, "connection"), Some("close"), "{head}");
    }
    let length: usize = header(head, "content-length").and_then(|l| l.parse().ok()).expect("a length");
    // One answer, framed by its length: nothing follows it. A HEAD's
    // answer has the length without the body.
    let head_request =
        sent.iter().position(|b| !b"\r\n".contains(b)).is_some_and(|i| sent[i..].starts_with(b"HEAD "));
    assert_eq!(body.len(), if head_request { 0 } else { length }, "{head}");
    if status == 400 && !body.is_empty() {
        let text = std::str::from_utf8(body).expect("a refusal is text");
        assert!(text.ends_with('\n') && text.matches('\n').count() == 1, "{text:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    let (answer, asked) = RUNTIME.with(|runtime| runtime.block_on(exchange(data)));
    check(data, &answer, &asked);
});
