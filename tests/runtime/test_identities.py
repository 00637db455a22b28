"""A uid per instance (keelway/identity.py, keelway/runtime/identities.py), with real
files, real processes and the real store; the tests that need root say so."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from keelway import identity
from keelway.builds.stage import stage
from keelway.home import Home
from keelway.identity import ID_BASE, Identity
from keelway.runtime import process
from keelway.runtime.identities import Identities
from keelway.store import SqliteStore
from keelway.store.lifecycle import GenState
from keelway.store.records import Generation

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="taking a uid needs root")


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A directory other uids can pass through (pytest's tmp_path is 0700 all the way)."""
    base = Path(tempfile.mkdtemp(prefix="kw-id-", dir="/tmp"))
    base.chmod(0o711)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _gen(app: str, host: str, gen_id: int = 1) -> Generation:
    return Generation(id=gen_id, app=app, instance=host, service="web", release=1,
                      build_digest="d" * 64, op_id=None, state=GenState.PLANNED,
                      created_at=0.0, exited_at=None,
                      exit_code=None, version=1)


def test_tenants_share_a_uid_when_the_home_is_out_of_other_uids_reach(tmp_path: Path) -> None:
    why = identity.in_force(tmp_path / "kh")
    assert why is not None
    if os.geteuid() == 0:
        assert "not searchable by other users" in why and "KEELWAY_HOME" in why
    else:
        assert "does not run as root" in why


@needs_root
def test_a_data_dir_made_while_tenants_shared_a_uid_is_handed_over_whole_at_the_first_spawn(
        reachable: Path) -> None:
    home = Home(reachable / "kh")
    home.ensure()
    store = SqliteStore(home.store_path)
    try:
        store.apps.ensure_app("blog")
        store.instances.ensure_instance("a.blog.test", "blog")
        ids = Identities(store, home)
        assert ids.in_force
        data = home.data_dir("a.blog.test")
        (data / "uploads").mkdir(parents=True)
        (data / "uploads" / "cat.png").write_bytes(b"png")
        home.db_path("a.blog.test").write_bytes(b"")
        ident = ids.for_spawn(_gen("blog", "a.blog.test"), reachable)
        assert ident is not None and ident.uid >= ID_BASE
        for path in (data, data / "uploads", data / "uploads" / "cat.png",
                     home.db_path("a.blog.test")):
            assert path.stat().st_uid == ident.uid, path
        assert ids.files_not_owned("blog", "a.blog.test") == []
        # the same host gets the same uid for ever; another host another one
        assert ids.of_instance("blog", "a.blog.test") == ident
        store.instances.ensure_instance("b.blog.test", "blog")
        other = ids.of_instance("blog", "b.blog.test")
        assert other is not None and other.uid != ident.uid and other.gid == ident.gid
    finally:
        store.close()


@needs_root
@pytest.mark.parametrize("start", ["vfork", "fork"])
def test_a_process_spawned_as_an_identity_has_its_uid_its_group_alone_and_cannot_read_roots(
        reachable: Path, monkeypatch: pytest.MonkeyPatch, start: str) -> None:
    """Taken by setpriv after a vfork-style start, or in the forked child (the fallback:
    process.py's docstring): the same uid, group and groups either way."""
    if start == "fork":
        monkeypatch.setattr(process, "_vfork_start", False)
    secret = reachable / "secret"
    secret.write_text("root's")
    secret.chmod(0o600)
    code = ("import os, sys; print(os.getuid(), os.getgid(), os.getgroups());"
            "open(sys.argv[1]).read()")
    ident = Identity(ID_BASE + 900, ID_BASE + 901)

    python = next((p for p in (sys.executable, "/usr/bin/python3")
                   if identity.reachable(Path(p).resolve().parent)), None)
    if python is None:
        pytest.skip("no Python here that other uids can run")

    async def scenario() -> int:
        spawned = await process.spawn([python, "-c", code, str(secret)],
                                      cwd=reachable, env=dict(os.environ),
                                      log_path=reachable / "out.log", identity=ident)
        return await spawned.proc.wait()

    assert asyncio.run(scenario()) != 0
    out = (reachable / "out.log").read_text()
    assert f"{ident.uid} {ident.gid} [{ident.gid}]" in out and "PermissionError" in out


@needs_root
def test_a_build_runs_as_its_builder_and_is_sealed_roots_readable_by_its_group_alone(
        reachable: Path) -> None:
    app = reachable / "src"
    app.mkdir()
    (app / "Procfile").write_text("web: python3 -m http.server $PORT\n")
    (app / "keelway.toml").write_text(
        '[build]\ncommand = "id -u > built-by && id -G >> built-by"\n')
    builder = Identity(ID_BASE + 910, ID_BASE + 911)
    builds = reachable / "builds"
    staged = stage(app, builds_dir=builds, app="blog", builder=builder)
    assert (staged.path / "built-by").read_text().split() == [str(builder.uid),
                                                              str(builder.gid)]
    app_dir = builds / "blog"
    assert (app_dir.stat().st_uid, app_dir.stat().st_gid) == (0, builder.gid)
    assert stat.S_IMODE(app_dir.stat().st_mode) == 0o710
    for path in (staged.path, staged.path / "Procfile", staged.path / "built-by"):
        info = path.lstat()
        assert (info.st_uid, info.st_gid) == (0, builder.gid), path
        assert info.st_mode & stat.S_IRGRP and not info.st_mode & 0o227, oct(info.st_mode)
