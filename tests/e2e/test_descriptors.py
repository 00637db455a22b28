"""A process keelway starts holds exactly stdin, stdout, stderr and what it is given:
through every spawn path (build and release steps, web, worker, the replicator, a crash
restart, a wake, `keelway run`), on a fresh home, after the control plane adopted a
running router (`down --keep-apps`, `up -d`) and after a crash of the control plane.

The app's processes record their descriptors at their first instruction; the
replicator (litestream, not ours to instrument) and every other live process of the
instance are read from /proc and held against keelway's own (tests/invariants.py)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.apps import hello
from tests.e2e.harness import Keelway, wait_until
from tests.invariants import descriptor_violations

pytestmark = pytest.mark.slow

HOST = "fd.test"

PROBE_PY = '''\
"""Record this process's descriptors before doing anything else, then run argv[2]."""
import json, os, runpy, sys

fds = {}
for name in os.listdir("/proc/self/fd"):
    try:
        target = os.readlink(f"/proc/self/fd/{name}")
    except OSError:
        continue  # the directory listdir read, closed by now
    if target != f"/proc/{os.getpid()}/fd":
        fds[name] = target
final = os.path.join(PROBES, f"{sys.argv[1]}-{os.getpid()}.json")
with open(final + ".part", "w") as out:
    json.dump({"role": sys.argv[1], "fds": fds}, out)
os.rename(final + ".part", final)  # whole or absent for the reader
if len(sys.argv) > 2:
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
'''


def _app(root: Path, probes: Path) -> Path:
    app = hello(root, "fdapp", web_cmd="python3 probe.py web web.py",
                worker_cmd="python3 probe.py worker worker.py",
                release_cmd="python3 probe.py release")
    (app / "probe.py").write_text(f"PROBES = {str(probes)!r}\n{PROBE_PY}")
    with (app / "keelway.toml").open("a") as toml:
        toml.write('[build]\ncommand = "python3 probe.py build"\n')
    return app


class Probes:
    """The records the app's processes left, each read once."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.seen: set[str] = set()

    def new(self) -> list[dict[str, Any]]:
        fresh = sorted(p for p in self.directory.glob("*.json") if p.name not in self.seen)
        self.seen |= {p.name for p in fresh}
        return [json.loads(p.read_text()) for p in fresh]

    def expect(self, kw: Keelway, when: str, roles: set[str]) -> None:
        """Every new record shows stdio alone; the roles named came; nothing of keelway's
        own is held by any live process of the home's instances."""
        records: list[dict[str, Any]] = []
        wait_until(lambda: roles <= {r["role"] for r in records} or bool(
            records.extend(self.new())), 30)
        assert roles <= {r["role"] for r in records}, (when, records)
        for record in records:
            extra = {fd: t for fd, t in record["fds"].items() if fd not in {"0", "1", "2"}}
            assert not extra, f"{when}: {record['role']} inherited {extra}"
        assert descriptor_violations(kw.home) == [], when


def _web_pid(kw: Keelway) -> int:
    for app in kw.ok("status", "--json").json()["apps"]:
        for inst in app["instances"]:
            for proc in inst["processes"]:
                if proc["service"] == "web" and proc["state"] not in ("gone",) and proc["pid"]:
                    return int(proc["pid"])
    raise AssertionError("no web process")


def _exercise(kw: Keelway, probes: Probes, when: str) -> None:
    """Restart, a crash restart, a park and a wake, and a one-off run."""
    kw.ok("restart", "fdapp")
    probes.expect(kw, f"{when}: restart", {"web", "worker"})
    os.kill(_web_pid(kw), signal.SIGKILL)
    probes.expect(kw, f"{when}: crash restart", {"web"})
    assert wait_until(lambda: kw.get(HOST)[0] == 200, 30)
    kw.ok("park", HOST)
    status, _, _ = kw.get(HOST, timeout_s=60)
    assert status == 200
    probes.expect(kw, f"{when}: wake", {"web", "worker"})
    kw.ok("run", "fdapp", "--", "python3", "probe.py", "run")
    probes.expect(kw, f"{when}: run", {"run"})


def test_every_spawn_path_gives_a_process_stdio_and_nothing_of_keelways_own(
        kw_root: Keelway, tmp_path: Path) -> None:
    # kw_root: where this runs as root, each instance as a uid of its own, as on a box
    kw = kw_root
    probes_dir = kw.home.parent / "probes"
    probes_dir.mkdir(mode=0o1777)
    probes_dir.chmod(0o1777)  # a tenant may run as a uid of its own
    probes = Probes(probes_dir)
    kw.up()
    kw.ok("deploy", "fdapp", str(_app(tmp_path, probes_dir)), "--host", HOST)
    probes.expect(kw, "first deploy", {"build", "release", "web", "worker"})
    _exercise(kw, probes, "fresh home")

    kw.ok("down", "--keep-apps")
    kw.up()  # adopts the running router: its listening socket comes over the wire
    _exercise(kw, probes, "after an adoption")

    kw.kill_daemon()
    kw.up()
    _exercise(kw, probes, "after a crash")
