//! `top` on its own probes: the daemon's pipeline and series in this
//! process, without a server, Kubernetes or the readiness gate. Each second
//! the rows are read from the text a scrape of `run` would return.
use std::process::ExitCode;

use super::{parse_reading, Args, Driver, TICK};
use crate::{
    config,
    discovery::hot::Policy,
    error::CliError,
    event_loop::{self, Consumer, Flow, Schedule},
    events::Event,
    metrics::recorder::Recorder,
    pipeline::{Options, Pipeline},
};

struct LocalTop {
    recorder: Recorder,
    driver: Driver,
}

impl Consumer for LocalTop {
    type Error = CliError;

    fn events(&mut self, _pipeline: &mut Pipeline, events: Vec<Event>) -> Result<Flow, CliError> {
        self.recorder.record(&events);
        Ok(Flow::Continue)
    }

    fn tick(&mut self, pipeline: &mut Pipeline) -> Result<Flow, CliError> {
        // Series first, so a reading due now sees this tick's refresh.
        if self.recorder.due(0) {
            let read = self.recorder.read_kernel(pipeline);
            self.recorder.publish(pipeline, read, None, None);
        }
        let recorder = &self.recorder;
        self.driver.step(&mut || {
            let text = recorder.per_pod();
            parse_reading(&String::from_utf8_lossy(&text)).map_err(|e| format!("own exposition: {e}"))
        })
    }
}

pub async fn run(args: &Args) -> Result<ExitCode, CliError> {
    let stall_ns = config::kernel_ns(args.probe.stall_threshold()?);
    // As the daemon's defaults: hot calls in cgroups with recent trouble.
    // Run-queue latency for the kubepods hierarchy, and for a cgroup
    // prefix the person filters on.
    let runq_prefixes = args.filter.starts_with('/').then(|| args.filter.clone()).into_iter().collect();
    let options = Options::new(args.probe.families()?, stall_ns, Policy::daemon_default())
        .libs(args.probe.libs.clone())
        .runq_prefixes(runq_prefixes);
    let (mut pipeline, ring) = Pipeline::start(options)?;
    let recorder = Recorder::standalone(&pipeline, config::DEFAULT_MAX_CGROUPS);
    // The screen takes the terminal only once the probes are attached, so
    // a refusal prints where the person can read it.
    let driver = Driver::new(args, "own probes".to_string())?;
    let mut top = LocalTop { recorder, driver };
    event_loop::run(&mut pipeline, ring, &mut top, Schedule { tick: TICK, deadline: None, wake: None })
        .await?;
    // The terminal is restored before the probes go.
    drop(top);
    event_loop::leave(&mut pipeline);
    Ok(ExitCode::SUCCESS)
}
