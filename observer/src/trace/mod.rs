//! `canaryscope trace`: attach, then print every failure as it happens until
//! Ctrl-C, SIGTERM or `--duration`.
pub mod render;

use std::{
    io::{self, Write},
    process::ExitCode,
    time::Duration,
};

use log::warn;
use tokio::{io::unix::AsyncFd, signal::unix::SignalKind};

use crate::{
    cli_error::{require_root, CliError},
    events::Event,
    probes::KernelSettings,
    session::{Session, SessionError, SessionOptions},
    TraceArgs,
};

/// Which events the user asked to see.
pub struct Filter {
    /// A successful call this slow is shown anyway: it is a stall ending.
    slow_ns: u64,
    pids: Vec<u32>,
    cgroup_prefix: Option<String>,
    comm: Option<String>,
    all: bool,
}

impl Filter {
    pub fn from_args(args: &TraceArgs) -> Self {
        Self {
            slow_ns: args.stall_threshold.as_nanos().min(u128::from(u64::MAX)) as u64,
            pids: args.pids.clone(),
            cgroup_prefix: args.cgroup.clone(),
            comm: args.comm.clone(),
            all: args.all,
        }
    }

    pub fn matches(&self, event: &Event) -> bool {
        let o = &event.origin;
        // What the tracer itself starts probing is always shown.
        if matches!(event.detail, crate::events::Detail::LibraryProbed { .. }) {
            return true;
        }
        let slow = matches!(event.detail, crate::events::Detail::GpuCall { duration_ns, .. } if duration_ns >= self.slow_ns);
        if !self.all && !event.is_failure() && !slow {
            return false;
        }
        if !self.pids.is_empty() && !self.pids.contains(&o.pid) {
            return false;
        }
        if let Some(prefix) = &self.cgroup_prefix {
            if !o.cgroup.as_deref().is_some_and(|c| c.starts_with(prefix.as_str())) {
                return false;
            }
        }
        if let Some(comm) = &self.comm {
            if &o.comm != comm {
                return false;
            }
        }
        true
    }
}

/// Validates what can be checked without privileges, so bad input gets a
/// clear answer before anything is loaded.
fn validate(args: &TraceArgs) -> Result<(), CliError> {
    for lib in &args.libs {
        if let Err(e) = std::fs::metadata(lib) {
            return Err(CliError::usage(format!("--lib {}: {e}", lib.display())));
        }
    }
    if !args.libs.is_empty() && !args.probes.gpu {
        return Err(CliError::usage("--lib needs the gpu probes: add gpu to --probes"));
    }
    if args.hold && !args.probes.gpu {
        return Err(CliError::usage("--hold needs the gpu probes: add gpu to --probes"));
    }
    Ok(())
}

pub fn run(args: TraceArgs) -> Result<ExitCode, CliError> {
    validate(&args)?;
    require_root("canaryscope trace")?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::runtime(format!("cannot start the event loop: {e}")))?;
    runtime.block_on(trace(args))
}

async fn trace(args: TraceArgs) -> Result<ExitCode, CliError> {
    let stall_ns = args.stall_threshold.as_nanos().min(u64::MAX as u128) as u64;
    let session = Session::start(SessionOptions {
        settings: KernelSettings {
            gpu_emit_all: args.all,
            gpu_slow_ns: stall_ns.max(1),
            kfd_device: args.kfd_device.clone(),
            hold: args.hold,
        },
        explicit_libs: args.libs.clone(),
        stall_threshold_ns: stall_ns.max(1),
        families: args.probes,
        oversubscribed_after: Duration::from_secs(2),
        hold: args.hold,
    })
    .map_err(SessionError::into_cli)?;

    let filter = Filter::from_args(&args);
    let libraries: Vec<String> = session
        .gpu
        .libraries()
        .map(|l| format!("{} ({} functions)", l.library.display_path, l.functions))
        .collect();
    if libraries.is_empty() {
        eprintln!("canaryscope: no GPU runtime library found yet; watching for processes that load one");
    } else {
        eprintln!("canaryscope: probing {}", libraries.join(", "));
    }
    for p in session.probe_status.iter().filter(|p| !p.attached) {
        eprintln!("canaryscope: not watching {} ({}): {}", p.probe, p.target, p.detail);
    }
    if let Some(watchdog) = session.hold_watchdog() {
        eprintln!(
            "canaryscope: --hold: a process mapping a GPU runtime file never seen before waits until it is probed (watchdog pid {watchdog})"
        );
    }
    eprintln!("canaryscope: tracing; Ctrl-C to stop");

    let mut out = io::BufWriter::new(io::stdout().lock());
    if !args.json {
        let _ = writeln!(out, "{}", render::HEADER);
        let _ = out.flush();
    }

    // SAFETY: the ring buffer's fd is owned by the session's map, stays open
    // for the session's whole life, and `as_raw_fd` always returns it.
    let mut fd = unsafe { AsyncFd::register_with_interest(session, tokio::io::Interest::READABLE) }
        .map_err(|e| CliError::runtime(format!("ring buffer: {}", e.into_parts().1)))?;
    let mut sigterm = tokio::signal::unix::signal(SignalKind::terminate())
        .map_err(|e| CliError::runtime(format!("cannot handle SIGTERM: {e}")))?;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let deadline = args.duration.map(|d| tokio::time::Instant::now() + d);
    let mut lost_reported = 0;
    let mut cpu_tick = std::time::Instant::now();

    loop {
        let sleep_until_deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let mut batch = Vec::new();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = sigterm.recv() => break,
            _ = sleep_until_deadline => {
                fd.get_mut().drain(|e| batch.push(e));
                emit(&mut out, &filter, args.json, batch)?;
                break;
            }
            guard = fd.readable_mut() => {
                let mut guard = guard.map_err(|e| CliError::runtime(format!("ring buffer: {e}")))?;
                guard.get_inner_mut().drain(|e| batch.push(e));
                guard.clear_ready();
                // The kernel wakes a reader only when it has caught up, so
                // a record that arrived between the drain and clear_ready
                // would sit unseen, and hold back every wakeup after it.
                guard.get_inner_mut().drain(|e| batch.push(e));
            }
            _ = tick.tick() => {
                let session = fd.get_mut();
                // A missed wakeup costs at most one tick, never the stream.
                session.drain(|e| batch.push(e));
                session.run_pending_scans();
                batch.extend(session.scan_stalls());
                if cpu_tick.elapsed() >= Duration::from_secs(1) {
                    cpu_tick = std::time::Instant::now();
                    batch.extend(session.sample_cpu());
                }
                let lost = session.events_lost();
                if lost > lost_reported {
                    warn!("{} events lost: the ring buffer was full", lost - lost_reported);
                    lost_reported = lost;
                }
            }
        }
        emit(&mut out, &filter, args.json, batch)?;
    }
    let _ = out.flush();
    Ok(ExitCode::SUCCESS)
}

fn emit(out: &mut impl Write, filter: &Filter, json: bool, batch: Vec<Event>) -> Result<(), CliError> {
    for event in batch.iter().filter(|e| filter.matches(e)) {
        let line = if json { event.to_json().to_string() } else { render::line(event) };
        // A closed pipe (`| head`) ends the trace quietly.
        if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
            std::process::exit(0);
        }
    }
    Ok(())
}

impl std::os::fd::AsRawFd for Session {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.events.as_raw_fd()
    }
}
