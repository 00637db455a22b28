"""`records`: a store with the records an operation's plan reads, built through the
Store protocol alone (apps, instances, builds, generations, ACTIVE), so a plan test runs
daemon-less on any backend the fixture hands out."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from keelway.store import Store
from keelway.store.lifecycle import InstanceState
from keelway.store.records import Generation, Instance
from keelway.testing.clock import FakeClock
from keelway.testing.memory_store import MemoryStore

DIGEST = "sha256:" + "ab" * 32
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hello"


@dataclass
class Records:
    """Builders of the records a plan reads; `store` is what the plan is given."""

    store: Store
    builds: Path  # where the staged builds of `running` are laid down

    def instance(self, host: str = "a.test", app: str = "shop",
                 state: InstanceState = InstanceState.RUNNING) -> Instance:
        self.store.apps.ensure_app(app)
        inst = self.store.instances.ensure_instance(host, app)
        if state is InstanceState.PARKED:
            inst = self.store.park(inst)
        elif state is not inst.state:
            inst = self.store.instances.set_instance_state(inst, state)
        return inst

    def running(self, host: str, service: str = "web", *, pid: int = 4242,
                active: bool = True) -> Generation:
        """A generation of `service` recorded running (its pid need not be alive: a
        plan reads records, never /proc), ACTIVE unless `active` is False."""
        inst = self.store.instances.get_instance(host)
        assert inst is not None, f"records.instance({host!r}) first"
        build = self.builds / inst.app
        if not build.exists():
            # A staged build is a directory with its manifest (and the code it runs).
            shutil.copytree(EXAMPLE, build)
        self.store.builds.record_build(inst.app, DIGEST, str(build))
        if not self.store.builds.list_releases(inst.app):
            self.store.builds.create_release(inst.app, DIGEST, {}, "Deploy")
        gen = self.store.plan_generation(app=inst.app, instance=host, service=service,
                                                     release=1, build_digest=DIGEST, op_id=None,
                                                     port=None)
        gen = self.store.record_spawn(gen, pid, 1)
        if active:
            self.store.generations.set_active(host, service, gen.id,
                                              expected=self.store.generations.get_active(
                                                  host, service))
        return gen

    def gone(self, gen: Generation, exit_code: int | None = 1) -> Generation:
        """`gen` recorded gone (it exited, or was proven gone)."""
        return self.store.record_gone(gen.id, exit_code)


@pytest.fixture
def records(tmp_path: Path) -> Iterator[Records]:
    # The in-memory store: a plan reads records through the protocol alone, so its
    # tests need no file and no daemon (the contract suite proves the two backends alike).
    store = MemoryStore(FakeClock())
    yield Records(store, tmp_path / "builds")
    store.close()
