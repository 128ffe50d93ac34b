#!/bin/busybox sh
# /init of the canaryscope test VM, built into the initramfs by tests/vm/run.sh.
# Loads virtio/9p (or virtiofs)/amdgpu, mounts the host root (read-only) at /newroot with
# proc/sys/dev/tracefs/debugfs/cgroup2/bpffs and writable tmpfs scratch space,
# runs the job with that as its root, prints its exit status and powers off.
/bin/busybox --install -s /bin
export PATH=/bin
umask 022

mount -t devtmpfs -o mode=0755 devtmpfs /dev 2>/dev/null
exec </dev/console >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sysfs /sys

VERBOSE=1
grep -qw quiet /proc/cmdline && VERBOSE=0
log() { [ "$VERBOSE" = 0 ] || echo "vm-init: $*"; }
off() {
    sync
    poweroff -f
    echo o > /proc/sysrq-trigger
    sleep 5
    exit 1  # init exiting panics; panic=-1 and -no-reboot end qemu
}
fail() { echo "vm-init: error: $*"; off; }

JOB="" SHARE=9p
for w in $(cat /proc/cmdline); do
    case "$w" in
        canaryscope.job=*) JOB="${w#canaryscope.job=}" ;;
        canaryscope.share=*) SHARE="${w#canaryscope.share=}" ;;
    esac
done
[ -n "$JOB" ] || fail "no canaryscope.job= on the kernel command line"

# Modules, dependencies first (order computed on the host from modules.dep).
: > /modules.log
while read -r ko; do
    if out="$(insmod "$ko" 2>&1)"; then
        echo "ok   $ko" >> /modules.log
    else
        echo "FAIL $ko: $out" >> /modules.log
        log "insmod $ko failed: $out"
    fi
done < /lib/modules/load-order

# mount_share TAG DIR [ro]: a tree the host shares, over 9p or virtiofs
# (kernels built without 9p, like Debian's cloud flavour).
O9P="trans=virtio,version=9p2000.L,msize=512000"
mount_share() {
    if [ "$SHARE" = virtiofs ]; then
        mount -t virtiofs ${3:+-o ro} "$1" "$2"
    elif [ -n "${3:-}" ]; then
        mount -t 9p -o "$O9P,ro,cache=loose" "$1" "$2"
    else
        mount -t 9p -o "$O9P,cache=mmap" "$1" "$2"
    fi
}
# The host root, read-only. The virtio device may take a moment to appear.
n=0
until mount_share hostroot /newroot ro 2>/dev/null; do
    n=$((n + 1))
    [ "$n" -lt 50 ] || { cat /modules.log; fail "cannot mount the host root ($SHARE tag hostroot)"; }
    sleep 0.1
done
log "host root mounted"

[ -r "/newroot$JOB/meta" ] && [ -r "/newroot$JOB/job.sh" ] || fail "job files not found in $JOB"
mkdir -p /job
cp "/newroot$JOB/meta" "/newroot$JOB/job.sh" /job/ || fail "cannot copy the job from $JOB"
NONCE="" INTERACTIVE=0 TARGET_DIR="" ROWS=0 COLS=0 HOST_CWD=""
. /job/meta
[ -n "$NONCE" ] || fail "job meta without NONCE"

R=/newroot
# A working directory under a path that gets a tmpfs below stays visible
# (read-only): keep a bind mount of it and put it back after the tmpfs.
CWD_KEPT=""
case "$HOST_CWD" in
    /tmp/?*|/var/tmp/?*|/run/?*)
        if [ -d "$R$HOST_CWD" ]; then
            mkdir -p /cwd && mount --bind "$R$HOST_CWD" /cwd && CWD_KEPT=1
        fi ;;
esac
mount -t proc proc $R/proc || fail "mount proc"
mount -t sysfs sysfs $R/sys || fail "mount sysfs"
mount -t devtmpfs -o mode=0755 devtmpfs $R/dev || fail "mount devtmpfs"
mkdir -p $R/dev/pts $R/dev/shm $R/dev/mqueue
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts $R/dev/pts
mount -t tmpfs -o mode=1777 tmpfs $R/dev/shm
mount -t mqueue mqueue $R/dev/mqueue 2>/dev/null
ln -sfn /proc/self/fd $R/dev/fd
ln -sfn /proc/self/fd/0 $R/dev/stdin
ln -sfn /proc/self/fd/1 $R/dev/stdout
ln -sfn /proc/self/fd/2 $R/dev/stderr
mount -t tracefs tracefs $R/sys/kernel/tracing || log "tracefs mount failed"
mount -t debugfs debugfs $R/sys/kernel/debug || log "debugfs mount failed"
mount -t cgroup2 -o nsdelegate cgroup2 $R/sys/fs/cgroup || fail "mount cgroup2"
# Like systemd: delegate every controller to child cgroups.
for c in $(cat $R/sys/fs/cgroup/cgroup.controllers); do
    echo "+$c" > $R/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || log "cannot enable controller $c"
done
mount -t bpf -o mode=0700 bpf $R/sys/fs/bpf || log "bpffs mount failed"
mount -t tmpfs -o mode=1777 tmpfs $R/tmp || fail "mount tmpfs on /tmp"
mount -t tmpfs -o mode=0755 tmpfs $R/run || fail "mount tmpfs on /run"
mount -t tmpfs -o mode=1777 tmpfs $R/var/tmp || fail "mount tmpfs on /var/tmp"
mkdir -p $R/run/lock $R/run/canaryscope
chmod 1777 $R/run/lock
if [ -n "$TARGET_DIR" ]; then
    if [ -d "$R$TARGET_DIR" ]; then
        mount_share target "$R$TARGET_DIR" || log "cannot mount $TARGET_DIR writable"
        # The kernel's symbols, once per kernel version, for the host's dump
        # of a stalled guest (stall-dump.py); Debian's System.map is a stub.
        # nokaslr keeps the addresses the same on every boot.
        syms="$R$TARGET_DIR/vm/kallsyms-$(uname -r)"
        if [ -d "$R$TARGET_DIR/vm" ] && [ ! -s "$syms" ]; then
            cat /proc/kallsyms > "$syms.tmp" && mv "$syms.tmp" "$syms"
        fi
    else
        log "$TARGET_DIR is not visible in the guest; not mounted writable"
    fi
fi
if [ -n "$CWD_KEPT" ]; then
    mkdir -p "$R$HOST_CWD" && mount --move /cwd "$R$HOST_CWD" || log "cannot restore cwd $HOST_CWD"
fi
cp /job/job.sh $R/run/canaryscope/job.sh
cp /modules.log $R/run/canaryscope/modules.log
ip link set lo up 2>/dev/null
hostname canaryscope-vm

stty -F /dev/ttyS0 sane 2>/dev/null
if [ "$INTERACTIVE" = 1 ] && [ "$ROWS" -gt 0 ] 2>/dev/null; then
    stty -F /dev/ttyS0 rows "$ROWS" cols "$COLS" 2>/dev/null
fi

# The job's root is the host root moved over / in a mount namespace of its
# own (what switch_root does), not a chroot into /newroot: under a chroot,
# /proc/PID/maps of a process in yet another mount namespace names its files
# with the /newroot prefix, which no real node shows. init itself stays in
# the initramfs to report the exit status and power off.
ENTER_ROOT="cd $R && /bin/mount --move . / && exec /bin/chroot . /bin/bash /run/canaryscope/job.sh"
cd /
echo "@@CANARYSCOPE-$NONCE-START uptime=$(cut -d' ' -f1 /proc/uptime)@@"
if [ "$INTERACTIVE" = 1 ]; then
    setsid -c env -i /bin/unshare -m /bin/sh -c "$ENTER_ROOT" \
        </dev/ttyS0 >/dev/ttyS0 2>&1
    rc=$?
else
    env -i /bin/unshare -m /bin/sh -c "$ENTER_ROOT" </dev/null >/dev/ttyS0 2>&1
    rc=$?
fi
echo "@@CANARYSCOPE-$NONCE-EXIT=$rc@@"
off
