"""Recovery: what runs without a user asking. Crash restarts with backoff, the boot
pass that converges every instance after a control-plane start, `keelway reconcile`,
and the periodic pass that only ever tries a lock, never waits behind an operation.
"""

from __future__ import annotations

import asyncio

from keelway.builds.manifest import ServiceKind
from keelway.deploy import targets
from keelway.deploy.attempt import Outcome
from keelway.deploy.core import DeployerCore, log
from keelway.deploy.errors import OperationError
from keelway.reconcile.apply import FailedClosed
from keelway.reconcile.plan import Mode as Pass
from keelway.runtime.backoff import Backoff
from keelway.store.lifecycle import InstanceState, OpState, RequestState
from keelway.store.records import Generation

PERIODIC_S = 5.0


class Recovery(DeployerCore):
    async def on_exit(self, gen: Generation, code: int | None) -> None:
        """A watched generation exited on its own: restart it (with backoff) if published.

        A worker that exits 0 has completed (a one-shot) and is not restarted; web is.
        """
        active = self.store.get_active(gen.instance, gen.service)
        inst = self.store.get_instance(gen.instance)
        self.store.add_event("exit", f"{gen.service} generation {gen.id} exited (code {code})",
                             app=gen.app, instance=gen.instance)
        if (self.closing or active is None or active.generation_id != gen.id or inst is None
                or inst.state is not InstanceState.RUNNING):
            return
        if gen.op_id in self.live_ops:
            return  # it died while its own operation watches it settle: that op decides
        target = targets.target_of(self.store, gen)
        spec = target.manifest.services.get(gen.service) if target else None
        if code == 0 and spec is not None and spec.kind is ServiceKind.WORKER:
            return
        backoff = self._backoff.setdefault((gen.instance, gen.service), Backoff())
        delay = backoff.delay_after_crash(self.clock.monotonic())
        self._restarts[(gen.instance, gen.service)] = asyncio.get_running_loop().create_task(
            self._restart_later(gen, delay))

    async def _restart_later(self, gen: Generation, delay_s: float) -> None:
        await self.clock.sleep(delay_s)
        if self.closing:
            return
        async with self.lock(gen.instance):
            self._restarts.pop((gen.instance, gen.service), None)
            inst = self.store.get_instance(gen.instance)
            active = self.store.get_active(gen.instance, gen.service)
            if (inst is None or inst.state is not InstanceState.RUNNING or active is None
                    or active.generation_id != gen.id):
                return  # something newer took over while we waited
            result = await self._journaled(gen.app, gen.instance, "restart-crashed",
                                           lambda op: self._respawn_active(op, inst))
            try:
                await self._reconcile_locked(gen.instance, Pass.MUTATION)
            except OperationError as exc:
                log.warning("after a crash restart: %s", exc.message)
        if result.outcome is not Outcome.DONE:
            fresh = self.store.get_active(gen.instance, gen.service)
            latest = self.store.get_generation(fresh.generation_id) if fresh else None
            if latest is not None:
                await self.on_exit(latest, latest.exit_code)

    async def boot(self) -> None:
        """After a control-plane start: reconcile every instance (adopt survivors, remove
        candidates of interrupted operations, restart what should run), settle keyed
        requests that a crash interrupted, and publish the whole route table.

        A router that does not answer in time (alive, but starved or stopped) does not
        stop the boot: the router keeps serving its last table, and the periodic pass
        republishes once it answers and differs from the store."""
        for inst in self.store.list_instances():
            async with self.lock(inst.host):
                try:
                    await self.reconciler.reconcile(inst.host, Pass.BOOT, self.live_ops)
                except FailedClosed as exc:
                    log.warning("%s", exc)
                except OperationError as exc:
                    log.warning("boot: %s: %s; the periodic pass retries", inst.host,
                                exc.message)
                targets.link_current(self.store, self.home, inst.host)
        for request in self.store.running_requests():
            self.settle_request_from_journal(request.key)
        try:
            await self.publisher.publish()
        except OperationError as exc:
            log.warning("boot: %s; the periodic pass republishes", exc.message)

    def settle_request_from_journal(self, key: str) -> None:
        ops = [op for i in self.store.list_instances()
               if (op := self.store.find_operation_by_key(i.host, key)) is not None]
        ok = bool(ops) and all(op.state is OpState.SUCCEEDED for op in ops)
        self.store.finish_request(
            key, RequestState.SUCCEEDED if ok else RequestState.FAILED,
            '{"replayed": "journal", "ok": %s}' % ("true" if ok else "false"))

    async def reconcile_all(self, dry_run: bool) -> list[dict[str, object]]:
        """`keelway reconcile`: what boot does, on demand; --dry-run only plans."""
        report: list[dict[str, object]] = []
        republish = False
        for inst in self.store.list_instances():
            async with self.lock(inst.host):
                if dry_run:
                    actions = self.reconciler.plan_for(inst.host, Pass.BOOT, self.live_ops)
                    error = None
                else:
                    try:
                        outcome = await self.reconciler.reconcile(inst.host, Pass.BOOT,
                                                                  self.live_ops)
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
            republish = False
            for inst in self.store.list_instances():
                lock = self.lock(inst.host)
                if lock.locked():
                    continue
                async with lock:
                    try:
                        outcome = await self.reconciler.reconcile(inst.host, Pass.PERIODIC,
                                                                  self.live_ops)
                        republish = republish or outcome.republish
                    except FailedClosed as exc:
                        log.warning("periodic pass: %s", exc)
                    except Exception:
                        # Protects the periodic loop: one bad instance must not stop it.
                        log.exception("periodic pass failed for %s", inst.host)
            if republish:
                try:
                    if not await self.publisher.in_sync():
                        await self.publisher.publish()
                except OperationError as exc:
                    log.warning("periodic republish: %s", exc.message)

    async def close(self) -> None:
        self.closing = True
        for task in list(self._restarts.values()):
            task.cancel()
