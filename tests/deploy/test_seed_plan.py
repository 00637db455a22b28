"""The plans of a seed import and its rollback (keelway/deploy/seeding.py), daemon-less:
the rollback's plan follows its journal's state, and its dry run is that plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from keelway.data.seed import mint_seed_id
from keelway.deploy.seeding import ImportRequest, plan_import, plan_rollback
from keelway.journal import StepKind
from keelway.store import Store
from tests.deploy import records as made

HOST = "one.shop.test"
ROUTE = (StepKind.SEED_FENCE, StepKind.SEED_RETIRE_KEY, StepKind.SEED_REMOVE_DATA,
         StepKind.SEED_RESTORE, StepKind.SEED_UNFENCE)
CLEANUP = (StepKind.SEED_DELETE_COPY, StepKind.SEED_DELETE_REPLICA, StepKind.SEED_FORGET,
           StepKind.SEED_RECORD)


@pytest.fixture
def records(tmp_path: Path) -> Store:
    store = made.fresh(tmp_path)
    made.released(store, "shop", [HOST])
    return store


def _imported(store: Store) -> str:
    seed = mint_seed_id()
    store.begin_import(HOST, seed, env_before={}, sha256="0" * 64)
    store.fence_import(HOST, seed)
    return seed


def test_an_import_stores_journals_fences_stops_what_runs_lays_down_and_opens(
        records: Store, tmp_path: Path) -> None:
    (web,) = made.running(records, "shop", HOST, ["web"])
    plan = plan_import(records, ImportRequest(HOST, "seed.db", tmp_path / "seed" / "db",
                                              replicating=True))
    assert plan.kinds() == (StepKind.SEED_STORE, StepKind.SEED_JOURNAL, StepKind.SEED_FENCE,
                            StepKind.STOP, StepKind.REPLICA_STOP, StepKind.SEED_LAY_DOWN,
                            StepKind.SEED_KEY, StepKind.SEED_OPEN, StepKind.SEED_UNFENCE,
                            StepKind.SPAWN)
    assert plan.steps[3].before_gen == web.id and plan.steps[-1].delegated
    assert plan.steps[0].before == ("seed.store.before",)
    assert plan.steps[4].after == ("seed.sync.after",)


def test_an_import_on_a_box_without_replicas_syncs_no_replica(records: Store,
                                                             tmp_path: Path) -> None:
    plan = plan_import(records, ImportRequest(HOST, "seed.db", tmp_path / "db",
                                              replicating=False))
    assert StepKind.REPLICA_STOP not in plan.kinds() and StepKind.STOP not in plan.kinds()


def test_the_rollback_of_an_import_in_effect_closes_the_gate_first_then_runs_every_step(
        records: Store) -> None:
    seed = _imported(records)
    records.open_import_gate(HOST, seed)
    plan = plan_rollback(records, HOST)
    assert plan.kinds() == (StepKind.SEED_CLOSE, *ROUTE, *CLEANUP)
    # The header's eight numbered steps, one line each.
    assert len(plan.lines()) == 8


def test_a_rollback_under_way_goes_on_from_its_fence_and_stops_what_runs(
        records: Store) -> None:
    seed = _imported(records)
    records.close_import_gate(HOST, seed)
    (web,) = made.running(records, "shop", HOST, ["web"])
    plan = plan_rollback(records, HOST)
    assert plan.kinds() == (StepKind.SEED_FENCE, StepKind.STOP, *ROUTE[1:], *CLEANUP)
    assert plan.steps[1].before_gen == web.id
    assert plan.lines()[0] == f"fence {HOST}; stop web generation {web.id}"


def test_a_rollback_whose_route_is_back_lifts_its_fence_again_before_the_cleanup(
        records: Store) -> None:
    seed = _imported(records)
    records.close_import_gate(HOST, seed)
    records.restore_import_route(HOST, seed)
    assert plan_rollback(records, HOST).kinds() == (StepKind.SEED_UNFENCE, *CLEANUP)


def test_with_no_import_journaled_the_rollback_plans_nothing(records: Store) -> None:
    plan = plan_rollback(records, HOST)
    assert plan.steps == () and plan.refused == "no import is journaled"


def test_every_planned_seed_step_is_between_its_own_failpoints(records: Store,
                                                               tmp_path: Path) -> None:
    seed = _imported(records)
    plans = [plan_rollback(records, HOST),
             plan_import(records, ImportRequest(HOST, "s", tmp_path, replicating=True))]
    del seed
    for step in (s for plan in plans for s in plan.steps if s.kind.startswith("seed-")):
        (before,), (after,) = step.before, step.after
        assert before.startswith("seed.") and before.endswith(".before")
        assert after == before.removesuffix(".before") + ".after"
