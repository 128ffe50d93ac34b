//! The HTTP bench's configurations and what its rounds gather, shared by
//! the overhead case (http.rs) and the floor's row (http_floor.rs).
use std::collections::BTreeMap;

use super::{bpf_stats::ProgRuns, rounds::Config};

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(super) enum Tool {
    Bare,
    /// Empty programs on the hooks, no daemon.
    Floor,
    /// Programs that read the clock and nothing else, no daemon: less than
    /// any hook that times requests does.
    Least,
    WithoutHooks,
    WithHooks,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(super) enum Place {
    Pod,
    System,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(super) struct HttpCfg(pub(super) Tool, pub(super) Place);

impl Config for HttpCfg {
    fn label(self) -> &'static str {
        match self {
            HttpCfg(Tool::Bare, Place::Pod) => "bare/pod",
            HttpCfg(Tool::Bare, Place::System) => "bare/system",
            HttpCfg(Tool::Floor, Place::Pod) => "floor/pod",
            HttpCfg(Tool::Floor, Place::System) => "floor/system",
            HttpCfg(Tool::Least, Place::Pod) => "least/pod",
            HttpCfg(Tool::Least, Place::System) => "least/system",
            HttpCfg(Tool::WithoutHooks, Place::Pod) => "no-http/pod",
            HttpCfg(Tool::WithoutHooks, Place::System) => "no-http/system",
            HttpCfg(Tool::WithHooks, Place::Pod) => "http/pod",
            HttpCfg(Tool::WithHooks, Place::System) => "http/system",
        }
    }
}

/// What the rounds gather beside the CPU figure, per configuration.
#[derive(Default)]
pub(super) struct Gathered {
    pub(super) p99s: BTreeMap<HttpCfg, Vec<f64>>,
    pub(super) rates: BTreeMap<HttpCfg, Vec<f64>>,
    /// Segments the kernel had no ring room for, summed over the runs with
    /// the hooks (the daemon's own counter): a ring drained too late.
    pub(super) segments_lost: BTreeMap<HttpCfg, f64>,
    /// The daemon's own CPU (user and system), ns per request.
    pub(super) daemon_cpu: BTreeMap<HttpCfg, Vec<f64>>,
    /// The programs' runs in a run of their own with the statistics on,
    /// and the requests of that run (the last round only).
    pub(super) programs: BTreeMap<HttpCfg, (Vec<ProgRuns>, f64)>,
}
