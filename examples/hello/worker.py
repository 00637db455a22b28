"""hello's worker: writes a heartbeat into the instance's SQLite database every second."""

import os
import signal
import threading
import time

from store import connect

stopping = threading.Event()


def main():
    # SIGTERM wakes the wait at once, so a stop takes milliseconds, not up to a second.
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    conn = connect()
    generation = os.environ.get("KEELWAY_GENERATION", "?")
    print(f"worker {generation} started for {os.environ.get('KEELWAY_INSTANCE')}", flush=True)
    while not stopping.is_set():
        conn.execute("INSERT INTO beats (at, generation) VALUES (?, ?)", (time.time(), generation))
        stopping.wait(1)
    print(f"worker {generation} stopping", flush=True)


if __name__ == "__main__":
    main()
