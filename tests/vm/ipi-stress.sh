#!/bin/sh
# Guest side of the soft-lockup investigation (tests/vm/README.md): patches
# kernel text over and over while both CPUs are busy, with no eBPF and no
# canaryscope. Each enable or disable of a scheduler trace event updates the
# tracepoint's static call and static key, which x86 does with text_poke_bp:
# three rounds of IPIs to every CPU, each waited for. That is the path the
# lockups were stuck in when a canaryscope daemon exited and released its
# tracepoint links.
#
#   tests/vm/run.sh -- tests/vm/ipi-stress.sh SECONDS
set -eu
seconds="${1:?usage: ipi-stress.sh SECONDS}"
tracing=/sys/kernel/tracing
[ -d "$tracing/events/sched" ] || tracing=/sys/kernel/debug/tracing
[ -d "$tracing/events/sched" ] || { echo "ipi-stress: no tracefs with sched events" >&2; exit 2; }
events="sched/sched_wakeup_new sched/sched_wakeup sched/sched_switch sched/sched_process_exec"

# One CPU-bound loop and one fork-and-exec loop, so that both CPUs run
# tasks that hit the tracepoints being patched.
sh -c 'while :; do :; done' &
spinner=$!
sh -c 'while :; do /bin/true; done' &
forker=$!
trap 'kill $spinner $forker 2>/dev/null' EXIT

end=$(( $(cut -d. -f1 /proc/uptime) + seconds ))
rounds=0
while [ "$(cut -d. -f1 /proc/uptime)" -lt "$end" ]; do
    for e in $events; do echo 1 > "$tracing/events/$e/enable"; done
    for e in $events; do echo 0 > "$tracing/events/$e/enable"; done
    rounds=$((rounds + 1))
done
echo "ipi-stress: $rounds rounds of enabling and disabling $(echo $events | wc -w) trace events in ${seconds}s"
