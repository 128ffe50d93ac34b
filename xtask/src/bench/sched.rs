//! `sched_overhead`: what the scheduler probes add to a context switch, in
//! ns per round trip of `pingpong`.
//!
//! Two processes pinned to one CPU bounce a byte over pipes, so every round
//! trip is two wakeups and two context switches: the events scheduler
//! tracepoints fire on, system-wide, for every process on the host
//! (canaryscope hooks only the switches, runqlat both). It runs bare, under
//! `canaryscope run` and under libbpf-tools' runqlat, and twice for each: in a cgroup
//! canaryscope reports on (as a pod's) and in one it does not (a system
//! service's). Targets: a slowdown of at most 0.6× runqlat's in the pod, at
//! most 0.2× outside.
use std::{path::Path, time::Duration};

use anyhow::Result;

use super::{
    cgroups::{own_cgroup, SCHED_POD_CGROUP, SCHED_SYSTEM_CGROUP},
    daemon::Daemon,
    div,
    peers::{peer_or_note, start_runqlat},
    process::fixture_figure_in,
    rounds::{Config, ProgTime, Rounds},
    step, Env, Plan, Row, Target,
};

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Tool {
    Bare,
    Canaryscope,
    Runqlat,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Place {
    Pod,
    System,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
struct SchedCfg(Tool, Place);

impl Config for SchedCfg {
    fn label(self) -> &'static str {
        match self {
            SchedCfg(Tool::Bare, Place::Pod) => "bare/pod",
            SchedCfg(Tool::Bare, Place::System) => "bare/system",
            SchedCfg(Tool::Canaryscope, Place::Pod) => "canaryscope/pod",
            SchedCfg(Tool::Canaryscope, Place::System) => "canaryscope/system",
            SchedCfg(Tool::Runqlat, Place::Pod) => "runqlat/pod",
            SchedCfg(Tool::Runqlat, Place::System) => "runqlat/system",
        }
    }
}

struct Places {
    pod: std::path::PathBuf,
    system: std::path::PathBuf,
}

impl Places {
    fn procs(&self, place: Place) -> &Path {
        match place {
            Place::Pod => &self.pod,
            Place::System => &self.system,
        }
    }
}

fn pingpong(env: &Env, rounds: u64, procs: &Path) -> Result<f64> {
    let rounds = rounds.to_string();
    fixture_figure_in(env, "pingpong", &[&rounds], "ns_per_round_trip", Duration::from_secs(300), Some(procs))
}

pub(super) fn sched_case(env: &Env, plan: &Plan, out: &mut Vec<Row>) -> Result<()> {
    let (_pod_tree, pod_procs, pod_rel) = own_cgroup(SCHED_POD_CGROUP)?;
    let (_system_tree, system_procs, _) = own_cgroup(SCHED_SYSTEM_CGROUP)?;
    let places = Places { pod: pod_procs, system: system_procs };
    let r = plan.pingpong_rounds;
    let diag_rounds = (r / 2).max(20_000);
    let mut diag = ProgTime::new("sched_bpf_prog_time", "ns/round trip", diag_rounds);
    let mut tools = vec![Tool::Bare, Tool::Canaryscope];
    let mut notes = Vec::new();
    if env.runqlat.is_some() {
        tools.push(Tool::Runqlat);
    } else {
        notes.push("runqlat (libbpf-tools) not installed: no peer".to_string());
    }
    let configs: Vec<SchedCfg> =
        tools.iter().flat_map(|t| [SchedCfg(*t, Place::Pod), SchedCfg(*t, Place::System)]).collect();
    step(&format!(
        "sched_overhead: pingpong {r} (two processes on CPU 0) in a reported and an unreported cgroup, {} \
         interleaved rounds",
        plan.sched_rounds
    ));
    let daemon_args = ["--cgroup", pod_rel.as_str()];
    let rounds = Rounds::run(&configs, plan.sched_rounds, "ns/round trip", |cfg, _, last| {
        let SchedCfg(tool, place) = cfg;
        let procs = places.procs(place);
        Ok(Some(match tool {
            Tool::Bare => pingpong(env, r, procs)?,
            Tool::Canaryscope => {
                let d = Daemon::start(env, "canaryscope-sched", &daemon_args)?;
                let v = pingpong(env, r, procs)?;
                if last && place == Place::Pod {
                    diag.measure(env, cfg, d.pid(), "canaryscope programs, pingpong in the pod", |n| {
                        pingpong(env, n, procs)
                    })?;
                }
                d.stop();
                v
            }
            Tool::Runqlat => {
                let Some(mut p) = peer_or_note(start_runqlat(env, "runqlat"), "runqlat", &mut notes) else {
                    return Ok(None);
                };
                let v = pingpong(env, r, procs)?;
                if last && place == Place::Pod {
                    diag.measure(env, cfg, p.pid(), "runqlat programs", |n| pingpong(env, n, procs))?;
                }
                if p.stop().1 {
                    notes.push("runqlat had to be SIGKILLed".into());
                }
                v
            }
        }))
    })?;
    for (place, name, limit) in
        [(Place::Pod, "sched_overhead_pod", 0.60), (Place::System, "sched_overhead_system", 0.20)]
    {
        let mut row = overhead_row(&rounds, env, place, name, limit);
        row.notes.push(pingpong_note(r, place, &pod_rel));
        row.notes.extend(notes.iter().cloned());
        out.push(row);
    }
    out.push(diag.into_row(
        SchedCfg(Tool::Canaryscope, Place::Pod),
        SchedCfg(Tool::Runqlat, Place::Pod),
        None,
        env.runqlat.is_some().then(|| "runqlat".into()),
        format!(
            "in-kernel BPF program time per round trip (kernel.bpf_stats_enabled=1) in a separate pingpong \
             {diag_rounds} in the reported cgroup during the last round; includes everything the observer's \
             programs ran for system-wide in that time"
        ),
    ));
    Ok(())
}

/// What the pingpong was and where it ran, against what.
fn pingpong_note(r: u64, place: Place, pod_rel: &str) -> String {
    let cgroup = match place {
        Place::Pod => pod_rel.to_string(),
        Place::System => format!("/{SCHED_SYSTEM_CGROUP}"),
    };
    format!(
        "pingpong {r} {} ({cgroup}): two processes pinned to CPU 0 bounce a byte over pipes (two context \
         switches and two wakeups per round trip); canaryscope = `canaryscope run --cgroup {pod_rel}` with \
         all probes; runqlat = libbpf-tools runqlat (every task)",
        where_(place)
    )
}

fn where_(place: Place) -> &'static str {
    match place {
        Place::Pod => "in a reported cgroup",
        Place::System => "outside reported cgroups",
    }
}

/// One place's row: canaryscope's and runqlat's slowdowns of the pingpong
/// against bare, and the target on their ratio.
fn overhead_row(rounds: &Rounds<SchedCfg>, env: &Env, place: Place, name: &str, limit: f64) -> Row {
    let mut row = Row::new(name, "ns/round trip");
    row.peer_tool = env.runqlat.is_some().then(|| "runqlat".into());
    row.baseline = rounds.median(SchedCfg(Tool::Bare, place));
    row.canaryscope = rounds.median(SchedCfg(Tool::Canaryscope, place));
    row.peer = rounds.median(SchedCfg(Tool::Runqlat, place));
    let slow = |v: Option<f64>| Some((v? / row.baseline? - 1.0) * 100.0);
    let (cs_slow, rq_slow) = (slow(row.canaryscope), slow(row.peer));
    row.ratio("canaryscope_vs_baseline", div(row.canaryscope, row.baseline));
    row.ratio("peer_vs_baseline", div(row.peer, row.baseline));
    row.ratio("canaryscope_slowdown_pct", cs_slow);
    row.ratio("peer_slowdown_pct", rq_slow);
    let frac = match (cs_slow, rq_slow) {
        (Some(c), Some(q)) if q > 0.0 => Some(c / q),
        _ => None,
    };
    row.ratio("canaryscope_slowdown_vs_peer", frac);
    row.target = Some(Target::new(
        &format!(
            "{}: slowdown ≤ {limit:.1}× runqlat's (canaryscope/runqlat slowdown ≤ {limit:.2})",
            where_(place)
        ),
        limit,
        frac,
        "",
    ));
    if rq_slow.is_some_and(|q| q <= 0.0) {
        row.notes.push("runqlat showed no slowdown above noise: the ratio is not meaningful".into());
    }
    rounds.add_samples_of(
        &mut row,
        &[SchedCfg(Tool::Bare, place), SchedCfg(Tool::Canaryscope, place), SchedCfg(Tool::Runqlat, place)],
    );
    row
}
