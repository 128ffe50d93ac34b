#!/usr/bin/env python3
"""Builds deploy/grafana/canaryscope.json with Grafana's foundation SDK.

One canary-vs-stable row per signal family, every series split by
`revision` and `track`, and a node-health row. Run it after changing a
panel; `--check` fails when the committed JSON differs from what this
script builds (deploy/check.sh runs it so).

GPU call comparisons use cold-tier functions only: hot calls (launches,
asynchronous copies) are probed only in selected pods, so their counts
would compare a canary with all its calls against a stable with few. The
hot list is read from observer-common/src/gpu.rs, where the probes take it.
"""
import json
import pathlib
import re
import sys

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef, VariableRefresh

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "deploy/grafana/canaryscope.json"
DS = DataSourceRef(type_val="prometheus", uid="${datasource}")

# Which workloads a panel shows; the variables are multi-valued regexes.
SEL = 'namespace=~"$namespace", workload=~"$workload"'
# Canary and stable side by side: every comparison keeps these two labels.
BY = "revision, track"
LEGEND = "{{track}} {{revision}}"
RANGE = "$__rate_interval"


def hot_functions():
    text = (ROOT / "observer-common/src/gpu.rs").read_text()
    names = re.findall(r'\bhot\("([A-Za-z0-9_]+)"\)', text)
    if not names:
        sys.exit("generate.py: no hot(\"...\") functions in observer-common/src/gpu.rs")
    return sorted(set(names))


COLD = f'function!~"{"|".join(hot_functions())}"'


def panel(title, unit, description, *targets, kind="timeseries"):
    builder = timeseries.Panel() if kind == "timeseries" else stat.Panel()
    builder = builder.title(title).description(description).unit(unit).datasource(DS).height(8).span(8)
    for i, (expr, legend) in enumerate(targets):
        query = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + i))
        builder = builder.with_target(query)
    return builder


def rows():
    return [
        ("GPU runtime: canary vs stable", [
            panel("GPU init failures by function", "short",
                  "Failed hipInit, cuInit, device and context setup calls.",
                  (f"sum by ({BY}, function) (increase(canaryscope_gpu_init_failures_total{{{SEL}}}[{RANGE}]))",
                   LEGEND + " {{function}}")),
            panel("GPU call failures by function (cold tier)", "reqps",
                  "Calls that returned an error, per second; hot-tier functions left out.",
                  (f'sum by ({BY}, function) (rate(canaryscope_gpu_api_calls_total{{{SEL}, {COLD}, result!~"hipSuccess|CUDA_SUCCESS|cudaSuccess"}}[{RANGE}]))',
                   LEGEND + " {{function}}")),
            panel("GPU call latency p99 (cold tier)", "s",
                  "p99 of GPU runtime call durations measured in the kernel.",
                  (f'histogram_quantile(0.99, sum by (le, {BY}) (rate(canaryscope_gpu_api_call_duration_seconds_bucket{{{SEL}, tier="cold"}}[{RANGE}])))',
                   LEGEND)),
            panel("Stalled GPU calls", "short",
                  "GPU calls in flight longer than the stall threshold, now.",
                  (f"sum by ({BY}, function) (canaryscope_gpu_api_stalled_calls{{{SEL}}})", LEGEND + " {{function}}")),
        ]),
        ("Serving from the CPU: canary vs stable", [
            panel("GPU library load failures", "short",
                  "dlopen calls that failed for a GPU library or one that needs it (the library asked for, "
                  "and the file its loader could not find): the framework falls back to the CPU.",
                  (f"sum by ({BY}, library, missing) (increase(canaryscope_gpu_library_load_failures_total{{{SEL}}}[{RANGE}]))",
                   LEGEND + " {{library}}: {{missing}}")),
            panel("GPU requested, never initialised", "short",
                  "Running containers that asked for a GPU and made no successful GPU initialisation within the "
                  "daemon's --gpu-init-timeout of their start, now: they serve from the CPU.",
                  (f"sum by ({BY}) (canaryscope_gpu_never_initialized{{{SEL}}})", LEGEND)),
        ]),
        ("Crashes, driver and GPU faults: canary vs stable", [
            panel("Native crashes by library", "short",
                  "Processes killed by a fault or abort, by the object holding the faulting instruction.",
                  (f"sum by ({BY}, library) (increase(canaryscope_native_crashes_total{{{SEL}}}[{RANGE}]))",
                   LEGEND + " {{library}}")),
            panel("KFD ioctl errors", "reqps", "AMD KFD driver ioctls that failed, per second.",
                  (f'sum by ({BY}, ioctl, result) (rate(canaryscope_kfd_ioctls_total{{{SEL}, result!="0"}}[{RANGE}]))',
                   LEGEND + " {{ioctl}} {{result}}")),
            panel("GPU faults", "short", "GPU memory faults, resets and queue evictions of the workload's processes.",
                  (f"sum by ({BY}) (increase(canaryscope_gpu_memory_faults_total{{{SEL}}}[{RANGE}]))", LEGEND + " memory fault"),
                  (f"sum by ({BY}) (increase(canaryscope_gpu_resets_total{{{SEL}}}[{RANGE}]))", LEGEND + " reset"),
                  (f"sum by ({BY}) (increase(canaryscope_gpu_queue_evictions_total{{{SEL}}}[{RANGE}]))", LEGEND + " eviction")),
        ]),
        ("Process deaths: canary vs stable", [
            panel("OOM kills", "short", "Processes killed by the OOM killer.",
                  (f"sum by ({BY}, scope) (increase(canaryscope_oom_kills_total{{{SEL}}}[{RANGE}]))", LEGEND + " {{scope}}")),
            panel("Abnormal exits by cause", "short",
                  "Processes that died by a signal or exited 137, by who ended them.",
                  (f"sum by ({BY}, cause) (increase(canaryscope_abnormal_exits_total{{{SEL}}}[{RANGE}]))", LEGEND + " {{cause}}")),
        ]),
        ("Solver runs and kill cascades: canary vs stable", [
            panel("Run p99 by executable", "s",
                  "p99 of the runs the revision's pods started (a program exec'd by the container's long-lived "
                  "process, exec to exit), per executable; CanaryRunLatencyRegression at 1.25 x stable for 3 minutes.",
                  (f"histogram_quantile(0.99, sum by (le, {BY}, executable) (rate(canaryscope_run_duration_seconds_bucket{{{SEL}}}[{RANGE}])))",
                   LEGEND + " {{executable}}")),
            panel("Runs by ending", "reqps",
                  "Runs ended per second by exit status, limit (memory_limit, rlimit_cpu, oom_kill) or wrapper "
                  "(sent: its wall-clock timeout); the canary judge compares the share a limit or wrapper ended.",
                  (f"sum by ({BY}, ending) (rate(canaryscope_run_endings_total{{{SEL}}}[{RANGE}]))",
                   LEGEND + " {{ending}}")),
            panel("Kill cascade: pods killed within 10m", "short",
                  "Distinct pods of the workload, any revision, with a process killed by the OOM killer or a crash "
                  "in the last 10 minutes (CanaryscopeKillCascade at 3): a poison job moving from pod to pod. "
                  "Revisions hit beside it.",
                  ("count by (namespace, workload) (max by (namespace, workload, pod) "
                   f"(max_over_time(canaryscope_last_kill_timestamp_seconds{{{SEL}}}[10m])) > time() - 600)",
                   "{{namespace}}/{{workload}} pods"),
                  ("count by (namespace, workload) (max by (namespace, workload, revision) "
                   f"(max_over_time(canaryscope_last_kill_timestamp_seconds{{{SEL}}}[10m])) > time() - 600)",
                   "{{namespace}}/{{workload}} revisions")),
        ]),
        ("HTTP requests: canary vs stable (measured from the node)", [
            panel("HTTP requests by status class", "reqps",
                  "Requests the revision's servers answered, per second, by status class (closed: the "
                  "connection ended before the response did); kubelet's probes not counted.",
                  (f"sum by ({BY}, status_class) (rate(canaryscope_http_server_request_duration_seconds_count{{{SEL}}}[{RANGE}]))",
                   LEGEND + " {{status_class}}")),
            panel("HTTP error ratio (5xx and closed)", "percentunit",
                  "Share of requests answered 5xx or cut by the server closing the connection; the runbook rolls back above 1%.",
                  # A revision that failed nothing reads 0, not "no data".
                  (f'(sum by ({BY}) (rate(canaryscope_http_server_request_duration_seconds_count{{{SEL}, status_class=~"5xx|closed"}}[{RANGE}])) '
                   f"or 0 * sum by ({BY}) (rate(canaryscope_http_server_request_duration_seconds_count{{{SEL}}}[{RANGE}]))) / "
                   f"sum by ({BY}) (rate(canaryscope_http_server_request_duration_seconds_count{{{SEL}}}[{RANGE}]))", LEGEND)),
            panel("HTTP latency p99", "s",
                  "p99 from a request's first byte in to its response's last byte out; the runbook rolls back "
                  "at 1.25 x stable for 3 minutes.",
                  (f'histogram_quantile(0.99, sum by (le, {BY}) (rate(canaryscope_http_server_request_duration_seconds_bucket{{{SEL}, status_class=~"2xx|3xx|4xx"}}[{RANGE}])))',
                   LEGEND)),
        ]),
        ("CPU: canary vs stable", [
            panel("Throttled-period ratio", "percentunit", "Share of CFS periods in which the cgroup was throttled.",
                  (f"sum by ({BY}) (rate(canaryscope_cpu_throttled_periods_total{{{SEL}}}[{RANGE}])) / "
                   f"sum by ({BY}) (rate(canaryscope_cpu_periods_total{{{SEL}}}[{RANGE}]))", LEGEND)),
            panel("Run-queue latency p99", "s", "p99 of the time runnable threads waited for a CPU.",
                  (f"histogram_quantile(0.99, sum by (le, {BY}) (rate(canaryscope_cpu_runqueue_latency_seconds_bucket{{{SEL}}}[{RANGE}])))",
                   LEGEND)),
        ]),
        ("Node health", [
            panel("Probes attached", "short", "Probes attached, and probes the kernel refused, per node.",
                  ("sum by (instance) (canaryscope_probe_attached)", "{{instance}} attached"),
                  ("count by (instance) (canaryscope_probe_attached == 0)", "{{instance}} refused"), kind="stat"),
            panel("Events lost", "reqps", "Records dropped because the ring buffer was full, per second.",
                  (f"sum by (instance) (rate(canaryscope_events_lost_total[{RANGE}]))", "{{instance}}")),
            panel("Series overflow", "reqps", "Updates dropped at the per-node cgroup cap, per second.",
                  (f"sum by (instance) (rate(canaryscope_series_overflow_total[{RANGE}]))", "{{instance}}")),
        ]),
    ]


def build():
    board = (
        dashboard.Dashboard("canaryscope: canary vs stable")
        .uid("canaryscope")
        .tags(["canaryscope", "canary"])
        .refresh("30s")
        .time("now-1h", "now")
        .with_variable(dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"))
    )
    # Workloads are offered within the chosen namespaces.
    for name, label, within in (
        ("namespace", "Namespace", ""),
        ("workload", "Workload", ', namespace=~"$namespace"'),
    ):
        board = board.with_variable(
            dashboard.QueryVariable(name)
            .label(label)
            .datasource(DS)
            .query(f'label_values({{__name__=~"canaryscope_.+", {name}!=""{within}}}, {name})')
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
    for title, panels in rows():
        board = board.with_row(dashboard.Row(title))
        for p in panels:
            board = board.with_panel(p)
    return board.build()


def render():
    return json.dumps(build(), cls=JSONEncoder, sort_keys=True, indent=2) + "\n"


if __name__ == "__main__":
    text = render()
    if "--check" in sys.argv:
        if not OUT.exists() or OUT.read_text() != text:
            sys.exit(f"{OUT.relative_to(ROOT)} is stale: run deploy/grafana/generate.py")
    else:
        OUT.write_text(text)
