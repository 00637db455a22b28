"""The journal stores kinds, not formatted names; a journal the old schema wrote (step
names built from strings) is migrated to kinds when the store opens it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from keelway.journal import OpKind, StepKind
from keelway.store import SqliteStore
from keelway.store.lifecycle import StepState
from keelway.store.schema import MIGRATIONS, current_version

# The schema before steps stored kinds.
OLD_SCHEMA = 3

# The kinds migration 4 knew: members are only ever appended, so they are the first 14.
KINDS_AT_V4 = list(StepKind)[:14]

SERVICE_OF = {StepKind.RELEASE_COMMAND: "release", StepKind.FAULT: None,
              StepKind.INSTANCE_KEY: None, StepKind.HOLD_EXEC: None,
              StepKind.WITHDRAW: None, StepKind.ACTIVATE: None, StepKind.PUBLISH: None,
              StepKind.SETTLE: None}


def _old_store(path: Path, names: list[tuple[str, str | None]]) -> None:
    """A store as keelway laid it down before kinds: one deploy with steps `names`."""
    conn = sqlite3.connect(path)
    for script in MIGRATIONS[:OLD_SCHEMA]:
        conn.executescript(script)
    conn.execute(f"PRAGMA user_version = {OLD_SCHEMA}")
    conn.execute("INSERT INTO operations(app, instance, kind, state, owner, created_at)"
                 " VALUES ('blog', 'a.test', 'deploy', 'succeeded', 'old', 1.0)")
    for seq, (name, service) in enumerate(names, start=1):
        conn.execute("INSERT INTO steps(op_id, seq, name, service, state, detail, started_at,"
                     " converged) VALUES (1, ?, ?, ?, 'succeeded', 'kept', 2.0, 1)",
                     (seq, name, service))
    conn.commit()
    conn.close()


def test_every_step_name_the_old_code_wrote_migrates_to_its_kind(tmp_path: Path) -> None:
    # The old code's names are exactly the labels `keelway ops` shows today.
    written = [(kind, SERVICE_OF.get(kind, "web")) for kind in KINDS_AT_V4]
    _old_store(tmp_path / "k.db", [(kind.label(service), service) for kind, service in written])
    store = SqliteStore(tmp_path / "k.db")
    op = store.ops.get_operation(1)
    assert op is not None and op.kind is OpKind.DEPLOY
    assert [(s.kind, s.service) for s in op.steps] == written
    assert [s.name for s in op.steps] == [kind.label(service) for kind, service in written]
    # Nothing else of the step changed on the way.
    assert all(s.state is StepState.SUCCEEDED and s.detail == "kept" and s.converged
               for s in op.steps)
    store.close()


def test_a_migrated_journal_takes_new_steps_after_its_old_ones(tmp_path: Path) -> None:
    _old_store(tmp_path / "k.db", [("stop worker (down)", "worker"), ("hold exec", None)])
    store = SqliteStore(tmp_path / "k.db")
    seq = store.ops.begin_step(1, StepKind.FAULT)
    assert seq == 3
    assert [s.kind for s in store.ops.steps(1)] == [StepKind.STOP_DOWN, StepKind.HOLD_EXEC,
                                               StepKind.FAULT]
    store.close()


def test_a_step_name_no_keelway_wrote_refuses_the_migration_and_changes_nothing(
        tmp_path: Path) -> None:
    _old_store(tmp_path / "k.db", [("spawn web", "web"), ("teleport web", "web")])
    with pytest.raises(sqlite3.IntegrityError):
        SqliteStore(tmp_path / "k.db")
    conn = sqlite3.connect(tmp_path / "k.db")
    assert current_version(conn) == OLD_SCHEMA
    assert conn.execute("SELECT name FROM steps ORDER BY seq").fetchall() == [
        ("spawn web",), ("teleport web",)]
    conn.close()


def test_a_new_journal_stores_the_kind_and_the_service_apart(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "k.db")
    op = store.ops.begin_operation("blog", "a.test", OpKind.RESTART, owner="me")
    store.ops.begin_step(op.id, StepKind.RETIRE, service="web")
    store.close()
    conn = sqlite3.connect(tmp_path / "k.db")
    assert conn.execute("SELECT kind FROM operations").fetchall() == [("restart",)]
    assert conn.execute("SELECT kind, service FROM steps").fetchall() == [("retire", "web")]
    conn.close()
