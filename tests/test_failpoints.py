"""Failpoints armed late (KEELWAY_FAILPOINTS_ARM): hits before the spec's file appears
never count, so a crash test's setup cannot move the point it arms."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keelway import failpoints

# Hits `setup` three times, then waits for the go-ahead file the test writes (standing in
# for the crash matrix writing the arm file once a scenario's setup is done), then hits
# `op` and `setup` in turn, printing each hit it survives.
PROGRAM = """
import os, sys, time
from keelway import failpoints
for _ in range(3):
    failpoints.hit("setup")
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
for i in range(1, 6):
    failpoints.hit("op")
    print("op", i, flush=True)
    failpoints.hit("setup")
"""


def _run(tmp_path: Path, spec: str) -> subprocess.CompletedProcess[str]:
    arm = tmp_path / "arm"
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM, str(arm)], text=True,
                            stdout=subprocess.PIPE,
                            env={**os.environ, "KEELWAY_FAILPOINTS_ARM": str(arm)})
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    arm.write_text(spec)
    out, _ = proc.communicate(timeout=30)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def test_an_armed_point_counts_only_the_hits_after_its_file_appears(tmp_path: Path) -> None:
    done = _run(tmp_path, "setup@2")
    # Three setup hits came before the file: the second one after it is the one that kills.
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split("\n")[:2] == ["op 1", "op 2"] and "op 3" not in done.stdout


def test_a_point_never_reached_after_arming_does_not_fire(tmp_path: Path) -> None:
    done = _run(tmp_path, "op@9")
    assert done.returncode == 0 and "op 5" in done.stdout


def test_a_pause_point_waits_where_armed_and_never_crashes(
        monkeypatch: pytest.MonkeyPatch) -> None:

    monkeypatch.setenv("KEELWAY_FAILPOINTS", "write.rename.a.pid=0.3,crash.point@2,odd=x")
    started = time.monotonic()
    failpoints.pause("write.rename.a.pid")
    assert time.monotonic() - started >= 0.3
    started = time.monotonic()
    failpoints.pause("write.rename.b.pid")  # not armed: no wait
    failpoints.pause("odd")  # a spec it cannot read: no wait
    failpoints.pause("crash.point")  # a crash point is no pause
    assert time.monotonic() - started < 0.1
    # ...and a pause is no crash point: only `crash.point` is armed to die
    assert failpoints._parse(os.environ["KEELWAY_FAILPOINTS"]) == {"crash.point": 2}
