"""Temp files and their sweep: a sweep takes only what a dead writer left."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

from keelway import durable
from keelway.router.table_file import load_table


def _writer_in_flight(target: Path, seconds: float) -> subprocess.Popen[bytes]:
    """Another process writing `target` and held between its temp file and the rename."""
    env = {**os.environ, "KEELWAY_FAILPOINTS": f"write.rename.{target.name}={seconds}"}
    code = ("import sys; from pathlib import Path; from keelway.durable import write_atomic;"
            "write_atomic(Path(sys.argv[1]), b'12 34\\n')")
    return subprocess.Popen([sys.executable, "-c", code, str(target)], env=env)


def _wait_for_temp(directory: Path) -> list[Path]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        temps = [p for p in directory.iterdir() if p.name.startswith(durable.TEMP_PREFIX)]
        if temps:
            return temps
        time.sleep(0.01)
    raise AssertionError("the writer never made its temp file")


def test_a_sweep_leaves_the_temp_file_of_a_live_writer_and_its_write_completes(
        tmp_path: Path) -> None:
    target = tmp_path / "router.pid"
    writer = _writer_in_flight(target, 1.0)
    try:
        temps = _wait_for_temp(tmp_path)
        assert durable.sweep_temp(tmp_path) == []
        assert all(p.exists() for p in temps)
        assert writer.wait(timeout=20) == 0
    finally:
        writer.kill()
        writer.wait()
    assert target.read_bytes() == b"12 34\n"


def test_the_routers_table_load_does_not_cut_the_control_planes_pid_file_write(
        tmp_path: Path) -> None:
    writer = _writer_in_flight(tmp_path / "router.pid", 1.0)
    try:
        _wait_for_temp(tmp_path)
        assert load_table(tmp_path / "routes.json") is None
        assert writer.wait(timeout=20) == 0
    finally:
        writer.kill()
        writer.wait()
    assert (tmp_path / "router.pid").exists()


def test_a_sweep_removes_what_a_dead_writer_left(tmp_path: Path) -> None:
    writer = _writer_in_flight(tmp_path / "table.json", 30.0)
    temps = _wait_for_temp(tmp_path)
    writer.kill()
    writer.wait()
    assert durable.sweep_temp(tmp_path) == temps
    assert list(tmp_path.iterdir()) == []


def test_a_temp_name_of_a_reused_pid_counts_as_orphaned(tmp_path: Path) -> None:
    # our own pid, with a start time that is not ours: a later process got the pid
    ticks = durable._start_ticks(os.getpid())
    assert ticks is not None
    stale = f"{durable.TEMP_PREFIX}x.json~{os.getpid()}-{ticks + 1}-0"
    live = durable.temp_path(tmp_path / "x.json").name
    assert durable.temp_orphaned(stale)
    assert not durable.temp_orphaned(live)
    assert not durable.temp_orphaned("x.json")


def test_a_temp_name_of_the_older_form_is_orphaned_only_when_its_pid_is_gone() -> None:
    assert not durable.temp_orphaned(f"{durable.TEMP_PREFIX}x.json.{os.getpid()}")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert durable.temp_orphaned(f"{durable.TEMP_PREFIX}x.json.{dead.pid}")


def test_two_writes_of_one_process_get_distinct_temp_names(tmp_path: Path) -> None:
    assert durable.temp_path(tmp_path / "a") != durable.temp_path(tmp_path / "a")


def test_a_databases_side_paths_are_its_wal_shm_and_journal_beside_it(tmp_path: Path) -> None:
    db = tmp_path / "data" / "db.sqlite3"
    assert durable.sqlite_side_paths(db) == (
        tmp_path / "data" / "db.sqlite3-wal", tmp_path / "data" / "db.sqlite3-shm",
        tmp_path / "data" / "db.sqlite3-journal")


# The one place besides durable.py that names SQLite's side files: swap.SIDES, derived
# from durable's list (the swap's order of moving them), which deploy/restore.py reads.
_NAMED_ELSEWHERE = {"data/swap.py"}


def _names_side_files(node: ast.AST) -> bool:
    """A list of SQLite's side files: the tuple itself, or two of its suffixes in a row
    (one `-wal` alone asks whether a database has one, which names no list)."""
    if isinstance(node, ast.Tuple | ast.List):
        return sum(isinstance(e, ast.Constant) and e.value in ("-wal", "-shm", "-journal")
                   for e in node.elts) >= 2
    name = (node.id if isinstance(node, ast.Name) else node.attr
            if isinstance(node, ast.Attribute) else node.name
            if isinstance(node, ast.alias) else None)
    return name == "SQLITE_SIDE_FILES"


def test_sqlites_side_files_are_named_once_in_durable() -> None:
    package = Path(durable.__file__).parent
    naming = {str(path.relative_to(package)) for path in package.rglob("*.py")
              if any(_names_side_files(node) for node in ast.walk(ast.parse(path.read_text())))}
    assert naming - {"durable.py"} <= _NAMED_ELSEWHERE, naming
