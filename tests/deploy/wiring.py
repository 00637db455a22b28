"""The deploy parts wired as the daemon wires them, on a fresh store and home in a test's
temp dir: real processes and files, a fake clock, no daemon and no router."""

from __future__ import annotations

from pathlib import Path

from keelway.api.daemon import DeployParts, wire
from keelway.deploy.publisher import Publisher
from keelway.home import Home
from keelway.runtime.supervisor import Supervisor
from keelway.store import SqliteStore
from keelway.store.records import Generation
from keelway.testing.clock import FakeClock


def wired(tmp_path: Path, publisher: type[Publisher] = Publisher,
          ) -> tuple[DeployParts, SqliteStore, Home]:
    store = SqliteStore(tmp_path / "keelway.db", FakeClock())
    home = Home(tmp_path / "home")
    home.ensure()
    clock = FakeClock()

    async def on_exit(_gen: Generation, _code: int | None) -> None:
        return None

    deploy = wire(store, home, Supervisor(store, home, clock, on_exit),
                  publisher(store, home.router_socket), clock, "test")
    return deploy, store, home
