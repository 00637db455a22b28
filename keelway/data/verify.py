"""Verification of a copy of an instance database: nobody trusts a copy until it has
been opened and checked (SPEC §4 Data).

A copy is verified when SQLite opens it read-only, `PRAGMA integrity_check` says `ok`,
and (when a checksum is expected) its sha256 matches the manifest's. Verification never
writes the file: it is opened `immutable` (no locks, no `-wal`/`-shm` created beside
it), which is right for a copy that nothing else has open and that has no `-wal` of its
own (snapshots.py writes it whole; a WAL header with no `-wal` file is a complete
database). The checksum and SQLite's check read the file in two threads at once: both
release the GIL, and together they take the time of the slower one.
"""

from __future__ import annotations

import hashlib
import sqlite3
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

MMAP_BYTES = 1 << 30  # what SQLite may map of a file it reads; the rest is read()


class Damaged(Exception):
    """A copy that failed verification; `message` says how. Whoever asked for it changes
    nothing with it."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Verified:
    """A copy of a database that opened read-only, passed `PRAGMA integrity_check`,
    and hashed to `sha256` (snapshots, restores' staged copies, seeds alike)."""

    size_bytes: int
    sha256: str
    schema_version: int  # PRAGMA user_version


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def verify_file(path: Path, expect_sha256: str | None = None) -> Verified:
    """Check the database copy at `path`; raises Damaged if it fails, changes nothing.

    The checksum is compared first: a copy whose bytes are not the recorded ones is
    refused even if SQLite would open it."""
    path = Path(path)
    size = path.stat().st_size
    with ThreadPoolExecutor(1) as pool:
        hashing = pool.submit(sha256_file, path)
        checked: int | Damaged
        try:
            checked = check_whole(path)
        except Damaged as exc:
            checked = exc
        digest = hashing.result()
    # The checksum is said first: bytes that are not the recorded ones are the finding.
    if expect_sha256 is not None and digest != expect_sha256:
        raise Damaged(f"{path.name}: sha256 {digest[:12]}… is not the recorded "
                      f"{expect_sha256[:12]}…")
    if isinstance(checked, Damaged):
        raise checked
    return Verified(size, digest, checked)


def check_whole(path: Path) -> int:
    """`path`'s user_version once `PRAGMA integrity_check` says ok; raises Damaged
    saying what it found otherwise. No checksum: for a file keelway does not keep (a
    seed is checked so, and only the copy it stores is hashed)."""
    said, version = check_integrity(path)
    if said != ["ok"]:
        raise Damaged(f"{path.name}: integrity_check: {'; '.join(said[:3])}")
    return version


def check_integrity(path: Path) -> tuple[list[str], int]:
    """What `PRAGMA integrity_check` says of `path`, and its user_version."""
    # Immutable (no locks, no -shm) unless a -wal beside it may hold pages of its own: a
    # file a user hands in (a seed) can be a live database in WAL mode, and only a
    # read-only open that reads the WAL checks what SQLite would serve from it.
    mode = "ro" if Path(f"{path}-wal").exists() else "ro&immutable=1"
    uri = f"file:{urllib.parse.quote(str(path))}?mode={mode}"
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        raise Damaged(f"{path.name}: SQLite cannot open it: {exc}") from None
    try:
        # Read through a map of the file rather than copied into SQLite's page cache:
        # the check reads every page once, and this halves its time.
        conn.execute(f"PRAGMA mmap_size={MMAP_BYTES}")
        rows = conn.execute("PRAGMA integrity_check").fetchall()
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    except sqlite3.DatabaseError as exc:
        raise Damaged(f"{path.name}: not a whole SQLite database: {exc}") from None
    finally:
        conn.close()
    return [str(row[0]) for row in rows], version
