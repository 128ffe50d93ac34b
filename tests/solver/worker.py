#!/usr/bin/env python3
"""A solver worker: the long-lived process of a pod's container, taking
one job per line of stdin (JSON) and running it through the runbook's
wrapper (wrapper.py). For each job it prints one line, flushed:

    done job=N outcome=OUTCOME seconds=WALL

OUTCOME is what the worker itself saw: `exit0`, `exitN` (z3's status),
`signalN` (z3 killed by signal N) or `timeout` (the wall-clock timeout
killed it). A job: {"pigeons": n, "copies": k, "timeout": s, "cpu": s,
"memory_mb": m, "shell": bool, "bad": bool}: k independent pigeonhole
problems PHP(n+1, n) (each unsatisfiable, each checked on its own, so k
copies take k times the work), or with "bad" a script z3 rejects.
"""
import json
import sys
import time

from wrapper import run_solver_with_hard_limits


def pigeonhole(n, tag):
    out = ["(push)"]
    for p in range(n + 1):
        for h in range(n):
            out.append(f"(declare-const {tag}x{p}_{h} Bool)")
    for p in range(n + 1):
        out.append("(assert (or " + " ".join(f"{tag}x{p}_{h}" for h in range(n)) + "))")
    for h in range(n):
        for p in range(n + 1):
            for q in range(p + 1, n + 1):
                out.append(f"(assert (not (and {tag}x{p}_{h} {tag}x{q}_{h})))")
    out += ["(check-sat)", "(pop)"]
    return "\n".join(out)


def script(job):
    if job.get("bad"):
        return "(assert undeclared)\n(check-sat)\n"
    n, k = job.get("pigeons", 6), job.get("copies", 1)
    return "\n".join(pigeonhole(n, f"c{i}") for i in range(k)) + "\n"


def main():
    print("ready", flush=True)
    for number, line in enumerate(sys.stdin):
        if not line.strip():
            continue
        job = json.loads(line)
        started = time.monotonic()
        try:
            code, _ = run_solver_with_hard_limits(
                script(job),
                timeout_seconds=job.get("timeout", 10),
                max_memory_mb=job.get("memory_mb", 4096),
                cpu_seconds=job.get("cpu"),
                shell=job.get("shell", False),
            )
            outcome = f"exit{code}" if code >= 0 else f"signal{-code}"
            # Through a shell, a signal reaches the worker as 128 + N.
            if job.get("shell") and code > 128:
                outcome = f"signal{code - 128}"
        except TimeoutError:
            outcome = "timeout"
        print(f"done job={number} outcome={outcome} seconds={time.monotonic() - started:.6f}", flush=True)


if __name__ == "__main__":
    main()
