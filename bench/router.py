"""Benchmark: keelway's router against nginx, proxying the same upstream, in one run.

    .venv/bin/python bench/router.py [--duration 10] [--connections 50]

What runs (everything on loopback, everything started here is stopped here by pid, also
on Ctrl-C or an exception):

- upstream: nginx with 1 worker answering a fixed 13-byte 200 with keep-alive. nginx
  rather than a Python server because it is the cheapest, steadiest upstream there is:
  the upstream then costs both proxies the same and little, so the figures compare the
  proxies rather than the upstream.
- keelway's router (1 process) and nginx as a reverse proxy (1 worker,
  `proxy_http_version 1.1`, upstream keepalive, X-Forwarded-* set like keelway does).
- wrk: the upstream directly, then each proxy, at `--connections` for `--duration` s,
  then each again with 1 connection (light load) for the added-latency figures.

Pinning (2-core box): both proxies run on CPU 0; the upstream and wrk share CPU 1. The
proxy under test thus owns a core, and neither proxy competes with the load generator.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from keelway.router.client import RouterControlError, ping_sync, push_table_sync  # noqa: E402
from keelway.router.route_table import Handling, RouteEntry, RouteTable  # noqa: E402

HOST = "bench.test"
PROXY_CPU = "0"
LOAD_CPU = "1"


@dataclass(frozen=True)
class WrkResult:
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    errors: str
    proxy_cpu_pct: float = 0.0


def process_tree(pid: int) -> list[int]:
    """`pid` and its direct children (nginx's master and workers)."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    children.append(int(entry.name))
    return [pid, *children]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of `pids`, from /proc."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def pinned(cpu: str, argv: list[str]) -> list[str]:
    taskset = shutil.which("taskset")
    return [taskset, "-c", cpu, *argv] if taskset and (os.cpu_count() or 1) > 1 else argv


def nginx_temp_directives(prefix: Path) -> str:
    """`*_temp_path` lines for every temp path this nginx build knows, inside `prefix`."""
    built = subprocess.run(["nginx", "-V"], capture_output=True, text=True, check=True).stderr
    kinds = re.findall(r"--http-(\w+)-temp-path", built)
    return "".join(f"  {kind}_temp_path {prefix}/{kind}_temp;\n" for kind in kinds)


def nginx_conf(prefix: Path, server_block: str, workers: int = 1) -> str:
    user = "user root root;\n" if os.geteuid() == 0 else ""
    return f"""{user}worker_processes {workers};
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
{nginx_temp_directives(prefix)}  keepalive_requests 1000000;
  keepalive_timeout 60s;
{server_block}
}}
"""


def upstream_block(port: int) -> str:
    return f"""  server {{
    listen 127.0.0.1:{port} reuseport;
    location / {{ default_type text/plain; return 200 "hello, world\\n"; }}
  }}"""


def proxy_block(port: int, upstream_port: int) -> str:
    return f"""  upstream app {{ server 127.0.0.1:{upstream_port}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port} reuseport;
    location / {{
      proxy_pass http://app;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto $scheme;
      proxy_set_header X-Forwarded-Host $host;
    }}
  }}"""


class Processes:
    """Everything this benchmark started, stopped by pid in reverse order."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(argv, **kwargs)  # type: ignore[call-overload]
        self._procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self._procs):
            try:
                proc.wait(timeout=12)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)


def wait_port(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port} after {timeout_s} s")


def proxy_cpus(workers: int) -> str:
    """The proxies' CPUs: CPU 0 alone for one worker, else the first `workers` CPUs."""
    return PROXY_CPU if workers == 1 else f"0-{min(workers, os.cpu_count() or 1) - 1}"


def start_nginx(procs: Processes, prefix: Path, server_block: str, port: int,
                workers: int = 1) -> int:
    prefix.mkdir(parents=True)
    conf = prefix / "nginx.conf"
    conf.write_text(nginx_conf(prefix, server_block, workers))
    argv = ["nginx", "-p", str(prefix), "-c", str(conf), "-g", "daemon off;"]
    cpu = LOAD_CPU if "return 200" in server_block else proxy_cpus(workers)
    pid = procs.start(pinned(cpu, argv), stderr=subprocess.DEVNULL).pid
    wait_port(port)
    return pid


def start_router(procs: Processes, tmp: Path, port: int, upstream_port: int,
                 workers: int = 1, access_log: bool = False) -> int:
    control = tmp / "router.sock"
    argv = [sys.executable, "-m", "keelway.router", "--listen", f"127.0.0.1:{port}"]
    argv += ["--control", str(control), "--state", str(tmp / "routes.json")]
    argv += ["--workers", str(workers)]
    # As the control plane runs it (keelway/router/access_log.py); nginx's stays off.
    argv += ["--access-log", str(tmp / "logs")] if access_log else []
    pid = procs.start(pinned(proxy_cpus(workers), argv), cwd=ROOT,
                      stderr=subprocess.DEVNULL).pid
    wait_port(port)
    # The router binds its port before its control socket: wait for both.
    deadline = time.monotonic() + 10
    while True:
        try:
            ping_sync(control)
            break
        except RouterControlError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    route = RouteEntry(state=Handling.SERVING, upstream=f"127.0.0.1:{upstream_port}")
    push_table_sync(control, RouteTable(version=1, routes={HOST: route}))
    return pid


_UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def wrk(port: int, connections: int, duration_s: int, measured: list[int]) -> WrkResult:
    """Run wrk; `measured` are the pids whose CPU use over the run is reported."""
    threads = 1 if connections < 4 else 2
    argv = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{duration_s}s"]
    argv += ["--latency", "--timeout", "5s", "-H", f"Host: {HOST}", f"http://127.0.0.1:{port}/"]
    cpu_before, t_before = cpu_seconds(measured), time.monotonic()
    out = subprocess.run(
        pinned(LOAD_CPU, argv),
        capture_output=True,
        text=True,
        check=True,
        timeout=duration_s + 30,
    ).stdout
    cpu_pct = 100 * (cpu_seconds(measured) - cpu_before) / (time.monotonic() - t_before)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    pct = {
        m.group(1): float(m.group(2)) * _UNIT_MS[m.group(3)]
        for m in re.finditer(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s|m)\s*$", out, re.M)
    }
    errors = re.search(r"Non-2xx or 3xx responses: \d+|Socket errors:.*", out)
    return WrkResult(rps, pct["50"], pct["99"], errors.group(0) if errors else "none", cpu_pct)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=10, help="seconds per loaded run")
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--light-duration", type=int, default=3, help="seconds per 1-conn run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians")
    parser.add_argument("--workers", type=int, default=1,
                        help="processes for each proxy (keelway --workers, nginx "
                             "worker_processes)")
    parser.add_argument("--access-log", action="store_true",
                        help="keelway's router writes its access log (as `keelway up` runs it)")
    args = parser.parse_args()
    for tool in ("nginx", "wrk"):
        if shutil.which(tool) is None:
            print(f"{tool} is not installed: apt-get install -y nginx-light wrk", file=sys.stderr)
            return 2
    procs = Processes()
    tmp = Path(tempfile.mkdtemp(prefix="keelway-bench-"))
    tmp.chmod(0o755)
    ports = {name: free_port() for name in ("upstream", "keelway", "nginx")}
    try:
        with sigterm_as_interrupt():
            upstream = start_nginx(
                procs, tmp / "upstream", upstream_block(ports["upstream"]), ports["upstream"]
            )
            router = start_router(procs, tmp, ports["keelway"], ports["upstream"],
                                  args.workers, args.access_log)
            nginx = start_nginx(
                procs, tmp / "proxy", proxy_block(ports["nginx"], ports["upstream"]),
                ports["nginx"], args.workers,
            )
            measured = {
                "upstream": process_tree(upstream),
                "keelway": process_tree(router),
                "nginx": process_tree(nginx),
            }
            for port in ports.values():
                wrk(port, args.connections, 1, [])  # warm-up: pools filled, caches hot
            # Rounds interleave the targets, so drift on a shared box (other tenants,
            # frequency changes) hits all three alike; each figure is the median round.
            loaded: dict[str, list[WrkResult]] = {name: [] for name in ports}
            light: dict[str, list[WrkResult]] = {name: [] for name in ports}
            for _ in range(args.rounds):
                for name, port in ports.items():
                    loaded[name].append(wrk(port, args.connections, args.duration, measured[name]))
            for _ in range(args.rounds):
                for name, port in ports.items():
                    light[name].append(wrk(port, 1, args.light_duration, measured[name]))
    except KeyboardInterrupt:
        print("interrupted; stopping everything", file=sys.stderr)
        return 130
    finally:
        procs.stop_all()
        shutil.rmtree(tmp, ignore_errors=True)
    report(args, loaded, light)
    return 0


def median_run(runs: list[WrkResult]) -> WrkResult:
    """The run with the median throughput (its latencies are reported with it)."""
    return sorted(runs, key=lambda r: r.requests_per_s)[len(runs) // 2]


def report(
    args: argparse.Namespace,
    loaded_runs: dict[str, list[WrkResult]],
    light_runs: dict[str, list[WrkResult]],
) -> None:
    loaded = {name: median_run(runs) for name, runs in loaded_runs.items()}
    light = {name: median_run(runs) for name, runs in light_runs.items()}
    native = subprocess.run(
        [sys.executable, "-c", "import keelway.router as r; print(r.NATIVE)"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.strip() == "True"
    print("keelway's hot path: " + ("compiled (mypyc)" if native else "pure Python")
          + (", access log on" if args.access_log else ", access log off"))
    print(
        f"wrk -c{args.connections} -d{args.duration}s, median of {args.rounds} interleaved "
        f"rounds ({args.workers} worker(s) per proxy on CPU {proxy_cpus(args.workers)}, "
        f"upstream + wrk on CPU {LOAD_CPU})"
    )
    print(f"{'target':10} {'req/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'cpu %':>6}  errors")
    for name, r in loaded.items():
        print(
            f"{name:10} {r.requests_per_s:10.0f} {r.p50_ms:8.3f} {r.p99_ms:8.3f} "
            f"{r.proxy_cpu_pct:6.0f}  {r.errors}"
        )
    print("(cpu %: the target's own processes over the run; 100 = one core)")
    rounds = [
        k.requests_per_s / n.requests_per_s
        for k, n in zip(loaded_runs["keelway"], loaded_runs["nginx"], strict=True)
    ]
    ratio = loaded["keelway"].requests_per_s / loaded["nginx"].requests_per_s
    print(
        f"keelway/nginx throughput ratio: {ratio:.2f} "
        f"(per round: {', '.join(f'{r:.2f}' for r in rounds)})"
    )
    print(f"\nlight load, wrk -c1 -d{args.light_duration}s: added latency over the upstream")
    base = light["upstream"]
    print(f"{'target':10} {'req/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'+p50 ms':>8} {'+p99 ms':>8}")
    for name, r in light.items():
        print(
            f"{name:10} {r.requests_per_s:10.0f} {r.p50_ms:8.3f} {r.p99_ms:8.3f} "
            f"{r.p50_ms - base.p50_ms:8.3f} {r.p99_ms - base.p99_ms:8.3f}"
        )


if __name__ == "__main__":
    sys.exit(main())
