//! `dlopen_startup`: what an ordinary process that loads many shared
//! objects at start pays while `canaryscope trace` runs with its default
//! probes (every family, as the daemon's): the `dlopen`/`dlmopen` entry and
//! return probes on libc, and discovery's programs on every `mmap` (the
//! filter that looks for a GPU runtime file's name on each executable
//! mapping, the memory-limit hooks) and `exec`. None of these objects is a
//! GPU library, so nothing is probed for them: this is the cost every
//! non-GPU process pays.
//!
//! Two processes, each timed from spawn to exit:
//! - The issue's shape, and its target: a real Python import of over 500
//!   shared objects. Every module of scikit-learn, scikit-image, SciPy,
//!   pandas, pyarrow, h5py, astropy, NumPy and Pillow, then
//!   `statsmodels.api`, from wheels pinned here and installed once into the
//!   fixtures folder (about 200 MB downloaded). Target ≤ 1.02, required: a
//!   miss fails the bench (never the test suite: the smoke run leaves this
//!   case out).
//! - The worst case, reported beside it: `many_libs_loader`
//!   (tests/fixtures/many_libs_loader.c) opening 500 distinct generated
//!   objects (RTLD_NOW) and exiting. It does nothing but load, so every
//!   added microsecond per `dlopen` shows undiluted. A bare `dlopen` there
//!   takes about 40 µs, so 2% is 0.8 µs, about one uprobe trap: no probe
//!   on `dlopen`'s entry can meet it. The same 1.02 line is printed, met or
//!   missed, as information.
//!
//! Bare and traced blocks alternate (A/B, then B/A in the next round), a
//! tracer started for each traced block and stopped, its probes released by
//! the kernel, before the next bare one; each block's first run is a
//! discarded warm-up. The row reports min/median/max of each side and the
//! ratio of medians.
use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{bail, Context, Result};

use super::{
    bpf_stats::profile_programs, div, first_call::start_tracer, median, process::process_cpu_ms, report::num,
    step, stop::stop_and_await_release, Env, Plan, Row, Target,
};
use crate::{root, run};

/// Objects the generated loader opens (the fixture Makefile's MANY_LIBS_COUNT).
const OBJECTS: usize = 500;

/// The wheels of the import, pinned with every dependency so that each run
/// of the bench imports the same code (installed with `--no-deps`).
const PYTHON_WHEELS: &[&str] = &[
    "astropy==8.0.2",
    "astropy_iers_data==0.2026.11.16.0.37.44",
    "cloudpickle==3.1.3",
    "h5py==3.16.0",
    "imageio==2.38.2",
    "joblib==1.6.0",
    "lazy_loader==0.6",
    "narwhals==2.29.0",
    "networkx==3.6.1",
    "numpy==2.4.6",
    "packaging==26.4",
    "pandas==3.1.1",
    "patsy==1.0.3",
    "pillow==13.0.0",
    "pyarrow==26.0.1",
    "pyerfa==2.0.1.5",
    "python-dateutil==2.9.0.post0",
    "pyyaml==6.0.4",
    "scikit-image==0.26.0",
    "scikit-learn==1.9.1",
    "scipy==1.17.1",
    "six==1.17.0",
    "statsmodels==0.14.6",
    "threadpoolctl==3.8.0",
    "tifffile==2026.3.3",
    "tzdata==2026.6",
];

/// Packages whose every module the import loads.
const PYTHON_PACKAGES: &[&str] =
    &["sklearn", "skimage", "scipy", "pandas", "pyarrow", "h5py", "astropy", "numpy", "PIL"];

/// Shared objects the import must map to be the issue's shape.
const PYTHON_OBJECTS_WANTED: f64 = 500.0;

/// The import: argv[1] is the wheels' folder, the rest are packages whose
/// modules are all imported (test suites and command-line entry points
/// aside); it prints how many shared objects the interpreter then maps.
const PYTHON_IMPORT: &str = r#"
import importlib, os, pkgutil, sys, warnings
sys.path.insert(0, sys.argv[1])
warnings.filterwarnings("ignore")
skipped = (".tests", ".testing", "conftest", "__main__", "f2py")
failed = 0
for top in sys.argv[2:]:
    package = importlib.import_module(top)
    for module in pkgutil.walk_packages(package.__path__, top + ".", onerror=lambda name: None):
        if any(part in module.name for part in skipped):
            continue
        try:
            importlib.import_module(module.name)
        except Exception:
            failed += 1
import statsmodels.api
objects = set()
with open("/proc/self/maps") as maps:
    for line in maps:
        fields = line.split()
        if len(fields) >= 6 and ".so" in fields[5]:
            objects.add(fields[5])
os.write(1, b"\nobjects=%d failed_modules=%d\n" % (len(objects), failed))
"#;

/// What the bench's reaped children have used so far (getrusage(2)).
#[repr(C)]
struct Rusage {
    utime: [i64; 2],
    stime: [i64; 2],
    rest: [i64; 14],
}

const RUSAGE_CHILDREN: i32 = -1;

extern "C" {
    fn getrusage(who: i32, usage: *mut Rusage) -> i32;
}

/// CPU ms (user and system) of the children reaped so far.
fn children_cpu_ms() -> f64 {
    let mut usage = Rusage { utime: [0; 2], stime: [0; 2], rest: [0; 14] };
    // SAFETY: getrusage fills the struct, whose layout is Linux x86_64's
    // struct rusage (two timevals, fourteen longs).
    if unsafe { getrusage(RUSAGE_CHILDREN, &mut usage) } != 0 {
        return f64::NAN;
    }
    let ms = |tv: [i64; 2]| tv[0] as f64 * 1e3 + tv[1] as f64 / 1e3;
    ms(usage.utime) + ms(usage.stime)
}

/// The figures of one side: wall and CPU ms per run.
#[derive(Default)]
struct Side {
    wall: Vec<f64>,
    cpu: Vec<f64>,
}

/// One process to time: how to start it and what its output must say.
struct Workload {
    row: &'static str,
    what: String,
    program: PathBuf,
    args: Vec<String>,
    /// Timed runs per block.
    runs: usize,
    /// Whether the 1.02 line is the bench's gate (the issue's shape) or
    /// printed for information (the worst case).
    required: bool,
}

impl Workload {
    /// One run: spawn to exit in ms, its CPU ms, its `objects=`/`loaded=` figure.
    fn run_once(&self) -> Result<(f64, f64, Option<f64>)> {
        let cpu_before = children_cpu_ms();
        let started = Instant::now();
        let out = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .with_context(|| format!("cannot start {}", self.program.display()))?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        let cpu = children_cpu_ms() - cpu_before;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            bail!("{} failed ({}): {text}{}", self.what, out.status, String::from_utf8_lossy(&out.stderr));
        }
        let objects =
            super::process::parse_field(&text, "objects").or(super::process::parse_field(&text, "loaded"));
        Ok((ms, cpu, objects))
    }

    /// A discarded warm-up run, then `runs` timed ones.
    fn block(&self, into: &mut Side) -> Result<Option<f64>> {
        let (_, _, mut objects) = self.run_once()?;
        for _ in 0..self.runs {
            let (ms, cpu, seen) = self.run_once()?;
            into.wall.push(ms);
            into.cpu.push(cpu);
            objects = seen.or(objects);
        }
        Ok(objects)
    }
}

/// Builds the loader and its objects (once; the suite's fixture step
/// leaves them out to keep its time).
fn generated_loader(env: &Env, runs: usize) -> Result<Workload> {
    run(Command::new("make")
        .args(["-s", "-C"])
        .arg(root().join("tests/fixtures"))
        .arg(format!("OUT={}", env.fixtures.display()))
        .arg(format!("MANY_LIBS_COUNT={OBJECTS}"))
        .arg("many-libs"))?;
    let dir = env.fixture("many-libs");
    Ok(Workload {
        row: "dlopen_startup_500_objects",
        what: format!("many_libs_loader opening {OBJECTS} generated objects (RTLD_NOW)"),
        program: dir.join("many_libs_loader"),
        args: vec![dir.display().to_string(), OBJECTS.to_string()],
        runs,
        required: false,
    })
}

/// The Python import: the pinned wheels installed once into the fixtures
/// folder (a stamp names the pins it holds), run by the interpreter itself,
/// not a wrapper such as pyenv's shim, whose shell scripts would add a
/// dozen execs to every run.
fn python_import(env: &Env, runs: usize) -> Result<Workload> {
    let found = Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .stderr(Stdio::inherit())
        .output()
        .context("python3 is needed for the import case (scripts/setup.sh installs it)")?;
    if !found.status.success() {
        bail!("python3 cannot start: {}", found.status);
    }
    let interpreter = String::from_utf8_lossy(&found.stdout).trim().to_string();
    let wheels = env.fixture("python-import");
    let stamp = wheels.join(".pins");
    let pins = PYTHON_WHEELS.join(" ");
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(pins.as_str()) {
        step(&format!(
            "dlopen_startup: installing {} pinned wheels for the import (once)",
            PYTHON_WHEELS.len()
        ));
        let _ = std::fs::remove_dir_all(&wheels);
        run(Command::new(&interpreter)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "--target"])
            .arg(&wheels)
            .args(PYTHON_WHEELS))?;
        std::fs::write(&stamp, &pins).with_context(|| format!("cannot write {}", stamp.display()))?;
    }
    let mut args = vec!["-c".to_string(), PYTHON_IMPORT.to_string(), wheels.display().to_string()];
    args.extend(PYTHON_PACKAGES.iter().map(|p| p.to_string()));
    Ok(Workload {
        row: "dlopen_startup_python_import",
        what: format!("{interpreter} importing every module of {}", PYTHON_PACKAGES.join(", ")),
        program: PathBuf::from(interpreter),
        args,
        runs,
        required: true,
    })
}

pub(super) fn dlopen_case(env: &Env, plan: &Plan, out: &mut Vec<Row>) -> Result<()> {
    let rounds = if plan.quick { 2 } else { plan.sched_rounds.max(2) };
    let python = python_import(env, if plan.quick { 1 } else { 3 })?;
    measure(env, &python, rounds, out)?;
    out.push(program_time(env, &python)?);
    let loader = generated_loader(env, if plan.quick { 10 } else { 40 })?;
    measure(env, &loader, rounds, out)?;
    out.push(program_time(env, &loader)?);
    Ok(())
}

/// Alternating bare and traced blocks of `work`, `rounds` of each.
fn measure(env: &Env, work: &Workload, rounds: usize, out: &mut Vec<Row>) -> Result<()> {
    step(&format!(
        "dlopen_startup: {}, {rounds} rounds of {} bare and {} traced runs",
        work.what, work.runs, work.runs
    ));
    let mut row = Row::new(work.row, "ms start-up");
    let (mut bare, mut traced) = (Side::default(), Side::default());
    let mut objects = None;
    // The tracer's own CPU per run, on the other CPU: what the node pays
    // beside the process (its exec's and mappings' handling, and that of
    // any other process starting on the host meanwhile).
    let mut tracer_cpu = Vec::new();
    for round in 0..rounds {
        // A/B, then B/A: drift within a round falls on both sides.
        for traced_block in [round % 2 == 1, round % 2 == 0] {
            let t = Instant::now();
            if traced_block {
                let mut tracer = start_tracer(env, "trace-dlopen", &["--log-level", "info"])?;
                let cpu_before = process_cpu_ms(tracer.pid());
                let seen = work.block(&mut traced)?;
                if let (Some(before), Some(after)) = (cpu_before, process_cpu_ms(tracer.pid())) {
                    // The block's warm-up run counts too.
                    tracer_cpu.push((after - before) / (work.runs + 1) as f64);
                }
                objects = objects.or(seen);
                // The libc probes exist from the tracer's first scan; a
                // tracer without them would measure nothing here.
                if !tracer.output().contains("at dlopen (") {
                    row.wrong(format!("round {}: the tracer probed no libc at dlopen", round + 1));
                }
                stop_and_await_release(&mut tracer)?;
            } else {
                objects = work.block(&mut bare)?.or(objects);
            }
            let side = if traced_block { &traced } else { &bare };
            let block = &side.wall[side.wall.len() - work.runs..];
            eprintln!(
                "    round {}/{rounds} {:<7} median {} ms of {} runs ({:.1?})",
                round + 1,
                if traced_block { "traced" } else { "bare" },
                super::report::opt(median(block)),
                work.runs,
                t.elapsed()
            );
        }
    }
    summarise(&mut row, work, &bare, &traced, objects);
    row.ratio("tracer_cpu_ms_per_run", median(&tracer_cpu));
    out.push(row);
    Ok(())
}

/// The diagnostic row: the tracer's in-kernel program time per loader
/// run, by program, from a pass of its own with the statistics on. The
/// programs are system-wide, so other work on the host adds runs too.
fn program_time(env: &Env, work: &Workload) -> Result<Row> {
    let mut row = Row::new(&format!("{}_bpf_prog_time", work.row), "ns per process");
    let mut tracer = start_tracer(env, "trace-dlopen-stats", &[])?;
    let runs = work.runs as u64;
    let profile = profile_programs(env, tracer.pid(), || {
        for _ in 0..runs {
            work.run_once()?;
        }
        Ok(())
    });
    stop_and_await_release(&mut tracer)?;
    if let Some((ns, lines)) = profile? {
        row.canaryscope = Some(ns as f64 / runs as f64);
        row.notes.push(format!(
            "{runs} runs of {} with kernel.bpf_stats_enabled; counts are totals over the runs \
             (other processes on the host included)",
            work.what
        ));
        row.notes.extend(lines);
    }
    Ok(row)
}

fn min_median_max(v: &[f64]) -> String {
    let min = v.iter().copied().reduce(f64::min).unwrap_or(f64::NAN);
    let max = v.iter().copied().reduce(f64::max).unwrap_or(f64::NAN);
    format!("{} / {} / {}", num(min), super::report::opt(median(v)), num(max))
}

fn summarise(row: &mut Row, work: &Workload, bare: &Side, traced: &Side, objects: Option<f64>) {
    row.baseline = median(&bare.wall);
    row.canaryscope = median(&traced.wall);
    let ratio = div(row.canaryscope, row.baseline);
    row.ratio("traced_vs_bare", ratio);
    if work.required && objects.is_none_or(|n| n < PYTHON_OBJECTS_WANTED) {
        row.wrong(format!(
            "the import mapped {} shared objects, fewer than the {PYTHON_OBJECTS_WANTED} the case is for",
            objects.map(|n| format!("{n:.0}")).unwrap_or_else(|| "an unknown number of".into())
        ));
    }
    if let (Some(n), Some(c), Some(b)) = (objects, row.canaryscope, row.baseline) {
        row.ratio("added_us_per_object", Some((c - b) * 1e3 / n));
    }
    // CPU time is steadier than wall time on a busy host; it leaves out
    // the tracer's own work on the other CPU.
    row.ratio("cpu_traced_vs_bare", div(median(&traced.cpu), median(&bare.cpu)));
    let target = Target::new("start-up with canaryscope ≤ 1.02 × bare (medians)", 1.02, ratio, "");
    row.target = Some(if work.required { target.required() } else { target });
    row.samples.push(("bare".into(), bare.wall.clone()));
    row.samples.push(("traced".into(), traced.wall.clone()));
    row.samples.push(("bare_cpu".into(), bare.cpu.clone()));
    row.samples.push(("traced_cpu".into(), traced.cpu.clone()));
    row.notes.push(format!(
        "{}: {} objects mapped; {} runs each side; min / median / max ms, spawn to exit: bare {}, \
         traced {}; CPU (user+system): bare {}, traced {}",
        work.what,
        objects.map(|n| format!("{n:.0}")).unwrap_or_else(|| "?".into()),
        bare.wall.len(),
        min_median_max(&bare.wall),
        min_median_max(&traced.wall),
        min_median_max(&bare.cpu),
        min_median_max(&traced.cpu)
    ));
}
