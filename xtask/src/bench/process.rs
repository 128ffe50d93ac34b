//! The processes a benchmark starts: observers, peers and fixtures.
//!
//! Every child is stopped and reaped whatever way the bench leaves its
//! scope (an error, a panic, or the bench itself being killed), so an
//! interrupted run leaves no probes attached and no load running that would
//! skew the next one.
use std::{
    fs::{self, File},
    os::unix::process::CommandExt,
    path::PathBuf,
    process::{Child, Command, ExitStatus, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context, Result};

use super::Env;
use crate::root;

pub(super) const SIGINT: i32 = 2;
pub(super) const SIGKILL: i32 = 9;
pub(super) const SIGTERM: i32 = 15;
const SC_CLK_TCK: i32 = 2;

const PR_SET_PDEATHSIG: i32 = 1;

extern "C" {
    pub(super) fn kill(pid: i32, sig: i32) -> i32;
    fn sysconf(name: i32) -> i64;
    fn prctl(option: i32, ...) -> i32;
}

fn send_signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) takes plain integers; the pid is a child of ours that
    // has not been reaped yet (callers check with try_wait first).
    unsafe { kill(pid as i32, sig) };
}

pub(super) fn clock_ticks() -> f64 {
    // SAFETY: sysconf takes and returns plain integers.
    let t = unsafe { sysconf(SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// CPU ms (user and system) process `pid` has used so far.
pub(super) fn process_cpu_ms(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    // After the command: state is field 3, utime 14 and stime 15.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks * 1e3 / clock_ticks())
}

pub(super) fn is_root() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

pub(super) fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .map(PathBuf::from)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/usr/local/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

static LOG_SEQ: AtomicUsize = AtomicUsize::new(0);

/// A child process that is stopped (signal, then SIGKILL after a timeout)
/// and reaped whatever path the bench takes out of its scope.
pub(super) struct Proc {
    name: String,
    child: Option<Child>,
    status: Option<ExitStatus>,
    stop_signal: i32,
    stop_timeout: Duration,
    log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with stdin from /dev/null and stdout+stderr into a log file.
    pub(super) fn spawn(
        env: &Env,
        name: &str,
        cmd: &mut Command,
        stop_signal: i32,
        stop_timeout: Duration,
    ) -> Result<Proc> {
        let seq = LOG_SEQ.fetch_add(1, Ordering::Relaxed);
        let log = env.logs.join(format!("{seq:03}-{name}.log"));
        let out = File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let err = out.try_clone()?;
        cmd.stdout(out).stderr(err);
        Proc::start(name, cmd, stop_signal, stop_timeout, log)
    }

    /// Like `spawn`, with output discarded (many short-lived processes).
    pub(super) fn spawn_silent(
        name: &str,
        cmd: &mut Command,
        stop_signal: i32,
        stop_timeout: Duration,
    ) -> Result<Proc> {
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        Proc::start(name, cmd, stop_signal, stop_timeout, PathBuf::from("/dev/null"))
    }

    fn start(
        name: &str,
        cmd: &mut Command,
        stop_signal: i32,
        stop_timeout: Duration,
        log: PathBuf,
    ) -> Result<Proc> {
        let shown = format!("{cmd:?}").replace('"', "");
        // If the bench itself dies without unwinding (SIGKILL, a signal to
        // it alone), its children get SIGTERM instead of running on.
        // SAFETY: prctl is async-signal-safe and touches no Rust state.
        unsafe {
            cmd.pre_exec(|| {
                prctl(PR_SET_PDEATHSIG, SIGTERM);
                Ok(())
            });
        }
        let child = cmd
            .current_dir(root())
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {shown}"))?;
        Ok(Proc { name: name.into(), child: Some(child), status: None, stop_signal, stop_timeout, log })
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// The exit status once the process has ended (reaps it).
    pub(super) fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(s)) = c.try_wait() {
                    self.status = Some(s);
                }
            }
        }
        self.status
    }

    /// Waits for the process to end on its own, up to `timeout`.
    fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.exited() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            sleep(Duration::from_millis(5));
        }
    }

    /// Signals, waits up to the stop timeout, then SIGKILLs. Returns how
    /// long the process took to go and whether it had to be killed.
    pub(super) fn stop(&mut self) -> (Duration, bool) {
        let started = Instant::now();
        if self.exited().is_some() || self.child.is_none() {
            return (Duration::ZERO, false);
        }
        send_signal(self.pid(), self.stop_signal);
        if self.wait_timeout(self.stop_timeout).is_some() {
            return (started.elapsed(), false);
        }
        eprintln!(
            "    {} (pid {}) still running {:.0?} after signal {}: SIGKILL",
            self.name,
            self.pid(),
            self.stop_timeout,
            self.stop_signal
        );
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            if let Ok(s) = c.wait() {
                self.status = Some(s);
            }
        }
        (started.elapsed(), true)
    }

    pub(super) fn output(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub(super) fn log_tail(&self) -> String {
        let text = self.output();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(15)..].join("\n      ");
        format!("last lines of {}:\n      {tail}", self.log.display())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs a fixture to completion (killed after `timeout`) and returns its
/// exit status, whatever it is, with the process for its output: for
/// callers to whom a failing exit is a result to report, not an error.
pub(super) fn run_to_end(
    env: &Env,
    name: &str,
    cmd: &mut Command,
    timeout: Duration,
) -> Result<(ExitStatus, Proc)> {
    let mut p = Proc::spawn(env, name, cmd, SIGKILL, Duration::from_secs(5))?;
    match p.wait_timeout(timeout) {
        Some(s) => Ok((s, p)),
        None => {
            p.stop();
            bail!("{name} did not finish within {timeout:.0?}; {}", p.log_tail())
        }
    }
}

/// Runs a fixture to completion (killed after `timeout`) and returns its output.
pub(super) fn run_fixture(env: &Env, name: &str, cmd: &mut Command, timeout: Duration) -> Result<String> {
    match run_to_end(env, name, cmd, timeout)? {
        (s, p) if s.success() => Ok(p.output()),
        (s, p) => bail!("{name} failed ({s}); {}", p.log_tail()),
    }
}

pub(super) fn parse_field(text: &str, key: &str) -> Option<f64> {
    text.split_whitespace().find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

/// Runs fixture `name` with `args` to completion and reads its `key=VALUE`
/// figure: how the overhead cases time a loop of calls or round trips.
pub(super) fn fixture_figure(
    env: &Env,
    name: &str,
    args: &[&str],
    key: &str,
    timeout: Duration,
) -> Result<f64> {
    fixture_figure_in(env, name, args, key, timeout, None)
}

/// The same, with the fixture in the cgroup whose `cgroup.procs` is given
/// (joined before exec, so all of its run counts there).
pub(super) fn fixture_figure_in(
    env: &Env,
    name: &str,
    args: &[&str],
    key: &str,
    timeout: Duration,
    cgroup_procs: Option<&std::path::Path>,
) -> Result<f64> {
    let mut cmd = Command::new(env.fixture(name));
    cmd.args(args);
    if let Some(procs) = cgroup_procs {
        let procs = procs.to_path_buf();
        // SAFETY: only a file write between fork and exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || std::fs::write(&procs, b"0"))
        };
    }
    let out = run_fixture(env, name, &mut cmd, timeout)?;
    parse_field(&out, key).ok_or_else(|| anyhow!("no {key} in {name} output: {out}"))
}
