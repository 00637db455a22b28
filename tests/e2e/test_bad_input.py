"""Bad input gets a clear error and leaves every record as it was."""

from __future__ import annotations

import io
import shutil
import socket
import tarfile
from pathlib import Path

import pytest

from tests.e2e.harness import EXAMPLE, Keelway

pytestmark = pytest.mark.slow


def _hostile_tarball(path: Path) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in (("Procfile", b"web: python3 web.py\n"), ("../../escape.txt", b"x")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _deployed(kw: Keelway) -> None:
    kw.up()
    kw.ok("deploy", "hello", str(EXAMPLE), "--host", "one.test")


def test_a_hostile_tarball_is_refused_and_changes_nothing(kw: Keelway, tmp_path: Path) -> None:
    _deployed(kw)
    before = kw.store_dump()
    result = kw.run("deploy", "hello", str(_hostile_tarball(tmp_path / "evil.tar.gz")))
    assert result.code == 1
    assert "../../escape.txt" in result.err and "Traceback" not in result.err
    assert kw.store_dump() == before
    assert not (tmp_path / "escape.txt").exists()
    assert not (kw.home / "escape.txt").exists()
    assert kw.get("one.test")[0] == 200


def test_a_procfile_without_web_is_refused_and_changes_nothing(kw: Keelway, tmp_path: Path) -> None:
    _deployed(kw)
    app = tmp_path / "noweb"
    app.mkdir()
    (app / "Procfile").write_text("worker: python3 -c 'import time; time.sleep(9)'\n")
    before = kw.store_dump()
    result = kw.run("deploy", "hello", str(app), "--json")
    assert result.code == 1
    error = result.json()["error"]
    assert "web" in error["message"]
    assert kw.store_dump() == before


def test_an_app_that_exits_at_once_keeps_the_previous_release_serving(
    kw: Keelway, tmp_path: Path
) -> None:
    _deployed(kw)
    broken = tmp_path / "broken"
    shutil.copytree(EXAMPLE, broken)
    (broken / "Procfile").write_text("web: python3 -c 'raise SystemExit(3)'\n"
                                     "worker: python3 worker.py\n")
    before = kw.store_dump()
    pids_before = kw.app_pids()
    result = kw.run("deploy", "hello", str(broken))
    assert result.code == 1
    assert "exited before it was ready" in result.err
    assert "keelway logs hello" in result.err
    after = kw.store_dump()
    # The failed build is recorded as staged (unpinned, so `gc` may remove it); every
    # other record is exactly as it was.
    after_builds = after.pop("builds")
    before_builds = before.pop("builds")
    # Scheduling an attempt advances the instance's schedule revision (the supersession
    # token, #3) whether or not the attempt succeeds; nothing else may move.
    for dump in (before, after):
        for inst in dump["instances"]:
            inst.pop("schedule_rev")
    assert after == before
    assert next(b for b in after_builds if b not in before_builds)["good"] == 0
    assert kw.app_pids() == pids_before
    assert kw.get("one.test")[1].startswith(b"hello from one.test (v1)")
    ops = kw.ok("ops", "hello", "--json").json()["operations"]
    assert ops[0]["state"] == "failed" and "exited before it was ready" in ops[0]["error"]


def test_a_first_deploy_that_fails_leaves_no_process_and_no_route(
    kw: Keelway, tmp_path: Path
) -> None:
    kw.up()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "Procfile").write_text("web: python3 -c 'raise SystemExit(3)'\n")
    result = kw.run("deploy", "hello", str(broken), "--host", "one.test")
    assert result.code == 1 and "exited before it was ready" in result.err
    dump = kw.store_dump()
    assert dump["releases"] == [] and dump["active"] == [] and dump["routes"] == []
    assert dump["port_claims"] == []
    assert kw.get("one.test")[0] == 404


def test_a_router_port_already_in_use_is_a_clear_error_and_touches_no_store(
    kw: Keelway,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", kw.http_port))
        taken.listen(1)
        result = kw.run("up", "-d", "--http", f"127.0.0.1:{kw.http_port}")
    assert result.code == 4
    assert "already in use" in result.err and "--http" in result.err
    assert not (kw.home / "keelway.db").exists()
    assert not (kw.home / "api.sock").exists()


def test_a_second_control_plane_on_the_same_home_is_refused(kw: Keelway) -> None:
    kw.up()
    result = kw.run("up", "-d", "--http", f"127.0.0.1:{kw.http_port}")
    assert result.code == 3 and "already running" in result.err
    assert kw.get("nobody.test")[0] == 404  # the first one still serves


def test_an_unknown_app_and_a_bad_hostname_are_clear_errors(kw: Keelway) -> None:
    kw.up()
    result = kw.run("status", "nope", "--json")
    assert result.code == 1 and result.json()["error"]["code"] == "not-found"
    result = kw.run("deploy", "hello", str(EXAMPLE), "--host", "Bad_Host!")
    assert result.code == 1 and "not a valid hostname" in result.err
    assert kw.store_dump()["apps"] == []
