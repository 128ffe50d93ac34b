//! When a process that maps code has its maps read.
//!
//! The kernel side sends at most one executable-mapping event per process
//! per window ([`MMAP_COALESCE_NS`]), so a read must come after the window
//! of the last event it answers, or a mapping made late in that window is
//! never read. A read per event would be correct, but a process that maps
//! code for seconds (a Python import of hundreds of extension modules)
//! would then have its maps, thousands of lines each time, read every
//! 100 ms while it starts: each read is the daemon's CPU and holds the
//! process's mapping lock against its own `mmap` calls. So events of a
//! process fold into one pending read, moved past each new event's window,
//! but never more than [`MAX_SCAN_WAIT`] after the first: a long start is
//! read about once a second, and a read made before its last event's window
//! closed leaves a follow-up one delay after that event.
use std::time::{Duration, Instant};

#[cfg(doc)]
use observer_common::discovery::MMAP_COALESCE_NS;
use observer_common::{discovery::MAP_SCAN_DELAY_MS, EventHeader};

/// The longest a process that keeps mapping code waits for a read.
pub(super) const MAX_SCAN_WAIT: Duration = Duration::from_millis(1000);

const SCAN_DELAY: Duration = Duration::from_millis(MAP_SCAN_DELAY_MS);

/// A process whose maps are read once its loader is likely done.
pub(super) struct PendingScan {
    pub due: Instant,
    /// The first event's record: who the read is for, and why.
    pub header: EventHeader,
    pub second_look: bool,
    /// When the first and the last event it answers arrived.
    first: Instant,
    last: Instant,
}

/// One pending read per process and kind: a second look must not turn a
/// first look at newer mappings into one that probes what the kernel is
/// about to report.
#[derive(Default)]
pub(super) struct PendingScans {
    scans: Vec<PendingScan>,
}

impl PendingScans {
    /// An event for `header.pid` arrived at `now`.
    pub fn note(&mut self, header: EventHeader, second_look: bool, now: Instant) {
        let same = |p: &&mut PendingScan| p.header.pid == header.pid && p.second_look == second_look;
        if let Some(pending) = self.scans.iter_mut().find(same) {
            pending.last = now;
            pending.due = pending.due.max(now + SCAN_DELAY).min(pending.first + MAX_SCAN_WAIT);
            return;
        }
        self.scans.push(PendingScan { due: now + SCAN_DELAY, header, second_look, first: now, last: now });
    }

    /// The reads due at `now`, taken out. One cut short by the wait limit
    /// leaves a follow-up due a delay after its last event, which later
    /// events of the process fold into.
    pub fn take_due(&mut self, now: Instant) -> Vec<PendingScan> {
        let (due, later): (Vec<PendingScan>, Vec<PendingScan>) =
            std::mem::take(&mut self.scans).into_iter().partition(|p| p.due <= now);
        self.scans = later;
        for scan in &due {
            if scan.last + SCAN_DELAY > now {
                self.scans.push(PendingScan {
                    due: scan.last + SCAN_DELAY,
                    header: scan.header,
                    second_look: scan.second_look,
                    first: now,
                    last: scan.last,
                });
            }
        }
        due
    }

    #[cfg(test)]
    fn due_of(&self, pid: u32) -> Vec<Instant> {
        self.scans.iter().filter(|p| p.header.pid == pid).map(|p| p.due).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(pid: u32) -> EventHeader {
        EventHeader { pid, ..Default::default() }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Reads pending after events of (pid, second look, ms after the start).
    fn after(events: &[(u32, bool, u64)]) -> (Instant, PendingScans) {
        let t0 = Instant::now();
        let mut pending = PendingScans::default();
        for &(pid, second_look, at) in events {
            pending.note(header(pid), second_look, t0 + ms(at));
        }
        (t0, pending)
    }

    /// A lone burst is read one delay after its event, as before.
    #[test]
    fn a_single_event_is_read_one_delay_later() {
        let (t0, mut pending) = after(&[(7, false, 0)]);
        assert!(pending.take_due(t0 + ms(99)).is_empty());
        let due = pending.take_due(t0 + ms(100));
        assert_eq!(due.len(), 1);
        assert!(pending.due_of(7).is_empty(), "nothing follows a read made after the window");
    }

    /// An event inside a pending read's delay moves the read past its own
    /// window: a mapping made there would come after a read at the old time.
    #[test]
    fn a_later_event_moves_the_read_past_its_window() {
        let (t0, mut pending) = after(&[(7, false, 0), (7, false, 60)]);
        assert!(pending.take_due(t0 + ms(100)).is_empty());
        assert_eq!(pending.take_due(t0 + ms(160)).len(), 1);
        assert!(pending.due_of(7).is_empty());
    }

    /// A process that maps code for seconds is read about once a second,
    /// each read cut short leaving a follow-up, and the last read comes
    /// after the last event's window.
    #[test]
    fn a_long_start_is_read_at_the_limit_and_after_its_last_event() {
        let t0 = Instant::now();
        let mut pending = PendingScans::default();
        let mut reads = Vec::new();
        let mut now = t0;
        // An event every 50 ms for 3.5 s, reads taken every 10 ms.
        let last_event = t0 + ms(3500);
        while now <= last_event + ms(500) {
            if now <= last_event && (now - t0).as_millis().is_multiple_of(50) {
                pending.note(header(7), false, now);
            }
            reads.extend(pending.take_due(now).into_iter().map(|_| now - t0));
            now += ms(10);
        }
        assert!((4..=6).contains(&reads.len()), "reads at {reads:?}");
        for pair in reads.windows(2) {
            assert!(pair[1] - pair[0] <= MAX_SCAN_WAIT + SCAN_DELAY, "reads at {reads:?}");
        }
        assert!(*reads.last().unwrap() >= ms(3500) + SCAN_DELAY, "reads at {reads:?}");
    }

    /// A read the limit cut short, with no event after it, is followed by
    /// one after the last event's window: a mapping in that window raised
    /// no event of its own.
    #[test]
    fn a_read_cut_short_is_followed_up() {
        let every_50_ms: Vec<(u32, bool, u64)> = (0..=20).map(|n| (7, false, 50 * n)).collect();
        let (t0, mut pending) = after(&every_50_ms);
        assert_eq!(pending.take_due(t0 + MAX_SCAN_WAIT).len(), 1);
        assert_eq!(pending.due_of(7), vec![t0 + ms(1000) + SCAN_DELAY]);
        assert_eq!(pending.take_due(t0 + ms(1100)).len(), 1);
        assert!(pending.due_of(7).is_empty());
    }

    /// Processes and kinds are read apart.
    #[test]
    fn each_process_and_kind_has_its_own_read() {
        let (t0, mut pending) = after(&[(7, false, 0), (8, false, 30), (7, true, 40)]);
        assert_eq!(pending.take_due(t0 + ms(100)).len(), 1);
        assert_eq!(pending.take_due(t0 + ms(140)).len(), 2);
    }
}
