//! `gpu_call_overhead`: what the GPU uprobes add to every call a program
//! makes into its GPU runtime, in ns per call.
//!
//! `cuda_app --version-loop N` calls cuDriverGetVersion through the
//! ZLUDA-shaped libcuda.so.1: a call so cheap that the probe cost is most
//! of what is left to see. It runs bare, under `canaryscope run`, under a
//! bpftrace one-liner that does comparable work (a count per result and a
//! latency histogram), and under an empty uprobe+uretprobe pair: the floor,
//! what any observer of the call pays before its programs do anything.
//! Against the floor, canaryscope's own work is compared with bpftrace's.
use std::{path::Path, time::Duration};

use anyhow::{Context, Result};

use super::{
    daemon::{metric_sum, Daemon},
    div, median,
    peers::{peer_or_note, start_bpftrace},
    process::{fixture_figure, parse_field, run_fixture},
    report::num,
    rounds::{Config, ProgTime, Rounds},
    step, sub, Env, Plan, Row, Target,
};

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum GpuCfg {
    Bare,
    Canaryscope,
    Bpftrace,
    Floor,
}

impl Config for GpuCfg {
    fn label(self) -> &'static str {
        match self {
            GpuCfg::Bare => "bare",
            GpuCfg::Canaryscope => "canaryscope",
            GpuCfg::Bpftrace => "bpftrace",
            GpuCfg::Floor => "floor",
        }
    }
}

fn bpftrace_scripts(lib: &Path) -> (String, String) {
    let l = lib.display();
    let full = format!(
        "uprobe:{l}:cuDriverGetVersion {{ @s[tid] = nsecs; }} \
         uretprobe:{l}:cuDriverGetVersion /@s[tid]/ {{ @r[retval] = count(); \
         @lat = hist(nsecs - @s[tid]); delete(@s[tid]); }}"
    );
    let floor = format!("uprobe:{l}:cuDriverGetVersion {{}} uretprobe:{l}:cuDriverGetVersion {{}}");
    (full, floor)
}

fn cuda_loop(env: &Env, calls: u64) -> Result<f64> {
    let calls = calls.to_string();
    fixture_figure(env, "cuda_app", &["--version-loop", &calls], "ns_per_call", Duration::from_secs(300))
}

pub(super) fn gpu_case(env: &Env, plan: &Plan, out: &mut Vec<Row>) -> Result<()> {
    let n = plan.gpu_calls;
    let diag_calls = (n / 10).max(20_000);
    let lib = env.cuda_lib.canonicalize().context("cannot resolve the ZLUDA-shaped libcuda.so.1")?;
    let lib_arg = lib.to_string_lossy().to_string();
    let (full_script, floor_script) = bpftrace_scripts(&lib);
    let mut row = Row::new("gpu_call_overhead", "ns/call");
    let mut diag = ProgTime::new("gpu_call_bpf_prog_time", "ns/call", diag_calls);

    let mut configs = vec![GpuCfg::Bare, GpuCfg::Canaryscope];
    if env.bpftrace.is_some() {
        configs.extend([GpuCfg::Bpftrace, GpuCfg::Floor]);
    } else {
        row.notes.push("bpftrace not installed: no peer and no empty-probe floor".into());
    }
    let mut stop_times = Vec::new();

    step(&format!(
        "gpu_call_overhead: cuda_app --version-loop {n} (cuDriverGetVersion via {}), {} interleaved rounds",
        env.cuda_lib.display(),
        plan.gpu_rounds
    ));
    let rounds = Rounds::run(&configs, plan.gpu_rounds, "ns/call", |cfg, round, last| {
        Ok(Some(match cfg {
            GpuCfg::Bare => cuda_loop(env, n)?,
            GpuCfg::Canaryscope => {
                let (v, d) = under_canaryscope(env, "canaryscope-gpu", &lib_arg, n, round, &mut row, |c| {
                    cuda_loop(env, c)
                })?;
                if last {
                    diag.measure(env, cfg, d.pid(), "canaryscope programs that ran", |c| cuda_loop(env, c))?;
                }
                stop_times.push(d.stop().as_secs_f64());
                v
            }
            GpuCfg::Bpftrace | GpuCfg::Floor => {
                let script = if cfg == GpuCfg::Bpftrace { &full_script } else { &floor_script };
                let Some(v) = bpftrace_round(env, cfg, script, (n, round, last), &mut row, &mut diag)? else {
                    return Ok(None);
                };
                v
            }
        }))
    })?;

    take_medians(env, &rounds, &mut row);
    let (own_cs, own_bt) = (sub(row.canaryscope, row.floor), sub(row.peer, row.floor));
    overhead_figures(env, &rounds, &mut row, n, &stop_times);
    let own = own_work_row(own_cs, own_bt, row.peer_tool.clone());

    let diag = diag.into_row(
        GpuCfg::Canaryscope,
        GpuCfg::Bpftrace,
        Some(GpuCfg::Floor),
        row.peer_tool.clone(),
        format!(
            "in-kernel BPF program time per call (kernel.bpf_stats_enabled=1, run_time_ns from \
             /proc/PID/fdinfo) in a separate {diag_calls}-call run during the last round; the statistics \
             add two clock reads per \
             program run, so the floor's figure is mostly that overhead"
        ),
    );
    out.extend([row, own, diag]);
    out.push(nvidia_case(env, plan)?);
    Ok(())
}

/// One round under a bpftrace peer or the empty-pair floor (`round` is
/// (calls, round, last)); a peer that counted fewer returns than calls is
/// noted. None when bpftrace could not start (noted too).
fn bpftrace_round(
    env: &Env,
    cfg: GpuCfg,
    script: &str,
    (n, round, last): (u64, usize, bool),
    row: &mut Row,
    diag: &mut ProgTime<GpuCfg>,
) -> Result<Option<f64>> {
    let Some(mut p) = bpftrace_for(env, "bpftrace", cfg, script, row) else {
        return Ok(None);
    };
    let v = cuda_loop(env, n)?;
    if last {
        let which = if cfg == GpuCfg::Floor { "floor (empty pair)" } else { "peer" };
        let what = format!("bpftrace {which} programs");
        diag.measure(env, cfg, p.pid(), &what, |c| cuda_loop(env, c))?;
    }
    let (took, killed) = p.stop();
    if killed {
        row.notes.push(format!("bpftrace ({}) had to be SIGKILLed", cfg.label()));
    } else if cfg == GpuCfg::Bpftrace {
        let text = p.output();
        let counted = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("@r[0]:")?.trim().parse::<u64>().ok())
            .unwrap_or(0);
        if counted < n {
            row.notes.push(format!("round {}: bpftrace counted {counted} of {n} calls", round + 1));
        }
    }
    eprintln!("    bpftrace ({}) took {took:.1?} to exit", cfg.label());
    Ok(Some(v))
}

/// The overhead row's ratios, target and notes, and what real HIP costs
/// per call on this host for scale.
fn overhead_figures(env: &Env, rounds: &Rounds<GpuCfg>, row: &mut Row, n: u64, stop_times: &[f64]) {
    let own_cs = sub(row.canaryscope, row.floor);
    let own_bt = sub(row.peer, row.floor);
    row.ratio("canaryscope_vs_baseline", div(row.canaryscope, row.baseline));
    row.ratio("canaryscope_vs_floor", div(row.canaryscope, row.floor));
    row.ratio("canaryscope_vs_peer", div(row.canaryscope, row.peer));
    row.ratio("peer_vs_floor", div(row.peer, row.floor));
    row.ratio("canaryscope_own_vs_peer_own", div(own_cs, own_bt));
    row.target = Some(Target::new(
        "within 10% of the empty-probe floor (canaryscope/floor ≤ 1.10)",
        1.10,
        div(row.canaryscope, row.floor),
        "",
    ));
    rounds.add_samples(row);
    row.notes.push(format!(
        "N={n} calls per run; floor = empty uprobe+uretprobe pair (bpftrace); peer = bpftrace \
         uprobe+uretprobe counting per return value with a latency histogram; canaryscope = \
         `canaryscope run --lib {}` (all probes)",
        env.cuda_lib.display()
    ));
    if !stop_times.is_empty() {
        row.notes.push(format!(
            "canaryscope run took a median {:.1} s to exit after SIGTERM (detaching its uprobes)",
            median(stop_times).unwrap_or(0.0)
        ));
    }
    match fixture_figure(env, "hip_loop", &["200"], "ns_per_call", Duration::from_secs(60)).ok() {
        Some(v) => row.notes.push(format!(
            "hip_loop (real HIP, hipDriverGetVersion) costs {} ns/call bare on this host (HIP retries its \
             initialisation on every call without /dev/kfd), so a probe pair of this size is {:.0}% of it; \
             cuda_app is used because its call is cheap enough to show the probe cost",
            num(v),
            row.canaryscope.zip(row.baseline).map(|(c, b)| (c - b) / v * 100.0).unwrap_or(f64::NAN)
        )),
        None => row.notes.push("hip_loop could not run (real HIP per-call cost not measured)".into()),
    }
}

/// canaryscope's own work against bpftrace's: each above the floor.
fn own_work_row(own_cs: Option<f64>, own_bt: Option<f64>, peer_tool: Option<String>) -> Row {
    let mut own = Row::new("gpu_call_own_work", "ns/call");
    own.canaryscope = own_cs;
    own.peer = own_bt;
    own.peer_tool = peer_tool;
    own.ratio("canaryscope_vs_peer", div(own_cs, own_bt));
    let own_ratio = match (own_cs, own_bt) {
        (Some(c), Some(b)) if b > 0.0 => Some(c / b),
        _ => None,
    };
    own.target =
        Some(Target::new("canaryscope's own work < 1/5 of bpftrace's (ratio ≤ 0.20)", 0.20, own_ratio, ""));
    own.notes.push(
        "own work = median(observer) − median(floor): what the programs add above the cost of the \
         uprobe+uretprobe traps themselves"
            .into(),
    );
    if let Some(b) = own_bt.filter(|b| *b <= 0.0) {
        own.notes.push(format!(
            "bpftrace's own work ({} ns) is not above the floor's noise: the ratio is not meaningful",
            num(b)
        ));
    }
    own
}

/// The row's figures: the median of each configuration's rounds.
fn take_medians(env: &Env, rounds: &Rounds<GpuCfg>, row: &mut Row) {
    row.baseline = rounds.median(GpuCfg::Bare);
    row.canaryscope = rounds.median(GpuCfg::Canaryscope);
    row.peer = rounds.median(GpuCfg::Bpftrace);
    row.floor = rounds.median(GpuCfg::Floor);
    if env.bpftrace.is_some() {
        row.peer_tool = Some("bpftrace".into());
    }
}

/// One round under `canaryscope run --lib LIB`: the loop's figure and the
/// daemon, still running, once it counted every call (or the row says it
/// did not).
fn under_canaryscope(
    env: &Env,
    name: &str,
    lib: &str,
    calls: u64,
    round: usize,
    row: &mut Row,
    mut run: impl FnMut(u64) -> Result<f64>,
) -> Result<(f64, Daemon)> {
    let d = Daemon::start(env, name, &["--lib", lib])?;
    let labels = [("function", "cuDriverGetVersion")];
    let metric = "canaryscope_gpu_api_calls_total";
    let before = metric_sum(&d.metrics()?, metric, &labels);
    let v = run(calls)?;
    let seen =
        d.wait_metric(metric, &labels, Duration::from_secs(5), |c| c >= before + calls as f64) - before;
    if seen != calls as f64 {
        row.wrong(format!("round {}: canaryscope counted {seen} of {calls} calls", round + 1));
    }
    Ok((v, d))
}

/// bpftrace running `script` for a round (`cfg` names it), or `None` with
/// a note where it cannot run.
fn bpftrace_for(
    env: &Env,
    name: &str,
    cfg: GpuCfg,
    script: &str,
    row: &mut Row,
) -> Option<super::process::Proc> {
    let started = start_bpftrace(env, &format!("{name}-{}", cfg.label()), script, 2);
    peer_or_note(started, &format!("bpftrace ({})", cfg.label()), &mut row.notes)
}

/// NVIDIA's own driver library (Debian's 535 `libcuda.so.1`, fetched into
/// target/nvidia): the same call, reached through `DT_NEEDED` by
/// `cuda_needed`, bare, under canaryscope, under bpftrace's comparable
/// script and under the empty pair. Its entries start unlike HIP's or the
/// fixture's, and a uprobe's price depends on the first instruction.
fn nvidia_case(env: &Env, plan: &Plan) -> Result<Row> {
    let paths = std::fs::read_to_string(env.fixtures.join("../nvidia/paths.env"))
        .context("target/nvidia/paths.env (tests/nvidia/fetch.sh; cargo xtask fixtures runs it)")?;
    let lib = paths
        .lines()
        .find_map(|l| l.strip_prefix("LIBCUDA="))
        .map(std::path::PathBuf::from)
        .context("target/nvidia/paths.env names no LIBCUDA")?;
    let dir = lib.parent().context("libcuda's directory")?.to_path_buf();
    // Every probed call of it costs a trap pair; fewer calls keep a round short.
    let n = (plan.gpu_calls / 10).max(20_000);
    let run = |calls: u64| -> Result<f64> {
        let mut cmd = std::process::Command::new(env.fixture("cuda_needed"));
        cmd.args(["--version-loop", &calls.to_string()]).env("LD_LIBRARY_PATH", &dir);
        let out = run_fixture(env, "cuda_needed", &mut cmd, Duration::from_secs(300))?;
        parse_field(&out, "ns_per_call").with_context(|| format!("no ns_per_call in {out}"))
    };
    let lib_arg = lib.to_string_lossy().to_string();
    let (full_script, floor_script) = bpftrace_scripts(&lib);
    let mut row = Row::new("gpu_call_overhead_nvidia", "ns/call");
    let mut configs = vec![GpuCfg::Bare, GpuCfg::Canaryscope];
    if env.bpftrace.is_some() {
        configs.extend([GpuCfg::Bpftrace, GpuCfg::Floor]);
    }
    step(&format!(
        "gpu_call_overhead_nvidia: cuda_needed --version-loop {n} (cuDriverGetVersion via NVIDIA's {}), {} rounds",
        lib.display(),
        plan.gpu_rounds
    ));
    let rounds = Rounds::run(&configs, plan.gpu_rounds, "ns/call", |cfg, round, _| {
        Ok(Some(match cfg {
            GpuCfg::Bare => run(n)?,
            GpuCfg::Canaryscope => {
                let (v, d) =
                    under_canaryscope(env, "canaryscope-gpu-nvidia", &lib_arg, n, round, &mut row, &run)?;
                d.stop();
                v
            }
            GpuCfg::Bpftrace | GpuCfg::Floor => {
                let script = if cfg == GpuCfg::Bpftrace { &full_script } else { &floor_script };
                let Some(mut p) = bpftrace_for(env, "bpftrace-nvidia", cfg, script, &mut row) else {
                    return Ok(None);
                };
                let v = run(n)?;
                p.stop();
                v
            }
        }))
    })?;
    take_medians(env, &rounds, &mut row);
    row.ratio("canaryscope_vs_baseline", div(row.canaryscope, row.baseline));
    row.ratio("canaryscope_vs_floor", div(row.canaryscope, row.floor));
    row.ratio("canaryscope_vs_peer", div(row.canaryscope, row.peer));
    rounds.add_samples(&mut row);
    for (what, file) in
        [("NVIDIA's libcuda", lib.as_path()), ("the ZLUDA-shaped fixture", env.cuda_lib.as_path())]
    {
        row.notes.push(match first_instruction(file, "cuDriverGetVersion") {
            Some(insn) => format!("{what}: cuDriverGetVersion starts with `{insn}`"),
            None => format!("{what}: first instruction of cuDriverGetVersion not read (objdump)"),
        });
    }
    row.notes.push(
        "a uprobe on an instruction the kernel cannot emulate (rip-relative, or a test) single-steps it \
         out of line at every call: the floor shows that price, which no program can lower"
            .into(),
    );
    Ok(row)
}

/// The first instruction of `symbol` in `file`, as objdump prints it.
fn first_instruction(file: &Path, symbol: &str) -> Option<String> {
    let out = std::process::Command::new("objdump")
        .args(["-d", "--no-show-raw-insn", &format!("--disassemble={symbol}")])
        .arg(file)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines().skip_while(|l| !l.ends_with(">:"));
    lines.next()?;
    let insn = lines.next()?.split_once('\t')?.1;
    // Drop objdump's comment on a rip-relative address.
    Some(insn.split('#').next().unwrap_or(insn).split_whitespace().collect::<Vec<_>>().join(" "))
}
