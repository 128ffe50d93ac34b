//! Series a revision's pods share on a node: successful-call counts and
//! latency histograms, which would otherwise cost every pod hundreds of
//! series while the decision they feed compares revisions, not pods.
//!
//! The kernel counts per cgroup, and a pod's entries go when its cgroup is
//! purged. A revision's series must not go down meanwhile (`rate()` would
//! read that as a reset), so a purged pod's last totals are kept here and
//! added to its revision's series for as long as the revision has a pod on
//! the node.
use std::collections::{BTreeMap, HashMap, HashSet};

use observer_common::{gpu::GpuStatsKey, kfd::KfdStatsKey, LatencyHistogram};

use super::{
    catalog::View,
    context::Render,
    series::{Series, NO_LABELS},
};
use crate::attribution::labels::WorkloadLabels;

/// A revision on this node: namespace, workload, revision, track.
pub type RevisionKey = [String; 4];

/// The revision a cgroup's labels put it in.
pub fn revision_key(labels: &WorkloadLabels) -> RevisionKey {
    let [namespace, _pod, _container, workload, revision, track] = labels.values();
    [namespace, workload, revision, track].map(str::to_string)
}

/// Who a revision-scoped series belongs to, as the six workload label
/// values: scraped, pod and container are left empty, so that the pods of
/// a revision share one key. Copied, not allocated, per kernel entry.
pub type Owner<'a> = [&'a str; 6];

/// The owner of a cgroup's entries in `view`, from its label values.
pub fn owner(values: Owner<'_>, view: View) -> Owner<'_> {
    match view {
        View::PerPod => values,
        View::Scrape => [values[0], "", "", values[3], values[4], values[5]],
    }
}

/// The owner of a purged pod's totals kept for `key`.
pub fn retired_owner(key: &RevisionKey) -> Owner<'_> {
    [&key[0], "", "", &key[1], &key[2], &key[3]]
}

/// The owner's label values in `view`, followed by `extra`, in the order
/// of a revision family's declared label names.
pub fn owner_labels<'a>(owner: &Owner<'a>, view: View, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = match view {
        View::PerPod => owner.to_vec(),
        View::Scrape => vec![owner[0], owner[3], owner[4], owner[5]],
    };
    v.extend_from_slice(extra);
    v
}

/// The last totals of purged pods, by their revision. The kernel keys keep
/// their shape with the cgroup id zeroed.
#[derive(Default)]
pub struct Retired {
    pub gpu: BTreeMap<(RevisionKey, GpuStatsKey), LatencyHistogram>,
    pub kfd: BTreeMap<(RevisionKey, KfdStatsKey), LatencyHistogram>,
    /// Keyed as the live entries are, by cgroup id, here always 0.
    pub runq: BTreeMap<(RevisionKey, u64), LatencyHistogram>,
}

impl Retired {
    /// Adds a purged cgroup's GPU call totals to its revision.
    pub fn fold_gpu<'a>(
        &mut self,
        key: &RevisionKey,
        stats: impl Iterator<Item = &'a (GpuStatsKey, LatencyHistogram)>,
    ) {
        fold(&mut self.gpu, key, stats, |k| GpuStatsKey { cgroup_id: 0, ..*k });
    }

    /// Adds a purged cgroup's KFD ioctl totals to its revision.
    pub fn fold_kfd<'a>(
        &mut self,
        key: &RevisionKey,
        stats: impl Iterator<Item = &'a (KfdStatsKey, LatencyHistogram)>,
    ) {
        fold(&mut self.kfd, key, stats, |k| KfdStatsKey { cgroup_id: 0, ..*k });
    }

    /// Adds a purged cgroup's run-queue histogram to its revision.
    pub fn fold_runq<'a>(
        &mut self,
        key: &RevisionKey,
        runq: impl Iterator<Item = &'a (u64, LatencyHistogram)>,
    ) {
        fold(&mut self.runq, key, runq, |_| 0);
    }

    /// Forgets revisions with no cgroup left on the node: their series end
    /// with their last pod, as a pod's own series do.
    pub fn keep_only(&mut self, live: &HashSet<RevisionKey>) {
        self.gpu.retain(|(k, _), _| live.contains(k));
        self.kfd.retain(|(k, _), _| live.contains(k));
        self.runq.retain(|(k, _), _| live.contains(k));
    }
}

/// The owners of one render's revision-scoped series, by number.
pub struct Owners<'a> {
    list: Vec<Owner<'a>>,
    by_cgroup: HashMap<u64, u32>,
    /// Cgroups whose revision is not known yet (see `Series::revision_held`).
    held: HashSet<u64>,
    /// The owner of entries whose cgroup has no labels.
    empty: u32,
}

impl<'a> Owners<'a> {
    /// Every owner of a revision-scoped series in `view`, numbered in sort
    /// order: the series maps of a render key by that number rather than
    /// by six strings, and iterate in the same order. Comparing owners
    /// whose cgroup paths share a long prefix was most of a render's time
    /// at a thousand pods. Cgroups with one label set share an owner.
    pub fn new(series: &'a Series, retired: &'a Retired, view: View) -> Self {
        let held: HashSet<u64> =
            series.iter().map(|(c, _)| *c).filter(|c| series.revision_held(*c)).collect();
        let live =
            series.iter().filter(|(c, _)| !held.contains(c)).map(|(c, _)| owner(series.labels(*c), view));
        let retired = [retired.gpu.keys().map(|(r, _)| r).collect::<Vec<_>>()]
            .into_iter()
            .chain([retired.kfd.keys().map(|(r, _)| r).collect()])
            .chain([retired.runq.keys().map(|(r, _)| r).collect()])
            .flatten()
            .filter(|_| view == View::Scrape)
            .map(retired_owner);
        let mut list: Vec<Owner> = live.chain(retired).chain([owner(NO_LABELS, view)]).collect();
        list.sort_unstable();
        list.dedup();
        let id = |o: &Owner| list.binary_search(o).unwrap_or(0) as u32;
        let by_cgroup = series.iter().map(|(c, _)| (*c, id(&owner(series.labels(*c), view)))).collect();
        let empty = id(&owner(NO_LABELS, view));
        Owners { by_cgroup, held, empty, list }
    }

    pub fn of_cgroup(&self, cgroup: u64) -> u32 {
        self.by_cgroup.get(&cgroup).copied().unwrap_or(self.empty)
    }

    pub fn of(&self, owner: &Owner) -> u32 {
        self.list.binary_search(owner).map_or(self.empty, |i| i as u32)
    }

    pub fn get(&self, id: u32) -> &Owner<'a> {
        &self.list[id as usize]
    }

    /// Kernel entries with their owners' numbers in `view`: the live
    /// cgroups', and when scraped, what purged pods left to their revisions.
    pub fn owned<'s, K>(
        &'s self,
        view: View,
        live: &'s [(K, LatencyHistogram)],
        cgroup: impl Fn(&K) -> u64 + 's,
        retired: &'s BTreeMap<(RevisionKey, K), LatencyHistogram>,
    ) -> impl Iterator<Item = (u32, &'s K, &'s LatencyHistogram)> + 's {
        let live = live.iter().filter_map(move |(k, s)| {
            let c = cgroup(k);
            (!self.held.contains(&c)).then(|| (self.of_cgroup(c), k, s))
        });
        let retired = retired.iter().filter(move |_| view == View::Scrape);
        live.chain(retired.map(move |((r, k), s)| (self.of(&retired_owner(r)), k, s)))
    }
}

/// A revision-scoped counter or histogram kept per cgroup from events (HTTP
/// requests, runs), with what purged cgroups left to their revision.
#[derive(Debug)]
pub struct ByRevision<K, V> {
    live: BTreeMap<(u64, K), V>,
    retired: BTreeMap<(RevisionKey, K), V>,
}

impl<K, V> Default for ByRevision<K, V> {
    fn default() -> Self {
        Self { live: BTreeMap::new(), retired: BTreeMap::new() }
    }
}

impl<K: Ord + Copy, V: Default> ByRevision<K, V> {
    pub fn entry(&mut self, cgroup: u64, key: K) -> &mut V {
        self.live.entry((cgroup, key)).or_default()
    }

    pub fn retire(&mut self, cgroup: u64, revision: &RevisionKey, merge: impl Fn(&mut V, &V)) {
        let keys: Vec<(u64, K)> = self.live.keys().filter(|(c, _)| *c == cgroup).copied().collect();
        for k in keys {
            if let Some(v) = self.live.remove(&k) {
                merge(self.retired.entry((revision.clone(), k.1)).or_default(), &v);
            }
        }
    }

    /// Forgets what purged pods left to revisions no longer on the node.
    pub fn keep_revisions(&mut self, live: &HashSet<RevisionKey>) {
        self.retired.retain(|(k, _), _| live.contains(k));
    }

    /// Every key held, live or retired.
    pub fn keys(&self) -> impl Iterator<Item = &K> {
        self.live.keys().map(|(_, k)| k).chain(self.retired.keys().map(|(_, k)| k))
    }

    /// Every owner's merged value in `view`: live cgroups by their labels,
    /// and when scraped, what purged ones left.
    pub fn shown<'a>(&'a self, r: &Render<'a>, merge: impl Fn(&mut V, &V)) -> BTreeMap<(Owner<'a>, K), V> {
        let mut out: BTreeMap<(Owner, K), V> = BTreeMap::new();
        for ((cgroup, k), v) in self.live.iter().filter(|((c, _), _)| !r.series.revision_held(*c)) {
            merge(out.entry((owner(r.series.labels(*cgroup), r.view), *k)).or_default(), v);
        }
        if r.view == View::Scrape {
            for ((revision, k), v) in &self.retired {
                merge(out.entry((retired_owner(revision), *k)).or_default(), v);
            }
        }
        out
    }
}

/// Merges a purged cgroup's count into its revision's ([`ByRevision`]).
pub fn add_count(a: &mut u64, b: &u64) {
    *a += b;
}

/// Durations of events counted in fixed buckets (not cumulative), their
/// count and sum: a [`ByRevision`] histogram (HTTP requests, runs), whose
/// family's `bounds` in seconds each call names.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Durations {
    buckets: Vec<u64>,
    count: u64,
    sum_ns: u64,
}

impl Durations {
    /// Counts `ns` in the first bucket whose bound holds it; past the last
    /// bound, in the count (`+Inf`) and the sum only.
    pub fn record(&mut self, bounds: &[f64], ns: u64) {
        if self.buckets.is_empty() {
            self.buckets = vec![0; bounds.len()];
        }
        let seconds = ns as f64 * 1e-9;
        if let Some(i) = bounds.iter().position(|b| seconds <= *b) {
            self.buckets[i] += 1;
        }
        self.count += 1;
        self.sum_ns += ns;
    }

    /// Merges `other` (of the same bounds) into this.
    pub fn add(&mut self, other: &Durations) {
        if self.buckets.len() < other.buckets.len() {
            self.buckets.resize(other.buckets.len(), 0);
        }
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
        self.count += other.count;
        self.sum_ns += other.sum_ns;
    }

    /// Cumulative counts per bound, the count (`+Inf`) and the sum in seconds.
    pub fn cumulative(&self, bounds: &[f64]) -> (Vec<u64>, u64, f64) {
        let mut running = 0;
        let cumulative = (0..bounds.len())
            .map(|i| {
                running += self.buckets.get(i).copied().unwrap_or(0);
                running
            })
            .collect();
        (cumulative, self.count, self.sum_ns as f64 * 1e-9)
    }
}

/// Adds kernel entries to `into` under `key`, their cgroup taken out.
fn fold<'a, K: Ord + 'a>(
    into: &mut BTreeMap<(RevisionKey, K), LatencyHistogram>,
    key: &RevisionKey,
    stats: impl Iterator<Item = &'a (K, LatencyHistogram)>,
    without_cgroup: impl Fn(&K) -> K,
) {
    for (k, s) in stats {
        into.entry((key.clone(), without_cgroup(k))).or_default().add(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_purged_pods_totals_stay_with_its_revision_until_the_revision_leaves() {
        let key: RevisionKey = ["ns", "w", "abc", "canary"].map(str::to_string);
        let gpu_key = GpuStatsKey { cgroup_id: 7, api: 1, function: 2, result: 0, untimed: 0 };
        let stats = LatencyHistogram { count: 3, total_ns: 30, ..Default::default() };
        let mut retired = Retired::default();
        retired.fold_gpu(&key, [(gpu_key, stats)].iter());
        retired.fold_gpu(&key, [(GpuStatsKey { cgroup_id: 8, ..gpu_key }, stats)].iter());
        let kept: Vec<_> = retired.gpu.iter().map(|((k, g), s)| (k.clone(), g.cgroup_id, s.count)).collect();
        assert_eq!(kept, vec![(key.clone(), 0, 6)], "two pods of one revision add up under no cgroup");
        retired.keep_only(&HashSet::from([key.clone()]));
        assert_eq!(retired.gpu.len(), 1, "kept while the revision has a pod");
        retired.keep_only(&HashSet::new());
        assert!(retired.gpu.is_empty(), "gone with the revision's last pod");
    }
}
