"""Where a build came from, recorded with it and copied into each release when it is
written (schema migration 9); `keelway releases` shows it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from keelway.store import SqliteStore
from keelway.store.schema import MIGRATIONS, _statements

GIT = {"kind": "git", "path": "/src", "commit": "a" * 40, "ref": "main"}
DIR = {"kind": "directory", "path": "/src", "digest": "d" * 64}


def test_a_release_keeps_the_source_its_build_had_when_it_was_written(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "k.db")
    store.apps.ensure_app("blog")
    store.builds.record_build("blog", "d" * 64, "/builds/d", GIT)
    first = store.builds.create_release("blog", "d" * 64, {}, "Deploy")
    # The same content staged again from a directory: the build says so from now on.
    store.builds.record_build("blog", "d" * 64, "/builds/d", DIR)
    second = store.builds.create_release("blog", "d" * 64, {}, "Deploy")
    store.builds.record_build("blog", "d" * 64, "/builds/d")  # a caller that knows none: kept
    assert (first.source, second.source) == (GIT, DIR)
    assert [r.source for r in store.builds.list_releases("blog")] == [DIR, GIT]
    assert store.builds.list_builds("blog")[0].source == DIR
    store.close()


def test_releases_written_before_sources_were_recorded_have_none(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "k.db", isolation_level=None)
    for script in MIGRATIONS[:8]:
        for statement in _statements(script):
            conn.execute(statement)
    conn.execute("PRAGMA user_version = 8")
    conn.execute("INSERT INTO apps(name, created_at) VALUES ('blog', 0)")
    conn.execute("INSERT INTO builds(app, digest, path, created_at) VALUES"
                 " ('blog', 'd', '/b', 0)")
    conn.execute("INSERT INTO releases(app, number, build_digest, config, description,"
                 " created_at) VALUES ('blog', 1, 'd', '{}', 'Deploy d', 0)")
    conn.close()
    store = SqliteStore(tmp_path / "k.db")
    assert [r.source for r in store.builds.list_releases("blog")] == [None]
    assert store.builds.list_builds("blog")[0].source is None
    store.close()
