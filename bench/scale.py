"""Benchmark: one app at tenant density, 10,000 instances of which 100 are awake.

    .venv/bin/python bench/scale.py [--instances 10000] [--awake 100]

SPEC §7 figures, each printed beside its target:
- control-plane RSS with every instance recorded and `--awake` of them running (≤ 150 MB);
- boot reconciliation after the control plane is SIGKILLed (≤ 2 s), as the daemon's log
  times it, and the wall time of the `keelway up -d` that brings it back;
- the router's RSS (main process and workers) and the time to push the whole
  10,000-route table to it (the reference: the same push of a one-route table, so the
  ratio is the cost of density);
- how long adding the parked instances took, in batches of one request each;
- `keelway status APP` and `keelway instances list APP` wall time, the CLI end to end,
  human (a page) and `--json` (every instance), each the median of ROUNDS (≤ 1 s), and
  the wall time of `keelway up -d` (human) after the SIGKILL (≤ 2 s).

The instances are added `--parked` (nothing runs until a request wakes one), then
`--awake` of them are woken at once by one request each through the router, so the
wake path runs concurrently too. A fresh KEELWAY_HOME and router port per run; requests
go only to 127.0.0.1; everything started here is stopped here (`keelway down`, then by
pid if anything is left).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from deploy_under_load import free_port  # noqa: E402

from keelway.router.client import get_table_sync, push_table_sync  # noqa: E402
from keelway.router.route_table import RouteTable  # noqa: E402

APP = "scale"
BATCH = 1000
RSS_TARGET_MB = 150.0
BOOT_TARGET_S = 2.0
COMMAND_TARGET_S = 1.0
UP_TARGET_S = 2.0
ROUNDS = 3
# The reading commands timed, each as a user types it (`--json` answers every instance).
READS = {
    "status_human_s": ("status", APP),
    "status_json_s": ("status", APP, "--json"),
    "instances_list_human_s": ("instances", "list", APP),
    "instances_list_json_s": ("instances", "list", APP, "--json"),
}


def cli(env: dict[str, str], *args: str, timeout_s: float = 600) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "keelway.cli.main", *args, "--json"],
                         env=env, capture_output=True, text=True, timeout=timeout_s,
                         stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        raise RuntimeError(f"keelway {' '.join(args)}: {out.stdout}{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def wall_s(env: dict[str, str], *args: str) -> float:
    """The median wall time of `keelway ARGS` over ROUNDS runs, start to exit, its
    output read whole (as a terminal or a pipe would)."""
    times = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        out = subprocess.run([sys.executable, "-m", "keelway.cli.main", *args], env=env,
                             capture_output=True, timeout=600, stdin=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
        if out.returncode != 0:
            raise RuntimeError(f"keelway {' '.join(args)}: {out.stdout!r}{out.stderr!r}")
    return round(sorted(times)[len(times) // 2], 3)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def get(port: int, host: str) -> int:
    with contextlib.closing(http.client.HTTPConnection("127.0.0.1", port, timeout=120)) as c:
        c.request("GET", "/health", headers={"Host": host})
        response = c.getresponse()
        response.read()
        return response.status


def push_s(sock: Path, table: RouteTable, rounds: int = 5) -> float:
    """The median wall time of pushing `table` (its own version again: accepted, applied
    whole, persisted by the router)."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        push_table_sync(sock, table, timeout_s=60)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def boot_seconds(log: Path) -> float | None:
    found = re.findall(r"boot: (\d+) instances reconciled \((\d+) with work\) in ([\d.]+) s",
                       log.read_text(errors="replace"))
    return float(found[-1][2]) if found else None


def run(instances: int, awake: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="kw-scale-"))
    port = free_port()
    home = tmp / "home"
    env = {**os.environ, "KEELWAY_HOME": str(home),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                       os.environ.get("PYTHONPATH")]))}
    app = tmp / "app"
    shutil.copytree(ROOT / "examples" / "hello", app,
                    ignore=shutil.ignore_patterns("__pycache__"))
    hosts = [f"t{i}.{APP}.test" for i in range(instances)]
    result: dict[str, Any] = {"instances": instances, "awake": awake}
    try:
        daemon = cli(env, "up", "-d", "--http", f"127.0.0.1:{port}")["pid"]
        cli(env, "deploy", APP, str(app), "--host", hosts[0])
        started = time.perf_counter()
        for at in range(1, instances, BATCH):
            cli(env, "instances", "add", APP, *hosts[at:at + BATCH], "--parked")
            print(f"  added {min(at + BATCH, instances)} of {instances}", file=sys.stderr)
        result["add_parked_s"] = round(time.perf_counter() - started, 2)

        started = time.perf_counter()
        with ThreadPoolExecutor(32) as pool:
            codes = list(pool.map(lambda h: get(port, h), hosts[1:awake]))
        result["wake_concurrently_s"] = round(time.perf_counter() - started, 2)
        result["wake_answers"] = {str(c): codes.count(c) for c in sorted(set(codes))}

        time.sleep(2)  # the periodic pass and the wakes' settle windows come to rest
        result["control_plane_rss_mb"] = round(rss_mb(daemon), 1)
        router = int((home / "router" / "router.pid").read_text().split()[0])
        result["router_rss_mb"] = round(rss_mb(router) + sum(rss_mb(p)
                                                             for p in children(router)), 1)
        sock = home / "router" / "control.sock"
        table = get_table_sync(sock, timeout_s=60)
        result["routes"] = len(table.routes)
        one = RouteTable(version=table.version, routes=dict(list(table.routes.items())[:1]))
        full_s, one_s = push_s(sock, table), push_s(sock, one)
        push_table_sync(sock, table, timeout_s=60)  # put the whole table back
        result["push_table_ms"] = round(full_s * 1e3, 1)
        result["push_one_route_ms"] = round(one_s * 1e3, 2)
        result["push_ratio"] = round(full_s / one_s, 1)

        for name, args in READS.items():
            result[name] = wall_s(env, *args)
            print(f"  {name}: {result[name]} s (target ≤ {COMMAND_TARGET_S} s)",
                  file=sys.stderr)

        os.kill(daemon, signal.SIGKILL)
        while Path(f"/proc/{daemon}").exists():
            time.sleep(0.01)
        # As a person types it (no --json: the words, not every URL); the new daemon's
        # pid is the one its lock file names.
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "keelway.cli.main", "up", "-d", "--http",
                        f"127.0.0.1:{port}"], env=env, check=True, capture_output=True,
                       timeout=600, stdin=subprocess.DEVNULL)
        result["up_after_sigkill_s"] = round(time.perf_counter() - started, 2)
        daemon = int((home / "keelway.lock").read_text().split()[0])
        print(f"  up_after_sigkill_s: {result['up_after_sigkill_s']} s (target ≤ "
              f"{UP_TARGET_S} s)", file=sys.stderr)
        result["boot_reconciliation_s"] = boot_seconds(home / "logs" / "keelway.log")
        result["control_plane_rss_after_boot_mb"] = round(rss_mb(daemon), 1)
        with ThreadPoolExecutor(32) as pool:
            after = list(pool.map(lambda h: get(port, h), hosts[:awake]))
        result["awake_answer_200_after_boot"] = after.count(200)
        result["ok"] = bool(
            result["control_plane_rss_mb"] <= RSS_TARGET_MB
            and (result["boot_reconciliation_s"] or 99) <= BOOT_TARGET_S
            and all(result[name] <= COMMAND_TARGET_S for name in READS)
            and result["up_after_sigkill_s"] <= UP_TARGET_S
            and result["awake_answer_200_after_boot"] == awake)
        return result
    finally:
        subprocess.run([sys.executable, "-m", "keelway.cli.main", "down"], env=env,
                       capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
        with contextlib.suppress(ImportError):
            from tests.e2e.harness import kill_home_processes

            kill_home_processes(home)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--instances", type=int, default=10_000)
    parser.add_argument("--awake", type=int, default=100)
    args = parser.parse_args()
    result = run(args.instances, args.awake)
    targets: dict[str, float] = {"control_plane_rss_mb": RSS_TARGET_MB,
                                 "boot_reconciliation_s": BOOT_TARGET_S,
                                 "up_after_sigkill_s": UP_TARGET_S,
                                 **dict.fromkeys(READS, COMMAND_TARGET_S)}
    print(json.dumps({**result, "targets": targets}, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
