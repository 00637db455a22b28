"""Benchmark: back-to-back overlap deploys of examples/hello while wrk loads it.

    .venv/bin/python bench/deploy_under_load.py [--deploys 50] [--connections 8] [--threads 2]

SPEC §7 figures: failed requests during 50 overlap deploys under load (target 0), and a
deploy of an already staged build minus the settle window (target <= 1 s + app boot).
A fresh KEELWAY_HOME and router port per run; load goes only to 127.0.0.1; wrk runs for
a bounded time; everything started here is stopped here (try/finally, by pid).
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
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from keelway.builds.manifest import load_manifest  # noqa: E402

KEELWAY = str(ROOT / ".venv" / "bin" / "keelway")
HOST = "bench.test"
# Counts non-2xx per status and timestamps each one (CLOCK_REALTIME through LuaJIT's FFI)
# so failures can be placed against the deploy steps journaled in keelway.db.
LUA = r"""
local ffi = require("ffi")
ffi.cdef[[ typedef struct { long s; long ns; } kw_ts; int clock_gettime(int, kw_ts *); ]]
local now, threads = ffi.new("kw_ts"), {}
function setup(thread) table.insert(threads, thread) end
function init(args) bad = {}; fails = {} end
function response(status, headers, body)
  if status < 200 or status > 299 then
    bad[status] = (bad[status] or 0) + 1
    if #fails < 5000 then
      ffi.C.clock_gettime(0, now)
      fails[#fails + 1] = string.format("%d.%06d %d", tonumber(now.s),
                                        math.floor(tonumber(now.ns) / 1000), status)
    end
  end
end
function done(summary, latency, requests)
  for _, t in ipairs(threads) do
    for s, n in pairs(t:get("bad")) do io.write(string.format("KW status %d %d\n", s, n)) end
    for _, f in ipairs(t:get("fails")) do io.write("KW fail " .. f .. "\n") end
  end
end
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keelway(env: dict[str, str], *args: str, timeout: float = 120) -> dict[str, Any]:
    out = subprocess.run([KEELWAY, *args, "--json"], env=env, capture_output=True, text=True,
                         timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"keelway {' '.join(args)}: {out.stdout}{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def health_ok(port: int) -> bool:
    with contextlib.closing(http.client.HTTPConnection("127.0.0.1", port, timeout=1)) as conn:
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status == 200
        except OSError:
            return False


def boot_to_ready(app: Path, tmp: Path, n: int = 5) -> float:
    """Median time from spawning `python3 web.py` to a 200 on /health: the app's own cost,
    the same command keelway runs from the Procfile."""
    times = []
    for i in range(n):
        port = free_port()
        env = {**os.environ, "PORT": str(port), "KEELWAY_INSTANCE": "boot.test",
               "KEELWAY_DB": str(tmp / f"boot{i}.sqlite3")}
        start = time.monotonic()
        proc = subprocess.Popen(["python3", "web.py"], cwd=app, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while not health_ok(port):
                if time.monotonic() - start > 10 or proc.poll() is not None:
                    raise RuntimeError("web.py did not become ready in 10 s")
                time.sleep(0.002)
            times.append(time.monotonic() - start)
        finally:
            stop(proc, signal.SIGTERM)
    return statistics.median(times)


def stop(proc: subprocess.Popen[bytes], sig: int) -> None:
    """Signal `proc` (SIGINT makes wrk print its summary), wait 15 s at most, then SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def listen_overflows() -> int:
    """Box-wide count of connections dropped because an accept queue was full: the client
    resends its SYN after 1 s, so each one shows up as a ~1 s request, not as an error."""
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            return int(dict(zip(names.split(), values.split(), strict=True))["ListenOverflows"])
    return 0


def parse_wrk(text: str) -> dict[str, Any]:
    units = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4}
    socket_errors = dict.fromkeys(("connect", "read", "write", "timeout"), 0)
    pattern = r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)"
    if m := re.search(pattern, text):
        socket_errors = dict(zip(socket_errors, map(int, m.groups()), strict=True))
    requests = re.search(r"(\d+) requests in", text)
    rps = re.search(r"Requests/sec:\s*([\d.]+)", text)
    non2xx3xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    latency = {p: float(v) * units[u] for p, v, u in
               re.findall(r"^\s+(\d+)%\s+([\d.]+)(us|ms|s|m)\s*$", text, re.M)}
    if m := re.search(r"Latency\s+\S+\s+\S+\s+([\d.]+)(us|ms|s|m)", text):
        latency["max"] = float(m.group(1)) * units[m.group(2)]
    statuses: dict[int, int] = {}
    for status, n in re.findall(r"^KW status (\d+) (\d+)$", text, re.M):  # one line per thread
        statuses[int(status)] = statuses.get(int(status), 0) + int(n)
    fails = [(float(t), int(s)) for t, s in re.findall(r"^KW fail ([\d.]+) (\d+)$", text, re.M)]
    return {"requests": int(requests.group(1)) if requests else 0,
            "requests_per_s": float(rps.group(1)) if rps else 0.0,
            "wrk_non_2xx_or_3xx": int(non2xx3xx.group(1)) if non2xx3xx else 0,
            "non_2xx_by_status": statuses, "socket_errors": socket_errors,
            "latency_ms": latency, "failure_times": sorted(fails)}


def journal(home: Path) -> tuple[list[dict[str, Any]], list[float]]:
    """Deploy operations with their step timings, and the exit times of web generations,
    read-only from keelway.db (the JSON API's `ops` has no step timestamps)."""
    with contextlib.closing(sqlite3.connect(f"file:{home / 'keelway.db'}?mode=ro", uri=True,
                                            timeout=10)) as db:
        ops = db.execute("SELECT id, created_at, finished_at FROM operations "
                         "WHERE kind = 'deploy' ORDER BY id").fetchall()
        exits = db.execute("SELECT exited_at FROM generations WHERE service = 'web' "
                           "AND exited_at IS NOT NULL ORDER BY exited_at").fetchall()
        return [{"id": i, "start": c, "end": f or c,
                 "steps": db.execute("SELECT kind || COALESCE(' ' || service, ''), started_at,"
                                     " COALESCE(finished_at, started_at) FROM steps"
                                     " WHERE op_id = ? ORDER BY seq", (i,)).fetchall()}
                for i, c, f in ops], [e for (e,) in exits]


def place(t: float, ops: list[dict[str, Any]], exits: list[float]) -> str:
    """The deploy step under way when a failed response arrived at `t`, and how long after
    the last old web generation exited: a request still in that generation's hands (or
    its accept queue) fails when it exits, or at the router's next TCP retransmit."""
    step = "between deploys"
    for op in ops:
        if op["start"] <= t <= op["end"] + 0.05:
            current = [s for s in op["steps"] if s[1] <= t] or [("start", t, t)]
            name, _, end = current[-1]
            step = name if t <= end else f"after {name}"
    before = [e for e in exits if e <= t + 0.05]
    since = f"{t - before[-1]:.1f} s after" if before else "before"
    return f"during '{step}', {since} an old web generation exited"


def step_medians(ops: list[dict[str, Any]]) -> dict[str, float]:
    durations: dict[str, list[float]] = {}
    for op in ops:
        for name, start, end in op["steps"]:
            durations.setdefault(name, []).append(end - start)
        durations.setdefault("(operation total)", []).append(op["end"] - op["start"])
    return {k: round(statistics.median(v), 3) for k, v in durations.items()}


def summarize(times: list[float]) -> dict[str, float]:
    p90 = statistics.quantiles(times, n=10, method="inclusive")[8] if len(times) > 1 else times[0]
    return {"median_s": round(statistics.median(times), 3), "p90_s": round(p90, 3),
            "max_s": round(max(times), 3)}


def kill_ours(pid: int, marker: str) -> None:
    """SIGKILL `pid` only if its environment names our own temp KEELWAY_HOME."""
    with contextlib.suppress(OSError):
        if marker.encode() in Path(f"/proc/{pid}/environ").read_bytes():
            os.kill(pid, signal.SIGKILL)


def run(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    home, app, port = tmp / "home", tmp / "app", free_port()
    home.mkdir()
    shutil.copytree(ROOT / "examples" / "hello", app)
    settles = {n: s.settle_s for n, s in load_manifest(app).services.items()}
    settle = max(settles.values())  # the deployer settles all candidates at once
    env = {**os.environ, "KEELWAY_HOME": str(home)}
    up = keelway(env, "up", "-d", "--http", f"127.0.0.1:{port}")
    wrk: subprocess.Popen[bytes] | None = None
    try:
        keelway(env, "deploy", "hello", str(app), "--host", HOST)
        boot_idle = boot_to_ready(app, tmp)
        (tmp / "count.lua").write_text(LUA)
        wrk_out, overflows = tmp / "wrk.out", listen_overflows()
        # Bounded: long enough for the run (deploys take ~3 s), stopped early by SIGINT.
        duration = 120 + 8 * (args.deploys + args.staged)
        with wrk_out.open("wb") as out:
            wrk = subprocess.Popen(
                ["wrk", "-t", str(args.threads), "-c", str(args.connections), "-d",
                 f"{duration}s", "--latency", "-s", str(tmp / "count.lua"), "-H",
                 f"Host: {HOST}", f"http://127.0.0.1:{port}/health"], stdout=out, stderr=out)
        time.sleep(1)  # let wrk's connections open before the first deploy
        new: list[float] = []
        staged: list[float] = []
        digests: list[str] = []
        for i in range(args.deploys + args.staged):
            if i < args.deploys:  # a new build each time: the digest changes
                with (app / "web.py").open("a") as f:
                    f.write(f"# bench deploy {i}\n")
            start = time.monotonic()
            result = keelway(env, "deploy", "hello", str(app))  # raises if it fails
            (new if i < args.deploys else staged).append(time.monotonic() - start)
            digests.append(result["build"])
        reused = sum(a == b for a, b in zip(digests[args.deploys - 1:], digests[args.deploys:],
                                            strict=False))
        overflows = listen_overflows() - overflows  # before boot_to_ready's own connections
        boot_load = boot_to_ready(app, tmp)
        wrk_ended_early = wrk.poll() is not None
        stop(wrk, signal.SIGINT)
        load = parse_wrk(wrk_out.read_text(errors="replace"))
        ops, exits = journal(home)
        ops = ops[1:]  # the first one is the initial deploy, before load
    finally:
        if wrk is not None:
            stop(wrk, signal.SIGINT)
        with contextlib.suppress(Exception):
            keelway(env, "down", timeout=60)
        # Last resort, by pid: the daemon, its router, and any app process it recorded.
        pids = [int(up["pid"])]
        with contextlib.suppress(OSError):
            log = (home / "logs" / "keelway.log").read_text()
            pids += [int(p) for p in re.findall(r"router .*\(pid (\d+)\)", log)]
        with contextlib.suppress(sqlite3.Error), contextlib.closing(
                sqlite3.connect(f"file:{home / 'keelway.db'}?mode=ro", uri=True)) as db:
            pids += [p for (p,) in db.execute("SELECT pid FROM presences WHERE pid IS NOT NULL")]
        for pid in pids:
            kill_ours(pid, str(home))
    # An upper bound: wrk counts a "timeout" per stuck connection on each 2 s sweep, and a
    # request it counted so may still end as a non-2xx later.
    failed = sum(load["non_2xx_by_status"].values()) + sum(load["socket_errors"].values())
    staged_s = statistics.median(staged)
    staged_op_s = statistics.median(op["end"] - op["start"] for op in ops[args.deploys:])
    by_window: dict[str, int] = {}
    for t, status in load.pop("failure_times"):
        key = f"{status} {place(t, ops, exits)}"
        by_window[key] = by_window.get(key, 0) + 1
    return {
        "deploys": args.deploys, "connections": args.connections, "threads": args.threads,
        "total_requests": load["requests"], "failed_requests": failed,
        "failures_by_window": by_window, "listen_overflows_box_wide": overflows, "wrk": load,
        "wrk_ended_early": wrk_ended_early,
        "new_build_deploy": summarize(new),
        "staged_deploy": {**summarize(staged), "n": len(staged), "builds_reused": reused},
        "settle_s": settle, "settle_by_service": settles,
        "staged_minus_settle_s": round(staged_s - settle, 3),
        "staged_op_median_s": round(staged_op_s, 3),
        "boot_to_ready_s": {"idle": round(boot_idle, 4), "under_load": round(boot_load, 4)},
        "ratio": round((staged_s - settle) / (1 + boot_load), 3),
        "staged_step_medians_s": step_medians(ops[args.deploys:]),
    }


def report(r: dict[str, Any]) -> None:
    w, nb, st = r["wrk"], r["new_build_deploy"], r["staged_deploy"]
    print(f"load: wrk -t{r['threads']} -c{r['connections']} /health, "
          f"{w['requests_per_s']:.0f} req/s; {r['deploys']} new-build + {st['n']} staged deploys")
    print(f"total requests        {r['total_requests']}")
    print(f"failed requests       {r['failed_requests']}  (target 0; non-2xx by status "
          f"{w['non_2xx_by_status']}, socket errors {w['socket_errors']})")
    for window, n in sorted(r["failures_by_window"].items(), key=lambda kv: -kv[1]):
        print(f"  {n:6d} x {window}")
    print(f"deploy, new build     median {nb['median_s']} s, p90 {nb['p90_s']} s, "
          f"max {nb['max_s']} s  (CLI wall clock)")
    print(f"deploy, staged build  median {st['median_s']} s (wall), {r['staged_op_median_s']} s "
          f"(operation in the journal); build reused {st['builds_reused']}/{st['n']}")
    print(f"  minus settle {r['settle_s']:g} s    {r['staged_minus_settle_s']} s")
    b = r["boot_to_ready_s"]
    print(f"app boot-to-ready     median {b['under_load']} s under load, {b['idle']} s idle")
    print(f"ratio (deploy - settle) / (1 s + boot)  {r['ratio']}  (target <= 1.0; the "
          "bounded drain of the old web is inside 'retire web' below)")
    print("staged deploy, median per journaled step (s): " + ", ".join(
        f"{k} {v}" for k, v in r["staged_step_medians_s"].items()))
    print("wrk latency  " + ", ".join(f"{'' if p == 'max' else 'p'}{p} {v:.2f} ms"
                                      for p, v in w["latency_ms"].items()))
    print(f"accept-queue overflows during the deploys (box-wide, each a ~1 s SYN retry): "
          f"{r['listen_overflows_box_wide']}")
    if r["wrk_ended_early"]:
        print("WARNING: wrk's -d ran out before the deploys finished")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deploys", type=int, default=50, help="new-build deploys under load")
    # 10: a staged deploy's time varies with the phase of the apps' stop loops (0-1 s).
    parser.add_argument("--staged", type=int, default=10, help="deploys of the unchanged build")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, db)")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("wrk not found: apt-get install -y wrk")
    # Short path under /tmp: the API's unix socket path must stay under ~100 chars.
    tmp = Path(tempfile.mkdtemp(prefix="kwdul.", dir="/tmp"))
    try:
        result = run(args, tmp)
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        report(result)


if __name__ == "__main__":
    main()
