"""Apps whole: created, looked up, destroyed (SPEC §5.7).

`apps destroy` removes every instance of the app (each one's removal is
keelway/deploy/instances.py's, journaled as a `destroy` of that instance), then runs one
operation of the app itself, journaled with no instance (APP_SCOPE): REMOVE_BUILDS,
FORGET. Its intent is the app's `destroying` mark, written before any effect: a crash
anywhere is carried on by the next boot (`resume`), every step a no-op where done.
Data stays unless `--purge-data` says otherwise; the journal, events and idempotency
keys outlive every removal.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from keelway import failpoints, names
from keelway.builds import gc as builds_gc
from keelway.deploy.errors import NotFoundError, OperationError, UserError, checked
from keelway.deploy.locks import Locks
from keelway.deploy.operation import Bound, Plan, PlannedStep, Ran, Runner, Spec
from keelway.deploy.outcome import Outcome
from keelway.deploy.steps import Done
from keelway.home import Home
from keelway.journal import OpKind, StepKind
from keelway.reconcile.apply import end_interrupted
from keelway.reconcile.plan import Verdict, by_steps
from keelway.store import Conflict, Store
from keelway.store.lifecycle import OpState, Removal, StepState
from keelway.store.records import App, Instance, Operation

log = logging.getLogger("keelway.apps")

failpoints.declare("destroy.builds.before", "destroy.builds.after",
                   "destroy.forget.before", "destroy.forget.after")

# The app's own operation of a destroy names no instance.
APP_SCOPE = ""


def named(store: Store, name: str) -> App:
    """The app named `name`, its name checked first: the one app lookup (UserError for
    a bad name, NotFoundError for none, or one being destroyed)."""
    checked(names.APP, name)
    app = store.apps.get_app(name)
    if app is None or app.destroying is not None:
        raise NotFoundError(f"no app named {name}", hint="see `keelway apps`")
    return app


class Remover(Protocol):
    """What removes one instance: keelway/deploy/instances.py `Instances`, a part above
    this module (it looks apps up here), so it is handed in, never imported."""

    async def remove(self, inst: Instance, kind: OpKind, removal: Removal,
                     begun: Operation | None = None) -> None: ...

    async def recover_removal(self, op: Operation) -> None: ...

    def removal_plan(self, host: str, removal: Removal) -> Plan: ...


@dataclass(eq=False)
class Apps:
    store: Store
    home: Home
    locks: Locks
    runner: Runner
    instances: Remover

    def create_app(self, name: str) -> App:
        checked(names.APP, name)
        try:
            return self.store.apps.create_app(name)
        except Conflict:
            raise UserError(f"an app named {name} exists already",
                            hint=f"see `keelway status {name}`") from None

    async def destroy_app(self, name: str, removal: Removal,
                          begun: Operation | None = None) -> list[str]:
        """Remove every instance of the app (processes proven gone, routes withdrawn,
        records deleted; data kept unless `removal` purges it), then its builds and
        records, so the name can be used again. Returns the hosts removed.

        The `destroying` mark is written in the write that begins the first of its
        operations (each instance's, then the app's own: `_destroying`), so every
        mark has an operation boot finds. `begun`: an interrupted one of them, carried
        on where it is met (`recover_destroy`)."""
        app = self.store.apps.get_app(name)
        if app is None:
            raise NotFoundError(f"no app named {name}", hint="see `keelway apps`")
        async with self.locks.app(name):
            app = self.store.apps.get_app(name) or app
            removal = Removal(app.destroying or removal)  # a purge asked once stays asked
            removed = []
            for inst in self.store.instances.list_instances(name):
                mine = begun if begun is not None and begun.instance == inst.host else None
                await self.instances.remove(inst, OpKind.DESTROY, removal, mine)
                removed.append(inst.host)
            mine = begun if begun is not None and begun.instance == APP_SCOPE else None
            await self._forget_app(name, removal, mine)
        if begun is not None and not (self.store.ops.get_operation(begun.id) or begun).terminal:
            # An instance's removal whose records were gone before it was met.
            end_interrupted(self.store, begun, Verdict(OpState.SUCCEEDED),
                            "its records are gone")
        return removed

    async def recover_destroy(self, op: Operation) -> None:
        """At boot: an interrupted operation of a destroy (an instance's removal, or the
        app's own) carried on: the whole destroy again from the app's `destroying`
        mark, this operation run on where it is met, every step a no-op where done.
        With the app gone it did what it was for; an instance's with no destroy under
        way is a removal of its own."""
        app = self.store.apps.get_app(op.app)
        if app is not None and app.destroying is not None:
            await self.destroy_app(app.name, Removal(app.destroying), op)
        elif op.instance != APP_SCOPE:
            await self.instances.recover_removal(op)
        elif app is None:
            end_interrupted(self.store, op, Verdict(OpState.SUCCEEDED), "its records are gone")
        else:
            end_interrupted(self.store, op, by_steps(op))

    def plan_destroy_app(self, name: str, removal: Removal) -> list[tuple[str, Plan]]:
        """The dry run of `apps destroy`: each instance's removal and the app's own
        operation, as they would run now. Nothing is changed."""
        named(self.store, name)
        return plan_destroy(self.store, name,
                            lambda host: self.instances.removal_plan(host, removal))

    async def _forget_app(self, name: str, removal: Removal,
                          begun: Operation | None = None) -> None:
        ran = await self.runner.run(FORGET_APP, self, AppRequest(APP_SCOPE, name, removal),
                                    begun=begun)
        if ran.result is not None and ran.result.outcome is not Outcome.DONE:
            raise OperationError(f"destroy {name}: {ran.result.reason}",
                                 hint="`keelway apps destroy` again carries it on")

    async def resume(self) -> None:
        """Every destroy carried on from its `destroying` mark alone, whatever its
        operations say (a mark left by a keelway older than `Store.begin_with`; boot
        carries on each interrupted operation by its kind instead, `recover_destroy`)."""
        finish_orphans(self.store, self.locks)
        for app in self.store.apps.destroying_apps():
            try:
                await self.destroy_app(app.name, Removal(app.destroying or Removal.KEEP_DATA))
            except OperationError as exc:
                log.warning("boot: destroy %s: %s", app.name, exc.message)


@dataclass(frozen=True)
class AppRequest:
    host: str  # APP_SCOPE: the app's own operation names no instance
    app: str
    removal: Removal = Removal.KEEP_DATA  # what the `destroying` mark says


def plan_forget_app(_store: Store, request: AppRequest) -> Plan:
    """The app's own operation of `apps destroy`, once its instances are removed."""
    name = request.app
    return Plan(OpKind.DESTROY, name, APP_SCOPE, (
        PlannedStep(StepKind.REMOVE_BUILDS, f"remove {name}'s staged builds",
                    "remove-builds", before=("destroy.builds.before",),
                    after=("destroy.builds.after",)),
        PlannedStep(StepKind.FORGET, f"forget app {name}", "forget",
                    before=("destroy.forget.before",), after=("destroy.forget.after",),
                    detail=f"app {name}")))


def _remove_builds(apps: Apps, request: AppRequest, _step: PlannedStep) -> Bound:
    async def remove_builds(_op: Operation) -> Done:
        builds = apps.home.builds_dir
        staged = builds_gc.staged_builds(builds)
        keep = {build for build in staged if build[0] != request.app}
        gone = await asyncio.to_thread(builds_gc.collect, builds, keep)
        return Done(f"{len(gone)} builds removed")

    return remove_builds


def _forget(apps: Apps, request: AppRequest, _step: PlannedStep) -> Bound:
    async def forget(_op: Operation) -> Done:
        apps.store.apps.forget_app(request.app)
        return Done(f"app {request.app}")

    return forget


def _destroying(apps: Apps, request: AppRequest) -> None:
    # The intent, in the write that begins the app's own operation (an app with no
    # instance left has no other).
    apps.store.apps.mark_destroying(request.app, request.removal)


async def _recover_destroy(apps: Apps, op: Operation) -> None:
    await apps.recover_destroy(op)


async def _end_orphans(apps: Apps, _request: AppRequest, _ran: Ran) -> None:
    # A fault leaves the app's op with no reconciler to end it.
    finish_orphans(apps.store, apps.locks)


# The app's own operation names no instance: the runner takes the empty name's lock.
# Boot carries on every interrupted operation of a destroy, its instances' and its own
# (`recover_destroy`).
FORGET_APP: Spec[AppRequest, Apps] = Spec(
    OpKind.DESTROY, plan_forget_app, {"remove-builds": _remove_builds, "forget": _forget},
    intent=_destroying, after=_end_orphans, recover=_recover_destroy)


def plan_destroy(store: Store, name: str,
                 removal_plan: Callable[[str], Plan]) -> list[tuple[str, Plan]]:
    """`apps destroy` (reads only): each instance's removal (`removal_plan` of its
    host: keelway/deploy/instances.py plan_remove), then the app's own operation (under
    APP_SCOPE), in the order they run."""
    plans = [(inst.host, removal_plan(inst.host)) for inst in store.instances.list_instances(name)]
    return [*plans, (APP_SCOPE, plan_forget_app(store, AppRequest(APP_SCOPE, name)))]


def finish_orphans(store: Store, locks: Locks) -> None:
    """End the operations whose instance is gone (a removal that crashed after its
    records were deleted, or a destroy's own operation): no reconciler pass sees
    them. A removal or destroy whose instance is gone did what it was for."""
    for op_id in store.ops.unfinished_operations():
        op = store.ops.get_operation(op_id)
        if op is None or op.terminal or op.id in locks.live_ops:
            continue
        done = op.kind in (OpKind.REMOVE_INSTANCE, OpKind.DESTROY) and (
            op.instance != APP_SCOPE or store.apps.get_app(op.app) is None)
        for step in op.steps:
            if step.state is StepState.PENDING:
                store.ops.finish_step(
                    op.id, step.seq, StepState.SUCCEEDED if done else StepState.FAILED,
                    detail="its records are gone" if done else None,
                    error=None if done else "interrupted by a control-plane crash")
        fresh = store.ops.get_operation(op.id) or op
        store.ops.finish_operation(
            fresh, OpState.SUCCEEDED if done else OpState.FAILED,
            error=None if done else "interrupted by a control-plane crash")

