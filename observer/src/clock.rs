//! Kernel events carry `CLOCK_BOOTTIME` nanoseconds; users want wall-clock time.
//!
//! The offset between the two moves whenever the wall clock is stepped (a
//! time daemon's correction, a virtual machine resumed): an offset taken
//! once at start would stamp every later event that far off, so the
//! pipeline takes it again every tick. Between steps the two clocks run at
//! the same rate, yet two readings of them are never taken at one instant:
//! a fresh reading differs from the last by a few microseconds of jitter
//! (more in a virtual machine whose vCPU is preempted between the reads).
//! Adopting that jitter would move stamps back and forth, so that records
//! a kernel spaced one second apart read as slightly less. Only a change
//! larger than any jitter is taken as a step.

/// A change of offset smaller than this is reading jitter, not a step.
const STEP_NS: i128 = 1_000_000;

/// Readings taken to find one whose two boot-time reads are closest.
const READINGS: usize = 3;

/// Offset to add to a boot-time timestamp to get Unix time in nanoseconds.
#[derive(Clone, Copy, Debug)]
pub struct BootClock {
    offset_ns: i128,
}

fn now_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; both clocks always exist on Linux.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}

/// The offset now: the wall clock read between two boot-time reads, from
/// the tightest of a few such brackets.
fn measured_offset_ns() -> i128 {
    let mut best: Option<(i128, i128)> = None;
    for _ in 0..READINGS {
        let before = now_ns(libc::CLOCK_BOOTTIME);
        let real = now_ns(libc::CLOCK_REALTIME);
        let after = now_ns(libc::CLOCK_BOOTTIME);
        let width = after - before;
        let offset = real - (before + after) / 2;
        if best.is_none_or(|(best_width, _)| width < best_width) {
            best = Some((width, offset));
        }
    }
    best.map_or(0, |(_, offset)| offset)
}

impl Default for BootClock {
    fn default() -> Self {
        Self::new()
    }
}

impl BootClock {
    pub fn new() -> Self {
        Self { offset_ns: measured_offset_ns() }
    }

    /// Takes the offset again, keeping the old one unless the wall clock
    /// was stepped.
    pub fn retake(&mut self) {
        self.follow(measured_offset_ns());
    }

    fn follow(&mut self, measured_ns: i128) {
        if (measured_ns - self.offset_ns).abs() > STEP_NS {
            self.offset_ns = measured_ns;
        }
    }

    pub fn to_unix_ns(self, boot_ns: u64) -> u64 {
        (boot_ns as i128 + self.offset_ns).max(0) as u64
    }

    pub fn boot_now_ns() -> u64 {
        now_ns(libc::CLOCK_BOOTTIME).max(0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Boot-to-Unix offset of a host booted in late 2026.
    const BOOTED: i128 = 1_796_000_000_000_000_000;
    const HOUR_NS: i128 = 3_600_000_000_000;

    #[test]
    fn reading_jitter_leaves_stamps_where_they_were() {
        let mut clock = BootClock { offset_ns: BOOTED };
        let before = clock.to_unix_ns(5_000_000_000);
        clock.follow(BOOTED - 6_430);
        clock.follow(BOOTED + 900_000);
        assert_eq!(clock.to_unix_ns(5_000_000_000), before);
    }

    #[test]
    fn a_step_of_the_wall_clock_is_followed() {
        let mut clock = BootClock { offset_ns: BOOTED };
        clock.follow(BOOTED - HOUR_NS);
        assert_eq!(clock.to_unix_ns(5_000_000_000) as i128, 5_000_000_000 + BOOTED - HOUR_NS);
        clock.follow(BOOTED);
        assert_eq!(clock.to_unix_ns(5_000_000_000) as i128, 5_000_000_000 + BOOTED);
    }

    #[test]
    fn retaking_an_unstepped_clock_changes_nothing() {
        let mut clock = BootClock::new();
        let taken = clock.offset_ns;
        for _ in 0..1000 {
            clock.retake();
        }
        assert_eq!(clock.offset_ns, taken);
    }
}
