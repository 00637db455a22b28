"""Replicas by hand: what a replica holds, restoring a database from it, and the drill.

A part beside `Restore` and `Snapshots` (wired in keelway/api/daemon.py); the
replicators themselves follow their instances through `Recovery.keep_replica` and the
reconciler. Rules:
- Restore from a replica is the one restore of keelway/deploy/restore.py (the copy
  restored by litestream beside the database and verified before anything changes;
  then hold, stop, swap, the replica reset, start): nothing of it is here.
- A drill restores each instance's newest snapshot and its replica to temp files and
  verifies both, changing nothing; each copy's result is an event (`drill` or
  `drill-failed`). The failures are written after the successes, so the newest drill
  event of an instance, the one `status` shows, is a failure if any copy failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from keelway.data.replicas import Drill, ReplicaError
from keelway.deploy import instances
from keelway.deploy.errors import OperationError
from keelway.deploy.replica_keeper import ReplicaKeeper
from keelway.deploy.restore import Restore, Restored
from keelway.deploy.snapshots import Snapshots
from keelway.store import Store


@dataclass(eq=False)
class Replication:
    store: Store
    keeper: ReplicaKeeper
    restorer: Restore
    snapshots: Snapshots

    async def position(self, host: str) -> dict[str, Any]:
        """`db replicas H`: what the replica holds."""
        inst = instances.named(self.store, host)
        try:
            pos = await self.keeper.required().position(host)
        except ReplicaError as exc:
            raise OperationError(str(exc)) from None
        return {"host": host, "app": inst.app, **pos.view()}

    async def restore(self, host: str, at: str | None = None) -> Restored:
        """`db restore H --from-replica [--at]`: keelway/deploy/restore.py."""
        return await self.restorer.restore_replica(host, at)

    # -- drill -----------------------------------------------------------------------

    async def drill(self, host: str | None = None) -> list[dict[str, Any]]:
        """Restore the newest snapshot and the latest replica of `host` (or of every
        instance) to temp files and verify them. A copy an instance has none of yet is
        reported skipped; every other result is an event."""
        hosts = [instances.named(self.store, host).host] if host is not None else [
            i.host for i in self.store.instances.list_instances()]
        results: list[dict[str, Any]] = []
        for name in hosts:
            inst = instances.named(self.store, name)
            snap = await self._drill_snapshot(name)
            replica = await self._drill_replica(name)
            checked = [c for c in (snap, replica) if "skipped" not in c]
            for copy, said in (("snapshot", snap), ("replica", replica)):
                if said.get("ok") is True:
                    self.store.ops.add_event("drill", f"{copy}: {said['message']}",
                                             app=inst.app, instance=name)
            for copy, said in (("snapshot", snap), ("replica", replica)):
                if said.get("ok") is False:
                    self.store.ops.add_event("drill-failed", f"{copy}: {said['reason']}",
                                             app=inst.app, instance=name)
            result: dict[str, Any] = {
                "host": name, "ok": all(c["ok"] for c in checked) if checked else None,
                "snapshot": snap, "replica": replica,
                "checked": [copy for copy, said in (("snapshot", snap), ("replica", replica))
                            if "skipped" not in said]}
            if not checked:
                result["skipped"] = "no snapshot and no replica yet"
            else:
                result["reason"] = "; ".join(f"{copy}: {said['reason']}" for copy, said in
                                             (("snapshot", snap), ("replica", replica))
                                             if said.get("ok") is False) or None
            results.append(result)
        return results

    async def _drill_snapshot(self, host: str) -> dict[str, Any]:
        done = await self.snapshots.drill_snapshot(host)
        if done.ok is None:
            return {"ok": None, "skipped": done.reason}
        snap_id = done.snapshot.id if done.snapshot else None
        if done.ok:
            size = done.snapshot.size if done.snapshot else None
            return {"ok": True, "id": snap_id, "size_bytes": size, "reason": None,
                    "message": f"snapshot {snap_id} restored ({size} bytes) and verified"}
        return {"ok": False, "id": snap_id, "reason": done.reason}

    async def _drill_replica(self, host: str) -> dict[str, Any]:
        replicas = self.keeper.replicas
        if replicas is None or not replicas.enabled:
            return {"ok": None, "skipped": "replication is off"}
        try:
            pos = await replicas.position(host)
        except ReplicaError as exc:
            return {"ok": False, "reason": str(exc), "size_bytes": None, "txid": None}
        if not pos.files:
            return {"ok": None, "skipped": "no replica yet"}
        drill: Drill = await replicas.drill(host)
        if drill.ok:
            return {"ok": True, "reason": None, "size_bytes": drill.size_bytes,
                    "txid": pos.latest_txid,
                    "message": f"replica restored ({drill.size_bytes} bytes) and verified"}
        return {"ok": False, "reason": drill.reason, "size_bytes": drill.size_bytes,
                "txid": pos.latest_txid}
