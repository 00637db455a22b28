"""The instance's SQLite database, shared by web.py and worker.py."""

import os
import sqlite3


def connect() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ["KEELWAY_DB"], timeout=5, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE IF NOT EXISTS visits (n INTEGER NOT NULL)")
    conn.execute("CREATE TABLE IF NOT EXISTS beats (at REAL NOT NULL, generation TEXT NOT NULL)")
    return conn
