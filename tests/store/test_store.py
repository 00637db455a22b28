from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from keelway.durable import sync_deferred
from keelway.journal import OpKind, StepKind
from keelway.store import Conflict, SqliteStore, Store, StoreError
from keelway.store import sqlite as sqlite_store
from keelway.store.lifecycle import GenState, IllegalTransition, OpState, StepState
from keelway.store.records import Generation
from keelway.store.schema import MIGRATIONS, current_version
from keelway.testing import reads
from keelway.testing.clock import FakeClock


def _gen(store: Store, port: int | None = 4000, service: str = "web") -> int:
    store.apps.ensure_app("blog")
    store.instances.ensure_instance("a.test", "blog")
    return store.plan_generation(app="blog", instance="a.test", service=service,
                                             release=1,
                                             build_digest="d" * 64, op_id=None, port=port).id


def _read(store: Store, gen_id: int) -> Generation:
    gen = store.generations.get_generation(gen_id)
    assert gen is not None
    return gen


def test_a_new_store_is_migrated_to_the_latest_schema(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "k.db")
    conn = sqlite3.connect(tmp_path / "k.db")
    assert current_version(conn) == len(MIGRATIONS)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.close()


def test_reopening_a_store_applies_no_migration_twice(tmp_path: Path) -> None:
    SqliteStore(tmp_path / "k.db").close()
    store = SqliteStore(tmp_path / "k.db")
    assert store.apps.list_apps() == []
    store.close()


def test_a_store_from_a_newer_keelway_is_refused(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "k.db")
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    conn.close()
    with pytest.raises(RuntimeError, match="newer"):
        SqliteStore(tmp_path / "k.db")


def test_a_failed_transaction_leaves_nothing_behind(store: SqliteStore) -> None:
    with pytest.raises(ZeroDivisionError), store.db.tx("a test write"):
        store.apps.ensure_app("blog")
        _ = 1 / 0
    assert store.apps.get_app("blog") is None


def test_a_port_claim_is_exclusive_and_freed_when_the_generation_is_gone(store: Store) -> None:
    gen = _gen(store, port=4000)
    with pytest.raises(Conflict, match="port 4000"):
        _gen(store, port=4000)
    assert store.local.claimed_ports() == {4000}
    store.record_spawn(_read(store, gen), pid=10, start_ticks=20)
    store.record_gone(gen, exit_code=0)
    assert store.local.claimed_ports() == set()
    _gen(store, port=4000)


def test_a_failed_claim_writes_no_generation(store: Store) -> None:
    _gen(store, port=4000)
    with pytest.raises(Conflict):
        _gen(store, port=4000)
    assert len(store.generations.live_generations()) == 1


def test_a_gone_generation_cannot_come_back(store: Store) -> None:
    gen = _gen(store)
    store.record_gone(gen, None)
    with pytest.raises(IllegalTransition):
        store.generations.set_generation_state(_read(store, gen), GenState.RUNNING)


def test_a_finished_operation_cannot_be_finished_again(store: Store) -> None:
    op = store.ops.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me")
    done = store.ops.finish_operation(op, OpState.SUCCEEDED)
    assert done.terminal
    with pytest.raises(IllegalTransition):
        store.ops.finish_operation(done, OpState.FAILED)


def test_a_stale_operation_version_loses_the_compare_and_swap(store: Store) -> None:
    op = store.ops.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me")
    store.ops.begin_step(op.id, StepKind.SPAWN, service="web")
    fresh = store.ops.get_operation(op.id)
    assert fresh is not None
    store.ops.finish_operation(fresh, OpState.FAILED, error="x")
    with pytest.raises((Conflict, IllegalTransition)):
        store.ops.finish_operation(op, OpState.SUCCEEDED)


def test_steps_are_numbered_and_keep_their_outcomes(store: Store) -> None:
    op = store.ops.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me")
    first = store.ops.begin_step(op.id, StepKind.SPAWN, service="web", after_gen=3)
    second = store.ops.begin_step(op.id, StepKind.READY, service="web")
    store.ops.finish_step(op.id, first, StepState.SUCCEEDED, detail="pid 9")
    store.ops.finish_step(op.id, second, StepState.FAILED, error="exited")
    steps = store.ops.steps(op.id)
    assert [(s.seq, s.state, s.detail, s.error) for s in steps] == [
        (1, StepState.SUCCEEDED, "pid 9", None),
        (2, StepState.FAILED, None, "exited"),
    ]


def test_an_idempotency_key_names_one_operation_per_instance(store: Store) -> None:
    store.ops.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me", key="k1")
    # The store's own error, not its backend's: a PostgreSQL store passes the same test.
    with pytest.raises(Conflict, match="already has key"):
        store.ops.begin_operation("blog", "a.test", OpKind.DEPLOY, owner="me", key="k1")
    store.ops.begin_operation("blog", "b.test", OpKind.DEPLOY, owner="me", key="k1")


def test_releases_are_numbered_per_app(store: Store) -> None:
    store.apps.ensure_app("blog")
    store.apps.ensure_app("shop")
    assert store.builds.create_release("blog", "a" * 64, {}, "first").number == 1
    assert store.builds.create_release("blog", "b" * 64, {}, "second").number == 2
    assert store.builds.create_release("shop", "c" * 64, {}, "first").number == 1
    assert [r.label for r in store.builds.list_releases("blog")] == ["v2", "v1"]


def test_builds_named_by_releases_or_live_generations_are_pinned(store: Store) -> None:
    store.apps.ensure_app("blog")
    store.builds.create_release("blog", "r" * 64, {}, "x")
    gen = _gen(store)
    assert store.builds.pinned_builds() == {("blog", "r" * 64), ("blog", "d" * 64)}
    store.record_gone(gen, None)
    assert store.builds.pinned_builds() == {("blog", "r" * 64)}


def test_the_route_table_version_only_grows(store: Store) -> None:
    first = store.routes.next_route_table_version()
    assert store.routes.next_route_table_version() == first + 1
    assert store.routes.next_route_table_version(at_least=100) == 101


def test_events_are_listed_oldest_first_and_kept_per_app(store: Store, clock: FakeClock) -> None:
    store.ops.add_event("op", "one", app="blog")
    clock.advance(1)
    store.ops.add_event("op", "two", app="blog")
    store.ops.add_event("op", "other", app="shop")
    assert [e.message for e in store.ops.list_events("blog")] == ["one", "two"]


def test_a_crash_backoff_survives_reopening_and_goes_stale_once_active_moves_on(
    tmp_path: Path, clock: FakeClock
) -> None:
    from keelway.store.records import CrashRetry

    store = SqliteStore(tmp_path / "k.db", clock)
    crashed = _gen(store)
    store.generations.set_active("a.test", "web", crashed, expected=None)
    store.record_gone(crashed, 7)
    store.record_crash(CrashRetry("a.test", "web", crashed, 4, clock.now(), clock.now() + 60))
    store.close()
    store = SqliteStore(tmp_path / "k.db", clock)  # as a restarted control plane does
    assert [(r.generation_id, r.failures,
             r.retry_at) for r in store.generations.pending_retries()] == [
        (crashed, 4, clock.now() + 60)]
    successor = _gen(store, port=4001)
    store.generations.set_active("a.test", "web", successor,
                                 expected=store.generations.get_active("a.test", "web"))
    assert store.generations.pending_retries("a.test") == []  # the retry belonged to the old one
    assert store.generations.get_crash_retry("a.test", "web") is not None  # its count is kept
    store.close()


def test_a_driver_error_at_the_edge_becomes_a_store_error_naming_what_was_asked(
        tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "k.db")
    store.close()  # every statement now fails inside sqlite3
    with pytest.raises(StoreError, match="ensure app blog") as raised:
        store.apps.ensure_app("blog")
    assert isinstance(raised.value.__cause__, sqlite3.Error)
    with pytest.raises(StoreError, match="read"):
        store.apps.list_apps()


def test_a_read_apart_is_one_snapshot_and_cannot_write(tmp_path: Path) -> None:
    """`read_apart` reads over a read-only connection of its own inside one read
    transaction: a commit of the writer meanwhile is not in its picture, and a write
    through it is refused with nothing written."""
    store = SqliteStore(tmp_path / "k.db", FakeClock())
    store.apps.ensure_app("blog")

    def read(reader: Store) -> tuple[list[str], list[str]]:
        before = [a.name for a in reader.apps.list_apps()]
        store.apps.ensure_app("shop")  # the writer commits while the read is open
        return before, [a.name for a in reader.apps.list_apps()]

    assert asyncio.run(store.read_apart(read)) == (["blog"], ["blog"])
    assert asyncio.run(store.read_apart(
        lambda r: [a.name for a in r.apps.list_apps()])) == ["blog", "shop"]
    with pytest.raises(StoreError):
        asyncio.run(store.read_apart(lambda r: r.apps.ensure_app("nope")))
    assert [a.name for a in store.apps.list_apps()] == ["blog", "shop"]
    store.close()


def test_a_commit_in_a_deferred_scope_leaves_its_fsync_to_the_next_durable_one(
        tmp_path: Path) -> None:
    """keelway/durable.py: in WAL mode, NORMAL commits without an fsync, and the next
    FULL commit's fsync covers it; a transaction nested in another takes the outer's."""
    store = SqliteStore(tmp_path / "k.db", FakeClock())
    db = store.db

    def synchronous() -> int:
        with db.tx("look") as conn:
            return int(conn.execute("PRAGMA synchronous").fetchone()[0])

    full, normal = 2, 1
    assert synchronous() == full
    with sync_deferred():
        assert synchronous() == normal
        with sync_deferred(False):
            assert synchronous() == full
        store.apps.ensure_app("blog")
    assert synchronous() == full
    store.close()
    assert [a.name for a in SqliteStore(tmp_path / "k.db", FakeClock()).apps.list_apps()] == [
        "blog"]


def test_a_sync_makes_deferred_commits_durable_with_one_fsync_for_all_who_wait(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group commit: operations ending together each ask; one fsync of the WAL, in a
    worker thread, answers every one that asked before it began."""
    store = SqliteStore(tmp_path / "k.db", FakeClock())
    fsyncs: list[int] = []
    real = store.db.fsync_log

    def counted() -> None:
        fsyncs.append(store.db.committed)
        real()

    monkeypatch.setattr(store.db, "fsync_log", counted)
    with sync_deferred():
        for name in ("blog", "shop", "wiki"):
            store.apps.ensure_app(name)
    assert store.db.synced < store.db.committed

    async def ending_together() -> None:
        await asyncio.gather(*(store.sync() for _ in range(5)))
        await store.sync()  # nothing written since: no fsync

    asyncio.run(ending_together())
    assert fsyncs == [store.db.committed] and store.db.synced == store.db.committed
    store.apps.ensure_app("docs")  # a durable commit is synced by itself
    assert store.db.synced == store.db.committed
    store.close()


def test_a_read_aside_runs_in_a_process_of_its_own_over_one_snapshot(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """keelway/store/aside.py: the read runs in another interpreter (its pid is not
    ours), sees what was committed before it, answers what it raised as raised, and
    its process ends when the store closes."""
    monkeypatch.setattr(sqlite_store, "ASIDE_FROM", 0)
    store = SqliteStore(tmp_path / "k.db", FakeClock())
    store.apps.ensure_app("blog")

    async def twice() -> tuple[tuple[int, list[str]], tuple[int, list[str]]]:
        first = await store.read_aside(reads.pid_and_apps)
        store.apps.ensure_app("shop")
        return first, await store.read_aside(reads.pid_and_apps)

    (pid, before), (again, after) = asyncio.run(twice())
    assert pid != os.getpid() and again == pid  # one process, kept
    assert (before, after) == (["blog"], ["blog", "shop"])
    with pytest.raises(StoreError):
        asyncio.run(store.read_aside(reads.writes))
    store.close()
    assert process_gone(pid)


def test_a_read_aside_whose_process_died_is_made_in_a_new_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_store, "ASIDE_FROM", 0)
    store = SqliteStore(tmp_path / "k.db", FakeClock())
    store.apps.ensure_app("blog")
    pid = asyncio.run(store.read_aside(reads.pid_and_apps))[0]
    assert pid != os.getpid()  # read aside, not in a thread (never kill ourselves)
    os.kill(pid, signal.SIGKILL)
    again, apps = asyncio.run(store.read_aside(reads.pid_and_apps))
    assert again != pid and apps == ["blog"]
    store.close()


def test_a_small_store_reads_aside_in_a_thread(tmp_path: Path) -> None:
    """Below ASIDE_FROM instances a process costs more than it saves."""
    store = SqliteStore(tmp_path / "k.db", FakeClock())
    store.apps.ensure_app("blog")
    assert asyncio.run(store.read_aside(reads.pid_and_apps)) == (os.getpid(), ["blog"])
    store.close()


def process_gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False
