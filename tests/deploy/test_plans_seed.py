"""The plans of a seed import and its rollback (keelway/deploy/seeding.py), daemon-less
on the `records` fixture: the rollback's plan follows its journal's state, and its dry
run is that plan."""

from __future__ import annotations

from pathlib import Path

from keelway.data.seed import mint_seed_id
from keelway.deploy.operation import Plan
from keelway.deploy.seeding import (
    ImportRequest,
    RollbackRequest,
    plan_import,
    plan_rollback,
    rollback_lines,
)
from keelway.journal import StepKind
from tests.deploy.conftest import Records

HOST = "one.shop.test"
ROUTE = (StepKind.SEED_FENCE, StepKind.SEED_RETIRE_KEY, StepKind.SEED_REMOVE_DATA,
         StepKind.SEED_RESTORE, StepKind.SEED_UNFENCE)
CLEANUP = (StepKind.SEED_DELETE_COPY, StepKind.SEED_DELETE_REPLICA, StepKind.SEED_FORGET,
           StepKind.SEED_RECORD)


def _kinds(plan: Plan) -> tuple[StepKind, ...]:
    return tuple(step.kind for step in plan.steps)


def _imported(records: Records) -> str:
    records.instance(HOST)
    seed = mint_seed_id()
    records.store.imports.begin_import(HOST, seed, env_before={}, sha256="0" * 64)
    records.store.imports.fence_import(HOST, seed)
    return seed


def _rollback(records: Records) -> Plan:
    return plan_rollback(records.store, RollbackRequest(HOST))


def test_an_import_stores_journals_fences_stops_what_runs_lays_down_and_opens(
        records: Records, tmp_path: Path) -> None:
    records.instance(HOST)
    web = records.running(HOST, "web")
    plan = plan_import(records.store, ImportRequest(HOST, "seed.db", tmp_path / "db",
                                                    replicating=True))
    assert _kinds(plan) == (StepKind.SEED_STORE, StepKind.SEED_JOURNAL, StepKind.SEED_FENCE,
                            StepKind.STOP, StepKind.REPLICA_STOP, StepKind.SEED_LAY_DOWN,
                            StepKind.SEED_KEY, StepKind.SEED_OPEN, StepKind.SEED_UNFENCE)
    assert plan.steps[3].before_gen == web.id
    assert plan.steps[0].before == ("seed.store.before",)
    assert plan.steps[4].after == ("seed.sync.after",)


def test_an_import_on_a_box_without_replicas_syncs_no_replica(records: Records,
                                                             tmp_path: Path) -> None:
    records.instance(HOST)
    plan = plan_import(records.store, ImportRequest(HOST, "seed.db", tmp_path / "db",
                                                    replicating=False))
    assert StepKind.REPLICA_STOP not in _kinds(plan) and StepKind.STOP not in _kinds(plan)


def test_the_rollback_of_an_import_in_effect_closes_the_gate_first_then_runs_every_step(
        records: Records) -> None:
    seed = _imported(records)
    records.store.imports.open_import_gate(HOST, seed)
    plan = _rollback(records)
    assert _kinds(plan) == (StepKind.SEED_CLOSE, *ROUTE, *CLEANUP)
    # The header's eight numbered steps, one dry-run line each.
    assert len(rollback_lines(plan)) == 8


def test_a_rollback_under_way_goes_on_from_its_fence_and_stops_what_runs(
        records: Records) -> None:
    seed = _imported(records)
    records.store.imports.close_import_gate(HOST, seed)
    web = records.running(HOST, "web")
    plan = _rollback(records)
    assert _kinds(plan) == (StepKind.SEED_FENCE, StepKind.STOP, *ROUTE[1:], *CLEANUP)
    assert plan.steps[1].before_gen == web.id
    assert rollback_lines(plan)[0] == f"fence {HOST}; stop web generation {web.id}"


def test_a_rollback_whose_route_is_back_lifts_its_fence_again_before_the_cleanup(
        records: Records) -> None:
    seed = _imported(records)
    records.store.imports.close_import_gate(HOST, seed)
    records.store.imports.restore_import_route(HOST, seed)
    assert _kinds(_rollback(records)) == (StepKind.SEED_UNFENCE, *CLEANUP)


def test_with_no_import_journaled_the_rollback_has_nothing_to_do(records: Records) -> None:
    records.instance(HOST)
    plan = _rollback(records)
    assert plan.steps == () and plan.nothing == "no import is journaled"


def test_every_planned_seed_step_is_between_its_own_failpoints(records: Records,
                                                               tmp_path: Path) -> None:
    _imported(records)
    plans = [_rollback(records),
             plan_import(records.store, ImportRequest(HOST, "s", tmp_path, replicating=True))]
    for step in (s for plan in plans for s in plan.steps if s.kind.startswith("seed-")):
        (before,), (after,) = step.before, step.after
        assert before == f"seed.{step.effect}.before" and after == f"seed.{step.effect}.after"
