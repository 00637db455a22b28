"""The one runner, on the parts wired as the daemon wires them: what it journals, in
what order, and what it leaves when a plan has nothing to do, a step fails, or an
effect raises."""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from keelway.deploy.errors import Fenced
from keelway.deploy.operation import Bound, Ended, Plan, PlannedStep, Ran, Runner, Spec
from keelway.deploy.outcome import Outcome, Result
from keelway.deploy.steps import Done, Failed, Steps
from keelway.durable import sync_is_deferred
from keelway.journal import OpKind, StepKind
from keelway.store import SqliteStore, Store
from keelway.store.lifecycle import OpState, StepState
from keelway.store.records import Operation
from tests.deploy.wiring import wired


@dataclass(frozen=True)
class Ask:
    host: str
    outcomes: tuple[str, ...] = ("done",)
    nothing: str | None = None


@dataclass
class Seen:
    """The parts the test effects use: the store (a dynamic step journals its own
    steps) and what ran, in order."""

    store: Store
    ran: list[str] = field(default_factory=list)


def _plan(store: object, ask: Ask) -> Plan:
    if ask.nothing is not None:
        return Plan(OpKind.RESTART, "shop", ask.host, nothing=ask.nothing)
    return Plan(OpKind.RESTART, "shop", ask.host, tuple(
        PlannedStep(StepKind.STOP, f"step {n}", outcome, journals_own=outcome == "own")
        for n, outcome in enumerate(ask.outcomes)))


def _effect(seen: Seen, _ask: Ask, step: PlannedStep) -> Bound:
    async def effect(op: Operation) -> Done | Failed | Ended:
        seen.ran.append(step.describe)
        match step.effect:
            case "done":
                return Done()
            case "failed":
                return Failed("no room")
            case "ended":
                return Ended(Result(Outcome.DONE, "deferred"))
            case "own":
                await Steps(seen.store, op.id).run(StepKind.SPAWN, _done)
                return Done()
            case _:
                raise RuntimeError("boom")

    return effect


async def _done() -> Done:
    return Done()


TEST: Spec[Ask, Seen] = Spec(OpKind.RESTART, _plan, {
    name: _effect for name in ("done", "failed", "ended", "own", "raises")},
    fence_verb="restart")


def _setup(tmp_path: Path) -> tuple[Runner, Store]:
    deploy, store, _home = wired(tmp_path)
    store.apps.ensure_app("shop")
    store.instances.ensure_instance("a.test", "shop")
    return deploy.runner, store


def test_a_plan_runs_its_steps_in_order_each_journaled_then_the_op_succeeds(
        tmp_path: Path) -> None:
    runner, store = _setup(tmp_path)
    seen = Seen(store)
    ran = asyncio.run(runner.run(TEST, seen, Ask("a.test", ("done", "own", "done"))))
    assert ran.done and seen.ran == ["step 0", "step 1", "step 2"]
    op = store.ops.latest_operation("a.test")
    assert op is not None and op.state is OpState.SUCCEEDED
    # The dynamic step wrote its own step, and none for itself.
    assert [s.kind for s in op.steps] == [StepKind.STOP, StepKind.SPAWN, StepKind.STOP]
    assert not runner.locks.live_ops


def test_a_failed_step_stops_the_plan_and_fails_the_op_with_its_reason(
        tmp_path: Path) -> None:
    runner, store = _setup(tmp_path)
    seen = Seen(store)
    ran = asyncio.run(runner.run(TEST, seen, Ask("a.test", ("done", "failed", "done"))))
    assert ran.result == Result(Outcome.FAILED, "no room")
    assert seen.ran == ["step 0", "step 1"]
    op = store.ops.latest_operation("a.test")
    assert op is not None and op.state is OpState.FAILED and op.error == "no room"
    assert [s.state for s in op.steps] == [StepState.SUCCEEDED, StepState.FAILED]


def test_an_ended_step_ends_the_plan_with_its_result(tmp_path: Path) -> None:
    runner, store = _setup(tmp_path)
    seen = Seen(store)
    ran = asyncio.run(runner.run(TEST, seen, Ask("a.test", ("ended", "done"))))
    assert ran.result == Result(Outcome.DONE, "deferred") and seen.ran == ["step 0"]


def test_a_plan_with_nothing_to_do_journals_nothing(tmp_path: Path) -> None:
    runner, store = _setup(tmp_path)
    ran = asyncio.run(runner.run(TEST, Seen(store), Ask("a.test", nothing="running already")))
    assert ran.result is None and ran.done
    assert store.ops.latest_operation("a.test") is None


def test_an_effect_that_raises_is_journaled_as_a_fault_and_converged_at_once(
        tmp_path: Path) -> None:
    runner, store = _setup(tmp_path)
    ran = asyncio.run(runner.run(TEST, Seen(store), Ask("a.test", ("raises",))))
    assert ran.result is not None and ran.result.outcome is Outcome.FAILED
    assert "RuntimeError: boom" in (ran.result.reason or "")
    op = store.ops.latest_operation("a.test")
    assert op is not None and op.state is OpState.FAILED
    assert StepKind.FAULT in [s.kind for s in op.steps]


def test_a_fence_refuses_a_kind_that_names_a_verb_before_anything_is_written(
        tmp_path: Path) -> None:
    runner, store = _setup(tmp_path)
    store.instances.fence("a.test", None)
    with pytest.raises(Fenced, match="it cannot restart"):
        asyncio.run(runner.run(TEST, Seen(store), Ask("a.test")))
    with pytest.raises(Fenced):
        runner.dry_run(TEST, Ask("a.test"))
    assert store.ops.latest_operation("a.test") is None


def test_a_dry_run_is_the_plan_the_runner_would_run_and_writes_nothing(
        tmp_path: Path) -> None:
    runner, store = _setup(tmp_path)
    plan = runner.dry_run(TEST, Ask("a.test", ("done", "failed")))
    assert plan.lines() == ["restart a.test:", "  1. stop: step 0", "  2. stop: step 1"]
    assert store.ops.latest_operation("a.test") is None


def test_a_prelude_runs_before_the_operation_begins_and_after_sees_how_it_ended(
        tmp_path: Path) -> None:
    runner, store = _setup(tmp_path)
    seen = Seen(store)

    async def prelude(parts: Seen, _ask: Ask) -> None:
        parts.ran.append(f"prelude, ops so far: {store.ops.latest_operation('a.test')}")

    async def after(parts: Seen, _ask: Ask, ran: Ran) -> None:
        assert ran.result is not None
        parts.ran.append(f"after: {ran.result.outcome.value}")

    spec = dataclasses.replace(TEST, prelude=prelude, after=after)
    asyncio.run(runner.run(spec, seen, Ask("a.test", ("done",))))
    assert seen.ran == ["prelude, ops so far: None", "step 0", "after: done"]


def test_an_operation_of_no_instance_takes_the_empty_names_lock_and_converges_nothing(
        tmp_path: Path) -> None:
    runner, store = _setup(tmp_path)
    seen = Seen(store)
    ran = asyncio.run(runner.run(TEST, seen, Ask("", nothing="an app's own")))
    assert ran.result is None and not runner.locks.instance("").locked()


def test_an_operation_that_ends_with_the_box_is_made_durable_once_before_it_returns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """keelway/durable.py: a restart's writes (processes) commit without an fsync of
    their own, and the store is synced once, after its end, before its caller hears."""
    runner, store = _setup(tmp_path)
    said: list[tuple[str, bool]] = []
    for name in ("begin_operation", "begin_step", "finish_step", "finish_operation"):
        real = getattr(store.ops, name)

        def spy(*args: object, _real: Any = real, _name: str = name, **kw: object) -> Any:
            said.append((_name, sync_is_deferred()))
            return _real(*args, **kw)

        monkeypatch.setattr(store.ops, name, spy)
    real_sync = store.sync

    async def sync() -> None:
        said.append(("sync", sync_is_deferred()))
        await real_sync()

    monkeypatch.setattr(store, "sync", sync)
    assert asyncio.run(runner.run(TEST, Seen(store), Ask("a.test", ("done", "own")))).done
    assert said[0][0] == "begin_operation" and said[-2][0] == "finish_operation"
    assert all(deferred for _, deferred in said[:-1]) and said[-1] == ("sync", False)
    assert isinstance(store, SqliteStore) and store.db.synced == store.db.committed
