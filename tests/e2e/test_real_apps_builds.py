"""Real apps nobody wrote for keelway deploy on the first try, with no [build] command:
a Django site (requirements.txt, a `release` that migrates KEELWAY_DB, gunicorn) and an
Express app with a lockfile and no Procfile. A code-only redeploy reuses the installed
dependencies from the cache.

Every test here shares one dependency cache (KEELWAY_BUILD_CACHE), so the suite installs
each dependency set from the registries once."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from keelway.builds.cache import CACHE_ENV
from tests.e2e.harness import Keelway

pytestmark = pytest.mark.slow

APPS = Path(__file__).resolve().parent / "apps"


@pytest.fixture(autouse=True)
def _cache_env(deps_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(CACHE_ENV, str(deps_cache))
    yield


def _copy(name: str, dest: Path) -> Path:
    app = dest / name
    shutil.copytree(APPS / name, app, ignore=shutil.ignore_patterns("__pycache__",
                                                                   "node_modules"))
    return app


def _deploy(kw: Keelway, app: str, source: Path, *hosts: str) -> tuple[float, str]:
    started = time.monotonic()
    args = [a for host in hosts for a in ("--host", host)]
    result = kw.ok("deploy", app, str(source), *args, timeout_s=300)
    return time.monotonic() - started, result.err


@pytest.mark.timeout(300)  # its first deploy installs Django and gunicorn from PyPI
def test_a_django_site_deploys_first_try_and_a_code_only_redeploy_reuses_its_dependencies(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    site = _copy("django_site", tmp_path)
    _took, progress = _deploy(kw, "site", site, "site.test")
    assert "creating a virtualenv" in progress or "dependency cache: reusing" in progress
    status, body, _ = kw.get("site.test")
    assert status == 200, body
    assert body == b"notes: 1 in v1\n"  # the table exists: `release` ran migrate
    assert kw.get("site.test")[1] == b"notes: 2 in v1\n"

    views = site / "notes" / "views.py"
    views.write_text(views.read_text().replace('GREETING = "notes"', 'GREETING = "memos"'))
    took, progress = _deploy(kw, "site", site)
    assert "dependency cache: reusing .venv" in progress, progress
    assert "pip install" not in progress and "creating a virtualenv" not in progress
    status, body, _ = kw.get("site.test")
    assert (status, body) == (200, b"memos: 3 in v2\n")  # the same database, migrated
    # the two builds share the installed files rather than holding a copy each
    builds = sorted((kw.home / "builds" / "site").iterdir())
    django_init = [b / ".venv/lib/python3.11/site-packages/django/__init__.py"
                   for b in builds if not b.name.startswith(".")]
    assert len(django_init) == 2
    assert os.stat(django_init[0]).st_ino == os.stat(django_init[1]).st_ino
    # no install: staging, the release command, boot and a 1 s settle
    assert took < 30, f"the code-only redeploy took {took:.1f} s"


@pytest.mark.timeout(300)  # installs express from npm
def test_an_express_app_with_a_lockfile_and_no_procfile_deploys_first_try(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    app = _copy("node_lockfile", tmp_path)
    _took, progress = _deploy(kw, "express", app, "express.test")
    assert "npm ci" in progress or "dependency cache: reusing node_modules" in progress
    status, body, _ = kw.get("express.test")
    assert (status, body) == (200, b"express on express.test (v1)\n")
    # its code-only redeploy: the test with a uid per tenant below


def test_an_engines_node_the_box_lacks_is_refused_before_any_install(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    app = _copy("node_lockfile", tmp_path)
    package = app / "package.json"
    package.write_text(package.read_text().replace('">=18"', '">=99"'))
    result = kw.run("deploy", "express", str(app), "--host", "express.test", "--json")
    assert result.code != 0
    error = result.json()["error"]
    assert "engines.node asks for '>=99'" in error["message"]
    assert "this box has node" in error["message"]
    assert kw.ok("apps", "--json").json().get("apps", []) == []


def _tiny(root: Path, toml: str) -> Path:
    app = root / "tiny"
    app.mkdir(exist_ok=True)
    (app / "Procfile").write_text("web: python3 -m http.server $PORT --bind 127.0.0.1\n")
    (app / "keelway.toml").write_text(toml)
    return app


def test_gc_frees_the_builds_of_releases_beyond_keep_and_says_how_much(
        kw: Keelway, tmp_path: Path) -> None:
    kw.up()  # with a replicator, whose generation names the first build it ran beside
    app = _tiny(tmp_path, '[releases]\nkeep = 1\n[services.web]\nsettle = "0.2s"\n')
    digests = []
    for n in range(4):
        (app / "page.txt").write_text(f"version {n}\n" * 20_000)
        digests.append(kw.ok("deploy", "tiny", str(app), "--host", "tiny.test",
                             "--json").json()["build"])
    dry = kw.ok("gc", "--dry-run", "--json").json()
    assert sorted(b["digest"] for b in dry["removed"]) == sorted(digests[:2])
    assert (kw.home / "builds" / "tiny" / digests[0]).is_dir()  # a dry run removes nothing
    human = kw.ok("gc").out
    # v4 is kept (keep = 1) and v3 as the good build a failed deploy of v4 falls back to
    assert f"removed tiny build {digests[0][:12]}" in human
    assert "freed " in human and " in 2 builds" in human
    assert sorted(p.name for p in (kw.home / "builds" / "tiny").iterdir()
                  if not p.name.startswith(".")) == sorted(digests[2:])
    assert kw.ok("gc", "--json").json()["freed_bytes"] == 0
    assert kw.get("tiny.test", "/page.txt")[1].startswith(b"version 3\n")


def test_a_failed_build_shows_its_output_once(kw: Keelway, tmp_path: Path) -> None:
    kw.up()
    # the command's text is not its output, which the progress streams once
    app = _tiny(tmp_path, '[build]\ncommand = "echo the-build-\'\'broke; exit 3"\n')
    human = kw.run("deploy", "tiny", str(app), "--host", "tiny.test")
    assert human.code != 0
    assert human.err.count("the-build-broke") == 1, human.err
    assert "the [build] command failed with exit code 3" in human.err
    as_json = kw.run("deploy", "tiny", str(app), "--host", "tiny.test", "--json")
    assert "the-build-broke" in as_json.json()["error"]["message"]  # no progress shown there


@pytest.mark.timeout(300)  # installs express from npm
def test_with_a_uid_per_tenant_the_shared_files_are_readable_by_the_app_and_writable_by_none(
        kw_root: Keelway, tmp_path: Path) -> None:
    kw = kw_root
    kw.up()
    app = _copy("node_lockfile", tmp_path)
    kw.ok("deploy", "express", str(app), "--host", "express.test", timeout_s=300)
    server = app / "server.js"
    server.write_text(server.read_text().replace('greeting = "express"',
                                                 'greeting = "tenant express"'))
    progress = kw.ok("deploy", "express", str(app), timeout_s=300).err
    assert "dependency cache: reusing node_modules" in progress, progress
    assert kw.get("express.test")[1] == b"tenant express on express.test (v2)\n"
    builds = [b for b in (kw.home / "builds" / "express").iterdir()
              if not b.name.startswith(".")]
    infos = [os.stat(b / "node_modules" / "express" / "package.json") for b in builds]
    assert len({i.st_ino for i in infos}) == 1  # one inode, two builds
    (info,) = {(i.st_uid, i.st_gid, i.st_mode & 0o777) for i in infos}
    uid, gid, mode = info
    assert uid == 0 and gid != 0  # root's, the app's group's
    assert mode == 0o440  # the group reads; nobody writes; others see nothing
