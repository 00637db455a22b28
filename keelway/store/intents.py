"""The intents that span nouns, written once over the noun protocols for every backend.

An intent is one write that changes several nouns together (ACTIVE and the route of an
install, an instance's state and its route), because the halves mean one thing: a crash
between them would leave a record set no invariant allows. Each is composed here from
the nouns' own methods inside the backend's one write (`Composing.writing`, where each
noun's write joins the outer one), so the SQLite store and the in-memory store
(keelway/testing/memory_store.py) carry out the same composition, and the contract suite
(tests/store/contract/test_intents.py) pins it once for both. A backend binds them as
methods (`install = intents.install`); what only a backend can write in one step (a
crash retry with its gate, a release deferred) stays in that backend.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from keelway.journal import Cause, Inhibition, OpKind, StepKind
from keelway.store.errors import NotFound, StaleSchedule
from keelway.store.lifecycle import GenState, InstanceState, OpState, RouteState, StepState
from keelway.store.records import Generation, Instance, Operation, Release, ReleaseDraft
from keelway.store.store import Store


class Composing(Store, Protocol):
    """What an intent composes: the store's nouns, and the backend's one write."""

    def writing(self, what: str) -> AbstractContextManager[object]:
        """One atomic write saying `what` it writes; nested writes join it."""
        ...


def plan_generation(store: Composing, *, app: str, instance: str, service: str,
                    release: int, build_digest: str, op_id: int | None,
                    port: int | None) -> Generation:
    """A PLANNED generation and this box's presence of it with its port claim, in one
    write: a port claimed already refuses both (`Conflict`).

    With the shared records and the box's in two databases (a fleet), the record is
    written first: a crash before the presence leaves a PLANNED generation with no pid
    and no claim, which the reconciler marks gone, as it does one never spawned."""
    with store.writing(f"plan a {service} generation of {instance}"):
        gen = store.generations.plan_generation(
            app=app, instance=instance, service=service, release=release,
            build_digest=build_digest, op_id=op_id)
        store.local.add_presence(gen.id, port)
    return gen


def record_spawn(store: Composing, gen: Generation, pid: int,
                 start_ticks: int) -> Generation:
    """PLANNED -> RUNNING, compare-and-swap on `gen.version` (a second spawner loses
    before anything is written), and the spawn's pid and start ticks, in one write.
    Split across two databases the move goes first: a RUNNING generation whose pid is
    not recorded yet is found by its process tree, which names its generation."""
    with store.writing(f"record the spawn of generation {gen.id}"):
        running = store.generations.set_generation_state(gen, GenState.RUNNING)
        store.local.record_process(gen.id, pid, start_ticks)
    return running


def record_gone(store: Composing, gen_id: int, exit_code: int | None,
                cause: str | None = None) -> Generation:
    """The generation proven gone, then its port claim freed, in one write. The order
    is the rule for two databases too: a claim never outlives the proof its process
    is dead, so the claim goes after the proof (a crash between holds a port longer,
    never frees one a process still listens on)."""
    with store.writing(f"record generation {gen_id} gone"):
        gone = store.generations.record_exit(gen_id, exit_code, cause)
        store.local.free_port(gen_id)
    return gone


def install(store: Composing, instance: str, *, schedule_rev: int,
            candidates: Mapping[str, Generation], retiring: Iterable[int],
            retire_reason: Inhibition, op_id: int,
            release: ReleaseDraft | None) -> Release | None:
    """Make `candidates` what `instance` runs, in one write: the release row (when
    `release` is given, with the app's config), ACTIVE, the `retire_reason` mark on
    each generation `retiring`, the route to the web candidate, the instance RUNNING.

    It compares and swaps on the instance's schedule revision: `StaleSchedule` if a
    newer intent moved it past `schedule_rev`, and then nothing is written. So ACTIVE
    never names a release that has no row, and a superseded attempt installs nothing."""
    with store.writing(f"install on {instance}"):
        inst = scheduled(store, instance, schedule_rev)
        written = write_release(store, release)
        for service, gen in candidates.items():
            store.generations.set_active(
                instance, service, gen.id,
                expected=store.generations.get_active(instance, service))
        for gen_id in retiring:
            store.generations.add_inhibition(gen_id, retire_reason, op_id)
        web = candidates.get("web")
        if web is not None:
            store.routes.set_route(instance, instance, RouteState.SERVING,
                                   store.local.presence(web.id).port, web.id,
                                   expected=store.routes.get_route(instance))
        if inst.state is not InstanceState.RUNNING:
            inst = store.instances.set_instance_state(inst, InstanceState.RUNNING)
        if inst.pending_release is not None:
            # What is installed now supersedes a release deferred to a wake.
            store.clear_pending(instance, inst.pending_release)
    return written


def activate_and_route(store: Composing, instance: str,
                       generations: Mapping[str, int]) -> None:
    """Name `generations` ACTIVE (service -> generation id) and, in the same write,
    route the instance to its ACTIVE web if that one is not gone: the route never
    names a web generation that ACTIVE does not."""
    with store.writing(f"activate and route {instance}"):
        for service, gen_id in generations.items():
            store.generations.set_active(
                instance, service, gen_id,
                expected=store.generations.get_active(instance, service))
        web_active = store.generations.get_active(instance, "web")
        web = (store.generations.get_generation(web_active.generation_id)
               if web_active else None)
        if web is not None and web.state is not GenState.GONE:
            store.routes.set_route(instance, instance, RouteState.SERVING,
                                   store.local.presence(web.id).port, web.id,
                                   expected=store.routes.get_route(instance))


def fall_back(store: Composing, instance: str, *, active: Mapping[str, int],
              unmark: Iterable[int], unmark_reason: Inhibition,
              web: Generation | None) -> bool:
    """Put back what a failed attempt replaced, in one write: `active` (service ->
    generation id) ACTIVE again, the `unmark_reason` mark off each of `unmark`, and
    the route to `web` (gated when None). True if the route changed.

    A route already right is left untouched (the journal shows the failure, nothing
    else); an instance that never had a route and has no web gets none."""
    with store.writing(f"fall back on {instance}"):
        for service, gen_id in active.items():
            store.generations.set_active(
                instance, service, gen_id,
                expected=store.generations.get_active(instance, service))
        for gen_id in unmark:
            store.generations.remove_inhibition(gen_id, unmark_reason)
        route = store.routes.get_route(instance)
        want: tuple[RouteState, int | None, int | None] = (
            (RouteState.SERVING, store.local.presence(web.id).port, web.id) if web is not None
            else (RouteState.GATED, None, None))
        have = (route.state, route.port, route.generation_id) if route else None
        changed = have != want and (route is not None or web is not None)
        if changed:
            store.routes.set_route(instance, instance, *want, expected=route)
    return changed


def take_out_of_service(store: Composing, instance: str, state: InstanceState,
                        reason: str | None = None) -> bool:
    """Put the instance in `state` (why: `reason`) and gate its route, in one write.
    True if the route changed, so the caller publishes.

    One write, because the two halves mean one thing: an instance not RUNNING whose
    route still served would take traffic that nothing restarts (invariant 2), and
    a gated route on a RUNNING instance would look like a fault to the reconciler.
    `NotFound` if there is no such instance."""
    with store.writing(f"take {instance} out of service"):
        inst = store.instances.get_instance(instance)
        if inst is None:
            raise NotFound(f"no instance {instance}")
        if inst.state is not state or inst.down_reason != reason:
            store.instances.set_instance_state(inst, state, reason)
        route = store.routes.get_route(instance)
        if route is None or route.state is RouteState.GATED:
            return False
        store.routes.set_route(instance, instance, RouteState.GATED, None, None,
                               expected=route)
        return True


def park(store: Composing, inst: Instance) -> Instance:
    """The instance PARKED and its route (if it has one) `parked`, with no upstream,
    in one write; compare-and-swap on `inst.version`. So the router is never told to
    hold a host whose instance is recorded running, nor to serve one recorded parked."""
    with store.writing(f"park {inst.host}"):
        parked = store.instances.set_instance_state(inst, InstanceState.PARKED)
        route = store.routes.get_route(inst.host)
        if route is not None and route.state is not RouteState.PARKED:
            store.routes.set_route(inst.host, inst.host, RouteState.PARKED, None, None,
                                   expected=route)
    return parked


def scheduled(store: Composing, instance: str, schedule_rev: int) -> Instance:
    """`instance` if its schedule is still at `schedule_rev` (inside an intent's write);
    `StaleSchedule` if a newer intent moved it on, so the caller writes nothing."""
    inst = store.instances.get_instance(instance)
    if inst is None or inst.schedule_rev != schedule_rev:
        raise StaleSchedule(f"{instance} was rescheduled past revision {schedule_rev}")
    return inst


def write_release(store: Composing, release: ReleaseDraft | None) -> Release | None:
    """The release row of an install or a deferral, with its config made the app's,
    inside the intent's write."""
    if release is None:
        return None
    written = store.builds.create_release(release.app, release.build_digest,
                                          release.config, release.description)
    app = store.apps.get_app(release.app)
    if app is not None and app.config != release.config:
        store.apps.set_app_config(app, release.config)
    return written


def begin_with(store: Composing, intent: Callable[[], object], app: str, instance: str,
               kind: OpKind, owner: str, *, key: str | None = None,
               request_digest: str | None = None, schedule_rev: int = 0) -> Operation:
    """Begin an operation and write its durable intent (a removal's `removing`, an
    add's records) in one write: no mark is ever without the operation whose journal
    says how far it got, so the reconciler finds every interrupted one by its
    operation (keelway/deploy/operation.py `Recovery`). `intent` raising writes
    nothing, the operation included."""
    with store.writing(f"begin a {kind.value} operation on {instance} with its intent"):
        intent()
        return store.ops.begin_operation(app, instance, kind, owner, key=key,
                                         request_digest=request_digest,
                                         schedule_rev=schedule_rev)


def defer_releases(store: Composing, deferrals: Sequence[tuple[str, int]], *, app: str,
                   kind: OpKind, owner: str, number: int, cause: Cause,
                   key: str | None = None,
                   request_digest: str | None = None) -> list[Operation]:
    """Release `number` (its row written already) left pending on each parked instance
    of `deferrals` (host, the schedule revision its rollout holds), each journaled as
    the operation its own attempt would have written: begun, one DEFER step succeeded
    (`v<number>`), succeeded, its event; all in one write, so a crash leaves every one
    of them or none. An instance not parked any more, or rescheduled past its revision,
    is passed over (nothing written for it): its own attempt decides. The operations
    written, in the order given."""
    done: list[Operation] = []
    with store.writing(f"defer v{number} on {len(deferrals)} parked instances"):
        for host, rev in deferrals:
            inst = store.instances.get_instance(host)
            if inst is None or inst.schedule_rev != rev or inst.state is not InstanceState.PARKED:
                continue
            store.defer_release(host, schedule_rev=rev, number=number, cause=cause,
                                release=None)
            op = store.ops.begin_operation(app, host, kind, owner, key=key,
                                           request_digest=request_digest, schedule_rev=rev)
            seq = store.ops.begin_step(op.id, StepKind.DEFER)
            store.ops.finish_step(op.id, seq, StepState.SUCCEEDED, detail=f"v{number}")
            begun = store.ops.get_operation(op.id)
            assert begun is not None  # written in this same write
            done.append(store.ops.finish_operation(begun, OpState.SUCCEEDED))
            store.ops.add_event("op", f"{kind} succeeded: deferred to the next wake",
                                app=app, instance=host)
    return done


def finish_with(store: Composing, intent: Callable[[], object], op: Operation,
                state: OpState, error: str | None = None) -> None:
    """End an operation and clear what its intent marked (an add's `adding`) in one
    write: a mark never outlives the operation that carries it on."""
    with store.writing(f"finish operation {op.id} and clear its intent"):
        intent()
        store.ops.finish_operation(op, state, error=error)
