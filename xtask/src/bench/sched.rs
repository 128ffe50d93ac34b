//! `sched_overhead`: what the scheduler probes add to a context switch, in
//! ns per round trip of `pingpong`.
//!
//! Two processes pinned to one CPU bounce a byte over pipes, so every round
//! trip is two wakeups and two context switches: the events the observer's
//! scheduler tracepoints fire on, system-wide, for every process on the
//! host. It runs bare, under `canaryscope run` and under libbpf-tools'
//! runqlat, which hooks the same events; the target is a slowdown of at
//! most 60% of runqlat's.
use std::time::Duration;

use anyhow::Result;

use super::{
    daemon::Daemon,
    div,
    peers::{peer_or_note, start_runqlat},
    process::fixture_figure,
    rounds::{Config, ProgTime, Rounds},
    step, Env, Plan, Row, Target,
};

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum SchedCfg {
    Bare,
    Canaryscope,
    Runqlat,
}

impl Config for SchedCfg {
    fn label(self) -> &'static str {
        match self {
            SchedCfg::Bare => "bare",
            SchedCfg::Canaryscope => "canaryscope",
            SchedCfg::Runqlat => "runqlat",
        }
    }
}

fn pingpong(env: &Env, rounds: u64) -> Result<f64> {
    let rounds = rounds.to_string();
    fixture_figure(env, "pingpong", &[&rounds], "ns_per_round_trip", Duration::from_secs(300))
}

pub(super) fn sched_case(env: &Env, plan: &Plan, out: &mut Vec<Row>) -> Result<()> {
    let r = plan.pingpong_rounds;
    let diag_rounds = (r / 2).max(20_000);
    let mut row = Row::new("sched_overhead", "ns/round trip");
    let mut diag = ProgTime::new("sched_bpf_prog_time", "ns/round trip", diag_rounds);
    let mut configs = vec![SchedCfg::Bare, SchedCfg::Canaryscope];
    if env.runqlat.is_some() {
        configs.push(SchedCfg::Runqlat);
        row.peer_tool = Some("runqlat".into());
    } else {
        row.notes.push("runqlat (libbpf-tools) not installed: no peer".into());
    }
    step(&format!(
        "sched_overhead: pingpong {r} (two processes on CPU 0), {} interleaved rounds",
        plan.sched_rounds
    ));
    let rounds = Rounds::run(&configs, plan.sched_rounds, "ns/round trip", |cfg, _, last| {
        Ok(Some(match cfg {
            SchedCfg::Bare => pingpong(env, r)?,
            SchedCfg::Canaryscope => {
                let d = Daemon::start(env, "canaryscope-sched", &[])?;
                let v = pingpong(env, r)?;
                if last {
                    diag.measure(env, cfg, d.pid(), "canaryscope programs that ran", |n| pingpong(env, n))?;
                }
                d.stop();
                v
            }
            SchedCfg::Runqlat => {
                let Some(mut p) = peer_or_note(start_runqlat(env, "runqlat"), "runqlat", &mut row.notes)
                else {
                    return Ok(None);
                };
                let v = pingpong(env, r)?;
                if last {
                    diag.measure(env, cfg, p.pid(), "runqlat programs", |n| pingpong(env, n))?;
                }
                if p.stop().1 {
                    row.notes.push("runqlat had to be SIGKILLed".into());
                }
                v
            }
        }))
    })?;
    row.baseline = rounds.median(SchedCfg::Bare);
    row.canaryscope = rounds.median(SchedCfg::Canaryscope);
    row.peer = rounds.median(SchedCfg::Runqlat);
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
        "slowdown ≤ 60% of runqlat's (canaryscope/runqlat slowdown ≤ 0.60)",
        0.60,
        frac,
        "",
    ));
    if rq_slow.is_some_and(|q| q <= 0.0) {
        row.notes.push("runqlat showed no slowdown above noise: the ratio is not meaningful".into());
    }
    rounds.add_samples(&mut row);
    row.notes.push(format!(
        "pingpong {r}: two processes pinned to CPU 0 bounce a byte over pipes (two context switches \
         and two wakeups per round trip); canaryscope = `canaryscope run` with all probes; runqlat = \
         libbpf-tools runqlat"
    ));

    let diag = diag.into_row(
        SchedCfg::Canaryscope,
        SchedCfg::Runqlat,
        None,
        row.peer_tool.clone(),
        format!(
            "in-kernel BPF program time per round trip (kernel.bpf_stats_enabled=1) in a separate pingpong \
             {diag_rounds} during the last round; includes everything the observer's programs ran for \
             system-wide in that time"
        ),
    );
    out.extend([row, diag]);
    Ok(())
}
