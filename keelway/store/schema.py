"""The schema of keelway's store and its migrations; the only module that says DDL.

Migrations are append-only: a released migration is never edited, a change is a new
entry. `migrate` applies the missing ones inside one BEGIN IMMEDIATE transaction each,
so a crash mid-migration leaves the previous schema intact.
"""

from __future__ import annotations

import sqlite3

MIGRATIONS: list[str] = [
    # 1: the records of SPEC §1.
    """
    CREATE TABLE meta (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    CREATE TABLE apps (
        name TEXT PRIMARY KEY,
        config TEXT NOT NULL DEFAULT '{}',
        created_at REAL NOT NULL,
        version INTEGER NOT NULL DEFAULT 1
    );
    CREATE TABLE instances (
        host TEXT PRIMARY KEY,
        app TEXT NOT NULL REFERENCES apps(name),
        state TEXT NOT NULL,
        fence INTEGER NOT NULL DEFAULT 0,
        schedule_rev INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        version INTEGER NOT NULL DEFAULT 1
    );
    CREATE INDEX instances_by_app ON instances(app);
    CREATE TABLE builds (
        app TEXT NOT NULL,
        digest TEXT NOT NULL,
        path TEXT NOT NULL,
        good INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        PRIMARY KEY (app, digest)
    );
    CREATE TABLE releases (
        app TEXT NOT NULL REFERENCES apps(name),
        number INTEGER NOT NULL,
        build_digest TEXT NOT NULL,
        config TEXT NOT NULL,
        description TEXT NOT NULL,
        created_at REAL NOT NULL,
        PRIMARY KEY (app, number)
    );
    CREATE TABLE operations (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        app TEXT NOT NULL,
        instance TEXT NOT NULL,
        kind TEXT NOT NULL,
        key TEXT,
        request_digest TEXT,
        state TEXT NOT NULL,
        error TEXT,
        warnings TEXT NOT NULL DEFAULT '[]',
        owner TEXT NOT NULL,
        created_at REAL NOT NULL,
        finished_at REAL,
        version INTEGER NOT NULL DEFAULT 1
    );
    CREATE INDEX operations_by_instance ON operations(instance, id);
    CREATE UNIQUE INDEX operations_by_key ON operations(instance, key) WHERE key IS NOT NULL;
    CREATE TABLE steps (
        op_id INTEGER NOT NULL REFERENCES operations(id),
        seq INTEGER NOT NULL,
        name TEXT NOT NULL,
        service TEXT,
        before_gen INTEGER,
        after_gen INTEGER,
        state TEXT NOT NULL,
        error TEXT,
        detail TEXT,
        started_at REAL NOT NULL,
        finished_at REAL,
        PRIMARY KEY (op_id, seq)
    );
    CREATE TABLE generations (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        app TEXT NOT NULL,
        instance TEXT NOT NULL,
        service TEXT NOT NULL,
        release INTEGER NOT NULL,
        build_digest TEXT NOT NULL,
        op_id INTEGER,
        state TEXT NOT NULL,
        pid INTEGER,
        start_ticks INTEGER,
        port INTEGER,
        created_at REAL NOT NULL,
        exited_at REAL,
        exit_code INTEGER,
        version INTEGER NOT NULL DEFAULT 1
    );
    CREATE INDEX generations_live ON generations(instance, service) WHERE state != 'gone';
    CREATE TABLE active (
        instance TEXT NOT NULL,
        service TEXT NOT NULL,
        generation_id INTEGER NOT NULL REFERENCES generations(id),
        version INTEGER NOT NULL DEFAULT 1,
        PRIMARY KEY (instance, service)
    );
    CREATE TABLE inhibitions (
        generation_id INTEGER NOT NULL REFERENCES generations(id),
        reason TEXT NOT NULL,
        op_id INTEGER,
        created_at REAL NOT NULL,
        PRIMARY KEY (generation_id, reason)
    );
    CREATE TABLE port_claims (
        port INTEGER PRIMARY KEY,
        generation_id INTEGER NOT NULL UNIQUE REFERENCES generations(id),
        claimed_at REAL NOT NULL
    );
    CREATE TABLE routes (
        host TEXT PRIMARY KEY,
        instance TEXT NOT NULL,
        state TEXT NOT NULL,
        port INTEGER,
        generation_id INTEGER,
        version INTEGER NOT NULL DEFAULT 1
    );
    CREATE TABLE fences (
        instance TEXT PRIMARY KEY,
        generation INTEGER NOT NULL,
        held INTEGER NOT NULL DEFAULT 0,
        reason TEXT,
        updated_at REAL NOT NULL
    );
    CREATE TABLE events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at REAL NOT NULL,
        app TEXT,
        instance TEXT,
        kind TEXT NOT NULL,
        message TEXT NOT NULL
    );
    CREATE INDEX events_by_app ON events(app, id);
    INSERT INTO meta(key, value) VALUES ('route_table_version', '0');
    """,
    # 2: convergence marks on steps, idempotency keys, why an instance is down.
    """
    ALTER TABLE steps ADD COLUMN converged INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE instances ADD COLUMN down_reason TEXT;
    ALTER TABLE operations ADD COLUMN schedule_rev INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE requests (
        key TEXT PRIMARY KEY,
        app TEXT NOT NULL,
        kind TEXT NOT NULL,
        digest TEXT NOT NULL,
        state TEXT NOT NULL,
        result TEXT,
        owner TEXT NOT NULL,
        created_at REAL NOT NULL,
        finished_at REAL
    );
    """,
    # 3: crash-restart backoff, so that a control-plane restart does not reset it. One
    # row per instance and service: the generation whose crash it counts, how many
    # crashes in a row, and the wall-clock time of the next restart (a wall clock, since
    # it must mean the same thing to the next control plane).
    """
    CREATE TABLE backoff (
        instance TEXT NOT NULL,
        service TEXT NOT NULL,
        generation_id INTEGER NOT NULL,
        failures INTEGER NOT NULL,
        crashed_at REAL NOT NULL,
        retry_at REAL NOT NULL,
        PRIMARY KEY (instance, service)
    );
    """,
    # 4: steps store their kind (keelway/journal.py StepKind), not a formatted name: the
    # service is its own column already. The names the old code wrote map one to one; a
    # name it never wrote leaves `kind` NULL and the NOT NULL refuses the migration whole,
    # rather than guessing what a journal we cannot read meant.
    """
    CREATE TABLE steps_v4 (
        op_id INTEGER NOT NULL REFERENCES operations(id),
        seq INTEGER NOT NULL,
        kind TEXT NOT NULL,
        service TEXT,
        before_gen INTEGER,
        after_gen INTEGER,
        state TEXT NOT NULL,
        error TEXT,
        detail TEXT,
        started_at REAL NOT NULL,
        finished_at REAL,
        converged INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (op_id, seq)
    );
    INSERT INTO steps_v4(op_id, seq, kind, service, before_gen, after_gen, state, error,
                         detail, started_at, finished_at, converged)
    SELECT op_id, seq,
           CASE
               WHEN name = 'instance key' THEN 'instance-key'
               WHEN name = 'release command' THEN 'release-command'
               WHEN name = 'withdraw traffic' THEN 'withdraw'
               WHEN name = 'hold exec' THEN 'hold-exec'
               WHEN name IN ('activate', 'publish', 'settle', 'fault') THEN name
               WHEN name GLOB 'spawn ?*' THEN 'spawn'
               WHEN name GLOB 'ready ?*' THEN 'ready'
               WHEN name GLOB 'retire ?*' THEN 'retire'
               WHEN name GLOB 'stop ?* (no fallback)' THEN 'stop-no-fallback'
               WHEN name GLOB 'stop ?* (down)' THEN 'stop-down'
               WHEN name GLOB 'stop ?*' THEN 'stop'
           END,
           service, before_gen, after_gen, state, error, detail, started_at, finished_at,
           converged
    FROM steps;
    DROP TABLE steps;
    ALTER TABLE steps_v4 RENAME TO steps;
    """,
    # 5: tenants whole (issue 10). An instance's own config, layered over its app's;
    # `adding` is 1 from the write that records a new instance until its files are laid
    # down and it has been started (boot redoes an unfinished add); `removing` and an
    # app's `destroying` say an interrupted removal is to be carried on, and whether it
    # purges the data ('keep-data' | 'purge-data'). Aliases: more hosts of one instance;
    # a host is either one instance's primary or one alias (keelway/store/hosts.py).
    """
    ALTER TABLE instances ADD COLUMN config TEXT NOT NULL DEFAULT '{}';
    ALTER TABLE instances ADD COLUMN adding INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE instances ADD COLUMN removing TEXT;
    ALTER TABLE apps ADD COLUMN destroying TEXT;
    CREATE TABLE aliases (
        host TEXT PRIMARY KEY,
        instance TEXT NOT NULL REFERENCES instances(host),
        created_at REAL NOT NULL
    );
    CREATE INDEX aliases_by_instance ON aliases(instance);
    CREATE INDEX routes_by_instance ON routes(instance);
    """,
    # 6: a release deferred to a parked instance's next wake (deploy, config and rollback
    # leave a parked instance parked): the release's number and why it replaces what
    # ran (a `Cause`, which picks the wake attempt's fallback).
    """
    ALTER TABLE instances ADD COLUMN pending_release INTEGER;
    ALTER TABLE instances ADD COLUMN pending_cause TEXT;
    """,
    # 7: seed imports (SPEC §4 Data, Seed import; keelway/store/imports.py). One journal
    # row per instance while an import of it is in effect or being undone: it is the
    # import gate (no second import while it exists) and all the rollback reads. The
    # route row the import swapped in carries `seed` (the import's row is the one that
    # names its seed); the instance record carries the seed it names and that seed's
    # state, the record the rollback compares and swaps at its end.
    """
    CREATE TABLE seed_imports (
        instance TEXT PRIMARY KEY,
        seed TEXT NOT NULL,
        state TEXT NOT NULL,
        fence_gen INTEGER,
        env_before TEXT NOT NULL,
        record TEXT NOT NULL,
        had_route INTEGER NOT NULL,
        instance_before TEXT NOT NULL,
        sha256 TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        version INTEGER NOT NULL DEFAULT 1
    );
    ALTER TABLE routes ADD COLUMN seed TEXT;
    ALTER TABLE instances ADD COLUMN seed TEXT;
    ALTER TABLE instances ADD COLUMN seed_state TEXT;
    """,
    # 8: the numbers of tenant uids and app groups (keelway/store/identities.py), each
    # allocated once per name and never reused, so no instance inherits another's files.
    """
    CREATE TABLE identities (
        space TEXT NOT NULL,
        name TEXT NOT NULL,
        n INTEGER NOT NULL,
        PRIMARY KEY (space, name),
        UNIQUE (space, n)
    );
    """,
    # 9: where a build came from (a JSON object: `kind` directory | tarball | git, and
    # its path, tarball digest, or git commit and ref), as the latest staging of it said;
    # a release copies its build's source when it is written, so that `keelway releases`
    # says what each one ran even after the build is staged again from elsewhere.
    # NULL: recorded by a keelway that did not know.
    """
    ALTER TABLE builds ADD COLUMN source TEXT;
    ALTER TABLE releases ADD COLUMN source TEXT;
    """,
    # 10: what only this box observes of a generation (the port claimed for it, its
    # leader's pid and start ticks) leaves the generation's row, which a fleet would
    # share, for `presences`, keyed by the generation (keelway/store/local.py): a
    # box-local file later, so it names a generation by id, with no foreign key into the
    # shared records. The port claim becomes the presence's `claimed_at` (NULL once the
    # generation is proven gone), one port claimed once by the partial unique index.
    # Every generation keeps what it had: a running one is adopted after the upgrade.
    """
    CREATE TABLE presences (
        generation_id INTEGER PRIMARY KEY,
        port INTEGER,
        pid INTEGER,
        start_ticks INTEGER,
        claimed_at REAL
    );
    CREATE UNIQUE INDEX presences_claimed ON presences(port) WHERE claimed_at IS NOT NULL;
    INSERT INTO presences(generation_id, port, pid, start_ticks, claimed_at)
    SELECT g.id, COALESCE(c.port, g.port), g.pid, g.start_ticks, c.claimed_at
    FROM generations g LEFT JOIN port_claims c ON c.generation_id = g.id;
    DROP TABLE port_claims;
    ALTER TABLE generations DROP COLUMN pid;
    ALTER TABLE generations DROP COLUMN start_ticks;
    ALTER TABLE generations DROP COLUMN port;
    """,
    # 11: rollouts (keelway/store/rollouts.py): one release's journaled way across an
    # app's instances, in cohorts fixed when it begins, and each host's place in it.
    """
    CREATE TABLE rollouts (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        app TEXT NOT NULL,
        release INTEGER NOT NULL,
        previous INTEGER,
        kind TEXT NOT NULL,
        state TEXT NOT NULL,
        cohorts TEXT NOT NULL,
        overrides TEXT NOT NULL DEFAULT '[]',
        cohort INTEGER NOT NULL DEFAULT 0,
        reason TEXT,
        figures TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        version INTEGER NOT NULL DEFAULT 1
    );
    CREATE INDEX rollouts_app ON rollouts(app, id);
    CREATE INDEX rollouts_state ON rollouts(state);
    CREATE TABLE rollout_hosts (
        rollout_id INTEGER NOT NULL REFERENCES rollouts(id) ON DELETE CASCADE,
        host TEXT NOT NULL,
        cohort INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        state TEXT NOT NULL,
        reason TEXT,
        PRIMARY KEY (rollout_id, host)
    );
    CREATE INDEX rollout_hosts_seq ON rollout_hosts(rollout_id, seq);
    """,
    # Why the kernel ended a generation's tree, when it did (issue #20): its memory
    # limit (an OOM kill in its cgroup) or its process limit, as status and events say.
    """
    ALTER TABLE generations ADD COLUMN exit_cause TEXT;
    """,
    # Scheduled jobs (issue #20): each run is an operation of kind `job` keyed by its job
    # and scheduled time; the scheduler reads the recent ones by kind at boot.
    """
    CREATE INDEX operations_by_kind ON operations(kind, created_at);
    """,
]


def current_version(conn: sqlite3.Connection) -> int:
    row = conn.execute("PRAGMA user_version").fetchone()
    return int(row[0])


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the schema up to date; returns the resulting schema version.

    A store written by a newer keelway is refused rather than guessed at.
    """
    have = current_version(conn)
    if have > len(MIGRATIONS):
        raise RuntimeError(
            f"store schema v{have} is newer than this keelway (knows v{len(MIGRATIONS)})"
        )
    for number in range(have + 1, len(MIGRATIONS) + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _statements(MIGRATIONS[number - 1]):
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {number}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    return len(MIGRATIONS)


def _statements(script: str) -> list[str]:
    # executescript() would COMMIT on its own; splitting keeps the migration in our txn.
    return [part.strip() for part in script.split(";") if part.strip()]
