//! Kernel events carry `CLOCK_BOOTTIME` nanoseconds; users want wall-clock time.
//!
//! The offset between the two moves whenever the wall clock is stepped (a
//! time daemon's correction, a virtual machine resumed): an offset taken
//! once at start would stamp every later event that far off, so the
//! pipeline takes it again every tick.

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

impl Default for BootClock {
    fn default() -> Self {
        Self::new()
    }
}

impl BootClock {
    pub fn new() -> Self {
        let boot = now_ns(libc::CLOCK_BOOTTIME);
        let real = now_ns(libc::CLOCK_REALTIME);
        Self { offset_ns: real - boot }
    }

    pub fn to_unix_ns(self, boot_ns: u64) -> u64 {
        (boot_ns as i128 + self.offset_ns).max(0) as u64
    }

    pub fn boot_now_ns() -> u64 {
        now_ns(libc::CLOCK_BOOTTIME).max(0) as u64
    }
}
