"""The dependency cache: a build whose key matches links the installed tree instead of
installing it; an entry is used only whole; unused entries go with gc."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from keelway.builds import deps
from keelway.builds import gc as builds_gc
from keelway.builds.build_step import StepLimits
from keelway.builds.cache import ENTRY_META, CacheUnusable, DepsCache
from keelway.builds.stage import stage
from keelway.durable import TEMP_PREFIX, temp_path
from keelway.identity import Identity

MakeApp = Callable[..., Path]
NOTHING = "# nothing\n"  # the venv alone is cached; the same text as test_build_deps


def _site(build: Path) -> Path:
    (pip,) = (build / ".venv" / "lib").glob("python3.*/site-packages/pip/__init__.py")
    return pip


@pytest.mark.slow
def test_a_code_only_change_links_the_cached_venv_and_runs_no_install(
        make_app: MakeApp, builds_dir: Path, shared_cache: DepsCache) -> None:
    app = make_app(files={"requirements.txt": NOTHING, "app.py": "X = 1\n"})
    first = stage(app, builds_dir=builds_dir, app="demo", cache=shared_cache)
    (app / "app.py").write_text("X = 2\n")
    seen: list[str] = []
    second = stage(app, builds_dir=builds_dir, app="demo", cache=shared_cache,
                   progress=seen.append)
    assert first.digest != second.digest
    assert any(line.startswith("dependency cache: reusing .venv") for line in seen), seen
    assert "$ " not in (second.path / ".keelway-build.log").read_text()  # no step ran
    # the same inode, not a copy, and read-only for everyone
    one, two = os.stat(_site(first.path)), os.stat(_site(second.path))
    assert (one.st_ino, one.st_nlink >= 3) == (two.st_ino, True)
    assert not two.st_mode & 0o222
    # the venv's scripts name the new build's path, and its python runs there
    pip = (second.path / ".venv" / "bin" / "pip").read_text()
    assert pip.startswith(f"#!{second.path}/.venv/bin/python")
    assert os.stat(second.path / ".venv" / "bin" / "pip").st_ino != os.stat(
        first.path / ".venv" / "bin" / "pip").st_ino
    prefix = subprocess.run([str(second.path / ".venv/bin/python"), "-c",
                             "import sys; print(sys.prefix)"], capture_output=True,
                            text=True, check=True).stdout.strip()
    assert prefix == str(second.path / ".venv")


def test_the_key_changes_with_the_app_the_group_and_the_inputs(tmp_path: Path) -> None:
    def key(app: str = "demo", gid: int | None = None, inputs: str = "a") -> str:
        ctx = deps.Context(tree=tmp_path, env={}, log=io.BytesIO(), progress=print,
                           limits=StepLimits(deadline=0, timeout_s=1),
                           builder=None if gid is None else Identity(1, gid),
                           cache=None, app=app, scratch=tmp_path)
        return ctx.key("pip-requirements", inputs=inputs, python="cpython-3.11.7")

    assert key() == key()
    # one app's entry is never another's: its build could alter what it installed
    assert len({key(), key(app="other"), key(gid=5), key(inputs="b")}) == 4


def test_the_inputs_cover_included_files_and_a_local_path_is_never_cached(
        tmp_path: Path) -> None:
    (tmp_path / "requirements.txt").write_text("-r base.txt\n-c pins/c.txt\nflask\n")
    (tmp_path / "base.txt").write_text("django\n")
    (tmp_path / "pins").mkdir()
    (tmp_path / "pins" / "c.txt").write_text("django<6\n")
    before = deps.requirements_inputs(tmp_path)
    assert before is not None
    (tmp_path / "pins" / "c.txt").write_text("django<5\n")
    assert deps.requirements_inputs(tmp_path) not in (None, before)
    for local in ("-e ./lib", ".", "./pkg", "/abs/pkg", "pkg @ file:///x", "file:pkg"):
        (tmp_path / "base.txt").write_text(f"{local}\n")
        assert deps.requirements_inputs(tmp_path) is None, local


def test_an_entry_left_half_written_by_a_dead_writer_is_never_used_and_is_swept(
        tmp_path: Path) -> None:
    cache = DepsCache(tmp_path / "cache")
    cache.root.mkdir()
    key = "a" * 64
    dead = cache.root / f"{TEMP_PREFIX}{key}~999999999-1-0"  # no such pid
    (dead / "tree").mkdir(parents=True)
    (dead / ENTRY_META).write_text('{"origin": "/x"}')
    live = temp_path(cache.root / key)  # this process: a write in flight
    live.mkdir()
    assert cache.lookup(key) is None
    assert cache.sweep() == [dead]
    assert sorted(p.name for p in cache.root.iterdir()) == [live.name]


def test_publishing_a_key_twice_keeps_the_first_entry(tmp_path: Path) -> None:
    cache = DepsCache(tmp_path / "cache")
    tree = tmp_path / "venv"
    (tree / "lib").mkdir(parents=True)
    (tree / "lib" / "mod.py").write_text("A = 1\n")
    os.symlink("lib", tree / "lib64")
    assert cache.publish("k" * 64, tree, what="venv", owner_gid=None)
    assert not cache.publish("k" * 64, tree, what="venv", owner_gid=None)
    entry = cache.lookup("k" * 64)
    assert entry is not None and entry.origin == str(tree)
    assert os.readlink(entry.tree / "lib64") == "lib"
    assert os.stat(entry.tree / "lib" / "mod.py").st_ino == os.stat(tree / "lib/mod.py").st_ino
    assert [p.name for p in cache.root.iterdir()] == ["k" * 64]  # no temp left


@pytest.mark.slow
def test_gc_removes_cache_entries_no_build_links_and_keeps_used_ones(
        make_app: MakeApp, builds_dir: Path, tmp_path: Path) -> None:
    cache = DepsCache(tmp_path / "cache")
    app = make_app(files={"requirements.txt": NOTHING})
    build = stage(app, builds_dir=builds_dir, app="demo", cache=cache)
    assert builds_gc.collect_cache(cache) == []  # the build links its files
    assert builds_gc.collect(builds_dir, set()) == [("demo", build.digest)]
    (removed,) = builds_gc.collect_cache(cache)
    assert removed[1] > 1_000_000  # a venv with pip in it
    assert list(cache.root.iterdir()) == []


def test_a_cache_on_another_filesystem_is_not_used_and_leaves_nothing_behind(
        tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("no second filesystem to put the cache on")
    other = Path(tempfile.mkdtemp(dir=shm))
    try:
        cache = DepsCache(other / "cache")
        tree = tmp_path / "venv"
        tree.mkdir()
        (tree / "mod.py").write_text("A = 1\n")
        with pytest.raises(CacheUnusable, match="another filesystem"):
            cache.publish("k" * 64, tree, what="venv", owner_gid=None)
        assert list(cache.root.iterdir()) == []  # no half-written entry
        (cache.root / ("e" * 64) / "tree").mkdir(parents=True)
        (cache.root / ("e" * 64) / "tree" / "mod.py").write_text("A = 1\n")
        (cache.root / ("e" * 64) / ENTRY_META).write_text('{"origin": "/x"}')
        entry = cache.lookup("e" * 64)
        assert entry is not None
        with pytest.raises(CacheUnusable, match="another filesystem"):
            cache.link_into(entry, tmp_path / "dest")
        assert not (tmp_path / "dest").exists()
    finally:
        shutil.rmtree(other)
