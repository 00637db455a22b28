"""A tiny Flask app that keeps notes in the instance's own SQLite database.

keelway gives every process of an instance KEELWAY_DB, the path of that instance's
database (it lives in KEELWAY_DATA_DIR, kept across releases and restarts), so each
tenant of this app has notes of its own.
"""

import os
import sqlite3

from flask import Flask, request

app = Flask(__name__)


def db() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ["KEELWAY_DB"], timeout=5)
    conn.execute("CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, text TEXT)")
    return conn


@app.get("/")
def index() -> str:
    greeting = os.environ.get("GREETING", "notes")
    with db() as conn:
        count = conn.execute("SELECT COUNT(*) FROM notes").fetchone()[0]
    return (f"{greeting}: {count} notes on {os.environ['KEELWAY_INSTANCE']} "
            f"({os.environ['KEELWAY_RELEASE']})\n")


@app.post("/notes")
def add() -> tuple[str, int]:
    with db() as conn:
        conn.execute("INSERT INTO notes (text) VALUES (?)", (request.form.get("text", ""),))
    return "added\n", 201


@app.get("/health")
def health() -> str:
    return "ok\n"
