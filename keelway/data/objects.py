"""Object stores: where snapshots and their manifests live, behind one interface.

Rules every store keeps (one contract suite, tests/data/test_objects_contract.py, runs
against each):
- `put_file` stores the whole object or nothing: a reader never sees a torn object, and
  a failed put leaves what was under the key before (locally: temp → fsync → rename →
  fsync dir; on S3: a PUT or a multipart upload, which S3 makes visible only whole).
- `get_file` writes `dest` the same way, so a crash mid-download never leaves a
  partial file under its final name; a missing key raises `ObjectNotFound`.
- `list(prefix)` returns the keys under `prefix`, sorted; `delete` is idempotent, and so
  is `delete_prefix`, which removes every key under a `/`-ended prefix (a replica is
  many objects) and nothing beside it.
- Keys are `/`-separated segments, each one safe path component (`check_key`), so a key
  can never name a file outside a local store's root.

Key naming (one place): `instances/<host>/snapshots/<id>.db` and `<id>.json` (manifest).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from keelway.durable import PRIVATE_FILE_MODE, TEMP_PREFIX, fsync_dir, temp_path
from keelway.home import PRIVATE_DIR_MODE, Home

_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


class ObjectStoreError(Exception):
    """The object store could not do what was asked (unreachable, refused, bad URL)."""


class ObjectNotFound(ObjectStoreError):
    """No object under that key."""

    def __init__(self, key: str) -> None:
        super().__init__(f"no object {key}")
        self.key = key


def check_key(key: str) -> str:
    """`key` if every segment is a safe path component (no `..`, no leading dot, no
    empty segment); raises ObjectStoreError otherwise."""
    parts = key.split("/")
    if not key or len(key) > 1024 or not all(_SEGMENT.fullmatch(p) for p in parts):
        raise ObjectStoreError(f"{key!r} is not a valid object key")
    return key


def instance_prefix(host: str) -> str:
    """Everything the store keeps of `host` but its replica (keelway/data/replicas.py)."""
    return f"instances/{host}/"


def snapshot_prefix(host: str) -> str:
    return f"{instance_prefix(host)}snapshots/"


def snapshot_key(host: str, snap_id: str) -> str:
    return f"{snapshot_prefix(host)}{snap_id}.db"


def manifest_key(host: str, snap_id: str) -> str:
    return f"{snapshot_prefix(host)}{snap_id}.json"


class ObjectStore(Protocol):
    """Where snapshots live. Every method may raise ObjectStoreError."""

    @property
    def url(self) -> str: ...

    def put_file(self, key: str, path: Path) -> None: ...

    def adopt_file(self, key: str, path: Path) -> None:
        """`put_file`, then `path` is gone (the store may move it in rather than copy it:
        a snapshot's temp file becomes the object). On failure `path` is left."""

    def get_file(self, key: str, dest: Path, *, synced: bool = True) -> None:
        """Download `key` to `dest` (0600); ObjectNotFound if there is none. With `synced`
        false the copy is not fsynced: the caller (a restore's staging) fsyncs it beside
        its verification, before anything trusts it."""

    def list(self, prefix: str) -> list[str]: ...

    def delete(self, key: str) -> None: ...

    def delete_prefix(self, prefix: str) -> int:
        """Delete every key under `prefix` (which ends in `/`); how many there were."""

    def exists(self, key: str) -> bool: ...


def check_prefix(prefix: str) -> str:
    """`prefix` if it is a key followed by `/`: a prefix that is not a whole segment
    (`replicas/a.test`) would also take `replicas/a.test.more/`."""
    if not prefix.endswith("/"):
        raise ObjectStoreError(f"{prefix!r} is not a prefix (it must end in /)")
    check_key(prefix[:-1])
    return prefix


def _copy_durable(src: Path, dest: Path, synced: bool = True) -> None:
    """Copy `src` to `dest` (0600) so `dest` is the old file or the whole new one after a
    crash at any point; a failure (a full disk) removes the temp file and leaves `dest`.
    Not `synced`: neither the copy nor its dir is fsynced (see ObjectStore.get_file)."""
    tmp = temp_path(dest)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
        with os.fdopen(fd, "wb") as out, open(src, "rb") as source:
            # In the kernel, not through Python buffers: a 200 MB snapshot copies at
            # the disk's speed.
            size = os.fstat(source.fileno()).st_size
            offset = 0
            while offset < size:
                sent = os.sendfile(out.fileno(), source.fileno(), offset, size - offset)
                if sent == 0:
                    break
                offset += sent
            if synced:
                os.fsync(out.fileno())
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if synced:
        fsync_dir(dest.parent)


@dataclass(frozen=True)
class LocalObjects:
    """A directory as an object store (default `$KEELWAY_HOME/objects`)."""

    root: Path

    @property
    def url(self) -> str:
        return f"file://{self.root}"

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def put_file(self, key: str, path: Path) -> None:
        dest = self._path(key)
        dest.parent.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        _copy_durable(Path(path), dest)

    def adopt_file(self, key: str, path: Path) -> None:
        dest = self._path(key)
        dest.parent.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        try:
            os.chmod(path, PRIVATE_FILE_MODE)
            os.replace(path, dest)  # whole or not at all; the caller fsynced it
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            _copy_durable(Path(path), dest)
            Path(path).unlink()
        fsync_dir(dest.parent)

    def get_file(self, key: str, dest: Path, *, synced: bool = True) -> None:
        src = self._path(key)
        if not src.is_file():
            raise ObjectNotFound(key)
        _copy_durable(src, Path(dest), synced)

    def list(self, prefix: str) -> list[str]:
        return sorted(key for key in self._walk() if key.startswith(prefix))

    def _walk(self) -> Iterator[str]:
        if not self.root.is_dir():
            return
        for directory, _dirs, files in os.walk(self.root):
            for name in files:
                if not name.startswith(TEMP_PREFIX):  # a put a crash cut short
                    yield str((Path(directory) / name).relative_to(self.root))

    def delete(self, key: str) -> None:
        path = self._path(key)
        if path.exists():
            path.unlink()
            fsync_dir(path.parent)

    def delete_prefix(self, prefix: str) -> int:
        directory = self.root / check_prefix(prefix)
        count = len(self.list(prefix))
        if directory.is_dir():
            # The whole directory: a replica's empty level directories and a crashed
            # put's temp files are under the prefix too.
            shutil.rmtree(directory)
            fsync_dir(directory.parent)
        return count

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()


class S3Objects:
    """An S3-compatible bucket (under `prefix`) through boto3; the endpoint, region and
    credentials come from the usual AWS variables (AWS_ENDPOINT_URL included)."""

    def __init__(self, bucket: str, prefix: str = "", client: Any = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        if client is None:
            try:
                import boto3  # only an S3 store pays for importing it
            except ImportError as exc:
                raise ObjectStoreError("an S3 object store needs boto3 (pip install "
                                       "boto3)") from exc

            client = boto3.client(
                "s3", region_name=os.environ.get("AWS_REGION")
                or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1")
        self._client = client

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def _full(self, key: str) -> str:
        return self.prefix + check_key(key)

    def put_file(self, key: str, path: Path) -> None:
        try:
            self._client.upload_file(str(path), self.bucket, self._full(key))
        except Exception as exc:  # boto3 raises many kinds; all mean "not stored"
            raise ObjectStoreError(f"put {key} to {self.url}: {exc}") from exc

    def adopt_file(self, key: str, path: Path) -> None:
        self.put_file(key, path)
        Path(path).unlink()

    def get_file(self, key: str, dest: Path, *, synced: bool = True) -> None:
        dest = Path(dest)
        tmp = temp_path(dest)
        try:
            self._client.download_file(self.bucket, self._full(key), str(tmp))
            os.chmod(tmp, PRIVATE_FILE_MODE)
            if synced:
                with open(tmp, "rb") as handle:
                    os.fsync(handle.fileno())
            os.replace(tmp, dest)
        except Exception as exc:
            tmp.unlink(missing_ok=True)
            if _is_missing(exc):
                raise ObjectNotFound(key) from None
            if isinstance(exc, ObjectStoreError | OSError):
                raise
            raise ObjectStoreError(f"get {key} from {self.url}: {exc}") from exc
        fsync_dir(dest.parent)

    def list(self, prefix: str) -> list[str]:
        keys: list[str] = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix + prefix)
            for page in pages:
                keys.extend(item["Key"][len(self.prefix):] for item in page.get("Contents", []))
        except Exception as exc:
            raise ObjectStoreError(f"list {prefix} in {self.url}: {exc}") from exc
        return sorted(keys)

    def delete(self, key: str) -> None:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._full(key))
        except Exception as exc:
            if not _is_missing(exc):
                raise ObjectStoreError(f"delete {key} in {self.url}: {exc}") from exc

    def delete_prefix(self, prefix: str) -> int:
        keys = self.list(check_prefix(prefix))
        for start in range(0, len(keys), 1000):  # DeleteObjects takes 1000 at most
            batch = [{"Key": self.prefix + k} for k in keys[start:start + 1000]]
            try:
                answer = self._client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            except Exception as exc:
                raise ObjectStoreError(f"delete {prefix} in {self.url}: {exc}") from exc
            errors = [e for e in answer.get("Errors", [])
                      if str(e.get("Code")) not in {"404", "NoSuchKey", "NotFound"}]
            if errors:
                raise ObjectStoreError(f"delete {prefix} in {self.url}: "
                                       f"{errors[0].get('Key')}: {errors[0].get('Message')}")
        return len(keys)

    def exists(self, key: str) -> bool:
        try:
            self._client.head_object(Bucket=self.bucket, Key=self._full(key))
        except Exception as exc:
            if _is_missing(exc):
                return False
            raise ObjectStoreError(f"look up {key} in {self.url}: {exc}") from exc
        return True


def _is_missing(exc: BaseException) -> bool:
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return False
    code = str(response.get("Error", {}).get("Code", ""))
    return code in {"404", "NoSuchKey", "NotFound"}


def parse_url(url: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://BUCKET/PREFIX`; raises ObjectStoreError otherwise."""
    if not url.startswith("s3://"):
        raise ObjectStoreError(f"{url!r} is not an object store URL (use s3://BUCKET/PREFIX)")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", bucket):
        raise ObjectStoreError(f"{bucket!r} is not an S3 bucket name")
    if prefix.strip("/"):
        check_key(prefix.strip("/"))
    return bucket, prefix


def open_objects(url: str | None, home: Home) -> ObjectStore:
    """The store `url` names (`s3://BUCKET/PREFIX`), or the home's local one for None."""
    if url is None:
        return LocalObjects(home.objects_dir)
    bucket, prefix = parse_url(url)
    return S3Objects(bucket, prefix)
