#!/usr/bin/env bash
# Runs one command inside a QEMU (TCG) VM that boots Debian's stock 6.1 kernel
# (kprobes, BTF, amdgpu + /dev/kfd) with the host's root filesystem mounted
# read-only over 9p and made the job's root. Exits with the command's exit status.
#
#   tests/vm/run.sh [--kernel 6.1|6.12|6.1-cloud|5.10] [--mem MB] [--smp N] [--timeout SECS]
#                   [--env NAME[=VALUE]]... [-i|--interactive] -- CMD [ARGS...]
#
# See tests/vm/README.md.
set -euo pipefail

PROG=tests/vm/run.sh
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
INIT_SRC="$HERE/guest-init.sh"

say() { printf '==> %s\n' "$*" >&2; }
die() { printf '%s: error: %s\n' "$PROG" "$*" >&2; exit 125; }
usage() {
    cat >&2 <<'EOF'
usage: tests/vm/run.sh [options] -- CMD [ARGS...]
  --kernel FLAVOUR    6.1 (default: Debian 12's kernel), 6.12 (Debian 12's 6.12
                      from its security suite), 6.1-cloud (the cloud flavour),
                      5.10 (Debian 11's kernel, fetched with apt lists of its own)
  --tcg-thread MODE   single: one host thread runs every guest CPU in turn
                      (default); multi: a host thread per guest CPU, faster
                      but it wedges (see README); env CANARYSCOPE_VM_TCG_THREAD
  --mem MB            guest memory (default 3072)
  --smp N             guest CPUs (default 2)
  --timeout SECS      kill the VM after SECS seconds (default 600); exit 124
  --env NAME[=VALUE]  export NAME into the command's environment (repeatable;
                      without =VALUE the host's value is passed)
  -i, --interactive   attach the terminal to the guest serial line (tty stdin)
env: CANARYSCOPE_VM_CACHE, CANARYSCOPE_VM_KERNEL, CANARYSCOPE_VM_VERBOSE,
     CANARYSCOPE_VM_TARGET_RW
EOF
    exit 125
}

# ---------------------------------------------------------------- arguments
FLAVOUR=6.1
# One host thread for every guest CPU: with a thread per CPU, QEMU 7.2 lets
# a CPU run translated code that another CPU has since patched (text_poke),
# and the guest wedges in an int3 loop (README.md: the soft lockup).
TCG_THREAD="${CANARYSCOPE_VM_TCG_THREAD:-single}"
MEM=3072
SMP=2
TIMEOUT=600
INTERACTIVE=0
EXTRA_ENV=()
while [ $# -gt 0 ]; do
    case "$1" in
        --kernel) [ $# -ge 2 ] || usage; FLAVOUR="$2"; shift 2 ;;
        --kernel=*) FLAVOUR="${1#*=}"; shift ;;
        --tcg-thread) [ $# -ge 2 ] || usage; TCG_THREAD="$2"; shift 2 ;;
        --tcg-thread=*) TCG_THREAD="${1#*=}"; shift ;;
        --mem) [ $# -ge 2 ] || usage; MEM="$2"; shift 2 ;;
        --mem=*) MEM="${1#*=}"; shift ;;
        --smp) [ $# -ge 2 ] || usage; SMP="$2"; shift 2 ;;
        --smp=*) SMP="${1#*=}"; shift ;;
        --timeout) [ $# -ge 2 ] || usage; TIMEOUT="$2"; shift 2 ;;
        --timeout=*) TIMEOUT="${1#*=}"; shift ;;
        --env) [ $# -ge 2 ] || usage; EXTRA_ENV+=("$2"); shift 2 ;;
        --env=*) EXTRA_ENV+=("${1#*=}"); shift ;;
        -i|--interactive) INTERACTIVE=1; shift ;;
        -h|--help) usage ;;
        --) shift; break ;;
        -*) printf '%s: error: unknown option %s\n' "$PROG" "$1" >&2; usage ;;
        *) break ;;
    esac
done
[ $# -gt 0 ] || usage
# Each flavour: the package names apt knows it by (an extended regex on the
# version part of linux-image-VERSION).
case "$FLAVOUR" in
    6.1) KPATTERN='6\.1\.0-[0-9]+-amd64' ;;
    6.12) KPATTERN='6\.12\.[0-9]+\+deb12-amd64' ;;
    6.1-cloud) KPATTERN='6\.1\.0-[0-9]+-cloud-amd64' ;;
    # Debian 11's kernel: an older release than the host's, so apt finds it
    # through a configuration of the harness's own (below).
    5.10) KPATTERN='5\.10\.0-[0-9]+-amd64'; PRIVATE_SUITE=bullseye ;;
    *) die "--kernel wants 6.1, 6.12, 6.1-cloud or 5.10, got '$FLAVOUR'" ;;
esac
[[ "$TCG_THREAD" =~ ^(single|multi)$ ]] || die "--tcg-thread wants single or multi, got '$TCG_THREAD'"
[[ "$MEM" =~ ^[0-9]+$ ]] || die "--mem wants a number of MB, got '$MEM'"
[[ "$SMP" =~ ^[0-9]+$ ]] || die "--smp wants a number, got '$SMP'"
[[ "$TIMEOUT" =~ ^[0-9]+$ ]] || die "--timeout wants a number of seconds, got '$TIMEOUT'"
if [ "$INTERACTIVE" = 1 ] && ! { [ -t 0 ] && [ -t 1 ]; }; then
    die "--interactive needs a terminal on stdin and stdout"
fi
VERBOSE="${CANARYSCOPE_VM_VERBOSE:-0}"
[ "$VERBOSE" = 1 ] || VERBOSE=0
CACHE="${CANARYSCOPE_VM_CACHE:-$REPO/target/vm}"

# ---------------------------------------------------------------- host tools
need() {  # need TOOL HINT
    command -v "$1" >/dev/null 2>&1 || die "$1 not found; $2"
}
SETUP_HINT="run scripts/setup.sh (as root) to install it"
need qemu-system-x86_64 "$SETUP_HINT (Debian package qemu-system-x86)"
need cpio "$SETUP_HINT (Debian package cpio)"
need depmod "$SETUP_HINT (Debian package kmod)"
need xz "$SETUP_HINT (Debian package xz-utils)"
need modprobe "$SETUP_HINT (Debian package kmod)"
need apt-get "this harness needs a Debian host"
need apt-cache "this harness needs a Debian host"
need dpkg "this harness needs a Debian host"
need timeout "install coreutils"
need flock "install util-linux"
need sha256sum "install coreutils"
BUSYBOX=""
for b in /usr/bin/busybox /bin/busybox; do
    if [ -x "$b" ]; then BUSYBOX="$(readlink -f "$b")"; break; fi
done
[ -n "$BUSYBOX" ] || die "busybox not found; $SETUP_HINT (Debian package busybox-static)"
elf_has_interp() {  # does the ELF file have a PT_INTERP program header (dynamic)?
    local f="$1" phoff phentsize phnum i
    phoff=$(od -An -t u8 -j 32 -N 8 "$f" | tr -d ' ')
    phentsize=$(od -An -t u2 -j 54 -N 2 "$f" | tr -d ' ')
    phnum=$(od -An -t u2 -j 56 -N 2 "$f" | tr -d ' ')
    for ((i = 0; i < phnum; i++)); do
        [ "$(od -An -t u4 -j $((phoff + i * phentsize)) -N 4 "$f" | tr -d ' ')" != 3 ] || return 0
    done
    return 1
}
if elf_has_interp "$BUSYBOX"; then
    die "$BUSYBOX is dynamically linked; $SETUP_HINT (Debian package busybox-static)"
fi
[ -r "$INIT_SRC" ] || die "missing $INIT_SRC"

mkdir -p "$CACHE" || die "cannot create cache dir $CACHE"
CACHE="$(cd "$CACHE" && pwd)"
exec 9>"$CACHE/.lock"
flock 9  # serialise cache preparation between concurrent runs

# ---------------------------------------------------------------- kernel
# A ready kernel tree: $CACHE/kernel-<version>/ with boot/vmlinuz-<version>,
# lib/modules/<version>/ and depmod's output, marked by .ready.
latest_cached_kernel() {
    local d best=""
    for d in "$CACHE"/kernel-*; do
        [ -e "$d/.ready" ] || continue
        [[ "${d##*/kernel-}" =~ ^$KPATTERN$ ]] || continue
        best="$(printf '%s\n%s\n' "$best" "${d##*/kernel-}" | sed '/^$/d' | sort -V | tail -n1)"
    done
    printf '%s' "$best"
}

# apt as the host has it, or, for a kernel of another Debian release, apt
# with a configuration of its own in the cache directory: that release's
# suites on the host's own mirrors, its own package lists, no installed
# packages. The host's sources and lists stay as they are.
APT=(-q)
[ "$(id -u)" -ne 0 ] || APT+=(-o APT::Sandbox::User=root)
PRIVATE_SUITE="${PRIVATE_SUITE:-}"
if [ -n "$PRIVATE_SUITE" ]; then
    APT_DIR="$CACHE/apt-$PRIVATE_SUITE"
    mkdir -p "$APT_DIR"/{lists/partial,cache/archives/partial,sources.list.d} || die "cannot create $APT_DIR"
    keyring=/usr/share/keyrings/debian-archive-keyring.gpg
    [ -r "$keyring" ] || die "missing $keyring; $SETUP_HINT (Debian package debian-archive-keyring)"
    mirrors="$(apt-get indextargets --format '$(REPO_URI)' 2>/dev/null | sort -u)"
    [ -n "$mirrors" ] || die "the host's apt names no mirror to fetch Debian $PRIVATE_SUITE's kernel from"
    while IFS= read -r uri; do
        case "$uri" in
            */debian-security/) suite="$PRIVATE_SUITE-security" ;;
            */debian/) suite="$PRIVATE_SUITE" ;;
            *) continue ;;
        esac
        printf 'deb [signed-by=%s] %s %s main\n' "$keyring" "$uri" "$suite"
    done <<< "$mirrors" > "$APT_DIR/sources.list.tmp"
    [ -s "$APT_DIR/sources.list.tmp" ] || die "the host's apt names no Debian mirror (…/debian/) for $PRIVATE_SUITE"
    mv "$APT_DIR/sources.list.tmp" "$APT_DIR/sources.list"
    APT+=(-o "Dir::Etc::sourcelist=$APT_DIR/sources.list" -o "Dir::Etc::sourceparts=$APT_DIR/sources.list.d"
        -o "Dir::State::lists=$APT_DIR/lists" -o "Dir::Cache=$APT_DIR/cache" -o "Dir::State::status=/dev/null")
fi
apt_update() {
    say "updating apt package lists${PRIVATE_SUITE:+ of Debian $PRIVATE_SUITE (in ${APT_DIR#"$REPO"/})}"
    apt-get "${APT[@]}" update -qq >&2 || die "apt-get update failed (are you root? is the network up?)"
}

resolve_kernel_from_apt() {
    local v=""
    if [ "$FLAVOUR" = 6.1 ]; then
        v="$(apt-cache depends linux-image-amd64 2>/dev/null \
            | sed -n 's/^ *Depends: *\(linux-image-6\.1\.0-[0-9]*-amd64\)$/\1/p' | head -n1)"
    fi
    if [ -z "$v" ]; then
        v="$(apt-cache "${APT[@]}" search --names-only "^linux-image-$KPATTERN\$" 2>/dev/null \
            | awk '{print $1}' | sort -V | tail -n1)"
    fi
    printf '%s' "${v#linux-image-}"
}

KVER="${CANARYSCOPE_VM_KERNEL:-}"
KVER="${KVER#linux-image-}"
if [ -z "$KVER" ]; then
    KVER="$(latest_cached_kernel)"
fi
if [ -z "$KVER" ]; then
    KVER="$(resolve_kernel_from_apt)"
    if [ -z "$KVER" ]; then
        apt_update
        KVER="$(resolve_kernel_from_apt)"
    fi
    [ -n "$KVER" ] || die "apt knows no kernel package of flavour $FLAVOUR; is this a Debian host?"
fi
[[ "$KVER" =~ ^$KPATTERN$ ]] || die "unexpected kernel version '$KVER' for --kernel $FLAVOUR"

KDIR="$CACHE/kernel-$KVER"
VMLINUZ="$KDIR/boot/vmlinuz-$KVER"
if [ ! -e "$KDIR/.ready" ]; then
    say "fetching Debian kernel $KVER"
    mkdir -p "$CACHE/debs"
    deb="$(ls "$CACHE/debs/linux-image-${KVER}_"*.deb 2>/dev/null | sort -V | tail -n1 || true)"
    if [ -z "$deb" ]; then
        if ! (cd "$CACHE/debs" && apt-get "${APT[@]}" download "linux-image-$KVER" >&2); then
            say "apt-get download failed; updating package lists and retrying"
            apt_update
            (cd "$CACHE/debs" && apt-get "${APT[@]}" download "linux-image-$KVER" >&2) \
                || die "could not download linux-image-$KVER"
        fi
        deb="$(ls "$CACHE/debs/linux-image-${KVER}_"*.deb 2>/dev/null | sort -V | tail -n1 || true)"
        [ -n "$deb" ] || die "apt-get download left no .deb for linux-image-$KVER in $CACHE/debs"
    fi
    say "extracting ${deb##*/}"
    rm -rf "$KDIR.tmp"
    dpkg -x "$deb" "$KDIR.tmp" || die "dpkg -x $deb failed"
    [ -e "$KDIR.tmp/boot/vmlinuz-$KVER" ] || die "$deb has no boot/vmlinuz-$KVER"
    say "running depmod for $KVER"
    depmod -b "$KDIR.tmp" "$KVER" || die "depmod -b $KDIR.tmp $KVER failed"
    touch "$KDIR.tmp/.ready"
    rm -rf "$KDIR"
    mv "$KDIR.tmp" "$KDIR"
fi
[ -r "$VMLINUZ" ] || die "missing $VMLINUZ; remove $KDIR and retry"

# ---------------------------------------------------------------- initramfs
# Modules the guest needs, in load order (dependencies first), from modules.dep.
# amdgpu is optional: a flavour without it (cloud) boots without /dev/kfd,
# and the suites that need it say so and are not run there.
# The host root reaches the guest over 9p where the kernel has it, else over
# virtiofs (Debian's cloud flavour builds no 9p), which needs virtiofsd on
# the host: QEMU 7.2 ships one (qemu-system-common), later Debian a package.
if modprobe -d "$KDIR" -S "$KVER" --show-depends 9pnet_virtio >/dev/null 2>&1; then
    SHARE=9p
    GUEST_MODULES=(virtio_pci 9pnet_virtio 9p)
elif modprobe -d "$KDIR" -S "$KVER" --show-depends virtiofs >/dev/null 2>&1; then
    SHARE=virtiofs
    GUEST_MODULES=(virtio_pci virtiofs)
    VIRTIOFSD=""
    for v in /usr/libexec/virtiofsd /usr/lib/qemu/virtiofsd "$(command -v virtiofsd || true)"; do
        if [ -n "$v" ] && [ -x "$v" ]; then VIRTIOFSD="$v"; break; fi
    done
    [ -n "$VIRTIOFSD" ] || die "kernel $KVER has no 9p, only virtiofs, and virtiofsd was not found; $SETUP_HINT (Debian package qemu-system-x86 or virtiofsd)"
    [ "$(id -u)" -eq 0 ] || die "kernel $KVER has no 9p, only virtiofs, and virtiofsd needs root"
    say "kernel $KVER has no 9p: sharing the host root over virtiofs"
else
    die "kernel $KVER has neither 9p nor virtiofs: the guest could not mount the host root"
fi
if modprobe -d "$KDIR" -S "$KVER" --show-depends amdgpu >/dev/null 2>&1; then
    GUEST_MODULES+=(amdgpu)
else
    say "kernel $KVER has no amdgpu module: the guest has no /dev/kfd"
fi
module_load_list() {
    local m
    for m in "${GUEST_MODULES[@]}"; do
        # A module built into this kernel needs no file ("builtin" lines).
        modprobe -d "$KDIR" -S "$KVER" --show-depends "$m" \
            || die "modprobe could not resolve module $m in $KDIR"
    done | awk '$1 == "insmod" && !seen[$2]++ { print $2 }'
}
MODS="$(module_load_list)"
[ -n "$MODS" ] || die "no modules resolved for ${GUEST_MODULES[*]}"

INITRD="$CACHE/initramfs-$KVER.cpio"
STAMP_WANT="$( { sha256sum "$HERE/run.sh" "$INIT_SRC" "$BUSYBOX"; printf '%s\n' "$KVER" "$MODS"; } \
    | sha256sum | cut -d' ' -f1)"
STAMP_HAVE="$(cat "$INITRD.stamp" 2>/dev/null || true)"
if [ ! -e "$INITRD" ] || [ "$STAMP_WANT" != "$STAMP_HAVE" ]; then
    say "building initramfs ($(printf '%s\n' "$MODS" | wc -l) modules)"
    stage="$CACHE/initramfs.stage"
    rm -rf "$stage"
    mkdir -p "$stage"/{bin,dev,proc,sys,newroot,lib/modules}
    cp "$BUSYBOX" "$stage/bin/busybox"
    cp "$INIT_SRC" "$stage/init"
    chmod 0755 "$stage/init" "$stage/bin/busybox"
    : > "$stage/lib/modules/load-order"
    while IFS= read -r ko; do
        rel="${ko#"$KDIR"/}"
        mkdir -p "$stage/$(dirname "$rel")"
        # busybox insmod hands the kernel the file as it is: newer Debian
        # kernels ship xz-compressed modules, so they go in decompressed.
        case "$rel" in
            *.ko.xz) rel="${rel%.xz}"; xz -dc "$ko" > "$stage/$rel" || die "xz -d $ko failed" ;;
            *.ko.zst) rel="${rel%.zst}"; zstd -qdc "$ko" > "$stage/$rel" || die "zstd -d $ko failed" ;;
            *) cp "$ko" "$stage/$rel" ;;
        esac
        printf '/%s\n' "$rel" >> "$stage/lib/modules/load-order"
    done <<< "$MODS"
    (cd "$stage" && find . -print0 | LC_ALL=C sort -z \
        | cpio --quiet --null -o -H newc -R 0:0 > "$INITRD.tmp") || die "cpio failed"
    mv "$INITRD.tmp" "$INITRD"
    printf '%s\n' "$STAMP_WANT" > "$INITRD.stamp"
    rm -rf "$stage"
fi
flock -u 9
exec 9>&-

# ---------------------------------------------------------------- the job
# The guest reads $JOBDIR (through the read-only 9p mount of the host root):
# meta (sourced by the guest init) and job.sh (run by bash inside the guest).
q() { local s="$1"; printf "'%s'" "${s//\'/\'\\\'\'}"; }

JOBDIR="$(mktemp -d "${TMPDIR:-/tmp}/canaryscope-vm.XXXXXX")"
LOG="$JOBDIR/console.log"
QEMU_ERR="$JOBDIR/qemu.err"
cleanup() {
    local p
    for p in ${VIRTIOFSD_PIDS[@]+"${VIRTIOFSD_PIDS[@]}"}; do kill "$p" 2>/dev/null || true; done
    rm -rf "$JOBDIR"
}
trap cleanup EXIT
[[ "$JOBDIR" != *[[:space:]]* ]] || die "temporary dir '$JOBDIR' contains whitespace; set TMPDIR"

NONCE="$(od -An -tx1 -N8 /dev/urandom | tr -d ' \n')"
TARGET_DIR=""
if [ "${CANARYSCOPE_VM_TARGET_RW:-1}" = 1 ]; then
    mkdir -p "$REPO/target"
    TARGET_DIR="$REPO/target"
fi
ROWS=0 COLS=0
if [ "$INTERACTIVE" = 1 ]; then
    read -r ROWS COLS < <(stty size 2>/dev/null || echo "0 0")
fi
{
    printf 'NONCE=%s\n' "$(q "$NONCE")"
    printf 'INTERACTIVE=%s\n' "$INTERACTIVE"
    printf 'VERBOSE=%s\n' "$VERBOSE"
    printf 'TARGET_DIR=%s\n' "$(q "$TARGET_DIR")"
    printf 'ROWS=%s\nCOLS=%s\n' "$ROWS" "$COLS"
    printf 'HOST_CWD=%s\n' "$(q "$PWD")"
} > "$JOBDIR/meta"

GUEST_PATH="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Keep the host's extra PATH entries (e.g. ~/.cargo/bin): same filesystem.
IFS=: read -r -a host_path <<< "${PATH:-}"
for p in "${host_path[@]}"; do
    case ":$GUEST_PATH:" in *":$p:"*) ;; *) [ -z "$p" ] || GUEST_PATH="$GUEST_PATH:$p" ;; esac
done
{
    echo '# generated by tests/vm/run.sh; runs inside the guest'
    printf 'export PATH=%s\n' "$(q "$GUEST_PATH")"
    echo 'export HOME=/root USER=root LOGNAME=root SHELL=/bin/bash'
    echo 'export LANG=C.UTF-8 CANARYSCOPE_IN_VM=1'
    if [ "$INTERACTIVE" = 1 ]; then
        printf 'export TERM=%s\n' "$(q "${TERM:-vt100}")"
    else
        echo 'export TERM=dumb'
    fi
    for v in RUST_LOG RUST_BACKTRACE RUST_LIB_BACKTRACE NO_COLOR; do
        [ -z "${!v+x}" ] || printf 'export %s=%s\n' "$v" "$(q "${!v}")"
    done
    # Every CANARYSCOPE_* variable except the harness's own.
    while IFS= read -r v; do
        case "$v" in CANARYSCOPE_VM_*|CANARYSCOPE_IN_VM) continue ;; esac
        printf 'export %s=%s\n' "$v" "$(q "${!v}")"
    done < <(compgen -e | grep '^CANARYSCOPE_' || true)
    for e in ${EXTRA_ENV[@]+"${EXTRA_ENV[@]}"}; do
        name="${e%%=*}"
        [[ "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || die "--env: bad variable name '$name'"
        if [[ "$e" == *=* ]]; then
            printf 'export %s=%s\n' "$name" "$(q "${e#*=}")"
        elif [ -n "${!name+x}" ]; then
            printf 'export %s=%s\n' "$name" "$(q "${!name}")"
        fi
    done
    printf 'cd -- %s 2>/dev/null || { printf "%%s\\n" %s >&2; cd /; }\n' "$(q "$PWD")" \
        "$(q "$PROG: warning: cwd $PWD is not visible in the guest (a tmpfs covers it); running in /")"
    printf 'exec'
    for a in "$@"; do printf ' %s' "$(q "$a")"; done
    printf '\n'
} > "$JOBDIR/job.sh"

# ---------------------------------------------------------------- boot
APPEND="console=ttyS0,115200 panic=-1 oops=panic rdinit=/init mitigations=off"
APPEND+=" tsc=unstable 8250.nr_uarts=1 nokaslr canaryscope.job=$JOBDIR canaryscope.share=$SHARE"
# A guest soft lockup panics at once (and the panic prints the stuck CPU's
# stack whatever the log level), instead of the run waiting out its timeout
# with nothing to read.
APPEND+=" softlockup_panic=1"
# Before it panics, the watchdog asks every other CPU for its stack by NMI,
# which reaches a CPU spinning with interrupts off: the lockup's other half.
# Those stacks print at the default level (warning), so the console shows
# warnings; outside verbose mode the console filter still hides the boot.
APPEND+=" softlockup_all_cpu_backtrace=1"
if [ "$VERBOSE" = 1 ]; then
    APPEND+=" loglevel=7"
else
    APPEND+=" quiet loglevel=5"
fi

QEMU=(qemu-system-x86_64
    -accel "tcg,thread=$TCG_THREAD" -cpu max -m "$MEM" -smp "$SMP"
    -nographic -no-reboot -net none
    -kernel "$VMLINUZ" -initrd "$INITRD" -append "$APPEND"
)
VIRTIOFSD_PIDS=()
# start_virtiofsd TAG DIR: one daemon a shared tree, its socket in $JOBDIR.
start_virtiofsd() {
    local tag="$1" dir="$2" sock="$JOBDIR/virtiofs-$1.sock" n=0
    # sandbox=chroot: the default pivot_root into the shared tree fails with
    # EBUSY when that tree is the root of a container.
    "$VIRTIOFSD" --socket-path="$sock" -o source="$dir" -o cache=auto -o announce_submounts -o sandbox=chroot \
        2>"$JOBDIR/virtiofsd-$tag.err" &
    VIRTIOFSD_PIDS+=($!)
    until [ -S "$sock" ]; do
        kill -0 "$!" 2>/dev/null || { sed 's/^/virtiofsd: /' "$JOBDIR/virtiofsd-$tag.err" >&2; die "virtiofsd for $dir exited"; }
        n=$((n + 1))
        [ "$n" -lt 100 ] || die "virtiofsd for $dir made no socket in 10 s"
        sleep 0.1
    done
    QEMU+=(-chardev "socket,id=fs-$tag,path=$sock" -device "vhost-user-fs-pci,chardev=fs-$tag,tag=$tag")
}
if [ "$SHARE" = 9p ]; then
    QEMU+=(-virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap")
    if [ -n "$TARGET_DIR" ]; then
        QEMU+=(-virtfs "local,path=$TARGET_DIR,mount_tag=target,security_model=none,multidevs=remap")
    fi
else
    # vhost-user devices read guest memory directly: it must be shareable.
    QEMU+=(-object "memory-backend-memfd,id=mem,size=${MEM}M,share=on" -numa "node,memdev=mem")
    # The guest mounts the root read-only; the daemon itself cannot be told.
    start_virtiofsd hostroot /
    [ -z "$TARGET_DIR" ] || start_virtiofsd target "$TARGET_DIR"
fi

# Console filter: show only what lies between the START and EXIT markers (the
# command's output), report the guest boot time on stderr. Verbose: show all.
M="@@CANARYSCOPE-$NONCE"
if [ "$VERBOSE" = 1 ]; then
    FILTER=(sed -u -e 's/\r$//')
else
    FILTER=(sed -u -n -e 's/\r$//' -e "
        /$M-START /,/$M-EXIT=/{
            /$M-START /{
                s/.*$M-START uptime=\\([0-9.]*\\)@@.*/==> guest up after \\1 s (kernel uptime); running the command/
                w /dev/stderr
                d
            }
            /$M-EXIT=/{
                s/$M-EXIT=[0-9]*@@.*//
                /^\$/d
            }
            p
        }")
fi

QEMU+=(-pidfile "$JOBDIR/qemu.pid")
# The monitor on a socket: where each virtual CPU is (tests/vm/stall-dump.py)
# can be read from outside a guest that no longer runs its own code.
QEMU+=(-monitor "unix:$JOBDIR/monitor.sock,server=on,wait=off")
# Run the pipeline in the background and wait for it, so that INT/TERM sent to
# this script are handled at once: the trap stops qemu instead of orphaning it.
stop_qemu() {
    local pid
    pid="$(cat "$JOBDIR/qemu.pid" 2>/dev/null || true)"
    [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
}
PIPE_PID=""
on_signal() {
    stop_qemu
    [ -z "$PIPE_PID" ] || wait "$PIPE_PID" 2>/dev/null || true
    say "interrupted; VM stopped"
    exit "$1"
}
trap 'on_signal 130' INT
trap 'on_signal 143' TERM
exec 3<&0

say "booting VM (tcg thread=$TCG_THREAD, ${MEM} MB, ${SMP} CPUs, kernel $KVER, timeout ${TIMEOUT}s)"
t0=$(date +%s.%N)
if [ "$INTERACTIVE" = 1 ]; then
    { timeout --foreground -k 10 "$TIMEOUT" "${QEMU[@]}" <&3 2>"$QEMU_ERR" \
          && echo 0 > "$JOBDIR/qemu.rc" || echo $? > "$JOBDIR/qemu.rc"; } | tee "$LOG" &
else
    { timeout --foreground -k 10 "$TIMEOUT" "${QEMU[@]}" </dev/null 2>"$QEMU_ERR" \
          && echo 0 > "$JOBDIR/qemu.rc" || echo $? > "$JOBDIR/qemu.rc"; } | tee "$LOG" | "${FILTER[@]}" &
fi
PIPE_PID=$!
# A stalled guest (soft lockup, RCU stall) may never finish printing its own
# stacks: that dump waits for the stuck CPU. The host then reads every
# virtual CPU through the monitor, prints it, and stops the VM, so the run
# fails with the evidence instead of waiting out its timeout.
# The same just before the timeout kills a guest that printed nothing.
stall_watch() {
    local last_call=$(( $(date +%s) + TIMEOUT - 15 ))
    while kill -0 "$PIPE_PID" 2>/dev/null; do
        if [ "$(date +%s)" -ge "$last_call" ]; then
            say "about to time out: every virtual CPU, read through the QEMU monitor"
            python3 "$HERE/stall-dump.py" "$JOBDIR/monitor.sock" "$REPO/target/vm/kallsyms-$KVER" >&2 || true
            return 0
        fi
        if LC_ALL=C grep -aqE 'BUG: soft lockup|rcu: INFO: rcu_(preempt|sched) (self-)?detected' "$LOG"; then
            sleep 10 # what the guest still prints of its own comes first
            kill -0 "$PIPE_PID" 2>/dev/null || return 0
            say "guest stalled: every virtual CPU, read through the QEMU monitor"
            python3 "$HERE/stall-dump.py" "$JOBDIR/monitor.sock" "$REPO/target/vm/kallsyms-$KVER" >&2 || true
            touch "$JOBDIR/stalled"
            stop_qemu
            return 0
        fi
        sleep 2
    done
}
stall_watch &
WATCH_PID=$!
wait "$PIPE_PID" || true
kill "$WATCH_PID" 2>/dev/null || true
t1=$(date +%s.%N)
elapsed="$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')"
qemu_rc="$(cat "$JOBDIR/qemu.rc" 2>/dev/null || echo '?')"

status="$(LC_ALL=C grep -ao "$M-EXIT=[0-9]*@@" "$LOG" | tail -n1 | sed 's/.*EXIT=\([0-9]*\)@@/\1/' || true)"
started=0
! LC_ALL=C grep -aq "$M-START " "$LOG" || started=1
show_boot_log() {  # the filter hid the boot; show its end when the boot failed
    [ "$VERBOSE" != 1 ] && [ "$started" = 0 ] || return 0
    echo "---- last console lines (CANARYSCOPE_VM_VERBOSE=1 shows all) ----" >&2
    tr -d '\r' < "$LOG" | sed 's/\x1b\[[0-9;?]*[A-Za-z]//g; s/\x1bc//g' | tail -n 30 >&2
}
if [ -z "$status" ] && { [ "$qemu_rc" = 124 ] || [ "$qemu_rc" = 137 ]; }; then
    if [ "$started" = 1 ]; then
        printf '%s: error: timed out after %s s while the command was running; VM killed\n' \
            "$PROG" "$TIMEOUT" >&2
    else
        printf '%s: error: timed out after %s s while the VM was booting; VM killed\n' \
            "$PROG" "$TIMEOUT" >&2
        show_boot_log
    fi
    exit 124
fi
if [ -z "$status" ]; then
    if [ -e "$JOBDIR/stalled" ]; then
        printf '%s: error: the guest kernel stalled; the virtual CPUs are dumped above\n' "$PROG" >&2
    fi
    printf '%s: error: the VM stopped (qemu exit status %s) without reporting the command'"'"'s exit status\n' \
        "$PROG" "$qemu_rc" >&2
    if [ -s "$QEMU_ERR" ]; then sed 's/^/qemu: /' "$QEMU_ERR" >&2; fi
    show_boot_log
    exit 125
fi
say "VM done in ${elapsed} s; command exit status $status"
exit "$status"
