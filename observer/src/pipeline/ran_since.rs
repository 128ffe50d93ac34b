//! Which cgroups had tasks run since the CPU monitor's last sample, from
//! the scheduler probe's run-queue histograms: a histogram's count grows
//! each time one of its cgroup's tasks is switched in after waiting, so an
//! unchanged count means none of them ran. Kernel reads may be more
//! frequent than samples, so what they show is gathered until a sample
//! takes it.
use std::collections::{HashMap, HashSet};

use observer_common::sched::RunqHistogram;

#[derive(Default)]
pub struct RanSince {
    /// Each cgroup's histogram count at the last read.
    counts: HashMap<u64, u64>,
    /// Cgroups whose count grew since the last `take`.
    ran: HashSet<u64>,
}

impl RanSince {
    /// Notes one read of the histograms (every cgroup that has one).
    pub fn note(&mut self, runq: &[(u64, RunqHistogram)]) {
        let mut counts = HashMap::with_capacity(runq.len());
        for (cgroup_id, histogram) in runq {
            if self.counts.get(cgroup_id) != Some(&histogram.count) {
                self.ran.insert(*cgroup_id);
            }
            counts.insert(*cgroup_id, histogram.count);
        }
        // Cgroups without a histogram now were purged (removed): forgotten.
        self.counts = counts;
    }

    /// The cgroups that ran since the last call.
    pub fn take(&mut self) -> HashSet<u64> {
        std::mem::take(&mut self.ran)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn histogram(count: u64) -> RunqHistogram {
        RunqHistogram { count, ..Default::default() }
    }

    #[test]
    fn a_cgroup_ran_when_its_count_grew_in_any_read_since_the_last_take() {
        let mut ran = RanSince::default();
        ran.note(&[(1, histogram(5)), (2, histogram(7))]);
        assert_eq!(ran.take(), HashSet::from([1, 2]), "first seen: nothing to compare with");
        ran.note(&[(1, histogram(5)), (2, histogram(8))]);
        ran.note(&[(1, histogram(5)), (2, histogram(8)), (3, histogram(1))]);
        assert_eq!(ran.take(), HashSet::from([2, 3]));
        ran.note(&[(1, histogram(5)), (2, histogram(8)), (3, histogram(1))]);
        assert!(ran.take().is_empty(), "unchanged counts: nothing ran");
    }
}
