"""A seed's files: the verified copy, the database an import lays down with its
`<db>.seed` marker, and the names an import writes into the instance's env file.

No I/O decision lives here, only file effects and checks that the rollback
(keelway/deploy/seeding.py) runs as journaled steps. Each effect is idempotent, so a
step cut short by a crash is simply run again:
- Nothing is trusted until opened: `verify_sqlite` opens a file read-only, asks
  `PRAGMA integrity_check` and hashes it; a copy is verified again where it lands.
- Every file that must survive: temp, fsync, rename, fsync of the directory.
- The marker is laid down before the database and removed after it, so while any of
  the import's database is on disk the marker that proves it is the import's is too.
- The env file: the import writes the instance key, KEELWAY_DB and DATABASE_URL (the
  env file is read last into every process, so the import's database is what the
  instance opens). `retire_import_env` puts exactly those names back as `env_before`
  had them, and touches nothing else. Values never leave this module but into the file.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from keelway.data.swap import litestream_state
from keelway.data.verify import Damaged, verify_file
from keelway.durable import SQLITE_SIDE_FILES, TEMP_PREFIX, fsync_dir, write_atomic
from keelway.runtime.environment import INSTANCE_KEY, read_env_file, write_env_file

MARKER_SUFFIX = ".seed"
# The names an import writes into the instance's env file (and the rollback puts back).
IMPORT_ENV_NAMES = (INSTANCE_KEY, "KEELWAY_DB", "DATABASE_URL")
_CHUNK_BYTES = 1 << 20


class SeedRefused(Exception):
    """A copy that failed verification (or could not be read); nothing was changed."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Verified:
    sha256: str
    size_bytes: int


def mint_seed_id() -> str:
    """A new seed id (names.SEED_ID), never reused: 64 random bits."""
    return f"seed-{secrets.token_hex(8)}"


def verify_sqlite(path: Path) -> Verified:
    """Open `path` read-only, check `PRAGMA integrity_check` is ok, and hash it; raises
    `SeedRefused` saying what is wrong. The file itself is never written.

    One check for every copy keelway trusts (keelway/data/verify.py), said as a
    refusal of the seed."""
    if not path.is_file():
        raise SeedRefused(f"{path} is not a file")
    try:
        checked = verify_file(path)
    except Damaged as exc:
        raise SeedRefused(f"{path} is not a usable SQLite database: {exc.message}") from None
    return Verified(checked.sha256, checked.size)


def store_copy(source: Path, dest: Path) -> Verified:
    """A consistent copy of the SQLite file `source` at `dest` (the backup API, so a
    source in WAL mode comes whole), fsynced and renamed into place, then verified
    where it landed. Raises `SeedRefused`, leaving no file at `dest`, when the copy
    does not verify. A crash leaves a temp file the boot sweep removes."""
    dest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = dest.with_name(f"{TEMP_PREFIX}{dest.name}.{os.getpid()}")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    try:
        src = sqlite3.connect(f"{source.absolute().as_uri()}?mode=ro", uri=True)
        try:
            out = sqlite3.connect(tmp)
            try:
                src.backup(out)
            finally:
                out.close()
        finally:
            src.close()
        for side in SQLITE_SIDE_FILES:
            Path(f"{tmp}{side}").unlink(missing_ok=True)
        _fsync_file(tmp)
        os.replace(tmp, dest)
        fsync_dir(dest.parent)
    except sqlite3.Error as exc:
        tmp.unlink(missing_ok=True)
        raise SeedRefused(f"{source} could not be copied: {exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:
        return verify_sqlite(dest)
    except SeedRefused:
        dest.unlink(missing_ok=True)
        raise


def marker_of(db: Path) -> Path:
    return db.with_name(db.name + MARKER_SUFFIX)


def local_seed_id(db: Path) -> str | None:
    """The seed the `<db>.seed` marker names; None when there is no marker. An
    unreadable marker raises OSError: the caller cannot tell whose data it is."""
    try:
        return marker_of(db).read_text().strip() or None
    except FileNotFoundError:
        return None


def lay_down(copy: Path, db: Path, seed: str, sha256: str) -> None:
    """The import's database at `db`, a byte copy of the verified `copy`, with its
    marker naming `seed` laid down first. Whatever SQLite files were at `db` go (they
    can only be an earlier run of this same step: the import refused a path held by
    anyone else). Raises `SeedRefused` if the copy no longer hashes to `sha256`."""
    db.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomic(marker_of(db), f"{seed}\n".encode())
    for side in SQLITE_SIDE_FILES:
        Path(f"{db}{side}").unlink(missing_ok=True)
    tmp = db.with_name(f"{TEMP_PREFIX}{db.name}.{os.getpid()}")
    digest = hashlib.sha256()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with copy.open("rb") as src:
            while chunk := src.read(_CHUNK_BYTES):
                digest.update(chunk)
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    if digest.hexdigest() != sha256:
        tmp.unlink(missing_ok=True)
        raise SeedRefused(f"the stored copy {copy.name} changed since it was verified")
    os.replace(tmp, db)
    fsync_dir(db.parent)


def remove_local(db: Path) -> list[str]:
    """The import's local data gone: the database and its side files (the state its
    replicator kept beside it too), then the marker last. Idempotent; returns the
    names it removed."""
    removed = []
    state = litestream_state(db)
    if state.is_dir():
        shutil.rmtree(state)
        removed.append(state.name)
    for path in (db, *(Path(f"{db}{side}") for side in SQLITE_SIDE_FILES), marker_of(db)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path.name)
    if db.parent.is_dir():
        fsync_dir(db.parent)
        with contextlib.suppress(OSError):
            db.parent.rmdir()  # only when empty: anything else there is not ours
    return removed


def env_before(env_file: Path) -> dict[str, str | None]:
    """What the env file holds now of the names an import writes (None: absent)."""
    values = read_env_file(env_file)
    return {name: values.get(name) for name in IMPORT_ENV_NAMES}


def write_import_env(env_file: Path, db: Path, before: dict[str, str | None]) -> bool:
    """The import's key, minted, and its database in the env file; True if this wrote.
    A key already differing from `before`'s is the one this import minted earlier
    (a step run again after a crash): it is kept."""
    values = read_env_file(env_file)
    want = {"KEELWAY_DB": str(db), "DATABASE_URL": f"sqlite:///{db}"}
    key = values.get(INSTANCE_KEY)
    if not key or key == before.get(INSTANCE_KEY):
        want[INSTANCE_KEY] = secrets.token_urlsafe(32)
    if all(values.get(k) == v for k, v in want.items()):
        return False
    values.update(want)
    write_env_file(env_file, values)
    return True


def retire_import_env(env_file: Path, before: dict[str, str | None]) -> bool:
    """Put back, of the names an import writes, exactly what `before` had: a value it
    had is restored, a name it lacked is removed. Nothing else of the file changes.
    True if this wrote; idempotent. A missing env file with nothing to restore stays
    missing."""
    values = read_env_file(env_file)
    changed = False
    for name in IMPORT_ENV_NAMES:
        if name not in before:
            continue
        was = before[name]
        if was is None and name in values:
            del values[name]
            changed = True
        elif was is not None and values.get(name) != was:
            values[name] = was
            changed = True
    if changed:
        write_env_file(env_file, values)
    return changed


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
