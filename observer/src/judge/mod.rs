//! `canaryscope judge`: a small HTTP service beside Prometheus that
//! answers whether a canary revision fails more often than its baseline,
//! for Argo Rollouts' `web` provider and Flagger's webhooks.
//!
//! - `GET|POST /v1/judge` (Argo): always 200 with the JSON judgement;
//!   the AnalysisTemplate maps `result.verdict` to its phases.
//! - `POST /v1/flagger/rollout`: `fail` answers 409, which Flagger counts
//!   toward its rollback threshold; `pass` and `inconclusive` answer 200.
//! - `POST /v1/flagger/confirm-promotion`: only `pass` answers 200; the
//!   rest 412, which holds the promotion.
//! - `GET /healthz`.
//!
//! A malformed request gets 400 with one line. Prometheus unreachable, a
//! workload without data, or too little exposure is `inconclusive` with
//! the reason, never `pass`.
mod cascade;
mod http;
mod http_signals;
mod latency;
pub mod policy;
mod prometheus;
pub mod report;
mod request;
pub mod requests;
mod signals;
pub mod simulate;
pub mod solver_runs;
pub mod spending;
pub mod stats;
pub mod strata;
pub mod verdict;

use std::{net::SocketAddr, process::ExitCode, sync::Arc, time::Duration};

use clap::Parser;
use log::info;
use serde::Serialize;
use tokio::net::TcpListener;

use self::{
    http::{Reply, Request},
    policy::Policy,
    prometheus::Prometheus,
    report::{Judgement, Outcome},
    request::{BadRequest, Params, Question},
};
use crate::{error::CliError, event_loop::StopSignals};

/// What `judge --help` says it answers: a user should not need the README
/// to wire an AnalysisTemplate or a Flagger webhook.
const ENDPOINTS: &str = "\
Endpoints (HTTP, on --listen):
  GET|POST /v1/judge                      Argo Rollouts' web metric: always 200, the JSON judgement
                                          (namespace, workload, canary, baseline; optional window, interval, end,
                                          http_error_share, p99_for);
                                          the AnalysisTemplate reads result.verdict: pass, fail, inconclusive
  POST     /v1/flagger/rollout            Flagger's rollout webhook: 409 on fail (counts toward its
                                          rollback threshold), 200 on pass or inconclusive
  POST     /v1/flagger/confirm-promotion  Flagger's confirm-promotion webhook: 200 only on pass, else 412
  GET      /healthz                       200 while the judge serves
A malformed request gets a one-line 400 that says what is wrong.";

#[derive(Parser, Debug, Clone)]
#[command(after_help = ENDPOINTS)]
pub struct Args {
    /// Address to answer on.
    #[arg(long, default_value = "0.0.0.0:9808", value_name = "ADDR")]
    pub listen: String,
    /// Prometheus that scrapes the daemons (http://HOST:PORT[/PREFIX]).
    #[arg(long, value_name = "URL", required_unless_present = "simulate")]
    pub prometheus: Option<String>,
    /// False-rollback rate the whole analysis may spend, over all its
    /// looks and signals.
    #[arg(long, default_value_t = policy::DEFAULT_ALPHA, value_name = "P")]
    pub alpha: f64,
    /// Canary/baseline rate ratio tolerated for per-pod-second signals.
    #[arg(long, default_value_t = policy::DEFAULT_TOLERATED_RATIO, value_name = "RATIO")]
    pub tolerated_ratio: f64,
    /// A signal's own tolerated ratio, e.g. `--ratio memory_limit_refusals=3` (repeatable).
    #[arg(long = "ratio", value_name = "SIGNAL=RATIO", value_parser = parse_override)]
    pub ratios: Vec<(String, f64)>,
    /// Start-ups the canary must reach before it can pass.
    #[arg(long, default_value_t = policy::DEFAULT_MIN_STARTUPS, value_name = "N")]
    pub min_startups: f64,
    /// Pod-seconds the canary must reach before it can pass.
    #[arg(long, default_value_t = policy::DEFAULT_MIN_POD_SECONDS, value_name = "SECONDS")]
    pub min_pod_seconds: f64,
    /// HTTP requests the canary must serve on compared nodes before a
    /// request signal can pass.
    #[arg(long, default_value_t = requests::DEFAULT_MIN_REQUESTS, value_name = "N")]
    pub min_requests: f64,
    /// Share of the canary's HTTP requests answered 5xx (and, apart, cut off
    /// mid-response) tolerated whatever the baseline's: the runbook's 1%. A
    /// question's `http_error_share` overrides it.
    #[arg(long, default_value_t = requests::DEFAULT_ERROR_SHARE, value_name = "SHARE")]
    pub http_error_share: f64,
    /// How long the canary's p99 must stay above 1.25 times the baseline's
    /// before it fails: the runbook's 3 minutes (0s: the look alone). A
    /// question's `p99_for` overrides it.
    #[arg(long, default_value = "3m", value_name = "DURATION", value_parser = parse_hold)]
    pub p99_for: Duration,
    /// Runs the canary must reach before it can pass (workloads whose pods
    /// start runs, such as solvers).
    #[arg(long, default_value_t = policy::DEFAULT_MIN_RUNS, value_name = "N")]
    pub min_runs: f64,
    /// Distinct pods of the workload killed (OOM, crash) within
    /// --cascade-window that make a cascade.
    #[arg(long, default_value_t = cascade::DEFAULT_PODS, value_name = "N")]
    pub cascade_pods: usize,
    /// How close together a cascade's kills are.
    #[arg(long, default_value = "10m", value_name = "DURATION", value_parser = parse_lookback)]
    pub cascade_window: Duration,
    /// How far back the baseline's GPU start-ups are read on the canary's
    /// nodes, when the canary's own span holds too few of them.
    #[arg(long, default_value = "7d", value_name = "DURATION", value_parser = parse_lookback)]
    pub startup_lookback: Duration,
    /// Every answer within this: the queries run at once, and what has not
    /// answered by then makes the answer `inconclusive`, named. Below the
    /// AnalysisTemplate's `timeoutSeconds` (20).
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = parse_lookback)]
    pub deadline: Duration,
    /// Check the arguments as the judge does, print what it would serve
    /// with, and exit (0; or 2 with the judge's own error). Starts nothing:
    /// deploy/check.sh runs the chart's rendered arguments through it.
    #[arg(long)]
    pub check_config: bool,
    #[arg(long, hide = true)]
    pub simulate: bool,
    /// The canary's share of the exposure in the simulation.
    #[arg(long, hide = true, default_value_t = 0.25)]
    pub canary_share: f64,
}

fn parse_lookback(text: &str) -> Result<Duration, String> {
    request::parse_duration(text)
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("{text:?} is not a duration such as 10s, 30m or 7d"))
}

fn parse_hold(text: &str) -> Result<Duration, String> {
    request::parse_duration(text).ok_or_else(|| format!("{text:?} is not a duration such as 3m or 0s"))
}

fn parse_override(text: &str) -> Result<(String, f64), String> {
    let (name, ratio) = text.split_once('=').ok_or("expected SIGNAL=RATIO")?;
    if !signals::signal_names().any(|s| s == name) {
        let known: Vec<&str> = signals::signal_names().collect();
        return Err(format!("unknown signal {name:?} (one of {})", known.join(", ")));
    }
    match ratio.parse::<f64>() {
        Ok(r) if r.is_finite() && r >= 1.0 => Ok((name.to_string(), r)),
        _ => Err(format!("{ratio:?} is not a ratio of at least 1")),
    }
}

impl Args {
    fn policy(&self) -> Result<Policy, CliError> {
        if !(self.alpha > 0.0 && self.alpha < 0.5) {
            return Err(CliError::usage(format!("--alpha {}: expected a probability below 0.5", self.alpha)));
        }
        if !(self.tolerated_ratio.is_finite() && self.tolerated_ratio >= 1.0) {
            return Err(CliError::usage(format!(
                "--tolerated-ratio {}: expected at least 1",
                self.tolerated_ratio
            )));
        }
        if !(self.min_startups >= 0.0
            && self.min_pod_seconds >= 0.0
            && self.min_requests >= 0.0
            && self.min_runs >= 0.0)
        {
            return Err(CliError::usage(
                "--min-startups, --min-pod-seconds, --min-requests and --min-runs cannot be negative",
            ));
        }
        if !(self.http_error_share >= 0.0 && self.http_error_share < 1.0) {
            return Err(CliError::usage(format!(
                "--http-error-share {}: expected a share from 0 to below 1, such as 0.01",
                self.http_error_share
            )));
        }
        if self.cascade_pods < 2 {
            return Err(CliError::usage(format!(
                "--cascade-pods {}: a cascade is at least 2 pods",
                self.cascade_pods
            )));
        }
        Ok(Policy {
            alpha: self.alpha,
            tolerated_ratio: self.tolerated_ratio,
            ratio_overrides: self.ratios.clone(),
            min_startups: self.min_startups,
            min_pod_seconds: self.min_pod_seconds,
            min_requests: self.min_requests,
            error_share: self.http_error_share,
            min_runs: self.min_runs,
        })
    }
}

struct Judge {
    prometheus: Prometheus,
    policy: Policy,
    startup_lookback: Duration,
    deadline: Duration,
    latency_hold: Duration,
    cascade: cascade::Rule,
}

pub fn run(args: Args) -> Result<ExitCode, CliError> {
    if args.simulate {
        let report = simulate::simulate(&simulate::SimConfig::default_for_share(args.canary_share));
        let json = serde_json::to_string(&report).map_err(|e| CliError::runtime(e.to_string()))?;
        println!("{json}");
        return Ok(ExitCode::SUCCESS);
    }
    let policy = args.policy()?;
    let url = args.prometheus.as_deref().unwrap_or_default();
    let prometheus = Prometheus::parse(url).map_err(CliError::usage)?;
    let addr: SocketAddr = args.listen.parse().map_err(|_| {
        CliError::usage(format!("--listen {}: expected HOST:PORT, e.g. 0.0.0.0:9808", args.listen))
    })?;
    if args.check_config {
        println!(
            "canaryscope judge would serve on {addr}, asking {url}, with {policy:#?}, a start-up lookback \
             of {:?}, a p99 hold of {:?}, a deadline of {:?} and cascades of {} pods within {:?}",
            args.startup_lookback, args.p99_for, args.deadline, args.cascade_pods, args.cascade_window
        );
        return Ok(ExitCode::SUCCESS);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::runtime(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(serve(
        addr,
        Arc::new(Judge {
            prometheus,
            policy,
            startup_lookback: args.startup_lookback,
            deadline: args.deadline,
            latency_hold: args.p99_for,
            cascade: cascade::Rule { window: args.cascade_window.as_secs_f64(), pods: args.cascade_pods },
        }),
    ))?;
    Ok(ExitCode::SUCCESS)
}

async fn serve(addr: SocketAddr, judge: Arc<Judge>) -> Result<(), CliError> {
    let listener =
        TcpListener::bind(addr).await.map_err(|e| CliError::runtime(format!("--listen {addr}: {e}")))?;
    eprintln!("canaryscope judge: answering on http://{addr}/v1/judge, asking {}", judge.prometheus.url());
    // SIGTERM too: a Deployment's rollout stops the judge with it.
    let mut stop = StopSignals::new()?;
    let answering = http::serve(listener, move |request| {
        let judge = judge.clone();
        async move { answer(request, &judge).await }
    });
    tokio::select! {
        () = answering => Ok(()),
        _ = stop.recv() => Ok(()),
    }
}

/// Which caller asked, which decides how the verdict is told.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Route {
    Argo,
    FlaggerRollout,
    FlaggerPromotion,
}

async fn answer(request: Request, judge: &Judge) -> Reply {
    let route = match (request.method.as_str(), request.path.as_str()) {
        ("GET", "/healthz") => return Reply::new(200, "text/plain", "ok\n"),
        ("GET" | "POST", "/v1/judge") => Route::Argo,
        ("POST", "/v1/flagger/rollout") => Route::FlaggerRollout,
        ("POST", "/v1/flagger/confirm-promotion") => Route::FlaggerPromotion,
        (_, "/healthz" | "/v1/judge" | "/v1/flagger/rollout" | "/v1/flagger/confirm-promotion") => {
            return Reply::new(405, "text/plain", "method not allowed\n")
        }
        _ => return Reply::new(404, "text/plain", "not found\n"),
    };
    let question = match question(&request, route) {
        Ok(q) => q,
        Err(e) => return Reply::new(400, "text/plain", format!("{e}\n")),
    };
    let answer = decide(judge, question).await;
    info!("{route:?} {}: {:?} ({})", answer.question.canary.workload, answer.verdict, answer.reason);
    let status = match (route, answer.verdict) {
        (Route::FlaggerRollout, Outcome::Fail) => 409,
        (Route::FlaggerPromotion, Outcome::Fail | Outcome::Inconclusive) => 412,
        _ => 200,
    };
    Reply::new(status, "application/json", serde_json::to_vec_pretty(&answer).unwrap_or_default())
}

fn question(request: &Request, route: Route) -> Result<Question, BadRequest> {
    let params = Params::new(request.query.clone(), &request.body)?;
    match route {
        Route::Argo => request::from_argo(&params),
        Route::FlaggerRollout | Route::FlaggerPromotion => request::from_flagger(&params),
    }
}

/// The JSON answer: the verdict first, then why.
#[derive(Serialize)]
struct Answer {
    verdict: Outcome,
    reason: String,
    look: u32,
    question: Question,
    signals: Vec<report::SignalReport>,
    /// Pods of the workload killed one after another, if a cascade is under way.
    cascade: Option<cascade::Cascade>,
}

impl Answer {
    fn new(question: Question, look: u32, judgement: Judgement, cascade: Option<cascade::Cascade>) -> Self {
        let Judgement { outcome, reason, signals } = judgement;
        Self { verdict: outcome, reason, look, question, signals, cascade }
    }
}

/// How many earlier looks are replayed for a failure that stays one.
const REPLAYED_LOOKS: u32 = 240;

/// An answer that is `inconclusive` for `reason`, before any look.
fn inconclusive(question: Question, reason: String) -> Answer {
    Answer { verdict: Outcome::Inconclusive, reason, look: 0, question, signals: Vec::new(), cascade: None }
}

async fn decide(judge: &Judge, mut question: Question) -> Answer {
    let end = question.end.unwrap_or_else(unix_now);
    // The runbook's tolerances, as this question's caller set them.
    let mut policy = judge.policy.clone();
    if let Some(share) = question.http_error_share {
        policy.error_share = share;
    }
    let deadline = tokio::time::Instant::now() + judge.deadline;
    let reading = signals::Reading {
        question: &question,
        end,
        startup_lookback: judge.startup_lookback.as_secs_f64(),
        min_startups: judge.policy.min_startups,
        deadline,
        latency_hold: question.p99_for.unwrap_or(judge.latency_hold).as_secs_f64(),
    };
    let collected = match signals::collect(&judge.prometheus, &reading).await {
        Ok(c) => c,
        Err(e @ prometheus::PromError::Deadline(_)) => {
            let reason = format!("no answer within the deadline of {}s: {e}", judge.deadline.as_secs_f64());
            return inconclusive(question, reason);
        }
        Err(e) => return inconclusive(question, e.to_string()),
    };
    if let Some(revision) = &collected.canary_revision {
        question.canary.revision = Some(revision.clone());
    }
    let window = question.window.as_secs_f64();
    let Some(first_data) = collected.first_data else {
        let reason = format!(
            "no data for the canary {:?} in namespace {:?} in the {}s window ending at {end:.0} \
             (a window that ends before the canary's first data sees none of it)",
            question.canary, question.namespace, window
        );
        return inconclusive(question, reason);
    };
    if collected.began_before_window {
        let reason = format!(
            "the canary's data began before the {window}s window, whose counts would leave out its earlier \
             events: ask with a window that covers its whole try"
        );
        return inconclusive(question, reason);
    }
    if !collected.baseline_seen {
        let reason =
            format!("no data for the baseline {:?} in namespace {:?}", question.baseline, question.namespace);
        return inconclusive(question, reason);
    }
    let cascade = match read_cascade(judge, &question, end, deadline).await {
        Ok(c) => c,
        Err(e) => return inconclusive(question, format!("the workload's kills, for a cascade: {e}")),
    };
    let interval = question.interval.as_secs_f64();
    let look = signals::look(Some(first_data), end, interval);
    let current = verdict::judge(&collected.signals_at(end), &policy, look);
    let current = cascade::apply(current, cascade.as_ref(), look);
    // The earlier looks replayed from the same samples; a long analysis
    // asked often replays its first REPLAYED_LOOKS, where most is spent.
    let earlier = (1..look.min(REPLAYED_LOOKS + 1))
        .map(|k| {
            let signals = collected.signals_at(first_data + f64::from(k) * interval);
            (k, cascade::apply(verdict::judge_for_failure(&signals, &policy, k), cascade.as_ref(), k))
        })
        .find(|(_, j)| j.outcome == Outcome::Fail);
    Answer::new(question, look, verdict::stays_failed(current, look, earlier), cascade)
}

/// A cascade of kills in the workload (any revision) at `end`, by the
/// answer's `deadline` (the same the signals' queries had).
async fn read_cascade(
    judge: &Judge,
    question: &Question,
    end: f64,
    deadline: tokio::time::Instant,
) -> Result<Option<cascade::Cascade>, prometheus::PromError> {
    let query = cascade::query(&question.namespace, &question.canary.workload, judge.cascade);
    let series = tokio::time::timeout_at(deadline, judge.prometheus.samples(&query, end))
        .await
        .map_err(|_| prometheus::PromError::Deadline(vec![format!("{} (cascade)", cascade::LAST_KILL)]))??;
    Ok(cascade::find(&series, end, judge.cascade))
}

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}
