"""Benchmark: how long a parked (cold) and a frozen (thaw) instance take to answer,
against the app's own boot and a served request, for a stdlib app and a Django app.

    .venv/bin/python bench/wake.py [--rounds 30] [--apps stdlib,django] [--storm 50]

Per app, in one keelway home, round by round (paired: on a shared box the load moves
from one second to the next, and both figures of a pair move with it):
- boot: the app's own web command, as keelway runs it (the same argv, environment and
  directory, read from the running web's /proc entry), started directly with another
  PORT and polled every 1 ms until its health path answers: spawn to ready. Twice: bare
  (`boot_direct`), and inside a fresh cgroup of each hierarchy keelway puts an app in
  (`boot`), which the overhead is taken against: on some kernels a process merely
  joined to a cgroup starts slower (a Python's start was 12 ms slower in any v1 memory
  cgroup on the box these figures come from), and that is the box's price of an app in
  a cgroup, not keelway's work;
- cold: the instance parked, then one GET through the router: request to response;
- thaw: the instance frozen, then one GET: request to response;
- served: a GET to the awake instance (the median of 5).
It prints p50 and p99 of each, and of the overheads the targets are about (SPEC §7,
issue #22): cold - boot (p50 <= 10 ms, p99 <= 25 ms) and thaw - served (p50 <= 5 ms,
p99 <= 20 ms).

`--storm N`: N parked instances of the stdlib app all requested at once; the time until
every one answered, against N boots of the app started at once directly.

A fresh KEELWAY_HOME and router port per run; requests go only to 127.0.0.1; everything
started here is stopped here (`keelway down`, then by pid if anything is left).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import shutil
import signal
import statistics
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

APPS = {"stdlib": ROOT / "examples" / "hello",
        "django": ROOT / "examples" / "guide" / "django_polls"}
TARGETS = {"cold_overhead": (10.0, 25.0), "thaw_overhead": (5.0, 20.0)}


def cli(env: dict[str, str], *args: str, timeout_s: float = 600) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-m", "keelway.cli.main", *args, "--json"],
                         env=env, capture_output=True, text=True, timeout=timeout_s,
                         stdin=subprocess.DEVNULL)
    if out.returncode != 0:
        raise RuntimeError(f"keelway {' '.join(args)}: {out.stdout}{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def get_s(port: int, host: str, path: str = "/health") -> tuple[float, int]:
    """One GET through the router: seconds until the whole answer, and its status."""
    with contextlib.closing(http.client.HTTPConnection("127.0.0.1", port, timeout=60)) as conn:
        start = time.perf_counter()
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        response.read()
        return time.perf_counter() - start, response.status


def answers(port: int, host: str, path: str) -> bool:
    """Whether the app answers `path` yet, as keelway's readiness counts it (not 5xx)."""
    with contextlib.closing(http.client.HTTPConnection("127.0.0.1", port, timeout=1)) as conn:
        try:
            conn.request("GET", path, headers={"Host": host})
            return conn.getresponse().status < 500
        except OSError:
            return False


def web_of(env: dict[str, str], app: str, host: str) -> tuple[list[str], dict[str, str], str]:
    """The running web's argv, environment and directory, as keelway started it."""
    status = cli(env, "status", app)
    inst = next(i for a in status["apps"] for i in a["instances"] if i["host"] == host)
    web = next(p for p in inst["processes"] if p["service"] == "web" and p["active"])
    pid = int(web["pid"])
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    environ = dict(item.split(b"=", 1) for item in
                   Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in item)
    return ([a.decode() for a in argv],
            {k.decode(): v.decode() for k, v in environ.items()},
            os.readlink(f"/proc/{pid}/cwd"))


CGROUPS = Path("/sys/fs/cgroup")


def fresh_cgroups() -> list[Path]:
    """A new cgroup in each hierarchy keelway uses (v1: memory, cpu, pids, freezer; v2:
    the unified one), or none where this process may not make them."""
    name = f"keelway-bench-{os.getpid()}-{time.monotonic_ns()}"
    made = []
    roots = ([CGROUPS / c for c in ("memory", "cpu", "pids", "freezer")]
             if (CGROUPS / "memory").is_dir() else [CGROUPS])
    for root in roots:
        try:
            (root / name).mkdir()
        except OSError:
            continue
        made.append(root / name)
    return made


def boot_s(argv: list[str], environ: dict[str, str], cwd: str, health: str = "/health",
           host: str = "boot.test", in_cgroup: bool = False) -> float:
    """`boot_once`, tried again (up to 3 times) where its port was taken meanwhile."""
    for attempt in range(3):
        try:
            return boot_once(argv, environ, cwd, health, host, in_cgroup)
        except RuntimeError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


def boot_once(argv: list[str], environ: dict[str, str], cwd: str, health: str,
              host: str, in_cgroup: bool) -> float:
    """The app's own start: its web command run directly (`in_cgroup`: joined to fresh
    cgroups first, by a shell that then execs it), spawn until health answers."""
    port = free_port()
    env = {**environ, "PORT": str(port)}
    # A Procfile's `$PORT` was expanded into the argv by the shell that ran it.
    argv = [a.replace(environ["PORT"], str(port)) if environ.get("PORT") else a
            for a in argv]
    cgroups = fresh_cgroups() if in_cgroup else []
    if cgroups:
        joins = "; ".join(f"echo $$ > {c}/cgroup.procs" for c in cgroups)
        argv = ["/bin/sh", "-c", f'{joins}; exec "$@"', "sh", *argv]
    said = tempfile.TemporaryFile()  # noqa: SIM115 (closed in the finally below)
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=said, stderr=said,
                            start_new_session=True)
    try:
        while not answers(port, host, health):
            if time.perf_counter() - started > 30 or proc.poll() is not None:
                said.seek(0)
                raise RuntimeError(f"{argv} did not become ready in 30 s (exit "
                                   f"{proc.poll()}): {said.read()[-500:]!r}")
            time.sleep(0.001)
        return time.perf_counter() - started
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        said.close()
        for cgroup in cgroups:
            for _ in range(100):  # its members' exit reaches the cgroup a moment later
                try:
                    cgroup.rmdir()
                    break
                except OSError:
                    time.sleep(0.01)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1e3 for v in values_s]
    return {"p50": round(statistics.median(ms), 2), "p99": round(pct(ms, 0.99), 2)}


def one_app(env: dict[str, str], port: int, name: str, source: Path,
            rounds: int) -> dict[str, Any]:
    host = f"{name}.test"
    cli(env, "deploy", name, str(source), "--host", host)
    health = "/health" if name == "stdlib" else "/"
    argv, environ, cwd = web_of(env, name, host)
    boots, directs, colds, thaws, serveds = [], [], [], [], []
    for _ in range(rounds):
        directs.append(boot_s(argv, environ, cwd, health, host))
        boots.append(boot_s(argv, environ, cwd, health, host, in_cgroup=True))
        cli(env, "park", host)
        took, status = get_s(port, host, health)
        if status >= 500:
            raise RuntimeError(f"a request to the parked {host} got {status}")
        colds.append(took)
        served = [get_s(port, host, health)[0] for _ in range(5)]
        serveds.append(statistics.median(served))
        cli(env, "freeze", host)
        took, status = get_s(port, host, health)
        if status >= 500:
            raise RuntimeError(f"a request to the frozen {host} got {status}")
        thaws.append(took)
    cold_over = [c - b for c, b in zip(colds, boots, strict=True)]
    cold_over_direct = [c - b for c, b in zip(colds, directs, strict=True)]
    thaw_over = [t - s for t, s in zip(thaws, serveds, strict=True)]
    result: dict[str, Any] = {
        "rounds": rounds, "boot_ms": summary(boots), "boot_direct_ms": summary(directs),
        "cold_overhead_vs_direct_ms": summary(cold_over_direct), "cold_ms": summary(colds),
        "thaw_ms": summary(thaws), "served_ms": summary(serveds),
        "cold_overhead_ms": summary(cold_over), "thaw_overhead_ms": summary(thaw_over)}
    for key, (p50, p99) in TARGETS.items():
        seen = result[f"{key}_ms"]
        seen["target"] = {"p50": p50, "p99": p99}
        seen["met"] = seen["p50"] <= p50 and seen["p99"] <= p99
    return result


def storm(env: dict[str, str], port: int, count: int) -> dict[str, Any]:
    """`count` parked instances requested at once, against `count` direct boots at once."""
    hosts = [f"s{i}.storm.test" for i in range(count)]
    cli(env, "deploy", "storm", str(APPS["stdlib"]), *(a for h in hosts for a in ("--host", h)))
    argv, environ, cwd = web_of(env, "storm", hosts[0])
    for host in hosts:
        cli(env, "park", host)
    with ThreadPoolExecutor(count) as pool:
        started = time.perf_counter()
        answers = list(pool.map(lambda h: get_s(port, h)[1], hosts))
        woken_s = time.perf_counter() - started
        started = time.perf_counter()
        list(pool.map(lambda _: boot_s(argv, environ, cwd, "/health", hosts[0]),
                      range(count)))
        direct_s = time.perf_counter() - started
    return {"instances": count, "all_answered_s": round(woken_s, 3),
            "direct_boots_s": round(direct_s, 3), "ratio": round(woken_s / direct_s, 2),
            "statuses": sorted(set(answers))}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--apps", default="stdlib,django")
    parser.add_argument("--storm", type=int, default=50)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="kw-wake-", dir="/tmp"))
    tmp.chmod(0o711)
    port = free_port()
    env = {**os.environ, "KEELWAY_HOME": str(tmp / "home"), "KEELWAY_REPLICATE": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                       os.environ.get("PYTHONPATH")]))}
    out: dict[str, Any] = {}
    try:
        cli(env, "up", "-d", "--http", f"127.0.0.1:{port}")
        for name in args.apps.split(","):
            out[name] = one_app(env, port, name, APPS[name], args.rounds)
            print(json.dumps({name: out[name]}, indent=2), flush=True)
        if args.storm:
            out["storm"] = storm(env, port, args.storm)
            print(json.dumps({"storm": out["storm"]}, indent=2), flush=True)
    finally:
        subprocess.run([sys.executable, "-m", "keelway.cli.main", "down"], env=env,
                       capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
        with contextlib.suppress(ImportError):
            from tests.e2e.harness import kill_home_processes

            kill_home_processes(tmp / "home")
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
