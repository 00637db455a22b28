"""Benchmark: the router's own CPU cost per proxied request, without sockets.

    .venv/bin/python bench/router_cpu.py [--requests 200000] [--profile]

Feeds a wrk-shaped request and an nginx-shaped response through the real client and
upstream protocol objects, with in-memory transports, on a running uvloop loop, and
prints microseconds per request. What it leaves out is what every proxy pays alike (the
syscalls and the kernel's TCP work), so it isolates the part of `bench/router.py`'s
ratio that is ours to shrink, and it is steady on a shared box where wall-clock load
tests are not. Its reference, measured in the same run, is the cost of parsing the same
two messages with httptools and no callbacks at all: the floor any httptools-based
design pays. `--profile` prints the top functions by own time (cProfile).

`--instructions` counts instead of timing: it runs the loop under valgrind's callgrind at
two request counts and prints the difference per request, which is the same from run to
run whatever else the box is doing (timings here swing by 10 %). Use it to judge a
change to the hot path; it needs valgrind and takes about a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httptools
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from keelway.router.proxy import Proxy
from keelway.router.route_table import Handling, RouteEntry, RouteTable
from keelway.router.upstream import UpstreamConnection

REQUEST = b"GET / HTTP/1.1\r\nHost: bench.test\r\n\r\n"
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Mon, 30 Nov 2026 04:16:14 GMT\r\n"
    b"Content-Type: text/plain\r\nContent-Length: 13\r\nConnection: keep-alive\r\n\r\n"
    b"hello, world\n"
)


class MemoryTransport(asyncio.Transport):
    """Collects what is written; reading and closing are no-ops that keep state."""

    def __init__(self, peer: tuple[str, int]) -> None:
        super().__init__()
        self.sent: list[bytes] = []
        self._peer = peer
        self._closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.sent.append(bytes(data))

    def writelines(self, list_of_data: object) -> None:
        self.sent.extend(list_of_data)  # type: ignore[arg-type]

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self._peer if name == "peername" else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        self._closing = True

    def can_write_eof(self) -> bool:
        return True


def wire(proxy: Proxy) -> tuple:  # type: ignore[type-arg]
    route = RouteEntry(state=Handling.SERVING, upstream="127.0.0.1:9")
    proxy.swap(RouteTable(version=1, routes={"bench.test": route}))
    target = proxy.routing.lookup(b"bench.test")
    assert target is not None
    pool = proxy.pool_for(target)
    upstream = UpstreamConnection(pool)
    up_transport = MemoryTransport(("127.0.0.1", 9))
    upstream.connection_made(up_transport)
    pool.release(upstream)
    client = proxy.protocol()
    client_transport = MemoryTransport(("127.0.0.1", 40000))
    client.connection_made(client_transport)
    return client, client_transport, upstream, up_transport


def run_router(n: int) -> float:
    proxy = Proxy(RouteTable(version=0, routes={}))
    client, client_transport, upstream, up_transport = wire(proxy)
    client_in, upstream_in = client.data_received, upstream.data_received
    sent_up, sent_down = up_transport.sent, client_transport.sent
    start = time.perf_counter()
    for _ in range(n):
        client_in(REQUEST)
        upstream_in(RESPONSE)
        sent_up.clear()
        sent_down.clear()
    elapsed = time.perf_counter() - start
    client_in(REQUEST)
    assert b"X-Forwarded-For" in b"".join(sent_up), "the request did not reach the upstream"
    upstream_in(RESPONSE)
    assert b"".join(sent_down).endswith(b"hello, world\n"), "the response did not come back"
    return elapsed


class _Bare:
    pass


def run_floor(n: int) -> float:
    request_parser = httptools.HttpRequestParser(_Bare())
    response_parser = httptools.HttpResponseParser(_Bare())
    start = time.perf_counter()
    for _ in range(n):
        request_parser.feed_data(REQUEST)
        response_parser.feed_data(RESPONSE)
    return time.perf_counter() - start


def instructions(n: int) -> int:
    """Instructions callgrind counts for this script doing `n` requests, start-up included."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out"]
        argv += [sys.executable, __file__, "--requests", str(n), "--rounds", "1", "--bare"]
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
    return int(re.search(r"Collected : (\d+)", done.stderr).group(1))  # type: ignore[union-attr]


def count_instructions() -> None:
    low, high = 2_000, 12_000
    per_request = (instructions(high) - instructions(low)) / (high - low)
    print(f"router: {per_request:,.0f} instructions per request (callgrind, {high} - {low})")


async def measure(args: argparse.Namespace) -> None:
    n = args.requests
    if args.bare:
        run_router(n)
        return
    run_router(n // 10)  # warm-up
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(run_router, n)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.top)
        return
    router = min(run_router(n) for _ in range(args.rounds))
    floor = min(run_floor(n) for _ in range(args.rounds))
    per_router, per_floor = router / n * 1e6, floor / n * 1e6
    print(f"router: {per_router:.2f} us per request (best of {args.rounds} x {n})")
    print(f"httptools parse alone, no callbacks: {per_floor:.2f} us per request")
    print(f"router / parse-only floor: {per_router / per_floor:.1f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=25, help="functions --profile lists")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per request with callgrind")
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.instructions:
        count_instructions()
        return 0
    uvloop.run(measure(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
