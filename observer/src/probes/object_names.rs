//! The names userspace looks up in the eBPF object, checked against the
//! object itself. aya-ebpf's `#[map(name = ...)]` takes only a literal, so a
//! map, program or global renamed on one side only would compile, load,
//! and then find nothing. This parses the object the binary embeds.
use std::collections::{BTreeMap, BTreeSet};

use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};
use observer_common::{gpu::COUNT_PROGRAM, USERSPACE_GLOBALS, USERSPACE_MAPS};

/// The loader's probes (`library_load`), attached per libc file.
const LOADER_PROGRAMS: [&str; 3] = [
    observer_common::library_load::DLOPEN_ENTER_PROGRAM,
    observer_common::library_load::DLMOPEN_ENTER_PROGRAM,
    observer_common::library_load::DLOPEN_EXIT_PROGRAM,
];

use super::{
    gpu::{ENTER_PROGRAM, EXIT_PROGRAM},
    table::{self, Hook},
    EBPF_OBJECT,
};

/// Global symbols of the object: name -> (section name, kind).
fn symbols() -> BTreeMap<String, (String, SymbolKind)> {
    let file = object::File::parse(EBPF_OBJECT).expect("the embedded eBPF object parses");
    file.symbols()
        .filter(|s| s.is_global())
        .filter_map(|s| {
            let name = s.name().ok()?.to_string();
            let section = s.section_index().and_then(|i| file.section_by_index(i).ok())?;
            Some((name, (section.name().ok()?.to_string(), s.kind())))
        })
        .collect()
}

/// The section an aya program of this hook must live in.
fn section_fits(hook: Hook, section: &str) -> bool {
    match hook {
        Hook::Raw(_) => section.starts_with("raw_tp") || section.starts_with("raw_tracepoint"),
        Hook::Btf(_) => section.starts_with("tp_btf"),
        Hook::Tracepoint(category, event) => {
            section == "tracepoint" || section == format!("tracepoint/{category}/{event}")
        }
        Hook::Kprobe(_) => section == "kprobe" || section == "kretprobe",
    }
}

/// The names of `wanted` whose symbol is absent or not what `fits` expects.
fn missing(wanted: &[&'static str], fits: impl Fn(&str, SymbolKind) -> bool) -> Vec<&'static str> {
    let symbols = symbols();
    wanted
        .iter()
        .copied()
        .filter(|name| !symbols.get(*name).is_some_and(|(section, kind)| fits(section, *kind)))
        .collect()
}

#[test]
fn every_map_userspace_reads_is_in_the_object() {
    let missing = missing(USERSPACE_MAPS, |section, _| section == "maps" || section == ".maps");
    assert!(missing.is_empty(), "maps userspace takes but the object lacks: {missing:?}");
}

#[test]
fn every_global_userspace_sets_is_in_the_object() {
    let missing = missing(USERSPACE_GLOBALS, |_, kind| kind == SymbolKind::Data);
    assert!(missing.is_empty(), "load-time globals userspace sets but the object lacks: {missing:?}");
}

#[test]
fn every_program_userspace_attaches_is_in_the_object_in_its_section() {
    let symbols = symbols();
    let mut wrong = Vec::new();
    for probe in table::PROBES.iter().copied().chain(table::hardware_probes()) {
        for (program, hook) in probe.programs.into_iter().flatten() {
            match symbols.get(program) {
                Some((section, SymbolKind::Text)) if section_fits(hook, section) => {}
                other => wrong.push(format!("{program} ({hook:?}): {other:?}")),
            }
        }
    }
    let slots = (0..observer_common::gpu::MAX_GPU_SLOTS)
        .filter_map(super::gpu_slots::slot_programs)
        .flat_map(|(enter, exit)| [enter, exit]);
    for program in
        [ENTER_PROGRAM, EXIT_PROGRAM, COUNT_PROGRAM].into_iter().chain(slots).chain(LOADER_PROGRAMS)
    {
        if !matches!(symbols.get(program), Some((s, SymbolKind::Text)) if s == "uprobe" || s == "uretprobe") {
            wrong.push(format!("{program}: not a uprobe program in the object"));
        }
    }
    for (program, section) in [
        (super::http::INGRESS_PROGRAM, "cgroup_skb/ingress"),
        (super::http::EGRESS_PROGRAM, "cgroup_skb/egress"),
    ] {
        if !matches!(symbols.get(program), Some((s, SymbolKind::Text)) if s == section) {
            wrong.push(format!("{program}: not in {section}"));
        }
    }
    assert!(wrong.is_empty(), "programs userspace attaches that the object lacks or misplaces: {wrong:?}");
}

#[test]
fn every_program_in_the_object_is_attached_by_userspace() {
    // The other direction: a program renamed in the kernel code only would
    // otherwise sit in the object, never attached.
    let slots = (0..observer_common::gpu::MAX_GPU_SLOTS)
        .filter_map(super::gpu_slots::slot_programs)
        .flat_map(|(enter, exit)| [enter, exit]);
    let http = [super::http::INGRESS_PROGRAM, super::http::EGRESS_PROGRAM];
    let attached: BTreeSet<&str> = table::program_names()
        .chain([ENTER_PROGRAM, EXIT_PROGRAM, COUNT_PROGRAM])
        .chain(slots)
        .chain(http)
        .chain(LOADER_PROGRAMS)
        .collect();
    let in_object: Vec<String> = symbols()
        .into_iter()
        .filter(|(_, (section, kind))| *kind == SymbolKind::Text && section != ".text")
        .map(|(name, _)| name)
        .filter(|name| !attached.contains(name.as_str()))
        .collect();
    assert!(in_object.is_empty(), "programs in the object that nothing attaches: {in_object:?}");
}
