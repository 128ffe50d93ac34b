//! The ring-buffer reader: waits for the kernel's wake-up and hands over
//! every pending record.
use std::io;

use aya::maps::{MapData, RingBuf};
use tokio::io::{unix::AsyncFd, Interest};

/// The events ring buffer as the object hands it over.
pub type Ring = RingBuf<MapData>;

/// Reads the ring buffer from an async runtime's reactor (create it inside
/// one).
pub struct RingReader {
    ring: AsyncFd<RingBuf<MapData>>,
}

impl RingReader {
    pub fn new(ring: RingBuf<MapData>) -> io::Result<Self> {
        // SAFETY: the ring buffer owns its map's fd, which stays open for as
        // long as the ring buffer lives, and the AsyncFd owns the ring buffer.
        let ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)?;
        Ok(Self { ring })
    }

    /// Waits until the kernel signals records, then takes them all.
    pub async fn next_batch(&mut self) -> io::Result<Vec<Vec<u8>>> {
        let mut guard = self.ring.readable_mut().await?;
        let mut records = Vec::new();
        drain_into(guard.get_inner_mut(), &mut records);
        guard.clear_ready();
        // The kernel wakes a reader only when it has caught up, so a record
        // that arrived between the drain and clear_ready would sit unseen,
        // and hold back every wake-up after it.
        drain_into(guard.get_inner_mut(), &mut records);
        Ok(records)
    }

    /// Takes whatever is pending now, without waiting (a missed wake-up
    /// then costs one tick, never the stream).
    pub fn drain(&mut self) -> Vec<Vec<u8>> {
        let mut records = Vec::new();
        drain_into(self.ring.get_mut(), &mut records);
        records
    }
}

fn drain_into(ring: &mut RingBuf<MapData>, records: &mut Vec<Vec<u8>>) {
    while let Some(item) = ring.next() {
        records.push(item.to_vec());
    }
}
