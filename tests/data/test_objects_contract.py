"""One contract for every object store, run against a local directory and a real S3
server (seaweedfs on loopback, tests/data/conftest.py)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from keelway.data.objects import (
    LocalObjects,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    S3Objects,
    open_objects,
)
from keelway.home import Home

pytestmark = pytest.mark.slow


@pytest.fixture(params=["local", "s3"])
def objects(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return LocalObjects(tmp_path / "objects")
    server = request.getfixturevalue("s3_env")
    # A fresh prefix per test: the bucket is shared by the session.
    return S3Objects(server.bucket, f"t-{secrets.token_hex(4)}")


def _file(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_a_put_object_reads_back_whole(objects: ObjectStore, tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024 + 7)
    objects.put_file("instances/a.test/snapshots/x.db", _file(tmp_path, "in", data))
    objects.get_file("instances/a.test/snapshots/x.db", tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == data
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o600


def test_a_put_replaces_the_object_under_its_key(objects: ObjectStore, tmp_path: Path) -> None:
    objects.put_file("k/one", _file(tmp_path, "a", b"first"))
    objects.put_file("k/one", _file(tmp_path, "b", b"second"))
    objects.get_file("k/one", tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == b"second"


def test_a_missing_key_raises_not_found_and_writes_no_file(objects: ObjectStore,
                                                           tmp_path: Path) -> None:
    with pytest.raises(ObjectNotFound):
        objects.get_file("k/none", tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
    assert objects.exists("k/none") is False


def test_list_returns_the_keys_under_a_prefix_sorted(objects: ObjectStore,
                                                     tmp_path: Path) -> None:
    src = _file(tmp_path, "in", b"x")
    for key in ("p/b.json", "p/a.db", "p/a.json", "q/c.db", "pp/d.db"):
        objects.put_file(key, src)
    assert objects.list("p/") == ["p/a.db", "p/a.json", "p/b.json"]
    assert objects.list("nothing/") == []


def test_delete_is_idempotent(objects: ObjectStore, tmp_path: Path) -> None:
    objects.put_file("k/gone", _file(tmp_path, "in", b"x"))
    assert objects.exists("k/gone")
    objects.delete("k/gone")
    objects.delete("k/gone")
    assert not objects.exists("k/gone")
    assert objects.list("k/") == []


def test_delete_prefix_takes_every_key_under_it_and_nothing_beside(
        objects: ObjectStore, tmp_path: Path) -> None:
    src = _file(tmp_path, "in", b"x")
    kept = ["replicas/a.test.more/ltx/0/1.ltx", "replicas/b.test/ltx/0/1.ltx", "replicas/a.tes"]
    gone = ["replicas/a.test/ltx/0/1.ltx", "replicas/a.test/ltx/1/2.ltx",
            "replicas/a.test/seed-1/ltx/0/1.ltx"]
    for key in kept + gone:
        objects.put_file(key, src)
    assert objects.delete_prefix("replicas/a.test/") == 3
    assert objects.list("replicas/") == sorted(kept)
    assert objects.delete_prefix("replicas/a.test/") == 0  # idempotent
    with pytest.raises(ObjectStoreError):
        objects.delete_prefix("replicas/a.tes")  # not a whole segment: refused


def test_adopt_stores_the_file_and_takes_it_away(objects: ObjectStore, tmp_path: Path) -> None:
    src = _file(tmp_path, "in", b"adopted")
    objects.adopt_file("k/adopted", src)
    assert not src.exists()
    objects.get_file("k/adopted", tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == b"adopted"


@pytest.mark.parametrize("key", ["../escape", "a/../../b", "/abs", "a//b", ".hidden", ""])
def test_a_key_that_could_leave_the_store_is_refused(objects: ObjectStore, tmp_path: Path,
                                                     key: str) -> None:
    with pytest.raises(ObjectStoreError):
        objects.put_file(key, _file(tmp_path, "in", b"x"))


def test_open_objects_picks_the_local_store_or_s3(tmp_path: Path) -> None:
    home = Home(tmp_path)
    local = open_objects(None, home)
    assert isinstance(local, LocalObjects) and local.root == home.objects_dir
    with pytest.raises(ObjectStoreError):
        open_objects("ftp://x/y", home)
    with pytest.raises(ObjectStoreError):
        open_objects("s3://No_Such_Bucket/x", home)
