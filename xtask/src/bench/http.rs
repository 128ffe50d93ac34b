//! `http_overhead`: what the request hooks add to a keep-alive HTTP server
//! on loopback, in CPU per request and in p99 latency.
//!
//! nginx (Debian's nginx-light, one worker) answers `200 ok` to wrk (two
//! threads, 16 keep-alive connections) as fast as the machine allows, in a
//! cgroup the daemon follows as a pod's (`--cgroup`) and in one it does not
//! (a system service's). Three ways, rounds interleaved: bare, under
//! `canaryscope run` without the request hooks (`--probes gpu,kfd,cpu,exits`)
//! and with them (all families); and the floor, in the followed cgroup
//! only: two empty programs on the same hooks and no daemon (empty_skb.rs).
//! CPU is the whole machine's busy time over the run (`/proc/stat`): the
//! server, wrk, the kernel's programs and the daemon's parsing alike, per
//! request wrk completed. Targets: outside pods the hooks add at most 1%
//! over canaryscope without them; in a pod their added CPU per request is
//! at most 1.2x the floor's over bare (http_floor.rs, beside Beyla's
//! published 500 ns), and their added p99 at most 2%.
use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context, Result};

use super::{
    bpf_stats::program_runs,
    cgroups::{own_cgroup, HTTP_POD_CGROUP, HTTP_SYSTEM_CGROUP},
    daemon::{metric_sum, Daemon},
    div,
    empty_skb::{SkbBody, SkbPair},
    http_config::{Gathered, HttpCfg, Place, Tool},
    process::process_cpu_ms,
    rounds::Rounds,
    step, Env, Plan, Row, Target,
};

const SIGQUIT: i32 = 3;

/// nginx answering on `port`, its master put in the cgroup of `procs`
/// before it forks its worker; stopped when dropped.
struct Nginx(Child);

impl Nginx {
    fn start(dir: &Path, procs: &Path, port: u16) -> Result<Nginx> {
        let conf = dir.join("nginx.conf");
        fs::write(
            &conf,
            format!(
                "daemon off; worker_processes 1; pid {pid}; error_log stderr crit;\n\
                 events {{ worker_connections 1024; }}\n\
                 http {{ access_log off; keepalive_requests 1000000;\n\
                 server {{ listen 127.0.0.1:{port}; location / {{ return 200 \"ok\\n\"; }} }} }}\n",
                pid = dir.join("nginx.pid").display()
            ),
        )?;
        let script =
            format!("echo $$ > {}; exec nginx -c {} -p {}", procs.display(), conf.display(), dir.display());
        let child = Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("nginx (Debian's nginx-light) runs")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if Instant::now() > deadline {
                bail!("nginx did not listen on {port}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Nginx(child))
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SAFETY: kill(2) takes plain integers; the master is our child, not
        // reaped yet. SIGQUIT stops it and its worker gracefully.
        unsafe { super::process::kill(self.0.id() as i32, SIGQUIT) };
        let _ = self.0.wait();
    }
}

/// The machine's busy jiffies so far (user, nice, system, irq, softirq, steal).
fn busy_jiffies() -> Result<u64> {
    let stat = fs::read_to_string("/proc/stat")?;
    let cpu = stat.lines().next().ok_or_else(|| anyhow!("/proc/stat is empty"))?;
    let fields: Vec<u64> = cpu.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    Ok([0, 1, 2, 5, 6, 7].iter().filter_map(|i| fields.get(*i)).sum())
}

/// What one wrk run measured.
struct WrkRun {
    /// The machine's busy CPU per request completed.
    cpu_ns: f64,
    requests: f64,
    rate: f64,
    p99_us: f64,
}

fn wrk(port: u16, secs: u64) -> Result<WrkRun> {
    let ticks = 100.0; // USER_HZ on Linux
    let before = busy_jiffies()?;
    let out = Command::new("wrk")
        .args(["-t2", "-c16", &format!("-d{secs}s"), "--latency", &format!("http://127.0.0.1:{port}/")])
        .output()
        .context("wrk runs")?;
    let busy = (busy_jiffies()? - before) as f64 / ticks;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |prefix: &str| {
        text.lines().find(|l| l.trim_start().starts_with(prefix)).and_then(|l| l.split_whitespace().nth(1))
    };
    let requests: f64 = text
        .lines()
        .find(|l| l.contains("requests in"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .ok_or_else(|| anyhow!("wrk printed no request count: {text}"))?;
    let rate: f64 = field("Requests/sec:").and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let p99 = field("99%").and_then(micros).ok_or_else(|| anyhow!("wrk printed no p99: {text}"))?;
    Ok(WrkRun { cpu_ns: busy * 1e9 / requests, requests, rate, p99_us: p99 })
}

/// wrk's `812.00us`, `1.20ms`, `2.00s` in microseconds.
fn micros(v: &str) -> Option<f64> {
    let (n, scale) = if let Some(n) = v.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = v.strip_suffix("ms") {
        (n, 1e3)
    } else {
        (v.strip_suffix('s')?, 1e6)
    };
    n.parse::<f64>().ok().map(|n| n * scale)
}

/// What one case's runs share.
struct Setup<'a> {
    env: &'a Env,
    dir: PathBuf,
    pod_dir: PathBuf,
    pod_procs: PathBuf,
    pod_rel: String,
    system_procs: PathBuf,
    secs: u64,
}

impl Setup<'_> {
    /// One timed run of `cfg`: its CPU ns per request.
    fn run(&self, cfg: HttpCfg, last: bool, gathered: &mut Gathered) -> Result<f64> {
        let HttpCfg(tool, place) = cfg;
        let procs = if place == Place::Pod { &self.pod_procs } else { &self.system_procs };
        let port = super::daemon::free_port()?;
        let server = Nginx::start(&self.dir, procs, port)?;
        // Only in the pod's cgroup, where the daemon attaches its hooks.
        let floor = match cfg {
            HttpCfg(Tool::Floor, Place::Pod) => Some(SkbPair::attach(&self.pod_dir, SkbBody::Empty)?),
            HttpCfg(Tool::Least, Place::Pod) => Some(SkbPair::attach(&self.pod_dir, SkbBody::Clock)?),
            _ => None,
        };
        let probes = match tool {
            Tool::WithoutHooks => Some("gpu,kfd,cpu,exits"),
            Tool::WithHooks => Some("gpu,kfd,cpu,exits,http"),
            Tool::Bare | Tool::Floor | Tool::Least => None,
        };
        let daemon = match probes {
            Some(p) => Some(Daemon::start(
                self.env,
                "canaryscope-http",
                &["--cgroup", &self.pod_rel, "--probes", p],
            )?),
            None => None,
        };
        let daemon_before = daemon.as_ref().and_then(|d| process_cpu_ms(d.pid()));
        let run = wrk(port, self.secs)?;
        if let (Some(before), Some(after)) =
            (daemon_before, daemon.as_ref().and_then(|d| process_cpu_ms(d.pid())))
        {
            gathered.daemon_cpu.entry(cfg).or_default().push((after - before) * 1e6 / run.requests);
        }
        if let (Tool::WithHooks, Some(d)) = (tool, &daemon) {
            let lost = metric_sum(&d.metrics()?, "canaryscope_node_http_segments_lost_total", &[]);
            *gathered.segments_lost.entry(cfg).or_default() += lost;
        }
        // The programs' own time, from a run of its own: the statistics
        // add clock reads to every program run.
        let profiled = matches!(cfg, HttpCfg(Tool::WithHooks | Tool::Floor | Tool::Least, Place::Pod));
        if last && profiled {
            let pid = daemon.as_ref().map_or(std::process::id(), Daemon::pid);
            let mut requests = 0.0;
            let programs = program_runs(self.env, pid, || {
                requests = wrk(port, self.secs)?.requests;
                Ok(())
            })?;
            if let Some(programs) = programs {
                gathered.programs.insert(cfg, (programs, requests));
            }
        }
        if let Some(d) = daemon {
            d.stop();
        }
        drop(floor);
        drop(server);
        gathered.p99s.entry(cfg).or_default().push(run.p99_us);
        gathered.rates.entry(cfg).or_default().push(run.rate);
        Ok(run.cpu_ns)
    }
}

pub(super) fn http_case(env: &Env, plan: &Plan, out: &mut Vec<Row>) -> Result<()> {
    let (pod_tree, pod_procs, pod_rel) = own_cgroup(HTTP_POD_CGROUP)?;
    let (_system_tree, system_procs, _) = own_cgroup(HTTP_SYSTEM_CGROUP)?;
    let secs = if plan.quick { 2 } else { 8 };
    let rounds = if plan.quick { 1 } else { plan.sched_rounds };
    let setup = Setup {
        env,
        dir: env.out.join("http"),
        pod_dir: pod_tree.dir.clone(),
        pod_procs,
        pod_rel,
        system_procs,
        secs,
    };
    fs::create_dir_all(&setup.dir)?;
    let mut configs: Vec<HttpCfg> = [Tool::Bare, Tool::WithoutHooks, Tool::WithHooks]
        .iter()
        .flat_map(|t| [HttpCfg(*t, Place::Pod), HttpCfg(*t, Place::System)])
        .collect();
    configs.push(HttpCfg(Tool::Floor, Place::Pod));
    configs.push(HttpCfg(Tool::Least, Place::Pod));
    step(&format!(
        "http_overhead: nginx under wrk for {secs} s, in a followed and an unfollowed cgroup, and under \
         empty programs on the followed one's hooks, {rounds} rounds"
    ));
    let mut gathered = Gathered::default();
    let result = Rounds::run(&configs, rounds, "CPU ns/request", |cfg, _, last| {
        setup.run(cfg, last, &mut gathered).map(Some)
    })?;
    for place in [Place::Pod, Place::System] {
        out.push(overhead_row(&result, &gathered, place, secs));
    }
    out.push(super::http_floor::floor_row(&result, &gathered, secs));
    Ok(())
}

/// The hooks against canaryscope without them, in one placement.
fn overhead_row(result: &Rounds<HttpCfg>, gathered: &Gathered, place: Place, secs: u64) -> Row {
    let med = |m: &BTreeMap<HttpCfg, Vec<f64>>, c| m.get(&c).and_then(|v| super::median(v));
    let name = if place == Place::Pod { "http_overhead_pod" } else { "http_overhead_system" };
    let mut row = Row::new(name, "CPU ns/request");
    row.baseline = result.median(HttpCfg(Tool::WithoutHooks, place));
    row.canaryscope = result.median(HttpCfg(Tool::WithHooks, place));
    let added = row.canaryscope.zip(row.baseline).map(|(c, b)| c - b);
    row.ratio("hooks_added_cpu_ns_per_request", added);
    row.ratio("hooks_vs_without", div(row.canaryscope, row.baseline));
    row.ratio("without_hooks_vs_bare", div(row.baseline, result.median(HttpCfg(Tool::Bare, place))));
    let p99_ratio = div(
        med(&gathered.p99s, HttpCfg(Tool::WithHooks, place)),
        med(&gathered.p99s, HttpCfg(Tool::WithoutHooks, place)),
    );
    row.ratio("hooks_p99_vs_without", p99_ratio);
    row.ratio("requests_per_s_with_hooks", med(&gathered.rates, HttpCfg(Tool::WithHooks, place)));
    row.ratio("segments_lost", gathered.segments_lost.get(&HttpCfg(Tool::WithHooks, place)).copied());
    row.target = Some(match place {
        Place::Pod => Target::new("in a pod: added p99 ≤ 2% (hooks/without ≤ 1.02)", 1.02, p99_ratio, ""),
        Place::System => Target::new(
            "outside pods: the hooks add ≤ 1% CPU per request (hooks/without ≤ 1.01)",
            1.01,
            div(row.canaryscope, row.baseline),
            "",
        ),
    });
    result.add_samples_of(
        &mut row,
        &[HttpCfg(Tool::Bare, place), HttpCfg(Tool::WithoutHooks, place), HttpCfg(Tool::WithHooks, place)],
    );
    row.notes.push(format!(
        "nginx-light (1 worker) answering `200 ok` to wrk -t2 -c16 for {secs} s on loopback; CPU is the \
         machine's busy time per request wrk completed; Beyla publishes about 500 ns per request"
    ));
    row
}
