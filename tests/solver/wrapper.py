"""The solver runbook's hard limits around one solver run (runbook 003,
"Isolasi Subprocess & Engine Hard Timeout"), for z3 instead of Lean: the
run is a separate process with RLIMIT_AS and RLIMIT_CPU set between fork
and exec, and a wall-clock timeout, after which subprocess.run kills it
(SIGKILL, from this process: canaryscope's `sent` ending).

The runbook sets RLIMIT_CPU to the wall-clock timeout; `cpu_seconds` may
differ here so that a test can reach each limit on its own.
"""
import resource
import shutil
import subprocess


def solver():
    """Debian's z3 (apt-get install z3), or PyPI's z3-solver's."""
    found = shutil.which("z3")
    if found is None:
        raise SystemExit("no z3 on PATH: apt-get install z3 (scripts/setup.sh) or pip install z3-solver")
    return found


def run_solver_with_hard_limits(proof_script, timeout_seconds=10, max_memory_mb=4096, cpu_seconds=None,
                                shell=False):
    """Runs z3 on `proof_script`; returns (returncode, stdout). Raises
    TimeoutError past the wall-clock timeout, as the runbook does."""
    cpu = timeout_seconds if cpu_seconds is None else cpu_seconds

    def set_limits():
        # Batasi memori virtual via RLIMIT_AS
        max_bytes = max_memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (max_bytes, max_bytes))
        # Batasi waktu CPU
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))

    # Through `sh -c`, as a worker that builds a command line does: the
    # shell forks z3 (a lone command it would exec in its own place), and
    # z3 is the run.
    command = f"{solver()} -in && true" if shell else [solver(), "-in"]
    try:
        proc = subprocess.run(
            command,
            input=proof_script,
            text=True,
            capture_output=True,
            timeout=timeout_seconds,  # Wall-clock timeout
            preexec_fn=set_limits,
            shell=shell,
        )
        return proc.returncode, proc.stdout
    except subprocess.TimeoutExpired:
        raise TimeoutError("State-space search exceeded wall-clock timeout limit")
