"""The contract of the `Store` protocol: one suite every store passes, SQLite today and
PostgreSQL when keelway grows past one box, unchanged.

It speaks only the protocol (no SQL, no transactions): each intent's invariant, the
compare-and-swap refusals, idempotency where it is promised, and what an error leaves
behind (nothing changed). A new store adds one factory to `open_store`'s params.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from keelway.journal import Inhibition, OpKind, StepKind
from keelway.store import Conflict, NotFound, SqliteStore, StaleSchedule, Store
from keelway.store.identities import IdSpace
from keelway.store.lifecycle import (
    GenState,
    IllegalTransition,
    InstanceState,
    OpState,
    RequestState,
    RouteState,
    StepState,
)
from keelway.store.records import CrashRetry, Generation, ReleaseDraft
from keelway.testing.clock import FakeClock
from keelway.testing.dump import dump

OpenStore = Callable[[], Store]
DIGEST = "d" * 64
RETIRING = Inhibition.RETIREMENT_PENDING


def _sqlite(path: Path, clock: FakeClock) -> Store:
    return SqliteStore(path / "keelway.db", clock)


@pytest.fixture(params=[_sqlite], ids=["sqlite"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path,
               clock: FakeClock) -> Iterator[OpenStore]:
    """Opens the same durable store again on each call (as a restarted control plane
    does); every store opened is closed at the end."""
    opened: list[Store] = []

    def open_() -> Store:
        opened.append(request.param(tmp_path, clock))
        return opened[-1]

    yield open_
    for store in opened:
        store.close()


@pytest.fixture
def store(open_store: OpenStore) -> Store:
    return open_store()


def _instance(store: Store, host: str = "a.test") -> None:
    store.ensure_app("blog")
    store.ensure_instance(host, "blog")


def _gen(store: Store, service: str = "web", port: int | None = 4000,
         host: str = "a.test") -> Generation:
    _instance(store, host)
    return store.plan_generation(app="blog", instance=host, service=service, release=1,
                                 build_digest=DIGEST, op_id=None, port=port)


def _running(store: Store, **kw: Any) -> Generation:
    gen = _gen(store, **kw)
    return store.record_spawn(gen, pid=100 + gen.id, start_ticks=7)


def _fresh(store: Store, gen: Generation) -> Generation:
    latest = store.get_generation(gen.id)
    assert latest is not None
    return latest


def _everything(store: Store) -> tuple[Any, ...]:
    """What an error must leave as it was."""
    return (dump(store), store.live_generations(), store.list_releases("blog"),
            store.pending_retries(), store.list_apps())


# -- catalog ---------------------------------------------------------------------------

def test_ensuring_an_app_or_an_instance_twice_changes_nothing(store: Store) -> None:
    _instance(store)
    before = dump(store)
    assert store.ensure_app("blog") == store.get_app("blog")
    assert store.ensure_instance("a.test", "blog") == store.get_instance("a.test")
    assert dump(store) == before


def test_a_stale_app_or_instance_loses_its_compare_and_swap_and_writes_nothing(
    store: Store,
) -> None:
    _instance(store)
    app, inst = store.get_app("blog"), store.get_instance("a.test")
    assert app is not None and inst is not None
    store.set_app_config(app, {"A": "1"})
    store.set_instance_state(inst, InstanceState.STOPPED)
    before = dump(store)
    with pytest.raises(Conflict):
        store.set_app_config(app, {"A": "2"})
    with pytest.raises(Conflict):
        store.set_instance_state(inst, InstanceState.DOWN, "why")
    assert dump(store) == before


def test_the_schedule_revision_only_grows_and_names_an_instance(store: Store) -> None:
    _instance(store)
    first = store.bump_schedule("a.test")
    assert store.bump_schedule("a.test") == first + 1
    with pytest.raises(NotFound):
        store.bump_schedule("nobody.test")


def test_recording_a_build_twice_keeps_the_first_record(store: Store) -> None:
    first = store.record_build("blog", DIGEST, "/b/1")
    assert store.record_build("blog", DIGEST, "/b/2") == first
    assert store.list_builds("blog") == [first]


def test_release_numbers_grow_per_app_and_are_listed_newest_first(store: Store) -> None:
    store.ensure_app("blog")
    store.ensure_app("shop")
    assert store.next_release_number("blog") == 1
    store.create_release("blog", DIGEST, {}, "one")
    store.create_release("blog", DIGEST, {"A": "1"}, "two")
    store.create_release("shop", DIGEST, {}, "one")
    assert [r.number for r in store.list_releases("blog")] == [2, 1]
    assert store.next_release_number("blog") == 3
    got = store.get_release("blog", 2)
    assert got is not None and got.config == {"A": "1"}


def test_the_route_table_version_only_grows_even_across_a_reopen(
    open_store: OpenStore,
) -> None:
    store = open_store()
    first = store.next_route_table_version()
    assert store.next_route_table_version(at_least=first + 10) == first + 11
    assert open_store().next_route_table_version() == first + 12


# -- journal ---------------------------------------------------------------------------

def test_a_stale_or_finished_operation_is_refused_and_keeps_its_outcome(store: Store) -> None:
    op = store.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me")
    done = store.finish_operation(op, OpState.FAILED, error="first")
    with pytest.raises(Conflict):
        store.finish_operation(op, OpState.SUCCEEDED)
    with pytest.raises(IllegalTransition):
        store.finish_operation(done, OpState.SUCCEEDED)
    kept = store.get_operation(op.id)
    assert kept is not None and (kept.state, kept.error) == (OpState.FAILED, "first")


def test_warnings_merge_whatever_version_the_caller_read(store: Store) -> None:
    op = store.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me")
    store.add_warnings(op, ["one"])
    merged = store.add_warnings(op, ["one", "two"])  # `op` is stale: a fact still lands
    assert merged.warnings == ["one", "two"]


def test_an_idempotency_key_is_claimed_once_and_its_outcome_recorded_once(
    store: Store,
) -> None:
    claimed, new = store.begin_request("k1", "blog", "deploy", "sha", owner="me")
    again, second = store.begin_request("k1", "blog", "deploy", "other", owner="you")
    assert (new, second) == (True, False)
    assert again == claimed
    assert [r.key for r in store.running_requests()] == ["k1"]
    store.finish_request("k1", RequestState.SUCCEEDED, "first")
    store.finish_request("k1", RequestState.FAILED, "second")
    done = store.get_request("k1")
    assert done is not None and (done.state, done.result) == (RequestState.SUCCEEDED, "first")
    assert store.running_requests() == []


def test_finishing_a_step_that_does_not_exist_is_refused(store: Store) -> None:
    op = store.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me")
    assert [store.begin_step(op.id, StepKind.SPAWN),
            store.begin_step(op.id, StepKind.READY)] == [1, 2]
    with pytest.raises(NotFound):
        store.finish_step(op.id, 3, StepState.SUCCEEDED)
    assert [s.state for s in store.steps(op.id)] == [StepState.PENDING, StepState.PENDING]


# -- generations and ports -------------------------------------------------------------

def test_a_claimed_port_refuses_a_second_generation_and_writes_none(store: Store) -> None:
    _gen(store, port=4000)
    before = _everything(store)
    with pytest.raises(Conflict, match="port 4000"):
        _gen(store, port=4000)
    assert _everything(store) == before


def test_a_stale_generation_loses_its_compare_and_swap_and_writes_nothing(
    store: Store,
) -> None:
    planned = _gen(store)
    running = store.record_spawn(planned, pid=10, start_ticks=20)
    with pytest.raises(Conflict):
        store.record_spawn(planned, pid=11, start_ticks=21)  # a second spawner, too late
    ready = store.set_generation_state(running, GenState.READY)
    with pytest.raises(Conflict):
        store.set_generation_state(running, GenState.STOPPING)  # read before READY
    assert _fresh(store, planned) == ready
    assert (ready.pid, ready.start_ticks, ready.state) == (10, 20, GenState.READY)


def test_an_illegal_move_of_a_fresh_generation_is_refused_and_writes_nothing(
    store: Store,
) -> None:
    gen = _gen(store)
    with pytest.raises(IllegalTransition):
        store.set_generation_state(gen, GenState.READY)  # PLANNED -> READY skips RUNNING
    assert _fresh(store, gen) == gen


def test_a_generation_recorded_gone_frees_its_claim_and_marks_and_stays_gone(
    store: Store,
) -> None:
    gen = _running(store)
    store.add_inhibition(gen.id, RETIRING, None)
    store.add_inhibition(gen.id, RETIRING, None)  # idempotent
    assert store.inhibitions(gen.id) == [RETIRING]
    gone = store.record_gone(gen.id, exit_code=3)
    assert store.claimed_ports() == set() and store.inhibitions(gen.id) == []
    assert store.record_gone(gen.id, exit_code=9) == gone  # a repeat changes nothing
    with pytest.raises(IllegalTransition):
        store.set_generation_state(gone, GenState.RUNNING)
    assert store.live_generations() == []
    _gen(store, port=4000)  # the port is free again


# -- ACTIVE and routes -----------------------------------------------------------------

def test_active_is_written_only_over_the_row_the_caller_read(store: Store) -> None:
    one, two = _gen(store, port=4000), _gen(store, port=4001)
    first = store.set_active("a.test", "web", one.id, expected=None)
    with pytest.raises(Conflict):
        store.set_active("a.test", "web", two.id, expected=None)  # it exists now
    moved = store.set_active("a.test", "web", two.id, expected=first)
    with pytest.raises(Conflict):
        store.set_active("a.test", "web", one.id, expected=first)  # stale
    assert store.get_active("a.test", "web") == moved
    assert moved.generation_id == two.id and moved.version == first.version + 1


def test_a_route_is_written_only_over_the_route_the_caller_read(store: Store) -> None:
    gen = _gen(store)
    first = store.set_route("a.test", "a.test", RouteState.SERVING, 4000, gen.id,
                            expected=None)
    with pytest.raises(Conflict):
        store.set_route("a.test", "a.test", RouteState.GATED, None, None, expected=None)
    gated = store.set_route("a.test", "a.test", RouteState.GATED, None, None, expected=first)
    with pytest.raises(Conflict):
        store.set_route("a.test", "a.test", RouteState.SERVING, 4000, gen.id, expected=first)
    assert store.get_route("a.test") == gated
    assert store.list_routes() == [gated]


# -- crash backoff ---------------------------------------------------------------------

def test_a_crash_gates_the_route_that_served_the_crashed_web_in_the_same_write(
    store: Store, clock: FakeClock,
) -> None:
    web = _running(store)
    store.set_active("a.test", "web", web.id, expected=None)
    store.set_route("a.test", "a.test", RouteState.SERVING, web.port, web.id, expected=None)
    store.record_gone(web.id, 1)
    now = clock.now()
    assert store.record_crash(CrashRetry("a.test", "web", web.id, 1, now, now + 5)) is True
    route = store.get_route("a.test")
    assert route is not None and (route.state, route.port) == (RouteState.GATED, None)
    assert [r.retry_at for r in store.pending_retries("a.test")] == [now + 5]


def test_a_crash_leaves_a_route_that_serves_another_generation_alone(
    store: Store, clock: FakeClock,
) -> None:
    old, new = _running(store, port=4000), _running(store, port=4001)
    route = store.set_route("a.test", "a.test", RouteState.SERVING, 4001, new.id,
                            expected=None)
    now = clock.now()
    assert store.record_crash(CrashRetry("a.test", "web", old.id, 1, now, now + 5)) is False
    worker = _running(store, service="worker", port=None)
    assert store.record_crash(CrashRetry("a.test", "worker", worker.id, 1, now, now)) is False
    assert store.get_route("a.test") == route


@pytest.mark.parametrize("waiting", [RouteState.PARKED, RouteState.HOLDING])
def test_a_failed_start_gates_the_route_its_operation_holds_waiting_and_a_crash_does_not(
    store: Store, clock: FakeClock, waiting: RouteState,
) -> None:
    web, other = _running(store), _running(store, host="b.test", port=4001)
    for gen in (web, other):
        store.set_active(gen.instance, "web", gen.id, expected=None)
        store.set_route(gen.instance, gen.instance, waiting, None, None, expected=None)
        store.record_gone(gen.id, 3)
    now = clock.now()
    # A crash seen by a watcher leaves a waiting route to the operation that holds it.
    assert store.record_crash(CrashRetry("b.test", "web", other.id, 1, now, now + 5)) is False
    assert _state(store, "b.test") is waiting
    # The operation's own start failed: its requests get 503 + Retry-After, not a wait.
    assert store.record_crash(CrashRetry("a.test", "web", web.id, 1, now, now + 5),
                              gate_waiting=True) is True
    assert _state(store, "a.test") is RouteState.GATED
    assert [r.retry_at for r in store.pending_retries("a.test")] == [now + 5]


def _state(store: Store, host: str) -> RouteState:
    route = store.get_route(host)
    assert route is not None
    return route.state


def test_a_crash_backoff_survives_a_reopen_and_goes_stale_once_active_moves_on(
    open_store: OpenStore, clock: FakeClock,
) -> None:
    store = open_store()
    crashed = _running(store)
    store.set_active("a.test", "web", crashed.id, expected=None)
    store.record_gone(crashed.id, 7)
    store.record_crash(CrashRetry("a.test", "web", crashed.id, 4, clock.now(), clock.now()))
    store = open_store()
    assert [r.failures for r in store.pending_retries()] == [4]
    successor = _gen(store, port=4001)
    store.activate_and_route("a.test", {"web": successor.id})
    assert store.pending_retries() == []
    assert store.get_crash_retry("a.test", "web") is not None


# -- the intents an operation is made of -----------------------------------------------

def _install(store: Store, candidates: dict[str, Generation], rev: int,
             retiring: list[int] | None = None,
             release: ReleaseDraft | None = None) -> object:
    return store.install("a.test", schedule_rev=rev, candidates=candidates,
                         retiring=retiring or [], retire_reason=RETIRING, op_id=1,
                         release=release)


def test_an_install_writes_release_active_marks_route_and_running_together(
    store: Store,
) -> None:
    old = _running(store, port=4000)
    store.set_active("a.test", "web", old.id, expected=None)
    inst = store.get_instance("a.test")
    assert inst is not None
    store.set_instance_state(inst, InstanceState.STOPPED)
    web, worker = _running(store, port=4001), _running(store, service="worker", port=None)
    rev = store.bump_schedule("a.test")
    release = _install(store, {"web": web, "worker": worker}, rev, retiring=[old.id],
                       release=ReleaseDraft("blog", DIGEST, {"A": "1"}, "Deploy"))
    assert release == store.get_release("blog", 1)
    assert {a.service: a.generation_id for a in store.list_active("a.test")} == {
        "web": web.id, "worker": worker.id}
    assert store.inhibitions(old.id) == [RETIRING]
    route = store.get_route("a.test")
    assert route is not None and (route.state, route.port, route.generation_id) == (
        RouteState.SERVING, 4001, web.id)
    inst = store.get_instance("a.test")
    app = store.get_app("blog")
    assert inst is not None and inst.state is InstanceState.RUNNING
    assert app is not None and app.config == {"A": "1"}


def test_an_install_by_a_superseded_attempt_writes_nothing(store: Store) -> None:
    web = _running(store)
    rev = store.bump_schedule("a.test")
    store.bump_schedule("a.test")  # a newer intent
    before = _everything(store)
    with pytest.raises(StaleSchedule):
        _install(store, {"web": web}, rev,
                 release=ReleaseDraft("blog", DIGEST, {"A": "1"}, "Deploy"))
    assert _everything(store) == before
    assert isinstance(StaleSchedule("x"), Conflict)


def test_an_install_that_fails_midway_leaves_nothing_behind(store: Store) -> None:
    web = _running(store)
    rev = store.bump_schedule("a.test")
    before = _everything(store)
    # The release and ACTIVE are written before the mark of a generation that does not
    # exist is refused (a NotFound naming it, whatever the backend): none of it stays.
    with pytest.raises(NotFound, match=f"no generation {web.id + 1000}"):
        _install(store, {"web": web}, rev, retiring=[web.id + 1000],
                 release=ReleaseDraft("blog", DIGEST, {}, "Deploy"))
    assert _everything(store) == before


def test_activate_and_route_routes_only_to_an_active_web_that_is_not_gone(
    store: Store,
) -> None:
    worker = _running(store, service="worker", port=None)
    store.activate_and_route("a.test", {"worker": worker.id})
    assert store.get_route("a.test") is None  # no web: no route
    web = _running(store, port=4001)
    store.record_gone(web.id, None)
    store.activate_and_route("a.test", {"web": web.id})
    assert store.get_route("a.test") is None  # the ACTIVE web is gone
    again = _running(store, port=4002)
    store.activate_and_route("a.test", {"web": again.id})
    route = store.get_route("a.test")
    assert route is not None and (route.port, route.generation_id) == (4002, again.id)


def test_a_fall_back_puts_back_active_lifts_the_marks_and_routes_to_the_old_web(
    store: Store,
) -> None:
    old, new = _running(store, port=4000), _running(store, port=4001)
    rev = store.bump_schedule("a.test")
    store.set_active("a.test", "web", old.id, expected=None)
    store.set_route("a.test", "a.test", RouteState.SERVING, 4000, old.id, expected=None)
    _install(store, {"web": new}, rev, retiring=[old.id])
    changed = store.fall_back("a.test", active={"web": old.id}, unmark=[old.id],
                              unmark_reason=RETIRING, web=old)
    assert changed is True
    active = store.get_active("a.test", "web")
    route = store.get_route("a.test")
    assert active is not None and active.generation_id == old.id
    assert route is not None and (route.port, route.generation_id) == (4000, old.id)
    assert store.inhibitions(old.id) == []


def test_a_fall_back_leaves_a_route_that_is_already_right_untouched(store: Store) -> None:
    old = _running(store)
    route = store.set_route("a.test", "a.test", RouteState.SERVING, 4000, old.id,
                            expected=None)
    assert store.fall_back("a.test", active={}, unmark=[], unmark_reason=RETIRING,
                           web=old) is False
    assert store.get_route("a.test") == route  # not even its version moved


def test_a_fall_back_with_no_web_gates_a_route_and_creates_none(
    open_store: OpenStore,
) -> None:
    store = open_store()
    old = _running(store)
    store.set_route("a.test", "a.test", RouteState.SERVING, 4000, old.id, expected=None)
    assert store.fall_back("a.test", active={}, unmark=[], unmark_reason=RETIRING,
                           web=None) is True
    route = store.get_route("a.test")
    assert route is not None and (route.state, route.port) == (RouteState.GATED, None)
    _instance(store, "b.test")
    assert store.fall_back("b.test", active={}, unmark=[], unmark_reason=RETIRING,
                           web=None) is False
    assert store.get_route("b.test") is None


def test_taking_an_instance_out_of_service_gates_its_route_in_the_same_write(
        store: Store) -> None:
    store.ensure_app("blog")
    store.ensure_instance("a.test", "blog")
    store.set_route("a.test", "a.test", RouteState.SERVING, 4100, 9, expected=None)
    assert store.take_out_of_service("a.test", InstanceState.STOPPED) is True
    inst = store.get_instance("a.test")
    route = store.get_route("a.test")
    assert inst is not None and inst.state is InstanceState.STOPPED
    assert route is not None and (route.state, route.port, route.generation_id) == (
        RouteState.GATED, None, None)
    # Again: nothing left to gate, the route is untouched.
    assert store.take_out_of_service("a.test", InstanceState.STOPPED) is False
    assert store.get_route("a.test") == route
    # Down, with a reason; an instance that never had a route gets none.
    store.ensure_instance("b.test", "blog")
    assert store.take_out_of_service("b.test", InstanceState.DOWN, "it migrated") is False
    down = store.get_instance("b.test")
    assert down is not None and (down.state, down.down_reason) == (InstanceState.DOWN,
                                                                  "it migrated")
    assert store.get_route("b.test") is None


def test_taking_an_unknown_instance_out_of_service_changes_nothing(store: Store) -> None:
    before = dump(store)
    with pytest.raises(NotFound):
        store.take_out_of_service("nobody.test", InstanceState.STOPPED)
    assert dump(store) == before


def test_a_duplicate_idempotency_key_is_a_conflict_and_writes_nothing(store: Store) -> None:
    first = store.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me", key="k")
    with pytest.raises(Conflict):
        store.begin_operation("blog", "a.test", OpKind.RESTART, owner="me", key="k")
    latest = store.latest_operation("a.test")
    assert latest is not None and latest.id == first.id


def test_instance_views_read_in_bulk_what_each_instance_reads_alone(store: Store) -> None:
    store.ensure_app("blog")
    for host in ("a.test", "b.test", "c.test"):
        store.ensure_instance(host, "blog")
    op = store.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me")
    older = store.begin_operation("blog", "b.test", OpKind.DEPLOY, owner="me")
    store.finish_operation(older, OpState.SUCCEEDED)
    newer = store.begin_operation("blog", "b.test", OpKind.RESTART, owner="me")
    web = store.plan_generation(app="blog", instance="a.test", service="web", release=1,
                                build_digest=DIGEST, op_id=op.id, port=4100)
    worker = store.plan_generation(app="blog", instance="b.test", service="worker",
                                   release=1, build_digest=DIGEST, op_id=newer.id, port=None)
    store.begin_step(op.id, StepKind.SPAWN, service="web", after_gen=web.id)
    store.begin_step(newer.id, StepKind.STOP, service="worker", before_gen=worker.id)
    store.begin_step(newer.id, StepKind.SPAWN, service="worker", after_gen=worker.id)
    store.add_inhibition(worker.id, RETIRING, newer.id)
    store.set_active("b.test", "worker", worker.id, expected=None)
    store.set_route("a.test", "a.test", RouteState.HOLDING, 4100, web.id, expected=None)

    views = {v.instance.host: v for v in store.instance_views()}
    assert sorted(views) == ["a.test", "b.test", "c.test"]
    for host, view in views.items():
        assert view.instance == store.get_instance(host)
        assert view.latest == store.latest_operation(host)
        assert view.active == {a.service: a.generation_id for a in store.list_active(host)}
        assert view.live == store.live_generations(host)
        assert view.inhibitions == {g.id: frozenset(store.inhibitions(g.id))
                                    for g in store.live_generations(host)}
        assert view.route == store.get_route(host)
    latest_b = views["b.test"].latest
    assert latest_b is not None and latest_b.id == newer.id and len(latest_b.steps) == 2
    assert views["c.test"].latest is None and views["c.test"].route is None
    assert [g.id for g in store.active_generations()] == [worker.id]


def test_an_identity_number_is_allocated_once_per_name_and_never_to_another(
        open_store: OpenStore) -> None:
    store = open_store()
    a = store.identity_number(IdSpace.UID, "instance:a.test")
    b = store.identity_number(IdSpace.UID, "instance:b.test")
    assert a != b
    assert store.identity_number(IdSpace.UID, "instance:a.test") == a
    # the spaces are apart: an app's group number says nothing of any uid
    assert store.identity_number(IdSpace.GID, "app:blog") == 0
    assert store.identity_number(IdSpace.UID, "build:blog") not in {a, b}
    assert open_store().identity_number(IdSpace.UID, "instance:a.test") == a  # reopened
