"""Benchmark: keelway's router against nginx over HTTPS, the same certificate, upstream
and workers, in one run (issue #21).

    .venv/bin/python bench/tls.py [--duration 10] [--connections 50] [--names 10000]

Figures, each as a ratio to nginx measured in the same run:
- HTTPS keep-alive requests/s (target ≥ 0.8x);
- new handshakes/s: every request on a new connection, a full TLS handshake each
  (target ≥ 0.9x);
- the router's RSS after handshakes for `--names` distinct names, each with its own
  certificate in the store, against its RSS before any (target: within 150 MB more).

Beside the new-handshake rates it prints the CPU time each proxy spent per new
handshake (user and system, from /proc): on a box busy with other work a rate says
as much about the neighbours as about the proxy, its CPU time per handshake much less.

Set up as bench/router.py: an nginx upstream answering a fixed 200, each proxy with one
worker pinned to CPU 0, wrk pinned to CPU 1, everything on loopback and stopped here by
pid. Certificates from a throwaway CA (trustme, ECDSA P-256 for both proxies). wrk names
the address it dials (SNI `127.0.0.1`), so the measured host is that name; the distinct
names of the RSS figure are handshaked by a Python client.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import trustme

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from router import (  # noqa: E402
    LOAD_CPU,
    Processes,
    free_port,
    pinned,
    process_tree,
    start_nginx,
    upstream_block,
    wait_port,
)

from keelway.router.client import RouterControlError, ping_sync, push_table_sync  # noqa: E402
from keelway.router.route_table import Handling, RouteEntry, RouteTable  # noqa: E402

NAME = "127.0.0.1"  # what wrk's SNI says: it names the address it dials
KEEP_ALIVE_TARGET = 0.8
HANDSHAKE_TARGET = 0.9
RSS_TARGET_MB = 150.0


def tls_proxy_block(port: int, upstream_port: int, cert: Path, key: Path) -> str:
    return f"""  upstream app {{ server 127.0.0.1:{upstream_port}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port} ssl reuseport;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    ssl_protocols TLSv1.2 TLSv1.3;
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


def lay_down(ca: trustme.CA, certs: Path, name: str) -> tuple[Path, Path]:
    issued = ca.issue_cert(name)
    where = certs / name
    where.mkdir(parents=True, exist_ok=True)
    issued.private_key_pem.write_to_path(str(where / "privkey.pem"))
    issued.cert_chain_pems[0].write_to_path(str(where / "fullchain.pem"))
    return where / "fullchain.pem", where / "privkey.pem"


def start_tls_router(procs: Processes, tmp: Path, http_port: int, https_port: int,
                     certs: Path, routes: dict[str, RouteEntry]) -> int:
    control = tmp / "router.sock"
    argv = [sys.executable, "-m", "keelway.router", "--listen", f"127.0.0.1:{http_port}",
            "--https-listen", f"127.0.0.1:{https_port}", "--certs", str(certs),
            "--control", str(control), "--state", str(tmp / "routes.json"), "--workers", "1"]
    pid = procs.start(pinned("0", argv), cwd=ROOT, stderr=subprocess.DEVNULL).pid
    wait_port(https_port)
    deadline = time.monotonic() + 10
    while True:
        try:
            ping_sync(control)
            break
        except RouterControlError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    push_table_sync(control, RouteTable(version=1, routes=routes))
    return pid


def wrk_rps(port: int, connections: int, duration_s: int, new_connections: bool) -> float:
    argv = ["wrk", "-t", "2" if connections >= 4 else "1", "-c", str(connections),
            "-d", f"{duration_s}s", "--timeout", "5s"]
    if new_connections:
        argv += ["-H", "Connection: close"]
    argv.append(f"https://{NAME}:{port}/")
    out = subprocess.run(pinned(LOAD_CPU, argv), capture_output=True, text=True, check=True,
                         timeout=duration_s + 30).stdout
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors and int(errors.group(1)):
        raise RuntimeError(f"wrk saw failures:\n{out}")
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]


def cpu_s(pids: list[int]) -> float:
    """User plus system CPU time of `pids` so far."""
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def handshake_every_name(port: int, names: list[str], ca: trustme.CA) -> int:
    context = ssl.create_default_context()
    ca.configure_trust(context)

    def one(name: str) -> bool:
        with contextlib.suppress(OSError), \
                socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                context.wrap_socket(raw, server_hostname=name):
            return True
        return False

    with ThreadPoolExecutor(8) as pool:
        return sum(pool.map(one, names))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians")
    parser.add_argument("--names", type=int, default=10000)
    args = parser.parse_args()
    ca = trustme.CA(key_type=trustme.KeyType.ECDSA)
    procs = Processes()
    tmp = Path(tempfile.mkdtemp(prefix="kw-tls-"))
    try:
        certs = tmp / "certs"
        cert, key = lay_down(ca, certs, NAME)
        ports = {n: free_port() for n in ("upstream", "http", "keelway", "nginx")}
        start_nginx(procs, tmp / "upstream", upstream_block(ports["upstream"]),
                    ports["upstream"])
        upstream = f"127.0.0.1:{ports['upstream']}"
        names = [f"n{i:05}.bench.test" for i in range(args.names)]
        routes = {n: RouteEntry(state=Handling.SERVING, upstream=upstream)
                  for n in (NAME, *names)}
        router = start_tls_router(procs, tmp, ports["http"], ports["keelway"], certs, routes)
        nginx = start_nginx(procs, tmp / "proxy", tls_proxy_block(
            ports["nginx"], ports["upstream"], cert, key), ports["nginx"])
        figures: dict[str, dict[str, list[float]]] = {
            "keep_alive": {"keelway": [], "nginx": []},
            "handshakes": {"keelway": [], "nginx": []},
            "handshake_cpu_us": {"keelway": [], "nginx": []}}
        pids = {"keelway": [router], "nginx": process_tree(nginx)}
        for _ in range(args.rounds):
            for which in ("keelway", "nginx"):
                figures["keep_alive"][which].append(
                    wrk_rps(ports[which], args.connections, args.duration, False))
                spent = cpu_s(pids[which])
                rate = wrk_rps(ports[which], args.connections, args.duration, True)
                spent = cpu_s(pids[which]) - spent
                figures["handshakes"][which].append(rate)
                figures["handshake_cpu_us"][which].append(
                    spent / (rate * args.duration) * 1e6)
        medians = {kind: {w: sorted(v)[len(v) // 2] for w, v in by.items()}
                   for kind, by in figures.items()}
        before = rss_mb(router)
        began = time.monotonic()
        for name in names:
            lay_down(ca, certs, name)
        laid_s = time.monotonic() - began
        began = time.monotonic()
        done = handshake_every_name(ports["keelway"], names, ca)
        shaken_s = time.monotonic() - began
        after = rss_mb(router)
        keep, shake = medians["keep_alive"], medians["handshakes"]
        cost = medians["handshake_cpu_us"]
        ratio_keep = keep["keelway"] / keep["nginx"]
        ratio_shake = shake["keelway"] / shake["nginx"]
        print(f"HTTPS keep-alive req/s: keelway {keep['keelway']:.0f}, nginx "
              f"{keep['nginx']:.0f}: {ratio_keep:.2f}x (target ≥ {KEEP_ALIVE_TARGET}x)")
        print(f"new handshakes/s: keelway {shake['keelway']:.0f}, nginx "
              f"{shake['nginx']:.0f}: {ratio_shake:.2f}x (target ≥ {HANDSHAKE_TARGET}x)")
        print(f"CPU per new handshake: keelway {cost['keelway']:.0f} us, nginx "
              f"{cost['nginx']:.0f} us: nginx's is {cost['nginx'] / cost['keelway']:.2f}x "
              f"keelway's")
        print(f"router RSS: {before:.1f} MB before, {after:.1f} MB after {done} of "
              f"{len(names)} names' first handshakes ({shaken_s:.1f} s; their certificates "
              f"laid down in {laid_s:.1f} s): +{after - before:.1f} MB "
              f"(target ≤ {RSS_TARGET_MB:.0f} MB)")
        print(f"nginx processes {process_tree(nginx)}; rounds {args.rounds} x "
              f"{args.duration} s at {args.connections} connections")
        ok = (ratio_keep >= KEEP_ALIVE_TARGET and ratio_shake >= HANDSHAKE_TARGET
              and after - before <= RSS_TARGET_MB and done == len(names))
        return 0 if ok else 1
    finally:
        procs.stop_all()
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
