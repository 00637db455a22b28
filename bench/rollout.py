"""Benchmark: a release's rollout across many instances (issue #19).

    .venv/bin/python bench/rollout.py [--instances 1000] [--parallel 100] [--settle 2s]

Figures, each beside its target (issue #19, for 1,000 instances):
- a config change across every instance, all awake, each with a `--settle` window and
  `--parallel` of them at once (≤ 60 s);
- the same change once 90% of them are parked (they take it at their next wake; ≤ 15 s);
- how long `status` took to answer while the first rollout ran (≤ 1 s, the worst seen).

The reference, measured in the same run: one instance's own restart (`keelway restart
APP --instance H`: its boot, readiness and settle), so `one at a time` is the time a
rollout of the same instances one by one would take, and `speedup` what the cohorts
bought; and `status` on the quiet control plane before the rollout, so
`status_worst_vs_quiet` is what the rollout's load adds to it. The app is a few lines
over a raw socket, so the box holds 1,000 of them.

A fresh KEELWAY_HOME and router port per run; requests go only to 127.0.0.1;
everything started here is stopped here (`keelway down`, then by pid).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scale import cli  # noqa: E402

from keelway.cli.client import Client  # noqa: E402
from keelway.home import Home  # noqa: E402
from tests.e2e.harness import free_port, kill_home_processes  # noqa: E402

APP = "fleet"
AWAKE_TARGET_S = 60.0
PARKED_TARGET_S = 15.0
STATUS_TARGET_S = 1.0

# A web of a few lines over a raw socket: ready when it answers, ~8 MB each.
TINY = '''\
import os, socket, signal, sys
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(os.environ["PORT"])))
s.listen(64)
body = ("ok " + os.environ.get("KEELWAY_RELEASE", "?") + "\\n").encode()
reply = b"HTTP/1.1 200 OK\\r\\nContent-Length: %d\\r\\nConnection: close\\r\\n\\r\\n" % len(body)
while True:
    conn, _ = s.accept()
    try:
        conn.recv(4096)
        conn.sendall(reply + body)
    finally:
        conn.close()
'''


def app_dir(root: Path, settle: str, parallel: int) -> Path:
    app = root / APP
    app.mkdir()
    (app / "web.py").write_text(TINY)
    (app / "Procfile").write_text("web: python3 -S web.py\n")
    (app / "keelway.toml").write_text(
        f'[services.web]\nhealth = "/health"\nsettle = "{settle}"\nstop_grace = "2s"\n'
        f"[rollout]\nparallel = {parallel}\n")
    return app


def timed_rollout(env: dict[str, str], api: Client,
                  value: str) -> tuple[float, dict[str, float]]:
    """A config change across the app, timed; the worst latency meanwhile of `status`
    and of `/v1/ping` (which reads nothing: how long any request waits for the control
    plane's event loop, so the rest of `status`'s figure is its own work)."""
    worst = {"/v1/status": 0.0, "/v1/ping": 0.0}
    done = threading.Event()

    def poll(path: str) -> None:
        while not done.is_set():
            began = time.perf_counter()
            api.request("GET", path)
            worst[path] = max(worst[path], time.perf_counter() - began)
            done.wait(0.5)

    pollers = [threading.Thread(target=poll, args=(path,)) for path in worst]
    for poller in pollers:
        poller.start()
    began = time.perf_counter()
    try:
        cli(env, "config", APP, "set", f"WAVE={value}", timeout_s=900)
    finally:
        took = time.perf_counter() - began
        done.set()
        for poller in pollers:
            poller.join()
    return took, worst


def run(instances: int, parallel: int, settle: str) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="kw-rollout-"))
    home = tmp / "home"
    port = free_port()
    env = {**os.environ, "KEELWAY_HOME": str(home), "KEELWAY_REPLICATE": "0"}
    hosts = [f"i{n:04}.fleet.test" for n in range(instances)]
    result: dict[str, Any] = {"instances": instances, "parallel": parallel, "settle": settle,
                              "load_before": os.getloadavg()[0]}
    try:
        cli(env, "up", "-d", "--http", f"127.0.0.1:{port}")
        api = Client(Home(home).api_socket, 60)
        app = app_dir(tmp, settle, parallel)
        began = time.perf_counter()
        cli(env, "deploy", APP, str(app), *(a for h in hosts for a in ("--host", h)),
            timeout_s=900)
        result["first_deploy_s"] = round(time.perf_counter() - began, 2)
        began = time.perf_counter()
        cli(env, "restart", APP, "--instance", hosts[0])
        one = time.perf_counter() - began
        result["one_instance_restart_s"] = round(one, 2)
        # The reference for `status` during the rollout: the same read on a quiet
        # control plane (the best of three).
        quiet = []
        for _ in range(3):
            began = time.perf_counter()
            api.request("GET", "/v1/status")
            quiet.append(time.perf_counter() - began)
        result["status_quiet_s"] = round(min(quiet), 3)
        took, worst = timed_rollout(env, api, "1")
        result["awake_rollout_s"] = round(took, 2)
        result["awake_one_at_a_time_s"] = round(one * instances, 1)
        result["awake_speedup"] = round(one * instances / took, 1)
        result["status_worst_s"] = round(worst["/v1/status"], 3)
        result["ping_worst_s"] = round(worst["/v1/ping"], 3)
        result["status_worst_vs_quiet"] = round(worst["/v1/status"] / min(quiet), 1)
        parked = hosts[: instances * 9 // 10]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda h: api.request("POST", f"/v1/instances/{h}/park", {}),
                          parked))
        took, worst = timed_rollout(env, api, "2")
        result["mostly_parked_rollout_s"] = round(took, 2)
        result["parked_status_worst_s"] = round(worst["/v1/status"], 3)
        rollout = api.request("GET", f"/v1/apps/{APP}/rollout")["rollout"]
        result["last_rollout_state"] = rollout["state"]
        result["load_after"] = os.getloadavg()[0]
        if instances >= 1000:
            result["ok"] = bool(result["awake_rollout_s"] <= AWAKE_TARGET_S
                                and result["mostly_parked_rollout_s"] <= PARKED_TARGET_S
                                and result["status_worst_s"] <= STATUS_TARGET_S)
        return result
    finally:
        subprocess.run([sys.executable, "-m", "keelway.cli.main", "down"], env=env,
                       capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
        kill_home_processes(home)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=1000)
    parser.add_argument("--parallel", type=int, default=100)
    parser.add_argument("--settle", default="2s")
    args = parser.parse_args()
    result = run(args.instances, args.parallel, args.settle)
    print(json.dumps({**result, "targets (1,000 instances)": {
        "awake_rollout_s": AWAKE_TARGET_S, "mostly_parked_rollout_s": PARKED_TARGET_S,
        "status_worst_s": STATUS_TARGET_S}}, indent=2))
    return 0 if result.get("ok", True) else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
