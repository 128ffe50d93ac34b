//! canaryscope's kernel side: one object, one file per probe family.
//!
//! Hot paths aggregate into per-CPU maps; only rare events (failures, stalls,
//! crashes, kills) go through the single ring buffer `EVENTS`.
#![no_std]
#![no_main]
// aya-ebpf's maps take keys and values as `impl Borrow<T>` and hand the
// helper a pointer: a reference says so at the call, where a value moved in
// would be one more copy on the 512-byte stack wherever it is not inlined.
#![expect(clippy::needless_borrows_for_generic_args, reason = "see above: the helpers take pointers")]

mod common;
mod crash;
mod discovery;
mod exit;
mod gpu;
mod hold_scope;
mod http;
mod kernel;
mod kfd;
mod library_load;
mod memlimit;
mod oom;
mod runs;
mod sched;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the verifier rejects any program that could reach this, so it
    // is never executed; it exists because `no_std` binaries must name one.
    unsafe { core::hint::unreachable_unchecked() }
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
