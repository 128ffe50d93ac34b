//! Releasing uprobe links without stalling the ones being created.
//!
//! The kernel releases a perf-event uprobe after an RCU tasks-trace grace
//! period, under a mutex that creating one takes too (tens of ms each,
//! one at a time). A burst of releases (a retired library file's links, an
//! exited process's hot probes) made every attach behind it wait: measured
//! 3.2 s to probe a one-function library, long after the 50 ms in which a
//! process that `dlopen`s at once makes its first call. So links are
//! released one at a time by one thread, and only after attaching has been
//! quiet for a while; past a cap they are released anyway, so a node that
//! never goes quiet still gets its kernel memory back.
use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc::{self, Receiver, RecvTimeoutError, Sender},
        OnceLock,
    },
    time::{Duration, Instant},
};

use aya::programs::uprobe::UProbeLink;
use log::debug;

/// A link whose drop releases its probes.
#[allow(dead_code, reason = "each link is held only to be dropped")]
pub enum Link {
    /// One function's perf-event uprobe.
    PerfEvent(UProbeLink),
    /// A `uprobe_multi` link: every function of a file for one program.
    Multi(std::os::fd::OwnedFd),
}

/// Attaching must have been quiet this long before a link is released.
const QUIET: Duration = Duration::from_secs(1);
/// Links waiting past this many are released without waiting for quiet.
const MAX_WAITING: usize = 4096;

/// Milliseconds since [`epoch`] of the latest attach.
static LAST_ATTACH_MS: AtomicU64 = AtomicU64::new(0);
static QUEUE: OnceLock<Option<Sender<Vec<Link>>>> = OnceLock::new();

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    epoch().elapsed().as_millis() as u64
}

/// Called before each attach: releases wait until attaching is quiet.
pub fn note_attach() {
    LAST_ATTACH_MS.store(now_ms().max(1), Ordering::Relaxed);
}

/// Hands links over for release in the background.
pub fn release(links: Vec<Link>) {
    if links.is_empty() {
        return;
    }
    let queue = QUEUE.get_or_init(|| {
        let (tx, rx) = mpsc::channel();
        match std::thread::Builder::new().name("cs-release".into()).spawn(move || run(rx)) {
            Ok(_) => Some(tx),
            Err(e) => {
                debug!("no release thread ({e}): links are released inline");
                None
            }
        }
    });
    match queue {
        Some(tx) => {
            if let Err(mpsc::SendError(links)) = tx.send(links) {
                drop(links);
            }
        }
        // Dropping the links releases them here.
        None => drop(links),
    }
}

fn quiet() -> bool {
    now_ms().saturating_sub(LAST_ATTACH_MS.load(Ordering::Relaxed)) >= QUIET.as_millis() as u64
}

fn run(rx: Receiver<Vec<Link>>) {
    let mut waiting: VecDeque<Link> = VecDeque::new();
    loop {
        // Wait for more links, or for the next moment a release may go.
        let timeout = if waiting.is_empty() { Duration::from_secs(3600) } else { Duration::from_millis(100) };
        match rx.recv_timeout(timeout) {
            Ok(links) => waiting.extend(links),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        while let Ok(links) = rx.try_recv() {
            waiting.extend(links);
        }
        // One at a time, checking between releases: an attach that comes
        // meanwhile waits for at most the release in flight.
        while !waiting.is_empty() && (quiet() || waiting.len() > MAX_WAITING) {
            drop(waiting.pop_front());
        }
    }
}

/// Lets this process exit without waiting for the kernel to release its
/// uprobe links: a grace period each, one at a time, so seconds per probed
/// library while the person who pressed Ctrl-C waits for a prompt.
///
/// A forked child holds a second reference to every descriptor, waits for
/// this process to be gone, and exits: the last reference, and with it the
/// release, is the child's. It closes stdin, stdout and stderr first, so a
/// shell or a pipe reading this process sees it end at once, and leaves the
/// terminal's session, so a second Ctrl-C cannot reach it.
///
/// Call it only when about to exit, once nothing can be held any more: the
/// programs stay attached until the child is done. Returns the child's pid,
/// or `None` when none could be made; the release then happens at this
/// process's own exit, as it would without this call.
pub fn release_after_exit() -> Option<u32> {
    // SAFETY: pidfd_open(2) on this process; the fd tells when it is gone.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) } as libc::c_int;
    if pidfd < 0 {
        debug!("no pidfd for this process: probes are released at its exit");
        return None;
    }
    // SAFETY: the child of a process that may have other threads calls only
    // async-signal-safe functions (raw system calls) before `_exit`.
    let child = unsafe { libc::fork() };
    match child {
        0 => unsafe {
            libc::setsid();
            libc::prctl(libc::PR_SET_NAME, c"cs-release".as_ptr() as libc::c_ulong, 0, 0, 0);
            for fd in 0..3 {
                libc::close(fd);
            }
            // Readable once the whole of the parent has exited. A signal
            // ends the wait early, and the release then falls to whichever
            // of the two exits last: slower, never lost.
            let mut pfd = libc::pollfd { fd: pidfd, events: libc::POLLIN, revents: 0 };
            libc::poll(&mut pfd, 1, -1);
            libc::_exit(0)
        },
        -1 => {
            debug!("fork for the background release failed: {}", std::io::Error::last_os_error());
            // SAFETY: our own descriptor, not used again.
            unsafe { libc::close(pidfd) };
            None
        }
        pid => {
            // SAFETY: as above.
            unsafe { libc::close(pidfd) };
            Some(pid as u32)
        }
    }
}
