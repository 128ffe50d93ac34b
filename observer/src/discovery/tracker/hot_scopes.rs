//! Which processes carry hot-call probes and what the kernel side reports
//! mappings for: the selection applied to each GPU process, re-evaluated
//! as processes exit, windows pass and pods stop (or start) being canaries.
use std::{collections::HashSet, time::Instant};

use log::{debug, info, warn};

use super::{Candidate, KernelScope, LibraryTracker};
use crate::probes::{gpu::GpuAttachError, Loaded};

impl LibraryTracker {
    /// Gives `pid` the hot-call probes its selection asks for, or takes
    /// them away.
    pub(super) fn apply(&mut self, kernel: &mut Loaded, pid: u32, now: Instant) {
        let Some(process) = self.processes.get_mut(&pid) else { return };
        let candidate = Candidate {
            pid,
            comm: &process.comm,
            cgroup_id: process.cgroup_id,
            cgroup_path: process.cgroup_path.as_deref(),
        };
        let want = self.selection.reason(&candidate, now);
        let scope = self.selection.kernel_scope(&candidate);
        if self.selection.per_process() {
            match want {
                Some(reason) => {
                    for id in &process.libraries {
                        match self.probes.attach_hot(kernel.object_mut(), id, pid) {
                            Ok(0) => {}
                            Ok(n) => info!(
                                "hot-call probes on {n} functions for {}[{pid}] ({})",
                                process.comm,
                                reason.as_str()
                            ),
                            Err(GpuAttachError::Gone(what)) => debug!("{what}: gone while attaching"),
                            Err(e) => warn!("cannot probe hot calls: {e}"),
                        }
                    }
                }
                None if process.reason.is_some() => {
                    self.probes.release_hot(kernel.object_mut(), pid);
                    info!("hot-call probes removed from {}[{pid}]: no longer selected", process.comm);
                }
                None => {}
            }
        }
        process.reason = want;
        if let (Some(_), Some(scope)) = (want, scope) {
            self.add_scope(kernel, scope);
        }
    }

    /// Re-evaluates every GPU process: exits, windows that passed, pods
    /// that stopped (or started) being canaries; then the kernel's scopes.
    pub(super) fn reselect(&mut self, kernel: &mut Loaded) {
        let now = Instant::now();
        self.last_reselect = now;
        self.reselect_now = false;
        let exited: Vec<u32> =
            self.processes.iter().filter(|(pid, p)| p.exit.exited(**pid)).map(|(pid, _)| *pid).collect();
        for pid in exited {
            self.processes.remove(&pid);
            self.code.exited(pid, now);
            if self.probes.release_hot(kernel.object_mut(), pid) {
                debug!("pid {pid} exited: its hot-call probes are gone");
            }
        }
        self.selection.expire(now);
        self.exec_scopes.retain(|_, until| *until > now);
        let pids: Vec<u32> = self.processes.keys().copied().collect();
        for pid in pids {
            self.apply(kernel, pid, now);
        }
        // The kernel reports mappings for selected processes' cgroups (or
        // the processes), troubled cgroups, and what exec selected lately.
        let mut wanted: HashSet<KernelScope> = self
            .processes
            .iter()
            .filter(|(_, p)| p.reason.is_some())
            .filter_map(|(pid, p)| {
                self.selection.kernel_scope(&Candidate {
                    pid: *pid,
                    comm: &p.comm,
                    cgroup_id: p.cgroup_id,
                    cgroup_path: p.cgroup_path.as_deref(),
                })
            })
            .collect();
        wanted.extend(self.selection.troubled_cgroups().map(KernelScope::Cgroup));
        wanted.extend(self.selection.initial_pids().iter().map(|p| KernelScope::Process(*p)));
        wanted.extend(self.exec_scopes.keys().copied());
        let stale: Vec<KernelScope> = self.scopes.difference(&wanted).copied().collect();
        for scope in stale {
            self.remove_scope(kernel, scope);
        }
    }

    pub(super) fn add_scope(&mut self, kernel: &mut Loaded, scope: KernelScope) {
        if self.scopes.insert(scope) {
            match scope {
                KernelScope::Cgroup(id) => kernel.set_hot_cgroup(id, true),
                KernelScope::Process(pid) => kernel.set_hot_tgid(pid, true),
            }
        }
    }

    fn remove_scope(&mut self, kernel: &mut Loaded, scope: KernelScope) {
        if self.scopes.remove(&scope) {
            match scope {
                KernelScope::Cgroup(id) => kernel.set_hot_cgroup(id, false),
                KernelScope::Process(pid) => kernel.set_hot_tgid(pid, false),
            }
        }
    }
}
