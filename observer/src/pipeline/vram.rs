//! VRAM per pod, and the VRAM a dead process leaves behind.
//!
//! Each second KFD's process table gives what every process holds per GPU
//! (`attribution::vram_procs`), and sysfs what each GPU holds in all
//! (`attribution::vram_gpus`). Per GPU:
//!
//! - **excess** = used memory − the VRAM of the live processes (alive and
//!   not zombies; this daemon's own entry counts as live).
//! - **baseline**: the excess while no process that held VRAM on the GPU
//!   has left it within the settle time. With no KFD process it is what
//!   other clients and the driver itself hold; with processes it also holds
//!   their page tables and queues, which `vram_<gpu_id>` does not count.
//!   While quiet it follows the median of the last ten seconds' excess; a
//!   departure freezes it until the departure settles. Memory stranded
//!   before the daemon started is part of it.
//! - **settle time** ([`SETTLE`]): KFD frees a dead process's buffers from
//!   a work item after its address space went, and removes its directory
//!   first; the excess rises at the exit and falls as the memory is freed.
//! - **threshold** ([`THRESHOLD`]): less left behind is noise (rounding,
//!   page tables, a sample taken between an allocation and its count).
//!
//! A departure settles [`SETTLE`] after it was seen. What the excess still
//! holds above baseline and what is already counted as stranded (the median
//! of the last three seconds' samples) is stranded, at most what the
//! departed processes held. It goes to the processes that died abnormally
//! first (an `Exit` event: a crash, an OOM kill, a fatal signal), each at
//! most what it held, then to no one. A drop of the excess while quiet
//! takes back stranded memory first (a GPU reset frees it).
use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    time::{Duration, Instant},
};

use crate::{
    attribution::{
        vram_gpus::{self, Gpu, KfdPaths, Vram},
        vram_procs::Listed,
    },
    events::Origin,
    exit_cause::Cause,
};

/// How long KFD may take to free a dead process's VRAM. Its release work
/// waits for the process's queues to be taken off the GPU (and for a GPU
/// reset in progress), then frees buffer after buffer: seconds for a large
/// process on a busy GPU. Short beside a canary analysis's minutes.
pub const SETTLE: Duration = Duration::from_secs(30);
/// Less than this left on a GPU is not stranded: above the page tables a
/// process's allocations need and the 5.10/6.1 counting differences.
pub const THRESHOLD: u64 = 64 << 20;
/// While quiet, the baseline follows the median of this long's samples.
const QUIET_WINDOW: Duration = Duration::from_secs(10);
/// A departure settles at the median of this long's samples.
const LEVEL_WINDOW: Duration = Duration::from_millis(2500);
/// Departures that keep overlapping (a busy node) are settled anyway once
/// the first is this old, so that the baseline is not frozen for good.
const MAX_PENDING: Duration = Duration::from_secs(120);
/// Samples kept per GPU: the longer of the two windows.
const KEEP: Duration = QUIET_WINDOW;
/// How long an abnormal death waits for its departure to be settled.
const DEATH_MEMORY: Duration = Duration::from_secs(300);
/// How often KFD's topology is read again (GPUs come and go rarely).
const TOPOLOGY_EVERY: Duration = Duration::from_secs(60);

/// A process that left a GPU it held VRAM on.
#[derive(Clone, Debug, PartialEq)]
struct Departure {
    pid: u32,
    held: u64,
    cgroup: Option<String>,
    since: Instant,
}

/// One GPU's baseline, stranded memory and departures not yet settled.
#[derive(Default)]
struct Ledger {
    baseline: Option<i64>,
    stranded: u64,
    samples: VecDeque<(Instant, i64)>,
    pending: Vec<Departure>,
}

/// The median excess of the samples taken within `window` before `now`.
fn level(samples: &VecDeque<(Instant, i64)>, now: Instant, window: Duration) -> Option<i64> {
    let mut recent: Vec<i64> = samples
        .iter()
        .filter(|(t, _)| now.saturating_duration_since(*t) <= window)
        .map(|(_, e)| *e)
        .collect();
    recent.sort_unstable();
    recent.get(recent.len() / 2).copied()
}

impl Ledger {
    /// Takes one excess sample; returns the departures that settled with
    /// it and what they left stranded (0: nothing above the threshold).
    fn sample(&mut self, now: Instant, excess: i64) -> Option<(Vec<Departure>, u64)> {
        self.samples.push_back((now, excess));
        while self.samples.front().is_some_and(|(t, _)| now.saturating_duration_since(*t) > KEEP) {
            self.samples.pop_front();
        }
        if self.pending.is_empty() {
            self.follow(now);
            return None;
        }
        let age = |d: &Departure| now.saturating_duration_since(d.since);
        let all_settled = self.pending.iter().all(|d| age(d) >= SETTLE);
        if !all_settled && !self.pending.iter().any(|d| age(d) >= MAX_PENDING) {
            return None;
        }
        let (settled, rest): (Vec<Departure>, Vec<Departure>) =
            std::mem::take(&mut self.pending).into_iter().partition(|d| age(d) >= SETTLE);
        self.pending = rest;
        let level = level(&self.samples, now, LEVEL_WINDOW).unwrap_or(excess);
        let baseline = self.baseline.unwrap_or(level);
        let held: u64 = settled.iter().map(|d| d.held).sum();
        let above = level.saturating_sub(baseline).saturating_sub(self.stranded as i64);
        let left = (above.max(0) as u64).min(held);
        if left < THRESHOLD {
            return Some((settled, 0));
        }
        self.stranded += left;
        Some((settled, left))
    }

    /// While quiet: a rise is the baseline's; a drop takes back stranded
    /// memory first, then lowers the baseline.
    fn follow(&mut self, now: Instant) {
        let Some(level) = level(&self.samples, now, QUIET_WINDOW) else { return };
        let stranded = self.stranded as i64;
        let baseline = *self.baseline.get_or_insert(level - stranded);
        if level < baseline + stranded {
            let freed = (baseline + stranded - level).min(stranded);
            self.stranded -= freed as u64;
        }
        self.baseline = Some(level - self.stranded as i64);
    }
}

/// An abnormal death of a process KFD listed, from its `Exit` event.
struct Death {
    cause: Cause,
    origin: Origin,
    at: Instant,
    /// Whether its departure was noted: from then on its pid may be a new
    /// process's.
    departed: bool,
}

/// A live process's last reading, to know what it held when it is gone.
struct Holder {
    cgroup: Option<String>,
    vram: Vram,
}

/// VRAM left on a GPU past the settle time, and whom it is put on.
#[derive(Clone, Debug, PartialEq)]
pub struct Stranding {
    pub gpu: u32,
    pub bytes: u64,
    /// What the process held on that GPU at its last reading.
    pub held: u64,
    pub pid: u32,
    /// The process's cgroup path, as read while it was alive.
    pub cgroup: Option<String>,
    /// Its abnormal death; `None` when it left without one (then the bytes
    /// are put on no one).
    pub death: Option<(Cause, Origin)>,
}

/// VRAM per pod and stranded VRAM, from one reading a second.
pub struct VramWatch {
    paths: KfdPaths,
    gpus: Vec<Gpu>,
    gpus_read: Option<Instant>,
    ledgers: BTreeMap<u32, Ledger>,
    holders: HashMap<u32, Holder>,
    deaths: HashMap<u32, Death>,
    by_cgroup: BTreeMap<(String, u32), u64>,
    strandings: Vec<Stranding>,
}

impl VramWatch {
    pub fn new(paths: KfdPaths) -> Self {
        Self {
            paths,
            gpus: Vec::new(),
            gpus_read: None,
            ledgers: BTreeMap::new(),
            holders: HashMap::new(),
            deaths: HashMap::new(),
            by_cgroup: BTreeMap::new(),
            strandings: Vec::new(),
        }
    }

    /// An abnormal death of a process KFD listed, with what it held as read
    /// at its exit (fresher than the last second's reading).
    pub fn note_death(&mut self, pid: u32, vram: &Vram, cause: Cause, origin: Origin, now: Instant) {
        match self.holders.get_mut(&pid) {
            // What it holds at its death is what it can leave behind: none
            // when it freed its memory itself.
            Some(holder) => holder.vram.clone_from(vram),
            // Allocated since the last reading (or never read).
            None if vram.iter().any(|(_, b)| *b > 0) => {
                self.holders.insert(pid, Holder { cgroup: origin.cgroup.clone(), vram: vram.clone() });
            }
            None => {}
        }
        self.deaths.insert(pid, Death { cause, origin, at: now, departed: false });
    }

    /// One reading of KFD's table (`listed`) and of the GPUs' used memory.
    pub fn sample(&mut self, listed: &[Listed], now: Instant) {
        if self.gpus_read.is_none_or(|t| now.saturating_duration_since(t) >= TOPOLOGY_EVERY) {
            self.gpus = vram_gpus::gpus(&self.paths);
            self.gpus_read = Some(now);
            let known: Vec<u32> =
                self.gpus.iter().filter(|g| g.used.path().is_some()).map(|g| g.gpu_id).collect();
            self.ledgers.retain(|gpu, _| known.contains(gpu));
            for gpu in known {
                self.ledgers.entry(gpu).or_default();
            }
        }
        // A process whose exit event came is dead, whatever procfs says yet.
        let dying = |pid: &u32| self.deaths.get(pid).is_some_and(|d| !d.departed);
        let live: Vec<&Listed> = listed.iter().filter(|l| l.alive && !dying(&l.pid)).collect();
        let mut live_sum: BTreeMap<u32, u64> = BTreeMap::new();
        self.by_cgroup.clear();
        for l in &live {
            for (gpu, bytes) in l.vram {
                *live_sum.entry(*gpu).or_default() += bytes;
                if let (false, Some(cgroup)) = (l.own, l.cgroup) {
                    *self.by_cgroup.entry((cgroup.to_string(), *gpu)).or_default() += bytes;
                }
            }
        }
        self.note_departures(&live, now);
        // Used memory after the processes' VRAM: an allocation between the
        // two reads shows as a rise for one sample, which the medians drop.
        for gpu in &self.gpus {
            let (Some(ledger), Some(used)) = (self.ledgers.get_mut(&gpu.gpu_id), vram_gpus::read_used(gpu))
            else {
                continue;
            };
            let excess = used as i64 - live_sum.get(&gpu.gpu_id).copied().unwrap_or(0) as i64;
            if let Some((settled, bytes)) = ledger.sample(now, excess) {
                share(&mut self.strandings, &self.deaths, gpu.gpu_id, settled, bytes);
            }
        }
        self.deaths.retain(|_, d| now.saturating_duration_since(d.at) < DEATH_MEMORY);
    }

    /// Holders of the last reading that are not alive now left their GPUs
    /// (one that is alive but holds nothing now freed its memory itself).
    fn note_departures(&mut self, live: &[&Listed], now: Instant) {
        let holders: HashMap<u32, Holder> = live
            .iter()
            .filter(|l| !l.own && l.vram.iter().any(|(_, b)| *b > 0))
            .map(|l| (l.pid, Holder { cgroup: l.cgroup.map(str::to_string), vram: l.vram.to_vec() }))
            .collect();
        for (pid, old) in std::mem::take(&mut self.holders) {
            if live.iter().any(|l| l.pid == pid) {
                continue;
            }
            if let Some(death) = self.deaths.get_mut(&pid) {
                death.departed = true;
            }
            for (gpu, held) in old.vram.iter().filter(|(_, b)| *b > 0) {
                if let Some(ledger) = self.ledgers.get_mut(gpu) {
                    ledger.pending.push(Departure {
                        pid,
                        held: *held,
                        cgroup: old.cgroup.clone(),
                        since: now,
                    });
                }
            }
        }
        self.holders = holders;
    }

    /// Strandings found since the last call.
    pub fn take_strandings(&mut self) -> Vec<Stranding> {
        std::mem::take(&mut self.strandings)
    }

    /// VRAM per (cgroup path, GPU) of the live processes, this daemon's
    /// own left out.
    pub fn by_cgroup(&self) -> impl Iterator<Item = (&str, u32, u64)> {
        self.by_cgroup.iter().map(|((c, g), b)| (c.as_str(), *g, *b))
    }

    /// Stranded VRAM per GPU whose used memory is read.
    pub fn stranded(&self) -> Vec<(u32, u64)> {
        self.ledgers.iter().map(|(gpu, l)| (*gpu, l.stranded)).collect()
    }
}

/// Puts `bytes` stranded on `gpu` on the settled departures: abnormal
/// deaths first, each at most what it held, the rest on no one.
fn share(
    out: &mut Vec<Stranding>,
    deaths: &HashMap<u32, Death>,
    gpu: u32,
    mut settled: Vec<Departure>,
    bytes: u64,
) {
    if bytes == 0 {
        return;
    }
    settled.sort_by_key(|d| (!deaths.contains_key(&d.pid), d.since, d.pid));
    let mut left = bytes;
    for d in settled {
        let part = d.held.min(left);
        if part == 0 {
            break;
        }
        left -= part;
        let death = deaths.get(&d.pid).map(|death| (death.cause, death.origin.clone()));
        out.push(Stranding { gpu, bytes: part, held: d.held, pid: d.pid, cgroup: d.cgroup, death });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::{kfd_tree::Tree, vram_procs::KfdProcesses};

    const GPU: u32 = 48879;
    const MINOR: u32 = 128;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    /// What the driver and other clients hold on the GPU.
    const DRIVER: u64 = 300 * MIB;
    /// A process's page tables: used memory its vram_ file does not count.
    const TABLES: u64 = 6 * MIB;
    const POD: &str = "/kubepods.slice/kubepods-pod1234.slice/cri-containerd-abc.scope";
    const DAEMON: u32 = 7;

    /// A node with one GPU whose used memory amdgpu reports, and a clock
    /// that advances a second per reading.
    struct Node {
        tree: Tree,
        table: KfdProcesses,
        watch: VramWatch,
        t0: Instant,
        secs: u64,
    }

    impl Node {
        fn new(tag: &str) -> Self {
            let tree = Tree::new(tag);
            tree.cpu_node(0);
            tree.gpu_node(1, GPU, MINOR);
            tree.amdgpu_used(MINOR, DRIVER);
            let table = tree.table().with_own_pid(DAEMON);
            let watch = VramWatch::new(tree.paths());
            Self { tree, table, watch, t0: Instant::now(), secs: 0 }
        }

        fn used(&self, bytes: u64) {
            self.tree.amdgpu_used(MINOR, bytes);
        }

        /// A process of `cgroup` holding `bytes` on the GPU.
        fn start(&self, pid: u32, cgroup: &str, bytes: u64) {
            self.tree.process(pid, pid + 32768, cgroup);
            self.tree.vram(pid, GPU, bytes);
        }

        /// `n` readings a second apart; the strandings they found.
        fn run(&mut self, n: u64) -> Vec<Stranding> {
            let mut found = Vec::new();
            for _ in 0..n {
                self.secs += 1;
                self.table.refresh();
                self.watch.sample(&self.table.listed(), self.t0 + Duration::from_secs(self.secs));
                found.extend(self.watch.take_strandings());
            }
            found
        }

        /// The process died of `signal`: a zombie whose exit event came,
        /// with what KFD still shows of it then.
        fn dies(&mut self, pid: u32, cause: Cause) {
            self.tree.zombie(pid);
            let vram = self.table.vram_at_exit(pid).expect("KFD listed it");
            let origin =
                Origin { pid, tid: pid, cgroup_id: 77, cgroup: Some(POD.into()), ..Origin::default() };
            let now = self.t0 + Duration::from_secs(self.secs);
            self.watch.note_death(pid, &vram, cause, origin, now);
        }

        fn stranded(&self) -> u64 {
            self.watch.stranded().iter().find(|(g, _)| *g == GPU).map(|(_, b)| *b).expect("the GPU's ledger")
        }
    }

    #[test]
    fn vram_is_summed_per_container_and_gpu_over_live_processes() {
        let mut node = Node::new("vram-sums");
        let other = "/kubepods.slice/kubepods-pod1234.slice/cri-containerd-def.scope";
        node.start(100, POD, GIB);
        node.tree.vram(100, 1234, 0);
        node.start(101, POD, 512 * MIB);
        node.start(102, other, 0);
        node.tree.vram(102, 1234, 2 * GIB);
        node.start(103, POD, 8 * GIB);
        node.tree.zombie(103);
        node.start(DAEMON, "/system.slice/canaryscope.service", 4096);
        node.run(1);
        let sums: Vec<(&str, u32, u64)> = node.watch.by_cgroup().collect();
        assert_eq!(
            sums,
            vec![(POD, 1234, 0), (POD, GPU, 1536 * MIB), (other, 1234, 2 * GIB), (other, GPU, 0)]
        );
    }

    #[test]
    fn a_crash_whose_memory_stays_past_the_settle_time_is_put_on_its_pod() {
        let mut node = Node::new("vram-segv");
        node.start(100, POD, 2 * GIB);
        node.used(DRIVER + 2 * GIB + TABLES);
        assert!(node.run(15).is_empty());
        node.dies(100, Cause::Fault);
        assert!(node.run(1).is_empty());
        // KFD removes the directory; the memory stays.
        node.tree.exit(100);
        assert!(node.run(SETTLE.as_secs() - 2).is_empty(), "not before the settle time");
        let found = node.run(2);
        assert_eq!(found.len(), 1, "{found:#?}");
        let s = &found[0];
        assert_eq!((s.gpu, s.pid, s.held), (GPU, 100, 2 * GIB));
        // At most what it held: its page tables' megabytes are not its.
        assert_eq!(s.bytes, 2 * GIB);
        let (cause, origin) = s.death.clone().expect("its abnormal death");
        assert_eq!((cause, origin.cgroup.as_deref()), (Cause::Fault, Some(POD)));
        assert_eq!(node.stranded(), 2 * GIB);
        assert!(node.run(60).is_empty(), "one death counts once");
        assert_eq!(node.stranded(), 2 * GIB, "still held");
        // A GPU reset frees it: the node's figure follows.
        node.used(DRIVER);
        node.run(QUIET_WINDOW.as_secs() + 1);
        assert_eq!(node.stranded(), 0);
    }

    #[test]
    fn a_clean_exit_whose_memory_is_freed_strands_nothing() {
        let mut node = Node::new("vram-clean");
        node.start(100, POD, 2 * GIB);
        node.used(DRIVER + 2 * GIB + TABLES);
        node.run(15);
        node.tree.exit(100);
        node.run(2);
        node.used(DRIVER);
        assert!(node.run(SETTLE.as_secs() + 10).is_empty());
        assert_eq!(node.stranded(), 0);
    }

    #[test]
    fn memory_released_late_within_the_settle_time_is_not_stranded() {
        let mut node = Node::new("vram-late");
        node.start(100, POD, 2 * GIB);
        node.used(DRIVER + 2 * GIB + TABLES);
        node.run(15);
        node.dies(100, Cause::Sent);
        node.tree.exit(100);
        assert!(node.run(SETTLE.as_secs() - 8).is_empty());
        node.used(DRIVER);
        assert!(node.run(20).is_empty());
        assert_eq!(node.stranded(), 0);
    }

    #[test]
    fn memory_a_clean_exit_leaves_is_stranded_but_put_on_no_one() {
        let mut node = Node::new("vram-unattributed");
        node.start(100, POD, GIB);
        node.start(101, POD, GIB);
        node.used(DRIVER + 2 * GIB);
        node.run(15);
        node.tree.exit(100);
        let found = node.run(SETTLE.as_secs() + 1);
        assert_eq!(found.len(), 1, "{found:#?}");
        assert_eq!((found[0].bytes, found[0].pid, found[0].death.is_none()), (GIB, 100, true));
        assert_eq!(found[0].cgroup.as_deref(), Some(POD));
    }

    #[test]
    fn of_two_deaths_in_one_settle_window_the_abnormal_one_is_charged_first() {
        let mut node = Node::new("vram-two-deaths");
        node.start(100, POD, GIB);
        node.start(101, POD, GIB);
        node.used(DRIVER + 2 * GIB);
        node.run(15);
        // The clean exit leaves first; the crash a second later. One of
        // the two gigabytes stays.
        node.tree.exit(100);
        node.run(1);
        node.dies(101, Cause::Fault);
        node.tree.exit(101);
        node.used(DRIVER + GIB);
        let found = node.run(SETTLE.as_secs() + 2);
        let charged: Vec<(u32, u64, bool)> =
            found.iter().map(|s| (s.pid, s.bytes, s.death.is_some())).collect();
        assert_eq!(charged, vec![(101, GIB, true)], "the crash, not the earlier clean exit: {found:#?}");
    }

    #[test]
    fn the_daemons_own_entry_is_no_pods_and_its_memory_is_alive() {
        let mut node = Node::new("vram-own");
        node.start(DAEMON, POD, GIB);
        node.start(100, POD, 0);
        node.used(DRIVER + GIB);
        node.run(15);
        let sums: Vec<(&str, u32, u64)> = node.watch.by_cgroup().collect();
        assert_eq!(sums, vec![(POD, GPU, 0)], "the daemon's own VRAM is no pod's");
        node.dies(100, Cause::Fault);
        node.tree.exit(100);
        assert!(node.run(SETTLE.as_secs() + 5).is_empty());
        assert_eq!(node.stranded(), 0, "the daemon's memory has a live owner");
    }

    #[test]
    fn a_death_seen_only_at_its_exit_is_still_settled() {
        let mut node = Node::new("vram-fast");
        node.used(DRIVER);
        node.run(15);
        // Allocated and crashed between two readings.
        node.start(100, POD, GIB);
        node.used(DRIVER + GIB);
        node.dies(100, Cause::Abort);
        node.tree.exit(100);
        let found = node.run(SETTLE.as_secs() + 2);
        assert_eq!(found.iter().map(|s| (s.pid, s.bytes)).collect::<Vec<_>>(), vec![(100, GIB)]);
    }

    #[test]
    fn unreadable_files_leave_out_their_number_only() {
        let mut node = Node::new("vram-bad");
        node.start(100, POD, GIB);
        node.used(DRIVER + GIB);
        node.run(15);
        // Used memory unreadable for a while: those readings are skipped.
        std::fs::write(node.tree.dir.join("drm/renderD128/device/mem_info_vram_used"), "").expect("empty");
        std::fs::write(node.tree.kfd_proc(100).join("vram_48879"), "not a number\n").expect("garbage");
        assert!(node.run(5).is_empty());
        let sums: Vec<(&str, u32, u64)> = node.watch.by_cgroup().collect();
        assert_eq!(sums, vec![(POD, GPU, GIB)], "its last whole reading");
        node.used(DRIVER + GIB);
        // No topology at all (amdgpu unloaded): nothing to read, no panic.
        std::fs::remove_dir_all(node.tree.dir.join("kfd")).expect("rm");
        node.run(TOPOLOGY_EVERY.as_secs() + 1);
        assert!(node.watch.stranded().is_empty());
        assert_eq!(node.watch.by_cgroup().count(), 0);
    }
}
