"""The crash matrix: SIGKILL the control plane at every failpoint of every operation.

Each scenario runs once with a trace to learn every failpoint hit its operation passes
(`name@N`: the N-th hit of `name` once the scenario's setup is done). Then, for each
of those points: a fresh home, the setup, the daemon armed to die there
(KEELWAY_FAILPOINTS_ARM, written once the setup is done: a periodic pass during the setup
that hits more or fewer failpoints than it did in the trace cannot move the point), the
operation until it dies,
a clean restart (boot reconciliation), and SPEC §5 checked; a second reconcile must
then find nothing to do. Recovery itself is crashed too: the boot after a crash is
killed at each failpoint it passes, and the boot after that must converge.

A point is crashed once per code path (`_points`): a loop's second pass over the same
step, or a step an earlier scenario set up and checked the same way passed on the same
stack (a hold-mode deploy's spawn is a deploy's), shares its crash window and is not run
again. Every distinct path is still crashed; each scenario prints what it skipped.

Every web here daemonizes a grandchild (fork, setsid, fork), so invariant 5's scan of
the home's cgroups and of /proc for its marker has a detached descendant to find at
every point: a tree half-stopped by the crash must be whole-gone after recovery.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from keelway import home as homes
from keelway.builds.manifest import Mode, load_manifest
from keelway.cli.client import ApiError, ApiUnavailable, Client
from keelway.data.replicas import verify
from keelway.deploy.rollouts import on_release
from keelway.journal import OpKind
from keelway.runtime.environment import INSTANCE_KEY, read_env_file
from keelway.store import SqliteStore
from keelway.store.lifecycle import RolloutState
from tests.deploy.apps import DAEMONIZE_PY
from tests.e2e.harness import EXAMPLE, free_port, gone, kill_home_processes, wait_until
from tests.invariants import violations

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# Each point mostly waits on processes starting and stopping (a daemon, the CLI, the
# apps), about half a core each: four at once keep two cores busy.
PARALLEL = 4


@dataclass
class Home:
    root: Path
    port: int
    app_a: Path
    app_b: Path
    # Database replication runs only in the scenarios that are about it (REPLICATED).
    replicate: bool = False
    # One router process (it serves itself, no workers) but in the scenarios about the
    # router (ROUTER_SCENARIOS), which run the product's default: what the rest checks is
    # the control plane's, and the same for any count of workers (the publish, the pid
    # file, one router per home), and two workers are two more processes to start and
    # kill at each point. Every `up` of a home passes the same count: a different one
    # would have the next boot restart the router (keelway/runtime/router_supervisor.py).
    router_workers: int | None = 1
    # More flags for every `up` of the home (a scenario's HTTPS and CA), and what to
    # stop with it (its CA).
    up_extra: list[str] = field(default_factory=list)
    stops: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "KEELWAY_HOME": str(self.root),
                "KEELWAY_REPLICATE": "1" if self.replicate else "0", **extra}

    def cli(self, *args: str, env: dict[str, str] | None = None,
            timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "keelway.cli.main", *args],
                              env=env or self.env(), capture_output=True, text=True,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)

    def up_args(self) -> list[str]:
        workers = [] if self.router_workers is None else [
            "--router-workers", str(self.router_workers)]
        return ["up", "-d", "--http", f"127.0.0.1:{self.port}", "--json", *workers,
                *self.up_extra]

    def up(self, **extra: str) -> int:
        done = self.cli(*self.up_args(), env=self.env(**extra))
        assert done.returncode == 0, f"{done.stdout}{done.stderr}\n{self.logs()}"
        return int(json.loads(done.stdout)["pid"])

    def logs(self) -> str:
        """The ends of the daemon's and the router's logs, for a failure message."""
        tails = []
        for name in ("keelway.log", "router.log"):
            with contextlib.suppress(OSError):
                text = (self.root / "logs" / name).read_text(errors="replace")
                tails.append(f"--- {name}\n" + "\n".join(text.splitlines()[-30:]))
        return "\n".join(tails)

    def ok(self, *args: str) -> None:
        done = self.cli(*args)
        assert done.returncode == 0, f"{args}: {done.stderr}"

    def api(self, method: str, path: str, body: dict[str, object] | None = None,
            timeout_s: float = 30) -> Any:
        """The control plane's API in this process (ApiUnavailable when it is gone).

        The checks read state this way; the operations under test always go through the
        real CLI. A CLI start per check was most of a point's cost after the daemon's
        own boots (the crash-restart scenario polls status every 0.1 s)."""
        return Client(homes.Home(self.root).api_socket, timeout_s).request(method, path, body)


def _app(root: Path, name: str, greeting: str) -> Path:
    app = root / name
    shutil.copytree(EXAMPLE, app, ignore=shutil.ignore_patterns("__pycache__"))
    (app / "keelway.toml").write_text(
        '[services.web]\nhealth = "/health"\nsettle = "0.2s"\nstop_grace = "2s"\n'
        '[services.worker]\nsettle = "0.2s"\nstop_grace = "2s"\n')
    web = app / "web.py"
    web.write_text(web.read_text().replace("hello from", greeting))
    (app / "daemonize.py").write_text(DAEMONIZE_PY)
    (app / "Procfile").write_text("web: python3 daemonize.py web.py\nworker: python3 worker.py\n")
    return app


def _fresh() -> Home:
    root = Path(tempfile.mkdtemp(prefix="kwm-", dir="/tmp"))
    # Reachable by other uids, so that where the matrix runs as root each instance runs
    # as a uid of its own (keelway/identity.py), as on a real box.
    root.chmod(0o711)
    apps = root / "apps"
    apps.mkdir()
    return Home(root / "h", free_port(), _app(apps, "a", "hello from"),
                _app(apps, "b", "howdy from"))


Step = Callable[[Home], None]


def _web(h: Home) -> dict[str, object] | None:
    """The ACTIVE web process as status shows it, or None when the daemon is gone."""
    try:
        status = h.api("GET", "/v1/status", timeout_s=10)
    except (ApiUnavailable, ApiError, OSError):
        return None
    inst = status["apps"][0]["instances"][0]
    return next(p for p in inst["processes"] if p["service"] == "web" and p["active"])


def _crash_the_web(h: Home) -> None:
    """The app crashes: SIGKILL the web's leader (its daemonized child lives on), then
    wait for the supervisor to remove the tree, back off and restart it (or to die)."""
    web = _web(h)
    assert web is not None
    os.kill(int(web["pid"]), signal.SIGKILL)  # type: ignore[call-overload]

    def settled() -> bool:
        now = _web(h)
        return now is None or (now["id"] != web["id"] and now["state"] in ("running", "ready"))

    assert wait_until(settled, 30, 0.1)


def _seed_file(h: Home) -> Path:
    path = h.root.parent / "seed.sqlite3"
    if not path.exists():
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE visits (n INTEGER NOT NULL)")
        conn.executemany("INSERT INTO visits VALUES (1)", [()] * 100)
        conn.commit()
        conn.close()
    return path


def _files(root: Path) -> dict[str, str]:
    """Every file under `root`, by path, with its checksum."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _content(db: Path) -> str:
    """A digest of what `db` holds (its visits, in order), once it checks whole."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        rows = conn.execute("SELECT * FROM visits ORDER BY rowid").fetchall()
    finally:
        conn.close()
    return hashlib.sha256(repr(rows).encode()).hexdigest()


def _replica_of(h: Home, host: str) -> str | None:
    """What `host`'s own replica (keelway/data/replicas.py replica_key; its imports'
    replicas lie beside it) restores to, as `_content`; None if it restores nothing.

    Compared by what it restores to, not file by file: litestream compacts and retires
    its own files as it runs, so a replica nobody else touched still changes files."""
    out = h.root.parent / f"replica-{host}-{os.urandom(3).hex()}.db"
    url = (h.root / "objects" / "replicas" / host).resolve().as_uri()
    try:
        done = subprocess.run([str(Path(sys.executable).parent / "litestream"), "restore",
                               "-o", str(out), url], capture_output=True, timeout=30)
        if done.returncode != 0 or not out.exists():
            return None
        return _content(out)
    finally:
        for side in ("", "-wal", "-shm"):
            Path(f"{out}{side}").unlink(missing_ok=True)


def _replica_is(h: Home, host: str, want: str, timeout_s: float = 10) -> bool:
    """Whether `host`'s replica restores to `want`, within `timeout_s` (a replicator
    restarted by recovery ships its first pass a moment later)."""
    return wait_until(lambda: _replica_of(h, host) == want, timeout_s, 0.2)


def _snapshots_of(h: Home, host: str) -> dict[str, str]:
    return _files(h.root / "objects" / "instances" / host)


def _remember_own_replica(h: Home) -> None:
    """one.test's own replica once the import stopped and synced it: from then on
    nothing may write it until the rollback has put its own database back."""
    before = json.loads((h.root.parent / "before.json").read_text())
    before["own_replica"] = _content(h.root / "data" / "one.test" / "db.sqlite3")
    assert _replica_is(h, "one.test", before["own_replica"])
    (h.root.parent / "before.json").write_text(json.dumps(before))


def _remember_before(h: Home) -> None:
    """What a seed scenario must find again: one.test's key and rows, and two.test's
    database, env file, route, replica and snapshots as they were before the
    operation (and one.test's own replica)."""
    for host in ("one.test", "two.test"):
        assert _get(h.port, host, "/") == 200  # a visit: a row of the host's own
    h.ok("db", "snapshot", "two.test")
    replicas = {host: _content(h.root / "data" / host / "db.sqlite3")
                for host in ("one.test", "two.test")}
    if h.replicate:  # a replica to compare: each has shipped what its database holds
        assert all(_replica_is(h, host, want, 15) for host, want in replicas.items())
    store = SqliteStore(h.root / "keelway.db")
    try:
        route = store.routes.get_route("two.test")
    finally:
        store.close()
    before = {
        "key": read_env_file(h.root / "env" / "one.test.env")[INSTANCE_KEY],
        "visits": _rows_of(h.root / "data" / "one.test" / "db.sqlite3"),
        "other_env": (h.root / "env" / "two.test.env").read_text(),
        "other_db": _rows_of(h.root / "data" / "two.test" / "db.sqlite3"),
        "other_route": route.state.value if route else None,
        "other_replica": replicas["two.test"],
        "other_snapshots": _snapshots_of(h, "two.test"),
        "own_replica": replicas["one.test"],
    }
    assert before["other_snapshots"]
    (h.root.parent / "before.json").write_text(json.dumps(before))


def _rows_of(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return int(conn.execute("SELECT COUNT(*) FROM visits").fetchone()[0])
    finally:
        conn.close()


def _seed_settled(h: Home) -> list[str]:
    """The import whole (journal swapped: its database, marker and key in place, no
    fence held) or rolled back whole (no journal: the instance's own key and rows, no
    import data, no stored copy); two.test as it was."""
    before = json.loads((h.root.parent / "before.json").read_text())
    status = h.api("GET", "/v1/instances/one.test/seed")
    env = read_env_file(h.root / "env" / "one.test.env")
    nested = h.root / "data" / "one.test" / "seed" / "db.sqlite3"
    problems = []
    journal = status["journal"]
    if journal is None:
        if env.get(INSTANCE_KEY) != before["key"] or "KEELWAY_DB" in env:
            problems.append("rolled back, but one.test's env file is not its own")
        if nested.parent.exists() or any((h.root / "objects" / "seeds").glob("*")):
            problems.append("rolled back, but the import's data or copy is left")
        if _rows_of(h.root / "data" / "one.test" / "db.sqlite3") < before["visits"]:
            problems.append("rolled back, but one.test's own rows are not all there")
        if status["fenced"]:
            problems.append("rolled back, but a fence is still held on one.test")
        imports = [p.name for p in (h.root / "objects" / "replicas" / "one.test").glob(
            "seed-*")]
        if imports:
            problems.append(f"rolled back, but the import's replica is left: {imports}")
    elif journal["state"] == "swapped":
        if status["marker"] != journal["seed"] or env.get("KEELWAY_DB") != str(nested):
            problems.append(f"imported, but its database or env is not in place: {status}")
        if env.get(INSTANCE_KEY) == before["key"] or status["fenced"]:
            problems.append("imported, but its key was not minted or its fence is held")
    else:
        problems.append(f"the import is left {journal['state']}")
    store = SqliteStore(h.root / "keelway.db")
    try:
        route = store.routes.get_route("two.test")
    finally:
        store.close()
    if ((h.root / "env" / "two.test.env").read_text() != before["other_env"]
            or (route.state.value if route else None) != before["other_route"]
            or _rows_of(h.root / "data" / "two.test" / "db.sqlite3") != before["other_db"]):
        problems.append("two.test changed")
    if _snapshots_of(h, "two.test") != before["other_snapshots"]:
        problems.append("two.test's snapshots changed")
    if not _replica_is(h, "two.test", before["other_replica"]):
        problems.append("two.test's replica does not restore to what it held")
    if not _replica_is(h, "one.test", before["own_replica"]):
        problems.append("one.test's own replica does not restore to what it held")
    return problems


def _db_in_effect(h: Home) -> Path:
    """The database one.test's app opens: the seed's while an import is in effect
    (keelway/data/replicas.py in_effect), its own otherwise."""
    store = SqliteStore(h.root / "keelway.db")
    try:
        journal = store.imports.get_import("one.test")
    finally:
        store.close()
    if journal is not None and journal.state == "swapped":
        return h.root / "data" / "one.test" / "seed" / "db.sqlite3"
    return h.root / "data" / "one.test" / "db.sqlite3"


SCENARIOS: dict[str, tuple[list[Step], Step]] = {
    # name: (baseline steps, the operation under test)
    "deploy": ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test")],
               lambda h: h.ok("deploy", "hello", str(h.app_b))),
    "deploy-hold": ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test")],
                    lambda h: h.ok("deploy", "hello", str(h.app_b), "--mode", "hold")),
    "restart": ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test")],
                lambda h: h.ok("restart", "hello")),
    "config": ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test")],
               lambda h: h.ok("config", "hello", "set", "GREETING=hi")),
    "rollback": ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test"),
                  lambda h: h.ok("deploy", "hello", str(h.app_b))],
                 lambda h: h.ok("rollback", "hello")),
    # A stop is written out of service before anything stops; a start back in service
    # before anything spawns. A crash between leaves the instance in the state written,
    # and recovery finishes it (stopped: nothing alive; running: it answers).
    "stop": ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test")],
             lambda h: h.ok("stop", "hello")),
    "start": ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test"),
               lambda h: h.ok("stop", "hello")],
              lambda h: h.ok("start", "hello")),
    # The control plane's side of a gapless router restart: a crash after the new router
    # took over but before it was recorded must not leave the next boot binding a second
    # router (the port is taken) or recording the old one.
    "router-restart": ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test")],
                       lambda h: h.ok("router", "restart")),
    # The router dies and the control plane starts a successor on the same socket: a
    # crash anywhere in that must leave the next boot starting or adopting exactly one.
    "router-respawn": ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test")],
                       lambda h: _kill_router_until_respawned(h)),
    # The supervisor's own path: a published web crashes, its leftover tree is killed and
    # its cgroup removed, the crash and its retry time are persisted with the route
    # gated, and after the backoff it is restarted and published again.
    "crash-restart": ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test")],
                      _crash_the_web),
    # Scale to zero and back: the park intent, its publish and each stop; the wake's
    # RUNNING step, then each spawn and ready of its respawn and the publish. The worker
    # is hold-mode: across a crash mid-wake it must never run twice (_hold_overlaps).
    "park": ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test")],
             lambda h: h.ok("park", "one.test")),
    "wake": ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test"),
              lambda h: h.ok("park", "one.test")],
             lambda h: h.ok("wake", "one.test")),
    # Releases to parked instances: a deploy leaves a parked instance parked (the
    # release deferred in one write), and the wake runs it as an attempt. The worker is
    # hold-mode, so a crash after the wake's hold exec must leave the instance down, and
    # the worker never runs twice (_hold_overlaps).
    "deploy-parked": ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test"),
                       lambda h: h.ok("park", "one.test")],
                      lambda h: h.ok("deploy", "hello", str(h.app_b))),
    "wake-release": ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test"),
                      lambda h: h.ok("park", "one.test"),
                      lambda h: h.ok("deploy", "hello", str(h.app_b))],
                     lambda h: h.ok("wake", "one.test")),
    # A one-off run (`keelway run`) that leaves a child behind: a crash anywhere leaves
    # no process of it alive, and its operation finalized, once the next boot is done.
    "run": ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test")],
            lambda h: _run_once(h)),
    # Tenants whole (keelway/deploy/tenants.py): each rolled forward by the next boot
    # from its durable intent (`adding`, `removing`, the app's `destroying`).
    "instances-add": ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test")],
                      lambda h: h.ok("instances", "add", "hello", "two.test", "three.test")),
    "instances-remove": ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test",
                                         "--host", "two.test"),
                          lambda h: h.ok("domains", "add", "two.test", "www.two.test")],
                         lambda h: h.ok("instances", "remove", "hello", "two.test")),
    "destroy": ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test"),
                 lambda h: h.ok("domains", "add", "one.test", "www.one.test")],
                lambda h: h.ok("apps", "destroy", "hello", "--yes", "--purge-data")),
    # Seed import and rollback (keelway/deploy/seeding.py): after a crash anywhere and
    # the next boot, the import is in effect whole or rolled back whole (_seed_settled),
    # and two.test, never named, is exactly as it was.
    "seed-import": ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test",
                                    "--host", "two.test"), _remember_before],
                    lambda h: h.ok("seed", "import", "one.test", str(_seed_file(h)))),
    "seed-rollback": ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test",
                                      "--host", "two.test"), _remember_before,
                       lambda h: h.ok("seed", "import", "one.test", str(_seed_file(h))),
                       _remember_own_replica],
                      lambda h: h.ok("seed", "rollback", "one.test")),
    # Replicas (keelway/data/replicas.py): a park's last sync and stop of the replicator,
    # and a restore from the replica (hold, stop, swap, start, publish) of a running
    # instance; the replicator is one more process that must be proven gone or kept.
    "park-replicated": ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host",
                                        "one.test")],
                        lambda h: h.ok("park", "one.test")),
    "restore-replica": ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host",
                                        "one.test"),
                         lambda h: h.ok("park", "one.test"),
                         lambda h: h.ok("wake", "one.test")],
                        lambda h: h.ok("db", "restore", "one.test", "--from-replica")),
}
REPLICATED = {"park-replicated", "restore-replica", "seed-import", "seed-rollback",
              "snapshot", "restore", "forget-kept"}
# The scenarios about the router itself, which run it as the product does (Home).
ROUTER_SCENARIOS = {"router-restart", "router-respawn"}


def _for_scenario(home: Home, name: str) -> None:
    home.replicate = name in REPLICATED
    home.router_workers = None if name in ROUTER_SCENARIOS else 1
    if name in WITH_A_CA:
        from tests.acme_server import pebble

        https = free_port()
        ca = home.stops.enter_context(pebble(home.root.parent / "ca", home.port, https))
        home.up_extra = ["--https", f"127.0.0.1:{https}", "--acme-directory", ca.directory,
                         "--acme-ca-bundle", str(ca.ca_bundle), "--acme-challenge",
                         "http-01"]


def _visit(h: Home, host: str) -> None:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", h.port, timeout=10)
    try:
        conn.request("GET", "/", headers={"Host": host})
        assert conn.getresponse().status == 200
    finally:
        conn.close()


def _visits(h: Home, host: str) -> tuple[int, str]:
    """The visits the instance's database holds, and its integrity_check."""
    import sqlite3

    conn = sqlite3.connect(f"file:{h.root / 'data' / host / 'db.sqlite3'}?mode=ro", uri=True,
                           timeout=5)
    try:
        count = int(conn.execute("SELECT COUNT(*) FROM visits").fetchone()[0])
        return count, str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


def _data_baseline(h: Home) -> None:
    """one.test: 3 visits, snapshotted (its id kept beside the home), then 2 more;
    two.test: 1 visit, never touched by what follows."""
    h.ok("deploy", "hello", str(h.app_a), "--host", "one.test", "--host", "two.test")
    for _ in range(3):
        _visit(h, "one.test")
    _visit(h, "two.test")
    done = h.cli("db", "snapshot", "one.test", "--json")
    assert done.returncode == 0, done.stderr
    (h.root.parent / "snapshot-id").write_text(json.loads(done.stdout)["id"])
    _visit(h, "one.test")
    _visit(h, "one.test")
    h.ok("db", "snapshot", "two.test")
    other = _other(h)
    if h.replicate:  # a replica to compare: it has shipped what the database holds
        assert _replica_is(h, "two.test", str(other["db"]), 15)
    (h.root.parent / "other.json").write_text(json.dumps(other))


def _other(h: Home) -> dict[str, object]:
    """What a data scenario must leave of two.test, which it never names: its env
    file, route, snapshots and database (whose replica must restore to it)."""
    store = SqliteStore(h.root / "keelway.db")
    try:
        route = store.routes.get_route("two.test")
    finally:
        store.close()
    return {"env": (h.root / "env" / "two.test.env").read_text(),
            "route": route.state.value if route else None,
            "snapshots": _snapshots_of(h, "two.test"),
            "db": _content(h.root / "data" / "two.test" / "db.sqlite3")}


def _restore(h: Home) -> None:
    h.ok("db", "restore", "one.test", (h.root.parent / "snapshot-id").read_text())


def _data_intact(h: Home, label: str, restored: set[int]) -> list[str]:
    """one.test holds the old rows (5) or the snapshot's (3), whole; two.test its own;
    every listed snapshot verifies."""
    problems = []
    one, one_ok = _visits(h, "one.test")
    two, two_ok = _visits(h, "two.test")
    if one not in restored or one_ok != "ok":
        problems.append(f"{label}: one.test has {one} visits ({one_ok}), not one of "
                        f"{sorted(restored)}")
    if (two, two_ok) != (1, "ok"):
        problems.append(f"{label}: two.test changed: {two} visits ({two_ok})")
    before, now = json.loads((h.root.parent / "other.json").read_text()), _other(h)
    for part in ("env", "route", "snapshots", "db"):
        if now[part] != before[part]:
            problems.append(f"{label}: two.test's {part} changed")
    if h.replicate and not _replica_is(h, "two.test", before["db"]):
        problems.append(f"{label}: two.test's replica does not restore to what it held")
    for snap in h.api("GET", "/v1/instances/one.test/snapshots")["snapshots"]:
        try:
            h.api("POST", f"/v1/instances/one.test/snapshots/{snap['id']}/verify", {})
        except ApiError as exc:
            problems.append(f"{label}: listed snapshot {snap['id']} fails: {exc.message}")
    leftovers = [p.name for p in (h.root / "data" / "one.test").iterdir()
                 if "restore" in p.name or "incoming" in p.name or ".tmp-" in p.name]
    if leftovers:
        problems.append(f"{label}: left in the data dir: {leftovers}")
    return problems


def _forget_kept(h: Home) -> None:
    """Remove the database the restore kept (keelway/data/kept.py)."""
    listed = h.cli("db", "kept", "one.test", "--json")
    assert listed.returncode == 0, listed.stderr
    [copy] = [c for c in json.loads(listed.stdout)["kept"] if c["kind"] == "database"]
    h.ok("db", "forget", "one.test", copy["id"])


SCENARIOS["snapshot"] = ([_data_baseline], lambda h: h.ok("db", "snapshot", "one.test"))
SCENARIOS["restore"] = ([_data_baseline], _restore)
SCENARIOS["forget-kept"] = ([_data_baseline, _restore], _forget_kept)
# What a data scenario must leave once recovered: either database whole, never a mix.
DATA_CHECKED: dict[str, set[int]] = {"snapshot": {5}, "restore": {3, 5}, "forget-kept": {3}}


def _hosts(h: Home) -> set[str]:
    status = h.api("GET", "/v1/status")
    return {inst["host"] for app in status["apps"] for inst in app["instances"]}


# What an operation rolled forward after a crash must have reached once boot is done.
ROLLED_FORWARD: dict[str, Callable[[Home], bool]] = {
    "instances-add": lambda h: _hosts(h) == {"one.test", "two.test", "three.test"} and all(
        (h.root / "data" / host / "db.sqlite3").exists() for host in ("two.test", "three.test")),
    "instances-remove": lambda h: _hosts(h) == {"one.test"} and _get(h.port, "www.two.test")
    == 404 and (h.root / "data" / "two.test").exists(),
    "destroy": lambda h: _hosts(h) == set() and _get(h.port, "www.one.test") == 404
    and not (h.root / "data" / "one.test").exists(),
}


def _deploy_with_requirements(h: Home) -> None:
    """A deploy whose build makes a venv (its requirements.txt lists nothing, so no
    registry is asked), kept as an entry of the home's dependency cache."""
    app = h.app_a.parent / "deps"
    if not app.exists():
        shutil.copytree(h.app_a, app)
        (app / "requirements.txt").write_text("# nothing to install\n")
    h.ok("deploy", "hello", str(app))


def _no_half_cache_entry(h: Home) -> bool:
    cache = h.root / "cache" / "deps"
    return not cache.exists() or not any(p.name.startswith(".tmp-") for p in cache.iterdir())


# The publish of a dependency cache entry (keelway/builds/cache.py): a crash before its
# rename leaves a temp that boot sweeps and no lookup reads. Only its own points are
# crashed here (ONLY): the deploy that follows the staging is the "deploy" scenario's.
SCENARIOS["deploy-deps"] = ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host",
                                            "one.test")], _deploy_with_requirements)
ONLY: dict[str, str] = {"deploy-deps": "cache."}
ROLLED_FORWARD["deploy-deps"] = _no_half_cache_entry


def _rollout_settled(h: Home) -> bool:
    """The config's rollout over two instances (two cohorts, the first judged) is done,
    both instances on its release; or, cut short before its first instance wrote the
    release, halted in the open with neither on it. Never left running, never a fleet
    silently mixed."""
    store = SqliteStore(h.root / "keelway.db")
    try:
        journal = store.rollouts.latest_rollout("hello")
        if journal is None or journal.kind is not OpKind.CONFIG:
            return True  # the crash came before the rollout began: nothing to carry on
        on = {host: on_release(store, host, journal.release)
              for host in ("one.test", "two.test")}
        if journal.state is RolloutState.DONE:
            return all(on.values())
        return (journal.state is RolloutState.HALTED and "never written" in (
            journal.reason or "") and not any(on.values()))
    finally:
        store.close()


# A rollout across two instances (keelway/deploy/rollouts.py): a crash at any of its own
# writes leaves it carried on by the boot from its journal, to done. Only its own points
# are crashed here (ONLY): each instance's attempt is the attempt the "config" scenario
# crashes step by step (where a crash inside one leaves the rollout to be carried on
# too), and a crash between an attempt and the mark of its result is rollout.hosts'.
SCENARIOS["rollout"] = ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test",
                                        "--host", "two.test")],
                        lambda h: h.ok("config", "hello", "set", "GREETING=hi"))
ROLLED_FORWARD["rollout"] = _rollout_settled
ONLY["rollout"] = "rollout."

# A rollout whose last cohort is parked: once the awake instance wrote the release, the
# parked one takes it in a batched write (keelway/deploy/deployer.py `_defer_parked`).
# A crash on either side of that write leaves it done by the boot: the parked instance
# has the release pending (and its own operation), or it is deferred again.
SCENARIOS["rollout-parked"] = (
    [lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test", "--host",
                    "two.test"),
     lambda h: h.ok("park", "two.test")],
    lambda h: h.ok("config", "hello", "set", "GREETING=hi"))
ROLLED_FORWARD["rollout-parked"] = _rollout_settled
ONLY["rollout-parked"] = "defer.batch."


def _halted_rollout(h: Home) -> None:
    """A config rollout over two instances halted after its canary: no request came
    during the canary's bake, and the release says `on_no_traffic = halt`."""
    done = h.cli("config", "hello", "set", "GREETING=hi", "--rollout", "on_no_traffic=halt")
    assert done.returncode == 1 and "no request during bake" in done.stderr, done.stderr


def _finished_by(verb: str, state: RolloutState, release: Callable[[Any], int]
                 ) -> Callable[[Home], bool]:
    """After a crash in `rollout VERB`: the rollout is in `state`, or still halted (the
    crash came before the move that carries it on) and `rollout VERB` again gets it
    there; then both instances run `release` of it."""
    def finished(h: Home) -> bool:
        if _latest_rollout(h).state is RolloutState.HALTED:
            again = h.cli("rollout", verb, "hello")
            assert again.returncode == 0, again.stderr
        journal = _latest_rollout(h)
        store = SqliteStore(h.root / "keelway.db")
        try:
            return journal.state is state and all(
                on_release(store, host, release(journal)) for host in ("one.test", "two.test"))
        finally:
            store.close()

    return finished


def _latest_rollout(h: Home) -> Any:
    store = SqliteStore(h.root / "keelway.db")
    try:
        return store.rollouts.latest_rollout("hello")
    finally:
        store.close()


# A halted rollout carried on (`rollout resume`) and taken back (`rollout abort`): a crash
# at any of their writes leaves the rollout where `resume` or `abort` asked again finishes
# it, never an instance attempted twice. The attempts themselves are the config's and the
# rollback's, crashed in those scenarios (ONLY).
_TWO_HALTED = [lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test",
                              "--host", "two.test"), _halted_rollout]
SCENARIOS["rollout-resume"] = (_TWO_HALTED, lambda h: h.ok("rollout", "resume", "hello"))
ROLLED_FORWARD["rollout-resume"] = _finished_by("resume", RolloutState.DONE,
                                                lambda journal: journal.release)
ONLY["rollout-resume"] = "rollout."
SCENARIOS["rollout-abort"] = (_TWO_HALTED, lambda h: h.ok("rollout", "abort", "hello"))
ROLLED_FORWARD["rollout-abort"] = _finished_by("abort", RolloutState.ABORTED,
                                               lambda journal: journal.previous)
ONLY["rollout-abort"] = "rollout."
# Scenarios whose every generation of a hold-mode service is checked for overlap in time,
# not only at the end: the one before must be recorded gone before the next is planned.
HOLD_CHECKED = {"park", "wake", "wake-release"}


def _hold_overlaps(root: Path, label: str) -> list[str]:
    store = SqliteStore(root / "keelway.db")
    try:
        found = []
        for inst in store.instances.list_instances():
            builds = {b.digest: Path(b.path) for b in store.builds.list_builds(inst.app)}
            gens = sorted(store.generations.recent_generations(inst.host, limit=1000),
                          key=lambda g: g.id)
            for service in {g.service for g in gens}:
                # Unspawned ones too: a crash between spawn and record leaves no pid.
                mine = [g for g in gens if g.service == service]
                for old, new in itertools.pairwise(mine):
                    spec = load_manifest(builds[new.build_digest]).services.get(service)
                    if spec is None or spec.mode is not Mode.HOLD:
                        continue
                    if old.exited_at is None or old.exited_at > new.created_at:
                        found.append(f"{label}: {inst.host} {service} generation {new.id} "
                                     f"was planned before generation {old.id} was gone")
        return found
    finally:
        store.close()


def _run_once(home: Home) -> None:
    done = home.cli("run", "hello", "--", "sh", "-c", "sleep 30 & sleep 0.3; exit 3")
    assert done.returncode == 3, done.stderr


# A scheduled job's run by hand (keelway/deploy/jobs.py) that counts itself and leaves a
# child behind: a crash anywhere leaves no process of it, its operation ended, and it
# never ran twice (it is never started again after its operation began).
JOB_SH = 'echo ran >> "$KEELWAY_DATA_DIR/job-runs"\nsleep 30 &\nsleep 0.3\n'


def _deploy_with_a_job(h: Home) -> None:
    (h.app_a / "leave.sh").write_text(JOB_SH)
    with (h.app_a / "keelway.toml").open("a") as toml:
        toml.write('[jobs.leave]\nschedule = "0 0 1 1 *"\ncommand = "sh leave.sh"\n')
    h.ok("deploy", "hello", str(h.app_a), "--host", "one.test")


def _job_once(h: Home) -> None:
    h.ok("jobs", "run", "hello", "leave", "--instance", "one.test")

    def ended() -> bool:
        try:
            runs = h.api("GET", "/v1/apps/hello/jobs", timeout_s=10)["runs"]
        except (ApiUnavailable, ApiError, OSError):
            raise AssertionError("the control plane is gone") from None
        return bool(runs) and runs[0]["state"] != "running"

    assert wait_until(ended, 30, 0.1)


def _job_ran_at_most_once(h: Home) -> bool:
    time.sleep(1.0)  # a run dispatched again (it must not be) would have begun by now
    runs = h.root / "data" / "one.test" / "job-runs"
    count = len(runs.read_text().splitlines()) if runs.exists() else 0
    store = SqliteStore(h.root / "keelway.db")
    try:
        open_ops = [o for o in store.ops.unfinished_runs() if o.kind is OpKind.JOB]
    finally:
        store.close()
    return count <= 1 and not open_ops


SCENARIOS["job"] = ([_deploy_with_a_job], _job_once)
ROLLED_FORWARD["job"] = _job_ran_at_most_once


# Your own certificate for an instance's host (keelway/certs.py): after a crash anywhere
# in its lay-down, the store has the old pair or the new one, whole, never half.
def _import_cert(h: Home) -> None:
    import trustme

    issued = trustme.CA().issue_cert("one.test")
    cert, key = h.root.parent / "one.pem", h.root.parent / "one.key"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    h.ok("certs", "import", "one.test", str(cert), str(key))


def _cert_whole(h: Home) -> bool:
    import ssl

    where = h.root / "certs" / "one.test"
    if not where.exists():
        return True  # the crash came before the swap: no certificate, as before
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(where / "fullchain.pem",
                                                                where / "privkey.pem")
    except (OSError, ssl.SSLError):
        return False
    return (where / "fullchain.pem").read_bytes() == (h.root.parent / "one.pem").read_bytes()


SCENARIOS["certs-import"] = (
    [lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test")], _import_cert)
ROLLED_FORWARD["certs-import"] = _cert_whole


# The frozen tier (keelway/deploy/freezing.py): a freeze (route frozen, publish, every
# process stopped in place) and the thaw a wake runs (thaw, route serving, publish). After
# a crash anywhere and the next boot, the instance answers (the recovery check's request
# thaws what is frozen) and is serving once it has.
def _serving_after_a_request(h: Home) -> bool:
    if _get(h.port, "one.test") != 200:
        return False
    route = h.api("GET", "/v1/status")["apps"][0]["instances"][0]["route"]
    return bool(route["state"] == "serving")


SCENARIOS["freeze"] = ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test")],
                       lambda h: h.ok("freeze", "one.test"))
SCENARIOS["thaw"] = ([lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test"),
                      lambda h: h.ok("freeze", "one.test")],
                     lambda h: h.ok("wake", "one.test"))
for _name in ("freeze", "thaw"):
    ROLLED_FORWARD[_name] = _serving_after_a_request


# A certificate by ACME (keelway/deploy/certify.py) from a real CA on loopback (pebble):
# after a crash anywhere in the certify operation and the next boot, the name gets its
# certificate from the order the crash left (one order at the CA in all), and the
# operation is ended.
WITH_A_CA = {"certify"}


def _orders_placed(h: Home) -> int:
    log = h.root.parent / "ca" / "pebble.log"
    return sum("Added order" in line for line in log.read_text().splitlines())


def _certified_once(h: Home) -> bool:
    store = SqliteStore(h.root / "keelway.db")
    try:
        open_ops = [o for o in store.ops.unfinished_runs() if o.kind is OpKind.CERTIFY]
    finally:
        store.close()
    # What the keeper would do next (and the router at a handshake): certify the name
    # if it has no certificate, resuming an order under way.
    assert h.api("POST", "/v1/certs/one.test/demand", {}, timeout_s=60)["ok"]
    return not open_ops and _orders_placed(h) == 1 and (
        h.root / "certs" / "one.test" / "fullchain.pem").exists()


SCENARIOS["certify"] = (
    [lambda h: h.ok("deploy", "hello", str(h.app_a), "--host", "one.test")],
    lambda h: h.ok("certs", "renew", "one.test"))
ROLLED_FORWARD["certify"] = _certified_once
# Its lay-down's points are the import's (certs-import).
ONLY["certify"] = "certify."


def _kill_router_until_respawned(home: Home) -> None:
    """SIGKILL the router's main process; return once the control plane has started
    and published to its successor (AssertionError if the control plane dies first)."""
    killed = int((home.root / "router" / "router.pid").read_text().split()[0])
    os.kill(killed, signal.SIGKILL)

    def respawned() -> bool:
        try:
            router = home.api("GET", "/v1/status")["router"]
        except (ApiUnavailable, OSError):
            raise AssertionError("the control plane is gone") from None
        return bool(router["restarts"] >= 1 and router["pid"] not in (None, killed))

    assert wait_until(respawned, timeout_s=30)


def _cleanup(home: Home) -> None:
    kill_home_processes(home.root)
    home.stops.close()
    shutil.rmtree(home.root.parent, ignore_errors=True)


def _points(hits: list[str], before: int = 0,
            passed: set[tuple[str, str]] | None = None) -> tuple[list[str], int]:
    """The points to crash at, as name@N (the N-th hit of `name` after the first
    `before` lines), from trace lines `name<TAB>code path`, and how many hits there were.

    A hit is skipped when an earlier hit had the same name and the same code path
    (every keelway frame on the stack, file and line): a loop's next pass over the same
    step (another host, another service started the same way), which shares its crash
    window with the first pass, or, with `passed` shared, a hit an earlier scenario
    checked the same way crashed already (`_shared`). Every distinct step of every
    operation is still crashed, and each scenario prints how many hits it skipped."""
    counts: Counter[str] = Counter()
    passed = set() if passed is None else passed
    points: list[str] = []
    total = 0
    for line in hits[before:]:
        name, _, path = line.partition("\t")
        counts[name] += 1
        total += 1
        key = (name, path)
        if key in passed:
            continue
        passed.add(key)
        points.append(f"{name}@{counts[name]}")
    return points, total


# What this session crashed already, by how a scenario is set up and checked (`_shared`):
# the same failpoint on the same code path in a later scenario of that kind is the same
# crash window, run once (the first scenario in sorted order takes it).
PASSED: dict[tuple[object, ...], set[tuple[str, str]]] = {}


def _shared(name: str) -> set[tuple[str, str]]:
    """The crashes scenario `name` shares with every scenario set up and checked as it
    is: the same home (replicated or not, the router as the product runs it or one
    worker) and the same checks after recovery. A scenario with checks of its own
    (its data, what it rolls forward) shares with none."""
    own = name in DATA_CHECKED or name in ROLLED_FORWARD or name in ONLY
    how = (name in REPLICATED, name in ROUTER_SCENARIOS, name in HOLD_CHECKED,
           name.startswith("seed-"), name if own else None)
    return PASSED.setdefault(how, set())


def _hits(name: str) -> list[str]:
    """The trace lines of the failpoints the scenario's operation passed (its setup's
    left out), from a run of it with the trace on."""
    baseline, operation = SCENARIOS[name]
    home = _fresh()
    _for_scenario(home, name)
    trace = home.root.parent / "trace"
    try:
        home.up(KEELWAY_FAILPOINTS_TRACE=str(trace))
        for step in baseline:
            step(home)
        before = len(trace.read_text().splitlines()) if trace.exists() else 0
        operation(home)
        return trace.read_text().splitlines()[before:]
    finally:
        _cleanup(home)


def _selected(name: str, hits: list[str],
              passed: set[tuple[str, str]] | None = None) -> tuple[list[str], int]:
    """The scenario's points to crash at, as name@N, and how many hits it passed (see
    `_points`; `passed`: the crashes it shares)."""
    points, total = _points(hits, 0, passed)
    return [p for p in points if p.startswith(ONLY.get(name, ""))], total


def _trace(name: str) -> tuple[list[str], int]:
    """The failpoint hits of the scenario's operation to crash at, as name@N points,
    and how many it passed."""
    return _selected(name, _hits(name))


def _crash_in_operation(home: Home, name: str, point: str) -> bool:
    """Run scenario `name` on `home` with the daemon armed to die at `point`; whether
    it died there."""
    baseline, operation = SCENARIOS[name]
    _for_scenario(home, name)
    arm = home.root.parent / "arm"
    pid = home.up(KEELWAY_FAILPOINTS_ARM=str(arm))
    for step in baseline:
        step(home)
    staged = arm.with_name("arm.tmp")
    staged.write_text(point)
    os.replace(staged, arm)  # whole or absent: the daemon never reads half a spec
    with contextlib.suppress(AssertionError):
        operation(home)  # the CLI sees the control plane die under it
    return gone(pid, timeout_s=30)


def _recovered(home: Home, label: str) -> list[str]:
    """A clean boot, every running instance answering, then SPEC §5 and a second
    reconcile with nothing to do. A crash after a web's crash was persisted leaves its
    restart to the backoff (at most a quick try's 2 s away): an instance may take that
    long to answer again, and the checks wait for it."""
    home.up()
    problems = []
    status = home.api("GET", "/v1/status")
    for app in status["apps"]:
        for inst in app["instances"]:
            if inst["state"] == "running":
                deadline = time.monotonic() + 10
                while (code := _get(home.port, inst["host"])) != 200 and (
                        time.monotonic() < deadline):
                    time.sleep(0.1)
                if code != 200:
                    problems.append(f"{label}: {inst['host']} answers {code} after recovery")
    # A crash restart the boot scheduled (its backoff persisted before the crash) runs on
    # its own: its route is published a moment before its operation is journaled done,
    # so an instance that answers may still have it in flight; and a rollout the crash
    # cut short goes on in the background once the boot is done. Invariant 4 is about
    # the control plane at rest: the checks wait (30 s at most) for what is in flight to
    # end, and an operation still open then is reported as before.
    wait_until(lambda: _ops_at_rest(home), 30, 0.1)
    problems += [f"{label}: {v}" for v in violations(home.root)]
    report = home.api("POST", "/v1/reconcile", {"dry_run": True}, timeout_s=60)
    for item in report["instances"]:
        if item["actions"] or item["error"]:
            problems.append(f"{label}: a second reconcile would still do "
                            f"{item['actions']} {item['error'] or ''}")
    return problems


def _ops_at_rest(home: Home) -> bool:
    """Whether every instance's latest operation is terminal and no rollout runs."""
    store = SqliteStore(home.root / "keelway.db")
    try:
        if store.rollouts.running_rollouts():
            return False
        for inst in store.instances.list_instances():
            latest = store.ops.latest_operation(inst.host)
            if latest is not None and not latest.terminal:
                return False
        return True
    finally:
        store.close()


def _crash_at(name: str, point: str) -> list[str]:
    home = _fresh()
    try:
        if not _crash_in_operation(home, name, point):
            return [f"{name} {point}: the failpoint was never hit"]
        problems = _recovered(home, f"{name} {point}")
        if name in HOLD_CHECKED:
            problems += _hold_overlaps(home.root, f"{name} {point}")
        if name.startswith("seed-"):
            problems += [f"{name} {point}: {p}" for p in _seed_settled(home)]
        if name in DATA_CHECKED:
            problems += _data_intact(home, f"{name} {point}", DATA_CHECKED[name])
        if name in REPLICATED:
            # The database is the old one or the restored one, whole, never a mix.
            bad = verify(_db_in_effect(home))
            if bad is not None:
                problems.append(f"{name} {point}: the database is not whole: {bad}")
        reached = ROLLED_FORWARD.get(name)
        if reached is not None and not reached(home):
            problems.append(f"{name} {point}: boot did not carry the operation through")
        return problems
    finally:
        _cleanup(home)


def _get(port: int, host: str, path: str = "/health") -> int:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": host})
        return conn.getresponse().status
    except OSError:
        return 0
    finally:
        conn.close()


# The failpoints each test above crashed at, by scenario (BOOT: the boot after a crash),
# for the coverage test at the end of this file.
CRASHED: dict[str, set[str]] = {}
BOOT = "boot"


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_a_crash_at_any_failpoint_converges_and_keeps_every_invariant(scenario: str) -> None:
    trace = _hits(scenario)
    own, hits = _selected(scenario, trace)
    assert own, "the scenario passed no failpoint"
    shared = _shared(scenario)
    points, _ = _selected(scenario, trace, shared)
    with ThreadPoolExecutor(PARALLEL) as pool:
        results = list(pool.map(lambda p: _crash_at(scenario, p), points))
    problems = [p for result in results for p in result]
    names = sorted({p.split("@")[0] for p in own})
    CRASHED[scenario] = set(names)
    print(f"\n{scenario}: crashed at {len(points)} of {hits} failpoint hits: {len(own)} "
          f"distinct paths (the rest a loop's repeat of one), {len(own) - len(points)} of "
          f"them crashed by an earlier scenario set up as this one; {len(names)} "
          f"failpoints: {', '.join(names)}")
    assert problems == [], "\n".join(problems)


# A crash while recovering from a crash. The first crash leaves a deploy's candidate web
# up but not yet ACTIVE, so the boot after it has real work: remove the candidate,
# finish the operation, restart and republish. That boot is then killed at each
# failpoint it passes, and the boot after that must still converge.
RECOVERY_SCENARIO = "deploy"
FIRST_CRASH = "ready.after"


def _boot_points(first: str) -> list[str]:
    """Every failpoint hit of the boot that follows a crash at `first`, as name@N."""
    home = _fresh()
    trace = home.root.parent / "trace"
    try:
        assert _crash_in_operation(home, RECOVERY_SCENARIO, first)
        home.up(KEELWAY_FAILPOINTS_TRACE=str(trace))
        hits = trace.read_text().splitlines() if trace.exists() else []
    finally:
        _cleanup(home)
    return _points(hits)[0]


def _crash_in_boot(first: str, point: str) -> list[str]:
    label = f"boot after {first}, killed at {point}"
    home = _fresh()
    try:
        assert _crash_in_operation(home, RECOVERY_SCENARIO, first)
        home.cli(*home.up_args(),
                 env=home.env(KEELWAY_FAILPOINTS=point))  # fails: the daemon dies booting
        pid = int((home.root / "keelway.lock").read_text().strip())
        if not gone(pid, timeout_s=10):
            return [f"{label}: the failpoint was never hit"]
        return _recovered(home, label)
    finally:
        _cleanup(home)


def test_a_crash_during_boot_recovery_converges_on_the_next_boot() -> None:
    first = next(p for p in _trace(RECOVERY_SCENARIO)[0] if p.startswith(f"{FIRST_CRASH}@"))
    points = _boot_points(first)
    assert any(p.startswith("reconcile.remove") for p in points), points
    with ThreadPoolExecutor(PARALLEL) as pool:
        results = list(pool.map(lambda p: _crash_in_boot(first, p), points))
    problems = [p for result in results for p in result]
    CRASHED[BOOT] = {p.split("@")[0] for p in points}
    print(f"\nboot after a crash at {first}: covered {len(points)} failpoint hits "
          f"({', '.join(points)})")
    assert problems == [], "\n".join(problems)


def test_every_declared_failpoint_is_crashed_in_some_scenario() -> None:
    """A failpoint no scenario passes is an effect no crash test covers: a new effect
    must come with a scenario that reaches it. Reads what the tests above crashed at
    (a scenario they did not run here, as with -k, is traced now)."""
    import keelway.api.daemon  # noqa: F401  (wires every part: every failpoint declared)
    from keelway import failpoints

    for scenario in sorted(set(SCENARIOS) - set(CRASHED)):
        CRASHED[scenario] = {p.split("@")[0] for p in _trace(scenario)[0]}
    if BOOT not in CRASHED:
        first = next(p for p in _trace(RECOVERY_SCENARIO)[0]
                     if p.startswith(f"{FIRST_CRASH}@"))
        CRASHED[BOOT] = {p.split("@")[0] for p in _boot_points(first)}
    crashed = set().union(*CRASHED.values())
    # `test.*`: what a unit test declares for itself (tests/deploy/test_steps.py).
    declared = {name for name in failpoints.KNOWN if not name.startswith("test.")}
    assert sorted(declared - crashed) == []
