"""hello's worker: writes a heartbeat into the instance's SQLite database every second."""

import os
import signal
import time

from store import connect

running = True


def stop(*_):
    global running
    running = False


def main():
    signal.signal(signal.SIGTERM, stop)
    conn = connect()
    generation = os.environ.get("KEELWAY_GENERATION", "?")
    print(f"worker {generation} started for {os.environ.get('KEELWAY_INSTANCE')}", flush=True)
    while running:
        conn.execute("INSERT INTO beats (at, generation) VALUES (?, ?)", (time.time(), generation))
        time.sleep(1)
    print(f"worker {generation} stopping", flush=True)


if __name__ == "__main__":
    main()
