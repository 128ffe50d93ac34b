"""The processes the independent simulation (simulate.py) talks to, and how:
`canaryscope judge` services asking a real Prometheus, and stand-ins for a
slow Prometheus in front of it. Nothing here comes from observer/src/judge.
"""
import json
import socket
import socketserver
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, what, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit(f"{what} did not answer at {url}")


def http(port, method, path, body=None, timeout=60):
    """(status, text) of one request to the judge; 4xx answers included."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


class Services:
    """The judges asking Prometheus, and slow stand-ins for it: each
    started on first use, stopped with the run."""

    def __init__(self, binary, prom_port, procs):
        self.binary, self.prom_port, self.procs = binary, prom_port, procs
        self.lock = threading.Lock()
        self.started = {}
        self.judge_port = self.judge(prom_port)

    def judge(self, prom_port, *extra):
        """The port of `canaryscope judge` asking `prom_port`, with `extra` arguments."""
        with self.lock:
            key = ("judge", prom_port, *extra)
            if key not in self.started:
                port = free_port()
                self.procs.append(subprocess.Popen(
                    [self.binary, "judge", "--listen", f"127.0.0.1:{port}",
                     "--prometheus", f"http://127.0.0.1:{prom_port}", *extra],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                wait_http(f"http://127.0.0.1:{port}/healthz", "the judge")
                self.started[key] = port
            return self.started[key]

    def slow_prometheus(self, delay):
        """The port of a proxy that holds each request `delay` seconds, then
        lets the real Prometheus answer it."""
        with self.lock:
            key = ("proxy", delay)
            if key not in self.started:
                self.started[key] = slow_proxy(self.prom_port, delay)
            return self.started[key]


def slow_proxy(target, delay):
    """A Prometheus made slow: every request waits `delay`, then goes to
    `target`. The judge's client speaks HTTP/1.0, one request a connection."""

    class Held(socketserver.BaseRequestHandler):
        def handle(self):
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = self.request.recv(4096)
                if not chunk:
                    return
                request += chunk
            time.sleep(delay)
            try:
                with socket.create_connection(("127.0.0.1", target)) as upstream:
                    upstream.sendall(request)
                    while chunk := upstream.recv(65536):
                        self.request.sendall(chunk)
            except OSError:
                pass  # the judge gave up on this query: its deadline passed

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        # A judge opens a connection a query, all at once: eight analyses
        # asked together are 128, past socketserver's backlog of 5.
        request_queue_size = 256

    server = Server(("127.0.0.1", 0), Held)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_address[1]


