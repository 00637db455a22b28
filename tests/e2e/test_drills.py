"""Restore drills nobody asks for (issue #22, keelway/deploy/drill_schedule.py): with a
period of 2 s, the daemon drills each instance's newest snapshot and replica by itself,
records the result as an event, and a copy that rots shows as a failed drill in `status`
and `doctor`."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from keelway.deploy.drill_schedule import due_at, offset_s
from tests.deploy.apps import hello
from tests.e2e.harness import Keelway, wait_until

HOST = "one.test"


def test_a_first_drill_is_placed_in_the_period_by_the_name_and_then_every_period() -> None:
    offsets = [offset_s(f"t{i}.test", 86400) for i in range(1000)]
    assert all(0 <= o < 86400 for o in offsets)
    # Spread: no hour of the day holds more than a tenth of them.
    by_hour = [sum(1 for o in offsets if h * 3600 <= o < (h + 1) * 3600) for h in range(24)]
    assert max(by_hour) < 100
    assert offset_s("a.test", 86400) == offset_s("a.test", 86400)  # a restart moves nothing
    assert due_at("a.test", 86400, last=1000.0, started=5.0) == 87400.0
    assert due_at("a.test", 86400, None, 5.0) == 5.0 + offset_s("a.test", 86400)


def _drill_events(kw: Keelway) -> list[str]:
    return [line for line in kw.ok("events", "hello", "-n", "200").out.splitlines()
            if "drill" in line]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_instances_are_drilled_on_schedule_and_a_rotten_copy_fails_its_drill(
        kw: Keelway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEELWAY_DRILL_EVERY", "2")
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "v1")), "--host", HOST)
    snap = kw.ok("db", "snapshot", HOST, "--json").json()["id"]
    assert wait_until(lambda: any("snapshot" in e for e in _drill_events(kw)), 60, 0.5)
    inst = kw.ok("status", "--json").json()["apps"][0]["instances"][0]
    assert inst["drill"] is not None and inst["drill"]["ok"] is True

    copy = kw.home / "objects" / "instances" / HOST / "snapshots" / f"{snap}.db"
    copy.write_bytes(b"\xff" * copy.stat().st_size)  # the stored copy rots
    since = time.monotonic()

    def failed() -> bool:
        inst = kw.ok("status", "--json").json()["apps"][0]["instances"][0]
        return inst["drill"] is not None and inst["drill"]["ok"] is False

    assert wait_until(failed, 60, 0.5)
    print(f"a rotten snapshot found by the schedule in {time.monotonic() - since:.1f} s")
    doctor = kw.run("doctor", "--json").json()["checks"]
    assert any(c["check"] == "restore drills" and not c["ok"] for c in doctor)
