//! `http_hooks_vs_floor`: the request hooks' added CPU per request in a
//! followed pod against the floor's (two empty programs on the same hooks,
//! empty_skb.rs), and where the hooks' cost goes.
//!
//! - The hooks' added CPU: canaryscope with them minus canaryscope without
//!   them, both in the pod's cgroup (the daemon's other families cost the
//!   same in both, so they cancel).
//! - The floor's: the empty programs minus bare, in the same cgroup, in
//!   the same interleaved rounds.
//! - The split: the hooks' programs in the kernel (their run time with
//!   `kernel.bpf_stats_enabled`, from a run of its own in the last round),
//!   the daemon's own CPU (user and system time of its process, with the
//!   hooks minus without: the ring's reading and the HTTP parsing), and
//!   the rest, what neither shows: the hook dispatch around the programs,
//!   the caches the copies evict, and the run's noise.
use super::{
    empty_skb::SkbBody,
    http_config::{Gathered, HttpCfg, Place, Tool},
    median,
    rounds::Rounds,
    Row, Target,
};

/// What the issue allows the hooks over the empty programs.
const FLOOR_LIMIT: f64 = 1.2;
/// The hooks' programs as bpftool names them (observer/src/probes/http.rs).
const HOOK_PROGRAMS: [&str; 2] = ["http_ingress", "http_egress"];
/// Beyla's published CPU per request, for comparison (not run here).
const BEYLA_NS_PER_REQUEST: f64 = 500.0;

/// The named programs' run time per request, from a profiled run.
fn program_ns_per_request(gathered: &Gathered, cfg: HttpCfg, names: &[&str]) -> Option<f64> {
    let (programs, requests) = gathered.programs.get(&cfg)?;
    let ns: u64 = programs.iter().filter(|p| names.contains(&p.name.as_str())).map(|p| p.ns).sum();
    (*requests > 0.0).then(|| ns as f64 / requests)
}

pub(super) fn floor_row(result: &Rounds<HttpCfg>, gathered: &Gathered, secs: u64) -> Row {
    let pod = |tool| HttpCfg(tool, Place::Pod);
    let minus = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a - b);
    let mut row = Row::new("http_hooks_vs_floor", "added CPU ns/request (pod)");
    row.canaryscope = minus(result.median(pod(Tool::WithHooks)), result.median(pod(Tool::WithoutHooks)));
    row.floor = minus(result.median(pod(Tool::Floor)), result.median(pod(Tool::Bare)));
    row.peer = Some(BEYLA_NS_PER_REQUEST);
    row.peer_tool = Some("Beyla, published; not run here".into());
    let kernel = program_ns_per_request(gathered, pod(Tool::WithHooks), &HOOK_PROGRAMS);
    let floor_kernel = program_ns_per_request(gathered, pod(Tool::Floor), &SkbBody::Empty.names());
    let least_kernel = program_ns_per_request(gathered, pod(Tool::Least), &SkbBody::Clock.names());
    // Two empty programs add tens of ns to a request of about 16 µs, within
    // the noise of the machine's CPU per request. Their run time with the
    // statistics on counts the statistics' own clock reads, so it over-states
    // them: the larger of the two is a floor that can only favour the hooks.
    let floor = match (row.floor, floor_kernel) {
        (Some(f), Some(k)) => Some(f.max(k)),
        (f, k) => f.or(k),
    };
    let ratio = row.canaryscope.zip(floor.filter(|f| *f > 0.0)).map(|(h, f)| h / f);
    row.ratio("hooks_vs_floor", ratio);
    let daemon_cpu = |tool| gathered.daemon_cpu.get(&pod(tool)).and_then(|v| median(v));
    let daemon = minus(daemon_cpu(Tool::WithHooks), daemon_cpu(Tool::WithoutHooks));
    let rest = minus(minus(row.canaryscope, kernel), daemon);
    row.ratio("hooks_programs_ns_per_request", kernel);
    row.ratio("hooks_daemon_cpu_ns_per_request", daemon);
    row.ratio("hooks_rest_ns_per_request", rest);
    row.ratio("floor_programs_ns_per_request", floor_kernel);
    // Both with the same statistics' clock reads: the programs alone.
    row.ratio("hooks_programs_vs_floor_programs", super::div(kernel, floor_kernel));
    // Whether any hook that times requests could meet the target: the
    // least one, a clock read and nothing else, against the empty one.
    row.ratio("least_programs_ns_per_request", least_kernel);
    row.ratio("least_programs_vs_floor_programs", super::div(least_kernel, floor_kernel));
    row.ratio("hooks_programs_vs_least_programs", super::div(kernel, least_kernel));
    row.target = Some(Target::new(
        "in a pod: the hooks' added CPU per request ≤ 1.2 × the empty programs' (hooks/floor)",
        FLOOR_LIMIT,
        ratio,
        "",
    ));
    result.add_samples_of(&mut row, &[pod(Tool::Floor)]);
    for tool in [Tool::WithoutHooks, Tool::WithHooks] {
        if let Some(v) = gathered.daemon_cpu.get(&pod(tool)) {
            row.samples.push((
                format!("daemon_cpu_ns_per_request/{}", super::rounds::Config::label(pod(tool))),
                v.clone(),
            ));
        }
    }
    row.notes.push(format!(
        "added CPU per request over {secs} s wrk runs in the followed cgroup: the hooks' is canaryscope \
         with them minus without them; the floor's is two empty cgroup_skb programs (`r0 = 1; exit`, \
         ingress and egress, linked to the same cgroup as the daemon links its hooks, no daemon) minus \
         bare; peer: Beyla's published figure"
    ));
    row.notes.push(
        "split of the hooks' added CPU: programs = http_ingress + http_egress run time (kernel.bpf_stats_enabled, \
         a run of its own in the last round); daemon = its user+system CPU with the hooks minus without \
         (reading the ring, following connections, parsing HTTP); rest = what neither shows (the hook \
         dispatch, caches, noise)"
            .into(),
    );
    row.notes.push(format!(
        "hooks_vs_floor divides by the larger of the floor's measured added CPU ({}) and its programs' run \
         time with the statistics on ({}), which counts the statistics' clock reads too",
        super::report::opt(row.floor),
        super::report::opt(floor_kernel)
    ));
    row.notes.push(
        "least = two cgroup_skb programs that call bpf_ktime_get_ns and pass the packet (no daemon): less \
         than any hook that times requests does; least_programs_vs_floor_programs above 1.2 means no such \
         hook meets the target, measured on the programs alone"
            .into(),
    );
    for (cfg, what) in
        [(pod(Tool::WithHooks), "with the hooks"), (pod(Tool::Floor), "floor"), (pod(Tool::Least), "least")]
    {
        if let Some((programs, requests)) = gathered.programs.get(&cfg) {
            let lines: Vec<String> = programs.iter().map(|p| p.line()).collect();
            row.notes.push(format!("{what}, {requests:.0} requests: {}", lines.join("; ")));
        }
    }
    row
}
