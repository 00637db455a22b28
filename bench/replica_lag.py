"""Replica lag under a steady write load: commit -> the transaction's LTX file in the
replica (a file replica, keelway's own config: keelway/data/replicas.py).

    python bench/replica_lag.py [--seconds 20] [--rate 20]

Prints p50/p99/max of the lag in ms (SPEC §7 target: p99 <= 2 s). `measure()` is what
bench/snapshot.py can call."""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from keelway.data.replicas import ReplicaOptions, litestream_binary, replica_config


def measure(seconds: float = 20.0, rate_hz: float = 20.0) -> dict[str, float]:
    binary = litestream_binary()
    assert binary is not None, "no litestream"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        db, replica = root / "db.sqlite3", root / "replica"
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t(x BLOB)")
        config = root / "ls.yml"
        config.write_text(json.dumps(replica_config(db, replica.as_uri(), ReplicaOptions())))
        proc = subprocess.Popen([str(binary), "replicate", "-config", str(config)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        # A follower restores the replica continuously; each row carries its commit
        # time, so what the follower holds says which commits had reached the replica.
        # Its own poll interval is counted in the lag: the figure errs high, not low.
        follower = root / "follower.db"
        time.sleep(1.5)  # litestream's first snapshot
        follow = subprocess.Popen([str(binary), "restore", "-f", "-follow-interval", "20ms",
                                   "-o", str(follower), replica.as_uri()],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        seen: dict[int, float] = {}
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                try:
                    read = sqlite3.connect(f"{follower.as_uri()}?mode=ro", uri=True)
                    try:
                        high = read.execute("SELECT max(rowid) FROM t").fetchone()[0]
                    finally:
                        read.close()
                except sqlite3.Error:
                    high = None
                now = time.monotonic()
                if high is not None:
                    for rowid in range(max(seen, default=0) + 1, high + 1):
                        seen[rowid] = now
                time.sleep(0.005)

        watcher = threading.Thread(target=watch)
        watcher.start()
        committed: dict[int, float] = {}
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            cur = conn.execute("INSERT INTO t VALUES (randomblob(200))")
            assert cur.lastrowid is not None
            committed[cur.lastrowid] = time.monotonic()
            time.sleep(1 / rate_hz)
        time.sleep(3)
        stop.set()
        watcher.join()
        for child in (follow, proc):
            child.terminate()
            child.wait(10)
        conn.close()
    lags = [(seen[rowid] - at) * 1000 for rowid, at in committed.items() if rowid in seen]
    lags.sort()
    return {"commits": len(committed), "replicated": len(lags),
            "p50_ms": statistics.median(lags),
            "p99_ms": lags[min(len(lags) - 1, int(len(lags) * 0.99))], "max_ms": lags[-1]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=20.0)
    args = parser.parse_args()
    print(json.dumps(measure(args.seconds, args.rate)))


if __name__ == "__main__":
    main()
