//! Attaching the shared entry/return programs to a file's functions, with
//! a cookie naming each: one `uprobe_multi` link per program where the
//! kernel has them, else a perf-event link per function and program (or a
//! slot's program pair where it lacks attach cookies), and letting go of
//! them again.
use std::path::Path;

use aya::{
    programs::{
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLinkId, UProbeScope},
        UProbe,
    },
    Ebpf,
};
use log::debug;

use super::{GpuLibrary, ENTER_PROGRAM, EXIT_PROGRAM};
use crate::{
    clock::BootClock,
    probes::{
        gpu_slots::Slots,
        releaser::{self, Link},
        uprobe_multi::{self, Fires, MultiPrograms, PidFilter},
        AttachError,
    },
};
use observer_common::gpu::{cookie, GpuFunction, Tier, COUNT_PROGRAM};

/// A probe link as this file holds it.
pub(super) enum ProbeLink {
    /// One function's perf-event link, owned by aya's program.
    PerFunction(&'static str, UProbeLinkId),
    /// A `uprobe_multi` link: one program at every function of a file.
    Multi(std::os::fd::OwnedFd),
}

pub(super) type Links = Vec<ProbeLink>;

fn uprobe<'a>(ebpf: &'a mut Ebpf, program: &'static str) -> Result<&'a mut UProbe, AttachError> {
    let found = ebpf.program_mut(program).ok_or(AttachError::MissingProgram(program))?;
    found.try_into().map_err(|source| AttachError::WrongType { program, expected: "uprobe", source })
}

/// What attaching a set of functions gave.
pub(super) struct AttachOutcome {
    pub(super) links: Links,
    /// Functions with all their probes in place.
    pub(super) count: usize,
    pub(super) first_error: Option<AttachError>,
    /// When the init functions' probes (attached first) were all in place,
    /// on the boot clock.
    pub(super) init_ready_ns: u64,
}

/// Attaches the entry and return programs to each resolved function of
/// `library` that `wanted` picks, through `path`, for `scope`; with
/// `count_hot`, hot functions get the counting return program alone.
#[expect(
    clippy::too_many_arguments,
    reason = "one attach's inputs, each from a different owner; its two callers build none of them together"
)]
pub(super) fn attach_functions(
    ebpf: &mut Ebpf,
    mut slots: Option<&mut Slots>,
    multi: Option<&MultiPrograms>,
    path: &Path,
    library: &GpuLibrary,
    library_index: u32,
    wanted: impl Fn(&GpuFunction) -> bool,
    count_hot: bool,
    scope: UProbeScope,
) -> AttachOutcome {
    let api = library.flavor.api();
    // Per-process links where the kernel's filter would drop worker
    // threads' calls are perf-event links, whose filter matches the mm.
    let per_process = matches!(scope, UProbeScope::OneProcess(_));
    let multi = multi.filter(|m| !(per_process && m.pid_filter == PidFilter::MainThreadOnly));
    if let (Some(multi), None) = (multi, slots.as_deref()) {
        match attach_multi(multi, path, library, library_index, &wanted, count_hot, scope) {
            Ok(outcome) => return outcome,
            // A file the kernel refuses as a whole (an offset it will not
            // probe) still gets every function it can, one link each, and
            // the reason per function.
            Err(e) => debug!(
                "uprobe_multi on {} ({}): {e}; a link per function instead",
                library.display_path,
                path.display()
            ),
        }
    }
    let mut outcome = AttachOutcome { links: Vec::new(), count: 0, first_error: None, init_ready_ns: 0 };
    let mut init_ready_ns = None;
    for index in attach_order(api.functions()) {
        let function = &api.functions()[index];
        if init_ready_ns.is_none() && !observer_common::gpu::is_init_function(function.name) {
            init_ready_ns = Some(BootClock::boot_now_ns());
        }
        if !wanted(function) {
            continue;
        }
        let Some(&offset) = library.functions.get(function.name) else {
            continue;
        };
        let point_cookie = cookie(library_index, api, index as u32);
        // Without attach cookies the slot's programs carry the cookie.
        // The return program first: the first breakpoint at the entry
        // comes with it, and until the entry program follows a return
        // without an entry counts with no duration. The other way round, a
        // call entered in between would never pop its frame, and the
        // thread would look stuck in that call (a false stall) for good.
        let (programs, attach_cookie) = match slots.as_deref_mut() {
            None if count_hot && function.tier == Tier::Hot => (vec![COUNT_PROGRAM], Some(point_cookie)),
            None => (vec![EXIT_PROGRAM, ENTER_PROGRAM], Some(point_cookie)),
            Some(slots) => match slots.programs_for(ebpf, point_cookie) {
                Ok((enter, exit)) => (vec![exit, enter], None),
                Err(e) => {
                    debug!("no slot for {} {}: {e}", library.display_path, function.name);
                    outcome.first_error.get_or_insert(e);
                    continue;
                }
            },
        };
        let mut ok = true;
        for program_name in programs {
            match attach_point(ebpf, program_name, path, offset, attach_cookie, scope) {
                Ok(link) => outcome.links.push(ProbeLink::PerFunction(program_name, link)),
                Err(e) => {
                    debug!("attach {} {}: {e}", library.display_path, function.name);
                    outcome.first_error.get_or_insert(e);
                    ok = false;
                }
            }
        }
        if ok {
            outcome.count += 1;
        }
    }
    outcome.init_ready_ns = init_ready_ns.unwrap_or_else(BootClock::boot_now_ns);
    outcome
}

/// Attaches `library`'s wanted functions with one `uprobe_multi` link per
/// program, return programs first (see `attach_functions`), each link's
/// init functions first. On error nothing stays attached.
fn attach_multi(
    multi: &MultiPrograms,
    path: &Path,
    library: &GpuLibrary,
    library_index: u32,
    wanted: &impl Fn(&GpuFunction) -> bool,
    count_hot: bool,
    scope: UProbeScope,
) -> std::io::Result<AttachOutcome> {
    let api = library.flavor.api();
    /// One link's program, when it fires, and its (offset, cookie) points.
    type Group = (&'static str, Fires, Vec<(u64, u64)>);
    let mut groups: [Group; 3] = [
        (COUNT_PROGRAM, Fires::AtReturn, Vec::new()),
        (EXIT_PROGRAM, Fires::AtReturn, Vec::new()),
        (ENTER_PROGRAM, Fires::AtEntry, Vec::new()),
    ];
    let mut count = 0;
    for index in attach_order(api.functions()) {
        let function = &api.functions()[index];
        let Some(&offset) = library.functions.get(function.name).filter(|_| wanted(function)) else {
            continue;
        };
        let point = (offset, cookie(library_index, api, index as u32));
        if count_hot && function.tier == Tier::Hot {
            groups[0].2.push(point);
        } else {
            groups[1].2.push(point);
            groups[2].2.push(point);
        }
        count += 1;
    }
    let pid = match scope {
        UProbeScope::OneProcess(pid) => Some(pid.get()),
        UProbeScope::AllProcesses | UProbeScope::CallingProcess => None,
    };
    let mut links = Vec::new();
    for (program, fires, points) in &groups {
        if points.is_empty() {
            continue;
        }
        let created = multi
            .fd(program)
            .ok_or_else(|| std::io::Error::other(format!("{program} is not loaded for uprobe_multi")))
            .and_then(|fd| {
                releaser::note_attach();
                uprobe_multi::attach(fd, path, points, *fires, pid)
            });
        match created {
            Ok(link) => links.push(link),
            Err(e) => {
                releaser::release(links.into_iter().rev().map(Link::Multi).collect());
                return Err(e);
            }
        }
    }
    let links = links.into_iter().map(ProbeLink::Multi).collect();
    Ok(AttachOutcome { links, count, first_error: None, init_ready_ns: BootClock::boot_now_ns() })
}

/// Indices into `functions` in the order their probes are created: the
/// init functions (`cuInit`, `hipInit`, `cudaGetDeviceCount`, ...) first,
/// the rest in table order. Creating a uprobe takes milliseconds, so a
/// process that maps a runtime and calls it at once, without the hold, is
/// caught by whichever probes exist by then; its first call is one of these.
fn attach_order(functions: &[GpuFunction]) -> Vec<usize> {
    let (mut order, rest): (Vec<usize>, Vec<usize>) =
        (0..functions.len()).partition(|&i| observer_common::gpu::is_init_function(functions[i].name));
    order.extend(rest);
    order
}

fn attach_point(
    ebpf: &mut Ebpf,
    program_name: &'static str,
    path: &Path,
    offset: u64,
    point_cookie: Option<u64>,
    scope: UProbeScope,
) -> Result<UProbeLinkId, AttachError> {
    releaser::note_attach();
    uprobe(ebpf, program_name)?
        .attach(
            UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(offset),
                cookie: point_cookie,
            },
            path,
            scope,
        )
        .map_err(AttachError::Attach)
}

/// Detaches links off the event loop (see [`releaser`]): releasing
/// a uprobe link waits for a grace period under a mutex that attaching takes
/// too, so a library's 30-odd links would stall event handling, and any
/// process held meanwhile, for seconds.
///
/// Links go in the reverse of their attach order, entry programs before
/// their return programs, for the reason `attach_functions` gives.
pub(super) fn detach_links(ebpf: &mut Ebpf, links: Links) {
    let mut taken = Vec::with_capacity(links.len());
    for link in links.into_iter().rev() {
        match link {
            ProbeLink::Multi(fd) => taken.push(Link::Multi(fd)),
            ProbeLink::PerFunction(program_name, link) => {
                match uprobe(ebpf, program_name).and_then(|p| p.take_link(link).map_err(AttachError::Attach))
                {
                    Ok(link) => taken.push(Link::PerfEvent(link)),
                    Err(e) => debug!("detach {program_name}: {e}"),
                }
            }
        }
    }
    releaser::release(taken);
}

#[cfg(test)]
mod tests {
    use super::*;
    use observer_common::gpu::Api;

    #[test]
    fn init_functions_are_attached_before_the_rest() {
        for api in Api::ALL {
            let functions = api.functions();
            let order = attach_order(functions);
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..functions.len()).collect::<Vec<_>>(), "{api:?}: each function once");
            let inits = functions.iter().filter(|f| observer_common::gpu::is_init_function(f.name)).count();
            assert!(inits > 0, "{api:?} has init functions");
            let (head, tail) = order.split_at(inits);
            assert!(
                head.iter().all(|&i| observer_common::gpu::is_init_function(functions[i].name)),
                "{api:?}"
            );
            assert!(tail.windows(2).all(|w| w[0] < w[1]), "{api:?}: the rest keep table order");
        }
        // The call a process makes first is the first probe created.
        assert_eq!(Api::Cuda.functions()[attach_order(Api::Cuda.functions())[0]].name, "cuInit");
        assert_eq!(Api::Hip.functions()[attach_order(Api::Hip.functions())[0]].name, "hipInit");
    }
}
