"""The step executor (keelway/deploy/steps.py) on a real store file, with no daemon and
no processes: what it writes before, around and after an effect."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest

from keelway import failpoints
from keelway.deploy.steps import Done, Failed, Steps
from keelway.durable import sync_deferred, sync_is_deferred
from keelway.journal import OpKind, StepKind
from keelway.store import SqliteStore
from keelway.store.lifecycle import StepState
from keelway.testing.clock import FakeClock

failpoints.declare("test.step.before", "test.step.after")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "keelway.db", FakeClock())
    yield s
    s.close()


def sync(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Runs an async test on its own event loop (the suite has no asyncio plugin)."""
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))
    return run


def _steps(store: SqliteStore) -> Steps:
    return Steps(store, store.ops.begin_operation("blog", "a.test", OpKind.STOP, owner="t").id)


@sync
async def test_a_done_effect_is_written_pending_first_then_succeeded(
        store: SqliteStore) -> None:
    steps = _steps(store)
    seen: list[StepState] = []

    async def effect() -> Done:
        seen.extend(s.state for s in store.ops.steps(steps.op_id))
        return Done("pid 7")

    assert await steps.run(StepKind.SPAWN, effect, service="web", after_gen=3) is None
    [step] = store.ops.steps(steps.op_id)
    assert seen == [StepState.PENDING]
    assert (step.kind, step.service, step.after_gen, step.state, step.detail) == (
        StepKind.SPAWN, "web", 3, StepState.SUCCEEDED, "pid 7")


@sync
async def test_a_failed_effect_is_a_value_and_its_step_says_why(store: SqliteStore) -> None:
    steps = _steps(store)

    async def effect() -> Failed:
        return Failed("exited before it was ready")

    failed = await steps.run(StepKind.READY, effect, service="web")
    assert failed == Failed("exited before it was ready")
    [step] = store.ops.steps(steps.op_id)
    assert (step.state, step.error) == (StepState.FAILED, "exited before it was ready")


@sync
async def test_an_effect_that_raises_leaves_its_step_pending_for_convergence(
        store: SqliteStore) -> None:
    steps = _steps(store)

    async def effect() -> Done:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        await steps.run(StepKind.STOP, effect, service="web", before_gen=2)
    [step] = store.ops.steps(steps.op_id)
    assert (step.state, step.before_gen) == (StepState.PENDING, 2)


@sync
async def test_failpoints_bracket_the_effect_inside_its_journal_writes(
        store: SqliteStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = tmp_path / "trace"
    monkeypatch.setenv("KEELWAY_FAILPOINTS_TRACE", str(trace))
    steps = _steps(store)
    order: list[str] = []

    async def effect() -> Done:
        order.append("effect: " + trace.read_text().split("\t")[0])
        return Done()

    await steps.run(StepKind.OUT_OF_SERVICE, effect, before=("test.step.before",),
                    after=("test.step.after",))
    assert order == ["effect: test.step.before"]
    assert [line.split("\t")[0] for line in trace.read_text().splitlines()] == [
        "test.step.before", "test.step.after"]
    [step] = store.ops.steps(steps.op_id)
    assert step.state is StepState.SUCCEEDED


@sync
async def test_steps_of_one_operation_are_numbered_in_order(store: SqliteStore) -> None:
    steps = _steps(store)

    async def effect() -> Done:
        return Done()

    for kind in (StepKind.OUT_OF_SERVICE, StepKind.STOP, StepKind.STOP):
        await steps.run(kind, effect)
    assert [(s.seq, s.kind) for s in store.ops.steps(steps.op_id)] == [
        (1, StepKind.OUT_OF_SERVICE), (2, StepKind.STOP), (3, StepKind.STOP)]


@sync
async def test_a_step_whose_effect_outlives_a_reboot_begins_durably_in_any_operation(
        store: SqliteStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A release command (it migrates the app's data) must be neither repeated nor
    forgotten after power loss: its begin is durable even in an operation whose other
    steps wait for its end's fsync (keelway/durable.py)."""
    steps = _steps(store)
    began: dict[StepKind, bool] = {}
    real = store.ops.begin_step

    def spy(op_id: int, kind: StepKind, **kw: Any) -> int:
        began[kind] = sync_is_deferred()
        return real(op_id, kind, **kw)

    monkeypatch.setattr(store.ops, "begin_step", spy)
    with sync_deferred():
        for kind in (StepKind.SPAWN, StepKind.RELEASE_COMMAND, StepKind.SWAP_DB):
            await steps.run(kind, _done)
    assert began == {StepKind.SPAWN: True, StepKind.RELEASE_COMMAND: False,
                     StepKind.SWAP_DB: False}


async def _done() -> Done:
    return Done()
