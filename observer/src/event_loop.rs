//! The event loop `trace` and `run` share: wake on ring-buffer records, on
//! the HTTP ring's wake-ups and on a tick, stop on Ctrl-C, SIGTERM, a
//! deadline, or when the consumer says so. What happens to the events is the consumer's.
use std::{os::fd::OwnedFd, sync::Arc, time::Duration};

use tokio::{
    io::{unix::AsyncFd, Interest},
    signal::unix::{signal, Signal, SignalKind},
    sync::Notify,
};

use crate::{
    events::Event,
    pipeline::{
        reader::{Ring, RingReader},
        Pipeline,
    },
};

/// Whether the loop goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// Why the loop itself stopped with an error (a consumer's own errors are
/// its own type).
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    #[error("ring buffer: {0}")]
    Ring(std::io::Error),
    #[error("cannot handle Ctrl-C and SIGTERM: {0}")]
    Signal(std::io::Error),
}

/// Ctrl-C and SIGTERM, listened for from start to stop. A signal that comes
/// while the loop is busy (printing to a full pipe, attaching a library)
/// waits here for the next turn; tokio's `ctrl_c()`, made anew each turn,
/// hears only signals that come while it is awaited, and would lose it.
pub struct StopSignals {
    interrupt: Signal,
    terminate: Signal,
}

impl StopSignals {
    pub fn new() -> Result<Self, LoopError> {
        Ok(Self {
            interrupt: signal(SignalKind::interrupt()).map_err(LoopError::Signal)?,
            terminate: signal(SignalKind::terminate()).map_err(LoopError::Signal)?,
        })
    }

    /// The next Ctrl-C or SIGTERM, or one that came since the last call.
    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

/// What `trace`, `run` and `top` do with what the pipeline yields.
pub trait Consumer {
    /// What the consumer fails with; the loop's own errors become one.
    type Error: From<LoopError>;
    /// Events decoded from ring-buffer records.
    fn events(&mut self, pipeline: &mut Pipeline, events: Vec<Event>) -> Result<Flow, Self::Error>;
    /// Periodic work after each tick's drain and housekeeping.
    fn tick(&mut self, pipeline: &mut Pipeline) -> Result<Flow, Self::Error>;
    /// Work that cannot wait for the next tick, when [`Schedule::wake`] is
    /// notified.
    fn wake(&mut self, _pipeline: &mut Pipeline) -> Result<Flow, Self::Error> {
        Ok(Flow::Continue)
    }
}

pub struct Schedule {
    /// How often the consumer's periodic work runs.
    pub tick: Duration,
    /// Stop after this long (`trace --duration`).
    pub deadline: Option<Duration>,
    /// Notified when the consumer has work that cannot wait for the tick
    /// (a pod appeared: the kernel must know it before its cgroup is made).
    pub wake: Option<Arc<Notify>>,
}

/// Runs until a signal, the deadline or the consumer stops it.
pub async fn run<C: Consumer>(
    pipeline: &mut Pipeline,
    ring: Ring,
    consumer: &mut C,
    schedule: Schedule,
) -> Result<(), C::Error> {
    let mut reader = RingReader::new(ring).map_err(LoopError::Ring)?;
    let http_ring = http_ring(pipeline).map_err(LoopError::Ring)?;
    let mut stop = StopSignals::new()?;
    let mut tick = tokio::time::interval(schedule.tick);
    let deadline = schedule.deadline.map(|d| tokio::time::Instant::now() + d);
    loop {
        let until_deadline = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        let woken = async {
            match &schedule.wake {
                Some(wake) => wake.notified().await,
                None => std::future::pending().await,
            }
        };
        let http_ready = async {
            match &http_ring {
                Some(ring) => ring.readable().await,
                None => std::future::pending().await,
            }
        };
        let flow = tokio::select! {
            _ = stop.recv() => Flow::Stop,
            _ = until_deadline => {
                let events = pipeline.handle(&reader.drain());
                consumer.events(pipeline, events)?;
                Flow::Stop
            }
            batch = reader.next_batch() => {
                let records = batch.map_err(LoopError::Ring)?;
                let events = pipeline.handle(&records);
                consumer.events(pipeline, events)?
            }
            ready = http_ready => {
                // Cleared before the drain: a record submitted after the
                // drain's last read wakes the loop again.
                ready.map_err(LoopError::Ring)?.clear_ready();
                let events = pipeline.handle(&[]);
                consumer.events(pipeline, events)?
            }
            _ = woken => consumer.wake(pipeline)?,
            _ = tick.tick() => {
                let events = pipeline.handle(&reader.drain());
                pipeline.housekeeping();
                match consumer.events(pipeline, events)? {
                    Flow::Stop => Flow::Stop,
                    Flow::Continue => consumer.tick(pipeline)?,
                }
            }
        };
        if flow == Flow::Stop {
            return Ok(());
        }
    }
}

/// The HTTP ring, registered with the reactor, when the family runs. The
/// pipeline keeps draining it on each tick; this wakes the loop between
/// ticks when the programs say a quarter of the ring waits.
fn http_ring(pipeline: &Pipeline) -> std::io::Result<Option<AsyncFd<OwnedFd>>> {
    pipeline
        .http_ring_fd()
        .map(|fd| {
            // SAFETY: the AsyncFd owns the descriptor (a dup of the ring
            // map's), which stays open for as long as it lives.
            unsafe { AsyncFd::register_with_interest(fd?, Interest::READABLE) }.map_err(|e| e.into_parts().1)
        })
        .transpose()
}

/// For a command a person stops (`trace`, `top`): gives the prompt back at
/// once, telling them the kernel is still releasing the probes.
pub fn leave(pipeline: &mut Pipeline) {
    if let Some(pid) = pipeline.release_after_exit() {
        eprintln!("canaryscope: stopped; the kernel releases the probes in the background (pid {pid})");
    }
}
