"""`--dry-run` through the real CLI: each operation prints the plan the runner would
run, as lines or as --json, and nothing is journaled, stopped or started (a run's
arguments never leave the CLI: only its program's name is planned)."""

from __future__ import annotations

import pytest

from tests.e2e.harness import EXAMPLE, Keelway

pytestmark = pytest.mark.slow

HOST = "one.test"


def _ops(kw: Keelway) -> list[dict[str, object]]:
    return kw.ok("ops", "hello", "--json").json()["operations"]  # type: ignore[no-any-return]


def test_every_dry_run_prints_the_runners_plan_and_changes_nothing(kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST)
    kw.ok("config", "hello", "set", "A=1")
    before, pids = _ops(kw), kw.app_pids()

    park = kw.ok("park", HOST, "--dry-run").out.splitlines()
    assert park[0] == f"park {HOST}:"
    assert park[1].startswith(f"  1. park: {HOST} PARKED and its route parked")
    assert any(": stop web generation" in line for line in park)
    stop = kw.ok("stop", "hello", "--dry-run", "--json").json()
    assert stop["plans"][0]["steps"][0]["step"] == "out-of-service"
    assert "nothing to do (running already)" in kw.ok("wake", HOST, "--dry-run").out
    assert kw.ok("start", "hello", "--dry-run").out.startswith(f"start {HOST}:")
    restart = kw.ok("restart", "hello", "--dry-run").out
    assert "attempt v2" in restart and "on failure: respawn what it replaced" in restart
    rollback = kw.ok("rollback", "hello", "--dry-run", "--json").json()
    assert rollback["dry_run"] is True
    assert rollback["plans"][0]["op"] == "rollback"
    assert "attempt v3" in kw.ok("config", "hello", "set", "B=2", "--dry-run").out
    run = kw.ok("run", "hello", "--dry-run", "--", "python3", "-c", "s3cr3t").out
    assert f"run {HOST}:" in run and "spawn python3 in v2" in run and "s3cr3t" not in run

    assert _ops(kw) == before and kw.app_pids() == pids
    assert kw.get(HOST)[0] == 200


def test_a_dry_run_refuses_what_the_run_would_refuse(kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", HOST)
    kw.ok("fence", HOST)
    refused = kw.run("start", "hello", "--dry-run")
    assert refused.code != 0 and "it cannot start" in refused.err
    assert kw.run("park", "nosuch.test", "--dry-run").code != 0
