//! A slow or hostile client cannot keep Prometheus from the exporter or
//! Argo from the judge: the real `canaryscope run` and `canaryscope judge`,
//! each held to the default soft `RLIMIT_NOFILE` of 1,024, take a head
//! dribbled byte by byte on hundreds of connections, a 1 GB head, and
//! thousands of idle connections; while each goes on, a scrape or a
//! verdict asked as Prometheus or Argo asks answers within `PROMPT`.
use std::{
    io::{ErrorKind, Read, Write},
    net::{SocketAddr, TcpStream},
    thread,
    time::{Duration, Instant},
};

use test_support::{assert_root, free_port, http_get, judge::start_judge, Daemon};

/// A normal request answers within this while the abuse goes on; the
/// servers give a head 5 s, so an answer that waited for the abusers'
/// connections to time out comes later.
const PROMPT: Duration = Duration::from_secs(2);
/// The servers' head timeout (docs/daemon.md, "Limits against slow and
/// hostile clients"), and what a closed connection may take beyond it here.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
const CLOSE_MARGIN: Duration = Duration::from_millis(1500);

/// The server under test: where it answers, its process, how many
/// connections it keeps at most, and a normal request and its answer.
struct Server {
    port: u16,
    pid: u32,
    cap: usize,
    normal: &'static str,
    answered: fn(u16, &str) -> bool,
    _running: Box<dyn std::any::Any>,
}

impl Server {
    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Asks as a normal client does; returns how long the answer took.
    fn ask(&self) -> Duration {
        let started = Instant::now();
        let answer = http_get(self.port, self.normal);
        let took = started.elapsed();
        match answer {
            Some((code, body)) => assert!((self.answered)(code, &body), "{}: {code} {body}", self.normal),
            None => panic!("{}: no answer (closed or silent for 5 s) after {took:?}", self.normal),
        }
        took
    }

    fn assert_prompt(&self, during: &str) {
        let took = self.ask();
        eprintln!("{} answered in {took:?} during {during}", self.normal);
        assert!(took < PROMPT, "{} took {took:?} during {during}", self.normal);
    }

    fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid)).map(Iterator::count).unwrap_or(0)
    }

    /// The peak of its resident memory so far, in bytes.
    fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).expect("status");
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
        line.split_whitespace().nth(1).and_then(|kb| kb.parse::<u64>().ok()).expect("kB") * 1024
    }
}

/// The default soft limit on open files, for `pid` (the environment may
/// raise it; a DaemonSet's container gets the runtime's, often 1,024),
/// and the most this test may open itself.
fn default_nofile(pid: u32) {
    let mut own = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and prlimit fill or read the structs given.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut own), 0);
        let server = libc::rlimit { rlim_cur: 1024, rlim_max: own.rlim_max };
        assert_eq!(libc::prlimit(pid as i32, libc::RLIMIT_NOFILE, &server, std::ptr::null_mut()), 0);
        own.rlim_cur = own.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &own), 0);
    }
    assert!(own.rlim_cur >= 8192, "this test opens thousands of sockets; its hard limit is {}", own.rlim_cur);
}

fn exporter() -> Server {
    assert_root();
    let daemon = Daemon::start(&["--no-kubernetes"]);
    let (port, pid) = (daemon.port, daemon.pid());
    default_nofile(pid);
    let answered = |code: u16, body: &str| code == 200 && body.contains("canaryscope_");
    Server { port, pid, cap: 128, normal: "/metrics", answered, _running: Box::new(daemon) }
}

fn judge() -> Server {
    // Nothing listens where Prometheus should: every verdict is an
    // immediate `inconclusive`, as real a verdict as any for the server.
    let (judge, port) = start_judge(free_port(), &[]);
    let pid = judge.0.id();
    default_nofile(pid);
    let answered = |code: u16, body: &str| code == 200 && body.contains("\"inconclusive\"");
    let normal = "/v1/judge?namespace=ml&workload=infer&canary=c1&baseline=b1&window=10m&interval=10m";
    Server { port, pid, cap: 256, normal, answered, _running: Box::new(judge) }
}

/// Whether the server closed `stream` (non-blocking).
fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 512];
    match stream.read(&mut buf) {
        Ok(0) => true,
        // Anything said to a head never finished is the server's last word.
        Ok(n) => {
            eprintln!("a dribbling connection was answered {:?}", String::from_utf8_lossy(&buf[..n]));
            true
        }
        Err(e) => e.kind() != ErrorKind::WouldBlock,
    }
}

/// Hundreds of connections, more than the server keeps, send a head one
/// byte every 100 ms and never finish it. A normal request is answered
/// while they dribble, and the server closes every one of them within its
/// head timeout, though each is still sending.
fn slowloris(server: &Server) {
    let dribblers = server.cap + 64;
    let mut open: Vec<(TcpStream, Instant)> = (0..dribblers)
        .map(|_| {
            let mut s = TcpStream::connect(server.addr()).expect("connect");
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ").expect("first bytes");
            s.set_nonblocking(true).expect("nonblocking");
            (s, Instant::now())
        })
        .collect();
    server.assert_prompt("the slowloris");
    let started = Instant::now();
    let mut longest = Duration::ZERO;
    while !open.is_empty() && started.elapsed() < HEAD_TIMEOUT * 2 {
        // Pacing the dribble, as a slowloris does.
        thread::sleep(Duration::from_millis(100));
        open.retain_mut(|(stream, since)| {
            let closed = stream.write(b"a").is_err() || closed_by_server(stream);
            if closed {
                longest = longest.max(since.elapsed());
            }
            !closed
        });
    }
    eprintln!("{dribblers} dribbling connections: the longest stayed open {longest:?}");
    assert!(open.is_empty(), "{} dribbling connections still open after {:?}", open.len(), started.elapsed());
    assert!(longest < HEAD_TIMEOUT + CLOSE_MARGIN, "a dribbling connection stayed open {longest:?}");
    server.assert_prompt("the end of the slowloris");
}

/// One connection sends a head of 1 GB. The server stops it after a few
/// KiB (the socket buffers hold a few MB more), its memory does not grow
/// with it, and a normal request is answered meanwhile.
fn a_huge_head(server: &Server) {
    const GB: usize = 1 << 30;
    let peak_before = server.peak_rss();
    let addr = server.addr();
    let sender = thread::spawn(move || {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Huge: ").expect("head");
        let chunk = vec![b'a'; 64 * 1024];
        let mut sent = 0;
        while sent < GB {
            match s.write(&chunk) {
                Ok(n) => sent += n,
                Err(_) => break,
            }
        }
        sent
    });
    server.assert_prompt("a 1 GB head");
    let sent = sender.join().expect("sender");
    let grown = server.peak_rss().saturating_sub(peak_before);
    eprintln!("a 1 GB head: {sent} bytes sent before the server closed; peak memory +{grown} bytes");
    assert!(sent < 64 << 20, "the server took {sent} bytes of one head");
    assert!(grown < 64 << 20, "a 1 GB head grew the server's memory by {grown} bytes");
    server.assert_prompt("the end of a 1 GB head");
}

/// Thousands of connections that send nothing, past the server's file
/// limit. The server keeps no more than its cap open, so that its other
/// files still open, and a normal request is answered while they stay.
fn thousands_of_idle_connections(server: &Server) {
    const IDLE: usize = 3000;
    let fds_before = server.open_fds();
    let started = Instant::now();
    let mut idle = Vec::with_capacity(IDLE);
    // A server that stops accepting leaves the rest to time out: bounded.
    while idle.len() < IDLE && started.elapsed() < Duration::from_secs(10) {
        if let Ok(s) = TcpStream::connect_timeout(&server.addr(), Duration::from_millis(200)) {
            idle.push(s);
        }
    }
    let fds = server.open_fds();
    let opened = idle.len();
    eprintln!("{opened} idle connections: {fds} files open ({fds_before} before), cap {}", server.cap);
    // The cap, one connection accepted and waiting for room, and a few
    // files the daemon opens for a moment (`/proc` reads) besides.
    assert!(
        fds <= fds_before + server.cap + 4,
        "{fds} files open with {opened} idle connections ({fds_before} before)"
    );
    server.assert_prompt("thousands of idle connections");
    assert_eq!(opened, IDLE, "connections opened in {:?}", started.elapsed());
    drop(idle);
}

#[test]
#[ignore = "needs root (the daemon loads eBPF); run by `cargo xtask test`"]
fn the_exporter_closes_a_slowloris_and_scrapes_go_on() {
    slowloris(&exporter());
}

#[test]
#[ignore = "needs root (the daemon loads eBPF); run by `cargo xtask test`"]
fn the_exporter_refuses_a_1_gb_head_and_scrapes_go_on() {
    a_huge_head(&exporter());
}

#[test]
#[ignore = "needs root (the daemon loads eBPF); run by `cargo xtask test`"]
fn the_exporter_keeps_its_cap_under_thousands_of_idle_connections_and_scrapes_go_on() {
    thousands_of_idle_connections(&exporter());
}

#[test]
fn the_judge_closes_a_slowloris_and_verdicts_go_on() {
    slowloris(&judge());
}

#[test]
fn the_judge_refuses_a_1_gb_head_and_verdicts_go_on() {
    a_huge_head(&judge());
}

#[test]
fn the_judge_keeps_its_cap_under_thousands_of_idle_connections_and_verdicts_go_on() {
    thousands_of_idle_connections(&judge());
}
