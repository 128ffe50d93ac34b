#!/usr/bin/env python3
"""Where each virtual CPU of a running test VM is, read through QEMU's monitor.

    tests/vm/stall-dump.py MONITOR_SOCKET SYSTEM_MAP

For a guest that stopped running its own code (a soft lockup or RCU stall
whose stack dump never comes, because the dump itself waits for the stuck
CPU): prints, for every virtual CPU, its instruction pointer and flags as
QEMU holds them, with the kernel symbol, and the kernel text addresses found
in the top of its stack, a rough call chain. Nothing in the guest has to
cooperate.
"""
import bisect
import re
import socket
import sys
import time

STACK_WORDS = 512


class Monitor:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(path)
        self.read_prompt()

    def read_prompt(self):
        data = b""
        while not data.endswith(b"(qemu) "):
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return data.decode(errors="replace")

    def cmd(self, line):
        self.sock.sendall(line.encode() + b"\n")
        text = self.read_prompt()
        # The monitor echoes the command with terminal escapes first.
        return text.split("\n", 1)[1] if "\n" in text else text


def load_symbols(path):
    addrs, names = [], []
    try:
        f = open(path)
    except OSError as e:
        print(f"stall-dump: no kernel symbols ({e}): raw addresses only", file=sys.stderr)
        return addrs, names
    with f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[1] in "tTwW":
                addrs.append(int(parts[0], 16))
                names.append(parts[2])
    order = sorted(range(len(addrs)), key=addrs.__getitem__)
    return [addrs[i] for i in order], [names[i] for i in order]


def symbolize(symbols, addr):
    addrs, names = symbols
    i = bisect.bisect_right(addrs, addr) - 1
    if i < 0 or addr - addrs[i] > 0x10000:
        return None
    return f"{names[i]}+{addr - addrs[i]:#x}"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    monitor = Monitor(sys.argv[1])
    symbols = load_symbols(sys.argv[2])
    monitor.cmd("stop")  # a still picture: every CPU where it is now
    try:
        regs = monitor.cmd("info registers -a")
        cpus = re.split(r"\n(?=CPU#\d+)", "\n" + regs)
        for block in cpus:
            m = re.search(r"CPU#(\d+)", block)
            if not m:
                continue
            cpu = m.group(1)
            rip = int(re.search(r"RIP=([0-9a-f]+)", block).group(1), 16)
            rsp = int(re.search(r"RSP=([0-9a-f]+)", block).group(1), 16)
            rfl = int(re.search(r"RFL=([0-9a-f]+)", block).group(1), 16)
            state = "HLT" if re.search(r"\bHLT=1\b", block) else "running"
            irqs = "on" if rfl & 0x200 else "OFF"
            print(f"CPU {cpu}: {state}, interrupts {irqs}, RIP {rip:#x} {symbolize(symbols, rip) or '(user or unknown)'}")
            monitor.cmd(f"cpu {cpu}")
            words = monitor.cmd(f"x /{STACK_WORDS}gx {rsp:#x}")
            chain = []
            for value in re.findall(r"0x([0-9a-f]{16})", words.split(":", 1)[-1] if ":" in words else words):
                sym = symbolize(symbols, int(value, 16))
                if sym and (not chain or chain[-1] != sym):
                    chain.append(sym)
            for sym in chain[:40]:
                print(f"    ? {sym}")
        print(monitor.cmd("info cpus").strip())
    finally:
        monitor.cmd("cont")
        time.sleep(0.1)


if __name__ == "__main__":
    main()
