//! Group OOM kills: with `memory.oom.group` set (kubelet does so on cgroup v2
//! since Kubernetes 1.28) one OOM of a container kills every process in it.
//! The kernel marks each member a victim, one after another, from the task
//! that ran the OOM killer, inside one `oom_kill_process` call. Those victims
//! are one OOM kill of the container; each still exits as `oom_kill`.
//!
//! The `oom_kill` event of a group is sent once, when every marked member has
//! exited (or [`GROUP_WAIT`] passed), carrying `victims`. Sending the first
//! victim's event and updating it later would make
//! `canaryscope_oom_kills_total` either count the update as a second kill or
//! need a kind of event the counter skips; a counter cannot be taken back.
//! Waiting costs only the time between the first and last member's exit.
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use crate::events::{Detail, Event};

/// Marks of one group kill come from one call of the kernel's OOM killer, so
/// microseconds apart (plus console printing of each kill); a second OOM of
/// the same memory cgroup waits until the first victims are gone.
const MARK_WINDOW_NS: u64 = 1_000_000_000;
/// A member marked but never seen exiting as a victim (it was exiting
/// already, or its record was lost) does not hold the kill back longer.
pub const GROUP_WAIT: Duration = Duration::from_secs(5);
/// Victims marked but never seen exiting are forgotten past this many.
const MAX_VICTIMS: usize = 1024;

struct Batch {
    killer_tid: u32,
    first_mark_ns: u64,
    /// The victim the OOM killer chose (marked first); the others were
    /// killed for being in its group. The event is about it when it exits.
    chosen: u32,
    marked: u32,
    exited: u32,
    event: Option<Event>,
    opened: Instant,
}

/// A group kill already sent, remembered for marks that arrive after every
/// member marked so far exited (possible when the task running the OOM
/// killer is not itself a member, so nothing holds the members back).
struct SentGroup {
    killer_tid: u32,
    first_mark_ns: u64,
}

/// Sent group kills remembered for late marks; they matter for one
/// [`MARK_WINDOW_NS`] only.
const MAX_SENT_GROUPS: usize = 16;

#[derive(Default)]
pub struct OomGroups {
    /// Marked victims not yet exited, with their batch.
    victims: HashMap<u32, u64>,
    batches: HashMap<u64, Batch>,
    sent_groups: Vec<SentGroup>,
    next_id: u64,
}

/// The batch id of victims that belong to a group kill already sent.
const SENT: u64 = u64::MAX;

impl OomGroups {
    /// The kernel marked `victim` from `killer_tid` at `ts_ns` (boot clock).
    pub fn mark(&mut self, killer_tid: u32, ts_ns: u64, victim: u32, now: Instant) {
        if self.victims.len() >= MAX_VICTIMS {
            self.victims.clear();
            self.batches.clear();
        }
        if let Some(old) = self.victims.remove(&victim) {
            // A reused pid: the old mark's process is long gone.
            if let Some(b) = self.batches.get_mut(&old) {
                b.marked = b.marked.saturating_sub(1);
            }
        }
        // Members start exiting while the kernel still marks the rest (their
        // SIGKILL is sent as each is marked, and they run on other CPUs), so
        // a batch with exits already seen still takes marks: it is open
        // until every member marked so far has exited.
        let open = self.batches.iter_mut().find(|(_, b)| {
            b.killer_tid == killer_tid && ts_ns.saturating_sub(b.first_mark_ns) < MARK_WINDOW_NS
        });
        let late = self
            .sent_groups
            .iter()
            .any(|g| g.killer_tid == killer_tid && ts_ns.saturating_sub(g.first_mark_ns) < MARK_WINDOW_NS);
        let id = match open {
            None if late => SENT,
            Some((id, b)) => {
                b.marked += 1;
                *id
            }
            None => {
                let id = self.next_id;
                self.next_id += 1;
                self.batches.insert(
                    id,
                    Batch {
                        killer_tid,
                        first_mark_ns: ts_ns,
                        chosen: victim,
                        marked: 1,
                        exited: 0,
                        event: None,
                        opened: now,
                    },
                );
                id
            }
        };
        self.victims.insert(victim, id);
    }

    /// A marked victim exited; `event` is its `oom_kill` event (victims 1).
    /// `in_group`: its cgroup has `memory.oom.group` set, so the victims
    /// marked with it are one kill. Returns the events due now.
    pub fn exit(&mut self, pid: u32, tid: u32, event: Event, in_group: bool) -> Vec<Event> {
        let Some(id) = self.victims.remove(&pid).or_else(|| self.victims.remove(&tid)) else {
            // Its mark was lost or forgotten: a kill of its own.
            return vec![event];
        };
        let Some(batch) = self.batches.get_mut(&id) else {
            // A straggler of a kill already sent (after GROUP_WAIT): that
            // kill was counted; its exit is still an `oom_kill` exit.
            return Vec::new();
        };
        if !in_group {
            // Marked by the same task in the same second without a group:
            // separate kills, each counted.
            batch.marked = batch.marked.saturating_sub(1);
            let mut out = vec![event];
            if batch.marked == 0 || (batch.exited > 0 && batch.exited >= batch.marked) {
                out.extend(self.finish(id));
            }
            return out;
        }
        batch.exited += 1;
        if batch.event.is_none() || pid == batch.chosen {
            batch.event = Some(event);
        }
        if batch.exited >= batch.marked {
            let sent = SentGroup { killer_tid: batch.killer_tid, first_mark_ns: batch.first_mark_ns };
            if self.sent_groups.len() >= MAX_SENT_GROUPS {
                self.sent_groups.remove(0);
            }
            self.sent_groups.push(sent);
            return self.finish(id).into_iter().collect();
        }
        Vec::new()
    }

    /// Group kills whose stragglers waited long enough.
    pub fn due(&mut self, now: Instant) -> Vec<Event> {
        let late: Vec<u64> = self
            .batches
            .iter()
            .filter(|(_, b)| now.duration_since(b.opened) >= GROUP_WAIT)
            .map(|(id, _)| *id)
            .collect();
        late.into_iter().filter_map(|id| self.finish(id)).collect()
    }

    /// Closes a batch: its event with the number of victims seen exiting.
    /// Members not yet exited stay listed, so their exit adds no kill.
    fn finish(&mut self, id: u64) -> Option<Event> {
        let batch = self.batches.remove(&id)?;
        let mut event = batch.event?;
        if let Detail::OomKill { victims, .. } = &mut event.detail {
            *victims = batch.exited;
        }
        Some(event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Origin;

    fn oom(pid: u32) -> Event {
        Event {
            origin: Origin { pid, tid: pid, ..Default::default() },
            detail: Detail::OomKill { scope: "memcg", anon_rss_bytes: None, victims: 1 },
        }
    }

    fn victims(events: &[Event]) -> Vec<(u32, u32)> {
        events
            .iter()
            .map(|e| match e.detail {
                Detail::OomKill { victims, .. } => (e.origin.pid, victims),
                _ => (e.origin.pid, 0),
            })
            .collect()
    }

    #[test]
    fn a_group_kill_is_one_event_once_every_member_exited() {
        let now = Instant::now();
        let mut g = OomGroups::default();
        for v in [10, 11, 12] {
            g.mark(99, 1_000 + u64::from(v), v, now);
        }
        // Members may exit before the chosen victim; the event is about it.
        assert!(g.exit(11, 11, oom(11), true).is_empty());
        assert!(g.exit(10, 10, oom(10), true).is_empty());
        assert_eq!(victims(&g.exit(12, 12, oom(12), true)), vec![(10, 3)]);
        assert!(g.due(now + GROUP_WAIT).is_empty());
    }

    #[test]
    fn kills_without_a_group_each_count() {
        let now = Instant::now();
        let mut g = OomGroups::default();
        g.mark(99, 1_000, 10, now);
        g.mark(99, 2_000, 11, now);
        assert_eq!(victims(&g.exit(10, 10, oom(10), false)), vec![(10, 1)]);
        assert_eq!(victims(&g.exit(11, 11, oom(11), false)), vec![(11, 1)]);
        // Another killer, or a mark a second later, starts another kill.
        g.mark(98, 3_000, 20, now);
        g.mark(99, 3_000, 21, now);
        g.mark(99, 3_000 + MARK_WINDOW_NS, 22, now);
        assert_eq!(victims(&g.exit(20, 20, oom(20), true)), vec![(20, 1)]);
        assert_eq!(victims(&g.exit(21, 21, oom(21), true)), vec![(21, 1)]);
        assert_eq!(victims(&g.exit(22, 22, oom(22), true)), vec![(22, 1)]);
        // An exit without a mark is a kill of its own.
        assert_eq!(victims(&g.exit(30, 30, oom(30), true)), vec![(30, 1)]);
    }

    #[test]
    fn a_member_never_seen_exiting_does_not_hold_the_kill_back() {
        let now = Instant::now();
        let mut g = OomGroups::default();
        for v in [10, 11, 12] {
            g.mark(99, 1_000, v, now);
        }
        assert!(g.exit(10, 10, oom(10), true).is_empty());
        assert!(g.exit(12, 12, oom(12), true).is_empty());
        assert!(g.due(now + Duration::from_secs(1)).is_empty());
        assert_eq!(victims(&g.due(now + GROUP_WAIT)), vec![(10, 2)]);
        // Its late exit is no second kill of the group.
        assert!(g.exit(11, 11, oom(11), true).is_empty());
    }

    #[test]
    fn members_exiting_while_the_kernel_still_marks_are_one_kill() {
        // Seen in the VM: the chosen victim runs the OOM killer; a member
        // killed a moment earlier exits before the last member is marked.
        let now = Instant::now();
        let mut g = OomGroups::default();
        g.mark(10, 1_000, 10, now);
        g.mark(10, 1_001, 11, now);
        assert!(g.exit(11, 11, oom(11), true).is_empty());
        g.mark(10, 1_002, 12, now);
        assert!(g.exit(10, 10, oom(10), true).is_empty());
        assert_eq!(victims(&g.exit(12, 12, oom(12), true)), vec![(10, 3)]);
    }

    #[test]
    fn a_mark_after_every_earlier_member_exited_adds_no_kill() {
        // The killer is no member (another container of the pod hit the
        // pod's limit), so all members marked so far can exit before the
        // kernel marks the next one.
        let now = Instant::now();
        let mut g = OomGroups::default();
        g.mark(99, 1_000, 10, now);
        assert_eq!(victims(&g.exit(10, 10, oom(10), true)), vec![(10, 1)]);
        g.mark(99, 1_001, 11, now);
        assert!(g.exit(11, 11, oom(11), true).is_empty());
        // A kill by the same task a window later is a kill of its own.
        g.mark(99, 1_000 + MARK_WINDOW_NS, 12, now);
        assert_eq!(victims(&g.exit(12, 12, oom(12), true)), vec![(12, 1)]);
    }
}
