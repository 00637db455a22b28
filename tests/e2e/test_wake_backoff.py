"""A wake that fails is a crash for the backoff, through the real CLI, daemon and router:
a broken release behind a parked route is retried 0.5, 1, 2 s, then a minute later (not
at every request or pass), its requests get 503 + Retry-After at once, `status` says
when the next retry is, and a wake by hand once it is fixed serves again (SPEC §4
Runtime, Activator)."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from keelway.runtime.backoff import QUICK_DELAYS_S, SLOW_DELAYS_S
from tests.deploy.apps import hello
from tests.e2e.harness import Keelway, wait_until

pytestmark = pytest.mark.slow

HOST = "one.test"
# v1 boots unless its data says it was migrated by v2 (the marker v2's release command
# leaves); v2 exits at boot. So once v2 ran, neither it nor its fallback can boot.
MIGRATED = "$KEELWAY_DATA_DIR/migrated"
GUARDED_WEB = ("python3 -c \"import os, sys, runpy; "
               "os.path.exists(os.path.join(os.environ['KEELWAY_DATA_DIR'], 'migrated')) "
               "and sys.exit(3); runpy.run_path('web.py', run_name='__main__')\"")
EXITS_AT_BOOT = "python3 -c 'import sys; sys.exit(3)'"


def _instance(kw: Keelway) -> dict[str, Any]:
    return kw.ok("status", "--json").json()["apps"][0]["instances"][0]  # type: ignore[no-any-return]


def _web_spawns(kw: Keelway) -> int:
    ops = kw.ok("ops", "hello", "--json").json()["operations"]
    return sum(1 for op in ops for step in op["steps"] if step["name"] == "spawn web")


def _slow_retry(kw: Keelway) -> dict[str, Any] | None:
    """The web's pending retry once the quick tries are spent (a minute away)."""
    crashed = [c for c in _instance(kw)["crashed"] if c["service"] == "web"]
    if crashed and crashed[0]["retry_at"] - time.time() > 30:
        return crashed[0]  # type: ignore[no-any-return]
    return None


class Requests:
    """Requests to HOST, one after another, from a thread, each timed."""

    def __init__(self, kw: Keelway) -> None:
        self.kw = kw
        self.answers: list[tuple[int, str | None, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            status, _body, headers = self.kw.get(HOST, "/health", timeout_s=40)
            self.answers.append((status, headers.get("Retry-After"),
                                 time.monotonic() - began))
            time.sleep(0.1)

    def __enter__(self) -> Requests:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


def test_a_broken_release_behind_a_parked_route_is_retried_by_the_backoff_not_by_requests(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "a", web_cmd=GUARDED_WEB,
                                       worker_mode="overlap")), "--host", HOST)
    kw.ok("park", HOST)
    before = _web_spawns(kw)
    deployed = kw.ok("deploy", "hello", str(hello(
        tmp_path, "bad", web_cmd=EXITS_AT_BOOT, worker_mode="overlap",
        release_cmd=f"touch {MIGRATED}")), "--json").json()
    assert [i["outcome"] for i in deployed["instances"]] == ["deferred"]

    began = time.monotonic()
    with Requests(kw) as requests:
        # The first request wakes it; the wake fails, then the three quick retries.
        assert wait_until(lambda: _slow_retry(kw) is not None, 40, 0.2), _instance(kw)
        spent = _web_spawns(kw)
        time.sleep(8)  # past a pass or two of the periodic reconciler (every 5 s)
        assert _web_spawns(kw) == spent, "something respawned the web inside its backoff"
        window_s = time.monotonic() - began
    # The wake ran v2 and fell back to v1 (2 spawns); then one start per delay of the
    # backoff that fits the window.
    delays = itertools.accumulate(QUICK_DELAYS_S + SLOW_DELAYS_S)
    bound = 2 + sum(1 for at in delays if at < window_s)
    assert _web_spawns(kw) - before <= bound
    ops = kw.ok("ops", "hello", "--json").json()["operations"]
    assert "recover" not in [op["kind"] for op in ops], "a pass respawned it, not the backoff"

    assert requests.answers and all(status == 503 for status, _, _ in requests.answers)
    assert all(retry is not None for _, retry, _ in requests.answers)
    # Only requests that came while the wake itself ran waited (for it): none was held
    # for the 30 s hold bound, and every later one was answered at once.
    assert max(took for _, _, took in requests.answers) < 10
    assert sorted(took for _, _, took in requests.answers)[len(requests.answers) // 2] < 0.5
    code, _, headers = kw.get(HOST, "/health")
    assert code == 503 and 30 < int(headers["Retry-After"]) <= 60

    inst = _instance(kw)
    assert inst["state"] == "crashed" and inst["crashed"][0]["failures"] >= 4
    said = kw.ok("status", "hello").out
    assert f"{HOST} web: crashed, next retry at" in said

    # A wake by hand tries now; still broken, it fails, saying when the next retry is.
    failed = kw.run("wake", HOST)
    assert failed.code != 0 and "next at" in failed.err and "Traceback" not in failed.err
    assert _slow_retry(kw) is not None

    # Fixed (the data put back), a wake by hand serves again and the crash is over.
    (kw.home / "data" / HOST / "migrated").unlink()
    woken = kw.ok("wake", HOST, "--json").json()
    assert woken["woke"] is True
    assert kw.get(HOST, "/health")[0] == 200
    assert _instance(kw)["crashed"] == []
    assert f"{HOST} web: crashed" not in kw.ok("status", "hello").out


def test_a_parked_instance_that_cannot_boot_answers_503_at_once_not_after_the_hold_bound(
        kw: Keelway, tmp_path: Path) -> None:
    """And parked again inside its backoff, its requests do not wake it before the
    retry is due."""
    kw.up()
    kw.ok("deploy", "hello", str(hello(tmp_path, "a", web_cmd=GUARDED_WEB)), "--host", HOST)
    kw.ok("park", HOST)
    (kw.home / "data" / HOST / "migrated").touch()  # its data no longer lets it boot
    answers = []
    for _ in range(5):
        began = time.monotonic()
        # Held to the 30 s bound, a request would time out here.
        status, _body, headers = kw.get(HOST, "/health", timeout_s=15)
        answers.append((status, "Retry-After" in headers, time.monotonic() - began))
    assert [(status, retry) for status, retry, _ in answers] == [(503, True)] * 5
    assert answers[0][2] < 10, "the wake's requests were held to the hold bound"
    assert all(took < 0.5 for _, _, took in answers[1:])
    crashed = _instance(kw)["crashed"]
    assert [c["service"] for c in crashed] == ["web"] and crashed[0]["failures"] >= 1

    assert wait_until(lambda: _slow_retry(kw) is not None, 20, 0.2), _instance(kw)
    kw.ok("park", HOST)
    spawned = _web_spawns(kw)
    for _ in range(5):
        began = time.monotonic()
        status, _body, headers = kw.get(HOST, "/health", timeout_s=15)
        assert (status, "Retry-After" in headers) == (503, True)
        assert time.monotonic() - began < 0.5
        time.sleep(0.3)
    assert _web_spawns(kw) == spawned, "a request woke it inside its backoff"
    inst = _instance(kw)
    # Parked, and inside its backoff: a request does not wake it, so it shows crashed.
    assert (inst["state"], inst["desired"]) == ("crashed", "parked")
    assert [c["service"] for c in inst["crashed"]] == ["web"]
    assert f"{HOST} web: crashed, next retry at" in kw.ok("status", "hello").out
