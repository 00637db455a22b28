"""The contract of the intents on `Store` itself: the writes whose rows span nouns,
each one transaction, on every backend."""

from __future__ import annotations

import asyncio

import pytest

from keelway.durable import sync_deferred
from keelway.journal import Cause, OpKind, StepKind
from keelway.store import Conflict, NotFound, StaleSchedule, Store
from keelway.store.lifecycle import (
    IllegalTransition,
    InstanceState,
    OpState,
    RouteState,
    StepState,
)
from keelway.store.records import CrashRetry, Generation, ReleaseDraft
from keelway.testing import reads
from keelway.testing.clock import FakeClock
from tests.store.contract.conftest import OpenStore
from tests.store.contract.helpers import (
    DIGEST,
    RETIRING,
    _everything,
    _gen,
    _instance,
    _running,
    dump,
)


def _state(store: Store, host: str) -> RouteState:
    route = store.routes.get_route(host)
    assert route is not None
    return route.state


def test_a_crash_gates_the_route_that_served_the_crashed_web_in_the_same_write(
    store: Store, clock: FakeClock,
) -> None:
    web = _running(store)
    store.generations.set_active("a.test", "web", web.id, expected=None)
    store.routes.set_route("a.test", "a.test", RouteState.SERVING,
                           store.local.presence(web.id).port, web.id, expected=None)
    store.record_gone(web.id, 1)
    now = clock.now()
    assert store.record_crash(CrashRetry("a.test", "web", web.id, 1, now, now + 5)) is True
    route = store.routes.get_route("a.test")
    assert route is not None and (route.state, route.port) == (RouteState.GATED, None)
    assert [r.retry_at for r in store.generations.pending_retries("a.test")] == [now + 5]


def test_a_crash_leaves_a_route_that_serves_another_generation_alone(
    store: Store, clock: FakeClock,
) -> None:
    old, new = _running(store, port=4000), _running(store, port=4001)
    route = store.routes.set_route("a.test", "a.test", RouteState.SERVING, 4001, new.id,
                            expected=None)
    now = clock.now()
    assert store.record_crash(CrashRetry("a.test", "web", old.id, 1, now, now + 5)) is False
    worker = _running(store, service="worker", port=None)
    assert store.record_crash(CrashRetry("a.test", "worker", worker.id, 1, now, now)) is False
    assert store.routes.get_route("a.test") == route


@pytest.mark.parametrize("waiting", [RouteState.PARKED, RouteState.HOLDING])
def test_a_failed_start_gates_the_route_its_operation_holds_waiting_and_a_crash_does_not(
    store: Store, clock: FakeClock, waiting: RouteState,
) -> None:
    web, other = _running(store), _running(store, host="b.test", port=4001)
    for gen in (web, other):
        store.generations.set_active(gen.instance, "web", gen.id, expected=None)
        store.routes.set_route(gen.instance, gen.instance, waiting, None, None, expected=None)
        store.record_gone(gen.id, 3)
    now = clock.now()
    # A crash seen by a watcher leaves a waiting route to the operation that holds it.
    assert store.record_crash(CrashRetry("b.test", "web", other.id, 1, now, now + 5)) is False
    assert _state(store, "b.test") is waiting
    # The operation's own start failed: its requests get 503 + Retry-After, not a wait.
    assert store.record_crash(CrashRetry("a.test", "web", web.id, 1, now, now + 5),
                              gate_waiting=True) is True
    assert _state(store, "a.test") is RouteState.GATED
    assert [r.retry_at for r in store.generations.pending_retries("a.test")] == [now + 5]


def test_a_crash_backoff_survives_a_reopen_and_goes_stale_once_active_moves_on(
    open_store: OpenStore, clock: FakeClock,
) -> None:
    store = open_store()
    crashed = _running(store)
    store.generations.set_active("a.test", "web", crashed.id, expected=None)
    store.record_gone(crashed.id, 7)
    store.record_crash(CrashRetry("a.test", "web", crashed.id, 4, clock.now(), clock.now()))
    store = open_store()
    assert [r.failures for r in store.generations.pending_retries()] == [4]
    successor = _gen(store, port=4001)
    store.activate_and_route("a.test", {"web": successor.id})
    assert store.generations.pending_retries() == []
    assert store.generations.get_crash_retry("a.test", "web") is not None


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
    store.generations.set_active("a.test", "web", old.id, expected=None)
    inst = store.instances.get_instance("a.test")
    assert inst is not None
    store.instances.set_instance_state(inst, InstanceState.STOPPED)
    web, worker = _running(store, port=4001), _running(store, service="worker", port=None)
    rev = store.instances.bump_schedule("a.test")
    release = _install(store, {"web": web, "worker": worker}, rev, retiring=[old.id],
                       release=ReleaseDraft("blog", DIGEST, {"A": "1"}, "Deploy"))
    assert release == store.builds.get_release("blog", 1)
    assert {a.service: a.generation_id for a in store.generations.list_active("a.test")} == {
        "web": web.id, "worker": worker.id}
    assert store.generations.inhibitions(old.id) == [RETIRING]
    route = store.routes.get_route("a.test")
    assert route is not None and (route.state, route.port, route.generation_id) == (
        RouteState.SERVING, 4001, web.id)
    inst = store.instances.get_instance("a.test")
    app = store.apps.get_app("blog")
    assert inst is not None and inst.state is InstanceState.RUNNING
    assert app is not None and app.config == {"A": "1"}


def test_an_install_by_a_superseded_attempt_writes_nothing(store: Store) -> None:
    web = _running(store)
    rev = store.instances.bump_schedule("a.test")
    store.instances.bump_schedule("a.test")  # a newer intent
    before = _everything(store)
    with pytest.raises(StaleSchedule):
        _install(store, {"web": web}, rev,
                 release=ReleaseDraft("blog", DIGEST, {"A": "1"}, "Deploy"))
    assert _everything(store) == before
    assert isinstance(StaleSchedule("x"), Conflict)


def test_an_install_that_fails_midway_leaves_nothing_behind(store: Store) -> None:
    web = _running(store)
    rev = store.instances.bump_schedule("a.test")
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
    assert store.routes.get_route("a.test") is None  # no web: no route
    web = _running(store, port=4001)
    store.record_gone(web.id, None)
    store.activate_and_route("a.test", {"web": web.id})
    assert store.routes.get_route("a.test") is None  # the ACTIVE web is gone
    again = _running(store, port=4002)
    store.activate_and_route("a.test", {"web": again.id})
    route = store.routes.get_route("a.test")
    assert route is not None and (route.port, route.generation_id) == (4002, again.id)


def test_a_fall_back_puts_back_active_lifts_the_marks_and_routes_to_the_old_web(
    store: Store,
) -> None:
    old, new = _running(store, port=4000), _running(store, port=4001)
    rev = store.instances.bump_schedule("a.test")
    store.generations.set_active("a.test", "web", old.id, expected=None)
    store.routes.set_route("a.test", "a.test", RouteState.SERVING, 4000, old.id, expected=None)
    _install(store, {"web": new}, rev, retiring=[old.id])
    changed = store.fall_back("a.test", active={"web": old.id}, unmark=[old.id],
                              unmark_reason=RETIRING, web=old)
    assert changed is True
    active = store.generations.get_active("a.test", "web")
    route = store.routes.get_route("a.test")
    assert active is not None and active.generation_id == old.id
    assert route is not None and (route.port, route.generation_id) == (4000, old.id)
    assert store.generations.inhibitions(old.id) == []


def test_a_fall_back_leaves_a_route_that_is_already_right_untouched(store: Store) -> None:
    old = _running(store)
    route = store.routes.set_route("a.test", "a.test", RouteState.SERVING, 4000, old.id,
                            expected=None)
    assert store.fall_back("a.test", active={}, unmark=[], unmark_reason=RETIRING,
                           web=old) is False
    assert store.routes.get_route("a.test") == route  # not even its version moved


def test_a_fall_back_with_no_web_gates_a_route_and_creates_none(
    open_store: OpenStore,
) -> None:
    store = open_store()
    old = _running(store)
    store.routes.set_route("a.test", "a.test", RouteState.SERVING, 4000, old.id, expected=None)
    assert store.fall_back("a.test", active={}, unmark=[], unmark_reason=RETIRING,
                           web=None) is True
    route = store.routes.get_route("a.test")
    assert route is not None and (route.state, route.port) == (RouteState.GATED, None)
    _instance(store, "b.test")
    assert store.fall_back("b.test", active={}, unmark=[], unmark_reason=RETIRING,
                           web=None) is False
    assert store.routes.get_route("b.test") is None


def test_taking_an_instance_out_of_service_gates_its_route_in_the_same_write(
        store: Store) -> None:
    store.apps.ensure_app("blog")
    store.instances.ensure_instance("a.test", "blog")
    store.routes.set_route("a.test", "a.test", RouteState.SERVING, 4100, 9, expected=None)
    assert store.take_out_of_service("a.test", InstanceState.STOPPED) is True
    inst = store.instances.get_instance("a.test")
    route = store.routes.get_route("a.test")
    assert inst is not None and inst.state is InstanceState.STOPPED
    assert route is not None and (route.state, route.port, route.generation_id) == (
        RouteState.GATED, None, None)
    # Again: nothing left to gate, the route is untouched.
    assert store.take_out_of_service("a.test", InstanceState.STOPPED) is False
    assert store.routes.get_route("a.test") == route
    # Down, with a reason; an instance that never had a route gets none.
    store.instances.ensure_instance("b.test", "blog")
    assert store.take_out_of_service("b.test", InstanceState.DOWN, "it migrated") is False
    down = store.instances.get_instance("b.test")
    assert down is not None and (down.state, down.down_reason) == (InstanceState.DOWN,
                                                                  "it migrated")
    assert store.routes.get_route("b.test") is None


def test_taking_an_unknown_instance_out_of_service_changes_nothing(store: Store) -> None:
    before = dump(store)
    with pytest.raises(NotFound):
        store.take_out_of_service("nobody.test", InstanceState.STOPPED)
    assert dump(store) == before


def test_parking_writes_the_instance_and_its_route_in_one_write(store: Store) -> None:
    _instance(store)
    store.routes.set_route("a.test", "a.test", RouteState.SERVING, 4000, 9, expected=None)
    inst = store.instances.get_instance("a.test")
    assert inst is not None
    parked = store.park(inst)
    route = store.routes.get_route("a.test")
    assert parked.state is InstanceState.PARKED
    assert route is not None and (route.state, route.port, route.generation_id) == (
        RouteState.PARKED, None, None)


def test_parking_a_stopped_instance_is_refused_and_writes_nothing(store: Store) -> None:
    _instance(store)
    store.routes.set_route("a.test", "a.test", RouteState.GATED, None, None, expected=None)
    inst = store.instances.get_instance("a.test")
    assert inst is not None
    stopped = store.instances.set_instance_state(inst, InstanceState.STOPPED)
    before = _everything(store)
    with pytest.raises(IllegalTransition):
        store.park(stopped)
    assert _everything(store) == before


def test_an_install_on_a_parked_instance_runs_it_and_supersedes_its_deferred_release(
        store: Store) -> None:
    web = _running(store)
    inst = store.instances.get_instance("a.test")
    assert inst is not None
    store.park(inst)
    rev = store.instances.bump_schedule("a.test")
    deferred = store.defer_release("a.test", schedule_rev=rev, number=0, cause=Cause.CONFIG,
                                   release=ReleaseDraft("blog", DIGEST, {"A": "1"}, "Set A"))
    assert deferred is not None and deferred.number == 1
    pending = store.instances.get_instance("a.test")
    assert pending is not None and (pending.pending_release, pending.pending_cause) == (
        1, Cause.CONFIG)
    assert store.apps.get_app("blog").config == {"A": "1"}  # type: ignore[union-attr]
    written = store.install("a.test", schedule_rev=rev, candidates={"web": web}, retiring=[],
                            retire_reason=RETIRING, op_id=1, release=None)
    assert written is None
    now = store.instances.get_instance("a.test")
    assert now is not None and now.state is InstanceState.RUNNING
    assert (now.pending_release, now.pending_cause) == (None, None)
    route = store.routes.get_route("a.test")
    assert route is not None and (route.state, route.port) == (RouteState.SERVING,
                                                           store.local.presence(web.id).port)


def test_a_deferral_by_a_superseded_rollout_writes_nothing(store: Store) -> None:
    _instance(store)
    rev = store.instances.bump_schedule("a.test")
    store.instances.bump_schedule("a.test")
    before = _everything(store)
    with pytest.raises(StaleSchedule):
        store.defer_release("a.test", schedule_rev=rev, number=1, cause=Cause.RELEASE,
                            release=ReleaseDraft("blog", DIGEST, {}, "Deploy"))
    assert _everything(store) == before


def _parked(store: Store, host: str) -> int:
    """`host` parked, and the schedule revision a rollout of it would hold."""
    _instance(store, host)
    inst = store.instances.get_instance(host)
    assert inst is not None
    store.park(inst)
    return store.instances.bump_schedule(host)


def test_deferrals_in_bulk_journal_each_parked_instance_as_its_own_attempt_would(
        store: Store) -> None:
    """One write for many parked instances: each gets the release pending and its own
    operation (one DEFER step, succeeded) and event; an instance awake by now, or
    rescheduled past the rollout's revision, is passed over with nothing written."""
    revs = {host: _parked(store, host) for host in ("a.test", "b.test", "c.test")}
    _instance(store, "awake.test")
    revs["awake.test"] = store.instances.bump_schedule("awake.test")
    store.instances.bump_schedule("c.test")  # a newer operation took c.test over
    written = store.defer_releases(sorted(revs.items()), app="blog", kind=OpKind.CONFIG,
                                   owner="me", number=3, cause=Cause.CONFIG, key="k1")
    assert [op.instance for op in written] == ["a.test", "b.test"]
    for op in written:
        assert (op.kind, op.state, op.key, op.schedule_rev) == (
            OpKind.CONFIG, OpState.SUCCEEDED, "k1", revs[op.instance])
        steps = store.ops.steps(op.id)
        assert [(s.kind, s.state, s.detail) for s in steps] == [
            (StepKind.DEFER, StepState.SUCCEEDED, "v3")]
        inst = store.instances.get_instance(op.instance)
        assert inst is not None and inst.state is InstanceState.PARKED
        assert (inst.pending_release, inst.pending_cause) == (3, Cause.CONFIG)
    for host in ("awake.test", "c.test"):
        assert store.ops.latest_operation(host) is None
        inst = store.instances.get_instance(host)
        assert inst is not None and inst.pending_release is None
    said = {(e.instance, e.message) for e in store.ops.list_events("blog")}
    assert ("a.test", "config succeeded: deferred to the next wake") in said
    assert not any(instance == "awake.test" for instance, _ in said)


def test_a_pending_release_is_cleared_only_while_it_is_the_one_named(store: Store) -> None:
    _instance(store)
    rev = store.instances.bump_schedule("a.test")
    store.defer_release("a.test", schedule_rev=rev, number=2, cause=Cause.RELEASE,
                        release=None)
    store.clear_pending("a.test", 1)  # an older one: the newer stays
    kept = store.instances.get_instance("a.test")
    assert kept is not None and kept.pending_release == 2
    store.clear_pending("a.test", 2)
    cleared = store.instances.get_instance("a.test")
    assert cleared is not None and (cleared.pending_release, cleared.pending_cause) == (
        None, None)


def test_a_closed_store_opened_again_has_every_record(open_store: OpenStore) -> None:
    store = open_store()
    _instance(store)
    before = dump(store)
    store.close()
    again = open_store()
    assert dump(again) == before


def test_a_read_apart_sees_every_record_written_before_it(store: Store) -> None:
    _instance(store, "a.test")
    _instance(store, "b.test")

    async def read() -> list[str]:
        return await store.read_apart(lambda s: [i.host for i in s.instances.list_instances()])

    assert asyncio.run(read()) == ["a.test", "b.test"]


def test_a_sync_keeps_every_record_written_before_it(open_store: OpenStore) -> None:
    """`sync` (keelway/durable.py): what was written in a deferred scope is all there
    after it, and once the store is opened again."""
    store = open_store()
    with sync_deferred():
        _instance(store, "a.test")
    asyncio.run(store.sync())
    assert [i.host for i in store.instances.list_instances()] == ["a.test"]
    store.close()
    assert [i.host for i in open_store().instances.list_instances()] == ["a.test"]


def test_a_read_aside_sees_every_record_written_before_it(store: Store) -> None:
    store.apps.ensure_app("blog")
    _pid, apps = asyncio.run(store.read_aside(reads.pid_and_apps))
    assert apps == ["blog"]
