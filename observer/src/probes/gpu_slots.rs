//! GPU call probes on kernels without attach cookies (before 5.15).
//!
//! With cookies, one entry and one return program serve every probed
//! function, and the cookie attached with each says which function of which
//! library fired. Without them, the object carries `MAX_GPU_SLOTS` pairs of
//! programs that differ only in a slot number: each probed function of a
//! library file gets a slot, its cookie is written into the kernel's
//! `GPU_SLOT_COOKIES` array at that slot, and the slot's pair is attached to
//! it. Everything downstream of the cookie is the same code and the same
//! records. Per-process (hot-tier) probes of a function reuse its slot.
use std::{
    collections::{HashMap, HashSet},
    sync::OnceLock,
};

use aya::{
    maps::{Array, MapData},
    programs::UProbe,
    Ebpf,
};
use observer_common::gpu::{
    cookie_library, MAX_GPU_SLOTS, SLOT_COOKIES_MAP, SLOT_ENTER_PREFIX, SLOT_EXIT_PREFIX,
};

use super::AttachError;

/// The entry and return program names of every slot, made once: aya wants
/// program names that live as long as the object.
pub fn slot_programs(slot: u32) -> Option<(&'static str, &'static str)> {
    static NAMES: OnceLock<Vec<(String, String)>> = OnceLock::new();
    let names = NAMES.get_or_init(|| {
        (0..MAX_GPU_SLOTS)
            .map(|s| (format!("{SLOT_ENTER_PREFIX}{s}"), format!("{SLOT_EXIT_PREFIX}{s}")))
            .collect()
    });
    names.get(slot as usize).map(|(enter, exit)| (enter.as_str(), exit.as_str()))
}

/// Which slot holds which function's cookie.
#[derive(Debug)]
pub struct Slots {
    by_cookie: HashMap<u64, u32>,
    free: Vec<u32>,
    loaded: HashSet<u32>,
}

impl Default for Slots {
    fn default() -> Self {
        // Popped from the end: slot 0 first.
        Self { by_cookie: HashMap::new(), free: (0..MAX_GPU_SLOTS).rev().collect(), loaded: HashSet::new() }
    }
}

impl Slots {
    /// The programs to attach for the function `point_cookie` names: its
    /// slot's pair, with the cookie in place and both programs loaded.
    pub fn programs_for(
        &mut self,
        ebpf: &mut Ebpf,
        point_cookie: u64,
    ) -> Result<(&'static str, &'static str), AttachError> {
        let slot = match self.by_cookie.get(&point_cookie) {
            Some(&slot) => slot,
            None => {
                let slot = self.free.pop().ok_or(AttachError::NoSlot(MAX_GPU_SLOTS))?;
                if let Err(e) = write_cookie(ebpf, slot, point_cookie) {
                    self.free.push(slot);
                    return Err(e);
                }
                self.by_cookie.insert(point_cookie, slot);
                slot
            }
        };
        let (enter, exit) = slot_programs(slot).ok_or(AttachError::NoSlot(MAX_GPU_SLOTS))?;
        if !self.loaded.contains(&slot) {
            for program in [enter, exit] {
                let found = ebpf.program_mut(program).ok_or(AttachError::MissingProgram(program))?;
                let uprobe: &mut UProbe = found.try_into().map_err(|source| AttachError::WrongType {
                    program,
                    expected: "uprobe",
                    source,
                })?;
                uprobe.load().map_err(AttachError::Load)?;
            }
            self.loaded.insert(slot);
        }
        Ok((enter, exit))
    }

    /// Frees the slots of library `index`, whose probes are all detached.
    /// Their programs stay loaded for the next function to use.
    pub fn release_library(&mut self, index: u32) {
        let freed: Vec<(u64, u32)> = self
            .by_cookie
            .iter()
            .filter(|(c, _)| cookie_library(**c) == index)
            .map(|(c, s)| (*c, *s))
            .collect();
        for (point_cookie, slot) in freed {
            self.by_cookie.remove(&point_cookie);
            self.free.push(slot);
        }
    }

    pub fn in_use(&self) -> usize {
        self.by_cookie.len()
    }
}

fn write_cookie(ebpf: &mut Ebpf, slot: u32, point_cookie: u64) -> Result<(), AttachError> {
    let map =
        ebpf.map_mut(SLOT_COOKIES_MAP).ok_or(AttachError::SlotMap(format!("{SLOT_COOKIES_MAP} missing")))?;
    let mut cookies: Array<&mut MapData, u64> =
        Array::try_from(map).map_err(|e| AttachError::SlotMap(e.to_string()))?;
    cookies.set(slot, point_cookie, 0).map_err(|e| AttachError::SlotMap(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A retired library's slots go back to the pool, others' stay.
    #[test]
    fn a_retired_librarys_slots_are_free_again() {
        use observer_common::gpu::{cookie, Api};
        let mut slots = Slots::default();
        for (library, function) in [(0, 0), (0, 1), (1, 0)] {
            let slot = slots.free.pop().expect("a free slot");
            slots.by_cookie.insert(cookie(library, Api::Hip, function), slot);
        }
        let free = slots.free.len();
        slots.release_library(0);
        assert_eq!((slots.in_use(), slots.free.len()), (1, free + 2));
        assert!(slots.by_cookie.contains_key(&cookie(1, Api::Hip, 0)));
    }

    #[test]
    fn slot_names_match_the_kernel_side_macro() {
        assert_eq!(slot_programs(0), Some(("gpu_enter_s0", "gpu_exit_s0")));
        assert_eq!(slot_programs(MAX_GPU_SLOTS - 1).map(|p| p.0), Some("gpu_enter_s255"));
        assert_eq!(slot_programs(MAX_GPU_SLOTS), None);
    }
}
