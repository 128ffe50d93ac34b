//! The hold (`--hold`): a process that maps a GPU runtime file canaryscope
//! has never seen is stopped by the kernel side (SIGSTOP from the eBPF
//! program at `mmap` return) and resumed here once the file's probes exist,
//! so its first call is seen whatever the timing.
//!
//! A kernel-side deadline would need kprobes or fentry, which many kernels
//! lack (and a stopped task runs no program), so the safety net is in
//! userspace, in three layers:
//! - the kernel records each held process in `HELD_PIDS` once its SIGSTOP
//!   is queued (never before: a resume read from an earlier record could
//!   then miss the stop), and that map is pinned in bpffs; a SIGCONT sent
//!   after reading a record cancels its stop even if it has not landed;
//! - a watchdog process, separate from the daemon and in its own session,
//!   resumes any process held longer than its deadline ([`HOLD_DEADLINE`],
//!   or [`PROBING_DEADLINE`] once the daemon took the hold up), and every held
//!   process as soon as the daemon is gone, however it died;
//! - at start, the daemon resumes every process a previous daemon left
//!   recorded as held.
use std::{
    collections::HashMap,
    io,
    path::{Path, PathBuf},
    process::{Child, Command, ExitCode, Stdio},
    time::{Duration, Instant},
};

use aya::maps::{HashMap as BpfHashMap, Map, MapData};
use log::{debug, info, warn};

use crate::clock::BootClock;

/// Where the held-process map is pinned.
pub const PIN_DIR: &str = "/sys/fs/bpf/canaryscope";
pub const PIN_NAME: &str = "held_pids";
/// A process whose hold the daemon has not taken up is never held longer
/// than this, even if the daemon is stuck.
pub const HOLD_DEADLINE: Duration = Duration::from_secs(2);
/// Once the daemon has read a hold's report and is probing for it, the
/// hold lasts at most this long from then. Creating a uprobe can wait
/// seconds behind the kernel's release of others (each release waits for a
/// grace period under a lock that creation takes too: an exited tracer's or
/// a retired file's links), and the short deadline must not cut that short:
/// measured here, 3.2 s to probe a one-function library while another
/// tracer's links were being released.
pub const PROBING_DEADLINE: Duration = Duration::from_secs(10);
/// `BPF_EXIST`: update a record only where it still exists.
const BPF_EXIST: u64 = 2;
const BPF_FS_MAGIC: i64 = 0xcafe4a11;

pub type HeldMap = BpfHashMap<MapData, u32, u64>;

#[derive(Debug, thiserror::Error)]
pub enum HoldError {
    #[error("bpffs at /sys/fs/bpf: {0}")]
    BpfFs(String),
    #[error("pinning the held-process map at {path}: {reason}")]
    Pin { path: String, reason: String },
    #[error("starting the hold watchdog: {0}")]
    Watchdog(io::Error),
}

/// The daemon's side of the hold.
pub struct Hold {
    map: HeldMap,
    pin: PathBuf,
    watchdog: Child,
    /// Per pid, the hold this daemon took up (its kernel stamp) and the
    /// stamp written over it: how a record moved by [`Hold::take_up`] is
    /// still known for that hold's.
    taken_up: HashMap<u32, TakenUp>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TakenUp {
    held_at_ns: u64,
    stamp: u64,
}

/// Whose a process's record in the held map is, as seen by the report of
/// one hold (stamped `held_at_ns` by the kernel).
#[derive(Debug, PartialEq, Eq)]
enum Record {
    /// The record is this hold's: ending it resumes the process.
    ThisHold,
    /// A later hold of the same process stands: a thread mapped another
    /// new runtime file while the process was stopping, or the deadline
    /// resumed the process and it was held again before this report was
    /// read. That hold's own report resumes the process once its file is
    /// probed; ending it here would let the process call into that file
    /// unprobed.
    LaterHold,
    /// No record: the deadline resumed the process already.
    Gone,
}

fn whose(record: Option<u64>, held_at_ns: u64, taken_up: Option<TakenUp>) -> Record {
    match record {
        None => Record::Gone,
        Some(stamp) if stamp == held_at_ns => Record::ThisHold,
        Some(stamp) if taken_up == Some(TakenUp { held_at_ns, stamp }) => Record::ThisHold,
        Some(_) => Record::LaterHold,
    }
}

impl Hold {
    /// Resumes what an earlier daemon left held, pins this session's map
    /// and starts the watchdog. Runs before the mapping programs attach, so
    /// no process is ever held without a watchdog.
    pub fn start(map: Map) -> Result<Self, HoldError> {
        ensure_bpffs()?;
        let dir = Path::new(PIN_DIR);
        std::fs::create_dir_all(dir).map_err(|e| HoldError::BpfFs(format!("creating {PIN_DIR}: {e}")))?;
        let pin = dir.join(PIN_NAME);
        if pin.exists() {
            match open_pinned(&pin) {
                Ok(mut old) => {
                    let resumed = resume_all(&mut old);
                    if resumed > 0 {
                        warn!("resumed {resumed} processes an earlier canaryscope left held");
                    }
                }
                Err(e) => warn!("cannot read the held-process map an earlier canaryscope pinned: {e}"),
            }
            let _ = std::fs::remove_file(&pin);
        }
        map.pin(&pin)
            .map_err(|e| HoldError::Pin { path: pin.display().to_string(), reason: e.to_string() })?;
        let map = HeldMap::try_from(map)
            .map_err(|e| HoldError::Pin { path: pin.display().to_string(), reason: e.to_string() })?;
        let watchdog = spawn_watchdog(&pin).map_err(HoldError::Watchdog)?;
        info!("hold enabled: watchdog pid {}, held processes recorded in {}", watchdog.id(), pin.display());
        Ok(Self { map, pin, watchdog, taken_up: HashMap::new() })
    }

    /// Takes up the hold of `pid` stamped `held_at_ns`: the deadline moves
    /// to [`PROBING_DEADLINE`] from now. The record's stamp is where the
    /// watchdog counts [`HOLD_DEADLINE`] from, so it is moved forward by the
    /// difference; a record the watchdog already removed stays removed, and
    /// a later hold's record keeps its own deadline.
    pub fn take_up(&mut self, pid: u32, held_at_ns: u64) {
        let record = self.map.get(&pid, 0).ok();
        if whose(record, held_at_ns, self.taken_up.get(&pid).copied()) != Record::ThisHold {
            return;
        }
        let extra = PROBING_DEADLINE.saturating_sub(HOLD_DEADLINE).as_nanos() as u64;
        let stamp = BootClock::boot_now_ns().saturating_add(extra);
        if self.map.insert(pid, stamp, BPF_EXIST).is_ok() {
            self.taken_up.insert(pid, TakenUp { held_at_ns, stamp });
        }
    }

    /// Ends the hold of `pid` stamped `held_at_ns` (the kernel's report):
    /// resumes the process unless a later hold of it stands. Returns how
    /// long this hold lasted, or `None` when the deadline resumed the
    /// process first.
    ///
    /// The record is read, then removed: the watchdog could resume the
    /// process between the two, and a thread of it be held again, within
    /// that window of microseconds. Maps offer no compare-and-delete.
    pub fn resume(&mut self, pid: u32, held_at_ns: u64) -> Option<u64> {
        let record = self.map.get(&pid, 0).ok();
        match whose(record, held_at_ns, self.taken_up.get(&pid).copied()) {
            Record::Gone => {
                self.taken_up.remove(&pid);
                return None;
            }
            Record::LaterHold => debug!("pid {pid} is held again since {held_at_ns}: left to that hold"),
            Record::ThisHold => {
                self.taken_up.remove(&pid);
                let _ = self.map.remove(&pid);
                resume_process(pid, held_at_ns);
            }
        }
        Some(BootClock::boot_now_ns().saturating_sub(held_at_ns))
    }

    /// Resumes processes held past the deadline (a file that took too long
    /// to probe, or an event lost to a full ring buffer).
    pub fn resume_expired(&mut self) -> Vec<u32> {
        let resumed = resume_older_than(&mut self.map, HOLD_DEADLINE);
        for pid in &resumed {
            self.taken_up.remove(pid);
        }
        resumed
    }

    /// Resumes every held process now.
    pub fn resume_all(&mut self) -> usize {
        self.taken_up.clear();
        resume_all(&mut self.map)
    }

    pub fn watchdog_pid(&self) -> u32 {
        self.watchdog.id()
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        // The holding program is unloaded by now (the pipeline does that
        // before anything else), so nothing new can be held: resume what
        // is left and unpin.
        resume_all(&mut self.map);
        let _ = std::fs::remove_file(&self.pin);
        // The watchdog sees this process go and exits after a last sweep.
    }
}

fn open_pinned(pin: &Path) -> Result<HeldMap, String> {
    let data = MapData::from_pin(pin).map_err(|e| e.to_string())?;
    HeldMap::try_from(Map::HashMap(data)).map_err(|e| e.to_string())
}

/// Resumes every recorded process; returns how many.
pub fn resume_all(map: &mut HeldMap) -> usize {
    resume_older_than(map, Duration::ZERO).len()
}

fn resume_older_than(map: &mut HeldMap, age: Duration) -> Vec<u32> {
    let now = BootClock::boot_now_ns();
    let due: Vec<(u32, u64)> = map
        .iter()
        .flatten()
        .filter(|(_, held_at)| now.saturating_sub(*held_at) >= age.as_nanos() as u64)
        .collect();
    for (pid, held_at) in &due {
        let _ = map.remove(pid);
        resume_process(*pid, *held_at);
    }
    due.into_iter().map(|(pid, _)| pid).collect()
}

/// SIGCONT, unless the pid now names a process that started after the
/// hold (the held one exited and its pid was reused).
fn resume_process(pid: u32, held_at_ns: u64) {
    if started_after(pid, held_at_ns) {
        debug!("pid {pid} was reused since it was held; not signalling it");
        return;
    }
    // SAFETY: kill(2) with a plain pid and signal.
    if unsafe { libc::kill(pid as i32, libc::SIGCONT) } != 0 {
        debug!("resume pid {pid}: {}", io::Error::last_os_error());
    }
}

/// Whether /proc/PID/stat's start time (clock ticks since boot) is later
/// than a boot-clock time, with one tick of slack.
fn started_after(pid: u32, boot_ns: u64) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
    // comm may hold spaces and parentheses: fields start after the last ')'.
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { return false };
    // Field 22 (starttime) is the 20th after the comm.
    let Some(start_ticks) = rest.split_whitespace().nth(19).and_then(|v| v.parse::<u64>().ok()) else {
        return false;
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let tick_ns = 1_000_000_000 / hz;
    start_ticks.saturating_mul(tick_ns) > boot_ns.saturating_add(tick_ns)
}

fn ensure_bpffs() -> Result<(), HoldError> {
    let target = c"/sys/fs/bpf";
    // SAFETY: statfs into a zeroed struct with a valid path.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(target.as_ptr(), &mut fs) } == 0 && fs.f_type as i64 == BPF_FS_MAGIC {
        return Ok(());
    }
    // SAFETY: plain mount(2) of the bpf filesystem on its usual place.
    let rc = unsafe { libc::mount(c"bpf".as_ptr(), target.as_ptr(), c"bpf".as_ptr(), 0, std::ptr::null()) };
    if rc != 0 {
        return Err(HoldError::BpfFs(format!(
            "not mounted, and mounting it failed: {}",
            io::Error::last_os_error()
        )));
    }
    Ok(())
}

fn spawn_watchdog(pin: &Path) -> io::Result<Child> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.arg("hold-watchdog")
        .arg("--map")
        .arg(pin)
        .arg("--daemon-pid")
        .arg(std::process::id().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    // SAFETY: setsid is async-signal-safe. Its own session keeps Ctrl-C and
    // a signal to the daemon's process group from ending the watchdog
    // before the daemon.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    cmd.spawn()
}

/// The watchdog (`canaryscope hold-watchdog`): resumes processes held past
/// the deadline while the daemon lives, and every held process once it is
/// gone; then sweeps a little longer for a stop the kernel side was making
/// as the daemon died, and exits.
pub fn run_watchdog(pin: &Path, daemon_pid: u32) -> ExitCode {
    for sig in [libc::SIGINT, libc::SIGHUP, libc::SIGTERM, libc::SIGPIPE] {
        // SAFETY: ignoring signals; the watchdog ends when the daemon does.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    let mut map = match open_pinned(pin) {
        Ok(map) => map,
        Err(e) => {
            eprintln!("canaryscope hold-watchdog: {}: {e}", pin.display());
            return ExitCode::from(1);
        }
    };
    // SAFETY: pidfd_open(2) on a pid; the fd tells when that process is gone.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, daemon_pid as libc::c_int, 0) } as i32;
    let daemon_gone = |timeout_ms: i32| -> bool {
        if pidfd < 0 {
            std::thread::sleep(Duration::from_millis(timeout_ms as u64));
            return !Path::new(&format!("/proc/{daemon_pid}")).exists();
        }
        let mut pfd = libc::pollfd { fd: pidfd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut pfd, 1, timeout_ms) > 0 }
    };
    while !daemon_gone(50) {
        for pid in resume_older_than(&mut map, HOLD_DEADLINE) {
            eprintln!("canaryscope hold-watchdog: resumed pid {pid}, held past its deadline");
        }
    }
    // The daemon is gone: its programs detach as its descriptors close, and
    // a program already running may still record one more stop.
    let until = Instant::now() + Duration::from_millis(500);
    loop {
        resume_all(&mut map);
        if Instant::now() >= until {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_started_after_the_hold_is_not_the_held_one() {
        let me = std::process::id();
        // This process started well before now...
        assert!(!started_after(me, BootClock::boot_now_ns()));
        // ...and after boot time zero.
        assert!(started_after(me, 0));
        // A pid that does not exist is never treated as reused.
        assert!(!started_after(u32::MAX - 1, 0));
    }

    #[test]
    fn a_report_ends_only_its_own_hold() {
        let held_at = 1_000;
        // The kernel's record, untouched: this hold's.
        assert_eq!(whose(Some(held_at), held_at, None), Record::ThisHold);
        // Moved forward when the daemon took this hold up: still this hold's.
        let taken = TakenUp { held_at_ns: held_at, stamp: 9_000 };
        assert_eq!(whose(Some(9_000), held_at, Some(taken)), Record::ThisHold);
        // The process held again (a thread mapping another new file, or the
        // deadline's resume and a new mapping) before this report was read:
        // the newer stamp is not this hold's, taken up or not.
        assert_eq!(whose(Some(2_000), held_at, None), Record::LaterHold);
        assert_eq!(whose(Some(2_000), held_at, Some(taken)), Record::LaterHold);
        // A stamp taken up for another hold of the pid is not this one's.
        let other = TakenUp { held_at_ns: 2_000, stamp: 9_000 };
        assert_eq!(whose(Some(9_000), held_at, Some(other)), Record::LaterHold);
        assert_eq!(whose(None, held_at, Some(taken)), Record::Gone);
    }
}
