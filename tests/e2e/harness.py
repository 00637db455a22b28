"""Drive the real `keelway` CLI against a real daemon in a temp KEELWAY_HOME."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keelway.cli.client import ApiLost, ApiUnavailable, Client
from keelway.home import Home
from keelway.runtime import process
from keelway.runtime.tree import ProcessTrees
from keelway.store import SqliteStore
from keelway.testing.dump import dump
from tests.invariants import router_processes

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "hello"


# Ports handed out by `free_port`, box-wide: one empty file per port, for as long as a
# test may take to bind what it chose. Every pytest process on the box (CI runs three at
# once: two workers and the crash matrix, four homes at a time) picks from one range, and
# between a pick and its router's bind (a daemon boot, a second or two under load) the
# bind check below cannot see another pick of the same port: at a few thousand picks per
# run that met about once in three CI runs (`up` finding its port already in use).
_RESERVED = Path("/tmp/keelway-test-ports")
_RESERVE_S = 120.0


def free_port() -> int:
    """A loopback port for a router or daemon a test starts later.

    Chosen below the kernel's ephemeral range: a port from bind(0) is free only until
    its socket closes, and until the test's router binds it, any other process asking
    the kernel for a port (an app's generation, a parallel crash point's daemon) can be
    given the same one. Nothing is handed ports from below that range unasked; another
    test's pick is kept off it (`reserve_port`), and the bind here checks
    that nothing listens there now."""
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(10000, low)
        if not reserve_port(port):
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free loopback port below the ephemeral range")


def reserve_port(port: int) -> bool:
    """Whether `port` is this caller's now: no other pick of it in the last _RESERVE_S.
    A stale reservation is taken over by renaming it away first, so two callers that
    both find it stale cannot both have it (one rename wins)."""
    _RESERVED.mkdir(mode=0o777, exist_ok=True)
    path = _RESERVED / str(port)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        return True
    except FileExistsError:
        pass
    try:
        if time.time() - path.stat().st_mtime < _RESERVE_S:
            return False
        stale = _RESERVED / f"{port}.stale.{os.getpid()}.{random.getrandbits(32)}"
        os.rename(path, stale)
    except FileNotFoundError:
        return False  # another caller took it over meanwhile
    stale.unlink()
    return reserve_port(port)


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@dataclass
class Keelway:
    home: Path
    http_port: int
    daemon_pid: int | None = None
    started_pids: list[tuple[int, int]] = field(default_factory=list)
    # Database replication (keelway/data/replicas.py) is on, as in the product, unless a
    # test turns it off (or KEELWAY_TEST_REPLICATE=0 turns it off in every test).
    replicate: bool = field(
        default_factory=lambda: os.environ.get("KEELWAY_TEST_REPLICATE") != "0")
    # Generations the next `up` starts a daemon whose supervisor cannot remove while
    # they live (keelway/testing/danger.py): the fail-closed tests' fake of danger.
    unkillable: frozenset[int] = frozenset()
    # Daemons started here rather than by the CLI: reaped at teardown.
    daemons: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        return {**os.environ, "KEELWAY_HOME": str(self.home),
                "KEELWAY_REPLICATE": "1" if self.replicate else "0"}

    def run(self, *args: str, timeout_s: float = 120) -> Result:
        proc = subprocess.run(
            [sys.executable, "-m", "keelway.cli.main", *args], env=self.env(),
            capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def ok(self, *args: str, timeout_s: float = 120) -> Result:
        result = self.run(*args, timeout_s=timeout_s)
        assert result.code == 0, f"keelway {' '.join(args)} failed:\n{result.out}\n{result.err}"
        return result

    def up(self, *extra: str) -> None:
        if self.unkillable:
            self._up_with_danger(*extra)
            return
        info = self.ok("up", "-d", "--http", f"127.0.0.1:{self.http_port}", "--json",
                       *extra).json()
        self.daemon_pid = info["pid"]

    def _up_with_danger(self, *extra: str) -> None:
        """`up -d`, with the daemon keelway/testing/daemon.py runs (the same daemon, its
        supervisor given `unkillable`) started here, as the CLI would start the real one:
        detached, its output to the daemon log, ready once the API answers."""
        home = Home(self.home)
        home.ensure()
        argv = [sys.executable, "-m", "keelway.testing.daemon",
                "--unkillable", ",".join(map(str, sorted(self.unkillable))),
                "--http", f"127.0.0.1:{self.http_port}", *extra]
        with open(home.daemon_log, "ab") as log:
            proc = subprocess.Popen(argv, env=self.env(), stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=log, start_new_session=True)
        self.daemons.append(proc)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, f"the daemon exited ({proc.returncode})"
            try:
                info = Client(home.api_socket, 2.0).request("GET", "/v1/ping")
            except (ApiUnavailable, ApiLost, OSError):  # not listening yet
                time.sleep(0.1)
                continue
            self.daemon_pid = info["pid"]
            return
        raise AssertionError("the daemon did not come up in 120s")

    def get(
        self, host: str, path: str = "/", timeout_s: float = 10
    ) -> tuple[int, bytes, dict[str, str]]:
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=timeout_s)
        try:
            conn.request("GET", path, headers={"Host": host})
            response = conn.getresponse()
            return response.status, response.read(), dict(response.getheaders())
        finally:
            conn.close()

    def store_dump(self) -> dict[str, Any]:
        store = SqliteStore(self.home / "keelway.db")
        try:
            return dump(store)
        finally:
            store.close()

    def app_pids(self) -> list[tuple[int, int]]:
        status = self.ok("status", "--json").json()
        pids = []
        for app in status["apps"]:
            for inst in app["instances"]:
                for proc in inst["processes"]:
                    if proc["service"] == "replica":
                        continue  # keelway's replicator, not an app process
                    if proc["pid"] and proc["state"] != "gone":
                        stat = process.read_stat(proc["pid"])
                        if stat is not None:
                            pids.append((proc["pid"], stat.start_ticks))
        return pids

    def kill_daemon(self) -> None:
        """SIGKILL the control plane and wait until it is gone; the router serves on."""
        assert self.daemon_pid is not None
        os.kill(self.daemon_pid, signal.SIGKILL)
        assert gone(self.daemon_pid)

    def teardown(self) -> None:
        """Stop everything this test started: by `down`, then by pid if anything is left."""
        if self.daemon_pid is not None and _alive(self.daemon_pid):
            self.run("down", timeout_s=60)
        for pid, ticks in self.started_pids:
            if process.is_alive(pid, ticks):
                process.signal_session(pid, ticks, signal.SIGKILL)
        kill_home_processes(self.home)
        for daemon in self.daemons:
            daemon.wait(timeout=10)


def kill_home_processes(home: Path) -> None:
    """SIGKILL whatever a control plane with this home started, proven ours each time:
    the daemon (the lock file's pid, whose environment names this home), the router
    session (pidfile pid + start time) and every app process tree (its cgroup, or the
    marker in its environment), whose cgroups go too. A test that failed midway leaks
    nothing; nothing else is touched."""
    lock = home / "keelway.lock"
    try:
        daemon = int(lock.read_text().strip())
        ours = f"KEELWAY_HOME={home}".encode() in Path(
            f"/proc/{daemon}/environ").read_bytes().split(b"\0")
    except (OSError, ValueError):
        ours = False  # no daemon, or a recycled pid that is not ours to touch
    if ours and _alive(daemon):
        os.kill(daemon, signal.SIGKILL)
    try:
        pid, ticks = (int(x) for x in (home / "router" / "router.pid").read_text().split())
    except (OSError, ValueError):
        pass
    else:
        if process.is_alive(pid, ticks):
            process.signal_session(pid, ticks, signal.SIGKILL)
    # A router whose record a crash test destroyed: its command line names this home's
    # control socket and its environment this home.
    for pid in router_processes(home):
        try:
            ours = f"KEELWAY_HOME={home}".encode() in Path(
                f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        stat = process.read_stat(pid)
        if ours and stat is not None:
            process.signal_session(pid, stat.start_ticks, signal.SIGKILL)
    trees = ProcessTrees.found(home)
    for gen_id, members in trees.scan().items():
        for member in members:  # found in the home's cgroup or by its marker: ours
            with contextlib.suppress(ProcessLookupError):
                os.kill(member.pid, signal.SIGKILL)
        wait_until(lambda gen_id=gen_id: not trees.members(gen_id, None), 5)
        trees.remove(gen_id)
    trees.forget_home()


def gone(pid: int, timeout_s: float = 10) -> bool:
    """Whether `pid` exits (or is left a zombie) within `timeout_s`."""
    def dead() -> bool:
        stat = process.read_stat(pid)
        return stat is None or stat.state == "Z"

    return wait_until(dead, timeout_s)


def _alive(pid: int) -> bool:
    stat = process.read_stat(pid)
    return stat is not None and stat.state != "Z"


def wait_until(predicate: Any, timeout_s: float = 10, interval_s: float = 0.05) -> bool:
    """Whether `predicate` holds within `timeout_s`, checked every `interval_s` or, for a
    check that costs more (one that runs the CLI: a process and ~0.1 s of CPU each time),
    after a pause as long as the check took, up to half a second: a wait spends at most
    half its time checking, not three quarters and more of a core on a loaded box. The
    last check is at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        began = time.monotonic()
        if predicate():
            return True
        now = time.monotonic()
        if now >= deadline:
            return False
        time.sleep(min(max(interval_s, min(now - began, 0.5)), deadline - now))
