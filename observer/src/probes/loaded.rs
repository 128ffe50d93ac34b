//! The loaded eBPF object and typed handles on every map userspace reads,
//! taken once at load: a map missing from the object is a load error that
//! names it, never an empty result later.
use aya::{
    maps::{HashMap as BpfHashMap, Map, MapData, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{ProgramError, UProbe},
    Ebpf,
};
use observer_common::{
    discovery::{
        pod_path_key, GpuFileKey, GPU_FILES_KNOWN_MAP, HELD_MAP, HOLD_CGROUPS_MAP, HOT_CGROUPS_MAP,
        HOT_TGIDS_MAP, KNOWN_DRIVER, POD_PARENTS_MAP, POD_PATHS_MAP, POD_PATH_LEN, UNCLASSIFIED_PODS_MAP,
    },
    gpu::{
        DriverVersion, GpuStats, GpuStatsKey, InflightKey, InflightStack, DRIVER_VERSIONS_MAP, INFLIGHT_MAP,
        STATS_MAP,
    },
    kfd::{KfdStats, KfdStatsKey, KFD_STATS_MAP},
    memlimit::{MemLimitKey, MEM_LIMIT_MAP},
    sched::{root_path_key, RunqHistogram, ROOT_PATH_LEN, RUNQ_CGROUPS_MAP, RUNQ_MAP, RUNQ_ROOTS_MAP},
    LatencyHistogram, AGGREGATES_GENERATION_MAP, EVENTS_MAP, LOST_MAP,
};

use super::gpu::{ENTER_PROGRAM, EXIT_PROGRAM};
use observer_common::gpu::COUNT_PROGRAM;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("loading the eBPF object failed: {0} (is this kernel built with BPF and BTF, and are we root?)")]
    Load(#[from] aya::EbpfError),
    #[error("eBPF map {0} is missing from the object")]
    MissingMap(&'static str),
    #[error("eBPF map {name}: {source}")]
    Map { name: &'static str, source: aya::maps::MapError },
}

type Aggregate<K> = PerCpuHashMap<MapData, K, LatencyHistogram>;

/// The object and its maps. Programs stay in the object; attaching them is
/// the probe table's and the GPU tracker's business.
pub struct Loaded {
    ebpf: Ebpf,
    ring: Option<RingBuf<MapData>>,
    held: Option<Map>,
    lost: PerCpuArray<MapData, u64>,
    aggregates_generation: PerCpuArray<MapData, u64>,
    gpu_stats: Aggregate<GpuStatsKey>,
    kfd_stats: Aggregate<KfdStatsKey>,
    runq: Aggregate<u64>,
    runq_cgroups: BpfHashMap<MapData, u64, u8>,
    runq_roots: BpfHashMap<MapData, [u8; ROOT_PATH_LEN], u8>,
    mem_limits: PerCpuHashMap<MapData, MemLimitKey, u64>,
    inflight: BpfHashMap<MapData, InflightKey, InflightStack>,
    driver_versions: BpfHashMap<MapData, u32, DriverVersion>,
    known_files: BpfHashMap<MapData, GpuFileKey, u32>,
    hot_cgroups: BpfHashMap<MapData, u64, u32>,
    hot_tgids: BpfHashMap<MapData, u32, u32>,
    hold_cgroups: BpfHashMap<MapData, u64, u32>,
    pod_paths: BpfHashMap<MapData, [u8; POD_PATH_LEN], u32>,
    pod_parents: BpfHashMap<MapData, u64, u32>,
    unclassified_pods: BpfHashMap<MapData, u64, u64>,
    /// Why the GPU programs could not be loaded, if they could not.
    gpu_unavailable: Option<String>,
    /// The kernel has no attach cookies: GPU functions get slot programs.
    gpu_slots: bool,
    /// The GPU programs loaded for `uprobe_multi` links, until the GPU
    /// probes take them.
    multi_programs: Option<super::uprobe_multi::MultiPrograms>,
}

fn take(ebpf: &mut Ebpf, name: &'static str) -> Result<Map, LoadError> {
    ebpf.take_map(name).ok_or(LoadError::MissingMap(name))
}

fn typed<T: TryFrom<Map, Error = aya::maps::MapError>>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<T, LoadError> {
    T::try_from(take(ebpf, name)?).map_err(|source| LoadError::Map { name, source })
}

impl Loaded {
    pub fn new(mut ebpf: Ebpf) -> Result<Self, LoadError> {
        Ok(Self {
            ring: Some(typed(&mut ebpf, EVENTS_MAP)?),
            held: Some(take(&mut ebpf, HELD_MAP)?),
            lost: typed(&mut ebpf, LOST_MAP)?,
            aggregates_generation: typed(&mut ebpf, AGGREGATES_GENERATION_MAP)?,
            gpu_stats: typed(&mut ebpf, STATS_MAP)?,
            kfd_stats: typed(&mut ebpf, KFD_STATS_MAP)?,
            runq: typed(&mut ebpf, RUNQ_MAP)?,
            runq_cgroups: typed(&mut ebpf, RUNQ_CGROUPS_MAP)?,
            runq_roots: typed(&mut ebpf, RUNQ_ROOTS_MAP)?,
            mem_limits: typed(&mut ebpf, MEM_LIMIT_MAP)?,
            inflight: typed(&mut ebpf, INFLIGHT_MAP)?,
            driver_versions: typed(&mut ebpf, DRIVER_VERSIONS_MAP)?,
            known_files: typed(&mut ebpf, GPU_FILES_KNOWN_MAP)?,
            hot_cgroups: typed(&mut ebpf, HOT_CGROUPS_MAP)?,
            hot_tgids: typed(&mut ebpf, HOT_TGIDS_MAP)?,
            hold_cgroups: typed(&mut ebpf, HOLD_CGROUPS_MAP)?,
            pod_paths: typed(&mut ebpf, POD_PATHS_MAP)?,
            pod_parents: typed(&mut ebpf, POD_PARENTS_MAP)?,
            unclassified_pods: typed(&mut ebpf, UNCLASSIFIED_PODS_MAP)?,
            gpu_unavailable: None,
            gpu_slots: false,
            multi_programs: None,
            ebpf,
        })
    }

    /// The programs, for attaching.
    pub fn object_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    /// The events ring buffer, handed to the reader once.
    pub fn take_ring(&mut self) -> Option<RingBuf<MapData>> {
        self.ring.take()
    }

    /// The held-process map, handed to the hold once. Whoever takes it
    /// keeps it open for as long as the programs may still be loaded.
    pub fn take_held_map(&mut self) -> Option<Map> {
        self.held.take()
    }

    /// Records why the GPU programs are not loaded: every library file is
    /// then reported unprobed with this reason.
    pub fn set_gpu_unavailable(&mut self, why: String) {
        self.gpu_unavailable = Some(why);
    }

    pub fn gpu_unavailable(&self) -> Option<&str> {
        self.gpu_unavailable.as_deref()
    }

    /// GPU functions are probed through slot programs (no attach cookies).
    pub fn use_gpu_slots(&mut self) {
        self.gpu_slots = true;
    }

    pub fn gpu_slots(&self) -> bool {
        self.gpu_slots
    }

    pub fn set_multi_programs(&mut self, programs: super::uprobe_multi::MultiPrograms) {
        self.multi_programs = Some(programs);
    }

    /// The programs for `uprobe_multi` links, handed to the GPU probes once.
    pub fn take_multi_programs(&mut self) -> Option<super::uprobe_multi::MultiPrograms> {
        self.multi_programs.take()
    }

    /// Loads the GPU uprobe programs (the pair and the counting return);
    /// attaching comes per library.
    pub fn load_gpu_programs(&mut self) -> Result<(), ProgramError> {
        for name in [ENTER_PROGRAM, EXIT_PROGRAM, COUNT_PROGRAM] {
            let program: &mut UProbe =
                self.ebpf.program_mut(name).ok_or(ProgramError::UnexpectedProgramType)?.try_into()?;
            program.load()?;
        }
        Ok(())
    }

    /// Events the kernel side dropped because the ring buffer was full.
    pub fn events_lost(&self) -> u64 {
        self.lost.get(&0, 0).map(|values| values.iter().sum()).unwrap_or(0)
    }

    /// Moves whenever a GPU, KFD or run-queue aggregate was updated; read
    /// it before the aggregates.
    pub fn aggregates_generation(&self) -> u64 {
        self.aggregates_generation.get(&0, 0).map(|values| values.iter().sum()).unwrap_or(0)
    }

    /// GPU call aggregates, summed over CPUs.
    pub fn gpu_stats(&self) -> Vec<(GpuStatsKey, GpuStats)> {
        sum_per_cpu(&self.gpu_stats)
    }

    /// The driver version process `pid`'s latest version call returned.
    pub fn driver_version(&self, pid: u32) -> Option<DriverVersion> {
        self.driver_versions.get(&pid, 0).ok()
    }

    /// Every process's latest reported driver version, by pid.
    pub fn driver_versions(&self) -> Vec<(u32, DriverVersion)> {
        self.driver_versions.iter().filter_map(Result::ok).collect()
    }

    /// KFD ioctl aggregates, summed over CPUs.
    pub fn kfd_stats(&self) -> Vec<(KfdStatsKey, KfdStats)> {
        sum_per_cpu(&self.kfd_stats)
    }

    /// Run-queue latency histograms per cgroup, summed over CPUs.
    pub fn runq_stats(&self) -> Vec<(u64, RunqHistogram)> {
        sum_per_cpu(&self.runq)
    }

    /// Puts a cgroup into the set whose tasks get run-queue accounting;
    /// whether it was added (a full set is logged: its tasks go uncounted).
    pub fn report_runq_cgroup(&mut self, cgroup_id: u64) -> bool {
        if self.runq_cgroup_reported(cgroup_id) {
            return false;
        }
        match self.runq_cgroups.insert(cgroup_id, 1, 0) {
            Ok(()) => true,
            Err(e) => {
                log::warn!("{RUNQ_CGROUPS_MAP}: cgroup {cgroup_id} not reported: {e}");
                false
            }
        }
    }

    /// Names a root whose creation the kernel reports on its own; false
    /// where it cannot (a path too long for the key, a full map).
    pub fn report_runq_root(&mut self, path: &str) -> bool {
        let Some(key) = root_path_key(path) else { return false };
        match self.runq_roots.insert(key, 1, 0) {
            Ok(()) => true,
            Err(e) => {
                log::warn!("{RUNQ_ROOTS_MAP}: {path}: {e}");
                false
            }
        }
    }

    pub fn runq_cgroup_reported(&self, cgroup_id: u64) -> bool {
        self.runq_cgroups.get(&cgroup_id, 0).is_ok()
    }

    /// Memory-limit refusals per cgroup and limit, summed over CPUs.
    pub fn mem_limit_refusals(&self) -> Vec<(MemLimitKey, u64)> {
        self.mem_limits.iter().flatten().map(|(k, per_cpu)| (k, per_cpu.iter().sum())).collect()
    }

    /// Removes the aggregates of cgroups that are gone, so the maps return
    /// to their baseline under pod churn.
    pub fn purge_cgroups(&mut self, cgroups: &[u64]) {
        remove_keys(&mut self.gpu_stats, |k| cgroups.contains(&k.cgroup_id));
        remove_keys(&mut self.kfd_stats, |k| cgroups.contains(&k.cgroup_id));
        remove_keys(&mut self.runq, |k| cgroups.contains(k));
        let keys: Vec<MemLimitKey> =
            self.mem_limits.keys().flatten().filter(|k| cgroups.contains(&k.cgroup_id)).collect();
        for key in keys {
            let _ = self.mem_limits.remove(&key);
        }
        let pids: Vec<u32> = self
            .driver_versions
            .iter()
            .flatten()
            .filter(|(_, v)| cgroups.contains(&v.cgroup_id))
            .map(|(pid, _)| pid)
            .collect();
        for pid in pids {
            let _ = self.driver_versions.remove(&pid);
        }
    }

    /// Threads with GPU calls recorded in flight (depth 0 between calls).
    pub fn inflight(&self) -> Vec<(InflightKey, InflightStack)> {
        self.inflight.iter().flatten().collect()
    }

    /// Forgets the in-flight entry of a thread that exited.
    pub fn forget_inflight(&mut self, key: &InflightKey) {
        let _ = self.inflight.remove(key);
    }

    /// Tells the kernel side that this file is handled, so mapping it
    /// neither raises an event nor holds a process.
    pub fn mark_known(&mut self, key: GpuFileKey) {
        self.mark_handled(key, 1);
    }

    /// Marks a CUDA driver library handled, with each process's mapping of
    /// it still reported ([`KNOWN_DRIVER`]).
    pub fn mark_known_driver(&mut self, key: GpuFileKey) {
        self.mark_handled(key, KNOWN_DRIVER);
    }

    fn mark_handled(&mut self, key: GpuFileKey, value: u32) {
        // A full map only costs a report (or hold) per mapping of a later file.
        if let Err(e) = self.known_files.insert(key, value, 0) {
            log::debug!("{GPU_FILES_KNOWN_MAP}: {e}");
        }
    }

    /// Tells the kernel side whether processes of a cgroup are selected for
    /// hot-call probes, so their mappings of GPU runtime files are reported.
    pub fn set_hot_cgroup(&mut self, cgroup_id: u64, selected: bool) {
        // A full map costs the selected process only the head start: its
        // probes then come from the map scan after its loader is done.
        if let Err(e) = set_member(&mut self.hot_cgroups, cgroup_id, selected) {
            log::debug!("{HOT_CGROUPS_MAP}: {e}");
        }
    }

    /// The same for one process.
    pub fn set_hot_tgid(&mut self, pid: u32, selected: bool) {
        if let Err(e) = set_member(&mut self.hot_tgids, pid, selected) {
            log::debug!("{HOT_TGIDS_MAP}: {e}");
        }
    }

    /// Tells the kernel side whether processes of a cgroup, and of the
    /// cgroups below it, are held at their first mapping of a GPU runtime
    /// file it has not seen (a gated pod's, see `discovery::hold_scope`).
    pub fn set_hold_cgroup(&mut self, cgroup_id: u64, held: bool) {
        // A full map costs that pod the hold: its start-up may then race
        // the attach, as without the gate.
        // Letting go of a cgroup the kernel already dropped at its removal
        // is no failure.
        if let (Err(e), true) = (set_member(&mut self.hold_cgroups, cgroup_id, held), held) {
            log::warn!("{HOLD_CGROUPS_MAP}: {e}");
        }
    }

    /// Writes what the kernel does with a cgroup made at `path` (one of the
    /// `POD_PATH_*` kinds), or with `None` forgets the path. False when the
    /// path is too long or the map is full: that pod is then found by the
    /// daemon's look at the hierarchy only.
    pub fn set_pod_path(&mut self, path: &str, kind: Option<u32>) -> bool {
        let Some(key) = pod_path_key(path) else { return false };
        let result = match kind {
            Some(kind) => self.pod_paths.insert(key, kind, 0),
            None => self.pod_paths.remove(&key),
        };
        match result {
            Ok(()) => true,
            // Forgetting a path the kernel never had is no failure.
            Err(_) if kind.is_none() => true,
            Err(e) => {
                log::warn!("{POD_PATHS_MAP}: {path}: {e}");
                false
            }
        }
    }

    /// Puts a kubelet QoS-level cgroup into the kernel's set of pod parents.
    pub fn set_pod_parent(&mut self, cgroup_id: u64) {
        if let Err(e) = set_member(&mut self.pod_parents, cgroup_id, true) {
            log::warn!("{POD_PARENTS_MAP}: {e}");
        }
    }

    /// The daemon has classified the pod of this cgroup: it is held only if
    /// it is in the held set.
    pub fn set_pod_classified(&mut self, cgroup_id: u64) {
        let _ = self.unclassified_pods.remove(&cgroup_id);
    }

    /// The reverse, for a file whose probes were removed.
    pub fn forget_known(&mut self, key: GpuFileKey) {
        let _ = self.known_files.remove(&key);
    }
}

fn sum_per_cpu<K: aya::Pod>(map: &Aggregate<K>) -> Vec<(K, LatencyHistogram)> {
    map.iter()
        .flatten()
        .map(|(k, per_cpu)| {
            let mut total = LatencyHistogram::default();
            for v in per_cpu.iter() {
                total.add(v);
            }
            (k, total)
        })
        .collect()
}

fn remove_keys<K: aya::Pod>(map: &mut Aggregate<K>, doomed: impl Fn(&K) -> bool) {
    let keys: Vec<K> = map.keys().flatten().filter(|k| doomed(k)).collect();
    for key in keys {
        let _ = map.remove(&key);
    }
}

/// Puts `key` into a kernel-side set (a hash map to 1) or takes it out.
fn set_member<K: aya::Pod>(
    set: &mut BpfHashMap<MapData, K, u32>,
    key: K,
    member: bool,
) -> Result<(), aya::maps::MapError> {
    match member {
        true => set.insert(key, 1, 0),
        false => set.remove(&key),
    }
}
