//! `launch_bound_loop`: what the hot-call probes cost a program that does
//! little but launch kernels, in ns per launch, and what they cost it when
//! its process is not selected for them.
//!
//! `cuda_app_standin --launch-loop N` calls `cuLaunchKernel` of the
//! ZLUDA-shaped library, which forwards to `hipModuleLaunchKernel` as ZLUDA
//! does. Below it is the HIP stand-in (tests/fixtures/hip_standin.c), where
//! every call succeeds and a launch does a fixed amount of work: the real
//! runtime fails every launch without a GPU, and a loop of failures would
//! measure the observer's failure path, not a healthy workload's.
//!
//! Configurations, interleaved round by round:
//! - bare;
//! - `canaryscope run --hot-calls selected`, process not selected (its
//!   `cuInit` succeeds): the launch functions must stay unprobed in it, so
//!   the loop should cost what it does bare;
//! - the same, process selected: its `cuInit` fails (the stand-in's
//!   `hipInit` fails on request), the daemon puts per-process uprobes on the
//!   hot functions, and the process waits (`--wait-hot`) until it sees the
//!   breakpoints on both launch entries before it runs the loop; once with
//!   the daemon's default `--hot-detail counts` (a counting return probe),
//!   once with `--hot-detail timed` (an entry and a return probe);
//! - bpftrace counting returns by value on both functions (the counting
//!   peer), bpftrace with a timed uprobe+uretprobe pair on both (the timed
//!   peer), and the empty pair on both (the floor).
//!
//! Both layers are probed, as on a ZLUDA node, and every probed entry starts
//! with a `push`, as Debian's libamdhip64.so.5 entries do: the kernel
//! emulates a push but single-steps most other first instructions, at many
//! times the cost, so the case checks the first instruction of both launch
//! entries and reports it.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, ExitStatus},
    thread::sleep,
    time::Duration,
};

use anyhow::{anyhow, bail, Context, Result};
use object::{Object, ObjectSection, ObjectSymbol};

use super::{
    cgroups::{own_cgroup, CgroupTree, LAUNCH_CGROUP},
    daemon::Daemon,
    div, median,
    peers::{peer_or_note, start_bpftrace},
    process::{parse_field, run_to_end, Proc},
    rounds::{Config, Rounds},
    step, Env, Plan, Row, Target,
};

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum LaunchCfg {
    Bare,
    NotSelected,
    /// Selected, the daemon's default `--hot-detail counts`.
    Selected,
    /// Selected, `--hot-detail timed`.
    SelectedTimed,
    /// bpftrace counting returns by value (the peer of `Selected`).
    BpftraceCounts,
    /// bpftrace timing each call (the peer of `SelectedTimed`).
    Bpftrace,
    Floor,
}

impl Config for LaunchCfg {
    fn label(self) -> &'static str {
        match self {
            LaunchCfg::Bare => "bare",
            LaunchCfg::NotSelected => "not_selected",
            LaunchCfg::Selected => "selected",
            LaunchCfg::SelectedTimed => "selected_timed",
            LaunchCfg::BpftraceCounts => "bpftrace_counts",
            LaunchCfg::Bpftrace => "bpftrace",
            LaunchCfg::Floor => "floor",
        }
    }
}

/// Iterations of the stand-in's work per launch, set by the bench rather
/// than left to the library's default so the report states the work that
/// was measured.
const STANDIN_ITERS: u64 = 1400;
/// How long the selected process waits for its breakpoints: the daemon
/// selects within about a second of the failure.
const WAIT_HOT_MS: u64 = 3000;
/// What the stand-in's hipInit returns when told to fail (hipErrorNoDevice),
/// passed through by the ZLUDA-shaped cuInit.
const INIT_FAILURE: f64 = 100.0;
const CALLS: &str = "canaryscope_gpu_api_calls_total";

/// The launch stack as the bench finds it under target/fixtures.
struct Stack {
    app: PathBuf,
    cuda_lib: PathBuf,
    hip_lib: PathBuf,
}

impl Stack {
    fn find(env: &Env) -> Result<Stack> {
        let app = env.fixture("cuda_app_standin");
        let cuda_lib = env.fixture("zluda-standin/libcuda.so.1");
        let hip_lib = env.fixture("hip-standin/libamdhip64.so.5");
        for f in [&app, &cuda_lib, &hip_lib] {
            if !f.exists() {
                bail!("{} is missing: run `cargo xtask fixtures` first", f.display());
            }
        }
        // Probes and bpftrace name the files by their real paths.
        let real = |p: &Path| p.canonicalize().with_context(|| format!("cannot resolve {}", p.display()));
        Ok(Stack { app, cuda_lib: real(&cuda_lib)?, hip_lib: real(&hip_lib)? })
    }
}

/// Where the loop's processes run and how the daemon names that place.
struct Place {
    /// `cgroup.procs` of the case's own cgroup, when it could be made.
    procs: Option<PathBuf>,
    /// Metric labels that pick the loop's processes out of the node's.
    labels: Vec<(&'static str, String)>,
    _tree: Option<CgroupTree>,
}

/// One run of the loop: `n` launches; `fail_init` makes cuInit fail first,
/// `wait_hot` waits for the breakpoints before the loop.
fn launch_run(
    env: &Env,
    stack: &Stack,
    place: &Place,
    name: &str,
    n: u64,
    fail_init: bool,
    wait_hot: bool,
) -> Result<(ExitStatus, Proc)> {
    let mut args = Vec::new();
    if wait_hot {
        args.extend(["--wait-hot".to_string(), WAIT_HOT_MS.to_string()]);
    }
    args.extend(["--launch-loop".to_string(), n.to_string()]);
    // The process joins the cgroup before exec, so its first call is already
    // attributed there.
    let mut cmd = match &place.procs {
        Some(procs) => {
            let mut c = Command::new("sh");
            c.args(["-c", "echo $$ > \"$0\" && exec \"$@\""]).arg(procs).arg(&stack.app);
            c
        }
        None => Command::new(&stack.app),
    };
    cmd.args(&args).env("HIP_STANDIN_LAUNCH_ITERS", STANDIN_ITERS.to_string());
    if fail_init {
        cmd.env("HIP_STANDIN_INIT_FAIL", "1");
    } else {
        cmd.env_remove("HIP_STANDIN_INIT_FAIL");
    }
    run_to_end(env, name, &mut cmd, Duration::from_secs(300))
}

/// ns per launch from a finished loop, which must have exited 0, seen
/// `init` from cuInit and every launch succeed (anything else means the
/// stand-in stack is not what was built, e.g. the real runtime was loaded).
fn loop_figure(status: ExitStatus, p: &Proc, n: u64, init: f64) -> Result<f64> {
    let out = p.output();
    if !status.success() {
        bail!("cuda_app_standin failed ({status}); {}", p.log_tail());
    }
    if parse_field(&out, "cuInit") != Some(init) {
        bail!("cuda_app_standin: expected cuInit={init}; {}", p.log_tail());
    }
    if parse_field(&out, "ok") != Some(n as f64) {
        bail!("cuda_app_standin: not all {n} launches succeeded; {}", p.log_tail());
    }
    parse_field(&out, "ns_per_launch").ok_or_else(|| anyhow!("no ns_per_launch; {}", p.log_tail()))
}

/// The first instruction of a function, as far as a uprobe's cost goes.
struct Entry {
    text: String,
    push: bool,
}

/// Reads the first bytes of `name`'s code in `lib` (dynamic symbol, file
/// bytes of its section).
fn entry_of(lib: &Path, name: &str) -> Result<Entry> {
    let data = fs::read(lib).with_context(|| format!("cannot read {}", lib.display()))?;
    let file = object::File::parse(&*data).with_context(|| format!("{}: not an ELF file", lib.display()))?;
    let sym = file
        .dynamic_symbols()
        .find(|s| s.name() == Ok(name) && s.is_definition())
        .ok_or_else(|| anyhow!("{} exports no {name}", lib.display()))?;
    let section = sym
        .section_index()
        .and_then(|i| file.section_by_index(i).ok())
        .ok_or_else(|| anyhow!("{name} in {}: no section", lib.display()))?;
    let bytes = section
        .data_range(sym.address(), if sym.size() == 0 { 4 } else { sym.size().min(4) })
        .ok()
        .flatten()
        .ok_or_else(|| anyhow!("{name} in {}: code not in the file", lib.display()))?;
    Ok(decode_entry(bytes))
}

/// Names the x86-64 register pushes, the first instructions the kernel's
/// uprobe code emulates; anything else is shown as bytes. A push of memory
/// or an immediate is not emulated, so it does not count as a push here.
fn decode_entry(bytes: &[u8]) -> Entry {
    const REGS: [&str; 8] = ["rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi"];
    let hex = bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ");
    let push = match bytes {
        [op @ 0x50..=0x57, ..] => Some(format!("push %{}", REGS[(op - 0x50) as usize])),
        [0x41, op @ 0x50..=0x57, ..] => Some(format!("push %r{}", op - 0x50 + 8)),
        _ => None,
    };
    match push {
        Some(text) => Entry { text: format!("`{text}`"), push: true },
        None if bytes.starts_with(&[0xf3, 0x0f, 0x1e, 0xfa]) => {
            Entry { text: format!("`endbr64` ({hex})"), push: false }
        }
        None => Entry { text: format!("not a push ({hex})"), push: false },
    }
}

/// Whether this daemon has hot-call selection: the help of `run` with the
/// flags given parses only if it knows them (clap rejects an unknown flag
/// before it prints help). The error says which flag it lacks.
fn hot_calls_supported(env: &Env) -> Result<(), String> {
    let out = Command::new(&env.bin)
        .args(["run", "--hot-calls", "selected", "--hot-window", "10m", "--hot-detail", "timed", "--help"])
        .output()
        .map_err(|e| format!("cannot start {}: {e}", env.bin.display()))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    Err(err.lines().find(|l| !l.trim().is_empty()).unwrap_or("no message").trim().to_string())
}

/// bpftrace scripts: (timed pairs, counting returns, the empty pair).
fn bpftrace_scripts(stack: &Stack) -> (String, String, String) {
    let (c, h) = (stack.cuda_lib.display(), stack.hip_lib.display());
    // One start-time map per function: the HIP call runs inside the CUDA
    // one on the same thread.
    let full = format!(
        "uprobe:{c}:cuLaunchKernel {{ @cs[tid] = nsecs; }} \
         uretprobe:{c}:cuLaunchKernel /@cs[tid]/ {{ @cr[retval] = count(); \
         @clat = hist(nsecs - @cs[tid]); delete(@cs[tid]); }} \
         uprobe:{h}:hipModuleLaunchKernel {{ @hs[tid] = nsecs; }} \
         uretprobe:{h}:hipModuleLaunchKernel /@hs[tid]/ {{ @hr[retval] = count(); \
         @hlat = hist(nsecs - @hs[tid]); delete(@hs[tid]); }}"
    );
    let counts = format!(
        "uretprobe:{c}:cuLaunchKernel {{ @cr[retval] = count(); }} \
         uretprobe:{h}:hipModuleLaunchKernel {{ @hr[retval] = count(); }}"
    );
    let floor = format!(
        "uprobe:{c}:cuLaunchKernel {{}} uretprobe:{c}:cuLaunchKernel {{}} \
         uprobe:{h}:hipModuleLaunchKernel {{}} uretprobe:{h}:hipModuleLaunchKernel {{}}"
    );
    (full, counts, floor)
}

/// What the daemon counted for `function` among the loop's processes.
fn counted(d: &Daemon, place: &Place, function: &str, timeout: Duration, pred: impl Fn(f64) -> bool) -> f64 {
    let mut labels: Vec<(&str, &str)> = place.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
    labels.push(("function", function));
    d.wait_metric(CALLS, &labels, timeout, pred)
}

pub(super) fn launch_case(env: &Env, plan: &Plan, out: &mut Vec<Row>) -> Result<()> {
    let n = plan.launch_calls;
    let stack = Stack::find(env)?;
    let mut rows = LaunchRows {
        not_sel: Row::new("launch_bound_not_selected", "ns/launch"),
        sel: Row::new("launch_bound_selected", "ns/launch"),
        timed: Row::new("launch_bound_selected_timed", "ns/launch"),
    };
    let entries = push_entries(&stack, &mut rows.sel)?;
    let place = launch_place(&mut rows.not_sel);
    let (configs, unsupported) = launch_configs(env, &mut rows);
    let mut runs = Runs::new(env, &stack, &place, n);

    step(&format!(
        "launch_bound_loop: cuda_app_standin --launch-loop {n} (cuLaunchKernel -> hipModuleLaunchKernel \
         of the HIP stand-in, {STANDIN_ITERS} iterations of work per launch), {} interleaved rounds",
        plan.launch_rounds
    ));
    let rounds = Rounds::run(&configs, plan.launch_rounds, "ns/launch", |cfg, round, _last| {
        let r = round + 1;
        let name = format!("cuda_app_standin-{}", cfg.label());
        match cfg {
            LaunchCfg::Bare => runs.bare(&name).map(Some),
            LaunchCfg::NotSelected => runs.not_selected(&name, r, &mut rows.not_sel),
            LaunchCfg::Selected => runs.selected(cfg, &name, r, &mut rows.sel),
            LaunchCfg::SelectedTimed => runs.selected(cfg, &name, r, &mut rows.timed),
            LaunchCfg::Bpftrace | LaunchCfg::BpftraceCounts | LaunchCfg::Floor => {
                runs.bpftrace(cfg, &name, r, &mut rows.sel.notes)
            }
        }
    })?;

    rows.not_selected_figures(&rounds, n);
    rows.selected_figures(&rounds, env, n);
    if !entries.is_empty() {
        rows.sel.notes.push(format!("first instructions: {}", entries.join("; ")));
    }
    if !runs.stop_times.is_empty() {
        rows.sel.notes.push(format!(
            "canaryscope run took a median {:.1} s to exit after SIGTERM",
            median(&runs.stop_times).unwrap_or(0.0)
        ));
    }
    out.extend([rows.not_sel, rows.sel, rows.timed]);
    if let Some(why) = unsupported {
        bail!(
            "the canaryscope configurations could not run: {} lacks hot-call selection ({why})",
            env.bin.display()
        );
    }
    Ok(())
}

/// The case's three rows: not selected, selected (counts), selected (timed).
struct LaunchRows {
    not_sel: Row,
    sel: Row,
    timed: Row,
}

/// The entries the loop's probes sit on must be shaped like the real ones,
/// or the floor and the selected figures mean something else: returns what
/// each starts with, and marks the selected row wrong for one that is not an
/// emulated push.
fn push_entries(stack: &Stack, sel: &mut Row) -> Result<Vec<String>> {
    let mut entries = Vec::new();
    for (lib, name) in [(&stack.cuda_lib, "cuLaunchKernel"), (&stack.hip_lib, "hipModuleLaunchKernel")] {
        let e = entry_of(lib, name)?;
        let what = format!("{name} ({}) starts with {}", lib.display(), e.text);
        eprintln!("    {what}");
        if e.push {
            entries.push(what);
        } else {
            sel.wrong(format!(
                "{what}: not an emulated push, so its uprobe is single-stepped and the figures do not \
                 show what a real runtime entry costs"
            ));
        }
    }
    Ok(entries)
}

/// The loop's own cgroup, or the bench's (noted) when none can be made.
fn launch_place(not_sel: &mut Row) -> Place {
    match own_cgroup(LAUNCH_CGROUP) {
        Ok((tree, procs, path)) => {
            Place { procs: Some(procs), labels: vec![("workload", path)], _tree: Some(tree) }
        }
        Err(e) => {
            let note = format!(
                "no cgroup of its own ({e:#}): the loop shares the bench's cgroup, where a GPU failure of \
                 any other process selects it too"
            );
            eprintln!("    {note}");
            not_sel.notes.push(note);
            Place { procs: None, labels: Vec::new(), _tree: None }
        }
    }
}

/// The configurations this daemon and this machine can run, and why the
/// daemon's own cannot, if it lacks hot-call selection.
fn launch_configs(env: &Env, rows: &mut LaunchRows) -> (Vec<LaunchCfg>, Option<String>) {
    let mut configs = vec![LaunchCfg::Bare];
    let unsupported = hot_calls_supported(env).err();
    match &unsupported {
        None => configs.extend([LaunchCfg::NotSelected, LaunchCfg::Selected, LaunchCfg::SelectedTimed]),
        Some(why) => {
            let note = format!(
                "{} does not take --hot-calls/--hot-window ({why}): the not-selected and selected \
                 configurations need a daemon with hot-call selection and were not run",
                env.bin.display()
            );
            eprintln!("    {note}");
            for row in [&mut rows.not_sel, &mut rows.timed, &mut rows.sel] {
                row.notes.push(note.clone());
            }
        }
    }
    if env.bpftrace.is_some() {
        configs.extend([LaunchCfg::BpftraceCounts, LaunchCfg::Bpftrace, LaunchCfg::Floor]);
    } else {
        for row in [&mut rows.sel, &mut rows.timed] {
            row.notes.push("bpftrace not installed: no peer and no empty-probe floor".into());
        }
    }
    (configs, unsupported)
}

/// One configuration's run of the loop in a round, and what every round
/// shares: the daemon's arguments, bpftrace's scripts, the daemons' stop
/// times.
struct Runs<'a> {
    env: &'a Env,
    stack: &'a Stack,
    place: &'a Place,
    n: u64,
    /// The daemon's defaults but for the libraries: hot calls of selected
    /// processes counted at return.
    daemon_args: Vec<String>,
    /// The same, with durations (`--hot-detail timed`).
    timed_args: Vec<String>,
    /// bpftrace: timed pairs, counting returns, the empty pair.
    scripts: (String, String, String),
    stop_times: Vec<f64>,
}

impl<'a> Runs<'a> {
    fn new(env: &'a Env, stack: &'a Stack, place: &'a Place, n: u64) -> Self {
        let (cuda, hip) = (stack.cuda_lib.to_string_lossy(), stack.hip_lib.to_string_lossy());
        let daemon_args: Vec<String> = ["--lib", &cuda, "--lib", &hip, "--hot-calls", "selected"]
            .iter()
            .map(|a| a.to_string())
            .collect();
        let mut timed_args = daemon_args.clone();
        timed_args.extend(["--hot-detail".to_string(), "timed".to_string()]);
        let scripts = bpftrace_scripts(stack);
        Runs { env, stack, place, n, daemon_args, timed_args, scripts, stop_times: Vec::new() }
    }

    fn daemon(&self, name: &str, args: &[String]) -> Result<Daemon> {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Daemon::start(self.env, name, &args)
    }

    fn bare(&mut self, name: &str) -> Result<f64> {
        let (s, p) = launch_run(self.env, self.stack, self.place, name, self.n, false, false)?;
        loop_figure(s, &p, self.n, 0.0)
    }

    /// The daemon on, the process's cuInit succeeding: its launches must
    /// stay unprobed.
    fn not_selected(&mut self, name: &str, r: usize, row: &mut Row) -> Result<Option<f64>> {
        let d = self.daemon("canaryscope-launch-not-selected", &self.daemon_args)?;
        let v = self.bare(name)?;
        // cuInit is cold (probed in every process): once it shows, the
        // daemon has the process; a moment more lets any launch record
        // behind it arrive before the launches are read.
        if counted(&d, self.place, "cuInit", Duration::from_secs(5), |c| c >= 1.0) < 1.0 {
            row.wrong(format!(
                "round {r}: the process's cuInit (a cold call) was never counted, so the launch count \
                 below proves nothing"
            ));
        }
        sleep(Duration::from_secs(1));
        for f in ["cuLaunchKernel", "hipModuleLaunchKernel"] {
            let c = counted(&d, self.place, f, Duration::ZERO, |_| true);
            if c != 0.0 {
                row.wrong(format!(
                    "round {r}: {c} {f} calls counted in a process that was never selected (its hot \
                     functions must stay unprobed)"
                ));
            }
        }
        self.stop_times.push(d.stop().as_secs_f64());
        Ok(Some(v))
    }

    /// The process selected by its failing cuInit, the loop run once both
    /// launch entries carry breakpoints; every launch must be counted.
    fn selected(&mut self, cfg: LaunchCfg, name: &str, r: usize, row: &mut Row) -> Result<Option<f64>> {
        let n = self.n;
        let args = if cfg == LaunchCfg::Selected { &self.daemon_args } else { &self.timed_args };
        let d = self.daemon(&format!("canaryscope-launch-{}", cfg.label()), args)?;
        let (s, p) = launch_run(self.env, self.stack, self.place, name, n, true, true)?;
        let text = p.output();
        if parse_field(&text, "hot") == Some(0.0) {
            let line = text.lines().find(|l| l.starts_with("hot=")).unwrap_or_default();
            row.wrong(format!(
                "round {r}: the process was not selected: its two launch entries did not both show a \
                 breakpoint within {WAIT_HOT_MS} ms of its failing cuInit ({line}); not measured in \
                 later rounds"
            ));
            self.stop_times.push(d.stop().as_secs_f64());
            return Ok(None);
        }
        let v = loop_figure(s, &p, n, INIT_FAILURE)?;
        for f in ["cuLaunchKernel", "hipModuleLaunchKernel"] {
            let c = counted(&d, self.place, f, Duration::from_secs(10), |c| c >= n as f64);
            if c != n as f64 {
                row.wrong(format!("round {r}: canaryscope counted {c} of {n} {f} calls"));
            }
        }
        self.stop_times.push(d.stop().as_secs_f64());
        Ok(Some(v))
    }

    /// A bpftrace peer or the empty-pair floor around the loop; a peer
    /// that counted fewer returns than launches is noted.
    fn bpftrace(
        &mut self,
        cfg: LaunchCfg,
        name: &str,
        r: usize,
        notes: &mut Vec<String>,
    ) -> Result<Option<f64>> {
        let n = self.n;
        let (full, counts, floor) = &self.scripts;
        let script = match cfg {
            LaunchCfg::Bpftrace => full,
            LaunchCfg::BpftraceCounts => counts,
            _ => floor,
        };
        let probes = if cfg == LaunchCfg::BpftraceCounts { 2 } else { 4 };
        let started = start_bpftrace(self.env, &format!("bpftrace-launch-{}", cfg.label()), script, probes);
        let Some(mut bt) = peer_or_note(started, &format!("bpftrace ({})", cfg.label()), notes) else {
            return Ok(None);
        };
        let v = self.bare(name)?;
        let (took, killed) = bt.stop();
        if killed {
            notes.push(format!("bpftrace ({}) had to be SIGKILLed", cfg.label()));
        } else if cfg != LaunchCfg::Floor {
            let text = bt.output();
            for map in ["@cr[0]:", "@hr[0]:"] {
                let c = text
                    .lines()
                    .find_map(|l| l.trim().strip_prefix(map)?.trim().parse::<u64>().ok())
                    .unwrap_or(0);
                if c < n {
                    notes.push(format!("round {r}: bpftrace {map} counted {c} of {n} calls"));
                }
            }
        }
        eprintln!("    bpftrace ({}) took {took:.1?} to exit", cfg.label());
        Ok(Some(v))
    }
}

impl LaunchRows {
    /// The not-selected row: its median against bare, and its target.
    fn not_selected_figures(&mut self, rounds: &Rounds<LaunchCfg>, n: u64) {
        let bare = rounds.median(LaunchCfg::Bare);
        let row = &mut self.not_sel;
        row.baseline = bare;
        row.canaryscope = rounds.median(LaunchCfg::NotSelected);
        row.ratio("canaryscope_vs_baseline", div(row.canaryscope, bare));
        row.target = Some(Target::new(
            "process not selected: within 2% of bare (canaryscope/bare ≤ 1.02)",
            1.02,
            div(row.canaryscope, bare),
            "",
        ));
        rounds.add_samples_of(row, &[LaunchCfg::Bare, LaunchCfg::NotSelected]);
        row.notes.push(format!(
            "N={n} launches per run; canaryscope = `canaryscope run --lib <both libraries> --hot-calls \
             selected`, a new daemon per round, the process's cuInit succeeding: its launches must stay \
             unprobed (counted: 0)"
        ));
    }

    /// The two selected rows against bare, their bpftrace peers and the
    /// empty-pair floor; the default's target.
    fn selected_figures(&mut self, rounds: &Rounds<LaunchCfg>, env: &Env, n: u64) {
        let bare = rounds.median(LaunchCfg::Bare);
        let floor = rounds.median(LaunchCfg::Floor);
        for (row, ours, peer) in [
            (&mut self.sel, LaunchCfg::Selected, LaunchCfg::BpftraceCounts),
            (&mut self.timed, LaunchCfg::SelectedTimed, LaunchCfg::Bpftrace),
        ] {
            row.baseline = bare;
            row.canaryscope = rounds.median(ours);
            row.peer = rounds.median(peer);
            row.floor = floor;
            if env.bpftrace.is_some() {
                row.peer_tool = Some("bpftrace".into());
            }
            row.ratio("canaryscope_vs_floor", div(row.canaryscope, floor));
            row.ratio("canaryscope_vs_baseline", div(row.canaryscope, bare));
            row.ratio("canaryscope_vs_peer", div(row.canaryscope, row.peer));
            row.ratio("peer_vs_floor", div(row.peer, floor));
            row.ratio("floor_vs_baseline", div(floor, bare));
            rounds.add_samples_of(row, &[LaunchCfg::Bare, ours, peer, LaunchCfg::Floor]);
        }
        self.sel.target = Some(Target::new(
            "process selected, the daemon's default --hot-detail counts: within 10% of the empty-pair \
             floor (canaryscope/floor ≤ 1.10)",
            1.10,
            div(self.sel.canaryscope, floor),
            "",
        ));
        let common = format!(
            "N={n} launches per run, each cuLaunchKernel (ZLUDA-shaped) -> hipModuleLaunchKernel (HIP \
             stand-in, {STANDIN_ITERS} iterations of work); canaryscope = the daemon, the process's \
             cuInit failing first and the loop starting once it sees breakpoints on both entries \
             (--wait-hot {WAIT_HOT_MS}); floor = empty uprobe+uretprobe pair on both functions (bpftrace)"
        );
        self.sel.notes.push(format!(
            "{common}; --hot-detail counts (the default): a counting return probe on both; peer = bpftrace \
             uretprobes on both counting per return value"
        ));
        self.timed.notes.push(format!(
            "{common}; --hot-detail timed (opt-in: durations, stalls, the call a crash was in): an entry \
             and a return probe on both; peer = bpftrace uprobe+uretprobe pairs on both counting per \
             return value with a latency histogram; no target of its own: the 1.10 target is the default's"
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::decode_entry;

    #[test]
    fn register_pushes_are_pushes_and_the_rest_is_shown_as_bytes() {
        let e = decode_entry(&[0x55, 0x48, 0x89, 0xe5]);
        assert!(e.push && e.text == "`push %rbp`", "{}", e.text);
        let e = decode_entry(&[0x41, 0x57, 0x41, 0x56]);
        assert!(e.push && e.text == "`push %r15`", "{}", e.text);
        let e = decode_entry(&[0xf3, 0x0f, 0x1e, 0xfa]);
        assert!(!e.push && e.text.starts_with("`endbr64`"), "{}", e.text);
        let e = decode_entry(&[0x48, 0x85, 0xff, 0x74]);
        assert!(!e.push && e.text == "not a push (48 85 ff 74)", "{}", e.text);
        // A push of an immediate is not one the kernel emulates.
        assert!(!decode_entry(&[0x6a, 0x03]).push);
    }
}
