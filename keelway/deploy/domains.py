"""Domains: the aliases of an instance, more hosts that serve it (SPEC §2).

A host names one instance or one alias (keelway/store/hosts.py): every alias is
checked by the host rule and against every name in use before anything changes, and
added or removed under its instance's lock, then published.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from keelway.deploy import instances
from keelway.deploy.errors import NotFoundError, UserError
from keelway.deploy.locks import Locks
from keelway.deploy.publisher import Publisher
from keelway.store import NotFound, Store
from keelway.store.hosts import HostTaken
from keelway.store.records import Alias


@dataclass(eq=False)
class Domains:
    store: Store
    publisher: Publisher
    locks: Locks

    async def add_aliases(self, host: str, aliases: Sequence[str]) -> list[Alias]:
        inst = instances.named(self.store, host)
        instances.check_hosts(self.store, aliases)
        async with self.locks.instance(inst.host):
            try:
                found = self.store.instances.add_aliases(inst.host, list(aliases))
            except HostTaken as exc:
                raise instances.taken(exc) from None
            if self.store.routes.get_route(inst.host) is not None:
                await self.publisher.publish(inst.host)
            else:
                await instances.publish_pages(self.publisher)
        return found

    async def remove_aliases(self, host: str, aliases: Sequence[str]) -> list[Alias]:
        inst = instances.named(self.store, host)
        if not aliases:
            raise UserError("name at least one alias")
        async with self.locks.instance(inst.host):
            try:
                found = self.store.instances.remove_aliases(inst.host, list(aliases))
            except NotFound as exc:
                raise NotFoundError(str(exc), hint=f"see `keelway domains list {host}`") \
                    from None
            await self.publisher.publish()
        return found
