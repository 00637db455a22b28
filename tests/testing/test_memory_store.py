"""The in-memory store against the SQLite one, write for write: the same random
sequence of writes (valid ones, stale ones, ones naming what does not exist) goes to
both, and after each every read of the protocol answers the same and every error is
of the same kind. The contract suite (tests/store/contract) pins each method's
promise; this pins what no single test names: orders of ties, version bumps of rows
an intent rewrites, ids after a rolled-back write, how errors compose in an intent.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from keelway.journal import Cause, Inhibition, OpKind, StepKind
from keelway.store import SqliteStore, Store
from keelway.store.identities import IdSpace
from keelway.store.imports import SeedState
from keelway.store.lifecycle import (
    GenState,
    InstanceState,
    OpState,
    Removal,
    RequestState,
    RouteState,
    StepState,
)
from keelway.store.records import CrashRetry, Generation, Operation, ReleaseDraft
from keelway.testing.clock import FakeClock
from keelway.testing.dump import dump
from keelway.testing.memory_store import MemoryStore

APPS = ["blog", "shop"]
HOSTS = ["a.test", "b.test", "www.a.test", "c.test"]
DIGESTS = ["d" * 64, "e" * 64]
SEEDS = ["seed-1", "seed-2"]
MARK = Inhibition.RETIREMENT_PENDING

Write = Callable[[Store, random.Random], object]


def _pick(r: random.Random, choices: list[Any]) -> Any:
    return choices[r.randrange(len(choices))]


def _gen(s: Store, r: random.Random) -> Generation | None:
    found = [g for i in range(1, 12) if (g := s.generations.get_generation(i)) is not None]
    return _pick(r, found) if found else None


def _op(s: Store, r: random.Random) -> Operation | None:
    found = [o for i in range(1, 10) if (o := s.ops.get_operation(i)) is not None]
    return _pick(r, found) if found else None


def _config(r: random.Random) -> dict[str, str]:
    return {_pick(r, ["Z", "A", "M"]): str(r.randrange(3)), "B": "2"}


WRITES: list[Write] = [
    lambda s, r: s.apps.ensure_app(_pick(r, APPS)),
    lambda s, r: s.apps.create_app(_pick(r, APPS)),
    lambda s, r: s.apps.set_app_config(s.apps.get_app(_pick(r, APPS)), _config(r)),
    lambda s, r: s.apps.mark_destroying(_pick(r, APPS), _pick(r, list(Removal))),
    lambda s, r: s.apps.forget_app(_pick(r, APPS)),
    lambda s, r: s.instances.ensure_instance(_pick(r, HOSTS), _pick(r, APPS)),
    lambda s, r: s.instances.add_instances(_pick(r, APPS), r.sample(HOSTS, r.randrange(1, 3)),
                                           _config(r), parked=r.random() < .5),
    lambda s, r: s.instances.set_instance_state(s.instances.get_instance(_pick(r, HOSTS)),
                                                _pick(r, list(InstanceState)),
                                                _pick(r, [None, "why"])),
    lambda s, r: s.instances.set_instance_config(s.instances.get_instance(_pick(r, HOSTS)),
                                                 _config(r)),
    lambda s, r: s.instances.bump_schedule(_pick(r, HOSTS)),
    lambda s, r: s.instances.finish_adding(r.sample(HOSTS, 2)),
    lambda s, r: s.instances.mark_removing(_pick(r, HOSTS), _pick(r, list(Removal))),
    lambda s, r: s.instances.withdraw_instance(_pick(r, HOSTS), _pick(r, list(Removal))),
    lambda s, r: s.instances.forget_instance(_pick(r, HOSTS)),
    lambda s, r: s.instances.add_aliases(_pick(r, HOSTS), [_pick(r, HOSTS)]),
    lambda s, r: s.instances.remove_aliases(_pick(r, HOSTS), [_pick(r, HOSTS)]),
    lambda s, r: s.instances.identity_number(_pick(r, list(IdSpace)),
                                             _pick(r, ["x", "y", "instance:a.test"])),
    lambda s, r: s.instances.fence(_pick(r, HOSTS), "why"),
    lambda s, r: s.instances.unfence(_pick(r, HOSTS), r.randrange(1, 4)),
    lambda s, r: s.builds.record_build(_pick(r, APPS), _pick(r, DIGESTS), "/b",
                                       _pick(r, [None, {"kind": "git", "ref": "x"}])),
    lambda s, r: s.builds.mark_build_good(_pick(r, APPS), _pick(r, DIGESTS)),
    lambda s, r: s.builds.forget_build(_pick(r, APPS), _pick(r, DIGESTS)),
    lambda s, r: s.builds.create_release(_pick(r, APPS), _pick(r, DIGESTS), _config(r), "d"),
    lambda s, r: s.ops.begin_operation(_pick(r, APPS), _pick(r, HOSTS),
                                       _pick(r, [OpKind.DEPLOY, OpKind.RUN, OpKind.RESTART]),
                                       "me", key=_pick(r, [None, "k1", "k2"])),
    lambda s, r: s.ops.finish_operation(_op(s, r), _pick(r, [OpState.SUCCEEDED, OpState.FAILED]),
                                        error="e", warnings=_pick(r, [None, ["w"]])),
    lambda s, r: s.ops.add_warnings(_op(s, r), ["w1", "w2"]),
    lambda s, r: s.ops.begin_step(r.randrange(1, 5), _pick(r, [StepKind.SPAWN, StepKind.STOP]),
                                  service="web", after_gen=r.randrange(1, 4)),
    lambda s, r: s.ops.finish_step(r.randrange(1, 5), r.randrange(1, 3),
                                   _pick(r, [StepState.SUCCEEDED, StepState.FAILED]),
                                   error=_pick(r, [None, "x"]), detail=_pick(r, [None, "d"])),
    lambda s, r: s.ops.converge_step(r.randrange(1, 5), r.randrange(1, 3), "kept",
                                     fail_with=_pick(r, [None, "bad"])),
    lambda s, r: s.ops.begin_request(_pick(r, ["k1", "k2"]), "blog", "deploy", "x", "me"),
    lambda s, r: s.ops.finish_request(_pick(r, ["k1", "k2"]),
                                      _pick(r, [RequestState.SUCCEEDED, RequestState.FAILED]),
                                      "done"),
    lambda s, r: s.ops.add_event("kind", "said", app=_pick(r, [None, *APPS]),
                                 instance=_pick(r, [None, *HOSTS])),
    lambda s, r: s.plan_generation(
        app=_pick(r, APPS), instance=_pick(r, HOSTS), service=_pick(r, ["web", "worker"]),
        release=r.randrange(1, 3), build_digest=_pick(r, DIGESTS),
        op_id=_pick(r, [None, 1, 2, 3]), port=_pick(r, [None, 4000, 4001, 4002])),
    lambda s, r: s.generations.set_generation_state(_gen(s, r), _pick(r, list(GenState))),
    lambda s, r: s.generations.set_active(
        _pick(r, HOSTS), _pick(r, ["web", "worker"]), r.randrange(1, 8),
        expected=_pick(r, [None, s.generations.get_active(_pick(r, HOSTS), "web")])),
    lambda s, r: s.generations.add_inhibition(r.randrange(1, 8), _pick(r, list(Inhibition)),
                                              _pick(r, [None, 1])),
    lambda s, r: s.generations.remove_inhibition(r.randrange(1, 8), _pick(r, list(Inhibition))),
    lambda s, r: s.record_spawn(_gen(s, r), pid=r.randrange(100, 200), start_ticks=5),
    lambda s, r: s.record_gone(r.randrange(1, 8), _pick(r, [None, 1])),
    lambda s, r: s.local.add_presence(r.randrange(1, 12), _pick(r, [None, 4000, 4003])),
    lambda s, r: s.local.record_process(r.randrange(1, 12), r.randrange(100, 200), 5),
    lambda s, r: s.local.free_port(r.randrange(1, 12)),
    lambda s, r: s.routes.set_route(
        _pick(r, HOSTS), _pick(r, HOSTS), _pick(r, list(RouteState)), _pick(r, [None, 4000]),
        _pick(r, [None, 1]),
        expected=s.routes.get_route(_pick(r, HOSTS)) if r.random() < .7 else None),
    lambda s, r: s.routes.next_route_table_version(r.randrange(0, 5)),
    lambda s, r: s.imports.begin_import(_pick(r, HOSTS), _pick(r, SEEDS), env_before={"K": None},
                                        sha256="ab"),
    lambda s, r: s.imports.fence_import(_pick(r, HOSTS), _pick(r, SEEDS)),
    lambda s, r: s.imports.open_import_gate(_pick(r, HOSTS), _pick(r, SEEDS)),
    lambda s, r: s.imports.close_import_gate(_pick(r, HOSTS), _pick(r, SEEDS)),
    lambda s, r: s.imports.restore_import_route(_pick(r, HOSTS), _pick(r, SEEDS)),
    lambda s, r: s.imports.delete_import(_pick(r, HOSTS), _pick(r, SEEDS)),
    lambda s, r: s.imports.cas_seed_record(
        f"{_pick(r, APPS)}/{_pick(r, HOSTS)}", _pick(r, SEEDS),
        frozenset({SeedState.ABORTED, SeedState.IMPORTING}), SeedState.ROLLED_BACK),
    lambda s, r: s.install(
        _pick(r, HOSTS), schedule_rev=r.randrange(0, 3),
        candidates={k: g for k in ("web", "worker") if r.random() < .6
                    and (g := _gen(s, r)) is not None},
        retiring=[r.randrange(1, 9)] if r.random() < .5 else [], retire_reason=MARK, op_id=1,
        release=_pick(r, [None, ReleaseDraft(_pick(r, APPS), DIGESTS[0], {"N": "1"}, "d")])),
    lambda s, r: s.defer_release(
        _pick(r, HOSTS), schedule_rev=r.randrange(0, 3), number=r.randrange(1, 4),
        cause=_pick(r, list(Cause)),
        release=_pick(r, [None, ReleaseDraft(_pick(r, APPS), DIGESTS[1], {"N": "2"}, "c")])),
    lambda s, r: s.clear_pending(_pick(r, HOSTS), r.randrange(1, 4)),
    lambda s, r: s.activate_and_route(_pick(r, HOSTS),
                                      {_pick(r, ["web", "worker"]): r.randrange(1, 8)}),
    lambda s, r: s.fall_back(
        _pick(r, HOSTS), active={"web": r.randrange(1, 8)} if r.random() < .5 else {},
        unmark=[r.randrange(1, 8)], unmark_reason=MARK,
        web=_gen(s, r) if r.random() < .6 else None),
    lambda s, r: s.take_out_of_service(_pick(r, HOSTS), _pick(r, list(InstanceState)),
                                       _pick(r, [None, "why"])),
    lambda s, r: s.park(s.instances.get_instance(_pick(r, HOSTS))),
    lambda s, r: s.record_crash(
        CrashRetry(_pick(r, HOSTS), _pick(r, ["web", "worker"]), r.randrange(1, 8),
                   r.randrange(1, 4), 5.0, 9.0), gate_waiting=r.random() < .5),
]


def _reads(s: Store) -> dict[str, object]:
    """Every read of the protocol, over the names the writes use."""
    each = {h: (s.instances.get_instance(h), s.instances.claim(h), s.instances.get_fence(h),
                s.instances.fenced(h), s.instances.list_aliases(h), s.ops.latest_operation(h),
                s.ops.latest_operation_of(h, [OpKind.RUN, OpKind.DEPLOY]),
                s.ops.find_operation_by_key(h, "k1"), s.ops.list_operations("blog", h, 2),
                s.generations.recent_generations(h, 3), s.generations.generation_ids(h),
                s.generations.list_active(h), s.generations.get_crash_retry(h, "web"),
                s.generations.pending_retries(h), s.generations.live_generations(h),
                s.routes.get_route(h), s.imports.get_import(h), s.imports.row_at(h),
                s.imports.seed_record(h)) for h in HOSTS}
    per_app = {a: (s.apps.get_app(a), s.instances.list_instances(a), s.builds.list_builds(a),
                   s.builds.list_releases(a), s.builds.next_release_number(a),
                   s.builds.get_release(a, 1), s.ops.list_operations(a),
                   s.ops.release_attempts(a, [OpKind.DEPLOY, OpKind.RESTART]))
               for a in APPS}
    return {
        "dump": dump(s), "each": each, "per_app": per_app,
        "apps": (s.apps.list_apps(), s.apps.destroying_apps()),
        "instances": (s.instances.list_instances(), s.instances.adding_instances(),
                      s.instances.removing_instances(), s.instances.list_aliases(),
                      s.instances.fenced_instances(), s.instances.instance_views()),
        "builds": (s.builds.list_builds(), s.builds.pinned_builds(),
                   s.builds.pinned_builds({"blog": 1})),
        "ops": ([s.ops.get_operation(i) for i in range(1, 10)],
                [s.ops.steps(i) for i in range(1, 10)], s.ops.unfinished_runs(),
                s.ops.unfinished_operations(), s.ops.running_requests(),
                [s.ops.get_request(k) for k in ("k1", "k2")], s.ops.list_events(),
                s.ops.list_events("blog", 2, 1)),
        "generations": (s.generations.live_generations(), s.generations.list_active(),
                        s.generations.active_generations(), s.generations.pending_retries(),
                        [s.generations.get_generation(i) for i in range(1, 12)],
                        [s.generations.inhibitions(i) for i in range(1, 12)],
                        [s.generations.get_active(h, "worker") for h in HOSTS]),
        "local": (s.local.claimed_ports(), s.local.presences(range(1, 12))),
        "routes": s.routes.list_routes(),
        "imports": s.imports.list_imports(),
    }


def _outcome(write: Write, store: Store, r: random.Random) -> tuple[str, object]:
    try:
        return "returned", write(store, r)
    except Exception as exc:  # what each backend raised is what is compared
        return "raised", type(exc)


def _replay(tmp_path: Path, seed: int, writes: int) -> None:
    clock = FakeClock()
    sqlite: Store = SqliteStore(tmp_path / "keelway.db", clock)
    memory: Store = MemoryStore(clock)
    r = random.Random(seed)
    try:
        for n in range(writes):
            write = WRITES[r.randrange(len(WRITES))]
            state = r.getstate()
            outcomes = []
            for store in (sqlite, memory):
                r.setstate(state)  # the same arguments for both
                outcomes.append(_outcome(write, store, r))
            assert outcomes[0] == outcomes[1], f"write {n} (#{WRITES.index(write)})"
            clock.advance(1)
            assert _reads(sqlite) == _reads(memory), f"after write {n} (#{WRITES.index(write)})"
    finally:
        sqlite.close()


def test_the_memory_store_answers_every_read_as_sqlite_does_after_the_same_writes(
        tmp_path: Path) -> None:
    _replay(tmp_path, seed=0, writes=100)


@pytest.mark.slow
# Ten histories keep CI in its budget (each write is a real SQLite commit); a bigger
# sweep, run by hand before a change to either backend: KEELWAY_HISTORIES=40.
@pytest.mark.parametrize("seed", range(1, 1 + int(os.environ.get("KEELWAY_HISTORIES", "10"))))
def test_the_memory_store_answers_as_sqlite_does_over_long_random_histories(
        tmp_path: Path, seed: int) -> None:
    _replay(tmp_path, seed, writes=250)


@pytest.mark.parametrize("backend", ["sqlite", "memory"])
def test_a_record_read_is_the_callers_own_and_changing_it_changes_nothing_stored(
        tmp_path: Path, backend: str) -> None:
    clock = FakeClock()
    store: Store = (SqliteStore(tmp_path / "keelway.db", clock) if backend == "sqlite"
                    else MemoryStore(clock))
    try:
        app = store.apps.set_app_config(store.apps.ensure_app("blog"), {"A": "1"})
        store.instances.add_instances("blog", ["a.test"], {"B": "2"})
        op = store.ops.add_warnings(
            store.ops.begin_operation("blog", "a.test", OpKind.DEPLOY, "me"), ["w"])
        store.ops.begin_step(op.id, StepKind.SPAWN)
        before = (dump(store), store.ops.get_operation(op.id))
        for read in (app, store.apps.get_app("blog"), *store.apps.list_apps()):
            read.config["A"] = "changed"
        for inst in (store.instances.get_instance("a.test"),
                     *store.instances.list_instances()):
            assert inst is not None
            inst.config.clear()
        for read_op in (op, store.ops.get_operation(op.id), store.ops.latest_operation("a.test")):
            assert read_op is not None
            read_op.warnings.append("changed")
            read_op.steps.clear()
        assert (dump(store), store.ops.get_operation(op.id)) == before
    finally:
        store.close()
