"""The reconciler's passes: the mutation pass every operation converges through first
(`converge`), the boot pass after a control-plane start, `keelway reconcile` on demand,
and the periodic pass, which only ever tries a lock, never waits behind an operation.
Every pass also removes process trees that no live record names (invariant 5).

Boot is one reconciliation: what a kind must settle before anything respawns (its
spec's `first`), strays removed, every instance reconciled, the interrupted operations
no instance's plan sees ended by their kinds' finalizers, keyed requests settled, the
route table published, then every interrupted operation of a kind that carries its own
on (`Spec.recover`) dispatched by its kind, oldest first (keelway/deploy/operation.py
`Recovery`): one mechanism for every kind, no list of resumers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from keelway.clock import Clock
from keelway.deploy import targets
from keelway.deploy.errors import OperationError
from keelway.deploy.locks import Locks
from keelway.deploy.operation import Recovery
from keelway.deploy.publisher import Publisher
from keelway.durable import disk_full, disk_full_message
from keelway.home import Home
from keelway.reconcile.apply import FailedClosed, Reconciler
from keelway.reconcile.plan import Pass
from keelway.runtime.supervisor import Supervisor
from keelway.store import Store
from keelway.store.lifecycle import OpState, RequestState

log = logging.getLogger("keelway.deployer")

PERIODIC_S = 5.0


@dataclass(eq=False)
class Passes:
    """Boot, periodic and on-demand passes, and `converge`, the one way any part
    reconciles an instance under its lock."""

    store: Store
    home: Home
    supervisor: Supervisor
    publisher: Publisher
    clock: Clock
    locks: Locks
    reconciler: Reconciler

    def __post_init__(self) -> None:
        self.closing = False

    async def converge(self, host: str, mode: Pass) -> None:
        """Reconcile `host` under the lock the caller holds; a failed-closed instance
        refuses whatever the caller was about to do."""
        try:
            outcome = await self.reconciler.reconcile(host, mode, self.locks.live_ops)
        except FailedClosed as exc:
            raise OperationError(
                f"{host} is failed closed: {exc.leftover}",
                hint="the process must go before anything else runs here: stop it, then "
                     "`keelway reconcile`; `keelway status` shows it") from exc
        if outcome.republish and mode is not Pass.MUTATION:
            await self.publisher.publish()

    async def boot(self, recovery: Recovery | None = None) -> None:
        """After a control-plane start: remove trees no record names, reconcile every
        instance (adopt survivors, remove candidates of interrupted operations, restart
        what should run), settle keyed requests that a crash interrupted, and publish
        the whole route table.

        A router that does not answer in time (alive, but starved or stopped) does not
        stop the boot: the router keeps serving its last table, and the periodic pass
        republishes once it answers and differs from the store."""
        began = self.clock.monotonic()
        recovery = recovery or Recovery()
        recovery.settle_first()
        await self._remove_strays()
        # Planned from one bulk read; only an instance with work is locked and
        # reconciled, from a fresh read under its lock.
        hosts, _ = self.reconciler.survey(Pass.BOOT, self.locks.live_ops)
        for host in hosts:
            async with self.locks.instance(host):
                try:
                    await self.reconciler.reconcile(host, Pass.BOOT, self.locks.live_ops)
                except FailedClosed as exc:
                    log.warning("%s", exc)
                except OperationError as exc:
                    log.warning("boot: %s: %s; the periodic pass retries", host, exc.message)
        # The interrupted operations no instance's plan sees (a run, whose process was a
        # stray of the pass above), each ended by its kind's finalizer.
        self.reconciler.finalize_orphans(self.locks.live_ops)
        targets.link_every_current(self.store, self.home)
        log.info("boot: %d instances reconciled (%d with work) in %.3f s",
                 len(self.store.instances.list_instances()), len(hosts),
                 self.clock.monotonic() - began)
        for request in self.store.ops.running_requests():
            self.settle_request_from_journal(request.key)
        try:
            await self.publisher.publish()
        except OperationError as exc:
            log.warning("boot: %s; the periodic pass republishes", exc.message)
        carried = await recovery.recover_all(self.store, self.locks.live_ops)
        if carried:
            log.info("boot: carried on %d interrupted operations", len(carried))

    def settle_request_from_journal(self, key: str) -> None:
        ops = [op for i in self.store.instances.list_instances()
               if (op := self.store.ops.find_operation_by_key(i.host, key)) is not None]
        ok = bool(ops) and all(op.state is OpState.SUCCEEDED for op in ops)
        self.store.ops.finish_request(
            key, RequestState.SUCCEEDED if ok else RequestState.FAILED,
            '{"replayed": "journal", "ok": %s}' % ("true" if ok else "false"))

    async def _remove_strays(self) -> list[int]:
        try:
            strays = await self.supervisor.remove_strays()
        except OSError as exc:
            log.warning("could not sweep stray process trees: %s", exc)
            return []
        for gen_id in strays:
            log.warning("removed the process tree of generation %s, which no live record "
                        "names", gen_id)
        return strays

    def _stray_report(self, strays: list[int]) -> list[dict[str, object]]:
        """Strays as `reconcile` reports them: under their instance when a record says."""
        by_host: dict[str, list[str]] = {}
        for gen_id in strays:
            gen = self.store.generations.get_generation(gen_id)
            by_host.setdefault(gen.instance if gen else "(unknown)", []).append(
                f"remove-tree generation {gen_id} (no live record names it)")
        return [{"instance": host, "actions": actions, "error": None}
                for host, actions in sorted(by_host.items())]

    async def reconcile_all(self, dry_run: bool) -> list[dict[str, object]]:
        """`keelway reconcile`: what boot does, on demand; --dry-run only plans."""
        strays = self.supervisor.strays() if dry_run else await self._remove_strays()
        report: list[dict[str, object]] = self._stray_report(strays)
        republish = False
        for inst in self.store.instances.list_instances():
            async with self.locks.instance(inst.host):
                if dry_run:
                    actions = self.reconciler.plan_for(inst.host, Pass.BOOT, self.locks.live_ops)
                    error = None
                else:
                    try:
                        outcome = await self.reconciler.reconcile(inst.host, Pass.BOOT,
                                                                  self.locks.live_ops)
                        actions, error = outcome.actions, None
                        republish = republish or outcome.republish
                    except FailedClosed as exc:
                        actions, error = [], str(exc)
            shown = [a.describe() for a in actions if a.kind.value != "republish"]
            report.append({"instance": inst.host, "actions": shown, "error": error})
        if republish and not dry_run:
            await self.publisher.publish()
        return report

    async def periodic(self) -> None:
        """The background pass: only *tries* each lock, never waits behind an operation."""
        while not self.closing:
            await self.clock.sleep(PERIODIC_S)
            try:
                await self._periodic_pass()
            except Exception as exc:
                # Protects the loop: a pass that fails (a full disk, say) is tried again
                # next time, and the loop never ends because of it.
                _log_pass_failure("periodic pass", exc)

    async def _periodic_pass(self) -> None:
        await self._remove_strays()
        # Read apart from the loop: at a thousand instances the survey held it for a
        # few hundred milliseconds every pass, in the middle of a rollout's requests.
        live = set(self.locks.live_ops)
        hosts, republish = await self.store.read_apart(
            lambda store: self.reconciler.survey(Pass.PERIODIC, live, store))
        for host in hosts:
            lock = self.locks.instance(host)
            if lock.locked():
                continue
            async with lock:
                try:
                    outcome = await self.reconciler.reconcile(host, Pass.PERIODIC,
                                                              self.locks.live_ops)
                    republish = republish or outcome.republish
                except FailedClosed as exc:
                    log.warning("periodic pass: %s", exc)
                except Exception as exc:
                    # One bad instance must not stop the pass for the others.
                    _log_pass_failure(f"periodic pass for {host}", exc)
        if republish:
            try:
                if not await self.publisher.in_sync():
                    await self.publisher.publish()
            except OperationError as exc:
                log.warning("periodic republish: %s", exc.message)

    def close(self) -> None:
        self.closing = True


def _log_pass_failure(what: str, exc: Exception) -> None:
    """A full disk is expected weather, said in one line every pass until there is room;
    anything else is a bug, logged with its traceback."""
    if disk_full(exc):
        log.warning("%s: %s", what, disk_full_message(exc))
    else:
        log.error("%s failed", what, exc_info=exc)
