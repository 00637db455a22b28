"""A uid per instance, a group per app (keelway/identity.py), where keelway runs as root:
one tenant can read neither another's env file nor its database; web, workers, `run`,
release and build steps run as the tenant's identities; each instance's files are its
own and its app's builds are readable by the app's group alone. Without root (or with a
home other uids cannot reach), status and doctor say tenants share a uid."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from keelway.identity import ID_BASE
from tests.deploy.apps import hello
from tests.e2e.harness import Keelway, free_port

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="identities need root")]


def _ids(pid: int) -> tuple[int, int, list[int]]:
    fields = dict(line.split(":", 1) for line in
                  Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return (int(fields["Uid"].split()[0]), int(fields["Gid"].split()[0]),
            [int(g) for g in fields["Groups"].split()])


def _processes(kw: Keelway) -> dict[tuple[str, str], int]:
    found = {}
    for app in kw.ok("status", "--json").json()["apps"]:
        for inst in app["instances"]:
            for proc in inst["processes"]:
                if proc["pid"] and proc["state"] != "gone":
                    found[(inst["host"], proc["service"])] = int(proc["pid"])
    return found


def _app(root: Path, name: str) -> Path:
    app = hello(root, name, release_cmd="sh -c 'id -u > $KEELWAY_DATA_DIR/release.uid'")
    with (app / "keelway.toml").open("a") as toml:
        toml.write('[build]\ncommand = "id -u > build.uid"\n')
    return app


@pytest.fixture(scope="module")
def tenants() -> Iterator[Keelway]:
    """Two apps, three instances (two of blog, one of shop), in a home other uids reach."""
    base = Path(tempfile.mkdtemp(prefix="kw-ids-", dir="/tmp"))
    base.chmod(0o711)
    kw = Keelway(home=base / "kh", http_port=free_port())
    try:
        kw.up()
        kw.ok("deploy", "blog", str(_app(base, "blog")), "--host", "a.blog.test",
              "--host", "b.blog.test")
        kw.ok("deploy", "shop", str(_app(base, "shop")), "--host", "shop.test")
        yield kw
    finally:
        kw.teardown()
        shutil.rmtree(base, ignore_errors=True)


def test_each_instance_runs_as_a_uid_of_its_own_in_a_group_of_its_app(
        tenants: Keelway) -> None:
    kw = tenants
    procs = _processes(kw)
    a_uid, blog_gid, a_groups = _ids(procs[("a.blog.test", "web")])
    b_uid, b_gid, _ = _ids(procs[("b.blog.test", "web")])
    shop_uid, shop_gid, _ = _ids(procs[("shop.test", "web")])
    assert min(a_uid, b_uid, shop_uid, blog_gid, shop_gid) >= ID_BASE
    assert len({a_uid, b_uid, shop_uid}) == 3
    assert blog_gid == b_gid != shop_gid
    assert a_groups == [blog_gid]  # the app's group alone: nothing of root's
    assert _ids(procs[("a.blog.test", "worker")])[:2] == (a_uid, blog_gid)
    assert _ids(procs[("a.blog.test", "replica")])[0] == 0  # keelway's own program

    for host, uid in (("a.blog.test", a_uid), ("b.blog.test", b_uid)):
        data = kw.home / "data" / host
        for path, mode in ((data, 0o700), (data / "db.sqlite3", 0o600),
                           (kw.home / "env" / f"{host}.env", 0o600)):
            info = path.stat()
            assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (uid, mode), path
        # the release command ran as the instance, the build as neither root nor a tenant
        assert int((data / "release.uid").read_text()) == uid

    builds = kw.home / "builds" / "blog"
    build = next(p for p in builds.iterdir() if not p.name.startswith("."))
    builder_uid = int((build / "build.uid").read_text())
    assert builder_uid >= ID_BASE and builder_uid not in {a_uid, b_uid, shop_uid}
    for path in (build, build / "web.py", build / "Procfile"):
        info = path.lstat()
        assert (info.st_uid, info.st_gid) == (0, blog_gid), path
        assert not info.st_mode & 0o222, f"{path} is writable"
        assert not info.st_mode & 0o007, f"{path} is open to others"
        assert info.st_mode & stat.S_IRGRP, f"{path} is not readable by its group"

    # `keelway run` is the instance too
    out = kw.ok("run", "blog", "--instance", "a.blog.test", "--", "id", "-u").out
    assert int(out.strip()) == a_uid


def test_a_tenant_can_read_neither_another_tenants_env_file_nor_its_database(
        tenants: Keelway) -> None:
    kw = tenants
    home = kw.home
    attempts = {
        "the other's env file": ["cat", str(home / "env" / "b.blog.test.env")],
        "another app's env file": ["cat", str(home / "env" / "shop.test.env")],
        "the other's database": ["python3", "-c",
                                 "import sqlite3, sys; sqlite3.connect(sys.argv[1]).execute("
                                 "'select * from sqlite_master').fetchall()",
                                 str(home / "data" / "b.blog.test" / "db.sqlite3")],
        "the store": ["cat", str(home / "keelway.db")],
        "a listing of the home": ["ls", str(home)],
        "a listing of the data dirs": ["ls", str(home / "data")],
        "another app's build": ["ls", str(home / "builds" / "shop")],
    }
    for what, argv in attempts.items():
        result = kw.run("run", "blog", "--instance", "a.blog.test", "--", *argv)
        assert result.code != 0, f"a tenant read {what}: {result.out}"
    # ... while its own are its own
    own = kw.run("run", "blog", "--instance", "a.blog.test", "--", "cat",
                 str(home / "env" / "a.blog.test.env"))
    assert own.code == 0 and "KEELWAY_INSTANCE_KEY" in own.out


def test_status_and_doctor_say_whether_tenants_share_a_uid(
        kw_root: Keelway, kw: Keelway) -> None:
    kw_root.up()
    isolated = kw_root.ok("status", "--json").json()["isolation"]
    assert isolated["uid_per_instance"] is True and isolated["shared_because"] is None
    doctor = kw_root.ok("doctor", "--json").json()
    assert any(c["check"] == "uid per instance" and c["ok"] for c in doctor["checks"])

    kw.up()  # pytest's tmp_path: other uids cannot reach it
    shared = kw.ok("status", "--json").json()["isolation"]
    assert shared["uid_per_instance"] is False and "not searchable" in shared["shared_because"]
    assert "share" in kw.ok("status").out
    doctor = kw.run("doctor", "--json")
    check = next(c for c in doctor.json()["checks"] if c["check"] == "uid per instance")
    assert not check["ok"] and "not searchable" in check["detail"]
