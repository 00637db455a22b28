"""Benchmark: snapshot + verify, and restore, of a 200 MB instance database.

    .venv/bin/python bench/snapshot.py [--mb 200] [--rounds 3]

SPEC §7: snapshot + verify at ≥ 0.8x the speed of `sqlite3 .backup` in the same run.
Printed in MB/s (database size / wall time, median of the rounds), each beside the
reference run just before it on the same file:
- reference: the sqlite3 CLI's `.backup` (or, without the CLI, the stdlib backup API in
  a plain loop; the line says which), and the stdlib backup API alone;
- snapshot + verify: keelway/data/snapshots.take into a local object store (backup API
  copy, fsync, integrity_check, sha256, moved into the store, manifest written);
- restore: fetch + verify (copy out of the store; its fsync, sha256 and integrity_check
  at once), WAL mode (a header check: a snapshot keeps its WAL header), and the swap
  with its fsyncs (keelway/data/swap.py; the replaced database kept in previous-db/);
  not the stop and start of the instance around it, which are the app's own time, nor
  the removal of the copy the previous restore kept, which a restore does once the
  instance serves again (timed apart, on its own line).
The page cache is warm after the first round (every figure reads the same file).
A fresh temp dir per run, removed at the end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from keelway.data import snapshots, swap  # noqa: E402
from keelway.data.objects import LocalObjects  # noqa: E402
from keelway.home import Home  # noqa: E402

HOST = "bench.test"


def make_db(path: Path, mb: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE rows (id INTEGER PRIMARY KEY, body BLOB, note TEXT)")
    conn.execute("CREATE INDEX rows_note ON rows(note)")
    row = 4000
    count = mb * 1024 * 1024 // (row + 40)
    conn.execute("BEGIN")
    for i in range(count):
        conn.execute("INSERT INTO rows(body, note) VALUES (?, ?)",
                     (os.urandom(row), f"note {i % 977}"))
    conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def timed(action: Callable[[], object]) -> float:
    began = time.perf_counter()
    action()
    return time.perf_counter() - began


def cli_backup(db: Path, out: Path) -> None:
    subprocess.run(["sqlite3", str(db), f".backup {out}"], check=True)


def api_backup(db: Path, out: Path) -> None:
    src = sqlite3.connect(db)
    dest = sqlite3.connect(out)
    try:
        src.backup(dest)
    finally:
        dest.close()
        src.close()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kw-bench-snap-"))
    try:
        home = Home(work / "home")
        db = home.db_path(HOST)
        make_db(db, args.mb)
        size_mb = db.stat().st_size / 1e6
        objects = LocalObjects(home.objects_dir)
        have_cli = shutil.which("sqlite3") is not None
        ref_name = "sqlite3 .backup (CLI)" if have_cli else "stdlib backup API (no sqlite3 CLI)"
        ref: list[float] = []
        api: list[float] = []
        snap: list[float] = []
        restore: list[float] = []
        discard: list[float] = []
        for n in range(args.rounds):
            out = work / f"ref-{n}.db"
            ref.append(timed(lambda out=out: (cli_backup if have_cli else api_backup)(db, out)))
            out.unlink()
            out = work / f"api-{n}.db"
            api.append(timed(lambda out=out: api_backup(db, out)))
            out.unlink()
            made: list[snapshots.Manifest] = []
            snap.append(timed(lambda made=made: made.append(snapshots.take(
                objects, home, HOST, now_s=time.time(), release=None))))
            staged = swap.staged_path(db, made[0].id)

            def restored(snap_id: str = made[0].id, staged: Path = staged) -> None:
                snapshots.fetch(objects, HOST, snap_id, staged)
                swap.to_wal(staged)
                swap.swap(db, staged)

            restore.append(timed(restored))
            discard.append(timed(lambda: swap.discard(db)))
        med = {name: size_mb / statistics.median(times) for name, times in
               (("ref", ref), ("api", api), ("snap", snap), ("restore", restore))}
        print(f"database: {size_mb:.1f} MB, {args.rounds} rounds (median)")
        print(f"{ref_name:<40} {med['ref']:8.1f} MB/s")
        print(f"{'stdlib backup API':<40} {med['api']:8.1f} MB/s")
        print(f"{'keelway snapshot + verify':<40} {med['snap']:8.1f} MB/s  "
              f"{med['snap'] / med['ref']:.2f}x the reference (target >= 0.8x)")
        print(f"{'keelway restore (fetch+verify+swap)':<40} {med['restore']:8.1f} MB/s  "
              f"{med['restore'] / med['ref']:.2f}x the reference")
        print(f"{'  then: the older kept copy removed':<40} "
              f"{statistics.median(discard) * 1000:8.1f} ms (after the instance serves)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
